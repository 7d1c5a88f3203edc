//! Requests and discovery results between the eras. A 2026 request for a 2025-era upstream
//! loses the 2026 envelope keys from `params._meta`; a 2025 request for a 2026 upstream gains
//! them and the routing headers; a 2025 `initialize` result becomes a 2026 discovery, and a
//! discovery's capabilities become what a 2025 client of the sidecar can use. Request
//! bodies are rewritten as raw JSON maps, so every value the translation does not touch
//! keeps its exact bytes.

use std::borrow::Cow;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::mcp::headers;
use crate::mcp::method::{Called, Method};
use crate::mcp::raw::{self, RawMap};
use crate::mcp::version::{self, MODERN};

/// The sidecar's own identity in the requests it makes itself.
pub(crate) fn sidecar_info() -> Value {
    json!({"name": "epode-sidecar", "version": env!("CARGO_PKG_VERSION")})
}

/// A modern request for a 2025-era upstream: the 2026 envelope keys leave `params._meta` (the
/// rest, such as `progressToken`, stays; an emptied `_meta` goes).
pub(crate) fn to_legacy(bytes: &Bytes) -> Bytes {
    let Some(mut msg) = raw::parse_message(bytes) else {
        return bytes.clone();
    };
    let Some(mut params) = msg.get("params").and_then(|p| raw::open(p)) else {
        return bytes.clone();
    };
    let Some(mut meta) = params.get("_meta").and_then(|m| raw::open(m)) else {
        return bytes.clone();
    };
    let before = meta.len();
    for key in version::ENVELOPE_KEYS {
        meta.shift_remove(key);
    }
    if meta.len() == before {
        return bytes.clone();
    }
    if meta.is_empty() {
        params.shift_remove("_meta");
    } else {
        params.insert("_meta".into(), raw::raw(&meta));
    }
    msg.insert("params".into(), raw::raw(&params));
    raw::to_bytes(&msg)
}

/// A 2025-era request for a 2026-07-28 upstream: the `_meta` envelope added (the client's
/// capabilities were told to `initialize`, which the sidecar does not keep: none are
/// claimed), and the name the `Mcp-Name` header must mirror.
/// `caps`: the 2025 client's declared capabilities, when the sidecar knows them (its session
/// id carries them); else it declares none.
pub(crate) fn to_modern(
    bytes: &Bytes,
    method: Called<'_>,
    caps: Option<&RawValue>,
) -> (Bytes, Option<String>) {
    let Some(mut msg) = raw::parse_message(bytes) else {
        return (bytes.clone(), None);
    };
    let mut params = match msg.get("params") {
        None => RawMap::default(),
        Some(p) => match raw::open(p) {
            Some(p) => p,
            None => return (bytes.clone(), None),
        },
    };
    let name_key = method.listed.and_then(Method::name_key);
    let name = name_key
        .and_then(|k| params.get(k))
        .and_then(|v| raw::as_str(v))
        .map(|n| n.into_owned());
    let mut meta = params
        .get("_meta")
        .and_then(|m| raw::open(m))
        .unwrap_or_default();
    meta.insert(version::META_PROTOCOL_VERSION.into(), raw::raw(MODERN));
    meta.entry(version::META_CLIENT_CAPABILITIES.into())
        .or_insert_with(|| caps.map_or_else(|| raw::raw(&json!({})), ToOwned::to_owned));
    meta.entry(version::META_CLIENT_INFO.into())
        .or_insert_with(|| raw::raw(&sidecar_info()));
    params.insert("_meta".into(), raw::raw(&meta));
    msg.insert("params".into(), raw::raw(&params));
    (raw::to_bytes(&msg), name)
}

const TRACEPARENT: &str = "traceparent";
const TRACESTATE: &str = "tracestate";

/// Whether a value is a W3C `traceparent`: `version-traceid-parentid-flags` in lowercase hex,
/// version not `ff`, neither id all zeros.
pub(crate) fn valid_traceparent(v: &str) -> bool {
    let parts: Vec<&str> = v.split('-').collect();
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let zeros = |s: &str| s.bytes().all(|b| b == b'0');
    parts.len() >= 4
        && hex(parts[0], 2)
        && parts[0] != "ff"
        && hex(parts[1], 32)
        && !zeros(parts[1])
        && hex(parts[2], 16)
        && !zeros(parts[2])
        && hex(parts[3], 2)
        && (parts[0] != "00" || parts.len() == 4)
}

