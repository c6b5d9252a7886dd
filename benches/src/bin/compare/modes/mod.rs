//! The modes of the comparison, and what they share: the run (targets, output directory, the
//! summary printed at the end) and the measurement of one window of load on one target.

mod fill;
mod floods;
mod partition;
mod rate;
mod scorecard;
mod snapshot;
mod sustained;
mod sweep;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use fill::{fill, FillFigures, Plan as FillPlan};
pub use floods::{floods, Flood, Plan as FloodsPlan};
pub use partition::{partition, PartitionFigures};
pub use rate::{rate, RateFigures};
pub use scorecard::{scorecard, Plan as ScorecardPlan};
pub use snapshot::{snapshot, SnapshotFigures};
pub use sustained::{sustained, SustainedFigures};
pub use sweep::{sweep, SweepFigures};

use crate::load::LoadHandle;
use crate::processes::CpuSample;
use crate::report::{self, Progress};
use crate::stats::{Percentiles, Recorder, Recording};
use crate::targets::{Setup, Target, TargetKind};

/// One invocation of the benchmark.
pub struct Run {
    pub setup: Setup,
    pub out: PathBuf,
    pub targets: Vec<TargetKind>,
    pub keys: u64,
    pub value_size: usize,
    pub progress: Progress,
    /// The report, printed and saved as `summary.txt` at the end.
    summary: String,
}

impl Run {
    pub fn new(setup: Setup, out: PathBuf, targets: Vec<TargetKind>, keys: u64, value_size: usize) -> Run {
        Run { setup, out, targets, keys, value_size, progress: Progress::new(), summary: String::new() }
    }

    /// Adds text to the summary.
    pub fn say(&mut self, text: impl AsRef<str>) {
        self.summary.push_str(text.as_ref());
        if !self.summary.ends_with('\n') {
            self.summary.push('\n');
        }
    }

    /// A target that could not be measured: noted in the summary, and the run goes on.
    fn failed(&mut self, kind: TargetKind, error: anyhow::Error) {
        let text = format!("{kind}: FAILED: {error:#}");
        self.progress.line(&text);
        self.say(text);
    }

    /// Prints the summary and saves it in the output directory.
    pub fn finish(&self) -> anyhow::Result<()> {
        println!("\n{}", self.summary.trim_end());
        println!("\nresults in {}", self.out.display());
        std::fs::write(self.out.join("summary.txt"), &self.summary)?;
        Ok(())
    }
}

/// The targets in the order round `round` (from 1) measures them: rotated by one each round, so
/// that no target always runs first, or always last, on a machine whose speed drifts.
pub(crate) fn round_order(targets: &[TargetKind], round: usize) -> Vec<TargetKind> {
    let mut order = targets.to_vec();
    if !order.is_empty() {
        let by = (round - 1) % order.len();
        order.rotate_left(by);
    }
    order
}

/// The median of `values` (the mean of the middle two for an even count); `None` when empty.
pub(crate) fn median(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut values: Vec<f64> = values.into_iter().filter(|v| v.is_finite()).collect();
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    match values.len() {
        0 => None,
        n if n % 2 == 1 => Some(values[middle]),
        _ => Some((values[middle - 1] + values[middle]) / 2.0),
    }
}

/// What one window of load on one target measured.
pub struct Measured {
    /// Answered requests per second.
    pub ops: f64,
    pub latency: Percentiles,
    pub errors: u64,
    pub error_samples: Vec<String>,
    /// CPU seconds per second of each process of the target (the load generator is "bench").
    pub cpu: Vec<(String, f64)>,
    /// CPU seconds per second used by other processes on the machine meanwhile (noise).
    pub cpu_others: f64,
    /// Requests the leader answered per WAL fsync (cluster only).
    pub requests_per_fsync: Option<f64>,
    /// Elections (Raft terms begun) during the window (cluster only): a healthy cluster under
    /// load has none.
    pub elections: Option<u64>,
    /// The CPU of each minute of the window, in the recording's minutes.
    pub minutes_cpu: Vec<MinuteCpu>,
    pub recording: Recording,
}

