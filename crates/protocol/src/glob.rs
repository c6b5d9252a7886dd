//! SCAN patterns (PROTOCOL.md §13): a glob matched against the **whole** key.
//!
//! - `*` any sequence of characters (also empty, also `/`), `?` exactly one character;
//! - `[abc]` one of, `[a-z]` a range, `[!abc]` none of; `^` is an ordinary member, not negation;
//! - a `]` right after `[` or `[!` is a member, so `[]]` matches `]`; a metacharacter is escaped
//!   by a class (`[*]`, `[?]`, `[[]`); there is no backslash escape;
//! - an unclosed `[` is an invalid pattern.
//!
//! This is the syntax of the `glob` crate's `Pattern` with `/` given no special meaning, except
//! that `**` is simply two `*` (the `glob` crate restricts it to whole path components).

/// One class member: a character or an inclusive range.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Member {
    Char(char),
    Range(char, char),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Char(char),
    AnyChar,
    AnySequence,
    Class { negated: bool, members: Vec<Member> },
}

/// A compiled SCAN pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    tokens: Vec<Token>,
}

/// The pattern has an unclosed `[`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid pattern: unclosed character class at {position}")]
pub struct InvalidPattern {
    pub position: usize,
}

impl Pattern {
    pub fn new(pattern: &str) -> Result<Pattern, InvalidPattern> {
        let chars: Vec<char> = pattern.chars().collect();
        let mut tokens = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            match chars[i] {
                '?' => tokens.push(Token::AnyChar),
                '*' => {
                    if tokens.last() != Some(&Token::AnySequence) {
                        tokens.push(Token::AnySequence);
                    }
                }
                '[' => {
                    let negated = chars.get(i + 1) == Some(&'!');
                    let first = i + 1 + usize::from(negated);
                    // The first member is taken literally, even `]`; the class ends at the next `]`.
                    let close = chars
                        .get(first + 1..)
                        .and_then(|rest| rest.iter().position(|c| *c == ']'))
                        .filter(|_| first < chars.len())
                        .map(|offset| first + 1 + offset)
                        .ok_or(InvalidPattern { position: i })?;
                    tokens.push(Token::Class { negated, members: parse_members(&chars[first..close]) });
                    i = close;
                }
                c => tokens.push(Token::Char(c)),
            }
            i += 1;
        }
        Ok(Pattern { tokens })
    }

    /// The characters every match must start with: the scan can begin there.
    pub fn literal_prefix(&self) -> String {
        self.tokens
            .iter()
            .map_while(|t| match t {
                Token::Char(c) => Some(*c),
                _ => None,
            })
            .collect()
    }

    /// Whether the whole of `key` matches.
    pub fn matches(&self, key: &str) -> bool {
        let mut unlimited = u64::MAX;
        self.matches_within(key, &mut unlimited).unwrap_or(false)
    }

    /// Whether the whole of `key` matches, taking at most `steps` (one per character compared,
    /// decremented as it goes); `None` when they run out first. A long pattern full of `*` over
    /// long keys costs up to `len(key) * len(pattern)` steps.
    pub fn matches_within(&self, key: &str, steps: &mut u64) -> Option<bool> {
        let key: Vec<char> = key.chars().collect();
        // Every token but `*` consumes exactly one character, so the classic two-pointer
        // algorithm with one backtrack point (the last `*`) is exact and O(len(key) * len(pattern)).
        let (mut t, mut k) = (0, 0);
        let mut backtrack: Option<(usize, usize)> = None;
        while k < key.len() {
            *steps = steps.checked_sub(1)?;
            match self.tokens.get(t) {
                Some(Token::AnySequence) => {
                    backtrack = Some((t, k));
                    t += 1;
                }
                Some(token) if single_matches(token, key[k]) => {
                    t += 1;
                    k += 1;
                }
                _ => match backtrack {
                    Some((star, from)) => {
                        t = star + 1;
                        k = from + 1;
                        backtrack = Some((star, from + 1));
                    }
                    None => return Some(false),
                },
            }
        }
        Some(self.tokens[t..].iter().all(|token| *token == Token::AnySequence))
    }
}

fn parse_members(chars: &[char]) -> Vec<Member> {
    let mut members = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if i + 2 < chars.len() && chars[i + 1] == '-' {
            members.push(Member::Range(chars[i], chars[i + 2]));
            i += 3;
        } else {
            members.push(Member::Char(chars[i]));
            i += 1;
        }
    }
    members
}

fn single_matches(token: &Token, c: char) -> bool {
    match token {
        Token::Char(expected) => *expected == c,
        Token::AnyChar => true,
        Token::AnySequence => false,
        Token::Class { negated, members } => {
            let member = members.iter().any(|m| match m {
                Member::Char(x) => *x == c,
                Member::Range(lo, hi) => *lo <= c && c <= *hi,
            });
            member != *negated
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(pattern: &str, key: &str) -> bool {
        Pattern::new(pattern).unwrap().matches(key)
    }

    #[test]
    fn wildcards_match_the_whole_key() {
        assert!(matches("*", ""));
        assert!(matches("*", "a/b/c"));
        assert!(matches("key*", "key"));
        assert!(matches("key*", "key10"));
        assert!(!matches("key", "key1"));
        assert!(!matches("ey*", "key"));
        assert!(matches("k?y", "kéy"));
        assert!(!matches("k?y", "ky"));
        assert!(matches("a*b*c", "aXXbYYbc"));
        assert!(matches("**", "anything"));
        assert!(matches("a**b", "a/x/b"));
    }

    #[test]
    fn classes_ranges_and_negation() {
        assert!(matches("key[12]", "key1"));
        assert!(!matches("key[12]", "key3"));
        assert!(matches("key[0-9]", "key7"));
        assert!(matches("key[!0-9]", "keyx"));
        assert!(!matches("key[!0-9]", "key7"));
        assert!(matches("[^a]", "^"), "^ is a member, not negation");
        assert!(!matches("[^a]", "b"));
        assert!(matches("[]]", "]"));
        assert!(matches("[!]]", "a"));
        assert!(matches("[*]", "*"));
        assert!(!matches("[*]", "x"));
        assert!(matches("[?]", "?"));
        assert!(matches("[[]", "["));
        assert!(matches("[a-]", "-"));
        assert!(!matches("[z-a]", "m"), "a reversed range is empty");
    }

    #[test]
    fn unclosed_classes_are_invalid() {
        for bad in ["[", "[a", "[!", "[!]", "[]", "ab[cd"] {
            assert!(Pattern::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn literal_prefix_stops_at_the_first_metacharacter() {
        assert_eq!(Pattern::new("user/*").unwrap().literal_prefix(), "user/");
        assert_eq!(Pattern::new("a?c").unwrap().literal_prefix(), "a");
        assert_eq!(Pattern::new("[a]bc").unwrap().literal_prefix(), "");
        assert_eq!(Pattern::new("exact").unwrap().literal_prefix(), "exact");
    }
}
