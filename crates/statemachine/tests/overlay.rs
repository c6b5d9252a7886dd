//! The read-your-writes overlay agrees with applying its writes first and reading afterwards,
//! for every point lookup and prefix scan (any prefix, cursor and page size).

use std::collections::BTreeMap;

use proptest::prelude::*;
use statestore_statemachine::{Batch, MemStorage, Overlay, Storage, StorageRead, Table, Txn};

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(0u8..4, 0..4)
}

fn table() -> impl Strategy<Value = Table> {
    prop::sample::select(vec![Table::Keys, Table::Expiry, Table::Meta])
}

/// `default_cases` cases, or `PROPTEST_CASES` when set.
fn config(default_cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(default_cases);
    ProptestConfig { cases, ..ProptestConfig::default() }
}

proptest! {
    #![proptest_config(config(1000))]

    #[test]
    fn overlay_scans_equal_committed_scans(
        base in prop::collection::vec((table(), key(), key()), 0..40),
        writes in prop::collection::vec((table(), key(), prop::option::of(key())), 0..40),
        scans in prop::collection::vec((table(), key(), prop::option::of(key()), 1usize..6), 1..10),
    ) {
        let mut storage = MemStorage::new();
        storage
            .write(Batch { writes: base.into_iter().map(|(t, k, v)| (t, k, Some(v))).collect() })
            .unwrap();
        let mut committed = storage.clone();
        let mut overlay = Overlay::new(&storage);
        let mut reference: BTreeMap<(Table, Vec<u8>), Option<Vec<u8>>> = BTreeMap::new();
        for (table, key, value) in writes {
            match &value {
                Some(v) => overlay.put(table, key.clone(), v.clone()),
                None => overlay.delete(table, key.clone()),
            }
            reference.insert((table, key), value);
        }
        committed
            .write(Batch { writes: reference.into_iter().map(|((t, k), v)| (t, k, v)).collect() })
            .unwrap();
        for (table, prefix, after, limit) in scans {
            let expected = committed.scan(table, &prefix, after.as_deref(), limit).unwrap();
            prop_assert_eq!(overlay.scan(table, &prefix, after.as_deref(), limit).unwrap(), expected);
            prop_assert_eq!(overlay.get(table, &prefix).unwrap(), committed.get(table, &prefix).unwrap());
        }
        let batch = overlay.into_batch();
        storage.write(batch).unwrap();
        prop_assert_eq!(storage, committed);
    }
}

/// One step of a transaction: a point read, a write or a delete.
#[derive(Debug, Clone)]
enum Step {
    Get(Table, Vec<u8>),
    Put(Table, Vec<u8>, Vec<u8>),
    Delete(Table, Vec<u8>),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (table(), key()).prop_map(|(t, k)| Step::Get(t, k)),
        (table(), key(), key()).prop_map(|(t, k, v)| Step::Put(t, k, v)),
        (table(), key()).prop_map(|(t, k)| Step::Delete(t, k)),
    ]
}

proptest! {
    #![proptest_config(config(1000))]

    /// Reads between writes (the overlay keeps what it read of the meta table) see every
    /// earlier write of the transaction and nothing else.
    #[test]
    fn reads_between_writes_see_exactly_the_earlier_writes(
        base in prop::collection::vec((table(), key(), key()), 0..40),
        steps in prop::collection::vec(step(), 1..60),
    ) {
        let mut storage = MemStorage::new();
        storage
            .write(Batch { writes: base.into_iter().map(|(t, k, v)| (t, k, Some(v))).collect() })
            .unwrap();
        let mut reference = storage.clone();
        let mut overlay = Overlay::new(&storage);
        for step in steps {
            match step {
                Step::Get(table, key) => {
                    prop_assert_eq!(overlay.get(table, &key).unwrap(), reference.get(table, &key).unwrap());
                }
                Step::Put(table, key, value) => {
                    overlay.put(table, key.clone(), value.clone());
                    reference.write(Batch { writes: vec![(table, key, Some(value))] }).unwrap();
                }
                Step::Delete(table, key) => {
                    overlay.delete(table, key.clone());
                    reference.write(Batch { writes: vec![(table, key, None)] }).unwrap();
                }
            }
        }
        let batch = overlay.into_batch();
        storage.write(batch).unwrap();
        prop_assert_eq!(storage, reference);
    }
}
