//! The node's one RocksDB: the Raft metadata (vote, committed index, purge mark) and the
//! state-machine tables, each in its own column family. The Raft log itself lives in files of
//! its own ([`crate::log_files`]).
//!
//! Only the Raft metadata goes through the write-ahead log. The state machine's writes skip it:
//! every one of them is derived from log entries, so the log is their durable copy. They reach
//! the disk when RocksDB flushes the memtables, and flushes are atomic across column families, so
//! what a crash leaves of the state-machine tables is always the state as of one applied batch:
//! a node that restarts applies the log again from there (openraft re-applies the committed
//! entries when it starts). Two rules keep the log able to do that: the log is never purged past
//! what the state-machine tables hold on disk ([`AppliedOnDisk`]), and a clean stop flushes.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamily, ColumnFamilyDescriptor, DBRecoveryMode, Direction, Env, FlushOptions,
    IteratorMode, Options, ReadOptions, SnapshotWithThreadMode, WriteBatch, WriteOptions, DB,
};
use statestore_statemachine::storage::ScanPage;
use statestore_statemachine::{Batch, StorageError, StorageRead, Table};

use crate::dedup_retention::{self, DedupHorizon, DedupIndex, ExpiredDedupFilterFactory};

/// Where earlier versions kept the Raft log (log index, u64 BE → a bincode-encoded entry). A
/// node that finds entries here moves them to the log's files when it opens; it stays empty.
pub const LEGACY_LOG_CF: &str = "raft_log";
/// Vote, committed log id, last purged log id.
pub const RAFT_META_CF: &str = "raft_meta";

/// Every column family of the database, in a fixed order.
pub fn column_families() -> Vec<&'static str> {
    let mut names = vec![LEGACY_LOG_CF, RAFT_META_CF];
    names.extend(Table::ALL.iter().map(|table| table.name()));
    names
}

/// Column families earlier versions kept, dropped when a database is opened.
const RETIRED_CFS: [&str; 1] = ["sm_dedup_expiry"];

/// Memtable bytes of all column families together before RocksDB flushes.
pub const MEMTABLE_BUDGET: usize = 64 << 20;
/// The block cache every column family shares.
pub const BLOCK_CACHE_BYTES: usize = 64 << 20;
/// Bloom filter bits per key of every table file (about 1% false positives).
pub const BLOOM_BITS_PER_KEY: f64 = 10.0;
/// The memtable bloom filter of the dedup and keys tables, as a fraction of the memtable's bytes:
/// about 13 bits per record of a full memtable of small records (1.3 MiB per memtable).
pub const MEMTABLE_BLOOM_RATIO: f64 = 0.02;

