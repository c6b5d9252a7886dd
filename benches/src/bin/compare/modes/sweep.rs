//! `sweep`: closed loops at several in-flight levels on every target; throughput, latency and
//! CPU side by side, and the ratios the project tracks. Each target is measured with SET, then
//! (unless the caller leaves reads out) every key is written once and the same levels are
//! measured with the target's GET, and its local read where it has one. With several rounds the
//! whole sweep is repeated, the targets' order rotated each round, and the ratios are reported
//! per round and as medians across rounds. Last, the cluster's SET p50 at 1 in flight is set
//! beside its floor: the echo responder's p50 at 1 in flight plus one WAL-like fsync of this
//! machine's disk, measured after the targets have stopped.

use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::{measure_closed, median, round_order, Measured, Run};
use crate::load::{Op, Workload};
use crate::report::{self, Table};
use crate::stats::Recorder;
use crate::svg::{self, Chart, Line};
use crate::targets::{Target, TargetKind};

/// The columns of `sweep.csv`; `op` (SET, GET, GET-local) comes last, so the earlier columns
/// keep their places.
const CSV_HEADERS: [&str; 17] = [
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
    "round",
    "elections",
    "op",
];

struct Row {
    round: usize,
    kind: TargetKind,
    op: Op,
    inflight: usize,
    measured: Measured,
}

impl Row {
    fn point(&self) -> Point {
        Point {
            round: self.round,
            kind: self.kind,
            inflight: self.inflight,
            ops: self.measured.ops,
            p99: self.measured.latency.p99,
        }
    }
}

/// What the ratios and the chart need of one measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Point {
    round: usize,
    kind: TargetKind,
    inflight: usize,
    ops: f64,
    p99: f64,
}

/// What the scorecard judges of a sweep: the cluster's medians across rounds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SweepFigures {
    /// The cluster's ops/s over etcd's at 64 in flight.
    pub over_etcd: Option<f64>,
    /// The cluster's ops/s over the echo responder's at 64 in flight.
    pub over_echo: Option<f64>,
    /// The cluster's p99 at 256 in flight over its p99 at 64.
    pub tail: Option<f64>,
    /// The same ratio of the echo responder: what the broker and the machine alone make it.
    pub echo_tail: Option<f64>,
    /// The cluster's ops/s at 256 in flight over its ops/s at 64. In a closed loop the mean wait
    /// is the in-flight count over the throughput (Little's law), so the wait at 256 is
    /// 4 / `growth` times the wait at 64 before the tails' shapes enter.
    pub growth: Option<f64>,
    /// The fewest requests per leader fsync of any round at 64 in flight.
    pub fewest_per_fsync: Option<f64>,
    /// The cluster's errors and elections over every level and round.
    pub errors: u64,
    pub elections: u64,
}

/// The sweep; with `reads`, each target's reads after its SETs.
pub async fn sweep(
    run: &mut Run,
    levels: &[usize],
    warmup: Duration,
    length: Duration,
    rounds: usize,
    reads: bool,
) -> anyhow::Result<SweepFigures> {
    let mut rows = Vec::new();
    for round in 1..=rounds {
        for kind in round_order(&run.targets, round) {
            if rounds > 1 {
                run.progress.line(&format!("{kind}: round {round} of {rounds}, starting"));
            } else {
                run.progress.line(&format!("{kind}: starting"));
            }
            let sweep = Sweep { round, kind, levels, warmup, length, reads };
            if let Err(error) = sweep_target(run, &sweep, &mut rows).await {
                run.failed(kind, error);
            }
        }
    }
    report(run, levels, rounds, &rows)
}

/// One target's sweep in one round.
struct Sweep<'a> {
    round: usize,
    kind: TargetKind,
    levels: &'a [usize],
    warmup: Duration,
    length: Duration,
    reads: bool,
}

/// Requests in flight while every key is written before the reads (on the connections the
/// levels use: slots beyond them share those).
const PREFILL_INFLIGHT: usize = 64;

