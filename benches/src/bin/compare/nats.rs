//! The `nats` target: a three-server NATS cluster with JetStream (the Debian `nats-server`
//! binary) on loopback, and a key-value bucket replicated on all three (`num_replicas: 3`), written
//! the way NATS KV clients write a key: a publish to `$KV.<bucket>.<key>` with a reply subject,
//! answered by JetStream's publish acknowledgement once the stream's Raft group has the message.
//!
//! What it stores is what `nats kv add --replicas 3` makes (one value per key, file storage). Its
//! durability differs from the other targets': nats-server 2.9 acknowledges a write when a
//! quorum has it in its file store, and syncs those files to disk every two minutes, not per write
//! (etcd and the state store fsync a quorum before they answer).
//!
//! A GET is what a NATS KV client's get is on a bucket that allows direct gets (as `nats kv add`
//! makes it): a request to `$JS.API.DIRECT.GET.KV_<bucket>.$KV.<bucket>.<key>`, answered with
//! the last message of that subject (headers, then the value) by any of the stream's replicas.
//!
//! The client speaks the NATS text protocol itself (`PUB` out, `MSG` in): connections shared by
//! [`SLOTS_PER_CONNECTION`] in-flight slots, each request answered on its own reply subject.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::load::{RequestError, Requester};
use crate::processes::Process;

const SERVERS: usize = 3;
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// The bucket every run writes to.
pub const BUCKET: &str = "compare";
/// In-flight slots that share one connection (as for MQTT).
pub const SLOTS_PER_CONNECTION: usize = 16;
/// Largest protocol line read from a server (an `INFO` line is the longest).
const MAX_LINE: usize = 64 << 10;
/// How long connecting and the protocol handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Requests a connection holds before its writer has sent them; more are refused as errors.
const MAX_QUEUED: usize = 4096;

struct Server {
    name: String,
    client_port: u16,
    monitor_port: u16,
    process: Process,
}

pub struct NatsCluster {
    servers: Vec<Server>,
    logs: PathBuf,
}

