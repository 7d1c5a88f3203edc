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

/// What kind of JSON value it is, as an error message names it: `null`, a boolean, a number,
/// a string, an array or an object.
pub(crate) fn kind(v: &RawValue) -> &'static str {
    match v.get().trim_start().as_bytes().first() {
        Some(b'{') => "an object",
        Some(b'[') => "an array",
        Some(b'"') => "a string",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        _ => "a number",
    }
}

/// The value as a string, when it is one (borrowed unless it has escapes: serde's `Cow`
/// always copies, which was nine allocations of a decorated call).
pub(crate) fn as_str(v: &RawValue) -> Option<std::borrow::Cow<'_, str>> {
    let text = v.get().trim();
    // A raw value is valid JSON: between its quotes, with no escape, is the string itself.
    if let Some(inner) = text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
        if !inner.contains('\\') && !inner.contains('"') {
            return Some(std::borrow::Cow::Borrowed(inner));
        }
    }
    serde_json::from_str::<String>(text)
        .ok()
        .map(std::borrow::Cow::Owned)
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

/// The message serialised with the member `key` written from `value`, an object opened and
/// changed: the changed object goes straight into the message's bytes, never made into text
/// of its own and read back (a decorated result is several KB, and reading it back to check it
/// was a tenth of a decorated call's work). The member's old text should be gone already.
pub(crate) fn to_bytes_with(msg: &RawMap, key: &str, value: &RawMap) -> bytes::Bytes {
    struct With<'a>(&'a RawMap, &'a str, &'a RawMap);
    impl Serialize for With<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap;
            let mut m = s.serialize_map(Some(self.0.len()))?;
            for (k, v) in self.0 {
                if k == self.1 {
                    m.serialize_entry(k, self.2)?;
                } else {
                    m.serialize_entry(k, v)?;
                }
            }
            m.end()
        }
    }
    let mut out = Vec::with_capacity(size_of_unescaped(msg) + size_of_unescaped(value));
    match serde_json::to_writer(&mut out, &With(msg, key, value)) {
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

    /// A string value reads as serde_json reads it, borrowed when it has no escape; anything
    /// else is no string.
    #[test]
    fn a_string_value_reads_as_serde_reads_it_borrowed_when_it_can_be() {
        for (text, want, borrowed) in [
            (r#""complete""#, Some("complete"), true),
            (r#""""#, Some(""), true),
            (r#""é ☃""#, Some("é ☃"), true),
            (r#""a\"b""#, Some("a\"b"), false),
            (r#""\u0063omplete""#, Some("complete"), false),
            ("7", None, false),
            ("null", None, false),
            (r#"{"a":"b"}"#, None, false),
        ] {
            let raw = RawValue::from_string(text.to_owned()).unwrap();
            let got = as_str(&raw);
            assert_eq!(got.as_deref(), want, "{text}");
            let is_borrowed = matches!(got, Some(std::borrow::Cow::Borrowed(_)));
            assert_eq!(is_borrowed, borrowed, "{text}");
        }
    }

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

    #[test]
    fn a_member_written_from_its_opened_object_is_what_putting_it_back_would_give() {
        let text = r#"{"jsonrpc":"2.0","id":"\u0041","result":{"s":"\u00e9\n","n":1e400},"z":[1]}"#;
        let mut msg = parse_message(text.as_bytes()).unwrap();
        let mut result = open(&msg["result"]).unwrap();
        result.insert("added".into(), raw("a \"b\""));
        msg.insert("result".into(), null());
        let out = to_bytes_with(&msg, "result", &result);
        msg.insert("result".into(), raw_object(&result));
        assert_eq!(&out[..], &to_bytes(&msg)[..]);
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"jsonrpc":"2.0","id":"\u0041","result":{"s":"\u00e9\n","n":1e400,"added":"a \"b\""},"z":[1]}"#
        );
    }

    /// What writing a changed result straight into its message saves over making it text
    /// and reading that back: `cargo test --release --lib result_rewrite_costs -- --ignored
    /// --nocapture`.
    #[test]
    #[ignore = "a measurement, not a check"]
    fn result_rewrite_costs() {
        use std::hint::black_box;
        use std::time::Instant;
        const N: u32 = 100_000;
        let text =
            r#"an instruction of the kind a decoration carries, with \"quotes\" "#.repeat(40);
        let result = format!(
            r#"{{"content":[{{"type":"text","text":"3"}},{{"type":"text","text":"{text}"}}],"structuredContent":{{"sum":3}},"_agentFeedback":{{"instruction":"{text}"}}}}"#
        );
        let msg =
            parse_message(format!(r#"{{"jsonrpc":"2.0","id":1,"result":{result}}}"#).as_bytes())
                .unwrap();
        let opened = open(&msg["result"]).unwrap();
        for round in 1..=3 {
            let start = Instant::now();
            for _ in 0..N {
                let mut m = msg.clone();
                m.insert("result".into(), raw_object(black_box(&opened)));
                black_box(to_bytes(&m));
            }
            let before = start.elapsed().as_nanos() / u128::from(N);
            let start = Instant::now();
            for _ in 0..N {
                let mut m = msg.clone();
                m.insert("result".into(), null());
                black_box(to_bytes_with(&m, "result", black_box(&opened)));
            }
            let after = start.elapsed().as_nanos() / u128::from(N);
            println!("round {round}: {} bytes; back through text {before} ns, written in place {after} ns", result.len());
        }
    }
}
