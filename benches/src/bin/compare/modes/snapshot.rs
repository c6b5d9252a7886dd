//! `snapshot` (cluster only): how much longer requests wait while a large snapshot is built on
//! every node and then installed on a follower.
//!
//! The store is filled to `--to` distinct keys; then an open loop at `--rate` runs throughout:
//! - **baseline** for one phase;
//! - **build**: every node is asked to build a snapshot (`POST /cluster/snapshot`), measured
//!   from the request until the last node reports the new snapshot;
//! - a quiet phase; then
//! - **install**: a fourth node starts and joins as a learner (`POST /cluster/learners`); the
//!   leader's log below its snapshot is purged, so the learner receives the snapshot and installs
//!   it; measured from the learner's start until the leader reports it caught up;
//! - a last quiet phase.
//!
//! Reported per window: requests, p50, p99, p99.9 and the longest wait, and how much longer the
//! longest wait and p99 are than in the baseline; and where waits may come from: the three nodes'
//! fsyncs of the Raft log that took longer than [`SLOW_FSYNC`] (from their
//! `statestore_disk_wal_fsync_duration_seconds` histograms) and the machine's I/O pressure (the
//! time every runnable task waited on I/O, from `/proc/pressure/io`, per second of the window).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::Run;
use crate::cluster::{metric_sum, StatestoreCluster};
use crate::load::{start_closed, start_open, Workload, OPEN_LOOP_SLOTS};
use crate::report::{self, Table};
use crate::stats::{Latencies, Recorder, Recording};
use crate::svg::{self, Band, Chart, Line};
use crate::targets::{Target, TargetKind};

/// The fill's in-flight requests.
const FILL_INFLIGHT: usize = 64;
/// Longest wait for a snapshot build or install to finish.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(600);
/// The recorder's window: longer than any run (the time limit ends a run before it).
const WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);

/// How many of each window's longest waits are listed (`snapshot_slowest.csv`).
const SLOWEST_LISTED: usize = 5;

/// A Raft log fsync at least this long counts as slow (a bucket bound of the node's histogram).
const SLOW_FSYNC: f64 = 0.0512;
const FSYNC_HISTOGRAM: &str = "statestore_disk_wal_fsync_duration_seconds";

/// A measured stretch of the run, in seconds since the open loop started.
struct Window {
    name: &'static str,
    from: f64,
    to: f64,
    /// Disk signals at the window's start and end.
    disk: (DiskMark, DiskMark),
}

impl Window {
    /// Raft log fsyncs longer than [`SLOW_FSYNC`] on the three nodes within the window.
    fn slow_fsyncs(&self) -> f64 {
        self.disk.1.slow_fsyncs - self.disk.0.slow_fsyncs
    }

    /// Milliseconds per second of the window in which every runnable task waited on I/O.
    fn io_stall_ms_per_s(&self) -> Option<f64> {
        let stalled_us = self.disk.1.io_full_us? - self.disk.0.io_full_us?;
        Some(stalled_us / 1000.0 / (self.to - self.from).max(1e-3))
    }
}

/// Counters read at a window's edge.
#[derive(Clone, Copy)]
struct DiskMark {
    /// Raft log fsyncs longer than [`SLOW_FSYNC`], summed over the three nodes.
    slow_fsyncs: f64,
    /// `/proc/pressure/io`'s `full` total, µs (none where the kernel does not report it).
    io_full_us: Option<f64>,
}

impl DiskMark {
    async fn read(cluster: &StatestoreCluster) -> DiskMark {
        let mut slow_fsyncs = 0.0;
        for index in 0..crate::cluster::NODES as usize {
            slow_fsyncs += histogram_above(&cluster.metrics(index).await, FSYNC_HISTOGRAM, SLOW_FSYNC).unwrap_or(0.0);
        }
        let io_full_us = std::fs::read_to_string("/proc/pressure/io").ok().and_then(|text| pressure_full_us(&text));
        DiskMark { slow_fsyncs, io_full_us }
    }
}

/// How many observations of the Prometheus histogram `name` in `text` exceeded the bucket bound
/// `bound` (the count less that bucket's), summed over label sets; none if it is not there.
fn histogram_above(text: &str, name: &str, bound: f64) -> Option<f64> {
    let count = metric_sum(text, &format!("{name}_count"))?;
    let bucket = format!("{name}_bucket{{");
    let within: f64 = text
        .lines()
        .filter_map(|line| {
            let labels = line.strip_prefix(&bucket)?;
            let le = labels.split("le=\"").nth(1)?.split('"').next()?.parse::<f64>().ok()?;
            ((le - bound).abs() < bound * 1e-6).then(|| line.rsplit(' ').next()?.parse::<f64>().ok())?
        })
        .sum();
    Some(count - within)
}

