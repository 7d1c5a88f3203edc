//! The product key and the `afr2_` feedback handle: an HMAC capability the sidecar signs itself
//! (Epode never issues one) and Epode verifies with the same product key. Protocol v1, "Product
//! key and capability"; the server checks mirror `backend/src/security.rs` of the reference.
//!
//! `token = "afr2_" + keyId + "." + b64url(claims JSON) + "." + b64url(HMAC-SHA256(SHA256(key),
//! signing input))`, claims in the fixed order `v, i, iat, exp, n, s?, r?`.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use rand::RngCore as _;
use serde::Deserialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use uuid::Uuid;

type HmacSha256 = Hmac<Sha256>;

/// Prefix of every feedback handle.
pub const HANDLE_PREFIX: &str = "afr2_";
/// Prefix of an Ask-once consent subject.
pub const SUBJECT_PREFIX: &str = "afsub1_";
/// A handle lives two hours: minted with `exp = iat + 7200`, rejected beyond that lifetime.
pub const HANDLE_LIFETIME_SECS: i64 = 2 * 60 * 60;
/// How far in the future `iat` may be before Epode rejects the handle.
pub const MAX_ISSUED_AHEAD_SECS: i64 = 5 * 60;
/// Random nonce length: 18 bytes encode to exactly 24 base64url characters.
const NONCE_BYTES: usize = 18;
const LIVE_PREFIX: &str = "af_live_";
const READ_PREFIX: &str = "af_read_";
const HEX_ID_LEN: usize = 32;
const MIN_SECRET_LEN: usize = 20;

/// Why a string is not a usable product (write) key. Never carries the key itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProductKeyError {
    #[error(
        "the product key is a read key (af_read_…); feedback handles need a write key (af_live_…)"
    )]
    ReadKey,
    #[error("the product key must look like af_live_<32 hex key id>_<32 hex consent scope>_<secret of at least 20 characters>")]
    Malformed,
}

/// A product write key `af_live_<keyId>_(<consentScope>_)?<secret>`. The whole key is the secret:
/// it authenticates telemetry and its SHA-256 signs every handle, so `Debug` redacts it and
/// there is no `Display`.
#[derive(Clone)]
pub struct ProductKey {
    full: String,
    key_id: String,
    consent_scope: String,
    explicit_scope: bool,
    signing_key: [u8; 32],
}

impl ProductKey {
    /// Parses a key the way the reference SDKs do
    /// (`^af_live_([0-9a-fA-F]{32})_(?:([0-9a-fA-F]{32})_)?(.{20,})$`): the consent scope is
    /// taken when a valid secret still follows it, otherwise the key is the legacy form whose
    /// scope is the key id.
    pub fn parse(key: &str) -> Result<Self, ProductKeyError> {
        if key.starts_with(READ_PREFIX) {
            return Err(ProductKeyError::ReadKey);
        }
        let rest = key
            .strip_prefix(LIVE_PREFIX)
            .ok_or(ProductKeyError::Malformed)?;
        let (key_id, rest) = hex_id_then_underscore(rest).ok_or(ProductKeyError::Malformed)?;
        let (scope, explicit_scope) = match hex_id_then_underscore(rest) {
            Some((scope, secret)) if valid_secret(secret) => (scope, true),
            _ if valid_secret(rest) => (key_id, false),
            _ => return Err(ProductKeyError::Malformed),
        };
        Ok(ProductKey {
            full: key.to_owned(),
            key_id: key_id.to_ascii_lowercase(),
            consent_scope: scope.to_ascii_lowercase(),
            explicit_scope,
            signing_key: Sha256::digest(key.as_bytes()).into(),
        })
    }

    /// The key id, lowercase, as it appears in every handle.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// The consent scope, lowercase (the key id for a legacy key without one).
    pub fn consent_scope(&self) -> &str {
        &self.consent_scope
    }

    /// Whether the key names its consent scope (the current form) rather than the legacy form.
    pub fn has_explicit_scope(&self) -> bool {
        self.explicit_scope
    }

    /// The whole key, for the `Authorization: Bearer` header of telemetry calls only.
    pub fn expose_secret(&self) -> &str {
        &self.full
    }

