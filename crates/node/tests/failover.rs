//! Failover under traffic with the official SDK: clients write and read continuously while the
//! leader is killed with SIGKILL and later restarted. After the new election every call succeeds
//! again, every acknowledged write is there with the version it was acknowledged with (applied
//! once), each writer's versions only grow, and notifications for an observed key resume.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use azure_iot_operations_protocol::common::hybrid_logical_clock::HybridLogicalClock as Hlc;
use azure_iot_operations_services::state_store::{Operation, SetOptions};
use common::broker::Broker;
use common::sdk::{unique_client_id, SdkSession};
use common::{elections_started, Cluster, DEADLINE};
use openraft::CommittedLeaderId;
use statestore_node::node::HANDOVER_DEADLINE;
use statestore_node::server::HTTP_DRAIN;
use statestore_protocol::{Response, Set};
use statestore_raft::election::StandResponse;
use statestore_raft::types::{LogId, Vote};

const WRITERS: usize = 4;
/// Each call's timeout: short, so a call that the dead leader swallowed fails fast and the
/// writer goes on.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Default)]
struct History {
    /// key → (value, version) of every acknowledged SET.
    acknowledged: BTreeMap<String, (String, Hlc)>,
    /// Each writer's acknowledged versions, in the order acknowledged.
    versions: Vec<Vec<Hlc>>,
    /// (writer, started, succeeded) for every call.
    calls: Vec<(usize, Instant, bool)>,
}

fn order(version: &Hlc) -> (SystemTime, u64) {
    (version.timestamp, version.counter)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sdk_clients_ride_through_a_leader_kill_and_restart() {
    let broker = Broker::start();
    let mut cluster = Cluster::start(3, &["--broker", &broker.address()]).await;
    cluster.wait_ready().await;

    let observer = SdkSession::connect(broker.port, &unique_client_id("observer")).await;
    let observer_store = observer.state_store();
    let mut observation = observer_store.observe(b"watched".to_vec(), CALL_TIMEOUT).await.expect("observe").response;
    let notified = Arc::new(Mutex::new(Vec::<(Instant, Vec<u8>)>::new()));
    let notified_task = {
        let notified = notified.clone();
        tokio::spawn(async move {
            while let Some((notification, _)) = observation.recv_notification().await {
                if let Operation::Set(value) = notification.operation {
                    notified.lock().unwrap().push((Instant::now(), value));
                }
            }
        })
    };

    let history = Arc::new(Mutex::new(History { versions: vec![Vec::new(); WRITERS], ..History::default() }));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut sessions = Vec::new();
    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let session = SdkSession::connect(broker.port, &unique_client_id(&format!("writer{writer}"))).await;
        let store = session.state_store();
        sessions.push(session);
        let (history, stop) = (history.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                let key = format!("w{writer}-{n}");
                let value = format!("value-{n}");
                let started = Instant::now();
                let set = store
                    .set(
                        key.clone().into_bytes(),
                        value.clone().into_bytes(),
                        CALL_TIMEOUT,
                        None,
                        SetOptions::default(),
                    )
                    .await;
                let ok = matches!(&set, Ok(r) if r.response && r.version.is_some());
                if ok {
                    // Reads go through the same client: each must see the write just made.
                    let got = store.get(key.clone().into_bytes(), CALL_TIMEOUT).await;
                    let read_ok = matches!(&got, Ok(r) if r.response.as_deref() == Some(value.as_bytes()));
                    let version = set.unwrap().version.unwrap();
                    let mut h = history.lock().unwrap();
                    h.acknowledged.insert(key, (value.clone(), version.clone()));
                    h.versions[writer].push(version);
                    h.calls.push((writer, started, read_ok));
                } else {
                    history.lock().unwrap().calls.push((writer, started, false));
                }
                if writer == 0 && n.is_multiple_of(5) {
                    let _ = store
                        .set(b"watched".to_vec(), value.into_bytes(), CALL_TIMEOUT, None, SetOptions::default())
                        .await;
                }
            }
        }));
    }

    tokio::time::sleep(Duration::from_secs(2)).await;
    let leader = cluster.wait_leader().await;
    let killed_at = Instant::now();
    cluster.kill(leader);
    tokio::time::sleep(Duration::from_secs(5)).await;
    cluster.spawn(leader);
    let restarted_at = Instant::now();
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for writer in writers {
        writer.await.unwrap();
    }
    cluster.wait_ready().await;

    let history = Arc::try_unwrap(history).ok().unwrap().into_inner().unwrap();
    // The write gap: from the kill to each writer's first success after it.
    let settled_after = killed_at + Duration::from_secs(3);
    for writer in 0..WRITERS {
        let calls: Vec<&(usize, Instant, bool)> = history.calls.iter().filter(|c| c.0 == writer).collect();
        assert!(calls.iter().any(|c| c.1 < killed_at && c.2), "writer {writer} succeeded before the kill");
        let late: Vec<_> = calls.iter().filter(|c| c.1 >= settled_after).collect();
        assert!(!late.is_empty(), "writer {writer} kept calling after the election\n{}", cluster.logs());
        assert!(
            late.iter().all(|c| c.2),
            "writer {writer}: every call from 3 s after the kill succeeds ({} of {} failed)\n{}",
            late.iter().filter(|c| !c.2).count(),
            late.len(),
            cluster.logs()
        );
        let first_after = calls.iter().find(|c| c.1 >= killed_at && c.2).map(|c| c.1 - killed_at);
        eprintln!("writer {writer}: first success {first_after:?} after the kill");
    }
    for (writer, versions) in history.versions.iter().enumerate() {
        for pair in versions.windows(2) {
            assert!(
                order(&pair[0]) < order(&pair[1]),
                "writer {writer}: versions grow: {:?} then {:?}",
                pair[0],
                pair[1]
            );
        }
    }

    // Every acknowledged write is present with the version it was acknowledged with.
    let checker = SdkSession::connect(broker.port, &unique_client_id("checker")).await;
    let store = checker.state_store();
    assert!(history.acknowledged.len() > 20, "enough writes: {}", history.acknowledged.len());
    for (key, (value, version)) in &history.acknowledged {
        let got = store.get(key.clone().into_bytes(), CALL_TIMEOUT).await.expect("GET after the failover");
        assert_eq!(got.response.as_deref(), Some(value.as_bytes()), "{key} is present");
        assert_eq!(got.version.as_ref().map(order), Some(order(version)), "{key} was applied once");
    }

    // Notifications for the observed key resumed once the restarted node was back.
    let resumed = notified.lock().unwrap().iter().filter(|(at, _)| *at > restarted_at).count();
    assert!(resumed > 0, "notifications for the observed key resume after the failover\n{}", cluster.logs());
    notified_task.abort();
    for session in sessions {
        session.close().await;
    }
    checker.close().await;
    drop(observer_store);
    observer.close().await;
}

