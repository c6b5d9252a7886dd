//! Dedup records on disk: keyed by the end of their retention, found through an index in memory,
//! and dropped once expired.
//!
//! The state machine keys a dedup record by its request (response topic and correlation data,
//! `dedup::key`), and most of those keys are random. On disk the record is keyed by when its
//! retention ends, then by its request ([`stored_key`]): records are written in about the order
//! their retentions end, so the table's files hardly overlap, compactions move them down whole
//! instead of merging random keys, and expired records leave as whole files
//! ([`drop_expired_files`]). A lookup by request finds the record through [`DedupIndex`], which
//! holds a hash of each record's request with its retention: nearly every lookup is for a new
//! request, and the index answers it without reading the table.
//!
//! The state machine never deletes a dedup record: a lookup ignores one whose retention ended at
//! the replicated clock (`dedup::expired`). So a record may go whenever the storage likes, as
//! long as it was expired at a time every reader has passed: compactions (their filter) and
//! [`drop_expired_files`] drop records expired at the [`DedupHorizon`], and the index forgets
//! them. Without that, each apply deleted what had expired, leaving two tombstones per request
//! that compactions carried for minutes.
//!
//! The horizon is the clock of the applied state on disk ([`AppliedOnDisk::clock`]), not the
//! applied clock: a node killed comes back with its tables as the last flush wrote them and
//! applies the log again from there, and each entry it applies again must find every record
//! that entry found the first time, or the node would run a retried request again that the
//! others answered from the dedup table. It is held back further to the clock of any RocksDB
//! snapshot still being read (a snapshot build): a built snapshot must hold every record
//! retained at its own clock.

use std::collections::{hash_map, BTreeMap, BTreeSet, HashMap};
use std::ffi::CStr;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex};

use rocksdb::compaction_filter::{CompactionFilter, Decision};
use rocksdb::compaction_filter_factory::{CompactionFilterContext, CompactionFilterFactory};
use rocksdb::{IteratorMode, ReadOptions, WriteBatch, DB};
use statestore_statemachine::{dedup, Table};

use crate::db::{add_clear, cf, synced, AppliedOnDisk, RAFT_META_CF};

/// The key of a dedup record on disk: the end of its retention (ms, u64 BE), then its request's
/// key in the state machine (`dedup::key`).
pub fn stored_key(retain_until: u64, request_key: &[u8]) -> Vec<u8> {
    [&retain_until.to_be_bytes()[..], request_key].concat()
}

/// The end of the retention a stored key begins with; none for a key too short to be one.
pub fn stored_retention(stored_key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(stored_key.get(..8)?.try_into().ok()?))
}

/// The retention a record is stored under: its own, or, for a record that does not read, the
/// end of time, so that it stays for a read to report.
pub fn retention_of(record: &[u8]) -> u64 {
    dedup::retain_until(record).unwrap_or(u64::MAX)
}

/// For every dedup record on disk that may still be retained: a hash of its request's key and
/// the end of its retention. Holds at least every record retained at the [`DedupHorizon`]
/// (more is harmless: a lookup then reads a key that is not there), so a request it has no
/// entry for has no record.
#[derive(Debug, Default)]
pub struct DedupIndex {
    entries: Mutex<IndexEntries>,
}

/// Shards of the index by request hash. A hash table grows by moving all it holds into one
/// twice as large; split, each growth moves a 64th of the index, so no apply that happens to
/// grow it waits for the whole (about a million records at the largest retention of a fill).
const REQUEST_SHARDS: usize = 64;

