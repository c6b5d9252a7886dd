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

/// A one-node cluster holding `KEYS` acknowledged writes, killed with SIGKILL.
async fn written_and_killed() -> Cluster {
    let mut cluster = Cluster::start(1, &[]).await;
    let writes = (0..KEYS).map(|i| {
        let cluster = &cluster;
        async move { cluster.set(1, &format!("key-{i}"), "acknowledged").await.expect("a write") }
    });
    futures::stream::iter(writes).buffer_unordered(16).collect::<Vec<_>>().await;
    cluster.kill(1);
    cluster
}

fn assert_stops_as_damaged(cluster: &mut Cluster, what: &str) {
    cluster.spawn(1);
    let Some(status) = cluster.wait_exit(1, Duration::from_secs(20)) else {
        panic!("the node started on a damaged {what}\n{}", cluster.logs());
    };
    let logs = cluster.logs();
    assert_eq!(status.code(), Some(DAMAGED), "exit status {status} for a damaged {what}\n{logs}");
    assert!(logs.contains("is damaged") && logs.contains("Damaged storage"), "a clear message\n{logs}");
}

/// RocksDB's default recovery cuts the WAL at the first bad record and drops every record after
/// it, fsynced ones included: a node came back without thousands of acknowledged writes.
#[tokio::test(flavor = "multi_thread")]
async fn a_damaged_wal_stops_the_node_instead_of_dropping_acknowledged_writes() {
    let mut cluster = written_and_killed().await;
    let db = cluster.nodes[&1].data_dir.join("db");
    let (wal, len) = files(&db, ".log").into_iter().next().expect("a WAL file");
    assert!(len > 100_000, "{KEYS} writes are in the WAL ({len} bytes)");
    let mut bytes = std::fs::read(&wal).unwrap();
    let middle = bytes.len() / 2;
    for byte in &mut bytes[middle..middle + 64] {
        *byte ^= 0x5a;
    }
    std::fs::write(&wal, bytes).unwrap();
    assert_stops_as_damaged(&mut cluster, "WAL");
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
    assert_stops_as_damaged(&mut cluster, "table file");
}