impl NatsCluster {
    /// Starts three servers, waits until each is healthy, then creates the bucket (retried while
    /// JetStream elects its leaders).
    pub async fn start(binary: &Path, dir: &Path, logs: &Path) -> anyhow::Result<NatsCluster> {
        let ports: Vec<(u16, u16, u16)> = (0..SERVERS)
            .map(|_| {
                (statestore_benches::free_port(), statestore_benches::free_port(), statestore_benches::free_port())
            })
            .collect();
        let routes = ports
            .iter()
            .map(|(_, _, route)| format!("\"nats-route://127.0.0.1:{route}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let mut cluster = NatsCluster { servers: Vec::new(), logs: logs.to_path_buf() };
        for (i, (client_port, monitor_port, route_port)) in ports.into_iter().enumerate() {
            let name = format!("nats{}", i + 1);
            let store = dir.join(&name);
            std::fs::create_dir_all(&store)?;
            let config = format!(
                "server_name: {name}\nlisten: \"127.0.0.1:{client_port}\"\nhttp: \"127.0.0.1:{monitor_port}\"\n\
                 jetstream {{ store_dir: \"{}\" }}\n\
                 cluster {{ name: compare, listen: \"127.0.0.1:{route_port}\", routes: [{routes}] }}\n",
                store.display()
            );
            let config_path = dir.join(format!("{name}.conf"));
            std::fs::write(&config_path, config)?;
            let mut command = Command::new(binary);
            command.arg("--config").arg(&config_path);
            let process = Process::spawn(&name, command, &logs.join(format!("{name}.log")))?;
            cluster.servers.push(Server { name, client_port, monitor_port, process });
        }
        let deadline = Instant::now() + START_TIMEOUT;
        let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
        for index in 0..SERVERS {
            cluster.wait_healthy(&http, index, deadline).await?;
        }
        cluster.create_bucket(deadline).await?;
        Ok(cluster)
    }

    async fn wait_healthy(&mut self, http: &reqwest::Client, index: usize, deadline: Instant) -> anyhow::Result<()> {
        let url = format!("http://127.0.0.1:{}/healthz", self.servers[index].monitor_port);
        loop {
            if let Ok(response) = http.get(&url).send().await {
                if response.status().is_success() {
                    return Ok(());
                }
            }
            let log = self.logs.join(format!("{}.log", self.servers[index].name));
            self.servers[index].process.check_running().with_context(|| format!("see {}", log.display()))?;
            if Instant::now() > deadline {
                bail!("{} did not become healthy in time; see {}", self.servers[index].name, log.display());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Creates the bucket's stream as `nats kv add --replicas 3` does, then waits until a put
    /// is acknowledged (the stream's own Raft group has a leader).
    async fn create_bucket(&self, deadline: Instant) -> anyhow::Result<()> {
        let connection = Connection::open(self.servers[0].client_port).await?;
        let config = serde_json::json!({
            "name": format!("KV_{BUCKET}"),
            "subjects": [format!("$KV.{BUCKET}.>")],
            "retention": "limits",
            "max_consumers": -1,
            "max_msgs_per_subject": 1,
            "max_msgs": -1,
            "max_bytes": -1,
            "max_age": 0,
            "max_msg_size": -1,
            "storage": "file",
            "discard": "new",
            "num_replicas": SERVERS,
            "duplicate_window": 120_000_000_000u64,
            "allow_rollup_hdrs": true,
            "deny_delete": true,
            "allow_direct": true,
        });
        let create = format!("$JS.API.STREAM.CREATE.KV_{BUCKET}");
        connection
            .request_until(&create, config.to_string().as_bytes(), deadline)
            .await
            .with_context(|| format!("JetStream did not create the bucket in time; see {}", self.logs.display()))?;
        connection
            .request_until(&format!("$KV.{BUCKET}.ready"), b"ready", deadline)
            .await
            .with_context(|| format!("the bucket took no write in time; see {}", self.logs.display()))
    }

    /// The client port of every server, the first one first.
    pub fn client_ports(&self) -> Vec<u16> {
        self.servers.iter().map(|server| server.client_port).collect()
    }

    pub fn processes(&self) -> Vec<(String, u32)> {
        self.servers.iter().map(|server| (server.name.clone(), server.process.pid())).collect()
    }

    /// Fails when a server has died.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        for server in &mut self.servers {
            let log = self.logs.join(format!("{}.log", server.name));
            server.process.check_running().with_context(|| format!("see {}", log.display()))?;
        }
        Ok(())
    }

    pub fn rss_mib(&self) -> Vec<(String, Option<f64>)> {
        self.servers.iter().map(|s| (s.name.clone(), crate::processes::rss_mib(s.process.pid()))).collect()
    }
}

/// Puts into the bucket over connections spread across the servers, one per
/// [`SLOTS_PER_CONNECTION`] slots.
pub struct NatsLoad {
    connections: Vec<Connection>,
    timeout: Duration,
}

impl NatsLoad {
    pub async fn connect(ports: &[u16], slots: usize, timeout: Duration) -> anyhow::Result<NatsLoad> {
        let count = slots.div_ceil(SLOTS_PER_CONNECTION).max(1);
        let mut connections = Vec::with_capacity(count);
        for i in 0..count {
            connections.push(Connection::open(ports[i % ports.len()]).await?);
        }
        Ok(NatsLoad { connections, timeout })
    }
}

impl NatsLoad {
    fn connection(&self, slot: usize) -> &Connection {
        &self.connections[(slot / SLOTS_PER_CONNECTION) % self.connections.len()]
    }
}

impl Requester for NatsLoad {
    async fn set(&self, slot: usize, key: Vec<u8>, value: &[u8]) -> Result<(), RequestError> {
        let key = std::str::from_utf8(&key).map_err(|_| RequestError::Send("the key is not UTF-8".into()))?;
        let answer = self.connection(slot).request(&format!("$KV.{BUCKET}.{key}"), value, self.timeout).await?;
        acknowledged(&answer)
    }

    /// A direct get of the key's last value (any replica answers; NATS KV has no other read).
    async fn get(&self, slot: usize, key: Vec<u8>, local: bool) -> Result<(), RequestError> {
        if local {
            return Err(RequestError::Send("NATS KV has no separate local read".into()));
        }
        let key = std::str::from_utf8(&key).map_err(|_| RequestError::Send("the key is not UTF-8".into()))?;
        let subject = format!("$JS.API.DIRECT.GET.KV_{BUCKET}.$KV.{BUCKET}.{key}");
        let answer = self.connection(slot).request(&subject, b"", self.timeout).await?;
        found(&answer)
    }
}

/// A JetStream acknowledgement succeeds without an `"error"` member.
fn acknowledged(answer: &[u8]) -> Result<(), RequestError> {
    if contains(answer, b"\"error\"") {
        Err(RequestError::Refused(String::from_utf8_lossy(answer).into_owned()))
    } else {
        Ok(())
    }
}

/// A direct get's answer holds a message when its headers carry no status (a missing key is
/// `NATS/1.0 404 Message Not Found`).
fn found(answer: &[u8]) -> Result<(), RequestError> {
    if answer.starts_with(b"NATS/1.0\r\n") {
        Ok(())
    } else {
        let first = answer.split(|b| *b == b'\r').next().unwrap_or_default();
        Err(RequestError::Refused(String::from_utf8_lossy(first).into_owned()))
    }
}

/// What the reader hands a waiting request: the answer's body (headers and payload), or why
/// there is none.
type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Vec<u8>, RequestError>>>>>;

/// One client connection: a writer task that sends what is queued in one write, a reader task
/// that hands each answer to the request waiting for it.
struct Connection {
    inbox: String,
    next: AtomicU64,
    pending: Pending,
    outgoing: mpsc::Sender<Vec<u8>>,
    tasks: [JoinHandle<()>; 2],
}

impl Connection {
    async fn open(port: u16) -> anyhow::Result<Connection> {
        Connection::open_within(port, HANDSHAKE_TIMEOUT).await
    }

    /// Connects and shakes hands (`INFO`, then `CONNECT`, the inbox subscription and a `PING`
    /// answered), all within `timeout`.
    async fn open_within(port: u16, timeout: Duration) -> anyhow::Result<Connection> {
        let (inbox, reader, mut write) = tokio::time::timeout(timeout, handshake(port))
            .await
            .with_context(|| format!("no handshake with nats-server on port {port} within {timeout:?}"))??;
        let (outgoing, mut queued) = mpsc::channel::<Vec<u8>>(MAX_QUEUED);
        let writer = tokio::spawn(async move {
            let mut buffer = Vec::with_capacity(64 << 10);
            while let Some(frame) = queued.recv().await {
                buffer.clear();
                buffer.extend_from_slice(&frame);
                while let Ok(more) = queued.try_recv() {
                    buffer.extend_from_slice(&more);
                }
                if write.write_all(&buffer).await.is_err() {
                    return;
                }
            }
        });
        let pending: Pending = Arc::default();
        let reading = read_answers(reader, pending.clone(), outgoing.clone(), format!("{inbox}."));
        let waiting = pending.clone();
        let reader = tokio::spawn(async move {
            let failure = match reading.await {
                Ok(()) => "nats-server closed the connection".to_string(),
                Err(e) => format!("reading from nats-server: {e:#}"),
            };
            let waiters: Vec<_> = waiting.lock().unwrap().drain().collect();
            for (_, waiter) in waiters {
                let _ = waiter.send(Err(RequestError::Send(failure.clone())));
            }
        });
        Ok(Connection { inbox, next: AtomicU64::new(0), pending, outgoing, tasks: [writer, reader] })
    }

    /// [`Connection::request`] again every 250 ms, each try waiting up to 5 s, until one is
    /// acknowledged or `deadline` passes; the error says why the last try failed.
    async fn request_until(&self, subject: &str, payload: &[u8], deadline: Instant) -> anyhow::Result<()> {
        loop {
            let outcome = self.request(subject, payload, Duration::from_secs(5)).await;
            let last = match outcome.and_then(|answer| acknowledged(&answer)) {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if Instant::now() > deadline {
                bail!("the last try: {last}");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Publishes `payload` to `subject` with a reply subject and waits for the reply: its body
    /// (headers, if any, then payload).
    async fn request(&self, subject: &str, payload: &[u8], timeout: Duration) -> Result<Vec<u8>, RequestError> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (answered, answer) = oneshot::channel();
        self.pending.lock().unwrap().insert(id, answered);
        let mut frame = Vec::with_capacity(subject.len() + self.inbox.len() + payload.len() + 48);
        let _ = write!(frame, "PUB {subject} {}.{id} {}\r\n", self.inbox, payload.len());
        frame.extend_from_slice(payload);
        frame.extend_from_slice(b"\r\n");
        if let Err(e) = self.outgoing.try_send(frame) {
            self.pending.lock().unwrap().remove(&id);
            return Err(RequestError::Send(match e {
                mpsc::error::TrySendError::Full(_) => format!("{MAX_QUEUED} requests wait to be sent to nats-server"),
                mpsc::error::TrySendError::Closed(_) => "the connection to nats-server is closed".into(),
            }));
        }
        match tokio::time::timeout(timeout, answer).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Err(RequestError::Send("the connection to nats-server is closed".into())),
            Err(_) => {
                self.pending.lock().unwrap().remove(&id);
                Err(RequestError::Timeout)
            }
        }
    }
}

/// Connects to nats-server on `port` and shakes hands; returns the inbox the connection's
/// answers come to and its two halves.
async fn handshake(port: u16) -> anyhow::Result<(String, BufReader<OwnedReadHalf>, OwnedWriteHalf)> {
    let stream = TcpStream::connect(("127.0.0.1", port)).await?;
    stream.set_nodelay(true)?;
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::with_capacity(256 << 10, read);
    let mut info = String::new();
    reader.read_line(&mut info).await?;
    if !info.starts_with("INFO ") {
        bail!("nats-server greeted with {info:?}, not INFO");
    }
    let inbox = format!("_INBOX.{:016x}", fastrand::u64(..));
    let hello = format!(
        "CONNECT {{\"verbose\":false,\"pedantic\":false,\"headers\":true,\"lang\":\"rust\",\"version\":\"0\",\
         \"protocol\":1}}\r\nSUB {inbox}.* 1\r\nPING\r\n"
    );
    write.write_all(hello.as_bytes()).await?;
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).await? == 0 {
            bail!("nats-server closed the connection during the handshake");
        }
        match line.trim_end() {
            "PONG" => break,
            "PING" => write.write_all(b"PONG\r\n").await?,
            other if other.starts_with("-ERR") => bail!("nats-server refused the connection: {other}"),
            _ => {}
        }
    }
    Ok((inbox, reader, write))
}

impl Drop for Connection {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Reads what the server sends until the connection ends: answers go to their waiters (by the
/// request id at the end of the reply subject, after `prefix`), `PING`s are answered.
async fn read_answers(
    mut reader: BufReader<OwnedReadHalf>,
    pending: Pending,
    outgoing: mpsc::Sender<Vec<u8>>,
    prefix: String,
) -> anyhow::Result<()> {
    let mut line = String::new();
    let mut payload = Vec::new();
    loop {
        line.clear();
        if (&mut reader).take(MAX_LINE as u64).read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let mut words = line.split_ascii_whitespace();
        match words.next() {
            Some("MSG" | "HMSG") => {
                // MSG <subject> <sid> [reply-to] <#bytes>, or
                // HMSG <subject> <sid> [reply-to] <#header bytes> <#total bytes>
                let words: Vec<&str> = words.collect();
                let (Some(subject), Some(size)) = (words.first(), words.last()) else {
                    bail!("malformed MSG line {line:?}");
                };
                let size: usize = size.parse().with_context(|| format!("malformed MSG line {line:?}"))?;
                payload.resize(size + 2, 0);
                reader.read_exact(&mut payload).await?;
                let id = subject.strip_prefix(prefix.as_str()).and_then(|id| id.parse::<u64>().ok());
                let Some(waiter) = id.and_then(|id| pending.lock().unwrap().remove(&id)) else {
                    continue; // an answer nobody waits for any more (timed out)
                };
                let _ = waiter.send(Ok(payload[..size].to_vec()));
            }
            Some("PING") => {
                // Dropped when the queue is full: the server then closes the connection, and
                // every waiting request fails with that.
                let _ = outgoing.try_send(b"PONG\r\n".to_vec());
            }
            Some("-ERR") => bail!("nats-server: {}", line.trim_end()),
            // INFO updates, PONG, +OK.
            _ => {}
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_server_that_never_greets_fails_the_handshake_at_its_deadline() {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = silent.local_addr().unwrap().port();
        let started = Instant::now();
        let error = Connection::open_within(port, Duration::from_millis(300)).await.err().expect("no handshake");
        assert!(started.elapsed() < Duration::from_secs(5), "waited {:?}", started.elapsed());
        assert!(format!("{error:#}").contains("no handshake with nats-server"), "{error:#}");
        drop(silent);
    }

    #[test]
    fn an_acknowledgement_with_an_error_member_is_a_refusal() {
        assert!(acknowledged(br#"{"error":{"code":503,"description":"no leader"}}"#).is_err());
        assert!(acknowledged(br#"{"stream":"KV_compare","seq":7}"#).is_ok());
    }

    #[test]
    fn a_direct_get_finds_a_message_only_without_a_status() {
        assert!(found(b"NATS/1.0\r\nNats-Stream: KV_compare\r\nNats-Sequence: 3\r\n\r\nvalue").is_ok());
        let missing = found(b"NATS/1.0 404 Message Not Found\r\n\r\n").unwrap_err();
        assert!(missing.to_string().contains("404 Message Not Found"), "{missing}");
    }
}
