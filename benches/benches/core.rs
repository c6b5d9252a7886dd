//! Micro-benchmarks of the core: parsing requests, encoding replies, applying entries to
//! in-memory storage (where the time of one request goes before any I/O), and applying log
//! entries to a node's RocksDB as its state-machine store does.
//!
//! Run: `cargo bench -p statestore-benches --bench core`

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use statestore_protocol::{Command, Get, Hlc, Request, Response, Set, SetCondition};
use statestore_statemachine::{ClientRequest, Entry, MemStorage, Operation, RequestIdentity, StateMachine};

const T0: u64 = 1_795_306_435_000;

fn set_entry(i: u64, value_len: usize) -> Entry {
    let command = Command::Set(Set {
        key: format!("key{:06}", i % 10_000).into_bytes(),
        value: vec![b'v'; value_len],
        condition: SetCondition::Always,
        expiry_ms: i.is_multiple_of(3).then_some(60_000),
    });
    Entry {
        operation: Operation::Request(ClientRequest {
            request: Request { command, timestamp: Some(Hlc::new(T0 + i, 0, "client")), fencing_token: None },
            client_id: Some("client".into()),
            identity: Some(RequestIdentity {
                response_topic: "clients/client/services/statestore/response".into(),
                correlation_data: i.to_be_bytes().to_vec(),
            }),
            message_expiry_secs: Some(10),
        }),
        wall_clock_ms: T0 + i,
    }
}

fn protocol(c: &mut Criterion) {
    let mut group = c.benchmark_group("protocol");
    let set = Command::Set(Set::new(b"sensor/temperature/1".to_vec(), vec![b'x'; 256])).encode();
    group.throughput(Throughput::Elements(1));
    group.bench_function("parse SET 256 B", |b| b.iter(|| Command::parse(std::hint::black_box(&set)).unwrap()));
    let big = Command::Set(Set::new(b"k".to_vec(), vec![b'x'; 1 << 20])).encode();
    group.bench_function("parse SET 1 MiB", |b| b.iter(|| Command::parse(std::hint::black_box(&big)).unwrap()));
    let reply = Response::Value(vec![b'x'; 256]);
    group.bench_function("encode GET reply 256 B", |b| b.iter(|| std::hint::black_box(&reply).encode()));
    let ts = "001795306435997:00000:32b43965-5c9d-4ae8-8610-8cee895af592";
    group.bench_function("parse HLC", |b| b.iter(|| std::hint::black_box(ts).parse::<Hlc>().unwrap()));
    let hlc: Hlc = ts.parse().unwrap();
    group.bench_function("format HLC", |b| b.iter(|| std::hint::black_box(&hlc).to_string()));
    let mut text = Vec::with_capacity(64);
    group.bench_function("write HLC text", |b| {
        b.iter(|| {
            text.clear();
            std::hint::black_box(&hlc).write_text(&mut text);
        })
    });
    group.finish();
}

fn state_machine(c: &mut Criterion) {
    let machine = StateMachine::default();
    let mut group = c.benchmark_group("state machine");
    // A store with 10k keys, as a base for every measurement.
    let mut base = MemStorage::new();
    let warmup: Vec<Entry> = (0..10_000).map(|i| set_entry(i, 64)).collect();
    machine.apply_all(&mut base, &warmup).unwrap();

    for batch in [1usize, 64] {
        group.throughput(Throughput::Elements(batch as u64));
        group.bench_function(format!("apply SET, batches of {batch}"), |b| {
            let mut i = 20_000u64;
            b.iter_batched(
                || {
                    let entries: Vec<Entry> = (0..batch as u64).map(|n| set_entry(i + n, 64)).collect();
                    i += batch as u64;
                    (base.clone(), entries)
                },
                |(mut store, entries)| {
                    let applied = machine.apply_all(&mut store, &entries).unwrap();
                    // Returned, so the store is dropped outside the measurement.
                    (store, applied)
                },
                BatchSize::LargeInput,
            )
        });
    }
    group.throughput(Throughput::Elements(1));
    let get =
        Request { command: Command::Get(Get { key: b"key004242".to_vec() }), timestamp: None, fencing_token: None };
    group.bench_function("GET hit (read path)", |b| b.iter(|| machine.read(&base, &get, T0 + 20_000).unwrap()));
    let scan = Request::parse(&statestore_protocol::encode_bulk_array(&[&b"SCAN"[..], b"key00*"]), None, None).unwrap();
    group.bench_function("SCAN page of 100 keys", |b| b.iter(|| machine.read(&base, &scan, T0 + 20_000).unwrap()));
    group.finish();
}

