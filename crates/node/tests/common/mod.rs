//! A cluster of real `statestore` processes on loopback ports, each with its own RocksDB in a
//! temporary directory, driven over HTTP.

#![allow(dead_code)]

pub mod barrage;
pub mod broker;
pub mod clock;
pub mod disk;
pub mod gate;
pub mod mqtt;
pub mod sdk;
pub mod suback_hold;
pub mod tap;

use std::collections::BTreeMap;
use std::fs::File;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use statestore_protocol::{Get, Hlc, Response, Set};
use tempfile::TempDir;

pub const DEADLINE: Duration = Duration::from_secs(30);

/// A loopback port nothing listens on. Taken below the kernel's ephemeral range (32768 and up):
/// a port the kernel hands out for `:0` is also one it hands out as the source port of outgoing
/// connections, and one of those (another test's) took such a port before a node bound it. Each
/// process starts at its own offset (by pid) and hands out each port once. Panics, naming the
/// range, once a whole pass over it found nothing to bind (instead of trying for ever).
pub fn free_port() -> u16 {
    const FIRST: u32 = 20_000;
    const COUNT: u32 = 12_000;
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let offset = std::process::id().wrapping_mul(7_919) % COUNT;
    (0..COUNT)
        .find_map(|_| {
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let port = (FIRST + (offset + n) % COUNT) as u16;
            TcpListener::bind(("127.0.0.1", port)).is_ok().then_some(port)
        })
        .unwrap_or_else(|| panic!("no loopback port free in {FIRST}..{}", FIRST + COUNT))
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// A client `__ts` for now.
pub fn timestamp() -> String {
    Hlc::new(now_ms(), 0, "test-client").to_string()
}

pub struct NodeProcess {
    pub id: u64,
    pub port: u16,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    pub child: Option<Child>,
    pub initial_members: Option<String>,
    /// Flags of this node only, after the cluster's.
    pub args: Vec<String>,
    /// Environment variables of this node only (the rest is cleared but for PATH).
    pub env: Vec<(String, String)>,
    /// `http://`, or `https://` in a cluster with TLS.
    pub scheme: &'static str,
}

impl NodeProcess {
    pub fn url(&self) -> String {
        format!("{}127.0.0.1:{}", self.scheme, self.port)
    }
}

/// What one HTTP command returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub response: Response,
    pub version: Option<String>,
}

/// Why a command did not return a reply.
#[derive(Debug)]
pub enum Refused {
    /// HTTP status and JSON body.
    Status(u16, Value),
    /// No answer at all (connection refused, timeout).
    Transport(String),
}

pub struct Cluster {
    pub dir: TempDir,
    pub nodes: BTreeMap<u64, NodeProcess>,
    pub http: reqwest::Client,
    pub extra_args: Vec<String>,
    /// `http://`, or `https://` in a cluster with TLS.
    pub scheme: &'static str,
}

impl Cluster {
    /// Starts nodes `1..=n` as the initial members of a new cluster and waits for a leader.
    pub async fn start(n: u64, extra_args: &[&str]) -> Cluster {
        let mut cluster = Cluster::prepare(n, extra_args);
        for id in 1..=n {
            cluster.spawn(id);
        }
        cluster.wait_leader().await;
        cluster
    }

    /// Nodes `1..=n` as the initial members of a new cluster, none started yet.
    pub fn prepare(n: u64, extra_args: &[&str]) -> Cluster {
        Cluster::prepare_with(n, extra_args, "http://", reqwest::Client::builder())
    }

    /// The same, reached at `scheme` URLs by a test client built from `http`.
    pub fn prepare_with(n: u64, extra_args: &[&str], scheme: &'static str, http: reqwest::ClientBuilder) -> Cluster {
        let mut cluster = Cluster {
            dir: tempfile::tempdir().unwrap(),
            nodes: BTreeMap::new(),
            http: http.timeout(Duration::from_secs(10)).build().unwrap(),
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            scheme,
        };
        let ports: Vec<u16> = (1..=n).map(|_| free_port()).collect();
        let members = (1..=n)
            .zip(&ports)
            .map(|(id, port)| format!("{id}={scheme}127.0.0.1:{port}"))
            .collect::<Vec<_>>()
            .join(",");
        for (id, port) in (1..=n).zip(ports) {
            cluster.add_process(id, port, Some(members.clone()));
        }
        cluster
    }

