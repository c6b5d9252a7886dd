//! The HTTP API's answers to wrong input, and the node's lifecycle: health, readiness, metrics,
//! a graceful stop, refusing a bad configuration.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{barrage, metric, Cluster, DEADLINE};
use serde_json::{json, Value};
use statestore_protocol::Response;

async fn post(cluster: &Cluster, id: u64, path: &str, body: &str) -> (u16, Value) {
    let response = cluster
        .http
        .post(format!("{}{path}", cluster.url(id)))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or_else(|_| panic!("{path} answered non-JSON: {text:?}")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_requests_with_wrong_input_get_a_json_error() {
    let cluster = Cluster::start(1, &[]).await;
    let cases: &[(&str, &str, u16, &str)] = &[
        ("/cluster/learners", "{not json", 400, "bad_request"),
        ("/cluster/learners", "", 400, "bad_request"),
        ("/cluster/learners", r#"{"id": "four", "address": "http://127.0.0.1:1"}"#, 400, "bad_request"),
        ("/cluster/learners", r#"{"id": 4}"#, 400, "bad_request"),
        ("/cluster/learners", r#"{"id": 4, "address": "http://127.0.0.1:1", "extra": 1}"#, 400, "bad_request"),
        ("/cluster/learners", r#"{"id": 0, "address": "http://127.0.0.1:1"}"#, 400, "bad_request"),
        ("/cluster/learners", r#"{"id": 4, "address": "127.0.0.1:1"}"#, 400, "bad_request"),
        ("/cluster/learners", r#"{"id": 1, "address": "http://127.0.0.1:1"}"#, 409, "already_voter"),
        ("/cluster/members", "[1,2]", 400, "bad_request"),
        ("/cluster/members", "{}", 400, "bad_request"),
        ("/cluster/members", r#"{"promote": [9]}"#, 404, "unknown_node"),
        ("/cluster/members", r#"{"remove": [9]}"#, 404, "unknown_node"),
        ("/cluster/members", r#"{"promote": [1], "remove": [1]}"#, 400, "bad_request"),
        ("/cluster/members", r#"{"remove": [1]}"#, 400, "last_voter"),
        ("/cluster/members", r#"{"remove": [-1]}"#, 400, "bad_request"),
    ];
    for (path, body, status, code) in cases {
        let (got_status, got_body) = post(&cluster, 1, path, body).await;
        assert_eq!((got_status, got_body["code"].as_str().unwrap()), (*status, *code), "{path} {body}: {got_body}");
        assert!(!got_body["message"].as_str().unwrap().is_empty());
    }
    // After all that the node still serves, and is still the only voter.
    assert_eq!(cluster.set(1, "k", "v").await.unwrap().response, Response::Ok);
    let status = cluster.status(1).await.unwrap();
    assert_eq!(status["voters"], json!([{"id": 1, "address": cluster.url(1)}]));
}

/// A follower carries a membership change (and a `/v1/command`) to the leader and returns its
/// answer; a request it was forwarded already is answered 421 with the leader instead of going
/// round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_forward_membership_changes_to_the_leader() {
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_leader().await;
    let follower = cluster.running().into_iter().find(|id| *id != leader).unwrap();
    let other = cluster.running().into_iter().find(|id| *id != leader && *id != follower).unwrap();
    for (path, body) in [
        ("/cluster/members", format!(r#"{{"remove": [{other}]}}"#)),
        ("/cluster/learners", r#"{"id": 7, "address": "http://127.0.0.1:1"}"#.to_string()),
        ("/v1/command", "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n".to_string()),
    ] {
        let response = cluster
            .http
            .post(format!("{}{path}", cluster.url(follower)))
            .header("x-statestore-forwarded-by", "9")
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 421);
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body["leader_id"].as_u64(), Some(leader));
        assert_eq!(body["leader_address"].as_str(), Some(cluster.url(leader).as_str()));
    }
    assert_eq!(cluster.status(leader).await.unwrap()["voters"].as_array().unwrap().len(), 3);
    let (status, body) = post(&cluster, follower, "/cluster/members", &format!(r#"{{"remove": [{other}]}}"#)).await;
    assert_eq!(status, 200, "{body}");
    let voters: Vec<u64> = body["voters"].as_array().unwrap().iter().map(|v| v["id"].as_u64().unwrap()).collect();
    assert_eq!(voters.len(), 2, "{body}");
    assert!(!voters.contains(&other), "{body}");
    assert_eq!(cluster.status(leader).await.unwrap()["voters"].as_array().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raft_and_command_routes_refuse_malformed_bodies() {
    let cluster = Cluster::start(1, &[]).await;
    for path in ["/raft/append", "/raft/vote", "/raft/snapshot"] {
        let response = cluster.http.post(format!("{}{path}", cluster.url(1))).body(vec![0xFF; 7]).send().await.unwrap();
        assert_eq!(response.status(), 400, "{path}");
    }
    // A malformed RESP3 request is the protocol's error, not an HTTP one.
    let answer = cluster.command(1, b"*1\r\n$3\r\nGE".to_vec(), None, "").await.unwrap();
    assert!(matches!(answer.response, Response::Error(_)), "{answer:?}");
    let answer = cluster.command(1, statestore_protocol::Set::new("k", "v").encode(), None, "").await.unwrap();
    assert_eq!(answer.response.encode(), b"-ERR missing timestamp\r\n".to_vec());
    for query in ["?consistency=stale", "?other=1"] {
        match cluster.command(1, b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n".to_vec(), None, query).await {
            Err(common::Refused::Status(400, body)) => assert_eq!(body["code"], "bad_request"),
            other => panic!("{query}: {other:?}"),
        }
    }
    let missing = cluster.http.get(format!("{}/no/such/route", cluster.url(1))).send().await.unwrap();
    assert_eq!(missing.status(), 404);
    assert_eq!(missing.json::<Value>().await.unwrap()["code"], "not_found");
}

/// Opens an appends stream on `port` by hand: the status line of the node's answer, and the
/// connection.
async fn open_appends_stream_by_hand(port: u16, upgrade: &str) -> (String, tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let request = format!(
        "GET /raft/append/stream HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: upgrade\r\nupgrade: {upgrade}\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0];
        assert_eq!(stream.read(&mut byte).await.unwrap(), 1, "the node closed before its answer's head ended");
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    (head.lines().next().unwrap().to_string(), stream)
}

/// Frames that are not appends (garbage, a length over the limit, a frame cut short) close
/// the stream they came on, and nothing else: the node keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_appends_stream_closes_on_a_malformed_frame() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let cluster = Cluster::start(1, &[]).await;
    let port = cluster.nodes[&1].port;
    let (status, _) = open_appends_stream_by_hand(port, "websocket").await;
    assert!(status.starts_with("HTTP/1.1 426"), "{status}");
    let garbage: [&[u8]; 3] = [&[0, 0, 0, 3, 0xFF, 0xFF, 0xFF], &[0xFF, 0xFF, 0xFF, 0xFF], &[0, 0, 0, 100, 1, 2]];
    for frame in garbage {
        let (status, mut stream) = open_appends_stream_by_hand(port, "statestore-append/1").await;
        assert!(status.starts_with("HTTP/1.1 101"), "{status}");
        stream.write_all(frame).await.unwrap();
        if frame.len() == 6 {
            // Cut short: the rest never comes, the writer goes.
            stream.shutdown().await.unwrap();
        }
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{frame:?}: the stream stays open: {read:?} {rest:?}");
    }
    assert_eq!(cluster.set(1, "after-garbage", "v").await.unwrap().response, Response::Ok);
    let logs = cluster.logs();
    assert!(logs.contains("over the limit of"), "{logs}");
    assert!(logs.contains("does not decode"), "{logs}");
}

fn signal(cluster: &Cluster, id: u64, signal: &str) {
    let pid = cluster.nodes[&id].child.as_ref().unwrap().id();
    assert!(Command::new("kill").arg(signal).arg(pid.to_string()).status().unwrap().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_reaches_no_quorum_is_not_ready() {
    let cluster = Cluster::start(3, &[]).await;
    cluster.wait_ready().await;
    let leader = cluster.wait_leader().await;
    let followers: Vec<u64> = cluster.running().into_iter().filter(|id| *id != leader).collect();
    // Both followers frozen: the leader still believes it leads, but it cannot serve anything.
    for id in &followers {
        signal(&cluster, *id, "-STOP");
    }
    let ready_url = format!("{}/ready", cluster.url(leader));
    let started = std::time::Instant::now();
    let body = loop {
        let response = cluster.http.get(&ready_url).send().await.unwrap();
        if response.status() == 503 {
            break response.json::<Value>().await.unwrap();
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "the cut-off leader stayed ready");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(body["message"], "the leader cannot reach a quorum", "{body}");
    for id in &followers {
        signal(&cluster, *id, "-CONT");
    }
    cluster.wait_ready().await;
}

/// The node's process runs without transparent huge pages: the first touch of a fresh 2 MiB
/// region would have the kernel zero it whole (docs/benchmarks.md, the join stall).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_runs_without_transparent_huge_pages() {
    let cluster = Cluster::start(1, &[]).await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", cluster.pid(1))).unwrap();
    let enabled = status.lines().find_map(|line| line.strip_prefix("THP_enabled:")).map(str::trim);
    assert_eq!(enabled, Some("0"), "/proc/<pid>/status of the node:\n{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_metrics_and_a_graceful_stop() {
    let mut cluster = Cluster::start(1, &[]).await;
    for path in ["/health", "/ready"] {
        let response = cluster.http.get(format!("{}{path}", cluster.url(1))).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
    }
    cluster.set(1, "k", "v").await.unwrap();
    // The gauges follow Raft's metrics, which the core publishes after it answers: wait for them.
    let started = std::time::Instant::now();
    let text = loop {
        let text = cluster.metrics(1).await;
        if metric(&text, "statestore_raft_applied_index").is_some_and(|applied| applied >= 2.0) {
            break text;
        }
        assert!(started.elapsed() < DEADLINE, "the applied index never reached the write in\n{text}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    for name in [
        "statestore_raft_term",
        "statestore_raft_is_leader",
        "statestore_raft_has_leader",
        "statestore_raft_leader_changes_seen_total",
        "statestore_raft_last_log_index",
        "statestore_raft_committed_index",
        "statestore_raft_applied_index",
        "statestore_disk_wal_fsync_duration_seconds_count",
        "statestore_apply_duration_seconds_count",
        "statestore_proposal_duration_seconds_count",
    ] {
        assert!(metric(&text, name).is_some(), "{name} missing from\n{text}");
    }
    assert_eq!(metric(&text, "statestore_raft_is_leader"), Some(1.0));
    assert!(metric(&text, "statestore_disk_wal_fsync_duration_seconds_count").unwrap() >= 1.0);

    let status = cluster.terminate(1);
    assert!(status.success(), "SIGTERM ended the node with {status:?}\n{}", cluster.logs());
    cluster.spawn(1);
    cluster.wait_leader().await;
    assert_eq!(cluster.get(1, "k").await.unwrap().response, Response::Value(b"v".to_vec()));
}

#[test]
fn a_wrong_configuration_is_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&[], "--id is required"),
        (&["--id", "1", "--initial-members", "1=http://127.0.0.1:1,x"], "--initial-members"),
        (&["--id", "1", "--heartbeat-ms", "100", "--election-min-ms", "150"], "timings"),
        (&["--id", "1", "--listen", "not-an-address"], "invalid value"),
    ];
    for (args, expected) in cases {
        let output = Command::new(env!("CARGO_BIN_EXE_statestore"))
            .args(*args)
            .arg("--data-dir")
            .arg(dir.path())
            .env_clear()
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

/// `--max-http-commands` bounds the `/v1/command` requests a node serves at once: one more is
/// refused at once with a 503 that names the limit, and served again once a slot is free.
#[tokio::test(flavor = "multi_thread")]
async fn commands_beyond_the_limit_are_refused_at_once_naming_the_limit() {
    let cluster = Cluster::start(3, &["--max-http-commands", "1"]).await;
    cluster.wait_ready().await;
    let leader = cluster.wait_leader().await;
    let followers: Vec<u64> = cluster.running().into_iter().filter(|id| *id != leader).collect();
    // With both followers stopped this write cannot commit: it holds the one slot.
    for id in &followers {
        cluster.signal(*id, "STOP");
    }
    let held = cluster.set(leader, "held", "1");
    let refused = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let started = std::time::Instant::now();
        let refused = cluster.set(leader, "refused", "1").await;
        let waited = started.elapsed();
        for id in &followers {
            cluster.signal(*id, "CONT");
        }
        (refused, waited)
    };
    let (held, (refused, waited)) = tokio::join!(held, refused);
    match refused {
        Err(common::Refused::Status(503, body)) => {
            assert_eq!(body["code"], "too_many_commands", "{body}");
            assert!(body["message"].as_str().unwrap().contains("--max-http-commands"), "{body}");
        }
        other => panic!("expected 503 too_many_commands, got {other:?}"),
    }
    assert!(waited < Duration::from_secs(1), "refused at once, not queued: {waited:?}");
    assert_eq!(held.expect("the held write commits once the followers resume").response, Response::Ok);
    assert_eq!(cluster.set(leader, "after", "1").await.expect("the slot is free again").response, Response::Ok);
}

/// Without a secret, anyone who reaches a node's port could append to its log, change the
/// membership or write keys past the broker's access rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_secret_guards_raft_rpc_membership_and_commands() {
    const SECRET: &str = "s3cret-shared-by-the-three-nodes";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cluster-secret");
    std::fs::write(&file, format!("{SECRET}\n")).unwrap();
    let mut cluster = Cluster::prepare(3, &["--cluster-secret-file", file.to_str().unwrap()]);
    for id in 1..=3 {
        cluster.spawn(id);
    }
    // Elections and replication carry the secret.
    let leader = cluster.wait_leader().await;
    cluster.wait_ready().await;

    let anyone = reqwest::Client::new();
    let url = cluster.url(leader);
    for path in ["/cluster", "/health", "/ready", "/metrics"] {
        let status = anyone.get(format!("{url}{path}")).send().await.unwrap().status();
        assert_eq!(status, 200, "{path} stays open");
    }
    let set = statestore_protocol::Set::new("guarded", "x").encode();
    let refusals = [
        ("/v1/command", set.clone()),
        ("/raft/append", b"not bincode".to_vec()),
        ("/raft/vote", Vec::new()),
        ("/raft/prevote", Vec::new()),
        ("/raft/snapshot", Vec::new()),
        ("/cluster/members", br#"{"remove":[2]}"#.to_vec()),
        ("/cluster/learners", br#"{"id":9,"address":"http://127.0.0.1:9"}"#.to_vec()),
        ("/cluster/snapshot", Vec::new()),
    ];
    for (path, body) in refusals {
        for authorization in [None, Some("Bearer not-the-secret-at-all"), Some(SECRET)] {
            let mut request = anyone.post(format!("{url}{path}")).body(body.clone());
            if let Some(value) = authorization {
                request = request.header("authorization", value);
            }
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), 401, "{path} with {authorization:?}");
            let body: Value = response.json().await.unwrap();
            assert_eq!(body["code"], "unauthorized", "{path}: {body}");
            assert!(body["message"].as_str().unwrap().contains("Authorization: Bearer"), "{body}");
        }
    }
    assert_eq!(common::open_appends_stream(&anyone, &url).await, 401, "an appends stream needs the secret too");
    let status = cluster.status(leader).await.unwrap();
    assert_eq!(status["voters"].as_array().unwrap().len(), 3, "the membership is unchanged");
    assert!(status["learners"].as_array().unwrap().is_empty());

    cluster.authorize(SECRET);
    assert_eq!(cluster.set(leader, "guarded", "x").await.unwrap().response, Response::Ok);
    assert_eq!(cluster.get(leader, "guarded").await.unwrap().response, Response::Value(b"x".to_vec()));
    let (status, body) = post(&cluster, leader, "/cluster/snapshot", "").await;
    assert_eq!(status, 202, "{body}");
    assert!(!cluster.logs().contains(SECRET), "the secret is never logged");

    // The CLI takes the secret from the environment.
    let cli = std::path::PathBuf::from(env!("CARGO_BIN_EXE_statestore")).with_file_name("statestore-cli");
    let remove_unknown = |secret: Option<&str>| {
        let mut command = Command::new(&cli);
        command.args(["--endpoint", &url, "cluster", "remove", "42"]).env_clear();
        if let Some(secret) = secret {
            command.env("STATESTORE_CLUSTER_SECRET", secret);
        }
        let output = command.output().unwrap();
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
    };
    let refused = remove_unknown(None);
    assert!(refused.contains("needs the cluster secret"), "{refused}");
    let answered = remove_unknown(Some(SECRET));
    assert!(answered.contains("node 42 is not a member"), "{answered}");
}

#[test]
fn a_cluster_secret_that_is_too_short_is_refused_naming_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cluster-secret");
    std::fs::write(&file, "short\n").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_statestore"))
        .args(["--id", "1", "--cluster-secret-file", file.to_str().unwrap()])
        .env_clear()
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cluster secret") && stderr.contains("16 to 1024 bytes"), "{stderr}");
    let output = Command::new(env!("CARGO_BIN_EXE_statestore"))
        .args(["--id", "1"])
        .env_clear()
        .env("STATESTORE_CLUSTER_SECRET", "has spaces in it, which headers mangle")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("STATESTORE_CLUSTER_SECRET"));
}

/// A follower forwards at most the command body limit (16 MiB): a larger `/v1/command` is
/// answered 413 `too_large` there, naming the limit, and nothing reaches the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_refuses_to_forward_a_command_over_the_body_limit() {
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_leader().await;
    let follower = cluster.running().into_iter().find(|id| *id != leader).unwrap();
    // A new leader's own first entry may still be on its way: start from a log it has applied.
    let last = cluster.status(leader).await.unwrap()["last_log_index"].as_u64().unwrap();
    cluster.wait_applied(leader, last).await;
    let response = cluster
        .http
        .post(format!("{}/v1/command", cluster.url(follower)))
        .body(vec![b'x'; (16 << 20) + 1])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 413);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["code"], "too_large", "{body}");
    assert!(body["message"].as_str().unwrap().contains("16777216"), "{body}");
    assert_eq!(cluster.status(leader).await.unwrap()["last_log_index"].as_u64().unwrap(), last);
}

/// The barrage of `tests/mqtt.rs` through `/v1/command` instead of the broker: 3,000 mutated
/// payloads ([`barrage::mutated_payload`]) to all three nodes (the followers forward to the
/// leader), some of them local reads, with `statestore-ts`, `statestore-ft` and
/// `statestore-client-id` broken, missing or 4 kB long. Each is answered 200 with a well-formed
/// reply, or 400 with a JSON error that names its code: no other status, no hang, no node
/// stopped; the three nodes then hold the same keys, values and versions.
#[tokio::test(flavor = "multi_thread")]
async fn a_barrage_of_mutated_commands_over_http_is_answered_and_the_nodes_agree() {
    use futures::StreamExt;
    use statestore_api::routes::{CLIENT_ID_HEADER, FENCING_TOKEN_HEADER, TIMESTAMP_HEADER};

    let mut cluster = Cluster::start(3, &[]).await;
    cluster.wait_ready().await;
    let seed = barrage::seed();
    let mut dice = fastrand::Rng::with_seed(seed);
    let keys = barrage::keys();
    let requests: Vec<_> = (0..3000)
        .map(|_| {
            let payload = barrage::mutated_payload(&mut dice, &keys);
            let mut headers = vec![(TIMESTAMP_HEADER, common::timestamp())];
            match dice.u8(..16) {
                0 => headers.clear(),
                1 => headers[0].1 = dice.choice(barrage::BROKEN_TIMESTAMPS).unwrap().into(),
                2 => headers.push((FENCING_TOKEN_HEADER, dice.choice(barrage::FENCING_TOKENS).unwrap().into())),
                3 => headers.push((CLIENT_ID_HEADER, "c".repeat(dice.usize(..4000)))),
                4 => headers.push((TIMESTAMP_HEADER, common::timestamp())),
                _ => {}
            }
            let query = if dice.u8(..5) == 0 { "?consistency=local" } else { "" };
            (dice.u64(1..=3), payload, headers, query)
        })
        .collect();

    let answers = futures::stream::iter(requests.iter().enumerate())
        .map(|(n, (node, payload, headers, query))| {
            let mut request =
                cluster.http.post(format!("{}/v1/command{query}", cluster.url(*node))).body(payload.clone());
            for (name, value) in headers {
                request = request.header(*name, value);
            }
            async move {
                let answer = tokio::time::timeout(Duration::from_secs(20), async {
                    let response = request.send().await.map_err(|e| e.to_string())?;
                    let status = response.status().as_u16();
                    Ok::<_, String>((status, response.bytes().await.map_err(|e| e.to_string())?))
                })
                .await;
                (n, answer)
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    let mut kinds = std::collections::BTreeMap::<String, usize>::new();
    for (n, answer) in answers {
        let (node, payload, headers, query) = &requests[n];
        let shown = String::from_utf8_lossy(&payload[..payload.len().min(120)]).into_owned();
        let asked = format!("seed {seed}: request {n} to node {node}{query} ({shown:?}, {headers:?})");
        let (status, body) = match answer {
            Ok(Ok(answer)) => answer,
            Ok(Err(error)) => panic!("{asked}: {error}\n{}", cluster.logs()),
            Err(_) => panic!("{asked}: no answer within 20 s\n{}", cluster.logs()),
        };
        let kind = match status {
            200 => barrage::reply_kind(&Response::decode(&body).unwrap_or_else(|_| panic!("{asked}: 200 {body:?}"))),
            400 => {
                let error: Value = serde_json::from_slice(&body).unwrap_or_else(|_| panic!("{asked}: 400 {body:?}"));
                format!("400 {}", error["code"].as_str().unwrap_or_else(|| panic!("{asked}: 400 without a code")))
            }
            other => panic!("{asked}: answered {other} {}", String::from_utf8_lossy(&body)),
        };
        *kinds.entry(kind).or_default() += 1;
    }
    println!("answers by kind: {kinds:#?}");
    assert!(kinds.len() >= 8, "seed {seed}: the barrage reached only {kinds:?}");

    barrage::assert_nodes_serving(&mut cluster, seed).await;
    let leader = cluster.wait_leader().await;
    let after = cluster.set(cluster.nodes.keys().copied().find(|&id| id != leader).unwrap(), "barrage-after", "served");
    assert_eq!(after.await.expect("a SET through a follower").response, Response::Ok, "seed {seed}");
    barrage::assert_nodes_agree(&cluster, seed, b"barrage-after").await;
}

/// `?consistency=local` is for reads: a write that carries it, sent to a follower, is carried to
/// the leader like any other write, not refused there with 421.
#[tokio::test(flavor = "multi_thread")]
async fn a_write_asking_for_local_consistency_is_carried_to_the_leader() {
    let cluster = Cluster::start(3, &[]).await;
    cluster.wait_ready().await;
    let leader = cluster.wait_leader().await;
    let follower = cluster.nodes.keys().copied().find(|&id| id != leader).unwrap();
    let set = statestore_protocol::Set::new("local-write", "carried").encode();
    let answer = cluster.command(follower, set, Some(&common::timestamp()), "?consistency=local").await;
    assert_eq!(answer.expect("the write is carried to the leader").response, Response::Ok);
    let read = cluster.get(leader, "local-write").await.unwrap();
    assert_eq!(read.response, Response::Value(b"carried".to_vec()));
}
