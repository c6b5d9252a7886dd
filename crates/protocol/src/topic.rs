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
}

impl ResponseTopicProblem {
    /// A short label for metrics.
    pub fn label(self) -> &'static str {
        match self {
            ResponseTopicProblem::Missing => "missing_response_topic",
            ResponseTopicProblem::Forbidden => "forbidden_response_topic",
            ResponseTopicProblem::Invalid => "invalid_response_topic",
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

/// The client id in a `clients/{id}/...` response topic: the fallback when `__srcId` is absent.
pub fn client_id_from_response_topic(topic: &str) -> Option<&str> {
    let rest = topic.strip_prefix("clients/")?;
    let (client_id, _) = rest.split_once('/')?;
    (!client_id.is_empty()).then_some(client_id)
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
            "anything/else",
        ] {
            assert_eq!(check_response_topic(Some(topic)), Ok(topic));
        }
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
    fn client_id_falls_back_to_the_response_topic_prefix() {
        assert_eq!(client_id_from_response_topic("clients/abc/services/x/response"), Some("abc"));
        assert_eq!(client_id_from_response_topic("clients//x"), None);
        assert_eq!(client_id_from_response_topic("clients/abc"), None);
        assert_eq!(client_id_from_response_topic("other/abc/x"), None);
    }
}
