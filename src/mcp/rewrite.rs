//! Rewriting a result for the client's era, touching only the fields it changes (on
//! [`RawMap`]s, so every other value keeps its exact bytes), and the [`ResultPlan`] that
//! carries a request's response through it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::era::Era;
use super::method::{self, Method, Shape};
use super::raw::{as_str, is_object, null, open, raw, RawMap};
use super::version::META_SERVER_INFO;
use crate::error::code;

/// What a request's response passes through besides the era rewrite: the feedback binding's
/// decoration and telemetry. Exactly one of `result` or `failed` is called for a request
/// that completes; neither for one the client abandons.
pub(crate) trait ResultHook: Send {
    /// The complete result (before the era rewrite); returns whether it changed it.
    fn result(&mut self, result: &mut RawMap) -> bool;
    /// The request failed: a JSON-RPC error, an upstream error status, or no answer.
    fn failed(&mut self) {}
    /// A notification seen on the response stream (`notifications/tools/list_changed`, …).
    fn notification(&mut self, _method: &str) {}
}

/// Set when the client went away before its answer was complete: the request's future or
/// its response stream was dropped. A plan dropped after that reports nothing.
#[derive(Clone, Default)]
pub(crate) struct Abandoned(Arc<AtomicBool>);

impl Abandoned {
    pub(crate) fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// The HTTP status 2026-07-28 gives a JSON-RPC error a 2025-era upstream answered with 200:
/// 404 for an unknown method, 400 for the request-level codes; `None` to keep the status.
pub(crate) fn modern_error_status(msg: &RawMap) -> Option<http::StatusCode> {
    #[derive(Deserialize)]
    struct Code {
        code: i64,
    }
    let code = serde_json::from_str::<Code>(msg.get("error")?.get())
        .ok()?
        .code;
    match code {
        code::METHOD_NOT_FOUND => Some(http::StatusCode::NOT_FOUND),
        code::PARSE_ERROR
        | code::INVALID_REQUEST
        | code::HEADER_MISMATCH
        | code::MISSING_CLIENT_CAPABILITY
        | code::UNSUPPORTED_VERSION => Some(http::StatusCode::BAD_REQUEST),
        _ => None,
    }
}

/// What a plan did to one message.
enum Outcome {
    Same,
    /// The message itself changed (its result became an error).
    Message,
    /// The result changed: this is the new one.
    Result(RawMap),
}

/// What to do to the response of one request. Its hook hears exactly one outcome: the result
/// when one arrives, `failed` when the answer is an error (an error answer, an error status,
/// no answer at all: whoever learns it calls [`ResultPlan::fail`]), and nothing when the
/// client abandoned the request or the sidecar refused it before sending it.
pub(crate) struct ResultPlan {
    /// The request's catalogue entry: its result's shape per era.
    method: Option<Method>,
    /// The client's era: a 2026 client gets `resultType`, serverInfo and cache hints; a
    /// 2025 client gets 2025 shapes.
    client_era: Era,
    /// Server identity for `_meta` (modern client): set when absent, or always when `force`.
    pub(crate) server_info: Option<serde_json::Value>,
    pub(crate) force_server_info: bool,
    /// Defaults for `ttlMs` / `cacheScope` on cacheable methods (modern client).
    pub(crate) cache: Option<(u64, &'static str)>,
    pub(crate) hook: Option<Box<dyn ResultHook>>,
    settled: bool,
    abandoned: Abandoned,
}

/// Plans dropped without an outcome although their client was still there: counted, and
/// reported as failures, so no event is lost to a path that forgot to report (a request
/// future dropped at the shutdown cut ends that way by design).
static DROPPED_UNREPORTED: AtomicU64 = AtomicU64::new(0);

/// How many plans ended without an explicit outcome (see [`DROPPED_UNREPORTED`]).
#[cfg(test)]
pub(crate) fn dropped_unreported() -> u64 {
    DROPPED_UNREPORTED.load(Ordering::Relaxed)
}

impl Drop for ResultPlan {
    fn drop(&mut self) {
        if self.settled || self.abandoned.is_set() {
            return;
        }
        if let Some(hook) = self.hook.as_mut() {
            DROPPED_UNREPORTED.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                method = method::label(self.method),
                "a request's plan ended without an outcome; reported as failed"
            );
            hook.failed();
        }
    }
}

impl ResultPlan {
    pub(crate) fn new(method: Option<Method>, client_era: Era, abandoned: Abandoned) -> Self {
        ResultPlan {
            method,
            client_era,
            server_info: None,
            force_server_info: false,
            cache: None,
            hook: None,
            settled: false,
            abandoned,
        }
    }

    /// The era the result is rewritten for.
    pub(crate) fn client_era(&self) -> Era {
        self.client_era
    }

