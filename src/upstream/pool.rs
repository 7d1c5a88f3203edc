//! One worker's keep-alive connections to an HTTP upstream: hyper's HTTP/1 connections, each
//! driven by a task on the worker's own event loop, and a stack of the idle ones; and the
//! process's bound on them all ([`ConnectionBound`]), shared by every worker's pool.
//!
//! What hyper-util's general-purpose client did besides (a map of pools keyed by host, a
//! lock taken twice per request, a task spawned per request to wait for the connection to be
//! free again, a request rewritten to origin form) is not needed for one upstream on one
//! thread, and it cost about a tenth of the sidecar's CPU per pass-through request (`perf`).
//!
//! - A request takes the most recently used idle connection (the others age out), else opens
//!   one (DNS through hickory, TCP, TLS when the scheme is `https`).
//! - At most so many connections are open to the upstream from the whole process
//!   (`EPODE_SIDECAR_UPSTREAM_MAX_CONNECTIONS`; each holds a permit until it closes), and at
//!   most [`OPENING`] are being opened at once, so a burst never floods the upstream's accept
//!   queue (a full one drops connection attempts, which the kernel retries after a second).
//!   A request that can take neither an idle connection nor a new one waits, in order of
//!   arrival, for the first connection its worker gets back (warm, ready at once) or a new
//!   one, whichever comes first, up to `EPODE_SIDECAR_UPSTREAM_WAIT`; then [`PoolError::Busy`]
//!   (503) and nothing is sent. While requests wait at the cap in one worker, an idle
//!   connection of another is closed to make room, and a connection another worker gets back
//!   is closed rather than kept idle.
//! - With the HTTP surface on, the cap is shared out (`EPODE_SIDECAR_HTTP_UPSTREAM_SHARE`):
//!   a request holds a place in its path's share ([`Share`]) from before it takes a connection
//!   until it gives the connection back, so the surface's hanging requests never hold more
//!   than its share, and the MCP path always has the rest (and the other way round). The wait
//!   for a place and for a connection is one wait.
//! - The connection goes back when the answer's body has been read to its end (to the first
//!   request waiting for one, else to the idle stack); an answer dropped before its end
//!   closes its connection (HTTP/1 cannot skip the rest).
//! - A request that a reused connection could not carry (the upstream closed it while idle,
//!   the usual race with its keep-alive timeout) is sent again on another: hyper hands the
//!   request back only when none of it was written, so nothing reaches the upstream twice.
//! - Bounded ([`IdleBound`]): at most so many idle connections, each closed after so long
//!   idle (`EPODE_SIDECAR_UPSTREAM_MAX_IDLE`, `EPODE_SIDECAR_UPSTREAM_IDLE_TIMEOUT`).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body::{Body as _, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::oneshot;
use tower_service::Service;

use super::dns::Resolver;
use crate::gate::{Gate, Permit};

/// Connections being opened (resolved, connected, TLS handshaken) at once, per process, at
/// most: enough to open hundreds a second on a LAN, never a flood of SYNs.
pub(crate) const OPENING: usize = 32;

/// How many idle connections a worker keeps, and for how long. The timeout must stay below
/// the upstream's own keep-alive timeout, so a pooled connection is not reused just as the
/// upstream closes it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IdleBound {
    pub(crate) max: usize,
    pub(crate) timeout: Duration,
}

/// How often a worker closes the connections idle past their timeout (at most a second, and
/// more often for a shorter timeout).
fn reap_every(timeout: Duration) -> Duration {
    (timeout / 2).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

pub(crate) type Connector = HttpsConnector<HttpConnector<Resolver>>;
type Sender = http1::SendRequest<Full<Bytes>>;

/// Why a request got no answer.
#[derive(Debug)]
pub(crate) enum PoolError {
    /// No connection could be opened (resolving, connecting, TLS, or the HTTP handshake).
    Connect(String),
    /// The request failed on its connection.
    Request(hyper::Error),
    /// Every connection the process may open (or, with `Some`, every one its path's share
    /// allows) is busy, and none came free within the wait; nothing was sent.
    Busy(Duration, Option<Share>),
}

/// Which path a request to the upstream is for. With the HTTP surface on, each holds at most
/// its own share of the connections, so hanging requests of one never take every connection
/// the other needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Share {
    /// The MCP path (and the sidecar's own requests: readiness, sessions).
    Mcp,
    /// The HTTP surface.
    Surface,
}

