//! JSON objects read as ordered maps of raw JSON values ([`RawMap`]): only the objects on the
//! path to a changed field are ever opened, so every other value keeps its exact bytes
//! (numbers beyond f64, `1e400`, unicode escapes, key order).

use indexmap::IndexMap;
use serde::Serialize;
use serde_json::value::RawValue;

/// A JSON object whose values are left as raw JSON text until someone opens them. Its keys
/// come from the upstream and the client, but a map only ever lives for one message, so the
/// fast hasher (randomly seeded per process) is enough.
pub(crate) type RawMap = IndexMap<String, Box<RawValue>, foldhash::fast::RandomState>;

/// Raw JSON for a value the sidecar made.
pub(crate) fn raw<T: Serialize + ?Sized>(v: &T) -> Box<RawValue> {
    serde_json::value::to_raw_value(v).unwrap_or_else(|_| null())
}

pub(crate) fn null() -> Box<RawValue> {
    RawValue::from_string("null".to_owned()).unwrap_or_else(|_| unreachable!("null is JSON"))
}

/// Opens a raw value as an object; `None` when it is not one.
pub(crate) fn open(v: &RawValue) -> Option<RawMap> {
    if !is_object(v) {
        return None;
    }
    serde_json::from_str(v.get()).ok()
}

pub(crate) fn is_object(v: &RawValue) -> bool {
    v.get().trim_start().starts_with('{')
}

/// The value as a string, when it is one (borrowed unless it has escapes).
pub(crate) fn as_str(v: &RawValue) -> Option<std::borrow::Cow<'_, str>> {
    serde_json::from_str(v.get()).ok()
}

/// Whether the value is the literal `true`.
pub(crate) fn is_true(v: &RawValue) -> bool {
    v.get().trim() == "true"
}

/// Parses a whole message as a [`RawMap`].
pub(crate) fn parse_message(bytes: &[u8]) -> Option<RawMap> {
    serde_json::from_slice(bytes).ok()
}

pub(crate) fn to_bytes(msg: &RawMap) -> bytes::Bytes {
    bytes::Bytes::from(serde_json::to_vec(msg).unwrap_or_default())
}

/// Whether a JSON-RPC message is a response (not a request or notification).
pub(crate) fn is_response(msg: &RawMap) -> bool {
    !msg.contains_key("method") && (msg.contains_key("result") || msg.contains_key("error"))
}

/// `{"jsonrpc":"2.0","id":id,"result":result}` as a map.
pub(crate) fn result_message(id: &RawValue, result: Box<RawValue>) -> RawMap {
    let mut m = RawMap::default();
    m.insert("jsonrpc".into(), raw("2.0"));
    m.insert("id".into(), id.to_owned());
    m.insert("result".into(), result);
    m
}
