//! Leader duties: the work a node does only while it leads, beside the [`Pipeline`] and whatever
//! front end feeds it (DESIGN.md §5–7).
//!
//! - **Leadership watch**: a node counts as leading once it has confirmed its leadership with a
//!   quorum and applied everything committed before; [`Leader::leading`] tells front ends.
//! - **Expiry sweeper**: proposes `Expire` for keys whose deadline has passed, at most
//!   [`SWEEP_BATCH`] keys per tick, each key once at a time.
//! - **Notification publishing**: the outbox is published by a [`NotificationSink`] (the MQTT
//!   front end), restarted on gaining leadership, poked after every applied batch that produced
//!   notifications, and stopped on losing leadership.
//! - **Outbox confirmation**: what the sink reports settled is confirmed through the log, so the
//!   outbox shrinks and a next leader does not publish it again.
//! - **Registration drops**: a client whose session is gone loses its registrations, at most
//!   once per [`DROP_DEBOUNCE`].

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use openraft::ServerState;
use prometheus::{exponential_buckets, Histogram, HistogramOpts, IntCounter, Registry};
use statestore_protocol::Response;
use statestore_raft::{Raft, StateReader};
use statestore_statemachine::{Entry, Operation};
use tokio::sync::{mpsc, watch};

use crate::node::now_ms;
use crate::pipeline::{ensure_linearizable, Outcome, Pipeline, Work};

/// How often the sweeper looks for due keys.
pub const SWEEP_EVERY: Duration = Duration::from_millis(20);
/// Most keys one sweep proposes to expire.
pub const SWEEP_BATCH: usize = 256;
/// How often the leader confirms published notifications through the log.
pub const CONFIRM_EVERY: Duration = Duration::from_millis(100);
/// A client whose session is gone is dropped once per this period, however many notifications
/// bounce meanwhile.
pub const DROP_DEBOUNCE: Duration = Duration::from_secs(5);

/// Publishes the notification outbox (DESIGN.md §7). Implemented by the MQTT front end.
pub trait NotificationSink: Send + Sync {
    /// Publishes from the oldest unconfirmed notification: this node now leads.
    fn restart(&self);
    /// Stops publishing: this node no longer leads.
    fn stop(&self);
    /// Publishes whatever was added to the outbox since the last call, as far as its budget of
    /// notifications awaiting the broker allows; whether the outbox is now all handed over (or
    /// this node publishes nothing, not leading).
    fn publish_pending(&self) -> bool;
    /// The last sequence number of an unbroken run of notifications the broker has settled.
    fn settled(&self) -> Option<u64>;
}

/// The node's leader duties; cheap to clone.
#[derive(Clone)]
pub struct Leader {
    inner: Arc<Inner>,
}

struct Inner {
    pipeline: Pipeline,
    reader: StateReader,
    metrics: LeaderMetrics,
    sink: OnceLock<Arc<dyn NotificationSink>>,
    /// The term this node leads in, once confirmed; `None` while it does not lead. Closed when
    /// Raft stops.
    leading: watch::Receiver<Option<u64>>,
    gone: mpsc::UnboundedSender<String>,
    /// Keys with an `Expire` in flight.
    expiring: Mutex<HashSet<Vec<u8>>>,
    /// When this node's current leadership was confirmed; `None` while it does not lead.
    since: Mutex<Option<Instant>>,
}

#[derive(Clone)]
struct LeaderMetrics {
    expired_keys: IntCounter,
    expiry_lag_seconds: Histogram,
    registrations_dropped: IntCounter,
}

