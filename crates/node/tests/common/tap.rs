//! A TCP proxy in front of the broker that records the MQTT packets passing through it: what
//! the clients behind it send to the broker and what the broker sends them, in order per
//! direction. It forwards every byte unchanged.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

/// One MQTT packet seen on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    Publish {
        pkid: u16,
        correlation: Option<Vec<u8>>,
    },
    PubAck {
        pkid: u16,
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
}

impl Tap {
    /// Listens on a free loopback port and forwards every connection to `broker_port`.
    pub async fn start(broker_port: u16) -> Tap {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (to_broker, from_broker) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
        let (up, down) = (to_broker.clone(), from_broker.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(broker) = TcpStream::connect(("127.0.0.1", broker_port)).await else { continue };
                let _ = (client.set_nodelay(true), broker.set_nodelay(true));
                let (client_read, client_write) = client.into_split();
                let (broker_read, broker_write) = broker.into_split();
                tokio::spawn(pump(client_read, broker_write, up.clone()));
                tokio::spawn(pump(broker_read, client_write, down.clone()));
            }
        });
        Tap { port, to_broker, from_broker }
    }
}

async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, seen: Arc<Mutex<Vec<Seen>>>) {
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
        kind => Seen::Other(kind),
    };
    Some((seen, end))
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
    Seen::Publish { pkid, correlation }
}
