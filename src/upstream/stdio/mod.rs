//! A stdio MCP server: the child process the sidecar runs and every worker speaks to over its
//! pipe (newline-delimited JSON-RPC). To the rest of `upstream` it looks like an HTTP
//! upstream: [`StdioUpstream::post`] takes one JSON-RPC message and gives back a response whose
//! body is one JSON message (when the response is the first thing the child writes for the
//! request) or an SSE stream of the request's notifications ending with its response, so era
//! detection, translation, the feedback binding and the limits work unchanged. As for an HTTP
//! upstream's response head, the child must begin its answer (the response, or a first
//! notification) within the upstream timeout, or the request gets 504.
//!
//! Clients share one child (`shared`, the default) or each client credential gets its own
//! (`per-client`: [`pool`]). On a shared pipe, every id the child sees is the sidecar's own
//! and unguessable, and a client can answer or cancel only what it owns (`table`).
//!
//! A 2025-era child has one session, the pipe: the first `initialize` of each child process
//! goes to it and later ones are answered with its result; the session id the sidecar hands
//! out names the child process, so after a restart the old id gets 404 and the sidecar
//! initialises the new child once. `pipe` is what the other parts share: the child's pipe
//! through its restarts, its runs, its bounds. `child` starts, runs, restarts and stops the
//! process (started through `exec`'s trampoline); `table` routes what it writes; `scan` finds
//! the id of a line too long to keep; `body` carries an answer back.

mod body;
mod child;
pub(crate) mod exec;
mod pipe;
mod pool;
mod scan;
mod table;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot};

pub(crate) use self::body::StdioBody;
use self::body::{Streamed, Waiter};
pub(crate) use self::pipe::StdioBounds;
use self::pipe::{Generation, Pipe, Using};
use self::pool::Pool;
use self::table::{FromClient, Held, Waiting, NOTES};
use super::caller::{Caller, ServerRequests};
use super::ready::NotReady;
use crate::body::{answer, JSON};
use crate::config::{StdioChildren, StdioCommand};
use crate::error::{Error, ErrorKind};
use crate::ledger::Ledger;
use crate::mcp::era::Era;
use crate::mcp::headers::SESSION_ID;
use crate::mcp::raw::{self, RawMap};
use crate::mcp::rewrite::modern_error_status;
use crate::mcp::version::META_PROTOCOL_VERSION;
use crate::metrics::LimitKind;

/// The session ids the sidecar hands out for a 2025-era child name its process.
const SESSION_PREFIX: &str = "stdio-";

/// How long the readiness probe waits for a child's answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The upstream as a child process (or one per client), shared by every worker.
#[derive(Clone)]
pub(crate) struct StdioUpstream {
    children: Arc<Children>,
    /// The readiness probe (see [`StdioBounds::modern`]).
    probe: &'static [u8],
}

/// The readiness probes: any answer, an error included, says the child runs.
const PING: &[u8] = br#"{"jsonrpc":"2.0","id":0,"method":"ping"}"#;
const DISCOVER: &[u8] = br#"{"jsonrpc":"2.0","id":0,"method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"epode-sidecar","version":"readiness"}}}}"#;

enum Children {
    Shared(Arc<Pipe>),
    PerClient(Pool),
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
    answer(status, Some(JSON), StdioBody::Json(Some(held)))
}

fn accepted() -> Response<StdioBody> {
    answer(StatusCode::ACCEPTED, None, StdioBody::Json(None))
}

/// The era a request was sent in: the 2026 envelope makes it 2026-07-28 (its errors then get
/// their 2026 statuses).
fn era_of(msg: &RawMap) -> Era {
    let has_envelope = msg
        .get("params")
        .and_then(|p| raw::open(p))
        .and_then(|p| p.get("_meta").and_then(|m| raw::open(m)))
        .is_some_and(|m| m.contains_key(META_PROTOCOL_VERSION));
    if has_envelope {
        Era::Modern
    } else {
        Era::Legacy
    }
}

