//! Child processes the benchmark starts (broker, nodes, etcd members, the echo responder) and
//! what it reads about processes from /proc: CPU time and resident memory.
//!
//! Every child is owned by a [`Process`], which stops it when dropped, so an error, a panic or
//! Ctrl-C (which drops the running mode) never leaves a process behind. Children also get
//! `PR_SET_PDEATHSIG`, so they die with the benchmark even if it is killed with SIGKILL.

use std::fs::{File, OpenOptions};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use statestore_benches::{clock_ticks_per_second, cpu_seconds};

/// How long a stopped child may take to exit after SIGTERM before it gets SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// The last `n` lines of the file at `path`, indented; a note when it cannot be read.
fn last_lines(path: &Path, n: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(n)..]
                .iter()
                .map(|line| format!("    {line}"))
                .collect::<Vec<_>>()
                .join("\n")
        }
        Err(error) => format!("    ({} cannot be read: {error})", path.display()),
    }
}

/// A running child process, stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Process {
    name: String,
    child: Child,
    exited: Option<ExitStatus>,
    log: PathBuf,
}

impl Process {
    /// Starts `command` with stdout and stderr appended to `log`. The child gets its own process
    /// group, so a Ctrl-C in the terminal reaches only the benchmark, which then stops it.
    pub fn spawn(name: impl Into<String>, mut command: Command, log: &Path) -> anyhow::Result<Process> {
        let name = name.into();
        let output = append(log)?;
        command.stdin(Stdio::null()).stdout(output.try_clone()?).stderr(output).process_group(0);
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().with_context(|| format!("starting {name} ({command:?})"))?;
        Ok(Process { name, child, exited: None, log: log.to_path_buf() })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails when the process has exited without being stopped: a server that died is an error,
    /// not a result.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        if self.exited.is_some() {
            // Stopped on purpose (or reported already).
            return Ok(());
        }
        if let Some(status) = self.child.try_wait()? {
            self.exited = Some(status);
            bail!(
                "{} exited unexpectedly ({status}); the last lines of its output:\n{}",
                self.name,
                last_lines(&self.log, 5)
            );
        }
        Ok(())
    }

    /// SIGKILL (a crash: nothing is flushed); returns once the process is gone.
    pub fn kill(&mut self) -> ExitStatus {
        if let Some(status) = self.exited {
            return status;
        }
        let _ = self.child.kill();
        let status = self.child.wait().unwrap_or_default();
        self.exited = Some(status);
        status
    }

    /// SIGTERM, then SIGKILL after `grace`; returns once the process is gone.
    pub fn stop(&mut self, grace: Duration) -> ExitStatus {
        if let Some(status) = self.exited {
            return status;
        }
        signal(self.child.id(), libc::SIGTERM);
        let deadline = Instant::now() + grace;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = self.child.kill();
                    match self.child.wait() {
                        Ok(status) => break status,
                        // Not our child any more (already reaped): nothing left to stop.
                        Err(_) => break ExitStatus::default(),
                    }
                }
            }
        };
        self.exited = Some(status);
        status
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop(STOP_GRACE);
    }
}

fn signal(pid: u32, signal: libc::c_int) {
    // SAFETY: kill(2) with a pid we own; a stale pid only yields ESRCH.
    unsafe {
        libc::kill(pid as libc::pid_t, signal);
    }
}

fn append(path: &Path) -> anyhow::Result<File> {
    OpenOptions::new().create(true).append(true).open(path).with_context(|| format!("opening {}", path.display()))
}

/// Resident memory of a process in MiB (VmRSS of /proc/<pid>/status).
pub fn rss_mib(pid: u32) -> Option<f64> {
    status_mib(pid, "VmRSS:")
}

/// The most resident memory a process has had since it started, in MiB (VmHWM of
/// /proc/<pid>/status).
pub fn peak_rss_mib(pid: u32) -> Option<f64> {
    status_mib(pid, "VmHWM:")
}

