//! The Raft network: each RPC is one HTTP POST with a bincode body to the target node's
//! `/raft/append`, `/raft/vote` or `/raft/snapshot`, answered with a bincode
//! `Result<response, RaftError>`; the [`election`](crate::election) pre-votes go to
//! `/raft/prevote`.
//!
//! A peer that refuses the connection is `Unreachable`, so openraft backs off instead of
//! retrying at once. A peer that does not answer within the RPC's deadline is a `Timeout`: it
//! is tried again at once, with less.
//!
//! openraft 0.9 gives an append the heartbeat interval as its deadline, however many entries it
//! carries. So one append request carries at most [`PeerClient`]'s current byte budget (and
//! at least one entry) and reports `PartialSuccess` for what it carried; openraft sends the rest
//! at once. The budget halves after a timeout (down to [`MIN_APPEND_BYTES`]) and doubles back
//! after each success (up to [`MAX_APPEND_BYTES`]), so a slow follower catches up in smaller
//! steps instead of missing the deadline with the same large request again and again.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Timeout, Unreachable};
use openraft::network::{Backoff, RPCOption, RPCTypes, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::EntryPayload;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::clocks::{wall_clock_ms, PeerClocks, CLOCK_HEADER, FROM_HEADER};
use crate::election::{PreVoteRequest, PreVoteResponse, PREVOTE_PATH};
use crate::identity::{Claims, PeerIdentity, CLUSTER_HEADER, EXPECTED_HEADER, INCARNATION_HEADER};
use crate::peer_health::PeerHealth;
use crate::types::{Node, NodeId, TypeConfig};
use crate::wire::{decode, encode, CONTENT_TYPE};

pub const APPEND_PATH: &str = "/raft/append";
pub const VOTE_PATH: &str = "/raft/vote";
pub const SNAPSHOT_PATH: &str = "/raft/snapshot";

/// The most entry bytes one append request carries (a single larger entry goes alone).
pub const MAX_APPEND_BYTES: usize = 1 << 20;
/// The least budget an append shrinks to after timeouts.
pub const MIN_APPEND_BYTES: usize = 16 << 10;

/// Creates one [`PeerClient`] per target; they share one HTTP connection pool.
#[derive(Clone)]
pub struct NetworkFactory {
    client: reqwest::Client,
    retry_after: Duration,
    /// Peers reached at another URL than the one they advertise (a proxy, a NAT).
    routes: BTreeMap<NodeId, String>,
    /// What requests say of this node, and how answers are checked.
    checks: Option<PeerChecks>,
    /// Which peers answer; a peer that stops answering is logged once, not per request.
    health: PeerHealth,
}

/// What this node sends about itself with every Raft request, and notes or checks in every
/// answer: its id and wall clock, and, with an identity, its storage incarnation, its cluster's
/// name and the incarnation it has enrolled for the target.
#[derive(Clone)]
pub struct PeerChecks {
    pub me: NodeId,
    pub clocks: PeerClocks,
    pub identity: Option<PeerIdentity>,
}

impl NetworkFactory {
    /// `retry_after` is how long to wait before trying an unreachable peer again. Keep it near the
    /// heartbeat interval: a node that has just started hears the leader before its election
    /// timeout passes, instead of starting an election that unseats a healthy leader.
    /// `routes` overrides the advertised URL of some peers. `authorization`, when given, is sent
    /// as the `Authorization` header of every request (the cluster secret). `tls`, when given,
    /// is how `https://` peers are reached (the CA they are checked against, this node's
    /// client certificate).
    pub fn new(
        retry_after: Duration,
        routes: BTreeMap<NodeId, String>,
        authorization: Option<&str>,
        tls: Option<rustls::ClientConfig>,
    ) -> Result<NetworkFactory, String> {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(authorization) = authorization {
            let mut value = reqwest::header::HeaderValue::from_str(authorization)
                .map_err(|_| "the authorization is not a valid header value".to_string())?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let mut builder = reqwest::Client::builder()
            .default_headers(headers)
            .tcp_nodelay(true)
            // A peer answers each RPC itself: nothing to follow, and no per-answer policy check.
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_millis(500))
            .pool_idle_timeout(Duration::from_secs(30));
        if let Some(tls) = tls {
            builder = builder.use_preconfigured_tls(tls);
        }
        let client = builder.build().map_err(|e| format!("building the HTTP client: {e}"))?;
        Ok(NetworkFactory { client, retry_after, routes, checks: None, health: PeerHealth::default() })
    }

    /// Sends what `checks` says of this node with every request, and checks every answer.
    pub fn with_checks(mut self, checks: PeerChecks) -> NetworkFactory {
        self.checks = Some(checks);
        self
    }

    /// Which peers do not answer this node, and since when.
    pub fn health(&self) -> &PeerHealth {
        &self.health
    }

    /// The readings of peers' clocks, when kept.
    pub fn clocks(&self) -> Option<&PeerClocks> {
        self.checks.as_ref().map(|checks| &checks.clocks)
    }
}

/// Adds what `checks` says of this node (and of `target`) to a request.
fn stamp(builder: reqwest::RequestBuilder, checks: &Option<PeerChecks>, target: NodeId) -> reqwest::RequestBuilder {
    let Some(checks) = checks else { return builder };
    let mut builder =
        builder.header(FROM_HEADER, checks.me.to_string()).header(CLOCK_HEADER, wall_clock_ms().to_string());
    if let Some(identity) = &checks.identity {
        builder = builder.header(INCARNATION_HEADER, &identity.incarnation);
        let records = identity.records();
        if let Some(cluster) = records.as_ref().and_then(|records| records.cluster_id.as_ref()) {
            builder = builder.header(CLUSTER_HEADER, cluster);
        }
        if let Some(expected) = records.as_ref().and_then(|records| records.enrollments.get(&target)) {
            builder = builder.header(EXPECTED_HEADER, expected);
        }
    }
    builder
}

/// Notes the clock an answer from `peer` carries and checks who answered; why the answer must
/// not count, if it must not.
fn check_answer(response: &reqwest::Response, peer: NodeId, checks: &Option<PeerChecks>) -> Result<(), String> {
    let Some(checks) = checks else { return Ok(()) };
    let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok());
    if let Some(wall_clock_ms) = header(CLOCK_HEADER).and_then(|v| v.parse().ok()) {
        checks.clocks.observe(peer, wall_clock_ms);
    }
    let Some(identity) = &checks.identity else { return Ok(()) };
    let claims = Claims { incarnation: header(INCARNATION_HEADER), cluster: header(CLUSTER_HEADER), expected: None };
    identity.check(peer, &claims)
}

