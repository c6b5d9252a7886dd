//! What a node's state-machine store costs per request as it grows: a fill of distinct keys
//! applied to a real RocksDB as a node applies committed entries (the state machine, its
//! reads, one write batch per entry, the dedup record of every request), flushed as a node
//! flushes (`--flush-after-operations`), with RocksDB's own flushes and compactions in the
//! background, and snapshots built, beside the applying, when a node's policy would build them
//! (its default `--snapshot-every` and `--snapshot-log-bytes`, counting each entry's bytes as
//! the log encodes it). The CPU of the whole process per request, and the wall time spent
//! applying it, of every step, printed as it goes and as a table at the end.
//!
//! No broker, network, Raft or load generator shares the machine with it, so runs compare far
//! more steadily than those of `compare fill`: the CPU of a whole fill moves by a few percent
//! between runs, a single step's by more (a compaction or a snapshot falls in one step or the
//! next).
//!
//! Run: `cargo bench -p statestore-benches --bench growth -- [--to 1000000] [--step 100000]
//! [--per-entry 20] [--rate 7000] [--speedup 1] [--flush-after-operations 20000]
//! [--no-snapshots]`. `--flush-after-operations`: the node's flush bound (its entries' bound
//! scaled with it). `--rate`: requests per second of replicated time, which sets how many dedup
//! records are retained (each lives its message expiry, 10 s, plus 60 s); the fill is paced at
//! `--rate` × `--speedup` requests per second of wall time, so RocksDB's flushes and compactions
//! keep up as they do in a node (unpaced, they fall behind and pile up files a node never has).
//! After the fill the process waits until RocksDB's background work has ended (at most two
//! minutes, saying so when it has not), and counts its CPU too.

use std::time::{Duration, Instant};

use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use statestore_node::config::{FlushAfter, DEFAULT_FLUSH_AFTER, DEFAULT_SNAPSHOT_EVERY, DEFAULT_SNAPSHOT_LOG_BYTES};
use statestore_node::node::SnapshotThresholds;
use statestore_protocol::{Command, Request, Set, SetCondition};
use statestore_raft::types::RaftStorageError;
use statestore_statemachine::{ClientRequest, Entry, Operation, Proposal, RequestIdentity};

/// As in the node: Rust's allocations go to mimalloc (RocksDB's to the system allocator).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const T0: u64 = 1_795_306_435_000;
const VALUE_BYTES: usize = 256;

struct Options {
    to: u64,
    step: u64,
    per_entry: u64,
    rate: u64,
    speedup: u64,
    /// Operations applied between flushes of the applied state (a node's
    /// `--flush-after-operations`).
    flush_after_operations: u64,
    snapshots: bool,
}

impl Options {
    fn from_args() -> Options {
        let mut options = Options {
            to: 1_000_000,
            step: 100_000,
            per_entry: 20,
            rate: 7_000,
            speedup: 1,
            flush_after_operations: DEFAULT_FLUSH_AFTER.operations,
            snapshots: true,
        };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            if arg == "--no-snapshots" {
                options.snapshots = false;
                continue;
            }
            let field = match arg.as_str() {
                "--to" => &mut options.to,
                "--step" => &mut options.step,
                "--per-entry" => &mut options.per_entry,
                "--rate" => &mut options.rate,
                "--speedup" => &mut options.speedup,
                "--flush-after-operations" => &mut options.flush_after_operations,
                // cargo bench passes `--bench`; criterion's other flags mean nothing here.
                _ => continue,
            };
            let value = args.next().unwrap_or_else(|| panic!("{arg} needs a number"));
            *field = value.parse().unwrap_or_else(|_| panic!("{arg} {value}: not a number"));
            assert!(*field > 0, "{arg} must be above 0");
        }
        options
    }
}

