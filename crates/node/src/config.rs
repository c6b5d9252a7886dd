//! Node configuration from flags, environment variables (`STATESTORE_*`) and an optional TOML
//! file. A flag wins over its variable, a variable over the file, the file over the default.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use serde::{Deserialize, Serialize};
use statestore_protocol::topic::ResponseTopics;
use statestore_raft::NodeId;

/// The node's settings, one field each: a flag, its environment variable, and the key of the same
/// name in the TOML file of `--config` (without `config` and `restored`, which only flags give).
#[derive(Debug, Default, Parser, Serialize, Deserialize)]
#[command(name = "statestore", version, about = "A Raft-replicated MQTT5 state store node")]
#[serde(deny_unknown_fields)]
pub struct Args {
    /// A TOML file with any of the settings below (keys as the flags, with `_` for `-`).
    #[arg(long, env = "STATESTORE_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// This node's id: a positive integer, unique in the cluster, never reused.
    #[arg(long, env = "STATESTORE_ID")]
    pub id: Option<NodeId>,
    /// Address the HTTP server binds (Raft RPC, cluster API, metrics). Default 127.0.0.1:7400.
    #[arg(long, env = "STATESTORE_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// URL other nodes and operators reach this node at. Default `http://<listen>`, or
    /// `https://<listen>` with TLS.
    #[arg(long, env = "STATESTORE_ADVERTISE")]
    pub advertise: Option<String>,
    /// Directory for the RocksDB database and snapshots. Default `./data/node-<id>`.
    #[arg(long, env = "STATESTORE_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// The voters of a new cluster, e.g. `1=http://10.0.0.1:7400,2=...`. Used only when the data
    /// directory is empty and this node's id is in the list; ignored once the node has a log.
    #[arg(long, env = "STATESTORE_INITIAL_MEMBERS")]
    pub initial_members: Option<String>,
    /// Reach some peers at another URL than the one they advertise, e.g. through a proxy or a
    /// NAT: `2=http://10.1.0.2:7400,3=...`. Peers not listed are reached at their advertised URL.
    #[arg(long, env = "STATESTORE_PEER_ROUTES")]
    pub peer_routes: Option<String>,
    /// A file holding the cluster secret that Raft RPC, membership changes, backups, restores
    /// and `/v1/command` must carry (`Authorization: Bearer <secret>`); or give the secret itself
    /// in STATESTORE_CLUSTER_SECRET. Never on the command line. Default: none; a node listening
    /// on an address other than loopback then needs TLS or --insecure-no-auth.
    #[arg(long, env = "STATESTORE_CLUSTER_SECRET_FILE")]
    pub cluster_secret_file: Option<PathBuf>,
    /// If the file of --cluster-secret-file does not exist, create it with a new random secret
    /// (readable by its owner only). Nodes that start at once with the same file on a shared
    /// volume all use the first one written. Default false.
    #[arg(long, env = "STATESTORE_CREATE_CLUSTER_SECRET")]
    #[serde(skip)]
    pub create_cluster_secret: bool,
    /// Serve on an address other than loopback without a cluster secret and without TLS:
    /// anyone who reaches the port may then append to the Raft log, change the membership,
    /// restore a backup and write any key. Default false: such a node refuses to start.
    #[arg(long, env = "STATESTORE_INSECURE_NO_AUTH")]
    #[serde(skip)]
    pub insecure_no_auth: bool,
    /// PEM certificate chain of this node (with --tls-key and --tls-ca): the HTTP port then
    /// speaks only HTTPS, peers are reached over HTTPS with this certificate as the client's,
    /// and Raft RPC, membership changes and `/v1/command` need a client certificate that
    /// --tls-ca signs. It must name the host of --advertise. Default: plain HTTP.
    #[arg(long, env = "STATESTORE_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "STATESTORE_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// PEM certificates of the CA that signs every node's certificate and the operators' client
    /// certificates; the only one trusted between nodes.
    #[arg(long, env = "STATESTORE_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Leader heartbeat interval in milliseconds. Default 50.
    #[arg(long, env = "STATESTORE_HEARTBEAT_MS")]
    pub heartbeat_ms: Option<u64>,
    /// The largest offset in milliseconds between this node's wall clock and its peers' (as their
    /// Raft messages show them) at which it still serves: beyond it a follower is not ready, and
    /// a node whose clock disagrees with most voters' does not stand for election and, leading,
    /// hands leadership over. 0 turns the check off. Default 1000.
    #[arg(long, env = "STATESTORE_MAX_CLOCK_OFFSET_MS")]
    pub max_clock_offset_ms: Option<u64>,
    /// The longest a leader's Raft log fsync may run, in milliseconds, before the leader hands
    /// leadership over (a leader sends its entries while it flushes them, so a disk that stops
    /// returning does not cost it its heartbeats, only every write). 0 turns the check off.
    /// Default 1000.
    #[arg(long, env = "STATESTORE_MAX_LOG_FSYNC_MS")]
    pub max_log_fsync_ms: Option<u64>,
    /// The data directory holds a restored backup (a copy of one node's directory): give it a
    /// new storage incarnation and let the restored cluster's first leader name it anew. Only
    /// for the first start after a restore. Default false.
    #[arg(long, env = "STATESTORE_RESTORED")]
    #[serde(skip)]
    pub restored: bool,
    /// Lower bound of the randomized election timeout in milliseconds. Default 150.
    #[arg(long, env = "STATESTORE_ELECTION_MIN_MS")]
    pub election_min_ms: Option<u64>,
    /// Upper bound of the randomized election timeout in milliseconds. Default 300.
    #[arg(long, env = "STATESTORE_ELECTION_MAX_MS")]
    pub election_max_ms: Option<u64>,
    /// Build a snapshot after this many entries since the last one (but not before the log
    /// since then holds as many bytes as the last snapshot). Default 10000.
    #[arg(long, env = "STATESTORE_SNAPSHOT_EVERY")]
    pub snapshot_every: Option<u64>,
    /// Also build a snapshot once the log has grown by this many bytes since the last one.
    /// Default 67108864 (64 MiB).
    #[arg(long, env = "STATESTORE_SNAPSHOT_LOG_BYTES")]
    pub snapshot_log_bytes: Option<u64>,
    /// Write a snapshot being built at most this many bytes a second, so that the Raft log's
    /// fsyncs do not queue behind it. Default 0: as fast as the disk goes; otherwise at least
    /// 1048576 (1 MiB/s).
    #[arg(long, env = "STATESTORE_SNAPSHOT_WRITE_RATE")]
    pub snapshot_write_rate: Option<u64>,
    /// Write a snapshot received from the leader, and the table files installing it makes, at
    /// most this many bytes a second each, so that the Raft log's fsyncs on the same disk do
    /// not wait behind them; an install is never held past 30 s. Default 0: as fast as the disk
    /// goes; otherwise at least 1048576 (1 MiB/s).
    #[arg(long, env = "STATESTORE_SNAPSHOT_INSTALL_RATE")]
    pub snapshot_install_rate: Option<u64>,
    /// Write the applied state to disk once this many log entries were applied since it last
    /// was (or `--flush-after-operations` operations): at most what a node killed applies again
    /// from its log when it starts. Default 2000.
    #[arg(long, env = "STATESTORE_FLUSH_AFTER_ENTRIES")]
    pub flush_after_entries: Option<u64>,
    /// Write the applied state to disk once this many operations (requests and housekeeping)
    /// were applied since it last was (or `--flush-after-entries` entries). Default 20000.
    #[arg(long, env = "STATESTORE_FLUSH_AFTER_OPERATIONS")]
    pub flush_after_operations: Option<u64>,
    /// Entries kept in the log below the latest snapshot, for slightly lagging followers. Default 1000.
    #[arg(long, env = "STATESTORE_LOGS_KEPT")]
    pub logs_kept: Option<u64>,
    /// Most `POST /v1/command` requests a node serves at once; beyond it, 503
    /// `too_many_commands`. Default 1024.
    #[arg(long, env = "STATESTORE_MAX_HTTP_COMMANDS")]
    pub max_http_commands: Option<usize>,
    /// Most HTTP connections the node serves at once (peers, operators, probes, Prometheus);
    /// one more is answered 503 `too_many_connections` and closed. Default 1024.
    #[arg(long, env = "STATESTORE_HTTP_MAX_CONNECTIONS")]
    pub http_max_connections: Option<usize>,
    /// Milliseconds a client has to send a request's headers, from its connection's start or its
    /// previous answer; then the connection is closed (idle ones too). Default 10000.
    #[arg(long, env = "STATESTORE_HTTP_HEADER_TIMEOUT_MS")]
    pub http_header_timeout_ms: Option<u64>,
    /// Milliseconds a client has to send a request's whole body, from its headers; then the
    /// request fails. Default 60000.
    #[arg(long, env = "STATESTORE_HTTP_BODY_TIMEOUT_MS")]
    pub http_body_timeout_ms: Option<u64>,
    /// Most TLS handshakes under way at once (each bounded by 10 s); further connections wait
    /// to be accepted. Default 64.
    #[arg(long, env = "STATESTORE_TLS_MAX_HANDSHAKES")]
    pub tls_max_handshakes: Option<usize>,
    /// Threads that run the node's requests, Raft and HTTP (the async runtime's workers).
    /// Default: one per CPU core. Nodes that share a machine serve more with fewer each:
    /// `cluster/local.sh` gives each of its three nodes a third of the cores (at least one).
    #[arg(long, env = "STATESTORE_WORKER_THREADS")]
    pub worker_threads: Option<usize>,
    /// Log filter, e.g. `info` or `warn,statestore=debug`. Default `warn,statestore=info`: this
    /// node's events, and only warnings and errors of the libraries.
    #[arg(long, env = "STATESTORE_LOG")]
    pub log: Option<String>,
    /// Log line format: `text` (default) or `json` (one JSON object per line, for log shippers).
    #[arg(long, env = "STATESTORE_LOG_FORMAT")]
    pub log_format: Option<String>,
    /// The MQTT5 broker to serve the state store protocol through, as `host:port`. Without it the
    /// node serves only HTTP.
    #[arg(long, env = "STATESTORE_BROKER")]
    pub broker: Option<String>,
    /// MQTT client id prefix; the node connects as `<prefix>-<id>`. Default `statestore`.
    #[arg(long, env = "STATESTORE_BROKER_CLIENT_ID_PREFIX")]
    pub broker_client_id_prefix: Option<String>,
    /// Connect with TLS (system roots unless --broker-ca is given).
    #[arg(long, env = "STATESTORE_BROKER_TLS")]
    pub broker_tls: Option<bool>,
    /// PEM file with the CA certificates that sign the broker's certificate (implies TLS).
    #[arg(long, env = "STATESTORE_BROKER_CA")]
    pub broker_ca: Option<PathBuf>,
    /// PEM client certificate chain for mutual TLS (with --broker-key).
    #[arg(long, env = "STATESTORE_BROKER_CERT")]
    pub broker_cert: Option<PathBuf>,
    /// PEM private key of --broker-cert.
    #[arg(long, env = "STATESTORE_BROKER_KEY")]
    pub broker_key: Option<PathBuf>,
    /// MQTT user name.
    #[arg(long, env = "STATESTORE_BROKER_USERNAME")]
    pub broker_username: Option<String>,
    /// MQTT password (prefer the environment variable or the config file over the flag).
    #[arg(long, env = "STATESTORE_BROKER_PASSWORD", hide_env_values = true)]
    pub broker_password: Option<String>,
    /// How long the broker keeps this node's session (and the requests it has not acknowledged)
    /// while the node is away, in seconds. Default 300.
    #[arg(long, env = "STATESTORE_BROKER_SESSION_EXPIRY_SECS")]
    pub broker_session_expiry_secs: Option<u32>,
    /// MQTT keep-alive in seconds. Default 10.
    #[arg(long, env = "STATESTORE_BROKER_KEEP_ALIVE_SECS")]
    pub broker_keep_alive_secs: Option<u64>,
    /// Most QoS 1 publishes (responses, notifications) in flight to the broker, and most
    /// unacknowledged requests the broker may send this node. Default 1000.
    #[arg(long, env = "STATESTORE_BROKER_INFLIGHT")]
    pub broker_inflight: Option<u16>,
    /// Most requests one client (its `__srcId`, else its response topic) may have in flight at
    /// the leader; more are answered `too many requests in flight for this client`, so one
    /// client cannot take the whole receive window. Default: half of --broker-inflight.
    #[arg(long, env = "STATESTORE_BROKER_CLIENT_INFLIGHT")]
    pub broker_client_inflight: Option<u16>,
    /// Largest MQTT packet accepted from the broker, in bytes. Default 16777216 (16 MiB).
    #[arg(long, env = "STATESTORE_BROKER_MAX_PACKET_SIZE")]
    pub broker_max_packet_size: Option<u32>,
    /// QoS at which a follower subscribes to the request topic: 0 (default; the broker does not
    /// keep followers' copies in flight) or 1 (a follower away from the broker gets what it
    /// missed when it returns). The leader always subscribes at QoS 1.
    #[arg(long, env = "STATESTORE_BROKER_FOLLOWER_QOS")]
    pub broker_follower_qos: Option<u8>,
    /// Longest round trip to the broker, in milliseconds, at which requests still count as
    /// reaching this node: a node whose probes take longer is not ready, does not stand for
    /// election and, leading, hands leadership to a node whose broker answers in time, as one
    /// without its broker does. 0 sends no probes (for a broker that refuses publishes to the
    /// probe topic by disconnecting). Default 2000.
    #[arg(long, env = "STATESTORE_BROKER_ROUND_TRIP_BOUND_MS")]
    pub broker_round_trip_bound_ms: Option<u64>,
    /// A TOML file mapping MQTT client ids (the `clients/<id>/` of their response topics) to the
    /// key prefixes each may use; other keys are answered `not authorized` (docs/operations.md, Security).
    /// Every node must load the same file. Default: none, every client may use every key.
    #[arg(long, env = "STATESTORE_AUTHORIZATION_FILE")]
    pub authorization_file: Option<PathBuf>,
    /// The response topics requests may name, comma-separated patterns: `+` is any one segment,
    /// a final `#` the rest, and `{client}`, once in each, the segment that names the client
    /// (for authorization, KEYNOTIFY and the per-client quotas). A request naming any other
    /// topic is dropped unanswered, as one without a response topic is. Default
    /// `clients/{client}/#`.
    #[arg(long, env = "STATESTORE_RESPONSE_TOPICS")]
    pub response_topics: Option<String>,
}

