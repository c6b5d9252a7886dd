//! `statestore`: one node of the replicated state store.

use clap::Parser;
use statestore_node::{server, Args, NodeConfig};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = match NodeConfig::from_args(Args::parse()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("statestore: {e}");
            std::process::exit(2);
        }
    };
    let filter = EnvFilter::try_new(&config.log).unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if config.log_json {
        logs.json().with_current_span(false).init();
    } else {
        logs.init();
    }
    server::run(config, server::signal()).await
}
