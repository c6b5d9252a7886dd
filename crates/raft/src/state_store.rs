//! The state machine on RocksDB: applies committed entries with
//! [`statestore_statemachine::StateMachine`], builds and installs snapshots.
//!
//! Each call of apply commits one RocksDB write batch holding everything the entries changed
//! (keys, expiry index, registrations, dedup, outbox, clock and last version) together with the
//! last applied log id and the membership, so a crash never leaves the state and the applied
//! index apart.

use std::io::Cursor;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use openraft::storage::RaftStateMachine;
use openraft::{AnyError, EntryPayload, OptionalSend, RaftSnapshotBuilder, StorageIOError};
use rocksdb::{IteratorMode, WriteBatch, DB};
use serde::de::DeserializeOwned;
use statestore_statemachine::{Operation, Overlay, StateMachine, Table};
use tokio::sync::broadcast;

use crate::db::{add_to, cf, synced, Tables};
use crate::metrics::StorageMetrics;
use crate::snapshot::{records, SnapshotDir, SnapshotWriter};
use crate::types::{
    ApplyResult, LogEntry, LogId, RaftStorageError, Snapshot, SnapshotMeta, StoredMembership, TypeConfig,
};
use crate::wire::{decode, encode};
use crate::AppliedRequests;

/// Raft's own keys in the state-machine meta table, beside the state machine's.
const LAST_APPLIED: &[u8] = b"raft_last_applied";
const MEMBERSHIP: &[u8] = b"raft_membership";

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
}

impl StateStore {
    pub(crate) fn new(
        db: Arc<DB>,
        machine: StateMachine,
        snapshots: SnapshotDir,
        metrics: StorageMetrics,
        applied_requests: broadcast::Sender<AppliedRequests>,
    ) -> Self {
        StateStore { db, machine, snapshots, metrics, applied_requests }
    }
}

impl RaftStateMachine<TypeConfig> for StateStore {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), RaftStorageError> {
        let meta = cf(&self.db, Table::Meta.name());
        let last_applied = meta_value(self.db.get_cf(meta, LAST_APPLIED).map_err(read_error)?)?;
        let membership = meta_value(self.db.get_cf(meta, MEMBERSHIP).map_err(read_error)?)?;
        Ok((last_applied, membership))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<ApplyResult>, RaftStorageError>
    where
        I: IntoIterator<Item = LogEntry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let started = Instant::now();
        let tables = Tables { db: &self.db };
        let mut overlay = Overlay::new(&tables);
        let mut results = Vec::new();
        let mut last_applied = None;
        let mut membership = None;
        let mut identities = Vec::new();
        for entry in entries {
            last_applied = Some(entry.log_id);
            let applied = match entry.payload {
                EntryPayload::Blank => Vec::new(),
                EntryPayload::Normal(proposal) => {
                    identities.extend(proposal.entries.iter().filter_map(|entry| match &entry.operation {
                        Operation::Request(request) => request.identity.clone(),
                        _ => None,
                    }));
                    proposal
                        .entries
                        .iter()
                        .map(|entry| self.machine.apply(&mut overlay, entry))
                        .collect::<Result<_, _>>()
                        .map_err(write_error)?
                }
                EntryPayload::Membership(config) => {
                    membership = Some(StoredMembership::new(Some(entry.log_id), config));
                    Vec::new()
                }
            };
            results.push(ApplyResult { applied });
        }
        if last_applied.is_none() {
            return Ok(results);
        }
        let mut batch = WriteBatch::default();
        add_to(&mut batch, &self.db, overlay.into_batch());
        let meta = cf(&self.db, Table::Meta.name());
        batch.put_cf(meta, LAST_APPLIED, encode(&last_applied).map_err(write_error)?);
        if let Some(membership) = membership {
            batch.put_cf(meta, MEMBERSHIP, encode(&membership).map_err(write_error)?);
        }
        // Not synced: the log entries are on disk already and are applied again after a crash.
        self.db.write(batch).map_err(write_error)?;
        self.metrics.apply_seconds.observe(started.elapsed().as_secs_f64());
        if !identities.is_empty() {
            // No subscriber (no MQTT front end) is not an error.
            let _ = self.applied_requests.send(Arc::new(identities));
        }
        Ok(results)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        SnapshotBuilder { db: self.db.clone(), snapshots: self.snapshots.clone(), metrics: self.metrics.clone() }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, RaftStorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), RaftStorageError> {
        let data = snapshot.into_inner();
        let db = self.db.clone();
        let snapshots = self.snapshots.clone();
        let snapshot_meta = meta.clone();
        // Off the async workers: checking, writing and fsyncing a large snapshot takes seconds.
        tokio::task::spawn_blocking(move || {
            let data = install(&db, &snapshot_meta, data)?;
            snapshots.save(&snapshot_meta, &data).map_err(snapshot_error)
        })
        .await
        .map_err(snapshot_error)??;
        self.metrics.snapshots.with_label_values(&["installed"]).inc();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, RaftStorageError> {
        let snapshots = self.snapshots.clone();
        let kept = tokio::task::spawn_blocking(move || snapshots.load())
            .await
            .map_err(snapshot_error)?
            .map_err(|e| StorageIOError::read_snapshot(None, AnyError::error(e.to_string())))?;
        Ok(kept.map(|(meta, data)| Snapshot { meta, snapshot: Box::new(Cursor::new(data)) }))
    }
}

