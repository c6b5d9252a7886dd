//! Runs a node: storage, Raft, the HTTP server, and a graceful stop on SIGTERM or SIGINT.

use std::future::Future;
use std::sync::Arc;

use anyhow::Context;
use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::config::NodeConfig;
use crate::http;
use crate::mqtt::FrontEnd;
use crate::node::Node;

/// A node serving HTTP in the background.
pub struct RunningNode {
    pub node: Arc<Node>,
    pub front_end: Option<Arc<FrontEnd>>,
    stop: oneshot::Sender<()>,
    served: JoinHandle<anyhow::Result<()>>,
}

impl RunningNode {
    /// Hands leadership over if it leads ([`Node::hand_over_leadership`]), stops accepting
    /// requests, lets the ones in flight finish (for at most [`HTTP_DRAIN`]), then stops Raft.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.node.hand_over_leadership().await;
        if let Some(front_end) = &self.front_end {
            front_end.stop().await;
        }
        let _ = self.stop.send(());
        self.node.close_to_peers();
        let served = drain(self.served).await;
        self.node.shutdown().await;
        served
    }

    /// Stops at once because the node cannot go on (Raft stopped, damaged storage): Raft first,
    /// so that nothing more is sent or waited for, then the front end and HTTP.
    async fn stop_now(self) -> anyhow::Result<()> {
        self.node.shutdown().await;
        if let Some(front_end) = &self.front_end {
            front_end.stop().await;
        }
        let _ = self.stop.send(());
        drain(self.served).await
    }
}

/// How long a stopping node lets HTTP requests in flight finish before it closes them (a
/// learner being waited for, a restore being uploaded).
pub const HTTP_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// Waits for the HTTP server to finish the requests in flight, at most [`HTTP_DRAIN`].
async fn drain(mut served: JoinHandle<anyhow::Result<()>>) -> anyhow::Result<()> {
    match tokio::time::timeout(HTTP_DRAIN, &mut served).await {
        Ok(joined) => joined.context("the HTTP server task failed")?,
        Err(_) => {
            tracing::warn!("HTTP requests still in flight {HTTP_DRAIN:?} after the stop; closing them");
            served.abort();
            Ok(())
        }
    }
}

/// Binds the listen address, starts the node and serves HTTP in the background.
pub async fn start(config: &NodeConfig) -> anyhow::Result<RunningNode> {
    // Bind first: a port taken by another process is reported before anything is written.
    let listener = TcpListener::bind(config.listen).await.with_context(|| format!("binding {}", config.listen))?;
    let tls_server =
        config.tls.as_ref().map(http::tls::server_config).transpose().context("the TLS settings (--tls-*)")?;
    let node = Node::start(config).await.context("starting the node")?;
    tracing::info!(id = config.id, listen = %config.listen, advertise = %config.advertise, "serving");
    let front_end = match &config.broker {
        Some(broker) => {
            tracing::info!(broker = %format!("{}:{}", broker.host, broker.port), client_id = %broker.client_id, "starting the MQTT front end");
            Some(FrontEnd::start(node.clone(), broker).context("starting the MQTT front end")?)
        }
        None => {
            tracing::warn!(
                "no --broker: this node serves HTTP only; in a cluster whose clients use MQTT, give every voter \
                 the broker: this node hands leadership to a voter connected to its broker whenever it wins an \
                 election, and MQTT requests wait meanwhile"
            );
            node.follow_no_broker();
            None
        }
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let stopped = async move {
        let _ = stopped.await;
    };
    let limits = config.http_limits;
    let served = match tls_server {
        Some(tls) => {
            let listener = http::tls::TlsListener::new(listener, tls, limits.max_handshakes)?;
            let app = http::router(node.clone(), true);
            tokio::spawn(
                async move { http::serve::serve(listener, app, limits, stopped).await.context("serving HTTPS") },
            )
        }
        None => {
            let app = http::router(node.clone(), false);
            // Answers (an append's above all) go out at once, not after the peer's next ACK.
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            tokio::spawn(
                async move { http::serve::serve(listener, app, limits, stopped).await.context("serving HTTP") },
            )
        }
    };
    Ok(RunningNode { node, front_end, stop, served })
}

/// Exit code of a wrong setting.
pub const EXIT_CONFIG: i32 = 2;
/// Exit code of damaged storage: a checksum or record of the WAL, a table file or a snapshot does
/// not match. Restarting does not help; docs/operations.md says how to recover.
pub const EXIT_DAMAGED_STORAGE: i32 = 3;

/// Exit code of a disk that failed a read, write or fsync (an I/O error, not damage found in
/// what was read): what the node wrote may not be on its disk. docs/operations.md, "A disk that
/// fails", says what to check before it runs again.
pub const EXIT_STORAGE_FAILED: i32 = 4;

/// Raft stopped on its own (a storage error or a bug), not because the node was told to stop.
#[derive(Debug, thiserror::Error)]
#[error("raft stopped: {reason}")]
pub struct RaftStopped {
    pub reason: String,
    /// Whether the storage failed (rather than a panic).
    pub storage: bool,
}

impl RaftStopped {
    fn new(fatal: &openraft::error::Fatal<statestore_raft::types::NodeId>) -> RaftStopped {
        RaftStopped { reason: fatal.to_string(), storage: matches!(fatal, openraft::error::Fatal::StorageError(_)) }
    }
}

/// Whether `error` says the node's storage is damaged.
pub fn is_damaged_storage(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause.downcast_ref::<statestore_raft::OpenError>().is_some_and(statestore_raft::OpenError::is_corruption)
            || cause.is::<statestore_raft::Damaged>()
            || cause.downcast_ref::<RaftStopped>().is_some_and(|stopped| {
                stopped.reason.contains("Corruption")
                    || statestore_raft::snapshot::describes_damage(&stopped.reason)
                    || statestore_raft::log_files::describes_damage(&stopped.reason)
            })
    })
}

