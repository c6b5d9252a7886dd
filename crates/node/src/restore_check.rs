//! `--restored` makes a data directory new storage, so it must be given only to a fresh copy of a
//! backup, with the old cluster stopped. Before it does, a node asks its peers whether the cluster
//! its directory names still runs: a peer that serves one of those names and is not itself
//! restoring means the flag was left over from a restore that has ended (or the backup went into
//! one node of a running cluster). Made new storage, the node would be refused by every peer
//! until it was added again as a learner; it stops instead, naming the flag, with its directory
//! untouched, so that a start without the flag serves as before.

use std::collections::BTreeMap;
use std::time::Duration;

use statestore_raft::NodeId;

use crate::config::NodeConfig;

/// How long each peer may take to say what it serves. A peer that does not answer is taken for
/// stopped, as every node of a cluster being restored is.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(1);

/// A peer serves a cluster the directory started with `--restored` names.
#[derive(Debug, thiserror::Error)]
#[error(
    "--restored (STATESTORE_RESTORED) was given, but node {peer} at {address} serves the cluster {name} that \
     this data directory names and is not restoring: this directory is that cluster's storage, not a fresh copy \
     of a backup. If the flag was left over from a restore that has ended, start without it; to restore a \
     backup, first stop every node of the old cluster (docs/operations.md, \"Backups\"). The data directory \
     was not changed"
)]
pub struct OldClusterRunning {
    pub peer: NodeId,
    pub address: String,
    pub name: String,
}

/// The peers to ask, each at the address this node reaches it by: the `members` the directory
/// has applied and `--initial-members`, `--peer-routes` applied, this node left out.
pub fn peers(config: &NodeConfig, members: BTreeMap<NodeId, String>) -> BTreeMap<NodeId, String> {
    let mut peers = members;
    peers.extend(config.initial_members.clone());
    peers.remove(&config.id);
    for (id, address) in peers.iter_mut() {
        if let Some(route) = config.peer_routes.get(id) {
            address.clone_from(route);
        }
    }
    peers
}

/// Asks every peer (`peers`: id to address, this node left out) what it serves; an error if one
/// serves a cluster among `names` (every name the directory holds) and is not restoring.
pub async fn refuse_if_running(
    client: &reqwest::Client,
    peers: &BTreeMap<NodeId, String>,
    names: &[String],
) -> Result<(), OldClusterRunning> {
    let asked = peers.iter().map(|(id, address)| async move {
        let status: serde_json::Value =
            client.get(format!("{address}/cluster")).send().await.ok()?.json().await.ok()?;
        let name = status["cluster_id"].as_str()?.to_string();
        let restoring = status["restoring"].as_bool().unwrap_or(false);
        (!restoring && names.contains(&name)).then(|| OldClusterRunning { peer: *id, address: address.clone(), name })
    });
    match futures::future::join_all(asked).await.into_iter().flatten().next() {
        Some(running) => Err(running),
        None => Ok(()),
    }
}
