//! Delivering one batch: its request bodies (in parts when the whole would pass Epode's body
//! limit), each attempt under its timeout (shortened at shutdown), the retries of what may be
//! retried (exponential backoff, or the `Retry-After` Epode gives, which also pauses the
//! limit), and the counts of its fate. The slot it holds in the limit is given back however it
//! ends.

use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use bytes::Bytes;

use super::event::TelemetryEvent;
use super::limit::Limiter;
use super::receipt::{judge, Delivery};
use super::shared::TelemetryCore;
use crate::epode::client::EpodeError;

/// Epode reads at most this much of a request body (the real service's 64 KiB body limit): a
/// batch whose body would be larger is sent in parts.
const MAX_BATCH_BYTES: usize = 64 * 1024;

/// A delivery's place in the limit, given back when the delivery ends (or is aborted).
pub(super) struct Slot {
    pub(super) shared: Arc<TelemetryCore>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.shared.with_limiter(Limiter::finish);
    }
}

/// The request body of a batch, serialised once for all its attempts.
#[derive(serde::Serialize)]
struct BatchBody<'a> {
    events: &'a [TelemetryEvent],
}

/// The batch as request bodies Epode will read whole: halved until each part is at most
/// [`MAX_BATCH_BYTES`] (or a single event). In order, with each part's event count.
fn bodies(batch: Vec<TelemetryEvent>) -> Vec<(usize, Bytes)> {
    let mut out = Vec::new();
    let mut todo = vec![batch];
    while let Some(mut part) = todo.pop() {
        let n = part.len();
        let body = serde_json::to_vec(&BatchBody { events: &part }).unwrap_or_default();
        if body.len() > MAX_BATCH_BYTES && n > 1 {
            let second = part.split_off(n / 2);
            todo.push(second);
            todo.push(part);
        } else {
            out.push((n, Bytes::from(body)));
        }
    }
    out
}

/// Delivers one batch (in parts when its body would be too large), holding its slot.
pub(super) async fn deliver(
    slot: Slot,
    batch: Vec<TelemetryEvent>,
    links: Vec<opentelemetry::trace::SpanContext>,
) {
    // With OpenTelemetry on, the delivery is a span of its own, linked to the calls whose
    // events it carries (their traces ended long ago, so it is no child of theirs).
    let span = crate::otel::linked(
        "epode telemetry delivery",
        links,
        vec![opentelemetry::KeyValue::new(
            "epode.telemetry.events",
            i64::try_from(batch.len()).unwrap_or(i64::MAX),
        )],
    );
    let mut delivered = 0;
    for (n, body) in bodies(batch) {
        delivered += deliver_part(&slot.shared, n, body).await;
    }
    if let Some(span) = &span {
        span.set(opentelemetry::KeyValue::new(
            "epode.telemetry.delivered",
            i64::try_from(delivered).unwrap_or(i64::MAX),
        ));
    }
    drop(slot);
}

/// Delivers one request body of `n` events, retrying what may be retried, and counts the
/// outcome; returns how many events Epode accepted.
async fn deliver_part(shared: &TelemetryCore, n: usize, body: Bytes) -> u64 {
    let mut accepted_events = 0;
    let mut delays = ExponentialBuilder::new()
        .with_min_delay(shared.settings.backoff_base)
        .with_factor(2.0)
        .with_max_times(shared.settings.max_attempts.saturating_sub(1))
        .without_max_delay()
        .build();
    let mut attempt = 1;
    loop {
        let round = shared.with_limiter(|l| l.round());
        match attempt_once(shared, body.clone(), n).await {
            Delivery::Receipt { accepted, dropped } => {
                accepted_events = accepted;
                shared.with_limiter(Limiter::delivered);
                counted(shared, n, accepted, dropped, attempt);
                break;
            }
            Delivery::Rejected { reason, reported } => {
                if let Some((accepted, dropped)) = reported {
                    shared.counters.epode_accepted.inc_by(accepted);
                    shared.counters.epode_dropped.inc_by(dropped);
                }
                tracing::debug!(%reason, events = n, "telemetry batch not accepted; not retried");
                shared.given_up("rejected", n);
                break;
            }
            Delivery::Retryable {
                reason,
                retry_after,
            } => {
                let now = Instant::now();
                let retry_after = retry_after.map(|r| r.min(shared.settings.max_retry_after));
                let paused = shared.with_limiter(|l| {
                    l.failed(round, now, retry_after);
                    l.paused_until(now)
                });
                let Some(backoff) = delays.next() else {
                    tracing::debug!(%reason, attempts = attempt, events = n, "telemetry batch given up");
                    shared.given_up("retries_exhausted", n);
                    break;
                };
                // A pause another delivery was asked for holds this retry too.
                let pause = paused.map_or(Duration::ZERO, |t| t - now);
                let wait = retry_after.unwrap_or(backoff).max(pause);
                if shared.deadline().is_some_and(|d| now + wait >= d) {
                    tracing::debug!(%reason, attempts = attempt, events = n, "telemetry batch given up at shutdown");
                    shared.given_up("shutdown", n);
                    break;
                }
                shared.counters.retried.inc();
                tracing::debug!(%reason, attempt, ?wait, "telemetry batch will be retried");
                tokio::time::sleep(wait).await;
                attempt += 1;
            }
        }
    }
    shared.counters.depth.dec_by(n as i64);
    accepted_events
}

