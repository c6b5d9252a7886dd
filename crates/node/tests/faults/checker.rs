//! Linearizability of one key's history against the sequential semantics of SET (NX, NEX, PX), GET,
//! SCAN (of a pattern that only the key's own name matches), DEL and VDEL with fencing tokens (docs/protocol.md), in the manner of Wing & Gong with Lowe's
//! memoization: a
//! depth-first search for an order of the operations that respects real time (an operation that
//! returned before another was invoked comes first) and in which every answer is what the
//! sequential store would have given. An operation without an answer (timed out) may have taken
//! effect once, at any point after its invocation, or never.
//!
//! A value written with `PX` lapses at a moment the history knows only within bounds: the store
//! stamps the deadline from its clock when it applies the SET, somewhere between the call's
//! invocation and its answer (plus [`CLOCK_SLACK_US`] either way for the clock's resolution and
//! the few milliseconds a request's timestamp may push it). The search keeps that window with the
//! state, and each operation on the key may find the value still there or lapsed, as long as the
//! window allows it at a moment the operation could have taken effect; what it finds narrows the
//! window, and the moment it took effect bounds the operations after it.
//!
//! Written values are unique, which keeps the search narrow: a read names the write it saw.

use std::collections::HashSet;
use std::hash::{Hash, Hasher};

/// How far the store's clock may put a `PX` deadline from the history's own clock, either way
/// (µs): milliseconds truncated, a request's timestamp pushing the version up to 6 ms ahead, the
/// wall clock and the monotonic one drifting apart over a run.
pub const CLOCK_SLACK_US: u64 = 20_000;

/// What was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// `SET`, with `NX` or `NEX` as `condition` says, with `PX px_ms` when given.
    Set {
        value: String,
        condition: Condition,
        px_ms: Option<u64>,
    },
    Get,
    /// `SCAN` of a pattern only this key's name matches: whether the key exists. Every page of
    /// a scan is a linearizable read, and the key is on one page at most, so a scan of several
    /// pages reads it at one moment between the first request and the last answer.
    Scan,
    Del,
    VDel(String),
}

/// When a SET applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    Always,
    /// `NX`: only on an absent key.
    NotExists,
    /// `NEX`: on an absent key or one holding the same value (a lease renewed by its holder).
    NotExistsOrEqual,
}

/// What the store answered: `+OK`, `:n`, a value, nil, whether a scan listed the key, or a
/// fencing refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Ok,
    Int(i64),
    Value(String),
    Nil,
    Listed(bool),
    /// `a fencing token is required for this request`.
    FencingRequired,
    /// `the request fencing token is a lower version than the fencing token protecting the resource`.
    FencingLower,
}

/// A fencing token, ordered as the store orders them: (milliseconds, counter). The suite makes
/// every token's pair unique.
pub type Token = (u64, u64);

/// One operation on one key, times in µs of the history's clock. `returned` is `None` when no
/// answer came. `token` is its `__ft`.
#[derive(Debug, Clone)]
pub struct Op {
    pub invoked: u64,
    pub returned: Option<u64>,
    pub call: Call,
    pub token: Option<Token>,
    pub answer: Option<Answer>,
}

/// A key as the sequential store holds it: its value, the token protecting it (only while it
/// exists: deleting a key discards its token), and, for a value written with `PX`, the window
/// its deadline lies in (µs, the first bound excluded: the value was seen after it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct State {
    pub value: Option<String>,
    pub token: Option<Token>,
    pub deadline: Option<(u64, u64)>,
}

