//! The authorization facade (`EPODE_SIDECAR_AUTH_FACADE`): for an issuer that refuses RFC
//! 8707's `resource` parameter, which every MCP client sends on its authorization and token
//! requests (Entra ID answers `AADSTS9010010`), the sidecar stands in front of the issuer's
//! two endpoints a client sends it to, and passes on everything but `resource`.
//!
//! - Authorization server metadata (RFC 8414) of its own, issuer `<the resource's
//!   origin>/oauth`: the issuer's document, but for the two endpoints, `S256` promised when
//!   the issuer omits `code_challenge_methods_supported` (Entra supports PKCE and does not
//!   say so), and no RFC 9207 `iss` promise or PAR endpoint (a pushed request would reach the
//!   issuer with its `resource`). The Protected Resource Metadata names this issuer.
//! - `/oauth/authorize`: a 302 to the issuer's authorization endpoint with the query as the
//!   client wrote it, less `resource`. Nothing is kept.
//! - `/oauth/token`: the form (at most [`MAX_FORM`]) sent to the issuer's token endpoint
//!   less `resource`, with the client's own `Authorization` (its credentials at the issuer,
//!   where they were issued for) and `DPoP`; the issuer's answer (at most [`MAX_ANSWER`])
//!   returned as it is. In one of the caller's places for calls to the issuer (the
//!   introspections' pool: `auth_introspections`, `_per_caller`), within `auth_fetch_timeout`. Nothing of the
//!   form or the answer is logged.
//!
//! Everything else (registration, keys, revocation) stays the issuer's own. The tokens are
//! the issuer's and are checked as before. Cost: none on the MCP path (two string compares
//! of the route); a token exchange is one round trip to the issuer.

use std::sync::OnceLock;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Response, StatusCode};
use serde_json::{Map, Value};
use url::Url;

use crate::body::{self, Body};

/// The facade's issuer path on the resource's origin.
const ISSUER_PATH: &str = "/oauth";
const AUTHORIZE_PATH: &str = "/oauth/authorize";
const TOKEN_PATH: &str = "/oauth/token";

/// The largest token request read: real ones are well under 8 KiB (a code, a verifier, a
/// client assertion).
pub(crate) const MAX_FORM: usize = 64 * 1024;
/// The largest token answer passed back.
const MAX_ANSWER: usize = 256 * 1024;

/// The parameter the issuer refuses.
const RESOURCE: &str = "resource";

/// Which of the facade's routes a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FacadeRoute {
    Metadata,
    Authorize,
    Token,
}

impl FacadeRoute {
    /// The `endpoint` label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            FacadeRoute::Metadata => "metadata",
            FacadeRoute::Authorize => "authorize",
            FacadeRoute::Token => "token",
        }
    }
}

/// The issuer's endpoints the facade stands in front of, and its own document.
struct Learned {
    authorize: Url,
    token: Url,
    document: Bytes,
}

/// The facade: its issuer, and what it learned of the real one.
pub(crate) struct Facade {
    origin: String,
    learned: OnceLock<Learned>,
}

impl Facade {
    /// The facade for `resource` (its origin serves the facade's routes).
    pub(crate) fn new(resource: &str) -> Option<Facade> {
        let url = Url::parse(resource).ok()?;
        Some(Facade {
            origin: url.origin().ascii_serialization(),
            learned: OnceLock::new(),
        })
    }

    /// The facade's issuer identifier, which the Protected Resource Metadata names.
    pub(crate) fn issuer(&self) -> String {
        format!("{}{ISSUER_PATH}", self.origin)
    }

