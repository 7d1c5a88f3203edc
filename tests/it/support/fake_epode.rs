//! A strict, in-process fake of the Epode Agent Feedback API for black-box tests.
//!
//! Modelled on the public backend (open-software-network/os-agent-feedback,
//! `backend/src/{main,store,security,issue_template}.rs`, `backend/openapi.json`) and on
//! the protocol schemas in `protocol/epode-v1/`. It reproduces the
//! observable wire behaviour (statuses, bodies, idempotency, validation order), not
//! the implementation. The `afr2_` capability verification and the consent-subject
//! derivation below are written independently of the sidecar's own code, so the
//! sidecar's signing is checked against a second implementation.
//!
//! Usage: `let epode = FakeEpode::start(FakeConfig::new(key, "ask_always"));` then
//! point the sidecar at `epode.url()`. The server runs on its own thread with its own
//! tokio runtime, so it works from both plain `#[test]`s and `#[tokio::test]`s, and it
//! stops (closing its port) when the `FakeEpode` is dropped.
#![allow(dead_code, unreachable_pub)]

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use bytes::Bytes;
use hmac::{Hmac, Mac};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

#[path = "fake_epode/enrichment.rs"]
mod enrichment;
pub use enrichment::StoredRequest;

/// Where the protocol schemas and `conformance.json` are read from.
pub const PROTOCOL_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/protocol/epode-v1");

/// The real service's body limit (axum `DefaultBodyLimit::max(64 * 1024)`).
pub const BODY_LIMIT: usize = 64 * 1024;

/// Text carried by every injected error body. Tests assert it is never relayed.
pub const FAULT_SECRET: &str = "internal detail XYZ";

/// A valid-format product key (keyId + consentScope + secret) for demos and tests.
/// It is not a real credential.
pub const DEMO_PRODUCT_KEY: &str =
    "af_live_0123456789abcdef0123456789abcdef_fedcba9876543210fedcba9876543210_demo_secret_not_a_real_key";

/// Workspace id reported in every accepted report.
pub const FAKE_WORKSPACE_ID: &str = "00000000-0000-4000-8000-00000000e90d";

/// How long a body is drained after it went over the limit before the connection is cut.
const DRAIN_CAP: usize = 8 * 1024 * 1024;

const PRIVACY: &str =
    "Never include prompts, transcripts, credentials, personal data, or raw product content.";

// ---------------------------------------------------------------------------------------
// Configuration and public types
// ---------------------------------------------------------------------------------------

/// Configuration of one fake instance.
#[derive(Clone, Debug)]
pub struct FakeConfig {
    /// The product's write key (`af_live_…`). Company-key calls must present exactly this
    /// key; capabilities must be signed with it.
    pub product_key: String,
    /// `never_ask`, `ask_once`, `ask_always` or `off`. Anything else behaves like the
    /// real service with a corrupt policy (500).
    pub mode: String,
    /// Fixed "now" in unix seconds for handle checks, the telemetry window and
    /// timestamps (the conformance vector expired in 2024).
    pub now_override: Option<u64>,
    /// Base URL used in envelopes (`submit.url`). Defaults to [`FakeEpode::url`].
    pub public_base_url: Option<String>,
    /// Product name used by the introspection endpoint.
    pub product_name: String,
    /// Port to bind on 127.0.0.1 (0 = ephemeral).
    pub port: u16,
    /// Treat the product key as expired: company-key calls → 401 `API key expired`,
    /// capabilities → 401.
    pub key_expired: bool,
    /// Log one line per request (method, path, status) to stderr.
    pub log_requests: bool,
    /// Directory holding the protocol JSON files.
    pub protocol_dir: PathBuf,
}

impl FakeConfig {
    pub fn new(product_key: impl Into<String>, mode: impl Into<String>) -> Self {
        Self {
            product_key: product_key.into(),
            mode: mode.into(),
            ..Self::default()
        }
    }

    pub fn with_now(mut self, unix_seconds: u64) -> Self {
        self.now_override = Some(unix_seconds);
        self
    }

    pub fn with_public_base_url(mut self, url: impl Into<String>) -> Self {
        self.public_base_url = Some(url.into());
        self
    }
}

impl Default for FakeConfig {
    fn default() -> Self {
        Self {
            product_key: DEMO_PRODUCT_KEY.to_owned(),
            mode: "never_ask".to_owned(),
            now_override: None,
            public_base_url: None,
            product_name: "Demo Product".to_owned(),
            port: 0,
            key_expired: false,
            log_requests: false,
            protocol_dir: PathBuf::from(PROTOCOL_DIR),
        }
    }
}

/// The routes of the fake. `Other` collects everything else (404s, health).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    Telemetry,
    ConsentDecisions,
    ConsentState,
    Reports,
    Introspect,
    /// Customer context: the product's request, and the agent's inspect, consent, answers.
    Enrichment,
    EnrichmentInspect,
    EnrichmentConsent,
    EnrichmentAnswers,
    Other,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Self::Telemetry => "/api/v2/telemetry/batches",
            Self::ConsentDecisions => "/api/v2/consent/decisions",
            Self::ConsentState => "/api/v2/consent/state",
            Self::Reports => "/api/v2/reports",
            Self::Introspect => "/api/v2/capabilities/introspect",
            Self::Enrichment => "/api/v2/enrichment/requests",
            Self::EnrichmentInspect => "/api/v2/enrichment/requests/inspect",
            Self::EnrichmentConsent => "/api/v2/enrichment/consent/decisions",
            Self::EnrichmentAnswers => "/api/v2/enrichment/answers",
            Self::Other => "",
        }
    }

    pub fn for_path(path: &str) -> Self {
        [
            Self::Telemetry,
            Self::ConsentDecisions,
            Self::ConsentState,
            Self::Reports,
            Self::Introspect,
            Self::Enrichment,
            Self::EnrichmentInspect,
            Self::EnrichmentConsent,
            Self::EnrichmentAnswers,
        ]
        .into_iter()
        .find(|endpoint| endpoint.path() == path)
        .unwrap_or(Self::Other)
    }
}

/// A fault, consumed by exactly one request on its endpoint (FIFO); afterwards the
/// endpoint behaves normally again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Answer with this status and a JSON error body containing [`FAULT_SECRET`]. The
    /// request is not processed.
    Status(u16),
    /// Like `Status`, plus `Retry-After: <seconds>`.
    StatusRetryAfter(u16, u64),
    /// Process the request normally (state changes happen at once) but hold the
    /// response back for this long — to provoke client timeouts.
    Delay(Duration),
    /// Telemetry: 202 whose `accepted` is one less than the acceptable events; the last
    /// acceptable event is not stored.
    ShortAccepted,
    /// Telemetry: move `n` acceptable events to `dropped` (the last `n` are not stored).
    Dropped(usize),
    /// Process normally, but answer a success with a non-JSON body (still labelled
    /// `application/json`).
    MalformedReceipt,
    /// Process normally, but answer a success with JSON of the wrong types
    /// (`{"accepted":"all","dropped":null}`).
    WrongTypedReceipt,
    /// Close the connection without any response.
    Hangup,
    /// Answer `307 Temporary Redirect` to this path on the fake, without processing: a
    /// client that follows it shows up as a request to [`Endpoint::Other`].
    Redirect(String),
    /// Process normally, but pad a success body with a `padding` field of this many bytes.
    Oversized(usize),
    /// Telemetry: process normally, but answer a receipt whose counts overflow a u64 when
    /// added (`{"accepted":18446744073709551615,"dropped":1}`).
    ReceiptOverflow,
}

/// What a telemetry batch costs the fake, modelled on the real backend: the batch is held
/// for `base + per_event × events` before it is stored and answered, and at most `at_once`
/// batches are processed together (the database pool); the others wait their turn, which
/// counts in their round trip as it does on the real service. Faults that answer without
/// processing (a status, a redirect, a hang-up) cost nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchCost {
    pub base: Duration,
    pub per_event: Duration,
    pub at_once: usize,
}

impl BatchCost {
    /// The real backend as measured (issue 21): about 50 ms plus 1.2 ms per event (each
    /// event is its own savepoint), a pool of 10 connections.
    pub fn modelled() -> Self {
        Self {
            base: Duration::from_millis(50),
            per_event: Duration::from_micros(1200),
            at_once: 10,
        }
    }

    /// A fast Epode: 5 ms a batch, whatever its size, 10 at once.
    pub fn fast() -> Self {
        Self {
            base: Duration::from_millis(5),
            per_event: Duration::ZERO,
            at_once: 10,
        }
    }

    /// How long one batch of `events` is held.
    pub fn of(&self, events: usize) -> Duration {
        self.base + self.per_event * u32::try_from(events).unwrap_or(u32::MAX)
    }

    /// Events a second the fake stores at most, with batches of `batch` events.
    pub fn capacity(&self, batch: usize) -> f64 {
        self.at_once.max(1) as f64 * batch as f64 / self.of(batch).as_secs_f64()
    }
}

/// One request as the fake saw it.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub endpoint: Endpoint,
    pub method: String,
    pub path: String,
    /// Header names are lowercase; repeated headers are joined with ", ".
    pub headers: BTreeMap<String, String>,
    /// The parsed JSON body, or `Null` when there was none or it was not JSON.
    pub body: Value,
    /// The raw body (lossy UTF-8, at most [`BODY_LIMIT`] bytes kept).
    pub raw_body: String,
    /// Response status; 0 when the connection was closed without a response (or the
    /// request is still in flight).
    pub status: u16,
    /// Arrival time.
    pub at: Instant,
    /// When the answer was ready to be sent (`None` for a hang-up, or while in flight).
    pub answered: Option<Instant>,
    /// The fault this request consumed, if any.
    pub fault: Option<Fault>,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }
}

/// The first decision recorded for an interaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredDecision {
    pub interaction_id: String,
    pub decision: String,
    pub subject: Option<String>,
    pub decided_at: String,
}

