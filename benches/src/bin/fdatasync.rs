//! How long an `fdatasync` after a small append takes in the kinds of file the Raft log could
//! write into, side by side on one file system:
//!
//! - `grows`: each append extends the file (as RocksDB's write-ahead log does);
//! - `fallocated`: inside space allocated with `fallocate` and never written (unwritten extents);
//! - `zeroed`: inside space already written with zeros (the log's segments, written ahead).
//!
//! ```text
//! cargo run --release -p statestore-benches --bin fdatasync -- [--dir DIR] [--rounds 4] [--syncs 2000] [--append 6144]
//! ```
//!
//! The kinds take turns in every round, so a machine whose disk speeds up or slows down moves
//! them alike. `--dir` (default: the current directory) chooses the file system measured: use
//! the one the nodes' data directories are on.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use hdrhistogram::Histogram;

/// Bytes of each file, as a log segment.
const FILE_BYTES: u64 = 64 << 20;

#[derive(Clone, Copy)]
enum Kind {
    Grows,
    Fallocated,
    Zeroed,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Grows, Kind::Fallocated, Kind::Zeroed];

    fn name(self) -> &'static str {
        match self {
            Kind::Grows => "grows",
            Kind::Fallocated => "fallocated",
            Kind::Zeroed => "zeroed",
        }
    }

    /// A new file of this kind at `path`, synced.
    fn create(self, path: &Path) -> anyhow::Result<File> {
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(path)?;
        match self {
            Kind::Grows => {}
            Kind::Fallocated => {
                // SAFETY: fallocate on an open descriptor; no memory is passed.
                if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, FILE_BYTES as libc::off_t) } != 0 {
                    return Err(std::io::Error::last_os_error()).context("fallocate");
                }
            }
            Kind::Zeroed => {
                let zeros = vec![0u8; 1 << 20];
                for at in (0..FILE_BYTES).step_by(zeros.len()) {
                    file.write_all_at(&zeros, at)?;
                }
            }
        }
        file.sync_all()?;
        Ok(file)
    }
}

struct Options {
    dir: PathBuf,
    rounds: usize,
    syncs: usize,
    append: usize,
}

fn parse() -> anyhow::Result<Options> {
    let mut options = Options { dir: PathBuf::from("."), rounds: 4, syncs: 2000, append: 6144 };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--dir" => options.dir = PathBuf::from(value()?),
            "--rounds" => options.rounds = value()?.parse()?,
            "--syncs" => options.syncs = value()?.parse()?,
            "--append" => options.append = value()?.parse()?,
            "-h" | "--help" => {
                println!("fdatasync [--dir DIR] [--rounds N] [--syncs N] [--append BYTES]");
                std::process::exit(0);
            }
            other => bail!("unknown option {other} (--dir, --rounds, --syncs, --append)"),
        }
    }
    if options.syncs == 0 || options.append == 0 || options.append as u64 * options.syncs as u64 > FILE_BYTES {
        bail!("--syncs × --append must be more than 0 and fit in {FILE_BYTES} bytes");
    }
    Ok(options)
}

/// Appends `options.append` bytes and `fdatasync`s, `options.syncs` times; each sync's µs.
fn measure(kind: Kind, dir: &Path, options: &Options) -> anyhow::Result<Histogram<u64>> {
    let path = dir.join(kind.name());
    let file = kind.create(&path)?;
    let data = vec![0x5a_u8; options.append];
    let mut histogram = Histogram::<u64>::new(3)?;
    for i in 0..options.syncs {
        file.write_all_at(&data, (i * options.append) as u64)?;
        let started = Instant::now();
        file.sync_data()?;
        histogram.record(started.elapsed().as_micros() as u64)?;
    }
    drop(file);
    std::fs::remove_file(&path)?;
    Ok(histogram)
}

fn ms(micros: u64) -> f64 {
    micros as f64 / 1000.0
}

fn print_row(round: &str, kind: Kind, histogram: &Histogram<u64>) {
    println!(
        "{round:>5}  {:>10}  {:>8.3}  {:>7.3}  {:>7.3}  {:>7.3}",
        kind.name(),
        histogram.mean() / 1000.0,
        ms(histogram.value_at_quantile(0.5)),
        ms(histogram.value_at_quantile(0.9)),
        ms(histogram.value_at_quantile(0.99)),
    );
}

fn main() -> anyhow::Result<()> {
    let options = parse()?;
    let dir =
        tempfile::tempdir_in(&options.dir).with_context(|| format!("a directory in {}", options.dir.display()))?;
    println!(
        "fdatasync after each {}-byte append, {} per file, in {}",
        options.append,
        options.syncs,
        options.dir.display()
    );
    println!("{:>5}  {:>10}  {:>8}  {:>7}  {:>7}  {:>7}", "round", "file", "mean ms", "p50 ms", "p90 ms", "p99 ms");
    let mut all: Vec<Histogram<u64>> = Kind::ALL.iter().map(|_| Histogram::new(3).expect("3 digits")).collect();
    for round in 1..=options.rounds {
        for (i, kind) in Kind::ALL.iter().enumerate() {
            let histogram = measure(*kind, dir.path(), &options)?;
            print_row(&round.to_string(), *kind, &histogram);
            all[i].add(&histogram)?;
        }
    }
    for (kind, histogram) in Kind::ALL.iter().zip(&all) {
        print_row("all", *kind, histogram);
    }
    Ok(())
}
