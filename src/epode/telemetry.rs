//! Confirmed MCP telemetry: one event per completed product tool call, enqueued without waiting
//! (a product response never waits for Epode) on a bounded channel, and delivered in order by
//! one background task: batches of up to `batch_max` every `flush_every` (or as soon as a
//! batch is full), one delivery in flight. A delivery is judged by its receipt; only network
//! failures, timeouts, 408, 429 and 5xx are retried, with exponential backoff (`backon`) or
//! the `Retry-After` Epode gives.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use backon::{BackoffBuilder, ExponentialBuilder};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, watch, Notify};

use super::client::{Answer, EpodeClient, EpodeError};
use crate::feedback::identity::{IdentityRefs, RefKind};
use crate::log_summary::LogSummary;

/// How the queue behaves; the defaults are the Epode SDKs' documented ones.
#[derive(Debug, Clone)]
pub(crate) struct QueueSettings {
    /// Events waiting in the queue (one batch more may be in delivery).
    pub(crate) capacity: usize,
    pub(crate) batch_max: usize,
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
            batch_max: 50,
            flush_every: Duration::from_millis(500),
            max_attempts: 6,
            backoff_base: Duration::from_millis(500),
            attempt_timeout: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

/// How often dropped telemetry is summarised in the log.
const DROP_SUMMARY_EVERY: Duration = Duration::from_secs(10);

/// The outcome of a product tool call, as telemetry sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Success,
    /// An `isError` result, an upstream failure, or a JSON-RPC error.
    Error,
}

/// What the caller knows of one completed product tool call.
#[derive(Debug, Clone, Default)]
pub(crate) struct McpCompletion {
    pub(crate) interaction_id: String,
    pub(crate) operation: String,
    pub(crate) outcome: Option<Outcome>,
    pub(crate) duration: Option<Duration>,
    /// The identity references, the mode's customerRef rule already applied.
    pub(crate) refs: IdentityRefs,
    pub(crate) runtime_hint: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum InvalidCompletion {
    #[error("invalid_operation: the tool name is not a valid telemetry operation")]
    Operation,
    #[error("invalid_outcome")]
    Outcome,
}

impl InvalidCompletion {
    fn reason(self) -> &'static str {
        match self {
            InvalidCompletion::Operation => "invalid_operation",
            InvalidCompletion::Outcome => "invalid_outcome",
        }
    }
}

/// `^[A-Za-z0-9/_:.*{}-]{1,160}$` and no `://` (a raw URL is never an operation).
pub(crate) fn valid_operation(op: &str) -> bool {
    (1..=160).contains(&op.len())
        && op
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/_:.*{}-".contains(&b))
        && !op.contains("://")
}

fn runtime_hint(raw: &str) -> Option<String> {
    let t = raw.trim();
    let n = t.chars().count();
    ((1..=200).contains(&n) && !t.chars().any(char::is_control)).then(|| t.to_owned())
}

