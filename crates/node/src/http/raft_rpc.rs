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
use serde::de::DeserializeOwned;
use serde::Serialize;
use statestore_raft::clocks::{wall_clock_ms, CLOCK_HEADER, FROM_HEADER};
use statestore_raft::identity::{Claims, CLUSTER_HEADER, EXPECTED_HEADER, INCARNATION_HEADER};
use statestore_raft::wire::{decode, encode, CONTENT_TYPE};

use crate::node::Node;

/// Notes the sender's clock of every Raft request and checks who sent it (refused with 409 when
/// it or this node is not the storage the cluster enrolled, or another cluster's); answers
/// carry this node's clock, incarnation and cluster name.
pub async fn check_peer(State(node): State<Arc<Node>>, request: Request, next: Next) -> Response {
    let refusal = {
        let header = |name: &str| request.headers().get(name).and_then(|v| v.to_str().ok());
        let from = header(FROM_HEADER).and_then(|v| v.parse::<u64>().ok());
        if let (Some(from), Some(wall_clock_ms)) = (from, header(CLOCK_HEADER).and_then(|v| v.parse().ok())) {
            node.clock_check.clocks.observe(from, wall_clock_ms);
        }
        let claims = Claims {
            incarnation: header(INCARNATION_HEADER),
            cluster: header(CLUSTER_HEADER),
            expected: header(EXPECTED_HEADER),
        };
        from.and_then(|from| node.identity.check(from, &claims).err())
    };
    let mut response = match refusal {
        Some(why) => {
            if warn_now() {
                tracing::warn!(why, "refused a Raft request");
            }
            (StatusCode::CONFLICT, why).into_response()
        }
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
    rpc(body, |request| async move { node.raft.append_entries(request).await }).await
}

pub async fn vote(State(node): State<Arc<Node>>, body: Bytes) -> Response {
    rpc(body, |request| async move { node.raft.vote(request).await }).await
}

pub async fn snapshot(State(node): State<Arc<Node>>, body: Bytes) -> Response {
    rpc(body, |request| async move { node.snapshot_receiver.receive(&node.raft, request).await }).await
}

pub async fn prevote(State(node): State<Arc<Node>>, body: Bytes) -> Response {
    rpc(body, |request| async move {
        // On its own task: a candidate that stopped waiting must not cut openraft's answer off
        // (openraft logs that as an error).
        let elector = node.elector.clone();
        tokio::spawn(async move { elector.answer(&request).await }).await.unwrap_or_else(|e| {
            statestore_raft::election::PreVoteResponse::Refused(format!("the pre-vote answer failed: {e}"))
        })
    })
    .await
}
