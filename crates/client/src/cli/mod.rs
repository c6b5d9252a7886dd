//! Flags, subcommands, output and exit codes of `statestore-cli`.

mod cluster;
mod keys;
mod load;
mod lock;
mod snapshot;

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use clap::{Args as ClapArgs, Parser, Subcommand};
use serde_json::{json, Value};
use statestore_client::{Client, ClientOptions, TlsConfig};

/// What a command ended with; the process exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Found, applied, done.
    Done,
    /// GET of an absent key, DEL/VDEL of an absent key.
    NotFound,
    /// A condition (NX, NEX, VDEL's value) or a fencing token refused the write, or a lock is
    /// held by another holder.
    NotApplied,
    /// The server answered with an error, or there was no answer.
    Error,
    /// The command line is wrong.
    Usage,
    /// The exit code of the command `lock ... -- CMD` ran (128 + the signal when a signal ended it).
    Command(u8),
}

impl Outcome {
    /// The process exit code.
    pub fn code(self) -> u8 {
        match self {
            Outcome::Done => 0,
            Outcome::NotFound => 1,
            Outcome::NotApplied => 2,
            Outcome::Error => 3,
            Outcome::Usage => 64,
            Outcome::Command(code) => code,
        }
    }
}

#[derive(Debug, Parser)]
#[command(
    name = "statestore-cli",
    version,
    about = "Keys, values, locks and cluster administration of a statestore cluster",
    disable_help_flag = true,
    after_help = "Exit codes: 0 done/found/applied, 1 not found, 2 not applied, 3 error, 64 bad usage; \
                  lock ... -- CMD exits with CMD's code."
)]
pub struct Args {
    #[command(flatten)]
    pub broker: BrokerArgs,
    /// Node HTTP endpoints for `cluster` commands, comma-separated; tried in order. A cluster
    /// with a secret needs it for membership changes: set STATESTORE_CLUSTER_SECRET, or
    /// STATESTORE_CLUSTER_SECRET_FILE to a file holding it.
    #[arg(
        long,
        global = true,
        env = "STATESTORE_ENDPOINTS",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:7401,http://127.0.0.1:7402,http://127.0.0.1:7403"
    )]
    pub endpoint: Vec<String>,
    /// PEM file of the CA that signs the nodes' certificates, for https:// endpoints. Default:
    /// the system's trusted roots.
    #[arg(long, global = true, env = "STATESTORE_TLS_CA", value_name = "FILE")]
    pub endpoint_cafile: Option<PathBuf>,
    /// PEM client certificate for https:// endpoints, signed by the cluster's CA (membership
    /// changes need one), with --endpoint-key.
    #[arg(long, global = true, env = "STATESTORE_TLS_CERT", value_name = "FILE", requires = "endpoint_key")]
    pub endpoint_cert: Option<PathBuf>,
    /// PEM private key of --endpoint-cert.
    #[arg(long, global = true, env = "STATESTORE_TLS_KEY", value_name = "FILE", requires = "endpoint_cert")]
    pub endpoint_key: Option<PathBuf>,
    /// Print one JSON document per result instead of human-readable text.
    #[arg(long, global = true)]
    pub json: bool,
    /// How long to wait for an answer, in seconds (also the request's MQTT message expiry).
    #[arg(long, global = true, default_value_t = 10.0, value_name = "SECONDS")]
    pub timeout: f64,
    /// Print help.
    #[arg(long, action = clap::ArgAction::Help, global = true)]
    pub help: Option<bool>,
    #[command(subcommand)]
    pub command: Command,
}

/// Broker connection flags, spelled as `mosquitto_pub` spells them.
impl Args {
    /// Parses the process's arguments. `-h` is the broker host everywhere, as in `mosquitto_pub`:
    /// clap's own `-h` is taken out of every subcommand, which keep `--help`.
    pub fn parse_command_line() -> Result<Args, clap::Error> {
        use clap::{CommandFactory, FromArgMatches};
        fn without_short_help(command: clap::Command) -> clap::Command {
            command.disable_help_flag(true).mut_subcommands(without_short_help)
        }
        let matches = without_short_help(Args::command()).try_get_matches()?;
        Args::from_arg_matches(&matches)
    }
}

