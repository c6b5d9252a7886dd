//! A follower's copies of the requests the leader is executing. Every node receives every
//! request; a follower keeps each write unacknowledged (so the broker would redeliver it after a
//! crash) until it sees it applied, then acknowledges it and keeps it a little longer: the leader
//! may have died between applying it and answering. A follower that becomes leader executes
//! everything it holds: the dedup table answers the requests that were applied (a client may see
//! an answer twice), the others run now.
//!
//! Settling does work in proportion to what changed, never to what is held: applied requests
//! are named by the apply feed and found by identity; old entries leave from the front of the
//! arrival queue; only requests still unsettled after [`LOOKUP_AFTER`] are looked up in the
//! dedup table (a feed that lagged, a snapshot install), at most [`LOOKUPS_PER_SETTLE`] a time.
//! A request is held once: the queue holds it by arrival, the index only its place, hashed from
//! the request's own response topic and correlation data.

use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};
use std::time::{Duration, Instant};

use hashbrown::HashTable;
use rumqttc::v5::mqttbytes::v5::Publish;
use statestore_statemachine::RequestIdentity;

use super::envelope::Inbound;

/// A shadowed request, and what acknowledges it to the broker once it is settled.
#[derive(Debug, Clone)]
pub struct Shadowed {
    pub inbound: Inbound,
    /// The request's [`receipt`](super::connection::receipt): its packet id, QoS and dup flag.
    pub receipt: Publish,
    pub received: Instant,
    /// Acknowledged to the broker already (a read, or a write seen applied).
    pub acked: bool,
    /// When this node saw the write applied.
    pub applied_at: Option<Instant>,
}

/// A write not seen applied for this long is looked up in the dedup table.
pub const LOOKUP_AFTER: Duration = Duration::from_secs(1);
/// Most dedup lookups one settle makes.
pub const LOOKUPS_PER_SETTLE: usize = 256;
/// A new leader answers again the writes it saw applied within this long before it last heard
/// from the old leader, or after: the old leader answers as it applies, so only what it applied
/// in its last moments may be unanswered, and the entries it left uncommitted are applied only
/// once the new leader commits them, an election later. (Measured from the last write seen
/// applied instead, those late applies pushed out the old leader's last ones: a write it applied
/// and answered just before it was killed, its answer never sent, was not answered again.)
pub const REANSWER_WINDOW: Duration = Duration::from_millis(500);
/// A new leader answers again the reads received within this long: more than an election
/// takes, so every read received after the old leader was lost is among them.
pub const READ_REANSWER_WINDOW: Duration = Duration::from_secs(2);
/// Without a message expiry, an unapplied write is kept at most this long.
const UNBOUNDED_KEEP: Duration = Duration::from_secs(60);

/// Shadowed requests in arrival order, at most `capacity` of them and `max_bytes` of them
/// ([`Inbound::held_bytes`]).
pub struct Shadow {
    capacity: usize,
    max_bytes: usize,
    /// What the held requests cost.
    bytes: usize,
    /// The arrival number of `queue[0]`.
    first: u64,
    /// Requests by arrival number (minus `first`); `None`: replaced by a redelivery.
    queue: VecDeque<Option<Shadowed>>,
    /// Arrival numbers of writes not yet seen applied, in order (settled ones are skipped).
    unsettled: VecDeque<u64>,
    /// The arrival number of every held request, hashed by its identity with `hasher`.
    index: HashTable<u64>,
    /// Randomly keyed: identities are chosen by clients.
    hasher: RandomState,
}

