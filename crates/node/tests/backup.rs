//! Backup and restore as docs/operations.md describes them: a stopped follower's data directory
//! (its RocksDB and its latest snapshot) restores the whole cluster to that point, with versions.

mod common;

use std::path::Path;
use std::time::Duration;

use common::Cluster;
use statestore_protocol::Response;

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_followers_data_directory_restores_the_cluster() {
    // Small snapshots so that the backup holds a snapshot and a log above it.
    let mut cluster = Cluster::start(3, &["--snapshot-every", "50", "--logs-kept", "10"]).await;
    let mut versions = Vec::new();
    for i in 0..120 {
        let answer = cluster.set_anywhere(&format!("k{i}"), &format!("v{i}"), Duration::from_secs(10)).await;
        assert_eq!(answer.response, Response::Ok);
        versions.push(answer.version.unwrap());
    }
    let leader = cluster.wait_leader().await;
    let committed = cluster.status(leader).await.unwrap()["committed_index"].as_u64().unwrap();
    let follower = cluster.running().into_iter().find(|id| *id != leader).unwrap();
    cluster.wait_applied(follower, committed).await;
    // The snapshot policy looks every 200 ms: wait for its snapshot rather than race it.
    cluster.wait_snapshot_covering(follower, 50).await;

    // The backup: stop the follower (SIGTERM), copy its directory, start it again.
    assert!(cluster.terminate(follower).success());
    let backup = cluster.dir.path().join("backup");
    copy_dir(&cluster.nodes[&follower].data_dir, &backup);
    assert!(backup.join("snapshots/current").exists(), "the backup holds a snapshot");
    cluster.spawn(follower);
    cluster.wait_ready().await;

    // Writes after the backup are not in it.
    cluster.set_anywhere("after-backup", "x", Duration::from_secs(10)).await;

    // Disaster: every node stops; each gets the backup in place of its data; all start, the
    // first time with `--restored`.
    let old_name = cluster_name(&cluster, leader).await;
    let leader = restore_everywhere(&mut cluster, &backup).await;
    wait_named_anew(&cluster, leader, &old_name).await;
    for (i, version) in versions.iter().enumerate() {
        let answer = cluster.get(leader, &format!("k{i}")).await.unwrap();
        assert_eq!(answer.response, Response::Value(format!("v{i}").into_bytes()), "k{i}");
        assert_eq!(answer.version.as_ref(), Some(version), "k{i} keeps its version");
    }
    assert_eq!(cluster.get(leader, "after-backup").await.unwrap().response, Response::Nil);
    writes_reach_every_node(&cluster, leader, "k119", "v119").await;
    restart_ordinarily(&mut cluster).await;
}

/// A copy of a node killed (SIGKILL) right after the cluster was named, as a disk snapshot of a
/// running node is, holds the entries that named the cluster and enrolled its members in its log
/// but not in its applied state (applying is not logged; the log is replayed after a crash).
/// Restored, the nodes apply the old name from the log: the restored cluster must still be named
/// anew and enroll its members' new storage, not check them against the old enrollments.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_nodes_copy_taken_right_after_naming_restores_the_cluster() {
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_leader().await;
    let old_name = cluster_name(&cluster, leader).await;
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while cluster.status(leader).await.unwrap()["enrolled"].as_object().map_or(0, |enrolled| enrolled.len()) < 3 {
        assert!(std::time::Instant::now() < until, "the members were never enrolled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for i in 0..20 {
        assert_eq!(cluster.set(leader, &format!("k{i}"), &format!("v{i}")).await.unwrap().response, Response::Ok);
    }
    let committed = cluster.status(leader).await.unwrap()["committed_index"].as_u64().unwrap();
    let follower = cluster.running().into_iter().find(|id| *id != leader).unwrap();
    cluster.wait_applied(follower, committed).await;
    cluster.kill(follower);
    let backup = cluster.dir.path().join("backup");
    copy_dir(&cluster.nodes[&follower].data_dir, &backup);

    let leader = restore_everywhere(&mut cluster, &backup).await;
    wait_named_anew(&cluster, leader, &old_name).await;
    for i in 0..20 {
        let answer = cluster.get(leader, &format!("k{i}")).await.unwrap();
        assert_eq!(answer.response, Response::Value(format!("v{i}").into_bytes()), "k{i}");
    }
    writes_reach_every_node(&cluster, leader, "k19", "v19").await;
    restart_ordinarily(&mut cluster).await;
}