/// The event for a completion, without its `sequence` (given in queue order when it is
/// batched): absent fields are omitted, never null or empty.
pub(crate) fn build_event(
    c: &McpCompletion,
    occurred_at: SystemTime,
) -> Result<Map<String, Value>, InvalidCompletion> {
    if !valid_operation(&c.operation) {
        return Err(InvalidCompletion::Operation);
    }
    let status = match c.outcome {
        Some(Outcome::Success) => 200,
        Some(Outcome::Error) => 500,
        None => return Err(InvalidCompletion::Outcome),
    };
    // References reach here valid (IdentityRefs only keeps valid ones); the conflict rule
    // holds for every event.
    let mut refs = c.refs.clone();
    refs.drop_conflicting_customer();
    let mut e = Map::new();
    e.insert(
        "interactionId".into(),
        Value::from(c.interaction_id.as_str()),
    );
    e.insert("surface".into(), "mcp".into());
    e.insert("operation".into(), Value::from(c.operation.as_str()));
    e.insert("classification".into(), "confirmed".into());
    e.insert("confirmationMethod".into(), "mcp".into());
    e.insert(
        "occurredAt".into(),
        Value::from(humantime::format_rfc3339_millis(occurred_at).to_string()),
    );
    e.insert("statusCode".into(), Value::from(status));
    if let Some(d) = c.duration {
        e.insert(
            "durationMs".into(),
            Value::from(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        );
    }
    for (kind, value) in refs.iter() {
        if kind != RefKind::Session {
            e.insert(kind.key().into(), Value::from(value));
        }
    }
    if let Some(s) = refs.session_ref {
        e.insert("sessionRef".into(), Value::from(s));
        e.insert("sessionSource".into(), "mcp".into());
    }
    if let Some(h) = c.runtime_hint.as_deref().and_then(runtime_hint) {
        e.insert("runtimeHint".into(), Value::from(h));
        e.insert("runtimeHintSource".into(), "mcp".into());
    }
    Ok(e)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DropReason {
    reason: &'static str,
}

/// What the queue counts for operators (registered on `/metrics`).
#[derive(Debug, Default, Clone)]
pub(crate) struct Counters {
    enqueued: Counter,
    delivered: Counter,
    retried: Counter,
    dropped: Family<DropReason, Counter>,
    /// Events accepted and not yet delivered or given up.
    depth: Gauge,
    deliveries_in_flight: Gauge,
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
            "queue_depth",
            "Telemetry events queued or in delivery",
            self.depth.clone(),
        );
        registry.register(
            "deliveries_in_flight",
            "Telemetry batch deliveries in flight (at most one)",
            self.deliveries_in_flight.clone(),
        );
    }

    fn drop_n(&self, reason: &'static str, n: usize) {
        self.dropped
            .get_or_create(&DropReason { reason })
            .inc_by(n as u64);
    }

    pub(crate) fn dropped(&self, reason: &'static str) -> u64 {
        self.dropped.get_or_create(&DropReason { reason }).get()
    }

    pub(crate) fn delivered(&self) -> u64 {
        self.delivered.get()
    }
}

/// Why a batch is given up without a retry.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Terminal {
    /// Epode accepted the batch but dropped some of its events.
    EpodeDropped { dropped: u64, of: usize },
    /// The status or the receipt says the batch is bad.
    Rejected(String),
}

/// A delivery's verdict, judged from the receipt.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Delivery {
    Delivered,
    Terminal(Terminal),
    Retryable {
        reason: String,
        retry_after: Option<Duration>,
    },
}

/// Success only on 202 with integer `accepted` + `dropped` that account for the batch and
/// `dropped == 0`.
pub(crate) fn judge(answer: &Answer, batch_len: usize) -> Delivery {
    match answer.status {
        202 => {
            let receipt = answer.json().unwrap_or(Value::Null);
            let (Some(accepted), Some(dropped)) = (
                receipt.get("accepted").and_then(Value::as_u64),
                receipt.get("dropped").and_then(Value::as_u64),
            ) else {
                return Delivery::Terminal(Terminal::Rejected("malformed receipt".to_owned()));
            };
            if accepted.checked_add(dropped) != Some(batch_len as u64) {
                return Delivery::Terminal(Terminal::Rejected(format!(
                    "the receipt ({accepted} accepted, {dropped} dropped) does not account for the {batch_len} events sent"
                )));
            }
            if dropped > 0 {
                return Delivery::Terminal(Terminal::EpodeDropped {
                    dropped,
                    of: batch_len,
                });
            }
            Delivery::Delivered
        }
        408 | 429 | 500..=599 => Delivery::Retryable {
            reason: format!("HTTP {}", answer.status),
            retry_after: answer
                .headers
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs),
        },
        s => Delivery::Terminal(Terminal::Rejected(format!("HTTP {s}"))),
    }
}

/// The handle the request path holds: enqueueing is a `try_send` on a bounded channel.
pub(crate) struct Telemetry {
    tx: mpsc::Sender<Map<String, Value>>,
    /// Told when the queue holds a full batch (the worker otherwise sleeps until the flush).
    batch_ready: Arc<Notify>,
    full_batch: usize,
    counters: Counters,
    stop: watch::Sender<Option<Instant>>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Dropped events are logged as counted summaries, never one line each.
    drops: Arc<LogSummary>,
    summary_timer: tokio::task::JoinHandle<()>,
}

