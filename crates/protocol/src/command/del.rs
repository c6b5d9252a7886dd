use serde::{Deserialize, Serialize};

use super::{exact_args, key_arg};
use crate::error::StoreError;
use crate::resp::encode_bulk_array;

/// `DEL key`: `:1` if deleted, `:0` if absent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Del {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
}

impl Del {
    pub(crate) fn parse(args: &[&[u8]]) -> Result<Del, StoreError> {
        let [key] = exact_args(args)?;
        Ok(Del { key: key_arg(key)? })
    }

    pub fn encode(&self) -> Vec<u8> {
        encode_bulk_array::<&[u8]>(&[b"DEL", &self.key])
    }
}