/// The Ask-once state of an opaque subject.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubjectState {
    pub decision: String,
    pub revision: i64,
    pub decided_at: String,
    pub flipped_from: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Every request that reached the fake (including hung-up ones).
    pub requests: usize,
    /// Requests whose connection was closed without a response.
    pub hangups: usize,
    /// Faults consumed.
    pub faults: usize,
    /// Telemetry events accepted / dropped (as reported in receipts).
    pub events_accepted: usize,
    pub events_dropped: usize,
    /// Interactions whose first consent decision was recorded.
    pub decisions_recorded: usize,
    /// Reports stored / duplicate report submissions answered with the first one.
    pub reports_accepted: usize,
    pub duplicate_reports: usize,
}

/// Verified claims of an `afr2_` capability.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandleClaims {
    pub v: u8,
    /// Canonical (lowercase, hyphenated) interaction id.
    pub i: String,
    pub iat: i64,
    pub exp: i64,
    pub n: String,
    pub s: Option<String>,
    pub r: Option<i64>,
}

// ---------------------------------------------------------------------------------------
// Independent capability / subject implementation
// ---------------------------------------------------------------------------------------

/// The parts of a product key: (keyId lowercase, consentScope lowercase). The legacy
/// form has no consentScope; its scope is the keyId. Mirrors the SDK pattern
/// `^af_live_([0-9a-fA-F]{32})_(?:([0-9a-fA-F]{32})_)?(.{20,})$`.
pub fn product_key_parts(product_key: &str) -> Option<(String, String)> {
    fn hex32(text: &str) -> bool {
        text.len() == 32 && text.bytes().all(|byte| byte.is_ascii_hexdigit())
    }
    fn secret_ok(text: &str) -> bool {
        // JavaScript's `.` excludes line terminators.
        text.chars().count() >= 20
            && !text
                .chars()
                .any(|c| matches!(c, '\n' | '\r' | '\u{2028}' | '\u{2029}'))
    }
    let rest = product_key.strip_prefix("af_live_")?;
    let key_id = rest.get(..32).filter(|text| hex32(text))?;
    let rest = rest.get(32..)?.strip_prefix('_')?;
    if let Some(scope) = rest.get(..32).filter(|text| hex32(text)) {
        if let Some(secret) = rest.get(32..).and_then(|tail| tail.strip_prefix('_')) {
            if secret_ok(secret) {
                return Some((key_id.to_ascii_lowercase(), scope.to_ascii_lowercase()));
            }
        }
    }
    secret_ok(rest).then(|| (key_id.to_ascii_lowercase(), key_id.to_ascii_lowercase()))
}

/// `afsub1_` + b64url(HMAC-SHA256(SHA256("epode-consent-scope:" + scope),
/// "customer-ref:" + trimmed customerRef)).
pub fn consent_subject(product_key: &str, customer_ref: &str) -> Option<String> {
    let (_, scope) = product_key_parts(product_key)?;
    let consent_key = Sha256::digest(format!("epode-consent-scope:{scope}").as_bytes());
    let mut mac = HmacSha256::new_from_slice(&consent_key).ok()?;
    mac.update(format!("customer-ref:{}", customer_ref.trim()).as_bytes());
    Some(format!(
        "afsub1_{}",
        URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
    ))
}

/// Whether `value` has the shape of an opaque consent subject.
pub fn valid_subject(value: &str) -> bool {
    value.strip_prefix("afsub1_").is_some_and(|tail| {
        tail.len() == 43
            && tail
                .bytes()
                .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_')
    })
}

/// Signs `claims` exactly as given (compact JSON, key order preserved) with the
/// product key. For tests that need hand-made (also invalid) capabilities.
pub fn mint_handle(product_key: &str, claims: &Value) -> Option<String> {
    let (key_id, _) = product_key_parts(product_key)?;
    let payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims).ok()?);
    let signing_input = format!("afr2_{key_id}.{payload}");
    let signature = hmac_b64(product_key, &signing_input)?;
    Some(format!("{signing_input}.{signature}"))
}

/// The claims of a capability, decoded without any verification.
pub fn decode_handle(token: &str) -> Option<Value> {
    let payload = token.strip_prefix("afr2_")?.split('.').nth(1)?;
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).ok()?).ok()
}

