//! The Raft log: entries in the log's own files ([`crate::log_files`]), the vote and the purge
//! mark in RocksDB.
//!
//! An append writes its entries to the current segment file and returns at once, so they are
//! readable; a dedicated thread then fsyncs the files written to and only then tells openraft
//! the entries are on disk. Appends that arrive while an fsync runs share the next one (group
//! commit). Votes are written with a synced write before `save_vote` returns; a purge writes its
//! mark with a synced write before it deletes segment files.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{AnyError, EntryPayload, LogState, OptionalSend, RaftLogReader, StorageIOError};
use rocksdb::{IteratorMode, DB};
use serde::de::DeserializeOwned;
use serde::Serialize;
use statestore_statemachine::Operation;

use crate::db::{cf, synced, AppliedOnDisk, LEGACY_LOG_CF, RAFT_META_CF};
use crate::log_files::{LogFileError, LogFiles, SegmentFile};
use crate::metrics::StorageMetrics;
use crate::state_store::flush_applied;
use crate::types::{LogEntry, LogId, RaftStorageError, TypeConfig, Vote};
use crate::wire::{decode, encode};
use crate::LogBytes;

const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const LAST_PURGED: &[u8] = b"last_purged";
/// Present once the log is kept in its own directory: a node whose directory is missing after
/// that lost it.
const LOG_IN_FILES: &[u8] = b"log_in_files";
/// Written (synced) when the node stops cleanly, deleted when it opens again: the entries the
/// log held then ([`StoppedLog`]). Entries lost while the node was stopped are found by it even
/// when the tables hold every entry the node knew committed.
const STOPPED_LOG: &[u8] = b"stopped_log";

/// The entries the log's files held when the node last stopped cleanly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
struct StoppedLog {
    first: u64,
    last: u64,
}

fn index_of(key: &[u8]) -> Result<u64, RaftStorageError> {
    let bytes: [u8; 8] =
        key.try_into().map_err(|_| StorageIOError::read_logs(AnyError::error("log key is not 8 bytes")))?;
    Ok(u64::from_be_bytes(bytes))
}

fn read_error(error: LogFileError) -> RaftStorageError {
    StorageIOError::read_logs(AnyError::error(error.to_string())).into()
}

fn write_error(error: LogFileError) -> RaftStorageError {
    StorageIOError::write_logs(AnyError::error(error.to_string())).into()
}

/// Most entries [`RecentEntries`] keeps.
pub const RECENT_ENTRIES: usize = 1024;
/// Most encoded bytes of the entries [`RecentEntries`] keeps.
pub const RECENT_BYTES: usize = 16 << 20;

/// The newest log entries, decoded, in index order without gaps, ending at the last entry
/// appended. openraft reads an entry back right after appending it, on a leader once per
/// follower to replicate it and once to apply it, on a follower once to apply it; served from
/// here those reads cost a reference count (the proposal is shared, [`crate::SharedProposal`])
/// instead of a file read and a decode. The log's files stay the source of truth: a read this
/// does not cover in full goes there.
#[derive(Default)]
struct RecentEntries {
    /// Each entry with its encoded size.
    entries: VecDeque<(LogEntry, usize)>,
    bytes: usize,
}

impl RecentEntries {
    fn first_index(&self) -> Option<u64> {
        self.entries.front().map(|(entry, _)| entry.log_id.index)
    }

    fn last_index(&self) -> Option<u64> {
        self.entries.back().map(|(entry, _)| entry.log_id.index)
    }

    /// Keeps `entry`, just written to the log; a gap before it starts over.
    fn push(&mut self, entry: LogEntry, size: usize) {
        if self.last_index().is_some_and(|last| last.checked_add(1) != Some(entry.log_id.index)) {
            self.entries.clear();
            self.bytes = 0;
        }
        self.bytes += size;
        self.entries.push_back((entry, size));
        while self.entries.len() > RECENT_ENTRIES || (self.bytes > RECENT_BYTES && self.entries.len() > 1) {
            if let Some((_, size)) = self.entries.pop_front() {
                self.bytes -= size;
            }
        }
    }

    /// Forgets the entries from `index` on (the log is truncated there).
    fn truncate(&mut self, index: u64) {
        while self.last_index().is_some_and(|last| last >= index) {
            if let Some((_, size)) = self.entries.pop_back() {
                self.bytes -= size;
            }
        }
    }

    /// Forgets the entries up to and including `index` (the log is purged up to there).
    fn purge(&mut self, index: u64) {
        while self.first_index().is_some_and(|first| first <= index) {
            if let Some((_, size)) = self.entries.pop_front() {
                self.bytes -= size;
            }
        }
    }

    /// Copies of the entries `start..end`, if every one of them is here.
    fn get(&self, start: u64, end: u64) -> Option<Vec<LogEntry>> {
        let first = self.first_index()?;
        let last = self.last_index()?;
        if start < first || end > last.checked_add(1)? {
            return None;
        }
        if start >= end {
            return Some(Vec::new());
        }
        let skip = usize::try_from(start - first).ok()?;
        let take = usize::try_from(end - start).ok()?;
        Some(self.entries.iter().skip(skip).take(take).map(|(entry, _)| entry.clone()).collect())
    }
}

/// Reads log entries; shared by the replication tasks.
#[derive(Clone)]
pub struct LogReader {
    db: Arc<DB>,
    files: Arc<RwLock<LogFiles>>,
    recent: Arc<Mutex<RecentEntries>>,
}

fn read_meta<T: DeserializeOwned>(db: &DB, key: &[u8]) -> Result<Option<T>, RaftStorageError> {
    let read = |e: &dyn std::error::Error| StorageIOError::read(AnyError::error(e.to_string()));
    match db.get_cf(cf(db, RAFT_META_CF), key).map_err(|e| read(&e))? {
        Some(bytes) => Ok(Some(decode(&bytes).map_err(|e| read(&e))?)),
        None => Ok(None),
    }
}

