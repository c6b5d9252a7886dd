//! Leadership follows the broker connection.
//!
//! Every request and every answer goes through the broker, so a leader that has lost its broker
//! serves nobody while Raft, healthy, gives nobody a reason to take over. So:
//!
//! - A node that is not connected never stands for election ([`statestore_raft::Elector::restrain`]).
//! - A leader that has been without its broker for longer than the lease (the election
//!   timeout's upper bound) asks the other voters whether they are ready (`GET /ready`: connected
//!   to the broker, caught up, hearing the leader). If one is, it hands leadership over: it stops
//!   its heartbeats, refuses new work and asks that voter to stand at once
//!   ([`Node::hand_over_to`]); should it not, the followers stop hearing from the leader, and the
//!   first connected one whose pre-vote succeeds stands and wins (the leader grants that
//!   pre-vote too).
//! - If no other voter is ready (the broker is gone for everyone), it keeps leading and asks
//!   again a lease later. If nobody took over within [`HANDOVER_WINDOW`] leases, it resumes its
//!   heartbeats and tries again later.
//! - It takes leadership back only through an ordinary election, once connected again.
//!
//! Connected, here, means that requests reach the node in time: connected with the request
//! subscription granted, and the broker's round trip within its bound. Between a CONNACK without
//! a session and its SUBACK the broker drops the requests it gets for want of a subscriber; over
//! a congested link it delivers them, late, and every answer is as late (the connection's
//! round-trip probe, `--broker-round-trip-bound-ms`).
//!
//! A node started without a broker ([`without_broker`]) is treated as one that lost it, except
//! that it may lead while no voter with a connected broker is ready: a cluster used over HTTP
//! only has no broker at all.

use std::sync::Arc;
use std::time::Duration;

use openraft::ServerState;
use tokio::sync::watch;
use tokio::time::Instant;

use statestore_api::body::Up;
use statestore_raft::Restraint;

use crate::node::Node;

/// How often a node without its broker looks at its role.
const LOOK_EVERY: Duration = Duration::from_millis(50);
/// How many leases a handover may take before the leader resumes its heartbeats: the followers'
/// quiet period (one lease and a quarter of an election timeout), a pre-vote and a vote fit in three.
const HANDOVER_WINDOW: u32 = 5;

/// Where the leader is in handing over.
enum Handover {
    /// Connected, or not yet lost for a lease, or not leading.
    None,
    /// Leading without a broker and no other voter ready: ask again at this instant.
    AskAgainAt(Instant),
    /// Heartbeats stopped and new work refused since this instant.
    Since(Instant),
}

/// Follows `connected` (true while requests reach this node through the broker) until it closes.
pub(crate) async fn follow_broker(node: Arc<Node>, mut connected: watch::Receiver<bool>) {
    let lease = node.elector.lease();
    let Some(client) = readiness_client(&node, lease) else { return };
    loop {
        if *connected.borrow_and_update() {
            node.elector.restrain(Restraint::NoBroker, false);
            if connected.changed().await.is_err() {
                return;
            }
            continue;
        }
        node.elector.restrain(Restraint::NoBroker, true);
        let lost = Instant::now();
        let mut handover = Handover::None;
        let mut look = tokio::time::interval(LOOK_EVERY);
        loop {
            tokio::select! {
                changed = connected.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if *connected.borrow() {
                        break;
                    }
                }
                _ = look.tick() => {}
            }
            let leads = node.raft.metrics().borrow().state == ServerState::Leader;
            handover = match handover {
                Handover::Since(_) if !leads => {
                    tracing::info!("another node leads now; following it until the broker is back");
                    node.resume_serving();
                    Handover::None
                }
                Handover::Since(since) if since.elapsed() >= lease * HANDOVER_WINDOW => {
                    tracing::warn!("no other node took over; leading on and asking again later");
                    node.resume_serving();
                    Handover::AskAgainAt(Instant::now() + lease * HANDOVER_WINDOW)
                }
                Handover::Since(since) => Handover::Since(since),
                _ if !leads => Handover::None,
                Handover::AskAgainAt(at) if Instant::now() < at => Handover::AskAgainAt(at),
                Handover::None if lost.elapsed() < lease => Handover::None,
                Handover::None | Handover::AskAgainAt(_) => match ready_voter(&node, &client).await {
                    Some(peer) => {
                        tracing::warn!(
                            lost_ms = lost.elapsed().as_millis() as u64,
                            peer,
                            "requests have not reached this node through its broker (no connection, or a round trip \
                             over the bound) for longer than the lease: handing leadership to a node they reach"
                        );
                        let why = format!(
                            "node {} is not reached through its broker in time and hands leadership over; try again \
                             shortly",
                            node.id
                        );
                        node.hand_over_to(Some(peer), why, statestore_raft::Handover::Settled).await;
                        Handover::Since(Instant::now())
                    }
                    None => Handover::AskAgainAt(Instant::now() + lease),
                },
            };
        }
        if let Handover::Since(_) = handover {
            tracing::info!("the broker is back before another node took over: leading on");
            node.resume_serving();
        }
    }
}

