//! The replicated dedup table: a request applied once answers every later copy of itself
//! (QoS 1 redelivery, client retry, or re-execution by a new leader) with the stored reply.

use statestore_protocol::Response;

use crate::codec::{pair_key, split_timed_key, timed_key, Reader, Writer};
use crate::entry::{Reply, RequestIdentity};
use crate::meta;
use crate::storage::{StorageError, StorageRead, Table, Txn};

fn dedup_key(identity: &RequestIdentity) -> Vec<u8> {
    pair_key(identity.response_topic.as_bytes(), &identity.correlation_data)
}

/// The stored reply of an earlier copy of this request, if it is still retained.
pub fn lookup(store: &(impl StorageRead + ?Sized), identity: &RequestIdentity) -> Result<Option<Reply>, StorageError> {
    let Some(bytes) = store.get(Table::Dedup, &dedup_key(identity))? else {
        return Ok(None);
    };
    let mut r = Reader::new(Table::Dedup, &bytes)?;
    let _retain_until = r.u64()?;
    let response = Response::decode(r.bytes()?)
        .map_err(|_| StorageError::Corrupt { table: Table::Dedup, detail: "stored reply does not decode" })?;
    let version = r.opt_hlc()?;
    r.finish()?;
    Ok(Some(Reply { response, version }))
}

/// Stores `reply` for `identity` until `retain_until` (ms since the epoch).
pub(crate) fn remember(
    txn: &mut impl Txn,
    identity: &RequestIdentity,
    reply: &Reply,
    retain_until: u64,
) -> Result<(), StorageError> {
    let key = dedup_key(identity);
    let record =
        Writer::new().u64(retain_until).bytes(&reply.response.encode()).opt_hlc(reply.version.as_ref()).finish();
    txn.put(Table::DedupExpiry, timed_key(retain_until, &key), Vec::new());
    txn.put(Table::Dedup, key, record);
    Ok(())
}

/// Forgets up to `limit` entries whose retention ended at or before `now`, oldest first.
///
/// Reading starts after the last index key purged before: deletions stay in RocksDB as
/// tombstones until compaction, and a scan from the start of the index would step over all of
/// them on every apply (a purge that costs more the longer the store runs). New index keys are
/// always past that point: they are retained until a later time than anything already purged.
pub(crate) fn purge(txn: &mut impl Txn, now: u64, limit: usize) -> Result<usize, StorageError> {
    let mut purged = 0;
    let cursor = meta::dedup_purged_through(txn)?;
    // Usually nothing is due: look at the oldest entry before reading a whole page.
    let oldest = txn.scan(Table::DedupExpiry, &[], cursor.as_deref(), 1)?;
    if oldest
        .first()
        .is_none_or(|(index_key, _)| split_timed_key(Table::DedupExpiry, index_key).is_ok_and(|(t, _)| t > now))
    {
        return Ok(0);
    }
    let mut last_purged = None;
    for (index_key, _) in txn.scan(Table::DedupExpiry, &[], cursor.as_deref(), limit)? {
        let (retain_until, key) = split_timed_key(Table::DedupExpiry, &index_key)?;
        if retain_until > now {
            break;
        }
        // A request remembered twice (re-executed after its entry was purged) has two index
        // entries; only the one matching the stored record removes it.
        if let Some(bytes) = txn.get(Table::Dedup, key)? {
            let mut r = Reader::new(Table::Dedup, &bytes)?;
            if r.u64()? == retain_until {
                txn.delete(Table::Dedup, key.to_vec());
            }
        }
        txn.delete(Table::DedupExpiry, index_key.clone());
        last_purged = Some(index_key);
        purged += 1;
    }
    if let Some(index_key) = last_purged {
        meta::set_dedup_purged_through(txn, index_key);
    }
    Ok(purged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{MemStorage, Overlay, Storage};

    fn identity(n: u8) -> RequestIdentity {
        RequestIdentity { response_topic: "clients/c/response".into(), correlation_data: vec![n; 16] }
    }

    #[test]
    fn purges_continue_after_the_last_purged_key_and_forget_only_what_is_due() {
        let mut storage = MemStorage::new();
        let reply = Reply { response: Response::Ok, version: None };
        let mut txn = Overlay::new(&storage);
        for n in 0..10u8 {
            remember(&mut txn, &identity(n), &reply, 1_000 + u64::from(n)).unwrap();
        }
        let batch = txn.into_batch();
        storage.write(batch).unwrap();

        let mut txn = Overlay::new(&storage);
        assert_eq!(purge(&mut txn, 1_004, 3).unwrap(), 3, "at most the limit");
        assert_eq!(meta::dedup_purged_through(&txn).unwrap(), Some(timed_key(1_002, &dedup_key(&identity(2)))));
        assert_eq!(purge(&mut txn, 1_004, 10).unwrap(), 2, "the next purge starts after the cursor");
        assert_eq!(purge(&mut txn, 1_004, 10).unwrap(), 0, "nothing else is due");
        for n in 0..10u8 {
            assert_eq!(lookup(&txn, &identity(n)).unwrap().is_some(), n > 4, "request {n}");
        }
        // A request remembered now is retained past everything purged: the cursor never skips it.
        remember(&mut txn, &identity(20), &reply, 2_000).unwrap();
        assert_eq!(purge(&mut txn, 2_000, 100).unwrap(), 6);
        assert!(lookup(&txn, &identity(20)).unwrap().is_none());
    }
}
