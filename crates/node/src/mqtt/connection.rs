//! The node's MQTT5 connection: one rumqttc event loop driven by one task, which is also the only
//! task that hands publishes to rumqttc. That lets it pair each QoS 1 publish with the packet id
//! rumqttc gives it, and so report every PUBACK's reason to whoever published (a notification
//! answered with `0x10 No matching subscribers` drops that client's registrations).
//!
//! Persistent session (`clean_start=false` with a session expiry) and manual acks: the broker
//! redelivers every request this node did not acknowledge, also across a restart of the node.
//! Reconnects back off exponentially with jitter; a CONNACK without a session subscribes again.
//!
//! Every [`PROBE_EVERY`] the node times the broker's round trip: a QoS 1 publish to a topic of
//! its own that nobody subscribes to ([`probe_topic`]), until its PUBACK. A link that delivers
//! everything, late, looks connected; while a probe takes longer than the bound
//! (`--broker-round-trip-bound-ms`), requests do not count as reaching this node either.
//!
//! The request subscription follows the node's role (DESIGN.md §1): the leader subscribes at
//! QoS 1, so the broker redelivers what it did not answer; a follower at the configured follower
//! QoS, 0 by default, so the broker keeps no copy in flight for it and it sends no PUBACKs. A
//! role change subscribes again at the new QoS, which replaces the old subscription in place.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use rumqttc::v5::mqttbytes::v5::{Packet, PubAckReason, Publish, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, ClientError, Event, EventLoop, MqttOptions};
use rumqttc::{NetworkOptions, Outgoing, TlsConfiguration, Transport};
use statestore_protocol::topic::{hex_upper, NOTIFICATION_PREFIX, REQUEST_TOPIC};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::envelope::Delivered;
use super::metrics::FrontEndMetrics;
use crate::config::BrokerConfig;

/// What became of a QoS 1 publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// The broker took it and someone subscribed to it.
    Accepted,
    /// PUBACK reason `0x10`: the broker took it but no subscription matched.
    NoSubscribers,
    /// The broker refused it with this reason.
    Refused(PubAckReason),
    /// The connection dropped before the PUBACK; rumqttc may or may not send it again.
    Unknown,
}

/// One publish for the connection task.
pub struct Outbound {
    pub topic: String,
    pub payload: Bytes,
    pub properties: PublishProperties,
    /// Told the PUBACK's reason, when the publisher wants it.
    pub delivery: Option<oneshot::Sender<Delivery>>,
}

/// What the connection task hands to rumqttc, in the order it was queued: a request's PUBACK
/// queued after its response goes out after it, so the broker never forgets a request whose
/// answer it has not received.
enum Queued {
    Publish(Outbound),
    Ack(Publish),
    /// The node leads (`true`) or follows: subscribe to requests at that role's QoS.
    Role(bool),
}

/// What the rest of the node holds of the connection.
#[derive(Clone)]
pub struct Connection {
    outbound: mpsc::UnboundedSender<Queued>,
    /// True while requests reach this node in time: connected, with the request subscription
    /// granted by the broker (its SUBACK received, or kept by a resumed session), and the broker's
    /// round trip within its bound. False while disconnected, between a CONNACK without a session
    /// and the SUBACK (when the broker drops requests), and while a round trip is over the bound.
    pub receiving: watch::Receiver<bool>,
    /// While the broker's round trip is over its bound: how long the slow probe took (or has
    /// been outstanding when it is not back yet).
    pub slow_round_trip: watch::Receiver<Option<Duration>>,
    /// Counts sessions: a new value means publishes of the previous one may be lost.
    pub sessions: watch::Receiver<u64>,
    /// Asks the task to say DISCONNECT and end; told when it has.
    stop: mpsc::UnboundedSender<oneshot::Sender<()>>,
}

/// How long a stopping node waits for its DISCONNECT to be written before it drops the
/// connection (the broker keeps the session either way).
pub const DISCONNECT_DEADLINE: Duration = Duration::from_secs(2);