/// The sequential store's answer to `call` with `token` on `state` (a value whose deadline has
/// passed already taken away), and the state after it. SET, DEL and VDEL on a key with a token
/// need one at least as new; a SET that applies keeps the newer token and sets the deadline to
/// `deadline` (from its `PX`), or none. Reads never need a token.
pub fn step(state: &State, call: &Call, token: Option<Token>, deadline: Option<(u64, u64)>) -> (Answer, State) {
    let unchanged = state.clone();
    if !is_read(call) {
        match (state.token, token) {
            (Some(_), None) => return (Answer::FencingRequired, unchanged),
            (Some(stored), Some(given)) if given < stored => return (Answer::FencingLower, unchanged),
            _ => {}
        }
    }
    let set = |value: &String| State { value: Some(value.clone()), token: state.token.max(token), deadline };
    match call {
        Call::Set { value, condition, .. } => match (condition, &state.value) {
            (Condition::Always, _) | (_, None) => (Answer::Ok, set(value)),
            (Condition::NotExistsOrEqual, Some(current)) if current == value => (Answer::Ok, set(value)),
            (Condition::NotExists | Condition::NotExistsOrEqual, Some(_)) => (Answer::Int(-1), unchanged),
        },
        Call::Get => (state.value.clone().map_or(Answer::Nil, Answer::Value), unchanged),
        Call::Scan => (Answer::Listed(state.value.is_some()), unchanged),
        Call::Del => match &state.value {
            Some(_) => (Answer::Int(1), State::default()),
            None => (Answer::Int(0), State::default()),
        },
        Call::VDel(v) => match &state.value {
            Some(current) if current == v => (Answer::Int(1), State::default()),
            Some(_) => (Answer::Int(-1), unchanged),
            None => (Answer::Int(0), State::default()),
        },
    }
}

/// Whether `call` only reads the key (and so needs no fencing token and changes nothing).
pub fn is_read(call: &Call) -> bool {
    matches!(call, Call::Get | Call::Scan)
}

/// The ways `op` may take effect on `state` when no operation placed before it took effect
/// later than `now`: the answer, the state after it, and the earliest moment it can have taken
/// effect. A value with a deadline may still be there (if the deadline can fall after that
/// moment) or have lapsed (if it can fall before the op's answer).
fn outcomes(state: &State, op: &Op, now: u64) -> Vec<(Answer, State, u64)> {
    let earliest = now.max(op.invoked);
    let latest = op.returned.unwrap_or(u64::MAX);
    if earliest > latest {
        return Vec::new();
    }
    let mut before = Vec::with_capacity(2);
    match state.deadline {
        None => before.push((state.clone(), earliest)),
        Some((after, by)) => {
            if by > earliest {
                before.push((State { deadline: Some((after.max(earliest), by)), ..state.clone() }, earliest));
            }
            if after < latest {
                before.push((State::default(), earliest.max(after + 1)));
            }
        }
    }
    before
        .into_iter()
        .map(|(state, at)| {
            let deadline = match op.call {
                Call::Set { px_ms: Some(px), .. } => {
                    let px = px * 1_000;
                    Some(((at + px).saturating_sub(CLOCK_SLACK_US), latest.saturating_add(px + CLOCK_SLACK_US)))
                }
                _ => None,
            };
            let (answer, after) = step(&state, &op.call, op.token, deadline);
            (answer, after, at)
        })
        .collect()
}

/// The verdict on one key's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Linearizable,
    /// No order explains the answers; the operations that could not be placed last.
    NotLinearizable(String),
    /// The search gave up after its step budget.
    Undecided,
}

