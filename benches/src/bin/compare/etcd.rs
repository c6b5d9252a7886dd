//! The `etcd` target: a three-member etcd cluster (the Debian `etcd-server` binary) on loopback
//! with default settings (fsync on), written and read through its gRPC API on the leader as its
//! users call it ([`EtcdLoad`]: the `etcd-client` crate, one HTTP/2 connection per 16 in-flight
//! slots, as the MQTT targets share a connection). The `etcd-json` target is the same cluster
//! driven through the v3 JSON gateway instead ([`EtcdJsonLoad`]: `POST /v3/kv/put` and
//! `/v3/kv/range`, one keep-alive HTTP/1.1 connection per slot), to show what the gateway costs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use serde_json::Value;

use crate::load::{RequestError, Requester};
use crate::processes::{Process, STOP_GRACE};

const MEMBERS: usize = 3;
const START_TIMEOUT: Duration = Duration::from_secs(60);
const RESTART_TIMEOUT: Duration = Duration::from_secs(300);

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    process: Process,
}

pub struct EtcdCluster {
    binary: PathBuf,
    initial_cluster: String,
    token: String,
    logs: PathBuf,
    members: Vec<Member>,
    http: reqwest::Client,
}

impl EtcdCluster {
    /// Starts three members and waits until each reports healthy and one is the leader.
    pub async fn start(binary: &Path, dir: &Path, logs: &Path) -> anyhow::Result<EtcdCluster> {
        let ports: Vec<(u16, u16)> =
            (0..MEMBERS).map(|_| (statestore_benches::free_port(), statestore_benches::free_port())).collect();
        let initial_cluster = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("etcd{}=http://127.0.0.1:{peer}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = EtcdCluster {
            binary: binary.to_path_buf(),
            initial_cluster,
            token: format!("compare-{}", std::process::id()),
            logs: logs.to_path_buf(),
            members: Vec::new(),
            http: reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?,
        };
        for (i, (client_port, peer_port)) in ports.into_iter().enumerate() {
            let name = format!("etcd{}", i + 1);
            let data_dir = dir.join(&name);
            let process = cluster.spawn(&name, client_port, peer_port, &data_dir)?;
            cluster.members.push(Member { name, client_port, peer_port, data_dir, process });
        }
        let deadline = Instant::now() + START_TIMEOUT;
        for index in 0..MEMBERS {
            cluster.wait_healthy(index, deadline).await?;
        }
        while cluster.leader().await.is_none() {
            if Instant::now() > deadline {
                bail!("etcd elected no leader in time; see {}", logs.display());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(cluster)
    }

    fn spawn(&self, name: &str, client_port: u16, peer_port: u16, data_dir: &Path) -> anyhow::Result<Process> {
        let client_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let mut command = Command::new(&self.binary);
        command
            .args(["--name", name])
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &self.initial_cluster, "--initial-cluster-token", &self.token])
            .args(["--initial-cluster-state", "new"])
            // Quiet logs; everything else stays at etcd's defaults (fsync on every commit).
            .args(["--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn"]);
        // etcd 3.4 refuses to start on architectures it does not list unless told to.
        if let Some(arch) = unsupported_arch() {
            command.env("ETCD_UNSUPPORTED_ARCH", arch);
        }
        Process::spawn(name, command, &self.logs.join(format!("{name}.log")))
    }

    pub fn processes(&self) -> Vec<(String, u32)> {
        self.members.iter().map(|member| (member.name.clone(), member.process.pid())).collect()
    }

