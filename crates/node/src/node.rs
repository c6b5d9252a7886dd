//! A running node: its Raft instance, its storage, and the entry point the front ends use to
//! execute commands — [`Node::execute`] hands requests to the node's [`Pipeline`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use openraft::error::{ForwardToLeader, InitializeError, RaftError};
use openraft::{BasicNode, SnapshotPolicy};
use statestore_protocol::Request;
use statestore_raft::network::PeerChecks;
use statestore_raft::{
    Elector, Handover, NetworkFactory, Node as RaftNode, NodeId, PeerClocks, PeerIdentity, Raft, StateReader,
    StorageMetrics,
};
use statestore_statemachine::{Applied, ClientRequest, Config as MachineConfig, Entry, Operation, Reply};

use crate::clock_watch::{ClockCheck, ClockVerdict};
use crate::config::NodeConfig;
use crate::leader::Leader;
use crate::metrics::Metrics;
use crate::pipeline::{Outcome, Pipeline, Work};

/// Why a command was not executed here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecuteError {
    /// This node is not the leader; `leader_address` is where to go when a leader is known.
    #[error("not the leader; the leader is {}", leader_address.as_deref().unwrap_or("unknown"))]
    ForwardToLeader { leader_id: Option<NodeId>, leader_address: Option<String> },
    /// No quorum answered in time, or the node is shutting down. A write may or may not commit.
    #[error("the cluster is unavailable: {0}")]
    Unavailable(String),
    /// The local storage failed.
    #[error("storage failure: {0}")]
    Storage(String),
}

/// The error a front end answers with when openraft says another node leads.
pub(crate) fn forward(to: &ForwardToLeader<NodeId, RaftNode>) -> ExecuteError {
    ExecuteError::ForwardToLeader {
        leader_id: to.leader_id,
        leader_address: to.leader_node.as_ref().map(|n| n.addr.clone()),
    }
}

/// How a read is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadConsistency {
    /// Leader only, after confirming leadership with a quorum and applying up to its commit index.
    Linearizable,
    /// This node's applied state as it is: may be stale, never wrong about what was applied.
    Local,
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The wall clock a proposal carries. A request whose `__ts` is at or a few milliseconds past
/// `now_ms` would get a version in the request's millisecond with counter 1; stamping one
/// millisecond past the request instead keeps counter 0, as the SDKs' lease-renewal tests
/// expect (PROTOCOL.md §10.8). The push is at most `NUDGE_MS + 1` ms.
pub fn proposal_clock(request: &Request, now_ms: u64) -> u64 {
    const NUDGE_MS: u64 = 5;
    match &request.timestamp {
        Some(ts) if ts.timestamp >= now_ms && ts.timestamp <= now_ms + NUDGE_MS => ts.timestamp + 1,
        _ => now_ms,
    }
}

/// How long one chunk of a snapshot sent to another node may take, the last one included, whose
/// answer waits for the whole install (seconds for a million keys). openraft's default (200 ms)
/// made a leader on a busy machine give up on every chunk and send the snapshot again, for good.
pub const SNAPSHOT_CHUNK_TIMEOUT: Duration = Duration::from_secs(60);

/// A started node.
pub struct Node {
    pub id: NodeId,
    pub advertise: String,
    pub raft: Raft,
    pub reader: StateReader,
    /// The Raft log, read for its entries' range when the node stops.
    log: statestore_raft::LogReader,
    pub metrics: Metrics,
    /// The request path every front end and leader duty submits to.
    pub pipeline: Pipeline,
    /// What this node does while it leads: expiry, notification publishing and confirmation.
    pub leader: Leader,
    /// Decides when this node stands for election, and answers other nodes' pre-votes.
    pub elector: Elector,
    /// The quorum confirmation a leader's `/ready` callers share.
    pub readiness: crate::readiness::ReadinessCheck,
    /// The snapshot being received from the leader, checked before it is installed.
    pub snapshot_receiver: statestore_raft::SnapshotReceiver,
    /// Whether requests reach the MQTT front end through its broker in time (connected, the
    /// request subscription granted, the broker's round trip within its bound), once it is started.
    pub broker_connected: std::sync::OnceLock<tokio::sync::watch::Receiver<bool>>,
    /// While the broker's round trip to this node is over its bound: how long it took.
    pub broker_slow: std::sync::OnceLock<tokio::sync::watch::Receiver<Option<Duration>>>,
    /// The applied index the last `request_snapshot` asked a snapshot to cover.
    snapshot_wanted: Arc<AtomicU64>,
    /// One permit per `/v1/command` request being served (`--max-http-commands`).
    pub http_commands: Arc<tokio::sync::Semaphore>,
    pub max_http_commands: usize,
    /// What Raft RPC, membership changes and `/v1/command` must carry, if anything.
    pub cluster_secret: Option<crate::config::ClusterSecret>,
    /// How this node connects to its peers over TLS (`--tls-*`); `None`: plain HTTP.
    pub peer_tls: Option<rustls::ClientConfig>,
    /// Peers reached at another URL than the one they advertise (`--peer-routes`).
    pub peer_routes: BTreeMap<NodeId, String>,
    /// This node's clock against its peers', as their Raft messages show them.
    pub clock_check: ClockCheck,
    /// The cluster's name and each member's storage incarnation, checked on every Raft message.
    pub identity: PeerIdentity,
    /// The peers that do not answer this node's Raft requests, and since when.
    pub peer_health: statestore_raft::peer_health::PeerHealth,
    /// The node's own background tasks (elector, snapshot policy, enrollment, watches): ended
    /// before Raft stops, so none asks a stopped Raft for anything.
    duties: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// True once the node stops taking Raft messages: its appends streams close at the next
    /// frame, before Raft stops, as its HTTP server stops taking requests.
    closed_to_peers: tokio::sync::watch::Sender<bool>,
    /// Held shared by each Raft call an appends stream makes ([`Node::call_from_peer`]); the stop
    /// takes it exclusively once it has closed to peers, so that Raft stops only after those
    /// calls returned (openraft logs a call that its stop cut off as an error).
    peer_calls: tokio::sync::RwLock<()>,
    /// Held while leadership is being moved ([`Node::move_leadership`]): one move at a time.
    moving: tokio::sync::Mutex<()>,
}

