//! MQTT5 requests as the official Rust SDK (`azure_iot_operations_services` state store client)
//! sends them (PROTOCOL.md §1.2 and §2): QoS 1 on the request topic, its response topic,
//! 16 bytes of correlation data, content type, message expiry, and the user properties
//! `__srcId`, `__ts`, `__protVer`, `$partition`, `$high_priority` in the SDK's order.
//!
//! Every connection has one task that reads its packets and hands each response to the request
//! waiting for it (matched by correlation data).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail};
use bytes::Bytes;
use rumqttc::v5::mqttbytes::v5::{ConnectReturnCode, Filter, Packet, PublishProperties, SubscribeReasonCode};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, ConnectionError, Event, EventLoop, MqttOptions};
use rumqttc::{NetworkOptions, Outgoing};
use statestore_protocol::topic::REQUEST_TOPIC;
use statestore_protocol::{Get, Hlc, Set, MAX_CLOCK_DRIFT_MS};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::load::{RequestError, Requester};

/// In-flight slots that share one MQTT connection.
pub const SLOTS_PER_CONNECTION: usize = 16;

/// Largest MQTT packet this client accepts.
const MAX_PACKET_SIZE: u32 = 16 << 20;

/// Requests a connection may have unacknowledged at the broker (Mosquitto's
/// `max_inflight_messages` in the benchmark's configuration).
const OUTGOING_INFLIGHT: u16 = 1000;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What a load sending as many clients subscribes to: every client's `clients/<id>/flood`.
const MANY_FILTER: &str = "clients/+/flood";

