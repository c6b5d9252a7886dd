//! A state store client over MQTT5, and the `statestore-cli` tool built on it.
//!
//! [`Client`] speaks the protocol the official SDKs speak (RESP3 payloads on the request topic,
//! `__ts`/`__ft`/`__srcId`/`__protVer` user properties, a response topic under
//! `clients/<client id>/`, correlation data), so everything it does an SDK could do too.
//!
//! # Layout
//! - [`Client`]: connect, [`Client::request`], key notifications, disconnect.
//!
//! TLS settings ([`TlsConfig`]) and the cluster secret come from `statestore-api`, which the node
//! shares.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use rumqttc::v5::mqttbytes::v5::{ConnectReturnCode, Filter, Packet, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, ConnectionError, Event, EventLoop, MqttOptions};
use rumqttc::{NetworkOptions, TlsConfiguration, Transport};
use statestore_protocol::topic::{hex_upper, NOTIFICATION_PREFIX, REQUEST_TOPIC};
use statestore_protocol::{property, Command, Hlc, Notification, Response, MAX_CLOCK_DRIFT_MS};
use tokio::sync::{mpsc, oneshot, watch};

pub use statestore_api::tls::{self, TlsConfig};

/// Where and how to connect.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub host: String,
    pub port: u16,
    /// The MQTT client id; also `__srcId`, the identity notifications are addressed to.
    pub client_id: String,
    pub tls: Option<TlsConfig>,
    pub username: Option<String>,
    pub password: Option<String>,
    /// How long a request may wait for its response; also its MQTT message expiry (rounded up to
    /// whole seconds), so a request nobody answered in time is not executed later.
    pub timeout: Duration,
    /// How long to wait for the broker's CONNACK and SUBACKs.
    pub connect_timeout: Duration,
}

impl ClientOptions {
    pub fn new(host: impl Into<String>, port: u16, client_id: impl Into<String>) -> ClientOptions {
        ClientOptions {
            host: host.into(),
            port,
            client_id: client_id.into(),
            tls: None,
            username: None,
            password: None,
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// Why a request got no state store answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to the MQTT broker at {address}: {detail}")]
    Connect { address: String, detail: String },
    #[error("the MQTT client stopped: {0}")]
    Closed(String),
    /// No answer in time; `correlation` is the request's correlation data in hex, which a node's
    /// debug log names the request by (`correlation=`).
    #[error("no response within {after:?} (correlation data {correlation})")]
    Timeout { after: Duration, correlation: String },
    /// The server answered with an RPC status other than 200 (e.g. 505 for an unsupported
    /// protocol version).
    #[error("the server answered with status {status}{}", message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    Status { status: String, message: Option<String> },
    #[error("the server's reply is not a state store reply: {0:?}")]
    MalformedReply(Vec<u8>),
    #[error("the server's version {0:?} is not an HLC")]
    MalformedVersion(String),
    #[error("the local clock cannot produce a timestamp: {0}")]
    Clock(String),
}

/// A reply with the version (`__ts`) the server attached, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub response: Response,
    pub version: Option<Hlc>,
}

/// One key notification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyNotification {
    pub key: Vec<u8>,
    pub notification: Notification,
    /// The version of the change (the notification's `__ts`).
    pub version: Option<Hlc>,
}

type Pending = Arc<Mutex<HashMap<Bytes, oneshot::Sender<Result<Reply, ClientError>>>>>;

/// A connected client. Requests may be issued concurrently from many tasks.
pub struct Client {
    mqtt: AsyncClient,
    client_id: String,
    response_topic: String,
    timeout: Duration,
    pending: Pending,
    clock: Mutex<Hlc>,
    next_correlation: Mutex<u128>,
    notifications: tokio::sync::Mutex<mpsc::UnboundedReceiver<KeyNotification>>,
    connected: watch::Receiver<bool>,
    task: tokio::task::JoinHandle<()>,
}

