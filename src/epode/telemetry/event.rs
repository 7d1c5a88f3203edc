//! The telemetry event: what the request path knows of a completed product tool call
//! ([`McpCompletion`]) or instrumented HTTP response ([`HttpCompletion`]), checked and written
//! as the event Epode documents (field order, absent fields omitted), without its `sequence`.

use std::time::{Duration, SystemTime};

#[cfg(test)]
use serde_json::Map;
use serde_json::Value;

use crate::feedback::identity::{IdentityRefs, RefKind};

/// The outcome of a product tool call, as telemetry sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Success,
    /// An `isError` result, an upstream failure, or a JSON-RPC error.
    Error,
}

/// What the caller knows of one completed product tool call.
#[derive(Debug, Clone, Default)]
pub(crate) struct McpCompletion {
    pub(crate) interaction_id: String,
    pub(crate) operation: String,
    pub(crate) outcome: Option<Outcome>,
    pub(crate) duration: Option<Duration>,
    /// The identity references, the mode's customerRef rule already applied.
    pub(crate) refs: IdentityRefs,
    pub(crate) runtime_hint: Option<String>,
    /// The request's span, for the delivery's span to link to (OpenTelemetry on, sampled).
    pub(crate) link: Option<opentelemetry::trace::SpanContext>,
}

/// Where an HTTP response carried its envelope: the telemetry `surface`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Surface {
    /// `_agentFeedback` in a JSON object (`http_json`).
    Json,
    /// The script tag in an HTML page (`http_html`).
    Html,
    /// The `Agent-Feedback` header (`http_headers`).
    Headers,
}

impl Surface {
    pub(crate) const ALL: [Surface; 3] = [Surface::Json, Surface::Html, Surface::Headers];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Surface::Json => "http_json",
            Surface::Html => "http_html",
            Surface::Headers => "http_headers",
        }
    }
}

/// What the HTTP surface knows of one instrumented response.
#[derive(Debug, Clone)]
pub(crate) struct HttpCompletion {
    /// The capability's `i`, the envelope's interaction.
    pub(crate) interaction_id: String,
    pub(crate) surface: Surface,
    /// The normalised route.
    pub(crate) operation: String,
    /// The status the client got.
    pub(crate) status: u16,
    /// From the request's arrival to the body being ready.
    pub(crate) duration: Duration,
    /// The identity references, the mode's customerRef rule already applied.
    pub(crate) refs: IdentityRefs,
    pub(crate) runtime_hint: Option<String>,
    /// What the request said of its client (`EPODE_SIDECAR_REQUEST_OBSERVATION`).
    pub(crate) observation: Option<super::observation::RequestObservation>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(super) enum InvalidCompletion {
    #[error("invalid_operation: the tool name is not a valid telemetry operation")]
    Operation,
    #[error("invalid_outcome")]
    Outcome,
}

impl InvalidCompletion {
    pub(super) fn reason(self) -> &'static str {
        match self {
            InvalidCompletion::Operation => "invalid_operation",
            InvalidCompletion::Outcome => "invalid_outcome",
        }
    }
}

/// `^[A-Za-z0-9/_:.*{}-]{1,160}$` and no `://` (a raw URL is never an operation).
pub(crate) fn valid_operation(op: &str) -> bool {
    (1..=160).contains(&op.len())
        && op
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/_:.*{}-".contains(&b))
        && !op.contains("://")
}

fn runtime_hint(raw: &str) -> Option<String> {
    let t = raw.trim();
    let n = t.chars().count();
    ((1..=200).contains(&n) && !t.chars().any(char::is_control)).then(|| t.to_owned())
}

/// One telemetry event as Epode's batch carries it, written straight from these fields in the
/// order Epode documents (absent fields omitted, never null or empty): no map of values is
/// built per event, and `occurredAt` is formatted as it is written.
#[derive(Debug, Clone)]
pub(crate) struct TelemetryEvent {
    interaction_id: String,
    surface: &'static str,
    operation: String,
    classification: &'static str,
    confirmation: Option<&'static str>,
    occurred_at: SystemTime,
    status: u16,
    duration_ms: Option<u64>,
    /// The references, the conflict rule applied.
    refs: IdentityRefs,
    /// Where a session and a runtime hint came from (`mcp`, or `customer` and `http`).
    session_source: &'static str,
    runtime_hint: Option<String>,
    hint_source: &'static str,
    observation: Option<Value>,
    /// Given when the event is batched (the queue's number).
    pub(super) sequence: Option<u64>,
}

impl TelemetryEvent {
    /// The identity references it carries (for the customers of a batch).
    pub(super) fn refs(&self) -> &IdentityRefs {
        &self.refs
    }

