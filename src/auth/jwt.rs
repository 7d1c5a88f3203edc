//! A JWT access token checked as MCP's authorization and RFC 9068 ask: its header first
//! (an allowed asymmetric `alg`, the `typ` when one is required, a `kid` the issuer
//! publishes), then its signature with that key, then its claims (`exp`/`nbf`/`iat` within
//! the leeway, `iss` exactly the issuer, `aud` holding the resource). The crate
//! (`jsonwebtoken`) checks the signature and times; the sidecar reads `iss` and `aud` itself
//! so that a token without `aud` is refused whatever it carries.

use base64::Engine;
use jsonwebtoken::{Algorithm, Validation};
use serde_json::{Map, Value};

use super::keys::KeySet;
use super::reason::Reason;
use crate::config::AuthConfig;

/// What the header says, read before any key is looked for.
pub(super) struct Head {
    pub(super) alg: Algorithm,
    pub(super) kid: Option<String>,
}

/// Reads and checks the header of `token` (three base64url parts).
pub(super) fn head(token: &str, config: &AuthConfig) -> Result<Head, Reason> {
    let mut parts = token.split('.');
    let (Some(h), Some(_), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Reason::Malformed);
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(h)
        .map_err(|_| Reason::Malformed)?;
    let header: Map<String, Value> =
        serde_json::from_slice(&bytes).map_err(|_| Reason::Malformed)?;
    let alg = header
        .get("alg")
        .and_then(Value::as_str)
        .ok_or(Reason::Malformed)?;
    // `none`, an HMAC algorithm or one the operator did not allow: refused before any key.
    let alg: Algorithm = alg.parse().map_err(|_| Reason::Algorithm)?;
    if !config.algorithms.contains(&alg) {
        return Err(Reason::Algorithm);
    }
    if let Some(want) = &config.token_type {
        let typ = header
            .get("typ")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let typ = typ.strip_prefix("application/").unwrap_or(typ);
        let want = want.strip_prefix("application/").unwrap_or(want);
        if !typ.eq_ignore_ascii_case(want) {
            return Err(Reason::Malformed);
        }
    }
    if header.contains_key("crit") {
        // No extension the sidecar understands may be critical (RFC 7515 §4.1.11).
        return Err(Reason::Malformed);
    }
    let kid = match header.get("kid") {
        None => None,
        Some(Value::String(k)) if k.len() <= 256 => Some(k.clone()),
        Some(_) => return Err(Reason::Malformed),
    };
    Ok(Head { alg, kid })
}

/// The verified claims of `token` and its expiry (Unix seconds), or why it is refused.
/// `Err(None)` from the key lookup means the set does not hold the token's key.
pub(super) fn verify(
    token: &str,
    head: &Head,
    keys: &KeySet,
    config: &AuthConfig,
) -> Result<(Map<String, Value>, u64), Reason> {
    let key = keys.find(head.kid.as_deref()).ok_or(Reason::UnknownKey)?;
    if !key.fits(head.alg) {
        return Err(Reason::Algorithm);
    }
    let mut validation = Validation::new(head.alg);
    validation.algorithms = vec![head.alg];
    validation.leeway = config.leeway.as_secs();
    validation.validate_exp = true;
    validation.validate_nbf = true;
    validation.validate_aud = false;
    validation.required_spec_claims = ["exp".to_owned()].into_iter().collect();
    let data =
        jsonwebtoken::decode::<Map<String, Value>>(token, &key.key, &validation).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind as K;
            match e.kind() {
                K::ExpiredSignature => Reason::Expired,
                K::ImmatureSignature => Reason::NotYetValid,
                K::InvalidSignature => Reason::BadSignature,
                K::InvalidAlgorithm | K::InvalidAlgorithmName => Reason::Algorithm,
                _ => Reason::Malformed,
            }
        })?;
    let claims = data.claims;
    check_claims(&claims, config)?;
    let exp = claims
        .get("exp")
        .map(numeric_date)
        .transpose()?
        .ok_or(Reason::Malformed)?;
    Ok((claims, exp))
}

/// A NumericDate claim (`exp`, `nbf`, `iat`; RFC 7519 §2): seconds since the epoch, a
/// non-negative number (a fraction is cut; one past `u64` is `u64::MAX`). Anything else
/// (a string, a negative number) is a malformed token, never a claim to ignore.
pub(super) fn numeric_date(v: &Value) -> Result<u64, Reason> {
    match v {
        Value::Number(n) => match (n.as_u64(), n.as_f64()) {
            (Some(u), _) => Ok(u),
            // `as` saturates: 1e30 is u64::MAX, and no float here is NaN.
            (None, Some(f)) if f >= 0.0 => Ok(f as u64),
            _ => Err(Reason::Malformed),
        },
        _ => Err(Reason::Malformed),
    }
}

/// Now, in Unix seconds (the unit of `exp`, `nbf` and `iat`).
pub(super) fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `iss`, `aud` and the times: the same checks for a JWT and an introspection answer. `exp`
/// is past with the leeway, `nbf` and `iat` ahead with it; each, when present, a NumericDate
/// ([`numeric_date`]), and every sum saturates (an `exp` near 2^64 never wraps).
pub(super) fn check_claims(claims: &Map<String, Value>, config: &AuthConfig) -> Result<(), Reason> {
    if claims.get("iss").and_then(Value::as_str) != Some(config.issuer.as_str()) {
        return Err(Reason::WrongIssuer);
    }
    check_audience(claims, config)?;
    let leeway = config.leeway.as_secs();
    let now = now();
    let date = |name: &str| claims.get(name).map(numeric_date).transpose();
    if date("exp")?.is_some_and(|exp| exp.saturating_add(leeway) < now) {
        return Err(Reason::Expired);
    }
    for ahead in ["nbf", "iat"] {
        if date(ahead)?.is_some_and(|t| t > now.saturating_add(leeway)) {
            return Err(Reason::NotYetValid);
        }
    }
    Ok(())
}

/// `aud` must hold the resource or one of the audiences configured besides it (a string or
/// an array of strings); no `aud` is refused.
pub(super) fn check_audience(
    claims: &Map<String, Value>,
    config: &AuthConfig,
) -> Result<(), Reason> {
    let ours = |a: &str| a == config.resource || config.audience.iter().any(|o| o == a);
    let holds = match claims.get("aud") {
        Some(Value::String(a)) => ours(a),
        Some(Value::Array(list)) => list.iter().filter_map(Value::as_str).any(ours),
        _ => false,
    };
    if holds {
        Ok(())
    } else {
        Err(Reason::WrongAudience)
    }
}
