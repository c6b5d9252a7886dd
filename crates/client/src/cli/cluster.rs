//! `cluster ...`: status, members, readiness and membership changes over the nodes' HTTP API.
//! Membership changes go to the leader: a node that is not the leader answers 421 with the
//! leader's address, and the request is sent there.

use std::time::Duration;

use clap::Subcommand;
use serde_json::{json, Value};

use super::{Outcome, Output};
use statestore_client::tls::TlsConfig;

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Every endpoint's view: role, term, leader, log indexes, readiness.
    #[command(
        after_help = "Example:\n  statestore-cli --endpoint http://10.0.0.1:7400,http://10.0.0.2:7400 cluster status"
    )]
    Status,
    /// The voters and learners, and which one leads.
    Members,
    /// Exit 0 when every endpoint is ready (a member that knows a leader, caught up, connected
    /// to the broker); print the reason of each one that is not.
    Ready,
    /// Add a node as a non-voting learner and wait until it has caught up.
    #[command(
        after_help = "Example (then `cluster promote 4`):\n  statestore-cli cluster add-learner 4 http://10.0.0.4:7400"
    )]
    AddLearner {
        id: u64,
        /// The URL the other nodes reach the new node at, e.g. `http://10.0.0.4:7400`.
        address: String,
        /// How long the leader waits for the learner to catch up, in seconds.
        #[arg(long, value_name = "SECONDS", default_value_t = 30)]
        catch_up: u64,
    },
    /// Make learners voters.
    Promote {
        #[arg(required = true)]
        ids: Vec<u64>,
    },
    /// Remove voters or learners from the cluster.
    #[command(after_help = "Example:\n  statestore-cli cluster remove 3")]
    Remove {
        #[arg(required = true)]
        ids: Vec<u64>,
    },
}

/// The nodes' HTTP API, as the `cluster` and `snapshot` commands reach it.
pub(super) struct Http {
    client: reqwest::Client,
    endpoints: Vec<String>,
}

/// An HTTP answer: status and JSON body (or the text when it is not JSON).
pub(super) struct Answer {
    pub status: u16,
    pub body: Value,
}

/// What a request carries.
#[derive(Clone)]
pub(super) enum Payload {
    None,
    Json(Value),
    Bytes(Vec<u8>),
}

impl Http {
    pub(super) async fn call(
        &self,
        endpoint: &str,
        method: reqwest::Method,
        path: &str,
        body: Payload,
    ) -> Result<Answer, String> {
        let url = format!("{}{path}", endpoint.trim_end_matches('/'));
        let mut request = self.client.request(method, &url);
        match body {
            Payload::None => {}
            Payload::Json(body) => request = request.json(&body),
            Payload::Bytes(body) => request = request.body(body),
        }
        let response = request.send().await.map_err(|e| format!("{url}: {}", error_chain(&e)))?;
        let status = response.status().as_u16();
        let text = response.text().await.map_err(|e| format!("{url}: {e}"))?;
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok(Answer { status, body })
    }

    /// `GET path` of the first endpoint that answers, as a response to read on.
    pub(super) async fn first_response(&self, path: &str) -> Result<reqwest::Response, String> {
        let mut errors = Vec::new();
        for endpoint in &self.endpoints {
            let url = format!("{}{path}", endpoint.trim_end_matches('/'));
            match self.client.get(&url).send().await {
                Ok(response) => return Ok(response),
                Err(e) => errors.push(format!("{url}: {}", error_chain(&e))),
            }
        }
        Err(format!("no endpoint answered: {}", errors.join("; ")))
    }

    /// The first endpoint that answers `GET path`.
    async fn first(&self, path: &str) -> Result<(String, Answer), String> {
        let mut errors = Vec::new();
        for endpoint in &self.endpoints {
            match self.call(endpoint, reqwest::Method::GET, path, Payload::None).await {
                Ok(answer) => return Ok((endpoint.clone(), answer)),
                Err(e) => errors.push(e),
            }
        }
        Err(format!("no endpoint answered: {}", errors.join("; ")))
    }

