//! Any payload and any `__ts`/`__ft` text: parsing never panics, and whatever parses re-encodes
//! to a payload that parses to the same command.
#![no_main]

use libfuzzer_sys::fuzz_target;
use statestore_protocol::{Command, Request};

fuzz_target!(|data: &[u8]| {
    // The first two bytes choose how much of the input is `__ts` text; the rest is the payload.
    let (split, rest) = match data {
        [a, b, rest @ ..] => (usize::from(*a) << 8 | usize::from(*b), rest),
        _ => (0, data),
    };
    let split = split.min(rest.len());
    let (ts, payload) = rest.split_at(split);
    let ts = String::from_utf8_lossy(ts);
    if let Ok(command) = Command::parse(payload) {
        assert_eq!(Command::parse(&command.encode()).as_ref(), Ok(&command));
    }
    if let Ok(request) = Request::parse(payload, Some(&ts), Some(&ts)) {
        let _ = request.check_clock_skew(u64::from_le_bytes([0x12, 0x34, 0, 0, 0, 0, 0, 0]));
    }
});
