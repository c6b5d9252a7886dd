//! The fault-injection suite: three real node processes and a real Mosquitto; concurrent MQTT
//! clients (shaped as the SDKs send) run SET, SET NX, SET NEX (a lease's holder renewing it with
//! the value it wrote last), GET, SCAN (of a pattern only one key matches), DEL and VDEL on a few
//! keys, a quarter
//! of the writes with `PX` (100 ms to 3 s, so values lapse among the calls), and record every
//! call, while faults come one after another. Half the keys are fenced: writes to them carry a
//! fencing token (`__ft`), mostly a fresh one, sometimes a stale one or none, so the store's
//! token checks are part of every history.
//!
//! - `kill`: the leader is killed with SIGKILL and started again a second later;
//! - `kill-all`: every node is killed with SIGKILL, one right after the other, and all are
//!   started again a second later (a whole cluster losing power, as far as a process can);
//! - `pause`: the leader is stopped with SIGSTOP for 1–6 s, then continued;
//! - `partition-leader` / `partition-follower`: a node is cut off from its peers for 3 s (every
//!   Raft link goes through a TCP proxy the suite cuts) while it keeps its broker;
//! - `broker`: the leader's link to the broker is cut for 3 s;
//! - `disk`: the leader's `fsync`s stall for 3 s (a preloaded library makes them wait,
//!   `common::disk`);
//! - `clock`: a follower is restarted with its wall clock 30 s ahead for 6 s, then restarted
//!   with the true time;
//! - `clock-leader`: the leader's wall clock jumps 30 s ahead or 90 s behind (beyond the 60 s a
//!   request's timestamp may lead) while it runs, and back after 6 s;
//! - `slow-leader`: every byte to and from the leader's peers is held 200–1,000 ms (more than
//!   the lease) for 4 s, in order, as over a congested link: nothing is lost, all of it is late;
//! - `slow-broker`: the same for the leader's link to the broker;
//! - `power-cut` / `power-cut-all` (not run by default; `power_cut.rs` runs them): a node, or
//!   every node, loses power: killed, and what it did not sync dropped by the file system its
//!   data directory is on (`statestore-powercut-fs`).
//!
//! Every node runs under libfaketime (Debian `faketime`), which reads the node's clock offset
//! from a file the suite rewrites (again every second).
//!
//! A watcher has registered for every key's notifications (`KEYNOTIFY`) before the calls begin;
//! a second one too, which stops watching every key (`KEYNOTIFY … STOP`) halfway through.
//!
//! Then every fault is healed, every key read once more, and the histories checked: each key's
//! history is linearizable (calls without an answer may have happened or not), so no
//! acknowledged write is lost; no scan lists a key its pattern does not match; versions of
//! acknowledged writes to a key rise in real-time order;
//! every acknowledged write reached the watcher as a notification with its version, and no write
//! that was refused did; no write invoked after a key's STOP was answered reached the second
//! watcher; every node is ready again. The longest time without any answer around
//! each fault is reported.
//!
//! `cargo test --release -p statestore-node --test faults` runs the short mode (150 s);
//! `FAULTS_SECS=1800` runs the long one; `FAULTS_KINDS=pause,kill` picks the faults (the
//! workload, the faults and the checks are in `suite.rs`);
//! `FAULTS_KEEP_LOGS=DIR` keeps every node's log there; `FAULTS_LONG_GAP_MS` (2000) is how long
//! a cycle without any answer must be to be named in the report.

mod checker;
#[path = "../common/mod.rs"]
mod common;
mod suite;

use suite::{Fault, Until};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn histories_under_faults_are_linearizable_and_nothing_hangs() {
    let secs: u64 = std::env::var("FAULTS_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(150);
    suite::run(suite::kinds_from_env(&Fault::ALL), Until::Secs(secs)).await;
}
