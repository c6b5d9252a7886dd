//! `statestore-cli` against a real Mosquitto and three real nodes: every command, its human and
//! JSON output, its exit codes, binary-safe values, locks with fencing tokens, watching keys,
//! membership changes, and the error paths (no broker, no endpoint, bad arguments).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::broker::Broker;
use common::{free_port, Cluster};
use serde_json::Value;

/// The CLI binary, built beside the node binary by `cargo test --workspace`.
fn cli_path() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_BIN_EXE_statestore")).with_file_name("statestore-cli");
    assert!(path.exists(), "{} is missing: build the workspace (cargo test --workspace)", path.display());
    path
}

struct Cli {
    port: u16,
    endpoints: String,
}

impl Cli {
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(cli_path());
        command
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "--endpoint", &self.endpoints])
            .args(args)
            .env_remove("STATESTORE_ENDPOINTS")
            .env_remove("STATESTORE_MQTT_PORT")
            .env_remove("STATESTORE_MQTT_HOST");
        command
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    fn run_with_stdin(&self, args: &[&str], stdin: &[u8]) -> Output {
        let mut child =
            self.command(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        child.wait_with_output().unwrap()
    }

    fn json(&self, args: &[&str]) -> (i32, Value) {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let output = self.run(&all);
        let text = String::from_utf8_lossy(&output.stdout);
        let document = serde_json::from_str(text.lines().last().unwrap_or("null")).unwrap_or_else(|e| {
            panic!("{args:?}: not JSON ({e}): {text}\n{}", String::from_utf8_lossy(&output.stderr))
        });
        (output.status.code().unwrap(), document)
    }

    fn spawn(&self, args: &[&str]) -> Child {
        self.command(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
    }
}

fn code(output: &Output) -> i32 {
    output.status.code().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn setup() -> (Broker, Cluster, Cli) {
    let broker = Broker::start();
    let cluster = Cluster::start(3, &["--broker", &broker.address()]).await;
    cluster.wait_ready().await;
    let endpoints = cluster.running().iter().map(|id| cluster.url(*id)).collect::<Vec<_>>().join(",");
    let cli = Cli { port: broker.port, endpoints };
    (broker, cluster, cli)
}

/// Reads JSON lines from a child's standard output until `count` have arrived.
fn read_lines(child: &mut Child, count: usize) -> Vec<Value> {
    let stdout = child.stdout.as_mut().unwrap();
    let mut reader = BufReader::new(stdout);
    let mut lines = Vec::new();
    while lines.len() < count {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 {
            break;
        }
        lines.push(serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")));
    }
    lines
}

#[tokio::test(flavor = "multi_thread")]
async fn keys_and_values_with_exit_codes() {
    let (_broker, cluster, cli) = setup().await;

    // set / get, human output.
    let set = cli.run(&["set", "greeting", "hello world"]);
    assert_eq!(code(&set), 0, "{}", text(&set.stderr));
    assert!(text(&set.stdout).starts_with("OK "), "{}", text(&set.stdout));
    let get = cli.run(&["get", "greeting"]);
    assert_eq!((code(&get), get.stdout.as_slice()), (0, &b"hello world"[..]));

    // JSON output carries the version; the version of GET is the version of the SET.
    let (exit, set) = cli.json(&["set", "j", "v1"]);
    assert_eq!(exit, 0);
    assert_eq!(set["result"], "ok");
    let (exit, got) = cli.json(&["get", "j"]);
    assert_eq!(exit, 0);
    assert_eq!((got["result"].as_str(), got["value"].as_str()), (Some("found"), Some("v1")));
    assert_eq!(got["version"], set["version"]);

    // Binary-safe values through stdin and files, byte for byte.
    let binary: Vec<u8> = (0..=255u8).chain(*b"\r\n\0end").collect();
    let from_stdin = cli.run_with_stdin(&["set", "bin", "--file", "-"], &binary);
    assert_eq!(code(&from_stdin), 0, "{}", text(&from_stdin.stderr));
    let get = cli.run(&["get", "bin"]);
    assert_eq!(get.stdout, binary);
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in"), dir.path().join("out"));
    std::fs::write(&input, &binary[..100]).unwrap();
    assert_eq!(code(&cli.run(&["set", "bin2", "--file", input.to_str().unwrap()])), 0);
    let to_file = cli.run(&["get", "bin2", "-o", output.to_str().unwrap()]);
    assert_eq!(code(&to_file), 0);
    assert_eq!(std::fs::read(&output).unwrap(), &binary[..100]);
    assert!(to_file.stdout.is_empty(), "the value goes to the file only, not also to stdout");
    let (_, got) = cli.json(&["get", "bin"]);
    assert_eq!(got["value"], Value::Null, "not UTF-8");
    assert!(got["value_base64"].as_str().is_some_and(|b| !b.is_empty()));

    // Not found: exit 1.
    let missing = cli.run(&["get", "nothing-here"]);
    assert_eq!(code(&missing), 1);
    assert!(missing.stdout.is_empty());
    assert_eq!(
        cli.json(&["get", "nothing-here"]),
        (1, serde_json::json!({"result": "not_found", "message": "the key does not exist"}))
    );
    assert_eq!(code(&cli.run(&["del", "nothing-here"])), 1);

    // Conditions: NX on an existing key and NEX with another value are not applied (exit 2).
    assert_eq!(code(&cli.run(&["set", "--nx", "greeting", "other"])), 2);
    assert_eq!(code(&cli.run(&["set", "--nex", "greeting", "other"])), 2);
    assert_eq!(code(&cli.run(&["set", "--nex", "greeting", "hello world"])), 0, "NEX with the same value renews");
    assert_eq!(code(&cli.run(&["set", "--nx", "fresh", "1"])), 0);
    assert_eq!(cli.run(&["get", "greeting"]).stdout, b"hello world");

    // VDEL: other value 2, right value 0, then absent 1.
    assert_eq!(code(&cli.run(&["vdel", "greeting", "nope"])), 2);
    let (exit, deleted) = cli.json(&["vdel", "greeting", "hello world"]);
    assert_eq!((exit, deleted["result"].as_str()), (0, Some("deleted")));
    assert_eq!(code(&cli.run(&["vdel", "greeting", "hello world"])), 1);
    assert_eq!(code(&cli.run(&["del", "j"])), 0);
    assert_eq!(code(&cli.run(&["get", "j"])), 1);

    // PX: gone after its time.
    assert_eq!(code(&cli.run(&["set", "--px", "300", "short", "lived"])), 0);
    let started = Instant::now();
    while code(&cli.run(&["get", "short"])) == 0 {
        assert!(started.elapsed() < Duration::from_secs(5), "the key did not expire");
        std::thread::sleep(Duration::from_millis(100));
    }

    // SCAN through every page.
    for i in 0..150 {
        assert_eq!(code(&cli.run(&["set", &format!("scan/{i:03}"), "x"])), 0);
    }
    let keys = cli.run(&["keys", "scan/*"]);
    assert_eq!(code(&keys), 0);
    let listed: Vec<String> = text(&keys.stdout).lines().map(str::to_string).collect();
    let mut expected: Vec<String> = (0..150).map(|i| format!("scan/{i:03}")).collect();
    let mut sorted = listed.clone();
    sorted.sort();
    expected.sort();
    assert_eq!(sorted, expected, "every key once, over several pages");
    let (_, json_keys) = cli.json(&["keys", "scan/00*"]);
    assert_eq!(json_keys["keys"].as_array().unwrap().len(), 10);

    drop(cluster);
}

#[tokio::test(flavor = "multi_thread")]
async fn locks_hand_out_fencing_tokens_and_watch_streams_changes() {
    let (_broker, _cluster, cli) = setup().await;

    // Watch two keys; three changes arrive in order with their versions.
    let mut watcher = cli.spawn(&["--json", "watch", "w1", "w2", "--count", "3"]);
    // The registration is done when the watcher is subscribed; give it a moment, then write
    // until the first notification shows up.
    std::thread::sleep(Duration::from_millis(1500));
    let (_, first) = cli.json(&["set", "w1", "one"]);
    let (_, second) = cli.json(&["set", "w2", "two"]);
    let (_, third) = cli.json(&["del", "w1"]);
    let events = read_lines(&mut watcher, 3);
    assert_eq!(watcher.wait().unwrap().code(), Some(0));
    assert_eq!(events.len(), 3, "{events:?}");
    assert_eq!(
        (events[0]["event"].as_str(), events[0]["key"].as_str(), events[0]["value"].as_str()),
        (Some("set"), Some("w1"), Some("one"))
    );
    assert_eq!(events[0]["version"], first["version"]);
    assert_eq!((events[1]["key"].as_str(), events[1]["version"].clone()), (Some("w2"), second["version"].clone()));
    assert_eq!((events[2]["event"].as_str(), events[2]["version"].clone()), (Some("delete"), third["version"].clone()));

    // A lock held by one process: another cannot take it; the holder's token fences writes.
    let mut holder = cli.spawn(&["--json", "lock", "L", "--ttl", "3000"]);
    let acquired = read_lines(&mut holder, 1).remove(0);
    assert_eq!(acquired["result"], "acquired");
    let token = acquired["fencing_token"].as_str().unwrap().to_string();
    assert_eq!(code(&cli.run(&["lock", "L", "--no-wait"])), 2, "held by another");
    assert_eq!(code(&cli.run(&["lock", "L", "--wait-timeout", "0.5"])), 2);
    assert_eq!(code(&cli.run(&["set", "--fencing-token", &token, "protected", "a"])), 0);

    // The holder keeps it past its TTL by renewing.
    std::thread::sleep(Duration::from_millis(4000));
    assert_eq!(code(&cli.run(&["lock", "L", "--no-wait"])), 2, "renewed past the TTL");

    // SIGTERM releases it; the next holder gets a higher token, and the old one is refused.
    unsafe_terminate(&holder);
    let status = holder.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    let output = cli.run(&[
        "--json",
        "lock",
        "L",
        "--no-wait",
        "--",
        "sh",
        "-c",
        &format!(
            "{} -p {} set --fencing-token \"$STATESTORE_FENCING_TOKEN\" protected b",
            cli_path().display(),
            cli.port
        ),
    ]);
    assert_eq!(code(&output), 0, "{}\n{}", text(&output.stdout), text(&output.stderr));
    // The locked command's own output ("OK <version>") comes between the lock's JSON lines.
    let stdout = text(&output.stdout);
    assert!(stdout.lines().any(|l| l.starts_with("OK ")), "{stdout}");
    let lines: Vec<Value> =
        stdout.lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).unwrap()).collect();
    let second_token = lines[0]["fencing_token"].as_str().unwrap().to_string();
    assert!(second_token > token, "{second_token} > {token}");
    assert_eq!(lines.last().unwrap()["result"], "released");
    assert_eq!(cli.run(&["get", "protected"]).stdout, b"b");
    let stale = cli.run(&["set", "--fencing-token", &token, "protected", "c"]);
    assert_eq!(code(&stale), 2, "a stale token is not applied: {}", text(&stale.stderr));
    assert!(text(&stale.stderr).contains("fencing token"), "{}", text(&stale.stderr));
    assert_eq!(cli.run(&["get", "protected"]).stdout, b"b");
    // Released: free again.
    assert_eq!(code(&cli.run(&["lock", "L", "--no-wait", "--", "true"])), 0);
    // The command's exit code is ours, and the lock is released after it.
    assert_eq!(code(&cli.run(&["lock", "L", "--no-wait", "--", "false"])), 1);
    assert_eq!(code(&cli.run(&["lock", "L", "--no-wait", "--", "sh", "-c", "exit 42"])), 42);
    assert_eq!(code(&cli.run(&["get", "L"])), 1);
}

fn unsafe_terminate(child: &Child) {
    let status = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status().unwrap();
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn cluster_administration_over_http() {
    let (broker, mut cluster, cli) = setup().await;
    let leader = cluster.wait_leader().await;

    let (exit, status) = cli.json(&["cluster", "status"]);
    assert_eq!(exit, 0);
    let rows = status["endpoints"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    assert!(rows.iter().all(|r| r["ready"] == true), "{status}");
    assert_eq!(rows.iter().filter(|r| r["status"]["role"] == "leader").count(), 1);
    let human = cli.run(&["cluster", "status"]);
    assert_eq!(code(&human), 0);
    assert!(text(&human.stdout).contains("leader"), "{}", text(&human.stdout));
    assert_eq!(code(&cli.run(&["cluster", "ready"])), 0);

    let (exit, members) = cli.json(&["cluster", "members"]);
    assert_eq!(exit, 0);
    assert_eq!(members["leader"], leader);
    assert_eq!(members["voters"].as_array().unwrap().len(), 3);

    // Leadership moved to the follower, through the follower's endpoint, and back with no target.
    let follower = cluster.running().into_iter().find(|id| *id != leader).unwrap();
    let via_follower = Cli { port: cli.port, endpoints: cluster.url(follower) };
    let moved = via_follower.run(&["cluster", "leader", "--to", &follower.to_string()]);
    assert_eq!(code(&moved), 0, "{}{}", text(&moved.stdout), text(&moved.stderr));
    assert!(
        text(&moved.stdout).contains(&format!("node {follower} leads (was node {leader}")),
        "{}",
        text(&moved.stdout)
    );
    assert_eq!(cluster.wait_leader().await, follower);
    let (exit, moved) = cli.json(&["cluster", "leader"]);
    assert_eq!(exit, 0, "{moved}");
    assert_eq!(moved["answer"]["from"], follower, "{moved}");
    let leader = cluster.wait_leader().await;
    let itself = cli.run(&["cluster", "leader", "--to", &leader.to_string()]);
    assert_eq!(code(&itself), 3);
    assert!(text(&itself.stderr).contains("leads already"), "{}", text(&itself.stderr));

    // Add node 4 as a learner through a follower endpoint (redirected to the leader), promote
    // it, then remove it.
    cluster.extra_args = vec!["--broker".into(), broker.address()];
    cluster.start_new_node(4);
    let follower = cluster.running().into_iter().find(|id| *id != leader && *id != 4).unwrap();
    let via_follower = Cli { port: cli.port, endpoints: cluster.url(follower) };
    let added = via_follower.run(&["cluster", "add-learner", "4", &cluster.url(4)]);
    assert_eq!(code(&added), 0, "{}{}", text(&added.stdout), text(&added.stderr));
    let (exit, members) = via_follower.json(&["cluster", "members"]);
    assert_eq!((exit, members["learners"].as_array().unwrap().len()), (0, 1));
    assert_eq!(code(&via_follower.run(&["cluster", "promote", "4"])), 0);
    let (_, members) = via_follower.json(&["cluster", "members"]);
    assert_eq!(members["voters"].as_array().unwrap().len(), 4);
    assert_eq!(code(&via_follower.run(&["cluster", "remove", "4"])), 0);
    let (_, members) = via_follower.json(&["cluster", "members"]);
    assert_eq!(members["voters"].as_array().unwrap().len(), 3);

    // Errors: an unknown node, a malformed address, a dead endpoint.
    let unknown = via_follower.run(&["cluster", "promote", "9"]);
    assert_eq!(code(&unknown), 3);
    assert!(text(&unknown.stderr).contains("node 9 is not a learner"), "{}", text(&unknown.stderr));
    let bad = via_follower.run(&["cluster", "add-learner", "5", "10.0.0.1:7400"]);
    assert_eq!(code(&bad), 3);
    assert!(text(&bad.stderr).contains("not an http:// URL"), "{}", text(&bad.stderr));
    let dead = Cli { port: cli.port, endpoints: format!("http://127.0.0.1:{}", free_port()) };
    let unreachable = dead.run(&["cluster", "members"]);
    assert_eq!(code(&unreachable), 3);
    assert!(text(&unreachable.stderr).contains("no endpoint answered"), "{}", text(&unreachable.stderr));
    assert_eq!(code(&dead.run(&["cluster", "ready"])), 3);
    assert_eq!(code(&dead.run(&["cluster", "status"])), 3);

    // A follower down: the leader's row names it, with how long it has not answered.
    let down = cluster.running().into_iter().find(|id| *id != leader && *id != 4).unwrap();
    cluster.kill(down);
    let expected = format!("not answering it: node {down} for");
    let until = Instant::now() + common::DEADLINE;
    loop {
        let human = cli.run(&["cluster", "status"]);
        assert_eq!(code(&human), 0, "{}", text(&human.stderr));
        if text(&human.stdout).contains(&expected) {
            break;
        }
        assert!(Instant::now() < until, "no row names the follower that is down:\n{}", text(&human.stdout));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn bad_usage_and_unreachable_brokers_are_reported() {
    let port = free_port();
    let cli = Cli { port, endpoints: "http://127.0.0.1:1".into() };
    let usage = |args: &[&str], needle: &str| {
        let output = cli.run(args);
        assert_eq!(code(&output), 64, "{args:?}: {}", text(&output.stderr));
        assert!(text(&output.stderr).contains(needle), "{args:?}: {}", text(&output.stderr));
    };
    usage(&["set", "k"], "<VALUE>");
    usage(&["set", "k", "v", "--nx", "--nex"], "cannot be used with");
    usage(&["set", "k", "v", "--px", "-5"], "-5");
    usage(&["set", "k", "v", "--px", "soon"], "soon");
    usage(&["set", "k", "v", "--fencing-token", "yesterday"], "is not an HLC");
    usage(&["get", ""], "must not be empty");
    usage(&["frobnicate"], "unrecognized subcommand");
    usage(&["--timeout", "0", "get", "k"], "--timeout");
    usage(&["lock", "L", "--ttl", "5"], "--ttl");
    usage(&["load", "--writers", "0"], "--writers");
    usage(&["--endpoint", "ftp://x", "cluster", "members"], "not an http:// or https:// URL");
    usage(&["set", "k", "--file", "/nonexistent/file"], "reading /nonexistent/file");

    // Nothing listens on the port: a clear error, exit 3, fast.
    let started = Instant::now();
    let output = cli.run(&["get", "k"]);
    assert_eq!(code(&output), 3);
    assert!(
        text(&output.stderr).contains(&format!("cannot connect to the MQTT broker at 127.0.0.1:{port}")),
        "{}",
        text(&output.stderr)
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    let (exit, document) = cli.json(&["get", "k"]);
    assert_eq!((exit, document["result"].as_str()), (3, Some("error")));
    // A CA file that does not exist fails before connecting.
    let output = cli.run(&["--cafile", "/nonexistent/ca.pem", "get", "k"]);
    assert_eq!(code(&output), 3);
    assert!(text(&output.stderr).contains("/nonexistent/ca.pem"), "{}", text(&output.stderr));
    // Help goes to standard output with exit 0.
    let help = cli.run(&["--help"]);
    assert_eq!(code(&help), 0);
    assert!(text(&help.stdout).contains("Exit codes"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_load_run_records_every_write() {
    let (_broker, _cluster, cli) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("load.txt");
    let (exit, summary) = cli.json(&[
        "load",
        "--writers",
        "2",
        "--duration",
        "2",
        "--out",
        record.to_str().unwrap(),
        "--key-prefix",
        "drill",
    ]);
    assert_eq!(exit, 0, "{summary}");
    let lines = std::fs::read_to_string(&record).unwrap();
    let writes: Vec<(u64, u64, String)> = lines
        .lines()
        .map(|l| {
            let parts: Vec<&str> = l.split(' ').collect();
            (parts[0].parse().unwrap(), parts[1].parse().unwrap(), parts[2].to_string())
        })
        .collect();
    assert_eq!(writes.len() as u64, summary["ok"].as_u64().unwrap() + summary["failed"].as_u64().unwrap());
    assert!(writes.len() > 20, "{summary}");
    assert!(writes.iter().all(|(sent, done, ok)| done >= sent && ok == "ok"), "{lines}");
    assert_eq!(cli.run(&["get", "drill/0/0"]).stdout, vec![b'v'; 64]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_load_run_records_why_a_write_failed_and_which_request_it_was() {
    // A broker and no state store: every write times out.
    let broker = Broker::start();
    let cli = Cli { port: broker.port, endpoints: String::new() };
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("load.txt");
    let (exit, summary) =
        cli.json(&["--timeout", "1", "load", "--writers", "2", "--duration", "1.5", "--out", record.to_str().unwrap()]);
    assert_ne!(exit, 0, "{summary}");
    assert_eq!(summary["message"].as_str(), Some("no write succeeded"), "{summary}");
    let lines = std::fs::read_to_string(&record).unwrap();
    let mut correlations: Vec<&str> = lines
        .lines()
        .map(|line| {
            let (_, why) = line.split_once(" err ").unwrap_or_else(|| panic!("not a failed write: {line}"));
            let hex = why.strip_prefix("no response within 1s (correlation data ").and_then(|r| r.strip_suffix(')'));
            hex.unwrap_or_else(|| panic!("no timeout with correlation data: {line}"))
        })
        .collect();
    assert!(correlations.len() >= 2, "{lines}");
    assert!(correlations.iter().all(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit())), "{lines}");
    correlations.sort_unstable();
    correlations.dedup();
    assert_eq!(correlations.len(), lines.lines().count(), "each failed write names its own request: {lines}");
}