/// A leader stopped with SIGTERM (a rolling restart, `docker compose stop`) hands leadership to
/// a follower whose log matches its own: that follower stands at once, without the pre-vote it
/// would hold after the leader's lease, and every SDK call made meanwhile succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_stopped_with_sigterm_hands_leadership_over() {
    let (_broker, mut cluster, writers, leader, before) = writing_cluster(3).await;
    // A request to stand that does not come from the leadership a voter follows is refused,
    // and so is one from that leadership whose log goes beyond the voter's.
    let follower = before.keys().copied().next().unwrap();
    let stale = cluster.ask_to_stand(follower, Vote::new_committed(1_000, leader), None).await;
    assert!(
        matches!(&stale, StandResponse::Refused(why) if why.contains("not the leadership")),
        "node {follower} refuses to stand for a leadership it does not follow: {stale:?}"
    );
    let vote = cluster.leadership_vote(leader).await;
    let ahead = Some(LogId::new(CommittedLeaderId::new(vote.leader_id().term, leader), u64::MAX / 2));
    let behind = cluster.ask_to_stand(follower, vote, ahead).await;
    assert!(
        matches!(&behind, StandResponse::Refused(why) if why.contains("before the leader's")),
        "node {follower} refuses to stand with a log that lacks the leader's last entry: {behind:?}"
    );

    let stopped_at = Instant::now();
    let status = cluster.terminate(leader);
    let stopped_in = stopped_at.elapsed();
    assert!(status.success(), "the leader stopped cleanly: {status:?}\n{}", cluster.logs());
    let successor = cluster.wait_leader().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let calls = writers.stop().await;

    assert_handed_over(&cluster, leader, successor, &before).await;

    let (first, gap) = every_call_succeeded(&calls, stopped_at, &cluster);
    eprintln!("the leader stopped in {stopped_in:?}; first answer {first:?} after the SIGTERM, longest gap {gap:?}");
}

