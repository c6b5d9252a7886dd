//! Three real node processes: replication, linearizable reads, redirects, durability across
//! `kill -9`, leader failover.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::disk::cluster_with_faulty_disks;
use common::{elections_started, metric, Cluster, Refused, DEADLINE};
use statestore_node::server::EXIT_STORAGE_FAILED;
use statestore_protocol::Response;
use tokio::sync::Mutex;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_on_the_leader_reach_every_node_and_followers_forward() {
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_leader().await;
    let mut versions = BTreeMap::new();
    for i in 0..50 {
        let answer = cluster.set(leader, &format!("key-{i}"), &format!("value-{i}")).await.unwrap();
        assert_eq!(answer.response, Response::Ok);
        versions.insert(i, answer.version.expect("a SET answers with the new version"));
    }
    // Versions are one cluster-wide HLC: strictly increasing.
    let ordered: Vec<_> = versions.values().cloned().collect();
    assert!(ordered.windows(2).all(|w| w[0].parse::<statestore_protocol::Hlc>().unwrap() < w[1].parse().unwrap()));

    // A linearizable read on the leader sees the latest write at once.
    let read = cluster.get(leader, "key-49").await.unwrap();
    assert_eq!(read.response, Response::Value(b"value-49".to_vec()));
    assert_eq!(read.version.as_ref(), versions.get(&49));

    let leader_index = cluster.status(leader).await.unwrap()["applied_index"].as_u64().unwrap();
    for follower in cluster.running().into_iter().filter(|id| *id != leader) {
        // A follower carries linearizable reads and writes to the leader and returns its answers.
        let read = cluster.get(follower, "key-1").await.unwrap();
        assert_eq!(read.response, Response::Value(b"value-1".to_vec()));
        assert_eq!(read.version.as_ref(), versions.get(&1));
        let written = cluster.set(follower, &format!("through-{follower}"), "v").await.unwrap();
        assert_eq!(written.response, Response::Ok);
        let version: statestore_protocol::Hlc =
            written.version.expect("a forwarded SET answers with its version").parse().unwrap();
        assert!(version > ordered.last().unwrap().parse().unwrap());
        // Every write is applied on every follower, with the same version.
        cluster.wait_applied(follower, leader_index).await;
        for (i, version) in &versions {
            let local = cluster.get_local(follower, &format!("key-{i}")).await.unwrap();
            assert_eq!(local.response, Response::Value(format!("value-{i}").into_bytes()));
            assert_eq!(local.version.as_ref(), Some(version));
        }
        let status = cluster.status(follower).await.unwrap();
        assert_eq!(status["role"], "follower");
        assert_eq!(status["voters"].as_array().unwrap().len(), 3);
        // The leader's appends come over its stream, none as a request of its own. (Fewer
        // appends than writes: a follower that lags, the one the leader did not need for its
        // quorum, gets several entries in one append.)
        let metrics = cluster.metrics(follower).await;
        let served = |transport: &str| {
            metric(&metrics, &format!("statestore_raft_appends_served_total{{transport=\"{transport}\"}}"))
        };
        assert!(served("stream").is_some_and(|appends| appends >= 10.0), "{metrics}");
        assert_eq!(served("request"), None, "{metrics}");
    }
}

/// A commit reaches a follower with the next append that carries entries, not in an append of
/// its own: writes one after another cost a follower about one append each, not two (the
/// published openraft sends every newly committed index at once, alone). Idle, a follower still
/// learns the last commit, a few milliseconds later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_rides_on_the_next_append_to_a_follower() {
    const WRITES: u64 = 200;
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_leader().await;
    cluster.set(leader, "warm-up", "v").await.unwrap();
    let followers: Vec<u64> = cluster.running().into_iter().filter(|id| *id != leader).collect();
    let appends =
        |metrics: &str| metric(metrics, "statestore_raft_appends_served_total{transport=\"stream\"}").unwrap_or(0.0);
    let mut before = BTreeMap::new();
    for &follower in &followers {
        before.insert(follower, appends(&cluster.metrics(follower).await));
    }
    let first = cluster.status(leader).await.unwrap()["applied_index"].as_u64().unwrap();
    let started = Instant::now();
    for i in 0..WRITES {
        let answer = cluster.set(leader, &format!("key-{i}"), "value").await.unwrap();
        assert_eq!(answer.response, Response::Ok);
    }
    let elapsed = started.elapsed();
    let last = cluster.status(leader).await.unwrap()["applied_index"].as_u64().unwrap();
    let entries = last - first;
    assert!(entries >= WRITES, "one entry per write: {entries}");
    // The leader's heartbeats (every 50 ms) come on top, and a commit no entries followed within
    // 10 ms goes alone: allow a quarter of the entries for that.
    let heartbeats = elapsed.as_millis() as u64 / 50 + 2;
    for &follower in &followers {
        let served = appends(&cluster.metrics(follower).await) - before[&follower];
        eprintln!("follower {follower}: {served} appends for {entries} entries in {elapsed:?}");
        assert!(
            served <= (entries + entries / 4 + heartbeats) as f64,
            "follower {follower} was sent {served} appends for {entries} entries in {elapsed:?}: \
             a commit went in an append of its own"
        );
        // Nothing else is written: the last commit reaches the follower alone.
        cluster.wait_applied(follower, last).await;
    }
}

