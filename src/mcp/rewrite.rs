//! Rewriting a result for the client's era, touching only the fields it changes. A message is
//! read as an ordered map of raw JSON values ([`RawMap`]): only the objects on the path to a
//! changed field are opened, so every other value keeps its exact bytes (numbers beyond f64,
//! `1e400`, unicode escapes, key order).

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::version::META_SERVER_INFO;

/// A JSON object whose values are left as raw JSON text until someone opens them. Its keys
/// come from the upstream and the client, but a map only ever lives for one message, so the
/// fast hasher (randomly seeded per process) is enough.
pub type RawMap = IndexMap<String, Box<RawValue>, foldhash::fast::RandomState>;

/// What a request's response passes through besides the era rewrite: the feedback binding's
/// decoration and telemetry. Exactly one of `result` or `failed` is called for a request
/// that completes; neither for one the client abandons.
pub trait ResultHook: Send {
    /// The complete result (before the era rewrite); returns whether it changed it.
    fn result(&mut self, result: &mut RawMap) -> bool;
    /// The request failed: a JSON-RPC error, an upstream error status, or no answer.
    fn failed(&mut self) {}
    /// A notification seen on the response stream (`notifications/tools/list_changed`, …).
    fn notification(&mut self, _method: &str) {}
}

/// Raw JSON for a value the sidecar made.
pub fn raw<T: Serialize + ?Sized>(v: &T) -> Box<RawValue> {
    serde_json::value::to_raw_value(v).unwrap_or_else(|_| raw_null())
}

fn raw_null() -> Box<RawValue> {
    RawValue::from_string("null".to_owned()).expect("null is JSON")
}

/// Opens a raw value as an object; `None` when it is not one.
pub fn open(v: &RawValue) -> Option<RawMap> {
    if !is_object(v) {
        return None;
    }
    serde_json::from_str(v.get()).ok()
}

pub fn is_object(v: &RawValue) -> bool {
    v.get().trim_start().starts_with('{')
}

/// The value as a string, when it is one.
pub fn as_str(v: &RawValue) -> Option<String> {
    serde_json::from_str::<String>(v.get()).ok()
}

/// Parses a whole message as a [`RawMap`].
pub fn parse_message(bytes: &[u8]) -> Option<RawMap> {
    serde_json::from_slice(bytes).ok()
}

/// Whether a JSON-RPC message is a response (not a request or notification).
pub fn is_response(msg: &RawMap) -> bool {
    !msg.contains_key("method") && (msg.contains_key("result") || msg.contains_key("error"))
}

/// The HTTP status 2026-07-28 gives a JSON-RPC error a 2025-era upstream answered with 200:
/// 404 for an unknown method, 400 for the request-level codes; `None` to keep the status.
pub fn modern_error_status(msg: &RawMap) -> Option<http::StatusCode> {
    #[derive(Deserialize)]
    struct Code {
        code: i64,
    }
    let code = serde_json::from_str::<Code>(msg.get("error")?.get())
        .ok()?
        .code;
    match code {
        -32601 => Some(http::StatusCode::NOT_FOUND),
        -32700 | -32600 | -32020 | -32021 | -32022 => Some(http::StatusCode::BAD_REQUEST),
        _ => None,
    }
}

pub fn to_bytes(msg: &RawMap) -> bytes::Bytes {
    bytes::Bytes::from(serde_json::to_vec(msg).unwrap_or_default())
}

/// What to do to the response of one request.
pub struct ResultPlan {
    pub method: String,
    /// The client speaks 2026-07-28: complete `resultType`, serverInfo, cache hints.
    pub modern_client: bool,
    /// Server identity for `_meta` (modern client): set when absent, or always when `force`.
    pub server_info: Option<serde_json::Value>,
    pub force_server_info: bool,
    /// Defaults for `ttlMs` / `cacheScope` on cacheable methods (modern client).
    pub cache: Option<(u64, String)>,
    pub hook: Option<Box<dyn ResultHook>>,
}

impl ResultPlan {
    pub fn new(method: &str, modern_client: bool) -> Self {
        ResultPlan {
            method: method.to_owned(),
            modern_client,
            server_info: None,
            force_server_info: false,
            cache: None,
            hook: None,
        }
    }

    /// The request failed before or without a result.
    pub fn failed(&mut self) {
        if let Some(hook) = self.hook.as_mut() {
            hook.failed();
        }
    }

