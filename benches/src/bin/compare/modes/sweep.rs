//! `sweep`: closed loops at several in-flight levels on every target; throughput, latency and
//! CPU side by side, and the ratios the project tracks.

use std::sync::Arc;
use std::time::Duration;

use super::{error_note, measure_closed, Measured, Run};
use crate::load::Workload;
use crate::report::{self, Table};
use crate::svg::{self, Chart, Line};
use crate::targets::{Target, TargetKind};

const CSV_HEADERS: [&str; 14] = [
    "target",
    "inflight",
    "ops_per_s",
    "p50_ms",
    "p99_ms",
    "p999_ms",
    "errors",
    "cpu_total",
    "cpu_loadgen",
    "cpu_broker",
    "cpu_servers",
    "cpu_detail",
    "cpu_other_processes",
    "leader_requests_per_fsync",
];

struct Row {
    kind: TargetKind,
    inflight: usize,
    measured: Measured,
}

pub async fn sweep(run: &mut Run, levels: &[usize], warmup: Duration, length: Duration) -> anyhow::Result<()> {
    let workload = Arc::new(Workload::random_keys(run.keys, run.value_size));
    let mut rows = Vec::new();
    for kind in run.targets.clone() {
        run.progress.line(&format!("{kind}: starting"));
        if let Err(error) = sweep_target(run, kind, &workload, levels, warmup, length, &mut rows).await {
            run.failed(kind, error);
        }
    }
    report(run, levels, &rows)
}

async fn sweep_target(
    run: &mut Run,
    kind: TargetKind,
    workload: &Arc<Workload>,
    levels: &[usize],
    warmup: Duration,
    length: Duration,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let most = levels.iter().copied().max().unwrap_or(1);
    let mut target = Target::start(kind, &run.setup, most, false).await?;
    for &inflight in levels {
        let measured = measure_closed(run, &mut target, workload, inflight, warmup, length).await?;
        rows.push(Row { kind, inflight, measured });
        // Written after every level, so an interrupted run keeps what it measured.
        write_csv(run, rows)?;
    }
    Ok(())
}

fn write_csv(run: &Run, rows: &[Row]) -> anyhow::Result<()> {
    let lines: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            let m = &row.measured;
            let (bench, broker, servers, total) = m.cpu_split();
            vec![
                row.kind.to_string(),
                row.inflight.to_string(),
                report::csv_number(m.ops),
                report::csv_number(m.latency.p50),
                report::csv_number(m.latency.p99),
                report::csv_number(m.latency.p999),
                m.errors.to_string(),
                report::csv_number(total),
                report::csv_number(bench),
                report::csv_number(broker),
                report::csv_number(servers),
                m.cpu_detail(),
                report::csv_number(m.cpu_others),
                m.requests_per_fsync.map(report::csv_number).unwrap_or_default(),
            ]
        })
        .collect();
    report::write_csv(&run.out.join("sweep.csv"), &CSV_HEADERS, &lines)
}

fn find(rows: &[Row], kind: TargetKind, inflight: usize) -> Option<&Measured> {
    rows.iter().find(|r| r.kind == kind && r.inflight == inflight).map(|r| &r.measured)
}

fn report(run: &mut Run, levels: &[usize], rows: &[Row]) -> anyhow::Result<()> {
    let mut table = Table::new(&[
        "target",
        "in flight",
        "ops/s",
        "p50 ms",
        "p99 ms",
        "p99.9 ms",
        "errors",
        "CPU total",
        "bench",
        "broker",
        "servers",
        "others",
        "req/fsync",
    ]);
    for row in rows {
        let m = &row.measured;
        let (bench, broker, servers, total) = m.cpu_split();
        table.row(vec![
            row.kind.to_string(),
            row.inflight.to_string(),
            report::ops(m.ops),
            report::decimal(m.latency.p50),
            report::decimal(m.latency.p99),
            report::decimal(m.latency.p999),
            m.errors.to_string(),
            report::decimal(total),
            report::decimal(bench),
            report::decimal(broker),
            report::decimal(servers),
            report::decimal(m.cpu_others),
            m.requests_per_fsync.map(report::decimal).unwrap_or_else(|| "-".into()),
        ]);
    }
    run.say(
        "sweep: closed loop, SET of random keys; CPU in CPU-seconds per second (2 cores = 2.00); \
         others = other processes on the machine meanwhile (noise when well above 0)",
    );
    run.say(table.render());
    for row in rows {
        if let Some(note) = error_note(
            &format!("{} {} in flight", row.kind, row.inflight),
            row.measured.errors,
            &row.measured.error_samples,
        ) {
            run.say(note);
        }
    }

    let mut ratios = Table::new(&["in flight", "cluster/etcd ops", "cluster/echo ops"]);
    let ratio = |a: Option<&Measured>, b: Option<&Measured>| match (a, b) {
        (Some(a), Some(b)) if b.ops > 0.0 => format!("{:.3}", a.ops / b.ops),
        _ => "-".into(),
    };
    for &level in levels {
        let cluster = find(rows, TargetKind::Cluster, level);
        ratios.row(vec![
            level.to_string(),
            ratio(cluster, find(rows, TargetKind::Etcd, level)),
            ratio(cluster, find(rows, TargetKind::Echo, level)),
        ]);
    }
    run.say("\nratios");
    run.say(ratios.render());
    let tail = match (find(rows, TargetKind::Cluster, 256), find(rows, TargetKind::Cluster, 64)) {
        (Some(high), Some(low)) if low.latency.p99 > 0.0 => format!("{:.2}", high.latency.p99 / low.latency.p99),
        _ => "- (needs levels 64 and 256)".into(),
    };
    run.say(format!("cluster p99 at 256 in flight / p99 at 64: {tail}"));

    std::fs::write(run.out.join("sweep.svg"), chart(levels, rows))?;
    Ok(())
}

/// Ops/s and p99 against the in-flight level (levels evenly spaced), one line per target.
fn chart(levels: &[usize], rows: &[Row]) -> String {
    let x_ticks: Vec<(f64, String)> = levels.iter().enumerate().map(|(i, l)| (i as f64, l.to_string())).collect();
    let position = |inflight: usize| levels.iter().position(|l| *l == inflight).unwrap_or(0) as f64;
    let lines = |value: &dyn Fn(&Measured) -> f64| {
        TargetKind::ALL
            .iter()
            .filter(|kind| rows.iter().any(|r| r.kind == **kind))
            .map(|kind| Line {
                name: kind.to_string(),
                points: rows
                    .iter()
                    .filter(|r| r.kind == *kind)
                    .map(|r| (position(r.inflight), value(&r.measured)))
                    .collect(),
            })
            .collect::<Vec<_>>()
    };
    let chart = |title: &str, y_label: &str, lines: Vec<Line>| Chart {
        title: title.into(),
        x_label: "requests in flight".into(),
        y_label: y_label.into(),
        lines,
        bands: Vec::new(),
        x_ticks: Some(x_ticks.clone()),
        dots: true,
    };
    svg::render(&[
        chart("Throughput (SET)", "ops/s", lines(&|m| m.ops)),
        chart("Latency p99", "ms", lines(&|m| m.latency.p99)),
    ])
}
