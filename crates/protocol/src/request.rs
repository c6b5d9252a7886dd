//! A request as the state machine sees it: the command plus the `__ts` and `__ft` properties,
//! validated the same way on every node (PROTOCOL.md §3, §8, §10.5, §11).

use serde::{Deserialize, Serialize};

use crate::command::Command;
use crate::error::StoreError;
use crate::hlc::{Hlc, MAX_CLOCK_DRIFT_MS};

/// A parsed, statically valid request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub command: Command,
    /// `__ts`: the client's HLC. Required on SET, optional elsewhere.
    pub timestamp: Option<Hlc>,
    /// `__ft`: kept only for SET, DEL and VDEL; GET, SCAN and KEYNOTIFY never use it.
    pub fencing_token: Option<Hlc>,
}

impl Request {
    /// Parses the payload, then `__ts`, then `__ft`. The first problem found is the answer.
    pub fn parse(payload: &[u8], timestamp: Option<&str>, fencing_token: Option<&str>) -> Result<Request, StoreError> {
        let command = Command::parse(payload)?;
        let timestamp = timestamp.map(parse_hlc).transpose()?;
        if timestamp.is_none() && matches!(command, Command::Set(_)) {
            return Err(StoreError::MissingTimestamp);
        }
        let fencing_token = if command.is_fenced() { fencing_token.map(parse_hlc).transpose()? } else { None };
        Ok(Request { command, timestamp, fencing_token })
    }

    /// Rejects a `__ts` or `__ft` more than [`MAX_CLOCK_DRIFT_MS`] ahead of `now_ms`.
    pub fn check_clock_skew(&self, now_ms: u64) -> Result<(), StoreError> {
        if self.timestamp.as_ref().is_some_and(|ts| ts.is_ahead_of(now_ms, MAX_CLOCK_DRIFT_MS)) {
            return Err(StoreError::TimestampSkew);
        }
        if self.fencing_token.as_ref().is_some_and(|ft| ft.is_ahead_of(now_ms, MAX_CLOCK_DRIFT_MS)) {
            return Err(StoreError::FencingTokenSkew);
        }
        Ok(())
    }
}

fn parse_hlc(text: &str) -> Result<Hlc, StoreError> {
    text.parse().map_err(|_| StoreError::MalformedTimestamp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{Get, Set};

    const TS: &str = "001795306435997:00000:client";

    #[test]
    fn set_requires_a_timestamp_other_commands_do_not() {
        let set = Set::new("k", "v").encode();
        assert_eq!(Request::parse(&set, None, None), Err(StoreError::MissingTimestamp));
        let request = Request::parse(&set, Some(TS), None).unwrap();
        assert_eq!(request.timestamp, Some(TS.parse().unwrap()));
        let get = Get { key: b"k".to_vec() }.encode();
        assert_eq!(Request::parse(&get, None, None).unwrap().timestamp, None);
    }

    #[test]
    fn malformed_timestamps_and_tokens_are_refused() {
        let set = Set::new("k", "v").encode();
        assert_eq!(Request::parse(&set, Some("nope"), None), Err(StoreError::MalformedTimestamp));
        assert_eq!(Request::parse(&set, Some(TS), Some("1:2")), Err(StoreError::MalformedTimestamp));
        let get = Get { key: b"k".to_vec() }.encode();
        assert_eq!(Request::parse(&get, Some("1:2:"), None), Err(StoreError::MalformedTimestamp));
    }

    #[test]
    fn payload_errors_come_before_envelope_errors() {
        assert_eq!(Request::parse(b"*1\r\n$3\r\nSET\r\n", Some("bad"), None), Err(StoreError::WrongNumberOfArguments));
        assert_eq!(Request::parse(b"garbage", None, None), Err(StoreError::SyntaxError));
    }

    #[test]
    fn reads_ignore_the_fencing_token() {
        let get = Get { key: b"k".to_vec() }.encode();
        let request = Request::parse(&get, Some(TS), Some("not-an-hlc")).unwrap();
        assert_eq!(request.fencing_token, None);
    }

    #[test]
    fn skew_is_checked_against_the_given_wall_clock() {
        let set = Set::new("k", "v").encode();
        let now = 1_000_000;
        let at = |ms: u64| Hlc::new(ms, 0, "c").to_string();
        let ok = Request::parse(&set, Some(&at(now + 60_000)), Some(&at(now + 60_000))).unwrap();
        assert_eq!(ok.check_clock_skew(now), Ok(()));
        let ts_ahead = Request::parse(&set, Some(&at(now + 60_001)), Some(&at(now + 60_001))).unwrap();
        assert_eq!(ts_ahead.check_clock_skew(now), Err(StoreError::TimestampSkew));
        let ft_ahead = Request::parse(&set, Some(&at(now)), Some(&at(now + 10 * 365 * 86_400_000))).unwrap();
        assert_eq!(ft_ahead.check_clock_skew(now), Err(StoreError::FencingTokenSkew));
        let old = Request::parse(&set, Some(&at(0)), Some(&at(0))).unwrap();
        assert_eq!(old.check_clock_skew(now), Ok(()), "old clocks are accepted");
    }
}
