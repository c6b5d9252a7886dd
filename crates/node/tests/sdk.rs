//! SDK conformance: the official Rust SDK crates (`azure_iot_operations_services` 1.5.0-beta1
//! with `state_store` and `leased_lock`, over `azure_iot_operations_mqtt`) drive a three-node
//! cluster through a real Mosquitto broker, and every result the SDK hands back is checked.
//!
//! The behaviours are those of PROTOCOL.md §15.2 (R1–R32) plus the SCAN rules of §13. A cluster
//! is expensive, so each test starts one broker and one cluster and runs several scenarios on
//! distinct keys. Anything that waits for the server (notifications, a blocked `lock`) is under a
//! timeout, so a missing behaviour is a panic that says what was expected, never a hang. On a
//! failure the node and broker logs are printed.

mod common;

use std::collections::BTreeSet;
use std::fmt::{Debug, Display};
use std::future::Future;
use std::mem::discriminant;
use std::panic::AssertUnwindSafe;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use azure_iot_operations_mqtt::control_packet::{DeliveryQoS, Publish, TopicFilter};
use azure_iot_operations_protocol::common::hybrid_logical_clock::HybridLogicalClock as Hlc;
use azure_iot_operations_services::leased_lock::{self, lock};
use azure_iot_operations_services::state_store::{
    self, KeyNotification, KeyObservation, Operation, ServiceError, SetCondition, SetOptions,
};
use common::broker::Broker;
use common::sdk::{hex_upper, lease_client, lock_client, notification_filter, unique_client_id, SdkSession};
use common::Cluster;
use futures::FutureExt;
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout};

/// Request timeout handed to every SDK call (the SDK rounds it up to whole seconds).
const TIMEOUT: Duration = Duration::from_secs(10);
/// How long a notification that is due may take to arrive.
const NOTIFY_WAIT: Duration = Duration::from_secs(5);
/// How early an expiry may appear to fire, measured from before the request was sent. The
/// server starts the clock when it applies the SET, so this only absorbs timer granularity.
const EXPIRY_SLACK: Duration = Duration::from_millis(100);
/// How late an expiry may be noticed: the server sends expiry DELETEs within ~250 ms of the
/// deadline; the rest is for a loaded test machine.
const EXPIRY_LATENESS: Duration = Duration::from_secs(2);

const NOTIFY_SET_PREFIX: &[u8] = b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n";
const NOTIFY_DELETE: &[u8] = b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n";
const NOTIFY_TOPIC_PREFIX: &str = "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8";

// ---------------------------------------------------------------------------------------------
// State store: commands (R1–R15), notifications (R16–R21), PX expiry, shutdown (R22)
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sdk_state_store_commands_and_key_notifications() {
    let (broker, cluster) = start().await;
    let port = broker.port;
    with_logs(&broker, &cluster, async move {
        let session = SdkSession::connect(port, &unique_client_id("sdk-store")).await;
        let store = Store(session.state_store());

        set_get_del_without_tokens(&store).await;
        fencing_tokens_guard_set_del_and_vdel(&store).await;
        nx_and_nex_conditions(&store).await;
        nex_with_fencing_token_and_vdel(&store).await;
        observe_missing_key_then_set_then_stop(&store).await;
        observe_existing_key_then_del(&store).await;
        unobserve_without_observe(&store).await;
        observe_stop_observe_stop(&store).await;
        notifications_only_while_observed(&session, &store).await;
        every_observer_is_notified(port, &store).await;
        px_expiry_sends_delete_and_frees_the_key(&store).await;
        shutdown_right_after_connect(port).await;

        ok(store.0.shutdown().await, "shutting the state store client down");
        session.close().await;
    })
    .await;
}

/// R1, R2, R9, R10, and the versions GET reports.
async fn set_get_del_without_tokens(s: &Store) {
    let key = "plain";
    let miss = ok(s.get(key).await, "R9: GET on a never-set key");
    assert_eq!(miss.response, None, "R9: expected GET on a never-set key to return None ($-1)");
    assert!(miss.version.is_none(), "expected a GET miss to carry no __ts, got {:?}", miss.version);

    let first = ok(s.set(key, "value1", None, plain()).await, "R1: SET on a new key");
    assert!(first.response, "R1: expected SET on a new key to return true (+OK)");
    let v1 = first.version.expect("R1: expected SET +OK to carry the key's new version in __ts");
    let second = ok(s.set(key, "value2", None, plain()).await, "R1: SET on an existing key");
    assert!(second.response, "R1: expected SET on an existing key to return true (+OK)");
    let v2 = second.version.expect("R1: expected SET +OK to carry the key's new version in __ts");
    assert_newer(&v1, &v2, "expected a second SET to return a newer version");

    let hit = ok(s.get(key).await, "GET on an existing key");
    assert_eq!(hit.response, Some(b"value2".to_vec()), "expected GET to return the last value set");
    assert_eq!(hit.version.as_ref(), Some(&v2), "expected GET to return the last SET's version in __ts");

    let deleted = ok(s.del(key, None).await, "R2: DEL on an existing key");
    assert_eq!(deleted.response, 1, "R2: expected DEL on an existing key to return 1");
    let absent = ok(s.del(key, None).await, "R2: DEL on a missing key");
    assert_eq!(absent.response, 0, "R2: expected DEL on a missing key to return 0");
    let gone = ok(s.get(key).await, "GET after DEL");
    assert_eq!(gone.response, None, "expected GET after DEL to return None");
    let vdel = ok(s.vdel(key, "value2", None).await, "R10: VDEL on a missing key");
    assert_eq!(vdel.response, 0, "R10: expected VDEL on a missing key to return 0");
}

/// R3–R8, a token lower than the stored one, and deletion discarding the token.
async fn fencing_tokens_guard_set_del_and_vdel(s: &Store) {
    let key = "fenced";
    let older = older_client_hlc();
    let first = ok(s.set(key, "value3", Some(&older), px(10_000)).await, "R3: SET with __ft on an unfenced key");
    assert!(first.response, "R3: expected SET with __ft on an unfenced key to return true");
    let v1 = first.version.expect("R3: expected the fencing SET to return the key's version in __ts");

    let second = ok(s.set(key, "value4", Some(&v1), px(10_000)).await, "R4: SET with __ft = the returned version");
    assert!(second.response, "R4: expected SET with __ft equal to the version just returned to return true");
    let v2 = second.version.expect("R4: expected SET +OK to carry a new version in __ts");
    assert_newer(&v1, &v2, "R4: expected the second fenced SET to return a newer version");

    let unfenced = s.set(key, "value5", None, plain()).await;
    assert_service_error(unfenced, ServiceError::MissingFencingToken, "R5: SET without __ft on a fenced key");
    let read = ok(s.get(key).await, "R6: GET without __ft on a fenced key");
    assert_eq!(read.response, Some(b"value4".to_vec()), "R6: expected GET without __ft to return value4");
    assert_service_error(s.del(key, None).await, ServiceError::MissingFencingToken, "R7: DEL without __ft");
    assert_service_error(
        s.vdel(key, "value4", None).await,
        ServiceError::MissingFencingToken,
        "R7: VDEL with the matching value but without __ft",
    );
    assert_service_error(
        s.set(key, "value6", Some(&older), plain()).await,
        ServiceError::FencingTokenLowerVersion,
        "SET with an __ft older than the stored token",
    );
    assert_service_error(
        s.del(key, Some(&older)).await,
        ServiceError::FencingTokenLowerVersion,
        "DEL with an __ft older than the stored token",
    );
    let unchanged = ok(s.get(key).await, "GET after refused writes");
    assert_eq!(unchanged.response, Some(b"value4".to_vec()), "expected refused writes to leave value4 in place");

    let deleted = ok(s.del(key, Some(&v2)).await, "R8: DEL with the latest token");
    assert_eq!(deleted.response, 1, "R8: expected DEL with the latest token to return 1");

    // Deleting a key discards its token: it can be recreated and deleted without one.
    let recreated = ok(s.set(key, "value7", None, plain()).await, "SET without __ft after the fenced key was deleted");
    assert!(recreated.response, "expected SET without __ft to succeed once the fenced key was deleted");
    let deleted = ok(s.del(key, None).await, "DEL without __ft on the recreated key");
    assert_eq!(deleted.response, 1, "expected DEL without __ft on the recreated, unfenced key to return 1");
}

