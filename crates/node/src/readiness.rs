//! A leader's `/ready` asks whether it still reaches a quorum, which takes a round of heartbeats.
//! `/ready` is an open route that probes and load balancers call often, and anyone may call it
//! at any rate: so every caller shares one confirmation. A caller that arrives while one is in
//! flight waits for it and takes its result; one that arrives within [`FRESH_FRACTION`] of a
//! lease after a successful round began takes that round's result without a new one. A
//! leader cut off from its peers therefore still answers not ready at once after its round fails,
//! and at most one round runs at a time whatever the callers' number and rate.

use std::time::Duration;

use prometheus::{IntCounter, Registry};
use statestore_raft::Raft;
use tokio::time::Instant;

use crate::pipeline::confirm_leadership_within;

/// A successful confirmation younger than the lease divided by this answers every caller (75 ms
/// with the default 300 ms lease): short next to the two leases a follower waits before it calls
/// a leader silent, so a leader that lost its quorum stops being ready about as soon as before.
pub const FRESH_FRACTION: u32 = 4;

/// The last confirmation a leader's `/ready` made, shared by every caller.
pub struct ReadinessCheck {
    raft: Raft,
    last: tokio::sync::Mutex<Option<Confirmation>>,
    rounds: IntCounter,
}

#[derive(Debug, Clone, Copy)]
struct Confirmation {
    started: Instant,
    finished: Instant,
    /// The term it was made in: a confirmation of an earlier term says nothing about this one.
    term: u64,
    confirmed: bool,
}

impl ReadinessCheck {
    pub fn new(raft: Raft, registry: &Registry) -> prometheus::Result<ReadinessCheck> {
        let rounds = IntCounter::new(
            "statestore_readiness_confirmations_total",
            "Quorum confirmations a leader's /ready started (callers at the same moment share one)",
        )?;
        registry.register(Box::new(rounds.clone()))?;
        Ok(ReadinessCheck { raft, last: tokio::sync::Mutex::new(None), rounds })
    }

    /// Whether this leader reaches a quorum (rounds tried again for up to `within`): the result
    /// of a round that ends after this call began, or of a successful one that began less than
    /// `lease / FRESH_FRACTION` ago in the same term.
    pub async fn leads_a_quorum(&self, within: Duration, lease: Duration) -> bool {
        let arrived = Instant::now();
        let term = self.raft.metrics().borrow().current_term;
        // Held across the round: callers arriving meanwhile queue here and then read its result.
        let mut last = self.last.lock().await;
        if let Some(previous) = last.filter(|previous| previous.term == term) {
            let fresh = previous.confirmed && previous.started.elapsed() < lease / FRESH_FRACTION;
            if previous.finished >= arrived || fresh {
                return previous.confirmed;
            }
        }
        self.rounds.inc();
        let started = Instant::now();
        let confirmed = confirm_leadership_within(&self.raft, within).await.is_ok();
        *last = Some(Confirmation { started, finished: Instant::now(), term, confirmed });
        confirmed
    }
}
