//! State-machine metadata in [`Table::Meta`]: the clock, the last issued version, counters.

use std::collections::BTreeMap;

use statestore_protocol::Hlc;

use crate::codec::{decode_u64, encode_u64, Reader, Writer};
use crate::storage::{StorageError, StorageRead, Table, Txn};

/// The node id of every version the store issues. One constant id for the whole cluster: the
/// SDKs check that renewals keep the same node id (PROTOCOL.md §10.8).
pub const VERSION_NODE_ID: &str = "statestore";

const CLOCK: &[u8] = b"clock";
const VERSION: &[u8] = b"version";
const KEY_COUNT: &[u8] = b"key_count";
const BYTE_COUNT: &[u8] = b"byte_count";
const OUTBOX_NEXT: &[u8] = b"outbox_next";
const REGISTRATION_COUNT: &[u8] = b"registration_count";
/// Followed by a client id: that client's number of registrations.
const CLIENT_REGISTRATIONS: &[u8] = b"registrations_of/";
const CLUSTER_ID: &[u8] = b"cluster_id";
/// Followed by a node id (8 bytes, big-endian): that member's storage incarnation.
const INCARNATION_OF: &[u8] = b"incarnation_of/";
/// Bytes and records of the dedup table that apply has accounted and not yet released.
pub(crate) const DEDUP_USAGE: &[u8] = b"dedup_usage";
/// Followed by a time (ms, u64 big-endian, a whole second): the bytes and records of the dedup
/// records whose retention ends within the second before it.
pub(crate) const DEDUP_DUE: &[u8] = b"dedup_due/";
/// The earliest time under [`DEDUP_DUE`], absent when none.
pub(crate) const DEDUP_NEXT_DUE: &[u8] = b"dedup_next_due";
/// The restore whose chunks the cluster takes, while one is under way.
const RESTORE_SESSION: &[u8] = b"restore_session";

/// Meta keys the state machine owns; other layers sharing [`Table::Meta`] must not use them.
/// [`CLIENT_REGISTRATIONS`], [`INCARNATION_OF`] and [`DEDUP_DUE`] are prefixes: every key starting with it is reserved too.
pub const RESERVED_META_KEYS: [&[u8]; 13] = [
    CLOCK,
    VERSION,
    KEY_COUNT,
    BYTE_COUNT,
    OUTBOX_NEXT,
    REGISTRATION_COUNT,
    CLIENT_REGISTRATIONS,
    CLUSTER_ID,
    INCARNATION_OF,
    DEDUP_USAGE,
    DEDUP_DUE,
    DEDUP_NEXT_DUE,
    RESTORE_SESSION,
];

fn read_u64(store: &(impl StorageRead + ?Sized), key: &[u8]) -> Result<u64, StorageError> {
    store.get(Table::Meta, key)?.map_or(Ok(0), |v| decode_u64(Table::Meta, &v))
}

/// The latest time applied (ms since the epoch); 0 before the first entry.
pub fn clock(store: &(impl StorageRead + ?Sized)) -> Result<u64, StorageError> {
    read_u64(store, CLOCK)
}

/// Advances the state-machine clock to `wall_clock_ms` if it is later; returns the clock.
pub(crate) fn advance_clock(txn: &mut impl Txn, wall_clock_ms: u64) -> Result<u64, StorageError> {
    let current = clock(txn)?;
    if wall_clock_ms > current {
        txn.put(Table::Meta, CLOCK.to_vec(), encode_u64(wall_clock_ms));
        return Ok(wall_clock_ms);
    }
    Ok(current)
}

/// The last version issued, or the zero clock before the first.
pub fn last_version(store: &(impl StorageRead + ?Sized)) -> Result<Hlc, StorageError> {
    match store.get(Table::Meta, VERSION)? {
        None => Ok(Hlc::new(0, 0, VERSION_NODE_ID)),
        Some(bytes) => {
            let mut reader = Reader::new(Table::Meta, &bytes)?;
            let version = reader.hlc()?;
            reader.finish()?;
            Ok(version)
        }
    }
}