    /// The client went away: nothing is reported for this request.
    pub(crate) fn abandon(&self) {
        self.abandoned.set();
    }

    /// The request was refused before anything was sent upstream (a limit of the sidecar's
    /// own): it never became a product call, so nothing is reported, as for a request the
    /// front door refused.
    pub(crate) fn not_sent(&mut self) {
        self.settled = true;
    }

    /// The request failed (an error answer or status, no answer at all): the hook hears it,
    /// once, unless it already heard an outcome.
    pub(crate) fn fail(&mut self) {
        if !self.settled {
            self.settled = true;
            if let Some(hook) = self.hook.as_mut() {
                hook.failed();
            }
        }
    }

    /// Applies the plan to one JSON-RPC message of the response (notifications are only
    /// observed); returns the message's new bytes when anything changed. A changed result is
    /// written into them as it stands, never made into text of its own and read back.
    pub(crate) fn rewrite(&mut self, msg: &mut RawMap) -> Option<bytes::Bytes> {
        let outcome = self.outcome(msg);
        Self::written(outcome, msg)
    }

    /// [`ResultPlan::rewrite`] of a message read from `original`: those bytes when nothing
    /// changed, and otherwise gone before the new ones are made (one copy less at the peak).
    pub(crate) fn rewrite_from(
        &mut self,
        msg: &mut RawMap,
        original: bytes::Bytes,
    ) -> bytes::Bytes {
        match self.outcome(msg) {
            Outcome::Same => original,
            outcome => {
                drop(original);
                Self::written(outcome, msg).unwrap_or_default()
            }
        }
    }

    fn written(outcome: Outcome, msg: &mut RawMap) -> Option<bytes::Bytes> {
        match outcome {
            Outcome::Same => None,
            Outcome::Message => Some(super::raw::to_bytes(msg)),
            Outcome::Result(result) => {
                // The old text goes before the new bytes are made: a large result is then
                // held twice at most (the map and the new message), not three times.
                if let Some(slot) = msg.get_mut("result") {
                    *slot = null();
                }
                Some(super::raw::to_bytes_with(msg, "result", &result))
            }
        }
    }

    fn outcome(&mut self, msg: &mut RawMap) -> Outcome {
        if let Some(method) = msg.get("method").and_then(|m| as_str(m)) {
            if let Some(hook) = self.hook.as_mut() {
                hook.notification(&method);
            }
            return Outcome::Same;
        }
        let Some(mut result) = msg.get("result").and_then(|r| open(r)) else {
            if msg.contains_key("error") {
                self.fail();
            }
            return Outcome::Same;
        };
        let mut changed = false;
        if !self.settled {
            self.settled = true;
            if let Some(hook) = self.hook.as_mut() {
                changed |= hook.result(&mut result);
            }
        }
        match self.client_era {
            Era::Modern => changed |= self.to_modern(&mut result),
            Era::Legacy => match to_legacy(self.method, &mut result) {
                Ok(c) => changed |= c,
                Err(message) => {
                    // A result a 2025-era client cannot take becomes an error it can read.
                    msg.shift_remove("result");
                    msg.insert(
                        "error".into(),
                        raw(&serde_json::json!({"code": code::INTERNAL_ERROR, "message": message})),
                    );
                    return Outcome::Message;
                }
            },
        }
        if changed {
            Outcome::Result(result)
        } else {
            Outcome::Same
        }
    }

