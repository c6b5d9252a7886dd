//! The Raft log's files: records appended to segment files allocated whole before they are used,
//! made durable with `fdatasync`.
//!
//! Why files of their own instead of a RocksDB column family: RocksDB's write-ahead log grows
//! with every write, and on ext4 an `fdatasync` of a file that grew must also commit the file's
//! new size to the filesystem's journal. A segment is allocated at its full size before its
//! first record, so an append writes inside the file. On this project's test machine an
//! fdatasync after a 6 KB append took 0.8–2.3 ms on average (p90 2–4 ms) in a growing file and
//! 0.15–0.22 ms (p90 0.2 ms) inside an allocated one; every write waits for that fsync on the
//! leader and on a follower. Allocated with `fallocate` alone, the file's space is unwritten
//! extents, and the first write into each changes the file's metadata again (on another day
//! 0.37–0.47 ms on average against 0.24–0.27 ms in a file already written with zeros): so each
//! segment is written with zeros ahead of need, by a thread of its own, while the one before it
//! fills ([`Spare`]), and `fallocate` serves only a segment needed before its spare is ready.
//!
//! A directory holds `<first index, 20 digits>.segment` files, each holding the records from its
//! first index on, one after the other without gaps. A record is a 16-byte header (payload
//! length, u32 little-endian; CRC-32 of the index and the payload, u32; the index, u64), the
//! payload, and zeros up to a multiple of 16 bytes. Records start at multiples of 16, so a header
//! never straddles a disk sector: a crash leaves it whole or unwritten (zeros). Every byte after
//! a segment's last record is zero.
//!
//! Opening reads every segment, a [`WINDOW`] at a time (a record larger than that whole), so a
//! node does not hold a 64 MiB segment in memory to open it. A header of zeros ends a
//! segment's records. A power cut leaves of an append not yet fsynced any mix of its 512-byte
//! sectors written and not (zeros), so the log's tail may end in a record with a sector of
//! zeros, a header of zeros with written sectors after it, or, where the append went on into
//! the next segment, a segment starting after entries its predecessor (not full) never got: a
//! torn tail, cut off there ([`LogFiles::open_holding`]). It is damage, and opening fails
//! instead of dropping what follows, when a whole record of an entry the node had committed
//! lies after it (the node flushes in order and commits only what it has flushed, so the torn
//! record was flushed), and so is any other bad record: a checksum that fails with every sector
//! written, an index out of order, a length past the file's end, a segment missing after a full
//! one. Segments after a cut are deleted (the last first, each durably), then the bytes left
//! after the last whole record are zeroed and synced, before the log is used again: a stale
//! record must never look like the continuation of new ones.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes of a new segment (a larger record gets a segment of its own size).
pub const SEGMENT_BYTES: u64 = 64 << 20;
const HEADER: usize = 16;
const ALIGN: u64 = 16;
const SECTOR: usize = 512;
const SUFFIX: &str = ".segment";

/// Whether an error's text (as it reaches the node through openraft) says a log file is damaged.
pub fn describes_damage(text: &str) -> bool {
    text.contains("the Raft log file") && text.contains("is damaged at byte")
}

/// What can go wrong with the log's files.
#[derive(Debug, thiserror::Error)]
pub enum LogFileError {
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("the Raft log file {path} is damaged at byte {offset}: {detail}")]
    Damaged { path: String, offset: u64, detail: String },
    #[error("the Raft log cannot take entry {index}: {detail}")]
    OutOfOrder { index: u64, detail: String },
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> LogFileError + '_ {
    move |source| LogFileError::Io { path: path.display().to_string(), source }
}

/// One segment file, shared with the thread that fsyncs it.
#[derive(Debug)]
pub struct SegmentFile {
    path: PathBuf,
    file: File,
}

impl SegmentFile {
    /// Makes what was written to the file durable (its size does not change, so no metadata).
    pub fn sync(&self) -> Result<(), LogFileError> {
        self.file.sync_data().map_err(io_error(&self.path))
    }
}

struct Segment {
    /// The index of its first record (the one it holds or would hold).
    first: u64,
    file: Arc<SegmentFile>,
    /// Where each record starts: record `first + i` at `offsets[i]`.
    offsets: Vec<u64>,
    /// Bytes in use; everything from here on is zero.
    head: u64,
    capacity: u64,
}

impl Segment {
    fn next_index(&self) -> u64 {
        self.first + self.offsets.len() as u64
    }

    fn last_index(&self) -> Option<u64> {
        (!self.offsets.is_empty()).then(|| self.next_index() - 1)
    }
}

/// The log's records, in files; see the module's documentation.
pub struct LogFiles {
    dir: PathBuf,
    /// In index order, contiguous.
    segments: Vec<Segment>,
    /// Records up to here are purged: never read, gone with their segment.
    purged: Option<u64>,
    /// The next segment, being written with zeros ([`Spare`]).
    spare: Option<Spare>,
}

/// A file of [`SEGMENT_BYTES`] zeros that a thread of its own writes while the last segment
/// fills, to become the next segment. A segment only `fallocate`d holds unwritten extents, and
/// the first write into each turns it into a written one, a change of the file's metadata that
/// the `fdatasync` after the append must commit to the filesystem's journal; in a file already
/// written the `fdatasync` writes the data blocks alone (about 40% less time per `fdatasync`
/// on the test machine). Writing 64 MiB of zeros takes far longer than an append may wait, so
/// it is done ahead of need, at the lowest priorities, with direct I/O at
/// [`SPARE_WRITE_RATE`] where the file system has it ([`write_spare`]); a segment needed before
/// its spare is ready is `fallocate`d as before.
struct Spare {
    path: PathBuf,
    written: std::thread::JoinHandle<io::Result<()>>,
}

/// The last segment is this full when its spare starts being written.
const SPARE_AFTER: u64 = SEGMENT_BYTES / 2;

impl Spare {
    /// Starts writing a spare into `dir`, under a name no other spare of this process has (a
    /// log opened again in the same directory may still have an earlier spare being written).
    fn start(dir: &Path) -> io::Result<Spare> {
        static STARTED: AtomicU64 = AtomicU64::new(0);
        let n = STARTED.fetch_add(1, Ordering::Relaxed);
        // Ends in `.tmp`: opening the log removes it, as an unfinished file.
        let path = dir.join(format!("spare-{}-{n}.tmp", std::process::id()));
        let target = path.clone();
        let written = std::thread::Builder::new().name("log-spare".into()).spawn(move || {
            crate::background::lower_priority();
            write_spare(&target, SEGMENT_BYTES)
        })?;
        Ok(Spare { path, written })
    }

    /// The spare's file, if it is written whole; `None` while it is still being written (it
    /// stays for the next segment) or if writing it failed.
    fn take(spare: &mut Option<Spare>) -> Option<PathBuf> {
        if !spare.as_ref()?.written.is_finished() {
            return None;
        }
        let Spare { path, written } = spare.take()?;
        match written.join() {
            Ok(Ok(())) => return Some(path),
            Ok(Err(error)) => {
                tracing::warn!(path = %path.display(), %error, "could not write the Raft log's next segment ahead")
            }
            Err(_) => tracing::warn!(path = %path.display(), "the thread writing the Raft log's next segment panicked"),
        }
        let _ = std::fs::remove_file(&path);
        None
    }
}

/// Bytes a second a spare is written at most with direct I/O: 64 MiB, a segment's, in a second.
/// A writer as fast as the disk (1.5 GB/s on the test machine) makes the log fsyncs of every
/// node on the disk queue behind it meanwhile.
pub const SPARE_WRITE_RATE: u64 = 64 << 20;

/// Writes a new file at `path` of `len` zeros and syncs it.
///
/// With direct I/O (`O_DIRECT`) where the file system has it, at [`SPARE_WRITE_RATE`]; the
/// file's pages are then read into the page cache ahead of the appends (`POSIX_FADV_WILLNEED`),
/// which would otherwise read each page they start from the disk first. Through the page cache,
/// the CPU copying 64 MiB of zeros into it, and taking fresh pages for them, came to about 0.14
/// s of a core per segment, and the three nodes of a cluster start their spares at the same
/// log index, so at once: on two cores, a request waited up to 20 ms more while they did
/// (docs/benchmarks.md, *Log segments written ahead with direct I/O*). Where direct I/O is
/// refused the spare goes through the page cache, each MiB written out before
/// the next.
fn write_spare(path: &Path, len: u64) -> io::Result<()> {
    match write_spare_direct(path, len) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            let _ = std::fs::remove_file(path);
        }
        written => return written,
    }
    // The refused attempt removed: the file is made anew.
    let file = OpenOptions::new().write(true).create_new(true).open(path)?;
    write_zeros(&file, 0, len, |at, n| crate::background::write_out(&file, at, n))?;
    file.sync_all()
}

