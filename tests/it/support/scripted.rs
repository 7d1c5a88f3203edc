//! A scripted upstream: a loopback HTTP/1.1 server, set up with a builder, for the behaviour
//! real peers cannot be made to show (never answering, answering halfway, closing, echoing,
//! endless or over-long bodies, slow event streams). It owns the one request parser the tests
//! use (head, then a `Content-Length` or chunked body, keep-alive), answers the sidecar's
//! readiness `ping` itself, chooses each answer by JSON-RPC method, by predicate or by a
//! function of the request, and records every request and connection it saw for assertions.
//!
//! ```ignore
//! let up = ScriptedUpstream::new()
//!     .on("tools/list", Reply::result(json!({"tools": []})))
//!     .on("tools/call", Reply::silent())
//!     .start();
//! ```

use std::io::{BufRead, BufReader, Read, Write};
use std::mem::MaybeUninit;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

/// One request as the upstream read it.
#[derive(Clone, Debug)]
pub struct Request {
    /// The request line and headers, as sent (ending with the blank line).
    pub head: String,
    pub body: Vec<u8>,
    /// The body as JSON (`Null` when it is not JSON).
    pub json: Value,
    /// Which accepted connection carried it (0, 1, … in accept order).
    pub connection: usize,
}

impl Request {
    /// The HTTP method (`POST`, `DELETE`, …).
    pub fn http_method(&self) -> &str {
        self.head.split(' ').next().unwrap_or_default()
    }

    /// The value of header `name` (case-insensitive), trimmed.
    pub fn header(&self, name: &str) -> Option<String> {
        header_of(&self.head, name)
    }

    /// The JSON-RPC method (empty when there is none).
    pub fn method(&self) -> &str {
        self.json["method"].as_str().unwrap_or_default()
    }

    /// The JSON-RPC id (`Null` for a notification or a body that is not JSON).
    pub fn id(&self) -> &Value {
        &self.json["id"]
    }

    /// The tool a `tools/call` names.
    pub fn tool(&self) -> Option<&str> {
        self.json["params"]["name"].as_str()
    }
}

fn header_of(head: &str, name: &str) -> Option<String> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_owned())
    })
}

/// A piece of an answer's body.
#[derive(Clone)]
enum Part {
    Bytes(Vec<u8>),
    /// The request's JSON-RPC id, serialized.
    Id,
    /// The request's head and body as `{"head": …, "body": …}`.
    Echo,
    /// `chunk` written again and again: `total` bytes in all, or until the peer goes.
    Repeat(Vec<u8>, Option<usize>),
    /// A pause in the middle of the body (between events).
    Pause(Duration),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// `Content-Length` of the body (or the one declared, which may be a lie).
    Length(Option<usize>),
    /// No length: the body ends when the connection closes.
    UntilClose,
    /// `Transfer-Encoding: chunked`, each part a chunk.
    Chunked,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum After {
    /// Read the next request on the connection.
    KeepAlive,
    /// Close the connection.
    Close,
    /// Send nothing more, but keep the connection until the peer closes it.
    Hang,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Answer,
    /// Never answer; hold the connection until the peer closes it.
    Silent,
    /// Close the connection without answering.
    HangUp,
}

/// What the upstream does with one request.
#[derive(Clone)]
pub struct Reply {
    kind: Kind,
    status: u16,
    headers: Vec<(String, String)>,
    parts: Vec<Part>,
    framing: Framing,
    delay: Duration,
    after: After,
    /// Send only this many bytes of the body (then close, unless told to hang).
    cut: Option<usize>,
}

impl Reply {
    fn answer(content_type: Option<&str>, parts: Vec<Part>) -> Reply {
        Reply {
            kind: Kind::Answer,
            status: 200,
            headers: content_type
                .map(|ct| vec![("content-type".to_owned(), ct.to_owned())])
                .unwrap_or_default(),
            parts,
            framing: Framing::Length(None),
            delay: Duration::ZERO,
            after: After::KeepAlive,
            cut: None,
        }
    }