/// Opens (or creates) the database at `path` with every column family. Compactions of the dedup
/// table drop records expired at `dedup_horizon`, and a dedup table an earlier version keyed by
/// request is keyed by retention (see [`crate::dedup_retention`]).
pub fn open(path: &Path, dedup_horizon: &Arc<DedupHorizon>) -> Result<Arc<DB>, rocksdb::Error> {
    let mut options = Options::default();
    options.create_if_missing(true);
    options.create_missing_column_families(true);
    // The Raft metadata goes through the WAL (votes and purge marks synced); the state
    // machine's writes skip it.
    options.set_max_total_wal_size(256 << 20);
    // A flush writes every column family's memtable as of one moment: the state-machine tables
    // on disk always hold whole apply batches, the same ones, with the log entries they came
    // from (see the module's documentation).
    options.set_atomic_flush(true);
    // A damaged WAL stops the open instead of being cut at the damage (RocksDB's default,
    // point-in-time recovery, drops every record after it, fsynced ones included). Only an
    // incomplete last record is tolerated: a write torn by a crash was never synced, so never
    // acknowledged.
    options.set_wal_recovery_mode(DBRecoveryMode::TolerateCorruptedTailRecords);
    options.set_paranoid_checks(true);
    // Flushes and compactions sync their files as they go instead of leaving hundreds of MiB of
    // dirty pages behind: on ext4 an fsync of the Raft log can wait for such pages, and the
    // leader's Raft core waits for its log fsync (openraft 0.9), heartbeats included.
    options.set_bytes_per_sync(1 << 20);
    // Memory is bounded for the whole database, not per column family: ten column families with
    // RocksDB's defaults (64 MiB memtables, a block cache each) could hold over a GiB.
    options.set_db_write_buffer_size(MEMTABLE_BUDGET);
    // Compactions run at the lowest CPU and I/O priority: on a busy node they yield to the
    // threads that serve requests and to the WAL fsync. Flushes keep their priority, since a
    // memtable that cannot flush stalls writes.
    let mut env = Env::new()?;
    env.lower_thread_pool_cpu_priority();
    env.lower_thread_pool_io_priority();
    options.set_env(&env);
    let cache = Cache::new_lru_cache(BLOCK_CACHE_BYTES);
    let mut table = table_format();
    table.set_block_cache(&cache);
    // Index and filter blocks are held by each open table file, outside the block cache, so a
    // point read never reads one back from its file. In the cache they were dropped over and
    // over: the cache is split into 64 shards of 1 MiB, a table file's index block is hundreds
    // of KiB (a dedup file of tens of MiB, its keys in no order), and late in a 1 M-key fill the
    // dedup lookups that a filter let through read and decompressed one every time (about 4% of
    // a node's CPU there). Held this way they take about 1% of the table files' bytes.
    table.set_cache_index_and_filter_blocks(false);
    let mut dedup_table = BlockBasedOptions::default();
    dedup_table.set_block_cache(&cache);
    dedup_table.set_cache_index_and_filter_blocks(false);
    // Every column family on disk must be opened, retired ones included, before they can go.
    let retired: Vec<String> = DB::list_cf(&options, path)
        .unwrap_or_default()
        .into_iter()
        .filter(|name| RETIRED_CFS.contains(&name.as_str()))
        .collect();
    let descriptors = column_families()
        .into_iter()
        .map(|name| {
            let mut cf_options = Options::default();
            cf_options.set_block_based_table_factory(&table);
            if name == Table::Dedup.name() {
                cf_options.set_compaction_filter_factory(ExpiredDedupFilterFactory::new(dedup_horizon.clone()));
                // No bloom filters: the dedup index in memory answers the lookups that would
                // miss, so the table is read only for a record the index knows of.
                cf_options.set_block_based_table_factory(&dedup_table);
            }
            if name == Table::Keys.name() {
                // A whole-key bloom filter on the memtable: every apply that writes looks up its
                // key, and most of those lookups miss the memtable (a key not written lately),
                // which without it costs a skip-list search of the whole memtable each.
                cf_options.set_memtable_prefix_bloom_ratio(MEMTABLE_BLOOM_RATIO);
                cf_options.set_memtable_whole_key_filtering(true);
            }
            ColumnFamilyDescriptor::new(name, cf_options)
        })
        .chain(retired.iter().map(|name| ColumnFamilyDescriptor::new(name, Options::default())));
    let mut db = DB::open_cf_descriptors(&options, path, descriptors)?;
    for name in &retired {
        db.drop_cf(name)?;
    }
    dedup_retention::key_by_retention(&db)?;
    Ok(Arc::new(db))
}

/// The format of every table file: block based, with a bloom filter. Most point reads miss (a
/// new key's record, a new request's dedup entry); without filters a miss reads an index block
/// of every L0 file and every level, so a growing store slows each write; with 10 bits per key a
/// miss almost never touches a data block.
fn table_format() -> BlockBasedOptions {
    let mut table = BlockBasedOptions::default();
    table.set_bloom_filter(BLOOM_BITS_PER_KEY, false);
    table
}

/// Options for writing table files outside the database (`SstFileWriter`) to ingest into it:
/// the same format as the files RocksDB writes itself.
pub fn external_file_options() -> Options {
    let mut options = Options::default();
    options.set_block_based_table_factory(&table_format());
    options
}

/// Read options of a scan over a whole table (a snapshot build): it leaves the block cache to
/// the blocks point reads need instead of cycling every block of the table through it, and it
/// reads ahead.
pub fn bulk_scan() -> ReadOptions {
    let mut options = ReadOptions::default();
    options.fill_cache(false);
    options.set_readahead_size(2 << 20);
    options
}

