//! Confirmed MCP telemetry: one event per completed product tool call, enqueued in memory (never
//! awaited by the product response) and delivered in order by one background task, in batches
//! of up to 50 every 500 ms, with at most one delivery in flight. A delivery is judged by its
//! receipt; only network failures, timeouts, 408, 429 and 5xx are retried.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, watch};

use super::client::{Answer, EpodeClient, EpodeError};
use crate::feedback::identity::{sanitize_ref, IdentityRefs, RefKind};
use crate::log_summary::LogSummary;

pub const BATCHES_PATH: &str = "/api/v2/telemetry/batches";

/// How the queue behaves; the defaults are the Epode SDKs' documented ones.
#[derive(Debug, Clone)]
pub struct QueueSettings {
    pub capacity: usize,
    pub batch_max: usize,
    pub flush_every: Duration,
    pub max_attempts: u32,
    pub backoff_base: Duration,
    pub attempt_timeout: Duration,
    pub max_retry_after: Duration,
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

/// The outcome of a product tool call, as telemetry sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    /// An `isError` result, an upstream failure, or a JSON-RPC error.
    Error,
}

/// What the caller knows of one completed product tool call.
#[derive(Debug, Clone, Default)]
pub struct McpCompletion {
    pub interaction_id: String,
    pub operation: String,
    pub outcome: Option<Outcome>,
    pub duration: Option<Duration>,
    pub account_ref: Option<String>,
    pub user_ref: Option<String>,
    pub anonymous_ref: Option<String>,
    pub customer_ref: Option<String>,
    pub session_ref: Option<String>,
    pub runtime_hint: Option<String>,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidCompletion {
    #[error("invalid_operation: the tool name is not a valid telemetry operation")]
    Operation,
    #[error("invalid_outcome")]
    Outcome,
}

/// `^[A-Za-z0-9/_:.*{}-]{1,160}$` and no `://` (a raw URL is never an operation).
pub fn valid_operation(op: &str) -> bool {
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

/// The event for a completion: absent fields are omitted, never null or empty.
pub fn build_event(
    c: &McpCompletion,
    sequence: u64,
    occurred_at: SystemTime,
) -> Result<Value, InvalidCompletion> {
    if !valid_operation(&c.operation) {
        return Err(InvalidCompletion::Operation);
    }
    let status = match c.outcome {
        Some(Outcome::Success) => 200,
        Some(Outcome::Error) => 500,
        None => return Err(InvalidCompletion::Outcome),
    };
    let clean = |v: &Option<String>| v.as_deref().and_then(sanitize_ref);
    let mut refs = IdentityRefs {
        account_ref: clean(&c.account_ref),
        user_ref: clean(&c.user_ref),
        anonymous_ref: clean(&c.anonymous_ref),
        customer_ref: clean(&c.customer_ref),
        session_ref: clean(&c.session_ref),
    };
    // The mode's rule was applied by the caller; the conflict rule holds for every event.
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
    e.insert("sequence".into(), Value::from(sequence));
    e.insert("statusCode".into(), Value::from(status));
    if let Some(d) = c.duration {
        e.insert("durationMs".into(), Value::from(d.as_millis() as u64));
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
    Ok(Value::Object(e))
}

/// Counters for operators (exposed on `/metrics`).
#[derive(Debug, Default)]
pub struct Counters {
    pub enqueued: AtomicU64,
    pub delivered: AtomicU64,
    pub retried: AtomicU64,
    pub dropped_queue_full: AtomicU64,
    pub dropped_invalid: AtomicU64,
    pub dropped_by_epode: AtomicU64,
    pub dropped_rejected: AtomicU64,
    pub dropped_retries_exhausted: AtomicU64,
    pub dropped_at_shutdown: AtomicU64,
    pub deliveries_in_flight: AtomicU64,
}

impl Counters {
    fn add(c: &AtomicU64, n: usize) {
        c.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

/// A delivery's verdict, judged from the receipt.
#[derive(Debug, PartialEq, Eq)]
pub enum Delivery {
    Delivered,
    /// Never retried: Epode dropped events, or the receipt or status says the batch is bad.
    Terminal(String),
    Retryable {
        reason: String,
        retry_after: Option<Duration>,
    },
}

/// Success only on 202 with integer `accepted` + `dropped` that account for the batch and
/// `dropped == 0`.
pub fn judge(answer: &Answer, batch_len: usize) -> Delivery {
    match answer.status {
        202 => {
            let receipt = answer.json().unwrap_or(Value::Null);
            let (Some(accepted), Some(dropped)) = (
                receipt.get("accepted").and_then(Value::as_u64),
                receipt.get("dropped").and_then(Value::as_u64),
            ) else {
                return Delivery::Terminal("malformed receipt".to_owned());
            };
            if accepted.checked_add(dropped) != Some(batch_len as u64) {
                return Delivery::Terminal(format!(
                    "the receipt ({accepted} accepted, {dropped} dropped) does not account for the {batch_len} events sent"
                ));
            }
            if dropped > 0 {
                return Delivery::Terminal(format!(
                    "Epode dropped {dropped} of {batch_len} events"
                ));
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
        s => Delivery::Terminal(format!("HTTP {s}")),
    }
}

/// The handle the request path holds: enqueue is a non-blocking push into a bounded channel.
pub struct Telemetry {
    tx: mpsc::UnboundedSender<Value>,
    /// Events accepted and not yet finished with (queued, or in the batch being delivered):
    /// the bound is on this, so memory stays bounded whatever Epode does.
    pending: Arc<AtomicU64>,
    /// Events in the channel, not yet taken into a batch; at a full batch the worker is told.
    queued: Arc<AtomicU64>,
    full: Arc<tokio::sync::Notify>,
    batch_max: u64,
    /// The next sequence number; under a lock with the push, so queue order is sequence order.
    sequence: std::sync::Mutex<u64>,
    pub counters: Arc<Counters>,
    capacity: usize,
    stop: watch::Sender<Option<Instant>>,
    task: tokio::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Dropped events are logged as counted summaries, never one line each.
    drops: Arc<LogSummary>,
    summary_timer: tokio::task::JoinHandle<()>,
}

/// How often dropped telemetry is summarised in the log.
const DROP_SUMMARY_EVERY: Duration = Duration::from_secs(10);

impl Telemetry {
    /// Starts the background delivery task on the current runtime.
    pub fn start(client: Arc<EpodeClient>, settings: QueueSettings) -> Arc<Telemetry> {
        let (tx, rx) = mpsc::unbounded_channel();
        let pending = Arc::new(AtomicU64::new(0));
        let queued = Arc::new(AtomicU64::new(0));
        let full = Arc::new(tokio::sync::Notify::new());
        let (stop, stop_rx) = watch::channel(None);
        let counters = Arc::new(Counters::default());
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
        let worker = Worker {
            drops: drops.clone(),
            client,
            settings: settings.clone(),
            counters: counters.clone(),
            pending: pending.clone(),
            queued: queued.clone(),
            full: full.clone(),
            rx,
            stop: stop_rx,
        };
        let task = tokio::spawn(worker.run());
        Arc::new(Telemetry {
            tx,
            pending,
            queued,
            full,
            batch_max: settings.batch_max.max(1) as u64,
            sequence: std::sync::Mutex::new(0),
            counters,
            capacity: settings.capacity.max(1),
            stop,
            task: tokio::sync::Mutex::new(Some(task)),
            drops,
            summary_timer,
        })
    }

    /// Builds and enqueues the event for a completion; never waits. Invalid completions and a
    /// full queue are counted and logged, not errors for the caller.
    pub fn record(&self, c: &McpCompletion) {
        let mut sequence = self.sequence.lock().unwrap_or_else(|e| e.into_inner());
        let event = match build_event(c, *sequence + 1, SystemTime::now()) {
            Ok(e) => e,
            Err(e) => {
                Counters::add(&self.counters.dropped_invalid, 1);
                self.drops.add(
                    match e {
                        InvalidCompletion::Operation => "invalid_operation",
                        InvalidCompletion::Outcome => "invalid_outcome",
                    },
                    1,
                );
                return;
            }
        };
        if self.pending.load(Ordering::SeqCst) >= self.capacity as u64 {
            Counters::add(&self.counters.dropped_queue_full, 1);
            self.drops.add("queue_full", 1);
            return;
        }
        *sequence += 1;
        self.pending.fetch_add(1, Ordering::SeqCst);
        let queued = self.queued.fetch_add(1, Ordering::SeqCst) + 1;
        let pushed = self.tx.send(event);
        drop(sequence);
        if queued == self.batch_max {
            self.full.notify_one();
        }
        match pushed {
            Ok(()) => Counters::add(&self.counters.enqueued, 1),
            Err(_) => {
                self.pending.fetch_sub(1, Ordering::SeqCst);
                self.queued.fetch_sub(1, Ordering::SeqCst);
                Counters::add(&self.counters.dropped_at_shutdown, 1);
                self.drops.add("shutdown", 1);
            }
        }
    }

    /// Events accepted and not yet delivered or given up.
    pub fn depth(&self) -> usize {
        self.pending.load(Ordering::SeqCst) as usize
    }

    /// Flushes what is queued within `within`, then stops the task. Returns how many events
    /// could not be delivered in time.
    pub async fn shutdown(&self, within: Duration) -> u64 {
        let deadline = Instant::now() + within;
        let _ = self.stop.send(Some(deadline));
        let task = self.task.lock().await.take();
        if let Some(mut task) = task {
            // The worker watches the deadline itself; the extra second covers a send in flight.
            let limit = within + Duration::from_secs(1);
            if tokio::time::timeout(limit, &mut task).await.is_err() {
                task.abort();
            }
        }
        let left = self.depth() as u64;
        if left > 0 {
            Counters::add(&self.counters.dropped_at_shutdown, left as usize);
            self.drops.add("shutdown", left);
        }
        self.summary_timer.abort();
        self.drops.flush();
        Counters::get(&self.counters.dropped_at_shutdown)
    }
}

struct Worker {
    drops: Arc<LogSummary>,
    client: Arc<EpodeClient>,
    settings: QueueSettings,
    counters: Arc<Counters>,
    pending: Arc<AtomicU64>,
    queued: Arc<AtomicU64>,
    full: Arc<tokio::sync::Notify>,
    rx: mpsc::UnboundedReceiver<Value>,
    stop: watch::Receiver<Option<Instant>>,
}

impl Worker {
    fn deadline(&self) -> Option<Instant> {
        *self.stop.borrow()
    }

    async fn run(mut self) {
        loop {
            // Wait for the first event of a batch, or the stop signal.
            let first = if self.deadline().is_some() {
                self.rx.try_recv().ok()
            } else {
                tokio::select! {
                    ev = self.rx.recv() => ev,
                    _ = self.stop.changed() => self.rx.try_recv().ok(),
                }
            };
            let Some(first) = first else {
                if self.deadline().is_some() || self.rx.is_closed() {
                    return;
                }
                continue;
            };
            let mut batch = vec![first];
            self.queued.fetch_sub(1, Ordering::SeqCst);
            // Sleep until the flush time, or until the request path says a full batch is
            // waiting: not woken once per event (each wake is a cross-thread signal).
            if self.deadline().is_none()
                && self.queued.load(Ordering::SeqCst) + 1 < self.settings.batch_max as u64
            {
                let flush_at = tokio::time::Instant::now() + self.settings.flush_every;
                tokio::select! {
                    _ = tokio::time::sleep_until(flush_at) => {}
                    _ = self.full.notified() => {}
                    _ = self.stop.changed() => {}
                }
            }
            while batch.len() < self.settings.batch_max {
                match self.rx.try_recv() {
                    Ok(ev) => {
                        self.queued.fetch_sub(1, Ordering::SeqCst);
                        batch.push(ev);
                    }
                    Err(_) => break,
                }
            }
            let n = batch.len() as u64;
            self.deliver(batch).await;
            self.pending.fetch_sub(n, Ordering::SeqCst);
            if self.deadline().is_some_and(|d| Instant::now() >= d) {
                return;
            }
        }
    }

    async fn deliver(&mut self, batch: Vec<Value>) {
        let n = batch.len();
        let body = json!({ "events": batch });
        self.counters
            .deliveries_in_flight
            .fetch_add(1, Ordering::SeqCst);
        let mut attempt = 1;
        loop {
            let mut timeout = self.settings.attempt_timeout;
            if let Some(d) = self.deadline() {
                timeout = timeout.min(d.saturating_duration_since(Instant::now()));
            }
            let verdict = if timeout.is_zero() {
                Delivery::Retryable {
                    reason: "shutdown deadline".into(),
                    retry_after: None,
                }
            } else {
                match self
                    .client
                    .post_with_key(BATCHES_PATH, &body, timeout)
                    .await
                {
                    Ok(answer) => judge(&answer, n),
                    Err(EpodeError::TooLarge) => {
                        Delivery::Terminal("the receipt is not a receipt".to_owned())
                    }
                    Err(e @ (EpodeError::Timeout(_) | EpodeError::Network(_))) => {
                        Delivery::Retryable {
                            reason: e.to_string(),
                            retry_after: None,
                        }
                    }
                }
            };
            match verdict {
                Delivery::Delivered => {
                    Counters::add(&self.counters.delivered, n);
                    tracing::debug!(events = n, attempt, "telemetry batch delivered");
                    break;
                }
                Delivery::Terminal(reason) => {
                    let (counter, kind) = if reason.starts_with("Epode dropped") {
                        (&self.counters.dropped_by_epode, "epode_dropped")
                    } else {
                        (&self.counters.dropped_rejected, "rejected")
                    };
                    Counters::add(counter, n);
                    tracing::debug!(%reason, events = n, "telemetry batch not accepted; not retried");
                    self.drops.add(kind, n as u64);
                    break;
                }
                Delivery::Retryable {
                    reason,
                    retry_after,
                } => {
                    let backoff = self.settings.backoff_base * 2u32.saturating_pow(attempt - 1);
                    let wait = retry_after
                        .map(|r| r.min(self.settings.max_retry_after))
                        .unwrap_or(backoff);
                    let past_deadline = self.deadline().is_some_and(|d| Instant::now() + wait >= d);
                    if attempt >= self.settings.max_attempts || past_deadline {
                        let (counter, kind) = if past_deadline {
                            (&self.counters.dropped_at_shutdown, "shutdown")
                        } else {
                            (
                                &self.counters.dropped_retries_exhausted,
                                "retries_exhausted",
                            )
                        };
                        Counters::add(counter, n);
                        tracing::debug!(%reason, attempts = attempt, events = n, "telemetry batch given up");
                        self.drops.add(kind, n as u64);
                        break;
                    }
                    Counters::add(&self.counters.retried, 1);
                    tracing::debug!(%reason, attempt, ?wait, "telemetry batch will be retried");
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
            }
        }
        self.counters
            .deliveries_in_flight
            .fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vectors() -> Value {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/epode-protocol-v1/conformance.json"
        );
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    fn completion(input: &Value) -> McpCompletion {
        let s = |k: &str| input.get(k).and_then(Value::as_str).map(str::to_owned);
        McpCompletion {
            interaction_id: "018f1f2e-7b4a-4c12-9c8d-123456789abc".into(),
            operation: s("operation").unwrap_or_default(),
            outcome: match input["outcome"].as_str() {
                Some("success") => Some(Outcome::Success),
                Some("error") => Some(Outcome::Error),
                _ => None,
            },
            duration: None,
            account_ref: s("accountRef"),
            user_ref: s("userRef"),
            anonymous_ref: s("anonymousRef"),
            customer_ref: s("customerRef"),
            session_ref: s("sessionRef"),
            runtime_hint: s("runtimeHint"),
        }
    }

    /// Every `mcpCompletion` vector: the event, less the generated fields, equals the expected
    /// event exactly; invalid inputs produce no event and the expected error kind.
    #[test]
    fn conformance_mcp_completion_vectors() {
        let v = vectors();
        let cases = v["mcpCompletion"]["vectors"].as_array().unwrap();
        assert!(cases.len() >= 11);
        for case in cases {
            let name = case["name"].as_str().unwrap();
            let got = build_event(&completion(&case["input"]), 7, SystemTime::now());
            match case.get("expectedErrorKind").and_then(Value::as_str) {
                Some(kind) => {
                    let err = got.expect_err(name);
                    assert!(err.to_string().starts_with(kind), "{name}: {err}");
                }
                None => {
                    let mut event = got.unwrap_or_else(|e| panic!("{name}: {e}"));
                    let obj = event.as_object_mut().unwrap();
                    for generated in ["interactionId", "sequence", "occurredAt"] {
                        assert!(obj.remove(generated).is_some(), "{name}: {generated}");
                    }
                    assert_eq!(&event, &case["expectedEvent"], "{name}");
                }
            }
        }
    }

    #[test]
    fn events_validate_against_the_batch_schema() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/epode-protocol-v1/telemetry-batch.schema.json"
        );
        let schema: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let validator = jsonschema::validator_for(&schema).unwrap();
        let mut c = completion(
            &json!({"operation":"get_summary","outcome":"error","accountRef":"a_1","sessionRef":"s:1","runtimeHint":"x 1"}),
        );
        c.duration = Some(Duration::from_millis(12));
        let event = build_event(&c, 1, SystemTime::now()).unwrap();
        let batch = json!({"events": [event]});
        assert!(validator.is_valid(&batch), "{batch}");
        assert_eq!(batch["events"][0]["durationMs"], 12);
    }

    fn answer(status: u16, body: &str) -> Answer {
        Answer {
            status,
            headers: Default::default(),
            body: bytes::Bytes::from(body.to_owned()),
        }
    }

    #[test]
    fn receipts_are_judged() {
        assert_eq!(
            judge(&answer(202, r#"{"accepted":3,"dropped":0}"#), 3),
            Delivery::Delivered
        );
        assert!(matches!(
            judge(&answer(202, r#"{"accepted":2,"dropped":1}"#), 3),
            Delivery::Terminal(_)
        ));
        assert!(matches!(
            judge(&answer(202, r#"{"accepted":2,"dropped":0}"#), 3),
            Delivery::Terminal(_)
        ));
        assert!(matches!(
            judge(
                &answer(202, r#"{"accepted":18446744073709551615,"dropped":1}"#),
                3
            ),
            Delivery::Terminal(_)
        ));
        assert!(matches!(
            judge(&answer(202, "ok"), 3),
            Delivery::Terminal(_)
        ));
        assert!(matches!(
            judge(&answer(202, r#"{"accepted":"3","dropped":0}"#), 3),
            Delivery::Terminal(_)
        ));
        assert!(matches!(
            judge(&answer(200, r#"{"accepted":3,"dropped":0}"#), 3),
            Delivery::Terminal(_)
        ));
        for s in [408, 429, 500, 503] {
            assert!(
                matches!(judge(&answer(s, ""), 3), Delivery::Retryable { .. }),
                "{s}"
            );
        }
        for s in [400, 401, 413] {
            assert!(
                matches!(judge(&answer(s, ""), 3), Delivery::Terminal(_)),
                "{s}"
            );
        }
        let mut a = answer(429, "");
        a.headers
            .insert(reqwest::header::RETRY_AFTER, "2".parse().unwrap());
        assert_eq!(
            judge(&a, 1),
            Delivery::Retryable {
                reason: "HTTP 429".into(),
                retry_after: Some(Duration::from_secs(2))
            }
        );
    }

    #[test]
    fn operations() {
        assert!(valid_operation("tools/get_summary"));
        assert!(!valid_operation("get_summary?customer=42"));
        assert!(!valid_operation("https://customer.example/tool"));
        assert!(!valid_operation(""));
        assert!(!valid_operation(&"x".repeat(161)));
    }
}
