//! The replicated dedup table: a request applied once answers every later copy of itself
//! (QoS 1 redelivery, client retry, or re-execution by a new leader) with the stored reply.
//!
//! Every record is accounted as it is stored: its bytes and its count go into a usage total
//! and into the bucket of the second its retention ends in, and leave the total once the
//! replicated clock has passed that second ([`release_expired`]). Apply refuses a request once
//! the total reaches its budget, so what clients can make every node keep is bounded however
//! long the retentions they ask for, and however many requests they make up.

use statestore_protocol::Response;

use crate::codec::{decode_u64, encode_u64, pair_key, Reader, Writer};
use crate::entry::{Reply, RequestIdentity};
use crate::meta::{DEDUP_DUE, DEDUP_NEXT_DUE, DEDUP_USAGE};
use crate::storage::{StorageError, StorageRead, Table, Txn};

/// What one record costs beyond its key and value: about what the storage's in-memory index
/// and its own overhead hold for it.
pub const RECORD_OVERHEAD: u64 = 32;

/// Buckets released by one request at most: housekeeping is bounded work per step.
const RELEASE_PER_REQUEST: usize = 64;

/// The dedup records apply has accounted and the clock has not yet released.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DedupUsage {
    /// Key, value and [`RECORD_OVERHEAD`] of each record.
    pub bytes: u64,
    pub records: u64,
}

impl DedupUsage {
    fn decode(value: Option<Vec<u8>>) -> Result<DedupUsage, StorageError> {
        let Some(value) = value else { return Ok(DedupUsage::default()) };
        let mut r = Reader::new(Table::Meta, &value)?;
        let usage = DedupUsage { bytes: r.u64()?, records: r.u64()? };
        r.finish()?;
        Ok(usage)
    }

    fn encode(self) -> Vec<u8> {
        Writer::new().u64(self.bytes).u64(self.records).finish()
    }
}

/// The dedup table's accounted usage.
pub fn usage(store: &(impl StorageRead + ?Sized)) -> Result<DedupUsage, StorageError> {
    DedupUsage::decode(store.get(Table::Meta, DEDUP_USAGE)?)
}

/// The bucket a retention ending at `retain_until` is accounted in: the end of its second.
fn bucket_of(retain_until: u64) -> u64 {
    retain_until.div_ceil(1000).saturating_mul(1000)
}

fn due_key(bucket: u64) -> Vec<u8> {
    [DEDUP_DUE, &bucket.to_be_bytes()[..]].concat()
}

fn next_due(store: &(impl StorageRead + ?Sized)) -> Result<u64, StorageError> {
    match store.get(Table::Meta, DEDUP_NEXT_DUE)? {
        Some(value) => decode_u64(Table::Meta, &value),
        None => Ok(u64::MAX),
    }
}

/// Takes out of the usage the buckets whose second the clock (`now`) has passed, a bounded
/// number of them per call.
pub(crate) fn release_expired(txn: &mut impl Txn, now: u64) -> Result<(), StorageError> {
    if now < next_due(txn)? {
        return Ok(());
    }
    let buckets = txn.scan(Table::Meta, DEDUP_DUE, None, RELEASE_PER_REQUEST + 1)?;
    let mut usage = usage(txn)?;
    let mut next = u64::MAX;
    for (i, (key, value)) in buckets.into_iter().enumerate() {
        let due = key
            .get(DEDUP_DUE.len()..)
            .and_then(|time| <[u8; 8]>::try_from(time).ok())
            .map(u64::from_be_bytes)
            .ok_or(StorageError::Corrupt { table: Table::Meta, detail: "a dedup bucket key is not a time" })?;
        if due > now || i == RELEASE_PER_REQUEST {
            next = due;
            break;
        }
        let bucket = DedupUsage::decode(Some(value))?;
        usage.bytes = usage.bytes.saturating_sub(bucket.bytes);
        usage.records = usage.records.saturating_sub(bucket.records);
        txn.delete(Table::Meta, key);
    }
    txn.put(Table::Meta, DEDUP_USAGE.to_vec(), usage.encode());
    match next {
        u64::MAX => txn.delete(Table::Meta, DEDUP_NEXT_DUE.to_vec()),
        next => txn.put(Table::Meta, DEDUP_NEXT_DUE.to_vec(), encode_u64(next)),
    }
    Ok(())
}

/// Adds a record of `bytes` retained until `retain_until` to the usage and its bucket.
fn account(txn: &mut impl Txn, retain_until: u64, bytes: u64) -> Result<(), StorageError> {
    let due = bucket_of(retain_until);
    let key = due_key(due);
    let mut bucket = DedupUsage::decode(txn.get(Table::Meta, &key)?)?;
    bucket.bytes = bucket.bytes.saturating_add(bytes);
    bucket.records += 1;
    txn.put(Table::Meta, key, bucket.encode());
    let mut total = usage(txn)?;
    total.bytes = total.bytes.saturating_add(bytes);
    total.records += 1;
    txn.put(Table::Meta, DEDUP_USAGE.to_vec(), total.encode());
    if due < next_due(txn)? {
        txn.put(Table::Meta, DEDUP_NEXT_DUE.to_vec(), encode_u64(due));
    }
    Ok(())
}

/// The dedup table's key of a request: its response topic and correlation data.
pub fn key(identity: &RequestIdentity) -> Vec<u8> {
    pair_key(identity.response_topic.as_bytes(), &identity.correlation_data)
}

