//! The one request path of a node. Every front end (MQTT, `POST /v1/command`) and every leader
//! duty (expiry, notification confirmation, registration drops) submits its work here, so a
//! node serves the same way whatever feeds it.
//!
//! Writes are batched: everything submitted while earlier proposals are in flight goes into the
//! next log entry (at most [`MAX_BATCH_ENTRIES`] entries and [`MAX_BATCH_BYTES`] bytes), so one
//! leader fsync, one append request per follower and one apply serve the whole batch. At most
//! [`MAX_PROPOSALS_IN_FLIGHT`] log entry is in flight at once. Answers come back in
//! submission order: a responder awaits each proposal's apply result in log order and answers
//! its entries in batch order, after the notification hook (notifications go out before the
//! responses of the commands that caused them).
//!
//! Reads are answered after every write submitted before them is applied, so a client that
//! pipelines a write and a read sees its write. Reads that wait at the same moment share one
//! leadership confirmation with a quorum (`ensure_linearizable`, Raft's ReadIndex). A read may
//! also see writes submitted after it: those were concurrent with it.
//!
//! A node that stops refuses new submissions ([`Pipeline::refuse`]); one that moves its
//! leadership to another node holds them in order instead ([`Pipeline::hold`]), and lets them
//! go once the move succeeded or failed.
//!
//! Every wait is bounded by [`PROPOSAL_TIMEOUT`]: a write that is not applied in time is answered
//! `Unavailable` (its outcome is unknown), and a leadership check that does not finish in time
//! answers the reads waiting on it the same way.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use openraft::error::{ClientWriteError, RaftError};
use statestore_protocol::Request;
use statestore_raft::{Node as RaftNode, NodeId, Raft, StateReader, TypeConfig};
use statestore_statemachine::{Applied, Entry, KeyPrefixes, Proposal, Reply};
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};

use crate::clock_watch::{ClockCheck, ClockVerdict};
use crate::metrics::Metrics;
use crate::node::{forward, now_ms, ExecuteError};

/// How long a proposal or a leadership check may take before its waiters are told the cluster
/// is unavailable. A write that timed out may still commit: its outcome is unknown.
pub const PROPOSAL_TIMEOUT: Duration = Duration::from_secs(5);
/// Most entries in one log entry's batch.
pub const MAX_BATCH_ENTRIES: usize = 1024;
/// Most bytes (keys, values, envelope) in one batch; a single larger entry goes alone.
pub const MAX_BATCH_BYTES: usize = 4 << 20;
/// How long a new leader waits to learn a majority's clocks before its first proposal; past it
/// (the others do not answer) it proposes anyway: nothing commits without them.
const CLOCK_WAIT: Duration = Duration::from_millis(500);
/// The pause before a leadership confirmation that reached no quorum is tried again.
const CONFIRMATION_RETRY: Duration = Duration::from_millis(10);
/// Log entries proposed and not yet applied. One: what arrives while a batch is replicated and
/// applied waits for the next, so batches are as large as the load makes them. Each batch costs
/// the nodes a fixed amount (appends, fsyncs, an apply, task wake-ups on every node), and with
/// the leader's fsync inside a preallocated log segment (about 0.2 ms) a second proposal in
/// flight no longer hides much: two gave the same throughput at 64 in flight for 7% more node
/// CPU per request, and 8% less at 256 (docs/benchmarks.md).
pub const MAX_PROPOSALS_IN_FLIGHT: usize = 1;

/// What a submission asks for.
pub enum Work {
    /// Propose this entry and answer with its apply result.
    Write(Entry),
    /// Answer this GET or SCAN linearizably, for a client confined to these key prefixes
    /// (`None`: every key).
    Read(Request, Option<KeyPrefixes>),
}

/// A read waiting for its turn, and where its answer goes.
type WaitingRead = (Request, Option<KeyPrefixes>, Answer);

/// What a submission produced.
#[derive(Debug)]
pub enum Outcome {
    Written(Applied),
    Read(Reply),
}

/// Receives the outcome of one submission. Called on the pipeline's task: it must not block.
pub type Answer = Box<dyn FnOnce(Result<Outcome, ExecuteError>) + Send>;

