//! `sustained`: a long closed loop at 16 in flight with the usual message expiry; throughput
//! every second and the latency tail every minute, to see whether anything degrades (a growing
//! log, compaction, memory) between the first minute and the last.

use std::sync::Arc;
use std::time::Duration;

use super::{measure_closed, Measured, Run};
use crate::load::Workload;
use crate::report::{self, Table};
use crate::stats::Percentiles;
use crate::svg::{self, Chart, Line};
use crate::targets::{Target, TargetKind};

const WARMUP: Duration = Duration::from_secs(2);

/// What the scorecard judges of the cluster's sustained run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SustainedFigures {
    /// The last minute's ops/s over the first minute's.
    pub last_to_first: Option<f64>,
    /// The highest p99.9 of any minute, in ms.
    pub worst_p999_ms: Option<f64>,
}

impl SustainedFigures {
    fn of(by_minute: &[(f64, Percentiles, u64)]) -> SustainedFigures {
        let (Some(first), Some(last)) = (by_minute.first(), by_minute.last()) else {
            return SustainedFigures::default();
        };
        SustainedFigures {
            last_to_first: (first.0 > 0.0).then(|| last.0 / first.0),
            worst_p999_ms: by_minute.iter().map(|(_, p, _)| p.p999).max_by(f64::total_cmp),
        }
    }
}

pub async fn sustained(run: &mut Run, length_minutes: u64, inflight: usize) -> anyhow::Result<SustainedFigures> {
    let workload = Arc::new(Workload::random_keys(run.keys, run.value_size));
    let length = Duration::from_secs(length_minutes.max(1) * 60);
    let mut results = Vec::new();
    for kind in run.targets.clone() {
        run.progress.line(&format!("{kind}: starting, {length_minutes} min at {inflight} in flight"));
        let measured = async {
            let mut target = Target::start(kind, &run.setup, inflight, false).await?;
            measure_closed(run, &mut target, &workload, inflight, WARMUP, length).await
        }
        .await;
        match measured {
            Ok(measured) => results.push((kind, measured)),
            Err(error) => run.failed(kind, error),
        }
    }
    report(run, inflight, &results)?;
    let cluster = results.iter().find(|(kind, _)| *kind == TargetKind::Cluster);
    Ok(cluster.map(|(_, measured)| SustainedFigures::of(&minutes(measured))).unwrap_or_default())
}

/// Per minute: answers per second and the latency percentiles.
fn minutes(measured: &Measured) -> Vec<(f64, Percentiles, u64)> {
    let recording = &measured.recording;
    recording
        .minutes
        .iter()
        .enumerate()
        .map(|(minute, latencies)| {
            let seconds = recording.seconds.iter().skip(minute * 60).take(60);
            let (count, errors) = seconds.fold((0, 0), |(n, e), s| (n + 1, e + s.errors));
            (latencies.count() as f64 / f64::from(count.max(1)), Percentiles::from(latencies), errors)
        })
        .collect()
}

