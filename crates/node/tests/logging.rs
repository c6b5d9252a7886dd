//! Logs: `--log-format json` gives one JSON object per line a log shipper can read; by default a
//! node logs plain, quiet text.

mod common;

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
