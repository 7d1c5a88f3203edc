//! A 2025-era upstream's questions asked of a 2026 client (MRTR, SEP-2322, bridged): while
//! the upstream serves a 2026 client's `tools/call`, `prompts/get` or `resources/read`, an
//! `elicitation/create`, `sampling/createMessage` or `roots/list` it sends on the call's
//! stream ends the client's answer with an `input_required` result (the SSE reader,
//! `mcp::sse`, takes the questions off the stream); the rest of the call is held
//! (`held.rs`), and the client's retry, carrying `inputResponses` and the sealed
//! `requestState`, continues it: each answer goes upstream as the JSON-RPC response to its
//! question, and the retry's answer is the rest of the stream (the result, or the next round).
//!
//! A question the client's declared capabilities do not cover is never asked: the upstream
//! gets the error a 2025 client without the capability sends, and the call goes on.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Response};
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::answer::AnswerBounds;
use super::caller::{Caller, Client};
use super::context::RequestContext;
use super::held::{let_go_after, Cancel, HeldCall, HeldCalls, Reply};
use crate::body::Body;
use crate::budget::{MemoryBudget, Reservation};
use crate::error::{code, Error, ErrorKind};
use crate::ledger::{Charge, Ledger, Pool};
use crate::mcp::method::Method;
use crate::mcp::raw::{self, RawMap};
use crate::mcp::sse::{
    self, Bridge, Decline, HeldStream, Question, Questions, StreamBounds, MAX_QUESTIONS, MAX_ROUNDS,
};
use crate::mcp::version::META_CLIENT_CAPABILITIES;
use crate::metrics::Metrics;

/// A retry's `requestState` (as the front door read it), when it is one the sidecar issued.
pub(super) fn held_state(state: &RawValue) -> Option<String> {
    let state = raw::as_str(state)?;
    state
        .starts_with(super::held::STATE_PREFIX)
        .then(|| state.into_owned())
}

/// What a retry must repeat of the call it continues: the name (or URI) and the arguments.
fn target_of(params: &Value) -> Value {
    json!({
        "name": params.get("name"),
        "uri": params.get("uri"),
        "arguments": params.get("arguments"),
    })
}

/// The client's declared capabilities in a 2026 request.
pub(super) fn capabilities_of(request: &[u8]) -> Value {
    serde_json::from_slice::<Value>(request)
        .ok()
        .and_then(|m| {
            m.get("params")?
                .get("_meta")?
                .get(META_CLIENT_CAPABILITIES)
                .cloned()
        })
        .unwrap_or(Value::Null)
}

/// Whether capabilities `caps` cover asking `question`.
pub(super) fn covers(caps: &Value, question: &Question) -> bool {
    match question.method.as_str() {
        "elicitation/create" => {
            let Some(e) = caps.get("elicitation").filter(|e| e.is_object()) else {
                return false;
            };
            let mode = question
                .params
                .as_deref()
                .and_then(|p| serde_json::from_str::<Value>(p.get()).ok())
                .and_then(|p| p.get("mode").and_then(Value::as_str).map(str::to_owned))
                .unwrap_or_else(|| "form".to_owned());
            // `elicitation: {}` declares form mode only (2025-11-25 §elicitation).
            let empty = e.as_object().is_some_and(serde_json::Map::is_empty);
            e.get(&mode).is_some() || (empty && mode == "form")
        }
        "sampling/createMessage" => caps.get("sampling").is_some_and(Value::is_object),
        "roots/list" => caps.get("roots").is_some_and(Value::is_object),
        _ => false,
    }
}

/// A JSON-RPC response for question `id`.
fn answer_message(id: &RawValue, result: &RawValue) -> Bytes {
    let mut m = RawMap::default();
    m.insert("jsonrpc".to_owned(), raw::raw("2.0"));
    m.insert("id".to_owned(), id.to_owned());
    m.insert("result".to_owned(), result.to_owned());
    raw::to_bytes(&m)
}