impl LogReader {
    fn meta<T: DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>, RaftStorageError> {
        read_meta(&self.db, key)
    }

    /// The committed log index recorded last (0 before any; recorded without a sync, so a crash
    /// may leave an earlier one).
    pub(crate) fn committed_index(&self) -> Result<u64, RaftStorageError> {
        committed_in(&self.db)
    }

    /// The id of the last entry in the log, or of the last one purged when the log is empty.
    pub fn last_log_id(&self) -> Result<Option<LogId>, RaftStorageError> {
        let last_purged: Option<LogId> = self.meta(LAST_PURGED)?;
        Ok(self.last_entry_id()?.or(last_purged))
    }

    /// Every cluster name that an entry of this log after `index` gives (`NameCluster`,
    /// `RenameCluster`), in log order.
    pub(crate) fn cluster_names_after(&self, index: u64) -> Result<Vec<String>, RaftStorageError> {
        let mut names = Vec::new();
        for entry in self.read_files(index.saturating_add(1), u64::MAX)? {
            if let EntryPayload::Normal(proposal) = &entry.payload {
                names.extend(proposal.entries.iter().filter_map(|entry| match &entry.operation {
                    Operation::NameCluster { id, .. } | Operation::RenameCluster { id, .. } => Some(id.clone()),
                    _ => None,
                }));
            }
        }
        Ok(names)
    }

    /// Records (synced) the entries the log's files hold, for the next open to check that none
    /// was lost meanwhile. Only for a node that stopped cleanly: Raft stopped, so the log no longer
    /// changes, and every entry it holds was flushed.
    pub fn record_stop(&self) -> Result<(), RaftStorageError> {
        let files = self.files.read().unwrap();
        let (Some(first), Some(last)) = (files.first_index(), files.last_index()) else { return Ok(()) };
        let bytes = encode(&StoppedLog { first, last }).map_err(|e| StorageIOError::write(&e))?;
        self.db
            .put_cf_opt(cf(&self.db, RAFT_META_CF), STOPPED_LOG, bytes, &synced())
            .map_err(|e| StorageIOError::write(&e))?;
        Ok(())
    }

    fn last_entry_id(&self) -> Result<Option<LogId>, RaftStorageError> {
        // Held throughout, so that no truncation comes between finding the last index and reading it.
        let files = self.files.read().unwrap();
        let Some(last) = files.last_index() else { return Ok(None) };
        if let Some(mut entries) = self.recent.lock().unwrap().get(last, last.saturating_add(1)) {
            return Ok(entries.pop().map(|entry| entry.log_id));
        }
        let bytes = files.read(last).map_err(read_error)?;
        let entry: Option<LogEntry> =
            bytes.map(|bytes| decode(&bytes)).transpose().map_err(|e| StorageIOError::read_log_at_index(last, &e))?;
        Ok(entry.map(|entry| entry.log_id))
    }

    /// The entries `start..end` the files hold, decoded.
    fn read_files(&self, start: u64, end: u64) -> Result<Vec<LogEntry>, RaftStorageError> {
        let files = self.files.read().unwrap();
        let (Some(first), Some(last)) = (files.first_index(), files.last_index()) else { return Ok(Vec::new()) };
        let mut entries = Vec::new();
        for index in start.max(first)..end.min(last.saturating_add(1)) {
            let Some(bytes) = files.read(index).map_err(read_error)? else { break };
            entries.push(decode(&bytes).map_err(|e| StorageIOError::read_log_at_index(index, &e))?);
        }
        Ok(entries)
    }
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<LogEntry>, RaftStorageError> {
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&i) => i.checked_add(1),
            Bound::Excluded(&i) => Some(i),
            Bound::Unbounded => None,
        };
        if let Some(entries) = end.and_then(|end| self.recent.lock().unwrap().get(start, end)) {
            return Ok(entries);
        }
        self.read_files(start, end.unwrap_or(u64::MAX))
    }
}

/// Entries appended and the files they were written to, waiting for the fsync thread.
struct PendingFlush {
    callback: LogFlushed<TypeConfig>,
    files: Vec<Arc<SegmentFile>>,
    /// The last entry appended, and the [`Flushed::truncations`] it was appended after.
    last: Option<LogId>,
    truncations: u64,
}

/// The last entry of the log known to be on disk (flushed), which a committed index saved is
/// never past ([`LogStore::save_committed`]).
#[derive(Debug, Default)]
struct Flushed {
    last: Option<LogId>,
    /// Truncations so far: a flush of entries appended before the last one does not raise
    /// `last` (the entries it names may be gone, replaced by others not flushed yet).
    truncations: u64,
}

/// The Raft log store. Owned by openraft.
pub struct LogStore {
    reader: LogReader,
    /// `None` only while dropping.
    flushes: Option<mpsc::Sender<PendingFlush>>,
    /// Joined on drop, so the thread's handle on the database is gone when the store is: a
    /// database closing on a detached thread can race the process's exit.
    flusher: Option<std::thread::JoinHandle<()>>,
    committed: Arc<AtomicU64>,
    log_bytes: Arc<LogBytes>,
    applied_on_disk: Arc<AppliedOnDisk>,
    flushed: Arc<Mutex<Flushed>>,
}

impl Drop for LogStore {
    fn drop(&mut self) {
        // Closing the channel ends the thread once it has reported what it holds.
        self.flushes.take();
        if let Some(flusher) = self.flusher.take() {
            let _ = flusher.join();
        }
    }
}

