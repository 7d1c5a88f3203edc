//! Telemetry: one event per completed product tool call (confirmed MCP) or instrumented HTTP
//! response (unclassified, `http_json`/`http_html`/`http_headers`), numbered (`sequence`)
//! and enqueued without waiting (a product response never waits for Epode) on a bounded
//! channel. One dispatcher task forms batches of up to `batch_max` (sent as soon as one is
//! full, or `flush_every` after its first event) and starts a delivery task for each, as many
//! in flight as the adaptive limit of [`limit`] allows (at most `concurrency`). A delivery is
//! judged by its receipt; only network failures, timeouts, 408, 429 and 5xx are retried, with
//! exponential backoff (`backon`) or the `Retry-After` Epode gives, which also holds back every
//! other delivery. Epode orders interactions by `(occurredAt, sequence)` and upserts each event
//! by its id, so batches may arrive in any order and a duplicate is harmless.

mod customers;
mod limit;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use backon::{BackoffBuilder, ExponentialBuilder};
use bytes::Bytes;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::{Map, Value};
use std::collections::VecDeque;
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinSet;

use super::client::{Answer, EpodeClient, EpodeError};
use crate::feedback::identity::{IdentityRefs, RefKind};
use crate::log_summary::LogSummary;
use customers::{customer_keys, Forming, InFlight};
use limit::{Limiter, Wait};

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

/// Epode reads at most this much of a request body (the real service's 64 KiB body limit): a
/// batch whose body would be larger is sent in parts.
const MAX_BATCH_BYTES: usize = 64 * 1024;

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

/// Where an HTTP response carried its envelope: the telemetry `surface`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Surface {
    /// `_agentFeedback` in a JSON object (`http_json`).
    Json,
    /// The script tag in an HTML page (`http_html`).
    Html,
    /// The `Agent-Feedback` header (`http_headers`).
    Headers,
}

impl Surface {
    pub(crate) const ALL: [Surface; 3] = [Surface::Json, Surface::Html, Surface::Headers];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Surface::Json => "http_json",
            Surface::Html => "http_html",
            Surface::Headers => "http_headers",
        }
    }
}

/// What the HTTP surface knows of one instrumented response.
#[derive(Debug, Clone)]
pub(crate) struct HttpCompletion {
    /// The capability's `i`, the envelope's interaction.
    pub(crate) interaction_id: String,
    pub(crate) surface: Surface,
    /// The normalised route.
    pub(crate) operation: String,
    /// The status the client got.
    pub(crate) status: u16,
    /// From the request's arrival to the body being ready.
    pub(crate) duration: Duration,
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

/// The event for a completion, without its `sequence` (given when it is enqueued, added when
/// it is batched): absent fields are omitted, never null or empty.
pub(crate) fn build_event(
    c: &McpCompletion,
    occurred_at: SystemTime,
) -> Result<Map<String, Value>, InvalidCompletion> {
    let status = match c.outcome {
        Some(Outcome::Success) => 200,
        Some(Outcome::Error) => 500,
        None => return Err(InvalidCompletion::Outcome),
    };
    event(Event {
        interaction_id: &c.interaction_id,
        surface: "mcp",
        operation: &c.operation,
        classification: "confirmed",
        confirmation: Some("mcp"),
        occurred_at,
        status,
        duration: c.duration,
        refs: &c.refs,
        runtime_hint: c.runtime_hint.as_deref(),
        session_source: "mcp",
        hint_source: "mcp",
    })
}

/// The event for an instrumented HTTP response, without its `sequence`: `unclassified` (Epode
/// confirms it when a report names its interaction), no `confirmationMethod` (Epode refuses
/// one on an HTTP event), the real status; a session and a runtime hint are the customer's
/// and come over HTTP.
pub(crate) fn build_http_event(
    c: &HttpCompletion,
    occurred_at: SystemTime,
) -> Result<Map<String, Value>, InvalidCompletion> {
    if !(100..=599).contains(&c.status) {
        return Err(InvalidCompletion::Outcome);
    }
    event(Event {
        interaction_id: &c.interaction_id,
        surface: c.surface.as_str(),
        operation: &c.operation,
        classification: "unclassified",
        confirmation: None,
        occurred_at,
        status: c.status,
        duration: Some(c.duration),
        refs: &c.refs,
        runtime_hint: c.runtime_hint.as_deref(),
        session_source: "customer",
        hint_source: "http",
    })
}

/// What an event of either surface says; [`event`] writes it in the order Epode documents.
struct Event<'a> {
    interaction_id: &'a str,
    surface: &'static str,
    operation: &'a str,
    classification: &'static str,
    confirmation: Option<&'static str>,
    occurred_at: SystemTime,
    status: u16,
    duration: Option<Duration>,
    refs: &'a IdentityRefs,
    runtime_hint: Option<&'a str>,
    /// Where a session and a runtime hint came from (`mcp`, or `customer` and `http`).
    session_source: &'static str,
    hint_source: &'static str,
}

