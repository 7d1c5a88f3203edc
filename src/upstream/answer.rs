//! The upstream's answer on its way back: read whole when the sidecar needs all of it (a
//! handshake, a probe, a refusal to look into), or finished for the client — a JSON result
//! rewritten whole, an SSE stream rewritten event by event, an error status passed on as it
//! was (for a 2025 client, a JSON-RPC error for its request travels with 200, as 2025 servers
//! send one).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::value::RawValue;
use serde_json::Value;

use super::context::RequestContext;
use super::hop::UpstreamBody;
use crate::body::is_event_stream;
use crate::body::{self, Body, Buffered};
use crate::budget::{self, Collect, MemoryBudget, Reservation};
use crate::error::{Error, ErrorKind};
use crate::mcp::era::Era;
use crate::mcp::headers::SESSION_ID;
use crate::mcp::raw;
use crate::mcp::rewrite::{self, ResultPlan};
use crate::mcp::sse;
use crate::metrics::LimitKind;

/// What bounds the reading of upstream answers.
#[derive(Clone)]
pub(crate) struct AnswerBounds {
    pub(crate) budget: Arc<MemoryBudget>,
    /// The largest answer read whole.
    pub(crate) max_answer: usize,
    /// The largest SSE event held to be rewritten.
    pub(crate) max_event: usize,
    /// How long the rest of an answer may take once its head arrived.
    pub(crate) timeout: Duration,
    /// Told the kind of a limit an answer hit.
    pub(crate) on_limit: Arc<dyn Fn(LimitKind) + Send + Sync>,
}

/// A complete upstream answer the sidecar read whole: what it needs to either use it or pass
/// it to the client exactly as it was.
pub(crate) struct ReadAnswer {
    pub(crate) answer: Buffered,
    /// The JSON-RPC response in it (the last one of an SSE answer), when there is one.
    pub(crate) message: Option<Value>,
}

impl ReadAnswer {
    pub(crate) fn status(&self) -> StatusCode {
        self.answer.status
    }

    pub(crate) fn result(&self) -> Option<&Value> {
        self.message.as_ref().and_then(|m| m.get("result"))
    }

    /// The answer as an error that passes it on to the client unchanged (less the upstream's
    /// session id, which never leaves).
    pub(crate) fn into_refusal(mut self) -> Error {
        self.answer.headers.remove(SESSION_ID);
        Error::upstream_refused(self.answer)
    }
}

/// Reads an upstream answer whole (JSON, or an SSE stream to its end) within its bounds.
pub(crate) async fn read_answer(
    resp: Response<UpstreamBody>,
    bounds: &AnswerBounds,
) -> Result<ReadAnswer, Error> {
    let (parts, body) = resp.into_parts();
    let (bytes, held) = read_body(body, bounds).await?;
    // Counted for as long as it is kept: it may be passed on to the client as it was.
    let bytes = if bytes.len() > budget::SMALL {
        budget::keep(bytes, held)
    } else {
        bytes
    };
    let message = parse_message(&parts.headers, &bytes);
    Ok(ReadAnswer {
        answer: Buffered {
            status: parts.status,
            headers: parts.headers,
            bytes,
        },
        message,
    })
}

async fn read_body(
    body: UpstreamBody,
    bounds: &AnswerBounds,
) -> Result<(Bytes, Reservation), Error> {
    match budget::collect(body, bounds.max_answer, &bounds.budget, bounds.timeout).await {
        Ok(read) => Ok(read),
        Err(Collect::TooLarge) => Err({
            (bounds.on_limit)(LimitKind::UpstreamAnswerSize);
            Error::new(
                ErrorKind::UpstreamTooLarge {
                    limit: bounds.max_answer,
                },
                "",
            )
        }),
        Err(Collect::OverBudget) => Err({
            (bounds.on_limit)(LimitKind::MemoryBudget);
            Error::new(
                ErrorKind::Overloaded { retry_after: 1 },
                "its memory budget is spent",
            )
        }),
        Err(Collect::TimedOut) => Err(Error::new(ErrorKind::UpstreamTimeout(bounds.timeout), "")),
        Err(Collect::Failed(e)) => Err(Error::new(
            ErrorKind::UpstreamFailed,
            format!("reading the answer: {e}"),
        )),
    }
}

