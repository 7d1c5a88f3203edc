//! The response body type shared by every path (bytes the sidecar made, or the upstream's body
//! streamed through frame by frame), and a whole answer kept to be passed on as it was.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use http_body::Body as _;
use http_body::Frame;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Empty, Full};

use crate::budget::Reservation;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub(crate) type Body = UnsyncBoxBody<Bytes, BoxError>;

pub(crate) fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Bytes the sidecar made, still counted in the memory budget until they are sent: a large
/// answer until its last byte is written (it may wait in the connection's write buffer for a
/// slow client), a small one until it is handed over.
pub(crate) fn held(bytes: Bytes, reservation: Reservation) -> Body {
    if bytes.len() > crate::budget::SMALL {
        return full(crate::budget::keep(bytes, reservation));
    }
    Held {
        bytes: Some(bytes),
        reservation: Some(reservation),
    }
    .boxed_unsync()
}

struct Held {
    bytes: Option<Bytes>,
    reservation: Option<Reservation>,
}

impl http_body::Body for Held {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let frame = self.bytes.take().map(|b| Ok(Frame::data(b)));
        if frame.is_none() {
            self.reservation = None;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.bytes.is_none()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.bytes.as_ref().map_or(0, |b| b.len() as u64))
    }
}

pub(crate) fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

/// Every answer the sidecar makes itself starts here: its status, its `Content-Type` (none for
/// an answer without a body) and its body, of whatever type the path streams. (An upstream's
/// answer passed on as it was keeps its own head: [`Buffered`].)
pub(crate) fn answer<B>(
    status: StatusCode,
    content_type: Option<&'static str>,
    body: B,
) -> Response<B> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    if let Some(ct) = content_type {
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    }
    resp
}

/// `application/json`.
pub(crate) const JSON: &str = "application/json";

/// A response with a JSON body.
pub(crate) fn json(status: StatusCode, bytes: impl Into<Bytes>) -> Response<Body> {
    answer(status, Some(JSON), full(bytes))
}

/// Whether an answer's body is an event stream (SSE), by its `Content-Type`.
pub(crate) fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"))
}

/// `resp` with `guard` held until its body is over: dropped when its last frame is read (the
/// body says it ended, before the connection writes the end of it, so whoever reads the whole
/// answer finds what the guard records already done), when it fails, or when it is dropped
/// (its client gone): what ends with an answer that streams (its record, its span) ends then.
pub(crate) fn hold_until_end<G: Send + Unpin + 'static>(
    resp: Response<Body>,
    guard: G,
) -> Response<Body> {
    resp.map(|inner| {
        EndsWith {
            inner,
            guard: Some(guard),
        }
        .boxed_unsync()
    })
}

/// A body and what ends with it ([`hold_until_end`]).
struct EndsWith<G> {
    inner: Body,
    guard: Option<G>,
}

