//! The Raft client against peers that are down, silent, or broken: openraft must see
//! `Unreachable` (and back off) for the first, `Timeout` (try again at once) for the second, a
//! network error for the last. And appends over a stream: reused, opened again when closed or
//! late, and sent as requests to a peer without streams.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use openraft::error::RPCError;
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, VoteRequest};
use openraft::{BasicNode, Vote};
use statestore_raft::append_stream::{
    read_frame, write_frame, AnswerFrame, ReceivedAppend, APPEND_STREAM_PATH, UPGRADE_PROTOCOL,
};
use statestore_raft::network::APPEND_PATH;
use statestore_raft::wire::encode;
use statestore_raft::NetworkFactory;

async fn vote_to(addr: String, ttl: Duration) -> RPCError<u64, BasicNode, openraft::error::RaftError<u64>> {
    let mut factory = NetworkFactory::new(Duration::from_millis(50), Default::default(), None, None).unwrap();
    let mut client = factory.new_client(2, &BasicNode { addr }).await;
    let request = VoteRequest { vote: Vote::new(1, 1), last_log_id: None };
    client.vote(request, RPCOption::new(ttl)).await.expect_err("no peer answers")
}

#[tokio::test]
async fn a_peer_that_refuses_connections_is_unreachable() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let error = vote_to(format!("http://127.0.0.1:{port}"), Duration::from_secs(1)).await;
    assert!(matches!(error, RPCError::Unreachable(_)), "{error:?}");
}

#[tokio::test]
async fn a_peer_that_never_answers_times_out_at_the_rpc_deadline() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    // Accept and read, never answer: like a paused process.
    let silent = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut buffer = [0; 1024];
        let _ = stream.read(&mut buffer);
        std::thread::sleep(Duration::from_secs(2));
    });
    let started = Instant::now();
    let error = vote_to(addr, Duration::from_millis(200)).await;
    assert!(matches!(error, RPCError::Timeout(_)), "{error:?}");
    assert!(started.elapsed() < Duration::from_secs(2), "the deadline was not applied");
    silent.join().unwrap();
}

#[tokio::test]
async fn a_peer_answering_garbage_is_a_network_error() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let broken = std::thread::spawn(move || {
        for body in ["not bincode", ""] {
            let (mut stream, _) = listener.accept().unwrap();
            let mut buffer = [0; 4096];
            let _ = stream.read(&mut buffer);
            let status = if body.is_empty() { "500 Internal Server Error" } else { "200 OK" };
            let answer =
                format!("HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
            stream.write_all(answer.as_bytes()).unwrap();
        }
    });
    for _ in 0..2 {
        let error = vote_to(addr.clone(), Duration::from_secs(1)).await;
        assert!(matches!(error, RPCError::Network(_)), "{error:?}");
    }
    broken.join().unwrap();
}

/// A peer for the appends tests: `POST /raft/append` answers success and counts; with
/// `streams`, `GET /raft/append/stream` upgrades and hands the connection to `serve`, counting
/// opens. Without, that route is missing (404), as on a version without streams.
struct AppendPeer {
    addr: String,
    posts: Arc<AtomicUsize>,
    opens: Arc<AtomicUsize>,
}

type Served = TokioIo<hyper::upgrade::Upgraded>;

impl AppendPeer {
    async fn start<F, Fut>(streams: Option<F>) -> AppendPeer
    where
        F: Fn(Served) -> Fut + Clone + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let posts = Arc::new(AtomicUsize::new(0));
        let opens = Arc::new(AtomicUsize::new(0));
        let counted = posts.clone();
        let mut router = axum::Router::new().route(
            APPEND_PATH,
            axum::routing::post(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async { encode(&SUCCESS).unwrap() }
            }),
        );
        if let Some(serve) = streams {
            let opened = opens.clone();
            router = router.route(
                APPEND_STREAM_PATH,
                axum::routing::get(move |mut request: axum::extract::Request| async move {
                    opened.fetch_add(1, Ordering::SeqCst);
                    let upgrading = request.extensions_mut().remove::<hyper::upgrade::OnUpgrade>().unwrap();
                    tokio::spawn(async move { serve(TokioIo::new(upgrading.await.unwrap())).await });
                    (
                        axum::http::StatusCode::SWITCHING_PROTOCOLS,
                        [("connection", "upgrade"), ("upgrade", UPGRADE_PROTOCOL)],
                    )
                }),
            );
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        AppendPeer { addr, posts, opens }
    }
}

