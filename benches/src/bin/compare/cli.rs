//! Command-line options.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::targets::TargetKind;

/// Side-by-side benchmark: the state store cluster against the broker alone (echo), etcd and
/// a NATS key-value bucket, on this machine, with the same load. Every process it starts is stopped when it ends.
#[derive(Debug, Parser)]
#[command(name = "compare")]
pub struct Cli {
    #[command(subcommand)]
    pub mode: Mode,
}

#[derive(Debug, Subcommand)]
pub enum Mode {
    /// Closed loop at several in-flight levels: ops/s, latency, CPU, requests per fsync.
    Sweep {
        #[command(flatten)]
        common: Common,
        /// In-flight levels (requests outstanding at once).
        #[arg(long, value_delimiter = ',', default_value = "1,16,64,256")]
        levels: Vec<usize>,
        /// Seconds measured per level.
        #[arg(long, default_value_t = 10)]
        secs: u64,
        /// Seconds of load before each level's measurement.
        #[arg(long, default_value_t = 2)]
        warmup: u64,
        /// Sweeps of every target, the targets' order rotated each round; ratios are reported per
        /// round and as medians across rounds (a machine whose speed drifts moves one round's
        /// ratios, less their median).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
        rounds: u64,
    },
    /// Open loop at a fixed rate: latency from the scheduled send time.
    Rate {
        #[command(flatten)]
        common: Common,
        /// Requests per second; default half the lowest quick 64-in-flight peak of the targets.
        #[arg(long)]
        rate: Option<f64>,
        #[arg(long, default_value_t = 10)]
        secs: u64,
        #[arg(long, default_value_t = 2)]
        warmup: u64,
    },
    /// Writes distinct keys up to --to, then reports memory and a follower's restart time.
    Fill {
        #[command(flatten)]
        common: Common,
        /// Distinct keys to write.
        #[arg(long, default_value_t = 1_000_000)]
        to: u64,
        #[arg(long, default_value_t = 64)]
        inflight: usize,
        /// Keys per recorded step; default 100,000 (a tenth of --to when that is smaller).
        #[arg(long)]
        step: Option<u64>,
        /// Fills of every target, each on new servers, the targets' order rotated each round;
        /// the last step's rate against the first is reported per round and as the median.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
        rounds: u64,
    },
    /// A long closed loop: ops/s every second, latency tail every minute, last vs first minute.
    Sustained {
        #[command(flatten)]
        common: Common,
        #[arg(long, default_value_t = 10)]
        minutes: u64,
        #[arg(long, default_value_t = 16)]
        inflight: usize,
    },
    /// Cuts a follower, then the leader, off from their peers under load (cluster only).
    Partition {
        #[command(flatten)]
        common: Common,
        /// Length of each of the five phases: steady, follower cut, healed, leader cut, healed.
        #[arg(long, default_value_t = 10)]
        phase_secs: u64,
        #[arg(long, default_value_t = 16)]
        inflight: usize,
    },
    /// Fills the store, then measures how much longer requests wait while every node builds a
    /// snapshot and a follower installs one (cluster only).
    Snapshot {
        #[command(flatten)]
        common: Common,
        /// Distinct keys written before the snapshots.
        #[arg(long, default_value_t = 1_000_000)]
        to: u64,
        /// Requests per second of the open loop during the snapshots.
        #[arg(long, default_value_t = 500.0)]
        rate: f64,
        /// Length of the quiet phases around the snapshots.
        #[arg(long, default_value_t = 20)]
        phase_secs: u64,
    },
    /// Every target of the project in one run: a sweep in rounds (echo, cluster, etcd), the open
    /// loop at half of peak, fills, a sustained run, snapshots and partitions of the cluster;
    /// then each target's figure beside its limit, met or missed (`scorecard.csv`).
    Scorecard {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        options: ScorecardOptions,
    },
    /// Hostile clients against the store's bounds, each flood on a fresh cluster, with a
    /// well-behaved client measured quiet and during the flood (cluster only).
    Floods {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        options: FloodsOptions,
    },
    /// Internal: the echo target's responders (started by the benchmark itself).
    #[command(hide = true)]
    EchoResponder {
        #[arg(long)]
        broker_port: u16,
        #[arg(long)]
        ready_file: PathBuf,
    },
}

