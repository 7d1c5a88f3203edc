//! What the telemetry queue counts for operators (`/metrics`): events enqueued, delivered,
//! retried and dropped by reason, Epode's receipts, the depth, the deliveries in flight and the
//! adaptive limit; and the tally the shutdown line gives from the same counts.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::limit::Limiter;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DropReason {
    reason: &'static str,
}

/// What the queue counts for operators (registered on `/metrics`).
#[derive(Debug, Default, Clone)]
pub(crate) struct Counters {
    pub(super) enqueued: Counter,
    pub(super) delivered: Counter,
    pub(super) retried: Counter,
    dropped: Family<DropReason, Counter>,
    /// The sums of Epode's receipts, as it reports them.
    pub(super) epode_accepted: Counter,
    pub(super) epode_dropped: Counter,
    /// Events accepted and not yet delivered or given up.
    pub(super) depth: Gauge,
    deliveries_in_flight: Gauge,
    concurrency_limit: Gauge,
}

/// Every reason an event may be dropped for.
const DROP_REASONS: [&str; 6] = [
    "queue_full",
    "invalid",
    "epode_dropped",
    "rejected",
    "retries_exhausted",
    "shutdown",
];

/// The drop reasons of an event that never entered the queue (the others were accepted first).
const REFUSED_REASONS: [&str; 2] = ["queue_full", "invalid"];

/// What the shutdown line says: `accepted = delivered + undelivered` once the queue is empty.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) accepted: u64,
    pub(super) delivered: u64,
    pub(super) undelivered: u64,
    pub(super) refused: u64,
    pub(super) by_reason: String,
}

impl Counters {
    /// The counters, every drop reason shown from the start (at 0).
    pub(crate) fn new() -> Self {
        let c = Counters::default();
        for reason in DROP_REASONS {
            drop(c.dropped.get_or_create(&DropReason { reason }));
        }
        c
    }

    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "enqueued",
            "Telemetry events accepted into the queue",
            self.enqueued.clone(),
        );
        registry.register(
            "delivered",
            "Telemetry events Epode confirmed",
            self.delivered.clone(),
        );
        registry.register(
            "retries",
            "Telemetry batch deliveries retried",
            self.retried.clone(),
        );
        registry.register(
            "dropped",
            "Telemetry events not delivered, by reason",
            self.dropped.clone(),
        );
        registry.register(
            "epode_accepted",
            "Telemetry events Epode's receipts say it stored",
            self.epode_accepted.clone(),
        );
        registry.register(
            "epode_dropped",
            "Telemetry events Epode's receipts say it dropped",
            self.epode_dropped.clone(),
        );
        registry.register(
            "queue_depth",
            "Telemetry events queued or in delivery",
            self.depth.clone(),
        );
        registry.register(
            "deliveries_in_flight",
            "Telemetry batch deliveries in flight (at most the concurrency limit)",
            self.deliveries_in_flight.clone(),
        );
        registry.register(
            "concurrency_limit",
            "Telemetry deliveries allowed in flight now (adapts to Epode's answers, up to EPODE_SIDECAR_TELEMETRY_CONCURRENCY)",
            self.concurrency_limit.clone(),
        );
    }

    pub(super) fn drop_n(&self, reason: &'static str, n: usize) {
        self.dropped
            .get_or_create(&DropReason { reason })
            .inc_by(n as u64);
    }

    pub(super) fn dropped(&self, reason: &'static str) -> u64 {
        self.dropped.get_or_create(&DropReason { reason }).get()
    }

    /// Every event's fate so far, for the shutdown line.
    pub(super) fn tally(&self) -> Tally {
        let mut tally = Tally {
            accepted: self.enqueued.get(),
            delivered: self.delivered.get(),
            ..Tally::default()
        };
        for reason in DROP_REASONS {
            let n = self.dropped(reason);
            if REFUSED_REASONS.contains(&reason) {
                tally.refused += n;
            } else {
                tally.undelivered += n;
            }
            if n > 0 {
                if !tally.by_reason.is_empty() {
                    tally.by_reason.push(' ');
                }
                tally.by_reason.push_str(&format!("{reason}={n}"));
            }
        }
        if tally.by_reason.is_empty() {
            tally.by_reason.push_str("none");
        }
        tally
    }

    pub(super) fn show(&self, limiter: &Limiter) {
        self.deliveries_in_flight
            .set(i64::try_from(limiter.in_flight()).unwrap_or(i64::MAX));
        self.concurrency_limit
            .set(i64::try_from(limiter.limit()).unwrap_or(i64::MAX));
    }
}
