//! What the handle, the dispatcher and the deliveries share: the queue's settings and the
//! [`TelemetryCore`] (the Epode client, the counters, the drop log, the adaptive limit and the
//! shutdown deadline).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::counters::Counters;
use super::limit::Limiter;
use crate::epode::client::EpodeClient;
use crate::log_summary::LogSummary;

/// How the queue behaves; the defaults are the Epode SDKs' documented ones, but for the batch
/// (the protocol's most, 100) and the deliveries in flight (the SDKs send one at a time).
#[derive(Debug, Clone)]
pub(crate) struct QueueSettings {
    /// Events waiting in the queue (up to `concurrency` batches more may be in delivery).
    pub(crate) capacity: usize,
    pub(crate) batch_max: usize,
    /// The most deliveries in flight at once (the adaptive limit's cap).
    pub(crate) concurrency: usize,
    pub(crate) flush_every: Duration,
    pub(crate) max_attempts: usize,
    pub(crate) backoff_base: Duration,
    pub(crate) attempt_timeout: Duration,
    pub(crate) max_retry_after: Duration,
}

impl Default for QueueSettings {
    fn default() -> Self {
        QueueSettings {
            capacity: 1000,
            batch_max: 100,
            concurrency: 16,
            flush_every: Duration::from_millis(500),
            max_attempts: 6,
            backoff_base: Duration::from_millis(500),
            attempt_timeout: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

/// What the dispatcher and its deliveries share.
pub(super) struct TelemetryCore {
    pub(super) client: Arc<EpodeClient>,
    pub(super) settings: QueueSettings,
    pub(super) counters: Counters,
    pub(super) drops: Arc<LogSummary>,
    pub(super) limiter: parking_lot::Mutex<Limiter>,
    pub(super) stop: watch::Receiver<Option<Instant>>,
}

impl TelemetryCore {
    /// The shutdown deadline, once shutdown has begun.
    pub(super) fn deadline(&self) -> Option<Instant> {
        *self.stop.borrow()
    }

    pub(super) fn past_deadline(&self) -> bool {
        self.deadline().is_some_and(|d| Instant::now() >= d)
    }

    pub(super) fn given_up(&self, reason: &'static str, n: usize) {
        self.counters.drop_n(reason, n);
        self.drops.add(reason, n as u64);
    }

    pub(super) fn with_limiter<T>(&self, f: impl FnOnce(&mut Limiter) -> T) -> T {
        let mut limiter = self.limiter.lock();
        let out = f(&mut limiter);
        self.counters.show(&limiter);
        out
    }
}