    /// The Ask-once consent subject for a customer of this product.
    pub fn subject(&self, customer_ref: &str) -> String {
        subject(&self.consent_scope, customer_ref)
    }
}

impl fmt::Debug for ProductKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProductKey")
            .field("key_id", &self.key_id)
            .field("consent_scope", &self.consent_scope)
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// Splits `<32 hex>_<rest>`; `get` keeps this free of panics on multi-byte input.
fn hex_id_then_underscore(value: &str) -> Option<(&str, &str)> {
    let id = value.get(..HEX_ID_LEN)?;
    let rest = value.get(HEX_ID_LEN..)?.strip_prefix('_')?;
    id.bytes()
        .all(|b| b.is_ascii_hexdigit())
        .then_some((id, rest))
}

/// The reference's `.{20,}`: JavaScript counts UTF-16 code units and `.` excludes line
/// terminators, so this does too.
fn valid_secret(secret: &str) -> bool {
    !secret.contains(['\n', '\r', '\u{2028}', '\u{2029}'])
        && secret.encode_utf16().count() >= MIN_SECRET_LEN
}

/// The signed claims of a handle, serialised in exactly this field order.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claims {
    /// Protocol version, always 1.
    pub v: u8,
    /// Interaction id (a UUID): also the telemetry `interactionId` and the consent/report key.
    pub i: String,
    /// Issued at, Unix seconds.
    pub iat: i64,
    /// Expires at, Unix seconds.
    pub exp: i64,
    /// Random nonce, base64url.
    pub n: String,
    /// Ask-once consent subject (`afsub1_…`), only with a customerRef.
    #[serde(default)]
    pub s: Option<String>,
    /// Consent revision the signer saw for `s` (0 when none is cached); only with `s`.
    #[serde(default)]
    pub r: Option<i64>,
}

impl Claims {
    /// Compact JSON in protocol order (`preserve_order` keeps insertion order); absent `s`/`r`
    /// are omitted, never null.
    pub fn to_json(&self) -> String {
        let mut map = Map::new();
        map.insert("v".into(), Value::from(self.v));
        map.insert("i".into(), Value::from(self.i.as_str()));
        map.insert("iat".into(), Value::from(self.iat));
        map.insert("exp".into(), Value::from(self.exp));
        map.insert("n".into(), Value::from(self.n.as_str()));
        if let Some(s) = &self.s {
            map.insert("s".into(), Value::from(s.as_str()));
        }
        if let Some(r) = self.r {
            map.insert("r".into(), Value::from(r));
        }
        Value::Object(map).to_string()
    }
}

/// A signed `afr2_` handle. It is a bearer credential for one interaction's consent decision
/// and report, so `Debug` redacts it; use [`FeedbackHandle::as_str`] where the agent must see it.
#[derive(Clone, PartialEq, Eq)]
pub struct FeedbackHandle(String);

