//! A TCP proxy to the broker that can hold back the SUBACKs it carries to its clients, as a
//! broker slow to answer a SUBSCRIBE would: the CONNACK and everything before the first SUBACK
//! pass; from that SUBACK on, what the broker sends waits (in order) until [`SubackHold::release`].
//! What the client sends always passes.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// MQTT's packet type of a SUBACK, in the high nibble of the fixed header's first byte.
const SUBACK: u8 = 9;

pub struct SubackHold {
    pub port: u16,
    held: watch::Sender<bool>,
}

impl SubackHold {
    /// Listens on a free loopback port, forwards every connection to `broker_port`, and holds
    /// SUBACKs back from the start.
    pub async fn start(broker_port: u16) -> SubackHold {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (held, _) = watch::channel(true);
        let state = held.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let held = state.subscribe();
                tokio::spawn(async move {
                    let Ok(broker) = TcpStream::connect(("127.0.0.1", broker_port)).await else { return };
                    let _ = (client.set_nodelay(true), broker.set_nodelay(true));
                    let (mut from_client, to_client) = client.into_split();
                    let (from_broker, mut to_broker) = broker.into_split();
                    tokio::select! {
                        _ = tokio::io::copy(&mut from_client, &mut to_broker) => {}
                        _ = forward_holding_subacks(from_broker, to_client, held) => {}
                    }
                });
            }
        });
        SubackHold { port, held }
    }

    /// Lets everything held go on, and holds nothing from now on.
    pub fn release(&self) {
        self.held.send_replace(false);
    }
}

/// Copies MQTT packets from the broker to the client; while `held`, stops at the first SUBACK
/// and keeps it and what follows until released.
async fn forward_holding_subacks(
    mut from_broker: tokio::net::tcp::OwnedReadHalf,
    mut to_client: tokio::net::tcp::OwnedWriteHalf,
    mut held: watch::Receiver<bool>,
) {
    let mut pending: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        tokio::select! {
            read = from_broker.read(&mut chunk) => {
                let n = match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                pending.extend_from_slice(&chunk[..n]);
            }
            // Fires once, at the release (or when the hold is dropped with its test).
            changed = held.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
        // While held, whole packets up to the first SUBACK; once released, everything.
        let passed = if *held.borrow() {
            let mut passed = 0;
            while let Some(length) = packet_length(&pending[passed..]) {
                if pending[passed] >> 4 == SUBACK {
                    break;
                }
                passed += length;
            }
            passed
        } else {
            pending.len()
        };
        if passed > 0 {
            if to_client.write_all(&pending[..passed]).await.is_err() {
                return;
            }
            pending.drain(..passed);
        }
    }
}

/// The length of the whole MQTT packet at the start of `bytes`, once all of it is there.
fn packet_length(bytes: &[u8]) -> Option<usize> {
    let mut remaining = 0usize;
    for (i, byte) in bytes.iter().skip(1).take(4).enumerate() {
        remaining |= usize::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            let total = 1 + (i + 1) + remaining;
            return (bytes.len() >= total).then_some(total);
        }
    }
    None
}
