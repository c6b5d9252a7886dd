//! The one error type of the protocol. Every `-ERR` text a client can see is produced by
//! [`StoreError::text`], and nowhere else.

use serde::{Deserialize, Serialize};

/// A state-store-level failure. It travels to the client as `-ERR <text>\r\n` with `__stat=200`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
pub enum StoreError {
    /// `__ts` is more than the allowed drift ahead of the server clock.
    #[error("{}", self.text())]
    TimestampSkew,
    /// SET/DEL/VDEL without `__ft` on a fenced key.
    #[error("{}", self.text())]
    FencingTokenRequired,
    /// `__ft` is more than the allowed drift ahead of the server clock.
    #[error("{}", self.text())]
    FencingTokenSkew,
    /// `__ft` is older than the token stored with the key.
    #[error("{}", self.text())]
    FencingTokenLowerVersion,
    /// The key count or byte quota would be exceeded.
    #[error("{}", self.text())]
    QuotaExceeded,
    /// Malformed RESP3, a bad option, or a bad PX.
    #[error("{}", self.text())]
    SyntaxError,
    /// The client may not perform this request.
    #[error("{}", self.text())]
    NotAuthorized,
    /// The verb is not one of SET, GET, DEL, VDEL, KEYNOTIFY, SCAN (upper case).
    #[error("{}", self.text())]
    UnknownCommand,
    /// The verb is known but got the wrong number of arguments.
    #[error("{}", self.text())]
    WrongNumberOfArguments,
    /// SET without `__ts`.
    #[error("{}", self.text())]
    MissingTimestamp,
    /// `__ts` or `__ft` is not a valid HLC string.
    #[error("{}", self.text())]
    MalformedTimestamp,
    /// The key is empty.
    #[error("{}", self.text())]
    KeyLengthZero,
    /// KEYNOTIFY without a client identity (`__srcId`, or a `clients/{id}/` response topic).
    #[error("{}", self.text())]
    MissingClientId,
    /// The notification topic of this client and key would exceed MQTT's 65535-byte topic limit.
    #[error("{}", self.text())]
    KeyTooLongToObserve,
    /// The MQTT request carries no correlation data, so no answer could be matched to it.
    #[error("{}", self.text())]
    MissingCorrelationData,
    /// KEYNOTIFY whose `__srcId` is neither the `clients/{id}/` id of its response topic nor that
    /// id's upper-case hex form.
    #[error("{}", self.text())]
    ClientIdMismatch,
    /// The client already has as many requests in flight as a node accepts from one client.
    #[error("{}", self.text())]
    TooManyRequestsInFlight,
    /// An error text this crate does not know (decoding a server's reply), or one outside the
    /// protocol (a restore refused over HTTP).
    #[error("{0}")]
    Unknown(String),
}

impl StoreError {
    /// Every variant with a fixed text, for exhaustive tests and for decoding.
    pub const KNOWN: [StoreError; 17] = [
        StoreError::TimestampSkew,
        StoreError::FencingTokenRequired,
        StoreError::FencingTokenSkew,
        StoreError::FencingTokenLowerVersion,
        StoreError::QuotaExceeded,
        StoreError::SyntaxError,
        StoreError::NotAuthorized,
        StoreError::UnknownCommand,
        StoreError::WrongNumberOfArguments,
        StoreError::MissingTimestamp,
        StoreError::MalformedTimestamp,
        StoreError::KeyLengthZero,
        StoreError::MissingClientId,
        StoreError::KeyTooLongToObserve,
        StoreError::MissingCorrelationData,
        StoreError::ClientIdMismatch,
        StoreError::TooManyRequestsInFlight,
    ];

