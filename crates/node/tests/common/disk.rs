//! A disk that stalls, fails or fills up, injected for real: a node runs with a small library
//! preloaded (`LD_PRELOAD`) whose `fsync` and `fdatasync` wait while one given file exists and
//! fail with `EIO` (as a disk that lost a write makes them fail) while another exists, and which
//! refuses new space under the node's data directory with `ENOSPC` while a third exists, as a
//! full filesystem does: a write past the end of a file, an append, an allocation (`fallocate`)
//! fail; a write inside space the file already has (a preallocated Raft log segment) succeeds.
//! Otherwise every call goes to the C library's own.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::{Cluster, DEADLINE};

const SOURCE: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

static void wait_while_stalled(void) {
    const char *path = getenv("STATESTORE_TEST_STALL_FSYNC_WHILE");
    while (path && access(path, F_OK) == 0) {
        usleep(2000);
    }
}

static int failing(void) {
    const char *path = getenv("STATESTORE_TEST_FAIL_FSYNC_WHILE");
    return path && access(path, F_OK) == 0;
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    wait_while_stalled();
    if (failing()) {
        errno = EIO;
        return -1;
    }
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    wait_while_stalled();
    if (failing()) {
        errno = EIO;
        return -1;
    }
    return real(fd);
}

/* Whether the disk is full and `fd` is a regular file under the data directory. */
static int full_under_data_dir(int fd, struct stat *st) {
    const char *flag = getenv("STATESTORE_TEST_FULL_DISK_WHILE");
    const char *dir = getenv("STATESTORE_TEST_DATA_DIR");
    if (!flag || !dir || access(flag, F_OK) != 0) return 0;
    if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) return 0;
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return 0;
    path[n] = 0;
    return strncmp(path, dir, strlen(dir)) == 0;
}

/* Whether writing `count` bytes at `offset` of a full disk's file needs new space. */
static int needs_space(int fd, off_t offset, size_t count) {
    struct stat st;
    if (count == 0 || !full_under_data_dir(fd, &st)) return 0;
    if (offset < 0) {
        if (fcntl(fd, F_GETFL) & O_APPEND) return 1;
        offset = lseek(fd, 0, SEEK_CUR);
    }
    return offset < 0 || (off_t)(offset + count) > st.st_size;
}

static size_t iov_bytes(const struct iovec *iov, int count) {
    size_t total = 0;
    for (int i = 0; i < count; i++) total += iov[i].iov_len;
    return total;
}

#define REFUSE_IF_FULL(fd, offset, count) \
    if (needs_space(fd, offset, count)) { errno = ENOSPC; return -1; }

ssize_t write(int fd, const void *buf, size_t count) {
    static ssize_t (*real)(int, const void *, size_t);
    if (!real) real = dlsym(RTLD_NEXT, "write");
    REFUSE_IF_FULL(fd, -1, count);
    return real(fd, buf, count);
}

ssize_t writev(int fd, const struct iovec *iov, int iovcnt) {
    static ssize_t (*real)(int, const struct iovec *, int);
    if (!real) real = dlsym(RTLD_NEXT, "writev");
    REFUSE_IF_FULL(fd, -1, iov_bytes(iov, iovcnt));
    return real(fd, iov, iovcnt);
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset) {
    static ssize_t (*real)(int, const void *, size_t, off_t);
    if (!real) real = dlsym(RTLD_NEXT, "pwrite");
    REFUSE_IF_FULL(fd, offset, count);
    return real(fd, buf, count, offset);
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off_t offset) {
    static ssize_t (*real)(int, const void *, size_t, off_t);
    if (!real) real = dlsym(RTLD_NEXT, "pwrite64");
    REFUSE_IF_FULL(fd, offset, count);
    return real(fd, buf, count, offset);
}

ssize_t pwritev(int fd, const struct iovec *iov, int iovcnt, off_t offset) {
    static ssize_t (*real)(int, const struct iovec *, int, off_t);
    if (!real) real = dlsym(RTLD_NEXT, "pwritev");
    REFUSE_IF_FULL(fd, offset, iov_bytes(iov, iovcnt));
    return real(fd, iov, iovcnt, offset);
}

ssize_t pwritev64(int fd, const struct iovec *iov, int iovcnt, off_t offset) {
    static ssize_t (*real)(int, const struct iovec *, int, off_t);
    if (!real) real = dlsym(RTLD_NEXT, "pwritev64");
    REFUSE_IF_FULL(fd, offset, iov_bytes(iov, iovcnt));
    return real(fd, iov, iovcnt, offset);
}

/* An allocation needs space unless it punches a hole. */
static int allocation_refused(int fd, int mode) {
    struct stat st;
    return !(mode & FALLOC_FL_PUNCH_HOLE) && full_under_data_dir(fd, &st);
}

int fallocate(int fd, int mode, off_t offset, off_t len) {
    static int (*real)(int, int, off_t, off_t);
    if (!real) real = dlsym(RTLD_NEXT, "fallocate");
    if (allocation_refused(fd, mode)) { errno = ENOSPC; return -1; }
    return real(fd, mode, offset, len);
}