impl<G: Unpin> http_body::Body for EndsWith<G> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        let over = match &polled {
            Poll::Ready(None | Some(Err(_))) => true,
            Poll::Ready(Some(Ok(_))) => this.inner.is_end_stream(),
            Poll::Pending => false,
        };
        if over {
            this.guard = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// An event stream the sidecar writes itself (a bridged call's rounds), 200, with no proxy
/// buffering.
pub(crate) fn event_stream(body: Body) -> Response<Body> {
    let mut resp = answer(StatusCode::OK, Some("text/event-stream"), body);
    resp.headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

/// A refusal outside the MCP path (the operations' routes, the local trial's console and its
/// Epode): `{"error": message}`. (A refusal of an MCP message is a JSON-RPC error:
/// `Error::into_response`.)
pub(crate) fn error(status: StatusCode, message: &str) -> Response<Body> {
    json(status, serde_json::json!({ "error": message }).to_string())
}

/// A complete HTTP answer read whole, to be passed on exactly as it was.
#[derive(Debug)]
pub(crate) struct Buffered {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) bytes: Bytes,
}

impl Buffered {
    pub(crate) fn into_response(self) -> Response<Body> {
        let mut resp = Response::new(full(self.bytes));
        *resp.status_mut() = self.status;
        *resp.headers_mut() = self.headers;
        resp.headers_mut().remove(header::CONTENT_LENGTH);
        resp
    }
}

/// The most frames, and bytes, [`coalesced`] holds back to send in one write.
const COALESCE_FRAMES: usize = 16;
/// Scheduler turns a held frame waits for more (measured: the upstream connection's next
/// chunk is ready after two).
const COALESCE_TURNS: u32 = 2;
const COALESCE_BYTES: usize = 64 * 1024;

/// A streamed body whose frames that are ready together leave in one write. The server
/// connection writes what it holds whenever the body is not ready, and an upstream answer
/// read in one go still arrives frame by frame (each chunk handed over by the upstream
/// connection's own task), so an SSE answer of three events cost four writes, each waking
/// the client. Here a frame is held while the upstream connection gets two scheduler turns;
/// what it then has ready joins the same write. A stream that is really waiting loses two
/// turns per burst (microseconds), never more; at most 16 frames, or 64 KiB and the frame
/// that passed it, are held.
/// [`Coalesced::prime`] does the same before the response head goes, so the head leaves with
/// the first events.
pub(crate) fn coalesced(inner: Body) -> Coalesced {
    Coalesced {
        inner,
        held: std::collections::VecDeque::new(),
        held_bytes: 0,
        flushing: false,
        turns: 0,
        started: false,
        last: None,
        ended: false,
    }
}

type Polled = Option<Result<Frame<Bytes>, BoxError>>;

pub(crate) struct Coalesced {
    inner: Body,
    held: std::collections::VecDeque<Frame<Bytes>>,
    held_bytes: usize,
    /// Handing the held frames on, one per poll, without a pause between them.
    flushing: bool,
    /// Scheduler turns given to the upstream connection since the last frame arrived.
    turns: u32,
    /// A frame arrived, or the first wait was already given its turns.
    started: bool,
    /// The end (or an error, or trailers) that came after held frames, passed on after them.
    last: Option<Polled>,
    /// The end was passed on: the inner body is never polled again.
    ended: bool,
}

/// What taking the inner body's ready frames came to.
enum Fill {
    /// What is held goes now.
    Flush,
    /// A turn given to the upstream connection: poll again soon (the waker was woken).
    Turn,
    /// Nothing held, nothing ready: waiting for the upstream.
    Wait,
}

impl Coalesced {
    fn fill(&mut self, cx: &mut Context<'_>) -> Fill {
        loop {
            if self.last.is_some()
                || self.held.len() >= COALESCE_FRAMES
                || self.held_bytes >= COALESCE_BYTES
            {
                return Fill::Flush;
            }
            match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) if frame.is_data() => {
                    self.held_bytes += frame.data_ref().map_or(0, Bytes::len);
                    self.held.push_back(frame);
                    self.turns = 0;
                    self.started = true;
                }
                Poll::Ready(other) => self.last = Some(other),
                Poll::Pending if self.held.is_empty() && self.started => return Fill::Wait,
                Poll::Pending if self.turns < COALESCE_TURNS => {
                    // A turn for the upstream connection (woken already when its data was
                    // taken), then look again. Nothing new is written meanwhile.
                    self.turns += 1;
                    cx.waker().wake_by_ref();
                    return Fill::Turn;
                }
                Poll::Pending => {
                    self.turns = 0;
                    self.started = true;
                    return Fill::Flush;
                }
            }
        }
    }

    /// Takes the first frames the upstream has ready (two turns at most), so the response
    /// head leaves with them.
    pub(crate) async fn prime(mut self) -> Body {
        std::future::poll_fn(|cx| match self.fill(cx) {
            Fill::Turn => Poll::Pending,
            Fill::Flush => {
                self.flushing = true;
                Poll::Ready(())
            }
            Fill::Wait => Poll::Ready(()),
        })
        .await;
        self.boxed_unsync()
    }
}