fn report(run: &mut Run, inflight: usize, results: &[(TargetKind, Measured)]) -> anyhow::Result<()> {
    let mut per_second = Vec::new();
    let mut per_minute = Vec::new();
    let mut table = Table::new(&[
        "target",
        "minute",
        "ops/s",
        "p50 ms",
        "p99 ms",
        "p99.9 ms",
        "errors",
        "servers µs/req",
        "stolen",
        "others",
    ]);
    let mut drift = Table::new(&[
        "target",
        "ops/s last/first",
        "servers µs/req last/first",
        "p99 last/first",
        "p99.9 last/first",
        "CPU total",
        "others",
    ]);
    for (kind, measured) in results {
        for (second, s) in measured.recording.seconds.iter().enumerate() {
            per_second.push(vec![kind.to_string(), second.to_string(), s.answered.to_string(), s.errors.to_string()]);
        }
        let by_minute = minutes(measured);
        // The servers' CPU per answer in each minute: it rises if the store does more work per
        // request as it runs; ops/s alone also moves with what the rest of the machine gets.
        let cpu_of =
            |minute: usize, of: fn(&super::MinuteCpu) -> f64| measured.minutes_cpu.get(minute).map_or(f64::NAN, of);
        let cost_us = |minute: usize| cpu_of(minute, |c| c.servers) / by_minute[minute].0.max(1e-9) * 1e6;
        for (minute, (ops, p, errors)) in by_minute.iter().enumerate() {
            table.row(vec![
                kind.to_string(),
                (minute + 1).to_string(),
                report::ops(*ops),
                report::decimal(p.p50),
                report::decimal(p.p99),
                report::decimal(p.p999),
                errors.to_string(),
                format!("{:.1}", cost_us(minute)),
                report::decimal(cpu_of(minute, |c| c.stolen)),
                report::decimal(cpu_of(minute, |c| c.others)),
            ]);
            per_minute.push(vec![
                kind.to_string(),
                (minute + 1).to_string(),
                report::csv_number(*ops),
                report::csv_number(p.p50),
                report::csv_number(p.p99),
                report::csv_number(p.p999),
                errors.to_string(),
                report::csv_number(cost_us(minute)),
                report::csv_number(cpu_of(minute, |c| c.stolen)),
                report::csv_number(cpu_of(minute, |c| c.others)),
            ]);
        }
        if let (Some(first), Some(last)) = (by_minute.first(), by_minute.last()) {
            drift.row(vec![
                kind.to_string(),
                format!("{:.3}", last.0 / first.0),
                format!("{:.3}", cost_us(by_minute.len() - 1) / cost_us(0)),
                format!("{:.3}", last.1.p99 / first.1.p99),
                format!("{:.3}", last.1.p999 / first.1.p999),
                report::decimal(measured.cpu_split().3),
                report::decimal(measured.cpu_others),
            ]);
        }
    }
    run.say(format!("sustained: closed loop at {inflight} in flight, per minute"));
    run.say(table.render());
    run.say("last minute vs first minute");
    run.say(drift.render());
    for (kind, measured) in results {
        for note in measured.notes(&kind.to_string()) {
            run.say(note);
        }
    }
    report::write_csv(&run.out.join("sustained.csv"), &["target", "second", "answered", "errors"], &per_second)?;
    report::write_csv(
        &run.out.join("sustained_minutes.csv"),
        &[
            "target",
            "minute",
            "ops_per_s",
            "p50_ms",
            "p99_ms",
            "p999_ms",
            "errors",
            "servers_cpu_us_per_request",
            "stolen_cpu",
            "others_cpu",
        ],
        &per_minute,
    )?;
    let lines = results
        .iter()
        .map(|(kind, measured)| Line {
            name: kind.to_string(),
            points: measured.recording.seconds.iter().enumerate().map(|(s, x)| (s as f64, x.answered as f64)).collect(),
        })
        .collect();
    let chart = Chart {
        title: format!("Sustained load, {inflight} in flight"),
        x_label: "seconds".into(),
        y_label: "answers per second".into(),
        lines,
        bands: Vec::new(),
        x_ticks: None,
        dots: false,
    };
    std::fs::write(run.out.join("sustained.svg"), svg::render(&[chart]))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minute(ops: f64, p999: f64) -> (f64, Percentiles, u64) {
        (ops, Percentiles { p50: 1.0, p99: 5.0, p999 }, 0)
    }

    #[test]
    fn the_last_minute_is_set_against_the_first_and_the_worst_minute_tail_is_kept() {
        let figures = SustainedFigures::of(&[minute(4000.0, 12.0), minute(3000.0, 140.0), minute(3800.0, 20.0)]);
        assert_eq!(figures.last_to_first, Some(0.95));
        assert_eq!(figures.worst_p999_ms, Some(140.0));
        assert_eq!(SustainedFigures::of(&[]), SustainedFigures::default());
        assert_eq!(SustainedFigures::of(&[minute(0.0, 1.0)]).last_to_first, None, "no answers in the first minute");
    }
}
