//! The Raft network: a leader's appends to a peer go over one long-lived connection
//! ([`crate::append_stream`]), or, to a peer without those, as HTTP POSTs to `/raft/append`;
//! votes and snapshots are one HTTP POST each to `/raft/vote` or `/raft/snapshot`. Bodies and
//! frames are bincode, answers a bincode `Result<response, RaftError>`; the
//! [`election`](crate::election) pre-votes go to `/raft/prevote`, a stopping leader's request
//! that a voter stand to `/raft/stand`, and its lease releases to `/raft/release`.
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
use std::sync::{Mutex, PoisonError};
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

use tokio::io::BufStream;

use crate::append_stream::{
    read_frame, write_frame, AnswerFrame, AppendFrame, Stamp, APPEND_STREAM_PATH, MAX_ANSWER_BYTES, UPGRADE_PROTOCOL,
};
use crate::clocks::{wall_clock_ms, PeerClocks, CLOCK_HEADER, FROM_HEADER};
use crate::election::{
    LeaseRelease, PreVoteRequest, PreVoteResponse, ReleaseResponse, StandRequest, StandResponse, PREVOTE_PATH,
    RELEASE_PATH, STAND_PATH,
};
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
            // Under the 10 s a peer's port gives an idle connection (`--http-header-timeout-ms`):
            // this side drops it first, rather than sending on one the peer is closing.
            .pool_idle_timeout(Duration::from_secs(5));
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

/// What `checks` says of this node (and of `target`) with a request or a streamed append.
fn stamp_of(checks: &Option<PeerChecks>, target: NodeId) -> Stamp {
    let Some(checks) = checks else { return Stamp::default() };
    let mut stamp = Stamp { from: Some(checks.me), wall_clock_ms: Some(wall_clock_ms()), ..Stamp::default() };
    if let Some(identity) = &checks.identity {
        stamp.incarnation = Some(identity.incarnation.clone());
        if let Some(records) = identity.records() {
            stamp.cluster = records.cluster_id.clone();
            stamp.expected = records.enrollments.get(&target).cloned();
        }
    }
    stamp
}

/// Adds what `checks` says of this node (and of `target`) to a request, as headers.
fn stamp(builder: reqwest::RequestBuilder, checks: &Option<PeerChecks>, target: NodeId) -> reqwest::RequestBuilder {
    let stamp = stamp_of(checks, target);
    let headers = [
        (FROM_HEADER, stamp.from.map(|from| from.to_string())),
        (CLOCK_HEADER, stamp.wall_clock_ms.map(|ms| ms.to_string())),
        (INCARNATION_HEADER, stamp.incarnation),
        (CLUSTER_HEADER, stamp.cluster),
        (EXPECTED_HEADER, stamp.expected),
    ];
    headers.into_iter().fold(builder, |builder, (name, value)| match value {
        Some(value) => builder.header(name, value),
        None => builder,
    })
}

/// Notes the clock an answer from `peer` shows and checks who answered; why the answer must not
/// count, if it must not.
fn check_claims(
    checks: &Option<PeerChecks>,
    peer: NodeId,
    wall_clock_ms: Option<u64>,
    claims: &Claims,
) -> Result<(), String> {
    let Some(checks) = checks else { return Ok(()) };
    if let Some(wall_clock_ms) = wall_clock_ms {
        checks.clocks.observe(peer, wall_clock_ms);
    }
    match &checks.identity {
        Some(identity) => identity.check(peer, claims),
        None => Ok(()),
    }
}

