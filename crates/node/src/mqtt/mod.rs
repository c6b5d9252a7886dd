//! The MQTT5 front end: the state store protocol over a broker (PROTOCOL.md, DESIGN.md §1–7).
//!
//! Every node subscribes to the request topic with a plain subscription and receives every
//! request in each client's publish order. One dispatcher task per node takes them in that
//! order: the leader submits them to the node's [`Pipeline`](crate::pipeline::Pipeline) (which
//! batches writes into log entries and answers in submission order), a follower keeps them in
//! its [`shadow`] until it sees them applied. Each answer publishes the response, then
//! acknowledges the request: the broker forgets a request only once its outcome is durable. The
//! pipeline publishes a batch's notifications (through this front end's [`notifier`]) before
//! any of its answers.
//!
//! # Layout
//! - [`connection`]: the rumqttc event loop, reconnects, PUBACK reasons.
//! - [`envelope`]: request properties in, response properties out (pure).
//! - [`shadow`]: a follower's copies of requests not yet applied.
//! - [`notifier`]: publishing the notification outbox and confirming it.
//! - [`metrics`]: the front end's Prometheus series.

pub mod connection;
pub mod envelope;
pub mod metrics;
pub mod notifier;
pub mod shadow;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use openraft::ServerState;
use rumqttc::v5::mqttbytes::v5::Publish;
use statestore_protocol::Response;
use statestore_statemachine::{Applied, Entry, Operation, Reply};
use tokio::sync::mpsc;

use crate::config::BrokerConfig;
use crate::node::{now_ms, proposal_clock, ExecuteError, Node};
use crate::pipeline::{Outcome, Work};
use connection::Connection;
use envelope::{Body, DropReason, Inbound};
use metrics::FrontEndMetrics;
use notifier::Notifier;
use shadow::{Shadow, Shadowed};

/// Most requests a follower shadows; beyond it the oldest is acknowledged and forgotten.
const SHADOW_CAPACITY: usize = 200_000;
/// How long a follower keeps a request it no longer needs to hold for the broker (a read, or a
/// write seen applied): longer than a failover, so a new leader can answer it.
const SHADOW_RETENTION: Duration = Duration::from_secs(5);
/// How often followers look for applied requests, and the sweeper for due keys.
const TICK: Duration = Duration::from_millis(20);
/// How often the leader confirms published notifications through the log.
const CONFIRM_EVERY: Duration = Duration::from_millis(100);
/// A client whose session is gone is dropped once per this period, however many notifications
/// bounce meanwhile.
const DROP_DEBOUNCE: Duration = Duration::from_secs(5);

/// What the dispatcher handles, in order.
enum Dispatch {
    Request(Box<Publish>),
    /// A request that could not complete where it was; placed again by the current role.
    Retry(Box<Shadowed>),
    /// This node leads and has applied everything committed before: take over the shadow.
    Gained,
    Lost,
}

/// What to do once a proposal is applied.
enum Completion {
    Respond(Box<Shadowed>),
    Expire { key: Vec<u8>, expires_at: u64 },
    DropRegistrations,
    Confirm,
}

pub struct FrontEnd {
    node: Arc<Node>,
    pub connection: Connection,
    metrics: FrontEndMetrics,
    notifier: Notifier,
    shadow: Mutex<Shadow>,
    leading: AtomicBool,
    dispatch: mpsc::UnboundedSender<Dispatch>,
    /// Requests to acknowledge to the broker, in order.
    acks: mpsc::UnboundedSender<Publish>,
    /// Keys with an `Expire` in flight.
    expiring: Mutex<HashSet<Vec<u8>>>,
}

