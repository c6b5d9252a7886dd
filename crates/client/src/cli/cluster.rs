//! `cluster ...`: status, members, readiness and membership changes over the nodes' HTTP API.
//! Membership changes go to the leader: a node that is not the leader answers 421 with the
//! leader's address, and the request is sent there.

use std::time::Duration;

use clap::Subcommand;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use statestore_api::body::{
    AddLearner, ClusterStatus, ErrorBody, LeadershipMoved, LearnerAdded, MembershipChange, MoveLeadership,
};
use statestore_api::{routes, TlsConfig};

use super::{Outcome, Output};

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
    /// Move leadership to another voter, every node running on (e.g. before maintenance of the
    /// leader's machine). Requests wait meanwhile instead of failing.
    #[command(after_help = "Example:\n  statestore-cli cluster leader --to 2")]
    Leader {
        /// The voter to lead next; without it, any voter that has caught up.
        #[arg(long, value_name = "ID")]
        to: Option<u64>,
    },
}

/// The nodes' HTTP API, as the `cluster` and `snapshot` commands reach it.
pub(super) struct Http {
    client: reqwest::Client,
    endpoints: Vec<String>,
}

/// An HTTP answer: its status and body.
pub(super) struct Answer {
    pub status: u16,
    text: String,
}

impl Answer {
    pub(super) fn new(status: u16, text: String) -> Answer {
        Answer { status, text }
    }

    /// The body as the API's type for it.
    pub(super) fn body<T: DeserializeOwned>(&self) -> Result<T, String> {
        serde_json::from_str(&self.text)
            .map_err(|e| format!("an answer this CLI does not understand ({e}): {}", self.text))
    }

    /// An error answer's body, when it is one.
    fn error_body(&self) -> Option<ErrorBody> {
        serde_json::from_str(&self.text).ok()
    }

    /// What an error answer says: its status and message.
    pub(super) fn error(&self) -> String {
        let message = self.error_body().map_or_else(|| self.text.clone(), |body| body.message);
        format!("HTTP {}: {message}", self.status)
    }
}

/// What a request carries.
#[derive(Clone)]
pub(super) enum Payload {
    None,
    Json(Value),
    Bytes(Vec<u8>),
}

impl Payload {
    fn json(body: &impl Serialize) -> Payload {
        Payload::Json(serde_json::to_value(body).expect("API bodies serialize"))
    }
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
        Ok(Answer::new(status, text))
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
        let (mut endpoint, _) = self.first(routes::HEALTH).await?;
        for _ in 0..3 {
            let answer = self.call(&endpoint, reqwest::Method::POST, path, body.clone()).await?;
            if answer.status != 421 {
                return Ok(answer);
            }
            match answer.error_body().and_then(|body| body.leader_address) {
                Some(leader) => endpoint = leader,
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
            let body = AddLearner { id, address, timeout_ms: Some(catch_up * 1000) };
            add_learner(out, &http, &body).await
        }
        ClusterCommand::Promote { ids } => {
            change_members(out, &http, &MembershipChange { promote: ids.into_iter().collect(), ..Default::default() })
                .await
        }
        ClusterCommand::Remove { ids } => {
            change_members(out, &http, &MembershipChange { remove: ids.into_iter().collect(), ..Default::default() })
                .await
        }
        ClusterCommand::Leader { to } => move_leadership(out, &http, &MoveLeadership { to }).await,
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
        match statestore_api::secret::ClusterSecret::from_env() {
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
            match statestore_api::tls::client_config(tls) {
                Ok(config) => builder = builder.use_preconfigured_tls(config),
                Err(e) => return Err(Setup::Usage(format!("TLS to the endpoints: {e:#}"))),
            }
        }
        let client = builder.build().map_err(|e| Setup::Error(format!("HTTP client: {e}")))?;
        Ok(Http { client, endpoints })
    }
}

/// One endpoint's row of `cluster status`.
#[derive(Serialize)]
struct StatusRow {
    endpoint: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<ClusterStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ready: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    not_ready_reason: Option<String>,
}

