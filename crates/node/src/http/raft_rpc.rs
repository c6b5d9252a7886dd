//! The server side of the Raft RPCs: decode the bincode request, hand it to openraft, encode its
//! `Result` (errors included) as the answer.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::connect_info::ConnectInfo;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use statestore_raft::append_stream::{read_frame, write_frame, AnswerFrame, ReceivedAppend, UPGRADE_PROTOCOL};
use statestore_raft::clocks::{wall_clock_ms, CLOCK_HEADER, FROM_HEADER};
use statestore_raft::election::{PreVoteResponse, ReleaseResponse, StandResponse};
use statestore_raft::identity::{Claims, CLUSTER_HEADER, EXPECTED_HEADER, INCARNATION_HEADER};
use statestore_raft::wire::{decode, encode, CONTENT_TYPE};
use tokio::io::{AsyncRead, AsyncWrite, BufStream};

use crate::http::tls::ClientCertificate;
use crate::http::RAFT_BODY_LIMIT;
use crate::node::Node;

/// Notes the sender's clock of every Raft request and checks who sent it: under TLS, that its
/// client certificate is the member's it claims to be (refused with 403, [`check_certificate`]);
/// then that it and this node are the storage the cluster enrolled, of this cluster (refused
/// with 409). Answers carry this node's clock, incarnation and cluster name.
pub async fn check_peer(State(node): State<Arc<Node>>, request: Request, next: Next) -> Response {
    let refusal = {
        let header = |name: &str| request.headers().get(name).and_then(|v| v.to_str().ok());
        let claims = Claims {
            incarnation: header(INCARNATION_HEADER),
            cluster: header(CLUSTER_HEADER),
            expected: header(EXPECTED_HEADER),
        };
        let from = header(FROM_HEADER).and_then(|v| v.parse::<u64>().ok());
        match request.extensions().get::<ConnectInfo<ClientCertificate>>() {
            Some(ConnectInfo(certificate)) => {
                check_certificate(&node, from, certificate).map_err(|why| (StatusCode::FORBIDDEN, why))
            }
            None => Ok(()),
        }
        .and_then(|()| {
            check_sender(&node, from, header(CLOCK_HEADER).and_then(|v| v.parse().ok()), &claims)
                .map_err(|why| (StatusCode::CONFLICT, why))
        })
        .err()
    };
    let mut response = match refusal {
        Some(why) => why.into_response(),
        None => next.run(request).await,
    };
    let headers = response.headers_mut();
    let mut add = |name: &'static str, value: &str| {
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.insert(name, value);
        }
    };
    add(CLOCK_HEADER, &wall_clock_ms().to_string());
    add(INCARNATION_HEADER, &node.identity.incarnation);
    if let Some(cluster) = node.identity.cluster_id() {
        add(CLUSTER_HEADER, &cluster);
    }
    response
}

/// Under TLS a peer proves which member it is: the client certificate of a Raft request must
/// name (as a subject alternative name) the host of the address the claimed sender has in this
/// node's membership, so a certificate the CA signed for one member, or for an operator, cannot
/// speak for another member. A sender this node does not know as a member is refused, unless
/// this node knows no members at all yet (a new node waiting to be added, which holds nothing).
/// Why it is refused, if it is (logged at most once per [`REFUSAL_LOG_EVERY`]).
fn check_certificate(node: &Node, from: Option<u64>, certificate: &ClientCertificate) -> Result<(), String> {
    let checked = match from {
        None => Err(format!("a Raft request over TLS must say which member sends it ({FROM_HEADER})")),
        Some(from) => {
            let metrics = node.raft.metrics();
            let metrics = metrics.borrow();
            let membership = metrics.membership_config.membership();
            match membership.get_node(&from) {
                None if membership.nodes().next().is_none() => Ok(()),
                None => Err(format!("node {from} is not a member this node knows")),
                Some(member) => match host_of(&member.addr) {
                    Some(host) if certificate.names(host) => Ok(()),
                    Some(host) => Err(format!(
                        "the client certificate does not name {host}, the host of node {from}'s address {}",
                        member.addr
                    )),
                    None => Err(format!("node {from}'s address {} has no host", member.addr)),
                },
            }
        }
    };
    checked.inspect_err(|why| log_refusal(why))
}

