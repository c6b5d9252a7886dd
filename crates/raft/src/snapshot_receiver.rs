//! The receiving side of a snapshot sent by the leader in chunks: the chunks are written into
//! the file the state machine gives, synced every [`SYNC_EVERY`] bytes (a file of hundreds of
//! MiB left dirty until one final sync would hold every WAL fsync of the node up meanwhile, ext4
//! ordered mode), and the file is checked whole before openraft is handed it.
//! openraft treats a failed install as fatal, so a damaged snapshot handed over would stop the
//! member that received it; checked here, it is refused and the leader sends it again from
//! its start (a damaged snapshot at the leader stops the leader, see
//! [`crate::damage::DamageReport`]).

use openraft::error::{InstallSnapshotError, RaftError, SnapshotMismatch};
use openraft::raft::{InstallSnapshotRequest, InstallSnapshotResponse};
use openraft::{ErrorSubject, ErrorVerb, SnapshotSegmentId, StorageError};
use tokio::io::{AsyncSeekExt, AsyncWriteExt, SeekFrom};
use tokio::sync::Mutex;

use crate::snapshot::{verify_file, SnapshotError, SYNC_EVERY};
use crate::types::{NodeId, Raft, Snapshot, TypeConfig};

/// The snapshot being received, if any. One per node.
#[derive(Default)]
pub struct SnapshotReceiver {
    incoming: Mutex<Option<Incoming>>,
}

/// A snapshot whose chunks are being written.
struct Incoming {
    id: String,
    /// Where the next chunk is written unless it says otherwise.
    offset: u64,
    /// Bytes written since the file was last synced.
    unsynced: u64,
    file: Box<tokio::fs::File>,
}

type ReceiveError = RaftError<NodeId, InstallSnapshotError>;

impl SnapshotReceiver {
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
            write_chunk(&mut incoming, raft, request).await?
        };
        let Some(Snapshot { meta, snapshot: mut data }) = received else {
            return Ok(InstallSnapshotResponse { vote: own_vote });
        };
        let checked = async {
            data.seek(SeekFrom::Start(0)).await?;
            let file = data.try_clone().await?.into_std().await;
            let joined = tokio::task::spawn_blocking(move || verify_file(file)).await;
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
        let answer = raft.install_full_snapshot(vote, Snapshot { meta, snapshot: data }).await?;
        Ok(answer.into())
    }
}

/// Writes one chunk into the snapshot being received (a chunk at offset 0 of another snapshot
/// starts a new one); the whole snapshot, once its last chunk is in.
async fn write_chunk(
    incoming: &mut Option<Incoming>,
    raft: &Raft,
    request: InstallSnapshotRequest<TypeConfig>,
) -> Result<Option<Snapshot>, ReceiveError> {
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
            Incoming { id: id.clone(), offset: 0, unsynced: 0, file }
        }
    };
    let storage_error = |verb: ErrorVerb, e: std::io::Error| {
        RaftError::Fatal(
            StorageError::from_io_error(ErrorSubject::Snapshot(Some(request.meta.signature())), verb, e).into(),
        )
    };
    if request.offset != receiving.offset {
        receiving.file.seek(SeekFrom::Start(request.offset)).await.map_err(|e| storage_error(ErrorVerb::Seek, e))?;
        receiving.offset = request.offset;
    }
    receiving.file.write_all(&request.data).await.map_err(|e| storage_error(ErrorVerb::Write, e))?;
    receiving.offset += request.data.len() as u64;
    receiving.unsynced += request.data.len() as u64;
    if receiving.unsynced >= SYNC_EVERY || request.done {
        receiving.file.sync_data().await.map_err(|e| storage_error(ErrorVerb::Write, e))?;
        receiving.unsynced = 0;
    }
    if !request.done {
        *incoming = Some(receiving);
        return Ok(None);
    }
    Ok(Some(Snapshot { meta: request.meta, snapshot: receiving.file }))
}
