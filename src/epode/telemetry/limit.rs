//! How many telemetry deliveries may be in flight at once: a limit that adapts to Epode's
//! answers the way TCP's congestion window adapts to the network. It starts at a quarter of
//! the cap and grows by one per delivered batch while under the slow-start threshold (so it
//! doubles every round trip: a burst finds room within a few round trips), then by one per
//! round trip's worth of deliveries. A 429, a 5xx, a 408, a timeout or a network failure
//! halves it, once per round of deliveries (a failure of a delivery started before the last
//! cut does not cut again), and a `Retry-After` stops any delivery from starting before it
//! has passed. It never leaves `1..=cap`.
//!
//! Why not a crate: the crates found (`congestion-limiter` 0.1, `rate_limiter_aimd` 0.1,
//! `tower-resilience-adaptive`) are tower or reqwest middleware without slow start or a
//! "not before" time for `Retry-After`; this state machine is the part that matters, and it is
//! small enough to test whole.

use std::time::{Duration, Instant};

#[derive(Debug)]
pub(super) struct Limiter {
    cap: usize,
    limit: usize,
    /// Below it, each success adds one (slow start); at or above it, one per `limit` successes.
    threshold: usize,
    /// Successes since the limit last grew, at or above the threshold.
    credit: usize,
    in_flight: usize,
    /// No delivery starts before this (Epode's `Retry-After`).
    not_before: Option<Instant>,
    /// Counts the cuts: a failure cuts only if its delivery started in the current round.
    round: u64,
}

/// Why a delivery may not start now.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Wait {
    /// Until a delivery in flight ends.
    Slot,
    /// Until this instant (Epode asked for it with `Retry-After`).
    Until(Instant),
}

impl Limiter {
    /// A limiter allowing at most `cap` deliveries, starting at a quarter of that.
    pub(super) fn new(cap: usize) -> Self {
        let cap = cap.max(1);
        Limiter {
            cap,
            limit: (cap / 4).max(1),
            threshold: cap,
            credit: 0,
            in_flight: 0,
            not_before: None,
            round: 0,
        }
    }

    /// The deliveries allowed in flight now.
    pub(super) fn limit(&self) -> usize {
        self.limit
    }

    pub(super) fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Until when Epode asked for a pause, if it has not passed by `now`.
    pub(super) fn paused_until(&self, now: Instant) -> Option<Instant> {
        self.not_before.filter(|t| *t > now)
    }

    /// Whether a delivery may start at `now`, without starting it.
    pub(super) fn check(&self, now: Instant) -> Result<(), Wait> {
        if let Some(t) = self.paused_until(now) {
            return Err(Wait::Until(t));
        }
        if self.in_flight >= self.limit() {
            return Err(Wait::Slot);
        }
        Ok(())
    }

    /// Starts a delivery when one may start: its round, to give to [`Limiter::failed`].
    pub(super) fn start(&mut self, now: Instant) -> Result<u64, Wait> {
        self.check(now)?;
        self.in_flight += 1;
        Ok(self.round)
    }

    /// The round an attempt starting now belongs to (a retry is a new attempt).
    pub(super) fn round(&self) -> u64 {
        self.round
    }

    /// A delivery ended (whatever its outcome).
    pub(super) fn finish(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// Epode answered a batch with a receipt.
    pub(super) fn delivered(&mut self) {
        if self.limit < self.threshold {
            self.limit += 1;
        } else {
            self.credit += 1;
            if self.credit >= self.limit {
                self.credit = 0;
                self.limit += 1;
            }
        }
        self.limit = self.limit.min(self.cap);
    }

    /// An attempt of round `round` failed in a way that says Epode is overloaded or
    /// unreachable; `retry_after` is how long Epode asked the sender to wait.
    pub(super) fn failed(&mut self, round: u64, now: Instant, retry_after: Option<Duration>) {
        if let Some(wait) = retry_after {
            let until = now + wait;
            self.not_before = Some(self.not_before.map_or(until, |t| t.max(until)));
        }
        if round == self.round {
            self.round += 1;
            self.limit = (self.limit / 2).max(1);
            self.threshold = self.limit;
            self.credit = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Starts as many deliveries as allowed and returns their rounds.
    fn fill(l: &mut Limiter, now: Instant) -> Vec<u64> {
        std::iter::from_fn(|| l.start(now).ok()).collect()
    }

    #[test]
    fn starts_at_a_quarter_of_the_cap_and_doubles_each_round_trip() {
        let now = Instant::now();
        let mut l = Limiter::new(16);
        let mut seen = Vec::new();
        for _ in 0..4 {
            let started = fill(&mut l, now);
            seen.push(started.len());
            for _ in started {
                l.delivered();
                l.finish();
            }
        }
        assert_eq!(seen, [4, 8, 16, 16]);
        assert_eq!(l.limit(), 16, "never above the cap");
        assert_eq!(Limiter::new(1).limit(), 1);
        assert_eq!(Limiter::new(3).limit(), 1);
    }

    #[test]
    fn a_failure_halves_the_limit_once_per_round() {
        let now = Instant::now();
        let mut l = Limiter::new(16);
        for _ in 0..12 {
            l.delivered();
        }
        assert_eq!(l.limit(), 16);
        let rounds = fill(&mut l, now);
        assert_eq!(rounds.len(), 16);
        // Every delivery of the round fails: one cut, not sixteen.
        for r in &rounds {
            l.failed(*r, now, None);
        }
        assert_eq!(l.limit(), 8);
        for _ in rounds {
            l.finish();
        }
        // A failure of the next round cuts again, down to one and never below.
        for _ in 0..6 {
            let r = l.round();
            l.failed(r, now, None);
        }
        assert_eq!(l.limit(), 1);
        assert_eq!(fill(&mut l, now).len(), 1);
    }

    #[test]
    fn after_a_cut_it_grows_by_one_per_round_trip() {
        let now = Instant::now();
        let mut l = Limiter::new(16);
        for _ in 0..12 {
            l.delivered();
        }
        let r = l.round();
        l.failed(r, now, None);
        assert_eq!(l.limit(), 8);
        let mut seen = Vec::new();
        for _ in 0..4 {
            let started = fill(&mut l, now);
            seen.push(started.len());
            for _ in started {
                l.delivered();
                l.finish();
            }
        }
        assert_eq!(seen, [8, 9, 10, 11]);
    }

    #[test]
    fn retry_after_holds_every_start_until_it_passes() {
        let now = Instant::now();
        let mut l = Limiter::new(16);
        let r = l.start(now).unwrap();
        l.failed(r, now, Some(Duration::from_secs(2)));
        l.finish();
        let until = now + Duration::from_secs(2);
        assert_eq!(l.start(now), Err(Wait::Until(until)));
        assert_eq!(
            l.check(now + Duration::from_millis(1999)),
            Err(Wait::Until(until))
        );
        // A shorter Retry-After later never brings it forward.
        l.failed(l.round(), now, Some(Duration::from_secs(1)));
        assert_eq!(
            l.check(now + Duration::from_millis(1500)),
            Err(Wait::Until(until))
        );
        assert!(l.start(until).is_ok());
    }

    #[test]
    fn a_full_limit_waits_for_a_slot() {
        let now = Instant::now();
        let mut l = Limiter::new(4);
        assert_eq!(fill(&mut l, now).len(), 1);
        assert_eq!(l.check(now), Err(Wait::Slot));
        assert_eq!(l.in_flight(), 1);
        l.finish();
        assert_eq!(l.check(now), Ok(()));
    }
}
