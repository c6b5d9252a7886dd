//! Damage found in a node's storage while it runs (a kept snapshot that no longer reads back):
//! reported once, and the node stops on it as it does on damage found when the storage opens.

use tokio::sync::watch;

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

    #[tokio::test]
    async fn the_first_report_stands_and_is_seen_by_late_followers() {
        let report = DamageReport::default();
        report.report(Damaged("first".into()));
        report.report(Damaged("second".into()));
        assert_eq!(report.found().await.0, "first");
    }
}
