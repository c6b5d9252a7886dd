//! Command semantics: PROTOCOL.md §6, §7.1, §11 (with its worked examples) and the behaviours of
//! §15 that need no network, applied through the log path of the state machine.

mod common;

use common::cmd::*;
use common::{notified, ok, watched, Client, Harness, T0};
use statestore_protocol::{Hlc, Notification, Response, StoreError};
use statestore_statemachine::Operation;

fn error(applied: &statestore_statemachine::Applied) -> StoreError {
    match &applied.reply.response {
        Response::Error(e) => {
            assert_eq!(applied.reply.version, None, "errors carry no __ts");
            e.clone()
        }
        other => panic!("expected an error, got {other:?}"),
    }
}

fn int(applied: &statestore_statemachine::Applied) -> i64 {
    match applied.reply.response {
        Response::Int(n) => n,
        ref other => panic!("expected an integer, got {other:?}"),
    }
}

#[test]
fn crud_with_versions_where_section_7_1_requires_them() {
    let (mut h, mut c) = (Harness::new(), Client::new("c"));
    let v1 = ok(&h.send(&mut c, set("k", "v1"), None));
    let hit = h.send(&mut c, get("k"), None);
    assert_eq!(hit.reply.response, Response::Value(b"v1".to_vec()));
    assert_eq!(hit.reply.version, Some(v1.clone()), "a GET hit carries the key's version");
    h.advance(1);
    let v2 = ok(&h.send(&mut c, set("k", "v2"), None));
    assert!(v2 > v1);
    let deleted = h.send(&mut c, del("k"), None);
    assert_eq!(deleted.reply.response, Response::Int(1));
    assert!(deleted.reply.version.as_ref().is_some_and(|v| *v > v2));
    let miss = h.send(&mut c, get("k"), None);
    assert_eq!(miss.reply, statestore_statemachine::Reply::new(Response::Nil, None), "a GET miss has no __ts");
    let absent = h.send(&mut c, del("k"), None);
    assert_eq!(absent.reply, statestore_statemachine::Reply::new(Response::Int(0), None));
}

#[test]
fn empty_values_and_binary_keys() {
    let (mut h, mut c) = (Harness::new(), Client::new("c"));
    ok(&h.send(&mut c, set("e", ""), None));
    let hit = h.read(get("e"));
    assert_eq!(hit.response, Response::Value(Vec::new()));
    assert!(hit.version.is_some_and(|v| v.timestamp > 0), "Go asserts a non-zero version for an empty value");
    let key = "\0\r\n".repeat(2000);
    ok(&h.send(&mut c, set(&key, &"x".repeat(65_000)), None));
    assert_eq!(h.read(get(&key)).response, Response::Value(b"x".repeat(65_000)));
}

#[test]
fn nx_and_nex() {
    let (mut h, mut c) = (Harness::new(), Client::new("c"));
    let v = ok(&h.send(&mut c, nx("k", "a"), None));
    let refused = h.send(&mut c, nx("k", "b"), None);
    assert_eq!(refused.reply.response, Response::Int(-1));
    assert_eq!(refused.reply.version, Some(v.clone()), "a refused SET carries the current version");
    let refused = h.send(&mut c, nex("k", "b"), None);
    assert_eq!(refused.reply.response, Response::Int(-1));
    assert_eq!(refused.reply.version, Some(v.clone()));
    let renewed = ok(&h.send(&mut c, nex("k", "a"), None));
    assert!(renewed > v, "a NEX renewal gets a strictly newer version");
    ok(&h.send(&mut c, nex("fresh", "x"), None));
    assert_eq!(h.read(get("k")).response, Response::Value(b"a".to_vec()));
}

#[test]
fn refused_conditional_set_changes_nothing_and_notifies_nobody() {
    let (mut h, mut c) = (Harness::new(), Client::new("c"));
    ok(&h.send(&mut c, set_px("k", "a", 5_000), None));
    watched(&h.send(&mut c, watch("k"), None));
    let before = h.store.clone();
    let refused = h.send(&mut c, nx("k", "b"), None);
    assert!(refused.notifications.is_empty());
    let refused = h.send(&mut c, nex("k", "b"), None);
    assert!(refused.notifications.is_empty());
    // Only the dedup table and clock may differ.
    use statestore_statemachine::{StorageRead, Table};
    for table in [Table::Keys, Table::Expiry, Table::Watchers, Table::Outbox] {
        assert_eq!(h.store.scan(table, &[], None, 100).unwrap(), before.scan(table, &[], None, 100).unwrap());
    }
}

#[test]
fn vdel_results() {
    let (mut h, mut c) = (Harness::new(), Client::new("c"));
    assert_eq!(int(&h.send(&mut c, vdel("k", "a"), None)), 0);
    let v = ok(&h.send(&mut c, set("k", "a"), None));
    let mismatch = h.send(&mut c, vdel("k", "b"), None);
    assert_eq!(mismatch.reply.response, Response::Int(-1));
    assert_eq!(mismatch.reply.version, Some(v));
    assert_eq!(int(&h.send(&mut c, vdel("k", "a"), None)), 1);
    assert_eq!(int(&h.send(&mut c, vdel("k", "a"), None)), 0, "a second release answers :0, not an error");
}

