//! One client connection's bounds: its time to send a request head (the first one counted
//! from accept, a later one from its first byte), its idle time between requests, its time
//! to take a write that makes no progress (a client that does not read), and its place under
//! its listener's share of the connection cap. hyper reads and writes through [`Watched`],
//! which ends the connection (with a 408 where the client may still read it) when a deadline
//! passes, and tells a client that half-closed after its request from one that left
//! ([`HalfClosed`]); the service marks each request's start and end on the shared
//! [`ConnState`], and each response body goes out in chunks of at most [`CHUNK`] bytes
//! ([`track`]), so what hyper holds for a slow client stays small.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

use crate::body::{Body, BoxError};
use crate::budget::{self, MemoryBudget};
use crate::error::{Error, ErrorKind};
use crate::gate::Permit;
use crate::metrics::{LimitKind, Metrics};

/// The largest piece of a response body handed to hyper at once. hyper asks for the next
/// piece only when its write buffer has room, so a client that reads slowly (or not at all)
/// leaves at most about this much (plus the buffer's own limit) in hyper's hands; the rest
/// stays in the body, where the memory budget counts it.
pub(crate) const CHUNK: usize = budget::SMALL;

/// What the service tells the connection about its requests.
pub(crate) struct ConnState {
    /// When the connection was accepted.
    born: Instant,
    in_progress: AtomicUsize,
    /// Milliseconds after `born` (plus one) when the next request head started: its first
    /// byte, or for the connection's first request, the accept; 0 while none has.
    head_started: AtomicU64,
    /// Milliseconds after `born` when the connection last became idle.
    idle_since: AtomicU64,
    /// The connection's reader, woken when a request ends so its idle deadline is armed.
    reader: AtomicWaker,
    /// HTTP/2 answers that handed a frame and wait for the connection to ask for the next:
    /// while any does, the connection must take one within the idle time (flow control
    /// held shut by a client that does not read stalls no write, only this).
    awaiting: AtomicUsize,
    /// Milliseconds after `born` when an HTTP/2 answer last handed a frame.
    handed_at: AtomicU64,
    /// Told when the connection is to close once its requests are done.
    closing: Notify,
    /// Requests started (to tell whether the current one's answer has begun).
    requests: AtomicU64,
    /// The current request is HTTP/1.1 (it may be sent an interim answer).
    http11: AtomicBool,
}