/// [`write_spare`] with direct I/O; `EINVAL` where the file system refuses it (or `len` is not
/// a multiple of the 4 KiB direct I/O needs).
fn write_spare_direct(path: &Path, len: u64) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    const ALIGN: usize = 4096;
    const CHUNK: u64 = 1 << 20;
    if !len.is_multiple_of(ALIGN as u64) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let file = OpenOptions::new().write(true).create_new(true).custom_flags(libc::O_DIRECT).open(path)?;
    // Direct I/O reads the buffer at an address aligned as the disk's blocks are.
    let buffer = vec![0u8; CHUNK as usize + ALIGN];
    let skip = buffer.as_ptr().align_offset(ALIGN);
    let zeros = &buffer[skip..skip + CHUNK as usize];
    let pace = crate::snapshot::Pace::new(Some(SPARE_WRITE_RATE));
    let mut at = 0;
    while at < len {
        let n = CHUNK.min(len - at);
        file.write_all_at(&zeros[..n as usize], at)?;
        at += n;
        pace.hold(at);
    }
    file.sync_all()?;
    // SAFETY: advice on the open descriptor's pages; no memory is passed.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, len as libc::off_t, libc::POSIX_FADV_WILLNEED) };
    Ok(())
}

impl Drop for LogFiles {
    fn drop(&mut self) {
        // A spare still being written is removed by the next open.
        if let Some(path) = Spare::take(&mut self.spare) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// What opening found and repaired, and what it held in memory, for the log.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Bytes zeroed after the last whole record (an unfinished write).
    pub zeroed_bytes: u64,
    /// Segments deleted after a cut.
    pub deleted_segments: usize,
    /// The most bytes of a segment held in memory at once while reading it: [`WINDOW`], or a
    /// record larger than that with the rest of the sector it ends in.
    pub held_at_once: u64,
    /// The first entry of a torn tail cut off (the log then holds the entries before it).
    pub cut_at: Option<u64>,
}

/// Where a torn tail begins in a segment: its first entry, and the bytes to zero (`from` is
/// the segment's new head; nothing to zero when `to <= from`).
#[derive(Debug, Clone, Copy)]
struct Cut {
    index: u64,
    from: u64,
    to: u64,
}

/// What reading one segment found.
struct ReadSegment {
    segment: Segment,
    /// A torn tail in this segment: the log ends here, later segments go.
    cut: Option<Cut>,
    held_at_once: u64,
}

/// Bytes of a segment read at once while opening: a segment is not held whole in memory
/// (a full one is [`SEGMENT_BYTES`], and a spare is zeros all the way to its end).
pub const WINDOW: u64 = 1 << 20;

/// A stretch of a segment's file in memory, moved forward as opening reads the file. Bytes at
/// or past `written` are zeros without being read (space allocated and never written).
struct Window<'a> {
    file: &'a File,
    written: u64,
    capacity: u64,
    /// The file's bytes from `start` on.
    bytes: Vec<u8>,
    start: u64,
    /// The most bytes held at once.
    largest: u64,
}

impl<'a> Window<'a> {
    fn new(file: &'a File, written: u64, capacity: u64) -> Self {
        Window { file, written, capacity, bytes: Vec::new(), start: 0, largest: 0 }
    }

    /// The file's bytes `from..to` (`to` at most its length), read into the window if it does
    /// not hold them: at least [`WINDOW`] bytes from `from` on, where the file has them.
    fn bytes(&mut self, from: u64, to: u64) -> io::Result<&[u8]> {
        let held = from >= self.start && to <= self.start + self.bytes.len() as u64;
        if !held {
            let until = from.saturating_add(WINDOW).min(self.capacity).max(to);
            self.bytes.clear();
            self.bytes.resize((until - from) as usize, 0);
            let read_until = until.min(self.written);
            if read_until > from {
                self.file.read_exact_at(&mut self.bytes[..(read_until - from) as usize], from)?;
            }
            self.start = from;
            self.largest = self.largest.max(self.bytes.len() as u64);
        }
        let offset = (from - self.start) as usize;
        Ok(&self.bytes[offset..offset + (to - from) as usize])
    }

    /// Where the last byte that is not zero lies at or after `from`, if there is one: read a
    /// window at a time up to where the file was ever written.
    fn last_nonzero_from(&mut self, from: u64) -> io::Result<Option<u64>> {
        let mut last = None;
        let mut at = from;
        while at < self.written {
            let to = (at + WINDOW).min(self.written);
            let chunk = self.bytes(at, to)?;
            if !is_zeros(chunk) {
                last = chunk.iter().rposition(|&b| b != 0).map(|i| at + i as u64);
            }
            at = to;
        }
        Ok(last)
    }
}

/// Whether every byte of `bytes` is zero, a word at a time.
fn is_zeros(bytes: &[u8]) -> bool {
    let words = bytes.chunks_exact(8);
    let rest = words.remainder();
    words.fold(0u64, |any, word| any | u64::from_ne_bytes(word.try_into().expect("8 bytes"))) == 0
        && rest.iter().all(|&b| b == 0)
}

fn padded(len: u64) -> u64 {
    len.div_ceil(ALIGN) * ALIGN
}

fn checksum(index: u64, payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&index.to_le_bytes());
    hasher.update(payload);
    hasher.finalize()
}

/// Appends one record (header, payload, padding) to `buffer`.
fn encode_record(buffer: &mut Vec<u8>, index: u64, payload: &[u8]) {
    let start = buffer.len();
    buffer.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buffer.extend_from_slice(&checksum(index, payload).to_le_bytes());
    buffer.extend_from_slice(&index.to_le_bytes());
    buffer.extend_from_slice(payload);
    let end = start + padded((buffer.len() - start) as u64) as usize;
    buffer.resize(end, 0);
}

/// The header at the start of `bytes`: payload length, checksum, index.
fn decode_header(bytes: &[u8]) -> (u64, u32, u64) {
    let len = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes"));
    let crc = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
    let index = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    (u64::from(len), crc, index)
}

/// Whether a 512-byte sector of the file that starts inside the record at `start..end` (file
/// offsets) is all zeros: never written. `record` is the file's bytes from `start` to the end
/// of the sector the record ends in (or of the file). The sector holding the header is not one
/// of them (the header is not zeros). A sector is checked whole, padding and what follows
/// included, so zeros at the end of a payload alone do not count.
fn has_unwritten_sector(record: &[u8], start: u64, end: u64) -> bool {
    let sector_bytes = SECTOR as u64;
    let mut sector = (start / sector_bytes + 1) * sector_bytes;
    while sector < end {
        let from = (sector - start) as usize;
        if is_zeros(&record[from..(from + SECTOR).min(record.len())]) {
            return true;
        }
        sector += sector_bytes;
    }
    false
}

fn segment_name(first: u64) -> String {
    format!("{first:020}{SUFFIX}")
}

fn sync_dir(dir: &Path) -> Result<(), LogFileError> {
    crate::file_removal::sync_dir(dir).map_err(io_error(dir))
}

/// Removes the segment file at `path` durably: its directory is synced before this returns
/// ([`crate::file_removal::remove`]), so no later step (zeroing a tail, creating a segment of the
/// same name, removing the next segment) can reach the disk while a power cut could still bring
/// the file back.
fn remove_segment(path: &Path) -> Result<(), LogFileError> {
    crate::file_removal::remove(path).map_err(io_error(path))
}

/// Allocates `len` bytes of `file` for real (not a sparse file: writing into a hole allocates
/// blocks, and the fsync that follows commits that to the journal). Falls back to a sparse
/// file where the filesystem cannot allocate ahead.
fn allocate(file: &File, len: u64) -> io::Result<()> {
    let len = libc::off_t::try_from(len).map_err(|_| io::Error::other("segment too large"))?;
    // SAFETY: fallocate on an open descriptor; no memory is passed.
    let result = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) };
    if result == 0 {
        return Ok(());
    }
    let error = io::Error::last_os_error();
    match error.raw_os_error() {
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => file.set_len(len as u64),
        _ => Err(error),
    }
}

