//! Who is on the other end of a Raft message: the cluster's name and the member's storage.
//!
//! A data directory gets a random *incarnation* when it is created ([`incarnation`]), and the
//! leader enrolls each member's incarnation in the replicated state (and names the cluster
//! once). Every Raft request carries the sender's id, incarnation and cluster name, and the
//! incarnation the sender has enrolled for the receiver; every answer carries the receiver's
//! incarnation and cluster name. A message is refused when a side belongs to another cluster,
//! or when a member's incarnation is not the one enrolled for it: its data directory was wiped or
//! replaced (it may have voted in this term already, and its log is gone), or another node uses
//! its id. Such a node must be removed and added back as a new learner, which enrolls its new
//! storage. Messages without these headers (a node that does not send them) are not checked.
//!
//! A cluster restored from a backup copies one node's directory to every node, so its
//! enrollments describe the old cluster: nodes started with `--restored` do not check them until
//! the restored cluster's first leader names it anew, which forgets them; then every member is
//! enrolled again. The old cluster's names are every name the backup holds: the applied one and
//! any that its log gives above what was applied (a copy taken before its node applied the entry
//! naming the cluster); applying one of those from the log does not end the wait, nor does a
//! restart before the new name, with the flag or without ([`begin_restore`]). Once named
//! anew, a node still takes messages from a member that claims one of those names if the new
//! cluster has enrolled that member's new storage: it has not applied the new name yet.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rocksdb::DB;
use statestore_statemachine::StorageError;

use crate::db::{cf, synced, RAFT_META_CF};
use crate::types::NodeId;
use crate::StateReader;

/// The sender's storage incarnation, on every Raft request and answer.
pub const INCARNATION_HEADER: &str = "x-statestore-incarnation";
/// The sender's cluster name, once it knows one, on every Raft request and answer.
pub const CLUSTER_HEADER: &str = "x-statestore-cluster";
/// On a request: the incarnation the sender has enrolled for the receiver.
pub const EXPECTED_HEADER: &str = "x-statestore-expected-incarnation";

const INCARNATION_KEY: &[u8] = b"incarnation";
/// The backup's names while a restore waits for the cluster's new name.
const RESTORING_KEY: &[u8] = b"restoring";

/// A fresh random id: 32 hex digits.
pub fn random_id() -> String {
    format!("{:032x}", fastrand::u128(..))
}

/// This data directory's incarnation, created (and synced) the first time, or anew when the
/// directory is a copy (`fresh`): a restored backup is new storage.
pub fn incarnation(db: &DB, fresh: bool) -> Result<String, rocksdb::Error> {
    if let Some(bytes) = db.get_cf(cf(db, RAFT_META_CF), INCARNATION_KEY)?.filter(|_| !fresh) {
        if let Ok(text) = String::from_utf8(bytes) {
            return Ok(text);
        }
    }
    let fresh = random_id();
    db.put_cf_opt(cf(db, RAFT_META_CF), INCARNATION_KEY, fresh.as_bytes(), &synced())?;
    Ok(fresh)
}

/// Records (synced) that this directory holds a restored backup naming the cluster `names`,
/// until the restored cluster is named anew: a node that restarts before then, with
/// `--restored` or without, still waits for the new name instead of checking the backup's
/// enrollments (which describe the old cluster's storage, not this node's new incarnation).
pub fn begin_restore(db: &DB, names: &[String]) -> Result<(), String> {
    let bytes = crate::wire::encode(&names).map_err(|e| e.to_string())?;
    db.put_cf_opt(cf(db, RAFT_META_CF), RESTORING_KEY, bytes, &synced()).map_err(|e| e.to_string())
}

/// The backup's names if a restore began here ([`begin_restore`]) and the cluster as applied
/// here (`applied_name`) has not been named anew since; a restore that has ended is forgotten.
pub fn pending_restore(db: &DB, applied_name: Option<&str>) -> Result<Option<Vec<String>>, String> {
    let Some(bytes) = db.get_cf(cf(db, RAFT_META_CF), RESTORING_KEY).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let names: Vec<String> = crate::wire::decode(&bytes).map_err(|e| e.to_string())?;
    if applied_name.is_none_or(|applied| names.iter().any(|name| name == applied)) {
        return Ok(Some(names));
    }
    db.delete_cf_opt(cf(db, RAFT_META_CF), RESTORING_KEY, &synced()).map_err(|e| e.to_string())?;
    Ok(None)
}