    /// Sends a change to the leader (any node forwards it there), following one or two 421
    /// redirects of a node that could not.
    pub(super) async fn to_leader(&self, path: &str, body: Payload) -> Result<Answer, String> {
        let (mut endpoint, _) = self.first("/health").await?;
        for _ in 0..3 {
            let answer = self.call(&endpoint, reqwest::Method::POST, path, body.clone()).await?;
            if answer.status != 421 {
                return Ok(answer);
            }
            match answer.body.get("leader_address").and_then(Value::as_str) {
                Some(leader) => endpoint = leader.to_string(),
                None => return Err("no leader is known; try again after an election".into()),
            }
        }
        Err("the leader kept moving; try again".into())
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

fn api_error(answer: &Answer) -> String {
    let message = answer.body.get("message").and_then(Value::as_str).map(str::to_string);
    format!("HTTP {}: {}", answer.status, message.unwrap_or_else(|| answer.body.to_string()))
}

/// Runs `command` against `endpoints`; `tls` is how https:// endpoints are reached.
pub async fn run(
    out: &Output,
    endpoints: &[String],
    tls: &TlsConfig,
    timeout: Duration,
    command: ClusterCommand,
) -> Outcome {
    // Adding a learner waits for it to catch up: allow that long, and a little more.
    let wait = match &command {
        ClusterCommand::AddLearner { catch_up, .. } => timeout.max(Duration::from_secs(catch_up + 5)),
        _ => timeout,
    };
    let http = match Http::new(endpoints, tls, wait) {
        Ok(http) => http,
        Err(failure) => return failure.report(out),
    };
    match command {
        ClusterCommand::Status => status(out, &http).await,
        ClusterCommand::Members => members(out, &http).await,
        ClusterCommand::Ready => ready(out, &http).await,
        ClusterCommand::AddLearner { id, address, catch_up } => {
            let body = json!({"id": id, "address": address, "timeout_ms": catch_up * 1000});
            change(out, &http, "/cluster/learners", &body).await
        }
        ClusterCommand::Promote { ids } => change(out, &http, "/cluster/members", &json!({"promote": ids})).await,
        ClusterCommand::Remove { ids } => change(out, &http, "/cluster/members", &json!({"remove": ids})).await,
    }
}

/// Why the HTTP client could not be set up: the user's mistake, or not.
pub(super) enum Setup {
    Usage(String),
    Error(String),
}

impl Setup {
    pub(super) fn report(self, out: &Output) -> Outcome {
        match self {
            Setup::Usage(message) => out.usage(&message),
            Setup::Error(message) => out.error(&message),
        }
    }
}

impl Http {
    /// A client of `endpoints` whose requests give up after `wait`, sending the cluster secret
    /// from the environment when it is set.
    pub(super) fn new(endpoints: &[String], tls: &TlsConfig, wait: Duration) -> Result<Http, Setup> {
        let endpoints: Vec<String> = endpoints.iter().map(|e| e.trim().to_string()).filter(|e| !e.is_empty()).collect();
        if endpoints.is_empty() {
            return Err(Setup::Usage("give at least one --endpoint".into()));
        }
        if let Some(bad) = endpoints.iter().find(|e| !e.starts_with("http://") && !e.starts_with("https://")) {
            return Err(Setup::Usage(format!("{bad:?} is not an http:// or https:// URL")));
        }
        let mut headers = reqwest::header::HeaderMap::new();
        match statestore_client::secret::ClusterSecret::from_env() {
            Ok(Some(secret)) => match reqwest::header::HeaderValue::from_str(&secret.authorization()) {
                Ok(mut value) => {
                    value.set_sensitive(true);
                    headers.insert(reqwest::header::AUTHORIZATION, value);
                }
                Err(e) => return Err(Setup::Error(format!("the cluster secret: {e}"))),
            },
            Ok(None) => {}
            Err(e) => return Err(Setup::Usage(e)),
        }
        let mut builder =
            reqwest::Client::builder().default_headers(headers).timeout(wait).connect_timeout(Duration::from_secs(3));
        if endpoints.iter().any(|e| e.starts_with("https://")) {
            match statestore_client::tls::client_config(tls) {
                Ok(config) => builder = builder.use_preconfigured_tls(config),
                Err(e) => return Err(Setup::Usage(format!("TLS to the endpoints: {e:#}"))),
            }
        }
        let client = builder.build().map_err(|e| Setup::Error(format!("HTTP client: {e}")))?;
        Ok(Http { client, endpoints })
    }
}

fn u64_field(view: &Value, name: &str) -> u64 {
    view.get(name).and_then(Value::as_u64).unwrap_or(0)
}

async fn status(out: &Output, http: &Http) -> Outcome {
    let mut rows = Vec::new();
    let mut reachable = 0;
    for endpoint in &http.endpoints {
        let view = http.call(endpoint, reqwest::Method::GET, "/cluster", Payload::None).await;
        let ready = http.call(endpoint, reqwest::Method::GET, "/ready", Payload::None).await;
        let row = match (view, ready) {
            (Err(e), _) | (Ok(_), Err(e)) => json!({"endpoint": endpoint, "error": e}),
            (Ok(view), Ok(_)) if view.status != 200 => json!({"endpoint": endpoint, "error": api_error(&view)}),
            (Ok(view), Ok(ready)) => {
                reachable += 1;
                let reason = (ready.status != 200).then(|| ready.body.get("message").cloned().unwrap_or(Value::Null));
                json!({"endpoint": endpoint, "status": view.body, "ready": ready.status == 200, "not_ready_reason": reason})
            }
        };
        rows.push(row);
    }
    out.print(
        || {
            let mut text = format!(
                "{:<28} {:>4} {:<10} {:>6} {:>7} {:>10} {:>10} {:>10}  ready",
                "ENDPOINT", "ID", "ROLE", "TERM", "LEADER", "LAST LOG", "COMMITTED", "APPLIED"
            );
            for row in &rows {
                let endpoint = row["endpoint"].as_str().unwrap_or("");
                if let Some(error) = row.get("error") {
                    text.push_str(&format!("\n{endpoint:<28} unreachable: {}", error.as_str().unwrap_or("")));
                    continue;
                }
                let view = &row["status"];
                let leader = view.get("leader").and_then(|l| l.get("id")).and_then(Value::as_u64);
                let ready = match row["not_ready_reason"].as_str() {
                    None => "yes".to_string(),
                    Some(reason) => format!("no: {reason}"),
                };
                text.push_str(&format!(
                    "\n{endpoint:<28} {:>4} {:<10} {:>6} {:>7} {:>10} {:>10} {:>10}  {ready}",
                    u64_field(view, "id"),
                    view.get("role").and_then(Value::as_str).unwrap_or("?"),
                    u64_field(view, "term"),
                    leader.map_or("-".to_string(), |l| l.to_string()),
                    u64_field(view, "last_log_index"),
                    u64_field(view, "committed_index"),
                    u64_field(view, "applied_index"),
                ));
            }
            text
        },
        || json!({"result": if reachable > 0 { "ok" } else { "error" }, "endpoints": rows}),
    );
    if reachable == 0 {
        if !out.json {
            eprintln!("statestore-cli: no endpoint answered");
        }
        return Outcome::Error;
    }
    Outcome::Done
}

async fn members(out: &Output, http: &Http) -> Outcome {
    let (_, answer) = match http.first("/cluster").await {
        Ok(found) => found,
        Err(e) => return out.error(&e),
    };
    if answer.status != 200 {
        return out.error(&api_error(&answer));
    }
    let view = answer.body;
    let leader = view.get("leader").and_then(|l| l.get("id")).and_then(Value::as_u64);
    let list = |name: &str| view.get(name).and_then(Value::as_array).cloned().unwrap_or_default();
    let (voters, learners) = (list("voters"), list("learners"));
    out.print(
        || {
            let mut text = format!("{:>4}  {:<8}  ADDRESS", "ID", "ROLE");
            for (kind, members) in [("voter", &voters), ("learner", &learners)] {
                for member in members {
                    let id = u64_field(member, "id");
                    let role = if Some(id) == leader { "leader" } else { kind };
                    let address = member.get("address").and_then(Value::as_str).unwrap_or("");
                    text.push_str(&format!("\n{id:>4}  {role:<8}  {address}"));
                }
            }
            text
        },
        || json!({"result": "ok", "leader": leader, "voters": voters, "learners": learners, "term": view.get("term")}),
    );
    Outcome::Done
}

async fn ready(out: &Output, http: &Http) -> Outcome {
    let mut all_ready = true;
    let mut rows = Vec::new();
    for endpoint in &http.endpoints {
        let (ready, reason) = match http.call(endpoint, reqwest::Method::GET, "/ready", Payload::None).await {
            Ok(answer) if answer.status == 200 => (true, None),
            Ok(answer) => (false, Some(api_error(&answer))),
            Err(e) => (false, Some(e)),
        };
        all_ready &= ready;
        rows.push(json!({"endpoint": endpoint, "ready": ready, "reason": reason}));
    }
    out.print(
        || {
            rows.iter()
                .map(|row| match row["reason"].as_str() {
                    None => format!("{}: ready", row["endpoint"].as_str().unwrap_or("")),
                    Some(reason) => format!("{}: not ready: {reason}", row["endpoint"].as_str().unwrap_or("")),
                })
                .collect::<Vec<_>>()
                .join("\n")
        },
        || json!({"result": if all_ready { "ready" } else { "not_ready" }, "endpoints": rows}),
    );
    if all_ready {
        Outcome::Done
    } else {
        Outcome::Error
    }
}

async fn change(out: &Output, http: &Http, path: &str, body: &Value) -> Outcome {
    let answer = match http.to_leader(path, Payload::Json(body.clone())).await {
        Ok(answer) => answer,
        Err(e) => return out.error(&e),
    };
    match answer.status {
        200 => {
            out.print(|| "done".to_string(), || json!({"result": "ok", "answer": answer.body}));
            Outcome::Done
        }
        202 => out.not_applied("the learner was added but has not caught up yet; it keeps catching up"),
        _ => out.error(&api_error(&answer)),
    }
}
