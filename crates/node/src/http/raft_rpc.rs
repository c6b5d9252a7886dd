//! The server side of the Raft RPCs: decode the bincode request, hand it to openraft, encode its
//! `Result` (errors included) as the answer.

use std::future::Future;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;
use statestore_raft::wire::{decode, encode, CONTENT_TYPE};

use crate::node::Node;

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