/// How long a stopping leader tries to hand its leadership over before it stops regardless.
pub const HANDOVER_DEADLINE: Duration = Duration::from_secs(2);

/// An HTTP client for a node's peers, over TLS (`peer_tls`) when the cluster uses it. Every
/// request gives up after `timeout`.
fn peer_client(peer_tls: Option<&rustls::ClientConfig>, timeout: Duration) -> reqwest::Result<reqwest::Client> {
    // Idle connections dropped before a peer's port closes them (`--http-header-timeout-ms`).
    let builder = reqwest::Client::builder().timeout(timeout).pool_idle_timeout(Duration::from_secs(5));
    match peer_tls {
        Some(tls) => builder.use_preconfigured_tls(tls.clone()).build(),
        None => builder.build(),
    }
}

impl Node {
    /// Opens the storage, starts Raft and, on a new cluster, initializes it once.
    pub async fn start(config: &NodeConfig) -> anyhow::Result<Arc<Node>> {
        let metrics = Metrics::new()?;
        let storage_metrics = StorageMetrics::register(&metrics.registry)?;
        statestore_raft::DiskSpace::register(&metrics.registry, &config.data_dir)?;
        let peer_tls = match &config.tls {
            Some(tls) => Some(tls.client_config().context("the TLS settings (--tls-*)")?),
            None => None,
        };
        let mut storage = statestore_raft::open(&config.data_dir, MachineConfig::default(), storage_metrics)?;
        storage.state.set_snapshot_write_rate(config.snapshot_write_rate);
        // Half the leader's wait for the last chunk, whose answer waits for the install; the rest
        // is for receiving it, checking it and ingesting at the disk's own speed.
        storage.state.set_snapshot_install_rate(config.snapshot_install_rate, SNAPSHOT_CHUNK_TIMEOUT / 2);
        if config.restored {
            let members = storage.reader.applied_members().context("reading the applied membership")?;
            let peers = crate::restore_check::peers(config, members);
            let client = peer_client(peer_tls.as_ref(), crate::restore_check::PEER_TIMEOUT)?;
            let names = storage.backup_names()?;
            crate::restore_check::refuse_if_running(&client, &peers, &names).await?;
            storage = storage.restored(names)?;
        }
        let raft_config = openraft::Config {
            cluster_name: "statestore".into(),
            heartbeat_interval: config.heartbeat.as_millis() as u64,
            election_timeout_min: config.election_min.as_millis() as u64,
            election_timeout_max: config.election_max.as_millis() as u64,
            // Bounds one append request: with 1 MiB values, 64 entries stay under the body limit.
            max_payload_entries: 64,
            install_snapshot_timeout: SNAPSHOT_CHUNK_TIMEOUT.as_millis() as u64,
            // Snapshots are triggered by this node (`snapshot_policy`), by entries and by bytes.
            snapshot_policy: SnapshotPolicy::Never,
            max_in_snapshot_log_to_keep: config.logs_kept,
            // The elector stands for election, after a pre-vote (statestore_raft::election).
            enable_elect: false,
            ..Default::default()
        };
        let raft_config = Arc::new(raft_config.validate()?);
        let authorization = config.cluster_secret.as_ref().map(|secret| secret.authorization());
        let clocks = PeerClocks::new(config.max_clock_offset);
        let mut identity = PeerIdentity::new(config.id, storage.incarnation.clone(), storage.reader.clone());
        if let Some(backup_names) = &storage.restoring {
            let what = if config.restored {
                "started on a restored backup: this storage is new, and the cluster will be named anew by its first leader"
            } else {
                "the restore begun here has not ended: waiting for the cluster's first leader to name it anew"
            };
            tracing::warn!(incarnation = identity.incarnation, ?backup_names, "{what}");
            identity = identity.restored(backup_names.clone());
        }
        let checks = PeerChecks { me: config.id, clocks: clocks.clone(), identity: Some(identity.clone()) };
        let network = NetworkFactory::new(
            config.heartbeat,
            config.peer_routes.clone(),
            authorization.as_deref(),
            peer_tls.clone(),
        )
        .map_err(|e| anyhow::anyhow!("the Raft network: {e}"))?
        .with_checks(checks);
        if config.cluster_secret.is_none() {
            tracing::warn!(
                "no cluster secret: Raft RPC, membership changes and /v1/command accept anyone who reaches {}",
                config.listen
            );
        }
        let log = storage.log.reader();
        let raft = Raft::new(config.id, raft_config, network.clone(), storage.log, storage.state).await?;
        let peer_health = network.health().clone();
        peer_health.register(&metrics.registry)?;
        let elector = Elector::new(
            config.id,
            raft.clone(),
            log.clone(),
            network,
            (config.election_min, config.election_max),
            config.heartbeat,
            &metrics.registry,
        )?;
        let clock_check = ClockCheck { id: config.id, raft: raft.clone(), clocks };
        let pipeline =
            Pipeline::start(raft.clone(), storage.reader.clone(), metrics.clone(), Some(clock_check.clone()));
        let leader = Leader::start(raft.clone(), pipeline.clone(), storage.reader.clone(), &metrics.registry)?;
        let readiness = crate::readiness::ReadinessCheck::new(raft.clone(), &metrics.registry)?;
        let node = Arc::new(Node {
            id: config.id,
            advertise: config.advertise.clone(),
            raft,
            reader: storage.reader,
            metrics,
            pipeline,
            leader,
            log: log.clone(),
            elector: elector.clone(),
            readiness,
            snapshot_receiver: statestore_raft::SnapshotReceiver::new(config.snapshot_install_rate),
            broker_connected: std::sync::OnceLock::new(),
            broker_slow: std::sync::OnceLock::new(),
            snapshot_wanted: Arc::new(AtomicU64::new(0)),
            http_commands: Arc::new(tokio::sync::Semaphore::new(config.max_http_commands)),
            max_http_commands: config.max_http_commands,
            cluster_secret: config.cluster_secret.clone(),
            peer_tls,
            peer_routes: config.peer_routes.clone(),
            clock_check: clock_check.clone(),
            identity,
            peer_health,
            duties: std::sync::Mutex::default(),
            closed_to_peers: tokio::sync::watch::Sender::new(false),
            peer_calls: tokio::sync::RwLock::new(()),
            moving: tokio::sync::Mutex::new(()),
        });
        node.metrics.watch(node.clone());
        node.spawn_duty(crate::events::log_cluster_events(node.clone()));
        node.spawn_duty(crate::clock_watch::follow_clocks(node.clone(), clock_check, config.heartbeat));
        if !config.max_log_fsync.is_zero() {
            node.spawn_duty(crate::disk_watch::follow_disk(node.clone(), config.max_log_fsync, config.heartbeat));
        }
        node.spawn_duty(crate::enrollment::enroll_members(node.clone()));
        node.spawn_duty(snapshot_policy(
            node.raft.clone(),
            node.reader.clone(),
            node.snapshot_wanted.clone(),
            SnapshotThresholds::for_node(config.id, config.snapshot_every, config.snapshot_log_bytes),
        ));
        node.spawn_duty(crate::state_flush::flush_applied_state(node.reader.clone(), config.flush_after));
        node.bootstrap(&config.initial_members, &config.peer_routes).await?;
        node.duties.lock().unwrap().push(elector.start());
        Ok(node)
    }

