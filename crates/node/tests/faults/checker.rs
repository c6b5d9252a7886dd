//! Linearizability of one key's history against the sequential semantics of SET, SET NX, GET,
//! DEL and VDEL with fencing tokens (docs/protocol.md), in the manner of Wing & Gong with Lowe's
//! memoization: a
//! depth-first search for an order of the operations that respects real time (an operation that
//! returned before another was invoked comes first) and in which every answer is what the
//! sequential store would have given. An operation without an answer (timed out) may have taken
//! effect once, at any point after its invocation, or never.
//!
//! Written values are unique, which keeps the search narrow: a read names the write it saw.

use std::collections::HashSet;
use std::hash::{Hash, Hasher};

/// What was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Set(String),
    SetNx(String),
    Get,
    Del,
    VDel(String),
}

/// What the store answered: `+OK`, `:n`, a value, nil, or a fencing refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Ok,
    Int(i64),
    Value(String),
    Nil,
    /// `a fencing token is required for this request`.
    FencingRequired,
    /// `the request fencing token is a lower version than the fencing token protecting the resource`.
    FencingLower,
}

/// A fencing token, ordered as the store orders them: (milliseconds, counter). The suite makes
/// every token's pair unique.
pub type Token = (u64, u64);

/// One operation on one key. `returned` is `None` when no answer came. `token` is its `__ft`.
#[derive(Debug, Clone)]
pub struct Op {
    pub invoked: u64,
    pub returned: Option<u64>,
    pub call: Call,
    pub token: Option<Token>,
    pub answer: Option<Answer>,
}

/// A key as the sequential store holds it: its value and the token protecting it (only while
/// it exists: deleting a key discards its token).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct State {
    pub value: Option<String>,
    pub token: Option<Token>,
}

/// The sequential store's answer to `call` with `token` on `state`, and the state after it. SET,
/// DEL and VDEL on a key with a token need one at least as new; a SET that applies keeps the
/// newer token. Reads never need one.
pub fn step(state: &State, call: &Call, token: Option<Token>) -> (Answer, State) {
    let unchanged = state.clone();
    if !matches!(call, Call::Get) {
        match (state.token, token) {
            (Some(_), None) => return (Answer::FencingRequired, unchanged),
            (Some(stored), Some(given)) if given < stored => return (Answer::FencingLower, unchanged),
            _ => {}
        }
    }
    let set = |value: &String| State { value: Some(value.clone()), token: state.token.max(token) };
    match call {
        Call::Set(v) => (Answer::Ok, set(v)),
        Call::SetNx(v) => match &state.value {
            None => (Answer::Ok, set(v)),
            Some(_) => (Answer::Int(-1), unchanged),
        },
        Call::Get => (state.value.clone().map_or(Answer::Nil, Answer::Value), unchanged),
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
/// most `budget` search states.
pub fn check(ops: &[Op], budget: usize) -> Verdict {
    // Reads that got no answer change nothing and constrain nothing.
    let mut ops: Vec<Op> = ops.iter().filter(|op| !(op.answer.is_none() && op.call == Call::Get)).cloned().collect();
    ops.sort_by_key(|op| op.invoked);
    let n = ops.len();
    let words = n.div_ceil(64);
    let required = ops.iter().filter(|op| op.answer.is_some()).count();
    // (linearized set, state) pairs already explored.
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    struct Frame {
        done: Vec<u64>,
        state: State,
        placed: usize,
        /// Every operation before this one is linearized.
        low: usize,
        /// The next candidate to try.
        next: usize,
    }
    let is_done = |done: &[u64], i: usize| done[i / 64] & (1 << (i % 64)) != 0;
    let mut stack = vec![Frame { done: vec![0; words], state: State::default(), placed: 0, low: 0, next: 0 }];
    let mut visited = 0usize;
    let mut deepest = 0usize;
    while let Some(frame) = stack.last_mut() {
        if frame.placed == required {
            return Verdict::Linearizable;
        }
        // An operation may go next only if it was invoked before every remaining answered
        // operation returned.
        let horizon = (frame.low..n)
            .filter(|i| !is_done(&frame.done, *i))
            .filter_map(|i| ops[i].returned.filter(|_| ops[i].answer.is_some()))
            .min()
            .unwrap_or(u64::MAX);
        let mut pushed = None;
        while frame.next < n {
            let i = frame.next;
            frame.next += 1;
            if is_done(&frame.done, i) {
                continue;
            }
            if ops[i].invoked > horizon {
                break;
            }
            let (answer, state) = step(&frame.state, &ops[i].call, ops[i].token);
            if ops[i].answer.as_ref().is_some_and(|given| *given != answer) {
                continue;
            }
            let mut done = frame.done.clone();
            done[i / 64] |= 1 << (i % 64);
            if !seen.insert(fingerprint(&done, &state)) {
                continue;
            }
            let placed = frame.placed + usize::from(ops[i].answer.is_some());
            let mut low = frame.low;
            while low < n && is_done(&done, low) {
                low += 1;
            }
            pushed = Some(Frame { done, state, placed, low, next: low });
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
                stack.pop();
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

fn fingerprint(done: &[u64], state: &State) -> (u64, u64) {
    let hash = |seed: u64| {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        seed.hash(&mut hasher);
        done.hash(&mut hasher);
        state.hash(&mut hasher);
        hasher.finish()
    };
    (hash(1), hash(2))
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
        Call::Set(v.into())
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
            op(13, 14, Call::SetNx("c".into()), Answer::Ok),
            op(15, 16, Call::SetNx("d".into()), Answer::Int(-1)),
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
    fn two_successful_set_nx_without_a_delete_between_are_caught() {
        let history = [op(0, 1, Call::SetNx("a".into()), Answer::Ok), op(2, 3, Call::SetNx("b".into()), Answer::Ok)];
        assert!(matches!(check(&history, BUDGET), Verdict::NotLinearizable(_)));
        let with_delete = [
            op(0, 1, Call::SetNx("a".into()), Answer::Ok),
            op(2, 3, Call::Del, Answer::Int(1)),
            op(4, 5, Call::SetNx("b".into()), Answer::Ok),
        ];
        assert_eq!(check(&with_delete, BUDGET), Verdict::Linearizable);
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
}