impl NetworkFactory {
    /// Where this node reaches `target`: its route, or the address it advertises.
    pub fn address(&self, target: NodeId, node: &Node) -> String {
        self.routes.get(&target).unwrap_or(&node.addr).trim_end_matches('/').to_string()
    }

    /// Asks `target` for a pre-vote; an error says why it did not answer in `timeout`.
    pub async fn prevote(
        &self,
        target: NodeId,
        node: &Node,
        request: &PreVoteRequest,
        timeout: Duration,
    ) -> Result<PreVoteResponse, String> {
        let address = self.address(target, node);
        let answer = self.ask_prevote(&address, target, request, timeout).await;
        match &answer {
            Ok(_) => self.health.answered(target, &address),
            Err(e) => self.health.failed(target, &address, e),
        }
        answer
    }

    async fn ask_prevote(
        &self,
        address: &str,
        target: NodeId,
        request: &PreVoteRequest,
        timeout: Duration,
    ) -> Result<PreVoteResponse, String> {
        let body = encode(request).map_err(|e| format!("encoding the request: {e}"))?;
        let post = self.client.post(format!("{address}{PREVOTE_PATH}"));
        let response = stamp(post, &self.checks, target)
            .header(reqwest::header::CONTENT_TYPE, CONTENT_TYPE)
            .timeout(timeout)
            .body(body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        check_answer(&response, target, &self.checks)?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(|e| e.to_string())?;
        if !status.is_success() {
            return Err(format!("{PREVOTE_PATH} answered {status}: {}", String::from_utf8_lossy(&bytes)));
        }
        decode(&bytes).map_err(|e| format!("decoding the answer of {PREVOTE_PATH}: {e}"))
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> PeerClient {
        let addr = self.address(target, node);
        let endpoints = [APPEND_PATH, VOTE_PATH, SNAPSHOT_PATH]
            .into_iter()
            .filter_map(|path| Some((path, reqwest::Url::parse(&format!("{addr}{path}")).ok()?)))
            .collect();
        PeerClient {
            client: self.client.clone(),
            target,
            addr,
            endpoints,
            retry_after: self.retry_after,
            append_budget: MAX_APPEND_BYTES,
            checks: self.checks.clone(),
            health: self.health.clone(),
        }
    }
}

/// Sends Raft RPCs to one peer.
pub struct PeerClient {
    client: reqwest::Client,
    target: NodeId,
    addr: String,
    /// The URL of each RPC path, parsed once (reqwest would parse a string on every request).
    endpoints: Vec<(&'static str, reqwest::Url)>,
    retry_after: Duration,
    /// How many entry bytes the next append request may carry.
    append_budget: usize,
    checks: Option<PeerChecks>,
    health: PeerHealth,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct RpcFailure(String);

/// Why a POST to a peer got no answer.
enum PostError {
    /// No connection: openraft backs off before trying again.
    Unreachable(reqwest::Error),
    /// The connection failed later, or the answer is not one.
    Failed(String),
}

impl PeerClient {
    /// A [`RPCError::Timeout`] of an RPC to this peer.
    fn timeout<E: std::error::Error>(
        &self,
        action: RPCTypes,
        from: NodeId,
        option: &RPCOption,
    ) -> RPCError<NodeId, Node, RaftError<NodeId, E>> {
        RPCError::Timeout(Timeout { action, id: from, target: self.target, timeout: option.hard_ttl() })
    }

    /// Sends one RPC; `Ok(None)` when the peer did not answer within the deadline. Whether the
    /// peer answered goes to the [`PeerHealth`].
    async fn call<Req, Resp, E>(
        &self,
        path: &'static str,
        request: &Req,
        option: &RPCOption,
    ) -> Result<Option<Resp>, RPCError<NodeId, Node, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let network = |detail: String| RPCError::Network(NetworkError::new(&RpcFailure(detail)));
        let body = encode(request).map_err(|e| network(format!("encoding the request: {e}")))?;
        let answer = match self.post(path, body, option.hard_ttl()).await {
            Ok(Some(answer)) => {
                self.health.answered(self.target, &self.addr);
                answer
            }
            Ok(None) => {
                let error = format!("no answer to {path} within {} ms", option.hard_ttl().as_millis());
                self.health.failed(self.target, &self.addr, &error);
                return Ok(None);
            }
            Err(PostError::Unreachable(e)) => {
                self.health.failed(self.target, &self.addr, &e);
                return Err(RPCError::Unreachable(Unreachable::new(&e)));
            }
            Err(PostError::Failed(e)) => {
                self.health.failed(self.target, &self.addr, &e);
                return Err(network(e));
            }
        };
        let result: Result<Resp, RaftError<NodeId, E>> =
            decode(&answer).map_err(|e| network(format!("decoding the answer of {path}: {e}")))?;
        result.map(Some).map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }

    /// POSTs `body` to the peer's `path`: the body of its answer, or `None` when none came
    /// within `deadline`.
    async fn post(&self, path: &'static str, body: Vec<u8>, deadline: Duration) -> Result<Option<Bytes>, PostError> {
        let post = match self.endpoints.iter().find(|(known, _)| *known == path) {
            Some((_, url)) => self.client.post(url.clone()),
            // An address that does not parse: reqwest reports it.
            None => self.client.post(format!("{}{path}", self.addr)),
        };
        let sent = stamp(post, &self.checks, self.target)
            .header(reqwest::header::CONTENT_TYPE, CONTENT_TYPE)
            .timeout(deadline)
            .body(body)
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            Err(e) if e.is_timeout() => return Ok(None),
            Err(e) if e.is_connect() => return Err(PostError::Unreachable(e)),
            Err(e) => return Err(PostError::Failed(e.to_string())),
        };
        check_answer(&response, self.target, &self.checks).map_err(PostError::Failed)?;
        let status = response.status();
        let answer = match response.bytes().await {
            Ok(answer) => answer,
            Err(e) if e.is_timeout() => return Ok(None),
            Err(e) => return Err(PostError::Failed(e.to_string())),
        };
        if !status.is_success() {
            return Err(PostError::Failed(format!("{path} answered {status}: {}", String::from_utf8_lossy(&answer))));
        }
        Ok(Some(answer))
    }
}

/// Roughly how many bytes an entry takes on the wire.
fn entry_bytes(entry: &crate::types::LogEntry) -> usize {
    const FIXED: usize = 48;
    FIXED
        + match &entry.payload {
            EntryPayload::Blank => 0,
            EntryPayload::Normal(proposal) => proposal.entries.iter().map(|e| e.approx_bytes()).sum(),
            EntryPayload::Membership(membership) => 64 * membership.nodes().count(),
        }
}

/// How many leading entries fit in `budget` bytes; at least one.
fn entries_within(entries: &[crate::types::LogEntry], budget: usize) -> usize {
    let mut bytes = 0;
    let fitting = entries
        .iter()
        .take_while(|entry| {
            bytes += entry_bytes(entry);
            bytes <= budget
        })
        .count();
    fitting.max(1).min(entries.len())
}

impl RaftNetwork<TypeConfig> for PeerClient {
    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::repeat(self.retry_after))
    }

    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        let carried = entries_within(&rpc.entries, self.append_budget);
        let partial = carried < rpc.entries.len();
        if partial {
            rpc.entries.truncate(carried);
        }
        let last_carried = rpc.entries.last().map(|entry| entry.log_id);
        let from = rpc.vote.leader_id().voted_for().unwrap_or_default();
        match self.call(APPEND_PATH, &rpc, &option).await? {
            None => {
                self.append_budget = (self.append_budget / 2).max(MIN_APPEND_BYTES);
                Err(self.timeout(RPCTypes::AppendEntries, from, &option))
            }
            Some(response) => {
                self.append_budget = (self.append_budget * 2).min(MAX_APPEND_BYTES);
                Ok(match response {
                    AppendEntriesResponse::Success if partial => AppendEntriesResponse::PartialSuccess(last_carried),
                    other => other,
                })
            }
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId, InstallSnapshotError>>> {
        let from = rpc.vote.leader_id().voted_for().unwrap_or_default();
        match self.call(SNAPSHOT_PATH, &rpc, &option).await? {
            Some(response) => Ok(response),
            None => Err(self.timeout(RPCTypes::InstallSnapshot, from, &option)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        let from = rpc.vote.leader_id().voted_for().unwrap_or_default();
        match self.call(VOTE_PATH, &rpc, &option).await? {
            Some(response) => Ok(response),
            None => Err(self.timeout(RPCTypes::Vote, from, &option)),
        }
    }
}
