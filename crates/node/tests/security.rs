//! Who gets in, against real processes and a real Mosquitto:
//! - HTTPS between nodes with client certificates: three nodes whose certificates a test CA signs
//!   replicate over TLS and fail over; a client without a certificate reaches only the open
//!   routes; a certificate of another CA, and plain HTTP, get nothing; a certificate the CA
//!   signed that does not name a member's host cannot send Raft requests as that member; the
//!   CLI speaks to them with the CA and a client certificate.
//! - TLS to the broker: nodes reach a Mosquitto TLS listener that requires client certificates.
//! - Keys per client: under an authorization file each MQTT client uses only its prefixes.
//! - Closed by default: a node listening beyond loopback starts only with a cluster secret, TLS
//!   or `--insecure-no-auth`.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::broker::Broker;
use common::Cluster;
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose};
use statestore_api::tls::{client_config, TlsConfig};
use statestore_client::{Client, ClientOptions};
use statestore_protocol::{Command, Get, Response, Set, StoreError};

/// A CA and the certificates it signs, as PEM files in a directory.
struct Authority {
    cert: rcgen::Certificate,
    key: KeyPair,
    dir: PathBuf,
    name: &'static str,
}

impl Authority {
    fn new(dir: &Path, name: &'static str) -> Authority {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, format!("{name} CA"));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        std::fs::write(dir.join(format!("{name}-ca.pem")), cert.pem()).unwrap();
        Authority { cert, key, dir: dir.to_path_buf(), name }
    }

    fn ca(&self) -> PathBuf {
        self.dir.join(format!("{}-ca.pem", self.name))
    }

    /// A certificate for `who`, valid for 127.0.0.1 as a server and as a client: (cert, key).
    fn issue(&self, who: &str) -> (PathBuf, PathBuf) {
        self.issue_naming(who, &["127.0.0.1", "localhost"])
    }

