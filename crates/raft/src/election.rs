//! Elections with a pre-vote.
//!
//! openraft 0.9 has no pre-vote: a voter that stops hearing the leader (paused, cut off, or
//! only slow) raises its term and stands for election on its own timer. When it comes back, its
//! higher term unseats a healthy leader, and a voter cut off from the others raises its term
//! again and again. And a candidate whose log is behind made the others wait once more (a
//! split vote, then an extra penalty): a leader lost could leave the cluster without one for
//! about a second.
//!
//! So openraft's own election timer is off (`enable_elect = false`) and the [`Elector`] of each
//! node decides when it stands. A voter that has not heard from a leader for the lease
//! (openraft's: the upper bound of the election timeout) plus a random election timeout (as
//! openraft's timer waits) first asks every other voter whether it would vote for it (`POST /raft/prevote`). A
//! voter says yes only if it does not lead, has itself not heard from a leader for the lease, and
//! the candidate's log is at least as up to date as its own: the checks of a real vote, without
//! changing its term or its vote. Only with a yes from a quorum (of every configuration of a
//! joint membership, itself included) does the candidate call [`openraft::Raft::trigger`]'s
//! `elect_if` with the vote it looked at last (a change to openraft, `crates/openraft/README.md`):
//! the core stands only if that vote is still its own, so a vote granted in the moment between
//! (to a voter that stood at about the same time) keeps it from raising the term past that
//! voter and unseating it. A voter that cannot reach a quorum never raises its term, so when it
//! comes back it simply follows.
//!
//! A candidate whose clock disagrees with most voters' clocks as the pre-vote's answers show them
//! (beyond the bound of [`crate::clocks::PeerClocks`]) does not stand either, but as a last
//! resort (below).
//!
//! A leader told to stop hands its leadership over first ([`Elector::hand_over`]): once a voter's
//! log matches its own, everything in it applied, it asks that voter to stand at once
//! (`POST /raft/stand`). The voter does if it still follows that leader under the same vote and
//! its log holds the leader's last entry; it skips the pre-vote, as the leader's vote is the one
//! it needs. The leader grants it (its own vote was last renewed when it was elected, so
//! openraft's lease no longer holds it back), which with the candidate's own vote is a quorum of
//! three voters: the cluster has a new leader within a round trip or two, not after a lease and
//! an election timeout. The other voters still hear the old leader's lease and refuse; they
//! follow the new leader at its first append. Where the two votes are not a quorum (five voters
//! or more), the leader first asks the other voters to release its lease (`POST
//! /raft/release`, [`LeaseRelease`]): each that follows that very leadership grants, for a lease
//! from then, a candidate's vote request that the lease would have refused (a change to
//! openraft's vote handling, `crates/openraft/README.md`). Where even they do not make a quorum,
//! or anything fails, the cluster elects a leader as after any leader loss.
//!
//! A leader whose disk does not return hands over the same way ([`Handover::DiskStalled`]), with
//! two differences: it cannot apply what it proposed last (it commits only what it has flushed)
//! and it cannot grant a vote (granting one is a synced write), so the successor need only hold
//! the log as this leader appended it, and the leader releases its lease on every other voter so
//! that their votes make the quorum without its own.
//!
//! A node may also be told it must not lead ([`Elector::restrain`], for a [`Restraint`]: while it
//! cannot reach the broker its clients talk through, while its clock disagrees with the others',
//! while it stops): it then does not stand, and while it still leads it grants pre-votes to
//! candidates whose log is as up to date as its own, so that a node that can serve takes over
//! (the node stops its heartbeats for that). That is a preference, not a veto: a voter that has
//! known no leader for [`LAST_RESORT_LEASES`] leases stands (with its pre-vote) even so, and
//! hands over again once it leads. Otherwise a cluster whose only voters allowed to lead have
//! shorter logs than the rest (a voter paused or cut off a moment ago, while the leader is lost),
//! or a leader lost while the broker is gone for everyone, would be left without a leader, though
//! a quorum can talk: the voter with the longest log would not stand, and the others could not
//! win its vote.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use openraft::ServerState;
use prometheus::{IntCounterVec, Opts, Registry};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::log_store::LogReader;
use crate::network::NetworkFactory;
use crate::types::{LogId, Node, NodeId, Raft, Vote};