/// PROTOCOL.md §11, the Rust SDK's `state_store_fencing_token_network_tests`.
#[test]
fn fencing_worked_example_rust() {
    let (mut h, mut c) = (Harness::new(), Client::new("c"));
    c.clock.update_now(h.now, u64::MAX).unwrap();
    let client_token = c.clock.clone();
    h.advance(1);
    let v1 = ok(&h.send(&mut c, set_px("key2", "v3", 10_000), Some(&client_token)));
    assert!(v1 >= client_token);
    h.advance(1);
    let v2 = ok(&h.send(&mut c, set_px("key2", "v4", 10_000), Some(&v1)));
    assert_eq!(error(&h.send(&mut c, set("key2", "v5"), None)), StoreError::FencingTokenRequired);
    assert_eq!(h.send(&mut c, get("key2"), None).reply.response, Response::Value(b"v4".to_vec()));
    assert_eq!(error(&h.send(&mut c, del("key2"), None)), StoreError::FencingTokenRequired);
    assert_eq!(error(&h.send(&mut c, vdel("key2", "v4"), None)), StoreError::FencingTokenRequired);
    assert_eq!(int(&h.send(&mut c, del("key2"), Some(&v2))), 1);
    // Deletion discards the token: the key is unfenced again.
    ok(&h.send(&mut c, set("key2", "free"), None));
}

/// PROTOCOL.md §11, Go `TestFencing`: a lease's version fences another key.
#[test]
fn fencing_worked_example_go() {
    let (mut h, mut c) = (Harness::new(), Client::new("c"));
    c.clock.update_now(h.now, u64::MAX).unwrap();
    let bad = c.clock.clone();
    h.advance(5);
    let ft = ok(&h.send(&mut c, lease("lease", "c", 10_000), None));
    ok(&h.send(&mut c, set("key", "protected"), Some(&ft)));
    assert_eq!(error(&h.send(&mut c, set("key", "x"), Some(&bad))), StoreError::FencingTokenLowerVersion);
    assert_eq!(error(&h.send(&mut c, del("key"), Some(&bad))), StoreError::FencingTokenLowerVersion);
    assert_eq!(int(&h.send(&mut c, del("key"), Some(&ft))), 1);
    assert_eq!(int(&h.send(&mut c, vdel("lease", "c"), None)), 1);
    assert_eq!(h.send(&mut c, get("lease"), None).reply.version, None, "released: a miss without __ts");
}

/// .NET: the epoch token is lower than any stored token; a token ten years ahead is skew.
#[test]
fn fencing_worked_example_dotnet() {
    let (mut h, mut c) = (Harness::new(), Client::new("c"));
    let ft = ok(&h.send(&mut c, lease("lock", "c", 10_000), None));
    ok(&h.send(&mut c, set("key", "a"), Some(&ft)));
    let epoch = Hlc::new(0, 0, "8f0e4a52-0000-0000-0000-000000000000");
    assert_eq!(error(&h.send(&mut c, set("key", "b"), Some(&epoch))), StoreError::FencingTokenLowerVersion);
    assert_eq!(error(&h.send(&mut c, del("key"), Some(&epoch))), StoreError::FencingTokenLowerVersion);
    let future = Hlc::new(h.now + 10 * 365 * 86_400_000, 0, "c");
    assert_eq!(error(&h.send(&mut c, set("key", "b"), Some(&future))), StoreError::FencingTokenSkew);
    assert_eq!(h.read(get("key")).response, Response::Value(b"a".to_vec()));
}

#[test]
fn fencing_is_checked_before_the_condition() {
    let (mut h, mut c) = (Harness::new(), Client::new("c"));
    let ft = ok(&h.send(&mut c, set("k", "v"), Some(&Hlc::new(1, 0, "c"))));
    assert_eq!(int(&h.send(&mut c, vdel("k", "wrong"), Some(&ft))), -1, "Rust test: wrong value, valid token");
    assert_eq!(error(&h.send(&mut c, vdel("k", "wrong"), None)), StoreError::FencingTokenRequired);
    assert_eq!(error(&h.send(&mut c, nx("k", "v2"), None)), StoreError::FencingTokenRequired);
    assert_eq!(int(&h.send(&mut c, nx("k", "v2"), Some(&ft))), -1);
    assert_eq!(int(&h.send(&mut c, vdel("k", "v"), Some(&ft))), 1);
}

#[test]
fn nex_with_a_token_on_a_missing_key_stores_the_token() {
    let (mut h, mut c) = (Harness::new(), Client::new("c"));
    let token = Hlc::new(T0 - 1, 0, "c");
    ok(&h.send(&mut c, nex("key4", "v"), Some(&token)));
    assert_eq!(error(&h.send(&mut c, vdel("key4", "v"), None)), StoreError::FencingTokenRequired);
    assert_eq!(int(&h.send(&mut c, vdel("key4", "v"), Some(&token))), 1);
}

