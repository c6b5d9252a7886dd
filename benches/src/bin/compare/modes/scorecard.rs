//! `scorecard`: every target the project holds itself to, measured in one run and judged. The
//! run goes through the other modes one after another (each writes its own tables, CSV and
//! chart into the same directory, its process logs under `logs/<mode>/`):
//! 1. `sweep` of echo, cluster and etcd in rounds (1, 16, 64 and 256 in flight);
//! 2. `rate`: the open loop at half of the lower quick peak, on the cluster and etcd;
//! 3. `fill` of the cluster in rounds, with its memory and a follower's restarts;
//! 4. `sustained`: the cluster at 16 in flight with the SDK's default message expiry;
//! 5. `snapshot`: the waits while a filled cluster builds snapshots and a new node installs one;
//! 6. `partition`: a follower, then the leader, cut off from their peers under load.
//!
//! Then one table: each target's figure, its limit, and whether it was met (`scorecard.csv`). A
//! step that fails leaves its targets "not measured", and the run goes on.

use std::time::Duration;

use super::{FillPlan, Run};
use crate::report::{self, Table};
use crate::targets::TargetKind;

/// The scorecard's plan: the other modes' settings.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub rounds: usize,
    pub warmup: Duration,
    pub length: Duration,
    pub fill_to: u64,
    pub minutes: u64,
    pub snapshot_to: u64,
    pub snapshot_phase: Duration,
    pub partition_phase: Duration,
}

/// In-flight levels of the sweep: the table.
const LEVELS: [usize; 4] = [1, 16, 64, 256];
/// Requests in flight during the fills, the sustained run and the partitions.
const FILL_INFLIGHT: usize = 64;
const STEADY_INFLIGHT: usize = 16;
/// The open loop's rate during the snapshots.
const SNAPSHOT_RATE: f64 = 500.0;

/// How a figure is judged.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Limit {
    AtLeast(f64),
    AtMost(f64),
}

impl Limit {
    fn holds(self, value: f64) -> bool {
        match self {
            Limit::AtLeast(limit) => value >= limit,
            Limit::AtMost(limit) => value <= limit,
        }
    }

    fn text(self) -> String {
        match self {
            Limit::AtLeast(limit) => format!("≥ {limit}"),
            Limit::AtMost(limit) => format!("≤ {limit}"),
        }
    }
}

/// One target: what is measured, the figure, its limit.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    pub name: &'static str,
    pub value: Option<f64>,
    pub limit: Limit,
    /// Where the figure comes from, or what else to know about it.
    pub note: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Met,
    Missed,
    NotMeasured,
}

impl Check {
    pub fn state(&self) -> State {
        match self.value {
            Some(value) if value.is_finite() => {
                if self.limit.holds(value) {
                    State::Met
                } else {
                    State::Missed
                }
            }
            _ => State::NotMeasured,
        }
    }
}

impl State {
    fn text(self) -> &'static str {
        match self {
            State::Met => "met",
            State::Missed => "MISSED",
            State::NotMeasured => "not measured",
        }
    }
}

/// What every step measured (`None`: the step failed).
#[derive(Debug, Clone, Default)]
pub struct Figures {
    pub sweep: Option<super::SweepFigures>,
    pub rate: Option<super::RateFigures>,
    pub fill: Option<super::FillFigures>,
    pub sustained: Option<super::SustainedFigures>,
    pub snapshot: Option<super::SnapshotFigures>,
    pub partition: Option<super::PartitionFigures>,
}

/// MB per MiB: the RSS target is in MB, `/proc` reports KiB.
const MB_PER_MIB: f64 = 1.048_576;

/// What the p99 ratio is made of: the cluster's throughput growth from 64 to 256 in flight, the
/// wait Little's law alone gives for it, and the echo responder's own ratio in the same rounds.
fn tail_note(sweep: &super::SweepFigures) -> String {
    let mut note = "the cluster's".to_string();
    if let Some(growth) = sweep.growth.filter(|g| *g > 0.0) {
        note.push_str(&format!(
            "; its ops/s grew {growth:.2}x from 64 to 256 in flight: by Little's law the wait alone grows {:.2}x",
            4.0 / growth
        ));
    }
    if let Some(echo) = sweep.echo_tail {
        note.push_str(&format!("; the echo responder's own {echo:.2}"));
    }
    note
}

