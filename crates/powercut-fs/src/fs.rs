//! The FUSE requests: a passthrough to the backing directory, except that file data written
//! goes to each file's [`Overlay`] until the file is synced.

use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    BsdFileFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use crate::overlay::Overlay;

/// How long the kernel may keep attributes and names: every change comes through this file
/// system, so the kernel's own view stays right.
const TTL: Duration = Duration::from_secs(1);

/// An open file: the backing file, opened for reading and writing whatever the caller asked
/// (any handle may have to write the overlay out at its `fsync`).
struct Handle {
    ino: u64,
    file: Arc<File>,
}

/// What the file system knows, shared by its request threads and its [`crate::PowerCut`].
#[derive(Default)]
pub(crate) struct State {
    /// FUSE inode → a path of it under the backing root (`""` for the root).
    pub(crate) paths: HashMap<u64, PathBuf>,
    /// FUSE inode → what was written to it and not synced.
    pub(crate) overlays: HashMap<u64, Arc<Mutex<Overlay>>>,
    handles: HashMap<u64, Handle>,
    next_handle: u64,
}

/// The backing directory and the state over it.
pub(crate) struct Shared {
    pub(crate) backing: PathBuf,
    /// The backing root's inode number, which FUSE calls 1 (and 1, if the backing file system
    /// has such an inode, is called this).
    root_ino: u64,
    pub(crate) state: Mutex<State>,
}

impl Shared {
    pub(crate) fn new(backing: &Path) -> io::Result<Shared> {
        let root_ino = fs::metadata(backing)?.ino();
        let mut state = State::default();
        state.paths.insert(INodeNo::ROOT.0, PathBuf::new());
        Ok(Shared { backing: backing.to_path_buf(), root_ino, state: Mutex::new(state) })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The FUSE inode of a backing inode (and back: the mapping is its own inverse).
    fn ino(&self, backing_ino: u64) -> u64 {
        if backing_ino == self.root_ino {
            INodeNo::ROOT.0
        } else if backing_ino == INodeNo::ROOT.0 {
            self.root_ino
        } else {
            backing_ino
        }
    }

    /// The backing path of FUSE inode `ino`, if it was looked up.
    fn path(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        let relative = self.lock().paths.get(&ino.0).cloned().ok_or(Errno::ENOENT)?;
        Ok(self.backing.join(relative))
    }

    /// The backing path of `name` in directory `parent`, and the path relative to the root.
    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<(PathBuf, PathBuf), Errno> {
        if name.as_bytes().contains(&b'/') || name == "." || name == ".." {
            return Err(Errno::EINVAL);
        }
        let relative = self.lock().paths.get(&parent.0).cloned().ok_or(Errno::ENOENT)?.join(name);
        Ok((self.backing.join(&relative), relative))
    }

    fn overlay(&self, ino: u64) -> Arc<Mutex<Overlay>> {
        self.lock().overlays.entry(ino).or_default().clone()
    }

    fn pending_end(&self, ino: u64) -> u64 {
        let overlay = self.lock().overlays.get(&ino).cloned();
        overlay.map_or(0, |o| lock(&o).end())
    }

    /// Attributes of the backing file `meta` as FUSE reports them: its size the logical one.
    fn attr(&self, meta: &fs::Metadata) -> FileAttr {
        let ino = self.ino(meta.ino());
        let kind = FileType::from_std(meta.file_type()).unwrap_or(FileType::RegularFile);
        let size = if kind == FileType::RegularFile { meta.len().max(self.pending_end(ino)) } else { meta.len() };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: meta.blocks(),
            atime: time(meta.atime(), meta.atime_nsec()),
            mtime: time(meta.mtime(), meta.mtime_nsec()),
            ctime: time(meta.ctime(), meta.ctime_nsec()),
            crtime: UNIX_EPOCH,
            kind,
            perm: (meta.mode() & 0o7777) as u16,
            nlink: meta.nlink() as u32,
            uid: meta.uid(),
            gid: meta.gid(),
            rdev: meta.rdev() as u32,
            blksize: meta.blksize() as u32,
            flags: 0,
        }
    }

    /// Looks `relative` up: remembers its path for its inode; its attributes.
    fn remember(&self, path: &Path, relative: PathBuf) -> Result<FileAttr, Errno> {
        let meta = fs::symlink_metadata(path).map_err(Errno::from)?;
        let attr = self.attr(&meta);
        self.lock().paths.insert(attr.ino.0, relative);
        Ok(attr)
    }