async fn sweep_target(run: &mut Run, sweep: &Sweep<'_>, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let most = sweep.levels.iter().copied().max().unwrap_or(1);
    let mut target = Target::start(sweep.kind, &run.setup, most, false).await?;
    let mut ops = vec![Op::Set];
    if sweep.reads {
        ops.extend_from_slice(sweep.kind.reads());
    }
    for op in ops {
        if op == Op::Get {
            prefill(run, &target, PREFILL_INFLIGHT).await?;
        }
        let workload = Arc::new(Workload::random_keys(run.keys, run.value_size).with_op(op));
        for &inflight in sweep.levels {
            let measured = measure_closed(run, &mut target, &workload, inflight, sweep.warmup, sweep.length).await?;
            rows.push(Row { round: sweep.round, kind: sweep.kind, op, inflight, measured });
            // Written after every level, so an interrupted run keeps what it measured.
            write_csv(run, rows)?;
        }
    }
    Ok(())
}

/// Writes every key the reads draw from, once, so that each read finds a value; fails on any
/// error (a read of a key never written would count as one).
async fn prefill(run: &mut Run, target: &Target, inflight: usize) -> anyhow::Result<()> {
    let started = Instant::now();
    let recorder = Arc::new(Recorder::new(started, Duration::from_secs(24 * 3600), false));
    let workload = Arc::new(Workload::every_key(run.keys, run.value_size));
    let slots = inflight.min(run.keys.max(1) as usize);
    run.progress.update(&format!("{}: writing the {} keys the reads draw from", target.kind, run.keys));
    crate::load::start_closed(target.client.clone(), workload, slots, recorder.clone()).join().await;
    let recording = recorder.snapshot();
    if recording.errors > 0 {
        bail!(
            "{} of the {} writes before the reads failed, first: {}",
            recording.errors,
            run.keys,
            recording.error_samples.first().map_or("", String::as_str)
        );
    }
    run.progress.line(&format!(
        "{}: {} keys written for the reads in {:.1} s",
        target.kind,
        recording.answered,
        started.elapsed().as_secs_f64()
    ));
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
                row.round.to_string(),
                m.elections.map(|n| n.to_string()).unwrap_or_default(),
                row.op.name().to_string(),
            ]
        })
        .collect();
    report::write_csv(&run.out.join("sweep.csv"), &CSV_HEADERS, &lines)
}

fn find(points: &[Point], round: usize, kind: TargetKind, inflight: usize) -> Option<&Point> {
    points.iter().find(|p| p.round == round && p.kind == kind && p.inflight == inflight)
}

/// The targets the cluster's throughput is compared with, in the ratio tables' column order
/// (`etcd-json` only when it was measured). `cluster-open` is the same nodes without the cluster
/// secret, `cluster-tls` with TLS between them as well: their columns are what the secret saves
/// or TLS costs (1.0 when nothing).
const RATIO_TARGETS: [TargetKind; 6] = [
    TargetKind::Etcd,
    TargetKind::EtcdJson,
    TargetKind::Echo,
    TargetKind::Nats,
    TargetKind::ClusterOpen,
    TargetKind::ClusterTls,
];

/// The cluster's ops/s over `other`'s at `inflight` in `round`.
fn ops_ratio(points: &[Point], round: usize, other: TargetKind, inflight: usize) -> Option<f64> {
    let cluster = find(points, round, TargetKind::Cluster, inflight)?;
    let other = find(points, round, other, inflight)?;
    (other.ops > 0.0).then(|| cluster.ops / other.ops)
}

/// `kind`'s measurements at 64 and at 256 in flight, in `round`.
fn at_64_and_256(points: &[Point], round: usize, kind: TargetKind) -> Option<(&Point, &Point)> {
    Some((find(points, round, kind, 64)?, find(points, round, kind, 256)?))
}

/// `kind`'s p99 at 256 in flight over its p99 at 64, in `round`.
fn tail_ratio(points: &[Point], round: usize, kind: TargetKind) -> Option<f64> {
    let (low, high) = at_64_and_256(points, round, kind)?;
    (low.p99 > 0.0).then(|| high.p99 / low.p99)
}