    /// A certificate for `who` whose subject alternative names are `names`: (cert, key).
    fn issue_naming(&self, who: &str, names: &[&str]) -> (PathBuf, PathBuf) {
        let mut params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, who);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        let (cert_path, key_path) =
            (self.dir.join(format!("{}-{who}.pem", self.name)), self.dir.join(format!("{}-{who}.key", self.name)));
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }

    /// An HTTP client that trusts this CA, with `identity` as its client certificate.
    fn client(&self, identity: Option<(PathBuf, PathBuf)>) -> reqwest::ClientBuilder {
        let config = client_config(&TlsConfig { ca: Some(self.ca()), client_auth: identity }).unwrap();
        reqwest::Client::builder().use_preconfigured_tls(config).timeout(Duration::from_secs(5))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_speak_https_with_client_certificates_and_refuse_everyone_else() {
    let pki = tempfile::tempdir().unwrap();
    let ca = Authority::new(pki.path(), "cluster");
    let rogue = Authority::new(pki.path(), "rogue");
    let (node_cert, node_key) = ca.issue("node");
    let operator = ca.issue("operator");
    let flags = [
        format!("--tls-cert={}", node_cert.display()),
        format!("--tls-key={}", node_key.display()),
        format!("--tls-ca={}", ca.ca().display()),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut cluster = Cluster::prepare_with(3, &flags, "https://", ca.client(Some(operator.clone())));
    for id in 1..=3 {
        cluster.spawn(id);
    }
    let leader = cluster.wait_leader().await;
    assert!(cluster.url(leader).starts_with("https://"));
    let written = cluster.set(leader, "over-tls", "v1").await.expect("the operator writes through /v1/command");
    assert_eq!(written.response, Response::Ok);
    let index = cluster.status(leader).await.unwrap()["applied_index"].as_u64().unwrap();
    for id in 1..=3 {
        cluster.wait_applied(id, index).await;
        if id != leader {
            let metrics = cluster.metrics(id).await;
            let streamed = common::metric(&metrics, "statestore_raft_appends_served_total{transport=\"stream\"}");
            assert!(streamed.is_some_and(|appends| appends > 0.0), "appends stream over TLS: {metrics}");
        }
    }

    // Without a client certificate: the open routes answer, the guarded ones do not.
    let anonymous = ca.client(None).build().unwrap();
    let url = cluster.url(leader);
    for open in ["/health", "/metrics", "/cluster"] {
        let status = anonymous.get(format!("{url}{open}")).send().await.unwrap().status();
        assert_eq!(status, 200, "{open} without a client certificate");
    }
    let refused =
        anonymous.post(format!("{url}/v1/command")).body("*2\r\n$3\r\nGET\r\n$1\r\nk\r\n").send().await.unwrap();
    assert_eq!(refused.status(), 401);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["code"], "client_certificate_required", "{body}");
    let vote = anonymous.post(format!("{url}/raft/vote")).body(Vec::new()).send().await.unwrap();
    assert_eq!(vote.status(), 401, "Raft RPC without a client certificate");
    assert_eq!(
        common::open_appends_stream(&anonymous, &url).await,
        401,
        "an appends stream without a client certificate"
    );
    let join = anonymous
        .post(format!("{url}/cluster/learners"))
        .json(&serde_json::json!({"id": 9, "address": "https://127.0.0.1:1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(join.status(), 401, "membership changes without a client certificate");
    let plain_learner = cluster
        .http
        .post(format!("{url}/cluster/learners"))
        .json(&serde_json::json!({"id": 9, "address": "http://127.0.0.1:1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(plain_learner.status(), 400, "a learner at an http:// URL in a cluster with TLS");
    let body: serde_json::Value = plain_learner.json().await.unwrap();
    assert!(body["message"].as_str().unwrap().contains("https://"), "{body}");

    // A certificate the CA signed for someone else cannot speak for a member: a Raft request
    // needs the certificate of the member it claims to come from, one that names the host of
    // that member's address (127.0.0.1 here); the operator's, which names another host, reaches
    // the routes any signed certificate may use, but not Raft.
    let elsewhere = ca.client(Some(ca.issue_naming("operator-elsewhere", &["operator.example"]))).build().unwrap();
    let member = cluster.running().into_iter().find(|id| *id != leader).unwrap();
    let vote_from = |client: &reqwest::Client, from: Option<String>| {
        let mut request = client.post(format!("{url}/raft/vote")).body(Vec::new());
        if let Some(from) = from {
            request = request.header("x-statestore-node", from);
        }
        request.send()
    };
    let refused = vote_from(&elsewhere, Some(member.to_string())).await.unwrap();
    assert_eq!(refused.status(), 403, "Raft RPC with a certificate that does not name the member's host");
    let why = refused.text().await.unwrap();
    assert!(why.contains("does not name 127.0.0.1"), "{why}");
    let refused = vote_from(&elsewhere, None).await.unwrap();
    assert_eq!(refused.status(), 403, "Raft RPC over TLS that names no sender");
    let refused = vote_from(&cluster.http, Some("42".into())).await.unwrap();
    assert_eq!(refused.status(), 403, "Raft RPC from a node that is not a member");
    assert!(refused.text().await.unwrap().contains("node 42 is not a member"));
    let checked = vote_from(&cluster.http, Some(member.to_string())).await.unwrap();
    assert_eq!(checked.status(), 400, "a certificate naming the member's host gets as far as the (empty) body");
    let stream = elsewhere
        .get(format!("{url}/raft/append/stream"))
        .header("connection", "upgrade")
        .header("upgrade", statestore_raft::append_stream::UPGRADE_PROTOCOL)
        .header("x-statestore-node", member.to_string());
    assert_eq!(stream.send().await.unwrap().status(), 403, "an appends stream with another's certificate");
    let command = elsewhere.post(format!("{url}/v1/command")).body("*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
    assert_eq!(command.send().await.unwrap().status(), 200, "/v1/command takes any certificate the CA signs");

    // A certificate another CA signs is refused in the handshake; so is plain HTTP.
    let stranger = rogue.issue("intruder");
    let config = client_config(&TlsConfig { ca: Some(ca.ca()), client_auth: Some(stranger) }).unwrap();
    let intruder = reqwest::Client::builder().use_preconfigured_tls(config).timeout(Duration::from_secs(5));
    let attempt = intruder.build().unwrap().post(format!("{url}/v1/command")).body("x").send().await;
    assert!(attempt.is_err(), "a client certificate of another CA got an answer: {attempt:?}");
    let plain = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    let attempt = plain.get(format!("{}/health", url.replace("https://", "http://"))).send().await;
    assert!(attempt.is_err() || attempt.unwrap().status() != 200, "plain HTTP was served");

    // Raft over TLS fails over: a new leader is elected and takes writes.
    cluster.kill(leader);
    let next = cluster.wait_leader().await;
    assert_ne!(next, leader);
    let answer = cluster.set_anywhere("after-failover", "v2", Duration::from_secs(20)).await;
    assert_eq!(answer.response, Response::Ok);

    // The CLI reaches the nodes with the CA; a membership change needs the operator's certificate.
    let cli = PathBuf::from(env!("CARGO_BIN_EXE_statestore")).with_file_name("statestore-cli");
    let endpoints = cluster.running().iter().map(|id| cluster.url(*id)).collect::<Vec<_>>().join(",");
    let run = |args: &[&str], identity: Option<&(PathBuf, PathBuf)>| {
        let mut command = std::process::Command::new(&cli);
        command.args(["--json", "--endpoint", &endpoints]).args(args).env("STATESTORE_TLS_CA", ca.ca());
        command.env_remove("STATESTORE_ENDPOINTS").env_remove("STATESTORE_TLS_CERT").env_remove("STATESTORE_TLS_KEY");
        if let Some((cert, key)) = identity {
            command.env("STATESTORE_TLS_CERT", cert).env("STATESTORE_TLS_KEY", key);
        }
        let output = command.output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        (output.status.code(), text)
    };
    let old = leader.to_string();
    let (code, text) = run(&["cluster", "remove", &old], None);
    assert_eq!(code, Some(3), "{text}");
    assert!(text.contains("client certificate"), "{text}");
    let (code, text) = run(&["cluster", "remove", &old], Some(&operator));
    assert_eq!(code, Some(0), "{text}");
    let (code, text) = run(&["cluster", "members"], None);
    assert_eq!(code, Some(0), "{text}");
    let members: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(members["voters"].as_array().map(Vec::len), Some(2), "{members}");
    assert_eq!(members["leader"], next, "{members}");
}

/// A node refuses to start with half a TLS identity, or with http:// peers under TLS.
#[test]
fn incomplete_or_inconsistent_tls_settings_are_refused_at_start() {
    let pki = tempfile::tempdir().unwrap();
    let ca = Authority::new(pki.path(), "cluster");
    let (cert, key) = ca.issue("node");
    let node = env!("CARGO_BIN_EXE_statestore");
    let data = pki.path().join("data");
    let run = |extra: &[String]| {
        let output = std::process::Command::new(node)
            .args(["--id=1", "--listen=127.0.0.1:1", &format!("--data-dir={}", data.display())])
            .args(extra)
            .env_clear()
            .output()
            .unwrap();
        (output.status.code(), String::from_utf8_lossy(&output.stderr).to_string())
    };
    let (code, stderr) = run(&[format!("--tls-cert={}", cert.display())]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--tls-cert, --tls-key and --tls-ca go together"), "{stderr}");
    let all = [
        format!("--tls-cert={}", cert.display()),
        format!("--tls-key={}", key.display()),
        format!("--tls-ca={}", ca.ca().display()),
    ];
    let (code, stderr) =
        run(&[&all[..], &["--initial-members=1=https://127.0.0.1:1,2=http://127.0.0.1:2".into()]].concat());
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("https://"), "{stderr}");
    assert!(!data.exists(), "nothing is written before the settings are checked");
}

/// Mosquitto reads its certificate files after dropping root: let everyone read the test PKI.
fn readable_by_everyone(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        std::fs::set_permissions(entry.unwrap().path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_reach_a_tls_broker_and_each_client_uses_only_its_keys() {
    let pki = tempfile::tempdir().unwrap();
    let ca = Authority::new(pki.path(), "cluster");
    let (broker_cert, broker_key) = ca.issue("broker");
    let (node_cert, node_key) = ca.issue("node");
    let client_identity = ca.issue("client");
    let access = pki.path().join("access.toml");
    std::fs::write(&access, "[clients]\n\"tenant\" = [\"tenant/\"]\n\"admin\" = [\"\"]\n\"*\" = [\"public/\"]\n")
        .unwrap();
    readable_by_everyone(pki.path());
    let broker = Broker::start_tls(&ca.ca(), &broker_cert, &broker_key);
    let flags = [
        format!("--broker={}", broker.address()),
        format!("--broker-ca={}", ca.ca().display()),
        format!("--broker-cert={}", node_cert.display()),
        format!("--broker-key={}", node_key.display()),
        format!("--authorization-file={}", access.display()),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let cluster = Cluster::start(3, &flags).await;

    let connect = |id: &str, identity: Option<(PathBuf, PathBuf)>| {
        let mut options = ClientOptions::new("127.0.0.1", broker.port, id);
        options.tls = Some(TlsConfig { ca: Some(ca.ca()), client_auth: identity });
        options.timeout = Duration::from_secs(3);
        Client::connect(options)
    };
    let without_certificate = connect("tenant", None).await;
    assert!(without_certificate.is_err(), "the TLS listener took a client without a certificate");

    let tenant = connect("tenant", Some(client_identity.clone())).await.unwrap();
    let admin = connect("admin", Some(client_identity.clone())).await.unwrap();
    let stranger = connect("stranger", Some(client_identity)).await.unwrap();
    let set = |key: &str, value: &str| Command::Set(Set::new(key, value));
    let get = |key: &str| Command::Get(Get { key: key.as_bytes().to_vec() });
    // The nodes answer once their front ends are subscribed through the TLS listener.
    let until = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match tenant.request(&set("tenant/a", "mine"), None).await {
            Ok(reply) => {
                assert_eq!(reply.response, Response::Ok);
                break;
            }
            Err(e) => {
                assert!(std::time::Instant::now() < until, "no answer through the TLS broker: {e}\n{}", cluster.logs())
            }
        }
    }
    let not_authorized = Response::Error(StoreError::NotAuthorized);
    assert_eq!(admin.request(&set("other/a", "theirs"), None).await.unwrap().response, Response::Ok);
    assert_eq!(tenant.request(&set("other/a", "stolen"), None).await.unwrap().response, not_authorized);
    assert_eq!(tenant.request(&get("other/a"), None).await.unwrap().response, not_authorized);
    assert_eq!(stranger.request(&get("tenant/a"), None).await.unwrap().response, not_authorized);
    assert_eq!(stranger.request(&set("public/a", "x"), None).await.unwrap().response, Response::Ok);
    assert_eq!(admin.request(&get("other/a"), None).await.unwrap().response, Response::Value(b"theirs".to_vec()));
    assert_eq!(admin.request(&get("tenant/a"), None).await.unwrap().response, Response::Value(b"mine".to_vec()));
}

/// A node that others can reach (its `--listen` is not loopback) starts only with a cluster secret,
/// TLS, or `--insecure-no-auth`; with `--create-cluster-secret` it makes its own secret and
/// guards its routes with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_beyond_loopback_without_a_secret_or_tls_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let node = env!("CARGO_BIN_EXE_statestore");
    let port = common::free_port();
    let data = dir.path().join("data");
    let command = |extra: &[&str], env: &[(&str, &str)]| {
        let mut command = std::process::Command::new(node);
        command
            .args(["--id=1", &format!("--listen=0.0.0.0:{port}"), &format!("--data-dir={}", data.display())])
            .args([
                format!("--advertise=http://127.0.0.1:{port}"),
                format!("--initial-members=1=http://127.0.0.1:{port}"),
            ])
            .args(extra)
            .env_clear()
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::null());
        command
    };
    let mut refused =
        command(&[], &[]).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while refused.try_wait().unwrap().is_none() {
        if std::time::Instant::now() >= until {
            refused.kill().unwrap();
            refused.wait().unwrap();
            panic!("the node started on 0.0.0.0 without a cluster secret or TLS");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = refused.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    for flag in ["--listen", "--cluster-secret-file", "--tls-cert", "--insecure-no-auth", "STATESTORE_INSECURE_NO_AUTH"]
    {
        assert!(stderr.contains(flag), "{flag} not named: {stderr}");
    }
    assert!(!data.exists(), "nothing is written before the settings are checked");

    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    let url = format!("http://127.0.0.1:{port}");
    // Runs the node until it answers /health; then the status of an unauthenticated command.
    let serve_and_try = |mut command: std::process::Command| {
        let http = http.clone();
        let url = url.clone();
        async move {
            let mut child =
                command.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().unwrap();
            let until = std::time::Instant::now() + common::DEADLINE;
            while http.get(format!("{url}/health")).send().await.is_err() {
                assert!(child.try_wait().unwrap().is_none(), "the node stopped");
                assert!(std::time::Instant::now() < until, "the node never served");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let command = Set::new("k", "v").encode();
            let status = http.post(format!("{url}/v1/command")).body(command).send().await.unwrap().status();
            child.kill().unwrap();
            child.wait().unwrap();
            status.as_u16()
        }
    };
    let open = serve_and_try(command(&[], &[("STATESTORE_INSECURE_NO_AUTH", "true")])).await;
    assert_ne!(open, 401, "--insecure-no-auth serves every route");

    let secret_file = dir.path().join("secret/cluster-secret");
    std::fs::create_dir_all(secret_file.parent().unwrap()).unwrap();
    let secret_flag = format!("--cluster-secret-file={}", secret_file.display());
    let guarded = serve_and_try(command(&[&secret_flag, "--create-cluster-secret"], &[])).await;
    assert_eq!(guarded, 401, "a created secret guards the routes");
    let secret = std::fs::read_to_string(&secret_file).unwrap();
    assert!(secret.trim().len() >= 32, "{secret:?}");
}
