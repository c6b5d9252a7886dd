//! The routes of a node's HTTP port and the headers they read. See docs/operations.md, *Cluster
//! API*.

/// `GET`: this node's view of the cluster ([`crate::body::ClusterStatus`]).
pub const CLUSTER: &str = "/cluster";
/// `POST` [`crate::body::AddLearner`]: answered [`crate::body::LearnerAdded`].
pub const LEARNERS: &str = "/cluster/learners";
/// `POST` [`crate::body::MembershipChange`]: answered [`crate::body::ClusterStatus`].
pub const MEMBERS: &str = "/cluster/members";
/// `POST` [`crate::body::MoveLeadership`]: answered [`crate::body::LeadershipMoved`].
pub const LEADER: &str = "/cluster/leader";
/// `POST`: build a snapshot now ([`crate::body::SnapshotRequested`]).
pub const SNAPSHOT: &str = "/cluster/snapshot";
/// `GET`: a backup of every key, streamed (`statestore_protocol::backup`).
pub const BACKUP: &str = "/cluster/backup";
/// `POST ?session=N&first=true|false` with backup key frames (`N` chosen by the client, the same for every chunk of one restore): answered [`crate::body::Restored`].
pub const RESTORE: &str = "/cluster/restore";
/// `POST`: one RESP3 request; the answer is the RESP3 reply.
pub const COMMAND: &str = "/v1/command";
/// `GET`: 200 while the process and Raft run.
pub const HEALTH: &str = "/health";
/// `GET`: 200 when this node serves; otherwise 503 with the reason.
pub const READY: &str = "/ready";
/// `GET`: Prometheus text format.
pub const METRICS: &str = "/metrics";

/// `/v1/command` request header: the request's HLC timestamp (`__ts`); the answer carries the
/// reply's version in it.
pub const TIMESTAMP_HEADER: &str = "statestore-ts";
/// `/v1/command` request header: the fencing token (`__ft`).
pub const FENCING_TOKEN_HEADER: &str = "statestore-ft";
/// `/v1/command` request header: the client id (`__srcId`).
pub const CLIENT_ID_HEADER: &str = "statestore-client-id";
/// The `/v1/command` query of a read answered from the applied state of the node it is sent to.
pub const LOCAL_CONSISTENCY_QUERY: &str = "consistency=local";
/// Marks a request a node has forwarded to its leader.
pub const FORWARDED_HEADER: &str = "x-statestore-forwarded-by";
