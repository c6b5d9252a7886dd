//! Damage in RocksDB's write-ahead logs that RocksDB's own recovery would take for a write torn
//! by a crash, found before the database opens.
//!
//! The database opens with `TolerateCorruptedTailRecords` ([`crate::db::open`]): a record that
//! does not read at the end of a WAL is a write a crash tore, so never synced and never
//! acknowledged, and RocksDB drops it; damage anywhere else fails the open. RocksDB's reader
//! (`db/log_reader.cc`) makes two exceptions that damage can fall into:
//! - a record header whose length runs past the end of the file is taken for a torn last
//!   write: the reader stops there, silently;
//! - a header of zeros is taken for preallocated space: the reader skips, silently, to the end
//!   of its 32 KiB block.
//!
//! The WAL holds the Raft metadata (votes and commit marks, each a small synced write), so its
//! records after a damaged header in its last block (or in the same block) would be dropped
//! without an error: a node could come back having forgotten the vote it gave.
//!
//! A crash tears only the last write, so a record that does not read with a whole record after
//! it was damaged after it was written. That is what [`hidden_damage`] looks for: in the
//! damaged record's block at every byte after it, and at the start of every later block (each
//! block starts with a record). A whole record is one whose length fits its block and whose
//! CRC-32C matches, a chance of 2^-32 for bytes that are not one.
//!
//! Not told apart: a single write of several records that the disk persisted out of order when
//! the power failed (a later sector on disk, an earlier one not). The node then stops as
//! damaged although nothing acknowledged was lost. The Raft metadata is written one small record
//! at a time, so such a write is a few dozen bytes in one sector.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// RocksDB's WAL format (`db/log_format.h`): 32 KiB blocks of records, no record crossing a
/// block's end (a longer one is split into fragments), a block's last bytes zero when fewer than
/// a header are left.
const BLOCK: usize = 32 * 1024;
/// Checksum (4 bytes), length (2), type (1).
const HEADER: usize = 7;
/// A recycled log's header adds the log number (4 bytes).
const RECYCLABLE_HEADER: usize = HEADER + 4;
/// The record types with the longer header.
const RECYCLABLE_TYPES: [u8; 6] = [5, 6, 7, 8, 11, 131];
/// Added to a rotated CRC when RocksDB stores it (`util/crc32c.h`).
const CRC_MASK_DELTA: u32 = 0xa282_ead8;

/// A record of a WAL that does not read, with a whole record after it.
#[derive(Debug, thiserror::Error)]
#[error(
    "the WAL {} is damaged: the record at byte {offset} {problem}, and a whole record follows at \
     byte {next}; RocksDB would take the damage for a write torn by a crash and drop every \
     record after it without an error",
    path.display()
)]
pub struct WalDamage {
    pub path: PathBuf,
    pub offset: u64,
    pub problem: &'static str,
    pub next: u64,
}

