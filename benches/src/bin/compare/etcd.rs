//! The `etcd` target: a three-member etcd cluster (the Debian `etcd-server` binary) on loopback
//! with default settings (fsync on), written through its v3 JSON gateway
//! (`POST /v3/kv/put`) on the leader, one keep-alive HTTP/1.1 connection per in-flight slot.

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

    /// The put endpoint of the current leader.
    pub async fn leader_put_url(&self) -> anyhow::Result<String> {
        let index = self.leader().await.context("etcd has no leader")?;
        Ok(self.url(index, "/v3/kv/put"))
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

/// Puts through the JSON gateway, one HTTP client (one keep-alive connection) per slot.
pub struct EtcdLoad {
    put_url: String,
    clients: Vec<reqwest::Client>,
}

impl EtcdLoad {
    pub fn new(put_url: String, slots: usize, timeout: Duration) -> anyhow::Result<EtcdLoad> {
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
        Ok(EtcdLoad { put_url, clients })
    }
}

impl Requester for EtcdLoad {
    async fn set(&self, slot: usize, key: Vec<u8>, value: &[u8]) -> Result<(), RequestError> {
        let client = &self.clients[slot % self.clients.len()];
        let body = format!(r#"{{"key":"{}","value":"{}"}}"#, BASE64.encode(key), BASE64.encode(value));
        let response = client
            .post(&self.put_url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| if e.is_timeout() { RequestError::Timeout } else { RequestError::Send(e.to_string()) })?;
        let status = response.status();
        let body = response.bytes().await.map_err(|e| RequestError::Send(e.to_string()))?;
        if status.is_success() && !body.starts_with(br#"{"error""#) {
            Ok(())
        } else {
            Err(RequestError::Refused(format!("HTTP {status}: {}", String::from_utf8_lossy(&body))))
        }
    }
}
