//! The receiving side of a snapshot sent by the leader in chunks: the chunks are streamed into
//! a file as openraft does it, but the file is checked whole before openraft is handed it.
//! openraft treats a failed install as fatal, so a damaged snapshot handed over would stop the
//! member that received it; checked here, it is refused and the leader sends it again from
//! its start (a damaged snapshot at the leader stops the leader, see
//! [`crate::damage::DamageReport`]).

use openraft::error::{InstallSnapshotError, RaftError, SnapshotMismatch};
use openraft::network::snapshot_transport::{Chunked, SnapshotTransport, Streaming};
use openraft::raft::{InstallSnapshotRequest, InstallSnapshotResponse};
use openraft::SnapshotSegmentId;
use tokio::io::{AsyncSeekExt, SeekFrom};
use tokio::sync::Mutex;

use crate::snapshot::{verify_file, SnapshotError};
use crate::types::{NodeId, Raft, Snapshot, TypeConfig};

/// The snapshot being received, if any. One per node.
#[derive(Default)]
pub struct SnapshotReceiver {
    streaming: Mutex<Option<Streaming<TypeConfig>>>,
}

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
            let mut streaming = self.streaming.lock().await;
            Chunked::receive_snapshot(&mut streaming, raft, request).await?
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