/// Where the last stretch of `file` that was ever written ends (`SEEK_DATA`, `SEEK_HOLE`): space
/// allocated and never written reads as zeros, so opening a segment reads only what precedes
/// this. A filesystem that cannot tell answers the file's length.
fn written_end(file: &File, len: u64) -> io::Result<u64> {
    let fd = file.as_raw_fd();
    let mut end = 0;
    let mut at: libc::off_t = 0;
    while (at as u64) < len {
        // SAFETY: lseek on an open descriptor. The file position it moves is not used: every
        // read and write of a segment is positional (pread, pwrite).
        let data = unsafe { libc::lseek(fd, at, libc::SEEK_DATA) };
        if data < 0 {
            let error = io::Error::last_os_error();
            return match error.raw_os_error() {
                Some(libc::ENXIO) => Ok(end),
                Some(libc::EINVAL) => Ok(len),
                _ => Err(error),
            };
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(io::Error::last_os_error());
        }
        end = hole as u64;
        at = hole;
    }
    Ok(end.min(len))
}

/// Writes zeros over `start..end` of `file`.
fn zero(file: &SegmentFile, start: u64, end: u64) -> Result<(), LogFileError> {
    write_zeros(&file.file, start, end, |_, _| Ok(())).map_err(io_error(&file.path))
}

/// Writes zeros over `start..end` of `file` a MiB at a time, calling `after_each(at, len)` after
/// each MiB is written.
fn write_zeros(
    file: &File,
    start: u64,
    end: u64,
    mut after_each: impl FnMut(u64, u64) -> io::Result<()>,
) -> io::Result<()> {
    const CHUNK: u64 = 1 << 20;
    let zeros = vec![0u8; CHUNK.min(end.saturating_sub(start)) as usize];
    let mut at = start;
    while at < end {
        let n = CHUNK.min(end - at);
        file.write_all_at(&zeros[..n as usize], at)?;
        after_each(at, n)?;
        at += n;
    }
    Ok(())
}

/// The first whole record (its checksum matching) at or after `from` in `window`'s file whose
/// entry lies in `lowest..=highest`, looked for at every 16th byte: its offset and index.
fn find_whole_record(window: &mut Window, from: u64, lowest: u64, highest: u64) -> io::Result<Option<(u64, u64)>> {
    if lowest > highest {
        return Ok(None);
    }
    let mut at = padded(from);
    while at + HEADER as u64 <= window.written.min(window.capacity) {
        let header = window.bytes(at, at + HEADER as u64)?;
        if !is_zeros(header) {
            let (len, crc, index) = decode_header(header);
            let end = at + HEADER as u64 + len;
            if (lowest..=highest).contains(&index) && end <= window.capacity {
                let payload = window.bytes(at + HEADER as u64, end)?;
                if checksum(index, payload) == crc {
                    return Ok(Some((at, index)));
                }
            }
        }
        at += ALIGN;
    }
    Ok(None)
}

/// Why a torn-looking record is damage: a whole record of a committed entry follows it.
fn flushed_after_torn(torn: u64, whole: u64, committed: u64, first: u64) -> String {
    format!(
        "entry {torn} does not read back whole and looks torn by a crash, but the record of entry {whole} \
         after it (in the segment of entry {first}) is whole, and this node had committed the entries up to \
         {committed}: it flushes in order and commits only what it has flushed, so entry {torn} was flushed too"
    )
}

impl LogFiles {
    /// Opens the log in `dir` (created if missing), repairing an unfinished write at its end;
    /// damage anywhere else fails the open.
    pub fn open(dir: &Path) -> Result<(LogFiles, Recovery), LogFileError> {
        Self::open_holding(dir, 0)
    }

    /// Opens the log as [`LogFiles::open`] does, for a node that had committed the entries up to
    /// `committed` (0 for none).
    ///
    /// A power cut loses what was written and not yet fsynced: of the records after the last
    /// fsync, each 512-byte sector holds what was written or what was there before (zeros: a
    /// segment is allocated or written with zeros before its first record, and what a
    /// truncation or a repair removes is zeroed and synced), in any mix, across segments too (an
    /// append may fill one segment and start the next, created durably beforehand). So the
    /// log's tail may end in a record with a sector of zeros, a header of zeros with written
    /// sectors after it, nothing at all, or, where the append went on into the next segment,
    /// a segment that starts after entries its predecessor never got. Each is cut off as a torn
    /// tail, whatever the committed index says; the caller lowers the committed index to what
    /// the log still holds ([`Recovery::cut_at`]).
    ///
    /// The node commits only entries it has flushed, and flushes in order, so a whole record of
    /// an entry it had committed lying after the torn spot proves the torn record was flushed
    /// too: that is damage, and fails the open, as does a record whose checksum fails with every
    /// sector written, an index out of order, or a segment missing after a full one.
    ///
    /// Every segment kept is synced before this returns: records a process that stopped left
    /// in the page cache, not yet on disk, are on disk once the log is open, so every entry it
    /// holds counts as flushed.
    pub fn open_holding(dir: &Path, committed: u64) -> Result<(LogFiles, Recovery), LogFileError> {
        std::fs::create_dir_all(dir).map_err(io_error(dir))?;
        let mut names: Vec<(u64, PathBuf)> = Vec::new();
        let mut removed_temporary = false;
        for entry in std::fs::read_dir(dir).map_err(io_error(dir))? {
            let path = entry.map_err(io_error(dir))?.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
            if name.ends_with(".tmp") {
                // A segment whose creation did not finish: it never held a record.
                std::fs::remove_file(&path).map_err(io_error(&path))?;
                removed_temporary = true;
                continue;
            }
            let Some(first) = name.strip_suffix(SUFFIX).and_then(|n| n.parse::<u64>().ok()) else { continue };
            names.push((first, path));
        }
        if removed_temporary {
            sync_dir(dir)?;
        }
        names.sort();
        let mut log = LogFiles { dir: dir.to_path_buf(), segments: Vec::new(), purged: None, spare: None };
        let mut recovery = Recovery::default();
        let mut cut = None;
        let mut read_up_to = 0;
        for (first, path) in &names {
            if let Some(previous) = log.segments.last() {
                if previous.next_index() != *first {
                    // The previous segment had room for what is missing only if it is not full.
                    let full = previous.head + HEADER as u64 > previous.capacity;
                    if full || *first < previous.next_index() {
                        return Err(LogFileError::Damaged {
                            path: path.display().to_string(),
                            offset: 0,
                            detail: format!(
                                "the segment starts at entry {first}, but the one before it ends before entry {}",
                                previous.next_index()
                            ),
                        });
                    }
                    cut = Some(Cut { index: previous.next_index(), from: previous.head, to: previous.head });
                    break;
                }
            }
            let read = Self::read_segment(*first, path, committed)?;
            recovery.held_at_once = recovery.held_at_once.max(read.held_at_once);
            log.segments.push(read.segment);
            read_up_to += 1;
            if read.cut.is_some() {
                cut = read.cut;
                break;
            }
        }
        let Some(cut) = cut else {
            log.sync_all()?;
            return Ok((log, recovery));
        };
        let later = &names[read_up_to..];
        // A whole record of a committed entry in a later segment proves the cut one flushed.
        for (first, path) in later.iter().filter(|(first, _)| *first <= committed) {
            let file = File::open(path).map_err(io_error(path))?;
            let capacity = file.metadata().map_err(io_error(path))?.len();
            let written = written_end(&file, capacity).map_err(io_error(path))?;
            let mut window = Window::new(&file, written, capacity);
            let found = find_whole_record(&mut window, 0, cut.index, committed).map_err(io_error(path))?;
            if let Some((_, index)) = found {
                let segment = log.segments.last().expect("a cut lies in a segment");
                return Err(LogFileError::Damaged {
                    path: segment.file.path.display().to_string(),
                    offset: cut.from,
                    detail: flushed_after_torn(cut.index, index, committed, *first),
                });
            }
        }
        // Later segments go before the tail is zeroed, the last first, each durably: whatever
        // a power cut interrupts, what is left is a log with a torn tail (or none).
        for (_, path) in later.iter().rev() {
            remove_segment(path)?;
            recovery.deleted_segments += 1;
        }
        let segment = log.segments.last().expect("a cut lies in a segment");
        if cut.to > cut.from {
            zero(&segment.file, cut.from, cut.to)?;
            segment.file.sync()?;
            recovery.zeroed_bytes = cut.to - cut.from;
        }
        tracing::warn!(
            path = %segment.file.path.display(),
            at = cut.from,
            entry = cut.index,
            zeroed = recovery.zeroed_bytes,
            deleted_segments = recovery.deleted_segments,
            "cut off the torn tail of the Raft log (a write a crash left unfinished)"
        );
        recovery.cut_at = Some(cut.index);
        log.sync_all()?;
        Ok((log, recovery))
    }

