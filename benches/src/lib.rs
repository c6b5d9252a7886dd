//! Benchmarks of the state store; the targets live in `benches/`. This library holds what the
//! targets share.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// A loopback port nothing listens on right now, below the kernel's ephemeral range (32768 and
/// up). A port the kernel hands out for `:0` is also one it hands out as the source port of
/// outgoing connections: a NATS or etcd server dialling its peers before they listen can take
/// the very port a peer is about to bind, and that peer exits with "address already in use".
/// Each process starts at its own offset (by pid) and hands out each port once. Panics, naming
/// the range, once a whole pass over it found nothing to bind.
pub fn free_port() -> u16 {
    const FIRST: u16 = 20_000;
    const COUNT: u16 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let offset = std::process::id().wrapping_mul(7_919);
    bindable_port(FIRST, COUNT, offset, &NEXT)
        .unwrap_or_else(|| panic!("no loopback port free in {FIRST}..{}: every one is taken", FIRST + COUNT))
}

/// The next port of `first..first + count` (counting on from `offset + next`) that binds on
/// loopback, trying each port of the range at most once; `None` when none does.
fn bindable_port(first: u16, count: u16, offset: u32, next: &AtomicU32) -> Option<u16> {
    let count = u32::from(count);
    (0..count).find_map(|_| {
        let n = next.fetch_add(1, Ordering::Relaxed);
        let port = (u32::from(first) + offset.wrapping_add(n) % count) as u16;
        std::net::TcpListener::bind(("127.0.0.1", port)).is_ok().then_some(port)
    })
}

/// The `p` quantile (0..=1) of sorted latencies, in milliseconds; NaN when there are none.
pub fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1000.0
}

/// CPU time (user + system, all threads) a process has used so far, in seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_cpu_ticks(&stat).map(|ticks| ticks as f64 / clock_ticks_per_second())
}

/// utime + stime from the text of /proc/<pid>/stat (fields 14 and 15). The command name in
/// field 2 may contain spaces and parentheses, so fields are counted after its closing `)`.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// The kernel's clock ticks per second, the unit of /proc's CPU times.
pub fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_bindable_and_outside_the_ephemeral_range() {
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
        for port in ports {
            assert!((20_000..32_000).contains(&port), "{port}");
            std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        }
    }

    #[test]
    fn a_range_with_every_port_taken_gives_none_after_one_pass() {
        let taken = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = taken.local_addr().unwrap().port();
        let next = AtomicU32::new(0);
        assert_eq!(bindable_port(port, 1, 0, &next), None);
        assert_eq!(next.load(Ordering::Relaxed), 1, "each port of the range is tried once");
        drop(taken);
        assert_eq!(bindable_port(port, 1, 0, &next), Some(port));
    }

    #[test]
    fn cpu_ticks_are_counted_after_the_command_name() {
        let stat = "4242 (a (weird) name) S 1 4242 4242 0 -1 4194304 100 0 0 0 1234 567 0 0 20 0 3 0 99 0 0";
        assert_eq!(parse_cpu_ticks(stat), Some(1234 + 567));
        assert_eq!(parse_cpu_ticks("garbage"), None);
    }

    #[test]
    fn percentiles_pick_the_nearest_rank() {
        let sorted: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile_ms(&sorted, 0.5), 51.0);
        assert_eq!(percentile_ms(&sorted, 0.99), 99.0);
        assert_eq!(percentile_ms(&sorted, 1.0), 100.0);
        assert!(percentile_ms(&[], 0.5).is_nan());
    }
}