/// With five voters a stopping leader's vote and its successor's are not a quorum, and the
/// other voters still hear its lease: it first asks them to release the lease, so that they
/// grant the successor's vote request. It hands over as with three voters, without the
/// pre-vote and election timeout of a leader loss, and every SDK call made meanwhile succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopping_leader_of_five_voters_hands_leadership_over() {
    let (_broker, mut cluster, writers, leader, before) = writing_cluster(5).await;

    let stopped_at = Instant::now();
    let status = cluster.terminate(leader);
    let stopped_in = stopped_at.elapsed();
    assert!(status.success(), "the leader stopped cleanly: {status:?}\n{}", cluster.logs());
    let successor = cluster.wait_leader().await;
    let elected_in = stopped_at.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let calls = writers.stop().await;

    assert_handed_over(&cluster, leader, successor, &before).await;
    let (first, gap) = every_call_succeeded(&calls, stopped_at, &cluster);
    eprintln!(
        "the leader stopped in {stopped_in:?}; node {successor} led {elected_in:?} after the SIGTERM; \
         first answer {first:?} after it, longest gap {gap:?}"
    );
}

/// Five voters, one of them paused (SIGSTOP): it cannot answer the stopping leader's lease
/// release, but the two other voters release the lease, and with the successor's vote and the
/// leader's they are a quorum. The leader hands over all the same, and every SDK call made
/// meanwhile succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopping_leader_of_five_voters_hands_over_while_a_voter_is_paused() {
    let (_broker, mut cluster, writers, leader, before) = writing_cluster(5).await;
    let paused = *cluster.running().iter().find(|id| **id != leader).unwrap();
    cluster.signal(paused, "STOP");
    // The paused voter falls behind the writes, so it is not the one asked to stand.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let stopped_at = Instant::now();
    let status = cluster.terminate(leader);
    assert!(status.success(), "the leader stopped cleanly: {status:?}\n{}", cluster.logs());
    let awake: Vec<u64> = cluster.running().into_iter().filter(|id| *id != paused).collect();
    let successor = leader_among(&cluster, &awake).await;
    let elected_in = stopped_at.elapsed();
    cluster.signal(paused, "CONT");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let calls = writers.stop().await;

    let log = std::fs::read_to_string(&cluster.nodes[&leader].log).unwrap();
    let unanswered = log
        .lines()
        .find(|line| line.contains("did not answer the lease release"))
        .unwrap_or_else(|| panic!("the paused voter did not answer the lease release:\n{log}"));
    assert!(unanswered.contains(&format!("peer={paused}")), "{unanswered}");
    assert_handed_over(&cluster, leader, successor, &before).await;
    assert_eq!(cluster.wait_leader().await, successor, "the resumed voter follows node {successor}");
    let (first, gap) = every_call_succeeded(&calls, stopped_at, &cluster);
    eprintln!(
        "node {successor} led {elected_in:?} after the SIGTERM, node {paused} paused; first answer {first:?} \
         after it, longest gap {gap:?}"
    );
}

