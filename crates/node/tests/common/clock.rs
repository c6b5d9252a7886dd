//! A node's wall clock moved for real: libfaketime (Debian package `faketime`, installed by
//! `cluster/packages.sh --tests`) preloaded into the node process. The monotonic clock is left
//! alone, as a wall-clock jump leaves it.

use std::path::Path;

/// The multi-threaded libfaketime.
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// Panics, naming the package, when libfaketime is missing.
pub fn assert_libfaketime() {
    assert!(
        Path::new(LIBFAKETIME).exists(),
        "{LIBFAKETIME} is missing: install the Debian package faketime (cluster/packages.sh --tests)"
    );
}

/// libfaketime's settings (without `LD_PRELOAD`) for a wall clock `offset` from the true one
/// (libfaketime's form, e.g. `+30s`) for the whole run.
pub fn fixed_offset_env(offset: &str) -> Vec<(String, String)> {
    let mut env = vec![("FAKETIME".to_string(), offset.to_string())];
    env.extend(wall_clock_only());
    env
}

/// libfaketime's settings (without `LD_PRELOAD`) for a wall clock offset read from `file`
/// (libfaketime's form, e.g. `+0`, `-90s`), read again every second, so that a test moves the
/// clock of a running node by rewriting the file.
pub fn offset_file_env(file: &Path) -> Vec<(String, String)> {
    let mut env = vec![
        ("FAKETIME_TIMESTAMP_FILE".to_string(), file.display().to_string()),
        ("FAKETIME_CACHE_DURATION".to_string(), "1".to_string()),
    ];
    env.extend(wall_clock_only());
    env
}

fn wall_clock_only() -> [(String, String); 2] {
    [("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()), ("FAKETIME_DONT_RESET".into(), "1".into())]
}
