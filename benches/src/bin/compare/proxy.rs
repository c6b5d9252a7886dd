//! Network partitions between nodes, made inside the benchmark. For every ordered pair of nodes
//! (A, B) a TCP proxy forwards to B's HTTP port, and node A reaches B only through it
//! (`--peer-routes`). Cutting node X off makes every proxy of the pairs (X, *) and (*, X) drop its
//! connections and leave new ones hanging (accepted, never forwarded), so X and its peers see
//! timeouts as in a real partition, both ways, while X keeps its broker connection.

use std::collections::BTreeMap;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

struct Proxy {
    from: u64,
    to: u64,
    port: u16,
    /// True while the link is cut.
    cut: watch::Sender<bool>,
    acceptor: JoinHandle<()>,
}

/// The proxies of every ordered pair of nodes.
pub struct ProxyMesh {
    proxies: Vec<Proxy>,
}

impl ProxyMesh {
    /// Proxies for every ordered pair of the nodes `node_ports` (node id → HTTP port).
    pub async fn start(node_ports: &BTreeMap<u64, u16>) -> anyhow::Result<ProxyMesh> {
        let mut proxies = Vec::new();
        for &from in node_ports.keys() {
            for (&to, &target) in node_ports {
                if from == to {
                    continue;
                }
                let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
                let port = listener.local_addr()?.port();
                let (cut, _) = watch::channel(false);
                let acceptor = tokio::spawn(accept(listener, target, cut.subscribe()));
                proxies.push(Proxy { from, to, port, cut, acceptor });
            }
        }
        Ok(ProxyMesh { proxies })
    }

    /// Node `from`'s `--peer-routes`: every other node through the proxy of the pair.
    pub fn routes_of(&self, from: u64) -> String {
        self.proxies
            .iter()
            .filter(|p| p.from == from)
            .map(|p| format!("{}=http://127.0.0.1:{}", p.to, p.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Cuts (or, with `false`, heals) every link to and from `node`.
    pub fn set_cut(&self, node: u64, cut: bool) {
        for proxy in self.proxies.iter().filter(|p| p.from == node || p.to == node) {
            proxy.cut.send_replace(cut);
        }
    }
}

impl Drop for ProxyMesh {
    fn drop(&mut self) {
        for proxy in &self.proxies {
            proxy.acceptor.abort();
        }
    }
}

async fn accept(listener: TcpListener, target: u16, cut: watch::Receiver<bool>) {
    while let Ok((inbound, _)) = listener.accept().await {
        let _ = inbound.set_nodelay(true);
        tokio::spawn(carry(inbound, target, cut.clone()));
    }
}

/// Carries one connection until it closes or the link is cut. A connection that arrives while
/// the link is cut is held open, unanswered, until the link heals, then closed.
async fn carry(mut inbound: TcpStream, target: u16, mut cut: watch::Receiver<bool>) {
    if *cut.borrow_and_update() {
        let _ = cut.wait_for(|cut| !*cut).await;
        return;
    }
    let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", target)).await else { return };
    let _ = outbound.set_nodelay(true);
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
        _ = cut.wait_for(|cut| *cut) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn echo_server() -> u16 {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buffer = [0u8; 64];
                    while let Ok(n @ 1..) = socket.read(&mut buffer).await {
                        let _ = socket.write_all(&buffer[..n]).await;
                    }
                });
            }
        });
        port
    }

    async fn round_trip(port: u16) -> bool {
        let attempt = async {
            let mut socket = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
            socket.write_all(b"ping").await.ok()?;
            let mut reply = [0u8; 4];
            socket.read_exact(&mut reply).await.ok()?;
            Some(&reply == b"ping")
        };
        tokio::time::timeout(Duration::from_millis(300), attempt).await.ok().flatten().unwrap_or(false)
    }

    fn proxy_port(mesh: &ProxyMesh, from: u64, to: u64) -> u16 {
        mesh.proxies.iter().find(|p| p.from == from && p.to == to).unwrap().port
    }

    #[tokio::test]
    async fn a_cut_node_is_unreachable_both_ways_until_healed() {
        let ports: BTreeMap<u64, u16> =
            [(1, echo_server().await), (2, echo_server().await), (3, echo_server().await)].into();
        let mesh = ProxyMesh::start(&ports).await.unwrap();
        assert_eq!(mesh.proxies.len(), 6);
        assert_eq!(mesh.routes_of(1).split(',').count(), 2);
        assert!(round_trip(proxy_port(&mesh, 1, 2)).await);

        mesh.set_cut(2, true);
        assert!(!round_trip(proxy_port(&mesh, 1, 2)).await, "1 → 2 is cut");
        assert!(!round_trip(proxy_port(&mesh, 2, 3)).await, "2 → 3 is cut");
        assert!(round_trip(proxy_port(&mesh, 1, 3)).await, "1 → 3 is not involved");

        mesh.set_cut(2, false);
        assert!(round_trip(proxy_port(&mesh, 1, 2)).await);
        assert!(round_trip(proxy_port(&mesh, 3, 2)).await);
    }
}
