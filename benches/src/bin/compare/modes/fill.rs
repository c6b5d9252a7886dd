//! `fill`: writes distinct keys until the store holds `--to` of them, recording the rate of every
//! step; then the memory of every server, and how long a follower takes to be ready again on its
//! full data directory: first after `kill -9` right after the fill (a crash: what it applies again
//! from its log included), then after a clean stop. With `--rounds N` the whole fill is repeated
//! N times on a new cluster each time (the targets' order rotated), and the ratio of the last
//! step's rate to the first step's is reported per round and as the median across rounds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{highest_term, median, round_order, Run};
use crate::load::{start_closed, Workload};
use crate::processes::{servers_cpu, CpuSample};
use crate::report::{self, Table};
use crate::stats::Recorder;
use crate::svg::{self, Chart, Line};
use crate::targets::{Target, TargetKind};

/// The recorder's window: longer than any fill (the time limit ends a run before it).
const FILL_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);
const POLL: Duration = Duration::from_millis(100);

/// The rate over one step of the fill.
struct Step {
    round: usize,
    kind: TargetKind,
    keys: u64,
    elapsed: f64,
    ops: f64,
    /// CPU of the servers (nodes or members, not the broker or the load generator) per
    /// request answered in the step, in µs: what grows with the store shows here first.
    server_us: f64,
}

/// After the fill: memory and the restarts of a follower.
struct Ending {
    round: usize,
    kind: TargetKind,
    rss: Vec<(String, Option<f64>)>,
    restart: Option<Restarts>,
}

/// A follower's restarts on its full data directory.
struct Restarts {
    name: String,
    /// From its start to ready after `kill -9`.
    crashed_ready: Duration,
    /// Its peak resident memory (VmHWM) from that start to ready, in MiB: opening its log and
    /// storage, and applying what its log holds past the last flush.
    crashed_peak_rss_mib: Option<f64>,
    /// Its time to exit after SIGTERM.
    stop: Duration,
    /// From its start to ready after that stop.
    ready: Duration,
}

/// What one fill writes: distinct keys up to `to` at `inflight`, a step recorded every `step`.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub to: u64,
    pub inflight: usize,
    pub step: u64,
}

/// What the scorecard judges of the cluster's fills.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FillFigures {
    /// The last step's rate over the first step's, median across rounds.
    pub last_to_first: Option<f64>,
    /// The longest time a restarted follower took to be ready, after `kill -9` or SIGTERM.
    pub slowest_ready_s: Option<f64>,
    /// The largest RSS of any node after a fill (not the broker's), in MiB.
    pub largest_rss_mib: Option<f64>,
}

impl FillFigures {
    fn of(steps: &[Step], endings: &[Ending], rounds: usize) -> FillFigures {
        let kind = TargetKind::Cluster;
        let ratios = (1..=rounds).filter_map(|round| {
            Steadiness::of(steps.iter().filter(|s| s.kind == kind && s.round == round)).map(|s| s.last_to_first())
        });
        let endings = || endings.iter().filter(|e| e.kind == kind);
        FillFigures {
            last_to_first: median(ratios),
            slowest_ready_s: endings()
                .filter_map(|e| e.restart.as_ref())
                .map(|r| r.crashed_ready.max(r.ready).as_secs_f64())
                .max_by(f64::total_cmp),
            largest_rss_mib: endings()
                .flat_map(|e| e.rss.iter().filter(|(name, _)| name.starts_with("node")).filter_map(|(_, rss)| *rss))
                .max_by(f64::total_cmp),
        }
    }
}

pub async fn fill(run: &mut Run, plan: Plan, rounds: usize) -> anyhow::Result<FillFigures> {
    let Plan { to, inflight, .. } = plan;
    let mut steps = Vec::new();
    let mut endings = Vec::new();
    for round in 1..=rounds {
        for kind in round_order(&run.targets, round) {
            let of_rounds = if rounds > 1 { format!(" (round {round} of {rounds})") } else { String::new() };
            run.progress.line(&format!(
                "{kind}: starting, filling to {} keys at {inflight} in flight{of_rounds}",
                report::ops(to as f64)
            ));
            match fill_target(run, round, kind, plan, &mut steps).await {
                Ok(ending) => endings.push(ending),
                Err(error) => run.failed(kind, error),
            }
        }
    }
    report(run, to, rounds, &steps, &endings)?;
    Ok(FillFigures::of(&steps, &endings, rounds))
}

