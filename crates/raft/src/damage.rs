//! Damage found in a node's storage while it runs (a kept snapshot that no longer reads back):
//! reported once, and the node stops on it as it does on damage found when the storage opens.

use statestore_statemachine::StorageError;
use tokio::sync::watch;

/// Whether `error` says the storage is damaged: RocksDB's `Corruption` status (a checksum that
/// does not match), or a record that does not decode.
pub fn is_damage(error: &StorageError) -> bool {
    match error {
        StorageError::Backend(text) => text.starts_with("Corruption"),
        StorageError::Corrupt { .. } => true,
    }
}

/// Storage damage: what is damaged and how it was found.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct Damaged(pub String);

/// Where damage is reported and followed. The first report stands; later ones are logged only.
#[derive(Debug)]
pub struct DamageReport {
    found: watch::Sender<Option<Damaged>>,
}

impl Default for DamageReport {
    fn default() -> Self {
        DamageReport { found: watch::Sender::new(None) }
    }
}

impl DamageReport {
    pub fn report(&self, damage: Damaged) {
        tracing::error!(damage = %damage, "damaged storage");
        self.found.send_if_modified(|found| {
            if found.is_some() {
                return false;
            }
            *found = Some(damage);
            true
        });
    }

    /// Completes with the first damage reported (at once if some already was).
    pub async fn found(&self) -> Damaged {
        let mut found = self.found.subscribe();
        let damage = found.wait_for(Option::is_some).await.expect("the sender lives in self");
        damage.clone().expect("waited for Some")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rocksdb_corruption_and_undecodable_records_are_damage() {
        // `db::backend` keeps RocksDB's status text, which starts with the status's name.
        let corruption = "Corruption: block checksum mismatch: stored = 1, computed = 2";
        assert!(is_damage(&StorageError::Backend(corruption.into())));
        assert!(!is_damage(&StorageError::Backend("IO error: No space left on device".into())));
        let table = statestore_statemachine::Table::Keys;
        assert!(is_damage(&StorageError::Corrupt { table, detail: "short record" }));
    }

    #[tokio::test]
    async fn the_first_report_stands_and_is_seen_by_late_followers() {
        let report = DamageReport::default();
        report.report(Damaged("first".into()));
        report.report(Damaged("second".into()));
        assert_eq!(report.found().await.0, "first");
    }
}
