//! The authorization server as the sidecar knows it: its metadata (RFC 8414, else OpenID
//! discovery; its `issuer` must be the configured one) and, for JWTs, its signing keys (the
//! JWKS at `jwks_uri`). The keys are kept for their HTTP cache lifetime (clamped to
//! [`MIN_KEEP`]..[`MAX_KEEP`], [`DEFAULT_KEEP`] without one); a token naming a key the sidecar
//! does not hold fetches them again, at most once per `auth_keys_refresh`, one fetch at a time
//! whatever the number of requests waiting; a failed fetch keeps the keys held before.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, JwkSet, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use parking_lot::RwLock;
use serde_json::Value;
use url::Url;

use super::fetch::{self, FetchError};

pub(super) const MIN_KEEP: Duration = Duration::from_secs(60);
pub(super) const MAX_KEEP: Duration = Duration::from_secs(86_400);
pub(super) const DEFAULT_KEEP: Duration = Duration::from_secs(300);
/// The least time between two fetches of the keys, whatever asks for them.
const MIN_BETWEEN: Duration = Duration::from_secs(1);
/// The most keys a set may hold: more is refused as a whole (the keys held before stay).
pub(super) const MAX_KEYS: usize = 100;

/// What the authorization server's metadata says the sidecar needs.
#[derive(Debug, Clone)]
pub(super) struct Metadata {
    pub(super) jwks_uri: Option<Url>,
    pub(super) introspection_endpoint: Option<Url>,
    /// The whole document (what the authorization facade copies).
    pub(super) document: serde_json::Map<String, Value>,
}

/// The metadata URLs to try for `issuer`, in order: RFC 8414's (the well-known segment
/// inserted before the issuer's path), then OpenID's (appended), then OpenID's inserted, then
/// RFC 8414's appended.
pub(super) fn metadata_urls(issuer: &str) -> Vec<Url> {
    let Ok(url) = Url::parse(issuer) else {
        return Vec::new();
    };
    let path = url.path().trim_end_matches('/');
    let origin = url.origin().ascii_serialization();
    let mut out = Vec::new();
    for candidate in [
        format!("{origin}/.well-known/oauth-authorization-server{path}"),
        format!("{origin}{path}/.well-known/openid-configuration"),
        format!("{origin}/.well-known/openid-configuration{path}"),
        // Where some servers put RFC 8414's document for an issuer with a path (Okta's
        // custom authorization servers): appended, as OpenID's is.
        format!("{origin}{path}/.well-known/oauth-authorization-server"),
    ] {
        if let Ok(u) = Url::parse(&candidate) {
            if !out.contains(&u) {
                out.push(u);
            }
        }
    }
    out
}

/// Reads the issuer's metadata: the first of [`metadata_urls`] that answers 200 with a JSON
/// object whose `issuer` is the configured one exactly (RFC 8414 §3.3).
pub(super) async fn discover(
    client: &reqwest::Client,
    issuer: &str,
    deadline: Duration,
) -> Result<Metadata, FetchError> {
    let mut why = Vec::new();
    for url in metadata_urls(issuer) {
        match fetch::json(
            client.get(url.clone()),
            "the authorization server's metadata",
            &url,
            deadline,
        )
        .await
        {
            Ok(a) if a.status == 200 => {
                let said = a.json.get("issuer").and_then(Value::as_str);
                if said != Some(issuer) {
                    return Err(FetchError::at(format!(
                        "the authorization server's metadata at {} names the issuer {}, not {issuer} (EPODE_SIDECAR_AUTH_ISSUER must be the issuer exactly as its tokens write it)",
                        fetch::shown(&url),
                        said.map_or_else(|| "<none>".to_owned(), |s| format!("{s:?}")),
                    )));
                }
                let link = |k: &str| {
                    a.json
                        .get(k)
                        .and_then(Value::as_str)
                        .and_then(|u| Url::parse(u).ok())
                };
                return Ok(Metadata {
                    jwks_uri: link("jwks_uri"),
                    introspection_endpoint: link("introspection_endpoint"),
                    document: a.json.as_object().cloned().unwrap_or_default(),
                });
            }
            Ok(a) => why.push(format!("{} answered {}", fetch::shown(&url), a.status)),
            Err(e) => why.push(e.0),
        }
    }
    Err(FetchError::at(format!(
        "no metadata for the issuer {issuer}: {}",
        why.join("; ")
    )))
}

