//! SCAN (PROTOCOL.md §13): pages of the live, UTF-8 keys matching a glob, in key order.
//!
//! The continuation token is the last key the page examined; the next page starts after it.
//! A scan confined to a client's key prefixes ([`KeyPrefixes`]) examines only keys under them,
//! so its token never names a key the client may not see.
//! Consistency across pages: each page is one consistent read; a key present and matching for
//! the whole scan is returned exactly once; keys created or deleted during the scan may or may
//! not appear.

use std::sync::Arc;

use serde_bytes::ByteBuf;
use statestore_protocol::glob::Pattern;
use statestore_protocol::{Response, Scan, StoreError};

use crate::keyspace::KeyRecord;
use crate::storage::{StorageError, StorageRead, Table};

/// Page bounds of SCAN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanLimits {
    /// At most this many keys per page.
    pub page_keys: usize,
    /// A page ends once its keys add up to this many bytes.
    pub page_bytes: usize,
    /// A page ends after examining this many stored keys, matching or not, so a sparse pattern
    /// over a large store cannot make one request arbitrarily slow.
    pub examine: usize,
    /// A page ends before the key whose matching would take its character comparisons past
    /// this many, so a long pattern full of `*` over long keys cannot either. The first key of
    /// a page is always decided, so every page makes progress.
    pub match_steps: u64,
}

impl Default for ScanLimits {
    fn default() -> Self {
        ScanLimits { page_keys: 100, page_bytes: 256 * 1024, examine: 10_000, match_steps: 4_000_000 }
    }
}

const BATCH: usize = 128;

/// The key prefixes one client may use: a key is allowed when it starts with one of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPrefixes(Arc<[Box<[u8]>]>);

impl KeyPrefixes {
    pub fn new(prefixes: impl IntoIterator<Item = Box<[u8]>>) -> KeyPrefixes {
        KeyPrefixes(prefixes.into_iter().collect())
    }

    pub fn allows(&self, key: &[u8]) -> bool {
        self.0.iter().any(|prefix| key.starts_with(prefix))
    }

    /// The key ranges, as prefixes in key order and disjoint, that hold every key starting
    /// with `prefix` that these prefixes allow.
    fn confine(&self, prefix: &[u8]) -> Vec<Vec<u8>> {
        let mut ranges: Vec<Vec<u8>> = self
            .0
            .iter()
            .filter_map(|allowed| {
                if allowed.starts_with(prefix) {
                    Some(allowed.to_vec())
                } else if prefix.starts_with(allowed) {
                    Some(prefix.to_vec())
                } else {
                    None
                }
            })
            .collect();
        ranges.sort();
        // In key order a range follows any range it lies within: keep the outer one.
        ranges.dedup_by(|inner, outer| inner.starts_with(outer));
        ranges
    }
}

/// A SCAN page over every key (`within` none) or over the keys `within` allows.
pub(crate) fn scan(
    store: &(impl StorageRead + ?Sized),
    scan: &Scan,
    now: u64,
    limits: ScanLimits,
    within: Option<&KeyPrefixes>,
) -> Result<Response, StorageError> {
    let page = |keys: Vec<Vec<u8>>, token: Option<Vec<u8>>| Response::Keys {
        keys: keys.into_iter().map(ByteBuf::from).collect(),
        token: token.map(ByteBuf::from),
    };
    // A pattern that is not UTF-8 matches nothing (keys that are not UTF-8 are never listed);
    // neither does an empty one (keys are never empty).
    let Ok(pattern) = std::str::from_utf8(&scan.pattern) else {
        return Ok(page(Vec::new(), None));
    };
    if pattern.is_empty() {
        return Ok(page(Vec::new(), None));
    }
    let Ok(pattern) = Pattern::new(pattern) else {
        return Ok(Response::Error(StoreError::SyntaxError));
    };
    let prefix = pattern.literal_prefix().into_bytes();
    let ranges = match within {
        Some(allowed) => allowed.confine(&prefix),
        None => vec![prefix],
    };
    let mut cursor = scan.token.as_ref().map(|t| t.to_vec());
    let (mut keys, mut bytes, mut examined) = (Vec::new(), 0usize, 0usize);
    let mut steps = limits.match_steps;
    for (at, range) in ranges.iter().enumerate() {
        loop {
            let batch = store.scan(Table::Keys, range, cursor.as_deref(), BATCH)?;
            let exhausted = batch.len() < BATCH;
            for (key, record) in batch {
                examined += 1;
                let matched = match std::str::from_utf8(&key) {
                    Ok(text) if KeyRecord::decode(&record)?.is_live(now) => {
                        let mut budget = if examined == 1 { u64::MAX } else { steps };
                        let Some(matched) = pattern.matches_within(text, &mut budget) else {
                            // Out of steps: the page ends before this key, which the next page decides.
                            return Ok(page(keys, cursor));
                        };
                        steps = if examined == 1 { steps.saturating_sub(u64::MAX - budget) } else { budget };
                        matched
                    }
                    _ => false,
                };
                if matched {
                    bytes += key.len();
                    keys.push(key.clone());
                }
                cursor = Some(key);
                if keys.len() >= limits.page_keys || bytes >= limits.page_bytes || examined >= limits.examine {
                    let mut more = false;
                    for range in &ranges[at..] {
                        if !store.scan(Table::Keys, range, cursor.as_deref(), 1)?.is_empty() {
                            more = true;
                            break;
                        }
                    }
                    return Ok(page(keys, cursor.filter(|_| more)));
                }
            }
            if exhausted {
                break;
            }
        }
    }
    Ok(page(keys, None))
}
