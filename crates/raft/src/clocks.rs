//! Peers' wall clocks, as seen on Raft RPC.
//!
//! Every Raft request and every answer carries its sender's wall clock ([`CLOCK_HEADER`], ms
//! since the epoch) and every request its sender's id ([`FROM_HEADER`]). Each node keeps, per
//! peer, the last clock it saw and the monotonic instant it saw it at, so the peer's clock
//! *now* is estimated as that reading plus the monotonic time since: a jump of this node's own
//! wall clock shows at once, a peer's at its next message (a heartbeat interval). The estimate
//! is off by the message's one-way delay, a few milliseconds on a healthy network.
//!
//! The node uses [`PeerClocks::agreement`] to decide whether its clock agrees with the others':
//! a node leads, and stands for election, only if its clock is within the bound of at least half
//! of the voters whose clocks it knows (itself included). With three voters up, a node whose
//! clock is off therefore never leads; with two up that disagree, nothing tells which clock is
//! right, and either may lead.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::types::NodeId;

/// The sender's wall clock, in ms since the epoch, on every Raft request and answer.
pub const CLOCK_HEADER: &str = "x-statestore-clock-ms";
/// The sender's node id, on every Raft request.
pub const FROM_HEADER: &str = "x-statestore-node";

/// How long a peer's clock reading is used: clocks drift by far less than the bound over it.
const REMEMBERED: Duration = Duration::from_secs(60);

/// This node's wall clock, in ms since the epoch.
pub fn wall_clock_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[derive(Debug, Clone, Copy)]
struct Reading {
    wall_clock_ms: u64,
    at: Instant,
}

/// The last clock reading of each peer. Cheap to clone; clones share the readings.
#[derive(Debug, Clone)]
pub struct PeerClocks {
    readings: Arc<Mutex<BTreeMap<NodeId, Reading>>>,
    /// The largest offset between two clocks that still agree; zero turns the check off.
    bound: Duration,
}

/// How this node's clock compares with the known clocks of a set of voters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agreement {
    /// Voters (this one included) whose clock is within the bound of this node's.
    pub agreeing: usize,
    /// Voters (this one included) whose clock this node knows.
    pub known: usize,
    /// The voter whose clock is furthest from this node's, and by how much (ms, positive when
    /// the peer's clock is ahead).
    pub furthest: Option<(NodeId, i64)>,
}

impl Agreement {
    /// At least half of the known clocks agree with this node's.
    pub fn holds(&self) -> bool {
        2 * self.agreeing >= self.known
    }
}

impl PeerClocks {
    /// Clocks within `bound` of each other agree; a zero bound makes every clock agree.
    pub fn new(bound: Duration) -> PeerClocks {
        PeerClocks { readings: Arc::default(), bound }
    }

    pub fn bound(&self) -> Duration {
        self.bound
    }

    /// Notes that `peer`'s clock read `wall_clock_ms` just now.
    pub fn observe(&self, peer: NodeId, wall_clock_ms: u64) {
        let reading = Reading { wall_clock_ms, at: Instant::now() };
        self.readings.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(peer, reading);
    }

    /// How far `peer`'s clock is ahead of this node's now (negative: behind), in ms; `None` when
    /// it was not seen within the last minute.
    pub fn offset_ms(&self, peer: NodeId) -> Option<i64> {
        self.offset_from_ms(peer, wall_clock_ms())
    }

    /// How far `peer`'s clock is ahead of `clock_ms`, a reading of this node's clock taken just
    /// now (negative: behind), in ms; `None` when it was not seen within the last minute.
    pub fn offset_from_ms(&self, peer: NodeId, clock_ms: u64) -> Option<i64> {
        let reading = *self.readings.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(&peer)?;
        let since = reading.at.elapsed();
        (since <= REMEMBERED).then(|| {
            let peer_now = reading.wall_clock_ms as i64 + since.as_millis() as i64;
            peer_now - clock_ms as i64
        })
    }

    /// Whether an offset is within the bound.
    pub fn agrees(&self, offset_ms: i64) -> bool {
        self.bound.is_zero() || offset_ms.unsigned_abs() <= self.bound.as_millis() as u64
    }

    /// How this node's clock (`me`) compares with the known clocks of `voters`.
    pub fn agreement(&self, me: NodeId, voters: impl IntoIterator<Item = NodeId>) -> Agreement {
        self.agreement_of(me, voters, wall_clock_ms())
    }

    /// How `clock_ms`, a reading of this node's (`me`) clock taken just now, compares with the
    /// known clocks of `voters`: what a node checks before it serves or proposes at that reading,
    /// so that a jump of its clock between the check and the reading cannot slip through.
    pub fn agreement_of(&self, me: NodeId, voters: impl IntoIterator<Item = NodeId>, clock_ms: u64) -> Agreement {
        let mut agreement = Agreement { agreeing: 1, known: 1, furthest: None };
        for peer in voters.into_iter().filter(|id| *id != me) {
            let Some(offset) = self.offset_from_ms(peer, clock_ms) else { continue };
            agreement.known += 1;
            if self.agrees(offset) {
                agreement.agreeing += 1;
            }
            if agreement.furthest.is_none_or(|(_, furthest)| offset.abs() > furthest.abs()) {
                agreement.furthest = Some((peer, offset));
            }
        }
        agreement
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_off_from_most_known_voters_does_not_agree() {
        let clocks = PeerClocks::new(Duration::from_secs(1));
        let now = wall_clock_ms();
        clocks.observe(2, now + 200);
        clocks.observe(3, now + 30_000);
        let agreement = clocks.agreement(1, [1, 2, 3]);
        assert_eq!((agreement.agreeing, agreement.known), (2, 3));
        assert!(agreement.holds());
        assert_eq!(agreement.furthest.map(|(id, _)| id), Some(3));
        assert!(clocks.offset_ms(3).is_some_and(|offset| (29_900..=30_100).contains(&offset)));
        // Seen from node 3's side: both others are 30 s behind.
        let skewed = PeerClocks::new(Duration::from_secs(1));
        skewed.observe(1, now - 30_000);
        skewed.observe(2, now - 29_800);
        assert!(!skewed.agreement(3, [1, 2, 3]).holds());
        // Two voters that disagree: a tie, nothing tells which clock is right.
        assert!(skewed.agreement(3, [1, 3]).holds());
        assert!(skewed.agreement(3, [3]).holds(), "unknown clocks do not count");
    }

    #[test]
    fn a_reading_is_judged_by_itself_not_by_the_clock_now() {
        let clocks = PeerClocks::new(Duration::from_secs(1));
        let now = wall_clock_ms();
        clocks.observe(2, now);
        clocks.observe(3, now + 100);
        assert!(clocks.agreement_of(1, [1, 2, 3], now).holds());
        assert!(!clocks.agreement_of(1, [1, 2, 3], now + 30_000).holds(), "a reading 30 s ahead");
        assert!(!clocks.agreement_of(1, [1, 2, 3], now - 30_000).holds(), "a reading 30 s behind");
        assert!(clocks.agreement(1, [1, 2, 3]).holds());
    }

    #[test]
    fn a_zero_bound_turns_the_check_off() {
        let clocks = PeerClocks::new(Duration::ZERO);
        clocks.observe(2, wall_clock_ms() + 3_600_000);
        assert!(clocks.agreement(1, [2]).agreeing == 2);
    }
}
