//! One log line per cluster event a node sees: a leader change, a membership change, a new
//! snapshot. With the default filter (`warn,statestore=info`) these and the broker's
//! (re)connections are what a healthy node logs.

use std::sync::Arc;

use crate::node::Node;

/// Logs the events of `node`'s Raft metrics until Raft stops.
pub(crate) async fn log_cluster_events(node: Arc<Node>) {
    let mut changes = node.raft.metrics();
    let (mut leader, mut membership, mut snapshot) = (None, None, None);
    loop {
        // Copy out and release the borrow before the next await.
        let current = changes.borrow_and_update().clone();
        if current.current_leader != leader {
            leader = current.current_leader;
            match leader {
                Some(id) if id == node.id => tracing::info!(term = current.current_term, "this node leads"),
                Some(id) => tracing::info!(term = current.current_term, leader = id, "node {id} leads"),
                None => tracing::info!(term = current.current_term, "no leader is known"),
            }
        }
        let config = current.membership_config.clone();
        if membership.as_ref() != Some(config.log_id()) {
            if membership.is_some() {
                let voters: Vec<_> = config.membership().voter_ids().collect();
                let learners: Vec<_> = config.membership().learner_ids().collect();
                tracing::info!(?voters, ?learners, "the membership changed");
            }
            membership = Some(*config.log_id());
        }
        if current.snapshot != snapshot {
            snapshot = current.snapshot;
            if let Some(at) = snapshot {
                tracing::info!(index = at.index, "a snapshot covers the log up to {}", at.index);
            }
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}