    /// Fails when a member has died.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        for member in &mut self.members {
            let log = self.logs.join(format!("{}.log", member.name));
            member.process.check_running().with_context(|| format!("see {}", log.display()))?;
        }
        Ok(())
    }

    fn url(&self, index: usize, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.members[index].client_port)
    }

    async fn is_healthy(&self, index: usize) -> bool {
        let Ok(response) = self.http.get(self.url(index, "/health")).send().await else { return false };
        let Ok(body) = response.json::<Value>().await else { return false };
        body.get("health").and_then(Value::as_str) == Some("true")
    }

    async fn wait_healthy(&mut self, index: usize, deadline: Instant) -> anyhow::Result<()> {
        while !self.is_healthy(index).await {
            let log = self.logs.join(format!("{}.log", self.members[index].name));
            self.members[index].process.check_running().with_context(|| format!("see {}", log.display()))?;
            if Instant::now() > deadline {
                bail!("{} did not become healthy in time; see {}", self.members[index].name, log.display());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// The index of the leader: the member whose `maintenance/status` names itself.
    pub async fn leader(&self) -> Option<usize> {
        for index in 0..self.members.len() {
            let request = self.http.post(self.url(index, "/v3/maintenance/status")).body("{}");
            let Ok(response) = request.send().await else { continue };
            let Ok(status) = response.json::<Value>().await else { continue };
            let me = status.pointer("/header/member_id").and_then(Value::as_str);
            if me.is_some() && me == status.get("leader").and_then(Value::as_str) {
                return Some(index);
            }
        }
        None
    }

    /// The client URL (`http://127.0.0.1:port`) of the current leader.
    pub async fn leader_url(&self) -> anyhow::Result<String> {
        let index = self.leader().await.context("etcd has no leader")?;
        Ok(self.url(index, ""))
    }

    pub fn rss_mib(&self) -> Vec<(String, Option<f64>)> {
        self.members.iter().map(|m| (m.name.clone(), crate::processes::rss_mib(m.process.pid()))).collect()
    }

    /// Stops member `index` with SIGTERM and starts it again on its data directory. Returns how
    /// long it took to exit, and the time from its start until `/health` reports healthy.
    pub async fn restart(&mut self, index: usize) -> anyhow::Result<(Duration, Duration)> {
        let stopping = Instant::now();
        tokio::task::block_in_place(|| self.members[index].process.stop(STOP_GRACE));
        let stop_time = stopping.elapsed();
        Ok((stop_time, self.start_again(index).await?))
    }

    /// Kills member `index` with SIGKILL and starts it again on its data directory; returns the
    /// time from its start to healthy.
    pub async fn crash_restart(&mut self, index: usize) -> anyhow::Result<Duration> {
        tokio::task::block_in_place(|| self.members[index].process.kill());
        self.start_again(index).await
    }

    /// Starts member `index` (stopped) again on its data directory; returns the time from its
    /// start to healthy.
    async fn start_again(&mut self, index: usize) -> anyhow::Result<Duration> {
        let member = &self.members[index];
        let (name, client_port, peer_port, data_dir) =
            (member.name.clone(), member.client_port, member.peer_port, member.data_dir.clone());
        let starting = Instant::now();
        self.members[index].process = self.spawn(&name, client_port, peer_port, &data_dir)?;
        self.wait_healthy(index, starting + RESTART_TIMEOUT).await?;
        Ok(starting.elapsed())
    }
}

/// The value etcd wants in ETCD_UNSUPPORTED_ARCH on this machine, if any (3.4 supports amd64
/// and ppc64le without it).
fn unsupported_arch() -> Option<&'static str> {
    match std::env::consts::ARCH {
        "x86_64" | "powerpc64" => None,
        "aarch64" => Some("arm64"),
        other => Some(other),
    }
}

/// In-flight slots that share one gRPC client, so one HTTP/2 connection (as MQTT connections
/// are shared).
pub const SLOTS_PER_CONNECTION: usize = crate::mqtt_load::SLOTS_PER_CONNECTION;

/// How long connecting a gRPC client and its first answer may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Puts and Ranges through etcd's gRPC API as its users call it (the `etcd-client` crate, on
/// tonic), on the leader: one client, one HTTP/2 connection, per [`SLOTS_PER_CONNECTION`]
/// slots, each carrying its slots' requests at once.
pub struct EtcdLoad {
    /// Kept whole: each holds its channel's endpoint list open.
    clients: Vec<etcd_client::Client>,
    timeout: Duration,
}

impl EtcdLoad {
    /// Enough clients for `slots` in-flight requests to the member at `endpoint`, each
    /// connected and answering (a Range of a key nobody writes) before this returns.
    pub async fn connect(endpoint: &str, slots: usize, timeout: Duration) -> anyhow::Result<EtcdLoad> {
        let count = slots.div_ceil(SLOTS_PER_CONNECTION).max(1);
        let options = etcd_client::ConnectOptions::new().with_connect_timeout(CONNECT_TIMEOUT);
        let mut clients = Vec::with_capacity(count);
        for _ in 0..count {
            let client = etcd_client::Client::connect([endpoint], Some(options.clone()))
                .await
                .with_context(|| format!("connecting a gRPC client to etcd at {endpoint}"))?;
            tokio::time::timeout(CONNECT_TIMEOUT, client.kv_client().get("compare-ready", None))
                .await
                .with_context(|| format!("etcd at {endpoint} answered no gRPC Range within {CONNECT_TIMEOUT:?}"))?
                .with_context(|| format!("a gRPC Range on etcd at {endpoint}"))?;
            clients.push(client);
        }
        Ok(EtcdLoad { clients, timeout })
    }

    fn kv(&self, slot: usize) -> etcd_client::KvClient {
        self.clients[(slot / SLOTS_PER_CONNECTION) % self.clients.len()].kv_client()
    }

    async fn within<T>(
        &self,
        request: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, RequestError> {
        match tokio::time::timeout(self.timeout, request).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(etcd_client::Error::GRpcStatus(status))) => {
                Err(RequestError::Refused(format!("gRPC {:?}: {}", status.code(), status.message())))
            }
            Ok(Err(e)) => Err(RequestError::Send(e.to_string())),
            Err(_) => Err(RequestError::Timeout),
        }
    }
}

