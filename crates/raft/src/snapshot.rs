//! Snapshots of the state machine: their byte format and the file that keeps the latest one.
//!
//! A snapshot is every entry of every state-machine table, read from one RocksDB snapshot so it
//! is a consistent view at one applied log index:
//!
//! ```text
//! magic "statestore-snapshot\x01"
//! record*: table (u8, index in Table::ALL) · key len (u32 BE) · key · value len (u32 BE) · value
//! end:     0xFF · record count (u64 BE) · CRC-32 of every byte before it (u32 BE)
//! ```
//!
//! The latest snapshot is kept in `<dir>/current` (written to a temporary file, fsynced, then
//! renamed) so it can be sent to a lagging node after the log it replaces has been purged.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use statestore_statemachine::Table;

use crate::types::SnapshotMeta;
use crate::wire::{decode, encode};

const MAGIC: &[u8] = b"statestore-snapshot\x01";
const END: u8 = 0xFF;
const FILE_MAGIC: &[u8] = b"statestore-snapshot-file\x01";
/// How many snapshot bytes are written between two syncs of the file.
const SYNC_EVERY: usize = 4 << 20;

/// Why snapshot bytes could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot is malformed: {0}")]
    Malformed(&'static str),
    #[error("snapshot checksum mismatch")]
    Checksum,
    #[error("snapshot file: {0}")]
    Io(#[from] io::Error),
}

/// Writes snapshot records.
pub struct SnapshotWriter {
    bytes: Vec<u8>,
    records: u64,
}

impl Default for SnapshotWriter {
    fn default() -> Self {
        SnapshotWriter { bytes: MAGIC.to_vec(), records: 0 }
    }
}

impl SnapshotWriter {
    pub fn push(&mut self, table: Table, key: &[u8], value: &[u8]) {
        let tag = Table::ALL.iter().position(|t| *t == table).expect("every table is in Table::ALL") as u8;
        self.bytes.push(tag);
        for part in [key, value] {
            self.bytes.extend_from_slice(&(part.len() as u32).to_be_bytes());
            self.bytes.extend_from_slice(part);
        }
        self.records += 1;
    }

    pub fn finish(mut self) -> Vec<u8> {
        self.bytes.push(END);
        self.bytes.extend_from_slice(&self.records.to_be_bytes());
        let crc = crc32fast::hash(&self.bytes);
        self.bytes.extend_from_slice(&crc.to_be_bytes());
        self.bytes
    }
}

/// One record of a snapshot.
pub type Record<'a> = (Table, &'a [u8], &'a [u8]);

/// Checks the whole snapshot (framing, count, checksum) and returns its records.
pub fn records(bytes: &[u8]) -> Result<Vec<Record<'_>>, SnapshotError> {
    let body_len = bytes.len().checked_sub(4).ok_or(SnapshotError::Malformed("too short"))?;
    let crc = u32::from_be_bytes(bytes[body_len..].try_into().expect("4 bytes"));
    if crc32fast::hash(&bytes[..body_len]) != crc {
        return Err(SnapshotError::Checksum);
    }
    let body = bytes[..body_len].strip_prefix(MAGIC).ok_or(SnapshotError::Malformed("bad magic"))?;
    let mut records = Vec::new();
    let mut rest = body;
    loop {
        let (&tag, after_tag) = rest.split_first().ok_or(SnapshotError::Malformed("missing end"))?;
        if tag == END {
            let count: [u8; 8] = after_tag.try_into().map_err(|_| SnapshotError::Malformed("bad end"))?;
            if u64::from_be_bytes(count) != records.len() as u64 {
                return Err(SnapshotError::Malformed("record count"));
            }
            return Ok(records);
        }
        let table = *Table::ALL.get(usize::from(tag)).ok_or(SnapshotError::Malformed("unknown table"))?;
        let (key, after_key) = take_part(after_tag)?;
        let (value, after_value) = take_part(after_key)?;
        records.push((table, key, value));
        rest = after_value;
    }
}

fn take_part(bytes: &[u8]) -> Result<(&[u8], &[u8]), SnapshotError> {
    if bytes.len() < 4 {
        return Err(SnapshotError::Malformed("truncated length"));
    }
    let (len, rest) = bytes.split_at(4);
    let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
    if rest.len() < len {
        return Err(SnapshotError::Malformed("truncated record"));
    }
    Ok(rest.split_at(len))
}

/// The directory holding the latest snapshot.
#[derive(Debug, Clone)]
pub struct SnapshotDir {
    dir: PathBuf,
}

impl SnapshotDir {
    pub fn new(dir: impl Into<PathBuf>) -> io::Result<SnapshotDir> {
        let dir = dir.into();
        fs::create_dir_all(&dir)?;
        Ok(SnapshotDir { dir })
    }

    fn current(&self) -> PathBuf {
        self.dir.join("current")
    }

    /// Replaces the kept snapshot, atomically and durably.
    pub fn save(&self, meta: &SnapshotMeta, data: &[u8]) -> Result<(), SnapshotError> {
        let meta = encode(meta).map_err(|_| SnapshotError::Malformed("meta does not encode"))?;
        let tmp = self.dir.join("current.tmp");
        let mut file = fs::File::create(&tmp)?;
        file.write_all(FILE_MAGIC)?;
        file.write_all(&(meta.len() as u32).to_be_bytes())?;
        file.write_all(&meta)?;
        // In steps, each synced: a large file written at once leaves its pages dirty until the
        // final sync, and every WAL fsync meanwhile waits for them (ext4 ordered mode).
        for chunk in data.chunks(SYNC_EVERY) {
            file.write_all(chunk)?;
            file.sync_data()?;
        }
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, self.current())?;
        sync_dir(&self.dir)?;
        Ok(())
    }

    /// The kept snapshot, if any; its data is checked before it is returned.
    pub fn load(&self) -> Result<Option<(SnapshotMeta, Vec<u8>)>, SnapshotError> {
        let bytes = match fs::read(self.current()) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let rest = bytes.strip_prefix(FILE_MAGIC).ok_or(SnapshotError::Malformed("bad file magic"))?;
        let (meta, data) = take_part(rest)?;
        let meta: SnapshotMeta = decode(meta).map_err(|_| SnapshotError::Malformed("meta does not decode"))?;
        records(data)?;
        Ok(Some((meta, data.to_vec())))
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let mut writer = SnapshotWriter::default();
        writer.push(Table::Keys, b"k", b"v");
        writer.push(Table::Meta, b"", &[0xFF; 3]);
        writer.push(Table::Outbox, &[0; 8], b"");
        writer.finish()
    }

    #[test]
    fn records_round_trip() {
        let bytes = sample();
        let records = records(&bytes).unwrap();
        assert_eq!(
            records,
            vec![
                (Table::Keys, &b"k"[..], &b"v"[..]),
                (Table::Meta, &b""[..], &[0xFF; 3][..]),
                (Table::Outbox, &[0; 8][..], &b""[..])
            ]
        );
    }

    #[test]
    fn every_flipped_bit_and_every_truncation_is_refused() {
        let bytes = sample();
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut damaged = bytes.clone();
                damaged[i] ^= 1 << bit;
                assert!(records(&damaged).is_err(), "bit {bit} of byte {i}");
            }
            assert!(records(&bytes[..i]).is_err(), "truncated to {i}");
        }
    }

    #[test]
    fn an_empty_snapshot_is_valid() {
        assert!(records(&SnapshotWriter::default().finish()).unwrap().is_empty());
    }
}
