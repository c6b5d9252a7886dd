//! Property tests of the protocol crate: round trips, no panics on arbitrary input, and the
//! SCAN glob against the `glob` crate as an oracle.

use proptest::prelude::*;
use serde_bytes::ByteBuf;
use statestore_protocol::glob::Pattern;
use statestore_protocol::{
    encode_bulk_array, Command, Del, Get, Hlc, KeyNotify, Notification, Request, Response, Scan, Set, SetCondition,
    StoreError, VDel,
};

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..max)
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 1..24)
}

fn command() -> impl Strategy<Value = Command> {
    let condition =
        prop_oneof![Just(SetCondition::Always), Just(SetCondition::NotExists), Just(SetCondition::NotExistsOrEqual)];
    prop_oneof![
        (key(), bytes(32), condition, prop::option::of(any::<u64>()))
            .prop_map(|(key, value, condition, expiry_ms)| Command::Set(Set { key, value, condition, expiry_ms })),
        key().prop_map(|key| Command::Get(Get { key })),
        key().prop_map(|key| Command::Del(Del { key })),
        (key(), bytes(32)).prop_map(|(key, value)| Command::VDel(VDel { key, value })),
        (key(), any::<bool>()).prop_map(|(key, stop)| Command::KeyNotify(KeyNotify { key, stop })),
        (bytes(16), prop::option::of(bytes(16)))
            .prop_map(|(pattern, token)| Command::Scan(Scan { pattern, token: token.map(ByteBuf::from) })),
    ]
}

fn response() -> impl Strategy<Value = Response> {
    prop_oneof![
        Just(Response::Ok),
        any::<i64>().prop_filter("i64::MIN has no positive twin", |n| *n != i64::MIN).prop_map(Response::Int),
        Just(Response::Nil),
        bytes(64).prop_map(Response::Value),
        prop::sample::select(StoreError::KNOWN.to_vec()).prop_map(Response::Error),
        (prop::collection::vec(bytes(12), 0..6), prop::option::of(bytes(12))).prop_map(|(keys, token)| {
            Response::Keys { keys: keys.into_iter().map(ByteBuf::from).collect(), token: token.map(ByteBuf::from) }
        }),
    ]
}

/// `default_cases` cases, or `PROPTEST_CASES` when set.
fn config(default_cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(default_cases);
    ProptestConfig { cases, ..ProptestConfig::default() }
}

proptest! {
    #![proptest_config(config(2000))]

    #[test]
    fn encode_then_parse_is_identity(command in command()) {
        prop_assert_eq!(Command::parse(&command.encode()), Ok(command));
    }

    #[test]
    fn responses_round_trip(response in response()) {
        prop_assert_eq!(Response::decode(&response.encode()), Ok(response));
    }

    #[test]
    fn notifications_round_trip(value in bytes(64), delete in any::<bool>()) {
        let n = if delete { Notification::Delete } else { Notification::Set { value: value.into() } };
        prop_assert_eq!(Notification::decode(&n.encode()), Some(n));
    }

    #[test]
    fn arbitrary_bytes_never_panic(input in bytes(256)) {
        let _ = Command::parse(&input);
        let _ = Response::decode(&input);
        let _ = Notification::decode(&input);
        let text = String::from_utf8_lossy(&input);
        let _ = text.parse::<Hlc>();
        let _ = Request::parse(&input, Some(&text), Some(&text));
        if let Ok(pattern) = Pattern::new(&text) {
            let _ = pattern.matches(&text);
        }
    }

    /// Arbitrary arrays of bulk strings: a valid frame always parses to a command or a clean error,
    /// and a command that parses re-encodes to exactly the input.
    #[test]
    fn bulk_arrays_parse_to_a_command_or_an_error(
        verb in prop::sample::select(vec!["SET", "GET", "DEL", "VDEL", "KEYNOTIFY", "SCAN", "NX", "PX", "STOP", "set"]),
        args in prop::collection::vec(
            prop_oneof![bytes(6), prop::sample::select(vec!["NX", "NEX", "PX", "STOP", "10", "0", "-1"]).prop_map(|s| s.as_bytes().to_vec())],
            0..6,
        ),
    ) {
        let mut items = vec![verb.as_bytes().to_vec()];
        items.extend(args);
        let payload = encode_bulk_array(&items);
        match Command::parse(&payload) {
            Ok(command) => {
                let canonical = Command::parse(&command.encode());
                prop_assert_eq!(canonical, Ok(command));
            }
            Err(error) => prop_assert!(StoreError::KNOWN.contains(&error)),
        }
    }

    /// Truncating or extending a valid request by any amount never yields a different command.
    #[test]
    fn truncation_and_trailing_bytes_are_rejected(command in command(), cut in any::<prop::sample::Index>(), extra in bytes(4)) {
        let bytes = command.encode();
        let cut = cut.index(bytes.len());
        prop_assert_eq!(Command::parse(&bytes[..cut]), Err(StoreError::SyntaxError));
        if !extra.is_empty() {
            let mut longer = bytes.clone();
            longer.extend(extra);
            prop_assert_eq!(Command::parse(&longer), Err(StoreError::SyntaxError));
        }
    }

    #[test]
    fn hlc_format_then_parse_is_identity(ts in any::<u64>(), counter in any::<u64>(), node in "[^:]{1,16}") {
        let hlc = Hlc::new(ts, counter, node);
        prop_assert_eq!(hlc.to_string().parse::<Hlc>(), Ok(hlc));
    }

    #[test]
    fn hlc_successor_is_strictly_greater(
        last_ts in 0u64..1_000, last_c in 0u64..5, req in prop::option::of((0u64..1_000, 0u64..5)), now in 0u64..1_000,
    ) {
        let last = Hlc::new(last_ts, last_c, "statestore");
        let request = req.map(|(ts, c)| Hlc::new(ts, c, "client"));
        let next = last.successor(request.as_ref(), now);
        prop_assert!(next.tick() > last.tick());
        if let Some(request) = &request {
            prop_assert!(next > *request);
        }
        prop_assert!(next.timestamp >= now);
    }

    /// Our glob agrees with the `glob` crate on every pattern that crate accepts, except those with
    /// `**`, which that crate gives path semantics (`**/` matches zero directories) and we do not.
    #[test]
    fn glob_agrees_with_the_glob_crate(
        pattern in "[ab*?\\[\\]!^/-]{0,8}",
        key in "[ab/^\\-\\]!*]{0,8}",
    ) {
        if pattern.contains("**") {
            return Ok(());
        }
        if let Ok(oracle) = glob::Pattern::new(&pattern) {
            let ours = Pattern::new(&pattern);
            prop_assert!(ours.is_ok(), "we refused {:?}", pattern);
            prop_assert_eq!(ours.unwrap().matches(&key), oracle.matches(&key), "pattern {:?} key {:?}", pattern, key);
        }
    }
}