/// The JSON-RPC response of a whole answer: the body, or the last response of an SSE stream.
fn parse_message(headers: &HeaderMap, bytes: &Bytes) -> Option<Value> {
    if is_event_stream(headers) {
        sse::messages(bytes)
            .iter()
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .rfind(|m| {
                m.get("method").is_none() && (m.get("result").is_some() || m.get("error").is_some())
            })
    } else {
        serde_json::from_slice(bytes).ok()
    }
}

/// The statuses a 2025 client reads as the transport's verdict (a refused message, a session
/// gone) that an upstream may also give a JSON-RPC error for the request itself: a 2026 one
/// does (400 for its validation ladder, 404 for an unknown method).
fn may_be_in_band(status: StatusCode) -> bool {
    status == StatusCode::BAD_REQUEST || status == StatusCode::NOT_FOUND
}

/// The upstream's answer for a 2025 client when it is a JSON-RPC error for request `id` sent
/// with 400 or 404: the same answer with 200, as 2025 servers send an error answer (the
/// client would take the 404 for its session gone, the 400 for its message refused). `None`
/// for any other answer, which goes as it was.
pub(crate) fn for_legacy_client(answer: &Buffered, id: &RawValue) -> Option<Response<Body>> {
    if !may_be_in_band(answer.status) || is_event_stream(&answer.headers) {
        return None;
    }
    let msg: Value = serde_json::from_slice(&answer.bytes).ok()?;
    let own: Value = serde_json::from_str(id.get()).ok()?;
    let in_band = msg.get("error").is_some_and(Value::is_object)
        && msg.get("result").is_none()
        && msg.get("id") == Some(&own);
    in_band.then(|| {
        let mut resp = Buffered {
            status: StatusCode::OK,
            headers: answer.headers.clone(),
            bytes: answer.bytes.clone(),
        }
        .into_response();
        resp.headers_mut().remove(SESSION_ID);
        resp
    })
}

/// Whether a JSON-RPC error the upstream sent with 200 gets the status 2026 gives it (404 for
/// an unknown method): the upstream speaks 2025 and the client 2026.
fn translates_status(client: Era, upstream: Era) -> bool {
    client == Era::Modern && upstream == Era::Legacy
}

/// The upstream's answer for the client: error statuses as they were; a JSON result rewritten
/// whole; an SSE stream event by event, only the response event rewritten. An answer from a
/// 2025 upstream to a 2026 client gets 2026's error statuses. Errors name the request's id.
/// The request's plan hears the outcome here: the result, or the failure where it is found.
pub(crate) async fn finish(
    resp: Response<UpstreamBody>,
    ctx: RequestContext<'_>,
    upstream: Era,
    bounds: &AnswerBounds,
    aside: Aside,
) -> Result<Response<Body>, Error> {
    let (mut parts, body) = resp.into_parts();
    parts.headers.remove(SESSION_ID);
    if !parts.status.is_success() || parts.status == StatusCode::ACCEPTED {
        // No result: the error status is the answer (for a 2025 client, in its era's terms).
        let RequestContext {
            id, era, mut plan, ..
        } = ctx;
        plan.fail();
        if era == Era::Legacy && may_be_in_band(parts.status) {
            let read = read_answer(Response::from_parts(parts, body), bounds).await?;
            return Ok(
                for_legacy_client(&read.answer, id).unwrap_or_else(|| read.answer.into_response())
            );
        }
        return Ok(Response::from_parts(parts, body.boxed_unsync()));
    }
    if is_event_stream(&parts.headers) {
        return finish_stream(parts, body, ctx, upstream, bounds, aside).await;
    }
    let mut plan = ctx.plan;
    let amends = plan.amends();
    let (bytes, mut held) = match read_body(body, bounds).await {
        Ok(read) => read,
        Err(e) => {
            plan.fail();
            return Err(e);
        }
    };
    if bytes.len() > budget::SMALL && !held.grow(bytes.len() / 2) {
        // Rewriting a large answer holds it three times at its peak (the answer, the parsed
        // result, its new text): half a copy more is counted, so what the budget lets in
        // stays within twice its size.
        (bounds.on_limit)(LimitKind::MemoryBudget);
        plan.fail();
        return Err(Error::new(
            ErrorKind::Overloaded { retry_after: 1 },
            "its memory budget is spent",
        ));
    }
    parts.headers.remove(header::CONTENT_LENGTH);
    let (out, status) = if bytes.len() >= OFF_WORKER_BYTES {
        // Milliseconds of parsing and rewriting (a list of 100,000 tools, the catalog learning
        // it): done on the blocking pool, so the worker's other connections are served
        // meanwhile.
        tokio::task::spawn_blocking(move || rewrite_whole(bytes, plan, upstream))
            .await
            .map_err(|e| Error::caused_by(ErrorKind::Internal, "rewriting the answer", e))?
    } else {
        rewrite_whole(bytes, plan, upstream)
    };
    if let Some(status) = status {
        parts.status = status;
    }
    let out = match amends {
        Some(a) => a.apply(out).await,
        None => out,
    };
    held.resize(out.len());
    Ok(Response::from_parts(parts, body::held(out, held)))
}