fn hmac_b64(product_key: &str, signing_input: &str) -> Option<String> {
    let signing_key = Sha256::digest(product_key.as_bytes());
    let mut mac = HmacSha256::new_from_slice(&signing_key).ok()?;
    mac.update(signing_input.as_bytes());
    Some(URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireClaims {
    v: u8,
    i: String,
    iat: i64,
    exp: i64,
    n: String,
    #[serde(default)]
    s: Option<String>,
    #[serde(default)]
    r: Option<i64>,
}

// chrono's representable range; the real service rejects timestamps outside it.
const MIN_TIMESTAMP: i64 = -8_334_632_851_200;
const MAX_TIMESTAMP: i64 = 8_210_298_412_799;

/// Verifies an `afr2_` capability against `product_key` at `now` (unix seconds), the
/// way the real service does (`security.rs` `parse_capability` + `verify_capability`
/// and the active-write-key lookup). The error says which check failed.
pub fn verify_handle(product_key: &str, token: &str, now: i64) -> Result<HandleClaims, String> {
    let encoded = token
        .strip_prefix("afr2_")
        .ok_or("token does not start with afr2_")?;
    let parts: Vec<&str> = encoded.split('.').collect();
    let [key_id_text, payload, signature_text] = parts.as_slice() else {
        return Err("token must have exactly three dot-separated segments".into());
    };
    let token_key_id =
        uuid::Uuid::parse_str(key_id_text).map_err(|_| "keyId is not a UUID".to_owned())?;
    let payload_bytes = URL_SAFE_NO_PAD
        .decode(payload)
        .map_err(|_| "payload is not unpadded base64url".to_owned())?;
    let claims: WireClaims = serde_json::from_slice(&payload_bytes)
        .map_err(|error| format!("claims do not parse: {error}"))?;
    let signature = URL_SAFE_NO_PAD
        .decode(signature_text)
        .map_err(|_| "signature is not unpadded base64url".to_owned())?;
    let (key_id, _) = product_key_parts(product_key).ok_or("configured key has no keyId")?;
    let configured_key_id =
        uuid::Uuid::parse_str(&key_id).map_err(|_| "configured keyId is not a UUID".to_owned())?;
    if token_key_id != configured_key_id {
        return Err("keyId is not an active write key".into());
    }
    let signing_key = Sha256::digest(product_key.as_bytes());
    let mut mac = HmacSha256::new_from_slice(&signing_key).map_err(|error| error.to_string())?;
    mac.update(format!("afr2_{key_id_text}.{payload}").as_bytes());
    mac.verify_slice(&signature)
        .map_err(|_| "signature does not verify".to_owned())?;
    let interaction = uuid::Uuid::parse_str(&claims.i)
        .map_err(|_| "claim i is not a UUID".to_owned())?
        .hyphenated()
        .to_string();
    let in_range = |value: i64| (MIN_TIMESTAMP..=MAX_TIMESTAMP).contains(&value);
    if !in_range(claims.iat) || !in_range(claims.exp) {
        return Err("iat/exp out of range".into());
    }
    let (iat, exp, now) = (
        i128::from(claims.iat),
        i128::from(claims.exp),
        i128::from(now),
    );
    if claims.v != 1 {
        return Err("v must be 1".into());
    }
    if !(16..=128).contains(&claims.n.len()) {
        return Err("n must be 16..=128 bytes".into());
    }
    if claims.s.as_deref().is_some_and(|s| !valid_subject(s)) {
        return Err("s is not a valid subject".into());
    }
    if claims.r.is_some_and(|r| r < 0) {
        return Err("r must be >= 0".into());
    }
    if claims.r.is_some() && claims.s.is_none() {
        return Err("r requires s".into());
    }
    if iat > now + 300 {
        return Err("iat is more than 5 minutes in the future".into());
    }
    if exp <= now {
        return Err("capability expired".into());
    }
    if exp - iat > 7200 {
        return Err("exp - iat exceeds 2 hours".into());
    }
    if exp <= iat {
        return Err("exp must be after iat".into());
    }
    Ok(HandleClaims {
        v: claims.v,
        i: interaction,
        iat: claims.iat,
        exp: claims.exp,
        n: claims.n,
        s: claims.s,
        r: claims.r,
    })
}

// ---------------------------------------------------------------------------------------
// Content policy (forbidden keys, sensitive text) — same rules as the real service
// ---------------------------------------------------------------------------------------

const FORBIDDEN_KEYS: &[&str] = &[
    "prompt",
    "prompts",
    "transcript",
    "messages",
    "raw_input",
    "raw_output",
    "tool_input",
    "tool_output",
    "secret",
    "api_key",
    "authorization",
    "customer_data",
    "email",
    "name",
    "user",
    "user_data",
    "personal_data",
];

const FORBIDDEN_KEYS_MESSAGE: &str =
    "Raw prompts, transcripts, secrets, customer data, and tool payloads are not accepted";

/// Recursively looks for a forbidden key (case-insensitive, `-` treated as `_`).
pub fn has_forbidden_key(value: &Value) -> bool {
    match value {
        Value::Object(object) => {
            object.keys().any(|key| {
                let normalized: String = key
                    .chars()
                    .flat_map(char::to_lowercase)
                    .map(|c| if c == '-' { '_' } else { c })
                    .collect();
                FORBIDDEN_KEYS.contains(&normalized.as_str())
            }) || object.values().any(has_forbidden_key)
        }
        Value::Array(items) => items.iter().any(has_forbidden_key),
        _ => false,
    }
}

/// The report-admission text policy: credential forms, emails, `password`, prompt
/// echoes.
pub fn contains_sensitive_text(value: &str) -> bool {
    let aws_key = ["AKIA", "ASIA"].iter().any(|prefix| {
        value.match_indices(prefix).any(|(index, _)| {
            let tail = &value[index + prefix.len()..];
            tail.len() >= 12
                && tail
                    .chars()
                    .take(12)
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
        })
    });
    let lower = value.to_ascii_lowercase();
    let pattern = [
        "af_live_",
        "af_read_",
        "github_pat_",
        "ghp_",
        "aws_secret",
        "sk-ant-",
        "-----begin ",
        "xoxb-",
        "xoxp-",
        "sk-proj-",
        "api key",
        "password",
        "prompt was",
        "user asked",
        "transcript:",
        "prompt:",
        "raw input:",
        "raw output:",
    ]
    .iter()
    .any(|needle| lower.contains(needle));
    let email = lower.split_whitespace().any(|word| {
        let word = word.trim_matches(|c: char| !c.is_ascii_alphanumeric() && !"@._+-".contains(c));
        word.split_once('@')
            .is_some_and(|(local, domain)| !local.is_empty() && domain.contains('.'))
    });
    let bearer = lower.match_indices("bearer ").any(|(index, _)| {
        let candidate = lower[index + "bearer ".len()..]
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .trim_matches(|c: char| !c.is_ascii_alphanumeric() && !"-._~+/=".contains(c));
        candidate.len() >= 20
            && candidate
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-._~+/=".contains(c))
    });
    pattern || email || bearer || aws_key
}

/// Collapses whitespace runs and truncates to `max` characters (the service's `clean`).
fn clean(value: &str, max: usize) -> String {
    value
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(max)
        .collect()
}

// ---------------------------------------------------------------------------------------
// Time helpers (RFC 3339 without chrono)
// ---------------------------------------------------------------------------------------

fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `2024-05-06T12:53:20.123456Z` (chrono's serde form: fraction only when non-zero).
pub fn format_timestamp(seconds: i64, nanos: u32) -> String {
    let base = format_seconds(seconds);
    let fraction = if nanos == 0 {
        String::new()
    } else if nanos % 1_000_000 == 0 {
        format!(".{:03}", nanos / 1_000_000)
    } else if nanos % 1_000 == 0 {
        format!(".{:06}", nanos / 1_000)
    } else {
        format!(".{nanos:09}")
    };
    format!("{base}{fraction}Z")
}

/// `2024-05-06T14:53:20+00:00` (chrono's `to_rfc3339` form used in envelopes).
pub fn format_offset_timestamp(seconds: i64) -> String {
    format!("{}+00:00", format_seconds(seconds))
}

fn format_seconds(seconds: i64) -> String {
    let days = seconds.div_euclid(86_400);
    let rem = seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Parses an RFC 3339 date-time into nanoseconds since the epoch.
pub fn parse_rfc3339(text: &str) -> Option<i128> {
    let bytes = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| -> Option<i64> {
        let slice = text.get(range)?;
        (!slice.is_empty() && slice.bytes().all(|b| b.is_ascii_digit()))
            .then(|| slice.parse().ok())
            .flatten()
    };
    if bytes.len() < 20
        || bytes[4] != b'-'
        || bytes[7] != b'-'
        || !matches!(bytes[10], b'T' | b't' | b' ')
        || bytes[13] != b':'
        || bytes[16] != b':'
    {
        return None;
    }
    let (year, month, day) = (digits(0..4)?, digits(5..7)?, digits(8..10)?);
    let (hour, minute, second) = (digits(11..13)?, digits(14..16)?, digits(17..19)?);
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let month_days = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1..=12).contains(&month)
        || day < 1
        || day > month_days[usize::try_from(month - 1).ok()?]
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut index = 19;
    let mut nanos: i128 = 0;
    if bytes.get(index) == Some(&b'.') {
        index += 1;
        let start = index;
        while bytes.get(index).is_some_and(u8::is_ascii_digit) {
            index += 1;
        }
        let fraction = text.get(start..index)?;
        if fraction.is_empty() {
            return None;
        }
        let padded: String = fraction
            .chars()
            .chain(std::iter::repeat('0'))
            .take(9)
            .collect();
        nanos = padded.parse().ok()?;
    }
    let offset_seconds: i64 = match text.get(index..)? {
        "Z" | "z" => 0,
        tail if tail.len() == 6 && tail.as_bytes()[3] == b':' => {
            let sign = match tail.as_bytes()[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let hours = digits(index + 1..index + 3)?;
            let minutes = digits(index + 4..index + 6)?;
            if hours > 23 || minutes > 59 {
                return None;
            }
            sign * (hours * 3600 + minutes * 60)
        }
        _ => return None,
    };
    let seconds =
        days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second.min(59)
            - offset_seconds;
    Some(i128::from(seconds) * 1_000_000_000 + nanos)
}

// ---------------------------------------------------------------------------------------
// Server state
// ---------------------------------------------------------------------------------------

struct Schemas {
    telemetry: jsonschema::Validator,
    report: jsonschema::Validator,
    decision: jsonschema::Validator,
}

fn load_protocol_json(dir: &std::path::Path, name: &str) -> Result<Value, String> {
    let path = dir.join(name);
    let text = std::fs::read_to_string(&path)
        .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
    serde_json::from_str(&text).map_err(|error| format!("{} is not JSON: {error}", path.display()))
}

impl Schemas {
    fn load(dir: &std::path::Path) -> Result<Self, String> {
        let build = |name: &str| -> Result<jsonschema::Validator, String> {
            let schema = load_protocol_json(dir, name)?;
            jsonschema::options()
                .should_validate_formats(true)
                .build(&schema)
                .map_err(|error| format!("{name} does not compile: {error}"))
        };
        Ok(Self {
            telemetry: build("telemetry-batch.schema.json")?,
            report: build("feedback-report.schema.json")?,
            decision: build("consent-decision.schema.json")?,
        })
    }
}

struct InteractionConsent {
    decision: String,
    decided_at: String,
    applied_subject_revision: Option<i64>,
}

struct State {
    mode: String,
    now_override: Option<u64>,
    key_expired: bool,
    down: bool,
    faults: HashMap<Endpoint, VecDeque<Fault>>,
    requests: Vec<Recorded>,
    in_flight: HashMap<Endpoint, usize>,
    max_in_flight: HashMap<Endpoint, usize>,
    /// Telemetry batches being processed under the cost model, and the most at once.
    processing: usize,
    max_processing: usize,
    batch_cost: Option<(BatchCost, Arc<tokio::sync::Semaphore>)>,
    /// Whether request bodies and every event delivery are kept (a benchmark turns it off
    /// to keep memory flat; the stored events and the counters are always kept).
    keep_bodies: bool,
    events: Vec<Value>,
    event_index: HashMap<String, usize>,
    deliveries: Vec<Value>,
    dropped: Vec<(Value, String)>,
    consents: HashMap<String, InteractionConsent>,
    decision_log: Vec<StoredDecision>,
    subjects: HashMap<String, SubjectState>,
    reports: Vec<Value>,
    report_index: HashMap<String, usize>,
    foreign: HashSet<String>,
    counters: Counters,
    enrichment: enrichment::Store,
}

impl State {
    /// Now as (seconds, nanos) since the epoch.
    fn now(&self) -> (i64, u32) {
        if let Some(seconds) = self.now_override {
            return (i64::try_from(seconds).unwrap_or(i64::MAX), 0);
        }
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        (
            i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
            // Postgres keeps microseconds.
            since.subsec_micros() * 1000,
        )
    }

    fn now_text(&self) -> String {
        let (seconds, nanos) = self.now();
        format_timestamp(seconds, nanos)
    }
}

struct Shared {
    state: Mutex<State>,
    product_key: String,
    public_base_url: String,
    product_name: String,
    log_requests: bool,
    schemas: Schemas,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

// ---------------------------------------------------------------------------------------
// The handle
// ---------------------------------------------------------------------------------------

/// A running fake. Dropping it stops the server and closes the port.
pub struct FakeEpode {
    addr: SocketAddr,
    url: String,
    shared: Arc<Shared>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl fmt::Debug for FakeEpode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeEpode")
            .field("addr", &self.addr)
            .finish()
    }
}

impl FakeEpode {
    /// Starts the fake; panics when it cannot (missing schemas, port in use).
    pub fn start(config: FakeConfig) -> Self {
        Self::try_start(config)
            .unwrap_or_else(|error| panic!("fake Epode failed to start: {error}"))
    }

    pub fn try_start(config: FakeConfig) -> std::io::Result<Self> {
        let schemas = Schemas::load(&config.protocol_dir).map_err(std::io::Error::other)?;
        let listener = std::net::TcpListener::bind(("127.0.0.1", config.port))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let url = format!("http://{addr}");
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                mode: config.mode.clone(),
                now_override: config.now_override,
                key_expired: config.key_expired,
                down: false,
                faults: HashMap::new(),
                requests: Vec::new(),
                in_flight: HashMap::new(),
                max_in_flight: HashMap::new(),
                processing: 0,
                max_processing: 0,
                batch_cost: None,
                keep_bodies: true,
                events: Vec::new(),
                event_index: HashMap::new(),
                deliveries: Vec::new(),
                dropped: Vec::new(),
                consents: HashMap::new(),
                decision_log: Vec::new(),
                subjects: HashMap::new(),
                reports: Vec::new(),
                report_index: HashMap::new(),
                foreign: HashSet::new(),
                counters: Counters::default(),
                enrichment: enrichment::Store::default(),
            }),
            product_key: config.product_key.clone(),
            public_base_url: config
                .public_base_url
                .clone()
                .unwrap_or_else(|| url.clone())
                .trim_end_matches('/')
                .to_owned(),
            product_name: config.product_name.clone(),
            log_requests: config.log_requests,
            schemas,
        });
        let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<std::io::Result<()>>();
        let server_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("fake-epode".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("fake-epode-worker")
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(error) => {
                        let _ = ready_tx.send(Err(error));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => listener,
                        Err(error) => {
                            let _ = ready_tx.send(Err(error));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok(()));
                    accept_loop(listener, server_shared, shutdown_rx).await;
                });
                runtime.shutdown_timeout(Duration::from_millis(500));
            })?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(error)) => return Err(error),
            Err(_) => return Err(std::io::Error::other("fake Epode thread died")),
        }
        Ok(Self {
            addr,
            url,
            shared,
            shutdown: Some(shutdown_tx),
            thread: Some(thread),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Base URL, e.g. `http://127.0.0.1:PORT` (no trailing slash).
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// Full URL of an endpoint.
    pub fn endpoint_url(&self, endpoint: Endpoint) -> String {
        format!("{}{}", self.url, endpoint.path())
    }

    pub fn product_key(&self) -> &str {
        &self.shared.product_key
    }

    /// Stops the server (same as dropping it).
    pub fn stop(self) {}

    // -- control ------------------------------------------------------------------------

    pub fn inject(&self, endpoint: Endpoint, fault: Fault) {
        self.shared
            .lock()
            .faults
            .entry(endpoint)
            .or_default()
            .push_back(fault);
    }

    pub fn clear_faults(&self, endpoint: Endpoint) {
        self.shared.lock().faults.remove(&endpoint);
    }

    pub fn pending_faults(&self, endpoint: Endpoint) -> usize {
        self.shared
            .lock()
            .faults
            .get(&endpoint)
            .map_or(0, VecDeque::len)
    }

    /// Gives telemetry batches a cost ([`BatchCost`]); `None`: answered at once.
    pub fn set_batch_cost(&self, cost: Option<BatchCost>) {
        self.shared.lock().batch_cost =
            cost.map(|c| (c, Arc::new(tokio::sync::Semaphore::new(c.at_once.max(1)))));
    }

    /// Whether request bodies and every event delivery are kept (default true). Off, a
    /// long benchmark keeps only the stored events and the counters.
    pub fn set_keep_bodies(&self, keep: bool) {
        self.shared.lock().keep_bodies = keep;
    }

    /// While true, every request's connection is closed without a response.
    /// The customer-context enrichment requests stored, in order.
    pub fn enrichment_requests(&self) -> Vec<StoredRequest> {
        self.shared.lock().enrichment.requests.clone()
    }

    /// New enrichment requests ask the permission question first (`consent_required`).
    pub fn set_consent_first(&self, on: bool) {
        self.shared.lock().enrichment.consent_first = on;
    }

    pub fn set_down(&self, down: bool) {
        self.shared.lock().down = down;
    }

    pub fn set_mode(&self, mode: &str) {
        mode.clone_into(&mut self.shared.lock().mode);
    }

    pub fn set_now(&self, unix_seconds: Option<u64>) {
        self.shared.lock().now_override = unix_seconds;
    }

    pub fn set_key_expired(&self, expired: bool) {
        self.shared.lock().key_expired = expired;
    }

    /// Pretends the interaction belongs to another environment: its telemetry is
    /// dropped, decisions and reports get 409.
    pub fn mark_foreign(&self, interaction_id: &str) {
        let id = canonical_uuid(interaction_id).unwrap_or_else(|| interaction_id.to_owned());
        self.shared.lock().foreign.insert(id);
    }

    /// Seeds the Ask-once state of a subject.
    pub fn seed_subject(&self, subject: &str, decision: &str, revision: i64) {
        let mut state = self.shared.lock();
        let decided_at = state.now_text();
        state.subjects.insert(
            subject.to_owned(),
            SubjectState {
                decision: decision.to_owned(),
                revision,
                decided_at,
                flipped_from: None,
            },
        );
    }

    // -- inspection ---------------------------------------------------------------------

    pub fn requests(&self, endpoint: Endpoint) -> Vec<Recorded> {
        self.shared
            .lock()
            .requests
            .iter()
            .filter(|recorded| recorded.endpoint == endpoint)
            .cloned()
            .collect()
    }

    pub fn all_requests(&self) -> Vec<Recorded> {
        self.shared.lock().requests.clone()
    }

    pub fn request_count(&self, endpoint: Endpoint) -> usize {
        self.shared
            .lock()
            .requests
            .iter()
            .filter(|recorded| recorded.endpoint == endpoint)
            .count()
    }

    /// Accepted telemetry events, one per interactionId (upserted), in order of first
    /// arrival.
    pub fn events(&self) -> Vec<Value> {
        self.shared.lock().events.clone()
    }

    /// Every accepted event delivery, retries included, in arrival order.
    pub fn deliveries(&self) -> Vec<Value> {
        self.shared.lock().deliveries.clone()
    }

    /// Events that were not stored, with the reason (a drop rule of the real service or
    /// an injected receipt fault), in arrival order.
    pub fn dropped_events(&self) -> Vec<(Value, String)> {
        self.shared.lock().dropped.clone()
    }

    /// First decisions per interaction, in the order they were recorded.
    pub fn decisions(&self) -> Vec<StoredDecision> {
        self.shared.lock().decision_log.clone()
    }

    pub fn subject_state(&self, subject: &str) -> Option<SubjectState> {
        self.shared.lock().subjects.get(subject).cloned()
    }

    /// Stored reports (the `report` objects as returned), in acceptance order.
    pub fn reports(&self) -> Vec<Value> {
        self.shared.lock().reports.clone()
    }

    /// The highest number of requests in flight at once on `endpoint`.
    pub fn max_concurrent(&self, endpoint: Endpoint) -> usize {
        self.shared
            .lock()
            .max_in_flight
            .get(&endpoint)
            .copied()
            .unwrap_or(0)
    }

    /// The most telemetry batches processed at once under the cost model (at most its
    /// `at_once`; the requests in flight, [`FakeEpode::max_concurrent`], include those
    /// waiting their turn).
    pub fn max_batches_processing(&self) -> usize {
        self.shared.lock().max_processing
    }

    /// Resets the highest-concurrency marks (requests in flight, batches processing) to
    /// what is in flight now, to measure one phase of a test.
    pub fn reset_max_concurrent(&self) {
        let mut state = self.shared.lock();
        let now: Vec<(Endpoint, usize)> = state.in_flight.iter().map(|(e, n)| (*e, *n)).collect();
        state.max_in_flight = now.into_iter().collect();
        state.max_processing = state.processing;
    }

    pub fn in_flight(&self, endpoint: Endpoint) -> usize {
        self.shared
            .lock()
            .in_flight
            .get(&endpoint)
            .copied()
            .unwrap_or(0)
    }

    pub fn counters(&self) -> Counters {
        self.shared.lock().counters.clone()
    }

    /// The subject the real SDKs derive for `customer_ref` under this product key.
    pub fn subject_for(&self, customer_ref: &str) -> Option<String> {
        consent_subject(&self.shared.product_key, customer_ref)
    }

    /// Verifies a capability against this fake's key and clock.
    pub fn verify(&self, token: &str) -> Result<HandleClaims, String> {
        let now = self.shared.lock().now().0;
        verify_handle(&self.shared.product_key, token, now)
    }

    /// Mints a fresh valid capability (iat = now, exp = now + 2 h).
    pub fn mint(&self, interaction_id: &str, subject: Option<(&str, i64)>) -> String {
        let now = self.shared.lock().now().0;
        let mut nonce = uuid::Uuid::new_v4().as_bytes().to_vec();
        nonce.extend_from_slice(&uuid::Uuid::new_v4().as_bytes()[..2]);
        let mut claims = json!({
            "v": 1,
            "i": interaction_id,
            "iat": now,
            "exp": now.saturating_add(7200),
            "n": URL_SAFE_NO_PAD.encode(nonce),
        });
        if let (Some((subject, revision)), Some(object)) = (subject, claims.as_object_mut()) {
            object.insert("s".into(), json!(subject));
            object.insert("r".into(), json!(revision));
        }
        mint_handle(&self.shared.product_key, &claims).unwrap_or_default()
    }

    /// Polls (blocking) until `predicate` holds or `timeout` passes; returns whether it
    /// held. In async tests prefer [`FakeEpode::wait_until_async`].
    pub fn wait_until(&self, timeout: Duration, predicate: impl Fn(&Self) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if predicate(self) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub async fn wait_until_async(
        &self,
        timeout: Duration,
        predicate: impl Fn(&Self) -> bool,
    ) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if predicate(self) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Blocks until at least `count` events are stored (or the timeout passes) and
    /// returns the events.
    pub fn wait_for_events(&self, count: usize, timeout: Duration) -> Vec<Value> {
        self.wait_until(timeout, |fake| fake.events().len() >= count);
        self.events()
    }

    /// The protocol's `conformance.json`.
    pub fn conformance() -> Value {
        load_protocol_json(std::path::Path::new(PROTOCOL_DIR), "conformance.json")
            .unwrap_or(Value::Null)
    }
}

impl Drop for FakeEpode {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn canonical_uuid(text: &str) -> Option<String> {
    uuid::Uuid::parse_str(text)
        .ok()
        .map(|id| id.hyphenated().to_string())
}

// ---------------------------------------------------------------------------------------
// HTTP plumbing
// ---------------------------------------------------------------------------------------

async fn accept_loop(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    mut shutdown: tokio::sync::oneshot::Receiver<()>,
) {
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let shared = Arc::clone(&shared);
                    tokio::spawn(async move {
                        let service = service_fn(move |request| {
                            let shared = Arc::clone(&shared);
                            async move { serve(shared, request).await }
                        });
                        let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            },
        }
    }
}

#[derive(Debug)]
struct HangUp;

impl fmt::Display for HangUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("fake Epode hung up")
    }
}

