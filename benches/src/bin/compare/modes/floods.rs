//! `floods` (cluster only): hostile clients against the bounds the store keeps on what a client
//! can make it hold, each on a fresh cluster, with a well-behaved client measured meanwhile.
//!
//! Each flood: a fresh cluster; the well-behaved client (a few SET+GET pairs in flight on its own
//! keys) alone for `--quiet-secs`; then the flood and the same client together for
//! `--flood-secs`; then `--settle-secs` without either. Every second the nodes' RSS, data
//! directory sizes and the flood's gauges are read; the report gives them before, at the peak
//! and after, what the flooder was answered, the client's p50/p99 quiet and during the flood, and
//! whether each bound held: the gauge within its budget, and each node's growth of RSS and of disk
//! within what the documentation lets the flood make it keep plus a stated slack.
//!
//! - `dedup`: SETs of one key, each with new correlation data (`--correlation-bytes`) and a
//!   message expiry of a year: every one leaves a dedup record until `max_dedup_bytes`.
//! - `large-values`: SETs of `--value-bytes` values over 64 keys while one follower is stopped
//!   (SIGSTOP) 3 s of every 4: its shadow and dispatcher fill while it cannot read.
//! - `registrations`: KEYNOTIFY of 1,100 keys by each of many made-up client ids: past 1,000 for
//!   each client and 100,000 in all.
//! - `slow-http`: `--http-connections` connections to each follower's HTTP port that send part
//!   of a header and then nothing (and a tenth: a POST whose body trickles a byte a second),
//!   reconnecting when closed. Raft rides the same ports.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use statestore_protocol::{Get, KeyNotify, Set};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;

use super::Run;
use crate::cluster::{metric_sum, StatestoreCluster};
use crate::load::{LoadHandle, RequestError};
use crate::mqtt_load::{Envelope, MqttLoad, RequestOptions};
use crate::report::{self, Table};
use crate::stats::{Percentiles, Recorder, Recording};
use crate::targets::{Target, TargetKind};

const MIB: f64 = 1024.0 * 1024.0;

/// The node's defaults the floods run against (docs/operations.md, *Security*; docs/protocol.md,
/// *Dedup* and *Quotas*; the *Known limits*).
const MAX_DEDUP_BYTES: f64 = 256.0 * MIB;
const SHADOW_MAX_BYTES: f64 = 128.0 * MIB;
const DISPATCH_MAX_BYTES: f64 = 64.0 * MIB;
const REGISTRATIONS_PER_CLIENT: u64 = 1_000;
const REGISTRATIONS_IN_ALL: u64 = 100_000;
const HTTP_MAX_CONNECTIONS: usize = 1024;
/// What the log may hold beside the state: up to `--snapshot-log-bytes` (64 MiB, scaled by up to
/// 5/3 after the node's id) since the last snapshot, and `--logs-kept` (1,000) entries below it.
const SNAPSHOT_LOG_BYTES: f64 = 64.0 * MIB * 5.0 / 3.0;
const LOGS_KEPT: f64 = 1_000.0;

/// Growth beyond the documented budget that still counts as the bound holding: allocator and
/// RocksDB memtables for memory, RocksDB's WAL, flushes and compactions for disk.
const RSS_SLACK: f64 = 128.0 * MIB;
const DISK_SLACK: f64 = 256.0 * MIB;

/// Message expiry of the dedup flood's requests: a year (the node keeps records 11 minutes).
const YEAR_SECS: u32 = 365 * 24 * 3600;
/// Keys the large-value flood writes over: their values stay far below `max_bytes`.
const LARGE_KEYS: u64 = 64;
/// Keys each made-up client of the registration flood registers for.
const KEYS_PER_CLIENT: u64 = 1_100;
/// The slowed follower's duty cycle: stopped, then running.
const STOPPED: Duration = Duration::from_secs(3);
const RUNNING: Duration = Duration::from_secs(1);
/// The well-behaved client's keys per slot and value size.
const GOOD_KEYS: u64 = 50;
const GOOD_VALUE: usize = 256;
/// A p99 during the flood more than this many times the quiet one is reported as degraded.
const DEGRADED_P99: f64 = 10.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Flood {
    Dedup,
    LargeValues,
    Registrations,
    SlowHttp,
}

impl Flood {
    fn name(self) -> &'static str {
        match self {
            Flood::Dedup => "dedup",
            Flood::LargeValues => "large-values",
            Flood::Registrations => "registrations",
            Flood::SlowHttp => "slow-http",
        }
    }
}

/// The settings of a floods run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub floods: Vec<Flood>,
    pub quiet: Duration,
    pub flood: Duration,
    pub settle: Duration,
    /// The well-behaved client's SET+GET pairs in flight.
    pub good_inflight: usize,
    /// The flooder's requests in flight (dedup and registrations).
    pub flood_inflight: usize,
    /// The large-value flood's requests in flight.
    pub large_inflight: usize,
    pub correlation_bytes: usize,
    pub value_bytes: usize,
    /// Slow connections held open to each follower.
    pub http_connections: usize,
}