/// Waits until one of `ids` leads and the others of them say so; returns it.
async fn leader_among(cluster: &Cluster, ids: &[u64]) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut leaders = Vec::new();
        for id in ids {
            leaders.push(cluster.status(*id).await.and_then(|status| status["leader"]["id"].as_u64()));
        }
        if let Some(Some(leader)) = leaders.first() {
            if leaders.iter().all(|l| *l == Some(*leader)) && ids.contains(leader) {
                return *leader;
            }
        }
        assert!(Instant::now() < deadline, "no agreed leader among {ids:?}: {leaders:?}\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A broker, a cluster of `voters` and two SDK writers that have written for 2 s; the leader
/// and [`election_counts`] as the handover tests start.
async fn writing_cluster(voters: u64) -> (Broker, Cluster, SdkWriters, u64, BTreeMap<u64, (f64, f64)>) {
    let broker = Broker::start();
    let cluster = Cluster::start(voters, &["--broker", &broker.address()]).await;
    cluster.wait_ready().await;
    let writers = SdkWriters::start(&broker, 2).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let leader = cluster.wait_leader().await;
    let before = election_counts(&cluster, leader).await;
    (broker, cluster, writers, leader, before)
}

/// Each voter but `leader`: how many elections it started at a leader's request and after a
/// pre-vote.
async fn election_counts(cluster: &Cluster, leader: u64) -> BTreeMap<u64, (f64, f64)> {
    let mut counts = BTreeMap::new();
    for id in cluster.running().into_iter().filter(|id| *id != leader) {
        let text = cluster.metrics(id).await;
        counts.insert(id, (elections_started(&text, "handover"), elections_started(&text, "prevote")));
    }
    counts
}

/// The stopped `leader` says it handed over to `successor`, which stood at its request once
/// (`before`: [`election_counts`] before the stop) without waiting out a lease for a pre-vote.
async fn assert_handed_over(cluster: &Cluster, leader: u64, successor: u64, before: &BTreeMap<u64, (f64, f64)>) {
    let log = std::fs::read_to_string(&cluster.nodes[&leader].log).unwrap();
    assert!(
        log.contains(&format!("handed leadership over to node {successor}")),
        "the stopping leader handed over to node {successor}:\n{log}"
    );
    let text = cluster.metrics(successor).await;
    let (handovers, prevotes) = before[&successor];
    assert_eq!(
        elections_started(&text, "handover"),
        handovers + 1.0,
        "node {successor} stood at the leader's request\n{}",
        cluster.logs()
    );
    assert_eq!(
        elections_started(&text, "prevote"),
        prevotes,
        "node {successor} did not wait out a lease for a pre-vote"
    );
}

/// SDK clients writing new keys in a loop, each call recorded.
struct SdkWriters {
    sessions: Vec<SdkSession>,
    writers: Vec<tokio::task::JoinHandle<()>>,
    calls: Arc<Mutex<Vec<(Instant, Instant, bool)>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl SdkWriters {
    async fn start(broker: &Broker, count: usize) -> SdkWriters {
        let calls = Arc::new(Mutex::new(Vec::<(Instant, Instant, bool)>::new()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut sessions = Vec::new();
        let mut writers = Vec::new();
        for writer in 0..count {
            let session = SdkSession::connect(broker.port, &unique_client_id(&format!("writer{writer}"))).await;
            let store = session.state_store();
            sessions.push(session);
            let (calls, stop) = (calls.clone(), stop.clone());
            writers.push(tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    n += 1;
                    let started = Instant::now();
                    let key = format!("w{writer}-{n}").into_bytes();
                    let set = store.set(key, b"v".to_vec(), CALL_TIMEOUT, None, SetOptions::default()).await;
                    let ok = matches!(&set, Ok(r) if r.response && r.version.is_some());
                    calls.lock().unwrap().push((started, Instant::now(), ok));
                }
            }));
        }
        SdkWriters { sessions, writers, calls, stop }
    }

    /// Stops the writers: every call made, as (started, answered, succeeded).
    async fn stop(self) -> Vec<(Instant, Instant, bool)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for writer in self.writers {
            writer.await.unwrap();
        }
        for session in self.sessions {
            session.close().await;
        }
        self.calls.lock().unwrap().clone()
    }
}

/// Asserts that every call succeeded and that writes went on after `since`; the first answer
/// after `since` and the longest time without one.
fn every_call_succeeded(
    calls: &[(Instant, Instant, bool)],
    since: Instant,
    cluster: &Cluster,
) -> (Option<Duration>, Duration) {
    let failed: Vec<String> = calls
        .iter()
        .filter(|(_, _, ok)| !ok)
        .map(|(started, done, _)| format!("{:?}..{:?}", started.saturating_duration_since(since), *done - since))
        .collect();
    assert!(
        failed.is_empty(),
        "every call succeeded ({} of {} failed, started..answered after the start: {failed:?})\n{}",
        failed.len(),
        calls.len(),
        cluster.logs()
    );
    let mut answered: Vec<Instant> = calls.iter().map(|(_, done, _)| *done).filter(|done| *done >= since).collect();
    answered.sort();
    assert!(answered.len() > 10, "writes went on: {}", answered.len());
    let gap = answered.windows(2).map(|pair| pair[1] - pair[0]).max().unwrap_or_default();
    (answered.first().map(|at| *at - since), gap)
}