/// R11–R13, a failed condition changing nothing, and NEX renewal returning a newer version.
async fn nx_and_nex_conditions(s: &Store) {
    let key = "conditional";
    let nx = ok(s.set(key, "value1", None, when(SetCondition::OnlyIfDoesNotExist, Some(10_000))).await, "R11");
    assert!(nx.response, "R11: expected SET NX PX on a missing key to return true");
    let v1 = nx.version.expect("R11: expected SET NX +OK to carry the key's version");

    let refused = ok(s.set(key, "other", None, when(SetCondition::OnlyIfDoesNotExist, None)).await, "R11: NX again");
    assert!(!refused.response, "R11: expected SET NX on an existing key to return false (:-1), not an error");
    assert!(refused.version.is_some(), "expected a not-applied SET (:-1) to carry __ts (.NET requires it)");
    let read = ok(s.get(key).await, "GET after a refused NX");
    assert_eq!(read.response, Some(b"value1".to_vec()), "expected a refused SET NX to change nothing");

    let nex = ok(s.set(key, "value1", None, when(SetCondition::OnlyIfEqualOrDoesNotExist, None)).await, "R12");
    assert!(nex.response, "R12: expected SET NEX with the equal value on an existing key to return true");
    let v2 = nex.version.expect("R12: expected SET NEX +OK to carry a version");
    assert_newer(&v1, &v2, "expected a successful NEX renewal to return a strictly newer version");
    let differ = ok(s.set(key, "value2", None, when(SetCondition::OnlyIfEqualOrDoesNotExist, None)).await, "R12");
    assert!(!differ.response, "R12: expected SET NEX with a different value to return false (:-1)");
    let read = ok(s.get(key).await, "GET after a refused NEX");
    assert_eq!(read.response, Some(b"value1".to_vec()), "expected a refused SET NEX to change nothing");

    let vdel = ok(s.vdel(key, "value1", None).await, "R13: VDEL with the matching value on an unfenced key");
    assert_eq!(vdel.response, 1, "R13: expected VDEL with the matching value and no __ft to return 1");

    let fresh = ok(s.set(key, "value3", None, when(SetCondition::OnlyIfEqualOrDoesNotExist, None)).await, "NEX");
    assert!(fresh.response, "expected SET NEX on a missing key to return true");
    let mismatch = ok(s.vdel(key, "not-value3", None).await, "VDEL with a different value");
    assert_eq!(mismatch.response, -1, "expected VDEL with a different value to return -1 and keep the key");
    let deleted = ok(s.del(key, None).await, "DEL");
    assert_eq!(deleted.response, 1, "expected the key to survive the mismatched VDEL, DEL to return 1");
}

/// R14, R15: NEX with a token fences the key it creates; VDEL checks the token then the value.
async fn nex_with_fencing_token_and_vdel(s: &Store) {
    let key = "fenced-nex";
    let token = older_client_hlc();
    let created =
        ok(s.set(key, "holder", Some(&token), when(SetCondition::OnlyIfEqualOrDoesNotExist, None)).await, "R14");
    assert!(created.response, "R14: expected SET NEX with __ft on a missing key to return true");
    let version = created.version.expect("R14: expected SET NEX +OK with __ft to carry the key's version");

    assert_service_error(
        s.vdel(key, "holder", None).await,
        ServiceError::MissingFencingToken,
        "VDEL without __ft on a key created by SET NEX with __ft",
    );
    let mismatch = ok(s.vdel(key, "someone-else", Some(&version)).await, "R15: VDEL, wrong value, valid __ft");
    assert_eq!(mismatch.response, -1, "R15: expected VDEL with a wrong value and a valid __ft to return -1");
    let deleted = ok(s.vdel(key, "holder", Some(&version)).await, "R15: VDEL, right value, valid __ft");
    assert_eq!(deleted.response, 1, "R15: expected VDEL with the right value and a valid __ft to return 1");
    let gone = ok(s.get(key).await, "GET after VDEL");
    assert_eq!(gone.response, None, "expected the key to be gone after VDEL returned 1");
}

/// R16, R17: observe a missing key, SET it, STOP at once: exactly one SET notification, and it
/// arrives before STOP returns (the SDK closes the observation when STOP succeeds).
async fn observe_missing_key_then_set_then_stop(s: &Store) {
    let key = "notify-set";
    let observation = ok(s.0.observe(k(key), TIMEOUT).await, "R16: KEYNOTIFY on a missing key").response;
    let collector = collect(observation);
    let set = ok(s.set(key, "value1", None, plain()).await, "SET on the observed key");
    assert!(set.response, "expected SET on the observed key to return true");
    let stopped = ok(s.0.unobserve(k(key), TIMEOUT).await, "R17: KEYNOTIFY STOP on an observed key");
    assert!(stopped.response, "R17: expected KEYNOTIFY STOP on an observed key to return true (+OK)");

    let got = collected(collector, "R16").await;
    assert_eq!(
        describe(&got),
        ["SET value1"],
        "R16: expected exactly one SET notification, published before the STOP response"
    );
    assert_eq!(got[0].key, k(key), "expected the notification to name the observed key");
    assert_eq!(
        Some(&got[0].version),
        set.version.as_ref(),
        "expected the SET notification's __ts to be the SET's version"
    );
    ok(s.del(key, None).await, "cleanup DEL");
}

/// R18: observe an existing key, DEL it: exactly one DELETE notification.
async fn observe_existing_key_then_del(s: &Store) {
    let key = "notify-del";
    assert!(ok(s.set(key, "value1", None, plain()).await, "SET").response, "expected the SET to return true");
    let observation = ok(s.0.observe(k(key), TIMEOUT).await, "R18: KEYNOTIFY on an existing key").response;
    let collector = collect(observation);
    let deleted = ok(s.del(key, None).await, "DEL on the observed key");
    assert_eq!(deleted.response, 1, "expected DEL on the observed key to return 1");
    assert!(ok(s.0.unobserve(k(key), TIMEOUT).await, "STOP").response, "expected STOP to return true");
    let got = collected(collector, "R18").await;
    assert_eq!(describe(&got), ["DELETE"], "R18: expected exactly one DELETE notification for the DEL");
}

