//! The embedded Epode of the local trial: the endpoints the sidecar uses (telemetry
//! batches, consent decisions, consent state, reports; customer context's four, `enrichment.rs`), answered strictly as the real service
//! answers them: the product key or the feedback handle checked (signature, expiry), bodies
//! validated against the protocol's JSON Schemas and its admission rules, the same statuses
//! and the same idempotency (the first decision and the first report of an interaction win).
//! What arrives is published to the console and appended to a JSON-lines file. State is kept
//! for the latest [`KEEP`] interactions.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use http::StatusCode;
use indexmap::IndexMap;
use serde_json::{json, Value};

use super::bus::Bus;
use super::rules::{has_forbidden_key, is_sensitive_text, FORBIDDEN_KEYS_MESSAGE};
use crate::config::DevConfig;
use crate::feedback::capability::{self, Claims, FeedbackHandle, ProductKey};
use crate::feedback::FeedbackMode;

/// Interactions (events, decisions, reports, subjects) remembered, each.
pub(crate) const KEEP: usize = 10_000;
/// The service's body limit.
pub(crate) const BODY_LIMIT: usize = 64 * 1024;

const TELEMETRY_SCHEMA: &str =
    include_str!("../../../protocol/epode-v1/telemetry-batch.schema.json");
const DECISION_SCHEMA: &str =
    include_str!("../../../protocol/epode-v1/consent-decision.schema.json");
const REPORT_SCHEMA: &str = include_str!("../../../protocol/epode-v1/feedback-report.schema.json");

/// One answer: status, content type, body; and what the console shows of it (published
/// once the record has it).
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) json: bool,
    pub(crate) body: String,
    shown: Vec<(&'static str, Value)>,
}

impl Reply {
    fn showing(mut self, kind: &'static str, event: Value) -> Self {
        self.shown.push((kind, event));
        self
    }
}

fn reply(status: u16, body: &Value) -> Reply {
    Reply {
        status: StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        json: true,
        body: body.to_string(),
        shown: Vec::new(),
    }
}

fn error(status: u16, message: &str) -> Reply {
    reply(status, &json!({"error": message}))
}

/// A plain-text refusal (the service's framework answers these before its handlers run).
fn text(status: u16, message: &str) -> Reply {
    Reply {
        json: false,
        ..error(status, message)
    }
}

struct Validators {
    telemetry: jsonschema::Validator,
    decision: jsonschema::Validator,
    report: jsonschema::Validator,
}

fn validator(schema: &str) -> Result<jsonschema::Validator, String> {
    let schema: Value = serde_json::from_str(schema).map_err(|e| e.to_string())?;
    jsonschema::options()
        .should_validate_formats(true)
        .build(&schema)
        .map_err(|e| e.to_string())
}

/// The first schema error, as the service words it.
fn schema_error(v: &jsonschema::Validator, body: &Value) -> Option<String> {
    v.validate(body).err().map(|e| {
        let at = e.instance_path().to_string();
        let what: String = e.to_string().chars().take(300).collect();
        if at.is_empty() {
            format!("Invalid request: {what}")
        } else {
            format!("Invalid request: {what} at {at}")
        }
    })
}

#[derive(Clone)]
struct Decision {
    state: &'static str,
    decided_at: String,
}

/// One enrichment request, kept by its handle.
#[derive(Clone)]
struct Asked {
    request_id: String,
    interaction_id: String,
    purpose: String,
    remember: bool,
    /// Whom a decline binds: the customer (remembered) or this interaction.
    subject: String,
    state: &'static str,
    body: Value,
}

