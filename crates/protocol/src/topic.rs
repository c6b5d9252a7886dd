//! Topic names (PROTOCOL.md §1 and §9.1).

/// Every SDK publishes its requests here; every node subscribes to it.
pub const REQUEST_TOPIC: &str = "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke";

/// Key notifications go under this prefix. A request may not name a response topic under it:
/// that would let a client forge another client's notifications.
pub const NOTIFICATION_PREFIX: &str = "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8";

/// MQTT topic names are at most 65535 bytes of UTF-8.
pub const MAX_TOPIC_LEN: usize = 65_535;

/// Why a request's response topic cannot be answered. Such requests are acked and dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ResponseTopicProblem {
    #[error("the request has no response topic")]
    Missing,
    #[error("the response topic is the request topic or lies under the notification prefix")]
    Forbidden,
    #[error("the response topic is not a valid MQTT topic name")]
    Invalid,
    #[error("the response topic matches none of the allowed patterns (--response-topics)")]
    NotAllowed,
}

impl ResponseTopicProblem {
    /// A short label for metrics.
    pub fn label(self) -> &'static str {
        match self {
            ResponseTopicProblem::Missing => "missing_response_topic",
            ResponseTopicProblem::Forbidden => "forbidden_response_topic",
            ResponseTopicProblem::Invalid => "invalid_response_topic",
            ResponseTopicProblem::NotAllowed => "response_topic_not_allowed",
        }
    }
}

/// Checks a request's response topic (§1.3): present, a valid topic name to publish to (no
/// wildcards, no NUL, not empty), not the request topic and not under the notification prefix.
pub fn check_response_topic(topic: Option<&str>) -> Result<&str, ResponseTopicProblem> {
    let topic = topic.ok_or(ResponseTopicProblem::Missing)?;
    if topic.is_empty() || topic.len() > MAX_TOPIC_LEN || topic.contains(['+', '#', '\0']) {
        return Err(ResponseTopicProblem::Invalid);
    }
    if topic == REQUEST_TOPIC || topic.starts_with(NOTIFICATION_PREFIX) {
        return Err(ResponseTopicProblem::Forbidden);
    }
    Ok(topic)
}

/// The response topics a node answers on by default: the `clients/<id>/` tree that a broker ACL
/// such as Mosquitto's `pattern read clients/%c/#` gives each client for itself.
pub const DEFAULT_RESPONSE_TOPICS: &str = "clients/{client}/#";

/// The segment of a response-topic pattern that names the client.
const CLIENT_SEGMENT: &str = "{client}";

/// One pattern of response topics: `/`-separated segments, each a literal, `+` (any one
/// segment), `{client}` (exactly once: the segment that names the client, never empty) or, last
/// only, `#` (the rest, possibly nothing). `clients/{client}/#` is the default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseTopicPattern {
    segments: Vec<PatternSegment>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum PatternSegment {
    Literal(String),
    AnyOne,
    Client,
    Rest,
}

impl ResponseTopicPattern {
    /// Parses one pattern; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<ResponseTopicPattern, String> {
        let parts: Vec<&str> = text.split('/').collect();
        let mut segments = Vec::with_capacity(parts.len());
        for (i, part) in parts.iter().enumerate() {
            segments.push(match *part {
                "+" => PatternSegment::AnyOne,
                "#" if i + 1 == parts.len() => PatternSegment::Rest,
                "#" => return Err(format!("{text:?}: `#` may only be the last segment")),
                CLIENT_SEGMENT => PatternSegment::Client,
                literal if literal.contains(['+', '#', '{', '}', '\0']) => {
                    return Err(format!("{text:?}: segment {literal:?} mixes a wildcard with text"))
                }
                literal => PatternSegment::Literal(literal.to_string()),
            });
        }
        match segments.iter().filter(|segment| **segment == PatternSegment::Client).count() {
            1 => Ok(ResponseTopicPattern { segments }),
            _ => Err(format!("{text:?}: a pattern names the client with exactly one `{CLIENT_SEGMENT}` segment")),
        }
    }

    /// The client segment of `topic`, if the pattern matches it.
    pub fn client_of<'t>(&self, topic: &'t str) -> Option<&'t str> {
        let mut parts = topic.split('/');
        let mut client = None;
        for segment in &self.segments {
            match segment {
                PatternSegment::Rest => return client,
                PatternSegment::Literal(literal) => {
                    if parts.next()? != literal {
                        return None;
                    }
                }
                PatternSegment::AnyOne => {
                    parts.next()?;
                }
                PatternSegment::Client => client = Some(parts.next().filter(|part| !part.is_empty())?),
            }
        }
        match parts.next() {
            None => client,
            Some(_) => None,
        }
    }
}

/// The response topics a node answers on: a request naming any other is dropped unanswered
/// ([`ResponseTopicProblem::NotAllowed`]), so a client cannot make a node publish onto a topic
/// the client could not publish to itself. The pattern that matches also names the client,
/// which authorization, KEYNOTIFY and the per-client quotas go by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseTopics(Vec<ResponseTopicPattern>);

impl ResponseTopics {
    /// Parses a comma-separated list of patterns.
    pub fn parse(list: &str) -> Result<ResponseTopics, String> {
        let patterns =
            list.split(',').map(str::trim).map(ResponseTopicPattern::parse).collect::<Result<Vec<_>, _>>()?;
        Ok(ResponseTopics(patterns))
    }