/// Whether `error` says the node's storage failed without being found damaged: an I/O error
/// while Raft ran, or a disk that failed or is full when the node started.
pub fn is_failed_storage(error: &anyhow::Error) -> bool {
    !is_damaged_storage(error)
        && error.chain().any(|cause| {
            cause.downcast_ref::<RaftStopped>().is_some_and(|stopped| stopped.storage)
                || cause
                    .downcast_ref::<statestore_raft::OpenError>()
                    .is_some_and(statestore_raft::OpenError::is_disk_failure)
                || cause.downcast_ref::<std::io::Error>().is_some_and(statestore_raft::is_disk_failure)
        })
}

/// Whether `error` says the node's disk is full.
pub fn is_full_disk(error: &anyhow::Error) -> bool {
    is_failed_storage(error) && statestore_raft::describes_full_disk(&format!("{error:#}"))
}

/// Serves until `stop` completes, then stops gracefully. Returns an error if Raft stops on its own
/// first (e.g. the storage failed), so that the process exits instead of lingering unable to
/// serve.
pub async fn run(config: NodeConfig, stop: impl Future<Output = ()>) -> anyhow::Result<()> {
    let running = start(&config).await?;
    let mut metrics = running.node.raft.metrics();
    let fatal = async {
        loop {
            if let Err(fatal) = &metrics.borrow_and_update().running_state {
                return RaftStopped::new(fatal);
            }
            if metrics.changed().await.is_err() {
                return RaftStopped { reason: "raft stopped".into(), storage: false };
            }
        }
    };
    let damage = running.node.reader.damage();
    tokio::select! {
        _ = stop => {}
        fatal = fatal => {
            tracing::error!(error = %fatal.reason, "raft stopped on its own; the node stops");
            let _ = running.stop_now().await;
            return Err(fatal.into());
        }
        damaged = damage.found() => {
            tracing::error!(damage = %damaged, "the storage is damaged; the node stops");
            let _ = running.stop_now().await;
            return Err(damaged.into());
        }
    }
    tracing::info!("stopping");
    running.stop().await
}

/// Completes on SIGTERM or SIGINT.
pub async fn signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut stream) => {
                stream.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await
            }
        }
    };
    tokio::select! {
        _ = terminate => tracing::info!("SIGTERM"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn damaged_storage_is_told_from_other_failures_however_it_reaches_the_node() {
        let stopped = |text: &str| {
            anyhow::Error::new(RaftStopped { reason: text.into(), storage: true }).context("the node stopped")
        };
        assert!(is_damaged_storage(&stopped(
            "when Read Logs: the Raft log file /data/log/00000000000000000001.segment is damaged at byte 96: \
             the checksum of entry 4 does not match"
        )));
        assert!(is_damaged_storage(&stopped("when Read StateMachine: Corruption: block checksum mismatch")));
        assert!(!is_damaged_storage(&stopped("when Write Logs: No space left on device (os error 28)")));
        assert!(is_failed_storage(&stopped("when Write Logs: Input/output error (os error 5)")));
        assert!(!is_failed_storage(&stopped("when Read StateMachine: Corruption: block checksum mismatch")));
        let panicked = anyhow::Error::new(RaftStopped { reason: "panicked".into(), storage: false });
        assert!(!is_failed_storage(&panicked) && !is_damaged_storage(&panicked));
        let full = stopped("when Write StateMachine: IO error: No space left on device: While appending to file");
        assert!(is_failed_storage(&full) && is_full_disk(&full));
        assert!(!is_full_disk(&stopped("when Write Logs: Input/output error (os error 5)")));
    }

    #[test]
    fn a_disk_that_fails_or_fills_at_start_is_told_from_other_start_errors() {
        // Linux's errno values.
        const EIO: i32 = 5;
        const EACCES: i32 = 13;
        const ENOSPC: i32 = 28;
        const EROFS: i32 = 30;
        let open = |source: std::io::Error| {
            anyhow::Error::new(statestore_raft::OpenError::Io { path: "/data".into(), source })
                .context("opening the storage")
        };
        let full = open(std::io::Error::from_raw_os_error(ENOSPC));
        assert!(is_failed_storage(&full) && is_full_disk(&full));
        let failed = open(std::io::Error::from_raw_os_error(EIO));
        assert!(is_failed_storage(&failed) && !is_full_disk(&failed));
        let denied = open(std::io::Error::from_raw_os_error(EACCES));
        assert!(!is_failed_storage(&denied) && !is_damaged_storage(&denied));
        let plain = anyhow::Error::new(std::io::Error::from_raw_os_error(EROFS));
        assert!(is_failed_storage(&plain));
    }
}