/// CPU in one minute of a window (the last may be shorter), in CPU-seconds per second.
#[derive(Debug, Clone, Copy)]
pub struct MinuteCpu {
    /// The target's servers (nodes, etcd members or echo responders).
    pub servers: f64,
    /// Taken by the hypervisor for other guests: the measured processes' share of a slower
    /// machine, which no process here accounts for.
    pub stolen: f64,
    /// Other processes on the machine.
    pub others: f64,
}

impl Measured {
    /// CPU of the load generator, of the broker (NaN for etcd, which has none), of the servers
    /// (nodes, etcd members or echo responders) and in total.
    pub fn cpu_split(&self) -> (f64, f64, f64, f64) {
        let of = |name: &str| self.cpu.iter().find(|(n, _)| n == name).map_or(f64::NAN, |(_, c)| *c);
        let total: f64 = self.cpu.iter().map(|(_, c)| c).sum();
        (of("bench"), of("broker"), crate::processes::servers_cpu(&self.cpu), total)
    }

    /// `name=cpu;...` for the CSV.
    pub fn cpu_detail(&self) -> String {
        self.cpu.iter().map(|(name, cpu)| format!("{name}={cpu:.3}")).collect::<Vec<_>>().join(";")
    }

    /// The summary's notes on this measurement: its errors, and the elections the cluster held.
    pub fn notes(&self, label: &str) -> Vec<String> {
        error_note(label, self.errors, &self.error_samples)
            .into_iter()
            .chain(election_note(label, self.elections))
            .collect()
    }

    /// One line for the progress log.
    pub fn brief(&self) -> String {
        format!(
            "{} ops/s, p50 {} ms, p99 {} ms, p99.9 {} ms, {} errors, CPU {:.2} (other processes {:.2}){}",
            report::ops(self.ops),
            report::decimal(self.latency.p50),
            report::decimal(self.latency.p99),
            report::decimal(self.latency.p999),
            self.errors,
            self.cpu_split().3,
            self.cpu_others,
            match self.elections {
                Some(n) if n > 0 => format!(", {n} elections"),
                _ => String::new(),
            }
        )
    }
}

