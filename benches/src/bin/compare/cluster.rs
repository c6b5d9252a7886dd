//! The `cluster` target: three `statestore` node processes on loopback behind the benchmark's
//! broker, started as cluster/local.sh starts them, with fresh data directories. They run closed,
//! as deployed: every node holds one cluster secret (`--cluster-secret-file`), which Raft and the
//! guarded routes carry. `cluster-open` starts the same nodes with `--insecure-no-auth` and no
//! secret, to measure what the secret costs; `cluster-tls` adds TLS between the nodes
//! (`--tls-cert`, `--tls-key`, `--tls-ca`, certificates of a CA made for the run) to the secret.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::Value;

use crate::processes::{Process, STOP_GRACE};

/// How long a fresh cluster may take to elect a leader and report ready.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a restarted node may take to report ready.
const RESTART_TIMEOUT: Duration = Duration::from_secs(300);

pub const NODES: u64 = 3;

/// How the nodes guard Raft and the guarded routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    /// One cluster secret, in a file every node reads (`--cluster-secret-file`).
    Secret,
    /// No secret and `--insecure-no-auth`: every route open to whoever reaches the port.
    Open,
    /// The secret, and TLS between the nodes with certificates of a CA made for the run.
    Tls,
}

/// A CA made for one run and, per node id, the certificate and key it signed for 127.0.0.1
/// (server and client use), as PEM files in `dir`.
struct Certificates {
    ca: PathBuf,
    /// (certificate, key) of node id i + 1.
    nodes: Vec<(PathBuf, PathBuf)>,
}

impl Certificates {
    fn make(dir: &Path, nodes: usize) -> anyhow::Result<Certificates> {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
        };
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, "compare CA");
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let ca_key = KeyPair::generate()?;
        let ca_cert = params.self_signed(&ca_key)?;
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, ca_cert.pem())?;
        // Enough for the learners a snapshot run adds.
        let paths = (1..=nodes + 2)
            .map(|id| {
                let mut params = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])?;
                params.distinguished_name.push(DnType::CommonName, format!("node{id}"));
                params.extended_key_usages =
                    vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
                let key = KeyPair::generate()?;
                let cert = params.signed_by(&key, &ca_cert, &ca_key)?;
                let (cert_path, key_path) = (dir.join(format!("node{id}.pem")), dir.join(format!("node{id}.key")));
                std::fs::write(&cert_path, cert.pem())?;
                std::fs::write(&key_path, key.serialize_pem())?;
                Ok((cert_path, key_path))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Certificates { ca, nodes: paths })
    }

    /// An HTTP client that trusts only the CA and presents node 1's certificate.
    fn client(&self, timeout: Duration) -> anyhow::Result<reqwest::Client> {
        let ca = reqwest::Certificate::from_pem(&std::fs::read(&self.ca)?)?;
        let (cert, key) = &self.nodes[0];
        let identity = reqwest::Identity::from_pem(&[std::fs::read(cert)?, std::fs::read(key)?].concat())?;
        Ok(reqwest::Client::builder()
            .timeout(timeout)
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(ca)
            .identity(identity)
            .build()?)
    }
}

struct Node {
    id: u64,
    port: u16,
    data_dir: PathBuf,
    process: Process,
}

pub struct StatestoreCluster {
    binary: PathBuf,
    broker_port: u16,
    members: String,
    /// Per node id, the `--peer-routes` it was started with (partition runs).
    peer_routes: Vec<Option<String>>,
    logs: PathBuf,
    nodes: Vec<Node>,
    http: reqwest::Client,
    /// `--worker-threads` of every node, as `cluster/local.sh` gives it: the three nodes share
    /// the machine's cores. `None` for a binary without the option.
    worker_threads: Option<usize>,
    /// The file of `--cluster-secret-file` and the secret in it; `None` for an open cluster.
    secret: Option<(PathBuf, String)>,
    /// TLS between the nodes (cluster-tls).
    certificates: Option<Certificates>,
}

/// The HTTP ports of the three nodes, chosen before the nodes start (the partition proxies
/// need them first).
pub fn free_ports() -> Vec<u16> {
    (0..NODES).map(|_| statestore_benches::free_port()).collect()
}

/// Fails with a clear message when `binary` is missing or lacks `flag`.
pub fn check_binary(binary: &Path, flag: Option<&str>) -> anyhow::Result<()> {
    if !binary.is_file() {
        bail!(
            "the node binary {} does not exist: build it with `cargo build --release -p statestore-node --bin statestore` \
             or pass --nodes-binary",
            binary.display()
        );
    }
    if let Some(flag) = flag {
        let help = Command::new(binary).arg("--help").output().context("running the node binary")?;
        if !String::from_utf8_lossy(&help.stdout).contains(flag) {
            bail!("the node binary {} has no {flag} option (rebuild it from a newer tree)", binary.display());
        }
    }
    Ok(())
}