/// An answer already read whole (a JSON result the sidecar had to look into first) finished
/// for the client as [`finish`] finishes a JSON one.
pub(crate) async fn finish_read(
    read: ReadAnswer,
    ctx: RequestContext<'_>,
    upstream: Era,
) -> Result<Response<Body>, Error> {
    let Buffered {
        status,
        mut headers,
        bytes,
    } = read.answer;
    headers.remove(SESSION_ID);
    headers.remove(header::CONTENT_LENGTH);
    let plan = ctx.plan;
    let amends = plan.amends();
    let (out, rewritten) = if bytes.len() >= OFF_WORKER_BYTES {
        tokio::task::spawn_blocking(move || rewrite_whole(bytes, plan, upstream))
            .await
            .map_err(|e| Error::caused_by(ErrorKind::Internal, "rewriting the answer", e))?
    } else {
        rewrite_whole(bytes, plan, upstream)
    };
    let out = match amends {
        Some(a) => a.apply(out).await,
        None => out,
    };
    let mut resp = body::json(rewritten.unwrap_or(status), out);
    for (name, value) in &headers {
        resp.headers_mut().insert(name, value.clone());
    }
    Ok(resp)
}

/// What a stream's answer carries besides its events: what becomes of the questions asked in
/// it, where its change notices go, and the questions routed to it from its session's GET
/// stream.
pub(crate) struct Aside {
    pub(crate) questions: sse::Questions,
    pub(crate) notices: Option<sse::Notices>,
    pub(crate) inbox: Option<sse::Inbox>,
}

/// A successful SSE answer for the client, rewritten event by event (see [`finish`]).
async fn finish_stream(
    mut parts: http::response::Parts,
    mut body: UpstreamBody,
    ctx: RequestContext<'_>,
    upstream: Era,
    bounds: &AnswerBounds,
    aside: Aside,
) -> Result<Response<Body>, Error> {
    let Aside {
        mut questions,
        notices,
        mut inbox,
    } = aside;
    let RequestContext {
        id,
        era,
        mut plan,
        cut,
        ..
    } = ctx;
    parts.headers.remove(header::CONTENT_LENGTH);
    parts
        .headers
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    let mut read = Bytes::new();
    if translates_status(era, upstream) {
        // The status goes out with the head, so wait for the first event: when it is
        // already the (error) response, answer it as JSON with its status.
        let peeked = sse::peek_first(&mut body, bounds.max_event, inbox.as_mut()).await;
        let (bytes, first) = match peeked {
            Ok(p) => p,
            Err(e) => {
                plan.fail();
                return Err(Error::new(
                    ErrorKind::UpstreamFailed,
                    format!("reading the answer: {e}"),
                ));
            }
        };
        let msg = first
            .as_deref()
            .and_then(sse::event_data)
            .and_then(|d| raw::parse_message(d.as_bytes()))
            .filter(raw::is_response);
        if let Some(mut msg) = msg {
            if let Some(status) = rewrite::modern_error_status(&msg) {
                let bytes = plan
                    .rewrite(&mut msg)
                    .unwrap_or_else(|| raw::to_bytes(&msg));
                return Ok(body::json(status, bytes));
            }
        }
        // The call's first message asks the client: the places a held call takes are taken
        // now, so a refusal is this answer's status (429, 503), not an error event after 200.
        let early = inbox
            .as_ref()
            .and_then(|i| i.early.as_ref())
            .map(|r| r.question.clone());
        if let (sse::Questions::Bridged(bridge), Some(q)) = (
            &mut questions,
            first.as_deref().and_then(sse::Question::in_event).or(early),
        ) {
            if bridge.covers(&q) {
                if let Err(e) = bridge.reserve() {
                    // Told first, then the call's stream is let go.
                    super::held::let_go_after(bridge.cancel(), body);
                    plan.fail();
                    return Err(e);
                }
            }
        }
        read = bytes;
    }
    let stream_bounds = sse::StreamBounds {
        max_event: bounds.max_event,
        held: bounds.budget.start(),
        cut: Some(cut),
        on_limit: Some(bounds.on_limit.clone()),
        questions,
        notices,
        inbox,
    };
    // The stream's end reports to the plan: its response event, or the error event that
    // ends a stream broken before it.
    let body = sse::rewrite_stream(read, body, Some(id.to_owned()), plan, stream_bounds)
        .prime()
        .await;
    Ok(Response::from_parts(parts, body))
}

