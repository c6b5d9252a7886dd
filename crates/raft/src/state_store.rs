//! The state machine on RocksDB: applies committed entries with
//! [`statestore_statemachine::StateMachine`], builds and installs snapshots.
//!
//! Each call of apply commits one RocksDB write batch holding everything the entries changed
//! (keys, expiry index, registrations, dedup, outbox, clock and last version) together with the
//! last applied log id and the membership, so a crash never leaves the state and the applied
//! index apart.
//!
//! Snapshots stream between RocksDB and files: a build writes records straight from a RocksDB
//! snapshot into a file, a received snapshot is written by openraft into a temporary file, and
//! an install writes records from the file into table files that RocksDB ingests. An install
//! spans several writes, so it is marked in progress (meta key `raft_installing_snapshot`) from
//! the batch that clears the tables to the synced batch that records the snapshot's log id; a
//! node that stops in between installs the kept snapshot again when it opens
//! ([`resume_install`]).

use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use openraft::storage::RaftStateMachine;
use openraft::{AnyError, EntryPayload, OptionalSend, RaftSnapshotBuilder, StorageIOError};
use rocksdb::{IngestExternalFileOptions, IteratorMode, SstFileWriter, WriteBatch, DB};
use serde::de::DeserializeOwned;
use statestore_protocol::backup::{BackupEnd, BackupKey, BackupWriter};
use statestore_statemachine::{dedup, meta, KeyRecord, Operation, Overlay, StateMachine, StorageRead, Table};
use tokio::sync::broadcast;

use crate::background::{lower_priority, write_out};
use crate::damage::{DamageReport, Damaged};
use crate::db::{self, add_to, cf, synced, AppliedOnDisk, Tables, ViewTables, WithDedup};
use crate::dedup_retention::{DedupHorizon, DedupIndex};
use crate::identity::IdentityMemo;
use crate::metrics::StorageMetrics;
use crate::snapshot::{
    verify, Pace, PacedFile, RecordReader, SnapshotDir, SnapshotError, SnapshotWriter, WRITE_OUT_EVERY,
};
use crate::types::{
    ApplyResult, LogEntry, LogId, RaftStorageError, Snapshot, SnapshotMeta, StoredMembership, TypeConfig,
};
use crate::wire::{decode, encode};
use crate::{AppliedRequests, LogBytes};

/// Raft's own keys in the state-machine meta table, beside the state machine's.
const LAST_APPLIED: &[u8] = b"raft_last_applied";
const MEMBERSHIP: &[u8] = b"raft_membership";
/// Present while a snapshot install is between its first and its last batch.
const INSTALLING: &[u8] = b"raft_installing_snapshot";
/// Most bytes of records in one table file an install ingests. RocksDB writes a table file
/// whole and syncs it when finished; a smaller file is a shorter burst of writes for the
/// node's WAL fsyncs to wait behind.
const INGEST_FILE_BYTES: u64 = 8 << 20;
/// Index entries of expired dedup records an apply call forgets at least, beyond two per
/// operation it applied: enough to keep up with the records it adds, bounded per call.
const FORGET_PER_APPLY: usize = 64;

fn read_error(e: impl ToString) -> RaftStorageError {
    StorageIOError::read_state_machine(AnyError::error(e.to_string())).into()
}

fn write_error(e: impl ToString) -> RaftStorageError {
    StorageIOError::write_state_machine(AnyError::error(e.to_string())).into()
}

fn snapshot_error(e: impl ToString) -> RaftStorageError {
    StorageIOError::write_snapshot(None, AnyError::error(e.to_string())).into()
}

fn meta_value<T: DeserializeOwned + Default>(value: Option<Vec<u8>>) -> Result<T, RaftStorageError> {
    value.map_or(Ok(T::default()), |bytes| decode(&bytes).map_err(read_error))
}

/// The state-machine store. Owned by openraft.
pub struct StateStore {
    db: Arc<DB>,
    machine: StateMachine,
    snapshots: SnapshotDir,
    metrics: StorageMetrics,
    /// Told the identities of the requests each apply call applied.
    applied_requests: broadcast::Sender<AppliedRequests>,
    /// The temporary file of the snapshot being received, if any.
    receiving: Option<PathBuf>,
    /// Bytes a second a snapshot build writes at most (none: no limit).
    snapshot_write_rate: Option<u64>,
    /// Bytes a second an install writes its table files at most; none: no limit.
    snapshot_install_rate: Option<u64>,
    /// How long a paced install may take at most, whatever its rate: the leader's wait for it.
    snapshot_install_within: Duration,
    shared: SharedState,
}

/// What the state store shares with the node's reader and with RocksDB.
#[derive(Clone)]
pub(crate) struct SharedState {
    pub log_bytes: Arc<LogBytes>,
    /// Set while an install replaces the tables.
    pub installing: Arc<AtomicBool>,
    /// The clock of `applied_on_disk`, held back while a snapshot is built.
    pub dedup_horizon: Arc<DedupHorizon>,
    /// Where each dedup record is stored; told of every record an apply writes.
    pub dedup_index: Arc<DedupIndex>,
    /// Told of a kept snapshot found damaged.
    pub damage: Arc<DamageReport>,
    /// The applied identity records in memory; told when an apply or an install changes them.
    pub identity: Arc<IdentityMemo>,
    /// How far the applied state is on disk; the log is not purged past it.
    pub applied_on_disk: Arc<AppliedOnDisk>,
    /// The log's fsync under way.
    pub fsync: Arc<crate::FsyncWatch>,
}

impl Default for SharedState {
    fn default() -> Self {
        let applied_on_disk = Arc::new(AppliedOnDisk::default());
        SharedState {
            log_bytes: Arc::default(),
            installing: Arc::default(),
            dedup_horizon: Arc::new(DedupHorizon::new(applied_on_disk.clone())),
            dedup_index: Arc::default(),
            damage: Arc::default(),
            identity: Arc::default(),
            applied_on_disk,
            fsync: Arc::default(),
        }
    }
}

impl StateStore {
    pub(crate) fn new(
        db: Arc<DB>,
        machine: StateMachine,
        snapshots: SnapshotDir,
        metrics: StorageMetrics,
        applied_requests: broadcast::Sender<AppliedRequests>,
        shared: SharedState,
    ) -> Self {
        StateStore {
            db,
            machine,
            snapshots,
            metrics,
            applied_requests,
            receiving: None,
            snapshot_write_rate: None,
            snapshot_install_rate: None,
            snapshot_install_within: Duration::MAX,
            shared,
        }
    }

    /// Holds snapshot builds to `bytes_per_second` (none or 0: no limit, the default).
    pub fn set_snapshot_write_rate(&mut self, bytes_per_second: Option<u64>) {
        self.snapshot_write_rate = bytes_per_second.filter(|&rate| rate > 0);
    }

    /// Holds the table files a snapshot install writes to `bytes_per_second` (none or 0: no
    /// limit, the default), but no longer than `within` for the whole install: the leader's
    /// last chunk waits for the install, and one that outlasted its wait would be sent again.
    pub fn set_snapshot_install_rate(&mut self, bytes_per_second: Option<u64>, within: Duration) {
        self.snapshot_install_rate = bytes_per_second.filter(|&rate| rate > 0);
        self.snapshot_install_within = within;
    }
}