/// The settings of the scorecard's steps.
#[derive(Debug, Args)]
pub struct ScorecardOptions {
    /// Rounds of the sweep and of the fill (medians across rounds are judged).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    pub rounds: u64,
    /// Seconds measured per in-flight level of the sweep, and of the open loop.
    #[arg(long, default_value_t = 10)]
    pub secs: u64,
    /// Seconds of load before each of those measurements.
    #[arg(long, default_value_t = 2)]
    pub warmup: u64,
    /// Distinct keys each fill writes.
    #[arg(long, default_value_t = 1_000_000)]
    pub fill_to: u64,
    /// Minutes of the sustained run (16 in flight).
    #[arg(long, default_value_t = 10)]
    pub minutes: u64,
    /// Distinct keys written before the snapshots are built and installed.
    #[arg(long, default_value_t = 1_000_000)]
    pub snapshot_to: u64,
    /// Length of the quiet phases around the snapshots.
    #[arg(long, default_value_t = 20)]
    pub snapshot_phase_secs: u64,
    /// Length of each of the partition run's five phases (16 in flight).
    #[arg(long, default_value_t = 10)]
    pub partition_phase_secs: u64,
}

/// The settings of the floods.
#[derive(Debug, Args)]
pub struct FloodsOptions {
    /// The floods to run, each on a fresh cluster.
    #[arg(long, value_delimiter = ',', default_value = "dedup,large-values,registrations,slow-http")]
    pub floods: Vec<crate::modes::Flood>,
    /// Seconds each flood lasts.
    #[arg(long, default_value_t = 25)]
    pub flood_secs: u64,
    /// Seconds the well-behaved client is measured alone before each flood.
    #[arg(long, default_value_t = 10)]
    pub quiet_secs: u64,
    /// Seconds of sampling after each flood (the slow connections' header timeout is 10 s).
    #[arg(long, default_value_t = 12)]
    pub settle_secs: u64,
    /// SET+GET pairs the well-behaved client has in flight.
    #[arg(long, default_value_t = 4)]
    pub good_inflight: usize,
    /// Requests in flight of the dedup and registration floods.
    #[arg(long, default_value_t = 64)]
    pub flood_inflight: usize,
    /// Requests in flight of the large-value flood.
    #[arg(long, default_value_t = 8)]
    pub large_inflight: usize,
    /// Bytes of correlation data of each dedup flood request (MQTT allows at most 65,535).
    #[arg(long, default_value_t = 60_000)]
    pub correlation_bytes: usize,
    /// Bytes of each value of the large-value flood.
    #[arg(long, default_value_t = 1 << 20)]
    pub value_bytes: usize,
    /// Slow connections to each follower's HTTP port (the node serves 1,024 at once).
    #[arg(long, default_value_t = 1200)]
    pub http_connections: usize,
}

/// Options of every mode.
#[derive(Debug, Args)]
pub struct Common {
    /// Targets to measure, one after another (default: echo,cluster,etcd,nats; fill, partition,
    /// snapshot and floods: cluster; cluster-open, the cluster without its secret, and
    /// cluster-tls, with TLS between the nodes too, when named; scorecard: echo,cluster,etcd,
    /// its fills, sustained run, snapshots and partitions on the cluster alone). etcd is driven
    /// over gRPC; etcd-json is etcd driven through its JSON gateway instead.
    #[arg(long, value_delimiter = ',')]
    pub targets: Option<Vec<TargetKind>>,
    /// Output directory (default benches/results/<UTC time>-<mode>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The `statestore` node binary (default: next to this binary).
    #[arg(long)]
    pub nodes_binary: Option<PathBuf>,
    #[arg(long, default_value = "/usr/sbin/mosquitto")]
    pub mosquitto: PathBuf,
    #[arg(long, default_value = "/usr/bin/etcd")]
    pub etcd: PathBuf,
    #[arg(long, default_value = "/usr/sbin/nats-server")]
    pub nats: PathBuf,
    /// Keys drawn from (uniformly at random).
    #[arg(long, default_value_t = 10_000)]
    pub keys: u64,
    /// Bytes per value.
    #[arg(long, default_value_t = 256)]
    pub value_size: usize,
    /// MQTT message expiry interval of each request, in seconds.
    #[arg(long, default_value_t = 10)]
    pub message_expiry: u32,
    /// Seconds without an answer after which a request counts as an error.
    #[arg(long, default_value_t = 10)]
    pub timeout: u64,
    /// Stop everything after this many seconds (default: twice the planned time plus 5 minutes).
    #[arg(long)]
    pub time_limit: Option<u64>,
}

