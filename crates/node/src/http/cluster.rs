//! The cluster API: status, adding learners, changing voters; health, readiness and metrics.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers, ServerState};
use serde::de::DeserializeOwned;
use statestore_api::body::{
    AddLearner, LeadershipMoved, LearnerAdded, MembershipChange, MoveLeadership, SnapshotRequested, Up,
};
use statestore_raft::types::RaftMetrics;
use statestore_raft::NodeId;
use statestore_statemachine::{Entry, Operation};

use super::ApiError;
use crate::clock_watch::ClockVerdict;
use crate::node::{forward, now_ms, ExecuteError, Node};
use crate::pipeline::Work;

/// How long `POST /cluster/learners` waits for the learner to catch up unless told otherwise.
const DEFAULT_CATCH_UP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a membership change may take to commit.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a learner being promoted may take to reach the leader's committed index.
const PROMOTE_CATCH_UP: Duration = Duration::from_secs(3);

pub use statestore_api::body::{ClusterStatus, Member};

fn members(metrics: &RaftMetrics, ids: impl Iterator<Item = NodeId>) -> Vec<Member> {
    let membership = metrics.membership_config.membership();
    ids.map(|id| Member { id, address: membership.get_node(&id).map(|n| n.addr.clone()).unwrap_or_default() }).collect()
}

pub fn cluster_status(node: &Node) -> ClusterStatus {
    // Copy the metrics out: the borrow must not live across an await.
    let metrics = node.raft.metrics().borrow().clone();
    let membership = metrics.membership_config.membership();
    let role = match metrics.state {
        ServerState::Leader => "leader",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Follower => "follower",
        ServerState::Shutdown => "shutdown",
    };
    ClusterStatus {
        id: node.id,
        role: role.to_string(),
        term: metrics.current_term,
        leader: metrics.current_leader.and_then(|id| members(&metrics, std::iter::once(id)).pop()),
        voters: members(&metrics, membership.voter_ids()),
        learners: members(&metrics, membership.learner_ids()),
        last_log_index: metrics.last_log_index.unwrap_or(0),
        committed_index: node.reader.committed_index(),
        applied_index: metrics.last_applied.map_or(0, |id| id.index),
        snapshot_index: metrics.snapshot.map_or(0, |id| id.index),
        purged_index: metrics.purged.map_or(0, |id| id.index),
        cluster_id: node.identity.cluster_id(),
        incarnation: node.identity.incarnation.clone(),
        restoring: node.identity.suspended(),
        enrolled: node.reader.enrollments().unwrap_or_default(),
        not_answering_ms: node
            .peer_health
            .failing()
            .into_iter()
            .map(|(peer, since)| (peer, since.as_millis() as u64))
            .collect(),
    }
}

pub async fn status(State(node): State<Arc<Node>>) -> Json<ClusterStatus> {
    Json(cluster_status(&node))
}

/// Parses a JSON body, answering malformed input with a JSON 400.
fn json_body<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("malformed JSON body: {e}")))
}

fn membership_error(error: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>) -> ApiError {
    match error {
        RaftError::APIError(ClientWriteError::ForwardToLeader(to)) => forward(&to).into(),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(ChangeMembershipError::InProgress(e))) => {
            ApiError::new(StatusCode::CONFLICT, "change_in_progress", e.to_string())
        }
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            ApiError::new(StatusCode::BAD_REQUEST, "bad_membership", e.to_string())
        }
        RaftError::Fatal(e) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", e.to_string()),
    }
}

fn timed_out(what: &str) -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "timeout", format!("{what} did not finish in time; it may still"))
}

/// Membership changes are decided by the leader; elsewhere the caller is sent there.
fn require_leader(metrics: &RaftMetrics) -> Result<(), ApiError> {
    if metrics.state == ServerState::Leader {
        return Ok(());
    }
    let leader_address = metrics
        .current_leader
        .and_then(|id| metrics.membership_config.membership().get_node(&id).map(|n| n.addr.clone()));
    Err(ExecuteError::ForwardToLeader { leader_id: metrics.current_leader, leader_address }.into())
}