impl LogStore {
    /// A log store with its entries in `dir` and its vote and purge mark in `db`. `committed`
    /// follows the committed log index (0 before any); the log is purged no further than
    /// `applied_on_disk`; `fsync` follows the fsync under way. A log that an earlier version kept
    /// in `db` moves to `dir` first.
    pub(crate) fn new(
        db: Arc<DB>,
        dir: &Path,
        metrics: StorageMetrics,
        committed: Arc<AtomicU64>,
        log_bytes: Arc<LogBytes>,
        applied_on_disk: Arc<AppliedOnDisk>,
        fsync: Arc<FsyncWatch>,
    ) -> Result<LogStore, crate::OpenError> {
        let state_error = state_error(dir);
        let kept_in_files = read_meta::<bool>(&db, LOG_IN_FILES).map_err(&state_error)?.is_some();
        if kept_in_files && !dir.exists() {
            return Err(crate::OpenError::LostLog {
                path: dir.display().to_string(),
                detail: "the directory is missing".into(),
            });
        }
        // A node commits only entries it has flushed: a record torn below the committed index
        // with a committed entry whole after it is damage, a torn tail is cut (the committed
        // index then lowered to what the log holds), and the log must hold the committed entries
        // its tables do not.
        let mut committed_index = committed_in(&db).map_err(&state_error)?;
        let (mut files, cut_at) = open_files(&db, dir, committed_index)?;
        let last_purged: Option<LogId> = read_meta(&db, LAST_PURGED).map_err(&state_error)?;
        let held_up_to = files.last_index().max(last_purged.map(|id| id.index)).unwrap_or(0);
        // Committed entries missing at the log's end (and from the tables on disk), with a torn
        // tail cut off or room for them in the last segment, were an append a power cut lost;
        // missing after a full segment, a segment file was lost, and `check_holds_unapplied`
        // refuses the log.
        let missing = committed_index > held_up_to.max(applied_on_disk.get());
        if missing && (cut_at.is_some() || files.ends_with_room()) {
            committed_index = lower_committed(&db, &files, dir, committed_index)?;
        }
        if !kept_in_files {
            db.put_cf_opt(cf(&db, RAFT_META_CF), LOG_IN_FILES, encode(&true).expect("a bool encodes"), &synced())
                .map_err(|source| crate::OpenError::Db { path: dir.display().to_string(), source })?;
        }
        if let Some(purged) = last_purged {
            // Also deletes segments a purge that a crash interrupted left behind.
            files.purge(purged.index).map_err(crate::OpenError::Log)?;
        }
        check_holds_unapplied(&files, applied_on_disk.get(), committed_index, dir)?;
        check_holds_stopped(&db, &files, dir)?;
        let reader = LogReader { db, files: Arc::new(RwLock::new(files)), recent: Arc::default() };
        check_vote_covers_log(&reader, dir)?;
        // Opening synced every segment it kept: the whole log is on disk.
        let flushed = Flushed { last: reader.last_log_id().map_err(&state_error)?, truncations: 0 };
        let flushed = Arc::new(Mutex::new(flushed));
        let (flushes, pending) = mpsc::channel();
        let reported = flushed.clone();
        let flusher = std::thread::Builder::new()
            .name("raft-log-fsync".into())
            .spawn(move || flush_loop(&pending, &metrics, &fsync, &reported))
            .map_err(|source| crate::OpenError::Io { path: dir.display().to_string(), source })?;
        Ok(LogStore {
            reader,
            flushes: Some(flushes),
            flusher: Some(flusher),
            committed,
            log_bytes,
            applied_on_disk,
            flushed,
        })
    }

    /// A reader of this log, for the node (the elector reads the last log id).
    pub fn reader(&self) -> LogReader {
        self.reader.clone()
    }

    fn db(&self) -> &DB {
        &self.reader.db
    }

    fn put_meta<T: Serialize>(&self, key: &[u8], value: &T, sync: bool) -> Result<(), RaftStorageError> {
        let bytes = encode(value).map_err(|e| StorageIOError::write(&e))?;
        let options = if sync { synced() } else { rocksdb::WriteOptions::default() };
        self.db()
            .put_cf_opt(cf(self.db(), RAFT_META_CF), key, bytes, &options)
            .map_err(|e| StorageIOError::write(&e))?;
        Ok(())
    }
}

/// Refuses a vote of an earlier term than the log's last entry (or the snapshot the log was
/// purged to): openraft saves a vote (synced) before it appends any entry of the vote's term, so
/// such a vote is one whose latest writes were lost.
fn check_vote_covers_log(reader: &LogReader, dir: &Path) -> Result<(), crate::OpenError> {
    let state_error = state_error(dir);
    let Some(last) = reader.last_log_id().map_err(&state_error)? else { return Ok(()) };
    let vote: Option<Vote> = reader.meta(VOTE).map_err(state_error)?;
    let vote_term = vote.map_or(0, |vote| vote.leader_id.term);
    if vote_term < last.leader_id.term {
        return Err(crate::OpenError::LostVote {
            path: dir.display().to_string(),
            vote_term,
            log_term: last.leader_id.term,
        });
    }
    Ok(())
}

/// Refuses a log that does not hold every entry this node committed and had not applied to
/// the tables on disk (`applied`): those entries exist nowhere else on this node, and a node
/// counted in the quorum that committed them must not forget them. Entries up to `applied` may
/// be missing (a snapshot installed just before a crash leaves its purge undone).
fn check_holds_unapplied(files: &LogFiles, applied: u64, committed: u64, dir: &Path) -> Result<(), crate::OpenError> {
    if committed <= applied {
        return Ok(());
    }
    let Some(held) = lacks(files, applied + 1, committed) else { return Ok(()) };
    Err(crate::OpenError::LostLog {
        path: dir.display().to_string(),
        detail: format!(
            "it {held}, but this node committed entries up to {committed} and its tables hold them up to {applied}"
        ),
    })
}