/// `kind`'s ops/s at 256 in flight over its ops/s at 64, in `round`.
fn growth(points: &[Point], round: usize, kind: TargetKind) -> Option<f64> {
    let (low, high) = at_64_and_256(points, round, kind)?;
    (low.ops > 0.0).then(|| high.ops / low.ops)
}

/// Per target and round with both levels: ops/s at 256 in flight over ops/s at 64, 4 over that
/// (the wait at 256 over the wait at 64 that Little's law alone gives), and the p99 ratio.
fn from_64_to_256(points: &[Point], rounds: usize) -> Option<String> {
    let rows: Vec<Vec<String>> = (1..=rounds)
        .flat_map(|round| TargetKind::EVERY.into_iter().map(move |kind| (round, kind)))
        .filter_map(|(round, kind)| {
            let (grown, tail) = (growth(points, round, kind)?, tail_ratio(points, round, kind)?);
            Some(vec![
                round.to_string(),
                kind.to_string(),
                decimal3(Some(grown)),
                decimal3((grown > 0.0).then(|| 4.0 / grown)),
                format!("{tail:.2}"),
            ])
        })
        .collect();
    if rows.is_empty() {
        return None;
    }
    let mut table = Table::new(&["round", "target", "ops/s 256 / 64", "4 / growth", "p99 256 / 64"]);
    rows.into_iter().for_each(|row| table.row(row));
    Some(table.render())
}

/// One point per target and level: the median ops/s and p99 of its rounds.
fn medians_per_level(points: &[Point]) -> Vec<Point> {
    let mut out: Vec<Point> = Vec::new();
    for point in points {
        if out.iter().any(|p| p.kind == point.kind && p.inflight == point.inflight) {
            continue;
        }
        let same = || points.iter().filter(|p| p.kind == point.kind && p.inflight == point.inflight);
        out.push(Point {
            round: 0,
            ops: median(same().map(|p| p.ops)).unwrap_or(0.0),
            p99: median(same().map(|p| p.p99)).unwrap_or(0.0),
            ..*point
        });
    }
    out
}

fn decimal3(value: Option<f64>) -> String {
    value.map_or_else(|| "-".into(), |v| format!("{v:.3}"))
}

/// The figures of `rows` (and their `points`) the scorecard judges (rounds 1 to `rounds`).
fn figures(rows: &[Row], points: &[Point], rounds: usize) -> SweepFigures {
    let median_over = |other| median((1..=rounds).filter_map(|round| ops_ratio(points, round, other, 64)));
    let cluster = || rows.iter().filter(|row| row.kind == TargetKind::Cluster);
    SweepFigures {
        over_etcd: median_over(TargetKind::Etcd),
        over_echo: median_over(TargetKind::Echo),
        tail: median((1..=rounds).filter_map(|round| tail_ratio(points, round, TargetKind::Cluster))),
        echo_tail: median((1..=rounds).filter_map(|round| tail_ratio(points, round, TargetKind::Echo))),
        growth: median((1..=rounds).filter_map(|round| growth(points, round, TargetKind::Cluster))),
        fewest_per_fsync: cluster()
            .filter(|row| row.op == Op::Set && row.inflight == 64)
            .filter_map(|row| row.measured.requests_per_fsync)
            .min_by(f64::total_cmp),
        errors: cluster().map(|row| row.measured.errors).sum(),
        elections: cluster().filter_map(|row| row.measured.elections).sum(),
    }
}