impl ConnState {
    fn ms(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The connection is to close once its requests are done (HTTP/2; an HTTP/1 answer
    /// says `Connection: close` itself).
    pub(crate) fn close_when_done(&self) {
        self.closing.notify_one();
    }

    /// Completes when the connection is to close.
    pub(crate) async fn closing(&self) {
        self.closing.notified().await;
    }

    /// A request's head arrived; until [`RequestGuard`] drops, the connection is busy.
    pub(crate) fn request_started(self: &Arc<Self>, http11: bool) -> RequestGuard {
        self.in_progress.fetch_add(1, Ordering::AcqRel);
        self.head_started.store(0, Ordering::Release);
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.http11.store(http11, Ordering::Relaxed);
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

/// A response body that keeps its request marked in progress until it is sent, and hands it
/// to hyper in pieces of at most [`CHUNK`] bytes (zero-copy: each piece shares the frame's
/// memory). With `counted` (an HTTP/2 stream, whose connection may hold many answers at
/// once), every piece is counted in that budget until its last byte is written.
pub(crate) fn track(body: Body, guard: RequestGuard, counted: Option<Arc<MemoryBudget>>) -> Body {
    use http_body_util::BodyExt as _;
    Tracked {
        inner: body,
        rest: Bytes::new(),
        counted,
        awaiting: false,
        guard,
    }
    .boxed_unsync()
}

struct Tracked {
    inner: Body,
    /// What is left of a frame larger than a chunk.
    rest: Bytes,
    counted: Option<Arc<MemoryBudget>>,
    /// (HTTP/2) A frame was handed and the connection has not asked for the next yet.
    awaiting: bool,
    guard: RequestGuard,
}

impl Tracked {
    fn piece(&mut self, mut data: Bytes) -> Frame<Bytes> {
        if data.len() > CHUNK {
            self.rest = data.split_off(CHUNK);
        }
        let Some(budget) = &self.counted else {
            return Frame::data(data);
        };
        let s = &self.guard.0;
        s.handed_at.store(s.ms(), Ordering::Release);
        if !self.awaiting {
            self.awaiting = true;
            if s.awaiting.fetch_add(1, Ordering::AcqRel) == 0 {
                s.reader.wake();
            }
        }
        Frame::data(budget::counted(budget, data))
    }

    /// The connection asked for more (or the answer is gone).
    fn asked(&mut self) {
        if self.awaiting {
            self.awaiting = false;
            self.guard.0.awaiting.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.asked();
    }
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.asked();
        if !self.rest.is_empty() {
            let rest = std::mem::take(&mut self.rest);
            return Poll::Ready(Some(Ok(self.piece(rest))));
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => Poll::Ready(Some(Ok(self.piece(data)))),
                Err(frame) => Poll::Ready(Some(Ok(frame))),
            },
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let rest = self.rest.len() as u64;
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + rest);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + rest);
        }
        hint
    }
}

/// The deadlines of a connection.
#[derive(Clone, Copy)]
pub(crate) struct Deadlines {
    /// For a request head: from accept for the first, from its first byte for a later one.
    pub(crate) head: Duration,
    /// Between requests; and for a write that makes no progress (a client that does not read).
    pub(crate) idle: Duration,
}

/// The 408 written below hyper when a request head does not arrive in time: the one error
/// builder's answer (`Error::into_response`'s status and body), as bytes for the socket.
fn request_timeout() -> &'static [u8] {
    static BYTES: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BYTES.get_or_init(|| {
        let e = Error::new(ErrorKind::RequestTimeout, "the request head did not arrive in time");
        let body = e.body(None);
        let status = e.status();
        let mut bytes = format!(
            "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            status.as_u16(),
            status.canonical_reason().unwrap_or_default(),
            body.len()
        )
        .into_bytes();
        bytes.extend_from_slice(&body);
        bytes
    })
}

/// What a connection's read-side deadline bounds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Due {
    /// A request head.
    Head,
    /// The time between requests.
    Idle,
    /// An HTTP/2 answer's next frame, which the connection must take (a client that does not
    /// read holds the flow-control window shut).
    Taken,
}

/// What a connection runs on: plain TCP, or TLS over it.
pub(crate) trait ClientStream: AsyncRead + AsyncWrite + Unpin {
    /// Whether a client's end of stream before its answer is probed as a possible half-close
    /// (plain TCP: a reset tells a client gone for good; TLS hides it).
    const PROBES: bool = false;

    /// Whether the peer has reset the connection (since the last call).
    fn reset_by_peer(&self) -> bool {
        false
    }
}

impl ClientStream for tokio::net::TcpStream {
    const PROBES: bool = true;

    fn reset_by_peer(&self) -> bool {
        // A reset after the peer's end of stream is never reported by a read, only here.
        matches!(self.take_error(), Ok(Some(_)))
    }
}

impl ClientStream for tokio_rustls::server::TlsStream<tokio::net::TcpStream> {}

/// The first bytes of an HTTP/2 connection (its preface).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0";

/// A connection's IO, ending the connection when a deadline passes.
pub(crate) struct Watched<IO> {
    io: IO,
    state: Arc<ConnState>,
    deadlines: Deadlines,
    sleep: Pin<Box<Sleep>>,
    armed_for: Option<Instant>,
    /// When a connection that has sent nothing yet is closed.
    first_head: Instant,
    /// Armed while a write makes no progress; made at the first such write.
    stall: Option<Pin<Box<Sleep>>>,
    stalled: bool,
    /// Any byte arrived (a connection that never sent one gets no 408: there is no request
    /// to answer).
    spoke: bool,
    /// An HTTP/2 connection: bytes between requests (pings, settings) start no head, and a
    /// deadline closes it without an HTTP/1 answer.
    h2: bool,
    /// `state.requests` when the connection last wrote.
    wrote_for: u64,
    /// Everything hyper handed over was flushed: an interim answer may go in between.
    flushed: bool,
    /// Bytes of [`PROBE`] still to be written before anything else.
    probe_left: usize,
    half_closed: Option<HalfClosed>,
    metrics: Arc<Metrics>,
    /// Its place under its listener's share of the connection cap.
    _place: Permit,
    timed_out: bool,
}

