//! The one end of every MCP request: [`RequestEnd::end`] is told, exactly once, how the
//! request ended ([`Ending`]), and the hook's [`ResultHook::end`] records what the request
//! records (its telemetry event) there and nowhere else. Most endings are explicit: the
//! result arrives, a failure is found, a limit refuses it before it is sent. The two that
//! only a drop signals (the client going away, the request's future dropped by the shutdown
//! cut) are handed to the step through [`Abandoned`]: a dropped plan's end moves into it, and
//! the dispatcher's end-of-request step ends it (the client's departure is an ending that
//! records nothing). No destructor decides or writes an outcome.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::method::{self, Method};
use super::raw::RawMap;

/// How a request ended: all its end step is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// Its result arrived (the hook's `result` has seen it).
    Answered,
    /// A JSON-RPC error answer, an upstream error status, no answer at all.
    Failed,
    /// Refused by a limit of the sidecar's own before anything was sent: no product call,
    /// so nothing is recorded, as for a request the front door refused.
    NotSent,
    /// The client went away before its answer was complete: nothing is recorded.
    ClientGone,
    /// Its future was dropped without an outcome while its client was still there: cut at
    /// shutdown, or a path that reported nothing. Recorded as a failure, so no event is
    /// lost silently.
    Unreported,
}

impl Ending {
    /// Whether the product call failed (and is recorded so).
    pub(crate) fn failed(self) -> bool {
        matches!(self, Ending::Failed | Ending::Unreported)
    }
}

/// What a request's response passes through besides the era rewrite: the feedback binding's
/// decoration, and its telemetry, recorded at the request's end.
pub(crate) trait ResultHook: Send {
    /// The complete result (before the era rewrite); returns whether it changed it. Its
    /// end ([`Ending::Answered`]) follows at once.
    fn result(&mut self, result: &mut RawMap) -> bool;
    /// A notification seen on the response stream (`notifications/tools/list_changed`, …).
    fn notification(&mut self, _method: &str) {}
    /// The request's end step: called exactly once, with how it ended.
    fn end(&mut self, _ending: Ending) {}
}

/// What a hook adds to a result after it has seen it, once an answer it waits for has come
/// (customer context: Epode's contract); returns whether the result changed.
pub(crate) type Amendment = Box<dyn FnOnce(&mut RawMap) -> bool + Send>;

/// A product call's amendment to come, shared by its hook (which starts it) and the answer
/// path (which waits for it, at most until its deadline, before it writes the result).
/// Set only for the calls that may be amended: no cost on any other request.
#[derive(Clone, Default)]
pub(crate) struct Amends(Arc<Mutex<Option<Pending>>>);

struct Pending {
    rx: tokio::sync::oneshot::Receiver<Option<Amendment>>,
    until: tokio::time::Instant,
}

impl Amends {
    /// The amendment comes on `rx`, waited for `within` from now at most.
    pub(crate) fn set(
        &self,
        rx: tokio::sync::oneshot::Receiver<Option<Amendment>>,
        within: std::time::Duration,
    ) {
        let until = tokio::time::Instant::now() + within;
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(Pending { rx, until });
    }

    /// Waits for the amendment, if one is coming, and applies it to the result of the
    /// JSON-RPC response `message`; the message as it was when none comes in time.
    pub(crate) async fn apply(&self, message: bytes::Bytes) -> bytes::Bytes {
        let pending = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(Pending { rx, until }) = pending else {
            return message;
        };
        let Ok(Ok(Some(amend))) = tokio::time::timeout_at(until, rx).await else {
            return message;
        };
        let Some(mut msg) = super::raw::parse_message(&message) else {
            return message;
        };
        let Some(mut result) = msg.get("result").and_then(|r| super::raw::open(r)) else {
            return message;
        };
        if !amend(&mut result) {
            return message;
        }
        msg.insert("result".into(), super::raw::raw_object(&result));
        super::raw::to_bytes(&msg)
    }
}

/// A request's end, owned by its plan: [`RequestEnd::end`] ends it (the first ending
/// counts; later ones are no-ops, as a failure found after the result is none). Dropped
/// without an ending, it hands its hook to the request's [`Abandoned`] for the end step.
pub(crate) struct RequestEnd {
    method: Option<Method>,
    pub(crate) hook: Option<Box<dyn ResultHook>>,
    ended: Option<Ending>,
    slot: Abandoned,
}

impl RequestEnd {
    pub(crate) fn new(method: Option<Method>, slot: Abandoned) -> Self {
        RequestEnd {
            method,
            hook: None,
            ended: None,
            slot,
        }
    }

    /// How it ended, once it has.
    pub(crate) fn ended(&self) -> Option<Ending> {
        self.ended
    }

    /// The hook, while the request has not ended (for the result and notifications).
    pub(crate) fn open_hook(&mut self) -> Option<&mut Box<dyn ResultHook>> {
        match self.ended {
            None => self.hook.as_mut(),
            Some(_) => None,
        }
    }