impl FeedbackHandle {
    /// Wraps a handle received from an agent. Nothing is checked: Epode verifies it (or call
    /// [`verify`] first).
    pub fn unverified(token: impl Into<String>) -> Self {
        FeedbackHandle(token.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Debug for FeedbackHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FeedbackHandle({HANDLE_PREFIX}<redacted>)")
    }
}

/// Signs `claims` with `key`.
pub fn sign(key: &ProductKey, claims: &Claims) -> FeedbackHandle {
    let payload = URL_SAFE_NO_PAD.encode(claims.to_json());
    let signing_input = format!("{HANDLE_PREFIX}{}.{payload}", key.key_id);
    let signature = URL_SAFE_NO_PAD.encode(mac(&key.signing_key, signing_input.as_bytes()));
    FeedbackHandle(format!("{signing_input}.{signature}"))
}

/// A freshly minted handle and the claims inside it.
#[derive(Debug, Clone)]
pub struct Minted {
    pub claims: Claims,
    pub handle: FeedbackHandle,
}

/// Mints the handle for one product tool call: a fresh UUID v4 interaction id and nonce,
/// `exp = iat + 2 h`, and for Ask once with a customerRef the subject and the revision from the
/// consent cache.
pub fn mint(
    key: &ProductKey,
    now: SystemTime,
    subject_and_revision: Option<(String, u64)>,
) -> Minted {
    let iat = unix_seconds(now);
    let mut nonce = [0_u8; NONCE_BYTES];
    rand::rng().fill_bytes(&mut nonce);
    let (s, r) = match subject_and_revision {
        // Epode stores revisions as i64; a larger one cannot match and is refused there anyway.
        Some((subject, revision)) => (
            Some(subject),
            Some(i64::try_from(revision).unwrap_or(i64::MAX)),
        ),
        None => (None, None),
    };
    let claims = Claims {
        v: 1,
        i: Uuid::new_v4().hyphenated().to_string(),
        iat,
        exp: iat.saturating_add(HANDLE_LIFETIME_SECS),
        n: URL_SAFE_NO_PAD.encode(nonce),
        s,
        r,
    };
    let handle = sign(key, &claims);
    Minted { claims, handle }
}

/// Why a handle is refused. Epode answers every one of these with 401.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("the feedback handle is not an afr2_ token of three parts")]
    Malformed,
    #[error("the feedback handle was signed for another product key")]
    KeyMismatch,
    #[error("the feedback handle's signature does not match")]
    BadSignature,
    #[error("the feedback handle's claims are not valid JSON of the expected shape")]
    BadClaims,
    #[error("the feedback handle has an unsupported version")]
    UnsupportedVersion,
    #[error("the feedback handle's interaction id is not a UUID")]
    BadInteractionId,
    #[error("the feedback handle's nonce must be 16 to 128 characters")]
    BadNonce,
    #[error("the feedback handle was issued more than five minutes in the future")]
    IssuedInFuture,
    #[error("the feedback handle has expired")]
    Expired,
    #[error("the feedback handle's lifetime is not between zero and two hours")]
    BadLifetime,
    #[error("the feedback handle's consent subject is malformed")]
    BadSubject,
    #[error("the feedback handle's consent revision is negative or lacks a subject")]
    BadRevision,
}

/// Verifies a handle exactly as Epode does: key id, signature (constant time), then the claims.
/// The signature is checked before the claims are parsed, so unauthenticated JSON is never read.
pub fn verify(key: &ProductKey, token: &str, now: SystemTime) -> Result<Claims, VerifyError> {
    let (signing_input, signature) = token.rsplit_once('.').ok_or(VerifyError::Malformed)?;
    let (key_id, payload) = signing_input
        .strip_prefix(HANDLE_PREFIX)
        .and_then(|rest| rest.split_once('.'))
        .filter(|(_, payload)| !payload.contains('.'))
        .ok_or(VerifyError::Malformed)?;
    if !key_id.eq_ignore_ascii_case(&key.key_id) {
        return Err(VerifyError::KeyMismatch);
    }
    let signature = URL_SAFE_NO_PAD
        .decode(signature)
        .map_err(|_| VerifyError::BadSignature)?;
    let mut verifier = new_mac(&key.signing_key);
    verifier.update(signing_input.as_bytes());
    verifier
        .verify_slice(&signature)
        .map_err(|_| VerifyError::BadSignature)?;

    let payload = URL_SAFE_NO_PAD
        .decode(payload)
        .map_err(|_| VerifyError::BadClaims)?;
    let claims: Claims = serde_json::from_slice(&payload).map_err(|_| VerifyError::BadClaims)?;
    check_claims(&claims, unix_seconds(now))?;
    Ok(claims)
}

fn check_claims(claims: &Claims, now: i64) -> Result<(), VerifyError> {
    if claims.v != 1 {
        return Err(VerifyError::UnsupportedVersion);
    }
    if Uuid::parse_str(&claims.i).is_err() {
        return Err(VerifyError::BadInteractionId);
    }
    if !(16..=128).contains(&claims.n.len()) {
        return Err(VerifyError::BadNonce);
    }
    if claims.iat > now.saturating_add(MAX_ISSUED_AHEAD_SECS) {
        return Err(VerifyError::IssuedInFuture);
    }
    if claims.exp <= now {
        return Err(VerifyError::Expired);
    }
    let lifetime = claims.exp.saturating_sub(claims.iat);
    if lifetime <= 0 || lifetime > HANDLE_LIFETIME_SECS {
        return Err(VerifyError::BadLifetime);
    }
    if claims.s.as_deref().is_some_and(|s| !valid_subject(s)) {
        return Err(VerifyError::BadSubject);
    }
    if claims.r.is_some_and(|r| r < 0) || (claims.r.is_some() && claims.s.is_none()) {
        return Err(VerifyError::BadRevision);
    }
    Ok(())
}