/// Issues the next version: newer than every version before it and than the request's `__ts`.
pub(crate) fn next_version(txn: &mut impl Txn, request: Option<&Hlc>, now: u64) -> Result<Hlc, StorageError> {
    let version = last_version(txn)?.successor(request, now);
    txn.put(Table::Meta, VERSION.to_vec(), Writer::new().hlc(&version).finish());
    Ok(version)
}

/// Makes `version` the last issued one if it is newer (a restored key's), so the next version
/// issued is newer still.
pub(crate) fn observe_version(txn: &mut impl Txn, version: &Hlc) -> Result<(), StorageError> {
    if *version > last_version(txn)? {
        txn.put(Table::Meta, VERSION.to_vec(), Writer::new().hlc(version).finish());
    }
    Ok(())
}

/// Number of keys stored (including keys past their deadline not yet swept).
pub fn key_count(store: &(impl StorageRead + ?Sized)) -> Result<u64, StorageError> {
    read_u64(store, KEY_COUNT)
}

/// Sum of key and value lengths of the keys stored.
pub fn byte_count(store: &(impl StorageRead + ?Sized)) -> Result<u64, StorageError> {
    read_u64(store, BYTE_COUNT)
}

/// Adjusts the key and byte counters by a signed delta.
pub(crate) fn add_usage(txn: &mut impl Txn, keys: i64, bytes: i64) -> Result<(), StorageError> {
    let key_count = key_count(txn)?.saturating_add_signed(keys);
    let byte_count = byte_count(txn)?.saturating_add_signed(bytes);
    txn.put(Table::Meta, KEY_COUNT.to_vec(), encode_u64(key_count));
    txn.put(Table::Meta, BYTE_COUNT.to_vec(), encode_u64(byte_count));
    Ok(())
}

/// The sequence number the next notification will get.
pub fn outbox_next(store: &(impl StorageRead + ?Sized)) -> Result<u64, StorageError> {
    read_u64(store, OUTBOX_NEXT)
}

/// Takes `count` consecutive sequence numbers; returns the first.
pub(crate) fn take_outbox_seqs(txn: &mut impl Txn, count: u64) -> Result<u64, StorageError> {
    let seq = outbox_next(txn)?;
    txn.put(Table::Meta, OUTBOX_NEXT.to_vec(), encode_u64(seq + count));
    Ok(seq)
}

/// Number of KEYNOTIFY registrations, `None` in a store written before the count was kept.
pub(crate) fn registration_count(store: &(impl StorageRead + ?Sized)) -> Result<Option<u64>, StorageError> {
    store.get(Table::Meta, REGISTRATION_COUNT)?.map(|v| decode_u64(Table::Meta, &v)).transpose()
}

pub(crate) fn set_registration_count(txn: &mut impl Txn, count: u64) {
    txn.put(Table::Meta, REGISTRATION_COUNT.to_vec(), encode_u64(count));
}

fn client_registrations_key(client_id: &str) -> Vec<u8> {
    [CLIENT_REGISTRATIONS, client_id.as_bytes()].concat()
}

/// Number of registrations of `client_id`, `None` when not recorded (no registration, or a store
/// written before the per-client count was kept).
pub(crate) fn client_registration_count(
    store: &(impl StorageRead + ?Sized),
    client_id: &str,
) -> Result<Option<u64>, StorageError> {
    store.get(Table::Meta, &client_registrations_key(client_id))?.map(|v| decode_u64(Table::Meta, &v)).transpose()
}

/// Records the number of registrations of `client_id`; zero removes the record.
pub(crate) fn set_client_registration_count(txn: &mut impl Txn, client_id: &str, count: u64) {
    let key = client_registrations_key(client_id);
    if count == 0 {
        txn.delete(Table::Meta, key);
    } else {
        txn.put(Table::Meta, key, encode_u64(count));
    }
}

fn text(store: &(impl StorageRead + ?Sized), key: &[u8]) -> Result<Option<String>, StorageError> {
    store
        .get(Table::Meta, key)?
        .map(|v| String::from_utf8(v).map_err(|_| StorageError::Corrupt { table: Table::Meta, detail: "not UTF-8" }))
        .transpose()
}