#[derive(Default)]
struct State {
    /// Telemetry events by interaction id (the first values win).
    events: IndexMap<String, Value>,
    decisions: IndexMap<String, Decision>,
    /// Ask-once subjects: the standing decision and its revision.
    subjects: IndexMap<String, (&'static str, i64)>,
    reports: IndexMap<String, Value>,
    /// Customer-context requests by their `aqr1_` handle.
    enrichment: IndexMap<String, Asked>,
    /// Customer-context subjects (a customer and purpose, or an interaction) and whether
    /// they declined.
    context_declined: IndexMap<String, bool>,
}

fn keep<V>(map: &mut IndexMap<String, V>, key: String, value: V) {
    if map.len() >= KEEP && !map.contains_key(&key) {
        map.shift_remove_index(0);
    }
    map.insert(key, value);
}

/// The JSON-lines record of what arrived, bounded in size.
struct Record {
    file: Option<std::fs::File>,
    /// Where `file` is (it may not be where it was configured).
    path: Option<PathBuf>,
    written: u64,
    max: u64,
    full_warned: bool,
}

pub(crate) struct DevEpode {
    key: ProductKey,
    mode: FeedbackMode,
    /// The origin the sidecar reaches this Epode at (for the `url`s of envelopes).
    origin: String,
    validators: Validators,
    state: Mutex<State>,
    record: Mutex<Record>,
    bus: Arc<Bus>,
}

fn now_text() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

impl DevEpode {
    pub(crate) fn new(
        key: ProductKey,
        mode: FeedbackMode,
        origin: String,
        dev: &DevConfig,
        bus: Arc<Bus>,
    ) -> Result<Self, String> {
        let (file, path) = open_record(&dev.log).unzip();
        let written = file
            .as_ref()
            .and_then(|f| f.metadata().ok())
            .map_or(0, |m| m.len());
        Ok(DevEpode {
            key,
            mode,
            origin,
            validators: Validators {
                telemetry: validator(TELEMETRY_SCHEMA)?,
                decision: validator(DECISION_SCHEMA)?,
                report: validator(REPORT_SCHEMA)?,
            },
            state: Mutex::new(State::default()),
            record: Mutex::new(Record {
                file,
                path,
                written,
                max: dev.log_max_bytes,
                full_warned: false,
            }),
            bus,
        })
    }

    /// Where the record is written, if anywhere.
    pub(crate) fn record_path(&self) -> Option<PathBuf> {
        let r = self.record.lock().unwrap_or_else(|e| e.into_inner());
        r.path.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends one line to the record (never the credential).
    fn append(&self, kind: &str, status: StatusCode, body: &Value) {
        let line = json!({"at": now_text(), "kind": kind, "status": status.as_u16(), "body": body});
        let mut line = line.to_string();
        line.push('\n');
        let mut r = self.record.lock().unwrap_or_else(|e| e.into_inner());
        if r.written + line.len() as u64 > r.max {
            if !r.full_warned {
                r.full_warned = true;
                tracing::warn!(max = r.max, "--dev: the JSON-lines record is full (EPODE_SIDECAR_DEV_LOG_MAX_BYTES); what arrives now is only shown on the console");
            }
            return;
        }
        let wrote = r.file.as_mut().map(|f| f.write_all(line.as_bytes()));
        match wrote {
            Some(Ok(())) => r.written += line.len() as u64,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "--dev: cannot write the JSON-lines record");
                r.file = None;
            }
            None => {}
        }
    }

