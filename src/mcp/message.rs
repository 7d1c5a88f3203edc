//! A client message, read once and without copying: the id is kept as raw JSON so an error can
//! echo it exactly, `params` and its `_meta` are opened only for the keys the sidecar routes
//! on, and nothing else is materialised. A key the sidecar reads that appears twice is refused
//! (-32600, naming it): the upstream would take one of the two and the sidecar must never act
//! on the other.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::raw::{as_str, is_object};
use crate::error::{Error, ErrorKind};

/// The parts of one JSON-RPC message the front door reads.
#[derive(Debug, Deserialize)]
pub(crate) struct RpcMessage<'a> {
    /// Present (even as `null`, which is refused) or absent (a notification).
    #[serde(borrow, default, deserialize_with = "present")]
    pub(crate) id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub(crate) method: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "params")]
    pub(crate) params_raw: Option<&'a RawValue>,
    /// `params` opened (empty when absent or not an object).
    #[serde(skip)]
    pub(crate) params: Params<'a>,
    /// `params._meta` opened (empty when absent or not an object).
    #[serde(skip)]
    pub(crate) meta: Meta<'a>,
}

/// A key that is present, whatever its value: `"id": null` is not an absent id.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// Whether a present id is one JSON-RPC allows a request to carry: a string or a number
/// (MCP also forbids `null`).
fn valid_id(id: &RawValue) -> bool {
    matches!(id.get().as_bytes().first(), Some(b'"' | b'-' | b'0'..=b'9'))
}

/// The keys of `params` the sidecar routes on, each left as raw JSON.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Params<'a> {
    #[serde(borrow, default, rename = "_meta")]
    pub(crate) meta: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub(crate) name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub(crate) uri: Option<&'a RawValue>,
    /// The tasks extension's task, which its requests name in `Mcp-Name`.
    #[serde(borrow, default, rename = "taskId")]
    pub(crate) task_id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub(crate) arguments: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "protocolVersion")]
    pub(crate) protocol_version: Option<&'a RawValue>,
    /// An MRTR retry's `requestState` (the sidecar's own continues a held call).
    #[serde(borrow, default, rename = "requestState", deserialize_with = "present")]
    pub(crate) request_state: Option<&'a RawValue>,
    /// An MRTR retry's answers, by the keys of the `inputRequests` they answer.
    #[serde(
        borrow,
        default,
        rename = "inputResponses",
        deserialize_with = "present"
    )]
    pub(crate) input_responses: Option<&'a RawValue>,
}

/// The 2026-07-28 envelope keys of `params._meta`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Meta<'a> {
    #[serde(borrow, default, rename = "io.modelcontextprotocol/protocolVersion")]
    pub(crate) protocol_version: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "io.modelcontextprotocol/clientCapabilities")]
    pub(crate) client_capabilities: Option<&'a RawValue>,
}

impl RpcMessage<'_> {
    /// `params.name` as a string (the tool or prompt name), when it is one.
    pub(crate) fn name(&self) -> Option<Cow<'_, str>> {
        self.params.name.and_then(as_str)
    }

    /// Whether `params` is present and a JSON object.
    pub(crate) fn has_params_object(&self) -> bool {
        self.params_raw.is_some_and(is_object)
    }

    /// Whether `params._meta` is present and a JSON object.
    pub(crate) fn has_meta_object(&self) -> bool {
        self.params.meta.is_some_and(is_object)
    }
}

/// (The single message is most of them and lives on the stack for one request: boxing it
/// to make the rare batch no smaller would cost an allocation on every request.)
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Inbound<'a> {
    Single(RpcMessage<'a>),
    /// A JSON array (a 2025-03-26 batch); well-formed JSON, not inspected further.
    Batch,
}

/// A refused message, with its id when the id could still be read.
pub(crate) type Refusal<'a> = (Error, Option<&'a RawValue>);

/// Parses a request body: malformed JSON is -32700; JSON that is not an object or array, an
/// `id` that is not a string or a number, or a key the sidecar reads given twice, is -32600. The refusal carries the message's id when it
/// can be read unambiguously.
pub(crate) fn parse(body: &[u8]) -> Result<Inbound<'_>, Refusal<'_>> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace()).copied();
    match first {
        Some(b'{') => {
            let mut rpc = serde_json::from_slice::<RpcMessage<'_>>(body).map_err(|e| {
                if e.is_data() {
                    (
                        Error::caused_by(ErrorKind::InvalidRequest, "", e),
                        salvage_id(body),
                    )
                } else {
                    (Error::caused_by(ErrorKind::Parse, "", e), None)
                }
            })?;
            if rpc.id.is_some_and(|id| !valid_id(id)) {
                return Err((
                    Error::new(
                        ErrorKind::InvalidRequest,
                        "`id` must be a string or a number (not null, an object, an array or a boolean)",
                    ),
                    None,
                ));
            }
            if let Some(p) = rpc.params_raw.filter(|p| is_object(p)) {
                rpc.params = open(p, "params").map_err(|e| (e, rpc.id))?;
            }
            if let Some(m) = rpc.params.meta.filter(|m| is_object(m)) {
                rpc.meta = open(m, "params._meta").map_err(|e| (e, rpc.id))?;
            }
            Ok(Inbound::Single(rpc))
        }
        Some(b'[') => serde_json::from_slice::<Vec<&RawValue>>(body)
            .map(|_| Inbound::Batch)
            .map_err(|e| (Error::caused_by(ErrorKind::Parse, "", e), None)),
        _ => match serde_json::from_slice::<&RawValue>(body) {
            Ok(_) => Err((
                Error::new(
                    ErrorKind::InvalidRequest,
                    "a JSON-RPC message must be a JSON object".to_owned(),
                ),
                None,
            )),
            Err(e) => Err((Error::caused_by(ErrorKind::Parse, "", e), None)),
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
fn open<'a, T: Deserialize<'a>>(raw: &'a RawValue, what: &str) -> Result<T, Error> {
    serde_json::from_str(raw.get()).map_err(|e| {
        let e = e.to_string();
        let detail = e.split(" at line").next().unwrap_or(&e);
        let detail = detail.replace("duplicate field", "duplicate key");
        Error::new(
            ErrorKind::InvalidRequest,
            format!("{detail} in {what}; each key may appear only once"),
        )
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
        fn code(body: &[u8]) -> Refusal<'_> {
            parse(body).map(|_| 0).unwrap_err()
        }
        for bad in [&b"{\"id\":1,"[..], b"", b"\xff\xfe", b"[1,2"] {
            let (e, id) = code(bad);
            assert_eq!((e.code(), id.is_none()), (-32700, true));
        }
        let (e, id) = code(b"42");
        assert_eq!((e.code(), id.is_none()), (-32600, true));
        assert!(matches!(parse(b"[{}]"), Ok(Inbound::Batch)));
        let (e, id) = code(br#"{"id":"x","method":7}"#);
        assert_eq!(e.code(), -32600);
        assert_eq!(id.map(RawValue::get), Some(r#""x""#));
        for bad in ["null", "{}", "[1]", "true", "false"] {
            let body = format!(r#"{{"jsonrpc":"2.0","id":{bad},"method":"tools/list"}}"#);
            let (e, id) = code(body.as_bytes());
            assert_eq!((e.code(), id.is_none()), (-32600, true), "{bad}");
        }
        for ok in [r#""a""#, "0", "-1", "1.5", "12345678901234567890"] {
            let body = format!(r#"{{"jsonrpc":"2.0","id":{ok},"method":"tools/list"}}"#);
            assert!(parse(body.as_bytes()).is_ok(), "{ok}");
        }
    }
}
