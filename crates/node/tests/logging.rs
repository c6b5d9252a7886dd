//! `--log-format json`: every line a node logs is one JSON object a log shipper can read.

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