/// The process's bound on connections to the upstream, shared by every worker's pool.
pub(crate) struct ConnectionBound {
    /// One place per connection open or being opened, held by its task until it closes.
    open: Gate,
    /// One place per connection being opened.
    opening: Gate,
    wait: Duration,
    /// Requests waiting for a connection now, in every worker.
    waiting: AtomicUsize,
    /// Every worker's pool, so a request waiting at the cap can close another's idle one.
    pools: Mutex<Vec<Weak<PoolInner>>>,
    /// Connections open now (the metrics' gauge).
    gauge: Gauge,
    /// With the HTTP surface on, the connections each path may hold at once (the MCP path's,
    /// the surface's), adding up to the cap; `None`: every connection is the MCP path's.
    shares: Option<[Gate; 2]>,
}

impl ConnectionBound {
    /// At most `max` connections, of which the HTTP surface may hold `surface` at once (when
    /// given: at most `max - 1`) and the MCP path the rest; a request waits up to `wait` for
    /// one; `gauge` counts those open.
    pub(crate) fn new(
        max: usize,
        surface: Option<usize>,
        wait: Duration,
        gauge: Gauge,
    ) -> Arc<Self> {
        let shares = surface.map(|s| {
            let s = s.min(max.saturating_sub(1));
            [Gate::new(max - s), Gate::new(s)]
        });
        Arc::new(ConnectionBound {
            open: Gate::new(max),
            opening: Gate::new(OPENING),
            wait,
            waiting: AtomicUsize::new(0),
            pools: Mutex::new(Vec::new()),
            gauge,
            shares,
        })
    }

    /// The place in its path's share a request holds while it uses a connection (`Ok(None)`
    /// when there are no shares), waiting until `deadline` at most.
    async fn share(
        &self,
        share: Share,
        deadline: tokio::time::Instant,
    ) -> Result<Option<Permit>, PoolError> {
        let Some(shares) = &self.shares else {
            return Ok(None);
        };
        let gate = &shares[share as usize];
        if let Some(permit) = gate.try_enter() {
            return Ok(Some(permit));
        }
        tokio::select! {
            permit = gate.enter() => Ok(permit),
            () = tokio::time::sleep_until(deadline) => Err(PoolError::Busy(self.wait, Some(share))),
        }
    }

    /// The right to open a connection now, if the bounds allow it.
    fn try_slot(&self) -> Option<Slot> {
        let open = self.open.try_enter()?;
        let opening = self.opening.try_enter()?;
        Some(Slot { open, opening })
    }

    /// The right to open a connection, once the bounds allow it (in order of asking).
    async fn slot(&self) -> Option<Slot> {
        let open = self.open.enter().await?;
        let opening = self.opening.enter().await?;
        Some(Slot { open, opening })
    }

    /// Whether requests wait for a connection with every permit taken: a connection no request
    /// of its own worker wants is then better closed than kept idle.
    fn starved(&self) -> bool {
        self.waiting.load(Ordering::Relaxed) > 0 && self.open.full()
    }

    /// Closes one idle connection of another worker's pool, when there is one: its permit
    /// comes free for a request waiting in `mine`.
    fn close_idle_elsewhere(&self, mine: &Arc<PoolInner>) {
        let mut pools = lock(&self.pools);
        pools.retain(|p| p.strong_count() > 0);
        let other = pools
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|p| !Arc::ptr_eq(p, mine))
            .find_map(|p| p.take());
        drop(pools);
        // Dropped here: its task ends the connection, then gives its permit back.
        drop(other);
    }
}

/// A request's count among those waiting, while it waits.
struct Waiting<'a>(&'a ConnectionBound);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The right to open one connection: its permit for as long as it is open, and one of the
/// permits to be opening one.
struct Slot {
    open: Permit,
    opening: Permit,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct Idle {
    sender: Sender,
    since: Instant,
}

#[derive(Default)]
struct Slots {
    idle: Vec<Idle>,
    /// Requests of this worker waiting for a connection, oldest first.
    waiting: VecDeque<oneshot::Sender<Sender>>,
}

struct PoolInner {
    slots: Mutex<Slots>,
    bound: IdleBound,
    gate: Arc<ConnectionBound>,
    /// Whether this pool's reaper task runs.
    reaping: AtomicBool,
}

impl PoolInner {
    /// A connection whose answer ended: to the oldest request waiting for one, else kept idle
    /// (or closed, when another worker's requests wait for room or the idle stack is full).
    fn put(&self, mut sender: Sender) {
        if sender.is_closed() {
            return;
        }
        let mut slots = lock(&self.slots);
        while let Some(waiter) = slots.waiting.pop_front() {
            match waiter.send(sender) {
                Ok(()) => return,
                // That request gave up or took a new connection meanwhile.
                Err(back) => sender = back,
            }
        }
        if self.gate.starved() {
            return;
        }
        if slots.idle.len() >= self.bound.max {
            // Entries expired or closed since the last reap make room first.
            slots.idle.retain(|i| self.usable(i));
        }
        if slots.idle.len() < self.bound.max {
            slots.idle.push(Idle {
                sender,
                since: Instant::now(),
            });
        }
    }