async fn fill_target(
    run: &mut Run,
    round: usize,
    kind: TargetKind,
    Plan { to, inflight, step }: Plan,
    steps: &mut Vec<Step>,
) -> anyhow::Result<Ending> {
    let mut target = Target::start(kind, &run.setup, inflight, false).await?;
    let workload = Arc::new(Workload::distinct_keys(to, run.value_size));
    let recorder = Arc::new(Recorder::new(Instant::now(), FILL_WINDOW, false));
    let load = start_closed(target.client.clone(), workload, inflight, recorder.clone());
    let processes = target.processes();
    let cpu_before = CpuSample::take(&processes);
    let term_before = highest_term(&target).await;
    let start = recorder.from();
    let mut next_mark = step.min(to);
    // The previous poll and the previous step boundary, as (seconds since start, answers).
    let (mut previous, mut last_mark) = ((0.0, 0u64), (0.0, 0u64));
    // The CPU and the answers at the poll that crossed the previous boundary.
    let mut last_cpu = (cpu_before.clone(), 0u64);
    loop {
        tokio::time::sleep(POLL).await;
        target.check_running()?;
        let (answered, errors) = recorder.counts();
        let now = start.elapsed().as_secs_f64();
        while next_mark <= to && answered >= next_mark {
            // When the count crossed the mark, by interpolation between two polls.
            let share = (next_mark - previous.1) as f64 / (answered - previous.1).max(1) as f64;
            let at = previous.0 + share * (now - previous.0);
            let ops = (next_mark - last_mark.1) as f64 / (at - last_mark.0).max(1e-6);
            let cpu = CpuSample::take(&processes);
            let server_us = 1e6 * servers_cpu(&last_cpu.0.used_until(&cpu)) / (answered - last_cpu.1).max(1) as f64;
            last_cpu = (cpu, answered);
            run.progress.line(&format!(
                "{kind}: {} keys after {at:.1} s, {} ops/s, servers' CPU {server_us:.0} µs per request",
                report::ops(next_mark as f64),
                report::ops(ops)
            ));
            steps.push(Step { round, kind, keys: next_mark, elapsed: at, ops, server_us });
            last_mark = (at, next_mark);
            // The last step ends at `to` even when `to` is not a multiple of the step.
            next_mark = if next_mark == to { u64::MAX } else { (next_mark + step).min(to) };
        }
        previous = (now, answered);
        // Every key has been answered or has failed.
        if answered + errors >= to {
            break;
        }
        run.progress.update(&format!("{kind}: {} keys, {now:.0} s, {errors} errors", report::ops(answered as f64)));
    }
    let cpu_after = CpuSample::take(&processes);
    load.finish().await;
    let (answered, errors) = recorder.counts();
    let cpu: f64 = cpu_before.usage_until(&cpu_after).iter().map(|(_, cpu)| cpu).sum();
    let elections = highest_term(&target).await.zip(term_before).map(|(after, before)| after.saturating_sub(before));
    run.say(format!(
        "{kind}: {} distinct keys written in {:.1} s ({} ops/s overall), {errors} errors{}; \
         CPU {cpu:.2}, other processes {:.2}",
        report::ops(answered as f64),
        start.elapsed().as_secs_f64(),
        report::ops(answered as f64 / start.elapsed().as_secs_f64()),
        elections.map(|n| format!(", {n} elections")).unwrap_or_default(),
        cpu_before.others_until(&cpu_after)
    ));
    let rss = target.rss_mib();
    let restart = restart_a_follower(run, &mut target).await?;
    Ok(Ending { round, kind, rss, restart })
}

/// Restarts a follower (cluster node or etcd member) on its data directory, first after
/// SIGKILL, then after SIGTERM.
async fn restart_a_follower(run: &mut Run, target: &mut Target) -> anyhow::Result<Option<Restarts>> {
    let kind = target.kind;
    let restarted = if let Some(cluster) = &mut target.cluster {
        let leader = cluster.leader().await.unwrap_or(0);
        let follower = (leader + 1) % crate::cluster::NODES as usize;
        let name = format!("node{}", cluster.id(follower));
        run.progress.line(&format!("{kind}: restarting follower {name} after kill -9, then after SIGTERM"));
        let crashed_ready = cluster.crash_restart(follower).await?;
        let crashed_peak_rss_mib = crate::processes::peak_rss_mib(cluster.processes()[follower].1);
        let (stop, ready) = cluster.restart(follower).await?;
        Some(Restarts { name, crashed_ready, crashed_peak_rss_mib, stop, ready })
    } else if let Some(etcd) = &mut target.etcd {
        let leader = etcd.leader().await.unwrap_or(0);
        let follower = (leader + 1) % etcd.processes().len();
        let name = etcd.processes()[follower].0.clone();
        run.progress.line(&format!("{kind}: restarting follower {name} after kill -9, then after SIGTERM"));
        let crashed_ready = etcd.crash_restart(follower).await?;
        let crashed_peak_rss_mib = crate::processes::peak_rss_mib(etcd.processes()[follower].1);
        let (stop, ready) = etcd.restart(follower).await?;
        Some(Restarts { name, crashed_ready, crashed_peak_rss_mib, stop, ready })
    } else {
        None
    };
    Ok(restarted)
}