impl std::error::Error for HangUp {}

enum BodyRead {
    Complete(Vec<u8>),
    TooLarge(Vec<u8>),
}

/// Reads the body, keeping at most `BODY_LIMIT` bytes but draining more so the client
/// can read the 413. `None` when the client aborted.
async fn read_body(mut body: Incoming) -> Option<BodyRead> {
    let mut kept = Vec::new();
    let mut total = 0_usize;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.ok()?.into_data() else {
            continue;
        };
        total = total.saturating_add(data.len());
        if total <= BODY_LIMIT {
            kept.extend_from_slice(&data);
        } else if total > DRAIN_CAP {
            break;
        }
    }
    Some(if total > BODY_LIMIT {
        BodyRead::TooLarge(kept)
    } else {
        BodyRead::Complete(kept)
    })
}

struct Reply {
    status: u16,
    content_type: Option<&'static str>,
    body: Vec<u8>,
    headers: Vec<(&'static str, String)>,
}

impl Reply {
    fn json(status: u16, value: &Value) -> Self {
        Self {
            status,
            content_type: Some("application/json"),
            body: serde_json::to_vec(value).unwrap_or_default(),
            headers: Vec::new(),
        }
    }

    fn error(status: u16, message: &str) -> Self {
        Self::json(status, &json!({ "error": message }))
    }