/// `None` when the files hold every entry from `from` to `to`; else what they hold ("holds
/// entries N to M", "holds no entry").
fn lacks(files: &LogFiles, from: u64, to: u64) -> Option<String> {
    match (files.first_index(), files.last_index()) {
        (Some(first), Some(last)) if first <= from && last >= to => None,
        (Some(first), Some(last)) => Some(format!("holds entries {first} to {last}")),
        _ => Some("holds no entry".to_string()),
    }
}

/// Refuses a log that lost entries it held when the node last stopped cleanly, then forgets that
/// record (synced): from here on the log changes (appends, truncations, purges), and a crash
/// leaves no record to check against.
fn check_holds_stopped(db: &DB, files: &LogFiles, dir: &Path) -> Result<(), crate::OpenError> {
    let state_error = state_error(dir);
    let Some(stopped) = read_meta::<StoppedLog>(db, STOPPED_LOG).map_err(&state_error)? else { return Ok(()) };
    if let Some(held) = lacks(files, stopped.first, stopped.last) {
        return Err(crate::OpenError::LostLog {
            path: dir.display().to_string(),
            detail: format!(
                "it {held}, but it held entries {} to {} when this node stopped",
                stopped.first, stopped.last
            ),
        });
    }
    db.delete_cf_opt(cf(db, RAFT_META_CF), STOPPED_LOG, &synced())
        .map_err(|source| crate::OpenError::Db { path: dir.display().to_string(), source })
}

/// The error of a read of the log's metadata in RocksDB while the log in `dir` opens.
fn state_error(dir: &Path) -> impl Fn(RaftStorageError) -> crate::OpenError + '_ {
    move |e| crate::OpenError::State { path: dir.display().to_string(), detail: e.to_string() }
}

/// The committed log index recorded last (0 before any).
fn committed_in(db: &DB) -> Result<u64, RaftStorageError> {
    let committed: Option<Option<LogId>> = read_meta(db, COMMITTED)?;
    Ok(committed.flatten().map_or(0, |id| id.index))
}

/// Opens the log's files in `dir`, moving into them the log an earlier version kept in RocksDB
/// (deleted from there once the files hold it durably), for a node that had committed the
/// entries up to `committed` ([`LogFiles::open_holding`]); with the first entry of the torn tail
/// that opening cut off, if it cut one.
fn open_files(db: &DB, dir: &Path, committed: u64) -> Result<(LogFiles, Option<u64>), crate::OpenError> {
    let legacy = db.cf_handle(LEGACY_LOG_CF);
    let legacy_entries = legacy.is_some_and(|log| db.iterator_cf(log, IteratorMode::Start).next().is_some());
    if let (Some(log), true, false) = (legacy, legacy_entries, dir.exists()) {
        let io = |path: &Path| {
            let path = path.display().to_string();
            move |source| crate::OpenError::Io { path, source }
        };
        let moving = dir.with_extension("moving");
        if moving.exists() {
            std::fs::remove_dir_all(&moving).map_err(io(&moving))?;
        }
        let (mut files, _) = LogFiles::open(&moving).map_err(crate::OpenError::Log)?;
        let mut moved = 0u64;
        for item in db.iterator_cf(log, IteratorMode::Start) {
            let (key, value) = item.map_err(|source| crate::OpenError::Db { path: LEGACY_LOG_CF.into(), source })?;
            let index = index_of(&key)
                .map_err(|e| crate::OpenError::State { path: LEGACY_LOG_CF.into(), detail: e.to_string() })?;
            files.append([(index, value.as_ref())]).map_err(crate::OpenError::Log)?;
            moved += 1;
        }
        files.sync_all().map_err(crate::OpenError::Log)?;
        drop(files);
        std::fs::rename(&moving, dir).map_err(io(dir))?;
        if let Some(parent) = dir.parent() {
            std::fs::File::open(parent).and_then(|d| d.sync_all()).map_err(io(parent))?;
        }
        tracing::info!(entries = moved, dir = %dir.display(), "moved the Raft log out of RocksDB into its own files");
    }
    if let (Some(log), true) = (legacy, legacy_entries) {
        db.delete_range_cf(log, [0u8; 8], [0xffu8; 8])
            .and_then(|()| db.delete_cf(log, [0xffu8; 8]))
            .map_err(|source| crate::OpenError::Db { path: LEGACY_LOG_CF.into(), source })?;
    }
    let (files, recovery) = LogFiles::open_holding(dir, committed).map_err(crate::OpenError::Log)?;
    if recovery.deleted_segments > 0 {
        tracing::warn!(
            segments = recovery.deleted_segments,
            "deleted Raft log segments after an unfinished write (entries never acknowledged)"
        );
    }
    Ok((files, recovery.cut_at))
}