#[derive(Debug, ClapArgs)]
pub struct BrokerArgs {
    /// MQTT broker host.
    #[arg(short = 'h', long = "host", global = true, env = "STATESTORE_MQTT_HOST", default_value = "127.0.0.1")]
    pub host: String,
    /// MQTT broker port (default 1883, or 8883 with TLS).
    #[arg(short = 'p', long = "port", global = true, env = "STATESTORE_MQTT_PORT")]
    pub port: Option<u16>,
    /// MQTT client id. Default: `statestore-cli-<random>`, unique per run.
    #[arg(short = 'i', long = "id", global = true)]
    pub client_id: Option<String>,
    /// PEM file of the CA that signs the broker's certificate (turns TLS on).
    #[arg(long, global = true)]
    pub cafile: Option<PathBuf>,
    /// Use TLS with the system's trusted roots.
    #[arg(long, global = true)]
    pub tls: bool,
    /// PEM client certificate for mutual TLS (with --key).
    #[arg(long, id = "cert_file", value_name = "FILE", global = true, requires = "key_file")]
    pub cert: Option<PathBuf>,
    /// PEM private key of --cert.
    #[arg(long = "key", id = "key_file", value_name = "FILE", global = true, requires = "cert_file")]
    pub key: Option<PathBuf>,
    /// MQTT user name.
    #[arg(short = 'u', long = "username", global = true, env = "STATESTORE_MQTT_USERNAME")]
    pub username: Option<String>,
    /// MQTT password (prefer the environment variable).
    #[arg(
        short = 'P',
        long = "pw",
        alias = "password",
        global = true,
        env = "STATESTORE_MQTT_PASSWORD",
        hide_env_values = true
    )]
    pub password: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print a key's value (raw bytes, binary-safe). Exit 1 if absent.
    #[command(
        after_help = "Examples:\n  statestore-cli get greeting\n  statestore-cli get firmware/blob -o blob.bin\n  statestore-cli --json get greeting      # value, or value_base64 when not UTF-8, and version"
    )]
    Get {
        #[arg(value_parser = clap::value_parser!(OsString))]
        key: OsString,
        /// Write the value to this file instead of standard output.
        #[arg(short = 'o', long)]
        output: Option<PathBuf>,
    },
    /// Set a key. The value comes from the argument, or from --file (`-` for standard input).
    #[command(
        after_help = "Examples:\n  statestore-cli set greeting hello\n  statestore-cli set config/v1 --file config.json --nx     # exit 2 if it exists\n  echo -n on | statestore-cli set lamp --file - --px 30000\n  statestore-cli set guarded v2 --fencing-token \"$TOKEN\""
    )]
    Set {
        #[arg(value_parser = clap::value_parser!(OsString))]
        key: OsString,
        #[command(flatten)]
        value: ValueArgs,
        /// Only if the key does not exist (exit 2 otherwise).
        #[arg(long, conflicts_with = "nex")]
        nx: bool,
        /// Only if the key does not exist or already holds this value.
        #[arg(long)]
        nex: bool,
        /// Expire the key this many milliseconds after the write.
        #[arg(long, value_name = "MILLISECONDS")]
        px: Option<u64>,
        /// Fencing token (`__ft`): an HLC such as a lock's token.
        #[arg(long, value_name = "HLC")]
        fencing_token: Option<String>,
    },
    /// Delete a key. Exit 1 if it was absent.
    #[command(
        after_help = "Examples:\n  statestore-cli del greeting\n  statestore-cli del guarded --fencing-token \"$TOKEN\""
    )]
    Del {
        #[arg(value_parser = clap::value_parser!(OsString))]
        key: OsString,
        #[arg(long, value_name = "HLC")]
        fencing_token: Option<String>,
    },
    /// Delete a key only if it holds VALUE. Exit 1 if absent, 2 if it holds another value.
    #[command(after_help = "Example:\n  statestore-cli vdel leader node-7      # release only what node-7 holds")]
    Vdel {
        #[arg(value_parser = clap::value_parser!(OsString))]
        key: OsString,
        #[command(flatten)]
        value: ValueArgs,
        #[arg(long, value_name = "HLC")]
        fencing_token: Option<String>,
    },
    /// List the keys matching a glob pattern (SCAN, all pages).
    #[command(after_help = "Examples:\n  statestore-cli keys\n  statestore-cli keys 'sensors/*/temperature'")]
    Keys {
        #[arg(default_value = "*")]
        pattern: String,
    },
    /// Stream the changes of keys (KEYNOTIFY) until interrupted, with their versions.
    #[command(
        after_help = "Examples:\n  statestore-cli watch lamp door\n  statestore-cli --json watch lamp --count 1   # wait for one change"
    )]
    Watch {
        #[arg(required = true, value_parser = clap::value_parser!(OsString))]
        keys: Vec<OsString>,
        /// Stop after this many notifications.
        #[arg(long)]
        count: Option<u64>,
    },
    /// Take a lease lock, print its fencing token, renew it, release it on exit. With a command
    /// after `--`, hold the lock while the command runs (its exit code becomes ours).
    #[command(
        after_help = "Examples:\n  statestore-cli lock backup --ttl 10000 -- sh -c 'run-backup --token \"$STATESTORE_FENCING_TOKEN\"'\n  statestore-cli lock leader --no-wait || echo 'someone else leads'"
    )]
    Lock(lock::LockArgs),
    /// A steady write load for drills: one line per completed write, `<sent ms> <done ms> ok|err`.
    #[command(after_help = "Example:\n  statestore-cli load --writers 8 --duration 60 --out writes.log")]
    Load(load::LoadArgs),
    /// Cluster administration over the nodes' HTTP API.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Online backup of every key, and restoring one into a new cluster (over the nodes' HTTP API).
    #[command(subcommand)]
    Snapshot(snapshot::SnapshotCommand),
}

