//! A TCP proxy in front of the broker that records the MQTT packets passing through it: what
//! the clients behind it send to the broker and what the broker sends them, in order per
//! direction, and what the broker sent to each client id. It forwards every byte unchanged.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

/// One MQTT packet seen on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    Publish {
        qos: u8,
        pkid: u16,
        correlation: Option<Vec<u8>>,
    },
    PubAck {
        pkid: u16,
    },
    /// A SUBSCRIBE to one filter, at this maximum QoS.
    Subscribe {
        qos: u8,
    },
    /// Any other packet, by its type.
    Other(u8),
}

pub struct Tap {
    pub port: u16,
    /// Packets sent to the broker, in order.
    pub to_broker: Arc<Mutex<Vec<Seen>>>,
    /// Packets the broker sent, in order.
    pub from_broker: Arc<Mutex<Vec<Seen>>>,
    /// Packets the broker sent, in order, by the client id of the connection's CONNECT.
    pub to_client: Arc<Mutex<HashMap<String, Vec<Seen>>>>,
    /// Packets sent to the broker, in order, by client id.
    pub from_client: Arc<Mutex<HashMap<String, Vec<Seen>>>>,
}

type ByClient = Arc<Mutex<HashMap<String, Vec<Seen>>>>;

/// One direction of a proxied connection: records every packet in a list of the tap and, by the
/// client id the CONNECT gave, in one of its maps.
struct Side {
    client_id: Arc<Mutex<Option<String>>>,
    by_client: ByClient,
}

impl Tap {
    /// Listens on a free loopback port and forwards every connection to `broker_port`.
    pub async fn start(broker_port: u16) -> Tap {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (to_broker, from_broker) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
        let (to_client, from_client): (ByClient, ByClient) = Default::default();
        let (up, down) = (to_broker.clone(), from_broker.clone());
        let (to_client_by_id, from_client_by_id) = (to_client.clone(), from_client.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(broker) = TcpStream::connect(("127.0.0.1", broker_port)).await else { continue };
                let _ = (client.set_nodelay(true), broker.set_nodelay(true));
                let (client_read, client_write) = client.into_split();
                let (broker_read, broker_write) = broker.into_split();
                let client_id = Arc::new(Mutex::new(None));
                let side = Side { client_id: client_id.clone(), by_client: from_client_by_id.clone() };
                tokio::spawn(pump(client_read, broker_write, up.clone(), side));
                let side = Side { client_id, by_client: to_client_by_id.clone() };
                tokio::spawn(pump(broker_read, client_write, down.clone(), side));
            }
        });
        Tap { port, to_broker, from_broker, to_client, from_client }
    }
}

async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, seen: Arc<Mutex<Vec<Seen>>>, side: Side) {
    let mut pending = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if to.write_all(&chunk[..n]).await.is_err() {
            return;
        }
        pending.extend_from_slice(&chunk[..n]);
        while let Some((packet, used)) = parse(&pending) {
            if pending[0] >> 4 == 1 {
                *side.client_id.lock().unwrap() = Some(connect_client_id(&pending[..used]));
            }
            // Every packet but the CONNECT follows it, so the id is known.
            let id = side.client_id.lock().unwrap().clone().unwrap_or_default();
            side.by_client.lock().unwrap().entry(id).or_default().push(packet.clone());
            seen.lock().unwrap().push(packet);
            pending.drain(..used);
        }
    }
}

/// The first whole packet in `buf` and its length.
fn parse(buf: &[u8]) -> Option<(Seen, usize)> {
    let first = *buf.first()?;
    let (length, length_bytes) = varint(&buf[1..])?;
    let end = 1 + length_bytes + length;
    let body = buf.get(1 + length_bytes..end)?;
    let seen = match first >> 4 {
        3 => publish(first, body),
        4 => Seen::PubAck { pkid: u16::from_be_bytes([body[0], body[1]]) },
        8 => subscribe(body),
        kind => Seen::Other(kind),
    };
    Some((seen, end))
}

/// A SUBSCRIBE's first filter's maximum QoS.
fn subscribe(body: &[u8]) -> Seen {
    let (properties, n) = varint(&body[2..]).expect("SUBSCRIBE property length");
    let at = 2 + n + properties;
    let filter = usize::from(u16::from_be_bytes([body[at], body[at + 1]]));
    Seen::Subscribe { qos: body[at + 2 + filter] & 3 }
}

/// The client id of a whole MQTT5 CONNECT packet.
fn connect_client_id(packet: &[u8]) -> String {
    let (_, length_bytes) = varint(&packet[1..]).expect("CONNECT length");
    let body = &packet[1 + length_bytes..];
    let u16_at = |at: usize| usize::from(u16::from_be_bytes([body[at], body[at + 1]]));
    // Protocol name, level, flags, keep-alive, then the properties.
    let mut at = 2 + u16_at(0) + 1 + 1 + 2;
    let (properties, n) = varint(&body[at..]).expect("CONNECT property length");
    at += n + properties;
    String::from_utf8_lossy(&body[at + 2..at + 2 + u16_at(at)]).into_owned()
}

fn varint(bytes: &[u8]) -> Option<(usize, usize)> {
    let mut value = 0;
    for (i, byte) in bytes.iter().take(4).enumerate() {
        value |= usize::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

fn publish(first: u8, body: &[u8]) -> Seen {
    let u16_at = |at: usize| usize::from(u16::from_be_bytes([body[at], body[at + 1]]));
    let qos = (first >> 1) & 3;
    let mut at = 2 + u16_at(0);
    let mut pkid = 0;
    if qos > 0 {
        pkid = u16_at(at) as u16;
        at += 2;
    }
    let (properties, n) = varint(&body[at..]).expect("PUBLISH property length");
    at += n;
    let end = at + properties;
    let mut correlation = None;
    while at < end {
        let id = body[at];
        at += 1;
        match id {
            0x01 => at += 1,
            0x02 => at += 4,
            0x23 => at += 2,
            0x0b => at += varint(&body[at..]).expect("subscription id").1,
            0x03 | 0x08 => at += 2 + u16_at(at),
            0x09 => {
                let len = u16_at(at);
                correlation = Some(body[at + 2..at + 2 + len].to_vec());
                at += 2 + len;
            }
            0x26 => {
                at += 2 + u16_at(at);
                at += 2 + u16_at(at);
            }
            other => panic!("a PUBLISH property the tap does not know: {other:#x}"),
        }
    }
    Seen::Publish { qos, pkid, correlation }
}