    /// Which facade route `path` (a canonical path) is, if any: the metadata at RFC 8414's
    /// and OpenID's places for the issuer `/oauth` (inserted and appended), the endpoints.
    pub(crate) fn route(path: &str) -> Option<FacadeRoute> {
        match path {
            "/.well-known/oauth-authorization-server/oauth"
            | "/.well-known/openid-configuration/oauth"
            | "/oauth/.well-known/openid-configuration"
            | "/oauth/.well-known/oauth-authorization-server" => Some(FacadeRoute::Metadata),
            AUTHORIZE_PATH => Some(FacadeRoute::Authorize),
            TOKEN_PATH => Some(FacadeRoute::Token),
            _ => None,
        }
    }

    /// Learns the issuer's metadata `doc` (once: the first read wins, as the keys' backend).
    /// Err: why the facade cannot stand in front of it.
    pub(crate) fn learn(&self, doc: &Map<String, Value>) -> Result<(), String> {
        if self.learned.get().is_some() {
            return Ok(());
        }
        let endpoint = |k: &str| {
            doc.get(k)
                .and_then(Value::as_str)
                .and_then(|u| Url::parse(u).ok())
                .filter(|u| matches!(u.scheme(), "https" | "http"))
                .ok_or_else(|| format!("the issuer's metadata names no {k} (EPODE_SIDECAR_AUTH_FACADE stands in front of it)"))
        };
        let (authorize, token) = (
            endpoint("authorization_endpoint")?,
            endpoint("token_endpoint")?,
        );
        let document = Bytes::from(Value::Object(self.document_from(doc)).to_string());
        let _ = self.learned.set(Learned {
            authorize,
            token,
            document,
        });
        Ok(())
    }

    /// The facade's metadata: the issuer's, with its own issuer and endpoints.
    fn document_from(&self, doc: &Map<String, Value>) -> Map<String, Value> {
        let mut d = doc.clone();
        d.insert("issuer".into(), Value::from(self.issuer()));
        let at = |p: &str| Value::from(format!("{}{p}", self.origin));
        d.insert("authorization_endpoint".into(), at(AUTHORIZE_PATH));
        d.insert("token_endpoint".into(), at(TOKEN_PATH));
        // The issuer's responses carry no `iss` the client could match with this issuer's,
        // and a pushed request or an mTLS alias would reach the issuer with `resource`.
        for gone in [
            "authorization_response_iss_parameter_supported",
            "pushed_authorization_request_endpoint",
            "require_pushed_authorization_requests",
            "mtls_endpoint_aliases",
        ] {
            d.remove(gone);
        }
        let s256 = d
            .get("code_challenge_methods_supported")
            .and_then(Value::as_array)
            .is_some_and(|m| m.iter().any(|v| v == "S256"));
        if !s256 {
            d.insert(
                "code_challenge_methods_supported".into(),
                serde_json::json!(["S256"]),
            );
        }
        d
    }

    /// Whether the issuer's metadata has been learned.
    pub(crate) fn ready(&self) -> bool {
        self.learned.get().is_some()
    }

    /// The metadata, for a GET or HEAD.
    pub(crate) fn metadata(&self, method: &Method) -> Response<Body> {
        if let Some(resp) = only(method, &[Method::GET, Method::HEAD], "GET, HEAD") {
            return resp;
        }
        let Some(learned) = self.learned.get() else {
            return unavailable("the authorization server's metadata has not been read yet");
        };
        with(
            body::json(StatusCode::OK, learned.document.clone()),
            &[
                (header::CACHE_CONTROL, "public, max-age=3600"),
                (header::ACCESS_CONTROL_ALLOW_ORIGIN, "*"),
            ],
        )
    }