fn report(run: &mut Run, to: u64, rounds: usize, steps: &[Step], endings: &[Ending]) -> anyhow::Result<()> {
    let lines: Vec<Vec<String>> = steps
        .iter()
        .map(|s| {
            vec![
                s.round.to_string(),
                s.kind.to_string(),
                s.keys.to_string(),
                report::csv_number(s.elapsed),
                report::csv_number(s.ops),
                report::csv_number(s.server_us),
            ]
        })
        .collect();
    report::write_csv(
        &run.out.join("fill.csv"),
        &["round", "target", "keys", "elapsed_s", "ops_per_s_in_step", "server_cpu_us_per_request"],
        &lines,
    )?;

    let mut table = Table::new(&["round", "target", "keys", "elapsed s", "ops/s in step", "servers' CPU µs/request"]);
    for s in steps {
        table.row(vec![
            s.round.to_string(),
            s.kind.to_string(),
            report::ops(s.keys as f64),
            format!("{:.1}", s.elapsed),
            report::ops(s.ops),
            format!("{:.0}", s.server_us),
        ]);
    }
    run.say(format!("fill to {} distinct keys", report::ops(to as f64)));
    run.say(table.render());
    for line in ratio_lines(steps, rounds) {
        run.say(line);
    }

    let mut memory = Table::new(&["round", "target", "process", "RSS MiB"]);
    let mut memory_lines = Vec::new();
    for ending in endings {
        let round = ending.round.to_string();
        for (name, rss) in &ending.rss {
            let rss = rss.unwrap_or(f64::NAN);
            memory.row(vec![round.clone(), ending.kind.to_string(), name.clone(), format!("{rss:.1}")]);
            memory_lines.push(vec![round.clone(), ending.kind.to_string(), name.clone(), report::csv_number(rss)]);
        }
        if let Some(restart) = &ending.restart {
            run.say(format!(
                "{} (round {round}): restarts of follower {}: ready {:.2} s after its start following kill -9 \
                 (peak RSS by then {:.1} MiB); exited {:.2} s after SIGTERM, ready {:.2} s after its start",
                ending.kind,
                restart.name,
                restart.crashed_ready.as_secs_f64(),
                restart.crashed_peak_rss_mib.unwrap_or(f64::NAN),
                restart.stop.as_secs_f64(),
                restart.ready.as_secs_f64()
            ));
        }
    }
    run.say("memory after the fill");
    run.say(memory.render());
    report::write_csv(&run.out.join("fill_memory.csv"), &["round", "target", "process", "rss_mib"], &memory_lines)?;

    let mut lines = Vec::new();
    for round in 1..=rounds {
        for kind in TargetKind::EVERY {
            let points: Vec<(f64, f64)> =
                steps.iter().filter(|s| s.kind == kind && s.round == round).map(|s| (s.keys as f64, s.ops)).collect();
            if !points.is_empty() {
                let name = if rounds > 1 { format!("{kind}, round {round}") } else { kind.to_string() };
                lines.push(Line { name, points });
            }
        }
    }
    let chart = Chart {
        title: "Fill: throughput by keys stored".into(),
        x_label: "distinct keys written".into(),
        y_label: "ops/s".into(),
        lines,
        bands: Vec::new(),
        x_ticks: None,
        dots: true,
    };
    std::fs::write(run.out.join("fill.svg"), svg::render(&[chart]))?;
    Ok(())
}

/// The rate of a fill's last step against its first, and its slowest step against its first.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Steadiness {
    first: f64,
    last: f64,
    slowest: f64,
}

