//! The deterministic state machine of the state store.
//!
//! Apply reads only the log entry and the stored state, never a clock or a random source, so
//! every replica that applies the same log reaches the same state and the same replies.
//!
//! # Layout
//! - [`entry`]: what goes into the log ([`Proposal`] of [`Entry`], [`Operation`]) and what applying yields
//!   ([`Applied`], [`Reply`], [`KeyNotification`]).
//! - [`machine`]: [`StateMachine`], the semantics of every command, and the read path.
//! - [`storage`]: the storage trait ([`StorageRead`], [`Txn`], [`Storage`]), the read-your-writes
//!   [`Overlay`] and the in-memory [`MemStorage`].
//! - [`keyspace`]: key records, the expiry index and usage counters.
//! - [`watch`]: KEYNOTIFY registrations and the notification outbox.
//! - [`dedup`]: the replicated dedup table.
//! - [`scan`]: SCAN pages.
//! - [`meta`]: the state-machine clock, the last issued version, counters.
//! - `codec` (private): byte layouts of records and index keys.

mod codec;
pub mod dedup;
pub mod entry;
pub mod keyspace;
pub mod machine;
pub mod meta;
pub mod scan;
pub mod storage;
pub mod watch;

pub use entry::{
    Applied, ClientRequest, Entry, KeyNotification, Operation, OutboxEntry, Proposal, Reply, RequestIdentity,
};
pub use keyspace::{DueKey, KeyRecord};
pub use machine::{Config, RestoreRefusal, StateMachine};
pub use meta::VERSION_NODE_ID;
pub use scan::{KeyPrefixes, ScanLimits};
pub use storage::{Batch, MemStorage, Overlay, Storage, StorageError, StorageRead, Table, Txn};
pub use watch::RegistrationLimits;
