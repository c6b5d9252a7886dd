//! The node's HTTP server (axum): Raft RPC between nodes, the cluster API, health, readiness,
//! metrics, and a command endpoint.
//!
//! | route | what |
//! |---|---|
//! | `POST /raft/append`, `/raft/vote`, `/raft/snapshot`, `/raft/prevote`, `/raft/stand`, `/raft/release` | Raft RPC, bincode bodies ([`raft_rpc`]) |
//! | `GET /raft/append/stream` | a leader's appends to this node over one upgraded connection ([`raft_rpc::append_stream`]) |
//! | `GET /cluster`, `POST /cluster/learners`, `POST /cluster/members`, `POST /cluster/leader` | membership and leadership, JSON ([`cluster`]); a follower forwards changes to the leader ([`forward`]) |
//! | `GET /health`, `GET /ready`, `GET /metrics` | liveness, readiness, Prometheus ([`cluster`]) |
//! | `POST /v1/command` | execute one RESP3 request ([`command`]); a follower forwards it to the leader ([`forward`]) |
//! | `GET /cluster/backup`, `POST /cluster/restore` | online backup of the keys, and restoring one into a new cluster ([`backup`]) |
//!
//! With a cluster secret configured, Raft RPC, the `POST /cluster/...` routes and `/v1/command`
//! answer 401 unless the request carries `Authorization: Bearer <secret>`; with TLS ([`tls`]),
//! they also need a client certificate the cluster's CA signs. `GET /cluster`, `/health`,
//! `/ready` and `/metrics` stay open.

pub mod backup;
pub mod cluster;
pub mod command;
pub mod forward;
pub mod raft_rpc;
pub mod serve;
pub mod tls;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use statestore_api::body::ErrorBody;
use statestore_api::routes;

use crate::node::{ExecuteError, Node};

/// Raft RPC bodies and streamed append frames: an append of 64 entries of 1 MiB values, or a
/// snapshot chunk, fits.
pub(crate) const RAFT_BODY_LIMIT: usize = 128 << 20;
/// A RESP3 request of `/v1/command`.
pub(crate) const COMMAND_BODY_LIMIT: usize = 16 << 20;

/// The node's routes. With `client_certificates`, the guarded ones need a verified client
/// certificate (the server must then be served by [`serve::serve`] over a [`tls::TlsListener`]).
pub fn router(node: Arc<Node>, client_certificates: bool) -> Router {
    let authenticated = middleware::from_fn_with_state(node.clone(), require_secret);
    let raft = Router::new()
        .route(statestore_raft::network::APPEND_PATH, post(raft_rpc::append))
        .route(statestore_raft::append_stream::APPEND_STREAM_PATH, get(raft_rpc::append_stream))
        .route(statestore_raft::network::VOTE_PATH, post(raft_rpc::vote))
        .route(statestore_raft::network::SNAPSHOT_PATH, post(raft_rpc::snapshot))
        .route(statestore_raft::election::PREVOTE_PATH, post(raft_rpc::prevote))
        .route(statestore_raft::election::STAND_PATH, post(raft_rpc::stand))
        .route(statestore_raft::election::RELEASE_PATH, post(raft_rpc::release))
        .layer(DefaultBodyLimit::max(RAFT_BODY_LIMIT))
        .route_layer(middleware::from_fn_with_state(node.clone(), raft_rpc::check_peer));
    let command = Router::new()
        .route(routes::COMMAND, post(command::execute))
        .layer(DefaultBodyLimit::max(COMMAND_BODY_LIMIT))
        .route_layer(middleware::from_fn_with_state(node.clone(), forward::command_to_leader));
    let membership = Router::new()
        .route(routes::LEARNERS, post(cluster::add_learner))
        .route(routes::MEMBERS, post(cluster::change_members))
        .route(routes::LEADER, post(cluster::move_leadership))
        .route(routes::BACKUP, get(backup::save))
        .route(routes::RESTORE, post(backup::restore).layer(DefaultBodyLimit::max(backup::RESTORE_BODY_LIMIT)))
        .route_layer(middleware::from_fn_with_state(node.clone(), forward::to_leader))
        .route(routes::SNAPSHOT, post(cluster::snapshot));
    let mut guarded = raft.merge(command).merge(membership).route_layer(authenticated);
    if client_certificates {
        guarded = guarded.route_layer(middleware::from_fn(tls::require_client_certificate));
    }
    Router::new()
        .route(routes::CLUSTER, get(cluster::status))
        .route(routes::HEALTH, get(cluster::health))
        .route(routes::READY, get(cluster::ready))
        .route(routes::METRICS, get(cluster::metrics))
        .merge(guarded)
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .with_state(node)
}

/// Lets a request through only if it carries the cluster secret, when one is configured. Runs
/// before the body is read.
async fn require_secret(State(node): State<Arc<Node>>, request: Request, next: Next) -> Response {
    if let Some(secret) = &node.cluster_secret {
        let given = request.headers().get(header::AUTHORIZATION).map(|value| value.as_bytes());
        if !given.is_some_and(|given| secret.authorizes(given)) {
            let message = if given.is_some() { "wrong cluster secret" } else { "this route needs the cluster secret" };
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                format!("{message}: send `Authorization: Bearer <secret>`"),
            )
            .into_response();
        }
    }
    next.run(request).await
}

/// An error answer: its status, and its body as [`ErrorBody`] (`{"code": "...", "message": "...",
/// "leader_id": ..., "leader_address": ...}`).
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub leader_id: Option<u64>,
    pub leader_address: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: message.into(), leader_id: None, leader_address: None }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }
}

impl From<ExecuteError> for ApiError {
    fn from(error: ExecuteError) -> ApiError {
        let message = error.to_string();
        match error {
            ExecuteError::ForwardToLeader { leader_id, leader_address } => ApiError {
                // 421 Misdirected Request: the same request succeeds at `leader_address`.
                status: StatusCode::MISDIRECTED_REQUEST,
                code: "not_leader",
                message,
                leader_id,
                leader_address,
            },
            ExecuteError::Unavailable(_) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message),
            ExecuteError::Storage(_) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "storage", message),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            code: self.code.to_string(),
            message: self.message,
            leader_id: self.leader_id,
            leader_address: self.leader_address,
        };
        (self.status, Json(body)).into_response()
    }
}