/// Every write whose proposal returned survives `kill -9` of every node at once, with the
/// version it was acknowledged with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_killing_every_node() {
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_leader().await;
    let acknowledged = Arc::new(Mutex::new(BTreeMap::new()));
    let url = cluster.url(leader);
    let mut writers = Vec::new();
    for writer in 0..8 {
        let acknowledged = acknowledged.clone();
        let http = cluster.http.clone();
        let url = url.clone();
        writers.push(tokio::spawn(async move {
            for i in 0.. {
                let key = format!("w{writer}-{i}");
                let sent = http
                    .post(format!("{url}/v1/command"))
                    .header("statestore-ts", common::timestamp())
                    .body(statestore_protocol::Set::new(key.as_str(), key.as_str()).encode())
                    .send()
                    .await;
                let Ok(response) = sent else { return };
                if response.status() != 200 {
                    return;
                }
                let version = response.headers()["statestore-ts"].to_str().unwrap().to_string();
                let Ok(body) = response.bytes().await else { return };
                assert_eq!(&body[..], b"+OK\r\n");
                acknowledged.lock().await.insert(key, version);
            }
        }));
    }
    // Let the writers run, then pull the plug on all three mid-stream.
    let until = Instant::now() + DEADLINE;
    while acknowledged.lock().await.len() < 300 {
        assert!(Instant::now() < until, "writes are too slow\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for id in [1, 2, 3] {
        cluster.kill(id);
    }
    for writer in writers {
        writer.await.unwrap();
    }
    let acknowledged = acknowledged.lock().await.clone();
    for id in [1, 2, 3] {
        cluster.spawn(id);
    }
    let leader = cluster.wait_leader().await;
    for (key, version) in &acknowledged {
        let read = cluster.get(leader, key).await.unwrap();
        assert_eq!(read.response, Response::Value(key.clone().into_bytes()), "{key} was acknowledged, then lost");
        assert_eq!(read.version.as_ref(), Some(version), "{key} came back with another version");
    }
    eprintln!("{} acknowledged writes survived kill -9 of all nodes", acknowledged.len());
}

/// Writes `keys` with `value`, 16 at a time, on node `id`; every one must be acknowledged.
async fn write_all(cluster: &Cluster, id: u64, keys: std::ops::Range<usize>, value: &str) {
    use futures::StreamExt;
    let writes = keys.map(|i| async move {
        cluster.set(id, &format!("key-{i}"), value).await.expect("an acknowledged write");
    });
    futures::stream::iter(writes).buffer_unordered(16).collect::<Vec<_>>().await;
}

/// The state machine's writes skip the WAL and reach the disk with flushes; the log below a
/// snapshot is purged. A node killed after purging must still hold, or apply again, every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_after_purging_its_log_comes_back_with_every_write() {
    // Snapshot (and purge everything below it) every 40 entries.
    let mut cluster = Cluster::start(1, &["--snapshot-every", "40", "--logs-kept", "0"]).await;
    write_all(&cluster, 1, 0..600, "first").await;
    let applied = cluster.status(1).await.unwrap()["applied_index"].as_u64().unwrap();
    cluster.wait_snapshot_covering(1, applied.saturating_sub(80)).await;
    // Writes after the last snapshot are applied but not flushed when the node is killed.
    write_all(&cluster, 1, 300..900, "second").await;
    cluster.kill(1);
    let started = Instant::now();
    cluster.spawn(1);
    cluster.wait_leader().await;
    eprintln!("ready {:?} after kill -9", started.elapsed());
    for i in 0..900 {
        let key = format!("key-{i}");
        let expected = if i < 300 { "first" } else { "second" };
        let read = cluster.get(1, &key).await.unwrap();
        assert_eq!(read.response, Response::Value(expected.into()), "{key}\n{}", cluster.logs());
    }
}

/// A node stopped cleanly leaves what it applied on disk: it does not apply its log again when
/// it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stopped_cleanly_leaves_its_applied_state_on_disk() {
    let mut cluster = Cluster::start(1, &[]).await;
    write_all(&cluster, 1, 0..300, "v").await;
    let applied = cluster.status(1).await.unwrap()["applied_index"].as_u64().unwrap();
    assert!(cluster.terminate(1).success());
    let (on_disk, committed) = applied_on_disk(&cluster.nodes[&1].data_dir).await;
    // A housekeeping entry committed in the node's last moments may be left to apply at start;
    // every write acknowledged before the stop is on disk.
    assert!(on_disk >= applied, "applied {applied} before the stop, {on_disk} on disk (committed {committed})");
}