/// A node restarted, without `--restored`, before the restored cluster was named anew (a
/// supervisor restarting it as configured, a crash) resumes the restore: it still waits for the
/// new name instead of checking its peers against the backup's enrollments, which would refuse
/// every peer's new storage and leave it out of the restored cluster for good.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_restarted_before_the_restored_cluster_is_named_goes_on_with_the_restore() {
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_leader().await;
    let old_name = cluster_name(&cluster, leader).await;
    for i in 0..20 {
        assert_eq!(cluster.set(leader, &format!("k{i}"), &format!("v{i}")).await.unwrap().response, Response::Ok);
    }
    let follower = cluster.running().into_iter().find(|id| *id != leader).unwrap();
    assert!(cluster.terminate(follower).success());
    let backup = cluster.dir.path().join("backup");
    copy_dir(&cluster.nodes[&follower].data_dir, &backup);
    for id in cluster.running() {
        cluster.kill(id);
    }
    for id in 1..=3u64 {
        let dir = cluster.nodes[&id].data_dir.clone();
        std::fs::remove_dir_all(&dir).unwrap();
        copy_dir(&backup, &dir);
    }
    // Node 1 starts alone with `--restored`: no quorum, so no leader names the cluster anew.
    cluster.nodes.get_mut(&1).unwrap().args = vec!["--restored".into()];
    cluster.spawn(1);
    let until = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = cluster.status(1).await {
            break status;
        }
        assert!(std::time::Instant::now() < until, "node 1 did not start\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status["restoring"], true, "GET /cluster says the node is restoring: {status}");
    let human = std::process::Command::new(cli())
        .args(["--endpoint", &cluster.url(1), "cluster", "status"])
        .env_remove("STATESTORE_ENDPOINTS")
        .output()
        .unwrap();
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(human.contains("restoring: runs on a restored backup"), "cluster status says so:\n{human}");
    cluster.kill(1);
    // It comes back without the flag; the others start with it.
    cluster.nodes.get_mut(&1).unwrap().args.clear();
    cluster.spawn(1);
    for id in [2, 3] {
        cluster.nodes.get_mut(&id).unwrap().args = vec!["--restored".into()];
        cluster.spawn(id);
    }
    let leader = cluster.wait_leader().await;
    cluster.wait_ready().await;
    wait_named_anew(&cluster, leader, &old_name).await;
    assert!(cluster.logs().contains("the restore begun here has not ended"), "{}", cluster.logs());
    writes_reach_every_node(&cluster, leader, "k19", "v19").await;
    restart_ordinarily(&mut cluster).await;
}

/// A node started again with `--restored` once the restore has ended (the flag left in its
/// environment) would make its directory new storage that no peer has enrolled. It stops instead
/// with exit code 2, naming the flag, and leaves the directory as it was: started without the
/// flag it serves as before, with the same storage incarnation.
#[tokio::test(flavor = "multi_thread")]
async fn a_restored_flag_left_over_stops_the_node_and_changes_nothing() {
    let mut cluster = Cluster::start(3, &[]).await;
    cluster.set_anywhere("kept", "yes", Duration::from_secs(10)).await;
    let leader = cluster.wait_leader().await;
    let old_name = cluster_name(&cluster, leader).await;
    let committed = cluster.status(leader).await.unwrap()["committed_index"].as_u64().unwrap();
    let follower = cluster.running().into_iter().find(|id| *id != leader).unwrap();
    cluster.wait_applied(follower, committed).await;
    assert!(cluster.terminate(follower).success());
    let backup = cluster.dir.path().join("backup");
    copy_dir(&cluster.nodes[&follower].data_dir, &backup);
    let leader = restore_everywhere(&mut cluster, &backup).await;
    wait_named_anew(&cluster, leader, &old_name).await;

    // The restore has ended; a follower restarts with `--restored` still given.
    let stale = cluster.running().into_iter().find(|id| *id != leader).unwrap();
    let incarnation = cluster.status(stale).await.unwrap()["incarnation"].clone();
    assert!(cluster.terminate(stale).success());
    cluster.spawn(stale);
    let exit = cluster.wait_exit(stale, Duration::from_secs(20));
    assert_eq!(exit.and_then(|status| status.code()), Some(2), "{}", cluster.logs());
    assert!(
        cluster.logs().contains("--restored (STATESTORE_RESTORED) was given, but node"),
        "the reason names the flag\n{}",
        cluster.logs()
    );

    cluster.nodes.get_mut(&stale).unwrap().args.clear();
    cluster.spawn(stale);
    cluster.wait_ready().await;
    assert_eq!(cluster.status(stale).await.unwrap()["incarnation"], incarnation);
    writes_reach_every_node(&cluster, leader, "kept", "yes").await;

    // Every node started again with the flag left over at once: no peer serves, so each makes
    // its own directory new storage, as in a restore, and the cluster is named anew, keys kept.
    let name = cluster_name(&cluster, leader).await;
    for id in 1..=3u64 {
        assert!(cluster.terminate(id).success());
    }
    for id in 1..=3u64 {
        cluster.nodes.get_mut(&id).unwrap().args = vec!["--restored".into()];
        cluster.spawn(id);
    }
    let leader = cluster.wait_leader().await;
    cluster.wait_ready().await;
    wait_named_anew(&cluster, leader, &name).await;
    writes_reach_every_node(&cluster, leader, "kept", "yes").await;
}