/// R19: STOP on a key that was never observed returns false (:0).
async fn unobserve_without_observe(s: &Store) {
    let stopped = ok(s.0.unobserve(k("never-observed"), TIMEOUT).await, "R19: STOP on an unobserved key");
    assert!(!stopped.response, "R19: expected KEYNOTIFY STOP on an unobserved key to return false (:0)");
}

/// R20: observe, STOP, observe, STOP all succeed; a second observe while observing is refused
/// by the SDK itself.
async fn observe_stop_observe_stop(s: &Store) {
    let key = "reobserved";
    let _first = ok(s.0.observe(k(key), TIMEOUT).await, "R20: first observe");
    match s.0.observe(k(key), TIMEOUT).await {
        Err(e) if matches!(e.kind(), state_store::ErrorKind::DuplicateObserve) => {}
        other => {
            panic!("R20: expected a second observe of an observed key to fail with DuplicateObserve, got {other:?}")
        }
    }
    assert!(ok(s.0.unobserve(k(key), TIMEOUT).await, "R20: first STOP").response, "R20: expected STOP to return true");
    let _second = ok(s.0.observe(k(key), TIMEOUT).await, "R20: observe again after STOP");
    assert!(ok(s.0.unobserve(k(key), TIMEOUT).await, "R20: second STOP").response, "R20: expected STOP to return true");
}

/// R21: SET v1, DEL, observe, SET v2, DEL, SET v3, STOP, SET v4, DEL gives exactly SET(v2),
/// DELETE, SET(v3). A raw MQTT receiver on the same session also checks the wire: the
/// uppercase-hex topic, QoS 1, `__ts`, the exact payloads, and nothing published after STOP.
async fn notifications_only_while_observed(session: &SdkSession, s: &Store) {
    let key = "observed-window";
    let topic = format!(
        "{NOTIFY_TOPIC_PREFIX}/{}/command/notify/{}",
        hex_upper(session.client_id.as_bytes()),
        hex_upper(key.as_bytes())
    );
    let filter = TopicFilter::new(notification_filter(&session.client_id)).expect("a valid topic filter");
    let tap = wire_tap(session.client.create_filtered_pub_receiver(filter));

    assert!(ok(s.set(key, "value1", None, px(10_000)).await, "SET v1").response, "expected SET v1 to return true");
    assert_eq!(ok(s.del(key, None).await, "DEL").response, 1, "expected DEL of v1 to return 1");
    let observation = ok(s.0.observe(k(key), TIMEOUT).await, "R21: observe").response;
    let collector = collect(observation);
    assert!(ok(s.set(key, "value2", None, px(10_000)).await, "SET v2").response, "expected SET v2 to return true");
    assert_eq!(ok(s.del(key, None).await, "DEL").response, 1, "expected DEL of v2 to return 1");
    assert!(ok(s.set(key, "value3", None, plain()).await, "SET v3").response, "expected SET v3 to return true");
    assert!(ok(s.0.unobserve(k(key), TIMEOUT).await, "R21: STOP").response, "expected STOP to return true");
    assert!(ok(s.set(key, "value4", None, plain()).await, "SET v4").response, "expected SET v4 to return true");
    assert_eq!(ok(s.del(key, None).await, "DEL").response, 1, "expected DEL of v4 to return 1");

    let got = collected(collector, "R21").await;
    assert_eq!(
        describe(&got),
        ["SET value2", "DELETE", "SET value3"],
        "R21: expected exactly SET(value2), DELETE, SET(value3) in order: nothing before KEYNOTIFY or after STOP"
    );

    // Give a wrongly registered key time to show up on the wire, then look at what was sent.
    sleep(Duration::from_secs(1)).await;
    let wire: Vec<Publish> = tap.stop().await.into_iter().filter(|p| p.topic_name.as_str() == topic).collect();
    let payloads: Vec<String> = wire.iter().map(|p| String::from_utf8_lossy(&p.payload).into_owned()).collect();
    let expected: Vec<String> = [set_notification(b"value2"), NOTIFY_DELETE.to_vec(), set_notification(b"value3")]
        .iter()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    assert_eq!(payloads, expected, "expected exactly these notification payloads on {topic}, none after STOP");
    for publish in &wire {
        assert!(matches!(publish.qos, DeliveryQoS::AtLeastOnce(_)), "expected notifications at QoS 1");
        let ts = user_property(publish, "__ts").expect("expected every notification to carry __ts");
        assert!(Hlc::from_str(ts).is_ok(), "expected the notification __ts {ts:?} to be a well-formed HLC");
        let content_type = publish.properties.content_type.as_deref();
        assert!(
            matches!(content_type, None | Some("application/octet-stream")),
            "expected no content type or application/octet-stream on notifications, got {content_type:?}"
        );
    }
}

/// Registrations are per client: two clients observing one key both get its notification.
async fn every_observer_is_notified(port: u16, s: &Store) {
    let key = "watched-by-two";
    let peer = SdkSession::connect(port, &unique_client_id("sdk-store-peer")).await;
    let peer_store = Store(peer.state_store());
    let mine = collect(ok(s.0.observe(k(key), TIMEOUT).await, "observe by the first client").response);
    let theirs = collect(ok(peer_store.0.observe(k(key), TIMEOUT).await, "observe by the second client").response);
    assert!(ok(s.set(key, "value1", None, plain()).await, "SET").response, "expected the SET to return true");
    assert!(ok(s.0.unobserve(k(key), TIMEOUT).await, "STOP").response, "expected STOP to return true");
    assert!(ok(peer_store.0.unobserve(k(key), TIMEOUT).await, "STOP").response, "expected STOP to return true");
    let mine = collected(mine, "first observer").await;
    let theirs = collected(theirs, "second observer").await;
    assert_eq!(describe(&mine), ["SET value1"], "expected the writing observer to get exactly one SET notification");
    assert_eq!(describe(&theirs), ["SET value1"], "expected the other observer to get exactly one SET notification");
    ok(s.del(key, None).await, "cleanup DEL");
    ok(peer_store.0.shutdown().await, "shutting the peer's state store client down");
    peer.close().await;
}

