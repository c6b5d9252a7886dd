//! The HTTP Raft client against peers that are down, silent, or broken: openraft must see
//! `Unreachable` (and back off) for the first, `Timeout` (try again at once) for the second, a
//! network error for the last.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use openraft::error::RPCError;
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::VoteRequest;
use openraft::{BasicNode, Vote};
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
