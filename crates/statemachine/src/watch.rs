//! KEYNOTIFY registrations and the notification outbox.
//!
//! Notifications are written to the replicated outbox in the same batch as the change that
//! caused them, and leave it only through [`crate::Operation::ConfirmNotifications`]. A new
//! leader therefore finds every notification its predecessor had not confirmed as published.
//!
//! The number of registrations is kept in [`Table::Meta`], so a change to a key looks up its
//! watchers only while there are any: with no registration a SET costs a point read, not a
//! scan of the registrations. A store written before the count existed has it counted once,
//! by the first entry that needs it (the same entry on every replica).

use statestore_protocol::{Hlc, Notification};

use crate::codec::{length_prefix, pair_key, split_pair_key, split_timed_key, timed_key, Reader, Writer};
use crate::entry::{KeyNotification, OutboxEntry};
use crate::meta;
use crate::storage::{ScanPage, StorageError, StorageRead, Table, Txn};

const PAGE: usize = 256;

/// A cursor over the entries of one table under a prefix, [`PAGE`] at a time; the store may be
/// written between pages.
struct Pages {
    table: Table,
    prefix: Vec<u8>,
    after: Option<Vec<u8>>,
    done: bool,
}

impl Pages {
    fn new(table: Table, prefix: &[u8]) -> Pages {
        Pages { table, prefix: prefix.to_vec(), after: None, done: false }
    }

    /// The next page; empty once every entry was returned.
    fn next(&mut self, store: &(impl StorageRead + ?Sized)) -> Result<ScanPage, StorageError> {
        if self.done {
            return Ok(ScanPage::new());
        }
        let page = store.scan(self.table, &self.prefix, self.after.as_deref(), PAGE)?;
        self.done = page.len() < PAGE;
        self.after = page.last().map(|(k, _)| k.clone());
        Ok(page)
    }
}

/// Registers `client_id` for `key`; false if it already was.
pub(crate) fn register(txn: &mut impl Txn, client_id: &str, key: &[u8]) -> Result<bool, StorageError> {
    let by_key = pair_key(key, client_id.as_bytes());
    if txn.get(Table::Watchers, &by_key)?.is_some() {
        return Ok(false);
    }
    let count = registrations(txn)?;
    txn.put(Table::Watchers, by_key, Vec::new());
    txn.put(Table::WatchedKeys, pair_key(client_id.as_bytes(), key), Vec::new());
    meta::set_registration_count(txn, count + 1);
    Ok(true)
}

/// Removes the registration of `client_id` for `key`; false if there was none.
pub(crate) fn unregister(txn: &mut impl Txn, client_id: &str, key: &[u8]) -> Result<bool, StorageError> {
    let by_key = pair_key(key, client_id.as_bytes());
    if txn.get(Table::Watchers, &by_key)?.is_none() {
        return Ok(false);
    }
    let count = registrations(txn)?;
    txn.delete(Table::Watchers, by_key);
    txn.delete(Table::WatchedKeys, pair_key(client_id.as_bytes(), key));
    meta::set_registration_count(txn, count.saturating_sub(1));
    Ok(true)
}

/// Removes every registration of `client_id`; returns how many there were.
pub(crate) fn unregister_client(txn: &mut impl Txn, client_id: &str) -> Result<u64, StorageError> {
    let count = registrations(txn)?;
    let mut pages = Pages::new(Table::WatchedKeys, &length_prefix(client_id.as_bytes()));
    let mut removed = 0;
    loop {
        let page = pages.next(txn)?;
        if page.is_empty() {
            break;
        }
        for (by_client, _) in page {
            let (_, key) = split_pair_key(Table::WatchedKeys, &by_client)?;
            txn.delete(Table::Watchers, pair_key(key, client_id.as_bytes()));
            txn.delete(Table::WatchedKeys, by_client);
            removed += 1;
        }
    }
    meta::set_registration_count(txn, count.saturating_sub(removed));
    Ok(removed)
}

/// The number of registrations, counted (and recorded) if the store does not have it yet.
fn registrations(txn: &mut impl Txn) -> Result<u64, StorageError> {
    if let Some(count) = meta::registration_count(txn)? {
        return Ok(count);
    }
    let (mut pages, mut count) = (Pages::new(Table::Watchers, &[]), 0);
    loop {
        let page = pages.next(txn)?;
        if page.is_empty() {
            break;
        }
        count += page.len() as u64;
    }
    meta::set_registration_count(txn, count);
    Ok(count)
}

