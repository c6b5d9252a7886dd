//! Clock offsets, injected for real: a node runs under libfaketime with its wall clock shifted
//! (its monotonic clock untouched), among nodes with the true time.

mod common;

use std::time::{Duration, Instant};

use common::Cluster;
use statestore_protocol::{Response, Set, SetCondition};

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";
const DEADLINE: Duration = Duration::from_secs(20);

/// Runs node `id` with its wall clock `offset` ahead (e.g. `+30s`).
fn shift_clock(cluster: &mut Cluster, id: u64, offset: &str) {
    assert!(
        std::path::Path::new(LIBFAKETIME).exists(),
        "{LIBFAKETIME} is missing: install the Debian package faketime (cluster/packages.sh --tests)"
    );
    cluster.nodes.get_mut(&id).unwrap().env = vec![
        ("LD_PRELOAD".into(), LIBFAKETIME.into()),
        ("FAKETIME".into(), offset.into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
        ("FAKETIME_DONT_RESET".into(), "1".into()),
    ];
}

/// The leader the nodes in `among` agree on, asking only them (a paused node would not answer).
async fn leader_among(cluster: &Cluster, among: &[u64]) -> u64 {
    let until = Instant::now() + DEADLINE;
    loop {
        let mut seen = Vec::new();
        for &id in among {
            let status = cluster.status(id).await;
            seen.push(status.as_ref().and_then(|s| s["leader"]["id"].as_u64()));
        }
        if let Some(Some(leader)) = seen.first().copied() {
            if among.contains(&leader) && seen.iter().all(|l| *l == Some(leader)) {
                return leader;
            }
        }
        assert!(Instant::now() < until, "no agreed leader among {among:?}: {seen:?}\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// `GET /ready` of node `id`: (status, body).
async fn ready(cluster: &Cluster, id: u64) -> (u16, String) {
    let response = cluster.http.get(format!("{}/ready", cluster.url(id))).send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

/// The state machine adopts the leader's clock forward-only, so a leader whose clock runs 30 s
/// fast would expire keys and dedup records 30 s early on every node, for good. A node whose clock
/// is that far off must say it is not ready, and never lead, however often the leader changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_clock_is_off_is_not_ready_and_never_leads() {
    let mut cluster = Cluster::prepare(3, &[]);
    shift_clock(&mut cluster, 3, "+30s");
    // Every initial member of a new cluster stands at once, before any clock is known: node 3
    // joins once the others have formed it (a node with a shifted clock that wins that first
    // election proposes nothing and hands over within a heartbeat round; not what this tests).
    cluster.spawn(1);
    cluster.spawn(2);
    leader_among(&cluster, &[1, 2]).await;
    cluster.spawn(3);
    // The shift is real: node 3's HTTP Date header is about 30 s ahead.
    let date = |response: &reqwest::Response| {
        let text = response.headers()["date"].to_str().unwrap().to_string();
        httpdate::parse_http_date(&text).unwrap()
    };
    let until = Instant::now() + DEADLINE;
    let (ours, theirs) = loop {
        let ours = cluster.http.get(format!("{}/health", cluster.url(1))).send().await;
        let theirs = cluster.http.get(format!("{}/health", cluster.url(3))).send().await;
        if let (Ok(ours), Ok(theirs)) = (ours, theirs) {
            break (date(&ours), date(&theirs));
        }
        assert!(Instant::now() < until, "nodes 1 and 3 did not answer");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let ahead = theirs.duration_since(ours).unwrap_or_default();
    assert!(ahead >= Duration::from_secs(28), "node 3's clock is only {ahead:?} ahead");

    let mut leader = leader_among(&cluster, &[1, 2, 3]).await;
    for round in 0..3 {
        assert_ne!(leader, 3, "round {round}: the node with the shifted clock leads\n{}", cluster.logs());
        // A write goes through the leader with the true clock, and a key with a 20 s PX is there.
        let key = format!("px-{round}");
        let set = Set {
            key: key.clone().into(),
            value: b"v".to_vec(),
            condition: SetCondition::Always,
            expiry_ms: Some(20_000),
        };
        let answer = cluster.command(leader, set.encode(), Some(&common::timestamp()), "").await;
        assert_eq!(answer.map(|a| a.response).ok(), Some(Response::Ok), "round {round}");
        let read = cluster.get(leader, &key).await.unwrap();
        assert_eq!(read.response, Response::Value(b"v".to_vec()), "round {round}");
        // Node 3 says why it is not ready.
        let until = Instant::now() + DEADLINE;
        loop {
            let (status, body) = ready(&cluster, 3).await;
            if status == 503 && body.contains("clock") {
                break;
            }
            assert!(Instant::now() < until, "round {round}: node 3's /ready answered {status} {body}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The leader is paused: the other two elect one of themselves, never node 3.
        cluster.signal(leader, "STOP");
        let others: Vec<u64> = [1, 2, 3].into_iter().filter(|id| *id != leader).collect();
        let next = leader_among(&cluster, &others).await;
        cluster.signal(leader, "CONT");
        leader = next;
    }
    assert_ne!(leader, 3, "the node with the shifted clock leads\n{}", cluster.logs());
}
