//! The queue and its dispatcher: the handle the request path holds ([`Telemetry`]: number and
//! enqueue an event without waiting, flush at shutdown) and the [`BatchDispatcher`] task that
//! forms batches (keeping the customers they name out of lock cycles, see
//! [`super::customers`]) and starts a delivery for each as the limit allows.

use opentelemetry::trace::SpanContext;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinSet;

use super::counters::Counters;
use super::customers::{customer_keys, Forming, InFlight};
use super::delivery::{deliver, Slot};
use super::event::{
    build_event, build_http_event, HttpCompletion, InvalidCompletion, McpCompletion, TelemetryEvent,
};
use super::limit::{Limiter, Wait};
use super::shared::{QueueSettings, TelemetryCore};
use crate::epode::client::EpodeClient;
use crate::log_summary::LogSummary;

/// How often dropped telemetry is summarised in the log.
const DROP_SUMMARY_EVERY: Duration = Duration::from_secs(10);

/// An event on its way to the dispatcher, with the sequence number it was given.
/// Its third part is the span of the request it came from, for the delivery's span to link
/// to (with OpenTelemetry on and that span sampled).
type Queued = (u64, TelemetryEvent, Option<SpanContext>);

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
    pub(crate) fn record(&self, mut c: McpCompletion) {
        let link = c.link.take();
        self.enqueue(build_event(c, SystemTime::now()), link);
    }

    /// The same for an instrumented HTTP response, through the same queue.
    pub(crate) fn record_http(&self, c: &HttpCompletion) {
        self.enqueue(build_http_event(c, SystemTime::now()), None);
    }

    fn enqueue(&self, event: Result<TelemetryEvent, InvalidCompletion>, link: Option<SpanContext>) {
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
            let sent = self.tx.try_send((*last + 1, event, link));
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
    fn depth(&self) -> u64 {
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
        // Every accepted event was delivered or is undelivered under one reason (Epode's drops,
        // rejected batches, retries exhausted, lost at shutdown); refused events never entered
        // the queue (full, invalid). The same counts as epode_sidecar_telemetry_*_total.
        tracing::info!(
            accepted = tally.accepted,
            delivered = tally.delivered,
            undelivered = tally.undelivered,
            refused = tally.refused,
            by_reason = %tally.by_reason,
            lost_at_shutdown = lost,
            "telemetry flushed"
        );
        lost
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
            batch.sort_unstable_by_key(|(sequence, _, _)| *sequence);
            let mut links = Vec::new();
            let events = batch
                .into_iter()
                .map(|(sequence, mut event, link)| {
                    event.sequence = Some(sequence);
                    links.extend(link);
                    event
                })
                .collect();
            let slot = Slot {
                shared: self.shared.clone(),
            };
            let id = self.deliveries.spawn(deliver(slot, events, links)).id();
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