/// The targets, judged on `figures` (`rounds`: of the sweep and of the fill).
pub fn checks(figures: &Figures, rounds: usize) -> Vec<Check> {
    let sweep = figures.sweep.unwrap_or_default();
    let fill = figures.fill.unwrap_or_default();
    let sustained = figures.sustained.unwrap_or_default();
    let snapshot = figures.snapshot.unwrap_or_default();
    let partition = figures.partition.unwrap_or_default();
    let of_rounds = if rounds > 1 { format!("median of {rounds} rounds") } else { "one round".to_string() };
    let rate = figures.rate.as_ref();
    let p99 = |kind| rate.and_then(|r| r.p99_of(kind));
    let sweep_note = |what: &str| {
        figures.sweep.map_or_else(
            || "the sweep did not run".to_string(),
            |s| format!("{what}, {of_rounds}; the cluster's errors {}, elections {}", s.errors, s.elections),
        )
    };
    vec![
        Check {
            name: "SET at 64 in flight / etcd",
            value: sweep.over_etcd,
            limit: Limit::AtLeast(1.0),
            note: sweep_note("ops/s over etcd's"),
        },
        Check {
            name: "SET at 64 in flight / echo ceiling",
            value: sweep.over_echo,
            limit: Limit::AtLeast(0.5),
            note: sweep_note("ops/s over the echo responder's (aim 0.85)"),
        },
        Check {
            name: "p99 at 256 in flight / p99 at 64",
            value: sweep.tail,
            limit: Limit::AtMost(3.0),
            note: sweep_note(&tail_note(&sweep)),
        },
        Check {
            name: "requests per leader fsync at 64 in flight",
            value: sweep.fewest_per_fsync,
            limit: Limit::AtLeast(8.0),
            note: "the fewest of any round".into(),
        },
        Check {
            name: "p99 at half of peak / etcd's p99",
            value: p99(TargetKind::Cluster).zip(p99(TargetKind::Etcd)).map(|(cluster, etcd)| cluster / etcd),
            limit: Limit::AtMost(1.0),
            note: match (rate, p99(TargetKind::Cluster), p99(TargetKind::Etcd)) {
                (Some(r), Some(cluster), Some(etcd)) => format!(
                    "{} ops/s offered: cluster {} ms, etcd {} ms",
                    report::ops(r.rate),
                    report::decimal(cluster),
                    report::decimal(etcd)
                ),
                (Some(_), _, None) => "etcd was not measured (apt-get install -y etcd-server)".into(),
                _ => "the open loop did not run".into(),
            },
        },
        Check {
            name: "fill: last 100k keys / first 100k",
            value: fill.last_to_first,
            limit: Limit::AtLeast(0.9),
            note: format!("ops/s of the last step over the first, {of_rounds}"),
        },
        Check {
            name: "restart of a full node to ready (s)",
            value: fill.slowest_ready_s,
            limit: Limit::AtMost(5.0),
            note: "the slowest follower restart, after kill -9 or SIGTERM".into(),
        },
        Check {
            name: "RSS per node after the fill (MB)",
            value: fill.largest_rss_mib.map(|mib| mib * MB_PER_MIB),
            limit: Limit::AtMost(300.0),
            note: "the largest node of any round".into(),
        },
        Check {
            name: "sustained: last minute / first",
            value: sustained.last_to_first,
            limit: Limit::AtLeast(0.9),
            note: format!("ops/s at {STEADY_INFLIGHT} in flight"),
        },
        Check {
            name: "sustained: worst minute's p99.9 (ms)",
            value: sustained.worst_p999_ms,
            limit: Limit::AtMost(100.0),
            note: "the highest of any minute".into(),
        },
        Check {
            name: "snapshot build: longest wait over baseline (ms)",
            value: snapshot.build_extra_ms,
            limit: Limit::AtMost(50.0),
            note: "every node builds a snapshot of the filled store".into(),
        },
        Check {
            name: "snapshot install: longest wait over baseline (ms)",
            value: snapshot.install_extra_ms,
            limit: Limit::AtMost(50.0),
            note: "a new node installs one".into(),
        },
        Check {
            name: "writes resume after the leader is cut off (s)",
            value: partition.leader_cut_s,
            limit: Limit::AtMost(1.0),
            note: match figures.partition {
                Some(p) => format!(
                    "longest time without an answer; the follower's cut {}, errors {}",
                    p.follower_cut_s.map_or("-".into(), |s| format!("{s:.3} s")),
                    p.errors
                ),
                None => "the partition run did not run".into(),
            },
        },
    ]
}