/// Runs the parsed command line.
pub async fn run(args: Args) -> Outcome {
    let out = Output { json: args.json };
    if !(args.timeout.is_finite() && args.timeout > 0.0 && args.timeout <= 86_400.0) {
        return out.usage("--timeout must be a number of seconds in (0, 86400]");
    }
    let timeout = Duration::from_secs_f64(args.timeout);
    match args.command {
        Command::Cluster(command) => {
            let client_auth = args.endpoint_cert.zip(args.endpoint_key);
            let tls = TlsConfig { ca: args.endpoint_cafile, client_auth };
            cluster::run(&out, &args.endpoint, &tls, timeout, command).await
        }
        Command::Snapshot(command) => {
            let client_auth = args.endpoint_cert.zip(args.endpoint_key);
            let tls = TlsConfig { ca: args.endpoint_cafile, client_auth };
            snapshot::run(&out, &args.endpoint, &tls, command).await
        }
        command => {
            let options = match client_options(&args.broker, timeout) {
                Ok(options) => options,
                Err(message) => return out.usage(&message),
            };
            keys::run(&out, options, command).await
        }
    }
}

fn client_options(broker: &BrokerArgs, timeout: Duration) -> Result<ClientOptions, String> {
    let tls = (broker.tls || broker.cafile.is_some() || broker.cert.is_some())
        .then(|| TlsConfig { ca: broker.cafile.clone(), client_auth: broker.cert.clone().zip(broker.key.clone()) });
    let port = broker.port.unwrap_or(if tls.is_some() { 8883 } else { 1883 });
    let client_id = match &broker.client_id {
        Some(id) if id.is_empty() => return Err("the client id (-i) must not be empty".into()),
        Some(id) => id.clone(),
        None => format!("statestore-cli-{:016x}", fastrand::u64(..)),
    };
    let mut options = ClientOptions::new(broker.host.clone(), port, client_id);
    options.tls = tls;
    options.username = broker.username.clone();
    options.password = broker.password.clone();
    options.timeout = timeout;
    Ok(options)
}

/// Connects, reporting a failure the same way in every command.
async fn connect(out: &Output, options: ClientOptions) -> Result<Client, Outcome> {
    Client::connect(options).await.map_err(|e| out.error(&e.to_string()))
}

/// A value from the argument or from a file (`-` for standard input), byte-exact.
#[derive(Debug, ClapArgs)]
pub struct ValueArgs {
    #[arg(value_parser = clap::value_parser!(OsString), required_unless_present = "file", conflicts_with = "file")]
    value: Option<OsString>,
    /// Read the value from a file, `-` for standard input.
    #[arg(short = 'f', long)]
    file: Option<PathBuf>,
}

impl ValueArgs {
    fn read(self) -> Result<Vec<u8>, String> {
        match (self.value, self.file) {
            (Some(value), _) => Ok(value.into_vec()),
            (None, Some(path)) if path.as_os_str() == "-" => {
                let mut buffer = Vec::new();
                std::io::stdin().read_to_end(&mut buffer).map_err(|e| format!("reading standard input: {e}"))?;
                Ok(buffer)
            }
            (None, Some(path)) => std::fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display())),
            (None, None) => Err("give a value or --file".into()),
        }
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Human or JSON output, and the outcome each message ends a command with.
pub struct Output {
    pub json: bool,
}

impl Output {
    /// Prints a JSON document (in --json mode) or a human line on standard output.
    fn print(&self, human: impl FnOnce() -> String, document: impl FnOnce() -> Value) {
        let mut stdout = std::io::stdout().lock();
        let line = if self.json { document().to_string() } else { human() };
        let _ = writeln!(stdout, "{line}");
        let _ = stdout.flush();
    }

    fn fail(&self, outcome: Outcome, kind: &str, message: &str) -> Outcome {
        if self.json {
            self.print(String::new, || json!({"result": kind, "message": message}));
        } else {
            eprintln!("statestore-cli: {message}");
        }
        outcome
    }

    pub fn error(&self, message: &str) -> Outcome {
        self.fail(Outcome::Error, "error", message)
    }

    pub fn usage(&self, message: &str) -> Outcome {
        self.fail(Outcome::Usage, "usage", message)
    }

    pub fn not_found(&self, message: &str) -> Outcome {
        self.fail(Outcome::NotFound, "not_found", message)
    }

    pub fn not_applied(&self, message: &str) -> Outcome {
        self.fail(Outcome::NotApplied, "not_applied", message)
    }
}

/// Bytes in JSON: `<name>` as a string when they are UTF-8 (else null), and always
/// `<name>_base64`.
fn bytes_fields(document: &mut serde_json::Map<String, Value>, name: &str, bytes: &[u8]) {
    document.insert(name.to_string(), std::str::from_utf8(bytes).map_or(Value::Null, |s| Value::String(s.into())));
    document.insert(format!("{name}_base64"), Value::String(base64::engine::general_purpose::STANDARD.encode(bytes)));
}

/// Bytes for a human: as text when printable UTF-8, else as an escaped string.
fn printable(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) if !text.chars().any(char::is_control) => text.to_string(),
        _ => format!("{:?}", bytes.escape_ascii().to_string()),
    }
}
