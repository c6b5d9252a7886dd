//! Publishing key notifications from the replicated outbox (PROTOCOL.md §9).
//!
//! Apply writes every notification to the outbox in the same batch as the change that caused
//! it. The leader publishes the outbox in sequence order (so per-key order holds), always before
//! the response of the command that caused them (both go out on one connection, in order), and
//! learns each PUBACK. What the broker accepted in an unbroken prefix is confirmed through the
//! log (`ConfirmNotifications`) and leaves the outbox. A new leader, or a new broker session,
//! starts again after the last confirmed notification: nothing is lost, and a notification
//! published but not yet confirmed may be delivered twice.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use rumqttc::v5::mqttbytes::v5::PublishProperties;
use statestore_protocol::{property, Notification};
use statestore_raft::StateReader;
use statestore_statemachine::OutboxEntry;
use tokio::sync::oneshot;

use super::connection::{Delivery, Link, Outbound};
use super::envelope::{CONTENT_TYPE, PROTOCOL_VERSION};
use super::metrics::FrontEndMetrics;
use crate::leader::{Leader, NotificationSink};

const PAGE: usize = 256;

/// Most bytes of notifications handed to the connection and not yet answered by the broker
/// (topic, properties and payload each, a shared payload counted for every copy: what crosses
/// the link). Publishing pauses there until PUBACKs return; the answers of the writes that
/// caused the rest wait with it.
pub const MAX_OUTSTANDING_BYTES: usize = 64 << 20;

pub struct Notifier {
    state: Arc<Mutex<State>>,
    reader: StateReader,
    link: Arc<dyn Link>,
    metrics: FrontEndMetrics,
    /// Told of clients whose session is gone (PUBACK `0x10`).
    leader: Leader,
}

#[derive(Default)]
struct State {
    /// Publishing only while leading.
    active: bool,
    /// Bumped on every restart; deliveries of an earlier epoch are ignored.
    epoch: u64,
    /// The last sequence number handed to the connection.
    published: Option<u64>,
    /// Published and not yet settled in order: seq → whether the broker answered, and its bytes.
    outstanding: BTreeMap<u64, (bool, usize)>,
    /// The bytes of `outstanding` not yet answered.
    outstanding_bytes: usize,
    /// Every notification up to here was accepted (or refused for good) by the broker.
    settled: Option<u64>,
}

impl Notifier {
    pub fn new(reader: StateReader, link: Arc<dyn Link>, metrics: FrontEndMetrics, leader: Leader) -> Notifier {
        Notifier { state: Arc::new(Mutex::new(State::default())), reader, link, metrics, leader }
    }
}

impl NotificationSink for Notifier {
    /// Starts publishing from the oldest unconfirmed notification: on becoming leader, and
    /// after a broker session was lost (its publishes may be lost with it).
    fn restart(&self) {
        {
            let mut state = self.state.lock().unwrap();
            let epoch = state.epoch + 1;
            *state = State { active: true, epoch, ..State::default() };
        }
        self.publish_pending();
    }

    /// Stops publishing: another node leads.
    fn stop(&self) {
        let mut state = self.state.lock().unwrap();
        state.active = false;
        state.epoch += 1;
    }

    /// The last sequence number of an unbroken run the broker accepted.
    fn settled(&self) -> Option<u64> {
        let state = self.state.lock().unwrap();
        state.active.then_some(state.settled).flatten()
    }

    /// Publishes the notifications in the outbox after the last one published, while fewer
    /// than [`MAX_OUTSTANDING_BYTES`] await the broker.
    fn publish_pending(&self) -> bool {
        let mut state = self.state.lock().unwrap();
        if !state.active {
            return true;
        }
        loop {
            let page = match self.reader.pending_notifications(state.published, PAGE) {
                Ok(page) => page,
                Err(e) => {
                    tracing::error!(error = %e, "cannot read the notification outbox");
                    return true;
                }
            };
            // The watchers of one change share its value: encode it once for all of them.
            let mut encoded: Option<(Notification, Bytes)> = None;
            for entry in &page {
                if state.outstanding_bytes >= MAX_OUTSTANDING_BYTES {
                    return false;
                }
                let notification = &entry.notification.notification;
                let payload = match &encoded {
                    Some((cached, payload)) if same_payload(cached, notification) => payload.clone(),
                    _ => {
                        let payload = Bytes::from(notification.encode());
                        encoded = Some((notification.clone(), payload.clone()));
                        payload
                    }
                };
                self.publish(&mut state, entry, payload);
            }
            if page.len() < PAGE {
                return true;
            }
        }
    }
}

