//! Step latency statistics without allocation on the hot path: a fixed ring of the most recent
//! samples, plus totals. Percentiles are computed on request (which may allocate).

use std::time::Duration;

/// Samples kept for percentiles.
pub const WINDOW: usize = 8192;

#[derive(Clone, Debug)]
pub struct LatencyStats {
    samples: Box<[f64; WINDOW]>,
    count: u64,
    max_s: f64,
    deadline_misses: u64,
}

/// A summary in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Summary {
    pub count: u64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub deadline_misses: u64,
}

impl Default for LatencyStats {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyStats {
    pub fn new() -> Self {
        LatencyStats { samples: Box::new([0.0; WINDOW]), count: 0, max_s: 0.0, deadline_misses: 0 }
    }

    pub fn record(&mut self, latency: Duration, deadline_missed: bool) {
        let s = latency.as_secs_f64();
        self.samples[(self.count % WINDOW as u64) as usize] = s;
        self.count += 1;
        self.max_s = self.max_s.max(s);
        self.deadline_misses += deadline_missed as u64;
    }

    pub fn reset(&mut self) {
        self.count = 0;
        self.max_s = 0.0;
        self.deadline_misses = 0;
    }

    /// Percentiles over the last `WINDOW` steps; count, max and misses over all steps.
    pub fn summary(&self) -> Summary {
        let n = (self.count as usize).min(WINDOW);
        Summary { count: self.count, max_ms: self.max_s * 1e3, deadline_misses: self.deadline_misses, ..summarize(&self.samples[..n]) }
    }
}

/// Percentiles, count and maximum of samples given in seconds, reported in milliseconds.
pub fn summarize(samples: &[f64]) -> Summary {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let pct = |p: f64| if n == 0 { 0.0 } else { sorted[(p * (n - 1) as f64).round() as usize] * 1e3 };
    Summary { count: n as u64, p50_ms: pct(0.50), p90_ms: pct(0.90), p99_ms: pct(0.99), max_ms: pct(1.0), deadline_misses: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_known_samples() {
        let samples: Vec<f64> = (1..=100).map(|i| i as f64 / 1000.0).collect();
        let s = summarize(&samples);
        assert_eq!(s.count, 100);
        assert!((s.p50_ms - 51.0).abs() < 1e-9 || (s.p50_ms - 50.0).abs() < 1e-9);
        assert!((s.p99_ms - 99.0).abs() < 1e-9);
        assert!((s.max_ms - 100.0).abs() < 1e-9);
    }

    #[test]
    fn window_keeps_recent_and_counts_misses() {
        let mut s = LatencyStats::new();
        for i in 0..(WINDOW + 10) {
            s.record(Duration::from_millis(if i < 10 { 1000 } else { 1 }), i == 0);
        }
        let sum = s.summary();
        assert_eq!(sum.count, (WINDOW + 10) as u64);
        assert_eq!(sum.deadline_misses, 1);
        assert!((sum.p99_ms - 1.0).abs() < 1e-9, "old slow samples left the window");
        assert!((sum.max_ms - 1000.0).abs() < 1e-9);
    }
}
