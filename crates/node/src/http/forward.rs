//! Requests for the leader sent to a follower (membership changes, backups, restores and
//! `/v1/command` writes and linearizable reads) are carried to the leader by the follower itself,
//! so an operator may use any node's address (one that can reach the others by their advertised
//! URLs need not be the operator's machine). The forwarded request carries [`FORWARDED_HEADER`]; a
//! node that receives one and does not lead answers 421 with the leader it knows instead of
//! forwarding again. A `/v1/command` read with `?consistency=local` is answered where it arrives;
//! a write that asks for it is carried to the leader all the same.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{to_bytes, Body};
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use openraft::ServerState;
use statestore_protocol::Command;

use super::command::{take_slot, CLIENT_ID_HEADER, FENCING_TOKEN_HEADER, LOCAL_CONSISTENCY_QUERY, TIMESTAMP_HEADER};
use super::ApiError;
use crate::node::Node;

pub use statestore_api::routes::FORWARDED_HEADER;
/// The largest request body forwarded (a restore chunk).
const BODY_LIMIT: usize = super::backup::RESTORE_BODY_LIMIT;
/// The request headers of `/v1/command` that travel with it.
const COMMAND_HEADERS: [&str; 3] = [TIMESTAMP_HEADER, FENCING_TOKEN_HEADER, CLIENT_ID_HEADER];
/// How long the leader may take: adding a learner waits for it to catch up.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(600);
/// How long the leader may take for a `/v1/command`: it answers 503 itself after 5 s without a
/// quorum, so a leader that has not answered by then is paused or cut off.
const COMMAND_FORWARD_TIMEOUT: Duration = Duration::from_secs(6);

/// Runs the request here when this node leads (or when it was forwarded already, or no leader is
/// known: the handler then answers 421); otherwise sends it to the leader and returns its answer.
pub async fn to_leader(State(node): State<Arc<Node>>, request: Request, next: Next) -> Response {
    forward_unless_leading(&node, request, next, BODY_LIMIT, FORWARD_TIMEOUT).await
}

/// [`to_leader`] for `/v1/command`, within the node's `--max-http-commands` slots: its body limit,
/// and a `consistency=local` read stays here. `consistency=local` is for reads: a write that
/// carries it goes to the leader like any other, and a payload that is no command is answered
/// here (its `-ERR` needs no leader).
pub async fn command_to_leader(State(node): State<Arc<Node>>, request: Request, next: Next) -> Response {
    let _slot = match take_slot(&node) {
        Ok(slot) => slot,
        Err(refused) => return refused.into_response(),
    };
    let asks_local = request.uri().query().is_some_and(|query| query.split('&').any(|q| q == LOCAL_CONSISTENCY_QUERY));
    let request = if asks_local {
        let (parts, body) = request.into_parts();
        let Ok(body) = to_bytes(body, super::COMMAND_BODY_LIMIT).await else {
            return too_large(super::COMMAND_BODY_LIMIT);
        };
        let write = Command::parse(&body).is_ok_and(|command| !command.is_read());
        let request = Request::from_parts(parts, Body::from(body));
        if !write {
            return next.run(request).await;
        }
        request
    } else {
        request
    };
    forward_unless_leading(&node, request, next, super::COMMAND_BODY_LIMIT, COMMAND_FORWARD_TIMEOUT).await
}

fn too_large(body_limit: usize) -> Response {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        format!("a request forwarded to the leader is at most {body_limit} bytes"),
    )
    .into_response()
}

async fn forward_unless_leading(
    node: &Node,
    request: Request,
    next: Next,
    body_limit: usize,
    timeout: Duration,
) -> Response {
    let metrics = node.raft.metrics().borrow().clone();
    if metrics.state == ServerState::Leader || request.headers().contains_key(FORWARDED_HEADER) {
        return next.run(request).await;
    }
    let Some((leader, address)) = metrics.current_leader.and_then(|id| {
        let advertised = metrics.membership_config.membership().get_node(&id).map(|n| n.addr.clone())?;
        Some((id, node.peer_routes.get(&id).cloned().unwrap_or(advertised)))
    }) else {
        return next.run(request).await;
    };
    let (parts, body) = request.into_parts();
    let Ok(body) = to_bytes(body, body_limit).await else {
        return too_large(body_limit);
    };
    let path = parts.uri.path_and_query().map_or(parts.uri.path(), |p| p.as_str());
    let url = format!("{address}{path}");
    let unreachable = |detail: String| {
        ApiError {
            leader_id: Some(leader),
            leader_address: Some(address.clone()),
            ..ApiError::new(
                StatusCode::BAD_GATEWAY,
                "leader_unreachable",
                format!(
                    "this node does not lead, and the leader (node {leader} at {address}) did not answer: {detail}"
                ),
            )
        }
        .into_response()
    };
    let client = match node.http_client(timeout) {
        Ok(client) => client,
        Err(e) => return unreachable(e.to_string()),
    };
    let mut forwarded = client.request(parts.method.clone(), &url).header(FORWARDED_HEADER, node.id.to_string());
    for name in [header::AUTHORIZATION.as_str(), header::CONTENT_TYPE.as_str()].into_iter().chain(COMMAND_HEADERS) {
        if let Some(value) = parts.headers.get(name) {
            forwarded = forwarded.header(name, value.clone());
        }
    }
    let answer = match forwarded.body(body).send().await {
        Ok(answer) => answer,
        Err(e) => return unreachable(e.to_string()),
    };
    let status = answer.status();
    let mut headers = header::HeaderMap::new();
    for name in [header::CONTENT_TYPE.as_str(), TIMESTAMP_HEADER] {
        if let Some(value) = answer.headers().get(name) {
            headers.insert(header::HeaderName::from_static(name), value.clone());
        }
    }
    // Streamed: a backup passes through without being held here.
    let mut response = Response::new(Body::from_stream(answer.bytes_stream()));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}
