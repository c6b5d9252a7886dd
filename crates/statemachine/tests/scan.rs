//! SCAN (PROTOCOL.md §13): glob semantics, paging, and what is never listed.

mod common;

use common::cmd::*;
use common::{ok, Client, Harness};
use statestore_protocol::{Response, StoreError};
use statestore_statemachine::{Config, KeyPrefixes, ScanLimits};

/// Pages through a whole scan; returns the keys and the number of pages.
fn scan_all(h: &Harness, pattern: &str) -> (Vec<String>, usize) {
    let (mut keys, mut pages, mut token) = (Vec::new(), 0, None::<Vec<u8>>);
    loop {
        pages += 1;
        assert!(pages < 10_000, "the scan must end");
        match h.read(scan(pattern, token.as_deref())).response {
            Response::Keys { keys: page, token: next } => {
                keys.extend(page.into_iter().map(|k| String::from_utf8(k.into_vec()).unwrap()));
                match next {
                    Some(next) => token = Some(next.into_vec()),
                    None => return (keys, pages),
                }
            }
            other => panic!("{other:?}"),
        }
    }
}

fn small_pages(page_keys: usize) -> Harness {
    Harness::with_config(Config { scan: ScanLimits { page_keys, ..Default::default() }, ..Default::default() })
}

#[test]
fn pages_through_a_hundred_keys_each_exactly_once() {
    let (mut h, mut c) = (small_pages(7), Client::new("c"));
    for i in 0..100 {
        ok(&h.send(&mut c, set(&format!("key{i:03}"), "v"), None));
    }
    let (keys, pages) = scan_all(&h, "key*");
    let expected: Vec<String> = (0..100).map(|i| format!("key{i:03}")).collect();
    assert_eq!(keys, expected);
    assert!(pages <= 64, "the SDK test allows at most 64 pages, took {pages}");
}

#[test]
fn glob_semantics_over_the_whole_key() {
    let (mut h, mut c) = (Harness::new(), Client::new("c"));
    for key in ["a", "ab", "abc", "b/c", "x^y", "k*", "k1", "k2", "kk"] {
        ok(&h.send(&mut c, set(key, "v"), None));
    }
    let all = |p| scan_all(&h, p).0;
    assert_eq!(all("a"), ["a"], "the whole key must match");
    assert_eq!(all("a*"), ["a", "ab", "abc"]);
    assert_eq!(all("a?"), ["ab"]);
    assert_eq!(all("*"), ["a", "ab", "abc", "b/c", "k*", "k1", "k2", "kk", "x^y"]);
    assert_eq!(all("b*"), ["b/c"], "* crosses /");
    assert_eq!(all("k[12]"), ["k1", "k2"]);
    assert_eq!(all("k[!12]"), ["k*", "kk"]);
    assert_eq!(all("k[*]"), ["k*"], "a class escapes a metacharacter");
    assert_eq!(all("x[^]y"), ["x^y"], "^ is a member, not negation");
    assert_eq!(all("nothing*"), Vec::<String>::new(), "no match is an empty final page");
    assert_eq!(h.read(scan("", None)).response.encode(), b"*1\r\n*0\r\n", "an empty pattern matches nothing");
}

#[test]
fn an_empty_store_and_an_invalid_pattern() {
    let h = Harness::new();
    assert_eq!(h.read(scan("*", None)).response.encode(), b"*1\r\n*0\r\n");
    assert_eq!(h.read(scan("[abc", None)).response, Response::Error(StoreError::SyntaxError));
}

#[test]
fn expired_and_non_utf8_keys_are_never_listed() {
    let (mut h, mut c) = (Harness::new(), Client::new("c"));
    ok(&h.send(&mut c, set("live", "v"), None));
    ok(&h.send(&mut c, set_px("short", "v", 10), None));
    let binary = statestore_protocol::Command::Set(statestore_protocol::Set::new(b"\xff\xfe".to_vec(), b"v".to_vec()));
    ok(&h.send(&mut c, binary, None));
    assert_eq!(scan_all(&h, "*").0, ["live", "short"]);
    h.advance(10);
    assert_eq!(scan_all(&h, "*").0, ["live"]);
    let bad_pattern =
        statestore_protocol::Command::Scan(statestore_protocol::Scan { pattern: b"\xff*".to_vec(), token: None });
    assert_eq!(h.read(bad_pattern).response.encode(), b"*1\r\n*0\r\n", "a non-UTF-8 pattern matches nothing");
}

#[test]
fn changes_between_pages() {
    let (mut h, mut c) = (small_pages(2), Client::new("c"));
    for key in ["a1", "a2", "a3", "a4", "a5"] {
        ok(&h.send(&mut c, set(key, "v"), None));
    }
    let Response::Keys { keys, token } = h.read(scan("a*", None)).response else { panic!() };
    assert_eq!(keys.len(), 2);
    // Delete a key not yet listed and rename another to a key after the cursor.
    assert_eq!(h.send(&mut c, del("a3"), None).reply.response, Response::Int(1));
    assert_eq!(h.send(&mut c, del("a4"), None).reply.response, Response::Int(1));
    ok(&h.send(&mut c, set("a9", "v"), None));
    let mut rest = Vec::new();
    let mut token = token.map(|t| t.into_vec());
    while let Some(t) = token.take() {
        let Response::Keys { keys, token: next } = h.read(scan("a*", Some(&t))).response else { panic!() };
        rest.extend(keys.into_iter().map(|k| k.into_vec()));
        token = next.map(|t| t.into_vec());
    }
    assert_eq!(rest, [b"a5".to_vec(), b"a9".to_vec()]);
}

