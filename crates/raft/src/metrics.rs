//! Storage metrics: how long the log takes to reach the disk, how long apply and snapshots take,
//! and how much room the disk has left.

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{exponential_buckets, Histogram, HistogramOpts, IntCounterVec, IntGauge, Opts, Registry};

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

/// The free and the whole space of the filesystem that holds the data directory, read when the
/// metrics are gathered. A node whose disk fills stops (exit code 4), so operators alert on it
/// before that.
pub struct DiskSpace {
    path: PathBuf,
    available: IntGauge,
    size: IntGauge,
}

impl DiskSpace {
    /// Space of the filesystem under `path`, registered in `registry`.
    pub fn register(registry: &Registry, path: &Path) -> prometheus::Result<()> {
        let space = DiskSpace {
            path: path.to_path_buf(),
            available: IntGauge::new(
                "statestore_disk_available_bytes",
                "Bytes free for this node on the filesystem of its data directory",
            )?,
            size: IntGauge::new("statestore_disk_size_bytes", "Size of the filesystem of the data directory")?,
        };
        registry.register(Box::new(space))
    }
}

impl Collector for DiskSpace {
    fn desc(&self) -> Vec<&Desc> {
        self.available.desc().into_iter().chain(self.size.desc()).collect()
    }

    /// Nothing when the filesystem cannot be asked (the directory is gone): a missing series,
    /// not a wrong number.
    fn collect(&self) -> Vec<MetricFamily> {
        let Ok((available, size)) = filesystem_space(&self.path) else {
            return Vec::new();
        };
        self.available.set(i64::try_from(available).unwrap_or(i64::MAX));
        self.size.set(i64::try_from(size).unwrap_or(i64::MAX));
        self.available.collect().into_iter().chain(self.size.collect()).collect()
    }
}

/// Bytes available to an unprivileged user, and bytes in all, of the filesystem under `path`.
fn filesystem_space(path: &Path) -> io::Result<(u64, u64)> {
    let name = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `name` is a NUL-terminated path and `stat` points to writable memory of the right
    // size; statvfs fills it completely when it returns 0.
    if unsafe { libc::statvfs(name.as_ptr(), stat.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: initialized by the successful call above.
    let stat = unsafe { stat.assume_init() };
    let block = stat.f_frsize;
    Ok((stat.f_bavail.saturating_mul(block), stat.f_blocks.saturating_mul(block)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_space_of_the_data_directory_disk_is_gathered_and_a_missing_directory_gives_none() {
        let dir = tempfile::tempdir().unwrap();
        let registry = Registry::new();
        DiskSpace::register(&registry, dir.path()).unwrap();
        let value = |families: &[MetricFamily], name: &str| {
            families.iter().find(|f| f.name() == name).map(|f| f.get_metric()[0].get_gauge().get_value())
        };
        let families = registry.gather();
        let (available, size) =
            (value(&families, "statestore_disk_available_bytes"), value(&families, "statestore_disk_size_bytes"));
        let (Some(available), Some(size)) = (available, size) else { panic!("{families:?}") };
        assert!(size > 0.0 && available <= size, "{available} of {size}");
        let (expected, _) = filesystem_space(dir.path()).unwrap();
        // Other processes write meanwhile: within 1 GiB.
        assert!((available - expected as f64).abs() < (1u64 << 30) as f64, "{available} against {expected}");

        let gone = dir.path().join("gone");
        let registry = Registry::new();
        DiskSpace::register(&registry, &gone).unwrap();
        assert!(registry.gather().is_empty());
    }
}