/// openraft's answer to an append that succeeded, as a peer sends it.
type AppendResult = Result<AppendEntriesResponse<u64>, openraft::error::RaftError<u64>>;

const SUCCESS: AppendResult = Ok(AppendEntriesResponse::Success);

async fn append_to(
    client: &mut statestore_raft::network::PeerClient,
    ttl: Duration,
) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, openraft::error::RaftError<u64>>> {
    let request = AppendEntriesRequest {
        vote: Vote::new_committed(1, 1),
        prev_log_id: None,
        entries: vec![],
        leader_commit: None,
    };
    client.append_entries(request, RPCOption::new(ttl)).await
}

async fn client_of(peer: &AppendPeer) -> statestore_raft::network::PeerClient {
    let mut factory = NetworkFactory::new(Duration::from_millis(50), Default::default(), None, None).unwrap();
    factory.new_client(2, &BasicNode { addr: peer.addr.clone() }).await
}

/// Answers each append frame with success; closes the stream after `answers` of them.
async fn answer_appends(mut io: Served, answers: usize) {
    for _ in 0..answers {
        let Ok(Some(_)) = read_frame::<_, ReceivedAppend>(&mut io, 1 << 20).await else { return };
        let answer = AnswerFrame { wall_clock_ms: 0, incarnation: "peer".into(), cluster: None, answer: Ok(SUCCESS) };
        write_frame(&mut io, &answer).await.unwrap();
    }
}

#[tokio::test]
async fn appends_go_over_one_stream_and_a_closed_stream_is_opened_again() {
    let peer = AppendPeer::start(Some(|io| answer_appends(io, 3))).await;
    let mut client = client_of(&peer).await;
    for _ in 0..5 {
        assert_eq!(append_to(&mut client, Duration::from_secs(1)).await.unwrap(), AppendEntriesResponse::Success);
    }
    // Three appends over the first stream; the peer closed it, and the fourth found that out
    // and went over a second, as did the fifth.
    assert_eq!(peer.opens.load(Ordering::SeqCst), 2);
    assert_eq!(peer.posts.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_peer_without_appends_streams_gets_appends_as_requests() {
    let peer = AppendPeer::start(None::<fn(Served) -> std::future::Ready<()>>).await;
    let mut client = client_of(&peer).await;
    for _ in 0..3 {
        assert_eq!(append_to(&mut client, Duration::from_secs(1)).await.unwrap(), AppendEntriesResponse::Success);
    }
    assert_eq!(peer.posts.load(Ordering::SeqCst), 3, "asked for a stream once, then posted every append");
}

#[tokio::test]
async fn a_stream_that_stops_answering_times_out_and_the_next_append_opens_another() {
    let peer = AppendPeer::start(Some(|mut io: Served| async move {
        let _ = read_frame::<_, ReceivedAppend>(&mut io, 1 << 20).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
    }))
    .await;
    let mut client = client_of(&peer).await;
    for opened in 1..=2 {
        let started = Instant::now();
        let error = append_to(&mut client, Duration::from_millis(200)).await.expect_err("the peer never answers");
        assert!(matches!(error, RPCError::Timeout(_)), "{error:?}");
        assert!(started.elapsed() < Duration::from_secs(2), "the deadline was not applied");
        assert_eq!(peer.opens.load(Ordering::SeqCst), opened, "a stream that timed out is not used again");
    }
}

#[tokio::test]
async fn a_stream_answering_garbage_is_a_network_error() {
    let peer = AppendPeer::start(Some(|mut io: Served| async move {
        let _ = read_frame::<_, ReceivedAppend>(&mut io, 1 << 20).await;
        use tokio::io::AsyncWriteExt;
        io.write_all(&[0, 0, 0, 2, 0xFF, 0xFF]).await.unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
    }))
    .await;
    let mut client = client_of(&peer).await;
    let error = append_to(&mut client, Duration::from_secs(1)).await.expect_err("garbage is no answer");
    assert!(matches!(error, RPCError::Network(_)), "{error:?}");
    assert!(error.to_string().contains("does not decode"), "{error}");
}