fn report(run: &mut Run, levels: &[usize], rounds: usize, rows: &[Row]) -> anyhow::Result<SweepFigures> {
    let mut headers = vec![
        "target",
        "op",
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
        "elections",
    ];
    if rounds > 1 {
        headers.insert(0, "round");
    }
    let mut table = Table::new(&headers);
    for row in rows {
        let m = &row.measured;
        let (bench, broker, servers, total) = m.cpu_split();
        let mut cells = vec![
            row.kind.to_string(),
            row.op.name().to_string(),
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
            m.elections.map(|n| n.to_string()).unwrap_or_else(|| "-".into()),
        ];
        if rounds > 1 {
            cells.insert(0, row.round.to_string());
        }
        table.row(cells);
    }
    let operations = if rows.iter().any(|row| row.op != Op::Set) {
        "SET, then (every key written first) GET: linearizable (cluster over MQTT, etcd's default \
         Range over gRPC), NATS KV's direct get, the echo responder's +OK; GET-local: etcd's \
         serializable Range (the member's own state, possibly stale; the state store's local read \
         is HTTP-only, not measured here)"
    } else {
        "SET"
    };
    run.say(format!(
        "sweep: closed loop over random keys, {operations}; CPU in CPU-seconds per second (2 cores = \
         2.00); others = other processes on the machine meanwhile (noise when well above 0)"
    ));
    run.say(table.render());
    for row in rows {
        let label = match row.op {
            Op::Set => format!("{} {} in flight", row.kind, row.inflight),
            op => format!("{} {} {} in flight", row.kind, op.name(), row.inflight),
        };
        for note in row.measured.notes(&label) {
            run.say(note);
        }
    }

    // The ratios, the tails and the chart are of SET, as the project's targets are.
    let points: Vec<Point> = rows.iter().filter(|row| row.op == Op::Set).map(Row::point).collect();
    let rounds_list: Vec<usize> = (1..=rounds).collect();
    let ratio_targets: Vec<TargetKind> = RATIO_TARGETS
        .into_iter()
        .filter(|&kind| kind != TargetKind::EtcdJson || points.iter().any(|p| p.kind == kind))
        .collect();
    let ratio_headers: Vec<String> =
        ratio_targets.iter().map(|other| format!("cluster/{} ops", other.name())).collect();
    let headers = |leading: &[&'static str]| -> Vec<String> {
        leading.iter().map(|h| h.to_string()).chain(ratio_headers.iter().cloned()).collect()
    };
    if rounds > 1 {
        let mut per_round = Table::new(&headers(&["round", "in flight"]));
        for &round in &rounds_list {
            for &level in levels {
                let mut row = vec![round.to_string(), level.to_string()];
                row.extend(ratio_targets.iter().map(|&other| decimal3(ops_ratio(&points, round, other, level))));
                per_round.row(row);
            }
        }
        run.say("\nratios per round");
        run.say(per_round.render());
    }
    let mut ratios = Table::new(&headers(&["in flight"]));
    for &level in levels {
        let median_of = |other| median(rounds_list.iter().filter_map(|&round| ops_ratio(&points, round, other, level)));
        let mut row = vec![level.to_string()];
        row.extend(ratio_targets.iter().map(|&other| decimal3(median_of(other))));
        ratios.row(row);
    }
    run.say(if rounds > 1 { format!("\nratios, median of {rounds} rounds") } else { "\nratios".to_string() });
    run.say(ratios.render());
    let tails: Vec<f64> =
        rounds_list.iter().filter_map(|&round| tail_ratio(&points, round, TargetKind::Cluster)).collect();
    let tail = match median(tails.iter().copied()) {
        None => "- (needs levels 64 and 256)".to_string(),
        Some(median) if rounds > 1 => {
            let each: Vec<String> = tails.iter().map(|t| format!("{t:.2}")).collect();
            format!("{median:.2} (median; per round {})", each.join(", "))
        }
        Some(only) => format!("{only:.2}"),
    };
    run.say(format!("cluster p99 at 256 in flight / p99 at 64: {tail}"));
    if let Some(table) = from_64_to_256(&points, rounds) {
        run.say(
            "\nfrom 64 to 256 in flight: throughput grown, and the wait Little's law sets for 4 times the \
             requests in a closed loop (4 / growth) beside the p99 ratio measured",
        );
        run.say(table);
    }

    if let Some(floor) = floor(run, rows)? {
        run.say(floor);
    }

    std::fs::write(run.out.join("sweep.svg"), chart(levels, &medians_per_level(&points)))?;
    Ok(figures(rows, &points, rounds))
}

/// Writes and fdatasyncs measured for the floor.
const FSYNC_SAMPLES: usize = 200;
/// Bytes per write: one WAL append of a small entry, rounded to a page.
const FSYNC_BYTES: usize = 4096;

