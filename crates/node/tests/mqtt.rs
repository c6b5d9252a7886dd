//! The MQTT front end with a raw client: envelope handling, every malformed input, exactly-once
//! effect of redeliveries (also across a leader kill), large values and binary keys. A real
//! Mosquitto and three real node processes.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::barrage;
use common::broker::Broker;
use common::gate::{Gate, PeerLinks};
use common::mqtt::RawClient;
use common::suback_hold::SubackHold;
use common::tap::{Seen, Tap};
use common::{elections_started, metric, now_ms, timestamp, Cluster};
use futures::StreamExt;
use rumqttc::v5::mqttbytes::v5::PublishProperties;
use rumqttc::v5::mqttbytes::QoS;
use statestore_protocol::topic::{hex_upper, NOTIFICATION_PREFIX, REQUEST_TOPIC};
use statestore_protocol::{encode_bulk_array, Get, Hlc, KeyNotify, Response, Set};

const NO_ANSWER: Duration = Duration::from_millis(1500);

#[tokio::test(flavor = "multi_thread")]
async fn nodes_reconnect_and_subscribe_again_after_the_broker_restarts() {
    let (mut broker, cluster) = cluster_with_broker().await;
    let client = RawClient::connect(broker.port, "before-restart").await;
    assert_eq!(client.request(&set(b"survives", b"yes"), &timestamp()).await.payload, b"+OK\r\n");
    drop(client);

    // The broker keeps nothing (no persistence): every node gets a CONNACK without a session.
    broker.restart_after(Duration::from_millis(1500));
    cluster.wait_ready().await;
    let client = RawClient::connect(broker.port, "after-restart").await;
    let reply = client.request(&get(b"survives"), &timestamp()).await;
    assert_eq!(reply.payload, b"$3\r\nyes\r\n", "served again after the broker came back");
    assert_eq!(client.request(&set(b"after", b"1"), &timestamp()).await.payload, b"+OK\r\n");
    for id in cluster.running() {
        let metrics = cluster.metrics(id).await;
        assert!(metric(&metrics, "statestore_broker_reconnects_total").unwrap_or(0.0) >= 1.0, "node {id}\n{metrics}");
        assert_eq!(metric(&metrics, "statestore_broker_connected"), Some(1.0), "node {id}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_without_its_broker_is_not_ready() {
    let mut broker = Broker::start();
    let cluster = Cluster::start(3, &["--broker", &broker.address()]).await;
    cluster.wait_ready().await;
    let port = broker.port;
    let http = reqwest::Client::new();
    let stopped = tokio::task::spawn_blocking(move || {
        broker.restart_after(Duration::from_secs(4));
        broker
    });
    let mut saw_not_ready = false;
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(3) && !saw_not_ready {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let response = http.get(format!("{}/ready", cluster.url(1))).send().await.unwrap();
        if response.status() == 503 {
            let body = response.text().await.unwrap();
            assert!(body.contains("not connected to the MQTT broker"), "{body}");
            saw_not_ready = true;
        }
    }
    assert!(saw_not_ready, "/ready reports the lost broker");
    let broker = stopped.await.unwrap();
    assert_eq!(broker.port, port);
    cluster.wait_ready().await;
}

/// `/ready` promises that requests reach the node. Connected is not enough: until the broker has
/// granted the request subscription it drops requests for want of a subscriber. Node 3 reaches
/// the broker through a proxy that holds its SUBACKs back: it is connected and stays not ready,
/// does not lead, and becomes ready once its SUBACK arrives.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_is_ready_only_once_the_broker_granted_its_request_subscription() {
    let broker = Broker::start();
    let hold = SubackHold::start(broker.port).await;
    let mut cluster = Cluster::prepare(3, &[]);
    for id in 1..=3 {
        let port = if id == 3 { hold.port } else { broker.port };
        cluster.nodes.get_mut(&id).unwrap().args = vec!["--broker".into(), format!("127.0.0.1:{port}")];
        cluster.spawn(id);
    }
    let http = reqwest::Client::new();
    let metrics_of_3 = format!("{}/metrics", cluster.url(3));
    let started = std::time::Instant::now();
    loop {
        let metrics = match http.get(&metrics_of_3).send().await {
            Ok(response) => response.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        if metric(&metrics, "statestore_broker_connected") == Some(1.0) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "node 3 did not connect\n{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Connected, caught up and hearing the leader soon after: on every look for 1.5 s from now
    // it must still not be ready, and say why.
    let connected = std::time::Instant::now();
    while connected.elapsed() < Duration::from_millis(1500) {
        let response = http.get(format!("{}/ready", cluster.url(3))).send().await.unwrap();
        let status = response.status().as_u16();
        let body = response.text().await.unwrap_or_default();
        assert_ne!(status, 200, "node 3 is ready while the broker has not granted its subscription: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let response = http.get(format!("{}/ready", cluster.url(3))).send().await.unwrap();
    let body = response.text().await.unwrap_or_default();
    assert!(body.contains("with the request subscription granted"), "{body}");
    assert_ne!(cluster.wait_leader().await, 3, "a node that receives no requests does not stand");
    let client = RawClient::connect(broker.port, "suback-held").await;
    assert_eq!(client.request(&set(b"held", b"1"), &timestamp()).await.payload, b"+OK\r\n");

    hold.release();
    cluster.wait_ready().await;
}

/// A leader that loses only its broker serves nobody while Raft, healthy, gives nobody a reason
/// to take over. Each node reaches the broker through its own gate; the leader's is cut. Another
/// node must take over and answer, and once its broker is back the old leader follows.
#[tokio::test(flavor = "multi_thread")]
async fn a_leader_that_loses_its_broker_hands_leadership_to_a_connected_node() {
    let broker = Broker::start();
    let (cluster, gates) = cluster_with_gated_brokers(&broker).await;
    let first = cluster.wait_leader().await;
    let client = RawClient::connect(broker.port, "broker-cut").await;
    assert_eq!(client.request(&set(b"before-cut", b"1"), &timestamp()).await.payload, b"+OK\r\n");

    let stood_on_request = |text: &str| elections_started(text, "handover");
    let mut before = std::collections::BTreeMap::new();
    for id in cluster.running() {
        before.insert(id, stood_on_request(&cluster.metrics(id).await));
    }

    gates[&first].cut();
    let answered = first_write_answered(&client, "during-cut").await.unwrap_or_else(|| {
        panic!("no request was answered within 15 s of the leader losing its broker\n{}", cluster.logs())
    });
    let second = cluster.wait_leader().await;
    assert_ne!(second, first, "a connected node leads");
    println!("answered again {} ms after the leader lost its broker", answered.as_millis());
    // The old leader asked it to stand: it did not wait until it stopped hearing that leader.
    assert_eq!(
        stood_on_request(&cluster.metrics(second).await),
        before[&second] + 1.0,
        "node {second} stood at the old leader's request\n{}",
        cluster.logs()
    );

    gates[&first].heal();
    cluster.wait_ready().await;
    assert_eq!(cluster.wait_leader().await, second, "the old leader follows once its broker is back");
    let reply = client.request(&get(b"before-cut"), &timestamp()).await;
    assert_eq!(reply.payload, b"$1\r\n1\r\n", "nothing written before the cut is lost");
}

/// A leader whose broker link turns slow (every byte held 4 s, in order: a congested link, not a
/// lost one) stays connected, so only the time the broker takes to answer it shows the fault.
/// Its answers would come 4 s late for as long as the link stays slow. It must hand leadership
/// to a node whose link is fast and say why on `/ready`; once its link is fast again it is ready.
#[tokio::test(flavor = "multi_thread")]
async fn a_leader_whose_broker_link_turns_slow_hands_leadership_to_a_node_whose_link_is_not() {
    let broker = Broker::start();
    let (cluster, gates) = cluster_with_gated_brokers(&broker).await;
    let first = cluster.wait_leader().await;
    let client = RawClient::connect(broker.port, "broker-slow").await;
    assert_eq!(client.request(&set(b"before-slow", b"1"), &timestamp()).await.payload, b"+OK\r\n");

    gates[&first].slow(Duration::from_secs(4));
    let slowed = std::time::Instant::now();
    // Writes one after the other, each given 10 s, until one is answered within 1 s of its send.
    let mut answered_in_time = None;
    for attempt in 0..30 {
        let key = format!("during-slow-{attempt}");
        let sent = std::time::Instant::now();
        let reply = client
            .request_with(&set(key.as_bytes(), b"1"), client.properties(&timestamp()), Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("{key} was not answered within 10 s\n{}", cluster.logs()));
        assert_eq!(reply.payload, b"+OK\r\n");
        if sent.elapsed() < Duration::from_secs(1) {
            answered_in_time = Some(slowed.elapsed());
            break;
        }
        assert!(slowed.elapsed() < Duration::from_secs(20), "no write answered within 1 s in 20 s\n{}", cluster.logs());
    }
    let answered_in_time = answered_in_time.expect("a write answered in time");
    println!(
        "a write was answered within 1 s again {} ms after the leader's link turned slow",
        answered_in_time.as_millis()
    );
    let second = cluster.wait_leader().await;
    assert_ne!(second, first, "a node whose broker link is fast leads\n{}", cluster.logs());
    let ready = reqwest::get(format!("{}/ready", cluster.url(first))).await.unwrap();
    let status = ready.status().as_u16();
    let body = ready.text().await.unwrap();
    assert_eq!(status, 503, "the node with the slow link is not ready: {body}");
    assert!(body.contains("round trip"), "/ready names the slow round trip: {body}");
    // The probe outstanding at the bound comes back after the delay, and the gauge shows it.
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while metric(&cluster.metrics(first).await, "statestore_broker_round_trip_seconds").unwrap_or(0.0) < 2.0 {
        assert!(std::time::Instant::now() < until, "the round trip gauge of node {first} never showed the delay");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    gates[&first].slow(Duration::ZERO);
    cluster.wait_ready().await;
    let reply = client.request(&get(b"before-slow"), &timestamp()).await;
    assert_eq!(reply.payload, b"$1\r\n1\r\n", "nothing written before the link turned slow is lost");
}

/// A voter started without `--broker` (a misconfiguration the node warns about) that leads
/// serves no MQTT client: it must hand leadership to a voter that has its broker, as a leader
/// that lost its broker does. Nodes 1 and 2 reach the broker through gates, cut at first: a
/// node without its broker does not stand, so node 3 (without a broker, and no voter with one
/// ready) is the one elected. Then the gates open.
#[tokio::test(flavor = "multi_thread")]
async fn a_voter_without_a_broker_that_leads_hands_leadership_over() {
    let broker = Broker::start();
    let mut cluster = Cluster::prepare(3, &[]);
    let mut gates = Vec::new();
    for id in 1..=2 {
        let gate = Gate::start(broker.port).await;
        gate.cut();
        cluster.nodes.get_mut(&id).unwrap().args = vec!["--broker".into(), format!("127.0.0.1:{}", gate.port)];
        gates.push(gate);
    }
    for id in 1..=3 {
        cluster.spawn(id);
    }
    // The first election comes with the cluster's initialization, before a front end has told
    // its node that the broker is out of reach. A node with a broker elected then keeps leading
    // (no voter with a broker is ready to take over); it is stopped once node 3's log has caught
    // up with its own, so that node 3, the only one that may stand, wins the next election. Had
    // node 3's log been behind, the other node with a broker would refuse it and, after 10
    // leases without a leader, stand as a last resort: it is then stopped in turn and the first
    // one started again.
    let waiting = std::time::Instant::now();
    let mut stopped = None;
    while !cluster.status(3).await.is_some_and(|status| status["role"] == "leader") {
        assert!(waiting.elapsed() < Duration::from_secs(40), "node 3 was not elected\n{}", cluster.logs());
        for id in [1, 2] {
            let Some(status) = cluster.status(id).await.filter(|status| status["role"] == "leader") else { continue };
            let caught_up =
                cluster.status(3).await.is_some_and(|third| third["last_log_index"] == status["last_log_index"]);
            if stopped != Some(id) && caught_up {
                cluster.kill(id);
                if let Some(earlier) = stopped.replace(id) {
                    cluster.spawn(earlier);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if let Some(id) = stopped {
        cluster.spawn(id);
    }
    let client = RawClient::connect(broker.port, "brokerless-leader").await;
    for gate in &gates {
        gate.heal();
    }
    let answered = first_write_answered(&client, "after")
        .await
        .unwrap_or_else(|| panic!("no MQTT request answered within 15 s of the gates opening\n{}", cluster.logs()));
    assert_ne!(cluster.wait_leader().await, 3, "a node with its broker leads");
    println!("MQTT answered {} ms after the brokers were reachable", answered.as_millis());
}

/// A node without its broker does not stand for election, but that must not leave a cluster
/// whose voters can all talk to each other without a leader: while the broker is gone for
/// everyone the leader is killed, and one of the two others (neither connected) must take over
/// and serve `/v1/command`; once the broker is reachable again, MQTT requests are answered.
#[tokio::test(flavor = "multi_thread")]
async fn a_leader_lost_while_the_broker_is_gone_for_everyone_is_replaced() {
    let broker = Broker::start();
    let (mut cluster, gates) = cluster_with_gated_brokers(&broker).await;
    let first = cluster.wait_leader().await;
    cluster.set_anywhere("before-outage", "1", Duration::from_secs(5)).await;

    for gate in gates.values() {
        gate.cut();
    }
    // Every node has noticed the outage before the leader goes.
    for id in 1..=3 {
        let waiting = std::time::Instant::now();
        while metric(&cluster.metrics(id).await, "statestore_broker_connected") != Some(0.0) {
            assert!(waiting.elapsed() < Duration::from_secs(10), "node {id} did not notice its broker was gone");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    cluster.kill(first);
    let killed = std::time::Instant::now();
    let answer = cluster.set_anywhere("during-outage", "1", Duration::from_secs(10)).await;
    assert_eq!(answer.response, statestore_protocol::Response::Ok);
    println!("a new leader wrote {} ms after the kill", killed.elapsed().as_millis());

    for gate in gates.values() {
        gate.heal();
    }
    cluster.spawn(first);
    let client = RawClient::connect(broker.port, "after-outage").await;
    first_write_answered(&client, "after-outage").await.unwrap_or_else(|| {
        panic!("no MQTT request answered within 15 s of the broker coming back\n{}", cluster.logs())
    });
    let reply = client.request(&get(b"during-outage"), &timestamp()).await;
    assert_eq!(reply.payload, b"$1\r\n1\r\n", "the write made during the outage is kept");
}

/// A leader cut off from its peers keeps its broker and receives every request, but commits
/// nothing: the answers are the next leader's to give. Once the requests it held had used up a
/// client's in-flight slots, it answered that client's next requests `too many requests in
/// flight` at once, ahead of the next leader's answers, for as long as the cut lasted.
#[tokio::test(flavor = "multi_thread")]
async fn a_leader_cut_off_from_its_peers_leaves_the_answers_to_the_next_leader() {
    let broker = Broker::start();
    let mut cluster = Cluster::prepare(3, &[]);
    let ports: std::collections::BTreeMap<u64, u16> = cluster.nodes.iter().map(|(id, node)| (*id, node.port)).collect();
    let links = PeerLinks::start(&ports).await;
    for (&id, node) in cluster.nodes.iter_mut() {
        node.args = vec![
            "--broker".into(),
            broker.address(),
            "--peer-routes".into(),
            links.routes(id),
            "--broker-client-inflight".into(),
            "4".into(),
        ];
    }
    for id in 1..=3 {
        cluster.spawn(id);
    }
    cluster.wait_ready().await;
    let leader = cluster.wait_leader().await;
    let client = RawClient::connect(broker.port, "cut-leader").await;
    assert_eq!(client.request(&set(b"cut-before", b"1"), &timestamp()).await.payload, b"+OK\r\n");
    links.cut_off(leader, true);
    let mut answered = 0;
    for i in 0..30 {
        let properties = client.properties(&timestamp());
        let key = format!("cut-{i}");
        // No answer is allowed (while the others elect a leader); a wrong one is not.
        if let Some(reply) = client.request_with(&set(key.as_bytes(), b"1"), properties, Duration::from_secs(2)).await {
            assert_eq!(text(&reply.payload), "+OK\r\n", "request {i} after the cut\n{}", cluster.logs());
            answered += 1;
        }
    }
    assert!(answered >= 20, "the next leader answered only {answered} of 30 writes\n{}", cluster.logs());
    links.cut_off(leader, false);
}

/// The broker forgets a request once the node acknowledges it: a node that acknowledged a
/// request before sending its response, and then died, would leave it unanswered for good. A
/// proxy between the node and the broker records the order on the wire.
#[tokio::test(flavor = "multi_thread")]
async fn a_request_is_acknowledged_to_the_broker_only_after_its_response() {
    const REQUESTS: usize = 400;
    let broker = Broker::start();
    let tap = Tap::start(broker.port).await;
    let cluster = Cluster::start(1, &["--broker", &format!("127.0.0.1:{}", tap.port)]).await;
    cluster.wait_ready().await;
    let client = RawClient::connect(broker.port, "ack-after-response").await;
    let mut correlations = Vec::new();
    for i in 0..REQUESTS {
        let properties = client.properties(&timestamp());
        correlations.push(properties.correlation_data.clone().unwrap().to_vec());
        client.publish(&set(format!("ack-order-{}", i % 50).as_bytes(), b"v"), QoS::AtLeastOnce, properties).await;
    }
    for correlation in &correlations {
        let answered = client
            .wait_for(Duration::from_secs(10), |r| r.properties.correlation_data.as_deref() == Some(&correlation[..]))
            .await;
        assert!(answered.is_some(), "every request is answered");
    }
    // The last acknowledgements follow the last responses.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mine = |correlation: &Option<Vec<u8>>| correlation.as_ref().is_some_and(|c| correlations.contains(c));
    loop {
        let acks = tap.to_broker.lock().unwrap().iter().filter(|p| matches!(p, Seen::PubAck { .. })).count();
        if acks >= REQUESTS || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let delivered: std::collections::HashMap<u16, Vec<u8>> = tap
        .from_broker
        .lock()
        .unwrap()
        .iter()
        .filter_map(|p| match p {
            Seen::Publish { pkid, correlation, .. } if mine(correlation) => Some((*pkid, correlation.clone().unwrap())),
            _ => None,
        })
        .collect();
    assert_eq!(delivered.len(), REQUESTS, "each request reached the node once, with its own packet id");
    let mut answered = std::collections::HashSet::new();
    let mut early = Vec::new();
    let mut acked = 0;
    for packet in tap.to_broker.lock().unwrap().iter() {
        match packet {
            Seen::Publish { correlation: Some(correlation), .. } => {
                answered.insert(correlation.clone());
            }
            Seen::PubAck { pkid } => {
                if let Some(correlation) = delivered.get(pkid) {
                    acked += 1;
                    if !answered.contains(correlation) {
                        early.push(*pkid);
                    }
                }
            }
            _ => {}
        }
    }
    assert_eq!(acked, REQUESTS, "every request was acknowledged");
    assert!(early.is_empty(), "{} of {REQUESTS} requests acknowledged before their response: {early:?}", early.len());
}

/// The leader subscribes to requests at QoS 1 (the broker redelivers what it leaves
/// unanswered), followers at QoS 0 (the broker keeps no copy in flight for them); a follower
/// that becomes leader subscribes again at QoS 1. A proxy records the QoS the broker delivered
/// each request at, per node.
#[tokio::test(flavor = "multi_thread")]
async fn the_leader_receives_requests_at_qos_1_and_followers_at_qos_0() {
    let broker = Broker::start();
    let tap = Tap::start(broker.port).await;
    let mut cluster = Cluster::start(3, &["--broker", &format!("127.0.0.1:{}", tap.port)]).await;
    cluster.wait_ready().await;
    let client = RawClient::connect(broker.port, "qos-by-role").await;
    let first = cluster.wait_leader().await;
    wait_subscribed_at_qos_1(&tap, first).await;
    let send = |tag: &'static str| {
        let client = &client;
        async move {
            for i in 0..20 {
                let mut properties = client.properties(&timestamp());
                properties.correlation_data = Some(bytes::Bytes::from(format!("{tag}-{i:013}")));
                let key = format!("qos-{tag}-{i}");
                let response =
                    client.request_with(&set(key.as_bytes(), b"v"), properties, Duration::from_secs(10)).await;
                assert_eq!(response.expect("answered within 10 s").payload, b"+OK\r\n", "{tag} {i}");
            }
        }
    };
    send("b4").await;
    assert_delivered_by_role(&tap, &cluster.running(), "b4", first).await;
    assert_nothing_dropped(&cluster).await;

    cluster.kill(first);
    let second = cluster.wait_leader().await;
    wait_subscribed_at_qos_1(&tap, second).await;
    send("af").await;
    assert_delivered_by_role(&tap, &cluster.running(), "af", second).await;
    assert_nothing_dropped(&cluster).await;
}

/// No node dropped a request: a follower keeps what it received at QoS 0 (its subscription's
/// QoS, not the client's) in its shadow.
async fn assert_nothing_dropped(cluster: &Cluster) {
    for id in cluster.running() {
        let dropped = metric(&cluster.metrics(id).await, "statestore_requests_dropped_total").unwrap_or(0.0);
        assert_eq!(dropped, 0.0, "node {id} dropped requests");
    }
}

/// Waits until node `id`'s last SUBSCRIBE asked for QoS 1 and the broker answered it.
async fn wait_subscribed_at_qos_1(tap: &Tap, id: u64) {
    let client_id = format!("statestore-{id}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let subscribes: Vec<u8> = tap.from_client.lock().unwrap()[&client_id]
            .iter()
            .filter_map(|p| match p {
                Seen::Subscribe { qos } => Some(*qos),
                _ => None,
            })
            .collect();
        let subacks = tap.to_client.lock().unwrap()[&client_id].iter().filter(|p| **p == Seen::Other(9)).count();
        if subscribes.last() == Some(&1) && subacks == subscribes.len() {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "node {id} did not subscribe at QoS 1: {subscribes:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every running node received the 20 requests tagged `tag`: the leader at QoS 1, the others
/// at QoS 0.
async fn assert_delivered_by_role(tap: &Tap, running: &[u64], tag: &str, leader: u64) {
    let qos_of = |id: u64| -> Vec<u8> {
        let to_client = tap.to_client.lock().unwrap();
        let seen = to_client.get(&format!("statestore-{id}")).map(Vec::as_slice).unwrap_or_default();
        seen.iter()
            .filter_map(|p| match p {
                Seen::Publish { qos, correlation: Some(c), .. } if c.starts_with(tag.as_bytes()) => Some(*qos),
                _ => None,
            })
            .collect()
    };
    // The leader has answered them all; a follower's copies may still be on their way.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while running.iter().any(|id| qos_of(*id).len() < 20) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for id in running {
        let qos = qos_of(*id);
        let expected = if *id == leader { 1 } else { 0 };
        assert!(qos.iter().all(|q| *q == expected), "node {id} (leader {leader}) got {tag} requests at QoS {qos:?}");
        assert_eq!(qos.len(), 20, "node {id} received every {tag} request");
    }
}

/// A write refused for a `__ts` too far ahead stays refused: a follower that takes over later,
/// when the skew has passed, must not execute it (the client was told it failed).
#[tokio::test(flavor = "multi_thread")]
async fn a_write_refused_for_clock_skew_is_not_applied_by_the_next_leader() {
    let (broker, mut cluster) = cluster_with_broker().await;
    let client = RawClient::connect(broker.port, "skewed-then-failover").await;
    // 1.5 s past the 60 s bound: refused now, within the bound after the takeover.
    let ahead = Hlc::new(now_ms() + 61_500, 0, "skewed").to_string();
    let mut properties = client.properties(&ahead);
    properties.message_expiry_interval = Some(30);
    let refused = client.request_with(&set(b"skewed-key", b"v"), properties, Duration::from_secs(10)).await.unwrap();
    assert!(
        text(&refused.payload).starts_with("-ERR the request timestamp is too far in the future"),
        "{}",
        text(&refused.payload)
    );
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let leader = cluster.wait_leader().await;
    cluster.kill(leader);
    let next = cluster.wait_leader().await;
    assert_ne!(next, leader);
    let read = client.request(&get(b"skewed-key"), &timestamp()).await;
    assert_eq!(read.payload, b"$-1\r\n", "the refused write was applied by the new leader");
    // Anything the new leader sends again for it is the same refusal.
    let again = client
        .wait_for(Duration::from_millis(500), |r| r.properties.correlation_data == refused.properties.correlation_data)
        .await;
    if let Some(again) = again {
        assert_eq!(again.payload, refused.payload);
    }
}

/// A write through `POST /v1/command` takes the same path as one over MQTT: its notification goes
/// out at once, with no MQTT request to wake the publisher.
#[tokio::test(flavor = "multi_thread")]
async fn a_write_through_the_http_command_route_notifies_watchers_at_once() {
    let (broker, cluster) = cluster_with_broker().await;
    let client = RawClient::connect(broker.port, "http-watcher").await;
    let registered = client.request(&KeyNotify { key: b"http-key".to_vec(), stop: false }.encode(), &timestamp()).await;
    assert_eq!(text(&registered.payload), "+OK\r\n");
    let leader = cluster.wait_leader().await;
    cluster.set(leader, "http-key", "from-http").await.unwrap();
    let notification = client
        .wait_for(Duration::from_secs(1), |r| r.topic.starts_with(NOTIFICATION_PREFIX))
        .await
        .expect("no notification within 1 s of a write through /v1/command");
    assert_eq!(notification.payload, encode_bulk_array(&[&b"NOTIFY"[..], b"SET", b"VALUE", b"from-http"]));
}

/// Writes `{prefix}-N` keys one after the other, each given 1 s for its answer, until one is
/// answered `+OK`: how long that took, or `None` if none was within 15 s.
async fn first_write_answered(client: &RawClient, prefix: &str) -> Option<Duration> {
    let started = std::time::Instant::now();
    for attempt in 0.. {
        let key = format!("{prefix}-{attempt}");
        let properties = client.properties(&timestamp());
        if let Some(reply) = client.request_with(&set(key.as_bytes(), b"1"), properties, Duration::from_secs(1)).await {
            assert_eq!(reply.payload, b"+OK\r\n");
            return Some(started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(15) {
            return None;
        }
    }
    None
}

/// Three nodes, each reaching `broker` through a gate of its own (by node id), started and ready.
async fn cluster_with_gated_brokers(broker: &Broker) -> (Cluster, std::collections::BTreeMap<u64, Gate>) {
    let mut cluster = Cluster::prepare(3, &[]);
    let mut gates = std::collections::BTreeMap::new();
    for id in 1..=3 {
        let gate = Gate::start(broker.port).await;
        cluster.nodes.get_mut(&id).unwrap().args = vec!["--broker".into(), format!("127.0.0.1:{}", gate.port)];
        gates.insert(id, gate);
        cluster.spawn(id);
    }
    cluster.wait_ready().await;
    (cluster, gates)
}

async fn cluster_with_broker() -> (Broker, Cluster) {
    let broker = Broker::start();
    let cluster = Cluster::start(3, &["--broker", &broker.address()]).await;
    cluster.wait_ready().await;
    (broker, cluster)
}

fn text(payload: &[u8]) -> String {
    String::from_utf8_lossy(payload).into_owned()
}

fn set(key: &[u8], value: &[u8]) -> Vec<u8> {
    Set::new(key.to_vec(), value.to_vec()).encode()
}

fn get(key: &[u8]) -> Vec<u8> {
    Get { key: key.to_vec() }.encode()
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_requests_get_the_exact_error_or_the_documented_drop() {
    let (broker, cluster) = cluster_with_broker().await;
    let client = RawClient::connect(broker.port, "barrage").await;
    let ts = timestamp();

    let before = client.request(&set(b"stable", b"kept"), &ts).await;
    assert_eq!(before.payload, b"+OK\r\n");
    let version = before.user("__ts").expect("SET +OK carries __ts").to_string();

    let errors: Vec<(&str, Vec<u8>, &str)> = vec![
        ("not RESP", b"hello".to_vec(), "syntax error"),
        ("empty payload", Vec::new(), "syntax error"),
        ("truncated array", b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n".to_vec(), "syntax error"),
        ("bulk length too long", b"*2\r\n$3\r\nGET\r\n$9\r\nk\r\n".to_vec(), "syntax error"),
        ("negative length", b"*2\r\n$3\r\nGET\r\n$-5\r\nk\r\n".to_vec(), "syntax error"),
        ("missing CRLF", b"*2\r\n$3\r\nGET\r\n$1\r\nk".to_vec(), "syntax error"),
        ("integer element", b"*2\r\n$3\r\nGET\r\n:1\r\n".to_vec(), "syntax error"),
        ("trailing bytes", b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\nXX".to_vec(), "syntax error"),
        ("unknown verb", encode_bulk_array(&[&b"INCR"[..], b"k"]), "unknown command"),
        ("lower-case verb", encode_bulk_array(&[&b"get"[..], b"k"]), "unknown command"),
        ("GET arity", encode_bulk_array(&[&b"GET"[..]]), "wrong number of arguments"),
        ("DEL arity", encode_bulk_array(&[&b"DEL"[..], b"a", b"b"]), "wrong number of arguments"),
        ("SET arity", encode_bulk_array(&[&b"SET"[..], b"k"]), "wrong number of arguments"),
        ("empty key", encode_bulk_array(&[&b"GET"[..], b""]), "the key length is zero"),
        ("bad PX", encode_bulk_array(&[&b"SET"[..], b"k", b"v", b"PX", b"soon"]), "syntax error"),
        ("negative PX", encode_bulk_array(&[&b"SET"[..], b"k", b"v", b"PX", b"-5"]), "syntax error"),
        ("unknown option", encode_bulk_array(&[&b"SET"[..], b"k", b"v", b"XX"]), "syntax error"),
    ];
    for (case, payload, expected) in &errors {
        let reply = client.request(payload, &ts).await;
        assert_eq!(text(&reply.payload), format!("-ERR {expected}\r\n"), "{case}");
        assert_eq!(reply.user("__stat"), Some("200"), "{case}: state-store errors are __stat=200");
    }

    // Envelope properties.
    let mut no_ts = client.properties(&ts);
    no_ts.user_properties.retain(|(k, _)| k != "__ts");
    let reply = client.request_with(&set(b"k", b"v"), no_ts, Duration::from_secs(10)).await.unwrap();
    assert_eq!(reply.payload, b"-ERR missing timestamp\r\n");
    for bad in ["garbage", "1:2", "x:0:node", "12:y:node"] {
        let reply = client.request(&set(b"k", b"v"), bad).await;
        assert_eq!(reply.payload, b"-ERR malformed timestamp\r\n", "__ts {bad:?}");
    }
    let future = Hlc::new(now_ms() + 120_000, 0, "skewed").to_string();
    let reply = client.request(&set(b"k", b"v"), &future).await;
    assert_eq!(
        text(&reply.payload),
        "-ERR the request timestamp is too far in the future; ensure that the client and broker system clocks are synchronized\r\n"
    );
    let mut bad_ft = client.properties(&ts);
    bad_ft.user_properties.push(("__ft".into(), "not-a-token".into()));
    let reply = client.request_with(&set(b"k", b"v"), bad_ft, Duration::from_secs(10)).await.unwrap();
    assert_eq!(reply.payload, b"-ERR malformed timestamp\r\n");
    let mut future_ft = client.properties(&ts);
    future_ft.user_properties.push(("__ft".into(), Hlc::new(now_ms() + 10 * 365 * 86_400_000, 0, "x").to_string()));
    let reply = client.request_with(&set(b"k", b"v"), future_ft, Duration::from_secs(10)).await.unwrap();
    assert_eq!(
        text(&reply.payload),
        "-ERR the request fencing token timestamp is too far in the future; ensure that the client and broker system clocks are synchronized\r\n"
    );
    let mut no_correlation = client.properties(&ts);
    no_correlation.correlation_data = None;
    client.publish(&get(b"stable"), QoS::AtLeastOnce, no_correlation).await;
    let reply = client
        .wait_for(Duration::from_secs(10), |r| {
            r.topic == client.response_topic && r.properties.correlation_data.is_none()
        })
        .await
        .expect("a request without correlation data is answered");
    assert_eq!(reply.payload, b"-ERR the request carries no correlation data\r\n");
    let mut version_2 = client.properties(&ts);
    version_2.user_properties.retain(|(k, _)| k != "__protVer");
    version_2.user_properties.push(("__protVer".into(), "2.0".into()));
    let reply = client.request_with(&get(b"stable"), version_2, Duration::from_secs(10)).await.unwrap();
    assert_eq!(reply.user("__stat"), Some("505"));
    assert_eq!(reply.user("__supProtMajVer"), Some("1"));
    assert_eq!(reply.user("__requestProtVer"), Some("2.0"));

    // Drops: no answer anywhere, counted by reason.
    let qos0 = client.properties(&ts);
    let qos0_correlation = qos0.correlation_data.clone();
    client.publish(&set(b"dropped", b"qos0"), QoS::AtMostOnce, qos0).await;
    let mut missing_topic = client.properties(&ts);
    missing_topic.response_topic = None;
    client.publish(&set(b"dropped", b"no-topic"), QoS::AtLeastOnce, missing_topic).await;
    for forbidden in
        [REQUEST_TOPIC.to_string(), format!("{NOTIFICATION_PREFIX}/{}/command/notify/6B", hex_upper(b"barrage"))]
    {
        let mut properties = client.properties(&ts);
        properties.response_topic = Some(forbidden);
        client.publish(&set(b"dropped", b"forbidden"), QoS::AtLeastOnce, properties).await;
    }
    // A response topic outside `clients/{client}/#`: another device's command topic, with a
    // subscriber. The node would publish the stored value there with its own broker rights.
    const DEVICE_TOPIC: &str = "devices/thermostat-9/commands/set";
    let device = RawClient::connect(broker.port, "thermostat-9").await;
    device.client.subscribe(DEVICE_TOPIC, QoS::AtLeastOnce).await.unwrap();
    let subscribed = async {
        loop {
            client.client.publish(DEVICE_TOPIC, QoS::AtLeastOnce, false, b"probe".to_vec()).await.unwrap();
            if device.wait_for(Duration::from_millis(300), |r| r.topic == DEVICE_TOPIC).await.is_some() {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), subscribed).await.expect("the device's subscription works");
    assert_eq!(client.request(&set(b"setpoint", b"{\"setpoint\": 99}"), &ts).await.payload, b"+OK\r\n");
    let mut hijack = client.properties(&ts);
    hijack.response_topic = Some(DEVICE_TOPIC.into());
    client.publish(&get(b"setpoint"), QoS::AtLeastOnce, hijack).await;
    assert!(
        client.wait_for(NO_ANSWER, |r| r.properties.correlation_data == qos0_correlation).await.is_none(),
        "QoS 0 requests are not answered"
    );
    assert!(
        device.wait_for(Duration::ZERO, |r| r.topic == DEVICE_TOPIC).await.is_none(),
        "an answer was published onto the device's command topic"
    );
    assert!(client.take_notifications().is_empty(), "a forged notification topic got nothing");

    // The cluster is healthy and nothing changed.
    cluster.wait_ready().await;
    let after = client.request(&get(b"stable"), &timestamp()).await;
    assert_eq!(after.payload, b"$4\r\nkept\r\n");
    assert_eq!(after.user("__ts"), Some(version.as_str()), "the key kept its version");
    let dropped = client.request(&get(b"dropped"), &timestamp()).await;
    assert_eq!(dropped.payload, b"$-1\r\n", "no dropped request was executed");
    let leader = cluster.wait_leader().await;
    let metrics = cluster.metrics(leader).await;
    for reason in ["qos0", "missing_response_topic", "forbidden_response_topic", "response_topic_not_allowed"] {
        let series = format!("statestore_requests_dropped_total{{reason=\"{reason}\"}}");
        assert!(metric(&metrics, &series).unwrap_or(0.0) >= 1.0, "{series} counted\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn large_values_and_binary_keys_round_trip_byte_exact() {
    let (broker, cluster) = cluster_with_broker().await;
    let client = RawClient::connect(broker.port, "binary").await;
    let value: Vec<u8> = (0..(1 << 20)).map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let ts = timestamp();
    assert_eq!(client.request(&set(b"large", &value), &ts).await.payload, b"+OK\r\n");
    let reply = client.request(&get(b"large"), &ts).await;
    let mut expected = format!("${}\r\n", value.len()).into_bytes();
    expected.extend_from_slice(&value);
    expected.extend_from_slice(b"\r\n");
    assert!(reply.payload == expected, "1 MiB value is byte-exact ({} bytes back)", reply.payload.len());

    for key in [&b"nul\x00inside"[..], b"crlf\r\nkey\r\n", b"\xff\xfe not utf-8", b"$3\r\nGET\r\n"] {
        let value = [key, b"-value"].concat();
        assert_eq!(client.request(&set(key, &value), &ts).await.payload, b"+OK\r\n", "{key:?}");
        let mut expected = format!("${}\r\n", value.len()).into_bytes();
        expected.extend_from_slice(&value);
        expected.extend_from_slice(b"\r\n");
        assert_eq!(client.request(&get(key), &ts).await.payload, expected, "{key:?}");
    }
    // A key notification topic for a binary key is its upper-case hex.
    assert_eq!(
        client.request(&KeyNotify { key: b"\x00\r\n".to_vec(), stop: false }.encode(), &ts).await.payload,
        b"+OK\r\n"
    );
    assert_eq!(client.request(&set(b"\x00\r\n", b"v"), &timestamp()).await.payload, b"+OK\r\n");
    let notification = client
        .wait_for(Duration::from_secs(5), |r| r.topic.starts_with(NOTIFICATION_PREFIX))
        .await
        .expect("a notification for the binary key");
    assert!(notification.topic.ends_with("/command/notify/000D0A"), "{}", notification.topic);
    assert_eq!(notification.payload, b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$1\r\nv\r\n");
    assert!(notification.user("__ts").is_some());
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redelivered_request_is_applied_once_even_across_a_leader_kill() {
    let (broker, mut cluster) = cluster_with_broker().await;
    let client = RawClient::connect(broker.port, "redeliver").await;
    let ts = timestamp();
    let nx = encode_bulk_array(&[&b"SET"[..], b"once", b"first", b"NX"]);

    let properties = client.properties(&ts);
    let first = client.request_with(&nx, properties.clone(), Duration::from_secs(10)).await.unwrap();
    let again = client.request_with(&nx, properties.clone(), Duration::from_secs(10)).await.unwrap();
    assert_eq!(first.payload, b"+OK\r\n");
    assert_eq!(again.payload, b"+OK\r\n", "the duplicate is answered from the dedup table, not with :-1");
    assert_eq!(first.user("__ts"), again.user("__ts"), "with the same version");

    // A second request, then the leader dies, then its redelivery reaches the new leader.
    let second = encode_bulk_array(&[&b"SET"[..], b"twice", b"v", b"NX"]);
    let properties = client.properties(&timestamp());
    let answered = client.request_with(&second, properties.clone(), Duration::from_secs(10)).await.unwrap();
    assert_eq!(answered.payload, b"+OK\r\n");
    let leader = cluster.wait_leader().await;
    cluster.kill(leader);
    let replayed =
        client.request_with(&second, properties, Duration::from_secs(15)).await.expect("answered by the new leader");
    assert_eq!(replayed.payload, b"+OK\r\n");
    assert_eq!(replayed.user("__ts"), answered.user("__ts"));
    let value = client.request(&get(b"twice"), &timestamp()).await;
    assert_eq!(value.payload, b"$1\r\nv\r\n");
    assert_eq!(value.user("__ts"), answered.user("__ts"), "applied once: the version is the first one");
    let new_leader = cluster.wait_leader().await;
    let metrics = cluster.metrics(new_leader).await;
    assert!(metric(&metrics, "statestore_dedup_hits_total").unwrap_or(0.0) >= 1.0, "{metrics}");
    let _ = Bytes::new();
}

/// One request of the barrage: a mutated payload ([`barrage::mutated_payload`]) and mutated
/// properties, keeping what makes a request answerable (QoS 1, a response topic, correlation
/// data, a message expiry).
fn barrage_request(dice: &mut fastrand::Rng, client: &RawClient, keys: &[Vec<u8>]) -> (Vec<u8>, PublishProperties) {
    let payload = barrage::mutated_payload(dice, keys);
    let mut properties = client.properties(&timestamp());
    let user = &mut properties.user_properties;
    match dice.u8(..20) {
        0 => user.retain(|(k, _)| k != "__ts"),
        1 => set_user(user, "__ts", dice.choice(barrage::BROKEN_TIMESTAMPS).unwrap()),
        2 => set_user(user, "__protVer", ["", "1", "1.1", "0.9", "2.0", "abc", "1.0.0"][dice.usize(..7)]),
        3 => user.push(("__ft".into(), dice.choice(barrage::FENCING_TOKENS).unwrap().into())),
        4 => user.retain(|(k, _)| k != "__srcId"),
        5 => set_user(user, "__srcId", &"s".repeat(dice.usize(..10_000))),
        6 => {
            for n in 0..dice.usize(1..50) {
                user.push((format!("__x{n}"), "y".repeat(dice.usize(..200))));
            }
        }
        7 => properties.content_type = Some(["", "text/plain", "application/json"][dice.usize(..3)].into()),
        8 => user.push(("__ts".into(), timestamp())),
        _ => {}
    }
    (payload, properties)
}

fn set_user(user: &mut Vec<(String, String)>, name: &str, value: &str) {
    user.retain(|(k, _)| k != name);
    user.push((name.into(), value.into()));
}

/// Thousands of mutated requests (bytes flipped, cut or inserted, lengths and counts beyond any
/// payload, deep nesting, commands doubled, values up to 100 kB, and broken, missing, doubled
/// or oversized properties) through the broker to a 3-node cluster: every one is answered with a
/// well-formed reply or a protocol status, no node stops or panics, a plain request is served
/// after, and the three nodes hold the same keys, values and versions. The seed is printed, and
/// `BARRAGE_SEED` replays one.
#[tokio::test(flavor = "multi_thread")]
async fn a_barrage_of_mutated_requests_is_answered_and_leaves_the_nodes_serving_and_agreeing() {
    let (broker, mut cluster) = cluster_with_broker().await;
    let client = RawClient::connect_with_nagle(broker.port, "barrage-mutations", false).await;
    let seed = barrage::seed();
    let mut dice = fastrand::Rng::with_seed(seed);
    let keys = barrage::keys();
    let requests: Vec<_> = (0..5000).map(|_| barrage_request(&mut dice, &client, &keys)).collect();

    let answers = futures::stream::iter(requests.iter().enumerate())
        .map(|(n, (payload, properties))| {
            let client = &client;
            async move { (n, client.request_with(payload, properties.clone(), Duration::from_secs(20)).await) }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let mut kinds = std::collections::BTreeMap::<String, usize>::new();
    for (n, answer) in answers {
        let (payload, properties) = &requests[n];
        let shown = String::from_utf8_lossy(&payload[..payload.len().min(120)]).into_owned();
        let answer = answer.unwrap_or_else(|| {
            panic!("seed {seed}: request {n} never answered: {shown:?} {properties:?}\n{}", cluster.logs())
        });
        let status =
            answer.user("__stat").unwrap_or_else(|| panic!("seed {seed}: request {n} answered without __stat"));
        let kind = match Response::decode(&answer.payload) {
            Ok(reply) => barrage::reply_kind(&reply),
            Err(_) if status != "200" => format!("__stat {status}"),
            Err(_) => panic!("seed {seed}: request {n} ({shown:?}) answered {:?}", text(&answer.payload)),
        };
        *kinds.entry(kind).or_default() += 1;
    }
    println!("answers by kind: {kinds:#?}");
    assert!(kinds.len() >= 8, "seed {seed}: the barrage reached only {kinds:?}");

    barrage::assert_nodes_serving(&mut cluster, seed).await;
    let after = client.request(&set(b"barrage-after", b"served"), &timestamp()).await;
    assert_eq!(after.payload, b"+OK\r\n", "seed {seed}");
    let read = client.request(&get(b"barrage-after"), &timestamp()).await;
    assert_eq!(text(&read.payload), "$6\r\nserved\r\n", "seed {seed}");

    barrage::assert_nodes_agree(&cluster, seed, b"barrage-after").await;
}
