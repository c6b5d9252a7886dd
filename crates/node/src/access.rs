//! Per-client key authorization: which key prefixes each MQTT client may read, write and watch.
//!
//! A client is named by the `{client}` segment of its response topic (`clients/<id>/` by
//! default, `--response-topics`): the one part of a request the broker can tie to the publisher
//! (a Mosquitto ACL `pattern read clients/%c/#` lets a client receive only the answers addressed
//! to its own id). The segment matches an entry
//! by its id, or by the upper-case hex of its id (the Go SDK's response topics). A client that is
//! not listed gets the prefixes of the `"*"` entry, or none.
//!
//! The map is read from a TOML file (`--authorization-file`):
//!
//! ```toml
//! [clients]
//! "thermostat-1" = ["home/thermostat-1/", "home/shared/"]
//! "dashboard" = [""]   # every key
//! "*" = ["public/"]    # everyone else
//! ```
//!
//! Every node of a cluster must load the same file: the leader decides.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::Deserialize;
use statestore_protocol::topic::hex_upper;

/// The key prefixes of one client; a key is allowed when it starts with one of them.
pub use statestore_statemachine::KeyPrefixes as Prefixes;

/// The authorization map; see the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyAccess {
    /// By response-topic segment: each listed id, and the hex form of each.
    by_segment: HashMap<String, Prefixes>,
    /// For clients not listed.
    others: Prefixes,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AccessFile {
    clients: BTreeMap<String, Vec<String>>,
}

impl KeyAccess {
    /// Reads the map from a TOML file.
    pub fn from_file(path: &Path) -> Result<KeyAccess, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        KeyAccess::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses the map from TOML text.
    pub fn parse(text: &str) -> Result<KeyAccess, String> {
        let file: AccessFile = toml::from_str(text).map_err(|e| e.message().to_string())?;
        let prefixes = |list: &[String]| Prefixes::new(list.iter().map(|prefix| prefix.as_bytes().into()));
        let mut by_segment = HashMap::new();
        let mut others = Prefixes::new([]);
        for (id, list) in &file.clients {
            if id == "*" {
                others = prefixes(list);
                continue;
            }
            if id.is_empty() || id.contains(['/', '+', '#']) {
                return Err(format!("{id:?} cannot be an MQTT client id in a response topic"));
            }
            by_segment.insert(id.clone(), prefixes(list));
        }
        // Hex forms last, and only where no listed id reads the same: a raw id wins, but two
        // clients that would share a segment make the file ambiguous.
        for (id, list) in &file.clients {
            if id == "*" {
                continue;
            }
            let hex = hex_upper(id.as_bytes());
            if let Some(other) = file.clients.keys().find(|other| **other == hex) {
                return Err(format!(
                    "the response topics of {id:?} (Go SDK form {hex}) and {other:?} cannot be told apart"
                ));
            }
            by_segment.insert(hex, prefixes(list));
        }
        Ok(KeyAccess { by_segment, others })
    }

    /// The prefixes of the client a response topic names (its `{client}` segment).
    pub fn prefixes_for(&self, client: &str) -> &Prefixes {
        self.by_segment.get(client).unwrap_or(&self.others)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
        [clients]
        "thermostat-1" = ["home/thermostat-1/", "home/shared/"]
        "dashboard" = [""]
        "*" = ["public/"]
    "#;

    #[test]
    fn a_client_gets_its_prefixes_by_id_or_by_its_hex_form() {
        let access = KeyAccess::parse(FILE).unwrap();
        for segment in ["thermostat-1", &hex_upper(b"thermostat-1")] {
            let prefixes = access.prefixes_for(segment);
            assert!(prefixes.allows(b"home/thermostat-1/setpoint"));
            assert!(prefixes.allows(b"home/shared/mode"));
            assert!(!prefixes.allows(b"home/thermostat-2/setpoint"));
            assert!(!prefixes.allows(b"public/x"), "a listed client does not also get the default");
        }
        assert!(access.prefixes_for("dashboard").allows(b"anything"));
    }

    #[test]
    fn unlisted_clients_get_the_default() {
        let access = KeyAccess::parse(FILE).unwrap();
        assert!(access.prefixes_for("stranger").allows(b"public/x"));
        assert!(!access.prefixes_for("stranger").allows(b"home/shared/mode"));
        let strict = KeyAccess::parse("[clients]\n\"a\" = [\"a/\"]\n").unwrap();
        assert!(!strict.prefixes_for("b").allows(b"a/x"), "without \"*\" others get nothing");
    }

    #[test]
    fn ambiguous_or_malformed_files_are_refused() {
        let error = KeyAccess::parse("[clients]\n\"A\" = [\"a/\"]\n\"41\" = [\"b/\"]\n").unwrap_err();
        assert!(error.contains("cannot be told apart"), "{error}");
        assert!(KeyAccess::parse("[clients]\n\"a/b\" = []\n").unwrap_err().contains("client id"));
        assert!(KeyAccess::parse("[client]\n").is_err());
        assert!(KeyAccess::parse("[clients]\n\"a\" = \"a/\"\n").is_err());
    }
}