impl Args {
    /// These settings, with each one they leave unset taken from `file`.
    fn filled_from(self, file: Args) -> Args {
        let (config, restored) = (self.config.clone(), self.restored);
        let (create_cluster_secret, insecure_no_auth) = (self.create_cluster_secret, self.insecure_no_auth);
        // Both are the same plain struct of options: as JSON objects, a null is an unset setting.
        let given = serde_json::to_value(self).expect("settings serialize");
        let file = serde_json::to_value(file).expect("settings serialize");
        let (serde_json::Value::Object(mut given), serde_json::Value::Object(file)) = (given, file) else {
            unreachable!("settings serialize as a JSON object")
        };
        for (name, value) in file {
            let slot = given.entry(name).or_insert(serde_json::Value::Null);
            if slot.is_null() {
                *slot = value;
            }
        }
        let merged: Args = serde_json::from_value(serde_json::Value::Object(given)).expect("settings deserialize");
        Args { config, restored, create_cluster_secret, insecure_no_auth, ..merged }
    }
}

/// A complete, checked node configuration.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub id: NodeId,
    pub listen: SocketAddr,
    pub advertise: String,
    pub data_dir: PathBuf,
    pub initial_members: BTreeMap<NodeId, String>,
    /// Where to reach peers whose advertised URL this node cannot use.
    pub peer_routes: BTreeMap<NodeId, String>,
    /// What Raft RPC, membership changes and `/v1/command` must carry; `None`: nothing.
    pub cluster_secret: Option<ClusterSecret>,
    /// HTTPS between nodes, with client certificates; `None`: plain HTTP.
    pub tls: Option<NodeTls>,
    pub heartbeat: Duration,
    /// Clocks further apart than this disagree (zero: never).
    pub max_clock_offset: Duration,
    /// A leader whose log fsync runs longer hands leadership over (zero: never).
    pub max_log_fsync: Duration,
    /// The data directory holds a restored backup (`--restored`).
    pub restored: bool,
    pub election_min: Duration,
    pub election_max: Duration,
    pub snapshot_every: u64,
    /// Log bytes since the last snapshot that trigger the next.
    pub snapshot_log_bytes: u64,
    /// Bytes a second a snapshot build writes at most; `None`: no limit.
    pub snapshot_write_rate: Option<u64>,
    /// Bytes a second a snapshot being received, then installed, is written at most; `None`:
    /// no limit.
    pub snapshot_install_rate: Option<u64>,
    /// Applied entries or operations not yet on disk that trigger a flush.
    pub flush_after: FlushAfter,
    pub logs_kept: u64,
    /// Most `/v1/command` requests served at once.
    pub max_http_commands: usize,
    /// Connections, header and body deadlines, TLS handshakes of the node's port.
    pub http_limits: HttpLimits,
    /// Async runtime worker threads; `None`: one per core.
    pub worker_threads: Option<usize>,
    pub log: String,
    /// Log lines as JSON objects instead of text.
    pub log_json: bool,
    /// The MQTT front end, when a broker is configured.
    pub broker: Option<BrokerConfig>,
}