/// The response topic the Rust SDK subscribes to (PROTOCOL.md §1.2).
pub fn response_topic(client_id: &str) -> String {
    format!("clients/{client_id}/services/{REQUEST_TOPIC}/response")
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A random UUID v4 in its text form: the node id of the SDK's application clock.
fn uuid_v4() -> String {
    let mut bytes = fastrand::u128(..).to_be_bytes();
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

/// What a connection hands to the request waiting for a response.
struct Answer {
    payload: Bytes,
    properties: PublishProperties,
}

type Waiting = Arc<Mutex<HashMap<Bytes, oneshot::Sender<Answer>>>>;

struct Connection {
    client: AsyncClient,
    client_id: String,
    response_topic: String,
    waiting: Waiting,
    reader: JoinHandle<()>,
}

/// A request as [`MqttLoad::request`] sends it: the SDK's envelope, with what a hostile or
/// unusual client changes.
#[derive(Debug, Clone, Default)]
pub struct Envelope {
    /// Sent as another client (its response topic `clients/<id>/flood` and its `__srcId`); the
    /// load must have been opened with [`MqttLoad::connect_as_many`].
    pub client_id: Option<String>,
    /// Correlation data of this many random bytes instead of the SDK's 16.
    pub correlation_bytes: Option<usize>,
    /// Message expiry in seconds instead of the load's.
    pub message_expiry_secs: Option<u32>,
}

/// An answer: its `__stat` and `__stMsg` and its RESP payload.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: Option<String>,
    pub message: Option<String>,
    pub payload: Bytes,
}

impl Reply {
    /// The error this answer stands for, for counting: the RESP error text, or the status.
    pub fn error(&self) -> Option<String> {
        if self.status.as_deref() != Some("200") {
            return Some(format!(
                "__stat={} {}",
                self.status.as_deref().unwrap_or("missing"),
                self.message.as_deref().unwrap_or("")
            ));
        }
        self.payload.strip_prefix(b"-").map(|text| String::from_utf8_lossy(text).trim_end().to_string())
    }
}

/// Options of every request.
#[derive(Debug, Clone, Copy)]
pub struct RequestOptions {
    /// A request with no answer after this long is an error.
    pub timeout: Duration,
    /// The MQTT message expiry interval of the request.
    pub message_expiry_secs: u32,
}

/// A set of MQTT connections sending SET and GET requests the way the SDK does.
pub struct MqttLoad {
    connections: Vec<Connection>,
    /// The application clock: one per process in the SDK, shared by its clients.
    clock: Mutex<Hlc>,
    options: RequestOptions,
}

impl MqttLoad {
    /// Enough connections for `slots` in-flight requests, 16 per connection.
    pub async fn connect(broker_port: u16, slots: usize, options: RequestOptions) -> anyhow::Result<MqttLoad> {
        let count = slots.div_ceil(SLOTS_PER_CONNECTION).max(1);
        let run = format!("{:08x}", fastrand::u32(..));
        let mut connections = Vec::with_capacity(count);
        for n in 0..count {
            connections.push(Connection::open(broker_port, format!("compare-{run}-{n}")).await?);
        }
        Ok(MqttLoad { connections, clock: Mutex::new(Hlc::new(now_ms(), 0, uuid_v4())), options })
    }

    /// Like [`MqttLoad::connect`], but each connection also takes the answers sent to any client
    /// on `clients/<id>/flood`: requests may then be sent as many made-up clients
    /// ([`Envelope::client_id`]).
    pub async fn connect_as_many(broker_port: u16, slots: usize, options: RequestOptions) -> anyhow::Result<MqttLoad> {
        let count = slots.div_ceil(SLOTS_PER_CONNECTION).max(1);
        let run = format!("{:08x}", fastrand::u32(..));
        let mut connections = Vec::with_capacity(count);
        for n in 0..count {
            connections.push(Connection::open_for(broker_port, format!("flood-{run}-{n}"), Some(MANY_FILTER)).await?);
        }
        Ok(MqttLoad { connections, clock: Mutex::new(Hlc::new(now_ms(), 0, uuid_v4())), options })
    }

    /// Sends `payload` (a RESP request) on the request topic as `envelope` says, and returns the
    /// answer, whatever it is.
    pub async fn request(&self, slot: usize, payload: Vec<u8>, envelope: &Envelope) -> Result<Reply, RequestError> {
        let connection = &self.connections[(slot / SLOTS_PER_CONNECTION) % self.connections.len()];
        let correlation = match envelope.correlation_bytes {
            Some(n) => Bytes::from((0..n.max(1)).map(|_| fastrand::u8(..)).collect::<Vec<u8>>()),
            None => Bytes::copy_from_slice(&fastrand::u128(..).to_be_bytes()),
        };
        let (client_id, response_topic) = match &envelope.client_id {
            Some(id) => (id.clone(), format!("clients/{id}/flood")),
            None => (connection.client_id.clone(), connection.response_topic.clone()),
        };
        let properties = PublishProperties {
            response_topic: Some(response_topic),
            correlation_data: Some(correlation.clone()),
            message_expiry_interval: Some(envelope.message_expiry_secs.unwrap_or(self.options.message_expiry_secs)),
            content_type: Some("application/octet-stream".into()),
            user_properties: vec![
                ("__srcId".into(), client_id.clone()),
                ("__ts".into(), self.timestamp()?),
                ("__protVer".into(), "1.0".into()),
                ("$partition".into(), client_id),
                ("$high_priority".into(), String::new()),
            ],
            ..Default::default()
        };
        let answer = self.exchange(connection, correlation, payload, properties).await?;
        let property =
            |name: &str| answer.properties.user_properties.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        if let Some(version) = property("__ts").and_then(|ts| ts.parse::<Hlc>().ok()) {
            let _ = self.clock.lock().unwrap().update(&version, now_ms(), MAX_CLOCK_DRIFT_MS);
        }
        Ok(Reply { status: property("__stat"), message: property("__stMsg"), payload: answer.payload })
    }

    /// Publishes one request and waits for its answer, within the timeout.
    async fn exchange(
        &self,
        connection: &Connection,
        correlation: Bytes,
        payload: Vec<u8>,
        properties: PublishProperties,
    ) -> Result<Answer, RequestError> {
        let (answer_tx, answer_rx) = oneshot::channel();
        connection.waiting.lock().unwrap().insert(correlation.clone(), answer_tx);
        let forget = || connection.waiting.lock().unwrap().remove(&correlation);
        let published = tokio::time::timeout(
            self.options.timeout,
            connection.client.publish_with_properties(REQUEST_TOPIC, QoS::AtLeastOnce, false, payload, properties),
        )
        .await;
        match published {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                forget();
                return Err(RequestError::Send(e.to_string()));
            }
            Err(_) => {
                forget();
                return Err(RequestError::Timeout);
            }
        }
        match tokio::time::timeout(self.options.timeout, answer_rx).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(_)) => Err(RequestError::Send("the connection closed".into())),
            Err(_) => {
                forget();
                Err(RequestError::Timeout)
            }
        }
    }

    fn timestamp(&self) -> Result<String, RequestError> {
        let mut clock = self.clock.lock().unwrap();
        clock.update_now(now_ms(), MAX_CLOCK_DRIFT_MS).map_err(|e| RequestError::Send(e.to_string()))?;
        Ok(clock.to_string())
    }

    /// Checks an answer as the SDK would: status 200 (the payload is left to the caller).
    fn judge(&self, answer: &Answer) -> Result<(), RequestError> {
        let property =
            |name: &str| answer.properties.user_properties.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        if let Some(version) = property("__ts").and_then(|ts| ts.parse::<Hlc>().ok()) {
            // The SDK merges every version it receives into its clock.
            let _ = self.clock.lock().unwrap().update(&version, now_ms(), MAX_CLOCK_DRIFT_MS);
        }
        match property("__stat") {
            Some("200") => {}
            status => {
                let message = property("__stMsg").unwrap_or("");
                return Err(RequestError::Refused(format!("__stat={} {message}", status.unwrap_or("missing"))));
            }
        }
        Ok(())
    }

    /// Sends one request with `payload` (a RESP3 command) on the connection of `slot` and waits
    /// for its answer, judged for its status.
    async fn call(&self, slot: usize, payload: Vec<u8>) -> Result<Answer, RequestError> {
        let connection = &self.connections[(slot / SLOTS_PER_CONNECTION) % self.connections.len()];
        let correlation = Bytes::copy_from_slice(&fastrand::u128(..).to_be_bytes());
        let properties = PublishProperties {
            response_topic: Some(connection.response_topic.clone()),
            correlation_data: Some(correlation.clone()),
            message_expiry_interval: Some(self.options.message_expiry_secs),
            content_type: Some("application/octet-stream".into()),
            user_properties: vec![
                ("__srcId".into(), connection.client_id.clone()),
                ("__ts".into(), self.timestamp()?),
                ("__protVer".into(), "1.0".into()),
                ("$partition".into(), connection.client_id.clone()),
                ("$high_priority".into(), String::new()),
            ],
            ..Default::default()
        };
        let answer = self.exchange(connection, correlation, payload, properties).await?;
        self.judge(&answer).map(|()| answer)
    }
}

