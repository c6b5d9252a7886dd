//! Removing large files (replaced snapshots, purged log segments) without holding up the
//! fsyncs of the request path.
//!
//! Deleting a file frees its blocks in the journal commit that follows, and on a file system
//! that discards freed blocks (ext4 mounted with `discard`, common on virtual disks) that commit
//! also discards them, while every `fsync` on the file system waits for it. Deleting three 340
//! MiB snapshot files at once held a concurrent `fdatasync` up for 91–152 ms on such a disk;
//! shrinking them [`STEP`] bytes at a time, each step synced, for 16–21 ms
//! (`docs/benchmarks.md`, *The build window again* and *Where the build window's waits come
//! from*). RocksDB's `DeleteScheduler` (deleting obsolete table files at a bounded rate, in
//! chunks) exists for the same reason.
//!
//! [`remove`] takes the file's name away at once (so the directory is what the caller expects
//! when it returns) and hands the still-open file to one background thread per process, which
//! shrinks it step by step and closes it. The thread leaves a file alone while another
//! descriptor of this process has it open: a reader that opened a replaced snapshot keeps
//! reading all of it, as it could after a plain delete, and the file is shrunk once the reader
//! closes it (the other files go on meanwhile). A crash before the thread is done leaves an
//! unnamed file, which the file system frees when it is next mounted.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

/// Bytes freed per step; each step is synced before the next.
pub const STEP: u64 = 32 << 20;
/// Files no larger than this are deleted at once: their discard is as small as a step's.
pub const SMALL: u64 = STEP;
/// How often the thread looks again at the descriptors of a file it waits for.
const READER_POLL: Duration = Duration::from_millis(200);
/// A pause between steps, so that other files' journal commits go between this file's.
const STEP_PAUSE: Duration = Duration::from_millis(5);

/// Syncs the directory `dir`, so that a name removed from it (or added to it) stays so across a
/// power cut.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()?;
    #[cfg(test)]
    steps::record(format!("synced {}", dir.display()));
    Ok(())
}

/// What this thread removed and synced, in order, for tests of the order of those steps.
#[cfg(test)]
pub(crate) mod steps {
    use std::cell::RefCell;

    thread_local! {
        static STEPS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    }

    pub(crate) fn record(step: String) {
        STEPS.with(|steps| steps.borrow_mut().push(step));
    }

    /// The steps recorded since the last call.
    pub(crate) fn take() -> Vec<String> {
        STEPS.with(|steps| std::mem::take(&mut *steps.borrow_mut()))
    }
}

/// Syncs the directory holding `path`.
fn sync_parent(path: &Path) -> io::Result<()> {
    let dir = path.parent().filter(|dir| !dir.as_os_str().is_empty()).unwrap_or(Path::new("."));
    sync_dir(dir)
}

/// Removes the file at `path` with the process's removal thread ([`Remover::remove`]).
pub fn remove(path: &Path) -> io::Result<()> {
    static REMOVER: OnceLock<Remover> = OnceLock::new();
    REMOVER.get_or_init(Remover::start).remove(path)
}

struct Pending {
    file: File,
    device: u64,
    inode: u64,
}

/// A removal thread and the count of files it has not finished. The thread ends when its
/// `Remover` is dropped, closing the files it still holds.
pub struct Remover {
    queue: Mutex<Sender<Pending>>,
    unfinished: Arc<(Mutex<u64>, Condvar)>,
}

