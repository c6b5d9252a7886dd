use super::*;
use crate::error::StoreError;

fn parse(bytes: &[u8]) -> Result<Command, StoreError> {
    Command::parse(bytes)
}

fn req(items: &[&[u8]]) -> Vec<u8> {
    crate::resp::encode_bulk_array(items)
}

/// Every request encoding of PROTOCOL.md §5, byte-for-byte, both ways.
#[test]
fn sdk_request_bytes_parse_and_encode_exactly() {
    let set = |condition, expiry_ms| {
        Command::Set(Set { key: b"testkey".to_vec(), value: b"testvalue".to_vec(), condition, expiry_ms })
    };
    let rows: Vec<(&[u8], Command)> = vec![
        (b"*3\r\n$3\r\nSET\r\n$7\r\ntestkey\r\n$9\r\ntestvalue\r\n", set(SetCondition::Always, None)),
        (b"*4\r\n$3\r\nSET\r\n$7\r\ntestkey\r\n$9\r\ntestvalue\r\n$2\r\nNX\r\n", set(SetCondition::NotExists, None)),
        (
            b"*4\r\n$3\r\nSET\r\n$7\r\ntestkey\r\n$9\r\ntestvalue\r\n$3\r\nNEX\r\n",
            set(SetCondition::NotExistsOrEqual, None),
        ),
        (
            b"*5\r\n$3\r\nSET\r\n$7\r\ntestkey\r\n$9\r\ntestvalue\r\n$2\r\nPX\r\n$2\r\n10\r\n",
            set(SetCondition::Always, Some(10)),
        ),
        (
            b"*6\r\n$3\r\nSET\r\n$3\r\nkey\r\n$5\r\nvalue\r\n$2\r\nNX\r\n$2\r\nPX\r\n$4\r\n1000\r\n",
            Command::Set(Set {
                key: b"key".to_vec(),
                value: b"value".to_vec(),
                condition: SetCondition::NotExists,
                expiry_ms: Some(1000),
            }),
        ),
        (b"*2\r\n$3\r\nGET\r\n$7\r\ntestkey\r\n", Command::Get(Get { key: b"testkey".to_vec() })),
        (b"*2\r\n$3\r\nDEL\r\n$7\r\ntestkey\r\n", Command::Del(Del { key: b"testkey".to_vec() })),
        (
            b"*3\r\n$4\r\nVDEL\r\n$7\r\ntestkey\r\n$9\r\ntestvalue\r\n",
            Command::VDel(VDel { key: b"testkey".to_vec(), value: b"testvalue".to_vec() }),
        ),
        (
            b"*2\r\n$9\r\nKEYNOTIFY\r\n$7\r\nSOMEKEY\r\n",
            Command::KeyNotify(KeyNotify { key: b"SOMEKEY".to_vec(), stop: false }),
        ),
        (
            b"*3\r\n$9\r\nKEYNOTIFY\r\n$7\r\nSOMEKEY\r\n$4\r\nSTOP\r\n",
            Command::KeyNotify(KeyNotify { key: b"SOMEKEY".to_vec(), stop: true }),
        ),
        (b"*2\r\n$4\r\nSCAN\r\n$1\r\n*\r\n", Command::Scan(Scan { pattern: b"*".to_vec(), token: None })),
        (
            b"*3\r\n$4\r\nSCAN\r\n$4\r\nkey*\r\n$4\r\n1;1;\r\n",
            Command::Scan(Scan {
                pattern: b"key*".to_vec(),
                token: Some(serde_bytes::ByteBuf::from(b"1;1;".to_vec())),
            }),
        ),
    ];
    for (bytes, command) in rows {
        assert_eq!(parse(bytes).as_ref(), Ok(&command), "{}", String::from_utf8_lossy(bytes));
        assert_eq!(command.encode(), bytes);
    }
}

#[test]
fn set_options_in_any_order() {
    let parsed = parse(&req(&[b"SET", b"k", b"v", b"PX", b"5", b"NEX"])).unwrap();
    assert_eq!(
        parsed,
        Command::Set(Set {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            condition: SetCondition::NotExistsOrEqual,
            expiry_ms: Some(5)
        })
    );
}

#[test]
fn keys_and_values_are_binary_safe() {
    let key = b"k\0\r\n\xff".to_vec();
    let set = Set::new(key.clone(), Vec::new());
    assert_eq!(parse(&set.encode()), Ok(Command::Set(set)));
    let key = vec![0u8; 6500];
    let get = Get { key };
    assert_eq!(parse(&get.encode()), Ok(Command::Get(get)));
}

#[test]
fn px_accepts_non_negative_integers_with_leading_zeros() {
    for (px, ms) in [(&b"0"[..], 0), (b"007", 7), (b"18446744073709551615", u64::MAX)] {
        let Command::Set(set) = parse(&req(&[b"SET", b"k", b"v", b"PX", px])).unwrap() else { panic!() };
        assert_eq!(set.expiry_ms, Some(ms));
    }
}