/// A log entry at `index` with `requests` SETs of 256-byte values on random keys among 10,000,
/// each a new request, proposed at `wall_clock_ms`.
fn log_entry(
    index: u64,
    requests: u64,
    wall_clock_ms: u64,
    rng: &mut fastrand::Rng,
) -> statestore_raft::types::LogEntry {
    let entries = (0..requests)
        .map(|n| {
            let mut entry = set_entry(rng.u64(..10_000), 256);
            entry.wall_clock_ms = wall_clock_ms;
            if let Operation::Request(request) = &mut entry.operation {
                request.identity.as_mut().unwrap().correlation_data = (index * requests + n).to_be_bytes().to_vec();
                request.request.timestamp = None;
                if let Command::Set(set) = &mut request.request.command {
                    set.expiry_ms = None;
                }
            }
            entry
        })
        .collect();
    openraft::Entry {
        log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
        payload: openraft::EntryPayload::Normal(std::sync::Arc::new(statestore_statemachine::Proposal { entries })),
    }
}

/// Applying log entries on a node's RocksDB: what each node does with every committed entry
/// (the state machine, its reads of the tables, the batch written, the applied-requests feed).
fn state_store(c: &mut Criterion) {
    use openraft::storage::RaftStateMachine;
    const REQUESTS_PER_ENTRY: u64 = 16;
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let metrics = statestore_raft::metrics::StorageMetrics::register(&prometheus::Registry::new()).unwrap();
    let mut node = statestore_raft::open(dir.path(), statestore_statemachine::Config::default(), metrics).unwrap();
    let mut rng = fastrand::Rng::with_seed(7);
    let mut index = 0;
    // About 8,000 requests per second of replicated time: the dedup table holds what 70 s of
    // them (10 s message expiry and the 60 s grace) leave.
    let clock = |index: u64| T0 + index * REQUESTS_PER_ENTRY / 8;
    let mut group = c.benchmark_group("state machine on RocksDB");
    group.throughput(Throughput::Elements(REQUESTS_PER_ENTRY));
    group.bench_function("apply 16 SETs of 256 B per log entry", |b| {
        b.iter_batched(
            || {
                index += 1;
                log_entry(index, REQUESTS_PER_ENTRY, clock(index), &mut rng)
            },
            |entry| runtime.block_on(node.state.apply([entry])).unwrap(),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

/// The dedup index as a fill keeps it: 70 s of 8,000 requests per second retained. Each request
/// is looked up (a new one: not there), noted, and the earliest record forgotten, as each apply
/// does.
fn dedup_index(c: &mut Criterion) {
    const RETAINED: u64 = 560_000;
    let index = statestore_raft::dedup_retention::DedupIndex::default();
    let request_key = |n: u64| [&b"clients/client/services/statestore/response"[..], &n.to_be_bytes()].concat();
    for n in 0..RETAINED {
        index.insert(&request_key(n), T0 + n);
    }
    let mut next = RETAINED;
    let mut group = c.benchmark_group("dedup index");
    group.throughput(Throughput::Elements(1));
    group.bench_function("look up, note and forget a request, 560k retained", |b| {
        b.iter(|| {
            let key = request_key(next);
            assert!(index.retentions(&key).is_empty());
            index.insert(&key, T0 + next);
            assert_eq!(index.forget_expired(T0 + next - RETAINED, 1), 1);
            next += 1;
        })
    });
    group.finish();
}

criterion_group!(benches, protocol, state_machine, state_store, dedup_index);
criterion_main!(benches);
