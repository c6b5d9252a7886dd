//! Snapshots, learners, promotion and removal on real node processes.

mod common;

use std::time::{Duration, Instant};

use common::{metric, Cluster, DEADLINE};
use statestore_protocol::Response;
use statestore_raft::election::StandResponse;

/// Snapshot after 40 entries and keep no log below it, so a node that misses more than that can
/// only catch up from a snapshot.
const SNAPSHOT_OFTEN: &[&str] = &["--snapshot-every", "40", "--logs-kept", "0"];

async fn write_keys(cluster: &Cluster, prefix: &str, count: usize) -> Vec<(String, String)> {
    let mut written = Vec::new();
    for i in 0..count {
        let key = format!("{prefix}-{i}");
        let answer = cluster.set_anywhere(&key, &format!("value of {key}"), DEADLINE).await;
        written.push((key, answer.version.unwrap()));
    }
    written
}

async fn assert_local_state(cluster: &Cluster, id: u64, written: &[(String, String)]) {
    for (key, version) in written {
        let local = cluster.get_local(id, key).await.unwrap();
        assert_eq!(local.response, Response::Value(format!("value of {key}").into_bytes()), "{key} on node {id}");
        assert_eq!(local.version.as_ref(), Some(version), "{key} on node {id}");
    }
}

