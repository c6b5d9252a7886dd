//! What the barrages of mutated requests (`tests/mqtt.rs`, `tests/http_api.rs`) share: their seed
//! and keys, a request payload mutated from a command's valid form, and the checks after a
//! barrage: every node still serving, and all of them holding the same applied state.

use statestore_protocol::{encode_bulk_array, Get, Response, Scan};

use super::{Answer, Cluster};

/// `__ts` values a barrage sends in place of a valid one: empty, too few or too many fields, a
/// wall clock past `u64`, a negative one.
pub const BROKEN_TIMESTAMPS: [&str; 5] = ["", "0", "1:2:3:4", "18446744073709551616:0:x", "-1:0:x"];
/// `__ft` values a barrage sends: malformed ones, and one well-formed token (which fences the key).
pub const FENCING_TOKENS: [&str; 4] = ["", "x", "1:0:", "0:0:holder"];

/// A request payload: a valid form of one of the commands on one of `keys`, most of the time
/// mutated: bytes flipped, cut or inserted; a length or count past the payload or past any
/// integer; 2,000 levels of nesting; two commands in one payload; random bytes; or a value of up
/// to 100 kB.
pub fn mutated_payload(dice: &mut fastrand::Rng, keys: &[Vec<u8>]) -> Vec<u8> {
    let key = keys[dice.usize(..keys.len())].as_slice();
    let seeds: [Vec<u8>; 11] = [
        encode_bulk_array(&[&b"SET"[..], key, b"value"]),
        encode_bulk_array(&[&b"SET"[..], key, b"value", b"NX"]),
        encode_bulk_array(&[&b"SET"[..], key, b"other", b"NEX"]),
        encode_bulk_array(&[&b"SET"[..], key, b"value", b"PX", b"5000"]),
        encode_bulk_array(&[&b"GET"[..], key]),
        encode_bulk_array(&[&b"DEL"[..], key]),
        encode_bulk_array(&[&b"VDEL"[..], key, b"value"]),
        encode_bulk_array(&[&b"KEYNOTIFY"[..], key]),
        encode_bulk_array(&[&b"KEYNOTIFY"[..], key, b"STOP"]),
        encode_bulk_array(&[&b"SCAN"[..], b"barrage*"]),
        encode_bulk_array(&[&b"SCAN"[..], b"*", b"not-a-token"]),
    ];
    let mut payload = seeds[dice.usize(..seeds.len())].clone();
    match dice.u8(..14) {
        0..=4 => {}
        5 => {
            for _ in 0..dice.usize(1..5) {
                let at = dice.usize(..payload.len());
                payload[at] = dice.u8(..);
            }
        }
        6 => payload.truncate(dice.usize(..payload.len())),
        7 => {
            let at = dice.usize(..=payload.len());
            let junk: Vec<u8> = (0..dice.usize(1..32)).map(|_| dice.u8(..)).collect();
            payload.splice(at..at, junk);
        }
        8 => {
            // A length far beyond the payload, or beyond any integer.
            let huge: &[u8] = [&b"4294967296"[..], b"99999999999999999999999", b"-2", b"0"][dice.usize(..4)];
            if let Some(at) = payload.iter().rposition(|&b| b == b'$') {
                let end = at + 1 + payload[at + 1..].iter().position(|&b| b == b'\r').unwrap_or(0);
                payload.splice(at + 1..end, huge.iter().copied());
            }
        }
        9 => {
            let count: &[u8] = [&b"2147483647"[..], b"0", b"-1", b"100000"][dice.usize(..4)];
            let end = payload.iter().position(|&b| b == b'\r').unwrap_or(1);
            payload.splice(1..end, count.iter().copied());
        }
        10 => payload = [b"*1\r\n".repeat(dice.usize(1..2000)), payload].concat(),
        11 => payload = payload.repeat(2),
        12 => payload = (0..dice.usize(..64)).map(|_| dice.u8(..)).collect(),
        _ => payload = encode_bulk_array(&[&b"SET"[..], key, &vec![b'v'; dice.usize(..100_000)]]),
    }

    payload
}

/// Every key on node `id`, from its own applied state.
pub async fn local_keys(cluster: &Cluster, id: u64) -> Vec<Vec<u8>> {
    let mut keys = Vec::new();
    let mut token = None;
    loop {
        let scan = Scan { pattern: b"*".to_vec(), token: token.take() };
        let answer = cluster.command(id, scan.encode(), None, "?consistency=local").await.expect("a local SCAN");
        let Response::Keys { keys: page, token: next } = answer.response else { panic!("SCAN answered {answer:?}") };
        keys.extend(page.into_iter().map(|k| k.into_vec()));
        match next {
            Some(next) => token = Some(next),
            None => break,
        }
    }
    keys.sort();
    keys
}

/// Every key with its value and version on node `id`, from its own applied state.
pub async fn local_state(cluster: &Cluster, id: u64) -> Vec<(Vec<u8>, Answer)> {
    let mut state = Vec::new();
    for key in local_keys(cluster, id).await {
        let get = Get { key: key.clone() }.encode();
        state.push((key, cluster.command(id, get, None, "?consistency=local").await.expect("a local GET")));
    }
    state
}

/// Waits up to 20 s for nodes 1, 2 and 3 to hold the same keys, values and versions, `key` among
/// them. Expiries still due are swept through the log, so the nodes agree once they have applied
/// it.
pub async fn assert_nodes_agree(cluster: &Cluster, seed: u64, key: &[u8]) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let one = local_state(cluster, 1).await;
        let (two, three) = (local_state(cluster, 2).await, local_state(cluster, 3).await);
        if one == two && one == three {
            assert!(one.iter().any(|(held, _)| held == key), "seed {seed}: no node holds {key:?}");
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "seed {seed}: the nodes hold different keys\n1: {one:?}\n2: {two:?}\n3: {three:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// The seed of a barrage: `BARRAGE_SEED` when set, else a fresh one; printed either way.
pub fn seed() -> u64 {
    let seed = std::env::var("BARRAGE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| fastrand::u64(..));
    println!("barrage seed {seed} (BARRAGE_SEED={seed} replays it)");
    seed
}

/// The keys a barrage works on: 16 plain ones and one with a NUL, a CR and a byte that is not
/// UTF-8.
pub fn keys() -> Vec<Vec<u8>> {
    (0..16).map(|n| format!("barrage{n}").into_bytes()).chain([vec![0xff, 0, b'\r']]).collect()
}

/// What kind of reply `response` is, for a barrage's tally: `+OK`, `:N`, `nil`, `a value`, `a
/// SCAN page` or the `-ERR` text.
pub fn reply_kind(response: &Response) -> String {
    match response {
        Response::Error(error) => format!("-ERR {error}"),
        Response::Ok => "+OK".into(),
        Response::Int(n) => format!(":{n}"),
        Response::Nil => "nil".into(),
        Response::Value(_) => "a value".into(),
        Response::Keys { .. } => "a SCAN page".into(),
    }
}

/// Nodes 1, 2 and 3 are still running, none has panicked, and all are ready.
pub async fn assert_nodes_serving(cluster: &mut Cluster, seed: u64) {
    for id in [1, 2, 3] {
        let exit = cluster.wait_exit(id, std::time::Duration::ZERO);
        assert_eq!(exit, None, "seed {seed}: node {id} stopped\n{}", cluster.logs());
    }
    assert!(!cluster.logs().contains("panicked"), "seed {seed}: a node panicked\n{}", cluster.logs());
    cluster.wait_ready().await;
}