/// `POST /cluster/learners {"id": 4, "address": "http://..."}`: adds a non-voting member and
/// waits until it has caught up (200) or the timeout passes (202, still catching up).
pub async fn add_learner(State(node): State<Arc<Node>>, body: Bytes) -> Result<Response, ApiError> {
    let request: AddLearner = json_body(&body)?;
    if request.id == 0 {
        return Err(ApiError::bad_request("node ids are positive integers"));
    }
    let address = request.address.trim_end_matches('/').to_string();
    // Every member speaks what this one does: HTTPS in a cluster with TLS, else HTTP.
    let scheme = if node.peer_tls.is_some() { "https://" } else { "http://" };
    if !address.starts_with(scheme) || address.len() <= scheme.len() {
        return Err(ApiError::bad_request(format!("{:?} is not an {scheme} URL", request.address)));
    }
    let metrics = node.raft.metrics().borrow().clone();
    require_leader(&metrics)?;
    let membership = metrics.membership_config.membership();
    if membership.voter_ids().any(|id| id == request.id) {
        return Err(ApiError::new(StatusCode::CONFLICT, "already_voter", format!("node {} is a voter", request.id)));
    }
    if let Some(known) = membership.get_node(&request.id) {
        if known.addr != address {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "address_mismatch",
                format!("node {} is a learner at {}", request.id, known.addr),
            ));
        }
    }
    let timeout = request.timeout_ms.map_or(DEFAULT_CATCH_UP_TIMEOUT, Duration::from_millis);
    let started = tokio::time::Instant::now();
    enroll_anew(&node, request.id, &address).await?;
    let added = node.raft.add_learner(request.id, BasicNode { addr: address.clone() }, false);
    tokio::time::timeout(CHANGE_TIMEOUT, added)
        .await
        .map_err(|_| timed_out("adding the learner"))?
        .map_err(membership_error)?;
    // Caught up means holding the leader's log up to its end now, membership entry included,
    // as the leader's replication to it reports: nothing is assumed of a node that never answered.
    let end = node.raft.metrics().borrow().last_log_index.unwrap_or(0);
    let learner = request.id;
    let caught_up = node.replicated(|id| id == learner, end, timeout.saturating_sub(started.elapsed())).await;
    let status = if caught_up { StatusCode::OK } else { StatusCode::ACCEPTED };
    Ok((status, Json(LearnerAdded { id: request.id, address, caught_up })).into_response())
}

/// Enrolls the storage of the node at `address` for `id`, replacing what was enrolled for that id
/// (a node added back after its data directory was replaced). When it does not answer yet, what
/// was enrolled is forgotten, and the storage that first answers as `id` is enrolled.
async fn enroll_anew(node: &Node, id: NodeId, address: &str) -> Result<(), ApiError> {
    let incarnation = async {
        let client = node.http_client(Duration::from_secs(2)).ok()?;
        let status: ClusterStatus =
            client.get(format!("{address}{}", statestore_api::routes::CLUSTER)).send().await.ok()?.json().await.ok()?;
        (status.id == id).then_some(status.incarnation)
    }
    .await;
    let operation = Operation::Enroll { node: id, incarnation, replace: true };
    node.pipeline.execute(Work::Write(Entry { operation, wall_clock_ms: now_ms() })).await?;
    Ok(())
}

/// `POST /cluster/members {"promote": [4], "remove": [2]}`: changes the voters (joint consensus)
/// and removes nodes. Answers with the resulting status.
pub async fn change_members(State(node): State<Arc<Node>>, body: Bytes) -> Result<Json<ClusterStatus>, ApiError> {
    let request: MembershipChange = json_body(&body)?;
    if request.promote.is_empty() && request.remove.is_empty() {
        return Err(ApiError::bad_request("nothing to change: give `promote` and/or `remove`"));
    }
    if let Some(id) = request.promote.intersection(&request.remove).next() {
        return Err(ApiError::bad_request(format!("node {id} is both promoted and removed")));
    }
    let metrics = node.raft.metrics().borrow().clone();
    require_leader(&metrics)?;
    let membership = metrics.membership_config.membership();
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    let learners: BTreeSet<NodeId> = membership.learner_ids().collect();
    let unknown =
        |id: &NodeId| ApiError::new(StatusCode::NOT_FOUND, "unknown_node", format!("node {id} is not a member"));
    if let Some(id) = request.promote.iter().find(|id| !voters.contains(id) && !learners.contains(id)) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_node",
            format!("node {id} is not a learner; add it with POST /cluster/learners first"),
        ));
    }
    if let Some(id) = request.remove.iter().find(|id| !voters.contains(id) && !learners.contains(id)) {
        return Err(unknown(id));
    }
    let new_voters: BTreeSet<NodeId> =
        voters.union(&request.promote).filter(|id| !request.remove.contains(id)).copied().collect();
    // A voter that cannot vote (down, unreachable, far behind) weakens the quorum the moment it
    // is promoted: every promoted learner must first hold everything committed now.
    let committed = node.reader.committed_index();
    for id in request.promote.iter().filter(|id| learners.contains(id)) {
        if !node.replicated(|candidate| candidate == *id, committed, PROMOTE_CATCH_UP).await {
            let matched = node.raft.metrics().borrow().replication.as_ref().and_then(|r| r.get(id).copied().flatten());
            let address = membership.get_node(id).map(|n| n.addr.clone()).unwrap_or_default();
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "learner_behind",
                format!(
                    "node {id} has not caught up: it holds the log up to {} of the committed {committed} \
                     after {} s; is it running and reachable at {address}? Promote it once \
                     `cluster add-learner` reports it caught up",
                    matched.map_or("nothing".to_string(), |log_id| log_id.index.to_string()),
                    PROMOTE_CATCH_UP.as_secs()
                ),
            ));
        }
    }
    if new_voters.is_empty() {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "last_voter", "the cluster cannot remove its last voter"));
    }
    if new_voters != voters {
        let change = node.raft.change_membership(ChangeMembers::ReplaceAllVoters(new_voters), false);
        tokio::time::timeout(CHANGE_TIMEOUT, change)
            .await
            .map_err(|_| timed_out("the change"))?
            .map_err(membership_error)?;
    }
    let removed_learners: BTreeSet<NodeId> = request.remove.intersection(&learners).copied().collect();
    if !removed_learners.is_empty() {
        let change = node.raft.change_membership(ChangeMembers::RemoveNodes(removed_learners), false);
        tokio::time::timeout(CHANGE_TIMEOUT, change)
            .await
            .map_err(|_| timed_out("the change"))?
            .map_err(membership_error)?;
    }
    Ok(Json(cluster_status(&node)))
}

