//! The state machine against a small reference model over random command sequences, including
//! expiry, fencing, conditions, notifications, dedup redeliveries, quotas and clock moves.
//! The model is written for clarity: maps and sets, no storage, no indexes.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use proptest::prelude::*;
use statestore_protocol::{
    Command, Del, Get, Hlc, KeyNotify, Notification, Request, Response, Set, SetCondition, StoreError, VDel,
};
use statestore_statemachine::{
    Applied, ClientRequest, Config, Entry, MemStorage, Operation, Reply, RequestIdentity, StateMachine,
};

const MAX_KEYS: u64 = 4;
const MAX_BYTES: u64 = 24;

#[derive(Debug, Clone)]
enum Token {
    None,
    /// The newest version the model has handed out.
    Latest,
    /// The version before that, often lower than a key's token.
    Previous,
    Epoch,
}

#[derive(Debug, Clone)]
enum Clock {
    Now,
    Ahead(u64),
}

#[derive(Debug, Clone)]
enum Step {
    Request { client: usize, command: Command, token: Token, clock: Clock },
    Redeliver,
    Expire { key: usize, stale: bool },
    Drop { client: usize },
    Confirm,
    Advance(u64),
    ClockBack(u64),
}

const KEYS: [&str; 3] = ["k0", "k1", "k2"];
const VALUES: [&str; 3] = ["", "a", "bbbbbbbbbb"];
const CLIENTS: [&str; 2] = ["alice", "bob"];