fn event(f: Event<'_>) -> Result<Map<String, Value>, InvalidCompletion> {
    if !valid_operation(f.operation) {
        return Err(InvalidCompletion::Operation);
    }
    // References reach here valid (IdentityRefs only keeps valid ones); the conflict rule
    // holds for every event.
    let mut refs = f.refs.clone();
    refs.drop_conflicting_customer();
    let mut e = Map::new();
    e.insert("interactionId".into(), Value::from(f.interaction_id));
    e.insert("surface".into(), f.surface.into());
    e.insert("operation".into(), Value::from(f.operation));
    e.insert("classification".into(), f.classification.into());
    if let Some(method) = f.confirmation {
        e.insert("confirmationMethod".into(), method.into());
    }
    e.insert(
        "occurredAt".into(),
        Value::from(humantime::format_rfc3339_millis(f.occurred_at).to_string()),
    );
    e.insert("statusCode".into(), Value::from(f.status));
    if let Some(d) = f.duration {
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
        e.insert("sessionSource".into(), f.session_source.into());
    }
    if let Some(h) = f.runtime_hint.and_then(runtime_hint) {
        e.insert("runtimeHint".into(), Value::from(h));
        e.insert("runtimeHintSource".into(), f.hint_source.into());
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
    /// The sums of Epode's receipts, as it reports them.
    epode_accepted: Counter,
    epode_dropped: Counter,
    /// Events accepted and not yet delivered or given up.
    depth: Gauge,
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
struct Tally {
    accepted: u64,
    delivered: u64,
    undelivered: u64,
    refused: u64,
    by_reason: String,
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

    fn drop_n(&self, reason: &'static str, n: usize) {
        self.dropped
            .get_or_create(&DropReason { reason })
            .inc_by(n as u64);
    }

    pub(crate) fn dropped(&self, reason: &'static str) -> u64 {
        self.dropped.get_or_create(&DropReason { reason }).get()
    }

    /// Every event's fate so far, for the shutdown line.
    fn tally(&self) -> Tally {
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

    fn show(&self, limiter: &Limiter) {
        self.deliveries_in_flight
            .set(i64::try_from(limiter.in_flight()).unwrap_or(i64::MAX));
        self.concurrency_limit
            .set(i64::try_from(limiter.limit()).unwrap_or(i64::MAX));
    }
}

/// A delivery's verdict, judged from the answer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// A 202 whose receipt accounts for the batch: Epode stored `accepted` events and dropped
    /// `dropped` (not retried: a dropped event is one Epode will not take).
    Receipt { accepted: u64, dropped: u64 },
    /// The status or the receipt says the batch is bad; not retried. `reported` is the
    /// receipt's counts when it has them but they do not account for the batch.
    Rejected {
        reason: String,
        reported: Option<(u64, u64)>,
    },
    Retryable {
        reason: String,
        retry_after: Option<Duration>,
    },
}

/// A receipt is a 202 with integer `accepted` + `dropped` that account for the batch.
pub(crate) fn judge(answer: &Answer, batch_len: usize) -> Delivery {
    let rejected = |reason: String, reported| Delivery::Rejected { reason, reported };
    match answer.status {
        202 => {
            let receipt = answer.json().unwrap_or(Value::Null);
            let (Some(accepted), Some(dropped)) = (
                receipt.get("accepted").and_then(Value::as_u64),
                receipt.get("dropped").and_then(Value::as_u64),
            ) else {
                return rejected("malformed receipt".to_owned(), None);
            };
            let n = batch_len as u64;
            if accepted.checked_add(dropped) != Some(n) {
                // Counts each within the batch are shown as reported; others are garbage.
                let reported = (accepted <= n && dropped <= n).then_some((accepted, dropped));
                return rejected(format!(
                    "the receipt ({accepted} accepted, {dropped} dropped) does not account for the {batch_len} events sent"
                ), reported);
            }
            Delivery::Receipt { accepted, dropped }
        }
        s if crate::error::transient(s) => Delivery::Retryable {
            reason: format!("HTTP {}", answer.status),
            retry_after: answer
                .headers
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs),
        },
        s => rejected(format!("HTTP {s}"), None),
    }
}

/// An event on its way to the dispatcher, with the sequence number it was given.
type Queued = (u64, Map<String, Value>);

/// The handle the request path holds: enqueueing is a `try_send` on a bounded channel.
pub(crate) struct Telemetry {
    tx: mpsc::Sender<Queued>,
    /// The last sequence number given; held while an event is sent so numbers follow the
    /// queue's order.
    sequence: parking_lot::Mutex<u64>,
    /// Told when the queue holds what the dispatcher waits for to fill its batch (it otherwise
    /// sleeps until the flush time).
    batch_ready: Arc<Notify>,
    /// How many queued events the dispatcher waits for; `usize::MAX` when it is not waiting.
    wanted: Arc<AtomicUsize>,
    counters: Counters,
    stop: watch::Sender<Option<Instant>>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Dropped events are logged as counted summaries, never one line each.
    drops: Arc<LogSummary>,
    summary_timer: tokio::task::JoinHandle<()>,
}

impl Telemetry {
    /// Starts the dispatcher task on the current runtime.
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
        let wanted = Arc::new(AtomicUsize::new(usize::MAX));
        // A batch is at most the queue's size: memory holds at most the queue and
        // `concurrency` batches.
        let full_batch = settings.batch_max.clamp(1, capacity);
        let limiter = Limiter::new(settings.concurrency);
        counters.show(&limiter);
        let shared = Arc::new(TelemetryCore {
            client,
            settings: QueueSettings {
                batch_max: full_batch,
                ..settings
            },
            counters: counters.clone(),
            drops: drops.clone(),
            limiter: parking_lot::Mutex::new(limiter),
            stop: stop_rx.clone(),
        });
        let dispatcher =
            BatchDispatcher::new(shared, batch_ready.clone(), wanted.clone(), rx, stop_rx);
        Arc::new(Telemetry {
            tx,
            sequence: parking_lot::Mutex::new(0),
            batch_ready,
            wanted,
            counters,
            stop,
            task: Mutex::new(Some(tokio::spawn(dispatcher.run()))),
            drops,
            summary_timer,
        })
    }

    /// Builds, numbers and enqueues the event for a completion; never waits. Invalid
    /// completions and a full queue are counted and summarised in the log, not errors for
    /// the caller.
    pub(crate) fn record(&self, c: McpCompletion) {
        self.enqueue(build_event(&c, SystemTime::now()));
    }

    /// The same for an instrumented HTTP response, through the same queue.
    pub(crate) fn record_http(&self, c: &HttpCompletion) {
        self.enqueue(build_http_event(c, SystemTime::now()));
    }

    fn enqueue(&self, event: Result<Map<String, Value>, InvalidCompletion>) {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                self.counters.drop_n("invalid", 1);
                self.drops.add(e.reason(), 1);
                return;
            }
        };
        let sent = {
            let mut last = self.sequence.lock();
            let sent = self.tx.try_send((*last + 1, event));
            if sent.is_ok() {
                *last += 1;
            }
            sent
        };
        match sent {
            Ok(()) => {
                self.counters.enqueued.inc();
                self.counters.depth.inc();
                // At or past what the dispatcher waits for (never an exact count: another
                // call may enqueue between this one's send and its look).
                let queued = self.tx.max_capacity() - self.tx.capacity();
                if queued >= self.wanted.load(Ordering::SeqCst) {
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

    /// Events accepted and not yet delivered or given up (queued, or in a batch being
    /// delivered).
    pub(crate) fn depth(&self) -> u64 {
        u64::try_from(self.counters.depth.get()).unwrap_or(0)
    }

    /// Flushes what is queued and in flight within `within`, then stops the tasks. Returns
    /// how many events could not be delivered.
    pub(crate) async fn shutdown(&self, within: Duration) -> u64 {
        let deadline = Instant::now() + within;
        let _ = self.stop.send(Some(deadline));
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut task) = task {
            // The tasks watch the deadline themselves; the extra second covers a send in
            // flight. Aborting the dispatcher aborts its deliveries.
            let limit = within + Duration::from_secs(1);
            if tokio::time::timeout(limit, &mut task).await.is_err() {
                task.abort();
                let _ = task.await;
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
        let tally = self.counters.tally();
        tracing::info!(
            accepted = tally.accepted,
            delivered = tally.delivered,
            undelivered = tally.undelivered,
            refused = tally.refused,
            by_reason = %tally.by_reason,
            lost_at_shutdown = lost,
            "telemetry flushed: every accepted event was delivered or is undelivered under one \
             reason (Epode's drops, rejected batches, retries exhausted, lost at shutdown); \
             refused events never entered the queue (queue full, invalid); the same counts as \
             epode_sidecar_telemetry_*_total"
        );
        lost
    }
}

/// What the dispatcher and its deliveries share.
struct TelemetryCore {
    client: Arc<EpodeClient>,
    settings: QueueSettings,
    counters: Counters,
    drops: Arc<LogSummary>,
    limiter: parking_lot::Mutex<Limiter>,
    stop: watch::Receiver<Option<Instant>>,
}

impl TelemetryCore {
    /// The shutdown deadline, once shutdown has begun.
    fn deadline(&self) -> Option<Instant> {
        *self.stop.borrow()
    }

    fn past_deadline(&self) -> bool {
        self.deadline().is_some_and(|d| Instant::now() >= d)
    }

    fn given_up(&self, reason: &'static str, n: usize) {
        self.counters.drop_n(reason, n);
        self.drops.add(reason, n as u64);
    }

    fn with_limiter<T>(&self, f: impl FnOnce(&mut Limiter) -> T) -> T {
        let mut limiter = self.limiter.lock();
        let out = f(&mut limiter);
        self.counters.show(&limiter);
        out
    }
}

/// A delivery's place in the limit, given back when the delivery ends (or is aborted).
struct Slot {
    shared: Arc<TelemetryCore>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.shared.with_limiter(Limiter::finish);
    }
}

/// Forms batches and starts their deliveries.
struct BatchDispatcher {
    shared: Arc<TelemetryCore>,
    batch_ready: Arc<Notify>,
    wanted: Arc<AtomicUsize>,
    rx: mpsc::Receiver<Queued>,
    stop: watch::Receiver<Option<Instant>>,
    deliveries: JoinSet<()>,
    /// The customers the batches in flight name (a delivery that panicked still gives them
    /// back: they are found by its task id).
    customers: InFlight,
    /// Events taken from the queue that would have closed a cycle of customers between the
    /// batches in flight (with their keys): they go in a later batch, ahead of the queue. At
    /// most as many as the batches in flight may hold: while that many wait here nothing more
    /// is taken from the queue.
    deferred: VecDeque<(Queued, Vec<u64>)>,
}

impl BatchDispatcher {
    fn new(
        shared: Arc<TelemetryCore>,
        batch_ready: Arc<Notify>,
        wanted: Arc<AtomicUsize>,
        rx: mpsc::Receiver<Queued>,
        stop: watch::Receiver<Option<Instant>>,
    ) -> BatchDispatcher {
        BatchDispatcher {
            shared,
            batch_ready,
            wanted,
            rx,
            stop,
            deliveries: JoinSet::new(),
            customers: InFlight::default(),
            deferred: VecDeque::new(),
        }
    }

    async fn run(mut self) {
        let batch_max = self.shared.settings.batch_max.max(1);
        loop {
            // Room for a delivery first, so the batch takes what queued up meanwhile.
            if !self.wait_for_room(false).await {
                break;
            }
            let mut batch = Vec::with_capacity(batch_max);
            let Some(keys) = self.collect(&mut batch, batch_max).await else {
                break;
            };
            // Epode may have asked for a pause while the batch filled.
            if !self.wait_for_room(true).await {
                break;
            }
            // Deferred events may have joined after newer ones: a batch goes in sequence order.
            batch.sort_unstable_by_key(|(sequence, _)| *sequence);
            let events = batch
                .into_iter()
                .map(|(sequence, mut event)| {
                    event.insert("sequence".into(), Value::from(sequence));
                    event
                })
                .collect();
            let slot = Slot {
                shared: self.shared.clone(),
            };
            let id = self.deliveries.spawn(deliver(slot, events)).id();
            self.customers.started(id, keys);
        }
        // What is in flight ends on its own by the deadline; a delivery still running shortly
        // after it is stopped (its events, like a batch not started and what is left
        // queued or deferred, are counted as lost at shutdown).
        let grace = self
            .shared
            .deadline()
            .map(|d| tokio::time::Instant::from(d) + Duration::from_millis(500));
        let deliveries = &mut self.deliveries;
        let all = async { while deliveries.join_next().await.is_some() {} };
        if tokio::time::timeout_at(grace.unwrap_or_else(far_future), all)
            .await
            .is_err()
        {
            self.deliveries.shutdown().await;
        }
    }

    /// Waits until a delivery may start; with `start`, starts it (counted in flight).
    /// False when shutdown's deadline has passed.
    async fn wait_for_room(&mut self, start: bool) -> bool {
        loop {
            while let Some(done) = self.deliveries.try_join_next_with_id() {
                self.ended(done);
            }
            let now = Instant::now();
            let wait = self.shared.with_limiter(|l| {
                if start {
                    l.start(now).map(drop)
                } else {
                    l.check(now)
                }
            });
            let until = match wait {
                Ok(()) => return true,
                Err(Wait::Slot) => None,
                Err(Wait::Until(t)) => Some(t),
            };
            if self.shared.past_deadline() {
                return false;
            }
            let deadline = self.shared.deadline();
            let sleep = |t: Option<Instant>| async move {
                match t {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                Some(done) = self.deliveries.join_next_with_id() => self.ended(done),
                () = sleep(until) => {}
                () = sleep(deadline) => {}
                r = self.stop.changed() => if r.is_err() { return false },
            }
        }
    }

    /// A delivery ended (or panicked): the customers it named are free.
    fn ended(&mut self, done: Result<(tokio::task::Id, ()), tokio::task::JoinError>) {
        let id = match done {
            Ok((id, ())) => id,
            Err(e) => e.id(),
        };
        self.customers.ended(id);
    }

    /// Takes the next batch: deferred events whose customers are free first, then the queue
    /// (waiting for a first event, then up to the flush time for the batch to fill; not at
    /// shutdown). Returns the customer keys the batch names, or None when there is nothing
    /// more to send.
    async fn collect(&mut self, batch: &mut Vec<Queued>, batch_max: usize) -> Option<Vec<u64>> {
        let mut keys = Forming::default();
        let mut flush_at = None;
        let most_deferred = batch_max * self.shared.settings.concurrency.max(1);
        loop {
            self.take_deferred(batch, &mut keys, batch_max);
            if batch.len() == batch_max {
                return Some(InFlight::keys(keys));
            }
            let stopping = self.shared.deadline().is_some();
            if stopping && !self.rx.is_empty() {
                self.take_queued(batch, &mut keys, batch_max).await;
                continue;
            }
            if stopping || self.deferred.len() >= most_deferred {
                if !batch.is_empty() {
                    return Some(InFlight::keys(keys));
                }
                if self.deferred.is_empty() {
                    return None;
                }
                // What waits names customers in flight: wait for a delivery to end.
                tokio::select! {
                    Some(done) = self.deliveries.join_next_with_id() => self.ended(done),
                    r = self.stop.changed() => if r.is_err() { return None },
                }
                continue;
            }
            let deferred = !self.deferred.is_empty();
            if batch.is_empty() {
                let mut incoming = Vec::new();
                tokio::select! {
                    n = self.rx.recv_many(&mut incoming, batch_max) => if n == 0 { return None },
                    // A deferred event may go once a delivery ends.
                    Some(done) = self.deliveries.join_next_with_id(), if deferred => self.ended(done),
                    r = self.stop.changed() => if r.is_err() { return None },
                }
                self.admit(incoming, batch, &mut keys);
                continue;
            }
            // Sleep until the flush time, or until the request path says the queue holds what
            // fills the batch: not woken once per event (each wake is a cross-thread signal).
            // `wanted` is set before the queue is looked at, so an event enqueued meanwhile is
            // seen here or signalled there; a signal left from before is only a reason to look.
            let flush_at = *flush_at.get_or_insert_with(|| {
                tokio::time::Instant::now() + self.shared.settings.flush_every
            });
            let need = batch_max - batch.len();
            self.wanted.store(need, Ordering::SeqCst);
            if self.rx.len() >= need {
                self.wanted.store(usize::MAX, Ordering::SeqCst);
                self.take_queued(batch, &mut keys, batch_max).await;
                continue;
            }
            let flushed = tokio::select! {
                () = tokio::time::sleep_until(flush_at) => true,
                () = self.batch_ready.notified() => false,
                Some(done) = self.deliveries.join_next_with_id(), if deferred => {
                    self.ended(done);
                    false
                }
                _ = self.stop.changed() => false,
            };
            self.wanted.store(usize::MAX, Ordering::SeqCst);
            if flushed {
                self.take_queued(batch, &mut keys, batch_max).await;
                return Some(InFlight::keys(keys));
            }
        }
    }

    /// Takes what the queue holds, up to the batch's room.
    async fn take_queued(&mut self, batch: &mut Vec<Queued>, keys: &mut Forming, batch_max: usize) {
        if batch.len() < batch_max && !self.rx.is_empty() {
            let mut incoming = Vec::new();
            self.rx
                .recv_many(&mut incoming, batch_max - batch.len())
                .await;
            self.admit(incoming, batch, keys);
        }
    }

    /// Moves into the batch the deferred events whose customers are free, oldest first.
    fn take_deferred(&mut self, batch: &mut Vec<Queued>, keys: &mut Forming, batch_max: usize) {
        if self.deferred.is_empty() {
            return;
        }
        let waiting = std::mem::take(&mut self.deferred);
        for (queued, mine) in waiting {
            if batch.len() < batch_max && self.free(&mine, keys) {
                batch.push(queued);
            } else {
                self.deferred.push_back((queued, mine));
            }
        }
    }

    /// Events just taken from the queue join the batch, or wait behind the deferred ones
    /// when a batch in flight names their customer.
    fn admit(&mut self, incoming: Vec<Queued>, batch: &mut Vec<Queued>, keys: &mut Forming) {
        for queued in incoming {
            let mine = customer_keys(&queued.1);
            if self.free(&mine, keys) {
                batch.push(queued);
            } else {
                self.deferred.push_back((queued, mine));
            }
        }
    }

    /// Whether the event may join the batch: see [`customers`].
    fn free(&mut self, mine: &[u64], keys: &mut Forming) -> bool {
        self.customers.admit(keys, mine)
    }
}

/// An instant no wait reaches (a day away).
fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(86_400)
}

/// The request body of a batch, serialised once for all its attempts.
#[derive(serde::Serialize)]
struct BatchBody<'a> {
    events: &'a [Map<String, Value>],
}

/// The batch as request bodies Epode will read whole: halved until each part is at most
/// [`MAX_BATCH_BYTES`] (or a single event). In order, with each part's event count.
fn bodies(batch: Vec<Map<String, Value>>) -> Vec<(usize, Bytes)> {
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
async fn deliver(slot: Slot, batch: Vec<Map<String, Value>>) {
    for (n, body) in bodies(batch) {
        deliver_part(&slot.shared, n, body).await;
    }
    drop(slot);
}

/// Delivers one request body of `n` events, retrying what may be retried, and counts the
/// outcome.
async fn deliver_part(shared: &TelemetryCore, n: usize, body: Bytes) {
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
mod tests;