impl Requester for MqttLoad {
    /// A SET succeeds with `+OK`.
    async fn set(&self, slot: usize, key: Vec<u8>, value: &[u8]) -> Result<(), RequestError> {
        let answer = self.call(slot, Set::new(key, value).encode()).await?;
        if answer.payload.as_ref() == b"+OK\r\n" {
            Ok(())
        } else {
            Err(RequestError::Refused(String::from_utf8_lossy(&answer.payload).trim_end().to_string()))
        }
    }

    /// A GET (linearizable: the store has no local read over MQTT) succeeds with a value; a nil
    /// (the key is missing) or an error is a failure. The echo responder's `+OK` passes.
    async fn get(&self, slot: usize, key: Vec<u8>, local: bool) -> Result<(), RequestError> {
        if local {
            return Err(RequestError::Send("the state store has no local read over MQTT".into()));
        }
        let answer = self.call(slot, Get { key }.encode()).await?;
        match answer.payload.first() {
            Some(b'$') if !answer.payload.starts_with(b"$-1") => Ok(()),
            Some(b'+') => Ok(()),
            _ => Err(RequestError::Refused(String::from_utf8_lossy(&answer.payload).trim_end().to_string())),
        }
    }
}

impl Drop for MqttLoad {
    fn drop(&mut self) {
        for connection in &self.connections {
            let _ = connection.client.try_disconnect();
            connection.reader.abort();
        }
    }
}

/// MQTT options shared by the load generator and the echo responder: clean session,
/// TCP_NODELAY, the SDK's packet size limit.
pub fn mqtt_options(client_id: &str, broker_port: u16) -> MqttOptions {
    let mut options = MqttOptions::new(client_id, "127.0.0.1", broker_port);
    options
        .set_clean_start(true)
        .set_keep_alive(Duration::from_secs(30))
        .set_max_packet_size(Some(MAX_PACKET_SIZE))
        .set_outgoing_inflight_upper_limit(OUTGOING_INFLIGHT)
        .set_connection_timeout(CONNECT_TIMEOUT.as_secs());
    let mut network = NetworkOptions::new();
    network.set_tcp_nodelay(true);
    network.set_connection_timeout(CONNECT_TIMEOUT.as_secs());
    options.set_network_options(network);
    options
}