/// Looks through every WAL (`*.log`) in the database directory `db_dir` for a record that does
/// not read with a whole record after it. A missing directory (a new node) has none.
pub fn hidden_damage(db_dir: &Path) -> io::Result<Option<WalDamage>> {
    let entries = match std::fs::read_dir(db_dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let mut wals = Vec::new();
    for entry in entries {
        let path = entry?.path();
        if path.extension().is_some_and(|extension| extension == "log") && path.is_file() {
            wals.push(path);
        }
    }
    wals.sort();
    for path in wals {
        if let Some(damage) = check_file(&path)? {
            return Ok(Some(damage));
        }
    }
    Ok(None)
}

/// Reads one WAL a block at a time.
fn check_file(path: &Path) -> io::Result<Option<WalDamage>> {
    let mut file = File::open(path)?;
    let mut block = vec![0; BLOCK];
    let mut start = 0u64;
    loop {
        let len = read_block(&mut file, &mut block)?;
        if len == 0 {
            return Ok(None);
        }
        if let Some((offset, problem)) = first_bad_record(&block[..len]) {
            let damage =
                |next: u64| WalDamage { path: path.to_path_buf(), offset: start + offset as u64, problem, next };
            if let Some(next) = (offset + 1..len).find(|&at| whole_record(&block[at..len])) {
                return Ok(Some(damage(start + next as u64)));
            }
            let mut next = start + len as u64;
            loop {
                let len = read_block(&mut file, &mut block)?;
                if len == 0 {
                    return Ok(None);
                }
                if whole_record(&block[..len]) {
                    return Ok(Some(damage(next)));
                }
                next += len as u64;
            }
        }
        start += len as u64;
    }
}

/// Fills `block` from `file` as far as the file goes; the bytes read.
fn read_block(file: &mut File, block: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < block.len() {
        match file.read(&mut block[filled..]) {
            Ok(0) => break,
            Ok(read) => filled += read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}

/// Walks the records of one block (the file's last may be short): the first that does not
/// read, and why. Fewer bytes than a header at the block's end are its zero trailer, or, at the
/// file's end, a header a crash cut short.
fn first_bad_record(block: &[u8]) -> Option<(usize, &'static str)> {
    let mut at = 0;
    while block.len() - at >= HEADER {
        match read_record(&block[at..]) {
            Ok(len) => at += len,
            Err(Unread::Short) => return None,
            Err(Unread::Bad(problem)) => return Some((at, problem)),
        }
    }
    None
}

fn whole_record(bytes: &[u8]) -> bool {
    read_record(bytes).is_ok()
}

enum Unread {
    /// Fewer bytes than the header needs.
    Short,
    Bad(&'static str),
}

/// The record at the start of `bytes` (which end where its block or the file ends): its length
/// with its header.
fn read_record(bytes: &[u8]) -> Result<usize, Unread> {
    if bytes.len() < HEADER {
        return Err(Unread::Short);
    }
    let stored = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    let len = usize::from(u16::from_le_bytes([bytes[4], bytes[5]]));
    let kind = bytes[6];
    if kind == 0 && len == 0 {
        return Err(Unread::Bad("has a header of zeros"));
    }
    let header = if RECYCLABLE_TYPES.contains(&kind) { RECYCLABLE_HEADER } else { HEADER };
    if bytes.len() < header {
        return Err(Unread::Short);
    }
    let end = header + len;
    if end > bytes.len() {
        return Err(Unread::Bad("has a length that runs past the end of its block or of the file"));
    }
    if mask(crc32c::crc32c(&bytes[HEADER - 1..end])) != stored {
        return Err(Unread::Bad("does not match its checksum"));
    }
    Ok(end)
}

/// Where the records of the WAL `bytes` start, found by their length fields alone (nothing is
/// checked): for tests and tools that look into a WAL.
pub fn record_starts(bytes: &[u8]) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut at = 0;
    while at + HEADER <= bytes.len() {
        let left_in_block = BLOCK - at % BLOCK;
        if left_in_block < HEADER {
            at += left_in_block;
            continue;
        }
        starts.push(at);
        at += HEADER + usize::from(u16::from_le_bytes([bytes[at + 4], bytes[at + 5]]));
    }
    starts
}

/// RocksDB's stored form of a CRC (`crc32c::Mask`).
fn mask(crc: u32) -> u32 {
    crc.rotate_right(15).wrapping_add(CRC_MASK_DELTA)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::db::{self, cf, synced, RAFT_META_CF};
    use crate::dedup_retention::DedupHorizon;

    const KEY: &[u8] = b"committed";

    /// A database whose WAL holds `count` synced writes of `KEY`, the i-th holding i; closed
    /// without a flush, so the WAL is all there is of them. Returns the WAL's path.
    fn written(dir: &Path, count: u64) -> PathBuf {
        let db = db::open(dir, &Arc::new(DedupHorizon::default())).unwrap();
        for i in 0..count {
            db.put_cf_opt(cf(&db, RAFT_META_CF), KEY, i.to_be_bytes(), &synced()).unwrap();
        }
        drop(db);
        let mut wals: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.extension().is_some_and(|extension| extension == "log"))
            .collect();
        wals.sort();
        wals.pop().expect("a WAL")
    }

    fn change(wal: &Path, change: impl FnOnce(&mut Vec<u8>)) {
        let mut bytes = std::fs::read(wal).unwrap();
        change(&mut bytes);
        std::fs::write(wal, bytes).unwrap();
    }

    /// What RocksDB recovers of `KEY` when it opens the database as the node does.
    fn recovered(dir: &Path) -> u64 {
        let db = db::open(dir, &Arc::new(DedupHorizon::default())).unwrap();
        let value = db.get_cf(cf(&db, RAFT_META_CF), KEY).unwrap().expect("a value");
        u64::from_be_bytes(value.as_slice().try_into().unwrap())
    }

    #[test]
    fn a_length_damaged_in_the_last_block_is_found_though_rocksdb_would_open() {
        let dir = tempfile::tempdir().unwrap();
        let wal = written(dir.path(), 300);
        let offsets = record_starts(&std::fs::read(&wal).unwrap());
        let target = offsets[offsets.len() / 2];
        assert!(target < BLOCK, "the records are all in the file's one block");
        change(&wal, |bytes| bytes[target + 4..target + 6].copy_from_slice(&u16::MAX.to_le_bytes()));

        let damage = hidden_damage(dir.path()).unwrap().expect("damage found");
        assert_eq!(damage.offset, target as u64);
        assert!(damage.next > damage.offset, "{damage}");
        assert!(damage.to_string().contains("runs past the end"), "{damage}");
        // What the check keeps the node from: RocksDB opens and has lost the synced writes
        // after the damaged header without a word.
        assert!(recovered(dir.path()) < 299);
    }

    #[test]
    fn a_header_of_zeros_is_found_though_rocksdb_would_skip_its_block() {
        let dir = tempfile::tempdir().unwrap();
        // More than one block: RocksDB skips the rest of the damaged block and reads on.
        let wal = written(dir.path(), 2_000);
        let offsets = record_starts(&std::fs::read(&wal).unwrap());
        assert!(offsets.last().unwrap() > &BLOCK, "records in more than one block");
        let target = offsets[offsets.len() / 4];
        assert!(target < BLOCK, "damage in the first block");
        change(&wal, |bytes| bytes[target..target + HEADER].fill(0));

        let damage = hidden_damage(dir.path()).unwrap().expect("damage found");
        assert_eq!(damage.offset, target as u64);
        assert!(damage.to_string().contains("header of zeros"), "{damage}");
    }

    #[test]
    fn a_write_torn_at_the_end_is_left_to_rocksdb() {
        let dir = tempfile::tempdir().unwrap();
        let wal = written(dir.path(), 2_000);
        let offsets = record_starts(&std::fs::read(&wal).unwrap());
        assert_eq!(hidden_damage(dir.path()).unwrap().map(|damage| damage.to_string()), None, "an intact WAL");
        // The last record's payload cut short, then its header too: a crash during its write.
        let last = *offsets.last().unwrap();
        change(&wal, |bytes| bytes.truncate(last + HEADER + 3));
        assert!(hidden_damage(dir.path()).unwrap().is_none());
        change(&wal, |bytes| bytes.truncate(last + 3));
        assert!(hidden_damage(dir.path()).unwrap().is_none());
        // A last record whose length field the crash left wrong, or left as zeros.
        change(&wal, |bytes| {
            bytes.truncate(last);
            bytes.extend_from_slice(&[0x11, 0x22, 0x33, 0x44, 0xff, 0x7f, 1, 0, 0, 0]);
        });
        assert!(hidden_damage(dir.path()).unwrap().is_none());
        change(&wal, |bytes| bytes[last..].fill(0));
        assert!(hidden_damage(dir.path()).unwrap().is_none());
        // RocksDB drops only the torn write.
        assert_eq!(recovered(dir.path()), 1_998);
    }

    #[test]
    fn a_checksum_that_fails_before_whole_records_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let wal = written(dir.path(), 300);
        let offsets = record_starts(&std::fs::read(&wal).unwrap());
        let target = offsets[100];
        change(&wal, |bytes| bytes[target + HEADER] ^= 0x5a);
        let damage = hidden_damage(dir.path()).unwrap().expect("damage found");
        assert_eq!((damage.offset, damage.next), (target as u64, offsets[101] as u64));
        assert!(damage.to_string().contains("checksum"), "{damage}");
    }

    #[test]
    fn a_database_directory_not_yet_made_has_no_damage() {
        let dir = tempfile::tempdir().unwrap();
        assert!(hidden_damage(&dir.path().join("db")).unwrap().is_none());
    }
}