/// `POST /cluster/leader {"to": 2}`: moves leadership to voter 2 (without `to`: to any voter
/// whose log matches the leader's), every node running on. 200 with the new leader once it
/// leads; 409 `not_moved` with the reason when no voter took over within the handover deadline
/// (this node leads on); 404 / 400 for a `to` that is not another voter.
pub async fn move_leadership(State(node): State<Arc<Node>>, body: Bytes) -> Result<Json<LeadershipMoved>, ApiError> {
    let request: MoveLeadership = if body.is_empty() { MoveLeadership::default() } else { json_body(&body)? };
    let metrics = node.raft.metrics().borrow().clone();
    require_leader(&metrics)?;
    let membership = metrics.membership_config.membership();
    if let Some(to) = request.to {
        if to == node.id {
            return Err(ApiError::bad_request(format!("node {to} leads already")));
        }
        if !membership.voter_ids().any(|id| id == to) {
            let what = if membership.learner_ids().any(|id| id == to) { "a learner" } else { "not a member" };
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "unknown_node",
                format!("node {to} is {what}: only a voter can lead"),
            ));
        }
    }
    let started = std::time::Instant::now();
    match node.move_leadership(request.to).await {
        Ok(leader) => Ok(Json(LeadershipMoved { from: node.id, leader, millis: started.elapsed().as_millis() as u64 })),
        Err(why) => {
            let now = if node.raft.metrics().borrow().state == ServerState::Leader {
                format!("node {} leads on", node.id)
            } else {
                format!("node {} no longer leads; the voters elect a leader", node.id)
            };
            Err(ApiError::new(StatusCode::CONFLICT, "not_moved", format!("leadership did not move: {why}; {now}")))
        }
    }
}

/// Waits up to `deadline` until this node has applied up to `index`; false if it has not.
async fn applies_up_to(node: &Node, index: u64, deadline: Duration) -> bool {
    let mut metrics = node.raft.metrics();
    let reached = async {
        loop {
            if metrics.borrow_and_update().last_applied.is_some_and(|applied| applied.index >= index) {
                return true;
            }
            if metrics.changed().await.is_err() {
                return false;
            }
        }
    };
    index == 0 || tokio::time::timeout(deadline, reached).await.unwrap_or(false)
}

/// `GET /health`: the process is alive and Raft is running.
pub async fn health(State(node): State<Arc<Node>>) -> Response {
    let running = node.raft.metrics().borrow().running_state.is_ok();
    if running {
        (StatusCode::OK, Json(Up::new("ok"))).into_response()
    } else {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "stopped", "raft has stopped").into_response()
    }
}