/// How a node reaches its MQTT5 broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerConfig {
    pub host: String,
    pub port: u16,
    pub client_id: String,
    pub tls: Option<TlsConfig>,
    pub username: Option<String>,
    pub password: Option<String>,
    pub session_expiry: Duration,
    pub keep_alive: Duration,
    pub inflight: u16,
    /// Most requests of one client in flight at the leader.
    pub client_inflight: u16,
    pub max_packet_size: u32,
    /// QoS of a follower's request subscription (0 or 1); the leader's is always 1.
    pub follower_qos: u8,
    /// Longest broker round trip at which requests still count as reaching this node; zero:
    /// no probes.
    pub round_trip_bound: Duration,
    /// Which keys each client may use; `None`: every key.
    pub access: Option<KeyAccess>,
    /// The response topics requests may name, and the segment of each that names the client.
    pub response_topics: ResponseTopics,
}

pub use statestore_api::secret::ClusterSecret;

use crate::access::KeyAccess;
pub use crate::http::serve::HttpLimits;
pub use crate::state_flush::FlushAfter;

/// The files of a node's TLS identity; every node of a cluster trusts the same CA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

impl NodeTls {
    /// How this node connects to its peers: trusting only the CA, presenting its certificate.
    pub fn client_config(&self) -> anyhow::Result<rustls::ClientConfig> {
        statestore_api::tls::client_config(&TlsConfig {
            ca: Some(self.ca.clone()),
            client_auth: Some((self.cert.clone(), self.key.clone())),
        })
    }

    /// The URL scheme of every node of a cluster with TLS.
    pub const SCHEME: &'static str = "https://";
}