    /// The authorization request: a redirect to the issuer's endpoint, less `resource`.
    pub(crate) fn authorize(&self, method: &Method, query: Option<&str>) -> Response<Body> {
        if let Some(resp) = only(method, &[Method::GET], "GET") {
            return resp;
        }
        let Some(learned) = self.learned.get() else {
            return unavailable("the authorization server's metadata has not been read yet");
        };
        let mut target = learned.authorize.clone();
        let kept = without_resource(query.unwrap_or_default().as_bytes());
        let joined = match (target.query(), kept.is_empty()) {
            (Some(own), false) if !own.is_empty() => Some(format!("{own}&{kept}")),
            (Some(own), _) => Some(own.to_owned()),
            (None, false) => Some(kept),
            (None, true) => None,
        };
        target.set_query(joined.as_deref());
        let mut resp = Response::new(body::empty());
        *resp.status_mut() = StatusCode::FOUND;
        let h = resp.headers_mut();
        if let Ok(v) = HeaderValue::from_str(target.as_str()) {
            h.insert(header::LOCATION, v);
        }
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        resp
    }

    /// A CORS preflight of the token endpoint (browser clients call it from their page).
    pub(crate) fn token_preflight() -> Response<Body> {
        let mut resp = Response::new(body::empty());
        *resp.status_mut() = StatusCode::NO_CONTENT;
        with(
            resp,
            &[
                (header::ACCESS_CONTROL_ALLOW_ORIGIN, "*"),
                (header::ACCESS_CONTROL_ALLOW_METHODS, "POST"),
                (
                    header::ACCESS_CONTROL_ALLOW_HEADERS,
                    "authorization, content-type, dpop",
                ),
                (header::ACCESS_CONTROL_MAX_AGE, "600"),
            ],
        )
    }

    /// The token request's head, before its body is read: `Err` is the answer.
    pub(crate) fn token_head(
        &self,
        method: &Method,
        headers: &HeaderMap,
    ) -> Result<(), Box<Response<Body>>> {
        if let Some(resp) = only(method, &[Method::POST], "POST") {
            return Err(Box::new(resp));
        }
        if self.learned.get().is_none() {
            return Err(Box::new(unavailable(
                "the authorization server's metadata has not been read yet",
            )));
        }
        let form = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|v| {
                v.trim()
                    .eq_ignore_ascii_case("application/x-www-form-urlencoded")
            });
        if !form {
            return Err(Box::new(oauth_error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "a token request is a form: Content-Type: application/x-www-form-urlencoded (RFC 6749 §3.2)",
            )));
        }
        Ok(())
    }

    /// The token request sent on to the issuer's token endpoint, less `resource`, and its
    /// answer as the issuer gave it. `Err` says why it could not be asked (for the log).
    pub(crate) async fn token(
        &self,
        client: &reqwest::Client,
        headers: &HeaderMap,
        form: &Bytes,
        deadline: std::time::Duration,
    ) -> Result<Response<Body>, Box<(Response<Body>, String)>> {
        let Some(learned) = self.learned.get() else {
            let why = "the authorization server's metadata has not been read yet";
            return Err(Box::new((unavailable(why), why.into())));
        };
        let mut req = client
            .post(learned.token.clone())
            .timeout(deadline)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(header::ACCEPT, "application/json");
        for name in [header::AUTHORIZATION, http::HeaderName::from_static("dpop")] {
            if let Some(v) = headers.get(&name) {
                req = req.header(name, v.clone());
            }
        }
        let shown = super::fetch::shown(&learned.token);
        let failed = |status: StatusCode, why: String| {
            let text =
                format!("the authorization server's token endpoint ({shown}) {why}; try again");
            Box::new((oauth_error(status, "temporarily_unavailable", &text), text))
        };
        let mut answer = req.body(without_resource(form)).send().await.map_err(|e| {
            if e.is_timeout() {
                failed(
                    StatusCode::GATEWAY_TIMEOUT,
                    format!("did not answer within {deadline:?}"),
                )
            } else {
                failed(StatusCode::BAD_GATEWAY, "could not be reached".into())
            }
        })?;
        let status =
            StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
        let kept = kept_headers(answer.headers());
        let mut read: Vec<u8> = Vec::new();
        loop {
            match answer.chunk().await {
                Ok(Some(chunk)) if read.len() + chunk.len() <= MAX_ANSWER => {
                    read.extend_from_slice(&chunk)
                }
                Ok(Some(_)) => {
                    return Err(failed(
                        StatusCode::BAD_GATEWAY,
                        format!("answered more than {MAX_ANSWER} bytes"),
                    ))
                }
                Ok(None) => break,
                Err(_) => {
                    return Err(failed(
                        StatusCode::BAD_GATEWAY,
                        "broke off its answer".into(),
                    ))
                }
            }
        }
        let mut resp = Response::new(body::full(read));
        *resp.status_mut() = status;
        let h = resp.headers_mut();
        for (name, value) in kept {
            h.insert(name, value);
        }
        h.insert(
            header::ACCESS_CONTROL_ALLOW_ORIGIN,
            HeaderValue::from_static("*"),
        );
        Ok(resp)
    }
}

