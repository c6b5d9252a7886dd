//! A Mosquitto of the benchmark's own, with the project's settings (cluster/mosquitto.conf) on a
//! free loopback port and without persistence.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::processes::{wait_for_port, Process};

/// The broker configuration the project ships; the benchmark derives its own from it so that
/// the settings measured are the settings deployed.
const SHIPPED_CONFIG: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../cluster/mosquitto.conf"));

/// Settings the comparison depends on, enforced whatever the shipped file says: without
/// nodelay every round trip waits for Nagle; the limits keep 256 requests in flight per client
/// from being throttled or dropped by the broker.
const REQUIRED: [(&str, &str); 3] =
    [("set_tcp_nodelay", "true"), ("max_inflight_messages", "1000"), ("max_queued_messages", "100000")];

pub struct Broker {
    pub port: u16,
    pub process: Process,
}

/// The shipped configuration, listening on 127.0.0.1:`port`, persistence off (every run
/// starts from an empty broker), with the [`REQUIRED`] settings.
pub fn config_for(shipped: &str, port: u16) -> String {
    let mut lines = Vec::new();
    for line in shipped.lines() {
        let key = line.split_whitespace().next().unwrap_or("");
        match key {
            "listener" => lines.push(format!("listener {port} 127.0.0.1")),
            "persistence" => lines.push("persistence false".to_string()),
            "persistence_location" | "autosave_interval" => {}
            _ if REQUIRED.iter().any(|(name, _)| *name == key) => {}
            _ => lines.push(line.to_string()),
        }
    }
    if !lines.iter().any(|line| line.starts_with("listener ")) {
        lines.push(format!("listener {port} 127.0.0.1"));
    }
    lines.extend(REQUIRED.iter().map(|(name, value)| format!("{name} {value}")));
    lines.join("\n") + "\n"
}

/// Starts Mosquitto with its configuration in `dir` and its log in `logs`.
pub async fn start(binary: &Path, dir: &Path, logs: &Path) -> anyhow::Result<Broker> {
    let port = statestore_benches::free_port();
    let config = dir.join("mosquitto.conf");
    std::fs::write(&config, config_for(SHIPPED_CONFIG, port))?;
    let mut command = Command::new(binary);
    command.arg("-c").arg(&config);
    let process = Process::spawn("broker", command, &logs.join("mosquitto.log"))?;
    wait_for_port(port, Duration::from_secs(10), "mosquitto").await?;
    Ok(Broker { port, process })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_config_gets_a_port_no_persistence_and_the_required_limits() {
        let config = config_for(SHIPPED_CONFIG, 18830);
        let settings: Vec<&str> = config.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).collect();
        assert!(settings.contains(&"listener 18830 127.0.0.1"));
        assert!(settings.contains(&"persistence false"));
        assert!(!settings.iter().any(|l| l.starts_with("persistence_location") || l.starts_with("autosave")));
        for (name, value) in REQUIRED {
            let line = format!("{name} {value}");
            assert_eq!(settings.iter().filter(|l| l.starts_with(name)).count(), 1, "{name}");
            assert!(settings.contains(&line.as_str()));
        }
        assert!(settings.contains(&"allow_anonymous true"));
    }
}
