//! Snapshots of the state machine: their byte format, streamed to and from files, and the
//! directory that keeps the latest one.
//!
//! A snapshot is every entry of every state-machine table, read from one RocksDB snapshot so it
//! is a consistent view at one applied log index:
//!
//! ```text
//! magic "statestore-snapshot\x01"
//! record*: table tag (u8, `table_tag`) · key len (u32 BE) · key · value len (u32 BE) · value
//! end:     0xFF · record count (u64 BE) · CRC-32 of every byte before it (u32 BE)
//! ```
//!
//! Snapshots are never held whole in memory: [`SnapshotWriter`] streams records into a file and
//! [`RecordReader`] streams them out, checking the checksum when it reaches the end (so a
//! snapshot is [`verify`]ed in one pass before anything is installed from it).
//!
//! The directory keeps the latest snapshot as a data file (`<id>.data`, exactly the bytes above,
//! which is what openraft sends to a lagging node) and `current`, naming it with its metadata:
//!
//! ```text
//! magic "statestore-snapshot-current\x01" · meta len (u32 BE) · meta (bincode)
//!       · name len (u32 BE) · data file name
//! ```
//!
//! Each is written to a temporary file, fsynced and renamed, data first, so `current` always
//! names a complete data file. A directory from before this layout (`current` holding the data
//! inline) is converted when it is opened.

use std::fs;
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use statestore_statemachine::Table;

use crate::background::write_out;
use crate::dedup_retention;
use crate::types::SnapshotMeta;
use crate::wire::{decode, encode};

const MAGIC: &[u8] = b"statestore-snapshot\x01";
const END: u8 = 0xFF;
const CURRENT_MAGIC: &[u8] = b"statestore-snapshot-current\x01";
/// `current` before data files: the metadata and the data inline.
const INLINE_MAGIC: &[u8] = b"statestore-snapshot-file\x01";
/// How many bytes of a snapshot being built or received are written between two write-outs of
/// its pages.
pub const WRITE_OUT_EVERY: u64 = 1 << 20;
/// The longest key or value a snapshot record may hold; a longer length is damage, refused
/// before anything is allocated for it.
pub const MAX_RECORD_PART: usize = 256 << 20;
const TEMP_SUFFIX: &str = ".tmp";
const DATA_SUFFIX: &str = ".data";

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

impl SnapshotError {
    /// Whether the bytes themselves are wrong (damage), as opposed to unreadable.
    pub fn is_damage(&self) -> bool {
        matches!(self, SnapshotError::Malformed(_) | SnapshotError::Checksum)
    }
}

/// Whether `text` (an error passed on as text, e.g. through openraft) says a snapshot's bytes
/// are wrong: the texts of [`SnapshotError::Malformed`] and [`SnapshotError::Checksum`].
pub fn describes_damage(text: &str) -> bool {
    text.contains("snapshot is malformed") || text.contains("snapshot checksum mismatch")
}

/// Streams snapshot records into `W`, computing the checksum on the way.
pub struct SnapshotWriter<W: Write> {
    out: W,
    crc: crc32fast::Hasher,
    records: u64,
}

impl<W: Write> SnapshotWriter<W> {
    pub fn new(out: W) -> io::Result<Self> {
        let mut writer = SnapshotWriter { out, crc: crc32fast::Hasher::new(), records: 0 };
        writer.write(MAGIC)?;
        Ok(writer)
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.crc.update(bytes);
        self.out.write_all(bytes)
    }

    pub fn push(&mut self, table: Table, key: &[u8], value: &[u8]) -> io::Result<()> {
        self.push_tagged(table_tag(table), key, value)
    }

    /// Pushes a dedup record as earlier versions did: keyed by request.
    #[cfg(test)]
    pub(crate) fn push_request_keyed_dedup(&mut self, request_key: &[u8], record: &[u8]) -> io::Result<()> {
        self.push_tagged(DEDUP_BY_REQUEST, request_key, record)
    }

