//! The MQTT envelope of a request (PROTOCOL.md §2–§4): what decides whether it is answered at
//! all, the identity it is deduplicated by, and the properties of its response. Pure: no I/O.

use std::time::{Duration, Instant};

use bytes::Bytes;
use rumqttc::v5::mqttbytes::v5::{Publish, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use statestore_protocol::topic::{check_response_topic, hex_upper, ResponseTopicProblem, ResponseTopics};
use statestore_protocol::{property, Command, Hlc, Request, Response, StoreError};
use statestore_statemachine::{ClientRequest, Reply, RequestIdentity};

use crate::access::{KeyAccess, Prefixes};

/// The content type of every response and notification.
pub const CONTENT_TYPE: &str = "application/octet-stream";
/// The protocol version we speak and answer with.
pub const PROTOCOL_VERSION: &str = "1.0";
/// The major version we support, sent with a 505.
pub const SUPPORTED_MAJOR: &str = "1";

/// Why a request is acknowledged and dropped without an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// QoS 0: the protocol requires QoS 1.
    QoS0,
    ResponseTopic(ResponseTopicProblem),
    /// The request's message expiry passed before it could be answered.
    Expired,
    /// The follower's shadow buffer was full; the oldest request left it.
    ShadowFull,
    /// A QoS 0 copy arrived while the dispatcher's queue held its most bytes.
    DispatchFull,
}

impl DropReason {
    /// The label of `statestore_requests_dropped_total`.
    pub fn label(self) -> &'static str {
        match self {
            DropReason::QoS0 => "qos0",
            DropReason::ResponseTopic(problem) => problem.label(),
            DropReason::Expired => "expired",
            DropReason::ShadowFull => "shadow_full",
            DropReason::DispatchFull => "dispatch_full",
        }
    }
}

/// What a request asks for once its envelope is known to be answerable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// A well-formed command: executed by the leader.
    Command(Request),
    /// Answered with `__stat=200` and `-ERR <text>`, without touching the state.
    Invalid(StoreError),
    /// `__protVer` with a major other than 1: answered with `__stat=505`.
    UnsupportedVersion(String),
}

/// How the broker delivered a request: at the QoS its client published it, or perhaps capped at
/// QoS 0 by this node's QoS 0 subscription (a follower's), so that a QoS 0 delivery says
/// nothing about the client's QoS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivered {
    AsPublished,
    MaybeCapped,
}

/// An answerable request.
#[derive(Debug, Clone)]
pub struct Inbound {
    pub response_topic: String,
    pub correlation_data: Option<Bytes>,
    /// The client its response topic names (the `{client}` segment of the pattern it matches):
    /// what key authorization and the per-client quotas go by, since a broker ACL can tie it to
    /// the publisher, which it cannot do for `__srcId`.
    pub client: String,
    /// `__srcId`, else [`Inbound::client`]; for KEYNOTIFY, `__srcId` must agree with the client.
    pub client_id: Option<String>,
    pub message_expiry_secs: Option<u32>,
    /// When the client stops waiting: receipt plus the remaining message expiry.
    pub deadline: Option<Instant>,
    /// The keys this client may use, under an authorization map; `None`: every key.
    pub allowed: Option<Prefixes>,
    pub body: Body,
    /// About what holding this request costs in memory: its payload, topics and properties.
    pub held_bytes: usize,
}

