//! A client message, read once and without copying: the id is kept as raw JSON so an error can
//! echo it exactly, `params` and its `_meta` are opened only for the keys the sidecar routes
//! on, and nothing else is materialised. A key the sidecar reads that appears twice is refused
//! (-32600, naming it): the upstream would take one of the two and the sidecar must never act
//! on the other.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::error::ProxyError;

/// The parts of one JSON-RPC message the front door reads.
#[derive(Debug, Deserialize)]
pub struct Envelope<'a> {
    #[serde(borrow, default)]
    pub id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub method: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "params")]
    pub params_raw: Option<&'a RawValue>,
    /// `params` opened (empty when absent or not an object).
    #[serde(skip)]
    pub params: Params<'a>,
    /// `params._meta` opened (empty when absent or not an object).
    #[serde(skip)]
    pub meta: Meta<'a>,
}

/// The keys of `params` the sidecar routes on, each left as raw JSON.
#[derive(Debug, Default, Deserialize)]
pub struct Params<'a> {
    #[serde(borrow, default, rename = "_meta")]
    pub meta: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub uri: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub arguments: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub cursor: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "protocolVersion")]
    pub protocol_version: Option<&'a RawValue>,
}

/// The 2026-07-28 envelope keys of `params._meta`.
#[derive(Debug, Default, Deserialize)]
pub struct Meta<'a> {
    #[serde(borrow, default, rename = "io.modelcontextprotocol/protocolVersion")]
    pub protocol_version: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "io.modelcontextprotocol/clientCapabilities")]
    pub client_capabilities: Option<&'a RawValue>,
}

impl Envelope<'_> {
    /// `params.name` as a string (the tool or prompt name), when it is one.
    pub fn name(&self) -> Option<Cow<'_, str>> {
        self.params.name.and_then(as_str)
    }

    /// Whether `params` is present and a JSON object.
    pub fn has_params_object(&self) -> bool {
        self.params_raw.is_some_and(is_object)
    }

    /// Whether `params._meta` is present and a JSON object.
    pub fn has_meta_object(&self) -> bool {
        self.params.meta.is_some_and(is_object)
    }
}

/// A raw value as a string, when it is one.
pub fn as_str(raw: &RawValue) -> Option<Cow<'_, str>> {
    serde_json::from_str::<Cow<'_, str>>(raw.get()).ok()
}

pub fn is_object(raw: &RawValue) -> bool {
    raw.get().trim_start().starts_with('{')
}

#[derive(Debug)]
pub enum Inbound<'a> {
    Single(Envelope<'a>),
    /// A JSON array (a 2025-03-26 batch); well-formed JSON, not inspected further.
    Batch,
}

/// A refused message, with its id when the id could still be read.
pub type Refusal<'a> = (ProxyError, Option<&'a RawValue>);

/// Parses a request body: malformed JSON is -32700; JSON that is not an object or array, or a
/// key the sidecar reads given twice, is -32600. The refusal carries the message's id when it
/// can be read unambiguously.
pub fn parse(body: &[u8]) -> Result<Inbound<'_>, Refusal<'_>> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace()).copied();
    match first {
        Some(b'{') => {
            let mut env = serde_json::from_slice::<Envelope<'_>>(body).map_err(|e| {
                if e.is_data() {
                    (ProxyError::InvalidRequest(e.to_string()), salvage_id(body))
                } else {
                    (ProxyError::Parse(e.to_string()), None)
                }
            })?;
            if let Some(p) = env.params_raw.filter(|p| is_object(p)) {
                env.params = open(p, "params").map_err(|e| (e, env.id))?;
            }
            if let Some(m) = env.params.meta.filter(|m| is_object(m)) {
                env.meta = open(m, "params._meta").map_err(|e| (e, env.id))?;
            }
            Ok(Inbound::Single(env))
        }
        Some(b'[') => serde_json::from_slice::<Vec<&RawValue>>(body)
            .map(|_| Inbound::Batch)
            .map_err(|e| (ProxyError::Parse(e.to_string()), None)),
        _ => match serde_json::from_slice::<&RawValue>(body) {
            Ok(_) => Err((
                ProxyError::InvalidRequest("a JSON-RPC message must be a JSON object".to_owned()),
                None,
            )),
            Err(e) => Err((ProxyError::Parse(e.to_string()), None)),
        },
    }
}

