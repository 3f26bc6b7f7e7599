//! Rate-limited warnings: bad input can arrive at camera rate, and a log line per frame would
//! drown the log (and cost the node time). Each kind of warning is logged at most once per
//! interval; the next one that gets through says how many were suppressed in between.

use std::time::{Duration, Instant};

pub struct Warnings {
    interval: Duration,
    last: Vec<Option<Instant>>,
    suppressed: Vec<u64>,
}

impl Warnings {
    /// `kinds` distinct warnings, keyed `0..kinds`.
    pub fn new(kinds: usize, interval: Duration) -> Warnings {
        Warnings { interval, last: vec![None; kinds], suppressed: vec![0; kinds] }
    }

    /// Calls `log` with the number of warnings of this kind suppressed since the last one logged,
    /// unless one was logged less than an interval ago. Returns whether it logged.
    pub fn warn(&mut self, kind: usize, now: Instant, log: impl FnOnce(u64)) -> bool {
        let due = self.last[kind].is_none_or(|t| now.saturating_duration_since(t) >= self.interval);
        if due {
            log(self.suppressed[kind]);
            self.last[kind] = Some(now);
            self.suppressed[kind] = 0;
        } else {
            self.suppressed[kind] += 1;
        }
        due
    }
}

/// " (N similar suppressed)" or nothing.
pub struct Suppressed(pub u64);

impl std::fmt::Display for Suppressed {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        if self.0 > 0 { write!(f, " ({} similar suppressed)", self.0) } else { Ok(()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_per_interval_per_kind_with_suppressed_count() {
        let mut w = Warnings::new(2, Duration::from_secs(1));
        let t0 = Instant::now();
        let mut logged = Vec::new();
        for ms in [0, 100, 200, 999, 1000, 1500, 2100] {
            w.warn(0, t0 + Duration::from_millis(ms), |n| logged.push((ms, n)));
        }
        assert_eq!(logged, [(0, 0), (1000, 3), (2100, 1)]);
        assert!(w.warn(1, t0 + Duration::from_millis(100), |_| {}), "kinds are independent");
        assert_eq!(Suppressed(3).to_string(), " (3 similar suppressed)");
        assert_eq!(Suppressed(0).to_string(), "");
    }
}