/// What the front end needs of its broker connection: [`Connection`] in a running node; the
/// dispatcher's tests use an in-process one.
pub trait Link: Send + Sync + 'static {
    /// Publishes at QoS 1 in call order; `outbound.delivery` learns the PUBACK's reason.
    fn publish(&self, outbound: Outbound);
    /// Acknowledges a received request (the broker will not send it again), after every publish
    /// made before the call.
    fn ack(&self, publish: &Publish);
    /// Subscribes to requests at the QoS of the node's role: 1 while `leading`, the follower
    /// QoS otherwise.
    fn follow_role(&self, leading: bool);
    /// Sends DISCONNECT and closes the connection for good; the broker keeps the session for
    /// the session expiry.
    fn disconnect(&self) -> BoxFuture<'_, ()>;
}

impl Link for Connection {
    fn publish(&self, outbound: Outbound) {
        // The connection task ends only with the node; a closed channel means we are stopping.
        let _ = self.outbound.send(Queued::Publish(outbound));
    }

    fn ack(&self, publish: &Publish) {
        if publish.qos != QoS::AtMostOnce {
            // Behind every publish queued before it, the response to this request included.
            let _ = self.outbound.send(Queued::Ack(receipt(publish)));
        }
    }

    fn follow_role(&self, leading: bool) {
        let _ = self.outbound.send(Queued::Role(leading));
    }

    fn disconnect(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let (done_tx, done) = oneshot::channel();
            // Closed: the task has ended already.
            if self.stop.send(done_tx).is_err() {
                return;
            }
            if tokio::time::timeout(DISCONNECT_DEADLINE, done).await.is_err() {
                tracing::warn!(
                    "the broker connection did not say DISCONNECT within {DISCONNECT_DEADLINE:?}; dropping it"
                );
            }
        })
    }
}

/// What acknowledging a received publish needs (packet id, QoS, the dup flag) without its
/// topic, payload and properties: a request is kept long after its body was read, and the
/// body's buffers are freed at once.
pub fn receipt(publish: &Publish) -> Publish {
    Publish {
        dup: publish.dup,
        qos: publish.qos,
        retain: publish.retain,
        topic: Bytes::new(),
        pkid: publish.pkid,
        payload: Bytes::new(),
        properties: None,
    }
}

/// Where the connection task hands each received request, in arrival order. It must not block.
pub type RequestSink = Box<dyn Fn(Publish, Delivered) + Send>;

/// Builds the connection and starts its task. Received requests go to `requests`.
pub fn start(config: &BrokerConfig, requests: RequestSink, metrics: FrontEndMetrics) -> anyhow::Result<Connection> {
    let options = mqtt_options(config)?;
    // Room for every publish the task lets in flight plus the acknowledgements queued with them.
    let capacity = 2 * usize::from(config.inflight) + 64;
    let (client, eventloop) = AsyncClient::new(options, capacity);
    let (outbound_tx, outbound_rx) = mpsc::unbounded_channel();
    let (subscribed_tx, subscribed) = watch::channel(false);
    let (receiving_tx, receiving) = watch::channel(false);
    let (slow_tx, slow_round_trip) = watch::channel(None);
    let (sessions_tx, sessions) = watch::channel(0);
    let (stop_tx, stop_rx) = mpsc::unbounded_channel();
    let task = ConnectionTask {
        eventloop,
        client,
        outbound: outbound_rx,
        requests,
        metrics: metrics.clone(),
        subscribed: subscribed_tx,
        sessions: sessions_tx,
        window: usize::from(config.inflight),
        awaiting_id: VecDeque::new(),
        awaiting_ack: HashMap::new(),
        resent: 0,
        is_connected: false,
        stash: None,
        backoff: Backoff::new(),
        collision_since: None,
        follower_qos: if config.follower_qos == 0 { QoS::AtMostOnce } else { QoS::AtLeastOnce },
        leading: false,
        subscription: Subscription::default(),
        stop: stop_rx,
        stopping: None,
    };
    tokio::spawn(task.run());
    let probe = Probe {
        outbound: outbound_tx.downgrade(),
        topic: probe_topic(&config.client_id),
        bound: config.round_trip_bound,
        metrics,
    };
    tokio::spawn(follow_receiving(subscribed.clone(), slow_round_trip.clone(), receiving_tx));
    // Without probes `slow_round_trip` stays `None`.
    if !probe.bound.is_zero() {
        tokio::spawn(probe.run(subscribed, slow_tx));
    }
    Ok(Connection { outbound: outbound_tx, receiving, slow_round_trip, sessions, stop: stop_tx })
}