/// How many leases a voter that must not lead waits without a leader before it stands anyway.
/// Long enough that a voter allowed to lead, which stands a lease and a quarter of an election
/// timeout after its leader went quiet, wins first whenever one can.
pub const LAST_RESORT_LEASES: u32 = 10;

/// Where a node answers pre-votes.
pub const PREVOTE_PATH: &str = "/raft/prevote";
/// Where a leader that is handing over asks a voter to stand ([`StandRequest`]).
pub const STAND_PATH: &str = "/raft/stand";
/// Where a leader that is handing over releases its lease on a voter ([`LeaseRelease`]).
pub const RELEASE_PATH: &str = "/raft/release";

/// What a leader that hands over can still do itself ([`Elector::hand_over`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handover {
    /// Its disk works: what it proposed is applied and answered before a voter is asked to
    /// stand, and its own vote for the successor counts.
    Settled,
    /// Its log fsync does not return: nothing more is applied here, and granting a vote would
    /// wait for the disk. The successor need only hold the log as this node appended it, and
    /// the other voters' votes must make the quorum without this node's.
    DiskStalled,
}

/// "Would you vote for me now?"
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PreVoteRequest {
    pub candidate: NodeId,
    pub last_log_id: Option<LogId>,
}

/// The answer to a [`PreVoteRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PreVoteResponse {
    Granted,
    /// Why not, for the candidate's log.
    Refused(String),
}

/// "I am stopping: stand now." From a leader to a voter whose log matches its own.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StandRequest {
    /// The leader's vote: the voter stands only if it follows this very leadership.
    pub vote: Vote,
    /// The leader's last log id: the voter stands only if its log holds it.
    pub last_log_id: Option<LogId>,
}

/// The answer to a [`StandRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum StandResponse {
    /// The voter has asked for votes.
    Standing,
    /// Why not.
    Refused(String),
}

/// "I am handing over: grant my successor your vote before my lease ends." From a leader to
/// the voters other than its successor, where the two votes alone are not a quorum.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeaseRelease {
    /// The leader's vote: the voter releases the lease only if it follows this very leadership.
    pub vote: Vote,
}

/// The answer to a [`LeaseRelease`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReleaseResponse {
    /// For a lease from now, the voter grants a candidate its vote despite that leader's lease.
    Released,
    /// Why not.
    Refused(String),
}

/// Why a node must not lead now. Each is set and cleared on its own by what watches it; the node
/// may lead while none is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restraint {
    /// It cannot reach the broker its clients talk through.
    NoBroker,
    /// Its clock disagrees with most voters' clocks.
    ClockOff,
    /// It is stopping.
    Stopping,
}

