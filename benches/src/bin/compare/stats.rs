//! What a load run records: latencies (HDR histograms), answers and errors per second and per
//! minute, and, for fault runs, the time of every answer (to find the longest silence).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// Latencies are recorded in microseconds, up to this bound (longer ones are clamped: nothing
/// waits longer than the request timeout anyway).
const MAX_LATENCY_US: u64 = 120_000_000;

/// How many error descriptions a run keeps to show.
const ERROR_SAMPLES: usize = 5;

/// A latency distribution.
#[derive(Clone)]
pub struct Latencies(Histogram<u64>);

impl Latencies {
    pub fn new() -> Latencies {
        Latencies(Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("valid histogram bounds"))
    }

    pub fn record(&mut self, latency: Duration) {
        self.0.saturating_record((latency.as_micros() as u64).clamp(1, MAX_LATENCY_US));
    }

    pub fn count(&self) -> u64 {
        self.0.len()
    }

    /// The `q` quantile (0..=1) in milliseconds; NaN when nothing was recorded.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        self.0.value_at_quantile(q) as f64 / 1000.0
    }
}

/// p50, p99 and p99.9 in milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct Percentiles {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
}

impl From<&Latencies> for Percentiles {
    fn from(latencies: &Latencies) -> Percentiles {
        Percentiles {
            p50: latencies.quantile_ms(0.5),
            p99: latencies.quantile_ms(0.99),
            p999: latencies.quantile_ms(0.999),
        }
    }
}

/// Answers and errors in one second of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Second {
    pub answered: u64,
    pub errors: u64,
}

/// Everything recorded in a window.
#[derive(Clone)]
pub struct Recording {
    pub latencies: Latencies,
    pub answered: u64,
    pub errors: u64,
    pub error_samples: Vec<String>,
    /// Indexed by whole seconds since the window opened.
    pub seconds: Vec<Second>,
    /// Latencies of each minute since the window opened.
    pub minutes: Vec<Latencies>,
    /// Seconds since the window opened at which each answer arrived (only when asked for).
    pub answer_times: Option<Vec<f64>>,
    /// The latency of each of those answers, in milliseconds, in the same order.
    pub answer_latencies_ms: Option<Vec<f64>>,
}

/// Collects the outcomes of requests that complete within `[from, until)`; the rest (warm-up,
/// stragglers after the end) are ignored. Shared by all the load tasks of a run.
pub struct Recorder {
    from: Instant,
    until: Instant,
    recording: Mutex<Recording>,
}

impl Recorder {
    /// A recorder of the window `[from, from + length)`; with `answer_times` it also keeps the
    /// time of every answer.
    pub fn new(from: Instant, length: Duration, answer_times: bool) -> Recorder {
        Recorder {
            from,
            until: from + length,
            recording: Mutex::new(Recording {
                latencies: Latencies::new(),
                answered: 0,
                errors: 0,
                error_samples: Vec::new(),
                seconds: Vec::new(),
                minutes: Vec::new(),
                answer_times: answer_times.then(Vec::new),
                answer_latencies_ms: answer_times.then(Vec::new),
            }),
        }
    }

    pub fn from(&self) -> Instant {
        self.from
    }

    /// Records the outcome of a request sent (or, in an open loop, scheduled) at `sent` that
    /// completes now.
    pub fn record<E: std::fmt::Display>(&self, sent: Instant, outcome: Result<(), E>) {
        let done = Instant::now();
        if done < self.from || done >= self.until {
            return;
        }
        let since = done - self.from;
        let second = since.as_secs() as usize;
        let minute = second / 60;
        let mut recording = self.recording.lock().unwrap();
        if recording.seconds.len() <= second {
            recording.seconds.resize(second + 1, Second::default());
        }
        match outcome {
            Ok(()) => {
                let latency = done.saturating_duration_since(sent);
                recording.answered += 1;
                recording.seconds[second].answered += 1;
                recording.latencies.record(latency);
                while recording.minutes.len() <= minute {
                    recording.minutes.push(Latencies::new());
                }
                recording.minutes[minute].record(latency);
                if let Some(times) = &mut recording.answer_times {
                    times.push(since.as_secs_f64());
                }
                if let Some(latencies) = &mut recording.answer_latencies_ms {
                    latencies.push(latency.as_secs_f64() * 1000.0);
                }
            }
            Err(error) => {
                recording.errors += 1;
                recording.seconds[second].errors += 1;
                if recording.error_samples.len() < ERROR_SAMPLES {
                    recording.error_samples.push(error.to_string());
                }
            }
        }
    }

