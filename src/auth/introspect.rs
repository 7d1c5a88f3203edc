//! An opaque token asked of the issuer's introspection endpoint (RFC 7662) with the sidecar's
//! client credentials (HTTP Basic): `active`, then `iss` (when the answer names one), `aud`
//! and `exp` checked as a JWT's are. A failure to ask is never a pass: it is
//! [`Reason::IntrospectionUnavailable`], answered 503 with `Retry-After`.

use std::time::Duration;

use serde_json::{Map, Value};
use url::Url;

use super::fetch;
use super::jwt::{check_claims, numeric_date};
use super::reason::Reason;
use crate::config::AuthConfig;

/// The answer's claims and its expiry (Unix seconds, when it gives one).
pub(super) async fn introspect(
    client: &reqwest::Client,
    endpoint: &Url,
    token: &str,
    config: &AuthConfig,
    status: &mut Option<u16>,
) -> Result<(Map<String, Value>, Option<u64>), (Reason, Option<String>)> {
    let id = config.client_id.as_deref().unwrap_or_default();
    let secret = config.client_secret.as_deref().unwrap_or_default();
    let req = client
        .post(endpoint.clone())
        .basic_auth(form_encode(id), Some(form_encode(secret)))
        .header(http::header::ACCEPT, "application/json")
        .header(
            http::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded",
        )
        .body(format!(
            "token={}&token_type_hint=access_token",
            form_encode(token)
        ));
    let answer = fetch::json(
        req,
        "the introspection endpoint",
        endpoint,
        config.fetch_timeout,
    )
    .await
    .map_err(|e| {
        *status = e.1;
        (Reason::IntrospectionUnavailable, Some(e.0))
    })?;
    *status = Some(answer.status);
    if answer.status != 200 {
        return Err((
            Reason::IntrospectionUnavailable,
            Some(format!(
                "the introspection endpoint ({}) answered {} (are EPODE_SIDECAR_AUTH_CLIENT_ID and _SECRET right?)",
                fetch::shown(endpoint),
                answer.status
            )),
        ));
    }
    let Value::Object(claims) = answer.json else {
        return Err((
            Reason::IntrospectionUnavailable,
            Some("the introspection answer is not a JSON object".into()),
        ));
    };
    if claims.get("active") != Some(&Value::Bool(true)) {
        return Err((Reason::Inactive, None));
    }
    let mut checked = claims.clone();
    // The endpoint is the issuer's own: an answer without `iss` speaks for it.
    checked
        .entry("iss")
        .or_insert_with(|| Value::String(config.issuer.clone()));
    // `exp`, `nbf` and `iat` as a JWT's: NumericDates, every sum saturating.
    check_claims(&checked, config).map_err(|r| (r, None))?;
    let exp = claims
        .get("exp")
        .map(numeric_date)
        .transpose()
        .map_err(|r| (r, None))?;
    Ok((claims, exp))
}

/// Why an introspection call failed, as a span's `error.type` says it: the endpoint's status,
/// `invalid_answer` (200 but not an answer), `timeout` or `network`; none when it answered
/// (whatever it said of the token).
pub(super) fn failure<T>(
    answer: &Result<T, (Reason, Option<String>)>,
    status: Option<u16>,
) -> Option<String> {
    let Err((Reason::IntrospectionUnavailable, detail)) = answer else {
        return None;
    };
    Some(match (status, detail) {
        (Some(200), _) => "invalid_answer".to_owned(),
        (Some(s), _) => s.to_string(),
        (None, Some(d)) if d.contains("did not answer within") || d.contains("timed out") => {
            "timeout".to_owned()
        }
        (None, _) => "network".to_owned(),
    })
}

/// `application/x-www-form-urlencoded` (RFC 6749 §2.3.1 asks it of client credentials too).
fn form_encode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// How long an inactive token's answer is kept (a client retrying it costs no request).
pub(super) const NEGATIVE_KEEP: Duration = Duration::from_secs(5);