impl Restraint {
    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// When a node stands for election. Cheap to clone.
#[derive(Clone)]
pub struct Elector {
    id: NodeId,
    raft: Raft,
    log: LogReader,
    network: NetworkFactory,
    /// How long after a leader was last heard from a voter may vote for someone else
    /// (openraft's leader lease: the election timeout's upper bound).
    lease: Duration,
    /// The election timeout's lower bound and range: each wait adds a random timeout, so that
    /// two voters rarely stand at the same moment and split the vote.
    min_timeout: Duration,
    spread: Duration,
    /// How often the elector looks; also the deadline of one pre-vote request.
    tick: Duration,
    /// The [`Restraint`]s set now, one bit each: while any is, this node does not stand, and
    /// leading it lets others stand.
    restraints: Arc<AtomicU8>,
    /// When this node last heard from a leader other than itself (see [`Elector::leader_heard_at`]).
    leader_heard: Arc<Mutex<Option<std::time::Instant>>>,
    metrics: ElectionMetrics,
}

/// Pre-votes this node asked for, by outcome, and the elections it started, by why.
#[derive(Clone)]
struct ElectionMetrics {
    prevotes: IntCounterVec,
    elections: IntCounterVec,
}

impl ElectionMetrics {
    fn register(registry: &Registry) -> prometheus::Result<ElectionMetrics> {
        let prevotes = IntCounterVec::new(
            Opts::new(
                "statestore_prevotes_total",
                "Pre-votes this node held before standing for election, by outcome: won (it stood) or lost",
            ),
            &["outcome"],
        )?;
        registry.register(Box::new(prevotes.clone()))?;
        let elections = IntCounterVec::new(
            Opts::new(
                "statestore_elections_started_total",
                "Elections this node started, by why: prevote (it won one) or handover (its leader, stopping, asked it to)",
            ),
            &["reason"],
        )?;
        registry.register(Box::new(elections.clone()))?;
        Ok(ElectionMetrics { prevotes, elections })
    }
}

/// What the elector reads of openraft's state at one moment.
struct Standing {
    leading: bool,
    vote: Vote,
    /// How long ago a leader's vote was last confirmed here (an append, a heartbeat); `None`
    /// when this node's vote is for a candidate, or it never heard from one since it started.
    since_leader: Option<Duration>,
}

impl Elector {
    /// An elector for `raft`, with openraft's election timeout range `[min, max]` and heartbeat
    /// interval `tick`. Its metrics go to `registry`.
    pub fn new(
        id: NodeId,
        raft: Raft,
        log: LogReader,
        network: NetworkFactory,
        election_timeout: (Duration, Duration),
        tick: Duration,
        registry: &Registry,
    ) -> prometheus::Result<Elector> {
        let (min, max) = election_timeout;
        Ok(Elector {
            id,
            raft,
            log,
            network,
            lease: max,
            min_timeout: min,
            spread: max.saturating_sub(min),
            tick,
            restraints: Arc::default(),
            leader_heard: Arc::default(),
            metrics: ElectionMetrics::register(registry)?,
        })
    }

    /// Starts deciding, on the current runtime, until Raft stops.
    pub fn start(self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(self.run())
    }

    async fn standing(&self) -> Option<Standing> {
        self.raft
            .with_raft_state(|state| Standing {
                leading: state.server_state == ServerState::Leader,
                vote: *state.vote_ref(),
                since_leader: if state.vote_ref().is_committed() {
                    state.vote_last_modified().map(|at| at.elapsed())
                } else {
                    None
                },
            })
            .await
            .ok()
    }

    /// Stands for election if this node's vote is still `vote` (`elect_if`, a change to
    /// openraft): whether it stood, or `None` when the core did not answer within the lease (a
    /// busy or stuck core; the command stays queued, and the core still stands only on that
    /// vote), or why Raft has stopped.
    async fn stand_if(&self, vote: Vote) -> Result<Option<bool>, String> {
        match tokio::time::timeout(self.lease, self.raft.trigger().elect_if(vote)).await {
            Ok(Ok(stood)) => Ok(Some(stood)),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Ok(None),
        }
    }

    /// How long ago this node last heard from the leader it follows; `None` when it leads,
    /// follows no leader (its vote is for a candidate), or Raft has stopped.
    /// `None` too when openraft does not answer within the lease (a busy or stuck core).
    pub async fn since_leader(&self) -> Option<Duration> {
        let standing = tokio::time::timeout(self.lease, self.standing()).await.ok().flatten();
        standing.filter(|standing| !standing.leading).and_then(|standing| standing.since_leader)
    }

    /// When this node last heard from a leader other than itself (an append or a heartbeat), as
    /// of the elector's last look (every heartbeat interval): `None` before it first did. It stays
    /// where it was while this node stands or leads, so a new leader knows when it last heard
    /// the old one.
    pub fn leader_heard_at(&self) -> Option<std::time::Instant> {
        *self.leader_heard.lock().unwrap()
    }