    /// Initializes a new cluster when this node is one of its initial members and has never
    /// joined one. Every initial member does this with the same membership, so whichever starts
    /// first, they all begin with the same first log entry; a node with a log never does.
    async fn bootstrap(
        &self,
        initial_members: &BTreeMap<NodeId, String>,
        peer_routes: &BTreeMap<NodeId, String>,
    ) -> anyhow::Result<()> {
        if !initial_members.contains_key(&self.id) || self.raft.is_initialized().await? {
            return Ok(());
        }
        // Initializing makes this node stand for election at once. If the others formed the
        // cluster already, that would unseat their leader; wait for it to reach us instead.
        if let Some(peer) = self.formed_elsewhere(initial_members, peer_routes).await {
            tracing::info!(peer, "the cluster exists already; waiting for its leader");
            return Ok(());
        }
        let members: BTreeMap<NodeId, BasicNode> =
            initial_members.iter().map(|(id, addr)| (*id, BasicNode { addr: addr.clone() })).collect();
        match self.raft.initialize(members).await {
            Ok(()) => tracing::info!(members = ?initial_members, "initialized a new cluster"),
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {
                tracing::info!("the cluster was initialized already")
            }
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }

    /// An initial member that already belongs to an initialized cluster, if any answers.
    async fn formed_elsewhere(
        &self,
        initial_members: &BTreeMap<NodeId, String>,
        peer_routes: &BTreeMap<NodeId, String>,
    ) -> Option<NodeId> {
        let client = self.http_client(Duration::from_millis(300)).ok()?;
        for (id, advertised) in initial_members.iter().filter(|(id, _)| **id != self.id) {
            let address = peer_routes.get(id).unwrap_or(advertised);
            let Ok(response) = client.get(format!("{address}/cluster")).send().await else { continue };
            let Ok(status) = response.json::<serde_json::Value>().await else { continue };
            if status["voters"].as_array().is_some_and(|voters| !voters.is_empty()) {
                return Some(*id);
            }
        }
        None
    }

    /// An HTTP client for this node's peers: over TLS with this node's certificate when the
    /// cluster uses TLS. Every request gives up after `timeout`.
    pub fn http_client(&self, timeout: Duration) -> reqwest::Result<reqwest::Client> {
        peer_client(self.peer_tls.as_ref(), timeout)
    }

    /// Executes a client request through the pipeline: GET and SCAN are read linearizably,
    /// everything else is proposed and answered once applied.
    pub async fn execute(&self, request: ClientRequest) -> Result<Reply, ExecuteError> {
        if request.request.command.is_read() {
            return self.read(&request.request, ReadConsistency::Linearizable).await;
        }
        // Refuse skewed requests before they take a log entry; apply checks again. The
        // request's clock may be the right one: a node whose own clock disagrees with most
        // voters' refuses as it refuses every proposal then, which the client may retry.
        let now = now_ms();
        if let Err(error) = request.request.check_clock_skew(now) {
            if let ClockVerdict::Disagrees(why) = self.clock_check.verdict_of(now) {
                return Err(ExecuteError::Unavailable(why));
            }
            return Ok(Reply::error(error));
        }
        let wall_clock_ms = proposal_clock(&request.request, now);
        let applied = self.propose(Entry { operation: Operation::Request(request), wall_clock_ms }).await?;
        Ok(applied.reply)
    }

    /// Proposes one entry (batched with whatever else is waiting) and waits until it is applied.
    pub async fn propose(&self, entry: Entry) -> Result<Applied, ExecuteError> {
        match self.pipeline.execute(Work::Write(entry)).await? {
            Outcome::Written(applied) => Ok(applied),
            Outcome::Read(_) => Err(ExecuteError::Storage("a write was answered as a read".into())),
        }
    }

    /// Answers a GET or SCAN: linearizably through the pipeline, or from the local state.
    pub async fn read(&self, request: &Request, consistency: ReadConsistency) -> Result<Reply, ExecuteError> {
        if consistency == ReadConsistency::Linearizable {
            return match self.pipeline.execute(Work::Read(request.clone(), None)).await? {
                Outcome::Read(reply) => Ok(reply),
                Outcome::Written(_) => Err(ExecuteError::Storage("a read was answered as a write".into())),
            };
        }
        let installing = || {
            ExecuteError::Unavailable("this node is installing a snapshot; read from the leader or try again".into())
        };
        if self.reader.installing_snapshot() {
            return Err(installing());
        }
        let read = self.reader.read(request, now_ms());
        // An install that began during the read may have shown it a partly cleared keyspace.
        if self.reader.installing_snapshot() {
            return Err(installing());
        }
        match read {
            Ok(Some(reply)) => Ok(reply),
            Ok(None) => Err(ExecuteError::Storage("only GET and SCAN are reads".into())),
            Err(e) => Err(ExecuteError::Storage(e.to_string())),
        }
    }

    /// Returns once this node has confirmed with a quorum that it is the leader and has applied
    /// everything committed before the call.
    pub async fn ensure_linearizable(&self) -> Result<(), ExecuteError> {
        crate::pipeline::ensure_linearizable(&self.raft).await
    }

    /// Watches whether requests reach this node through its broker in time (true while connected
    /// with the request subscription granted and the broker's round trip within its bound; `slow`
    /// holds that round trip while it is over): `/ready` reports it, and leadership follows it
    /// (`broker_watch`). Set once; later calls are ignored.
    pub fn follow_broker(
        self: &Arc<Self>,
        connected: tokio::sync::watch::Receiver<bool>,
        slow: tokio::sync::watch::Receiver<Option<Duration>>,
    ) {
        if self.broker_connected.set(connected.clone()).is_ok() {
            let _ = self.broker_slow.set(slow);
            self.spawn_duty(crate::broker_watch::follow_broker(self.clone(), connected));
        }
    }

    /// For a node started without a broker: leadership goes to a voter connected to its broker
    /// whenever one is ready (`broker_watch::without_broker`).
    pub fn follow_no_broker(self: &Arc<Self>) {
        self.spawn_duty(crate::broker_watch::without_broker(self.clone()));
    }

    /// Stops this leader's heartbeats and refuses new work with `why`, so that the others stop
    /// hearing it and elect one of themselves: leadership is handed over.
    fn hand_over(&self, why: String) {
        self.raft.runtime_config().heartbeat(false);
        self.pipeline.refuse(Some(why));
    }

    /// [`Node::hand_over`], then, once another voter can win an election (a lease and a half
    /// after this node's), asks `peer` (or any voter whose log matches this node's) to stand at
    /// once (`statestore_raft::election`, *hand over*), so that it leads within a round trip or
    /// two rather than after the followers' quiet period of no heartbeats. If none
    /// does (it refused, or this node's log ran ahead of its), the followers stand once they
    /// stop hearing this node, as before.
    pub(crate) async fn hand_over_to(&self, peer: Option<NodeId>, why: String, mode: Handover) {
        self.hand_over(why);
        self.until_another_can_be_elected().await;
        // What was proposed before is applied first, and nothing reaches the log after the
        // entry the voter must hold (`Pipeline::hold`). A stalled disk applies nothing, so
        // holding would wait for it: the refusal keeps new work out, and the proposal in flight
        // holds the pipeline's one slot (`MAX_PROPOSALS_IN_FLIGHT`). Should an entry reach the
        // log even so, the voter's log is shorter than this node's and the handover fails.
        let _held = match mode {
            Handover::Settled => Some(self.pipeline.hold().await),
            Handover::DiskStalled => None,
        };
        let deadline = self.elector.lease() * 2;
        match self.elector.hand_over(deadline, peer, mode).await {
            Ok(leader) => tracing::info!(leader, "handed leadership over to node {leader}"),
            Err(why) => {
                tracing::info!(why, "the handover did not finish; the followers stand once they stop hearing this node")
            }
        }
    }

    /// Undoes [`Node::hand_over`]: heartbeats on, submissions taken again.
    pub(crate) fn resume_serving(&self) {
        self.raft.runtime_config().heartbeat(true);
        self.pipeline.refuse(None);
    }

    /// Every `every`, asks `trouble` why this node should not lead (`None`: no reason). Leading
    /// with a reason, it hands leadership over ([`Node::hand_over_to`] any voter, in `mode`);
    /// once another node leads, or the reason is gone while it still leads, it serves again.
    /// `what` and `recovered` name the trouble and its end in the logs. Ends when Raft stops.
    pub(crate) async fn hand_over_while(
        self: Arc<Self>,
        every: Duration,
        what: &str,
        recovered: &str,
        mode: Handover,
        mut trouble: impl FnMut() -> Option<String>,
    ) {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut handing_over = false;
        loop {
            ticks.tick().await;
            let state = self.raft.metrics().borrow().state;
            if state == openraft::ServerState::Shutdown {
                return;
            }
            let leads = state == openraft::ServerState::Leader;
            match (handing_over, leads, trouble()) {
                (false, true, Some(why)) => {
                    tracing::warn!(why, "handing leadership over: {what}");
                    self.hand_over_to(None, why, mode).await;
                    handing_over = true;
                }
                (true, false, _) => {
                    tracing::info!("another node leads now; following it");
                    self.resume_serving();
                    handing_over = false;
                }
                (true, true, None) => {
                    tracing::info!("{recovered}: leading on");
                    self.resume_serving();
                    handing_over = false;
                }
                _ => {}
            }
        }
    }

    /// A leader that is told to stop hands its leadership to a voter whose log matches its own
    /// (`statestore_raft::election`, *hand over*), so that writes go on within a round trip or
    /// two instead of after the followers' quiet period. Every stopping node ends its
    /// background tasks here. A leader takes no new requests first (MQTT requests are kept for the next leader, as a follower
    /// keeps them); what it has proposed is applied and answered before the handover. Not
    /// leading, the only voter, or the handover failing within [`HANDOVER_DEADLINE`]: the node
    /// stops as it would have (the others elect a leader after their lease). Leading or not, a
    /// stopping node no longer stands for election, on its own or when asked.
    pub async fn hand_over_leadership(&self) {
        self.end_duties().await;
        self.elector.restrain(statestore_raft::Restraint::Stopping, true);
        if self.raft.metrics().borrow().state != openraft::ServerState::Leader || self.elector.other_voters().is_empty()
        {
            return;
        }
        self.pipeline.refuse(Some("this node is stopping; another node takes over as leader".into()));
        // Submitted before the refusal and not yet proposed: held; what is in flight is applied
        // first (`Pipeline::hold`), so the voter asked to stand holds the log as it ends.
        let _held = self.pipeline.hold().await;
        self.until_another_can_be_elected().await;
        let started = std::time::Instant::now();
        match self.elector.hand_over(HANDOVER_DEADLINE, None, Handover::Settled).await {
            Ok(leader) => tracing::info!(
                leader,
                millis = started.elapsed().as_millis() as u64,
                "stopping: handed leadership over to node {leader}"
            ),
            Err(why) => tracing::info!(
                why,
                "stopping without handing leadership over; the other voters elect a leader once its lease has passed"
            ),
        }
    }

    /// Moves this leader's leadership to voter `to`, or to any voter whose log matches its own,
    /// every node running on (maintenance of the leader's machine, or a leader placed near the
    /// broker): the new leader's id. First, serving as usual, it waits up to
    /// [`HANDOVER_DEADLINE`] for such a voter to hold the log as it is now; then new requests
    /// wait, in order, not refused: what was proposed is applied and answered, and for at most
    /// two leases more the voter is asked to stand
    /// ([`statestore_raft::election::Elector::hand_over`]). Once it leads, the requests that
    /// waited go on here and fail over as a follower's do (an MQTT request is kept for the new
    /// leader, which received it too; an HTTP caller is sent to the new leader). If it does not
    /// lead in time, this node leads on and serves them: the error says why.
    pub async fn move_leadership(&self, to: Option<NodeId>) -> Result<NodeId, String> {
        let Ok(_moving) = self.moving.try_lock() else {
            return Err("leadership is being moved already".into());
        };
        let (last, voters) = {
            let metrics = self.raft.metrics();
            let metrics = metrics.borrow();
            if metrics.state != openraft::ServerState::Leader {
                return Err("this node does not lead".into());
            }
            let voters: BTreeSet<NodeId> = metrics.membership_config.membership().voter_ids().collect();
            (metrics.last_log_index.unwrap_or(0), voters)
        };
        self.until_another_can_be_elected().await;
        let successor = |id: NodeId| id != self.id && to.is_none_or(|to| to == id) && voters.contains(&id);
        if !self.replicated(successor, last, HANDOVER_DEADLINE).await {
            let who = to.map_or("no other voter".to_string(), |id| format!("node {id}"));
            return Err(format!("{who} held this node's log up to index {last} within {HANDOVER_DEADLINE:?}"));
        }
        let held = self.pipeline.hold().await;
        let started = std::time::Instant::now();
        let moved = self.elector.hand_over(self.elector.lease() * 2, to, Handover::Settled).await;
        drop(held);
        match &moved {
            Ok(leader) => tracing::info!(
                leader,
                millis = started.elapsed().as_millis() as u64,
                "moved leadership to node {leader}"
            ),
            Err(why) => tracing::warn!(why, "leadership did not move; leading on"),
        }
        moved
    }

    /// Waits until a lease (and a margin) has passed since this node's leadership began:
    /// openraft refuses every vote for a lease after this node's election, its own included, so
    /// a voter asked to stand sooner would lose its election.
    async fn until_another_can_be_elected(&self) {
        let lease = self.elector.lease();
        let since = self.leader.leading_since().unwrap_or_else(std::time::Instant::now);
        tokio::time::sleep_until((since + lease + lease / 2).into()).await;
    }

    /// Waits up to `deadline` until this leader's replication to a node that `wanted` accepts
    /// has reached `index`; false if it has not, or this node stopped leading.
    pub(crate) async fn replicated(&self, wanted: impl Fn(NodeId) -> bool, index: u64, deadline: Duration) -> bool {
        let mut metrics = self.raft.metrics();
        let reached = async {
            loop {
                let reached = {
                    let m = metrics.borrow_and_update();
                    if m.state != openraft::ServerState::Leader {
                        return false;
                    }
                    m.replication.as_ref().is_some_and(|replication| {
                        replication
                            .iter()
                            .any(|(id, matched)| wanted(*id) && matched.is_some_and(|matched| matched.index >= index))
                    })
                };
                if reached {
                    return true;
                }
                if metrics.changed().await.is_err() {
                    return false;
                }
            }
        };
        tokio::time::timeout(deadline, reached).await.unwrap_or(false)
    }

    /// Starts one of the node's background tasks, ended by [`Node::shutdown`].
    fn spawn_duty(&self, duty: impl std::future::Future<Output = ()> + Send + 'static) {
        let handle = tokio::spawn(duty);
        self.duties.lock().unwrap().push(handle);
    }

    /// Ends the node's background tasks (those not ended already) and waits, for
    /// [`DUTIES_END_WITHIN`] at most, until none runs: a task being polled when it is aborted
    /// finishes that step first, and one that calls into Raft after Raft stopped makes openraft
    /// log an error.
    async fn end_duties(&self) {
        let duties: Vec<tokio::task::JoinHandle<()>> = self.duties.lock().unwrap().drain(..).collect();
        for duty in &duties {
            duty.abort();
        }
        let deadline = tokio::time::Instant::now() + DUTIES_END_WITHIN;
        for duty in duties {
            let _ = tokio::time::timeout_at(deadline, duty).await;
        }
    }

    /// Stops taking Raft messages over appends streams: each closes at its next frame.
    pub fn close_to_peers(&self) {
        self.closed_to_peers.send_replace(true);
    }

    /// Runs `call`, a Raft call for a peer's message, unless the node has stopped taking them
    /// ([`Node::close_to_peers`]): `None` then. The stop waits for the calls in flight.
    pub async fn call_from_peer<F: std::future::Future>(&self, call: F) -> Option<F::Output> {
        let _in_flight = self.peer_calls.read().await;
        if *self.closed_to_peers.borrow() {
            return None;
        }
        Some(call.await)
    }

    /// Waits, for [`PEER_CALLS_END_WITHIN`] at most, until no Raft call for a peer's message
    /// runs; after [`Node::close_to_peers`], none starts.
    async fn end_peer_calls(&self) {
        if tokio::time::timeout(PEER_CALLS_END_WITHIN, self.peer_calls.write()).await.is_err() {
            tracing::warn!(
                "a Raft call for a peer was still running {PEER_CALLS_END_WITHIN:?} after the stop; stopping Raft regardless"
            );
        }
    }

    /// Completes once the node stops taking Raft messages ([`Node::close_to_peers`]).
    pub fn peers_closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut closed = self.closed_to_peers.subscribe();
        async move {
            let _ = closed.wait_for(|closed| *closed).await;
        }
    }