/// Counts a batch's receipt: its accepted events are delivered, its dropped ones lost.
fn counted(shared: &TelemetryCore, n: usize, accepted: u64, dropped: u64, attempt: usize) {
    let c = &shared.counters;
    c.epode_accepted.inc_by(accepted);
    c.epode_dropped.inc_by(dropped);
    c.delivered.inc_by(accepted);
    if dropped > 0 {
        tracing::debug!(
            events = n,
            accepted,
            dropped,
            "Epode dropped events of a telemetry batch; not retried"
        );
        shared.given_up("epode_dropped", usize::try_from(dropped).unwrap_or(n));
    } else {
        tracing::debug!(events = n, attempt, "telemetry batch delivered");
    }
}

/// The next attempt's timeout, shortened by the shutdown deadline.
fn attempt_timeout(shared: &TelemetryCore) -> Duration {
    let t = shared.settings.attempt_timeout;
    match shared.deadline() {
        Some(d) => t.min(d.saturating_duration_since(Instant::now())),
        None => t,
    }
}

async fn attempt_once(shared: &TelemetryCore, body: Bytes, n: usize) -> Delivery {
    let timeout = attempt_timeout(shared);
    if timeout.is_zero() {
        return Delivery::Retryable {
            reason: "shutdown deadline".into(),
            retry_after: None,
        };
    }
    match shared.client.post_batch(body, timeout).await {
        Ok(answer) => judge(&answer, n),
        Err(EpodeError::TooLarge) => Delivery::Rejected {
            reason: "the receipt is not a receipt".to_owned(),
            reported: None,
        },
        Err(e @ (EpodeError::Timeout(_) | EpodeError::Network(_))) => Delivery::Retryable {
            reason: e.to_string(),
            retry_after: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event_of(bytes: usize, sequence: u64) -> TelemetryEvent {
        TelemetryEvent::filler(sequence, "é".repeat(bytes / 2))
    }

    /// A batch whose body would pass Epode's 64 KiB limit goes in parts that each fit, in
    /// order; a batch that fits goes whole.
    #[test]
    fn large_batches_are_sent_in_parts_that_fit() {
        let batch: Vec<_> = (1..=100).map(|i| event_of(1800, i)).collect();
        let parts = bodies(batch);
        assert!(parts.len() > 1, "{} parts", parts.len());
        let mut seen = Vec::new();
        for (n, body) in &parts {
            assert!(body.len() <= MAX_BATCH_BYTES, "{}", body.len());
            let v: serde_json::Value = serde_json::from_slice(body).unwrap();
            let events = v["events"].as_array().unwrap();
            assert_eq!(events.len(), *n);
            seen.extend(events.iter().map(|e| e["sequence"].as_u64().unwrap()));
        }
        assert_eq!(seen, (1..=100).collect::<Vec<_>>());
        let small: Vec<_> = (1..=100).map(|i| event_of(300, i)).collect();
        assert_eq!(bodies(small).len(), 1);
        // One event larger than the limit is sent alone (Epode's answer judges it).
        assert_eq!(bodies(vec![event_of(70_000, 1)]).len(), 1);
    }
}