/// The `total=` of the `full` line of a `/proc/pressure/*` file.
fn pressure_full_us(text: &str) -> Option<f64> {
    let line = text.lines().find(|line| line.starts_with("full "))?;
    line.split(' ').find_map(|field| field.strip_prefix("total="))?.parse().ok()
}

/// What the scorecard judges of the snapshot run: how much longer the longest wait was than the
/// baseline's while every node built a snapshot, and while a new node installed one, in ms.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SnapshotFigures {
    pub build_extra_ms: Option<f64>,
    pub install_extra_ms: Option<f64>,
}

pub async fn snapshot(run: &mut Run, to: u64, rate: f64, phase: Duration) -> anyhow::Result<SnapshotFigures> {
    crate::cluster::check_binary(&run.setup.nodes_binary, Some("--snapshot-log-bytes"))?;
    run.progress.line(&format!(
        "cluster: starting; fill to {} keys, then {} ops/s with phases of {} s",
        report::ops(to as f64),
        report::ops(rate),
        phase.as_secs()
    ));
    let mut target = Target::start(TargetKind::Cluster, &run.setup, OPEN_LOOP_SLOTS.max(FILL_INFLIGHT), false).await?;
    fill(run, &mut target, to).await?;

    let recorder = Arc::new(Recorder::new(Instant::now(), WINDOW, true));
    let workload = Arc::new(Workload::random_filled(to, run.value_size));
    let load = start_open(target.client.clone(), workload, rate, recorder.clone());
    let since = |at: Instant| at.duration_since(recorder.from()).as_secs_f64();
    let mut windows = Vec::new();
    let opened = disk_mark(&target).await?;

    wait(run, &mut target, &recorder, phase, "baseline").await?;
    let mark = disk_mark(&target).await?;
    windows.push(Window { name: "baseline", from: 0.0, to: since(Instant::now()), disk: (opened, mark) });

    let started = Instant::now();
    let cluster = target.cluster.as_ref().context("the cluster target has nodes")?;
    let before = built_counts(cluster).await;
    for index in 0..crate::cluster::NODES as usize {
        cluster.request_snapshot(index).await?;
    }
    run.progress.line(&format!("{:.1} s: every node builds a snapshot", since(started)));
    let every_node: Vec<usize> = (0..crate::cluster::NODES as usize).collect();
    wait_for_builds(run, &mut target, &recorder, "building snapshots", &every_node, &before).await?;
    let built = disk_mark(&target).await?;
    windows.push(Window { name: "build", from: since(started), to: since(Instant::now()), disk: (mark, built) });
    run.progress.line(&format!("{:.1} s: every node has built its snapshot", since(Instant::now())));

    wait(run, &mut target, &recorder, phase, "after the build").await?;
    let joining = disk_mark(&target).await?;
    let started = Instant::now();
    run.progress.line(&format!("{:.1} s: a fourth node joins as a learner", since(started)));
    let cluster = target.cluster.as_mut().context("the cluster target has nodes")?;
    let learner = cluster.add_learner().await?;
    let learner_id = cluster.id(learner);
    let installed = metric_sum(&cluster.metrics(learner).await, "statestore_snapshots_total{kind=\"installed\"}");
    let caught_up = disk_mark(&target).await?;
    windows.push(Window {
        name: "install",
        from: since(started),
        to: since(Instant::now()),
        disk: (joining, caught_up),
    });
    run.progress.line(&format!(
        "{:.1} s: node{learner_id} caught up after {:.1} s ({} snapshot installed)",
        since(Instant::now()),
        started.elapsed().as_secs_f64(),
        installed.map_or("no".into(), |n| format!("{n:.0}"))
    ));
    wait(run, &mut target, &recorder, phase, "after the install").await?;
    let ended = disk_mark(&target).await?;
    windows.push(Window { name: "after", from: windows[2].to, to: since(Instant::now()), disk: (caught_up, ended) });
    load.finish().await;
    let recording = recorder.snapshot();
    if installed.unwrap_or(0.0) < 1.0 {
        run.say(format!("note: node{learner_id} caught up without installing a snapshot"));
    }
    report(run, to, rate, &recording, &windows)
}

