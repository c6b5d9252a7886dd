//! A FUSE file system for crash-consistency tests, after Jepsen's LazyFS: a passthrough over a
//! backing directory that holds what was written and not yet synced in memory, so that a
//! simulated power cut can drop it.
//!
//! # The model
//!
//! - **File data** written (`write`) goes to an in-memory overlay of the file, in the order it
//!   came. Reads see it over the backing file's content, and the file's size is the larger of
//!   the backing file's and the end of the furthest pending write.
//! - **`fsync` and `fdatasync`** of a file write that file's overlay to the backing file, in
//!   order, and sync the backing file (`fsync` or `fdatasync` as asked). Nothing else does:
//!   `close`, `sync_file_range` and `msync`-free page-cache write-back make nothing durable (the
//!   mount has no write-back cache: every `write` reaches the file system at once).
//! - **Metadata** reaches the backing directory at once, as with LazyFS: `create`, `mkdir`,
//!   `unlink`, `rmdir`, `rename`, `link`, a size set by `truncate`/`ftruncate` (pending writes
//!   beyond the new size are forgotten), `fallocate` (a hole punched or a range zeroed forgets the
//!   pending writes in it), permissions, owners and times. A power cut never undoes them, so
//!   `fsyncdir` has nothing to do. A file created, written and renamed but never synced is
//!   there after a cut, with the size its backing file had (empty, for a new file).
//! - **A power cut** ([`PowerCutMount::cut`]; the processes using the mount must be dead by
//!   then) unmounts the file system, which also drops the kernel's page cache of it, forgets
//!   every overlay, and mounts it again. A **torn** cut ([`Cut::Torn`]) instead keeps, of each
//!   file, a random prefix of its unsynced writes, ending at a 512-byte sector boundary of the
//!   file: whole sectors only, as a disk that writes sectors in order and loses power.
//!
//! Not kept: extended attributes, symbolic links, special files and POSIX locks (locks are the
//! kernel's own, per mount). `SEEK_DATA`/`SEEK_HOLE` are not answered, so the kernel reports
//! the whole file as data.
//!
//! Mounting needs `/dev/fuse` and either root (mount(2)) or `fusermount3` (Debian `fuse3`).

mod fs;
mod overlay;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use overlay::{Overlay, SECTOR};

/// What a power cut keeps of the data written and not synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Nothing.
    Clean,
    /// Of each file, a random prefix of its unsynced writes, in whole sectors.
    Torn,
}

/// What a power cut did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CutReport {
    /// Files that had unsynced writes.
    pub files: usize,
    /// Unsynced bytes forgotten.
    pub lost_bytes: u64,
    /// Unsynced bytes a torn cut wrote to the backing files.
    pub kept_bytes: u64,
}

/// A mounted power-cut file system: `mountpoint` shows `backing`. Unmounted on drop.
pub struct PowerCutMount {
    backing: PathBuf,
    mountpoint: PathBuf,
    shared: Arc<fs::Shared>,
    session: Option<fuser::BackgroundSession>,
}

impl PowerCutMount {
    /// Mounts the file system over the directory `backing` at the directory `mountpoint`.
    pub fn mount(backing: &Path, mountpoint: &Path) -> io::Result<PowerCutMount> {
        let shared = Arc::new(fs::Shared::new(backing)?);
        let session = spawn(&shared, mountpoint)?;
        Ok(PowerCutMount {
            backing: backing.to_path_buf(),
            mountpoint: mountpoint.to_path_buf(),
            shared,
            session: Some(session),
        })
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    pub fn backing(&self) -> &Path {
        &self.backing
    }

    /// Bytes written and not yet synced, over every file.
    pub fn pending_bytes(&self) -> u64 {
        let overlays: Vec<_> = self.shared.lock().overlays.values().cloned().collect();
        overlays.iter().map(|o| o.lock().map_or(0, |o| o.pending_bytes())).sum()
    }

    /// A power cut: unmounts, forgets every unsynced write (or, [`Cut::Torn`], keeps a prefix of
    /// each file's in whole sectors), and mounts again. Every process that used the mount must
    /// be dead (SIGKILL) first, or the unmount fails.
    pub fn cut(&mut self, cut: Cut) -> io::Result<CutReport> {
        self.unmount()?;
        let mut report = CutReport::default();
        let state = std::mem::take(&mut *self.shared.lock());
        for (ino, overlay) in state.overlays {
            let mut overlay = overlay.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let pending = overlay.pending_bytes();
            if pending == 0 {
                continue;
            }
            report.files += 1;
            let backing_file = state.paths.get(&ino).map(|relative| self.backing.join(relative));
            let kept = match (cut, backing_file) {
                (Cut::Torn, Some(path)) => match std::fs::File::options().write(true).open(&path) {
                    Ok(file) => {
                        let kept = overlay.tear(&file, |n| fastrand::u64(..n))?;
                        file.sync_data()?;
                        kept
                    }
                    // Removed since: nothing of it to keep.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
                    Err(e) => return Err(e),
                },
                _ => 0,
            };
            report.kept_bytes += kept;
            report.lost_bytes += pending - kept;
        }
        self.shared = Arc::new(fs::Shared::new(&self.backing)?);
        self.session = Some(spawn(&self.shared, &self.mountpoint)?);
        Ok(report)
    }

    /// Unmounts (done on drop too); unsynced writes stay held until a [`PowerCutMount::cut`].
    pub fn unmount(&mut self) -> io::Result<()> {
        let Some(session) = self.session.take() else { return Ok(()) };
        // The kernel may still be closing the files of a process just killed: busy for a moment.
        let path = std::ffi::CString::new(self.mountpoint.as_os_str().as_encoded_bytes())
            .map_err(|_| io::Error::other("a mount point with a NUL byte"))?;
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            // SAFETY: a valid C string.
            if unsafe { libc::umount2(path.as_ptr(), 0) } == 0 {
                break;
            }
            let error = io::Error::last_os_error();
            match error.raw_os_error() {
                Some(libc::EBUSY) if std::time::Instant::now() < until => {
                    std::thread::sleep(std::time::Duration::from_millis(20))
                }
                // Not mounted (any more): the session ends all the same.
                Some(libc::EINVAL) | Some(libc::ENOENT) => break,
                _ => {
                    self.session = Some(session);
                    return Err(io::Error::new(
                        error.kind(),
                        format!("unmounting {}: {error}", self.mountpoint.display()),
                    ));
                }
            }
        }
        // Unmounted: the session's threads end, and its own unmount finds nothing left to do.
        session.join()
    }
}

impl Drop for PowerCutMount {
    fn drop(&mut self) {
        if let Err(e) = self.unmount() {
            // Busy: detached lazily, gone once its last user is.
            eprintln!("unmounting {}: {e}; detaching it", self.mountpoint.display());
            if let Ok(path) = std::ffi::CString::new(self.mountpoint.as_os_str().as_encoded_bytes()) {
                // SAFETY: a valid C string.
                unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
            }
        }
    }
}

fn spawn(shared: &Arc<fs::Shared>, mountpoint: &Path) -> io::Result<fuser::BackgroundSession> {
    let mut config = fuser::Config::default();
    config.mount_options = vec![fuser::MountOption::FSName("powercut".into()), fuser::MountOption::NoAtime];
    config.n_threads = Some(4);
    fuser::spawn_mount(fs::PowerCutFs { shared: shared.clone() }, mountpoint, &config)
}
