//! The storage the state machine runs over: a few ordered tables of byte keys, read by point
//! lookups and prefix scans, written as one atomic batch per apply. RocksDB implements it with
//! one column family per table; [`MemStorage`] implements it for tests.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ops::Bound;

/// The tables of the replicated state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Table {
    /// user key → value, version, fencing token, deadline.
    Keys,
    /// deadline (u64 BE) ++ user key → version: finds due keys in deadline order.
    Expiry,
    /// len(key) (u32 BE) ++ key ++ client id → (): who observes a key.
    Watchers,
    /// len(client id) (u32 BE) ++ client id ++ key → (): what a client observes.
    WatchedKeys,
    /// len(response topic) (u32 BE) ++ response topic ++ correlation data → retention
    /// deadline and stored reply. Never deleted by the state machine: records past their
    /// deadline are ignored, and the storage drops them when it likes (`dedup::expired`).
    Dedup,
    /// sequence number (u64 BE) → a key notification not yet confirmed as published.
    Outbox,
    /// state-machine metadata: clock, last version, counters, outbox sequence.
    Meta,
}

impl Table {
    pub const ALL: [Table; 7] =
        [Table::Keys, Table::Expiry, Table::Watchers, Table::WatchedKeys, Table::Dedup, Table::Outbox, Table::Meta];

    /// The table's position in [`Table::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// A stable name, e.g. for a RocksDB column family.
    pub fn name(self) -> &'static str {
        match self {
            Table::Keys => "sm_keys",
            Table::Expiry => "sm_expiry",
            Table::Watchers => "sm_watchers",
            Table::WatchedKeys => "sm_watched_keys",
            Table::Dedup => "sm_dedup",
            Table::Outbox => "sm_outbox",
            Table::Meta => "sm_meta",
        }
    }
}

/// A failure of the storage below the state machine. Not a client error: the node cannot go on
/// applying the log when it happens.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StorageError {
    #[error("storage backend: {0}")]
    Backend(String),
    #[error("corrupt record in {table:?}: {detail}")]
    Corrupt { table: Table, detail: &'static str },
}

/// One page of a prefix scan: `(key, value)` pairs in ascending key order.
pub type ScanPage = Vec<(Vec<u8>, Vec<u8>)>;

/// Point lookups and ordered prefix scans.
pub trait StorageRead {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError>;

    /// Up to `limit` entries of `table` whose key starts with `prefix` and is greater than
    /// `after` (when given), in ascending key order.
    fn scan(&self, table: Table, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<ScanPage, StorageError>;
}

/// Reads that see the transaction's own writes, and the writes themselves.
pub trait Txn: StorageRead {
    fn put(&mut self, table: Table, key: Vec<u8>, value: Vec<u8>);
    fn delete(&mut self, table: Table, key: Vec<u8>);
}

/// The writes of one apply, in key order, to be committed atomically. `None` deletes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Batch {
    pub writes: Vec<(Table, Vec<u8>, Option<Vec<u8>>)>,
}

/// Storage that can commit a [`Batch`] atomically.
pub trait Storage: StorageRead {
    fn write(&mut self, batch: Batch) -> Result<(), StorageError>;
}

/// One map per table, indexed by [`Table::index`]: a lookup borrows the key instead of building
/// a `(table, key)` pair, and the tables iterate in [`Table`] order.
type TableMaps<V> = [BTreeMap<Vec<u8>, V>; Table::ALL.len()];

/// Entries of `map` whose key starts with `prefix` and is greater than `after` (when inside or
/// beyond the prefix range), in order.
fn range<'m, V>(
    map: &'m BTreeMap<Vec<u8>, V>,
    prefix: &'m [u8],
    after: Option<&[u8]>,
) -> impl Iterator<Item = (&'m Vec<u8>, &'m V)> + 'm {
    let lower = match after {
        Some(after) if after >= prefix => Bound::Excluded(after),
        _ => Bound::Included(prefix),
    };
    map.range::<[u8], _>((lower, Bound::Unbounded)).take_while(move |(key, _)| key.starts_with(prefix))
}

/// A transaction over a read-only base: buffers writes in memory and serves reads from them
/// first, so later entries of one apply batch see earlier ones.
pub struct Overlay<'a, S: StorageRead + ?Sized> {
    base: &'a S,
    writes: TableMaps<Option<Vec<u8>>>,
    /// What the base held for the meta keys read so far. A few meta records (the clock, the
    /// counters) are read by every entry of a batch; the base does not change while the
    /// overlay lives, and a write of the overlay is looked up before this.
    meta_reads: RefCell<BTreeMap<Vec<u8>, Option<Vec<u8>>>>,
}

impl<'a, S: StorageRead + ?Sized> Overlay<'a, S> {
    pub fn new(base: &'a S) -> Self {
        Overlay { base, writes: Default::default(), meta_reads: RefCell::default() }
    }

    pub fn is_empty(&self) -> bool {
        self.writes.iter().all(BTreeMap::is_empty)
    }

    /// The buffered writes, ready to commit.
    pub fn into_batch(self) -> Batch {
        let writes = Table::ALL
            .into_iter()
            .zip(self.writes)
            .flat_map(|(table, writes)| writes.into_iter().map(move |(key, value)| (table, key, value)))
            .collect();
        Batch { writes }
    }
}