impl RaftStateMachine<TypeConfig> for StateStore {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), RaftStorageError> {
        Ok((last_applied(&self.db)?, applied_membership(&self.db)?))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<ApplyResult>, RaftStorageError>
    where
        I: IntoIterator<Item = LogEntry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let started = Instant::now();
        let tables = WithDedup::new(&self.db, &self.shared.dedup_index);
        let mut overlay = Overlay::new(&tables);
        let mut results = Vec::new();
        let mut last_applied = None;
        let mut membership = None;
        let mut with_requests = Vec::new();
        let mut identity_changed = false;
        let mut operations = 0;
        for entry in entries {
            last_applied = Some(entry.log_id);
            let applied = match entry.payload {
                EntryPayload::Blank => Vec::new(),
                EntryPayload::Normal(proposal) => {
                    let applied = proposal
                        .entries
                        .iter()
                        .map(|entry| self.machine.apply(&mut overlay, entry))
                        .collect::<Result<_, _>>()
                        .map_err(write_error)?;
                    let mut has_requests = false;
                    for entry in &proposal.entries {
                        match entry.operation {
                            Operation::Request(_) => has_requests = true,
                            Operation::Enroll { .. }
                            | Operation::NameCluster { .. }
                            | Operation::RenameCluster { .. } => identity_changed = true,
                            _ => {}
                        }
                    }
                    // The proposal goes to the applied-requests feed as it is, shared.
                    if has_requests {
                        with_requests.push(proposal);
                    }
                    applied
                }
                EntryPayload::Membership(config) => {
                    membership = Some(StoredMembership::new(Some(entry.log_id), config));
                    Vec::new()
                }
            };
            // One result per operation of the entry; an entry without any counts one.
            operations += applied.len().max(1) as u64;
            results.push(ApplyResult { applied });
        }
        if last_applied.is_none() {
            return Ok(results);
        }
        let mut batch = WriteBatch::default();
        add_to(&mut batch, &self.db, &self.shared.dedup_index, overlay.into_batch());
        let meta = cf(&self.db, Table::Meta.name());
        batch.put_cf(meta, LAST_APPLIED, encode(&last_applied).map_err(write_error)?);
        if let Some(membership) = membership {
            batch.put_cf(meta, MEMBERSHIP, encode(&membership).map_err(write_error)?);
        }
        // Not written to the WAL: what it holds is in the log, applied again after a crash from
        // the last batch a flush wrote (see `db`).
        self.db.write_opt(batch, &db::unlogged()).map_err(write_error)?;
        self.shared.applied_on_disk.count_applied(last_applied.map_or(0, |id| id.index), operations);
        self.shared
            .dedup_index
            .forget_expired(self.shared.dedup_horizon.now(), 2 * operations as usize + FORGET_PER_APPLY);
        if identity_changed {
            self.shared.identity.changed();
        }
        self.metrics.apply_seconds.observe(started.elapsed().as_secs_f64());
        if !with_requests.is_empty() {
            // No subscriber (no MQTT front end) is not an error.
            let _ = self.applied_requests.send(AppliedRequests::new(with_requests));
        }
        Ok(results)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        SnapshotBuilder {
            db: self.db.clone(),
            snapshots: self.snapshots.clone(),
            metrics: self.metrics.clone(),
            write_rate: self.snapshot_write_rate,
            shared: self.shared.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<tokio::fs::File>, RaftStorageError> {
        let snapshots = self.snapshots.clone();
        let (path, file) = tokio::task::spawn_blocking(move || snapshots.create_temp())
            .await
            .map_err(snapshot_error)?
            .map_err(snapshot_error)?;
        if let Some(abandoned) = self.receiving.replace(path) {
            let _ = std::fs::remove_file(abandoned);
        }
        Ok(Box::new(tokio::fs::File::from_std(file)))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<tokio::fs::File>,
    ) -> Result<(), RaftStorageError> {
        use tokio::io::AsyncWriteExt;
        let mut file = *snapshot;
        // Writes to a tokio file complete in the background; wait for them.
        file.flush().await.map_err(snapshot_error)?;
        let file = file.into_std().await;
        let receiving = self.receiving.take();
        let snapshots = self.snapshots.clone();
        // The file openraft received into is used as it is; any other (a snapshot handed over
        // directly) is copied into a temporary file first.
        let temp = tokio::task::spawn_blocking(move || received_file(&snapshots, receiving, file))
            .await
            .map_err(snapshot_error)?
            .map_err(snapshot_error)?;
        let db = self.db.clone();
        let snapshots = self.snapshots.clone();
        let snapshot_meta = meta.clone();
        let shared = self.shared.clone();
        let (install_rate, install_within) = (self.snapshot_install_rate, self.snapshot_install_within);
        // Off the async workers: checking, writing and fsyncing a large snapshot takes seconds.
        in_background("snapshot-install", move || {
            let started = Instant::now();
            let records = match verify(&temp) {
                Ok(records) => records,
                Err(e) => {
                    let _ = std::fs::remove_file(&temp);
                    return Err(snapshot_error(e));
                }
            };
            let checked = started.elapsed();
            let data = snapshots.keep(&snapshot_meta, &temp).map_err(snapshot_error)?;
            let bytes = std::fs::metadata(&data).map_or(0, |m| m.len());
            shared.log_bytes.set_snapshot_size(bytes);
            shared.installing.store(true, Ordering::Release);
            // The records' bytes are fewer than the file's, so they take no longer than this.
            let pace = Pace::finishing_within(install_rate, bytes, install_within);
            let installed = install(&db, &snapshot_meta, &data, &snapshots, pace);
            shared.installing.store(false, Ordering::Release);
            shared.identity.changed();
            installed?;
            tracing::info!(
                snapshot = snapshot_meta.snapshot_id,
                records,
                mib = format!("{:.1}", bytes as f64 / (1 << 20) as f64),
                checked_s = format!("{:.2}", checked.as_secs_f64()),
                installed_s = format!("{:.2}", started.elapsed().as_secs_f64()),
                "installed a snapshot"
            );
            // Ingested table files and synced batches: on disk as installed.
            let operations = shared.applied_on_disk.applied_operations();
            let clock = meta::clock(&Tables { db: &db }).map_err(read_error)?;
            shared.applied_on_disk.reached(snapshot_meta.last_log_id.map_or(0, |id| id.index), clock, operations);
            shared.dedup_index.load(&db, shared.dedup_horizon.now()).map_err(read_error)?;
            Ok(())
        })
        .await??;
        self.shared.log_bytes.snapshot_taken();
        self.metrics.snapshots.with_label_values(&["installed"]).inc();
        Ok(())
    }

    /// openraft asks for the kept snapshot when it starts and before it sends the snapshot to a
    /// member; each time, the whole file is checked on a background thread, so that a damaged
    /// snapshot stops this node (see [`DamageReport`]) instead of being sent. The check does
    /// not hold the state machine up meanwhile; a receiver checks what it received in any case.
    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, RaftStorageError> {
        let snapshots = self.snapshots.clone();
        let kept = tokio::task::spawn_blocking(move || {
            let Some((meta, path)) = snapshots.current()? else { return Ok(None) };
            let file = std::fs::File::open(&path)?;
            Ok::<_, SnapshotError>(Some((meta, path, file)))
        })
        .await
        .map_err(snapshot_error)?
        .map_err(|e| StorageIOError::read_snapshot(None, AnyError::error(e.to_string())))?;
        let Some((meta, path, file)) = kept else { return Ok(None) };
        let damage = self.shared.damage.clone();
        spawn_low_priority("snapshot-check", move || check_kept(&path, &damage)).map_err(snapshot_error)?;
        Ok(Some(Snapshot { meta, snapshot: Box::new(tokio::fs::File::from_std(file)) }))
    }
}

/// Runs `work` on a thread of its own at the lowest CPU priority and the lowest best-effort I/O
/// priority, so that building or installing a large snapshot yields the cores and the disk to
/// the threads that serve requests (and to the WAL fsyncs they wait for).
async fn in_background<T: Send + 'static>(
    name: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, RaftStorageError> {
    let (done, result) = tokio::sync::oneshot::channel();
    spawn_low_priority(name, move || {
        let _ = done.send(work());
    })
    .map_err(snapshot_error)?;
    result.await.map_err(|_| snapshot_error("the snapshot thread panicked"))
}

/// Runs `work` on a thread of its own at the lowest priorities (see [`in_background`]).
fn spawn_low_priority(name: &str, work: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    std::thread::Builder::new().name(name.to_string()).spawn(move || {
        lower_priority();
        work();
    })?;
    Ok(())
}

/// Reads the kept snapshot at `path` whole; reports it if damaged. A snapshot kept since has
/// removed the file: nothing to check then.
fn check_kept(path: &Path, damage: &DamageReport) {
    match verify(path) {
        Err(e) if e.is_damage() => {
            damage.report(Damaged(format!("the kept snapshot {} is damaged: {e}", path.display())));
        }
        Err(SnapshotError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(snapshot = %path.display(), error = %e, "could not check the kept snapshot"),
        Ok(_) => {}
    }
}

/// The path of the temporary file holding `file`'s snapshot: `receiving` when `file` is that
/// file, else a new temporary copy of `file` from its start.
fn received_file(
    snapshots: &SnapshotDir,
    receiving: Option<PathBuf>,
    mut file: std::fs::File,
) -> std::io::Result<PathBuf> {
    use std::io::{Seek, SeekFrom};
    use std::os::unix::fs::MetadataExt;
    let inode = |metadata: std::fs::Metadata| (metadata.dev(), metadata.ino());
    if let Some(path) = receiving {
        if std::fs::metadata(&path).map(inode).ok() == Some(inode(file.metadata()?)) {
            return Ok(path);
        }
        let _ = std::fs::remove_file(path);
    }
    let (path, mut copy) = snapshots.create_temp()?;
    file.seek(SeekFrom::Start(0))?;
    std::io::copy(&mut file, &mut copy)?;
    Ok(path)
}

/// Replaces every state-machine table with the records of the verified snapshot at `data`. The
/// first batch clears the tables and marks the install in progress; records follow in bounded
/// batches; the last batch records the snapshot's log id and membership and clears the mark,
/// synced. A node stopped in between has the mark and installs again ([`resume_install`]).
/// The table files are written no faster than `pace` allows.
fn install(
    db: &DB,
    meta: &SnapshotMeta,
    data: &Path,
    snapshots: &SnapshotDir,
    pace: Pace,
) -> Result<(), RaftStorageError> {
    clear_for_install(db, meta)?;
    load_records(db, meta, data, snapshots, pace)
}

/// The first batch of an install: every table emptied (range deletes, one per table) and the
/// install marked in progress, synced.
fn clear_for_install(db: &DB, meta: &SnapshotMeta) -> Result<(), RaftStorageError> {
    let mut batch = WriteBatch::default();
    for table in Table::ALL {
        db::add_clear(&mut batch, db, cf(db, table.name())).map_err(read_error)?;
    }
    batch.put_cf(cf(db, Table::Meta.name()), INSTALLING, meta.snapshot_id.as_bytes());
    db.write_opt(batch, &synced()).map_err(write_error)
}

/// The rest of an install: the records written into table files and ingested (no WAL, no
/// memtable, no flush: a 1 M-key install costs about what one flush of it would), then the log
/// position with the mark cleared, synced.
fn load_records(
    db: &DB,
    meta: &SnapshotMeta,
    data: &Path,
    snapshots: &SnapshotDir,
    pace: Pace,
) -> Result<(), RaftStorageError> {
    let file = std::fs::File::open(data).map_err(snapshot_error)?;
    let mut records = RecordReader::new(BufReader::with_capacity(1 << 20, file)).map_err(snapshot_error)?;
    let options = db::external_file_options();
    let mut ingester = Ingester::new(db, &options, snapshots, INGEST_FILE_BYTES, pace);
    let loaded = (|| {
        while let Some((table, key, value)) = records.next_record().map_err(snapshot_error)? {
            ingester.put(table, &key, &value)?;
        }
        ingester.finish()
    })();
    if let Some(open) = ingester.open.take() {
        let _ = std::fs::remove_file(open.path);
    }
    loaded?;
    let mut batch = WriteBatch::default();
    let meta_cf = cf(db, Table::Meta.name());
    batch.put_cf(meta_cf, LAST_APPLIED, encode(&meta.last_log_id).map_err(write_error)?);
    batch.put_cf(meta_cf, MEMBERSHIP, encode(&meta.last_membership).map_err(write_error)?);
    batch.delete_cf(meta_cf, INSTALLING);
    db.write_opt(batch, &synced()).map_err(write_error)
}

/// Writes a snapshot's records, table by table in key order as a snapshot holds them, into table
/// files of about `file_bytes` each and ingests each into its column family. Dedup records of a
/// snapshot from an earlier version come in request order, out of the order they are stored in
/// ([`crate::snapshot`]): those go through write batches instead.
struct Ingester<'a> {
    db: &'a DB,
    options: &'a rocksdb::Options,
    snapshots: &'a SnapshotDir,
    /// Bytes of records after which a table file is finished and ingested.
    file_bytes: u64,
    open: Option<OpenTableFile<'a>>,
    /// Holds the table files' writing to the install rate.
    pace: Pace,
    /// Bytes of records written into table files so far, all files together.
    written: u64,
    /// Dedup records out of order, written (through the WAL, which the install's last, synced
    /// batch syncs) once they hold `file_bytes`.
    unordered: WriteBatch,
}

struct OpenTableFile<'a> {
    table: Table,
    writer: SstFileWriter<'a>,
    path: PathBuf,
    /// The file, opened again to write its pages out as it grows (as a snapshot build's are,
    /// see [`PacedFile`]): the writer leaves them dirty until it syncs the file whole.
    pages: std::fs::File,
    bytes: u64,
    /// `bytes` at the last write-out.
    written_out: u64,
    /// The last key written.
    last_key: Vec<u8>,
}