#[test]
fn a_newer_token_replaces_the_stored_one_an_equal_or_older_does_not() {
    let (mut h, mut c) = (Harness::new(), Client::new("c"));
    let (t1, t2, t3) = (Hlc::new(10, 0, "c"), Hlc::new(20, 0, "c"), Hlc::new(15, 0, "c"));
    ok(&h.send(&mut c, set("k", "a"), Some(&t1)));
    ok(&h.send(&mut c, set("k", "b"), Some(&t2)));
    assert_eq!(error(&h.send(&mut c, set("k", "c"), Some(&t1))), StoreError::FencingTokenLowerVersion);
    assert_eq!(error(&h.send(&mut c, set("k", "c"), Some(&t3))), StoreError::FencingTokenLowerVersion);
    ok(&h.send(&mut c, set("k", "c"), Some(&t2)));
    // A refused write never moves the token.
    assert_eq!(int(&h.send(&mut c, nx("k", "d"), Some(&Hlc::new(99, 0, "c")))), -1);
    ok(&h.send(&mut c, set("k", "e"), Some(&t2)));
    // Node ids break ties, as Go and .NET compare them.
    let same_tick_lower_node = Hlc::new(20, 0, "a");
    assert_eq!(
        error(&h.send(&mut c, set("k", "f"), Some(&same_tick_lower_node))),
        StoreError::FencingTokenLowerVersion
    );
}

#[test]
fn requests_too_far_in_the_future_are_refused_and_change_nothing() {
    let (mut h, c) = (Harness::new(), Client::new("c"));
    let ahead = Hlc::new(h.now + 60_001, 0, "c");
    let request = statestore_protocol::Request::parse(&set("k", "v").encode(), Some(&ahead.to_string()), None).unwrap();
    let applied = h.send_request(&c, request, None);
    assert_eq!(error(&applied), StoreError::TimestampSkew);
    assert_eq!(h.read(get("k")).response, Response::Nil);
    let at_limit = Hlc::new(h.now + 60_000, 0, "c");
    let request =
        statestore_protocol::Request::parse(&set("k", "v").encode(), Some(&at_limit.to_string()), None).unwrap();
    let v = ok(&h.send_request(&c, request, None));
    assert!(v > at_limit, "versions are newer than the request __ts");
    // The read path checks skew too.
    let request = statestore_protocol::Request::parse(&get("k").encode(), Some(&ahead.to_string()), None).unwrap();
    let reply = h.machine.read(&h.store, &request, h.now).unwrap().unwrap();
    assert_eq!(reply.response, Response::Error(StoreError::TimestampSkew));
}

#[test]
fn versions_are_one_global_monotonic_clock() {
    let (mut h, mut a, mut b) = (Harness::new(), Client::new("a"), Client::new("b"));
    let mut last = Hlc::new(0, 0, "statestore");
    for i in 0..50u64 {
        if i.is_multiple_of(7) {
            h.advance(1);
        }
        let client = if i.is_multiple_of(2) { &mut a } else { &mut b };
        let v = ok(&h.send(client, set(&format!("k{}", i % 5), "v"), None));
        assert!(v > last, "{v} after {last}");
        assert_eq!(v.node_id, "statestore");
        assert!(v.counter < (1 << 31));
        last = v;
    }
}

/// Rust `lease_single_holder_acquires_a_lease_with_auto_renewal`: renewals keep the node id and
/// the counter; Go/.NET: renewal tokens compare greater.
#[test]
fn lease_renewals_keep_node_id_and_counter() {
    let (mut h, mut c) = (Harness::new(), Client::new("holder"));
    let t1 = ok(&h.send(&mut c, lease("lease", "holder", 4_000), None));
    h.advance(2_000);
    let t2 = ok(&h.send(&mut c, lease("lease", "holder", 4_000), None));
    h.advance(2_000);
    let t3 = ok(&h.send(&mut c, lease("lease", "holder", 4_000), None));
    assert!(t1 < t2 && t2 < t3);
    assert!(t2.timestamp > t1.timestamp && t3.timestamp > t2.timestamp);
    assert_eq!((t1.node_id.as_str(), t2.node_id.as_str()), ("statestore", "statestore"));
    assert_eq!(t2.counter, t3.counter);
}

#[test]
fn a_state_machine_clock_behind_a_fast_request_clock_still_issues_newer_versions() {
    let (mut h, c) = (Harness::new(), Client::new("c"));
    let fast = Hlc::new(h.now + 30_000, 4, "c");
    let request = statestore_protocol::Request::parse(&set("k", "v").encode(), Some(&fast.to_string()), None).unwrap();
    let v = ok(&h.send_request(&c, request, None));
    assert_eq!(v.tick(), (h.now + 30_000, 5));
}

#[test]
fn expiry_makes_keys_absent_at_the_deadline() {
    let (mut h, mut c) = (Harness::new(), Client::new("c"));
    ok(&h.send(&mut c, set_px("k", "v", 1_000), None));
    h.advance(999);
    assert_eq!(h.read(get("k")).response, Response::Value(b"v".to_vec()));
    h.advance(1);
    assert_eq!(h.read(get("k")), statestore_statemachine::Reply::new(Response::Nil, None));
    assert_eq!(int(&h.send(&mut c, del("k"), None)), 0, "an expired key is absent for DEL");
}

