//! `rate`: an open loop at the same fixed rate on every target; latency from the scheduled send
//! time. Without `--rate`, the rate is half the lowest 64-in-flight peak of the targets, so that
//! every target is offered a load it can carry.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{measure_closed, measure_window, Measured, Run};
use crate::load::{start_open, Workload, OPEN_LOOP_SLOTS};
use crate::report::{self, Table};
use crate::stats::Recorder;
use crate::targets::{Target, TargetKind};

/// The quick peak: 64 in flight, 1 s warm-up, 3 s measured.
const PEAK_INFLIGHT: usize = 64;
const PEAK_WARMUP: Duration = Duration::from_secs(1);
const PEAK_LENGTH: Duration = Duration::from_secs(3);

/// What the scorecard judges of an open loop: the rate, and each target's p99 at it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RateFigures {
    pub rate: f64,
    pub p99_ms: Vec<(TargetKind, f64)>,
}

impl RateFigures {
    pub fn p99_of(&self, kind: TargetKind) -> Option<f64> {
        self.p99_ms.iter().find(|(k, _)| *k == kind).map(|(_, p99)| *p99)
    }
}

pub async fn rate(run: &mut Run, rate: Option<f64>, warmup: Duration, length: Duration) -> anyhow::Result<RateFigures> {
    let workload = Arc::new(Workload::random_keys(run.keys, run.value_size));
    let rate = match rate {
        Some(rate) => rate,
        None => {
            let mut peaks = Vec::new();
            for kind in run.targets.clone() {
                run.progress.line(&format!("{kind}: starting for the quick peak"));
                match peak(run, kind, &workload).await {
                    Ok(ops) => peaks.push((kind, ops)),
                    Err(error) => run.failed(kind, error),
                }
            }
            let Some((lowest, ops)) = peaks.iter().copied().min_by(|a, b| a.1.total_cmp(&b.1)) else {
                anyhow::bail!("no target could be measured for the quick peak");
            };
            let peaks: Vec<String> = peaks.iter().map(|(k, ops)| format!("{k} {}", report::ops(*ops))).collect();
            run.say(format!(
                "quick peak at {PEAK_INFLIGHT} in flight: {} ops/s; rate = half of the lowest ({lowest}): {} ops/s",
                peaks.join(", "),
                report::ops(ops / 2.0)
            ));
            (ops / 2.0).max(1.0)
        }
    };
    let mut rows = Vec::new();
    for kind in run.targets.clone() {
        run.progress.line(&format!("{kind}: starting, {} ops/s offered", report::ops(rate)));
        match at_rate(run, kind, &workload, rate, warmup, length).await {
            Ok(measured) => rows.push((kind, measured)),
            Err(error) => run.failed(kind, error),
        }
    }
    report(run, rate, &rows)?;
    Ok(RateFigures { rate, p99_ms: rows.iter().map(|(kind, m)| (*kind, m.latency.p99)).collect() })
}

async fn peak(run: &mut Run, kind: TargetKind, workload: &Arc<Workload>) -> anyhow::Result<f64> {
    let mut target = Target::start(kind, &run.setup, PEAK_INFLIGHT, false).await?;
    Ok(measure_closed(run, &mut target, workload, PEAK_INFLIGHT, PEAK_WARMUP, PEAK_LENGTH).await?.ops)
}

async fn at_rate(
    run: &mut Run,
    kind: TargetKind,
    workload: &Arc<Workload>,
    rate: f64,
    warmup: Duration,
    length: Duration,
) -> anyhow::Result<Measured> {
    let mut target = Target::start(kind, &run.setup, OPEN_LOOP_SLOTS, false).await?;
    let recorder = Arc::new(Recorder::new(Instant::now() + warmup, length, false));
    let load = start_open(target.client.clone(), workload.clone(), rate, recorder.clone());
    let label = format!("{kind} at {} ops/s", report::ops(rate));
    let measured = measure_window(&mut target, load, &recorder, length, &label, &mut run.progress).await?;
    run.progress.line(&format!("{label}: {}", measured.brief()));
    Ok(measured)
}

fn report(run: &mut Run, rate: f64, rows: &[(TargetKind, Measured)]) -> anyhow::Result<()> {
    let mut table = Table::new(&[
        "target",
        "offered/s",
        "answered/s",
        "p50 ms",
        "p99 ms",
        "p99.9 ms",
        "errors",
        "CPU total",
        "others",
    ]);
    let mut lines = Vec::new();
    for (kind, m) in rows {
        table.row(vec![
            kind.to_string(),
            report::ops(rate),
            report::ops(m.ops),
            report::decimal(m.latency.p50),
            report::decimal(m.latency.p99),
            report::decimal(m.latency.p999),
            m.errors.to_string(),
            report::decimal(m.cpu_split().3),
            report::decimal(m.cpu_others),
        ]);
        lines.push(vec![
            kind.to_string(),
            report::csv_number(rate),
            report::csv_number(m.ops),
            report::csv_number(m.latency.p50),
            report::csv_number(m.latency.p99),
            report::csv_number(m.latency.p999),
            m.errors.to_string(),
            report::csv_number(m.cpu_split().3),
            m.cpu_detail(),
            report::csv_number(m.cpu_others),
        ]);
    }
    run.say("rate: open loop, latency from the scheduled send time");
    run.say(table.render());
    for (kind, m) in rows {
        for note in m.notes(&kind.to_string()) {
            run.say(note);
        }
    }
    report::write_csv(
        &run.out.join("rate.csv"),
        &[
            "target",
            "offered_ops_per_s",
            "ops_per_s",
            "p50_ms",
            "p99_ms",
            "p999_ms",
            "errors",
            "cpu_total",
            "cpu_detail",
            "cpu_other_processes",
        ],
        &lines,
    )
}
