use serde::{Deserialize, Serialize};

use super::{exact_args, key_arg};
use crate::error::StoreError;
use crate::resp::encode_bulk_array;

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
        encode_bulk_array::<&[u8]>(&[b"GET", &self.key])
    }
}