    /// The event as JSON values (tests compare it with Epode's vectors).
    #[cfg(test)]
    pub(super) fn to_map(&self) -> Map<String, Value> {
        match serde_json::to_value(self) {
            Ok(Value::Object(map)) => map,
            other => panic!("an event is an object: {other:?}"),
        }
    }

    /// An event with only a sequence and a runtime hint (the batching tests' filler).
    #[cfg(test)]
    pub(super) fn filler(sequence: u64, hint: String) -> Self {
        TelemetryEvent {
            interaction_id: String::new(),
            surface: "mcp",
            operation: String::new(),
            classification: "confirmed",
            confirmation: None,
            occurred_at: SystemTime::UNIX_EPOCH,
            status: 200,
            duration_ms: None,
            refs: IdentityRefs::default(),
            session_source: "mcp",
            runtime_hint: Some(hint),
            hint_source: "mcp",
            observation: None,
            sequence: Some(sequence),
        }
    }
}

impl serde::Serialize for TelemetryEvent {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let mut m = serializer.serialize_map(None)?;
        m.serialize_entry("interactionId", &self.interaction_id)?;
        m.serialize_entry("surface", self.surface)?;
        m.serialize_entry("operation", &self.operation)?;
        m.serialize_entry("classification", self.classification)?;
        if let Some(method) = self.confirmation {
            m.serialize_entry("confirmationMethod", method)?;
        }
        m.serialize_entry("occurredAt", &Rfc3339(self.occurred_at))?;
        m.serialize_entry("statusCode", &self.status)?;
        if let Some(d) = self.duration_ms {
            m.serialize_entry("durationMs", &d)?;
        }
        for (kind, value) in self.refs.iter() {
            if kind != RefKind::Session {
                m.serialize_entry(kind.key(), value)?;
            }
        }
        if let Some(s) = &self.refs.session_ref {
            m.serialize_entry("sessionRef", s)?;
            m.serialize_entry("sessionSource", self.session_source)?;
        }
        if let Some(h) = &self.runtime_hint {
            m.serialize_entry("runtimeHint", h)?;
            m.serialize_entry("runtimeHintSource", self.hint_source)?;
        }
        if let Some(o) = &self.observation {
            m.serialize_entry("requestObservation", o)?;
        }
        if let Some(n) = self.sequence {
            m.serialize_entry("sequence", &n)?;
        }
        m.end()
    }
}

/// A time written as RFC 3339 with milliseconds, formatted into the output as it is written.
struct Rfc3339(SystemTime);

impl serde::Serialize for Rfc3339 {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&humantime::format_rfc3339_millis(self.0))
    }
}

/// The event for a completion, without its `sequence` (given when it is enqueued, added when
/// it is batched): absent fields are omitted, never null or empty.
pub(super) fn build_event(
    c: McpCompletion,
    occurred_at: SystemTime,
) -> Result<TelemetryEvent, InvalidCompletion> {
    let status = match c.outcome {
        Some(Outcome::Success) => 200,
        Some(Outcome::Error) => 500,
        None => return Err(InvalidCompletion::Outcome),
    };
    checked(TelemetryEvent {
        runtime_hint: c.runtime_hint.as_deref().and_then(runtime_hint),
        interaction_id: c.interaction_id,
        surface: "mcp",
        operation: c.operation,
        classification: "confirmed",
        confirmation: Some("mcp"),
        occurred_at,
        status,
        duration_ms: c.duration.map(millis),
        refs: c.refs,
        session_source: "mcp",
        hint_source: "mcp",
        observation: None,
        sequence: None,
    })
}