    fn take(&self) -> Option<Sender> {
        let mut slots = lock(&self.slots);
        while let Some(i) = slots.idle.pop() {
            if self.usable(&i) {
                return Some(i.sender);
            }
        }
        None
    }

    /// Puts a request in line for the next connection this worker gets back.
    fn wait_in_line(&self) -> oneshot::Receiver<Sender> {
        let (tx, rx) = oneshot::channel();
        let mut slots = lock(&self.slots);
        // Those that gave up leave their place at the front.
        while slots
            .waiting
            .front()
            .is_some_and(oneshot::Sender::is_closed)
        {
            slots.waiting.pop_front();
        }
        slots.waiting.push_back(tx);
        rx
    }

    /// Drops the connections idle too long or closed by the upstream; what drops a sender
    /// ends its connection's task.
    fn reap(&self) -> usize {
        let mut slots = lock(&self.slots);
        slots.idle.retain(|i| self.usable(i));
        slots.idle.len()
    }

    fn usable(&self, i: &Idle) -> bool {
        !i.sender.is_closed() && i.since.elapsed() < self.bound.timeout
    }
}

/// A connection for one request: one that has carried requests before (it may have been
/// closed since), or one opened for it.
enum Conn {
    Warm(Sender),
    New(Sender),
}

/// One worker's connections to the upstream at `origin` (scheme and authority). Clones share
/// the connections.
#[derive(Clone)]
pub(crate) struct Pool {
    shared: Arc<PoolInner>,
    connector: Connector,
    origin: Uri,
}

impl Pool {
    pub(crate) fn new(
        connector: Connector,
        origin: Uri,
        bound: IdleBound,
        gate: Arc<ConnectionBound>,
    ) -> Self {
        let shared = Arc::new(PoolInner {
            slots: Mutex::new(Slots::default()),
            bound,
            gate: gate.clone(),
            reaping: AtomicBool::new(false),
        });
        lock(&gate.pools).push(Arc::downgrade(&shared));
        Pool {
            shared,
            connector,
            origin,
        }
    }

    /// Idle connections now.
    #[cfg(test)]
    pub(crate) fn idle(&self) -> usize {
        self.shared.reap()
    }

    /// Sends `req` (origin-form URI, `Host` set) for the MCP path and returns the answer's
    /// head; its body streams from the connection, which returns to the pool at the body's end.
    pub(crate) fn send(
        &self,
        req: Request<Full<Bytes>>,
    ) -> impl std::future::Future<Output = Result<Response<PooledBody>, PoolError>> + '_ {
        self.send_for(req, Share::Mcp)
    }

    /// [`Pool::send`] for `share`'s path: the request holds a place in that path's share
    /// until its connection is given back.
    pub(crate) async fn send_for(
        &self,
        mut req: Request<Full<Bytes>>,
        share: Share,
    ) -> Result<Response<PooledBody>, PoolError> {
        // One wait for both the share and a connection.
        let deadline = tokio::time::Instant::now() + self.shared.gate.wait;
        let place = self.shared.gate.share(share, deadline).await?;
        // A connection used before may turn out closed, and then the request comes back
        // unsent. A fresh connection's failure is final.
        loop {
            match self.checkout(deadline).await? {
                Conn::Warm(mut sender) => {
                    if sender.ready().await.is_err() {
                        continue;
                    }
                    match sender.try_send_request(req).await {
                        Ok(resp) => return Ok(self.pooled(resp, sender, place)),
                        Err(mut e) => match e.take_message() {
                            Some(back) => req = back,
                            None => return Err(PoolError::Request(e.into_error())),
                        },
                    }
                }
                Conn::New(mut sender) => {
                    return match sender.send_request(req).await {
                        Ok(resp) => Ok(self.pooled(resp, sender, place)),
                        Err(e) => Err(PoolError::Request(e)),
                    }
                }
            }
        }
    }