    /// Applies the plan to one JSON-RPC message of the response (notifications are only
    /// observed); returns whether anything changed.
    pub fn apply(&mut self, msg: &mut RawMap) -> bool {
        if let Some(method) = msg.get("method").and_then(|m| as_str(m)) {
            if let Some(hook) = self.hook.as_mut() {
                hook.notification(&method);
            }
            return false;
        }
        let Some(mut result) = msg.get("result").and_then(|r| open(r)) else {
            if msg.contains_key("error") {
                self.failed();
            }
            return false;
        };
        let mut changed = false;
        if let Some(hook) = self.hook.as_mut() {
            changed |= hook.result(&mut result);
        }
        if self.modern_client {
            changed |= self.to_modern(&mut result);
        } else {
            match to_legacy(&self.method, &mut result) {
                Ok(c) => changed |= c,
                Err(message) => {
                    // A result a 2025-era client cannot take becomes an error it can read.
                    msg.shift_remove("result");
                    msg.insert(
                        "error".into(),
                        raw(&serde_json::json!({"code": -32603, "message": message})),
                    );
                    return true;
                }
            }
        }
        if changed {
            msg.insert("result".into(), raw(&result));
        }
        changed
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
            let present = meta
                .get(META_SERVER_INFO)
                .and_then(|v| serde_json::from_str::<serde_json::Value>(v.get()).ok());
            let replace = match &present {
                None => true,
                Some(p) => self.force_server_info && p != info,
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
    RawValue::from_string(format!(r#"{{"result":{}}}"#, v.get())).unwrap_or_else(|_| raw_null())
}

/// 2026 shapes to 2025 ones: no `resultType` or cache hints, object-only `structuredContent`
/// and `outputSchema` (a non-object value is wrapped as `{"result": …}`, as the TypeScript SDK
/// does). An `input_required` result cannot be expressed and is an error.
fn to_legacy(method: &str, result: &mut RawMap) -> Result<bool, String> {
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
    match method {
        "tools/call" => {
            if let Some(sc) = result.get_mut("structuredContent") {
                if !is_object(sc) {
                    *sc = wrap_as_result(sc);
                    changed = true;
                }
            }
        }
        "tools/list" => {
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
                .unwrap_or_else(|_| raw_null());
                t.insert("outputSchema".into(), wrapped);
                *tool = raw(&t);
                any = true;
            }
            if any {
                result.insert("tools".into(), raw(&tools));
                changed = true;
            }
        }
        _ => {}
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn msg(s: &str) -> RawMap {
        parse_message(s.as_bytes()).unwrap()
    }

    fn value(m: &RawMap) -> Value {
        serde_json::from_slice(&to_bytes(m)).unwrap()
    }

    #[test]
    fn modern_fields_are_added_only_when_missing() {
        let mut plan = ResultPlan::new("tools/list", true);
        plan.server_info = Some(json!({"name": "up", "version": "1"}));
        plan.cache = Some((0, "private".into()));
        let mut m = msg(r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[],"ttlMs":5000}}"#);
        assert!(plan.apply(&mut m));
        let v = value(&m);
        assert_eq!(v["result"]["resultType"], "complete");
        assert_eq!(v["result"]["ttlMs"], 5000);
        assert_eq!(v["result"]["cacheScope"], "private");
        assert_eq!(v["result"]["_meta"][META_SERVER_INFO]["name"], "up");
        assert!(!plan.apply(&mut m), "a second pass changes nothing");
    }

    #[test]
    fn untouched_values_survive_exactly() {
        let raw_in = r#"{"jsonrpc":"2.0","id":1,"result":{"z":12345678901234567890,"a":0.1,"big":1e400,"s":"\u00e9\ud83d\ude80","content":[{"type":"text","text":"\u0000x"}]}}"#;
        let mut m = msg(raw_in);
        let mut plan = ResultPlan::new("tools/call", true);
        assert!(plan.apply(&mut m));
        let out = String::from_utf8(to_bytes(&m).to_vec()).unwrap();
        assert_eq!(
            out,
            r#"{"jsonrpc":"2.0","id":1,"result":{"z":12345678901234567890,"a":0.1,"big":1e400,"s":"\u00e9\ud83d\ude80","content":[{"type":"text","text":"\u0000x"}],"resultType":"complete"}}"#
        );
    }

    #[test]
    fn legacy_shapes() {
        let mut plan = ResultPlan::new("tools/call", false);
        let mut m = msg(
            r#"{"id":1,"result":{"content":[],"structuredContent":[1,2],"resultType":"complete"}}"#,
        );
        assert!(plan.apply(&mut m));
        assert_eq!(
            value(&m)["result"],
            json!({"content":[],"structuredContent":{"result":[1,2]}})
        );
        let mut m = msg(r#"{"id":1,"result":{"resultType":"input_required","requestState":"x"}}"#);
        assert!(plan.apply(&mut m));
        assert_eq!(value(&m)["error"]["code"], -32603);
        let mut plan = ResultPlan::new("tools/list", false);
        let mut m = msg(
            r#"{"id":1,"result":{"tools":[{"name":"n","outputSchema":{"type":"string"}},{"name":"o","outputSchema":{"type":"object"}}]}}"#,
        );
        assert!(plan.apply(&mut m));
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
