//! HTTPS for the node's port: a rustls server that asks every client for a certificate signed
//! by the cluster CA, and a middleware that lets only such clients (peers, operators' tools)
//! reach Raft RPC, membership changes and `/v1/command`. Clients without a certificate still
//! reach `GET /cluster`, `/health`, `/ready` and `/metrics` (probes and Prometheus).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::extract::connect_info::ConnectInfo;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::serve::Listener;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use statestore_api::tls::{read_certs, read_private_key};

use super::ApiError;
use crate::config::NodeTls;

/// How long a client may take over its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections whose handshake is done and that the server has not taken yet.
const ACCEPTED_BACKLOG: usize = 64;

/// The server side of the node's TLS: its certificate, and client certificates verified against
/// the CA when given (optional at this layer; [`require_client_certificate`] asks for them).
pub fn server_config(tls: &NodeTls) -> anyhow::Result<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in read_certs(&tls.ca)? {
        roots.add(cert).with_context(|| format!("{}: a CA certificate rustls cannot use", tls.ca.display()))?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .context("building the client certificate verifier")?;
    let key = read_private_key(&tls.key)?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("choosing TLS versions")?
        .with_client_cert_verifier(verifier)
        .with_single_cert(read_certs(&tls.cert)?, key)
        .with_context(|| format!("{} and {} do not make a server identity", tls.cert.display(), tls.key.display()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A listener whose connections have completed a TLS handshake. Handshakes run on their own
/// tasks, each bounded by [`HANDSHAKE_TIMEOUT`], so a slow or silent client delays nobody; at
/// most `max_handshakes` at once (`--tls-max-handshakes`): further connections wait in the
/// listen backlog until one ends.
pub struct TlsListener {
    accepted: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    pub fn new(
        listener: TcpListener,
        config: rustls::ServerConfig,
        max_handshakes: usize,
    ) -> std::io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let handshakes = Arc::new(tokio::sync::Semaphore::new(max_handshakes));
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let (done, accepted) = mpsc::channel(ACCEPTED_BACKLOG);
        tokio::spawn(async move {
            loop {
                let Ok(handshake) = handshakes.clone().acquire_owned().await else {
                    return;
                };
                let (stream, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors and the like: wait instead of spinning.
                        tracing::warn!(error = %e, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let (acceptor, handed) = (acceptor.clone(), done.clone());
                tokio::spawn(async move {
                    let accepted = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await;
                    drop(handshake);
                    match accepted {
                        Ok(Ok(tls)) => {
                            let _ = handed.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::info!(%peer, error = %e, "a TLS handshake failed"),
                        Err(_) => tracing::info!(%peer, "a TLS handshake did not finish in time"),
                    }
                });
                if done.is_closed() {
                    return;
                }
            }
        });
        Ok(TlsListener { accepted, local })
    }
}

impl Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(accepted) => accepted,
            // The accepting task only ends once this listener is gone.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// The certificate the client of a connection presented, which rustls has verified against the
/// cluster's CA (`None`: it presented none).
#[derive(Debug, Clone, Default)]
pub struct ClientCertificate(pub Option<Arc<CertificateDer<'static>>>);

impl ClientCertificate {
    /// The end-entity certificate of a TLS connection's client, if it presented one.
    pub fn of(connection: &rustls::ServerConnection) -> ClientCertificate {
        ClientCertificate(
            connection
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(|leaf| Arc::new(leaf.clone().into_owned())),
        )
    }

    pub fn presented(&self) -> bool {
        self.0.is_some()
    }

    /// Whether the certificate names `host` (a DNS name or an IP address) among its subject
    /// alternative names, as a server certificate for that host would have to.
    pub fn names(&self, host: &str) -> bool {
        let Some(der) = &self.0 else { return false };
        let (Ok(certificate), Ok(name)) = (webpki::EndEntityCert::try_from(der.as_ref()), ServerName::try_from(host))
        else {
            return false;
        };
        certificate.verify_is_valid_for_subject_name(&name).is_ok()
    }
}

/// Lets a request through only from a client with a certificate the cluster CA signs. On a
/// plain-HTTP server (no connection info) it is not installed.
pub async fn require_client_certificate(request: Request, next: Next) -> Response {
    let verified = request.extensions().get::<ConnectInfo<ClientCertificate>>().is_some_and(|info| info.0.presented());
    if !verified {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            "client_certificate_required",
            "this route needs a client certificate signed by the cluster's CA (--tls-ca)",
        )
        .into_response();
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rcgen::{CertificateParams, KeyPair};
    use rustls::pki_types::CertificateDer;

    use super::ClientCertificate;

    fn certificate_for(names: &[&str]) -> ClientCertificate {
        let params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
        let der = params.self_signed(&KeyPair::generate().unwrap()).unwrap().der().to_vec();
        ClientCertificate(Some(Arc::new(CertificateDer::from(der))))
    }

    #[test]
    fn a_certificate_names_only_the_hosts_among_its_subject_alternative_names() {
        let member = certificate_for(&["node-2", "10.0.0.2", "::1"]);
        assert!(member.names("node-2"));
        assert!(member.names("10.0.0.2"));
        assert!(member.names("::1"));
        assert!(!member.names("node-1"));
        assert!(!member.names("10.0.0.1"));
        assert!(!member.names("node-2.example"));
        let operator = certificate_for(&["operator"]);
        assert!(!operator.names("127.0.0.1"));
        assert!(!ClientCertificate(None).names("node-2"));
    }
}
