//! The workload, the faults and the checks of the fault-injection suite (`faults/main.rs`),
//! shared with the power-cut suite (`power_cut.rs`), which runs the same clients and checks
//! with every node's data directory on a file system that loses what was not synced
//! (`statestore-powercut-fs`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::checker::{Answer, Call, Condition, Op, Token, Verdict};
use crate::common::broker::Broker;
use crate::common::disk::FaultyDisks;
use crate::common::gate::{Gate, PeerLinks};
use crate::common::mqtt::RawClient;
use crate::common::{timestamp, Cluster};
use statestore_powercut_fs::{Cut, PowerCutMount};
use statestore_protocol::topic::hex_upper;
use statestore_protocol::{
    Command, Del, Get, Hlc, KeyNotify, Notification, Response, Scan, Set, SetCondition, StoreError, VDel,
};

const NODES: u64 = 3;
const CLIENTS: usize = 6;
const KEYS: usize = 8;
/// Keys from this one on are fenced.
const FENCED_FROM: usize = KEYS / 2;
/// How long a client waits for an answer before it counts the call as unanswered.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Search states the checker may visit per operation of a key's history.
const CHECK_BUDGET_PER_OP: usize = 200;
/// The longest pause a client takes between two calls (a random part of it, each time).
const THINK_TIME_MS: u64 = 15;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    Kill,
    KillAll,
    Pause,
    PartitionLeader,
    PartitionFollower,
    Broker,
    Disk,
    Clock,
    ClockLeader,
    SlowLeader,
    SlowBroker,
    /// One node (the leader and a follower in turn) killed and its file system's unsynced
    /// writes dropped (or, half the time, torn in whole sectors), then started again.
    PowerCut,
    /// The same for every node at once.
    PowerCutAll,
}

impl Fault {
    /// The faults the fault-injection suite runs by default.
    pub const ALL: [Fault; 11] = [
        Fault::Kill,
        Fault::KillAll,
        Fault::Pause,
        Fault::PartitionLeader,
        Fault::PartitionFollower,
        Fault::Broker,
        Fault::Disk,
        Fault::Clock,
        Fault::ClockLeader,
        Fault::SlowLeader,
        Fault::SlowBroker,
    ];

    /// The power cuts, which need the nodes' data directories on the power-cut file system.
    pub const POWER_CUTS: [Fault; 2] = [Fault::PowerCutAll, Fault::PowerCut];

    /// The fault a name (as [`Fault::name`] gives it) names.
    pub fn named(name: &str) -> Option<Fault> {
        Fault::ALL.into_iter().chain(Fault::POWER_CUTS).find(|f| f.name() == name.trim())
    }

    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::KillAll => "kill-all",
            Fault::Pause => "pause",
            Fault::PartitionLeader => "partition-leader",
            Fault::PartitionFollower => "partition-follower",
            Fault::Broker => "broker",
            Fault::Disk => "disk",
            Fault::Clock => "clock",
            Fault::ClockLeader => "clock-leader",
            Fault::SlowLeader => "slow-leader",
            Fault::SlowBroker => "slow-broker",
            Fault::PowerCut => "power-cut",
            Fault::PowerCutAll => "power-cut-all",
        }
    }
}

/// One recorded call.
struct Record {
    key: usize,
    op: Op,
    /// The `__ts` of the answer.
    version: Option<Hlc>,
}

/// Three nodes whose Raft links and broker links each go through a proxy the suite can cut.
struct Rig {
    broker: Broker,
    cluster: Cluster,
    /// The proxies of every Raft link.
    links: PeerLinks,
    /// node → the proxy it reaches the broker through.
    broker_links: BTreeMap<u64, Gate>,
    /// The files that stall a node's `fsync`s while they exist.
    disks: FaultyDisks,
    /// node → the file its libfaketime reads its clock's offset from (`+0`: the true time).
    clock_offsets: BTreeMap<u64, std::path::PathBuf>,
    http: reqwest::Client,
    /// What the power cuts did so far.
    power_cuts: PowerCuts,
    /// node → the power-cut file system its data directory is on (none unless the run has power
    /// cuts). Declared after `cluster`, so that the nodes are killed before these unmount.
    mounts: BTreeMap<u64, PowerCutMount>,
    /// The backing directories and mount points of `mounts`, removed after them.
    _mounts_dir: Option<tempfile::TempDir>,
}

/// What the power cuts of a run did.
#[derive(Debug, Default)]
pub struct PowerCuts {
    /// Cuts of every node at once.
    pub all: usize,
    /// Cuts of one node: of a leader, of a follower.
    pub leader: usize,
    pub follower: usize,
    /// Nodes' file systems cut torn (a prefix of the unsynced writes kept in whole sectors).
    pub torn: usize,
    /// Unsynced bytes dropped, and kept by torn cuts.
    pub lost_bytes: u64,
    pub kept_bytes: u64,
}