    fn handle(&self, fh: FileHandle) -> Result<(u64, Arc<File>), Errno> {
        let state = self.lock();
        let handle = state.handles.get(&fh.0).ok_or(Errno::EBADF)?;
        Ok((handle.ino, handle.file.clone()))
    }

    fn open_handle(&self, ino: u64, file: File) -> FileHandle {
        let mut state = self.lock();
        state.next_handle += 1;
        let fh = state.next_handle;
        state.handles.insert(fh, Handle { ino, file: Arc::new(file) });
        FileHandle(fh)
    }

    /// Forgets the overlay of inode `ino` once no name and no open handle is left of it.
    fn forget_if_gone(&self, ino: u64, links: u64) {
        let mut state = self.lock();
        if links == 0 && !state.handles.values().any(|h| h.ino == ino) {
            state.overlays.remove(&ino);
            state.paths.remove(&ino);
        }
    }
}

fn lock(overlay: &Mutex<Overlay>) -> MutexGuard<'_, Overlay> {
    overlay.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn time(secs: i64, nanos: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nanos as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
    }
}

/// Where `path` is once `from` is renamed to `to` (`None` when it is not under `from`).
fn moved_path(path: &Path, from: &Path, to: &Path) -> Option<PathBuf> {
    let rest = path.strip_prefix(from).ok()?;
    // `join("")` would add a trailing slash.
    Some(if rest.as_os_str().is_empty() { to.to_path_buf() } else { to.join(rest) })
}

fn c_path(path: &Path) -> Result<CString, Errno> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)
}

/// The result of a libc call that returns -1 and sets `errno` on failure.
fn check(result: libc::c_int) -> Result<(), Errno> {
    if result == 0 {
        Ok(())
    } else {
        Err(Errno::from(io::Error::last_os_error()))
    }
}

/// Opens the backing file at `path` for reading and writing, as the open that FUSE forwards
/// asked (`flags` without the access mode and the flags FUSE handles itself).
fn open_backing(path: &Path, flags: i32, create: Option<u32>) -> io::Result<File> {
    let passed = flags & (libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC);
    let mut options = File::options();
    options.read(true).write(true).custom_flags(passed & !(libc::O_CREAT | libc::O_EXCL));
    if let Some(mode) = create {
        options.mode(mode);
        if flags & libc::O_EXCL != 0 {
            options.create_new(true);
        } else {
            options.create(true);
        }
    }
    options.open(path)
}

/// What a `setattr` changes.
struct Changes {
    mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    size: Option<u64>,
    atime: Option<TimeOrNow>,
    mtime: Option<TimeOrNow>,
}

/// The file system. Mount it with [`crate::PowerCutMount`].
pub(crate) struct PowerCutFs {
    pub(crate) shared: Arc<Shared>,
}

impl PowerCutFs {
    fn reply_entry(&self, reply: ReplyEntry, attr: Result<FileAttr, Errno>) {
        match attr {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(errno) => reply.error(errno),
        }
    }

