//! What a run leaves behind: aligned text tables (printed and kept in `summary.txt`), CSV files
//! and progress lines while it runs.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::{Duration, Instant};

/// A text table with right-aligned columns (the first one left-aligned, and the last one too
/// when it holds text rather than figures).
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
    last_left: bool,
}

impl Table {
    pub fn new<S: AsRef<str>>(headers: &[S]) -> Table {
        Table { headers: headers.iter().map(|h| h.as_ref().to_string()).collect(), rows: Vec::new(), last_left: false }
    }

    /// Aligns the last column to the left.
    pub fn text_last(mut self) -> Table {
        self.last_left = true;
        self
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let columns = self.headers.len();
        let width = |c: usize| {
            std::iter::once(&self.headers[c])
                .chain(self.rows.iter().filter_map(|row| row.get(c)))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..columns).map(width).collect();
        let line = |cells: &[String]| {
            let text: Vec<String> = cells
                .iter()
                .enumerate()
                .map(|(c, cell)| {
                    if c == 0 || (self.last_left && c + 1 == columns) {
                        format!("{cell:<w$}", w = widths[c])
                    } else {
                        format!("{cell:>w$}", w = widths[c])
                    }
                })
                .collect();
            text.join("  ").trim_end().to_string() + "\n"
        };
        let mut out = line(&self.headers);
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }
}

/// One CSV field, quoted when it holds a comma, a quote or a line break.
pub fn csv_field(field: &str) -> String {
    if field.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", field.replace('"', "\"\""))
    } else {
        field.to_string()
    }
}

/// Writes a CSV file with a header line.
pub fn write_csv(path: &Path, headers: &[&str], rows: &[Vec<String>]) -> anyhow::Result<()> {
    let mut text = headers.join(",") + "\n";
    for row in rows {
        text.push_str(&row.iter().map(|f| csv_field(f)).collect::<Vec<_>>().join(","));
        text.push('\n');
    }
    std::fs::write(path, text)?;
    Ok(())
}

/// Operations per second with thousands separators; `-` when unknown.
pub fn ops(value: f64) -> String {
    if !value.is_finite() {
        return "-".into();
    }
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Milliseconds (or any small quantity) to two decimals; `-` when unknown.
pub fn decimal(value: f64) -> String {
    if value.is_finite() {
        format!("{value:.2}")
    } else {
        "-".into()
    }
}

/// A number for a CSV cell: plain, empty when unknown.
pub fn csv_number(value: f64) -> String {
    if value.is_finite() {
        format!("{value:.3}")
    } else {
        String::new()
    }
}

/// Progress on stderr while a run goes on: on a terminal one line rewritten in place every
/// second; otherwise (a log file, CI) a line every ten seconds.
pub struct Progress {
    terminal: bool,
    last_logged: Option<Instant>,
}

const LOG_EVERY: Duration = Duration::from_secs(10);

impl Progress {
    pub fn new() -> Progress {
        Progress { terminal: std::io::stderr().is_terminal(), last_logged: None }
    }

    /// A transient status.
    pub fn update(&mut self, text: &str) {
        if self.terminal {
            eprint!("\r{text}\x1b[K");
            let _ = std::io::stderr().flush();
        } else if self.last_logged.is_none_or(|at| at.elapsed() >= LOG_EVERY) {
            self.last_logged = Some(Instant::now());
            eprintln!("{text}");
        }
    }

    /// A line that stays.
    pub fn line(&mut self, text: &str) {
        if self.terminal {
            eprintln!("\r{text}\x1b[K");
        } else {
            eprintln!("{text}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_fields_are_quoted_only_when_needed() {
        assert_eq!(csv_field("cluster"), "cluster");
        assert_eq!(csv_field("bench=0.5;broker=0.2"), "bench=0.5;broker=0.2");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
    }

    #[test]
    fn csv_files_have_a_header_and_one_line_per_row() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.csv");
        write_csv(&path, &["target", "ops"], &[vec!["echo".into(), "1.000".into()], vec!["a,b".into(), String::new()]])
            .unwrap();
        assert_eq!(std::fs::read_to_string(path).unwrap(), "target,ops\necho,1.000\n\"a,b\",\n");
    }

    #[test]
    fn tables_align_and_numbers_read_well() {
        let mut table = Table::new(&["target", "ops/s"]);
        table.row(vec!["cluster".into(), ops(12345.6)]);
        table.row(vec!["echo".into(), ops(987.0)]);
        assert_eq!(table.render(), "target    ops/s\ncluster  12,346\necho        987\n");
        let mut notes = Table::new(&["target", "ops/s", "note"]).text_last();
        notes.row(vec!["cluster".into(), "1".into(), "a longer note".into()]);
        notes.row(vec!["echo".into(), "22".into(), "short".into()]);
        assert_eq!(notes.render(), "target   ops/s  note\ncluster      1  a longer note\necho        22  short\n");
        assert_eq!(ops(f64::NAN), "-");
        assert_eq!(ops(1_000_000.0), "1,000,000");
        assert_eq!(decimal(1.234), "1.23");
    }
}