impl Remover {
    /// Starts a removal thread. If it cannot start, files larger than [`SMALL`] are freed at
    /// once instead.
    pub fn start() -> Remover {
        let (queue, received) = mpsc::channel();
        let unfinished = Arc::new((Mutex::new(0), Condvar::new()));
        let counted = unfinished.clone();
        let spawned = std::thread::Builder::new().name("file-removal".into()).spawn(move || run(received, &counted));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "could not start the file removal thread; large files are freed at once");
        }
        Remover { queue: Mutex::new(queue), unfinished }
    }

    /// Removes the file at `path`: its name at once, durably (the directory synced before this
    /// returns), its blocks [`STEP`] bytes at a time on the thread. A missing file is not an
    /// error.
    pub fn remove(&self, path: &Path) -> io::Result<()> {
        let file = match OpenOptions::new().write(true).open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            // Not writable here: deleted the plain way.
            Err(_) => {
                fs::remove_file(path)?;
                #[cfg(test)]
                steps::record(format!("removed {}", path.display()));
                return sync_parent(path);
            }
        };
        let metadata = file.metadata()?;
        fs::remove_file(path)?;
        #[cfg(test)]
        steps::record(format!("removed {}", path.display()));
        // Before the file's blocks are freed and before the caller goes on (to create a file of
        // the same name, say): a power cut must not bring the file back after either.
        sync_parent(path)?;
        if metadata.len() > SMALL {
            self.submit(Pending { file, device: metadata.dev(), inode: metadata.ino() });
        }
        Ok(())
    }

    fn submit(&self, pending: Pending) {
        *self.unfinished.0.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        let sent = self.queue.lock().unwrap_or_else(|p| p.into_inner()).send(pending);
        if let Err(mpsc::SendError(pending)) = sent {
            // The thread is gone (it cannot panic, but if it did): close the file here.
            drop(pending);
            self.finished();
        }
    }

    fn finished(&self) {
        finish_one(&self.unfinished);
    }

    /// Waits until every file handed to [`Remover::remove`] before this call has been shrunk
    /// and closed, or `timeout` passes; returns whether they were.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let (count, changed) = &*self.unfinished;
        let guard = count.lock().unwrap_or_else(|p| p.into_inner());
        let (guard, _) = changed.wait_timeout_while(guard, timeout, |n| *n > 0).unwrap_or_else(|p| p.into_inner());
        *guard == 0
    }
}

fn finish_one(unfinished: &(Mutex<u64>, Condvar)) {
    let mut count = unfinished.0.lock().unwrap_or_else(|p| p.into_inner());
    *count = count.saturating_sub(1);
    unfinished.1.notify_all();
}