pub fn cf<'a>(db: &'a DB, name: &str) -> &'a ColumnFamily {
    db.cf_handle(name).unwrap_or_else(|| panic!("column family {name} is created when the database opens"))
}

/// Options for a write that must be on disk before the call returns.
pub fn synced() -> WriteOptions {
    let mut options = WriteOptions::default();
    options.set_sync(true);
    options
}

/// Options of the state machine's writes: not written to the WAL (see the module's
/// documentation).
pub fn unlogged() -> WriteOptions {
    let mut options = WriteOptions::default();
    options.disable_wal(true);
    options
}

/// Adds the deletion of every record `cf` holds now to `batch`: one range delete up to its last
/// key, and that key.
pub fn add_clear(batch: &mut WriteBatch, db: &DB, cf: &ColumnFamily) -> Result<(), rocksdb::Error> {
    if let Some((last, _)) = db.iterator_cf(cf, IteratorMode::End).next().transpose()? {
        batch.delete_range_cf(cf, &[][..], &last[..]);
        batch.delete_cf(cf, &last);
    }
    Ok(())
}

/// Flushes every column family's memtable to table files, as one atomic flush, and waits for it.
pub fn flush_all(db: &DB) -> Result<(), rocksdb::Error> {
    let handles: Vec<&ColumnFamily> = column_families().into_iter().map(|name| cf(db, name)).collect();
    let mut options = FlushOptions::default();
    options.set_wait(true);
    db.flush_cfs_opt(&handles, &options)
}

/// How far the applied state is on disk in the state-machine tables (their writes skip the WAL,
/// so an applied batch is on disk only once a flush wrote it): the last log index a flush wrote,
/// the state-machine clock it had reached, and how many log entries and operations were applied
/// since. The log is purged only up to that index: after a crash the tables are back at it or
/// later, and the log entries after it are applied again, so what was applied since is what a
/// node killed now would apply again when it starts. Expired dedup records are dropped only up
/// to that clock ([`crate::dedup_retention`]).
#[derive(Debug, Default)]
pub struct AppliedOnDisk {
    /// The last log index on disk.
    index: AtomicU64,
    /// The state-machine clock of the applied state on disk (ms since the epoch).
    clock: AtomicU64,
    /// The last log index applied.
    applied_index: AtomicU64,
    /// Operations applied since the database opened.
    applied: AtomicU64,
    /// Of those, the ones applied before the last flush began.
    flushed: AtomicU64,
}

/// What is applied and not yet on disk ([`AppliedOnDisk::unflushed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unflushed {
    pub entries: u64,
    pub operations: u64,
}

impl AppliedOnDisk {
    pub fn get(&self) -> u64 {
        self.index.load(Ordering::Acquire)
    }

    /// The state-machine clock of the applied state on disk: a node killed now comes back with
    /// its state at this clock or later, and applies the log again from there.
    pub fn clock(&self) -> u64 {
        self.clock.load(Ordering::Acquire)
    }

    /// Counts an apply up to log index `index` of `operations` operations (each request or
    /// housekeeping operation of a log entry, and each entry without any).
    pub fn count_applied(&self, index: u64, operations: u64) {
        self.applied.fetch_add(operations, Ordering::AcqRel);
        self.applied_index.fetch_max(index, Ordering::AcqRel);
    }

    /// Operations applied so far, for [`AppliedOnDisk::reached`] once a flush that begins now
    /// has written them.
    pub fn applied_operations(&self) -> u64 {
        self.applied.load(Ordering::Acquire)
    }

    /// What is applied and not yet on disk.
    pub fn unflushed(&self) -> Unflushed {
        Unflushed {
            entries: self.applied_index.load(Ordering::Acquire).saturating_sub(self.get()),
            operations: self.applied_operations().saturating_sub(self.flushed.load(Ordering::Acquire)),
        }
    }

    /// Records that everything applied up to log index `index` and state-machine clock
    /// `clock`, `operations` operations in all ([`AppliedOnDisk::applied_operations`]), is on
    /// disk.
    pub fn reached(&self, index: u64, clock: u64, operations: u64) {
        self.index.fetch_max(index, Ordering::AcqRel);
        self.clock.fetch_max(clock, Ordering::AcqRel);
        self.applied_index.fetch_max(index, Ordering::AcqRel);
        self.flushed.fetch_max(operations, Ordering::AcqRel);
    }
}