/// How often a node times the broker's round trip.
pub const PROBE_EVERY: Duration = Duration::from_millis(250);

/// Where a node's round-trip probes go: under the store's notification prefix, which a node
/// publishes to anyway, and beside the clients' topics (those are upper-case hex, never `probe`).
/// Nobody subscribes to it: the broker acknowledges a probe and drops it.
pub fn probe_topic(client_id: &str) -> String {
    format!("{NOTIFICATION_PREFIX}/probe/{}", hex_upper(client_id.as_bytes()))
}

/// Times the broker's round trip, one probe at a time, for [`Connection::slow_round_trip`].
struct Probe {
    /// Does not keep the connection task alive: it ends once the [`Connection`] is dropped.
    outbound: mpsc::WeakUnboundedSender<Queued>,
    topic: String,
    bound: Duration,
    metrics: FrontEndMetrics,
}

impl Probe {
    /// Probes while `subscribed` (connected with the request subscription granted); `slow` holds
    /// how long the slow probe took while one is over the bound. Ends with the connection task.
    async fn run(self, mut subscribed: watch::Receiver<bool>, slow: watch::Sender<Option<Duration>>) {
        let tell = |slow_for: Option<Duration>| {
            slow.send_if_modified(|was| std::mem::replace(was, slow_for) != slow_for);
        };
        loop {
            if !*subscribed.borrow_and_update() {
                // Not connected: nothing to time, and the connection's loss says it already.
                tell(None);
                if subscribed.changed().await.is_err() {
                    return;
                }
                continue;
            }
            let (delivery, mut delivered) = oneshot::channel();
            let probe = Outbound {
                topic: self.topic.clone(),
                payload: Bytes::new(),
                properties: PublishProperties::default(),
                delivery: Some(delivery),
            };
            let Some(outbound) = self.outbound.upgrade() else { return };
            if outbound.send(Queued::Publish(probe)).is_err() {
                return;
            }
            drop(outbound);
            let sent = Instant::now();
            let outcome = match tokio::time::timeout(self.bound, &mut delivered).await {
                Ok(outcome) => outcome,
                Err(_) => {
                    tracing::warn!(
                        bound_ms = self.bound.as_millis() as u64,
                        "the broker has not acknowledged a round-trip probe within the bound: requests do not \
                         reach this node in time"
                    );
                    // Until it is back (or the connection drops), say how long it has been out.
                    loop {
                        let out_for = sent.elapsed();
                        self.metrics.broker_round_trip.set(out_for.as_secs_f64());
                        tell(Some(out_for));
                        tokio::select! {
                            outcome = &mut delivered => break outcome,
                            _ = tokio::time::sleep(PROBE_EVERY) => {}
                        }
                    }
                }
            };
            let took = sent.elapsed();
            match outcome {
                // The connection task has ended: the node is stopping.
                Err(_) => return,
                // The connection dropped before the PUBACK: its loss is told by `subscribed`.
                Ok(Delivery::Unknown) => tell(None),
                Ok(_) => {
                    self.metrics.broker_round_trip.set(took.as_secs_f64());
                    let over = (took > self.bound).then_some(took);
                    if over.is_none() && slow.borrow().is_some() {
                        tracing::info!(
                            round_trip_ms = took.as_millis() as u64,
                            "the broker's round trip is within the bound again"
                        );
                    }
                    tell(over);
                }
            }
            tokio::time::sleep(PROBE_EVERY).await;
        }
    }
}