#[derive(Debug)]
struct IndexEntries {
    /// Request hash to a retention of a record of it, sharded by [`shard_of`]: what a lookup
    /// searches, at one probe whatever the index's size (ordered sets took a dozen cache misses
    /// per lookup in an index of a million records).
    by_request: Vec<HashMap<u64, u64, BuildHasherDefault<RequestHashed>>>,
    /// The other retentions of requests with more than one record in the index (a request
    /// remembered again before its earlier record was forgotten, or two requests of one hash):
    /// rare, so the common record costs one entry of `by_request`.
    more_retentions: HashMap<u64, Vec<u64>>,
    /// (retention, request hash): what expires first. Records arrive in about the order their
    /// retentions end, so this is written and read at its two ends.
    by_retention: BTreeSet<(u64, u64)>,
}

impl Default for IndexEntries {
    fn default() -> Self {
        IndexEntries {
            by_request: (0..REQUEST_SHARDS).map(|_| HashMap::default()).collect(),
            more_retentions: HashMap::new(),
            by_retention: BTreeSet::new(),
        }
    }
}

/// The shard of a request hash: bits the hash tables do not use to place or tell apart their
/// entries (they use the lowest bits and the top seven).
fn shard_of(hash: u64) -> usize {
    (hash >> 32) as usize % REQUEST_SHARDS
}

impl IndexEntries {
    fn add(&mut self, hash: u64, retain_until: u64) {
        if !self.by_retention.insert((retain_until, hash)) {
            return;
        }
        let shard = &mut self.by_request[shard_of(hash)];
        match shard.entry(hash) {
            hash_map::Entry::Vacant(vacant) => {
                vacant.insert(retain_until);
            }
            hash_map::Entry::Occupied(_) => self.more_retentions.entry(hash).or_default().push(retain_until),
        }
    }

    fn remove(&mut self, hash: u64, retain_until: u64) {
        if !self.by_retention.remove(&(retain_until, hash)) {
            return;
        }
        let shard = &mut self.by_request[shard_of(hash)];
        let Some(more) = self.more_retentions.get_mut(&hash) else {
            shard.remove(&hash);
            return;
        };
        let first = shard.get_mut(&hash).expect("a request with more retentions has a first");
        if *first == retain_until {
            *first = more.pop().expect("more retentions are never empty");
        } else {
            more.retain(|retention| *retention != retain_until);
        }
        if more.is_empty() {
            self.more_retentions.remove(&hash);
        }
    }

    fn retentions(&self, hash: u64) -> Vec<u64> {
        let Some(first) = self.by_request[shard_of(hash)].get(&hash) else { return Vec::new() };
        let mut retentions = vec![*first];
        if let Some(more) = self.more_retentions.get(&hash) {
            retentions.extend(more);
            retentions.sort_unstable_by(|a, b| b.cmp(a));
        }
        retentions
    }

    fn len(&self) -> usize {
        self.by_retention.len()
    }
}

/// The index's hash of a request key. Only this process reads it: the index is built anew
/// whenever the database opens or a snapshot is installed.
fn request_hash(request_key: &[u8]) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    hasher.write(request_key);
    hasher.finish()
}

/// The hasher of the index's tables, whose keys are [`request_hash`]es already: it passes
/// them through.
#[derive(Debug, Default)]
struct RequestHashed(u64);

impl Hasher for RequestHashed {
    fn finish(&self) -> u64 {
        self.0
    }

    /// Not used by the index's `u64` keys; folds any other bytes in all the same.
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*byte);
        }
    }

    fn write_u64(&mut self, hash: u64) {
        self.0 = hash;
    }
}

impl DedupIndex {
    /// Notes a record of `request_key` retained until `retain_until`.
    pub fn insert(&self, request_key: &[u8], retain_until: u64) {
        let hash = request_hash(request_key);
        self.entries.lock().expect("dedup index lock").add(hash, retain_until);
    }

    /// The retentions of the records that may be `request_key`'s, latest first. Two different
    /// requests may share a hash: the stored key tells them apart.
    pub fn retentions(&self, request_key: &[u8]) -> Vec<u64> {
        let hash = request_hash(request_key);
        self.entries.lock().expect("dedup index lock").retentions(hash)
    }

