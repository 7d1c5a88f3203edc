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
use sha2::{Digest, Sha256};
use uuid::Uuid;

type HmacSha256 = Hmac<Sha256>;

/// Prefix of every feedback handle.
pub(crate) const HANDLE_PREFIX: &str = "afr2_";
/// Prefix of an Ask-once consent subject.
pub(crate) const SUBJECT_PREFIX: &str = "afsub1_";
/// A handle lives two hours: minted with `exp = iat + 7200`, rejected beyond that lifetime.
pub(crate) const HANDLE_LIFETIME_SECS: i64 = 2 * 60 * 60;
/// How far in the future `iat` may be before Epode rejects the handle.
pub(crate) const MAX_ISSUED_AHEAD_SECS: i64 = 5 * 60;
/// Random nonce length: 18 bytes encode to exactly 24 base64url characters.
const NONCE_BYTES: usize = 18;
const LIVE_PREFIX: &str = "af_live_";
const READ_PREFIX: &str = "af_read_";
const HEX_ID_LEN: usize = 32;
const MIN_SECRET_LEN: usize = 20;

/// Why a string is not a usable product (write) key. Never carries the key itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ProductKeyError {
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
pub(crate) struct ProductKey {
    full: String,
    key_id: String,
    consent_scope: String,
    /// HMAC-SHA256 keyed with the SHA-256 of the whole key, its key schedule done once: each
    /// handle clones it.
    signer: HmacSha256,
    /// HMAC-SHA256 keyed with the consent scope's SHA-256, prepared once: every Ask-once call
    /// derives a subject, and cloning skips the SHA-256 and the key schedule.
    subject_signer: HmacSha256,
}

impl ProductKey {
    /// Parses a key the way the reference SDKs do
    /// (`^af_live_([0-9a-fA-F]{32})_(?:([0-9a-fA-F]{32})_)?(.{20,})$`): the consent scope is
    /// taken when a valid secret still follows it, otherwise the key is the legacy form whose
    /// scope is the key id.
    pub(crate) fn parse(key: &str) -> Result<Self, ProductKeyError> {
        if key.starts_with(READ_PREFIX) {
            return Err(ProductKeyError::ReadKey);
        }
        let rest = key
            .strip_prefix(LIVE_PREFIX)
            .ok_or(ProductKeyError::Malformed)?;
        let (key_id, rest) = hex_id_then_underscore(rest).ok_or(ProductKeyError::Malformed)?;
        let scope = match hex_id_then_underscore(rest) {
            Some((scope, secret)) if valid_secret(secret) => scope,
            _ if valid_secret(rest) => key_id,
            _ => return Err(ProductKeyError::Malformed),
        };
        let signing_key: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        Ok(ProductKey {
            signer: new_mac(&signing_key),
            subject_signer: scope_mac(scope),
            full: key.to_owned(),
            key_id: key_id.to_ascii_lowercase(),
            consent_scope: scope.to_ascii_lowercase(),
        })
    }

    /// A fresh random write key for a local trial (`--dev`): it is only ever shown to the
    /// embedded Epode in the same process.
    pub(crate) fn ephemeral() -> Self {
        use rand::Rng as _;
        let mut rng = rand::rng();
        let hex = |rng: &mut rand::rngs::ThreadRng| -> String {
            (0..HEX_ID_LEN)
                .map(|_| char::from(b"0123456789abcdef"[rng.random_range(0..16)]))
                .collect()
        };
        let secret: String = (0..40)
            .map(|_| char::from(rng.sample(rand::distr::Alphanumeric)))
            .collect();
        let key = format!("{LIVE_PREFIX}{}_{}_{secret}", hex(&mut rng), hex(&mut rng));
        Self::parse(&key).unwrap_or_else(|_| unreachable!("a key built in the parsed form"))
    }

    /// The key id, lowercase, as it appears in every handle.
    #[cfg(test)]
    pub(crate) fn key_id(&self) -> &str {
        &self.key_id
    }

    /// The consent scope, lowercase (the key id for a legacy key without one).
    #[cfg(test)]
    pub(crate) fn consent_scope(&self) -> &str {
        &self.consent_scope
    }

    /// The whole key, for the `Authorization: Bearer` header of telemetry calls only.
    pub(crate) fn expose_secret(&self) -> &str {
        &self.full
    }