/// The event for an instrumented HTTP response, without its `sequence`: `unclassified` (Epode
/// confirms it when a report names its interaction), no `confirmationMethod` (Epode refuses
/// one on an HTTP event), the real status; a session and a runtime hint are the customer's
/// and come over HTTP.
pub(super) fn build_http_event(
    c: &HttpCompletion,
    occurred_at: SystemTime,
) -> Result<TelemetryEvent, InvalidCompletion> {
    if !(100..=599).contains(&c.status) {
        return Err(InvalidCompletion::Outcome);
    }
    checked(TelemetryEvent {
        interaction_id: c.interaction_id.clone(),
        surface: c.surface.as_str(),
        operation: c.operation.clone(),
        classification: "unclassified",
        confirmation: None,
        occurred_at,
        status: c.status,
        duration_ms: Some(millis(c.duration)),
        refs: c.refs.clone(),
        session_source: "customer",
        runtime_hint: c.runtime_hint.as_deref().and_then(runtime_hint),
        hint_source: "http",
        observation: c
            .observation
            .as_ref()
            .and_then(super::observation::RequestObservation::to_json),
        sequence: None,
    })
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The event if its operation is one Epode takes, its references under the conflict rule
/// (they reach here valid: `IdentityRefs` only keeps valid ones).
fn checked(mut e: TelemetryEvent) -> Result<TelemetryEvent, InvalidCompletion> {
    if !valid_operation(&e.operation) {
        return Err(InvalidCompletion::Operation);
    }
    e.refs.drop_conflicting_customer();
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vectors() -> Value {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/protocol/epode-v1/conformance.json"
        );
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    fn completion(input: &Value) -> McpCompletion {
        let s = |k: &str| input.get(k).and_then(Value::as_str).map(str::to_owned);
        McpCompletion {
            interaction_id: "018f1f2e-7b4a-4c12-9c8d-123456789abc".into(),
            operation: s("operation").unwrap_or_default(),
            outcome: match input["outcome"].as_str() {
                Some("success") => Some(Outcome::Success),
                Some("error") => Some(Outcome::Error),
                _ => None,
            },
            duration: None,
            refs: IdentityRefs::from_meta(input),
            runtime_hint: s("runtimeHint"),
            link: None,
        }
    }

    /// Every `mcpCompletion` vector: the event, less the generated fields, equals the expected
    /// event exactly; invalid inputs produce no event and the expected error kind.
    #[test]
    fn conformance_mcp_completion_vectors() {
        let v = vectors();
        let cases = v["mcpCompletion"]["vectors"].as_array().unwrap();
        assert!(cases.len() >= 11);
        for case in cases {
            let name = case["name"].as_str().unwrap();
            let got =
                build_event(completion(&case["input"]), SystemTime::now()).map(|e| e.to_map());
            match case.get("expectedErrorKind").and_then(Value::as_str) {
                Some(kind) => {
                    let err = got.expect_err(name);
                    assert!(err.to_string().starts_with(kind), "{name}: {err}");
                }
                None => {
                    let mut obj = got.unwrap_or_else(|e| panic!("{name}: {e}"));
                    for generated in ["interactionId", "occurredAt"] {
                        assert!(obj.remove(generated).is_some(), "{name}: {generated}");
                    }
                    assert_eq!(&Value::Object(obj), &case["expectedEvent"], "{name}");
                }
            }
        }
    }

    /// The `mcpLinkedJourney` vectors, as Epode's SDK suites check them: each completion's
    /// identity and run `sessionRef` come as a product result's `_meta` identity would bring
    /// them (with the private content beside them, which must never reach an event); every
    /// event is `mcp`, confirmed by `mcp`, carries the identity and the runtime hint, the run's
    /// `sessionRef` (with `sessionSource: mcp`) when its proof holds and none when it is
    /// missing or invalid, 200 or 500 by outcome, under an interaction id of its own.
    /// (`sequence` is the queue's, numbered in `queue.rs`.)
    #[test]
    fn conformance_mcp_linked_journey_vectors() {
        let v = vectors();
        let j = &v["mcpLinkedJourney"];
        let sentinel = j["privateContentSentinel"].as_str().unwrap();
        let hint = j["runtimeHint"].as_str().unwrap();
        let mut expected = Vec::new();
        for run in j["runs"].as_array().unwrap() {
            for c in run["completions"].as_array().unwrap() {
                expected.push((c.clone(), run["sessionRef"].as_str().map(str::to_owned)));
            }
        }
        for u in j["unlinked"].as_array().unwrap() {
            expected.push((u.clone(), None));
        }
        assert_eq!(expected.len(), 10);
        let mut ids = std::collections::BTreeSet::new();
        for (i, (c, session)) in expected.iter().enumerate() {
            let mut meta = j["identity"].clone();
            meta["runtimeHint"] = json!(hint);
            meta["content"] = json!(sentinel);
            let proof = session
                .clone()
                .or_else(|| c["candidateSessionRef"].as_str().map(str::to_owned));
            if let Some(s) = proof {
                meta["sessionRef"] = json!(s);
            }
            let mut completion = completion(&json!({
                "operation": c["operation"], "outcome": c["outcome"],
            }));
            completion.refs = IdentityRefs::from_meta(&meta);
            completion.runtime_hint = Some(hint.to_owned());
            completion.interaction_id = uuid::Uuid::new_v4().hyphenated().to_string();
            let e = Value::Object(build_event(completion, SystemTime::now()).unwrap().to_map());
            let what = format!("completion {i}: {e}");
            assert!(!e.to_string().contains(sentinel), "{what}");
            assert!(
                ids.insert(e["interactionId"].as_str().unwrap().to_owned()),
                "{what}"
            );
            assert_eq!(e["surface"], "mcp", "{what}");
            assert_eq!(e["operation"], c["operation"], "{what}");
            assert_eq!(
                (&e["classification"], &e["confirmationMethod"]),
                (&json!("confirmed"), &json!("mcp")),
                "{what}"
            );
            let status = if c["outcome"] == "error" { 500 } else { 200 };
            assert_eq!(e["statusCode"], status, "{what}");
            for k in ["accountRef", "userRef", "anonymousRef"] {
                assert_eq!(e[k], j["identity"][k], "{what}");
            }
            assert_eq!(
                (&e["runtimeHint"], &e["runtimeHintSource"]),
                (&json!(hint), &json!("mcp")),
                "{what}"
            );
            match session {
                Some(s) => {
                    assert_eq!(e["sessionRef"], json!(s), "{what}");
                    assert_eq!(e["sessionSource"], "mcp", "{what}");
                }
                None => assert!(
                    e.get("sessionRef").is_none() && e.get("sessionSource").is_none(),
                    "{what}"
                ),
            }
        }
    }

    #[test]
    fn events_validate_against_the_batch_schema() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/protocol/epode-v1/telemetry-batch.schema.json"
        );
        let schema: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let validator = jsonschema::validator_for(&schema).unwrap();
        let mut c = completion(
            &json!({"operation":"get_summary","outcome":"error","accountRef":"a_1","sessionRef":"s:1","runtimeHint":"x 1"}),
        );
        c.duration = Some(Duration::from_millis(12));
        let mut event = build_event(c, SystemTime::now()).unwrap();
        event.sequence = Some(1);
        let batch = json!({"events": [event]});
        assert!(validator.is_valid(&batch), "{batch}");
        assert_eq!(batch["events"][0]["durationMs"], 12);
    }

    #[test]
    fn operations() {
        assert!(valid_operation("tools/get_summary"));
        assert!(!valid_operation("get_summary?customer=42"));
        assert!(!valid_operation("https://customer.example/tool"));
        assert!(!valid_operation(""));
        assert!(!valid_operation(&"x".repeat(161)));
    }

    fn http_completion() -> HttpCompletion {
        HttpCompletion {
            interaction_id: "018f1f2e-7b4a-4c12-9c8d-123456789abc".into(),
            surface: Surface::Json,
            operation: "/search/:id".into(),
            status: 201,
            duration: Duration::from_millis(7),
            refs: IdentityRefs::from_meta(
                &json!({"accountRef":"acct_1","userRef":"user.acct_1","customerRef":"acct_1","sessionRef":"s1"}),
            ),
            runtime_hint: Some("claude-code".into()),
            observation: None,
        }
    }

    #[test]
    fn an_http_event_is_unclassified_with_its_surface_and_real_status() {
        let mut event = build_http_event(&http_completion(), SystemTime::now())
            .unwrap()
            .to_map();
        assert!(event.remove("occurredAt").is_some());
        assert_eq!(
            Value::Object(event.clone()),
            json!({
                "interactionId": "018f1f2e-7b4a-4c12-9c8d-123456789abc",
                "surface": "http_json",
                "operation": "/search/:id",
                "classification": "unclassified",
                "statusCode": 201,
                "durationMs": 7,
                "accountRef": "acct_1",
                "userRef": "user.acct_1",
                "customerRef": "acct_1",
                "sessionRef": "s1",
                "sessionSource": "customer",
                "runtimeHint": "claude-code",
                "runtimeHintSource": "http"
            })
        );
        assert!(!event.contains_key("confirmationMethod"));
        let keys: Vec<&str> = event.keys().map(String::as_str).collect();
        assert_eq!(&keys[..3], ["interactionId", "surface", "operation"]);
    }

    #[test]
    fn http_events_validate_against_the_batch_schema() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/protocol/epode-v1/telemetry-batch.schema.json"
        );
        let schema: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let validator = jsonschema::validator_for(&schema).unwrap();
        for surface in Surface::ALL {
            let mut c = http_completion();
            c.surface = surface;
            let mut event = build_http_event(&c, SystemTime::now()).unwrap();
            event.sequence = Some(1);
            let batch = json!({"events": [event]});
            assert!(validator.is_valid(&batch), "{batch}");
        }
        let mut bad = http_completion();
        bad.operation = "/a b".into();
        assert_eq!(
            build_http_event(&bad, SystemTime::now()).unwrap_err(),
            InvalidCompletion::Operation
        );
    }
}