/// What the applied state says of identities: the cluster's name and every enrollment.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct IdentityRecords {
    pub cluster_id: Option<String>,
    pub enrollments: BTreeMap<NodeId, String>,
}

/// The applied [`IdentityRecords`], kept in memory: every Raft message checks them on both
/// sides, and they change only when an `Enroll` or `NameCluster` entry is applied or a snapshot
/// is installed, which call [`IdentityMemo::changed`] once their writes are visible.
#[derive(Debug, Default)]
pub struct IdentityMemo {
    /// How many identity changes were applied.
    changes: AtomicU64,
    /// The records last read, and the count of changes read before reading them.
    kept: Mutex<Option<(u64, Arc<IdentityRecords>)>>,
}

impl IdentityMemo {
    /// The applied records have changed (or may have): the kept copy is stale.
    pub fn changed(&self) {
        self.changes.fetch_add(1, Ordering::AcqRel);
    }

    /// The kept records, or `read`'s when a change was applied since they were read. The count
    /// is taken before `read` runs: a change applied meanwhile makes the next call read again.
    pub fn get(
        &self,
        read: impl FnOnce() -> Result<IdentityRecords, StorageError>,
    ) -> Result<Arc<IdentityRecords>, StorageError> {
        let changes = self.changes.load(Ordering::Acquire);
        if let Some((read_at, records)) = &*self.kept.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) {
            if *read_at == changes {
                return Ok(records.clone());
            }
        }
        let records = Arc::new(read()?);
        *self.kept.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some((changes, records.clone()));
        Ok(records)
    }
}

/// This node's identity and what the replicated state says of its peers. Cheap to clone.
#[derive(Clone)]
pub struct PeerIdentity {
    pub me: NodeId,
    pub incarnation: String,
    reader: StateReader,
    /// The incarnation each peer last showed, enrolled or not.
    seen: Arc<Mutex<BTreeMap<NodeId, String>>>,
    /// Started on a restored backup: every name the backup gives the cluster. Until the
    /// cluster has another name, enrollments (the backup's) are not checked.
    restored_from: Option<Arc<BTreeSet<String>>>,
}

/// What a peer's message said about it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Claims<'a> {
    pub incarnation: Option<&'a str>,
    pub cluster: Option<&'a str>,
    /// On a request: the incarnation the sender expects this node to have.
    pub expected: Option<&'a str>,
}

impl PeerIdentity {
    pub fn new(me: NodeId, incarnation: String, reader: StateReader) -> PeerIdentity {
        PeerIdentity { me, incarnation, reader, seen: Arc::default(), restored_from: None }
    }

    /// This node starts on a backup restored into its data directory, which names the cluster
    /// `backup_names` (`NodeStorage::backup_names`): enrollments are not checked until the
    /// cluster, restored as a new one, is named anew ([`PeerIdentity::suspended`]).
    pub fn restored(mut self, backup_names: impl IntoIterator<Item = String>) -> PeerIdentity {
        self.restored_from = Some(Arc::new(backup_names.into_iter().collect()));
        self
    }

    /// Whether checks wait for the restored cluster's new name.
    pub fn suspended(&self) -> bool {
        self.suspended_at(self.cluster_id().as_deref())
    }

    /// Whether checks wait for the restored cluster's new name, the cluster being named `ours`.
    fn suspended_at(&self, ours: Option<&str>) -> bool {
        self.restored_from.as_ref().is_some_and(|old| ours.is_none_or(|ours| old.contains(ours)))
    }