/// What one node measured: before the flood, the highest during it (and the settling), after.
#[derive(Debug, Clone, Copy, Default)]
struct Span {
    before: f64,
    peak: f64,
    after: f64,
}

impl Span {
    fn start(value: f64) -> Span {
        Span { before: value, peak: value, after: value }
    }

    fn see(&mut self, value: f64) {
        self.peak = self.peak.max(value);
        self.after = value;
    }

    fn growth(&self) -> f64 {
        self.peak - self.before
    }
}

/// Outcomes of the flooder's requests by kind.
#[derive(Default)]
struct Tally {
    counts: Mutex<BTreeMap<String, u64>>,
    sent: AtomicU64,
    /// Successful answers per made-up client (the registration flood).
    per_client: Mutex<BTreeMap<u64, u64>>,
}

impl Tally {
    fn add(&self, what: impl Into<String>) {
        *self.counts.lock().unwrap().entry(what.into()).or_default() += 1;
    }

    fn most_for_one_client(&self) -> u64 {
        self.per_client.lock().unwrap().values().copied().max().unwrap_or(0)
    }

    fn get(&self, what: &str) -> u64 {
        self.counts.lock().unwrap().get(what).copied().unwrap_or(0)
    }

    fn render(&self) -> String {
        let counts = self.counts.lock().unwrap();
        counts.iter().map(|(what, n)| format!("{n} {what}")).collect::<Vec<_>>().join("; ")
    }
}

/// One flood's figures.
struct Outcome {
    flood: Flood,
    quiet: Recording,
    during: Recording,
    rss: Vec<Span>,
    disk: Vec<Span>,
    /// The broker's RSS (not the store's to bound, but where a flood may pile up).
    broker: Span,
    /// Named gauges or counters (the highest any node reported): before, peak, after.
    gauges: Vec<(String, Span)>,
    tally: Arc<Tally>,
    elections: Option<u64>,
    /// Each figure checked: what, measured, allowed.
    checks: Vec<(String, f64, f64)>,
    notes: Vec<String>,
}

impl Outcome {
    fn held(&self) -> bool {
        self.checks.iter().all(|(_, measured, allowed)| measured <= allowed) && self.elections.unwrap_or(0) == 0
    }

    fn p99_ratio(&self) -> f64 {
        let (quiet, during) = (Percentiles::from(&self.quiet.latencies), Percentiles::from(&self.during.latencies));
        during.p99 / quiet.p99
    }
}

pub async fn floods(run: &mut Run, plan: Plan) -> anyhow::Result<()> {
    crate::cluster::check_binary(&run.setup.nodes_binary, Some("--cluster-secret-file"))?;
    let mut outcomes = Vec::new();
    for flood in plan.floods.clone() {
        run.progress.line(&format!("{}: starting a fresh cluster", flood.name()));
        match one_flood(run, &plan, flood).await {
            Ok(outcome) => {
                run.progress.line(&format!("{}: {}", flood.name(), verdict(&outcome)));
                outcomes.push(outcome);
            }
            Err(error) => {
                let text = format!("{}: FAILED: {error:#}", flood.name());
                run.progress.line(&text);
                run.say(text);
            }
        }
    }
    report(run, &plan, &outcomes)
}