/// The floor of a request at 1 in flight and the cluster beside it: the echo responder's SET p50
/// at 1 in flight (the MQTT path alone) plus the median time to append 4 KiB to a file and
/// fdatasync it on the output directory's disk (one WAL write; the leader's own fsync is the least
/// a durable write waits for). Medians across rounds; also saved as `floor.csv`. `None` when no
/// level was 1 in flight.
fn floor(run: &Run, rows: &[Row]) -> anyhow::Result<Option<String>> {
    let p50_at_1 = |kind: TargetKind| {
        median(
            rows.iter()
                .filter(|row| row.kind == kind && row.op == Op::Set && row.inflight == 1)
                .map(|row| row.measured.latency.p50),
        )
    };
    if !rows.iter().any(|row| row.inflight == 1) {
        return Ok(None);
    }
    let (Some(echo), Some(cluster)) = (p50_at_1(TargetKind::Echo), p50_at_1(TargetKind::Cluster)) else {
        return Ok(Some("\nfloor at 1 in flight: not measured (needs echo and cluster at 1 in flight)".into()));
    };
    let fsync = tokio::task::block_in_place(|| fsync_median_ms(&run.out, FSYNC_SAMPLES))?;
    let floor = echo + fsync;
    let ratio = cluster / floor;
    report::write_csv(
        &run.out.join("floor.csv"),
        &["echo_p50_ms", "fsync_p50_ms", "floor_ms", "cluster_p50_ms", "cluster_over_floor"],
        &[vec![
            report::csv_number(echo),
            report::csv_number(fsync),
            report::csv_number(floor),
            report::csv_number(cluster),
            report::csv_number(ratio),
        ]],
    )?;
    Ok(Some(format!(
        "\nfloor at 1 in flight: echo SET p50 {} ms + one {FSYNC_BYTES}-byte append and fdatasync {} ms \
         (median of {FSYNC_SAMPLES} on this disk) = {} ms; cluster SET p50 at 1 in flight {} ms = {ratio:.2} x the floor",
        report::decimal(echo),
        report::decimal(fsync),
        report::decimal(floor),
        report::decimal(cluster),
    )))
}