#[test]
fn another_holder_acquires_an_expired_lease() {
    let (mut h, mut one, mut two) = (Harness::new(), Client::new("one"), Client::new("two"));
    let t1 = ok(&h.send(&mut one, lease("lease", "one", 3_000), None));
    assert_eq!(int(&h.send(&mut two, lease("lease", "two", 3_000), None)), -1);
    h.advance(3_000);
    let t2 = ok(&h.send(&mut two, lease("lease", "two", 3_000), None));
    assert!(t2 > t1);
    assert_eq!(h.read(get("lease")).response, Response::Value(b"two".to_vec()));
}

#[test]
fn set_without_px_clears_the_expiry() {
    let (mut h, mut c) = (Harness::new(), Client::new("c"));
    ok(&h.send(&mut c, set_px("k", "v", 1_000), None));
    ok(&h.send(&mut c, set("k", "w"), None));
    h.advance(10_000);
    assert_eq!(h.read(get("k")).response, Response::Value(b"w".to_vec()));
    assert_eq!(h.machine_due(), Vec::<Vec<u8>>::new());
}

#[test]
fn px_zero_writes_a_key_that_is_already_expired() {
    let (mut h, mut c) = (Harness::new(), Client::new("c"));
    watched(&h.send(&mut c, watch("k"), None));
    let applied = h.send(&mut c, set_px("k", "v", 0), None);
    let v = ok(&applied);
    assert_eq!(notified(&applied)[0].notification, Notification::Set { value: b"v".to_vec().into() });
    assert_eq!(h.read(get("k")).response, Response::Nil);
    assert_eq!(h.machine_due(), vec![b"k".to_vec()]);
    let expired = h.apply(Operation::Expire { key: b"k".to_vec(), version: v });
    assert_eq!(notified(&expired)[0].notification, Notification::Delete);
}

#[test]
fn expire_deletes_only_the_version_it_names_and_notifies() {
    let (mut h, mut c) = (Harness::new(), Client::new("c"));
    watched(&h.send(&mut c, watch("k"), None));
    let v1 = ok(&h.send(&mut c, set_px("k", "v", 1_000), None));
    // Not yet due: nothing happens.
    assert_eq!(int(&h.apply(Operation::Expire { key: b"k".to_vec(), version: v1.clone() })), 0);
    h.advance(500);
    let v2 = ok(&h.send(&mut c, set_px("k", "v", 1_000), None));
    h.advance(600);
    // The sweeper saw the old version: the renewal survives.
    let stale = h.apply(Operation::Expire { key: b"k".to_vec(), version: v1 });
    assert_eq!(int(&stale), 0);
    assert!(stale.notifications.is_empty());
    h.advance(400);
    let expired = h.apply(Operation::Expire { key: b"k".to_vec(), version: v2.clone() });
    assert_eq!(int(&expired), 1);
    let n = notified(&expired);
    assert_eq!(n.len(), 1);
    assert_eq!(n[0].notification, Notification::Delete);
    assert!(n[0].version > v2, "the deletion has its own, newer version");
    assert_eq!(h.machine_due(), Vec::<Vec<u8>>::new());
    assert_eq!(int(&h.apply(Operation::Expire { key: b"k".to_vec(), version: v2 })), 0, "expire is idempotent");
}

#[test]
fn a_write_to_an_expired_key_first_reports_the_expiry() {
    let (mut h, mut c, mut w) = (Harness::new(), Client::new("c"), Client::new("watcher"));
    watched(&h.send(&mut w, watch("k"), None));
    ok(&h.send(&mut c, set_px("k", "old", 100), None));
    h.advance(100);
    let applied = h.send(&mut c, nx("k", "new"), None);
    ok(&applied);
    let n = notified(&applied);
    assert_eq!(
        n.iter().map(|n| n.notification.clone()).collect::<Vec<_>>(),
        vec![Notification::Delete, Notification::Set { value: b"new".to_vec().into() }]
    );
    assert!(n[0].version < n[1].version);
}

#[test]
fn the_state_machine_clock_never_goes_back() {
    let (mut h, mut c) = (Harness::new(), Client::new("c"));
    ok(&h.send(&mut c, set_px("k", "v", 1_000), None));
    h.advance(1_000);
    ok(&h.send(&mut c, set("other", "x"), None));
    // A new leader whose wall clock is 5 s behind: the key stays expired for it.
    h.now -= 5_000;
    assert_eq!(h.read(get("k")).response, Response::Nil);
    assert_eq!(int(&h.send(&mut c, del("k"), None)), 0);
    let v = ok(&h.send(&mut c, set("other", "y"), None));
    assert!(v.timestamp >= T0 + 1_000);
}

#[test]
fn keynotify_registration_and_stop() {
    let (mut h, mut c) = (Harness::new(), Client::new("c"));
    assert_eq!(h.send(&mut c, watch("missing"), None).reply.response, Response::Ok, "the key need not exist");
    assert_eq!(h.send(&mut c, watch("missing"), None).reply.response, Response::Ok, "idempotent");
    assert_eq!(h.send(&mut c, stop("missing"), None).reply.response, Response::Ok);
    assert_eq!(h.send(&mut c, stop("missing"), None).reply.response, Response::Int(0));
    for _ in 0..2 {
        assert_eq!(h.send(&mut c, watch("k"), None).reply.response, Response::Ok);
        assert_eq!(h.send(&mut c, stop("k"), None).reply.response, Response::Ok);
    }
}