impl Shadow {
    pub fn new(capacity: usize, max_bytes: usize) -> Shadow {
        Shadow {
            capacity,
            max_bytes,
            bytes: 0,
            first: 0,
            queue: VecDeque::new(),
            unsettled: VecDeque::new(),
            index: HashTable::new(),
            hasher: RandomState::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// What the held requests cost, as [`Inbound::held_bytes`] counts it.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Keeps `request`; a redelivery replaces the earlier copy. Returns what no longer fits
    /// (oldest first), and the earlier copy of a redelivered request: acknowledge those.
    pub fn insert(&mut self, request: Shadowed) -> Vec<Shadowed> {
        let Some(identity) = request.inbound.identity_parts() else { return vec![request] };
        let hash = self.hasher.hash_one(identity);
        let seq = self.first + self.queue.len() as u64;
        let mut out = Vec::new();
        let (first, queue) = (self.first, &mut self.queue);
        match self.index.find_mut(hash, |&held| held_identity(queue, first, held) == Some(identity)) {
            Some(held) => {
                if let Some(earlier) = queue.get_mut((*held - first) as usize).and_then(Option::take) {
                    self.bytes -= earlier.inbound.held_bytes;
                    out.push(earlier);
                }
                *held = seq;
            }
            None => {
                let hasher = &self.hasher;
                self.index.insert_unique(hash, seq, |&held| {
                    hasher.hash_one(held_identity(queue, first, held).expect("indexed requests are held"))
                });
            }
        }
        if !request.acked {
            self.unsettled.push_back(seq);
        }
        self.bytes += request.inbound.held_bytes;
        self.queue.push_back(Some(request));
        while self.index.len() > self.capacity || self.bytes > self.max_bytes {
            if let Some(oldest) = self.pop_oldest() {
                out.push(oldest);
            }
        }
        self.compact();
        out
    }

    /// Marks the writes in `applied` (from the apply feed) as acknowledged and returns copies
    /// of them to acknowledge; looks up writes unsettled for [`LOOKUP_AFTER`] with `lookup`;
    /// forgets, from the oldest on, what expired or was kept long enough: a new leader would
    /// not answer it again, having last heard from the old one at `leader_heard`.
    pub fn settle<'a>(
        &mut self,
        now: Instant,
        leader_heard: Option<Instant>,
        applied: impl IntoIterator<Item = &'a RequestIdentity>,
        mut lookup: impl FnMut(&RequestIdentity) -> bool,
    ) -> Settled {
        let mut settled = Settled::default();
        for identity in applied {
            let Some(seq) = self.find(identity) else { continue };
            if let Some(shadowed) = self.get_mut(seq) {
                if !shadowed.acked {
                    shadowed.acked = true;
                    shadowed.applied_at = Some(now);
                    settled.applied.push(shadowed.receipt.clone());
                }
            }
        }
        // Settled slots leave the front for good, so this is work per request, not per tick.
        let mut lookups = 0;
        let mut still_unsettled = Vec::new();
        while lookups < LOOKUPS_PER_SETTLE {
            let Some(seq) = self.unsettled.pop_front() else { break };
            let Some(shadowed) = self.get_mut(seq) else { continue };
            if shadowed.acked {
                continue;
            }
            if now.duration_since(shadowed.received) < LOOKUP_AFTER {
                self.unsettled.push_front(seq);
                break;
            }
            lookups += 1;
            let identity = shadowed.inbound.identity().expect("only requests with an identity are held");
            if lookup(&identity) {
                shadowed.acked = true;
                shadowed.applied_at = Some(now);
                settled.applied.push(shadowed.receipt.clone());
            } else {
                still_unsettled.push(seq);
            }
        }
        for seq in still_unsettled.into_iter().rev() {
            self.unsettled.push_front(seq);
        }
        loop {
            let gone = match self.queue.front() {
                None => break,
                Some(None) => true,
                Some(Some(shadowed)) => {
                    shadowed.inbound.expired(now)
                        || now.duration_since(shadowed.received) >= UNBOUNDED_KEEP
                        || (shadowed.acked && !needed_by_a_new_leader(shadowed, leader_heard, now))
                }
            };
            if !gone {
                break;
            }
            if let Some(shadowed) = self.pop_front() {
                settled.forgotten.push(shadowed);
            }
        }
        self.compact();
        settled
    }

    /// Empties the shadow for a new leader, in arrival order: writes not seen applied are
    /// executed; writes seen applied within [`REANSWER_WINDOW`] before `leader_heard` (when
    /// this node last heard from the old leader) or after it are answered again from the dedup
    /// table (the old leader may have died before answering them; the earlier ones it answered
    /// as it applied them); reads and invalid requests received within [`READ_REANSWER_WINDOW`]
    /// of `now` are answered again. The rest were answered and are acknowledged already: they
    /// are only counted.
    pub fn take_over(&mut self, now: Instant, leader_heard: Option<Instant>) -> Takeover {
        let drained = self.drain();
        let mut takeover = Takeover::default();
        for request in drained {
            if !request.acked {
                takeover.execute.push(request);
            } else if !needed_by_a_new_leader(&request, leader_heard, now) {
                takeover.answered += 1;
            } else if request.applied_at.is_some() {
                takeover.reanswer.push(request);
            } else {
                takeover.execute.push(request);
            }
        }
        takeover
    }

    /// Everything, in arrival order.
    pub fn drain(&mut self) -> Vec<Shadowed> {
        self.first += self.queue.len() as u64;
        let out: Vec<Shadowed> = self.queue.drain(..).flatten().collect();
        self.bytes = 0;
        self.index.clear();
        self.unsettled.clear();
        out
    }

    /// The arrival number of the request held under `identity`.
    fn find(&self, identity: &RequestIdentity) -> Option<u64> {
        let identity = (identity.response_topic.as_str(), identity.correlation_data.as_slice());
        let hash = self.hasher.hash_one(identity);
        self.index.find(hash, |&held| held_identity(&self.queue, self.first, held) == Some(identity)).copied()
    }

    fn get_mut(&mut self, seq: u64) -> Option<&mut Shadowed> {
        let at = usize::try_from(seq.checked_sub(self.first)?).ok()?;
        self.queue.get_mut(at)?.as_mut()
    }

    /// The oldest request, which leaves.
    fn pop_oldest(&mut self) -> Option<Shadowed> {
        while !self.queue.is_empty() {
            if let Some(shadowed) = self.pop_front() {
                return Some(shadowed);
            }
        }
        None
    }

    /// Takes the front slot out of the queue and its request out of the index.
    fn pop_front(&mut self) -> Option<Shadowed> {
        let seq = self.first;
        let slot = self.queue.pop_front()?;
        self.first += 1;
        let shadowed = slot?;
        self.bytes -= shadowed.inbound.held_bytes;
        if let Some(identity) = shadowed.inbound.identity_parts() {
            let hash = self.hasher.hash_one(identity);
            if let Ok(entry) = self.index.find_entry(hash, |&held| held == seq) {
                entry.remove();
            }
        }
        Some(shadowed)
    }

    /// Drops arrival numbers of writes that were settled or left, once they outnumber the
    /// requests held.
    fn compact(&mut self) {
        if self.unsettled.len() > 2 * self.index.len() + 64 {
            let (first, queue) = (self.first, &self.queue);
            self.unsettled.retain(|&seq| {
                seq.checked_sub(first)
                    .and_then(|at| queue.get(at as usize))
                    .is_some_and(|slot| slot.as_ref().is_some_and(|shadowed| !shadowed.acked))
            });
        }
    }
}

/// The identity of the request with arrival number `seq`, if it is still held.
fn held_identity(queue: &VecDeque<Option<Shadowed>>, first: u64, seq: u64) -> Option<(&str, &[u8])> {
    queue.get(usize::try_from(seq.checked_sub(first)?).ok()?)?.as_ref()?.inbound.identity_parts()
}

/// What a new leader does with the shadow ([`Shadow::take_over`]).
#[derive(Default)]
pub struct Takeover {
    /// Execute these, in order: writes not seen applied, recent reads.
    pub execute: Vec<Shadowed>,
    /// Answer these from the dedup table: writes seen applied just before the leader was lost.
    pub reanswer: Vec<Shadowed>,
    /// Requests answered by the old leader: nothing to do.
    pub answered: usize,
}

/// What [`Shadow::settle`] found.
#[derive(Default)]
pub struct Settled {
    /// Writes seen applied: acknowledge these publishes (the entries stay a while).
    pub applied: Vec<Publish>,
    /// Entries that left: acknowledge those not yet acknowledged.
    pub forgotten: Vec<Shadowed>,
}

/// Whether a request that needs no more acknowledgement (a read, or a write seen applied) would
/// still be answered by [`Shadow::take_over`]: a write seen applied within [`REANSWER_WINDOW`]
/// before the leader was last heard from (`leader_heard`; `None`: never, so kept) or after it, a
/// read or an invalid request received within [`READ_REANSWER_WINDOW`]. Anything older was
/// answered by the leader that applied it, so keeping it longer only costs memory. While the
/// leader is heard every heartbeat this keeps about the last [`REANSWER_WINDOW`] of applied
/// writes; once it goes quiet, nothing it applied in its last moments leaves.
fn needed_by_a_new_leader(request: &Shadowed, leader_heard: Option<Instant>, now: Instant) -> bool {
    match request.applied_at {
        Some(at) => leader_heard.is_none_or(|heard| heard.duration_since(at) <= REANSWER_WINDOW),
        None => now.duration_since(request.received) <= READ_REANSWER_WINDOW,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mqtt::envelope::Delivered;
    use bytes::Bytes;
    use rumqttc::v5::mqttbytes::v5::PublishProperties;
    use rumqttc::v5::mqttbytes::QoS;
    use statestore_protocol::topic::REQUEST_TOPIC;
    use statestore_protocol::{property, Get, Set};

    fn shadowed(correlation: u8, payload: Vec<u8>, received: Instant) -> Shadowed {
        let properties = PublishProperties {
            response_topic: Some("clients/c/response".into()),
            correlation_data: Some(Bytes::from(vec![correlation; 16])),
            message_expiry_interval: Some(10),
            user_properties: vec![(property::TIMESTAMP.into(), "001795306435997:00000:c".into())],
            ..Default::default()
        };
        let publish = Publish::new(REQUEST_TOPIC, QoS::AtLeastOnce, payload, Some(properties));
        Shadowed {
            inbound: Inbound::classify(&publish, Delivered::AsPublished, received, &Default::default(), None).unwrap(),
            receipt: crate::mqtt::connection::receipt(&publish),
            received,
            acked: false,
            applied_at: None,
        }
    }

    fn set(correlation: u8, now: Instant) -> Shadowed {
        shadowed(correlation, Set::new("k", "v").encode(), now)
    }

    /// A shadow holding SETs with the correlation ids `correlations`, received at `now`.
    fn shadow_of(correlations: std::ops::RangeInclusive<u8>, now: Instant) -> Shadow {
        let mut shadow = Shadow::new(100, usize::MAX);
        for c in correlations {
            assert!(shadow.insert(set(c, now)).is_empty());
        }
        shadow
    }

    fn correlations(list: &[Shadowed]) -> Vec<u8> {
        list.iter().map(|s| s.inbound.correlation_data.as_ref().unwrap()[0]).collect()
    }

    #[test]
    fn applied_requests_leave_and_the_rest_drain_in_order() {
        let now = Instant::now();
        let mut shadow = shadow_of(1..=5, now);
        let even: Vec<RequestIdentity> = [2, 4].iter().map(|c| set(*c, now).inbound.identity().unwrap()).collect();
        let settled = shadow.settle(now, Some(now), &even, |_| panic!("young requests are not looked up"));
        assert_eq!(settled.applied.len(), 2, "applied writes are acknowledged");
        assert!(settled.forgotten.is_empty(), "and kept, in case the leader died before answering");
        assert!(shadow.settle(now, Some(now), &even, |_| true).applied.is_empty(), "each is acknowledged once");
        let looked_up = shadow.settle(now + LOOKUP_AFTER, Some(now), &[], |_| true);
        assert_eq!(looked_up.applied.len(), 3, "what the feed missed is looked up once it is old enough");
        let expired = shadow.settle(now + Duration::from_secs(11), Some(now), &[], |_| true);
        assert_eq!(correlations(&expired.forgotten), vec![1, 2, 3, 4, 5], "every one leaves, in order, by expiry");
        assert!(shadow.is_empty());
    }

    #[test]
    fn applied_writes_are_kept_only_while_a_new_leader_would_answer_them_again() {
        let now = Instant::now();
        let mut shadow = shadow_of(1..=5, now);
        let identity = |c: u8| set(c, now).inbound.identity().unwrap();
        let at = |ms: u64| now + Duration::from_millis(ms);
        // The leader is heard every heartbeat.
        assert!(shadow.settle(at(0), Some(at(0)), &[identity(1), identity(2)], |_| false).forgotten.is_empty());
        assert!(shadow.settle(at(300), Some(at(300)), &[identity(3)], |_| false).forgotten.is_empty());
        let settled = shadow.settle(at(800), Some(at(800)), &[identity(4), identity(5)], |_| false);
        assert_eq!(
            correlations(&settled.forgotten),
            vec![1, 2],
            "applied more than the re-answer window before the leader was last heard"
        );
        let takeover = shadow.take_over(at(5_000), Some(at(800)));
        assert_eq!(correlations(&takeover.reanswer), vec![3, 4, 5], "what was kept is what a new leader answers");
        assert_eq!(takeover.answered, 0);
    }

    /// The drill's lost answer: the old leader applied and answered 1 and was killed before its
    /// answer left; 2 and 3, which it had replicated, were applied here only when this node,
    /// leading after an election of 750 ms, committed them. Measured from the last write seen
    /// applied, 1 was forgotten then and never answered again.
    #[test]
    fn writes_a_new_leader_commits_do_not_push_out_what_the_old_leader_applied_last() {
        let now = Instant::now();
        let mut shadow = shadow_of(1..=3, now);
        let identity = |c: u8| set(c, now).inbound.identity().unwrap();
        let at = |ms: u64| now + Duration::from_millis(ms);
        assert!(shadow.settle(at(5), Some(at(0)), &[identity(1)], |_| false).forgotten.is_empty());
        // The old leader is last heard at 50 ms; settling goes on while the others elect.
        for ms in (100..800).step_by(20) {
            assert!(shadow.settle(at(ms), Some(at(50)), &[], |_| false).forgotten.is_empty(), "at {ms} ms");
        }
        // Leading now, this node commits and applies what the old leader left uncommitted.
        let settled = shadow.settle(at(800), Some(at(50)), &[identity(2), identity(3)], |_| false);
        assert!(settled.forgotten.is_empty(), "{:?}", correlations(&settled.forgotten));
        let takeover = shadow.take_over(at(810), Some(at(50)));
        assert_eq!(correlations(&takeover.reanswer), vec![1, 2, 3]);
        assert_eq!(takeover.answered, 0);
    }

    #[test]
    fn a_new_leader_drains_applied_and_unapplied_requests_in_order() {
        let now = Instant::now();
        let mut shadow = shadow_of(1..=4, now);
        shadow.settle(now, Some(now), &[set(2, now).inbound.identity().unwrap()], |_| false);
        let drained = shadow.drain();
        assert_eq!(correlations(&drained), vec![1, 2, 3, 4]);
        assert_eq!(drained.iter().map(|s| s.acked).collect::<Vec<_>>(), vec![false, true, false, false]);
    }

    #[test]
    fn a_new_leader_executes_the_unapplied_and_answers_again_only_the_last_applied() {
        let start = Instant::now();
        let mut shadow = shadow_of(1..=4, start);
        let mut old_read = shadowed(5, Get { key: b"k".to_vec() }.encode(), start);
        old_read.acked = true;
        shadow.insert(old_read);
        let identity = |c: u8| set(c, start).inbound.identity().unwrap();
        // 1 was applied long before the leader was lost, 2 in its last moments; 3 and 4 never.
        shadow.settle(start, Some(start), &[identity(1)], |_| false);
        let lost_at = start + Duration::from_secs(2);
        let settled = shadow.settle(lost_at, Some(lost_at), &[identity(2)], |_| false);
        assert_eq!(correlations(&settled.forgotten), vec![1], "a new leader would not answer 1 again");
        let later = lost_at + Duration::from_millis(800);
        let mut recent_read = shadowed(6, Get { key: b"k".to_vec() }.encode(), later);
        recent_read.acked = true;
        shadow.insert(recent_read);
        let takeover = shadow.take_over(later + READ_REANSWER_WINDOW, Some(lost_at));
        assert_eq!(correlations(&takeover.execute), vec![3, 4, 6], "unapplied writes and the recent read");
        assert_eq!(correlations(&takeover.reanswer), vec![2], "the write applied last");
        assert_eq!(takeover.answered, 1, "the old read");
        assert!(shadow.is_empty());
    }

    #[test]
    fn a_redelivery_replaces_the_earlier_copy_and_overflow_evicts_the_oldest() {
        let now = Instant::now();
        let mut shadow = Shadow::new(3, usize::MAX);
        for c in 1..=3 {
            shadow.insert(set(c, now));
        }
        assert_eq!(correlations(&shadow.insert(set(2, now))), vec![2], "the earlier copy is handed back");
        assert_eq!(correlations(&shadow.insert(set(4, now))), vec![1], "the oldest leaves");
        assert_eq!(correlations(&shadow.drain()), vec![3, 2, 4]);
    }

    /// Large requests leave by bytes long before the count would make them: a flood of 1 MiB
    /// values keeps at most the budget, oldest out first, and the count follows every removal.
    #[test]
    fn the_shadow_holds_at_most_its_byte_budget() {
        let now = Instant::now();
        let large = |c: u8| shadowed(c, Set::new("k", vec![b'v'; 1 << 20]).encode(), now);
        let one = large(0).inbound.held_bytes;
        assert!(one > 2 << 20, "a 1 MiB value costs what it holds twice: {one}");
        let mut shadow = Shadow::new(200_000, 5 * one);
        let mut released = Vec::new();
        for c in 1..=20 {
            released.extend(correlations(&shadow.insert(large(c))));
            assert!(shadow.bytes() <= 5 * one, "{} held after {c}", shadow.bytes());
        }
        assert_eq!(released, (1..=15).collect::<Vec<u8>>(), "the oldest leave first");
        assert_eq!(shadow.len(), 5);
        // A redelivery replaces its copy without counting twice.
        assert_eq!(correlations(&shadow.insert(large(20))), vec![20]);
        assert_eq!(shadow.bytes(), 5 * one);
        assert_eq!(correlations(&shadow.drain()), vec![16, 17, 18, 19, 20]);
        assert_eq!(shadow.bytes(), 0);
    }

    #[test]
    fn the_index_follows_redeliveries_and_evictions() {
        let now = Instant::now();
        let mut shadow = Shadow::new(50, usize::MAX);
        let mut handed_back = 0;
        // 300 arrivals of 70 identities: each is redelivered several times, and the oldest are
        // evicted past 50.
        for n in 0..300u32 {
            handed_back += shadow.insert(set((n % 70) as u8, now)).len();
            assert!(shadow.len() <= 50);
        }
        assert_eq!(handed_back, 250, "every arrival but the 50 held was handed back once");
        let held: Vec<u8> =
            shadow.queue.iter().flatten().map(|s| s.inbound.correlation_data.as_ref().unwrap()[0]).collect();
        let expected: Vec<u8> = (250..300u32).map(|n| (n % 70) as u8).collect();
        assert_eq!(held, expected, "the newest copy of each, in arrival order");
        let identities: Vec<RequestIdentity> = (0..70).map(|c| set(c, now).inbound.identity().unwrap()).collect();
        let settled = shadow.settle(now, Some(now), &identities, |_| panic!("everything held is named by the feed"));
        assert_eq!(settled.applied.len(), 50, "every held request is found by its identity");
        assert_eq!(correlations(&shadow.drain()), expected);
        assert!(shadow.is_empty() && shadow.find(&identities[0]).is_none());
    }

    #[test]
    fn expired_requests_and_old_reads_settle_without_being_applied() {
        let now = Instant::now();
        let mut shadow = Shadow::new(10, usize::MAX);
        shadow.insert(set(1, now));
        let mut read = shadowed(2, Get { key: b"k".to_vec() }.encode(), now);
        read.acked = true;
        shadow.insert(read);
        assert!(shadow.settle(now + Duration::from_millis(500), Some(now), &[], |_| false).forgotten.is_empty());
        let expired = shadow.settle(now + Duration::from_secs(11), Some(now), &[], |_| false).forgotten;
        assert_eq!(correlations(&expired), vec![1, 2], "the expired write, then the read kept past its retention");
    }

    #[test]
    fn settling_a_large_shadow_looks_up_only_a_bounded_number_of_old_requests() {
        let now = Instant::now();
        let mut shadow = Shadow::new(100_000, usize::MAX);
        for c in 0..20_000u32 {
            let mut request = set(0, now);
            let correlation = Bytes::from(c.to_be_bytes().repeat(4));
            request.inbound.correlation_data = Some(correlation);
            shadow.insert(request);
        }
        assert_eq!(shadow.len(), 20_000);
        let mut lookups = 0;
        shadow.settle(now, Some(now), &[], |_| {
            lookups += 1;
            true
        });
        assert_eq!(lookups, 0, "nothing young is looked up");
        let settled = shadow.settle(now + LOOKUP_AFTER, Some(now), &[], |_| {
            lookups += 1;
            false
        });
        assert_eq!(lookups, LOOKUPS_PER_SETTLE);
        assert!(settled.applied.is_empty() && settled.forgotten.is_empty());
        assert_eq!(shadow.unsettled.len(), 20_000, "what was looked up keeps its place");
        let applied: Vec<RequestIdentity> =
            shadow.queue.iter().flatten().filter_map(|s| s.inbound.identity()).collect();
        shadow.settle(now + LOOKUP_AFTER, Some(now), &applied, |_| panic!("everything was applied"));
        assert!(shadow.unsettled.is_empty(), "settled slots leave the unsettled queue");
    }
}