impl<'a> Ingester<'a> {
    fn new(db: &'a DB, options: &'a rocksdb::Options, snapshots: &'a SnapshotDir, file_bytes: u64, pace: Pace) -> Self {
        Ingester { db, options, snapshots, file_bytes, open: None, pace, written: 0, unordered: WriteBatch::default() }
    }

    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<(), RaftStorageError> {
        let out_of_order = |open: &OpenTableFile| open.table == table && key <= &open.last_key[..];
        if table == Table::Dedup && self.open.as_ref().is_some_and(out_of_order) {
            self.unordered.put_cf(cf(self.db, table.name()), key, value);
            if self.unordered.size_in_bytes() as u64 >= self.file_bytes {
                self.write_unordered()?;
            }
            return Ok(());
        }
        if self.open.as_ref().is_some_and(|open| open.table != table || open.bytes >= self.file_bytes) {
            self.ingest_open()?;
        }
        let open = match &mut self.open {
            Some(open) => open,
            None => {
                let path = self.snapshots.temp_path("install");
                let writer = SstFileWriter::create(self.options);
                writer.open(&path).map_err(write_error)?;
                let pages = std::fs::File::open(&path).map_err(write_error)?;
                let last_key = Vec::new();
                self.open.insert(OpenTableFile { table, writer, path, pages, bytes: 0, written_out: 0, last_key })
            }
        };
        // A snapshot out of key order (not one this store wrote) is refused here.
        open.writer.put(key, value).map_err(write_error)?;
        open.last_key.clear();
        open.last_key.extend_from_slice(key);
        let bytes = (key.len() + value.len()) as u64;
        open.bytes += bytes;
        self.written += bytes;
        if open.bytes - open.written_out >= WRITE_OUT_EVERY {
            write_out(&open.pages, 0, 0).map_err(write_error)?;
            open.written_out = open.bytes;
            self.pace.hold(self.written);
        }
        Ok(())
    }