/// Watches a running load through the recorder's window (warm-up first), printing progress
/// every second, then stops the load. CPU and, on the cluster, the leader's request and fsync
/// counters are read at both ends of the window.
async fn measure_window(
    target: &mut Target,
    load: LoadHandle,
    recorder: &Recorder,
    length: Duration,
    label: &str,
    progress: &mut Progress,
) -> anyhow::Result<Measured> {
    let start = recorder.from();
    while Instant::now() < start {
        progress.update(&format!("{label}: warming up"));
        tokio::time::sleep(start.saturating_duration_since(Instant::now()).min(Duration::from_secs(1))).await;
        target.check_running()?;
    }
    let processes = target.processes();
    let cpu_before = CpuSample::take(&processes);
    let leader = match &target.cluster {
        Some(cluster) => cluster.leader().await,
        None => None,
    };
    let counters_before = leader_counters(target, leader).await;
    let term_before = highest_term(target).await;
    let end = start + length;
    let mut last = (Instant::now(), 0);
    // A sample at every whole minute of the window, so each minute's CPU can be set beside its
    // answers (the recording's minutes count from `start` too).
    let mut samples = vec![cpu_before.clone()];
    while Instant::now() < end {
        let next_minute = start + Duration::from_secs(60 * samples.len() as u64);
        let wake = end.min(next_minute).saturating_duration_since(Instant::now()).min(Duration::from_secs(1));
        tokio::time::sleep(wake).await;
        if Instant::now() >= next_minute && next_minute < end {
            samples.push(CpuSample::take(&processes));
        }
        target.check_running()?;
        let (answered, errors) = recorder.counts();
        let now = Instant::now();
        let recent = (answered - last.1) as f64 / now.duration_since(last.0).as_secs_f64().max(1e-3);
        last = (now, answered);
        progress.update(&format!(
            "{label}: {:.0}/{} s, {} ops/s, {errors} errors",
            now.duration_since(start).as_secs_f64(),
            length.as_secs(),
            report::ops(recent)
        ));
    }
    let cpu_after = CpuSample::take(&processes);
    let (cpu, cpu_others) = (cpu_before.usage_until(&cpu_after), cpu_before.others_until(&cpu_after));
    samples.push(cpu_after);
    let minutes_cpu = samples
        .windows(2)
        .map(|pair| MinuteCpu {
            servers: crate::processes::servers_cpu(&pair[0].usage_until(&pair[1])),
            stolen: pair[0].stolen_until(&pair[1]),
            others: pair[0].others_until(&pair[1]),
        })
        .collect();
    let counters_after = leader_counters(target, leader).await;
    let term_after = highest_term(target).await;
    load.finish().await;
    let recording = recorder.snapshot();
    let requests_per_fsync = match (counters_before, counters_after) {
        ((Some(r0), Some(f0)), (Some(r1), Some(f1))) if f1 > f0 => Some((r1 - r0) / (f1 - f0)),
        _ => None,
    };
    Ok(Measured {
        ops: recording.answered as f64 / length.as_secs_f64(),
        latency: Percentiles::from(&recording.latencies),
        errors: recording.errors,
        error_samples: recording.error_samples.clone(),
        cpu,
        cpu_others,
        requests_per_fsync,
        elections: term_after.zip(term_before).map(|(after, before)| after.saturating_sub(before)),
        minutes_cpu,
        recording,
    })
}

async fn leader_counters(target: &Target, leader: Option<usize>) -> (Option<f64>, Option<f64>) {
    match (&target.cluster, leader) {
        (Some(cluster), Some(index)) => cluster.leader_counters(index).await,
        _ => (None, None),
    }
}

/// The highest Raft term of the cluster's nodes; `None` for other targets.
async fn highest_term(target: &Target) -> Option<u64> {
    target.cluster.as_ref()?.highest_term().await
}

/// A note for the summary when the cluster held elections during a measurement: each one is a
/// leader lost or unseated under the load, and its gap is in the latencies.
fn election_note(label: &str, elections: Option<u64>) -> Option<String> {
    elections.filter(|n| *n > 0).map(|n| {
        format!("{label}: the cluster held {n} election(s) during the measurement; its leader changed under load")
    })
}

/// The first few error descriptions of a measurement, for the summary.
fn error_note(label: &str, errors: u64, samples: &[String]) -> Option<String> {
    (errors > 0).then(|| {
        let mut note = format!("{label}: {errors} errors, first ones:");
        for sample in samples {
            note.push_str(&format!("\n    {sample}"));
        }
        note
    })
}

/// A closed loop of `inflight` slots on `target`, measured for `length` after `warmup`.
async fn measure_closed(
    run: &mut Run,
    target: &mut Target,
    workload: &Arc<crate::load::Workload>,
    inflight: usize,
    warmup: Duration,
    length: Duration,
) -> anyhow::Result<Measured> {
    let recorder = Arc::new(Recorder::new(Instant::now() + warmup, length, false));
    let load = crate::load::start_closed(target.client.clone(), workload.clone(), inflight, recorder.clone());
    let label = match workload.op() {
        crate::load::Op::Set => format!("{} {inflight} in flight", target.kind),
        op => format!("{} {} {inflight} in flight", target.kind, op.name()),
    };
    let measured = measure_window(target, load, &recorder, length, &label, &mut run.progress).await?;
    run.progress.line(&format!("{label}: {}", measured.brief()));
    Ok(measured)
}
