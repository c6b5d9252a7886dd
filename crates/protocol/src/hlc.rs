//! Hybrid logical clocks as the SDKs write them: `<ms since epoch>:<counter>:<node id>`
//! (PROTOCOL.md §10). Versions, `__ts` and fencing tokens are all HLCs.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::resp::parse_u64;

/// How far ahead of the server clock a request `__ts` or `__ft` may be (§10.5).
pub const MAX_CLOCK_DRIFT_MS: u64 = 60_000;

/// The largest counter a server may emit: .NET reads the counter as an `int32` (§10.2).
pub const MAX_COUNTER: u64 = i32::MAX as u64;

/// A hybrid logical clock value. Ordered by timestamp, then counter, then node id (ordinal),
/// as Go's `Compare` and .NET's `CompareTo` do.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Hlc {
    /// Milliseconds since the Unix epoch.
    pub timestamp: u64,
    pub counter: u64,
    /// Never empty and never contains `:`.
    pub node_id: String,
}

/// Why a string is not an HLC, or why an update was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HlcError {
    #[error("an HLC has three `:`-separated parts")]
    Parts,
    #[error("the HLC timestamp is not a decimal u64")]
    Timestamp,
    #[error("the HLC counter is not a decimal u64")]
    Counter,
    #[error("the HLC node id is empty")]
    EmptyNodeId,
    #[error("the HLC counter would overflow")]
    Overflow,
    #[error("the HLC would be more than the allowed drift ahead of the wall clock")]
    Drift,
}

impl Hlc {
    pub fn new(timestamp: u64, counter: u64, node_id: impl Into<String>) -> Hlc {
        Hlc { timestamp, counter, node_id: node_id.into() }
    }

    /// True when this clock is more than `max_drift_ms` ahead of `now_ms`.
    pub fn is_ahead_of(&self, now_ms: u64, max_drift_ms: u64) -> bool {
        self.timestamp > now_ms.saturating_add(max_drift_ms)
    }

    /// The timestamp and counter, the part that orders versions regardless of node id.
    pub fn tick(&self) -> (u64, u64) {
        (self.timestamp, self.counter)
    }

    /// The HLC update rule of §10.4: merge `other` into this clock at wall-clock `now_ms`.
    /// A clock with the same node id is ignored. Fails on counter overflow or when the result
    /// would run more than `max_drift_ms` ahead of `now_ms`; the clock is then unchanged.
    pub fn update(&mut self, other: &Hlc, now_ms: u64, max_drift_ms: u64) -> Result<(), HlcError> {
        if other.node_id == self.node_id {
            return Ok(());
        }
        let (timestamp, counter) = if now_ms > self.timestamp && now_ms > other.timestamp {
            (now_ms, 0)
        } else if self.timestamp == other.timestamp {
            (self.timestamp, self.counter.max(other.counter).checked_add(1).ok_or(HlcError::Overflow)?)
        } else if self.timestamp > other.timestamp {
            (self.timestamp, self.counter.checked_add(1).ok_or(HlcError::Overflow)?)
        } else {
            (other.timestamp, other.counter.checked_add(1).ok_or(HlcError::Overflow)?)
        };
        self.commit(timestamp, counter, now_ms, max_drift_ms)
    }

    /// Advances this clock to `now_ms`, or bumps the counter if the clock is not behind (§10.6).
    pub fn update_now(&mut self, now_ms: u64, max_drift_ms: u64) -> Result<(), HlcError> {
        let (timestamp, counter) = if now_ms > self.timestamp {
            (now_ms, 0)
        } else {
            (self.timestamp, self.counter.checked_add(1).ok_or(HlcError::Overflow)?)
        };
        self.commit(timestamp, counter, now_ms, max_drift_ms)
    }

    fn commit(&mut self, timestamp: u64, counter: u64, now_ms: u64, max_drift_ms: u64) -> Result<(), HlcError> {
        if counter > MAX_COUNTER {
            return Err(HlcError::Overflow);
        }
        if timestamp > now_ms.saturating_add(max_drift_ms) {
            return Err(HlcError::Drift);
        }
        self.timestamp = timestamp;
        self.counter = counter;
        Ok(())
    }

    /// The next server version after `self`, merged with the request clock `request` at wall
    /// clock `now_ms`: strictly greater than both by (timestamp, counter), counter 0 whenever the
    /// wall clock has moved past both. Never fails: a counter that would pass [`MAX_COUNTER`]
    /// carries into the timestamp instead, which keeps versions monotonic and .NET-readable.
    pub fn successor(&self, request: Option<&Hlc>, now_ms: u64) -> Hlc {
        let highest = match request {
            Some(request) if request.tick() > self.tick() => request.tick(),
            _ => self.tick(),
        };
        let (timestamp, counter) = if now_ms > highest.0 {
            (now_ms, 0)
        } else if highest.1 >= MAX_COUNTER {
            (highest.0.saturating_add(1), 0)
        } else {
            (highest.0, highest.1 + 1)
        };
        Hlc { timestamp, counter, node_id: self.node_id.clone() }
    }
}