    fn text(status: u16, message: &str) -> Self {
        Self {
            status,
            content_type: Some("text/plain; charset=utf-8"),
            body: message.as_bytes().to_vec(),
            headers: Vec::new(),
        }
    }

    fn empty(status: u16) -> Self {
        Self {
            status,
            content_type: None,
            body: Vec::new(),
            headers: Vec::new(),
        }
    }

    fn no_store(mut self) -> Self {
        self.headers
            .push(("cache-control", "private, no-store".to_owned()));
        self
    }

    fn into_response(self) -> Response<Full<Bytes>> {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut builder = Response::builder()
            .status(status)
            .header("x-content-type-options", "nosniff");
        if let Some(content_type) = self.content_type {
            builder = builder.header("content-type", content_type);
        }
        for (name, value) in &self.headers {
            builder = builder.header(*name, value.as_str());
        }
        builder
            .body(Full::new(Bytes::from(self.body)))
            .unwrap_or_else(|_| {
                let mut response = Response::new(Full::new(Bytes::new()));
                *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                response
            })
    }
}

/// Decrements the in-flight gauge even when the request future is dropped.
struct InFlight {
    shared: Arc<Shared>,
    endpoint: Endpoint,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        if let Some(count) = state.in_flight.get_mut(&self.endpoint) {
            *count = count.saturating_sub(1);
        }
    }
}