impl Inbound {
    /// Reads a request publish received at `received`. A request its client published at QoS 0
    /// is dropped; one `delivered` at QoS 0 through a QoS 0 subscription may have been QoS 1
    /// and is kept. One whose response topic matches none of `topics` is dropped. Under an
    /// authorization map (`access`), a command on a key outside the client's prefixes is
    /// answered `not authorized`.
    pub fn classify(
        publish: &Publish,
        delivered: Delivered,
        received: Instant,
        topics: &ResponseTopics,
        access: Option<&KeyAccess>,
    ) -> Result<Inbound, DropReason> {
        if publish.qos == QoS::AtMostOnce && delivered == Delivered::AsPublished {
            return Err(DropReason::QoS0);
        }
        let empty = PublishProperties::default();
        let properties = publish.properties.as_ref().unwrap_or(&empty);
        let response_topic =
            check_response_topic(properties.response_topic.as_deref()).map_err(DropReason::ResponseTopic)?.to_string();
        let client = topics
            .client_of(&response_topic)
            .ok_or(DropReason::ResponseTopic(ResponseTopicProblem::NotAllowed))?
            .to_string();
        let user = |name: &str| properties.user_properties.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        let src_id = user(property::SOURCE_ID).filter(|id| !id.is_empty());
        let client_id = Some(src_id.unwrap_or(&client).to_string());
        let message_expiry_secs = properties.message_expiry_interval;
        let deadline = message_expiry_secs.map(|secs| received + Duration::from_secs(u64::from(secs)));
        let correlation_data = properties.correlation_data.clone().filter(|data| !data.is_empty());
        let allowed = access.map(|access| access.prefixes_for(&client).clone());
        let refused = |key: Option<&[u8]>| match (&allowed, key) {
            (Some(prefixes), Some(key)) => !prefixes.allows(key),
            _ => false,
        };
        let body = if let Some(version) = user(property::PROTOCOL_VERSION).filter(|v| !supported_version(v)) {
            Body::UnsupportedVersion(version.to_string())
        } else if correlation_data.is_none() {
            Body::Invalid(StoreError::MissingCorrelationData)
        } else {
            match Request::parse(&publish.payload, user(property::TIMESTAMP), user(property::FENCING_TOKEN)) {
                // Registrations belong to the client id: one that disagrees with the response
                // topic, which the broker's ACLs can tie to the publisher, is not taken on trust.
                Ok(request) if matches!(request.command, Command::KeyNotify(_)) && !src_id_matches(src_id, &client) => {
                    Body::Invalid(StoreError::ClientIdMismatch)
                }
                Ok(request) if refused(request.command.key()) => Body::Invalid(StoreError::NotAuthorized),
                Ok(request) => Body::Command(request),
                Err(error) => Body::Invalid(error),
            }
        };
        Ok(Inbound {
            response_topic,
            correlation_data,
            client,
            client_id,
            message_expiry_secs,
            deadline,
            allowed,
            body,
            held_bytes: held_bytes(publish),
        })
    }

    /// `reply` as this client may see it: a SCAN page keeps only the keys it is authorized for
    /// (and its continuation token, so the scan goes on).
    pub fn authorized(&self, mut reply: Reply) -> Reply {
        if let (Some(prefixes), Response::Keys { keys, .. }) = (&self.allowed, &mut reply.response) {
            keys.retain(|key| prefixes.allows(key));
        }
        reply
    }

    /// The key under which this request counts against its client's in-flight limit.
    pub fn client_key(&self) -> &str {
        &self.client
    }

    /// The request as it goes into the log: with the client id and the dedup identity.
    pub fn client_request(&self) -> Option<ClientRequest> {
        let Body::Command(request) = &self.body else { return None };
        Some(ClientRequest {
            request: request.clone(),
            client_id: self.client_id.clone(),
            identity: self.identity(),
            message_expiry_secs: self.message_expiry_secs,
        })
    }

    /// The command's verb for metric labels; `INVALID` for a request that is not a command.
    pub fn verb(&self) -> &'static str {
        match &self.body {
            Body::Command(request) => request.command.verb(),
            _ => "INVALID",
        }
    }

    /// (response topic, correlation data): the same pair again is the same request.
    pub fn identity(&self) -> Option<RequestIdentity> {
        let (response_topic, correlation_data) = self.identity_parts()?;
        Some(RequestIdentity {
            response_topic: response_topic.to_string(),
            correlation_data: correlation_data.to_vec(),
        })
    }

    /// The parts of [`Inbound::identity`], borrowed; `None` without correlation data.
    pub fn identity_parts(&self) -> Option<(&str, &[u8])> {
        Some((&self.response_topic, self.correlation_data.as_deref()?))
    }

    /// The correlation data in hex, for log lines that follow one request (the CLI's timeouts
    /// name a request the same way).
    pub fn correlation_hex(&self) -> String {
        hex_upper(self.correlation_data.as_deref().unwrap_or_default())
    }

    /// Whether the client has stopped waiting at `now`.
    pub fn expired(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|deadline| now >= deadline)
    }

    /// Properties of the answer: `__stat`, `__protVer`, the content type, the correlation data,
    /// `__ts` when given, and what remains of the message expiry (at least one second).
    pub fn response_properties(&self, status: u16, version: Option<&Hlc>, now: Instant) -> PublishProperties {
        let mut user_properties = vec![
            (property::STATUS.to_string(), status.to_string()),
            (property::PROTOCOL_VERSION.to_string(), PROTOCOL_VERSION.to_string()),
        ];
        if let Some(version) = version {
            user_properties.push((property::TIMESTAMP.to_string(), version.to_string()));
        }
        if let Body::UnsupportedVersion(requested) = &self.body {
            user_properties.push((property::SUPPORTED_MAJOR_VERSIONS.to_string(), SUPPORTED_MAJOR.to_string()));
            user_properties.push((property::REQUESTED_PROTOCOL_VERSION.to_string(), requested.clone()));
            user_properties
                .push((property::STATUS_MESSAGE.to_string(), format!("protocol version {requested} is not supported")));
        }
        let message_expiry_interval = self.deadline.map(|deadline| {
            let left = deadline.saturating_duration_since(now);
            (left.as_millis().div_ceil(1000) as u32).max(1)
        });
        PublishProperties {
            content_type: Some(CONTENT_TYPE.to_string()),
            correlation_data: self.correlation_data.clone(),
            message_expiry_interval,
            user_properties,
            ..Default::default()
        }
    }
}