/// Called before the answers of a batch that produced notifications are given.
/// Returns whether every notification is handed over; the answers wait (see
/// [`NOTIFICATION_WAIT`]) until it is, so that no answer overtakes a notification its write caused.
pub type NotificationHook = Box<dyn Fn() -> bool + Send + Sync>;

/// The longest the answers of a batch wait for its notifications to be handed to the broker
/// (the notifier holds at most its budget awaiting PUBACKs); after it they go out regardless.
pub const NOTIFICATION_WAIT: Duration = Duration::from_secs(5);

struct Submission {
    work: Work,
    answer: Answer,
    submitted: Instant,
}

/// What openraft answers a proposal with, once it is applied.
type WriteResult =
    oneshot::Receiver<Result<openraft::raft::ClientWriteResponse<TypeConfig>, ClientWriteError<NodeId, RaftNode>>>;

/// The responder's queue, in submission order.
enum Stage {
    Proposal {
        result: WriteResult,
        answers: Vec<(Answer, Instant)>,
        _slot: OwnedSemaphorePermit,
    },
    /// Writes that could not be proposed at all (Raft has stopped).
    Failed {
        answers: Vec<Answer>,
        error: ExecuteError,
    },
    Reads(Vec<WaitingRead>),
}

/// The request path; cheap to clone.
#[derive(Clone)]
pub struct Pipeline {
    submissions: mpsc::UnboundedSender<Submission>,
    notification_hook: Arc<OnceLock<NotificationHook>>,
    /// While set, every submission is answered `Unavailable` with this reason at once.
    refusal: Arc<Mutex<Option<String>>>,
    /// While true, nothing is proposed or read: submissions wait in order ([`Pipeline::hold`]).
    held: Arc<watch::Sender<bool>>,
    /// One permit per log entry that may be in flight; the batcher takes one per proposal and
    /// the responder returns it once the entry is applied.
    slots: Arc<Semaphore>,
    metrics: Metrics,
}

impl Pipeline {
    /// Starts the pipeline's tasks on the current runtime. With a `clock_check`, a leader
    /// proposes nothing while its clock disagrees with most voters' clocks.
    pub fn start(raft: Raft, reader: StateReader, metrics: Metrics, clock_check: Option<ClockCheck>) -> Pipeline {
        let (submissions, submitted) = mpsc::unbounded_channel();
        let (stages_tx, stages_rx) = mpsc::unbounded_channel();
        let (reads_tx, reads_rx) = mpsc::unbounded_channel();
        let notification_hook: Arc<OnceLock<NotificationHook>> = Arc::new(OnceLock::new());
        let held = Arc::new(watch::Sender::new(false));
        let slots = Arc::new(Semaphore::new(MAX_PROPOSALS_IN_FLIGHT));
        let gates = Gates { held: held.subscribe(), slots: slots.clone() };
        let clock_check_for_reads = clock_check.clone();
        tokio::spawn(batcher(raft.clone(), metrics.clone(), clock_check, submitted, gates, stages_tx));
        tokio::spawn(responder(metrics.clone(), notification_hook.clone(), stages_rx, reads_tx));
        tokio::spawn(reader_task(raft, reader, clock_check_for_reads, reads_rx));
        Pipeline { submissions, notification_hook, refusal: Arc::default(), held, slots, metrics }
    }

    /// Sets what runs before the answers of a batch that produced notifications (the MQTT front
    /// end publishes the outbox there). Set once; later calls are ignored.
    pub fn on_notifications(&self, hook: NotificationHook) {
        let _ = self.notification_hook.set(hook);
    }

    /// Refuses every submission from now on with `Unavailable(why)`, or takes them again (`None`).
    /// What was submitted before is served as usual.
    pub fn refuse(&self, why: Option<String>) {
        *self.refusal.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = why;
    }

