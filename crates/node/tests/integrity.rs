//! Damaged storage stops a node with a clear message and its own exit code, instead of being
//! repaired silently by dropping what no longer reads back.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::Cluster;
use futures::StreamExt;
use statestore_protocol::Response;

/// The exit code of damaged storage (`statestore_node::server::EXIT_DAMAGED_STORAGE`).
const DAMAGED: i32 = 3;
const KEYS: usize = 2_000;

/// Files in `dir` whose name ends with `suffix`, largest first.
fn files(dir: &Path, suffix: &str) -> Vec<(PathBuf, u64)> {
    let mut found: Vec<(PathBuf, u64)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.to_string_lossy().ends_with(suffix))
        .map(|path| {
            let len = std::fs::metadata(&path).unwrap().len();
            (path, len)
        })
        .collect();
    found.sort_by_key(|(_, len)| std::cmp::Reverse(*len));
    found
}

/// Snapshot after 40 entries and keep no log below it: a new member can only start from a
/// snapshot.
const SNAPSHOT_OFTEN: &[&str] = &["--snapshot-every", "40", "--logs-kept", "0"];

async fn write_keys(cluster: &Cluster, count: usize) {
    let writes = (0..count).map(|i| async move {
        cluster.set(1, &format!("key-{i}"), "acknowledged").await.expect("a write");
    });
    futures::stream::iter(writes).buffer_unordered(16).collect::<Vec<_>>().await;
}

/// A one-node cluster holding `KEYS` acknowledged writes, killed with SIGKILL.
async fn written_and_killed() -> Cluster {
    let mut cluster = Cluster::start(1, &[]).await;
    write_keys(&cluster, KEYS).await;
    cluster.kill(1);
    cluster
}

/// A one-node cluster that has written `KEYS` keys and kept a snapshot of them; the path of
/// the snapshot's data file.
async fn written_with_a_snapshot() -> (Cluster, PathBuf) {
    let cluster = Cluster::start(1, SNAPSHOT_OFTEN).await;
    write_keys(&cluster, KEYS).await;
    // One covering every write, so that no other is built after it.
    let requested = cluster.http.post(format!("{}/cluster/snapshot", cluster.url(1))).send().await.unwrap();
    assert_eq!(requested.status(), 202);
    let requested: serde_json::Value = requested.json().await.unwrap();
    cluster.wait_snapshot_covering(1, requested["applied_index"].as_u64().unwrap()).await;
    let snapshots = cluster.nodes[&1].data_dir.join("snapshots");
    let (data, len) = files(&snapshots, ".data").into_iter().next().expect("a snapshot data file");
    assert!(len > 50_000, "the snapshot holds {KEYS} keys ({len} bytes)");
    (cluster, data)
}

/// Flips bytes in the middle of `path`, leaving its length as it was.
fn damage(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let middle = bytes.len() / 2;
    for byte in &mut bytes[middle..middle + 64] {
        *byte ^= 0x5a;
    }
    std::fs::write(path, bytes).unwrap();
}

/// Starts node `id` and waits for it to stop on its damaged `what`.
fn assert_stops_as_damaged(cluster: &mut Cluster, id: u64, what: &str) {
    cluster.spawn(id);
    let Some(status) = cluster.wait_exit(id, Duration::from_secs(20)) else {
        panic!("node {id} started on a damaged {what}\n{}", cluster.logs());
    };
    let logs = cluster.logs();
    assert_eq!(status.code(), Some(DAMAGED), "exit status {status} for a damaged {what}\n{logs}");
    assert!(logs.contains("is damaged") && logs.contains("Damaged storage"), "a clear message\n{logs}");
}

/// RocksDB's default recovery cuts the WAL at the first bad record and drops every record after
/// it, fsynced ones included. The WAL holds the Raft metadata (votes, committed indexes).
#[tokio::test(flavor = "multi_thread")]
async fn a_damaged_wal_stops_the_node_instead_of_dropping_what_it_holds() {
    let mut cluster = written_and_killed().await;
    let db = cluster.nodes[&1].data_dir.join("db");
    let (wal, len) = files(&db, ".log").into_iter().next().expect("a WAL file");
    assert!(len > 1_000, "the committed indexes of {KEYS} writes are in the WAL ({len} bytes)");
    damage(&wal);
    assert_stops_as_damaged(&mut cluster, 1, "WAL");
}

