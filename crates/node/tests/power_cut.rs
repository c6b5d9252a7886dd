//! The power-cut suite: crash consistency, as Jepsen's LazyFS tests it. The fault-injection
//! suite's three nodes, Mosquitto, MQTT clients, histories and checks (`faults/suite.rs`), with
//! every node's data directory on a FUSE file system of its own (`statestore-powercut-fs`) that
//! holds what a node wrote and did not sync in memory. Its faults, in turn:
//!
//! - `power-cut-all`: every node is killed (SIGKILL), each file system drops every write its
//!   node did not `fsync`/`fdatasync` (half the time torn instead: a prefix of each file's
//!   unsynced writes kept, in whole 512-byte sectors), and a second later all start again;
//! - `power-cut`: the same for one node, the leader and a follower in turn.
//!
//! Every node must start again on its own after each cut: one that exits (exit 3, damage it
//! refuses, or anything else) would need an operator, and fails the suite with its log. Then
//! every key is read once more and the histories checked as in the fault suite: no
//! acknowledged write lost, no stale read, every acknowledged write notified.
//!
//! Damage a power cut cannot cause is still refused at start: a flipped run of bytes in the
//! middle of the Raft log, with committed records after it, stops the node with exit code 3
//! (`integrity.rs`, `a_damaged_raft_log_stops_the_node_instead_of_dropping_acknowledged_writes`).
//!
//! `cargo test --release -p statestore-node --test power_cut` runs the short mode (10 cycles);
//! `POWER_CUT_CYCLES=60` a long one; `FAULTS_KINDS`, `FAULTS_KEEP_LOGS` and
//! `FAULTS_LONG_GAP_MS` as in the fault suite.

#[path = "faults/checker.rs"]
mod checker;
#[path = "common/mod.rs"]
mod common;
#[path = "faults/suite.rs"]
mod suite;

use suite::{Fault, Until};

/// Cycles of the short mode.
const SHORT_CYCLES: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn power_cuts_lose_no_acknowledged_write_and_every_node_starts_again() {
    let cycles = std::env::var("POWER_CUT_CYCLES").ok().and_then(|s| s.parse().ok()).unwrap_or(SHORT_CYCLES);
    suite::run(suite::kinds_from_env(&Fault::POWER_CUTS), Until::Cycles(cycles)).await;
}