    /// Sets (`on`) or clears one reason this node must not lead. While any is set it stands for
    /// election only as a last resort and, if it leads, grants pre-votes as a follower that has
    /// not heard from a leader would.
    pub fn restrain(&self, why: Restraint, on: bool) {
        let before = if on {
            self.restraints.fetch_or(why.bit(), Ordering::SeqCst)
        } else {
            self.restraints.fetch_and(!why.bit(), Ordering::SeqCst)
        };
        if (before & why.bit() != 0) != on {
            tracing::info!(restraint = ?why, on, "this node may lead: {}", self.allowed_to_lead());
        }
    }

    fn allowed_to_lead(&self) -> bool {
        self.restraints.load(Ordering::SeqCst) == 0
    }

    /// The other voters and the base URL this node reaches each at.
    pub fn other_voters(&self) -> Vec<(NodeId, String)> {
        let (configs, nodes) = self.voters();
        let ids: BTreeSet<NodeId> = configs.into_iter().flatten().filter(|id| *id != self.id).collect();
        ids.into_iter().filter_map(|id| nodes.get(&id).map(|node| (id, self.network.address(id, node)))).collect()
    }

    /// The lease: how long after a leader's last word a voter keeps refusing other candidates.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Answers a candidate's pre-vote: yes only where a real vote would be granted now.
    pub async fn answer(&self, request: &PreVoteRequest) -> PreVoteResponse {
        let standing = match tokio::time::timeout(self.lease, self.standing()).await {
            Ok(Some(standing)) => standing,
            Ok(None) => return PreVoteResponse::Refused("Raft has stopped on this node".into()),
            Err(_) => return PreVoteResponse::Refused(format!("node {} is too busy to answer", self.id)),
        };
        if standing.leading && self.allowed_to_lead() {
            return PreVoteResponse::Refused(format!("node {} leads", self.id));
        }
        if let Some(since) = standing.since_leader.filter(|since| *since <= self.lease) {
            return PreVoteResponse::Refused(format!(
                "node {} heard from its leader {} ms ago",
                self.id,
                since.as_millis()
            ));
        }
        match self.log.last_log_id() {
            Err(e) => PreVoteResponse::Refused(format!("node {} cannot read its log: {e}", self.id)),
            Ok(ours) if request.last_log_id < ours => PreVoteResponse::Refused(format!(
                "node {}'s log ends at {ours:?}, after the candidate's {:?}",
                self.id, request.last_log_id
            )),
            Ok(_) => PreVoteResponse::Granted,
        }
    }

    /// How long to stay quiet before the next pre-vote: the lease plus a quarter of a random
    /// election timeout. The lease (the election timeout's upper bound, six heartbeats by
    /// default) is what keeps a busy machine that delays a few heartbeats from starting
    /// elections: no voter grants a pre-vote before it has itself gone a lease without the
    /// leader. The random part only keeps voters that lost their leader together from standing
    /// at the same tick, and two that do so anyway elect one in one term (see the module's
    /// documentation), so a quarter of openraft's own wait is enough: a leader lost is replaced
    /// about 150 ms sooner than after the lease and a whole election timeout.
    fn quiet_period(&self) -> Duration {
        self.lease + (self.min_timeout + self.spread.mul_f64(fastrand::f64())) / 4
    }