/// Lowers the committed log id kept in `raft_meta` (synced) to the last entry the log holds
/// (or the last purged one), the log lacking committed entries after a power cut (its torn tail
/// cut off, or an append lost whole); returns its index.
///
/// The entries missing were never flushed (a crash tears only what was not; [`LogFiles::open_holding`]
/// refuses a torn record with a committed entry flushed after it), and this node tells a leader
/// it holds an entry only once it has flushed it: a follower's append returns to openraft only
/// after the fsync thread has synced it (`append_to_log` in `crates/openraft` waits for the
/// [`LogFlushed`] callback, which [`flush_loop`] calls after `fdatasync`), and openraft answers
/// the leader after that; a leader counts itself towards a quorum only for what it has flushed
/// (`crates/openraft`'s README). A node that led may answer a later leader's heartbeat naming an
/// entry of its own it has not flushed yet, but a leader commits by counting only entries of its
/// own term (`try_commit_quorum_accepted` in `crates/openraft`), which this node holds only
/// through a follower's append, flushed with everything appended before it (the fsync thread
/// reports in order). So this node was not counted in the quorum of any entry cut: each is on a
/// quorum of the other nodes, and this node receives it again from the leader.
fn lower_committed(db: &DB, files: &LogFiles, dir: &Path, committed: u64) -> Result<u64, crate::OpenError> {
    let state_error = state_error(dir);
    let last_held: Option<LogId> = match files.last_index() {
        Some(last) => {
            let bytes = files.read(last).map_err(crate::OpenError::Log)?;
            let entry: Option<LogEntry> = bytes
                .map(|bytes| decode(&bytes))
                .transpose()
                .map_err(|e| state_error(StorageIOError::read_log_at_index(last, &e).into()))?;
            entry.map(|entry| entry.log_id)
        }
        None => None,
    };
    let last_purged: Option<LogId> = read_meta(db, LAST_PURGED).map_err(&state_error)?;
    let lowered = last_held.max(last_purged);
    let bytes = encode(&lowered).map_err(|e| state_error(StorageIOError::write(&e).into()))?;
    db.put_cf_opt(cf(db, RAFT_META_CF), COMMITTED, bytes, &synced())
        .map_err(|source| crate::OpenError::Db { path: dir.display().to_string(), source })?;
    let index = lowered.map_or(0, |id| id.index);
    tracing::warn!(
        committed,
        lowered = index,
        "lowered the committed index to the last entry the Raft log holds after cutting its torn tail"
    );
    Ok(index)
}

/// How long the log's fsync under way has been running, if one is. A leader sends its entries
/// while it flushes them and commits only what it has flushed, so a disk that stops returning
/// from fsync does not cost it its leadership (its heartbeats go on) but stops every write: the
/// node hands leadership over when the fsync under way has run too long (`disk_watch` in the
/// node).
#[derive(Debug)]
pub struct FsyncWatch {
    base: Instant,
    /// Milliseconds from `base` to the start of the fsync under way, plus one; 0 when none is.
    started: AtomicU64,
}

impl Default for FsyncWatch {
    fn default() -> FsyncWatch {
        FsyncWatch { base: Instant::now(), started: AtomicU64::new(0) }
    }
}

impl FsyncWatch {
    fn begin(&self) {
        let since_base = self.base.elapsed().as_millis() as u64;
        self.started.store(since_base + 1, Ordering::Release);
    }

    fn end(&self) {
        self.started.store(0, Ordering::Release);
    }

    /// How long the fsync under way has run; `None` when none is.
    pub fn running_for(&self) -> Option<Duration> {
        match self.started.load(Ordering::Acquire) {
            0 => None,
            started => Some(self.base.elapsed().saturating_sub(Duration::from_millis(started - 1))),
        }
    }
}

