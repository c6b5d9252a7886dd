//! The node's Prometheus metrics. Raft's state is copied into gauges whenever openraft reports a
//! change; storage metrics are observed where the work happens (see `statestore_raft::metrics`).

use std::sync::Arc;
use std::time::Duration;

use openraft::ServerState;
use prometheus::{
    exponential_buckets, Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

use statestore_raft::StateReader;

use crate::node::{ExecuteError, Node};

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    term: IntGauge,
    is_leader: IntGauge,
    has_leader: IntGauge,
    leader_changes: IntCounter,
    last_log_index: IntGauge,
    committed_index: IntGauge,
    applied_index: IntGauge,
    snapshot_index: IntGauge,
    purged_index: IntGauge,
    voters: IntGauge,
    learners: IntGauge,
    unflushed_entries: IntGauge,
    unflushed_operations: IntGauge,
    proposals: IntCounterVec,
    proposal_seconds: Histogram,
    batch_entries: Histogram,
    batch_bytes: Histogram,
    appends_served: IntCounterVec,
    dedup_records: IntGauge,
    dedup_bytes: IntGauge,
}

fn gauge(registry: &Registry, name: &str, help: &str) -> prometheus::Result<IntGauge> {
    let gauge = IntGauge::new(name, help)?;
    registry.register(Box::new(gauge.clone()))?;
    Ok(gauge)
}