    async fn run(self) {
        let mut ticks = tokio::time::interval(self.tick);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut quiet = self.quiet_period();
        let mut next_try = Instant::now();
        // When this node last led or heard from a leader (or started).
        let mut leader_known = Instant::now();
        // The vote this node held at the last tick, and when it last changed: a vote granted to
        // a candidate (or a leader stepping down for one) restarts the wait before standing, as
        // granting a vote restarts Raft's election timer. Without it, a voter whose vote went to
        // a candidate knows no leader, pre-votes at its next tick, wins the candidate's own yes
        // and stands against it, undoing an election under way (a handover's, most often).
        let mut vote_held: Option<(Vote, Option<Instant>)> = None;
        loop {
            ticks.tick().await;
            let Some(standing) = self.standing().await else { return };
            match &vote_held {
                Some((vote, _)) if *vote == standing.vote => {}
                // The vote this node started with is not news.
                None => vote_held = Some((standing.vote, None)),
                Some(_) => vote_held = Some((standing.vote, Some(Instant::now()))),
            }
            let vote_changed = vote_held.as_ref().and_then(|(_, at)| at.map(|at| at.elapsed()));
            if standing.leading {
                leader_known = Instant::now();
            } else if let Some(heard) = standing.since_leader.and_then(|since| Instant::now().checked_sub(since)) {
                leader_known = leader_known.max(heard);
                let mut leader_heard = self.leader_heard.lock().unwrap();
                *leader_heard = (*leader_heard).max(Some(heard.into_std()));
            }
            if Instant::now() < next_try {
                continue;
            }
            let last_resort = leader_known.elapsed() >= self.lease * LAST_RESORT_LEASES;
            if standing.leading
                || standing.since_leader.is_some_and(|since| since < quiet)
                || vote_changed.is_some_and(|since| since < quiet)
                || !(self.allowed_to_lead() || last_resort)
            {
                continue;
            }
            let (configs, nodes) = self.voters();
            if !configs.iter().any(|config| config.contains(&self.id)) {
                continue;
            }
            quiet = self.quiet_period();
            next_try = Instant::now() + quiet;
            let asked = Instant::now();
            if !self.prevote(&configs, &nodes).await {
                self.metrics.prevotes.with_label_values(&["lost"]).inc();
                continue;
            }
            self.metrics.prevotes.with_label_values(&["won"]).inc();
            // A voter that said yes may have stood and won meanwhile, or asked this node for its
            // vote: standing now would unseat it.
            let Some(now) = self.standing().await else { return };
            if now.leading
                || now.vote != standing.vote
                || now.since_leader.is_some_and(|since| since < asked.elapsed())
                || !(self.allowed_to_lead() || last_resort)
            {
                tracing::info!(vote = %now.vote, "won a pre-vote, but another node stood or led since; not standing");
                continue;
            }
            if let Some(clocks) = self.network.clocks() {
                // The pre-vote's answers have just told this node its peers' clocks.
                let voters: BTreeSet<NodeId> = configs.iter().flatten().copied().collect();
                let agreement = clocks.agreement(self.id, voters);
                if !agreement.holds() && !last_resort {
                    let (peer, offset_ms) = agreement.furthest.unwrap_or_default();
                    tracing::warn!(
                        agreeing = agreement.agreeing,
                        known = agreement.known,
                        peer,
                        offset_ms,
                        bound_ms = clocks.bound().as_millis() as u64,
                        "won a pre-vote, but this node's clock disagrees with most voters' clocks; not standing"
                    );
                    continue;
                }
            }
            if last_resort {
                tracing::warn!(
                    leaderless_ms = leader_known.elapsed().as_millis() as u64,
                    "no leader for {LAST_RESORT_LEASES} leases: standing for election, as a last resort if this node \
                     may not lead (it hands over again once it leads)"
                );
            } else {
                tracing::info!(since_leader_ms = ?standing.since_leader.map(|d| d.as_millis()), "won a pre-vote; standing for election");
            }
            // The vote must still be the one looked at: a vote granted in the moment since (to
            // a voter that stood at about the same time) or a new leader heard from would
            // otherwise be unseated by this node's higher term.
            match self.stand_if(now.vote).await {
                Ok(Some(true)) => self.metrics.elections.with_label_values(&["prevote"]).inc(),
                Ok(Some(false)) => {
                    tracing::info!("won a pre-vote, but this node's vote changed as it stood; not standing")
                }
                Ok(None) => tracing::warn!("won a pre-vote, but openraft did not answer within the lease"),
                Err(_) => return,
            }
        }
    }