    /// Answers one request: `path`, the bearer token, whether the body is declared JSON, and
    /// the body (already cut at [`BODY_LIMIT`]: `None` when it was longer).
    pub(crate) fn answer(
        &self,
        path: &str,
        bearer: Option<&str>,
        json_body: bool,
        body: Option<&[u8]>,
    ) -> Reply {
        let kind = match path {
            "/api/v2/telemetry/batches" => "telemetry",
            "/api/v2/consent/decisions" => "consent",
            "/api/v2/consent/state" => "consent_state",
            "/api/v2/reports" => "report",
            "/api/v2/enrichment/requests" => "enrichment",
            "/api/v2/enrichment/requests/inspect" => "enrichment_inspect",
            "/api/v2/enrichment/consent/decisions" => "enrichment_consent",
            "/api/v2/enrichment/answers" => "enrichment_answer",
            _ => return error(404, "Not found"),
        };
        if !json_body {
            return text(
                415,
                "Expected request with `Content-Type: application/json`",
            );
        }
        let Some(bytes) = body else {
            return text(413, "Failed to buffer the body: length limit exceeded");
        };
        let body: Value = match serde_json::from_slice(bytes) {
            Ok(v) => v,
            Err(e) => {
                return text(
                    400,
                    &format!("Failed to parse the request body as JSON: {e}"),
                )
            }
        };
        let answer = match kind {
            "telemetry" => self.telemetry(bearer, &body),
            "consent" => self.decision(bearer, &body),
            "consent_state" => self.consent_state(bearer, &body),
            "enrichment" => self.enrichment_request(bearer, &body),
            "enrichment_inspect" => self.enrichment_inspect(bearer),
            "enrichment_consent" => self.enrichment_consent(bearer, &body),
            "enrichment_answer" => self.enrichment_answer(bearer, &body),
            _ => self.report(bearer, &body),
        };
        self.append(kind, answer.status, &body);
        for (kind, event) in &answer.shown {
            self.bus.publish(kind, event.clone());
        }
        answer
    }

    fn product_key_ok(&self, bearer: Option<&str>) -> bool {
        bearer == Some(self.key.expose_secret())
    }

    /// The handle's claims, verified with the product key; `None` is 401.
    fn claims(&self, bearer: Option<&str>) -> Option<(Claims, FeedbackHandle)> {
        let token = bearer.filter(|t| t.starts_with("afr2_"))?;
        let claims = capability::verify(&self.key, token, SystemTime::now()).ok()?;
        Some((claims, FeedbackHandle::unverified(token)))
    }

