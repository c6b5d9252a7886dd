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
