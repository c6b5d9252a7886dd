//! `partition` (cluster only): under a steady closed loop, a follower is cut off from its peers
//! (it keeps the broker) and healed, then the leader; how long writes stop after each cut, and
//! throughput every second.
//!
//! Timeline, in phases of `--phase-secs` P: steady [0, P), follower cut [P, 2P), healed
//! [2P, 3P), leader cut [3P, 4P), healed [4P, 5P).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::{error_note, Run};
use crate::load::{start_closed, Workload};
use crate::processes::CpuSample;
use crate::report::{self, Table};
use crate::stats::{longest_silence, Recorder, Recording};
use crate::svg::{self, Band, Chart, Line};
use crate::targets::{Target, TargetKind};

const PHASES: u32 = 5;

/// One cut: whom, when it started and when it healed (seconds since the load started).
struct Cut {
    role: &'static str,
    node: u64,
    at: f64,
    healed: f64,
    leader_after: Option<u64>,
}

/// What the scorecard judges of the partition run: the longest time without any answer from each
/// cut to the next cut (or the end), in seconds, and the errors of the whole run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PartitionFigures {
    pub follower_cut_s: Option<f64>,
    pub leader_cut_s: Option<f64>,
    pub errors: u64,
}

pub async fn partition(run: &mut Run, phase: Duration, inflight: usize) -> anyhow::Result<PartitionFigures> {
    crate::cluster::check_binary(&run.setup.nodes_binary, Some("--peer-routes"))?;
    run.progress.line(&format!(
        "cluster: starting with partitionable links, {inflight} in flight, phases of {} s",
        phase.as_secs()
    ));
    let mut target = Target::start(TargetKind::Cluster, &run.setup, inflight, true).await?;
    let workload = Arc::new(Workload::random_keys(run.keys, run.value_size));
    let length = phase * PHASES;
    let recorder = Arc::new(Recorder::new(Instant::now(), length, true));
    let load = start_closed(target.client.clone(), workload, inflight, recorder.clone());
    let processes = target.processes();
    let cpu_before = CpuSample::take(&processes);

    let mut cuts: Vec<Cut> = Vec::new();
    for n in 1..=PHASES {
        wait_with_progress(run, &mut target, &recorder, phase * n, &cuts).await?;
        let now = recorder.from().elapsed().as_secs_f64();
        let cluster = target.cluster.as_ref().context("the cluster target has nodes")?;
        let proxies = target.proxies.as_ref().context("the cluster was started with proxies")?;
        if n % 2 == 0 {
            let cut = cuts.last_mut().context("a cut to heal")?;
            proxies.set_cut(cut.node, false);
            cut.healed = now;
            run.progress.line(&format!("{now:5.1} s: node{} healed", cut.node));
            continue;
        }
        // A steady phase ends: note who leads after the previous cut, then cut the next node.
        let leader = current_leader(cluster).await;
        if let Some(previous) = cuts.last_mut() {
            previous.leader_after = leader;
        }
        if n == PHASES {
            break;
        }
        let (role, node) = if cuts.is_empty() {
            ("follower", leader.map_or(2, |id| id % crate::cluster::NODES + 1))
        } else {
            ("leader", leader.unwrap_or(1))
        };
        proxies.set_cut(node, true);
        run.progress.line(&format!("{now:5.1} s: {role} node{node} cut off from its peers"));
        cuts.push(Cut { role, node, at: now, healed: f64::NAN, leader_after: None });
    }
    let cpu_after = CpuSample::take(&processes);
    load.finish().await;
    let cpu: f64 = cpu_before.usage_until(&cpu_after).iter().map(|(_, cpu)| cpu).sum();
    run.say(format!(
        "CPU: the cluster, broker and load generator {cpu:.2}, other processes {:.2} (CPU-seconds per second)",
        cpu_before.others_until(&cpu_after)
    ));
    let recording = recorder.snapshot();
    report(run, phase, inflight, &recording, &cuts)
}

