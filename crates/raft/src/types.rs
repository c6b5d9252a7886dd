//! The openraft type configuration of the state store.

use serde::{Deserialize, Serialize};
use statestore_statemachine::Applied;

/// A node's id: a positive integer chosen by the operator, never reused with an empty log.
pub type NodeId = u64;

/// A node's address as other nodes and clients reach it: `http://host:port`.
pub type Node = openraft::BasicNode;

openraft::declare_raft_types!(
    /// The Raft types of the state store: log entries carry a [`SharedProposal`], and applying
    /// one yields an [`ApplyResult`].
    pub TypeConfig:
        D = SharedProposal,
        R = ApplyResult,
        NodeId = NodeId,
        Node = Node,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = tokio::fs::File,
        AsyncRuntime = openraft::TokioRuntime,
);

/// A log entry's proposal, shared: openraft reads an entry back once per follower to replicate it
/// and once to apply it, and each of those copies is a reference count instead of a copy of every
/// key, value and identity in the batch. It is encoded as the proposal itself.
pub type SharedProposal = std::sync::Arc<statestore_statemachine::Proposal>;

/// What applying one log entry produced: one [`Applied`] per entry of its proposal, in order.
/// Blank and membership entries produce none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyResult {
    pub applied: Vec<Applied>,
}

pub type Raft = openraft::Raft<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, Node>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, Node>;
pub type Snapshot = openraft::Snapshot<TypeConfig>;
pub type LogEntry = openraft::Entry<TypeConfig>;
pub type RaftStorageError = openraft::StorageError<NodeId>;
pub type RaftMetrics = openraft::RaftMetrics<NodeId, Node>;