pub fn backend(error: rocksdb::Error) -> StorageError {
    StorageError::Backend(error.into_string())
}

/// The state-machine tables of a database, read directly: every read sees the latest applied
/// batch, and a batch is never half visible. Dedup records are stored by retention and read
/// only through their index ([`WithDedup`]).
#[derive(Clone, Copy)]
pub struct Tables<'a> {
    pub db: &'a DB,
}

/// A read of the dedup table by request where its index is not at hand.
fn dedup_without_index() -> StorageError {
    StorageError::Backend("dedup records are stored by retention and read only through their index".into())
}

impl StorageRead for Tables<'_> {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        if table == Table::Dedup {
            return Err(dedup_without_index());
        }
        self.db.get_cf(cf(self.db, table.name()), key).map_err(backend)
    }

    fn scan(&self, table: Table, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<ScanPage, StorageError> {
        if table == Table::Dedup {
            return Err(dedup_without_index());
        }
        let start = scan_start(prefix, after);
        let iter = self.db.iterator_cf(cf(self.db, table.name()), IteratorMode::From(&start, Direction::Forward));
        scan_page(iter, prefix, limit)
    }
}

/// The state-machine tables as a RocksDB snapshot saw them, but for the dedup table, which is
/// read only as the latest state ([`WithDedup`]).
pub struct ViewTables<'a> {
    pub db: &'a DB,
    pub view: &'a SnapshotWithThreadMode<'a, DB>,
}

impl StorageRead for ViewTables<'_> {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        if table == Table::Dedup {
            return Err(dedup_without_index());
        }
        self.view.get_cf(cf(self.db, table.name()), key).map_err(backend)
    }

    fn scan(&self, table: Table, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<ScanPage, StorageError> {
        if table == Table::Dedup {
            return Err(dedup_without_index());
        }
        let start = scan_start(prefix, after);
        let iter = self.view.iterator_cf(cf(self.db, table.name()), IteratorMode::From(&start, Direction::Forward));
        scan_page(iter, prefix, limit)
    }
}

/// [`Tables`] with dedup records looked up by request through their index.
#[derive(Clone, Copy)]
pub struct WithDedup<'a> {
    pub tables: Tables<'a>,
    pub index: &'a DedupIndex,
}

impl<'a> WithDedup<'a> {
    pub fn new(db: &'a DB, index: &'a DedupIndex) -> Self {
        WithDedup { tables: Tables { db }, index }
    }
}

impl StorageRead for WithDedup<'_> {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        if table == Table::Dedup {
            return dedup_retention::get(self.tables.db, self.index, key).map_err(backend);
        }
        self.tables.get(table, key)
    }

    fn scan(&self, table: Table, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<ScanPage, StorageError> {
        self.tables.scan(table, prefix, after, limit)
    }
}

/// Where a scan of `prefix` after `after` starts reading.
fn scan_start(prefix: &[u8], after: Option<&[u8]>) -> Vec<u8> {
    match after {
        Some(after) if after >= prefix => {
            let mut next = after.to_vec();
            next.push(0);
            next
        }
        _ => prefix.to_vec(),
    }
}

/// Up to `limit` entries from `iter` while their keys start with `prefix`.
fn scan_page(
    iter: impl Iterator<Item = Result<(Box<[u8]>, Box<[u8]>), rocksdb::Error>>,
    prefix: &[u8],
    limit: usize,
) -> Result<ScanPage, StorageError> {
    let mut page = Vec::new();
    if limit == 0 {
        return Ok(page);
    }
    for item in iter {
        let (key, value) = item.map_err(backend)?;
        if !key.starts_with(prefix) {
            break;
        }
        page.push((key.into_vec(), value.into_vec()));
        if page.len() == limit {
            break;
        }
    }
    Ok(page)
}