/// One verification key.
pub(super) struct Key {
    pub(super) key: DecodingKey,
    /// The algorithm the key is for, when the JWK says (a token must then use it).
    pub(super) alg: Option<Algorithm>,
    family: Family,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Rsa,
    Ec,
    Ed,
}

fn family(alg: Algorithm) -> Option<Family> {
    use Algorithm::*;
    match alg {
        RS256 | RS384 | RS512 | PS256 | PS384 | PS512 => Some(Family::Rsa),
        ES256 | ES384 => Some(Family::Ec),
        EdDSA => Some(Family::Ed),
        HS256 | HS384 | HS512 => None,
    }
}

impl Key {
    /// Whether a token signed with `alg` may be checked with this key.
    pub(super) fn fits(&self, alg: Algorithm) -> bool {
        family(alg) == Some(self.family) && self.alg.is_none_or(|a| a == alg)
    }
}

/// A key set as fetched.
pub(super) struct KeySet {
    pub(super) by_kid: HashMap<String, Key>,
    /// Keys without a `kid` (a token without one may use only a set's single key).
    pub(super) unnamed: Vec<Key>,
    pub(super) fetched: Instant,
    pub(super) fetched_at: SystemTime,
    pub(super) keep: Duration,
}

impl KeySet {
    pub(super) fn len(&self) -> usize {
        self.by_kid.len() + self.unnamed.len()
    }

    pub(super) fn fresh(&self) -> bool {
        self.fetched.elapsed() < self.keep
    }

    /// The key for a token's `kid` (or, without one, the set's only key).
    pub(super) fn find(&self, kid: Option<&str>) -> Option<&Key> {
        match kid {
            Some(kid) => self.by_kid.get(kid),
            None if self.len() == 1 => self.by_kid.values().chain(&self.unnamed).next(),
            None => None,
        }
    }
}

fn jwk_alg(a: KeyAlgorithm) -> Option<Algorithm> {
    use KeyAlgorithm as K;
    Some(match a {
        K::RS256 => Algorithm::RS256,
        K::RS384 => Algorithm::RS384,
        K::RS512 => Algorithm::RS512,
        K::PS256 => Algorithm::PS256,
        K::PS384 => Algorithm::PS384,
        K::PS512 => Algorithm::PS512,
        K::ES256 => Algorithm::ES256,
        K::ES384 => Algorithm::ES384,
        K::EdDSA => Algorithm::EdDSA,
        _ => return None,
    })
}

/// A JWKS as keys: signature keys only (`use` absent or `sig`), asymmetric only; a key the
/// crate cannot read is skipped. More than [`MAX_KEYS`] is refused. `keep` is its cache
/// lifetime, already clamped ([`KeyStore`]'s bounds).
pub(super) fn key_set(json: &Value, keep: Duration) -> Result<KeySet, String> {
    let count = json.get("keys").and_then(Value::as_array).map(Vec::len);
    match count {
        None => return Err("the key set has no keys array".into()),
        Some(n) if n > MAX_KEYS => {
            return Err(format!(
                "the key set holds {n} keys, more than the {MAX_KEYS} the sidecar takes"
            ))
        }
        Some(_) => {}
    }
    let set: JwkSet = serde_json::from_value(strip_unreadable(json))
        .map_err(|_| "the key set is not a JWK Set".to_owned())?;
    let mut by_kid = HashMap::new();
    let mut unnamed = Vec::new();
    for jwk in &set.keys {
        let Some(key) = read_key(jwk) else { continue };
        match &jwk.common.key_id {
            Some(kid) => {
                by_kid.insert(kid.clone(), key);
            }
            None => unnamed.push(key),
        }
    }
    Ok(KeySet {
        by_kid,
        unnamed,
        fetched: Instant::now(),
        fetched_at: SystemTime::now(),
        keep,
    })
}