impl Rig {
    /// Starts the broker, the proxies and the nodes; with `power_cuts`, each node's data
    /// directory is on a power-cut file system of its own.
    async fn start(power_cuts: bool) -> Rig {
        let broker = Broker::start();
        let mut cluster = Cluster::prepare(NODES, &[]);
        let (mut mounts, mut mounts_dir) = (BTreeMap::new(), None);
        if power_cuts {
            let dir = tempfile::tempdir().unwrap();
            for (&id, node) in cluster.nodes.iter_mut() {
                let (backing, mountpoint) =
                    (dir.path().join(format!("backing-{id}")), dir.path().join(format!("mnt-{id}")));
                std::fs::create_dir(&backing).unwrap();
                std::fs::create_dir(&mountpoint).unwrap();
                let mount = PowerCutMount::mount(&backing, &mountpoint)
                    .unwrap_or_else(|e| panic!("mounting the power-cut file system at {}: {e}", mountpoint.display()));
                node.data_dir = mountpoint.join("data");
                mounts.insert(id, mount);
            }
            mounts_dir = Some(dir);
        }
        let ports: BTreeMap<u64, u16> = cluster.nodes.iter().map(|(id, node)| (*id, node.port)).collect();
        let links = PeerLinks::start(&ports).await;
        let mut broker_links = BTreeMap::new();
        for &id in ports.keys() {
            broker_links.insert(id, Gate::start(broker.port).await);
        }
        let library = crate::common::disk::faulty_disk_library(cluster.dir.path());
        let disks = FaultyDisks { dir: cluster.dir.path().to_path_buf() };
        let mut clock_offsets = BTreeMap::new();
        for (&id, node) in cluster.nodes.iter_mut() {
            let clock_offset = cluster.dir.path().join(format!("clock-offset-{id}"));
            std::fs::write(&clock_offset, "+0").unwrap();
            node.env = disks.env(&library, id, &node.data_dir);
            let (_, preload) = node.env.iter_mut().find(|(name, _)| name == "LD_PRELOAD").expect("the disk library");
            *preload = format!("{preload} {}", crate::common::clock::LIBFAKETIME);
            node.env.extend(crate::common::clock::offset_file_env(&clock_offset));
            clock_offsets.insert(id, clock_offset);
            node.args = vec![
                "--broker".into(),
                format!("127.0.0.1:{}", broker_links[&id].port),
                "--peer-routes".into(),
                links.routes(id),
            ];
        }
        for id in 1..=NODES {
            cluster.spawn(id);
        }
        cluster.wait_ready().await;
        let http = reqwest::Client::builder().timeout(Duration::from_millis(500)).build().unwrap();
        Rig {
            broker,
            cluster,
            links,
            broker_links,
            disks,
            clock_offsets,
            http,
            power_cuts: PowerCuts::default(),
            mounts,
            _mounts_dir: mounts_dir,
        }
    }

