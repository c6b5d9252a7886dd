//! The MQTT broker state store protocol, with no network I/O and no async.
//!
//! # Layout
//! - [`command`]: one type per command (`SET`, `GET`, `DEL`, `VDEL`, `KEYNOTIFY`, `SCAN`) with its
//!   exact grammar (`parse`) and the bytes the SDKs send (`encode`).
//! - [`request`]: a command plus its `__ts` and `__ft` properties, and the clock-skew check.
//! - [`response`]: the reply payloads of PROTOCOL.md §7.1 and the SCAN pages of §13.
//! - [`notification`]: `NOTIFY SET VALUE v` and `NOTIFY DELETE`.
//! - [`error`]: [`StoreError`], the single source of every `-ERR` text.
//! - [`hlc`]: hybrid logical clocks (versions, `__ts`, fencing tokens).
//! - [`topic`]: request, response and notification topics.
//! - [`property`]: the names of the MQTT user properties.
//! - [`glob`]: the SCAN pattern language.
//! - [`backup`]: the backup file of a cluster's keys (`snapshot save` / `restore`).
//! - `resp` (private): RESP3 framing shared by all of the above.

pub mod backup;
pub mod command;
pub mod error;
pub mod glob;
pub mod hlc;
pub mod notification;
pub mod property;
pub mod request;
mod resp;
pub mod response;
pub mod topic;

pub use command::{Command, Del, Get, KeyNotify, Scan, Set, SetCondition, VDel};
pub use error::StoreError;
pub use hlc::{Hlc, HlcError, MAX_CLOCK_DRIFT_MS};
pub use notification::Notification;
pub use request::Request;
pub use resp::encode_bulk_array;
pub use response::{MalformedReply, Response};