impl Ord for Hlc {
    fn cmp(&self, other: &Self) -> Ordering {
        self.tick().cmp(&other.tick()).then_with(|| self.node_id.cmp(&other.node_id))
    }
}

impl PartialOrd for Hlc {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Hlc {
    /// Appends the text form, `{timestamp:015}:{counter:05}:{node_id}` (what `Display` shows),
    /// to `out`. Every applied write stores several versions in this form; this takes a quarter
    /// of the time of `to_string` (no formatting machinery, no string of its own).
    pub fn write_text(&self, out: &mut Vec<u8>) {
        let (timestamp, counter) = (Padded::new(self.timestamp, 15), Padded::new(self.counter, 5));
        out.reserve(timestamp.len() + counter.len() + 2 + self.node_id.len());
        timestamp.write_to(out);
        out.push(b':');
        counter.write_to(out);
        out.push(b':');
        out.extend_from_slice(self.node_id.as_bytes());
    }
}

/// The decimal digits of a number, left-padded with zeros to a width.
struct Padded {
    digits: [u8; 20],
    /// Where the digits start in `digits`.
    start: usize,
    zeros: usize,
}

impl Padded {
    fn new(mut value: u64, width: usize) -> Padded {
        let mut digits = [0u8; 20];
        let mut start = digits.len();
        loop {
            start -= 1;
            digits[start] = b'0' + (value % 10) as u8;
            value /= 10;
            if value == 0 {
                break;
            }
        }
        let zeros = width.saturating_sub(digits.len() - start);
        Padded { digits, start, zeros }
    }

    fn len(&self) -> usize {
        self.zeros + self.digits.len() - self.start
    }

    fn write_to(&self, out: &mut Vec<u8>) {
        out.resize(out.len() + self.zeros, b'0');
        out.extend_from_slice(&self.digits[self.start..]);
    }
}

impl fmt::Display for Hlc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:015}:{:05}:{}", self.timestamp, self.counter, self.node_id)
    }
}

impl FromStr for Hlc {
    type Err = HlcError;