impl Steadiness {
    /// Of one target's steps in one round, in fill order; `None` without two steps.
    fn of<'a>(steps: impl IntoIterator<Item = &'a Step>) -> Option<Steadiness> {
        let ops: Vec<f64> = steps.into_iter().map(|s| s.ops).collect();
        if ops.len() < 2 {
            return None;
        }
        let slowest = ops.iter().copied().fold(f64::INFINITY, f64::min);
        Some(Steadiness { first: ops[0], last: ops[ops.len() - 1], slowest })
    }

    fn last_to_first(&self) -> f64 {
        self.last / self.first
    }
}

/// One line per target and round: its last step's rate against its first (the fill target of
/// docs/benchmarks.md), and with several rounds the median of those ratios.
fn ratio_lines(steps: &[Step], rounds: usize) -> Vec<String> {
    let mut lines = Vec::new();
    for kind in TargetKind::EVERY {
        let mut ratios = Vec::new();
        for round in 1..=rounds {
            let Some(steady) = Steadiness::of(steps.iter().filter(|s| s.kind == kind && s.round == round)) else {
                continue;
            };
            ratios.push(steady.last_to_first());
            lines.push(format!(
                "{kind}, round {round}: first step {} ops/s, last {} ops/s: last / first {:.2}; slowest step / first {:.2}",
                report::ops(steady.first),
                report::ops(steady.last),
                steady.last_to_first(),
                steady.slowest / steady.first
            ));
        }
        if ratios.len() > 1 {
            let listed: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
            if let Some(middle) = median(ratios.iter().copied()) {
                lines.push(format!(
                    "{kind}: last / first, median of {} rounds {middle:.2} ({})",
                    ratios.len(),
                    listed.join(", ")
                ));
            }
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(round: usize, kind: TargetKind, keys: u64, ops: f64) -> Step {
        Step { round, kind, keys, elapsed: 0.0, ops, server_us: 0.0 }
    }

    #[test]
    fn each_round_reports_its_last_step_against_its_first_and_rounds_their_median() {
        use TargetKind::{Cluster, Etcd};
        let steps = [
            step(1, Cluster, 100, 1000.0),
            step(1, Cluster, 200, 700.0),
            step(1, Cluster, 300, 900.0),
            step(1, Etcd, 100, 500.0),
            step(2, Cluster, 100, 800.0),
            step(2, Cluster, 200, 800.0),
            step(2, Cluster, 300, 880.0),
            step(3, Cluster, 100, 1000.0),
            step(3, Cluster, 300, 700.0),
        ];
        let round1 = Steadiness::of(steps.iter().filter(|s| s.kind == Cluster && s.round == 1)).unwrap();
        assert_eq!(round1, Steadiness { first: 1000.0, last: 900.0, slowest: 700.0 });
        assert!(Steadiness::of(steps.iter().filter(|s| s.kind == Etcd)).is_none(), "one step");
        let lines = ratio_lines(&steps, 3);
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert!(lines[0].contains("last / first 0.90; slowest step / first 0.70"), "{}", lines[0]);
        assert!(lines[1].contains("last / first 1.10"), "{}", lines[1]);
        assert_eq!(lines[3], "cluster: last / first, median of 3 rounds 0.90 (0.90, 1.10, 0.70)");

        let restarts = |crashed: u64, ready: u64| Restarts {
            name: "node2".into(),
            crashed_ready: Duration::from_millis(crashed),
            crashed_peak_rss_mib: Some(90.0),
            stop: Duration::from_millis(100),
            ready: Duration::from_millis(ready),
        };
        let endings = [
            Ending {
                round: 1,
                kind: Cluster,
                rss: vec![("node1".into(), Some(120.0)), ("node2".into(), None)],
                restart: Some(restarts(700, 500)),
            },
            Ending {
                round: 2,
                kind: Cluster,
                rss: vec![("node1".into(), Some(140.5)), ("broker".into(), Some(500.0))],
                restart: Some(restarts(400, 900)),
            },
            Ending {
                round: 1,
                kind: Etcd,
                rss: vec![("etcd1".into(), Some(900.0))],
                restart: Some(restarts(9000, 9000)),
            },
        ];
        let figures = FillFigures::of(&steps, &endings, 3);
        assert_eq!(figures.last_to_first, Some(0.9), "the cluster's rounds only");
        assert_eq!(figures.slowest_ready_s, Some(0.9), "the slower of either restart, the cluster's only");
        assert_eq!(figures.largest_rss_mib, Some(140.5), "the nodes', not the broker's");
        assert_eq!(FillFigures::of(&[], &[], 1), FillFigures::default());
    }
}