/// `resp` with these headers set.
fn with(mut resp: Response<Body>, headers: &[(http::HeaderName, &'static str)]) -> Response<Body> {
    for (name, value) in headers {
        resp.headers_mut()
            .insert(name.clone(), HeaderValue::from_static(value));
    }
    resp
}

/// The answer's headers a token client reads.
fn kept_headers(from: &reqwest::header::HeaderMap) -> Vec<(http::HeaderName, HeaderValue)> {
    [
        header::CONTENT_TYPE,
        header::CACHE_CONTROL,
        header::PRAGMA,
        header::WWW_AUTHENTICATE,
        http::HeaderName::from_static("dpop-nonce"),
    ]
    .into_iter()
    .filter_map(|name| {
        let v = from.get(name.as_str())?;
        let v = HeaderValue::from_bytes(v.as_bytes()).ok()?;
        Some((name, v))
    })
    .collect()
}

/// A form or query (`application/x-www-form-urlencoded`) less every `resource` pair; the
/// other pairs kept in order, re-encoded.
pub(crate) fn without_resource(form: &[u8]) -> String {
    let mut out = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in url::form_urlencoded::parse(form) {
        if k != RESOURCE {
            out.append_pair(&k, &v);
        }
    }
    out.finish()
}

/// 405 naming what is allowed, unless `method` is one of `allowed`.
fn only(method: &Method, allowed: &[Method], allow: &'static str) -> Option<Response<Body>> {
    if allowed.contains(method) {
        return None;
    }
    let mut resp = body::error(
        StatusCode::METHOD_NOT_ALLOWED,
        &format!("this endpoint of the authorization facade takes {allow}"),
    );
    resp.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    Some(resp)
}

/// 503 with `Retry-After` (the issuer's metadata not read yet).
fn unavailable(why: &str) -> Response<Body> {
    let mut resp = oauth_error(
        StatusCode::SERVICE_UNAVAILABLE,
        "temporarily_unavailable",
        &format!("{why}; the sidecar's /readyz says why"),
    );
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    resp
}

/// An OAuth error answer (RFC 6749 §5.2): `error` and `error_description`, never cached.
pub(crate) fn oauth_error(status: StatusCode, error: &str, description: &str) -> Response<Body> {
    let doc = serde_json::json!({"error": error, "error_description": description});
    let mut resp = body::json(status, doc.to_string());
    let h = resp.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn learned() -> Facade {
        let f = Facade::new("https://mcp.example.com/mcp").unwrap();
        let doc = serde_json::json!({
            "issuer": "https://login.example.com/t/v2.0",
            "authorization_endpoint": "https://login.example.com/t/oauth2/v2.0/authorize?p=b2c_1",
            "token_endpoint": "https://login.example.com/t/oauth2/v2.0/token",
            "jwks_uri": "https://login.example.com/t/keys",
            "registration_endpoint": "https://login.example.com/reg",
            "authorization_response_iss_parameter_supported": true,
            "pushed_authorization_request_endpoint": "https://login.example.com/par",
        });
        f.learn(doc.as_object().unwrap()).unwrap();
        f
    }

    #[test]
    fn the_metadata_is_the_issuers_but_for_the_endpoints_it_stands_in_front_of() {
        let f = learned();
        assert_eq!(f.issuer(), "https://mcp.example.com/oauth");
        let doc: Value = serde_json::from_slice(&f.learned.get().unwrap().document).unwrap();
        assert_eq!(doc["issuer"], "https://mcp.example.com/oauth");
        assert_eq!(
            doc["authorization_endpoint"],
            "https://mcp.example.com/oauth/authorize"
        );
        assert_eq!(doc["token_endpoint"], "https://mcp.example.com/oauth/token");
        assert_eq!(
            doc["registration_endpoint"],
            "https://login.example.com/reg"
        );
        assert_eq!(doc["jwks_uri"], "https://login.example.com/t/keys");
        assert_eq!(
            doc["code_challenge_methods_supported"],
            serde_json::json!(["S256"])
        );
        assert!(doc
            .get("authorization_response_iss_parameter_supported")
            .is_none());
        assert!(doc.get("pushed_authorization_request_endpoint").is_none());
        for p in [
            "/.well-known/oauth-authorization-server/oauth",
            "/.well-known/openid-configuration/oauth",
            "/oauth/.well-known/openid-configuration",
        ] {
            assert_eq!(Facade::route(p), Some(FacadeRoute::Metadata), "{p}");
        }
        assert_eq!(Facade::route("/oauth/token"), Some(FacadeRoute::Token));
        assert_eq!(Facade::route("/oauth"), None);
        assert_eq!(Facade::route("/token"), None);
    }

    #[test]
    fn resource_is_removed_and_everything_else_kept_in_order() {
        assert_eq!(
            without_resource(b"grant_type=authorization_code&resource=https%3A%2F%2Fmcp.example.com%2Fmcp&code=a%2Bb&resource=x&code_verifier=v"),
            "grant_type=authorization_code&code=a%2Bb&code_verifier=v"
        );
        assert_eq!(without_resource(b""), "");
        let f = learned();
        let resp = f.authorize(
            &Method::GET,
            Some("response_type=code&client_id=c&resource=https%3A%2F%2Fmcp.example.com%2Fmcp&scope=api%3A%2F%2Fx%2Fmcp.tools&state=s"),
        );
        assert_eq!(resp.status(), StatusCode::FOUND);
        assert_eq!(
            resp.headers()[header::LOCATION],
            "https://login.example.com/t/oauth2/v2.0/authorize?p=b2c_1&response_type=code&client_id=c&scope=api%3A%2F%2Fx%2Fmcp.tools&state=s"
        );
        assert_eq!(f.authorize(&Method::POST, None).status(), 405);
    }

    #[test]
    fn before_the_issuer_is_read_every_route_says_so_and_a_token_request_must_be_a_form() {
        let f = Facade::new("https://mcp.example.com/mcp").unwrap();
        assert_eq!(f.metadata(&Method::GET).status(), 503);
        assert_eq!(f.authorize(&Method::GET, Some("a=b")).status(), 503);
        let f = learned();
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let refused = f.token_head(&Method::POST, &h).unwrap_err();
        assert_eq!(refused.status(), 400);
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-www-form-urlencoded; charset=utf-8"),
        );
        assert!(f.token_head(&Method::POST, &h).is_ok());
        assert_eq!(f.token_head(&Method::GET, &h).unwrap_err().status(), 405);
    }

    #[test]
    fn an_issuer_without_the_endpoints_cannot_be_stood_in_front_of() {
        let f = Facade::new("https://mcp.example.com/mcp").unwrap();
        let doc = serde_json::json!({"issuer": "https://i", "token_endpoint": "https://i/t"});
        let why = f.learn(doc.as_object().unwrap()).unwrap_err();
        assert!(why.contains("authorization_endpoint"), "{why}");
        assert!(!f.ready());
    }
}