impl Requester for EtcdLoad {
    async fn set(&self, slot: usize, key: Vec<u8>, value: &[u8]) -> Result<(), RequestError> {
        let mut kv = self.kv(slot);
        self.within(kv.put(key, value, None)).await.map(drop)
    }

    /// A Range of one key: linearizable (etcd's default), or serializable with `local` (the
    /// member's own state, possibly stale). No value is an error.
    async fn get(&self, slot: usize, key: Vec<u8>, local: bool) -> Result<(), RequestError> {
        let mut kv = self.kv(slot);
        let options = local.then(|| etcd_client::GetOptions::new().with_serializable());
        let answer = self.within(kv.get(key, options)).await?;
        if answer.kvs().is_empty() {
            Err(RequestError::Refused("the key has no value".into()))
        } else {
            Ok(())
        }
    }
}

/// The `etcd-json` target's client: puts and Ranges through etcd's v3 JSON gateway (grpc-gateway
/// in front of the gRPC API, `POST /v3/kv/put` and `/v3/kv/range`), one HTTP client (one
/// keep-alive HTTP/1.1 connection) per slot. Every request pays the gateway's JSON translation.
pub struct EtcdJsonLoad {
    put_url: String,
    range_url: String,
    clients: Vec<reqwest::Client>,
}

impl EtcdJsonLoad {
    /// Clients for `slots` in-flight requests to the member at `endpoint` (`http://host:port`).
    pub fn new(endpoint: &str, slots: usize, timeout: Duration) -> anyhow::Result<EtcdJsonLoad> {
        let clients = (0..slots.max(1))
            .map(|_| {
                reqwest::Client::builder()
                    .http1_only()
                    .tcp_nodelay(true)
                    .pool_max_idle_per_host(1)
                    .timeout(timeout)
                    .build()
            })
            .collect::<Result<_, _>>()?;
        Ok(EtcdJsonLoad {
            put_url: format!("{endpoint}/v3/kv/put"),
            range_url: format!("{endpoint}/v3/kv/range"),
            clients,
        })
    }

    /// Posts `body` to `url` on the slot's connection; returns the answer's body.
    async fn post(&self, slot: usize, url: &str, body: String) -> Result<bytes::Bytes, RequestError> {
        let client = &self.clients[slot % self.clients.len()];
        let response = client
            .post(url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| if e.is_timeout() { RequestError::Timeout } else { RequestError::Send(e.to_string()) })?;
        let status = response.status();
        let body = response.bytes().await.map_err(|e| RequestError::Send(e.to_string()))?;
        if status.is_success() && !body.starts_with(br#"{"error""#) {
            Ok(body)
        } else {
            Err(RequestError::Refused(format!("HTTP {status}: {}", String::from_utf8_lossy(&body))))
        }
    }
}

impl Requester for EtcdJsonLoad {
    async fn set(&self, slot: usize, key: Vec<u8>, value: &[u8]) -> Result<(), RequestError> {
        let body = format!(r#"{{"key":"{}","value":"{}"}}"#, BASE64.encode(key), BASE64.encode(value));
        self.post(slot, &self.put_url, body).await.map(drop)
    }

    async fn get(&self, slot: usize, key: Vec<u8>, local: bool) -> Result<(), RequestError> {
        let body = format!(r#"{{"key":"{}","serializable":{local}}}"#, BASE64.encode(key));
        let answer = self.post(slot, &self.range_url, body).await?;
        // The gateway leaves out empty fields: no `kvs`, no value.
        if answer.windows(6).any(|w| w == br#""kvs":"#) {
            Ok(())
        } else {
            Err(RequestError::Refused("the key has no value".into()))
        }
    }
}
