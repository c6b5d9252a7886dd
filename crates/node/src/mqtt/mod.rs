//! The MQTT5 front end: the state store protocol over a broker (PROTOCOL.md, DESIGN.md §1–7).
//!
//! Every node subscribes to the request topic with a plain subscription and receives every
//! request in each client's publish order. One dispatcher task per node takes them in that
//! order: the leader submits them to the node's [`Pipeline`](crate::pipeline::Pipeline) (which
//! batches writes into log entries and answers in submission order), a follower keeps them in
//! its [`shadow`] until it sees them applied. Each answer publishes the response, then
//! acknowledges the request: the broker forgets a request only once its outcome is durable. The
//! node's [`Leader`](crate::leader::Leader) duties publish a batch's notifications (through this
//! front end's [`notifier`], its [`NotificationSink`](crate::leader::NotificationSink)) before
//! any of its answers. Leadership comes from the node: on gaining it the front end takes over
//! its shadow.
//!
//! The front end talks to the broker only through a [`Link`]: the rumqttc [`Connection`] in a
//! running node, an in-process one in the dispatcher's tests, which need no broker.
//!
//! # Layout
//! - [`connection`]: the [`Link`] trait; the rumqttc event loop, reconnects, PUBACK reasons.
//! - [`envelope`]: request properties in, response properties out (pure).
//! - [`shadow`]: a follower's copies of requests not yet applied.
//! - [`notifier`]: publishing the notification outbox and confirming it.
//! - [`metrics`]: the front end's Prometheus series.

pub mod connection;
pub mod envelope;
pub mod metrics;
pub mod notifier;
pub mod shadow;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rumqttc::v5::mqttbytes::v5::Publish;
use rumqttc::v5::mqttbytes::QoS;
use statestore_protocol::topic::ResponseTopics;
use statestore_protocol::{Response, StoreError};
use statestore_raft::AppliedRequests;
use statestore_statemachine::{Entry, Operation, Reply};
use tokio::sync::{mpsc, watch};

use crate::access::KeyAccess;
use crate::config::BrokerConfig;
use crate::leader::NotificationSink;
use crate::node::{now_ms, proposal_clock, ExecuteError, Node};
use crate::pipeline::{Outcome, Work};
pub use connection::{Connection, Delivery, Link, Outbound, RequestSink};
pub use envelope::Delivered;
use envelope::{Body, DropReason, Inbound};
use metrics::FrontEndMetrics;
use notifier::Notifier;
use shadow::{Shadow, Shadowed};

/// Most requests a follower shadows; beyond it the oldest is acknowledged and forgotten.
const SHADOW_CAPACITY: usize = 200_000;
/// Most bytes a follower's shadow holds ([`envelope::held_bytes`]): beyond it the oldest request
/// leaves, as beyond [`SHADOW_CAPACITY`].
pub const SHADOW_MAX_BYTES: usize = 128 << 20;
/// Most bytes of received requests waiting for the dispatcher. A copy delivered at QoS 0 (a
/// follower's, which the broker sends without flow control) that would go beyond it is dropped
/// (`reason="dispatch_full"`): the leader holds its own QoS 1 copy. QoS 1 deliveries are
/// bounded by the receive maximum the node announces (`--broker-inflight`).
pub const DISPATCH_MAX_BYTES: usize = 64 << 20;
/// How often followers look for applied requests.
const TICK: Duration = Duration::from_millis(20);

/// What the dispatcher handles, in order.
enum Dispatch {
    /// A received request, and what it holds ([`envelope::held_bytes`]).
    Request(Box<Publish>, Delivered, usize),
    /// A request that could not complete where it was; placed again by the current role.
    Retry(Box<Shadowed>),
    /// This node leads and has applied everything committed before: take over the shadow.
    Gained,
    Lost,
}

