//! A harness that drives the state machine the way the leader will: requests parsed from the
//! SDKs' bytes, stamped with a wall clock, applied through the log path.

#![allow(dead_code)]

use statestore_protocol::{Command, Hlc, Request, Response};
use statestore_statemachine::{
    Applied, ClientRequest, Config, Entry, KeyNotification, MemStorage, Operation, Reply, RequestIdentity, StateMachine,
};

pub const T0: u64 = 1_795_306_435_000;

pub struct Harness {
    pub machine: StateMachine,
    pub store: MemStorage,
    /// The wall clock of the next entry.
    pub now: u64,
    next_correlation: u64,
}

/// One client's view: its id and its own HLC, which it stamps on every request as `__ts`.
pub struct Client {
    pub id: String,
    pub clock: Hlc,
}

impl Client {
    pub fn new(id: &str) -> Client {
        Client { id: id.to_owned(), clock: Hlc::new(0, 0, format!("{id}-node")) }
    }
}

impl Harness {
    pub fn new() -> Harness {
        Harness::with_config(Config::default())
    }

    pub fn with_config(config: Config) -> Harness {
        Harness { machine: StateMachine::new(config), store: MemStorage::new(), now: T0, next_correlation: 0 }
    }

    pub fn advance(&mut self, ms: u64) {
        self.now += ms;
    }

    pub fn apply(&mut self, operation: Operation) -> Applied {
        let entry = Entry { operation, wall_clock_ms: self.now };
        self.machine.apply_all(&mut self.store, &[entry]).expect("storage").pop().unwrap()
    }

    pub fn identity(&mut self, client: &Client) -> RequestIdentity {
        self.next_correlation += 1;
        RequestIdentity {
            response_topic: format!("clients/{}/services/statestore/response", client.id),
            correlation_data: self.next_correlation.to_be_bytes().to_vec(),
        }
    }

    /// Sends a command as `client` would: `__ts` from its clock (advanced to now), optional `__ft`.
    pub fn send(&mut self, client: &mut Client, command: Command, fencing_token: Option<&Hlc>) -> Applied {
        client.clock.update_now(self.now, u64::MAX).unwrap();
        let request = Request::parse(
            &command.encode(),
            Some(&client.clock.to_string()),
            fencing_token.map(|t| t.to_string()).as_deref(),
        )
        .expect("valid request");
        let identity = self.identity(client);
        let applied = self.send_request(client, request, Some(identity));
        // Clients merge every `__ts` they receive into their clock.
        if let Some(version) = &applied.reply.version {
            client.clock.update(version, self.now, u64::MAX).unwrap();
        }
        applied
    }

    pub fn send_request(&mut self, client: &Client, request: Request, identity: Option<RequestIdentity>) -> Applied {
        self.apply(Operation::Request(ClientRequest {
            request,
            client_id: Some(client.id.clone()),
            identity,
            message_expiry_secs: Some(10),
        }))
    }

    /// A GET or SCAN through the read path (no log entry).
    pub fn read(&self, command: Command) -> Reply {
        let request = Request { command, timestamp: None, fencing_token: None };
        self.machine.read(&self.store, &request, self.now).unwrap().expect("a read command")
    }

    /// The same, for a client confined to `within`.
    #[allow(dead_code)]
    pub fn read_within(&self, command: Command, within: &statestore_statemachine::KeyPrefixes) -> Reply {
        let request = Request { command, timestamp: None, fencing_token: None };
        self.machine.read_within(&self.store, &request, self.now, Some(within)).unwrap().expect("a read command")
    }
}

pub fn notified(applied: &Applied) -> Vec<KeyNotification> {
    applied.notifications.iter().map(|e| e.notification.clone()).collect()
}

pub fn ok(applied: &Applied) -> Hlc {
    assert_eq!(applied.reply.response, Response::Ok, "{applied:?}");
    applied.reply.version.clone().expect("a version with +OK")
}

pub mod cmd {
    use serde_bytes::ByteBuf;
    use statestore_protocol::{Command, Del, Get, KeyNotify, Scan, Set, SetCondition, VDel};

    pub fn set(key: &str, value: &str) -> Command {
        Command::Set(Set::new(key, value))
    }
    pub fn set_with(key: &str, value: &str, condition: SetCondition, expiry_ms: Option<u64>) -> Command {
        Command::Set(Set { key: key.into(), value: value.into(), condition, expiry_ms })
    }
    pub fn set_px(key: &str, value: &str, ms: u64) -> Command {
        set_with(key, value, SetCondition::Always, Some(ms))
    }
    pub fn nx(key: &str, value: &str) -> Command {
        set_with(key, value, SetCondition::NotExists, None)
    }
    pub fn nex(key: &str, value: &str) -> Command {
        set_with(key, value, SetCondition::NotExistsOrEqual, None)
    }
    pub fn lease(key: &str, holder: &str, ms: u64) -> Command {
        set_with(key, holder, SetCondition::NotExistsOrEqual, Some(ms))
    }
    pub fn get(key: &str) -> Command {
        Command::Get(Get { key: key.into() })
    }
    pub fn del(key: &str) -> Command {
        Command::Del(Del { key: key.into() })
    }
    pub fn vdel(key: &str, value: &str) -> Command {
        Command::VDel(VDel { key: key.into(), value: value.into() })
    }
    pub fn watch(key: &str) -> Command {
        Command::KeyNotify(KeyNotify { key: key.into(), stop: false })
    }
    pub fn stop(key: &str) -> Command {
        Command::KeyNotify(KeyNotify { key: key.into(), stop: true })
    }
    pub fn scan(pattern: &str, token: Option<&[u8]>) -> Command {
        Command::Scan(Scan { pattern: pattern.into(), token: token.map(|t| ByteBuf::from(t.to_vec())) })
    }
}

/// KEYNOTIFY's `+OK` carries no version.
pub fn watched(applied: &Applied) {
    assert_eq!(applied.reply, Reply::new(Response::Ok, None), "{applied:?}");
}