    /// The client that `topic` names, by the first pattern that matches it.
    pub fn client_of<'t>(&self, topic: &'t str) -> Option<&'t str> {
        self.0.iter().find_map(|pattern| pattern.client_of(topic))
    }
}

impl Default for ResponseTopics {
    fn default() -> Self {
        ResponseTopics::parse(DEFAULT_RESPONSE_TOPICS).expect("the default patterns parse")
    }
}

/// Upper-case base16 (RFC 4648 §8), as the SDKs decode notification topics.
pub fn hex_upper(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

/// The length in bytes of [`notification_topic`] for these lengths of client id and key.
pub fn notification_topic_len(client_id_len: usize, key_len: usize) -> usize {
    NOTIFICATION_PREFIX.len() + 1 + 2 * client_id_len + "/command/notify/".len() + 2 * key_len
}

/// `clients/statestore/v1/<guid>/{HEX(client)}/command/notify/{HEX(key)}`, both upper-case hex,
/// or `None` when it would exceed the MQTT topic limit (keys above ~32 KiB).
pub fn notification_topic(client_id: &str, key: &[u8]) -> Option<String> {
    if notification_topic_len(client_id.len(), key.len()) > MAX_TOPIC_LEN {
        return None;
    }
    Some(format!("{NOTIFICATION_PREFIX}/{}/command/notify/{}", hex_upper(client_id.as_bytes()), hex_upper(key)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notification_topic_is_upper_hex_of_client_and_key() {
        let topic = notification_topic("client-1", b"\x00key\xff").unwrap();
        assert_eq!(
            topic,
            "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/636C69656E742D31/command/notify/006B6579FF"
        );
        assert_eq!(topic.split('/').count(), 8, ".NET requires exactly 8 segments");
        assert_eq!(topic.len(), notification_topic_len(8, 5));
    }

    #[test]
    fn notification_topic_refuses_keys_beyond_the_topic_limit() {
        let fits = (MAX_TOPIC_LEN - notification_topic_len(3, 0)) / 2;
        assert!(notification_topic("abc", &vec![b'k'; fits]).is_some());
        assert!(notification_topic("abc", &vec![b'k'; fits + 1]).is_none());
    }

    #[test]
    fn response_topics_of_every_sdk_are_accepted() {
        for topic in [
            "clients/rust-client/services/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke/response",
            "clients/676F2D636C69656E74/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke/response",
            "clients/dotnet/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke",
        ] {
            assert_eq!(check_response_topic(Some(topic)), Ok(topic));
            assert!(ResponseTopics::default().client_of(topic).is_some(), "{topic}");
        }
        assert_eq!(check_response_topic(Some("anything/else")), Ok("anything/else"));
    }

    #[test]
    fn forbidden_missing_and_invalid_response_topics_are_refused() {
        assert_eq!(check_response_topic(None), Err(ResponseTopicProblem::Missing));
        assert_eq!(check_response_topic(Some(REQUEST_TOPIC)), Err(ResponseTopicProblem::Forbidden));
        assert_eq!(
            check_response_topic(Some(
                "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/41/command/notify/42"
            )),
            Err(ResponseTopicProblem::Forbidden)
        );
        assert_eq!(
            check_response_topic(Some("clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8")),
            Err(ResponseTopicProblem::Forbidden)
        );
        for invalid in ["", "a/+/b", "a/#", "a\0b"] {
            assert_eq!(check_response_topic(Some(invalid)), Err(ResponseTopicProblem::Invalid), "{invalid:?}");
        }
        assert_eq!(check_response_topic(Some(&"a".repeat(MAX_TOPIC_LEN + 1))), Err(ResponseTopicProblem::Invalid));
    }

    #[test]
    fn the_default_pattern_names_the_client_of_a_clients_topic_and_refuses_others() {
        let topics = ResponseTopics::default();
        assert_eq!(topics.client_of("clients/abc/services/x/response"), Some("abc"));
        assert_eq!(topics.client_of("clients/abc"), Some("abc"), "`#` matches nothing too, as in MQTT");
        assert_eq!(topics.client_of("clients//x"), None, "the client segment is never empty");
        assert_eq!(topics.client_of("devices/thermostat-9/commands/set"), None);
        assert_eq!(topics.client_of("probe/out"), None);
        assert_eq!(topics.client_of("clientsx/abc/y"), None);
    }

    #[test]
    fn patterns_take_literals_single_wildcards_and_one_client_segment() {
        let topics = ResponseTopics::parse("replies/+/{client}, tenants/{client}/#").unwrap();
        assert_eq!(topics.client_of("replies/eu/c1"), Some("c1"));
        assert_eq!(topics.client_of("replies/eu/c1/more"), None, "no `#`: nothing after the last segment");
        assert_eq!(topics.client_of("replies/c1"), None);
        assert_eq!(topics.client_of("tenants/t9/a/b"), Some("t9"));
        assert_eq!(topics.client_of("clients/c1/x"), None, "the default is replaced, not extended");
        for bad in ["clients/#/x", "a/{client}/{client}", "no/client/#", "a/b{client}", "", "a/+x/{client}"] {
            assert!(ResponseTopics::parse(bad).is_err(), "{bad:?}");
        }
    }
}
