//! Who is waiting for what on the one pipe to a stdio MCP server, and who may act on it. Every
//! client request gets an id of the sidecar's own, random and unguessable (128 bits, written
//! as a string of 32 hex digits), and, when it asked for progress, that id as its progress
//! token too; each line the child writes is routed back by those: a response to the request
//! that waits for it, a progress notification or a listen stream's notification to its
//! request's stream. A request of the server's (sampling, elicitation, roots) goes to the one
//! client able to answer it, over the stream of that client's request, under an unguessable id
//! of its own; when requests of more than one client are open the sidecar cannot tell whose
//! request caused it, so the child hears an error and nobody is asked. A client's answer to a
//! server request, and its `notifications/cancelled`, count only for what that client owns
//! (see [`Caller`]); anything else is ignored and counted. Each id is put back as the client
//! sent it before anything leaves.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot};

use crate::budget::{MemoryBudget, Reservation};
use crate::error::{Error, ErrorKind};
use crate::mcp::raw::{self, RawMap};
use crate::mcp::version::META_SUBSCRIPTION_ID;
use crate::upstream::caller::Caller;
use crate::upstream::caller::ServerRequests;

/// A message for a client, counted in the memory budget until it is sent.
pub(super) type Held = (Bytes, Reservation);

/// The answer to a request: its response, or why none will come.
pub(super) type Answer = Result<Held, Error>;

/// Notifications (and server requests) waiting for a client to read them, per request; also
/// the most server requests open at once on one client request.
pub(super) const NOTES: usize = 64;

/// Ids the sidecar gives the server's own requests on their way to a client.
const ASKED_PREFIX: &str = "epode-sidecar-srv-";

/// The sidecar's own id for something on the pipe: random, never reused in practice.
pub(super) type Key = u128;

pub(super) fn fresh_key() -> Key {
    rand::random()
}

/// A key as a JSON string: 32 lowercase hex digits, quoted.
pub(super) fn key_json(key: Key) -> String {
    let mut s = String::with_capacity(34);
    let _ = write!(s, "\"{key:032x}\"");
    s
}

/// A key as a JSON value.
pub(super) fn key_raw(key: Key) -> Box<RawValue> {
    RawValue::from_string(key_json(key)).unwrap_or_else(|_| raw::null())
}

/// The key a JSON id names, when it is one of the sidecar's.
pub(super) fn key_of(id: &RawValue) -> Option<Key> {
    let text = id.get().strip_prefix('"')?.strip_suffix('"')?;
    parse_hex(text)
}

