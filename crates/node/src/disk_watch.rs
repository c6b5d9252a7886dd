//! Leadership follows the disk.
//!
//! A leader sends its entries to the followers while it flushes them and commits only what it
//! has flushed (`crates/openraft`, its README), so a disk that stops returning from fsync no
//! longer stops its heartbeats: the followers would go on hearing a leader that cannot commit
//! anything, and every write would wait. So while a leader's Raft log fsync has run longer than
//! `--max-log-fsync-ms`, it hands leadership over: it stops its heartbeats and refuses new work
//! as a leader with a bad clock does ([`crate::clock_watch`]), and asks a voter whose log holds
//! its own to stand at once ([`Handover::DiskStalled`]: without waiting for its proposals to be
//! applied, and with its lease released on the other voters, as it cannot grant a vote itself).
//! If none does, the others elect one of themselves after their lease. It follows the new leader
//! (its core waits for its disk like any follower's). Should its disk return before another node
//! leads, it leads on.

use std::sync::Arc;
use std::time::Duration;

use statestore_raft::Handover;

use crate::node::Node;

/// Hands leadership over while this node leads with a log fsync running longer than `bound`.
pub(crate) async fn follow_disk(node: Arc<Node>, bound: Duration, every: Duration) {
    let id = node.id;
    let reader = node.reader.clone();
    let stalled = move || {
        let running = reader.log_fsync().running_for().filter(|running| *running >= bound)?;
        Some(format!(
            "node {id}'s Raft log fsync has not returned for {} ms; the bound is {} ms (--max-log-fsync-ms)",
            running.as_millis(),
            bound.as_millis()
        ))
    };
    node.hand_over_while(
        every,
        "this node's disk does not return",
        "this node's log fsync returned",
        Handover::DiskStalled,
        stalled,
    )
    .await;
}