/// RocksDB takes a record whose length runs past the end of the file for a write torn by a
/// crash: it opens without an error and without the synced records after it (commit marks,
/// votes). The node reads its WAL first and stops.
#[tokio::test(flavor = "multi_thread")]
async fn a_wal_record_whose_length_runs_past_the_end_stops_the_node() {
    let mut cluster = written_and_killed().await;
    let db = cluster.nodes[&1].data_dir.join("db");
    let (wal, _) = files(&db, ".log").into_iter().next().expect("a WAL file");
    let mut bytes = std::fs::read(&wal).unwrap();
    let records = statestore_raft::wal_check::record_starts(&bytes);
    // A record of the last 32 KiB block with others after it.
    let last_block = (bytes.len() - 1) / (32 * 1024) * (32 * 1024);
    let in_last_block: Vec<usize> = records.into_iter().filter(|&at| at >= last_block).collect();
    assert!(in_last_block.len() > 20, "records in the WAL's last block: {in_last_block:?}");
    let target = in_last_block[in_last_block.len() / 2];
    bytes[target + 4..target + 6].copy_from_slice(&u16::MAX.to_le_bytes());
    std::fs::write(&wal, bytes).unwrap();
    assert_stops_as_damaged(&mut cluster, 1, "WAL");
    assert!(cluster.logs().contains(&format!("the record at byte {target}")), "{}", cluster.logs());
}

/// A vote is written (synced, through RocksDB's WAL) before any log entry of its term. A node
/// whose WAL file is lost, as a disk or a copy can lose a file, comes back with an older vote:
/// with it, it could vote a second time in a term it has voted in. It stops instead.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_whose_wal_is_lost_stops_instead_of_forgetting_its_vote() {
    let mut cluster = Cluster::start(3, &[]).await;
    let first = cluster.wait_leader().await;
    cluster.set(first, "in-the-first-term", "acknowledged").await.expect("a write");
    // A new term: its votes and entries reach the two others.
    cluster.kill(first);
    let second = cluster.wait_leader().await;
    cluster.set(second, "in-the-second-term", "acknowledged").await.expect("a write");
    let node = second;
    cluster.kill(node);
    let db = cluster.nodes[&node].data_dir.join("db");
    let wals = files(&db, ".log");
    assert!(!wals.is_empty(), "a WAL file");
    for (wal, _) in wals {
        std::fs::remove_file(wal).unwrap();
    }
    assert_stops_as_damaged(&mut cluster, node, "vote");
    let logs = cluster.logs();
    assert!(logs.contains("but the vote kept in RocksDB is of term"), "{logs}");
}

/// The entries a node wrote to its Raft log may be ones a quorum counted it for. A node whose log
/// directory is gone (deleted for a directory of text logs, a volume not mounted) stops instead of
/// starting from what its tables hold, even after a clean stop, when they hold every entry it
/// knew committed (it may have acknowledged later ones).
#[tokio::test(flavor = "multi_thread")]
async fn a_node_whose_raft_log_directory_is_lost_stops() {
    let mut cluster = Cluster::start(1, &[]).await;
    write_keys(&cluster, KEYS).await;
    assert!(cluster.terminate(1).success(), "a clean stop\n{}", cluster.logs());
    std::fs::remove_dir_all(cluster.nodes[&1].data_dir.join("log")).unwrap();
    assert_stops_as_damaged(&mut cluster, 1, "Raft log");
    let logs = cluster.logs();
    assert!(logs.contains("lost entries: the directory is missing"), "{logs}");
}

/// Deletes every segment file of node `id`'s Raft log, leaving its directory.
fn delete_raft_log_segments(cluster: &Cluster, id: u64) {
    let segments = files(&cluster.nodes[&id].data_dir.join("log"), ".segment");
    assert!(!segments.is_empty(), "a log segment");
    for (segment, _) in segments {
        std::fs::remove_file(segment).unwrap();
    }
}

/// Killed with `kill -9` before its applied state was flushed, the node's tables on disk are
/// behind what it committed: those entries are only in its log. With the log's segment files
/// gone it stops instead of starting without them.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_whose_raft_log_segments_are_lost_stops() {
    let never = "1000000000";
    let mut cluster = Cluster::start(1, &["--flush-after-entries", never, "--flush-after-operations", never]).await;
    write_keys(&cluster, KEYS).await;
    cluster.kill(1);
    delete_raft_log_segments(&cluster, 1);
    assert_stops_as_damaged(&mut cluster, 1, "Raft log");
    let logs = cluster.logs();
    assert!(logs.contains("lost entries: it holds no entry, but this node committed entries up to"), "{logs}");
}