/// One committed log entry of `options.per_entry` SETs of new keys, from `first_key` on, each a
/// new request of its own client, at the replicated time `options.rate` gives the first key.
fn log_entry(
    index: u64,
    first_key: u64,
    options: &Options,
    rng: &mut fastrand::Rng,
) -> statestore_raft::types::LogEntry {
    let wall_clock_ms = T0 + first_key * 1_000 / options.rate;
    let entries = (first_key..first_key + options.per_entry)
        .map(|key| {
            let mut value = vec![0; VALUE_BYTES];
            rng.fill(&mut value);
            let command = Command::Set(Set {
                key: format!("fill/{key:09}").into_bytes(),
                value,
                condition: SetCondition::Always,
                expiry_ms: None,
            });
            let client = key % 64;
            Entry {
                operation: Operation::Request(ClientRequest {
                    request: Request { command, timestamp: None, fencing_token: None },
                    client_id: Some(format!("bench-{client}")),
                    identity: Some(RequestIdentity {
                        response_topic: format!("clients/bench-{client}/services/statestore/response"),
                        correlation_data: rng.u128(..).to_be_bytes().to_vec(),
                    }),
                    message_expiry_secs: Some(10),
                }),
                wall_clock_ms,
            }
        })
        .collect();
    openraft::Entry {
        log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
        payload: openraft::EntryPayload::Normal(std::sync::Arc::new(Proposal { entries })),
    }
}

/// CPU seconds this process has used, all its threads together.
fn process_cpu_secs() -> f64 {
    statestore_benches::cpu_seconds(std::process::id()).expect("/proc/self/stat is readable")
}

/// How long the fill waits, after its last write, for RocksDB's background work to end.
const SETTLE_WITHIN: Duration = Duration::from_secs(120);

/// Prints a snapshot build that ended, `took` long, with the size of what it wrote.
fn report_build(took: Duration, reader: &statestore_raft::StateReader) {
    let mib = reader.log_bytes().snapshot_size() as f64 / (1 << 20) as f64;
    println!("  snapshot built in {:.2} s: {mib:.1} MiB", took.as_secs_f64());
}

struct Step {
    keys: u64,
    /// Wall time applying and flushing (not paced), per request.
    busy_us_per_request: f64,
    cpu_us_per_request: f64,
}