/// Keeps `receiving` true while `subscribed` is and `slow` is not, until `subscribed` ends (`slow`
/// ends first when nothing probes: it then stays as it was).
async fn follow_receiving(
    mut subscribed: watch::Receiver<bool>,
    mut slow: watch::Receiver<Option<Duration>>,
    receiving: watch::Sender<bool>,
) {
    let mut probed = true;
    loop {
        let now = *subscribed.borrow_and_update() && slow.borrow_and_update().is_none();
        receiving.send_if_modified(|was| std::mem::replace(was, now) != now);
        tokio::select! {
            changed = subscribed.changed() => if changed.is_err() { return },
            changed = slow.changed(), if probed => probed = changed.is_ok(),
        }
    }
}

fn mqtt_options(config: &BrokerConfig) -> anyhow::Result<MqttOptions> {
    let mut options = MqttOptions::new(config.client_id.clone(), config.host.clone(), config.port);
    options
        .set_clean_start(false)
        .set_session_expiry_interval(Some(config.session_expiry.as_secs() as u32))
        .set_keep_alive(config.keep_alive)
        .set_manual_acks(true)
        .set_max_packet_size(Some(config.max_packet_size))
        .set_receive_maximum(Some(config.inflight))
        .set_outgoing_inflight_upper_limit(config.inflight)
        .set_connection_timeout(5);
    // Responses, PUBACKs and notifications queued together go out in one write
    // (crates/rumqttc/README.md).
    options.set_max_request_batch(MAX_WRITE_BATCH);
    let mut network = NetworkOptions::new();
    network.set_tcp_nodelay(true);
    network.set_connection_timeout(5);
    options.set_network_options(network);
    if let (Some(username), password) = (&config.username, &config.password) {
        options.set_credentials(username.clone(), password.clone().unwrap_or_default());
    }
    if let Some(tls) = &config.tls {
        options.set_transport(Transport::tls_with_config(TlsConfiguration::Rustls(Arc::new(
            statestore_api::tls::client_config(tls)?,
        ))));
    }
    Ok(options)
}

/// Exponential reconnect delays from 100 ms to 10 s, each drawn uniformly from [d/2, d], so
/// nodes that lost the broker together do not come back in lockstep.
struct Backoff {
    next: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(10);

    fn new() -> Backoff {
        Backoff { next: Backoff::FIRST }
    }

    fn delay(&mut self) -> Duration {
        let ceiling = self.next;
        self.next = (self.next * 2).min(Backoff::MAX);
        let half = ceiling / 2;
        half + half.mul_f64(fastrand::f64())
    }

    fn reset(&mut self) {
        self.next = Backoff::FIRST;
    }
}

struct ConnectionTask {
    eventloop: EventLoop,
    client: AsyncClient,
    outbound: mpsc::UnboundedReceiver<Queued>,
    requests: RequestSink,
    metrics: FrontEndMetrics,
    /// True while connected with the request subscription granted.
    subscribed: watch::Sender<bool>,
    sessions: watch::Sender<u64>,
    /// At most this many of our publishes handed to rumqttc and not yet given a packet id.
    window: usize,
    /// Publishes handed to rumqttc, in order, waiting for their `Outgoing::Publish(pkid)`.
    awaiting_id: VecDeque<Option<oneshot::Sender<Delivery>>>,
    /// Publishes sent, by packet id, waiting for their PUBACK.
    awaiting_ack: HashMap<u16, oneshot::Sender<Delivery>>,
    /// Publishes of the previous connection rumqttc sends again first; they carry no sender.
    resent: usize,
    is_connected: bool,
    /// A publish or an acknowledgement rumqttc's channel had no room for.
    stash: Option<Queued>,
    backoff: Backoff,
    /// Since when rumqttc has held a publish back because its packet id is still unacknowledged
    /// (a collision). rumqttc itself gives up only after two keep-alive periods.
    collision_since: Option<Instant>,
    /// QoS of the request subscription while following.
    follower_qos: QoS,
    leading: bool,
    subscription: Subscription,
    /// Where [`Connection`]'s `disconnect` asks the task to stop.
    stop: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
    /// Set once DISCONNECT is asked for: told when it is written, and the task ends.
    stopping: Option<oneshot::Sender<()>>,
}