async fn status(out: &Output, http: &Http) -> Outcome {
    let mut rows = Vec::new();
    for endpoint in &http.endpoints {
        let view = http.call(endpoint, reqwest::Method::GET, routes::CLUSTER, Payload::None).await;
        let ready = http.call(endpoint, reqwest::Method::GET, routes::READY, Payload::None).await;
        let mut row =
            StatusRow { endpoint: endpoint.clone(), error: None, status: None, ready: None, not_ready_reason: None };
        match (view, ready) {
            (Err(e), _) | (Ok(_), Err(e)) => row.error = Some(e),
            (Ok(view), Ok(_)) if view.status != 200 => row.error = Some(view.error()),
            (Ok(view), Ok(ready)) => match view.body::<ClusterStatus>() {
                Err(e) => row.error = Some(e),
                Ok(status) => {
                    row.status = Some(status);
                    row.ready = Some(ready.status == 200);
                    row.not_ready_reason = (ready.status != 200)
                        .then(|| ready.error_body().map_or_else(|| ready.text.clone(), |body| body.message));
                }
            },
        }
        rows.push(row);
    }
    let reachable = rows.iter().filter(|row| row.status.is_some()).count();
    out.print(
        || {
            let mut text = format!(
                "{:<28} {:>4} {:<10} {:>6} {:>7} {:>10} {:>10} {:>10}  ready",
                "ENDPOINT", "ID", "ROLE", "TERM", "LEADER", "LAST LOG", "COMMITTED", "APPLIED"
            );
            for row in &rows {
                let endpoint = &row.endpoint;
                let Some(view) = &row.status else {
                    text.push_str(&format!("\n{endpoint:<28} unreachable: {}", row.error.as_deref().unwrap_or("")));
                    continue;
                };
                let ready = match &row.not_ready_reason {
                    None => "yes".to_string(),
                    Some(reason) => format!("no: {reason}"),
                };
                text.push_str(&format!(
                    "\n{endpoint:<28} {:>4} {:<10} {:>6} {:>7} {:>10} {:>10} {:>10}  {ready}",
                    view.id,
                    view.role,
                    view.term,
                    view.leader.as_ref().map_or("-".to_string(), |l| l.id.to_string()),
                    view.last_log_index,
                    view.committed_index,
                    view.applied_index,
                ));
                if view.restoring {
                    text.push_str(&format!(
                        "\n{:<28} restoring: runs on a restored backup and waits for the new cluster's first leader \
                         to name it",
                        ""
                    ));
                }
                if !view.not_answering_ms.is_empty() {
                    let peers: Vec<String> = view
                        .not_answering_ms
                        .iter()
                        .map(|(peer, ms)| format!("node {peer} for {:.1} s", *ms as f64 / 1000.0))
                        .collect();
                    text.push_str(&format!("\n{:<28} not answering it: {}", "", peers.join(", ")));
                }
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
    let (_, answer) = match http.first(routes::CLUSTER).await {
        Ok(found) => found,
        Err(e) => return out.error(&e),
    };
    if answer.status != 200 {
        return out.error(&answer.error());
    }
    let view: ClusterStatus = match answer.body() {
        Ok(view) => view,
        Err(e) => return out.error(&e),
    };
    let leader = view.leader.as_ref().map(|l| l.id);
    out.print(
        || {
            let mut text = format!("{:>4}  {:<8}  ADDRESS", "ID", "ROLE");
            for (kind, members) in [("voter", &view.voters), ("learner", &view.learners)] {
                for member in members {
                    let role = if Some(member.id) == leader { "leader" } else { kind };
                    text.push_str(&format!("\n{:>4}  {role:<8}  {}", member.id, member.address));
                }
            }
            text
        },
        || json!({"result": "ok", "leader": leader, "voters": view.voters, "learners": view.learners, "term": view.term}),
    );
    Outcome::Done
}

async fn ready(out: &Output, http: &Http) -> Outcome {
    let mut all_ready = true;
    let mut rows = Vec::new();
    for endpoint in &http.endpoints {
        let (ready, reason) = match http.call(endpoint, reqwest::Method::GET, routes::READY, Payload::None).await {
            Ok(answer) if answer.status == 200 => (true, None),
            Ok(answer) => (false, Some(answer.error())),
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

async fn add_learner(out: &Output, http: &Http, request: &AddLearner) -> Outcome {
    let answer = match http.to_leader(routes::LEARNERS, Payload::json(request)).await {
        Ok(answer) => answer,
        Err(e) => return out.error(&e),
    };
    if answer.status != 200 && answer.status != 202 {
        return out.error(&answer.error());
    }
    let added: LearnerAdded = match answer.body() {
        Ok(added) => added,
        Err(e) => return out.error(&e),
    };
    if !added.caught_up {
        return out.not_applied("the learner was added but has not caught up yet; it keeps catching up");
    }
    out.print(|| "done".to_string(), || json!({"result": "ok", "answer": added}));
    Outcome::Done
}

async fn change_members(out: &Output, http: &Http, request: &MembershipChange) -> Outcome {
    let answer = match http.to_leader(routes::MEMBERS, Payload::json(request)).await {
        Ok(answer) => answer,
        Err(e) => return out.error(&e),
    };
    if answer.status != 200 {
        return out.error(&answer.error());
    }
    match answer.body::<ClusterStatus>() {
        Ok(status) => {
            out.print(|| "done".to_string(), || json!({"result": "ok", "answer": status}));
            Outcome::Done
        }
        Err(e) => out.error(&e),
    }
}

async fn move_leadership(out: &Output, http: &Http, request: &MoveLeadership) -> Outcome {
    let answer = match http.to_leader(routes::LEADER, Payload::json(request)).await {
        Ok(answer) => answer,
        Err(e) => return out.error(&e),
    };
    if answer.status != 200 {
        return out.error(&answer.error());
    }
    match answer.body::<LeadershipMoved>() {
        Ok(moved) => {
            out.print(
                || format!("node {} leads (was node {}, moved in {} ms)", moved.leader, moved.from, moved.millis),
                || json!({"result": "ok", "answer": moved}),
            );
            Outcome::Done
        }
        Err(e) => out.error(&e),
    }
}
