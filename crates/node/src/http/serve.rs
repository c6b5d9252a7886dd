//! Serving the node's port with limits, so that no client can starve Raft of it:
//!
//! - at most `max_connections` connections at once (`--http-max-connections`); one more is
//!   answered 503 at once with a message naming the flag, and closed;
//! - a request's headers must arrive within `header_timeout` of the connection's start or of the
//!   previous answer (`--http-header-timeout-ms`, hyper's header read timeout, which needs the
//!   timer `axum::serve` does not give it): a connection that stays idle or trickles its headers
//!   is closed then;
//! - a request's body must arrive whole within `body_timeout` of its headers
//!   (`--http-body-timeout-ms`); a late one fails the request, whose error names the flag.
//!
//! TLS handshakes are bounded apart ([`super::tls::TlsListener`]). An appends stream, once
//! upgraded, is the Raft layer's own connection (guarded by the cluster secret) and leaves the
//! count.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{ConnectInfo, Request};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::serve::Listener;
use axum::{Extension, Router};
use hyper::body::{Frame, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{watch, Semaphore};

use super::tls::ClientCertificate;

/// The connection limits of the node's port (docs/operations.md, *Security*).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    /// TLS handshakes under way at once; further connections wait to be accepted.
    pub max_handshakes: usize,
}

impl HttpLimits {
    pub const DEFAULT: HttpLimits = HttpLimits {
        max_connections: 1024,
        header_timeout: Duration::from_secs(10),
        body_timeout: Duration::from_secs(60),
        max_handshakes: 64,
    };
}

/// A served connection: whether its client presented a certificate the cluster's CA signs
/// (`None` on plain HTTP, where the guarded routes do not ask for one).
pub trait Connection: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    fn client_certificate(&self) -> Option<ClientCertificate>;
}

impl Connection for tokio::net::TcpStream {
    fn client_certificate(&self) -> Option<ClientCertificate> {
        None
    }
}

impl Connection for tokio_rustls::server::TlsStream<tokio::net::TcpStream> {
    fn client_certificate(&self) -> Option<ClientCertificate> {
        Some(ClientCertificate::of(self.get_ref().1))
    }
}

/// Serves `router` on `listener` within `limits` until `stopped`; then lets the requests in
/// flight finish (each connection closes after its current answer) and returns once every
/// connection has closed.
pub async fn serve<L>(
    mut listener: L,
    router: Router,
    limits: HttpLimits,
    stopped: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    L: Listener,
    L::Io: Connection,
{
    let body_timeout = limits.body_timeout;
    let router = router
        .layer(middleware::from_fn(move |request: Request, next: Next| body_deadline(body_timeout, request, next)));
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let (stop, stopping) = watch::channel(false);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
    let mut refusals = Refusals::default();
    tokio::pin!(stopped);
    loop {
        let (io, _peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stopped => break,
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            refusals.refuse(io, limits.max_connections);
            continue;
        };
        let mut router = router.clone();
        if let Some(certificate) = io.client_certificate() {
            router = router.layer(Extension(ConnectInfo(certificate)));
        }
        let connection = http.serve_connection(TokioIo::new(io), TowerToHyperService::new(router)).with_upgrades();
        let mut stopping = stopping.clone();
        tokio::spawn(async move {
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                () = async { drop(stopping.wait_for(|stop| *stop).await) } => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
            drop(permit);
        });
    }
    let _ = stop.send(true);
    // Every permit back: every connection has closed.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = connections.acquire_many(all).await;
    Ok(())
}

/// Connections refused for want of a free slot, and when that was last logged.
#[derive(Default)]
struct Refusals {
    count: u64,
    logged: Option<tokio::time::Instant>,
}

impl Refusals {
    /// Answers `io` 503 and closes it (on a task of its own, bounded by a second), and logs the
    /// refusals at most every ten seconds.
    fn refuse(&mut self, io: impl Connection, max_connections: usize) {
        self.count += 1;
        if self.logged.is_none_or(|at| at.elapsed() >= Duration::from_secs(10)) {
            tracing::warn!(
                refused = self.count,
                "refusing connections: this node serves at most {max_connections} at once (--http-max-connections)"
            );
            self.logged = Some(tokio::time::Instant::now());
        }
        let body = format!(
            "{{\"code\":\"too_many_connections\",\"message\":\"this node serves at most {max_connections} \
             connections at once (--http-max-connections)\"}}"
        );
        let answer = format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n{body}",
            body.len()
        );
        tokio::spawn(async move {
            let mut io = io;
            let _ = tokio::time::timeout(Duration::from_secs(1), async {
                io.write_all(answer.as_bytes()).await?;
                io.shutdown().await
            })
            .await;
        });
    }
}

/// Gives the request's body `timeout` from now to arrive whole.
async fn body_deadline(timeout: Duration, request: Request, next: Next) -> Response {
    let deadline = Box::pin(tokio::time::sleep(timeout));
    next.run(request.map(|inner| Body::new(TimedBody { inner, deadline, timeout }))).await
}

/// A request body that fails once its deadline has passed before its end.
struct TimedBody {
    inner: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
}

impl HttpBody for TimedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            let message = format!(
                "the request body did not arrive within {} ms (--http-body-timeout-ms)",
                this.timeout.as_millis()
            );
            return Poll::Ready(Some(Err(axum::Error::new(message))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