int fallocate64(int fd, int mode, off_t offset, off_t len) {
    static int (*real)(int, int, off_t, off_t);
    if (!real) real = dlsym(RTLD_NEXT, "fallocate64");
    if (allocation_refused(fd, mode)) { errno = ENOSPC; return -1; }
    return real(fd, mode, offset, len);
}

int posix_fallocate(int fd, off_t offset, off_t len) {
    static int (*real)(int, off_t, off_t);
    if (!real) real = dlsym(RTLD_NEXT, "posix_fallocate");
    if (allocation_refused(fd, 0)) return ENOSPC;
    return real(fd, offset, len);
}

int posix_fallocate64(int fd, off_t offset, off_t len) {
    static int (*real)(int, off_t, off_t);
    if (!real) real = dlsym(RTLD_NEXT, "posix_fallocate64");
    if (allocation_refused(fd, 0)) return ENOSPC;
    return real(fd, offset, len);
}
"#;

/// Builds the library into `dir` with the system's C compiler; returns its path.
pub fn faulty_disk_library(dir: &Path) -> PathBuf {
    let source = dir.join("faulty_fsync.c");
    let library = dir.join("faulty_fsync.so");
    std::fs::write(&source, SOURCE).unwrap();
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&library)
        .arg(&source)
        .arg("-ldl")
        .output()
        .expect("running cc (the C compiler cluster/packages.sh installs)");
    assert!(built.status.success(), "cc failed: {}", String::from_utf8_lossy(&built.stderr));
    library
}

/// What the preloaded library does to one node's disk, each while its file exists.
pub struct DiskFaults<'a> {
    /// `fsync` and `fdatasync` wait.
    pub stall: &'a Path,
    /// `fsync` and `fdatasync` fail with `EIO`.
    pub fail: &'a Path,
    /// Writes that need new space under `data_dir` fail with `ENOSPC`.
    pub full: &'a Path,
    pub data_dir: &'a Path,
}

/// The environment that makes a node's disk behave as `faults` say.
pub fn faulty_disk_env(library: &Path, faults: &DiskFaults) -> Vec<(String, String)> {
    // The library compares the paths of open files, which the kernel gives without symlinks.
    let parent = faults.data_dir.parent().expect("a data directory has a parent");
    let parent = parent.canonicalize().unwrap_or_else(|e| panic!("{}: {e}", parent.display()));
    let data_dir = parent.join(faults.data_dir.file_name().expect("a data directory has a name"));
    vec![
        ("LD_PRELOAD".into(), library.display().to_string()),
        ("STATESTORE_TEST_STALL_FSYNC_WHILE".into(), faults.stall.display().to_string()),
        ("STATESTORE_TEST_FAIL_FSYNC_WHILE".into(), faults.fail.display().to_string()),
        ("STATESTORE_TEST_FULL_DISK_WHILE".into(), faults.full.display().to_string()),
        // The trailing slash keeps `node-1.log` beside `node-1/` out of it.
        ("STATESTORE_TEST_DATA_DIR".into(), format!("{}/", data_dir.display())),
    ]
}

/// Where the files are that stall or fail a node's `fsync`s, or fill its disk, while they exist.
pub struct FaultyDisks {
    pub dir: PathBuf,
}

impl FaultyDisks {
    pub fn stall(&self, id: u64) -> PathBuf {
        self.dir.join(format!("stall-{id}"))
    }

    pub fn fail(&self, id: u64) -> PathBuf {
        self.dir.join(format!("fail-{id}"))
    }

    pub fn full(&self, id: u64) -> PathBuf {
        self.dir.join(format!("full-{id}"))
    }

    /// The environment that gives node `id`, whose data directory is `data_dir`, its faulty
    /// disk through `library`.
    pub fn env(&self, library: &Path, id: u64, data_dir: &Path) -> Vec<(String, String)> {
        let faults = DiskFaults { stall: &self.stall(id), fail: &self.fail(id), full: &self.full(id), data_dir };
        faulty_disk_env(library, &faults)
    }
}

/// Three nodes whose `fsync`s can be stalled or made to fail and whose disks can fill up
/// (`FaultyDisks`), started, with a leader and every member enrolled.
pub async fn cluster_with_faulty_disks(args: &[&str]) -> (Cluster, FaultyDisks, u64) {
    let mut cluster = Cluster::prepare(3, args);
    let library = faulty_disk_library(cluster.dir.path());
    let disks = FaultyDisks { dir: cluster.dir.path().to_path_buf() };
    for id in 1..=3 {
        let node = cluster.nodes.get_mut(&id).unwrap();
        node.env = disks.env(&library, id, &node.data_dir);
    }
    for id in 1..=3 {
        cluster.spawn(id);
    }
    let leader = cluster.wait_leader().await;
    cluster.wait_ready().await;
    let started = Instant::now();
    while cluster.status(leader).await.unwrap()["enrolled"].as_object().map_or(0, |enrolled| enrolled.len()) < 3 {
        assert!(started.elapsed() < DEADLINE, "every member enrolled\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    (cluster, disks, leader)
}