/// Decides whether `ops` (one key's, starting from an absent key) are linearizable, visiting at
/// most `budget` search states. One set of linearized operations is kept and changed as the
/// search goes down and back, with its hash kept alongside (Zobrist's), so a step costs the
/// same however long the history is.
pub fn check(ops: &[Op], budget: usize) -> Verdict {
    // Reads that got no answer change nothing and constrain nothing.
    let mut ops: Vec<Op> = ops.iter().filter(|op| !(op.answer.is_none() && is_read(&op.call))).cloned().collect();
    ops.sort_by_key(|op| op.invoked);
    let n = ops.len();
    let required = ops.iter().filter(|op| op.answer.is_some()).count();
    let answered_by = |i: usize| ops[i].returned.filter(|_| ops[i].answer.is_some());
    // Two 64-bit random words per operation, XORed into the hash of the linearized set.
    let zobrist: Vec<(u64, u64)> = (0..n as u64).map(|i| (mix(2 * i + 1), mix(2 * i + 2))).collect();
    let mut done = vec![false; n];
    let mut done_hash = (0u64, 0u64);
    // (linearized set, state, moment) triples already explored.
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    struct Frame {
        /// The operation placed to get here (none for the first frame).
        placed_op: Option<usize>,
        state: State,
        /// No operation placed so far can have taken effect later than this (µs).
        now: u64,
        placed: usize,
        /// Every operation before this one is linearized.
        low: usize,
        /// The next candidate to try, and the outcomes of the one being tried not tried yet.
        next: usize,
        pending: Vec<(usize, State, u64)>,
    }
    let first = Frame { placed_op: None, state: State::default(), now: 0, placed: 0, low: 0, next: 0, pending: vec![] };
    let mut stack = vec![first];
    let mut visited = 0usize;
    let mut deepest = 0usize;
    while let Some(frame) = stack.last_mut() {
        if frame.placed == required {
            return Verdict::Linearizable;
        }
        // An operation may go next only if it was invoked before every remaining answered
        // operation returned. Operations are in order of invocation, so the earliest answer
        // is among those invoked before it.
        let mut horizon = u64::MAX;
        for i in frame.low..n {
            if ops[i].invoked > horizon {
                break;
            }
            if !done[i] {
                horizon = horizon.min(answered_by(i).unwrap_or(u64::MAX));
            }
        }
        let mut pushed = None;
        loop {
            if frame.pending.is_empty() {
                if frame.next >= n {
                    break;
                }
                let i = frame.next;
                frame.next += 1;
                if done[i] {
                    continue;
                }
                if ops[i].invoked > horizon {
                    break;
                }
                frame.pending = outcomes(&frame.state, &ops[i], frame.now)
                    .into_iter()
                    .filter(|(answer, ..)| ops[i].answer.as_ref().is_none_or(|given| given == answer))
                    .map(|(_, state, at)| (i, state, at))
                    .collect();
                continue;
            }
            let (i, state, at) = frame.pending.pop().expect("not empty");
            let hash = (done_hash.0 ^ zobrist[i].0, done_hash.1 ^ zobrist[i].1);
            if !seen.insert(fingerprint(hash, &state, at)) {
                continue;
            }
            done[i] = true;
            done_hash = hash;
            let placed = frame.placed + usize::from(ops[i].answer.is_some());
            let mut low = frame.low;
            while low < n && done[low] {
                low += 1;
            }
            pushed = Some(Frame { placed_op: Some(i), state, now: at, placed, low, next: low, pending: vec![] });
            break;
        }
        match pushed {
            Some(next) => {
                visited += 1;
                if visited > budget {
                    return Verdict::Undecided;
                }
                deepest = deepest.max(next.placed);
                stack.push(next);
            }
            None => {
                if let Some(i) = stack.pop().and_then(|frame| frame.placed_op) {
                    done[i] = false;
                    done_hash = (done_hash.0 ^ zobrist[i].0, done_hash.1 ^ zobrist[i].1);
                }
            }
        }
    }
    let stuck: Vec<String> = ops
        .iter()
        .filter(|op| op.answer.is_some())
        .skip(deepest.saturating_sub(2))
        .take(6)
        .map(|op| format!("{:?} -> {:?} [{}..{:?}]", op.call, op.answer, op.invoked, op.returned))
        .collect();
    Verdict::NotLinearizable(format!(
        "{} answered operations, at most {deepest} could be ordered; around there: {}",
        required,
        stuck.join("; ")
    ))
}