/// The request subscription of the current session, by the QoS this node asked for (the broker
/// may grant less; that is logged, not asked again).
#[derive(Debug, Default)]
struct Subscription {
    /// Asked for in the last SUBSCRIBE the broker granted.
    answered: Option<QoS>,
    /// Asked for in a SUBSCRIBE not answered yet.
    requested: Option<QoS>,
    /// The broker refused a SUBSCRIBE of this connection: not asked again before the next one.
    refused: bool,
}

/// Most queued publishes and acknowledgements rumqttc writes to the broker in one flush.
const MAX_WRITE_BATCH: usize = 64;

/// How long a packet-id collision may last before the connection is dropped and established
/// again (everything unacknowledged is sent again in the resumed session).
const COLLISION_GRACE: Duration = Duration::from_secs(1);

impl ConnectionTask {
    async fn run(mut self) {
        let mut retry_at: Option<Instant> = None;
        loop {
            self.flush_stash();
            self.subscribe_at_role_qos();
            let room = self.has_room();
            tokio::select! {
                _ = async { tokio::time::sleep_until(retry_at.unwrap_or_else(Instant::now)).await }, if retry_at.is_some() => {
                    retry_at = None;
                }
                _ = async { tokio::time::sleep_until(self.collision_since.unwrap_or_else(Instant::now) + COLLISION_GRACE).await },
                    if self.collision_since.is_some() && retry_at.is_none() => {
                    self.collision_since = None;
                    if self.eventloop.state.collision.is_some() {
                        self.drop_connection();
                    }
                }
                Some(done) = self.stop.recv(), if self.stopping.is_none() => {
                    // Not connected, or no room for DISCONNECT in rumqttc's channel: nothing to
                    // say it on, so just end (the broker keeps the session).
                    if !self.is_connected || self.client.try_disconnect().is_err() {
                        let _ = done.send(());
                        return;
                    }
                    self.stopping = Some(done);
                }
                event = self.eventloop.poll(), if retry_at.is_none() => match event {
                    Ok(Event::Outgoing(Outgoing::Disconnect)) if self.stopping.is_some() => {
                        // Written and flushed: rumqttc reports an outgoing packet after its write.
                        tracing::info!("said DISCONNECT to the broker");
                        return self.stopped();
                    }
                    Ok(event) => self.on_event(event),
                    Err(error) if self.stopping.is_some() => {
                        tracing::debug!(%error, "the broker connection ended while saying DISCONNECT");
                        return self.stopped();
                    }
                    Err(error) => {
                        self.on_error(&error);
                        retry_at = Some(Instant::now() + self.backoff.delay());
                    }
                },
                outbound = self.outbound.recv(), if room => match outbound {
                    Some(outbound) => {
                        self.hand_over(outbound);
                        self.hand_over_queued();
                    }
                    None => return,
                },
            }
        }
    }

    /// Tells whoever asked for the stop that it is done; the task then ends.
    fn stopped(&mut self) {
        if let Some(done) = self.stopping.take() {
            let _ = done.send(());
        }
    }

    /// Hands over what else is queued already, up to [`MAX_WRITE_BATCH`] in all, while there is
    /// room: rumqttc then writes it in one flush. Handed over one per turn of the loop, each
    /// publish and acknowledgement went out in a write of its own.
    fn hand_over_queued(&mut self) {
        for _ in 1..MAX_WRITE_BATCH {
            if !self.has_room() {
                break;
            }
            let Ok(queued) = self.outbound.try_recv() else { break };
            self.hand_over(queued);
        }
    }

    /// Whether rumqttc may take another publish or acknowledgement: nothing is stashed and the
    /// publish window is not full.
    fn has_room(&self) -> bool {
        self.stash.is_none() && self.awaiting_id.len() < self.window
    }