/// The leader's node id, asked for up to two seconds (there may be an election going on).
async fn current_leader(cluster: &crate::cluster::StatestoreCluster) -> Option<u64> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        if let Some(index) = cluster.leader().await {
            return Some(cluster.id(index));
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `offset` after the load started, printing answers per second.
async fn wait_with_progress(
    run: &mut Run,
    target: &mut Target,
    recorder: &Recorder,
    offset: Duration,
    cuts: &[Cut],
) -> anyhow::Result<()> {
    let until = recorder.from() + offset;
    let mut last = (Instant::now(), recorder.counts().0);
    while Instant::now() < until {
        tokio::time::sleep(until.saturating_duration_since(Instant::now()).min(Duration::from_secs(1))).await;
        target.check_running()?;
        let (answered, errors) = recorder.counts();
        let now = Instant::now();
        let recent = (answered - last.1) as f64 / now.duration_since(last.0).as_secs_f64().max(1e-3);
        last = (now, answered);
        let state = match cuts.last() {
            Some(cut) if cut.healed.is_nan() => format!("{} node{} cut", cut.role, cut.node),
            Some(_) => "healed".to_string(),
            None => "steady".to_string(),
        };
        run.progress.update(&format!(
            "partition: {:.0} s, {state}, {} ops/s, {errors} errors",
            recorder.from().elapsed().as_secs_f64(),
            report::ops(recent)
        ));
    }
    Ok(())
}

/// The phase a second belongs to, for the CSV.
fn phase_of(second: f64, cuts: &[Cut]) -> String {
    let mut phase = "steady".to_string();
    for cut in cuts {
        if second >= cut.at {
            phase = format!("{} node{} cut", cut.role, cut.node);
        }
        if second >= cut.healed {
            phase = format!("node{} healed", cut.node);
        }
    }
    phase
}

fn report(
    run: &mut Run,
    phase: Duration,
    inflight: usize,
    recording: &Recording,
    cuts: &[Cut],
) -> anyhow::Result<PartitionFigures> {
    let mut answers = recording.answer_times.clone().unwrap_or_default();
    answers.sort_by(f64::total_cmp);
    let end = (phase * PHASES).as_secs_f64();
    let steady_seconds = phase.as_secs().max(1) as usize;
    let steady: u64 = recording.seconds.iter().take(steady_seconds).map(|s| s.answered).sum();

    let mut table = Table::new(&[
        "cut",
        "at s",
        "healed s",
        "no answer max s",
        "during cut s",
        "after heal s",
        "errors",
        "leader after",
    ]);
    // The longest time without any answer from each cut to the next cut (or the end).
    let mut silences = Vec::with_capacity(cuts.len());
    for (n, cut) in cuts.iter().enumerate() {
        let next = cuts.get(n + 1).map_or(end, |c| c.at);
        let healed = if cut.healed.is_nan() { next } else { cut.healed };
        let silence = longest_silence(&answers, cut.at, next);
        silences.push(silence);
        let errors: u64 = recording
            .seconds
            .iter()
            .skip(cut.at.floor() as usize)
            .take((next - cut.at).ceil() as usize)
            .map(|s| s.errors)
            .sum();
        table.row(vec![
            format!("{} node{}", cut.role, cut.node),
            format!("{:.1}", cut.at),
            format!("{healed:.1}"),
            format!("{silence:.3}"),
            format!("{:.3}", longest_silence(&answers, cut.at, healed)),
            format!("{:.3}", longest_silence(&answers, healed, next)),
            errors.to_string(),
            cut.leader_after.map_or("-".into(), |id| format!("node{id}")),
        ]);
    }
    run.say(format!(
        "partition: cluster, {inflight} in flight, phases of {} s; steady before the cuts: {} ops/s",
        phase.as_secs(),
        report::ops(steady as f64 / steady_seconds as f64)
    ));
    run.say("longest time without any answer, from the cut to the next cut (or the end), then split at the heal");
    run.say(table.render());
    if let Some(note) = error_note("partition", recording.errors, &recording.error_samples) {
        run.say(note);
    }

    let lines: Vec<Vec<String>> = recording
        .seconds
        .iter()
        .enumerate()
        .map(|(s, x)| vec![s.to_string(), x.answered.to_string(), x.errors.to_string(), phase_of(s as f64, cuts)])
        .collect();
    report::write_csv(&run.out.join("partition.csv"), &["second", "answered", "errors", "phase"], &lines)?;
    let chart = Chart {
        title: format!("Partitions under {inflight} in flight (cluster)"),
        x_label: "seconds".into(),
        y_label: "answers per second".into(),
        lines: vec![Line {
            name: "cluster".into(),
            points: recording.seconds.iter().enumerate().map(|(s, x)| (s as f64 + 0.5, x.answered as f64)).collect(),
        }],
        bands: cuts
            .iter()
            .map(|c| Band {
                from: c.at,
                to: if c.healed.is_nan() { end } else { c.healed },
                label: format!("{} node{} cut", c.role, c.node),
            })
            .collect(),
        x_ticks: None,
        dots: false,
    };
    std::fs::write(run.out.join("partition.svg"), svg::render(&[chart]))?;
    let silence = |role: &str| cuts.iter().position(|c| c.role == role).map(|n| silences[n]);
    Ok(PartitionFigures {
        follower_cut_s: silence("follower"),
        leader_cut_s: silence("leader"),
        errors: recording.errors,
    })
}