async fn one_flood(run: &mut Run, plan: &Plan, flood: Flood) -> anyhow::Result<Outcome> {
    let slots = plan.good_inflight.max(1);
    let mut target = Target::start(TargetKind::Cluster, &run.setup, slots, false).await?;
    let broker_port = target.broker_port().context("the cluster has a broker")?;
    let good = Arc::new(MqttLoad::connect(broker_port, slots, run.setup.request).await?);

    // Quiet: the well-behaved client alone.
    let quiet = Arc::new(Recorder::new(Instant::now() + Duration::from_secs(1), plan.quiet, false));
    let load = well_behaved(good.clone(), slots, quiet.clone());
    watch(run, &mut target, quiet.from() + plan.quiet, &format!("{}: quiet", flood.name())).await?;
    load.finish().await;
    let quiet = quiet.snapshot();

    let cluster = target.cluster.as_ref().context("the cluster target has nodes")?;
    let leader = cluster.leader().await.context("no leader before the flood")?;
    let followers: Vec<usize> = (0..cluster.len()).filter(|&i| i != leader).collect();
    let names = gauge_names(flood);
    let mut rss: Vec<Span> = (0..cluster.len()).map(|i| Span::start(rss_bytes(cluster, i))).collect();
    let mut disk: Vec<Span> = (0..cluster.len()).map(|i| Span::start(dir_bytes(cluster.data_dir(i)))).collect();
    let before = read_gauges(cluster, &names).await;
    let mut gauges: Vec<(String, Span)> =
        names.iter().zip(before).map(|(n, v)| (n.0.clone(), Span::start(v))).collect();
    let term_before = cluster.highest_term().await;
    let broker_pid = target.broker_pid().context("the cluster has a broker")?;
    let broker_rss = || crate::processes::rss_mib(broker_pid).map_or(f64::NAN, |mib| mib * MIB);
    let mut broker = Span::start(broker_rss());

    // The flood, and the client beside it.
    let tally = Arc::new(Tally::default());
    let request = run.setup.request;
    let stop = Arc::new(AtomicBool::new(false));
    let mut notes = Vec::new();
    let flooder =
        start_flood(flood, plan, broker_port, request, cluster, &followers, &tally, &stop, &mut notes).await?;
    let during = Arc::new(Recorder::new(Instant::now(), plan.flood, false));
    let load = well_behaved(good.clone(), slots, during.clone());
    let mut sample =
        Sampler { rss: &mut rss, disk: &mut disk, broker: &mut broker, broker_pid, gauges: &mut gauges, names: &names };
    let label = format!("{}: flood", flood.name());
    sample_until(run, &mut target, during.from() + plan.flood, &label, &mut sample, &tally).await?;
    stop.store(true, Ordering::Relaxed);
    let held_open = flooder.finish().await;
    load.finish().await;
    let during = during.snapshot();
    let label = format!("{}: settling", flood.name());
    sample_until(run, &mut target, Instant::now() + plan.settle, &label, &mut sample, &tally).await?;
    let cluster = target.cluster.as_ref().context("the cluster target has nodes")?;
    let term_after = cluster.highest_term().await;
    let elections = term_after.zip(term_before).map(|(after, before)| after.saturating_sub(before));
    if let Some(peak) = held_open {
        notes.push(format!("the flooder held at most {peak} slow connections open at once to each follower"));
    }

    let checks = checks(flood, plan, &rss, &disk, &gauges, &tally);
    Ok(Outcome { flood, quiet, during, rss, disk, broker, gauges, tally, elections, checks, notes })
}

/// The gauges read for each flood: (name as reported, metric, label text a line must hold).
fn gauge_names(flood: Flood) -> Vec<(String, &'static str, &'static str)> {
    let named = |label: &str, metric: &'static str, filter: &'static str| (label.to_string(), metric, filter);
    let mut names = match flood {
        Flood::Dedup => vec![
            named("dedup_records", "statestore_dedup_records", ""),
            named("dedup_bytes", "statestore_dedup_bytes", ""),
        ],
        Flood::LargeValues => vec![
            named("shadow_requests", "statestore_shadow_requests", ""),
            named("dropped_dispatch_full", "statestore_requests_dropped_total", "reason=\"dispatch_full\""),
            named("dropped_shadow_full", "statestore_requests_dropped_total", "reason=\"shadow_full\""),
        ],
        Flood::Registrations => vec![],
        Flood::SlowHttp => vec![named("raft_term", "statestore_raft_term", "")],
    };
    names.push(named("leader_changes_seen", "statestore_raft_leader_changes_seen_total", ""));
    names
}

/// The highest value any node reports of each gauge (NaN when none does).
async fn read_gauges(cluster: &StatestoreCluster, names: &[(String, &'static str, &'static str)]) -> Vec<f64> {
    // At once: a stopped node answers nothing within the client's 2 s.
    let (a, b, c) = tokio::join!(cluster.metrics(0), cluster.metrics(1), cluster.metrics(2));
    let texts = [a, b, c];
    names
        .iter()
        .map(|(_, metric, filter)| {
            texts
                .iter()
                .filter_map(|text| metric_matching(text, metric, filter))
                .fold(f64::NAN, |highest: f64, value| if highest.is_nan() { value } else { highest.max(value) })
        })
        .collect()
}

/// The sum of the lines of `metric` whose labels hold `filter`.
fn metric_matching(text: &str, metric: &str, filter: &str) -> Option<f64> {
    if filter.is_empty() {
        return metric_sum(text, metric);
    }
    let lines: String = text.lines().filter(|line| line.contains(filter)).map(|line| format!("{line}\n")).collect();
    metric_sum(&lines, metric).or(Some(0.0)).filter(|_| metric_sum(text, metric).is_some())
}

struct Sampler<'a> {
    rss: &'a mut Vec<Span>,
    disk: &'a mut Vec<Span>,
    broker: &'a mut Span,
    broker_pid: u32,
    gauges: &'a mut Vec<(String, Span)>,
    names: &'a [(String, &'static str, &'static str)],
}