#[test]
fn a_set_notifies_once_with_the_value_and_the_sets_version() {
    let (mut h, mut c) = (Harness::new(), Client::new("client-1"));
    watched(&h.send(&mut c, watch("key1"), None));
    watched(&h.send(&mut c, watch("key1"), None));
    let applied = h.send(&mut c, set("key1", "value1"), None);
    let v = ok(&applied);
    let n = notified(&applied);
    assert_eq!(n.len(), 1, "a repeated KEYNOTIFY must not duplicate notifications");
    assert_eq!(n[0].client_id, "client-1");
    assert_eq!(n[0].notification, Notification::Set { value: b"value1".to_vec().into() });
    assert_eq!(n[0].version, v);
    assert_eq!(
        n[0].topic().unwrap(),
        "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/636C69656E742D31/command/notify/6B657931"
    );
    let deleted = h.send(&mut c, del("key1"), None);
    assert_eq!(notified(&deleted)[0].notification, Notification::Delete);
    assert_eq!(Some(&notified(&deleted)[0].version), deleted.reply.version.as_ref());
}

/// The count of registrations that lets a change skip the lookup of its watchers: kept through
/// register, stop and a dropped client, and counted once in a store written without it.
#[test]
fn the_registration_count_follows_registrations_and_is_counted_where_missing() {
    use statestore_statemachine::{Batch, Storage, StorageRead, Table};
    const COUNT: &[u8] = b"registration_count";
    let count =
        |h: &Harness| h.store.get(Table::Meta, COUNT).unwrap().map(|v| u64::from_be_bytes(v[1..].try_into().unwrap()));
    let (mut h, mut a, mut b) = (Harness::new(), Client::new("a"), Client::new("b"));
    assert!(notified(&h.send(&mut a, set("k1", "v"), None)).is_empty());
    assert_eq!(count(&h), Some(0), "the first change records the empty count");
    watched(&h.send(&mut a, watch("k1"), None));
    watched(&h.send(&mut a, watch("k2"), None));
    watched(&h.send(&mut b, watch("k1"), None));
    watched(&h.send(&mut b, watch("k1"), None));
    assert_eq!(count(&h), Some(3), "a repeated KEYNOTIFY counts once");
    assert_eq!(notified(&h.send(&mut a, set("k1", "v"), None)).len(), 2);
    h.send(&mut b, stop("k1"), None);
    h.send(&mut b, stop("k1"), None);
    assert_eq!(count(&h), Some(2));
    h.apply(Operation::DropRegistrations { client_id: "a".into() });
    assert_eq!(count(&h), Some(0));
    assert!(notified(&h.send(&mut a, set("k1", "v"), None)).is_empty(), "nobody left to notify");

    // A store from before the count: registrations, no count.
    watched(&h.send(&mut b, watch("k3"), None));
    watched(&h.send(&mut a, watch("k3"), None));
    h.store.write(Batch { writes: vec![(Table::Meta, COUNT.to_vec(), None)] }).unwrap();
    let n = notified(&h.send(&mut a, set("k3", "v"), None));
    assert_eq!(n.iter().map(|n| n.client_id.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(count(&h), Some(2), "counted from the registrations");
}

/// Rust test 21: SET v1, DEL, observe, SET v2, DEL, SET v3, STOP, SET v4, DEL.
#[test]
fn notifications_follow_registration_in_order() {
    let (mut h, mut c) = (Harness::new(), Client::new("c"));
    let mut seen = Vec::new();
    let script = [set("k", "v1"), del("k"), watch("k"), set("k", "v2"), del("k"), set("k", "v3"), stop("k")];
    for command in script.into_iter().chain([set("k", "v4"), del("k")]) {
        seen.extend(notified(&h.send(&mut c, command, None)).into_iter().map(|n| n.notification));
    }
    assert_eq!(
        seen,
        vec![
            Notification::Set { value: b"v2".to_vec().into() },
            Notification::Delete,
            Notification::Set { value: b"v3".to_vec().into() },
        ]
    );
}

#[test]
fn every_registered_client_is_notified() {
    let (mut h, mut a, mut b) = (Harness::new(), Client::new("a"), Client::new("b"));
    watched(&h.send(&mut a, watch("lock"), None));
    watched(&h.send(&mut b, watch("lock"), None));
    watched(&h.send(&mut b, watch("other"), None));
    let applied = h.send(&mut a, vdel("lock", "x"), None);
    assert!(applied.notifications.is_empty(), "nothing changed");
    let applied = h.send(&mut a, set("lock", "x"), None);
    let clients: Vec<_> = notified(&applied).into_iter().map(|n| n.client_id).collect();
    assert_eq!(clients, ["a", "b"]);
    let applied = h.send(&mut a, vdel("lock", "x"), None);
    assert_eq!(notified(&applied).len(), 2);
    assert!(notified(&applied).iter().all(|n| n.notification == Notification::Delete));
}

#[test]
fn keynotify_needs_a_client_id_and_a_notifiable_key() {
    let mut h = Harness::new();
    let request = statestore_protocol::Request { command: watch("k"), timestamp: None, fencing_token: None };
    let applied = h.apply(Operation::Request(statestore_statemachine::ClientRequest {
        request,
        client_id: None,
        identity: None,
        message_expiry_secs: None,
    }));
    assert_eq!(error(&applied), StoreError::MissingClientId);
    let mut c = Client::new("c");
    let long = "k".repeat(40_000);
    assert_eq!(error(&h.send(&mut c, watch(&long), None)), StoreError::KeyTooLongToObserve);
    assert_eq!(h.send(&mut c, stop(&long), None).reply.response, Response::Int(0));
}

#[test]
fn dropping_a_clients_registrations_leaves_others() {
    let (mut h, mut a, mut b) = (Harness::new(), Client::new("a"), Client::new("b"));
    for key in ["k1", "k2", "k3"] {
        watched(&h.send(&mut a, watch(key), None));
    }
    watched(&h.send(&mut b, watch("k1"), None));
    assert_eq!(int(&h.apply(Operation::DropRegistrations { client_id: "a".into() })), 3);
    let applied = h.send(&mut a, set("k1", "v"), None);
    assert_eq!(notified(&applied).into_iter().map(|n| n.client_id).collect::<Vec<_>>(), ["b"]);
    assert_eq!(h.send(&mut a, stop("k2"), None).reply.response, Response::Int(0));
    assert_eq!(int(&h.apply(Operation::DropRegistrations { client_id: "a".into() })), 0);
}

#[test]
fn the_outbox_keeps_notifications_until_confirmed() {
    use statestore_statemachine::watch::pending_notifications;
    let (mut h, mut c) = (Harness::new(), Client::new("c"));
    watched(&h.send(&mut c, watch("k"), None));
    let a = h.send(&mut c, set("k", "1"), None);
    let b = h.send(&mut c, set("k", "2"), None);
    let d = h.send(&mut c, del("k"), None);
    let seqs: Vec<u64> = [&a, &b, &d].iter().flat_map(|x| x.notifications.iter().map(|e| e.seq)).collect();
    assert_eq!(seqs, [0, 1, 2]);
    let pending = pending_notifications(&h.store, None, 10).unwrap();
    assert_eq!(pending.iter().map(|e| e.seq).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(pending[0], a.notifications[0]);
    assert_eq!(pending_notifications(&h.store, Some(0), 10).unwrap().len(), 2);
    assert_eq!(int(&h.apply(Operation::ConfirmNotifications { through: 1 })), 2);
    assert_eq!(pending_notifications(&h.store, None, 10).unwrap(), d.notifications);
    let e = h.send(&mut c, set("k", "3"), None);
    assert_eq!(e.notifications[0].seq, 3, "sequence numbers are never reused");
}

#[test]
fn a_duplicate_request_gets_the_stored_reply_and_is_applied_once() {
    let (mut h, mut c, mut w) = (Harness::new(), Client::new("c"), Client::new("w"));
    watched(&h.send(&mut w, watch("k"), None));
    c.clock.update_now(h.now, u64::MAX).unwrap();
    let request =
        statestore_protocol::Request::parse(&nx("k", "v").encode(), Some(&c.clock.to_string()), None).unwrap();
    let identity = h.identity(&c);
    let first = h.send_request(&c, request.clone(), Some(identity.clone()));
    let v = ok(&first);
    assert_eq!(first.notifications.len(), 1);
    h.advance(2_000);
    let again = h.send_request(&c, request.clone(), Some(identity.clone()));
    assert!(again.deduplicated);
    assert_eq!(again.reply, first.reply, "a redelivered NX answers +OK with the same __ts, not :-1");
    assert!(again.notifications.is_empty());
    // Another identity is another request.
    let other = h.identity(&c);
    let refused = h.send_request(&c, request.clone(), Some(other));
    assert_eq!(refused.reply.response, Response::Int(-1));
    assert_eq!(refused.reply.version, Some(v));
    // Errors are remembered too.
    let fenced = h.identity(&c);
    let skewed = statestore_protocol::Request::parse(
        &set("z", "v").encode(),
        Some(&Hlc::new(h.now + 120_000, 0, "c").to_string()),
        None,
    )
    .unwrap();
    let e1 = h.send_request(&c, skewed.clone(), Some(fenced.clone()));
    let e2 = h.send_request(&c, skewed, Some(fenced));
    assert_eq!(e1.reply, e2.reply);
    assert!(e2.deduplicated);
}

#[test]
fn dedup_entries_are_kept_for_message_expiry_plus_a_minute_then_ignored() {
    let (mut h, mut c) = (Harness::new(), Client::new("c"));
    c.clock.update_now(h.now, u64::MAX).unwrap();
    let request =
        statestore_protocol::Request::parse(&nx("k", "v").encode(), Some(&c.clock.to_string()), None).unwrap();
    let identity = h.identity(&c);
    ok(&h.send_request(&c, request.clone(), Some(identity.clone())));
    h.advance(10_000 + 60_000 - 1);
    assert!(h.send_request(&c, request.clone(), Some(identity.clone())).deduplicated);
    h.advance(1);
    // Expired: the request runs again, and NX now finds the key.
    let late = h.send_request(&c, request.clone(), Some(identity.clone()));
    assert!(!late.deduplicated);
    assert_eq!(late.reply.response, Response::Int(-1));
    use statestore_statemachine::Table;
    assert_eq!(h.store.len(Table::Dedup), 1, "the re-executed copy replaced the expired record");
    // Copies of it are now answered with the new reply while that is retained.
    h.advance(10_000 + 60_000 - 1);
    let again = h.send_request(&c, request, Some(identity));
    assert!(again.deduplicated);
    assert_eq!(again.reply, late.reply);
}

/// A message expiry of a year keeps its dedup record ten minutes plus the grace, not a year.
#[test]
fn dedup_retention_is_capped_whatever_the_message_expiry() {
    let (mut h, mut c) = (Harness::new(), Client::new("c"));
    c.clock.update_now(h.now, u64::MAX).unwrap();
    let request =
        statestore_protocol::Request::parse(&nx("k", "v").encode(), Some(&c.clock.to_string()), None).unwrap();
    let identity = h.identity(&c);
    let year = statestore_statemachine::ClientRequest {
        request: request.clone(),
        client_id: Some(c.id.clone()),
        identity: Some(identity),
        message_expiry_secs: Some(365 * 24 * 3600),
    };
    ok(&h.apply(Operation::Request(year.clone())));
    let cap = h.machine.config().max_dedup_retention_ms + h.machine.config().dedup_grace_ms;
    assert_eq!(cap, 11 * 60_000);
    h.advance(cap - 1);
    assert!(h.apply(Operation::Request(year.clone())).deduplicated);
    h.advance(1);
    let late = h.apply(Operation::Request(year));
    assert!(!late.deduplicated, "kept past the cap");
    assert_eq!(late.reply.response, Response::Int(-1));
}

/// Dedup records count against a byte budget: at the budget a write is refused with the quota
/// error and changes nothing (it could not be remembered), a copy of one already applied is
/// still answered from the table, and once records expire writes are taken again. Every
/// replica accounts the same.
#[test]
fn dedup_records_are_bounded_by_bytes() {
    let config = statestore_statemachine::Config { max_dedup_bytes: 2_000, ..Default::default() };
    let (mut h, mut c) = (Harness::with_config(config), Client::new("c"));
    let mut accepted = Vec::new();
    let refused = loop {
        let applied = h.send(&mut c, set("k", &format!("v{}", accepted.len())), None);
        if applied.reply.response != Response::Ok {
            break applied;
        }
        accepted.push(applied);
        assert!(accepted.len() < 100, "the budget never refused a write");
    };
    assert_eq!(refused.reply.response, Response::Error(StoreError::QuotaExceeded));
    let usage = statestore_statemachine::dedup::usage(&h.store).unwrap();
    assert!(usage.bytes >= 2_000 && usage.bytes < 2_000 + 200, "{usage:?}");
    assert_eq!(usage.records as usize, accepted.len());
    // The refused write changed nothing.
    let get = h.read(get("k"));
    assert_eq!(get.response, Response::Value(format!("v{}", accepted.len() - 1).into_bytes()));
    // Retention ends (10 s of message expiry and the minute's grace): writes are taken again.
    h.advance(10_000 + 60_000 + 1_000);
    ok(&h.send(&mut c, set("k", "later"), None));
    assert_eq!(statestore_statemachine::dedup::usage(&h.store).unwrap().records, 1);
}

#[test]
fn quotas_on_keys_and_bytes() {
    let config = statestore_statemachine::Config { max_keys: 2, max_bytes: 20, ..Default::default() };
    let (mut h, mut c) = (Harness::with_config(config), Client::new("c"));
    ok(&h.send(&mut c, set("a", "1"), None));
    ok(&h.send(&mut c, set("b", "1"), None));
    assert_eq!(error(&h.send(&mut c, set("c", "1"), None)), StoreError::QuotaExceeded);
    ok(&h.send(&mut c, set("a", "overwrite"), None));
    // a(1)+overwrite(9)+b(1)+1(1) = 12 bytes; a 10-byte value for b would make 21.
    assert_eq!(error(&h.send(&mut c, set("b", "1234567890"), None)), StoreError::QuotaExceeded);
    ok(&h.send(&mut c, set("b", "123456789"), None));
    ok(&h.send(&mut c, set("a", ""), None));
    assert_eq!(int(&h.send(&mut c, del("b"), None)), 1);
    ok(&h.send(&mut c, set("c", "1"), None));
    assert_eq!(statestore_statemachine::meta::key_count(&h.store).unwrap(), 2);
    assert_eq!(statestore_statemachine::meta::byte_count(&h.store).unwrap(), 3);
}

#[test]
fn expired_keys_free_their_quota_once_swept() {
    let config = statestore_statemachine::Config { max_keys: 1, ..Default::default() };
    let (mut h, mut c) = (Harness::with_config(config), Client::new("c"));
    let v = ok(&h.send(&mut c, set_px("a", "1", 10), None));
    h.advance(10);
    assert_eq!(int(&h.apply(Operation::Expire { key: b"a".to_vec(), version: v })), 1);
    ok(&h.send(&mut c, set("b", "1"), None));
}

impl Harness {
    fn machine_due(&self) -> Vec<Vec<u8>> {
        let now = self.machine.now(&self.store, self.now).unwrap();
        statestore_statemachine::keyspace::due_keys(&self.store, now, 100).unwrap().into_iter().map(|d| d.key).collect()
    }
}

#[test]
fn large_registration_drops_and_confirmations_cross_many_pages() {
    use statestore_statemachine::watch::pending_notifications;
    let (mut h, mut c) = (Harness::new(), Client::new("c"));
    for i in 0..600 {
        watched(&h.send(&mut c, watch(&format!("k{i}")), None));
    }
    for i in 0..600 {
        ok(&h.send(&mut c, set(&format!("k{i}"), "v"), None));
    }
    assert_eq!(pending_notifications(&h.store, None, 10_000).unwrap().len(), 600);
    assert_eq!(int(&h.apply(Operation::ConfirmNotifications { through: 549 })), 550);
    assert_eq!(pending_notifications(&h.store, None, 10_000).unwrap().len(), 50);
    assert_eq!(int(&h.apply(Operation::DropRegistrations { client_id: "c".into() })), 600);
    assert!(h.send(&mut c, set("k1", "w"), None).notifications.is_empty());
}

#[test]
fn registrations_beyond_a_clients_quota_or_the_total_are_refused() {
    use statestore_statemachine::RegistrationLimits;
    let registrations = RegistrationLimits { total: 5, per_client: 3 };
    let config = statestore_statemachine::Config { registrations, ..Default::default() };
    let (mut h, mut a, mut b) = (Harness::with_config(config), Client::new("a"), Client::new("b"));
    for key in ["k1", "k2", "k3"] {
        watched(&h.send(&mut a, watch(key), None));
    }
    assert_eq!(error(&h.send(&mut a, watch("k4"), None)), StoreError::QuotaExceeded, "a's own quota");
    watched(&h.send(&mut a, watch("k1"), None));
    watched(&h.send(&mut b, watch("k1"), None));
    watched(&h.send(&mut b, watch("k2"), None));
    assert_eq!(error(&h.send(&mut b, watch("k3"), None)), StoreError::QuotaExceeded, "the total");
    // A STOP frees a place for its client and in the total; dropping a client frees all of its.
    assert_eq!(h.send(&mut a, stop("k1"), None).reply.response, Response::Ok);
    watched(&h.send(&mut a, watch("k4"), None));
    assert_eq!(int(&h.apply(Operation::DropRegistrations { client_id: "a".into() })), 3);
    for key in ["k5", "k6", "k7"] {
        watched(&h.send(&mut a, watch(key), None));
    }
    assert_eq!(error(&h.send(&mut b, watch("k9"), None)), StoreError::QuotaExceeded);
    assert_eq!(notified(&h.send(&mut b, set("k1", "v"), None)).len(), 1, "a refused registration notifies nobody");
}

#[test]
fn one_change_seen_by_many_watchers_is_stored_once_and_shared() {
    use statestore_statemachine::watch::pending_notifications;
    use statestore_statemachine::{StorageRead, Table};
    const WATCHERS: usize = 200;
    let mut h = Harness::new();
    let mut clients: Vec<Client> = (0..WATCHERS).map(|i| Client::new(&format!("watcher-{i:03}"))).collect();
    for client in &mut clients {
        watched(&h.send(client, watch("k"), None));
    }
    let value = "x".repeat(256 << 10);
    let applied = h.send(&mut clients[0], set("k", &value), None);
    let outbox_bytes: usize =
        h.store.scan(Table::Outbox, &[], None, usize::MAX).unwrap().iter().map(|(k, v)| k.len() + v.len()).sum();
    assert!(outbox_bytes < value.len() + 64 * WATCHERS, "{outbox_bytes} bytes stored for one change");
    assert_eq!(applied.notifications.len(), WATCHERS);
    let values: Vec<_> = applied
        .notifications
        .iter()
        .map(|e| match &e.notification.notification {
            Notification::Set { value } => value.as_ptr(),
            Notification::Delete => panic!("a SET notifies SET"),
        })
        .collect();
    assert!(values.iter().all(|v| *v == values[0]), "every watcher's notification shares one value");
    let pending = pending_notifications(&h.store, None, 10).unwrap();
    assert_eq!(pending, applied.notifications, "read back from the outbox, one entry per watcher");
    let first = applied.notifications[0].seq;
    // Confirming part of a change keeps the rest of it pending.
    assert_eq!(int(&h.apply(Operation::ConfirmNotifications { through: first + 10 })), 0);
    assert_eq!(pending_notifications(&h.store, Some(first + 10), 10).unwrap(), applied.notifications[11..]);
    let last = first + WATCHERS as u64 - 1;
    assert_eq!(int(&h.apply(Operation::ConfirmNotifications { through: last })), WATCHERS as i64);
    assert!(pending_notifications(&h.store, None, 10).unwrap().is_empty());
}