/// What a node opened on `data_dir` holds: (the log index its state-machine tables are at on
/// disk, the committed index its log records).
async fn applied_on_disk(data_dir: &std::path::Path) -> (u64, u64) {
    use openraft::storage::{RaftLogStorage, RaftStateMachine};
    let metrics = statestore_raft::StorageMetrics::register(&prometheus::Registry::new()).unwrap();
    let mut storage = statestore_raft::open(data_dir, statestore_statemachine::Config::default(), metrics).unwrap();
    let on_disk = storage.state.applied_state().await.unwrap().0.map_or(0, |id| id.index);
    let committed = storage.log.read_committed().await.unwrap().map_or(0, |id| id.index);
    (on_disk, committed)
}

/// Writes 10,000 small SETs, 16 at a time, to a one-node cluster started with `flags` and no
/// snapshot (a snapshot build flushes too), kills it with `kill -9`, and checks that its tables
/// on disk are fewer than `bound` log entries behind what it had applied; then that it comes
/// back with every write.
async fn killed_after_many_writes(flags: &[&str], bound: u64) {
    const WRITES: usize = 10_000;
    let args: Vec<&str> = ["--snapshot-every", "1000000"].iter().chain(flags).copied().collect();
    let mut cluster = Cluster::start(1, &args).await;
    write_all(&cluster, 1, 0..WRITES, "v").await;
    let applied = cluster.status(1).await.unwrap()["applied_index"].as_u64().unwrap();
    // Past the policy's next look (every 200 ms) and any flush it began.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let metrics = cluster.metrics(1).await;
    let unflushed = |name: &str| metric(&metrics, name).unwrap_or_else(|| panic!("{name} in\n{metrics}")) as u64;
    let (unflushed_entries, unflushed_operations) =
        (unflushed("statestore_state_unflushed_entries"), unflushed("statestore_state_unflushed_operations"));
    cluster.kill(1);
    let (on_disk, committed) = applied_on_disk(&cluster.nodes[&1].data_dir).await;
    // Below both limits nothing flushed between the scrape and the kill: the metric said what the
    // crash left to apply again (and more, had housekeeping applied an entry after `applied`).
    assert!(unflushed_entries < bound, "{unflushed_entries} unflushed entries");
    assert!(
        on_disk + unflushed_entries >= applied,
        "{unflushed_entries} unflushed, {on_disk} on disk, {applied} applied"
    );
    assert!(unflushed_operations >= unflushed_entries, "an entry holds one operation at least");
    eprintln!("{flags:?}: applied {applied} (committed {committed}), {on_disk} on disk after kill -9");
    assert!(
        on_disk + bound > applied,
        "{flags:?}: applied {applied} before kill -9, the tables on disk at {on_disk}: {bound} entries or more to apply again"
    );
    let started = Instant::now();
    cluster.spawn(1);
    cluster.wait_ready().await;
    eprintln!("ready {:?} after its start", started.elapsed());
    for i in (0..WRITES).step_by(97) {
        let key = format!("key-{i}");
        let read = cluster.get(1, &key).await.unwrap();
        assert_eq!(read.response, Response::Value(b"v".to_vec()), "{key}\n{}", cluster.logs());
    }
}

/// The applied state reaches the disk every `--flush-after-entries` log entries, not only when
/// 64 MiB of memtables fill up or a snapshot is built: a node killed with `kill -9` after many
/// small writes applies only the last few entries again when it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_after_many_entries_applies_few_again() {
    killed_after_many_writes(&["--flush-after-entries", "500", "--flush-after-operations", "1000000000"], 500).await;
}

/// The same bound in operations: entries of several requests each reach the flush sooner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_after_many_operations_applies_few_again() {
    // Each entry holds at least one operation, so fewer than 1,000 entries are not on disk.
    killed_after_many_writes(&["--flush-after-entries", "1000000000", "--flush-after-operations", "1000"], 1_000).await;
}

/// `kill -9` the leader: a new one is elected and writes resume. Prints the time from the kill
/// to the first successful write for each of 10 trials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_takes_over_after_the_leader_is_killed() {
    let mut cluster = Cluster::start(3, &[]).await;
    let mut timings = Vec::new();
    for trial in 0..10 {
        let leader = cluster.wait_leader().await;
        cluster.set_anywhere(&format!("before-{trial}"), "x", DEADLINE).await;
        let killed = Instant::now();
        cluster.kill(leader);
        let written = cluster.set_anywhere(&format!("after-{trial}"), "y", DEADLINE).await;
        let took = killed.elapsed();
        assert_eq!(written.response, Response::Ok);
        let new_leader = cluster.wait_leader().await;
        assert_ne!(new_leader, leader);
        // Nothing acknowledged before the kill is lost.
        for earlier in 0..=trial {
            let read = cluster.get(new_leader, &format!("before-{earlier}")).await.unwrap();
            assert_eq!(read.response, Response::Value(b"x".to_vec()));
        }
        timings.push(took);
        cluster.spawn(leader);
        cluster.wait_leader().await;
    }
    let mut millis: Vec<u128> = timings.iter().map(|t| t.as_millis()).collect();
    eprintln!("failover, kill -9 of the leader to the first successful write (ms): {millis:?}");
    millis.sort_unstable();
    eprintln!("failover median {} ms, max {} ms", millis[millis.len() / 2], millis[millis.len() - 1]);
}