    /// The notifications a stream carries are seen for as long as the stream lasts.
    pub(crate) fn notification(&mut self, method: &str) {
        if let Some(hook) = self.hook.as_mut() {
            hook.notification(method);
        }
    }

    /// The end step: the hook hears `ending` now, unless the request already ended.
    pub(crate) fn end(&mut self, ending: Ending) {
        if self.ended.is_some() {
            return;
        }
        self.ended = Some(ending);
        if ending.failed() {
            self.slot.0.failed.store(true, Ordering::Relaxed);
        }
        if let Some(hook) = self.hook.as_mut() {
            hook.end(ending);
        }
    }

    /// The JSON-RPC error code the answer carried (for the request's span), or that its
    /// tool result says `isError` (`code` none).
    pub(crate) fn error_seen(&self, code: Option<i64>) {
        match code {
            Some(code) => self.slot.0.code.store(code, Ordering::Relaxed),
            None => self.slot.0.tool_error.store(true, Ordering::Relaxed),
        }
    }

    /// Marks the request's client gone (its response body or future is being dropped).
    pub(crate) fn abandon(&self) {
        self.slot.set();
    }
}

impl Drop for RequestEnd {
    /// Hands an unended request's hook to the end step; decides and records nothing.
    fn drop(&mut self) {
        if self.ended.is_some() {
            return;
        }
        if let Some(hook) = self.hook.take() {
            self.slot.hand_over(Left {
                method: self.method,
                hook,
            });
        }
    }
}

/// An unended request's hook, waiting in its [`Abandoned`] for the end step.
struct Left {
    method: Option<Method>,
    hook: Box<dyn ResultHook>,
}

#[derive(Default)]
struct Slot {
    /// The client went away before its answer was complete.
    gone: AtomicBool,
    left: Mutex<Option<Left>>,
    /// It ended failed.
    failed: AtomicBool,
    /// The JSON-RPC error code its answer carried (0: none).
    code: AtomicI64,
    /// Its tool result said `isError`.
    tool_error: AtomicBool,
}

/// How a request ended, as its span records it (`error.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// A JSON-RPC error with this code.
    Code(i64),
    /// A tool result with `isError`.
    ToolError,
    /// Failed with no code seen (an error status, a broken stream).
    Other,
}

/// One request's hand-over point between the drops that signal its end and its end step:
/// marked when the client goes away (the request's future or its response stream dropped
/// before the end), and holding a plan's hook dropped without an ending.
#[derive(Clone, Default)]
pub(crate) struct Abandoned(Arc<Slot>);

/// Requests whose plan was dropped without an ending while their client was still there
/// (see [`Ending::Unreported`]); the shutdown cut ends a request that way by design.
static UNREPORTED: AtomicU64 = AtomicU64::new(0);

/// How many requests ended [`Ending::Unreported`].
#[cfg(test)]
pub(crate) fn unreported() -> u64 {
    UNREPORTED.load(Ordering::Relaxed)
}

impl Abandoned {
    /// How the request failed, if it did, as far as its answer showed.
    pub(crate) fn failure(&self) -> Option<Failure> {
        let code = self.0.code.load(Ordering::Relaxed);
        if code != 0 {
            return Some(Failure::Code(code));
        }
        if self.0.tool_error.load(Ordering::Relaxed) {
            return Some(Failure::ToolError);
        }
        self.0
            .failed
            .load(Ordering::Relaxed)
            .then_some(Failure::Other)
    }

    /// The client went away.
    pub(crate) fn set(&self) {
        self.0.gone.store(true, Ordering::Relaxed);
    }

    fn hand_over(&self, mut left: Left) {
        if self.0.gone.load(Ordering::Relaxed) {
            // No step runs after a client that is gone (its request's future is being
            // dropped): its ending is told here, and is the one ending that records nothing.
            left.hook.end(Ending::ClientGone);
            return;
        }
        let mut slot = self.0.left.lock().unwrap_or_else(|p| p.into_inner());
        debug_assert!(slot.is_none(), "one plan per request");
        *slot = Some(left);
    }

    /// The end-of-request step for an ending only a drop signalled: a plan dropped without
    /// one ends now, as [`Ending::ClientGone`] when its client went away, else as
    /// [`Ending::Unreported`]. Run once the request's future is over (or dropped).
    pub(crate) fn end_left(&self) {
        let left = self.0.left.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(Left { method, mut hook }) = left else {
            return;
        };
        let ending = if self.0.gone.load(Ordering::Relaxed) {
            Ending::ClientGone
        } else {
            UNREPORTED.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                method = method::label(method),
                "a request's plan ended without an outcome (cut at shutdown?); reported as failed"
            );
            Ending::Unreported
        };
        hook.end(ending);
    }
}