impl LeaderMetrics {
    fn register(registry: &Registry) -> prometheus::Result<LeaderMetrics> {
        let expired_keys = IntCounter::new("statestore_expired_keys_total", "Keys the expiry sweeper deleted")?;
        let expiry_lag_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "statestore_expiry_lag_seconds",
                "From a key's deadline to its deletion being applied on the leader",
            )
            .buckets(exponential_buckets(0.001, 2.0, 14)?),
        )?;
        let registrations_dropped = IntCounter::new(
            "statestore_registrations_dropped_total",
            "Clients whose KEYNOTIFY registrations were dropped because their session is gone",
        )?;
        registry.register(Box::new(expired_keys.clone()))?;
        registry.register(Box::new(expiry_lag_seconds.clone()))?;
        registry.register(Box::new(registrations_dropped.clone()))?;
        Ok(LeaderMetrics { expired_keys, expiry_lag_seconds, registrations_dropped })
    }
}

impl Leader {
    /// Starts the leadership watch and the duties; they end when Raft stops.
    pub fn start(
        raft: Raft,
        pipeline: Pipeline,
        reader: StateReader,
        registry: &Registry,
    ) -> prometheus::Result<Leader> {
        let metrics = LeaderMetrics::register(registry)?;
        let (leading_tx, leading) = watch::channel(None);
        let (gone_tx, gone_rx) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            pipeline,
            reader,
            metrics,
            sink: OnceLock::new(),
            leading,
            gone: gone_tx,
            expiring: Mutex::new(HashSet::new()),
            since: Mutex::new(None),
        });
        let weak = Arc::downgrade(&inner);
        inner.pipeline.on_notifications(Box::new(move || {
            match weak.upgrade().and_then(|inner| inner.sink.get().cloned()) {
                Some(sink) => sink.publish_pending(),
                None => true,
            }
        }));
        tokio::spawn(inner.clone().watch_leadership(raft, leading_tx));
        tokio::spawn(inner.clone().sweep());
        tokio::spawn(inner.clone().confirm());
        tokio::spawn(inner.clone().drop_gone_clients(gone_rx));
        Ok(Leader { inner })
    }

    /// Hands notification publishing to `sink`. A node has at most one sink; a second is refused.
    pub fn attach_sink(&self, sink: Arc<dyn NotificationSink>) -> anyhow::Result<()> {
        if self.inner.sink.set(sink.clone()).is_err() {
            anyhow::bail!("a notification sink is attached already");
        }
        if self.is_leading() {
            sink.restart();
        }
        Ok(())
    }

    /// Whether this node leads and has confirmed it.
    pub fn is_leading(&self) -> bool {
        self.inner.is_leading()
    }

    /// When this node's current leadership was confirmed (shortly after its election); `None`
    /// while it does not lead.
    pub fn leading_since(&self) -> Option<Instant> {
        *self.inner.since.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The term this node leads in once confirmed, `None` while it does not lead.
    pub fn leading(&self) -> watch::Receiver<Option<u64>> {
        self.inner.leading.clone()
    }

    /// A client's session is gone (a notification to it found no subscriber): while leading,
    /// its registrations are dropped through the log.
    pub fn client_gone(&self, client_id: String) {
        let _ = self.inner.gone.send(client_id);
    }
}

/// Completes when the leadership watch closes: Raft has stopped.
async fn closed(leading: &mut watch::Receiver<Option<u64>>) {
    while leading.changed().await.is_ok() {}
}

impl Inner {
    fn is_leading(&self) -> bool {
        self.leading.borrow().is_some()
    }

    fn stopped(&self) -> bool {
        self.leading.has_changed().is_err()
    }

    fn sink(&self) -> Option<&Arc<dyn NotificationSink>> {
        self.sink.get()
    }