    fn push_tagged(&mut self, tag: u8, key: &[u8], value: &[u8]) -> io::Result<()> {
        self.write(&[tag])?;
        for part in [key, value] {
            self.write(&(part.len() as u32).to_be_bytes())?;
            self.write(part)?;
        }
        self.records += 1;
        Ok(())
    }

    /// Writes the end marker and the checksum; returns the output, flushed.
    pub fn finish(mut self) -> io::Result<W> {
        self.write(&[END])?;
        self.write(&self.records.to_be_bytes())?;
        let crc = self.crc.clone().finalize();
        self.out.write_all(&crc.to_be_bytes())?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// One record of a snapshot.
pub type Record = (Table, Vec<u8>, Vec<u8>);

/// Streams the records out of a snapshot. The checksum and the record count are checked when
/// the end is reached: records handed out before then are not yet known to be intact, so
/// [`verify`] a snapshot before acting on it.
pub struct RecordReader<R: Read> {
    input: R,
    crc: crc32fast::Hasher,
    records: u64,
    done: bool,
}

impl<R: Read> RecordReader<R> {
    pub fn new(input: R) -> Result<Self, SnapshotError> {
        let mut reader = RecordReader { input, crc: crc32fast::Hasher::new(), records: 0, done: false };
        let mut magic = [0u8; MAGIC.len()];
        reader.read(&mut magic)?;
        if magic != MAGIC {
            return Err(SnapshotError::Malformed("bad magic"));
        }
        Ok(reader)
    }

    fn read(&mut self, buf: &mut [u8]) -> Result<(), SnapshotError> {
        self.input.read_exact(buf).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => SnapshotError::Malformed("truncated"),
            _ => SnapshotError::Io(e),
        })?;
        self.crc.update(buf);
        Ok(())
    }

    fn part(&mut self) -> Result<Vec<u8>, SnapshotError> {
        let mut len = [0u8; 4];
        self.read(&mut len)?;
        let len = u32::from_be_bytes(len) as usize;
        if len > MAX_RECORD_PART {
            return Err(SnapshotError::Malformed("record longer than MAX_RECORD_PART"));
        }
        let mut part = vec![0u8; len];
        self.read(&mut part)?;
        Ok(part)
    }

    /// The next record; `None` once the end is reached and the whole snapshot checked.
    pub fn next_record(&mut self) -> Result<Option<Record>, SnapshotError> {
        loop {
            if self.done {
                return Ok(None);
            }
            let mut tag = [0u8; 1];
            self.read(&mut tag)?;
            if tag[0] == END {
                self.check_end()?;
                return Ok(None);
            }
            let key = self.part()?;
            let value = self.part()?;
            self.records += 1;
            match tag[0] {
                RETIRED_DEDUP_INDEX => {}
                DEDUP_BY_REQUEST => {
                    let stored = dedup_retention::stored_key(dedup_retention::retention_of(&value), &key);
                    return Ok(Some((Table::Dedup, stored, value)));
                }
                tag => return Ok(Some((table_of(tag)?, key, value))),
            }
        }
    }

    /// Checks the record count and the checksum after the end marker, and that nothing follows.
    fn check_end(&mut self) -> Result<(), SnapshotError> {
        let mut count = [0u8; 8];
        self.read(&mut count)?;
        let expected = self.crc.clone().finalize();
        let mut crc = [0u8; 4];
        self.input.read_exact(&mut crc).map_err(|_| SnapshotError::Malformed("truncated checksum"))?;
        if u32::from_be_bytes(crc) != expected {
            return Err(SnapshotError::Checksum);
        }
        if u64::from_be_bytes(count) != self.records {
            return Err(SnapshotError::Malformed("record count"));
        }
        let mut trailing = [0u8; 1];
        if self.input.read(&mut trailing)? != 0 {
            return Err(SnapshotError::Malformed("bytes after the checksum"));
        }
        self.done = true;
        Ok(())
    }
}