    /// Ends the node's background tasks and its peers' calls in flight and refuses new requests,
    /// then stops Raft (no more votes, appends or applies), then writes what was applied to
    /// disk, so that the node does not apply the log again when it starts. When Raft stopped
    /// without an error, the log's range is recorded too, so that the next start finds entries
    /// lost meanwhile.
    pub async fn shutdown(&self) {
        self.close_to_peers();
        self.end_duties().await;
        self.end_peer_calls().await;
        self.pipeline.refuse(Some("this node is stopping".into()));
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, "raft did not stop cleanly");
        }
        let stopped_cleanly =
            matches!(self.raft.metrics().borrow().running_state, Err(openraft::error::Fatal::Stopped));
        let (reader, log) = (self.reader.clone(), self.log.clone());
        let written = tokio::task::spawn_blocking(move || {
            let applied = reader.flush_applied().map_err(|e| e.to_string());
            let log = if stopped_cleanly { log.record_stop().map_err(|e| e.to_string()) } else { Ok(()) };
            (applied, log)
        })
        .await;
        match written {
            Ok((applied, log)) => {
                match applied {
                    Ok(index) => tracing::debug!(applied = index, "the applied state is on disk"),
                    Err(e) => tracing::warn!(
                        error = %e,
                        "could not write the applied state to disk; it is applied again from the log at start"
                    ),
                }
                if let Err(e) = log {
                    tracing::warn!(error = %e, "could not record the Raft log's entries at the stop");
                }
            }
            Err(e) => tracing::warn!(error = %e, "could not write the applied state to disk"),
        }
    }
}