/// An initial member that starts after the others formed the cluster joins it without an
/// election: the leader and the term stay as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_initial_member_joins_without_unseating_the_leader() {
    let mut cluster = Cluster::prepare(3, &[]);
    cluster.spawn(1);
    cluster.spawn(2);
    let leader = cluster.wait_leader().await;
    cluster.set(leader, "before", "x").await.unwrap();
    let term = cluster.status(leader).await.unwrap()["term"].as_u64().unwrap();
    cluster.spawn(3);
    let applied = cluster.status(leader).await.unwrap()["applied_index"].as_u64().unwrap();
    cluster.wait_applied(3, applied).await;
    assert_eq!(cluster.wait_leader().await, leader);
    let status = cluster.status(3).await.unwrap();
    assert_eq!(status["term"].as_u64(), Some(term), "node 3 started an election");
    assert_eq!(cluster.get_local(3, "before").await.unwrap().response, Response::Value(b"x".to_vec()));
}

/// A leader cut off from its quorum answers neither reads nor writes: 503 `unavailable`, never a
/// stale value or a false acknowledgement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_without_a_quorum_refuses_reads_and_writes() {
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_leader().await;
    cluster.set(leader, "k", "v").await.unwrap();
    for id in cluster.running().into_iter().filter(|id| *id != leader) {
        cluster.kill(id);
    }
    for refused in [cluster.get(leader, "k").await, cluster.set(leader, "k", "w").await] {
        match refused {
            Err(Refused::Status(503, body)) => assert_eq!(body["code"], "unavailable"),
            other => panic!("a leader without a quorum answered {other:?}"),
        }
    }
    // Its own applied state still holds the last committed value.
    assert_eq!(cluster.get_local(leader, "k").await.unwrap().response, Response::Value(b"v".to_vec()));
}

/// A read whose leadership confirmation misses its round (both followers stalled for 250 ms,
/// less than an election timeout: SIGSTOP, then SIGCONT) is answered once they answer again,
/// not refused: on a loaded machine a round of heartbeats misses its 50 ms now and then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_waits_out_followers_that_stall_briefly() {
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_leader().await;
    cluster.set(leader, "k", "v").await.unwrap();
    let followers: Vec<u64> = cluster.running().into_iter().filter(|id| *id != leader).collect();
    for id in &followers {
        cluster.signal(*id, "STOP");
    }
    let resume = async {
        tokio::time::sleep(Duration::from_millis(250)).await;
        for id in &followers {
            cluster.signal(*id, "CONT");
        }
    };
    let (answer, ()) = tokio::join!(cluster.get(leader, "k"), resume);
    assert_eq!(answer.unwrap_or_else(|e| panic!("{e:?}\n{}", cluster.logs())).response, Response::Value(b"v".to_vec()));
    assert_eq!(cluster.wait_leader().await, leader, "the stall cost no election");
}

/// Replication never stalls on size or on a slow follower: 64 consecutive 1 MiB values, then
/// writes while a follower is paused for 10 s (among them 48 values of 3 MiB: more than one
/// append request may carry, 144 MiB against the 128 MiB body limit), end with every node
/// holding every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_values_and_a_paused_follower_reach_every_node() {
    let cluster = Arc::new(Cluster::start(3, &[]).await);
    let leader = cluster.wait_leader().await;
    let followers: Vec<u64> = cluster.running().into_iter().filter(|id| *id != leader).collect();
    let value = |i: usize, mib: usize| -> String {
        let fill = char::from(b'a' + (i % 26) as u8);
        format!("{i:04}{}", fill.to_string().repeat((mib << 20) - 4))
    };
    // 64 values of 1 MiB, 8 at a time: batches of several MiB that no append may carry whole.
    let mut written = Vec::new();
    for chunk in (0..64).collect::<Vec<_>>().chunks(8) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|&i| {
                let cluster = cluster.clone();
                let value = value(i, 1);
                tokio::spawn(async move { cluster.set(leader, &format!("big-{i}"), &value).await })
            })
            .collect();
        for (task, i) in tasks.into_iter().zip(chunk) {
            let answer = task.await.unwrap().unwrap_or_else(|e| panic!("big-{i}: {e:?}\n{}", cluster.logs()));
            assert_eq!(answer.response, Response::Ok);
            written.push((format!("big-{i}"), value(*i, 1)));
        }
    }
    // A follower paused for 10 s misses small and large writes; it must catch up once resumed.
    let paused = followers[0];
    cluster.signal(paused, "STOP");
    let pause_started = Instant::now();
    for i in 0..400 {
        let (key, value) = if i % 8 == 0 {
            (format!("paused-big-{i}"), value(i, 3))
        } else {
            (format!("paused-{i}"), format!("v{i}"))
        };
        let answer = cluster.set(leader, &key, &value).await.unwrap();
        assert_eq!(answer.response, Response::Ok);
        written.push((key, value));
    }
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(pause_started.elapsed())).await;
    cluster.signal(paused, "CONT");
    let leader = cluster.wait_leader().await;
    let leader_index = cluster.status(leader).await.unwrap()["applied_index"].as_u64().unwrap();
    for id in cluster.running() {
        cluster.wait_applied(id, leader_index).await;
        for (key, value) in &written {
            let local = cluster.get_local(id, key).await.unwrap();
            assert!(local.response == Response::Value(value.clone().into_bytes()), "{key} on node {id}");
        }
    }
}

