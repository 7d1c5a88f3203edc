//! A 2026 upstream's `input_required` answer asked of a 2025 client the way 2025 servers ask
//! (the other direction of `bridge.rs`): when a 2025 client's `tools/call`, `prompts/get` or
//! `resources/read` gets a JSON `input_required` result from a 2026 upstream and the client
//! accepts an event stream, its answer becomes one: each `inputRequests` entry is sent on it
//! as a server request under an unguessable id of the sidecar's own, the client's POSTed
//! answers are gathered (only from the client that was asked), and the upstream is asked
//! again with `inputResponses` and its `requestState` untouched, as often as it asks, within
//! a round limit. The final result goes out as the stream's last event, through the request's
//! plan. A JSON-only client gets today's error, and so does an `input_required` that arrives
//! as an SSE event (after progress): neither can be carried.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderMap, Response};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, oneshot};

use super::asks::{Asks, Target};
use super::caller::Caller;
use crate::body::{Body, BoxError};
use crate::error::{Error, ErrorKind};
use crate::ledger::Charge;
use crate::mcp::method::Method;
use crate::mcp::raw;
use crate::mcp::rewrite::ResultPlan;
use crate::mcp::sse::{message_event, MAX_QUESTIONS, MAX_ROUNDS};

/// Whether a 2025 client accepts an event stream as its answer.
pub(crate) fn accepts_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/event-stream"))
}

/// Whether a result asks for input.
pub(super) fn is_input_required(result: Option<&Value>) -> bool {
    result
        .and_then(|r| r.get("resultType"))
        .and_then(Value::as_str)
        == Some("input_required")
}

/// What the round loop needs of the upstream: sending the call again with the answers.
pub(crate) trait AsksAgain: Send + Sync {
    /// Sends `body` (the client's call in its own era, with `inputResponses` and
    /// `requestState`) upstream as `headers`/`caller`; the JSON-RPC response it gets.
    fn call_again(
        self: Arc<Self>,
        headers: HeaderMap,
        caller: Caller,
        method: (String, Option<Method>),
        body: Bytes,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Value, Error>> + Send>>;
}

/// One mirrored call: who asked, what they asked, where its answers arrive.
pub(super) struct Mirror {
    pub(super) upstream: Arc<dyn AsksAgain>,
    pub(super) asks: Arc<Asks>,
    pub(super) headers: HeaderMap,
    pub(super) caller: Caller,
    /// The call's method: its wire name and catalogue entry.
    pub(super) method: (String, Option<Method>),
    /// The client's request as it sent it.
    pub(super) request: Bytes,
    pub(super) id: Box<RawValue>,
    /// How long a question waits for its answer.
    pub(super) wait: Duration,
}

/// The 2025 client's answer: an event stream that asks it the questions of `first` (the
/// upstream's `input_required` result) and ends with the call's result.
/// The final result passes through `plan`. The first round's places in the ledger are taken
/// before the answer's head goes: a caller past its share (or a sidecar at the cap) gets 429
/// (503) with `Retry-After`, not an error event in a stream answered 200.
pub(super) fn answer_by_asking(
    mirror: Mirror,
    mut plan: ResultPlan,
    first: Value,
) -> Result<Response<Body>, Error> {
    let n = first
        .get("inputRequests")
        .and_then(Value::as_object)
        .map_or(0, Map::len)
        .min(MAX_QUESTIONS);
    let places = match mirror.asks.places(&mirror.caller, n) {
        Ok(p) => p,
        Err(e) => {
            plan.fail();
            return Err(e);
        }
    };
    let (tx, rx) = mpsc::channel::<Bytes>(MAX_QUESTIONS + 2);
    tokio::spawn(rounds(mirror, plan, first, places, tx));
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        let next = rx.recv().await?;
        Some((Ok::<_, BoxError>(Frame::data(next)), rx))
    });
    Ok(crate::body::event_stream(
        StreamBody::new(stream).boxed_unsync(),
    ))
}

/// Why a round could not go on, as the error the client's stream ends with.
enum Stop {
    /// The client went away.
    Gone,
    Failed(Error),
}