/// The tag of a table's records. Tags never change meaning: a snapshot written by an earlier
/// version reads the same.
pub fn table_tag(table: Table) -> u8 {
    match table {
        Table::Keys => 0,
        Table::Expiry => 1,
        Table::Watchers => 2,
        Table::WatchedKeys => 3,
        Table::Dedup => 8,
        Table::Outbox => 6,
        Table::Meta => 7,
    }
}

/// The tag of dedup records as earlier versions kept them: keyed by request, in that order. They
/// are read as dedup records keyed by retention ([`dedup_retention::stored_key`]), which puts
/// them out of key order.
const DEDUP_BY_REQUEST: u8 = 4;

/// The tag of a table earlier versions kept (an index of dedup records by retention time):
/// its records are checked like any other and skipped.
const RETIRED_DEDUP_INDEX: u8 = 5;

fn table_of(tag: u8) -> Result<Table, SnapshotError> {
    Table::ALL.into_iter().find(|table| table_tag(*table) == tag).ok_or(SnapshotError::Malformed("unknown table"))
}

/// Reads a whole snapshot file, checking framing, record count and checksum; returns how many
/// records it holds.
pub fn verify(path: &Path) -> Result<u64, SnapshotError> {
    verify_file(fs::File::open(path)?)
}

/// [`verify`] for an open file, read from where its position is.
pub fn verify_file(file: fs::File) -> Result<u64, SnapshotError> {
    let mut reader = RecordReader::new(BufReader::with_capacity(1 << 20, file))?;
    let mut count = 0;
    while reader.next_record()?.is_some() {
        count += 1;
    }
    Ok(count)
}

/// A snapshot file being built, written so that the Raft log's fsyncs do not wait behind it.
///
/// Its pages are written out every [`WRITE_OUT_EVERY`] bytes and waited for (`sync_file_range`,
/// as RocksDB's `bytes_per_sync` does): a large file written at once leaves its pages dirty until
/// the final sync, and a log fsync that comes meanwhile waits for them in the file system's
/// journal commit (ext4, ordered mode). A write-out, unlike an `fdatasync`, commits nothing to
/// the journal itself. With a `rate`, the file is written at most that many bytes a second, so
/// that the log's writes do not queue behind a build on a disk written as fast as it goes
/// (`docs/benchmarks.md`, *Snapshot builds written out and paced*). [`PacedFile::finish`]
/// syncs the file whole.
pub struct PacedFile {
    file: fs::File,
    pace: Pace,
    written: u64,
    written_out: u64,
}

impl PacedFile {
    pub fn new(file: fs::File, rate: Option<u64>) -> PacedFile {
        PacedFile { file, pace: Pace::new(rate), written: 0, written_out: 0 }
    }

    /// Where the next write goes.
    pub fn position(&self) -> u64 {
        self.written
    }

    /// Moves to `offset` for the next write, after writing out what was written so far.
    pub fn seek_to(&mut self, offset: u64) -> io::Result<()> {
        use std::io::{Seek, SeekFrom};
        self.write_out()?;
        self.file.seek(SeekFrom::Start(offset))?;
        self.written = offset;
        self.written_out = offset;
        Ok(())
    }

    /// Syncs the file and returns it.
    pub fn finish(self) -> io::Result<fs::File> {
        self.file.sync_all()?;
        Ok(self.file)
    }

    /// Writes out the pages written since the last write-out and waits for them.
    fn write_out(&mut self) -> io::Result<()> {
        write_out(&self.file, self.written_out, self.written - self.written_out)?;
        self.written_out = self.written;
        Ok(())
    }
}

/// A rate a writer holds to: from its start, no more bytes than `rate` a second.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Bytes a second; none: as fast as the disk takes them.
    rate: Option<u64>,
    started: Instant,
}

impl Pace {
    /// A pace starting now; a rate of none or 0 holds nothing back.
    pub fn new(rate: Option<u64>) -> Pace {
        Pace { rate: rate.filter(|&r| r > 0), started: Instant::now() }
    }