/// The default of `--max-clock-offset-ms`.
pub const DEFAULT_MAX_CLOCK_OFFSET_MS: u64 = 1_000;

/// The default of `--max-log-fsync-ms`.
pub const DEFAULT_MAX_LOG_FSYNC_MS: u64 = 1_000;

/// TLS to the broker: the CA to trust (system roots when `None`) and an optional client identity.
pub use statestore_api::tls::TlsConfig;

/// A configuration that cannot work.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("reading the config file {path}: {detail}")]
    File { path: String, detail: String },
    #[error("--log-format must be `text` or `json`, not {0:?}")]
    LogFormat(String),
    #[error("--worker-threads must be at least 1")]
    WorkerThreads,
    #[error("{0} must be at least 1")]
    HttpLimit(&'static str),
    #[error("--id is required (or STATESTORE_ID, or `id` in the config file)")]
    MissingId,
    #[error("--id must be a positive integer")]
    ZeroId,
    #[error("--initial-members: {0}")]
    InitialMembers(String),
    #[error("--peer-routes: {0}")]
    PeerRoutes(String),
    #[error("--advertise must be an {scheme} URL, not {url:?}")]
    Advertise { url: String, scheme: &'static str },
    #[error("tls: {0}")]
    Tls(String),
    #[error("timings: {0}")]
    Timings(String),
    #[error("broker: {0}")]
    Broker(String),
    #[error("cluster secret: {0}")]
    Secret(String),
    #[error("--authorization-file: {0}")]
    Authorization(String),
    #[error("{flag} must be 0 (no limit) or at least {MIN_SNAPSHOT_RATE} bytes a second, not {rate}")]
    SnapshotRate { flag: &'static str, rate: u64 },
    #[error(
        "--listen {0} is not a loopback address and the node has neither a cluster secret \
         (--cluster-secret-file, STATESTORE_CLUSTER_SECRET) nor TLS (--tls-cert, --tls-key, --tls-ca): \
         give one, or --insecure-no-auth (STATESTORE_INSECURE_NO_AUTH=true) to serve every route to anyone"
    )]
    Unprotected(SocketAddr),
}

/// The default of `--log`.
pub const DEFAULT_LOG_FILTER: &str = "warn,statestore=info";

/// The default of `--snapshot-every`.
pub const DEFAULT_SNAPSHOT_EVERY: u64 = 10_000;

/// The default of `--snapshot-log-bytes`.
pub const DEFAULT_SNAPSHOT_LOG_BYTES: u64 = 64 << 20;

/// The default of `--snapshot-write-rate`, bytes a second: no limit (see docs/benchmarks.md,
/// *Snapshot builds written out and paced*, for what a limit gains and costs).
pub const DEFAULT_SNAPSHOT_WRITE_RATE: u64 = 0;

/// The default of `--snapshot-install-rate`, bytes a second: no limit (see docs/benchmarks.md,
/// *Snapshot installs paced*, for what a limit gains and costs).
pub const DEFAULT_SNAPSHOT_INSTALL_RATE: u64 = 0;

/// The lowest rate `--snapshot-write-rate` and `--snapshot-install-rate` take (1 MiB/s): a
/// leader sends a snapshot in chunks of 3 MiB, and a lower rate would hold a 1 M-key snapshot
/// for many minutes.
pub const MIN_SNAPSHOT_RATE: u64 = 1 << 20;

/// The defaults of `--flush-after-entries` and `--flush-after-operations`.
pub const DEFAULT_FLUSH_AFTER: FlushAfter = FlushAfter { entries: 2_000, operations: 20_000 };

