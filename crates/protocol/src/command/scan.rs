use serde::{Deserialize, Serialize};

use crate::error::StoreError;
use crate::resp::encode_bulk_array;

/// `SCAN pattern [token]`: one page of the keys matching a glob pattern (PROTOCOL.md §13).
/// The token is the opaque continuation the previous page returned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scan {
    #[serde(with = "serde_bytes")]
    pub pattern: Vec<u8>,
    pub token: Option<serde_bytes::ByteBuf>,
}

impl Scan {
    pub(crate) fn parse(args: &[&[u8]]) -> Result<Scan, StoreError> {
        match args {
            [pattern] => Ok(Scan { pattern: pattern.to_vec(), token: None }),
            [pattern, token] => {
                Ok(Scan { pattern: pattern.to_vec(), token: Some(serde_bytes::ByteBuf::from(token.to_vec())) })
            }
            _ => Err(StoreError::WrongNumberOfArguments),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        match &self.token {
            Some(token) => encode_bulk_array::<&[u8]>(&[b"SCAN", &self.pattern, token]),
            None => encode_bulk_array::<&[u8]>(&[b"SCAN", &self.pattern]),
        }
    }
}
