//! Warnings that can repeat many times a second (dropped telemetry, refused connections, a
//! chatty child process) must not flood the log: the first occurrence is logged at once, the
//! ones after it are counted and logged as one summary line per interval.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One kind of repeated warning, counted by reason.
pub(crate) struct LogSummary {
    what: &'static str,
    interval: Duration,
    tally: Mutex<SummaryCounts>,
}

/// The occurrences counted by reason since the current window began.
#[derive(Default)]
struct SummaryCounts {
    counts: BTreeMap<&'static str, u64>,
    /// Start of the current window; `None` after a quiet interval (the next one is logged at
    /// once).
    window: Option<Instant>,
}

impl LogSummary {
    pub(crate) fn new(what: &'static str, interval: Duration) -> Self {
        LogSummary {
            what,
            interval,
            tally: Mutex::new(SummaryCounts::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SummaryCounts> {
        self.tally.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts `n` occurrences of `reason`, logging now or folding them into the next summary.
    pub(crate) fn add(&self, reason: &'static str, n: u64) {
        if let Some(line) = self.add_at(reason, n, Instant::now()) {
            tracing::warn!("{line}");
        }
    }

    /// Logs what was counted since the last line, if anything (call at shutdown).
    pub(crate) fn flush(&self) {
        if let Some(line) = self.summary(&mut self.lock(), Instant::now()) {
            tracing::warn!("{line}");
        }
    }

    /// Logs the summary when its interval has passed (call from a timer).
    pub(crate) fn flush_if_due(&self) {
        let now = Instant::now();
        let mut tally = self.lock();
        match tally.window {
            Some(start) if now.duration_since(start) >= self.interval => {
                if tally.counts.is_empty() {
                    tally.window = None;
                } else if let Some(line) = self.summary(&mut tally, now) {
                    drop(tally);
                    tracing::warn!("{line}");
                }
            }
            _ => {}
        }
    }

    fn add_at(&self, reason: &'static str, n: u64, now: Instant) -> Option<String> {
        let mut tally = self.lock();
        match tally.window {
            None => {
                tally.window = Some(now);
                Some(format!(
                    "{}: {n} ({reason}); repeats are summarised every {}",
                    self.what,
                    humantime::format_duration(self.interval)
                ))
            }
            Some(start) => {
                *tally.counts.entry(reason).or_default() += n;
                if now.duration_since(start) >= self.interval {
                    self.summary(&mut tally, now)
                } else {
                    None
                }
            }
        }
    }

    fn summary(&self, tally: &mut SummaryCounts, now: Instant) -> Option<String> {
        if tally.counts.is_empty() {
            return None;
        }
        let since = tally
            .window
            .map_or(Duration::ZERO, |s| now.duration_since(s));
        let total: u64 = tally.counts.values().sum();
        let parts: Vec<String> = tally
            .counts
            .iter()
            .map(|(reason, n)| format!("{reason}={n}"))
            .collect();
        tally.counts.clear();
        tally.window = Some(now);
        Some(format!(
            "{}: {total} more in the last {}s ({})",
            self.what,
            since.as_secs(),
            parts.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_at_once_then_one_summary_per_interval() {
        let s = LogSummary::new("telemetry events dropped", Duration::from_secs(10));
        let t0 = Instant::now();
        assert!(s.add_at("queue_full", 1, t0).is_some());
        for i in 1..1000u64 {
            let at = t0 + Duration::from_millis(i);
            assert!(s.add_at("queue_full", 1, at).is_none());
        }
        assert!(s
            .add_at("rejected", 50, t0 + Duration::from_secs(2))
            .is_none());
        let line = s
            .add_at("queue_full", 1, t0 + Duration::from_secs(11))
            .unwrap();
        assert!(line.contains("1050 more"), "{line}");
        assert!(
            line.contains("queue_full=1000") && line.contains("rejected=50"),
            "{line}"
        );
        assert!(s
            .summary(&mut s.lock(), t0 + Duration::from_secs(12))
            .is_none());
    }
}