/// Whether `__srcId` agrees with the client the response topic names: the same id, or its
/// upper-case hex form (the Go SDK's response topics). True without `__srcId`: the client is
/// then the one the topic names.
fn src_id_matches(src_id: Option<&str>, client: &str) -> bool {
    src_id.is_none_or(|src_id| client == src_id || client == hex_upper(src_id.as_bytes()))
}

/// What holding a request costs, roughly: twice its payload (the bytes received and the command
/// parsed from them), its topics, properties, and a fixed overhead for the structures.
pub fn held_bytes(publish: &Publish) -> usize {
    let properties = publish.properties.as_ref().map_or(0, |p| {
        p.response_topic.as_ref().map_or(0, String::len)
            + p.correlation_data.as_ref().map_or(0, Bytes::len)
            + p.user_properties.iter().map(|(k, v)| k.len() + v.len() + 48).sum::<usize>()
    });
    2 * publish.payload.len() + publish.topic.len() + properties + 256
}

/// Absent means 1.0; otherwise `<major>.<minor>` with major 1.
fn supported_version(version: &str) -> bool {
    match version.split_once('.') {
        Some((major, minor)) => {
            major == SUPPORTED_MAJOR && !minor.is_empty() && minor.bytes().all(|b| b.is_ascii_digit())
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use statestore_protocol::topic::REQUEST_TOPIC;
    use statestore_protocol::{KeyNotify, Set};

    const RESPONSE: &str =
        "clients/c1/services/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke/response";
    const TS: &str = "001795306435997:00000:client";

    fn request(payload: &[u8], qos: QoS, edit: impl FnOnce(&mut PublishProperties)) -> Publish {
        let mut properties = PublishProperties {
            response_topic: Some(RESPONSE.into()),
            correlation_data: Some(Bytes::from_static(&[7; 16])),
            message_expiry_interval: Some(10),
            content_type: Some(CONTENT_TYPE.into()),
            user_properties: vec![
                (property::SOURCE_ID.into(), "c1".into()),
                (property::TIMESTAMP.into(), TS.into()),
                (property::PROTOCOL_VERSION.into(), "1.0".into()),
            ],
            ..Default::default()
        };
        edit(&mut properties);
        Publish::new(REQUEST_TOPIC, qos, payload.to_vec(), Some(properties))
    }

    fn topics() -> ResponseTopics {
        ResponseTopics::default()
    }

    /// A request as published, under the default response topics and no authorization map.
    fn classify(publish: &Publish, received: Instant) -> Result<Inbound, DropReason> {
        Inbound::classify(publish, Delivered::AsPublished, received, &topics(), None)
    }

    fn set_payload() -> Vec<u8> {
        Set::new("k", "v").encode()
    }

    #[test]
    fn under_an_authorization_map_keys_outside_the_clients_prefixes_are_refused() {
        let access = KeyAccess::parse("[clients]\n\"c1\" = [\"mine/\"]\n").unwrap();
        let now = Instant::now();
        let classify = |payload: Vec<u8>| {
            Inbound::classify(
                &request(&payload, QoS::AtLeastOnce, |_| {}),
                Delivered::AsPublished,
                now,
                &topics(),
                Some(&access),
            )
            .unwrap()
        };
        assert!(matches!(classify(Set::new("mine/k", "v").encode()).body, Body::Command(_)));
        let keynotify = Command::KeyNotify(KeyNotify { key: b"theirs/k".to_vec(), stop: false }).encode();
        for refused in [Set::new("k", "v").encode(), keynotify] {
            assert!(matches!(classify(refused).body, Body::Invalid(StoreError::NotAuthorized)));
        }
        // A SCAN runs, and its pages show only the client's keys.
        let scan = classify(Command::Scan(statestore_protocol::Scan { pattern: b"*".to_vec(), token: None }).encode());
        assert!(matches!(scan.body, Body::Command(_)));
        use serde_bytes::ByteBuf;
        let keys = |names: &[&str]| names.iter().map(|k| ByteBuf::from(k.as_bytes())).collect::<Vec<_>>();
        let token = Some(ByteBuf::from(&b"theirs/z"[..]));
        let page =
            Reply::new(Response::Keys { keys: keys(&["mine/a", "other", "theirs/z"]), token: token.clone() }, None);
        assert_eq!(scan.authorized(page).response, Response::Keys { keys: keys(&["mine/a"]), token });
    }

    #[test]
    fn an_sdk_request_is_a_command_with_its_identity() {
        let now = Instant::now();
        let inbound = classify(&request(&set_payload(), QoS::AtLeastOnce, |_| {}), now).unwrap();
        assert!(matches!(&inbound.body, Body::Command(r) if matches!(r.command, Command::Set(_))));
        assert_eq!(inbound.client_id.as_deref(), Some("c1"));
        assert_eq!(inbound.deadline, Some(now + Duration::from_secs(10)));
        let identity = inbound.identity().unwrap();
        assert_eq!((identity.response_topic.as_str(), identity.correlation_data), (RESPONSE, vec![7; 16]));
        assert_eq!(inbound.client_request().unwrap().message_expiry_secs, Some(10));
    }

    #[test]
    fn unanswerable_requests_are_dropped() {
        let now = Instant::now();
        let qos0 = request(&set_payload(), QoS::AtMostOnce, |_| {});
        assert_eq!(classify(&qos0, now).unwrap_err(), DropReason::QoS0);
        // Through a follower's QoS 0 subscription the client's QoS is unknown: kept.
        assert!(matches!(
            Inbound::classify(&qos0, Delivered::MaybeCapped, now, &topics(), None).unwrap().body,
            Body::Command(_)
        ));
        let missing = request(&set_payload(), QoS::AtLeastOnce, |p| p.response_topic = None);
        assert_eq!(classify(&missing, now).unwrap_err(), DropReason::ResponseTopic(ResponseTopicProblem::Missing));
        let forbidden = request(&set_payload(), QoS::AtLeastOnce, |p| p.response_topic = Some(REQUEST_TOPIC.into()));
        assert_eq!(classify(&forbidden, now).unwrap_err(), DropReason::ResponseTopic(ResponseTopicProblem::Forbidden));
        assert_eq!(DropReason::ResponseTopic(ResponseTopicProblem::Forbidden).label(), "forbidden_response_topic");
        // A topic outside the allowed patterns: the node would publish there with its own
        // broker rights, onto another device's command topic, say.
        let elsewhere = request(&set_payload(), QoS::AtLeastOnce, |p| {
            p.response_topic = Some("devices/thermostat-9/commands/set".into())
        });
        assert_eq!(classify(&elsewhere, now).unwrap_err(), DropReason::ResponseTopic(ResponseTopicProblem::NotAllowed));
        let devices = ResponseTopics::parse("devices/{client}/#").unwrap();
        let inbound = Inbound::classify(&elsewhere, Delivered::AsPublished, now, &devices, None).unwrap();
        assert_eq!(inbound.client, "thermostat-9", "an operator may allow other patterns");
    }

    #[test]
    fn envelope_problems_become_answers() {
        let now = Instant::now();
        let no_correlation = request(&set_payload(), QoS::AtLeastOnce, |p| p.correlation_data = None);
        let inbound = classify(&no_correlation, now).unwrap();
        assert_eq!(inbound.body, Body::Invalid(StoreError::MissingCorrelationData));
        assert_eq!(inbound.identity(), None);
        let no_ts = request(&set_payload(), QoS::AtLeastOnce, |p| p.user_properties.retain(|(k, _)| k != "__ts"));
        assert_eq!(classify(&no_ts, now).unwrap().body, Body::Invalid(StoreError::MissingTimestamp));
        let garbage = request(b"*1\r\n$3\r\nset\r\n", QoS::AtLeastOnce, |_| {});
        assert_eq!(classify(&garbage, now).unwrap().body, Body::Invalid(StoreError::UnknownCommand));
    }

    #[test]
    fn protocol_versions_other_than_1_x_get_505() {
        let now = Instant::now();
        for (version, supported) in
            [("1.0", true), ("1.7", true), ("2.0", false), ("1", false), ("x", false), ("1.", false)]
        {
            let publish = request(&set_payload(), QoS::AtLeastOnce, |p| {
                p.user_properties.retain(|(k, _)| k != "__protVer");
                p.user_properties.push((property::PROTOCOL_VERSION.into(), version.into()));
            });
            let body = classify(&publish, now).unwrap().body;
            assert_eq!(matches!(body, Body::UnsupportedVersion(_)), !supported, "{version}");
        }
        let absent = request(&set_payload(), QoS::AtLeastOnce, |p| p.user_properties.retain(|(k, _)| k != "__protVer"));
        assert!(matches!(classify(&absent, now).unwrap().body, Body::Command(_)));
    }

    #[test]
    fn the_client_id_falls_back_to_the_response_topic() {
        let publish = request(&set_payload(), QoS::AtLeastOnce, |p| p.user_properties.retain(|(k, _)| k != "__srcId"));
        assert_eq!(classify(&publish, Instant::now()).unwrap().client_id.as_deref(), Some("c1"));
    }

    #[test]
    fn a_keynotify_whose_src_id_disagrees_with_its_response_topic_is_refused() {
        let keynotify = Command::KeyNotify(KeyNotify { key: b"k".to_vec(), stop: false }).encode();
        let with_src_id = |src_id: &str, payload: &[u8]| {
            let publish = request(payload, QoS::AtLeastOnce, |p| {
                p.user_properties.retain(|(k, _)| k != "__srcId");
                p.user_properties.push((property::SOURCE_ID.into(), src_id.into()));
            });
            classify(&publish, Instant::now()).unwrap().body
        };
        assert_eq!(with_src_id("victim", &keynotify), Body::Invalid(StoreError::ClientIdMismatch));
        assert!(matches!(with_src_id("c1", &keynotify), Body::Command(_)));
        // The Go SDK's response topics carry the upper-case hex form of the client id.
        let go = request(&keynotify, QoS::AtLeastOnce, |p| {
            p.response_topic = Some(RESPONSE.replace("clients/c1/", "clients/6331/"));
        });
        assert!(matches!(classify(&go, Instant::now()).unwrap().body, Body::Command(_)));
        // Only registrations depend on the client id; other commands are not refused.
        assert!(matches!(with_src_id("victim", &set_payload()), Body::Command(_)));
        // A response topic that names no client is not answered at all, so the check cannot
        // be skipped: a STOP for the victim's registrations sent with a topic of one's own.
        let stop = Command::KeyNotify(KeyNotify { key: b"k".to_vec(), stop: true }).encode();
        let elsewhere = |topics: &ResponseTopics| {
            let publish = request(&stop, QoS::AtLeastOnce, |p| {
                p.response_topic = Some("probe/out".into());
                p.user_properties.retain(|(k, _)| k != "__srcId");
                p.user_properties.push((property::SOURCE_ID.into(), "victim".into()));
            });
            Inbound::classify(&publish, Delivered::AsPublished, Instant::now(), topics, None)
                .map(|inbound| inbound.body)
        };
        assert_eq!(elsewhere(&topics()), Err(DropReason::ResponseTopic(ResponseTopicProblem::NotAllowed)));
        let probes = ResponseTopics::parse("probe/{client}").unwrap();
        assert_eq!(elsewhere(&probes), Ok(Body::Invalid(StoreError::ClientIdMismatch)));
    }

    #[test]
    fn a_client_is_named_by_its_response_topic_whatever_src_id_it_claims() {
        let rotating = |src_id: &str| {
            let publish = request(&set_payload(), QoS::AtLeastOnce, |p| {
                p.user_properties.retain(|(k, _)| k != "__srcId");
                p.user_properties.push((property::SOURCE_ID.into(), src_id.into()));
            });
            classify(&publish, Instant::now()).unwrap()
        };
        for src_id in ["a", "b", "c"] {
            assert_eq!(rotating(src_id).client_key(), "c1", "quotas count by the topic's client, not {src_id}");
        }
    }

    #[test]
    fn responses_carry_status_version_correlation_and_remaining_expiry() {
        let now = Instant::now();
        let inbound = classify(&request(&set_payload(), QoS::AtLeastOnce, |_| {}), now).unwrap();
        let version: Hlc = TS.parse().unwrap();
        let later = now + Duration::from_millis(2_500);
        let properties = inbound.response_properties(200, Some(&version), later);
        assert_eq!(properties.content_type.as_deref(), Some(CONTENT_TYPE));
        assert_eq!(properties.correlation_data.as_deref(), Some(&[7u8; 16][..]));
        assert_eq!(properties.message_expiry_interval, Some(8));
        let user: Vec<(&str, &str)> =
            properties.user_properties.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(
            user,
            vec![(property::STATUS, "200"), (property::PROTOCOL_VERSION, "1.0"), (property::TIMESTAMP, TS)]
        );
        assert!(!inbound
            .response_properties(200, None, later)
            .user_properties
            .iter()
            .any(|(k, _)| k == property::TIMESTAMP));
        assert!(!inbound.expired(later));
        assert!(inbound.expired(now + Duration::from_secs(10)));
    }
}