    /// Forgets up to `limit` records whose retention ended at `horizon`, earliest first;
    /// returns how many it forgot.
    pub fn forget_expired(&self, horizon: u64, limit: usize) -> usize {
        let mut entries = self.entries.lock().expect("dedup index lock");
        let mut forgotten = 0;
        while forgotten < limit {
            let Some(&(retain_until, hash)) = entries.by_retention.first() else { break };
            if retain_until > horizon {
                break;
            }
            entries.remove(hash, retain_until);
            forgotten += 1;
        }
        forgotten
    }

    /// Records in the index.
    pub fn len(&self) -> usize {
        self.entries.lock().expect("dedup index lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Replaces the index with the records of `db` retained after `horizon`.
    pub fn load(&self, db: &DB, horizon: u64) -> Result<(), rocksdb::Error> {
        let mut loaded = IndexEntries::default();
        let mut options = ReadOptions::default();
        options.fill_cache(false);
        options.set_iterate_lower_bound(stored_key(horizon.saturating_add(1), b""));
        for item in db.iterator_cf_opt(cf(db, Table::Dedup.name()), options, IteratorMode::Start) {
            let (key, _) = item?;
            let Some(retain_until) = stored_retention(&key) else { continue };
            loaded.add(request_hash(&key[8..]), retain_until);
        }
        *self.entries.lock().expect("dedup index lock") = loaded;
        Ok(())
    }
}

/// The stored record of `request_key`: of the records the index points to, the one retained
/// longest (a request remembered again after its record expired has a later retention than the
/// expired one).
pub fn get(db: &DB, index: &DedupIndex, request_key: &[u8]) -> Result<Option<Vec<u8>>, rocksdb::Error> {
    let dedup = cf(db, Table::Dedup.name());
    for retain_until in index.retentions(request_key) {
        if let Some(record) = db.get_cf(dedup, stored_key(retain_until, request_key))? {
            return Ok(Some(record));
        }
    }
    Ok(None)
}

/// Adds the write of `request_key`'s dedup record (none: its deletion) to `batch`, and notes it
/// in the index.
pub fn add_write(db: &DB, index: &DedupIndex, batch: &mut WriteBatch, request_key: &[u8], record: Option<&[u8]>) {
    let dedup = cf(db, Table::Dedup.name());
    match record {
        Some(record) => {
            let retain_until = retention_of(record);
            index.insert(request_key, retain_until);
            batch.put_cf(dedup, stored_key(retain_until, request_key), record);
        }
        None => {
            for retain_until in index.retentions(request_key) {
                batch.delete_cf(dedup, stored_key(retain_until, request_key));
            }
        }
    }
}

/// Removes the dedup table's files that hold only records expired at `horizon`, without
/// reading them. Files of level 0 are left to compactions, which drop such records too.
pub fn drop_expired_files(db: &DB, horizon: u64) -> Result<(), rocksdb::Error> {
    if horizon == 0 {
        return Ok(());
    }
    // Every stored key retained until `horizon` or earlier sorts before this one.
    let end = horizon.saturating_add(1).to_be_bytes();
    db.delete_file_in_range_cf(cf(db, Table::Dedup.name()), stored_key(0, b""), end.to_vec())
}

/// Marks a database whose dedup records are keyed by retention (in `raft_meta`).
const KEYED_BY_RETENTION: &[u8] = b"dedup_keyed_by_retention";

/// Keys the dedup records of a database written by an earlier version (keyed by request) by
/// retention, in one synced batch with the mark that says they are; returns how many it moved.
/// A database that has the mark is left as it is.
pub fn key_by_retention(db: &DB) -> Result<usize, rocksdb::Error> {
    let meta = cf(db, RAFT_META_CF);
    if db.get_cf(meta, KEYED_BY_RETENTION)?.is_some() {
        return Ok(0);
    }
    let dedup = cf(db, Table::Dedup.name());
    let mut batch = WriteBatch::default();
    let mut moved = 0;
    // Every old key goes first; the stored keys are put after, so none of them is deleted even
    // if it happens to equal an old key.
    add_clear(&mut batch, db, dedup)?;
    for item in db.iterator_cf(dedup, IteratorMode::Start) {
        let (key, record) = item?;
        batch.put_cf(dedup, stored_key(retention_of(&record), &key), &record);
        moved += 1;
    }
    batch.put_cf(meta, KEYED_BY_RETENTION, []);
    db.write_opt(batch, &synced())?;
    if moved > 0 {
        tracing::info!(records = moved, "keyed the dedup records of an earlier version by retention");
    }
    Ok(moved)
}

/// Up to which replicated time expired dedup records may be dropped.
#[derive(Debug)]
pub struct DedupHorizon {
    /// How far the applied state is on disk; its clock never moves back.
    on_disk: Arc<AppliedOnDisk>,
    /// Clocks of the views being read, with how many views hold each.
    pinned: Mutex<BTreeMap<u64, usize>>,
}

/// A horizon over a state with nothing on disk yet.
impl Default for DedupHorizon {
    fn default() -> Self {
        DedupHorizon::new(Arc::default())
    }
}

impl DedupHorizon {
    pub fn new(on_disk: Arc<AppliedOnDisk>) -> Self {
        DedupHorizon { on_disk, pinned: Mutex::default() }
    }

    /// Holds the horizon at the current clock on disk until the guard is dropped. Pin before
    /// taking the view to protect: the view's clock is then at least the pinned one.
    pub fn pin(self: &Arc<Self>) -> Pin {
        let clock = self.on_disk.clock();
        *self.pinned.lock().expect("dedup horizon lock").entry(clock).or_default() += 1;
        Pin { horizon: self.clone(), clock }
    }

    /// The time up to which records may be dropped now. The clock on disk is read before the
    /// pins: a view pinned after that read was taken after it too, so its clock is not lower.
    pub fn now(&self) -> u64 {
        let on_disk = self.on_disk.clock();
        let pinned = self.pinned.lock().expect("dedup horizon lock").keys().next().copied();
        pinned.map_or(on_disk, |pinned| pinned.min(on_disk))
    }
}

/// Holds a [`DedupHorizon`] back while a view is read.
pub struct Pin {
    horizon: Arc<DedupHorizon>,
    clock: u64,
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut pinned = self.horizon.pinned.lock().expect("dedup horizon lock");
        if let Some(count) = pinned.get_mut(&self.clock) {
            *count -= 1;
            if *count == 0 {
                pinned.remove(&self.clock);
            }
        }
    }
}

/// Makes one [`ExpiredDedupFilter`] per compaction of the dedup table.
pub struct ExpiredDedupFilterFactory {
    horizon: Arc<DedupHorizon>,
}

impl ExpiredDedupFilterFactory {
    pub fn new(horizon: Arc<DedupHorizon>) -> Self {
        ExpiredDedupFilterFactory { horizon }
    }
}

const FILTER_NAME: &CStr = c"statestore-expired-dedup";

impl CompactionFilterFactory for ExpiredDedupFilterFactory {
    type Filter = ExpiredDedupFilter;