/// The id of a well-formed object refused for another key (a duplicated `method`, a `method`
/// that is not a string): readable when `id` itself appears once.
fn salvage_id(body: &[u8]) -> Option<&RawValue> {
    #[derive(Deserialize)]
    struct IdOnly<'a> {
        #[serde(borrow, default)]
        id: Option<&'a RawValue>,
    }
    serde_json::from_slice::<IdOnly<'_>>(body).ok()?.id
}

/// Opens an object already known to be well-formed JSON; the only error left is a duplicate
/// of a key the sidecar reads.
fn open<'a, T: Deserialize<'a>>(raw: &'a RawValue, what: &str) -> Result<T, ProxyError> {
    serde_json::from_str(raw.get()).map_err(|e| {
        let e = e.to_string();
        let detail = e.split(" at line").next().unwrap_or(&e);
        let detail = detail.replace("duplicate field", "duplicate key");
        ProxyError::InvalidRequest(format!("{detail} in {what}; each key may appear only once"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_id_and_method() {
        let body =
            br#"{"jsonrpc":"2.0","id":12345678901234567890,"method":"tools/list","params":{}}"#;
        let Inbound::Single(e) = parse(body).unwrap() else {
            panic!("not single")
        };
        assert_eq!(e.id.unwrap().get(), "12345678901234567890");
        assert_eq!(e.method.as_deref(), Some("tools/list"));
        let body = br#"{"jsonrpc":"2.0","id":"a\"b","method":"x\u0041"}"#;
        let Inbound::Single(e) = parse(body).unwrap() else {
            panic!("not single")
        };
        assert_eq!(e.id.unwrap().get(), r#""a\"b""#);
        assert_eq!(e.method.as_deref(), Some("xA"));
    }

    #[test]
    fn opens_params_and_meta() {
        let body = br#"{"id":1,"method":"tools/call","params":{"name":"ad\u0064","arguments":{"a":1,"a":2},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","x":1,"x":2}}}"#;
        let Inbound::Single(e) = parse(body).unwrap() else {
            panic!("not single")
        };
        assert_eq!(e.name().as_deref(), Some("add"));
        assert_eq!(e.params.arguments.unwrap().get(), r#"{"a":1,"a":2}"#);
        assert_eq!(e.meta.protocol_version.unwrap().get(), r#""2026-07-28""#);
        assert!(e.has_meta_object());
    }

    #[test]
    fn duplicate_routed_keys_are_refused_naming_the_key() {
        for (body, key) in [
            (
                r#"{"id":1,"method":"tools/call","params":{"name":"a","name":"b"}}"#,
                "`name` in params",
            ),
            (
                r#"{"id":1,"method":"tools/call","params":{"name":"a","arguments":{},"arguments":{}}}"#,
                "`arguments` in params",
            ),
            (
                r#"{"id":1,"method":"x","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"a","io.modelcontextprotocol/protocolVersion":"b"}}}"#,
                "`io.modelcontextprotocol/protocolVersion` in params._meta",
            ),
            (r#"{"id":1,"method":"a","method":"b"}"#, "`method`"),
        ] {
            let (e, id) = parse(body.as_bytes()).unwrap_err();
            assert_eq!(id.map(RawValue::get), Some("1"), "{body}");
            assert_eq!(e.code(), -32600, "{body}");
            assert!(e.to_string().contains(key), "{e}");
        }
    }

    #[test]
    fn classifies_bad_bodies() {
        assert!(matches!(
            parse(b"{\"id\":1,"),
            Err((ProxyError::Parse(_), None))
        ));
        assert!(matches!(parse(b""), Err((ProxyError::Parse(_), None))));
        assert!(matches!(
            parse(b"\xff\xfe"),
            Err((ProxyError::Parse(_), None))
        ));
        assert!(matches!(
            parse(b"42"),
            Err((ProxyError::InvalidRequest(_), None))
        ));
        assert!(matches!(parse(b"[1,2"), Err((ProxyError::Parse(_), None))));
        assert!(matches!(parse(b"[{}]"), Ok(Inbound::Batch)));
        let (e, id) = parse(br#"{"id":"x","method":7}"#).unwrap_err();
        assert!(matches!(e, ProxyError::InvalidRequest(_)));
        assert_eq!(id.map(RawValue::get), Some(r#""x""#));
    }
}