    /// The text after `-ERR ` on the wire, byte-for-byte as the SDKs match it.
    pub fn text(&self) -> &str {
        match self {
            StoreError::TimestampSkew => {
                "the request timestamp is too far in the future; ensure that the client and broker system clocks are synchronized"
            }
            StoreError::FencingTokenRequired => "a fencing token is required for this request",
            StoreError::FencingTokenSkew => {
                "the request fencing token timestamp is too far in the future; ensure that the client and broker system clocks are synchronized"
            }
            StoreError::FencingTokenLowerVersion => {
                "the request fencing token is a lower version than the fencing token protecting the resource"
            }
            StoreError::QuotaExceeded => "the quota has been exceeded",
            StoreError::SyntaxError => "syntax error",
            StoreError::NotAuthorized => "not authorized",
            StoreError::UnknownCommand => "unknown command",
            StoreError::WrongNumberOfArguments => "wrong number of arguments",
            StoreError::MissingTimestamp => "missing timestamp",
            StoreError::MalformedTimestamp => "malformed timestamp",
            StoreError::KeyLengthZero => "the key length is zero",
            StoreError::MissingClientId => "the request carries no client id",
            StoreError::KeyTooLongToObserve => "the key is too long to be observed",
            StoreError::MissingCorrelationData => "the request carries no correlation data",
            StoreError::ClientIdMismatch => "the client id does not match the response topic",
            StoreError::TooManyRequestsInFlight => "too many requests in flight for this client",
            StoreError::Unknown(text) => text,
        }
    }

    /// The variant whose text this is; unknown texts become [`StoreError::Unknown`].
    pub fn from_text(text: &str) -> StoreError {
        StoreError::KNOWN
            .iter()
            .find(|known| known.text() == text)
            .cloned()
            .unwrap_or_else(|| StoreError::Unknown(text.to_owned()))
    }

    /// The whole RESP3 error reply: `-ERR <text>\r\n`.
    pub fn to_resp(&self) -> Vec<u8> {
        let text = self.text();
        let mut out = Vec::with_capacity(text.len() + 7);
        out.extend_from_slice(b"-ERR ");
        out.extend_from_slice(text.as_bytes());
        out.extend_from_slice(b"\r\n");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every row of PROTOCOL.md §8, byte-for-byte on the wire.
    #[test]
    fn every_error_text_is_byte_exact() {
        let rows: [(StoreError, &[u8]); 12] = [
            (
                StoreError::TimestampSkew,
                b"-ERR the request timestamp is too far in the future; ensure that the client and broker system clocks are synchronized\r\n",
            ),
            (StoreError::FencingTokenRequired, b"-ERR a fencing token is required for this request\r\n"),
            (
                StoreError::FencingTokenSkew,
                b"-ERR the request fencing token timestamp is too far in the future; ensure that the client and broker system clocks are synchronized\r\n",
            ),
            (
                StoreError::FencingTokenLowerVersion,
                b"-ERR the request fencing token is a lower version than the fencing token protecting the resource\r\n",
            ),
            (StoreError::QuotaExceeded, b"-ERR the quota has been exceeded\r\n"),
            (StoreError::SyntaxError, b"-ERR syntax error\r\n"),
            (StoreError::NotAuthorized, b"-ERR not authorized\r\n"),
            (StoreError::UnknownCommand, b"-ERR unknown command\r\n"),
            (StoreError::WrongNumberOfArguments, b"-ERR wrong number of arguments\r\n"),
            (StoreError::MissingTimestamp, b"-ERR missing timestamp\r\n"),
            (StoreError::MalformedTimestamp, b"-ERR malformed timestamp\r\n"),
            (StoreError::KeyLengthZero, b"-ERR the key length is zero\r\n"),
        ];
        for (error, wire) in rows {
            assert_eq!(error.to_resp(), wire, "{error:?}");
            assert_eq!(error.to_string().as_bytes(), &wire[5..wire.len() - 2]);
        }
    }

    #[test]
    fn texts_are_distinct_and_map_back_to_their_variant() {
        for (i, a) in StoreError::KNOWN.iter().enumerate() {
            assert_eq!(&StoreError::from_text(a.text()), a);
            for b in &StoreError::KNOWN[i + 1..] {
                assert_ne!(a.text(), b.text());
            }
        }
        assert_eq!(StoreError::from_text("new text"), StoreError::Unknown("new text".into()));
    }
}