/// The terms of the running nodes, by node.
async fn terms(cluster: &Cluster) -> BTreeMap<u64, u64> {
    let mut terms = BTreeMap::new();
    for id in cluster.running() {
        let status = cluster.status(id).await.unwrap_or_else(|| panic!("node {id} does not answer"));
        terms.insert(id, status["term"].as_u64().unwrap());
    }
    terms
}

/// A follower paused for longer than the election timeout, at least three times, comes back as a
/// follower: its pre-vote finds the other nodes still hearing the leader, so it does not stand
/// for election, and the leader and its term stay as they were. Whether a resumed follower holds
/// a pre-vote at all depends on whether its election timer fires before the leader's next
/// heartbeat reaches it, so the pauses go on (at most eight) until it has held one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_follower_resumes_without_unseating_the_leader() {
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_leader().await;
    let before = terms(&cluster).await;
    let follower = cluster.running().into_iter().find(|id| *id != leader).unwrap();
    let lost_prevotes = || async {
        common::metric(&cluster.metrics(follower).await, "statestore_prevotes_total{outcome=\"lost\"}").unwrap_or(0.0)
    };
    let mut round = 0;
    while round < 3 || (round < 8 && lost_prevotes().await < 1.0) {
        cluster.signal(follower, "STOP");
        // Writes while it sleeps leave its log behind the others'.
        for i in 0..20 {
            let answer = cluster.set(leader, &format!("paused-{round}-{i}"), "v").await.unwrap();
            assert_eq!(answer.response, Response::Ok);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        cluster.signal(follower, "CONT");
        // Long enough for an election it might start, and for its outcome.
        tokio::time::sleep(Duration::from_millis(800)).await;
        let answer = cluster.set(leader, &format!("resumed-{round}"), "v").await;
        assert!(
            matches!(&answer, Ok(a) if a.response == Response::Ok),
            "round {round}: the leader stopped serving after a follower resumed: {answer:?}\n{}",
            cluster.logs()
        );
        round += 1;
    }
    assert_eq!(cluster.wait_leader().await, leader);
    assert_eq!(terms(&cluster).await, before, "a resumed follower raised the term\n{}", cluster.logs());
    let lost = lost_prevotes().await;
    assert!(lost >= 1.0, "the follower held no pre-vote in {round} pauses: {lost}");
}

