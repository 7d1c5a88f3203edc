//! Server-sent events, streamed: the upstream's body is split into events as bytes arrive (in
//! linear time: scanning resumes where it stopped); every event goes on to the client as soon
//! as it is complete (events that arrive together leave in one write: [`Coalesced`]), as it
//! was, except the JSON-RPC response, which the request's [`ResultPlan`] may rewrite.
//! Dropping the resulting body (the client went away) drops the upstream's and abandons the
//! plan.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use futures_util::stream;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use serde_json::value::RawValue;

use super::raw::{self, RawMap};
use super::rewrite::ResultPlan;
use crate::body::{BoxError, Coalesced};
use crate::budget::Reservation;
use crate::error::{Error, ErrorKind};
use crate::metrics::LimitKind;

/// Splits a byte stream into SSE event blocks (each with its terminating blank line).
pub(crate) struct EventSplitter {
    buf: BytesMut,
    /// How far `buf` has been scanned (bytes before it hold no event end).
    pos: usize,
    /// Whether `pos` is at the start of a line.
    line_start: bool,
}

impl Default for EventSplitter {
    fn default() -> Self {
        EventSplitter {
            buf: BytesMut::new(),
            pos: 0,
            line_start: true,
        }
    }
}

impl EventSplitter {
    pub(crate) fn push(&mut self, chunk: &[u8], out: &mut VecDeque<Bytes>) {
        self.buf.extend_from_slice(chunk);
        while let Some(end) = self.scan() {
            out.push_back(self.buf.split_to(end).freeze());
            self.pos = 0;
            self.line_start = true;
        }
    }

    /// Bytes of the event being assembled (not yet complete).
    pub(crate) fn held(&self) -> usize {
        self.buf.len()
    }

    /// Whatever is left when the stream ends (an unterminated last event).
    pub(crate) fn finish(self) -> Option<Bytes> {
        (!self.buf.is_empty()).then(|| self.buf.freeze())
    }

    /// The end (exclusive) of the first complete event: a line terminator directly after
    /// another. A `\r` at the very end is not decided yet (it may start `\r\n`).
    fn scan(&mut self) -> Option<usize> {
        let buf = &self.buf[..];
        let mut i = self.pos;
        while i < buf.len() {
            let term_len = match buf[i] {
                b'\n' => 1,
                b'\r' if i + 1 == buf.len() => break,
                b'\r' if buf[i + 1] == b'\n' => 2,
                b'\r' => 1,
                _ => {
                    self.line_start = false;
                    i += 1;
                    continue;
                }
            };
            if self.line_start && i > 0 {
                return Some(i + term_len);
            }
            self.line_start = true;
            i += term_len;
        }
        self.pos = i;
        None
    }
}

/// The lines of an event block; SSE ends a line with CRLF, LF or a lone CR.
fn lines(block: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = block;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        match rest.iter().position(|b| *b == b'\n' || *b == b'\r') {
            None => Some(std::mem::take(&mut rest)),
            Some(i) => {
                let line = &rest[..i];
                let skip = if rest[i] == b'\r' && rest.get(i + 1) == Some(&b'\n') {
                    2
                } else {
                    1
                };
                rest = &rest[i + skip..];
                Some(line)
            }
        }
    })
}

/// The event's data (its `data:` lines joined with `\n`), if it has any.
pub(crate) fn event_data(block: &[u8]) -> Option<String> {
    let mut data: Option<String> = None;
    for line in lines(block) {
        let Some(rest) = line.strip_prefix(b"data") else {
            continue;
        };
        let value = match rest.first() {
            None => &rest[..0],
            Some(b':') => rest[1..].strip_prefix(b" ").unwrap_or(&rest[1..]),
            Some(_) => continue, // a field such as `dataX`
        };
        let value = String::from_utf8_lossy(value);
        match &mut data {
            Some(d) => {
                d.push('\n');
                d.push_str(&value);
            }
            None => data = Some(value.into_owned()),
        }
    }
    data
}

/// The same event with its data replaced by `data` (one line; compact JSON has no newline).
pub(crate) fn replace_data(block: &[u8], data: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(block.len() + data.len());
    let mut wrote = false;
    for line in lines(block) {
        if line.is_empty() {
            continue;
        }
        if line.starts_with(b"data:") || line == b"data" {
            if !wrote {
                out.extend_from_slice(b"data: ");
                out.extend_from_slice(data);
                out.push(b'\n');
                wrote = true;
            }
            continue;
        }
        out.extend_from_slice(line);
        out.push(b'\n');
    }
    out.push(b'\n');
    Bytes::from(out)
}

