//! Raft for the state store: openraft's type configuration, the log store (the log's own files)
//! and the state-machine store (RocksDB), snapshots, and the HTTP network between nodes.
//!
//! # Layout
//! - [`types`]: [`TypeConfig`] and aliases of openraft's generic types.
//! - [`db`]: the one RocksDB per node and its column families.
//! - [`dedup_retention`]: dedup records keyed by retention, their index in memory, and their
//!   removal once expired.
//! - [`log_store`]: the log (fsynced before openraft is told it is on disk) and the vote;
//!   [`log_files`]: the log's segment files.
//! - [`state_store`]: apply (one write batch per call), snapshot build and install.
//! - [`snapshot`]: the snapshot byte format, streamed to and from files, and the directory that
//!   keeps the latest snapshot.
//! - [`election`]: when a node stands for election (a pre-vote first).
//! - [`network`]: the client side of the Raft RPCs; [`append_stream`]: a leader's appends to a
//!   peer over one upgraded HTTP connection; [`wire`]: their encoding.
//! - [`identity`]: the cluster's name and each member's storage incarnation, checked on every
//!   Raft message.
//! - [`clocks`]: peers' wall clocks as their RPCs show them, and whether this node's agrees.
//! - [`metrics`]: fsync, apply and snapshot metrics.
//! - [`damage`]: damage found while the node runs, which it stops on.
//! - [`snapshot_receiver`]: snapshots received from the leader, checked whole before openraft
//!   installs them.
//! - [`wal_check`]: damage in RocksDB's WAL that its recovery would take for a torn write.

// openraft's traits return its own `StorageError`, which is large; boxing it would only add
// conversions at every trait boundary.
#![allow(clippy::result_large_err)]

pub mod append_stream;
mod background;
pub mod clocks;
pub mod damage;
pub mod db;
pub mod dedup_retention;
pub mod election;
pub mod file_removal;
pub mod identity;
pub mod log_files;
pub mod log_store;
pub mod metrics;
pub mod network;
pub mod peer_health;
pub mod snapshot;
pub mod snapshot_receiver;
pub mod state_store;
pub mod types;
pub mod wal_check;
pub mod wire;

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use rocksdb::DB;
use statestore_protocol::Request;
use statestore_statemachine::{
    Config, DueKey, KeyPrefixes, Operation, OutboxEntry, Reply, RequestIdentity, StateMachine, StorageError,
};
use tokio::sync::broadcast;

pub use clocks::PeerClocks;
pub use damage::{DamageReport, Damaged};
pub use election::{Elector, Handover, Restraint};
pub use identity::PeerIdentity;
pub use log_store::{FsyncWatch, LogReader, LogStore};
pub use metrics::{DiskSpace, StorageMetrics};
pub use network::NetworkFactory;
pub use snapshot_receiver::SnapshotReceiver;
pub use state_store::StateStore;
pub use types::{ApplyResult, Node, NodeId, Raft, SharedProposal, TypeConfig};

/// Why a node's storage could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("opening RocksDB at {path}: {source}")]
    Db { path: String, source: rocksdb::Error },
    #[error("preparing {path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("reading the applied state in {path}: {detail}")]
    State { path: String, detail: String },
    #[error("snapshots in {path}: {detail}")]
    Snapshot { path: String, detail: String, damaged: bool },
    #[error("opening the Raft log: {0}")]
    Log(#[from] log_files::LogFileError),
    #[error("checking RocksDB's WAL: {0}")]
    Wal(#[from] wal_check::WalDamage),
    /// A vote is written, synced, before any log entry of its term: a log with entries of a
    /// later term than the vote kept means the vote's latest writes were lost (a WAL file lost
    /// or cut short), and a node that forgot its vote could vote twice in one term.
    #[error(
        "the Raft log in {path} holds entries of term {log_term}, but the vote kept in RocksDB is of term \
         {vote_term}: a vote is written before any entry of its term, so synced writes of RocksDB's WAL \
         are lost"
    )]
    LostVote { path: String, vote_term: u64, log_term: u64 },
    /// Entries this node wrote to its log are gone (a directory or segment files deleted, a
    /// volume not mounted): it may have been counted in the quorum that committed them.
    #[error(
        "the Raft log in {path} lost entries: {detail}; a node that forgot entries it acknowledged could \
         let an elected leader drop acknowledged writes"
    )]
    LostLog { path: String, detail: String },
}