/// Stopped cleanly, the node's tables hold every entry it knew committed, but its log may hold
/// later ones a leader counted it for. Segment files deleted while it was stopped (the directory
/// kept) are found from what it recorded at the stop: it stops instead of starting without them.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_whose_raft_log_segments_are_lost_after_a_clean_stop_stops() {
    let mut cluster = Cluster::start(1, &[]).await;
    write_keys(&cluster, KEYS).await;
    assert!(cluster.terminate(1).success(), "a clean stop\n{}", cluster.logs());
    delete_raft_log_segments(&cluster, 1);
    assert_stops_as_damaged(&mut cluster, 1, "Raft log");
    let logs = cluster.logs();
    assert!(logs.contains("lost entries: it holds no entry, but it held entries"), "{logs}");
}

/// Applies `change` to node 1's Raft log segment from the middle of what was written to the
/// end of the file (the segment is allocated whole, so the middle of the file is zeros).
fn change_the_raft_log_middle(cluster: &Cluster, change: impl FnOnce(&mut [u8])) {
    let log = cluster.nodes[&1].data_dir.join("log");
    let (segment, _) = files(&log, ".segment").into_iter().next().expect("a log segment");
    let mut bytes = std::fs::read(&segment).unwrap();
    let written = bytes.iter().rposition(|&b| b != 0).expect("records in the segment");
    assert!(written > 100_000, "{KEYS} writes are in the log ({written} bytes)");
    change(&mut bytes[written / 2..]);
    std::fs::write(&segment, bytes).unwrap();
}

/// A Raft log segment is allocated whole, so the middle of the file is zeros: the damage goes
/// into the middle of what was written. A bad record with more records after it is not cut off
/// as if a crash had torn it: the node stops instead of coming back without acknowledged writes.
#[tokio::test(flavor = "multi_thread")]
async fn a_damaged_raft_log_stops_the_node_instead_of_dropping_acknowledged_writes() {
    let mut cluster = written_and_killed().await;
    change_the_raft_log_middle(&cluster, |middle| {
        for byte in middle.iter_mut().take(64) {
            *byte ^= 0x5a;
        }
    });
    assert_stops_as_damaged(&mut cluster, 1, "Raft log");
}

/// A crash can leave a sector of zeros only in a write that was never flushed, so never
/// committed. A sector zeroed in the middle of what the node had committed looks the same to a
/// checksum, but the node knows it had flushed that record: it stops instead of cutting its log
/// there and zeroing the committed records after it.
#[tokio::test(flavor = "multi_thread")]
async fn a_zeroed_sector_in_committed_raft_log_records_stops_the_node() {
    let mut cluster = written_and_killed().await;
    change_the_raft_log_middle(&cluster, |middle| {
        // The first whole sector of the file inside `middle` (the file is whole sectors long).
        let sector = middle.len() % 512;
        middle[sector..sector + 512].fill(0);
    });
    assert_stops_as_damaged(&mut cluster, 1, "Raft log");
}

/// A table file cut short (a disk that lost its tail) is found when the database opens.
#[tokio::test(flavor = "multi_thread")]
async fn a_truncated_table_file_stops_the_node() {
    let mut cluster = written_and_killed().await;
    // Opening after a crash replays the WAL into table files.
    cluster.spawn(1);
    cluster.wait_ready().await;
    assert_eq!(
        cluster.get_local(1, "key-0").await.expect("a read").response,
        Response::Value(b"acknowledged".to_vec())
    );
    assert!(cluster.terminate(1).success());
    let db = cluster.nodes[&1].data_dir.join("db");
    let (table, len) = files(&db, ".sst").into_iter().next().expect("table files after a recovery");
    let file = std::fs::OpenOptions::new().write(true).open(&table).unwrap();
    file.set_len(len / 2).unwrap();
    assert_stops_as_damaged(&mut cluster, 1, "table file");
}

/// The kept snapshot is what a new or lagging member starts from; a damaged one was found only
/// when a member tried to install it.
#[tokio::test(flavor = "multi_thread")]
async fn a_damaged_snapshot_stops_the_node_at_start() {
    let (mut cluster, data) = written_with_a_snapshot().await;
    assert!(cluster.terminate(1).success());
    damage(&data);
    assert_stops_as_damaged(&mut cluster, 1, "snapshot");
}