impl Notifier {
    fn publish(&self, state: &mut State, entry: &OutboxEntry, payload: Bytes) {
        state.published = Some(entry.seq);
        let notification = &entry.notification;
        let Some(topic) = notification.topic() else {
            // Registration refuses such keys; an old entry is settled rather than retried forever.
            tracing::error!(seq = entry.seq, "a notification topic exceeds the MQTT limit; skipped");
            settle(state, entry.seq);
            return;
        };
        let properties = PublishProperties {
            content_type: Some(CONTENT_TYPE.to_string()),
            user_properties: vec![
                (property::TIMESTAMP.to_string(), notification.version.to_string()),
                (property::PROTOCOL_VERSION.to_string(), PROTOCOL_VERSION.to_string()),
            ],
            ..Default::default()
        };
        let (delivery_tx, delivery_rx) = oneshot::channel();
        let bytes = topic.len() + payload.len() + 128;
        state.outstanding.insert(entry.seq, (false, bytes));
        state.outstanding_bytes += bytes;
        self.link.publish(Outbound { topic, payload, properties, delivery: Some(delivery_tx) });
        let (seq, epoch, client_id) = (entry.seq, state.epoch, notification.client_id.clone());
        let shared = self.state.clone();
        let metrics = self.metrics.clone();
        let leader = self.leader.clone();
        tokio::spawn(async move {
            let delivery = delivery_rx.await.unwrap_or(Delivery::Unknown);
            match delivery {
                Delivery::Accepted => metrics.notifications_sent.inc(),
                Delivery::NoSubscribers => {
                    metrics.notifications_sent.inc();
                    leader.client_gone(client_id);
                }
                Delivery::Refused(reason) => {
                    metrics.notifications_failed.inc();
                    tracing::warn!(seq, ?reason, "the broker refused a notification");
                }
                Delivery::Unknown => {
                    // Sent again from the outbox when the next session starts.
                    metrics.notifications_failed.inc();
                    return;
                }
            }
            let mut state = shared.lock().unwrap();
            if state.epoch == epoch {
                settle(&mut state, seq);
            }
        });
    }
}

/// Whether two notifications are the same one, shared (the same buffer), without comparing values.
fn same_payload(a: &Notification, b: &Notification) -> bool {
    match (a, b) {
        (Notification::Set { value: a }, Notification::Set { value: b }) => {
            a.as_ptr() == b.as_ptr() && a.len() == b.len()
        }
        (Notification::Delete, Notification::Delete) => true,
        _ => false,
    }
}

/// Marks `seq` answered and advances `settled` over the answered prefix.
fn settle(state: &mut State, seq: u64) {
    if let Some((answered, bytes)) = state.outstanding.get_mut(&seq) {
        if !*answered {
            state.outstanding_bytes -= *bytes;
        }
        *answered = true;
    }
    while let Some((&first, &(answered, _))) = state.outstanding.first_key_value() {
        if !answered {
            break;
        }
        state.outstanding.remove(&first);
        state.settled = Some(first);
    }
    if state.outstanding.is_empty() && state.published > state.settled {
        state.settled = state.published;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settled_advances_only_over_an_unbroken_prefix() {
        let mut state = State { active: true, ..State::default() };
        for seq in [3, 4, 5] {
            state.outstanding.insert(seq, (false, 10));
            state.outstanding_bytes += 10;
            state.published = Some(seq);
        }
        settle(&mut state, 4);
        assert_eq!(state.settled, None, "3 is still open");
        settle(&mut state, 3);
        assert_eq!(state.settled, Some(4));
        assert_eq!(state.outstanding_bytes, 10, "what the broker answered leaves the budget at once");
        settle(&mut state, 5);
        assert_eq!(state.settled, Some(5));
        assert!(state.outstanding.is_empty());
        assert_eq!(state.outstanding_bytes, 0);
    }
}