async fn rounds(
    m: Mirror,
    mut plan: ResultPlan,
    first: Value,
    places: Vec<Charge>,
    tx: mpsc::Sender<Bytes>,
) {
    let mut result = first;
    let mut places = Some(places);
    let outcome = async {
        for _ in 0..MAX_ROUNDS {
            let responses = ask_round(&m, &result, places.take(), &tx).await?;
            let mut again: Value = serde_json::from_slice(&m.request)
                .map_err(|e| Stop::Failed(Error::caused_by(ErrorKind::Internal, "", e)))?;
            again["params"]["inputResponses"] = Value::Object(responses);
            match result.get("requestState") {
                Some(s) => again["params"]["requestState"] = s.clone(),
                None => {
                    if let Some(p) = again["params"].as_object_mut() {
                        p.remove("requestState");
                    }
                }
            }
            let msg = m
                .upstream
                .clone()
                .call_again(
                    m.headers.clone(),
                    m.caller,
                    m.method.clone(),
                    Bytes::from(again.to_string()),
                )
                .await
                .map_err(Stop::Failed)?;
            if !is_input_required(msg.get("result")) {
                return Ok(msg);
            }
            result = msg["result"].clone();
        }
        Err(Stop::Failed(Error::new(
            ErrorKind::UpstreamFailed,
            format!("the upstream asked for input more than {MAX_ROUNDS} times in one call"),
        )))
    }
    .await;
    let last = match outcome {
        Ok(mut msg) => {
            msg["id"] = serde_json::from_str(m.id.get()).unwrap_or(Value::Null);
            let mut raw_msg = raw::parse_message(msg.to_string().as_bytes()).unwrap_or_default();
            let last = plan
                .rewrite(&mut raw_msg)
                .unwrap_or_else(|| raw::to_bytes(&raw_msg));
            // What the result gets once its hook has seen it (customer context's contract).
            match plan.amends() {
                Some(amends) => amends.apply(last).await,
                None => last,
            }
        }
        Err(Stop::Gone) => {
            plan.abandon();
            return;
        }
        Err(Stop::Failed(e)) => {
            plan.fail();
            e.body(Some(&m.id))
        }
    };
    if tx.send(message_event(&last)).await.is_err() {
        plan.abandon();
    }
}

/// Asks one round's questions on the stream and gathers their answers; `places` are the
/// round's places in the ledger when they were taken already (the first round's).
async fn ask_round(
    m: &Mirror,
    result: &Value,
    places: Option<Vec<Charge>>,
    tx: &mpsc::Sender<Bytes>,
) -> Result<Map<String, Value>, Stop> {
    let requests = result
        .get("inputRequests")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    if requests.len() > MAX_QUESTIONS {
        return Err(Stop::Failed(Error::new(
            ErrorKind::UpstreamFailed,
            format!(
                "the upstream asked {} questions at once, more than the {MAX_QUESTIONS} the sidecar asks a 2025 client",
                requests.len()
            ),
        )));
    }
    let mut places = match places {
        Some(p) if p.len() == requests.len() => p,
        _ => m
            .asks
            .places(&m.caller, requests.len())
            .map_err(Stop::Failed)?,
    };
    let mut waiting = Vec::with_capacity(requests.len());
    for (key, request) in requests {
        let Some(place) = places.pop() else { break };
        let (tx_answer, rx) = oneshot::channel();
        let (ask, id) = m.asks.ask(m.caller, place, Target::Waiting(tx_answer));
        let mut msg = json!({"jsonrpc": "2.0", "id": id, "method": request.get("method")});
        if let Some(p) = request.get("params") {
            msg["params"] = p.clone();
        }
        if tx
            .send(message_event(msg.to_string().as_bytes()))
            .await
            .is_err()
        {
            m.asks.forget(ask);
            return Err(Stop::Gone);
        }
        waiting.push((key, ask, rx));
    }
    gather(m, waiting, tx).await
}

/// The answers to the questions asked (`waiting`: each key, its entry, where its answer
/// arrives), in the order asked; the first one missing or refused stops the round.
async fn gather(
    m: &Mirror,
    waiting: Vec<(String, u128, oneshot::Receiver<super::asks::Answered>)>,
    tx: &mpsc::Sender<Bytes>,
) -> Result<Map<String, Value>, Stop> {
    let mut responses = Map::new();
    for (key, ask, rx) in waiting {
        let got = tokio::select! {
            got = tokio::time::timeout(m.wait, rx) => got,
            () = tx.closed() => {
                m.asks.forget(ask);
                return Err(Stop::Gone);
            }
        };
        m.asks.forget(ask);
        let answer = match got {
            Ok(Ok(answer)) => answer,
            _ => {
                return Err(Stop::Failed(Error::new(
                    ErrorKind::UpstreamFailed,
                    format!(
                        "the client did not answer the upstream's question {key} within {} (EPODE_SIDECAR_HELD_CALL_WAIT)",
                        humantime::format_duration(m.wait)
                    ),
                )))
            }
        };
        match answer.get("result") {
            Some(r) => {
                responses.insert(key, r.clone());
            }
            None => {
                let why = answer
                    .pointer("/error/message")
                    .and_then(Value::as_str)
                    .unwrap_or("no result");
                return Err(Stop::Failed(Error::new(
                    ErrorKind::UpstreamFailed,
                    format!("the client could not answer the upstream's question {key}: {why}"),
                )));
            }
        }
    }
    Ok(responses)
}
