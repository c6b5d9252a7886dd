//! The JSON bodies of the cluster API, as the node writes and reads them and as clients read
//! and write them.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::NodeId;

/// A member of the cluster and the URL the others reach it at.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq, Clone)]
pub struct Member {
    pub id: NodeId,
    pub address: String,
}

/// `GET /cluster`: a node's view of the cluster; also the answer to a membership change.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq, Clone)]
pub struct ClusterStatus {
    pub id: NodeId,
    /// `leader`, `follower`, `candidate`, `learner` or `shutdown`.
    pub role: String,
    pub term: u64,
    pub leader: Option<Member>,
    pub voters: Vec<Member>,
    pub learners: Vec<Member>,
    pub last_log_index: u64,
    pub committed_index: u64,
    pub applied_index: u64,
    pub snapshot_index: u64,
    pub purged_index: u64,
    /// The cluster's name, once its first leader gave it one.
    pub cluster_id: Option<String>,
    /// The random id this node's data directory got when it was created.
    pub incarnation: String,
    /// Whether this node runs on a restored backup and waits for the restored cluster's first
    /// leader to name it anew.
    #[serde(default)]
    pub restoring: bool,
    /// The storage incarnation enrolled for each member.
    pub enrolled: BTreeMap<NodeId, String>,
    /// The peers none of whose Raft requests from this node have been answered lately, each with
    /// how many milliseconds that has lasted (the leader's view is the one to read).
    #[serde(default)]
    pub not_answering_ms: BTreeMap<NodeId, u64>,
}

/// `POST /cluster/learners`: add a non-voting member and wait until it has caught up.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq, Clone)]
#[serde(deny_unknown_fields)]
pub struct AddLearner {
    pub id: NodeId,
    pub address: String,
    /// How long to wait for the learner to catch up; default 30 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// The answer to [`AddLearner`]: 200 when it caught up, 202 while it still catches up.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq, Clone)]
pub struct LearnerAdded {
    pub id: NodeId,
    pub address: String,
    /// The learner has the leader's log up to the index it had when it was added.
    pub caught_up: bool,
}

/// `POST /cluster/members`: make learners voters, remove members (at least one of the two).
#[derive(Debug, Default, Serialize, Deserialize, PartialEq, Eq, Clone)]
#[serde(deny_unknown_fields)]
pub struct MembershipChange {
    /// Learners to make voters.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub promote: BTreeSet<NodeId>,
    /// Voters or learners to remove from the cluster.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub remove: BTreeSet<NodeId>,
}

/// `POST /cluster/leader`: move leadership to another voter, every node running on.
#[derive(Debug, Default, Serialize, Deserialize, PartialEq, Eq, Clone)]
#[serde(deny_unknown_fields)]
pub struct MoveLeadership {
    /// The voter to lead next; without it, any voter whose log matches the leader's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<NodeId>,
}

/// The answer to `POST /cluster/leader` (200): leadership moved.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq, Clone)]
pub struct LeadershipMoved {
    /// The node that led before.
    pub from: NodeId,
    /// The node that leads now.
    pub leader: NodeId,
    /// How long the move took, in milliseconds.
    pub millis: u64,
}

/// The answer to `POST /cluster/snapshot` (202): the build runs in the background.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq, Clone)]
pub struct SnapshotRequested {
    pub requested: bool,
    /// The index the snapshot will cover at least.
    pub applied_index: u64,
    /// The latest snapshot's index now; it moves when the build is done.
    pub snapshot_index: u64,
}

/// The answer to one `POST /cluster/restore` chunk.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq, Clone)]
pub struct Restored {
    /// Keys this chunk stored.
    pub restored: u64,
}

/// `GET /health` and `GET /ready` when all is well: `{"status": "ok"}`, `{"status": "ready",
/// "broker_connected": true}`.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq, Clone)]
pub struct Up {
    pub status: String,
    /// `/ready` only: whether the node is connected to its MQTT broker; absent when it was
    /// started without one (it serves HTTP only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broker_connected: Option<bool>,
}

impl Up {
    pub fn new(status: &str) -> Up {
        Up { status: status.to_string(), broker_connected: None }
    }
}

/// Every error answer of the HTTP API (4xx and 5xx): a stable code, a message for people, and
/// where the leader is when the request belongs there.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq, Clone)]
pub struct ErrorBody {
    /// E.g. `bad_request`, `not_leader`, `learner_behind`, `not_ready`, `unauthorized`.
    pub code: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_id: Option<NodeId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_address: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_read_what_they_write_and_refuse_unknown_fields() {
        let change = MembershipChange { promote: BTreeSet::from([4]), remove: BTreeSet::new() };
        let text = serde_json::to_string(&change).unwrap();
        assert_eq!(text, r#"{"promote":[4]}"#);
        assert_eq!(serde_json::from_str::<MembershipChange>(&text).unwrap(), change);
        assert!(serde_json::from_str::<MembershipChange>(r#"{"promote":[4],"drop":[2]}"#).is_err());
        let add: AddLearner = serde_json::from_str(r#"{"id":4,"address":"http://n4:7400"}"#).unwrap();
        assert_eq!(add.timeout_ms, None);
        assert_eq!(serde_json::to_string(&add).unwrap(), r#"{"id":4,"address":"http://n4:7400"}"#);
        let error: ErrorBody = serde_json::from_str(r#"{"code":"not_leader","message":"m","leader_id":2}"#).unwrap();
        assert_eq!((error.leader_id, error.leader_address), (Some(2), None));
    }
}
