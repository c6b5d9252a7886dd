//! The state store node.
//!
//! # Layout
//! - [`config`]: flags, environment variables and the config file.
//! - [`node`]: [`Node`] — starting Raft, bootstrapping a new cluster once, and the entry point for
//!   commands ([`Node::execute`], [`Node::propose`], [`Node::read`]) with its typed
//!   [`ExecuteError::ForwardToLeader`].
//! - [`pipeline`]: the one request path: batches writes into log entries, answers in order,
//!   shares leadership confirmations between reads.
//! - [`leader`]: leader duties beside the pipeline: the leadership watch, the expiry sweeper,
//!   notification publishing through a [`leader::NotificationSink`], outbox confirmation and
//!   registration drops.
//! - [`access`]: per-client key authorization (`--authorization-file`), applied by the MQTT
//!   front end.
//! - `broker_watch`: leadership follows the broker connection: a node without its broker does
//!   not stand for election, and a leader without it hands leadership over.
//! - [`clock_watch`]: leadership follows the clocks: a leader whose wall clock disagrees with
//!   most voters' proposes nothing and hands leadership over.
//! - `disk_watch`: leadership follows the disk: a leader whose Raft log fsync has not returned
//!   for `--max-log-fsync-ms` hands leadership over.
//! - `enrollment`: the leader names the cluster once and enrolls each member's storage
//!   incarnation (checked on every Raft message, `statestore_raft::identity`).
//! - [`http`]: the axum server — Raft RPC, the cluster API, health, readiness, metrics, commands;
//!   HTTPS with client certificates when the node has a TLS identity.
//! - [`metrics`]: the Prometheus registry and Raft gauges.
//! - [`mqtt`]: the MQTT5 front end — an adapter from the broker to the pipeline: the state
//!   store protocol, the follower shadow, and the notification sink.
//! - [`readiness`]: a leader's `/ready` shares one quorum confirmation among its callers.
//! - [`restore_check`]: a node started with `--restored` first checks that the cluster its data
//!   directory names is not running (a flag left over from a restore that has ended).
//! - [`server`]: runs a node until SIGTERM or SIGINT.
//! - [`state_flush`]: writes the applied state to disk once `--flush-after-entries` entries or
//!   `--flush-after-operations` operations are not, so a node killed applies little of its log
//!   again when it starts.

pub mod access;
mod broker_watch;
pub mod clock_watch;
pub mod config;
mod disk_watch;
mod enrollment;
mod events;
pub mod http;
pub mod leader;
pub mod logs;
pub mod metrics;
pub mod mqtt;
pub mod node;
pub mod pipeline;
pub mod readiness;
pub mod restore_check;
pub mod server;
pub mod state_flush;

pub use config::{Args, NodeConfig};
pub use node::{ExecuteError, Node, ReadConsistency};
pub use pipeline::Pipeline;
