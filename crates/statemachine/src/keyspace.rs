//! Stored keys: the record, the expiry index and the usage counters, kept consistent.

use statestore_protocol::Hlc;

use crate::codec::{split_timed_key, timed_key, Reader, Writer};
use crate::meta;
use crate::storage::{StorageError, StorageRead, Table, Txn};

/// What is stored for a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    pub value: Vec<u8>,
    /// The HLC issued by the SET that wrote it.
    pub version: Hlc,
    /// The fencing token protecting the key (§11), if any.
    pub fencing_token: Option<Hlc>,
    /// When the key expires (ms since the epoch), from `PX`.
    pub expires_at: Option<u64>,
}

impl KeyRecord {
    /// A key is gone once state-machine time reaches its deadline.
    pub fn is_live(&self, now: u64) -> bool {
        self.expires_at.is_none_or(|deadline| now < deadline)
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        Writer::new()
            .bytes(&self.value)
            .hlc(&self.version)
            .opt_hlc(self.fencing_token.as_ref())
            .opt_u64(self.expires_at)
            .finish()
    }

    pub fn decode(bytes: &[u8]) -> Result<KeyRecord, StorageError> {
        let mut r = Reader::new(Table::Keys, bytes)?;
        let record = KeyRecord {
            value: r.bytes()?.to_vec(),
            version: r.hlc()?,
            fencing_token: r.opt_hlc()?,
            expires_at: r.opt_u64()?,
        };
        r.finish()?;
        Ok(record)
    }

    fn usage(&self, key: &[u8]) -> i64 {
        (key.len() + self.value.len()) as i64
    }
}

/// The stored record of `key`, live or not.
pub fn load(store: &(impl StorageRead + ?Sized), key: &[u8]) -> Result<Option<KeyRecord>, StorageError> {
    store.get(Table::Keys, key)?.map(|bytes| KeyRecord::decode(&bytes)).transpose()
}

/// The record of `key` if it is live at `now`.
pub fn load_live(store: &(impl StorageRead + ?Sized), key: &[u8], now: u64) -> Result<Option<KeyRecord>, StorageError> {
    Ok(load(store, key)?.filter(|record| record.is_live(now)))
}

/// Writes `record` for `key`, replacing `previous` (what is stored now, if anything).
pub(crate) fn store(
    txn: &mut impl Txn,
    key: &[u8],
    previous: Option<&KeyRecord>,
    record: &KeyRecord,
) -> Result<(), StorageError> {
    if let Some(deadline) = previous.and_then(|p| p.expires_at) {
        txn.delete(Table::Expiry, timed_key(deadline, key));
    }
    if let Some(deadline) = record.expires_at {
        txn.put(Table::Expiry, timed_key(deadline, key), Writer::new().hlc(&record.version).finish());
    }
    txn.put(Table::Keys, key.to_vec(), record.encode());
    let (keys, bytes) = match previous {
        Some(previous) => (0, record.usage(key) - previous.usage(key)),
        None => (1, record.usage(key)),
    };
    meta::add_usage(txn, keys, bytes)
}

/// Removes `key`, whose stored record is `previous`.
pub(crate) fn remove(txn: &mut impl Txn, key: &[u8], previous: &KeyRecord) -> Result<(), StorageError> {
    if let Some(deadline) = previous.expires_at {
        txn.delete(Table::Expiry, timed_key(deadline, key));
    }
    txn.delete(Table::Keys, key.to_vec());
    meta::add_usage(txn, -1, -previous.usage(key))
}

/// A key whose deadline has passed, as the sweeper proposes it for [`crate::Operation::Expire`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueKey {
    pub key: Vec<u8>,
    pub version: Hlc,
    pub expires_at: u64,
}

/// Up to `limit` keys whose deadline is at or before `now`, earliest first.
pub fn due_keys(store: &(impl StorageRead + ?Sized), now: u64, limit: usize) -> Result<Vec<DueKey>, StorageError> {
    let mut due = Vec::new();
    for (index_key, value) in store.scan(Table::Expiry, &[], None, limit)? {
        let (expires_at, key) = split_timed_key(Table::Expiry, &index_key)?;
        if expires_at > now {
            break;
        }
        let mut r = Reader::new(Table::Expiry, &value)?;
        let version = r.hlc()?;
        r.finish()?;
        due.push(DueKey { key: key.to_vec(), version, expires_at });
    }
    Ok(due)
}

/// The earliest deadline of any stored key: when the sweeper should next look.
pub fn next_deadline(store: &(impl StorageRead + ?Sized)) -> Result<Option<u64>, StorageError> {
    match store.scan(Table::Expiry, &[], None, 1)?.first() {
        Some((index_key, _)) => Ok(Some(split_timed_key(Table::Expiry, index_key)?.0)),
        None => Ok(None),
    }
}