/// Leadership moved on request (`POST /cluster/leader`, as `statestore-cli cluster leader`
/// sends it), first to a voter named, then to any: each time the named node leads, the old
/// leader runs on as a follower, and every SDK call made meanwhile succeeds. A move to a voter
/// that does not answer (paused) gives up within the handover deadline, and the leader leads on
/// and takes writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leadership_moves_on_request_while_sdk_clients_write() {
    let broker = Broker::start();
    let cluster = Cluster::start(3, &["--broker", &broker.address()]).await;
    cluster.wait_ready().await;
    let writers = SdkWriters::start(&broker, 2).await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    let move_leadership = |cluster: &Cluster, on: u64, body: serde_json::Value| {
        cluster.http.post(format!("{}/cluster/leader", cluster.url(on))).json(&body).send()
    };
    let leader = cluster.wait_leader().await;
    let to = cluster.running().into_iter().find(|id| *id != leader).unwrap();
    let moved_at = Instant::now();
    let answer = move_leadership(&cluster, leader, serde_json::json!({"to": to})).await.unwrap();
    let status = answer.status();
    let body: serde_json::Value = answer.json().await.unwrap();
    assert_eq!(status, 200, "{body}\n{}", cluster.logs());
    assert_eq!(
        (body["from"].as_u64(), body["leader"].as_u64()),
        (Some(leader), Some(to)),
        "{body}\n{}",
        cluster.logs()
    );
    assert_eq!(cluster.wait_leader().await, to);
    assert_eq!(cluster.running().len(), 3, "every node runs on");
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Without `to`, sent to a follower: forwarded to the leader, which hands over to anyone. With
    // several clusters on the machine (this binary runs its tests at once) an election can
    // outlast the move's window: the move then answers that it did not happen (409 `not_moved`),
    // and is asked for again, as an operator would.
    let mut attempts = 0;
    let (before, body) = loop {
        attempts += 1;
        let before = cluster.wait_leader().await;
        let answer = move_leadership(&cluster, leader, serde_json::json!({})).await.unwrap();
        let status = answer.status();
        let body: serde_json::Value = answer.json().await.unwrap();
        if status == 409 && body["code"] == "not_moved" && attempts < 3 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        assert_eq!(status, 200, "{body}");
        break (before, body);
    };
    let next = cluster.wait_leader().await;
    assert_ne!(next, before, "{body}");
    // Two moves at once, while the new leader waits out its fresh election: one at a time.
    let (first, second) = tokio::join!(move_leadership(&cluster, next, serde_json::json!({})), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        move_leadership(&cluster, next, serde_json::json!({})).await
    });
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_eq!(first.status(), 200);
    assert_eq!(second.status(), 409);
    let refused: serde_json::Value = second.json().await.unwrap();
    assert!(refused["message"].as_str().unwrap().contains("being moved already"), "{refused}");
    let next = cluster.wait_leader().await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Targets that cannot lead are refused before anything is held.
    let itself = move_leadership(&cluster, next, serde_json::json!({"to": next})).await.unwrap();
    assert_eq!(itself.status(), 400);
    let unknown = move_leadership(&cluster, next, serde_json::json!({"to": 99})).await.unwrap();
    assert_eq!(unknown.status(), 404);

    // A voter that does not answer: the move gives up, the leader leads on, and the requests
    // that waited meanwhile are served (none is left behind).
    let paused = cluster.running().into_iter().find(|id| *id != next).unwrap();
    cluster.signal(paused, "STOP");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    eprintln!("paused {paused}; moving at {:?}", started - moved_at);
    let answer = move_leadership(&cluster, next, serde_json::json!({"to": paused})).await.unwrap();
    let status = answer.status();
    let failed: serde_json::Value = answer.json().await.unwrap();
    assert_eq!(status, 409, "{failed}");
    assert_eq!(failed["code"], "not_moved", "{failed}");
    assert!(started.elapsed() < HANDOVER_DEADLINE + Duration::from_secs(2), "{:?}", started.elapsed());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let calls = writers.stop().await;
    let (_, gap) = every_call_succeeded(&calls, moved_at, &cluster);
    eprintln!("moved in {} ms; longest time without an answer {gap:?}", body["millis"]);
    cluster.set(next, "after a move that did not happen", "v").await.expect("the leader leads on");
    cluster.signal(paused, "CONT");
    assert_eq!(cluster.wait_leader().await, next);
}

