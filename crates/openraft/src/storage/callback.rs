//! Callbacks used by Storage API

use std::io;

use tokio::sync::mpsc;
use tokio::sync::oneshot;

use crate::async_runtime::AsyncOneshotSendExt;
use crate::core::notify::Notify;
use crate::raft_state::io_state::log_io_id::LogIOId;
use crate::type_config::alias::OneshotSenderOf;
use crate::LogId;
use crate::RaftTypeConfig;
use crate::StorageIOError;
use crate::Vote;

/// A oneshot callback for completion of log io operation.
pub struct LogFlushed<C>
where C: RaftTypeConfig
{
    log_io_id: LogIOId<C::NodeId>,
    tx: FlushedTo<C>,
}

/// Where a flush is reported. (Changed from the published crate; see this crate's README.)
enum FlushedTo<C>
where C: RaftTypeConfig
{
    /// The caller awaits the report.
    Caller(OneshotSenderOf<C, Result<LogIOId<C::NodeId>, io::Error>>),
    /// A leader's own append: the core goes on and is told when it is flushed, in the order the
    /// log store reports flushes.
    Core {
        tx_notify: mpsc::UnboundedSender<Notify<C>>,
        vote: Vote<C::NodeId>,
        log_id: LogId<C::NodeId>,
    },
}

impl<C> LogFlushed<C>
where C: RaftTypeConfig
{
    pub(crate) fn new(
        log_io_id: LogIOId<C::NodeId>,
        tx: OneshotSenderOf<C, Result<LogIOId<C::NodeId>, io::Error>>,
    ) -> Self {
        Self {
            log_io_id,
            tx: FlushedTo::Caller(tx),
        }
    }

    /// A callback that reports to the core as [`Notify::LocalLogFlushed`].
    pub(crate) fn to_core(
        tx_notify: mpsc::UnboundedSender<Notify<C>>,
        vote: Vote<C::NodeId>,
        log_id: LogId<C::NodeId>,
    ) -> Self {
        Self {
            log_io_id: LogIOId::new(vote.clone(), Some(log_id.clone())),
            tx: FlushedTo::Core { tx_notify, vote, log_id },
        }
    }

    /// Report log io completion event.
    ///
    /// It will be called when the log is successfully appended to the storage or an error occurs.
    pub fn log_io_completed(self, result: Result<(), io::Error>) {
        if let Err(e) = &result {
            tracing::error!("LogFlush error: {}, while flushing upto {}", e, self.log_io_id);
        }
        let log_io_id = self.log_io_id;
        match self.tx {
            FlushedTo::Caller(tx) => {
                if let Err(e) = tx.send(result.map(|_| log_io_id.clone())) {
                    tracing::error!("failed to send log io completion event: {:?}", e);
                }
            }
            FlushedTo::Core { tx_notify, vote, log_id } => {
                let flushed = Notify::LocalLogFlushed {
                    vote,
                    log_id,
                    result: result.map_err(|e| e.to_string()),
                };
                // The core goes on without waiting for a flush, so it may have stopped since.
                if tx_notify.send(flushed).is_err() {
                    tracing::debug!("the core stopped before the flush of {} was reported", log_io_id);
                }
            }
        }
    }
}

/// A oneshot callback for completion of applying logs to state machine.
pub struct LogApplied<C>
where C: RaftTypeConfig
{
    last_log_id: LogId<C::NodeId>,
    tx: oneshot::Sender<Result<(LogId<C::NodeId>, Vec<C::R>), StorageIOError<C::NodeId>>>,
}

impl<C> LogApplied<C>
where C: RaftTypeConfig
{
    #[allow(dead_code)]
    pub(crate) fn new(
        last_log_id: LogId<C::NodeId>,
        tx: oneshot::Sender<Result<(LogId<C::NodeId>, Vec<C::R>), StorageIOError<C::NodeId>>>,
    ) -> Self {
        Self { last_log_id, tx }
    }

    /// Report apply io completion event.
    ///
    /// It will be called when the log is successfully applied to the state machine or an error
    /// occurs.
    pub fn completed(self, result: Result<Vec<C::R>, StorageIOError<C::NodeId>>) {
        let res = match result {
            Ok(x) => {
                tracing::debug!("LogApplied upto {}", self.last_log_id);
                let resp = (self.last_log_id.clone(), x);
                self.tx.send(Ok(resp))
            }
            Err(e) => {
                tracing::error!("LogApplied error: {}, while applying upto {}", e, self.last_log_id);
                self.tx.send(Err(e))
            }
        };

        if let Err(_e) = res {
            tracing::error!("failed to send apply complete event, last_log_id: {}", self.last_log_id);
        }
    }
}