    /// Whether a peer that says it belongs to cluster `theirs`, with storage `incarnation`, is a
    /// member of this restored cluster that has not yet applied the cluster's new name: `theirs`
    /// is a name the backup gives, and the new cluster has enrolled the peer's new storage
    /// (which no node of the old cluster has). Until it has, such a peer would never learn the
    /// new name: an appends stream to it is refused at its first answer.
    fn renaming(&self, theirs: &str, incarnation: Option<&str>, enrolled: Option<&String>) -> bool {
        self.restored_from.as_ref().is_some_and(|old| old.contains(theirs))
            && incarnation.is_some_and(|incarnation| enrolled.is_some_and(|enrolled| enrolled == incarnation))
    }

    /// The cluster's name and every enrollment as applied here, if they can be read: one read
    /// for everything a message is stamped or checked with.
    pub fn records(&self) -> Option<Arc<IdentityRecords>> {
        self.reader.identity_records().ok()
    }

    /// The cluster's name, when this node has applied it.
    pub fn cluster_id(&self) -> Option<String> {
        self.reader.cluster_id().ok().flatten()
    }

    /// The incarnation enrolled for `node`, if any.
    pub fn enrolled(&self, node: NodeId) -> Option<String> {
        self.reader.enrolled(node).ok().flatten()
    }

    /// The incarnation each peer last showed.
    pub fn seen(&self) -> BTreeMap<NodeId, String> {
        self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Why this node's own storage is not the one enrolled for its id, if it is not.
    pub fn replaced(&self) -> Option<String> {
        if self.suspended() {
            return None;
        }
        let enrolled = self.enrolled(self.me)?;
        (enrolled != self.incarnation).then(|| {
            format!(
                "this node's storage (incarnation {}) is not the one enrolled for node {} ({enrolled}): its data directory was replaced; remove node {} and add it back as a new learner",
                self.incarnation, self.me, self.me
            )
        })
    }

    /// Checks what `peer` says of itself (and, on a request, of this node); why not, if it must
    /// be refused.
    pub fn check(&self, peer: NodeId, claims: &Claims) -> Result<(), String> {
        if let Some(incarnation) = claims.incarnation {
            self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(peer, incarnation.to_string());
        }
        let records = self.records();
        let ours = records.as_ref().and_then(|records| records.cluster_id.as_deref());
        if self.suspended_at(ours) {
            return Ok(());
        }
        let enrolled = records.as_ref().and_then(|records| records.enrollments.get(&peer));
        if let (Some(theirs), Some(ours)) = (claims.cluster, ours) {
            if theirs != ours && !self.renaming(theirs, claims.incarnation, enrolled) {
                return Err(format!("node {peer} belongs to cluster {theirs}, node {} to cluster {ours}", self.me));
            }
        }
        if let Some(expected) = claims.expected.filter(|expected| *expected != self.incarnation) {
            return Err(format!(
                "node {peer} has storage incarnation {expected} enrolled for node {}, whose storage is {}: its data directory was replaced; remove node {} and add it back as a new learner",
                self.me, self.incarnation, self.me
            ));
        }
        let Some(incarnation) = claims.incarnation else { return Ok(()) };
        match enrolled {
            Some(enrolled) if enrolled != incarnation => Err(format!(
                "node {peer}'s storage is incarnation {incarnation}, but {enrolled} is enrolled: its data directory was replaced, or another node uses its id; remove node {peer} and add it back as a new learner"
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_restore_is_pending_until_the_cluster_is_named_anew() {
        let dir = tempfile::tempdir().unwrap();
        let db = crate::db::open(dir.path(), &Arc::default()).unwrap();
        assert_eq!(pending_restore(&db, Some("old")).unwrap(), None, "no restore began");
        let names = vec!["old".to_string(), "older".to_string()];
        begin_restore(&db, &names).unwrap();
        assert_eq!(pending_restore(&db, None).unwrap().as_ref(), Some(&names), "not named yet");
        assert_eq!(pending_restore(&db, Some("older")).unwrap().as_ref(), Some(&names), "a backup's name");
        assert_eq!(pending_restore(&db, Some("new")).unwrap(), None, "named anew");
        assert_eq!(pending_restore(&db, None).unwrap(), None, "an ended restore is forgotten");
    }
}