/// `GET /ready`: this node is a member, knows a leader, has applied everything it knows to be
/// committed (or gets there within a lease), is connected to its broker with the request
/// subscription granted and the broker's round trip within its bound, its clock agrees with its leader's (or, leading, with most voters'),
/// and, when it leads, still reaches a quorum; when it follows, it heard from the leader within
/// two leases.
pub async fn ready(State(node): State<Arc<Node>>) -> Response {
    let status = cluster_status(&node);
    let member = status.voters.iter().chain(&status.learners).any(|m| m.id == node.id);
    let reason = if !member {
        Some("this node is not a member of the cluster".to_string())
    } else if status.leader.is_none() {
        Some("no leader is known".to_string())
    } else if !applies_up_to(&node, status.committed_index, node.elector.lease()).await {
        // Under load the applied index trails the committed one for the moment an apply takes;
        // only a node that does not get there within a lease is catching up.
        Some("catching up: applied index is behind the committed index".to_string())
    } else if let Some(took) = node.broker_slow.get().and_then(|slow| *slow.borrow()) {
        // Connected, but what the broker sends reaches this node late (a congested link).
        Some(format!(
            "the MQTT broker's round trip to this node took {} ms, over the bound of \
             --broker-round-trip-bound-ms",
            took.as_millis()
        ))
    } else if node.broker_connected.get().is_some_and(|connected| !*connected.borrow()) {
        // Connected is not enough: until the broker grants the request subscription, it drops
        // the requests it gets for want of a subscriber.
        Some("not connected to the MQTT broker with the request subscription granted".to_string())
    } else if let Some(why) = node.identity.replaced() {
        Some(why)
    } else if let Some(why) = clock_problem(&node, &status) {
        Some(why)
    } else if status.role != "leader" && !hears_the_leader(&node).await {
        // A follower cut off from the others still names the leader it last heard and has
        // applied all it knows to be committed; with the pre-vote it no longer raises its term
        // either, so silence is what tells it is behind.
        Some("no word from the leader for longer than two leases".to_string())
    } else if status.role == "leader" && !leads_a_quorum(&node).await {
        // A leader cut off from the others still believes it leads until it hears a higher
        // term; it cannot serve anything, so it is not ready.
        Some("the leader cannot reach a quorum".to_string())
    } else {
        None
    };
    match reason {
        None => {
            let broker_connected = node.broker_connected.get().map(|connected| *connected.borrow());
            (StatusCode::OK, Json(Up { broker_connected, ..Up::new("ready") })).into_response()
        }
        Some(reason) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "not_ready", reason).into_response(),
    }
}

/// Why this node's clock keeps it from serving, if it does: as a follower, beyond the bound from
/// its leader's; as the leader, at odds with most voters' clocks (`clock_watch`).
fn clock_problem(node: &Node, status: &ClusterStatus) -> Option<String> {
    if status.role == "leader" {
        match node.clock_check.verdict() {
            ClockVerdict::Disagrees(why) => Some(why),
            ClockVerdict::Agrees | ClockVerdict::Unknown => None,
        }
    } else {
        node.clock_check.off_from_leader()
    }
}

/// Whether a follower or learner heard from its leader within two leases (the election
/// timeout's upper bound each): a few late heartbeats on a busy machine do not make it unready.
async fn hears_the_leader(node: &Node) -> bool {
    node.elector.since_leader().await.is_some_and(|since| since <= 2 * node.elector.lease())
}

/// A heartbeat round reaches a quorum within two leases. One round alone is not enough to judge
/// by: openraft gives each peer the heartbeat interval (50 ms) to answer, which a healthy peer
/// on a loaded machine misses now and then, while a leader cut off from its peers misses every
/// round; so rounds are tried again for as long as a follower waits before it calls the leader
/// silent (`hears_the_leader`). Callers share one confirmation (`readiness`).
async fn leads_a_quorum(node: &Node) -> bool {
    let lease = node.elector.lease();
    node.readiness.leads_a_quorum(2 * lease, lease).await
}

/// `GET /metrics`: Prometheus text format.
pub async fn metrics(State(node): State<Arc<Node>>) -> Response {
    let text = node.metrics.render(&node.reader);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// `POST /cluster/snapshot`: asks this node to build a snapshot now (and purge its log below
/// it), whatever `--snapshot-every` and `--snapshot-log-bytes` say. Answers 202 at once; the
/// build runs in the background: `snapshot_index` in `GET /cluster` and
/// `statestore_snapshots_total{kind="built"}` show when it is done.
pub async fn snapshot(State(node): State<Arc<Node>>) -> Response {
    match node.request_snapshot().await {
        Ok(applied) => {
            let status = cluster_status(&node);
            let body =
                SnapshotRequested { requested: true, applied_index: applied, snapshot_index: status.snapshot_index };
            (StatusCode::ACCEPTED, Json(body)).into_response()
        }
        Err(e) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", format!("raft has stopped: {e}"))
            .into_response(),
    }
}