/// Stops the leader with SIGTERM while both other voters are paused (SIGSTOP), with a write
/// still in flight when `pending` (so no voter's log can end where the leader's does): the
/// leader stops once its handover gives up, and says why it did not hand over. Once the voters
/// run again they elect a leader among themselves that holds every acknowledged write. Returns
/// the stopped leader's log.
async fn stop_the_leader_with_its_voters_paused(pending: bool) -> String {
    let mut cluster = Cluster::start(3, &[]).await;
    cluster.wait_ready().await;
    let leader = cluster.wait_leader().await;
    let voters: Vec<u64> = cluster.running().into_iter().filter(|id| *id != leader).collect();
    // The leader enrolls every member's storage once it has seen it (a write of its own, up to a
    // second after the election): done before the pause, so that nothing but the test's writes
    // can reach the log after the voters' last entry.
    let started = Instant::now();
    while cluster.status(leader).await.unwrap()["enrolled"].as_object().map_or(0, |enrolled| enrolled.len()) < 3 {
        assert!(started.elapsed() < Duration::from_secs(10), "every member enrolled\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut acknowledged = BTreeMap::new();
    for n in 0..20 {
        let key = format!("key-{n}");
        let answer = cluster.set(leader, &key, "v").await.expect("written before the pause");
        acknowledged.insert(key, answer.version.expect("a SET answers its version"));
    }
    for voter in &voters {
        cluster.wait_applied(*voter, cluster.status(leader).await.unwrap()["applied_index"].as_u64().unwrap()).await;
        cluster.signal(*voter, "STOP");
    }
    let in_flight = pending.then(|| {
        let request = cluster
            .http
            .post(format!("{}/v1/command", cluster.url(leader)))
            .header("statestore-ts", common::timestamp())
            .body(Set::new("late", "v").encode());
        tokio::spawn(async move {
            let response = request.send().await.expect("an answer");
            (response.status().as_u16(), response.text().await.unwrap_or_default())
        })
    });
    tokio::time::sleep(Duration::from_millis(300)).await;

    let stopped_at = Instant::now();
    let status = tokio::task::block_in_place(|| cluster.terminate(leader));
    let stopped_in = stopped_at.elapsed();
    assert!(status.success(), "the leader stopped cleanly: {status:?}\n{}", cluster.logs());
    // The handover gives up at its deadline; then requests in flight get at most HTTP_DRAIN to
    // finish (the write in flight ends at its own commit deadline, sooner).
    assert!(
        stopped_in < HANDOVER_DEADLINE + HTTP_DRAIN + Duration::from_secs(2),
        "the leader stopped {stopped_in:?} after SIGTERM"
    );
    if let Some(in_flight) = in_flight {
        // Its answer waited for a commit that could not come: not acknowledged, and said so.
        let (status, body) = tokio::time::timeout(DEADLINE, in_flight).await.expect("answered").unwrap();
        assert_eq!(status, 503, "{body}");
        assert!(body.contains("may still commit"), "{body}");
    }
    let log = std::fs::read_to_string(&cluster.nodes[&leader].log).unwrap();
    assert!(log.contains("stopping without handing leadership over"), "{log}");

    for voter in &voters {
        cluster.signal(*voter, "CONT");
    }
    let successor = cluster.wait_leader().await;
    assert!(voters.contains(&successor));
    for (key, version) in &acknowledged {
        let answer = cluster.get(successor, key).await.expect("read from the new leader");
        assert_eq!(answer.response, Response::Value(b"v".to_vec()), "{key}");
        assert_eq!(answer.version.as_ref(), Some(version), "{key} kept the version it was acknowledged with");
    }
    cluster.set(successor, "after", "v").await.expect("the new leader takes writes");
    eprintln!("the leader stopped {stopped_in:?} after SIGTERM");
    log
}

/// The voters a stopping leader asks to stand do not answer (paused): it asks each once, then
/// stops without handing over.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopping_leader_whose_voters_do_not_answer_stops_without_handing_over() {
    let log = stop_the_leader_with_its_voters_paused(false).await;
    assert_eq!(log.matches("a voter did not answer the request to stand").count(), 2, "each voter asked once:\n{log}");
    assert!(log.contains("no voter would stand"), "{log}");
}

/// No voter's log can match the stopping leader's (its last write never reached them): it waits
/// out its handover deadline, asks no one, and stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopping_leader_that_no_voter_caught_up_with_stops_at_its_deadline() {
    let log = stop_the_leader_with_its_voters_paused(true).await;
    assert!(log.contains("no voter's log matched this node's within 2s"), "{log}");
    assert!(!log.contains("request to stand"), "no voter was asked:\n{log}");
}