/// The removal thread: files whose other descriptors are closed are shrunk in arrival order;
/// the others wait their turn.
fn run(received: Receiver<Pending>, unfinished: &(Mutex<u64>, Condvar)) {
    let mut waiting: VecDeque<Pending> = VecDeque::new();
    loop {
        let next = if waiting.is_empty() {
            match received.recv() {
                Ok(pending) => Some(pending),
                Err(_) => return,
            }
        } else {
            match received.recv_timeout(READER_POLL) {
                Ok(pending) => Some(pending),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        };
        waiting.extend(next);
        let mut still = VecDeque::new();
        while let Some(pending) = waiting.pop_front() {
            if open_elsewhere(&pending) {
                still.push_back(pending);
                continue;
            }
            if let Err(e) = shrink(&pending.file) {
                tracing::warn!(error = %e, "could not shrink a removed file step by step; it is freed at once");
            }
            drop(pending);
            finish_one(unfinished);
        }
        waiting = still;
    }
}

/// Whether a descriptor of this process other than `pending`'s own refers to its file. If the
/// descriptors cannot be listed, none is assumed.
fn open_elsewhere(pending: &Pending) -> bool {
    use std::os::fd::AsRawFd;
    let own = pending.file.as_raw_fd().to_string();
    let Ok(entries) = fs::read_dir("/proc/self/fd") else { return false };
    entries.flatten().any(|entry| {
        entry.file_name().to_str() != Some(own.as_str())
            && fs::metadata(entry.path()).is_ok_and(|m| m.dev() == pending.device && m.ino() == pending.inode)
    })
}

/// Shrinks `file` to nothing, [`STEP`] bytes at a time, syncing each step.
fn shrink(file: &File) -> io::Result<()> {
    let mut len = file.metadata()?.len();
    while len > 0 {
        len = len.saturating_sub(STEP);
        file.set_len(len)?;
        file.sync_data()?;
        if len > 0 {
            std::thread::sleep(STEP_PAUSE);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Seek, SeekFrom, Write};

    use super::*;

    fn write_file(path: &Path, len: u64) {
        let mut file = File::create(path).unwrap();
        let chunk = vec![7u8; 1 << 20];
        let mut left = len;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            file.write_all(&chunk[..n]).unwrap();
            left -= n as u64;
        }
        file.sync_all().unwrap();
    }

    /// Blocks the file system holds for the inode of an open `file`.
    fn allocated(file: &File) -> u64 {
        file.metadata().unwrap().blocks() * 512
    }

    #[test]
    fn a_removed_file_loses_its_name_at_once_and_its_blocks_on_the_thread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("large");
        write_file(&path, 3 * STEP + 12345);
        let remover = Remover::start();
        remover.remove(&path).unwrap();
        assert!(!path.exists(), "the name goes before remove returns");
        assert!(remover.wait_idle(Duration::from_secs(30)), "the thread shrinks and closes the file");
        // A missing file is not an error; a small one goes at once.
        remover.remove(&path).unwrap();
        let small = dir.path().join("small");
        write_file(&small, 4096);
        remover.remove(&small).unwrap();
        assert!(!small.exists());
        assert!(remover.wait_idle(Duration::ZERO), "a small file is not handed to the thread");
    }

    /// The name is gone from the directory durably before `remove` returns: nothing done after
    /// it (a file created under the same name, the space reused) can reach the disk while a
    /// power cut could still bring the old file back.
    #[test]
    fn a_removed_file_is_gone_from_its_directory_durably_when_remove_returns() {
        let dir = tempfile::tempdir().unwrap();
        let remover = Remover::start();
        for (name, len) in [("small", 4096), ("large", 2 * STEP)] {
            let path = dir.path().join(name);
            write_file(&path, len);
            steps::take();
            remover.remove(&path).unwrap();
            assert_eq!(
                steps::take(),
                [format!("removed {}", path.display()), format!("synced {}", dir.path().display())],
                "{name}"
            );
        }
    }

    #[test]
    fn shrinking_frees_every_block() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shrunk");
        write_file(&path, 2 * STEP + 1);
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        assert!(allocated(&file) > 2 * STEP);
        shrink(&file).unwrap();
        assert_eq!(file.metadata().unwrap().len(), 0);
        assert_eq!(allocated(&file), 0);
    }

    #[test]
    fn a_reader_of_a_removed_file_reads_all_of_it_and_then_the_file_is_shrunk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("read-while-removed");
        let len = 2 * STEP + 777;
        write_file(&path, len);
        let mut reader = File::open(&path).unwrap();
        let remover = Remover::start();
        remover.remove(&path).unwrap();
        assert!(!path.exists());
        std::thread::sleep(READER_POLL * 3);
        assert!(!remover.wait_idle(Duration::ZERO), "the thread waits while another descriptor is open");
        assert!(allocated(&reader) >= len, "nothing is freed under the reader");
        let mut bytes = 0u64;
        let mut buf = vec![0u8; 1 << 20];
        reader.seek(SeekFrom::Start(0)).unwrap();
        loop {
            let n = reader.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            assert!(buf[..n].iter().all(|b| *b == 7));
            bytes += n as u64;
        }
        assert_eq!(bytes, len, "the reader reads the whole file");
        let probe = reader.try_clone().unwrap();
        drop(reader);
        // `probe` is another descriptor as well: the thread waits for it too, until it closes.
        assert!(!remover.wait_idle(READER_POLL * 3));
        drop(probe);
        assert!(remover.wait_idle(Duration::from_secs(30)), "once the reader closes, the file is shrunk and closed");
    }
}