/// PX: the key expires on time with a DELETE notification, GET misses, NX succeeds again; a
/// refused NX sends no notification.
async fn px_expiry_sends_delete_and_frees_the_key(s: &Store) {
    let key = "expiring";
    let lifetime = Duration::from_millis(1500);
    let mut observation = ok(s.0.observe(k(key), TIMEOUT).await, "observe a missing key").response;
    let sent = Instant::now();
    let set = ok(s.set(key, "value1", None, px(lifetime.as_millis() as u64)).await, "SET PX 1500");
    assert!(set.response, "expected SET PX on a missing key to return true");
    let first = next_notification(&mut observation, NOTIFY_WAIT, "SET PX").await;
    assert_eq!(describe(&[first]), ["SET value1"], "expected a SET notification for the SET PX");

    let expired = next_notification(&mut observation, lifetime + NOTIFY_WAIT, "PX expiry").await;
    let elapsed = sent.elapsed();
    assert_eq!(describe(&[expired]), ["DELETE"], "expected the expiry to send a DELETE notification");
    assert!(
        elapsed + EXPIRY_SLACK >= lifetime,
        "expected the key to live its PX of {lifetime:?}, it expired after {elapsed:?}"
    );
    assert!(
        elapsed <= lifetime + EXPIRY_LATENESS,
        "expected the expiry DELETE soon after {lifetime:?}, got it after {elapsed:?}"
    );
    let gone = ok(s.get(key).await, "GET after expiry");
    assert_eq!(gone.response, None, "expected GET to miss after the key expired");

    let again = ok(s.set(key, "value2", None, when(SetCondition::OnlyIfDoesNotExist, None)).await, "NX after expiry");
    assert!(again.response, "expected SET NX to succeed on an expired key");
    let renotified = next_notification(&mut observation, NOTIFY_WAIT, "SET NX after expiry").await;
    assert_eq!(describe(&[renotified]), ["SET value2"], "expected a SET notification for the NX after expiry");
    let refused = ok(s.set(key, "value3", None, when(SetCondition::OnlyIfDoesNotExist, None)).await, "NX");
    assert!(!refused.response, "expected SET NX on the existing key to return false");
    assert_eq!(ok(s.del(key, None).await, "DEL").response, 1, "expected DEL to return 1");
    let next = next_notification(&mut observation, NOTIFY_WAIT, "DEL after a refused NX").await;
    assert_eq!(describe(&[next]), ["DELETE"], "expected DELETE next: a refused SET NX sends no notification");
    assert!(ok(s.0.unobserve(k(key), TIMEOUT).await, "STOP").response, "expected STOP to return true");
    let rest = collected(collect(observation), "expiry observation").await;
    assert_eq!(describe(&rest), Vec::<String>::new(), "expected no further notifications for the key");
}

/// R22: a client shut down right after connecting.
async fn shutdown_right_after_connect(port: u16) {
    let session = SdkSession::connect(port, &unique_client_id("sdk-shutdown")).await;
    let store = session.state_store();
    ok(store.shutdown().await, "R22: shutting a state store client down right after connecting");
    session.close().await;
}

// ---------------------------------------------------------------------------------------------
// Leases (R23–R29) and locks (R30–R32)
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sdk_leases_and_locks() {
    let (broker, cluster) = start().await;
    let port = broker.port;
    with_logs(&broker, &cluster, async move {
        let a = SdkSession::connect(port, &unique_client_id("sdk-holder-a")).await;
        let b = SdkSession::connect(port, &unique_client_id("sdk-holder-b")).await;
        let holders =
            Holders { a_id: a.client_id.clone(), a: a.state_store(), b_id: b.client_id.clone(), b: b.state_store() };

        lease_acquire_and_release(&holders).await;
        lease_contended_until_released(&holders).await;
        lease_auto_renewal(&holders).await;
        lease_expires_when_not_released(&holders).await;
        lease_outlives_disconnected_holder(port, &holders).await;
        lease_released_twice(&holders).await;
        observe_missing_lease(&holders).await;
        lock_and_unlock(&holders).await;
        lock_auto_renewal(&holders).await;
        lock_waiter_wakes_on_release(&holders).await;
        lock_waiter_wakes_on_expiry(&holders).await;

        ok(holders.a.shutdown().await, "shutting holder A's state store client down");
        ok(holders.b.shutdown().await, "shutting holder B's state store client down");
        a.close().await;
        b.close().await;
    })
    .await;
}

/// Two sessions, each with a state store client; holder names are the client ids.
struct Holders {
    a_id: String,
    a: Arc<state_store::Client>,
    b_id: String,
    b: Arc<state_store::Client>,
}

/// R23: acquire a free lease, see the holder, release.
async fn lease_acquire_and_release(h: &Holders) {
    let lease = lease_client(&h.a, "lease-single", &h.a_id);
    let token = ok(lease.acquire(secs(10), TIMEOUT, None).await, "R23: acquiring a free lease (SET NEX PX)");
    assert_eq!(lease.current_lease_fencing_token(), Some(token), "R23: expected the client to keep the token");
    let holder = ok(lease.get_holder(TIMEOUT).await, "R23: get_holder");
    assert_eq!(holder, Some(h.a_id.as_bytes().to_vec()), "R23: expected GET on the lease to return the holder");
    ok(lease.release(TIMEOUT).await, "releasing the lease (VDEL)");
    assert_eq!(lease.current_lease_fencing_token(), None, "expected release to clear the token");
    assert_eq!(ok(lease.get_holder(TIMEOUT).await, "get_holder"), None, "expected no holder after release");
}

/// R24: a second holder is refused while the lease is held and gets it after the release;
/// re-acquiring by the holder returns a strictly newer token.
async fn lease_contended_until_released(h: &Holders) {
    let name = "lease-contended";
    let first = lease_client(&h.a, name, &h.a_id);
    let second = lease_client(&h.b, name, &h.b_id);
    let token1 = ok(first.acquire(secs(10), TIMEOUT, None).await, "R24: first holder acquires");
    let token2 = ok(first.acquire(secs(10), TIMEOUT, None).await, "first holder re-acquires (SET NEX, same value)");
    assert_newer(&token1, &token2, "expected re-acquiring by the holder to return a strictly newer token");

    assert_already_held(second.acquire(secs(10), TIMEOUT, None).await, "R24: second holder while held");
    let holder = ok(second.get_holder(TIMEOUT).await, "get_holder");
    assert_eq!(holder, Some(h.a_id.as_bytes().to_vec()), "expected the refused attempt to leave the first holder");

    ok(first.release(TIMEOUT).await, "R24: first holder releases");
    let token3 = ok(second.acquire(secs(10), TIMEOUT, None).await, "R24: second holder acquires after the release");
    assert_newer(&token2, &token3, "expected the new holder's token to be newer than the previous holder's");
    let holder = ok(second.get_holder(TIMEOUT).await, "get_holder");
    assert_eq!(holder, Some(h.b_id.as_bytes().to_vec()), "expected the second holder to hold the lease");
    ok(second.release(TIMEOUT).await, "second holder releases");
}

/// R25: auto-renewal replaces the token with a later timestamp, the same node id, and the same
/// counter; it stops at release.
async fn lease_auto_renewal(h: &Holders) {
    let lease = lease_client(&h.a, "lease-renewed", &h.a_id);
    let token1 = ok(lease.acquire(secs(3), TIMEOUT, Some(secs(1))).await, "R25: acquire with a 1 s renewal");
    let token2 = renewed_token(|| lease.current_lease_fencing_token(), &token1, "R25: first renewal").await;
    let token3 = renewed_token(|| lease.current_lease_fencing_token(), &token2, "R25: second renewal").await;
    assert!(token1.timestamp < token2.timestamp, "R25: expected a later timestamp: {token1} then {token2}");
    assert!(token2.timestamp < token3.timestamp, "R25: expected a later timestamp: {token2} then {token3}");
    assert_eq!(token1.node_id, token2.node_id, "R25: expected renewals to keep the node id");
    assert_eq!(token2.node_id, token3.node_id, "R25: expected renewals to keep the node id");
    assert_eq!(token2.counter, token3.counter, "R25: expected renewals to keep the counter: {token2} then {token3}");
    let holder = ok(lease.get_holder(TIMEOUT).await, "get_holder");
    assert_eq!(holder, Some(h.a_id.as_bytes().to_vec()), "expected the renewing client to hold the lease");

    ok(lease.release(TIMEOUT).await, "release stops the renewal");
    sleep(Duration::from_millis(1500)).await;
    assert_eq!(ok(lease.get_holder(TIMEOUT).await, "get_holder"), None, "expected no renewal after release");
}

