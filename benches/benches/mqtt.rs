//! The product end to end: the official Rust SDK against a 3-node cluster (in this process)
//! behind a real Mosquitto on loopback, fsync on.
//!
//! - SET throughput and latency with 1 and with 32 concurrent SDK clients (each one call at a
//!   time), reported side by side as a ratio;
//! - expiry notification latency: an observed key is set with `PX 300`; the time from the SET's
//!   send + 300 ms to the arrival of its `DELETE` notification (an upper bound of the lag behind
//!   the deadline, which apply starts between send and answer).
//!
//! `cargo bench --bench mqtt` runs each level for STATESTORE_BENCH_SECS (default 5) seconds;
//! without `--bench` (as `cargo test` runs it) it is a short smoke run.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use azure_iot_operations_mqtt::aio::connection_settings::MqttConnectionSettingsBuilder;
use azure_iot_operations_mqtt::session::{Session, SessionExitHandle, SessionOptionsBuilder};
use azure_iot_operations_protocol::application::ApplicationContextBuilder;
use azure_iot_operations_services::state_store::{self, Operation, SetOptions};
use statestore_benches::{free_port, percentile_ms};
use statestore_node::config::{parse_members, BrokerConfig, NodeConfig};
use statestore_node::server::{self, RunningNode};

const TIMEOUT: Duration = Duration::from_secs(10);

struct Mosquitto(Child);

