//! A child's pipe, which every other part of `stdio` shares: the [`Pipe`] (one child process
//! through its restarts, its table of who waits for what, and the bounds it works within), a
//! [`Generation`] (one run of the process), and the lines on their way to its stdin. `child`
//! starts and restarts what runs behind it, `pool` keeps one per client, `body` holds a
//! request's place on it; none of them is needed here.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use serde_json::value::RawValue;
use tokio::sync::{mpsc, watch};

use super::exec;
use super::table::{self, Key, RequestTable, Routed};
use crate::budget::{MemoryBudget, Reservation};
use crate::error::{Error, ErrorKind};
use crate::log_summary::LogSummary;
use crate::mcp::raw;
use crate::metrics::LimitKind;

/// Lines of the child's stderr kept for the message when it exits soon after its start.
const STDERR_TAIL: usize = 10;

/// A line on its way to the child's stdin, counted in the memory budget until written.
pub(super) type Queued = (Bytes, Reservation);

/// Generations are numbered across every child, so a session id names one process only.
pub(super) fn next_generation() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// One run of a child process.
pub(super) struct Generation {
    pub(super) n: u64,
    pub(super) stdin: mpsc::Sender<Queued>,
    /// The child's `initialize` result, once it gave one.
    pub(super) init: OnceLock<Box<RawValue>>,
    pub(super) init_lock: tokio::sync::Mutex<()>,
    /// Whether `notifications/initialized` went to this child.
    pub(super) initialized: AtomicBool,
    /// Whether the child said anything valid since it started (readiness).
    pub(super) answered: AtomicBool,
}

/// What bounds the stdio hop (the upstream's own settings, and the process-wide limits).
pub(crate) struct StdioBounds {
    pub(crate) timeout: Duration,
    pub(crate) budget: Arc<MemoryBudget>,
    pub(crate) max_line: usize,
    pub(crate) on_limit: Arc<dyn Fn(LimitKind) + Send + Sync>,
    /// How long a request waits for room in the child's stdin queue before 503.
    pub(crate) wait: Duration,
    /// The upstream is set to speak 2026-07-28: the readiness probe is a 2026
    /// `server/discover`, not a `ping`, so it does not pin a child that serves both eras (the
    /// first message decides) to 2025.
    pub(crate) modern: bool,
}

/// One child process (through its restarts), and who waits for what on its pipe.
pub(super) struct Pipe {
    table: Mutex<RequestTable>,
    pub(super) live: watch::Sender<Option<Arc<Generation>>>,
    pub(super) stop: watch::Sender<bool>,
    pub(super) seq: AtomicU64,
    pub(super) timeout: Duration,
    /// How long a request waits for room in the stdin queue (at most `timeout`).
    pub(super) wait: Duration,
    pub(super) budget: Arc<MemoryBudget>,
    pub(super) max_line: usize,
    pub(super) on_limit: Arc<dyn Fn(LimitKind) + Send + Sync>,
    pub(super) dropped: LogSummary,
    supervisor: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The last lines the child wrote to its stderr (all of them, logged or not).
    stderr_tail: Mutex<std::collections::VecDeque<String>>,
    /// How the last run ended, while the next has not answered yet (for `/readyz`).
    last_end: Mutex<Option<String>>,
    /// Requests on their way in (a child still starting is not idle).
    users: AtomicUsize,
}

/// A request on its way to a pipe, until it is registered there (or fails).
pub(super) struct Using<'a>(&'a Pipe);

impl<'a> Using<'a> {
    pub(super) fn new(pipe: &'a Pipe) -> Self {
        pipe.users.fetch_add(1, Ordering::AcqRel);
        Using(pipe)
    }
}