/// A third of this machine's cores (at least one), as `cluster/local.sh` gives each node; `None`
/// when `binary` has no `--worker-threads`.
fn shared_worker_threads(binary: &Path) -> Option<usize> {
    check_binary(binary, Some("--worker-threads")).ok()?;
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    Some((cores / NODES as usize).max(1))
}

impl StatestoreCluster {
    /// Starts the nodes on `ports` and waits until all three are ready and agree on a leader.
    /// `peer_routes[i]`, when given, is node i+1's `--peer-routes`.
    pub async fn start(
        binary: &Path,
        broker_port: u16,
        ports: &[u16],
        peer_routes: Vec<Option<String>>,
        dir: &Path,
        logs: &Path,
        auth: Auth,
    ) -> anyhow::Result<StatestoreCluster> {
        let scheme = if auth == Auth::Tls { "https" } else { "http" };
        let members = ports
            .iter()
            .enumerate()
            .map(|(i, port)| format!("{}={scheme}://127.0.0.1:{port}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let certificates = match auth {
            Auth::Tls => Some(Certificates::make(dir, ports.len()).context("making the TLS certificates")?),
            Auth::Secret | Auth::Open => None,
        };
        let http = match &certificates {
            Some(certificates) => certificates.client(Duration::from_secs(2))?,
            None => reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?,
        };
        let secret = match auth {
            Auth::Secret | Auth::Tls => {
                use base64::Engine;
                let bytes: Vec<u8> = (0..32).map(|_| fastrand::u8(..)).collect();
                let text = base64::engine::general_purpose::STANDARD.encode(bytes);
                let path = dir.join("cluster-secret");
                std::fs::write(&path, format!("{text}\n")).with_context(|| format!("writing {}", path.display()))?;
                Some((path, text))
            }
            Auth::Open => None,
        };
        let mut cluster = StatestoreCluster {
            binary: binary.to_path_buf(),
            broker_port,
            members,
            peer_routes,
            logs: logs.to_path_buf(),
            nodes: Vec::new(),
            http,
            worker_threads: shared_worker_threads(binary),
            secret,
            certificates,
        };
        for (i, port) in ports.iter().enumerate() {
            let id = i as u64 + 1;
            let data_dir = dir.join(format!("node-{id}"));
            let process = cluster.spawn(id, *port, &data_dir)?;
            cluster.nodes.push(Node { id, port: *port, data_dir, process });
        }
        let deadline = Instant::now() + START_TIMEOUT;
        for index in 0..cluster.nodes.len() {
            cluster.wait_ready(index, deadline).await?;
        }
        cluster.wait_for_leader(deadline).await?;
        Ok(cluster)
    }

    fn spawn(&self, id: u64, port: u16, data_dir: &Path) -> anyhow::Result<Process> {
        let mut command = Command::new(&self.binary);
        command
            .arg("--id")
            .arg(id.to_string())
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--initial-members")
            .arg(&self.members)
            .arg("--broker")
            .arg(format!("127.0.0.1:{}", self.broker_port))
            .arg("--log")
            .arg("warn");
        if let Some(threads) = self.worker_threads {
            command.arg("--worker-threads").arg(threads.to_string());
        }
        // Only what is given here: not a secret or an open port from the caller's environment.
        command.env_remove("STATESTORE_CLUSTER_SECRET").env_remove("STATESTORE_INSECURE_NO_AUTH");
        match &self.secret {
            Some((path, _)) => command.arg("--cluster-secret-file").arg(path),
            None => command.arg("--insecure-no-auth"),
        };
        if let Some(certificates) = &self.certificates {
            let (cert, key) = certificates.nodes.get((id - 1) as usize).context("a certificate for every node")?;
            command.arg("--tls-cert").arg(cert).arg("--tls-key").arg(key).arg("--tls-ca").arg(&certificates.ca);
        }
        if let Some(Some(routes)) = self.peer_routes.get((id - 1) as usize) {
            command.arg("--peer-routes").arg(routes);
        }
        Process::spawn(format!("node{id}"), command, &self.logs.join(format!("node-{id}.log")))
    }

    pub fn processes(&self) -> Vec<(String, u32)> {
        self.nodes.iter().map(|node| (node.process.name().to_string(), node.process.pid())).collect()
    }

    /// The node id of the node at `index`.
    pub fn id(&self, index: usize) -> u64 {
        self.nodes[index].id
    }

    /// Fails when a node has died.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        for index in 0..self.nodes.len() {
            let hint = self.log_hint(index);
            self.nodes[index].process.check_running().context(hint)?;
        }
        Ok(())
    }

    fn url(&self, index: usize, path: &str) -> String {
        let scheme = if self.certificates.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}{path}", self.nodes[index].port)
    }

    /// A request to a guarded route of node `index`, with the cluster secret when there is one.
    fn guarded(&self, client: &reqwest::Client, index: usize, path: &str) -> reqwest::RequestBuilder {
        let request = client.post(self.url(index, path));
        match &self.secret {
            Some((_, secret)) => request.bearer_auth(secret),
            None => request,
        }
    }

    /// Node `index`'s HTTP port on 127.0.0.1.
    pub fn port(&self, index: usize) -> u16 {
        self.nodes[index].port
    }

    /// Node `index`'s process id.
    pub fn pid(&self, index: usize) -> u32 {
        self.nodes[index].process.pid()
    }

    /// Node `index`'s data directory.
    pub fn data_dir(&self, index: usize) -> &Path {
        &self.nodes[index].data_dir
    }

    /// How many nodes the cluster has.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    async fn is_ready(&self, index: usize) -> bool {
        let response = self.http.get(self.url(index, "/ready")).send().await;
        response.is_ok_and(|r| r.status().is_success())
    }

    async fn wait_ready(&mut self, index: usize, deadline: Instant) -> anyhow::Result<()> {
        while !self.is_ready(index).await {
            self.nodes[index].process.check_running().with_context(|| self.log_hint(index))?;
            if Instant::now() > deadline {
                bail!("node {} did not become ready in time; {}", self.nodes[index].id, self.log_hint(index));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    fn log_hint(&self, index: usize) -> String {
        format!("see {}", self.logs.join(format!("node-{}.log", self.nodes[index].id)).display())
    }

    /// Node `index`'s `GET /cluster`.
    pub async fn status(&self, index: usize) -> Option<Value> {
        self.http.get(self.url(index, "/cluster")).send().await.ok()?.json().await.ok()
    }

    /// The index of the node that says it is the leader and whose leadership every node that
    /// answers agrees with.
    pub async fn leader(&self) -> Option<usize> {
        let mut leader_id = None;
        for index in 0..self.nodes.len() {
            let Some(status) = self.status(index).await else { continue };
            let says = status.pointer("/leader/id").and_then(Value::as_u64)?;
            if *leader_id.get_or_insert(says) != says {
                return None;
            }
        }
        let index = self.nodes.iter().position(|node| Some(node.id) == leader_id)?;
        let status = self.status(index).await?;
        (status.get("role").and_then(Value::as_str) == Some("leader")).then_some(index)
    }

    async fn wait_for_leader(&self, deadline: Instant) -> anyhow::Result<usize> {
        loop {
            if let Some(index) = self.leader().await {
                return Ok(index);
            }
            if Instant::now() > deadline {
                bail!("the nodes did not agree on a leader in time");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The highest Raft term any node reports: every election, won or not, begins a new one.
    /// `None` when no node answers.
    pub async fn highest_term(&self) -> Option<u64> {
        let mut highest = None;
        for index in 0..self.nodes.len() {
            let term = self.status(index).await.and_then(|status| status.get("term").and_then(Value::as_u64));
            highest = highest.max(term);
        }
        highest
    }

    /// Node `index`'s `/metrics` text; empty when it does not answer.
    pub async fn metrics(&self, index: usize) -> String {
        match self.http.get(self.url(index, "/metrics")).send().await {
            Ok(response) => response.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// `POST /cluster/snapshot` on node `index`: it builds a snapshot in the background.
    pub async fn request_snapshot(&self, index: usize) -> anyhow::Result<()> {
        let response = self.guarded(&self.http, index, "/cluster/snapshot").send().await?;
        if !response.status().is_success() {
            bail!("node {} refused a snapshot: {}", self.nodes[index].id, response.text().await.unwrap_or_default());
        }
        Ok(())
    }

    /// The leader's counters for "requests per fsync": requests answered (all commands and
    /// results) and WAL fsyncs. `None` for a counter the node does not export.
    pub async fn leader_counters(&self, index: usize) -> (Option<f64>, Option<f64>) {
        let text = self.metrics(index).await;
        (
            metric_sum(&text, "statestore_requests_total"),
            metric_sum(&text, "statestore_disk_wal_fsync_duration_seconds_count"),
        )
    }

    /// Resident memory of each node, in MiB.
    pub fn rss_mib(&self) -> Vec<(String, Option<f64>)> {
        self.nodes
            .iter()
            .map(|node| (node.process.name().to_string(), crate::processes::rss_mib(node.process.pid())))
            .collect()
    }

    /// Stops node `index` with SIGTERM and starts it again on the same data directory. Returns
    /// how long it took to exit, and the time from its start to its first `/ready` 200.
    pub async fn restart(&mut self, index: usize) -> anyhow::Result<(Duration, Duration)> {
        let stop_time = self.stop_node(index);
        Ok((stop_time, self.start_node(index).await?))
    }

    /// Starts one more node (not an initial member, so it does not form a cluster of its own) and
    /// adds it as a learner through the leader's `POST /cluster/learners`; returns its index once
    /// the leader reports it caught up.
    pub async fn add_learner(&mut self) -> anyhow::Result<usize> {
        // Asked before the new node starts: a node that knows no leader yet makes the members
        // disagree.
        let leader = self
            .wait_for_leader(Instant::now() + RESTART_TIMEOUT)
            .await
            .context("no leader to add a learner through")?;
        let id = self.nodes.len() as u64 + 1;
        let port = statestore_benches::free_port();
        let parent = self.nodes[0].data_dir.parent().context("the nodes' data directory")?.to_path_buf();
        let data_dir = parent.join(format!("node-{id}"));
        let process = self.spawn(id, port, &data_dir)?;
        self.nodes.push(Node { id, port, data_dir, process });
        let body = serde_json::json!({
            "id": id,
            "address": format!("{}://127.0.0.1:{port}", if self.certificates.is_some() { "https" } else { "http" }),
            "timeout_ms": RESTART_TIMEOUT.as_millis() as u64,
        });
        let client = match &self.certificates {
            Some(certificates) => certificates.client(RESTART_TIMEOUT + Duration::from_secs(10))?,
            None => reqwest::Client::builder().timeout(RESTART_TIMEOUT + Duration::from_secs(10)).build()?,
        };
        let response = self.guarded(&client, leader, "/cluster/learners").json(&body).send().await?;
        if !response.status().is_success() {
            bail!("adding node {id} as a learner: {}", response.text().await.unwrap_or_default());
        }
        Ok(self.nodes.len() - 1)
    }

    /// Kills node `index` with SIGKILL and starts it again on its data directory; returns the
    /// time from its start to its first `/ready` 200 (what it applies again from its log
    /// included).
    pub async fn crash_restart(&mut self, index: usize) -> anyhow::Result<Duration> {
        tokio::task::block_in_place(|| self.nodes[index].process.kill());
        self.start_node(index).await
    }

    /// Stops node `index` with SIGTERM; returns how long it took to exit.
    pub fn stop_node(&mut self, index: usize) -> Duration {
        let stopping = Instant::now();
        let status = tokio::task::block_in_place(|| self.nodes[index].process.stop(STOP_GRACE));
        if !status.success() {
            eprintln!("note: node {} exited with {status} after SIGTERM", self.nodes[index].id);
        }
        stopping.elapsed()
    }

    /// Starts node `index` again on its data directory; returns the time from its start to its
    /// first `/ready` 200.
    pub async fn start_node(&mut self, index: usize) -> anyhow::Result<Duration> {
        let (id, port, data_dir) = (self.nodes[index].id, self.nodes[index].port, self.nodes[index].data_dir.clone());
        let starting = Instant::now();
        self.nodes[index].process = self.spawn(id, port, &data_dir)?;
        self.wait_ready(index, starting + RESTART_TIMEOUT).await?;
        Ok(starting.elapsed())
    }
}

/// The sum over all label sets of the Prometheus metric `name` in an exposition `text`.
pub fn metric_sum(text: &str, name: &str) -> Option<f64> {
    let values: Vec<f64> = text
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            if !(rest.starts_with('{') || rest.starts_with(' ')) {
                return None;
            }
            line.rsplit(' ').next()?.parse().ok()
        })
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_sums_add_every_label_set_and_only_the_named_metric() {
        let text = "# HELP statestore_requests_total x\n\
                    statestore_requests_total{command=\"SET\",result=\"ok\"} 10\n\
                    statestore_requests_total{command=\"GET\",result=\"ok\"} 5\n\
                    statestore_requests_total_other 99\n\
                    statestore_disk_wal_fsync_duration_seconds_count 4\n";
        assert_eq!(metric_sum(text, "statestore_requests_total"), Some(15.0));
        assert_eq!(metric_sum(text, "statestore_disk_wal_fsync_duration_seconds_count"), Some(4.0));
        assert_eq!(metric_sum(text, "missing"), None);
    }
}
