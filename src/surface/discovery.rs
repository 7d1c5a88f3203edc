//! Epode's HTTP `cacheMode: "request"` (protocol v1, "HTTP response contract"; the Node SDK's
//! `requestDiscoveryLink` and its Express and Fastify adapters): a response is instrumented
//! only for a request that carries `Agent-Feedback-Request: 1`; an otherwise eligible ordinary
//! 2xx `GET` or `HEAD` response advertises that opt-in, for the exact resource, with
//! `Link: </path?query>; rel="agent-feedback"; request-header="Agent-Feedback-Request: 1"`;
//! and every response of an instrumented path varies on the request header, so a cache keeps
//! the two variants apart.
//!
//! The link's target is the request's own, origin-relative, serialised as a WHATWG URL's
//! `pathname` and `search` are (percent-encoding, dot segments resolved, an empty `?`
//! dropped), as the Node SDK's `new URL(target, base)` does; never one assembled from `Host`
//! or a forwarded host. A target that would leave the origin gets no link.

use http::header::{HeaderName, LINK, VARY};
use http::{HeaderMap, HeaderValue, Method, StatusCode};

use super::rules;

/// The request header that asks for an instrumented response.
pub(super) const REQUEST_HEADER: HeaderName = HeaderName::from_static("agent-feedback-request");

/// The link's parameters, as the Node SDK's `REQUEST_DISCOVERY_PARAMETER` writes them.
const PARAMETERS: &str = r#"rel="agent-feedback"; request-header="Agent-Feedback-Request: 1""#;

/// Where a target is resolved against (the Node SDK's base): only its origin matters.
const BASE: &str = "http://agent-feedback.invalid/";

/// Whether the request asks for an instrumented response (`Agent-Feedback-Request: 1`).
pub(super) fn requested(headers: &HeaderMap) -> bool {
    headers
        .get(&REQUEST_HEADER)
        .is_some_and(|v| v.as_bytes() == b"1")
}

/// Adds `Agent-Feedback-Request` to the response's `Vary`, unless it is there (in any case)
/// or the response varies on everything (`*`).
pub(super) fn vary(headers: &mut HeaderMap) {
    let tokens: Vec<String> = headers
        .get_all(VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty())
        .collect();
    if tokens
        .iter()
        .any(|t| t == "*" || t.eq_ignore_ascii_case(REQUEST_HEADER.as_str()))
    {
        return;
    }
    headers.append(VARY, HeaderValue::from_static("Agent-Feedback-Request"));
}

/// Adds the discovery `Link` to an ordinary response that could be instrumented on request:
/// `GET` or `HEAD`, a complete success (2xx but 204, 205, 206, without `Content-Range`), JSON
/// or HTML. `target`: the request's path and query as it sent them.
pub(super) fn advertise(
    method: &Method,
    target: &str,
    status: StatusCode,
    headers: &mut HeaderMap,
) {
    let safe = method == Method::GET || method == Method::HEAD;
    let complete = status.is_success()
        && !matches!(status.as_u16(), 204..=206)
        && !headers.contains_key(http::header::CONTENT_RANGE);
    let supported = rules::media_type(headers)
        .as_deref()
        .and_then(rules::kind_of)
        .is_some();
    if !(safe && complete && supported) {
        return;
    }
    if let Some(link) = link(target) {
        headers.append(LINK, link);
    }
}

/// The discovery link for request target `target`, or `None` when it leaves the origin.
fn link(target: &str) -> Option<HeaderValue> {
    let base = url::Url::parse(BASE).ok()?;
    let resolved = base.join(target).ok()?;
    if resolved.origin() != base.origin() {
        return None;
    }
    let query = resolved
        .query()
        .filter(|q| !q.is_empty())
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    HeaderValue::from_str(&format!("<{}{query}>; {PARAMETERS}", resolved.path())).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link_of(target: &str) -> Option<String> {
        link(target).map(|v| v.to_str().unwrap().to_owned())
    }

    #[test]
    fn the_link_is_the_node_sdks_for_the_same_target() {
        // The Node SDK's own expectation (sdk/node/test/express.test.mjs).
        assert_eq!(
            link_of("/search?scope=private").as_deref(),
            Some(
                r#"</search?scope=private>; rel="agent-feedback"; request-header="Agent-Feedback-Request: 1""#
            )
        );
        // WHATWG serialisation, as `new URL(target, base)` gives it.
        let path = |t: &str| link_of(t).map(|l| l.split_once(">;").unwrap().0[1..].to_owned());
        assert_eq!(path("/search?").as_deref(), Some("/search"));
        assert_eq!(path("/a/../b?x=1").as_deref(), Some("/b?x=1"));
        assert_eq!(path("/%C3%BC?q=%20").as_deref(), Some("/%C3%BC?q=%20"));
        assert_eq!(path("/a'b?q='").as_deref(), Some("/a'b?q=%27"));
        // Leaving the origin: no link.
        assert_eq!(link_of("//evil.example/x"), None);
        assert_eq!(link_of("http://evil.example/x"), None);
    }

    #[test]
    fn vary_is_added_once_and_never_beside_a_star() {
        let mut h = HeaderMap::new();
        vary(&mut h);
        vary(&mut h);
        assert_eq!(h.get_all(VARY).iter().count(), 1);
        let mut h = HeaderMap::new();
        h.insert(
            VARY,
            HeaderValue::from_static("Accept-Encoding, agent-feedback-request"),
        );
        vary(&mut h);
        assert_eq!(h.get_all(VARY).iter().count(), 1);
        let mut h = HeaderMap::new();
        h.insert(VARY, HeaderValue::from_static("*"));
        vary(&mut h);
        assert_eq!(h.get(VARY).unwrap(), "*");
    }

    #[test]
    fn only_an_ordinary_complete_json_or_html_get_or_head_is_advertised() {
        let json = |status: u16, method: Method| {
            let mut h = HeaderMap::new();
            h.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            advertise(&method, "/x", StatusCode::from_u16(status).unwrap(), &mut h);
            h.contains_key(LINK)
        };
        assert!(json(200, Method::GET) && json(201, Method::HEAD));
        assert!(!json(204, Method::GET) && !json(206, Method::GET) && !json(302, Method::GET));
        assert!(!json(200, Method::POST) && !json(404, Method::GET));
        let mut text = HeaderMap::new();
        text.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain"),
        );
        advertise(&Method::GET, "/x", StatusCode::OK, &mut text);
        assert!(!text.contains_key(LINK));
        let mut asked = HeaderMap::new();
        assert!(!requested(&asked));
        asked.insert(REQUEST_HEADER, HeaderValue::from_static("1"));
        assert!(requested(&asked));
        asked.insert(REQUEST_HEADER, HeaderValue::from_static("1, 1"));
        assert!(!requested(&asked));
    }
}
