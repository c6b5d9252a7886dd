//! Storage metrics: how long the log takes to reach the disk, how long apply and snapshots take.

use prometheus::{exponential_buckets, Histogram, HistogramOpts, IntCounterVec, Opts, Registry};

/// Durations and counts observed by the log store and the state-machine store.
#[derive(Clone)]
pub struct StorageMetrics {
    /// One WAL fsync, which may cover several appends (group commit).
    pub wal_fsync_seconds: Histogram,
    /// One call of apply, which may cover several log entries.
    pub apply_seconds: Histogram,
    /// Building a snapshot from a consistent view of the state machine.
    pub snapshot_build_seconds: Histogram,
    /// Snapshots built here (`kind="built"`) and received from a leader (`kind="installed"`).
    pub snapshots: IntCounterVec,
}

impl StorageMetrics {
    /// Metrics registered in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<StorageMetrics> {
        let metrics = StorageMetrics::new()?;
        registry.register(Box::new(metrics.wal_fsync_seconds.clone()))?;
        registry.register(Box::new(metrics.apply_seconds.clone()))?;
        registry.register(Box::new(metrics.snapshot_build_seconds.clone()))?;
        registry.register(Box::new(metrics.snapshots.clone()))?;
        Ok(metrics)
    }

    /// Metrics not registered anywhere, e.g. for tests.
    pub fn new() -> prometheus::Result<StorageMetrics> {
        // 100 µs .. ~3.3 s
        let fast = exponential_buckets(0.0001, 2.0, 16)?;
        Ok(StorageMetrics {
            wal_fsync_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "statestore_disk_wal_fsync_duration_seconds",
                    "Duration of one fsync of the Raft log",
                )
                .buckets(fast.clone()),
            )?,
            apply_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "statestore_apply_duration_seconds",
                    "Duration of applying one batch of committed log entries",
                )
                .buckets(fast),
            )?,
            snapshot_build_seconds: Histogram::with_opts(
                HistogramOpts::new("statestore_snapshot_build_duration_seconds", "Duration of building one snapshot")
                    .buckets(exponential_buckets(0.001, 2.0, 16)?),
            )?,
            snapshots: IntCounterVec::new(
                Opts::new("statestore_snapshots_total", "Snapshots built on this node or installed from a leader"),
                &["kind"],
            )?,
        })
    }
}