impl<S: StorageRead + ?Sized> StorageRead for Overlay<'_, S> {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        if let Some(write) = self.writes[table.index()].get(key) {
            return Ok(write.clone());
        }
        if table != Table::Meta {
            return self.base.get(table, key);
        }
        if let Some(read) = self.meta_reads.borrow().get(key) {
            return Ok(read.clone());
        }
        let read = self.base.get(table, key)?;
        self.meta_reads.borrow_mut().insert(key.to_vec(), read.clone());
        Ok(read)
    }

    fn scan(&self, table: Table, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<ScanPage, StorageError> {
        let mut out = Vec::new();
        let mut cursor = after.map(<[u8]>::to_vec);
        while out.len() < limit {
            // A page of the base; the buffered writes up to its last key override it.
            let base = self.base.scan(table, prefix, cursor.as_deref(), limit)?;
            let base_exhausted = base.len() < limit;
            let upper = if base_exhausted { None } else { base.last().map(|(k, _)| k.clone()) };
            let buffered = range(&self.writes[table.index()], prefix, cursor.as_deref())
                .take_while(|(key, _)| upper.as_ref().is_none_or(|upper| *key <= upper));
            let mut base = base.into_iter().peekable();
            let mut buffered = buffered.peekable();
            loop {
                let take_base = match (base.peek(), buffered.peek()) {
                    (None, None) => break,
                    (Some(_), None) => true,
                    (None, Some(_)) => false,
                    (Some((b, _)), Some((w, _))) => {
                        if b == *w {
                            base.next(); // the buffered write replaces it
                            false
                        } else {
                            b < *w
                        }
                    }
                };
                let entry = if take_base {
                    base.next()
                } else {
                    buffered.next().and_then(|(key, value)| value.clone().map(|value| (key.clone(), value)))
                };
                if let Some(entry) = entry {
                    out.push(entry);
                    if out.len() == limit {
                        return Ok(out);
                    }
                }
            }
            if base_exhausted {
                break;
            }
            cursor = upper;
        }
        Ok(out)
    }
}

impl<S: StorageRead + ?Sized> Txn for Overlay<'_, S> {
    fn put(&mut self, table: Table, key: Vec<u8>, value: Vec<u8>) {
        self.writes[table.index()].insert(key, Some(value));
    }

    fn delete(&mut self, table: Table, key: Vec<u8>) {
        self.writes[table.index()].insert(key, None);
    }
}

/// Storage in `BTreeMap`s, for tests and benchmarks.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MemStorage {
    tables: TableMaps<Vec<u8>>,
}

impl MemStorage {
    pub fn new() -> Self {
        MemStorage::default()
    }

    /// Number of entries in `table`.
    pub fn len(&self, table: Table) -> usize {
        self.tables[table.index()].len()
    }
}

impl StorageRead for MemStorage {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self.tables[table.index()].get(key).cloned())
    }

    fn scan(&self, table: Table, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<ScanPage, StorageError> {
        Ok(range(&self.tables[table.index()], prefix, after).take(limit).map(|(k, v)| (k.clone(), v.clone())).collect())
    }
}

impl Storage for MemStorage {
    fn write(&mut self, batch: Batch) -> Result<(), StorageError> {
        for (table, key, value) in batch.writes {
            let entries = &mut self.tables[table.index()];
            match value {
                Some(value) => entries.insert(key, value),
                None => entries.remove(&key),
            };
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_index_is_its_place_in_all() {
        for (index, table) in Table::ALL.into_iter().enumerate() {
            assert_eq!(table.index(), index, "{table:?}");
        }
    }

    #[test]
    fn scan_respects_prefix_after_and_limit() {
        let mut mem = MemStorage::new();
        let mut batch = Batch::default();
        for key in [&b"a"[..], b"ab", b"abc", b"abd", b"b"] {
            batch.writes.push((Table::Keys, key.to_vec(), Some(key.to_vec())));
        }
        batch.writes.push((Table::Meta, b"ab".to_vec(), Some(vec![])));
        mem.write(batch).unwrap();
        let keys = |page: ScanPage| page.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
        assert_eq!(
            keys(mem.scan(Table::Keys, b"ab", None, 10).unwrap()),
            [b"ab".to_vec(), b"abc".to_vec(), b"abd".to_vec()]
        );
        assert_eq!(keys(mem.scan(Table::Keys, b"ab", Some(b"abc"), 10).unwrap()), [b"abd".to_vec()]);
        assert_eq!(keys(mem.scan(Table::Keys, b"ab", Some(b"a"), 1).unwrap()), [b"ab".to_vec()]);
        assert_eq!(keys(mem.scan(Table::Keys, b"", Some(b"abd"), 10).unwrap()), [b"b".to_vec()]);
        assert_eq!(mem.len(Table::Keys), 5);
        assert_eq!(mem.len(Table::Meta), 1);
    }

    #[test]
    fn overlay_reads_its_own_writes() {
        let mut mem = MemStorage::new();
        mem.write(Batch { writes: vec![(Table::Keys, b"k".to_vec(), Some(b"old".to_vec()))] }).unwrap();
        let mut overlay = Overlay::new(&mem);
        overlay.put(Table::Keys, b"k".to_vec(), b"new".to_vec());
        overlay.put(Table::Keys, b"j".to_vec(), b"j".to_vec());
        assert_eq!(overlay.get(Table::Keys, b"k").unwrap(), Some(b"new".to_vec()));
        overlay.delete(Table::Keys, b"k".to_vec());
        assert_eq!(overlay.get(Table::Keys, b"k").unwrap(), None);
        assert_eq!(overlay.scan(Table::Keys, b"", None, 10).unwrap(), vec![(b"j".to_vec(), b"j".to_vec())]);
        let batch = overlay.into_batch();
        mem.write(batch).unwrap();
        assert_eq!(mem.get(Table::Keys, b"k").unwrap(), None);
        assert_eq!(mem.get(Table::Keys, b"j").unwrap(), Some(b"j".to_vec()));
    }
}