    /// Answers and errors recorded so far.
    pub fn counts(&self) -> (u64, u64) {
        let recording = self.recording.lock().unwrap();
        (recording.answered, recording.errors)
    }

    /// A copy of what was recorded so far.
    pub fn snapshot(&self) -> Recording {
        self.recording.lock().unwrap().clone()
    }
}

/// The longest time without an answer within `[start, end]` (seconds), given the sorted answer
/// times. Silence is measured from the last answer before `start` when there is one (a cut that
/// lands just after an answer still counts from that answer), and up to `end` when answers stop.
pub fn longest_silence(sorted_answers: &[f64], start: f64, end: f64) -> f64 {
    let first_inside = sorted_answers.partition_point(|&t| t < start);
    let mut previous = if first_inside > 0 { sorted_answers[first_inside - 1] } else { start };
    let mut longest: f64 = 0.0;
    for &t in sorted_answers[first_inside..].iter().take_while(|&&t| t <= end) {
        longest = longest.max(t - previous);
        previous = t;
    }
    longest.max(end - previous)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_come_from_the_histogram_in_milliseconds() {
        let mut latencies = Latencies::new();
        assert!(latencies.quantile_ms(0.5).is_nan());
        for ms in 1..=1000 {
            latencies.record(Duration::from_millis(ms));
        }
        let p = Percentiles::from(&latencies);
        // Three significant digits: within 0.1 % of the exact rank.
        assert!((p.p50 - 500.0).abs() <= 0.5, "{}", p.p50);
        assert!((p.p99 - 990.0).abs() <= 1.0, "{}", p.p99);
        assert!((p.p999 - 999.0).abs() <= 1.0, "{}", p.p999);
        assert_eq!(latencies.count(), 1000);
    }

    #[test]
    fn the_recorder_counts_only_its_window() {
        let from = Instant::now() + Duration::from_millis(50);
        let recorder = Recorder::new(from, Duration::from_secs(60), true);
        recorder.record::<String>(Instant::now(), Ok(()));
        assert_eq!(recorder.counts(), (0, 0), "before the window");
        std::thread::sleep(Duration::from_millis(60));
        recorder.record::<String>(Instant::now(), Ok(()));
        recorder.record(Instant::now(), Err("timeout"));
        let recording = recorder.snapshot();
        assert_eq!((recording.answered, recording.errors), (1, 1));
        assert_eq!(recording.seconds, vec![Second { answered: 1, errors: 1 }]);
        assert_eq!(recording.error_samples, vec!["timeout".to_string()]);
        assert_eq!(recording.answer_times.unwrap().len(), 1);
    }

    #[test]
    fn the_longest_silence_spans_the_window_edges() {
        let answers = [0.5, 1.0, 1.1, 4.0, 4.2, 9.0];
        // From the last answer before the window (1.1) to the next (4.0).
        assert!((longest_silence(&answers, 2.0, 6.0) - 2.9).abs() < 1e-9);
        // Answers stop: silence runs to the end of the window.
        assert!((longest_silence(&answers, 4.1, 8.5) - 4.3).abs() < 1e-9);
        // No answers at all.
        assert!((longest_silence(&[], 2.0, 5.0) - 3.0).abs() < 1e-9);
    }
}
