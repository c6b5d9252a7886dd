//! `statestore`: one node of the replicated state store.

use anyhow::Context;
use clap::Parser;
use statestore_node::config::DEFAULT_LOG_FILTER;
use statestore_node::restore_check::OldClusterRunning;
use statestore_node::server::{self, EXIT_CONFIG, EXIT_DAMAGED_STORAGE, EXIT_STORAGE_FAILED};
use statestore_node::{Args, NodeConfig};
use tracing_subscriber::EnvFilter;

/// Rust allocations of the node go to mimalloc rather than glibc's malloc: a node allocates and
/// frees several small buffers per request (packets, requests, log entries, replies), and with
/// glibc that was about a fifth of its CPU. Measured side by side (docs/benchmarks.md): about 5%
/// less CPU per request, resident memory after a 1 M-key fill unchanged. RocksDB's own memory is
/// allocated by its C++ code, outside this allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Asks the kernel not to back this process's memory with transparent huge pages. mimalloc asks
/// for them on its regions (`MADV_HUGEPAGE`), so the first touch of any byte in a fresh 2 MiB
/// region made the kernel zero all of it: a node that starts, or a leader that starts sending a
/// snapshot, spent tens of milliseconds of CPU zeroing pages at once, and the requests of that
/// moment waited behind it on a small machine (docs/benchmarks.md, *Membership changes keep the
/// leader's streams; the join stall: transparent huge pages*). With 4 KiB pages only the pages
/// touched are zeroed, when they are touched. Failing to ask changes nothing else.
fn without_transparent_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE only sets a flag of the calling process; no memory is passed.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

fn main() -> anyhow::Result<()> {
    without_transparent_huge_pages();
    let config = match NodeConfig::from_args(Args::parse()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("statestore: {e}");
            std::process::exit(EXIT_CONFIG);
        }
    };
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = config.worker_threads {
        runtime.worker_threads(threads);
    }
    let runtime = runtime.enable_all().build().context("starting the async runtime")?;
    // The node runs as a task on the workers, not on this thread: a future driven by `block_on`
    // is woken through a futex, and the node's watchers of Raft's metrics are woken on every
    // change of them, thousands of times a second under load.
    let data_dir = config.data_dir.clone();
    let node = runtime.spawn(serve(config));
    let result = match runtime.block_on(node) {
        Ok(result) => result,
        Err(stopped) if stopped.is_panic() => std::panic::resume_unwind(stopped.into_panic()),
        Err(stopped) => Err(stopped).context("the node's task was cancelled"),
    };
    // The tasks that still hold the storage end with the runtime, so RocksDB closes and joins its
    // background threads before the process exits: exiting with them still running let them lock
    // a mutex the exit had already destroyed (an abort instead of the exit code below).
    runtime.shutdown_timeout(RUNTIME_STOP);
    if let Err(e) = &result {
        if e.chain().any(|cause| cause.is::<OldClusterRunning>()) {
            eprintln!("statestore: {e:#}");
            std::process::exit(EXIT_CONFIG);
        }
        if server::is_damaged_storage(e) {
            eprintln!(
                "statestore: the storage in {} is damaged: {e:#}\n\
                 The node will not run on it. Move the data directory aside and add the node back as a \
                 new member (docs/operations.md, \"Damaged storage\").",
                data_dir.display()
            );
            std::process::exit(EXIT_DAMAGED_STORAGE);
        }
        if server::is_full_disk(e) {
            eprintln!(
                "statestore: the disk under {} is full: {e:#}\n\
                 The node cannot write what it must keep, so it stops rather than go on without it. Free \
                 space on that disk (or move the data directory to a larger one) and start the node again \
                 (docs/operations.md, \"A disk that fails\").",
                data_dir.display()
            );
            std::process::exit(EXIT_STORAGE_FAILED);
        }
        if server::is_failed_storage(e) {
            eprintln!(
                "statestore: the disk under {} failed: {e:#}\n\
                 What the node wrote since its last good flush may not be on the disk, so it stops \
                 rather than count it. Check the disk (its free space, the kernel log) before starting the node again \
                 (docs/operations.md, \"A disk that fails\").",
                data_dir.display()
            );
            std::process::exit(EXIT_STORAGE_FAILED);
        }
    }
    result
}

/// How long the runtime's remaining tasks get to end once the node has stopped.
const RUNTIME_STOP: std::time::Duration = std::time::Duration::from_secs(5);

async fn serve(config: NodeConfig) -> anyhow::Result<()> {
    let filter = EnvFilter::try_new(&config.log).unwrap_or_else(|_| EnvFilter::new(DEFAULT_LOG_FILTER));
    statestore_node::logs::init(filter, config.log_json);
    let result = server::run(config, server::signal()).await;
    if let Err(e) = &result {
        if server::is_damaged_storage(e) {
            tracing::error!(error = format!("{e:#}"), "damaged storage");
        }
    }
    result
}