impl Node {
    /// Whether this node leads and a quorum acknowledged it within the longest election
    /// timeout. Past that the others may have elected another leader (this one is cut off from
    /// them, or was paused), and answers are that leader's to give.
    pub fn leads_with_quorum(&self) -> bool {
        let lease_ms = self.raft.config().election_timeout_max;
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        metrics.state == openraft::ServerState::Leader
            && metrics.millis_since_quorum_ack.is_some_and(|ms| ms <= lease_ms)
    }

    /// Asks for a snapshot covering at least everything applied now, whatever the policy says,
    /// and returns that applied index. A build already running may end below it: the policy
    /// then asks again until a snapshot covers it, so a request is never lost.
    pub async fn request_snapshot(&self) -> Result<u64, openraft::error::Fatal<NodeId>> {
        let applied = self.raft.metrics().borrow().last_applied.map_or(0, |id| id.index);
        self.snapshot_wanted.fetch_max(applied, Ordering::SeqCst);
        self.raft.trigger().snapshot().await?;
        Ok(applied)
    }
}

/// How long a stopping node waits for its aborted background tasks to end.
const DUTIES_END_WITHIN: Duration = Duration::from_secs(1);
/// How long a stopping node waits for the Raft calls its appends streams made to return (a
/// follower's append returns once it is on disk).
const PEER_CALLS_END_WITHIN: Duration = Duration::from_secs(1);

