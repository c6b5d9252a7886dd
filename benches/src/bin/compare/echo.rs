//! The `echo` target: the broker's ceiling. Three subscribers on the request topic, like the
//! three nodes (plain subscriptions, QoS 1); one answers every request at once with `+OK`, the
//! way a node answers a SET, and the other two only receive. No Raft, no disk: what is left is
//! the MQTT path the cluster cannot avoid.
//!
//! The responders run in a child process (this binary again, with the hidden `echo-responder`
//! subcommand) so that their CPU is measured apart from the load generator's.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::bail;
use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, EventLoop};
use statestore_protocol::topic::REQUEST_TOPIC;
use statestore_protocol::Hlc;
use tokio::sync::mpsc;

use crate::mqtt_load::{connect_and_subscribe, now_ms};
use crate::processes::Process;

/// Subscribers on the request topic, as many as the cluster has nodes.
const SUBSCRIBERS: usize = 3;

/// The echo responder child process.
pub struct EchoResponder {
    pub process: Process,
}

impl EchoResponder {
    /// Starts the responders and waits until all of them have subscribed.
    pub async fn start(broker_port: u16, dir: &Path, logs: &Path) -> anyhow::Result<EchoResponder> {
        let ready_file = dir.join("echo-ready");
        let mut command = Command::new(std::env::current_exe()?);
        command
            .arg("echo-responder")
            .arg("--broker-port")
            .arg(broker_port.to_string())
            .arg("--ready-file")
            .arg(&ready_file);
        let mut process = Process::spawn("echo", command, &logs.join("echo.log"))?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while !ready_file.exists() {
            process.check_running()?;
            if Instant::now() > deadline {
                bail!("the echo responders did not subscribe within 20 s; see {}", logs.join("echo.log").display());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(EchoResponder { process })
    }
}

/// The body of the `echo-responder` subcommand: runs until killed.
pub async fn run_responders(broker_port: u16, ready_file: PathBuf) -> anyhow::Result<()> {
    let mut readers = Vec::new();
    for n in 0..SUBSCRIBERS {
        let client_id = format!("echo-{}-{n}", std::process::id());
        let (client, eventloop) = connect_and_subscribe(&client_id, broker_port, REQUEST_TOPIC).await?;
        let answers = (n == 0).then(|| spawn_answerer(client.clone()));
        readers.push(tokio::spawn(receive(eventloop, client, answers)));
    }
    std::fs::write(&ready_file, b"ready\n")?;
    for reader in readers {
        reader.await?;
    }
    Ok(())
}

/// A response to send: response topic and correlation data of the request, and its `__ts`.
struct Reply {
    topic: String,
    correlation: bytes::Bytes,
    request_ts: Option<Hlc>,
}

/// Publishes the replies from a task of its own: the task that reads packets must never wait
/// on the client's request channel, which it alone drains.
fn spawn_answerer(client: AsyncClient) -> mpsc::UnboundedSender<Reply> {
    let (replies, mut queue) = mpsc::unbounded_channel::<Reply>();
    tokio::spawn(async move {
        // A server clock, as the nodes keep: each version follows the last and the request's.
        let mut version = Hlc::new(now_ms(), 0, "statestore");
        while let Some(reply) = queue.recv().await {
            version = version.successor(reply.request_ts.as_ref(), now_ms());
            let properties = PublishProperties {
                correlation_data: Some(reply.correlation),
                content_type: Some("application/octet-stream".into()),
                user_properties: vec![
                    ("__stat".into(), "200".into()),
                    ("__protVer".into(), "1.0".into()),
                    ("__ts".into(), version.to_string()),
                ],
                ..Default::default()
            };
            let _ =
                client.publish_with_properties(reply.topic, QoS::AtLeastOnce, false, &b"+OK\r\n"[..], properties).await;
        }
    });
    replies
}

async fn receive(mut eventloop: EventLoop, client: AsyncClient, answers: Option<mpsc::UnboundedSender<Reply>>) {
    loop {
        match eventloop.poll().await {
            Ok(Event::Incoming(Packet::Publish(publish))) => {
                let Some(answers) = &answers else { continue };
                let Some(properties) = publish.properties else { continue };
                let (Some(topic), Some(correlation)) = (properties.response_topic, properties.correlation_data) else {
                    continue;
                };
                let request_ts = properties
                    .user_properties
                    .iter()
                    .find(|(name, _)| name == "__ts")
                    .and_then(|(_, ts)| ts.parse().ok());
                let _ = answers.send(Reply { topic, correlation, request_ts });
            }
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                let _ = client.try_subscribe(REQUEST_TOPIC, QoS::AtLeastOnce);
            }
            Ok(_) => {}
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}