    fn create(&mut self, _context: CompactionFilterContext) -> ExpiredDedupFilter {
        ExpiredDedupFilter { now: self.horizon.now(), dropped: 0 }
    }

    fn name(&self) -> &CStr {
        FILTER_NAME
    }
}

/// Drops the dedup records one compaction meets that expired at the horizon it started with.
pub struct ExpiredDedupFilter {
    now: u64,
    dropped: u64,
}

impl CompactionFilter for ExpiredDedupFilter {
    fn filter(&mut self, _level: u32, key: &[u8], _value: &[u8]) -> Decision {
        if stored_retention(key).is_some_and(|retain_until| retain_until <= self.now) {
            self.dropped += 1;
            Decision::Remove
        } else {
            Decision::Keep
        }
    }

    fn name(&self) -> &CStr {
        FILTER_NAME
    }
}

impl Drop for ExpiredDedupFilter {
    fn drop(&mut self) {
        if self.dropped > 0 {
            tracing::debug!(dropped = self.dropped, horizon = self.now, "compaction dropped expired dedup records");
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use rocksdb::{BottommostLevelCompaction, CompactOptions};
    use statestore_protocol::{Hlc, Request, Set};
    use statestore_statemachine::{ClientRequest, Entry, Operation, Overlay, RequestIdentity, StateMachine};

    use super::*;
    use crate::db::{self, add_to, WithDedup};

    const T0: u64 = 1_800_000_000_000;
    /// Retention of the tests' requests: their message expiry (10 s) plus the grace (60 s).
    const RETAINED: u64 = 70_000;

    /// Applies a SET of request `identity` at `wall_clock_ms`, as the state store does; returns
    /// whether it was answered from the dedup table.
    fn apply_set(db: &DB, index: &DedupIndex, identity: RequestIdentity, wall_clock_ms: u64) -> bool {
        let tables = WithDedup::new(db, index);
        let mut overlay = Overlay::new(&tables);
        let timestamp = Hlc::new(wall_clock_ms, 0, "c").to_string();
        let request = Request::parse(&Set::new("k", "v").encode(), Some(&timestamp), None).unwrap();
        let operation = Operation::Request(ClientRequest {
            request,
            client_id: Some("c".into()),
            identity: Some(identity),
            message_expiry_secs: Some(10),
        });
        let machine = StateMachine::new(Default::default());
        let applied = machine.apply(&mut overlay, &Entry { operation, wall_clock_ms }).unwrap();
        let mut batch = WriteBatch::default();
        add_to(&mut batch, db, index, overlay.into_batch());
        db.write(batch).unwrap();
        applied.deduplicated
    }

    /// The identity of request `n` of one client, for tests across the crate.
    pub(crate) fn identity(n: u8) -> RequestIdentity {
        many(u32::from(n))
    }

    /// Like [`identity`], for more requests.
    fn many(n: u32) -> RequestIdentity {
        let correlation_data = if n < 256 { vec![n as u8] } else { n.to_be_bytes().to_vec() };
        RequestIdentity { response_topic: "clients/c/response".into(), correlation_data }
    }

    /// Flushes and rewrites the whole dedup table, so the filter sees every record.
    fn compact(db: &DB) -> usize {
        let dedup = cf(db, Table::Dedup.name());
        db.flush_cf(dedup).unwrap();
        let mut options = CompactOptions::default();
        options.set_bottommost_level_compaction(BottommostLevelCompaction::Force);
        db.compact_range_cf_opt(dedup, None::<&[u8]>, None::<&[u8]>, &options);
        db.iterator_cf(dedup, IteratorMode::Start).count()
    }

    /// The dedup table's files: (level, name), in level order.
    fn dedup_files(db: &DB) -> Vec<(i32, String)> {
        let mut files: Vec<(i32, String)> = db
            .live_files()
            .unwrap()
            .into_iter()
            .filter(|file| file.column_family_name == Table::Dedup.name())
            .map(|file| (file.level, file.name))
            .collect();
        files.sort();
        files
    }

    #[test]
    fn compactions_drop_records_expired_at_the_horizon_and_spare_pinned_views() {
        let dir = tempfile::tempdir().unwrap();
        let on_disk = Arc::new(AppliedOnDisk::default());
        let horizon = Arc::new(DedupHorizon::new(on_disk.clone()));
        let db = db::open(dir.path(), &horizon).unwrap();
        let index = DedupIndex::default();
        apply_set(&db, &index, identity(1), T0);
        apply_set(&db, &index, identity(2), T0 + 1_000);

        on_disk.reached(0, T0 + RETAINED - 1, 0);
        assert_eq!(compact(&db), 2, "nothing expired yet");
        on_disk.reached(0, T0 + RETAINED, 0);
        let pin = horizon.pin();
        on_disk.reached(0, T0 + RETAINED + 5_000, 0);
        assert_eq!(horizon.now(), T0 + RETAINED, "held at the pinned clock");
        assert_eq!(compact(&db), 1, "only what expired at the pinned clock goes");
        drop(pin);
        assert_eq!(horizon.now(), T0 + RETAINED + 5_000);
        assert_eq!(compact(&db), 0);
        on_disk.reached(0, T0, 0);
        assert_eq!(horizon.now(), T0 + RETAINED + 5_000, "the horizon never moves back");
    }

    /// Records written over time are stored in the order their retentions end, so the files
    /// flushes write do not overlap and compactions move them down a level whole, without
    /// rewriting a record (keyed by request, every flush's file spans the whole key range and
    /// each compaction from level 0 merges them all). Files whose records all expired leave
    /// whole, and lookups still find every retained record.
    #[test]
    fn files_move_down_whole_and_leave_whole_once_expired() {
        const PER_FLUSH: u32 = 500;
        const FLUSHES: u32 = 6;
        let dir = tempfile::tempdir().unwrap();
        let on_disk = Arc::new(AppliedOnDisk::default());
        let db = db::open(dir.path(), &Arc::new(DedupHorizon::new(on_disk.clone()))).unwrap();
        let index = DedupIndex::default();
        let mut flushed = Vec::new();
        for flush in 0..FLUSHES {
            for n in flush * PER_FLUSH..(flush + 1) * PER_FLUSH {
                assert!(!apply_set(&db, &index, many(n), T0 + u64::from(n)));
            }
            db::flush_all(&db).unwrap();
            // The file this flush wrote is the one name not listed before, at whatever level: a
            // compaction may already have moved it down. A compaction that rewrote a file would
            // add a name of its own.
            let new: Vec<String> =
                dedup_files(&db).into_iter().map(|(_, name)| name).filter(|name| !flushed.contains(name)).collect();
            assert_eq!(new.len(), 1, "flush {flush} wrote one file and no compaction rewrote one: {new:?}");
            flushed.extend(new);
            // Waits for compactions from level 0, which start at four files.
            let mut waited = 0;
            while db.property_int_value_cf(cf(&db, Table::Dedup.name()), "rocksdb.num-files-at-level0").unwrap()
                >= Some(4)
                && waited < 1_000
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
                waited += 1;
            }
        }
        flushed.sort();
        let mut names: Vec<String> = dedup_files(&db).into_iter().map(|(_, name)| name).collect();
        names.sort();
        assert_eq!(flushed.len(), FLUSHES as usize);
        assert_eq!(names, flushed, "every file a flush wrote is still there, none rewritten");
        assert!(dedup_files(&db).iter().any(|(level, _)| *level > 0), "compactions moved files down");

        // The first two flushes' records expire: their files leave.
        let horizon = T0 + RETAINED + u64::from(2 * PER_FLUSH) - 1;
        on_disk.reached(0, horizon, 0);
        drop_expired_files(&db, horizon).unwrap();
        assert_eq!(dedup_files(&db).len(), FLUSHES as usize - 2);
        let records = db.iterator_cf(cf(&db, Table::Dedup.name()), IteratorMode::Start).count();
        assert_eq!(records, ((FLUSHES - 2) * PER_FLUSH) as usize);
        assert_eq!(index.forget_expired(horizon, usize::MAX), 2 * PER_FLUSH as usize);
        assert_eq!(index.len(), ((FLUSHES - 2) * PER_FLUSH) as usize);

        // Every retained request is answered from the dedup table, also through an index
        // loaded anew; an expired one is applied again.
        let clock = horizon;
        let reloaded = DedupIndex::default();
        reloaded.load(&db, horizon).unwrap();
        assert_eq!(reloaded.len(), index.len());
        for n in (2 * PER_FLUSH..FLUSHES * PER_FLUSH).step_by(97) {
            assert!(apply_set(&db, &reloaded, many(n), clock), "request {n}");
        }
        assert!(!apply_set(&db, &reloaded, many(3), clock), "expired");
    }

    #[test]
    fn the_index_points_to_the_latest_record_of_a_request_and_forgets_expired_ones() {
        let index = DedupIndex::default();
        index.insert(b"a", 10);
        index.insert(b"b", 15);
        index.insert(b"a", 20);
        assert_eq!(index.retentions(b"a"), [20, 10]);
        assert_eq!(index.retentions(b"c"), Vec::<u64>::new());
        assert_eq!(index.forget_expired(15, 1), 1, "at most the limit");
        assert_eq!(index.retentions(b"a"), [20]);
        assert_eq!(index.forget_expired(15, 10), 1);
        assert_eq!(index.retentions(b"b"), Vec::<u64>::new());
        assert_eq!(index.forget_expired(19, 10), 0);
        assert_eq!(index.len(), 1);

        index.insert(b"a", 40);
        index.insert(b"a", 30);
        index.insert(b"a", 40);
        assert_eq!(index.len(), 3, "a record noted twice is one record");
        assert_eq!(index.retentions(b"a"), [40, 30, 20]);
        assert_eq!(index.forget_expired(20, 10), 1);
        assert_eq!(index.retentions(b"a"), [40, 30]);
        assert_eq!(index.forget_expired(35, 10), 1);
        assert_eq!(index.retentions(b"a"), [40]);
        assert_eq!(index.forget_expired(40, 10), 1);
        assert!(index.is_empty());
        assert_eq!(index.retentions(b"a"), Vec::<u64>::new());
    }

    /// An earlier version keyed dedup records by request: opened by this one, they are keyed by
    /// retention once (a record that does not read is kept, at the end of time, for a read to
    /// report), and every request is answered from them as before.
    #[test]
    fn a_dedup_table_keyed_by_request_is_keyed_by_retention_when_opened() {
        let dir = tempfile::tempdir().unwrap();
        let horizon = Arc::new(DedupHorizon::default());
        let index = DedupIndex::default();
        {
            let db = db::open(dir.path(), &horizon).unwrap();
            for n in [1, 2, 3] {
                apply_set(&db, &index, identity(n), T0 + u64::from(n));
            }
            // As an earlier version stored them.
            let dedup = cf(&db, Table::Dedup.name());
            let stored: Vec<_> = db.iterator_cf(dedup, IteratorMode::Start).map(Result::unwrap).collect();
            for (key, record) in stored {
                db.delete_cf(dedup, &key).unwrap();
                db.put_cf(dedup, &key[8..], record).unwrap();
            }
            db.put_cf(dedup, b"unreadable", b"x").unwrap();
            db.delete_cf(cf(&db, RAFT_META_CF), KEYED_BY_RETENTION).unwrap();
        }
        let db = db::open(dir.path(), &horizon).unwrap();
        let keys: Vec<Box<[u8]>> =
            db.iterator_cf(cf(&db, Table::Dedup.name()), IteratorMode::Start).map(|item| item.unwrap().0).collect();
        let retentions: Vec<u64> = keys.iter().map(|key| stored_retention(key).unwrap()).collect();
        assert_eq!(retentions, [T0 + 1 + RETAINED, T0 + 2 + RETAINED, T0 + 3 + RETAINED, u64::MAX]);
        assert_eq!(&keys[3][8..], b"unreadable");
        assert_eq!(key_by_retention(&db).unwrap(), 0, "converted once");
        let index = DedupIndex::default();
        index.load(&db, 0).unwrap();
        for n in [1, 2, 3] {
            assert!(apply_set(&db, &index, identity(n), T0 + 10), "request {n}");
        }
    }
}