impl http_body::Body for Coalesced {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if this.ended {
                return Poll::Ready(None);
            }
            if this.flushing {
                if let Some(frame) = this.held.pop_front() {
                    return Poll::Ready(Some(Ok(frame)));
                }
                this.flushing = false;
                this.held_bytes = 0;
                if let Some(last) = this.last.take() {
                    // The end, or an error: nothing is read after either.
                    this.ended = !matches!(last, Some(Ok(_)));
                    return Poll::Ready(last);
                }
            }
            match this.fill(cx) {
                Fill::Flush => this.flushing = true,
                Fill::Turn | Fill::Wait => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || (self.held.is_empty() && self.last.is_none() && self.inner.is_end_stream())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// A body that answers each poll with the next scripted step.
    struct Script(VecDeque<Poll<Polled>>);

    impl http_body::Body for Script {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            self.0.pop_front().expect("polled after its end")
        }
    }

    fn data(s: &'static str) -> Poll<Polled> {
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(s.as_bytes())))))
    }

    /// What each poll of the coalesced script gives, until its end: a frame's text, "…" for
    /// a pause, "!" for an error, "." for the end.
    fn run(script: Vec<Poll<Polled>>) -> Vec<String> {
        let mut body = coalesced(Script(script.into()).boxed_unsync()).boxed_unsync();
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut seen = Vec::new();
        loop {
            let step = Pin::new(&mut body).poll_frame(&mut cx);
            seen.push(match step {
                Poll::Pending => "…".to_owned(),
                Poll::Ready(None) => ".".to_owned(),
                Poll::Ready(Some(Err(_))) => "!".to_owned(),
                Poll::Ready(Some(Ok(f))) => {
                    String::from_utf8(f.into_data().unwrap().to_vec()).unwrap()
                }
            });
            if matches!(seen.last().map(String::as_str), Some("." | "!")) {
                return seen;
            }
        }
    }

    #[test]
    fn nothing_is_read_after_an_error() {
        let broken: Poll<Polled> = Poll::Ready(Some(Err("broke".into())));
        let script = vec![data("a"), broken, data("late")];
        let mut body = coalesced(Script(script.into()).boxed_unsync());
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut poll = || Pin::new(&mut body).poll_frame(&mut cx);
        assert!(matches!(poll(), Poll::Ready(Some(Ok(_)))));
        assert!(matches!(poll(), Poll::Ready(Some(Err(_)))));
        assert!(
            matches!(poll(), Poll::Ready(None)),
            "the frame after the error was read"
        );
        assert!(body.is_end_stream());
    }

    #[test]
    fn frames_ready_together_leave_together() {
        // Ready, ready, a pause the upstream connection's turn fills, ready, end: one pause
        // (the turn), then every frame and the end without another.
        let seen = run(vec![
            data("a"),
            data("b"),
            Poll::Pending,
            data("c"),
            Poll::Ready(None),
        ]);
        assert_eq!(seen, ["…", "a", "b", "c", "."]);
    }

    #[test]
    fn a_waiting_stream_sends_what_it_has_after_two_turns() {
        let seen = run(vec![
            data("a"),
            Poll::Pending,
            Poll::Pending,
            Poll::Pending,
            Poll::Pending,
            data("b"),
            Poll::Ready(None),
        ]);
        assert_eq!(seen, ["…", "…", "a", "…", "b", "."]);
    }

    #[test]
    fn a_slow_first_frame_waits_two_turns_then_the_head_may_go() {
        let seen = run(vec![
            Poll::Pending,
            Poll::Pending,
            Poll::Pending,
            Poll::Pending,
            data("a"),
            Poll::Ready(None),
        ]);
        assert_eq!(seen, ["…", "…", "…", "a", "."]);
    }

    #[test]
    fn an_error_after_held_frames_follows_them() {
        let broken: Poll<Polled> = Poll::Ready(Some(Err("broke".into())));
        assert_eq!(run(vec![data("a"), data("b"), broken]), ["a", "b", "!"]);
        assert_eq!(run(vec![Poll::Ready(None)]), ["."]);
    }

    #[test]
    fn at_most_sixteen_frames_are_held() {
        let mut script: Vec<Poll<Polled>> = (0..20).map(|_| data("x")).collect();
        script.push(Poll::Ready(None));
        let seen = run(script);
        assert_eq!(seen.len(), 21);
        assert!(!seen.contains(&"…".to_owned()));
    }
}