impl FrontEnd {
    /// Connects to the broker and starts the front end's tasks.
    pub fn start(node: Arc<Node>, config: &BrokerConfig) -> anyhow::Result<Arc<FrontEnd>> {
        let metrics = FrontEndMetrics::register(&node.metrics.registry)?;
        let (dispatch_tx, dispatch_rx) = mpsc::unbounded_channel();
        let requests = dispatch_tx.clone();
        let sink: connection::RequestSink = Box::new(move |publish| {
            // Closed only when the dispatcher is gone, i.e. the node is stopping.
            let _ = requests.send(Dispatch::Request(Box::new(publish)));
        });
        let connection = connection::start(config, sink, metrics.clone())?;
        let (gone_tx, gone_rx) = mpsc::unbounded_channel();
        let notifier = Notifier::new(node.reader.clone(), connection.clone(), metrics.clone(), gone_tx);
        let (acks_tx, acks_rx) = mpsc::unbounded_channel();
        let front = Arc::new(FrontEnd {
            node: node.clone(),
            connection: connection.clone(),
            metrics,
            notifier,
            shadow: Mutex::new(Shadow::new(SHADOW_CAPACITY, SHADOW_RETENTION)),
            leading: AtomicBool::new(false),
            dispatch: dispatch_tx,
            acks: acks_tx,
            expiring: Mutex::new(HashSet::new()),
        });
        let _ = node.broker_connected.set(connection.connected.clone());
        tokio::spawn(front.clone().dispatcher(dispatch_rx));
        tokio::spawn(acknowledge(connection.clone(), acks_rx));
        let weak = Arc::downgrade(&front);
        node.pipeline.on_notifications(Box::new(move || {
            if let Some(front) = weak.upgrade() {
                front.notifier.publish_pending();
            }
        }));
        tokio::spawn(front.clone().leadership());
        tokio::spawn(front.clone().settle_shadow());
        tokio::spawn(front.clone().sweeper());
        tokio::spawn(front.clone().confirmer());
        tokio::spawn(front.clone().drop_gone_clients(gone_rx));
        tokio::spawn(front.clone().follow_sessions());
        Ok(front)
    }

    fn is_leading(&self) -> bool {
        self.leading.load(Ordering::Acquire)
    }

    async fn dispatcher(self: Arc<Self>, mut rx: mpsc::UnboundedReceiver<Dispatch>) {
        while let Some(message) = rx.recv().await {
            match message {
                Dispatch::Request(publish) => {
                    let received = Instant::now();
                    match Inbound::classify(&publish, received) {
                        Err(reason) => {
                            self.drop_request(reason);
                            let _ = self.acks.send(*publish);
                        }
                        Ok(inbound) => self.place(Shadowed { inbound, publish: *publish, received, acked: false }),
                    }
                }
                Dispatch::Retry(request) => self.place(*request),
                Dispatch::Gained => {
                    self.leading.store(true, Ordering::Release);
                    let shadowed = self.shadow.lock().unwrap().drain();
                    self.metrics.shadow_size.set(0);
                    if !shadowed.is_empty() {
                        tracing::info!(requests = shadowed.len(), "executing the requests shadowed as a follower");
                    }
                    for request in shadowed {
                        self.metrics.shadow_takeovers.inc();
                        self.lead(request);
                    }
                }
                Dispatch::Lost => self.leading.store(false, Ordering::Release),
            }
        }
    }

    fn place(self: &Arc<Self>, request: Shadowed) {
        if self.is_leading() {
            self.lead(request);
        } else {
            self.follow(request);
        }
    }

    fn drop_request(&self, reason: DropReason) {
        self.metrics.dropped.with_label_values(&[reason.label()]).inc();
        tracing::info!(reason = reason.label(), "dropped a request without an answer");
    }

