//! Online backup and restore of the keys (`statestore-cli snapshot save` / `restore`).
//!
//! - `GET /cluster/backup`: the leader confirms its leadership with a quorum, waits until it
//!   has applied everything committed before, and streams every key of one consistent view of
//!   its state (`statestore_protocol::backup`: value, version, fencing token, deadline; a
//!   checksum at the end). A follower forwards the request to the leader.
//! - `POST /cluster/restore?session=N&first=true|false`: a chunk of key frames, proposed as one
//!   log entry that stores each key as it was. The first chunk opens restore session `N` and is
//!   refused (409 `not_empty`) unless the cluster holds no key: a backup seeds a new cluster. A
//!   later chunk is refused (409) unless it belongs to the session and no client has written a
//!   key since it began (`statestore_statemachine::RestoreRefusal`). A chunk with a version
//!   this store would not have issued, or one ahead of this node's clock by more than
//!   `--max-clock-offset-ms` (1000 ms when the check is off), is refused (400 `bad_version`).

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use statestore_api::body::Restored;
use statestore_protocol::backup::{decode_keys, BackupKey};
use statestore_protocol::{Response as Reply, StoreError};
use statestore_statemachine::{Entry, Operation, RestoreRefusal, VERSION_NODE_ID};
use tokio::sync::mpsc;

use super::ApiError;
use crate::config::DEFAULT_MAX_CLOCK_OFFSET_MS;
use crate::node::{now_ms, Node};
use crate::pipeline::{ensure_linearizable, Work};

/// Bytes the export hands to the HTTP body at a time.
const CHUNK: usize = 256 << 10;
/// The largest restore chunk: the CLI sends 1 MiB, or one larger key alone.
pub const RESTORE_BODY_LIMIT: usize = 64 << 20;

pub async fn save(State(node): State<Arc<Node>>) -> Result<Response, ApiError> {
    ensure_linearizable(&node.raft).await?;
    let (chunks, receiver) = mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    let reader = node.reader.clone();
    tokio::task::spawn_blocking(move || {
        let mut out = ChannelWriter { chunks: chunks.clone(), buffer: Vec::with_capacity(CHUNK) };
        match reader.export_keys(&mut out) {
            Ok(end) => tracing::info!(keys = end.keys, applied_index = end.applied_index, "streamed a backup"),
            Err(e) => {
                tracing::error!(error = %e, "a backup failed");
                // The body ends with an error: the client sees a truncated backup, never a short one.
                let _ = chunks.blocking_send(Err(std::io::Error::other(e.to_string())));
            }
        }
    });
    let stream = futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|chunk| (chunk, receiver))
    });
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], Body::from_stream(stream)).into_response())
}

/// Hands what is written to the HTTP body in chunks; fails once the client is gone.
struct ChannelWriter {
    chunks: mpsc::Sender<Result<Bytes, std::io::Error>>,
    buffer: Vec<u8>,
}

impl Write for ChannelWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buffer.extend_from_slice(bytes);
        if self.buffer.len() >= CHUNK {
            self.flush()?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buffer, Vec::with_capacity(CHUNK)));
        self.chunks
            .blocking_send(Ok(chunk))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away"))
    }
}

#[derive(Debug, Deserialize)]
pub struct RestoreChunk {
    first: bool,
    /// Chosen by the client for the whole restore: every chunk of one restore carries it.
    session: u64,
}

/// The newest version a restored key may carry: this node's clock plus the largest clock offset
/// the cluster tolerates between nodes. A newer one would have the cluster issue versions from
/// the future until its clock caught up, and keep fenced keys locked meanwhile.
fn check_versions(keys: &[BackupKey], now_ms: u64, max_offset: Duration) -> Result<(), ApiError> {
    let bound_ms = if max_offset.is_zero() { DEFAULT_MAX_CLOCK_OFFSET_MS } else { max_offset.as_millis() as u64 };
    let newest = now_ms.saturating_add(bound_ms);
    let bad = |key: &BackupKey, why: String| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_version",
            format!("key {:?}: {why}; nothing of this chunk was restored", String::from_utf8_lossy(&key.key)),
        )
    };
    for key in keys {
        if key.version.node_id != VERSION_NODE_ID {
            return Err(bad(key, format!("its version {} is not one this store issues", key.version)));
        }
        for (what, hlc) in [("version", Some(&key.version)), ("fencing token", key.fencing_token.as_ref())] {
            if let Some(hlc) = hlc.filter(|hlc| hlc.timestamp > newest) {
                return Err(bad(
                    key,
                    format!(
                        "its {what} {hlc} is {} ms ahead of this node's clock, beyond the {bound_ms} ms of \
                         --max-clock-offset-ms",
                        hlc.timestamp - now_ms
                    ),
                ));
            }
        }
    }
    Ok(())
}

pub async fn restore(
    State(node): State<Arc<Node>>,
    Query(chunk): Query<RestoreChunk>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let keys = decode_keys(&body).map_err(|e| ApiError::bad_request(e.to_string()))?;
    check_versions(&keys, now_ms(), node.clock_check.clocks.bound())?;
    let count = keys.len();
    let operation = Operation::RestoreChunk { session: chunk.session, first: chunk.first, keys };
    let applied = node.pipeline.execute(Work::Write(Entry { operation, wall_clock_ms: now_ms() })).await?;
    let crate::pipeline::Outcome::Written(applied) = applied else {
        return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "storage", "a write answered as a read"));
    };
    match applied.reply.response {
        Reply::Int(restored) => Ok(Json(Restored { restored: u64::try_from(restored).unwrap_or(0) }).into_response()),
        Reply::Error(StoreError::Unknown(message)) => {
            Err(ApiError::new(StatusCode::CONFLICT, RestoreRefusal::code_of(&message), message))
        }
        other => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "storage",
            format!("restoring {count} keys answered {other:?}"),
        )),
    }
}