/// An SSE event carrying one JSON-RPC message.
pub(crate) fn message_event(msg: &[u8]) -> Bytes {
    let mut event = BytesMut::with_capacity(msg.len() + 24);
    event.extend_from_slice(b"event: message\ndata: ");
    event.extend_from_slice(msg);
    event.extend_from_slice(b"\n\n");
    event.freeze()
}

/// Every JSON-RPC message of a whole SSE body, in order.
pub(crate) fn messages(body: &[u8]) -> Vec<String> {
    let mut splitter = EventSplitter::default();
    let mut events = VecDeque::new();
    splitter.push(body, &mut events);
    events.extend(splitter.finish());
    events.iter().filter_map(|e| event_data(e)).collect()
}

/// Reads the upstream's stream until its first event that carries data (a priming event with
/// only an id, as some servers send first, is skipped) or its end; returns the bytes read and
/// that event. Used where the HTTP status depends on the first message. It also stops when a
/// question is routed to the call from elsewhere first (its session's GET stream): the call
/// then begins with that question, which waits in the inbox's `early`.
pub(crate) async fn peek_first<B>(
    upstream: &mut B,
    max_event: usize,
    mut inbox: Option<&mut Inbox>,
) -> Result<(Bytes, Option<Bytes>), BoxError>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut read = BytesMut::new();
    let mut splitter = EventSplitter::default();
    let mut events: VecDeque<Bytes> = VecDeque::new();
    loop {
        while let Some(block) = events.pop_front() {
            if event_data(&block).is_some_and(|d| !d.trim().is_empty()) {
                return Ok((read.freeze(), Some(block)));
            }
        }
        let routed = async {
            match inbox.as_mut() {
                Some(i) => i.rx.recv().await,
                None => std::future::pending().await,
            }
        };
        let frame = tokio::select! {
            f = upstream.frame() => f,
            Some(r) = routed => {
                if let Some(i) = inbox.as_mut() {
                    i.early = Some(r);
                }
                return Ok((read.freeze(), None));
            }
        };
        match frame {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    read.extend_from_slice(&data);
                    splitter.push(&data, &mut events);
                    if splitter.held() > max_event {
                        return Err(format!(
                            "an SSE event larger than the {max_event} bytes the sidecar holds"
                        )
                        .into());
                    }
                }
            }
            Some(Err(e)) => return Err(e.into()),
            None => return Ok((read.freeze(), splitter.finish())),
        }
    }
}

/// What bounds a stream the sidecar rewrites.
pub(crate) struct StreamBounds {
    /// The largest event held to be rewritten.
    pub(crate) max_event: usize,
    /// The bytes held, counted in the memory budget.
    pub(crate) held: Reservation,
    /// Turns true when the sidecar cuts in-flight requests short at shutdown.
    pub(crate) cut: Option<tokio::sync::watch::Receiver<bool>>,
    /// Told the kind of a limit the stream hit (`sse_event_size`, `memory_budget`).
    pub(crate) on_limit: Option<std::sync::Arc<dyn Fn(LimitKind) + Send + Sync>>,
    /// What becomes of a question the upstream asks on this stream (a 2025-era server
    /// request: `elicitation/create`, `sampling/createMessage`, `roots/list`).
    pub(crate) questions: Questions,
    /// Where the change notices on this stream go instead of the client (a 2025-era
    /// upstream's `list_changed` on a 2026 client's call, which 2026 sends only on listen
    /// streams).
    pub(crate) notices: Option<Notices>,
    /// Questions the upstream asked of this call elsewhere than on its stream (a 2025
    /// session's GET stream), asked as those on it are.
    pub(crate) inbox: Option<Inbox>,
}

/// Questions routed to one call from elsewhere than its stream, and its place among the
/// calls in flight (given up when the call's stream ends).
pub(crate) struct Inbox {
    pub(crate) rx: tokio::sync::mpsc::Receiver<Routed>,
    /// One taken off `rx` before the stream was read (it came before any event).
    pub(crate) early: Option<Routed>,
    pub(crate) _place: Box<dyn Send + Sync>,
}

