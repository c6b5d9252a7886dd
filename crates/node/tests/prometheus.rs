//! The real Prometheus server (Debian's `prometheus`) scrapes a real 3-node cluster behind a real
//! Mosquitto, and its HTTP API answers with the series an operator's dashboards and alerts use.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::broker::Broker;
use common::mqtt::RawClient;
use common::{free_port, timestamp, Cluster};
use serde_json::Value;
use statestore_protocol::{Get, Set};

struct Prometheus {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn prometheus_binary() -> String {
    ["/usr/bin/prometheus", "/usr/local/bin/prometheus"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .map(str::to_string)
        .expect("prometheus is not installed: apt-get install -y prometheus (cluster/packages.sh installs it)")
}

impl Prometheus {
    fn start(targets: &[String]) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        let targets = targets.iter().map(|t| format!("'{t}'")).collect::<Vec<_>>().join(", ");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: ['{}']\nscrape_configs:\n  \
                 - job_name: statestore\n    static_configs:\n      - targets: [{targets}]\n",
                repo_file("cluster/alerts.yml").display()
            ),
        )
        .unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new(prometheus_binary())
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        Prometheus { child, port, _dir: dir }
    }

    async fn query(&self, http: &reqwest::Client, expression: &str) -> Vec<Value> {
        let url = format!("http://127.0.0.1:{}/api/v1/query", self.port);
        let Ok(response) = http.get(url).query(&[("query", expression)]).send().await else {
            return Vec::new();
        };
        let body: Value = response.json().await.unwrap_or(Value::Null);
        body["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// Waits until `expression` returns at least `count` series; returns them.
    async fn wait_for(&self, http: &reqwest::Client, expression: &str, count: usize) -> Vec<Value> {
        let started = Instant::now();
        loop {
            let result = self.query(http, expression).await;
            if result.len() >= count {
                return result;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "Prometheus has {} series for {expression}, wanted {count}: {result:?}\n{}",
                result.len(),
                std::fs::read_to_string(self._dir.path().join("prometheus.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

fn repo_file(path: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)
}

/// Every `statestore_*` metric name in a text.
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("statestore_") {
        let tail = &rest[at..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

fn value(series: &Value) -> f64 {
    series["value"][1].as_str().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn prometheus_scrapes_the_key_series() {
    let broker = Broker::start();
    let cluster = Cluster::start(3, &["--broker", &broker.address()]).await;
    cluster.wait_ready().await;
    let targets: Vec<String> =
        cluster.running().iter().map(|id| cluster.url(*id).trim_start_matches("http://").to_string()).collect();
    let prometheus = Prometheus::start(&targets);

    // Traffic, so that request series exist: hits, misses, a refused SET.
    let client = RawClient::connect(broker.port, "prometheus-test").await;
    for i in 0..20 {
        let set = Set::new(format!("k{i}"), "v").encode();
        assert_eq!(client.request(&set, &timestamp()).await.payload, b"+OK\r\n");
        client.request(&Get { key: format!("k{}", i * 2).into_bytes() }.encode(), &timestamp()).await;
    }
    client.request(b"*1\r\n$3\r\nSET\r\n", &timestamp()).await;
    // A QoS 0 request is dropped and counted (`statestore_requests_dropped_total{reason="qos0"}`).
    let get = Get { key: b"k0".to_vec() }.encode();
    client.publish(&get, rumqttc::v5::mqttbytes::QoS::AtMostOnce, client.properties(&timestamp())).await;

    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    let up = prometheus.wait_for(&http, "up{job=\"statestore\"} == 1", 3).await;
    assert_eq!(up.len(), 3, "{up:?}");

    // Exactly one leader, one term, applied indexes that moved.
    let leaders = prometheus.wait_for(&http, "sum(statestore_raft_is_leader)", 1).await;
    assert_eq!(value(&leaders[0]), 1.0, "{leaders:?}");
    let terms = prometheus.wait_for(&http, "statestore_raft_term", 3).await;
    assert!(terms.iter().all(|t| value(t) >= 1.0 && value(t) == value(&terms[0])), "{terms:?}");
    let applied = prometheus.wait_for(&http, "statestore_raft_applied_index > 20", 3).await;
    assert_eq!(applied.len(), 3, "{applied:?}");
    let leader_seen = prometheus.wait_for(&http, "statestore_raft_has_leader == 1", 3).await;
    assert_eq!(leader_seen.len(), 3);

    // Requests by command and result, as the leader answered them.
    let sets =
        prometheus.wait_for(&http, "sum(statestore_requests_total{command=\"SET\",result=\"ok\"}) >= 20", 1).await;
    assert!(value(&sets[0]) >= 20.0, "{sets:?}");
    let results = prometheus.wait_for(&http, "sum by (result) (statestore_requests_total)", 2).await;
    let labels: Vec<&str> = results.iter().filter_map(|r| r["metric"]["result"].as_str()).collect();
    assert!(labels.len() >= 2, "several results are told apart: {labels:?}");

    // Latency: a histogram whose quantile Prometheus can compute. A rate needs two scrapes that
    // differ, so requests keep coming until it has them.
    let expression =
        "histogram_quantile(0.99, sum by (le) (rate(statestore_request_duration_seconds_bucket{command=\"SET\"}[1m])))";
    let started = Instant::now();
    let seconds = loop {
        let set = Set::new("latency", "v").encode();
        assert_eq!(client.request(&set, &timestamp()).await.payload, b"+OK\r\n");
        let p99 = prometheus.query(&http, expression).await;
        if let Some(seconds) = p99.first().map(value).filter(|s| s.is_finite()) {
            break seconds;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "no p99 latency: {p99:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(seconds > 0.0 && seconds < 5.0, "p99 {seconds} s");

    // Every series the Grafana dashboard and the alert rules in cluster/ name is scraped, and
    // Prometheus accepts every dashboard expression.
    let dashboard = std::fs::read_to_string(repo_file("cluster/grafana/statestore.json")).unwrap();
    let alerts = std::fs::read_to_string(repo_file("cluster/alerts.yml")).unwrap();
    let names = metric_names(&format!("{dashboard}\n{alerts}"));
    assert!(names.len() >= 15, "{names:?}");
    for name in &names {
        let series = prometheus.wait_for(&http, name, 1).await;
        assert!(!series.is_empty(), "{name}");
    }
    let dashboard: Value = serde_json::from_str(&dashboard).unwrap();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expression = target["expr"].as_str().unwrap();
            let url = format!("http://127.0.0.1:{}/api/v1/query", prometheus.port);
            let body: Value = http.get(url).query(&[("query", expression)]).send().await.unwrap().json().await.unwrap();
            assert_eq!(body["status"], "success", "{}: {expression}: {body}", panel["title"]);
        }
    }

    // The alert rules load and evaluate; none fires on a healthy cluster.
    let started = Instant::now();
    loop {
        let url = format!("http://127.0.0.1:{}/api/v1/rules", prometheus.port);
        let body: Value = http.get(url).send().await.unwrap().json().await.unwrap();
        let rules: Vec<Value> = body["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        let evaluated = rules.iter().filter(|r| r["health"] == "ok").count();
        if rules.len() >= 10 && evaluated == rules.len() {
            let firing: Vec<&Value> = rules.iter().filter(|r| r["state"] == "firing").collect();
            assert!(firing.is_empty(), "{firing:?}");
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "rules not all healthy: {body}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
