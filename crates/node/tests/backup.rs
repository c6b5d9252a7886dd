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
    let until = std::time::Instant::now() + Duration::from_secs(10);
    let old_name = loop {
        // The leader names the cluster within a second of leading.
        let status = cluster.status(leader).await.unwrap();
        if let Some(name) = status["cluster_id"].as_str() {
            break name.to_string();
        }
        assert!(std::time::Instant::now() < until, "the cluster was never named: {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for id in cluster.running() {
        cluster.kill(id);
    }
    for id in 1..=3u64 {
        let dir = cluster.nodes[&id].data_dir.clone();
        std::fs::remove_dir_all(&dir).unwrap();
        copy_dir(&backup, &dir);
    }
    for id in 1..=3u64 {
        cluster.nodes.get_mut(&id).unwrap().args = vec!["--restored".into()];
        cluster.spawn(id);
    }
    let leader = cluster.wait_leader().await;
    cluster.wait_ready().await;
    // The restored cluster is a new one: a new name, and every member's new storage enrolled.
    let until = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let status = cluster.status(leader).await.unwrap();
        let renamed = status["cluster_id"].as_str().is_some_and(|name| name != old_name);
        if renamed && status["enrolled"].as_object().is_some_and(|enrolled| enrolled.len() == 3) {
            break;
        }
        assert!(std::time::Instant::now() < until, "the restored cluster was not named anew: {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (i, version) in versions.iter().enumerate() {
        let answer = cluster.get(leader, &format!("k{i}")).await.unwrap();
        assert_eq!(answer.response, Response::Value(format!("v{i}").into_bytes()), "k{i}");
        assert_eq!(answer.version.as_ref(), Some(version), "k{i} keeps its version");
    }
    assert_eq!(cluster.get(leader, "after-backup").await.unwrap().response, Response::Nil);
    // The restored cluster takes writes, and every node has the same data.
    cluster.set_anywhere("restored", "yes", Duration::from_secs(10)).await;
    let committed = cluster.status(leader).await.unwrap()["committed_index"].as_u64().unwrap();
    for id in 1..=3u64 {
        cluster.wait_applied(id, committed).await;
        assert_eq!(cluster.get_local(id, "k119").await.unwrap().response, Response::Value(b"v119".to_vec()));
        assert_eq!(cluster.get_local(id, "restored").await.unwrap().response, Response::Value(b"yes".to_vec()));
    }
    // Later starts are ordinary ones.
    for id in 1..=3u64 {
        assert!(cluster.terminate(id).success());
        cluster.nodes.get_mut(&id).unwrap().args.clear();
        cluster.spawn(id);
    }
    cluster.wait_ready().await;
}
