//! Runs a node: storage, Raft, the HTTP server, and a graceful stop on SIGTERM or SIGINT.

use std::future::Future;
use std::sync::Arc;

use anyhow::Context;
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
    /// Stops accepting requests, lets the ones in flight finish, then stops Raft.
    pub async fn stop(self) -> anyhow::Result<()> {
        if let Some(front_end) = &self.front_end {
            front_end.stop().await;
        }
        let _ = self.stop.send(());
        let served = self.served.await.context("the HTTP server task failed")?;
        self.node.shutdown().await;
        served
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
                 the broker, or while this node leads no MQTT request is answered"
            );
            None
        }
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let stopped = async move {
        let _ = stopped.await;
    };
    let served = match tls_server {
        Some(tls) => {
            let listener = http::tls::TlsListener::new(listener, tls)?;
            let app =
                http::router(node.clone(), true).into_make_service_with_connect_info::<http::tls::ClientCertificate>();
            tokio::spawn(async move {
                axum::serve(listener, app).with_graceful_shutdown(stopped).await.context("serving HTTPS")
            })
        }
        None => {
            let app = http::router(node.clone(), false);
            tokio::spawn(async move {
                axum::serve(listener, app).with_graceful_shutdown(stopped).await.context("serving HTTP")
            })
        }
    };
    Ok(RunningNode { node, front_end, stop, served })
}

/// Exit code of a wrong setting.
pub const EXIT_CONFIG: i32 = 2;
/// Exit code of damaged storage: a checksum or record of the WAL, a table file or a snapshot does
/// not match. Restarting does not help; docs/operations.md says how to recover.
pub const EXIT_DAMAGED_STORAGE: i32 = 3;

/// Raft stopped on its own (a storage error or a bug), not because the node was told to stop.
#[derive(Debug, thiserror::Error)]
#[error("raft stopped: {0}")]
pub struct RaftStopped(pub String);

/// Whether `error` says the node's storage is damaged.
pub fn is_damaged_storage(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause.downcast_ref::<statestore_raft::OpenError>().is_some_and(statestore_raft::OpenError::is_corruption)
            || cause.downcast_ref::<RaftStopped>().is_some_and(|stopped| stopped.0.contains("Corruption"))
    })
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
                return fatal.to_string();
            }
            if metrics.changed().await.is_err() {
                return "raft stopped".to_string();
            }
        }
    };
    tokio::select! {
        _ = stop => {}
        fatal = fatal => {
            tracing::error!(error = %fatal, "raft stopped on its own; the node stops");
            let _ = running.stop().await;
            return Err(RaftStopped(fatal).into());
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