    fn to_modern(&self, result: &mut RawMap) -> bool {
        let mut changed = false;
        if !result.contains_key("resultType") {
            result.insert("resultType".into(), raw("complete"));
            changed = true;
        }
        let complete =
            result.get("resultType").and_then(|v| as_str(v)).as_deref() == Some("complete");
        if let (true, Some((ttl, scope))) = (complete, &self.cache) {
            if !result.contains_key("ttlMs") {
                result.insert("ttlMs".into(), raw(ttl));
                changed = true;
            }
            if !result.contains_key("cacheScope") {
                result.insert("cacheScope".into(), raw(scope));
                changed = true;
            }
        }
        if let Some(info) = &self.server_info {
            let existing = result.get("_meta");
            let mut meta = match existing {
                Some(m) => match open(m) {
                    Some(m) => m,
                    None => return changed, // a non-object _meta is the upstream's business
                },
                None => RawMap::default(),
            };
            // Set when absent; when forced, replaced unless equal (read only then).
            let replace = match meta.get(META_SERVER_INFO) {
                None => true,
                Some(_) if !self.force_server_info => false,
                Some(p) => {
                    serde_json::from_str::<serde_json::Value>(p.get()).map_or(true, |p| &p != info)
                }
            };
            if replace {
                meta.insert(META_SERVER_INFO.into(), raw(info));
                result.insert("_meta".into(), raw(&meta));
                changed = true;
            }
        }
        changed
    }
}

fn wrap_as_result(v: &RawValue) -> Box<RawValue> {
    RawValue::from_string(format!(r#"{{"result":{}}}"#, v.get())).unwrap_or_else(|_| null())
}

/// 2026 shapes to 2025 ones: no `resultType` or cache hints, object-only `structuredContent`
/// and `outputSchema` (a non-object value is wrapped as `{"result": …}`, as the TypeScript SDK
/// does). An `input_required` result cannot be expressed and is an error.
fn to_legacy(method: Option<Method>, result: &mut RawMap) -> Result<bool, String> {
    let mut changed = false;
    if let Some(rt) = result.shift_remove("resultType") {
        changed = true;
        let rt = as_str(&rt).unwrap_or_default();
        if rt != "complete" {
            return Err(format!(
                "The upstream answered with resultType '{rt}' (it needs more input from the client), which a 2025-era client cannot handle; connect with MCP 2026-07-28"
            ));
        }
    }
    changed |= result.shift_remove("ttlMs").is_some();
    changed |= result.shift_remove("cacheScope").is_some();
    // Identity travels in `initialize` in 2025; a 2026 upstream's per-result copy goes.
    if let Some(mut meta) = result.get("_meta").and_then(|m| open(m)) {
        if meta.shift_remove(META_SERVER_INFO).is_some() {
            if meta.is_empty() {
                result.shift_remove("_meta");
            } else {
                result.insert("_meta".into(), raw(&meta));
            }
            changed = true;
        }
    }
    match method.map_or(Shape::Common, |m| m.entry().shape) {
        Shape::ToolResult => {
            if let Some(sc) = result.get_mut("structuredContent") {
                if !is_object(sc) {
                    *sc = wrap_as_result(sc);
                    changed = true;
                }
            }
        }
        Shape::ToolList => {
            let Some(mut tools) = result
                .get("tools")
                .and_then(|t| serde_json::from_str::<Vec<Box<RawValue>>>(t.get()).ok())
            else {
                return Ok(changed);
            };
            let mut any = false;
            for tool in &mut tools {
                let Some(mut t) = open(tool) else { continue };
                let Some(schema) = t.get("outputSchema") else {
                    continue;
                };
                #[derive(Deserialize)]
                struct Typed {
                    #[serde(rename = "type", default)]
                    ty: Option<serde_json::Value>,
                }
                let ty = serde_json::from_str::<Typed>(schema.get())
                    .ok()
                    .and_then(|t| t.ty);
                if ty.as_ref().and_then(|t| t.as_str()) == Some("object") {
                    continue;
                }
                let wrapped = RawValue::from_string(format!(
                    r#"{{"type":"object","properties":{{"result":{}}},"required":["result"]}}"#,
                    schema.get()
                ))
                .unwrap_or_else(|_| null());
                t.insert("outputSchema".into(), wrapped);
                *tool = raw(&t);
                any = true;
            }
            if any {
                result.insert("tools".into(), raw(&tools));
                changed = true;
            }
        }
        Shape::Common | Shape::NoResult => {}
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::raw::{parse_message, to_bytes};
    use serde_json::{json, Value};

    fn msg(s: &str) -> RawMap {
        parse_message(s.as_bytes()).unwrap()
    }

    fn value(m: &RawMap) -> Value {
        serde_json::from_slice(&to_bytes(m)).unwrap()
    }

    /// The plan applied as the request path applies it ([`ResultPlan::rewrite`]), the message
    /// then read back from the bytes it gives; whether anything changed.
    fn apply(plan: &mut ResultPlan, m: &mut RawMap) -> bool {
        match plan.rewrite(m) {
            Some(bytes) => {
                *m = parse_message(&bytes).unwrap();
                true
            }
            None => false,
        }
    }

    fn new_plan(method: &str, era: Era) -> ResultPlan {
        ResultPlan::new(Method::from_wire(method), era, Abandoned::default())
    }

    struct Count(std::sync::Arc<std::sync::Mutex<(u32, u32)>>);

    impl ResultHook for Count {
        fn result(&mut self, _: &mut RawMap) -> bool {
            self.0.lock().unwrap().0 += 1;
            false
        }
        fn failed(&mut self) {
            self.0.lock().unwrap().1 += 1;
        }
    }

    fn counted(era: Era) -> (ResultPlan, std::sync::Arc<std::sync::Mutex<(u32, u32)>>) {
        let seen = std::sync::Arc::new(std::sync::Mutex::new((0, 0)));
        let mut p = new_plan("tools/call", era);
        p.hook = Some(Box::new(Count(seen.clone())));
        (p, seen)
    }

    #[test]
    fn the_hook_hears_exactly_one_outcome() {
        // A result, then the plan dropped: the result only.
        let (mut p, seen) = counted(Era::Modern);
        apply(&mut p, &mut msg(r#"{"id":1,"result":{"content":[]}}"#));
        apply(&mut p, &mut msg(r#"{"id":1,"result":{"content":[]}}"#));
        drop(p);
        assert_eq!(*seen.lock().unwrap(), (1, 0));
        // An error answer: failed once, even when dropped after.
        let (mut p, seen) = counted(Era::Modern);
        apply(
            &mut p,
            &mut msg(r#"{"id":1,"error":{"code":-1,"message":"x"}}"#),
        );
        drop(p);
        assert_eq!(*seen.lock().unwrap(), (0, 1));
        // No answer at all (an error status, an unreachable upstream): failed once, where
        // that is known, and not again when dropped.
        let (mut p, seen) = counted(Era::Legacy);
        p.fail();
        p.fail();
        drop(p);
        assert_eq!(*seen.lock().unwrap(), (0, 1));
        // A plan dropped with no outcome at all is still reported (and counted).
        let before = dropped_unreported();
        let (p, seen) = counted(Era::Legacy);
        drop(p);
        assert_eq!(*seen.lock().unwrap(), (0, 1));
        assert!(dropped_unreported() > before);
        // Refused before it was sent: nothing.
        let (mut p, seen) = counted(Era::Modern);
        p.not_sent();
        drop(p);
        assert_eq!(*seen.lock().unwrap(), (0, 0));
        // The client went away: nothing.
        let (p, seen) = counted(Era::Modern);
        p.abandon();
        drop(p);
        assert_eq!(*seen.lock().unwrap(), (0, 0));
    }

    #[test]
    fn modern_fields_are_added_only_when_missing() {
        let mut plan = new_plan("tools/list", Era::Modern);
        plan.server_info = Some(json!({"name": "up", "version": "1"}));
        plan.cache = Some((0, "private"));
        let mut m = msg(r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[],"ttlMs":5000}}"#);
        assert!(apply(&mut plan, &mut m));
        let v = value(&m);
        assert_eq!(v["result"]["resultType"], "complete");
        assert_eq!(v["result"]["ttlMs"], 5000);
        assert_eq!(v["result"]["cacheScope"], "private");
        assert_eq!(v["result"]["_meta"][META_SERVER_INFO]["name"], "up");
        assert!(!apply(&mut plan, &mut m), "a second pass changes nothing");
    }

    #[test]
    fn untouched_values_survive_exactly() {
        let raw_in = r#"{"jsonrpc":"2.0","id":1,"result":{"z":12345678901234567890,"a":0.1,"big":1e400,"s":"\u00e9\ud83d\ude80","content":[{"type":"text","text":"\u0000x"}]}}"#;
        let mut m = msg(raw_in);
        let mut plan = new_plan("tools/call", Era::Modern);
        assert!(apply(&mut plan, &mut m));
        let out = String::from_utf8(to_bytes(&m).to_vec()).unwrap();
        assert_eq!(
            out,
            r#"{"jsonrpc":"2.0","id":1,"result":{"z":12345678901234567890,"a":0.1,"big":1e400,"s":"\u00e9\ud83d\ude80","content":[{"type":"text","text":"\u0000x"}],"resultType":"complete"}}"#
        );
    }

    #[test]
    fn legacy_shapes() {
        let mut plan = new_plan("tools/call", Era::Legacy);
        let mut m = msg(
            r#"{"id":1,"result":{"content":[],"structuredContent":[1,2],"resultType":"complete"}}"#,
        );
        assert!(apply(&mut plan, &mut m));
        assert_eq!(
            value(&m)["result"],
            json!({"content":[],"structuredContent":{"result":[1,2]}})
        );
        let mut m = msg(r#"{"id":1,"result":{"resultType":"input_required","requestState":"x"}}"#);
        assert!(apply(&mut plan, &mut m));
        assert_eq!(value(&m)["error"]["code"], -32603);
        let mut plan = new_plan("tools/list", Era::Legacy);
        let mut m = msg(
            r#"{"id":1,"result":{"tools":[{"name":"n","outputSchema":{"type":"string"}},{"name":"o","outputSchema":{"type":"object"}}]}}"#,
        );
        assert!(apply(&mut plan, &mut m));
        let v = value(&m);
        assert_eq!(
            v["result"]["tools"][0]["outputSchema"]["properties"]["result"]["type"],
            "string"
        );
        assert_eq!(
            v["result"]["tools"][1]["outputSchema"],
            json!({"type":"object"})
        );
    }
}