/// The keys the crate can parse, the others left out (an unknown `kty` or `alg`, a symmetric
/// key), so one odd key does not lose the whole set.
fn strip_unreadable(json: &Value) -> Value {
    let keys: Vec<Value> = json["keys"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|k| serde_json::from_value::<Jwk>((*k).clone()).is_ok())
        .cloned()
        .collect();
    serde_json::json!({ "keys": keys })
}

fn read_key(jwk: &Jwk) -> Option<Key> {
    if matches!(jwk.common.public_key_use, Some(ref u) if *u != PublicKeyUse::Signature) {
        return None;
    }
    let family = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Family::Rsa,
        AlgorithmParameters::EllipticCurve(_) => Family::Ec,
        AlgorithmParameters::OctetKeyPair(_) => Family::Ed,
        AlgorithmParameters::OctetKey(_) => return None,
    };
    let alg = match jwk.common.key_algorithm {
        Some(a) => Some(jwk_alg(a)?),
        None => None,
    };
    let key = DecodingKey::from_jwk(jwk).ok()?;
    Some(Key { key, alg, family })
}

/// The issuer's keys and the one fetch of them at a time.
pub(super) struct KeyStore {
    jwks_uri: Url,
    client: reqwest::Client,
    deadline: Duration,
    refresh: Duration,
    /// The longest keys are kept (`auth_keys_max_age`).
    max_keep: Duration,
    pub(super) held: RwLock<Option<Arc<KeySet>>>,
    /// When the last fetches started (any, and the last one an unknown `kid` asked for);
    /// taken to fetch, so one runs at a time.
    last: tokio::sync::Mutex<Fetches>,
    /// Whether a background fetch (the held keys past their lifetime) runs now.
    refreshing: std::sync::atomic::AtomicBool,
}

/// When the keys were last fetched.
#[derive(Debug, Default)]
struct Fetches {
    any: Option<Instant>,
    for_unknown_kid: Option<Instant>,
}

/// Why the keys are fetched, which decides how often that may happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Why {
    /// At start: always.
    Start,
    /// The held keys' lifetime is over: at most once per interval.
    Expired,
    /// A token names a key the sidecar does not hold (a rotation, or a forgery): at most once
    /// per interval counting only such fetches, so a rotation right after a routine fetch is
    /// caught at once while a flood of made-up kids still costs one fetch per interval.
    UnknownKid,
}

/// What a fetch did, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KeyFetch {
    Done,
    Failed,
    /// Not fetched: too soon after the last one, or another request's fetch just ended.
    Skipped,
}