pub async fn scorecard(run: &mut Run, plan: Plan) -> anyhow::Result<()> {
    let all = run.targets.clone();
    let logs = run.setup.logs.clone();
    let mut figures = Figures::default();
    let only = |kinds: &[TargetKind]| all.iter().copied().filter(|k| kinds.contains(k)).collect::<Vec<_>>();

    step(run, "sweep", &logs, all.clone());
    // SET only: the scorecard judges writes, and reads would double its sweep.
    let sweep = super::sweep(run, &LEVELS, plan.warmup, plan.length, plan.rounds, false).await;
    figures.sweep = settle(run, "sweep", sweep);

    step(run, "rate", &logs, only(&[TargetKind::Cluster, TargetKind::Etcd]));
    let rate = super::rate(run, None, plan.warmup, plan.length).await;
    figures.rate = settle(run, "rate", rate);

    step(run, "fill", &logs, vec![TargetKind::Cluster]);
    let fill_plan = FillPlan { to: plan.fill_to, inflight: FILL_INFLIGHT, step: (plan.fill_to / 10).clamp(1, 100_000) };
    let fill = super::fill(run, fill_plan, plan.rounds).await;
    figures.fill = settle(run, "fill", fill);

    step(run, "sustained", &logs, vec![TargetKind::Cluster]);
    let sustained = super::sustained(run, plan.minutes, STEADY_INFLIGHT).await;
    figures.sustained = settle(run, "sustained", sustained);

    step(run, "snapshot", &logs, vec![TargetKind::Cluster]);
    let snapshot = super::snapshot(run, plan.snapshot_to, SNAPSHOT_RATE, plan.snapshot_phase).await;
    figures.snapshot = settle(run, "snapshot", snapshot);

    step(run, "partition", &logs, vec![TargetKind::Cluster]);
    let partition = super::partition(run, plan.partition_phase, STEADY_INFLIGHT).await;
    figures.partition = settle(run, "partition", partition);

    run.targets = all;
    run.setup.logs = logs;
    report(run, &checks(&figures, plan.rounds))
}

/// Begins one step: its heading in the summary, its targets, its own log directory.
fn step(run: &mut Run, mode: &str, logs: &std::path::Path, targets: Vec<TargetKind>) {
    let names: Vec<&str> = targets.iter().map(|t| t.name()).collect();
    run.progress.line(&format!("scorecard: {mode} of {}", names.join(",")));
    run.say(format!("\n== scorecard step: {mode} ({})", names.join(",")));
    run.targets = targets;
    run.setup.logs = logs.join(mode);
    if let Err(error) = std::fs::create_dir_all(&run.setup.logs) {
        run.say(format!("{mode}: cannot create {}: {error}", run.setup.logs.display()));
    }
}

/// A step's figures, or its failure noted in the summary.
fn settle<T>(run: &mut Run, mode: &str, outcome: anyhow::Result<T>) -> Option<T> {
    match outcome {
        Ok(figures) => Some(figures),
        Err(error) => {
            let text = format!("{mode}: FAILED: {error:#}; its targets are not measured");
            run.progress.line(&text);
            run.say(text);
            None
        }
    }
}

