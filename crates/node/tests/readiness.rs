//! `GET /ready` on a leader: callers share one quorum confirmation, and a leader cut off from
//! its peers still answers not ready.

mod common;

use std::time::{Duration, Instant};

use common::{metric, Cluster};
use serde_json::Value;

const CONFIRMATIONS: &str = "statestore_readiness_confirmations_total";

async fn confirmations(cluster: &Cluster, id: u64) -> f64 {
    let text = cluster.metrics(id).await;
    metric(&text, CONFIRMATIONS).unwrap_or_else(|| panic!("{CONFIRMATIONS} missing from\n{text}"))
}

/// `callers` tasks each ask `/ready` `each` times in a row, as fast as answers come: every status.
async fn barrage(cluster: &Cluster, id: u64, callers: usize, each: usize) -> Vec<u16> {
    let url = format!("{}/ready", cluster.url(id));
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let (http, url) = (cluster.http.clone(), url.clone());
            tokio::spawn(async move {
                let mut statuses = Vec::with_capacity(each);
                for _ in 0..each {
                    statuses.push(http.get(&url).send().await.unwrap().status().as_u16());
                }
                statuses
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.extend(task.await.unwrap());
    }
    statuses
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_calls_share_one_quorum_confirmation() {
    let cluster = Cluster::start(3, &[]).await;
    cluster.wait_ready().await;
    let leader = cluster.wait_leader().await;
    let before = confirmations(&cluster, leader).await;
    let started = Instant::now();
    let statuses = barrage(&cluster, leader, 20, 25).await;
    let took = started.elapsed();
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let rounds = confirmations(&cluster, leader).await - before;
    // A successful round answers every caller for a quarter of the 300 ms lease after it began.
    let bound = (took.as_millis() / 75) as f64 + 3.0;
    assert!(rounds <= bound, "{} calls in {took:?} started {rounds} confirmations, over {bound}", statuses.len());

    // Both followers frozen: the leader believes it leads, but reaches no quorum.
    let followers: Vec<u64> = cluster.running().into_iter().filter(|id| *id != leader).collect();
    for id in &followers {
        cluster.signal(*id, "STOP");
    }
    let ready_url = format!("{}/ready", cluster.url(leader));
    let deadline = Instant::now() + Duration::from_secs(5);
    let body = loop {
        let response = cluster.http.get(&ready_url).send().await.unwrap();
        if response.status() == 503 {
            break response.json::<Value>().await.unwrap();
        }
        assert!(Instant::now() < deadline, "the cut-off leader stayed ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(body["message"], "the leader cannot reach a quorum", "{body}");
    // Callers at once wait for one failing round (two leases) rather than one each.
    let before = confirmations(&cluster, leader).await;
    let started = Instant::now();
    let statuses = barrage(&cluster, leader, 20, 1).await;
    let took = started.elapsed();
    assert!(statuses.iter().all(|s| *s == 503), "{statuses:?}");
    let rounds = confirmations(&cluster, leader).await - before;
    assert!(rounds <= 2.0, "20 callers at once started {rounds} confirmations in {took:?}");
    assert!(took < Duration::from_secs(3), "20 callers at once waited {took:?}");
    for id in &followers {
        cluster.signal(*id, "CONT");
    }
    cluster.wait_ready().await;
}