    /// Sends `Authorization: Bearer <secret>` with every request of [`Cluster::http`] from now on.
    pub fn authorize(&mut self, secret: &str) {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {secret}").parse().unwrap());
        self.http =
            reqwest::Client::builder().timeout(Duration::from_secs(10)).default_headers(headers).build().unwrap();
    }

    fn add_process(&mut self, id: u64, port: u16, initial_members: Option<String>) {
        let data_dir = self.dir.path().join(format!("node-{id}"));
        let log = self.dir.path().join(format!("node-{id}.log"));
        self.nodes.insert(
            id,
            NodeProcess {
                id,
                port,
                data_dir,
                log,
                child: None,
                initial_members,
                args: Vec::new(),
                env: Vec::new(),
                scheme: self.scheme,
            },
        );
    }

    /// Adds a node that is not an initial member (to join as a learner) and starts it.
    pub fn start_new_node(&mut self, id: u64) {
        self.start_new_node_with(id, &[]);
    }

    /// [`Cluster::start_new_node`] with flags of that node's own after the cluster's.
    pub fn start_new_node_with(&mut self, id: u64, args: &[&str]) {
        self.add_process(id, free_port(), None);
        self.nodes.get_mut(&id).unwrap().args = args.iter().map(|s| s.to_string()).collect();
        self.spawn(id);
    }