    /// Answers a stopping leader's [`StandRequest`]: stands at once where this node follows
    /// that leadership, may lead, is a voter and its log holds the leader's last entry.
    pub async fn answer_stand(&self, request: &StandRequest) -> StandResponse {
        let standing = match tokio::time::timeout(self.lease, self.standing()).await {
            Ok(Some(standing)) => standing,
            Ok(None) => return StandResponse::Refused("Raft has stopped on this node".into()),
            Err(_) => return StandResponse::Refused(format!("node {} is too busy to answer", self.id)),
        };
        let refuse = |why: String| {
            tracing::info!(why, "not standing at the leader's request");
            StandResponse::Refused(why)
        };
        if standing.leading || standing.vote != request.vote || !request.vote.is_committed() {
            return refuse(format!("node {} follows {}, not the leadership {}", self.id, standing.vote, request.vote));
        }
        if !self.allowed_to_lead() {
            return refuse(format!("node {} may not lead now", self.id));
        }
        let (configs, _) = self.voters();
        if !configs.iter().any(|config| config.contains(&self.id)) {
            return refuse(format!("node {} is not a voter", self.id));
        }
        match self.log.last_log_id() {
            Err(e) => return refuse(format!("node {} cannot read its log: {e}", self.id)),
            Ok(ours) if ours < request.last_log_id => {
                return refuse(format!(
                    "node {}'s log ends at {ours:?}, before the leader's {:?}",
                    self.id, request.last_log_id
                ))
            }
            Ok(_) => {}
        }
        tracing::info!(leader = %request.vote, "the leader hands over and asked this node to stand; standing for election");
        match self.stand_if(standing.vote).await {
            Ok(Some(true)) => {
                self.metrics.elections.with_label_values(&["handover"]).inc();
                StandResponse::Standing
            }
            Ok(Some(false)) => refuse(format!("node {}'s vote changed as it stood", self.id)),
            Ok(None) => refuse(format!("node {}'s Raft core did not answer within the lease", self.id)),
            Err(e) => StandResponse::Refused(format!("node {}: {e}", self.id)),
        }
    }