/// The error the upstream gets for question `q`, not asked: the one a 2025 client without
/// the capability sends, or one that says the round (or the caller's share) is full.
pub(super) fn declined_message(q: &Question, why: Decline) -> Bytes {
    let (code, message) = match why {
        Decline::NotDeclared => (
            code::METHOD_NOT_FOUND,
            format!("the client did not declare the capability {} takes", q.method),
        ),
        Decline::TooMany => (
            code::INTERNAL_ERROR,
            format!("epode-sidecar: this call already asks its client {MAX_QUESTIONS} questions at once, the most it asks; {} is not asked", q.method),
        ),
        Decline::Bounded => (
            code::INTERNAL_ERROR,
            format!("epode-sidecar: the client already has as many questions open as it may (EPODE_SIDECAR_QUESTIONS_PER_CALLER, EPODE_SIDECAR_QUESTIONS); {} is not asked", q.method),
        ),
    };
    let msg = json!({"jsonrpc": "2.0", "id": &*q.id, "error": {"code": code, "message": message}});
    Bytes::from(msg.to_string())
}

/// One bridged call's side of the bridge: who asked, how the upstream is answered, where the
/// call is held.
pub(super) struct Asking {
    pub(super) answers: Arc<dyn Answers>,
    pub(super) headers: HeaderMap,
    pub(super) caller: Caller,
    pub(super) method: Method,
    /// The client's request (read for its capabilities and target only when a question
    /// comes).
    pub(super) request: Bytes,
    pub(super) reply: Reply,
    pub(super) upstream_id: Box<RawValue>,
    pub(super) held: Arc<HeldCalls>,
    pub(super) budget: Arc<MemoryBudget>,
    /// Where a held call's places are charged to its caller.
    pub(super) ledger: Arc<Ledger>,
    /// Which round of questions this is (1: the call's first).
    pub(super) round: usize,
    /// The places taken before the answer's head went (`Bridge::reserve`), for the hold.
    pub(super) reserved: Option<Reserved>,
}

/// A held call's places, taken ahead: in the ledger, and its bytes so far.
pub(super) struct Reserved {
    charges: Vec<Charge>,
    bytes: Reservation,
}

impl Asking {
    /// The places a held call takes: one of the caller's held calls, and, over HTTP (where
    /// the held stream keeps an upstream connection), one of its held connections.
    fn take_places(&self) -> Result<Reserved, Error> {
        let who = self.caller.key();
        let mut charges = vec![self.ledger.charge(Pool::HeldCalls, who)?];
        if matches!(self.reply, Reply::Http { .. }) {
            charges.push(self.ledger.charge(Pool::HeldConnections, who)?);
        }
        let mut bytes = self.budget.start();
        if !bytes.grow(self.request.len() + self.headers_size()) {
            return Err(spent());
        }
        Ok(Reserved { charges, bytes })
    }

    /// The bytes of the headers a held call keeps (to answer and cancel in the caller's
    /// name).
    fn headers_size(&self) -> usize {
        self.headers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 8)
            .sum()
    }

    /// What tells the upstream the call ends (over HTTP: `notifications/cancelled` in the
    /// call's session; over stdio, dropping the stream tells the child).
    fn cancel_upstream(&self) -> Cancel {
        matches!(self.reply, Reply::Http { .. }).then(|| {
            self.answers.clone().answer(
                self.headers.clone(),
                self.caller,
                self.reply.clone(),
                cancelled_message(&self.upstream_id),
            )
        })
    }
}

fn spent() -> Error {
    Error::new(
        ErrorKind::Overloaded { retry_after: 1 },
        "its memory budget is spent",
    )
}

/// The notification that ends the call `id` upstream.
fn cancelled_message(id: &RawValue) -> Bytes {
    let msg = json!({
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": id, "reason": "epode-sidecar: the client did not come back with its answers in time"},
    });
    Bytes::from(msg.to_string())
}

impl Bridge for Asking {
    fn covers(&self, question: &Question) -> bool {
        covers(&capabilities_of(&self.request), question)
    }