fn meta_traceparent(msg: &RawMap) -> Option<String> {
    let params = raw::open(msg.get("params")?)?;
    let meta = raw::open(params.get("_meta")?)?;
    raw::as_str(meta.get(TRACEPARENT)?).map(|t| t.into_owned())
}

/// A W3C `traceparent` the client sent in only one place, copied to the other: the header
/// into `params._meta` (where the MCP OpenTelemetry conventions put it), or `_meta` into the
/// header. Without one (the common case), nothing is copied or parsed.
pub(crate) fn with_traceparent<'a>(
    headers: &'a HeaderMap,
    bytes: &'a Bytes,
) -> (Cow<'a, HeaderMap>, Cow<'a, Bytes>) {
    let header = headers
        .get(TRACEPARENT)
        .and_then(|v| v.to_str().ok())
        .filter(|v| valid_traceparent(v));
    let mentions = bytes
        .windows(TRACEPARENT.len())
        .any(|w| w == TRACEPARENT.as_bytes());
    if header.is_none() && !mentions {
        return (Cow::Borrowed(headers), Cow::Borrowed(bytes));
    }
    let Some(mut msg) = raw::parse_message(bytes) else {
        return (Cow::Borrowed(headers), Cow::Borrowed(bytes));
    };
    let in_meta = meta_traceparent(&msg);
    match (header, in_meta) {
        (Some(tp), None) => {
            let Some(mut params) = msg
                .get("params")
                .map_or(Some(RawMap::default()), |p| raw::open(p))
            else {
                return (Cow::Borrowed(headers), Cow::Borrowed(bytes));
            };
            let mut meta = params
                .get("_meta")
                .and_then(|m| raw::open(m))
                .unwrap_or_default();
            meta.insert(TRACEPARENT.into(), raw::raw(tp));
            params.insert("_meta".into(), raw::raw(&meta));
            msg.insert("params".into(), raw::raw(&params));
            (Cow::Borrowed(headers), Cow::Owned(raw::to_bytes(&msg)))
        }
        (None, Some(tp)) if valid_traceparent(&tp) && !headers.contains_key(TRACEPARENT) => {
            let mut h = headers.clone();
            if let Ok(v) = HeaderValue::from_str(&tp) {
                h.insert(TRACEPARENT, v);
            }
            (Cow::Owned(h), Cow::Borrowed(bytes))
        }
        _ => (Cow::Borrowed(headers), Cow::Borrowed(bytes)),
    }
}