    /// Follows Raft's view of this node's role. A new leader first confirms its leadership and
    /// applies everything committed, then publishes the notification backlog and tells front
    /// ends, which take over what they held as followers.
    async fn watch_leadership(self: Arc<Self>, raft: Raft, leading: watch::Sender<Option<u64>>) {
        let mut metrics = raft.metrics();
        let mut leading_term: Option<u64> = None;
        loop {
            let (is_leader, term) = {
                let current = metrics.borrow_and_update();
                (current.state == ServerState::Leader, current.current_term)
            };
            if is_leader && leading_term != Some(term) {
                if ensure_linearizable(&raft).await.is_ok() {
                    leading_term = Some(term);
                    *self.since.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(Instant::now());
                    tracing::info!(term, "leading: publishing the notification backlog and taking over");
                    if let Some(sink) = self.sink() {
                        sink.restart();
                    }
                    leading.send_replace(Some(term));
                } else {
                    tokio::time::sleep(SWEEP_EVERY).await;
                }
                continue;
            }
            if !is_leader && leading_term.take().is_some() {
                *self.since.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = None;
                if let Some(sink) = self.sink() {
                    sink.stop();
                }
                leading.send_replace(None);
            }
            if metrics.changed().await.is_err() {
                return;
            }
        }
    }

    /// Proposes `Expire` for every key whose deadline has passed.
    async fn sweep(self: Arc<Self>) {
        let mut tick = tokio::time::interval(SWEEP_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !self.stopped() {
            tick.tick().await;
            if !self.is_leading() {
                continue;
            }
            let now = now_ms();
            let due = match self.reader.due_keys(now, SWEEP_BATCH) {
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
                let inner = self.clone();
                let (name, expires_at) = (key.key, key.expires_at);
                self.pipeline.submit(
                    Work::Write(entry),
                    Box::new(move |outcome| {
                        inner.expiring.lock().unwrap().remove(&name);
                        if let Ok(Outcome::Written(applied)) = outcome {
                            if applied.reply.response == Response::Int(1) {
                                inner.metrics.expired_keys.inc();
                                let lag_ms = now_ms().saturating_sub(expires_at);
                                inner.metrics.expiry_lag_seconds.observe(lag_ms as f64 / 1000.0);
                            }
                        }
                    }),
                );
            }
        }
    }

    /// Confirms through the log what the sink reports settled.
    async fn confirm(self: Arc<Self>) {
        let mut tick = tokio::time::interval(CONFIRM_EVERY);
        let mut confirmed: Option<u64> = None;
        while !self.stopped() {
            tick.tick().await;
            if !self.is_leading() {
                confirmed = None;
                continue;
            }
            // What the notifier held back for want of budget goes out as PUBACKs free it.
            if let Some(sink) = self.sink() {
                sink.publish_pending();
            }
            let Some(through) = self.sink().and_then(|sink| sink.settled()) else { continue };
            if confirmed.is_some_and(|c| c >= through) {
                continue;
            }
            confirmed = Some(through);
            let entry = Entry { operation: Operation::ConfirmNotifications { through }, wall_clock_ms: now_ms() };
            self.pipeline.submit(Work::Write(entry), Box::new(|_| {}));
        }
    }

    /// Drops the registrations of clients whose session is gone.
    async fn drop_gone_clients(self: Arc<Self>, mut gone: mpsc::UnboundedReceiver<String>) {
        let mut recent: HashMap<String, Instant> = HashMap::new();
        let mut leading = self.leading.clone();
        loop {
            let client_id = tokio::select! {
                received = gone.recv() => match received {
                    Some(client_id) => client_id,
                    None => return,
                },
                _ = closed(&mut leading) => return,
            };
            let now = Instant::now();
            recent.retain(|_, at| now.duration_since(*at) < DROP_DEBOUNCE);
            if recent.contains_key(&client_id) || !self.is_leading() {
                continue;
            }
            recent.insert(client_id.clone(), now);
            tracing::info!(client_id, "no subscriber for a notification: dropping the client's registrations");
            let entry = Entry { operation: Operation::DropRegistrations { client_id }, wall_clock_ms: now_ms() };
            let metrics = self.metrics.clone();
            self.pipeline.submit(
                Work::Write(entry),
                Box::new(move |outcome| {
                    if let Ok(Outcome::Written(applied)) = outcome {
                        if applied.reply.response != Response::Int(0) {
                            metrics.registrations_dropped.inc();
                        }
                    }
                }),
            );
        }
    }
}