impl KeyStore {
    pub(super) fn new(
        jwks_uri: Url,
        client: reqwest::Client,
        (deadline, refresh, max_keep): (Duration, Duration, Duration),
    ) -> Self {
        KeyStore {
            jwks_uri,
            client,
            deadline,
            refresh,
            max_keep,
            held: RwLock::new(None),
            last: tokio::sync::Mutex::new(Fetches::default()),
            refreshing: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Whether the caller may start the one background fetch (none runs now).
    pub(super) fn start_refreshing(&self) -> bool {
        !self
            .refreshing
            .swap(true, std::sync::atomic::Ordering::AcqRel)
    }

    /// The background fetch ended.
    pub(super) fn done_refreshing(&self) {
        self.refreshing
            .store(false, std::sync::atomic::Ordering::Release);
    }

    pub(super) fn current(&self) -> Option<Arc<KeySet>> {
        self.held.read().clone()
    }

    /// Fetches the keys unless one was fetched within `auth_keys_refresh` (or `force`, at
    /// start and when the held set's lifetime is over); one fetch at a time, a request that
    /// waited for another's taking its result.
    pub(super) async fn refresh(
        &self,
        seen: Option<Instant>,
        why: Why,
    ) -> (KeyFetch, Result<(), FetchError>) {
        let mut last = self.last.lock().await;
        let held = self.current();
        // Another request fetched while this one waited.
        if let (Some(set), Some(seen)) = (&held, seen) {
            if set.fetched > seen {
                return (KeyFetch::Skipped, Ok(()));
            }
        }
        let recent = |t: Option<Instant>| t.is_some_and(|t| t.elapsed() < self.refresh);
        let too_soon = match why {
            Why::Start => false,
            Why::Expired => recent(last.any),
            // Never two fetches within a second, whatever asks.
            Why::UnknownKid => {
                recent(last.for_unknown_kid) || last.any.is_some_and(|t| t.elapsed() < MIN_BETWEEN)
            }
        };
        if too_soon {
            return (KeyFetch::Skipped, Ok(()));
        }
        let now = Instant::now();
        last.any = Some(now);
        if why == Why::UnknownKid {
            last.for_unknown_kid = Some(now);
        }
        let answer = fetch::json(
            self.client.get(self.jwks_uri.clone()),
            "the authorization server's keys",
            &self.jwks_uri,
            self.deadline,
        )
        .await;
        let result = answer.and_then(|a| {
            if a.status != 200 {
                return Err(FetchError::at(format!(
                    "the authorization server's keys ({}) answered {}",
                    fetch::shown(&self.jwks_uri),
                    a.status
                )));
            }
            let keep = a.max_age.unwrap_or(DEFAULT_KEEP);
            let max = self.max_keep.min(MAX_KEEP);
            key_set(&a.json, keep.clamp(MIN_KEEP.min(max), max))
                .map_err(|why| FetchError::at(format!("{why} ({})", fetch::shown(&self.jwks_uri))))
        });
        match result {
            Ok(set) => {
                *self.held.write() = Some(Arc::new(set));
                (KeyFetch::Done, Ok(()))
            }
            Err(e) => (KeyFetch::Failed, Err(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_is_looked_for_where_rfc_8414_and_openid_put_it() {
        let urls: Vec<String> = metadata_urls("https://as.example.com/realms/acme")
            .iter()
            .map(Url::to_string)
            .collect();
        assert_eq!(
            urls,
            [
                "https://as.example.com/.well-known/oauth-authorization-server/realms/acme",
                "https://as.example.com/realms/acme/.well-known/openid-configuration",
                "https://as.example.com/.well-known/openid-configuration/realms/acme",
                "https://as.example.com/realms/acme/.well-known/oauth-authorization-server",
            ]
        );
        let root: Vec<String> = metadata_urls("https://as.example.com/")
            .iter()
            .map(Url::to_string)
            .collect();
        assert_eq!(
            root,
            [
                "https://as.example.com/.well-known/oauth-authorization-server",
                "https://as.example.com/.well-known/openid-configuration",
            ]
        );
    }

    #[test]
    fn a_key_set_keeps_signature_keys_and_refuses_too_many() {
        let rsa = serde_json::json!({"kty": "RSA", "kid": "a", "use": "sig", "alg": "RS256",
            "n": "sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw",
            "e": "AQAB"});
        let enc =
            serde_json::json!({"kty": "RSA", "kid": "b", "use": "enc", "n": rsa["n"], "e": "AQAB"});
        let oct = serde_json::json!({"kty": "oct", "kid": "c", "k": "c2VjcmV0"});
        let odd = serde_json::json!({"kty": "XYZ", "kid": "d"});
        let set = key_set(
            &serde_json::json!({"keys": [rsa, enc, oct, odd]}),
            DEFAULT_KEEP,
        )
        .unwrap();
        assert_eq!(set.len(), 1);
        let key = set.find(Some("a")).unwrap();
        assert!(key.fits(Algorithm::RS256));
        assert!(!key.fits(Algorithm::PS256), "the JWK says RS256");
        assert!(!key.fits(Algorithm::HS256));
        assert!(
            set.find(None).is_some(),
            "a single key serves a token without kid"
        );
        let many: Vec<Value> = (0..=MAX_KEYS).map(|i| serde_json::json!({"kty": "RSA", "kid": i.to_string(), "n": "AQAB", "e": "AQAB"})).collect();
        assert!(key_set(&serde_json::json!({"keys": many}), DEFAULT_KEEP).is_err());
        assert!(key_set(&serde_json::json!({"nokeys": []}), DEFAULT_KEEP).is_err());
    }
}