/// The interim answer sent to a client whose end of stream arrived before its answer: one
/// that only shut its sending side reads past it (an HTTP/1.1 client must take any 1xx before
/// the final answer); a socket closed for good answers it with a reset, which a recheck finds
/// (the socket's pending error), and the request is then cancelled as when a client leaves.
const PROBE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// When a half-closed connection is checked for a reset, after the probe.
const RECHECKS: [Duration; 5] = [
    Duration::from_millis(20),
    Duration::from_millis(100),
    Duration::from_millis(400),
    Duration::from_millis(1500),
    Duration::from_secs(5),
];

/// A client ended its side after a complete request: its end is kept from hyper (which
/// would take it for the client leaving) until its answer is sent.
struct HalfClosed {
    checks: usize,
    recheck: Pin<Box<Sleep>>,
}

impl<IO> Watched<IO> {
    /// `accepted`: when the connection was accepted (its first head deadline counts from it,
    /// TLS handshake included).
    pub(crate) fn new(
        io: IO,
        deadlines: Deadlines,
        place: Permit,
        metrics: Arc<Metrics>,
        accepted: Instant,
    ) -> Self {
        // Silent, a new connection is also idle: whichever deadline is nearer applies.
        let first_head = accepted + deadlines.head.min(deadlines.idle);
        Watched {
            io,
            state: Arc::new(ConnState {
                born: accepted,
                in_progress: AtomicUsize::new(0),
                head_started: AtomicU64::new(1),
                idle_since: AtomicU64::new(0),
                reader: AtomicWaker::new(),
                awaiting: AtomicUsize::new(0),
                handed_at: AtomicU64::new(0),
                closing: Notify::new(),
                requests: AtomicU64::new(0),
                http11: AtomicBool::new(false),
            }),
            deadlines,
            sleep: Box::pin(tokio::time::sleep_until(first_head)),
            armed_for: Some(first_head),
            first_head,
            stall: None,
            stalled: false,
            spoke: false,
            h2: false,
            wrote_for: 0,
            flushed: true,
            probe_left: 0,
            half_closed: None,
            metrics,
            _place: place,
            timed_out: false,
        }
    }

    pub(crate) fn state(&self) -> Arc<ConnState> {
        self.state.clone()
    }

    /// The deadline that applies now, and what it bounds.
    fn deadline(&self) -> Option<(Instant, Due)> {
        let s = &self.state;
        if !self.spoke {
            return Some((self.first_head, Due::Head));
        }
        let at = |ms: u64| s.born + Duration::from_millis(ms);
        if s.in_progress.load(Ordering::Acquire) > 0 {
            if s.awaiting.load(Ordering::Acquire) > 0 {
                let handed = at(s.handed_at.load(Ordering::Acquire));
                return Some((handed + self.deadlines.idle, Due::Taken));
            }
            return None;
        }
        match s.head_started.load(Ordering::Acquire) {
            0 => Some((
                at(s.idle_since.load(Ordering::Acquire)) + self.deadlines.idle,
                Due::Idle,
            )),
            started => Some((at(started - 1) + self.deadlines.head, Due::Head)),
        }
    }

    /// Bytes arrived (`fresh`, where the read put them).
    fn arrived(&mut self, fresh: &[u8]) {
        let s = &self.state;
        if !self.spoke {
            self.spoke = true;
            if fresh.starts_with(H2_PREFACE) {
                // HTTP/2: the connection is idle until its first stream.
                self.h2 = true;
                s.head_started.store(0, Ordering::Release);
            }
            return;
        }
        if !self.h2
            && s.in_progress.load(Ordering::Acquire) == 0
            && s.head_started.load(Ordering::Acquire) == 0
        {
            s.head_started.store(s.ms() + 1, Ordering::Release);
        }
    }
}