/// Replaces every state-machine table with the snapshot's records in one synced batch, so the
/// node has either its old state or the snapshot's, never a mix.
fn install(db: &DB, meta: &SnapshotMeta, data: Vec<u8>) -> Result<Vec<u8>, RaftStorageError> {
    let records = records(&data).map_err(snapshot_error)?;
    let mut batch = WriteBatch::default();
    for table in Table::ALL {
        let cf = cf(db, table.name());
        for item in db.iterator_cf(cf, IteratorMode::Start) {
            let (key, _) = item.map_err(read_error)?;
            batch.delete_cf(cf, key);
        }
    }
    for (table, key, value) in records {
        batch.put_cf(cf(db, table.name()), key, value);
    }
    let meta_cf = cf(db, Table::Meta.name());
    batch.put_cf(meta_cf, LAST_APPLIED, encode(&meta.last_log_id).map_err(write_error)?);
    batch.put_cf(meta_cf, MEMBERSHIP, encode(&meta.last_membership).map_err(write_error)?);
    db.write_opt(batch, &synced()).map_err(write_error)?;
    Ok(data)
}

/// Builds a snapshot from a consistent view of the state machine.
pub struct SnapshotBuilder {
    db: Arc<DB>,
    snapshots: SnapshotDir,
    metrics: StorageMetrics,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot, RaftStorageError> {
        let started = Instant::now();
        let db = self.db.clone();
        let snapshots = self.snapshots.clone();
        let (meta, data) = tokio::task::spawn_blocking(move || {
            let (meta, data) = build(&db)?;
            snapshots.save(&meta, &data).map_err(snapshot_error)?;
            Ok::<_, RaftStorageError>((meta, data))
        })
        .await
        .map_err(snapshot_error)??;
        self.metrics.snapshot_build_seconds.observe(started.elapsed().as_secs_f64());
        self.metrics.snapshots.with_label_values(&["built"]).inc();
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(data)) })
    }
}

fn build(db: &DB) -> Result<(SnapshotMeta, Vec<u8>), RaftStorageError> {
    let view = db.snapshot();
    let mut writer = SnapshotWriter::default();
    for table in Table::ALL {
        for item in view.iterator_cf(cf(db, table.name()), IteratorMode::Start) {
            let (key, value) = item.map_err(read_error)?;
            writer.push(table, &key, &value);
        }
    }
    let meta_cf = cf(db, Table::Meta.name());
    let last_log_id: Option<LogId> = meta_value(view.get_cf(meta_cf, LAST_APPLIED).map_err(read_error)?)?;
    let last_membership: StoredMembership = meta_value(view.get_cf(meta_cf, MEMBERSHIP).map_err(read_error)?)?;
    let millis = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
    let snapshot_id = match last_log_id {
        Some(id) => format!("{}-{}-{millis}", id.leader_id, id.index),
        None => format!("empty-{millis}"),
    };
    Ok((SnapshotMeta { last_log_id, last_membership, snapshot_id }, writer.finish()))
}