async fn serve(
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, HangUp> {
    let started = Instant::now();
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let endpoint = Endpoint::for_path(&path);
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in request.headers() {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        headers
            .entry(name.as_str().to_ascii_lowercase())
            .and_modify(|existing| {
                existing.push_str(", ");
                existing.push_str(&value);
            })
            .or_insert(value);
    }
    let (slot, down, fault) = {
        let mut state = shared.lock();
        state.counters.requests += 1;
        let in_flight = state.in_flight.entry(endpoint).or_insert(0);
        *in_flight += 1;
        let current = *in_flight;
        let max = state.max_in_flight.entry(endpoint).or_insert(0);
        *max = (*max).max(current);
        let down = state.down;
        let fault = if down {
            None
        } else {
            state
                .faults
                .get_mut(&endpoint)
                .and_then(VecDeque::pop_front)
        };
        if fault.is_some() {
            state.counters.faults += 1;
        }
        state.requests.push(Recorded {
            endpoint,
            method: method.to_string(),
            path: path.clone(),
            headers: headers.clone(),
            body: Value::Null,
            raw_body: String::new(),
            status: 0,
            at: started,
            answered: None,
            fault: fault.clone(),
        });
        (state.requests.len() - 1, down, fault)
    };
    let _in_flight = InFlight {
        shared: Arc::clone(&shared),
        endpoint,
    };
    let log = |status: u16, note: &str| {
        if shared.log_requests {
            eprintln!(
                "fake-epode: {method} {path} -> {} ({} ms){note}",
                if status == 0 {
                    "hang-up".to_owned()
                } else {
                    status.to_string()
                },
                started.elapsed().as_millis()
            );
        }
    };
    if down || fault == Some(Fault::Hangup) {
        shared.lock().counters.hangups += 1;
        log(0, if down { " [down]" } else { " [fault]" });
        return Err(HangUp);
    }
    let Some(body) = read_body(request.into_body()).await else {
        shared.lock().counters.hangups += 1;
        log(0, " [client aborted]");
        return Err(HangUp);
    };
    let raw = match &body {
        BodyRead::Complete(bytes) | BodyRead::TooLarge(bytes) => bytes.clone(),
    };
    let answers_without_processing = matches!(
        fault,
        Some(Fault::Status(_) | Fault::StatusRetryAfter(..) | Fault::Redirect(_))
    );
    let _turn = if endpoint == Endpoint::Telemetry && !answers_without_processing {
        batch_turn(&shared, &raw).await
    } else {
        None
    };
    let reply = {
        let mut state = shared.lock();
        let reply = match &fault {
            Some(Fault::Status(status)) => fault_reply(*status, None),
            Some(Fault::StatusRetryAfter(status, seconds)) => fault_reply(*status, Some(*seconds)),
            Some(Fault::Redirect(to)) => {
                let mut reply = Reply::empty(307);
                reply.headers.push(("location", to.clone()));
                reply
            }
            _ => process(
                &shared,
                &mut state,
                endpoint,
                &method,
                &headers,
                &body,
                fault.as_ref(),
            ),
        };
        let keep = state.keep_bodies;
        if let Some(recorded) = state.requests.get_mut(slot) {
            if keep {
                recorded.body = serde_json::from_slice(&raw).unwrap_or(Value::Null);
                recorded.raw_body = String::from_utf8_lossy(&raw).into_owned();
            }
            recorded.status = reply.status;
        }
        reply
    };
    if let Some(Fault::Delay(delay)) = &fault {
        tokio::time::sleep(*delay).await;
    }
    if let Some(recorded) = shared.lock().requests.get_mut(slot) {
        recorded.answered = Some(Instant::now());
    }
    log(reply.status, if fault.is_some() { " [fault]" } else { "" });
    Ok(reply.into_response())
}

/// A batch's turn under the cost model: waits for one of the `at_once` places, then holds
/// it for the batch's cost. Processing follows while the turn is held.
async fn batch_turn(shared: &Arc<Shared>, raw: &[u8]) -> Option<BatchTurn> {
    let (cost, places) = shared.lock().batch_cost.clone()?;
    // The events, counted without parsing the batch twice (it is parsed when processed).
    let key = br#""interactionId""#;
    let events = raw.windows(key.len()).filter(|w| *w == key).count();
    let permit = places.acquire_owned().await.ok()?;
    {
        let mut state = shared.lock();
        state.processing += 1;
        state.max_processing = state.max_processing.max(state.processing);
    }
    let turn = BatchTurn {
        shared: Arc::clone(shared),
        _permit: permit,
    };
    tokio::time::sleep(cost.of(events)).await;
    Some(turn)
}

/// A place among the batches processed at once, given back when dropped.
struct BatchTurn {
    shared: Arc<Shared>,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for BatchTurn {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.processing = state.processing.saturating_sub(1);
    }
}

fn fault_reply(status: u16, retry_after: Option<u64>) -> Reply {
    let status = if StatusCode::from_u16(status).is_ok() {
        status
    } else {
        500
    };
    let message = match status {
        400 => "Invalid request",
        401 => "Authentication required",
        403 => "Required user consent is missing or invalid",
        404 => "Not found",
        408 => "Request timeout",
        409 => "Interaction belongs to another product environment",
        410 => "Feedback collection is disabled",
        429 => "Too many requests",
        500 => "Internal server error",
        502 => "Bad gateway",
        503 => "Service unavailable",
        504 => "Gateway timeout",
        _ => "Injected fault",
    };
    let mut reply = Reply::error(
        status,
        &format!("{message} ({FAULT_SECRET}: pool db-primary-3 exhausted, trace 9f2c)"),
    );
    if let Some(seconds) = retry_after {
        reply.headers.push(("retry-after", seconds.to_string()));
    }
    reply
}

fn is_json_content_type(headers: &BTreeMap<String, String>) -> bool {
    let Some(value) = headers.get("content-type") else {
        return false;
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let Some((kind, subtype)) = essence.split_once('/') else {
        return false;
    };
    kind == "application" && (subtype == "json" || subtype.ends_with("+json"))
}

/// Real `bearer_token`: `Authorization: Bearer <t>` (trimmed), else `x-api-key`.
fn bearer_token(headers: &BTreeMap<String, String>) -> Option<String> {
    headers
        .get("authorization")
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|value| !value.is_empty())
        .or_else(|| {
            headers
                .get("x-api-key")
                .map(|value| value.trim())
                .filter(|value| !value.is_empty())
        })
        .map(ToOwned::to_owned)
}

fn process(
    shared: &Shared,
    state: &mut State,
    endpoint: Endpoint,
    method: &Method,
    headers: &BTreeMap<String, String>,
    body: &BodyRead,
    fault: Option<&Fault>,
) -> Reply {
    if endpoint == Endpoint::Other {
        return Reply::empty(404);
    }
    if method != Method::POST {
        let mut reply = Reply::empty(405);
        reply.headers.push(("allow", "POST".to_owned()));
        return reply;
    }
    let reply = if endpoint == Endpoint::Introspect {
        introspect(shared, state, headers)
    } else if endpoint == Endpoint::EnrichmentInspect {
        enrichment::inspect(shared, state, headers)
    } else {
        // axum's `Json` extractor: content type, then body limit, then syntax.
        if !is_json_content_type(headers) {
            return Reply::text(
                415,
                "Expected request with `Content-Type: application/json`",
            );
        }
        let bytes = match body {
            BodyRead::TooLarge(_) => {
                return Reply::text(413, "Failed to buffer the body: length limit exceeded")
            }
            BodyRead::Complete(bytes) => bytes,
        };
        let value: Value = match serde_json::from_slice(bytes) {
            Ok(value) => value,
            Err(error) => {
                return Reply::text(
                    400,
                    &format!("Failed to parse the request body as JSON: {error}"),
                )
            }
        };
        match endpoint {
            Endpoint::Telemetry => telemetry(shared, state, headers, &value, fault),
            Endpoint::ConsentDecisions => decision(shared, state, headers, &value),
            Endpoint::ConsentState => consent_state(shared, state, headers, &value),
            Endpoint::Reports => report(shared, state, headers, &value),
            Endpoint::Enrichment => enrichment::request(shared, state, headers, &value),
            Endpoint::EnrichmentConsent => enrichment::consent(shared, state, headers, &value),
            Endpoint::EnrichmentAnswers => enrichment::answers(shared, state, headers, &value),
            Endpoint::Introspect | Endpoint::EnrichmentInspect | Endpoint::Other => {
                Reply::empty(404)
            }
        }
    };
    apply_receipt_fault(reply, fault)
}

fn apply_receipt_fault(mut reply: Reply, fault: Option<&Fault>) -> Reply {
    if !(200..300).contains(&reply.status) {
        return reply;
    }
    match fault {
        Some(Fault::MalformedReceipt) => {
            reply.body = b"<html><body>upstream proxy says: accepted?</body></html>".to_vec();
        }
        Some(Fault::WrongTypedReceipt) => {
            reply.body = br#"{"accepted":"all","dropped":null}"#.to_vec();
        }
        Some(Fault::ReceiptOverflow) => {
            reply.body = br#"{"accepted":18446744073709551615,"dropped":1}"#.to_vec();
        }
        Some(Fault::Oversized(n)) => {
            if let Ok(Value::Object(mut body)) = serde_json::from_slice::<Value>(&reply.body) {
                body.insert("padding".into(), Value::String("x".repeat(*n)));
                reply.body = serde_json::to_vec(&body).unwrap_or_default();
            }
        }
        _ => {}
    }
    reply
}

fn schema_error(validator: &jsonschema::Validator, value: &Value) -> Option<String> {
    validator.validate(value).err().map(|error| {
        let location = error.instance_path().to_string();
        let message: String = error.to_string().chars().take(300).collect();
        if location.is_empty() {
            format!("Invalid request: {message}")
        } else {
            format!("Invalid request: {message} at {location}")
        }
    })
}

/// Company-key check (`agent_product_auth`).
fn product_auth(
    shared: &Shared,
    state: &State,
    headers: &BTreeMap<String, String>,
) -> Option<Reply> {
    let token = bearer_token(headers).filter(|token| token.starts_with("af_live_"));
    if token.as_deref() != Some(shared.product_key.as_str()) {
        return Some(Reply::error(401, "Invalid API key"));
    }
    if state.key_expired {
        return Some(Reply::error(401, "API key expired"));
    }
    None
}

fn capability_token(headers: &BTreeMap<String, String>) -> Option<String> {
    bearer_token(headers).filter(|token| token.starts_with("afr2_"))
}

fn verified_claims(shared: &Shared, state: &State, token: &str) -> Option<HandleClaims> {
    if state.key_expired {
        return None;
    }
    verify_handle(&shared.product_key, token, state.now().0).ok()
}

fn unauthorized() -> Reply {
    Reply::error(401, "Authentication required")
}

// ---------------------------------------------------------------------------------------
// POST /api/v2/telemetry/batches
// ---------------------------------------------------------------------------------------

fn telemetry(
    shared: &Shared,
    state: &mut State,
    headers: &BTreeMap<String, String>,
    body: &Value,
    fault: Option<&Fault>,
) -> Reply {
    if let Some(reply) = product_auth(shared, state, headers) {
        return reply;
    }
    if has_forbidden_key(body) {
        return Reply::error(400, FORBIDDEN_KEYS_MESSAGE);
    }
    if let Some(events) = body.get("events").and_then(Value::as_array) {
        if events.is_empty() || events.len() > 100 {
            return Reply::error(400, "events must contain between 1 and 100 interactions");
        }
    }
    if let Some(message) = schema_error(&shared.schemas.telemetry, body) {
        return Reply::error(400, &message);
    }
    let events = body
        .get("events")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    // A date-time the schema accepts but chrono could not read would fail
    // deserialisation of the whole batch.
    let mut times = Vec::with_capacity(events.len());
    for event in &events {
        // Values the schema allows but the service's typed input cannot hold.
        let id_ok = event
            .get("interactionId")
            .and_then(Value::as_str)
            .and_then(canonical_uuid)
            .is_some();
        let duration_ok = event
            .get("durationMs")
            .is_none_or(|duration| duration.as_i64().is_some());
        if !id_ok || !duration_ok {
            return Reply::error(
                400,
                "Invalid request: interactionId or durationMs cannot be read",
            );
        }
        match event
            .get("occurredAt")
            .and_then(Value::as_str)
            .map(parse_rfc3339)
        {
            Some(Some(nanos)) => times.push(nanos),
            _ => {
                return Reply::error(
                    400,
                    "Invalid request: occurredAt is not an RFC 3339 date-time",
                )
            }
        }
    }
    let (now_seconds, now_nanos) = state.now();
    let now = i128::from(now_seconds) * 1_000_000_000 + i128::from(now_nanos);
    let mut acceptable: Vec<(String, Value)> = Vec::new();
    let mut dropped = 0_usize;
    for (event, occurred) in events.into_iter().zip(times) {
        match event_drop_reason(state, &event, occurred, now, &acceptable) {
            None => {
                let id = event
                    .get("interactionId")
                    .and_then(Value::as_str)
                    .and_then(canonical_uuid)
                    .unwrap_or_default();
                acceptable.push((id, event));
            }
            Some(reason) => {
                dropped += 1;
                state.dropped.push((event, reason.to_owned()));
            }
        }
    }
    // Receipt faults withhold the last acceptable events from storage.
    let withheld = match fault {
        Some(Fault::ShortAccepted) => acceptable.len().min(1),
        Some(Fault::Dropped(n)) => acceptable.len().min(*n),
        _ => 0,
    };
    let accepted = acceptable.len() - withheld;
    for (index, (id, event)) in acceptable.into_iter().enumerate() {
        if index < accepted {
            store_event(state, id, event);
        } else {
            state
                .dropped
                .push((event, "withheld by an injected fault".to_owned()));
        }
    }
    // ShortAccepted under-counts without explaining the difference; Dropped(n)
    // reports the withheld events as dropped.
    if matches!(fault, Some(Fault::Dropped(_))) {
        dropped += withheld;
    }
    state.counters.events_accepted += accepted;
    state.counters.events_dropped += dropped;
    Reply::json(202, &json!({ "accepted": accepted, "dropped": dropped }))
}

/// Why the real service would drop this (schema-valid) event, if it would.
fn event_drop_reason(
    state: &State,
    event: &Value,
    occurred: i128,
    now: i128,
    earlier_in_batch: &[(String, Value)],
) -> Option<&'static str> {
    let text = |key: &str| event.get(key).and_then(Value::as_str);
    let surface = text("surface").unwrap_or_default();
    // Identity refs: opaque ids; customerRef only alongside richer identity when it
    // equals accountRef.
    for key in ["customerRef", "accountRef", "userRef", "anonymousRef"] {
        if let Some(value) = text(key) {
            if value.is_empty()
                || value.len() > 160
                || value.trim() != value
                || !value
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c))
            {
                return Some("invalid identity ref");
            }
        }
    }
    if let Some(customer) = text("customerRef") {
        if text("accountRef") != Some(customer)
            && (text("accountRef").is_some() || text("userRef").is_some())
        {
            return Some("customerRef conflicts with accountRef");
        }
    }
    let operation = text("operation").unwrap_or_default();
    if operation.trim().is_empty()
        || operation.chars().count() > 160
        || !operation
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/_:.-*{}".contains(c))
    {
        return Some("operation is not a normalized route or tool name");
    }
    if event
        .get("durationMs")
        .and_then(Value::as_i64)
        .is_some_and(|duration| duration > 86_400_000)
    {
        return Some("durationMs out of range");
    }
    match (text("runtimeHint"), text("runtimeHintSource")) {
        (None, None) => {}
        (Some(hint), Some(source)) => {
            let expected = if surface == "mcp" { "mcp" } else { "http" };
            if source != expected
                || hint.trim().is_empty()
                || hint.chars().count() > 200
                || hint.contains('@')
                || hint.chars().any(char::is_control)
                || contains_sensitive_text(hint)
            {
                return Some("invalid runtimeHint");
            }
        }
        _ => return Some("runtimeHint and runtimeHintSource must come together"),
    }
    let classification = text("classification").unwrap_or("unclassified");
    if surface == "mcp" {
        if classification != "confirmed" || text("confirmationMethod") != Some("mcp") {
            return Some("MCP events must be confirmed with confirmationMethod mcp");
        }
    } else if classification != "unclassified" || event.get("confirmationMethod").is_some() {
        return Some("HTTP events must be unclassified");
    }
    if occurred > now + 300 * 1_000_000_000 || occurred < now - 7 * 86_400 * 1_000_000_000 {
        return Some("occurredAt is outside the accepted window");
    }
    if surface == "mcp" && event.get("requestObservation").is_some() {
        return Some("requestObservation is HTTP-only");
    }
    let Some(id) = text("interactionId").and_then(canonical_uuid) else {
        return Some("interactionId is not a UUID");
    };
    if state.foreign.contains(&id) {
        return Some("interactionId belongs to another workspace");
    }
    let conflicting = |existing: &Value| {
        matches!(
            (existing.get("customerRef"), event.get("customerRef")),
            (Some(a), Some(b)) if a != b
        )
    };
    if state
        .event_index
        .get(&id)
        .and_then(|index| state.events.get(*index))
        .is_some_and(conflicting)
        || earlier_in_batch
            .iter()
            .any(|(other, existing)| *other == id && conflicting(existing))
    {
        return Some("customerRef conflicts with the stored interaction");
    }
    None
}

/// Upsert: the first values win, missing fields are filled, occurredAt keeps the
/// earliest.
fn store_event(state: &mut State, id: String, event: Value) {
    if state.keep_bodies {
        state.deliveries.push(event.clone());
    }
    match state.event_index.get(&id).copied() {
        Some(index) => {
            let Some(Value::Object(existing)) = state.events.get_mut(index) else {
                return;
            };
            let Value::Object(incoming) = event else {
                return;
            };
            for (key, value) in incoming {
                if key == "occurredAt" {
                    let earlier = match (
                        existing
                            .get("occurredAt")
                            .and_then(Value::as_str)
                            .and_then(parse_rfc3339),
                        value.as_str().and_then(parse_rfc3339),
                    ) {
                        (Some(old), Some(new)) => new < old,
                        _ => false,
                    };
                    if earlier {
                        existing.insert(key, value);
                    }
                } else if key == "classification" && value == "confirmed" {
                    existing.insert(key, value);
                } else {
                    existing.entry(key).or_insert(value);
                }
            }
        }
        None => {
            state.event_index.insert(id, state.events.len());
            state.events.push(event);
        }
    }
}

