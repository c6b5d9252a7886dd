//! Applying log entries: the semantics of every command (PROTOCOL.md §6, §7, §9–§11).

use bytes::Bytes;
use statestore_protocol::backup::BackupKey;
use statestore_protocol::topic::{notification_topic_len, MAX_TOPIC_LEN};
use statestore_protocol::{
    Command, Get, Hlc, KeyNotify, Notification, Request, Response, Set, SetCondition, StoreError,
};

use crate::entry::{Applied, ClientRequest, Entry, Operation, OutboxEntry, Reply};
use crate::keyspace::{self, KeyRecord};
use crate::scan::{self, KeyPrefixes, ScanLimits};
use crate::storage::{Overlay, Storage, StorageError, StorageRead, Txn};
use crate::watch::{Registered, RegistrationLimits};
use crate::{dedup, meta, watch};

/// Limits and retention. Must be the same on every node: apply depends on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// At most this many keys; a SET creating one more answers `the quota has been exceeded`.
    pub max_keys: u64,
    /// At most this many bytes of keys plus values.
    pub max_bytes: u64,
    pub scan: ScanLimits,
    /// Retention of a dedup entry when the request carried no message expiry.
    pub default_message_expiry_secs: u32,
    /// Dedup entries are kept for the request's message expiry, at most
    /// `max_dedup_retention_ms`, plus this.
    pub dedup_grace_ms: u64,
    /// The longest message expiry a dedup entry is kept for: a copy of a request that arrives
    /// later than this (plus the grace) after it was applied is executed again.
    pub max_dedup_retention_ms: u64,
    /// Bytes of dedup records (`dedup::usage`) at which writes are refused with `the quota has
    /// been exceeded` until records expire.
    pub max_dedup_bytes: u64,
    /// KEYNOTIFY registrations beyond these answer `the quota has been exceeded`.
    pub registrations: RegistrationLimits,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_keys: 1_000_000,
            max_bytes: 1 << 30,
            scan: ScanLimits::default(),
            default_message_expiry_secs: 10,
            dedup_grace_ms: 60_000,
            max_dedup_retention_ms: 10 * 60_000,
            max_dedup_bytes: 256 << 20,
            registrations: RegistrationLimits::default(),
        }
    }
}

/// The deterministic state machine. Holds no state of its own: everything lives in the storage
/// it is given, so every replica that applies the same entries to the same state agrees.
#[derive(Debug, Clone, Default)]
pub struct StateMachine {
    config: Config,
}

/// Why a command did not succeed: the client's problem, or the storage's.
enum Failure {
    Client(StoreError),
    Storage(StorageError),
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Client(e)
    }
}

impl From<StorageError> for Failure {
    fn from(e: StorageError) -> Self {
        Failure::Storage(e)
    }
}