/// The disk signals of `target`'s nodes and the machine now.
async fn disk_mark(target: &Target) -> anyhow::Result<DiskMark> {
    Ok(DiskMark::read(target.cluster.as_ref().context("the cluster target has nodes")?).await)
}

/// Writes `to` distinct keys at 64 in flight.
async fn fill(run: &mut Run, target: &mut Target, to: u64) -> anyhow::Result<()> {
    let recorder = Arc::new(Recorder::new(Instant::now(), WINDOW, false));
    let workload = Arc::new(Workload::distinct_keys(to, run.value_size));
    let load = start_closed(target.client.clone(), workload, FILL_INFLIGHT, recorder.clone());
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        target.check_running()?;
        let (answered, errors) = recorder.counts();
        if answered + errors >= to {
            break;
        }
        run.progress.update(&format!(
            "filling: {} keys, {:.0} s, {errors} errors",
            report::ops(answered as f64),
            recorder.from().elapsed().as_secs_f64()
        ));
    }
    load.finish().await;
    let (answered, errors) = recorder.counts();
    run.progress.line(&format!(
        "filled: {} keys in {:.1} s, {errors} errors",
        report::ops(answered as f64),
        recorder.from().elapsed().as_secs_f64()
    ));
    Ok(())
}

/// `statestore_snapshots_total{kind="built"}` of every node (0 for a node that does not answer).
async fn built_counts(cluster: &StatestoreCluster) -> Vec<f64> {
    let mut counts = Vec::new();
    for index in 0..crate::cluster::NODES as usize {
        let text = cluster.metrics(index).await;
        counts.push(metric_sum(&text, "statestore_snapshots_total{kind=\"built\"}").unwrap_or(0.0));
    }
    counts
}

/// Lets the load run for `length`, showing progress.
async fn wait(
    run: &mut Run,
    target: &mut Target,
    recorder: &Recorder,
    length: Duration,
    label: &str,
) -> anyhow::Result<()> {
    let until = Instant::now() + length;
    while Instant::now() < until {
        tokio::time::sleep(until.saturating_duration_since(Instant::now()).min(Duration::from_secs(1))).await;
        progress(run, target, recorder, label)?;
    }
    Ok(())
}