/// Samples every second until `until`, printing progress.
async fn sample_until(
    run: &mut Run,
    target: &mut Target,
    until: Instant,
    label: &str,
    sample: &mut Sampler<'_>,
    tally: &Tally,
) -> anyhow::Result<()> {
    let started = Instant::now();
    while Instant::now() < until {
        tokio::time::sleep(until.saturating_duration_since(Instant::now()).min(Duration::from_secs(1))).await;
        target.check_running()?;
        let cluster = target.cluster.as_ref().context("the cluster target has nodes")?;
        for index in 0..cluster.len() {
            sample.rss[index].see(rss_bytes(cluster, index));
            sample.disk[index].see(dir_bytes(cluster.data_dir(index)));
        }
        sample.broker.see(crate::processes::rss_mib(sample.broker_pid).map_or(f64::NAN, |mib| mib * MIB));
        let values = read_gauges(cluster, sample.names).await;
        for ((_, span), value) in sample.gauges.iter_mut().zip(values) {
            if value.is_finite() {
                span.see(value);
            }
        }
        let rss: Vec<String> = sample.rss.iter().map(|s| format!("{:.0}", s.after / MIB)).collect();
        run.progress.update(&format!(
            "{label}: {:.0} s, RSS MiB {}, flooder sent {}",
            started.elapsed().as_secs_f64(),
            rss.join("/"),
            tally.sent.load(Ordering::Relaxed)
        ));
    }
    Ok(())
}

/// Waits until `until`, checking the target, printing progress.
async fn watch(run: &mut Run, target: &mut Target, until: Instant, label: &str) -> anyhow::Result<()> {
    while Instant::now() < until {
        tokio::time::sleep(until.saturating_duration_since(Instant::now()).min(Duration::from_secs(1))).await;
        target.check_running()?;
        run.progress.update(label);
    }
    Ok(())
}

fn rss_bytes(cluster: &StatestoreCluster, index: usize) -> f64 {
    crate::processes::rss_mib(cluster.pid(index)).map_or(f64::NAN, |mib| mib * MIB)
}

/// Bytes the files under `dir` take on disk (allocated blocks); 0 when it cannot be read.
pub fn dir_bytes(dir: &Path) -> f64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else { return 0.0 };
    entries
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(meta) if meta.is_dir() => dir_bytes(&entry.path()),
            Ok(meta) => meta.blocks() as f64 * 512.0,
            Err(_) => 0.0,
        })
        .sum()
}

/// The well-behaved client: `slots` loops, each a SET of one of its own keys and a GET of it,
/// every answer recorded.
fn well_behaved(load: Arc<MqttLoad>, slots: usize, recorder: Arc<Recorder>) -> LoadHandle {
    let stop = Arc::new(AtomicBool::new(false));
    let value: Arc<Vec<u8>> = Arc::new((0..GOOD_VALUE).map(|_| fastrand::u8(..)).collect());
    let tasks = (0..slots)
        .map(|slot| {
            let (load, recorder, stop, value) = (load.clone(), recorder.clone(), stop.clone(), value.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("good-{slot}-{}", n % GOOD_KEYS).into_bytes();
                    n += 1;
                    for payload in [Set::new(key.clone(), value.to_vec()).encode(), Get { key: key.clone() }.encode()] {
                        let sent = Instant::now();
                        let outcome = match load.request(slot, payload, &Envelope::default()).await {
                            Ok(reply) => reply.error().map_or(Ok(()), Err),
                            Err(error) => Err(error.to_string()),
                        };
                        recorder.record(sent, outcome);
                    }
                }
            })
        })
        .collect();
    LoadHandle::new(stop, tasks)
}

/// A running flood; `finish` stops it and returns, for the slow-HTTP flood, the most connections
/// it held open at once to one follower.
struct Flooder {
    tasks: Vec<JoinHandle<()>>,
    held_peak: Option<Arc<Vec<AtomicUsize>>>,
    /// The slowed follower, continued when the flood ends (or is dropped).
    stopped: Option<u32>,
}

impl Flooder {
    async fn finish(mut self) -> Option<usize> {
        for task in std::mem::take(&mut self.tasks) {
            let _ = task.await;
        }
        if let Some(pid) = self.stopped.take() {
            signal(pid, libc::SIGCONT);
        }
        self.held_peak.as_ref().map(|peaks| peaks.iter().map(|p| p.load(Ordering::Relaxed)).max().unwrap_or(0))
    }
}

impl Drop for Flooder {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        if let Some(pid) = self.stopped.take() {
            signal(pid, libc::SIGCONT);
        }
    }
}

fn signal(pid: u32, signal: libc::c_int) {
    // SAFETY: kill(2) on a child process id this run started.
    unsafe {
        libc::kill(pid as libc::pid_t, signal);
    }
}