    /// Starts (or restarts) node `id` with its data directory as it is.
    pub fn spawn(&mut self, id: u64) {
        let extra_args = self.extra_args.clone();
        let node = self.nodes.get_mut(&id).unwrap();
        assert!(node.child.is_none(), "node {id} is running");
        let log = File::options().create(true).append(true).open(&node.log).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_statestore"));
        command
            .arg("--id")
            .arg(id.to_string())
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", node.port))
            .arg("--data-dir")
            .arg(&node.data_dir)
            .arg("--log")
            .arg("info,openraft=warn")
            .args(&extra_args)
            .args(&node.args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(node.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        if let Some(members) = &node.initial_members {
            command.arg("--initial-members").arg(members);
        }
        node.child = Some(command.spawn().unwrap());
    }

    /// SIGKILL: no chance to flush anything.
    pub fn kill(&mut self, id: u64) {
        if let Some(mut child) = self.nodes.get_mut(&id).unwrap().child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// SIGTERM, and the exit status once the node has stopped.
    pub fn terminate(&mut self, id: u64) -> ExitStatus {
        let mut child = self.nodes.get_mut(&id).unwrap().child.take().expect("running");
        let status = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status().unwrap();
        assert!(status.success());
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "node {id} did not stop after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits up to `deadline` for node `id` to exit on its own; its exit status, or `None` if it
    /// still runs.
    pub fn wait_exit(&mut self, id: u64, deadline: Duration) -> Option<ExitStatus> {
        let until = Instant::now() + deadline;
        let node = self.nodes.get_mut(&id).unwrap();
        loop {
            if let Some(status) = node.child.as_mut().expect("running").try_wait().unwrap() {
                node.child = None;
                return Some(status);
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The process id of running node `id`.
    pub fn pid(&self, id: u64) -> u32 {
        self.nodes[&id].child.as_ref().expect("running").id()
    }

    /// Sends `signal` (e.g. `STOP`, `CONT`) to node `id`'s process.
    pub fn signal(&self, id: u64, signal: &str) {
        let pid = self.pid(id);
        let status = Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).status().unwrap();
        assert!(status.success(), "kill -{signal} {pid}");
    }

    pub fn running(&self) -> Vec<u64> {
        self.nodes.values().filter(|n| n.child.is_some()).map(|n| n.id).collect()
    }

    pub fn url(&self, id: u64) -> String {
        self.nodes[&id].url()
    }

    /// `POST /cluster/learners` to node `to`, adding node `id` at its address, not yet sent.
    pub fn add_learner(&self, to: u64, id: u64) -> reqwest::RequestBuilder {
        let body = serde_json::json!({"id": id, "address": self.url(id)});
        self.http.post(format!("{}/cluster/learners", self.url(to))).json(&body)
    }

    /// `POST /cluster/members` to node `to` with `change` (`{"promote": [..], "remove": [..]}`).
    pub fn change_members(&self, to: u64, change: Value) -> reqwest::RequestBuilder {
        self.http.post(format!("{}/cluster/members", self.url(to))).json(&change)
    }

    pub async fn status(&self, id: u64) -> Option<Value> {
        let response = self.http.get(format!("{}/cluster", self.url(id))).send().await.ok()?;
        response.json().await.ok()
    }

    /// Waits until the running nodes agree on one leader among them; returns its id.
    pub async fn wait_leader(&self) -> u64 {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let mut leaders = Vec::new();
            for id in self.running() {
                if let Some(status) = self.status(id).await {
                    leaders.push(status["leader"]["id"].as_u64());
                }
            }
            if let Some(Some(leader)) = leaders.first() {
                let running = self.running();
                if leaders.iter().all(|l| *l == Some(*leader))
                    && leaders.len() == running.len()
                    && running.contains(leader)
                {
                    let status = self.status(*leader).await.unwrap();
                    if status["role"] == "leader" {
                        return *leader;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "no agreed leader among {:?}: {leaders:?}\n{}",
                self.running(),
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Waits until node `id` reports a snapshot covering `index`.
    pub async fn wait_snapshot_covering(&self, id: u64, index: u64) {
        let until = Instant::now() + DEADLINE;
        loop {
            let snapshot = self.status(id).await.and_then(|s| s["snapshot_index"].as_u64()).unwrap_or(0);
            if snapshot >= index {
                return;
            }
            assert!(Instant::now() < until, "node {id} built no snapshot covering {index}\n{}", self.logs());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until node `id` has applied at least `index`.
    pub async fn wait_applied(&self, id: u64, index: u64) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.status(id).await {
                if status["applied_index"].as_u64().unwrap_or(0) >= index {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "node {id} did not apply {index}\n{}", self.logs());
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Sends one RESP3 request to node `id`.
    pub async fn command(
        &self,
        id: u64,
        payload: Vec<u8>,
        timestamp: Option<&str>,
        query: &str,
    ) -> Result<Answer, Refused> {
        let mut request = self.http.post(format!("{}/v1/command{query}", self.url(id))).body(payload);
        if let Some(ts) = timestamp {
            request = request.header("statestore-ts", ts);
        }
        let response = request.send().await.map_err(|e| Refused::Transport(e.to_string()))?;
        let status = response.status().as_u16();
        let version = response.headers().get("statestore-ts").map(|v| v.to_str().unwrap().to_string());
        let body = response.bytes().await.map_err(|e| Refused::Transport(e.to_string()))?;
        if status != 200 {
            return Err(Refused::Status(status, serde_json::from_slice(&body).unwrap_or(Value::Null)));
        }
        Ok(Answer { response: Response::decode(&body).expect("a RESP3 reply"), version })
    }

    pub async fn set(&self, id: u64, key: &str, value: &str) -> Result<Answer, Refused> {
        self.command(id, Set::new(key, value).encode(), Some(&timestamp()), "").await
    }

    pub async fn get(&self, id: u64, key: &str) -> Result<Answer, Refused> {
        self.command(id, Get { key: key.as_bytes().to_vec() }.encode(), None, "").await
    }

    /// GET from node `id`'s own applied state.
    pub async fn get_local(&self, id: u64, key: &str) -> Result<Answer, Refused> {
        self.command(id, Get { key: key.as_bytes().to_vec() }.encode(), None, "?consistency=local").await
    }

    /// Writes on whichever node is leader, following redirects, until `deadline`.
    pub async fn set_anywhere(&self, key: &str, value: &str, deadline: Duration) -> Answer {
        let until = Instant::now() + deadline;
        let mut target = self.running()[0];
        loop {
            match self.set(target, key, value).await {
                Ok(answer) => return answer,
                Err(Refused::Status(421, body)) => {
                    if let Some(leader) = body["leader_id"].as_u64().filter(|id| self.running().contains(id)) {
                        target = leader;
                    } else {
                        target = self.next_running(target);
                    }
                }
                Err(_) => target = self.next_running(target),
            }
            assert!(Instant::now() < until, "no write succeeded within {deadline:?}\n{}", self.logs());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn next_running(&self, after: u64) -> u64 {
        let running = self.running();
        *running.iter().find(|id| **id > after).unwrap_or(&running[0])
    }

    /// Waits until every running node answers `/ready` with 200 (member, leader known, caught
    /// up, and connected to its broker when it has one).
    pub async fn wait_ready(&self) {
        let started = Instant::now();
        for id in self.running() {
            loop {
                let ready = self.http.get(format!("{}/ready", self.url(id))).send().await;
                if ready.is_ok_and(|r| r.status().is_success()) {
                    break;
                }
                assert!(started.elapsed() < DEADLINE, "node {id} is not ready\n{}", self.logs());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    /// `POST /raft/stand` to node `id`, as a stopping leader with `vote` whose log ends at
    /// `last_log_id` would ask it; the node's answer.
    #[allow(dead_code)]
    pub async fn ask_to_stand(
        &self,
        id: u64,
        vote: statestore_raft::types::Vote,
        last_log_id: Option<statestore_raft::types::LogId>,
    ) -> statestore_raft::election::StandResponse {
        use statestore_raft::wire::{decode, encode};
        let request = statestore_raft::election::StandRequest { vote, last_log_id };
        let path = statestore_raft::election::STAND_PATH;
        let answer =
            self.http.post(format!("{}{path}", self.url(id))).body(encode(&request).unwrap()).send().await.unwrap();
        assert!(answer.status().is_success(), "{}", answer.status());
        decode(&answer.bytes().await.unwrap()).unwrap()
    }

    /// The vote of node `id`'s current leadership, as its followers hold it.
    #[allow(dead_code)]
    pub async fn leadership_vote(&self, id: u64) -> statestore_raft::types::Vote {
        let status = self.status(id).await.expect("a status");
        let term = status["term"].as_u64().expect("a term");
        let leader = status["leader"]["id"].as_u64().expect("a leader");
        statestore_raft::types::Vote::new_committed(term, leader)
    }

    pub async fn metrics(&self, id: u64) -> String {
        self.http.get(format!("{}/metrics", self.url(id))).send().await.unwrap().text().await.unwrap()
    }

    /// The last lines of every node's log, for failure messages.
    pub fn logs(&self) -> String {
        let mut text = String::new();
        for node in self.nodes.values() {
            let log = std::fs::read_to_string(&node.log).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            text.push_str(&format!("--- node {} ---\n", node.id));
            for line in &lines[lines.len().saturating_sub(30)..] {
                text.push_str(line);
                text.push('\n');
            }
        }
        text
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in self.nodes.values_mut() {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Asks the node at `url` to open an appends stream, as a leader does: the status it answers.
pub async fn open_appends_stream(http: &reqwest::Client, url: &str) -> reqwest::StatusCode {
    let request = http
        .get(format!("{url}/raft/append/stream"))
        .header("connection", "upgrade")
        .header("upgrade", statestore_raft::append_stream::UPGRADE_PROTOCOL);
    request.send().await.unwrap().status()
}

/// Elections a node started for `reason` (`prevote`, or `handover`: at a leader's request), from
/// its Prometheus text.
pub fn elections_started(metrics: &str, reason: &str) -> f64 {
    metric(metrics, &format!("statestore_elections_started_total{{reason=\"{reason}\"}}")).unwrap_or(0.0)
}

/// A metric's value in Prometheus text: `name` alone sums over its label sets, `name{labels}`
/// picks one series.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ')?;
        let series_name = if name.contains('{') { series } else { series.split('{').next().unwrap() };
        if series_name == name {
            *found.get_or_insert(0.0) += value.parse::<f64>().ok()?;
        }
    }
    found
}
