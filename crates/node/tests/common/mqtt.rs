//! A raw MQTT5 client (rumqttc) for tests that send what no SDK would: it publishes any payload
//! with any properties and collects whatever arrives on its response and notification topics.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use statestore_protocol::topic::{hex_upper, NOTIFICATION_PREFIX, REQUEST_TOPIC};
use tokio::sync::Notify;

/// A received publish, reduced to what tests look at.
#[derive(Debug, Clone)]
pub struct Received {
    pub topic: String,
    pub payload: Vec<u8>,
    pub qos: QoS,
    pub properties: PublishProperties,
}

impl Received {
    pub fn user(&self, name: &str) -> Option<&str> {
        self.properties.user_properties.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

pub struct RawClient {
    pub client: AsyncClient,
    pub client_id: String,
    pub response_topic: String,
    inbox: Arc<(Mutex<VecDeque<Received>>, Notify)>,
    next_correlation: Mutex<u64>,
}

impl RawClient {
    /// Connects, subscribes to its response topic and its notification topics, and waits for
    /// both subscriptions.
    pub async fn connect(port: u16, client_id: &str) -> RawClient {
        RawClient::connect_with_nagle(port, client_id, true).await
    }

    /// As [`RawClient::connect`], with Nagle's algorithm on the client's socket on or off. With
    /// it on (rumqttc's default), a call sent right after the previous answer's PUBACK waits for
    /// the broker's delayed ACK, about 40 ms; off, calls follow each other as fast as the store
    /// answers.
    pub async fn connect_with_nagle(port: u16, client_id: &str, nagle: bool) -> RawClient {
        let mut options = MqttOptions::new(client_id, "127.0.0.1", port);
        options.set_max_packet_size(Some(32 << 20)).set_keep_alive(Duration::from_secs(30));
        let mut network = rumqttc::NetworkOptions::new();
        network.set_tcp_nodelay(!nagle);
        options.set_network_options(network);
        let (client, mut eventloop) = AsyncClient::new(options, 1000);
        let inbox: Arc<(Mutex<VecDeque<Received>>, Notify)> = Arc::default();
        let subscribed = Arc::new(Notify::new());
        let (task_inbox, task_subscribed) = (inbox.clone(), subscribed.clone());
        tokio::spawn(async move {
            let mut subacks = 0;
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let received = Received {
                            topic: String::from_utf8_lossy(&p.topic).into_owned(),
                            payload: p.payload.to_vec(),
                            qos: p.qos,
                            properties: p.properties.clone().unwrap_or_default(),
                        };
                        task_inbox.0.lock().unwrap().push_back(received);
                        task_inbox.1.notify_waiters();
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        subacks += 1;
                        if subacks == 2 {
                            task_subscribed.notify_one();
                        }
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        });
        let response_topic = format!("clients/{client_id}/raw/response");
        client.subscribe(&response_topic, QoS::AtLeastOnce).await.unwrap();
        let notifications = format!("{NOTIFICATION_PREFIX}/{}/command/notify/+", hex_upper(client_id.as_bytes()));
        client.subscribe(notifications, QoS::AtLeastOnce).await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), subscribed.notified()).await.expect("no SUBACK");
        RawClient { client, client_id: client_id.to_string(), response_topic, inbox, next_correlation: Mutex::new(1) }
    }

    /// Properties as the SDKs send them, with a fresh 16-byte correlation id.
    pub fn properties(&self, timestamp: &str) -> PublishProperties {
        let correlation = {
            let mut next = self.next_correlation.lock().unwrap();
            *next += 1;
            let mut bytes = [0u8; 16];
            bytes[..8].copy_from_slice(&next.to_be_bytes());
            bytes[8..].copy_from_slice(&(std::process::id() as u64).to_be_bytes());
            Bytes::copy_from_slice(&bytes)
        };
        PublishProperties {
            response_topic: Some(self.response_topic.clone()),
            correlation_data: Some(correlation),
            message_expiry_interval: Some(10),
            content_type: Some("application/octet-stream".into()),
            user_properties: vec![
                ("__srcId".into(), self.client_id.clone()),
                ("__ts".into(), timestamp.to_string()),
                ("__protVer".into(), "1.0".into()),
            ],
            ..Default::default()
        }
    }

    /// Publishes a request as given.
    pub async fn publish(&self, payload: &[u8], qos: QoS, properties: PublishProperties) {
        self.client.publish_with_properties(REQUEST_TOPIC, qos, false, payload.to_vec(), properties).await.unwrap();
    }

    /// Publishes at QoS 1 and waits up to `wait` for the response with the same correlation data.
    pub async fn request_with(
        &self,
        payload: &[u8],
        properties: PublishProperties,
        wait: Duration,
    ) -> Option<Received> {
        let correlation = properties.correlation_data.clone();
        self.publish(payload, QoS::AtLeastOnce, properties).await;
        let correlation = correlation?;
        self.wait_for(wait, |r| {
            r.topic == self.response_topic && r.properties.correlation_data.as_ref() == Some(&correlation)
        })
        .await
    }

    /// A request with SDK-like properties, answered within 10 s.
    pub async fn request(&self, payload: &[u8], timestamp: &str) -> Received {
        let properties = self.properties(timestamp);
        self.request_with(payload, properties, Duration::from_secs(10)).await.expect("no response within 10 s")
    }

    /// Takes the first received publish that `matches`, waiting up to `wait`.
    pub async fn wait_for(&self, wait: Duration, matches: impl Fn(&Received) -> bool) -> Option<Received> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.inbox.1.notified();
            {
                let mut inbox = self.inbox.0.lock().unwrap();
                if let Some(at) = inbox.iter().position(&matches) {
                    return inbox.remove(at);
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return None;
            }
        }
    }

    /// Every notification received so far, removed from the inbox, in arrival order.
    pub fn take_notifications(&self) -> Vec<Received> {
        let mut inbox = self.inbox.0.lock().unwrap();
        let (notifications, rest): (Vec<Received>, Vec<Received>) =
            inbox.drain(..).partition(|r| r.topic.starts_with(NOTIFICATION_PREFIX));
        inbox.extend(rest);
        notifications
    }
}
