//! openraft's own storage test suite against the RocksDB log and state-machine stores.

use openraft::testing::{StoreBuilder, Suite};
use statestore_raft::types::RaftStorageError;
use statestore_raft::{open, LogStore, StateStore, StorageMetrics, TypeConfig};
use statestore_statemachine::Config;
use tempfile::TempDir;

struct RocksBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateStore, TempDir> for RocksBuilder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateStore), RaftStorageError> {
        let dir = TempDir::new().expect("temp dir");
        let storage = open(dir.path(), Config::default(), StorageMetrics::new().unwrap()).expect("open storage");
        Ok((dir, storage.log, storage.state))
    }
}

#[test]
fn openraft_storage_suite() {
    Suite::test_all(RocksBuilder).unwrap();
}