    /// A follower keeps commands until they are applied; the leader answers everything else.
    fn follow(&self, mut request: Shadowed) {
        let is_read = match &request.inbound.body {
            Body::Command(command_request) => command_request.command.is_read(),
            _ => {
                self.ack(&request);
                return;
            }
        };
        if is_read {
            // Nothing to make durable: a read is acknowledged at once and kept only to be
            // answered should the leader die first.
            self.ack(&request);
            request.acked = true;
        }
        let identity = request.inbound.identity();
        let released = {
            let mut shadow = self.shadow.lock().unwrap();
            let released = shadow.insert(request);
            self.metrics.shadow_size.set(shadow.len() as i64);
            released
        };
        for old in released {
            if old.inbound.identity() != identity {
                self.metrics.dropped.with_label_values(&[DropReason::ShadowFull.label()]).inc();
            }
            self.ack(&old);
        }
    }

    /// Acknowledges a request to the broker, once, after everything acknowledged before it.
    fn ack(&self, request: &Shadowed) {
        if !request.acked {
            let _ = self.acks.send(request.publish.clone());
        }
    }

    fn lead(self: &Arc<Self>, request: Shadowed) {
        if request.inbound.expired(Instant::now()) {
            self.drop_request(DropReason::Expired);
            self.ack(&request);
            return;
        }
        let (command_request, is_read) = match &request.inbound.body {
            Body::UnsupportedVersion(_) => {
                self.respond(&request, 505, Reply::new(Response::Nil, None), "INVALID");
                self.ack(&request);
                return;
            }
            Body::Invalid(error) => {
                self.respond(&request, 200, Reply::error(error.clone()), "INVALID");
                self.ack(&request);
                return;
            }
            Body::Command(command_request) => (command_request, command_request.command.is_read()),
        };
        if is_read {
            // The pipeline answers it after every write submitted before it is applied.
            let work = Work::Read(command_request.clone());
            self.submit(work, Completion::Respond(Box::new(request)));
            return;
        }
        // A broker redelivery was most likely applied already: answer it without a log entry.
        // Anything else is checked by apply, which answers a duplicate from the same table.
        if let Some(identity) = request.inbound.identity().filter(|_| request.publish.dup) {
            match self.node.reader.dedup_lookup(&identity) {
                Ok(Some(reply)) => {
                    self.metrics.dedup_hits.inc();
                    self.respond(&request, 200, reply, command_request.command.verb());
                    self.ack(&request);
                    return;
                }
                Ok(None) => {}
                Err(e) => tracing::error!(error = %e, "cannot read the dedup table"),
            }
        }
        let now = now_ms();
        if let Err(error) = command_request.check_clock_skew(now) {
            self.respond(&request, 200, Reply::error(error), command_request.command.verb());
            self.ack(&request);
            return;
        }
        let Some(client_request) = request.inbound.client_request() else { return };
        let wall_clock_ms = proposal_clock(command_request, now);
        let entry = Entry { operation: Operation::Request(client_request), wall_clock_ms };
        self.submit(Work::Write(entry), Completion::Respond(Box::new(request)));
    }

    /// Hands `work` to the node's pipeline; `completion` runs with its outcome.
    fn submit(self: &Arc<Self>, work: Work, completion: Completion) {
        let front = self.clone();
        self.node.pipeline.submit(
            work,
            Box::new(move |outcome| match outcome {
                Ok(Outcome::Written(applied)) => front.completed(completion, applied),
                Ok(Outcome::Read(reply)) => front.answered(completion, reply),
                Err(ExecuteError::Storage(e)) => {
                    tracing::error!(error = %e, "a request failed in storage");
                    front.failed(completion);
                }
                Err(ExecuteError::ForwardToLeader { .. }) | Err(ExecuteError::Unavailable(_)) => {
                    front.failed(completion)
                }
            }),
        );
    }

    /// Proposes an entry of the leader's own (expiry, confirmations, registration drops).
    fn propose(self: &Arc<Self>, entry: Entry, completion: Completion) {
        self.submit(Work::Write(entry), completion);
    }

    fn answered(&self, completion: Completion, reply: Reply) {
        if let Completion::Respond(request) = completion {
            let command = request.inbound.verb();
            self.respond(&request, 200, reply, command);
            self.ack(&request);
        }
    }