/// R26: an unreleased lease expires on time and a second holder then acquires it.
async fn lease_expires_when_not_released(h: &Holders) {
    let name = "lease-expiring";
    let lifetime = secs(3);
    let first = lease_client(&h.a, name, &h.a_id);
    let second = lease_client(&h.b, name, &h.b_id);
    let started = Instant::now();
    ok(first.acquire(lifetime, TIMEOUT, None).await, "R26: first holder acquires for 3 s");
    assert_already_held(second.acquire(lifetime, TIMEOUT, None).await, "R26: second holder right away");
    sleep_until(started + secs(2)).await;
    assert_already_held(second.acquire(lifetime, TIMEOUT, None).await, "R26: second holder 2 s into the 3 s lease");

    let deadline = started + lifetime + EXPIRY_LATENESS;
    loop {
        match second.acquire(lifetime, TIMEOUT, None).await {
            Ok(_) => break,
            Err(e) if matches!(e.kind(), leased_lock::ErrorKind::LeaseAlreadyHeld) => {}
            Err(e) => panic!("R26: expected the second holder's attempt to succeed or be refused, got {e:?}"),
        }
        assert!(
            Instant::now() < deadline,
            "R26: expected the unreleased 3 s lease to expire within {:?}",
            deadline - started
        );
        sleep(Duration::from_millis(100)).await;
    }
    let elapsed = started.elapsed();
    assert!(elapsed + EXPIRY_SLACK >= lifetime, "R26: expected the lease to last 3 s, it was free after {elapsed:?}");
    let holder = ok(second.get_holder(TIMEOUT).await, "get_holder");
    assert_eq!(holder, Some(h.b_id.as_bytes().to_vec()), "expected the second holder to hold the expired lease");
    ok(second.release(TIMEOUT).await, "second holder releases");
}

/// R27: the holder disconnects; the lease survives until its expiry, and an observer that started
/// 1 s in gets the expiry DELETE.
async fn lease_outlives_disconnected_holder(port: u16, h: &Holders) {
    let name = "lease-orphaned";
    let lifetime = secs(4);
    let leaver = SdkSession::connect(port, &unique_client_id("sdk-leaver")).await;
    let leaver_store = leaver.state_store();
    let leaver_lease = lease_client(&leaver_store, name, &leaver.client_id);
    let started = Instant::now();
    ok(leaver_lease.acquire(lifetime, TIMEOUT, None).await, "R27: the leaving holder acquires for 4 s");
    let leaver_id = leaver.client_id.clone();
    drop(leaver_lease);
    ok(leaver_store.shutdown().await, "shutting the leaving holder's client down");
    leaver.close().await;

    let observer = lease_client(&h.b, name, &h.b_id);
    let holder = ok(observer.get_holder(TIMEOUT).await, "get_holder after the holder disconnected");
    assert_eq!(holder, Some(leaver_id.into_bytes()), "R27: expected the lease to survive its holder's disconnection");
    sleep_until(started + secs(1)).await;
    let mut observation = ok(observer.observe(TIMEOUT).await, "R27: observing the held lease 1 s in");
    let expired = next_notification(&mut observation, NOTIFY_WAIT, "R27: lease expiry").await;
    let elapsed = started.elapsed();
    assert_eq!(describe(&[expired]), ["DELETE"], "R27: expected a DELETE notification when the lease expired");
    assert!(elapsed + EXPIRY_SLACK >= lifetime, "R27: expected the lease to last 4 s, it expired after {elapsed:?}");
    assert_eq!(ok(observer.get_holder(TIMEOUT).await, "get_holder"), None, "expected no holder after expiry");
    assert!(ok(observer.unobserve(TIMEOUT).await, "unobserve"), "expected unobserving the lease to return true");
}

/// R28: releasing twice is not an error; the VDELs behind it answer 1, then 0.
async fn lease_released_twice(h: &Holders) {
    let name = "lease-released-twice";
    let lease = lease_client(&h.a, name, &h.a_id);
    ok(lease.acquire(secs(10), TIMEOUT, None).await, "acquire");
    ok(lease.release(TIMEOUT).await, "R28: first release");
    ok(lease.release(TIMEOUT).await, "R28: second release of a lease no longer held");

    ok(lease.acquire(secs(10), TIMEOUT, None).await, "acquire again");
    let first = ok(h.a.vdel(k(name), h.a_id.as_bytes().to_vec(), None, TIMEOUT).await, "R28: first VDEL");
    assert_eq!(first.response, 1, "R28: expected the holder's first VDEL to return 1");
    let second = ok(h.a.vdel(k(name), h.a_id.as_bytes().to_vec(), None, TIMEOUT).await, "R28: second VDEL");
    assert_eq!(second.response, 0, "R28: expected the holder's second VDEL to return 0");
}

/// R29: observing a lease that does not exist succeeds.
async fn observe_missing_lease(h: &Holders) {
    let lease = lease_client(&h.b, "lease-never-acquired", &h.b_id);
    let _observation = ok(lease.observe(TIMEOUT).await, "R29: observing a lease that does not exist");
    assert!(ok(lease.unobserve(TIMEOUT).await, "unobserve"), "expected unobserving the lease to return true");
}

/// R30: lock, see the holder, unlock.
async fn lock_and_unlock(h: &Holders) {
    let name = "lock-simple";
    let lock = lock_client(&h.a, name, &h.a_id);
    let token = locked(&lock, secs(10), None, "R30: locking a free lock").await;
    assert_eq!(lock.current_lock_fencing_token(), Some(token), "R30: expected the client to keep the token");
    let holder = ok(h.a.get(k(name), TIMEOUT).await, "GET on the lock").response;
    assert_eq!(holder, Some(h.a_id.as_bytes().to_vec()), "R30: expected the holder to be visible through GET");
    ok(lock.unlock(TIMEOUT).await, "R30: unlock");
    assert_eq!(lock.current_lock_fencing_token(), None, "expected unlock to clear the token");
    assert_eq!(ok(h.a.get(k(name), TIMEOUT).await, "GET").response, None, "expected the lock key gone after unlock");
}

/// R31: auto-renewal of a lock gives newer tokens with the same node id.
async fn lock_auto_renewal(h: &Holders) {
    let name = "lock-renewed";
    let lock = lock_client(&h.a, name, &h.a_id);
    let token1 = locked(&lock, secs(3), Some(secs(1)), "R31: locking with a 1 s renewal").await;
    let token2 = renewed_token(|| lock.current_lock_fencing_token(), &token1, "R31: first renewal").await;
    let token3 = renewed_token(|| lock.current_lock_fencing_token(), &token2, "R31: second renewal").await;
    assert_newer(&token1, &token2, "R31: expected the renewed token to be newer");
    assert_newer(&token2, &token3, "R31: expected the renewed token to be newer");
    assert!(token1.timestamp < token2.timestamp, "R31: expected a later timestamp: {token1} then {token2}");
    assert_eq!(token1.node_id, token2.node_id, "R31: expected renewals to keep the node id");
    assert_eq!(token2.node_id, token3.node_id, "R31: expected renewals to keep the node id");
    ok(lock.unlock(TIMEOUT).await, "unlock stops the renewal");
    sleep(Duration::from_millis(1500)).await;
    assert_eq!(ok(h.a.get(k(name), TIMEOUT).await, "GET").response, None, "expected no renewal after unlock");
}

