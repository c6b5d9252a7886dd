//! Load shapes, the same for every target: a closed loop (a fixed number of in-flight slots, each
//! sending its next request when the previous one is answered) and an open loop (requests at
//! fixed times, whatever the answers do).

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::{JoinHandle, JoinSet};

use crate::stats::Recorder;

/// Why a request did not succeed.
#[derive(Debug, Clone)]
pub enum RequestError {
    /// No answer within the request timeout.
    Timeout,
    /// An answer that is not a success: a status other than 200, or a RESP `-ERR`.
    Refused(String),
    /// The request could not be sent.
    Send(String),
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestError::Timeout => write!(f, "no answer within the timeout"),
            RequestError::Refused(why) => write!(f, "refused: {why}"),
            RequestError::Send(why) => write!(f, "not sent: {why}"),
        }
    }
}

/// What a workload asks: a write, or a read of a key written before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Set,
    /// The target's default read: linearizable (the cluster, etcd's Range; NATS KV's get and the
    /// echo responder as they are).
    Get,
    /// The read a client opts into that answers from the state of the server it reaches,
    /// possibly stale (etcd: a serializable Range).
    GetLocal,
}

impl Op {
    /// The name in the tables and CSV.
    pub fn name(self) -> &'static str {
        match self {
            Op::Set => "SET",
            Op::Get => "GET",
            Op::GetLocal => "GET-local",
        }
    }
}

/// One way of writing and reading a key: over MQTT to the state store (or the echo responder),
/// over gRPC (or the JSON gateway) to etcd, or to a NATS KV bucket. `slot` names the in-flight
/// slot, which decides the connection used.
pub trait Requester: Send + Sync + 'static {
    fn set(&self, slot: usize, key: Vec<u8>, value: &[u8]) -> impl Future<Output = Result<(), RequestError>> + Send;
    /// Reads `key`, which was written before: a read that finds no value is an error. With
    /// `local`, the target's local read ([`Op::GetLocal`]).
    fn get(&self, slot: usize, key: Vec<u8>, local: bool) -> impl Future<Output = Result<(), RequestError>> + Send;
}

/// Sends `op` for `key` (with `value` for a SET).
async fn send<R: Requester>(
    requester: &R,
    op: Op,
    slot: usize,
    key: Vec<u8>,
    value: &[u8],
) -> Result<(), RequestError> {
    match op {
        Op::Set => requester.set(slot, key, value).await,
        Op::Get => requester.get(slot, key, false).await,
        Op::GetLocal => requester.get(slot, key, true).await,
    }
}

/// The keys and values written (or read, by a GET workload). Values are random bytes (incompressible), drawn from a small
/// pool made once so that making them costs nothing during the run.
pub struct Workload {
    keys: Keys,
    values: Vec<Vec<u8>>,
    issued: AtomicU64,
    op: Op,
}

enum Keys {
    /// Uniformly drawn from `key-0` .. `key-{n-1}`, without end.
    Random(u64),
    /// `fill-0000000000`, `fill-0000000001`, ...: every request writes a new key, up to this
    /// many keys.
    Sequential(u64),
    /// Uniformly drawn from the keys `Sequential(n)` writes, without end: overwrites of a filled
    /// store.
    RandomFilled(u64),
    /// `key-0` .. `key-{n-1}`, each once: every key `Random(n)` draws, written before it is read.
    Every(u64),
}

const VALUE_POOL: usize = 64;

impl Workload {
    fn new(keys: Keys, value_size: usize) -> Workload {
        Workload { keys, values: values(value_size), issued: AtomicU64::new(0), op: Op::Set }
    }

    pub fn random_keys(keys: u64, value_size: usize) -> Workload {
        Workload::new(Keys::Random(keys.max(1)), value_size)
    }

    pub fn distinct_keys(keys: u64, value_size: usize) -> Workload {
        Workload::new(Keys::Sequential(keys), value_size)
    }

    /// Overwrites of the keys a `distinct_keys(keys, ..)` fill wrote, drawn at random.
    pub fn random_filled(keys: u64, value_size: usize) -> Workload {
        Workload::new(Keys::RandomFilled(keys.max(1)), value_size)
    }

    /// One write of every key `random_keys(keys, ..)` draws, then no more: the prefill that a
    /// GET workload reads.
    pub fn every_key(keys: u64, value_size: usize) -> Workload {
        Workload::new(Keys::Every(keys.max(1)), value_size)
    }

    /// The same keys, asked with `op` instead of SET.
    pub fn with_op(self, op: Op) -> Workload {
        Workload { op, ..self }
    }

    pub fn op(&self) -> Op {
        self.op
    }

    /// The next key and value to write; `None` once every distinct key has been issued.
    pub fn next(&self) -> Option<(Vec<u8>, &[u8])> {
        let n = self.issued.fetch_add(1, Ordering::Relaxed);
        let key = match self.keys {
            Keys::Random(keys) => format!("key-{}", fastrand::u64(..keys)),
            Keys::Sequential(keys) if n < keys => format!("fill-{n:010}"),
            Keys::Sequential(_) => return None,
            Keys::RandomFilled(keys) => format!("fill-{:010}", fastrand::u64(..keys)),
            Keys::Every(keys) if n < keys => format!("key-{n}"),
            Keys::Every(_) => return None,
        };
        Some((key.into_bytes(), &self.values[n as usize % self.values.len()]))
    }
}

