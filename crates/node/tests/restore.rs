//! `POST /cluster/restore` takes chunks only into a cluster being restored: the first chunk of a
//! session into an empty cluster, later ones of that session while no client has written, and
//! none with versions from the future or that this store would not have issued.

mod common;

use common::Cluster;
use serde_json::Value;
use statestore_protocol::backup::{encode_key, BackupKey};
use statestore_protocol::{Hlc, Response};

fn backup_key(key: &str, value: &str, version: Hlc) -> BackupKey {
    BackupKey {
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
        version,
        fencing_token: None,
        expires_at: None,
    }
}

/// A version the store could have issued a second ago.
fn past_version(counter: u64) -> Hlc {
    Hlc::new(common::now_ms() - 1_000, counter, statestore_statemachine::VERSION_NODE_ID)
}

/// Sends one chunk of `keys` to node `id`: the status and the JSON body.
async fn send_chunk(cluster: &Cluster, id: u64, session: u64, first: bool, keys: &[BackupKey]) -> (u16, Value) {
    let mut body = Vec::new();
    for key in keys {
        encode_key(key, &mut body);
    }
    let url = format!("{}/cluster/restore?session={session}&first={first}", cluster.url(id));
    let response = cluster.http.post(url).body(body).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn value(cluster: &Cluster, id: u64, key: &str) -> Response {
    cluster.get(id, key).await.unwrap().response
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_chunks_are_refused_once_the_cluster_holds_keys_the_restore_did_not_write() {
    let cluster = Cluster::start(1, &[]).await;
    let (status, body) = send_chunk(&cluster, 1, 7, true, &[backup_key("r1", "one", past_version(1))]).await;
    assert_eq!((status, &body["restored"]), (200, &Value::from(1)), "{body}");
    // A chunk of the same session goes on while nobody else writes.
    let (status, body) = send_chunk(&cluster, 1, 7, false, &[backup_key("r2", "two", past_version(2))]).await;
    assert_eq!(status, 200, "{body}");

    // A client writes between chunks: the restore takes no more chunks, and changes nothing.
    assert_eq!(cluster.set(1, "live", "x").await.unwrap().response, Response::Ok);
    let later = [backup_key("r3", "three", past_version(3)), backup_key("live", "restored", past_version(4))];
    let (status, body) = send_chunk(&cluster, 1, 7, false, &later).await;
    assert_eq!((status, body["code"].as_str()), (409, Some("written_during_restore")), "{body}");
    assert!(body["message"].as_str().unwrap().contains("\"live\""), "{body}");
    assert_eq!(value(&cluster, 1, "r3").await, Response::Nil);
    assert_eq!(value(&cluster, 1, "live").await, Response::Value(b"x".to_vec()));

    // A later chunk of no session under way, and a first chunk into a cluster with keys.
    let (status, body) = send_chunk(&cluster, 1, 8, false, &later).await;
    assert_eq!((status, body["code"].as_str()), (409, Some("no_restore_session")), "{body}");
    let (status, body) = send_chunk(&cluster, 1, 9, true, &later).await;
    assert_eq!((status, body["code"].as_str()), (409, Some("not_empty")), "{body}");
    assert_eq!(value(&cluster, 1, "r3").await, Response::Nil);
    assert_eq!(value(&cluster, 1, "live").await, Response::Value(b"x".to_vec()));
    assert_eq!(value(&cluster, 1, "r1").await, Response::Value(b"one".to_vec()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_restore_chunk_is_refused_into_a_cluster_a_client_wrote_to() {
    let cluster = Cluster::start(1, &[]).await;
    assert_eq!(cluster.set(1, "live", "x").await.unwrap().response, Response::Ok);
    // Not even as a later chunk of a session that never began.
    let chunk = [backup_key("live", "restored", past_version(1)), backup_key("r1", "one", past_version(2))];
    let (status, body) = send_chunk(&cluster, 1, 5, false, &chunk).await;
    assert_eq!((status, body["code"].as_str()), (409, Some("no_restore_session")), "{body}");
    let (status, body) = send_chunk(&cluster, 1, 5, true, &chunk).await;
    assert_eq!((status, body["code"].as_str()), (409, Some("not_empty")), "{body}");
    assert_eq!(value(&cluster, 1, "live").await, Response::Value(b"x".to_vec()));
    assert_eq!(value(&cluster, 1, "r1").await, Response::Nil);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_with_a_version_from_the_future_or_not_the_stores_is_refused() {
    let cluster = Cluster::start(1, &[]).await;
    let in_a_day = Hlc::new(common::now_ms() + 86_400_000, 0, statestore_statemachine::VERSION_NODE_ID);
    let future = [backup_key("r1", "one", past_version(1)), backup_key("r2", "two", in_a_day.clone())];
    let (status, body) = send_chunk(&cluster, 1, 7, true, &future).await;
    assert_eq!((status, body["code"].as_str()), (400, Some("bad_version")), "{body}");
    assert!(body["message"].as_str().unwrap().contains("--max-clock-offset-ms"), "{body}");
    let mut fenced = backup_key("r3", "three", past_version(3));
    fenced.fencing_token = Some(in_a_day);
    let (status, body) = send_chunk(&cluster, 1, 7, true, &[fenced]).await;
    assert_eq!((status, body["code"].as_str()), (400, Some("bad_version")), "{body}");
    let foreign = backup_key("r4", "four", Hlc::new(common::now_ms(), 0, "someone-else"));
    let (status, body) = send_chunk(&cluster, 1, 7, true, &[foreign]).await;
    assert_eq!((status, body["code"].as_str()), (400, Some("bad_version")), "{body}");
    for key in ["r1", "r2", "r3", "r4"] {
        assert_eq!(value(&cluster, 1, key).await, Response::Nil, "{key}");
    }
    // The same keys with sound versions are taken.
    let (status, body) = send_chunk(&cluster, 1, 7, true, &future[..1]).await;
    assert_eq!(status, 200, "{body}");
}