/// R32 (release): the loser blocks until the holder unlocks, well before the 30 s expiry, so only
/// the DELETE notification can wake it. The new holder's token then fences out the old one.
async fn lock_waiter_wakes_on_release(h: &Holders) {
    let name = "lock-contended-release";
    let protected = "lock-protected";
    let lifetime = secs(30);
    let first = lock_client(&h.a, name, &h.a_id);
    let second = lock_client(&h.b, name, &h.b_id);
    let token_a = locked(&first, lifetime, None, "R32: first holder locks").await;
    let write = ok(h.a.set(k(protected), b"from-a".to_vec(), TIMEOUT, Some(token_a.clone()), plain()).await, "SET");
    assert!(write.response, "expected the holder's protected SET with its token to return true");

    let waiter = spawn_lock(&second, lifetime);
    sleep(secs(1)).await;
    assert!(!waiter.is_finished(), "R32: expected the second holder to block while the lock is held");
    let released = Instant::now();
    ok(first.unlock(TIMEOUT).await, "R32: first holder unlocks");
    let token_b = waited(waiter, NOTIFY_WAIT, "R32: second holder after the release (expiry is 30 s away)").await;
    assert!(released.elapsed() < NOTIFY_WAIT, "expected the waiter to wake on the release's DELETE");
    assert_newer(&token_a, &token_b, "expected the new holder's token to be newer");
    let holder = ok(h.b.get(k(name), TIMEOUT).await, "GET on the lock").response;
    assert_eq!(holder, Some(h.b_id.as_bytes().to_vec()), "expected the second holder to hold the lock");

    let write = ok(h.b.set(k(protected), b"from-b".to_vec(), TIMEOUT, Some(token_b.clone()), plain()).await, "SET");
    assert!(write.response, "expected the new holder's protected SET with its token to return true");
    assert_service_error(
        h.a.set(k(protected), b"late-a".to_vec(), TIMEOUT, Some(token_a), plain()).await,
        ServiceError::FencingTokenLowerVersion,
        "the previous holder's SET with its old token",
    );
    let deleted = ok(h.b.del(k(protected), Some(token_b), TIMEOUT).await, "DEL with the new token");
    assert_eq!(deleted.response, 1, "expected DEL with the new holder's token to return 1");
    ok(second.unlock(TIMEOUT).await, "second holder unlocks");
}

/// R32 (expiry): the holder never unlocks; the loser wakes on the DELETE from the 3 s expiry.
async fn lock_waiter_wakes_on_expiry(h: &Holders) {
    let name = "lock-contended-expiry";
    let lifetime = secs(3);
    let first = lock_client(&h.a, name, &h.a_id);
    let second = lock_client(&h.b, name, &h.b_id);
    let started = Instant::now();
    let token_a = locked(&first, lifetime, None, "R32: first holder locks for 3 s").await;
    let waiter = spawn_lock(&second, secs(10));
    sleep(secs(1)).await;
    assert!(!waiter.is_finished(), "R32: expected the second holder to block while the lock is held");
    let token_b = waited(waiter, lifetime + EXPIRY_LATENESS, "R32: second holder after the expiry").await;
    let elapsed = started.elapsed();
    assert!(
        elapsed + EXPIRY_SLACK >= lifetime,
        "R32: expected the waiter to get the lock only after 3 s, got it after {elapsed:?}"
    );
    assert_newer(&token_a, &token_b, "expected the new holder's token to be newer");
    let holder = ok(h.b.get(k(name), TIMEOUT).await, "GET on the lock").response;
    assert_eq!(holder, Some(h.b_id.as_bytes().to_vec()), "expected the second holder to hold the lock");
    ok(second.unlock(TIMEOUT).await, "second holder unlocks");
}

// ---------------------------------------------------------------------------------------------
// SCAN (list_keys): paging, glob patterns, changes between scans, expiry
// ---------------------------------------------------------------------------------------------