    fn hand_over(&mut self, queued: Queued) {
        let outbound = match queued {
            Queued::Publish(outbound) => outbound,
            Queued::Ack(publish) => {
                if let Err(ClientError::TryRequest(_)) | Err(ClientError::Request(_)) = self.client.try_ack(&publish) {
                    self.stash = Some(Queued::Ack(publish));
                }
                return;
            }
            Queued::Role(leading) => {
                self.leading = leading;
                return;
            }
        };
        let Outbound { topic, payload, properties, delivery } = outbound;
        match self.client.try_publish_with_properties(topic, QoS::AtLeastOnce, false, payload, properties) {
            Ok(()) => self.awaiting_id.push_back(delivery),
            // rumqttc's channel is full: the publish comes back whole, to be handed over again.
            Err(ClientError::TryRequest(request) | ClientError::Request(request)) => {
                let rumqttc::v5::Request::Publish(publish) = request else {
                    tracing::error!(?request, "rumqttc gave back another request than the publish handed to it");
                    return;
                };
                self.stash = Some(Queued::Publish(Outbound {
                    topic: String::from_utf8_lossy(&publish.topic).into_owned(),
                    payload: publish.payload,
                    properties: publish.properties.unwrap_or_default(),
                    delivery,
                }));
            }
        }
    }

    /// Subscribes to requests again when the role's QoS is not the one the broker granted (or is
    /// about to), e.g. after a role change or in a new session.
    fn subscribe_at_role_qos(&mut self) {
        let wanted = if self.leading { QoS::AtLeastOnce } else { self.follower_qos };
        let Subscription { answered, requested, refused } = self.subscription;
        if !self.is_connected || refused || requested.or(answered) == Some(wanted) {
            return;
        }
        match self.client.try_subscribe(REQUEST_TOPIC, wanted) {
            Ok(()) => self.subscription.requested = Some(wanted),
            // rumqttc's channel is full: the next turn of the loop tries again.
            Err(ClientError::TryRequest(_)) | Err(ClientError::Request(_)) => {}
        }
    }

    fn flush_stash(&mut self) {
        if let Some(outbound) = self.stash.take() {
            self.hand_over(outbound);
        }
    }

    /// Drops the connection so that the next poll connects again at once. The held-back publish
    /// was never sent: it goes back in the queue without its packet id and gets a fresh one.
    fn drop_connection(&mut self) {
        let held = self.eventloop.state.collision.take();
        self.eventloop.clean();
        if let Some(mut publish) = held {
            publish.pkid = 0;
            self.eventloop.pending.push_back(rumqttc::v5::Request::Publish(publish));
        }
        self.connection_lost("a packet-id collision was not resolved within 1 s; connecting again");
    }

