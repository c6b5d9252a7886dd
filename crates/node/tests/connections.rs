//! The node's port under idle, slow and too many connections (real TCP sockets against real node
//! processes): Raft and writes go on at their usual pace, idle and trickling connections are
//! closed at the header deadline, a late body fails at the body deadline, and connections over
//! the cap are refused with an answer naming the flag.

mod common;

use std::time::{Duration, Instant};

use common::Cluster;
use statestore_protocol::Response;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn connect(cluster: &Cluster, id: u64) -> TcpStream {
    TcpStream::connect(("127.0.0.1", cluster.nodes[&id].port)).await.unwrap()
}

/// Reads until the node closes `stream` or `within` passes: what it sent, and whether it closed.
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> (String, bool) {
    let mut received = Vec::new();
    let mut buf = [0u8; 1024];
    let until = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(until, stream.read(&mut buf)).await {
            Err(_) => return (String::from_utf8_lossy(&received).into_owned(), false),
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&received).into_owned(), true),
            Ok(Ok(n)) => received.extend_from_slice(&buf[..n]),
        }
    }
}

/// `count` writes through the leader, one after another: each one's time.
async fn timed_writes(cluster: &Cluster, leader: u64, count: usize) -> Vec<Duration> {
    let mut took = Vec::with_capacity(count);
    for i in 0..count {
        let started = Instant::now();
        let answer = cluster.set(leader, &format!("k{i}"), "v").await.unwrap();
        assert_eq!(answer.response, Response::Ok);
        took.push(started.elapsed());
    }
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_connections_neither_delay_raft_nor_stay_open() {
    let header_timeout = Duration::from_millis(2_000);
    let cluster = Cluster::start(3, &["--http-header-timeout-ms", "2000"]).await;
    cluster.wait_ready().await;
    let leader = cluster.wait_leader().await;
    let before = timed_writes(&cluster, leader, 20).await;

    // 300 connections that send nothing, spread over the nodes, and 30 that trickle their
    // headers a byte at a time to the leader.
    let mut idle = Vec::new();
    for i in 0..300 {
        idle.push(connect(&cluster, 1 + i % 3).await);
    }
    let opened = Instant::now();
    let mut tricklers = Vec::new();
    for _ in 0..30 {
        let mut stream = connect(&cluster, leader).await;
        tricklers.push(tokio::spawn(async move {
            for byte in b"GET /health HTTP/1.1\r\nhost: x\r\nx-slow: ".iter().chain(b"a".repeat(100).iter()) {
                if stream.write_all(&[*byte]).await.is_err() {
                    return Instant::now();
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Instant::now()
        }));
    }
    let during = timed_writes(&cluster, leader, 100).await;
    let slowest = during.iter().max().unwrap();
    assert!(
        *slowest < Duration::from_secs(1),
        "a write took {slowest:?} among idle connections (slowest before: {:?})",
        before.iter().max().unwrap()
    );

    // Every idle connection closed at the header deadline, and every trickling one.
    for (i, stream) in idle.iter_mut().enumerate() {
        let (_, closed) = read_until_closed(stream, header_timeout + Duration::from_secs(3)).await;
        assert!(closed, "idle connection {i} still open {:?} after it was opened", opened.elapsed());
    }
    for trickler in tricklers {
        let cut = trickler.await.unwrap();
        assert!(
            cut.duration_since(opened) < header_timeout + Duration::from_secs(3),
            "a connection trickling its headers stayed open {:?}",
            cut.duration_since(opened)
        );
    }
    assert!(opened.elapsed() >= header_timeout, "connections closed before the deadline");
    assert_eq!(cluster.set(leader, "after", "v").await.unwrap().response, Response::Ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_body_fails_and_connections_over_the_cap_are_refused_naming_the_flags() {
    let cluster = Cluster::start(1, &["--http-body-timeout-ms", "1000", "--http-max-connections", "40"]).await;
    cluster.wait_ready().await;

    // A body that stops half-way: the request fails at the deadline, naming the flag.
    let mut stream = connect(&cluster, 1).await;
    let head = "POST /v1/command HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n*3\r\n$3\r\nSET";
    stream.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    let (answer, _) = read_until_closed(&mut stream, Duration::from_secs(5)).await;
    assert!(answer.contains("--http-body-timeout-ms"), "{answer:?}");
    assert!(started.elapsed() >= Duration::from_millis(900), "answered after {:?}", started.elapsed());
    drop(stream);

    // Beyond 40 connections, each further one is answered 503 at once and closed.
    let mut held = Vec::new();
    for _ in 0..40 {
        held.push(connect(&cluster, 1).await);
    }
    let mut refused = 0;
    for _ in 0..5 {
        let mut extra = connect(&cluster, 1).await;
        let (answer, closed) = read_until_closed(&mut extra, Duration::from_secs(2)).await;
        if closed && answer.starts_with("HTTP/1.1 503") {
            assert!(answer.contains("--http-max-connections"), "{answer:?}");
            refused += 1;
        }
    }
    assert!(refused >= 4, "{refused} of 5 connections over the cap were refused");
    drop(held);
    // Slots free again once those connections close.
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        if let Ok(response) = cluster.http.get(format!("{}/health", cluster.url(1))).send().await {
            if response.status() == 200 {
                break;
            }
        }
        assert!(Instant::now() < until, "the node did not serve again once the connections closed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
