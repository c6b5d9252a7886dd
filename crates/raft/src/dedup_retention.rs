//! Dropping expired dedup records while RocksDB compacts, instead of deleting them in the
//! state machine.
//!
//! The state machine never deletes a dedup record: a lookup ignores one whose retention ended at
//! the replicated clock (`dedup::expired`). So a record may go whenever the storage likes, as
//! long as it was expired at a time every reader has passed: the compaction filter drops records
//! expired at the [`DedupHorizon`]. Without it, each apply deleted what had expired, leaving two
//! tombstones per request that compactions carried for minutes.
//!
//! The horizon is the clock of the applied state on disk ([`AppliedOnDisk::clock`]), not the
//! applied clock: a node killed comes back with its tables as the last flush wrote them and
//! applies the log again from there, and each entry it applies again must find every record
//! that entry found the first time, or the node would run a retried request again that the
//! others answered from the dedup table. It is held back further to the clock of any RocksDB
//! snapshot still being read (a snapshot build): compactions do not spare records a RocksDB
//! snapshot still sees, and a built snapshot must hold every record retained at its own clock.

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::sync::{Arc, Mutex};

use rocksdb::compaction_filter::{CompactionFilter, Decision};
use rocksdb::compaction_filter_factory::{CompactionFilterContext, CompactionFilterFactory};
use statestore_statemachine::dedup;

use crate::db::AppliedOnDisk;

/// Up to which replicated time expired dedup records may be dropped.
#[derive(Debug)]
pub struct DedupHorizon {
    /// How far the applied state is on disk; its clock never moves back.
    on_disk: Arc<AppliedOnDisk>,
    /// Clocks of the views being read, with how many views hold each.
    pinned: Mutex<BTreeMap<u64, usize>>,
}

/// A horizon over a state with nothing on disk yet.
impl Default for DedupHorizon {
    fn default() -> Self {
        DedupHorizon::new(Arc::default())
    }
}

impl DedupHorizon {
    pub fn new(on_disk: Arc<AppliedOnDisk>) -> Self {
        DedupHorizon { on_disk, pinned: Mutex::default() }
    }

    /// Holds the horizon at the current clock on disk until the guard is dropped. Pin before
    /// taking the view to protect: the view's clock is then at least the pinned one.
    pub fn pin(self: &Arc<Self>) -> Pin {
        let clock = self.on_disk.clock();
        *self.pinned.lock().expect("dedup horizon lock").entry(clock).or_default() += 1;
        Pin { horizon: self.clone(), clock }
    }

    /// The time up to which records may be dropped now. The clock on disk is read before the
    /// pins: a view pinned after that read was taken after it too, so its clock is not lower.
    pub fn now(&self) -> u64 {
        let on_disk = self.on_disk.clock();
        let pinned = self.pinned.lock().expect("dedup horizon lock").keys().next().copied();
        pinned.map_or(on_disk, |pinned| pinned.min(on_disk))
    }
}

/// Holds a [`DedupHorizon`] back while a view is read.
pub struct Pin {
    horizon: Arc<DedupHorizon>,
    clock: u64,
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut pinned = self.horizon.pinned.lock().expect("dedup horizon lock");
        if let Some(count) = pinned.get_mut(&self.clock) {
            *count -= 1;
            if *count == 0 {
                pinned.remove(&self.clock);
            }
        }
    }
}

/// Makes one [`ExpiredDedupFilter`] per compaction of the dedup table.
pub struct ExpiredDedupFilterFactory {
    horizon: Arc<DedupHorizon>,
}

impl ExpiredDedupFilterFactory {
    pub fn new(horizon: Arc<DedupHorizon>) -> Self {
        ExpiredDedupFilterFactory { horizon }
    }
}

const FILTER_NAME: &CStr = c"statestore-expired-dedup";

impl CompactionFilterFactory for ExpiredDedupFilterFactory {
    type Filter = ExpiredDedupFilter;

    fn create(&mut self, _context: CompactionFilterContext) -> ExpiredDedupFilter {
        ExpiredDedupFilter { now: self.horizon.now(), dropped: 0 }
    }

    fn name(&self) -> &CStr {
        FILTER_NAME
    }
}

