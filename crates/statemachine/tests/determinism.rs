//! Replicas that apply the same entries agree: same state, same replies, same notifications.
//! Batched apply (one storage write for many entries) equals one-by-one apply.

mod common;

use common::cmd::*;
use statestore_protocol::{Hlc, Request};
use statestore_statemachine::{ClientRequest, Entry, MemStorage, Operation, StateMachine};

fn entries() -> Vec<Entry> {
    let mut out = Vec::new();
    let mut wall = common::T0;
    let commands = [
        watch("k"),
        set_px("k", "1", 50),
        nx("k", "2"),
        nex("k", "1"),
        set("j", "x"),
        get("k"),
        vdel("j", "y"),
        vdel("j", "x"),
        set_px("k", "3", 20),
        scan("*", None),
        del("k"),
        stop("k"),
    ];
    for (i, command) in commands.into_iter().enumerate() {
        wall += 7;
        let ts = Hlc::new(wall - 3, 0, "client");
        let request = Request { command, timestamp: Some(ts), fencing_token: None };
        out.push(Entry {
            operation: Operation::Request(ClientRequest {
                request,
                client_id: Some("c".into()),
                identity: Some(statestore_statemachine::RequestIdentity {
                    response_topic: "clients/c/r".into(),
                    correlation_data: vec![(i % 4) as u8],
                }),
                message_expiry_secs: Some(1),
            }),
            wall_clock_ms: wall,
        });
    }
    out.push(Entry { operation: Operation::ConfirmNotifications { through: 1 }, wall_clock_ms: wall });
    out.push(Entry { operation: Operation::DropRegistrations { client_id: "c".into() }, wall_clock_ms: wall - 100 });
    out
}

#[test]
fn same_entries_same_state_and_outputs() {
    let machine = StateMachine::default();
    let (mut one, mut two, mut batched) = (MemStorage::new(), MemStorage::new(), MemStorage::new());
    let entries = entries();
    let mut outputs_one = Vec::new();
    let mut outputs_two = Vec::new();
    for entry in &entries {
        outputs_one.extend(machine.apply_all(&mut one, std::slice::from_ref(entry)).unwrap());
        outputs_two.extend(machine.apply_all(&mut two, std::slice::from_ref(entry)).unwrap());
    }
    let outputs_batched = machine.apply_all(&mut batched, &entries).unwrap();
    assert_eq!(one, two);
    assert_eq!(one, batched);
    assert_eq!(outputs_one, outputs_two);
    assert_eq!(outputs_one, outputs_batched);
    // Identities repeat every 4 entries: some replies came from the dedup table.
    assert!(outputs_one.iter().any(|a| a.deduplicated));
}

#[test]
fn entries_survive_a_serialization_round_trip() {
    // The log stores entries serialized; what comes back must be the same entry.
    for entry in entries() {
        let json = serde_json::to_string(&entry).unwrap();
        assert_eq!(serde_json::from_str::<Entry>(&json).unwrap(), entry);
    }
}
