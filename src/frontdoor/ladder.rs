//! Which [`Era`] a client request belongs to, and the 2026-07-28 validation ladder: the `_meta`
//! envelope (-32602), the routing headers against the body (-32020), then the version (-32022).
//! All of it is answered by the sidecar before anything goes upstream.

use std::borrow::Cow;

use http::HeaderMap;

use super::checks::truncate;
use crate::error::{Error, ErrorKind};
use crate::mcp::era::Era;
use crate::mcp::headers::{self, HeaderRead};
use crate::mcp::message::RpcMessage;
use crate::mcp::method::{Method, NameParam};
use crate::mcp::raw;
use crate::mcp::version::{self, META_CLIENT_CAPABILITIES, META_PROTOCOL_VERSION};

/// Classifies a request or notification and, for a modern one, runs the validation ladder.
/// `listed` is the message's catalogue entry.
pub(crate) fn classify(
    headers: &HeaderMap,
    rpc: &RpcMessage<'_>,
    listed: Option<Method>,
) -> Result<Era, Error> {
    let method = rpc.method.as_deref().unwrap_or_default();
    let header_version = headers::read(headers, headers::PROTOCOL_VERSION);
    let claims_modern = rpc.has_meta_object() && rpc.meta.protocol_version.is_some();
    let header_modern = match &header_version {
        HeaderRead::One(v) => !version::is_legacy(v),
        HeaderRead::Invalid(_) => true,
        HeaderRead::Absent => false,
    };
    if listed == Some(Method::Initialize) && !claims_modern && header_modern {
        if let HeaderRead::One(v) = &header_version {
            return Err(mismatch(format!(
                "MCP-Protocol-Version header value '{}' is a 2026-era version, but initialize is the 2025-era handshake",
                truncate(v)
            )));
        }
    }
    if !claims_modern && !header_modern {
        return Ok(Era::Legacy);
    }
    let is_notification = rpc.id.is_none();
    // 1. The envelope; 2. the routing headers against the body; 3. the version.
    let envelope_version = check_envelope(rpc, is_notification)?;
    let version = check_version_header(header_version, envelope_version)?;
    if !is_notification {
        check_header(headers, headers::METHOD, "Mcp-Method", method)?;
        if let Some(param) = listed.and_then(|m| m.entry().name) {
            let raw = match param {
                NameParam::Name => rpc.params.name,
                NameParam::Uri => rpc.params.uri,
                NameParam::TaskId => rpc.params.task_id,
            };
            let body_value = raw
                .and_then(raw::as_str)
                .map(Cow::into_owned)
                .unwrap_or_default();
            check_header(headers, headers::NAME, "Mcp-Name", &body_value)?;
        }
    }
    if !version::is_modern_supported(&version) {
        return Err(Error::new(
            ErrorKind::UnsupportedVersion {
                requested: truncate(&version),
                supported: &version::MODERN_VERSIONS,
            },
            "",
        ));
    }
    if listed.is_some_and(|m| m.entry().input_required) {
        check_retry_fields(rpc)?;
    }
    Ok(Era::Modern)
}

/// A retry's `requestState` and `inputResponses` as the 2026 schema types them: a string, and
/// an object whose every value is an object (the client's result for the question under that
/// key). Anything else is -32602 before it goes anywhere (a 2025 upstream's held call would
/// otherwise read `null` as no answers and ask again).
fn check_retry_fields(rpc: &RpcMessage<'_>) -> Result<(), Error> {
    if let Some(state) = rpc.params.request_state {
        if raw::as_str(state).is_none() {
            return Err(invalid_params(format!(
                "params.requestState must be a string (the one the input_required result gave, echoed exactly), not {}",
                raw::kind(state)
            )));
        }
    }
    let Some(responses) = rpc.params.input_responses else {
        return Ok(());
    };
    let Some(map) = raw::open(responses) else {
        return Err(invalid_params(format!(
            "params.inputResponses must be an object mapping each inputRequests key to the client's result for it, not {}",
            raw::kind(responses)
        )));
    };
    if let Some((key, value)) = map.iter().find(|(_, v)| !raw::is_object(v)) {
        return Err(invalid_params(format!(
            "params.inputResponses.{} must be an object (the result of the request asked under that key: an ElicitResult, CreateMessageResult or ListRootsResult), not {}",
            truncate(key),
            raw::kind(value)
        )));
    }
    Ok(())
}

const ENVELOPE_KEYS: &str =
    "io.modelcontextprotocol/protocolVersion and io.modelcontextprotocol/clientCapabilities";

fn invalid_params(detail: String) -> Error {
    Error::new(
        ErrorKind::InvalidParams,
        format!("Invalid params: {detail}"),
    )
}