/// A question routed to a call: whoever claims it first (the call's stream, or the router
/// once the call has not taken it in time) answers for it.
pub(crate) struct Routed {
    pub(crate) question: Question,
    pub(crate) claimed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Routed {
    /// Whether this claim is the first.
    pub(crate) fn claim(&self) -> bool {
        !self.claimed.swap(true, std::sync::atomic::Ordering::AcqRel)
    }
}

/// Takes a change notice off a stream: its method and params.
pub(crate) type Notices = std::sync::Arc<dyn Fn(&str, Option<&RawValue>) + Send + Sync>;

/// The largest event read as a possible change notice (they are small).
const NOTICE_MAX: usize = 4096;

/// What becomes of the questions a 2025-era upstream asks in the middle of a call.
pub(crate) enum Questions {
    /// They go on to the client as they are (a stdio child's, relayed to the 2025 client
    /// whose request caused them).
    Carried,
    /// Nobody can answer them (a request of a kind that asks nothing of its client): it ends
    /// at once with an error saying so, instead of waiting for an answer that cannot come.
    Refused,
    /// A 2026 client is asked them as an `input_required` result, and the rest of the call
    /// is held until its retry brings the answers ([`Bridge`]).
    Bridged(Box<dyn Bridge>),
    /// A 2025 client is asked them on its call's stream under ids of the sidecar's own, and
    /// its answers go back in the upstream session ([`Relay`]).
    Relayed(Box<dyn Relay>),
}

/// How a 2025 client is asked a 2025-era HTTP upstream's questions: the upstream side of it
/// (the sidecar's ids, where the answers go) lives with the upstream.
pub(crate) trait Relay: Send {
    /// The id `question` is asked of the client under (one of the sidecar's, answerable only
    /// by the caller asked), or why it is not asked.
    fn relay(&mut self, question: &Question) -> Result<Box<RawValue>, Decline>;
    /// Tells the upstream the client is not asked `question`.
    fn decline(&self, question: &Question, why: Decline) -> Told;
}

/// A question of the upstream's, taken off its stream.
#[derive(Debug, Clone)]
pub(crate) struct Question {
    /// The key the client's `inputResponses` answers it under.
    pub(crate) key: String,
    /// Its id as the upstream wrote it: the answer goes back under it.
    pub(crate) id: Box<RawValue>,
    pub(crate) method: String,
    pub(crate) params: Option<Box<RawValue>>,
}

impl Question {
    /// The question an SSE event carries, when it carries one.
    pub(crate) fn in_event(block: &[u8]) -> Option<Question> {
        Question::of(&raw::parse_message(event_data(block)?.as_bytes())?)
    }

    /// The question from a message of the upstream's, when it is one.
    pub(crate) fn of(msg: &RawMap) -> Option<Question> {
        if !is_question(msg) {
            return None;
        }
        let id = msg.get("id")?.to_owned();
        let key = format!("q{}", id.get().trim_matches('"'));
        Some(Question {
            key,
            id,
            method: raw::as_str(msg.get("method")?)?.into_owned(),
            params: msg.get("params").map(|p| p.to_owned()),
        })
    }

    /// Its entry in an `input_required` result's `inputRequests`: `{method, params}`.
    pub(crate) fn input_request(&self) -> Box<RawValue> {
        let mut m = RawMap::default();
        m.insert("method".to_owned(), raw::raw(&self.method));
        if let Some(p) = &self.params {
            m.insert("params".to_owned(), p.clone());
        }
        raw::raw(&m)
    }
}

/// The rest of an upstream's stream, held while a client answers its questions: the body
/// and what was read of it but not yet handled.
pub(crate) struct HeldStream {
    body: HeldBody,
    splitter: EventSplitter,
    pending: VecDeque<Bytes>,
}

impl HeldStream {
    /// The bytes it holds that were read and not yet handled (its share of the budget).
    pub(crate) fn held_bytes(&self) -> usize {
        self.splitter.held() + self.pending.iter().map(Bytes::len).sum::<usize>()
    }
}

/// A held stream's body, whatever carried it.
pub(crate) type HeldBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// Rounds of questions one call may ask its client, in either direction (a 2025 server's
/// asked as `input_required`, a 2026 server's asked of a 2025 client); past them the call
/// fails.
pub(crate) const MAX_ROUNDS: usize = 8;

/// Questions one round may ask; past them a 2025 server's question is declined.
pub(crate) const MAX_QUESTIONS: usize = 16;

/// Why a question is not asked of the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decline {
    /// The client did not declare the capability answering it takes.
    NotDeclared,
    /// The round already holds [`MAX_QUESTIONS`].
    TooMany,
    /// The caller holds its share of open questions, or the sidecar its cap.
    Bounded,
}

/// Telling the upstream something (a call's cancellation), to be awaited.
pub(crate) type Told = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>>;

