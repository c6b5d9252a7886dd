//! `compare`: one side-by-side benchmark of the state store against the broker alone (`echo`,
//! the ceiling any MQTT service has here), etcd (a Raft store with fsync on) and a NATS
//! JetStream key-value bucket, on this machine, with the same requests, keys, values and
//! in-flight counts. `benches/compare.sh`
//! builds and runs it; docs/benchmarks.md describes the modes and the output.
//!
//! # Layout
//! - [`cli`]: options; [`modes`]: sweep, rate, fill, sustained, partition, snapshot, and the
//!   scorecard, which runs them all and judges every target.
//! - [`targets`]: starting and stopping a target: [`broker`] (Mosquitto), [`echo`] (the echo
//!   responders), [`cluster`] (three `statestore` nodes), [`etcd`], [`nats`]; [`proxy`] cuts
//!   node links.
//! - [`load`]: closed and open loops over a [`load::Requester`]: [`mqtt_load`] (as the Rust SDK
//!   sends), [`etcd::EtcdLoad`] (gRPC; [`etcd::EtcdJsonLoad`] the JSON gateway) or
//!   [`nats::NatsLoad`] (KV puts and gets).
//! - [`stats`]: latencies and counts; [`report`]: tables, CSV, progress; [`svg`]: charts.
//! - [`processes`]: child processes that are always stopped, CPU and memory from /proc.

mod broker;
mod cli;
mod cluster;
mod echo;
mod etcd;
mod load;
mod modes;
mod mqtt_load;
mod nats;
mod processes;
mod proxy;
mod report;
mod stats;
mod svg;
mod targets;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context};
use clap::Parser;

use cli::{Cli, Mode};
use modes::Run;
use mqtt_load::RequestOptions;
use targets::{Setup, TargetKind};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("compare: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = match cli.mode {
        Mode::EchoResponder { broker_port, ready_file } => {
            runtime.block_on(echo::run_responders(broker_port, ready_file))
        }
        mode => runtime.block_on(run(mode)),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("compare: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs a mode under a time limit and until Ctrl-C or SIGTERM. Whichever ends first, the
/// mode's future is dropped, and with it every process and connection it started.
async fn run(mode: Mode) -> anyhow::Result<()> {
    let common = mode.common().context("a benchmark mode")?;
    let targets = choose_targets(&mode)?;
    let out = match &common.out {
        Some(out) => out.clone(),
        None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/results")).join(format!(
            "{}-{}",
            utc_stamp(now_secs()),
            mode.name()
        )),
    };
    let logs = out.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let scratch = tempfile::Builder::new().prefix("statestore-compare-").tempdir()?;
    let nodes_binary = match &common.nodes_binary {
        Some(path) => path.clone(),
        None => std::env::current_exe()?.with_file_name("statestore"),
    };
    if targets.iter().any(|t| matches!(t, TargetKind::Cluster | TargetKind::ClusterOpen | TargetKind::ClusterTls)) {
        cluster::check_binary(&nodes_binary, None)?;
    }
    if targets
        .iter()
        .any(|t| matches!(t, TargetKind::Echo | TargetKind::Cluster | TargetKind::ClusterOpen | TargetKind::ClusterTls))
        && !common.mosquitto.is_file()
    {
        bail!("{} does not exist (apt-get install -y mosquitto, or pass --mosquitto)", common.mosquitto.display());
    }
    let setup = Setup {
        mosquitto: common.mosquitto.clone(),
        nodes_binary,
        etcd_binary: common.etcd.clone(),
        nats_binary: common.nats.clone(),
        request: RequestOptions {
            timeout: Duration::from_secs(common.timeout.max(1)),
            message_expiry_secs: common.message_expiry.max(1),
        },
        scratch: scratch.path().to_path_buf(),
        logs,
    };
    let limit = common.time_limit.unwrap_or(2 * mode.planned_secs(targets.len()) + 300);
    let mut run = Run::new(setup, out, targets.clone(), common.keys, common.value_size);
    run.say(format!(
        "compare {} at {} on {} cores: targets {}; {} of {}-byte values on {}; message expiry {} s, timeout {} s",
        mode.name(),
        utc_stamp(now_secs()),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        targets.iter().map(|t| t.name()).collect::<Vec<_>>().join(","),
        if matches!(mode, Mode::Sweep { .. }) { "SET, then GET," } else { "SET" },
        common.value_size,
        match mode {
            Mode::Fill { .. } => "distinct keys".to_string(),
            Mode::Scorecard { .. } => {
                format!("{} random keys; the fills and snapshots of distinct keys", report::ops(common.keys as f64))
            }
            Mode::Snapshot { to, .. } => format!("{} distinct keys, then random ones", report::ops(to as f64)),
            _ => format!("{} random keys", report::ops(common.keys as f64)),
        },
        common.message_expiry,
        common.timeout
    ));
    if targets.iter().any(|t| matches!(t, TargetKind::Cluster | TargetKind::ClusterOpen | TargetKind::ClusterTls)) {
        let built = std::fs::metadata(&run.setup.nodes_binary)
            .and_then(|m| m.modified())
            .map(|t| utc_stamp(t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())))
            .unwrap_or_else(|_| "?".into());
        run.say(format!("node binary: {} (built {built})", run.setup.nodes_binary.display()));
    }
    let requested = common.targets.clone().unwrap_or_else(|| mode.default_targets());
    if requested.iter().any(|t| t.is_etcd()) && !targets.iter().any(|t| t.is_etcd()) {
        run.say(format!("etcd: skipped, {} does not exist (apt-get install -y etcd-server)", common.etcd.display()));
    }
    if requested.contains(&TargetKind::Nats) && !targets.contains(&TargetKind::Nats) {
        run.say(format!("nats: skipped, {} does not exist (apt-get install -y nats-server)", common.nats.display()));
    }
    run.progress.line(&format!("results go to {} (time limit {limit} s)", run.out.display()));

    let work = async {
        match &mode {
            Mode::Sweep { levels, secs, warmup, rounds, .. } => {
                let (warmup, length) = (Duration::from_secs(*warmup), Duration::from_secs(*secs));
                modes::sweep(&mut run, levels, warmup, length, *rounds as usize, true).await.map(drop)
            }
            Mode::Rate { rate, secs, warmup, .. } => {
                let (warmup, length) = (Duration::from_secs(*warmup), Duration::from_secs(*secs));
                modes::rate(&mut run, *rate, warmup, length).await.map(drop)
            }
            Mode::Fill { to, inflight, step, rounds, .. } => {
                let step = step.unwrap_or((*to / 10).clamp(1, 100_000));
                let plan = modes::FillPlan { to: *to, inflight: (*inflight).max(1), step: step.max(1) };
                modes::fill(&mut run, plan, *rounds as usize).await.map(drop)
            }
            Mode::Sustained { minutes, inflight, .. } => {
                modes::sustained(&mut run, *minutes, (*inflight).max(1)).await.map(drop)
            }
            Mode::Partition { phase_secs, inflight, .. } => {
                let phase = Duration::from_secs((*phase_secs).max(1));
                modes::partition(&mut run, phase, (*inflight).max(1)).await.map(drop)
            }
            Mode::Snapshot { to, rate, phase_secs, .. } => {
                let phase = Duration::from_secs((*phase_secs).max(1));
                modes::snapshot(&mut run, (*to).max(1), rate.max(1.0), phase).await.map(drop)
            }
            Mode::Scorecard { options, .. } => modes::scorecard(&mut run, scorecard_plan(options)).await,
            Mode::Floods { options, .. } => modes::floods(&mut run, floods_plan(options)).await,
            Mode::EchoResponder { .. } => Ok(()),
        }
    };
    let outcome = tokio::select! {
        outcome = work => outcome,
        _ = interrupted() => Err(anyhow!("interrupted")),
        _ = tokio::time::sleep(Duration::from_secs(limit)) => Err(anyhow!("time limit of {limit} s reached")),
    };
    // The mode's future is gone: its processes are stopped. Report what was measured.
    if let Err(e) = &outcome {
        run.say(format!("stopped early: {e:#}"));
    }
    run.finish()?;
    outcome
}