    /// Reads one segment's records, up to a torn tail if there is one ([`Cut`]); repairs nothing.
    /// Returns the segment (its head at the cut), the cut, and the most bytes of the file it
    /// held at once.
    fn read_segment(first: u64, path: &Path, committed: u64) -> Result<ReadSegment, LogFileError> {
        let file = OpenOptions::new().read(true).write(true).open(path).map_err(io_error(path))?;
        let capacity = file.metadata().map_err(io_error(path))?.len();
        // Only what was ever written is read: the allocated rest reads as zeros.
        let written = written_end(&file, capacity).map_err(io_error(path))?;
        let mut window = Window::new(&file, written, capacity);
        let damaged =
            |offset: u64, detail: String| LogFileError::Damaged { path: path.display().to_string(), offset, detail };
        let mut offsets = Vec::new();
        let mut at = 0u64;
        // Where the records after a torn one may start.
        let mut torn_end = None;
        while at + HEADER as u64 <= capacity {
            let header = window.bytes(at, at + HEADER as u64).map_err(io_error(path))?;
            if is_zeros(header) {
                break;
            }
            let (len, crc, index) = decode_header(header);
            let expected = first + offsets.len() as u64;
            if index != expected {
                return Err(damaged(at, format!("a record of entry {index} where entry {expected} belongs")));
            }
            let end = at + HEADER as u64 + len;
            if end > capacity {
                return Err(damaged(at, format!("a record of {len} bytes runs past the end of the file")));
            }
            // The record and the rest of the sector it ends in: sectors are checked whole.
            let sector_end = end.div_ceil(SECTOR as u64).saturating_mul(SECTOR as u64).min(capacity);
            let record = window.bytes(at, sector_end).map_err(io_error(path))?;
            let payload = &record[HEADER..(end - at) as usize];
            if checksum(index, payload) != crc {
                if has_unwritten_sector(record, at, end) {
                    torn_end = Some(padded(end));
                    break;
                }
                return Err(damaged(at, format!("the checksum of entry {index} does not match")));
            }
            offsets.push(at);
            at = padded(end);
        }
        let head = at.min(capacity);
        let next = first + offsets.len() as u64;
        let leftover = window.last_nonzero_from(head).map_err(io_error(path))?.map(|last| last + 1);
        let cut = (torn_end.is_some() || leftover.is_some()).then(|| Cut {
            index: next,
            from: head,
            to: leftover.unwrap_or(head),
        });
        if cut.is_some() {
            // After a header of zeros the next record may start anywhere: every 16th byte is
            // looked at.
            let from = torn_end.unwrap_or(head + HEADER as u64);
            if let Some((_, index)) = find_whole_record(&mut window, from, next, committed).map_err(io_error(path))? {
                return Err(damaged(head, flushed_after_torn(next, index, committed, first)));
            }
        }
        let held_at_once = window.largest;
        let file = Arc::new(SegmentFile { path: path.to_path_buf(), file });
        let segment = Segment { first, file, offsets, head, capacity };
        Ok(ReadSegment { segment, cut, held_at_once })
    }

    /// The index of the first record held and not purged, if any.
    pub fn first_index(&self) -> Option<u64> {
        let first = self.segments.iter().find(|s| !s.offsets.is_empty())?.first;
        let first = self.purged.map_or(first, |purged| first.max(purged.saturating_add(1)));
        self.last_index().filter(|&last| last >= first).map(|_| first)
    }

    /// The index of the last record held, if any.
    pub fn last_index(&self) -> Option<u64> {
        self.segments.iter().rev().find_map(Segment::last_index)
    }

    /// The file and offset of record `index`, for tests that damage it.
    #[cfg(test)]
    pub(crate) fn record_at(&self, index: u64) -> Option<(PathBuf, u64)> {
        let segment = self.segments.iter().rev().find(|s| s.first <= index)?;
        let offset = *segment.offsets.get((index - segment.first) as usize)?;
        Some((segment.file.path.clone(), offset))
    }

    /// Whether the last segment has room for another record's header after its last record: an
    /// append lost whole in a power cut leaves the log ending there; entries missing after a
    /// full segment were in a segment file that is gone.
    pub fn ends_with_room(&self) -> bool {
        self.segments.last().is_some_and(|s| s.head + HEADER as u64 <= s.capacity)
    }

    /// The index the next append must have, if the log holds or expects any.
    fn next_index(&self) -> Option<u64> {
        self.segments.last().map(Segment::next_index)
    }

    /// Writes `records` (index, payload), in order, after the last one; the first must follow
    /// the last record held (any index when the log is empty). Returns the files written to,
    /// which must be synced before the records count as durable.
    pub fn append<'a>(
        &mut self,
        records: impl IntoIterator<Item = (u64, &'a [u8])>,
    ) -> Result<Vec<Arc<SegmentFile>>, LogFileError> {
        let mut touched: Vec<Arc<SegmentFile>> = Vec::new();
        let mut buffer = Vec::new();
        let mut starts = Vec::new();
        for (index, payload) in records {
            if let Some(next) = self.next_index() {
                if index != next {
                    return Err(LogFileError::OutOfOrder { index, detail: format!("entry {next} comes next") });
                }
            }
            let size = padded((HEADER + payload.len()) as u64);
            let fits = self.segments.last().is_some_and(|s| s.head + buffer.len() as u64 + size <= s.capacity);
            if !fits {
                self.write_buffered(&mut buffer, &mut starts, &mut touched)?;
                self.create_segment(index, size.max(SEGMENT_BYTES))?;
            }
            starts.push(buffer.len() as u64);
            encode_record(&mut buffer, index, payload);
            // Counted now so that the next record's index check sees it.
            if let Some(segment) = self.segments.last_mut() {
                segment.offsets.push(u64::MAX);
            }
        }
        self.write_buffered(&mut buffer, &mut starts, &mut touched)?;
        self.start_spare_when_due();
        Ok(touched)
    }

    /// Starts writing the next segment's spare once the last segment is [`SPARE_AFTER`] full.
    fn start_spare_when_due(&mut self) {
        let due = self.segments.last().is_some_and(|s| s.capacity == SEGMENT_BYTES && s.head >= SPARE_AFTER);
        if !due || self.spare.is_some() {
            return;
        }
        match Spare::start(&self.dir) {
            Ok(spare) => self.spare = Some(spare),
            Err(error) => tracing::warn!(%error, "could not start writing the Raft log's next segment ahead"),
        }
    }

    /// Writes `buffer` at the last segment's head and records where its records start.
    fn write_buffered(
        &mut self,
        buffer: &mut Vec<u8>,
        starts: &mut Vec<u64>,
        touched: &mut Vec<Arc<SegmentFile>>,
    ) -> Result<(), LogFileError> {
        if buffer.is_empty() {
            return Ok(());
        }
        let segment = self.segments.last_mut().expect("records are buffered into a segment");
        let written = segment.file.file.write_all_at(buffer, segment.head);
        let pending = segment.offsets.len() - starts.len();
        if let Err(source) = written {
            // Nothing of these counts as held; what reached the file is zeroed by the next open
            // or overwritten by the next append at the same head.
            segment.offsets.truncate(pending);
            buffer.clear();
            starts.clear();
            return Err(LogFileError::Io { path: segment.file.path.display().to_string(), source });
        }
        for (slot, start) in segment.offsets[pending..].iter_mut().zip(starts.iter()) {
            *slot = segment.head + start;
        }
        segment.head += buffer.len() as u64;
        if !touched.iter().any(|file| Arc::ptr_eq(file, &segment.file)) {
            touched.push(segment.file.clone());
        }
        buffer.clear();
        starts.clear();
        Ok(())
    }