/// How often the snapshot policy looks at the log.
const SNAPSHOT_CHECK_EVERY: Duration = Duration::from_millis(200);

/// Builds a snapshot (and so purges the log below it) once `every_entries` entries were applied
/// since the last one, or the log grew by `every_bytes` bytes (a few large values fill a disk
/// long before the entry count is reached), but never before the log written since the last
/// snapshot holds as many bytes as that snapshot: a snapshot rewrites the whole state, so without
/// that bound a large store would spend more on snapshots the larger it grows. With it, building
/// snapshots writes at most about what the log does. A snapshot asked for through
/// `Node::request_snapshot` is triggered until one covers the index it was asked at.
async fn snapshot_policy(raft: Raft, reader: StateReader, wanted: Arc<AtomicU64>, thresholds: SnapshotThresholds) {
    let mut tick = tokio::time::interval(SNAPSHOT_CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (applied, snapshot) = {
            let metrics = raft.metrics();
            let metrics = metrics.borrow();
            (metrics.last_applied.map_or(0, |id| id.index), metrics.snapshot.map_or(0, |id| id.index))
        };
        if wanted.load(Ordering::SeqCst) > snapshot {
            // Triggering while a build runs does nothing, so this repeats until one covers it.
            if raft.trigger().snapshot().await.is_err() {
                return;
            }
            continue;
        }
        let log = reader.log_bytes();
        let (entries, bytes) = (applied.saturating_sub(snapshot), log.since_snapshot());
        if !thresholds.due(entries, bytes, log.snapshot_size()) {
            continue;
        }
        tracing::info!(entries, bytes, last_snapshot_bytes = log.snapshot_size(), "building a snapshot");
        // Counted from now, so a build that takes a while is not asked for again meanwhile.
        log.snapshot_taken();
        if raft.trigger().snapshot().await.is_err() {
            return;
        }
    }
}