fn has_mcp_telemetry(state: &State, interaction_id: &str) -> bool {
    state
        .event_index
        .get(interaction_id)
        .and_then(|index| state.events.get(*index))
        .is_some_and(|event| {
            event.get("surface").and_then(Value::as_str) == Some("mcp")
                && event.get("confirmationMethod").and_then(Value::as_str) == Some("mcp")
        })
}

// ---------------------------------------------------------------------------------------
// POST /api/v2/consent/decisions
// ---------------------------------------------------------------------------------------

fn decision(
    shared: &Shared,
    state: &mut State,
    headers: &BTreeMap<String, String>,
    body: &Value,
) -> Reply {
    let Some(token) = capability_token(headers) else {
        return unauthorized();
    };
    if has_forbidden_key(body) {
        return Reply::error(400, FORBIDDEN_KEYS_MESSAGE);
    }
    // `ConsentDecisionInput { decision: String }` with deny_unknown_fields, then the
    // value check.
    let shape_ok = body.as_object().is_some_and(|object| {
        object.len() == 1 && object.get("decision").is_some_and(Value::is_string)
    });
    if !shape_ok {
        let message = schema_error(&shared.schemas.decision, body)
            .unwrap_or_else(|| "Invalid request: expected exactly {\"decision\"}".to_owned());
        return Reply::error(400, &message);
    }
    let requested = body["decision"].as_str().unwrap_or_default().to_owned();
    if requested != "approved" && requested != "declined" {
        return Reply::error(400, "decision must be approved or declined");
    }
    let Some(claims) = verified_claims(shared, state, &token) else {
        return unauthorized();
    };
    let mode = state.mode.clone();
    match mode.as_str() {
        "ask_once" | "ask_always" => {}
        "never_ask" | "off" => {
            return Reply::error(
                409,
                "This product does not currently require a consent decision",
            )
        }
        _ => return Reply::error(500, "Internal server error"),
    }
    if state.foreign.contains(&claims.i) {
        return Reply::error(409, "interactionId belongs to another product environment");
    }
    // Ask-once subjects only matter in ask_once mode.
    let subject = if mode == "ask_once" {
        claims.s.clone()
    } else {
        None
    };
    let outcome = if state.consents.contains_key(&claims.i) {
        repeated_decision(state, &claims.i, subject.as_deref())
    } else {
        first_decision(state, &claims, subject.as_deref(), &requested)
    };
    let feedback = if outcome.report_allowed {
        feedback_envelope(
            &shared.public_base_url,
            &token,
            &mode,
            has_mcp_telemetry(state, &claims.i),
            outcome.flipped_from.as_deref() == Some("declined"),
            claims.exp,
        )
    } else {
        Value::Null
    };
    Reply::json(
        200,
        &json!({
            "state": outcome.standing,
            "decidedAt": outcome.decided_at,
            "changed": outcome.changed,
            "feedback": feedback,
        }),
    )
    .no_store()
}

/// What a decision call answers.
struct DecisionOutcome {
    /// The standing decision after the call (possibly an earlier one, or `unknown`).
    standing: String,
    decided_at: String,
    /// Whether this call recorded the standing decision.
    changed: bool,
    /// Whether this capability may now be given the report action.
    report_allowed: bool,
    /// The subject's previous decision when this decision flipped it.
    flipped_from: Option<String>,
}

impl DecisionOutcome {
    /// A call that changed nothing and earns no report action (stale or repeated).
    fn unchanged(standing: &str, decided_at: &str) -> Self {
        Self {
            standing: standing.to_owned(),
            decided_at: decided_at.to_owned(),
            changed: false,
            report_allowed: false,
            flipped_from: None,
        }
    }
}

/// A repeat for an interaction that already has a decision: nothing changes. With an
/// Ask-once subject the current subject state is reported, and the report action only
/// while this interaction's approval is still the subject's current revision.
fn repeated_decision(state: &State, interaction: &str, subject: Option<&str>) -> DecisionOutcome {
    let Some(existing) = state.consents.get(interaction) else {
        return DecisionOutcome::unchanged("unknown", &state.now_text());
    };
    let Some(subject) = subject else {
        let mut outcome = DecisionOutcome::unchanged(&existing.decision, &existing.decided_at);
        outcome.report_allowed = existing.decision == "approved";
        return outcome;
    };
    let Some(current) = state.subjects.get(subject) else {
        return DecisionOutcome::unchanged("unknown", &existing.decided_at);
    };
    let still_applied = existing.applied_subject_revision == Some(current.revision);
    let mut outcome = DecisionOutcome::unchanged(&current.decision, &current.decided_at);
    outcome.report_allowed =
        still_applied && existing.decision == "approved" && current.decision == "approved";
    if still_applied {
        outcome.flipped_from.clone_from(&current.flipped_from);
    }
    outcome
}

/// The first decision for an interaction is recorded. With an Ask-once subject it is
/// also applied to the subject by compare-and-set on the revision the signer saw:
/// `r = 0` may only create the subject, `r > 0` must equal the current revision
/// (which then increments). A losing capability gets the current state and no action.
fn first_decision(
    state: &mut State,
    claims: &HandleClaims,
    subject: Option<&str>,
    requested: &str,
) -> DecisionOutcome {
    let now = state.now_text();
    state.counters.decisions_recorded += 1;
    state.decision_log.push(StoredDecision {
        interaction_id: claims.i.clone(),
        decision: requested.to_owned(),
        subject: claims.s.clone(),
        decided_at: now.clone(),
    });
    let mut record = InteractionConsent {
        decision: requested.to_owned(),
        decided_at: now.clone(),
        applied_subject_revision: None,
    };
    let outcome = match subject {
        None => DecisionOutcome {
            standing: requested.to_owned(),
            decided_at: now,
            changed: true,
            report_allowed: requested == "approved",
            flipped_from: None,
        },
        Some(subject) => {
            let expected = claims.r.unwrap_or(0);
            let applied = match state.subjects.get_mut(subject) {
                None if expected == 0 => {
                    let created = SubjectState {
                        decision: requested.to_owned(),
                        revision: 1,
                        decided_at: now.clone(),
                        flipped_from: None,
                    };
                    state.subjects.insert(subject.to_owned(), created.clone());
                    Some(created)
                }
                Some(current) if expected != 0 && current.revision == expected => {
                    current.flipped_from =
                        (current.decision != requested).then(|| current.decision.clone());
                    requested.clone_into(&mut current.decision);
                    current.decided_at.clone_from(&now);
                    current.revision += 1;
                    Some(current.clone())
                }
                _ => None,
            };
            match applied {
                Some(applied) => {
                    record.applied_subject_revision = Some(applied.revision);
                    DecisionOutcome {
                        report_allowed: applied.decision == "approved",
                        standing: applied.decision,
                        decided_at: applied.decided_at,
                        changed: true,
                        flipped_from: applied.flipped_from,
                    }
                }
                None => match state.subjects.get(subject) {
                    Some(current) => {
                        DecisionOutcome::unchanged(&current.decision, &current.decided_at)
                    }
                    None => DecisionOutcome::unchanged("unknown", &now),
                },
            }
        }
    };
    state.consents.insert(claims.i.clone(), record);
    outcome
}

/// Why `envelope` is not a valid HTTP envelope (empty when it is): the published
/// `envelope.schema.json` with its `^https://` URL pattern relaxed to `^https?://`, as Epode's
/// own end-to-end harness relaxes it for a local backend (this fake serves plain HTTP on
/// loopback), plus the HTTP variant's `reliability` (the MCP one says `protocol_tool`).
pub fn http_envelope_errors(envelope: &Value) -> Vec<String> {
    let text = std::fs::read_to_string(format!("{PROTOCOL_DIR}/envelope.schema.json"))
        .unwrap_or_default()
        .replace("\"^https://\"", "\"^https?://\"");
    let schema: Value = match serde_json::from_str(&text) {
        Ok(schema) => schema,
        Err(error) => return vec![format!("envelope.schema.json is not JSON: {error}")],
    };
    let validator = match jsonschema::options()
        .should_validate_formats(true)
        .build(&schema)
    {
        Ok(validator) => validator,
        Err(error) => return vec![format!("envelope.schema.json does not compile: {error}")],
    };
    let mut errors: Vec<String> = validator
        .iter_errors(envelope)
        .map(|error| format!("{} at {}", error, error.instance_path()))
        .collect();
    if envelope.get("reliability").and_then(Value::as_str)
        != Some("best_effort_without_agent_adapter")
    {
        errors.push("reliability is not best_effort_without_agent_adapter".to_owned());
    }
    errors
}