pub struct FrontEnd {
    node: Arc<Node>,
    link: Arc<dyn Link>,
    metrics: FrontEndMetrics,
    notifier: Arc<Notifier>,
    shadow: Mutex<Shadow>,
    /// Mirrors the node's leadership in dispatch order.
    leading: AtomicBool,
    dispatch: mpsc::UnboundedSender<Dispatch>,
    /// Bytes of the requests in `dispatch`.
    queued: Arc<AtomicUsize>,
    /// Requests each client has in flight at this leader, and the most one may have.
    in_flight: ClientSlots,
    /// Which keys each client may use; `None`: every key.
    access: Option<KeyAccess>,
    /// The response topics requests may name, each naming its client.
    response_topics: ResponseTopics,
}

/// What clients may do.
#[derive(Debug, Clone)]
pub struct ClientPolicy {
    /// Most requests one client may have in flight at the leader.
    pub inflight: usize,
    /// Which keys each client may use; `None`: every key.
    pub access: Option<KeyAccess>,
    /// The response topics requests may name, each naming its client.
    pub response_topics: ResponseTopics,
}

impl Default for ClientPolicy {
    /// The defaults of the flags: 500 in flight, every key, `clients/{client}/#`.
    fn default() -> Self {
        ClientPolicy { inflight: 500, access: None, response_topics: ResponseTopics::default() }
    }
}

/// Requests in flight per client ([`Inbound::client_key`]), each held by a [`ClientSlot`].
struct ClientSlots {
    counts: Arc<Mutex<HashMap<String, usize>>>,
    limit: usize,
}

impl ClientSlots {
    /// A slot for `client`, unless it already holds `limit`.
    fn take(&self, client: &str) -> Option<ClientSlot> {
        let mut counts = self.counts.lock().unwrap();
        let count = counts.entry(client.to_string()).or_insert(0);
        if *count >= self.limit {
            return None;
        }
        *count += 1;
        Some(ClientSlot { counts: self.counts.clone(), client: client.to_string() })
    }
}

/// One request's place in its client's in-flight count; given back when dropped.
struct ClientSlot {
    counts: Arc<Mutex<HashMap<String, usize>>>,
    client: String,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(count) = counts.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.client);
            }
        }
    }
}

impl FrontEnd {
    /// Connects to the broker and starts the front end's tasks.
    pub fn start(node: Arc<Node>, config: &BrokerConfig) -> anyhow::Result<Arc<FrontEnd>> {
        let metrics = FrontEndMetrics::register(&node.metrics.registry)?;
        let (dispatch_tx, dispatch_rx) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let sink = request_sink(&dispatch_tx, queued.clone(), &metrics);
        let connection = connection::start(config, sink, metrics.clone())?;
        node.follow_broker(connection.receiving.clone(), connection.slow_round_trip.clone());
        let sessions = connection.sessions.clone();
        let channels = (dispatch_tx, dispatch_rx, queued);
        let policy = ClientPolicy {
            inflight: usize::from(config.client_inflight),
            access: config.access.clone(),
            response_topics: config.response_topics.clone(),
        };
        FrontEnd::launch(node, Arc::new(connection), sessions, metrics, policy, channels)
    }

    /// Starts a front end on any `link`. Received requests are handed to the returned sink, in
    /// order; a new value of `sessions` means publishes of the previous broker session may be
    /// lost. Clients are served under `policy`.
    pub fn with_link(
        node: Arc<Node>,
        link: Arc<dyn Link>,
        sessions: watch::Receiver<u64>,
        policy: ClientPolicy,
    ) -> anyhow::Result<(Arc<FrontEnd>, RequestSink)> {
        let metrics = FrontEndMetrics::register(&node.metrics.registry)?;
        let (dispatch_tx, dispatch_rx) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let requests = request_sink(&dispatch_tx, queued.clone(), &metrics);
        let front = FrontEnd::launch(node, link, sessions, metrics, policy, (dispatch_tx, dispatch_rx, queued))?;
        Ok((front, requests))
    }