    /// Accepts any number of leading zeros; the node id must be non-empty and hold no `:`.
    fn from_str(s: &str) -> Result<Hlc, HlcError> {
        let mut parts = s.split(':');
        let (Some(timestamp), Some(counter), Some(node_id), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(HlcError::Parts);
        };
        let timestamp = parse_u64(timestamp.as_bytes()).ok_or(HlcError::Timestamp)?;
        let counter = parse_u64(counter.as_bytes()).ok_or(HlcError::Counter)?;
        if node_id.is_empty() {
            return Err(HlcError::EmptyNodeId);
        }
        Ok(Hlc { timestamp, counter, node_id: node_id.to_owned() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hlc(s: &str) -> Hlc {
        s.parse().unwrap()
    }

    #[test]
    fn formats_with_15_and_5_digit_padding() {
        assert_eq!(Hlc::new(1_795_306_435_952, 0, "n").to_string(), "001795306435952:00000:n");
        assert_eq!(Hlc::new(0, 0, "id").to_string(), "000000000000000:00000:id");
        assert_eq!(Hlc::new(u64::MAX, 123_456, "x").to_string(), "18446744073709551615:123456:x");
    }

    #[test]
    fn the_text_form_is_the_padded_format_for_every_width() {
        let mut values = vec![0, 1, 9, 10, 99_999, 100_000, 999_999_999_999_999, 1_000_000_000_000_000, u64::MAX];
        values.extend((0..20).map(|digits| 10u64.saturating_pow(digits) - 1));
        values.extend((0..20).map(|digits| 10u64.saturating_pow(digits)));
        for &timestamp in &values {
            for &counter in &values {
                let v = Hlc::new(timestamp, counter, "node:less");
                let expected = format!("{timestamp:015}:{counter:05}:node:less");
                assert_eq!(v.to_string(), expected);
                let mut out = b"prefix".to_vec();
                v.write_text(&mut out);
                assert_eq!(out, [b"prefix".as_slice(), expected.as_bytes()].concat());
            }
        }
    }

    #[test]
    fn parses_what_the_sdks_send() {
        let v = hlc("001795306435997:00000:32b43965-5c9d-4ae8-8610-8cee895af592");
        assert_eq!(v.timestamp, 1_795_306_435_997);
        assert_eq!(v.counter, 0);
        assert_eq!(v.node_id, "32b43965-5c9d-4ae8-8610-8cee895af592");
        // Any number of leading zeros, none at all, or many.
        assert_eq!(hlc("5:7:a"), Hlc::new(5, 7, "a"));
        assert_eq!(hlc("00000000000000000000005:0000000007:a"), Hlc::new(5, 7, "a"));
        // The node id may hold anything but `:`, spaces included.
        assert_eq!(hlc("1:2: a b ").node_id, " a b ");
    }

    #[test]
    fn rejects_malformed_strings() {
        for bad in [
            "",
            "1:2",
            "1:2:",
            "1:2:a:b",
            "::a",
            "x:2:a",
            "1:y:a",
            "-1:2:a",
            "+1:2:a",
            "1:-2:a",
            " 1:2:a",
            "1 :2:a",
            "1.5:2:a",
            "18446744073709551616:0:a",
            "1:18446744073709551616:a",
            "1:2:a:",
        ] {
            assert!(bad.parse::<Hlc>().is_err(), "{bad:?} parsed");
        }
        assert_eq!("1:2:".parse::<Hlc>(), Err(HlcError::EmptyNodeId));
        assert_eq!("1:2:a:b".parse::<Hlc>(), Err(HlcError::Parts));
    }

    #[test]
    fn total_order_is_timestamp_counter_node() {
        assert!(hlc("2:0:a") > hlc("1:9:z"));
        assert!(hlc("1:2:a") > hlc("1:1:z"));
        assert!(hlc("1:1:b") > hlc("1:1:a"));
        assert_eq!(hlc("01:01:a").cmp(&hlc("1:1:a")), Ordering::Equal);
    }

    #[test]
    fn update_rule_follows_the_sdks() {
        let drift = MAX_CLOCK_DRIFT_MS;
        // Wall clock past both: (now, 0).
        let mut c = Hlc::new(10, 4, "me");
        c.update(&Hlc::new(20, 9, "you"), 30, drift).unwrap();
        assert_eq!(c.tick(), (30, 0));
        // Equal timestamps: max counter + 1.
        let mut c = Hlc::new(50, 4, "me");
        c.update(&Hlc::new(50, 9, "you"), 30, drift).unwrap();
        assert_eq!(c.tick(), (50, 10));
        // Self later.
        let mut c = Hlc::new(60, 4, "me");
        c.update(&Hlc::new(50, 9, "you"), 30, drift).unwrap();
        assert_eq!(c.tick(), (60, 5));
        // Other later.
        let mut c = Hlc::new(40, 4, "me");
        c.update(&Hlc::new(50, 9, "you"), 30, drift).unwrap();
        assert_eq!(c.tick(), (50, 10));
        // Same node id: no-op.
        let mut c = Hlc::new(40, 4, "me");
        c.update(&Hlc::new(50, 9, "me"), 30, drift).unwrap();
        assert_eq!(c.tick(), (40, 4));
    }

    #[test]
    fn update_refuses_drift_and_overflow() {
        let mut c = Hlc::new(0, 0, "me");
        assert_eq!(c.update(&Hlc::new(100_001, 0, "you"), 40_000, MAX_CLOCK_DRIFT_MS), Err(HlcError::Drift));
        assert_eq!(c.tick(), (0, 0), "a refused update leaves the clock as it was");
        c.update(&Hlc::new(100_000, 0, "you"), 40_000, MAX_CLOCK_DRIFT_MS).unwrap();
        assert_eq!(c.tick(), (100_000, 1));
        let mut c = Hlc::new(5, MAX_COUNTER, "me");
        assert_eq!(c.update_now(5, MAX_CLOCK_DRIFT_MS), Err(HlcError::Overflow));
        let mut c = Hlc::new(5, 3, "me");
        c.update_now(5, MAX_CLOCK_DRIFT_MS).unwrap();
        assert_eq!(c.tick(), (5, 4));
        c.update_now(6, MAX_CLOCK_DRIFT_MS).unwrap();
        assert_eq!(c.tick(), (6, 0));
    }

    #[test]
    fn skew_is_judged_strictly_after_the_drift() {
        let t = Hlc::new(160_000, 0, "c");
        assert!(!t.is_ahead_of(100_000, MAX_CLOCK_DRIFT_MS));
        assert!(Hlc::new(160_001, 0, "c").is_ahead_of(100_000, MAX_CLOCK_DRIFT_MS));
        assert!(!Hlc::new(u64::MAX, 0, "c").is_ahead_of(u64::MAX, MAX_CLOCK_DRIFT_MS));
    }

    #[test]
    fn successor_is_strictly_newer_and_resets_the_counter_with_the_wall_clock() {
        let last = Hlc::new(100, 3, "statestore");
        assert_eq!(last.successor(None, 200).tick(), (200, 0));
        assert_eq!(last.successor(None, 100).tick(), (100, 4));
        assert_eq!(last.successor(None, 50).tick(), (100, 4), "a wall clock behind never goes back");
        let request = Hlc::new(300, 7, "client");
        assert_eq!(last.successor(Some(&request), 200).tick(), (300, 8));
        assert_eq!(last.successor(Some(&request), 301).tick(), (301, 0));
        assert_eq!(last.successor(Some(&request), 200).node_id, "statestore");
        let full = Hlc::new(100, MAX_COUNTER, "statestore");
        assert_eq!(full.successor(None, 100).tick(), (101, 0), "the counter carries instead of overflowing");
    }
}
