//! Rewriting a result for the client's era, touching only the fields it changes (on
//! [`RawMap`]s, so every other value keeps its exact bytes), and the [`ResultPlan`] that
//! carries a request's response through it.

use serde::Deserialize;
use serde_json::value::RawValue;

use super::end::{Abandoned, Amends, Ending, RequestEnd, ResultHook};
use super::era::Era;
use super::method::{Method, Shape};
use super::raw::{as_str, is_object, null, open, raw, RawMap};
use super::version::META_SERVER_INFO;
use crate::error::code;

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

/// The fields of a message a plan reads first, borrowed from its bytes.
#[derive(Deserialize)]
struct Glance<'a> {
    #[serde(borrow, default)]
    method: Option<&'a RawValue>,
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

/// The fields of a result a plan may add or change, borrowed.
#[derive(Deserialize)]
struct ResultGlance<'a> {
    #[serde(rename = "resultType", borrow, default)]
    result_type: Option<&'a RawValue>,
    #[serde(rename = "ttlMs", borrow, default)]
    ttl_ms: Option<&'a RawValue>,
    #[serde(rename = "cacheScope", borrow, default)]
    cache_scope: Option<&'a RawValue>,
    #[serde(rename = "isError", borrow, default)]
    is_error: Option<&'a RawValue>,
    #[serde(rename = "_meta", borrow, default)]
    meta: Option<&'a RawValue>,
}

/// The server identity in a result's `_meta`, borrowed.
#[derive(Deserialize)]
struct MetaGlance<'a> {
    #[serde(rename = "io.modelcontextprotocol/serverInfo", borrow, default)]
    server_info: Option<&'a RawValue>,
}

/// What a plan did to one message.
enum Outcome {
    Same,
    /// The message itself changed (its result became an error).
    Message,
    /// The result changed: this is the new one.
    Result(RawMap),
}

/// What to do to the response of one request, and the request's end ([`RequestEnd`]),
/// told exactly once how it ended: answered when a result arrives, failed when the answer is
/// an error (an error answer, an error status, no answer at all: whoever learns it calls
/// [`ResultPlan::fail`]), not sent when the sidecar refused it before sending it; a plan
/// dropped unended hands its end to the request's end step ([`Abandoned`]).
pub(crate) struct ResultPlan {
    /// The request's catalogue entry: its result's shape per era.
    method: Option<Method>,
    /// The client's era: a 2026 client gets `resultType`, serverInfo and cache hints; a
    /// 2025 client gets 2025 shapes.
    client_era: Era,
    /// Server identity for `_meta` (modern client): set when absent, or always when `force`.
    pub(crate) server_info: Option<std::sync::Arc<serde_json::Value>>,
    pub(crate) force_server_info: bool,
    /// Defaults for `ttlMs` / `cacheScope` on cacheable methods (modern client).
    pub(crate) cache: Option<(u64, &'static str)>,
    end: RequestEnd,
    /// What the hook may add to the result afterwards (customer context), for the answer
    /// path to wait for before it writes the result.
    amends: Option<Amends>,
}

impl ResultPlan {
    pub(crate) fn new(method: Option<Method>, client_era: Era, abandoned: Abandoned) -> Self {
        ResultPlan {
            method,
            client_era,
            server_info: None,
            force_server_info: false,
            cache: None,
            end: RequestEnd::new(method, abandoned),
            amends: None,
        }
    }

    /// The result may be amended after the hook has seen it (see [`Amends`]).
    pub(crate) fn set_amends(&mut self, amends: Amends) {
        self.amends = Some(amends);
    }

    /// The amendment to wait for, when the result may get one.
    pub(crate) fn amends(&self) -> Option<Amends> {
        self.amends.clone()
    }

    /// What the response passes through (the binding's decoration and telemetry).
    pub(crate) fn set_hook(&mut self, hook: Option<Box<dyn ResultHook>>) {
        self.end.hook = hook;
    }

    /// The era the result is rewritten for.
    pub(crate) fn client_era(&self) -> Era {
        self.client_era
    }

    /// The client went away: its end records nothing.
    pub(crate) fn abandon(&self) {
        self.end.abandon();
    }

    /// The request was refused before anything was sent upstream (a limit of the sidecar's
    /// own): it never became a product call, so it ends recording nothing, as a request the
    /// front door refused.
    pub(crate) fn not_sent(&mut self) {
        self.end.end(Ending::NotSent);
    }