/// Drops the dedup records one compaction meets that expired at the horizon it started with.
pub struct ExpiredDedupFilter {
    now: u64,
    dropped: u64,
}

impl CompactionFilter for ExpiredDedupFilter {
    fn filter(&mut self, _level: u32, _key: &[u8], value: &[u8]) -> Decision {
        if dedup::expired(value, self.now) {
            self.dropped += 1;
            Decision::Remove
        } else {
            Decision::Keep
        }
    }

    fn name(&self) -> &CStr {
        FILTER_NAME
    }
}

impl Drop for ExpiredDedupFilter {
    fn drop(&mut self) {
        if self.dropped > 0 {
            tracing::debug!(dropped = self.dropped, horizon = self.now, "compaction dropped expired dedup records");
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use rocksdb::{BottommostLevelCompaction, CompactOptions, WriteBatch, DB};
    use statestore_protocol::{Hlc, Request, Set};
    use statestore_statemachine::{ClientRequest, Entry, Operation, Overlay, RequestIdentity, StateMachine, Table};

    use super::*;
    use crate::db::{self, add_to, cf, Tables};

    const T0: u64 = 1_800_000_000_000;

    /// Applies a SET with a dedup identity at `wall_clock_ms`, as the state store does.
    fn apply_set(db: &DB, machine: &StateMachine, n: u8, wall_clock_ms: u64) {
        let tables = Tables { db };
        let mut overlay = Overlay::new(&tables);
        let timestamp = Hlc::new(wall_clock_ms, 0, "c").to_string();
        let request = Request::parse(&Set::new("k", "v").encode(), Some(&timestamp), None).unwrap();
        let operation = Operation::Request(ClientRequest {
            request,
            client_id: Some("c".into()),
            identity: Some(identity(n)),
            message_expiry_secs: Some(10),
        });
        machine.apply(&mut overlay, &Entry { operation, wall_clock_ms }).unwrap();
        let mut batch = WriteBatch::default();
        add_to(&mut batch, db, overlay.into_batch());
        db.write(batch).unwrap();
    }

    /// The identity of request `n` of one client, for tests across the crate.
    pub(crate) fn identity(n: u8) -> RequestIdentity {
        RequestIdentity { response_topic: "clients/c/response".into(), correlation_data: vec![n] }
    }

    /// Flushes and rewrites the whole dedup table, so the filter sees every record.
    fn compact(db: &DB) -> usize {
        let dedup = cf(db, Table::Dedup.name());
        db.flush_cf(dedup).unwrap();
        let mut options = CompactOptions::default();
        options.set_bottommost_level_compaction(BottommostLevelCompaction::Force);
        db.compact_range_cf_opt(dedup, None::<&[u8]>, None::<&[u8]>, &options);
        db.iterator_cf(dedup, rocksdb::IteratorMode::Start).count()
    }

    #[test]
    fn compactions_drop_records_expired_at_the_horizon_and_spare_pinned_views() {
        let dir = tempfile::tempdir().unwrap();
        let on_disk = Arc::new(AppliedOnDisk::default());
        let horizon = Arc::new(DedupHorizon::new(on_disk.clone()));
        let db = db::open(dir.path(), &horizon).unwrap();
        let machine = StateMachine::new(Default::default());
        // Retained for the message expiry (10 s) plus the grace (60 s).
        apply_set(&db, &machine, 1, T0);
        apply_set(&db, &machine, 2, T0 + 1_000);
        let retained = 70_000;

        on_disk.reached(0, T0 + retained - 1, 0);
        assert_eq!(compact(&db), 2, "nothing expired yet");
        on_disk.reached(0, T0 + retained, 0);
        let pin = horizon.pin();
        on_disk.reached(0, T0 + retained + 5_000, 0);
        assert_eq!(horizon.now(), T0 + retained, "held at the pinned clock");
        assert_eq!(compact(&db), 1, "only what expired at the pinned clock goes");
        drop(pin);
        assert_eq!(horizon.now(), T0 + retained + 5_000);
        assert_eq!(compact(&db), 0);
        on_disk.reached(0, T0, 0);
        assert_eq!(horizon.now(), T0 + retained + 5_000, "the horizon never moves back");
    }
}