/// How a 2026 client is asked a 2025-era upstream's questions (MRTR, SEP-2322): the
/// upstream side of it (answering the upstream, holding the call) lives with the upstream.
pub(crate) trait Bridge: Send {
    /// Whether the client declared the capability answering `question` takes.
    fn covers(&self, question: &Question) -> bool;
    /// Tells the upstream the client is not asked `question` (for a capability it did not
    /// declare, the error a 2025 client without it sends); the call goes on.
    fn decline(
        &self,
        question: &Question,
        why: Decline,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>>;
    /// Takes the places a held call needs now, before the answer's head goes (the call's
    /// first message is a question): a refusal is then the answer's status (429 or 503, with
    /// `Retry-After`), not an error event in a stream already answered 200.
    fn reserve(&mut self) -> Result<(), Error>;
    /// What tells the upstream the call ends (it is let go without being held): to be awaited
    /// before the call's stream is dropped (a 2025 server takes a dropped stream for no
    /// cancellation, and must hear the cancellation first).
    fn cancel(&self) -> Option<Told>;
    /// Holds the rest of the call (`stream`) with the questions the client is asked; the
    /// `requestState` its retry echoes, or why the call cannot be held (the upstream is then
    /// told the call ends).
    fn hold(self: Box<Self>, stream: HeldStream, asked: Vec<Question>) -> Result<String, Error>;
}

/// How long a stream that asked a question is read on for more before the client is asked
/// (a server asking two things at once writes them back to back).
const GATHER: std::time::Duration = std::time::Duration::from_millis(20);

struct State<B> {
    /// `None` once handed to a held call.
    body: Option<B>,
    splitter: EventSplitter,
    pending: VecDeque<Bytes>,
    plan: ResultPlan,
    bounds: StreamBounds,
    done: bool,
    /// The request's id, when a stream that breaks before the response should end with a
    /// JSON-RPC error for it instead of a cut-off body.
    id: Option<Box<RawValue>>,
    saw_response: bool,
    /// The questions taken off the stream for a bridged client, not asked yet.
    asked: Vec<Question>,
    /// The id the response goes back under, when it is not the one the upstream answers (a
    /// held call continued by the client's retry).
    reply_id: Option<Box<RawValue>>,
}

impl<B> Drop for State<B> {
    fn drop(&mut self) {
        if !self.done {
            // The client stopped reading before the stream ended: cancellation.
            self.plan.abandon();
        }
    }
}

/// Streams `upstream` through, applying `plan` to each JSON-RPC message event; an event the
/// plan leaves unchanged is forwarded byte for byte. `read` holds bytes already taken from
/// the upstream. With `id`, a stream that fails, ends before its response event, holds an
/// event larger than its bounds allow, or is cut at shutdown, ends with a JSON-RPC error
/// event for that id (passed through the plan like any response) rather than being cut off.
pub(crate) fn rewrite_stream<B>(
    read: Bytes,
    upstream: B,
    id: Option<Box<RawValue>>,
    plan: ResultPlan,
    bounds: StreamBounds,
) -> Coalesced
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    let mut state = State {
        body: Some(upstream),
        splitter: EventSplitter::default(),
        pending: VecDeque::new(),
        plan,
        bounds,
        done: false,
        id,
        saw_response: false,
        asked: Vec::new(),
        reply_id: None,
    };
    state.splitter.push(&read, &mut state.pending);
    stream_state(state)
}

/// Streams the rest of a held call (see [`rewrite_stream`]) as the answer to the client's
/// retry `id`, through the retry's `plan`.
pub(crate) fn resume_stream(
    held: HeldStream,
    id: Box<RawValue>,
    plan: ResultPlan,
    bounds: StreamBounds,
) -> Coalesced {
    stream_state(State {
        body: Some(held.body),
        splitter: held.splitter,
        pending: held.pending,
        plan,
        bounds,
        done: false,
        reply_id: Some(id.clone()),
        id: Some(id),
        saw_response: false,
        asked: Vec::new(),
    })
}