/// A paused leader is replaced by one of the others, which serves writes; once resumed, the old
/// leader follows the new term, and nobody stands for election again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_is_replaced_and_follows_once_resumed() {
    let cluster = Cluster::start(3, &[]).await;
    let old = cluster.wait_leader().await;
    let term = cluster.status(old).await.unwrap()["term"].as_u64().unwrap();
    let others: Vec<u64> = cluster.running().into_iter().filter(|id| *id != old).collect();
    cluster.signal(old, "STOP");
    let until = Instant::now() + DEADLINE;
    'written: loop {
        for id in &others {
            if let Ok(answer) = cluster.set(*id, "after-pause", "v").await {
                assert_eq!(answer.response, Response::Ok);
                break 'written;
            }
        }
        assert!(Instant::now() < until, "no other node took over\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The write was answered by the new leader, directly or through the other follower.
    let mut new = None;
    for id in &others {
        if cluster.status(*id).await.unwrap()["role"] == "leader" {
            new = Some(*id);
        }
    }
    let new = new.expect("one of the others leads after the write");
    cluster.signal(old, "CONT");
    let leader = cluster.wait_leader().await;
    assert_eq!(leader, new, "node {old} was paused, node {new} took over, node {leader} leads\n{}", cluster.logs());
    let after = terms(&cluster).await;
    assert!(after.values().all(|t| *t > term), "the new leader's term is everyone's: {after:?}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(terms(&cluster).await, after, "an election followed the resume\n{}", cluster.logs());
    assert_eq!(cluster.wait_leader().await, new);
    let read = cluster.get(new, "after-pause").await.unwrap();
    assert_eq!(read.response, Response::Value(b"v".to_vec()));
}

/// Between a commit and its apply (a millisecond under load) a node is not behind, and a leader
/// whose followers answer a round of heartbeats late (each has 50 ms, and a follower answers
/// once its pending appends are on disk) still leads a quorum: `/ready` must not flap to 503
/// while a healthy cluster takes a steady stream of writes and both followers' disks hiccup
/// together (their `fsync`s stalled for real for 150 ms every half second, as a disk the nodes
/// share does when another writer flushes a burst) — a hiccup is shorter than any lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_does_not_flap_under_writes_while_the_followers_disks_hiccup() {
    const HICCUP: Duration = Duration::from_millis(150);
    let (cluster, disks, leader) = cluster_with_faulty_disks(&[]).await;
    let followers: Vec<u64> = cluster.running().into_iter().filter(|id| *id != leader).collect();
    let writing = std::sync::atomic::AtomicBool::new(true);
    let writers = async {
        let writer = |w: usize| {
            let (cluster, writing) = (&cluster, &writing);
            async move {
                let mut i = 0;
                while writing.load(std::sync::atomic::Ordering::Relaxed) {
                    cluster.set(leader, &format!("steady-{w}-{}", i % 100), "v").await.expect("a write");
                    i += 1;
                }
                i
            }
        };
        futures::future::join_all((0..8).map(writer)).await.into_iter().sum::<usize>()
    };
    let hiccups = async {
        let mut hiccups = 0;
        while writing.load(std::sync::atomic::Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(350)).await;
            for id in &followers {
                std::fs::write(disks.stall(*id), "").unwrap();
            }
            tokio::time::sleep(HICCUP).await;
            for id in &followers {
                std::fs::remove_file(disks.stall(*id)).unwrap();
            }
            hiccups += 1;
        }
        hiccups
    };
    let probes = async {
        let (mut checks, mut not_ready) = (0, Vec::new());
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(4) {
            for id in cluster.running() {
                let response = cluster.http.get(format!("{}/ready", cluster.url(id))).send().await.unwrap();
                checks += 1;
                if response.status() != 200 {
                    not_ready.push((id, response.text().await.unwrap()));
                }
            }
        }
        writing.store(false, std::sync::atomic::Ordering::Relaxed);
        (checks, not_ready)
    };
    let (writes, hiccups, (checks, not_ready)) = tokio::join!(writers, hiccups, probes);
    assert!(writes > 200 && checks > 200 && hiccups >= 6, "{writes} writes, {checks} checks, {hiccups} hiccups");
    assert!(
        not_ready.is_empty(),
        "{} of {checks} checks said not ready: {:?}",
        not_ready.len(),
        &not_ready[..not_ready.len().min(5)]
    );
}

/// Waits up to 10 s for node `id` to stop on its own because `what`, with exit code 4 and the
/// logs naming `cause` (the operating system's words for the error).
fn assert_stops_on_its_disk(cluster: &mut Cluster, id: u64, what: &str, cause: &str) {
    let Some(status) = cluster.wait_exit(id, Duration::from_secs(10)) else {
        panic!("node {id} went on after {what}\n{}", cluster.logs());
    };
    let logs = cluster.logs();
    assert_eq!(status.code(), Some(EXIT_STORAGE_FAILED), "node {id} after {what}: {status}\n{logs}");
    assert!(logs.contains(cause), "the logs name the cause ({cause})\n{logs}");
}