/// The cluster's name as node `id` has applied it, once it has one (the leader names the
/// cluster within a second of leading).
async fn cluster_name(cluster: &Cluster, id: u64) -> String {
    let until = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let status = cluster.status(id).await.unwrap();
        if let Some(name) = status["cluster_id"].as_str() {
            return name.to_string();
        }
        assert!(std::time::Instant::now() < until, "the cluster was never named: {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every node stops (SIGKILL) and gets `backup` in place of its data directory; all start with
/// `--restored`. The restored cluster's leader, once every node is ready.
async fn restore_everywhere(cluster: &mut Cluster, backup: &Path) -> u64 {
    for id in cluster.running() {
        cluster.kill(id);
    }
    for id in 1..=3u64 {
        let dir = cluster.nodes[&id].data_dir.clone();
        std::fs::remove_dir_all(&dir).unwrap();
        copy_dir(backup, &dir);
    }
    for id in 1..=3u64 {
        cluster.nodes.get_mut(&id).unwrap().args = vec!["--restored".into()];
        cluster.spawn(id);
    }
    let leader = cluster.wait_leader().await;
    cluster.wait_ready().await;
    leader
}

/// The restored cluster is a new one: a name other than `old_name`, and every member's new
/// storage enrolled.
async fn wait_named_anew(cluster: &Cluster, leader: u64, old_name: &str) {
    let until = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let status = cluster.status(leader).await.unwrap();
        let renamed = status["cluster_id"].as_str().is_some_and(|name| name != old_name);
        if renamed && status["enrolled"].as_object().is_some_and(|enrolled| enrolled.len() == 3) {
            return;
        }
        assert!(std::time::Instant::now() < until, "the restored cluster was not named anew: {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The restored cluster takes writes, and every node applies them and holds `key` = `value`
/// from the backup.
async fn writes_reach_every_node(cluster: &Cluster, leader: u64, key: &str, value: &str) {
    cluster.set_anywhere("restored", "yes", Duration::from_secs(10)).await;
    let committed = cluster.status(leader).await.unwrap()["committed_index"].as_u64().unwrap();
    for id in 1..=3u64 {
        cluster.wait_applied(id, committed).await;
        assert_eq!(cluster.get_local(id, key).await.unwrap().response, Response::Value(value.as_bytes().to_vec()));
        assert_eq!(cluster.get_local(id, "restored").await.unwrap().response, Response::Value(b"yes".to_vec()));
    }
}

/// Later starts, without `--restored`, are ordinary ones.
async fn restart_ordinarily(cluster: &mut Cluster) {
    for id in 1..=3u64 {
        assert!(cluster.terminate(id).success());
        cluster.nodes.get_mut(&id).unwrap().args.clear();
        cluster.spawn(id);
    }
    cluster.wait_ready().await;
}

/// The CLI binary, built beside the node binary.
fn cli() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_statestore")).with_file_name("statestore-cli")
}

fn run_cli(endpoint: &str, args: &[&str]) -> (Option<i32>, String) {
    let output = std::process::Command::new(cli())
        .args(["--json", "--endpoint", endpoint])
        .args(args)
        .env_remove("STATESTORE_ENDPOINTS")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.code(), text)
}

/// A GET of `key` at node `id`: the value and its version.
async fn read(cluster: &Cluster, id: u64, key: &str) -> (Response, Option<String>) {
    let answer = cluster.get(id, key).await.unwrap();
    (answer.response, answer.version)
}

/// `snapshot save` takes every key of a cluster that keeps serving writes, through any node;
/// a damaged or cut copy of the file is refused without changing anything; `snapshot restore`
/// seeds a new cluster with every key, value, version, fencing token and deadline; versions it
/// issues afterwards are newer; a second restore into it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_save_and_restore_seed_a_new_cluster_with_identical_keys() {
    let old = Cluster::start(3, &[]).await;
    let leader = old.wait_leader().await;
    let follower = old.running().into_iter().find(|id| *id != leader).unwrap();
    for i in 0..300 {
        let answer = old.set(leader, &format!("key/{i:03}"), &format!("value {i}")).await.unwrap();
        assert_eq!(answer.response, Response::Ok);
    }
    // A fenced key, and a key with a deadline.
    let token = statestore_protocol::Hlc::new(common::now_ms(), 7, "holder").to_string();
    let fenced = old
        .http
        .post(format!("{}/v1/command", old.url(leader)))
        .header("statestore-ts", common::timestamp())
        .header("statestore-ft", &token)
        .body(statestore_protocol::Set::new("fenced", "guarded").encode())
        .send()
        .await
        .unwrap();
    assert_eq!(fenced.status(), 200);
    let px = statestore_protocol::Set {
        key: b"expiring".to_vec(),
        value: b"soon".to_vec(),
        condition: statestore_protocol::SetCondition::Always,
        expiry_ms: Some(600_000),
    };
    assert_eq!(old.command(leader, px.encode(), Some(&common::timestamp()), "").await.unwrap().response, Response::Ok);

    // Saved through a follower, which forwards to the leader.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cluster.ssbk");
    let (code, text) = run_cli(&old.url(follower), &["snapshot", "save", file.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{text}");
    let saved: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(saved["keys"], 302, "{saved}");
    let mut expected = Vec::new();
    for i in 0..300 {
        let key = format!("key/{i:03}");
        expected.push((key.clone(), read(&old, leader, &key).await));
    }
    for key in ["fenced", "expiring"] {
        expected.push((key.to_string(), read(&old, leader, key).await));
    }
    assert!(expected.iter().all(|(_, (_, version))| version.is_some()), "every key read back with its version");

    // A new cluster; damaged copies are refused and change nothing.
    let new = Cluster::start(3, &[]).await;
    let new_leader = new.wait_leader().await;
    let bytes = std::fs::read(&file).unwrap();
    let (flipped, cut) = (dir.path().join("flipped.ssbk"), dir.path().join("cut.ssbk"));
    let mut damaged = bytes.clone();
    damaged[bytes.len() / 2] ^= 0x40;
    std::fs::write(&flipped, damaged).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() - 100]).unwrap();
    for (bad, needle) in [(&flipped, "damaged"), (&cut, "truncated")] {
        let (code, text) = run_cli(&new.url(new_leader), &["snapshot", "restore", bad.to_str().unwrap()]);
        assert_eq!(code, Some(3), "{text}");
        assert!(text.contains(needle), "{text}");
    }
    assert_eq!(read(&new, new_leader, "key/000").await.0, Response::Nil, "a refused restore wrote keys");

    let (code, text) = run_cli(&new.url(new_leader), &["snapshot", "restore", file.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{text}");
    for id in new.running() {
        let index = new.status(new_leader).await.unwrap()["committed_index"].as_u64().unwrap();
        new.wait_applied(id, index).await;
    }
    for (key, (response, version)) in &expected {
        assert_eq!(&read(&new, new_leader, key).await, &(response.clone(), version.clone()), "{key}");
    }
    // The fencing token came along: a write without one, or with an older one, is refused.
    let unfenced = new.set(new_leader, "fenced", "taken").await.unwrap();
    assert!(matches!(unfenced.response, Response::Error(_)), "{unfenced:?}");
    // New versions are newer than every restored one.
    let hlc = |text: &str| text.parse::<statestore_protocol::Hlc>().unwrap();
    let newest = expected.iter().filter_map(|(_, (_, v))| v.as_deref().map(hlc)).max().unwrap();
    let after = hlc(&new.set(new_leader, "after-restore", "v").await.unwrap().version.unwrap());
    assert!(after > newest, "{after} is not newer than the restored {newest}");

    // Restoring again into a cluster that holds keys is refused.
    let (code, text) = run_cli(&new.url(new_leader), &["snapshot", "restore", file.to_str().unwrap()]);
    assert_eq!(code, Some(3), "{text}");
    assert!(text.contains("already holds keys"), "{text}");
}
