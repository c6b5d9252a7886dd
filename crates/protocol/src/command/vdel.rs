use serde::{Deserialize, Serialize};

use super::{exact_args, key_arg};
use crate::error::StoreError;
use crate::resp::encode_bulk_array;

/// `VDEL key value`: delete only if the stored value equals `value` byte-for-byte.
/// `:1` deleted, `:0` absent, `:-1` present with another value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VDel {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
}

impl VDel {
    pub(crate) fn parse(args: &[&[u8]]) -> Result<VDel, StoreError> {
        let [key, value] = exact_args(args)?;
        Ok(VDel { key: key_arg(key)?, value: value.to_vec() })
    }

    pub fn encode(&self) -> Vec<u8> {
        encode_bulk_array::<&[u8]>(&[b"VDEL", &self.key, &self.value])
    }
}
