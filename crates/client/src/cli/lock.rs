//! `lock NAME --ttl MS [-- COMMAND...]`: a lease lock as the SDKs' leased lock client takes it.
//!
//! Acquire and renew are `SET NAME HOLDER NEX PX ttl` (absent, or already ours), release is
//! `VDEL NAME HOLDER`. The version of the acquiring SET is the fencing token.

use std::time::Duration;

use clap::Args as ClapArgs;
use serde_json::json;
use statestore_client::{Client, Reply};
use statestore_protocol::{Command as Request, Hlc, Response, Set, SetCondition, VDel};

use super::{printable, shutdown_signal, Outcome, Output};

#[derive(Debug, ClapArgs)]
pub struct LockArgs {
    /// The lock's key.
    pub name: String,
    /// Lease length in milliseconds; the lease is renewed every third of it.
    #[arg(long, value_name = "MILLISECONDS", default_value_t = 10_000)]
    pub ttl: u64,
    /// The holder name stored as the lock's value. Default: this run's client id.
    #[arg(long)]
    pub holder: Option<String>,
    /// Exit 2 at once when another holder has the lock, instead of waiting for it.
    #[arg(long)]
    pub no_wait: bool,
    /// Give up waiting after this many seconds (exit 2).
    #[arg(long, value_name = "SECONDS")]
    pub wait_timeout: Option<f64>,
    /// A command to run while holding the lock; it gets the token in STATESTORE_FENCING_TOKEN.
    #[arg(last = true)]
    pub command: Vec<String>,
}

impl LockArgs {
    pub fn check(&self) -> Result<(), String> {
        if self.name.is_empty() {
            return Err("the lock name must not be empty".into());
        }
        if self.ttl < 100 {
            return Err("--ttl must be at least 100 milliseconds".into());
        }
        if self.holder.as_deref() == Some("") {
            return Err("--holder must not be empty".into());
        }
        if let Some(wait) = self.wait_timeout {
            if !(wait.is_finite() && wait >= 0.0) {
                return Err("--wait-timeout must be a non-negative number of seconds".into());
            }
        }
        Ok(())
    }
}

enum Attempt {
    Acquired(Option<Hlc>),
    HeldByOther,
    Failed(String),
}

async fn try_acquire(client: &Client, name: &[u8], holder: &[u8], ttl: u64) -> Attempt {
    let mut set = Set::new(name.to_vec(), holder.to_vec());
    set.condition = SetCondition::NotExistsOrEqual;
    set.expiry_ms = Some(ttl);
    match client.request(&Request::Set(set), None).await {
        Ok(Reply { response: Response::Ok, version }) => Attempt::Acquired(version),
        Ok(Reply { response: Response::Int(-1), .. }) => Attempt::HeldByOther,
        Ok(Reply { response: Response::Error(e), .. }) => Attempt::Failed(format!("the server refused the lock: {e}")),
        Ok(Reply { response, .. }) => Attempt::Failed(format!("unexpected reply {response:?} to SET")),
        Err(e) => Attempt::Failed(e.to_string()),
    }
}

pub async fn run(out: &Output, client: &Client, args: LockArgs) -> Outcome {
    let name = args.name.as_bytes().to_vec();
    let holder = args.holder.clone().unwrap_or_else(|| client.client_id().to_string());
    let deadline = args.wait_timeout.map(|s| tokio::time::Instant::now() + Duration::from_secs_f64(s));
    let poll = Duration::from_millis((args.ttl / 10).clamp(50, 500));
    let token = loop {
        match try_acquire(client, &name, holder.as_bytes(), args.ttl).await {
            Attempt::Acquired(Some(token)) => break token,
            Attempt::Acquired(None) => return out.error("the server acknowledged the lock without a version"),
            Attempt::Failed(message) => return out.error(&message),
            Attempt::HeldByOther if args.no_wait => {
                return out.not_applied(&format!("the lock {} is held by another holder", args.name))
            }
            Attempt::HeldByOther => {
                if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                    return out.not_applied(&format!("the lock {} stayed held by another holder", args.name));
                }
                tokio::select! {
                    () = tokio::time::sleep(poll) => {}
                    () = shutdown_signal() => return out.not_applied("interrupted while waiting for the lock"),
                }
            }
        }
    };
    out.print(
        || format!("acquired {} as {holder}; fencing token {token}", args.name),
        || json!({"result": "acquired", "lock": args.name, "holder": holder, "fencing_token": token.to_string()}),
    );

    let mut child = None;
    if let Some((program, rest)) = args.command.split_first() {
        match tokio::process::Command::new(program)
            .args(rest)
            .env("STATESTORE_FENCING_TOKEN", token.to_string())
            .spawn()
        {
            Ok(spawned) => child = Some(spawned),
            Err(e) => {
                let outcome = out.error(&format!("cannot run {program}: {e}"));
                release(out, client, &name, &holder).await;
                return outcome;
            }
        }
    }

    let mut renew = tokio::time::interval(Duration::from_millis(args.ttl / 3));
    renew.tick().await;
    let stop = shutdown_signal();
    tokio::pin!(stop);
    let outcome = loop {
        tokio::select! {
            _ = renew.tick() => match try_acquire(client, &name, holder.as_bytes(), args.ttl).await {
                Attempt::Acquired(version) => {
                    if out.json {
                        out.print(String::new, || json!({"result": "renewed", "lock": args.name,
                            "version": version.map(|v| v.to_string())}));
                    }
                }
                Attempt::HeldByOther => {
                    if let Some(child) = child.as_mut() {
                        let _ = child.start_kill();
                    }
                    return out.not_applied(&format!("lost the lock {}: another holder has it", printable(&name)));
                }
                // A renewal that got no answer is tried again at the next tick; the lease
                // outlives two missed renewals.
                Attempt::Failed(message) => eprintln!("statestore-cli: renewing the lock: {message}"),
            },
            status = async { child.as_mut().expect("guarded").wait().await }, if child.is_some() => {
                break match status {
                    Ok(status) => {
                        use std::os::unix::process::ExitStatusExt;
                        match (status.code(), status.signal()) {
                            (Some(code), _) => Outcome::Command(code.clamp(0, 255) as u8),
                            (None, Some(signal)) => Outcome::Command((128 + signal).clamp(0, 255) as u8),
                            (None, None) => Outcome::Error,
                        }
                    }
                    Err(e) => out.error(&format!("waiting for the command: {e}")),
                };
            }
            () = &mut stop => {
                if let Some(child) = child.as_mut() {
                    let _ = child.start_kill();
                    let _ = child.wait().await;
                }
                break Outcome::Done;
            }
        }
    };
    release(out, client, &name, &holder).await;
    outcome
}

async fn release(out: &Output, client: &Client, name: &[u8], holder: &str) {
    let request = Request::VDel(VDel { key: name.to_vec(), value: holder.as_bytes().to_vec() });
    match client.request(&request, None).await {
        Ok(Reply { response: Response::Int(1), .. }) => {
            out.print(|| "released".to_string(), || json!({"result": "released"}));
        }
        Ok(Reply { response, .. }) => eprintln!("statestore-cli: releasing the lock: reply {response:?}"),
        Err(e) => eprintln!("statestore-cli: releasing the lock: {e}"),
    }
}