#[test]
fn a_sparse_pattern_over_many_keys_returns_bounded_pages() {
    let config = Config {
        scan: ScanLimits { page_keys: 100, page_bytes: 1 << 20, examine: 50, ..Default::default() },
        ..Default::default()
    };
    let (mut h, mut c) = (Harness::with_config(config), Client::new("c"));
    for i in 0..200 {
        ok(&h.send(&mut c, set(&format!("k{i:03}"), "v"), None));
    }
    ok(&h.send(&mut c, set("k199x", "v"), None));
    let Response::Keys { keys, token } = h.read(scan("*x", None)).response else { panic!() };
    assert!(keys.is_empty() && token.is_some(), "an empty page with a token is valid");
    let (keys, pages) = scan_all(&h, "*x");
    assert_eq!(keys, ["k199x"]);
    assert_eq!(pages, 5);
}

#[test]
fn pages_are_bounded_in_bytes() {
    let config = Config {
        scan: ScanLimits { page_keys: 1000, page_bytes: 100, examine: 10_000, ..Default::default() },
        ..Default::default()
    };
    let (mut h, mut c) = (Harness::with_config(config), Client::new("c"));
    for i in 0..10 {
        ok(&h.send(&mut c, set(&format!("{i}{}", "k".repeat(40)), "v"), None));
    }
    let Response::Keys { keys, token } = h.read(scan("*", None)).response else { panic!() };
    assert_eq!(keys.len(), 3, "41-byte keys: the page closes once it reaches 100 bytes");
    assert!(token.is_some());
    assert_eq!(scan_all(&h, "*").0.len(), 10);
}

#[test]
fn scan_through_the_log_matches_the_read_path() {
    let (mut h, mut c) = (Harness::new(), Client::new("c"));
    ok(&h.send(&mut c, set("a", "v"), None));
    let via_log = h.send(&mut c, scan("*", None), None);
    assert_eq!(via_log.reply, h.read(scan("*", None)));
}

/// A long pattern full of `*` over long keys costs up to len(key) x len(pattern) comparisons per
/// key: a page ends once it has spent its comparisons, and the scan still lists every match.
#[test]
fn a_costly_pattern_over_long_keys_returns_bounded_pages() {
    let config = Config { scan: ScanLimits { match_steps: 200_000, ..Default::default() }, ..Default::default() };
    let (mut h, mut c) = (Harness::with_config(config), Client::new("c"));
    for i in 0..40 {
        ok(&h.send(&mut c, set(&format!("{i:02}{}", "a".repeat(2_000)), "v"), None));
    }
    ok(&h.send(&mut c, set(&format!("39{}b", "a".repeat(2_000)), "v"), None));
    // Every start position compares up to 1,000 characters before the `b` fails: 2 M per key.
    let pattern = format!("*{}b", "a".repeat(1_000));
    let Response::Keys { keys, token } = h.read(scan(&pattern, None)).response else { panic!() };
    assert!(keys.is_empty() && token.is_some(), "the first page stops early");
    let (keys, pages) = scan_all(&h, &pattern);
    assert_eq!(keys, [format!("39{}b", "a".repeat(2_000))]);
    assert!(pages > 2, "{pages} pages");
}

/// A client confined to some prefixes pages through its own keys only, and no page's token
/// names a key outside them: with other clients' keys before, between and after its own, and
/// pages that end on the key limit, the examine limit and the end of a range.
#[test]
fn a_confined_scan_examines_and_names_only_allowed_keys() {
    let mut h = Harness::with_config(Config {
        scan: ScanLimits { page_keys: 3, examine: 5, ..Default::default() },
        ..Default::default()
    });
    let mut c = Client::new("c");
    let mut mine = Vec::new();
    for i in 0..40 {
        for tenant in ["a-secret", "mine/x", "n-secret", "mine/y", "z-secret"] {
            let key = format!("{tenant}/{i:02}");
            ok(&h.send(&mut c, set(&key, "v"), None));
            if key.starts_with("mine/") && key.ends_with('7') {
                mine.push(key);
            }
        }
    }
    mine.sort();
    let within = KeyPrefixes::new([b"mine/x/".to_vec().into(), b"mine/".to_vec().into(), b"nothing/".to_vec().into()]);
    let (mut keys, mut token, mut pages) = (Vec::new(), None::<Vec<u8>>, 0);
    loop {
        pages += 1;
        assert!(pages < 1_000, "the scan must end");
        match h.read_within(scan("*7", token.as_deref()), &within).response {
            Response::Keys { keys: page, token: next } => {
                for key in page.iter().chain(next.iter()) {
                    assert!(key.starts_with(b"mine/"), "a page names {:?}", String::from_utf8_lossy(key));
                }
                keys.extend(page.into_iter().map(|k| String::from_utf8(k.into_vec()).unwrap()));
                match next {
                    Some(next) => token = Some(next.into_vec()),
                    None => break,
                }
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(keys, mine);
    // A pattern whose literal prefix lies within an allowed prefix, and one outside every one.
    let (page, _) = match h.read_within(scan("mine/y/0*", None), &within).response {
        Response::Keys { keys, token } => (keys, token),
        other => panic!("{other:?}"),
    };
    assert_eq!(page.len(), 3);
    assert_eq!(h.read_within(scan("a-secret/*", None), &within).response, Response::Keys { keys: vec![], token: None });
}