fn stream_state<B>(state: State<B>) -> Coalesced
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    let s = stream::unfold(state, |mut st| async move {
        loop {
            if let Some(block) = st.pending.pop_front() {
                match st.taken_off(&block).await {
                    Taken::Off => continue,
                    Taken::Replaced(b) => return Some((Ok::<_, BoxError>(Frame::data(b)), st)),
                    Taken::Kept => {}
                }
                let responded = st.saw_response;
                let mut block = transform(&block, &mut st).unwrap_or(block);
                if !responded && st.saw_response {
                    if let Some(amends) = st.plan.amends() {
                        block = amended(block, &amends).await;
                    }
                }
                if block.len() > crate::budget::SMALL {
                    // Counted until written: a slow client may keep it in the write buffer.
                    block = crate::budget::counted(st.bounds.held.budget(), block);
                }
                return Some((Ok::<_, BoxError>(Frame::data(block)), st));
            }
            if st.done {
                return None;
            }
            if let Some(early) = st.bounds.inbox.as_mut().and_then(|i| i.early.take()) {
                if let Some(event) = st.routed(early).await {
                    return Some((Ok(Frame::data(event)), st));
                }
                continue;
            }
            if let Some(why) = st.over_bounds() {
                return st.end(upstream_broke(&why), None);
            }
            let body = st.body.as_mut()?;
            let gather = !st.asked.is_empty();
            let open = !st.saw_response;
            let inbox = async {
                match st.bounds.inbox.as_mut() {
                    Some(i) if open => i.rx.recv().await,
                    _ => std::future::pending().await,
                }
            };
            let cut = async {
                match st.bounds.cut.as_mut() {
                    Some(cut) => drop(cut.wait_for(|c| *c).await),
                    None => std::future::pending().await,
                }
            };
            let next = tokio::select! {
                f = body.frame() => Next::Frame(f.map(|r| r.map_err(Into::<BoxError>::into))),
                () = cut => Next::Cut,
                () = tokio::time::sleep(GATHER), if gather => Next::Quiet,
                Some(routed) = inbox => Next::Routed(routed),
            };
            let frame = match next {
                Next::Frame(f) => f,
                Next::Cut => return st.end(Error::new(ErrorKind::ShuttingDown, ""), None),
                // Quiet after its questions: the client is asked them now.
                Next::Quiet => return st.ask(),
                Next::Routed(routed) => {
                    if let Some(event) = st.routed(routed).await {
                        return Some((Ok(Frame::data(event)), st));
                    }
                    continue;
                }
            };
            match st.read(frame) {
                Read::More => {}
                Read::Emit(item) => return Some((item, st)),
                Read::Done => return None,
                Read::Broke(why, e) => return st.end(upstream_broke(&why), Some(e)),
            }
        }
    });
    crate::body::coalesced(StreamBody::new(s).boxed_unsync())
}