/// SplitMix64's finalizer: a well-spread 64-bit word for each input.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The memo key of a linearized set (by its hash), a state and a moment.
fn fingerprint(done: (u64, u64), state: &State, now: u64) -> (u64, u64) {
    let hash = |seed: u64| {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        seed.hash(&mut hasher);
        state.hash(&mut hasher);
        now.hash(&mut hasher);
        hasher.finish()
    };
    (done.0 ^ hash(1), done.1 ^ hash(2))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(invoked: u64, returned: u64, call: Call, answer: Answer) -> Op {
        Op { invoked, returned: Some(returned), call, token: None, answer: Some(answer) }
    }

    fn fenced(invoked: u64, returned: u64, call: Call, token: u64, answer: Answer) -> Op {
        Op { invoked, returned: Some(returned), call, token: Some((token, 0)), answer: Some(answer) }
    }

    fn lost(invoked: u64, call: Call) -> Op {
        Op { invoked, returned: None, call, token: None, answer: None }
    }

    fn set(v: &str) -> Call {
        Call::Set { value: v.into(), condition: Condition::Always, px_ms: None }
    }

    fn set_nx(v: &str) -> Call {
        Call::Set { value: v.into(), condition: Condition::NotExists, px_ms: None }
    }

    fn set_nex(v: &str) -> Call {
        Call::Set { value: v.into(), condition: Condition::NotExistsOrEqual, px_ms: None }
    }

    fn set_px(v: &str, px_ms: u64) -> Call {
        Call::Set { value: v.into(), condition: Condition::Always, px_ms: Some(px_ms) }
    }

    fn value(v: &str) -> Answer {
        Answer::Value(v.into())
    }

    const BUDGET: usize = 100_000;

    #[test]
    fn sequential_and_concurrent_histories_that_make_sense_are_accepted() {
        let history = [
            op(0, 1, set("a"), Answer::Ok),
            op(2, 3, Call::Get, value("a")),
            op(4, 10, set("b"), Answer::Ok),
            // Concurrent with the SET of b: either value.
            op(5, 6, Call::Get, value("a")),
            op(7, 8, Call::Get, value("b")),
            op(11, 12, Call::VDel("b".into()), Answer::Int(1)),
            op(13, 14, set_nx("c"), Answer::Ok),
            op(15, 16, set_nx("d"), Answer::Int(-1)),
            op(17, 18, Call::Del, Answer::Int(1)),
            op(19, 20, Call::Del, Answer::Int(0)),
        ];
        assert_eq!(check(&history, BUDGET), Verdict::Linearizable);
    }

    #[test]
    fn an_operation_without_an_answer_may_have_happened_or_not() {
        let happened = [lost(0, set("a")), op(5, 6, Call::Get, value("a"))];
        assert_eq!(check(&happened, BUDGET), Verdict::Linearizable);
        let did_not = [lost(0, set("a")), op(5, 6, Call::Get, Answer::Nil)];
        assert_eq!(check(&did_not, BUDGET), Verdict::Linearizable);
        // It cannot take effect before it was invoked.
        let too_early = [op(0, 1, Call::Get, value("a")), lost(2, set("a"))];
        assert!(matches!(check(&too_early, BUDGET), Verdict::NotLinearizable(_)));
    }

    #[test]
    fn a_stale_read_after_an_acknowledged_write_is_caught() {
        let history = [op(0, 1, set("a"), Answer::Ok), op(2, 3, set("b"), Answer::Ok), op(4, 5, Call::Get, value("a"))];
        assert!(matches!(check(&history, BUDGET), Verdict::NotLinearizable(_)));
    }

    #[test]
    fn a_lost_acknowledged_write_is_caught() {
        let history = [op(0, 1, set("a"), Answer::Ok), op(2, 3, Call::Get, Answer::Nil)];
        assert!(matches!(check(&history, BUDGET), Verdict::NotLinearizable(_)));
    }

    #[test]
    fn a_value_never_written_is_caught() {
        let history = [op(0, 1, set("a"), Answer::Ok), op(2, 3, Call::Get, value("z"))];
        assert!(matches!(check(&history, BUDGET), Verdict::NotLinearizable(_)));
    }

    #[test]
    fn a_scan_must_list_the_key_exactly_while_it_exists() {
        let history = [
            op(0, 1, Call::Scan, Answer::Listed(false)),
            op(2, 3, set("a"), Answer::Ok),
            op(4, 5, Call::Scan, Answer::Listed(true)),
            // Concurrent with the delete: either.
            op(6, 9, Call::Del, Answer::Int(1)),
            op(7, 8, Call::Scan, Answer::Listed(true)),
            op(10, 11, Call::Scan, Answer::Listed(false)),
        ];
        assert_eq!(check(&history, BUDGET), Verdict::Linearizable);
        let missed = [op(0, 1, set("a"), Answer::Ok), op(2, 3, Call::Scan, Answer::Listed(false))];
        assert!(matches!(check(&missed, BUDGET), Verdict::NotLinearizable(_)));
        let deleted = [
            op(0, 1, set("a"), Answer::Ok),
            op(2, 3, Call::Del, Answer::Int(1)),
            op(4, 5, Call::Scan, Answer::Listed(true)),
        ];
        assert!(matches!(check(&deleted, BUDGET), Verdict::NotLinearizable(_)));
        let lapsed =
            [op(0, MS, set_px("a", 100), Answer::Ok), op(200 * MS, 201 * MS, Call::Scan, Answer::Listed(true))];
        assert!(matches!(check(&lapsed, BUDGET), Verdict::NotLinearizable(_)));
    }

    #[test]
    fn two_successful_set_nx_without_a_delete_between_are_caught() {
        let history = [op(0, 1, set_nx("a"), Answer::Ok), op(2, 3, set_nx("b"), Answer::Ok)];
        assert!(matches!(check(&history, BUDGET), Verdict::NotLinearizable(_)));
        let with_delete =
            [op(0, 1, set_nx("a"), Answer::Ok), op(2, 3, Call::Del, Answer::Int(1)), op(4, 5, set_nx("b"), Answer::Ok)];
        assert_eq!(check(&with_delete, BUDGET), Verdict::Linearizable);
    }

    /// A lease: its holder renews it with the value it holds, anyone takes it once it is free.
    #[test]
    fn set_nex_applies_to_an_absent_key_or_the_same_value_only() {
        let history = [
            op(0, 1, set_nex("holder-a"), Answer::Ok),
            op(2, 3, set_nex("holder-a"), Answer::Ok),
            op(4, 5, set_nex("holder-b"), Answer::Int(-1)),
            op(6, 7, Call::Get, value("holder-a")),
            op(8, 9, Call::VDel("holder-a".into()), Answer::Int(1)),
            op(10, 11, set_nex("holder-b"), Answer::Ok),
        ];
        assert_eq!(check(&history, BUDGET), Verdict::Linearizable);
        let taken_while_held = [op(0, 1, set_nex("holder-a"), Answer::Ok), op(2, 3, set_nex("holder-b"), Answer::Ok)];
        assert!(matches!(check(&taken_while_held, BUDGET), Verdict::NotLinearizable(_)));
        let renewal_refused = [op(0, 1, set("holder-a"), Answer::Ok), op(2, 3, set_nex("holder-a"), Answer::Int(-1))];
        assert!(matches!(check(&renewal_refused, BUDGET), Verdict::NotLinearizable(_)));
    }

    #[test]
    fn fencing_tokens_are_required_kept_and_compared() {
        let history = [
            fenced(0, 1, set("a"), 10, Answer::Ok),
            op(2, 3, set("b"), Answer::FencingRequired),
            fenced(4, 5, set("c"), 5, Answer::FencingLower),
            fenced(6, 7, set("d"), 20, Answer::Ok),
            fenced(8, 9, Call::Del, 15, Answer::FencingLower),
            op(10, 11, Call::Get, value("d")),
            fenced(12, 13, Call::VDel("d".into()), 20, Answer::Int(1)),
            // Deleting the key discarded its token.
            op(14, 15, set("e"), Answer::Ok),
        ];
        assert_eq!(check(&history, BUDGET), Verdict::Linearizable);
        // A write with an old token that the store took anyway is caught...
        let took_old = [fenced(0, 1, set("a"), 10, Answer::Ok), fenced(2, 3, set("b"), 5, Answer::Ok)];
        assert!(matches!(check(&took_old, BUDGET), Verdict::NotLinearizable(_)));
        // ...and so is a refusal of a token that was new enough, or of a write on a free key.
        let refused_new = [fenced(0, 1, set("a"), 10, Answer::Ok), fenced(2, 3, set("b"), 10, Answer::FencingLower)];
        assert!(matches!(check(&refused_new, BUDGET), Verdict::NotLinearizable(_)));
        let refused_free = [op(0, 1, set("a"), Answer::FencingRequired)];
        assert!(matches!(check(&refused_free, BUDGET), Verdict::NotLinearizable(_)));
    }

    #[test]
    fn a_vdel_of_the_current_value_that_says_mismatch_is_caught() {
        let history = [op(0, 1, set("a"), Answer::Ok), op(2, 3, Call::VDel("a".into()), Answer::Int(-1))];
        assert!(matches!(check(&history, BUDGET), Verdict::NotLinearizable(_)));
    }

    const MS: u64 = 1_000;

    #[test]
    fn a_value_written_with_px_lapses_inside_its_window_and_stays_lapsed() {
        // SET PX 100 ms answered at 1 ms: the deadline lies between 100 and 101 ms, give or
        // take the clock slack.
        let lapsed = [
            op(0, MS, set_px("a", 100), Answer::Ok),
            op(50 * MS, 51 * MS, Call::Get, value("a")),
            op(200 * MS, 201 * MS, Call::Get, Answer::Nil),
            op(202 * MS, 203 * MS, set_nx("b"), Answer::Ok),
        ];
        assert_eq!(check(&lapsed, BUDGET), Verdict::Linearizable);
        // Around the deadline either answer will do, one after the other...
        let around = [
            op(0, MS, set_px("a", 100), Answer::Ok),
            op(95 * MS, 96 * MS, Call::Get, value("a")),
            op(97 * MS, 98 * MS, Call::Get, Answer::Nil),
        ];
        assert_eq!(check(&around, BUDGET), Verdict::Linearizable);
        // ...but not the value again once it was seen lapsed.
        let back = [
            op(0, MS, set_px("a", 100), Answer::Ok),
            op(95 * MS, 96 * MS, Call::Get, Answer::Nil),
            op(97 * MS, 98 * MS, Call::Get, value("a")),
        ];
        assert!(matches!(check(&back, BUDGET), Verdict::NotLinearizable(_)));
        // A SET without PX ends the deadline.
        let kept = [
            op(0, MS, set_px("a", 100), Answer::Ok),
            op(2 * MS, 3 * MS, set("b"), Answer::Ok),
            op(500 * MS, 501 * MS, Call::Get, value("b")),
        ];
        assert_eq!(check(&kept, BUDGET), Verdict::Linearizable);
    }

    #[test]
    fn a_value_that_lapses_too_early_or_too_late_is_caught() {
        let early = [op(0, MS, set_px("a", 100), Answer::Ok), op(40 * MS, 41 * MS, Call::Get, Answer::Nil)];
        assert!(matches!(check(&early, BUDGET), Verdict::NotLinearizable(_)));
        let late = [op(0, MS, set_px("a", 100), Answer::Ok), op(200 * MS, 201 * MS, Call::Get, value("a"))];
        assert!(matches!(check(&late, BUDGET), Verdict::NotLinearizable(_)));
        // A write that found the key free cannot have come before a read that saw it still set.
        let nx_too_soon = [
            op(0, MS, set_px("a", 100), Answer::Ok),
            op(50 * MS, 250 * MS, Call::Get, Answer::Nil),
            op(60 * MS, 70 * MS, set_nx("b"), Answer::Ok),
        ];
        assert!(matches!(check(&nx_too_soon, BUDGET), Verdict::NotLinearizable(_)));
        // A lapsed value takes its fencing token with it.
        let token_gone = [
            fenced(0, MS, set_px("a", 100), 10, Answer::Ok),
            op(300 * MS, 301 * MS, set("b"), Answer::FencingRequired),
        ];
        assert!(matches!(check(&token_gone, BUDGET), Verdict::NotLinearizable(_)));
    }
}