fn parse_hex(text: &str) -> Option<Key> {
    (text.len() == 32 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        .then(|| Key::from_str_radix(text, 16).ok())
        .flatten()
}

/// A client request the child has not answered yet.
pub(super) struct Waiting {
    /// The child process it was written to.
    pub(super) generation: u64,
    /// When it was sent, in the sidecar's order (the newest of a client's takes its server
    /// requests).
    pub(super) seq: u64,
    pub(super) owner: Caller,
    pub(super) client_id: Box<RawValue>,
    /// The client's own progress token, when it asked for progress.
    pub(super) token: Option<Box<RawValue>>,
    /// Whether its client may be sent the server's requests (a 2025 client to a 2025 server).
    pub(super) relay: ServerRequests,
    pub(super) notes: mpsc::Sender<Held>,
    pub(super) done: Option<oneshot::Sender<Answer>>,
    /// The server requests sent on its stream and not answered yet.
    pub(super) asked: Vec<Key>,
}

/// A request of the server's, sent on to a client that may answer it.
struct Asked {
    generation: u64,
    /// Its id as the child wrote it.
    child_id: Box<RawValue>,
    /// The client request on whose stream it went.
    via: Key,
    /// That request's client: the only one whose answer counts.
    owner: Caller,
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

/// What became of a client's message to the child (an answer or a cancellation).
#[derive(Debug, PartialEq)]
pub(super) enum FromClient {
    /// Write this to the child.
    Write(Bytes),
    /// Ignored: `why` names the kind, for a counted log line.
    Ignored(&'static str),
}

/// The requests open on the pipe, both ways, by key: the clients' the child has not answered
/// and the child's sent on to a client.
#[derive(Default)]
pub(super) struct RequestTable {
    pending: HashMap<Key, Waiting>,
    asked: HashMap<Key, Asked>,
    /// Who hears the child's change notices (`upstream/listen.rs`'s feeds), by a key of
    /// their own.
    watchers: HashMap<Key, mpsc::Sender<Held>>,
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

impl RequestTable {
    pub(super) fn insert(&mut self, key: Key, waiting: Waiting) {
        self.pending.insert(key, waiting);
    }

    fn forget_asked(&mut self, w: &Waiting) {
        for a in &w.asked {
            self.asked.remove(a);
        }
    }

    /// Forgets a request (answered, or its client went away); whether it was still waiting.
    pub(super) fn remove(&mut self, key: Key) -> bool {
        match self.pending.remove(&key) {
            Some(w) => {
                self.forget_asked(&w);
                true
            }
            None => false,
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.pending.len()
    }

    /// Whether any request is waiting on child `generation`.
    pub(super) fn busy(&self, generation: u64) -> bool {
        !self.watchers.is_empty() || self.pending.values().any(|w| w.generation == generation)
    }

    /// Fails every request written to child `generation` (it exited): each gets `error` now.
    pub(super) fn fail_generation(&mut self, generation: u64, error: impl Fn() -> Error) {
        // Its watchers' streams end: they open again on the next child, and tell it again
        // what they subscribe to.
        self.watchers.clear();
        let keys: Vec<Key> = self
            .pending
            .iter()
            .filter(|(_, w)| w.generation == generation)
            .map(|(k, _)| *k)
            .collect();
        for key in keys {
            if let Some(mut w) = self.pending.remove(&key) {
                if let Some(done) = w.done.take() {
                    let _ = done.send(Err(error()));
                }
            }
        }
        self.asked.retain(|_, a| a.generation != generation);
    }

    /// Fails the request whose answer the child wrote too large to read.
    pub(super) fn fail_one(&mut self, key: Key, error: Error) -> bool {
        match self.pending.remove(&key) {
            Some(mut w) => {
                if let Some(done) = w.done.take() {
                    let _ = done.send(Err(error));
                }
                self.forget_asked(&w);
                true
            }
            None => false,
        }
    }

    /// A client's `notifications/cancelled` naming its request `client_id`: the key of the
    /// one waiting request of that id that `caller` owns.
    pub(super) fn cancel_target(&self, client_id: &RawValue, caller: &Caller) -> Option<Key> {
        let mut found = self
            .pending
            .iter()
            .filter(|(_, w)| w.client_id.get() == client_id.get() && caller.may_act_for(&w.owner))
            .map(|(k, _)| *k);
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
        let Some(key) = key_of(id) else {
            return Routed::Dropped("a response to an id the sidecar never sent");
        };
        let Some(w) = self
            .pending
            .get(&key)
            .filter(|w| w.generation == generation)
        else {
            return Routed::Dropped("a response nobody waits for (cancelled, or timed out)");
        };
        msg.insert("id".to_owned(), w.client_id.clone());
        let bytes = raw::to_bytes(&msg);
        let answer = hold(bytes, budget).ok_or_else(|| {
            Error::new(
                ErrorKind::Overloaded { retry_after: 1 },
                "its memory budget is spent",
            )
        });
        if let Some(mut w) = self.pending.remove(&key) {
            if let Some(done) = w.done.take() {
                let _ = done.send(answer);
            }
            self.forget_asked(&w);
        }
        Routed::Delivered
    }

    /// The request whose stream may carry a server request: the newest of the one client
    /// with requests open that can answer; `Err` names why there is none.
    fn asker(&self, generation: u64) -> Result<Key, &'static str> {
        let mut group = None;
        let mut newest: Option<(u64, Key)> = None;
        for (key, w) in &self.pending {
            if w.generation != generation || w.relay == ServerRequests::Withheld {
                continue;
            }
            match group {
                Some(g) if g != w.owner.group() => return Err("ambiguous"),
                _ => group = Some(w.owner.group()),
            }
            if newest.is_none_or(|(seq, _)| w.seq > seq) {
                newest = Some((w.seq, *key));
            }
        }
        newest.map(|(_, k)| k).ok_or("none")
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
        let via = match self.asker(generation) {
            Ok(via) => via,
            Err("ambiguous") => return Routed::Reply(error_reply(
                id,
                crate::error::code::INTERNAL_ERROR,
                &format!("epode-sidecar: requests of more than one client are open on this server, so {method} cannot be matched to the one that caused it and is asked of nobody (run a child per client: EPODE_SIDECAR_STDIO_CHILDREN=per-client)"),
            )),
            Err(_) => return Routed::Reply(error_reply(
                id,
                crate::error::code::INTERNAL_ERROR,
                &format!("epode-sidecar: no client that can answer {method} is waiting on this server (only a 2025-11-25 client can, on the request that caused it; a 2026-07-28 server asks with an input_required result instead)"),
            )),
        };
        let Some(w) = self.pending.get_mut(&via) else {
            return Routed::Dropped("a server request for a request that just ended");
        };
        if w.asked.len() >= NOTES {
            return Routed::Reply(error_reply(
                id,
                crate::error::code::INTERNAL_ERROR,
                "epode-sidecar: too many of this server's requests are open on one client request",
            ));
        }
        let ask = fresh_key();
        msg.insert(
            "id".to_owned(),
            raw::raw(&format!("{ASKED_PREFIX}{ask:032x}")),
        );
        let sent = hold(raw::to_bytes(&msg), budget).is_some_and(|h| w.notes.try_send(h).is_ok());
        if !sent {
            return Routed::Reply(error_reply(
                id,
                crate::error::code::INTERNAL_ERROR,
                "epode-sidecar: the client's stream is not keeping up",
            ));
        }
        w.asked.push(ask);
        let owner = w.owner;
        self.asked.insert(
            ask,
            Asked {
                generation,
                child_id: id.to_owned(),
                via,
                owner,
            },
        );
        Routed::Delivered
    }

    /// A new watcher of the child's change notices: its key and what it hears.
    pub(super) fn watch(&mut self) -> (Key, mpsc::Receiver<Held>) {
        let (tx, rx) = mpsc::channel(NOTES);
        let key = fresh_key();
        self.watchers.insert(key, tx);
        (key, rx)
    }

    pub(super) fn unwatch(&mut self, key: Key) {
        self.watchers.remove(&key);
    }

    /// A change notice (it names no request: the child's lists changed) for every watcher.
    fn change_notice(&mut self, msg: &RawMap, budget: &Arc<MemoryBudget>) -> Routed {
        if self.watchers.is_empty() {
            return Routed::Dropped("a change notice nobody listens for");
        }
        let bytes = raw::to_bytes(msg);
        let mut delivered = false;
        self.watchers.retain(|_, tx| {
            match hold(bytes.clone(), budget).map(|h| tx.try_send(h)) {
                Some(Ok(())) => delivered = true,
                Some(Err(mpsc::error::TrySendError::Closed(_))) => return false,
                _ => {}
            }
            true
        });
        if delivered {
            Routed::Delivered
        } else {
            Routed::Dropped("a change notice its listeners had no room for")
        }
    }

    fn notification(
        &mut self,
        generation: u64,
        msg: &mut RawMap,
        budget: &Arc<MemoryBudget>,
    ) -> Routed {
        // A change notice that names no request (2025 has no listen stream to name) is the
        // watchers'.
        let change = msg
            .get("method")
            .and_then(|m| raw::as_str(m))
            .is_some_and(|m| crate::mcp::method::is_change_notice(&m));
        let Some(mut params) = msg.get("params").and_then(|p| raw::open(p)) else {
            if change {
                return self.change_notice(msg, budget);
            }
            return Routed::Dropped("a notification that names no request");
        };
        let by_token = params.get("progressToken").and_then(|t| key_of(t));
        let mut meta = params.get("_meta").and_then(|m| raw::open(m));
        let by_subscription = meta
            .as_ref()
            .and_then(|m| m.get(META_SUBSCRIPTION_ID))
            .and_then(|s| key_of(s));
        let target = by_token
            .or(by_subscription)
            .and_then(|k| Some((k, self.pending.get(&k)?)))
            .filter(|(_, w)| w.generation == generation);
        let Some((k, w)) = target else {
            if change && by_subscription.is_none() {
                return self.change_notice(msg, budget);
            }
            return Routed::Dropped("a notification that names no waiting request");
        };
        if by_token == Some(k) {
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
    /// child's own id back, when that request is still open on `generation` and `caller` is
    /// the client it was asked of.
    pub(super) fn answer(
        &mut self,
        generation: u64,
        mut msg: RawMap,
        caller: &Caller,
    ) -> FromClient {
        let Some(key) = msg
            .get("id")
            .and_then(|i| raw::as_str(i).map(|s| s.into_owned()))
            .and_then(|id| parse_hex(id.strip_prefix(ASKED_PREFIX)?))
        else {
            return FromClient::Ignored("answers to no request of the server's");
        };
        let Some(asked) = self.asked.get(&key) else {
            return FromClient::Ignored("answers to no open request of the server's");
        };
        if asked.generation != generation {
            return FromClient::Ignored("answers to a request of a server process that exited");
        }
        if !caller.may_answer_for(&asked.owner) {
            return FromClient::Ignored("answers from a client the request was not asked of");
        }
        let Some(asked) = self.asked.remove(&key) else {
            return FromClient::Ignored("answers to no open request of the server's");
        };
        if let Some(w) = self.pending.get_mut(&asked.via) {
            w.asked.retain(|a| *a != key);
        }
        msg.insert("id".to_owned(), asked.child_id);
        FromClient::Write(raw::to_bytes(&msg))
    }
}

#[cfg(test)]
mod tests;
