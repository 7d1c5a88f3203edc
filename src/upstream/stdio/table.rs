//! Who is waiting for what on the one pipe to a stdio MCP server. Every client request gets an
//! id of the sidecar's own (a number, unique for the life of the process) and, when it asked
//! for progress, that number as its progress token too; each line the child writes is routed
//! back by those: a response to the request that is waiting for it, a progress notification
//! or a listen stream's notification to its request's stream, a request of the server's
//! (sampling, elicitation, roots) to the one client able to answer it. Each id is put back as
//! the client sent it before anything leaves.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot};

use crate::budget::{MemoryBudget, Reservation};
use crate::error::{Error, Kind};
use crate::mcp::raw::{self, RawMap};
use crate::mcp::version::META_SUBSCRIPTION_ID;

/// A message for a client, counted in the memory budget until it is sent.
pub(super) type Held = (Bytes, Reservation);

/// The answer to a request: its response, or why none will come.
pub(super) type Answer = Result<Held, Error>;

/// Notifications (and server requests) waiting for a client to read them, per request.
pub(super) const NOTES: usize = 64;

/// Ids the sidecar gives the server's own requests on their way to a client.
const ASKED_PREFIX: &str = "epode-sidecar-srv-";

/// A client request the child has not answered yet.
pub(super) struct Waiting {
    /// The child process it was written to.
    pub(super) generation: u64,
    /// When it was sent, in the sidecar's order (the newest can answer server requests).
    pub(super) seq: u64,
    pub(super) client_id: Box<RawValue>,
    /// The client's own progress token, when it asked for progress.
    pub(super) token: Option<Box<RawValue>>,
    /// Whether its client may be sent the server's requests (a 2025 client to a 2025 server).
    pub(super) answers: bool,
    pub(super) notes: mpsc::Sender<Held>,
    pub(super) done: Option<oneshot::Sender<Answer>>,
}

/// A request of the server's, sent on to a client that may answer it.
struct Asked {
    generation: u64,
    /// Its id as the child wrote it.
    child_id: Box<RawValue>,
    /// The client request on whose stream it went.
    via: u64,
}

/// What became of one line from the child.
#[derive(Debug, PartialEq)]
pub(super) enum Routed {
    /// Delivered, or nothing to do.
    Delivered,
    /// Write this back to the child (the answer to its own request).
    Reply(Bytes),
    /// Nobody waits for it; `why` names the kind, for a counted log line.
    Dropped(&'static str),
}

#[derive(Default)]
pub(super) struct Table {
    pending: HashMap<u64, Waiting>,
    asked: HashMap<u64, Asked>,
    next_ask: u64,
}

fn number(v: &RawValue) -> Option<u64> {
    serde_json::from_str(v.get()).ok()
}

fn error_reply(id: &RawValue, code: i64, message: &str) -> Bytes {
    let msg = serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
    Bytes::from(msg.to_string())
}

/// A message held in the budget; `None` when the budget is spent.
fn hold(bytes: Bytes, budget: &Arc<MemoryBudget>) -> Option<Held> {
    let mut r = budget.start();
    r.grow(bytes.len()).then_some((bytes, r))
}

impl Table {
    pub(super) fn insert(&mut self, id: u64, waiting: Waiting) {
        self.pending.insert(id, waiting);
    }

    /// Forgets a request (answered, or its client went away); whether it was still waiting.
    pub(super) fn remove(&mut self, id: u64) -> bool {
        self.asked.retain(|_, a| a.via != id);
        self.pending.remove(&id).is_some()
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.pending.len()
    }