/// [`with_trace_fields`] without parsing the message when it can: the fields written into the
/// request's `params._meta` (or a new `_meta` in its `params`) where the front door found it,
/// the rest of the bytes as they were. `meta` and `params` are the front door's views of
/// `bytes`; a `_meta` that already names a trace context, or a message without `params`, takes
/// the parsing path.
pub(crate) fn with_trace_fields_at<'a>(
    headers: &'a HeaderMap,
    bytes: &'a Bytes,
    fields: &[(&'static str, String)],
    meta: Option<&RawValue>,
    params: Option<&RawValue>,
) -> (Cow<'a, HeaderMap>, Cow<'a, Bytes>) {
    let offset = |v: &RawValue| {
        let start = (v.get().as_ptr() as usize).checked_sub(bytes.as_ptr() as usize)?;
        (start + v.get().len() <= bytes.len() && v.get().starts_with('{')).then_some(start)
    };
    let (at, open_meta, empty) = match (meta, params) {
        (Some(m), _) if !m.get().contains(TRACEPARENT) && !m.get().contains(TRACESTATE) => {
            match offset(m) {
                Some(at) => (at, false, is_empty_object(m.get())),
                None => return with_trace_fields(headers, bytes, fields),
            }
        }
        (None, Some(p)) => match offset(p) {
            Some(at) => (at, true, is_empty_object(p.get())),
            None => return with_trace_fields(headers, bytes, fields),
        },
        _ => return with_trace_fields(headers, bytes, fields),
    };
    let mut h = headers.clone();
    h.remove(TRACESTATE);
    let mut inserted = String::with_capacity(128);
    if open_meta {
        inserted.push_str("\"_meta\":{");
    }
    for (i, (k, v)) in fields.iter().enumerate() {
        if let Ok(hv) = HeaderValue::from_str(v) {
            h.insert(*k, hv);
        }
        if i > 0 {
            inserted.push(',');
        }
        inserted.push('"');
        inserted.push_str(k);
        inserted.push_str("\":");
        inserted.push_str(&serde_json::to_string(v).unwrap_or_else(|_| "\"\"".into()));
    }
    if open_meta {
        inserted.push('}');
    }
    if !empty {
        inserted.push(',');
    }
    let mut out = Vec::with_capacity(bytes.len() + inserted.len());
    out.extend_from_slice(&bytes[..=at]);
    out.extend_from_slice(inserted.as_bytes());
    out.extend_from_slice(&bytes[at + 1..]);
    (Cow::Owned(h), Cow::Owned(Bytes::from(out)))
}

/// `{}`, with any whitespace inside.
fn is_empty_object(v: &str) -> bool {
    v.strip_prefix('{')
        .and_then(|r| r.strip_suffix('}'))
        .is_some_and(|inner| inner.trim().is_empty())
}

/// The sidecar's own trace context (its upstream span's `traceparent`, and `tracestate`) in
/// both places the upstream may read it, over whatever the client sent: the headers and
/// `params._meta`. A body that is not a JSON-RPC object is left as it is.
pub(crate) fn with_trace_fields<'a>(
    headers: &'a HeaderMap,
    bytes: &'a Bytes,
    fields: &[(&'static str, String)],
) -> (Cow<'a, HeaderMap>, Cow<'a, Bytes>) {
    if fields.is_empty() {
        return (Cow::Borrowed(headers), Cow::Borrowed(bytes));
    }
    let mut h = headers.clone();
    h.remove(TRACESTATE);
    for (k, v) in fields {
        if let Ok(v) = HeaderValue::from_str(v) {
            h.insert(*k, v);
        }
    }
    let Some(mut msg) = raw::parse_message(bytes) else {
        return (Cow::Owned(h), Cow::Borrowed(bytes));
    };
    let Some(mut params) = msg
        .get("params")
        .map_or(Some(RawMap::default()), |p| raw::open(p))
    else {
        return (Cow::Owned(h), Cow::Borrowed(bytes));
    };
    let mut meta = params
        .get("_meta")
        .and_then(|m| raw::open(m))
        .unwrap_or_default();
    meta.shift_remove(TRACESTATE);
    for (k, v) in fields {
        meta.insert((*k).into(), raw::raw(v));
    }
    params.insert("_meta".into(), raw::raw(&meta));
    msg.insert("params".into(), raw::raw(&params));
    (Cow::Owned(h), Cow::Owned(raw::to_bytes(&msg)))
}

/// The trace context of one of the sidecar's own requests: `strip` (the client's trace
/// fields) gone from the headers and from the body's `params._meta`, and `fields` (its own
/// span's, when it has one) set in both. A body that is not a JSON-RPC object keeps its bytes.
pub(crate) fn own_trace_fields(
    headers: &HeaderMap,
    bytes: &Bytes,
    strip: &[&str],
    fields: &[(&'static str, String)],
) -> (HeaderMap, Bytes) {
    let mut h = headers.clone();
    for k in strip {
        h.remove(*k);
    }
    for (k, v) in fields {
        if let Ok(v) = HeaderValue::from_str(v) {
            h.insert(*k, v);
        }
    }
    let mentions = strip
        .iter()
        .any(|k| bytes.windows(k.len()).any(|w| w == k.as_bytes()));
    if !mentions && fields.is_empty() {
        return (h, bytes.clone());
    }
    let Some(mut msg) = raw::parse_message(bytes) else {
        return (h, bytes.clone());
    };
    let Some(mut params) = msg
        .get("params")
        .map_or(Some(RawMap::default()), |p| raw::open(p))
    else {
        return (h, bytes.clone());
    };
    let mut meta = params
        .get("_meta")
        .and_then(|m| raw::open(m))
        .unwrap_or_default();
    for k in strip {
        meta.shift_remove(*k);
    }
    for (k, v) in fields {
        meta.insert((*k).into(), raw::raw(v));
    }
    if meta.is_empty() {
        params.shift_remove("_meta");
    } else {
        params.insert("_meta".into(), raw::raw(&meta));
    }
    msg.insert("params".into(), raw::raw(&params));
    (h, raw::to_bytes(&msg))
}

/// Sets the 2026-07-28 routing headers for `method` (and `Mcp-Name` when given).
pub(crate) fn set_modern_headers(headers: &mut HeaderMap, method: &str, name: Option<&str>) {
    headers.insert(headers::PROTOCOL_VERSION, HeaderValue::from_static(MODERN));
    if let Some(v) = headers::encode(method) {
        headers.insert(headers::METHOD, v);
    }
    if let Some(v) = name.and_then(headers::encode) {
        headers.insert(HeaderName::from_static(headers::NAME), v);
    }
}

/// The capabilities a 2025 client of the sidecar can use: none that pushes. Change and
/// resource-update notifications would need a session's GET stream, which a stateless front
/// answers with 405 (and `resources/subscribe` is gone from a 2026 upstream).
pub(crate) fn for_legacy_client(caps: &Value) -> Value {
    let mut caps = caps.clone();
    if let Some(obj) = caps.as_object_mut() {
        for key in ["tools", "prompts", "resources"] {
            if let Some(Value::Object(c)) = obj.get_mut(key) {
                c.remove("listChanged");
                c.remove("subscribe");
            }
        }
    }
    caps
}

/// A 2025-era upstream's capabilities as a 2026 client sees them through the sidecar: the
/// change notices of every kind it serves are delivered on listen streams (`listen.rs`, fed
/// from its session; many 2025 servers send them without declaring `listChanged`), and
/// resource updates when it takes `resources/subscribe`; its tasks would need its session
/// stream, so they are not offered.
fn for_modern_client(caps: &Value) -> Value {
    let mut caps = caps.clone();
    if let Some(obj) = caps.as_object_mut() {
        for key in ["tools", "prompts", "resources"] {
            if let Some(Value::Object(c)) = obj.get_mut(key) {
                c.insert("listChanged".into(), Value::Bool(true));
            }
        }
        obj.remove("tasks");
    }
    caps
}

/// A `server/discover` result built from a 2025-era `initialize` result.
pub(crate) fn discover_from_init(init: &Value) -> Value {
    let mut r = serde_json::Map::new();
    r.insert("resultType".into(), "complete".into());
    r.insert("supportedVersions".into(), json!([MODERN]));
    r.insert(
        "capabilities".into(),
        for_modern_client(init.get("capabilities").unwrap_or(&json!({}))),
    );
    if let Some(i) = init.get("instructions").filter(|i| i.is_string()) {
        r.insert("instructions".into(), i.clone());
    }
    if let Some(info) = init.get("serverInfo") {
        r.insert("_meta".into(), json!({ version::META_SERVER_INFO: info }));
    }
    Value::Object(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modern_to_legacy_drops_only_the_envelope() {
        let body = Bytes::from_static(br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"add","arguments":{"n":1e400},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"progressToken":"p1"}}}"#);
        assert_eq!(
            &to_legacy(&body)[..],
            br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"add","arguments":{"n":1e400},"_meta":{"progressToken":"p1"}}}"#
        );
        let only_envelope = Bytes::from_static(br#"{"id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#);
        assert_eq!(
            &to_legacy(&only_envelope)[..],
            br#"{"id":1,"method":"tools/list","params":{}}"#
        );
        let untouched = Bytes::from_static(br#"{"id":1,"method":"x","params":[1]}"#);
        assert_eq!(to_legacy(&untouched), untouched);
    }

    #[test]
    fn legacy_to_modern_adds_the_envelope_and_the_name() {
        let body = Bytes::from_static(
            br#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"h\u00e9","arguments":{"big":12345678901234567890},"_meta":{"progressToken":3}}}"#,
        );
        let (out, name) = to_modern(&body, Called::of(Method::ToolsCall), None);
        assert_eq!(name.as_deref(), Some("hé"));
        let text = std::str::from_utf8(&out).unwrap();
        assert!(text.contains(r#""name":"h\u00e9""#), "{text}");
        assert!(text.contains(r#""big":12345678901234567890"#), "{text}");
        let v: Value = serde_json::from_slice(&out).unwrap();
        let meta = &v["params"]["_meta"];
        assert_eq!(meta["progressToken"], 3);
        assert_eq!(
            meta["io.modelcontextprotocol/protocolVersion"],
            "2026-07-28"
        );
        assert_eq!(
            meta["io.modelcontextprotocol/clientCapabilities"],
            json!({})
        );
        let (out, name) = to_modern(
            &Bytes::from_static(br#"{"id":1,"method":"tools/list"}"#),
            Called::of(Method::ToolsList),
            None,
        );
        assert_eq!(name, None);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert!(v["params"]["_meta"]["io.modelcontextprotocol/clientInfo"].is_object());
        // The 2025 client's own capabilities, when its session id carries them.
        let caps = RawValue::from_string(r#"{"roots":{"listChanged":true}}"#.to_owned()).unwrap();
        let (out, _) = to_modern(&body, Called::of(Method::ToolsCall), Some(&caps));
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"],
            json!({"roots": {"listChanged": true}})
        );
        let mut h = HeaderMap::new();
        set_modern_headers(&mut h, "tools/call", Some("hé"));
        assert_eq!(h["mcp-method"], "tools/call");
        assert!(h["mcp-name"].to_str().unwrap().starts_with("=?base64?"));
    }

    #[test]
    fn trace_fields_are_spliced_into_meta_or_params_and_the_rest_keeps_its_bytes() {
        let fields = [
            (
                TRACEPARENT,
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
            ),
            (TRACESTATE, r#"a=1,b="q""#.to_owned()),
        ];
        let h = HeaderMap::new();
        for body in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{"k":1}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":{ },"name":"x"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":{"traceparent":"00-1-2-01"}}}"#,
        ] {
            let bytes = Bytes::from(body);
            let Ok(crate::mcp::message::Inbound::Single(msg)) = crate::mcp::message::parse(&bytes)
            else {
                panic!("{body}")
            };
            let (headers, out) =
                with_trace_fields_at(&h, &bytes, &fields, msg.params.meta, msg.params_raw);
            let v: Value = serde_json::from_slice(&out).unwrap_or_else(|e| panic!("{body}: {e}"));
            let meta = &v["params"]["_meta"];
            assert_eq!(meta["traceparent"], fields[0].1.as_str(), "{body}");
            assert_eq!(meta["tracestate"], fields[1].1.as_str(), "{body}");
            assert_eq!(headers["traceparent"], fields[0].1.as_str());
            let before: Value = serde_json::from_str(body).unwrap();
            assert_eq!(
                v["params"].get("name"),
                before["params"].get("name"),
                "{body}"
            );
            if before["params"]["_meta"]["k"] == 1 {
                assert_eq!(meta["k"], 1, "{body}");
            }
        }
    }

    #[test]
    fn traceparent_goes_both_ways() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert!(valid_traceparent(tp));
        for bad in [
            "",
            "00-0000000000000000000000000000000-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        ] {
            assert!(!valid_traceparent(bad), "{bad}");
        }
        let mut h = HeaderMap::new();
        h.insert("traceparent", HeaderValue::from_static(tp));
        let body =
            Bytes::from_static(br#"{"id":1,"method":"tools/list","params":{"_meta":{"x":1}}}"#);
        let (headers, out) = with_traceparent(&h, &body);
        assert!(matches!(headers, Cow::Borrowed(_)));
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["params"]["_meta"]["traceparent"], tp);
        assert_eq!(v["params"]["_meta"]["x"], 1);
        let none = HeaderMap::new();
        let with_meta = out.into_owned();
        let (headers, out) = with_traceparent(&none, &with_meta);
        assert_eq!(headers["traceparent"], tp);
        assert!(matches!(out, Cow::Borrowed(_)));
        let plain = Bytes::from_static(br#"{"id":1,"method":"tools/list"}"#);
        let (headers, out) = with_traceparent(&none, &plain);
        assert!(matches!(
            (headers, out),
            (Cow::Borrowed(_), Cow::Borrowed(_))
        ));
    }

    #[test]
    fn a_2025_client_is_offered_nothing_pushed() {
        let caps = json!({
            "tools": {"listChanged": true},
            "resources": {"subscribe": true, "listChanged": true},
            "prompts": {},
            "logging": {},
            "completions": {},
            "tasks": {"list": {}},
        });
        assert_eq!(
            for_legacy_client(&caps),
            json!({"tools": {}, "resources": {}, "prompts": {}, "logging": {},
                   "completions": {}, "tasks": {"list": {}}})
        );
    }

    #[test]
    fn discovery_from_a_2025_handshake() {
        let d = discover_from_init(&json!({
            "protocolVersion": "2025-11-25",
            "capabilities": {"tools": {}, "resources": {"subscribe": true}, "logging": {}, "tasks": {}},
            "serverInfo": {"name": "s", "version": "1"},
            "instructions": "hi",
        }));
        assert_eq!(d["supportedVersions"], json!(["2026-07-28"]));
        assert_eq!(
            d["capabilities"],
            json!({"tools": {"listChanged": true}, "resources": {"subscribe": true, "listChanged": true}, "logging": {}})
        );
        assert_eq!(
            d["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
            "s"
        );
        assert_eq!(d["instructions"], "hi");
    }
}