impl NodeConfig {
    pub fn from_args(args: Args) -> Result<NodeConfig, ConfigError> {
        let args = match args.config.clone() {
            Some(path) => args.filled_from(read_file(&path)?),
            None => args,
        };
        let id = args.id.ok_or(ConfigError::MissingId)?;
        if id == 0 {
            return Err(ConfigError::ZeroId);
        }
        let broker = broker_config(id, &args)?;
        let http_limits = http_limits(&args)?;
        let listen = args.listen.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 7400)));
        let tls = node_tls(&args)?;
        let scheme = if tls.is_some() { NodeTls::SCHEME } else { "http://" };
        let advertise = args.advertise.unwrap_or_else(|| format!("{scheme}{listen}"));
        if !advertise.starts_with(scheme) || advertise.len() <= scheme.len() {
            return Err(ConfigError::Advertise { url: advertise, scheme });
        }
        let initial_members = match args.initial_members {
            Some(list) => parse_members(&list)?,
            None => BTreeMap::new(),
        };
        let peer_routes = match args.peer_routes {
            Some(list) => parse_members(&list).map_err(|e| match e {
                ConfigError::InitialMembers(detail) => ConfigError::PeerRoutes(detail),
                other => other,
            })?,
            None => BTreeMap::new(),
        };
        for (flag, list) in [("--initial-members", &initial_members), ("--peer-routes", &peer_routes)] {
            if let Some(url) = list.values().find(|url| !url.starts_with(scheme)) {
                return Err(ConfigError::Tls(format!("{flag} lists {url}, but this node's peers are {scheme} URLs")));
            }
        }
        if let Some(address) = initial_members.get(&id) {
            if address.trim_end_matches('/') != advertise.trim_end_matches('/') {
                return Err(ConfigError::InitialMembers(format!(
                    "node {id} is listed at {address} but advertises {advertise}"
                )));
            }
        }
        let cluster_secret = match args.cluster_secret_file {
            Some(path) if args.create_cluster_secret => {
                Some(ClusterSecret::read_or_create(&path).map_err(ConfigError::Secret)?)
            }
            Some(path) => Some(ClusterSecret::from_file(&path).map_err(ConfigError::Secret)?),
            None if args.create_cluster_secret => {
                return Err(ConfigError::Secret("--create-cluster-secret needs --cluster-secret-file".into()))
            }
            None => secret_from_env()?,
        };
        check_protected(listen, cluster_secret.is_some(), tls.is_some(), args.insecure_no_auth)?;
        let config = NodeConfig {
            id,
            listen,
            advertise: advertise.trim_end_matches('/').to_string(),
            data_dir: args.data_dir.unwrap_or_else(|| PathBuf::from(format!("data/node-{id}"))),
            initial_members,
            peer_routes,
            cluster_secret,
            tls,
            heartbeat: Duration::from_millis(args.heartbeat_ms.unwrap_or(50)),
            restored: args.restored,
            max_clock_offset: Duration::from_millis(args.max_clock_offset_ms.unwrap_or(DEFAULT_MAX_CLOCK_OFFSET_MS)),
            max_log_fsync: Duration::from_millis(args.max_log_fsync_ms.unwrap_or(DEFAULT_MAX_LOG_FSYNC_MS)),
            election_min: Duration::from_millis(args.election_min_ms.unwrap_or(150)),
            election_max: Duration::from_millis(args.election_max_ms.unwrap_or(300)),
            snapshot_every: args.snapshot_every.unwrap_or(DEFAULT_SNAPSHOT_EVERY),
            snapshot_log_bytes: args.snapshot_log_bytes.unwrap_or(DEFAULT_SNAPSHOT_LOG_BYTES),
            snapshot_write_rate: snapshot_rate(
                "--snapshot-write-rate",
                args.snapshot_write_rate.unwrap_or(DEFAULT_SNAPSHOT_WRITE_RATE),
            )?,
            snapshot_install_rate: snapshot_rate(
                "--snapshot-install-rate",
                args.snapshot_install_rate.unwrap_or(DEFAULT_SNAPSHOT_INSTALL_RATE),
            )?,
            flush_after: FlushAfter {
                entries: args.flush_after_entries.unwrap_or(DEFAULT_FLUSH_AFTER.entries),
                operations: args.flush_after_operations.unwrap_or(DEFAULT_FLUSH_AFTER.operations),
            },
            logs_kept: args.logs_kept.unwrap_or(1_000),
            max_http_commands: args.max_http_commands.unwrap_or(1024).max(1),
            http_limits,
            worker_threads: match args.worker_threads {
                Some(0) => return Err(ConfigError::WorkerThreads),
                threads => threads,
            },
            log: args.log.unwrap_or_else(|| DEFAULT_LOG_FILTER.to_string()),
            log_json: match args.log_format.as_deref() {
                None | Some("text") => false,
                Some("json") => true,
                Some(other) => return Err(ConfigError::LogFormat(other.to_string())),
            },
            broker,
        };
        config.check_timings()?;
        Ok(config)
    }

    fn check_timings(&self) -> Result<(), ConfigError> {
        let timings = |detail: &str| Err(ConfigError::Timings(detail.to_string()));
        if self.heartbeat.is_zero() {
            return timings("the heartbeat interval must be positive");
        }
        if self.election_min <= self.heartbeat * 2 {
            return timings("the election timeout must exceed two heartbeat intervals");
        }
        if self.election_max <= self.election_min {
            return timings("the election timeout's upper bound must exceed its lower bound");
        }
        if self.snapshot_every == 0 {
            return timings("--snapshot-every must be positive");
        }
        if self.snapshot_log_bytes == 0 {
            return timings("--snapshot-log-bytes must be positive");
        }
        if self.flush_after.entries == 0 || self.flush_after.operations == 0 {
            return timings("--flush-after-entries and --flush-after-operations must be positive");
        }
        Ok(())
    }
}

/// A node reachable from other machines guards its routes with a cluster secret or TLS, unless
/// told in so many words not to (`--insecure-no-auth`). On loopback only this machine reaches it.
pub fn check_protected(listen: SocketAddr, secret: bool, tls: bool, insecure: bool) -> Result<(), ConfigError> {
    if listen.ip().is_loopback() || secret || tls || insecure {
        return Ok(());
    }
    Err(ConfigError::Unprotected(listen))
}

/// The limits of the node's port; each at least 1.
fn http_limits(args: &Args) -> Result<HttpLimits, ConfigError> {
    let default = HttpLimits::DEFAULT;
    let positive = |flag: &'static str, value: Option<u64>, default: u64| match value {
        Some(0) => Err(ConfigError::HttpLimit(flag)),
        value => Ok(value.unwrap_or(default)),
    };
    let count = |flag, value: Option<usize>, default: usize| {
        positive(flag, value.map(|v| v as u64), default as u64).map(|v| v as usize)
    };
    Ok(HttpLimits {
        max_connections: count("--http-max-connections", args.http_max_connections, default.max_connections)?,
        header_timeout: Duration::from_millis(positive(
            "--http-header-timeout-ms",
            args.http_header_timeout_ms,
            default.header_timeout.as_millis() as u64,
        )?),
        body_timeout: Duration::from_millis(positive(
            "--http-body-timeout-ms",
            args.http_body_timeout_ms,
            default.body_timeout.as_millis() as u64,
        )?),
        max_handshakes: count("--tls-max-handshakes", args.tls_max_handshakes, default.max_handshakes)?,
    })
}

/// TLS between nodes: all three files, or none.
fn node_tls(args: &Args) -> Result<Option<NodeTls>, ConfigError> {
    let cert = args.tls_cert.clone();
    let key = args.tls_key.clone();
    let ca = args.tls_ca.clone();
    let (cert, key, ca) = match (cert, key, ca) {
        (None, None, None) => return Ok(None),
        (Some(cert), Some(key), Some(ca)) => (cert, key, ca),
        _ => return Err(ConfigError::Tls("--tls-cert, --tls-key and --tls-ca go together".into())),
    };
    for path in [&cert, &key, &ca] {
        if !path.is_file() {
            return Err(ConfigError::Tls(format!("{} is not a readable file", path.display())));
        }
    }
    Ok(Some(NodeTls { cert, key, ca }))
}

/// The secret in `STATESTORE_CLUSTER_SECRET`, if set and not empty.
fn secret_from_env() -> Result<Option<ClusterSecret>, ConfigError> {
    use statestore_api::secret::SECRET_ENV;
    match std::env::var(SECRET_ENV).ok().filter(|text| !text.is_empty()) {
        Some(text) => {
            ClusterSecret::new(&text).map(Some).map_err(|e| ConfigError::Secret(format!("{SECRET_ENV}: {e}")))
        }
        None => Ok(None),
    }
}