/// The cluster's name, once its first leader gave it one.
pub fn cluster_id(store: &(impl StorageRead + ?Sized)) -> Result<Option<String>, StorageError> {
    text(store, CLUSTER_ID)
}

/// Names the cluster `id` unless it has a name, or, `anew`, renames it and forgets every
/// enrollment; whether it did.
pub(crate) fn name_cluster(txn: &mut impl Txn, id: &str, anew: bool) -> Result<bool, StorageError> {
    if cluster_id(txn)?.is_some() && !anew {
        return Ok(false);
    }
    if anew {
        for node in enrollments(txn)?.into_keys() {
            txn.delete(Table::Meta, incarnation_key(node));
        }
    }
    txn.put(Table::Meta, CLUSTER_ID.to_vec(), id.as_bytes().to_vec());
    Ok(true)
}

/// Renames the cluster `id` and forgets every enrollment if its name is `replaces`; whether it
/// did.
pub(crate) fn rename_cluster(txn: &mut impl Txn, id: &str, replaces: Option<&str>) -> Result<bool, StorageError> {
    if cluster_id(txn)?.as_deref() != replaces {
        return Ok(false);
    }
    name_cluster(txn, id, true)
}

fn incarnation_key(node: u64) -> Vec<u8> {
    [INCARNATION_OF, &node.to_be_bytes()[..]].concat()
}

/// The storage incarnation enrolled for member `node`, if any.
pub fn enrolled(store: &(impl StorageRead + ?Sized), node: u64) -> Result<Option<String>, StorageError> {
    text(store, &incarnation_key(node))
}

/// Every enrolled member and its storage incarnation.
pub fn enrollments(store: &(impl StorageRead + ?Sized)) -> Result<BTreeMap<u64, String>, StorageError> {
    let corrupt = StorageError::Corrupt { table: Table::Meta, detail: "bad enrollment" };
    let mut out = BTreeMap::new();
    for (key, value) in store.scan(Table::Meta, INCARNATION_OF, None, usize::MAX)? {
        let id = key[INCARNATION_OF.len()..].try_into().map(u64::from_be_bytes).map_err(|_| corrupt.clone())?;
        out.insert(id, String::from_utf8(value).map_err(|_| corrupt.clone())?);
    }
    Ok(out)
}

/// Records (or, with `None`, forgets) `node`'s incarnation; without `replace` a recorded one
/// stays. Whether anything changed.
pub(crate) fn enroll(
    txn: &mut impl Txn,
    node: u64,
    incarnation: Option<&str>,
    replace: bool,
) -> Result<bool, StorageError> {
    let current = enrolled(txn, node)?;
    if (current.is_some() && !replace) || current.as_deref() == incarnation {
        return Ok(false);
    }
    match incarnation {
        Some(incarnation) => txn.put(Table::Meta, incarnation_key(node), incarnation.as_bytes().to_vec()),
        None => txn.delete(Table::Meta, incarnation_key(node)),
    }
    Ok(true)
}

/// The latest restore of a backup into this store (`Operation::RestoreChunk`): the session its
/// chunks carry, and the first key a client wrote since it began, after which it takes no chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreSession {
    pub id: u64,
    pub written_by_client: Option<Vec<u8>>,
}

/// The latest restore session, if a backup was ever restored through chunks.
pub fn restore_session(store: &(impl StorageRead + ?Sized)) -> Result<Option<RestoreSession>, StorageError> {
    let Some(bytes) = store.get(Table::Meta, RESTORE_SESSION)? else {
        return Ok(None);
    };
    let mut reader = Reader::new(Table::Meta, &bytes)?;
    let id = reader.u64()?;
    let written_by_client = match reader.u8()? {
        0 => None,
        _ => Some(reader.bytes()?.to_vec()),
    };
    reader.finish()?;
    Ok(Some(RestoreSession { id, written_by_client }))
}

pub(crate) fn set_restore_session(txn: &mut impl Txn, session: &RestoreSession) {
    let writer = Writer::new().u64(session.id);
    let writer = match &session.written_by_client {
        Some(key) => writer.u8(1).bytes(key),
        None => writer.u8(0),
    };
    txn.put(Table::Meta, RESTORE_SESSION.to_vec(), writer.finish());
}