/// Waits for appends, fsyncs the files they wrote to once for all that are waiting, then reports
/// them in order.
fn flush_loop(
    pending: &mpsc::Receiver<PendingFlush>,
    metrics: &StorageMetrics,
    watch: &FsyncWatch,
    flushed: &Mutex<Flushed>,
) {
    while let Ok(first) = pending.recv() {
        let mut waiting = vec![first];
        waiting.extend(pending.try_iter());
        let mut files: Vec<&Arc<SegmentFile>> = Vec::new();
        for file in waiting.iter().flat_map(|flush| &flush.files) {
            if !files.iter().any(|seen| Arc::ptr_eq(seen, file)) {
                files.push(file);
            }
        }
        let started = Instant::now();
        watch.begin();
        let result = files.iter().try_for_each(|file| file.sync()).map_err(|e| e.to_string());
        watch.end();
        metrics.wal_fsync_seconds.observe(started.elapsed().as_secs_f64());
        if result.is_ok() {
            // Recorded before openraft hears of it, so before it can commit these entries.
            let mut flushed = flushed.lock().unwrap();
            let current = flushed.truncations;
            let last = waiting.iter().filter(|flush| flush.truncations == current).filter_map(|flush| flush.last).max();
            flushed.last = flushed.last.max(last);
        }
        for flush in waiting {
            flush.callback.log_io_completed(result.clone().map_err(io::Error::other));
        }
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<LogEntry>, RaftStorageError> {
        self.reader.try_get_log_entries(range).await
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, RaftStorageError> {
        let last_purged_log_id: Option<LogId> = self.reader.meta(LAST_PURGED)?;
        let last_log_id = self.reader.last_log_id()?;
        Ok(LogState { last_purged_log_id, last_log_id })
    }

    async fn get_log_reader(&mut self) -> LogReader {
        self.reader.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), RaftStorageError> {
        self.put_meta(VOTE, vote, true)
            .map_err(|_| StorageIOError::write_vote(AnyError::error("synced write failed")))?;
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, RaftStorageError> {
        self.reader.meta(VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), RaftStorageError> {
        // Never past the last entry flushed, so that after a power cut the committed index kept
        // does not exceed what the log holds durably. openraft commits only flushed entries
        // already (a follower commits after its append has returned, and the append returns
        // only once flushed; a leader commits only what it has flushed itself, `crates/openraft`'s
        // README); this holds it whatever openraft asks.
        let flushed = self.flushed.lock().unwrap().last;
        let committed = match (committed, flushed) {
            (Some(committed), Some(flushed)) if committed.index > flushed.index => {
                tracing::warn!(%committed, %flushed, "saving the committed index no further than the log is flushed");
                Some(flushed)
            }
            (Some(committed), None) => {
                tracing::warn!(%committed, "saving no committed index: no entry of the log is flushed");
                None
            }
            (committed, _) => committed,
        };
        // Not synced: a committed index that is lost in a crash is learned again from the leader.
        self.put_meta(COMMITTED, &committed, false)?;
        self.committed.store(committed.map_or(0, |id| id.index), Ordering::Release);
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, RaftStorageError> {
        let committed: Option<Option<LogId>> = self.reader.meta(COMMITTED)?;
        let committed = committed.flatten();
        self.committed.store(committed.map_or(0, |id| id.index), Ordering::Release);
        Ok(committed)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), RaftStorageError>
    where
        I: IntoIterator<Item = LogEntry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut written = Vec::new();
        for entry in entries {
            let bytes = encode(&entry).map_err(|e| StorageIOError::write_log_entry(entry.log_id, &e))?;
            self.log_bytes.add(bytes.len() as u64);
            written.push((entry, bytes));
        }
        let last = written.last().map(|(entry, _)| entry.log_id);
        // Written (and so readable) now; on disk once the flusher's fsync returns.
        let files = self
            .reader
            .files
            .write()
            .unwrap()
            .append(written.iter().map(|(entry, bytes)| (entry.log_id.index, bytes.as_slice())))
            .map_err(write_error)?;
        let mut recent = self.reader.recent.lock().unwrap();
        for (entry, bytes) in written {
            recent.push(entry, bytes.len());
        }
        drop(recent);
        let truncations = self.flushed.lock().unwrap().truncations;
        let pending = PendingFlush { callback, files, last, truncations };
        let sent = self.flushes.as_ref().is_some_and(|flushes| flushes.send(pending).is_ok());
        if !sent {
            return Err(StorageIOError::write_logs(AnyError::error("the log fsync thread has stopped")).into());
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), RaftStorageError> {
        // The last entry flushed, if it goes, becomes the one before the truncation (flushed
        // before it); flushes under way no longer count.
        let before = match log_id.index.checked_sub(1) {
            Some(index) => self.reader.try_get_log_entries(index..=index).await?.pop().map(|entry| entry.log_id),
            None => None,
        };
        {
            let mut flushed = self.flushed.lock().unwrap();
            flushed.truncations += 1;
            if flushed.last.is_some_and(|last| last.index >= log_id.index) {
                let purged: Option<LogId> = self.reader.meta(LAST_PURGED)?;
                flushed.last = before.or(purged);
            }
        }
        // Forgotten before they are deleted, so no read is served what the log no longer holds.
        self.reader.recent.lock().unwrap().truncate(log_id.index);
        self.reader.files.write().unwrap().truncate(log_id.index).map_err(write_error)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), RaftStorageError> {
        // Entries the state-machine tables do not hold on disk yet would be needed again after a
        // crash. A purge follows a snapshot, which flushes, so this flush is for the odd case.
        if log_id.index > self.applied_on_disk.get() {
            let on_disk = flush_applied(self.db(), &self.applied_on_disk)?;
            tracing::info!(purge = log_id.index, on_disk, "flushed the applied state before purging the log");
        }
        // The mark is on disk before any file goes: the log never has a hole below it.
        self.put_meta(LAST_PURGED, &log_id, true)?;
        // What is purged is on disk in the tables: a committed index up to it may be saved.
        let mut flushed = self.flushed.lock().unwrap();
        flushed.last = flushed.last.max(Some(log_id));
        drop(flushed);
        self.reader.recent.lock().unwrap().purge(log_id.index);
        self.reader.files.write().unwrap().purge(log_id.index).map_err(write_error)
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, EntryPayload, LogId};

    use super::*;

    fn entry(term: u64, index: u64) -> LogEntry {
        LogEntry { log_id: LogId::new(CommittedLeaderId::new(term, 1), index), payload: EntryPayload::Blank }
    }

    fn ids(entries: Option<Vec<LogEntry>>) -> Option<Vec<(u64, u64)>> {
        entries.map(|entries| entries.iter().map(|e| (e.log_id.leader_id.term, e.log_id.index)).collect())
    }

    #[test]
    fn recent_entries_serve_only_ranges_they_hold_in_full() {
        let mut recent = RecentEntries::default();
        assert_eq!(ids(recent.get(1, 2)), None, "empty");
        for index in 5..=9 {
            recent.push(entry(1, index), 10);
        }
        assert_eq!(ids(recent.get(6, 8)), Some(vec![(1, 6), (1, 7)]));
        assert_eq!(ids(recent.get(5, 10)).map(|v| v.len()), Some(5));
        assert_eq!(ids(recent.get(4, 6)), None, "starts before the first held");
        assert_eq!(ids(recent.get(8, 11)), None, "ends after the last held");
        recent.truncate(8);
        assert_eq!(ids(recent.get(8, 9)), None, "truncated entries are gone");
        recent.push(entry(2, 8), 10);
        assert_eq!(ids(recent.get(7, 9)), Some(vec![(1, 7), (2, 8)]), "the entry of the new term replaces it");
        recent.purge(6);
        assert_eq!(ids(recent.get(6, 7)), None, "purged entries are gone");
        assert_eq!(ids(recent.get(7, 8)), Some(vec![(1, 7)]));
        recent.push(entry(2, 20), 10);
        assert_eq!(ids(recent.get(7, 8)), None, "a gap starts over");
        assert_eq!(ids(recent.get(20, 21)), Some(vec![(2, 20)]));
    }

    /// A data directory of a version that kept the log in RocksDB: entries 3..=12 of term 2,
    /// purged up to 2, and a vote of `vote_term`.
    fn legacy_data_dir(vote_term: u64) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let db = crate::db::open(&dir.path().join("db"), &Default::default()).unwrap();
        let log = cf(&db, LEGACY_LOG_CF);
        for index in 3u64..=12 {
            db.put_cf(log, index.to_be_bytes(), encode(&entry(2, index)).unwrap()).unwrap();
        }
        let purged = LogId::new(CommittedLeaderId::new(1, 1), 2);
        db.put_cf(cf(&db, RAFT_META_CF), LAST_PURGED, encode(&purged).unwrap()).unwrap();
        db.put_cf(cf(&db, RAFT_META_CF), VOTE, encode(&Vote::new_committed(vote_term, 1)).unwrap()).unwrap();
        dir
    }

    fn open_storage(dir: &Path) -> Result<crate::NodeStorage, crate::OpenError> {
        let metrics = StorageMetrics::register(&prometheus::Registry::new()).unwrap();
        crate::open(dir, statestore_statemachine::Config::default(), metrics)
    }

    /// A data directory of a version that kept the log in RocksDB: its entries move into the
    /// log's files when it opens, and leave RocksDB; opening again finds them in the files.
    #[tokio::test]
    async fn a_log_kept_in_rocksdb_moves_into_the_files_on_open() {
        let dir = legacy_data_dir(2);
        for reopened in [false, true] {
            let mut node = open_storage(dir.path()).unwrap();
            let state = node.log.get_log_state().await.unwrap();
            assert_eq!(state.last_purged_log_id.map(|id| id.index), Some(2), "reopened: {reopened}");
            assert_eq!(state.last_log_id.map(|id| (id.leader_id.term, id.index)), Some((2, 12)));
            let entries = node.log.try_get_log_entries(3..13).await.unwrap();
            assert_eq!(ids(Some(entries)), Some((3..=12).map(|i| (2, i)).collect()));
            let legacy = node.log.db().iterator_cf(cf(node.log.db(), LEGACY_LOG_CF), IteratorMode::Start).count();
            assert_eq!(legacy, 0, "nothing is left in RocksDB");
        }
        assert!(dir.path().join("log").join(format!("{:020}.segment", 3)).exists());
        assert!(!dir.path().join("log.moving").exists());
    }

    /// A vote is saved before any entry of its term is appended; one older than the log's last
    /// entry lost its latest writes, and the storage does not open.
    #[test]
    fn a_vote_older_than_the_log_does_not_open() {
        let dir = legacy_data_dir(1);
        let Err(error) = open_storage(dir.path()) else { panic!("opened with a vote of term 1 and entries of term 2") };
        assert!(matches!(error, crate::OpenError::LostVote { vote_term: 1, log_term: 2, .. }), "{error}");
        assert!(error.is_corruption());
        assert!(error.to_string().contains("holds entries of term 2, but the vote kept in RocksDB is of term 1"));
    }

    /// Entries committed and not yet in the tables on disk must be in the log; entries the
    /// tables already hold may be missing (a snapshot installed just before a crash).
    #[test]
    fn a_log_must_hold_the_committed_entries_the_tables_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let (mut files, _) = LogFiles::open(dir.path()).unwrap();
        let check = |files: &LogFiles, applied: u64, committed: u64| {
            check_holds_unapplied(files, applied, committed, dir.path()).map_err(|e| e.to_string())
        };
        assert_eq!(check(&files, 0, 0), Ok(()), "nothing committed");
        assert_eq!(check(&files, 9, 9), Ok(()), "the tables hold everything committed");
        let empty = check(&files, 4, 9).unwrap_err();
        assert!(
            empty.contains(
                "it holds no entry, but this node committed entries up to 9 and its tables hold them up to 4"
            ),
            "{empty}"
        );
        files.append((5..=12).map(|index| (index, b"entry".as_slice()))).unwrap();
        assert_eq!(check(&files, 4, 9), Ok(()));
        assert_eq!(check(&files, 4, 12), Ok(()));
        assert_eq!(check(&files, 30, 20), Ok(()), "the tables are ahead of the log");
        let short = check(&files, 4, 13).unwrap_err();
        assert!(short.contains("it holds entries 5 to 12, but this node committed entries up to 13"), "{short}");
        let late = check(&files, 3, 9).unwrap_err();
        assert!(late.contains("its tables hold them up to 3"), "{late}");
    }

    /// The log's directory gone from a node that kept its log there: the storage does not open
    /// (an empty log would let the node start from its tables alone).
    #[test]
    fn a_missing_log_directory_does_not_open() {
        let dir = tempfile::tempdir().unwrap();
        drop(open_storage(dir.path()).unwrap());
        std::fs::remove_dir_all(dir.path().join("log")).unwrap();
        let Err(error) = open_storage(dir.path()) else { panic!("opened without its log directory") };
        assert!(matches!(error, crate::OpenError::LostLog { .. }), "{error}");
        assert!(error.is_corruption());
        assert!(error.to_string().contains("lost entries: the directory is missing"), "{error}");
    }

    /// A clean stop records the entries the log holds; the next open checks them and forgets the
    /// record. Segment files deleted while the node was stopped are found even though nothing
    /// committed is missing from the tables.
    #[test]
    fn a_log_that_lost_entries_it_held_at_a_clean_stop_does_not_open() {
        let dir = legacy_data_dir(2);
        let node = open_storage(dir.path()).unwrap();
        node.log.reader().record_stop().unwrap();
        drop(node);
        let node = open_storage(dir.path()).expect("the log holds what it held at the stop");
        assert_eq!(read_meta::<StoppedLog>(node.log.db(), STOPPED_LOG).unwrap(), None, "the record is forgotten");
        node.log.reader().record_stop().unwrap();
        drop(node);
        std::fs::remove_file(dir.path().join("log").join(format!("{:020}.segment", 3))).unwrap();
        let Err(error) = open_storage(dir.path()) else { panic!("opened without the entries it held at the stop") };
        assert!(matches!(error, crate::OpenError::LostLog { .. }), "{error}");
        assert!(error.is_corruption());
        assert!(
            error
                .to_string()
                .contains("lost entries: it holds no entry, but it held entries 3 to 12 when this node stopped"),
            "{error}"
        );
    }

    /// A data directory (vote of term 1, committed up to entry 8) whose log got entries 1 to 8 of
    /// term 1 and lost what `lose` does to them in a power cut.
    fn committed_past_a_power_cut(lose: impl FnOnce(&LogFiles)) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        log_of_term_one(dir.path(), 8, Some(8));
        lose(&LogFiles::open(&dir.path().join("log")).unwrap().0);
        dir
    }

    /// Makes `dir` a data directory with a vote of term 1, a log of entries 1 to `entries` of
    /// term 1 (synced) and the entries up to `committed` recorded committed.
    fn log_of_term_one(dir: &Path, entries: u64, committed: Option<u64>) {
        drop(open_storage(dir).unwrap());
        let db = crate::db::open(&dir.join("db"), &Default::default()).unwrap();
        let meta = cf(&db, RAFT_META_CF);
        db.put_cf_opt(meta, VOTE, encode(&Vote::new_committed(1, 1)).unwrap(), &synced()).unwrap();
        let committed = committed.map(|index| LogId::new(CommittedLeaderId::new(1, 1), index));
        db.put_cf_opt(meta, COMMITTED, encode(&committed).unwrap(), &synced()).unwrap();
        drop(db);
        let (mut files, _) = LogFiles::open(&dir.join("log")).unwrap();
        let encoded: Vec<Vec<u8>> = (1..=entries).map(|index| encode(&entry(1, index)).unwrap()).collect();
        files.append((1..=entries).zip(encoded.iter().map(Vec::as_slice))).unwrap()[0].sync().unwrap();
    }

    /// Asked to save a committed index past the entries this node has flushed (a follower
    /// takes the leader's against the entries it accepted, flushed only because its append
    /// waits for the flush), the log store saves the last entry flushed instead, so a power cut
    /// never leaves one past what the log holds durably.
    #[tokio::test]
    async fn the_committed_index_is_saved_no_further_than_the_log_is_flushed() {
        let dir = tempfile::tempdir().unwrap();
        log_of_term_one(dir.path(), 5, None);
        let id = |index| LogId::new(CommittedLeaderId::new(1, 1), index);
        let mut node = open_storage(dir.path()).unwrap();
        node.log.save_committed(Some(id(8))).await.unwrap();
        assert_eq!(node.log.read_committed().await.unwrap(), Some(id(5)), "the log is flushed up to 5");
        node.log.save_committed(Some(id(4))).await.unwrap();
        assert_eq!(node.log.read_committed().await.unwrap(), Some(id(4)));
        // A truncation takes the entries it removes out of what is flushed.
        node.log.truncate(id(4)).await.unwrap();
        node.log.save_committed(Some(id(5))).await.unwrap();
        assert_eq!(node.log.read_committed().await.unwrap(), Some(id(3)));
        drop(node);
        let mut node = open_storage(dir.path()).unwrap();
        assert_eq!(node.log.read_committed().await.unwrap(), Some(id(3)), "as saved");
    }

    /// Zeroes the log from record `index` on (8 KiB: the records after it are small).
    fn zero_from(files: &LogFiles, index: u64) {
        use std::os::unix::fs::FileExt;
        let (path, offset) = files.record_at(index).unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        file.write_all_at(&vec![0u8; 8192], offset).unwrap();
    }

    /// Opening a log cut by a power cut below the committed index kept in RocksDB (torn, or an
    /// append lost whole inside the last segment) lowers that index to the last entry the log
    /// holds, and the storage opens: the entries lost were never flushed, so never reported to
    /// a leader, and are on a quorum of the other nodes.
    #[tokio::test]
    async fn a_committed_index_past_what_a_power_cut_left_of_the_log_is_lowered_to_it() {
        use std::os::unix::fs::FileExt;
        let torn = committed_past_a_power_cut(|files| {
            zero_from(files, 7);
            // A later sector of the unfinished write reached the disk.
            let (path, offset) = files.record_at(7).unwrap();
            std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .unwrap()
                .write_all_at(&[9u8; 512], offset + 4096)
                .unwrap();
        });
        let lost_whole = committed_past_a_power_cut(|files| zero_from(files, 7));
        for dir in [torn, lost_whole] {
            let mut node = open_storage(dir.path()).expect("a power cut's state opens");
            let committed = node.log.read_committed().await.unwrap();
            assert_eq!(committed.map(|id| (id.leader_id.term, id.index)), Some((1, 6)));
            let state = node.log.get_log_state().await.unwrap();
            assert_eq!(state.last_log_id.map(|id| id.index), Some(6));
            drop(node);
            let mut node = open_storage(dir.path()).expect("opens again");
            assert_eq!(node.log.read_committed().await.unwrap().map(|id| id.index), Some(6), "lowered durably");
        }
    }

    #[test]
    fn recent_entries_are_bounded_by_count_and_bytes() {
        let mut recent = RecentEntries::default();
        for index in 1..=(RECENT_ENTRIES as u64 + 10) {
            recent.push(entry(1, index), 1);
        }
        assert_eq!(recent.entries.len(), RECENT_ENTRIES);
        assert_eq!(recent.first_index(), Some(11));
        recent.push(entry(1, RECENT_ENTRIES as u64 + 11), RECENT_BYTES);
        assert_eq!(recent.entries.len(), 1, "one entry larger than the byte bound is kept alone");
        assert_eq!(recent.bytes, RECENT_BYTES);
    }
}