    /// The request failed (an error answer or status, no answer at all): it ends so, unless
    /// it already ended.
    pub(crate) fn fail(&mut self) {
        self.end.end(Ending::Failed);
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

    /// Whether the plan leaves one whole response message as it is, told from a glance at
    /// the few fields it reads, borrowed from `bytes` (nothing parsed into maps, nothing
    /// written again): a 2026 client's result that already carries what the plan would add,
    /// with no hook to pass through. When so, the request's end is recorded here as
    /// [`ResultPlan::rewrite_from`] would record it; when not (or when in doubt: a field
    /// spelled with escapes, a duplicated one, a `_meta` that is no object), nothing is
    /// recorded and the message takes the full way.
    pub(crate) fn leaves_as_is(&mut self, bytes: &[u8]) -> bool {
        if self.end.hook.is_some() || self.client_era != Era::Modern {
            return false;
        }
        let Ok(Glance {
            method: None,
            error: None,
            result: Some(result),
        }) = serde_json::from_slice::<Glance<'_>>(bytes)
        else {
            return false;
        };
        let Ok(r) = serde_json::from_str::<ResultGlance<'_>>(result.get()) else {
            return false;
        };
        let Some(result_type) = r.result_type else {
            return false;
        };
        let complete = match result_type.get() {
            "\"complete\"" => true,
            other if other.contains('\\') => return false,
            _ => false,
        };
        if complete && self.cache.is_some() && (r.ttl_ms.is_none() || r.cache_scope.is_none()) {
            return false;
        }
        if self.server_info.is_some() {
            let seen = r
                .meta
                .and_then(|m| serde_json::from_str::<MetaGlance<'_>>(m.get()).ok());
            if self.force_server_info || seen.is_none_or(|m| m.server_info.is_none()) {
                return false;
            }
        }
        if r.is_error.is_some_and(|v| v.get() == "true") {
            self.end.error_seen(None);
        }
        self.end.end(Ending::Answered);
        true
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
            self.end.notification(&method);
            return Outcome::Same;
        }
        let Some(mut result) = msg.get("result").and_then(|r| open(r)) else {
            if let Some(error) = msg.get("error") {
                let code = open(error)
                    .and_then(|e| e.get("code").and_then(|c| c.get().parse::<i64>().ok()));
                self.end.error_seen(Some(code.unwrap_or(-32603)));
                self.fail();
            }
            return Outcome::Same;
        };
        if result.get("isError").is_some_and(|v| v.get() == "true") {
            self.end.error_seen(None);
        }
        let mut changed = false;
        if self.end.ended().is_none() {
            if let Some(hook) = self.end.open_hook() {
                changed |= hook.result(&mut result);
            }
            self.end.end(Ending::Answered);
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
                    serde_json::from_str::<serde_json::Value>(p.get()).map_or(true, |p| p != **info)
                }
            };
            if replace {
                meta.insert(META_SERVER_INFO.into(), raw(&**info));
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
        if rt == "task" {
            return Err("The upstream answered with a task (resultType 'task', the 2026-07-28 tasks extension), which a 2025-era client cannot follow; connect with MCP 2026-07-28 and declare io.modelcontextprotocol/tasks".to_owned());
        }
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

    /// What a hook heard: how many results, and each ending.
    type Heard = std::sync::Arc<std::sync::Mutex<(u32, Vec<Ending>)>>;

    struct Count(Heard);

    impl ResultHook for Count {
        fn result(&mut self, _: &mut RawMap) -> bool {
            self.0.lock().unwrap().0 += 1;
            false
        }
        fn end(&mut self, ending: Ending) {
            self.0.lock().unwrap().1.push(ending);
        }
    }

    fn counted_with(era: Era, slot: Abandoned) -> (ResultPlan, Heard) {
        let seen = Heard::default();
        let mut p = ResultPlan::new(Method::from_wire("tools/call"), era, slot);
        p.set_hook(Some(Box::new(Count(seen.clone()))));
        (p, seen)
    }

    fn counted(era: Era) -> (ResultPlan, Heard) {
        counted_with(era, Abandoned::default())
    }

    fn heard(seen: &Heard) -> (u32, Vec<Ending>) {
        seen.lock().unwrap().clone()
    }

    /// The glance ([`ResultPlan::leaves_as_is`]) and the full way agree: wherever the glance
    /// says a message is left as it is, the full way gives back the same bytes and records the
    /// same ending and failure; and the glance takes the conforming answers it is for.
    #[test]
    fn the_glance_leaves_as_is_only_what_the_full_way_leaves_as_is() {
        let info = r#"{"io.modelcontextprotocol/serverInfo":{"name":"up","version":"1"}}"#;
        let messages = [
            format!(r#"{{"jsonrpc":"2.0","id":1,"result":{{"resultType":"complete","prompts":[],"ttlMs":0,"cacheScope":"private","_meta":{info}}}}}"#),
            format!(r#"{{"jsonrpc":"2.0","id":1,"result":{{"resultType":"complete","isError":true,"content":[],"_meta":{info}}}}}"#),
            format!(r#"{{"jsonrpc":"2.0","id":1,"result":{{"resultType":"input_required","_meta":{info}}}}}"#),
            r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete","prompts":[]}}"#.to_owned(),
            r#"{"jsonrpc":"2.0","id":1,"result":{"prompts":[],"ttlMs":5,"cacheScope":"public"}}"#.to_owned(),
            r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"\u0063omplete","_meta":{}}}"#.to_owned(),
            r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete","ttlMs":null,"cacheScope":"x","_meta":"no object"}}"#.to_owned(),
            r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete","resultType":"complete"}}"#.to_owned(),
            r#"{"jsonrpc":"2.0","id":1,"result":null}"#.to_owned(),
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"no"}}"#.to_owned(),
            r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{}}"#.to_owned(),
            r#"[1,2]"#.to_owned(),
        ];
        let shown = std::sync::Arc::new(json!({"name": "up", "version": "1"}));
        let mut glanced = 0;
        for m in &messages {
            for (cache, info, forced) in [
                (None, None, false),
                (Some((0, "private")), None, false),
                (Some((0, "private")), Some(shown.clone()), false),
                (None, Some(shown.clone()), true),
            ] {
                let plans = [(); 2].map(|()| {
                    let slot = Abandoned::default();
                    let mut p = ResultPlan::new(
                        Method::from_wire("prompts/list"),
                        Era::Modern,
                        slot.clone(),
                    );
                    p.cache = cache;
                    p.server_info = info.clone();
                    p.force_server_info = forced;
                    (p, slot)
                });
                let [(mut glance, glance_slot), (mut full, full_slot)] = plans;
                if !glance.leaves_as_is(m.as_bytes()) {
                    assert_eq!(
                        glance.end.ended(),
                        None,
                        "nothing recorded when it declines: {m}"
                    );
                    continue;
                }
                glanced += 1;
                let bytes = bytes::Bytes::from(m.clone());
                let mut parsed = parse_message(&bytes).unwrap();
                let out = full.rewrite_from(&mut parsed, bytes.clone());
                assert_eq!(out, bytes, "the full way changed what the glance left: {m}");
                assert_eq!(glance.end.ended(), full.end.ended(), "{m}");
                assert_eq!(glance_slot.failure(), full_slot.failure(), "{m}");
            }
        }
        // The conforming list under the first three plans, the tool error and the first
        // result without cache hints under the plan that adds none, `input_required` under
        // the first three, the `null` ttlMs under the plan that reads nothing: 3+1+3+1+1.
        assert_eq!(glanced, 9);
    }