    /// Holds every submission from now on without answering it, until the returned guard is
    /// dropped; then they go on in order. Returns once what was proposed before is applied (or
    /// given up on at its deadline): from then on nothing reaches the log until the guard is
    /// dropped. While leadership moves, nothing new must reach the log (a voter asked to stand
    /// with the log as it was would lose its election to the longer log); once it has moved,
    /// what waited fails over as any request a follower gets, and if it has not, this node
    /// serves it. The guard releases the hold however its holder ends (an HTTP request whose
    /// client went away drops its handler mid-move).
    pub async fn hold(&self) -> Held {
        self.held.send_replace(true);
        // The guard exists before the wait, so a caller dropped while waiting lifts the hold.
        let mut held = Held { held: self.held.clone(), slots: None };
        // Every slot: the batcher may have taken one before the hold, and proposes with it.
        held.slots = self.slots.clone().acquire_many_owned(MAX_PROPOSALS_IN_FLIGHT as u32).await.ok();
        held
    }

    /// Whether submissions are being refused ([`Pipeline::refuse`]).
    pub fn refusing(&self) -> bool {
        self.refusal.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).is_some()
    }

    /// Submits `work`; `answer` is called once with its outcome.
    pub fn submit(&self, work: Work, answer: Answer) {
        let refusal = self.refusal.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        if let Some(why) = refusal {
            let error = ExecuteError::Unavailable(why);
            self.metrics.observe_proposal(&Err::<(), _>(error.clone()), Duration::ZERO);
            return answer(Err(error));
        }
        let submission = Submission { work, answer, submitted: Instant::now() };
        if let Err(mpsc::error::SendError(submission)) = self.submissions.send(submission) {
            (submission.answer)(Err(ExecuteError::Unavailable("the node is stopping".into())));
        }
    }

    /// Submits `work` and waits for its outcome.
    pub async fn execute(&self, work: Work) -> Result<Outcome, ExecuteError> {
        let (tx, rx) = oneshot::channel();
        self.submit(
            work,
            Box::new(move |outcome| {
                let _ = tx.send(outcome);
            }),
        );
        rx.await.unwrap_or_else(|_| Err(ExecuteError::Unavailable("the node is stopping".into())))
    }
}

/// Keeps a [`Pipeline`] holding its submissions until dropped.
pub struct Held {
    held: Arc<watch::Sender<bool>>,
    /// Every slot, so that nothing is proposed meanwhile.
    slots: Option<OwnedSemaphorePermit>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.held.send_replace(false);
    }
}

/// What the batcher waits for before each proposal: no hold, and a free slot.
struct Gates {
    held: watch::Receiver<bool>,
    slots: Arc<Semaphore>,
}

/// Takes submissions in order and turns runs of writes into batches, one log entry each.
async fn batcher(
    raft: Raft,
    metrics: Metrics,
    clock_check: Option<ClockCheck>,
    mut submitted: mpsc::UnboundedReceiver<Submission>,
    gates: Gates,
    stages: mpsc::UnboundedSender<Stage>,
) {
    let Gates { mut held, slots } = gates;
    let mut carried: Option<Submission> = None;
    loop {
        let first = match carried.take() {
            Some(first) => first,
            None => match submitted.recv().await {
                Some(first) => first,
                None => return,
            },
        };
        // While held, and while every slot is taken, submissions pile up in the channel: they
        // form the batch. (A dropped sender means the pipeline is gone: go on and fail.)
        let _ = held.wait_for(|held| !*held).await;
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let mut batch = Vec::new();
        let mut answers = Vec::new();
        let mut reads = Vec::new();
        let mut bytes = 0;
        let mut next = Some(first);
        while let Some(submission) = next.take().or_else(|| submitted.try_recv().ok()) {
            match submission.work {
                Work::Read(request, within) => reads.push((request, within, submission.answer)),
                Work::Write(entry) => {
                    let size = entry.approx_bytes();
                    if !batch.is_empty() && (batch.len() >= MAX_BATCH_ENTRIES || bytes + size > MAX_BATCH_BYTES) {
                        carried = Some(Submission { work: Work::Write(entry), ..submission });
                        break;
                    }
                    bytes += size;
                    batch.push(entry);
                    answers.push((submission.answer, submission.submitted));
                }
            }
        }
        if batch.is_empty() {
            drop(slot);
        } else {
            metrics.observe_batch(batch.len(), bytes);
            // A clock the batch carries ahead of this node's must agree too: one that jumped
            // ahead and back between an entry's stamp and this check would otherwise move every
            // replica's clock forward for good. (One behind is harmless: apply's clock never
            // goes back.)
            let carried = batch.iter().map(|entry| entry.wall_clock_ms).max().filter(|latest| *latest > now_ms());
            let clock = match &clock_check {
                Some(check) => clock_allows(&raft, check, carried).await,
                None => Ok(()),
            };
            let proposed = match clock {
                Ok(()) => raft.client_write_ff(Arc::new(Proposal { entries: batch })).await.map_err(|fatal| {
                    tracing::error!(error = %fatal, "raft stopped");
                    ExecuteError::Unavailable(fatal.to_string())
                }),
                Err(why) => Err(ExecuteError::Unavailable(why)),
            };
            let stage = match proposed {
                Ok(result) => Stage::Proposal { result, answers, _slot: slot },
                Err(error) => Stage::Failed { answers: answers.into_iter().map(|(answer, _)| answer).collect(), error },
            };
            let _ = stages.send(stage);
        }
        if !reads.is_empty() {
            let _ = stages.send(Stage::Reads(reads));
        }
    }
}

