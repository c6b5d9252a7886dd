//! A disk that stalls or fails, injected for real: a node runs with a small library preloaded
//! (`LD_PRELOAD`) whose `fsync` and `fdatasync` wait while one given file exists and fail with
//! `EIO` (as a disk that lost a write makes them fail) while another exists; otherwise they call
//! the C library's own. Everything else the node does with its disk goes through untouched.

use std::path::{Path, PathBuf};
use std::process::Command;

const SOURCE: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
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

/// The environment that makes a node's fsyncs wait while `stall` exists and fail while `fail`
/// exists.
pub fn faulty_disk_env(library: &Path, stall: &Path, fail: &Path) -> Vec<(String, String)> {
    vec![
        ("LD_PRELOAD".into(), library.display().to_string()),
        ("STATESTORE_TEST_STALL_FSYNC_WHILE".into(), stall.display().to_string()),
        ("STATESTORE_TEST_FAIL_FSYNC_WHILE".into(), fail.display().to_string()),
    ]
}
