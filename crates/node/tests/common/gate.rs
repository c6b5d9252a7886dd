//! A TCP proxy that a test can cut and heal: while cut, its connections are closed and new ones
//! are closed as soon as they are accepted, as when a link goes down. It forwards every byte
//! unchanged otherwise.

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Gate {
    pub port: u16,
    cut: watch::Sender<bool>,
}

impl Gate {
    /// Listens on a free loopback port and forwards every connection to `target_port`.
    pub async fn start(target_port: u16) -> Gate {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cut, _) = watch::channel(false);
        let state = cut.clone();
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if *state.borrow() {
                    continue;
                }
                let mut cut = state.subscribe();
                tokio::spawn(async move {
                    let Ok(mut target) = TcpStream::connect(("127.0.0.1", target_port)).await else { return };
                    let _ = (client.set_nodelay(true), target.set_nodelay(true));
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut target) => {}
                        _ = cut.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Gate { port, cut }
    }

    /// Closes every connection through the gate and refuses new ones until [`Gate::heal`].
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    pub fn heal(&self) {
        self.cut.send_replace(false);
    }
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
}