fn command() -> impl Strategy<Value = Command> {
    let key = (0..KEYS.len()).prop_map(|k| KEYS[k].as_bytes().to_vec());
    let value = (0..VALUES.len()).prop_map(|v| VALUES[v].as_bytes().to_vec());
    let condition =
        prop_oneof![Just(SetCondition::Always), Just(SetCondition::NotExists), Just(SetCondition::NotExistsOrEqual)];
    let px = prop_oneof![3 => Just(None), 1 => Just(Some(0u64)), 2 => (1u64..300).prop_map(Some)];
    prop_oneof![
        4 => (key.clone(), value.clone(), condition, px)
            .prop_map(|(key, value, condition, expiry_ms)| Command::Set(Set { key, value, condition, expiry_ms })),
        2 => key.clone().prop_map(|key| Command::Get(Get { key })),
        2 => key.clone().prop_map(|key| Command::Del(Del { key })),
        2 => (key.clone(), value).prop_map(|(key, value)| Command::VDel(VDel { key, value })),
        2 => (key, any::<bool>()).prop_map(|(key, stop)| Command::KeyNotify(KeyNotify { key, stop })),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    let token = prop_oneof![4 => Just(Token::None), 2 => Just(Token::Latest), 1 => Just(Token::Previous), 1 => Just(Token::Epoch)];
    let clock = prop_oneof![8 => Just(Clock::Now), 1 => (0u64..60_000).prop_map(Clock::Ahead), 1 => (60_001u64..70_000).prop_map(Clock::Ahead)];
    prop_oneof![
        12 => (0..CLIENTS.len(), command(), token, clock)
            .prop_map(|(client, command, token, clock)| Step::Request { client, command, token, clock }),
        2 => Just(Step::Redeliver),
        2 => (0..KEYS.len(), any::<bool>()).prop_map(|(key, stale)| Step::Expire { key, stale }),
        1 => (0..CLIENTS.len()).prop_map(|client| Step::Drop { client }),
        1 => Just(Step::Confirm),
        4 => prop_oneof![0u64..5, 50u64..400, 60_000u64..80_000].prop_map(Step::Advance),
        1 => (1u64..500).prop_map(Step::ClockBack),
    ]
}

#[derive(Debug, Clone)]
struct KeyState {
    value: Vec<u8>,
    version: Hlc,
    token: Option<Hlc>,
    expires_at: Option<u64>,
}

/// (client, key, notification, version)
type Note = (String, Vec<u8>, Notification, Hlc);

#[derive(Default)]
struct Model {
    keys: BTreeMap<Vec<u8>, KeyState>,
    watchers: BTreeSet<(Vec<u8>, String)>,
    last_version: Option<Hlc>,
    clock: u64,
    dedup: HashMap<RequestIdentity, (Reply, u64)>,
    outbox: BTreeMap<u64, Note>,
    /// The sequence numbers of each change's notifications, by the last of them: the outbox
    /// drops a change only once all of them are confirmed.
    changes: BTreeMap<u64, Vec<u64>>,
    next_seq: u64,
}

impl Model {
    fn version(&mut self, request: Option<&Hlc>) -> Hlc {
        let last = self.last_version.clone().unwrap_or(Hlc::new(0, 0, "statestore"));
        let next = last.successor(request, self.clock);
        self.last_version = Some(next.clone());
        next
    }

    fn notify(&mut self, key: &[u8], notification: Notification, version: &Hlc, out: &mut Vec<Note>) {
        let clients: Vec<String> = self.watchers.iter().filter(|(k, _)| k == key).map(|(_, c)| c.clone()).collect();
        let mut seqs = Vec::new();
        for client in clients {
            let note = (client, key.to_vec(), notification.clone(), version.clone());
            self.outbox.insert(self.next_seq, note.clone());
            seqs.push(self.next_seq);
            self.next_seq += 1;
            out.push(note);
        }
        if let Some(&last) = seqs.last() {
            self.changes.insert(last, seqs);
        }
    }

    fn live(&mut self, key: &[u8], out: &mut Vec<Note>) -> Option<KeyState> {
        let state = self.keys.get(key)?.clone();
        if state.expires_at.is_some_and(|d| self.clock >= d) {
            self.keys.remove(key);
            let v = self.version(None);
            self.notify(key, Notification::Delete, &v, out);
            return None;
        }
        Some(state)
    }

    fn usage(&self) -> (u64, u64) {
        (self.keys.len() as u64, self.keys.iter().map(|(k, s)| (k.len() + s.value.len()) as u64).sum())
    }

    fn fence(state: &KeyState, ft: Option<&Hlc>) -> Result<(), StoreError> {
        match (&state.token, ft) {
            (Some(_), None) => Err(StoreError::FencingTokenRequired),
            (Some(t), Some(f)) if f < t => Err(StoreError::FencingTokenLowerVersion),
            _ => Ok(()),
        }
    }

    fn execute(&mut self, client: &str, request: &Request, out: &mut Vec<Note>) -> Result<Reply, StoreError> {
        if request.timestamp.as_ref().is_some_and(|t| t.timestamp > self.clock + 60_000) {
            return Err(StoreError::TimestampSkew);
        }
        if request.fencing_token.as_ref().is_some_and(|t| t.timestamp > self.clock + 60_000) {
            return Err(StoreError::FencingTokenSkew);
        }
        let ts = request.timestamp.as_ref();
        let ft = request.fencing_token.as_ref();
        match &request.command {
            Command::Set(set) => {
                let current = self.live(&set.key, out);
                if let Some(current) = &current {
                    Self::fence(current, ft)?;
                    let refused = match set.condition {
                        SetCondition::Always => false,
                        SetCondition::NotExists => true,
                        SetCondition::NotExistsOrEqual => current.value != set.value,
                    };
                    if refused {
                        return Ok(Reply::new(Response::Int(-1), Some(current.version.clone())));
                    }
                }
                let (keys, bytes) = self.usage();
                let old = current.as_ref().map_or(0, |c| (set.key.len() + c.value.len()) as u64);
                let new = (set.key.len() + set.value.len()) as u64;
                if current.is_none() && keys >= MAX_KEYS {
                    return Err(StoreError::QuotaExceeded);
                }
                if new > old && bytes - old + new > MAX_BYTES {
                    return Err(StoreError::QuotaExceeded);
                }
                let version = self.version(ts);
                let token = match (current.as_ref().and_then(|c| c.token.clone()), ft) {
                    (Some(t), Some(f)) => Some(if *f > t { f.clone() } else { t }),
                    (Some(t), None) => Some(t),
                    (None, f) => f.cloned(),
                };
                let expires_at = set.expiry_ms.map(|ms| self.clock + ms);
                self.keys.insert(
                    set.key.clone(),
                    KeyState { value: set.value.clone(), version: version.clone(), token, expires_at },
                );
                self.notify(&set.key, Notification::Set { value: set.value.clone().into() }, &version, out);
                Ok(Reply::new(Response::Ok, Some(version)))
            }
            Command::Get(get) => {
                let state = self.keys.get(&get.key).filter(|s| s.expires_at.is_none_or(|d| self.clock < d));
                Ok(match state {
                    Some(s) => Reply::new(Response::Value(s.value.clone()), Some(s.version.clone())),
                    None => Reply::new(Response::Nil, None),
                })
            }
            Command::Del(Del { key }) | Command::VDel(VDel { key, .. }) => {
                let Some(current) = self.live(key, out) else {
                    return Ok(Reply::new(Response::Int(0), None));
                };
                Self::fence(&current, ft)?;
                if let Command::VDel(vdel) = &request.command {
                    if vdel.value != current.value {
                        return Ok(Reply::new(Response::Int(-1), Some(current.version)));
                    }
                }
                self.keys.remove(key);
                let version = self.version(ts);
                self.notify(key, Notification::Delete, &version, out);
                Ok(Reply::new(Response::Int(1), Some(version)))
            }
            Command::KeyNotify(kn) => {
                let entry = (kn.key.clone(), client.to_owned());
                if kn.stop {
                    Ok(Reply::new(if self.watchers.remove(&entry) { Response::Ok } else { Response::Int(0) }, None))
                } else {
                    self.watchers.insert(entry);
                    Ok(Reply::new(Response::Ok, None))
                }
            }
            Command::Scan(_) => unreachable!("not generated"),
        }
    }

    fn apply(&mut self, entry: &Entry) -> (Reply, Vec<Note>, bool) {
        self.clock = self.clock.max(entry.wall_clock_ms);
        let now = self.clock;
        self.dedup.retain(|_, (_, until)| *until > now);
        let mut out = Vec::new();
        let reply = match &entry.operation {
            Operation::Request(cr) => {
                let identity = cr.identity.clone().unwrap();
                if let Some((reply, _)) = self.dedup.get(&identity) {
                    return (reply.clone(), Vec::new(), true);
                }
                let client = cr.client_id.clone().unwrap();
                let reply = self.execute(&client, &cr.request, &mut out).unwrap_or_else(Reply::error);
                let until = now + u64::from(cr.message_expiry_secs.unwrap()) * 1000 + 60_000;
                self.dedup.insert(identity, (reply.clone(), until));
                reply
            }
            Operation::Expire { key, version } => match self.keys.get(key).cloned() {
                Some(s) if s.version == *version && s.expires_at.is_some_and(|d| now >= d) => {
                    self.keys.remove(key);
                    let v = self.version(None);
                    self.notify(key, Notification::Delete, &v, &mut out);
                    Reply::new(Response::Int(1), Some(v))
                }
                _ => Reply::new(Response::Int(0), None),
            },
            Operation::DropRegistrations { client_id } => {
                let before = self.watchers.len();
                self.watchers.retain(|(_, c)| c != client_id);
                Reply::new(Response::Int((before - self.watchers.len()) as i64), None)
            }
            Operation::Enroll { .. }
            | Operation::NameCluster { .. }
            | Operation::RenameCluster { .. }
            | Operation::Restore { .. }
            | Operation::RestoreChunk { .. } => {
                unreachable!("not generated")
            }
            Operation::ConfirmNotifications { through } => {
                let lasts: Vec<u64> = self.changes.range(..=*through).map(|(last, _)| *last).collect();
                let confirmed: Vec<u64> = lasts.iter().flat_map(|last| self.changes.remove(last).unwrap()).collect();
                for seq in &confirmed {
                    self.outbox.remove(seq);
                }
                Reply::new(Response::Int(confirmed.len() as i64), None)
            }
        };
        (reply, out, false)
    }
}

fn notes(applied: &Applied) -> Vec<Note> {
    applied
        .notifications
        .iter()
        .map(|e| {
            let n = &e.notification;
            (n.client_id.clone(), n.key.to_vec(), n.notification.clone(), n.version.clone())
        })
        .collect()
}

/// `default_cases` cases, or `PROPTEST_CASES` when set.
fn config(default_cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(default_cases);
    ProptestConfig { cases, ..ProptestConfig::default() }
}

proptest! {
    #![proptest_config(config(400))]

    #[test]
    fn state_machine_matches_the_model(steps in prop::collection::vec(step(), 1..80)) {
        let config = Config { max_keys: MAX_KEYS, max_bytes: MAX_BYTES, ..Config::default() };
        let machine = StateMachine::new(config);
        let mut store = MemStorage::new();
        let mut model = Model::default();
        let mut wall = 1_795_306_435_000u64;
        let mut correlation = 0u64;
        let mut last_request: Option<Operation> = None;
        let mut versions: Vec<Hlc> = Vec::new();
        for step in steps {
            let operation = match step {
                Step::Advance(ms) => { wall += ms; continue; }
                Step::ClockBack(ms) => { wall -= ms; continue; }
                Step::Request { client, command, token, clock } => {
                    let ts = match clock {
                        Clock::Now => Hlc::new(wall, 0, format!("{}-clock", CLIENTS[client])),
                        Clock::Ahead(ms) => Hlc::new(wall + ms, 0, format!("{}-clock", CLIENTS[client])),
                    };
                    let fencing_token = match token {
                        Token::None => None,
                        Token::Latest => versions.last().cloned(),
                        Token::Previous => versions.iter().rev().nth(1).cloned(),
                        Token::Epoch => Some(Hlc::new(0, 0, "epoch")),
                    };
                    let fencing_token = fencing_token.filter(|_| command.is_fenced());
                    correlation += 1;
                    let operation = Operation::Request(ClientRequest {
                        request: Request { command, timestamp: Some(ts), fencing_token },
                        client_id: Some(CLIENTS[client].to_owned()),
                        identity: Some(RequestIdentity {
                            response_topic: format!("clients/{}/response", CLIENTS[client]),
                            correlation_data: correlation.to_be_bytes().to_vec(),
                        }),
                        message_expiry_secs: Some(2),
                    });
                    last_request = Some(operation.clone());
                    operation
                }
                Step::Redeliver => match &last_request { Some(op) => op.clone(), None => continue },
                Step::Expire { key, stale } => {
                    let key = KEYS[key].as_bytes().to_vec();
                    let version = match (model.keys.get(&key), stale) {
                        (Some(s), false) => s.version.clone(),
                        _ => versions.first().cloned().unwrap_or(Hlc::new(1, 0, "statestore")),
                    };
                    Operation::Expire { key, version }
                }
                Step::Drop { client } => Operation::DropRegistrations { client_id: CLIENTS[client].to_owned() },
                Step::Confirm => Operation::ConfirmNotifications { through: model.next_seq.saturating_sub(2) },
            };
            let entry = Entry { operation, wall_clock_ms: wall };
            let applied = machine.apply_all(&mut store, std::slice::from_ref(&entry)).unwrap().pop().unwrap();
            let (reply, expected_notes, deduplicated) = model.apply(&entry);
            prop_assert_eq!(&applied.reply, &reply, "entry {:?}", entry);
            prop_assert_eq!(notes(&applied), expected_notes, "entry {:?}", entry);
            prop_assert_eq!(applied.deduplicated, deduplicated);
            if let Some(v) = &applied.reply.version {
                if !versions.contains(v) { versions.push(v.clone()); }
            }
        }
        // The remaining state agrees too.
        let now = machine.now(&store, wall).unwrap();
        for key in KEYS {
            let reply = machine
                .read(&store, &Request { command: Command::Get(Get { key: key.into() }), timestamp: None, fencing_token: None }, wall)
                .unwrap()
                .unwrap();
            let expected = model.keys.get(key.as_bytes()).filter(|s| s.expires_at.is_none_or(|d| now < d));
            prop_assert_eq!(reply.version, expected.map(|s| s.version.clone()));
        }
        let pending = statestore_statemachine::watch::pending_notifications(&store, None, 10_000).unwrap();
        prop_assert_eq!(pending.iter().map(|e| e.seq).collect::<Vec<_>>(), model.outbox.keys().copied().collect::<Vec<_>>());
        prop_assert_eq!(statestore_statemachine::meta::key_count(&store).unwrap(), model.usage().0);
        prop_assert_eq!(statestore_statemachine::meta::byte_count(&store).unwrap(), model.usage().1);
    }
}
