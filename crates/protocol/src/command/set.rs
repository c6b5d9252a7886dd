use serde::{Deserialize, Serialize};

use super::key_arg;
use crate::error::StoreError;
use crate::resp::encode_bulk_array;
use crate::resp::parse_u64;

/// The condition of a SET.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum SetCondition {
    /// Plain SET: unconditional upsert.
    #[default]
    Always,
    /// `NX`: only if the key is absent (or expired).
    NotExists,
    /// `NEX`: only if the key is absent or its value equals the new value (lease renewal).
    NotExistsOrEqual,
}

/// `SET key value [NX|NEX] [PX milliseconds]`, options in any order, each at most once.
///
/// `PX` takes a non-negative decimal integer (leading zeros allowed). `PX 0` is accepted: the
/// key is written and expires at once, exactly as `ms` after the SET says (the Go SDK sends
/// `PX 0` for a sub-millisecond expiry). A sign, a fraction (`1500.5`, which .NET can send), a
/// value beyond `u64`, a missing value, an unknown, repeated or conflicting option: `syntax error`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Set {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    pub condition: SetCondition,
    /// `PX`: time to live in milliseconds.
    pub expiry_ms: Option<u64>,
}

impl Set {
    pub fn new(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Set {
        Set { key: key.into(), value: value.into(), condition: SetCondition::Always, expiry_ms: None }
    }

    pub(crate) fn parse(args: &[&[u8]]) -> Result<Set, StoreError> {
        let [key, value, options @ ..] = args else {
            return Err(StoreError::WrongNumberOfArguments);
        };
        let mut set = Set::new(key_arg(key)?, value.to_vec());
        let mut has_condition = false;
        let mut options = options.iter();
        while let Some(option) = options.next() {
            match *option {
                b"NX" | b"NEX" if !has_condition => {
                    has_condition = true;
                    set.condition =
                        if *option == b"NX" { SetCondition::NotExists } else { SetCondition::NotExistsOrEqual };
                }
                b"PX" if set.expiry_ms.is_none() => {
                    let ms = options.next().ok_or(StoreError::SyntaxError)?;
                    set.expiry_ms = Some(parse_u64(ms).ok_or(StoreError::SyntaxError)?);
                }
                _ => return Err(StoreError::SyntaxError),
            }
        }
        Ok(set)
    }

    /// The SDK order: condition before PX.
    pub fn encode(&self) -> Vec<u8> {
        let px = self.expiry_ms.map(|ms| ms.to_string());
        let mut items: Vec<&[u8]> = vec![b"SET", &self.key, &self.value];
        match self.condition {
            SetCondition::Always => {}
            SetCondition::NotExists => items.push(b"NX"),
            SetCondition::NotExistsOrEqual => items.push(b"NEX"),
        }
        if let Some(px) = &px {
            items.push(b"PX");
            items.push(px.as_bytes());
        }
        encode_bulk_array::<&[u8]>(&items)
    }
}