/// Adds a state-machine [`Batch`] to a RocksDB write batch; dedup records are keyed by retention
/// and noted in `dedup`.
pub fn add_to(write_batch: &mut WriteBatch, db: &DB, dedup: &DedupIndex, batch: Batch) {
    for (table, key, value) in batch.writes {
        if table == Table::Dedup {
            dedup_retention::add_write(db, dedup, write_batch, &key, value.as_deref());
            continue;
        }
        let cf = cf(db, table.name());
        match value {
            Some(value) => write_batch.put_cf(cf, key, value),
            None => write_batch.delete_cf(cf, key),
        }
    }
}

#[cfg(test)]
mod tests {
    use statestore_statemachine::{MemStorage, Storage};

    use super::*;

    /// The RocksDB tables answer scans exactly as the in-memory storage the state machine is
    /// tested against.
    #[test]
    fn scans_match_the_in_memory_storage() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(dir.path(), &Default::default()).unwrap();
        let mut mem = MemStorage::new();
        let keys: Vec<&[u8]> = vec![b"", b"a", b"a\0", b"ab", b"abc", b"ab\xff", b"b", b"\xff\xff", b"abd"];
        let batch = Batch {
            writes: keys
                .iter()
                .flat_map(|k| {
                    [(Table::Keys, k.to_vec(), Some(k.to_vec())), (Table::Meta, k.to_vec(), Some(b"m".to_vec()))]
                })
                .collect(),
        };
        let mut write_batch = WriteBatch::default();
        let dedup = DedupIndex::default();
        add_to(&mut write_batch, &db, &dedup, batch.clone());
        db.write(write_batch).unwrap();
        mem.write(batch).unwrap();
        let tables = Tables { db: &db };
        let probes: Vec<&[u8]> = vec![b"", b"a", b"ab", b"abc", b"b", b"c", b"\xff"];
        for prefix in &probes {
            for after in probes.iter().map(|p| Some(*p)).chain([None]) {
                for limit in [0, 1, 2, 100] {
                    assert_eq!(
                        tables.scan(Table::Keys, prefix, after, limit).unwrap(),
                        mem.scan(Table::Keys, prefix, after, limit).unwrap(),
                        "prefix {prefix:?} after {after:?} limit {limit}"
                    );
                }
            }
        }
        assert_eq!(tables.get(Table::Meta, b"ab").unwrap(), Some(b"m".to_vec()));
        assert_eq!(tables.get(Table::Meta, b"zz").unwrap(), None);
    }

    /// A point read reads at most its data block from a table file, never the file's index
    /// block, however large that is. Here the index is over a MiB (1,500 keys of 1 KiB, each
    /// record alone in its data block), more than a shard of the block cache holds: an index
    /// kept in the cache would be dropped after every read and read again by the next.
    #[test]
    fn a_point_read_reads_only_its_data_block() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(dir.path(), &Default::default()).unwrap();
        let keys = cf(&db, Table::Keys.name());
        let key = |n: u32| [vec![b'k'; 1024], n.to_be_bytes().to_vec()].concat();
        for n in 0..1_500 {
            db.put_cf(keys, key(n), vec![b'v'; 4096]).unwrap();
        }
        // Rewritten into a file of the last level, as most of a large table is.
        let mut compaction = rocksdb::CompactOptions::default();
        compaction.set_bottommost_level_compaction(rocksdb::BottommostLevelCompaction::Force);
        db.compact_range_cf_opt(keys, None::<&[u8]>, None::<&[u8]>, &compaction);
        assert_eq!(db.property_int_value_cf(keys, "rocksdb.num-files-at-level0").unwrap(), Some(0));
        assert!(db.get_cf(keys, key(0)).unwrap().is_some());

        rocksdb::perf::set_perf_stats(rocksdb::perf::PerfStatsLevel::EnableCount);
        let mut reads = rocksdb::perf::PerfContext::default();
        reads.reset();
        for n in 1..=200 {
            assert!(db.get_cf(keys, key(n)).unwrap().is_some());
        }
        let blocks = reads.metric(rocksdb::perf::PerfMetric::BlockReadCount);
        rocksdb::perf::set_perf_stats(rocksdb::perf::PerfStatsLevel::Disable);
        assert_eq!(blocks, 200, "one data block read per lookup and nothing else");
    }
}
