//! The commands of the protocol, one type each, with the exact grammar they accept
//! (`parse`, for the server) and the bytes the SDKs send (`encode`, for clients).
//!
//! Verbs and options are matched in upper case only, as the protocol page requires: `set`
//! is an unknown command and `nx` a syntax error.

mod del;
mod get;
mod keynotify;
mod scan;
mod set;
mod vdel;

pub use del::Del;
pub use get::Get;
pub use keynotify::KeyNotify;
pub use scan::Scan;
pub use set::{Set, SetCondition};
pub use vdel::VDel;

use serde::{Deserialize, Serialize};

use crate::error::StoreError;
use crate::resp::parse_request_frame;

/// One parsed request payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    Set(Set),
    Get(Get),
    Del(Del),
    VDel(VDel),
    KeyNotify(KeyNotify),
    Scan(Scan),
}

impl Command {
    /// Parses a request payload. Order of checks: RESP framing (`syntax error`), verb
    /// (`unknown command`), arity (`wrong number of arguments`), empty key (`the key length is
    /// zero`), options (`syntax error`).
    pub fn parse(payload: &[u8]) -> Result<Command, StoreError> {
        let items = parse_request_frame(payload).ok_or(StoreError::SyntaxError)?;
        let (verb, args) = items.split_first().ok_or(StoreError::SyntaxError)?;
        match *verb {
            b"SET" => Set::parse(args).map(Command::Set),
            b"GET" => Get::parse(args).map(Command::Get),
            b"DEL" => Del::parse(args).map(Command::Del),
            b"VDEL" => VDel::parse(args).map(Command::VDel),
            b"KEYNOTIFY" => KeyNotify::parse(args).map(Command::KeyNotify),
            b"SCAN" => Scan::parse(args).map(Command::Scan),
            _ => Err(StoreError::UnknownCommand),
        }
    }

    /// The request payload, byte-for-byte as the SDKs build it.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Command::Set(c) => c.encode(),
            Command::Get(c) => c.encode(),
            Command::Del(c) => c.encode(),
            Command::VDel(c) => c.encode(),
            Command::KeyNotify(c) => c.encode(),
            Command::Scan(c) => c.encode(),
        }
    }

    /// Bytes of keys, values and patterns the command carries: what it costs to log and send.
    pub fn data_len(&self) -> usize {
        match self {
            Command::Set(c) => c.key.len() + c.value.len(),
            Command::Get(c) => c.key.len(),
            Command::Del(c) => c.key.len(),
            Command::VDel(c) => c.key.len() + c.value.len(),
            Command::KeyNotify(c) => c.key.len(),
            Command::Scan(c) => c.pattern.len() + c.token.as_ref().map_or(0, |t| t.len()),
        }
    }

    /// The verb, for logs and metric labels.
    pub fn verb(&self) -> &'static str {
        match self {
            Command::Set(_) => "SET",
            Command::Get(_) => "GET",
            Command::Del(_) => "DEL",
            Command::VDel(_) => "VDEL",
            Command::KeyNotify(c) if c.stop => "KEYNOTIFY STOP",
            Command::KeyNotify(_) => "KEYNOTIFY",
            Command::Scan(_) => "SCAN",
        }
    }

    /// The key the command is about (SCAN has none).
    pub fn key(&self) -> Option<&[u8]> {
        match self {
            Command::Set(c) => Some(&c.key),
            Command::Get(c) => Some(&c.key),
            Command::Del(c) => Some(&c.key),
            Command::VDel(c) => Some(&c.key),
            Command::KeyNotify(c) => Some(&c.key),
            Command::Scan(_) => None,
        }
    }

    /// GET and SCAN only read; everything else changes replicated state.
    pub fn is_read(&self) -> bool {
        matches!(self, Command::Get(_) | Command::Scan(_))
    }

    /// SET, DEL and VDEL are checked against a key's fencing token (§11).
    pub fn is_fenced(&self) -> bool {
        matches!(self, Command::Set(_) | Command::Del(_) | Command::VDel(_))
    }
}

/// A non-empty key, or `the key length is zero`.
pub(crate) fn key_arg(key: &[u8]) -> Result<Vec<u8>, StoreError> {
    if key.is_empty() {
        return Err(StoreError::KeyLengthZero);
    }
    Ok(key.to_vec())
}

/// `args` must hold exactly `N` items.
pub(crate) fn exact_args<'a, const N: usize>(args: &[&'a [u8]]) -> Result<[&'a [u8]; N], StoreError> {
    <[&[u8]; N]>::try_from(args).map_err(|_| StoreError::WrongNumberOfArguments)
}

#[cfg(test)]
mod tests;
