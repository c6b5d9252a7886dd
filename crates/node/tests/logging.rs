//! Logs: `--log-format json` gives one JSON object per line a log shipper can read; by default a
//! node logs plain, quiet text; a clean stop logs no error.

mod common;

use common::broker::Broker;
use common::disk::cluster_with_faulty_disks;
use common::Cluster;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread")]
async fn json_logs_are_one_object_per_line() {
    let mut cluster = Cluster::start(1, &["--log-format", "json"]).await;
    cluster.wait_ready().await;
    assert!(cluster.terminate(1).success());
    let log = std::fs::read_to_string(&cluster.nodes[&1].log).unwrap();
    let lines: Vec<&str> = log.lines().filter(|l| !l.is_empty()).collect();
    assert!(lines.len() >= 3, "{log}");
    for line in lines {
        let object: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(object["timestamp"].is_string() && object["level"].is_string(), "{line}");
        assert!(object["fields"]["message"].is_string() || object["fields"].is_object(), "{line}");
    }
}

/// By default a node whose stderr is a file logs plain text (no colour codes), its own events
/// (here: that it leads, and a warning that it has no broker) and none of the libraries' info
/// lines.
#[test]
fn default_logs_are_plain_quiet_and_name_the_leader() {
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let log_path = dir.path().join("node.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut node = std::process::Command::new(env!("CARGO_BIN_EXE_statestore"))
        .args(["--id=1", &format!("--listen=127.0.0.1:{port}")])
        .arg(format!("--data-dir={}", dir.path().join("data").display()))
        .arg(format!("--initial-members=1=http://127.0.0.1:{port}"))
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let until = std::time::Instant::now() + common::DEADLINE;
    let text = loop {
        let text = std::fs::read_to_string(&log_path).unwrap();
        if text.contains("this node leads") || std::time::Instant::now() > until {
            break text;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    node.kill().unwrap();
    node.wait().unwrap();
    assert!(text.contains("this node leads"), "no line says the node leads:\n{text}");
    assert!(!text.contains('\u{1b}'), "colour codes in a log file:\n{text}");
    assert!(text.contains("WARN") && text.contains("no --broker"), "a node without a broker does not say so:\n{text}");
    let library_info: Vec<&str> = text.lines().filter(|l| l.contains(" INFO ") && l.contains("openraft")).collect();
    assert!(library_info.is_empty(), "openraft info lines by default:\n{}", library_info.join("\n"));
}

/// A node stopped with SIGTERM stops quietly: not one error or warning line from the moment it
/// is told to stop. An error line in a clean stop sends an operator looking for a fault that is
/// not there.
#[tokio::test(flavor = "multi_thread")]
async fn a_clean_stop_logs_no_error() {
    let broker = Broker::start();
    let mut cluster = Cluster::start(1, &["--broker", &broker.address()]).await;
    cluster.wait_ready().await;
    for i in 0..20 {
        cluster.set(1, &format!("stop-{i}"), "v").await.unwrap();
    }
    // Past a few elector and snapshot policy ticks.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let before = std::fs::read_to_string(&cluster.nodes[&1].log).unwrap().len();
    assert!(cluster.terminate(1).success(), "the node did not exit cleanly:\n{}", cluster.logs());
    let log = std::fs::read_to_string(&cluster.nodes[&1].log).unwrap();
    let stopping = &log[before..];
    let bad: Vec<&str> = stopping.lines().filter(|l| l.contains(" ERROR ") || l.contains(" WARN ")).collect();
    assert!(bad.is_empty(), "errors or warnings in a clean stop:\n{stopping}");
}

/// A follower stopped with SIGTERM while the leader keeps writing stops as quietly: its appends
/// stream from the leader closes before its Raft stops, so no append reaches a stopped Raft
/// (openraft logs each of those as an error).
#[tokio::test(flavor = "multi_thread")]
async fn a_follower_stopped_under_writes_logs_no_error() {
    let mut cluster = Cluster::start(3, &[]).await;
    cluster.wait_ready().await;
    let leader = cluster.wait_leader().await;
    let follower = cluster.running().into_iter().find(|id| *id != leader).unwrap();
    let writing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (http, url) = (cluster.http.clone(), format!("{}/v1/command", cluster.url(leader)));
    let writer = tokio::spawn({
        let writing = writing.clone();
        async move {
            let mut written = 0;
            while writing.load(std::sync::atomic::Ordering::SeqCst) {
                let set = statestore_protocol::Set::new(format!("quiet-{written}"), "v").encode();
                let sent = http.post(&url).header("statestore-ts", common::timestamp()).body(set).send().await;
                assert_eq!(sent.unwrap().status(), 200);
                written += 1;
            }
            written
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    stops_quietly(&mut cluster, follower);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    writing.store(false, std::sync::atomic::Ordering::SeqCst);
    assert!(writer.await.unwrap() > 10, "the leader kept writing");
}

/// A follower stopped while an append it took waits for its disk (its `fsync`s wait, for real,
/// from before the write until 300 ms after the SIGTERM; the write itself commits with the
/// leader and the other follower) stops only once that append has returned: openraft has no
/// call that the stop cut off to log as an error.
#[tokio::test(flavor = "multi_thread")]
async fn a_follower_stopped_while_an_append_waits_for_its_disk_logs_no_error() {
    let (mut cluster, disks, leader) = cluster_with_faulty_disks(&[]).await;
    let follower = cluster.running().into_iter().find(|id| *id != leader).unwrap();
    let stall = disks.stall(follower);
    std::fs::write(&stall, "").unwrap();
    assert_eq!(cluster.set(leader, "waits", "v").await.unwrap().response, statestore_protocol::Response::Ok);
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let resume = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        std::fs::remove_file(stall).unwrap();
    });
    stops_quietly(&mut cluster, follower);
    resume.join().unwrap();
}

/// Stops `follower` with SIGTERM and asserts that it exited cleanly and logged no error or
/// warning from the SIGTERM on.
fn stops_quietly(cluster: &mut Cluster, follower: u64) {
    let log = cluster.nodes[&follower].log.clone();
    let before = std::fs::read_to_string(&log).unwrap().len();
    assert!(cluster.terminate(follower).success(), "the follower did not exit cleanly:\n{}", cluster.logs());
    let stopping = std::fs::read_to_string(&log).unwrap()[before..].to_string();
    let bad: Vec<&str> = stopping.lines().filter(|l| l.contains(" ERROR ") || l.contains(" WARN ")).collect();
    assert!(bad.is_empty(), "errors or warnings in a follower's clean stop:\n{stopping}");
}

/// A follower down for seconds costs the leader a handful of lines, not one per retry: one
/// line names the peer that does not answer, openraft's own warnings come once per kind, and
/// one line says when the peer answers again.
#[tokio::test(flavor = "multi_thread")]
async fn a_peer_down_is_logged_once_not_per_retry() {
    let mut cluster = Cluster::start(3, &[]).await;
    cluster.wait_ready().await;
    let leader = cluster.wait_leader().await;
    let follower = cluster.running().into_iter().find(|id| *id != leader).unwrap();
    let leader_log = cluster.nodes[&leader].log.clone();
    let before = std::fs::read_to_string(&leader_log).unwrap().len();
    cluster.kill(follower);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut i = 0;
    while std::time::Instant::now() < until {
        // Writes and reads go on with the other two.
        cluster.set(leader, &format!("down-{i}"), "v").await.unwrap();
        cluster.get(leader, &format!("down-{i}")).await.unwrap();
        i += 1;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let while_down = std::fs::read_to_string(&leader_log).unwrap()[before..].to_string();
    let lines: Vec<&str> = while_down.lines().collect();
    let named: Vec<&&str> = lines.iter().filter(|l| l.contains(&format!("node {follower} has not answered"))).collect();
    assert_eq!(named.len(), 1, "not one line names the peer that is down:\n{while_down}");
    assert!(lines.len() <= 15, "{} lines in 5 s with a follower down:\n{while_down}", lines.len());
    let status = cluster.status(leader).await.unwrap();
    assert!(status["not_answering_ms"][follower.to_string()].as_u64() >= Some(1000), "{status}");

    cluster.spawn(follower);
    let answered = format!("node {follower} answers again");
    let until = std::time::Instant::now() + common::DEADLINE;
    while !std::fs::read_to_string(&leader_log).unwrap().contains(&answered) {
        assert!(std::time::Instant::now() < until, "no line says the follower answers again:\n{}", cluster.logs());
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let status = cluster.status(leader).await.unwrap();
    assert_eq!(status["not_answering_ms"], serde_json::json!({}), "{status}");
}