    /// Hands this node's leadership to a voter whose log matches its own, then waits until
    /// this node no longer leads: the new leader's id, or why not within `deadline`. The caller
    /// has stopped new proposals and forbidden this node to lead ([`Elector::restrain`]); with
    /// [`Handover::Settled`], entries already proposed are waited for (their answers go out
    /// from here).
    pub async fn hand_over(&self, deadline: Duration, to: Option<NodeId>, mode: Handover) -> Result<NodeId, String> {
        let until = Instant::now() + deadline;
        let mut metrics = self.raft.metrics();
        let mut asked: Option<NodeId> = None;
        // Voters asked that refused or did not answer: each is asked once.
        let mut tried = BTreeSet::new();
        loop {
            let (state, vote, last_index, applied, replication, leader) = {
                let m = metrics.borrow_and_update();
                (
                    m.state,
                    m.vote,
                    m.last_log_index,
                    m.last_applied.map(|applied| applied.index),
                    m.replication.clone().unwrap_or_default(),
                    m.current_leader,
                )
            };
            match leader {
                Some(leader) if leader != self.id => return Ok(leader),
                // It granted a candidate its vote and awaits the new leader's first append.
                _ if state != ServerState::Leader && asked.is_some() => {}
                _ if state != ServerState::Leader => {
                    return Err("this node no longer leads, and no leader is known".into())
                }
                _ => {}
            }
            if asked.is_none() && state == ServerState::Leader {
                let (configs, nodes) = self.voters();
                let eligible = |id: NodeId| {
                    id != self.id && to.is_none_or(|to| to == id) && configs.iter().any(|config| config.contains(&id))
                };
                if !replication.keys().any(|id| eligible(*id)) {
                    return Err("no other voter may stand".into());
                }
                if !replication.keys().any(|id| eligible(*id) && !tried.contains(id)) {
                    return Err(format!("no voter would stand: asked {tried:?}"));
                }
                let last = self.log.last_log_id().map_err(|e| format!("reading the log: {e}"))?;
                // Every entry proposed here is applied (its answer given), and a voter's log
                // ends where this node's does, that voter's vote and this node's a quorum. A
                // stalled disk applies nothing more: the voter's log ending there is enough.
                let settled =
                    last.map(|id| id.index) == last_index && (mode == Handover::DiskStalled || applied == last_index);
                let successor = replication
                    .iter()
                    .filter(|_| settled)
                    .find(|(id, matched)| **matched == last && eligible(**id) && !tried.contains(*id))
                    .and_then(|(id, _)| nodes.get(id).map(|node| (*id, node)));
                if let Some((id, node)) = successor {
                    let timeout = self.tick.max(Duration::from_millis(100));
                    // With more than three voters, the two votes are not a quorum (nor is the
                    // successor's alone, where this node's disk cannot record a vote): the
                    // others must not refuse the successor for this node's lease.
                    let mut voting = BTreeSet::from([id]);
                    if mode == Handover::Settled {
                        voting.insert(self.id);
                    }
                    if !has_quorum(&configs, &voting) {
                        let others =
                            configs.iter().flatten().filter(|other| **other != self.id && !voting.contains(other));
                        voting.extend(self.release_lease(others.copied().collect(), &nodes, vote, timeout).await);
                    }
                    if !has_quorum(&configs, &voting) {
                        return Err(format!(
                            "node {id}'s vote and this node's with those of the voters that released this node's \
                             lease ({voting:?}) are not a quorum"
                        ));
                    }
                    let request = StandRequest { vote, last_log_id: last };
                    match self.network.ask_to_stand(id, node, &request, timeout).await {
                        Ok(StandResponse::Standing) => asked = Some(id),
                        Ok(StandResponse::Refused(why)) => {
                            tracing::info!(peer = id, why, "a voter would not stand");
                            tried.insert(id);
                        }
                        Err(e) => {
                            tracing::info!(peer = id, error = %e, "a voter did not answer the request to stand");
                            tried.insert(id);
                        }
                    }
                    continue;
                }
            }
            let wait = until.saturating_duration_since(Instant::now());
            if wait.is_zero() {
                return Err(match asked {
                    None => format!("no voter's log matched this node's within {deadline:?}"),
                    Some(id) => format!("node {id} stood, but no new leader was known within {deadline:?}"),
                });
            }
            if let Ok(Err(_)) = tokio::time::timeout(wait.min(self.tick), metrics.changed()).await {
                return Err("Raft has stopped".into());
            }
        }
    }

    /// Asks each of `voters` at once to release this leader's lease (its `vote`); the voters
    /// that did within `timeout`.
    async fn release_lease(
        &self,
        voters: BTreeSet<NodeId>,
        nodes: &BTreeMap<NodeId, Node>,
        vote: Vote,
        timeout: Duration,
    ) -> BTreeSet<NodeId> {
        let request = LeaseRelease { vote };
        let asked = voters.into_iter().filter_map(|id| nodes.get(&id).map(|node| (id, node))).map(|(id, node)| {
            let request = &request;
            async move {
                match self.network.release_lease(id, node, request, timeout).await {
                    Ok(ReleaseResponse::Released) => Some(id),
                    Ok(ReleaseResponse::Refused(why)) => {
                        tracing::info!(peer = id, why, "a voter would not release this leader's lease");
                        None
                    }
                    Err(e) => {
                        tracing::info!(peer = id, error = %e, "a voter did not answer the lease release");
                        None
                    }
                }
            }
        });
        futures::future::join_all(asked).await.into_iter().flatten().collect()
    }

