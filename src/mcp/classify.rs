//! Which era a client request belongs to, and the 2026-07-28 validation ladder: the `_meta`
//! envelope (-32602), the routing headers against the body (-32020), then the version (-32022).
//! All of it is answered by the sidecar before anything goes upstream.

use std::borrow::Cow;

use http::HeaderMap;
use serde_json::value::RawValue;

use super::headers::{self, HeaderRead};
use super::message::{self, Envelope};
use super::version::{self, META_CLIENT_CAPABILITIES, META_PROTOCOL_VERSION};
use crate::error::ProxyError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientEra {
    /// A 2026-07-28 request that passed the ladder.
    Modern { version: String },
    /// The 2025-era handshake path; `version` is the `MCP-Protocol-Version` header, if any.
    Legacy { version: Option<String> },
}

impl ClientEra {
    pub fn is_modern(&self) -> bool {
        matches!(self, ClientEra::Modern { .. })
    }
}

fn is_object(raw: &RawValue) -> bool {
    message::is_object(raw)
}

/// The name a routing header must mirror, for the methods that have one.
fn routed_name_key(method: &str) -> Option<&'static str> {
    match method {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        _ => None,
    }
}

/// Classifies a request or notification and, for a modern one, runs the validation ladder.
pub fn classify(headers: &HeaderMap, env: &Envelope<'_>) -> Result<ClientEra, ProxyError> {
    let method = env.method.as_deref().unwrap_or_default();
    let header_version = headers::read(headers, headers::PROTOCOL_VERSION);

    let params = env.has_params_object().then_some(&env.params);
    let meta = env.has_meta_object().then_some(&env.meta);
    let claims_modern = meta.is_some_and(|m| m.protocol_version.is_some());
    let header_modern = match &header_version {
        HeaderRead::One(v) => !version::is_legacy(v),
        HeaderRead::Invalid(_) => true,
        HeaderRead::Absent => false,
    };

    if method == "initialize" && !claims_modern {
        if let HeaderRead::One(v) = &header_version {
            if header_modern {
                return Err(ProxyError::HeaderMismatch(format!(
                    "Header mismatch: MCP-Protocol-Version header value '{v}' is a 2026-era version, but initialize is the 2025-era handshake"
                )));
            }
        }
    }
    if !claims_modern && !header_modern {
        return Ok(ClientEra::Legacy {
            version: match header_version {
                HeaderRead::One(v) => Some(v),
                _ => None,
            },
        });
    }
    let is_notification = env.id.is_none();

    // 1. The envelope.
    let envelope_version = match (&params, &meta) {
        (None, _) if !is_notification => {
            return Err(ProxyError::InvalidParams(
                "Invalid params: a 2026-07-28 request must carry params._meta with io.modelcontextprotocol/protocolVersion and io.modelcontextprotocol/clientCapabilities".to_owned(),
            ))
        }
        (Some(p), None) if !is_notification => {
            let what = if p.meta.is_some() { "must be an object" } else { "is missing" };
            return Err(ProxyError::InvalidParams(format!(
                "Invalid params: params._meta {what}; a 2026-07-28 request must carry io.modelcontextprotocol/protocolVersion and io.modelcontextprotocol/clientCapabilities in it"
            )));
        }
        (_, Some(m)) => {
            let mut missing = Vec::new();
            let version = m.protocol_version.and_then(message::as_str);
            if version.is_none() {
                missing.push(META_PROTOCOL_VERSION);
            }
            if !m.client_capabilities.is_some_and(is_object) {
                missing.push(META_CLIENT_CAPABILITIES);
            }
            if !missing.is_empty() && !is_notification {
                return Err(ProxyError::InvalidParams(format!(
                    "Invalid params: params._meta is missing the required envelope key(s) (or they have the wrong type): {}",
                    missing.join(", ")
                )));
            }
            version.map(Cow::into_owned)
        }
        _ => None,
    };

    // 2. The routing headers against the body.
    let version = match (&header_version, envelope_version) {
        (HeaderRead::Invalid(why), _) => {
            return Err(ProxyError::HeaderMismatch(format!(
                "Header mismatch: MCP-Protocol-Version header {why}"
            )))
        }
        (HeaderRead::Absent, _) => {
            return Err(ProxyError::HeaderMismatch(
                "Header mismatch: the required MCP-Protocol-Version header is absent; it must equal params._meta[\"io.modelcontextprotocol/protocolVersion\"]".to_owned(),
            ))
        }
        (HeaderRead::One(h), Some(b)) if *h != b => {
            return Err(ProxyError::HeaderMismatch(format!(
                "Header mismatch: MCP-Protocol-Version header value '{h}' does not match body value '{b}'"
            )))
        }
        (HeaderRead::One(h), _) => h.clone(),
    };
    if !is_notification {
        check_header(headers, headers::METHOD, "Mcp-Method", method)?;
        if let Some(key) = routed_name_key(method) {
            let raw = params
                .as_ref()
                .and_then(|p| if key == "name" { p.name } else { p.uri });
            let body_value = raw
                .and_then(message::as_str)
                .map(Cow::into_owned)
                .unwrap_or_default();
            check_header(headers, headers::NAME, "Mcp-Name", &body_value)?;
        }
    }

    // 3. The version.
    if !version::is_modern_supported(&version) {
        return Err(ProxyError::UnsupportedVersion { requested: version });
    }
    Ok(ClientEra::Modern { version })
}

fn check_header(
    headers: &HeaderMap,
    name: &str,
    display: &str,
    body_value: &str,
) -> Result<(), ProxyError> {
    match headers::read(headers, name) {
        HeaderRead::One(v) if v == body_value => Ok(()),
        HeaderRead::One(v) => Err(ProxyError::HeaderMismatch(format!(
            "Header mismatch: {display} header value '{v}' does not match body value '{body_value}'"
        ))),
        HeaderRead::Absent => Err(ProxyError::HeaderMismatch(format!(
            "Header mismatch: the required {display} header is absent; it must be '{body_value}'"
        ))),
        HeaderRead::Invalid(why) => Err(ProxyError::HeaderMismatch(format!(
            "Header mismatch: {display} header {why}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::message::{parse, Inbound};
    use http::HeaderValue;

    fn run(headers: &[(&str, &str)], body: &str) -> Result<ClientEra, ProxyError> {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        let Inbound::Single(env) = parse(body.as_bytes()).unwrap() else {
            panic!()
        };
        classify(&h, &env)
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

    fn code(r: Result<ClientEra, ProxyError>) -> i64 {
        r.unwrap_err().code()
    }

    #[test]
    fn modern_request_passes() {
        assert!(run(&OK_HEADERS, &call("add")).unwrap().is_modern());
    }

    #[test]
    fn legacy_requests() {
        let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}"#;
        assert_eq!(run(&[], init).unwrap(), ClientEra::Legacy { version: None });
        let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
        assert_eq!(
            run(&[("mcp-protocol-version", "2025-06-18")], list).unwrap(),
            ClientEra::Legacy {
                version: Some("2025-06-18".into())
            }
        );
        assert_eq!(
            code(run(&[("mcp-protocol-version", "2026-07-28")], init)),
            -32020
        );
    }

    #[test]
    fn ladder_errors() {
        // Envelope missing under a modern header.
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
        // Envelope without the version header.
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
        assert!(run(&headers, &call(name)).unwrap().is_modern());
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
