//! The server side of the Raft RPCs: decode the bincode request, hand it to openraft, encode its
//! `Result` (errors included) as the answer.

use std::future::Future;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;
use statestore_raft::clocks::{wall_clock_ms, CLOCK_HEADER, FROM_HEADER};
use statestore_raft::wire::{decode, encode, CONTENT_TYPE};

use crate::node::Node;

/// Notes the sender's clock of every Raft request, and answers with this node's.
pub async fn exchange_clocks(State(node): State<Arc<Node>>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let from = headers.get(FROM_HEADER).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    let clock = headers.get(CLOCK_HEADER).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if let (Some(from), Some(wall_clock_ms)) = (from, clock) {
        node.clock_check.clocks.observe(from, wall_clock_ms);
    }
    let mut response = next.run(request).await;
    if let Ok(value) = HeaderValue::from_str(&wall_clock_ms().to_string()) {
        response.headers_mut().insert(CLOCK_HEADER, value);
    }
    response
}

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
    rpc(body, |request| async move { node.raft.install_snapshot(request).await }).await
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