/// The stored reply of an earlier copy of this request, if it is still retained at `now` (the
/// replicated clock): a record whose retention ended is ignored as if it were gone, whether or
/// not the storage has dropped it yet. So every node answers the same, however far each one's
/// storage got with dropping expired records.
pub fn lookup(
    store: &(impl StorageRead + ?Sized),
    identity: &RequestIdentity,
    now: u64,
) -> Result<Option<Reply>, StorageError> {
    let Some(bytes) = store.get(Table::Dedup, &key(identity))? else {
        return Ok(None);
    };
    let mut r = Reader::new(Table::Dedup, &bytes)?;
    if r.u64()? <= now {
        return Ok(None);
    }
    let response = Response::decode(r.bytes()?)
        .map_err(|_| StorageError::Corrupt { table: Table::Dedup, detail: "stored reply does not decode" })?;
    let version = r.opt_hlc()?;
    r.finish()?;
    Ok(Some(Reply { response, version }))
}

/// Stores `reply` for `identity` until `retain_until` (ms since the epoch), replacing an
/// expired record of the same request if there is one, and accounts it.
pub(crate) fn remember(
    txn: &mut impl Txn,
    identity: &RequestIdentity,
    reply: &Reply,
    retain_until: u64,
) -> Result<(), StorageError> {
    let record =
        Writer::new().u64(retain_until).bytes(&reply.response.encode()).opt_hlc(reply.version.as_ref()).finish();
    let key = key(identity);
    account(txn, retain_until, (key.len() + record.len()) as u64 + RECORD_OVERHEAD)?;
    txn.put(Table::Dedup, key, record);
    Ok(())
}

/// Whether a stored dedup record is past its retention at replicated time `now`: [`lookup`]
/// ignores it from then on, for good (the clock never goes back), so the storage may drop it
/// whenever it likes, e.g. while compacting. An unreadable record is kept, for the next read to
/// report.
pub fn expired(record: &[u8], now: u64) -> bool {
    retain_until(record).is_some_and(|retain_until| retain_until <= now)
}

/// Until when (ms since the epoch, the replicated clock) a stored dedup record is retained;
/// none for an unreadable record.
pub fn retain_until(record: &[u8]) -> Option<u64> {
    Reader::new(Table::Dedup, record).and_then(|mut r| r.u64()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{MemStorage, Overlay, Storage};

    fn identity(n: u8) -> RequestIdentity {
        RequestIdentity { response_topic: "clients/c/response".into(), correlation_data: vec![n; 16] }
    }

    #[test]
    fn a_record_is_answered_until_its_retention_ends_and_ignored_after() {
        let mut storage = MemStorage::new();
        let reply = Reply { response: Response::Ok, version: None };
        let mut txn = Overlay::new(&storage);
        remember(&mut txn, &identity(1), &reply, 1_000).unwrap();
        let batch = txn.into_batch();
        storage.write(batch).unwrap();
        assert_eq!(lookup(&storage, &identity(1), 999).unwrap(), Some(reply.clone()));
        assert_eq!(lookup(&storage, &identity(1), 1_000).unwrap(), None, "retained until, not through");
        assert_eq!(lookup(&storage, &identity(2), 0).unwrap(), None);

        let record = storage.get(Table::Dedup, &key(&identity(1))).unwrap().unwrap();
        assert!(!expired(&record, 999));
        assert!(expired(&record, 1_000));
        assert!(!expired(b"garbage", u64::MAX), "kept for a read to report");

        // Remembered again after it expired: the new retention counts.
        let mut txn = Overlay::new(&storage);
        remember(&mut txn, &identity(1), &reply, 5_000).unwrap();
        assert_eq!(lookup(&txn, &identity(1), 2_000).unwrap(), Some(reply));
    }

    #[test]
    fn records_are_accounted_until_the_clock_passes_the_second_their_retention_ends_in() {
        let mut storage = MemStorage::new();
        let reply = Reply { response: Response::Ok, version: None };
        let mut txn = Overlay::new(&storage);
        remember(&mut txn, &identity(1), &reply, 1_500).unwrap();
        remember(&mut txn, &identity(2), &reply, 1_900).unwrap();
        remember(&mut txn, &identity(3), &reply, 7_000).unwrap();
        let one = usage(&txn).unwrap().bytes / 3;
        assert_eq!(usage(&txn).unwrap(), DedupUsage { bytes: 3 * one, records: 3 });
        assert!(one > RECORD_OVERHEAD);
        let batch = txn.into_batch();
        storage.write(batch).unwrap();
        for (now, records) in [(1_999, 3), (2_000, 1), (6_999, 1), (7_000, 0), (9_000, 0)] {
            let mut txn = Overlay::new(&storage);
            release_expired(&mut txn, now).unwrap();
            assert_eq!(usage(&txn).unwrap(), DedupUsage { bytes: records * one, records }, "at {now}");
            let batch = txn.into_batch();
            storage.write(batch).unwrap();
        }
        assert!(storage.scan(Table::Meta, DEDUP_DUE, None, 10).unwrap().is_empty(), "every bucket released");
        assert_eq!(storage.get(Table::Meta, DEDUP_NEXT_DUE).unwrap(), None);
    }

    #[test]
    fn release_is_bounded_per_call_and_finishes_over_later_calls() {
        let mut storage = MemStorage::new();
        let reply = Reply { response: Response::Ok, version: None };
        let mut txn = Overlay::new(&storage);
        for n in 0..200u8 {
            remember(&mut txn, &identity(n), &reply, 1_000 * (u64::from(n) + 1)).unwrap();
        }
        let batch = txn.into_batch();
        storage.write(batch).unwrap();
        let mut calls = 0;
        while usage(&storage).unwrap().records > 0 {
            calls += 1;
            let mut txn = Overlay::new(&storage);
            release_expired(&mut txn, 1_000_000).unwrap();
            let batch = txn.into_batch();
            storage.write(batch).unwrap();
        }
        assert_eq!(calls, 200usize.div_ceil(RELEASE_PER_REQUEST));
    }
}