impl StdioUpstream {
    /// Starts the child (the first one, for a child per client) now, and the tasks that
    /// restart it; must run inside the runtime that will drive its pipes.
    pub(crate) fn start(
        command: &StdioCommand,
        bounds: StdioBounds,
        ledger: Arc<Ledger>,
    ) -> Result<Self, Error> {
        exec::become_subreaper();
        spawn_reaper();
        let probe = if bounds.modern { DISCOVER } else { PING };
        let children = match command.children {
            StdioChildren::Shared => Children::Shared(child::start(command, &bounds)?),
            StdioChildren::PerClient { max, idle } => {
                let first = child::start(command, &bounds)?;
                Children::PerClient(Pool::new(
                    command.clone(),
                    bounds,
                    first,
                    (max, idle),
                    ledger,
                ))
            }
        };
        Ok(StdioUpstream {
            children: Arc::new(children),
            probe,
        })
    }

    /// The pipe that serves `caller`.
    async fn pipe(&self, caller: &Caller) -> Result<Arc<Pipe>, Error> {
        match &*self.children {
            Children::Shared(p) => Ok(p.clone()),
            Children::PerClient(pool) => pool.get(caller.key()).await,
        }
    }

    /// Whether the child runs and answers: it said something since it started, or it
    /// answers a `ping` now (any answer, an error included).
    pub(crate) async fn ready(&self) -> Result<(), NotReady> {
        let pipe = match &*self.children {
            Children::Shared(p) => p.clone(),
            // Any child that runs tells: a probe must not take a client's place in the pool.
            Children::PerClient(pool) => match pool.any().await.map_err(|e| {
                NotReady::passing("no MCP server process is available", e.to_string())
            })? {
                Some(pipe) => pipe,
                None => return Ok(()),
            },
        };
        let Some(g) = pipe.current() else {
            return Err(NotReady::passing(
                "the MCP server process is not running",
                pipe.why_not_running(),
            ));
        };
        if g.answered.load(Ordering::Relaxed) {
            return Ok(());
        }
        let ping = raw::parse_message(self.probe).ok_or_else(|| {
            let why = "the readiness probe could not be built";
            NotReady::lasting(why, why)
        })?;
        let internal = Caller::internal();
        let probe = request_whole(&pipe, &g, ping, &internal);
        match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
            Ok(Ok(_)) => Ok(()),
            // A child that keeps ending: how its run before ended says why (its stderr).
            Ok(Err(e)) => Err(NotReady::passing(
                "the MCP server process did not answer a ping",
                match pipe.previous_end() {
                Some(how) => format!(
                    "the MCP server process did not answer a ping: {e}; the run before: {how}"
                ),
                None => format!("the MCP server process did not answer a ping: {e}"),
                },
            )),
            Err(_) => Err(NotReady::passing(
                "the MCP server process has not answered yet",
                format!(
                    "the MCP server process has said nothing since it started, and did not answer a ping within {}",
                    humantime::format_duration(PROBE_TIMEOUT)
                ),
            )),
        }
    }

    /// Stops every child and waits until they are gone, with whatever they left behind.
    pub(crate) async fn shutdown(&self) {
        match &*self.children {
            Children::Shared(p) => p.stop().await,
            Children::PerClient(pool) => pool.shutdown().await,
        }
        exec::kill_leftovers();
    }

    /// The child's change notices for `caller` (its child, when each client has its own),
    /// as an SSE stream, the way a 2025 server's session GET stream carries them.
    pub(crate) async fn watch(&self, caller: &Caller) -> Result<Response<StdioBody>, Error> {
        let pipe = self.pipe(caller).await?;
        let _using = Using::new(&pipe);
        generation(&pipe).await?;
        let (key, notes) = pipe.lock().watch();
        let body = StdioBody::Watch {
            notes,
            _watching: body::Watching {
                pipe: pipe.clone(),
                key,
            },
        };
        Ok(answer(StatusCode::OK, Some("text/event-stream"), body))
    }

    /// One JSON-RPC message to the child, answered as an HTTP upstream would: 202 for a
    /// notification or a client's answer, a response for a request. `relay`: whether the
    /// client may be sent the server's own requests (a 2025 client).
    pub(crate) async fn post(
        &self,
        caller: &Caller,
        headers: &HeaderMap,
        body: &Bytes,
        relay: ServerRequests,
    ) -> Result<Response<StdioBody>, Error> {
        let Some(mut msg) = raw::parse_message(body) else {
            return Err(Error::new(
                ErrorKind::Parse,
                "the request is not a JSON object",
            ));
        };
        let pipe = self.pipe(caller).await?;
        let _using = Using::new(&pipe);
        let g = generation(&pipe).await?;
        if session_of(headers).is_some_and(|s| s != g.n) {
            let gone = Error::new(
                ErrorKind::SessionGone,
                "the MCP server process restarted; its session is gone",
            );
            return Ok(json_response(
                gone.status(),
                (gone.body(msg.get("id").map(|i| &**i)), pipe.budget.start()),
            ));
        }
        let method = msg
            .get("method")
            .and_then(|m| raw::as_str(m).map(|s| s.into_owned()));
        match (method.as_deref(), msg.contains_key("id")) {
            (None, _) => {
                let answer = pipe.lock().answer(g.n, msg, caller);
                client_message(&pipe, &g, answer).await?;
                Ok(accepted())
            }
            (Some(m), false) => {
                if m == "notifications/initialized" && g.initialized.swap(true, Ordering::AcqRel) {
                    return Ok(accepted());
                }
                let out = if m == "notifications/cancelled" {
                    cancelled_to_child(&pipe, &mut msg, caller)
                } else {
                    FromClient::Write(raw::to_bytes(&msg))
                };
                client_message(&pipe, &g, out).await?;
                Ok(accepted())
            }
            (Some("initialize"), true) => initialize(&pipe, &g, msg, caller).await,
            (Some(_), true) => request(&pipe, &g, msg, caller, relay).await,
        }
    }
}