/// Milliseconds since the Unix epoch by the wall clock.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Client {
    /// Connects, subscribes to the response topic and this client's notification topics, and
    /// returns once the broker has acknowledged both subscriptions.
    pub async fn connect(options: ClientOptions) -> Result<Client, ClientError> {
        let address = format!("{}:{}", options.host, options.port);
        let connect_error = |detail: String| ClientError::Connect { address: address.clone(), detail };
        let mut mqtt_options = MqttOptions::new(options.client_id.clone(), options.host.clone(), options.port);
        mqtt_options
            .set_clean_start(true)
            .set_keep_alive(Duration::from_secs(10))
            .set_max_packet_size(Some(256 << 20))
            .set_connection_timeout(options.connect_timeout.as_secs().max(1));
        let mut network = NetworkOptions::new();
        network.set_tcp_nodelay(true);
        network.set_connection_timeout(options.connect_timeout.as_secs().max(1));
        mqtt_options.set_network_options(network);
        if let Some(username) = &options.username {
            mqtt_options.set_credentials(username.clone(), options.password.clone().unwrap_or_default());
        }
        if let Some(tls) = &options.tls {
            let config = tls::client_config(tls).map_err(|e| connect_error(format!("{e:#}")))?;
            mqtt_options.set_transport(Transport::tls_with_config(TlsConfiguration::Rustls(Arc::new(config))));
        }
        let (mqtt, mut eventloop) = AsyncClient::new(mqtt_options, 1024);
        let response_topic = format!("clients/{}/statestore-cli/response", options.client_id);
        let notification_filter =
            format!("{NOTIFICATION_PREFIX}/{}/command/notify/+", hex_upper(options.client_id.as_bytes()));

        // The first connection is made here, so that a refused or unreachable broker is an error
        // of `connect` rather than an endless retry.
        let connack = next_packet(&mut eventloop, options.connect_timeout, "CONNACK", |packet| match packet {
            Packet::ConnAck(ack) => Some(ack),
            _ => None,
        })
        .await
        .map_err(connect_error)?;
        if connack.code != ConnectReturnCode::Success {
            return Err(connect_error(format!("the broker refused the connection: {:?}", connack.code)));
        }
        let filters = vec![
            Filter::new(response_topic.clone(), QoS::AtLeastOnce),
            Filter::new(notification_filter, QoS::AtLeastOnce),
        ];
        mqtt.subscribe_many(filters.clone()).await.map_err(|e| connect_error(e.to_string()))?;
        let suback = next_packet(&mut eventloop, options.connect_timeout, "SUBACK", |packet| match packet {
            Packet::SubAck(ack) => Some(ack),
            _ => None,
        })
        .await
        .map_err(connect_error)?;
        if let Some(code) = suback
            .return_codes
            .iter()
            .find(|c| !matches!(c, rumqttc::v5::mqttbytes::v5::SubscribeReasonCode::Success(_)))
        {
            return Err(connect_error(format!("the broker refused a subscription: {code:?}")));
        }

        let pending: Pending = Arc::default();
        let (notifications_tx, notifications_rx) = mpsc::unbounded_channel();
        let (connected_tx, connected) = watch::channel(true);
        let task = tokio::spawn(run_eventloop(
            eventloop,
            mqtt.clone(),
            filters,
            response_topic.clone(),
            pending.clone(),
            notifications_tx,
            connected_tx,
        ));
        Ok(Client {
            mqtt,
            clock: Mutex::new(Hlc::new(now_ms(), 0, options.client_id.clone())),
            client_id: options.client_id,
            response_topic,
            timeout: options.timeout,
            pending,
            next_correlation: Mutex::new(fastrand::u128(..)),
            notifications: tokio::sync::Mutex::new(notifications_rx),
            connected,
            task,
        })
    }

    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// True while the broker connection is up (it is re-established automatically).
    pub fn is_connected(&self) -> bool {
        *self.connected.borrow()
    }

    /// The next `__ts`: this client's HLC advanced to now (§10.6).
    fn timestamp(&self) -> Result<Hlc, ClientError> {
        let mut clock = self.clock.lock().unwrap();
        clock.update_now(now_ms(), MAX_CLOCK_DRIFT_MS).map_err(|e| ClientError::Clock(e.to_string()))?;
        Ok(clock.clone())
    }

    /// Sends one request and waits for its reply. `fencing_token` becomes `__ft`.
    pub async fn request(&self, command: &Command, fencing_token: Option<&Hlc>) -> Result<Reply, ClientError> {
        let correlation = {
            let mut next = self.next_correlation.lock().unwrap();
            *next = next.wrapping_add(1);
            Bytes::copy_from_slice(&next.to_be_bytes())
        };
        let mut user_properties = Vec::with_capacity(4);
        if let Some(token) = fencing_token {
            user_properties.push((property::FENCING_TOKEN.to_string(), token.to_string()));
        }
        user_properties.push((property::SOURCE_ID.to_string(), self.client_id.clone()));
        user_properties.push((property::TIMESTAMP.to_string(), self.timestamp()?.to_string()));
        user_properties.push((property::PROTOCOL_VERSION.to_string(), "1.0".to_string()));
        let properties = PublishProperties {
            response_topic: Some(self.response_topic.clone()),
            correlation_data: Some(correlation.clone()),
            message_expiry_interval: Some(self.timeout.as_secs_f64().ceil().max(1.0) as u32),
            content_type: Some("application/octet-stream".into()),
            user_properties,
            ..Default::default()
        };
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(correlation.clone(), tx);
        let sent = self
            .mqtt
            .publish_with_properties(REQUEST_TOPIC, QoS::AtLeastOnce, false, command.encode(), properties)
            .await;
        if let Err(e) = sent {
            self.pending.lock().unwrap().remove(&correlation);
            return Err(ClientError::Closed(e.to_string()));
        }
        let reply = match tokio::time::timeout(self.timeout, rx).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => Err(ClientError::Closed("the connection task ended".into())),
            Err(_) => {
                self.pending.lock().unwrap().remove(&correlation);
                let correlation = statestore_protocol::topic::hex_upper(&correlation);
                Err(ClientError::Timeout { after: self.timeout, correlation })
            }
        }?;
        if let Some(version) = &reply.version {
            // Keep this client's clock ahead of every version it has seen (§10.4); a server far
            // ahead is not followed past the allowed drift.
            let _ = self.clock.lock().unwrap().update(version, now_ms(), MAX_CLOCK_DRIFT_MS);
        }
        Ok(reply)
    }

    /// The next key notification, or `None` once the connection task has ended.
    pub async fn next_notification(&self) -> Option<KeyNotification> {
        self.notifications.lock().await.recv().await
    }

    /// Disconnects cleanly.
    pub async fn disconnect(self) {
        let _ = self.mqtt.disconnect().await;
        let _ = tokio::time::timeout(Duration::from_secs(2), self.task).await;
    }
}

