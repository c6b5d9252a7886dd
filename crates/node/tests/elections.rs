//! Elections under a race: two voters that lose their leader at the same moment. Alone in its
//! file, because it keeps every core busy while it runs (`cargo test` runs test files one after
//! another; `.config/nextest.toml` gives it every test slot).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use common::Cluster;

/// Two voters that lose their leader at the same moment may both win a pre-vote (each grants
/// the other's) and stand within a moment of each other. Election timeouts drawn from a range of
/// 2 ms and a 5 ms heartbeat make the survivors of a leader killed with SIGKILL stand within a few
/// milliseconds of each other, and threads spinning on every core stretch the moment between a
/// voter's last look at its vote and its standing. Each kill must cost one term: a voter that
/// granted the other's vote in that moment and stood all the same would raise the term again and
/// unseat the leader just elected (another lease and election timeout without one).
#[tokio::test(flavor = "multi_thread")]
async fn voters_that_lose_their_leader_together_elect_one_in_one_term() {
    let timing = ["--heartbeat-ms", "5", "--election-min-ms", "200", "--election-max-ms", "202"];
    let mut cluster = Cluster::start(3, &timing).await;
    cluster.wait_ready().await;
    let spinning = Arc::new(AtomicBool::new(true));
    let spinners: Vec<_> = (0..std::thread::available_parallelism().map_or(2, |n| n.get()) * 2)
        .map(|_| {
            let spinning = spinning.clone();
            std::thread::spawn(move || {
                while spinning.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let mut terms = Vec::new();
    for _ in 0..24 {
        let leader = cluster.wait_leader().await;
        let term = cluster.status(leader).await.unwrap()["term"].as_u64().unwrap();
        let killed_at = Instant::now();
        cluster.kill(leader);
        let successor = cluster.wait_leader().await;
        let elected_in = killed_at.elapsed();
        let new_term = cluster.status(successor).await.unwrap()["term"].as_u64().unwrap();
        terms.push((term, new_term, elected_in));
        cluster.spawn(leader);
        cluster.wait_ready().await;
    }
    spinning.store(false, Ordering::Relaxed);
    for spinner in spinners {
        spinner.join().unwrap();
    }
    eprintln!("terms before and after each kill, and the time to a new leader: {terms:?}");
    assert!(
        terms.iter().all(|(before, after, _)| after - before == 1),
        "every leader loss cost one election: {terms:?}\n{}",
        cluster.logs()
    );
}
