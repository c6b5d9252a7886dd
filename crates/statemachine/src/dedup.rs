//! The replicated dedup table: a request applied once answers every later copy of itself
//! (QoS 1 redelivery, client retry, or re-execution by a new leader) with the stored reply.

use statestore_protocol::Response;

use crate::codec::{pair_key, Reader, Writer};
use crate::entry::{Reply, RequestIdentity};
use crate::storage::{StorageError, StorageRead, Table, Txn};

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
/// expired record of the same request if there is one.
pub(crate) fn remember(
    txn: &mut impl Txn,
    identity: &RequestIdentity,
    reply: &Reply,
    retain_until: u64,
) -> Result<(), StorageError> {
    let record =
        Writer::new().u64(retain_until).bytes(&reply.response.encode()).opt_hlc(reply.version.as_ref()).finish();
    txn.put(Table::Dedup, key(identity), record);
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
}
