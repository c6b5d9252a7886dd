//! Whether each peer answers this node's Raft requests, logged when that changes: one warning
//! once every request to a peer has failed for [`DOWN_AFTER`], a reminder every
//! [`REMIND_EVERY`] while that lasts, and one line when the peer answers again.
//!
//! openraft logs each failed request itself, and while a peer is down its replication retries
//! every heartbeat interval; the node keeps only the first of those repeats in a while (its
//! logging setup), so these lines are what tells an operator which peer is down and for how long.
//!
//! It also counts, per peer, the requests that failed and the appends streams opened
//! ([`PeerHealth::register`] exports both): a stream is opened again only after one failed, so
//! streams opened well beyond failures mean connections were dropped for another reason.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus::{IntCounterVec, Opts, Registry};

use crate::types::NodeId;

/// How long every request to a peer must fail before it is reported: a request or two lost on a
/// busy machine is not worth a line.
pub const DOWN_AFTER: Duration = Duration::from_secs(1);

/// How often a peer that stays down is reported again.
pub const REMIND_EVERY: Duration = Duration::from_secs(60);

/// The peers whose requests fail, shared by every client of this node's network. Cheap to clone.
#[derive(Clone)]
pub struct PeerHealth {
    failing: Arc<Mutex<BTreeMap<NodeId, Failing>>>,
    /// Requests to each peer that failed (`statestore_raft_peer_request_failures_total`).
    failures: IntCounterVec,
    /// Appends streams opened to each peer (`statestore_raft_append_streams_opened_total`).
    streams_opened: IntCounterVec,
}

impl Default for PeerHealth {
    fn default() -> Self {
        let counter = |name: &str, help: &str| {
            IntCounterVec::new(Opts::new(name, help), &["peer"]).expect("a counter with a valid name and label")
        };
        PeerHealth {
            failing: Arc::default(),
            failures: counter(
                "statestore_raft_peer_request_failures_total",
                "Raft requests to a peer that got no connection, no answer in time, or no valid answer",
            ),
            streams_opened: counter(
                "statestore_raft_append_streams_opened_total",
                "Appends streams this node opened to a peer while leading (one is opened again after one fails)",
            ),
        }
    }
}

/// A peer whose requests have failed since `since`, none answered since.
struct Failing {
    since: Instant,
    failures: u64,
    /// When it was last reported down; `None` before [`DOWN_AFTER`] passed.
    reported_at: Option<Instant>,
}

impl PeerHealth {
    /// `peer` (reached at `address`) answered a request, even with a refusal.
    pub fn answered(&self, peer: NodeId, address: &str) {
        let failing = {
            let mut failing = self.failing.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if failing.is_empty() {
                return;
            }
            failing.remove(&peer)
        };
        if let Some(Failing { since, failures, reported_at: Some(_) }) = failing {
            let down = since.elapsed();
            tracing::info!(
                peer,
                %address,
                down_ms = down.as_millis() as u64,
                failures,
                "node {peer} answers again, after {:.1} s and {failures} failed requests",
                down.as_secs_f64()
            );
        }
    }

    /// A request to `peer` (reached at `address`) failed with `error`: no connection, no answer
    /// in time, or an answer that is not one.
    pub fn failed(&self, peer: NodeId, address: &str, error: &dyn Display) {
        self.failed_at(peer, address, error, Instant::now())
    }

    fn failed_at(&self, peer: NodeId, address: &str, error: &dyn Display, now: Instant) {
        self.failures.with_label_values(&[&peer.to_string()]).inc();
        let mut failing = self.failing.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let peer_failing = failing.entry(peer).or_insert(Failing { since: now, failures: 0, reported_at: None });
        peer_failing.failures += 1;
        let due = match peer_failing.reported_at {
            None => now.duration_since(peer_failing.since) >= DOWN_AFTER,
            Some(at) => now.duration_since(at) >= REMIND_EVERY,
        };
        if !due {
            return;
        }
        peer_failing.reported_at = Some(now);
        let down = now.duration_since(peer_failing.since);
        let failures = peer_failing.failures;
        drop(failing);
        tracing::warn!(
            peer,
            %address,
            down_ms = down.as_millis() as u64,
            failures,
            %error,
            "node {peer} has not answered for {:.1} s ({failures} requests failed); trying on",
            down.as_secs_f64()
        );
    }

    /// An appends stream to `peer` was opened.
    pub fn stream_opened(&self, peer: NodeId) {
        self.streams_opened.with_label_values(&[&peer.to_string()]).inc();
    }

    /// Exports the counts of failed requests and opened streams per peer in `registry`.
    pub fn register(&self, registry: &Registry) -> prometheus::Result<()> {
        registry.register(Box::new(self.failures.clone()))?;
        registry.register(Box::new(self.streams_opened.clone()))
    }

    /// The peers reported down (every request failed for at least [`DOWN_AFTER`], none answered
    /// since), each with how long that has lasted.
    pub fn failing(&self) -> BTreeMap<NodeId, Duration> {
        let failing = self.failing.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        failing.iter().filter(|(_, f)| f.reported_at.is_some()).map(|(peer, f)| (*peer, f.since.elapsed())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_down_once_its_requests_failed_for_a_while_and_until_it_answers() {
        let health = PeerHealth::default();
        let start = Instant::now();
        let failing = |health: &PeerHealth| health.failing().keys().copied().collect::<Vec<_>>();
        health.failed_at(2, "http://b", &"connection refused", start);
        health.failed_at(3, "http://c", &"no answer", start);
        assert_eq!(failing(&health), Vec::<NodeId>::new(), "one failed request is not a peer down");
        health.failed_at(2, "http://b", &"connection refused", start + DOWN_AFTER);
        health.failed_at(3, "http://c", &"no answer", start + DOWN_AFTER / 2);
        assert_eq!(failing(&health), vec![2]);
        health.answered(3, "http://c");
        health.failed_at(3, "http://c", &"no answer", start + DOWN_AFTER * 2);
        assert_eq!(failing(&health), vec![2], "an answer starts the count again");
        health.answered(2, "http://b");
        assert_eq!(failing(&health), Vec::<NodeId>::new());
    }
}