    /// Fails every request written to child `generation` (it exited): each gets `error` now.
    pub(super) fn fail_generation(&mut self, generation: u64, error: impl Fn() -> Error) {
        let ids: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, w)| w.generation == generation)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            if let Some(mut w) = self.pending.remove(&id) {
                if let Some(done) = w.done.take() {
                    let _ = done.send(Err(error()));
                }
            }
        }
        self.asked.retain(|_, a| a.generation != generation);
    }

    /// Fails the request whose answer the child wrote too large to read.
    pub(super) fn fail_one(&mut self, id: u64, error: Error) -> bool {
        match self.pending.remove(&id) {
            Some(mut w) => {
                if let Some(done) = w.done.take() {
                    let _ = done.send(Err(error));
                }
                self.asked.retain(|_, a| a.via != id);
                true
            }
            None => false,
        }
    }

    /// The id a client's `notifications/cancelled` names, as the child knows it: only when
    /// exactly one waiting request has that id (clients choose their ids freely).
    pub(super) fn child_id_of(&self, client_id: &RawValue) -> Option<u64> {
        let mut found = self
            .pending
            .iter()
            .filter(|(_, w)| w.client_id.get() == client_id.get())
            .map(|(id, _)| *id);
        let first = found.next()?;
        found.next().is_none().then_some(first)
    }

    /// Routes one message from child `generation`.
    pub(super) fn route(
        &mut self,
        generation: u64,
        mut msg: RawMap,
        budget: &Arc<MemoryBudget>,
    ) -> Routed {
        let id = msg.get("id").map(|v| v.to_owned());
        let method = msg
            .get("method")
            .and_then(|m| raw::as_str(m).map(|s| s.into_owned()));
        match (method, id) {
            (None, Some(id)) => self.response(generation, msg, &id, budget),
            (Some(method), Some(id)) => self.server_request(generation, msg, &method, &id, budget),
            (Some(_), None) => self.notification(generation, &mut msg, budget),
            (None, None) => Routed::Dropped("not a JSON-RPC message"),
        }
    }

    fn response(
        &mut self,
        generation: u64,
        mut msg: RawMap,
        id: &RawValue,
        budget: &Arc<MemoryBudget>,
    ) -> Routed {
        let Some(n) = number(id) else {
            return Routed::Dropped("a response to an id the sidecar never sent");
        };
        let Some(w) = self.pending.get(&n).filter(|w| w.generation == generation) else {
            return Routed::Dropped("a response nobody waits for (cancelled, or timed out)");
        };
        msg.insert("id".to_owned(), w.client_id.clone());
        let bytes = raw::to_bytes(&msg);
        let answer = hold(bytes, budget).ok_or_else(|| {
            Error::new(
                Kind::Overloaded { retry_after: 1 },
                "its memory budget is spent",
            )
        });
        if let Some(mut w) = self.pending.remove(&n) {
            if let Some(done) = w.done.take() {
                let _ = done.send(answer);
            }
        }
        self.asked.retain(|_, a| a.via != n);
        Routed::Delivered
    }

    fn server_request(
        &mut self,
        generation: u64,
        mut msg: RawMap,
        method: &str,
        id: &RawValue,
        budget: &Arc<MemoryBudget>,
    ) -> Routed {
        if method == "ping" {
            return Routed::Reply(Bytes::from(format!(
                r#"{{"jsonrpc":"2.0","id":{},"result":{{}}}}"#,
                id.get()
            )));
        }
        let via = self
            .pending
            .iter()
            .filter(|(_, w)| w.generation == generation && w.answers)
            .max_by_key(|(_, w)| w.seq)
            .map(|(n, w)| (*n, w.notes.clone()));
        let Some((via, notes)) = via else {
            return Routed::Reply(error_reply(
                id,
                crate::error::code::INTERNAL_ERROR,
                &format!("epode-sidecar: no client that can answer {method} is waiting on this server (only a 2025-11-25 client can, on the request that caused it; a 2026-07-28 server asks with an input_required result instead)"),
            ));
        };
        self.next_ask += 1;
        let ask = self.next_ask;
        msg.insert("id".to_owned(), raw::raw(&format!("{ASKED_PREFIX}{ask}")));
        let sent = hold(raw::to_bytes(&msg), budget).is_some_and(|h| notes.try_send(h).is_ok());
        if !sent {
            return Routed::Reply(error_reply(
                id,
                crate::error::code::INTERNAL_ERROR,
                "epode-sidecar: the client's stream is not keeping up",
            ));
        }
        self.asked.insert(
            ask,
            Asked {
                generation,
                child_id: id.to_owned(),
                via,
            },
        );
        Routed::Delivered
    }

    fn notification(
        &mut self,
        generation: u64,
        msg: &mut RawMap,
        budget: &Arc<MemoryBudget>,
    ) -> Routed {
        let Some(mut params) = msg.get("params").and_then(|p| raw::open(p)) else {
            return Routed::Dropped("a notification that names no request");
        };
        let by_token = params.get("progressToken").and_then(|t| number(t));
        let mut meta = params.get("_meta").and_then(|m| raw::open(m));
        let by_subscription = meta
            .as_ref()
            .and_then(|m| m.get(META_SUBSCRIPTION_ID))
            .and_then(|s| number(s));
        let target = by_token
            .or(by_subscription)
            .and_then(|n| Some((n, self.pending.get(&n)?)))
            .filter(|(_, w)| w.generation == generation);
        let Some((n, w)) = target else {
            return Routed::Dropped("a notification that names no waiting request");
        };
        if by_token == Some(n) {
            let Some(token) = &w.token else {
                return Routed::Dropped("progress for a request that asked for none");
            };
            params.insert("progressToken".to_owned(), token.clone());
        } else if let Some(m) = meta.as_mut() {
            m.insert(META_SUBSCRIPTION_ID.to_owned(), w.client_id.clone());
            params.insert("_meta".to_owned(), raw::raw(m));
        }
        msg.insert("params".to_owned(), raw::raw(&params));
        match hold(raw::to_bytes(msg), budget).map(|h| w.notes.try_send(h)) {
            Some(Ok(())) => Routed::Delivered,
            _ => Routed::Dropped("a notification its client's stream had no room for"),
        }
    }

    /// A client's answer to a server request: the message to write to the child, with the
    /// child's own id back, when that request is still open on `generation`.
    pub(super) fn answer(&mut self, generation: u64, mut msg: RawMap) -> Option<Bytes> {
        let id = msg
            .get("id")
            .and_then(|i| raw::as_str(i).map(|s| s.into_owned()))?;
        let n: u64 = id.strip_prefix(ASKED_PREFIX)?.parse().ok()?;
        let asked = self.asked.remove(&n)?;
        if asked.generation != generation {
            return None;
        }
        msg.insert("id".to_owned(), asked.child_id);
        Some(raw::to_bytes(&msg))
    }
}

#[cfg(test)]
mod tests;