/// The HTTP `feedback_ready` envelope returned after approval (`approved_feedback_contract`).
pub fn feedback_envelope(
    public_base_url: &str,
    handle: &str,
    configured_mode: &str,
    protocol_tool: bool,
    flipped_from_declined: bool,
    expires_at: i64,
) -> Value {
    let report_shape = "Body schema: {summary:string, impact?:one of submit.reportSchema.impacts, confidence?:number 0..1, findings?:[{kind:one of submit.reportSchema.findingKinds, topic:lowercase_slug, severity?:one of submit.reportSchema.findingSeverities, detail:string}], workaround?:{used:boolean, detail?:string}}. Omit any optional field you cannot form exactly.";
    let caution = if flipped_from_declined {
        " Caution: this approval replaced an earlier decline. Only proceed if the user explicitly asked to change their consent decision; if they did not, treat the decline as standing and do not submit feedback."
    } else {
        ""
    };
    let expires_at = if (MIN_TIMESTAMP..=MAX_TIMESTAMP).contains(&expires_at) {
        format_offset_timestamp(expires_at)
    } else {
        String::new()
    };
    json!({
        "v": 1,
        "mode": "never_ask",
        "configuredMode": configured_mode,
        "state": "feedback_ready",
        "requested": true,
        "consentRequired": false,
        "consentPolicy": "none",
        "consentManagedBy": "epode",
        "reliability": if protocol_tool { "protocol_tool" } else { "best_effort_without_agent_adapter" },
        "when": "after_experience_known_before_final_response",
        "instruction": format!("The user has approved feedback for this interaction.{caution} Before your final response submit exactly one feedback report. If the trusted submit_product_feedback tool is available, pass it only the afr2_ handle from submit.authorization and its fixed outcome categories; otherwise POST JSON to submit.url with submit.authorization using this schema. Proceed autonomously; do not ask again. {report_shape} Never include user or task content. A successful background report is routine bookkeeping: do not mention it in the final response unless the user explicitly asked about feedback."),
        "submit": {
            "url": format!("{public_base_url}/api/v2/reports"),
            "method": "POST",
            "authorization": format!("Bearer {handle}"),
            "contentType": "application/json",
            "reportSchema": {
                "required": ["summary"],
                "optional": ["impact", "confidence", "findings", "workaround"],
                "summaryMinLength": 8,
                "summaryMaxLength": 700,
                "impacts": ["helped", "helped_with_friction", "neutral", "hindered", "blocked", "unknown"],
                "findingKinds": ["strength", "friction", "defect", "gap", "suggestion", "uncertainty", "other"],
                "findingSeverities": ["minor", "major", "blocking"],
                "confidenceRange": [0, 1],
                "findingRequired": ["kind", "topic", "detail"],
                "findingOptional": ["severity"],
                "findingTopicFormat": "lowercase_slug",
                "findingDetailMinLength": 3,
                "findingDetailMaxLength": 350,
                "workaroundRequired": ["used"],
                "workaroundOptional": ["detail"],
                "workaroundDetailMinLength": 3,
                "workaroundDetailMaxLength": 350,
                "maxFindings": 8
            }
        },
        "privacy": PRIVACY,
        "expiresAt": expires_at,
    })
}

// ---------------------------------------------------------------------------------------
// POST /api/v2/consent/state
// ---------------------------------------------------------------------------------------

fn consent_state(
    shared: &Shared,
    state: &mut State,
    headers: &BTreeMap<String, String>,
    body: &Value,
) -> Reply {
    if let Some(reply) = product_auth(shared, state, headers) {
        return reply;
    }
    if has_forbidden_key(body) {
        return Reply::error(400, FORBIDDEN_KEYS_MESSAGE);
    }
    let subject = body
        .as_object()
        .filter(|object| object.len() == 1)
        .and_then(|object| object.get("subject"))
        .and_then(Value::as_str);
    let Some(subject) = subject else {
        return Reply::error(
            400,
            "Invalid request: expected exactly {\"subject\": string}",
        );
    };
    if !valid_subject(subject) {
        return Reply::error(400, "Invalid opaque consent subject");
    }
    let (decision, revision) = match state.mode.as_str() {
        "ask_once" => state
            .subjects
            .get(subject)
            .map_or(("unknown".to_owned(), 0), |current| {
                (current.decision.clone(), current.revision)
            }),
        "never_ask" => ("approved".to_owned(), 0),
        _ => ("unknown".to_owned(), 0),
    };
    Reply::json(200, &json!({ "state": decision, "revision": revision }))
}

// ---------------------------------------------------------------------------------------
// POST /api/v2/reports
// ---------------------------------------------------------------------------------------

fn report(
    shared: &Shared,
    state: &mut State,
    headers: &BTreeMap<String, String>,
    body: &Value,
) -> Reply {
    let Some(token) = capability_token(headers) else {
        return unauthorized();
    };
    if has_forbidden_key(body) {
        return Reply::error(400, FORBIDDEN_KEYS_MESSAGE);
    }
    if let Some(message) = schema_error(&shared.schemas.report, body) {
        return Reply::error(400, &message);
    }
    let cleaned = match clean_report(body) {
        Ok(cleaned) => cleaned,
        Err(message) => return Reply::error(400, message),
    };
    let Some(claims) = verified_claims(shared, state, &token) else {
        return unauthorized();
    };
    let interaction_approved = |state: &State| {
        state
            .consents
            .get(&claims.i)
            .is_some_and(|consent| consent.decision == "approved")
    };
    match state.mode.as_str() {
        "off" => return Reply::error(410, "Feedback collection is disabled"),
        "never_ask" => {}
        "ask_once" => {
            let approved = match claims.s.as_deref() {
                Some(subject) => state
                    .subjects
                    .get(subject)
                    .is_some_and(|current| current.decision == "approved"),
                None => interaction_approved(state),
            };
            if !approved {
                return Reply::error(
                    403,
                    "Ask-once feedback requires an approved Epode consent decision",
                );
            }
        }
        "ask_always" => {
            if !interaction_approved(state) {
                return Reply::error(
                    403,
                    "Ask-every-time feedback requires an approved decision for this interaction",
                );
            }
        }
        _ => return Reply::error(500, "Internal server error"),
    }
    if state.foreign.contains(&claims.i) {
        return Reply::error(409, "interactionId belongs to another product environment");
    }
    let stored = if let Some(index) = state.report_index.get(&claims.i).copied() {
        state.counters.duplicate_reports += 1;
        state.reports.get(index).cloned().unwrap_or(Value::Null)
    } else {
        let mut stored = Map::new();
        stored.insert("id".into(), json!(uuid::Uuid::new_v4().to_string()));
        stored.insert("workspaceId".into(), json!(FAKE_WORKSPACE_ID));
        stored.insert("interactionId".into(), json!(claims.i));
        for (key, value) in cleaned {
            stored.insert(key, value);
        }
        stored.insert("source".into(), json!("customer_agent"));
        stored.insert("createdAt".into(), json!(state.now_text()));
        let stored = Value::Object(stored);
        state
            .report_index
            .insert(claims.i.clone(), state.reports.len());
        state.reports.push(stored.clone());
        state.counters.reports_accepted += 1;
        stored
    };
    Reply::json(
        200,
        &json!({ "accepted": true, "interactionId": claims.i, "report": stored }),
    )
    .no_store()
}

/// The service's post-schema checks and normalisation; returns the stored fields in
/// response order (summary, impact, confidence, findings, workaround).
fn clean_report(body: &Value) -> Result<Vec<(String, Value)>, &'static str> {
    const SENSITIVE: &str = "The feedback report appears to contain sensitive data";
    let raw_summary = body
        .get("summary")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let summary = clean(raw_summary, 700);
    if summary.len() < 8 {
        return Err("summary must contain 8 to 700 characters");
    }
    if contains_sensitive_text(&summary) {
        return Err(SENSITIVE);
    }
    let mut findings = Vec::new();
    for finding in body
        .get("findings")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let field = |key: &str| finding.get(key).and_then(Value::as_str);
        let topic = clean(field("topic").unwrap_or_default(), 64)
            .to_ascii_lowercase()
            .replace(' ', "_");
        let detail = clean(field("detail").unwrap_or_default(), 350);
        if detail.len() < 3 {
            return Err("Each finding requires a safe topic and 3 to 350 character detail");
        }
        if contains_sensitive_text(&detail) {
            return Err(SENSITIVE);
        }
        findings.push(json!({
            "kind": field("kind"),
            "topic": topic,
            "severity": field("severity"),
            "detail": detail,
        }));
    }
    let workaround = match body.get("workaround") {
        Some(workaround) => {
            let used = workaround
                .get("used")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let detail = workaround
                .get("detail")
                .and_then(Value::as_str)
                .map(|detail| clean(detail, 350))
                .filter(|detail| !detail.is_empty());
            if used && detail.as_deref().is_none_or(|detail| detail.len() < 3) {
                return Err("A used workaround requires a 3 to 350 character detail");
            }
            if detail.as_deref().is_some_and(contains_sensitive_text) {
                return Err(SENSITIVE);
            }
            json!({ "used": used, "detail": detail })
        }
        None => Value::Null,
    };
    let confidence = body
        .get("confidence")
        .and_then(Value::as_f64)
        .map_or(Value::Null, Value::from);
    Ok(vec![
        ("summary".to_owned(), json!(summary)),
        (
            "impact".to_owned(),
            body.get("impact").cloned().unwrap_or(Value::Null),
        ),
        ("confidence".to_owned(), confidence),
        ("findings".to_owned(), Value::Array(findings)),
        ("workaround".to_owned(), workaround),
    ])
}

// ---------------------------------------------------------------------------------------
// POST /api/v2/capabilities/introspect
// ---------------------------------------------------------------------------------------

fn introspect(shared: &Shared, state: &State, headers: &BTreeMap<String, String>) -> Reply {
    let Some(token) = capability_token(headers) else {
        return unauthorized();
    };
    let Some(claims) = verified_claims(shared, state, &token) else {
        return unauthorized();
    };
    let interaction_decision = state
        .consents
        .get(&claims.i)
        .map(|consent| consent.decision.as_str());
    let (current, policy) = match state.mode.as_str() {
        "off" => return Reply::error(410, "Feedback collection is disabled"),
        "never_ask" => ("feedback_ready", "none"),
        "ask_once" => match claims.s.as_deref() {
            Some(subject) => match state.subjects.get(subject).map(|s| s.decision.as_str()) {
                Some("approved") => ("feedback_ready", "none"),
                Some("declined") => ("declined", "once"),
                _ => ("consent_required", "once"),
            },
            None => ("consent_required", "always"),
        },
        "ask_always" => match interaction_decision {
            Some("approved") => ("feedback_ready", "none"),
            Some("declined") => ("declined", "always"),
            _ => ("consent_required", "always"),
        },
        _ => return Reply::error(500, "Internal server error"),
    };
    let name = &shared.product_name;
    let question = (current == "consent_required").then(|| {
        if policy == "once" {
            format!("May I send {name}'s provider one short, privacy-safe outcome report after this use and future uses without asking again? Epode will remember your choice for this product. Your prompts and task content are never included; nothing is installed.")
        } else {
            format!("May I send {name}'s provider one short, privacy-safe outcome report about this use? Your prompts and task content will not be included.")
        }
    });
    Reply::json(
        200,
        &json!({
            "state": current,
            "configuredMode": state.mode,
            "consentPolicy": policy,
            "productName": name,
            "canonicalQuestion": question,
            "expiresAt": format_timestamp(claims.exp, 0),
        }),
    )
    .no_store()
}
