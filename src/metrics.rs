//! `/metrics` in the Prometheus text format, rendered from counter snapshots.

use std::fmt::Write as _;

use crate::epode::telemetry::{Counters, Telemetry};

/// The exposition of everything the sidecar counts.
pub(crate) fn render(telemetry: Option<&Telemetry>) -> String {
    let mut out = String::new();
    if let Some(t) = telemetry {
        let c = &t.counters;
        let rows: [(&str, &str, &str, u64); 5] = [
            (
                "epode_sidecar_telemetry_enqueued_total",
                "counter",
                "Telemetry events accepted into the queue.",
                Counters::get(&c.enqueued),
            ),
            (
                "epode_sidecar_telemetry_delivered_total",
                "counter",
                "Telemetry events Epode confirmed.",
                Counters::get(&c.delivered),
            ),
            (
                "epode_sidecar_telemetry_retries_total",
                "counter",
                "Telemetry batch deliveries retried.",
                Counters::get(&c.retried),
            ),
            (
                "epode_sidecar_telemetry_queue_depth",
                "gauge",
                "Telemetry events queued or in delivery.",
                t.depth(),
            ),
            (
                "epode_sidecar_telemetry_deliveries_in_flight",
                "gauge",
                "Telemetry batch deliveries in flight (at most one).",
                Counters::get(&c.deliveries_in_flight),
            ),
        ];
        for (name, kind, help, v) in rows {
            let _ = write!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n"
            );
        }
        out.push_str("# HELP epode_sidecar_telemetry_dropped_total Telemetry events not delivered, by reason.\n# TYPE epode_sidecar_telemetry_dropped_total counter\n");
        for (reason, v) in [
            ("queue_full", &c.dropped_queue_full),
            ("invalid", &c.dropped_invalid),
            ("epode_dropped", &c.dropped_by_epode),
            ("rejected", &c.dropped_rejected),
            ("retries_exhausted", &c.dropped_retries_exhausted),
            ("shutdown", &c.dropped_at_shutdown),
        ] {
            let _ = writeln!(
                out,
                "epode_sidecar_telemetry_dropped_total{{reason=\"{reason}\"}} {}",
                Counters::get(v)
            );
        }
    }
    out
}
