//! The examples a developer starts from, run against a real Mosquitto and three real nodes so
//! they never rot: the Rust SDK program (`crates/node/examples/sdk_quickstart.rs`) and the
//! Python paho-mqtt script (`docs/examples/quickstart.py`). Each must SET, GET and DEL a key and
//! exit 0; the key must be gone afterwards.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::broker::Broker;
use common::Cluster;
use statestore_protocol::Response;

/// The Debian interpreter, which sees the Debian `python3-paho-mqtt` package.
const PYTHON: &str = "/usr/bin/python3";

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run(mut command: Command) -> (Output, String) {
    let output = command.output().unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_and_python_examples_set_get_and_delete_a_key() {
    let broker = Broker::start();
    let cluster = Cluster::start(3, &["--broker", &broker.address()]).await;
    cluster.wait_ready().await;
    let port = broker.port.to_string();

    // Built beside the node binary by `cargo test` (examples are part of the test build).
    let example = PathBuf::from(env!("CARGO_BIN_EXE_statestore")).with_file_name("examples").join("sdk_quickstart");
    assert!(example.exists(), "{} is missing: build with cargo test --workspace", example.display());
    let mut rust = Command::new(&example);
    rust.args(["127.0.0.1", &port]);
    let (output, text) = run(rust);
    assert!(output.status.success(), "the Rust example failed:\n{text}");
    assert!(text.contains("SET applied: true"), "{text}");
    assert!(text.contains("GET: Some(\"hello\")"), "{text}");
    assert!(text.contains("DEL removed 1 key"), "{text}");

    let mut python = Command::new(PYTHON);
    python.arg(repository().join("docs/examples/quickstart.py")).args(["127.0.0.1", &port]);
    let (output, text) = run(python);
    assert!(
        output.status.success(),
        "the Python example failed (python3-paho-mqtt: cluster/packages.sh --tests):\n{text}"
    );
    assert!(text.contains("SET (b'+OK\\r\\n', '200')"), "{text}");
    assert!(text.contains("GET (b'$17\\r\\nhello from python\\r\\n', '200')"), "{text}");
    assert!(text.contains("DEL (b':1\\r\\n', '200')"), "{text}");

    let leader = cluster.wait_leader().await;
    for key in ["quickstart/greeting", "quickstart/python"] {
        assert_eq!(cluster.get(leader, key).await.unwrap().response, Response::Nil, "{key} is left behind");
    }
}