fn scorecard_plan(options: &cli::ScorecardOptions) -> modes::ScorecardPlan {
    let secs = |secs: u64| Duration::from_secs(secs.max(1));
    modes::ScorecardPlan {
        rounds: options.rounds as usize,
        warmup: Duration::from_secs(options.warmup),
        length: secs(options.secs),
        fill_to: options.fill_to.max(1),
        minutes: options.minutes.max(1),
        snapshot_to: options.snapshot_to.max(1),
        snapshot_phase: secs(options.snapshot_phase_secs),
        partition_phase: secs(options.partition_phase_secs),
    }
}

fn floods_plan(options: &cli::FloodsOptions) -> modes::FloodsPlan {
    modes::FloodsPlan {
        floods: options.floods.clone(),
        quiet: Duration::from_secs(options.quiet_secs.max(1)),
        flood: Duration::from_secs(options.flood_secs.max(1)),
        settle: Duration::from_secs(options.settle_secs),
        good_inflight: options.good_inflight.max(1),
        flood_inflight: options.flood_inflight.max(1),
        large_inflight: options.large_inflight.max(1),
        correlation_bytes: options.correlation_bytes.clamp(1, 65_535),
        value_bytes: options.value_bytes.max(1),
        http_connections: options.http_connections.max(1),
    }
}

/// The targets to measure, in the order given, without repeats; etcd and nats are left out (and
/// noted) when their binaries are missing.
fn choose_targets(mode: &Mode) -> anyhow::Result<Vec<TargetKind>> {
    let common = mode.common().context("a benchmark mode")?;
    let mut targets = Vec::new();
    for target in common.targets.clone().unwrap_or_else(|| mode.default_targets()) {
        let installed = match target {
            TargetKind::Etcd | TargetKind::EtcdJson => common.etcd.is_file(),
            TargetKind::Nats => common.nats.is_file(),
            TargetKind::Echo | TargetKind::Cluster | TargetKind::ClusterOpen | TargetKind::ClusterTls => true,
        };
        if !targets.contains(&target) && installed {
            targets.push(target);
        }
    }
    if targets.is_empty() {
        bail!("no target to measure");
    }
    if matches!(mode, Mode::Scorecard { .. }) && !targets.contains(&TargetKind::Cluster) {
        bail!("scorecard mode judges the cluster: --targets must include cluster");
    }
    if matches!(mode, Mode::Partition { .. } | Mode::Snapshot { .. } | Mode::Floods { .. })
        && targets != [TargetKind::Cluster]
    {
        bail!("{} mode measures the cluster only (--targets cluster)", mode.name());
    }
    Ok(targets)
}

async fn interrupted() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut terminate) = signal(SignalKind::terminate()) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// `YYYYMMDDTHHMMSSZ` for seconds since the Unix epoch (UTC, proleptic Gregorian calendar).
fn utc_stamp(secs: u64) -> String {
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z", rest / 3600, rest % 3600 / 60, rest % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_stamps_are_calendar_dates() {
        assert_eq!(utc_stamp(0), "19700101T000000Z");
        assert_eq!(utc_stamp(1_700_000_000), "20231114T221320Z");
        assert_eq!(utc_stamp(951_782_400), "20000229T000000Z");
    }
}