impl Mode {
    pub fn name(&self) -> &'static str {
        match self {
            Mode::Sweep { .. } => "sweep",
            Mode::Rate { .. } => "rate",
            Mode::Fill { .. } => "fill",
            Mode::Sustained { .. } => "sustained",
            Mode::Partition { .. } => "partition",
            Mode::Snapshot { .. } => "snapshot",
            Mode::Scorecard { .. } => "scorecard",
            Mode::Floods { .. } => "floods",
            Mode::EchoResponder { .. } => "echo-responder",
        }
    }

    pub fn common(&self) -> Option<&Common> {
        match self {
            Mode::Sweep { common, .. }
            | Mode::Rate { common, .. }
            | Mode::Fill { common, .. }
            | Mode::Sustained { common, .. }
            | Mode::Partition { common, .. }
            | Mode::Snapshot { common, .. }
            | Mode::Scorecard { common, .. }
            | Mode::Floods { common, .. } => Some(common),
            Mode::EchoResponder { .. } => None,
        }
    }

    /// The targets measured when --targets is not given.
    pub fn default_targets(&self) -> Vec<TargetKind> {
        match self {
            Mode::Fill { .. } | Mode::Partition { .. } | Mode::Snapshot { .. } | Mode::Floods { .. } => {
                vec![TargetKind::Cluster]
            }
            Mode::Scorecard { .. } => vec![TargetKind::Echo, TargetKind::Cluster, TargetKind::Etcd],
            _ => TargetKind::ALL.to_vec(),
        }
    }

    /// Seconds the mode should take for `targets` targets, to derive the time limit.
    pub fn planned_secs(&self, targets: usize) -> u64 {
        const START: u64 = 60;
        let targets = targets.max(1) as u64;
        let timeout = self.common().map_or(10, |c| c.timeout);
        match self {
            // SET, GET and a local GET at every level, and the writes before the reads.
            Mode::Sweep { levels, secs, warmup, rounds, .. } => {
                rounds * targets * (2 * START + 3 * levels.len() as u64 * (warmup + secs + timeout))
            }
            Mode::Rate { secs, warmup, .. } => targets * (2 * START + 4 + 2 * timeout + warmup + secs),
            // At a pessimistic 200 writes per second, plus the restart.
            Mode::Fill { to, rounds, .. } => rounds * targets * (START + to / 200 + 300),
            Mode::Sustained { minutes, .. } => targets * (START + minutes * 60 + timeout),
            Mode::Partition { phase_secs, .. } => START + 5 * phase_secs + timeout,
            // The fill at a pessimistic 200 writes per second, four phases, three snapshots.
            Mode::Snapshot { to, phase_secs, .. } => START + to / 200 + 4 * phase_secs + 3 * 300 + timeout,
            Mode::Scorecard { options: o, .. } => {
                // The sweep over every target; the quick peaks and the open loop on two; the
                // rest on the cluster alone.
                o.rounds * targets * (START + 4 * (o.warmup + o.secs + timeout))
                    + 2 * (2 * START + 4 + 2 * timeout + o.warmup + o.secs)
                    + o.rounds * (START + o.fill_to / 200 + 300)
                    + (START + o.minutes * 60 + timeout)
                    + (START + o.snapshot_to / 200 + 4 * o.snapshot_phase_secs + 3 * 300 + timeout)
                    + (START + 5 * o.partition_phase_secs + timeout)
            }
            Mode::Floods { options: o, .. } => {
                o.floods.len() as u64 * (START + o.quiet_secs + o.flood_secs + o.settle_secs + 2 * timeout + 30)
            }
            Mode::EchoResponder { .. } => 0,
        }
    }
}