impl StateMachine {
    pub fn new(config: Config) -> StateMachine {
        StateMachine { config }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// State-machine time for a read at wall clock `wall_clock_ms`: never behind what was applied.
    pub fn now(&self, store: &(impl StorageRead + ?Sized), wall_clock_ms: u64) -> Result<u64, StorageError> {
        Ok(meta::clock(store)?.max(wall_clock_ms))
    }

    /// Applies `entries` in order and commits their writes as one atomic batch.
    pub fn apply_all(&self, storage: &mut impl Storage, entries: &[Entry]) -> Result<Vec<Applied>, StorageError> {
        let mut overlay = Overlay::new(&*storage);
        let applied = entries.iter().map(|entry| self.apply(&mut overlay, entry)).collect::<Result<Vec<_>, _>>()?;
        let batch = overlay.into_batch();
        storage.write(batch)?;
        Ok(applied)
    }

    /// Applies one entry inside `txn`. The caller commits `txn`'s writes (with its own, such as
    /// the last applied log index) atomically.
    pub fn apply(&self, txn: &mut impl Txn, entry: &Entry) -> Result<Applied, StorageError> {
        let now = meta::advance_clock(txn, entry.wall_clock_ms)?;
        let mut apply = Apply { txn, config: &self.config, now, notifications: Vec::new() };
        let reply = match &entry.operation {
            Operation::Request(request) => {
                if let Some(identity) = &request.identity {
                    if let Some(reply) = dedup::lookup(apply.txn, identity, now)? {
                        return Ok(Applied { reply, notifications: Vec::new(), deduplicated: true });
                    }
                    // A request it could not remember is not executed: its retry would run again.
                    dedup::release_expired(apply.txn, now)?;
                    if dedup::usage(apply.txn)?.bytes >= self.config.max_dedup_bytes {
                        return Ok(Applied {
                            reply: Reply::error(StoreError::QuotaExceeded),
                            notifications: Vec::new(),
                            deduplicated: false,
                        });
                    }
                }
                let reply = match apply.execute(request) {
                    Ok(reply) => reply,
                    Err(Failure::Client(error)) => Reply::error(error),
                    Err(Failure::Storage(error)) => return Err(error),
                };
                if let Some(identity) = &request.identity {
                    let expiry_secs = request.message_expiry_secs.unwrap_or(self.config.default_message_expiry_secs);
                    let expiry_ms = (u64::from(expiry_secs) * 1000).min(self.config.max_dedup_retention_ms);
                    let retain_until = now.saturating_add(expiry_ms).saturating_add(self.config.dedup_grace_ms);
                    dedup::remember(apply.txn, identity, &reply, retain_until)?;
                }
                reply
            }
            Operation::Expire { key, version } => apply.expire(key, version)?,
            Operation::DropRegistrations { client_id } => {
                Reply::new(Response::Int(watch::unregister_client(apply.txn, client_id)? as i64), None)
            }
            Operation::ConfirmNotifications { through } => {
                Reply::new(Response::Int(watch::confirm(apply.txn, *through)? as i64), None)
            }
            Operation::Enroll { node, incarnation, replace } => {
                let changed = meta::enroll(apply.txn, *node, incarnation.as_deref(), *replace)?;
                Reply::new(Response::Int(i64::from(changed)), None)
            }
            Operation::NameCluster { id, anew } => {
                Reply::new(Response::Int(i64::from(meta::name_cluster(apply.txn, id, *anew)?)), None)
            }
            Operation::Restore { first, keys } => apply.restore(*first, keys)?,
            Operation::RestoreChunk { session, first, keys } => apply.restore_chunk(*session, *first, keys)?,
            Operation::RenameCluster { id, replaces } => {
                Reply::new(Response::Int(i64::from(meta::rename_cluster(apply.txn, id, replaces.as_deref())?)), None)
            }
        };
        Ok(Applied { reply, notifications: apply.notifications, deduplicated: false })
    }

    /// Answers a GET or SCAN from `store` at wall clock `wall_clock_ms`, without the log. `None`
    /// for any other command: those change state and go through [`StateMachine::apply`].
    pub fn read(
        &self,
        store: &(impl StorageRead + ?Sized),
        request: &Request,
        wall_clock_ms: u64,
    ) -> Result<Option<Reply>, StorageError> {
        self.read_within(store, request, wall_clock_ms, None)
    }

    /// [`StateMachine::read`] for a client confined to `within`: a SCAN examines only the keys
    /// it allows. (A GET of another key is refused before it gets here.)
    pub fn read_within(
        &self,
        store: &(impl StorageRead + ?Sized),
        request: &Request,
        wall_clock_ms: u64,
        within: Option<&KeyPrefixes>,
    ) -> Result<Option<Reply>, StorageError> {
        let now = self.now(store, wall_clock_ms)?;
        if !request.command.is_read() {
            return Ok(None);
        }
        if let Err(error) = request.check_clock_skew(now) {
            return Ok(Some(Reply::error(error)));
        }
        Ok(Some(match &request.command {
            Command::Get(get) => read_get(store, get, now)?,
            Command::Scan(scan) => Reply::new(scan::scan(store, scan, now, self.config.scan, within)?, None),
            _ => unreachable!("is_read covers GET and SCAN"),
        }))
    }
}

/// A GET hit carries the key's version; a miss carries none (PROTOCOL.md §7.1).
fn read_get(store: &(impl StorageRead + ?Sized), get: &Get, now: u64) -> Result<Reply, StorageError> {
    Ok(match keyspace::load_live(store, &get.key, now)? {
        Some(record) => Reply::new(Response::Value(record.value), Some(record.version)),
        None => Reply::new(Response::Nil, None),
    })
}

/// Why a restore chunk was refused; its text is the chunk's error reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestoreRefusal {
    #[error("the store already holds keys: restore a backup into a new cluster")]
    NotEmpty,
    #[error("no restore with session {0} is under way: a later chunk must follow the first chunk of its session")]
    NoSession(u64),
    #[error(
        "a client wrote key {:?} during this restore: the cluster now holds keys the backup does not, start over with a new cluster",
        String::from_utf8_lossy(.0)
    )]
    WrittenByClient(Vec<u8>),
    #[error("the chunk would take the store to {keys} keys (quota {max_keys}) and {bytes} bytes (quota {max_bytes})")]
    OverQuota { keys: u64, max_keys: u64, bytes: u64, max_bytes: u64 },
}