#[allow(clippy::too_many_arguments)]
async fn start_flood(
    flood: Flood,
    plan: &Plan,
    broker_port: u16,
    request: RequestOptions,
    cluster: &StatestoreCluster,
    followers: &[usize],
    tally: &Arc<Tally>,
    stop: &Arc<AtomicBool>,
    notes: &mut Vec<String>,
) -> anyhow::Result<Flooder> {
    match flood {
        Flood::Dedup => {
            let load = Arc::new(MqttLoad::connect(broker_port, plan.flood_inflight, request).await?);
            let envelope = Envelope {
                correlation_bytes: Some(plan.correlation_bytes),
                message_expiry_secs: Some(YEAR_SECS),
                ..Envelope::default()
            };
            notes.push(format!(
                "flooder: {} in flight, SETs of one key, {} bytes of new correlation data each, message expiry {YEAR_SECS} s",
                plan.flood_inflight, plan.correlation_bytes
            ));
            let payload = Arc::new(Set::new(b"flood-dedup".to_vec(), b"x".to_vec()).encode());
            let make = move |_n: u64| ((*payload).clone(), envelope.clone(), None);
            Ok(request_flood(load, plan.flood_inflight, tally, stop, make))
        }
        Flood::LargeValues => {
            let load = Arc::new(MqttLoad::connect(broker_port, plan.large_inflight, request).await?);
            let value: Arc<Vec<u8>> = Arc::new((0..plan.value_bytes).map(|_| fastrand::u8(..)).collect());
            let slowed = *followers.first().context("a follower to slow")?;
            let pid = cluster.pid(slowed);
            notes.push(format!(
                "flooder: {} in flight, SETs of {} byte values over {LARGE_KEYS} keys; node{} (a follower) stopped {} s of every {} s",
                plan.large_inflight,
                plan.value_bytes,
                cluster.id(slowed),
                STOPPED.as_secs(),
                (STOPPED + RUNNING).as_secs()
            ));
            let make = move |n: u64| {
                (
                    Set::new(format!("flood-big-{}", n % LARGE_KEYS).into_bytes(), value.to_vec()).encode(),
                    Envelope::default(),
                    None,
                )
            };
            let mut flooder = request_flood(load, plan.large_inflight, tally, stop, make);
            let stop = stop.clone();
            flooder.tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    signal(pid, libc::SIGSTOP);
                    tokio::time::sleep(STOPPED).await;
                    signal(pid, libc::SIGCONT);
                    tokio::time::sleep(RUNNING).await;
                }
            }));
            flooder.stopped = Some(pid);
            Ok(flooder)
        }
        Flood::Registrations => {
            let load = Arc::new(MqttLoad::connect_as_many(broker_port, plan.flood_inflight, request).await?);
            let run = format!("{:06x}", fastrand::u32(..) & 0xff_ffff);
            notes.push(format!(
                "flooder: {} in flight, KEYNOTIFY of {KEYS_PER_CLIENT} keys by each made-up client id in turn",
                plan.flood_inflight
            ));
            let make = move |n: u64| {
                let (client, key) = (n / KEYS_PER_CLIENT, n % KEYS_PER_CLIENT);
                let envelope = Envelope { client_id: Some(format!("f{run}c{client}")), ..Envelope::default() };
                let payload = KeyNotify { key: format!("watch-{key}").into_bytes(), stop: false }.encode();
                (payload, envelope, Some(client))
            };
            Ok(request_flood(load, plan.flood_inflight, tally, stop, make))
        }
        Flood::SlowHttp => {
            let per_node = plan.http_connections;
            let peaks = Arc::new((0..followers.len()).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>());
            let open = Arc::new((0..followers.len()).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>());
            let mut tasks = Vec::new();
            for (f, &index) in followers.iter().enumerate() {
                let port = cluster.port(index);
                for n in 0..per_node {
                    let slow_body = n % 10 == 9;
                    let (tally, stop, peaks, open) = (tally.clone(), stop.clone(), peaks.clone(), open.clone());
                    tasks.push(tokio::spawn(async move {
                        slow_connection(port, slow_body, &tally, &stop, &peaks[f], &open[f]).await;
                    }));
                }
            }
            let ports: Vec<String> = followers.iter().map(|&i| format!("node{}", cluster.id(i))).collect();
            notes.push(format!(
                "flooder: {per_node} connections to the HTTP port of each follower ({}), nine in ten a partial header \
                 then nothing, one in ten a POST /v1/command whose 1,000,000-byte body trickles a byte a second; \
                 each reconnects when closed",
                ports.join(", ")
            ));
            Ok(Flooder { tasks, held_peak: Some(peaks), stopped: None })
        }
    }
}

