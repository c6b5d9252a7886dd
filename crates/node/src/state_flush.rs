//! The applied state reaches the disk in bounded steps.
//!
//! The state machine's writes skip RocksDB's WAL (`statestore_raft::db`): they reach the disk
//! when the memtables are flushed, which RocksDB does on its own only once they fill
//! (`db::MEMTABLE_BUDGET`, 64 MiB), and the node does when it builds a snapshot or stops. A node
//! killed in between applies again, from its log, everything applied since the last flush before
//! it is ready: with small writes, minutes of them. So the node flushes once
//! `--flush-after-entries` log entries or `--flush-after-operations` operations were applied
//! since the last flush, which bounds what a crash leaves to apply again, whatever the size of
//! the store. Both count: an entry costs its own reading and writing whatever it holds (one
//! request each at low concurrency), and one entry can hold up to 1,024 requests.

use std::time::Duration;

use statestore_raft::StateReader;

/// How often the policy looks at what is applied and not yet on disk.
const CHECK_EVERY: Duration = Duration::from_millis(200);
/// How long the policy waits after a flush failed before it tries again.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// When the applied state is flushed: once this many log entries, or this many operations, are
/// applied and not on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushAfter {
    pub entries: u64,
    pub operations: u64,
}

/// Flushes the applied state whenever as much as `after` says is not on disk.
pub(crate) async fn flush_applied_state(reader: StateReader, after: FlushAfter) {
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let unflushed = reader.unflushed();
        if unflushed.entries < after.entries && unflushed.operations < after.operations {
            continue;
        }
        let flushing = reader.clone();
        let flushed = tokio::task::spawn_blocking(move || flushing.flush_applied().map_err(|e| e.to_string()))
            .await
            .unwrap_or_else(|e| Err(e.to_string()));
        match flushed {
            Ok(index) => tracing::debug!(?unflushed, on_disk = index, "wrote the applied state to disk"),
            Err(error) => {
                tracing::warn!(%error, ?unflushed, "could not write the applied state to disk; trying again");
                tokio::time::sleep(RETRY_AFTER).await;
            }
        }
    }
}