    fn completed(&self, completion: Completion, applied: Applied) {
        match completion {
            Completion::Respond(request) => {
                if applied.deduplicated {
                    self.metrics.dedup_hits.inc();
                }
                let command = request.inbound.verb();
                self.respond(&request, 200, applied.reply, command);
                self.ack(&request);
            }
            Completion::Expire { key, expires_at } => {
                self.expiring.lock().unwrap().remove(&key);
                if applied.reply.response == Response::Int(1) {
                    self.metrics.expired_keys.inc();
                    let lag_ms = now_ms().saturating_sub(expires_at);
                    self.metrics.expiry_lag_seconds.observe(lag_ms as f64 / 1000.0);
                }
            }
            Completion::DropRegistrations => {
                if applied.reply.response != Response::Int(0) {
                    self.metrics.registrations_dropped.inc();
                }
            }
            Completion::Confirm => {}
        }
    }

    /// Work that did not complete here: its request goes back to the dispatcher, which shadows
    /// it (another node leads) or submits it again (the dedup table makes that safe).
    fn failed(&self, completion: Completion) {
        match completion {
            Completion::Respond(request) => {
                let _ = self.dispatch.send(Dispatch::Retry(request));
            }
            Completion::Expire { key, .. } => {
                self.expiring.lock().unwrap().remove(&key);
            }
            Completion::DropRegistrations | Completion::Confirm => {}
        }
    }

    /// Publishes the answer, unless the client has stopped waiting.
    fn respond(&self, request: &Shadowed, status: u16, reply: Reply, command: &str) {
        let now = Instant::now();
        if request.inbound.expired(now) {
            self.drop_request(DropReason::Expired);
            return;
        }
        let result = match &reply.response {
            Response::Error(_) => "error",
            Response::Int(-1) => "not_applied",
            _ if status != 200 => "error",
            _ => "ok",
        };
        self.metrics.requests.with_label_values(&[command, result]).inc();
        self.metrics.request_seconds.with_label_values(&[command]).observe(request.received.elapsed().as_secs_f64());
        let payload = if status == 200 { Bytes::from(reply.response.encode()) } else { Bytes::new() };
        let properties = request.inbound.response_properties(status, reply.version.as_ref(), now);
        self.connection.publish(request.inbound.response_topic.clone(), payload, properties, None);
    }

    /// Follows Raft's view of this node's role. A new leader first confirms its leadership and
    /// applies everything committed, then publishes the notification backlog and takes over
    /// the shadowed requests.
    async fn leadership(self: Arc<Self>) {
        let mut metrics = self.node.raft.metrics();
        let mut leading_term: Option<u64> = None;
        loop {
            let (is_leader, term) = {
                let current = metrics.borrow_and_update();
                (current.state == ServerState::Leader, current.current_term)
            };
            if is_leader && leading_term != Some(term) {
                if self.node.ensure_linearizable().await.is_ok() {
                    leading_term = Some(term);
                    tracing::info!(term, "leading: publishing the notification backlog and taking over");
                    self.notifier.restart();
                    let _ = self.dispatch.send(Dispatch::Gained);
                } else {
                    tokio::time::sleep(TICK).await;
                }
                continue;
            }
            if !is_leader && leading_term.take().is_some() {
                self.notifier.stop();
                let _ = self.dispatch.send(Dispatch::Lost);
            }
            if metrics.changed().await.is_err() {
                return;
            }
        }
    }

    /// A new broker session may have lost publishes of the last one: the leader publishes
    /// again from the oldest unconfirmed notification.
    async fn follow_sessions(self: Arc<Self>) {
        let mut sessions = self.connection.sessions.clone();
        while sessions.changed().await.is_ok() {
            if self.is_leading() {
                self.notifier.restart();
            }
        }
    }

