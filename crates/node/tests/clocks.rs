//! Clock offsets, injected for real: a node runs under libfaketime with its wall clock shifted
//! (its monotonic clock untouched), among nodes with the true time.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::gate::PeerLinks;
use common::{clock, Cluster};
use statestore_protocol::{Response, Set, SetCondition};

const DEADLINE: Duration = Duration::from_secs(20);

/// Runs node `id` with its wall clock `offset` ahead (e.g. `+30s`).
fn shift_clock(cluster: &mut Cluster, id: u64, offset: &str) {
    clock::assert_libfaketime();
    let mut env = vec![("LD_PRELOAD".into(), clock::LIBFAKETIME.into())];
    env.extend(clock::fixed_offset_env(offset));
    cluster.nodes.get_mut(&id).unwrap().env = env;
}

/// The nodes whose clocks are true in these tests; node 3's is shifted.
const TRUE_CLOCKS: [u64; 2] = [1, 2];

/// The leader the nodes in `among` agree on, once it is one of `leaders`, asking only them (a
/// paused node would not answer).
async fn leader_among(cluster: &Cluster, among: &[u64], leaders: &[u64]) -> u64 {
    let until = Instant::now() + DEADLINE;
    loop {
        let mut seen = Vec::new();
        for &id in among {
            let status = cluster.status(id).await;
            seen.push(status.as_ref().and_then(|s| s["leader"]["id"].as_u64()));
        }
        if let Some(Some(leader)) = seen.first().copied() {
            if among.contains(&leader) && leaders.contains(&leader) && seen.iter().all(|l| *l == Some(leader)) {
                return leader;
            }
        }
        assert!(Instant::now() < until, "no agreed leader among {among:?}: {seen:?}\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// `GET /ready` of node `id`: (status, body); status 0 and the error while it does not answer.
async fn ready(cluster: &Cluster, id: u64) -> (u16, String) {
    match cluster.http.get(format!("{}/ready", cluster.url(id))).send().await {
        Ok(response) => (response.status().as_u16(), response.text().await.unwrap_or_default()),
        Err(e) => (0, e.to_string()),
    }
}

/// The state machine adopts the leader's clock forward-only, so a leader whose clock runs 30 s
/// fast would expire keys and dedup records 30 s early on every node, for good. A node whose clock
/// is that far off must say it is not ready, and no write may take its clock, however often the
/// leader changes: the nodes with true clocks lead (the one with the shifted clock only as a last
/// resort, for a moment: see the test below).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_clock_is_off_is_not_ready_and_no_write_takes_its_clock() {
    let mut cluster = Cluster::prepare(3, &[]);
    shift_clock(&mut cluster, 3, "+30s");
    // Every initial member of a new cluster stands at once, before any clock is known: node 3
    // joins once the others have formed it (a node with a shifted clock that wins that first
    // election proposes nothing and hands over within a heartbeat round; not what this tests).
    cluster.spawn(1);
    cluster.spawn(2);
    leader_among(&cluster, &TRUE_CLOCKS, &TRUE_CLOCKS).await;
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

    let mut leader = leader_among(&cluster, &[1, 2, 3], &TRUE_CLOCKS).await;
    for round in 0..3 {
        // A write goes through the leader with the true clock, and a key with a 20 s PX is there.
        let key = format!("px-{round}");
        let set = Set {
            key: key.clone().into(),
            value: b"v".to_vec(),
            condition: SetCondition::Always,
            expiry_ms: Some(20_000),
        };
        let answer = cluster.command(leader, set.encode(), Some(&common::timestamp()), "").await;
        let answer = answer.map(|a| a.response);
        assert_eq!(
            answer.as_ref().ok(),
            Some(&Response::Ok),
            "round {round}: SET on node {leader}: {answer:?}\n{}",
            cluster.logs()
        );
        let read = cluster.get(leader, &key).await.map(|a| a.response);
        assert_eq!(
            read.as_ref().ok(),
            Some(&Response::Value(b"v".to_vec())),
            "round {round}: GET on node {leader}: {read:?}\n{}",
            cluster.logs()
        );
        // Node 3 says why it is not ready.
        let until = Instant::now() + DEADLINE;
        loop {
            let (status, body) = ready(&cluster, 3).await;
            if status == 503 && body.contains("clock") {
                break;
            }
            assert!(
                Instant::now() < until,
                "round {round}: node 3's /ready answered {status} {body}\n{}",
                cluster.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The leader is paused: the other node with a true clock leads.
        cluster.signal(leader, "STOP");
        let others: Vec<u64> = [1, 2, 3].into_iter().filter(|id| *id != leader).collect();
        let next = leader_among(&cluster, &others, &TRUE_CLOCKS).await;
        cluster.signal(leader, "CONT");
        leader = next;
    }
}

/// The voters left when a leader is lost may be unable to elect one of themselves without the
/// node whose clock is off: here the other one was cut off from its peers while the leader
/// wrote, so its log is shorter and node 3 refuses it its vote. Node 3 does not stand while another node could win,
/// but with no leader for ten leases it stands as a last resort, leads without proposing a
/// write, and hands over to the node with the true clock once that one's log has caught up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_clock_is_off_leads_only_as_a_last_resort_and_hands_over() {
    let mut cluster = Cluster::prepare(3, &[]);
    let ports: BTreeMap<u64, u16> = cluster.nodes.iter().map(|(id, node)| (*id, node.port)).collect();
    let links = PeerLinks::start(&ports).await;
    for (&id, node) in cluster.nodes.iter_mut() {
        node.args = vec!["--peer-routes".into(), links.routes(id)];
    }
    shift_clock(&mut cluster, 3, "+30s");
    cluster.spawn(1);
    cluster.spawn(2);
    leader_among(&cluster, &TRUE_CLOCKS, &TRUE_CLOCKS).await;
    cluster.spawn(3);
    // Node 3 is a follower that knows its clock is off.
    let until = Instant::now() + DEADLINE;
    loop {
        let (status, body) = ready(&cluster, 3).await;
        if status == 503 && body.contains("clock") {
            break;
        }
        assert!(Instant::now() < until, "node 3's /ready answered {status} {body}\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The first members may still have moved their leadership as they formed the cluster: the
    // leader is the one all three agree on now.
    let leader = leader_among(&cluster, &[1, 2, 3], &TRUE_CLOCKS).await;
    let other = if leader == 1 { 2 } else { 1 };
    let term = cluster.status(leader).await.unwrap()["term"].clone();
    links.cut_off(other, true);
    let set = |key: &str| Set {
        key: key.into(),
        value: b"v".to_vec(),
        condition: SetCondition::Always,
        expiry_ms: Some(20_000),
    };
    let answer = cluster.command(leader, set("while-cut-off").encode(), Some(&common::timestamp()), "").await;
    assert_eq!(answer.map(|a| a.response).ok(), Some(Response::Ok), "a write with node {other} cut off");
    let status = cluster.status(leader).await.unwrap();
    assert!(status["role"] == "leader" && status["term"] == term, "node {leader} led throughout: {status}");
    // The leader is lost (paused: nothing more leaves it), and node {other} is back.
    cluster.signal(leader, "STOP");
    links.cut_off(other, false);

    let next = leader_among(&cluster, &[other, 3], &[other]).await;
    assert_eq!(next, other);
    let log = std::fs::read_to_string(&cluster.nodes[&3].log).unwrap();
    assert!(log.contains("as a last resort"), "node 3 stood as a last resort\n{log}");
    assert!(log.contains("handing leadership over: this node's clock disagrees"), "node 3 handed over\n{log}");
    // No write took node 3's clock: a key with a 20 s PX written now is there, and so is the
    // write node {other} missed.
    let answer = cluster.command(other, set("after").encode(), Some(&common::timestamp()), "").await;
    assert_eq!(answer.map(|a| a.response).ok(), Some(Response::Ok), "a write on node {other}\n{}", cluster.logs());
    for key in ["while-cut-off", "after"] {
        let read = cluster.get(other, key).await.map(|a| a.response);
        assert_eq!(read.as_ref().ok(), Some(&Response::Value(b"v".to_vec())), "{key}: {read:?}\n{}", cluster.logs());
    }
    cluster.signal(leader, "CONT");
}

/// A leader whose clock jumps 30 s ahead while it leads (each node's libfaketime reads its offset
/// from a file, which the test rewrites for the leader) hands leadership over at once: it asks
/// a voter whose log holds its own to stand, and that voter wins in the next term, where the
/// followers would otherwise elect one of themselves only after a lease without heartbeats. A
/// client writes to it all along, with a 20 s `PX`: no entry takes its clock (the state
/// machine's clock would then run 30 s ahead for good, and every such key would be gone at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_clock_jumps_asks_a_voter_to_stand_at_once() {
    let (cluster, offsets) = cluster_with_clock_files().await;
    let old = leader_among(&cluster, &[1, 2, 3], &[1, 2, 3]).await;
    let others: Vec<u64> = (1..=3).filter(|id| *id != old).collect();
    assert_eq!(cluster.set(old, "before", "v").await.unwrap().response, Response::Ok);
    let stood_on_request = |text: &str| common::elections_started(text, "handover");
    let mut asked_before = BTreeMap::new();
    for id in &others {
        asked_before.insert(*id, stood_on_request(&cluster.metrics(*id).await));
    }
    let term = cluster.status(old).await.unwrap()["term"].as_u64().unwrap();

    let write = move |cluster: std::sync::Arc<Cluster>, n: usize| async move {
        let key = format!("during-{n}");
        let answer = cluster.command(old, px_20_s(&key).encode(), Some(&common::timestamp()), "").await;
        answer.is_ok_and(|answer| answer.response == Response::Ok).then_some(key)
    };
    let (cluster, new, written) = calls_while_the_leader_jumps(cluster, &offsets, old, "+30s", write).await;
    let acknowledged: Vec<String> = written.into_iter().flatten().collect();
    assert!(!acknowledged.is_empty(), "no write before the jump was acknowledged");
    let logs = cluster.logs();
    assert!(logs.contains("handing leadership over: this node's clock disagrees"), "node {old} handed over\n{logs}");
    assert_eq!(
        stood_on_request(&cluster.metrics(new).await),
        asked_before[&new] + 1.0,
        "node {new} did not stand at node {old}'s request\n{logs}"
    );
    let status = cluster.status(new).await.unwrap();
    assert_eq!(status["term"].as_u64(), Some(term + 1), "node {new} won in the next term: {status}");
    let answer = cluster.command(new, px_20_s("after").encode(), Some(&common::timestamp()), "").await;
    assert_eq!(answer.map(|answer| answer.response).ok(), Some(Response::Ok), "a write on node {new}");
    for key in acknowledged.iter().map(String::as_str).chain(["before", "after"]) {
        let read = cluster.get(new, key).await.map(|answer| answer.response);
        assert_eq!(read.as_ref().ok(), Some(&Response::Value(b"v".to_vec())), "{key}: {read:?}\n{}", cluster.logs());
    }
    println!("{} writes acknowledged by node {old} as its clock jumped, each there", acknowledged.len());
}

/// A leader whose clock jumps 30 s ahead serves no read at its clock: reads judge expiry by the
/// clock of the node that serves them, and at the jumped clock a value written with a 20 s `PX`
/// has lapsed. A client reads such a value through that node all along, as the node learns of
/// its jump and hands over: every read finds the value (or is refused), none finds it gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_clock_jumps_serves_no_read_at_its_clock() {
    let (cluster, offsets) = cluster_with_clock_files().await;
    let old = leader_among(&cluster, &[1, 2, 3], &[1, 2, 3]).await;
    let written = cluster.command(old, px_20_s("lasting").encode(), Some(&common::timestamp()), "").await;
    assert_eq!(written.map(|answer| answer.response).ok(), Some(Response::Ok));
    let (cluster, new, reads) =
        calls_while_the_leader_jumps(cluster, &offsets, old, "+30s", move |cluster, _| async move {
            cluster.get(old, "lasting").await.map(|answer| answer.response)
        })
        .await;
    let found = reads.iter().filter(|read| matches!(read, Ok(Response::Value(_)))).count();
    let gone = reads.iter().filter(|read| matches!(read, Ok(Response::Nil))).count();
    println!(
        "reads through node {old} as its clock jumped and node {new} took over: {found} found the value, {gone} found it gone, {} refused",
        reads.len() - found - gone
    );
    assert_eq!(gone, 0, "reads served at node {old}'s jumped clock found the value lapsed\n{}", cluster.logs());
    assert!(found > 0, "no read found the value");
}

/// A leader whose clock jumps 90 s behind blames no client for it: a write stamped with the true
/// time looks 90 s ahead of its clock, beyond the 60 s a request's timestamp may lead, and until
/// it hands over it refuses such writes as a leader whose clock disagrees (a refusal the client
/// may retry), never with `-ERR` for the client's timestamp, an answer a client takes as final.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_clock_jumps_behind_blames_no_client_for_it() {
    let (cluster, offsets) = cluster_with_clock_files().await;
    let old = leader_among(&cluster, &[1, 2, 3], &[1, 2, 3]).await;
    let (cluster, new, writes) =
        calls_while_the_leader_jumps(cluster, &offsets, old, "-90s", move |cluster, n| async move {
            let set = px_20_s(&format!("during-{n}"));
            cluster.command(old, set.encode(), Some(&common::timestamp()), "").await.map(|answer| answer.response)
        })
        .await;
    let taken = writes.iter().filter(|write| matches!(write, Ok(Response::Ok))).count();
    let blamed: Vec<&Response> =
        writes.iter().filter_map(|write| write.as_ref().ok()).filter(|r| **r != Response::Ok).collect();
    println!(
        "writes through node {old} as its clock jumped back and node {new} took over: {taken} taken, {} answered -ERR, {} refused",
        blamed.len(),
        writes.len() - taken - blamed.len()
    );
    assert!(blamed.is_empty(), "writes answered {:?}\n{}", blamed.first(), cluster.logs());
    assert!(taken > 0, "no write was taken");
}

/// Makes `call(cluster, n)` (n = 0, 1, …) back to back, one at a time, from 300 ms before node
/// `old`'s clock jumps by `offset` (libfaketime's form) until 300 ms after another node leads;
/// gives back the cluster, the new leader and every call's result in order.
async fn calls_while_the_leader_jumps<T, Call, Made>(
    cluster: Cluster,
    offsets: &BTreeMap<u64, std::path::PathBuf>,
    old: u64,
    offset: &str,
    call: Call,
) -> (std::sync::Arc<Cluster>, u64, Vec<T>)
where
    T: Send + 'static,
    Call: Fn(std::sync::Arc<Cluster>, usize) -> Made + Send + 'static,
    Made: std::future::Future<Output = T> + Send,
{
    let others: Vec<u64> = (1..=3).filter(|id| *id != old).collect();
    let cluster = std::sync::Arc::new(cluster);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let caller = tokio::spawn({
        let (cluster, stop) = (cluster.clone(), stop.clone());
        async move {
            let mut results = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                results.push(call(cluster.clone(), results.len()).await);
            }
            results
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::write(&offsets[&old], offset).unwrap();
    let new = leader_among(&cluster, &others, &others).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let results = caller.await.unwrap();
    (cluster, new, results)
}

/// Three nodes whose libfaketime reads each node's clock offset from a file (`+0` at first; read
/// again every second), started and ready; node id → its file.
async fn cluster_with_clock_files() -> (Cluster, BTreeMap<u64, std::path::PathBuf>) {
    clock::assert_libfaketime();
    let mut cluster = Cluster::prepare(3, &[]);
    let mut offsets = BTreeMap::new();
    for id in 1..=3 {
        let file = cluster.dir.path().join(format!("clock-offset-{id}"));
        std::fs::write(&file, "+0").unwrap();
        let mut env = vec![("LD_PRELOAD".into(), clock::LIBFAKETIME.into())];
        env.extend(clock::offset_file_env(&file));
        cluster.nodes.get_mut(&id).unwrap().env = env;
        offsets.insert(id, file);
    }
    for id in 1..=3 {
        cluster.spawn(id);
    }
    cluster.wait_ready().await;
    (cluster, offsets)
}

/// `SET key v PX 20000`.
fn px_20_s(key: &str) -> Set {
    Set { key: key.into(), value: b"v".to_vec(), condition: SetCondition::Always, expiry_ms: Some(20_000) }
}