    /// `200` with `body` as it is, as `application/json`.
    pub fn json(body: impl Into<String>) -> Reply {
        Self::answer(
            Some("application/json"),
            vec![Part::Bytes(body.into().into_bytes())],
        )
    }

    /// A JSON-RPC answer carrying the request's id and `result`.
    pub fn result(result: Value) -> Reply {
        Self::result_raw(result.to_string())
    }

    /// A JSON-RPC answer carrying the request's id and `result` given as raw JSON text, kept
    /// byte for byte (numbers past `f64`, escapes).
    pub fn result_raw(result: impl AsRef<str>) -> Reply {
        Self::rpc_raw("result", result.as_ref())
    }

    /// A JSON-RPC error answer carrying the request's id.
    pub fn error(code: i64, message: &str) -> Reply {
        let error = serde_json::json!({"code": code, "message": message});
        Self::rpc_raw("error", &error.to_string())
    }

    fn rpc_raw(member: &str, raw: &str) -> Reply {
        Self::answer(
            Some("application/json"),
            vec![
                Part::Bytes(br#"{"jsonrpc":"2.0","id":"#.to_vec()),
                Part::Id,
                Part::Bytes(format!(r#","{member}":{raw}}}"#).into_bytes()),
            ],
        )
    }

    /// A `status` answer with an empty body.
    pub fn empty(status: u16) -> Reply {
        Self::answer(None, Vec::new()).status(status)
    }

    /// The request's head and body inside a JSON object, `{"head": …, "body": …}`.
    pub fn echo() -> Reply {
        Self::answer(Some("application/json"), vec![Part::Echo])
    }

    /// An answer built piece by piece with [`Reply::text`], [`Reply::id`], [`Reply::repeat`],
    /// [`Reply::event`] and [`Reply::pause`].
    pub fn body(content_type: &str) -> Reply {
        Self::answer(Some(content_type), Vec::new())
    }

    /// An event stream (`text/event-stream`) without a length: build it with
    /// [`Reply::event`] and [`Reply::pause`]; it ends by closing the connection.
    pub fn sse() -> Reply {
        let mut r = Self::answer(Some("text/event-stream"), Vec::new());
        r.framing = Framing::UntilClose;
        r.after = After::Close;
        r
    }

    /// Never answers: the connection is held until the peer closes it.
    pub fn silent() -> Reply {
        Reply {
            kind: Kind::Silent,
            ..Self::answer(None, Vec::new())
        }
    }

    /// Closes the connection without answering.
    pub fn hang_up() -> Reply {
        Reply {
            kind: Kind::HangUp,
            ..Self::answer(None, Vec::new())
        }
    }

    pub fn status(mut self, status: u16) -> Reply {
        self.status = status;
        self
    }

    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Waits `delay` before answering (an upstream that takes its time).
    pub fn delayed(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }

    /// Appends text to the body.
    pub fn text(mut self, text: &str) -> Reply {
        self.parts.push(Part::Bytes(text.as_bytes().to_vec()));
        self
    }

    /// Appends the request's JSON-RPC id to the body.
    pub fn id(mut self) -> Reply {
        self.parts.push(Part::Id);
        self
    }

    /// Appends `chunk` again and again: `total` bytes (the last copy cut to fit), or without
    /// end (until the peer goes away) when `total` is `None`.
    pub fn repeat(mut self, chunk: &[u8], total: Option<usize>) -> Reply {
        self.parts.push(Part::Repeat(chunk.to_vec(), total));
        self
    }

    /// Appends one SSE `message` event whose data is `data`.
    pub fn event(self, data: &str) -> Reply {
        self.text(&format!("event: message\ndata: {data}\n\n"))
    }

    /// Pauses before the rest of the body.
    pub fn pause(mut self, d: Duration) -> Reply {
        self.parts.push(Part::Pause(d));
        self
    }

    /// Declares `len` as the `Content-Length`, whatever the body's length.
    pub fn declared_length(mut self, len: usize) -> Reply {
        self.framing = Framing::Length(Some(len));
        self
    }

    /// Sends the body chunked.
    pub fn chunked(mut self) -> Reply {
        self.framing = Framing::Chunked;
        self
    }

    /// Sends the full length but only the first `n` bytes of the body, then closes.
    pub fn cut_at(mut self, n: usize) -> Reply {
        self.cut = Some(n);
        self.after = After::Close;
        self
    }

    /// After the answer (whole or not), keeps the connection without sending anything more
    /// until the peer closes it.
    pub fn then_hang(mut self) -> Reply {
        self.after = After::Hang;
        self
    }

    /// Closes the connection after the answer.
    pub fn then_close(mut self) -> Reply {
        self.after = After::Close;
        self
    }
}

type Handler = Arc<dyn Fn(&Request) -> Reply + Send + Sync>;
type Predicate = Arc<dyn Fn(&Request) -> bool + Send + Sync>;

/// The builder of a [`ScriptedUpstream`].
#[must_use = "an upstream does nothing until it is started"]
pub struct ScriptedUpstream {
    routes: Vec<(Predicate, Handler)>,
    otherwise: Handler,
    headers: Vec<(String, String)>,
}

impl Default for ScriptedUpstream {
    fn default() -> Self {
        Self::new()
    }
}

impl ScriptedUpstream {
    /// An upstream that answers every request with a JSON-RPC "method not found" error until
    /// told otherwise. Routes are tried in the order they were added.
    pub fn new() -> ScriptedUpstream {
        ScriptedUpstream {
            routes: Vec::new(),
            otherwise: Arc::new(|_| Reply::error(-32601, "method not found")),
            headers: Vec::new(),
        }
    }

    /// Answers requests of JSON-RPC `method` with `reply`.
    pub fn on(self, method: &str, reply: Reply) -> Self {
        let method = method.to_owned();
        self.when(move |r| r.method() == method, reply)
    }

    /// Answers requests that `predicate` accepts with `reply`.
    pub fn when(
        self,
        predicate: impl Fn(&Request) -> bool + Send + Sync + 'static,
        reply: Reply,
    ) -> Self {
        self.when_fn(predicate, move |_| reply.clone())
    }

    /// Answers requests that `predicate` accepts with what `f` makes of them.
    pub fn when_fn(
        mut self,
        predicate: impl Fn(&Request) -> bool + Send + Sync + 'static,
        f: impl Fn(&Request) -> Reply + Send + Sync + 'static,
    ) -> Self {
        self.routes.push((Arc::new(predicate), Arc::new(f)));
        self
    }

    /// Answers the `n`th request (from 0) that reaches this route with `reply` (by call
    /// order). Readiness pings, and requests an earlier route took, are not counted.
    pub fn nth(self, n: usize, reply: Reply) -> Self {
        let seen = Arc::new(AtomicUsize::new(0));
        self.when(move |_| seen.fetch_add(1, Ordering::SeqCst) == n, reply)
    }

    /// Answers every request no route took with `reply`.
    pub fn otherwise(self, reply: Reply) -> Self {
        self.otherwise_fn(move |_| reply.clone())
    }

    /// Answers every request no route took with what `f` makes of it (for upstreams with
    /// state, such as sessions).
    pub fn otherwise_fn(mut self, f: impl Fn(&Request) -> Reply + Send + Sync + 'static) -> Self {
        self.otherwise = Arc::new(f);
        self
    }

    /// Headers added to every answer.
    pub fn headers(mut self, headers: &[(&str, &str)]) -> Self {
        self.headers.extend(
            headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        self
    }

    /// Listens on a loopback port; each connection is served on a thread of its own.
    pub fn start(self) -> Scripted {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Seen::default());
        let script = Arc::new(self);
        let s = seen.clone();
        std::thread::spawn(move || {
            for (n, stream) in listener.incoming().map_while(Result::ok).enumerate() {
                // Answers are written in pieces; without this, Nagle's algorithm and delayed
                // ACKs add 40 ms to every exchange.
                let _ = stream.set_nodelay(true);
                s.accepted(n, &stream);
                let (script, s) = (script.clone(), s.clone());
                std::thread::spawn(move || serve(&script, &s, n, stream));
            }
        });
        Scripted { port, seen }
    }

    fn reply_for(&self, req: &Request) -> Reply {
        let handler = self
            .routes
            .iter()
            .find(|(p, _)| p(req))
            .map_or(&self.otherwise, |(_, h)| h);
        handler(req)
    }
}

/// What a scripted upstream saw.
#[derive(Default)]
struct Seen {
    requests: Mutex<Vec<Request>>,
    /// Connections accepted, the sidecar's readiness checks included.
    accepted: AtomicUsize,
    /// Connections not yet closed by the peer (as far as the last accept saw) and the most
    /// open at once.
    open: Mutex<Vec<(usize, TcpStream)>>,
    max_open: AtomicUsize,
    /// Connections that carried a request other than the readiness ping, and those of them
    /// that have ended.
    carried: AtomicUsize,
    carried_ended: AtomicUsize,
}

impl Seen {
    /// A connection accepted: those the peer has closed since are no longer counted open (on
    /// loopback a close reaches this end before the next connection's SYN does).
    fn accepted(&self, n: usize, s: &TcpStream) {
        let mut open = self.open.lock().unwrap();
        open.retain(|(_, o)| !closed_by_peer(o));
        if let Ok(clone) = s.try_clone() {
            open.push((n, clone));
        }
        self.max_open.fetch_max(open.len(), Ordering::SeqCst);
        self.accepted.fetch_add(1, Ordering::SeqCst);
    }

    fn ended(&self, n: usize) {
        self.open.lock().unwrap().retain(|(i, _)| *i != n);
    }
}

/// Whether the peer closed `s` (its FIN waits unread): peeked without blocking, so the count
/// never depends on whether the thread serving it has seen the close yet.
fn closed_by_peer(s: &TcpStream) -> bool {
    const MSG_PEEK: i32 = 0x2;
    const MSG_DONTWAIT: i32 = 0x40;
    let mut buf = [MaybeUninit::<u8>::uninit(); 1];
    match socket2::SockRef::from(s).recv_with_flags(&mut buf, MSG_PEEK | MSG_DONTWAIT) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

/// A running scripted upstream (it runs until the test process ends).
pub struct Scripted {
    pub port: u16,
    seen: Arc<Seen>,
}

impl Scripted {
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// Every request received so far, in order (readiness pings not included).
    pub fn requests(&self) -> Vec<Request> {
        self.seen.requests.lock().unwrap().clone()
    }

    /// How many requests were received so far (readiness pings not included).
    pub fn request_count(&self) -> usize {
        self.seen.requests.lock().unwrap().len()
    }

    /// The JSON-RPC methods of every request received so far.
    pub fn methods(&self) -> Vec<String> {
        let requests = self.seen.requests.lock().unwrap();
        requests.iter().map(|r| r.method().to_owned()).collect()
    }

    /// Connections accepted, the sidecar's readiness checks included.
    pub fn connections_accepted(&self) -> usize {
        self.seen.accepted.load(Ordering::SeqCst)
    }

    /// The most connections open at once.
    pub fn max_open_connections(&self) -> usize {
        self.seen.max_open.load(Ordering::SeqCst)
    }

    /// Connections that carried a request (readiness pings aside).
    pub fn request_connections(&self) -> usize {
        self.seen.carried.load(Ordering::SeqCst)
    }

    /// Of those, the ones that have ended (closed by either side).
    pub fn request_connections_closed(&self) -> usize {
        self.seen.carried_ended.load(Ordering::SeqCst)
    }
}

/// Serves one connection until it ends.
fn serve(script: &ScriptedUpstream, seen: &Seen, n: usize, stream: TcpStream) {
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    let mut input = BufReader::new(stream);
    let mut carried = false;
    while let Some((head, body)) = read_request(&mut input) {
        if is_readiness(&body) {
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{READINESS_ANSWER}",
                READINESS_ANSWER.len()
            );
            if out.write_all(answer.as_bytes()).is_err() {
                break;
            }
            continue;
        }
        if !carried {
            carried = true;
            seen.carried.fetch_add(1, Ordering::SeqCst);
        }
        let json = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let req = Request {
            head,
            body,
            json,
            connection: n,
        };
        seen.requests.lock().unwrap().push(req.clone());
        let reply = script.reply_for(&req);
        match answer(&mut out, script, &reply, &req) {
            After::KeepAlive => continue,
            After::Close => break,
            After::Hang => {
                wait_for_close(&mut input);
                break;
            }
        }
    }
    let _ = out.shutdown(std::net::Shutdown::Both);
    seen.ended(n);
    if carried {
        seen.carried_ended.fetch_add(1, Ordering::SeqCst);
    }
}

/// The sidecar's readiness check (sent at start and by `/readyz`) is a `ping` with this id.
fn is_readiness(body: &[u8]) -> bool {
    body.windows(25)
        .any(|w| w == b"\"epode-sidecar-readiness\"")
}

const READINESS_ANSWER: &str = r#"{"jsonrpc":"2.0","id":"epode-sidecar-readiness","result":{}}"#;

/// Reads (and throws away) whatever comes until the peer closes the connection.
fn wait_for_close(input: &mut BufReader<TcpStream>) {
    let mut buf = [0u8; 4096];
    while matches!(input.read(&mut buf), Ok(n) if n > 0) {}
}

/// Reads one HTTP/1.1 request: the head, then a body of `Content-Length` bytes or in chunks.
/// `None` when the connection ends (or breaks) first.
pub fn read_request(input: &mut impl BufRead) -> Option<(String, Vec<u8>)> {
    let mut head = Vec::new();
    // Blank lines before a request line are allowed (RFC 9112, 2.2).
    while head.is_empty() || head == b"\r\n" || head == b"\n" {
        head.clear();
        if input.read_until(b'\n', &mut head).ok()? == 0 {
            return None;
        }
    }
    loop {
        let start = head.len();
        if input.read_until(b'\n', &mut head).ok()? == 0 {
            return None;
        }
        if head[start..] == *b"\r\n" || head[start..] == *b"\n" {
            break;
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let chunked = header_of(&head, "transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    let body = if chunked {
        read_chunked(input)?
    } else {
        let len = header_of(&head, "content-length")
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        input.read_exact(&mut body).ok()?;
        body
    };
    Some((head, body))
}

fn read_chunked(input: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut line = String::new();
        input.read_line(&mut line).ok()?;
        let size = line.trim().split(';').next()?;
        let size = usize::from_str_radix(size.trim(), 16).ok()?;
        if size == 0 {
            // Trailers, up to the blank line.
            loop {
                let mut t = String::new();
                if input.read_line(&mut t).ok()? == 0 || t.trim().is_empty() {
                    return Some(body);
                }
            }
        }
        let at = body.len();
        body.resize(at + size, 0);
        input.read_exact(&mut body[at..]).ok()?;
        let mut crlf = String::new();
        input.read_line(&mut crlf).ok()?;
    }
}

/// Writes `reply` to `req`; what to do with the connection next.
fn answer(out: &mut TcpStream, script: &ScriptedUpstream, reply: &Reply, req: &Request) -> After {
    std::thread::sleep(reply.delay);
    match reply.kind {
        Kind::Silent => return After::Hang,
        Kind::HangUp => return After::Close,
        Kind::Answer => {}
    }
    let reason = match reply.status {
        200 => "OK",
        202 => "Accepted",
        401 => "Unauthorized",
        404 => "Not Found",
        500 => "Internal Server Error",
        _ => "Status",
    };
    let mut head = format!("HTTP/1.1 {} {reason}\r\n", reply.status);
    for (k, v) in script.headers.iter().chain(&reply.headers) {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    // A body with a known, finite length is made whole first; one with endless or paused
    // parts is streamed.
    let streamed = reply
        .parts
        .iter()
        .any(|p| matches!(p, Part::Pause(_) | Part::Repeat(_, None)));
    match reply.framing {
        Framing::Length(declared) => {
            let len = declared.or_else(|| (!streamed).then(|| finite_len(reply, req)));
            if let Some(len) = len {
                head.push_str(&format!("content-length: {len}\r\n"));
            }
        }
        Framing::Chunked => head.push_str("transfer-encoding: chunked\r\n"),
        Framing::UntilClose => {}
    }
    head.push_str("\r\n");
    if out.write_all(head.as_bytes()).is_err() {
        return After::Close;
    }
    let mut budget = reply.cut.unwrap_or(usize::MAX);
    for part in &reply.parts {
        if budget == 0 {
            break;
        }
        let ok = match part {
            Part::Pause(d) => {
                std::thread::sleep(*d);
                true
            }
            Part::Repeat(chunk, total) => {
                let mut sent = 0;
                let mut ok = true;
                while ok && total.is_none_or(|t| sent < t) && budget > 0 {
                    let n = chunk.len().min(total.map_or(usize::MAX, |t| t - sent));
                    ok = write_part(out, reply.framing, &chunk[..n], &mut budget);
                    sent += n;
                }
                ok
            }
            other => write_part(out, reply.framing, &bytes_of(other, req), &mut budget),
        };
        if !ok {
            return After::Close;
        }
    }
    if reply.framing == Framing::Chunked && reply.cut.is_none() && reply.after != After::Hang {
        let _ = out.write_all(b"0\r\n\r\n");
    }
    let _ = out.flush();
    match (reply.framing, reply.after) {
        // A body that ends with the connection leaves nothing to keep alive.
        (Framing::UntilClose, After::KeepAlive) => After::Close,
        (_, after) => after,
    }
}

/// Writes `bytes` (as one chunk when chunked), no more than `budget` of them; whether the
/// peer is still there.
fn write_part(out: &mut TcpStream, framing: Framing, bytes: &[u8], budget: &mut usize) -> bool {
    let bytes = &bytes[..bytes.len().min(*budget)];
    *budget -= bytes.len();
    if bytes.is_empty() {
        return true;
    }
    if framing == Framing::Chunked {
        let mut chunk = format!("{:x}\r\n", bytes.len()).into_bytes();
        chunk.extend_from_slice(bytes);
        chunk.extend_from_slice(b"\r\n");
        out.write_all(&chunk).is_ok()
    } else {
        out.write_all(bytes).is_ok()
    }
}

fn bytes_of(part: &Part, req: &Request) -> Vec<u8> {
    match part {
        Part::Bytes(b) => b.clone(),
        Part::Id => req.id().to_string().into_bytes(),
        Part::Echo => {
            serde_json::json!({"head": req.head, "body": String::from_utf8_lossy(&req.body)})
                .to_string()
                .into_bytes()
        }
        Part::Repeat(..) | Part::Pause(_) => Vec::new(),
    }
}

/// The length of a body with no endless part.
fn finite_len(reply: &Reply, req: &Request) -> usize {
    reply
        .parts
        .iter()
        .map(|p| match p {
            Part::Repeat(_, total) => total.unwrap_or(0),
            other => bytes_of(other, req).len(),
        })
        .sum()
}