/// The broker settings, or `None` when no broker is given.
fn broker_config(id: NodeId, args: &Args) -> Result<Option<BrokerConfig>, ConfigError> {
    let error = |detail: String| Err(ConfigError::Broker(detail));
    let access_file = args.authorization_file.clone();
    let Some(address) = args.broker.clone() else {
        if access_file.is_some() {
            return Err(ConfigError::Authorization("it authorizes MQTT clients: it needs --broker".into()));
        }
        return Ok(None);
    };
    let access = match access_file {
        Some(path) => Some(KeyAccess::from_file(&path).map_err(ConfigError::Authorization)?),
        None => None,
    };
    let response_topics = match &args.response_topics {
        Some(list) => {
            ResponseTopics::parse(list).map_err(|e| ConfigError::Broker(format!("--response-topics: {e}")))?
        }
        None => ResponseTopics::default(),
    };
    let Some((host, port)) = address.rsplit_once(':') else {
        return error(format!("{address:?} is not host:port"));
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let Ok(port) = port.parse::<u16>() else {
        return error(format!("{port:?} in {address:?} is not a port"));
    };
    if host.is_empty() || port == 0 {
        return error(format!("{address:?} is not host:port"));
    }
    let prefix = args.broker_client_id_prefix.clone().unwrap_or_else(|| "statestore".to_string());
    let ca = args.broker_ca.clone();
    let cert = args.broker_cert.clone();
    let key = args.broker_key.clone();
    let client_auth = match (cert, key) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => return error("--broker-cert and --broker-key go together".into()),
    };
    let tls_on = args.broker_tls.unwrap_or(false) || ca.is_some() || client_auth.is_some();
    for path in ca.iter().chain(client_auth.iter().flat_map(|(c, k)| [c, k])) {
        if !path.is_file() {
            return error(format!("{} is not a readable file", path.display()));
        }
    }
    let username = args.broker_username.clone();
    let password = args.broker_password.clone();
    if password.is_some() && username.is_none() {
        return error("a password needs --broker-username".into());
    }
    let inflight = args.broker_inflight.unwrap_or(1000);
    if inflight == 0 {
        return error("--broker-inflight must be positive".into());
    }
    let client_inflight = args.broker_client_inflight.unwrap_or(inflight.div_ceil(2));
    if client_inflight == 0 || client_inflight > inflight {
        return error(format!("--broker-client-inflight must be between 1 and --broker-inflight ({inflight})"));
    }
    let max_packet_size = args.broker_max_packet_size.unwrap_or(16 << 20);
    if max_packet_size < 64 << 10 {
        return error("--broker-max-packet-size must be at least 65536".into());
    }
    let follower_qos = args.broker_follower_qos.unwrap_or(0);
    if follower_qos > 1 {
        return error(format!("--broker-follower-qos must be 0 or 1, not {follower_qos}"));
    }
    let keep_alive = args.broker_keep_alive_secs.unwrap_or(10);
    if keep_alive < 5 {
        return error("--broker-keep-alive-secs must be at least 5".into());
    }
    let round_trip_bound_ms = args.broker_round_trip_bound_ms.unwrap_or(2000);
    if (1..100).contains(&round_trip_bound_ms) {
        return error("--broker-round-trip-bound-ms must be 0 (no probes) or at least 100".into());
    }
    Ok(Some(BrokerConfig {
        host: host.to_string(),
        port,
        client_id: format!("{prefix}-{id}"),
        tls: tls_on.then_some(TlsConfig { ca, client_auth }),
        username,
        password,
        session_expiry: Duration::from_secs(u64::from(args.broker_session_expiry_secs.unwrap_or(300))),
        keep_alive: Duration::from_secs(keep_alive),
        inflight,
        client_inflight,
        max_packet_size,
        follower_qos,
        round_trip_bound: Duration::from_millis(round_trip_bound_ms),
        access,
        response_topics,
    }))
}

/// A snapshot rate given to `flag`: none for 0 (no limit), refused under [`MIN_SNAPSHOT_RATE`].
fn snapshot_rate(flag: &'static str, rate: u64) -> Result<Option<u64>, ConfigError> {
    match rate {
        0 => Ok(None),
        rate if rate < MIN_SNAPSHOT_RATE => Err(ConfigError::SnapshotRate { flag, rate }),
        rate => Ok(Some(rate)),
    }
}

fn read_file(path: &Path) -> Result<Args, ConfigError> {
    let error = |detail: String| ConfigError::File { path: path.display().to_string(), detail };
    let text = std::fs::read_to_string(path).map_err(|e| error(e.to_string()))?;
    toml::from_str(&text).map_err(|e| error(e.message().to_string()))
}

