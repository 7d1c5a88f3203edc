//! CORS for browser MCP clients (such as the MCP Inspector) on the origins the Origin policy
//! allows: their preflights are granted, and the answers to their requests carry
//! `Access-Control-Allow-Origin` so the page can read them. A preflight from any other origin
//! is refused (403), as its request would be. The 415 on a POST that is not
//! `application/json` is what makes every cross-origin POST need a preflight.

use http::header::{
    ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS, ACCESS_CONTROL_ALLOW_ORIGIN,
    ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE, ACCESS_CONTROL_REQUEST_HEADERS,
    ACCESS_CONTROL_REQUEST_METHOD, ORIGIN, VARY,
};
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode};

use crate::body::{self, Body};
use crate::config::Config;

/// The methods a browser client may use: POST, and GET and DELETE (a 2025-era client's
/// stream and session end), which get their 405 readable instead of a network error.
const METHODS: &str = "POST, GET, DELETE";

/// The request headers an MCP client sends, in both eras; a preflight's other requested
/// headers are granted too (the origin is one the operator allows).
const HEADERS: &str = "accept, authorization, content-type, last-event-id, mcp-method, mcp-name, mcp-protocol-version, mcp-session-id";

/// The answer headers a browser client must be able to read.
const EXPOSED: &str = "mcp-session-id, mcp-protocol-version, www-authenticate, retry-after";

/// How long a browser may keep a granted preflight (Chromium keeps at most 2 hours).
const MAX_AGE: &str = "7200";

/// Whether this is a CORS preflight: `OPTIONS` with `Origin` and
/// `Access-Control-Request-Method`.
pub(crate) fn is_preflight(parts: &Parts) -> bool {
    parts.method == Method::OPTIONS
        && parts.headers.contains_key(ORIGIN)
        && parts.headers.contains_key(ACCESS_CONTROL_REQUEST_METHOD)
}

/// The answer to a preflight: 204 with the grants for an allowed origin, 403 with a JSON-RPC
/// error otherwise (Host and Origin are checked as for the request itself).
pub(crate) fn preflight(config: &Config, parts: &Parts) -> Response<Body> {
    if let Err(e) = super::check_host_and_origin(config, parts) {
        tracing::debug!(error = %e, "CORS preflight refused");
        return e.into_response(None);
    }
    let mut resp = body::answer(StatusCode::NO_CONTENT, None, body::empty());
    let h = resp.headers_mut();
    if let Some(origin) = parts.headers.get(ORIGIN) {
        h.insert(ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
    }
    h.insert(
        ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static(METHODS),
    );
    h.insert(
        ACCESS_CONTROL_ALLOW_HEADERS,
        allowed_headers(&parts.headers),
    );
    h.insert(ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static(MAX_AGE));
    h.insert(
        VARY,
        HeaderValue::from_static(
            "origin, access-control-request-method, access-control-request-headers",
        ),
    );
    resp
}

/// The MCP headers, and each other header the preflight asks for that is a valid name.
fn allowed_headers(request: &HeaderMap) -> HeaderValue {
    let mut list = HEADERS.to_owned();
    let asked = request
        .get_all(ACCESS_CONTROL_REQUEST_HEADERS)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .filter(|n| HeaderName::from_bytes(n.as_bytes()).is_ok());
    for name in asked {
        if !list.split(", ").any(|known| known == name) {
            list.push_str(", ");
            list.push_str(&name);
        }
    }
    HeaderValue::from_str(&list).unwrap_or_else(|_| HeaderValue::from_static(HEADERS))
}

/// The request's `Origin` when the policy allows it (the answer then carries the CORS
/// headers); `None` for a request without one or one refused.
pub(crate) fn allowed_origin(config: &Config, request: &HeaderMap) -> Option<HeaderValue> {
    let origin = request.get(ORIGIN)?;
    super::checks::check_origin(&config.allowed_origins, request)
        .is_ok()
        .then(|| origin.clone())
}

/// Lets the page that sent an allowed cross-origin request read its answer.
pub(crate) fn allow(origin: HeaderValue, response: &mut HeaderMap) {
    if response.contains_key(ACCESS_CONTROL_ALLOW_ORIGIN) {
        return; // a preflight's answer, already complete
    }
    response.insert(ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    response.insert(
        ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static(EXPOSED),
    );
    response.append(VARY, HeaderValue::from_static("origin"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requested_headers_are_added_once_and_only_valid_names() {
        let mut h = HeaderMap::new();
        h.insert(
            ACCESS_CONTROL_REQUEST_HEADERS,
            HeaderValue::from_static("Content-Type, X-Api-Key, bad name, mcp-name"),
        );
        let v = allowed_headers(&h);
        let v = v.to_str().unwrap();
        assert!(v.ends_with(", x-api-key"), "{v}");
        assert_eq!(v.matches("content-type").count(), 1, "{v}");
        assert!(!v.contains("bad"), "{v}");
    }
}
