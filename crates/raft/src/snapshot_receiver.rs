//! The receiving side of a snapshot sent by the leader in chunks: the chunks are written into
//! the file the state machine gives through a [`PacedFile`] on a blocking thread, so its pages
//! are written out as they come instead of left dirty (a file of hundreds of MiB left dirty, or
//! synced in large steps, holds every log fsync on the same file system up meanwhile, ext4
//! ordered mode), at most at the install rate (a log fsync waits longer the faster the disk is
//! written meanwhile); the file is synced and checked whole before openraft is handed it.
//! openraft treats a failed install as fatal, so a damaged snapshot handed over would stop the
//! member that received it; checked here, it is refused and the leader sends it again from
//! its start (a damaged snapshot at the leader stops the leader, see
//! [`crate::damage::DamageReport`]).

use std::io::{Seek, SeekFrom, Write};
use std::time::Instant;

use openraft::error::{InstallSnapshotError, RaftError, SnapshotMismatch};
use openraft::raft::{InstallSnapshotRequest, InstallSnapshotResponse};
use openraft::{ErrorSubject, ErrorVerb, SnapshotSegmentId, StorageError};
use tokio::sync::Mutex;

use crate::snapshot::{verify_file, PacedFile, SnapshotError};
use crate::types::{NodeId, Raft, Snapshot, SnapshotMeta, TypeConfig};

/// The snapshot being received, if any. One per node.
#[derive(Default)]
pub struct SnapshotReceiver {
    incoming: Mutex<Option<Incoming>>,
    /// Bytes a second a snapshot is written at most as it comes; none: no limit.
    rate: Option<u64>,
}

/// A snapshot whose chunks are being written.
struct Incoming {
    id: String,
    /// When its first chunk came.
    started: Instant,
    file: PacedFile,
}

type ReceiveError = RaftError<NodeId, InstallSnapshotError>;

impl SnapshotReceiver {
    /// A receiver writing what it receives at most `rate` bytes a second (none or 0: no limit).
    pub fn new(rate: Option<u64>) -> SnapshotReceiver {
        SnapshotReceiver { incoming: Mutex::default(), rate: rate.filter(|&r| r > 0) }
    }

    /// Takes one chunk; installs the snapshot once its last chunk is in and it checks out.
    pub async fn receive(
        &self,
        raft: &Raft,
        request: InstallSnapshotRequest<TypeConfig>,
    ) -> Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>> {
        let vote = request.vote;
        let own_vote = raft.with_raft_state(|state| *state.vote_ref()).await?;
        if vote < own_vote {
            // From a leader of an older term: nothing to receive.
            return Ok(InstallSnapshotResponse { vote: own_vote });
        }
        let id = request.meta.snapshot_id.clone();
        let offset = request.offset;
        let received = {
            let mut incoming = self.incoming.lock().await;
            write_chunk(&mut incoming, raft, request, self.rate).await?
        };
        let Some((meta, data)) = received else {
            return Ok(InstallSnapshotResponse { vote: own_vote });
        };
        let checked = async {
            let mut file = data.try_clone()?;
            let joined = tokio::task::spawn_blocking(move || {
                file.seek(SeekFrom::Start(0))?;
                verify_file(file)
            })
            .await;
            joined.map_err(|e| SnapshotError::Io(std::io::Error::other(e)))?
        };
        if let Err(e) = checked.await {
            tracing::error!(
                snapshot = id,
                error = %e,
                "refused a snapshot received from the leader: it does not read back whole; asked for it again"
            );
            let start = SnapshotSegmentId { id: id.clone(), offset: 0 };
            let got = SnapshotSegmentId { id, offset };
            return Err(RaftError::APIError(InstallSnapshotError::SnapshotMismatch(SnapshotMismatch {
                expect: start,
                got,
            })));
        }
        let snapshot = Box::new(tokio::fs::File::from_std(data));
        let answer = raft.install_full_snapshot(vote, Snapshot { meta, snapshot }).await?;
        Ok(answer.into())
    }
}

/// Writes one chunk into the snapshot being received (a chunk at offset 0 of another snapshot
/// starts a new one); the whole snapshot, synced, once its last chunk is in.
async fn write_chunk(
    incoming: &mut Option<Incoming>,
    raft: &Raft,
    request: InstallSnapshotRequest<TypeConfig>,
    rate: Option<u64>,
) -> Result<Option<(SnapshotMeta, std::fs::File)>, ReceiveError> {
    let id = &request.meta.snapshot_id;
    let continued = incoming.as_ref().is_some_and(|incoming| incoming.id == *id);
    if !continued && request.offset != 0 {
        return Err(RaftError::APIError(InstallSnapshotError::SnapshotMismatch(SnapshotMismatch {
            expect: SnapshotSegmentId { id: id.clone(), offset: 0 },
            got: SnapshotSegmentId { id: id.clone(), offset: request.offset },
        })));
    }
    // A chunk that fails to be written drops the snapshot: the next chunk is then refused and
    // the leader starts again from offset 0.
    let mut receiving = match incoming.take() {
        Some(receiving) if continued => receiving,
        _ => {
            let file = raft.begin_receiving_snapshot().await.map_err(|e| match e {
                RaftError::APIError(never) => match never {},
                RaftError::Fatal(fatal) => RaftError::Fatal(fatal),
            })?;
            let file = PacedFile::new(file.into_std().await, rate);
            Incoming { id: id.clone(), started: Instant::now(), file }
        }
    };
    let signature = request.meta.signature();
    let storage_error = |verb: ErrorVerb, e: std::io::Error| {
        RaftError::Fatal(StorageError::from_io_error(ErrorSubject::Snapshot(Some(signature.clone())), verb, e).into())
    };
    let (offset, data, done) = (request.offset, request.data, request.done);
    // Off the async workers: a write-out waits for the disk.
    let written = tokio::task::spawn_blocking(move || {
        let written = (|| {
            if offset != receiving.file.position() {
                receiving.file.seek_to(offset).map_err(|e| (ErrorVerb::Seek, e))?;
            }
            receiving.file.write_all(&data).map_err(|e| (ErrorVerb::Write, e))
        })();
        (receiving, written)
    })
    .await;
    let (receiving, written) = written.map_err(|e| storage_error(ErrorVerb::Write, std::io::Error::other(e)))?;
    written.map_err(|(verb, e)| storage_error(verb, e))?;
    if !done {
        *incoming = Some(receiving);
        return Ok(None);
    }
    let Incoming { started, file, .. } = receiving;
    let size = file.position();
    let synced =
        tokio::task::spawn_blocking(move || file.finish()).await.unwrap_or_else(|e| Err(std::io::Error::other(e)));
    let file = synced.map_err(|e| storage_error(ErrorVerb::Write, e))?;
    tracing::info!(
        snapshot = request.meta.snapshot_id,
        mib = format!("{:.1}", size as f64 / (1 << 20) as f64),
        received_s = format!("{:.2}", started.elapsed().as_secs_f64()),
        "received a snapshot from the leader"
    );
    Ok(Some((request.meta, file)))
}
