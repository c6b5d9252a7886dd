//! The server side of the Raft RPCs: decode the bincode request, hand it to openraft, encode its
//! `Result` (errors included) as the answer.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
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

use crate::http::RAFT_BODY_LIMIT;
use crate::node::Node;

/// Notes the sender's clock of every Raft request and checks who sent it (refused with 409 when
/// it or this node is not the storage the cluster enrolled, or another cluster's); answers
/// carry this node's clock, incarnation and cluster name.
pub async fn check_peer(State(node): State<Arc<Node>>, request: Request, next: Next) -> Response {
    let refusal = {
        let header = |name: &str| request.headers().get(name).and_then(|v| v.to_str().ok());
        let claims = Claims {
            incarnation: header(INCARNATION_HEADER),
            cluster: header(CLUSTER_HEADER),
            expected: header(EXPECTED_HEADER),
        };
        let from = header(FROM_HEADER).and_then(|v| v.parse::<u64>().ok());
        check_sender(&node, from, header(CLOCK_HEADER).and_then(|v| v.parse().ok()), &claims).err()
    };
    let mut response = match refusal {
        Some(why) => (StatusCode::CONFLICT, why).into_response(),
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

/// Notes the sender's clock and checks who sent a Raft request or a streamed append: why it is
/// refused, if it is (logged at most once per [`REFUSAL_LOG_EVERY`]).
fn check_sender(node: &Node, from: Option<u64>, wall_clock_ms: Option<u64>, claims: &Claims) -> Result<(), String> {
    let Some(from) = from else { return Ok(()) };
    if let Some(wall_clock_ms) = wall_clock_ms {
        node.clock_check.clocks.observe(from, wall_clock_ms);
    }
    node.identity.check(from, claims).inspect_err(|why| {
        if warn_now() {
            tracing::warn!(why, "refused a Raft request");
        }
    })
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
            Ok(upgraded) => serve_appends(node, BufStream::new(TokioIo::new(upgraded))).await,
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
/// node stops taking Raft messages.
async fn serve_appends<S: AsyncRead + AsyncWrite + Unpin>(node: Arc<Node>, mut stream: S) {
    let closed = node.peers_closed();
    tokio::pin!(closed);
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
        let answer = match check_sender(&node, stamp.from, stamp.wall_clock_ms, &stamp.claims()) {
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