fn mismatch(detail: String) -> Error {
    Error::new(
        ErrorKind::HeaderMismatch,
        format!("Header mismatch: {detail}"),
    )
}

/// The `_meta` envelope of a 2026 request (-32602 when it is incomplete; a notification is
/// not held to it). Returns the version it names.
fn check_envelope(rpc: &RpcMessage<'_>, is_notification: bool) -> Result<Option<String>, Error> {
    if !rpc.has_params_object() {
        if is_notification {
            return Ok(None);
        }
        return Err(invalid_params(format!(
            "a 2026-07-28 request must carry params._meta with {ENVELOPE_KEYS}"
        )));
    }
    if !rpc.has_meta_object() {
        if is_notification {
            return Ok(None);
        }
        let what = if rpc.params.meta.is_some() {
            "must be an object"
        } else {
            "is missing"
        };
        return Err(invalid_params(format!(
            "params._meta {what}; a 2026-07-28 request must carry {ENVELOPE_KEYS} in it"
        )));
    }
    let m = &rpc.meta;
    let version = m.protocol_version.and_then(raw::as_str);
    let mut missing = Vec::new();
    if version.is_none() {
        missing.push(META_PROTOCOL_VERSION);
    }
    if !m.client_capabilities.is_some_and(raw::is_object) {
        missing.push(META_CLIENT_CAPABILITIES);
    }
    if !missing.is_empty() && !is_notification {
        return Err(invalid_params(format!(
            "params._meta is missing the required envelope key(s) (or they have the wrong type): {}",
            missing.join(", ")
        )));
    }
    Ok(version.map(Cow::into_owned))
}

/// The `MCP-Protocol-Version` header against the envelope's version (-32020); returns the
/// version the request names.
fn check_version_header(header: HeaderRead<'_>, body: Option<String>) -> Result<String, Error> {
    match (header, body) {
        (HeaderRead::Invalid(why), _) => Err(mismatch(format!(
            "MCP-Protocol-Version header {why}"
        ))),
        (HeaderRead::Absent, _) => Err(mismatch(
            "the required MCP-Protocol-Version header is absent; it must equal params._meta[\"io.modelcontextprotocol/protocolVersion\"]".to_owned(),
        )),
        (HeaderRead::One(h), Some(b)) if h != b => Err(mismatch(format!(
            "MCP-Protocol-Version header value '{}' does not match body value '{}'",
            truncate(&h),
            truncate(&b)
        ))),
        (HeaderRead::One(h), _) => Ok(h.into_owned()),
    }
}