impl Drop for Mosquitto {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_mosquitto(dir: &std::path::Path, port: u16) -> Mosquitto {
    let config = dir.join("mosquitto.conf");
    let shipped = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../cluster/mosquitto.conf")).unwrap();
    let config_text: String = shipped
        .lines()
        .map(|line| match line.split_whitespace().next() {
            Some("listener") => format!("listener {port} 127.0.0.1"),
            Some("persistence") => "persistence false".to_string(),
            Some("persistence_location") | Some("autosave_interval") => String::new(),
            _ => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&config, config_text).unwrap();
    let binary = ["/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("mosquitto"));
    let child = Command::new(binary)
        .arg("-c")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("mosquitto (apt-get install -y mosquitto)");
    let started = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(started.elapsed() < Duration::from_secs(10), "mosquitto did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Mosquitto(child)
}

async fn start_cluster(dir: &std::path::Path, mqtt_port: u16) -> Vec<RunningNode> {
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let members = ports.iter().enumerate().map(|(i, p)| format!("{}=http://127.0.0.1:{p}", i + 1)).collect::<Vec<_>>();
    let members = members.join(",");
    let mut nodes = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let id = i as u64 + 1;
        let config = NodeConfig {
            id,
            listen: format!("127.0.0.1:{port}").parse().unwrap(),
            advertise: format!("http://127.0.0.1:{port}"),
            data_dir: dir.join(format!("node-{id}")),
            initial_members: parse_members(&members).unwrap(),
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
            broker: Some(BrokerConfig {
                host: "127.0.0.1".into(),
                port: mqtt_port,
                client_id: format!("statestore-bench-{id}"),
                tls: None,
                username: None,
                password: None,
                session_expiry: Duration::from_secs(60),
                keep_alive: Duration::from_secs(10),
                inflight: 1000,
                client_inflight: 500,
                max_packet_size: 16 << 20,
                follower_qos: 0,
                round_trip_bound: Duration::from_secs(2),
                access: None,
                response_topics: Default::default(),
            }),
        };
        nodes.push(server::start(&config).await.unwrap());
    }
    nodes
}

struct Client {
    store: Arc<state_store::Client>,
    exit: SessionExitHandle,
}

async fn connect(port: u16, id: &str) -> Client {
    let settings = MqttConnectionSettingsBuilder::default()
        .client_id(id)
        .hostname("127.0.0.1")
        .tcp_port(port)
        .use_tls(false)
        .clean_start(true)
        .build()
        .unwrap();
    let session =
        Session::new(SessionOptionsBuilder::default().connection_settings(settings).build().unwrap()).unwrap();
    let client = session.create_managed_client();
    let monitor = session.create_session_monitor();
    let exit = session.create_exit_handle();
    let context = ApplicationContextBuilder::default().build().unwrap();
    tokio::spawn(session.run());
    monitor.connected().await;
    let options = state_store::ClientOptionsBuilder::default().build().unwrap();
    let store = Arc::new(state_store::Client::new(context, client, monitor, options).unwrap());
    Client { store, exit }
}

async fn set_level(clients: &[Client], duration: Duration) -> (f64, Vec<Duration>) {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (c, client) in clients.iter().enumerate() {
        let store = client.store.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut i = 0;
            while started.elapsed() < duration {
                let sent = Instant::now();
                let key = format!("bench-{c}-{i}").into_bytes();
                let reply = store.set(key, vec![b'v'; 64], TIMEOUT, None, SetOptions::default()).await.expect("SET");
                assert!(reply.response);
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
    let rate = latencies.len() as f64 / started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    (rate, latencies)
}

async fn expiry_lags(client: &Client, trials: usize) -> Vec<Duration> {
    let mut lags = Vec::new();
    for trial in 0..trials {
        let key = format!("expiring-{trial}").into_bytes();
        let mut observation = client.store.observe(key.clone(), TIMEOUT).await.expect("observe").response;
        let options = SetOptions { expires: Some(Duration::from_millis(300)), ..SetOptions::default() };
        let sent = Instant::now();
        client.store.set(key.clone(), b"v".to_vec(), TIMEOUT, None, options).await.expect("SET PX");
        loop {
            let (notification, _) = tokio::time::timeout(Duration::from_secs(5), observation.recv_notification())
                .await
                .expect("a DELETE notification within 5 s")
                .expect("the observation is open");
            if matches!(notification.operation, Operation::Del) {
                lags.push(sent.elapsed().saturating_sub(Duration::from_millis(300)));
                break;
            }
        }
        client.store.unobserve(key, TIMEOUT).await.expect("unobserve");
    }
    lags.sort_unstable();
    lags
}

fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    let seconds: f64 = std::env::var("STATESTORE_BENCH_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(5.0);
    let duration = if benching { Duration::from_secs_f64(seconds) } else { Duration::from_millis(300) };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let mqtt_port = free_port();
        let _mosquitto = start_mosquitto(dir.path(), mqtt_port);
        let nodes = start_cluster(dir.path(), mqtt_port).await;
        for running in &nodes {
            while running.node.raft.current_leader().await.is_none() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let mut clients = Vec::new();
        for c in 0..32 {
            clients.push(connect(mqtt_port, &format!("bench-client-{c}")).await);
        }
        set_level(&clients[..4], duration / 5).await; // warm-up
        let (one, one_latencies) = set_level(&clients[..1], duration).await;
        let (many, many_latencies) = set_level(&clients, duration).await;
        println!("SDK clients  SET/s    vs 1 client  p50 ms  p99 ms");
        println!(
            "{:>11}  {:>7.0}  {:>10.1}x  {:>6.2}  {:>6.2}",
            1,
            one,
            1.0,
            percentile_ms(&one_latencies, 0.5),
            percentile_ms(&one_latencies, 0.99)
        );
        println!(
            "{:>11}  {:>7.0}  {:>10.1}x  {:>6.2}  {:>6.2}",
            32,
            many,
            many / one,
            percentile_ms(&many_latencies, 0.5),
            percentile_ms(&many_latencies, 0.99)
        );
        let trials = if benching { 40 } else { 2 };
        let lags = expiry_lags(&clients[0], trials).await;
        println!(
            "expiry DELETE notification after the deadline ({} trials): p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
            lags.len(),
            percentile_ms(&lags, 0.5),
            percentile_ms(&lags, 0.99),
            percentile_ms(&lags, 1.0)
        );
        for client in clients {
            let _ = client.exit.try_exit();
        }
        for running in nodes {
            running.stop().await.unwrap();
        }
    });
}
