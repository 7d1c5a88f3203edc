//! A client message, read without copying: the id is kept as raw JSON so an error can echo it
//! exactly, and nothing the sidecar does not inspect is materialised.

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
    #[serde(borrow, default)]
    pub params: Option<&'a RawValue>,
}

#[derive(Debug)]
pub enum Inbound<'a> {
    Single(Envelope<'a>),
    /// A JSON array (a 2025-03-26 batch); well-formed JSON, not inspected further.
    Batch,
}

/// Parses a request body: malformed JSON is -32700; JSON that is not an object or array is
/// -32600.
pub fn parse(body: &[u8]) -> Result<Inbound<'_>, ProxyError> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace()).copied();
    match first {
        Some(b'{') => serde_json::from_slice::<Envelope<'_>>(body)
            .map(Inbound::Single)
            .map_err(|e| {
                if e.is_data() {
                    ProxyError::InvalidRequest(e.to_string())
                } else {
                    ProxyError::Parse(e.to_string())
                }
            }),
        Some(b'[') => serde_json::from_slice::<Vec<&RawValue>>(body)
            .map(|_| Inbound::Batch)
            .map_err(|e| ProxyError::Parse(e.to_string())),
        _ => match serde_json::from_slice::<&RawValue>(body) {
            Ok(_) => Err(ProxyError::InvalidRequest(
                "a JSON-RPC message must be a JSON object".to_owned(),
            )),
            Err(e) => Err(ProxyError::Parse(e.to_string())),
        },
    }
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
    fn classifies_bad_bodies() {
        assert!(matches!(parse(b"{\"id\":1,"), Err(ProxyError::Parse(_))));
        assert!(matches!(parse(b""), Err(ProxyError::Parse(_))));
        assert!(matches!(parse(b"\xff\xfe"), Err(ProxyError::Parse(_))));
        assert!(matches!(parse(b"42"), Err(ProxyError::InvalidRequest(_))));
        assert!(matches!(parse(b"[1,2"), Err(ProxyError::Parse(_))));
        assert!(matches!(parse(b"[{}]"), Ok(Inbound::Batch)));
        assert!(matches!(
            parse(br#"{"method":7}"#),
            Err(ProxyError::InvalidRequest(_))
        ));
    }
}