/// Reaps what is reparented to the sidecar (it is the subreaper of its children's processes,
/// and PID 1 in a container) whenever a child of its exits.
fn spawn_reaper() {
    static STARTED: AtomicBool = AtomicBool::new(false);
    if STARTED.swap(true, Ordering::AcqRel) {
        return;
    }
    let Ok(mut chld) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()) else {
        return;
    };
    tokio::spawn(async move {
        while chld.recv().await.is_some() {
            exec::reap_orphans();
        }
    });
}

/// The running child, waiting for a restart to finish within the upstream timeout.
async fn generation(pipe: &Pipe) -> Result<Arc<Generation>, Error> {
    if let Some(g) = pipe.current() {
        return Ok(g);
    }
    let not_running = || {
        Error::new(
            ErrorKind::UpstreamUnreachable,
            "the MCP server process is not running (it is being restarted)",
        )
    };
    if *pipe.stop.borrow() {
        return Err(not_running());
    }
    let mut rx = pipe.live.subscribe();
    let live = tokio::time::timeout(pipe.timeout, async {
        rx.wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|g| g.clone())
    })
    .await;
    live.ok().flatten().ok_or_else(not_running)
}

/// Writes one message to the child, waiting for room in its stdin queue up to the wait
/// (`EPODE_SIDECAR_UPSTREAM_WAIT`), then 503: nothing of it reaches the child; its bytes count
/// in the memory budget until written.
async fn write(pipe: &Pipe, g: &Generation, bytes: &[u8]) -> Result<(), Error> {
    let Some(queued) = pipe.queued(bytes) else {
        (pipe.on_limit)(LimitKind::MemoryBudget);
        return Err(Error::new(
            ErrorKind::Overloaded { retry_after: 1 },
            "its memory budget is spent (the MCP server process is not keeping up with its stdin)",
        )
        .unsent());
    };
    match g.stdin.send_timeout(queued, pipe.wait).await {
        Ok(()) => Ok(()),
        Err(mpsc::error::SendTimeoutError::Timeout(_)) => {
            (pipe.on_limit)(LimitKind::UpstreamStdin);
            Err(Error::new(
                ErrorKind::Overloaded { retry_after: 1 },
                format!(
                    "the MCP server process is not reading its stdin: its queue (EPODE_SIDECAR_UPSTREAM_STDIN_QUEUE) stayed full for {}, so the request was not sent",
                    humantime::format_duration(pipe.wait)
                ),
            )
            .unsent())
        }
        Err(mpsc::error::SendTimeoutError::Closed(_)) => Err(Error::new(
            ErrorKind::UpstreamFailed,
            "the MCP server process stopped taking requests (it exited, or stopped reading its stdin) before reading this one; it is being restarted",
        )),
    }
}