/// A leader sends its entries to the followers while it flushes them, and counts as committed
/// (and applies, and answers) only what is on its own disk. The leader's `fsync`s are stalled
/// for real (a preloaded library makes them wait while a file exists) for longer than an
/// election timeout: the followers receive the write meanwhile, the leader neither commits nor
/// applies nor answers it, goes on leading (its heartbeats do not wait for its disk), and
/// answers once its disk is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_disk_stalls_replicates_but_applies_nothing_until_it_has_flushed() {
    // With the watch that hands leadership over off (`0`; the test below has it on): were `0`
    // taken as a bound of 0 ms, the leader would hand over as soon as its disk stalled.
    let (cluster, disks, leader) = cluster_with_faulty_disks(&["--max-log-fsync-ms", "0"]).await;
    assert_eq!(cluster.set(leader, "before", "v").await.unwrap().response, Response::Ok);
    let before = terms(&cluster).await;
    let followers: Vec<u64> = cluster.running().into_iter().filter(|id| *id != leader).collect();
    let last = cluster.status(leader).await.unwrap()["last_log_index"].as_u64().unwrap();

    std::fs::File::create(disks.stall(leader)).unwrap();
    let stalled_at = Instant::now();
    let cluster = Arc::new(cluster);
    let write = tokio::spawn({
        let cluster = cluster.clone();
        async move { cluster.set(leader, "during", "v").await }
    });
    let term = before[&leader];
    for id in &followers {
        loop {
            // In the leader's term: a new leader's first entry would raise the index too.
            let status = cluster.status(*id).await.unwrap();
            if status["last_log_index"].as_u64().unwrap() > last && status["term"].as_u64() == Some(term) {
                break;
            }
            assert!(
                stalled_at.elapsed() < Duration::from_secs(5),
                "node {id} did not receive the write while the leader's disk stalled: {status}\n{}",
                cluster.logs()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    // Longer than an election timeout, with the write on both followers and not on the
    // leader's disk.
    while stalled_at.elapsed() < Duration::from_millis(1500) {
        let status = cluster.status(leader).await.unwrap();
        assert_eq!(
            status["role"],
            "leader",
            "the leader lost its leadership while its disk stalled\n{}",
            cluster.logs()
        );
        assert!(
            status["committed_index"].as_u64().unwrap() <= last && status["applied_index"].as_u64().unwrap() <= last,
            "the leader committed or applied an entry it has not flushed: {status}"
        );
        assert!(!write.is_finished(), "the write was answered before the leader flushed it");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    std::fs::remove_file(disks.stall(leader)).unwrap();
    let answer = write.await.unwrap().unwrap_or_else(|e| panic!("{e:?}\n{}", cluster.logs()));
    assert_eq!(answer.response, Response::Ok);
    assert_eq!(cluster.wait_leader().await, leader);
    assert_eq!(
        terms(&cluster).await,
        before,
        "an election happened while the leader's disk stalled\n{}",
        cluster.logs()
    );
    let applied = cluster.status(leader).await.unwrap()["applied_index"].as_u64().unwrap();
    assert!(applied > last);
    for id in cluster.running() {
        cluster.wait_applied(id, applied).await;
        assert_eq!(cluster.get_local(id, "during").await.unwrap().response, Response::Value(b"v".to_vec()));
    }
}

/// A leader whose disk does not return from `fsync` for longer than `--max-log-fsync-ms` (1 s
/// by default) hands leadership over: its heartbeats no longer wait for its disk, so without it
/// the followers would go on hearing a leader that cannot commit anything. It asks a follower
/// whose log holds its own to stand at once, and releases its lease on the other (it cannot
/// grant a vote itself: that is a synced write), so a follower stands at its request (not after
/// a lease without heartbeats) and wins in one term. Another node leads and takes writes while
/// the old leader's disk is still stalled; once it is back, the old leader follows and holds
/// the writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_disk_does_not_return_hands_leadership_over() {
    let (cluster, disks, old) = cluster_with_faulty_disks(&[]).await;
    let others: Vec<u64> = cluster.running().into_iter().filter(|id| *id != old).collect();
    let stood_on_request = |text: &str| elections_started(text, "handover");
    let mut asked_before = BTreeMap::new();
    for id in &others {
        asked_before.insert(*id, stood_on_request(&cluster.metrics(*id).await));
    }
    let term = terms(&cluster).await[&old];
    std::fs::File::create(disks.stall(old)).unwrap();
    let stalled_at = Instant::now();
    // A write starts the fsync that does not return (an idle leader has nothing to flush). Its
    // answer is not known in advance: the entry reached the followers, and the next leader may
    // commit it.
    let cluster = Arc::new(cluster);
    let stuck = tokio::spawn({
        let cluster = cluster.clone();
        async move { cluster.set(old, "during-stall", "v").await }
    });
    let new = 'elected: loop {
        for id in &others {
            if cluster.status(*id).await.is_some_and(|status| status["role"] == "leader") {
                break 'elected *id;
            }
        }
        assert!(stalled_at.elapsed() < DEADLINE, "no other node took over\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    println!("node {new} led {} ms after node {old}'s disk stalled", stalled_at.elapsed().as_millis());
    assert_eq!(
        stood_on_request(&cluster.metrics(new).await),
        asked_before[&new] + 1.0,
        "node {new} did not stand at node {old}'s request\n{}",
        cluster.logs()
    );
    let status = cluster.status(new).await.unwrap();
    assert_eq!(status["term"].as_u64(), Some(term + 1), "node {new} won in the next term: {status}");
    let answer = cluster.set(new, "after-stall", "v").await;
    assert!(
        answer.as_ref().is_ok_and(|answer| answer.response == Response::Ok),
        "the new leader, node {new}, did not take a write while node {old}'s disk stalled: {answer:?}\n{}",
        cluster.logs()
    );
    let logs = cluster.logs();
    assert!(logs.contains("this node's disk does not return"), "node {old} did not say why it handed over\n{logs}");

    std::fs::remove_file(disks.stall(old)).unwrap();
    let stuck = stuck.await.unwrap();
    assert!(
        !matches!(&stuck, Ok(answer) if answer.response != Response::Ok),
        "the write on the stalled leader was refused outright: {stuck:?}"
    );
    assert_eq!(cluster.wait_leader().await, new, "{}", cluster.logs());
    let applied = cluster.status(new).await.unwrap()["applied_index"].as_u64().unwrap();
    for id in cluster.running() {
        cluster.wait_applied(id, applied).await;
        assert_eq!(cluster.get_local(id, "after-stall").await.unwrap().response, Response::Value(b"v".to_vec()));
    }
    // Whatever became of the write on the stalled leader, every node agrees on it.
    let during = cluster.get_local(new, "during-stall").await.unwrap().response;
    for id in cluster.running() {
        assert_eq!(cluster.get_local(id, "during-stall").await.unwrap().response, during, "node {id}");
    }
}

/// A node whose log `fsync` fails (`EIO`, as from a disk that lost a write) stops at once: what
/// it appended may not be on its disk, so it must not count it towards a quorum, apply it or
/// answer it, and a later `fsync` that succeeds proves nothing about the pages the failed one
/// dropped. A follower stops and the others go on; the leader stops without answering the write
/// whose flush failed, and another node leads. Each comes back once its disk is healthy again,
/// and every node agrees on every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_log_fsync_fails_stops_and_the_others_go_on() {
    let (mut cluster, disks, leader) = cluster_with_faulty_disks(&[]).await;
    let follower = cluster.running().into_iter().find(|id| *id != leader).unwrap();

    std::fs::File::create(disks.fail(follower)).unwrap();
    let answer = cluster.set(leader, "follower-failed", "v").await;
    assert!(
        answer.as_ref().is_ok_and(|answer| answer.response == Response::Ok),
        "a write with one follower's disk failing: {answer:?}\n{}",
        cluster.logs()
    );
    assert_stops_on_its_disk(&mut cluster, follower, "its log fsync failed", "Input/output error");
    assert_eq!(cluster.set(leader, "follower-gone", "v").await.unwrap().response, Response::Ok);
    std::fs::remove_file(disks.fail(follower)).unwrap();
    cluster.spawn(follower);

    std::fs::File::create(disks.fail(leader)).unwrap();
    let answer = cluster.set(leader, "leader-failed", "v").await;
    assert!(
        !answer.as_ref().is_ok_and(|answer| answer.response == Response::Ok),
        "the leader acknowledged a write whose flush failed: {answer:?}"
    );
    assert_stops_on_its_disk(&mut cluster, leader, "its log fsync failed as it led", "Input/output error");
    let new = cluster.wait_leader().await;
    assert_ne!(new, leader);
    assert_eq!(cluster.set(new, "leader-gone", "v").await.unwrap().response, Response::Ok);

    std::fs::remove_file(disks.fail(leader)).unwrap();
    cluster.spawn(leader);
    let applied = cluster.status(new).await.unwrap()["applied_index"].as_u64().unwrap();
    for id in 1..=3 {
        cluster.wait_applied(id, applied).await;
        for key in ["follower-failed", "follower-gone", "leader-gone"] {
            assert_eq!(
                cluster.get_local(id, key).await.unwrap().response,
                Response::Value(b"v".to_vec()),
                "{key} on {id}"
            );
        }
    }
    // The write whose flush failed on the leader was not answered; it may have been committed
    // by the others since (it reached them), but every node agrees on it.
    let unanswered = cluster.get_local(new, "leader-failed").await.unwrap().response;
    for id in 1..=3 {
        assert_eq!(cluster.get_local(id, "leader-failed").await.unwrap().response, unanswered, "node {id}");
    }
}

/// A full disk refuses new space (an append, a write past a file's end, an allocation) while
/// the space a node already has (its preallocated Raft log segment) still takes writes. A node
/// whose disk fills stops with exit code 4, its log naming "No space left on device", once it
/// needs space (at the latest when asked to snapshot, which flushes its tables); started again
/// on the full disk it stops the same way at once. Nothing acknowledged is lost: once space is
/// freed it starts and catches up, and all three agree. First a follower's disk fills, then the
/// leader's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_disk_fills_stops_and_the_others_go_on() {
    let (mut cluster, disks, leader) = cluster_with_faulty_disks(&[]).await;
    let follower = cluster.running().into_iter().find(|id| *id != leader).unwrap();
    let mut acknowledged = Vec::new();
    for full in [follower, leader] {
        let leading = cluster.wait_leader().await;
        std::fs::File::create(disks.full(full)).unwrap();
        // A follower's full disk stops no write; the leader's may, and then the write is not
        // acknowledged.
        for i in 0..20 {
            let key = format!("node-{full}-full-{i}");
            match cluster.set(leading, &key, "v").await {
                Ok(answer) if answer.response == Response::Ok => acknowledged.push(key),
                answer => {
                    assert_eq!(leading, full, "{key} on node {leading}: {answer:?}\n{}", cluster.logs());
                    break;
                }
            }
        }
        let snapshot = cluster.http.post(format!("{}/cluster/snapshot", cluster.url(full))).send().await;
        let what = format!("its disk filled (snapshot: {snapshot:?})");
        assert_stops_on_its_disk(&mut cluster, full, &what, "No space left on device");
        let leading = cluster.wait_leader().await;
        let key = format!("node-{full}-stopped");
        assert_eq!(cluster.set(leading, &key, "v").await.unwrap().response, Response::Ok, "{key}");
        acknowledged.push(key);

        cluster.spawn(full);
        assert_stops_on_its_disk(&mut cluster, full, "it started on a full disk", "is full: starting the node");

        std::fs::remove_file(disks.full(full)).unwrap();
        cluster.spawn(full);
        let applied = cluster.status(leading).await.unwrap()["applied_index"].as_u64().unwrap();
        cluster.wait_applied(full, applied).await;
    }
    for id in 1..=3 {
        for key in &acknowledged {
            assert_eq!(
                cluster.get_local(id, key).await.unwrap().response,
                Response::Value(b"v".to_vec()),
                "{key} on {id}"
            );
        }
    }
}