/// `inflight` loops sending what `make` returns for request number n, each answer tallied (and
/// successes per made-up client, when `make` names one).
fn request_flood(
    load: Arc<MqttLoad>,
    inflight: usize,
    tally: &Arc<Tally>,
    stop: &Arc<AtomicBool>,
    make: impl Fn(u64) -> (Vec<u8>, Envelope, Option<u64>) + Send + Sync + 'static,
) -> Flooder {
    let make = Arc::new(make);
    let counter = Arc::new(AtomicU64::new(0));
    let tasks = (0..inflight.max(1))
        .map(|slot| {
            let (load, tally, stop, make, counter) =
                (load.clone(), tally.clone(), stop.clone(), make.clone(), counter.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let n = counter.fetch_add(1, Ordering::Relaxed);
                    let (payload, envelope, client) = make(n);
                    tally.sent.fetch_add(1, Ordering::Relaxed);
                    let what = match load.request(slot, payload, &envelope).await {
                        Ok(reply) => match reply.error() {
                            None => "ok".to_string(),
                            Some(error) => error,
                        },
                        Err(RequestError::Timeout) => "no answer within the timeout".to_string(),
                        Err(error) => error.to_string(),
                    };
                    if let (Some(client), "ok") = (client, what.as_str()) {
                        *tally.per_client.lock().unwrap().entry(client).or_default() += 1;
                    }
                    tally.add(what);
                }
            })
        })
        .collect();
    Flooder { tasks, held_peak: None, stopped: None }
}

/// One slow client of a node's HTTP port, reconnecting whenever the node closes it: what the
/// node answered (or that it closed without an answer) is tallied.
async fn slow_connection(
    port: u16,
    slow_body: bool,
    tally: &Tally,
    stop: &AtomicBool,
    peak: &AtomicUsize,
    open: &AtomicUsize,
) {
    let head: &[u8] = if slow_body {
        b"POST /v1/command HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\nContent-Length: 1000000\r\n\r\n"
    } else {
        b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slow"
    };
    while !stop.load(Ordering::Relaxed) {
        let connected =
            tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(("127.0.0.1", port))).await;
        let Ok(Ok(mut stream)) = connected else {
            tally.add("slow http: connect failed");
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        tally.sent.fetch_add(1, Ordering::Relaxed);
        let now_open = open.fetch_add(1, Ordering::Relaxed) + 1;
        peak.fetch_max(now_open, Ordering::Relaxed);
        let opened = Instant::now();
        let mut outcome = String::new();
        if stream.write_all(head).await.is_ok() {
            let mut buffer = [0u8; 512];
            let mut answer = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            loop {
                tokio::select! {
                    read = stream.read(&mut buffer) => match read {
                        Ok(0) | Err(_) => break,
                        Ok(n) => answer.extend_from_slice(&buffer[..n]),
                    },
                    _ = tick.tick() => {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        if slow_body && stream.write_all(b"x").await.is_err() {
                            break;
                        }
                    }
                }
            }
            if !stop.load(Ordering::Relaxed) || !answer.is_empty() {
                let status = String::from_utf8_lossy(&answer).split_whitespace().nth(1).unwrap_or("").to_string();
                let held = opened.elapsed().as_secs_f64();
                let kind = if slow_body { "slow body" } else { "partial header" };
                outcome = if status.is_empty() {
                    format!("{kind}: closed by the node without an answer after {:.0} s", held.round())
                } else {
                    format!("{kind}: answered {status}")
                };
            }
        } else {
            outcome = "slow http: write failed".to_string();
        }
        open.fetch_sub(1, Ordering::Relaxed);
        if !outcome.is_empty() {
            tally.add(outcome);
        }
    }
}

fn checks(
    flood: Flood,
    plan: &Plan,
    rss: &[Span],
    disk: &[Span],
    gauges: &[(String, Span)],
    tally: &Tally,
) -> Vec<(String, f64, f64)> {
    let gauge = |name: &str| gauges.iter().find(|(n, _)| n == name).map_or(f64::NAN, |(_, s)| s.peak);
    let mut checks = Vec::new();
    // (RSS allowed, disk allowed) per node, beyond the slack.
    let (rss_budget, disk_budget) = match flood {
        Flood::Dedup => {
            // The budget is checked before a record is added: the last one may pass it.
            let request = plan.correlation_bytes as f64 + 256.0;
            checks.push((
                "dedup_bytes peak (MiB; the budget + one record)".to_string(),
                gauge("dedup_bytes") / MIB,
                (MAX_DEDUP_BYTES + request) / MIB,
            ));
            // The records are on disk; memory holds 32 bytes of index per record.
            (MAX_DEDUP_BYTES / request * 32.0, MAX_DEDUP_BYTES + SNAPSHOT_LOG_BYTES + LOGS_KEPT * request)
        }
        Flood::LargeValues => {
            let request = plan.value_bytes as f64 + 256.0;
            (
                SHADOW_MAX_BYTES + DISPATCH_MAX_BYTES,
                LARGE_KEYS as f64 * request + SNAPSHOT_LOG_BYTES + LOGS_KEPT * request,
            )
        }
        Flood::Registrations => {
            checks.push((
                "registrations of the client with the most".to_string(),
                tally.most_for_one_client() as f64,
                REGISTRATIONS_PER_CLIENT as f64,
            ));
            let registered = tally.get("ok") as f64;
            checks.push(("registrations in all".to_string(), registered, REGISTRATIONS_IN_ALL as f64));
            // About 200 bytes each in memory (the id, the key, the maps' nodes), and the log.
            let each = 200.0;
            (
                REGISTRATIONS_IN_ALL as f64 * each,
                REGISTRATIONS_IN_ALL as f64 * each + SNAPSHOT_LOG_BYTES + LOGS_KEPT * 512.0,
            )
        }
        Flood::SlowHttp => {
            // A connection's buffers: 64 KiB each, generously.
            (HTTP_MAX_CONNECTIONS as f64 * 64.0 * 1024.0, SNAPSHOT_LOG_BYTES)
        }
    };
    // Requests of an MQTT flood also wait in every node's dispatcher and in the followers'
    // shadows, each bounded (docs/protocol.md, *Known limits*).
    let rss_budget = match flood {
        Flood::Dedup | Flood::Registrations => rss_budget + SHADOW_MAX_BYTES + DISPATCH_MAX_BYTES,
        Flood::LargeValues | Flood::SlowHttp => rss_budget,
    };
    for (index, span) in rss.iter().enumerate() {
        checks.push((
            format!("node{} RSS growth (MiB)", index + 1),
            span.growth() / MIB,
            (rss_budget + RSS_SLACK) / MIB,
        ));
    }
    for (index, span) in disk.iter().enumerate() {
        checks.push((
            format!("node{} disk growth (MiB)", index + 1),
            span.growth() / MIB,
            (disk_budget + DISK_SLACK) / MIB,
        ));
    }
    checks
}

