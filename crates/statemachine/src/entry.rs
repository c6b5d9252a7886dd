//! What goes into the replicated log, and what applying it yields.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use statestore_protocol::topic::notification_topic;
use statestore_protocol::{Hlc, Notification, Request, Response, StoreError};

/// What one Raft log entry carries: the entries the leader proposed together, applied in order
/// in one batch. Batching many requests into one log entry lets one leader fsync, one append
/// request and one apply serve them all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    pub entries: Vec<Entry>,
}

/// One operation with its proposer's clock. Everything apply needs is in here or in the stored
/// state, so every replica computes the same result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub operation: Operation,
    /// The proposer's wall clock (ms since the epoch) when it proposed the entry. Apply judges
    /// time by `max(this, the latest time already applied)`, so state-machine time never goes back.
    pub wall_clock_ms: u64,
}

impl Entry {
    /// Roughly how many bytes the entry takes in the log: what batches are bounded by.
    pub fn approx_bytes(&self) -> usize {
        const FIXED: usize = 64;
        FIXED
            + match &self.operation {
                Operation::Request(request) => {
                    request.request.command.data_len()
                        + request.client_id.as_ref().map_or(0, String::len)
                        + request.identity.as_ref().map_or(0, |i| i.response_topic.len() + i.correlation_data.len())
                }
                Operation::Expire { key, .. } => key.len(),
                Operation::DropRegistrations { client_id } => client_id.len(),
                Operation::ConfirmNotifications { .. } => 0,
                Operation::Enroll { incarnation, .. } => incarnation.as_ref().map_or(0, String::len),
                Operation::NameCluster { id, .. } => id.len(),
                Operation::RenameCluster { id, replaces } => id.len() + replaces.as_ref().map_or(0, String::len),
                Operation::Restore { keys, .. } | Operation::RestoreChunk { keys, .. } => {
                    keys.iter().map(|k| k.key.len() + k.value.len() + 64).sum()
                }
            }
    }
}

/// What an entry asks the state machine to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Operation {
    /// A client request received over MQTT.
    Request(ClientRequest),
    /// The leader's sweeper found `key` past its deadline; delete it if its version is still
    /// `version` (a later SET may have renewed it meanwhile).
    Expire {
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        version: Hlc,
    },
    /// Remove every KEYNOTIFY registration of a client (its session is gone).
    DropRegistrations { client_id: String },
    /// Notifications up to and including `through` were published: drop them from the outbox.
    ConfirmNotifications { through: u64 },
    /// Records the storage incarnation of member `node` (the random id its data directory got
    /// when it was created); `None` forgets it. Without `replace` a recorded one stays.
    Enroll { node: u64, incarnation: Option<String>, replace: bool },
    /// Names the cluster once; a later name is ignored, unless `anew`: then the cluster takes
    /// this name and forgets every enrollment. Leaders propose [`Operation::RenameCluster`] for
    /// a restored cluster now; `anew` stays for logs written before it.
    NameCluster { id: String, anew: bool },
    /// Loads keys from a backup as they were, without a session: leaders propose
    /// [`Operation::RestoreChunk`] now; this stays for logs written before it.
    Restore { first: bool, keys: Vec<statestore_protocol::backup::BackupKey> },
    /// Names a cluster restored from a backup anew (it is a new cluster) and forgets every
    /// enrollment, if its name is still `replaces`, the one its proposer had applied; otherwise
    /// ignored. So when two leaders in turn propose a name before either is applied, the first
    /// applied stays, and every node ends with the same one.
    RenameCluster { id: String, replaces: Option<String> },
    /// Loads keys from a backup (`statestore-cli snapshot restore`) as they were: value, version,
    /// fencing token and deadline. The `first` chunk opens restore `session`, and is refused
    /// unless the store holds no key; a later chunk is refused unless it belongs to the session
    /// and no client has written a key since the session began. Chunks over the quotas are
    /// refused whole. Versions issued afterwards are newer than every restored one.
    RestoreChunk { session: u64, first: bool, keys: Vec<statestore_protocol::backup::BackupKey> },
}

/// A client request with the envelope facts apply needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientRequest {
    pub request: Request,
    /// `__srcId`, or the client id of a `clients/{id}/` response topic.
    pub client_id: Option<String>,
    /// Identifies the request for deduplication. `None` disables dedup for it.
    pub identity: Option<RequestIdentity>,
    /// The MQTT message expiry of the request in seconds: how long the client may retry it.
    pub message_expiry_secs: Option<u32>,
}

/// (response topic, correlation data): the same pair again is the same request.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RequestIdentity {
    pub response_topic: String,
    #[serde(with = "serde_bytes")]
    pub correlation_data: Vec<u8>,
}

/// The answer to a request: the RESP payload and the `__ts` to send with it, if any.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    pub response: Response,
    pub version: Option<Hlc>,
}

impl Reply {
    pub fn new(response: Response, version: Option<Hlc>) -> Reply {
        Reply { response, version }
    }

    pub fn error(error: StoreError) -> Reply {
        Reply { response: Response::Error(error), version: None }
    }
}

/// A notification for one registered client about one key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyNotification {
    pub client_id: String,
    /// Shared by every watcher's notification of one change.
    pub key: Bytes,
    pub notification: Notification,
    /// The `__ts` of the notification: the key's new version, or the deletion's version.
    pub version: Hlc,
}

impl KeyNotification {
    /// The topic to publish on. Registration refuses keys whose topic would be too long, so this
    /// is `Some` for every notification apply produces.
    pub fn topic(&self) -> Option<String> {
        notification_topic(&self.client_id, &self.key)
    }
}

/// A notification with its place in the outbox; published in `seq` order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboxEntry {
    pub seq: u64,
    pub notification: KeyNotification,
}

/// The result of applying one entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    pub reply: Reply,
    /// Notifications this entry produced, in the order they must be published.
    pub notifications: Vec<OutboxEntry>,
    /// The reply came from the dedup table: the request had been applied before.
    pub deduplicated: bool,
}