async fn wait_purged_past(cluster: &Cluster, id: u64, index: u64) {
    let until = Instant::now() + DEADLINE;
    while cluster.status(id).await.unwrap()["purged_index"].as_u64().unwrap() <= index {
        assert!(Instant::now() < until, "node {id} never purged past {index}\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_missed_purged_log_catches_up_from_a_snapshot_and_restarts_with_the_same_state() {
    let mut cluster = Cluster::start(3, SNAPSHOT_OFTEN).await;
    let mut written = write_keys(&cluster, "early", 10).await;
    let leader = cluster.wait_leader().await;
    let down = cluster.running().into_iter().find(|id| *id != leader).unwrap();
    let down_index = cluster.status(down).await.unwrap()["last_log_index"].as_u64().unwrap();
    cluster.kill(down);

    written.extend(write_keys(&cluster, "missed", 150).await);
    let leader = cluster.wait_leader().await;
    wait_purged_past(&cluster, leader, down_index).await;
    assert!(metric(&cluster.metrics(leader).await, "statestore_snapshots_total").unwrap() >= 1.0);

    cluster.spawn(down);
    let leader_applied = cluster.status(leader).await.unwrap()["applied_index"].as_u64().unwrap();
    cluster.wait_applied(down, leader_applied).await;
    let metrics = cluster.metrics(down).await;
    let installed = metric(&metrics, "statestore_snapshots_total{kind=\"installed\"}").unwrap_or(0.0);
    assert!(installed >= 1.0, "node {down} caught up without installing a snapshot:\n{metrics}");
    assert_local_state(&cluster, down, &written).await;

    // Restart it from its snapshot plus the log after it: the same state.
    written.extend(write_keys(&cluster, "after", 5).await);
    let leader_applied = cluster.status(cluster.wait_leader().await).await.unwrap()["applied_index"].as_u64().unwrap();
    cluster.wait_applied(down, leader_applied).await;
    assert!(cluster.terminate(down).success());
    cluster.spawn(down);
    cluster.wait_applied(down, leader_applied).await;
    assert_local_state(&cluster, down, &written).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_receives_a_snapshot_of_many_chunks_whole_at_its_install_rate() {
    // About 12 MiB of state: the snapshot goes out in several 3 MiB chunks, and the receiver
    // writes out what it received every MiB, so both boundaries are crossed several times. The
    // learner holds what it writes to 4 MiB/s (`--snapshot-install-rate`).
    let mut cluster = Cluster::start(3, SNAPSHOT_OFTEN).await;
    let mut written = Vec::new();
    for i in 0..48 {
        let key = format!("large-{i}");
        let value = format!("{i:04}").repeat(64 * 1024);
        let answer = cluster.set_anywhere(&key, &value, DEADLINE).await;
        written.push((key, value, answer.version.unwrap()));
    }
    // The leader snapshots all of it (its own threshold depends on its id) and purges its log.
    let leader = cluster.wait_leader().await;
    let applied = cluster.status(leader).await.unwrap()["applied_index"].as_u64().unwrap();
    let response = cluster.http.post(format!("{}/cluster/snapshot", cluster.url(leader))).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 202);
    cluster.wait_snapshot_covering(leader, applied).await;
    wait_purged_past(&cluster, leader, 1).await;

    cluster.start_new_node_with(4, &["--snapshot-install-rate", "4194304"]);
    let added = cluster.add_learner(leader, 4).send().await.unwrap();
    assert_eq!(added.status(), 200, "{}", added.text().await.unwrap());
    let applied = cluster.status(leader).await.unwrap()["applied_index"].as_u64().unwrap();
    cluster.wait_applied(4, applied).await;
    let metrics = cluster.metrics(4).await;
    let installed = metric(&metrics, "statestore_snapshots_total{kind=\"installed\"}").unwrap_or(0.0);
    assert!(installed >= 1.0, "node 4 caught up without installing a snapshot:\n{metrics}");
    // Its 12 MiB and more came in no faster than 4 MiB/s: the write-out after the 12th MiB
    // waits until 3 s after the first chunk.
    let log = std::fs::read_to_string(&cluster.nodes[&4].log).unwrap();
    let received = log.lines().find(|line| line.contains("received a snapshot from the leader"));
    let received_s = received
        .and_then(|line| line.split("received_s").nth(1))
        .map(|rest| rest.trim_start_matches(['=', '"', ':', ' ']))
        .and_then(|rest| rest.split(|c: char| !(c.is_ascii_digit() || c == '.')).next())
        .and_then(|secs| secs.parse::<f64>().ok());
    assert!(
        received_s.is_some_and(|secs| secs >= 2.5),
        "node 4 received the snapshot in {received_s:?} s at 4 MiB/s: {received:?}"
    );
    // A learner does not stand for election, even at its leader's request.
    let asked = cluster.ask_to_stand(4, cluster.leadership_vote(leader).await, None).await;
    assert!(
        matches!(&asked, StandResponse::Refused(why) if why.contains("not a voter")),
        "learner 4 refuses to stand: {asked:?}"
    );
    for (key, value, version) in &written {
        let local = cluster.get_local(4, key).await.unwrap();
        assert_eq!(local.response, Response::Value(value.clone().into_bytes()), "{key} on node 4");
        assert_eq!(local.version.as_ref(), Some(version), "{key} on node 4");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_joins_a_loaded_cluster_is_promoted_and_a_member_is_removed() {
    let mut cluster = Cluster::start(3, SNAPSHOT_OFTEN).await;
    let mut written = write_keys(&cluster, "load", 120).await;
    let leader = cluster.wait_leader().await;

    cluster.start_new_node(4);
    let added = cluster.add_learner(leader, 4).send().await.unwrap();
    assert_eq!(added.status(), 200, "{}", added.text().await.unwrap());
    let added: serde_json::Value = added.json().await.unwrap();
    assert_eq!(added["caught_up"], true);
    let status = cluster.status(leader).await.unwrap();
    assert_eq!(status["learners"][0]["id"], 4);
    // Caught up means it has the log; applying it may take a moment longer.
    cluster.wait_applied(4, status["applied_index"].as_u64().unwrap()).await;
    assert_local_state(&cluster, 4, &written).await;

    let promoted = cluster.change_members(leader, serde_json::json!({"promote": [4]})).send().await.unwrap();
    assert_eq!(promoted.status(), 200);
    let status: serde_json::Value = promoted.json().await.unwrap();
    let voters: Vec<u64> = status["voters"].as_array().unwrap().iter().map(|m| m["id"].as_u64().unwrap()).collect();
    assert_eq!(voters, vec![1, 2, 3, 4]);
    assert!(status["learners"].as_array().unwrap().is_empty());

    // Remove the leader itself: the rest elect a new one and keep working.
    let removed = cluster.change_members(leader, serde_json::json!({"remove": [leader]})).send().await.unwrap();
    assert_eq!(removed.status(), 200);
    cluster.kill(leader);
    let new_leader = cluster.wait_leader().await;
    assert_ne!(new_leader, leader);
    let status = cluster.status(new_leader).await.unwrap();
    let voters: Vec<u64> = status["voters"].as_array().unwrap().iter().map(|m| m["id"].as_u64().unwrap()).collect();
    assert!(!voters.contains(&leader) && voters.len() == 3, "{voters:?}");
    written.extend(write_keys(&cluster, "after-removal", 20).await);
    let applied = cluster.status(new_leader).await.unwrap()["applied_index"].as_u64().unwrap();
    for id in cluster.running() {
        cluster.wait_applied(id, applied).await;
        assert_local_state(&cluster, id, &written).await;
    }
}

/// The appends streams the leader opened to `peer` and the requests to it that failed, from the
/// leader's metrics `text`.
fn streams_and_failures(text: &str, peer: u64) -> (f64, f64) {
    let count = |name: &str| metric(text, &format!("{name}{{peer=\"{peer}\"}}")).unwrap_or(0.0);
    (count("statestore_raft_append_streams_opened_total"), count("statestore_raft_peer_request_failures_total"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_changes_keep_the_leaders_streams_to_the_members_they_keep() {
    let mut cluster = Cluster::start(3, &[]).await;
    let mut written = write_keys(&cluster, "before", 20).await;
    let leader = cluster.wait_leader().await;
    let followers: Vec<u64> = cluster.running().into_iter().filter(|id| *id != leader).collect();
    let before = cluster.metrics(leader).await;
    for &follower in &followers {
        assert!(streams_and_failures(&before, follower).0 >= 1.0, "no appends stream to node {follower}\n{before}");
    }

    // Three membership changes: a learner joins, then is promoted (a joint and a final config).
    cluster.start_new_node(4);
    let added = cluster.add_learner(leader, 4).send().await.unwrap();
    assert_eq!(added.status(), 200, "{}", added.text().await.unwrap());
    written.extend(write_keys(&cluster, "with-a-learner", 20).await);
    let promoted = cluster.change_members(leader, serde_json::json!({"promote": [4]})).send().await.unwrap();
    assert_eq!(promoted.status(), 200, "{}", promoted.text().await.unwrap());
    written.extend(write_keys(&cluster, "with-four-voters", 20).await);

    assert_eq!(cluster.wait_leader().await, leader, "the leader changed: its streams were replaced anyway");
    let after = cluster.metrics(leader).await;
    for &follower in &followers {
        let (opened_before, failed_before) = streams_and_failures(&before, follower);
        let (opened_after, failed_after) = streams_and_failures(&after, follower);
        let (opened, failed) = (opened_after - opened_before, failed_after - failed_before);
        assert!(
            opened <= failed,
            "the leader opened {opened} appends streams to node {follower} during the membership changes, \
             with {failed} requests to it failed: a stream was replaced without failing\n{}",
            cluster.logs()
        );
    }
    assert!(streams_and_failures(&after, 4).0 >= 1.0, "no appends stream to the new node\n{after}");
    let applied = cluster.status(leader).await.unwrap()["applied_index"].as_u64().unwrap();
    for id in cluster.running() {
        cluster.wait_applied(id, applied).await;
        assert_local_state(&cluster, id, &written).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_are_taken_by_log_bytes_and_on_request() {
    // The entry count alone would never trigger one.
    let cluster = Cluster::start(3, &["--snapshot-every", "1000000", "--snapshot-log-bytes", "262144"]).await;
    let leader = cluster.wait_leader().await;
    for id in 1..=3 {
        assert_eq!(cluster.status(id).await.unwrap()["snapshot_index"].as_u64(), Some(0), "node {id}");
    }
    // 40 values of 16 KiB: 640 KiB of log, past the 256 KiB limit, in far fewer entries.
    let value = "x".repeat(16 << 10);
    for i in 0..40 {
        let answer = cluster.set_anywhere(&format!("big-{i}"), &value, DEADLINE).await;
        assert_eq!(answer.response, Response::Ok);
    }
    for id in 1..=3 {
        cluster.wait_snapshot_covering(id, 1).await;
    }

    // On request, on a follower: it snapshots what it has applied since, even when a build
    // triggered by bytes is still running and ends below that.
    cluster.set_anywhere("one-more", "v", DEADLINE).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let committed = cluster.status(leader).await.unwrap()["committed_index"].as_u64().unwrap();
    cluster.wait_applied(follower, committed).await;
    let url = format!("{}/cluster/snapshot", cluster.url(follower));
    let response = cluster.http.post(url).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 202);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["requested"], true);
    assert!(body["applied_index"].as_u64().unwrap() >= committed, "{body}");
    cluster.wait_snapshot_covering(follower, committed).await;
    let metrics = cluster.metrics(follower).await;
    assert!(metric(&metrics, "statestore_snapshots_total{kind=\"built\"}").unwrap() >= 2.0, "{metrics}");
}

/// A learner at an address where nothing runs is never "caught up", and promoting it (which
/// would make a voter that cannot vote) is refused with the reason; the membership stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_that_never_answered_is_neither_caught_up_nor_promoted() {
    let cluster = Cluster::start(3, &[]).await;
    write_keys(&cluster, "before", 20).await;
    let leader = cluster.wait_leader().await;
    let nowhere = format!("http://127.0.0.1:{}", common::free_port());
    let added = cluster
        .http
        .post(format!("{}/cluster/learners", cluster.url(leader)))
        .json(&serde_json::json!({"id": 9, "address": nowhere, "timeout_ms": 2000}))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 202, "still catching up");
    let added: serde_json::Value = added.json().await.unwrap();
    assert_eq!(added["caught_up"], false, "{added}");

    let promoted = cluster.change_members(leader, serde_json::json!({"promote": [9]})).send().await.unwrap();
    assert_eq!(promoted.status(), 409);
    let body: serde_json::Value = promoted.json().await.unwrap();
    assert_eq!(body["code"], "learner_behind", "{body}");
    assert!(body["message"].as_str().unwrap().contains(&nowhere), "names the address: {body}");
    let status = cluster.status(leader).await.unwrap();
    let voters: Vec<u64> = status["voters"].as_array().unwrap().iter().map(|m| m["id"].as_u64().unwrap()).collect();
    assert_eq!(voters, vec![1, 2, 3], "the membership is unchanged");
    write_keys(&cluster, "after", 20).await;
}

/// A node whose data directory was wiped and that comes back with the same id has lost its log
/// and the vote it cast: it must take no part until it is removed and added back as a new
/// learner, which enrolls its new storage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_node_reusing_its_id_is_refused_until_added_back_as_a_learner() {
    let mut cluster = Cluster::start(3, &[]).await;
    let written = write_keys(&cluster, "before-wipe", 20).await;
    let leader = cluster.wait_leader().await;
    let wiped = if leader == 3 { 2 } else { 3 };
    let until = Instant::now() + DEADLINE;
    loop {
        let status = cluster.status(leader).await.unwrap();
        if status["enrolled"].as_object().is_some_and(|enrolled| enrolled.len() == 3)
            && status["cluster_id"].is_string()
        {
            break;
        }
        assert!(Instant::now() < until, "the members were never enrolled: {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let old_incarnation = cluster.status(wiped).await.unwrap()["incarnation"].as_str().unwrap().to_string();

    cluster.kill(wiped);
    std::fs::remove_dir_all(&cluster.nodes[&wiped].data_dir).unwrap();
    cluster.spawn(wiped);
    let ready = |id: u64| {
        let (http, url) = (cluster.http.clone(), cluster.url(id));
        async move { http.get(format!("{url}/ready")).send().await.map(|r| r.status().as_u16()).unwrap_or(0) }
    };
    let watch_until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < watch_until {
        if let Some(status) = cluster.status(wiped).await {
            assert_ne!(
                status["incarnation"].as_str(),
                Some(old_incarnation.as_str()),
                "a wiped directory is new storage"
            );
            assert_eq!(status["applied_index"], 0, "the wiped node was given the log: {status}");
        }
        assert_ne!(ready(wiped).await, 200, "the wiped node is ready\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(cluster.logs().contains("remove node"), "nobody said why the node is refused\n{}", cluster.logs());

    // The documented recovery: remove it, add it back as a learner, promote it.
    let post = |path: &str, body: serde_json::Value| {
        cluster.http.post(format!("{}{path}", cluster.url(leader))).json(&body).send()
    };
    let removed = post("/cluster/members", serde_json::json!({"remove": [wiped]})).await.unwrap();
    assert_eq!(removed.status(), 200, "{}", removed.text().await.unwrap());
    let added =
        post("/cluster/learners", serde_json::json!({"id": wiped, "address": cluster.url(wiped)})).await.unwrap();
    assert_eq!(added.status(), 200, "{}", added.text().await.unwrap());
    let promoted = post("/cluster/members", serde_json::json!({"promote": [wiped]})).await.unwrap();
    assert_eq!(promoted.status(), 200, "{}", promoted.text().await.unwrap());
    let applied = cluster.status(leader).await.unwrap()["applied_index"].as_u64().unwrap();
    cluster.wait_applied(wiped, applied).await;
    assert_local_state(&cluster, wiped, &written).await;
    cluster.wait_ready().await;
}

/// A leader that removes itself and keeps running (as an operator retires a node: remove, then
/// stop it) hands over: the remaining voters (a newly promoted one among them) elect a leader
/// among themselves within a few election timeouts and serve writes, while the removed node is
/// still up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_removes_itself_and_keeps_running_hands_over() {
    let mut cluster = Cluster::start(3, &[]).await;
    let old = cluster.wait_leader().await;
    // As docs/operations.md does it: grow to four voters first, then retire the leader.
    cluster.start_new_node(4);
    for (path, body) in [
        ("/cluster/learners", serde_json::json!({"id": 4, "address": cluster.url(4)})),
        ("/cluster/members", serde_json::json!({"promote": [4]})),
    ] {
        let answer = cluster.http.post(format!("{}{path}", cluster.url(old))).json(&body).send().await.unwrap();
        assert_eq!(answer.status(), 200, "{path}: {}", answer.text().await.unwrap());
    }
    let rest: Vec<u64> = cluster.running().into_iter().filter(|id| *id != old).collect();
    let removed = cluster.change_members(old, serde_json::json!({"remove": [old]})).send().await.unwrap();
    assert_eq!(removed.status(), 200, "{}", removed.text().await.unwrap());
    let removed_at = Instant::now();
    let until = removed_at + Duration::from_secs(5);
    let new = 'elected: loop {
        for id in &rest {
            let status = cluster.status(*id).await.unwrap();
            if status["role"] == "leader" {
                break 'elected *id;
            }
        }
        assert!(
            Instant::now() < until,
            "5 s after node {old} removed itself, neither of {rest:?} leads\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let elected_after = removed_at.elapsed();
    let answer = cluster.set(new, "after-removal", "v").await.expect("the new leader serves writes");
    assert_eq!(answer.response, Response::Ok);
    let status = cluster.status(new).await.unwrap();
    let voters: Vec<u64> = status["voters"].as_array().unwrap().iter().map(|m| m["id"].as_u64().unwrap()).collect();
    assert_eq!(voters, rest, "{status}");
    eprintln!("a new leader {elected_after:?} after the old one removed itself");
}

/// Adding a learner waits for it to catch up (30 s by default). A node told to stop meanwhile
/// stops within its HTTP drain time (5 s) instead of waiting the catch-up out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_node_does_not_wait_out_a_learner_that_is_catching_up() {
    let mut cluster = Cluster::start(1, &[]).await;
    write_keys(&cluster, "load", 5).await;
    cluster.start_new_node(2);
    let serving = Instant::now();
    while !cluster.http.get(format!("{}/health", cluster.url(2))).send().await.is_ok_and(|r| r.status().is_success()) {
        assert!(serving.elapsed() < DEADLINE, "node 2 does not serve\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    cluster.signal(2, "STOP");
    let add = cluster.add_learner(1, 2).timeout(Duration::from_secs(60)).send();
    let add = tokio::spawn(add);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!add.is_finished(), "the add waits for the stopped learner");
    let stopping = Instant::now();
    let status = cluster.terminate(1);
    let took = stopping.elapsed();
    cluster.signal(2, "CONT");
    assert!(status.success(), "{status}\n{}", cluster.logs());
    assert!(took < Duration::from_secs(8), "stopping took {took:?}\n{}", cluster.logs());
    add.abort();
}