/// Whether this node may propose now, as far as clocks go: a leader whose clock disagrees with
/// most voters' may not (an entry would carry its clock into every replica's state machine), nor
/// at `reading`, a time it stamped on an entry just before. A node that no longer leads may: its
/// proposal fails on its own.
async fn clock_allows(raft: &Raft, check: &ClockCheck, reading: Option<u64>) -> Result<(), String> {
    if raft.metrics().borrow().state != openraft::ServerState::Leader {
        return Ok(());
    }
    clock_agrees(check, reading).await
}

/// Whether this node's clock, and `reading` (a time it read its clock at or stamped just
/// before), agree with most voters' clocks, whatever its role; one that does not know enough
/// voters' clocks yet waits for them, up to [`CLOCK_WAIT`].
async fn clock_agrees(check: &ClockCheck, reading: Option<u64>) -> Result<(), String> {
    let deadline = Instant::now() + CLOCK_WAIT;
    loop {
        let verdict = match check.verdict() {
            ClockVerdict::Agrees => reading.map_or(ClockVerdict::Agrees, |reading| check.verdict_of(reading)),
            other => other,
        };
        match verdict {
            ClockVerdict::Agrees => return Ok(()),
            ClockVerdict::Disagrees(why) => return Err(why),
            ClockVerdict::Unknown if Instant::now() >= deadline => return Ok(()),
            ClockVerdict::Unknown => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}

/// Answers proposals in log order; hands reads on once the writes before them are applied.
async fn responder(
    metrics: Metrics,
    notification_hook: Arc<OnceLock<NotificationHook>>,
    mut stages: mpsc::UnboundedReceiver<Stage>,
    reads: mpsc::UnboundedSender<Vec<WaitingRead>>,
) {
    while let Some(stage) = stages.recv().await {
        match stage {
            Stage::Reads(batch) => {
                let _ = reads.send(batch);
            }
            Stage::Failed { answers, error } => {
                for answer in answers {
                    metrics.observe_proposal(&Err::<(), _>(error.clone()), Duration::ZERO);
                    answer(Err(error.clone()));
                }
            }
            Stage::Proposal { result, answers, _slot } => {
                let outcome = match tokio::time::timeout(PROPOSAL_TIMEOUT, result).await {
                    Err(_) => {
                        Err(ExecuteError::Unavailable("the write did not commit in time; it may still commit".into()))
                    }
                    Ok(Err(_)) => Err(ExecuteError::Unavailable("raft stopped before the write was applied".into())),
                    Ok(Ok(Ok(written))) if written.data.applied.len() == answers.len() => Ok(written.data.applied),
                    Ok(Ok(Ok(written))) => Err(ExecuteError::Storage(format!(
                        "a batch of {} entries was applied with {} results",
                        answers.len(),
                        written.data.applied.len()
                    ))),
                    Ok(Ok(Err(ClientWriteError::ForwardToLeader(to)))) => Err(forward(&to)),
                    Ok(Ok(Err(e))) => Err(ExecuteError::Unavailable(e.to_string())),
                };
                match outcome {
                    Ok(applied) => {
                        if applied.iter().any(|a| !a.notifications.is_empty()) {
                            if let Some(hook) = notification_hook.get() {
                                let until = Instant::now() + NOTIFICATION_WAIT;
                                while !hook() && Instant::now() < until {
                                    tokio::time::sleep(Duration::from_millis(2)).await;
                                }
                            }
                        }
                        for ((answer, submitted), applied) in answers.into_iter().zip(applied) {
                            metrics.observe_proposal(&Ok::<(), ExecuteError>(()), submitted.elapsed());
                            answer(Ok(Outcome::Written(applied)));
                        }
                    }
                    Err(error) => {
                        for (answer, _) in answers {
                            metrics.observe_proposal(&Err::<(), _>(error.clone()), Duration::ZERO);
                            answer(Err(error.clone()));
                        }
                    }
                }
            }
        }
    }
}

/// Serves reads: all reads waiting at one moment share one leadership confirmation. Reads judge
/// expiry by this node's clock, so with a `clock_check` a leader whose clock disagrees with most
/// voters' serves none (it would find values lapsed early, or keep them past their time).
async fn reader_task(
    raft: Raft,
    reader: StateReader,
    clock_check: Option<ClockCheck>,
    mut batches: mpsc::UnboundedReceiver<Vec<WaitingRead>>,
) {
    while let Some(mut waiting) = batches.recv().await {
        while let Ok(more) = batches.try_recv() {
            waiting.extend(more);
        }
        let mut confirmed = ensure_linearizable(&raft).await;
        let now = now_ms();
        // Judged whatever the role is now: a leader whose clock jumped loses its leadership for
        // it, maybe between the confirmation and this check, and must not then serve these
        // reads by the clock that cost it (a value set with `PX` found lapsed at once).
        if let (Ok(()), Some(check)) = (&confirmed, &clock_check) {
            confirmed = clock_agrees(check, Some(now)).await.map_err(ExecuteError::Unavailable);
        }
        for (request, within, answer) in waiting {
            let outcome = confirmed.clone().and_then(|()| match reader.read_within(&request, now, within.as_ref()) {
                Ok(Some(reply)) => Ok(Outcome::Read(reply)),
                Ok(None) => Err(ExecuteError::Storage("only GET and SCAN are reads".into())),
                Err(e) => Err(ExecuteError::Storage(e.to_string())),
            });
            answer(outcome);
        }
    }
}

/// Returns once this node has confirmed with a quorum that it is the leader and has applied
/// everything committed before the call. A round of confirmations that reaches no quorum (openraft
/// gives each one the heartbeat interval, so a peer that stalls for 50 ms on a loaded machine
/// misses it) is tried again until [`PROPOSAL_TIMEOUT`], as a write would wait for its commit.
pub async fn ensure_linearizable(raft: &Raft) -> Result<(), ExecuteError> {
    confirm_leadership_within(raft, PROPOSAL_TIMEOUT).await
}

/// [`ensure_linearizable`] bounded by `within` instead of [`PROPOSAL_TIMEOUT`]: rounds that reach
/// no quorum are tried again until then; one that learns of another leader ends it at once.
pub async fn confirm_leadership_within(raft: &Raft, within: Duration) -> Result<(), ExecuteError> {
    use openraft::error::CheckIsLeaderError;
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let confirmed = tokio::time::timeout_at(deadline, raft.ensure_linearizable()).await;
        let no_quorum = match confirmed {
            Err(_) => return Err(ExecuteError::Unavailable("leadership was not confirmed in time".into())),
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(to)))) => return Err(forward(&to)),
            Ok(Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(no_quorum)))) => no_quorum,
            Ok(Err(RaftError::Fatal(fatal))) => return Err(ExecuteError::Unavailable(fatal.to_string())),
        };
        if tokio::time::Instant::now() + CONFIRMATION_RETRY >= deadline {
            return Err(ExecuteError::Unavailable(format!("leadership was not confirmed in time: {no_quorum}")));
        }
        tokio::time::sleep(CONFIRMATION_RETRY).await;
    }
}