/// The host of a member's address (`https://node-2:7401` → `node-2`; an IPv6 address without
/// its brackets).
fn host_of(address: &str) -> Option<&str> {
    let rest = address.split_once("://").map_or(address, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    let host = match authority.strip_prefix('[') {
        Some(bracketed) => bracketed.split_once(']')?.0,
        None => authority.rsplit_once(':').map_or(authority, |(host, _)| host),
    };
    (!host.is_empty()).then_some(host)
}

/// Notes the sender's clock and checks who sent a Raft request or a streamed append: why it is
/// refused, if it is (logged at most once per [`REFUSAL_LOG_EVERY`]).
fn check_sender(node: &Node, from: Option<u64>, wall_clock_ms: Option<u64>, claims: &Claims) -> Result<(), String> {
    let Some(from) = from else { return Ok(()) };
    if let Some(wall_clock_ms) = wall_clock_ms {
        node.clock_check.clocks.observe(from, wall_clock_ms);
    }
    node.identity.check(from, claims).inspect_err(|why| log_refusal(why))
}

/// Logs why a Raft request was refused, at most once per [`REFUSAL_LOG_EVERY`].
fn log_refusal(why: &str) {
    if warn_now() {
        tracing::warn!(why, "refused a Raft request");
    }
}

/// True at most once per [`REFUSAL_LOG_EVERY`]: a refused peer retries every heartbeat.
fn warn_now() -> bool {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = wall_clock_ms();
    let last = LAST.load(Ordering::Relaxed);
    now.saturating_sub(last) >= REFUSAL_LOG_EVERY.as_millis() as u64
        && LAST.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
}

const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(5);

async fn rpc<Req, Resp, Fut>(body: Bytes, call: impl FnOnce(Req) -> Fut) -> Response
where
    Req: DeserializeOwned,
    Resp: Serialize,
    Fut: Future<Output = Resp>,
{
    let request: Req = match decode(&body) {
        Ok(request) => request,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("malformed Raft request: {e}")).into_response(),
    };
    match encode(&call(request).await) {
        Ok(bytes) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], bytes).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("encoding the answer: {e}")).into_response(),
    }
}

pub async fn append(State(node): State<Arc<Node>>, body: Bytes) -> Response {
    node.metrics.observe_append_served(false);
    rpc(body, |request| async move { node.raft.append_entries(request).await }).await
}

pub async fn vote(State(node): State<Arc<Node>>, body: Bytes) -> Response {
    rpc(body, |request| async move { node.raft.vote(request).await }).await
}

pub async fn snapshot(State(node): State<Arc<Node>>, body: Bytes) -> Response {
    rpc(body, |request| async move { node.snapshot_receiver.receive(&node.raft, request).await }).await
}

/// Runs an elector's `answer` on its own task: a caller that stops waiting must not cut it off
/// midway (openraft logs a cut-off answer as an error; an election must not stop halfway). A
/// task that failed is `refused`, with why.
async fn on_own_task<R: Send + 'static>(
    answer: impl Future<Output = R> + Send + 'static,
    refused: impl FnOnce(String) -> R,
) -> R {
    tokio::spawn(answer).await.unwrap_or_else(|e| refused(format!("the answer failed: {e}")))
}

pub async fn prevote(State(node): State<Arc<Node>>, body: Bytes) -> Response {
    rpc(body, |request| async move {
        let elector = node.elector.clone();
        on_own_task(async move { elector.answer(&request).await }, PreVoteResponse::Refused).await
    })
    .await
}

/// A stopping leader asks this node to stand for election at once
/// ([`statestore_raft::election::Elector::answer_stand`]).
pub async fn stand(State(node): State<Arc<Node>>, body: Bytes) -> Response {
    rpc(body, |request| async move {
        let elector = node.elector.clone();
        on_own_task(async move { elector.answer_stand(&request).await }, StandResponse::Refused).await
    })
    .await
}

/// A leader handing over releases its lease on this node
/// ([`statestore_raft::election::Elector::answer_release`]).
pub async fn release(State(node): State<Arc<Node>>, body: Bytes) -> Response {
    rpc(body, |request| async move {
        let elector = node.elector.clone();
        on_own_task(async move { elector.answer_release(&request).await }, ReleaseResponse::Refused).await
    })
    .await
}