impl<B> State<B>
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    /// One frame of the upstream's stream (`None`: its end), read into the events pending.
    fn read(&mut self, frame: Option<Result<Frame<Bytes>, BoxError>>) -> Read {
        match frame {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => self.splitter.push(&data, &mut self.pending),
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        return Read::Emit(Ok(Frame::trailers(trailers)));
                    }
                }
            },
            Some(Err(e)) => {
                if self.saw_response {
                    // The answer is delivered; what broke after it does not matter.
                    return Read::Done;
                }
                return Read::Broke(format!("the event stream broke off ({e})"), e);
            }
            None if !self.asked.is_empty() => {
                // The upstream ended its stream with questions unanswered.
                self.asked.clear();
                self.done = true;
                self.pending.push_back(Bytes::new());
            }
            None => {
                self.done = true;
                let rest = std::mem::take(&mut self.splitter).finish();
                self.pending.extend(rest);
                if !self.saw_response {
                    // Decided after the tail is scanned: it may hold the response.
                    self.pending.push_back(Bytes::new());
                }
            }
        }
        Read::More
    }

    /// The question in `block` when this stream asks a bridged client its questions and
    /// its response has not come.
    fn bridged_question(&self, block: &[u8]) -> Option<Question> {
        if self.saw_response || !matches!(self.bounds.questions, Questions::Bridged(_)) {
            return None;
        }
        Question::of(&raw::parse_message(event_data(block)?.as_bytes())?)
    }

    /// What becomes of `block` here: a question for a bridged client leaves the stream
    /// (asked, or declined when the client cannot answer it), one for a relayed client is
    /// asked under the sidecar's id (or declined), a change notice goes to the listeners.
    async fn taken_off(&mut self, block: &[u8]) -> Taken {
        if let Some(q) = self.bridged_question(block) {
            if let Questions::Bridged(bridge) = &self.bounds.questions {
                if !bridge.covers(&q) {
                    bridge.decline(&q, Decline::NotDeclared).await;
                } else if self.asked.len() >= MAX_QUESTIONS {
                    bridge.decline(&q, Decline::TooMany).await;
                } else {
                    self.asked.push(q);
                }
            }
            return Taken::Off;
        }
        if let Some(q) = self.relayed_question(block) {
            return match self.relay(&q).await {
                Some(id) => Taken::Replaced(relabelled(block, &id)),
                None => Taken::Off,
            };
        }
        if self.diverted(block) {
            Taken::Off
        } else {
            Taken::Kept
        }
    }

    /// A question routed to this call from elsewhere (its session's GET stream), when the
    /// call claims it: a bridged client's joins the round being gathered, a relayed client's
    /// is asked on the stream now (its event returned).
    async fn routed(&mut self, routed: Routed) -> Option<Bytes> {
        if !routed.claim() {
            return None;
        }
        let q = routed.question;
        match &self.bounds.questions {
            Questions::Bridged(bridge) => {
                if self.asked.len() >= MAX_QUESTIONS {
                    bridge.decline(&q, Decline::TooMany).await;
                } else {
                    self.asked.push(q);
                }
                None
            }
            Questions::Relayed(_) => {
                let id = self.relay(&q).await?;
                let mut m = RawMap::default();
                m.insert("jsonrpc".to_owned(), raw::raw("2.0"));
                m.insert("id".to_owned(), id);
                m.insert("method".to_owned(), raw::raw(&q.method));
                if let Some(p) = &q.params {
                    m.insert("params".to_owned(), p.clone());
                }
                Some(message_event(&raw::to_bytes(&m)))
            }
            _ => None,
        }
    }

    /// The question in `block` when this stream relays a 2025 client's questions and its
    /// response has not come.
    fn relayed_question(&self, block: &[u8]) -> Option<Question> {
        if self.saw_response || !matches!(self.bounds.questions, Questions::Relayed(_)) {
            return None;
        }
        Question::of(&raw::parse_message(event_data(block)?.as_bytes())?)
    }

    /// Asks a relayed client `q` under the sidecar's id (`None`: declined upstream instead).
    async fn relay(&mut self, q: &Question) -> Option<Box<RawValue>> {
        let Questions::Relayed(relay) = &mut self.bounds.questions else {
            return None;
        };
        match relay.relay(q) {
            Ok(id) => Some(id),
            Err(why) => {
                relay.decline(q, why).await;
                None
            }
        }
    }

    /// Whether `block` is a change notice handed to [`StreamBounds::notices`].
    fn diverted(&self, block: &[u8]) -> bool {
        let Some(notices) = &self.bounds.notices else {
            return false;
        };
        if block.len() > NOTICE_MAX {
            return false;
        }
        let Some(msg) = event_data(block).and_then(|d| raw::parse_message(d.as_bytes())) else {
            return false;
        };
        if msg.contains_key("id") {
            return false;
        }
        let Some(method) = msg.get("method").and_then(|m| raw::as_str(m)) else {
            return false;
        };
        if !crate::mcp::method::is_change_notice(&method) {
            return false;
        }
        notices(&method, msg.get("params").map(|p| &**p));
        true
    }

    /// Asks the client the questions taken off the stream: the rest of the call goes to a
    /// held call, and the stream ends with the `input_required` result.
    fn ask(mut self) -> Option<(Result<Frame<Bytes>, BoxError>, Self)> {
        self.id.as_ref()?;
        let asked = std::mem::take(&mut self.asked);
        let Questions::Bridged(bridge) =
            std::mem::replace(&mut self.bounds.questions, Questions::Refused)
        else {
            return None;
        };
        let body = self.body.take()?;
        let held = HeldStream {
            body: body.map_err(Into::into).boxed_unsync(),
            splitter: std::mem::take(&mut self.splitter),
            pending: std::mem::take(&mut self.pending),
        };
        let mut requests = RawMap::default();
        for q in &asked {
            requests.insert(q.key.clone(), q.input_request());
        }
        match bridge.hold(held, asked) {
            Ok(state) => {
                let id = self.id.take()?;
                self.done = true;
                self.saw_response = true;
                self.bounds.held.resize(0);
                let mut result = RawMap::default();
                result.insert("resultType".to_owned(), raw::raw("input_required"));
                result.insert("inputRequests".to_owned(), raw::raw(&requests));
                result.insert("requestState".to_owned(), raw::raw(&state));
                let mut msg = RawMap::default();
                msg.insert("jsonrpc".to_owned(), raw::raw("2.0"));
                msg.insert("id".to_owned(), id);
                msg.insert("result".to_owned(), raw::raw(&result));
                let bytes = self
                    .plan
                    .rewrite(&mut msg)
                    .unwrap_or_else(|| raw::to_bytes(&msg));
                Some((Ok(Frame::data(message_event(&bytes))), self))
            }
            Err(e) => self.end(e, None),
        }
    }

    /// Why the event being assembled cannot be held: too large, or past the memory budget.
    fn over_bounds(&mut self) -> Option<String> {
        let held = self.splitter.held();
        let hit = |kind| {
            if let Some(on_limit) = &self.bounds.on_limit {
                on_limit(kind);
            }
        };
        if held > self.bounds.max_event {
            hit(LimitKind::SseEventSize);
            return Some(format!(
                "the upstream sent an SSE event larger than the {} bytes the sidecar holds to rewrite",
                self.bounds.max_event
            ));
        }
        if !self.bounds.held.resize(held) {
            hit(LimitKind::MemoryBudget);
            return Some("the sidecar's memory budget is spent".to_owned());
        }
        None
    }

    /// Ends the stream: with an error event for the request when its id is known (and the
    /// response has not gone out), else with `error` (or quietly).
    fn end(
        mut self,
        why: Error,
        error: Option<BoxError>,
    ) -> Option<(Result<Frame<Bytes>, BoxError>, Self)> {
        self.done = true;
        self.bounds.held.resize(0);
        if self.saw_response {
            return None;
        }
        match (broken_event(&mut self, why), error) {
            (Some(event), _) => Some((Ok(Frame::data(event)), self)),
            (None, Some(e)) => Some((Err(e), self)),
            (None, None) => None,
        }
    }
}