    fn setattr_inner(&self, ino: INodeNo, changes: Changes, fh: Option<FileHandle>) -> Result<FileAttr, Errno> {
        let Changes { mode, uid, gid, size, atime, mtime } = changes;
        let path = self.shared.path(ino)?;
        if let Some(mode) = mode {
            fs::set_permissions(&path, fs::Permissions::from_mode(mode & 0o7777)).map_err(Errno::from)?;
        }
        if uid.is_some() || gid.is_some() {
            std::os::unix::fs::lchown(&path, uid, gid).map_err(Errno::from)?;
        }
        if let Some(size) = size {
            // A truncation reaches the backing file at once; what was pending past it is gone.
            let overlay = self.shared.overlay(ino.0);
            let mut overlay = lock(&overlay);
            match fh.map(|fh| self.shared.handle(fh)) {
                Some(Ok((_, file))) => file.set_len(size),
                _ => File::options().write(true).open(&path).and_then(|f| f.set_len(size)),
            }
            .map_err(Errno::from)?;
            overlay.discard_from(size);
        }
        if atime.is_some() || mtime.is_some() {
            let spec = |t: Option<TimeOrNow>| match t {
                None => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
                Some(TimeOrNow::Now) => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW },
                Some(TimeOrNow::SpecificTime(t)) => {
                    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
                    libc::timespec { tv_sec: since.as_secs() as libc::time_t, tv_nsec: since.subsec_nanos() as _ }
                }
            };
            let times = [spec(atime), spec(mtime)];
            let c = c_path(&path)?;
            // SAFETY: a valid C string and two timespecs.
            check(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) })?;
        }
        let meta = fs::symlink_metadata(&path).map_err(Errno::from)?;
        Ok(self.shared.attr(&meta))
    }

    /// Writes the overlay of `ino` to the backing file and syncs that file.
    fn sync(&self, ino: INodeNo, fh: FileHandle, datasync: bool) -> Result<(), Errno> {
        let file = match self.shared.handle(fh) {
            Ok((_, file)) => file,
            Err(_) => Arc::new(open_backing(&self.shared.path(ino)?, 0, None).map_err(Errno::from)?),
        };
        let overlay = self.shared.overlay(ino.0);
        let mut overlay = lock(&overlay);
        overlay.persist(&file).map_err(Errno::from)?;
        if datasync { file.sync_data() } else { file.sync_all() }.map_err(Errno::from)
    }

    fn readdir_inner(&self, ino: INodeNo, offset: u64, reply: &mut ReplyDirectory) -> Result<(), Errno> {
        let path = self.shared.path(ino)?;
        let mut entries = vec![(ino.0, FileType::Directory, OsStr::new(".").to_os_string())];
        entries.push((ino.0, FileType::Directory, OsStr::new("..").to_os_string()));
        for entry in fs::read_dir(&path).map_err(Errno::from)? {
            let entry = entry.map_err(Errno::from)?;
            let meta = entry.metadata().map_err(Errno::from)?;
            let kind = FileType::from_std(meta.file_type()).unwrap_or(FileType::RegularFile);
            entries.push((self.shared.ino(meta.ino()), kind, entry.file_name()));
        }
        for (i, (entry_ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(entry_ino), i as u64 + 1, kind, name) {
                break;
            }
        }
        Ok(())
    }

    fn rename_inner(
        &self,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        let (from, from_relative) = self.shared.child(parent, name)?;
        let (to, to_relative) = self.shared.child(newparent, newname)?;
        let replaced = fs::symlink_metadata(&to).ok().map(|m| (self.shared.ino(m.ino()), m.nlink()));
        if flags.bits() == 0 {
            fs::rename(&from, &to).map_err(Errno::from)?;
        } else {
            let (a, b) = (c_path(&from)?, c_path(&to)?);
            // SAFETY: two valid C strings.
            check(unsafe {
                libc::syscall(libc::SYS_renameat2, libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), flags.bits())
                    as libc::c_int
            })?;
        }
        let exchanged = flags.bits() & libc::RENAME_EXCHANGE != 0;
        let mut state = self.shared.lock();
        for path in state.paths.values_mut() {
            if let Some(moved) = moved_path(path, &from_relative, &to_relative) {
                *path = moved;
            } else if exchanged {
                if let Some(moved) = moved_path(path, &to_relative, &from_relative) {
                    *path = moved;
                }
            }
        }
        drop(state);
        if let Some((ino, links)) = replaced.filter(|_| !exchanged) {
            self.shared.forget_if_gone(ino, links.saturating_sub(1));
        }
        Ok(())
    }
}