    fn on_event(&mut self, event: Event) {
        match event {
            Event::Outgoing(Outgoing::AwaitAck(pkid)) => {
                tracing::info!(pkid, "rumqttc holds a publish back: its packet id is still unacknowledged");
                self.collision_since.get_or_insert_with(Instant::now);
            }
            Event::Incoming(Packet::ConnAck(connack)) => {
                self.is_connected = true;
                self.backoff.reset();
                // rumqttc first sends again what the last connection left unacknowledged (kept
                // only when the session survived); those carry no sender of ours.
                self.resent = self
                    .eventloop
                    .pending
                    .iter()
                    .filter(|r| matches!(r, rumqttc::v5::Request::Publish(p) if p.qos != QoS::AtMostOnce))
                    .count();
                // A SUBSCRIBE of the last connection may not have reached the broker; a new
                // session has no subscription at all.
                self.subscription.requested = None;
                self.subscription.refused = false;
                if !connack.session_present {
                    self.subscription.answered = None;
                }
                self.sessions.send_modify(|n| *n += 1);
                self.tell_subscribed();
                self.metrics.broker_connected.set(1);
                tracing::info!(session_present = connack.session_present, "connected to the broker");
            }
            Event::Incoming(Packet::Publish(publish)) => {
                if publish.topic.as_ref() == REQUEST_TOPIC.as_bytes() {
                    // Only a confirmed QoS 1 subscription delivers at the client's QoS; a SUBSCRIBE
                    // not yet answered may still be in either state.
                    let delivered = match self.subscription {
                        Subscription { answered: Some(QoS::AtLeastOnce), requested: None, .. } => {
                            Delivered::AsPublished
                        }
                        _ => Delivered::MaybeCapped,
                    };
                    (self.requests)(publish, delivered);
                } else {
                    tracing::warn!(topic = %String::from_utf8_lossy(&publish.topic), "a publish on a topic we did not subscribe to");
                    let _ = self.client.try_ack(&publish);
                }
            }
            Event::Incoming(Packet::PubAck(puback)) => {
                if let Some(delivery) = self.awaiting_ack.remove(&puback.pkid) {
                    let _ = delivery.send(match puback.reason {
                        PubAckReason::Success => Delivery::Accepted,
                        PubAckReason::NoMatchingSubscribers => Delivery::NoSubscribers,
                        other => Delivery::Refused(other),
                    });
                }
            }
            Event::Incoming(Packet::SubAck(suback)) => {
                use rumqttc::v5::mqttbytes::v5::SubscribeReasonCode;
                let requested = self.subscription.requested.take();
                match suback.return_codes.as_slice() {
                    [SubscribeReasonCode::Success(qos)] => {
                        self.subscription.answered = requested;
                        if requested.is_some_and(|wanted| wanted != *qos) {
                            tracing::warn!(?requested, granted = ?qos, "the broker granted another QoS for requests");
                        }
                        tracing::info!(topic = REQUEST_TOPIC, qos = ?qos, leading = self.leading, "subscribed");
                    }
                    codes => {
                        // A refused SUBSCRIBE leaves what the session had (none in a new one); it is
                        // asked again on the next connection, not in a loop against the refusal.
                        self.subscription.refused = true;
                        tracing::error!(?codes, "the broker refused the request subscription");
                    }
                }
                self.tell_subscribed();
            }
            Event::Incoming(Packet::Disconnect(disconnect)) => {
                tracing::warn!(reason = ?disconnect.reason_code, "the broker disconnected us");
            }
            Event::Outgoing(Outgoing::Publish(pkid)) => {
                if self.resent > 0 {
                    self.resent -= 1;
                } else if let Some(Some(delivery)) = self.awaiting_id.pop_front() {
                    self.awaiting_ack.insert(pkid, delivery);
                }
            }
            _ => {}
        }
    }

    /// Tells the [`Probe`] whether the broker sends requests to this node now.
    fn tell_subscribed(&self) {
        let subscribed = self.is_connected && self.subscription.answered.is_some();
        self.subscribed.send_if_modified(|was| std::mem::replace(was, subscribed) != subscribed);
    }

    fn on_error(&mut self, error: &rumqttc::v5::ConnectionError) {
        if self.is_connected {
            self.connection_lost(&error.to_string());
        } else {
            tracing::warn!(%error, "cannot connect to the broker");
        }
    }

    fn connection_lost(&mut self, error: &str) {
        // rumqttc has moved everything not yet acknowledged into its resend queue: the pairing
        // of packet ids starts again with the next connection.
        self.is_connected = false;
        self.collision_since = None;
        for delivery in self.awaiting_id.drain(..).flatten() {
            let _ = delivery.send(Delivery::Unknown);
        }
        for (_, delivery) in self.awaiting_ack.drain() {
            let _ = delivery.send(Delivery::Unknown);
        }
        self.tell_subscribed();
        self.metrics.broker_connected.set(0);
        self.metrics.broker_reconnects.inc();
        tracing::warn!(%error, "lost the broker connection");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_with_jitter_and_resets() {
        let mut backoff = Backoff::new();
        let first = backoff.delay();
        assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100), "{first:?}");
        let delays: Vec<Duration> = (0..10).map(|_| backoff.delay()).collect();
        assert!(delays.iter().all(|d| *d <= Backoff::MAX), "{delays:?}");
        assert!(*delays.last().unwrap() >= Backoff::MAX / 2, "reaches the cap: {delays:?}");
        backoff.reset();
        assert!(backoff.delay() <= Duration::from_millis(100));
    }
}