    fn launch(
        node: Arc<Node>,
        link: Arc<dyn Link>,
        sessions: watch::Receiver<u64>,
        metrics: FrontEndMetrics,
        policy: ClientPolicy,
        (dispatch_tx, dispatch_rx, queued): DispatchChannel,
    ) -> anyhow::Result<Arc<FrontEnd>> {
        let notifier = Arc::new(Notifier::new(node.reader.clone(), link.clone(), metrics.clone(), node.leader.clone()));
        let front = Arc::new(FrontEnd {
            node: node.clone(),
            link: link.clone(),
            metrics,
            notifier: notifier.clone(),
            shadow: Mutex::new(Shadow::new(SHADOW_CAPACITY, SHADOW_MAX_BYTES)),
            leading: AtomicBool::new(false),
            dispatch: dispatch_tx,
            queued,
            in_flight: ClientSlots { counts: Arc::default(), limit: policy.inflight },
            access: policy.access,
            response_topics: policy.response_topics,
        });
        node.leader.attach_sink(notifier)?;
        tokio::spawn(front.clone().dispatcher(dispatch_rx));
        tokio::spawn(front.clone().follow_leadership());
        tokio::spawn(front.clone().settle_shadow());
        tokio::spawn(front.clone().follow_sessions(sessions));
        Ok(front)
    }

    fn is_leading(&self) -> bool {
        self.leading.load(Ordering::Acquire)
    }