/// `afsub1_` + 43 base64url characters (an unpadded SHA-256 MAC).
pub fn valid_subject(value: &str) -> bool {
    value.strip_prefix(SUBJECT_PREFIX).is_some_and(|suffix| {
        suffix.len() == 43
            && suffix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    })
}

/// The Ask-once consent subject: `afsub1_` + b64url(HMAC-SHA256(SHA256("epode-consent-scope:" +
/// lowercase scope), "customer-ref:" + trimmed customerRef)). Stable across key rotation within a
/// scope, and it never reveals the customerRef.
pub fn subject(consent_scope: &str, customer_ref: &str) -> String {
    let scope_key: [u8; 32] = Sha256::digest(
        format!("epode-consent-scope:{}", consent_scope.to_ascii_lowercase()).as_bytes(),
    )
    .into();
    let message = format!(
        "customer-ref:{}",
        customer_ref.trim_matches(is_js_whitespace)
    );
    format!(
        "{SUBJECT_PREFIX}{}",
        URL_SAFE_NO_PAD.encode(mac(&scope_key, message.as_bytes()))
    )
}

/// What JavaScript's `String.prototype.trim` removes (the reference trims with it); Rust's
/// `char::is_whitespace` differs on U+0085 and U+FEFF.
fn is_js_whitespace(c: char) -> bool {
    matches!(
        c,
        '\u{9}'..='\u{d}'
            | ' '
            | '\u{a0}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200a}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202f}'
            | '\u{205f}'
            | '\u{3000}'
            | '\u{feff}'
    )
}

fn new_mac(key: &[u8; 32]) -> HmacSha256 {
    // HMAC takes a key of any length; a 32-byte key is always accepted.
    <HmacSha256 as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!())
}

fn mac(key: &[u8; 32], message: &[u8]) -> [u8; 32] {
    let mut mac = new_mac(key);
    mac.update(message);
    mac.finalize().into_bytes().into()
}