fn main() {
    let options = Options::from_args();
    // The entries' threshold scaled with the operations', so that the operations' decides.
    let flush_after = FlushAfter {
        operations: options.flush_after_operations,
        entries: DEFAULT_FLUSH_AFTER.entries * options.flush_after_operations / DEFAULT_FLUSH_AFTER.operations,
    };
    // Apply runs on this thread (`block_on`); a snapshot build is a task on the one worker.
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let metrics = statestore_raft::metrics::StorageMetrics::register(&prometheus::Registry::new()).unwrap();
    let mut node = statestore_raft::open(dir.path(), statestore_statemachine::Config::default(), metrics).unwrap();
    let mut rng = fastrand::Rng::with_seed(7);
    println!(
        "growth: {} keys in steps of {}, {} SETs of {VALUE_BYTES} B per entry, {} requests/s of replicated time, paced at {} a second",
        options.to,
        options.step,
        options.per_entry,
        options.rate,
        options.rate * options.speedup
    );
    let (fill_started, fill_cpu) = (Instant::now(), process_cpu_secs());
    let thresholds = SnapshotThresholds::for_node(3, DEFAULT_SNAPSHOT_EVERY, DEFAULT_SNAPSHOT_LOG_BYTES);
    let mut since_snapshot = (0, 0);
    let mut building: Option<tokio::task::JoinHandle<Result<Duration, RaftStorageError>>> = None;
    let mut snapshots_built = 0;
    let pace = Duration::from_secs(1)
        / u32::try_from(options.rate * options.speedup).expect("--rate × --speedup fits 32 bits");
    let mut steps = Vec::new();
    let (mut index, mut keys) = (0, 0);
    while keys < options.to {
        let (mut busy, cpu_before, keys_before) = (Duration::ZERO, process_cpu_secs(), keys);
        while keys < (keys_before + options.step).min(options.to) {
            index += 1;
            let entry = log_entry(index, keys, &options, &mut rng);
            since_snapshot.0 += 1;
            since_snapshot.1 += statestore_raft::wire::encode(&entry).unwrap().len() as u64;
            keys += options.per_entry;
            let applying = Instant::now();
            runtime.block_on(node.state.apply([entry])).unwrap();
            let unflushed = node.reader.unflushed();
            if unflushed.entries >= flush_after.entries || unflushed.operations >= flush_after.operations {
                node.reader.flush_applied().unwrap();
            }
            busy += applying.elapsed();
            if building.as_ref().is_some_and(|build| build.is_finished()) {
                report_build(runtime.block_on(building.take().unwrap()).unwrap().unwrap(), &node.reader);
                snapshots_built += 1;
            }
            let snapshot_size = node.reader.log_bytes().snapshot_size();
            if options.snapshots
                && building.is_none()
                && thresholds.due(since_snapshot.0, since_snapshot.1, snapshot_size)
            {
                println!(
                    "  snapshot at {keys} keys: {:.1} MiB logged since the last, which had {:.1} MiB",
                    since_snapshot.1 as f64 / (1 << 20) as f64,
                    snapshot_size as f64 / (1 << 20) as f64
                );
                since_snapshot = (0, 0);
                let mut builder = runtime.block_on(node.state.get_snapshot_builder());
                building = Some(runtime.spawn(async move {
                    let started = Instant::now();
                    builder.build_snapshot().await.map(|_| started.elapsed())
                }));
            }
            let due = pace * u32::try_from(keys).expect("--to fits 32 bits");
            if let Some(ahead) = due.checked_sub(fill_started.elapsed()) {
                std::thread::sleep(ahead);
            }
        }
        let requests = (keys - keys_before) as f64;
        let step = Step {
            keys,
            busy_us_per_request: busy.as_secs_f64() * 1e6 / requests,
            cpu_us_per_request: (process_cpu_secs() - cpu_before) * 1e6 / requests,
        };
        println!(
            "  {:>9} keys: {:>6.1} µs of CPU per request, {:>6.1} µs applying it",
            step.keys, step.cpu_us_per_request, step.busy_us_per_request
        );
        steps.push(step);
    }
    if let Some(build) = building {
        report_build(runtime.block_on(build).unwrap().unwrap(), &node.reader);
        snapshots_built += 1;
    }
    let filled_cpu = process_cpu_secs() - fill_cpu;
    // RocksDB's flushes and compactions still running: until a second passes with (almost) no
    // CPU, or SETTLE_WITHIN.
    let (settle_started, cpu_at_last_write) = (Instant::now(), process_cpu_secs());
    loop {
        let before = process_cpu_secs();
        std::thread::sleep(Duration::from_secs(1));
        if process_cpu_secs() - before < 0.02 {
            break;
        }
        if settle_started.elapsed() >= SETTLE_WITHIN {
            println!(
                "background work still running {} s after the last write; counted up to now",
                SETTLE_WITHIN.as_secs()
            );
            break;
        }
    }
    let settle_cpu = process_cpu_secs() - cpu_at_last_write;
    let (first, last) = (steps.first().unwrap(), steps.last().unwrap());
    println!("| keys | CPU µs per request | µs applying it |");
    println!("|---|---|---|");
    for step in &steps {
        println!("| {} | {:.1} | {:.1} |", step.keys, step.cpu_us_per_request, step.busy_us_per_request);
    }
    println!(
        "last step / first: CPU per request {:.2}, time applying {:.2}",
        last.cpu_us_per_request / first.cpu_us_per_request,
        last.busy_us_per_request / first.busy_us_per_request
    );
    println!("snapshots built: {snapshots_built}");
    println!(
        "whole fill: {:.1} µs of CPU per request, {:.1} with the background work still running after it ({:.2} s)",
        filled_cpu * 1e6 / keys as f64,
        (filled_cpu + settle_cpu) * 1e6 / keys as f64,
        settle_cpu
    );
}
