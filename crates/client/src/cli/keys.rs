//! Key commands through the broker: get, set, del, vdel, keys, watch.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::ffi::OsStringExt;

use serde_json::{json, Map, Value};
use statestore_client::{Client, ClientError, ClientOptions, Reply};
use statestore_protocol::{
    Command as Request, Del, Get, Hlc, KeyNotify, Notification, Response, Scan, Set, SetCondition, StoreError, VDel,
};

use super::{bytes_fields, connect, load, lock, printable, shutdown_signal, Command, Outcome, Output};

pub async fn run(out: &Output, options: ClientOptions, command: Command) -> Outcome {
    // Everything that can be checked without the broker is checked first.
    let prepared = match prepare(command) {
        Ok(prepared) => prepared,
        Err(message) => return out.usage(&message),
    };
    let client = match connect(out, options).await {
        Ok(client) => std::sync::Arc::new(client),
        Err(outcome) => return outcome,
    };
    let outcome = match prepared {
        Prepared::Single { request, fencing_token, output } => {
            let reply = client.request(&request, fencing_token.as_ref()).await;
            report(out, &request, reply, output)
        }
        Prepared::Keys(pattern) => list_keys(out, &client, pattern).await,
        Prepared::Watch { keys, count } => watch(out, &client, keys, count).await,
        Prepared::Lock(args) => lock::run(out, &client, args).await,
        Prepared::Load(args) => load::run(out, client.clone(), args).await,
    };
    if let Ok(client) = std::sync::Arc::try_unwrap(client) {
        client.disconnect().await;
    }
    outcome
}

enum Prepared {
    Single { request: Request, fencing_token: Option<Hlc>, output: Option<std::path::PathBuf> },
    Keys(Vec<u8>),
    Watch { keys: Vec<Vec<u8>>, count: Option<u64> },
    Lock(lock::LockArgs),
    Load(load::LoadArgs),
}

fn key_bytes(key: OsString) -> Result<Vec<u8>, String> {
    let key = key.into_vec();
    if key.is_empty() {
        return Err("the key must not be empty".into());
    }
    Ok(key)
}

fn fencing(token: Option<String>) -> Result<Option<Hlc>, String> {
    token
        .map(|t| {
            t.parse::<Hlc>().map_err(|e| format!("--fencing-token {t:?} is not an HLC (<ms>:<counter>:<node>): {e}"))
        })
        .transpose()
}

fn prepare(command: Command) -> Result<Prepared, String> {
    Ok(match command {
        Command::Get { key, output } => {
            Prepared::Single { request: Request::Get(Get { key: key_bytes(key)? }), fencing_token: None, output }
        }
        Command::Set { key, value, nx, nex, px, fencing_token } => {
            let mut set = Set::new(key_bytes(key)?, value.read()?);
            set.condition = match (nx, nex) {
                (true, _) => SetCondition::NotExists,
                (_, true) => SetCondition::NotExistsOrEqual,
                _ => SetCondition::Always,
            };
            set.expiry_ms = px;
            Prepared::Single { request: Request::Set(set), fencing_token: fencing(fencing_token)?, output: None }
        }
        Command::Del { key, fencing_token } => Prepared::Single {
            request: Request::Del(Del { key: key_bytes(key)? }),
            fencing_token: fencing(fencing_token)?,
            output: None,
        },
        Command::Vdel { key, value, fencing_token } => Prepared::Single {
            request: Request::VDel(VDel { key: key_bytes(key)?, value: value.read()? }),
            fencing_token: fencing(fencing_token)?,
            output: None,
        },
        Command::Keys { pattern } => {
            if pattern.is_empty() {
                return Err("the pattern must not be empty".into());
            }
            Prepared::Keys(pattern.into_bytes())
        }
        Command::Watch { keys, count } => {
            Prepared::Watch { keys: keys.into_iter().map(key_bytes).collect::<Result<_, _>>()?, count }
        }
        Command::Lock(args) => {
            args.check()?;
            Prepared::Lock(args)
        }
        Command::Load(args) => {
            args.check()?;
            Prepared::Load(args)
        }
        Command::Cluster(_) | Command::Snapshot(_) => {
            unreachable!("cluster and snapshot commands do not use the broker")
        }
    })
}

fn version_text(version: &Option<Hlc>) -> String {
    version.as_ref().map_or_else(|| "(none)".to_string(), Hlc::to_string)
}