#[test]
fn bad_px_is_a_syntax_error() {
    for px in [&b""[..], b"-1", b"+5", b"1500.5", b"1500,5", b" 5", b"5 ", b"1e3", b"18446744073709551616", b"ten"] {
        assert_eq!(parse(&req(&[b"SET", b"k", b"v", b"PX", px])), Err(StoreError::SyntaxError), "{px:?}");
    }
    assert_eq!(parse(&req(&[b"SET", b"k", b"v", b"PX"])), Err(StoreError::SyntaxError), "PX without a value");
}

#[test]
fn conflicting_repeated_and_unknown_options_are_syntax_errors() {
    for options in [
        &[&b"NX"[..], b"NEX"][..],
        &[b"NEX", b"NX"],
        &[b"NX", b"NX"],
        &[b"NEX", b"NEX"],
        &[b"PX", b"1", b"PX", b"2"],
        &[b"EX", b"1"],
        &[b"XX"],
        &[b"KEEPTTL"],
        &[b"nx"],
        &[b"px", b"10"],
        &[b"Nx"],
        &[b"NX", b"PX", b"1", b"extra"],
    ] {
        let mut items: Vec<&[u8]> = vec![b"SET", b"k", b"v"];
        items.extend_from_slice(options);
        assert_eq!(parse(&req(&items)), Err(StoreError::SyntaxError), "{options:?}");
    }
}

#[test]
fn unknown_and_lower_case_verbs_are_unknown_commands() {
    for verb in [&b"set"[..], b"Get", b"del", b"PING", b"HELLO", b"", b"SET ", b"\0"] {
        assert_eq!(parse(&req(&[verb, b"k", b"v"])), Err(StoreError::UnknownCommand), "{verb:?}");
    }
}

#[test]
fn arity_is_checked_per_verb() {
    for items in [
        &[&b"SET"[..]][..],
        &[b"SET", b"k"],
        &[b"GET"],
        &[b"GET", b"k", b"x"],
        &[b"DEL"],
        &[b"DEL", b"k", b"x"],
        &[b"VDEL", b"k"],
        &[b"VDEL", b"k", b"v", b"x"],
        &[b"KEYNOTIFY"],
        &[b"KEYNOTIFY", b"k", b"STOP", b"x"],
        &[b"SCAN"],
        &[b"SCAN", b"*", b"t", b"x"],
    ] {
        assert_eq!(parse(&req(items)), Err(StoreError::WrongNumberOfArguments), "{items:?}");
    }
}

#[test]
fn keynotify_only_takes_stop() {
    assert_eq!(parse(&req(&[b"KEYNOTIFY", b"k", b"stop"])), Err(StoreError::SyntaxError));
    assert_eq!(parse(&req(&[b"KEYNOTIFY", b"k", b"START"])), Err(StoreError::SyntaxError));
}

#[test]
fn empty_keys_are_refused_for_every_keyed_verb() {
    // .NET sends exactly this for GET with an empty key.
    assert_eq!(parse(b"*2\r\n$3\r\nGET\r\n$0\r\n\r\n"), Err(StoreError::KeyLengthZero));
    for items in [
        &[&b"SET"[..], b"", b"v"][..],
        &[b"SET", b"", b"v", b"NX"],
        &[b"DEL", b""],
        &[b"VDEL", b"", b"v"],
        &[b"KEYNOTIFY", b""],
        &[b"KEYNOTIFY", b"", b"STOP"],
    ] {
        assert_eq!(parse(&req(items)), Err(StoreError::KeyLengthZero), "{items:?}");
    }
    // An empty value is fine.
    assert!(parse(&req(&[b"SET", b"k", b""])).is_ok());
    assert!(parse(&req(&[b"VDEL", b"k", b""])).is_ok());
}

#[test]
fn malformed_frames_are_syntax_errors() {
    for bad in [
        &b""[..],
        b"SET k v",
        b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n",
        b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\ntrailing",
        b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\nv\r\n",
        b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n:1\r\n",
        b"*1\r\n*1\r\n$3\r\nGET\r\n",
        b"*0\r\n",
        b"+OK\r\n",
    ] {
        assert_eq!(parse(bad), Err(StoreError::SyntaxError), "{:?}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn verbs_and_read_write_classes() {
    let get = parse(&req(&[b"GET", b"k"])).unwrap();
    assert!(get.is_read() && !get.is_fenced());
    assert_eq!(get.verb(), "GET");
    let stop = parse(&req(&[b"KEYNOTIFY", b"k", b"STOP"])).unwrap();
    assert!(!stop.is_read() && !stop.is_fenced());
    assert_eq!(stop.verb(), "KEYNOTIFY STOP");
    assert!(parse(&req(&[b"VDEL", b"k", b"v"])).unwrap().is_fenced());
    assert_eq!(parse(&req(&[b"SCAN", b"*"])).unwrap().key(), None);
}
