use serde::{Deserialize, Serialize};

use super::key_arg;
use crate::error::StoreError;
use crate::resp::encode_bulk_array;

/// `KEYNOTIFY key [STOP]`: register (or with `STOP` remove) the requesting client's
/// notifications for `key`. The key need not exist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyNotify {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    pub stop: bool,
}

impl KeyNotify {
    pub(crate) fn parse(args: &[&[u8]]) -> Result<KeyNotify, StoreError> {
        let (key, stop) = match args {
            [key] => (key, false),
            [key, b"STOP"] => (key, true),
            [_, _] => return Err(StoreError::SyntaxError),
            _ => return Err(StoreError::WrongNumberOfArguments),
        };
        Ok(KeyNotify { key: key_arg(key)?, stop })
    }

    pub fn encode(&self) -> Vec<u8> {
        if self.stop {
            encode_bulk_array::<&[u8]>(&[b"KEYNOTIFY", &self.key, b"STOP"])
        } else {
            encode_bulk_array::<&[u8]>(&[b"KEYNOTIFY", &self.key])
        }
    }
}