impl Filesystem for PowerCutFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let attr = self.shared.child(parent, name).and_then(|(path, relative)| self.shared.remember(&path, relative));
        self.reply_entry(reply, attr);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let meta = match fh.map(|fh| self.shared.handle(fh)) {
            Some(Ok((_, file))) => file.metadata().map_err(Errno::from),
            _ => self.shared.path(ino).and_then(|path| fs::symlink_metadata(path).map_err(Errno::from)),
        };
        match meta {
            Ok(meta) => reply.attr(&TTL, &self.shared.attr(&meta)),
            Err(errno) => reply.error(errno),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        match self.setattr_inner(ino, Changes { mode, uid, gid, size, atime, mtime }, fh) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(errno) => reply.error(errno),
        }
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let attr = self.shared.child(parent, name).and_then(|(path, relative)| {
            fs::DirBuilder::new().mode(mode & !umask & 0o7777).create(&path).map_err(Errno::from)?;
            self.shared.remember(&path, relative)
        });
        self.reply_entry(reply, attr);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let result = self.shared.child(parent, name).and_then(|(path, _)| {
            let meta = fs::symlink_metadata(&path).map_err(Errno::from)?;
            fs::remove_file(&path).map_err(Errno::from)?;
            self.shared.forget_if_gone(self.shared.ino(meta.ino()), meta.nlink().saturating_sub(1));
            Ok(())
        });
        match result {
            Ok(()) => reply.ok(),
            Err(errno) => reply.error(errno),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.shared.child(parent, name).and_then(|(path, _)| fs::remove_dir(path).map_err(Errno::from)) {
            Ok(()) => reply.ok(),
            Err(errno) => reply.error(errno),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        match self.rename_inner(parent, name, newparent, newname, flags) {
            Ok(()) => reply.ok(),
            Err(errno) => reply.error(errno),
        }
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let attr = self.shared.path(ino).and_then(|from| {
            let (to, relative) = self.shared.child(newparent, newname)?;
            fs::hard_link(from, &to).map_err(Errno::from)?;
            // The newest name: a file linked in and its old name removed (RocksDB's ingestion)
            // is found by it.
            self.shared.remember(&to, relative)
        });
        self.reply_entry(reply, attr);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let opened = self.shared.path(ino).and_then(|path| {
            let meta = fs::metadata(&path).map_err(Errno::from)?;
            if !meta.is_file() {
                return Err(Errno::EINVAL);
            }
            open_backing(&path, flags.0, None).map_err(Errno::from)
        });
        match opened {
            Ok(file) => reply.opened(self.shared.open_handle(ino.0, file), FopenFlags::empty()),
            Err(errno) => reply.error(errno),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let created = self.shared.child(parent, name).and_then(|(path, relative)| {
            let existed = fs::symlink_metadata(&path).is_ok();
            let file = open_backing(&path, flags | libc::O_CREAT, Some(mode & !umask & 0o7777)).map_err(Errno::from)?;
            let meta = file.metadata().map_err(Errno::from)?;
            let ino = self.shared.ino(meta.ino());
            let mut state = self.shared.lock();
            if !existed {
                // A new file: whatever an earlier file of the same inode number left is not its.
                state.overlays.remove(&ino);
            }
            state.paths.insert(ino, relative);
            drop(state);
            let attr = self.shared.attr(&meta);
            Ok((attr, self.shared.open_handle(ino, file)))
        });
        match created {
            Ok((attr, fh)) => reply.created(&TTL, &attr, Generation(0), fh, FopenFlags::empty()),
            Err(errno) => reply.error(errno),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let data = self.shared.handle(fh).and_then(|(_, file)| {
            let overlay = self.shared.overlay(ino.0);
            let overlay = lock(&overlay);
            overlay.read(&file, offset, size).map_err(Errno::from)
        });
        match data {
            Ok(data) => reply.data(&data),
            Err(errno) => reply.error(errno),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let Ok(len) = u32::try_from(data.len()) else { return reply.error(Errno::EINVAL) };
        if self.shared.handle(fh).is_err() {
            return reply.error(Errno::EBADF);
        }
        if offset.checked_add(data.len() as u64).is_none_or(|end| end > i64::MAX as u64) {
            return reply.error(Errno::EFBIG);
        }
        lock(&self.shared.overlay(ino.0)).write(offset, data);
        reply.written(len);
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        // A close makes nothing durable.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let handle = self.shared.lock().handles.remove(&fh.0);
        if let Some(handle) = handle {
            if let Ok(meta) = handle.file.metadata() {
                self.shared.forget_if_gone(handle.ino, meta.nlink());
            }
        }
        reply.ok();
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        match self.sync(ino, fh, datasync) {
            Ok(()) => reply.ok(),
            Err(errno) => reply.error(errno),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        match self.readdir_inner(ino, offset, &mut reply) {
            Ok(()) => reply.ok(),
            Err(errno) => reply.error(errno),
        }
    }

    fn fsyncdir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        // Names and sizes reach the backing directory as they change; a power cut keeps them.
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let Ok(c) = c_path(&self.shared.backing) else { return reply.error(Errno::EINVAL) };
        // SAFETY: statvfs fills the zeroed struct for a valid C string.
        let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
        if let Err(errno) = check(unsafe { libc::statvfs(c.as_ptr(), &mut stat) }) {
            return reply.error(errno);
        }
        reply.statfs(
            stat.f_blocks,
            stat.f_bfree,
            stat.f_bavail,
            stat.f_files,
            stat.f_ffree,
            stat.f_bsize as u32,
            stat.f_namemax as u32,
            stat.f_frsize as u32,
        );
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let result = self.shared.handle(fh).and_then(|(_, file)| {
            let (Ok(at), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(length)) else {
                return Err(Errno::EINVAL);
            };
            let overlay = self.shared.overlay(ino.0);
            let mut overlay = lock(&overlay);
            // SAFETY: fallocate on an open descriptor.
            check(unsafe { libc::fallocate(file.as_raw_fd(), mode, at, len) })?;
            if mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0 {
                // The range reads as zeros now, pending writes in it included.
                overlay.discard_range(offset, offset.saturating_add(length));
            }
            Ok(())
        });
        match result {
            Ok(()) => reply.ok(),
            Err(errno) => reply.error(errno),
        }
    }
}