/// Lets the load run until each of `nodes` has built more snapshots than `before` says (at most
/// [`SNAPSHOT_TIMEOUT`]).
async fn wait_for_builds(
    run: &mut Run,
    target: &mut Target,
    recorder: &Recorder,
    label: &str,
    nodes: &[usize],
    before: &[f64],
) -> anyhow::Result<()> {
    let deadline = Instant::now() + SNAPSHOT_TIMEOUT;
    loop {
        let cluster = target.cluster.as_ref().context("the cluster target has nodes")?;
        let now = built_counts(cluster).await;
        if nodes.iter().all(|&index| now[index] > before[index]) {
            return Ok(());
        }
        if Instant::now() > deadline {
            anyhow::bail!("{label}: not done after {} s", SNAPSHOT_TIMEOUT.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        progress(run, target, recorder, label)?;
    }
}

fn progress(run: &mut Run, target: &mut Target, recorder: &Recorder, label: &str) -> anyhow::Result<()> {
    target.check_running()?;
    let (answered, errors) = recorder.counts();
    run.progress.update(&format!(
        "snapshot: {:.0} s, {label}, {} answers, {errors} errors",
        recorder.from().elapsed().as_secs_f64(),
        report::ops(answered as f64)
    ));
    Ok(())
}

/// The `count` longest waits of the answers that arrived within `window`, longest first, each
/// with the time its request was sent (seconds since the open loop started).
fn slowest_in(recording: &Recording, window: &Window, count: usize) -> Vec<(f64, f64)> {
    let mut within: Vec<(f64, f64)> =
        answers_in(recording, window).map(|(at, wait)| (at - wait / 1000.0, wait)).collect();
    within.sort_by(|a, b| b.1.total_cmp(&a.1));
    within.truncate(count);
    within
}

/// Latencies of the answers that arrived within `window`.
fn latencies_in(recording: &Recording, window: &Window) -> (Latencies, f64) {
    let mut latencies = Latencies::new();
    let mut longest: f64 = 0.0;
    for (_, wait) in answers_in(recording, window) {
        latencies.record(Duration::from_secs_f64(wait / 1000.0));
        longest = longest.max(wait);
    }
    (latencies, longest)
}

/// The answers that arrived within `window`: when each arrived (seconds since the open loop
/// started) and how long it waited (ms).
fn answers_in<'a>(recording: &'a Recording, window: &'a Window) -> impl Iterator<Item = (f64, f64)> + 'a {
    let times = recording.answer_times.as_deref().unwrap_or_default();
    let waits = recording.answer_latencies_ms.as_deref().unwrap_or_default();
    times.iter().zip(waits).map(|(at, wait)| (*at, *wait)).filter(|(at, _)| *at >= window.from && *at < window.to)
}

fn report(
    run: &mut Run,
    to: u64,
    rate: f64,
    recording: &Recording,
    windows: &[Window],
) -> anyhow::Result<SnapshotFigures> {
    let measured: Vec<(&Window, Latencies, f64)> = windows
        .iter()
        .map(|w| {
            let (latencies, longest) = latencies_in(recording, w);
            (w, latencies, longest)
        })
        .collect();
    let (_, baseline, baseline_longest) = &measured[0];
    let baseline_p99 = baseline.quantile_ms(0.99);
    let mut table = Table::new(&[
        "window",
        "from s",
        "to s",
        "answers",
        "p50 ms",
        "p99 ms",
        "p99.9 ms",
        "longest ms",
        "longest - baseline ms",
        "p99 - baseline ms",
        "log fsyncs > 51 ms",
        "I/O stall ms/s",
    ]);
    let mut lines = Vec::new();
    for (w, latencies, longest) in &measured {
        let p99 = latencies.quantile_ms(0.99);
        table.row(vec![
            w.name.to_string(),
            format!("{:.1}", w.from),
            format!("{:.1}", w.to),
            latencies.count().to_string(),
            report::decimal(latencies.quantile_ms(0.5)),
            report::decimal(p99),
            report::decimal(latencies.quantile_ms(0.999)),
            report::decimal(*longest),
            report::decimal(longest - baseline_longest),
            report::decimal(p99 - baseline_p99),
            format!("{:.0}", w.slow_fsyncs()),
            w.io_stall_ms_per_s().map_or("–".into(), report::decimal),
        ]);
        lines.push(vec![
            w.name.to_string(),
            report::csv_number(w.from),
            report::csv_number(w.to),
            latencies.count().to_string(),
            report::csv_number(latencies.quantile_ms(0.5)),
            report::csv_number(p99),
            report::csv_number(latencies.quantile_ms(0.999)),
            report::csv_number(*longest),
            format!("{:.0}", w.slow_fsyncs()),
            w.io_stall_ms_per_s().map_or(String::new(), report::csv_number),
        ]);
    }
    run.say(format!(
        "snapshot: cluster with {} keys, open loop at {} ops/s; latency from the scheduled send time",
        report::ops(to as f64),
        report::ops(rate)
    ));
    run.say(table.render());
    if let Some(note) = super::error_note("snapshot", recording.errors, &recording.error_samples) {
        run.say(note);
    }
    let mut slowest_lines = Vec::new();
    for w in windows {
        let slowest = slowest_in(recording, w, SLOWEST_LISTED);
        let listed: Vec<String> =
            slowest.iter().map(|(sent, wait)| format!("{wait:.1} ms sent at +{:.2} s", sent - w.from)).collect();
        run.say(format!("{}: longest waits {}", w.name, listed.join(", ")));
        for (rank, (sent, wait)) in slowest.iter().enumerate() {
            slowest_lines.push(vec![
                w.name.to_string(),
                (rank + 1).to_string(),
                report::csv_number(sent - w.from),
                report::csv_number(*wait),
            ]);
        }
    }
    report::write_csv(
        &run.out.join("snapshot_slowest.csv"),
        &["window", "rank", "sent_after_window_start_s", "wait_ms"],
        &slowest_lines,
    )?;
    report::write_csv(
        &run.out.join("snapshot.csv"),
        &[
            "window",
            "from_s",
            "to_s",
            "answers",
            "p50_ms",
            "p99_ms",
            "p999_ms",
            "longest_ms",
            "slow_log_fsyncs",
            "io_stall_ms_per_s",
        ],
        &lines,
    )?;

    // The longest wait of each second, with the build and install windows shaded.
    let seconds = recording.seconds.len();
    let mut longest = vec![0.0f64; seconds];
    let mut answers = vec![0u64; seconds];
    let times = recording.answer_times.as_deref().unwrap_or_default();
    let waits = recording.answer_latencies_ms.as_deref().unwrap_or_default();
    for (at, wait) in times.iter().zip(waits) {
        if let Some(slot) = longest.get_mut(*at as usize) {
            *slot = slot.max(*wait);
            answers[*at as usize] += 1;
        }
    }
    let window_of = |second: usize| {
        let at = second as f64 + 0.5;
        windows.iter().find(|w| at >= w.from && at < w.to).map_or("", |w| w.name)
    };
    let per_second: Vec<Vec<String>> = (0..seconds)
        .map(|second| {
            vec![
                second.to_string(),
                window_of(second).to_string(),
                answers[second].to_string(),
                report::csv_number(longest[second]),
            ]
        })
        .collect();
    report::write_csv(
        &run.out.join("snapshot_seconds.csv"),
        &["second", "window", "answers", "longest_ms"],
        &per_second,
    )?;
    let chart = Chart {
        title: format!(
            "Longest wait per second at {} ops/s while snapshots are built and installed",
            report::ops(rate)
        ),
        x_label: "seconds".into(),
        y_label: "ms".into(),
        lines: vec![Line {
            name: "cluster".into(),
            points: longest.iter().enumerate().map(|(s, ms)| (s as f64 + 0.5, *ms)).collect(),
        }],
        bands: windows
            .iter()
            .filter(|w| w.name == "build" || w.name == "install")
            .map(|w| Band { from: w.from, to: w.to, label: w.name.to_string() })
            .collect(),
        x_ticks: None,
        dots: false,
    };
    std::fs::write(run.out.join("snapshot.svg"), svg::render(&[chart]))?;
    let extra = |name: &str| {
        measured
            .iter()
            .find(|(w, latencies, _)| w.name == name && latencies.count() > 0)
            .map(|(_, _, longest)| longest - baseline_longest)
    };
    Ok(SnapshotFigures { build_extra_ms: extra("build"), install_extra_ms: extra("install") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_observations_are_the_count_less_the_bucket_at_the_bound_summed_over_label_sets() {
        let text = "\
# HELP statestore_disk_wal_fsync_duration_seconds Duration of one fsync of the Raft log
statestore_disk_wal_fsync_duration_seconds_bucket{le=\"0.0256\"} 90
statestore_disk_wal_fsync_duration_seconds_bucket{le=\"0.05120000000000001\"} 95
statestore_disk_wal_fsync_duration_seconds_bucket{le=\"0.1024\"} 99
statestore_disk_wal_fsync_duration_seconds_bucket{le=\"+Inf\"} 100
statestore_disk_wal_fsync_duration_seconds_sum 1.5
statestore_disk_wal_fsync_duration_seconds_count 100
";
        assert_eq!(histogram_above(text, FSYNC_HISTOGRAM, SLOW_FSYNC), Some(5.0));
        assert_eq!(histogram_above(text, FSYNC_HISTOGRAM, 0.1024), Some(1.0));
        assert_eq!(histogram_above(text, "statestore_apply_duration_seconds", SLOW_FSYNC), None);
    }

    #[test]
    fn the_slowest_waits_are_of_answers_within_the_window_longest_first_with_their_send_time() {
        let recording = Recording {
            answer_times: Some(vec![0.5, 1.2, 1.5, 1.9, 2.5]),
            answer_latencies_ms: Some(vec![400.0, 100.0, 10.0, 300.0, 500.0]),
            latencies: Latencies::new(),
            answered: 5,
            errors: 0,
            error_samples: Vec::new(),
            seconds: Vec::new(),
            minutes: Vec::new(),
        };
        let window = Window {
            name: "install",
            from: 1.0,
            to: 2.0,
            disk: (DiskMark { slow_fsyncs: 0.0, io_full_us: None }, DiskMark { slow_fsyncs: 0.0, io_full_us: None }),
        };
        let slowest = slowest_in(&recording, &window, 2);
        assert_eq!(slowest.len(), 2);
        assert!((slowest[0].0 - 1.6).abs() < 1e-9 && slowest[0].1 == 300.0, "{slowest:?}");
        assert!((slowest[1].0 - 1.1).abs() < 1e-9 && slowest[1].1 == 100.0, "{slowest:?}");
    }

    #[test]
    fn io_pressure_is_the_full_lines_total() {
        let text = "some avg10=2.14 avg60=2.39 avg300=0.88 total=3523659\nfull avg10=1.92 avg60=2.31 avg300=0.85 total=3359669\n";
        assert_eq!(pressure_full_us(text), Some(3_359_669.0));
        assert_eq!(pressure_full_us("some avg10=0.00 total=12\n"), None);
    }
}