/// The client that asks peers whether they are ready, with `timeout` per request.
fn readiness_client(node: &Node, timeout: Duration) -> Option<reqwest::Client> {
    node.http_client(timeout)
        .inspect_err(|e| {
            tracing::error!(error = %e, "cannot build the HTTP client that asks peers whether they are ready");
        })
        .ok()
}

/// The first other voter whose `/ready` answers 200 and says it is connected to its broker: it
/// is caught up, hears this leader and can serve MQTT clients.
async fn ready_voter(node: &Node, client: &reqwest::Client) -> Option<u64> {
    let asks = node.elector.other_voters().into_iter().map(|(id, url)| async move {
        let answer = client.get(format!("{url}/ready")).send().await.ok().filter(|r| r.status().is_success())?;
        let up: Up = answer.json().await.ok()?;
        (up.broker_connected == Some(true)).then_some(id)
    });
    futures::future::join_all(asks).await.into_iter().flatten().next()
}

/// Leadership of a node started without a broker (it serves HTTP only). In a cluster used over
/// HTTP only it leads like any other node. While another voter is ready with its broker
/// connected, it does not stand for election, and if it leads it hands leadership over as a
/// leader that lost its broker does: MQTT clients would otherwise go unanswered for as long as
/// it leads. Looks every [`HANDOVER_WINDOW`] leases.
pub(crate) async fn without_broker(node: Arc<Node>) {
    let lease = node.elector.lease();
    let Some(client) = readiness_client(&node, lease) else { return };
    let mut look = tokio::time::interval(lease * HANDOVER_WINDOW);
    let mut handing_over: Option<Instant> = None;
    loop {
        look.tick().await;
        let leads = node.raft.metrics().borrow().state == ServerState::Leader;
        handing_over = match handing_over {
            Some(_) if !leads => {
                tracing::info!("a node with its broker leads now; following it");
                node.resume_serving();
                None
            }
            Some(since) if since.elapsed() >= lease * HANDOVER_WINDOW => {
                tracing::warn!("no node with a broker took over; leading on");
                node.resume_serving();
                node.elector.restrain(Restraint::NoBroker, false);
                None
            }
            Some(since) => Some(since),
            None => {
                let brokered = ready_voter(&node, &client).await;
                node.elector.restrain(Restraint::NoBroker, brokered.is_some());
                match brokered {
                    Some(peer) if leads => {
                        tracing::warn!(
                            peer,
                            "this node has no broker and leads: handing leadership to a node connected to its broker"
                        );
                        let why =
                            format!("node {} has no broker and hands leadership over; try again shortly", node.id);
                        node.hand_over_to(Some(peer), why, statestore_raft::Handover::Settled).await;
                        Some(Instant::now())
                    }
                    _ => None,
                }
            }
        };
    }
}