impl<IO: AsyncWrite + Unpin> Watched<IO> {
    /// The read side's deadline passed: the connection ends, with a 408 for an HTTP/1 client
    /// that started a head.
    fn read_deadline_passed(&mut self, cx: &mut Context<'_>, due: Due) -> io::Error {
        self.timed_out = true;
        match due {
            Due::Head => {
                self.metrics.limit(LimitKind::HeaderTimeout);
                if self.spoke && !self.h2 {
                    // Best effort: the client may still read why.
                    let _ = Pin::new(&mut self.io).poll_write(cx, request_timeout());
                    let _ = Pin::new(&mut self.io).poll_flush(cx);
                }
            }
            Due::Idle => self.metrics.limit(LimitKind::IdleTimeout),
            Due::Taken => self.metrics.limit(LimitKind::WriteTimeout),
        }
        io::ErrorKind::TimedOut.into()
    }

    /// A write's outcome: bytes taken count for the request being answered.
    fn wrote(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        if let Poll::Ready(Ok(n)) = polled {
            if n > 0 {
                self.wrote_for = self.state.requests.load(Ordering::Relaxed);
            }
        }
        self.written(cx, polled)
    }

    /// A write (or flush) came back: progress clears the stall; none arms its deadline, and
    /// past it the connection ends.
    fn written<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.stalled = false;
            return polled;
        }
        if !self.stalled {
            self.stalled = true;
            let at = Instant::now() + self.deadlines.idle;
            match &mut self.stall {
                Some(stall) => stall.as_mut().reset(at),
                None => self.stall = Some(Box::pin(tokio::time::sleep_until(at))),
            }
        }
        let Some(stall) = &mut self.stall else {
            return Poll::Pending;
        };
        if stall.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.timed_out = true;
        self.metrics.limit(LimitKind::WriteTimeout);
        Poll::Ready(Err(io::ErrorKind::TimedOut.into()))
    }
}

impl<IO: ClientStream> Watched<IO> {
    /// The client's end of stream arrived: whether it is kept from hyper as a half-close (an
    /// HTTP/1.1 request on plain TCP whose answer has not begun, with nothing of hyper's
    /// waiting to be written). Then the probe goes out.
    fn hides_end(&mut self, cx: &mut Context<'_>) -> bool {
        let s = &self.state;
        if !IO::PROBES
            || self.h2
            || !self.flushed
            || s.in_progress.load(Ordering::Acquire) == 0
            || !s.http11.load(Ordering::Relaxed)
            || self.wrote_for == s.requests.load(Ordering::Relaxed)
        {
            return false;
        }
        self.probe_left = PROBE.len();
        if let Poll::Ready(Err(_)) = self.poll_probe(cx) {
            return false;
        }
        tracing::debug!("the client ended its side before its answer; answering it");
        self.half_closed = Some(HalfClosed {
            checks: 0,
            recheck: Box::pin(tokio::time::sleep(RECHECKS[0])),
        });
        true
    }

    /// A half-closed connection's read: its end once the answer is sent; before, a reset
    /// (the client left for good) once a recheck finds one.
    fn poll_half_closed(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.state.reader.register(cx.waker());
        if self.state.in_progress.load(Ordering::Acquire) == 0 {
            self.half_closed = None;
            return Poll::Ready(Ok(()));
        }
        let Some(half) = self.half_closed.as_mut() else {
            return Poll::Pending;
        };
        while half.checks < RECHECKS.len() {
            if half.recheck.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if self.io.reset_by_peer() {
                self.half_closed = None;
                return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
            }
            half.checks += 1;
            if let Some(next) = RECHECKS.get(half.checks) {
                half.recheck.as_mut().reset(Instant::now() + *next);
            }
        }
        Poll::Pending
    }

