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

/// The message serialised, into a buffer sized once (a decorated answer is several KB, which
/// grown by doubling was four reallocations and copies).
pub(crate) fn to_bytes(msg: &RawMap) -> bytes::Bytes {
    let mut out = Vec::with_capacity(size_of_unescaped(msg));
    match serde_json::to_writer(&mut out, msg) {
        Ok(()) => bytes::Bytes::from(out),
        Err(_) => bytes::Bytes::new(),
    }
}

/// An object as raw JSON, serialised into a buffer sized once: a large result grown by
/// doubling held up to twice its size, copied at every step.
pub(crate) fn raw_object(map: &RawMap) -> Box<RawValue> {
    let mut out = Vec::with_capacity(size_of_unescaped(map));
    if serde_json::to_writer(&mut out, map).is_err() {
        return null();
    }
    String::from_utf8(out)
        .ok()
        .and_then(|s| RawValue::from_string(s).ok())
        .unwrap_or_else(null)
}

/// The message's serialised size when no key needs escaping: braces, and per member its key,
/// two quotes, a colon and a comma.
fn size_of_unescaped(msg: &RawMap) -> usize {
    2 + msg
        .iter()
        .map(|(k, v)| k.len() + v.get().len() + 4)
        .sum::<usize>()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_serialises_as_serde_json_does_into_a_buffer_sized_once() {
        let text = r#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"a \"quoted\" word"}],"_agentFeedback":{"handle":"h"}}}"#;
        let msg = parse_message(text.as_bytes()).unwrap();
        let out = to_bytes(&msg);
        assert_eq!(&out[..], &serde_json::to_vec(&msg).unwrap()[..]);
        assert_eq!(&out[..], text.as_bytes());
        // Exact when no key needs escaping (the separator after the last member is spare).
        assert_eq!(size_of_unescaped(&msg), out.len() + 1);
        let result = open(&msg["result"]).unwrap();
        assert_eq!(raw_object(&result).get(), msg["result"].get());
    }
}