/// Polls until the broker sends the packet `pick` accepts; a connection error or the timeout
/// ends the wait with a description.
async fn next_packet<T>(
    eventloop: &mut EventLoop,
    timeout: Duration,
    name: &str,
    pick: impl Fn(Packet) -> Option<T>,
) -> Result<T, String> {
    let wait = async {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(packet)) => {
                    if let Some(found) = pick(packet) {
                        return Ok(found);
                    }
                }
                Ok(_) => {}
                Err(e) => return Err(describe(&e)),
            }
        }
    };
    tokio::time::timeout(timeout, wait).await.map_err(|_| format!("no {name} in time"))?
}

fn describe(error: &ConnectionError) -> String {
    match error {
        ConnectionError::Io(e) => e.to_string(),
        ConnectionError::ConnectionRefused(code) => format!("the broker refused the connection: {code:?}"),
        other => other.to_string(),
    }
}

/// Drives the connection: replies to their waiting requests, notifications to the channel,
/// reconnection (with subscriptions again, as the session is clean) after a loss.
async fn run_eventloop(
    mut eventloop: EventLoop,
    mqtt: AsyncClient,
    filters: Vec<Filter>,
    response_topic: String,
    pending: Pending,
    notifications: mpsc::UnboundedSender<KeyNotification>,
    connected: watch::Sender<bool>,
) {
    let notify_prefix = format!("{NOTIFICATION_PREFIX}/");
    loop {
        match eventloop.poll().await {
            Ok(Event::Incoming(Packet::Publish(publish))) => {
                let topic = String::from_utf8_lossy(&publish.topic);
                let properties = publish.properties.clone().unwrap_or_default();
                if topic == response_topic {
                    let Some(correlation) = properties.correlation_data.clone() else { continue };
                    let Some(waiter) = pending.lock().unwrap().remove(&correlation) else { continue };
                    let _ = waiter.send(reply_of(&publish.payload, &properties));
                } else if topic.starts_with(&notify_prefix) {
                    if let Some(notification) = notification_of(&topic, &publish.payload, &properties) {
                        let _ = notifications.send(notification);
                    }
                }
            }
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                // Never await the request channel here: this task is the one that drains it.
                let _ = mqtt.try_subscribe_many(filters.clone());
                let _ = connected.send(true);
            }
            Ok(Event::Incoming(Packet::Disconnect(_))) => {
                let _ = connected.send(false);
            }
            Ok(Event::Outgoing(rumqttc::Outgoing::Disconnect)) => return,
            Ok(_) => {}
            Err(ConnectionError::RequestsDone) => return,
            Err(_) => {
                let _ = connected.send(false);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
}

fn user_property<'a>(properties: &'a PublishProperties, name: &str) -> Option<&'a str> {
    properties.user_properties.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

fn version_of(properties: &PublishProperties) -> Result<Option<Hlc>, ClientError> {
    user_property(properties, property::TIMESTAMP)
        .map(|ts| ts.parse::<Hlc>().map_err(|_| ClientError::MalformedVersion(ts.to_string())))
        .transpose()
}

fn reply_of(payload: &[u8], properties: &PublishProperties) -> Result<Reply, ClientError> {
    match user_property(properties, property::STATUS) {
        Some("200") => {}
        status => {
            return Err(ClientError::Status {
                status: status.unwrap_or("(none)").to_string(),
                message: user_property(properties, property::STATUS_MESSAGE).map(str::to_string),
            })
        }
    }
    let response = Response::decode(payload).map_err(|_| ClientError::MalformedReply(payload.to_vec()))?;
    Ok(Reply { response, version: version_of(properties)? })
}

fn notification_of(topic: &str, payload: &[u8], properties: &PublishProperties) -> Option<KeyNotification> {
    let key_hex = topic.rsplit_once("/command/notify/")?.1;
    let key = decode_hex(key_hex)?;
    let notification = Notification::decode(payload)?;
    Some(KeyNotification { key, notification, version: version_of(properties).ok().flatten() })
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notification_topics_decode_to_the_key() {
        let topic = statestore_protocol::topic::notification_topic("cli", b"\x00k/\xff").unwrap();
        let payload = Notification::Delete.encode();
        let decoded = notification_of(&topic, &payload, &PublishProperties::default()).unwrap();
        assert_eq!(decoded.key, b"\x00k/\xff");
        assert_eq!(decoded.notification, Notification::Delete);
        assert!(notification_of(&format!("{topic}F"), &payload, &PublishProperties::default()).is_none());
        assert!(notification_of(&topic, b"+OK\r\n", &PublishProperties::default()).is_none());
    }

    #[test]
    fn replies_need_status_200_and_a_valid_payload() {
        let mut properties = PublishProperties::default();
        assert!(matches!(reply_of(b"+OK\r\n", &properties), Err(ClientError::Status { .. })));
        properties.user_properties.push((property::STATUS.into(), "200".into()));
        properties.user_properties.push((property::TIMESTAMP.into(), "000000000000001:00002:n1".into()));
        let reply = reply_of(b"+OK\r\n", &properties).unwrap();
        assert_eq!(reply.response, Response::Ok);
        assert_eq!(reply.version, Some(Hlc::new(1, 2, "n1")));
        assert!(matches!(reply_of(b"+OK", &properties), Err(ClientError::MalformedReply(_))));
        properties.user_properties[1].1 = "x".into();
        assert!(matches!(reply_of(b"+OK\r\n", &properties), Err(ClientError::MalformedVersion(_))));
    }
}