    /// Creates an empty segment whose first record will be `first`, durably: the spare if it is
    /// ready and the segment is of its size, else a file allocated now.
    fn create_segment(&mut self, first: u64, capacity: u64) -> Result<(), LogFileError> {
        let path = self.dir.join(segment_name(first));
        let spare = if capacity == SEGMENT_BYTES { Spare::take(&mut self.spare) } else { None };
        let temporary = match spare {
            Some(spare) => spare,
            None => {
                let temporary = self.dir.join(format!("{}.tmp", segment_name(first)));
                let file = OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&temporary)
                    .map_err(io_error(&temporary))?;
                allocate(&file, capacity).map_err(io_error(&temporary))?;
                file.sync_all().map_err(io_error(&temporary))?;
                temporary
            }
        };
        std::fs::rename(&temporary, &path).map_err(io_error(&path))?;
        sync_dir(&self.dir)?;
        let file = OpenOptions::new().read(true).write(true).open(&path).map_err(io_error(&path))?;
        let file = Arc::new(SegmentFile { path, file });
        self.segments.push(Segment { first, file, offsets: Vec::new(), head: 0, capacity });
        Ok(())
    }

    /// The payload of record `index`, if the log holds it (and it is not purged).
    pub fn read(&self, index: u64) -> Result<Option<Vec<u8>>, LogFileError> {
        if self.purged.is_some_and(|purged| index <= purged) {
            return Ok(None);
        }
        let position = self.segments.partition_point(|s| s.first <= index);
        let Some(segment) = position.checked_sub(1).map(|i| &self.segments[i]) else { return Ok(None) };
        let Some(&offset) = segment.offsets.get((index - segment.first) as usize) else { return Ok(None) };
        let path = &segment.file.path;
        let damaged = |detail: String| LogFileError::Damaged { path: path.display().to_string(), offset, detail };
        let mut header = [0u8; HEADER];
        segment.file.file.read_exact_at(&mut header, offset).map_err(io_error(path))?;
        let (len, crc, held) = decode_header(&header);
        if held != index || offset + HEADER as u64 + len > segment.head {
            return Err(damaged(format!("the record of entry {index} no longer reads back")));
        }
        let mut payload = vec![0u8; len as usize];
        segment.file.file.read_exact_at(&mut payload, offset + HEADER as u64).map_err(io_error(path))?;
        if checksum(index, &payload) != crc {
            return Err(damaged(format!("the checksum of entry {index} does not match")));
        }
        Ok(Some(payload))
    }

    /// Removes the records from `index` on, durably: the segments after the one that keeps
    /// records go first, the last first, each removed durably ([`remove_segment`]), then what
    /// is left of the records in the last one kept is zeroed and synced. A power cut at any
    /// point leaves a log without a gap between its segments, ending in records that are whole,
    /// or torn where the zeros only partly reached the disk (cut off when it opens).
    pub fn truncate(&mut self, index: u64) -> Result<(), LogFileError> {
        while let Some(segment) = self.segments.last() {
            if segment.first < index || (segment.first == index && self.segments.len() == 1) {
                break;
            }
            let path = segment.file.path.clone();
            self.segments.pop();
            remove_segment(&path)?;
        }
        if let Some(segment) = self.segments.last_mut() {
            let keep = (index.saturating_sub(segment.first) as usize).min(segment.offsets.len());
            if keep < segment.offsets.len() {
                let from = segment.offsets[keep];
                zero(&segment.file, from, segment.head)?;
                segment.file.sync()?;
                segment.offsets.truncate(keep);
                segment.head = from;
            }
        }
        Ok(())
    }

    /// Purges the records up to `index`: they are no longer read, and the segments that hold
    /// nothing else are deleted, the first first, each durably ([`remove_segment`]), so a power
    /// cut leaves the segments from some point on, without a gap (and opening purges again up
    /// to the purge mark). Records at or below it in a segment that also holds later ones stay
    /// on disk until that segment goes.
    pub fn purge(&mut self, index: u64) -> Result<(), LogFileError> {
        self.purged = self.purged.max(Some(index));
        while let Some(segment) = self.segments.first() {
            if segment.next_index() > index.saturating_add(1) {
                break;
            }
            let path = segment.file.path.clone();
            self.segments.remove(0);
            remove_segment(&path)?;
        }
        Ok(())
    }

    /// Makes every record written so far durable.
    pub fn sync_all(&self) -> Result<(), LogFileError> {
        self.segments.iter().try_for_each(|segment| segment.file.sync())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(index: u64) -> Vec<u8> {
        format!("entry {index} ").repeat(1 + (index % 7) as usize).into_bytes()
    }

    fn append(log: &mut LogFiles, indexes: std::ops::RangeInclusive<u64>) {
        let payloads: Vec<(u64, Vec<u8>)> = indexes.map(|i| (i, payload(i))).collect();
        let touched = log.append(payloads.iter().map(|(i, p)| (*i, p.as_slice()))).unwrap();
        for file in touched {
            file.sync().unwrap();
        }
    }

    fn held(log: &LogFiles) -> Vec<u64> {
        let (Some(first), Some(last)) = (log.first_index(), log.last_index()) else { return Vec::new() };
        (first..=last)
            .inspect(|&i| assert_eq!(log.read(i).unwrap(), Some(payload(i)), "entry {i} reads back"))
            .collect()
    }

    fn segment_paths(dir: &Path) -> Vec<PathBuf> {
        files_ending(dir, SUFFIX)
    }

    /// The bytes zeroed and the segments deleted by an open.
    fn repairs(recovery: &Recovery) -> (u64, usize) {
        (recovery.zeroed_bytes, recovery.deleted_segments)
    }

    fn files_ending(dir: &Path, suffix: &str) -> Vec<PathBuf> {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|path| path.to_string_lossy().ends_with(suffix))
            .collect();
        paths.sort();
        paths
    }

    /// The next segment is written with zeros while the last one fills, and becomes it once
    /// written whole: every byte of it is written space (no unwritten extent left for an
    /// append's `fdatasync` to convert), and its records read back like any others.
    #[test]
    fn the_next_segment_is_written_ahead_with_zeros_and_then_used() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = LogFiles::open(dir.path()).unwrap();
        let mib = vec![3u8; 1 << 20];
        let records = (SPARE_AFTER >> 20) + 1;
        log.append((1..=records).map(|i| (i, &mib[..]))).unwrap()[0].sync().unwrap();
        assert!(log.spare.is_some(), "half full: the next segment is being written");
        assert_eq!(files_ending(dir.path(), ".tmp").len(), 1);
        let started = std::time::Instant::now();
        while !log.spare.as_ref().unwrap().written.is_finished() {
            assert!(started.elapsed() < std::time::Duration::from_secs(120), "the spare is never written");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        // Fill the first segment to its end, then one more record: it opens the second.
        let mut next = records + 1;
        while log.segments.len() == 1 {
            log.append([(next, &mib[..])]).unwrap();
            next += 1;
        }
        log.append([(next, &b"last"[..])]).unwrap();
        assert!(files_ending(dir.path(), ".tmp").is_empty(), "the spare became the segment");
        let second = log.segments[1].file.clone();
        second.sync().unwrap();
        assert_eq!(
            written_end(&second.file, SEGMENT_BYTES).unwrap(),
            SEGMENT_BYTES,
            "written whole, zeros after the records"
        );
        assert_eq!(std::fs::metadata(&second.path).unwrap().len(), SEGMENT_BYTES);
        drop(log);
        let (log, recovery) = LogFiles::open(dir.path()).unwrap();
        assert_eq!(repairs(&recovery), (0, 0), "the zeros after the last record are not damage");
        assert_eq!((log.first_index(), log.last_index()), (Some(1), Some(next)));
        assert_eq!(log.read(next - 1).unwrap(), Some(mib.clone()));
        assert_eq!(log.read(next).unwrap(), Some(b"last".to_vec()));
    }

    /// A spare holds zeros to its length: written with direct I/O where the file system has it
    /// (the temporary directory's, on the test machine), no faster than its rate, and through
    /// the page cache where direct I/O is refused (here: a length it cannot write).
    #[test]
    fn a_spare_is_zeros_to_its_length_with_direct_io_or_without() {
        const LEN: u64 = 3 << 20;
        let zeros_of = |path: &Path, len: u64| {
            let held = std::fs::read(path).unwrap();
            held.len() as u64 == len && held.iter().all(|&b| b == 0)
        };
        let zeros_to_its_length = |path: &Path| zeros_of(path, LEN);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spare-direct.tmp");
        let started = std::time::Instant::now();
        match write_spare_direct(&path, LEN) {
            Ok(()) => {
                assert!(zeros_to_its_length(&path));
                let took = started.elapsed();
                // The third MiB is written no sooner than 2 MiB at the rate allow.
                let due = std::time::Duration::from_secs_f64((2 << 20) as f64 / SPARE_WRITE_RATE as f64);
                assert!(took >= due, "3 MiB written in {took:?}");
            }
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}"),
        }
        let path = dir.path().join("spare.tmp");
        write_spare(&path, LEN).unwrap();
        assert!(zeros_to_its_length(&path));
        assert_eq!(
            write_spare_direct(&dir.path().join("odd.tmp"), LEN + 512).unwrap_err().raw_os_error(),
            Some(libc::EINVAL),
            "a length direct I/O cannot write"
        );
        let path = dir.path().join("odd-spare.tmp");
        write_spare(&path, LEN + 512).unwrap();
        assert!(zeros_of(&path, LEN + 512), "written through the page cache instead");
    }

    /// A spare left by a log that stopped (or crashed) while writing it is removed when the log
    /// opens, and never read as a segment.
    #[test]
    fn a_spare_left_behind_is_removed_when_the_log_opens() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = LogFiles::open(dir.path()).unwrap();
        append(&mut log, 1..=3);
        drop(log);
        std::fs::write(dir.path().join("spare-1-7.tmp"), vec![0u8; 4096]).unwrap();
        let (log, _) = LogFiles::open(dir.path()).unwrap();
        assert!(files_ending(dir.path(), ".tmp").is_empty());
        assert_eq!(held(&log), vec![1, 2, 3]);
    }

    #[test]
    fn records_read_back_after_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, recovery) = LogFiles::open(dir.path()).unwrap();
        assert_eq!(repairs(&recovery), (0, 0));
        assert_eq!(log.last_index(), None);
        append(&mut log, 5..=40);
        assert_eq!(held(&log), (5..=40).collect::<Vec<_>>());
        assert_eq!(log.read(4).unwrap(), None);
        assert_eq!(log.read(41).unwrap(), None);
        drop(log);
        let (log, recovery) = LogFiles::open(dir.path()).unwrap();
        assert_eq!(repairs(&recovery), (0, 0), "a clean log needs no repair");
        assert_eq!(held(&log), (5..=40).collect::<Vec<_>>());
        let segment = &segment_paths(dir.path())[0];
        assert_eq!(std::fs::metadata(segment).unwrap().len(), SEGMENT_BYTES, "allocated whole");
    }

    #[test]
    fn only_the_written_part_of_a_segment_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = LogFiles::open(dir.path()).unwrap();
        append(&mut log, 1..=3);
        let file = log.segments[0].file.clone();
        let written = written_end(&file.file, SEGMENT_BYTES).unwrap();
        assert!(written >= log.segments[0].head, "{written}");
        assert!(written < SEGMENT_BYTES / 2, "the allocated rest is not read: {written}");
    }

    /// A closed log whose only segment is written with zeros to its end, as a spare is, holding
    /// records that cross window boundaries and one larger than a window; their indexes.
    fn records_across_windows_in_a_zeroed_segment(dir: &Path) -> Vec<u64> {
        let (mut log, _) = LogFiles::open(dir).unwrap();
        let mut payloads: Vec<Vec<u8>> = (1..=7u8).map(|i| vec![i; 300_000]).collect();
        payloads.push(vec![8; 3 << 20]);
        payloads.push(b"last".to_vec());
        let records: Vec<(u64, &[u8])> = payloads.iter().enumerate().map(|(i, p)| (i as u64 + 1, &p[..])).collect();
        log.append(records.iter().copied()).unwrap()[0].sync().unwrap();
        let segment = &log.segments[0];
        write_zeros(&segment.file.file, segment.head, segment.capacity, |_, _| Ok(())).unwrap();
        segment.file.sync().unwrap();
        assert_eq!(written_end(&segment.file.file, segment.capacity).unwrap(), SEGMENT_BYTES, "zeros to its end");
        (1..=payloads.len() as u64).collect()
    }

    #[test]
    fn a_segment_is_read_a_window_at_a_time_not_whole() {
        let dir = tempfile::tempdir().unwrap();
        let indexes = records_across_windows_in_a_zeroed_segment(dir.path());
        let (log, recovery) = LogFiles::open(dir.path()).unwrap();
        assert_eq!(repairs(&recovery), (0, 0), "{recovery:?}");
        assert_eq!((log.first_index(), log.last_index()), (indexes.first().copied(), indexes.last().copied()));
        for (i, index) in indexes.iter().enumerate() {
            let payload = log.read(*index).unwrap().expect("held");
            let expected: Vec<u8> = match i {
                0..=6 => vec![i as u8 + 1; 300_000],
                7 => vec![8; 3 << 20],
                _ => b"last".to_vec(),
            };
            assert!(payload == expected, "entry {index} reads back ({} bytes)", payload.len());
        }
        // The 3 MiB record with its header and the rest of its last sector; every other read a
        // window.
        let largest = 3 << 20..(3 << 20) + (HEADER + SECTOR) as u64;
        assert!(largest.contains(&recovery.held_at_once), "not the segment's {SEGMENT_BYTES} bytes: {recovery:?}");
    }

    #[test]
    fn an_unfinished_write_far_past_the_last_record_is_found_and_zeroed() {
        let dir = tempfile::tempdir().unwrap();
        let indexes = records_across_windows_in_a_zeroed_segment(dir.path());
        let path = segment_paths(dir.path())[0].clone();
        // Sectors of a later write reached the disk, its first ones did not.
        let stray = 40 << 20;
        write_at(&path, stray, &[0xAB; 700]);
        let (log, recovery) = LogFiles::open(dir.path()).unwrap();
        assert_eq!(log.last_index(), indexes.last().copied(), "every whole record is kept");
        let head = log.segments[0].head;
        assert_eq!(recovery.zeroed_bytes, stray + 700 - head, "zeroed from the last record to the stray bytes");
        let mut bytes = vec![1u8; 700];
        File::open(&path).unwrap().read_exact_at(&mut bytes, stray).unwrap();
        assert!(is_zeros(&bytes), "the stray write is zeroed");
        drop(log);
        let (_, recovery) = LogFiles::open(dir.path()).unwrap();
        assert_eq!(repairs(&recovery), (0, 0), "nothing is left to repair");
    }

    #[test]
    fn zeros_are_told_from_data_a_word_at_a_time_and_in_the_rest() {
        assert!(is_zeros(&[]) && is_zeros(&[0; 8]) && is_zeros(&[0; 13]));
        for at in 0..13 {
            let mut bytes = [0u8; 13];
            bytes[at] = 1;
            assert!(!is_zeros(&bytes), "a byte at {at}");
        }
    }

    #[test]
    fn an_append_must_follow_the_last_record() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = LogFiles::open(dir.path()).unwrap();
        append(&mut log, 1..=3);
        let error = log.append([(5, &b"x"[..])]).unwrap_err();
        assert!(error.to_string().contains("entry 4 comes next"), "{error}");
        assert_eq!(held(&log), vec![1, 2, 3]);
    }

    #[test]
    fn a_truncation_holds_across_a_reopen_and_new_records_replace_the_old() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = LogFiles::open(dir.path()).unwrap();
        append(&mut log, 1..=20);
        log.truncate(11).unwrap();
        assert_eq!(log.last_index(), Some(10));
        // Shorter records than before: the old ones behind them must not come back.
        log.append([(11, &b"new"[..])]).unwrap()[0].sync().unwrap();
        drop(log);
        let (log, recovery) = LogFiles::open(dir.path()).unwrap();
        assert_eq!(repairs(&recovery), (0, 0));
        assert_eq!(log.last_index(), Some(11));
        assert_eq!(log.read(11).unwrap(), Some(b"new".to_vec()));
        assert_eq!(log.read(10).unwrap(), Some(payload(10)));
        // Truncating everything leaves an empty log that takes the same index again.
        let (mut log, _) = LogFiles::open(dir.path()).unwrap();
        log.truncate(1).unwrap();
        assert_eq!(log.last_index(), None);
        append(&mut log, 1..=2);
        assert_eq!(held(&log), vec![1, 2]);
    }

    #[test]
    fn segments_roll_over_and_purges_delete_whole_ones() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = LogFiles::open(dir.path()).unwrap();
        // Records larger than a segment get one each.
        let big = vec![7u8; SEGMENT_BYTES as usize];
        log.append([(1, &b"small"[..]), (2, &big[..]), (3, &b"after"[..])]).unwrap();
        assert_eq!(segment_paths(dir.path()).len(), 3);
        assert_eq!(log.read(2).unwrap().map(|p| p.len()), Some(big.len()));
        drop(log);
        let (mut log, _) = LogFiles::open(dir.path()).unwrap();
        assert_eq!((log.first_index(), log.last_index()), (Some(1), Some(3)));
        log.purge(2).unwrap();
        assert_eq!(segment_paths(dir.path()).len(), 1, "the segments of entries 1 and 2 are gone");
        assert_eq!(log.first_index(), Some(3));
        assert_eq!(log.read(2).unwrap(), None);
        // A purge past everything empties the log; the next append starts anywhere after it.
        log.purge(100).unwrap();
        assert_eq!(log.last_index(), None);
        log.append([(101, &b"x"[..])]).unwrap();
        drop(log);
        let (log, _) = LogFiles::open(dir.path()).unwrap();
        assert_eq!((log.first_index(), log.last_index()), (Some(101), Some(101)));
    }

    /// The bytes of record `index` in the only segment, and the segment's path.
    fn record_at(dir: &Path, log: &LogFiles, index: u64) -> (PathBuf, u64, u64) {
        let segment = &log.segments[0];
        let offset = segment.offsets[(index - segment.first) as usize];
        let end = segment.offsets.get((index - segment.first + 1) as usize).copied().unwrap_or(segment.head);
        (segment_paths(dir)[0].clone(), offset, end)
    }

    fn write_at(path: &Path, offset: u64, bytes: &[u8]) {
        OpenOptions::new().write(true).open(path).unwrap().write_all_at(bytes, offset).unwrap();
    }

    /// A closed log of entries 1 to 6, entry 4 spanning several sectors; the segment's path and
    /// entry 4's start and end.
    fn six_records_the_fourth_large(dir: &Path) -> (PathBuf, u64, u64) {
        let (mut log, _) = LogFiles::open(dir).unwrap();
        append(&mut log, 1..=3);
        log.append([(4, &vec![3u8; 2000][..])]).unwrap();
        append(&mut log, 5..=6);
        record_at(dir, &log, 4)
    }

    #[test]
    fn a_write_torn_by_a_crash_is_cut_off_and_zeroed() {
        let dir = tempfile::tempdir().unwrap();
        let (path, offset, end) = six_records_the_fourth_large(dir.path());
        // Entry 4's last sectors never reached the disk; entries 5 and 6 after it did.
        let first_whole_sector = (offset / 512 + 1) * 512;
        write_at(&path, first_whole_sector, &vec![0u8; (end - first_whole_sector) as usize]);
        let (mut log, recovery) = LogFiles::open(dir.path()).unwrap();
        assert_eq!(log.last_index(), Some(3), "cut before the torn record");
        assert!(recovery.zeroed_bytes > 0, "{recovery:?}");
        // What followed is gone for good: new records of other sizes do not meet it again.
        log.append([(4, &b"four"[..])]).unwrap();
        drop(log);
        let (log, recovery) = LogFiles::open(dir.path()).unwrap();
        assert_eq!(repairs(&recovery), (0, 0));
        assert_eq!((log.last_index(), log.read(4).unwrap()), (Some(4), Some(b"four".to_vec())));
    }

    /// A write whose last blocks never reached the disk leaves them unallocated (a hole), which
    /// opening does not even read: the record is torn all the same.
    #[test]
    fn a_record_running_into_space_never_written_is_torn() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = LogFiles::open(dir.path()).unwrap();
        let large = vec![9u8; 10_000];
        log.append([(1, &b"one"[..]), (2, &large[..])]).unwrap()[0].sync().unwrap();
        let path = segment_paths(dir.path())[0].clone();
        drop(log);
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: fallocate on an open descriptor.
        let punched = unsafe { libc::fallocate(file.as_raw_fd(), mode, 4096, (SEGMENT_BYTES - 4096) as i64) };
        assert_eq!(punched, 0, "{}", io::Error::last_os_error());
        let (log, recovery) = LogFiles::open(dir.path()).unwrap();
        assert_eq!(log.last_index(), Some(1), "cut before the torn record");
        assert!(recovery.zeroed_bytes > 0, "{recovery:?}");
    }

    /// A node commits only what it has flushed, and flushes in order, so a record that looks
    /// torn with a whole record of a committed entry after it was damaged after it was flushed:
    /// the log is not cut there.
    #[test]
    fn a_torn_looking_record_with_a_committed_entry_whole_after_it_is_damage() {
        let dir = tempfile::tempdir().unwrap();
        let (path, offset, end) = six_records_the_fourth_large(dir.path());
        let first_whole_sector = (offset / 512 + 1) * 512;
        write_at(&path, first_whole_sector, &vec![0u8; 512]);
        let error = LogFiles::open_holding(dir.path(), 5).err().expect("damage fails the open");
        assert!(
            matches!(&error, LogFileError::Damaged { offset: at, .. } if *at == offset)
                && error.to_string().contains("entry 4 does not read back whole")
                && error.to_string().contains("the record of entry 5 after it")
                && error.to_string().contains("committed the entries up to 5"),
            "{error}"
        );
        // A header zeroed with a committed record after it is damage too.
        let mut header = [0u8; HEADER];
        File::open(&path).unwrap().read_exact_at(&mut header, offset).unwrap();
        write_at(&path, offset, &[0u8; HEADER]);
        let error = LogFiles::open_holding(dir.path(), 6).err().expect("damage fails the open");
        assert!(error.to_string().contains("the record of entry 5 after it"), "{error}");
        // Nothing was repaired meanwhile: the same damage, with no entry after it known to be
        // committed, is a torn write and is cut there.
        write_at(&path, offset, &header);
        let (log, recovery) = LogFiles::open_holding(dir.path(), 4).unwrap();
        assert_eq!(log.last_index(), Some(3), "cut before the torn record");
        assert_eq!(recovery.cut_at, Some(4));
        assert!(recovery.zeroed_bytes > 0 && end > offset, "{recovery:?}");
    }

    /// Entries 1 to 5 flushed, then 6 to 8 written by one append a power cut interrupted (entry
    /// 7 spanning several sectors): the segment's path and where entries 6, 7 and 8 start and
    /// the last ends.
    fn an_append_cut_by_a_power_cut(dir: &Path) -> (PathBuf, [u64; 4]) {
        let (mut log, _) = LogFiles::open(dir).unwrap();
        append(&mut log, 1..=5);
        let large = vec![7u8; 3000];
        let unsynced = log.append([(6, &payload(6)[..]), (7, &large[..]), (8, &payload(8)[..])]).unwrap();
        drop(unsynced);
        let segment = &log.segments[0];
        let at = [segment.offsets[5], segment.offsets[6], segment.offsets[7], segment.head];
        (segment_paths(dir)[0].clone(), at)
    }

    /// What a power cut leaves of an append that was written and not fsynced, each sector
    /// written or not: a record with a sector of zeros, a header of zeros with written sectors
    /// after it, or nothing. Each is a torn tail, cut off even when the node's committed index
    /// (8 here) covers it: the node reports an entry flushed only after its fsync, so none of
    /// these were; the caller lowers the committed index.
    #[test]
    fn a_tail_torn_by_a_power_cut_is_cut_off_below_the_committed_index_too() {
        let zero = |path: &Path, from: u64, to: u64| write_at(path, from, &vec![0u8; (to - from) as usize]);
        // Entry 7 torn (its second sector never written), entry 8 not written.
        let dir = tempfile::tempdir().unwrap();
        let (path, [_, seventh, eighth, head]) = an_append_cut_by_a_power_cut(dir.path());
        let second_sector = (seventh / 512 + 1) * 512;
        zero(&path, second_sector, second_sector + 512);
        zero(&path, eighth, head);
        let (log, recovery) = LogFiles::open_holding(dir.path(), 8).expect("a torn tail is repaired");
        assert_eq!((log.last_index(), recovery.cut_at), (Some(6), Some(7)), "{recovery:?}");
        assert!(recovery.zeroed_bytes > 0, "{recovery:?}");
        drop(log);
        let (mut log, recovery) = LogFiles::open_holding(dir.path(), 6).unwrap();
        assert_eq!(
            recovery,
            Recovery { held_at_once: recovery.held_at_once, ..Recovery::default() },
            "repaired for good"
        );
        log.append([(7, &b"seven"[..])]).unwrap()[0].sync().unwrap();
        assert_eq!(log.read(7).unwrap(), Some(b"seven".to_vec()));
        // Entry 6's header never written, entry 7 torn, entry 8 not written.
        let dir = tempfile::tempdir().unwrap();
        let (path, [sixth, seventh, eighth, head]) = an_append_cut_by_a_power_cut(dir.path());
        zero(&path, sixth, sixth + HEADER as u64);
        let second_sector = (seventh / 512 + 1) * 512;
        zero(&path, second_sector, second_sector + 512);
        zero(&path, eighth, head);
        let (log, recovery) = LogFiles::open_holding(dir.path(), 8).expect("a torn tail is repaired");
        assert_eq!((log.last_index(), recovery.cut_at), (Some(5), Some(6)), "{recovery:?}");
        // Nothing of the append written: the log ends at entry 5 with room after it.
        let dir = tempfile::tempdir().unwrap();
        let (path, [sixth, _, _, head]) = an_append_cut_by_a_power_cut(dir.path());
        zero(&path, sixth, head);
        let (log, recovery) = LogFiles::open_holding(dir.path(), 8).unwrap();
        assert_eq!((log.last_index(), recovery.cut_at), (Some(5), None), "{recovery:?}");
        assert!(log.ends_with_room());
    }

    /// Every state a power cut can leave of appends written and not fsynced, each 512-byte
    /// sector of them on disk or not (what was there before: zeros), opens, whether the node had
    /// committed every entry synced or none: the log keeps every entry synced, and every entry
    /// it holds reads back as written. Records of many sizes, so sectors fall anywhere in them.
    #[test]
    fn every_state_a_power_cut_leaves_of_unsynced_appends_opens_with_every_synced_entry() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut random = move |below: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % below
        };
        let payload_of = |index: u64| vec![(index % 250 + 1) as u8; (index * 7919 % 3000 + 1) as usize];
        let sector = SECTOR as u64;
        for round in 0..64 {
            let dir = tempfile::tempdir().unwrap();
            let (mut log, _) = LogFiles::open(dir.path()).unwrap();
            let synced = 1 + random(20);
            let payloads: Vec<Vec<u8>> = (1..=synced).map(payload_of).collect();
            log.append((1..=synced).zip(payloads.iter().map(Vec::as_slice))).unwrap()[0].sync().unwrap();
            let synced_head = log.segments[0].head;
            let last = synced + 1 + random(10);
            let payloads: Vec<Vec<u8>> = (synced + 1..=last).map(payload_of).collect();
            drop(log.append((synced + 1..=last).zip(payloads.iter().map(Vec::as_slice))).unwrap());
            let head = log.segments[0].head;
            let path = segment_paths(dir.path())[0].clone();
            drop(log);
            // Each sector the unsynced appends wrote reached the disk or not.
            let from = synced_head / sector * sector;
            let mut written = vec![0u8; (head.div_ceil(sector) * sector - from) as usize];
            File::open(&path).unwrap().read_exact_at(&mut written, from).unwrap();
            let mut before = vec![0u8; (synced_head - from) as usize];
            File::open(&path).unwrap().read_exact_at(&mut before, from).unwrap();
            before.resize(written.len(), 0);
            let mut lost = Vec::new();
            for (at, (sector_written, sector_before)) in
                written.chunks_mut(SECTOR).zip(before.chunks(SECTOR)).enumerate()
            {
                if random(2) == 0 {
                    sector_written.copy_from_slice(sector_before);
                    lost.push(at);
                }
            }
            write_at(&path, from, &written);
            let committed = if random(2) == 0 { synced } else { 0 };
            let (log, recovery) = LogFiles::open_holding(dir.path(), committed)
                .unwrap_or_else(|e| panic!("round {round}, sectors lost {lost:?}: {e}"));
            let held = log.last_index().unwrap();
            assert!((synced..=last).contains(&held), "round {round}: {held} of {synced}..={last}, {recovery:?}");
            for index in 1..=held {
                assert_eq!(log.read(index).unwrap(), Some(payload_of(index)), "round {round}: entry {index}");
            }
            drop(log);
            let (log, recovery) = LogFiles::open_holding(dir.path(), committed).unwrap();
            assert_eq!((recovery.cut_at, recovery.zeroed_bytes), (None, 0), "round {round}: repaired for good");
            assert_eq!(log.last_index(), Some(held));
        }
    }

    /// An append that filled the last segment and went on into a new one (created durably before
    /// the append) may lose its start in the first and keep its end in the second: a torn tail,
    /// cut off with the new segment, not a gap between segments.
    #[test]
    fn an_append_that_lost_its_start_in_one_segment_and_kept_its_end_in_the_next_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = LogFiles::open(dir.path()).unwrap();
        append(&mut log, 1..=1);
        let big = vec![5u8; SEGMENT_BYTES as usize];
        let unsynced = log.append([(2, &payload(2)[..]), (3, &big[..])]).unwrap();
        assert_eq!(unsynced.len(), 2, "the append went on into a new segment");
        let (path, second, head) =
            (segment_paths(dir.path())[0].clone(), log.segments[0].offsets[1], log.segments[0].head);
        drop((log, unsynced));
        write_at(&path, second, &vec![0u8; (head - second) as usize]);
        // Entry 3 known committed: it was flushed, and entry 2 with it.
        let error = LogFiles::open_holding(dir.path(), 3).err().expect("a committed entry after the gap");
        assert!(error.to_string().contains("the record of entry 3 after it"), "{error}");
        let (log, recovery) = LogFiles::open_holding(dir.path(), 1).expect("a torn tail is repaired");
        assert_eq!((log.last_index(), recovery.cut_at, recovery.deleted_segments), (Some(1), Some(2), 1));
        assert_eq!(segment_paths(dir.path()).len(), 1);
    }

    #[test]
    fn a_damaged_record_fails_the_open_instead_of_being_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = LogFiles::open(dir.path()).unwrap();
        append(&mut log, 1..=50);
        let (path, offset, _) = record_at(dir.path(), &log, 20);
        drop(log);
        let mut byte = [0u8; 1];
        File::open(&path).unwrap().read_exact_at(&mut byte, offset + HEADER as u64 + 2).unwrap();
        write_at(&path, offset + HEADER as u64 + 2, &[byte[0] ^ 0x40]);
        let error = LogFiles::open(dir.path()).err().expect("damage fails the open");
        assert!(
            matches!(&error, LogFileError::Damaged { offset: at, .. } if *at == offset)
                && error.to_string().contains("checksum of entry 20"),
            "{error}"
        );
        // A header that names another entry is damage too.
        write_at(&path, offset + HEADER as u64 + 2, &byte);
        write_at(&path, offset + 8, &99u64.to_le_bytes());
        let error = LogFiles::open(dir.path()).err().expect("damage fails the open");
        assert!(error.to_string().contains("entry 99 where entry 20 belongs"), "{error}");
    }

    #[test]
    fn a_record_damaged_while_the_log_is_open_does_not_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = LogFiles::open(dir.path()).unwrap();
        append(&mut log, 1..=10);
        let (path, offset, _) = record_at(dir.path(), &log, 4);
        write_at(&path, offset + HEADER as u64, b"\xff");
        let error = log.read(4).expect_err("the damage is found");
        assert!(describes_damage(&error.to_string()), "{error}");
        assert_eq!(log.read(5).unwrap(), Some(payload(5)), "the others read back");
    }

    #[test]
    fn a_gap_between_segments_is_damage() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = LogFiles::open(dir.path()).unwrap();
        let big = vec![1u8; SEGMENT_BYTES as usize];
        log.append([(1, &big[..]), (2, &big[..]), (3, &b"x"[..])]).unwrap();
        drop(log);
        std::fs::remove_file(dir.path().join(segment_name(2))).unwrap();
        let error = LogFiles::open(dir.path()).err().expect("a missing segment fails the open");
        assert!(error.to_string().contains("starts at entry 3"), "{error}");
    }

    /// Each segment a truncation or a purge removes is gone from the directory durably (the
    /// directory synced) before the next step: removing the next segment, zeroing the tail of
    /// the last one kept, or creating a segment of the same name. A power cut never brings back
    /// a segment with a gap before it, nor an old segment under a name a new one took.
    #[test]
    fn truncations_and_purges_sync_the_directory_after_each_segment_they_remove() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = LogFiles::open(dir.path()).unwrap();
        // Two do not fit in one segment: a segment each.
        let third = vec![3u8; (SEGMENT_BYTES / 2 + 1) as usize];
        log.append((1..=3).map(|index| (index, &third[..]))).unwrap();
        append(&mut log, 4..=4);
        let segments = segment_paths(dir.path());
        assert_eq!(segments.len(), 3);
        let removed = |path: &PathBuf| format!("removed {}", path.display());
        let synced = format!("synced {}", dir.path().display());
        crate::file_removal::steps::take();
        log.truncate(2).unwrap();
        assert_eq!(
            crate::file_removal::steps::take(),
            [removed(&segments[2]), synced.clone(), removed(&segments[1]), synced.clone()],
            "the last segment first, each synced"
        );
        log.append((2..=3).map(|index| (index, &third[..]))).unwrap();
        let segments = segment_paths(dir.path());
        assert_eq!(segments.len(), 3);
        crate::file_removal::steps::take();
        log.purge(2).unwrap();
        assert_eq!(
            crate::file_removal::steps::take(),
            [removed(&segments[0]), synced.clone(), removed(&segments[1]), synced],
            "the first segment first, each synced"
        );
        assert_eq!((log.first_index(), log.last_index()), (Some(3), Some(3)));
    }

    #[test]
    fn sectors_are_checked_whole_where_they_lie_in_the_file() {
        let mut file = vec![1u8; 2048];
        assert!(!has_unwritten_sector(&file[100..], 100, 1500));
        file[1024..1536].fill(0);
        assert!(has_unwritten_sector(&file[100..], 100, 1500), "the sector 1024..1536");
        assert!(!has_unwritten_sector(&file[1030..], 1030, 1500), "the header's own sector is not checked");
        assert!(!has_unwritten_sector(&file[100..1024], 100, 1024), "a sector after the record is not checked");
        let mut file = vec![1u8; 1024];
        file[600..1024].fill(0);
        assert!(!has_unwritten_sector(&file, 0, 700), "zeros at the end of a payload in a written sector");
    }
}