/// Opens an appends stream ([`statestore_raft::append_stream`]): answers `101 Switching
/// Protocols` and serves the connection's frames on a task of its own. The request has passed
/// the checks of every Raft request by then.
pub async fn append_stream(State(node): State<Arc<Node>>, mut request: Request) -> Response {
    let certificate = request.extensions().get::<ConnectInfo<ClientCertificate>>().map(|info| info.0.clone());
    let upgrade = request.headers().get(header::UPGRADE).and_then(|v| v.to_str().ok());
    if upgrade != Some(UPGRADE_PROTOCOL) {
        let why = format!("an appends stream needs `Connection: upgrade` and `Upgrade: {UPGRADE_PROTOCOL}`");
        return (StatusCode::UPGRADE_REQUIRED, [(header::UPGRADE, UPGRADE_PROTOCOL)], why).into_response();
    }
    let Some(upgrading) = request.extensions_mut().remove::<hyper::upgrade::OnUpgrade>() else {
        return (StatusCode::BAD_REQUEST, "this connection cannot be upgraded (HTTP/1.1 only)").into_response();
    };
    tokio::spawn(async move {
        match upgrading.await {
            Ok(upgraded) => serve_appends(node, certificate, BufStream::new(TokioIo::new(upgraded))).await,
            Err(e) => tracing::debug!(error = %e, "an appends stream was not opened"),
        }
    });
    (StatusCode::SWITCHING_PROTOCOLS, [(header::CONNECTION, "upgrade"), (header::UPGRADE, UPGRADE_PROTOCOL)])
        .into_response()
}

/// How long an appends stream may stay without a frame (or an answer unread) before this node
/// closes it. A leader sends one at least every heartbeat; one that stopped (paused, cut off)
/// opens another.
const STREAM_IDLE: Duration = Duration::from_secs(30);

/// Answers the appends of one stream, in order, until the leader closes it, it stays idle for
/// [`STREAM_IDLE`], a frame is malformed (over [`RAFT_BODY_LIMIT`] or not an append), or this
/// node stops taking Raft messages. Under TLS every frame's sender is checked against the
/// connection's `certificate` ([`check_certificate`]).
async fn serve_appends<S: AsyncRead + AsyncWrite + Unpin>(
    node: Arc<Node>,
    certificate: Option<ClientCertificate>,
    mut stream: S,
) {
    let closed = node.peers_closed();
    tokio::pin!(closed);
    // The member this stream's certificate was last found to be: its frames need no new check.
    let mut admitted = None;
    loop {
        let read = tokio::select! {
            biased;
            _ = &mut closed => return,
            read = tokio::time::timeout(STREAM_IDLE, read_frame(&mut stream, RAFT_BODY_LIMIT)) => read,
        };
        let frame: ReceivedAppend = match read {
            Ok(Ok(Some(frame))) => frame,
            Ok(Ok(None)) => return,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "closing an appends stream");
                return;
            }
            Err(_) => {
                tracing::debug!(idle_s = STREAM_IDLE.as_secs(), "closing an idle appends stream");
                return;
            }
        };
        let stamp = &frame.stamp;
        let checked = match &certificate {
            Some(_) if stamp.from.is_some() && stamp.from == admitted => Ok(()),
            Some(certificate) => check_certificate(&node, stamp.from, certificate).inspect(|()| admitted = stamp.from),
            None => Ok(()),
        };
        let checked = checked.and_then(|()| check_sender(&node, stamp.from, stamp.wall_clock_ms, &stamp.claims()));
        let answer = match checked {
            Ok(()) => {
                node.metrics.observe_append_served(true);
                match node.call_from_peer(node.raft.append_entries(frame.request)).await {
                    Some(answer) => Ok(answer),
                    None => return,
                }
            }
            Err(why) => Err(why),
        };
        let answer = AnswerFrame {
            wall_clock_ms: wall_clock_ms(),
            incarnation: node.identity.incarnation.clone(),
            cluster: node.identity.cluster_id(),
            answer,
        };
        match tokio::time::timeout(STREAM_IDLE, write_frame(&mut stream, &answer)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "an appends stream closed before its answer");
                return;
            }
            Err(_) => {
                tracing::debug!(idle_s = STREAM_IDLE.as_secs(), "a leader read no answer; closing its appends stream");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::host_of;

    #[test]
    fn the_host_of_a_member_address() {
        assert_eq!(host_of("https://node-2:7401"), Some("node-2"));
        assert_eq!(host_of("https://10.0.0.2:7401/"), Some("10.0.0.2"));
        assert_eq!(host_of("https://[::1]:7401"), Some("::1"));
        assert_eq!(host_of("https://node-2"), Some("node-2"));
        assert_eq!(host_of("node-2:7401"), Some("node-2"));
        assert_eq!(host_of("https://:7401"), None);
    }
}
