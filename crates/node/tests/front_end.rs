//! The MQTT front end as a dispatch adapter, without a broker: requests are handed straight to
//! the dispatcher and every publish and acknowledgement it makes is recorded by an in-process
//! [`Link`]. A real single-node store (Raft and RocksDB in a temp dir) answers them, with its
//! leader duties (expiry, notifications, registration drops) running beside the pipeline.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use futures::future::BoxFuture;
use rumqttc::v5::mqttbytes::v5::{Publish, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use statestore_node::access::KeyAccess;
use statestore_node::mqtt::{ClientPolicy, Delivered, Delivery, FrontEnd, Link, Outbound, RequestSink};
use statestore_node::{Args, Node, NodeConfig};
use statestore_protocol::topic::{hex_upper, NOTIFICATION_PREFIX, REQUEST_TOPIC};
use statestore_protocol::{Get, Hlc, KeyNotify, Notification, Response, Set};
use tempfile::TempDir;
use tokio::sync::{mpsc, watch};

/// What the front end did on its link, in order.
enum Event {
    Published(Box<Outbound>),
    Acked(u16),
}

struct RecordingLink {
    events: mpsc::UnboundedSender<Event>,
    /// The role the front end last told the link to subscribe for (`true`: leading).
    role: watch::Sender<Option<bool>>,
}

impl Link for RecordingLink {
    fn publish(&self, outbound: Outbound) {
        let _ = self.events.send(Event::Published(Box::new(outbound)));
    }

    fn ack(&self, publish: &Publish) {
        let _ = self.events.send(Event::Acked(publish.pkid));
    }

    fn follow_role(&self, leading: bool) {
        self.role.send_replace(Some(leading));
    }

    fn disconnect(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

struct Harness {
    node: Arc<Node>,
    front: Arc<FrontEnd>,
    requests: RequestSink,
    events: mpsc::UnboundedReceiver<Event>,
    next_pkid: u16,
    _dir: TempDir,
}

impl Harness {
    /// A single-node store, leading, with a front end on a recording link.
    async fn start() -> Harness {
        Harness::start_with(ClientPolicy::default()).await
    }

    /// The same, serving clients under `policy`.
    async fn start_with(policy: ClientPolicy) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().join("data");
        let args = Args::try_parse_from([
            "statestore-node",
            "--id=1",
            "--listen=127.0.0.1:1",
            &format!("--data-dir={}", data_dir.display()),
            "--initial-members=1=http://127.0.0.1:1",
        ])
        .unwrap();
        let config = NodeConfig::from_args(args).unwrap();
        let node = Node::start(&config).await.unwrap();
        let (events_tx, events) = mpsc::unbounded_channel();
        let (_sessions_tx, sessions) = watch::channel(0);
        let (role_tx, mut role) = watch::channel(None);
        let link = Arc::new(RecordingLink { events: events_tx, role: role_tx });
        let (front, requests) = FrontEnd::with_link(node.clone(), link, sessions, policy).unwrap();
        let mut leading = node.leader.leading();
        tokio::time::timeout(Duration::from_secs(10), leading.wait_for(|term| term.is_some()))
            .await
            .expect("the single node did not lead within 10 s")
            .unwrap();
        // The leader's request subscription is QoS 1: the broker redelivers what it leaves
        // unanswered.
        tokio::time::timeout(Duration::from_secs(10), role.wait_for(|leading| *leading == Some(true)))
            .await
            .expect("the front end did not subscribe as the leader")
            .unwrap();
        // The leader names the cluster and enrolls its own storage through the log once it
        // leads: let that happen first, so tests count only their own proposals.
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while node.identity.cluster_id().is_none() || node.identity.enrolled(node.id).is_none() {
            assert!(std::time::Instant::now() < until, "the leader did not enroll itself within 10 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut harness = Harness { node, front, requests, events, next_pkid: 1, _dir: dir };
        // The front end takes over once it hears of the leadership: a request it holds until
        // then is answered then. Wait for the answer of one, so every test starts led.
        let probe = harness.send("probe", 0, Get { key: b"probe".to_vec() }.encode(), |_| {});
        let (mut answered, mut acked) = (false, false);
        while !(answered && acked) {
            match harness.next().await {
                Event::Published(_) => answered = true,
                Event::Acked(pkid) => acked = pkid == probe,
            }
        }
        harness
    }

    /// Hands a request from `client` to the dispatcher, as the connection would; returns its
    /// packet id.
    fn send(&mut self, client: &str, correlation: u8, payload: Vec<u8>, edit: impl FnOnce(&mut Publish)) -> u16 {
        let properties = PublishProperties {
            response_topic: Some(format!("clients/{client}/response")),
            correlation_data: Some(Bytes::from(vec![correlation; 16])),
            message_expiry_interval: Some(10),
            user_properties: vec![
                ("__srcId".into(), client.to_string()),
                ("__ts".into(), Hlc::new(now_ms(), 0, client).to_string()),
                ("__protVer".into(), "1.0".into()),
            ],
            ..Default::default()
        };
        let mut publish = Publish::new(REQUEST_TOPIC, QoS::AtLeastOnce, payload, Some(properties));
        publish.pkid = self.next_pkid;
        self.next_pkid += 1;
        edit(&mut publish);
        let pkid = publish.pkid;
        (self.requests)(publish, Delivered::AsPublished);
        pkid
    }

    async fn next(&mut self) -> Event {
        tokio::time::timeout(Duration::from_secs(10), self.events.recv())
            .await
            .expect("nothing on the link within 10 s")
            .expect("the link closed")
    }

    async fn next_publish(&mut self) -> Outbound {
        match self.next().await {
            Event::Published(outbound) => *outbound,
            Event::Acked(pkid) => panic!("expected a publish, got the ack of {pkid}"),
        }
    }

    async fn next_ack(&mut self) -> u16 {
        match self.next().await {
            Event::Acked(pkid) => pkid,
            Event::Published(outbound) => panic!("expected an ack, got a publish on {}", outbound.topic),
        }
    }

    /// The response to `pkid`, then its acknowledgement: responses are published before the
    /// request is acknowledged.
    async fn answer(&mut self, pkid: u16) -> (Response, Outbound) {
        let response = self.next_publish().await;
        assert_eq!(self.next_ack().await, pkid, "the answered request is acknowledged next");
        (Response::decode(&response.payload).expect("a well-formed reply"), response)
    }
}

fn now_ms() -> u64 {
    statestore_node::node::now_ms()
}

fn metrics(node: &Node) -> String {
    node.metrics.render(&node.reader)
}

fn user<'a>(outbound: &'a Outbound, name: &str) -> Option<&'a str> {
    outbound.properties.user_properties.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// `statestore_proposals_total{outcome="committed"}`.
fn committed_proposals(node: &Node) -> u64 {
    let rendered = metrics(node);
    let line =
        rendered.lines().find_map(|line| line.strip_prefix("statestore_proposals_total{outcome=\"committed\"} "));
    line.map_or(0, |value| value.trim().parse().unwrap())
}

fn notification_topic(client: &str, key: &str) -> String {
    format!("{NOTIFICATION_PREFIX}/{}/command/notify/{}", hex_upper(client.as_bytes()), hex_upper(key.as_bytes()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_are_answered_and_acknowledged_in_order() {
    let mut h = Harness::start().await;
    let committed_before = committed_proposals(&h.node);
    let mut sent = Vec::new();
    for i in 0..50u8 {
        sent.push(h.send("alpha", i, Set::new(format!("k{i}"), format!("v{i}")).encode(), |_| {}));
    }
    let read = h.send("alpha", 200, Get { key: b"k49".to_vec() }.encode(), |_| {});
    // Responses in request order, acknowledgements in request order, and each request's
    // response before its acknowledgement (the broker forgets it only once it is answered).
    let (mut responses, mut acks) = (Vec::new(), Vec::new());
    while acks.len() < sent.len() + 1 {
        match h.next().await {
            Event::Published(outbound) => responses.push((acks.len(), *outbound)),
            Event::Acked(pkid) => acks.push(pkid),
        }
    }
    let mut expected_acks = sent.clone();
    expected_acks.push(read);
    assert_eq!(acks, expected_acks);
    assert_eq!(responses.len(), sent.len() + 1);
    for (i, (acked_before, outbound)) in responses.iter().enumerate() {
        assert!(*acked_before <= i, "request {i} was acknowledged before its response");
        assert_eq!(outbound.topic, "clients/alpha/response");
        assert_eq!(user(outbound, "__stat"), Some("200"));
        let response = Response::decode(&outbound.payload).unwrap();
        if i < sent.len() {
            assert_eq!(outbound.properties.correlation_data.as_deref(), Some(&[i as u8; 16][..]));
            assert_eq!(response, Response::Ok, "SET {i}");
            assert!(user(outbound, "__ts").is_some(), "a SET answers with its version");
        } else {
            assert_eq!(response, Response::Value(b"v49".to_vec()), "a read sees the writes sent before it");
        }
    }
    assert_eq!(committed_proposals(&h.node), committed_before + 50, "{}", metrics(&h.node));
    h.front.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_an_error_or_a_logged_drop_and_are_acknowledged() {
    let mut h = Harness::start().await;
    // Not RESP3: an error answer.
    let garbage = h.send("beta", 1, b"*1\r\n$3\r\nNOPE".to_vec(), |_| {});
    let (response, _) = h.answer(garbage).await;
    assert!(matches!(response, Response::Error(_)), "{response:?}");
    // An unsupported protocol major: status 505 and the supported major.
    let future = h.send("beta", 2, Set::new("k", "v").encode(), |p| {
        let properties = p.properties.as_mut().unwrap();
        properties.user_properties.retain(|(k, _)| k != "__protVer");
        properties.user_properties.push(("__protVer".into(), "9.0".into()));
    });
    let outbound = h.next_publish().await;
    assert_eq!(h.next_ack().await, future);
    assert_eq!(user(&outbound, "__stat"), Some("505"));
    assert_eq!(user(&outbound, "__supProtMajVer"), Some("1"));
    // No response topic: nothing to answer to; acknowledged and dropped.
    let topicless = h.send("beta", 3, Set::new("k", "v").encode(), |p| {
        p.properties.as_mut().unwrap().response_topic = None;
    });
    assert_eq!(h.next_ack().await, topicless);
    // QoS 0: dropped (nothing to acknowledge either), and the next request is still served.
    let qos0 = h.send("beta", 4, Set::new("k", "v").encode(), |p| p.qos = QoS::AtMostOnce);
    let fine = h.send("beta", 5, Get { key: b"k".to_vec() }.encode(), |_| {});
    let (mut published, mut acks) = (Vec::new(), Vec::new());
    while acks.last() != Some(&fine) {
        match h.next().await {
            Event::Published(outbound) => published.push(*outbound),
            Event::Acked(pkid) => acks.push(pkid),
        }
    }
    // The QoS 0 drop passes through the acker in order (a real connection skips it).
    assert_eq!(acks, vec![qos0, fine]);
    assert_eq!(published.len(), 1, "only the GET is answered");
    let response = Response::decode(&published[0].payload).unwrap();
    assert_eq!(response, Response::Nil, "none of the dropped SETs was applied");
    let rendered = metrics(&h.node);
    assert!(rendered.contains("statestore_requests_dropped_total{reason=\"qos0\"} 1"), "{rendered}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_go_out_before_the_response_and_a_gone_client_is_dropped() {
    let mut h = Harness::start().await;
    let register = h.send("watcher", 1, KeyNotify { key: b"door".to_vec(), stop: false }.encode(), |_| {});
    assert_eq!(h.answer(register).await.0, Response::Ok);

    let set = h.send("writer", 1, Set::new("door", "open").encode(), |_| {});
    let notification = h.next_publish().await;
    assert_eq!(notification.topic, notification_topic("watcher", "door"));
    assert_eq!(Notification::decode(&notification.payload), Some(Notification::Set { value: b"open".to_vec().into() }));
    assert!(user(&notification, "__ts").is_some());
    let (response, _) = h.answer(set).await;
    assert_eq!(response, Response::Ok, "the response comes after the notification");

    // The broker says nobody subscribes for the watcher any more: its registrations go.
    notification.delivery.expect("notifications want their PUBACK").send(Delivery::NoSubscribers).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !metrics(&h.node).contains("statestore_registrations_dropped_total 1") {
        assert!(tokio::time::Instant::now() < deadline, "the watcher's registrations were not dropped");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let set = h.send("writer", 2, Set::new("door", "shut").encode(), |_| {});
    let (response, _) = h.answer(set).await;
    assert_eq!(response, Response::Ok, "no notification before this response: the registration is gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_expires_keys_and_notifies_their_deletion() {
    let mut h = Harness::start().await;
    let register = h.send("watcher", 1, KeyNotify { key: b"lease".to_vec(), stop: false }.encode(), |_| {});
    assert_eq!(h.answer(register).await.0, Response::Ok);
    let mut set = Set::new("lease", "held");
    set.expiry_ms = Some(200);
    let set = h.send("holder", 1, set.encode(), |_| {});
    let notification = h.next_publish().await;
    assert_eq!(Notification::decode(&notification.payload), Some(Notification::Set { value: b"held".to_vec().into() }));
    assert_eq!(h.answer(set).await.0, Response::Ok);
    // Without a request in sight, the sweeper deletes the key and the deletion is notified.
    let deletion = h.next_publish().await;
    assert_eq!(deletion.topic, notification_topic("watcher", "lease"));
    assert_eq!(Notification::decode(&deletion.payload), Some(Notification::Delete));
    let get = h.send("holder", 2, Get { key: b"lease".to_vec() }.encode(), |_| {});
    assert_eq!(h.answer(get).await.0, Response::Nil);
    assert!(metrics(&h.node).contains("statestore_expired_keys_total 1"));
}

/// One client cannot take the whole window: what it sends beyond its in-flight limit is answered
/// at once with the error that names the limit, while other clients are served.
#[tokio::test]
async fn a_client_beyond_its_in_flight_limit_is_answered_at_once_and_others_are_served() {
    let mut h = Harness::start_with(ClientPolicy { inflight: 2, ..ClientPolicy::default() }).await;
    const GREEDY: u8 = 40;
    for i in 0..GREEDY {
        h.send("greedy", i, Set::new(format!("g{i}"), "v").encode(), |_| {});
    }
    h.send("other", 200, Set::new("o", "v").encode(), |_| {});
    let (mut refused, mut written, mut other_ok, mut acks) = (0, 0, false, 0);
    while refused + written + usize::from(other_ok) < usize::from(GREEDY) + 1 || acks < usize::from(GREEDY) + 1 {
        match h.next().await {
            Event::Acked(_) => acks += 1,
            Event::Published(outbound) => {
                let from_other = outbound.topic.starts_with("clients/other/");
                match &outbound.payload[..] {
                    b"+OK\r\n" if from_other => other_ok = true,
                    b"+OK\r\n" => written += 1,
                    b"-ERR too many requests in flight for this client\r\n" if !from_other => refused += 1,
                    other => panic!("unexpected answer {:?} on {}", String::from_utf8_lossy(other), outbound.topic),
                }
            }
        }
    }
    assert!(other_ok, "another client is served");
    assert!(written >= 2 && refused >= 1, "{written} written, {refused} refused");
    // Once its answers are out, the client has its places back.
    h.send("greedy", 100, Set::new("again", "v").encode(), |_| {});
    assert_eq!(&h.next_publish().await.payload[..], b"+OK\r\n");
}

/// The notifier holds at most its byte budget of notifications awaiting the broker's PUBACKs:
/// a change seen by 700 watchers, 100 KiB each, stops short of 64 MiB on the link; the answer of
/// the SET waits behind the rest, and once the broker acknowledges, every notification goes out
/// and then the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_awaiting_the_broker_are_bounded_and_still_precede_the_answer() {
    let mut h = Harness::start().await;
    const WATCHERS: usize = 700;
    for n in 0..WATCHERS {
        let watch = statestore_protocol::Command::KeyNotify(KeyNotify { key: b"big".to_vec(), stop: false }).encode();
        let pkid = h.send(&format!("w{n}"), 1, watch, |_| {});
        assert_eq!(h.answer(pkid).await.0, Response::Ok);
    }
    let value = vec![b'x'; 100 << 10];
    let set = h.send("writer", 2, Set::new("big", value.clone()).encode(), |_| {});
    let mut held = Vec::new();
    // Until the link goes quiet: what the notifier hands over without a single PUBACK.
    while let Ok(Some(event)) = tokio::time::timeout(Duration::from_millis(1_000), h.events.recv()).await {
        match event {
            Event::Published(outbound) if outbound.topic.starts_with(NOTIFICATION_PREFIX) => held.push(*outbound),
            Event::Published(outbound) => panic!("published on {} before its notifications", outbound.topic),
            Event::Acked(pkid) => panic!("acknowledged {pkid} before its answer"),
        }
    }
    let budget = statestore_node::mqtt::notifier::MAX_OUTSTANDING_BYTES;
    let on_link: usize = held.iter().map(|n| n.payload.len() + n.topic.len()).sum();
    assert!(held.len() < WATCHERS, "all {WATCHERS} notifications handed over without a PUBACK");
    assert!(on_link <= budget + (200 << 10) && on_link >= budget - (400 << 10), "{on_link} bytes on the link");
    let mut notified = held.len();
    for notification in held.drain(..) {
        let _ = notification.delivery.expect("a PUBACK is awaited").send(Delivery::Accepted);
    }
    loop {
        match h.next().await {
            Event::Published(outbound) if outbound.topic.starts_with(NOTIFICATION_PREFIX) => {
                notified += 1;
                let _ = outbound.delivery.expect("a PUBACK is awaited").send(Delivery::Accepted);
            }
            Event::Published(outbound) => {
                assert_eq!(notified, WATCHERS, "the answer went out before every notification");
                assert_eq!(Response::decode(&outbound.payload), Ok(Response::Ok));
                break;
            }
            Event::Acked(pkid) => panic!("acknowledged {pkid} before its answer"),
        }
    }
    assert_eq!(h.next_ack().await, set);
}

/// The in-flight limit counts a client by the client its response topic names, the identity
/// its broker ACL ties to it: a new `__srcId` on every request does not buy more places.
#[tokio::test]
async fn a_client_that_rotates_its_src_id_is_still_held_to_its_in_flight_limit() {
    let mut h = Harness::start_with(ClientPolicy { inflight: 2, ..ClientPolicy::default() }).await;
    const GREEDY: u8 = 40;
    for i in 0..GREEDY {
        h.send("greedy", i, Set::new(format!("g{i}"), "v").encode(), |publish| {
            let user = &mut publish.properties.as_mut().unwrap().user_properties;
            user.retain(|(k, _)| k != "__srcId");
            user.push(("__srcId".into(), format!("disguise-{i}")));
        });
    }
    let (mut refused, mut written, mut acks) = (0, 0, 0);
    while refused + written < usize::from(GREEDY) || acks < usize::from(GREEDY) {
        match h.next().await {
            Event::Acked(_) => acks += 1,
            Event::Published(outbound) => match &outbound.payload[..] {
                b"+OK\r\n" => written += 1,
                b"-ERR too many requests in flight for this client\r\n" => refused += 1,
                other => panic!("unexpected answer {:?}", String::from_utf8_lossy(other)),
            },
        }
    }
    assert!(written >= 2 && refused >= 1, "{written} written, {refused} refused");
}

/// A request whose response topic lies outside the allowed patterns (`clients/{client}/#` by
/// default) is acknowledged and dropped unanswered, so the node never publishes onto a topic a
/// client names, such as another device's command topic.
#[tokio::test]
async fn a_request_naming_a_topic_outside_the_allowed_patterns_is_dropped_unanswered() {
    let mut h = Harness::start().await;
    let set = h.send("owner", 1, Set::new("setpoint", "{\"setpoint\": 99}").encode(), |_| {});
    assert_eq!(h.answer(set).await.0, Response::Ok);
    let hijack = h.send("owner", 2, Get { key: b"setpoint".to_vec() }.encode(), |publish| {
        publish.properties.as_mut().unwrap().response_topic = Some("devices/thermostat-9/commands/set".into());
    });
    assert_eq!(h.next_ack().await, hijack, "acknowledged without an answer");
    let get = h.send("owner", 3, Get { key: b"setpoint".to_vec() }.encode(), |_| {});
    let (response, outbound) = h.answer(get).await;
    assert_eq!(response, Response::Value(b"{\"setpoint\": 99}".to_vec()));
    assert!(outbound.topic.starts_with("clients/owner/"), "{}", outbound.topic);
    assert!(
        metrics(&h.node).contains("statestore_requests_dropped_total{reason=\"response_topic_not_allowed\"} 1"),
        "{}",
        metrics(&h.node)
    );
}

/// KEYNOTIFY takes the client from the response topic: a STOP naming the victim's `__srcId`
/// with a topic that names no client is dropped, and one from another client's topic is
/// refused; the victim's registration stays and it is still notified.
#[tokio::test]
async fn nobody_can_stop_another_clients_notifications() {
    let mut h = Harness::start().await;
    let watch = statestore_protocol::Command::KeyNotify(KeyNotify { key: b"door".to_vec(), stop: false }).encode();
    let registered = h.send("victim", 1, watch, |_| {});
    assert_eq!(h.answer(registered).await.0, Response::Ok);
    let stop = statestore_protocol::Command::KeyNotify(KeyNotify { key: b"door".to_vec(), stop: true }).encode();
    let as_victim = |topic: &'static str| {
        move |publish: &mut Publish| {
            let properties = publish.properties.as_mut().unwrap();
            properties.response_topic = Some(topic.into());
            properties.user_properties.retain(|(k, _)| k != "__srcId");
            properties.user_properties.push(("__srcId".into(), "victim".into()));
        }
    };
    let elsewhere = h.send("attacker", 2, stop.clone(), as_victim("probe/out"));
    assert_eq!(h.next_ack().await, elsewhere, "dropped unanswered");
    let own_topic = h.send("attacker", 3, stop, as_victim("clients/attacker/response"));
    assert_eq!(h.answer(own_topic).await.0, Response::Error(statestore_protocol::StoreError::ClientIdMismatch));
    let set = h.send("writer", 4, Set::new("door", "open").encode(), |_| {});
    let notification = h.next_publish().await;
    assert_eq!(notification.topic, notification_topic("victim", "door"));
    assert_eq!(h.answer(set).await.0, Response::Ok);
}

/// Under an authorization map a client uses only the keys under its prefixes: other keys are
/// answered `not authorized` (and acknowledged, and left as they were), and its SCAN pages list
/// only its keys, while a client with every prefix sees all.
#[tokio::test]
async fn an_authorization_map_confines_each_client_to_its_prefixes() {
    let access = KeyAccess::parse("[clients]\nprobe = [\"probe\"]\ntenant = [\"a/\"]\nadmin = [\"\"]\n").unwrap();
    let mut h = Harness::start_with(ClientPolicy { access: Some(access), ..ClientPolicy::default() }).await;
    async fn expect(h: &mut Harness, client: &str, payload: Vec<u8>) -> Response {
        let correlation = h.next_pkid as u8;
        let pkid = h.send(client, correlation, payload, |_| {});
        h.answer(pkid).await.0
    }
    let not_authorized = Response::Error(statestore_protocol::StoreError::NotAuthorized);
    assert_eq!(expect(&mut h, "admin", Set::new("b/1", "theirs").encode()).await, Response::Ok);
    assert_eq!(expect(&mut h, "tenant", Set::new("a/1", "mine").encode()).await, Response::Ok);
    assert_eq!(expect(&mut h, "tenant", Set::new("b/1", "stolen").encode()).await, not_authorized);
    assert_eq!(expect(&mut h, "tenant", Get { key: b"b/1".to_vec() }.encode()).await, not_authorized);
    let watch = KeyNotify { key: b"b/1".to_vec(), stop: false };
    assert_eq!(expect(&mut h, "tenant", statestore_protocol::Command::KeyNotify(watch).encode()).await, not_authorized);
    assert_eq!(expect(&mut h, "stranger", Get { key: b"a/1".to_vec() }.encode()).await, not_authorized);
    assert_eq!(
        expect(&mut h, "admin", Get { key: b"b/1".to_vec() }.encode()).await,
        Response::Value(b"theirs".to_vec())
    );
    let scan = |pattern: &str| {
        statestore_protocol::Command::Scan(statestore_protocol::Scan { pattern: pattern.into(), token: None }).encode()
    };
    let listed = |response: Response| match response {
        Response::Keys { keys, token: None } => keys.into_iter().map(|k| k.into_vec()).collect::<Vec<_>>(),
        other => panic!("not a last SCAN page: {other:?}"),
    };
    assert_eq!(listed(expect(&mut h, "tenant", scan("*")).await), vec![b"a/1".to_vec()]);
    // More of another client's keys than a page holds: the tenant's page still ends with its
    // own key and no token, where it once carried the last key examined, another's key.
    for i in 0..150 {
        assert_eq!(expect(&mut h, "admin", Set::new(format!("b/k{i:03}"), "theirs").encode()).await, Response::Ok);
    }
    assert_eq!(listed(expect(&mut h, "tenant", scan("*")).await), vec![b"a/1".to_vec()]);
    let Response::Keys { keys: first_page, .. } = expect(&mut h, "admin", scan("*")).await else { panic!() };
    assert_eq!(first_page[..2], [b"a/1".to_vec(), b"b/1".to_vec()].map(serde_bytes::ByteBuf::from));
}
