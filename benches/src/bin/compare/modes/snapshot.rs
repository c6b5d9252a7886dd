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
//! longest wait and p99 are than in the baseline.

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

/// A measured stretch of the run, in seconds since the open loop started.
struct Window {
    name: &'static str,
    from: f64,
    to: f64,
}

pub async fn snapshot(run: &mut Run, to: u64, rate: f64, phase: Duration) -> anyhow::Result<()> {
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

    wait(run, &mut target, &recorder, phase, "baseline").await?;
    windows.push(Window { name: "baseline", from: 0.0, to: since(Instant::now()) });

    let started = Instant::now();
    let cluster = target.cluster.as_ref().context("the cluster target has nodes")?;
    let before = built_counts(cluster).await;
    for index in 0..crate::cluster::NODES as usize {
        cluster.request_snapshot(index).await?;
    }
    run.progress.line(&format!("{:.1} s: every node builds a snapshot", since(started)));
    let every_node: Vec<usize> = (0..crate::cluster::NODES as usize).collect();
    wait_for_builds(run, &mut target, &recorder, "building snapshots", &every_node, &before).await?;
    windows.push(Window { name: "build", from: since(started), to: since(Instant::now()) });
    run.progress.line(&format!("{:.1} s: every node has built its snapshot", since(Instant::now())));

    wait(run, &mut target, &recorder, phase, "after the build").await?;
    let started = Instant::now();
    run.progress.line(&format!("{:.1} s: a fourth node joins as a learner", since(started)));
    let cluster = target.cluster.as_mut().context("the cluster target has nodes")?;
    let learner = cluster.add_learner().await?;
    let learner_id = cluster.id(learner);
    let installed = metric_sum(&cluster.metrics(learner).await, "statestore_snapshots_total{kind=\"installed\"}");
    windows.push(Window { name: "install", from: since(started), to: since(Instant::now()) });
    run.progress.line(&format!(
        "{:.1} s: node{learner_id} caught up after {:.1} s ({} snapshot installed)",
        since(Instant::now()),
        started.elapsed().as_secs_f64(),
        installed.map_or("no".into(), |n| format!("{n:.0}"))
    ));
    wait(run, &mut target, &recorder, phase, "after the install").await?;
    windows.push(Window { name: "after", from: windows[2].to, to: since(Instant::now()) });
    load.finish().await;
    let recording = recorder.snapshot();
    if installed.unwrap_or(0.0) < 1.0 {
        run.say(format!("note: node{learner_id} caught up without installing a snapshot"));
    }
    report(run, to, rate, &recording, &windows)
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

/// Latencies of the answers that arrived within `window`.
fn latencies_in(recording: &Recording, window: &Window) -> (Latencies, f64) {
    let mut latencies = Latencies::new();
    let mut longest: f64 = 0.0;
    let times = recording.answer_times.as_deref().unwrap_or_default();
    let waits = recording.answer_latencies_ms.as_deref().unwrap_or_default();
    for (at, wait) in times.iter().zip(waits) {
        if *at >= window.from && *at < window.to {
            latencies.record(Duration::from_secs_f64(wait / 1000.0));
            longest = longest.max(*wait);
        }
    }
    (latencies, longest)
}

fn report(run: &mut Run, to: u64, rate: f64, recording: &Recording, windows: &[Window]) -> anyhow::Result<()> {
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
    report::write_csv(
        &run.out.join("snapshot.csv"),
        &["window", "from_s", "to_s", "answers", "p50_ms", "p99_ms", "p999_ms", "longest_ms"],
        &lines,
    )?;

    // The longest wait of each second, with the build and install windows shaded.
    let seconds = recording.seconds.len();
    let mut longest = vec![0.0f64; seconds];
    let times = recording.answer_times.as_deref().unwrap_or_default();
    let waits = recording.answer_latencies_ms.as_deref().unwrap_or_default();
    for (at, wait) in times.iter().zip(waits) {
        if let Some(slot) = longest.get_mut(*at as usize) {
            *slot = slot.max(*wait);
        }
    }
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
    Ok(())
}