    /// Finishes the open table file, if any, and ingests it.
    fn ingest_open(&mut self) -> Result<(), RaftStorageError> {
        let Some(mut open) = self.open.take() else { return Ok(()) };
        let ingested = (|| {
            open.writer.finish()?;
            let mut options = IngestExternalFileOptions::default();
            // Linked into the database rather than copied: the file is ours to give away.
            options.set_move_files(true);
            self.db.ingest_external_file_cf_opts(cf(self.db, open.table.name()), &options, vec![&open.path])
        })();
        let _ = std::fs::remove_file(&open.path);
        ingested.map_err(write_error)?;
        self.pace.hold(self.written);
        Ok(())
    }

    /// Ingests and writes everything put so far.
    fn finish(&mut self) -> Result<(), RaftStorageError> {
        self.ingest_open()?;
        self.write_unordered()
    }

    /// Writes the dedup records out of order held so far.
    fn write_unordered(&mut self) -> Result<(), RaftStorageError> {
        if self.unordered.is_empty() {
            return Ok(());
        }
        self.db.write(std::mem::take(&mut self.unordered)).map_err(write_error)
    }
}

/// Finishes a snapshot install that a stop interrupted, from the kept snapshot.
pub(crate) fn resume_install(db: &DB, snapshots: &SnapshotDir) -> Result<(), RaftStorageError> {
    let meta_cf = cf(db, Table::Meta.name());
    let Some(id) = db.get_cf(meta_cf, INSTALLING).map_err(read_error)? else { return Ok(()) };
    let id = String::from_utf8_lossy(&id).into_owned();
    let (meta, data) = snapshots
        .current()
        .map_err(snapshot_error)?
        .ok_or_else(|| snapshot_error(format!("snapshot {id} was being installed, but no snapshot is kept")))?;
    tracing::warn!(
        snapshot = meta.snapshot_id,
        interrupted = id,
        "installing the kept snapshot again: an install was interrupted"
    );
    // Before the node serves anything: as fast as the disk goes.
    install(db, &meta, &data, snapshots, Pace::new(None))
}

/// The log id of the last batch applied to the tables.
fn last_applied(db: &DB) -> Result<Option<LogId>, RaftStorageError> {
    meta_value(db.get_cf(cf(db, Table::Meta.name()), LAST_APPLIED).map_err(read_error)?)
}

/// The cluster's membership as the tables have applied it.
pub(crate) fn applied_membership(db: &DB) -> Result<StoredMembership, RaftStorageError> {
    meta_value(db.get_cf(cf(db, Table::Meta.name()), MEMBERSHIP).map_err(read_error)?)
}

/// The log index of the last batch applied to the tables (0 before any).
pub(crate) fn applied_index(db: &DB) -> Result<u64, RaftStorageError> {
    Ok(last_applied(db)?.map_or(0, |id| id.index))
}

/// Flushes the memtables, so that everything applied before the call is on disk, and records
/// how far that is in `on_disk`; returns that index.
pub(crate) fn flush_applied(db: &DB, on_disk: &AppliedOnDisk) -> Result<u64, RaftStorageError> {
    let applied = applied_index(db)?;
    let clock = meta::clock(&Tables { db }).map_err(read_error)?;
    let operations = on_disk.applied_operations();
    db::flush_all(db).map_err(write_error)?;
    on_disk.reached(applied, clock, operations);
    Ok(applied)
}

/// Builds a snapshot from a consistent view of the state machine.
pub struct SnapshotBuilder {
    db: Arc<DB>,
    snapshots: SnapshotDir,
    metrics: StorageMetrics,
    write_rate: Option<u64>,
    shared: SharedState,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot, RaftStorageError> {
        let started = Instant::now();
        self.shared.log_bytes.snapshot_taken();
        let db = self.db.clone();
        let snapshots = self.snapshots.clone();
        let horizon = self.shared.dedup_horizon.clone();
        let on_disk = self.shared.applied_on_disk.clone();
        let write_rate = self.write_rate;
        let (meta, file) = in_background("snapshot-build", move || {
            let built = build(&db, &snapshots, &horizon, write_rate)?;
            // openraft purges the log below the snapshot once this returns: the applied state
            // it covers must be on disk first.
            flush_applied(&db, &on_disk)?;
            Ok::<_, RaftStorageError>(built)
        })
        .await??;
        self.shared.log_bytes.set_snapshot_size(file.metadata().map_or(0, |m| m.len()));
        self.metrics.snapshot_build_seconds.observe(started.elapsed().as_secs_f64());
        self.metrics.snapshots.with_label_values(&["built"]).inc();
        Ok(Snapshot { meta, snapshot: Box::new(tokio::fs::File::from_std(file)) })
    }
}

/// Writes every key of one consistent view of the applied state to `out` as a backup
/// (`statestore_protocol::backup`); returns the number of keys and the log index the view had
/// applied.
pub(crate) fn export_keys(db: &DB, out: impl std::io::Write) -> Result<BackupEnd, RaftStorageError> {
    const PAGE: usize = 1024;
    let view = db.snapshot();
    let tables = ViewTables { db, view: &view };
    let applied: Option<LogId> =
        meta_value(view.get_cf(cf(db, Table::Meta.name()), LAST_APPLIED).map_err(read_error)?)?;
    let applied_index = applied.map_or(0, |id| id.index);
    let mut writer = BackupWriter::new(out).map_err(read_error)?;
    let mut cursor: Option<Vec<u8>> = None;
    loop {
        let page = tables.scan(Table::Keys, b"", cursor.as_deref(), PAGE).map_err(read_error)?;
        for (key, record) in &page {
            let record = KeyRecord::decode(record).map_err(read_error)?;
            let backed_up = BackupKey {
                key: key.clone(),
                value: record.value,
                version: record.version,
                fencing_token: record.fencing_token,
                expires_at: record.expires_at,
            };
            writer.push(&backed_up).map_err(read_error)?;
        }
        match page.last() {
            Some((last, _)) if page.len() == PAGE => cursor = Some(last.clone()),
            _ => break,
        }
    }
    let keys = writer.keys();
    writer.finish(applied_index).map_err(read_error)?;
    Ok(BackupEnd { keys, applied_index })
}

