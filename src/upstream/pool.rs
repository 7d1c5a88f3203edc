//! One worker's keep-alive connections to an HTTP upstream: hyper's HTTP/1 connections, each
//! driven by a task on the worker's own event loop, and a stack of the idle ones.
//!
//! What hyper-util's general-purpose client did besides (a map of pools keyed by host, a
//! lock taken twice per request, a task spawned per request to wait for the connection to be
//! free again, a request rewritten to origin form) is not needed for one upstream on one
//! thread, and it cost about a tenth of the sidecar's CPU per pass-through request (`perf`).
//!
//! - A request takes the most recently used idle connection (the others age out), else opens
//!   one (DNS through hickory, TCP, TLS when the scheme is `https`).
//! - The connection goes back when the answer's body has been read to its end; an answer
//!   dropped before its end closes its connection (HTTP/1 cannot skip the rest).
//! - A request that a reused connection could not carry (the upstream closed it while idle,
//!   the usual race with its keep-alive timeout) is sent again on another: hyper hands the
//!   request back only when none of it was written, so nothing reaches the upstream twice.
//! - Bounded ([`IdleBound`]): at most so many idle connections, each closed after so long
//!   idle (`EPODE_SIDECAR_UPSTREAM_MAX_IDLE`, `EPODE_SIDECAR_UPSTREAM_IDLE_TIMEOUT`).

use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
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
use tower_service::Service;

use super::dns::Resolver;

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
}

struct Idle {
    sender: Sender,
    since: Instant,
}

struct Shared {
    idle: Mutex<Vec<Idle>>,
    bound: IdleBound,
    /// Whether this pool's reaper task runs.
    reaping: std::sync::atomic::AtomicBool,
}

impl Shared {
    fn put(&self, sender: Sender) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() >= self.bound.max {
            // Entries expired or closed since the last reap make room first.
            idle.retain(|i| self.usable(i));
        }
        if idle.len() < self.bound.max {
            idle.push(Idle {
                sender,
                since: Instant::now(),
            });
        }
    }

    fn take(&self) -> Option<Sender> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(i) = idle.pop() {
            if self.usable(&i) {
                return Some(i.sender);
            }
        }
        None
    }

    /// Drops the connections idle too long or closed by the upstream; what drops a sender
    /// ends its connection's task.
    fn reap(&self) -> usize {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        idle.retain(|i| self.usable(i));
        idle.len()
    }

    fn usable(&self, i: &Idle) -> bool {
        !i.sender.is_closed() && i.since.elapsed() < self.bound.timeout
    }
}

/// One worker's connections to the upstream at `origin` (scheme and authority). Clones share
/// the connections.
#[derive(Clone)]
pub(crate) struct Pool {
    shared: Arc<Shared>,
    connector: Connector,
    origin: Uri,
}

impl Pool {
    pub(crate) fn new(connector: Connector, origin: Uri, bound: IdleBound) -> Self {
        Pool {
            shared: Arc::new(Shared {
                idle: Mutex::new(Vec::new()),
                bound,
                reaping: std::sync::atomic::AtomicBool::new(false),
            }),
            connector,
            origin,
        }
    }

    /// Idle connections now.
    #[cfg(test)]
    pub(crate) fn idle(&self) -> usize {
        self.shared.reap()
    }

    /// Sends `req` (origin-form URI, `Host` set) and returns the answer's head; its body
    /// streams from the connection, which returns to the pool at the body's end.
    pub(crate) async fn send(
        &self,
        mut req: Request<Full<Bytes>>,
    ) -> Result<Response<PooledBody>, PoolError> {
        // Idle connections first: each may turn out closed, and then the request comes back
        // unsent. A fresh connection's failure is final.
        while let Some(mut sender) = self.shared.take() {
            if sender.ready().await.is_err() {
                continue;
            }
            match sender.try_send_request(req).await {
                Ok(resp) => return Ok(self.pooled(resp, sender)),
                Err(mut e) => match e.take_message() {
                    Some(back) => req = back,
                    None => return Err(PoolError::Request(e.into_error())),
                },
            }
        }
        let mut sender = self.connect().await?;
        match sender.send_request(req).await {
            Ok(resp) => Ok(self.pooled(resp, sender)),
            Err(e) => Err(PoolError::Request(e)),
        }
    }

    fn pooled(&self, resp: Response<Incoming>, sender: Sender) -> Response<PooledBody> {
        resp.map(|body| PooledBody::new(body, sender, &self.shared))
    }

    async fn connect(&self) -> Result<Sender, PoolError> {
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
        tokio::spawn(async move {
            // An upstream that closes or breaks the connection ends this task; the pool
            // finds the sender closed.
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream connection ended");
            }
        });
        self.start_reaper();
        Ok(sender)
    }

    fn start_reaper(&self) {
        use std::sync::atomic::Ordering;
        // With no idle connection kept there is nothing to reap.
        if self.shared.bound.max == 0 || self.shared.reaping.swap(true, Ordering::Relaxed) {
            return;
        }
        let weak: Weak<Shared> = Arc::downgrade(&self.shared);
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
    back: Option<(Sender, Weak<Shared>)>,
}

impl PooledBody {
    fn new(body: Incoming, sender: Sender, shared: &Arc<Shared>) -> Self {
        let mut b = PooledBody {
            body,
            back: Some((sender, Arc::downgrade(shared))),
        };
        // An empty body (a 202, say) may never be read.
        if b.body.is_end_stream() {
            b.give_back();
        }
        b
    }

    fn give_back(&mut self) {
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
            Poll::Ready(Some(Err(_))) => this.back = None,
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
