//! One client connection's bounds: its time to send a request head once it started one, its
//! idle time between requests, and its place under the connection cap. hyper reads through
//! [`Watched`], which ends the connection (with a 408 where the client may still read it) when
//! a deadline passes; the service marks each request's start and end on the shared
//! [`ConnState`].

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http_body::{Body as HttpBody, Frame};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::body::{Body, BoxError};
use crate::metrics::Metrics;

/// The connections open, and how many may be.
pub(crate) struct Connections {
    open: AtomicUsize,
    cap: usize,
    metrics: Arc<Metrics>,
}

/// One open connection's place under the cap, given back when dropped.
pub(crate) struct Slot(Arc<Connections>);

impl Connections {
    pub(crate) fn new(cap: usize, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Connections {
            open: AtomicUsize::new(0),
            cap,
            metrics,
        })
    }

    /// A place for a new connection, or `None` past the cap.
    pub(crate) fn admit(self: &Arc<Self>) -> Option<Slot> {
        let admitted = self
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.cap).then_some(n + 1)
            })
            .is_ok();
        if !admitted {
            self.metrics.limit("connections");
            return None;
        }
        self.metrics.open_connections.inc();
        Some(Slot(self.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
        self.0.metrics.open_connections.dec();
    }
}

/// What the service tells the connection about its requests.
pub(crate) struct ConnState {
    born: Instant,
    in_progress: AtomicUsize,
    /// Milliseconds after `born` (plus one) when the first byte of the next request head
    /// arrived; 0 while none has.
    head_started: AtomicU64,
    /// Milliseconds after `born` when the connection last became idle.
    idle_since: AtomicU64,
    /// The connection's reader, woken when a request ends so its idle deadline is armed.
    reader: AtomicWaker,
}

impl ConnState {
    fn ms(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A request's head arrived; until [`RequestGuard`] drops, the connection is busy.
    pub(crate) fn request_started(self: &Arc<Self>) -> RequestGuard {
        self.in_progress.fetch_add(1, Ordering::AcqRel);
        self.head_started.store(0, Ordering::Release);
        RequestGuard(self.clone())
    }
}

/// A request in progress on its connection, until its response is sent (or dropped).
pub(crate) struct RequestGuard(Arc<ConnState>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let s = &self.0;
        s.idle_since.store(s.ms(), Ordering::Release);
        s.in_progress.fetch_sub(1, Ordering::AcqRel);
        s.reader.wake();
    }
}

/// A response body that keeps its request marked in progress until it is sent.
pub(crate) fn track(body: Body, guard: RequestGuard) -> Body {
    use http_body_util::BodyExt as _;
    Tracked {
        inner: body,
        _guard: guard,
    }
    .boxed_unsync()
}

struct Tracked {
    inner: Body,
    _guard: RequestGuard,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The deadlines of a connection.
#[derive(Clone, Copy)]
pub(crate) struct Deadlines {
    pub(crate) head: Duration,
    pub(crate) idle: Duration,
}

/// The answer to a client that did not finish its request head in time.
const REQUEST_TIMEOUT: &[u8] = b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: 120\r\nconnection: close\r\n\r\n{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32000,\"message\":\"Request timeout: the request head did not arrive in time\"}}";

/// A connection's IO, ending the connection when a deadline passes.
pub(crate) struct Watched<IO> {
    io: IO,
    state: Arc<ConnState>,
    deadlines: Deadlines,
    sleep: Pin<Box<Sleep>>,
    armed_for: Option<Instant>,
    metrics: Arc<Metrics>,
    _slot: Slot,
    timed_out: bool,
}

impl<IO> Watched<IO> {
    pub(crate) fn new(io: IO, deadlines: Deadlines, slot: Slot, metrics: Arc<Metrics>) -> Self {
        let now = Instant::now();
        Watched {
            io,
            state: Arc::new(ConnState {
                born: now,
                in_progress: AtomicUsize::new(0),
                head_started: AtomicU64::new(0),
                idle_since: AtomicU64::new(0),
                reader: AtomicWaker::new(),
            }),
            deadlines,
            sleep: Box::pin(tokio::time::sleep_until(now + deadlines.idle)),
            armed_for: Some(now + deadlines.idle),
            metrics,
            _slot: slot,
            timed_out: false,
        }
    }

    pub(crate) fn state(&self) -> Arc<ConnState> {
        self.state.clone()
    }

    /// The deadline that applies now, and whether it is the head's (else the idle one).
    fn deadline(&self) -> Option<(Instant, bool)> {
        let s = &self.state;
        if s.in_progress.load(Ordering::Acquire) > 0 {
            return None;
        }
        let at = |ms: u64| s.born + Duration::from_millis(ms);
        match s.head_started.load(Ordering::Acquire) {
            0 => Some((
                at(s.idle_since.load(Ordering::Acquire)) + self.deadlines.idle,
                false,
            )),
            started => Some((at(started - 1) + self.deadlines.head, true)),
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.timed_out {
            return Poll::Ready(Err(io::ErrorKind::TimedOut.into()));
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut self.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = read {
            let s = &self.state;
            if buf.filled().len() > before
                && s.in_progress.load(Ordering::Acquire) == 0
                && s.head_started.load(Ordering::Acquire) == 0
            {
                s.head_started.store(s.ms() + 1, Ordering::Release);
            }
            return read;
        }
        if read.is_ready() {
            return read;
        }
        self.state.reader.register(cx.waker());
        let Some((at, head)) = self.deadline() else {
            return Poll::Pending;
        };
        if self.armed_for != Some(at) {
            self.sleep.as_mut().reset(at);
            self.armed_for = Some(at);
        }
        if self.sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.timed_out = true;
        if head {
            self.metrics.limit("header_timeout");
            // Best effort: the client may still read why.
            let _ = Pin::new(&mut self.io).poll_write(cx, REQUEST_TIMEOUT);
            let _ = Pin::new(&mut self.io).poll_flush(cx);
        } else {
            self.metrics.limit("idle_timeout");
        }
        Poll::Ready(Err(io::ErrorKind::TimedOut.into()))
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_408_body_is_what_its_length_says() {
        let text = std::str::from_utf8(REQUEST_TIMEOUT).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], -32000);
    }
}
