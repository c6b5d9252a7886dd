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
    let node = Node::start(config).await.context("starting the node")?;
    tracing::info!(id = config.id, listen = %config.listen, advertise = %config.advertise, "serving");
    let front_end = match &config.broker {
        Some(broker) => {
            tracing::info!(broker = %format!("{}:{}", broker.host, broker.port), client_id = %broker.client_id, "starting the MQTT front end");
            Some(FrontEnd::start(node.clone(), broker).context("starting the MQTT front end")?)
        }
        None => None,
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let app = http::router(node.clone());
    let served = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stopped.await;
            })
            .await
            .context("serving HTTP")
    });
    Ok(RunningNode { node, front_end, stop, served })
}

/// Serves until `stop` completes, then stops gracefully.
pub async fn run(config: NodeConfig, stop: impl Future<Output = ()>) -> anyhow::Result<()> {
    let running = start(&config).await?;
    stop.await;
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