    /// A pace starting now at `rate`, raised as far as it takes for `bytes` to be written
    /// within `within`: a pace that holds a writer back, but never past a deadline.
    pub fn finishing_within(rate: Option<u64>, bytes: u64, within: Duration) -> Pace {
        let least = (bytes as f64 / within.as_secs_f64().max(0.001)).ceil() as u64;
        Pace::new(rate.filter(|&r| r > 0).map(|r| r.max(least)))
    }

    /// Sleeps until `written`, the bytes written since the start, are no more than the rate
    /// allows.
    pub fn hold(&self, written: u64) {
        let Some(rate) = self.rate else { return };
        let due = Duration::from_secs_f64(written as f64 / rate as f64);
        if let Some(early) = due.checked_sub(self.started.elapsed()) {
            std::thread::sleep(early);
        }
    }
}

impl Write for PacedFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = self.file.write(buf)?;
        self.written += written as u64;
        if self.written - self.written_out >= WRITE_OUT_EVERY {
            self.write_out()?;
            self.pace.hold(self.written);
        }
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// The directory holding the latest snapshot.
#[derive(Debug, Clone)]
pub struct SnapshotDir {
    dir: PathBuf,
    next_temp: Arc<AtomicU64>,
    /// One [`SnapshotDir::keep`] at a time: a build and an install may finish together, and
    /// both write `current` through one temporary file and remove the other data files.
    keeping: Arc<Mutex<()>>,
}

impl SnapshotDir {
    /// A new temporary path in the directory, removed on the next open if it is left behind.
    pub fn temp_path(&self, name: &str) -> PathBuf {
        let n = self.next_temp.fetch_add(1, Ordering::Relaxed);
        self.dir.join(format!("{name}-{}-{n}{TEMP_SUFFIX}", std::process::id()))
    }