    /// Cuts the power of `nodes`: each is killed (SIGKILL), then its file system drops what
    /// it did not sync (torn, keeping a prefix in whole sectors, half the time); after a
    /// second all are started again. Each must start on its own: one that exits (damage it
    /// refuses, exit 3, or anything else) would need an operator, and fails the suite.
    async fn cut_power(&mut self, nodes: &[u64]) -> String {
        for &id in nodes {
            self.cluster.kill(id);
        }
        let mut what = Vec::new();
        for &id in nodes {
            let cut = if fastrand::bool() { Cut::Torn } else { Cut::Clean };
            let mount = self.mounts.get_mut(&id).expect("power cuts need the nodes on the power-cut file system");
            let report = mount.cut(cut).unwrap_or_else(|e| panic!("the power cut of node {id}: {e}"));
            self.power_cuts.torn += usize::from(cut == Cut::Torn);
            self.power_cuts.lost_bytes += report.lost_bytes;
            self.power_cuts.kept_bytes += report.kept_bytes;
            what.push(match cut {
                Cut::Torn => format!(
                    "node {id}: {} B of {} files dropped, {} B kept (torn)",
                    report.lost_bytes, report.files, report.kept_bytes
                ),
                Cut::Clean => format!("node {id}: {} B of {} files dropped", report.lost_bytes, report.files),
            });
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        for &id in nodes {
            self.cluster.spawn(id);
        }
        self.wait_started(nodes).await;
        what.join("; ")
    }

    /// Waits until every node is ready, failing the suite at once, with its log, when one of
    /// `restarted` exits instead.
    async fn wait_started(&mut self, restarted: &[u64]) {
        let until = Instant::now() + crate::common::DEADLINE;
        loop {
            for &id in restarted {
                let node = self.cluster.nodes.get_mut(&id).unwrap();
                if let Some(status) = node.child.as_mut().and_then(|child| child.try_wait().ok().flatten()) {
                    let log = std::fs::read_to_string(&node.log).unwrap_or_default();
                    let lines: Vec<&str> = log.lines().collect();
                    panic!(
                        "node {id} stopped ({status}) after a power cut instead of starting: it needs an operator. Its \
                         log ends:\n{}",
                        lines[lines.len().saturating_sub(40)..].join("\n")
                    );
                }
            }
            let mut ready = true;
            for id in self.cluster.running() {
                let answer = self.http.get(format!("{}/ready", self.cluster.url(id))).send().await;
                ready &= answer.is_ok_and(|r| r.status().is_success());
            }
            if ready {
                return;
            }
            assert!(Instant::now() < until, "the nodes are not ready after a power cut\n{}", self.cluster.logs());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The leader that the nodes answering within 500 ms agree on, waiting up to 30 s.
    async fn leader(&self, paused: Option<u64>) -> u64 {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let mut named = Vec::new();
            for id in self.cluster.running().into_iter().filter(|id| Some(*id) != paused) {
                let status = self.http.get(format!("{}/cluster", self.cluster.url(id))).send().await;
                if let Ok(status) = status {
                    if let Ok(status) = status.json::<serde_json::Value>().await {
                        named.push(status["leader"]["id"].as_u64());
                    }
                }
            }
            if let Some(Some(leader)) = named.first().copied() {
                if Some(leader) != paused && named.iter().all(|n| *n == Some(leader)) {
                    return leader;
                }
            }
            assert!(Instant::now() < until, "no agreed leader: {named:?}\n{}", self.cluster.logs());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn cut_off(&self, node: u64, cut: bool) {
        self.links.cut_off(node, cut);
    }

    /// Sets node `id`'s wall clock to the true time moved by `offset` (libfaketime's form:
    /// `+30s`, `-30s`, `+0`); a running node reads it within a second.
    fn set_clock(&self, id: u64, offset: &str) {
        std::fs::write(&self.clock_offsets[&id], offset).unwrap();
    }

    /// Injects one fault and heals it; returns when it is healed (a restarted node ready again,
    /// so that faults do not pile up on a node still starting).
    async fn inject(&mut self, fault: Fault) -> String {
        let leader = self.leader(None).await;
        let follower = (1..=NODES).find(|id| *id != leader).unwrap();
        match fault {
            Fault::PowerCut => {
                // The leader and a follower in turn.
                let (node, role) = if self.power_cuts.leader <= self.power_cuts.follower {
                    self.power_cuts.leader += 1;
                    (leader, "leader")
                } else {
                    self.power_cuts.follower += 1;
                    (follower, "follower")
                };
                let what = self.cut_power(&[node]).await;
                format!("node {node} ({role}) lost power, restarted after 1 s: {what}")
            }
            Fault::PowerCutAll => {
                self.power_cuts.all += 1;
                let what = self.cut_power(&(1..=NODES).collect::<Vec<_>>()).await;
                format!("every node lost power, all restarted after 1 s (node {leader} led): {what}")
            }
            Fault::Kill => {
                self.cluster.kill(leader);
                tokio::time::sleep(Duration::from_secs(1)).await;
                self.cluster.spawn(leader);
                self.cluster.wait_ready().await;
                format!("node {leader} (leader) killed, restarted after 1 s")
            }
            Fault::KillAll => {
                for id in 1..=NODES {
                    self.cluster.kill(id);
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                for id in 1..=NODES {
                    self.cluster.spawn(id);
                }
                self.cluster.wait_ready().await;
                format!("every node killed, all restarted after 1 s (node {leader} led)")
            }
            Fault::Pause => {
                let secs = fastrand::u64(1..=6);
                self.cluster.signal(leader, "STOP");
                tokio::time::sleep(Duration::from_secs(secs)).await;
                self.cluster.signal(leader, "CONT");
                format!("node {leader} (leader) paused {secs} s")
            }
            Fault::PartitionLeader | Fault::PartitionFollower => {
                let node = if fault == Fault::PartitionLeader { leader } else { follower };
                self.cut_off(node, true);
                tokio::time::sleep(Duration::from_secs(3)).await;
                self.cut_off(node, false);
                format!("node {node} cut off from its peers for 3 s")
            }
            Fault::Broker => {
                self.broker_links[&leader].cut();
                tokio::time::sleep(Duration::from_secs(3)).await;
                self.broker_links[&leader].heal();
                format!("node {leader} (leader) cut off from the broker for 3 s")
            }
            Fault::SlowLeader => {
                let delay = Duration::from_millis(fastrand::u64(200..=1_000));
                self.links.slow_down(leader, delay);
                tokio::time::sleep(Duration::from_secs(4)).await;
                self.links.slow_down(leader, Duration::ZERO);
                format!(
                    "node {leader} (leader): every byte to and from its peers held {} ms for 4 s",
                    delay.as_millis()
                )
            }
            Fault::SlowBroker => {
                let delay = Duration::from_millis(fastrand::u64(200..=1_000));
                self.broker_links[&leader].slow(delay);
                tokio::time::sleep(Duration::from_secs(4)).await;
                self.broker_links[&leader].slow(Duration::ZERO);
                format!(
                    "node {leader} (leader): every byte to and from the broker held {} ms for 4 s",
                    delay.as_millis()
                )
            }
            Fault::Disk => {
                let stall = self.disks.stall(leader);
                std::fs::File::create(&stall).unwrap();
                tokio::time::sleep(Duration::from_secs(3)).await;
                std::fs::remove_file(&stall).unwrap();
                format!("node {leader} (leader): fsyncs stalled for 3 s")
            }
            Fault::Clock => {
                self.cluster.kill(follower);
                self.set_clock(follower, "+30s");
                self.cluster.spawn(follower);
                tokio::time::sleep(Duration::from_secs(6)).await;
                self.cluster.kill(follower);
                self.set_clock(follower, "+0");
                self.cluster.spawn(follower);
                self.cluster.wait_ready().await;
                format!("node {follower} (follower) ran 30 s ahead for 6 s")
            }
            Fault::ClockLeader => {
                let offset = if fastrand::bool() { "+30s" } else { "-90s" };
                self.set_clock(leader, offset);
                tokio::time::sleep(Duration::from_secs(6)).await;
                self.set_clock(leader, "+0");
                // Until its libfaketime reads the file again, the node still runs off.
                tokio::time::sleep(Duration::from_millis(1_200)).await;
                self.cluster.wait_ready().await;
                format!("node {leader} (leader): wall clock {offset} for 6 s, while it ran")
            }
        }
    }
}

/// The key a call names.
fn key_name(key: usize) -> Vec<u8> {
    format!("lin-{key}").into_bytes()
}

/// A pattern that only `key`'s name matches, its last character in a class (`lin-1[2]`), so that
/// a scan examines the names of the keys beside it too.
fn scan_pattern(key: usize) -> Vec<u8> {
    let name = String::from_utf8(key_name(key)).expect("key names are text");
    let (head, last) = name.split_at(name.len() - 1);
    format!("{head}[{last}]").into_bytes()
}

/// Most pages one scan of the suite may take.
const SCAN_PAGES: usize = 16;

/// The rest of a scan of `key`'s pattern whose first page listed `keys` and gave `token`: pages
/// requested until the final one. Whether the key was listed, or `Err` with what went wrong (a
/// key its pattern does not match), or `Ok(None)` when a page got no answer or an error.
async fn rest_of_scan(
    client: &RawClient,
    key: usize,
    mut keys: Vec<serde_bytes::ByteBuf>,
    mut token: Option<serde_bytes::ByteBuf>,
) -> Result<Option<bool>, String> {
    let (name, mut listed, mut pages) = (key_name(key), false, 1);
    loop {
        for listed_key in &keys {
            if listed_key.as_slice() != name.as_slice() {
                return Err(format!(
                    "a scan of {} listed {}",
                    String::from_utf8_lossy(&scan_pattern(key)),
                    String::from_utf8_lossy(listed_key)
                ));
            }
            listed = true;
        }
        let Some(next) = token.take() else { return Ok(Some(listed)) };
        if pages == SCAN_PAGES {
            return Err(format!("a scan of one key took more than {SCAN_PAGES} pages"));
        }
        pages += 1;
        let page = Command::Scan(Scan { pattern: scan_pattern(key), token: Some(next) }).encode();
        let Some(received) = client.request_with(&page, client.properties(&timestamp()), CALL_TIMEOUT).await else {
            return Ok(None);
        };
        match Response::decode(&received.payload) {
            Ok(Response::Keys { keys: more, token: next }) => (keys, token) = (more, next),
            _ => return Ok(None),
        }
    }
}

/// A client named `name` registered for the notifications of every key.
async fn watch_every_key(broker_port: u16, name: &str) -> RawClient {
    let watcher = RawClient::connect(broker_port, name).await;
    for key in 0..KEYS {
        let register = Command::KeyNotify(KeyNotify { key: key_name(key), stop: false });
        let received = watcher.request(&register.encode(), &timestamp()).await;
        assert!(matches!(Response::decode(&received.payload), Ok(Response::Ok)), "KEYNOTIFY lin-{key}");
    }
    watcher
}

/// Ends `quitter`'s registration for every key (`KEYNOTIFY … STOP`), sending a STOP again while
/// it gets no answer (ten tries at most); when each was answered (µs of the history's clock).
async fn stop_watching_every_key(quitter: &RawClient, started: Instant) -> Vec<Option<u64>> {
    let mut answered = vec![None; KEYS];
    for (key, answered) in answered.iter_mut().enumerate() {
        let stop = Command::KeyNotify(KeyNotify { key: key_name(key), stop: true }).encode();
        for _ in 0..10 {
            let Some(received) = quitter.request_with(&stop, quitter.properties(&timestamp()), CALL_TIMEOUT).await
            else {
                continue;
            };
            // `:0` when an earlier try that got no answer removed it.
            if matches!(Response::decode(&received.payload), Ok(Response::Ok | Response::Int(0))) {
                *answered = Some(started.elapsed().as_micros() as u64);
                break;
            }
        }
    }
    answered
}

/// The suite's key a notification's topic names.
fn notified_key(topic: &str) -> Option<usize> {
    let hex = topic.rsplit('/').next()?;
    (0..KEYS).find(|&key| hex_upper(&key_name(key)) == hex)
}

/// No notification of a write invoked after its key's STOP was answered (`stopped`) reached the
/// quitter, which stopped watching every key halfway through; it got notifications before
/// (else this proves nothing), and every STOP was answered. The anomalies.
fn check_stopped(quitter: &RawClient, stopped: &[Option<u64>], records: &[Record]) -> Vec<String> {
    let invoked: std::collections::HashMap<(usize, String), u64> = records
        .iter()
        .filter(|r| is_write(&r.op))
        .filter_map(|r| Some(((r.key, r.version.as_ref()?.to_string()), r.op.invoked)))
        .collect();
    let mut anomalies: Vec<String> = (0..KEYS)
        .filter(|&key| stopped[key].is_none())
        .map(|key| format!("lin-{key}: KEYNOTIFY STOP was never answered"))
        .collect();
    let notifications = quitter.take_notifications();
    if notifications.is_empty() {
        anomalies.push("the watcher that stopped halfway got no notification at all".into());
    }
    for received in &notifications {
        let (Some(key), Some(version)) = (notified_key(&received.topic), received.user("__ts")) else { continue };
        let (Some(stopped), Some(&invoked)) = (stopped[key], invoked.get(&(key, version.to_string()))) else {
            continue;
        };
        if invoked > stopped {
            anomalies.push(format!(
                "lin-{key}: the write of version {version}, invoked {} ms after KEYNOTIFY STOP was answered, was \
                 notified to the client that stopped",
                (invoked - stopped) / 1_000
            ));
        }
    }
    println!("the watcher that stopped halfway: {} notifications", notifications.len());
    anomalies
}

/// What a notification says happened to a key: the value set, or `None` for a delete.
type Notified = (usize, String, Option<String>);

/// Every acknowledged write reached the watcher as a notification carrying the write's version
/// (waiting up to 10 s for the last ones), and no write that was refused did. The anomalies.
async fn check_notifications(watcher: &RawClient, records: &[Record]) -> Vec<String> {
    let expected: Vec<Notified> = records
        .iter()
        .filter(|r| is_write(&r.op))
        .filter_map(|r| {
            let version = r.version.as_ref()?.to_string();
            let value = match &r.op.call {
                Call::Set { value, .. } => Some(value.clone()),
                _ => None,
            };
            Some((r.key, version, value))
        })
        .collect();
    let mut notified = std::collections::HashSet::new();
    let mut anomalies = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        for received in watcher.take_notifications() {
            let key = notified_key(&received.topic);
            let version = received.user("__ts").map(str::to_string);
            let (Some(key), Some(version)) = (key, version) else {
                anomalies.push(format!("a notification for no key of the suite or without __ts: {}", received.topic));
                continue;
            };
            let value = match Notification::decode(&received.payload) {
                Some(Notification::Set { value }) => Some(String::from_utf8_lossy(&value).into_owned()),
                Some(Notification::Delete) => None,
                None => {
                    anomalies.push(format!("lin-{key}: a notification that does not decode"));
                    continue;
                }
            };
            notified.insert((key, version, value));
        }
        if expected.iter().all(|write| notified.contains(write)) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("{} distinct notifications for {} acknowledged writes", notified.len(), expected.len());
    for (key, version, value) in expected.iter().filter(|write| !notified.contains(*write)) {
        let what = value.as_ref().map_or("a delete".to_string(), |v| format!("the SET of {v}"));
        anomalies.push(format!("lin-{key}: {what}, acknowledged with version {version}, was never notified"));
    }
    // A lease renewal (NEX) repeats a value an earlier SET wrote: a value counts as refused only
    // when no SET of it may have applied.
    let may_have_applied: std::collections::HashSet<&str> =
        records.iter().filter(|r| matches!(r.op.answer, None | Some(Answer::Ok))).filter_map(set_value).collect();
    let refused: std::collections::HashSet<&str> = records
        .iter()
        .filter(|r| r.op.answer.as_ref().is_some_and(|answer| *answer != Answer::Ok))
        .filter_map(set_value)
        .filter(|value| !may_have_applied.contains(value))
        .collect();
    for (key, _, value) in &notified {
        if let Some(value) = value.as_deref().filter(|value| refused.contains(value)) {
            anomalies.push(format!("lin-{key}: the SET of {value} was refused, yet notified"));
        }
    }
    anomalies
}

/// The value a SET call writes.
fn set_value(record: &Record) -> Option<&str> {
    match &record.op.call {
        Call::Set { value, .. } => Some(value.as_str()),
        _ => None,
    }
}

/// The request a call sends.
fn command(key_index: usize, call: &Call) -> Command {
    let key = key_name(key_index);
    match call {
        Call::Set { value, condition, px_ms } => Command::Set(Set {
            key,
            value: value.as_bytes().to_vec(),
            condition: match condition {
                Condition::Always => SetCondition::Always,
                Condition::NotExists => SetCondition::NotExists,
                Condition::NotExistsOrEqual => SetCondition::NotExistsOrEqual,
            },
            expiry_ms: *px_ms,
        }),
        Call::Get => Command::Get(Get { key }),
        Call::Scan => Command::Scan(Scan { pattern: scan_pattern(key_index), token: None }),
        Call::Del => Command::Del(Del { key }),
        Call::VDel(v) => Command::VDel(VDel { key, value: v.as_bytes().to_vec() }),
    }
}

/// Whether an answered call changed the key (its version must then be newer than earlier ones).
fn is_write(op: &Op) -> bool {
    matches!(
        (&op.call, &op.answer),
        (Call::Set { .. }, Some(Answer::Ok)) | (Call::Del | Call::VDel(_), Some(Answer::Int(1)))
    )
}

/// Makes every token's (milliseconds, counter) unique across clients.
static TOKEN_COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The fencing token of a write to `key`: none on an unfenced key; on a fenced one mostly a
/// fresh token, sometimes one 2 s old (which the key's token has likely passed), sometimes none.
fn fencing_token(key: usize, call: &Call) -> Option<Token> {
    if key < FENCED_FROM || crate::checker::is_read(call) {
        return None;
    }
    let counter = TOKEN_COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 100_000;
    let now = crate::common::now_ms();
    match fastrand::u8(..100) {
        0..80 => Some((now, counter)),
        80..95 => Some((now - 2_000, counter)),
        _ => None,
    }
}

/// One client: calls until `stop`, one at a time. Its records, how many calls were refused with
/// another `-ERR`, and scans that listed what they should not have.
async fn client(
    id: usize,
    broker_port: u16,
    started: Instant,
    stop: Arc<std::sync::atomic::AtomicBool>,
    written: Arc<Mutex<Vec<Vec<String>>>>,
) -> (Vec<Record>, usize, Vec<String>) {
    // Without Nagle's algorithm, as the node's own connection: a call goes out as soon as the
    // previous one is answered and the client has thought for a moment.
    let client = RawClient::connect_with_nagle(broker_port, &format!("faults-client-{id}"), false).await;
    let (mut records, mut errors, mut wrong_scans) = (Vec::new(), 0, Vec::new());
    let mut seq = 0u64;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(fastrand::u64(..=THINK_TIME_MS))).await;
        seq += 1;
        let key = fastrand::usize(..KEYS);
        let mut value = format!("c{id}-{seq}");
        // A quarter of the writes lapse after a while (`PX`), some of them before the next write.
        let px_ms = (fastrand::u8(..4) == 0).then(|| [100, 300, 1_000, 3_000][fastrand::usize(..4)]);
        let call = match fastrand::u8(..100) {
            0..40 => Call::Set { value: value.clone(), condition: Condition::Always, px_ms },
            40..45 => Call::Set { value: value.clone(), condition: Condition::NotExists, px_ms },
            45..50 => {
                // A lease's holder renewing it: the value this client wrote to the key last, if
                // it wrote one (the key may hold another by now); else a first acquisition.
                let prefix = format!("c{id}-");
                let own = written.lock().unwrap()[key].iter().rev().find(|v| v.starts_with(&prefix)).cloned();
                value = own.unwrap_or(value);
                Call::Set { value: value.clone(), condition: Condition::NotExistsOrEqual, px_ms }
            }
            50..70 => Call::Get,
            70..75 => Call::Scan,
            75..87 => Call::Del,
            _ => {
                let known = written.lock().unwrap()[key].clone();
                match known.len() {
                    0 => Call::Get,
                    n => Call::VDel(known[fastrand::usize(..n)].clone()),
                }
            }
        };
        if matches!(call, Call::Set { .. }) {
            let mut written = written.lock().unwrap();
            written[key].push(value);
            if written[key].len() > 8 {
                written[key].remove(0);
            }
        }
        let payload = command(key, &call).encode();
        let token = fencing_token(key, &call);
        let mut properties = client.properties(&timestamp());
        if let Some((ms, counter)) = token {
            properties.user_properties.push(("__ft".into(), Hlc::new(ms, counter, "faults").to_string()));
        }
        let invoked = started.elapsed().as_micros() as u64;
        let received = client.request_with(&payload, properties, CALL_TIMEOUT).await;
        let mut returned = started.elapsed().as_micros() as u64;
        let mut op = Op { invoked, returned: None, call, token, answer: None };
        let mut version = None;
        if let Some(received) = received {
            let answer = match Response::decode(&received.payload) {
                Ok(Response::Keys { keys, token }) if op.call == Call::Scan => {
                    match rest_of_scan(&client, key, keys, token).await {
                        Ok(Some(listed)) => {
                            returned = started.elapsed().as_micros() as u64;
                            Some(Answer::Listed(listed))
                        }
                        Ok(None) => {
                            records.push(Record { key, op, version });
                            continue;
                        }
                        Err(wrong) => {
                            wrong_scans.push(wrong);
                            continue;
                        }
                    }
                }
                Ok(Response::Ok) => Some(Answer::Ok),
                Ok(Response::Int(n)) => Some(Answer::Int(n)),
                Ok(Response::Nil) => Some(Answer::Nil),
                Ok(Response::Value(v)) => Some(Answer::Value(String::from_utf8_lossy(&v).into_owned())),
                Ok(Response::Error(StoreError::FencingTokenRequired)) => Some(Answer::FencingRequired),
                Ok(Response::Error(StoreError::FencingTokenLowerVersion)) => Some(Answer::FencingLower),
                // Any other refusal (-ERR) changed nothing: it is not part of the history.
                Ok(Response::Error(_)) | Ok(Response::Keys { .. }) | Err(_) => {
                    errors += 1;
                    continue;
                }
            };
            op.returned = Some(returned);
            op.answer = answer;
            version = received.user("__ts").and_then(|ts| ts.parse::<Hlc>().ok());
        }
        records.push(Record { key, op, version });
    }
    (records, errors, wrong_scans)
}

/// The longest stretch (ms) in `[from, to]` without any answered call, given answer times (µs).
fn longest_silence(answers: &[u64], from: u64, to: u64) -> u64 {
    let mut last = from;
    let mut longest = 0;
    for &at in answers.iter().filter(|at| **at >= from && **at <= to) {
        longest = longest.max(at - last);
        last = at;
    }
    longest.max(to - last) / 1000
}

/// A fault cycle this long without any answer is named in the report (`FAULTS_LONG_GAP_MS`).
const LONG_GAP_MS: u64 = 2_000;

/// Copies every node's log (all its runs) into `dir`, as `node-<id>.log`.
fn keep_logs(cluster: &Cluster, dir: &std::path::Path) {
    std::fs::create_dir_all(dir).unwrap();
    for node in cluster.nodes.values() {
        std::fs::copy(&node.log, dir.join(format!("node-{}.log", node.id))).unwrap();
    }
    println!("node logs kept in {}", dir.display());
}

fn median(values: &mut [u64]) -> u64 {
    values.sort_unstable();
    values.get(values.len() / 2).copied().unwrap_or(0)
}

/// How long a run injects faults.
#[derive(Debug, Clone, Copy)]
#[allow(dead_code)] // each suite that shares this file runs by one of them
pub enum Until {
    /// For this many seconds.
    Secs(u64),
    /// This many fault cycles.
    Cycles(usize),
}

/// The faults a run injects in turn: those `FAULTS_KINDS` names (`kill,pause`), or else
/// `default_kinds`.
pub fn kinds_from_env(default_kinds: &[Fault]) -> Vec<Fault> {
    match std::env::var("FAULTS_KINDS") {
        Ok(list) => list.split(',').map(|name| Fault::named(name).expect("a fault kind")).collect(),
        Err(_) => default_kinds.to_vec(),
    }
}

/// Runs the clients while `kinds` of faults come in turn until `until`, then checks the
/// histories and the notifications and prints the report; panics on any anomaly.
pub async fn run(kinds: Vec<Fault>, until: Until) {
    crate::common::clock::assert_libfaketime();
    let power_cuts = kinds.iter().any(|kind| Fault::POWER_CUTS.contains(kind));
    let mut rig = Rig::start(power_cuts).await;
    let watcher = watch_every_key(rig.broker.port, "faults-watcher").await;
    let quitter = Arc::new(watch_every_key(rig.broker.port, "faults-quitter").await);
    let started = Instant::now();
    // The second watcher stops halfway: through the seconds, or through the cycles.
    let halfway = Arc::new(tokio::sync::Notify::new());
    let stopping = tokio::spawn({
        let (quitter, halfway) = (quitter.clone(), halfway.clone());
        async move {
            match until {
                Until::Secs(secs) => tokio::time::sleep(Duration::from_secs(secs / 2)).await,
                Until::Cycles(_) => halfway.notified().await,
            }
            stop_watching_every_key(&quitter, started).await
        }
    });
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let written = Arc::new(Mutex::new(vec![Vec::new(); KEYS]));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|id| tokio::spawn(client(id, rig.broker.port, started, stop.clone(), written.clone())))
        .collect();

    // Faults, one after another, with 3 s of calm between them.
    let mut faults: Vec<(Fault, u64, u64)> = Vec::new();
    let mut round = 0;
    tokio::time::sleep(Duration::from_secs(3)).await;
    loop {
        match until {
            Until::Secs(secs) if started.elapsed() >= Duration::from_secs(secs) => break,
            Until::Cycles(cycles) if round >= cycles => break,
            Until::Cycles(cycles) if round == cycles / 2 => halfway.notify_one(),
            _ => {}
        }
        let fault = kinds[round % kinds.len()];
        round += 1;
        let from = started.elapsed().as_micros() as u64;
        // The time of day (UTC) as the node logs give it.
        let day_ms = crate::common::now_ms() % 86_400_000;
        let clock = format!(
            "{:02}:{:02}:{:02}.{:03}",
            day_ms / 3_600_000,
            day_ms / 60_000 % 60,
            day_ms / 1000 % 60,
            day_ms % 1000
        );
        let what = rig.inject(fault).await;
        let healed = started.elapsed().as_micros() as u64;
        println!("{:6.1} s  {clock}  {:<18} {what}", from as f64 / 1e6, fault.name());
        faults.push((fault, from, healed));
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut records, mut errors, mut anomalies) = (Vec::new(), 0, Vec::new());
    for client in clients {
        let (r, e, wrong_scans) = client.await.unwrap();
        records.extend(r);
        errors += e;
        anomalies.extend(wrong_scans);
    }
    let ended = started.elapsed().as_micros() as u64;

    // Every node is ready again, and a final read of every key joins the histories.
    rig.cluster.wait_ready().await;
    let reader = RawClient::connect(rig.broker.port, "faults-final-reader").await;
    for key in 0..KEYS {
        let invoked = started.elapsed().as_micros() as u64;
        let received = reader.request(&command(key, &Call::Get).encode(), &timestamp()).await;
        let answer = match Response::decode(&received.payload).unwrap() {
            Response::Nil => Answer::Nil,
            Response::Value(v) => Answer::Value(String::from_utf8_lossy(&v).into_owned()),
            other => panic!("the final read of lin-{key} answered {other:?}"),
        };
        let returned = started.elapsed().as_micros() as u64;
        let op = Op { invoked, returned: Some(returned), call: Call::Get, token: None, answer: Some(answer) };
        records.push(Record { key, op, version: None });
    }

    // Linearizability per key, and versions of acknowledged writes rising in real time.
    let checking = Instant::now();
    for key in 0..KEYS {
        let ops: Vec<Op> = records.iter().filter(|r| r.key == key).map(|r| r.op.clone()).collect();
        let budget = (ops.len() * CHECK_BUDGET_PER_OP).max(2_000_000);
        match crate::checker::check(&ops, budget) {
            Verdict::Linearizable => {}
            Verdict::NotLinearizable(why) => anomalies.push(format!("lin-{key} is not linearizable: {why}")),
            Verdict::Undecided => anomalies.push(format!("lin-{key}: undecided within {budget} states")),
        }
        // Each write's version is above every version acknowledged before it was invoked: the
        // writes in order of invocation, against the highest version of those that returned
        // before (in order of return).
        let writes: Vec<(&Op, &Hlc)> = records
            .iter()
            .filter(|r| r.key == key && is_write(&r.op))
            .filter_map(|r| r.version.as_ref().map(|v| (&r.op, v)))
            .collect();
        let mut by_invocation = writes.clone();
        by_invocation.sort_by_key(|(op, _)| op.invoked);
        let mut by_return: Vec<(u64, &Hlc)> =
            writes.iter().filter_map(|(op, v)| op.returned.map(|returned| (returned, *v))).collect();
        by_return.sort_by_key(|(returned, _)| *returned);
        let (mut returned_before, mut highest): (usize, Option<&Hlc>) = (0, None);
        for (b, vb) in by_invocation {
            while by_return.get(returned_before).is_some_and(|(returned, _)| *returned < b.invoked) {
                highest = highest.max(Some(by_return[returned_before].1));
                returned_before += 1;
            }
            if let Some(va) = highest.filter(|va| *va >= vb) {
                anomalies.push(format!("lin-{key}: version {vb} after {va}, which was acknowledged before it"));
            }
        }
    }

    anomalies.extend(check_notifications(&watcher, &records).await);
    anomalies.extend(check_stopped(&quitter, &stopping.await.unwrap(), &records));
    let checked_in = checking.elapsed();

    // The longest time without an answer around each fault: from its start until the next one
    // starts (the calm after it included).
    let mut answers: Vec<u64> =
        records.iter().filter_map(|r| r.op.returned.filter(|_| r.op.answer.is_some())).collect();
    answers.sort_unstable();
    let mut gaps: BTreeMap<Fault, Vec<u64>> = BTreeMap::new();
    let mut long_gaps = Vec::new();
    let long_gap_ms = std::env::var("FAULTS_LONG_GAP_MS").ok().and_then(|s| s.parse().ok()).unwrap_or(LONG_GAP_MS);
    for (i, (fault, from, _)) in faults.iter().enumerate() {
        let until = faults.get(i + 1).map_or(ended, |next| next.1);
        let gap = longest_silence(&answers, *from, until);
        if gap >= long_gap_ms {
            long_gaps.push(format!("{:.1} s {} ({gap} ms)", *from as f64 / 1e6, fault.name()));
        }
        gaps.entry(*fault).or_default().push(gap);
    }
    let answered = records.iter().filter(|r| r.op.answer.is_some()).count();
    let unanswered = records.len() - answered;
    let answered_with = |answer: Answer| records.iter().filter(|r| r.op.answer.as_ref() == Some(&answer)).count();
    println!(
        "\n{} s, {} calls: {answered} answered ({} fencing token required, {} lower; {} scans listed the key, {} \
         did not), {unanswered} unanswered, {errors} refused with another -ERR",
        started.elapsed().as_secs(),
        records.len(),
        answered_with(Answer::FencingRequired),
        answered_with(Answer::FencingLower),
        answered_with(Answer::Listed(true)),
        answered_with(Answer::Listed(false)),
    );
    println!("{:<18} {:>6} {:>22} {:>18}", "fault", "cycles", "no answer, median ms", "no answer, max ms");
    for (fault, values) in &mut gaps {
        let max = values.iter().copied().max().unwrap_or(0);
        println!("{:<18} {:>6} {:>22} {:>18}", fault.name(), values.len(), median(values), max);
    }
    if !long_gaps.is_empty() {
        println!("{long_gap_ms} ms or more without an answer after: {}", long_gaps.join(", "));
    }
    if let Ok(dir) = std::env::var("FAULTS_KEEP_LOGS") {
        keep_logs(&rig.cluster, std::path::Path::new(&dir));
    }
    println!(
        "anomalies (lost acknowledged writes and notifications included): {} (checked in {:.1} s)",
        anomalies.len(),
        checked_in.as_secs_f64()
    );
    for anomaly in &anomalies {
        println!("  {anomaly}");
    }
    if power_cuts {
        let cuts = &rig.power_cuts;
        let restarts = cuts.all * NODES as usize + cuts.leader + cuts.follower;
        let acknowledged = records.iter().filter(|r| is_write(&r.op)).count();
        let not_linearizable = anomalies.iter().filter(|a| a.contains("not linearizable")).count();
        println!(
            "power cuts: {} of every node, {} of one node ({} of the leader, {} of a follower); {} of the {restarts} \
             file systems cut torn; {} unsynced bytes dropped, {} kept by tears",
            cuts.all,
            cuts.leader + cuts.follower,
            cuts.leader,
            cuts.follower,
            cuts.torn,
            cuts.lost_bytes,
            cuts.kept_bytes
        );
        println!(
            "acknowledged writes: {acknowledged}; lost: {}; nodes that needed an operator to start: 0 of {restarts} \
             restarts; anomalies: {}",
            if not_linearizable == 0 {
                "0".to_string()
            } else {
                format!("? ({not_linearizable} keys not linearizable)")
            },
            anomalies.len()
        );
    }
    assert!(anomalies.is_empty(), "{}", anomalies.join("\n"));
    for (fault, values) in &gaps {
        let max = values.iter().copied().max().unwrap_or(0);
        assert!(max < 15_000, "{}: {max} ms without any answer\n{}", fault.name(), rig.cluster.logs());
    }
}