    fn decline(
        &self,
        question: &Question,
        why: Decline,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>> {
        let bytes = declined_message(question, why);
        self.answers
            .clone()
            .answer(self.headers.clone(), self.caller, self.reply.clone(), bytes)
    }

    fn reserve(&mut self) -> Result<(), Error> {
        if self.reserved.is_none() {
            self.reserved = Some(self.take_places()?);
        }
        Ok(())
    }

    fn cancel(&self) -> Option<crate::mcp::sse::Told> {
        self.cancel_upstream()
    }

    fn hold(
        mut self: Box<Self>,
        stream: HeldStream,
        asked: Vec<Question>,
    ) -> Result<String, Error> {
        let cancel = self.cancel_upstream();
        if self.round > MAX_ROUNDS {
            let_go_after(cancel, stream);
            return Err(Error::new(
                ErrorKind::UpstreamFailed,
                format!("the upstream asked its client questions in more than {MAX_ROUNDS} rounds of one call, the most the sidecar asks; the call ends here"),
            ));
        }
        let places = match self.reserved.take() {
            Some(r) => Ok(r),
            None => self.take_places(),
        };
        let Reserved { charges, mut bytes } = match places {
            Ok(r) => r,
            Err(e) => {
                let_go_after(cancel, stream);
                return Err(e);
            }
        };
        let size = stream.held_bytes()
            + asked
                .iter()
                .map(|q| q.params.as_ref().map_or(0, |p| p.get().len()) + q.method.len())
                .sum::<usize>();
        if !bytes.grow(size) {
            let_go_after(cancel, stream);
            return Err(spent());
        }
        let target = serde_json::from_slice::<Value>(&self.request)
            .ok()
            .and_then(|m| m.get("params").map(target_of))
            .unwrap_or(Value::Null);
        Ok(self.held.hold(HeldCall {
            owner: self.caller.key(),
            method: self.method,
            target,
            asked,
            stream,
            reply: self.reply,
            upstream_id: self.upstream_id,
            round: self.round,
            deadline: None,
            cancel,
            _places: charges,
            _bytes: bytes,
        }))
    }
}

/// What continuing a held call takes of the upstream.
pub(super) struct Way {
    pub(super) answers: Arc<dyn Answers>,
    pub(super) held: Arc<HeldCalls>,
    pub(super) ledger: Arc<Ledger>,
    pub(super) bounds: AnswerBounds,
    pub(super) metrics: Arc<Metrics>,
    /// Where the change notices on the rest of the call go (`listen.rs`).
    pub(super) notices: Option<crate::mcp::sse::Notices>,
    /// The questions of the session's stream routed to the rest of the call.
    pub(super) inbox: Option<crate::mcp::sse::Inbox>,
}

/// How a bridged call's answers reach the upstream (the upstream implements it).
pub(super) trait Answers: Send + Sync {
    /// Sends the client's answer to one of the upstream's questions (or the error that says
    /// it cannot answer) where the question came from.
    fn answer(
        self: Arc<Self>,
        headers: HeaderMap,
        caller: Caller,
        reply: Reply,
        bytes: Bytes,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>>;
}

/// A 2026 client's retry of a held call (`state`: the sidecar's `requestState`): the
/// answers go upstream, and the answer is the rest of the call.
pub(super) async fn resume(
    way: Way,
    client: &Client<'_>,
    bytes: &Bytes,
    state: &str,
    ctx: RequestContext<'_>,
) -> Result<Response<Body>, Error> {
    let held = way.held.clone();
    let Some(method) = ctx.listed else {
        return Err(ctx.fail(super::held::Refusal::OtherRequest.error()));
    };
    let params: Value = serde_json::from_slice::<Value>(bytes)
        .ok()
        .and_then(|m| m.get("params").cloned())
        .unwrap_or(Value::Null);
    let owner = client.caller.key();
    let mut call = match held.take(state, owner, method, &target_of(&params)) {
        Ok(call) => call,
        Err(refusal) => {
            way.metrics.held_call_refused(refusal.label());
            return Err(ctx.fail(refusal.error()));
        }
    };
    let left = answer_all(&way, client, &mut call, params.get("inputResponses")).await;
    if !left.is_empty() {
        // Asked again: the questions the retry left unanswered.
        let requests: serde_json::Map<String, Value> = left
            .iter()
            .filter_map(|q| {
                let v = serde_json::from_str(q.input_request().get()).ok()?;
                Some((q.key.clone(), v))
            })
            .collect();
        call.asked = left;
        // The same call, its places and its deadline: a retry without answers renews nothing.
        let state = held.hold(call);
        return Ok(ctx.local_result(json!({
            "resultType": "input_required",
            "inputRequests": requests,
            "requestState": state,
        })));
    }
    Ok(go_on(way, client, bytes, method, call, ctx).await)
}

/// Sends upstream each answer the retry brings for `call`'s questions; the questions it
/// left unanswered.
async fn answer_all(
    way: &Way,
    client: &Client<'_>,
    call: &mut HeldCall,
    responses: Option<&Value>,
) -> Vec<Question> {
    let mut left = Vec::new();
    for q in std::mem::take(&mut call.asked) {
        let answer = responses
            .and_then(|r| r.get(&q.key))
            .and_then(|a| serde_json::value::to_raw_value(a).ok());
        match answer {
            Some(a) => {
                let bytes = answer_message(&q.id, &a);
                way.answers
                    .clone()
                    .answer(
                        client.headers.clone(),
                        client.caller,
                        call.reply.clone(),
                        bytes,
                    )
                    .await;
            }
            None => left.push(q),
        }
    }
    left
}

/// The rest of a held call's stream as the retry's answer (a 2026 client's: SSE), asking
/// again should the upstream ask again.
async fn go_on(
    way: Way,
    client: &Client<'_>,
    bytes: &Bytes,
    method: Method,
    call: HeldCall,
    ctx: RequestContext<'_>,
) -> Response<Body> {
    let bounds = &way.bounds;
    let HeldCall {
        stream,
        reply,
        upstream_id,
        round,
        ..
    } = call;
    let asking = Asking {
        answers: way.answers.clone(),
        headers: client.headers.clone(),
        caller: client.caller,
        method,
        request: bytes.clone(),
        reply,
        upstream_id,
        held: way.held.clone(),
        budget: bounds.budget.clone(),
        ledger: way.ledger.clone(),
        round: round + 1,
        reserved: None,
    };
    let stream_bounds = StreamBounds {
        max_event: bounds.max_event,
        held: bounds.budget.start(),
        cut: Some(ctx.cut),
        on_limit: Some(bounds.on_limit.clone()),
        questions: Questions::Bridged(Box::new(asking)),
        notices: way.notices.clone(),
        inbox: way.inbox,
    };
    let body = sse::resume_stream(stream, ctx.id.to_owned(), ctx.plan, stream_bounds)
        .prime()
        .await;
    crate::body::event_stream(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(method: &str, params: Option<&str>) -> Question {
        Question {
            key: "q1".into(),
            id: raw::raw(&1),
            method: method.into(),
            params: params.map(|p| RawValue::from_string(p.to_owned()).unwrap()),
        }
    }

    #[test]
    fn a_question_is_asked_only_under_a_declared_capability() {
        let form = q(
            "elicitation/create",
            Some(r#"{"mode":"form","message":"?"}"#),
        );
        let no_mode = q("elicitation/create", Some(r#"{"message":"?"}"#));
        let url = q(
            "elicitation/create",
            Some(r#"{"mode":"url","url":"https://x"}"#),
        );
        let sampling = q("sampling/createMessage", Some("{}"));
        let roots = q("roots/list", None);
        let all = json!({"elicitation": {"form": {}, "url": {}}, "sampling": {}, "roots": {}});
        for x in [&form, &no_mode, &url, &sampling, &roots] {
            assert!(covers(&all, x), "{}", x.method);
        }
        // `elicitation: {}` is form mode only; nothing declared covers nothing.
        let empty = json!({"elicitation": {}});
        assert!(covers(&empty, &form) && covers(&empty, &no_mode));
        assert!(!covers(&empty, &url) && !covers(&empty, &sampling) && !covers(&empty, &roots));
        let form_only = json!({"elicitation": {"form": {}}});
        assert!(!covers(&form_only, &url));
        for x in [&form, &sampling, &roots, &q("other/thing", None)] {
            assert!(!covers(&Value::Null, x) && !covers(&json!({}), x));
        }
    }

    #[test]
    fn the_sidecars_state_is_told_from_the_upstreams() {
        let ours = raw::raw(&format!("{}abc", super::super::held::STATE_PREFIX));
        assert!(held_state(&ours).is_some());
        assert_eq!(held_state(&raw::raw("opaque")), None);
        assert_eq!(held_state(&raw::raw(&7)), None);
    }
}