    async fn dispatcher(self: Arc<Self>, mut rx: mpsc::UnboundedReceiver<Dispatch>) {
        while let Some(message) = rx.recv().await {
            match message {
                Dispatch::Request(publish, delivered, bytes) => {
                    self.queued.fetch_sub(bytes, Ordering::Relaxed);
                    let received = Instant::now();
                    match Inbound::classify(&publish, delivered, received, &self.response_topics, self.access.as_ref())
                    {
                        Err(reason) => {
                            self.drop_request(reason, None);
                            self.link.ack(&publish);
                        }
                        Ok(inbound) => {
                            tracing::debug!(
                                correlation = %inbound.correlation_hex(),
                                verb = inbound.verb(),
                                dup = publish.dup,
                                leading = self.is_leading(),
                                "received a request"
                            );
                            self.place(Shadowed {
                                inbound,
                                receipt: connection::receipt(&publish),
                                received,
                                acked: false,
                                applied_at: None,
                            })
                        }
                    }
                }
                // While this node hands leadership over it refuses new work: keep the request
                // as a follower would, for the next leader (or for this node, should it lead on).
                Dispatch::Retry(request) if self.node.pipeline.refusing() => self.follow(*request),
                Dispatch::Retry(request) => self.place(*request),
                Dispatch::Gained => {
                    self.leading.store(true, Ordering::Release);
                    self.link.follow_role(true);
                    let heard = self.node.elector.leader_heard_at();
                    let takeover = self.shadow.lock().unwrap().take_over(Instant::now(), heard);
                    self.metrics.shadow_size.set(0);
                    tracing::info!(
                        execute = takeover.execute.len(),
                        answer_again = takeover.reanswer.len(),
                        answered = takeover.answered,
                        "taking over the requests shadowed as a follower"
                    );
                    for request in &takeover.reanswer {
                        tracing::debug!(correlation = %request.inbound.correlation_hex(), "taking over: answer again");
                    }
                    for request in &takeover.execute {
                        tracing::debug!(correlation = %request.inbound.correlation_hex(), "taking over: execute");
                    }
                    for request in takeover.reanswer {
                        self.answer_again(request);
                    }
                    for request in takeover.execute {
                        self.metrics.shadow_takeovers.inc();
                        self.lead(request);
                    }
                }
                Dispatch::Lost => {
                    self.leading.store(false, Ordering::Release);
                    self.link.follow_role(false);
                }
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

    /// Counts and logs a request dropped on purpose; `request` is known unless it could not be
    /// classified.
    fn drop_request(&self, reason: DropReason, request: Option<&Inbound>) {
        self.metrics.dropped.with_label_values(&[reason.label()]).inc();
        let correlation = request.map(Inbound::correlation_hex).unwrap_or_default();
        tracing::info!(reason = reason.label(), correlation, "dropped a request without an answer");
    }

    /// A follower keeps writes until they are applied, and everything else for a while: the
    /// leader answers them, unless it dies first.
    fn follow(&self, mut request: Shadowed) {
        let is_write = match &request.inbound.body {
            Body::Command(command_request) => !command_request.command.is_read(),
            // An invalid request, or one of another protocol version: this node may be the
            // leader that has not taken over yet, so it is kept to be answered then.
            Body::Invalid(_) | Body::UnsupportedVersion(_) => false,
        };
        if !is_write {
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
            self.link.ack(&request.receipt);
        }
    }

    fn lead(self: &Arc<Self>, request: Shadowed) {
        if request.inbound.expired(Instant::now()) {
            self.drop_request(DropReason::Expired, Some(&request.inbound));
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
        let Some(slot) = self.in_flight.take(request.inbound.client_key()) else {
            // A leader that has not heard from a quorum lately may have been replaced: the
            // requests it holds cannot commit, and a refusal from it would overtake the next
            // leader's answer. It keeps the request as a follower would.
            if !self.node.leads_with_quorum() {
                self.follow(request);
                return;
            }
            self.respond(
                &request,
                200,
                Reply::error(StoreError::TooManyRequestsInFlight),
                command_request.command.verb(),
            );
            self.ack(&request);
            return;
        };
        if is_read {
            // The pipeline answers it after every write submitted before it is applied.
            let work = Work::Read(command_request.clone(), request.inbound.allowed.clone());
            self.submit(work, Box::new(request), slot);
            return;
        }
        // A broker redelivery was most likely applied already: answer it without a log entry.
        // Anything else is checked by apply, which answers a duplicate from the same table.
        if let Some(identity) = request.inbound.identity().filter(|_| request.receipt.dup) {
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
        // A `__ts` or `__ft` too far ahead is refused by apply, through the log, not here: the
        // refusal is then in the dedup table, so followers see the request settled and a new
        // leader answers it again with the same error instead of executing it once the skew
        // has passed.
        let Some(client_request) = request.inbound.client_request() else { return };
        let wall_clock_ms = proposal_clock(command_request, now_ms());
        let entry = Entry { operation: Operation::Request(client_request), wall_clock_ms };
        self.submit(Work::Write(entry), Box::new(request), slot);
    }

    /// Answers a write the old leader applied, from the dedup table, without a log entry; one
    /// the table no longer holds is executed like any other (apply deduplicates it).
    fn answer_again(self: &Arc<Self>, request: Shadowed) {
        let found = request.inbound.identity().map(|identity| self.node.reader.dedup_lookup(&identity));
        match found {
            Some(Ok(Some(reply))) => {
                self.metrics.dedup_hits.inc();
                self.respond(&request, 200, reply, request.inbound.verb());
                self.ack(&request);
            }
            _ => {
                self.metrics.shadow_takeovers.inc();
                self.lead(request);
            }
        }
    }

    /// Hands `work` to the node's pipeline and answers `request` with its outcome. What did not
    /// complete here goes back to the dispatcher, which shadows it (another node leads) or
    /// submits it again (the dedup table makes that safe).
    fn submit(self: &Arc<Self>, work: Work, request: Box<Shadowed>, slot: ClientSlot) {
        let front = self.clone();
        self.node.pipeline.submit(
            work,
            Box::new(move |outcome| {
                drop(slot);
                let reply = match outcome {
                    Ok(Outcome::Written(applied)) => {
                        if applied.deduplicated {
                            front.metrics.dedup_hits.inc();
                        }
                        applied.reply
                    }
                    Ok(Outcome::Read(reply)) => request.inbound.authorized(reply),
                    Err(error) => {
                        if let ExecuteError::Storage(e) = &error {
                            tracing::error!(error = %e, "a request failed in storage");
                        }
                        tracing::debug!(
                            correlation = %request.inbound.correlation_hex(),
                            error = %error,
                            "a request did not complete here; placing it again"
                        );
                        let _ = front.dispatch.send(Dispatch::Retry(request));
                        return;
                    }
                };
                front.respond(&request, 200, reply, request.inbound.verb());
                front.ack(&request);
            }),
        );
    }

    /// Publishes the answer, unless the client has stopped waiting.
    fn respond(&self, request: &Shadowed, status: u16, reply: Reply, command: &str) {
        let now = Instant::now();
        if request.inbound.expired(now) {
            self.drop_request(DropReason::Expired, Some(&request.inbound));
            return;
        }
        tracing::debug!(correlation = %request.inbound.correlation_hex(), status, "answering");
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
        let topic = request.inbound.response_topic.clone();
        self.link.publish(Outbound { topic, payload, properties, delivery: None });
    }

    /// Follows the node's leadership: on gaining it the dispatcher takes over the shadow.
    async fn follow_leadership(self: Arc<Self>) {
        let mut leading = self.node.leader.leading();
        loop {
            let message = if leading.borrow_and_update().is_some() { Dispatch::Gained } else { Dispatch::Lost };
            let _ = self.dispatch.send(message);
            if leading.changed().await.is_err() {
                return;
            }
        }
    }

    /// A new broker session may have lost publishes of the last one: the leader publishes
    /// again from the oldest unconfirmed notification.
    async fn follow_sessions(self: Arc<Self>, mut sessions: watch::Receiver<u64>) {
        while sessions.changed().await.is_ok() {
            if self.node.leader.is_leading() {
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
                let heard = self.node.elector.leader_heard_at();
                let applied = applied.iter().flat_map(AppliedRequests::identities);
                let settled = shadow.settle(Instant::now(), heard, applied, |identity| {
                    reader.dedup_lookup(identity).map(|found| found.is_some()).unwrap_or(false)
                });
                self.metrics.shadow_size.set(shadow.len() as i64);
                settled
            };
            for publish in settled.applied {
                self.link.ack(&publish);
            }
            for request in &settled.forgotten {
                tracing::debug!(
                    correlation = %request.inbound.correlation_hex(),
                    seen_applied = request.applied_at.is_some(),
                    "the shadow forgot a request"
                );
                self.ack(request);
            }
            // A leader that handed over and then led on (nobody took over) serves again what
            // it kept meanwhile.
            if self.is_leading()
                && !self.node.pipeline.refusing()
                && self.node.leads_with_quorum()
                && !self.shadow.lock().unwrap().is_empty()
            {
                let _ = self.dispatch.send(Dispatch::Gained);
            }
        }
    }

    /// Stops: a clean DISCONNECT, so the broker keeps the session for the next start.
    pub async fn stop(&self) {
        self.link.disconnect().await;
    }
}

/// The dispatcher's channel, and the bytes of the requests in it.
type DispatchChannel = (mpsc::UnboundedSender<Dispatch>, mpsc::UnboundedReceiver<Dispatch>, Arc<AtomicUsize>);

/// Hands each received request to the dispatcher, but a QoS 0 copy beyond
/// [`DISPATCH_MAX_BYTES`] of requests waiting.
fn request_sink(
    dispatch: &mpsc::UnboundedSender<Dispatch>,
    queued: Arc<AtomicUsize>,
    metrics: &FrontEndMetrics,
) -> RequestSink {
    let dispatch = dispatch.clone();
    let dropped = metrics.dropped.with_label_values(&[DropReason::DispatchFull.label()]);
    Box::new(move |publish, delivered| {
        let bytes = envelope::held_bytes(&publish);
        if publish.qos == QoS::AtMostOnce && queued.load(Ordering::Relaxed) + bytes > DISPATCH_MAX_BYTES {
            dropped.inc();
            tracing::debug!(bytes, "dropped a QoS 0 copy of a request: the dispatcher's queue is full");
            return;
        }
        queued.fetch_add(bytes, Ordering::Relaxed);
        // Closed only when the dispatcher is gone, i.e. the node is stopping.
        let _ = dispatch.send(Dispatch::Request(Box::new(publish), delivered, bytes));
    })
}