    #[test]
    fn every_plan_ends_exactly_once() {
        use Ending::*;
        // A result, then more, then a failure found after it, then the plan dropped: the
        // result, ended once as answered.
        let (mut p, seen) = counted(Era::Modern);
        apply(&mut p, &mut msg(r#"{"id":1,"result":{"content":[]}}"#));
        apply(&mut p, &mut msg(r#"{"id":1,"result":{"content":[]}}"#));
        p.fail();
        drop(p);
        assert_eq!(heard(&seen), (1, vec![Answered]));
        // An error answer: failed once, even when dropped after.
        let (mut p, seen) = counted(Era::Modern);
        apply(
            &mut p,
            &mut msg(r#"{"id":1,"error":{"code":-1,"message":"x"}}"#),
        );
        drop(p);
        assert_eq!(heard(&seen), (0, vec![Failed]));
        // No answer at all (an error status, an unreachable upstream): failed once, where
        // that is known, and not again.
        let (mut p, seen) = counted(Era::Legacy);
        p.fail();
        p.fail();
        drop(p);
        assert_eq!(heard(&seen), (0, vec![Failed]));
        // Refused before it was sent: ended as not sent.
        let (mut p, seen) = counted(Era::Modern);
        p.not_sent();
        p.fail();
        drop(p);
        assert_eq!(heard(&seen), (0, vec![NotSent]));
        // Dropped with no ending while the client is there (the shutdown cut): the drop
        // ends nothing; the request's end step does, as unreported, once.
        let slot = Abandoned::default();
        let before = crate::mcp::end::unreported();
        let (p, seen) = counted_with(Era::Legacy, slot.clone());
        drop(p);
        assert_eq!(heard(&seen), (0, vec![]), "no ending from the destructor");
        slot.end_left();
        slot.end_left();
        assert_eq!(heard(&seen), (0, vec![Unreported]));
        assert!(crate::mcp::end::unreported() > before);
        // The client went away: ended as gone (which records nothing), once.
        let slot = Abandoned::default();
        let (p, seen) = counted_with(Era::Modern, slot.clone());
        p.abandon();
        drop(p);
        slot.end_left();
        assert_eq!(heard(&seen), (0, vec![ClientGone]));
        // The client gone after the plan was handed over: still gone, once.
        let slot = Abandoned::default();
        let (p, seen) = counted_with(Era::Modern, slot.clone());
        drop(p);
        slot.set();
        slot.end_left();
        assert_eq!(heard(&seen), (0, vec![ClientGone]));
        // Ended explicitly, then dropped: the step has nothing left to end.
        let slot = Abandoned::default();
        let (mut p, seen) = counted_with(Era::Modern, slot.clone());
        p.fail();
        drop(p);
        slot.end_left();
        assert_eq!(heard(&seen), (0, vec![Failed]));
    }

    #[test]
    fn modern_fields_are_added_only_when_missing() {
        let mut plan = new_plan("tools/list", Era::Modern);
        plan.server_info = Some(std::sync::Arc::new(json!({"name": "up", "version": "1"})));
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