/// Upper bound on the pages of one scan: only there to stop a pager that never finishes.
const MAX_PAGES: usize = 64;
/// Numbered keys seeded for SCAN: enough that `item-*` and `*` take several pages of the
/// server's 100-key pages, before and after the deletes and renames.
const ITEMS: usize = 250;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sdk_list_keys_paging_and_glob_patterns() {
    let (broker, cluster) = start().await;
    let port = broker.port;
    with_logs(&broker, &cluster, async move {
        let session = SdkSession::connect(port, &unique_client_id("sdk-scan")).await;
        let s = Store(session.state_store());
        // Every key in the store, to check `*` against.
        let mut model = BTreeSet::new();

        // Numbered keys, each holding its own name.
        let items: Vec<String> = (0..ITEMS).map(|i| format!("item-{i:03}")).collect();
        set_all(&s, &items).await;
        model.extend(items.iter().cloned());

        // Keys that tell glob metacharacters apart. `xglob-a` checks that patterns are anchored.
        let globs = [
            "glob-", "glob-a", "glob-b", "glob-z", "glob-7", "glob-^", "glob-*", "glob-é", "glob-ab", "glob-*x",
            "glob-a.b", "glob-a/b", "xglob-a",
        ];
        set_all(&s, &globs.map(String::from)).await;
        model.extend(globs.map(String::from));
        // A key that is not UTF-8 is never listed.
        let binary = b"glob-\xff".to_vec();
        let set = ok(s.0.set(binary, b"v".to_vec(), TIMEOUT, None, plain()).await, "SET on a non-UTF-8 key");
        assert!(set.response, "expected SET on a non-UTF-8 key to return true");

        assert_eq!(list(&s, b"*").await, model, "expected `*` to list every UTF-8 key in the store exactly once");
        let all_items: BTreeSet<String> = items.iter().cloned().collect();
        assert_eq!(list(&s, b"item-*").await, all_items, "expected `item-*` to list every numbered key across pages");
        let cases: &[(&str, &[&str])] = &[
            (
                "item-0?5",
                &[
                    "item-005", "item-015", "item-025", "item-035", "item-045", "item-055", "item-065", "item-075",
                    "item-085", "item-095",
                ],
            ),
            ("item-09[!0-7]", &["item-098", "item-099"]),
            ("item-0[89]9", &["item-089", "item-099"]),
            (
                "glob-*",
                &[
                    "glob-", "glob-a", "glob-b", "glob-z", "glob-7", "glob-^", "glob-*", "glob-é", "glob-ab",
                    "glob-*x", "glob-a.b", "glob-a/b",
                ],
            ),
            ("glob-?", &["glob-a", "glob-b", "glob-z", "glob-7", "glob-^", "glob-*", "glob-é"]),
            ("glob-??", &["glob-ab", "glob-*x"]),
            ("glob-[a-z]", &["glob-a", "glob-b", "glob-z"]),
            ("glob-[!a-z]", &["glob-7", "glob-^", "glob-*", "glob-é"]),
            ("glob-[^a]", &["glob-^", "glob-a"]),
            ("glob-[ab]", &["glob-a", "glob-b"]),
            ("glob-[*]", &["glob-*"]),
            ("glob-[*]*", &["glob-*", "glob-*x"]),
            ("glob-*b", &["glob-b", "glob-ab", "glob-a.b", "glob-a/b"]),
            ("glob-a?b", &["glob-a.b", "glob-a/b"]),
            ("*glob-a", &["glob-a", "xglob-a"]),
            ("glob-ab", &["glob-ab"]),
            ("glob-nothing*", &[]),
        ];
        for (pattern, expected) in cases {
            let expected: BTreeSet<String> = expected.iter().map(|k| k.to_string()).collect();
            assert_eq!(
                list(&s, pattern.as_bytes()).await,
                expected,
                "expected SCAN {pattern:?} to list exactly these keys"
            );
        }
        let hundreds: BTreeSet<String> = (100..200).map(|i| format!("item-{i:03}")).collect();
        assert_eq!(list(&s, b"item-1??").await, hundreds, "expected `item-1??` to list exactly item-100..199");
        assert_eq!(list(&s, b"glob-\xff*").await, BTreeSet::new(), "expected a non-UTF-8 pattern to match nothing");

        // Between scans: delete item-000..024, rename item-025..049 to moved-025..049, rewrite
        // item-050..059 in place.
        for i in 0..25 {
            let key = format!("item-{i:03}");
            assert_eq!(ok(s.del(&key, None).await, "DEL").response, 1, "expected DEL of {key} to return 1");
            model.remove(&key);
        }
        let moved: Vec<String> = (25..50).map(|i| format!("moved-{i:03}")).collect();
        for (i, new) in (25..50).zip(&moved) {
            let old = format!("item-{i:03}");
            assert!(ok(s.set(new, &old, None, plain()).await, "SET").response, "expected SET {new} to return true");
            assert_eq!(ok(s.del(&old, None).await, "DEL").response, 1, "expected DEL of {old} to return 1");
            model.remove(&old);
            model.insert(new.clone());
        }
        for i in 50..60 {
            let key = format!("item-{i:03}");
            assert!(ok(s.set(&key, "rewritten", None, plain()).await, "SET").response, "expected SET {key} to succeed");
        }
        let remaining: BTreeSet<String> = (50..ITEMS).map(|i| format!("item-{i:03}")).collect();
        assert_eq!(
            list(&s, b"item-*").await,
            remaining,
            "expected `item-*` to list exactly the numbered keys from item-050 on after the changes"
        );
        let moved_set: BTreeSet<String> = moved.iter().cloned().collect();
        assert_eq!(list(&s, b"moved-*").await, moved_set, "expected `moved-*` to list exactly the 25 renamed keys");
        let moved_3x: BTreeSet<String> = (30..40).map(|i| format!("moved-{i:03}")).collect();
        assert_eq!(list(&s, b"moved-03?").await, moved_3x, "expected `moved-03?` to list moved-030..039");
        assert_eq!(list(&s, b"item-0[0-4]?").await, BTreeSet::new(), "expected no deleted or renamed item listed");
        assert_eq!(list(&s, b"*").await, model, "expected `*` to list every key after the changes");
        let renamed = ok(s.get("moved-042").await, "GET a renamed key");
        assert_eq!(renamed.response, Some(b"item-042".to_vec()), "expected a renamed key to keep its value");

        // Expired keys are not listed.
        let lifetime = Duration::from_millis(1000);
        assert!(ok(s.set("fleeting", "v", None, px(1000)).await, "SET PX").response, "expected SET PX to succeed");
        let one: BTreeSet<String> = ["fleeting".to_string()].into();
        assert_eq!(list(&s, b"flee*").await, one, "expected the key to be listed before it expires");
        sleep(lifetime + EXPIRY_LATENESS).await;
        assert_eq!(list(&s, b"flee*").await, BTreeSet::new(), "expected an expired key not to be listed");
        assert_eq!(list(&s, b"*").await, model, "expected `*` to list every live key at the end");

        ok(s.0.shutdown().await, "shutting the state store client down");
        session.close().await;
    })
    .await;
}

/// Sets each key to its own name, a few requests at a time.
async fn set_all(s: &Store, keys: &[String]) {
    for chunk in keys.chunks(20) {
        let writes = chunk.iter().map(|key| s.set(key, key, None, plain()));
        for (key, result) in chunk.iter().zip(futures::future::join_all(writes).await) {
            assert!(ok(result, "seeding SET").response, "expected seeding SET {key} to return true");
        }
    }
}

/// Pages through `pattern` until the pager finishes; every key at most once.
async fn list(s: &Store, pattern: &[u8]) -> BTreeSet<String> {
    let shown = String::from_utf8_lossy(pattern).into_owned();
    let mut pager = ok(s.0.list_keys(pattern.to_vec(), TIMEOUT), "list_keys");
    let mut keys = BTreeSet::new();
    for page in 1.. {
        let Some(batch) = ok(pager.next().await, &format!("SCAN {shown:?}, page {page}")) else {
            return keys;
        };
        assert!(page <= MAX_PAGES, "expected SCAN {shown:?} to finish within {MAX_PAGES} pages");
        for key in batch {
            let key = String::from_utf8(key).expect("expected SCAN to return only UTF-8 keys");
            assert!(keys.insert(key.clone()), "expected SCAN {shown:?} to return {key:?} once, it came twice");
        }
    }
    unreachable!()
}

// ---------------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------------

/// A broker and a three-node cluster on it, every node ready (connected to the broker).
async fn start() -> (Broker, Cluster) {
    let broker = Broker::start();
    let cluster = Cluster::start(3, &["--broker", &broker.address()]).await;
    cluster.wait_ready().await;
    (broker, cluster)
}

/// Runs `scenarios`; if one panics, prints the node and broker logs and panics again.
async fn with_logs(broker: &Broker, cluster: &Cluster, scenarios: impl Future<Output = ()>) {
    if let Err(panic) = AssertUnwindSafe(scenarios).catch_unwind().await {
        eprintln!("{}--- broker ---\n{}", cluster.logs(), broker.log());
        std::panic::resume_unwind(panic);
    }
}

/// The state store client with string keys and values and the test's request timeout.
struct Store(Arc<state_store::Client>);

type Reply<T> = Result<state_store::Response<T>, state_store::Error>;

impl Store {
    async fn set(&self, key: &str, value: &str, token: Option<&Hlc>, options: SetOptions) -> Reply<bool> {
        self.0.set(k(key), value.as_bytes().to_vec(), TIMEOUT, token.cloned(), options).await
    }

    async fn get(&self, key: &str) -> Reply<Option<Vec<u8>>> {
        self.0.get(k(key), TIMEOUT).await
    }

    async fn del(&self, key: &str, token: Option<&Hlc>) -> Reply<i64> {
        self.0.del(k(key), token.cloned(), TIMEOUT).await
    }