/// The upstream's stream failed the request, for `why`.
fn upstream_broke(why: &str) -> Error {
    Error::new(
        ErrorKind::UpstreamFailed,
        format!("{why}, before the response; the request may be sent again"),
    )
}

/// The error event that ends a stream broken before its response (when the id is known).
fn broken_event<B>(st: &mut State<B>, error: Error) -> Option<Bytes> {
    let id = st.id.take()?;
    st.saw_response = true;
    let mut msg = raw::parse_message(&error.body(Some(&id)))?;
    let bytes = st
        .plan
        .rewrite(&mut msg)
        .unwrap_or_else(|| raw::to_bytes(&msg));
    Some(message_event(&bytes))
}

/// What a frame of the upstream's made of the stream.
enum Read {
    /// Read on.
    More,
    /// This goes out as it is (trailers).
    Emit(Result<Frame<Bytes>, BoxError>),
    /// The stream is over (it broke after its response).
    Done,
    /// It broke before its response, for this reason.
    Broke(String, BoxError),
}

/// What woke the stream.
enum Next<F> {
    Frame(F),
    Cut,
    /// Quiet for [`GATHER`] after a question: the client is asked.
    Quiet,
    Routed(Routed),
}

/// What the stream does with one of its events.
enum Taken {
    /// It leaves the stream (a question asked otherwise, a notice for the listeners).
    Off,
    /// It goes on as these bytes (a question under the sidecar's id).
    Replaced(Bytes),
    /// It goes on through the plan.
    Kept,
}

/// A question's event asked under `id` instead of the upstream's.
fn relabelled(block: &[u8], id: &RawValue) -> Bytes {
    let Some(mut msg) = event_data(block).and_then(|d| raw::parse_message(d.as_bytes())) else {
        return Bytes::copy_from_slice(block);
    };
    msg.insert("id".to_owned(), id.to_owned());
    replace_data(block, &raw::to_bytes(&msg))
}

/// A request from the server (a method and an id): a question for the client.
/// The response event with the amendment its result may get (customer context), once it has
/// come or its deadline passed.
async fn amended(block: Bytes, amends: &crate::mcp::end::Amends) -> Bytes {
    let Some(data) = event_data(&block) else {
        return block;
    };
    let before = Bytes::from(data.into_bytes());
    let after = amends.apply(before.clone()).await;
    if after == before {
        return block;
    }
    replace_data(&block, &after)
}

fn is_question(msg: &RawMap) -> bool {
    msg.contains_key("method") && msg.contains_key("id")
}