fn status_mib(pid: u32, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with(field))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Waits until something accepts TCP connections on the loopback `port`.
pub async fn wait_for_port(port: u16, timeout: Duration, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        if Instant::now() > deadline {
            bail!("{what} did not listen on 127.0.0.1:{port} within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// CPU time the whole machine has been busy (all CPUs, everything but idle and I/O wait), and
/// the part of it stolen by the hypervisor for other guests, in seconds, from the first line of
/// /proc/stat.
fn machine_seconds() -> Option<MachineTime> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks = parse_machine_ticks(stat.lines().next()?)?;
    let hz = clock_ticks_per_second();
    Some(MachineTime { busy: ticks.busy as f64 / hz, steal: ticks.steal as f64 / hz })
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct MachineTime<T = f64> {
    busy: T,
    steal: T,
}

/// Busy (user + nice + system + irq + softirq + steal) and steal ticks of a `cpu ...` line of
/// /proc/stat.
fn parse_machine_ticks(line: &str) -> Option<MachineTime<u64>> {
    let fields: Vec<u64> =
        line.strip_prefix("cpu ")?.split_whitespace().map(|f| f.parse().ok()).collect::<Option<_>>()?;
    let [user, nice, system, _idle, _iowait, irq, softirq, steal, ..] = fields[..] else { return None };
    Some(MachineTime { busy: user + nice + system + irq + softirq + steal, steal })
}

/// The CPU of the servers among `cpu` (by process name): every process but the broker and the
/// load generator ("bench").
pub fn servers_cpu(cpu: &[(String, f64)]) -> f64 {
    cpu.iter().filter(|(name, _)| name != "bench" && name != "broker").map(|(_, cpu)| cpu).sum()
}

/// CPU seconds of a set of named processes, and of the whole machine, at one moment.
#[derive(Debug, Clone)]
pub struct CpuSample {
    at: Instant,
    seconds: Vec<(String, Option<f64>)>,
    machine: Option<MachineTime>,
}

impl CpuSample {
    pub fn take(processes: &[(String, u32)]) -> CpuSample {
        let seconds = processes.iter().map(|(name, pid)| (name.clone(), cpu_seconds(*pid))).collect();
        CpuSample { at: Instant::now(), seconds, machine: machine_seconds() }
    }

    /// CPU seconds per second the machine spent on anything but the listed processes between
    /// `self` and `end`: other work that competed with the measurement (NaN if unreadable).
    pub fn others_until(&self, end: &CpuSample) -> f64 {
        let listed: f64 = self.usage_until(end).iter().map(|(_, cpu)| cpu).sum();
        (self.machine_per_second(end, |time| time.busy) - listed).max(0.0)
    }

    /// CPU seconds per second the hypervisor gave to other guests between `self` and `end`
    /// (`steal` of /proc/stat): time the measured processes wanted a CPU and did not get one,
    /// which no process on this machine accounts for (NaN if unreadable).
    pub fn stolen_until(&self, end: &CpuSample) -> f64 {
        self.machine_per_second(end, |time| time.steal)
    }

    /// How fast one of the machine's CPU times grew between `self` and `end`, in seconds per
    /// second (NaN if /proc/stat was unreadable).
    fn machine_per_second(&self, end: &CpuSample, of: fn(MachineTime) -> f64) -> f64 {
        let wall = end.at.duration_since(self.at).as_secs_f64().max(1e-9);
        match (self.machine, end.machine) {
            (Some(before), Some(after)) => (of(after) - of(before)) / wall,
            _ => f64::NAN,
        }
    }

    /// CPU seconds per wall-clock second of each process between `self` and the later `end`
    /// (same processes in the same order); NaN where a process was not readable.
    pub fn usage_until(&self, end: &CpuSample) -> Vec<(String, f64)> {
        let wall = end.at.duration_since(self.at).as_secs_f64().max(1e-9);
        self.used_until(end).into_iter().map(|(name, used)| (name, used / wall)).collect()
    }

    /// CPU seconds each process used between `self` and the later `end`; NaN where a process
    /// was not readable.
    pub fn used_until(&self, end: &CpuSample) -> Vec<(String, f64)> {
        self.seconds
            .iter()
            .zip(&end.seconds)
            .map(|((name, before), (_, after))| {
                let used = match (before, after) {
                    (Some(before), Some(after)) => after - before,
                    _ => f64::NAN,
                };
                (name.clone(), used)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_busy_time_leaves_out_idle_and_io_wait() {
        assert_eq!(
            parse_machine_ticks("cpu  100 5 50 1000 20 1 2 3 0 0"),
            Some(MachineTime { busy: 100 + 5 + 50 + 1 + 2 + 3, steal: 3 })
        );
        assert_eq!(parse_machine_ticks("cpu0 100 5 50 1000 20 1 2 3 0 0"), None, "the total line only");
        assert_eq!(parse_machine_ticks("cpu  1 2"), None);
    }

    #[test]
    fn a_process_that_exits_on_its_own_is_reported_with_its_last_output() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("server.log");
        let mut command = Command::new("sh");
        command.args(["-c", "for i in 1 2 3 4 5 6 7; do echo line $i; done; echo address already in use >&2; exit 1"]);
        let mut process = Process::spawn("server", command, &log).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let error = loop {
            match process.check_running() {
                Err(error) => break format!("{error:#}"),
                Ok(()) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                Ok(()) => panic!("the process did not exit"),
            }
        };
        assert!(error.starts_with("server exited unexpectedly (exit status: 1)"), "{error}");
        assert!(error.contains("    address already in use") && error.contains("    line 4"), "{error}");
        assert!(!error.contains("line 3"), "only the last five lines: {error}");
        process.check_running().unwrap();
    }

    #[test]
    fn this_process_has_cpu_time_and_memory() {
        let pid = std::process::id();
        assert!(cpu_seconds(pid).is_some());
        assert!(rss_mib(pid).unwrap() > 0.0);
    }
}