fn verdict(outcome: &Outcome) -> String {
    let failed: Vec<String> = outcome
        .checks
        .iter()
        .filter(|(_, measured, allowed)| measured > allowed)
        .map(|(what, measured, allowed)| format!("{what} {measured:.1} > {allowed:.1}"))
        .collect();
    let ratio = outcome.p99_ratio();
    let elections = match outcome.elections {
        Some(0) => "no election".to_string(),
        Some(n) => format!("{n} election(s)"),
        None => "elections unknown".to_string(),
    };
    let degraded = if ratio > DEGRADED_P99 { format!(" (over {DEGRADED_P99}x: degraded)") } else { String::new() };
    format!(
        "bound {}; {elections}; well-behaved p99 {} ms quiet, {} ms during the flood: {ratio:.2}x{degraded}{}",
        if outcome.held() { "HELD" } else { "NOT HELD" },
        report::decimal(Percentiles::from(&outcome.quiet.latencies).p99),
        report::decimal(Percentiles::from(&outcome.during.latencies).p99),
        if failed.is_empty() { String::new() } else { format!("; over: {}", failed.join(", ")) }
    )
}

fn mib(value: f64) -> String {
    if value.is_finite() {
        format!("{:.1}", value / MIB)
    } else {
        "-".into()
    }
}

fn figure(value: f64) -> String {
    if value.is_finite() {
        format!("{value:.0}")
    } else {
        "-".into()
    }
}