fn transform<B>(block: &Bytes, st: &mut State<B>) -> Option<Bytes> {
    if block.is_empty() {
        // The end-of-stream marker: the stream ended without a response.
        if st.saw_response {
            return None;
        }
        let error = upstream_broke("the event stream ended");
        return Some(broken_event(st, error).unwrap_or_default());
    }
    let data = event_data(block)?;
    let mut msg: RawMap = raw::parse_message(data.as_bytes())?;
    if matches!(st.bounds.questions, Questions::Refused) && !st.saw_response && is_question(&msg) {
        let method = msg
            .get("method")
            .and_then(|m| raw::as_str(m))
            .unwrap_or_default();
        let error = Error::new(
            ErrorKind::UpstreamFailed,
            format!(
                "the upstream asked {method} in the middle of a request of a kind that asks nothing of its client (only tools/call, prompts/get and resources/read are asked of it); the request ends here rather than wait for an answer that cannot come"
            ),
        );
        st.done = true;
        st.pending.clear();
        return Some(broken_event(st, error).unwrap_or_default());
    }
    let response = raw::is_response(&msg);
    st.saw_response |= response;
    let renamed = match (&st.reply_id, response) {
        (Some(id), true) => {
            msg.insert("id".to_owned(), id.clone());
            true
        }
        _ => false,
    };
    let rewritten = match st.plan.rewrite(&mut msg) {
        Some(bytes) => bytes,
        None if renamed => raw::to_bytes(&msg),
        None => return None,
    };
    Some(replace_data(block, &rewritten))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::end::Abandoned;

    fn split(chunks: &[&[u8]]) -> Vec<Bytes> {
        let mut s = EventSplitter::default();
        let mut out = VecDeque::new();
        for c in chunks {
            s.push(c, &mut out);
        }
        out.extend(s.finish());
        out.into_iter().collect()
    }

    #[test]
    fn splits_across_chunks_and_line_endings() {
        let ev = split(&[
            b"event: message\ndata: {\"a\":1}\n",
            b"\nevent: message\r\ndata: 2\r",
            b"\n\r\n: ping\n\n",
        ]);
        assert_eq!(ev.len(), 3);
        assert_eq!(&ev[0][..], b"event: message\ndata: {\"a\":1}\n\n");
        assert_eq!(event_data(&ev[1]).as_deref(), Some("2"));
        assert_eq!(event_data(&ev[2]), None);
        // Multi-line data joins with \n; an unterminated tail is still delivered.
        let ev = split(&[b"data: a\ndata: b\n\ndata: tail"]);
        assert_eq!(event_data(&ev[0]).as_deref(), Some("a\nb"));
        assert_eq!(&ev[1][..], b"data: tail");
        // A lone \r ends a line, even when the chunk boundary falls right after it.
        let ev = split(&[b"data: x\r", b"\r", b"data: y\n\n"]);
        assert_eq!(ev.len(), 2, "{ev:?}");
        assert_eq!(event_data(&ev[0]).as_deref(), Some("x"));
    }

    #[test]
    fn splitting_byte_by_byte_matches_splitting_whole() {
        let body: &[u8] = b"id: 1\r\ndata: {\"x\":1}\r\n\r\n: c\n\ndata: a\rdata: b\r\rtail";
        let whole = split(&[body]);
        let pieces: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(split(&pieces), whole);
    }

    #[test]
    fn scanning_is_linear_in_the_event_size() {
        // A 16 MiB event in 4 KiB chunks: quadratic rescanning would take minutes.
        let chunk = vec![b'x'; 4096];
        let mut s = EventSplitter::default();
        let mut out = VecDeque::new();
        let started = std::time::Instant::now();
        s.push(b"data: ", &mut out);
        for _ in 0..4096 {
            s.push(&chunk, &mut out);
        }
        s.push(b"\n\n", &mut out);
        assert_eq!(out.len(), 1);
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }

    #[test]
    fn replaces_only_data() {
        let out = replace_data(b"event: message\nid: 7\ndata: {\"x\":1}\n\n", b"{\"y\":2}");
        assert_eq!(&out[..], b"event: message\nid: 7\ndata: {\"y\":2}\n\n");
    }

    #[tokio::test]
    async fn stream_rewrites_only_the_response() {
        let body = http_body_util::Full::new(Bytes::from_static(
            b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n",
        ));
        let plan = ResultPlan::new(
            Some(crate::mcp::method::Method::ToolsCall),
            crate::mcp::era::Era::Modern,
            Abandoned::default(),
        );
        let bounds = StreamBounds {
            max_event: 1 << 20,
            held: crate::budget::MemoryBudget::new(1 << 20).start(),
            cut: None,
            on_limit: None,
            questions: Questions::Carried,
            notices: None,
            inbox: None,
        };
        let out = rewrite_stream(Bytes::new(), body, None, plan, bounds).boxed_unsync();
        let bytes = out.collect().await.unwrap().to_bytes();
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        assert!(text.starts_with("event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n"));
        assert!(
            text.ends_with(
                "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"resultType\":\"complete\"}}\n\n"
            ),
            "{text}"
        );
    }

    #[tokio::test]
    async fn peek_skips_a_priming_event() {
        let mut body = http_body_util::Full::new(Bytes::from_static(
            b"id: abc\ndata: \n\nevent: message\ndata: {\"id\":1,\"error\":{\"code\":-32601}}\n\nrest",
        ));
        let (read, first) = peek_first(&mut body, 1 << 20, None).await.unwrap();
        assert!(read.ends_with(b"rest"));
        assert_eq!(
            event_data(&first.unwrap()).as_deref(),
            Some("{\"id\":1,\"error\":{\"code\":-32601}}")
        );
    }
}