/// Whole Unix seconds; a clock before 1970 counts as 0.
fn unix_seconds(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const KEY: &str =
        "af_live_0123456789abcdef0123456789abcdef_conformance_secret_0123456789abcdef";

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn conformance() -> Value {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/epode-protocol-v1/conformance.json"
        );
        let text = std::fs::read_to_string(path).expect("conformance fixture");
        serde_json::from_str(&text).expect("conformance JSON")
    }

    fn key() -> ProductKey {
        ProductKey::parse(KEY).expect("conformance key")
    }

    fn scoped_key() -> ProductKey {
        ProductKey::parse(&format!(
            "af_live_{}_{}_{}",
            "ABCDEF0123456789abcdef0123456789",
            "FEDCBA9876543210fedcba9876543210",
            "s3cret-s3cret-s3cret-s3cret"
        ))
        .expect("scoped key")
    }

    #[test]
    fn conformance_vector_reproduces_byte_for_byte() {
        let vector = conformance();
        let capability = &vector["capability"];
        let key = ProductKey::parse(capability["apiKey"].as_str().unwrap()).unwrap();
        assert_eq!(key.key_id(), capability["keyId"].as_str().unwrap());
        let claims: Claims = serde_json::from_value(capability["claims"].clone()).unwrap();
        let handle = sign(&key, &claims);
        assert_eq!(handle.as_str(), capability["token"].as_str().unwrap());
        assert!(handle
            .as_str()
            .ends_with(".wxJ0YGS21x9eW-Cn33t9V1INhyGNj1_U3qoQns3vdWA"));
        // The fixture's claims object is itself in protocol order.
        assert_eq!(claims.to_json(), capability["claims"].to_string());
        // And Epode's checks accept it inside its lifetime.
        assert_eq!(verify(&key, handle.as_str(), at(1_715_000_001)), Ok(claims));
    }

    #[test]
    fn claims_serialise_in_protocol_order_with_optional_subject() {
        let claims = Claims {
            v: 1,
            i: "018f1f2e-7b4a-7c12-9c8d-123456789abc".into(),
            iat: 10,
            exp: 7210,
            n: "AQIDBAUGBwgJCgsMDQ4PEBES".into(),
            s: Some(format!("{SUBJECT_PREFIX}{}", "A".repeat(43))),
            r: Some(3),
        };
        let json = claims.to_json();
        assert_eq!(
            json,
            format!(
                r#"{{"v":1,"i":"018f1f2e-7b4a-7c12-9c8d-123456789abc","iat":10,"exp":7210,"n":"AQIDBAUGBwgJCgsMDQ4PEBES","s":"afsub1_{}","r":3}}"#,
                "A".repeat(43)
            )
        );
    }

    #[test]
    fn product_keys_parse_like_the_reference_regex() {
        let legacy = key();
        assert_eq!(legacy.consent_scope(), legacy.key_id());
        assert!(!legacy.has_explicit_scope());

        let scoped = scoped_key();
        assert_eq!(scoped.key_id(), "abcdef0123456789abcdef0123456789");
        assert_eq!(scoped.consent_scope(), "fedcba9876543210fedcba9876543210");
        assert!(scoped.has_explicit_scope());

        // A scope-shaped prefix followed by a too-short secret is the legacy form (regex
        // backtracking): the whole remainder is the secret.
        let short = format!("af_live_{}_{}_short", "a".repeat(32), "b".repeat(32));
        let parsed = ProductKey::parse(&short).unwrap();
        assert!(!parsed.has_explicit_scope());
        assert_eq!(parsed.consent_scope(), "a".repeat(32));

        for bad in [
            "",
            "af_live_",
            "af_live_0123456789abcdef0123456789abcdef_short",
            "af_live_0123456789abcdef0123456789abcdeg_conformance_secret_0123456789",
            "af_live_0123456789abcdef0123456789abcdef-conformance_secret_0123456789",
            "af_live_0123456789abcdef0123456789abcdef_twenty_chars_but\nnewline__",
            "xx_live_0123456789abcdef0123456789abcdef_conformance_secret_0123456789",
            "af_live_é123456789abcdef0123456789abcdef_conformance_secret_0123456789",
        ] {
            assert_eq!(
                ProductKey::parse(bad).unwrap_err(),
                ProductKeyError::Malformed,
                "{bad:?}"
            );
        }
        assert_eq!(
            ProductKey::parse("af_read_0123456789abcdef0123456789abcdef_conformance_secret_01234")
                .unwrap_err(),
            ProductKeyError::ReadKey
        );
        // Twenty UTF-16 units: ten astral characters are enough, as in JavaScript.
        let astral = format!("af_live_{}_{}", "c".repeat(32), "🚀".repeat(10));
        assert!(ProductKey::parse(&astral).is_ok());
    }

    #[test]
    fn secrets_never_appear_in_debug_output_or_errors() {
        let shown = format!("{:?}", key());
        assert!(!shown.contains("conformance_secret"), "{shown}");
        assert!(shown.contains("0123456789abcdef0123456789abcdef"));
        let err = ProductKey::parse("af_live_nothex_conformance_secret_0123456789").unwrap_err();
        assert!(!err.to_string().contains("conformance_secret"));

        let minted = mint(&key(), at(1_715_000_000), None);
        let shown = format!("{:?}", minted.handle);
        assert!(!shown.contains(minted.handle.as_str()));
        assert!(!shown.contains(&minted.claims.n));
    }

    #[test]
    fn mint_uses_fresh_ids_nonces_and_a_two_hour_lifetime() {
        let key = key();
        let now = at(1_715_000_000);
        let a = mint(&key, now, None);
        let b = mint(&key, now, None);
        assert_ne!(a.claims.i, b.claims.i);
        assert_ne!(a.claims.n, b.claims.n);
        assert_ne!(a.handle, b.handle);
        for minted in [&a, &b] {
            let id = Uuid::parse_str(&minted.claims.i).unwrap();
            assert_eq!(id.get_version_num(), 4);
            assert_eq!(minted.claims.n.len(), 24);
            assert_eq!(URL_SAFE_NO_PAD.decode(&minted.claims.n).unwrap().len(), 18);
            assert_eq!(minted.claims.iat, 1_715_000_000);
            assert_eq!(minted.claims.exp, 1_715_007_200);
            assert_eq!((minted.claims.s.as_ref(), minted.claims.r), (None, None));
            assert_eq!(
                verify(&key, minted.handle.as_str(), now),
                Ok(minted.claims.clone())
            );
        }

        let subject = key.subject("account_42");
        let ask_once = mint(&key, now, Some((subject.clone(), 0)));
        assert_eq!(ask_once.claims.s.as_deref(), Some(subject.as_str()));
        assert_eq!(ask_once.claims.r, Some(0));
        let json = ask_once.claims.to_json();
        assert!(
            json.ends_with(&format!(r#","s":"{subject}","r":0}}"#)),
            "{json}"
        );
        assert_eq!(
            verify(&key, ask_once.handle.as_str(), now),
            Ok(ask_once.claims)
        );
    }

    #[test]
    fn expired_and_premature_handles_fail() {
        let key = key();
        let minted = mint(&key, at(1_000_000), None);
        let token = minted.handle.as_str();
        assert!(verify(&key, token, at(1_000_000 + 7199)).is_ok());
        assert_eq!(
            verify(&key, token, at(1_000_000 + 7200)),
            Err(VerifyError::Expired)
        );
        assert_eq!(
            verify(&key, token, at(1_000_000 + 99_999)),
            Err(VerifyError::Expired)
        );
        // Five minutes of clock skew is tolerated, not more.
        assert!(verify(&key, token, at(1_000_000 - 300)).is_ok());
        assert_eq!(
            verify(&key, token, at(1_000_000 - 301)),
            Err(VerifyError::IssuedInFuture)
        );
    }

    fn with_claims(key: &ProductKey, edit: impl FnOnce(&mut Claims)) -> String {
        let mut claims = mint(key, at(1_000_000), None).claims;
        edit(&mut claims);
        sign(key, &claims).into_string()
    }

    #[test]
    fn every_server_claim_check_is_enforced() {
        let key = key();
        let now = at(1_000_000);
        let subject = key.subject("c1");
        let cases: Vec<(String, VerifyError)> = vec![
            (
                with_claims(&key, |c| c.v = 2),
                VerifyError::UnsupportedVersion,
            ),
            (
                with_claims(&key, |c| c.i = "not-a-uuid".into()),
                VerifyError::BadInteractionId,
            ),
            (
                with_claims(&key, |c| c.n = "x".repeat(15)),
                VerifyError::BadNonce,
            ),
            (
                with_claims(&key, |c| c.n = "x".repeat(129)),
                VerifyError::BadNonce,
            ),
            (
                with_claims(&key, |c| c.exp = c.iat + 7201),
                VerifyError::BadLifetime,
            ),
            (
                with_claims(&key, |c| {
                    c.iat += 200;
                    c.exp = c.iat - 100;
                }),
                VerifyError::BadLifetime,
            ),
            (
                with_claims(&key, |c| c.s = Some("afsub1_short".into())),
                VerifyError::BadSubject,
            ),
            (
                with_claims(&key, |c| c.r = Some(0)),
                VerifyError::BadRevision,
            ),
            (
                with_claims(&key, |c| {
                    c.s = Some(subject.clone());
                    c.r = Some(-1);
                }),
                VerifyError::BadRevision,
            ),
        ];
        for (token, expected) in cases {
            assert_eq!(verify(&key, &token, now), Err(expected));
        }
        assert!(verify(&key, &with_claims(&key, |c| c.n = "x".repeat(16)), now).is_ok());
        assert!(verify(&key, &with_claims(&key, |c| c.n = "x".repeat(128)), now).is_ok());
        // A subject without a revision is what a legacy signer sends; Epode accepts it.
        assert!(verify(
            &key,
            &with_claims(&key, |c| c.s = Some(subject.clone())),
            now
        )
        .is_ok());
    }

    #[test]
    fn tampered_tokens_fail() {
        let key = key();
        let now = at(1_000_000);
        let token = mint(&key, now, None).handle.into_string();
        let (input, signature) = token.rsplit_once('.').unwrap();
        let (prefix, payload) = input.rsplit_once('.').unwrap();

        // Flip one payload character: the signature no longer matches.
        let mut bytes = payload.as_bytes().to_vec();
        bytes[3] = if bytes[3] == b'A' { b'B' } else { b'A' };
        let forged = format!("{prefix}.{}.{signature}", String::from_utf8(bytes).unwrap());
        assert_eq!(verify(&key, &forged, now), Err(VerifyError::BadSignature));

        // Re-encode different claims under the old signature.
        let longer = with_claims(&key, |c| c.exp += 1);
        let other_payload = longer.split('.').nth(1).unwrap();
        let swapped = format!("{prefix}.{other_payload}.{signature}");
        assert_eq!(verify(&key, &swapped, now), Err(VerifyError::BadSignature));

        // A different key with the same key id (rotated secret) does not verify.
        let rotated =
            ProductKey::parse("af_live_0123456789abcdef0123456789abcdef_another_secret_0123456789")
                .unwrap();
        assert_eq!(
            verify(&rotated, &token, now),
            Err(VerifyError::BadSignature)
        );
        assert_eq!(
            verify(&scoped_key(), &token, now),
            Err(VerifyError::KeyMismatch)
        );

        let truncated_sig = &token[..token.len() - 2];
        assert_eq!(
            verify(&key, truncated_sig, now),
            Err(VerifyError::BadSignature)
        );
        for malformed in [
            "",
            "afr2_",
            "afr1_0123456789abcdef0123456789abcdef.e30.AAAA",
            "afr2_0123456789abcdef0123456789abcdef.e30",
            &format!("{token}.extra"),
        ] {
            assert_eq!(
                verify(&key, malformed, now),
                Err(VerifyError::Malformed),
                "{malformed}"
            );
        }
        // Correctly signed garbage claims are refused as claims, without a panic.
        for payload in [
            "not json",
            "{}",
            r#"{"v":1,"extra":true}"#,
            "[1]",
            "\u{fffd}",
        ] {
            let encoded = URL_SAFE_NO_PAD.encode(payload);
            let input = format!("afr2_{}.{encoded}", key.key_id());
            let sig = URL_SAFE_NO_PAD.encode(mac(&key.signing_key, input.as_bytes()));
            assert_eq!(
                verify(&key, &format!("{input}.{sig}"), now),
                Err(VerifyError::BadClaims),
                "{payload}"
            );
        }
        // An upper-case key id passes the key check (Epode parses it as a UUID) but changes
        // the signed input.
        let upper = token.replacen("abcdef", "ABCDEF", 1);
        assert_ne!(upper, token);
        assert_eq!(verify(&key, &upper, now), Err(VerifyError::BadSignature));
    }

    #[test]
    fn subject_matches_the_protocol_derivation() {
        // Independent derivation with the primitives, as protocol step 8 states it.
        let scope = "FEDCBA9876543210fedcba9876543210";
        let scope_key: [u8; 32] =
            Sha256::digest(b"epode-consent-scope:fedcba9876543210fedcba9876543210".as_slice())
                .into();
        let expected = format!(
            "afsub1_{}",
            URL_SAFE_NO_PAD.encode(mac(&scope_key, b"customer-ref:account_42"))
        );
        assert_eq!(subject(scope, "  account_42\u{feff}\n"), expected);
        assert_eq!(scoped_key().subject("account_42"), expected);
        assert!(valid_subject(&expected));
        assert_eq!(expected.len(), "afsub1_".len() + 43);
        assert_ne!(subject(scope, "account_43"), expected);
        // A legacy key's scope is its key id.
        assert_eq!(
            key().subject("x"),
            subject("0123456789abcdef0123456789abcdef", "x")
        );
    }

    #[test]
    fn subject_validation_is_strict() {
        let ok = format!("afsub1_{}", "a-_Z9".repeat(8) + "abc");
        assert!(valid_subject(&ok));
        assert!(!valid_subject(&ok[..ok.len() - 1]));
        assert!(!valid_subject(&format!("{ok}a")));
        assert!(!valid_subject(&ok.replace('a', "+")));
        assert!(!valid_subject(&ok.replacen("afsub1_", "afsub2_", 1)));
    }
}