/// Streams a consistent view of every table into a new kept snapshot; returns its metadata and
/// its data file, open for reading. Dedup records expired at the view's clock are left out, so
/// every node's snapshot at one log index holds the same records, however far its compactions
/// got; `horizon` keeps compactions from dropping what the view must still see. The file is
/// written at most `write_rate` bytes a second ([`PacedFile`]).
fn build(
    db: &DB,
    snapshots: &SnapshotDir,
    horizon: &Arc<DedupHorizon>,
    write_rate: Option<u64>,
) -> Result<(SnapshotMeta, std::fs::File), RaftStorageError> {
    let _pin = horizon.pin();
    let view = db.snapshot();
    let clock = meta::clock(&ViewTables { db, view: &view }).map_err(read_error)?;
    let (temp, file) = snapshots.create_temp().map_err(snapshot_error)?;
    let written = (|| {
        let mut writer = SnapshotWriter::new(BufWriter::with_capacity(1 << 20, PacedFile::new(file, write_rate)))?;
        for table in Table::ALL {
            for item in view.iterator_cf_opt(cf(db, table.name()), db::bulk_scan(), IteratorMode::Start) {
                let (key, value) = item.map_err(std::io::Error::other)?;
                if table == Table::Dedup && dedup::expired(&value, clock) {
                    continue;
                }
                writer.push(table, &key, &value)?;
            }
        }
        writer.finish()?.into_inner().map_err(|e| e.into_error())?.finish()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(snapshot_error(e));
    }
    let meta_cf = cf(db, Table::Meta.name());
    let last_log_id: Option<LogId> = meta_value(view.get_cf(meta_cf, LAST_APPLIED).map_err(read_error)?)?;
    let last_membership: StoredMembership = meta_value(view.get_cf(meta_cf, MEMBERSHIP).map_err(read_error)?)?;
    let millis = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
    let snapshot_id = match last_log_id {
        Some(id) => format!("{}-{}-{millis}", id.leader_id, id.index),
        None => format!("empty-{millis}"),
    };
    let meta = SnapshotMeta { last_log_id, last_membership, snapshot_id };
    let data = snapshots.keep(&meta, &temp).map_err(snapshot_error)?;
    let file = std::fs::File::open(data).map_err(snapshot_error)?;
    Ok((meta, file))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use openraft::storage::RaftLogStorage;
    use openraft::{CommittedLeaderId, LogId};
    use statestore_statemachine::Config;
    use tokio::io::AsyncWriteExt;

    use super::*;
    use crate::dedup_retention::tests::identity;
    use crate::NodeStorage;

    fn open(dir: &Path) -> NodeStorage {
        let metrics = StorageMetrics::register(&prometheus::Registry::new()).unwrap();
        crate::open(dir, Config::default(), metrics).unwrap()
    }

    /// Every record of every state-machine table, but Raft's membership (which an install
    /// writes whether or not the source had one).
    fn dump(db: &DB) -> Vec<(Table, String, usize)> {
        let mut records = Vec::new();
        for table in Table::ALL {
            for item in db.iterator_cf(cf(db, table.name()), IteratorMode::Start) {
                let (key, value) = item.unwrap();
                if table == Table::Meta && &key[..] == MEMBERSHIP {
                    continue;
                }
                let digest = crc32fast::hash(&value) as usize ^ value.len();
                records.push((table, String::from_utf8_lossy(&key).into_owned(), digest));
            }
        }
        records
    }

    /// A state of `keys` keys (raw records) applied up to log index 42.
    fn fill(db: &DB, keys: usize) {
        for i in 0..keys {
            db.put_cf(cf(db, Table::Keys.name()), format!("key-{i:06}"), vec![i as u8; 200]).unwrap();
            db.put_cf(cf(db, Table::Expiry.name()), format!("due-{i:06}"), b"").unwrap();
        }
        let applied = Some(LogId::new(CommittedLeaderId::new(3, 1), 42));
        db.put_cf(cf(db, Table::Meta.name()), LAST_APPLIED, encode(&applied).unwrap()).unwrap();
    }

    /// The temporary table files of installs left in a node's snapshot directory.
    fn install_files_left(data_dir: &Path) -> Vec<String> {
        std::fs::read_dir(data_dir.join("snapshots"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with("install"))
            .collect()
    }

    /// `bytes` received as the leader's chunks would be: the file openraft installs from.
    async fn received(state: &mut StateStore, bytes: &[u8]) -> Box<tokio::fs::File> {
        let mut file = state.begin_receiving_snapshot().await.unwrap();
        file.write_all(bytes).await.unwrap();
        file
    }

    /// A source node of `keys` keys with a snapshot built: its directory (kept alive), the
    /// snapshot, its data file and every record it holds.
    async fn source_snapshot(keys: usize) -> (tempfile::TempDir, Snapshot, PathBuf, Vec<(Table, String, usize)>) {
        let source = tempfile::tempdir().unwrap();
        let mut from = open(source.path());
        fill(&from.reader.db, keys);
        let snapshot = from.state.get_snapshot_builder().await.build_snapshot().await.unwrap();
        let (_, data) = from.state.snapshots.current().unwrap().unwrap();
        let expected = dump(&from.reader.db);
        (source, snapshot, data, expected)
    }

    #[tokio::test]
    async fn records_are_ingested_through_several_table_files_and_none_is_left_behind() {
        let (_source, snapshot, data, expected) = source_snapshot(3_000).await;

        let dir = tempfile::tempdir().unwrap();
        let to = open(dir.path());
        let db = &to.reader.db;
        db.put_cf(cf(db, Table::Keys.name()), b"old", b"state").unwrap();
        clear_for_install(db, &snapshot.meta).unwrap();
        let options = db::external_file_options();
        let snapshots = &to.state.snapshots;
        // About 20 records of 200 bytes per file: 150 files for the keys.
        let mut ingester = Ingester::new(db, &options, snapshots, 4096, Pace::new(None));
        let mut records = RecordReader::new(std::fs::File::open(&data).unwrap()).unwrap();
        while let Some((table, key, value)) = records.next_record().unwrap() {
            ingester.put(table, &key, &value).unwrap();
        }
        ingester.finish().unwrap();
        let keys_files = db.live_files().unwrap().iter().filter(|f| f.column_family_name == Table::Keys.name()).count();
        assert!(keys_files > 100, "{keys_files} table files");
        let mut installed = dump(db);
        installed.retain(|(table, key, _)| !(*table == Table::Meta && key.contains("installing")));
        assert_eq!(installed, expected);
        let left = install_files_left(dir.path());
        assert!(left.is_empty(), "{left:?}");
    }

    /// An install held to a rate writes every record, and its table files no faster than the
    /// rate: the last file is ingested no sooner than all the records' bytes allow.
    #[tokio::test]
    async fn an_install_held_to_a_rate_writes_every_record_no_faster_than_the_rate() {
        let (_source, snapshot, data, expected) = source_snapshot(3_000).await;
        let mut records = RecordReader::new(std::fs::File::open(&data).unwrap()).unwrap();
        let mut bytes = 0;
        while let Some((_, key, value)) = records.next_record().unwrap() {
            bytes += key.len() + value.len();
        }
        let dir = tempfile::tempdir().unwrap();
        let to = open(dir.path());
        let db = &to.reader.db;
        // Two seconds of records at this rate, whatever their size.
        let rate = (bytes / 2) as u64;
        let started = std::time::Instant::now();
        install(db, &snapshot.meta, &data, &to.state.snapshots, Pace::new(Some(rate))).unwrap();
        let took = started.elapsed();
        assert_eq!(dump(db), expected);
        assert!(
            took >= std::time::Duration::from_millis(1_900),
            "{bytes} bytes at {rate} a second installed in {took:?}"
        );
        let left = install_files_left(dir.path());
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_snapshot_out_of_key_order_is_refused_and_leaves_no_table_file() {
        let dir = tempfile::tempdir().unwrap();
        let to = open(dir.path());
        let db = &to.reader.db;
        let data = dir.path().join("unordered.data");
        let mut writer = SnapshotWriter::new(std::fs::File::create(&data).unwrap()).unwrap();
        writer.push(Table::Keys, b"b", b"1").unwrap();
        writer.push(Table::Keys, b"a", b"2").unwrap();
        writer.finish().unwrap();
        let meta = SnapshotMeta { last_log_id: None, last_membership: Default::default(), snapshot_id: "x".into() };
        assert!(load_records(db, &meta, &data, &to.state.snapshots, Pace::new(None)).is_err());
        assert!(db.get_cf(cf(db, Table::Keys.name()), b"b").unwrap().is_none(), "nothing was ingested");
        let left = install_files_left(dir.path());
        assert!(left.is_empty(), "{left:?}");
    }

    /// A snapshot from an earlier version holds dedup records keyed by request, in that order:
    /// installed, they are keyed by retention (out of the order they came in) and every request
    /// is answered from them.
    #[tokio::test]
    async fn dedup_records_of_a_snapshot_from_an_earlier_version_are_installed_by_retention() {
        const T0: u64 = 1_800_000_000_000;
        let source = tempfile::tempdir().unwrap();
        let mut from = open(source.path());
        // Each request with a shorter message expiry than the one before, so that their
        // retentions fall as their request keys rise.
        let entries: Vec<LogEntry> = (1..=40)
            .map(|n| {
                let mut operation = set("k", n);
                if let Operation::Request(request) = &mut operation {
                    request.message_expiry_secs = Some(100 - u32::from(n));
                }
                proposed_at(u64::from(n), T0, vec![operation])
            })
            .collect();
        from.state.apply(entries).await.unwrap();
        let data = source.path().join("earlier.data");
        let mut writer = SnapshotWriter::new(std::fs::File::create(&data).unwrap()).unwrap();
        let db = &from.reader.db;
        for table in Table::ALL {
            let records = db.iterator_cf(cf(db, table.name()), IteratorMode::Start).map(Result::unwrap);
            if table != Table::Dedup {
                for (key, value) in records {
                    writer.push(table, &key, &value).unwrap();
                }
                continue;
            }
            let stored: Vec<Vec<u8>> = records.map(|(key, _)| key.to_vec()).collect();
            let mut by_request: Vec<Vec<u8>> = stored.iter().map(|key| key[8..].to_vec()).collect();
            by_request.sort();
            let stored_order: Vec<Vec<u8>> = stored.iter().map(|key| key[8..].to_vec()).collect();
            assert_ne!(by_request, stored_order, "the orders differ");
            for request_key in by_request {
                let key = stored.iter().find(|key| key[8..] == request_key[..]).unwrap();
                writer
                    .push_request_keyed_dedup(&request_key, &db.get_cf(cf(db, table.name()), key).unwrap().unwrap())
                    .unwrap();
            }
        }
        writer.finish().unwrap();
        let expected = dump(&from.reader.db);

        let dir = tempfile::tempdir().unwrap();
        let mut to = open(dir.path());
        let meta = SnapshotMeta {
            last_log_id: Some(LogId::new(CommittedLeaderId::new(1, 1), 40)),
            last_membership: Default::default(),
            snapshot_id: "earlier".into(),
        };
        let file = tokio::fs::File::open(&data).await.unwrap();
        to.state.install_snapshot(&meta, Box::new(file)).await.unwrap();
        let mut installed = dump(&to.reader.db);
        installed.retain(|(table, _, _)| *table != Table::Meta);
        let mut expected = expected;
        expected.retain(|(table, _, _)| *table != Table::Meta);
        assert_eq!(installed, expected);
        for n in 1..=40 {
            let reply = to.reader.dedup_lookup(&identity(n)).unwrap();
            assert!(reply.is_some(), "request {n} is answered from the dedup table");
        }
    }

    #[tokio::test]
    async fn an_install_cut_short_is_finished_when_the_node_opens() {
        let dir = tempfile::tempdir().unwrap();
        let (meta, expected) = {
            let mut storage = open(dir.path());
            let db = storage.reader.db.clone();
            fill(&db, 20_000);
            let snapshot = storage.state.get_snapshot_builder().await.build_snapshot().await.unwrap();
            let expected = dump(&db);
            // The node moves on, then an install of that snapshot stops after its first batch.
            db.put_cf(cf(&db, Table::Keys.name()), b"later", b"x").unwrap();
            db.delete_cf(cf(&db, Table::Keys.name()), b"key-000001").unwrap();
            clear_for_install(&db, &snapshot.meta).unwrap();
            assert!(dump(&db).len() == 1, "only the in-progress mark is left");
            (snapshot.meta, expected)
        };
        let storage = open(dir.path());
        let db = storage.reader.db.clone();
        assert_eq!(dump(&db), expected, "the kept snapshot was installed again on open");
        assert_eq!(
            meta_value::<Option<openraft::LogId<u64>>>(db.get_cf(cf(&db, Table::Meta.name()), LAST_APPLIED).unwrap())
                .unwrap(),
            meta.last_log_id
        );
    }

    /// A log entry at `index` proposing `operations`.
    fn proposed(index: u64, operations: Vec<Operation>) -> LogEntry {
        proposed_at(index, 1_000, operations)
    }

    /// A log entry at `index` proposing `operations` at the leader's clock `wall_clock_ms`.
    fn proposed_at(index: u64, wall_clock_ms: u64, operations: Vec<Operation>) -> LogEntry {
        let entries = operations
            .into_iter()
            .map(|operation| statestore_statemachine::Entry { operation, wall_clock_ms })
            .collect();
        LogEntry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Arc::new(statestore_statemachine::Proposal { entries })),
        }
    }

    fn enroll(node: u64, incarnation: &str) -> Operation {
        Operation::Enroll { node, incarnation: Some(incarnation.to_string()), replace: true }
    }

    fn request(correlation: u8) -> Operation {
        set("k", correlation)
    }

    fn set(key: &str, correlation: u8) -> Operation {
        Operation::Request(statestore_statemachine::ClientRequest {
            request: statestore_protocol::Request {
                command: statestore_protocol::Command::Set(statestore_protocol::Set::new(key, "v")),
                timestamp: Some(statestore_protocol::Hlc::new(1_000, 0, "c".to_string())),
                fencing_token: None,
            },
            client_id: Some("c".into()),
            identity: Some(identity(correlation)),
            message_expiry_secs: Some(10),
        })
    }

    /// Copies every file under `from` into `to` as it is on disk now: what a crash would leave
    /// of a node that is idle (its WAL written out).
    fn crash_image(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                crash_image(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), target).unwrap();
            }
        }
    }

    async fn applied_index_of(node: &mut NodeStorage) -> u64 {
        node.state.applied_state().await.unwrap().0.map_or(0, |id| id.index)
    }

    fn value_of(node: &NodeStorage, key: &str) -> Option<Vec<u8>> {
        let record = node.reader.db.get_cf(cf(&node.reader.db, Table::Keys.name()), key).unwrap()?;
        Some(KeyRecord::decode(&record).unwrap().value)
    }

    /// Apply writes skip the WAL: a crash leaves the tables as the last flush wrote them, whole
    /// batches with the log index they reached, and the log is applied again from there.
    #[tokio::test]
    async fn a_crash_leaves_the_applied_state_of_the_last_flush() {
        let dir = tempfile::tempdir().unwrap();
        let mut node = open(dir.path());
        node.state.apply([proposed(1, vec![set("a", 1)]), proposed(2, vec![set("b", 2)])]).await.unwrap();
        assert_eq!(node.reader.flush_applied().unwrap(), 2);
        node.state.apply([proposed(3, vec![set("c", 3)])]).await.unwrap();
        assert_eq!(value_of(&node, "c"), Some(b"v".to_vec()), "applied");
        node.reader.db.flush_wal(true).unwrap();

        let image = tempfile::tempdir().unwrap();
        crash_image(dir.path(), image.path());
        let mut crashed = open(image.path());
        assert_eq!(applied_index_of(&mut crashed).await, 2, "the last flushed batch");
        assert_eq!(value_of(&crashed, "b"), Some(b"v".to_vec()));
        assert_eq!(value_of(&crashed, "c"), None, "the batch after the flush is applied again from the log");
    }

    /// A request retried late in its dedup retention is answered from the dedup table when it is
    /// applied, and again when a crash makes the node apply it again from the log: compactions
    /// drop dedup records only once they expired at the clock of the state on disk, not at the
    /// applied clock, which a crash takes back.
    #[tokio::test]
    async fn a_retry_applied_again_after_a_crash_is_answered_as_the_first_time() {
        const T0: u64 = 1_800_000_000_000;
        // Retained for the message expiry (10 s) plus the grace (60 s).
        const RETAINED: u64 = 70_000;
        let dir = tempfile::tempdir().unwrap();
        let mut node = open(dir.path());
        node.state.apply([proposed_at(1, T0, vec![set("k", 1)])]).await.unwrap();
        assert_eq!(node.reader.flush_applied().unwrap(), 1);
        let version_of = |node: &NodeStorage| {
            let record = node.reader.db.get_cf(cf(&node.reader.db, Table::Keys.name()), "k").unwrap().unwrap();
            KeyRecord::decode(&record).unwrap().version
        };
        let written = version_of(&node);
        // The client retries just before the record's retention ends, then the clock moves past it.
        let later = [
            proposed_at(2, T0 + RETAINED - 1_000, vec![set("k", 1)]),
            proposed_at(3, T0 + RETAINED + 1_000, vec![set("other", 3)]),
        ];
        node.state.apply(later.clone()).await.unwrap();
        assert_eq!(version_of(&node), written, "the retry was answered from the dedup table");
        // A compaction of the request's dedup record (on disk since the flush) while entries 2
        // and 3 are still only in memory.
        let dedup = cf(&node.reader.db, Table::Dedup.name());
        let first =
            crate::dedup_retention::stored_key(T0 + RETAINED, &statestore_statemachine::dedup::key(&identity(1)));
        let mut options = rocksdb::CompactOptions::default();
        options.set_bottommost_level_compaction(rocksdb::BottommostLevelCompaction::Force);
        node.reader.db.compact_range_cf_opt(dedup, Some(&first), Some(&first), &options);
        node.reader.db.flush_wal(true).unwrap();

        let image = tempfile::tempdir().unwrap();
        crash_image(dir.path(), image.path());
        let mut crashed = open(image.path());
        assert_eq!(applied_index_of(&mut crashed).await, 1, "entries 2 and 3 are applied again");
        crashed.state.apply(later).await.unwrap();
        assert_eq!(version_of(&crashed), written, "the retry is answered from the dedup table again");

        // Once the state on disk is past the record's retention, a compaction drops it.
        node.reader.flush_applied().unwrap();
        node.reader.db.compact_range_cf_opt(dedup, Some(&first), Some(&first), &options);
        assert_eq!(node.reader.db.get_cf(dedup, &first).unwrap(), None);
    }

    /// What is applied and not on disk is counted in log entries and in operations (a request
    /// each; an entry without any counts one), and a flush brings both back to zero.
    #[tokio::test]
    async fn unflushed_entries_and_operations_are_counted_until_a_flush() {
        use crate::db::Unflushed;
        let dir = tempfile::tempdir().unwrap();
        let mut node = open(dir.path());
        let three = proposed(1, vec![set("a", 1), set("b", 2), set("c", 3)]);
        let blank = LogEntry { log_id: LogId::new(CommittedLeaderId::new(1, 1), 2), payload: EntryPayload::Blank };
        node.state.apply([three, blank]).await.unwrap();
        assert_eq!(node.reader.unflushed(), Unflushed { entries: 2, operations: 4 });
        assert_eq!(node.reader.flush_applied().unwrap(), 2);
        assert_eq!(node.reader.unflushed(), Unflushed { entries: 0, operations: 0 });
        node.state.apply([proposed(3, vec![set("d", 4)])]).await.unwrap();
        assert_eq!(node.reader.unflushed(), Unflushed { entries: 1, operations: 1 });
    }

    /// A purge of log entries whose apply is not on disk yet flushes first: after a crash the
    /// tables never need an entry the log no longer has.
    #[tokio::test]
    async fn the_log_is_never_purged_past_the_applied_state_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let mut node = open(dir.path());
        let entries: Vec<LogEntry> = (1..=5).map(|i| proposed(i, vec![set(&format!("k{i}"), i as u8)])).collect();
        node.state.apply(entries).await.unwrap();
        // As openraft does, the vote of the entries' term is saved before them.
        node.log.save_vote(&crate::types::Vote::new_committed(1, 1)).await.unwrap();
        node.log.purge(LogId::new(CommittedLeaderId::new(1, 1), 4)).await.unwrap();
        node.reader.db.flush_wal(true).unwrap();

        let image = tempfile::tempdir().unwrap();
        crash_image(dir.path(), image.path());
        let mut crashed = open(image.path());
        assert!(applied_index_of(&mut crashed).await >= 4, "the tables on disk reach the purge");
        assert_eq!(value_of(&crashed, "k4"), Some(b"v".to_vec()));
    }

    /// What a snapshot covers is on disk once it is built: openraft purges the log below it.
    #[tokio::test]
    async fn a_built_snapshot_leaves_what_it_covers_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let mut node = open(dir.path());
        node.state.apply([proposed(1, vec![set("a", 1)]), proposed(2, vec![set("b", 2)])]).await.unwrap();
        let snapshot = node.state.get_snapshot_builder().await.build_snapshot().await.unwrap();
        assert_eq!(snapshot.meta.last_log_id.map(|id| id.index), Some(2));
        node.reader.db.flush_wal(true).unwrap();

        let image = tempfile::tempdir().unwrap();
        crash_image(dir.path(), image.path());
        let mut crashed = open(image.path());
        assert_eq!(applied_index_of(&mut crashed).await, 2);
        assert_eq!(value_of(&crashed, "b"), Some(b"v".to_vec()));
    }

    #[tokio::test]
    async fn the_applied_requests_feed_names_every_applied_request_in_log_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut node = open(dir.path());
        let mut feed = node.reader.applied_requests();
        let confirm = Operation::ConfirmNotifications { through: 0 };
        let entries = [
            proposed(1, vec![request(1), confirm.clone(), request(2)]),
            proposed(2, vec![confirm]),
            proposed(3, vec![request(3)]),
        ];
        let shared = match &entries[0].payload {
            EntryPayload::Normal(proposal) => proposal.clone(),
            _ => unreachable!(),
        };
        node.state.apply(entries).await.unwrap();
        let applied = feed.try_recv().unwrap();
        let correlations: Vec<u8> = applied.identities().map(|identity| identity.correlation_data[0]).collect();
        assert_eq!(correlations, vec![1, 2, 3], "one message per apply call, requests only, in log order");
        assert!(feed.try_recv().is_err());
        assert_eq!(Arc::strong_count(&shared), 2, "the feed holds the log entry's proposal, not a copy");
        node.state.apply([proposed(4, vec![Operation::ConfirmNotifications { through: 0 }])]).await.unwrap();
        assert!(feed.try_recv().is_err(), "an apply without requests sends nothing");
    }

    #[tokio::test]
    async fn identity_reads_follow_every_apply_and_install_that_changes_them() {
        let dir = tempfile::tempdir().unwrap();
        let mut node = open(dir.path());
        assert_eq!(node.reader.cluster_id().unwrap(), None);
        assert_eq!(node.reader.enrolled(2).unwrap(), None);

        let name = Operation::NameCluster { id: "first".into(), anew: false };
        node.state.apply([proposed(1, vec![name, enroll(2, "a")])]).await.unwrap();
        assert_eq!(node.reader.cluster_id().unwrap().as_deref(), Some("first"));
        assert_eq!(node.reader.enrolled(2).unwrap().as_deref(), Some("a"));

        // An apply without identity entries leaves them; one with them changes what is read.
        node.state.apply([proposed(2, vec![Operation::ConfirmNotifications { through: 0 }])]).await.unwrap();
        node.state.apply([proposed(3, vec![enroll(2, "b"), enroll(3, "c")])]).await.unwrap();
        assert_eq!(node.reader.enrolled(2).unwrap().as_deref(), Some("b"));
        assert_eq!(node.reader.enrollments().unwrap().len(), 2);
        let renamed = Operation::NameCluster { id: "second".into(), anew: true };
        node.state.apply([proposed(4, vec![renamed])]).await.unwrap();
        assert_eq!(node.reader.cluster_id().unwrap().as_deref(), Some("second"));
        assert!(node.reader.enrollments().unwrap().is_empty(), "a cluster named anew forgets enrollments");

        // A rename applies only over the name its proposer had: of two leaders' renames proposed
        // before either was applied, the first stays.
        let rename =
            |id: &str, replaces: &str| Operation::RenameCluster { id: id.into(), replaces: Some(replaces.into()) };
        node.state.apply([proposed(5, vec![enroll(2, "e")])]).await.unwrap();
        node.state.apply([proposed(6, vec![rename("fourth", "second"), rename("other", "second")])]).await.unwrap();
        assert_eq!(node.reader.cluster_id().unwrap().as_deref(), Some("fourth"));
        assert!(node.reader.enrollments().unwrap().is_empty(), "a cluster renamed forgets enrollments");
        node.state.apply([proposed(7, vec![enroll(2, "f"), rename("late", "second")])]).await.unwrap();
        assert_eq!(node.reader.cluster_id().unwrap().as_deref(), Some("fourth"), "a stale rename is ignored");
        assert_eq!(node.reader.enrolled(2).unwrap().as_deref(), Some("f"), "a stale rename forgets nothing");

        // A snapshot of another cluster replaces them.
        let source = tempfile::tempdir().unwrap();
        let mut from = open(source.path());
        let name = Operation::NameCluster { id: "third".into(), anew: false };
        from.state.apply([proposed(8, vec![name, enroll(1, "d")])]).await.unwrap();
        let snapshot = from.state.get_snapshot_builder().await.build_snapshot().await.unwrap();
        let (_, data) = from.state.snapshots.current().unwrap().unwrap();
        let file = received(&mut node.state, &std::fs::read(data).unwrap()).await;
        node.state.install_snapshot(&snapshot.meta, file).await.unwrap();
        assert_eq!(node.reader.cluster_id().unwrap().as_deref(), Some("third"));
        assert_eq!(node.reader.enrollments().unwrap(), BTreeMap::from([(1, "d".to_string())]));
    }

    /// An install held to a rate too low for the leader's wait (here a byte a second) is
    /// raised to what finishes within that wait, and holds every record.
    #[tokio::test]
    async fn an_install_at_a_rate_too_low_for_the_leaders_wait_finishes_within_it() {
        let (_source, snapshot, data, expected) = source_snapshot(3_000).await;
        let bytes = std::fs::read(data).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut to = open(dir.path());
        let within = Duration::from_secs(2);
        to.state.set_snapshot_install_rate(Some(1), within);
        let file = received(&mut to.state, &bytes).await;
        let started = Instant::now();
        tokio::time::timeout(within * 5, to.state.install_snapshot(&snapshot.meta, file))
            .await
            .expect("the install finished within its bound")
            .unwrap();
        let took = started.elapsed();
        assert_eq!(dump(&to.reader.db), expected);
        // Held back to the bound: its records are most of the file's bytes.
        assert!(took >= within / 2, "{} bytes installed in {took:?}", bytes.len());
    }

    #[tokio::test]
    async fn a_received_snapshot_is_installed_from_its_file_and_a_damaged_one_changes_nothing() {
        let (_source, snapshot, data, expected) = source_snapshot(5_000).await;
        let bytes = std::fs::read(data).unwrap();

        let dir = tempfile::tempdir().unwrap();
        let mut to = open(dir.path());
        to.reader.db.put_cf(cf(&to.reader.db, Table::Keys.name()), b"old", b"state").unwrap();
        let old = dump(&to.reader.db);

        let mut damaged = bytes.clone();
        let middle = damaged.len() / 2;
        damaged[middle] ^= 0x40;
        let file = received(&mut to.state, &damaged).await;
        assert!(to.state.install_snapshot(&snapshot.meta, file).await.is_err(), "a damaged snapshot is refused");
        assert_eq!(dump(&to.reader.db), old, "and nothing changed");
        assert!(to.state.snapshots.current().unwrap().is_none(), "nor was it kept");

        let file = received(&mut to.state, &bytes).await;
        to.state.install_snapshot(&snapshot.meta, file).await.unwrap();
        assert_eq!(dump(&to.reader.db), expected);
        assert!(!to.reader.installing_snapshot());
        let leftovers: Vec<_> =
            std::fs::read_dir(dir.path().join("snapshots")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(leftovers.len(), 2, "current and one data file: {leftovers:?}");
    }
}