/// [`check_claims`] of an answer's headers.
fn check_answer(response: &reqwest::Response, peer: NodeId, checks: &Option<PeerChecks>) -> Result<(), String> {
    let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok());
    let claims = Claims { incarnation: header(INCARNATION_HEADER), cluster: header(CLUSTER_HEADER), expected: None };
    check_claims(checks, peer, header(CLOCK_HEADER).and_then(|v| v.parse().ok()), &claims)
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
        self.ask(target, node, PREVOTE_PATH, request, timeout).await
    }

    /// Asks `target` to stand for election at once (this node leads and is stopping); an error
    /// says why it did not answer in `timeout`.
    pub async fn ask_to_stand(
        &self,
        target: NodeId,
        node: &Node,
        request: &StandRequest,
        timeout: Duration,
    ) -> Result<StandResponse, String> {
        self.ask(target, node, STAND_PATH, request, timeout).await
    }

    /// Asks `target` to release this leader's lease (this node leads and hands over); an error
    /// says why it did not answer in `timeout`.
    pub async fn release_lease(
        &self,
        target: NodeId,
        node: &Node,
        request: &LeaseRelease,
        timeout: Duration,
    ) -> Result<ReleaseResponse, String> {
        self.ask(target, node, RELEASE_PATH, request, timeout).await
    }

    /// One request of the elector's to `target` at `path`, its answer noted in the peers' health.
    async fn ask<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        target: NodeId,
        node: &Node,
        path: &str,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, String> {
        let address = self.address(target, node);
        let answer = self.post(&address, target, path, request, timeout).await;
        match &answer {
            Ok(_) => self.health.answered(target, &address),
            Err(e) => self.health.failed(target, &address, e),
        }
        answer
    }

    async fn post<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        address: &str,
        target: NodeId,
        path: &str,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, String> {
        let body = encode(request).map_err(|e| format!("encoding the request: {e}"))?;
        let post = self.client.post(format!("{address}{path}"));
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
            return Err(format!("{path} answered {status}: {}", String::from_utf8_lossy(&bytes)));
        }
        decode(&bytes).map_err(|e| format!("decoding the answer of {path}: {e}"))
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> PeerClient {
        let addr = self.address(target, node);
        let endpoints = [APPEND_PATH, APPEND_STREAM_PATH, VOTE_PATH, SNAPSHOT_PATH]
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
            stream: None,
            streams: true,
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
    /// The open appends stream ([`crate::append_stream`]); the next append opens one when none
    /// is. Only ever used through `&mut self`: the mutex is never locked, it only makes the
    /// client `Sync`, as openraft needs, over a connection that is not.
    stream: Option<Mutex<BufStream<reqwest::Upgraded>>>,
    /// False once the peer answered that it has no appends streams: appends go as requests.
    streams: bool,
    checks: Option<PeerChecks>,
    health: PeerHealth,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct RpcFailure(String);

/// Why an RPC to a peer got no answer.
enum PostError {
    /// No connection: openraft backs off before trying again.
    Unreachable(String),
    /// The connection failed later, or the answer is not one.
    Failed(String),
}

/// What came of one RPC: openraft's result on the peer, `None` when no answer came within the
/// deadline, or why there was none.
type Outcome<Resp, E> = Result<Option<Result<Resp, RaftError<NodeId, E>>>, PostError>;

/// The response of a request that was sent, `None` past its deadline.
fn sent(result: reqwest::Result<reqwest::Response>) -> Result<Option<reqwest::Response>, PostError> {
    match result {
        Ok(response) => Ok(Some(response)),
        Err(e) if e.is_timeout() => Ok(None),
        Err(e) if e.is_connect() => Err(PostError::Unreachable(e.to_string())),
        Err(e) => Err(PostError::Failed(e.to_string())),
    }
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

    /// Records in the [`PeerHealth`] whether the peer answered, and maps the outcome of an RPC to
    /// `path` for openraft: `Ok(None)` when the peer did not answer within `deadline`.
    fn settle<Resp, E: std::error::Error>(
        &self,
        path: &str,
        outcome: Outcome<Resp, E>,
        deadline: Duration,
    ) -> Result<Option<Resp>, RPCError<NodeId, Node, RaftError<NodeId, E>>> {
        let failed = |error: &str| self.health.failed(self.target, &self.addr, &error);
        match outcome {
            Ok(Some(result)) => {
                self.health.answered(self.target, &self.addr);
                result.map(Some).map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(None) => {
                failed(&format!("no answer to {path} within {} ms", deadline.as_millis()));
                Ok(None)
            }
            Err(PostError::Unreachable(e)) => {
                failed(&e);
                Err(RPCError::Unreachable(Unreachable::new(&RpcFailure(e))))
            }
            Err(PostError::Failed(e)) => {
                failed(&e);
                Err(RPCError::Network(NetworkError::new(&RpcFailure(e))))
            }
        }
    }

    /// Sends one RPC as a request to `path`.
    async fn request<Req, Resp, E>(&self, path: &'static str, request: &Req, deadline: Duration) -> Outcome<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: DeserializeOwned,
    {
        let body = encode(request).map_err(|e| PostError::Failed(format!("encoding the request: {e}")))?;
        let Some(answer) = self.post(path, body, deadline).await? else { return Ok(None) };
        decode(&answer).map(Some).map_err(|e| PostError::Failed(format!("decoding the answer of {path}: {e}")))
    }

    /// A request builder for `method` to the peer's `path`.
    fn to(&self, method: reqwest::Method, path: &'static str) -> reqwest::RequestBuilder {
        let builder = match self.endpoints.iter().find(|(known, _)| *known == path) {
            Some((_, url)) => self.client.request(method, url.clone()),
            // An address that does not parse: reqwest reports it.
            None => self.client.request(method, format!("{}{path}", self.addr)),
        };
        stamp(builder, &self.checks, self.target)
    }

    /// POSTs `body` to the peer's `path`: the body of its answer, or `None` when none came
    /// within `deadline`.
    async fn post(&self, path: &'static str, body: Vec<u8>, deadline: Duration) -> Result<Option<Bytes>, PostError> {
        let request = self.to(reqwest::Method::POST, path).header(reqwest::header::CONTENT_TYPE, CONTENT_TYPE);
        let Some(response) = sent(request.timeout(deadline).body(body).send().await)? else { return Ok(None) };
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

    /// Sends one append over the appends stream, or as a request to a peer without streams.
    async fn append(
        &mut self,
        rpc: &AppendEntriesRequest<TypeConfig>,
        deadline: Duration,
    ) -> (&'static str, Outcome<AppendEntriesResponse<NodeId>, openraft::error::Infallible>) {
        if self.streams {
            match tokio::time::timeout(deadline, self.append_streamed(rpc)).await {
                Ok(Some(outcome)) => return (APPEND_STREAM_PATH, outcome),
                Ok(None) => {
                    tracing::info!(
                        peer = self.target,
                        "the peer has no appends streams: sending it appends as requests"
                    );
                    self.streams = false;
                }
                // The stream in use was dropped with the append: a late answer must not be read as
                // the next append's.
                Err(_) => return (APPEND_STREAM_PATH, Ok(None)),
            }
        }
        (APPEND_PATH, self.request(APPEND_PATH, rpc, deadline).await)
    }

    /// One append over the open stream, or a new one; `None` when the peer has no streams. A
    /// stream that fails is closed; when it had served earlier appends (the peer may have
    /// restarted or closed it idle since), the append is sent once more over a new one.
    async fn append_streamed(
        &mut self,
        rpc: &AppendEntriesRequest<TypeConfig>,
    ) -> Option<Outcome<AppendEntriesResponse<NodeId>, openraft::error::Infallible>> {
        loop {
            let fresh = self.stream.is_none();
            // Taken while in use: an append that fails or runs out of time drops it.
            let mut stream = match self.stream.take() {
                Some(stream) => stream.into_inner().unwrap_or_else(PoisonError::into_inner),
                None => match self.open_stream().await {
                    Ok(Some(stream)) => stream,
                    Ok(None) => return None,
                    Err(e) => return Some(Err(e)),
                },
            };
            let frame = AppendFrame { stamp: stamp_of(&self.checks, self.target), request: rpc };
            let exchanged = match write_frame(&mut stream, &frame).await {
                Ok(()) => read_frame::<_, AnswerFrame>(&mut stream, MAX_ANSWER_BYTES).await,
                Err(e) => Err(e),
            };
            let answer = match exchanged {
                Ok(Some(answer)) => answer,
                Ok(None) | Err(_) if !fresh => {
                    self.health.failed(self.target, &self.addr, &"an appends stream in use closed");
                    continue;
                }
                Ok(None) => return Some(Err(PostError::Failed(format!("{APPEND_STREAM_PATH}: the peer closed it")))),
                Err(e) => return Some(Err(PostError::Failed(format!("{APPEND_STREAM_PATH}: {e}")))),
            };
            self.stream = Some(Mutex::new(stream));
            let checked = check_claims(&self.checks, self.target, Some(answer.wall_clock_ms), &answer.claims());
            return Some(match checked.and(answer.answer) {
                Ok(result) => Ok(Some(result)),
                Err(why) => Err(PostError::Failed(format!("{APPEND_STREAM_PATH} refused: {why}"))),
            });
        }
    }

    /// Opens an appends stream; `None` when the peer has none (it answers 404 or 405).
    async fn open_stream(&self) -> Result<Option<BufStream<reqwest::Upgraded>>, PostError> {
        let request = self
            .to(reqwest::Method::GET, APPEND_STREAM_PATH)
            .header(reqwest::header::CONNECTION, "upgrade")
            .header(reqwest::header::UPGRADE, UPGRADE_PROTOCOL);
        let Some(response) = sent(request.send().await)? else {
            return Err(PostError::Failed(format!("{APPEND_STREAM_PATH}: no answer")));
        };
        check_answer(&response, self.target, &self.checks).map_err(PostError::Failed)?;
        match response.status() {
            reqwest::StatusCode::SWITCHING_PROTOCOLS => match response.upgrade().await {
                Ok(upgraded) => {
                    self.health.stream_opened(self.target);
                    Ok(Some(BufStream::new(upgraded)))
                }
                Err(e) => Err(PostError::Failed(format!("{APPEND_STREAM_PATH}: {e}"))),
            },
            reqwest::StatusCode::NOT_FOUND | reqwest::StatusCode::METHOD_NOT_ALLOWED => Ok(None),
            status => {
                let body = response.text().await.unwrap_or_default();
                Err(PostError::Failed(format!("{APPEND_STREAM_PATH} answered {status}: {body}")))
            }
        }
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
        let (path, outcome) = self.append(&rpc, option.hard_ttl()).await;
        match self.settle(path, outcome, option.hard_ttl())? {
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
        let outcome = self.request(SNAPSHOT_PATH, &rpc, option.hard_ttl()).await;
        match self.settle(SNAPSHOT_PATH, outcome, option.hard_ttl())? {
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
        let outcome = self.request(VOTE_PATH, &rpc, option.hard_ttl()).await;
        match self.settle(VOTE_PATH, outcome, option.hard_ttl())? {
            Some(response) => Ok(response),
            None => Err(self.timeout(RPCTypes::Vote, from, &option)),
        }
    }
}