impl Drop for Using<'_> {
    fn drop(&mut self) {
        self.0.users.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Pipe {
    /// A pipe within `bounds`, with no child yet (`child::start` gives it its first and the
    /// task that restarts it).
    pub(super) fn new(bounds: &StdioBounds) -> Self {
        let (live, _) = watch::channel(None);
        let (stop, _) = watch::channel(false);
        Pipe {
            table: Mutex::new(RequestTable::default()),
            live,
            stop,
            seq: AtomicU64::new(1),
            timeout: bounds.timeout,
            wait: bounds.wait.min(bounds.timeout),
            budget: bounds.budget.clone(),
            max_line: bounds.max_line,
            on_limit: bounds.on_limit.clone(),
            dropped: LogSummary::new(
                "messages from the MCP server process not delivered",
                Duration::from_secs(60),
            ),
            supervisor: Mutex::new(None),
            stderr_tail: Mutex::new(std::collections::VecDeque::with_capacity(STDERR_TAIL)),
            last_end: Mutex::new(None),
            users: AtomicUsize::new(0),
        }
    }

    /// The task that runs and restarts the pipe's child, which [`Pipe::stop`] waits for.
    pub(super) fn supervised_by(&self, task: tokio::task::JoinHandle<()>) {
        *self.supervisor.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
    }

    /// Stops the pipe's child (stdin closed and SIGTERM to its process group, SIGKILL after
    /// its grace) and waits until it is gone.
    pub(super) async fn stop(&self) {
        self.stop.send_replace(true);
        let task = self
            .supervisor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(task) = task {
            let _ = task.await;
        }
        self.dropped.flush();
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, RequestTable> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn current(&self) -> Option<Arc<Generation>> {
        self.live.borrow().clone()
    }

    /// Whether the running child has answered anything.
    pub(super) fn has_answered(&self) -> bool {
        self.current()
            .is_some_and(|g| g.answered.load(Ordering::Relaxed))
    }

    /// Whether a request is on its way to this pipe's child or waits on it.
    pub(super) fn busy(&self) -> bool {
        self.users.load(Ordering::Acquire) > 0
            || self.current().is_some_and(|g| self.lock().busy(g.n))
    }

    /// Tells child `generation` that the client of request `key` went away.
    pub(super) fn cancel(&self, generation: u64, key: Key) {
        if let Some(g) = self.current().filter(|g| g.n == generation) {
            let line = format!(
                r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{},"reason":"the client went away"}}}}"#,
                table::key_json(key)
            );
            if let Some(queued) = self.queued(line.as_bytes()) {
                let _ = g.stdin.try_send(queued);
            }
        }
    }

    /// A line for the child's stdin, held in the budget; `None` when the budget is spent.
    pub(super) fn queued(&self, bytes: &[u8]) -> Option<Queued> {
        let line = line(bytes);
        let mut held = self.budget.start();
        held.grow(line.len()).then_some((line, held))
    }

    /// One line the child wrote to its stdout.
    pub(super) fn on_line(&self, generation: u64, line: &[u8]) {
        let Some(msg) = raw::parse_message(line) else {
            self.dropped.add(
                "lines that are not JSON-RPC messages (stdout is the protocol channel: log to stderr)",
                1,
            );
            return;
        };
        let current = self.current().filter(|g| g.n == generation);
        if let Some(g) = &current {
            if !g.answered.swap(true, Ordering::Relaxed) {
                *self.last_end.lock().unwrap_or_else(|e| e.into_inner()) = None;
            }
        }
        let routed = self.lock().route(generation, msg, &self.budget);
        match routed {
            Routed::Delivered => {}
            Routed::Reply(bytes) => {
                let sent = current
                    .zip(self.queued(&bytes))
                    .is_some_and(|(g, q)| g.stdin.try_send(q).is_ok());
                if !sent {
                    self.dropped
                        .add("answers to its own requests (its stdin is full)", 1);
                }
            }
            Routed::Dropped(why) => self.dropped.add(why, 1),
        }
    }

    /// A line longer than the sidecar reads: the request it answers (by its top-level id,
    /// found as the line streamed past) gets 502 now rather than waiting in vain.
    pub(super) fn on_long_line(&self, id: Option<&[u8]>) {
        (self.on_limit)(LimitKind::UpstreamAnswerSize);
        let key = id
            .and_then(|id| std::str::from_utf8(id).ok())
            .and_then(|id| serde_json::from_str::<Box<RawValue>>(id).ok())
            .and_then(|id| table::key_of(&id));
        let failed = key.is_some_and(|key| {
            self.lock().fail_one(
                key,
                Error::new(
                    ErrorKind::UpstreamTooLarge {
                        limit: self.max_line,
                    },
                    "",
                ),
            )
        });
        if !failed {
            self.dropped.add(
                "messages longer than EPODE_SIDECAR_MAX_UPSTREAM_ANSWER_BYTES answering no waiting request",
                1,
            );
        }
    }

    /// A child's run ended: what it left behind goes too (reparented to the sidecar, it is no
    /// running child's: a shared child is the only one, a child per client holds its own).
    pub(super) fn ended(&self, how: Option<String>) {
        exec::kill_leftovers();
        *self.last_end.lock().unwrap_or_else(|e| e.into_inner()) = how;
    }

    /// Notes one line of the child's stderr in the tail kept for error messages.
    pub(super) fn stderr_line(&self, line: &str) {
        let mut tail = self.stderr_tail.lock().unwrap_or_else(|e| e.into_inner());
        if tail.len() == STDERR_TAIL {
            tail.pop_front();
        }
        let mut end = line.len().min(500);
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        tail.push_back(line[..end].to_owned());
    }

    /// The child's last stderr lines, as one line.
    pub(super) fn stderr_tail(&self) -> String {
        let tail = self.stderr_tail.lock().unwrap_or_else(|e| e.into_inner());
        tail.iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(" | ")
    }

    /// How the child's last run ended, if one did.
    pub(super) fn previous_end(&self) -> Option<String> {
        self.last_end
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Why there is no child to send to (for `/readyz`).
    pub(super) fn why_not_running(&self) -> String {
        match &*self.last_end.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(how) => format!("the MCP server process is being restarted: {how}"),
            None => "the MCP server process is not running".to_owned(),
        }
    }
}

/// Newlines end a message on the pipe; in valid JSON they can only be whitespace between
/// tokens, so they become spaces.
fn line(bytes: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(bytes.len() + 1);
    out.extend(
        bytes
            .iter()
            .map(|b| if matches!(b, b'\n' | b'\r') { b' ' } else { *b }),
    );
    out.push(b'\n');
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newlines_in_a_message_become_spaces_and_one_ends_it() {
        assert_eq!(&line(b"{\n\"a\":\r\n1}")[..], b"{ \"a\":  1}\n");
    }
}
