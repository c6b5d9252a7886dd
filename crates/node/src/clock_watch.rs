//! Leadership follows the clocks.
//!
//! The state machine judges expiry and dedup retention by the clock the leader stamps on each
//! log entry, and that clock never goes back: a leader whose wall clock runs 30 s fast would
//! expire keys and dedup records 30 s early on every node, for good. So a node's clock is
//! compared with its peers' on every Raft message ([`statestore_raft::clocks`]), and:
//!
//! - A follower whose clock is more than `--max-clock-offset-ms` away from its leader's is not
//!   ready (`GET /ready`).
//! - A candidate whose clock disagrees with most voters' does not stand (the elector checks
//!   after its pre-vote), unless no leader has been known for a while (the elector's last
//!   resort): the voters left may be unable to elect one of themselves without it, when its log
//!   is the longest among them.
//! - A leader proposes nothing while its clock disagrees with most voters' ([`ClockCheck`] in
//!   the pipeline), and then hands leadership over: it stops its heartbeats, refuses new work,
//!   grants the others' pre-votes and asks a voter whose log holds its own to stand at once
//!   ([`Node::hand_over_to`]); that voter, or failing it one the others elect after their
//!   lease, leads, and it follows. A leader that does not yet know the clocks of a majority (it
//!   has just been elected) waits for one heartbeat round before its first proposal.

use std::sync::Arc;
use std::time::Duration;

use statestore_raft::{Handover, NodeId, PeerClocks, Raft, Restraint};

use crate::node::Node;

/// What [`ClockCheck::verdict`] says about this node's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClockVerdict {
    /// It agrees with at least half of a majority of voters whose clocks are known.
    Agrees,
    /// Too few voters' clocks are known yet to tell.
    Unknown,
    /// It disagrees with most voters' clocks; why, for logs and answers.
    Disagrees(String),
}

/// Compares this node's clock with the voters'. Cheap to clone.
#[derive(Clone)]
pub struct ClockCheck {
    pub id: NodeId,
    pub raft: Raft,
    pub clocks: PeerClocks,
}

impl ClockCheck {
    /// How this node's clock now compares with the voters'.
    pub fn verdict(&self) -> ClockVerdict {
        self.verdict_of(crate::node::now_ms())
    }

    /// How `clock_ms`, a reading of this node's clock taken just now (or a time it stamped on a
    /// log entry), compares with the voters' clocks.
    pub fn verdict_of(&self, clock_ms: u64) -> ClockVerdict {
        let voters: Vec<NodeId> = {
            let metrics = self.raft.metrics();
            let metrics = metrics.borrow();
            metrics.membership_config.membership().voter_ids().collect()
        };
        let agreement = self.clocks.agreement_of(self.id, voters.iter().copied(), clock_ms);
        if !agreement.holds() {
            let (peer, offset_ms) = agreement.furthest.unwrap_or_default();
            return ClockVerdict::Disagrees(format!(
                "node {}'s clock disagrees with {} of the {} voter clocks it knows (node {peer}'s is {}); the bound is {} ms (--max-clock-offset-ms)",
                self.id,
                agreement.known - agreement.agreeing,
                agreement.known,
                describe_offset(offset_ms),
                self.clocks.bound().as_millis()
            ));
        }
        if 2 * agreement.known <= voters.len() {
            return ClockVerdict::Unknown;
        }
        ClockVerdict::Agrees
    }

    /// Why this follower is not ready, if its clock is beyond the bound from its leader's.
    pub fn off_from_leader(&self) -> Option<String> {
        let leader = self.raft.metrics().borrow().current_leader?;
        if leader == self.id {
            return None;
        }
        let offset_ms = self.clocks.offset_ms(leader)?;
        (!self.clocks.agrees(offset_ms)).then(|| {
            format!(
                "the leader's clock (node {leader}) is {} this node's; the bound is {} ms (--max-clock-offset-ms)",
                describe_offset(offset_ms),
                self.clocks.bound().as_millis()
            )
        })
    }
}

/// "1200 ms ahead of" / "30000 ms behind".
fn describe_offset(offset_ms: i64) -> String {
    if offset_ms >= 0 {
        format!("{offset_ms} ms ahead of")
    } else {
        format!("{} ms behind", -offset_ms)
    }
}

/// Hands leadership over while this node leads with a clock that disagrees with most voters',
/// and keeps it from standing for election meanwhile but as a last resort
/// ([`Restraint::ClockOff`]): a leader so restrained grants the others' pre-votes, so that one
/// of them takes over even when the rest of a quorum cannot elect without its vote.
pub(crate) async fn follow_clocks(node: Arc<Node>, check: ClockCheck, every: Duration) {
    let elector = node.elector.clone();
    let disagrees = move || {
        let why = match check.verdict() {
            ClockVerdict::Disagrees(why) => Some(why),
            ClockVerdict::Agrees | ClockVerdict::Unknown => None,
        };
        elector.restrain(Restraint::ClockOff, why.is_some());
        why
    };
    node.hand_over_while(
        every,
        "this node's clock disagrees with the others'",
        "this node's clock agrees with the others' again",
        Handover::Settled,
        disagrees,
    )
    .await;
}
