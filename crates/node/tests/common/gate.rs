//! A TCP proxy that a test can cut, heal and slow down: while cut, its connections are closed
//! and new ones are closed as soon as they are accepted, as when a link goes down; while slow,
//! every byte is held for a delay before it is forwarded, in order, as over a congested link.
//! It forwards every byte unchanged otherwise.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

pub struct Gate {
    pub port: u16,
    cut: watch::Sender<bool>,
    /// How long each byte waits before it is forwarded (zero: not at all).
    delay: watch::Sender<Duration>,
}

impl Gate {
    /// Listens on a free loopback port and forwards every connection to `target_port`.
    pub async fn start(target_port: u16) -> Gate {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cut, _) = watch::channel(false);
        let (delay, _) = watch::channel(Duration::ZERO);
        let state = cut.clone();
        let delays = delay.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if *state.borrow() {
                    continue;
                }
                let mut cut = state.subscribe();
                let delays = delays.clone();
                tokio::spawn(async move {
                    let Ok(target) = TcpStream::connect(("127.0.0.1", target_port)).await else { return };
                    let _ = (client.set_nodelay(true), target.set_nodelay(true));
                    let (client_read, client_write) = client.into_split();
                    let (target_read, target_write) = target.into_split();
                    let both_ways = async {
                        tokio::join!(
                            forward(client_read, target_write, delays.subscribe()),
                            forward(target_read, client_write, delays.subscribe())
                        )
                    };
                    tokio::select! {
                        _ = both_ways => {}
                        _ = cut.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Gate { port, cut, delay }
    }

    /// Closes every connection through the gate and refuses new ones until [`Gate::heal`].
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    pub fn heal(&self) {
        self.cut.send_replace(false);
    }

    /// Holds every byte that passes from now on for `delay` before forwarding it (zero: forwards
    /// at once again, after what is already held).
    pub fn slow(&self, delay: Duration) {
        self.delay.send_replace(delay);
    }
}

/// Copies `from` to `to` until either ends, each chunk after the delay that held when it was
/// read. Chunks keep their order: one read later under a shorter delay waits for those before.
async fn forward(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay: watch::Receiver<Duration>) {
    let (held, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader = async move {
        let mut buffer = vec![0; 64 * 1024];
        loop {
            match from.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(read) => {
                    let at = Instant::now() + *delay.borrow();
                    if held.send((at, buffer[..read].to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
    };
    let writer = async move {
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    // The writer ends once the reader has ended and everything it held is written.
    tokio::join!(reader, writer);
}

/// A gate on every Raft link of a cluster: node `a` reaches node `b` through `links[(a, b)]`.
pub struct PeerLinks {
    links: std::collections::BTreeMap<(u64, u64), Gate>,
}

impl PeerLinks {
    /// Starts a gate for every ordered pair of the nodes listening on `ports` (id → HTTP port).
    pub async fn start(ports: &std::collections::BTreeMap<u64, u16>) -> PeerLinks {
        let mut links = std::collections::BTreeMap::new();
        for &from in ports.keys() {
            for (&to, &port) in ports {
                if from != to {
                    links.insert((from, to), Gate::start(port).await);
                }
            }
        }
        PeerLinks { links }
    }

    /// Node `id`'s `--peer-routes`: every peer through its gate.
    pub fn routes(&self, id: u64) -> String {
        let routes: Vec<String> = self
            .links
            .iter()
            .filter(|((from, _), _)| *from == id)
            .map(|((_, to), gate)| format!("{to}=http://127.0.0.1:{}", gate.port))
            .collect();
        routes.join(",")
    }

    /// Cuts (or heals) every link from and to `node`.
    pub fn cut_off(&self, node: u64, cut: bool) {
        for ((from, to), gate) in &self.links {
            if *from == node || *to == node {
                if cut {
                    gate.cut();
                } else {
                    gate.heal();
                }
            }
        }
    }

    /// Holds every byte on every link from and to `node` for `delay` (zero: no longer).
    pub fn slow_down(&self, node: u64, delay: Duration) {
        for ((from, to), gate) in &self.links {
            if *from == node || *to == node {
                gate.slow(delay);
            }
        }
    }
}
