//! The byte encoding of log entries, Raft metadata and Raft RPC bodies: bincode 2 over serde.

use serde::de::DeserializeOwned;
use serde::Serialize;

pub use bincode::error::{DecodeError, EncodeError};

/// The content type of Raft RPC bodies.
pub const CONTENT_TYPE: &str = "application/x-statestore-bincode";

pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, EncodeError> {
    bincode::serde::encode_to_vec(value, bincode::config::standard())
}

/// Decodes exactly one value: trailing bytes are an error.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    let (value, used) = bincode::serde::decode_from_slice(bytes, bincode::config::standard())?;
    if used != bytes.len() {
        return Err(DecodeError::OtherString(format!("{} trailing bytes", bytes.len() - used)));
    }
    Ok(value)
}