    /// Acknowledges shadowed requests once they are applied (or expired).
    async fn settle_shadow(self: Arc<Self>) {
        use tokio::sync::broadcast::error::TryRecvError;
        let mut feed = self.node.reader.applied_requests();
        let mut tick = tokio::time::interval(TICK);
        loop {
            tick.tick().await;
            let mut applied = Vec::new();
            loop {
                match feed.try_recv() {
                    Ok(identities) => applied.push(identities),
                    // What the feed dropped is found by the dedup lookups of old requests.
                    Err(TryRecvError::Lagged(_)) => continue,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Closed) => return,
                }
            }
            let settled = {
                let mut shadow = self.shadow.lock().unwrap();
                if shadow.is_empty() {
                    continue;
                }
                let reader = &self.node.reader;
                let settled = shadow.settle(Instant::now(), applied.iter().flat_map(|ids| ids.iter()), |identity| {
                    reader.dedup_lookup(identity).map(|found| found.is_some()).unwrap_or(false)
                });
                self.metrics.shadow_size.set(shadow.len() as i64);
                settled
            };
            for publish in settled.applied {
                let _ = self.acks.send(publish);
            }
            for request in &settled.forgotten {
                self.ack(request);
            }
        }
    }

    /// On the leader: proposes `Expire` for every key whose deadline has passed.
    async fn sweeper(self: Arc<Self>) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if !self.is_leading() {
                continue;
            }
            let now = now_ms();
            let due = match self.node.reader.due_keys(now, 256) {
                Ok(due) => due,
                Err(e) => {
                    tracing::error!(error = %e, "cannot read the expiry index");
                    continue;
                }
            };
            for key in due {
                if !self.expiring.lock().unwrap().insert(key.key.clone()) {
                    continue;
                }
                let entry = Entry {
                    operation: Operation::Expire { key: key.key.clone(), version: key.version },
                    wall_clock_ms: now,
                };
                self.propose(entry, Completion::Expire { key: key.key, expires_at: key.expires_at });
            }
        }
    }

    /// On the leader: confirms through the log what the broker accepted, so the outbox shrinks
    /// and a next leader does not publish it again.
    async fn confirmer(self: Arc<Self>) {
        let mut tick = tokio::time::interval(CONFIRM_EVERY);
        let mut confirmed: Option<u64> = None;
        loop {
            tick.tick().await;
            if !self.is_leading() {
                confirmed = None;
                continue;
            }
            let Some(through) = self.notifier.settled() else { continue };
            if confirmed.is_some_and(|c| c >= through) {
                continue;
            }
            confirmed = Some(through);
            let entry = Entry { operation: Operation::ConfirmNotifications { through }, wall_clock_ms: now_ms() };
            self.propose(entry, Completion::Confirm);
        }
    }

    /// Drops the registrations of clients whose session is gone (PUBACK `0x10`).
    async fn drop_gone_clients(self: Arc<Self>, mut gone: mpsc::UnboundedReceiver<String>) {
        let mut recent: HashMap<String, Instant> = HashMap::new();
        while let Some(client_id) = gone.recv().await {
            let now = Instant::now();
            recent.retain(|_, at| now.duration_since(*at) < DROP_DEBOUNCE);
            if recent.contains_key(&client_id) || !self.is_leading() {
                continue;
            }
            recent.insert(client_id.clone(), now);
            tracing::info!(client_id, "no subscriber for a notification: dropping the client's registrations");
            let entry = Entry { operation: Operation::DropRegistrations { client_id }, wall_clock_ms: now_ms() };
            self.propose(entry, Completion::DropRegistrations);
        }
    }

    /// Stops: a clean DISCONNECT, so the broker keeps the session for the next start.
    pub async fn stop(&self) {
        self.connection.disconnect().await;
    }
}

/// Acknowledges requests to the broker in the order they were handed over.
async fn acknowledge(connection: Connection, mut acks: mpsc::UnboundedReceiver<Publish>) {
    while let Some(publish) = acks.recv().await {
        connection.ack(&publish).await;
    }
}