    /// The Ask-once consent subject for a customer of this product.
    pub(crate) fn subject(&self, customer_ref: &str) -> String {
        subject_with(self.subject_signer.clone(), customer_ref)
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

/// Whether `text` holds something shaped like an Epode key: `af_live_` or `af_read_` (in any
/// case) followed by a letter or digit. Such text is a secret wherever it was put, so it is
/// never printed; the sidecar's own `af_live_…` in a message does not count.
pub(crate) fn has_key_shape(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    [LIVE_PREFIX, READ_PREFIX].iter().any(|prefix| {
        lower.match_indices(prefix).any(|(at, _)| {
            lower[at + prefix.len()..]
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphanumeric())
        })
    })
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
pub(crate) struct Claims {
    /// Protocol version, always 1.
    pub(crate) v: u8,
    /// Interaction id (a UUID): also the telemetry `interactionId` and the consent/report key.
    pub(crate) i: String,
    /// Issued at, Unix seconds.
    pub(crate) iat: i64,
    /// Expires at, Unix seconds.
    pub(crate) exp: i64,
    /// Random nonce, base64url.
    pub(crate) n: String,
    /// Ask-once consent subject (`afsub1_…`), only with a customerRef.
    #[serde(default)]
    pub(crate) s: Option<String>,
    /// Consent revision the signer saw for `s` (0 when none is cached); only with `s`.
    #[serde(default)]
    pub(crate) r: Option<i64>,
}

impl Claims {
    /// Compact JSON in protocol order (`preserve_order` keeps insertion order); absent `s`/`r`
    /// are omitted, never null.
    #[cfg(test)]
    pub(crate) fn to_json(&self) -> String {
        String::from_utf8(self.to_json_bytes()).unwrap_or_default()
    }

    /// The same JSON as bytes, in a buffer sized once (claims are under 256 bytes but for a
    /// long subject): what the handle signs.
    fn to_json_bytes(&self) -> Vec<u8> {
        /// The claims as they are signed, written field by field (no map built first).
        #[derive(serde::Serialize)]
        struct Wire<'a> {
            v: u8,
            i: &'a str,
            iat: i64,
            exp: i64,
            n: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            s: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            r: Option<i64>,
        }
        let wire = Wire {
            v: self.v,
            i: &self.i,
            iat: self.iat,
            exp: self.exp,
            n: &self.n,
            s: self.s.as_deref(),
            r: self.r,
        };
        let mut out = Vec::with_capacity(256);
        // Writing these fields into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut out, &wire);
        out
    }
}

/// A signed `afr2_` handle. It is a bearer credential for one interaction's consent decision
/// and report, so `Debug` redacts it; use [`FeedbackHandle::as_str`] where the agent must see it.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct FeedbackHandle(String);

impl FeedbackHandle {
    /// Wraps a handle received from an agent. Nothing is checked: Epode verifies it (or call
    /// [`verify`] first).
    pub(crate) fn unverified(token: impl Into<String>) -> Self {
        FeedbackHandle(token.into())
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for FeedbackHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FeedbackHandle({HANDLE_PREFIX}<redacted>)")
    }
}

/// Signs `claims` with `key`.
pub(crate) fn sign(key: &ProductKey, claims: &Claims) -> FeedbackHandle {
    // The handle written once into a string of its final size: prefix, key id, payload, then
    // the signature of what precedes it.
    let json = claims.to_json_bytes();
    let mut handle = String::with_capacity(
        HANDLE_PREFIX.len() + key.key_id.len() + 2 + json.len().div_ceil(3) * 4 + 43,
    );
    handle.push_str(HANDLE_PREFIX);
    handle.push_str(&key.key_id);
    handle.push('.');
    URL_SAFE_NO_PAD.encode_string(&json, &mut handle);
    let mut mac = key.signer.clone();
    mac.update(handle.as_bytes());
    let signature: [u8; 32] = mac.finalize().into_bytes().into();
    handle.push('.');
    URL_SAFE_NO_PAD.encode_string(signature, &mut handle);
    FeedbackHandle(handle)
}

/// A freshly minted handle and the claims inside it.
#[derive(Debug, Clone)]
pub(crate) struct Minted {
    pub(crate) claims: Claims,
    pub(crate) handle: FeedbackHandle,
}

/// Random bytes of a bound handle's nonce, and of the tag that follows them.
const BOUND_RANDOM: usize = 12;
const BOUND_TAG: usize = 12;

/// The tag that binds a handle whose nonce starts with `random` to `caller` (a stable id of
/// the caller it was issued to): HMAC-SHA256 with the product key's signing key, apart from
/// the signature by its own label. Any replica with the key computes the same.
fn binding_tag(key: &ProductKey, random: &[u8], caller: &[u8]) -> [u8; BOUND_TAG] {
    let mut mac = key.signer.clone();
    mac.update(b"epode-sidecar handle binding\0");
    mac.update(random);
    mac.update(caller);
    let full: [u8; 32] = mac.finalize().into_bytes().into();
    let mut tag = [0_u8; BOUND_TAG];
    tag.copy_from_slice(&full[..BOUND_TAG]);
    tag
}

/// Whether a handle (its verified `claims`) is bound to a caller at all: minted with one
/// ([`mint`]), its nonce is random bytes then their tag.
pub(crate) fn is_bound(claims: &Claims) -> bool {
    URL_SAFE_NO_PAD
        .decode(&claims.n)
        .is_ok_and(|n| n.len() == BOUND_RANDOM + BOUND_TAG)
}

/// Whether a handle (its verified `claims`) was issued to `caller`: its nonce is random bytes
/// then their tag for that caller ([`mint`] with a caller). A handle issued to no caller, or
/// to another, is not.
pub(crate) fn issued_to(key: &ProductKey, claims: &Claims, caller: &[u8]) -> bool {
    let Ok(nonce) = URL_SAFE_NO_PAD.decode(&claims.n) else {
        return false;
    };
    if nonce.len() != BOUND_RANDOM + BOUND_TAG {
        return false;
    }
    let (random, tag) = nonce.split_at(BOUND_RANDOM);
    let want = binding_tag(key, random, caller);
    // Constant time: the tag is a credential of a kind.
    want.iter().zip(tag).fold(0_u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// Mints the handle for one product tool call: a fresh UUID v4 interaction id and nonce,
/// `exp = iat + 2 h`, and for Ask once with a customerRef the subject and the revision from the
/// consent cache. With `caller` (a verified caller's stable id: auth is on), the nonce binds the
/// handle to it ([`issued_to`]); the nonce stays a 16-to-128-character base64url string to
/// Epode.
pub(crate) fn mint(
    key: &ProductKey,
    now: SystemTime,
    subject_and_revision: Option<(String, u64)>,
    caller: Option<&[u8]>,
) -> Minted {
    let iat = unix_seconds(now);
    let n = match caller {
        None => {
            let mut nonce = [0_u8; NONCE_BYTES];
            rand::rng().fill_bytes(&mut nonce);
            URL_SAFE_NO_PAD.encode(nonce)
        }
        Some(caller) => {
            let mut nonce = [0_u8; BOUND_RANDOM + BOUND_TAG];
            let (random, tag) = nonce.split_at_mut(BOUND_RANDOM);
            rand::rng().fill_bytes(random);
            tag.copy_from_slice(&binding_tag(key, random, caller));
            URL_SAFE_NO_PAD.encode(nonce)
        }
    };
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
        n,
        s,
        r,
    };
    let handle = sign(key, &claims);
    Minted { claims, handle }
}

/// Why a handle is refused. Epode answers every one of these with 401.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum VerifyError {
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
pub(crate) fn verify(
    key: &ProductKey,
    token: &str,
    now: SystemTime,
) -> Result<Claims, VerifyError> {
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
    let mut verifier = key.signer.clone();
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
pub(crate) fn valid_subject(value: &str) -> bool {
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
#[cfg(test)]
pub(crate) fn subject(consent_scope: &str, customer_ref: &str) -> String {
    subject_with(scope_mac(consent_scope), customer_ref)
}

/// The keyed MAC a scope's subjects are derived with (the scope's case does not matter).
fn scope_mac(consent_scope: &str) -> HmacSha256 {
    let mut hasher = Sha256::new();
    hasher.update(b"epode-consent-scope:");
    hasher.update(consent_scope.to_ascii_lowercase().as_bytes());
    new_mac(&hasher.finalize().into())
}

fn subject_with(mut mac: HmacSha256, customer_ref: &str) -> String {
    mac.update(b"customer-ref:");
    mac.update(customer_ref.trim_matches(is_js_whitespace).as_bytes());
    let mut out = String::with_capacity(SUBJECT_PREFIX.len() + 43);
    out.push_str(SUBJECT_PREFIX);
    URL_SAFE_NO_PAD.encode_string(mac.finalize().into_bytes(), &mut out);
    out
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

#[cfg(test)]
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
mod tests;
