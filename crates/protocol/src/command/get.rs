use serde::{Deserialize, Serialize};

use super::{encode_items, exact_args, key_arg};
use crate::error::StoreError;

/// `GET key`: the value and its version, or nil.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Get {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
}

impl Get {
    pub(crate) fn parse(args: &[&[u8]]) -> Result<Get, StoreError> {
        let [key] = exact_args(args)?;
        Ok(Get { key: key_arg(key)? })
    }

    pub fn encode(&self) -> Vec<u8> {
        encode_items(&[b"GET", &self.key])
    }
}