impl OpenError {
    /// Whether the storage is damaged (a checksum or a record that does not match), as opposed
    /// to unreadable (permissions, a missing disk, another process holding the lock).
    pub fn is_corruption(&self) -> bool {
        match self {
            OpenError::Db { source, .. } => source.kind() == rocksdb::ErrorKind::Corruption,
            OpenError::Snapshot { damaged, .. } => *damaged,
            OpenError::State { detail, .. } => detail.contains("checksum"),
            OpenError::Log(error) => matches!(error, log_files::LogFileError::Damaged { .. }),
            OpenError::Wal(_) | OpenError::LostVote { .. } | OpenError::LostLog { .. } => true,
            OpenError::Io { .. } => false,
        }
    }

    /// Whether the disk under the storage failed or is full (an I/O error, no space, a
    /// read-only file system), as opposed to damaged storage or a setting or permission the
    /// operator must change.
    pub fn is_disk_failure(&self) -> bool {
        match self {
            OpenError::Db { source, .. } => describes_disk_failure(source.as_ref()),
            OpenError::Io { source, .. } | OpenError::Log(log_files::LogFileError::Io { source, .. }) => {
                is_disk_failure(source)
            }
            OpenError::State { detail, .. } | OpenError::Snapshot { detail, .. } => describes_disk_failure(detail),
            OpenError::Log(_) | OpenError::Wal(_) | OpenError::LostVote { .. } | OpenError::LostLog { .. } => false,
        }
    }
}

/// The operating system's errors that say a disk failed or is full, and their texts (as the C
/// library words them, in RocksDB's errors and Rust's alike).
const DISK_FAILURES: [(i32, &str); 4] = [
    (libc::EIO, "Input/output error"),
    (libc::ENOSPC, "No space left on device"),
    (libc::EROFS, "Read-only file system"),
    (libc::EDQUOT, "Disk quota exceeded"),
];

/// Whether `error` says the disk failed or is full.
pub fn is_disk_failure(error: &io::Error) -> bool {
    error.raw_os_error().is_some_and(|code| DISK_FAILURES.iter().any(|(failure, _)| *failure == code))
}

/// Whether an error's text (RocksDB's, or one carried as text) says the disk failed or is full.
pub fn describes_disk_failure(text: &str) -> bool {
    DISK_FAILURES.iter().any(|(_, words)| text.contains(words))
}

/// Whether an error's text says the disk is full.
pub fn describes_full_disk(text: &str) -> bool {
    DISK_FAILURES.iter().any(|(code, words)| (*code == libc::ENOSPC || *code == libc::EDQUOT) && text.contains(words))
}

/// Log bytes appended since this node started, and their count when the latest snapshot here
/// was built or installed: a node whose log grows by bytes faster than by entries (large
/// values) snapshots, and so purges, by bytes too.
#[derive(Debug, Default)]
pub struct LogBytes {
    appended: AtomicU64,
    at_snapshot: AtomicU64,
    /// Bytes of the latest snapshot's data file.
    snapshot_size: AtomicU64,
}

