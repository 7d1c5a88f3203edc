//! A stdio MCP server: the child process the sidecar runs and every worker speaks to over its
//! one pipe (newline-delimited JSON-RPC). To the rest of `upstream` it looks like an HTTP
//! upstream: [`StdioUpstream::post`] takes one JSON-RPC message and gives back a response whose
//! body is one JSON message (when the response is the first thing the child writes for the
//! request) or an SSE stream of the request's notifications ending with its response, so era
//! detection, translation, the feedback binding and the limits work unchanged. As for an HTTP
//! upstream's response head, the child must begin its answer (the response, or a first
//! notification) within the upstream timeout, or the request gets 504.
//!
//! A 2025-era child has one session, the pipe: the first `initialize` of each child process
//! goes to it and later ones are answered with its result; the session id the sidecar hands
//! out names the child process, so after a restart the old id gets 404 and the sidecar
//! initialises the new child once. `child` runs, restarts and stops the process; `table`
//! routes what it writes; `body` carries an answer back.

mod body;
mod child;
mod table;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot, watch};

pub(crate) use self::body::StdioBody;
use self::body::{Streamed, Waiter};
use self::table::{Held, Routed, Table, Waiting, NOTES};
use crate::budget::MemoryBudget;
use crate::config::StdioCommand;
use crate::error::{Error, Kind};
use crate::log_summary::LogSummary;
use crate::mcp::headers::SESSION_ID;
use crate::mcp::raw::{self, RawMap};
use crate::mcp::rewrite::modern_error_status;
use crate::mcp::version::META_PROTOCOL_VERSION;

/// The session ids the sidecar hands out for a 2025-era child name its process.
const SESSION_PREFIX: &str = "stdio-";

/// One run of the child process.
pub(super) struct Generation {
    n: u64,
    stdin: mpsc::Sender<Bytes>,
    /// The child's `initialize` result, once it gave one.
    init: OnceLock<Box<RawValue>>,
    init_lock: tokio::sync::Mutex<()>,
    /// Whether `notifications/initialized` went to this child.
    initialized: AtomicBool,
}

/// What every worker shares about the child.
pub(super) struct Shared {
    table: Mutex<Table>,
    live: watch::Sender<Option<Arc<Generation>>>,
    stop: watch::Sender<bool>,
    next_id: AtomicU64,
    timeout: Duration,
    budget: Arc<MemoryBudget>,
    max_line: usize,
    on_limit: Arc<dyn Fn(&'static str) + Send + Sync>,
    dropped: LogSummary,
    supervisor: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn current(&self) -> Option<Arc<Generation>> {
        self.live.borrow().clone()
    }

    /// Tells child `generation` that the client of request `id` went away.
    fn cancel(&self, generation: u64, id: u64) {
        if let Some(g) = self.current().filter(|g| g.n == generation) {
            let line = format!(
                r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{id},"reason":"the client went away"}}}}"#
            );
            let _ = g.stdin.try_send(self::line(line.as_bytes()));
        }
    }

    /// One line the child wrote to its stdout.
    fn on_line(&self, generation: u64, line: &[u8]) {
        let Some(msg) = raw::parse_message(line) else {
            self.dropped.add(
                "lines that are not JSON-RPC messages (stdout is the protocol channel: log to stderr)",
                1,
            );
            return;
        };
        let routed = self.lock().route(generation, msg, &self.budget);
        match routed {
            Routed::Delivered => {}
            Routed::Reply(bytes) => {
                if let Some(g) = self.current().filter(|g| g.n == generation) {
                    if g.stdin.try_send(self::line(&bytes)).is_err() {
                        self.dropped
                            .add("answers to its own requests (its stdin is full)", 1);
                    }
                }
            }
            Routed::Dropped(why) => self.dropped.add(why, 1),
        }
    }

    /// A line longer than the sidecar reads: the request it answers (found by the id near its
    /// start) gets 502 now rather than waiting in vain.
    fn on_long_line(&self, start: &[u8]) {
        (self.on_limit)("upstream_answer_size");
        let failed = leading_id(start).is_some_and(|id| {
            self.lock().fail_one(
                id,
                Error::new(
                    Kind::UpstreamTooLarge {
                        limit: self.max_line,
                    },
                    "",
                ),
            )
        });
        if !failed {
            self.dropped.add(
                "messages longer than EPODE_SIDECAR_MAX_UPSTREAM_ANSWER_BYTES",
                1,
            );
        }
    }
}

/// The number after the first `"id":` near the start of a message.
fn leading_id(start: &[u8]) -> Option<u64> {
    let text = String::from_utf8_lossy(start);
    text.match_indices("\"id\"").find_map(|(at, key)| {
        let rest = text[at + key.len()..]
            .trim_start()
            .strip_prefix(':')?
            .trim_start();
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    })
}