    async fn vdel(&self, key: &str, value: &str, token: Option<&Hlc>) -> Reply<i64> {
        self.0.vdel(k(key), value.as_bytes().to_vec(), token.cloned(), TIMEOUT).await
    }
}

fn k(key: &str) -> Vec<u8> {
    key.as_bytes().to_vec()
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn plain() -> SetOptions {
    SetOptions::default()
}

fn px(ms: u64) -> SetOptions {
    SetOptions { expires: Some(Duration::from_millis(ms)), ..SetOptions::default() }
}

fn when(condition: SetCondition, px_ms: Option<u64>) -> SetOptions {
    SetOptions { set_condition: condition, expires: px_ms.map(Duration::from_millis), ..SetOptions::default() }
}

/// The success value, or a panic naming the step and the error.
fn ok<T, E: Display + Debug>(result: Result<T, E>, what: &str) -> T {
    result.unwrap_or_else(|e| panic!("{what}: expected success, got the error `{e}` ({e:?})"))
}

fn assert_service_error<T: Debug>(result: Reply<T>, expected: ServiceError, what: &str) {
    match result {
        Err(e) => match e.kind() {
            state_store::ErrorKind::ServiceError(actual) if discriminant(actual) == discriminant(&expected) => {}
            other => panic!("{what}: expected the service error `-ERR {expected}`, got {other:?}"),
        },
        Ok(reply) => panic!("{what}: expected the service error `-ERR {expected}`, got success {reply:?}"),
    }
}

fn assert_already_held<T: Debug>(result: Result<T, leased_lock::Error>, what: &str) {
    match result {
        Err(e) if matches!(e.kind(), leased_lock::ErrorKind::LeaseAlreadyHeld) => {}
        other => panic!("{what}: expected LeaseAlreadyHeld (SET NEX answered :-1), got {other:?}"),
    }
}

fn hlc_order(hlc: &Hlc) -> (SystemTime, u64, &str) {
    (hlc.timestamp, hlc.counter, hlc.node_id.as_str())
}

fn assert_newer(older: &Hlc, newer: &Hlc, what: &str) {
    assert!(hlc_order(newer) > hlc_order(older), "{what}: expected {newer} to be newer than {older}");
}

/// A client-made HLC from a second ago: a valid fencing token older than any version the
/// server hands out from now on.
fn older_client_hlc() -> Hlc {
    let mut hlc = Hlc::new();
    hlc.timestamp -= Duration::from_secs(1);
    hlc
}

async fn sleep_until(instant: Instant) {
    tokio::time::sleep_until(instant.into()).await;
}

/// Notifications as `SET <value>` / `DELETE`, for exact comparisons with readable diffs.
fn describe(notifications: &[KeyNotification]) -> Vec<String> {
    notifications
        .iter()
        .map(|n| match &n.operation {
            Operation::Set(value) => format!("SET {}", String::from_utf8_lossy(value)),
            Operation::Del => "DELETE".to_string(),
        })
        .collect()
}

async fn next_notification(observation: &mut KeyObservation, within: Duration, what: &str) -> KeyNotification {
    match timeout(within, observation.recv_notification()).await {
        Ok(Some((notification, _ack))) => notification,
        Ok(None) => panic!("{what}: expected a notification, the observation was closed"),
        Err(_) => panic!("{what}: expected a notification within {within:?}, none came"),
    }
}

/// Collects an observation's notifications in a task until the SDK closes it, which it does
/// when KEYNOTIFY STOP succeeds.
fn collect(mut observation: KeyObservation) -> JoinHandle<Vec<KeyNotification>> {
    tokio::spawn(async move {
        let mut got = Vec::new();
        while let Some((notification, _ack)) = observation.recv_notification().await {
            got.push(notification);
        }
        got
    })
}

async fn collected(collector: JoinHandle<Vec<KeyNotification>>, what: &str) -> Vec<KeyNotification> {
    match timeout(NOTIFY_WAIT, collector).await {
        Ok(Ok(got)) => got,
        Ok(Err(e)) => panic!("{what}: the notification collector failed: {e}"),
        Err(_) => panic!("{what}: expected the observation to close after STOP, it is open after {NOTIFY_WAIT:?}"),
    }
}

/// The exact payload of a SET notification.
fn set_notification(value: &[u8]) -> Vec<u8> {
    let mut payload = NOTIFY_SET_PREFIX.to_vec();
    payload.extend_from_slice(format!("${}\r\n", value.len()).as_bytes());
    payload.extend_from_slice(value);
    payload.extend_from_slice(b"\r\n");
    payload
}

fn user_property<'a>(publish: &'a Publish, name: &str) -> Option<&'a str> {
    publish.properties.user_properties.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
}

/// Raw PUBLISHes on one filter of a session, collected in a task until [`WireTap::stop`].
struct WireTap {
    stop: tokio::sync::oneshot::Sender<()>,
    task: JoinHandle<Vec<Publish>>,
}

fn wire_tap(mut receiver: azure_iot_operations_mqtt::session::SessionPubReceiver) -> WireTap {
    let (stop, mut stopped) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut seen = Vec::new();
        loop {
            tokio::select! {
                _ = &mut stopped => return seen,
                publish = receiver.recv() => match publish {
                    Some(publish) => seen.push(publish),
                    None => return seen,
                },
            }
        }
    });
    WireTap { stop, task }
}

impl WireTap {
    async fn stop(self) -> Vec<Publish> {
        let _ = self.stop.send(());
        timeout(NOTIFY_WAIT, self.task).await.expect("the wire tap to stop").expect("the wire tap task")
    }
}

/// Waits for a lease or lock client's token to be replaced by auto-renewal.
async fn renewed_token(current: impl Fn() -> Option<Hlc>, previous: &Hlc, what: &str) -> Hlc {
    let deadline = Instant::now() + secs(3);
    loop {
        match current() {
            Some(token) if token != *previous => return token,
            Some(_) => {}
            None => panic!("{what}: expected auto-renewal to keep a token, the client has none (a renewal failed)"),
        }
        assert!(Instant::now() < deadline, "{what}: expected auto-renewal to replace token {previous} within 3 s");
        sleep(Duration::from_millis(50)).await;
    }
}

/// `lock`, bounded so that a lock that never comes is a panic.
async fn locked(client: &lock::Client, expiry: Duration, renewal: Option<Duration>, what: &str) -> Hlc {
    match timeout(TIMEOUT, client.lock(expiry, TIMEOUT, renewal)).await {
        Ok(result) => ok(result, what),
        Err(_) => panic!("{what}: expected lock() to return within {TIMEOUT:?}"),
    }
}

fn spawn_lock(client: &lock::Client, expiry: Duration) -> JoinHandle<Result<Hlc, leased_lock::Error>> {
    let client = client.clone();
    tokio::spawn(async move { client.lock(expiry, TIMEOUT, None).await })
}

async fn waited(waiter: JoinHandle<Result<Hlc, leased_lock::Error>>, within: Duration, what: &str) -> Hlc {
    match timeout(within, waiter).await {
        Ok(Ok(result)) => ok(result, what),
        Ok(Err(e)) => panic!("{what}: the lock task failed: {e}"),
        Err(_) => panic!("{what}: expected the blocked lock() to acquire within {within:?}"),
    }
}