/// A client's answer or cancellation: written to the child, or ignored and counted.
async fn client_message(pipe: &Pipe, g: &Generation, out: FromClient) -> Result<(), Error> {
    match out {
        FromClient::Write(bytes) => write(pipe, g, &bytes).await,
        FromClient::Ignored(why) => {
            (pipe.on_limit)(LimitKind::StdioNotOwner);
            pipe.dropped.add(why, 1);
            Ok(())
        }
    }
}

/// Points a client's `notifications/cancelled` at the child's id for that request, when the
/// client owns exactly one waiting request of the id it names.
fn cancelled_to_child(pipe: &Pipe, msg: &mut RawMap, caller: &Caller) -> FromClient {
    let Some(mut params) = msg.get("params").and_then(|p| raw::open(p)) else {
        return FromClient::Ignored("cancellations naming no request");
    };
    let Some(key) = params
        .get("requestId")
        .and_then(|id| pipe.lock().cancel_target(id, caller))
    else {
        return FromClient::Ignored("cancellations of no request of the client's own");
    };
    params.insert("requestId".to_owned(), table::key_raw(key));
    msg.insert("params".to_owned(), raw::raw(&params));
    // The server never answers a cancelled request: its stream ends here, not at a timeout.
    pipe.lock().fail_one(
        key,
        Error::new(
            ErrorKind::UpstreamFailed,
            "the request was cancelled by its client",
        ),
    );
    FromClient::Write(raw::to_bytes(msg))
}

