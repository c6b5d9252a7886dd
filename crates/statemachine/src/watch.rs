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

use bytes::Bytes;
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

/// How many KEYNOTIFY registrations the store accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegistrationLimits {
    /// Registrations of all clients together.
    pub total: u64,
    /// Registrations of one client id.
    pub per_client: u64,
}

impl Default for RegistrationLimits {
    fn default() -> Self {
        RegistrationLimits { total: 100_000, per_client: 1_000 }
    }
}

/// What a registration did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Registered {
    Added,
    Already,
    /// The total or this client's quota is reached; nothing was written.
    OverQuota,
}

/// Registers `client_id` for `key`, within `limits`.
pub(crate) fn register(
    txn: &mut impl Txn,
    client_id: &str,
    key: &[u8],
    limits: &RegistrationLimits,
) -> Result<Registered, StorageError> {
    let by_key = pair_key(key, client_id.as_bytes());
    if txn.get(Table::Watchers, &by_key)?.is_some() {
        return Ok(Registered::Already);
    }
    let count = registrations(txn)?;
    let of_client = client_registrations(txn, client_id)?;
    if count >= limits.total || of_client >= limits.per_client {
        return Ok(Registered::OverQuota);
    }
    txn.put(Table::Watchers, by_key, Vec::new());
    txn.put(Table::WatchedKeys, pair_key(client_id.as_bytes(), key), Vec::new());
    meta::set_registration_count(txn, count + 1);
    meta::set_client_registration_count(txn, client_id, of_client + 1);
    Ok(Registered::Added)
}

/// Removes the registration of `client_id` for `key`; false if there was none.
pub(crate) fn unregister(txn: &mut impl Txn, client_id: &str, key: &[u8]) -> Result<bool, StorageError> {
    let by_key = pair_key(key, client_id.as_bytes());
    if txn.get(Table::Watchers, &by_key)?.is_none() {
        return Ok(false);
    }
    let count = registrations(txn)?;
    let of_client = client_registrations(txn, client_id)?;
    txn.delete(Table::Watchers, by_key);
    txn.delete(Table::WatchedKeys, pair_key(client_id.as_bytes(), key));
    meta::set_registration_count(txn, count.saturating_sub(1));
    meta::set_client_registration_count(txn, client_id, of_client.saturating_sub(1));
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
    meta::set_client_registration_count(txn, client_id, 0);
    Ok(removed)
}

/// The number of registrations of `client_id`, counted if the store does not have it (none yet,
/// or a store written before the per-client count was kept).
fn client_registrations(txn: &mut impl Txn, client_id: &str) -> Result<u64, StorageError> {
    if let Some(count) = meta::client_registration_count(txn, client_id)? {
        return Ok(count);
    }
    let (mut pages, mut count) = (Pages::new(Table::WatchedKeys, &length_prefix(client_id.as_bytes())), 0);
    loop {
        let page = pages.next(txn)?;
        if page.is_empty() {
            return Ok(count);
        }
        count += page.len() as u64;
    }
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
///
/// One change is one outbox record, whatever the number of watchers: the value and key are
/// stored once, with the watchers' ids, under the last of the consecutive sequence numbers the
/// watchers get; in memory every watcher's entry shares them.
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
    let clients = watchers(txn, key)?;
    let Some(count) = std::num::NonZeroU64::new(clients.len() as u64) else {
        return Ok(());
    };
    let first = meta::take_outbox_seqs(txn, count.get())?;
    let change = Change {
        first,
        clients,
        key: Bytes::copy_from_slice(key),
        notification: notification.clone(),
        version: version.clone(),
    };
    txn.put(Table::Outbox, timed_key(change.last(), &[]), encode_change(&change));
    out.extend(change.entries());
    Ok(())
}

/// One change's notifications: sequence numbers `first..first + clients.len()`, one per client.
struct Change {
    first: u64,
    clients: Vec<String>,
    key: Bytes,
    notification: Notification,
    version: Hlc,
}

impl Change {
    fn last(&self) -> u64 {
        self.first + self.clients.len() as u64 - 1
    }