impl LogBytes {
    pub(crate) fn add(&self, bytes: u64) {
        self.appended.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Marks a snapshot taken now: what was appended before is in it.
    pub fn snapshot_taken(&self) {
        self.at_snapshot.store(self.appended.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// Bytes appended to the log since the latest snapshot (or since this node started).
    pub fn since_snapshot(&self) -> u64 {
        self.appended.load(Ordering::Relaxed).saturating_sub(self.at_snapshot.load(Ordering::Relaxed))
    }

    pub(crate) fn set_snapshot_size(&self, bytes: u64) {
        self.snapshot_size.store(bytes, Ordering::Relaxed);
    }

    /// Bytes of the latest snapshot built or installed here (0 before the first).
    pub fn snapshot_size(&self) -> u64 {
        self.snapshot_size.load(Ordering::Relaxed)
    }
}

/// A node's storage: the two halves openraft owns, and a reader for the node itself.
pub struct NodeStorage {
    pub log: LogStore,
    pub state: StateStore,
    pub reader: StateReader,
    /// The random id this data directory got when it was created ([`identity::incarnation`]).
    pub incarnation: String,
    /// Opened as a restored backup ([`NodeStorage::restored`], or a restore begun here before
    /// the cluster was named anew, [`identity::pending_restore`]): every cluster name the backup
    /// holds ([`NodeStorage::backup_names`]). They all name the old cluster
    /// ([`identity::PeerIdentity::restored`]).
    pub restoring: Option<Vec<String>>,
}

impl NodeStorage {
    /// Every cluster name this directory holds: the applied one and any that an entry of its log
    /// not yet applied gives (a copy taken before the node applied the entry that named the
    /// cluster, or of a node that crashed).
    pub fn backup_names(&self) -> Result<Vec<String>, OpenError> {
        let state_error =
            |detail: String| OpenError::State { path: self.reader.db.path().display().to_string(), detail };
        let applied = state_store::applied_index(&self.reader.db).map_err(|e| state_error(e.to_string()))?;
        let mut names: Vec<String> =
            self.reader.cluster_id().map_err(|e| state_error(e.to_string()))?.into_iter().collect();
        names.extend(self.log.reader().cluster_names_after(applied).map_err(|e| state_error(e.to_string()))?);
        Ok(names)
    }

    /// Makes this directory, a copy of another node's (a restored backup), new storage: a new
    /// incarnation, and a record (synced) that it waits for the restored cluster's new name,
    /// which a restart before then keeps to ([`identity::begin_restore`]). `names`: what
    /// [`NodeStorage::backup_names`] read.
    pub fn restored(mut self, names: Vec<String>) -> Result<NodeStorage, OpenError> {
        let db = &self.reader.db;
        self.incarnation = identity::incarnation(db, true)
            .map_err(|source| OpenError::Db { path: db.path().display().to_string(), source })?;
        identity::begin_restore(db, &names)
            .map_err(|detail| OpenError::State { path: db.path().display().to_string(), detail })?;
        self.restoring = Some(names);
        Ok(self)
    }
}

/// Opens the storage in `data_dir` (RocksDB in `db/`, the Raft log in `log/`, the latest
/// snapshot in `snapshots/`). A restored backup is then made new storage with
/// [`NodeStorage::restored`].
pub fn open(data_dir: &Path, config: Config, metrics: StorageMetrics) -> Result<NodeStorage, OpenError> {
    let io_error = |path: &Path| {
        let path = path.display().to_string();
        move |source| OpenError::Io { path, source }
    };
    std::fs::create_dir_all(data_dir).map_err(io_error(data_dir))?;
    let db_path = data_dir.join("db");
    let shared = state_store::SharedState::default();
    if let Some(damage) = wal_check::hidden_damage(&db_path).map_err(io_error(&db_path))? {
        return Err(damage.into());
    }
    let db = db::open(&db_path, &shared.dedup_horizon)
        .map_err(|source| OpenError::Db { path: db_path.display().to_string(), source })?;
    let snapshot_path = data_dir.join("snapshots");
    let snapshot_error = |detail: String| OpenError::Snapshot {
        path: snapshot_path.display().to_string(),
        damaged: snapshot::describes_damage(&detail),
        detail,
    };
    let snapshots = snapshot::SnapshotDir::new(&snapshot_path).map_err(|e| snapshot_error(e.to_string()))?;
    state_store::resume_install(&db, &snapshots).map_err(|e| snapshot_error(e.to_string()))?;
    let state_error = |detail: String| OpenError::State { path: db_path.display().to_string(), detail };
    // What a database holds when it opens is on disk (the WAL it recovered from included).
    let applied = state_store::applied_index(&db).map_err(|e| state_error(e.to_string()))?;
    let clock =
        statestore_statemachine::meta::clock(&db::Tables { db: &db }).map_err(|e| state_error(e.to_string()))?;
    shared.applied_on_disk.reached(applied, clock, 0);
    shared
        .dedup_index
        .load(&db, shared.dedup_horizon.now())
        .map_err(|source| OpenError::Db { path: db_path.display().to_string(), source })?;
    let committed = Arc::new(AtomicU64::new(0));
    if let Ok(Some((_, data))) = snapshots.current() {
        shared.log_bytes.set_snapshot_size(std::fs::metadata(data).map_or(0, |m| m.len()));
    }
    let db_error = |source| OpenError::Db { path: db_path.display().to_string(), source };
    let incarnation = identity::incarnation(&db, false).map_err(db_error)?;
    let (applied_requests, _) = broadcast::channel(APPLIED_FEED_CAPACITY);
    let machine = StateMachine::new(config);
    let log = LogStore::new(
        db.clone(),
        &data_dir.join("log"),
        metrics.clone(),
        committed.clone(),
        shared.log_bytes.clone(),
        shared.applied_on_disk.clone(),
        shared.fsync.clone(),
    )?;
    let committed_before = log.reader().committed_index().map_err(|e| state_error(e.to_string()))?;
    if committed_before > applied {
        // openraft applies them as it starts, before this node serves anything.
        tracing::info!(
            on_disk = applied,
            committed = committed_before,
            "the state-machine tables on disk are behind the log (the node stopped without writing them); \
             applying {} entries again",
            committed_before - applied
        );
    }
    let reader = StateReader {
        db: db.clone(),
        machine: machine.clone(),
        committed,
        applied_requests: applied_requests.clone(),
        log_bytes: shared.log_bytes.clone(),
        installing: shared.installing.clone(),
        damage: shared.damage.clone(),
        identity: shared.identity.clone(),
        applied_on_disk: shared.applied_on_disk.clone(),
        dedup_horizon: shared.dedup_horizon.clone(),
        dedup_index: shared.dedup_index.clone(),
        fsync: shared.fsync.clone(),
    };
    let applied_name = reader.cluster_id().map_err(|e| state_error(e.to_string()))?;
    let restoring = identity::pending_restore(&db, applied_name.as_deref()).map_err(state_error)?;
    let state = StateStore::new(db, machine, snapshots, metrics, applied_requests, shared);
    Ok(NodeStorage { log, state, reader, incarnation, restoring })
}

/// Reads the node's applied state without going through Raft. Whether a read is linearizable is
/// up to the caller (see `ensure_linearizable`).
#[derive(Clone)]
pub struct StateReader {
    db: Arc<DB>,
    machine: StateMachine,
    committed: Arc<AtomicU64>,
    applied_requests: broadcast::Sender<AppliedRequests>,
    log_bytes: Arc<LogBytes>,
    installing: Arc<AtomicBool>,
    damage: Arc<DamageReport>,
    identity: Arc<identity::IdentityMemo>,
    applied_on_disk: Arc<db::AppliedOnDisk>,
    dedup_horizon: Arc<dedup_retention::DedupHorizon>,
    dedup_index: Arc<dedup_retention::DedupIndex>,
    fsync: Arc<FsyncWatch>,
}

/// The proposals one apply call applied that held client requests, in log order: shared with the
/// log entries, so the feed copies nothing.
#[derive(Clone, Debug)]
pub struct AppliedRequests(Arc<[SharedProposal]>);

impl AppliedRequests {
    fn new(proposals: Vec<SharedProposal>) -> AppliedRequests {
        AppliedRequests(proposals.into())
    }

    /// The identities of the client requests applied, in log order.
    pub fn identities(&self) -> impl Iterator<Item = &RequestIdentity> {
        self.0.iter().flat_map(|proposal| proposal.entries.iter()).filter_map(|entry| match &entry.operation {
            Operation::Request(request) => request.identity.as_ref(),
            _ => None,
        })
    }
}

/// Apply calls the applied-requests feed keeps for a subscriber that falls behind; beyond it the
/// subscriber is told it lagged and must look requests up in the dedup table instead. Each holds
/// its proposals (values included) until every subscriber has read it; the front end reads the
/// feed every 20 ms, so in practice it holds what was applied since.
pub const APPLIED_FEED_CAPACITY: usize = 4096;

impl StateReader {
    /// Follows the requests this node applies from now on: how a follower learns which of the
    /// requests it holds are done, without polling the dedup table for each.
    pub fn applied_requests(&self) -> broadcast::Receiver<AppliedRequests> {
        self.applied_requests.subscribe()
    }

    /// Answers a GET or SCAN from the applied state; `None` for commands that write.
    pub fn read(&self, request: &Request, wall_clock_ms: u64) -> Result<Option<Reply>, StorageError> {
        self.read_within(request, wall_clock_ms, None)
    }

    /// [`StateReader::read`] for a client confined to `within`: a SCAN examines only its keys.
    pub fn read_within(
        &self,
        request: &Request,
        wall_clock_ms: u64,
        within: Option<&KeyPrefixes>,
    ) -> Result<Option<Reply>, StorageError> {
        self.checked(self.machine.read_within(&db::Tables { db: &self.db }, request, wall_clock_ms, within))
    }

    /// The dedup records the applied state accounts (bytes and count), which its budget bounds.
    pub fn dedup_usage(&self) -> Result<statestore_statemachine::dedup::DedupUsage, StorageError> {
        self.checked(statestore_statemachine::dedup::usage(&db::Tables { db: &self.db }))
    }

    /// Keys whose deadline has passed at `now`, oldest first.
    pub fn due_keys(&self, now: u64, limit: usize) -> Result<Vec<DueKey>, StorageError> {
        self.checked(statestore_statemachine::keyspace::due_keys(&db::Tables { db: &self.db }, now, limit))
    }

    /// The stored reply of a request applied before, if it is still retained at the applied
    /// clock.
    pub fn dedup_lookup(&self, identity: &RequestIdentity) -> Result<Option<Reply>, StorageError> {
        let tables = db::WithDedup::new(&self.db, &self.dedup_index);
        let now = self.checked(statestore_statemachine::meta::clock(&tables))?;
        self.checked(statestore_statemachine::dedup::lookup(&tables, identity, now))
    }

    /// Up to `limit` notifications not yet confirmed as published, with `seq > after`, in order.
    pub fn pending_notifications(&self, after: Option<u64>, limit: usize) -> Result<Vec<OutboxEntry>, StorageError> {
        self.checked(statestore_statemachine::watch::pending_notifications(&db::Tables { db: &self.db }, after, limit))
    }

    /// Whether a snapshot install is replacing the tables right now: reads of the local state
    /// meanwhile may see a partly installed keyspace.
    pub fn installing_snapshot(&self) -> bool {
        self.installing.load(Ordering::Acquire)
    }

    /// Where damage found while the node runs is reported.
    pub fn damage(&self) -> &DamageReport {
        &self.damage
    }

    /// `result`, after reporting it as damage if it says the storage is damaged (a block or a
    /// record that does not read back): the node stops on it rather than serve on.
    fn checked<T>(&self, result: Result<T, StorageError>) -> Result<T, StorageError> {
        if let Err(e) = &result {
            if damage::is_damage(e) {
                self.damage.report(Damaged(format!("a read of the state found damage: {e}")));
            }
        }
        result
    }

    /// How much the log grew since the latest snapshot here.
    pub fn log_bytes(&self) -> &LogBytes {
        &self.log_bytes
    }

    /// The Raft log's fsync under way, if one is.
    pub fn log_fsync(&self) -> &FsyncWatch {
        &self.fsync
    }

    /// The cluster's name and every enrollment, as applied here; read from the tables only
    /// after an apply or an install changed them ([`identity::IdentityMemo`]).
    pub fn identity_records(&self) -> Result<Arc<identity::IdentityRecords>, StorageError> {
        let tables = db::Tables { db: &self.db };
        self.checked(self.identity.get(|| {
            Ok(identity::IdentityRecords {
                cluster_id: statestore_statemachine::meta::cluster_id(&tables)?,
                enrollments: statestore_statemachine::meta::enrollments(&tables)?,
            })
        }))
    }

    /// The cluster's name, once applied here.
    pub fn cluster_id(&self) -> Result<Option<String>, StorageError> {
        Ok(self.identity_records()?.cluster_id.clone())
    }

    /// Every member of the cluster as applied here, with its advertised address.
    pub fn applied_members(&self) -> Result<BTreeMap<NodeId, String>, StorageError> {
        let membership = state_store::applied_membership(&self.db).map_err(|e| StorageError::Backend(e.to_string()))?;
        Ok(membership.membership().nodes().map(|(id, node)| (*id, node.addr.clone())).collect())
    }

    /// The storage incarnation enrolled for member `node`.
    pub fn enrolled(&self, node: NodeId) -> Result<Option<String>, StorageError> {
        Ok(self.identity_records()?.enrollments.get(&node).cloned())
    }

    /// Every enrolled member's storage incarnation.
    pub fn enrollments(&self) -> Result<BTreeMap<NodeId, String>, StorageError> {
        Ok(self.identity_records()?.enrollments.clone())
    }

    /// The last committed log index this node knows of (0 before the first).
    pub fn committed_index(&self) -> u64 {
        self.committed.load(Ordering::Acquire)
    }

    /// Writes what is applied to disk (the state machine's writes skip the WAL, see [`db`]), so
    /// that a node stopped cleanly does not apply the log again when it starts, then removes the
    /// dedup table's files that hold only records expired at the clock now on disk; returns the
    /// log index written up to. Blocking: run it off the async threads.
    pub fn flush_applied(&self) -> Result<u64, types::RaftStorageError> {
        let on_disk = state_store::flush_applied(&self.db, &self.applied_on_disk)?;
        dedup_retention::drop_expired_files(&self.db, self.dedup_horizon.now())
            .map_err(|e| openraft::StorageIOError::write_state_machine(openraft::AnyError::error(e.into_string())))?;
        Ok(on_disk)
    }

    /// The log entries and operations (requests, housekeeping, entries without either) applied
    /// and not yet on disk: what this node would apply again from its log if it were killed now.
    pub fn unflushed(&self) -> db::Unflushed {
        self.applied_on_disk.unflushed()
    }

    /// Writes every key of one consistent view of the applied state to `out` as a backup
    /// (`statestore_protocol::backup`). Blocking: run it off the async threads.
    pub fn export_keys(
        &self,
        out: impl std::io::Write,
    ) -> Result<statestore_protocol::backup::BackupEnd, types::RaftStorageError> {
        state_store::export_keys(&self.db, out)
    }
}