    /// Opens the directory: removes temporary files of interrupted writes and converts a
    /// `current` from before data files.
    pub fn new(dir: impl Into<PathBuf>) -> Result<SnapshotDir, SnapshotError> {
        let dir = dir.into();
        fs::create_dir_all(&dir)?;
        for entry in fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.to_string_lossy().ends_with(TEMP_SUFFIX) {
                fs::remove_file(&path)?;
            }
        }
        let snapshots = SnapshotDir { dir, next_temp: Arc::new(AtomicU64::new(0)), keeping: Arc::default() };
        snapshots.convert_inline()?;
        Ok(snapshots)
    }

    fn current_path(&self) -> PathBuf {
        self.dir.join("current")
    }

    /// A new temporary file in the directory, open for reading and writing.
    pub fn create_temp(&self) -> io::Result<(PathBuf, fs::File)> {
        let path = self.temp_path("incoming");
        let file = fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path)?;
        Ok((path, file))
    }

    /// Makes the complete, verified snapshot in `temp` the kept one, atomically and durably;
    /// returns the path of its data file. Older data files are removed. A snapshot older than the
    /// kept one (a build that finished after an install of a later one) is left beside it, not
    /// kept, and removed by the next keep.
    pub fn keep(&self, meta: &SnapshotMeta, temp: &Path) -> Result<PathBuf, SnapshotError> {
        let _one_at_a_time = self.keeping.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        fs::File::open(temp)?.sync_all()?;
        let name = data_file_name(&meta.snapshot_id);
        let data = self.dir.join(&name);
        fs::rename(temp, &data)?;
        sync_dir(&self.dir)?;
        if self.current().ok().flatten().is_some_and(|(kept, _)| kept.last_log_id > meta.last_log_id) {
            return Ok(data);
        }
        let meta_bytes = encode(meta).map_err(|_| SnapshotError::Malformed("meta does not encode"))?;
        let mut current = Vec::with_capacity(CURRENT_MAGIC.len() + meta_bytes.len() + name.len() + 8);
        current.extend_from_slice(CURRENT_MAGIC);
        for part in [&meta_bytes[..], name.as_bytes()] {
            current.extend_from_slice(&(part.len() as u32).to_be_bytes());
            current.extend_from_slice(part);
        }
        let tmp = self.dir.join(format!("current{TEMP_SUFFIX}"));
        let mut file = fs::File::create(&tmp)?;
        file.write_all(&current)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, self.current_path())?;
        sync_dir(&self.dir)?;
        // Readers that opened an older data file keep reading it until they close it; its
        // blocks are freed after that, a step at a time (`file_removal`).
        for entry in fs::read_dir(&self.dir)? {
            let path = entry?.path();
            if path != data && path.to_string_lossy().ends_with(DATA_SUFFIX) {
                crate::file_removal::remove(&path)?;
            }
        }
        Ok(data)
    }

    /// The kept snapshot's metadata and data file, if any.
    pub fn current(&self) -> Result<Option<(SnapshotMeta, PathBuf)>, SnapshotError> {
        let bytes = match fs::read(self.current_path()) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let rest = bytes.strip_prefix(CURRENT_MAGIC).ok_or(SnapshotError::Malformed("bad magic in current"))?;
        let (meta, rest) = take_part(rest)?;
        let (name, rest) = take_part(rest)?;
        if !rest.is_empty() {
            return Err(SnapshotError::Malformed("bytes after the data file name in current"));
        }
        let meta: SnapshotMeta = decode(meta).map_err(|_| SnapshotError::Malformed("meta does not decode"))?;
        let name = std::str::from_utf8(name).map_err(|_| SnapshotError::Malformed("data file name"))?;
        if name != data_file_name(&meta.snapshot_id) {
            return Err(SnapshotError::Malformed("current names another snapshot's data file"));
        }
        Ok(Some((meta, self.dir.join(name))))
    }

    /// Converts a `current` holding its data inline into a data file and a `current` naming it.
    fn convert_inline(&self) -> Result<(), SnapshotError> {
        let bytes = match fs::read(self.current_path()) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let Some(rest) = bytes.strip_prefix(INLINE_MAGIC) else { return Ok(()) };
        let (meta, data) = take_part(rest)?;
        let meta: SnapshotMeta = decode(meta).map_err(|_| SnapshotError::Malformed("meta does not decode"))?;
        let (temp, mut file) = self.create_temp()?;
        file.write_all(data)?;
        drop(file);
        verify(&temp)?;
        self.keep(&meta, &temp)?;
        tracing::info!(snapshot = meta.snapshot_id, "converted the kept snapshot to a data file");
        Ok(())
    }
}