/// The upstream as a child process, shared by every worker.
#[derive(Clone)]
pub(crate) struct StdioUpstream {
    shared: Arc<Shared>,
}

/// What bounds the stdio hop (the upstream's own settings, and the process-wide limits).
pub(crate) struct StdioBounds {
    pub(crate) timeout: Duration,
    pub(crate) budget: Arc<MemoryBudget>,
    pub(crate) max_line: usize,
    pub(crate) on_limit: Arc<dyn Fn(&'static str) + Send + Sync>,
}

fn session_of(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(SESSION_ID)?
        .to_str()
        .ok()?
        .strip_prefix(SESSION_PREFIX)?
        .parse()
        .ok()
}

fn json_response(status: StatusCode, held: Held) -> Response<StdioBody> {
    let mut resp = Response::new(StdioBody::Json(Some(held)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn accepted() -> Response<StdioBody> {
    let mut resp = Response::new(StdioBody::Json(None));
    *resp.status_mut() = StatusCode::ACCEPTED;
    resp
}

/// Whether a request carries the 2026 envelope (its errors then get their 2026 statuses).
fn is_modern(msg: &RawMap) -> bool {
    msg.get("params")
        .and_then(|p| raw::open(p))
        .and_then(|p| p.get("_meta").and_then(|m| raw::open(m)))
        .is_some_and(|m| m.contains_key(META_PROTOCOL_VERSION))
}

/// Newlines end a message on the pipe; in valid JSON they can only be whitespace between
/// tokens, so they become spaces.
fn line(bytes: &[u8]) -> Bytes {
    let mut out: Vec<u8> = bytes
        .iter()
        .map(|b| if matches!(b, b'\n' | b'\r') { b' ' } else { *b })
        .collect();
    out.push(b'\n');
    Bytes::from(out)
}

impl StdioUpstream {
    /// Starts the child now (a command that cannot start is an error at once) and the task
    /// that restarts it; must run inside the runtime that will drive its pipes.
    pub(crate) fn start(command: &StdioCommand, bounds: StdioBounds) -> Result<Self, Error> {
        let first = child::spawn(command).map_err(|e| {
            Error::new(
                Kind::UpstreamUnreachable,
                format!("cannot start the MCP server `{}`: {e}", command.program),
            )
        })?;
        let (live, _) = watch::channel(None);
        let (stop, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            table: Mutex::new(Table::default()),
            live,
            stop,
            next_id: AtomicU64::new(1),
            timeout: bounds.timeout,
            budget: bounds.budget,
            max_line: bounds.max_line,
            on_limit: bounds.on_limit,
            dropped: LogSummary::new(
                "messages from the MCP server process not delivered",
                Duration::from_secs(60),
            ),
            supervisor: Mutex::new(None),
        });
        let task = tokio::spawn(child::supervise(shared.clone(), command.clone(), first));
        *shared.supervisor.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
        Ok(StdioUpstream { shared })
    }

    /// Whether the child is running.
    pub(crate) fn ready(&self) -> bool {
        self.shared.current().is_some()
    }

    /// Stops the child (stdin closed and SIGTERM to its process group, SIGKILL after its
    /// grace) and waits until it is gone.
    pub(crate) async fn shutdown(&self) {
        self.shared.stop.send_replace(true);
        let task = self
            .shared
            .supervisor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(task) = task {
            let _ = task.await;
        }
        self.shared.dropped.flush();
    }

    /// The running child, waiting for a restart to finish within the upstream timeout.
    async fn generation(&self) -> Result<Arc<Generation>, Error> {
        if let Some(g) = self.shared.current() {
            return Ok(g);
        }
        let not_running = || {
            Error::new(
                Kind::UpstreamUnreachable,
                "the MCP server process is not running (it is being restarted)",
            )
        };
        if *self.shared.stop.borrow() {
            return Err(not_running());
        }
        let mut rx = self.shared.live.subscribe();
        let live = tokio::time::timeout(self.shared.timeout, async {
            rx.wait_for(Option::is_some)
                .await
                .ok()
                .and_then(|g| g.clone())
        })
        .await;
        live.ok().flatten().ok_or_else(not_running)
    }

    /// Writes one message to the child, waiting for room in its stdin queue up to the
    /// upstream timeout.
    async fn write(&self, g: &Generation, bytes: &[u8]) -> Result<(), Error> {
        match g.stdin.send_timeout(line(bytes), self.shared.timeout).await {
            Ok(()) => Ok(()),
            Err(mpsc::error::SendTimeoutError::Timeout(_)) => {
                (self.shared.on_limit)("upstream_stdin");
                Err(Error::new(
                    Kind::UpstreamTimeout(self.shared.timeout),
                    "the MCP server process is not reading its stdin",
                ))
            }
            Err(mpsc::error::SendTimeoutError::Closed(_)) => Err(Error::new(
                Kind::UpstreamFailed,
                "the MCP server process exited before reading the request",
            )),
        }
    }

    /// One JSON-RPC message to the child, answered as an HTTP upstream would: 202 for a
    /// notification or a client's answer, a response for a request. `answers`: the client
    /// may be sent the server's own requests (a 2025 client).
    pub(crate) async fn post(
        &self,
        headers: &HeaderMap,
        body: &Bytes,
        answers: bool,
    ) -> Result<Response<StdioBody>, Error> {
        let Some(mut msg) = raw::parse_message(body) else {
            return Err(Error::new(Kind::Parse, "the request is not a JSON object"));
        };
        let g = self.generation().await?;
        if session_of(headers).is_some_and(|s| s != g.n) {
            let gone = Error::new(
                Kind::UpstreamFailed,
                "the MCP server process restarted; its session is gone",
            );
            return Ok(json_response(
                StatusCode::NOT_FOUND,
                (
                    gone.body(msg.get("id").map(|i| &**i)),
                    self.shared.budget.start(),
                ),
            ));
        }
        let method = msg
            .get("method")
            .and_then(|m| raw::as_str(m).map(|s| s.into_owned()));
        match (method.as_deref(), msg.contains_key("id")) {
            (None, _) => {
                let answer = self.shared.lock().answer(g.n, msg);
                if let Some(bytes) = answer {
                    self.write(&g, &bytes).await?;
                }
                Ok(accepted())
            }
            (Some(m), false) => {
                if m == "notifications/initialized" && g.initialized.swap(true, Ordering::AcqRel) {
                    return Ok(accepted());
                }
                if m == "notifications/cancelled" && !self.cancelled_to_child(&mut msg) {
                    return Ok(accepted());
                }
                self.write(&g, &raw::to_bytes(&msg)).await?;
                Ok(accepted())
            }
            (Some("initialize"), true) => self.initialize(&g, msg).await,
            (Some(_), true) => self.request(&g, msg, answers).await,
        }
    }

    /// Points a client's `notifications/cancelled` at the child's id for that request; false
    /// when no single waiting request has the id it names.
    fn cancelled_to_child(&self, msg: &mut RawMap) -> bool {
        let Some(mut params) = msg.get("params").and_then(|p| raw::open(p)) else {
            return false;
        };
        let Some(child) = params
            .get("requestId")
            .and_then(|id| self.shared.lock().child_id_of(id))
        else {
            return false;
        };
        params.insert("requestId".to_owned(), raw::raw(&child));
        msg.insert("params".to_owned(), raw::raw(&params));
        true
    }

    /// `initialize`: the child's first is its own; later ones (other clients, or the same
    /// client again) get its result, as for one long-lived session.
    async fn initialize(&self, g: &Generation, msg: RawMap) -> Result<Response<StdioBody>, Error> {
        let client_id = msg.get("id").cloned().unwrap_or_else(raw::null);
        let cached = |result: &RawValue| {
            let answer = raw::result_message(&client_id, result.to_owned());
            let mut resp = json_response(
                StatusCode::OK,
                (raw::to_bytes(&answer), self.shared.budget.start()),
            );
            if let Ok(v) = HeaderValue::from_str(&format!("{SESSION_PREFIX}{}", g.n)) {
                resp.headers_mut().insert(SESSION_ID, v);
            }
            resp
        };
        if let Some(result) = g.init.get() {
            return Ok(cached(result));
        }
        let _one_at_a_time = g.init_lock.lock().await;
        if let Some(result) = g.init.get() {
            return Ok(cached(result));
        }
        let (bytes, held) = self.request_whole(g, msg).await?;
        let result = raw::parse_message(&bytes)
            .and_then(|m| m.get("result").filter(|r| raw::is_object(r)).cloned());
        match result {
            Some(result) => {
                let _ = g.init.set(result);
                Ok(cached(
                    g.init.get().unwrap_or_else(|| unreachable!("just set")),
                ))
            }
            None => Ok(json_response(StatusCode::OK, (bytes, held))),
        }
    }

    /// A request whose answer is read whole (the sidecar's own `initialize`).
    async fn request_whole(&self, g: &Generation, msg: RawMap) -> Result<Held, Error> {
        let (_waiter, _notes, done) = self.send(g, msg, false).await?;
        match tokio::time::timeout(self.shared.timeout, done).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(Error::new(
                Kind::UpstreamFailed,
                "the MCP server process went away before answering",
            )),
            Err(_) => Err(Error::new(Kind::UpstreamTimeout(self.shared.timeout), "")),
        }
    }

    /// Registers a request under a fresh id (and progress token) and writes it to the child.
    async fn send(
        &self,
        g: &Generation,
        mut msg: RawMap,
        answers: bool,
    ) -> Result<
        (
            Waiter,
            mpsc::Receiver<Held>,
            oneshot::Receiver<table::Answer>,
        ),
        Error,
    > {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let client_id = msg
            .insert("id".to_owned(), raw::raw(&id))
            .unwrap_or_else(raw::null);
        let token = swap_progress_token(&mut msg, id);
        let (notes_tx, notes) = mpsc::channel(NOTES);
        let (done_tx, done) = oneshot::channel();
        self.shared.lock().insert(
            id,
            Waiting {
                generation: g.n,
                seq: id,
                client_id,
                token,
                answers,
                notes: notes_tx,
                done: Some(done_tx),
            },
        );
        let mut waiter = Waiter {
            shared: self.shared.clone(),
            id,
            generation: g.n,
            sent: false,
        };
        self.write(g, &raw::to_bytes(&msg)).await?;
        waiter.sent = true;
        Ok((waiter, notes, done))
    }

    /// A client request: JSON when the response is the first thing the child writes for it,
    /// an SSE stream when a notification comes first; 504 when nothing comes within the
    /// upstream timeout.
    async fn request(
        &self,
        g: &Generation,
        msg: RawMap,
        answers: bool,
    ) -> Result<Response<StdioBody>, Error> {
        let modern = is_modern(&msg);
        let (waiter, mut notes, mut done) = self.send(g, msg, answers).await?;
        let first = tokio::time::timeout(self.shared.timeout, async {
            tokio::select! {
                biased;
                Some(note) = notes.recv() => Err(note),
                answer = &mut done => Ok(answer),
            }
        })
        .await
        .map_err(|_| Error::new(Kind::UpstreamTimeout(self.shared.timeout), ""))?;
        let first = match first {
            Err(note) => Some(note),
            Ok(answer) => {
                let held = answer.map_err(|_| {
                    Error::new(
                        Kind::UpstreamFailed,
                        "the MCP server process went away before answering",
                    )
                })??;
                let status = if modern {
                    raw::parse_message(&held.0)
                        .and_then(|m| modern_error_status(&m))
                        .unwrap_or(StatusCode::OK)
                } else {
                    StatusCode::OK
                };
                drop(waiter);
                return Ok(json_response(status, held));
            }
        };
        let mut resp = Response::new(StdioBody::Stream {
            first,
            parts: Some(Streamed {
                notes,
                done,
                waiter,
            }),
            answer: None,
        });
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        Ok(resp)
    }
}

/// Replaces a request's `params._meta.progressToken` with `id` (unique on the pipe); returns
/// the client's own.
fn swap_progress_token(msg: &mut RawMap, id: u64) -> Option<Box<RawValue>> {
    let mut params = msg.get("params").and_then(|p| raw::open(p))?;
    let mut meta = params.get("_meta").and_then(|m| raw::open(m))?;
    let token = meta.insert("progressToken".to_owned(), raw::raw(&id))?;
    params.insert("_meta".to_owned(), raw::raw(&meta));
    msg.insert("params".to_owned(), raw::raw(&params));
    Some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_of_a_long_answer_is_found_near_its_start() {
        assert_eq!(
            leading_id(br#"{"jsonrpc":"2.0","id":42,"result":{"#),
            Some(42)
        );
        assert_eq!(leading_id(br#"{"id" : 7 ,"#), Some(7));
        assert_eq!(
            leading_id(br#"{"jsonrpc":"2.0","result":{"content":["#),
            None
        );
        assert_eq!(leading_id(br#"{"id":"x","#), None);
    }

    #[test]
    fn newlines_in_a_message_become_spaces_and_one_ends_it() {
        assert_eq!(&line(b"{\n\"a\":\r\n1}")[..], b"{ \"a\":  1}\n");
    }

    #[test]
    fn progress_tokens_are_swapped_only_when_asked_for() {
        let mut msg = raw::parse_message(
            br#"{"jsonrpc":"2.0","id":"c","method":"tools/call","params":{"name":"x","_meta":{"progressToken":"tok","k":1}}}"#,
        )
        .unwrap();
        let token = swap_progress_token(&mut msg, 9).unwrap();
        assert_eq!(token.get(), r#""tok""#);
        let text = String::from_utf8(raw::to_bytes(&msg).to_vec()).unwrap();
        assert!(text.contains(r#""progressToken":9"#), "{text}");
        assert!(text.contains(r#""k":1"#), "{text}");
        let mut none =
            raw::parse_message(br#"{"id":1,"method":"tools/list","params":{}}"#).unwrap();
        assert!(swap_progress_token(&mut none, 3).is_none());
        assert!(!String::from_utf8_lossy(&raw::to_bytes(&none)).contains("progressToken"));
    }
}