impl Telemetry {
    /// Starts the background delivery task on the current runtime.
    pub(crate) fn start(
        client: Arc<EpodeClient>,
        settings: QueueSettings,
        counters: Counters,
    ) -> Arc<Telemetry> {
        let capacity = settings.capacity.max(1);
        let (tx, rx) = mpsc::channel(capacity);
        let (stop, stop_rx) = watch::channel(None);
        let drops = Arc::new(LogSummary::new(
            "telemetry events dropped",
            DROP_SUMMARY_EVERY,
        ));
        let summary_timer = tokio::spawn({
            let drops = drops.clone();
            async move {
                let mut tick = tokio::time::interval(DROP_SUMMARY_EVERY);
                loop {
                    tick.tick().await;
                    drops.flush_if_due();
                }
            }
        });
        let batch_ready = Arc::new(Notify::new());
        // A batch is at most the queue's size, so memory holds at most two queues' worth.
        let full_batch = settings.batch_max.clamp(1, capacity);
        let worker = Worker {
            client,
            settings: QueueSettings {
                batch_max: full_batch,
                ..settings
            },
            counters: counters.clone(),
            drops: drops.clone(),
            batch_ready: batch_ready.clone(),
            rx,
            stop: stop_rx,
            sequence: 0,
        };
        Arc::new(Telemetry {
            tx,
            batch_ready,
            full_batch,
            counters,
            stop,
            task: Mutex::new(Some(tokio::spawn(worker.run()))),
            drops,
            summary_timer,
        })
    }

    /// Builds and enqueues the event for a completion; never waits. Invalid completions and a
    /// full queue are counted and summarised in the log, not errors for the caller.
    pub(crate) fn record(&self, c: McpCompletion) {
        let event = match build_event(&c, SystemTime::now()) {
            Ok(e) => e,
            Err(e) => {
                self.counters.drop_n("invalid", 1);
                self.drops.add(e.reason(), 1);
                return;
            }
        };
        match self.tx.try_send(event) {
            Ok(()) => {
                self.counters.enqueued.inc();
                self.counters.depth.inc();
                if self.tx.max_capacity() - self.tx.capacity() == self.full_batch {
                    self.batch_ready.notify_one();
                }
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.counters.drop_n("queue_full", 1);
                self.drops.add("queue_full", 1);
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.counters.drop_n("shutdown", 1);
                self.drops.add("shutdown", 1);
            }
        }
    }

    /// Events accepted and not yet delivered or given up (queued, or in the batch being
    /// delivered).
    pub(crate) fn depth(&self) -> u64 {
        u64::try_from(self.counters.depth.get()).unwrap_or(0)
    }

    /// Flushes what is queued within `within`, then stops the task. Returns how many events
    /// could not be delivered.
    pub(crate) async fn shutdown(&self, within: Duration) -> u64 {
        let deadline = Instant::now() + within;
        let _ = self.stop.send(Some(deadline));
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut task) = task {
            // The worker watches the deadline itself; the extra second covers a send in flight.
            let limit = within + Duration::from_secs(1);
            if tokio::time::timeout(limit, &mut task).await.is_err() {
                task.abort();
            }
        }
        let left = self.depth();
        if left > 0 {
            self.counters.drop_n("shutdown", left as usize);
            self.counters.depth.set(0);
            self.drops.add("shutdown", left);
        }
        self.summary_timer.abort();
        self.drops.flush();
        let lost = self.counters.dropped("shutdown");
        tracing::info!(
            delivered = self.counters.delivered(),
            lost,
            "telemetry flushed"
        );
        lost
    }
}

struct Worker {
    client: Arc<EpodeClient>,
    settings: QueueSettings,
    counters: Counters,
    drops: Arc<LogSummary>,
    batch_ready: Arc<Notify>,
    rx: mpsc::Receiver<Map<String, Value>>,
    stop: watch::Receiver<Option<Instant>>,
    /// The last sequence number given: events are numbered in queue order.
    sequence: u64,
}

impl Worker {
    fn deadline(&self) -> Option<Instant> {
        *self.stop.borrow()
    }

