//! Proposal throughput and latency on a 3-node cluster on loopback: real HTTP between nodes,
//! real RocksDB with fsync, 1, 16 and 64 concurrent proposers calling the leader's entry point.
//!
//! `cargo bench -p statestore-benches --bench proposals` (STATESTORE_BENCH_SECS per level,
//! default 5). Without `--bench` (as under `cargo test --benches`) it runs a short smoke pass.

use std::sync::Arc;
use std::time::{Duration, Instant};

use statestore_benches::{free_port, percentile_ms};
use statestore_node::config::parse_members;
use statestore_node::server::{self, RunningNode};
use statestore_node::{Node, NodeConfig};
use statestore_protocol::{Hlc, Request, Response, Set};
use statestore_statemachine::ClientRequest;

fn config(id: u64, port: u16, members: &str, dir: &std::path::Path) -> NodeConfig {
    NodeConfig {
        id,
        listen: format!("127.0.0.1:{port}").parse().unwrap(),
        advertise: format!("http://127.0.0.1:{port}"),
        data_dir: dir.join(format!("node-{id}")),
        initial_members: parse_members(members).unwrap(),
        peer_routes: Default::default(),
        cluster_secret: None,
        tls: None,
        heartbeat: Duration::from_millis(50),
        restored: false,
        max_clock_offset: Duration::from_millis(statestore_node::config::DEFAULT_MAX_CLOCK_OFFSET_MS),
        max_log_fsync: Duration::from_millis(statestore_node::config::DEFAULT_MAX_LOG_FSYNC_MS),
        election_min: Duration::from_millis(150),
        election_max: Duration::from_millis(300),
        snapshot_every: 10_000,
        snapshot_log_bytes: statestore_node::config::DEFAULT_SNAPSHOT_LOG_BYTES,
        snapshot_write_rate: None,
        snapshot_install_rate: None,
        flush_after: statestore_node::config::DEFAULT_FLUSH_AFTER,
        logs_kept: 1_000,
        max_http_commands: 1024,
        http_limits: statestore_node::config::HttpLimits::DEFAULT,
        log: "warn".into(),
        log_json: false,
        worker_threads: None,
        broker: None,
    }
}

async fn start_cluster(dir: &std::path::Path) -> Vec<RunningNode> {
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let members = ports.iter().enumerate().map(|(i, p)| format!("{}=http://127.0.0.1:{p}", i + 1)).collect::<Vec<_>>();
    let members = members.join(",");
    let mut nodes = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        nodes.push(server::start(&config(i as u64 + 1, *port, &members, dir)).await.unwrap());
    }
    nodes
}

async fn leader(nodes: &[RunningNode]) -> Arc<Node> {
    loop {
        for running in nodes {
            if running.node.ensure_linearizable().await.is_ok() {
                return running.node.clone();
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn set(key: String) -> ClientRequest {
    let command = Set::new(key, vec![b'v'; 64]);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let request = Request {
        command: statestore_protocol::Command::Set(command),
        timestamp: Some(Hlc::new(now, 0, "bench")),
        fencing_token: None,
    };
    ClientRequest { request, client_id: None, identity: None, message_expiry_secs: None }
}

struct Level {
    proposers: usize,
    ops: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

async fn run_level(leader: Arc<Node>, proposers: usize, duration: Duration) -> Level {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for proposer in 0..proposers {
        let leader = leader.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut i = 0;
            while started.elapsed() < duration {
                let sent = Instant::now();
                let reply = leader.execute(set(format!("p{proposers}-{proposer}-{i}"))).await.expect("proposal");
                assert_eq!(reply.response, Response::Ok);
                latencies.push(sent.elapsed());
                i += 1;
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.unwrap());
    }
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    Level { proposers, ops: latencies.len(), elapsed, latencies }
}

fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    let seconds: f64 = std::env::var("STATESTORE_BENCH_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(5.0);
    let duration = if benching { Duration::from_secs_f64(seconds) } else { Duration::from_millis(300) };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let nodes = start_cluster(dir.path()).await;
        let leader = leader(&nodes).await;
        // Warm up connections and RocksDB.
        run_level(leader.clone(), 4, duration / 5).await;
        let mut levels = Vec::new();
        for proposers in [1, 16, 64] {
            levels.push(run_level(leader.clone(), proposers, duration).await);
        }
        let base = levels[0].ops as f64 / levels[0].elapsed.as_secs_f64();
        println!("proposers  proposals/s  vs 1 proposer  p50 ms  p99 ms");
        for level in &levels {
            let rate = level.ops as f64 / level.elapsed.as_secs_f64();
            println!(
                "{:>9}  {:>11.0}  {:>12.1}x  {:>6.2}  {:>6.2}",
                level.proposers,
                rate,
                rate / base,
                percentile_ms(&level.latencies, 0.5),
                percentile_ms(&level.latencies, 0.99)
            );
        }
        for running in nodes {
            running.stop().await.unwrap();
        }
    });
}