/// A JSON answer this large is rewritten off the worker thread (a hop of microseconds against
/// a parse of a millisecond or more).
const OFF_WORKER_BYTES: usize = 256 * 1024;

/// A whole JSON answer rewritten by the plan, and the status 2026 gives it when it is an
/// error a 2025 upstream sent a 2026 client.
fn rewrite_whole(bytes: Bytes, mut plan: ResultPlan, upstream: Era) -> (Bytes, Option<StatusCode>) {
    if plan.leaves_as_is(&bytes) {
        return (bytes, None);
    }
    let rewritten = rewrite_message(bytes, &mut plan, upstream);
    // The whole answer was read: a request it held no result for failed.
    plan.fail();
    rewritten
}

fn rewrite_message(
    bytes: Bytes,
    plan: &mut ResultPlan,
    upstream: Era,
) -> (Bytes, Option<StatusCode>) {
    match raw::parse_message(&bytes) {
        Some(mut msg) if raw::is_response(&msg) || msg.contains_key("method") => {
            let status = translates_status(plan.client_era(), upstream)
                .then(|| rewrite::modern_error_status(&msg))
                .flatten();
            (plan.rewrite_from(&mut msg, bytes), status)
        }
        _ => (bytes, None),
    }
}

/// The upstream's response as it is (less its session id), streamed frame by frame.
pub(crate) fn stream_back(resp: Response<UpstreamBody>) -> Response<Body> {
    let (mut parts, body) = resp.into_parts();
    parts.headers.remove(SESSION_ID);
    Response::from_parts(parts, body.boxed_unsync())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, content_type: &str, body: &'static str) -> Buffered {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_str(content_type).unwrap(),
        );
        headers.insert(SESSION_ID, HeaderValue::from_static("s"));
        Buffered {
            status: StatusCode::from_u16(status).unwrap(),
            headers,
            bytes: Bytes::from_static(body.as_bytes()),
        }
    }

    #[test]
    fn a_json_rpc_error_for_the_request_travels_to_a_2025_client_with_200() {
        let id = RawValue::from_string("7".to_owned()).unwrap();
        let json = "application/json";
        let not_found =
            r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32601,"message":"Method not found"}}"#;
        for status in [400, 404] {
            let resp = for_legacy_client(&answer(status, json, not_found), &id).unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
            assert!(resp.headers().get(SESSION_ID).is_none());
            assert_eq!(resp.headers()[header::CONTENT_TYPE], json);
        }
        // Anything else goes as it was: other statuses (auth, limits, failures), another
        // request's error (the sidecar's own handshake), no JSON-RPC error, an SSE body.
        let other_id = r#"{"jsonrpc":"2.0","id":"init","error":{"code":-32600,"message":"x"}}"#;
        let refusals = [
            answer(401, json, not_found),
            answer(429, json, not_found),
            answer(502, json, not_found),
            answer(400, json, other_id),
            answer(400, json, r#"{"jsonrpc":"2.0","id":7,"result":{}}"#),
            answer(400, "text/plain", "Bad Request"),
            answer(404, "text/event-stream", not_found),
        ];
        for a in &refusals {
            assert!(for_legacy_client(a, &id).is_none(), "{:?}", a.bytes);
        }
        let string_id = RawValue::from_string(r#""\u0061""#.to_owned()).unwrap();
        let escaped = r#"{"jsonrpc":"2.0","id":"a","error":{"code":-32602,"message":"x"}}"#;
        assert!(for_legacy_client(&answer(400, json, escaped), &string_id).is_some());
    }
}