fn values(size: usize) -> Vec<Vec<u8>> {
    (0..VALUE_POOL).map(|_| (0..size).map(|_| fastrand::u8(..)).collect()).collect()
}

/// A running load; [`LoadHandle::finish`] stops it and waits for its last requests.
pub struct LoadHandle {
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<()>>,
}

impl LoadHandle {
    /// A load of `tasks` that stop once `stop` is set.
    pub fn new(stop: Arc<AtomicBool>, tasks: Vec<JoinHandle<()>>) -> LoadHandle {
        LoadHandle { stop, tasks }
    }

    /// Waits until the workload has run out (every distinct key issued) and every request sent
    /// has been answered or timed out.
    pub async fn join(mut self) {
        for task in std::mem::take(&mut self.tasks) {
            let _ = task.await;
        }
    }

    /// Stops sending and waits until every request sent has been answered or timed out.
    pub async fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for task in std::mem::take(&mut self.tasks) {
            let _ = task.await;
        }
    }
}

impl Drop for LoadHandle {
    fn drop(&mut self) {
        // Dropped without `finish` (an error or Ctrl-C elsewhere): stop the tasks now.
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// `inflight` slots, each sending one request at a time.
pub fn start_closed<R: Requester>(
    requester: Arc<R>,
    workload: Arc<Workload>,
    inflight: usize,
    recorder: Arc<Recorder>,
) -> LoadHandle {
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = (0..inflight)
        .map(|slot| {
            let (requester, workload, recorder, stop) =
                (requester.clone(), workload.clone(), recorder.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let Some((key, value)) = workload.next() else { break };
                    let sent = Instant::now();
                    let outcome = send(&*requester, workload.op(), slot, key, value).await;
                    recorder.record(sent, outcome);
                }
            })
        })
        .collect();
    LoadHandle { stop, tasks }
}

/// Connections an open loop spreads its requests over, as slot numbers `0..OPEN_LOOP_SLOTS`
/// (for MQTT, 16 slots share a connection: 4 connections).
pub const OPEN_LOOP_SLOTS: usize = 64;

/// `rate` requests per second at fixed times. Latency counts from the scheduled time, not the
/// actual send, so a stalled system is charged for the requests it delayed (no coordinated
/// omission).
pub fn start_open<R: Requester>(
    requester: Arc<R>,
    workload: Arc<Workload>,
    rate: f64,
    recorder: Arc<Recorder>,
) -> LoadHandle {
    let stop = Arc::new(AtomicBool::new(false));
    let interval = Duration::from_secs_f64(1.0 / rate.max(1e-3));
    let scheduler = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut requests = JoinSet::new();
            let start = Instant::now();
            let mut n: u32 = 0;
            while !stop.load(Ordering::Relaxed) {
                let scheduled = start + interval * n;
                tokio::time::sleep_until(scheduled.into()).await;
                let Some((key, value)) = workload.next() else { break };
                let value = value.to_vec();
                let (requester, recorder) = (requester.clone(), recorder.clone());
                let slot = n as usize % OPEN_LOOP_SLOTS;
                let op = workload.op();
                requests.spawn(async move {
                    let outcome = send(&*requester, op, slot, key, &value).await;
                    recorder.record(scheduled, outcome);
                });
                while requests.try_join_next().is_some() {}
                n += 1;
            }
            while requests.join_next().await.is_some() {}
        })
    };
    LoadHandle { stop, tasks: vec![scheduler] }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_keys_run_out_and_random_keys_do_not() {
        let fill = Workload::distinct_keys(2, 8);
        assert_eq!(fill.next().map(|(k, v)| (k, v.len())), Some((b"fill-0000000000".to_vec(), 8)));
        assert_eq!(fill.next().unwrap().0, b"fill-0000000001");
        assert!(fill.next().is_none());
        let filled = Workload::random_filled(2, 4);
        for _ in 0..20 {
            let key = filled.next().unwrap().0;
            assert!(key == b"fill-0000000000" || key == b"fill-0000000001", "{key:?}");
        }
        let random = Workload::random_keys(3, 4);
        for _ in 0..100 {
            let (key, _) = random.next().unwrap();
            assert!([&b"key-0"[..], b"key-1", b"key-2"].contains(&key.as_slice()));
        }
        let every = Workload::every_key(3, 4);
        let written: Vec<Vec<u8>> = std::iter::from_fn(|| every.next().map(|(k, _)| k)).collect();
        assert_eq!(written, [&b"key-0"[..], b"key-1", b"key-2"], "each key random_keys(3) draws, once");
        let reads = Workload::random_keys(3, 4).with_op(Op::Get);
        assert_eq!((reads.op(), Workload::random_keys(3, 4).op()), (Op::Get, Op::Set));
    }
}
