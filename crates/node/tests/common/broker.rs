//! A real Mosquitto broker on a free loopback port, started for one test and stopped with it.

use std::fs::File;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::free_port;

pub struct Broker {
    pub port: u16,
    pub dir: TempDir,
    child: Child,
}

impl Broker {
    /// Starts `mosquitto` with the settings of `cluster/mosquitto.conf` on a free port and
    /// waits until it accepts connections.
    pub fn start() -> Broker {
        Broker::start_with("")
    }

    /// The same, with only a TLS listener: the broker presents `cert`/`key` and accepts only
    /// clients whose certificate `ca` signs. Mosquitto reads them after dropping root, so the
    /// files must be readable by everyone.
    pub fn start_tls(ca: &Path, cert: &Path, key: &Path) -> Broker {
        Broker::start_with(&format!(
            "cafile {}\ncertfile {}\nkeyfile {}\nrequire_certificate true\n",
            ca.display(),
            cert.display(),
            key.display()
        ))
    }

    /// `listener` settings after the listener line.
    fn start_with(listener: &str) -> Broker {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let config = dir.path().join("mosquitto.conf");
        std::fs::write(
            &config,
            format!(
                "listener {port} 127.0.0.1\n\
                 {listener}\
                 allow_anonymous true\n\
                 set_tcp_nodelay true\n\
                 max_inflight_messages 1000\n\
                 max_queued_messages 100000\n\
                 persistence false\n\
                 log_type error\nlog_type warning\nlog_type notice\n"
            ),
        )
        .unwrap();
        let child = spawn(&dir, port);
        Broker { port, dir, child }
    }

    /// Kills the broker (SIGKILL; it keeps no state) and starts a new one on the same port.
    pub fn restart_after(&mut self, down: Duration) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::thread::sleep(down);
        self.child = spawn(&self.dir, self.port);
    }

    /// `host:port` for the nodes' `--broker` flag.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("mosquitto.log")).unwrap_or_default()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(dir: &TempDir, port: u16) -> Child {
    let log = File::options().create(true).append(true).open(dir.path().join("mosquitto.log")).unwrap();
    let child = Command::new(mosquitto())
        .arg("-c")
        .arg(dir.path().join("mosquitto.conf"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start mosquitto ({e}); install it: apt-get install -y mosquitto"));
    let started = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(started.elapsed() < Duration::from_secs(10), "mosquitto did not start on port {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// Debian installs the broker in /usr/sbin, which is not on every user's PATH.
fn mosquitto() -> PathBuf {
    for dir in std::env::var("PATH").unwrap_or_default().split(':').chain(["/usr/sbin", "/usr/local/sbin"]) {
        let candidate = PathBuf::from(dir).join("mosquitto");
        if candidate.is_file() {
            return candidate;
        }
    }
    PathBuf::from("mosquitto")
}