impl RestoreRefusal {
    /// The HTTP error code of a refusal whose text is `message`.
    pub fn code_of(message: &str) -> &'static str {
        if message.starts_with("the store already holds keys") {
            "not_empty"
        } else if message.starts_with("a client wrote key") {
            "written_during_restore"
        } else if message.starts_with("no restore with session") {
            "no_restore_session"
        } else {
            "over_quota"
        }
    }
}

/// §11: a fenced key needs a token at least as new as the stored one.
fn check_fencing(record: &KeyRecord, fencing_token: Option<&Hlc>) -> Result<(), StoreError> {
    match (&record.fencing_token, fencing_token) {
        (None, _) => Ok(()),
        (Some(_), None) => Err(StoreError::FencingTokenRequired),
        (Some(stored), Some(given)) if given < stored => Err(StoreError::FencingTokenLowerVersion),
        (Some(_), Some(_)) => Ok(()),
    }
}

/// One entry being applied.
struct Apply<'a, T: Txn> {
    txn: &'a mut T,
    config: &'a Config,
    now: u64,
    notifications: Vec<OutboxEntry>,
}

impl<T: Txn> Apply<'_, T> {
    fn execute(&mut self, client: &ClientRequest) -> Result<Reply, Failure> {
        let request = &client.request;
        request.check_clock_skew(self.now)?;
        let timestamp = request.timestamp.as_ref();
        let fencing_token = request.fencing_token.as_ref();
        match &request.command {
            Command::Set(set) => self.set(set, timestamp, fencing_token),
            Command::Get(get) => Ok(read_get(self.txn, get, self.now)?),
            Command::Del(del) => self.delete(&del.key, None, timestamp, fencing_token),
            Command::VDel(vdel) => self.delete(&vdel.key, Some(&vdel.value), timestamp, fencing_token),
            Command::KeyNotify(keynotify) => self.keynotify(keynotify, client.client_id.as_deref()),
            Command::Scan(scan) => Ok(Reply::new(scan::scan(self.txn, scan, self.now, self.config.scan, None)?, None)),
        }
    }

    /// The live record of `key`. A record past its deadline is expired right here, with its
    /// DELETE notifications, so watchers see the expiry before whatever this entry does next.
    fn live(&mut self, key: &[u8]) -> Result<Option<KeyRecord>, StorageError> {
        match keyspace::load(self.txn, key)? {
            Some(record) if record.is_live(self.now) => Ok(Some(record)),
            Some(expired) => {
                self.remove(key, &expired, None)?;
                Ok(None)
            }
            None => Ok(None),
        }
    }

    /// Deletes `key` under a new version and notifies its watchers; returns the version.
    fn remove(&mut self, key: &[u8], record: &KeyRecord, timestamp: Option<&Hlc>) -> Result<Hlc, StorageError> {
        let version = meta::next_version(self.txn, timestamp, self.now)?;
        keyspace::remove(self.txn, key, record)?;
        watch::notify(self.txn, key, &Notification::Delete, &version, &mut self.notifications)?;
        Ok(version)
    }

    fn set(&mut self, set: &Set, timestamp: Option<&Hlc>, fencing_token: Option<&Hlc>) -> Result<Reply, Failure> {
        let current = self.live(&set.key)?;
        if let Some(current) = &current {
            check_fencing(current, fencing_token)?;
            let refused = match set.condition {
                SetCondition::Always => false,
                SetCondition::NotExists => true,
                SetCondition::NotExistsOrEqual => current.value != set.value,
            };
            if refused {
                return Ok(Reply::new(Response::Int(-1), Some(current.version.clone())));
            }
        }
        self.check_quota(set, current.as_ref())?;
        let version = meta::next_version(self.txn, timestamp, self.now)?;
        let stored_token = current.as_ref().and_then(|c| c.fencing_token.as_ref());
        let fencing_token = match (stored_token, fencing_token) {
            (Some(stored), Some(given)) => Some(stored.max(given).clone()),
            (stored, given) => stored.or(given).cloned(),
        };
        let record = KeyRecord {
            value: set.value.clone(),
            version: version.clone(),
            fencing_token,
            expires_at: set.expiry_ms.map(|ms| self.now.saturating_add(ms)),
        };
        keyspace::store(self.txn, &set.key, current.as_ref(), &record)?;
        self.written_by_client(&set.key)?;
        let notification = Notification::Set { value: Bytes::copy_from_slice(&set.value) };
        watch::notify(self.txn, &set.key, &notification, &version, &mut self.notifications)?;
        Ok(Reply::new(Response::Ok, Some(version)))
    }

    fn check_quota(&mut self, set: &Set, current: Option<&KeyRecord>) -> Result<(), Failure> {
        let new_bytes = (set.key.len() + set.value.len()) as u64;
        let old_bytes = current.map_or(0, |c| (set.key.len() + c.value.len()) as u64);
        if current.is_none() && meta::key_count(self.txn)? >= self.config.max_keys {
            return Err(StoreError::QuotaExceeded.into());
        }
        let total = meta::byte_count(self.txn)?.saturating_sub(old_bytes).saturating_add(new_bytes);
        if new_bytes > old_bytes && total > self.config.max_bytes {
            return Err(StoreError::QuotaExceeded.into());
        }
        Ok(())
    }

    /// DEL (`expected` is `None`) and VDEL.
    fn delete(
        &mut self,
        key: &[u8],
        expected: Option<&[u8]>,
        timestamp: Option<&Hlc>,
        fencing_token: Option<&Hlc>,
    ) -> Result<Reply, Failure> {
        let Some(current) = self.live(key)? else {
            return Ok(Reply::new(Response::Int(0), None));
        };
        check_fencing(&current, fencing_token)?;
        if expected.is_some_and(|expected| expected != current.value) {
            return Ok(Reply::new(Response::Int(-1), Some(current.version)));
        }
        let version = self.remove(key, &current, timestamp)?;
        self.written_by_client(key)?;
        Ok(Reply::new(Response::Int(1), Some(version)))
    }

    fn keynotify(&mut self, keynotify: &KeyNotify, client_id: Option<&str>) -> Result<Reply, Failure> {
        let client_id = client_id.filter(|c| !c.is_empty()).ok_or(StoreError::MissingClientId)?;
        if keynotify.stop {
            let removed = watch::unregister(self.txn, client_id, &keynotify.key)?;
            return Ok(Reply::new(if removed { Response::Ok } else { Response::Int(0) }, None));
        }
        if notification_topic_len(client_id.len(), keynotify.key.len()) > MAX_TOPIC_LEN {
            return Err(StoreError::KeyTooLongToObserve.into());
        }
        match watch::register(self.txn, client_id, &keynotify.key, &self.config.registrations)? {
            Registered::Added | Registered::Already => Ok(Reply::new(Response::Ok, None)),
            Registered::OverQuota => Err(StoreError::QuotaExceeded.into()),
        }
    }

    /// A chunk of a backup: each key stored as it was. A key already here is replaced (a chunk
    /// sent again after a lost answer changes nothing).
    fn restore(&mut self, first: bool, keys: &[BackupKey]) -> Result<Reply, StorageError> {
        if first && meta::key_count(self.txn)? > 0 {
            return Ok(Reply::error(StoreError::Unknown(
                "the store already holds keys: restore a backup into a new cluster".into(),
            )));
        }
        for restored in keys {
            let current = keyspace::load(self.txn, &restored.key)?;
            let record = KeyRecord {
                value: restored.value.clone(),
                version: restored.version.clone(),
                fencing_token: restored.fencing_token.clone(),
                expires_at: restored.expires_at,
            };
            keyspace::store(self.txn, &restored.key, current.as_ref(), &record)?;
            meta::observe_version(self.txn, &restored.version)?;
        }
        Ok(Reply::new(Response::Int(keys.len() as i64), None))
    }

    /// A restore chunk of `session` (see [`Operation::RestoreChunk`]). A refusal changes nothing.
    fn restore_chunk(&mut self, session: u64, first: bool, keys: &[BackupKey]) -> Result<Reply, StorageError> {
        let open = meta::restore_session(self.txn)?;
        let refusal = match (&open, first) {
            // The first chunk sent again after its answer was lost.
            (Some(open), true) if open.id == session && open.written_by_client.is_none() => None,
            (_, true) if meta::key_count(self.txn)? > 0 => Some(RestoreRefusal::NotEmpty),
            (_, true) => None,
            (Some(open), false) if open.id == session => {
                open.written_by_client.clone().map(RestoreRefusal::WrittenByClient)
            }
            (_, false) => Some(RestoreRefusal::NoSession(session)),
        };
        let refusal = match refusal {
            Some(refusal) => Some(refusal),
            None => self.restore_over_quota(keys)?,
        };
        if let Some(refusal) = refusal {
            return Ok(Reply::error(StoreError::Unknown(refusal.to_string())));
        }
        if first {
            meta::set_restore_session(self.txn, &meta::RestoreSession { id: session, written_by_client: None });
        }
        self.restore(false, keys)
    }

    /// Whether storing `keys` would take the store over its key or byte quota.
    fn restore_over_quota(&mut self, keys: &[BackupKey]) -> Result<Option<RestoreRefusal>, StorageError> {
        let (mut key_count, mut byte_count) = (meta::key_count(self.txn)?, meta::byte_count(self.txn)?);
        for restored in keys {
            let new_bytes = (restored.key.len() + restored.value.len()) as u64;
            match keyspace::load(self.txn, &restored.key)? {
                Some(current) => {
                    byte_count = byte_count.saturating_sub((restored.key.len() + current.value.len()) as u64)
                }
                None => key_count += 1,
            }
            byte_count = byte_count.saturating_add(new_bytes);
        }
        let over = key_count > self.config.max_keys || byte_count > self.config.max_bytes;
        Ok(over.then_some(RestoreRefusal::OverQuota {
            keys: key_count,
            max_keys: self.config.max_keys,
            bytes: byte_count,
            max_bytes: self.config.max_bytes,
        }))
    }

    /// A client stored or deleted `key`: a restore under way takes no more chunks.
    fn written_by_client(&mut self, key: &[u8]) -> Result<(), StorageError> {
        if let Some(session) = meta::restore_session(self.txn)? {
            if session.written_by_client.is_none() {
                let written_by_client = Some(key.to_vec());
                meta::set_restore_session(self.txn, &meta::RestoreSession { written_by_client, ..session });
            }
        }
        Ok(())
    }

    /// The sweeper's Expire: only the exact version it saw, and only once it is due.
    fn expire(&mut self, key: &[u8], version: &Hlc) -> Result<Reply, StorageError> {
        match keyspace::load(self.txn, key)? {
            Some(record) if record.version == *version && !record.is_live(self.now) => {
                let deleted = self.remove(key, &record, None)?;
                Ok(Reply::new(Response::Int(1), Some(deleted)))
            }
            _ => Ok(Reply::new(Response::Int(0), None)),
        }
    }
}