    async fn run(mut self) {
        let batch_max = self.settings.batch_max.max(1);
        let mut batch = Vec::with_capacity(batch_max);
        loop {
            // Wait for the first events of a batch, or the stop signal.
            if self.deadline().is_some() {
                if self.rx.is_empty() {
                    return;
                }
                self.rx.recv_many(&mut batch, batch_max).await;
            } else {
                tokio::select! {
                    n = self.rx.recv_many(&mut batch, batch_max) => if n == 0 { return },
                    _ = self.stop.changed() => continue,
                }
                // Sleep until the flush time, or until the request path says a full batch is
                // waiting: not woken once per event (each wake is a cross-thread signal).
                if batch.len() < batch_max && self.rx.len() + batch.len() < batch_max {
                    let flush_at = tokio::time::Instant::now() + self.settings.flush_every;
                    tokio::select! {
                        _ = tokio::time::sleep_until(flush_at) => {}
                        _ = self.batch_ready.notified() => {}
                        _ = self.stop.changed() => {}
                    }
                }
                if batch.len() < batch_max && !self.rx.is_empty() {
                    let room = batch_max - batch.len();
                    self.rx.recv_many(&mut batch, room).await;
                }
            }
            for event in &mut batch {
                self.sequence += 1;
                event.insert("sequence".into(), Value::from(self.sequence));
            }
            let n = batch.len();
            self.deliver(std::mem::take(&mut batch)).await;
            self.counters.depth.dec_by(n as i64);
            if self.deadline().is_some_and(|d| Instant::now() >= d) {
                return;
            }
        }
    }

    /// The next attempt's timeout, shortened by the shutdown deadline.
    fn attempt_timeout(&self) -> Duration {
        let t = self.settings.attempt_timeout;
        match self.deadline() {
            Some(d) => t.min(d.saturating_duration_since(Instant::now())),
            None => t,
        }
    }

    async fn attempt(&self, body: &Value, n: usize) -> Delivery {
        let timeout = self.attempt_timeout();
        if timeout.is_zero() {
            return Delivery::Retryable {
                reason: "shutdown deadline".into(),
                retry_after: None,
            };
        }
        match self.client.post_batch(body, timeout).await {
            Ok(answer) => judge(&answer, n),
            Err(EpodeError::TooLarge) => Delivery::Terminal(Terminal::Rejected(
                "the receipt is not a receipt".to_owned(),
            )),
            Err(e @ (EpodeError::Timeout(_) | EpodeError::Network(_))) => Delivery::Retryable {
                reason: e.to_string(),
                retry_after: None,
            },
        }
    }

    fn given_up(&self, reason: &'static str, n: usize) {
        self.counters.drop_n(reason, n);
        self.drops.add(reason, n as u64);
    }

    async fn deliver(&mut self, batch: Vec<Map<String, Value>>) {
        let n = batch.len();
        let body = json!({ "events": batch });
        self.counters.deliveries_in_flight.inc();
        let mut delays = ExponentialBuilder::new()
            .with_min_delay(self.settings.backoff_base)
            .with_factor(2.0)
            .with_max_times(self.settings.max_attempts.saturating_sub(1))
            .without_max_delay()
            .build();
        let mut attempt = 1;
        loop {
            match self.attempt(&body, n).await {
                Delivery::Delivered => {
                    self.counters.delivered.inc_by(n as u64);
                    tracing::debug!(events = n, attempt, "telemetry batch delivered");
                    break;
                }
                Delivery::Terminal(terminal) => {
                    tracing::debug!(
                        ?terminal,
                        events = n,
                        "telemetry batch not accepted; not retried"
                    );
                    match terminal {
                        Terminal::EpodeDropped { .. } => self.given_up("epode_dropped", n),
                        Terminal::Rejected(_) => self.given_up("rejected", n),
                    }
                    break;
                }
                Delivery::Retryable {
                    reason,
                    retry_after,
                } => {
                    let Some(backoff) = delays.next() else {
                        tracing::debug!(%reason, attempts = attempt, events = n, "telemetry batch given up");
                        self.given_up("retries_exhausted", n);
                        break;
                    };
                    let wait = retry_after
                        .map(|r| r.min(self.settings.max_retry_after))
                        .unwrap_or(backoff);
                    if self.deadline().is_some_and(|d| Instant::now() + wait >= d) {
                        tracing::debug!(%reason, attempts = attempt, events = n, "telemetry batch given up at shutdown");
                        self.given_up("shutdown", n);
                        break;
                    }
                    self.counters.retried.inc();
                    tracing::debug!(%reason, attempt, ?wait, "telemetry batch will be retried");
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
            }
        }
        self.counters.deliveries_in_flight.dec();
    }
}

#[cfg(test)]
mod tests;
