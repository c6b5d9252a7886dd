//! Appends over one long-lived connection per peer.
//!
//! Sent as one HTTP request each, an append cost the leader and the follower about a third of
//! their replication CPU in HTTP alone: formatting and parsing headers, routing, the connection
//! pool's hand-offs between tasks. So the leader's replication stream to a peer asks once,
//! `GET` [`APPEND_STREAM_PATH`] with `Upgrade: ` [`UPGRADE_PROTOCOL`], and after `101 Switching
//! Protocols` the connection carries frames: a 4-byte big-endian length, then a bincode body.
//! The leader sends an [`AppendFrame`], the follower answers it with an [`AnswerFrame`], one at
//! a time (openraft sends a peer its next append only after the answer to the last).
//!
//! The upgrade request passes every check a Raft request passes (the cluster secret, the
//! client certificate, the identity headers), and each frame carries the sender's clock and
//! identity claims again, checked as a request's headers are. A missed deadline or an error
//! closes the connection (an answer that comes late must not be taken for the next one's); the
//! next append opens another. A follower that answers the upgrade with 404 or 405 (a version
//! without streams, during a rolling upgrade) gets its appends as requests.

use std::io;

use openraft::error::RaftError;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::identity::Claims;
use crate::types::{NodeId, TypeConfig};

/// Where a peer's appends stream is opened.
pub const APPEND_STREAM_PATH: &str = "/raft/append/stream";
/// The `Upgrade` protocol of an appends stream.
pub const UPGRADE_PROTOCOL: &str = "statestore-append/1";
/// The largest answer frame a leader reads: answers are a few bytes, or an error's text.
pub const MAX_ANSWER_BYTES: usize = 1 << 20;

/// Who sends a frame, its clock when it did, and the identity claims a request's headers carry
/// (none of them when the sender's network was built without checks).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Stamp {
    pub from: Option<NodeId>,
    pub wall_clock_ms: Option<u64>,
    pub incarnation: Option<String>,
    pub cluster: Option<String>,
    /// The incarnation the sender expects the receiver to have.
    pub expected: Option<String>,
}

impl Stamp {
    pub fn claims(&self) -> Claims<'_> {
        Claims {
            incarnation: self.incarnation.as_deref(),
            cluster: self.cluster.as_deref(),
            expected: self.expected.as_deref(),
        }
    }
}

/// One append, leader to follower: the leader sends it with a borrowed request, the follower
/// reads it as [`ReceivedAppend`].
#[derive(Debug, Serialize, Deserialize)]
pub struct AppendFrame<R> {
    pub stamp: Stamp,
    pub request: R,
}

pub type ReceivedAppend = AppendFrame<AppendEntriesRequest<TypeConfig>>;

/// The answer to one [`AppendFrame`].
#[derive(Debug, Serialize, Deserialize)]
pub struct AnswerFrame {
    pub wall_clock_ms: u64,
    pub incarnation: String,
    pub cluster: Option<String>,
    /// openraft's result, or why the append was refused before openraft saw it (the sender is
    /// not the storage the cluster enrolled, or belongs to another cluster).
    pub answer: Result<Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>, String>,
}

impl AnswerFrame {
    pub fn claims(&self) -> Claims<'_> {
        Claims { incarnation: Some(&self.incarnation), cluster: self.cluster.as_deref(), expected: None }
    }
}

/// Writes `value` as one frame and flushes it.
pub async fn write_frame<W: AsyncWrite + Unpin, T: Serialize>(writer: &mut W, value: &T) -> io::Result<()> {
    let mut frame = vec![0; 4];
    bincode::serde::encode_into_std_write(value, &mut frame, bincode::config::standard())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("encoding a frame: {e}")))?;
    let length = u32::try_from(frame.len() - 4)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a frame of 4 GiB or more"))?;
    frame[..4].copy_from_slice(&length.to_be_bytes());
    writer.write_all(&frame).await?;
    writer.flush().await
}

/// Reads one frame of at most `limit` bytes; `None` when the connection ends between frames.
/// A frame over the limit or one that does not decode is an `InvalidData` error.
pub async fn read_frame<R: AsyncRead + Unpin, T: DeserializeOwned>(
    reader: &mut R,
    limit: usize,
) -> io::Result<Option<T>> {
    let mut length = [0; 4];
    match reader.read_exact(&mut length).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let length = u32::from_be_bytes(length) as usize;
    if length > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a frame of {length} bytes, over the limit of {limit}"),
        ));
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).await?;
    crate::wire::decode(&body)
        .map(Some)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("a frame that does not decode: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_and_limits_hold() {
        let (mut near, mut far) = tokio::io::duplex(1 << 16);
        let stamp = Stamp { from: Some(1), wall_clock_ms: Some(7), incarnation: Some("i".into()), ..Stamp::default() };
        write_frame(&mut near, &stamp).await.unwrap();
        let read: Stamp = read_frame(&mut far, 1024).await.unwrap().unwrap();
        assert_eq!((read.from, read.wall_clock_ms, read.incarnation.as_deref()), (Some(1), Some(7), Some("i")));

        write_frame(&mut near, &vec![0u8; 2048]).await.unwrap();
        let over = read_frame::<_, Vec<u8>>(&mut far, 1024).await.unwrap_err();
        assert!(over.to_string().contains("over the limit of 1024"), "{over}");

        let (mut near, mut far) = tokio::io::duplex(1 << 16);
        near.write_all(&[0, 0, 0, 3, 0xFF, 0xFF, 0xFF]).await.unwrap();
        let garbage = read_frame::<_, Stamp>(&mut far, 1024).await.unwrap_err();
        assert_eq!(garbage.kind(), io::ErrorKind::InvalidData, "{garbage}");

        drop(near);
        assert!(read_frame::<_, Stamp>(&mut far, 1024).await.unwrap().is_none(), "an end between frames is no error");
    }
}
