//! The leader names the cluster once and enrolls each member's storage incarnation in the
//! replicated state, as it first sees it (`statestore_raft::identity`). From then on every Raft
//! message from or to a member whose data directory was wiped or replaced, or from a node of
//! another cluster, is refused. Adding a learner enrolls its storage anew
//! ([`crate::http::cluster::add_learner`]): that is how a replaced node comes back.

use std::sync::Arc;
use std::time::Duration;

use openraft::ServerState;
use statestore_raft::identity::random_id;
use statestore_statemachine::{Entry, Operation};

use crate::node::{now_ms, Node};
use crate::pipeline::Work;

/// How often the leader looks for members to enroll.
const EVERY: Duration = Duration::from_secs(1);

pub(crate) async fn enroll_members(node: Arc<Node>) {
    let mut ticks = tokio::time::interval(EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let (state, members) = {
            let metrics = node.raft.metrics();
            let metrics = metrics.borrow();
            let members: Vec<u64> = metrics.membership_config.membership().nodes().map(|(id, _)| *id).collect();
            (metrics.state, members)
        };
        match state {
            ServerState::Shutdown => return,
            ServerState::Leader => {}
            _ => continue,
        }
        let mut operations = Vec::new();
        if node.identity.suspended() {
            // A restored cluster is a new one: a new name, and every member enrolled again. Only
            // over the name applied here: another leader's rename may be in the log already.
            tracing::info!("naming the restored cluster anew");
            operations.push(Operation::RenameCluster { id: random_id(), replaces: node.identity.cluster_id() });
        } else if node.identity.cluster_id().is_none() {
            operations.push(Operation::NameCluster { id: random_id(), anew: false });
        }
        let seen = node.identity.seen();
        for id in members.into_iter().filter(|_| !node.identity.suspended()) {
            if node.identity.enrolled(id).is_some() {
                continue;
            }
            let incarnation =
                if id == node.id { Some(node.identity.incarnation.clone()) } else { seen.get(&id).cloned() };
            if let Some(incarnation) = incarnation {
                tracing::info!(node = id, incarnation, "enrolling a member's storage");
                operations.push(Operation::Enroll { node: id, incarnation: Some(incarnation), replace: false });
            }
        }
        for operation in operations {
            let entry = Entry { operation, wall_clock_ms: now_ms() };
            // A failure is tried again at the next tick.
            let _ = node.pipeline.execute(Work::Write(entry)).await;
        }
    }
}