/// Connects and subscribes at QoS 1 to `filter`, returning once the broker has acknowledged the
/// subscription.
pub async fn connect_and_subscribe(
    client_id: &str,
    broker_port: u16,
    filter: &str,
) -> anyhow::Result<(AsyncClient, EventLoop)> {
    let (client, mut eventloop) = AsyncClient::new(mqtt_options(client_id, broker_port), 1024);
    let handshake = async {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                    if ack.code != ConnectReturnCode::Success {
                        bail!("the broker refused {client_id}: {:?}", ack.code);
                    }
                    client.subscribe_many(vec![Filter::new(filter, QoS::AtLeastOnce)]).await?;
                }
                Ok(Event::Incoming(Packet::SubAck(ack))) => {
                    if let Some(code) = ack.return_codes.iter().find(|c| !matches!(c, SubscribeReasonCode::Success(_)))
                    {
                        bail!("the broker refused the subscription of {client_id} to {filter}: {code:?}");
                    }
                    return Ok(());
                }
                Ok(_) => {}
                Err(e) => bail!("{client_id} cannot connect to the broker: {e}"),
            }
        }
    };
    tokio::time::timeout(CONNECT_TIMEOUT, handshake).await.map_err(|_| anyhow!("{client_id}: no SUBACK in time"))??;
    Ok((client, eventloop))
}

impl Connection {
    async fn open(broker_port: u16, client_id: String) -> anyhow::Result<Connection> {
        Connection::open_for(broker_port, client_id, None).await
    }

    /// A connection subscribed to its own response topic, or to `filter` when given (answers on
    /// any topic it matches are taken).
    async fn open_for(broker_port: u16, client_id: String, filter: Option<&str>) -> anyhow::Result<Connection> {
        let response_topic = response_topic(&client_id);
        let subscription = filter.map_or_else(|| response_topic.clone(), str::to_string);
        let (client, eventloop) = connect_and_subscribe(&client_id, broker_port, &subscription).await?;
        let waiting = Waiting::default();
        let reader = tokio::spawn(read_responses(eventloop, client.clone(), subscription, waiting.clone()));
        Ok(Connection { client, client_id, response_topic, waiting, reader })
    }
}

/// Hands each response to its waiting request; subscribes again after a reconnection (the
/// session is clean). `response_topic` is the subscription: a topic, or [`MANY_FILTER`].
async fn read_responses(mut eventloop: EventLoop, client: AsyncClient, response_topic: String, waiting: Waiting) {
    let many = response_topic == MANY_FILTER;
    loop {
        match eventloop.poll().await {
            Ok(Event::Incoming(Packet::Publish(publish))) => {
                let topic = publish.topic.as_ref();
                let taken = if many {
                    topic.starts_with(b"clients/") && topic.ends_with(b"/flood")
                } else {
                    topic == response_topic.as_bytes()
                };
                if !taken {
                    continue;
                }
                let properties = publish.properties.unwrap_or_default();
                let Some(correlation) = &properties.correlation_data else { continue };
                let Some(waiter) = waiting.lock().unwrap().remove(correlation) else { continue };
                let _ = waiter.send(Answer { payload: publish.payload, properties });
            }
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                // Never await the request channel here: this task is the one that drains it.
                let _ = client.try_subscribe(response_topic.clone(), QoS::AtLeastOnce);
            }
            Ok(Event::Outgoing(Outgoing::Disconnect)) | Err(ConnectionError::RequestsDone) => return,
            Ok(_) => {}
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_response_topic_is_the_rust_sdks() {
        assert_eq!(
            response_topic("cid"),
            "clients/cid/services/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke/response"
        );
    }

    #[test]
    fn the_clock_node_id_is_a_uuid_v4() {
        let id = uuid_v4();
        assert_eq!(id.len(), 36);
        assert_eq!(id.as_bytes()[14], b'4');
        assert_eq!(id.split('-').map(str::len).collect::<Vec<_>>(), vec![8, 4, 4, 4, 12]);
    }
}
