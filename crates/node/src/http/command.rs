//! `POST /v1/command`: executes one RESP3 request, as a request over MQTT would be, and answers
//! with the RESP3 reply. For operators and tools that do not speak MQTT.
//!
//! - body: the request payload (e.g. `*3\r\n$3\r\nSET\r\n...`);
//! - headers `statestore-ts`, `statestore-ft`, `statestore-client-id`: the `__ts`, `__ft` and
//!   `__srcId` properties;
//! - `?consistency=local`: answer GET/SCAN from this node's applied state without asking the
//!   leader (may be stale); the default is linearizable, on the leader only.
//!
//! A follower carries the request to its leader and returns the leader's answer
//! ([`super::forward`]), except a `consistency=local` read. The answer is 200 with the reply as
//! the body and its version in `statestore-ts`, or a JSON error: 421 with the leader's address
//! where no leader is known or reachable by forwarding, 502 when the leader did not answer the
//! forwarded request, 503 when no quorum answers in time, 503 `too_many_commands` when
//! `--max-http-commands` requests are being served already.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use statestore_protocol::Request;
use statestore_statemachine::{ClientRequest, Reply};

use super::ApiError;
use crate::node::{Node, ReadConsistency};

pub use statestore_api::routes::{CLIENT_ID_HEADER, FENCING_TOKEN_HEADER, LOCAL_CONSISTENCY_QUERY, TIMESTAMP_HEADER};
/// Takes one of the node's `--max-http-commands` slots, held while the request is served here or
/// forwarded to the leader. Not queued: a caller past the limit is told at once, and may retry.
pub fn take_slot(node: &Node) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
    node.http_commands.clone().try_acquire_owned().map_err(|_| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_commands",
            format!(
                "{} /v1/command requests are being served already, the most this node serves at once \
                 (--max-http-commands); retry later",
                node.max_http_commands
            ),
        )
    })
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandQuery {
    #[serde(default)]
    consistency: Option<String>,
}

fn header_text<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, ApiError> {
    headers
        .get(name)
        .map(|value| value.to_str().map_err(|_| ApiError::bad_request(format!("header {name} is not ASCII text"))))
        .transpose()
}

pub async fn execute(
    State(node): State<Arc<Node>>,
    query: Result<Query<CommandQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let consistency = match query.consistency.as_deref() {
        None | Some("linearizable") => ReadConsistency::Linearizable,
        Some("local") => ReadConsistency::Local,
        Some(other) => {
            return Err(ApiError::bad_request(format!("consistency is `linearizable` or `local`, not {other:?}")))
        }
    };
    let timestamp = header_text(&headers, TIMESTAMP_HEADER)?;
    let fencing_token = header_text(&headers, FENCING_TOKEN_HEADER)?;
    let client_id = header_text(&headers, CLIENT_ID_HEADER)?.map(str::to_string);
    let reply = match Request::parse(&body, timestamp, fencing_token) {
        Err(error) => Reply::error(error),
        Ok(request) if consistency == ReadConsistency::Local && request.command.is_read() => {
            node.read(&request, ReadConsistency::Local).await?
        }
        Ok(request) => {
            node.execute(ClientRequest { request, client_id, identity: None, message_expiry_secs: None }).await?
        }
    };
    let mut response = reply.response.encode().into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    if let Some(version) = reply.version {
        let value =
            HeaderValue::from_str(&version.to_string()).map_err(|_| ApiError::bad_request("unprintable version"))?;
        headers.insert(TIMESTAMP_HEADER, value);
    }
    Ok(response)
}
