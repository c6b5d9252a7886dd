//! `load`: a steady write load for failover drills. Each writer sends one SET at a time and
//! records when it was sent, when it completed and whether it succeeded.

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args as ClapArgs;
use serde_json::json;
use statestore_client::{now_ms, Client, Reply};
use statestore_protocol::{Command as Request, Response, Set};

use super::{Outcome, Output};

#[derive(Debug, ClapArgs)]
pub struct LoadArgs {
    /// Concurrent writers, each with one write in flight.
    #[arg(long, default_value_t = 4)]
    pub writers: u16,
    /// How long to run, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    pub duration: f64,
    /// Pause between one writer's writes, in milliseconds.
    #[arg(long, value_name = "MILLISECONDS", default_value_t = 10)]
    pub interval: u64,
    /// Keys are `<prefix>/<writer>/<n mod 100>`.
    #[arg(long, default_value = "load")]
    pub key_prefix: String,
    /// Value size in bytes.
    #[arg(long, default_value_t = 64)]
    pub value_size: usize,
    /// Write `<sent unix ms> <done unix ms> ok` per completed write to this file, or `... err
    /// <why>` for one that failed (a timeout names the request's correlation data).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

impl LoadArgs {
    pub fn check(&self) -> Result<(), String> {
        if self.writers == 0 {
            return Err("--writers must be at least 1".into());
        }
        if !(self.duration.is_finite() && self.duration > 0.0) {
            return Err("--duration must be a positive number of seconds".into());
        }
        if self.key_prefix.is_empty() {
            return Err("--key-prefix must not be empty".into());
        }
        Ok(())
    }
}

#[derive(Default)]
struct Record {
    /// (sent, done, why it failed) per completed write.
    writes: Vec<(u64, u64, Option<String>)>,
}

pub async fn run(out: &Output, client: Arc<Client>, args: LoadArgs) -> Outcome {
    let mut file = match &args.out {
        Some(path) => match std::fs::File::create(path) {
            Ok(file) => Some(std::io::BufWriter::new(file)),
            Err(e) => return out.error(&format!("creating {}: {e}", path.display())),
        },
        None => None,
    };
    let record = Arc::new(Mutex::new(Record::default()));
    let end = tokio::time::Instant::now() + Duration::from_secs_f64(args.duration);
    let value = vec![b'v'; args.value_size];
    let mut writers = Vec::new();
    for writer in 0..args.writers {
        let (client, record, value) = (client.clone(), record.clone(), value.clone());
        let prefix = args.key_prefix.clone();
        let interval = Duration::from_millis(args.interval);
        writers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while tokio::time::Instant::now() < end {
                let key = format!("{prefix}/{writer}/{}", n % 100);
                n += 1;
                let sent = now_ms();
                let reply = client.request(&Request::Set(Set::new(key, value.clone())), None).await;
                let failure = match reply {
                    Ok(Reply { response: Response::Ok, .. }) => None,
                    Ok(Reply { response, .. }) => Some(format!("answered {response:?}")),
                    Err(e) => Some(e.to_string()),
                };
                let ok = failure.is_none();
                record.lock().unwrap().writes.push((sent, now_ms(), failure));
                if !ok {
                    // A failed write (no leader yet) is retried at once by the next one.
                    continue;
                }
                tokio::time::sleep(interval).await;
            }
        }));
    }
    for writer in writers {
        let _ = writer.await;
    }
    let mut writes = std::mem::take(&mut record.lock().unwrap().writes);
    writes.sort_by_key(|&(_, done, _)| done);
    if let Some(file) = file.as_mut() {
        for (sent, done, failure) in &writes {
            let _ = match failure {
                None => writeln!(file, "{sent} {done} ok"),
                Some(why) => writeln!(file, "{sent} {done} err {}", why.replace('\n', " ")),
            };
        }
        if let Err(e) = file.flush() {
            return out.error(&format!("writing the load record: {e}"));
        }
    }
    let ok: Vec<_> = writes.iter().filter(|w| w.2.is_none()).collect();
    let failed = writes.len() - ok.len();
    let mut latencies: Vec<u64> = ok.iter().map(|(sent, done, _)| done - sent).collect();
    latencies.sort_unstable();
    let percentile =
        |p: f64| latencies.get(((latencies.len() as f64 * p).ceil() as usize).saturating_sub(1)).copied().unwrap_or(0);
    let longest_gap = ok.windows(2).map(|w| w[1].1 - w[0].1).max().unwrap_or(0);
    let rate = ok.len() as f64 / args.duration;
    out.print(
        || {
            format!(
                "{} writes ok, {failed} failed, {rate:.0}/s; latency p50 {} ms, p99 {} ms; longest gap between \
                 acknowledged writes {longest_gap} ms",
                ok.len(),
                percentile(0.5),
                percentile(0.99)
            )
        },
        || {
            json!({"result": "done", "ok": ok.len(), "failed": failed, "per_second": rate,
                "p50_ms": percentile(0.5), "p99_ms": percentile(0.99), "longest_gap_ms": longest_gap})
        },
    );
    if ok.is_empty() {
        return out.error("no write succeeded");
    }
    Outcome::Done
}