    /// Writes what is left of the probe, before anything of hyper's.
    fn poll_probe(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.probe_left > 0 {
            let from = PROBE.len() - self.probe_left;
            match Pin::new(&mut self.io).poll_write(cx, &PROBE[from..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => self.probe_left -= n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Before a write of hyper's: the rest of the probe; `Some` to return at once.
    fn before_write<T>(&mut self, cx: &mut Context<'_>) -> Option<Poll<io::Result<T>>> {
        if self.timed_out {
            return Some(Poll::Ready(Err(io::ErrorKind::TimedOut.into())));
        }
        if self.probe_left == 0 {
            return None;
        }
        match self.poll_probe(cx) {
            Poll::Ready(Ok(())) => None,
            Poll::Ready(Err(e)) => Some(Poll::Ready(Err(e))),
            Poll::Pending => Some(self.written(cx, Poll::Pending)),
        }
    }
}

impl<IO: ClientStream> AsyncRead for Watched<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.timed_out {
            return Poll::Ready(Err(io::ErrorKind::TimedOut.into()));
        }
        if self.half_closed.is_some() {
            return self.poll_half_closed(cx);
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut self.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = read {
            if buf.filled().len() > before {
                self.arrived(&buf.filled()[before..]);
            } else if self.hides_end(cx) {
                return self.poll_half_closed(cx);
            }
            return read;
        }
        if read.is_ready() {
            return read;
        }
        self.state.reader.register(cx.waker());
        let Some((at, due)) = self.deadline() else {
            return Poll::Pending;
        };
        if self.armed_for != Some(at) {
            self.sleep.as_mut().reset(at);
            self.armed_for = Some(at);
        }
        if self.sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        Poll::Ready(Err(self.read_deadline_passed(cx, due)))
    }
}

impl<IO: ClientStream> AsyncWrite for Watched<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Some(early) = self.before_write(cx) {
            return early;
        }
        self.flushed = false;
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.wrote(cx, polled)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(early) = self.before_write(cx) {
            return early;
        }
        let polled = Pin::new(&mut self.io).poll_flush(cx);
        if let Poll::Ready(Ok(())) = polled {
            self.flushed = true;
        }
        self.written(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_shutdown(cx);
        self.written(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Some(early) = self.before_write(cx) {
            return early;
        }
        self.flushed = false;
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.wrote(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard() -> RequestGuard {
        Arc::new(ConnState {
            born: Instant::now(),
            in_progress: AtomicUsize::new(0),
            head_started: AtomicU64::new(0),
            idle_since: AtomicU64::new(0),
            reader: AtomicWaker::new(),
            awaiting: AtomicUsize::new(0),
            handed_at: AtomicU64::new(0),
            closing: Notify::new(),
            requests: AtomicU64::new(0),
            http11: AtomicBool::new(false),
        })
        .request_started(true)
    }

    /// The frames a body hands over, until its end.
    fn frames(mut body: Body) -> Vec<Bytes> {
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut out = Vec::new();
        while let Poll::Ready(Some(frame)) = Pin::new(&mut body).poll_frame(&mut cx) {
            out.push(frame.unwrap().into_data().unwrap());
        }
        out
    }

    #[test]
    fn an_answer_goes_to_the_connection_in_chunks_that_share_its_memory() {
        let whole = Bytes::from(vec![7u8; 3 * CHUNK + 10]);
        let body = track(crate::body::full(whole.clone()), guard(), None);
        assert_eq!(body.size_hint().exact(), Some(whole.len() as u64));
        let pieces = frames(body);
        assert_eq!(
            pieces.iter().map(Bytes::len).collect::<Vec<_>>(),
            [CHUNK, CHUNK, CHUNK, 10]
        );
        let start = whole.as_ptr() as usize;
        for (i, p) in pieces.iter().enumerate() {
            assert_eq!(p.as_ptr() as usize, start + i * CHUNK, "copied");
        }
        // A small answer is handed over as it is.
        let small = Bytes::from_static(b"{}");
        assert_eq!(
            frames(track(crate::body::full(small.clone()), guard(), None)),
            [small]
        );
    }

    #[test]
    fn http2_frames_stay_counted_until_written() {
        let budget = MemoryBudget::new(1 << 30);
        let body = track(
            crate::body::full(Bytes::from(vec![1u8; CHUNK + 1])),
            guard(),
            Some(budget.clone()),
        );
        let pieces = frames(body);
        assert_eq!(budget.used(), CHUNK + 1, "handed over, not yet written");
        drop(pieces);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn the_408_body_is_what_its_length_says() {
        let text = std::str::from_utf8(request_timeout()).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 408 Request Timeout\r\n"),
            "{text}"
        );
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], -32000);
    }
}