fn report(run: &mut Run, plan: &Plan, outcomes: &[Outcome]) -> anyhow::Result<()> {
    run.say(format!(
        "floods: each on a fresh cluster (3 nodes with a cluster secret); the well-behaved client ({} SET+GET pairs in \
         flight, {GOOD_VALUE}-byte values on its own keys) alone for {} s, then beside the flood for {} s; then {} s \
         settling. Bounds: each node's growth of RSS within the flood's budget + {:.0} MiB and of disk within it + {:.0} \
         MiB, the gauges within theirs, no election.",
        plan.good_inflight,
        plan.quiet.as_secs(),
        plan.flood.as_secs(),
        plan.settle.as_secs(),
        RSS_SLACK / MIB,
        DISK_SLACK / MIB
    ));
    let mut rows = Vec::new();
    let mut node_rows = Vec::new();
    for outcome in outcomes {
        let name = outcome.flood.name();
        run.say(format!("\n== {name}"));
        for note in &outcome.notes {
            run.say(note);
        }
        let mut table = Table::new(&["node", "RSS MiB before", "peak", "after", "disk MiB before", "peak", "after"]);
        for (index, (rss, disk)) in outcome.rss.iter().zip(&outcome.disk).enumerate() {
            let cells = vec![
                format!("node{}", index + 1),
                mib(rss.before),
                mib(rss.peak),
                mib(rss.after),
                mib(disk.before),
                mib(disk.peak),
                mib(disk.after),
            ];
            node_rows.push([vec![name.to_string()], cells.clone()].concat());
            table.row(cells);
        }
        table.row(vec![
            "broker".to_string(),
            mib(outcome.broker.before),
            mib(outcome.broker.peak),
            mib(outcome.broker.after),
            "-".into(),
            "-".into(),
            "-".into(),
        ]);
        run.say(table.render());
        if !outcome.gauges.is_empty() {
            let mut table = Table::new(&["gauge (highest node)", "before", "peak", "after"]);
            for (gauge, span) in &outcome.gauges {
                table.row(vec![gauge.clone(), figure(span.before), figure(span.peak), figure(span.after)]);
            }
            run.say(table.render());
        }
        run.say(format!(
            "flooder: {} sent; answers: {}",
            outcome.tally.sent.load(Ordering::Relaxed),
            outcome.tally.render()
        ));
        let (quiet, during) =
            (Percentiles::from(&outcome.quiet.latencies), Percentiles::from(&outcome.during.latencies));
        let mut table = Table::new(&["well-behaved client", "answers", "errors", "p50 ms", "p99 ms"]);
        for (phase, recording, p) in [("quiet", &outcome.quiet, quiet), ("during the flood", &outcome.during, during)] {
            table.row(vec![
                phase.to_string(),
                recording.answered.to_string(),
                recording.errors.to_string(),
                report::decimal(p.p50),
                report::decimal(p.p99),
            ]);
        }
        run.say(table.render());
        if let Some(sample) = outcome.during.error_samples.first() {
            run.say(format!("well-behaved client's first error during the flood: {sample}"));
        }
        let mut table = Table::new(&["check", "measured", "allowed"]);
        for (what, measured, allowed) in &outcome.checks {
            table.row(vec![what.clone(), format!("{measured:.1}"), format!("{allowed:.1}")]);
        }
        run.say(table.render());
        let line = format!("{name}: {}", verdict(outcome));
        run.say(line);
        let gauges = outcome
            .gauges
            .iter()
            .map(|(gauge, span)| {
                format!("{gauge}={}/{}/{}", figure(span.before), figure(span.peak), figure(span.after))
            })
            .collect::<Vec<_>>()
            .join(";");
        rows.push(vec![
            name.to_string(),
            outcome.held().to_string(),
            outcome.elections.map_or("-".into(), |n| n.to_string()),
            report::decimal(quiet.p50),
            report::decimal(quiet.p99),
            report::decimal(during.p50),
            report::decimal(during.p99),
            format!("{:.2}", outcome.p99_ratio()),
            outcome.quiet.errors.to_string(),
            outcome.during.errors.to_string(),
            outcome.tally.sent.load(Ordering::Relaxed).to_string(),
            outcome.tally.render(),
            gauges,
            mib(outcome.rss.iter().map(Span::growth).fold(0.0, f64::max)),
            mib(outcome.disk.iter().map(Span::growth).fold(0.0, f64::max)),
        ]);
    }
    run.say("\nbounds");
    for outcome in outcomes {
        run.say(format!("{}: {}", outcome.flood.name(), verdict(outcome)));
    }
    report::write_csv(
        &run.out.join("floods.csv"),
        &[
            "flood",
            "bound_held",
            "elections",
            "quiet_p50_ms",
            "quiet_p99_ms",
            "flood_p50_ms",
            "flood_p99_ms",
            "p99_ratio",
            "quiet_errors",
            "flood_errors",
            "flooder_sent",
            "flooder_answers",
            "gauges_before_peak_after",
            "max_rss_growth_mib",
            "max_disk_growth_mib",
        ],
        &rows,
    )?;
    report::write_csv(
        &run.out.join("floods_nodes.csv"),
        &[
            "flood",
            "node",
            "rss_mib_before",
            "rss_mib_peak",
            "rss_mib_after",
            "disk_mib_before",
            "disk_mib_peak",
            "disk_mib_after",
        ],
        &node_rows,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labelled_metrics_sum_only_their_label_and_say_when_the_metric_is_missing() {
        let text = "statestore_requests_dropped_total{reason=\"qos0\"} 3\n\
                    statestore_requests_dropped_total{reason=\"dispatch_full\"} 7\n";
        assert_eq!(metric_matching(text, "statestore_requests_dropped_total", "reason=\"dispatch_full\""), Some(7.0));
        assert_eq!(metric_matching(text, "statestore_requests_dropped_total", "reason=\"shadow_full\""), Some(0.0));
        assert_eq!(metric_matching(text, "statestore_shadow_requests", "reason=\"x\""), None);
        assert_eq!(metric_matching(text, "statestore_requests_dropped_total", ""), Some(10.0));
    }

    #[test]
    fn a_span_keeps_the_first_the_highest_and_the_last() {
        let mut span = Span::start(5.0);
        span.see(9.0);
        span.see(6.0);
        assert_eq!((span.before, span.peak, span.after, span.growth()), (5.0, 9.0, 6.0, 4.0));
    }

    #[test]
    fn directory_sizes_count_nested_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("a")).unwrap();
        std::fs::write(dir.path().join("a/b"), vec![1u8; 100_000]).unwrap();
        assert!(dir_bytes(dir.path()) >= 100_000.0);
        assert_eq!(dir_bytes(&dir.path().join("missing")), 0.0);
    }
}