/// When a node builds a snapshot. Every node sees the same entries, so with equal thresholds all
/// of them would build at the same moment, and a cluster whose nodes all build at once is slow
/// all at once (on shared cores, and a quorum of busy disks). Each node's thresholds are scaled
/// by 1, 4/3 or 5/3 after its id (`id % 3`), so the builds of three nodes fall apart and then
/// drift further apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotThresholds {
    every_entries: u64,
    every_bytes: u64,
    /// Thirds: 3, 4 or 5.
    scale: u64,
}

impl SnapshotThresholds {
    pub fn for_node(id: u64, every_entries: u64, every_bytes: u64) -> SnapshotThresholds {
        SnapshotThresholds { every_entries, every_bytes, scale: 3 + id % 3 }
    }

    fn scaled(&self, value: u64) -> u64 {
        value.saturating_mul(self.scale) / 3
    }

    /// Whether `entries` applied and `bytes` logged since the last snapshot, whose data file
    /// has `snapshot_bytes`, call for a new one.
    pub fn due(&self, entries: u64, bytes: u64, snapshot_bytes: u64) -> bool {
        let due = entries >= self.scaled(self.every_entries) || bytes >= self.scaled(self.every_bytes);
        due && bytes >= self.scaled(snapshot_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use statestore_protocol::{Hlc, Set};

    #[test]
    fn three_nodes_snapshot_at_three_different_points() {
        let points: Vec<u64> = (1..=3)
            .map(|id| {
                let thresholds = SnapshotThresholds::for_node(id, 10_000, u64::MAX);
                (0..).step_by(100).find(|&entries| thresholds.due(entries, 0, 0)).unwrap()
            })
            .collect();
        assert_eq!(points, vec![13_400, 16_700, 10_000]);
        let by_size = SnapshotThresholds::for_node(3, 1, 1);
        assert!(!by_size.due(5, 999, 1000), "the log does not yet hold the last snapshot's bytes");
        assert!(by_size.due(5, 1000, 1000));
        let later = SnapshotThresholds::for_node(2, 1, 1);
        assert!(!later.due(5, 1600, 1000) && later.due(5, 1666, 1000), "5/3 of it on a node scaled by 5/3");
    }

    #[test]
    fn a_request_in_the_current_millisecond_gets_a_counter_0_version() {
        let request = |ts: Option<u64>| {
            let payload = Set::new("k", "v").encode();
            let ts = ts.map(|ms| Hlc::new(ms, 0, "client").to_string());
            Request::parse(&payload, Some(ts.as_deref().unwrap_or("000000000000001:00000:c")), None).unwrap()
        };
        let now = 1_000_000;
        for ts in [now, now + 3, now + 5] {
            let wall = proposal_clock(&request(Some(ts)), now);
            assert_eq!(wall, ts + 1);
            let version = Hlc::new(0, 0, "statestore").successor(request(Some(ts)).timestamp.as_ref(), wall);
            assert_eq!(version.counter, 0, "ts {ts}");
        }
        assert_eq!(proposal_clock(&request(Some(now - 1)), now), now, "an older request changes nothing");
        assert_eq!(proposal_clock(&request(Some(now + 60_000)), now), now, "a skewed client does not move our clock");
        assert_eq!(proposal_clock(&request(None), now), now, "a request from the distant past changes nothing");
    }
}