/// A snapshot damaged while the node runs is found before it is sent: the node stops, and the
/// member it was meant for is not harmed by it.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_stops_rather_than_send_a_damaged_snapshot() {
    let (mut cluster, data) = written_with_a_snapshot().await;
    damage(&data);
    cluster.start_new_node(2);
    // The answer does not matter: the node is expected to stop while this waits for the
    // learner to catch up, and not to wait for it.
    let add = cluster.add_learner(1, 2).timeout(Duration::from_secs(60)).send();
    let add = tokio::spawn(add);
    let Some(status) = cluster.wait_exit(1, Duration::from_secs(10)) else {
        panic!("node 1 runs on with a damaged snapshot, or does not stop within 10 s\n{}", cluster.logs());
    };
    add.abort();
    let logs = cluster.logs();
    assert_eq!(status.code(), Some(DAMAGED), "exit status {status}\n{logs}");
    assert!(logs.contains("is damaged") && logs.contains("Damaged storage"), "a clear message\n{logs}");
    assert!(cluster.wait_exit(2, Duration::from_millis(500)).is_none(), "the learner stopped too\n{logs}");
}

/// RocksDB checks a block's checksum when it reads the block, not when it opens the file, so a
/// node may start on a table file with a damaged block. The first read that meets the damage
/// must stop the node, and no read may answer anything but what was written.
#[tokio::test(flavor = "multi_thread")]
async fn a_damaged_table_block_stops_the_node_when_a_read_meets_it() {
    // Values that do not compress away, so that the keys' table file holds many data blocks.
    let value = |i: usize| -> String {
        let mut x = i as u64;
        (0..16)
            .map(|_| {
                x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let z = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                format!("{:016x}", z ^ (z >> 31))
            })
            .collect()
    };
    let mut cluster = Cluster::start(1, &[]).await;
    let writes = (0..KEYS).map(|i| {
        let cluster = &cluster;
        async move { cluster.set(1, &format!("key-{i}"), &value(i)).await.expect("a write") }
    });
    futures::stream::iter(writes).buffer_unordered(16).collect::<Vec<_>>().await;
    cluster.kill(1);
    // Opening after a crash replays the WAL into table files.
    cluster.spawn(1);
    cluster.wait_ready().await;
    assert!(cluster.terminate(1).success());
    // The keys' table file names its column family in its properties block.
    let db = cluster.nodes[&1].data_dir.join("db");
    let keys_table = files(&db, ".sst")
        .into_iter()
        .find(|(path, _)| std::fs::read(path).unwrap().windows(b"sm_keys".len()).any(|window| window == b"sm_keys"));
    let (table, len) = keys_table.expect("the keys' table file after a recovery");
    assert!(len > 100_000, "{KEYS} keys are in their table file ({len} bytes)");
    // A quarter in: among the data blocks, away from the index, filter and footer at the end.
    let mut bytes = std::fs::read(&table).unwrap();
    let at = bytes.len() / 4;
    for byte in &mut bytes[at..at + 64] {
        *byte ^= 0x5a;
    }
    std::fs::write(&table, bytes).unwrap();

    cluster.spawn(1);
    // The damage may be in a block read when the table opens: then the node stops at start.
    let started = std::time::Instant::now();
    let mut exited = None;
    while exited.is_none() {
        let health = cluster.http.get(format!("{}/health", cluster.url(1))).send().await;
        if health.is_ok_and(|r| r.status().is_success()) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "node 1 neither serves nor stops\n{}", cluster.logs());
        exited = cluster.wait_exit(1, Duration::from_millis(50));
    }
    if let Some(status) = exited {
        assert_eq!(status.code(), Some(DAMAGED), "exit status {status} at start\n{}", cluster.logs());
        return;
    }
    let mut refused = 0;
    for i in 0..KEYS {
        match cluster.get_local(1, &format!("key-{i}")).await {
            Ok(answer) => assert_eq!(answer.response, Response::Value(value(i).into_bytes()), "key-{i}"),
            Err(_) => refused += 1,
        }
        if refused > 0 {
            break;
        }
    }
    assert!(refused > 0, "every key read back although a block is damaged\n{}", cluster.logs());
    let Some(status) = cluster.wait_exit(1, Duration::from_secs(10)) else {
        panic!("the node serves on after a read met a damaged block\n{}", cluster.logs());
    };
    let logs = cluster.logs();
    assert_eq!(status.code(), Some(DAMAGED), "exit status {status}\n{logs}");
    assert!(logs.contains("is damaged") && logs.contains("Damaged storage"), "a clear message\n{logs}");
}