/// The data file of a snapshot: its id, with anything but ASCII letters, digits, `-` and `_`
/// replaced (the id comes from whichever node built it).
fn data_file_name(snapshot_id: &str) -> String {
    let safe: String = snapshot_id
        .chars()
        .take(128)
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
        .collect();
    format!("snapshot-{safe}{DATA_SUFFIX}")
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

fn sync_dir(dir: &Path) -> io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::LogId;

    /// Writes a snapshot of `records` to `out`.
    fn write_all<W: Write>(out: W, records: &[(Table, &[u8], &[u8])]) -> io::Result<W> {
        let mut writer = SnapshotWriter::new(out)?;
        for (table, key, value) in records {
            writer.push(*table, key, value)?;
        }
        writer.finish()
    }

    fn sample() -> Vec<u8> {
        write_all(
            Vec::new(),
            &[(Table::Keys, b"k", b"v"), (Table::Meta, b"", &[0xFF; 3]), (Table::Outbox, &[0; 8], b"")],
        )
        .unwrap()
    }

    fn read_all(bytes: &[u8]) -> Result<Vec<Record>, SnapshotError> {
        let mut reader = RecordReader::new(bytes)?;
        let mut records = Vec::new();
        while let Some(record) = reader.next_record()? {
            records.push(record);
        }
        Ok(records)
    }

    /// Writes `len` patterned bytes through a [`PacedFile`] at `rate` in `dir`; returns what
    /// the file then holds and how long writing took.
    fn write_paced(dir: &Path, len: usize, rate: Option<u64>) -> (Vec<u8>, Vec<u8>, Duration) {
        let path = dir.join("paced");
        let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let started = Instant::now();
        let mut out = io::BufWriter::with_capacity(1 << 20, PacedFile::new(fs::File::create(&path).unwrap(), rate));
        for chunk in bytes.chunks(100_000) {
            out.write_all(chunk).unwrap();
        }
        out.into_inner().map_err(|e| e.into_error()).unwrap().finish().unwrap();
        let took = started.elapsed();
        (bytes, fs::read(&path).unwrap(), took)
    }

    #[test]
    fn a_paced_file_holds_every_byte_and_is_written_no_faster_than_its_rate() {
        let dir = tempfile::tempdir().unwrap();
        // 3 MiB at 8 MiB/s: the third write-out waits until 375 ms after the start.
        let (written, held, took) = write_paced(dir.path(), (3 << 20) + 17, Some(8 << 20));
        assert!(written == held, "the file holds what was written");
        assert!(took >= Duration::from_millis(375), "3 MiB at 8 MiB/s written in {took:?}");
        for unlimited in [None, Some(0)] {
            let (written, held, _) = write_paced(dir.path(), (2 << 20) + 5, unlimited);
            assert!(written == held, "the file holds what was written ({unlimited:?})");
        }
    }

    /// Makes `sync_file_range` fail with `errno` in the calling thread and the threads it
    /// starts from now on, as on a file system or kernel without it: a seccomp filter, which
    /// cannot be removed, so only for a thread of its own.
    fn without_sync_file_range(errno: i32) {
        let instruction = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter { code: code as u16, jt, jf, k };
        let mut program = [
            // The syscall's number, the first field of `seccomp_data`.
            instruction(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 0),
            instruction(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, 0, 1, libc::SYS_sync_file_range as u32),
            instruction(libc::BPF_RET | libc::BPF_K, 0, 0, libc::SECCOMP_RET_ERRNO | errno as u32),
            instruction(libc::BPF_RET | libc::BPF_K, 0, 0, libc::SECCOMP_RET_ALLOW),
        ];
        let filter = libc::sock_fprog { len: program.len() as u16, filter: program.as_mut_ptr() };
        // SAFETY: plain prctl calls; the filter is copied by the kernel before the call returns.
        unsafe {
            assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0, "{}", io::Error::last_os_error());
            assert_eq!(
                libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &filter as *const libc::sock_fprog),
                0,
                "{}",
                io::Error::last_os_error()
            );
        }
    }

    /// Where `sync_file_range` is missing (ENOSYS) or refused (EINVAL), a paced file syncs its
    /// data instead of failing the snapshot, and holds every byte.
    #[test]
    fn a_paced_file_syncs_its_data_where_sync_file_range_is_missing() {
        for errno in [libc::ENOSYS, libc::EINVAL] {
            let dir = tempfile::tempdir().unwrap();
            let (written, held) = std::thread::spawn({
                let dir = dir.path().to_path_buf();
                move || {
                    without_sync_file_range(errno);
                    let file = fs::File::create(dir.join("probe")).unwrap();
                    let error = write_out(&file, 0, 0).err();
                    // SAFETY: the descriptor is open; no memory is passed.
                    let direct = unsafe { libc::sync_file_range(std::os::fd::AsRawFd::as_raw_fd(&file), 0, 0, 0) };
                    assert_eq!((direct, io::Error::last_os_error().raw_os_error()), (-1, Some(errno)), "injected");
                    assert!(error.is_none(), "write_out failed: {error:?}");
                    let (written, held, _) = write_paced(&dir, (3 << 20) + 11, None);
                    (written, held)
                }
            })
            .join()
            .unwrap();
            assert!(written == held, "the file holds what was written (errno {errno})");
        }
        // Any other failure is reported.
        let dir = tempfile::tempdir().unwrap();
        let error = std::thread::spawn({
            let dir = dir.path().to_path_buf();
            move || {
                without_sync_file_range(libc::EIO);
                write_out(&fs::File::create(dir.join("probe")).unwrap(), 0, 0).unwrap_err().raw_os_error()
            }
        })
        .join()
        .unwrap();
        assert_eq!(error, Some(libc::EIO));
    }

    #[test]
    fn a_paced_file_sent_back_to_an_earlier_offset_holds_what_was_written_last() {
        // A receiver whose chunk is sent again writes it again at its offset.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("received");
        let mut file = PacedFile::new(fs::File::create(&path).unwrap(), None);
        let first: Vec<u8> = (0..(3 << 20)).map(|i| (i % 251) as u8).collect();
        file.write_all(&first).unwrap();
        let again = vec![7u8; 1 << 20];
        file.seek_to(1 << 20).unwrap();
        file.write_all(&again).unwrap();
        file.write_all(&first[(2 << 20)..]).unwrap();
        file.finish().unwrap();
        let mut expected = first.clone();
        expected[(1 << 20)..(2 << 20)].copy_from_slice(&again);
        assert!(fs::read(&path).unwrap() == expected, "the file holds the chunk written last at its offset");
    }

    #[test]
    fn records_round_trip() {
        assert_eq!(
            read_all(&sample()).unwrap(),
            vec![
                (Table::Keys, b"k".to_vec(), b"v".to_vec()),
                (Table::Meta, b"".to_vec(), vec![0xFF; 3]),
                (Table::Outbox, vec![0; 8], b"".to_vec())
            ]
        );
    }

    #[test]
    fn records_of_the_retired_dedup_index_are_checked_and_skipped() {
        let mut writer = SnapshotWriter::new(Vec::new()).unwrap();
        writer.push(Table::Keys, b"k", b"v").unwrap();
        // As an earlier version wrote its dedup index: tag 5, an empty value.
        writer.write(&[RETIRED_DEDUP_INDEX, 0, 0, 0, 2, b'i', b'x', 0, 0, 0, 0]).unwrap();
        writer.records += 1;
        writer.push(Table::Meta, b"m", b"").unwrap();
        let bytes = writer.finish().unwrap();
        assert_eq!(
            read_all(&bytes).unwrap(),
            vec![(Table::Keys, b"k".to_vec(), b"v".to_vec()), (Table::Meta, b"m".to_vec(), Vec::new())]
        );
    }

    #[test]
    fn tags_are_distinct_and_stable() {
        let tags: Vec<u8> = Table::ALL.iter().map(|t| table_tag(*t)).collect();
        assert_eq!(tags, vec![0, 1, 2, 3, 8, 6, 7]);
        for table in Table::ALL {
            assert_eq!(table_of(table_tag(table)).unwrap(), table);
        }
    }

    /// Refused as damage, and said so in a text that is recognized as damage where only the
    /// text travels (through openraft's errors).
    fn assert_is_damage<T: std::fmt::Debug>(read: Result<T, SnapshotError>, what: &str) {
        let e = read.expect_err(what);
        assert!(e.is_damage() && describes_damage(&e.to_string()), "{what}: {e}");
    }

    #[test]
    fn every_flipped_bit_and_every_truncation_is_refused() {
        let bytes = sample();
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut damaged = bytes.clone();
                damaged[i] ^= 1 << bit;
                assert_is_damage(read_all(&damaged), &format!("bit {bit} of byte {i}"));
            }
            assert_is_damage(read_all(&bytes[..i]), &format!("truncated to {i}"));
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(read_all(&longer).is_err(), "a trailing byte");
    }

    #[test]
    fn a_huge_length_is_refused_before_it_is_allocated() {
        let mut bytes = MAGIC.to_vec();
        bytes.push(0);
        bytes.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(read_all(&bytes), Err(SnapshotError::Malformed(_))));
    }

    #[test]
    fn an_empty_snapshot_is_valid() {
        assert!(read_all(&write_all(Vec::new(), &[]).unwrap()).unwrap().is_empty());
    }

    fn meta(id: &str) -> SnapshotMeta {
        SnapshotMeta { last_log_id: None, last_membership: Default::default(), snapshot_id: id.into() }
    }

    #[test]
    fn the_directory_keeps_one_snapshot_and_forgets_interrupted_writes() {
        let dir = tempfile::tempdir().unwrap();
        let snapshots = SnapshotDir::new(dir.path()).unwrap();
        assert!(snapshots.current().unwrap().is_none());
        for id in ["1-1-10", "1-1-20/../x"] {
            let (temp, file) = snapshots.create_temp().unwrap();
            write_all(file, &[(Table::Keys, id.as_bytes(), b"v")]).unwrap();
            let data = snapshots.keep(&meta(id), &temp).unwrap();
            assert!(data.starts_with(dir.path()), "{data:?} stays in the directory");
            let (kept, path) = snapshots.current().unwrap().unwrap();
            assert_eq!(kept.snapshot_id, id);
            assert_eq!(path, data);
            assert_eq!(verify(&path).unwrap(), 1);
        }
        let (_abandoned, _) = snapshots.create_temp().unwrap();
        let files = |dir: &Path| fs::read_dir(dir).unwrap().count();
        assert_eq!(files(dir.path()), 3, "current, one data file, one temporary file");
        let reopened = SnapshotDir::new(dir.path()).unwrap();
        assert_eq!(files(dir.path()), 2, "the temporary file is gone");
        assert_eq!(reopened.current().unwrap().unwrap().0.snapshot_id, "1-1-20/../x");
    }

    /// A build and an install that finish together: `current` always names a data file that
    /// exists, and the latest snapshot stays the kept one.
    #[test]
    fn concurrent_keeps_leave_the_latest_snapshot_kept_and_readable() {
        let dir = tempfile::tempdir().unwrap();
        let snapshots = SnapshotDir::new(dir.path()).unwrap();
        let log_id = |index| Some(LogId::new(openraft::CommittedLeaderId::new(1, 1), index));
        let keepers: Vec<_> = (0..2u64)
            .map(|side| {
                let snapshots = snapshots.clone();
                std::thread::spawn(move || {
                    for round in 0..100u64 {
                        let index = round * 2 + side;
                        let (temp, file) = snapshots.create_temp().unwrap();
                        write_all(file, &[(Table::Keys, &index.to_be_bytes(), b"v")]).unwrap();
                        let meta = SnapshotMeta {
                            last_log_id: log_id(index),
                            last_membership: Default::default(),
                            snapshot_id: format!("1-{index}-{side}"),
                        };
                        snapshots.keep(&meta, &temp).unwrap();
                        let (kept, path) = snapshots.current().unwrap().expect("a kept snapshot");
                        assert!(kept.last_log_id >= log_id(index), "the kept snapshot went back");
                        // The kept data file is there (another keep may replace it meanwhile).
                        if let Ok(file) = fs::File::open(&path) {
                            drop(file);
                        }
                    }
                })
            })
            .collect();
        for keeper in keepers {
            keeper.join().unwrap();
        }
        let (kept, path) = snapshots.current().unwrap().unwrap();
        assert_eq!(kept.last_log_id, log_id(199));
        assert_eq!(verify(&path).unwrap(), 1);
    }

    #[test]
    fn a_current_file_with_inline_data_is_converted() {
        let dir = tempfile::tempdir().unwrap();
        let data = sample();
        let meta_bytes = encode(&meta("old")).unwrap();
        let mut inline = INLINE_MAGIC.to_vec();
        inline.extend_from_slice(&(meta_bytes.len() as u32).to_be_bytes());
        inline.extend_from_slice(&meta_bytes);
        inline.extend_from_slice(&data);
        fs::write(dir.path().join("current"), inline).unwrap();
        let snapshots = SnapshotDir::new(dir.path()).unwrap();
        let (kept, path) = snapshots.current().unwrap().unwrap();
        assert_eq!(kept.snapshot_id, "old");
        assert_eq!(fs::read(path).unwrap(), data);
    }
}