    fn entries(self) -> impl Iterator<Item = OutboxEntry> {
        let Change { first, clients, key, notification, version } = self;
        clients.into_iter().zip(first..).map(move |(client_id, seq)| OutboxEntry {
            seq,
            notification: KeyNotification {
                client_id,
                key: key.clone(),
                notification: notification.clone(),
                version: version.clone(),
            },
        })
    }
}

/// Marks a record of several watchers; a record of one watcher in the first layout starts with
/// the length of its client id, whose first byte is 0.
const SHARED: u8 = 0xFF;

fn encode_change(change: &Change) -> Vec<u8> {
    let mut writer = Writer::new().u8(SHARED).u64(change.first).u64(change.clients.len() as u64);
    for client in &change.clients {
        writer = writer.bytes(client.as_bytes());
    }
    let writer = writer.bytes(&change.key).hlc(&change.version);
    match &change.notification {
        Notification::Set { value } => writer.u8(1).bytes(value),
        Notification::Delete => writer.u8(0),
    }
    .finish()
}

/// How many notifications a record holds, from its header alone.
fn notifications_in(bytes: &[u8]) -> Result<u64, StorageError> {
    let mut r = Reader::new(Table::Outbox, bytes)?;
    if r.peek_u8()? != SHARED {
        return Ok(1);
    }
    r.u8()?;
    r.u64()?;
    r.u64()
}

fn decode_change(seq_key: &[u8], bytes: &[u8]) -> Result<Change, StorageError> {
    let corrupt = |detail| StorageError::Corrupt { table: Table::Outbox, detail };
    let (last, _) = split_timed_key(Table::Outbox, seq_key)?;
    let mut r = Reader::new(Table::Outbox, bytes)?;
    let client_id =
        |r: &mut Reader| String::from_utf8(r.bytes()?.to_vec()).map_err(|_| corrupt("client id is not UTF-8"));
    let (first, clients) = if r.peek_u8()? == SHARED {
        r.u8()?;
        let first = r.u64()?;
        let count = r.u64()?;
        if count == 0 || first.checked_add(count - 1) != Some(last) {
            return Err(corrupt("sequence numbers do not match the record's key"));
        }
        let clients = (0..count).map(|_| client_id(&mut r)).collect::<Result<Vec<_>, _>>()?;
        (first, clients)
    } else {
        (last, vec![client_id(&mut r)?])
    };
    let key = Bytes::copy_from_slice(r.bytes()?);
    let version = r.hlc()?;
    let notification = match r.u8()? {
        1 => Notification::Set { value: Bytes::copy_from_slice(r.bytes()?) },
        0 => Notification::Delete,
        _ => return Err(corrupt("bad notification kind")),
    };
    r.finish()?;
    Ok(Change { first, clients, key, notification, version })
}

/// Unconfirmed notifications with `seq > after` (all when `after` is `None`), in order, from at
/// most `limit` changes; fewer than `limit` entries means there are no more.
pub fn pending_notifications(
    store: &(impl StorageRead + ?Sized),
    after: Option<u64>,
    limit: usize,
) -> Result<Vec<OutboxEntry>, StorageError> {
    // Records are keyed by their last sequence number: the first record past `after` is the one
    // that holds `after + 1`.
    let from = after.map(|seq| timed_key(seq, &[]));
    let mut entries = Vec::new();
    for (seq_key, bytes) in store.scan(Table::Outbox, &[], from.as_deref(), limit)? {
        let change = decode_change(&seq_key, &bytes)?;
        entries.extend(change.entries().filter(|entry| after.is_none_or(|after| entry.seq > after)));
    }
    Ok(entries)
}

/// Drops the records whose notifications are all confirmed (sequence numbers up to and
/// including `through`); returns how many notifications they held.
pub(crate) fn confirm(txn: &mut impl Txn, through: u64) -> Result<u64, StorageError> {
    let (mut pages, mut removed) = (Pages::new(Table::Outbox, &[]), 0);
    loop {
        let page = pages.next(txn)?;
        if page.is_empty() {
            return Ok(removed);
        }
        for (seq_key, bytes) in page {
            if split_timed_key(Table::Outbox, &seq_key)?.0 > through {
                return Ok(removed);
            }
            removed += notifications_in(&bytes)?;
            txn.delete(Table::Outbox, seq_key);
        }
    }
}
