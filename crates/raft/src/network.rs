//! The Raft network: each RPC is one HTTP POST with a bincode body to the target node's
//! `/raft/append`, `/raft/vote` or `/raft/snapshot`, answered with a bincode
//! `Result<response, RaftError>`.
//!
//! A peer that refuses the connection or does not answer within the RPC's deadline is
//! `Unreachable`, so openraft backs off instead of retrying at once.

use std::time::Duration;

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::types::{Node, NodeId, TypeConfig};
use crate::wire::{decode, encode, CONTENT_TYPE};

pub const APPEND_PATH: &str = "/raft/append";
pub const VOTE_PATH: &str = "/raft/vote";
pub const SNAPSHOT_PATH: &str = "/raft/snapshot";

/// Creates one [`PeerClient`] per target; they share one HTTP connection pool.
#[derive(Clone)]
pub struct NetworkFactory {
    client: reqwest::Client,
    retry_after: Duration,
}

impl NetworkFactory {
    /// `retry_after` is how long to wait before trying an unreachable peer again. Keep it near the
    /// heartbeat interval: a node that has just started hears the leader before its election
    /// timeout passes, instead of starting an election that unseats a healthy leader.
    pub fn new(retry_after: Duration) -> reqwest::Result<NetworkFactory> {
        let client = reqwest::Client::builder()
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_millis(500))
            .pool_idle_timeout(Duration::from_secs(30))
            .build()?;
        Ok(NetworkFactory { client, retry_after })
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> PeerClient {
        PeerClient {
            client: self.client.clone(),
            target,
            addr: node.addr.trim_end_matches('/').to_string(),
            retry_after: self.retry_after,
        }
    }
}

/// Sends Raft RPCs to one peer.
pub struct PeerClient {
    client: reqwest::Client,
    target: NodeId,
    addr: String,
    retry_after: Duration,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct RpcFailure(String);

impl PeerClient {
    async fn call<Req, Resp, E>(
        &self,
        path: &str,
        request: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, Node, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let network = |detail: String| RPCError::Network(NetworkError::new(&RpcFailure(detail)));
        let body = encode(request).map_err(|e| network(format!("encoding the request: {e}")))?;
        let sent = self
            .client
            .post(format!("{}{path}", self.addr))
            .header(reqwest::header::CONTENT_TYPE, CONTENT_TYPE)
            .timeout(option.hard_ttl())
            .body(body)
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            Err(e) if e.is_connect() || e.is_timeout() => return Err(RPCError::Unreachable(Unreachable::new(&e))),
            Err(e) => return Err(network(e.to_string())),
        };
        let status = response.status();
        let bytes = match response.bytes().await {
            Ok(bytes) => bytes,
            Err(e) if e.is_timeout() => return Err(RPCError::Unreachable(Unreachable::new(&e))),
            Err(e) => return Err(network(e.to_string())),
        };
        if !status.is_success() {
            return Err(network(format!("{path} answered {status}: {}", String::from_utf8_lossy(&bytes))));
        }
        let result: Result<Resp, RaftError<NodeId, E>> =
            decode(&bytes).map_err(|e| network(format!("decoding the answer of {path}: {e}")))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::repeat(self.retry_after))
    }

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        self.call(APPEND_PATH, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId, InstallSnapshotError>>> {
        self.call(SNAPSHOT_PATH, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        self.call(VOTE_PATH, &rpc, &option).await
    }
}
