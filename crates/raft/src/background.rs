//! Work a node does beside serving requests (building or installing a snapshot, writing a log
//! segment ahead of need): at the lowest priorities, its writes reaching the disk a step at a
//! time instead of as one large burst of dirty pages.

use std::fs;
use std::io;

/// Lowers the calling thread's CPU (nice 19) and I/O (best effort, level 7) priority. On Linux
/// both are per thread. Failing to lower them changes nothing else.
pub(crate) fn lower_priority() {
    const IOPRIO_WHO_PROCESS: libc::c_long = 1;
    const IOPRIO_BEST_EFFORT_LOWEST: libc::c_long = (2 << 13) | 7;
    // SAFETY: both calls only change the scheduling attributes of the calling thread (its tid).
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
        libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, tid as libc::c_long, IOPRIO_BEST_EFFORT_LOWEST);
    }
}

/// Writes out the dirty pages of `file` in `len` bytes from `from` (to its end if `len` is 0)
/// and waits for them, committing nothing to the file system's journal (`sync_file_range`); on
/// a file system without it, syncs the file's data instead.
pub fn write_out(file: &fs::File, from: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE | libc::SYNC_FILE_RANGE_WRITE | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: the descriptor is open for as long as `file` is; no memory is passed.
    if unsafe { libc::sync_file_range(file.as_raw_fd(), from as libc::off64_t, len as libc::off64_t, flags) } != 0 {
        let error = io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::ENOSYS) && error.raw_os_error() != Some(libc::EINVAL) {
            return Err(error);
        }
        file.sync_data()?;
    }
    Ok(())
}
