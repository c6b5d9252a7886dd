//! `snapshot save FILE` and `snapshot restore FILE`: an online backup of every key of a running
//! cluster, and seeding a new cluster from one (`statestore_protocol::backup`). Both go through
//! the nodes' HTTP API; any node carries them to the leader.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Subcommand;
use serde_json::json;
use statestore_api::body::Restored;
use statestore_api::{routes, TlsConfig};
use statestore_protocol::backup::{BackupEnd, BackupReader, Frame};

use super::cluster::{Answer, Http, Payload};
use super::{Outcome, Output};

#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Save every key of the running cluster (value, version, fencing token, deadline), as one
    /// consistent read of the leader saw them, to FILE; the file ends with a checksum.
    ///
    /// Example: statestore-cli snapshot save backup-$(date +%F).ssbk
    Save { file: PathBuf },
    /// Load the keys of FILE (from `snapshot save`) into a new, empty cluster, with their
    /// versions, fencing tokens and deadlines. A cluster that holds keys is refused.
    ///
    /// Example: statestore-cli --endpoint http://new-node1:7400 snapshot restore backup.ssbk
    Restore { file: PathBuf },
}

/// Key frames sent to the leader in one request (a larger key goes alone).
const RESTORE_CHUNK: usize = 1 << 20;
/// How long one backup or restore request may take.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(600);

pub async fn run(out: &Output, endpoints: &[String], tls: &TlsConfig, command: SnapshotCommand) -> Outcome {
    let http = match Http::new(endpoints, tls, TRANSFER_TIMEOUT) {
        Ok(http) => http,
        Err(failure) => return failure.report(out),
    };
    match command {
        SnapshotCommand::Save { file } => save(out, &http, &file).await,
        SnapshotCommand::Restore { file } => restore(out, &http, &file).await,
    }
}

async fn save(out: &Output, http: &Http, file: &Path) -> Outcome {
    let partial = file.with_extension("partial");
    let received = async {
        let mut response = http.first_response(routes::BACKUP).await?;
        if !response.status().is_success() {
            let status = response.status().as_u16();
            let text = response.text().await.unwrap_or_default();
            return Err(Answer::new(status, text).error());
        }
        let mut writer =
            BufWriter::new(File::create(&partial).map_err(|e| format!("creating {}: {e}", partial.display()))?);
        let mut bytes = 0u64;
        while let Some(chunk) = response.chunk().await.map_err(|e| format!("receiving the backup: {e}"))? {
            bytes += chunk.len() as u64;
            writer.write_all(&chunk).map_err(|e| format!("writing {}: {e}", partial.display()))?;
        }
        let written = writer.into_inner().map_err(|e| format!("writing {}: {e}", partial.display()))?;
        written.sync_all().map_err(|e| format!("syncing {}: {e}", partial.display()))?;
        let end = verify(&partial)?;
        Ok::<_, String>((end, bytes))
    }
    .await;
    let (end, bytes) = match received {
        Ok(done) => done,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return out.error(&e);
        }
    };
    if let Err(e) = std::fs::rename(&partial, file) {
        let _ = std::fs::remove_file(&partial);
        return out.error(&format!("renaming {} to {}: {e}", partial.display(), file.display()));
    }
    out.print(
        || format!("saved {} (log index {}) to {}, {bytes} bytes", keys(end.keys), end.applied_index, file.display()),
        || {
            json!({"result": "ok", "file": file.display().to_string(), "keys": end.keys,
                   "applied_index": end.applied_index, "bytes": bytes})
        },
    );
    Outcome::Done
}

/// Reads the whole backup at `path`, checking every frame and the checksum.
fn verify(path: &Path) -> Result<BackupEnd, String> {
    let input = File::open(path).map_err(|e| format!("opening {}: {e}", path.display()))?;
    let mut reader = BackupReader::new(BufReader::new(input)).map_err(|e| format!("{}: {e}", path.display()))?;
    loop {
        match reader.next_frame().map_err(|e| format!("{}: {e}", path.display()))? {
            Some(Frame::Key(..)) => {}
            Some(Frame::End(end)) => return Ok(end),
            None => return Err(format!("{}: no end frame", path.display())),
        }
    }
}

async fn restore(out: &Output, http: &Http, file: &Path) -> Outcome {
    // The whole file is checked before anything is sent: a damaged backup changes nothing.
    let end = match verify(file) {
        Ok(end) => end,
        Err(e) => return out.error(&e),
    };
    let sent = async {
        let input = File::open(file).map_err(|e| format!("opening {}: {e}", file.display()))?;
        let mut reader = BackupReader::new(BufReader::new(input)).map_err(|e| e.to_string())?;
        let (mut chunk, mut first, mut restored) = (Vec::new(), true, 0u64);
        // Every chunk of this restore names it: the cluster takes later chunks only from it.
        let session = fastrand::u64(..);
        loop {
            let frame = reader.next_frame().map_err(|e| format!("{}: {e}", file.display()))?;
            let last = !matches!(frame, Some(Frame::Key(..)));
            if let Some(Frame::Key(_, bytes)) = frame {
                chunk.extend_from_slice(&bytes);
            }
            if chunk.len() >= RESTORE_CHUNK || (last && (!chunk.is_empty() || first)) {
                let path = format!("{}?session={session}&first={first}", routes::RESTORE);
                let answer = http.to_leader(&path, Payload::Bytes(std::mem::take(&mut chunk))).await?;
                if answer.status != 200 {
                    return Err(answer.error());
                }
                restored += answer.body::<Restored>()?.restored;
                first = false;
            }
            if last {
                return Ok::<_, String>(restored);
            }
        }
    }
    .await;
    match sent {
        Ok(restored) => {
            out.print(
                || {
                    format!(
                        "restored {} from {} (saved at log index {})",
                        keys(restored),
                        file.display(),
                        end.applied_index
                    )
                },
                || json!({"result": "ok", "file": file.display().to_string(), "keys": restored}),
            );
            Outcome::Done
        }
        Err(e) => out.error(&e),
    }
}

/// "1 key", "2 keys".
fn keys(count: u64) -> String {
    if count == 1 {
        "1 key".to_string()
    } else {
        format!("{count} keys")
    }
}