    /// Answers a leader's [`LeaseRelease`]: releases its lease where this node follows that
    /// very leadership.
    pub async fn answer_release(&self, request: &LeaseRelease) -> ReleaseResponse {
        let standing = match tokio::time::timeout(self.lease, self.standing()).await {
            Ok(Some(standing)) => standing,
            Ok(None) => return ReleaseResponse::Refused("Raft has stopped on this node".into()),
            Err(_) => return ReleaseResponse::Refused(format!("node {} is too busy to answer", self.id)),
        };
        if standing.leading || standing.vote != request.vote || !request.vote.is_committed() {
            return ReleaseResponse::Refused(format!(
                "node {} follows {}, not the leadership {}",
                self.id, standing.vote, request.vote
            ));
        }
        tracing::info!(leader = %request.vote, "the leader is handing over and released its lease");
        match self.raft.trigger().release_lease(request.vote).await {
            Ok(()) => ReleaseResponse::Released,
            Err(e) => ReleaseResponse::Refused(format!("node {}: {e}", self.id)),
        }
    }

    /// The configurations of the membership (two while it changes) and every member's address.
    fn voters(&self) -> (Vec<BTreeSet<NodeId>>, BTreeMap<NodeId, Node>) {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let membership = metrics.membership_config.membership();
        let nodes = membership.nodes().map(|(id, node)| (*id, node.clone())).collect();
        (membership.get_joint_config().clone(), nodes)
    }

    /// Asks every other voter; true when every configuration has a quorum of yeses.
    async fn prevote(&self, configs: &[BTreeSet<NodeId>], nodes: &BTreeMap<NodeId, Node>) -> bool {
        let last_log_id = match self.log.last_log_id() {
            Ok(last) => last,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the log for a pre-vote");
                return false;
            }
        };
        let request = PreVoteRequest { candidate: self.id, last_log_id };
        let voters: BTreeSet<NodeId> = configs.iter().flatten().copied().filter(|id| *id != self.id).collect();
        let asks = voters.iter().filter_map(|id| nodes.get(id).map(|node| (*id, node))).map(|(id, node)| {
            let request = &request;
            async move { (id, self.network.prevote(id, node, request, self.tick.max(Duration::from_millis(100))).await) }
        });
        let mut granted = BTreeSet::from([self.id]);
        let mut answers: futures::stream::FuturesUnordered<_> = asks.collect();
        // Stops at a quorum: a voter that is down costs the request's deadline only when it
        // is needed.
        while !has_quorum(configs, &granted) {
            let Some((id, answer)) = answers.next().await else { break };
            match answer {
                Ok(PreVoteResponse::Granted) => {
                    granted.insert(id);
                }
                Ok(PreVoteResponse::Refused(why)) => tracing::debug!(peer = id, why, "pre-vote refused"),
                Err(e) => tracing::debug!(peer = id, error = %e, "pre-vote not answered"),
            }
        }
        let won = has_quorum(configs, &granted);
        if !won {
            tracing::info!(granted = ?granted, voters = ?configs, "lost a pre-vote; not standing for election");
        }
        won
    }
}

/// Whether `granted` holds a majority of every configuration.
fn has_quorum(configs: &[BTreeSet<NodeId>], granted: &BTreeSet<NodeId>) -> bool {
    !configs.is_empty()
        && configs.iter().all(|config| config.iter().filter(|id| granted.contains(id)).count() * 2 > config.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quorum_is_a_majority_of_every_configuration() {
        let set = |ids: &[NodeId]| ids.iter().copied().collect::<BTreeSet<NodeId>>();
        assert!(has_quorum(&[set(&[1])], &set(&[1])), "a single voter elects itself");
        assert!(has_quorum(&[set(&[1, 2, 3])], &set(&[1, 3])));
        assert!(!has_quorum(&[set(&[1, 2, 3])], &set(&[1])));
        assert!(!has_quorum(&[set(&[1, 2, 3, 4])], &set(&[1, 2])), "half is not a majority");
        let joint = [set(&[1, 2, 3]), set(&[3, 4, 5])];
        assert!(!has_quorum(&joint, &set(&[1, 2, 3])), "the new configuration has only one yes");
        assert!(has_quorum(&joint, &set(&[1, 3, 4])));
        assert!(!has_quorum(&[], &set(&[1])), "no membership, no election");
    }
}
