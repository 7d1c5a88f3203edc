//! PLACEHOLDER: replaced at merge by branch w5-place
//!
//! Where the envelope goes in an HTTP response (spec §2): spliced into a JSON object, injected
//! into an HTML page, or carried by the `Agent-Feedback` header with the discovery `Link`.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

/// What a JSON body is, for placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JsonBody {
    Object,
    OwnsFeedback,
    /// An array, a scalar, null, or invalid JSON.
    Other,
}

pub(crate) fn json_body(body: &[u8]) -> JsonBody {
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Object(o)) if o.contains_key("_agentFeedback") => {
            JsonBody::OwnsFeedback
        }
        Ok(serde_json::Value::Object(_)) => JsonBody::Object,
        _ => JsonBody::Other,
    }
}

/// `body` with `,"_agentFeedback":<envelope>` spliced before the object's closing brace
/// (`{}` gets no comma); every byte before it untouched. None unless `json_body` is Object.
pub(crate) fn splice_json(body: &[u8], envelope: &str) -> Option<Vec<u8>> {
    if json_body(body) != JsonBody::Object {
        return None;
    }
    let close = body.iter().rposition(|b| *b == b'}')?;
    let open = body.iter().position(|b| *b == b'{')?;
    let empty = body[open + 1..close].iter().all(u8::is_ascii_whitespace);
    let mut out = Vec::with_capacity(body.len() + envelope.len() + 20);
    out.extend_from_slice(&body[..close]);
    if !empty {
        out.push(b',');
    }
    out.extend_from_slice(b"\"_agentFeedback\":");
    out.extend_from_slice(envelope.as_bytes());
    out.extend_from_slice(&body[close..]);
    Some(out)
}

/// Whether the page already has `<script … id="agent-feedback" …>`.
pub(crate) fn has_html_marker(html: &[u8]) -> bool {
    let lower = String::from_utf8_lossy(html).to_ascii_lowercase();
    lower.contains("id=\"agent-feedback\"") || lower.contains("id='agent-feedback'")
}

/// The page with the script tag inserted before `</head>` (case-insensitively), else appended.
pub(crate) fn inject_html(html: &[u8], envelope: &str) -> Vec<u8> {
    let escaped = envelope
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026");
    let tag = format!("<script id=\"agent-feedback\" type=\"application/json\">{escaped}</script>");
    let lower = html.to_ascii_lowercase();
    let at = lower
        .windows(7)
        .position(|w| w == b"</head>")
        .unwrap_or(html.len());
    let mut out = Vec::with_capacity(html.len() + tag.len());
    out.extend_from_slice(&html[..at]);
    out.extend_from_slice(tag.as_bytes());
    out.extend_from_slice(&html[at..]);
    out
}

/// `Agent-Feedback` header value: base64url without padding of `envelope`.
pub(crate) fn header_value(envelope: &str) -> String {
    URL_SAFE_NO_PAD.encode(envelope)
}

/// `Link` value to the discovery document (endpoint's trailing `/` stripped).
pub(crate) fn discovery_link(endpoint: &str) -> String {
    format!(
        "<{}/.well-known/agent-feedback-v1.json>; rel=\"agent-feedback\"; type=\"application/json\"",
        endpoint.trim_end_matches('/')
    )
}