/// The median time, in ms, of `samples` appends of [`FSYNC_BYTES`] to a new file in `dir`, each
/// followed by fdatasync (as a WAL appends and syncs); the file is removed afterwards.
fn fsync_median_ms(dir: &Path, samples: usize) -> anyhow::Result<f64> {
    let mut file = tempfile::Builder::new()
        .prefix(".fsync-probe-")
        .tempfile_in(dir)
        .with_context(|| format!("a file to fsync in {}", dir.display()))?;
    let block: Vec<u8> = (0..FSYNC_BYTES).map(|_| fastrand::u8(..)).collect();
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples.max(1) {
        let started = Instant::now();
        file.write_all(&block)?;
        file.as_file().sync_data()?;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    median(times).context("no fsync measured")
}

/// Ops/s and p99 against the in-flight level (levels evenly spaced), one line per target.
fn chart(levels: &[usize], points: &[Point]) -> String {
    let x_ticks: Vec<(f64, String)> = levels.iter().enumerate().map(|(i, l)| (i as f64, l.to_string())).collect();
    let position = |inflight: usize| levels.iter().position(|l| *l == inflight).unwrap_or(0) as f64;
    let lines = |value: &dyn Fn(&Point) -> f64| {
        TargetKind::EVERY
            .iter()
            .filter(|kind| points.iter().any(|p| p.kind == **kind))
            .map(|kind| Line {
                name: kind.to_string(),
                points: points.iter().filter(|p| p.kind == *kind).map(|p| (position(p.inflight), value(p))).collect(),
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
    svg::render(&[chart("Throughput (SET)", "ops/s", lines(&|p| p.ops)), chart("Latency p99", "ms", lines(&|p| p.p99))])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(round: usize, kind: TargetKind, inflight: usize, ops: f64, p99: f64) -> Point {
        Point { round, kind, inflight, ops, p99 }
    }

    #[test]
    fn the_fsync_probe_times_appends_and_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let ms = fsync_median_ms(dir.path(), 5).unwrap();
        assert!(ms > 0.0 && ms.is_finite(), "{ms}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the probe's file is removed");
    }

    #[test]
    fn each_round_starts_with_another_target() {
        let all = [TargetKind::Echo, TargetKind::Cluster, TargetKind::Etcd];
        assert_eq!(round_order(&all, 1), all);
        assert_eq!(round_order(&all, 2), [TargetKind::Cluster, TargetKind::Etcd, TargetKind::Echo]);
        assert_eq!(round_order(&all, 3), [TargetKind::Etcd, TargetKind::Echo, TargetKind::Cluster]);
        assert_eq!(round_order(&all, 4), all);
        assert!(round_order(&[], 2).is_empty());
    }

    #[test]
    fn ratios_pair_targets_of_the_same_round_and_take_the_median_across_rounds() {
        use TargetKind::{Cluster, Echo, Etcd};
        let points = [
            // Round 1 on a fast machine, round 2 on one half as fast, round 3 in between.
            point(1, Echo, 64, 20_000.0, 6.0),
            point(1, Cluster, 64, 9_000.0, 15.0),
            point(1, Cluster, 256, 12_000.0, 45.0),
            point(1, Etcd, 64, 8_000.0, 20.0),
            point(2, Echo, 64, 10_000.0, 12.0),
            point(2, Cluster, 64, 5_000.0, 30.0),
            point(2, Cluster, 256, 6_000.0, 120.0),
            point(2, Etcd, 64, 5_000.0, 35.0),
            point(3, Echo, 64, 15_000.0, 8.0),
            point(3, Cluster, 64, 6_600.0, 20.0),
            point(3, Etcd, 64, 6_000.0, 25.0),
        ];
        assert_eq!(ops_ratio(&points, 1, Echo, 64), Some(0.45));
        assert_eq!(ops_ratio(&points, 2, Etcd, 64), Some(1.0));
        assert_eq!(ops_ratio(&points, 1, Etcd, 256), None, "etcd did not run at 256");
        let rounds = [1, 2, 3];
        let echo = median(rounds.iter().filter_map(|&r| ops_ratio(&points, r, Echo, 64))).unwrap();
        assert!((echo - 0.45).abs() < 1e-9, "0.45, 0.5, 0.44: {echo}");
        assert_eq!(tail_ratio(&points, 1, Cluster), Some(3.0));
        assert_eq!(tail_ratio(&points, 2, Cluster), Some(4.0));
        assert_eq!(tail_ratio(&points, 3, Cluster), None, "no 256 in round 3");
        assert_eq!(tail_ratio(&points, 1, Echo), None, "the echo responder ran at 64 only");
        assert_eq!(median(rounds.iter().filter_map(|&r| tail_ratio(&points, r, Cluster))), Some(3.5));
        assert_eq!(growth(&points, 1, Cluster), Some(12_000.0 / 9_000.0));
        assert_eq!(growth(&points, 2, Cluster), Some(1.2));
        assert_eq!(growth(&points, 3, Cluster), None);
        assert_eq!(median([]), None);
        assert_eq!(median([f64::NAN, 2.0]), Some(2.0));

        let per_level = medians_per_level(&points);
        let cluster64 = per_level.iter().find(|p| p.kind == Cluster && p.inflight == 64).unwrap();
        assert_eq!((cluster64.ops, cluster64.p99), (6_600.0, 20.0));
        assert_eq!(per_level.len(), 4, "echo 64, cluster 64 and 256, etcd 64");

        let table = from_64_to_256(&points, 3).unwrap();
        let rows: Vec<&str> = table.lines().filter(|line| line.contains("cluster")).collect();
        assert_eq!(rows.len(), 2, "rounds 1 and 2 have both levels:\n{table}");
        for (row, cells) in rows.iter().zip([["1.333", "3.000", "3.00"], ["1.200", "3.333", "4.00"]]) {
            for cell in cells {
                assert!(row.split_whitespace().any(|c| c == cell), "{cell} in {row}");
            }
        }
        assert_eq!(from_64_to_256(&points[..2], 1), None, "no target with both levels");
    }
}
