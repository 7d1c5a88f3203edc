//! The MCP routing headers (`MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name`): reading them
//! strictly (a repeated header is an error) and the `=?base64?…?=` value encoding.

use std::borrow::Cow;

use base64::Engine;
use http::{HeaderMap, HeaderValue};

pub(crate) const PROTOCOL_VERSION: &str = "mcp-protocol-version";
pub(crate) const METHOD: &str = "mcp-method";
pub(crate) const NAME: &str = "mcp-name";
pub(crate) const SESSION_ID: &str = "mcp-session-id";

/// A routing header as the client sent it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum HeaderRead<'a> {
    Absent,
    One(Cow<'a, str>),
    /// Repeated, or not valid visible text: either way it cannot be compared with the body.
    Invalid(&'static str),
}

pub(crate) fn read<'a>(headers: &'a HeaderMap, name: &str) -> HeaderRead<'a> {
    let mut all = headers.get_all(name).iter();
    let Some(first) = all.next() else {
        return HeaderRead::Absent;
    };
    if all.next().is_some() {
        return HeaderRead::Invalid("appears more than once");
    }
    match decode(first) {
        Some(v) => HeaderRead::One(v),
        None => HeaderRead::Invalid("is not valid (bad characters or base64 encoding)"),
    }
}

/// Decodes a header value: plain visible ASCII (borrowed), or `=?base64?…?=` holding UTF-8.
pub(crate) fn decode(value: &HeaderValue) -> Option<Cow<'_, str>> {
    let s = value.to_str().ok()?;
    if let Some(inner) = s
        .strip_prefix("=?base64?")
        .and_then(|rest| rest.strip_suffix("?="))
    {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(inner)
            .ok()?;
        return String::from_utf8(bytes).ok().map(Cow::Owned);
    }
    if s.chars().any(|c| c.is_ascii_control()) {
        return None;
    }
    Some(Cow::Borrowed(s))
}

/// Encodes a value for a header: as is when it is safe plain ASCII, else `=?base64?…?=`.
pub(crate) fn encode(value: &str) -> Option<HeaderValue> {
    let plain_safe = !value.is_empty()
        && value.bytes().all(|b| (0x20..0x7f).contains(&b))
        && value.trim() == value
        && !(value.starts_with("=?") && value.ends_with("?="));
    if plain_safe {
        HeaderValue::from_str(value).ok()
    } else {
        let b64 = base64::engine::general_purpose::STANDARD.encode(value.as_bytes());
        HeaderValue::from_str(&format!("=?base64?{b64}?=")).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_plain_and_base64() {
        assert_eq!(
            decode(&HeaderValue::from_static("add")).as_deref(),
            Some("add")
        );
        // "héllo ✓"
        let enc = encode("héllo ✓").unwrap();
        assert!(enc.to_str().unwrap().starts_with("=?base64?"));
        assert_eq!(decode(&enc).as_deref(), Some("héllo ✓"));
        assert_eq!(decode(&HeaderValue::from_static("=?base64?!!?=")), None);
        // Leading space and sentinel look-alikes are encoded.
        assert!(encode(" x")
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("=?base64?"));
        assert_eq!(
            decode(&encode("=?base64?x?=").unwrap()).as_deref(),
            Some("=?base64?x?=")
        );
    }

    #[test]
    fn repeated_header_is_invalid() {
        let mut h = HeaderMap::new();
        h.append(METHOD, HeaderValue::from_static("tools/list"));
        assert_eq!(read(&h, METHOD), HeaderRead::One("tools/list".into()));
        h.append(METHOD, HeaderValue::from_static("tools/list"));
        assert!(matches!(read(&h, METHOD), HeaderRead::Invalid(_)));
        assert_eq!(read(&h, NAME), HeaderRead::Absent);
    }
}
