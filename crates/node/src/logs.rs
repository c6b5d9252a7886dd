//! The node's log lines: `--log` picks what is logged, `--log-format` how; and openraft's
//! warnings and errors are kept to the first of each kind per [`LIBRARY_REPEAT_WINDOW`].
//!
//! openraft logs every failed request to a peer, several lines each, and while a peer is down
//! its replication retries every heartbeat interval: about eighty lines a second for one peer,
//! for as long as the peer stays down. Which peer is down and for how long is told by the
//! node's own lines (`statestore_raft::peer_health`); of openraft's, one per kind in a while says
//! what openraft sees without filling the disk.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::callsite::Identifier;
use tracing::subscriber::Interest;
use tracing::{Level, Metadata};
use tracing_subscriber::layer::{Context, Filter, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// How long after one of openraft's warning or error lines the same line (the same place in
/// openraft's code) is dropped.
pub const LIBRARY_REPEAT_WINDOW: Duration = Duration::from_secs(60);

/// Sets the process's logger: lines `filter` lets through, as JSON objects or plain text (in
/// colour only on a terminal, and never with `NO_COLOR` set), to stderr.
pub fn init(filter: EnvFilter, json: bool) {
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let repeats = RepeatLimit::new("openraft", LIBRARY_REPEAT_WINDOW);
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(colour);
    if json {
        let lines = lines.json().with_current_span(false).with_filter(repeats);
        tracing_subscriber::registry().with(filter).with(lines).init();
    } else {
        tracing_subscriber::registry().with(filter).with(lines.with_filter(repeats)).init();
    }
}

/// Lets through one warning or error line of each place in `target`'s code per `window`;
/// every other line passes.
pub struct RepeatLimit {
    target: &'static str,
    window: Duration,
    last: Mutex<HashMap<Identifier, Instant>>,
}

impl RepeatLimit {
    pub fn new(target: &'static str, window: Duration) -> RepeatLimit {
        RepeatLimit { target, window, last: Mutex::default() }
    }

    fn limits(&self, metadata: &Metadata<'_>) -> bool {
        metadata.is_event() && *metadata.level() <= Level::WARN && metadata.target().starts_with(self.target)
    }

    /// Whether a line of `metadata`'s place, seen `now`, goes out.
    pub fn admits(&self, metadata: &Metadata<'_>, now: Instant) -> bool {
        if !self.limits(metadata) {
            return true;
        }
        let mut last = self.last.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match last.get(&metadata.callsite()) {
            Some(at) if now.duration_since(*at) < self.window => false,
            _ => {
                last.insert(metadata.callsite(), now);
                true
            }
        }
    }
}

impl<S> Filter<S> for RepeatLimit {
    fn enabled(&self, metadata: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        self.admits(metadata, Instant::now())
    }

    fn callsite_enabled(&self, metadata: &'static Metadata<'static>) -> Interest {
        if self.limits(metadata) {
            Interest::sometimes()
        } else {
            Interest::always()
        }
    }
}