impl Metrics {
    pub fn new() -> prometheus::Result<Metrics> {
        let registry = Registry::new();
        let leader_changes =
            IntCounter::new("statestore_raft_leader_changes_seen_total", "Leader changes this node has seen")?;
        registry.register(Box::new(leader_changes.clone()))?;
        let proposals = IntCounterVec::new(
            Opts::new("statestore_proposals_total", "Entries proposed on this node, by outcome"),
            &["outcome"],
        )?;
        registry.register(Box::new(proposals.clone()))?;
        let proposal_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "statestore_proposal_duration_seconds",
                "From proposing an entry to its apply result on the leader",
            )
            .buckets(exponential_buckets(0.0001, 2.0, 18)?),
        )?;
        registry.register(Box::new(proposal_seconds.clone()))?;
        let batch_entries = Histogram::with_opts(
            HistogramOpts::new("statestore_proposal_batch_entries", "Entries in one proposed log entry")
                .buckets(exponential_buckets(1.0, 2.0, 12)?),
        )?;
        registry.register(Box::new(batch_entries.clone()))?;
        let batch_bytes = Histogram::with_opts(
            HistogramOpts::new("statestore_proposal_batch_bytes", "Approximate bytes in one proposed log entry")
                .buckets(exponential_buckets(256.0, 4.0, 10)?),
        )?;
        registry.register(Box::new(batch_bytes.clone()))?;
        let appends_served = IntCounterVec::new(
            Opts::new(
                "statestore_raft_appends_served_total",
                "Appends from a leader this node has answered, by transport: stream (one connection per leader) or request (one HTTP request each)",
            ),
            &["transport"],
        )?;
        registry.register(Box::new(appends_served.clone()))?;
        Ok(Metrics {
            term: gauge(&registry, "statestore_raft_term", "The current Raft term")?,
            is_leader: gauge(&registry, "statestore_raft_is_leader", "1 if this node is the leader")?,
            has_leader: gauge(&registry, "statestore_raft_has_leader", "1 if this node knows a leader")?,
            leader_changes,
            last_log_index: gauge(&registry, "statestore_raft_last_log_index", "Index of the last log entry")?,
            committed_index: gauge(
                &registry,
                "statestore_raft_committed_index",
                "Index of the last entry known to be committed",
            )?,
            applied_index: gauge(&registry, "statestore_raft_applied_index", "Index of the last applied entry")?,
            snapshot_index: gauge(&registry, "statestore_raft_snapshot_index", "Last index in the latest snapshot")?,
            purged_index: gauge(&registry, "statestore_raft_purged_index", "Last index purged from the log")?,
            voters: gauge(&registry, "statestore_raft_voters", "Voters in the membership this node knows")?,
            learners: gauge(&registry, "statestore_raft_learners", "Learners in the membership this node knows")?,
            unflushed_entries: gauge(
                &registry,
                "statestore_state_unflushed_entries",
                "Log entries applied and not yet in the tables on disk: applied again after a crash",
            )?,
            unflushed_operations: gauge(
                &registry,
                "statestore_state_unflushed_operations",
                "Operations applied and not yet in the tables on disk: applied again after a crash",
            )?,
            dedup_records: gauge(
                &registry,
                "statestore_dedup_records",
                "Dedup records the applied state holds until their retention ends",
            )?,
            dedup_bytes: gauge(
                &registry,
                "statestore_dedup_bytes",
                "Bytes of those records as their budget counts them (writes are refused with the quota error at 268435456)",
            )?,
            proposals,
            proposal_seconds,
            batch_entries,
            batch_bytes,
            appends_served,
            registry,
        })
    }

    /// Follows the node's Raft metrics until Raft stops.
    pub fn watch(&self, node: Arc<Node>) {
        let metrics = self.clone();
        let mut changes = node.raft.metrics();
        tokio::spawn(async move {
            let mut leader = None;
            loop {
                // Copy out and release the borrow before the next await.
                let current = changes.borrow_and_update().clone();
                if current.current_leader != leader {
                    leader = current.current_leader;
                    if leader.is_some() {
                        metrics.leader_changes.inc();
                    }
                }
                metrics.term.set(current.current_term as i64);
                metrics.is_leader.set(i64::from(current.state == ServerState::Leader));
                metrics.has_leader.set(i64::from(current.current_leader.is_some()));
                metrics.last_log_index.set(current.last_log_index.unwrap_or(0) as i64);
                metrics.applied_index.set(current.last_applied.map_or(0, |id| id.index) as i64);
                metrics.snapshot_index.set(current.snapshot.map_or(0, |id| id.index) as i64);
                metrics.purged_index.set(current.purged.map_or(0, |id| id.index) as i64);
                let membership = current.membership_config.membership();
                metrics.voters.set(membership.voter_ids().count() as i64);
                metrics.learners.set(membership.learner_ids().count() as i64);
                metrics.committed_index.set(node.reader.committed_index() as i64);
                if changes.changed().await.is_err() {
                    break;
                }
            }
        });
    }

    pub fn observe_proposal<T>(&self, outcome: &Result<T, ExecuteError>, took: Duration) {
        let label = match outcome {
            Ok(_) => "committed",
            Err(ExecuteError::ForwardToLeader { .. }) => "not_leader",
            Err(ExecuteError::Unavailable(_)) => "unavailable",
            Err(ExecuteError::Storage(_)) => "storage_error",
        };
        self.proposals.with_label_values(&[label]).inc();
        if outcome.is_ok() {
            self.proposal_seconds.observe(took.as_secs_f64());
        }
    }

    pub fn observe_batch(&self, entries: usize, bytes: usize) {
        self.batch_entries.observe(entries as f64);
        self.batch_bytes.observe(bytes as f64);
    }

    /// Counts an append answered, `streamed` or sent as a request.
    pub fn observe_append_served(&self, streamed: bool) {
        self.appends_served.with_label_values(&[if streamed { "stream" } else { "request" }]).inc();
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self, reader: &StateReader) -> String {
        self.committed_index.set(reader.committed_index() as i64);
        let unflushed = reader.unflushed();
        self.unflushed_entries.set(unflushed.entries as i64);
        self.unflushed_operations.set(unflushed.operations as i64);
        if let Ok(usage) = reader.dedup_usage() {
            self.dedup_records.set(usage.records as i64);
            self.dedup_bytes.set(usage.bytes as i64);
        }
        let mut text = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut text).expect("text encoding does not fail");
        String::from_utf8(text).expect("the text format is UTF-8")
    }
}