    /// An idle connection, else a new one if the bounds allow it now, else the first of a
    /// connection given back and a new one to come, until `deadline`.
    async fn checkout(&self, deadline: tokio::time::Instant) -> Result<Conn, PoolError> {
        if let Some(sender) = self.shared.take() {
            return Ok(Conn::Warm(sender));
        }
        if let Some(slot) = self.shared.gate.try_slot() {
            return self.connect(slot).await.map(Conn::New);
        }
        let gate = &self.shared.gate;
        gate.waiting.fetch_add(1, Ordering::Relaxed);
        let _waiting = Waiting(gate);
        let mut back = self.shared.wait_in_line();
        if gate.open.full() {
            gate.close_idle_elsewhere(&self.shared);
        }
        let slot = tokio::select! {
            biased;
            Ok(sender) = &mut back => return Ok(Conn::Warm(sender)),
            slot = gate.slot() => slot,
            () = tokio::time::sleep_until(deadline) => None,
        };
        // A connection given back meanwhile is taken rather than a new one opened.
        back.close();
        if let Ok(sender) = back.try_recv() {
            return Ok(Conn::Warm(sender));
        }
        match slot {
            Some(slot) => self.connect(slot).await.map(Conn::New),
            None => Err(PoolError::Busy(gate.wait, None)),
        }
    }

    fn pooled(
        &self,
        resp: Response<Incoming>,
        sender: Sender,
        place: Option<Permit>,
    ) -> Response<PooledBody> {
        // After a 101 the connection speaks another protocol: it is never used again.
        if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS {
            drop(sender);
            return resp.map(|body| PooledBody {
                body,
                back: None,
                place,
            });
        }
        resp.map(|body| PooledBody::new(body, sender, &self.shared, place))
    }

    async fn connect(&self, slot: Slot) -> Result<Sender, PoolError> {
        let mut connector = self.connector.clone();
        std::future::poll_fn(|cx| connector.poll_ready(cx))
            .await
            .map_err(|e| PoolError::Connect(chain(e.as_ref())))?;
        let io = connector
            .call(self.origin.clone())
            .await
            .map_err(|e| PoolError::Connect(chain(e.as_ref())))?;
        let (sender, conn) = http1::Builder::new()
            .handshake(io)
            .await
            .map_err(|e| PoolError::Connect(chain(&e)))?;
        let Slot { open, opening } = slot;
        drop(opening);
        let gauge = self.shared.gate.gauge.clone();
        gauge.inc();
        tokio::spawn(async move {
            // An upstream that closes or breaks the connection ends this task; the pool
            // finds the sender closed.
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream connection ended");
            }
            // Only once its socket is closed may another connection open.
            gauge.dec();
            drop(open);
        });
        self.start_reaper();
        Ok(sender)
    }

    fn start_reaper(&self) {
        // With no idle connection kept there is nothing to reap.
        if self.shared.bound.max == 0 || self.shared.reaping.swap(true, Ordering::Relaxed) {
            return;
        }
        let weak: Weak<PoolInner> = Arc::downgrade(&self.shared);
        let every = reap_every(self.shared.bound.timeout);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(shared) = weak.upgrade() else { return };
                shared.reap();
            }
        });
    }
}

/// The error and its causes on one line, so "connection refused" is visible.
pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let s = c.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = c.source();
    }
    out
}

/// An answer's body that gives its connection back to the pool once read to its end.
pub(crate) struct PooledBody {
    body: Incoming,
    back: Option<(Sender, Weak<PoolInner>)>,
    /// The request's place in its path's share: given back with the connection (or when the
    /// body is dropped, which closes it).
    place: Option<Permit>,
}

impl PooledBody {
    fn new(body: Incoming, sender: Sender, shared: &Arc<PoolInner>, place: Option<Permit>) -> Self {
        let mut b = PooledBody {
            body,
            back: Some((sender, Arc::downgrade(shared))),
            place,
        };
        // An empty body (a 202, say) may never be read.
        if b.body.is_end_stream() {
            b.give_back();
        }
        b
    }

    fn give_back(&mut self) {
        // The place in the share goes with the connection.
        self.place = None;
        if let Some((sender, shared)) = self.back.take() {
            if let Some(shared) = shared.upgrade() {
                shared.put(sender);
            }
        }
    }
}

impl http_body::Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => this.give_back(),
            Poll::Ready(Some(Ok(_))) if this.body.is_end_stream() => this.give_back(),
            // An error ends the connection; its sender is dropped with this body.
            Poll::Ready(Some(Err(_))) => {
                this.back = None;
                this.place = None;
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests;