/// `initialize`: the child's first is its own; later ones (other clients, or the same client
/// again) get its result, as for one long-lived session.
async fn initialize(
    pipe: &Arc<Pipe>,
    g: &Generation,
    msg: RawMap,
    caller: &Caller,
) -> Result<Response<StdioBody>, Error> {
    let client_id = msg.get("id").cloned().unwrap_or_else(raw::null);
    let cached = |result: &RawValue| {
        let answer = raw::result_message(&client_id, result.to_owned());
        let mut resp = json_response(
            StatusCode::OK,
            (raw::to_bytes(&answer), pipe.budget.start()),
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
    let (bytes, held) = request_whole(pipe, g, msg, caller).await?;
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

/// A request whose answer is read whole (the sidecar's own `initialize`, its probe).
async fn request_whole(
    pipe: &Arc<Pipe>,
    g: &Generation,
    msg: RawMap,
    caller: &Caller,
) -> Result<Held, Error> {
    let (_waiter, _notes, done) = send(pipe, g, msg, caller, ServerRequests::Withheld).await?;
    match tokio::time::timeout(pipe.timeout, done).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(_)) => Err(Error::new(
            ErrorKind::UpstreamFailed,
            "the MCP server process went away before answering",
        )),
        Err(_) => Err(Error::new(ErrorKind::UpstreamTimeout(pipe.timeout), "")),
    }
}

/// A request registered on the pipe: its place, its notifications, its answer.
type Sent = (
    Waiter,
    mpsc::Receiver<Held>,
    oneshot::Receiver<table::Answer>,
);

/// Registers a request under a fresh key (and progress token) and writes it to the child.
async fn send(
    pipe: &Arc<Pipe>,
    g: &Generation,
    mut msg: RawMap,
    caller: &Caller,
    relay: ServerRequests,
) -> Result<Sent, Error> {
    let key = table::fresh_key();
    let id = table::key_raw(key);
    let client_id = msg
        .insert("id".to_owned(), id.clone())
        .unwrap_or_else(raw::null);
    let token = swap_progress_token(&mut msg, &id);
    let (notes_tx, notes) = mpsc::channel(NOTES);
    let (done_tx, done) = oneshot::channel();
    pipe.lock().insert(
        key,
        Waiting {
            generation: g.n,
            seq: pipe.seq.fetch_add(1, Ordering::Relaxed),
            owner: *caller,
            client_id,
            token,
            relay,
            notes: notes_tx,
            done: Some(done_tx),
            asked: Vec::new(),
        },
    );
    let mut waiter = Waiter {
        pipe: pipe.clone(),
        key,
        generation: g.n,
        sent: false,
    };
    write(pipe, g, &raw::to_bytes(&msg)).await?;
    waiter.sent = true;
    Ok((waiter, notes, done))
}

/// A client request: JSON when the response is the first thing the child writes for it, an
/// SSE stream when a notification comes first; 504 when nothing comes within the upstream
/// timeout.
async fn request(
    pipe: &Arc<Pipe>,
    g: &Generation,
    msg: RawMap,
    caller: &Caller,
    relay: ServerRequests,
) -> Result<Response<StdioBody>, Error> {
    let era = era_of(&msg);
    let (waiter, mut notes, mut done) = send(pipe, g, msg, caller, relay).await?;
    let first = tokio::time::timeout(pipe.timeout, async {
        tokio::select! {
            biased;
            Some(note) = notes.recv() => Err(note),
            answer = &mut done => Ok(answer),
        }
    })
    .await
    .map_err(|_| Error::new(ErrorKind::UpstreamTimeout(pipe.timeout), ""))?;
    let first = match first {
        Err(note) => Some(note),
        Ok(answer) => {
            let held = answer.map_err(|_| {
                Error::new(
                    ErrorKind::UpstreamFailed,
                    "the MCP server process went away before answering",
                )
            })??;
            let status = match era {
                Era::Modern => raw::parse_message(&held.0)
                    .and_then(|m| modern_error_status(&m))
                    .unwrap_or(StatusCode::OK),
                Era::Legacy => StatusCode::OK,
            };
            drop(waiter);
            return Ok(json_response(status, held));
        }
    };
    let stream = StdioBody::Stream {
        first,
        parts: Some(Streamed {
            notes,
            done,
            waiter,
        }),
        answer: None,
    };
    Ok(answer(StatusCode::OK, Some("text/event-stream"), stream))
}

/// Replaces a request's `params._meta.progressToken` with `id` (unique on the pipe); returns
/// the client's own.
fn swap_progress_token(msg: &mut RawMap, id: &RawValue) -> Option<Box<RawValue>> {
    let mut params = msg.get("params").and_then(|p| raw::open(p))?;
    let mut meta = params.get("_meta").and_then(|m| raw::open(m))?;
    let token = meta.insert("progressToken".to_owned(), id.to_owned())?;
    params.insert("_meta".to_owned(), raw::raw(&meta));
    msg.insert("params".to_owned(), raw::raw(&params));
    Some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_tokens_are_swapped_only_when_asked_for() {
        let mut msg = raw::parse_message(
            br#"{"jsonrpc":"2.0","id":"c","method":"tools/call","params":{"name":"x","_meta":{"progressToken":"tok","k":1}}}"#,
        )
        .unwrap();
        let id = table::key_raw(9);
        let token = swap_progress_token(&mut msg, &id).unwrap();
        assert_eq!(token.get(), r#""tok""#);
        let text = String::from_utf8(raw::to_bytes(&msg).to_vec()).unwrap();
        assert!(
            text.contains(r#""progressToken":"00000000000000000000000000000009""#),
            "{text}"
        );
        assert!(text.contains(r#""k":1"#), "{text}");
        let mut none =
            raw::parse_message(br#"{"id":1,"method":"tools/list","params":{}}"#).unwrap();
        assert!(swap_progress_token(&mut none, &id).is_none());
        assert!(!String::from_utf8_lossy(&raw::to_bytes(&none)).contains("progressToken"));
    }
}