/// Whether `client_id` is registered for `key`.
pub fn is_registered(store: &(impl StorageRead + ?Sized), client_id: &str, key: &[u8]) -> Result<bool, StorageError> {
    Ok(store.get(Table::Watchers, &pair_key(key, client_id.as_bytes()))?.is_some())
}

/// The clients registered for `key`, in byte order of their ids.
pub fn watchers(store: &(impl StorageRead + ?Sized), key: &[u8]) -> Result<Vec<String>, StorageError> {
    let mut pages = Pages::new(Table::Watchers, &length_prefix(key));
    let mut clients = Vec::new();
    loop {
        let page = pages.next(store)?;
        if page.is_empty() {
            return Ok(clients);
        }
        for (by_key, _) in &page {
            let (_, client) = split_pair_key(Table::Watchers, by_key)?;
            let client = String::from_utf8(client.to_vec())
                .map_err(|_| StorageError::Corrupt { table: Table::Watchers, detail: "client id is not UTF-8" })?;
            clients.push(client);
        }
    }
}

/// Queues `notification` about `key` for every client registered for it.
pub(crate) fn notify(
    txn: &mut impl Txn,
    key: &[u8],
    notification: &Notification,
    version: &Hlc,
    out: &mut Vec<OutboxEntry>,
) -> Result<(), StorageError> {
    if registrations(txn)? == 0 {
        return Ok(());
    }
    for client_id in watchers(txn, key)? {
        let entry = OutboxEntry {
            seq: meta::take_outbox_seq(txn)?,
            notification: KeyNotification {
                client_id,
                key: key.to_vec(),
                notification: notification.clone(),
                version: version.clone(),
            },
        };
        txn.put(Table::Outbox, timed_key(entry.seq, &[]), encode_outbox(&entry.notification));
        out.push(entry);
    }
    Ok(())
}

fn encode_outbox(n: &KeyNotification) -> Vec<u8> {
    let writer = Writer::new().bytes(n.client_id.as_bytes()).bytes(&n.key).hlc(&n.version);
    match &n.notification {
        Notification::Set { value } => writer.u8(1).bytes(value),
        Notification::Delete => writer.u8(0),
    }
    .finish()
}

fn decode_outbox(seq_key: &[u8], bytes: &[u8]) -> Result<OutboxEntry, StorageError> {
    let corrupt = |detail| StorageError::Corrupt { table: Table::Outbox, detail };
    let (seq, _) = split_timed_key(Table::Outbox, seq_key)?;
    let mut r = Reader::new(Table::Outbox, bytes)?;
    let client_id = String::from_utf8(r.bytes()?.to_vec()).map_err(|_| corrupt("client id is not UTF-8"))?;
    let key = r.bytes()?.to_vec();
    let version = r.hlc()?;
    let notification = match r.u8()? {
        1 => Notification::Set { value: r.bytes()?.to_vec() },
        0 => Notification::Delete,
        _ => return Err(corrupt("bad notification kind")),
    };
    r.finish()?;
    Ok(OutboxEntry { seq, notification: KeyNotification { client_id, key, notification, version } })
}

/// Up to `limit` unconfirmed notifications with `seq > after` (all when `after` is `None`), in order.
pub fn pending_notifications(
    store: &(impl StorageRead + ?Sized),
    after: Option<u64>,
    limit: usize,
) -> Result<Vec<OutboxEntry>, StorageError> {
    let after = after.map(|seq| timed_key(seq, &[]));
    store.scan(Table::Outbox, &[], after.as_deref(), limit)?.iter().map(|(k, v)| decode_outbox(k, v)).collect()
}

/// Drops confirmed notifications up to and including `through`; returns how many.
pub(crate) fn confirm(txn: &mut impl Txn, through: u64) -> Result<u64, StorageError> {
    let (mut pages, mut removed) = (Pages::new(Table::Outbox, &[]), 0);
    loop {
        let page = pages.next(txn)?;
        if page.is_empty() {
            return Ok(removed);
        }
        for (seq_key, _) in page {
            if split_timed_key(Table::Outbox, &seq_key)?.0 > through {
                return Ok(removed);
            }
            txn.delete(Table::Outbox, seq_key);
            removed += 1;
        }
    }
}