/// Parses `1=http://host:port,2=http://host:port` (or `https://`).
pub fn parse_members(list: &str) -> Result<BTreeMap<NodeId, String>, ConfigError> {
    let error = |detail: String| ConfigError::InitialMembers(detail);
    let mut members = BTreeMap::new();
    for item in list.split(',').map(str::trim).filter(|item| !item.is_empty()) {
        let (id, address) = item.split_once('=').ok_or_else(|| error(format!("{item:?} is not id=url")))?;
        let id: NodeId = id.trim().parse().map_err(|_| error(format!("{id:?} is not a node id")))?;
        if id == 0 {
            return Err(error("node ids are positive".into()));
        }
        let address = address.trim().trim_end_matches('/');
        let rest = address.strip_prefix("http://").or_else(|| address.strip_prefix("https://"));
        if rest.is_none_or(str::is_empty) {
            return Err(error(format!("{address:?} is not an http:// or https:// URL")));
        }
        if members.insert(id, address.to_string()).is_some() {
            return Err(error(format!("node {id} is listed twice")));
        }
    }
    if members.is_empty() {
        return Err(error("the list is empty".into()));
    }
    Ok(members)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Args {
        Args::try_parse_from(std::iter::once("statestore").chain(list.iter().copied())).unwrap()
    }

    #[test]
    fn a_node_off_loopback_needs_a_secret_tls_or_the_insecure_flag() {
        let public: SocketAddr = "0.0.0.0:7400".parse().unwrap();
        let refused = check_protected(public, false, false, false).unwrap_err();
        assert_eq!(refused, ConfigError::Unprotected(public));
        let text = refused.to_string();
        for flag in ["--cluster-secret-file", "--tls-cert", "--insecure-no-auth", "STATESTORE_INSECURE_NO_AUTH"] {
            assert!(text.contains(flag), "{text}");
        }
        for (secret, tls, insecure) in [(true, false, false), (false, true, false), (false, false, true)] {
            assert_eq!(check_protected(public, secret, tls, insecure), Ok(()), "{secret} {tls} {insecure}");
        }
        for loopback in ["127.0.0.1:7400", "127.0.0.9:1", "[::1]:7400"] {
            assert_eq!(check_protected(loopback.parse().unwrap(), false, false, false), Ok(()), "{loopback}");
        }
        for public in ["10.0.0.1:7400", "[::]:7400"] {
            assert!(check_protected(public.parse().unwrap(), false, false, false).is_err(), "{public}");
        }
        let given = |list: &[&str]| NodeConfig::from_args(args(list)).map(|config| config.listen);
        assert_eq!(given(&["--id", "1", "--listen", "0.0.0.0:7400"]), Err(ConfigError::Unprotected(public)));
        assert_eq!(given(&["--id", "1", "--listen", "0.0.0.0:7400", "--insecure-no-auth"]), Ok(public));
    }

    #[test]
    fn a_cluster_secret_file_is_created_once_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        let file = path.to_str().unwrap();
        let unasked = NodeConfig::from_args(args(&["--id", "1", "--cluster-secret-file", file])).unwrap_err();
        assert!(matches!(unasked, ConfigError::Secret(_)), "{unasked}");
        let create = ["--id", "1", "--cluster-secret-file", file, "--create-cluster-secret", "--listen", "0.0.0.0:1"];
        let first = NodeConfig::from_args(args(&create)).unwrap().cluster_secret.unwrap();
        let second = NodeConfig::from_args(args(&create)).unwrap().cluster_secret.unwrap();
        assert_eq!(first, second, "the file is read, not made again");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let alone = NodeConfig::from_args(args(&["--id", "1", "--create-cluster-secret"])).unwrap_err();
        assert!(alone.to_string().contains("--cluster-secret-file"), "{alone}");
    }

    #[test]
    fn defaults_fill_what_is_not_given() {
        let config = NodeConfig::from_args(args(&["--id", "2"])).unwrap();
        assert_eq!(config.listen.to_string(), "127.0.0.1:7400");
        assert_eq!(config.advertise, "http://127.0.0.1:7400");
        assert_eq!(config.data_dir, PathBuf::from("data/node-2"));
        assert_eq!(config.heartbeat, Duration::from_millis(50));
        assert_eq!(
            (config.election_min, config.election_max),
            (Duration::from_millis(150), Duration::from_millis(300))
        );
        assert_eq!(config.snapshot_write_rate, None);
        assert_eq!(config.snapshot_install_rate, None);
    }

    #[test]
    fn a_snapshot_rate_of_zero_is_no_limit_and_one_under_a_mib_a_second_is_refused() {
        for flag in ["--snapshot-write-rate", "--snapshot-install-rate"] {
            let given = |rate: &str| {
                NodeConfig::from_args(args(&["--id", "1", flag, rate]))
                    .map(|config| (config.snapshot_write_rate, config.snapshot_install_rate))
            };
            let set = |rate| match flag {
                "--snapshot-write-rate" => (rate, None),
                _ => (None, rate),
            };
            assert_eq!(given("0"), Ok((None, None)), "{flag}");
            assert_eq!(given("1048576"), Ok(set(Some(1 << 20))), "{flag}");
            let refused = given("1048575").unwrap_err();
            assert_eq!(refused, ConfigError::SnapshotRate { flag, rate: 1048575 });
            assert_eq!(
                refused.to_string(),
                format!("{flag} must be 0 (no limit) or at least 1048576 bytes a second, not 1048575")
            );
        }
    }

    #[test]
    fn members_parse_and_bad_lists_are_refused() {
        let members = parse_members("1=http://a:1, 2=http://b:2/").unwrap();
        assert_eq!(members.get(&2).map(String::as_str), Some("http://b:2"));
        for bad in ["", "1", "x=http://a:1", "0=http://a:1", "1=ftp://a", "1=http://", "1=http://a,1=http://b"] {
            assert!(matches!(parse_members(bad), Err(ConfigError::InitialMembers(_))), "{bad:?}");
        }
    }

    #[test]
    fn wrong_settings_are_refused_with_a_reason() {
        assert_eq!(NodeConfig::from_args(args(&[])).unwrap_err(), ConfigError::MissingId);
        assert_eq!(NodeConfig::from_args(args(&["--id", "0"])).unwrap_err(), ConfigError::ZeroId);
        let timings = NodeConfig::from_args(args(&["--id", "1", "--election-min-ms", "90"])).unwrap_err();
        assert!(matches!(timings, ConfigError::Timings(_)));
        for flag in ["--snapshot-every", "--snapshot-log-bytes", "--flush-after-entries", "--flush-after-operations"] {
            let zero = NodeConfig::from_args(args(&["--id", "1", flag, "0"])).unwrap_err();
            assert!(matches!(zero, ConfigError::Timings(_)), "{flag} 0: {zero}");
            assert!(zero.to_string().contains(flag), "{flag} 0 names the flag: {zero}");
        }
        let elsewhere =
            NodeConfig::from_args(args(&["--id", "1", "--initial-members", "1=http://10.0.0.9:7400"])).unwrap_err();
        assert!(matches!(elsewhere, ConfigError::InitialMembers(_)));
        assert!(matches!(
            NodeConfig::from_args(args(&["--id", "1", "--advertise", "10.0.0.1:7400"])).unwrap_err(),
            ConfigError::Advertise { .. }
        ));
    }

    #[test]
    fn peer_routes_parse_and_bad_ones_name_the_flag() {
        let config = NodeConfig::from_args(args(&["--id", "1", "--peer-routes", "2=http://proxy:9002/"])).unwrap();
        assert_eq!(config.peer_routes.get(&2).map(String::as_str), Some("http://proxy:9002"));
        assert!(NodeConfig::from_args(args(&["--id", "1"])).unwrap().peer_routes.is_empty());
        let wrong = NodeConfig::from_args(args(&["--id", "1", "--peer-routes", "2=ftp://proxy"])).unwrap_err();
        assert!(matches!(wrong, ConfigError::PeerRoutes(_)), "{wrong:?}");
        assert!(wrong.to_string().starts_with("--peer-routes: "), "{wrong}");
    }

    #[test]
    fn an_authorization_file_is_read_and_a_wrong_one_refuses_to_start() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("access.toml");
        std::fs::write(&good, "[clients]\n\"a\" = [\"a/\"]\n").unwrap();
        let flag = format!("--authorization-file={}", good.display());
        let broker = NodeConfig::from_args(args(&["--id", "1", "--broker", "h:1", &flag])).unwrap().broker.unwrap();
        assert_eq!(broker.access, Some(KeyAccess::parse("[clients]\n\"a\" = [\"a/\"]\n").unwrap()));
        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, "[clients]\n\"a\" = \"a/\"\n").unwrap();
        let missing = dir.path().join("missing.toml");
        for (list, needle) in [
            (vec!["--broker", "h:1", &format!("--authorization-file={}", bad.display())], "bad.toml"),
            (vec!["--broker", "h:1", &format!("--authorization-file={}", missing.display())], "missing.toml"),
            (vec![&flag[..]], "needs --broker"),
        ] {
            let mut all = vec!["--id", "1"];
            all.extend(list.iter().map(|s| &s[..]));
            let error = NodeConfig::from_args(args(&all)).unwrap_err();
            assert!(matches!(error, ConfigError::Authorization(_)), "{error:?}");
            assert!(
                error.to_string().starts_with("--authorization-file: ") && error.to_string().contains(needle),
                "{error}"
            );
        }
    }

    #[test]
    fn log_format_is_text_or_json() {
        assert!(!NodeConfig::from_args(args(&["--id", "1"])).unwrap().log_json);
        assert!(!NodeConfig::from_args(args(&["--id", "1", "--log-format", "text"])).unwrap().log_json);
        assert!(NodeConfig::from_args(args(&["--id", "1", "--log-format", "json"])).unwrap().log_json);
    }

    #[test]
    fn worker_threads_default_to_the_cores_and_are_at_least_one() {
        assert_eq!(NodeConfig::from_args(args(&["--id", "1"])).unwrap().worker_threads, None);
        assert_eq!(
            NodeConfig::from_args(args(&["--id", "1", "--worker-threads", "1"])).unwrap().worker_threads,
            Some(1)
        );
        assert_eq!(
            NodeConfig::from_args(args(&["--id", "1", "--worker-threads", "0"])).unwrap_err(),
            ConfigError::WorkerThreads
        );
        let wrong = NodeConfig::from_args(args(&["--id", "1", "--log-format", "xml"])).unwrap_err();
        assert_eq!(wrong, ConfigError::LogFormat("xml".into()));
        assert_eq!(wrong.to_string(), "--log-format must be `text` or `json`, not \"xml\"");
    }

    #[test]
    fn broker_settings_parse_and_wrong_ones_are_refused() {
        assert_eq!(NodeConfig::from_args(args(&["--id", "1"])).unwrap().broker, None);
        let broker = NodeConfig::from_args(args(&["--id", "4", "--broker", "127.0.0.1:1883"])).unwrap().broker.unwrap();
        assert_eq!((broker.host.as_str(), broker.port, broker.client_id.as_str()), ("127.0.0.1", 1883, "statestore-4"));
        assert_eq!((broker.tls, broker.inflight, broker.session_expiry), (None, 1000, Duration::from_secs(300)));
        assert_eq!(broker.client_inflight, 500);
        assert_eq!(broker.follower_qos, 0);
        assert_eq!(broker.round_trip_bound, Duration::from_secs(2));
        let bound =
            NodeConfig::from_args(args(&["--id", "1", "--broker", "h:1", "--broker-round-trip-bound-ms", "500"]));
        assert_eq!(bound.unwrap().broker.unwrap().round_trip_bound, Duration::from_millis(500));
        let off = NodeConfig::from_args(args(&["--id", "1", "--broker", "h:1", "--broker-round-trip-bound-ms", "0"]));
        assert_eq!(off.unwrap().broker.unwrap().round_trip_bound, Duration::ZERO);
        let qos1 = NodeConfig::from_args(args(&["--id", "1", "--broker", "h:1", "--broker-follower-qos", "1"]));
        assert_eq!(qos1.unwrap().broker.unwrap().follower_qos, 1);
        let named = NodeConfig::from_args(args(&[
            "--id",
            "2",
            "--broker",
            "mqtt.example:8883",
            "--broker-tls",
            "true",
            "--broker-client-id-prefix",
            "edge",
        ]))
        .unwrap()
        .broker
        .unwrap();
        assert_eq!(named.client_id, "edge-2");
        assert_eq!(named.tls, Some(TlsConfig { ca: None, client_auth: None }));
        for bad in [
            &["--broker", "nohost"][..],
            &["--broker", "host:notaport"],
            &["--broker", ":1883"],
            &["--broker", "h:1", "--broker-cert", "/etc/hostname"],
            &["--broker", "h:1", "--broker-ca", "/does/not/exist.pem"],
            &["--broker", "h:1", "--broker-password", "p"],
            &["--broker", "h:1", "--broker-inflight", "0"],
            &["--broker", "h:1", "--broker-client-inflight", "0"],
            &["--broker", "h:1", "--broker-inflight", "10", "--broker-client-inflight", "11"],
            &["--broker", "h:1", "--broker-max-packet-size", "1000"],
            &["--broker", "h:1", "--broker-follower-qos", "2"],
            &["--broker", "h:1", "--broker-round-trip-bound-ms", "99"],
        ] {
            let mut list = vec!["--id", "1"];
            list.extend_from_slice(bad);
            assert!(matches!(NodeConfig::from_args(args(&list)), Err(ConfigError::Broker(_))), "{bad:?}");
        }
    }

    #[test]
    fn the_file_fills_in_and_flags_win() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        std::fs::write(&path, "id = 3\nheartbeat_ms = 40\nlisten = \"127.0.0.1:9000\"\n").unwrap();
        let config =
            NodeConfig::from_args(args(&["--config", path.to_str().unwrap(), "--listen", "127.0.0.1:9100"])).unwrap();
        assert_eq!((config.id, config.heartbeat, config.listen.port()), (3, Duration::from_millis(40), 9100));
        std::fs::write(&path, "id = 3\nbroker = \"h:1\"\nbroker_inflight = 10\nmax_clock_offset_ms = 0\n").unwrap();
        let config =
            NodeConfig::from_args(args(&["--config", path.to_str().unwrap(), "--broker-inflight", "20", "--restored"]))
                .unwrap();
        let broker = config.broker.unwrap();
        assert_eq!((broker.host.as_str(), broker.inflight, broker.client_inflight), ("h", 20, 10));
        assert_eq!((config.max_clock_offset, config.restored), (Duration::ZERO, true));
        // Unknown keys, and the settings only flags give, are refused with the file's name.
        for wrong in ["id = 3\nunknown = 1\n", "id = 3\nrestored = true\n", "id = 3\nconfig = \"x.toml\"\n"] {
            std::fs::write(&path, wrong).unwrap();
            let error = NodeConfig::from_args(args(&["--config", path.to_str().unwrap()])).unwrap_err();
            assert!(matches!(error, ConfigError::File { .. }), "{wrong:?}: {error:?}");
            assert!(error.to_string().contains("node.toml"), "{error}");
        }
    }
}