    fn telemetry(&self, bearer: Option<&str>, body: &Value) -> Reply {
        if !self.product_key_ok(bearer) {
            return error(401, "Invalid API key");
        }
        if has_forbidden_key(body) {
            return error(400, FORBIDDEN_KEYS_MESSAGE);
        }
        if let Some(e) = schema_error(&self.validators.telemetry, body) {
            return error(400, &e);
        }
        let events = body["events"].as_array().cloned().unwrap_or_default();
        let (mut accepted, mut dropped) = (0, 0);
        let mut shown = Vec::with_capacity(events.len());
        for event in events {
            let id = event["interactionId"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let why = {
                let state = self.lock();
                drop_reason(&event, state.events.get(&id))
            };
            match why {
                None => {
                    accepted += 1;
                    let mut state = self.lock();
                    let stored = state.events.get(&id).cloned();
                    let merged = merge_event(stored, event.clone());
                    keep(&mut state.events, id.clone(), merged);
                }
                Some(_) => dropped += 1,
            }
            let delivery = why.map_or("accepted".to_owned(), |w| format!("dropped: {w}"));
            shown.push(("telemetry", json!({"event": event, "delivery": delivery})));
        }
        let mut answer = reply(202, &json!({"accepted": accepted, "dropped": dropped}));
        answer.shown = shown;
        answer
    }

    fn consent_state(&self, bearer: Option<&str>, body: &Value) -> Reply {
        if !self.product_key_ok(bearer) {
            return error(401, "Invalid API key");
        }
        let subject = body.get("subject").and_then(Value::as_str);
        let shape_ok = body.as_object().is_some_and(|o| o.len() == 1);
        let Some(subject) = subject.filter(|s| shape_ok && capability::valid_subject(s)) else {
            return error(
                400,
                "Invalid request: expected exactly {\"subject\": \"afsub1_…\"}",
            );
        };
        let (state, revision) = self
            .lock()
            .subjects
            .get(subject)
            .copied()
            .unwrap_or(("unknown", 0));
        reply(200, &json!({"state": state, "revision": revision}))
    }
}

fn open_append(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

/// Opens the record where it is configured, or where it can go: a file of the same name in
/// the temporary directory (a read-only container with a tmpfs), or nowhere (the console
/// still shows everything). Never fatal: the record is a convenience of the trial.
fn open_record(configured: &Path) -> Option<(std::fs::File, PathBuf)> {
    let e = match open_append(configured) {
        Ok(f) => return Some((f, configured.to_owned())),
        Err(e) => e,
    };
    const FIX: &str = "set EPODE_SIDECAR_DEV_LOG to a file this process can write (in a read-only container, mount a tmpfs: docker run --read-only --tmpfs /tmp)";
    let fallback = std::env::temp_dir().join(
        configured
            .file_name()
            .unwrap_or(std::ffi::OsStr::new("epode-dev.jsonl")),
    );
    let tried = if fallback == configured {
        Err(e.kind().into())
    } else {
        open_append(&fallback)
    };
    match tried {
        Ok(f) => {
            tracing::warn!(
                target: "epode_sidecar::dev",
                "--dev: cannot write the record at {} ({e}): it goes to {} instead; to choose, {FIX}",
                configured.display(),
                fallback.display(),
            );
            Some((f, fallback))
        }
        Err(e2) => {
            tracing::warn!(
                target: "epode_sidecar::dev",
                "--dev: cannot write the record at {} ({e}) nor at {} ({e2}): no record is kept, the console still shows everything; to keep one, {FIX}",
                configured.display(),
                fallback.display(),
            );
            None
        }
    }
}

/// Why the service would drop one schema-valid event from a batch (the batch still
/// succeeds), if it would.
fn drop_reason(event: &Value, stored: Option<&Value>) -> Option<&'static str> {
    let text = |k: &str| event.get(k).and_then(Value::as_str);
    if let Some(customer) = text("customerRef") {
        let richer = text("accountRef").is_some() || text("userRef").is_some();
        if richer && text("accountRef") != Some(customer) {
            return Some("customerRef conflicts with accountRef");
        }
        if stored
            .and_then(|s| s.get("customerRef"))
            .is_some_and(|c| c.as_str() != Some(customer))
        {
            return Some("customerRef conflicts with the stored interaction");
        }
    }
    let operation = text("operation").unwrap_or_default();
    if operation.contains("://")
        || !operation
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/_:.*{}-".contains(c))
    {
        return Some("operation is not a normalized route or tool name");
    }
    if text("surface") == Some("mcp")
        && (text("classification") != Some("confirmed")
            || text("confirmationMethod") != Some("mcp"))
    {
        return Some("MCP events must be confirmed with confirmationMethod mcp");
    }
    // The HTTP surfaces: Epode confirms an HTTP interaction itself, when its report arrives.
    if text("surface").is_some_and(|s| s.starts_with("http_"))
        && (text("classification") != Some("unclassified")
            || event.get("confirmationMethod").is_some())
    {
        return Some("HTTP events must be unclassified, without a confirmationMethod");
    }
    let occurred = text("occurredAt").and_then(|t| humantime::parse_rfc3339_weak(t).ok());
    let now = SystemTime::now();
    let in_window = occurred.is_some_and(|t| {
        t <= now + std::time::Duration::from_secs(300)
            && now
                .duration_since(t)
                .map_or(true, |age| age.as_secs() <= 7 * 86_400)
    });
    (!in_window).then_some("occurredAt is outside the accepted window")
}

/// Upsert: the first values win, missing fields are filled in.
fn merge_event(stored: Option<Value>, incoming: Value) -> Value {
    match (stored, incoming) {
        (Some(Value::Object(mut old)), Value::Object(new)) => {
            for (k, v) in new {
                old.entry(k).or_insert(v);
            }
            Value::Object(old)
        }
        (_, incoming) => incoming,
    }
}

mod agent;
mod enrichment;

#[cfg(test)]
mod tests;