/// One answer to the user: text or JSON, and the exit code it implies.
pub(super) fn report(
    out: &Output,
    request: &Request,
    reply: Result<Reply, ClientError>,
    output: Option<std::path::PathBuf>,
) -> Outcome {
    let Reply { response, version } = match reply {
        Ok(reply) => reply,
        Err(e) => return out.error(&e.to_string()),
    };
    let version_json = version.as_ref().map_or(Value::Null, |v| Value::String(v.to_string()));
    match (request, response) {
        (_, Response::Error(error)) => {
            let message = format!("the server refused the request: {error}");
            if matches!(error, StoreError::FencingTokenLowerVersion) {
                out.not_applied(&message)
            } else {
                out.error(&message)
            }
        }
        (Request::Get(_), Response::Nil) => out.not_found("the key does not exist"),
        (Request::Get(_), Response::Value(value)) => {
            if let Some(path) = output {
                // The value goes to the file only.
                if let Err(e) = std::fs::write(&path, &value) {
                    return out.error(&format!("writing {}: {e}", path.display()));
                }
                if out.json {
                    let file = path.display().to_string();
                    out.print(
                        String::new,
                        || json!({"result": "found", "file": file, "bytes": value.len(), "version": version_json}),
                    );
                }
                return Outcome::Done;
            }
            if out.json {
                let mut document = Map::new();
                document.insert("result".into(), json!("found"));
                bytes_fields(&mut document, "value", &value);
                document.insert("version".into(), version_json);
                out.print(String::new, || Value::Object(document));
            } else {
                let mut stdout = std::io::stdout().lock();
                if stdout.write_all(&value).and_then(|()| stdout.flush()).is_err() {
                    return Outcome::Error;
                }
            }
            Outcome::Done
        }
        (Request::Set(_), Response::Ok) => {
            out.print(|| format!("OK {}", version_text(&version)), || json!({"result": "ok", "version": version_json}));
            Outcome::Done
        }
        (Request::Set(set), Response::Int(-1)) => out.not_applied(match set.condition {
            SetCondition::NotExists => "not applied: the key exists (NX)",
            _ => "not applied: the key holds another value (NEX)",
        }),
        (Request::Del(_) | Request::VDel(_), Response::Int(1)) => {
            out.print(
                || format!("deleted {}", version_text(&version)),
                || json!({"result": "deleted", "version": version_json}),
            );
            Outcome::Done
        }
        (Request::Del(_) | Request::VDel(_), Response::Int(0)) => out.not_found("the key does not exist"),
        (Request::VDel(_), Response::Int(-1)) => out.not_applied("not applied: the key holds another value"),
        (request, response) => out.error(&format!("unexpected reply {response:?} to {}", request.verb())),
    }
}

async fn list_keys(out: &Output, client: &Client, pattern: Vec<u8>) -> Outcome {
    let mut token = None;
    let mut all = Vec::new();
    loop {
        let request = Request::Scan(Scan { pattern: pattern.clone(), token: token.take() });
        let (keys, next) = match client.request(&request, None).await {
            Ok(Reply { response: Response::Keys { keys, token }, .. }) => (keys, token),
            Ok(Reply { response: Response::Error(e), .. }) => {
                return out.error(&format!("the server refused the request: {e}"))
            }
            Ok(Reply { response, .. }) => return out.error(&format!("unexpected reply {response:?} to SCAN")),
            Err(e) => return out.error(&e.to_string()),
        };
        if out.json {
            all.extend(keys.into_iter().map(|k| k.into_vec()));
        } else {
            let mut stdout = std::io::stdout().lock();
            for key in keys {
                let _ = stdout.write_all(&key).and_then(|()| stdout.write_all(b"\n"));
            }
            let _ = stdout.flush();
        }
        match next {
            Some(next) => token = Some(next),
            None => break,
        }
    }
    if out.json {
        let keys: Vec<Value> = all
            .iter()
            .map(|key| {
                let mut document = Map::new();
                bytes_fields(&mut document, "key", key);
                Value::Object(document)
            })
            .collect();
        out.print(String::new, || json!({"result": "ok", "keys": keys}));
    }
    Outcome::Done
}

async fn keynotify(client: &Client, key: &[u8], stop: bool) -> Result<(), String> {
    let request = Request::KeyNotify(KeyNotify { key: key.to_vec(), stop });
    match client.request(&request, None).await {
        Ok(Reply { response: Response::Ok | Response::Int(0), .. }) => Ok(()),
        Ok(Reply { response, .. }) => Err(format!("KEYNOTIFY {}: unexpected reply {response:?}", printable(key))),
        Err(e) => Err(format!("KEYNOTIFY {}: {e}", printable(key))),
    }
}

async fn watch(out: &Output, client: &Client, keys: Vec<Vec<u8>>, count: Option<u64>) -> Outcome {
    for key in &keys {
        if let Err(message) = keynotify(client, key, false).await {
            return out.error(&message);
        }
    }
    if !out.json {
        eprintln!("watching {} key(s); Ctrl-C to stop", keys.len());
    }
    let mut seen = 0u64;
    let mut outcome = Outcome::Done;
    let stop = shutdown_signal();
    tokio::pin!(stop);
    while count.is_none_or(|count| seen < count) {
        let notification = tokio::select! {
            notification = client.next_notification() => notification,
            () = &mut stop => break,
        };
        let Some(notification) = notification else {
            outcome = out.error("the broker connection ended");
            break;
        };
        seen += 1;
        let version = notification.version.as_ref().map_or(Value::Null, |v| Value::String(v.to_string()));
        let (event, value) = match &notification.notification {
            Notification::Set { value } => ("set", Some(value)),
            Notification::Delete => ("delete", None),
        };
        out.print(
            || {
                let value = value.map(|v| format!(" {}", printable(v))).unwrap_or_default();
                format!(
                    "{} {}{value} {}",
                    event.to_uppercase(),
                    printable(&notification.key),
                    version_text(&notification.version)
                )
            },
            || {
                let mut document = Map::new();
                document.insert("event".into(), json!(event));
                bytes_fields(&mut document, "key", &notification.key);
                if let Some(value) = value {
                    bytes_fields(&mut document, "value", value);
                }
                document.insert("version".into(), version);
                Value::Object(document)
            },
        );
    }
    for key in &keys {
        if let Err(message) = keynotify(client, key, true).await {
            eprintln!("statestore-cli: {message}");
        }
    }
    outcome
}
