//! Membership changes, backups and restores sent to a follower are carried to the leader by the
//! follower itself, so an operator may use any node's address (one that can reach the others by
//! their advertised URLs need not be the operator's machine). The forwarded request carries [`FORWARDED_HEADER`]; a
//! node that receives one and does not lead answers 421 with the leader it knows instead of
//! forwarding again.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{to_bytes, Body};
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use openraft::ServerState;

use super::ApiError;
use crate::node::Node;

/// Marks a request a node has forwarded to its leader.
pub const FORWARDED_HEADER: &str = "x-statestore-forwarded-by";
/// The largest request body forwarded (a restore chunk).
const BODY_LIMIT: usize = super::backup::RESTORE_BODY_LIMIT;
/// How long the leader may take: adding a learner waits for it to catch up.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(600);

/// Runs the request here when this node leads (or when it was forwarded already, or no leader is
/// known: the handler then answers 421); otherwise sends it to the leader and returns its answer.
pub async fn to_leader(State(node): State<Arc<Node>>, request: Request, next: Next) -> Response {
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
    let Ok(body) = to_bytes(body, BODY_LIMIT).await else {
        return ApiError::bad_request(format!("a forwarded request is at most {BODY_LIMIT} bytes")).into_response();
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
    let client = match node.http_client(FORWARD_TIMEOUT) {
        Ok(client) => client,
        Err(e) => return unreachable(e.to_string()),
    };
    let mut forwarded = client.request(parts.method.clone(), &url).header(FORWARDED_HEADER, node.id.to_string());
    for name in [header::AUTHORIZATION, header::CONTENT_TYPE] {
        if let Some(value) = parts.headers.get(&name) {
            forwarded = forwarded.header(name, value.clone());
        }
    }
    let answer = match forwarded.body(body).send().await {
        Ok(answer) => answer,
        Err(e) => return unreachable(e.to_string()),
    };
    let status = answer.status();
    let content_type = answer.headers().get(header::CONTENT_TYPE).cloned();
    // Streamed: a backup passes through without being held here.
    let mut response = Response::new(Body::from_stream(answer.bytes_stream()));
    *response.status_mut() = status;
    if let Some(content_type) = content_type {
        response.headers_mut().insert(header::CONTENT_TYPE, content_type);
    }
    response
}