fn check_header(
    headers: &HeaderMap,
    name: &str,
    display: &str,
    body_value: &str,
) -> Result<(), Error> {
    match headers::read(headers, name) {
        HeaderRead::One(v) if v == body_value => Ok(()),
        HeaderRead::One(v) => Err(mismatch(format!(
            "{display} header value '{}' does not match body value '{}'",
            truncate(&v),
            truncate(body_value)
        ))),
        HeaderRead::Absent => Err(mismatch(format!(
            "the required {display} header is absent; it must be '{}'",
            truncate(body_value)
        ))),
        HeaderRead::Invalid(why) => Err(mismatch(format!("{display} header {why}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::message::{parse, Inbound};
    use http::HeaderValue;

    fn run(headers: &[(&str, &str)], body: &str) -> Result<Era, Error> {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        let Inbound::Single(rpc) = parse(body.as_bytes()).unwrap() else {
            panic!()
        };
        let listed = rpc.method.as_deref().and_then(Method::from_wire);
        classify(&h, &rpc, listed)
    }

    const META: &str = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;

    fn call(name: &str) -> String {
        format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"{name}",{META}}}}}"#
        )
    }

    const OK_HEADERS: [(&str, &str); 3] = [
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "add"),
    ];

    fn code(r: Result<Era, Error>) -> i64 {
        r.unwrap_err().code()
    }

    #[test]
    fn modern_request_passes() {
        assert_eq!(run(&OK_HEADERS, &call("add")).unwrap(), Era::Modern);
    }

    #[test]
    fn a_retrys_state_and_answers_are_typed_as_the_schema_types_them() {
        let retry = |extra: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"add",{extra},{META}}}}}"#
            )
        };
        let ok = retry(r#""inputResponses":{"q1":{"action":"accept"}},"requestState":"s""#);
        assert_eq!(run(&OK_HEADERS, &ok).unwrap(), Era::Modern);
        for (extra, says) in [
            (
                r#""inputResponses":null"#,
                "inputResponses must be an object",
            ),
            (r#""inputResponses":42"#, "not a number"),
            (r#""inputResponses":"x""#, "not a string"),
            (r#""inputResponses":[{}]"#, "not an array"),
            (
                r#""inputResponses":{"q1":null}"#,
                "inputResponses.q1 must be an object",
            ),
            (
                r#""inputResponses":{"q1":{},"q2":true}"#,
                "q2 must be an object",
            ),
            (r#""requestState":7"#, "requestState must be a string"),
            (r#""requestState":null"#, "not null"),
            (r#""requestState":{"a":1}"#, "not an object"),
        ] {
            let e = run(&OK_HEADERS, &retry(extra)).unwrap_err();
            assert_eq!(e.code(), -32602, "{extra}");
            assert!(e.to_string().contains(says), "{extra}: {e}");
        }
        // Given twice, it is refused as any routed key is.
        let twice = retry(r#""inputResponses":{},"inputResponses":{}"#);
        let Err((e, _)) = parse(twice.as_bytes()) else {
            panic!("a duplicated inputResponses")
        };
        assert_eq!(e.code(), -32600);
        // A method that never asks is not held to them.
        let list = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{{"inputResponses":null,{META}}}}}"#
        );
        let h = [
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/list"),
        ];
        assert_eq!(run(&h, &list).unwrap(), Era::Modern);
    }

    #[test]
    fn legacy_requests() {
        let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}"#;
        assert_eq!(run(&[], init).unwrap(), Era::Legacy);
        let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
        assert_eq!(
            run(&[("mcp-protocol-version", "2025-06-18")], list).unwrap(),
            Era::Legacy
        );
        assert_eq!(
            code(run(&[("mcp-protocol-version", "2026-07-28")], init)),
            -32020
        );
    }

    #[test]
    fn ladder_errors() {
        // The `_meta` envelope missing under a modern header.
        let bare = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#;
        assert_eq!(
            code(run(
                &[
                    ("mcp-protocol-version", "2026-07-28"),
                    ("mcp-method", "tools/list")
                ],
                bare
            )),
            -32602
        );
        let no_caps = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
        let e = run(
            &[
                ("mcp-protocol-version", "2026-07-28"),
                ("mcp-method", "tools/list"),
            ],
            no_caps,
        )
        .unwrap_err();
        assert_eq!(e.code(), -32602);
        assert!(e.to_string().contains("clientCapabilities"), "{e}");
        // A `_meta` envelope without the version header.
        assert_eq!(
            code(run(
                &[("mcp-method", "tools/call"), ("mcp-name", "add")],
                &call("add")
            )),
            -32020
        );
        // Mismatches name the header and both values.
        let e = run(
            &[OK_HEADERS[0], OK_HEADERS[1], ("mcp-name", "sub")],
            &call("add"),
        )
        .unwrap_err();
        assert_eq!(e.code(), -32020);
        let msg = e.to_string();
        assert!(
            msg.contains("Mcp-Name") && msg.contains("'sub'") && msg.contains("'add'"),
            "{msg}"
        );
        let e = run(
            &[OK_HEADERS[0], ("mcp-method", "tools/list"), OK_HEADERS[2]],
            &call("add"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("Mcp-Method"), "{e}");
        assert_eq!(
            code(run(&[OK_HEADERS[0], OK_HEADERS[1]], &call("add"))),
            -32020
        );
        // Duplicates.
        assert_eq!(
            code(run(
                &[OK_HEADERS[0], OK_HEADERS[1], OK_HEADERS[1], OK_HEADERS[2]],
                &call("add")
            )),
            -32020
        );
        // Version header differs from the body.
        assert_eq!(
            code(run(
                &[
                    ("mcp-protocol-version", "2099-01-01"),
                    OK_HEADERS[1],
                    OK_HEADERS[2]
                ],
                &call("add")
            )),
            -32020
        );
    }

    #[test]
    fn base64_name_is_decoded() {
        let name = "héllo";
        let enc = crate::mcp::headers::encode(name).unwrap();
        let headers = [
            OK_HEADERS[0],
            OK_HEADERS[1],
            ("mcp-name", enc.to_str().unwrap()),
        ];
        assert_eq!(run(&headers, &call(name)).unwrap(), Era::Modern);
    }

    #[test]
    fn unsupported_version() {
        let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2099-01-01","io.modelcontextprotocol/clientCapabilities":{}}}}"#;
        let e = run(
            &[
                ("mcp-protocol-version", "2099-01-01"),
                ("mcp-method", "tools/list"),
            ],
            body,
        )
        .unwrap_err();
        assert_eq!(e.code(), -32022);
        assert_eq!(e.status(), 400);
    }
}