fn report(run: &mut Run, checks: &[Check]) -> anyhow::Result<()> {
    let mut table = Table::new(&["target", "measured", "limit", "state", "from"]).text_last();
    let mut lines = Vec::new();
    for check in checks {
        let value = check.value.filter(|v| v.is_finite());
        table.row(vec![
            check.name.to_string(),
            value.map_or("-".into(), |v| format!("{v:.3}")),
            check.limit.text(),
            check.state().text().to_string(),
            check.note.clone(),
        ]);
        let (kind, limit) = match check.limit {
            Limit::AtLeast(limit) => ("at_least", limit),
            Limit::AtMost(limit) => ("at_most", limit),
        };
        lines.push(vec![
            check.name.to_string(),
            value.map(report::csv_number).unwrap_or_default(),
            kind.to_string(),
            report::csv_number(limit),
            check.state().text().to_lowercase().replace(' ', "_"),
            check.note.clone(),
        ]);
    }
    let count = |state| checks.iter().filter(|c| c.state() == state).count();
    run.say("\n== scorecard");
    run.say(table.render());
    run.say(format!(
        "{} of {} targets met, {} missed, {} not measured",
        count(State::Met),
        checks.len(),
        count(State::Missed),
        count(State::NotMeasured)
    ));
    report::write_csv(&run.out.join("scorecard.csv"), &["target", "measured", "rule", "limit", "state", "note"], &lines)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::modes::{FillFigures, PartitionFigures, RateFigures, SnapshotFigures, SustainedFigures, SweepFigures};

    fn find<'a>(checks: &'a [Check], name: &str) -> &'a Check {
        checks.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no check {name}"))
    }

    #[test]
    fn limits_hold_at_their_bound_and_a_missing_or_undefined_figure_is_not_measured() {
        let check = |value, limit| Check { name: "x", value, limit, note: String::new() }.state();
        assert_eq!(check(Some(1.0), Limit::AtLeast(1.0)), State::Met);
        assert_eq!(check(Some(0.999), Limit::AtLeast(1.0)), State::Missed);
        assert_eq!(check(Some(3.0), Limit::AtMost(3.0)), State::Met);
        assert_eq!(check(Some(3.01), Limit::AtMost(3.0)), State::Missed);
        assert_eq!(check(None, Limit::AtMost(3.0)), State::NotMeasured);
        assert_eq!(check(Some(f64::NAN), Limit::AtLeast(0.0)), State::NotMeasured);
    }

    #[test]
    fn every_step_feeds_its_targets_and_a_failed_step_leaves_them_not_measured() {
        let figures = Figures {
            sweep: Some(SweepFigures {
                over_etcd: Some(1.4),
                over_echo: Some(0.45),
                tail: Some(2.8),
                echo_tail: Some(3.5),
                growth: Some(1.25),
                fewest_per_fsync: Some(15.0),
                errors: 0,
                elections: 0,
            }),
            rate: Some(RateFigures {
                rate: 2000.0,
                p99_ms: vec![(TargetKind::Cluster, 9.0), (TargetKind::Etcd, 24.0)],
            }),
            fill: Some(FillFigures {
                last_to_first: Some(0.95),
                slowest_ready_s: Some(0.7),
                largest_rss_mib: Some(290.0),
            }),
            sustained: Some(SustainedFigures { last_to_first: Some(0.85), worst_p999_ms: None }),
            snapshot: Some(SnapshotFigures { build_extra_ms: Some(33.0), install_extra_ms: None }),
            partition: Some(PartitionFigures { follower_cut_s: Some(0.02), leader_cut_s: Some(0.48), errors: 0 }),
        };
        let checks = checks(&figures, 3);
        assert_eq!(checks.len(), 13);
        assert!(checks.iter().all(|c| !c.name.contains(',')), "a name is one unquoted CSV field (.ci/run reads it)");
        assert_eq!(find(&checks, "SET at 64 in flight / etcd").state(), State::Met);
        assert_eq!(find(&checks, "SET at 64 in flight / echo ceiling").state(), State::Missed);
        let tail = find(&checks, "p99 at 256 in flight / p99 at 64");
        assert_eq!(tail.state(), State::Met);
        assert!(tail.note.contains("grew 1.25x") && tail.note.contains("3.20x"), "{}", tail.note);
        assert!(tail.note.contains("the echo responder's own 3.50"), "{}", tail.note);
        let rate = find(&checks, "p99 at half of peak / etcd's p99");
        assert_eq!((rate.value, rate.state()), (Some(0.375), State::Met));
        assert!(rate.note.contains("cluster 9.00 ms, etcd 24.00 ms"), "{}", rate.note);
        let rss = find(&checks, "RSS per node after the fill (MB)");
        assert_eq!(rss.state(), State::Missed, "290 MiB is 304 MB: {:?}", rss.value);
        assert_eq!(find(&checks, "sustained: last minute / first").state(), State::Missed);
        assert_eq!(find(&checks, "sustained: worst minute's p99.9 (ms)").state(), State::NotMeasured);
        assert_eq!(find(&checks, "snapshot install: longest wait over baseline (ms)").state(), State::NotMeasured);
        assert_eq!(find(&checks, "writes resume after the leader is cut off (s)").state(), State::Met);
        assert!(find(&checks, "fill: last 100k keys / first 100k").note.contains("median of 3 rounds"));

        let nothing = super::checks(&Figures::default(), 1);
        assert!(nothing.iter().all(|c| c.state() == State::NotMeasured));
        assert_eq!(find(&nothing, "p99 at half of peak / etcd's p99").note, "the open loop did not run");
        let without_etcd = Figures {
            rate: Some(RateFigures { rate: 2000.0, p99_ms: vec![(TargetKind::Cluster, 9.0)] }),
            ..Figures::default()
        };
        let rate = super::checks(&without_etcd, 1).into_iter().find(|c| c.name.starts_with("p99 at half")).unwrap();
        assert_eq!(rate.state(), State::NotMeasured);
        assert!(rate.note.contains("etcd-server"), "{}", rate.note);
    }
}
