//! The two local tools the sidecar adds to `tools/list` and answers itself,
//! `record_product_feedback_consent` and `report_product_feedback`: their definitions, the
//! strict validation of their arguments, the bodies forwarded to Epode, the results returned to
//! the agent (success, failure with its guidance, invalid arguments), and the placement of
//! `_agentFeedback` in a product tool's result.
//!
//! Texts and result shapes follow the reference binding (`sdk/node/src/mcp.ts`). Epode's own
//! error text is never relayed: a failure result says only the status, whether to retry, and how.

use serde_json::value::{to_raw_value, RawValue};
use serde_json::{json, Map, Value};

use super::capability::FeedbackHandle;
use super::{CONSENT_TOOL, REPORT_TOOL};

/// Title and description of the consent tool (reference mcp.ts).
pub const CONSENT_TITLE: &str = "Record product feedback permission";
pub const CONSENT_DESCRIPTION: &str = "After asking the exact question returned by a product tool, record only the user's explicit approved or declined answer. Never infer approval from silence. Epode returns a separate report action only after approval.";
/// Title and description of the report tool (reference mcp.ts).
pub const REPORT_TITLE: &str = "Report product feedback";
pub const REPORT_DESCRIPTION: &str = "Submit one structured feedback report only when the product result or permission tool returned this report action. Describe the contribution and applicable findings without forcing a success/failure verdict. Never include prompts, transcripts, credentials, personal data, or raw product content.";

/// Consent result texts (reference mcp.ts).
pub const DECLINED_TEXT: &str = "Permission declined. Do not submit product feedback.";
pub const CONSENT_UNAVAILABLE_TEXT: &str = "Epode is temporarily unavailable. Retry this permission action exactly once with the same arguments; never assume approval.";
/// Report result texts (reference mcp.ts).
pub const REPORT_ACCEPTED_TEXT: &str = "Product feedback accepted. Keep this routine background success out of the final answer unless the user explicitly asked about feedback.";
pub const REPORT_UNAVAILABLE_TEXT: &str =
    "Agent Feedback is temporarily unavailable. Retry this tool exactly once with the same arguments.";

/// The report fields forwarded to Epode, in the order the reference sends them.
const REPORT_FIELDS: [&str; 5] = ["summary", "impact", "confidence", "findings", "workaround"];
/// Enough problems to fix a call; a pathological argument cannot grow the message without bound.
const MAX_LISTED_PROBLEMS: usize = 10;

fn annotations() -> Value {
    json!({
        "readOnlyHint": false,
        "destructiveHint": false,
        "idempotentHint": true,
    })
}

fn handle_schema() -> Value {
    json!({ "type": "string", "pattern": "^afr2_" })
}

/// The consent tool's strict input schema.
pub fn consent_input_schema() -> Value {
    json!({
        "type": "object",
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "properties": {
            "feedbackHandle": handle_schema(),
            "decision": { "type": "string", "enum": ["approved", "declined"] },
        },
        "required": ["feedbackHandle", "decision"],
        "additionalProperties": false,
    })
}

/// The report tool's strict input schema: the handle plus every limit of
/// `feedback-report.schema.json` (including "detail is required when a workaround was used").
pub fn report_input_schema() -> Value {
    json!({
        "type": "object",
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "properties": {
            "feedbackHandle": handle_schema(),
            "summary": { "type": "string", "minLength": 8, "maxLength": 700 },
            "impact": {
                "type": "string",
                "enum": ["helped", "helped_with_friction", "neutral", "hindered", "blocked", "unknown"],
            },
            "confidence": { "type": "number", "minimum": 0, "maximum": 1 },
            "findings": {
                "type": "array",
                "maxItems": 8,
                "items": {
                    "type": "object",
                    "properties": {
                        "kind": {
                            "type": "string",
                            "enum": ["strength", "friction", "defect", "gap", "suggestion", "uncertainty", "other"],
                        },
                        "topic": { "type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,63}$" },
                        "severity": { "type": "string", "enum": ["minor", "major", "blocking"] },
                        "detail": { "type": "string", "minLength": 3, "maxLength": 350 },
                    },
                    "required": ["kind", "topic", "detail"],
                    "additionalProperties": false,
                },
            },
            "workaround": {
                "type": "object",
                "properties": {
                    "used": { "type": "boolean" },
                    "detail": { "type": "string", "minLength": 3, "maxLength": 350 },
                },
                "required": ["used"],
                "additionalProperties": false,
                "if": { "properties": { "used": { "const": true } } },
                "then": { "required": ["detail"] },
            },
        },
        "required": ["feedbackHandle", "summary"],
        "additionalProperties": false,
    })
}

/// The `tools/list` entry of the consent tool.
pub fn consent_tool() -> Value {
    json!({
        "name": CONSENT_TOOL,
        "title": CONSENT_TITLE,
        "description": CONSENT_DESCRIPTION,
        "inputSchema": consent_input_schema(),
        "annotations": annotations(),
    })
}

/// The `tools/list` entry of the report tool.
pub fn report_tool() -> Value {
    json!({
        "name": REPORT_TOOL,
        "title": REPORT_TITLE,
        "description": REPORT_DESCRIPTION,
        "inputSchema": report_input_schema(),
        "annotations": annotations(),
    })
}

/// Whether a tool name is one of the two local tools (they are never forwarded or decorated).
pub fn is_feedback_tool(name: &str) -> bool {
    name == CONSENT_TOOL || name == REPORT_TOOL
}

/// A consent decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Approved,
    Declined,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Approved => "approved",
            Decision::Declined => "declined",
        }
    }
}

/// A valid consent call: what to send to `POST /api/v2/consent/decisions`.
#[derive(Debug, Clone)]
pub struct ConsentCall {
    /// The `Authorization: Bearer` credential.
    pub handle: FeedbackHandle,
    pub decision: Decision,
    /// Exactly `{"decision": …}`.
    pub body: Value,
}

/// A valid report call: what to send to `POST /api/v2/reports`.
#[derive(Debug, Clone)]
pub struct ReportCall {
    /// The `Authorization: Bearer` credential.
    pub handle: FeedbackHandle,
    /// The report fields the agent gave (summary, impact, confidence, findings, workaround),
    /// values untouched; never the handle.
    pub body: Value,
}

/// Arguments that do not satisfy a tool's input schema, listed for the agent to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Input validation error: Invalid arguments for tool {tool}: {}", .problems.join(", "))]
pub struct InvalidArguments {
    pub tool: &'static str,
    pub problems: Vec<String>,
}

impl InvalidArguments {
    /// The `isError` result that tells the agent what is wrong (the reference's wording).
    pub fn to_result(&self) -> Value {
        json!({
            "content": [{ "type": "text", "text": self.to_string() }],
            "isError": true,
        })
    }
}

/// A compile failure of the built-in schemas: a programming error, reported rather than
/// panicking so the process can refuse to start with a message.
#[derive(Debug, thiserror::Error)]
#[error("the {tool} input schema does not compile: {message}")]
pub struct SchemaError {
    tool: &'static str,
    message: String,
}

/// The compiled validators of both tools; build once at start.
pub struct FeedbackTools {
    consent: jsonschema::Validator,
    report: jsonschema::Validator,
}

impl std::fmt::Debug for FeedbackTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeedbackTools").finish_non_exhaustive()
    }
}

impl FeedbackTools {
    pub fn new() -> Result<Self, SchemaError> {
        let compile = |tool, schema: Value| {
            jsonschema::draft202012::new(&schema).map_err(|e| SchemaError {
                tool,
                message: e.to_string(),
            })
        };
        Ok(FeedbackTools {
            consent: compile(CONSENT_TOOL, consent_input_schema())?,
            report: compile(REPORT_TOOL, report_input_schema())?,
        })
    }

    /// Both `tools/list` entries, consent first (the reference's registration order).
    pub fn definitions(&self) -> Vec<Value> {
        vec![consent_tool(), report_tool()]
    }

    /// Validates `record_product_feedback_consent` arguments (absent arguments count as `{}`).
    pub fn validate_consent_args(&self, args: &Value) -> Result<ConsentCall, InvalidArguments> {
        let args = check(&self.consent, CONSENT_TOOL, args)?;
        // The schema guarantees both fields; the fallbacks only keep this panic-free.
        let decision = match args.get("decision").and_then(Value::as_str) {
            Some("approved") => Decision::Approved,
            Some("declined") => Decision::Declined,
            _ => return Err(unexpected(CONSENT_TOOL)),
        };
        Ok(ConsentCall {
            handle: handle_of(args, CONSENT_TOOL)?,
            decision,
            body: json!({ "decision": decision.as_str() }),
        })
    }

    /// Validates `report_product_feedback` arguments (absent arguments count as `{}`).
    pub fn validate_report_args(&self, args: &Value) -> Result<ReportCall, InvalidArguments> {
        let args = check(&self.report, REPORT_TOOL, args)?;
        let mut body = Map::new();
        for field in REPORT_FIELDS {
            if let Some(value) = args.get(field) {
                body.insert(field.to_owned(), value.clone());
            }
        }
        Ok(ReportCall {
            handle: handle_of(args, REPORT_TOOL)?,
            body: Value::Object(body),
        })
    }
}

fn check<'a>(
    validator: &jsonschema::Validator,
    tool: &'static str,
    args: &'a Value,
) -> Result<&'a Map<String, Value>, InvalidArguments> {
    // Absent arguments are checked as `{}`, so the agent learns which fields are required.
    let empty = json!({});
    let instance = if args.is_null() { &empty } else { args };
    let errors: Vec<_> = validator.iter_errors(instance).collect();
    if !errors.is_empty() {
        let total = errors.len();
        let mut problems: Vec<String> = errors
            .iter()
            .take(MAX_LISTED_PROBLEMS)
            .map(|error| {
                // Dotted paths as the reference prints them (`findings.0.topic`); the value
                // itself is masked so a long summary is not echoed back.
                let path = error.instance_path().to_string();
                let path = path.trim_start_matches('/').replace('/', ".");
                let message = error.masked().to_string();
                if path.is_empty() {
                    message
                } else {
                    format!("{path}: {message}")
                }
            })
            .collect();
        if total > MAX_LISTED_PROBLEMS {
            problems.push(format!("and {} more", total - MAX_LISTED_PROBLEMS));
        }
        return Err(InvalidArguments { tool, problems });
    }
    args.as_object().ok_or_else(|| unexpected(tool))
}

fn handle_of(
    args: &Map<String, Value>,
    tool: &'static str,
) -> Result<FeedbackHandle, InvalidArguments> {
    args.get("feedbackHandle")
        .and_then(Value::as_str)
        .map(FeedbackHandle::unverified)
        .ok_or_else(|| unexpected(tool))
}

fn unexpected(tool: &'static str) -> InvalidArguments {
    InvalidArguments {
        tool,
        problems: vec!["arguments must be an object with feedbackHandle".to_owned()],
    }
}

fn text_block(text: impl Into<String>) -> Value {
    json!({ "type": "text", "text": text.into() })
}

/// The `Bearer ` prefix stripped the way the reference does (`/^Bearer\s+/`).
fn strip_bearer(authorization: &str) -> &str {
    match authorization.strip_prefix("Bearer") {
        Some(rest) if rest.starts_with(char::is_whitespace) => rest.trim_start(),
        _ => authorization,
    }
}

/// A 2xx from the consent endpoint. `body` is Epode's JSON (an empty object if it was not JSON).
/// On approval Epode's `feedback` contract carries the same handle; the result then adds
/// `reportTool` and `feedbackHandle` and tells the agent to report now. Any other outcome
/// (declined, or a stored decision without a feedback action) gets the declined text.
pub fn consent_success(decision: Decision, body: Value) -> Value {
    let mut structured = match body {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    let returned = structured
        .get("feedback")
        .and_then(|feedback| feedback.get("submit"))
        .and_then(|submit| submit.get("authorization"))
        .and_then(Value::as_str)
        .map(|authorization| strip_bearer(authorization).to_owned());
    let text = match (&returned, decision) {
        (Some(handle), Decision::Approved) => format!(
            "Permission approved. Now autonomously call {REPORT_TOOL} with feedbackHandle {handle}, a concise summary, and any applicable findings. Do not ask again."
        ),
        _ => DECLINED_TEXT.to_owned(),
    };
    if let Some(handle) = returned {
        structured.insert("reportTool".into(), json!(REPORT_TOOL));
        structured.insert("feedbackHandle".into(), json!(handle));
    }
    json!({
        "content": [text_block(text)],
        "structuredContent": Value::Object(structured),
    })
}

/// A 2xx from the report endpoint: Epode's receipt as `structuredContent` (an empty object if
/// it was not a JSON object).
pub fn report_success(body: Value) -> Value {
    let body = if body.is_object() { body } else { json!({}) };
    json!({
        "content": [text_block(REPORT_ACCEPTED_TEXT)],
        "structuredContent": body,
    })
}

/// How a call to Epode failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpodeFailure {
    /// A response outside 2xx.
    Status(u16),
    /// No response: connection error or the 10 s timeout (or an answer that is not one).
    Unavailable,
    /// The handle is not one this product's key signed, or it expired: checked locally,
    /// never sent to Epode.
    InvalidHandle,
}

/// The longest handle the sidecar looks at; one it signs is under 400 characters.
pub const MAX_HANDLE_LEN: usize = 2048;

pub const INVALID_HANDLE_REPORT_TEXT: &str = "Feedback submission failed: the feedbackHandle is invalid or expired. Do not retry with this handle; use the feedbackHandle from a newer product result.";
pub const INVALID_HANDLE_CONSENT_TEXT: &str = "Permission could not be recorded: the feedbackHandle is invalid or expired. Do not retry with this handle; use the feedbackHandle from a newer product result. Never assume approval.";

/// What the agent may do after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Guidance {
    pub retryable: bool,
    pub text: &'static str,
}

fn transient(status: u16) -> bool {
    status == 408 || status == 429 || status >= 500
}

/// Guidance after a failed consent call (reference `consentFailureGuidance`).
pub fn consent_guidance(status: u16) -> Guidance {
    let (retryable, text) = match status {
        s if transient(s) => (
            true,
            "Retry this permission action exactly once with the same arguments; never assume approval.",
        ),
        401 => (
            false,
            "The consent handle is invalid or expired; do not retry with the same handle. Do not assume approval.",
        ),
        409 => (
            false,
            "Consent is not applicable to the product's current mode. Do not retry; never assume approval.",
        ),
        410 => (
            false,
            "Feedback collection is disabled. Do not retry; never assume approval.",
        ),
        404 => (
            false,
            "The consent endpoint is unavailable for this integration. Do not retry; never assume approval.",
        ),
        _ => (false, "Do not retry. Do not assume approval."),
    };
    Guidance { retryable, text }
}

/// Guidance after a failed report call (reference `reportFailureGuidance`). A 400/422 is
/// retryable once with only the required fields, since an optional field is the likely cause.
pub fn report_guidance(status: u16) -> Guidance {
    let (retryable, text) = match status {
        400 | 422 => (
            true,
            "Retry this tool exactly once with only feedbackHandle and a concise summary; omit every optional field.",
        ),
        s if transient(s) => (true, "Retry this tool exactly once with the same arguments."),
        401 => (
            false,
            "The feedback handle is invalid or expired; do not retry with the same handle.",
        ),
        403 => (
            false,
            "Consent is required or was declined; do not retry. Never call this tool unless a feedback_ready action returned it.",
        ),
        409 => (
            false,
            "The feedback handle belongs to a different product environment. Do not retry.",
        ),
        410 => (false, "Feedback collection is disabled. Do not retry."),
        404 => (
            false,
            "The feedback endpoint is unavailable for this integration. Do not retry.",
        ),
        _ => (false, "Do not retry with the same handle."),
    };
    Guidance { retryable, text }
}

fn failure_result(text: String, retryable: bool) -> Value {
    json!({
        "isError": true,
        "content": [text_block(text)],
        "structuredContent": { "accepted": false, "retryable": retryable },
    })
}

/// The `isError` result of a failed consent call.
pub fn consent_failure(failure: EpodeFailure) -> Value {
    match failure {
        EpodeFailure::Status(status) => {
            let guidance = consent_guidance(status);
            failure_result(
                format!(
                    "Permission could not be recorded (HTTP {status}). {}",
                    guidance.text
                ),
                guidance.retryable,
            )
        }
        EpodeFailure::Unavailable => failure_result(CONSENT_UNAVAILABLE_TEXT.to_owned(), true),
        EpodeFailure::InvalidHandle => {
            failure_result(INVALID_HANDLE_CONSENT_TEXT.to_owned(), false)
        }
    }
}

/// The `isError` result of a failed report call.
pub fn report_failure(failure: EpodeFailure) -> Value {
    match failure {
        EpodeFailure::Status(status) => {
            let guidance = report_guidance(status);
            failure_result(
                format!(
                    "Feedback submission failed with HTTP {status}. {}",
                    guidance.text
                ),
                guidance.retryable,
            )
        }
        EpodeFailure::Unavailable => failure_result(REPORT_UNAVAILABLE_TEXT.to_owned(), true),
        EpodeFailure::InvalidHandle => failure_result(INVALID_HANDLE_REPORT_TEXT.to_owned(), false),
    }
}

/// A JSON object whose values keep their exact bytes until opened (the proxy's result form).
pub type RawObject = crate::mcp::rewrite::RawMap;

/// An intermediate MCP result (`resultType: "input_required"`) is not a completed interaction:
/// it gets neither decoration nor telemetry.
pub fn is_input_required(result: &Value) -> bool {
    result.get("resultType").and_then(Value::as_str) == Some("input_required")
}

fn raw_is_input_required(result: &RawObject) -> bool {
    result
        .get("resultType")
        .and_then(|value| serde_json::from_str::<String>(value.get()).ok())
        .is_some_and(|kind| kind == "input_required")
}

/// Places `_agentFeedback` in a product tool result, as the reference binding does:
///
/// - a tool without `outputSchema` whose `structuredContent` is absent or an object gets
///   `structuredContent._agentFeedback` (creating `structuredContent` when absent);
/// - a tool with `outputSchema`, or a non-object `structuredContent`, keeps `structuredContent`
///   exactly as it was, and the object goes in a standalone JSON text block
///   `{"_agentFeedback": {...}}`; a non-object value with no text block first gets its own JSON
///   text, so adding ours does not hide it from clients that fall back to text;
/// - then one plain-text restatement.
///
/// Only `structuredContent` and `content` are rewritten, and every value inside them keeps its
/// exact bytes (`1e400` stays `1e400`). Returns false, changing nothing, for an
/// `input_required` result.
pub fn decorate_raw(
    result: &mut RawObject,
    agent_feedback: &Value,
    restatement: &str,
    has_output_schema: bool,
) -> bool {
    if raw_is_input_required(result) {
        return false;
    }
    let structured = result.get("structuredContent");
    let structured_object: Option<RawObject> = structured
        .filter(|value| value.get().trim_start().starts_with('{'))
        .and_then(|value| serde_json::from_str(value.get()).ok());
    let non_object_structured = structured.is_some() && structured_object.is_none();
    // A `content` that is not an array is not MCP; like the reference, start a fresh one.
    let mut content: Vec<Box<RawValue>> = result
        .get("content")
        .and_then(|value| serde_json::from_str(value.get()).ok())
        .unwrap_or_default();

    let Ok(feedback) = to_raw_value(agent_feedback) else {
        return false;
    };
    if non_object_structured && !content.iter().any(|block| is_text_block(block)) {
        if let Some(value) = structured {
            content.push(raw_text_block(value.get().trim()));
        }
    }
    let new_structured = if has_output_schema || non_object_structured {
        content.push(raw_text_block(&format!(
            "{{\"_agentFeedback\":{}}}",
            feedback.get()
        )));
        None
    } else {
        let mut object = structured_object.unwrap_or_default();
        object.insert("_agentFeedback".into(), feedback);
        match to_raw_value(&object) {
            Ok(value) => Some(value),
            Err(_) => return false,
        }
    };
    content.push(raw_text_block(restatement));
    let Ok(content) = to_raw_value(&content) else {
        return false;
    };
    // The reference builds `{...result, structuredContent, content}`: existing keys keep their
    // place, new ones follow in this order.
    if let Some(value) = new_structured {
        result.insert("structuredContent".into(), value);
    }
    result.insert("content".into(), content);
    true
}

/// [`decorate_raw`] for a result already parsed as a `Value` (whose numbers serde_json may have
/// normalised on parsing, e.g. `1e400` as `1e+400`). Returns false, changing nothing, for a
/// result that is not an object or is `input_required`.
pub fn decorate(
    result: &mut Value,
    agent_feedback: Value,
    restatement: String,
    has_output_schema: bool,
) -> bool {
    if !result.is_object() {
        return false;
    }
    let Ok(mut raw) = serde_json::from_str::<RawObject>(&result.to_string()) else {
        return false;
    };
    if !decorate_raw(&mut raw, &agent_feedback, &restatement, has_output_schema) {
        return false;
    }
    match serde_json::to_string(&raw).and_then(|text| serde_json::from_str(&text)) {
        Ok(decorated) => {
            *result = decorated;
            true
        }
        Err(_) => false,
    }
}

fn is_text_block(block: &RawValue) -> bool {
    #[derive(serde::Deserialize)]
    struct Block {
        #[serde(rename = "type")]
        kind: Option<String>,
    }
    serde_json::from_str::<Block>(block.get()).is_ok_and(|b| b.kind.as_deref() == Some("text"))
}

fn raw_text_block(text: &str) -> Box<RawValue> {
    // A text block of a plain string always serialises; the default (`null`) would mark a bug.
    to_raw_value(&text_block(text)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::feedback::capability::{mint, ProductKey};
    use crate::feedback::envelope::{Case, Envelope};
    use crate::feedback::FeedbackMode;
    use std::time::{Duration, UNIX_EPOCH};

    const KEY: &str =
        "af_live_0123456789abcdef0123456789abcdef_conformance_secret_0123456789abcdef";
    const HANDLE: &str = "afr2_0123456789abcdef0123456789abcdef.payload.sig";

    fn tools() -> FeedbackTools {
        FeedbackTools::new().expect("schemas compile")
    }

    fn fixture(name: &str) -> Value {
        let path = format!(
            "{}/tests/fixtures/epode-protocol-v1/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("JSON")
    }

    #[test]
    fn definitions_match_the_reference_binding() {
        let defs = tools().definitions();
        let names: Vec<&str> = defs.iter().filter_map(|d| d["name"].as_str()).collect();
        assert_eq!(names, [CONSENT_TOOL, REPORT_TOOL]);
        for def in &defs {
            let keys: Vec<&str> = def
                .as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .collect();
            assert_eq!(
                keys,
                ["name", "title", "description", "inputSchema", "annotations"]
            );
            assert_eq!(
                def["annotations"],
                json!({"readOnlyHint": false, "destructiveHint": false, "idempotentHint": true})
            );
            assert_eq!(def["inputSchema"]["type"], "object");
            assert_eq!(def["inputSchema"]["additionalProperties"], false);
            assert_eq!(
                def["inputSchema"]["properties"]["feedbackHandle"]["pattern"],
                "^afr2_"
            );
        }
        assert_eq!(defs[0]["title"], "Record product feedback permission");
        assert_eq!(defs[1]["title"], "Report product feedback");
        assert_eq!(
            defs[0]["inputSchema"]["required"],
            json!(["feedbackHandle", "decision"])
        );
        assert_eq!(
            defs[1]["inputSchema"]["required"],
            json!(["feedbackHandle", "summary"])
        );
    }

    /// The report tool carries every limit of the protocol's report schema: its properties,
    /// minus the handle, are the protocol's properties with the same constraints.
    #[test]
    fn report_schema_carries_the_full_protocol_limits() {
        let protocol = fixture("feedback-report.schema.json");
        let ours = report_input_schema();
        let mut props = ours["properties"].as_object().unwrap().clone();
        assert!(props.shift_remove("feedbackHandle").is_some());
        let theirs = protocol["properties"].as_object().unwrap();
        assert_eq!(
            props.keys().collect::<Vec<_>>(),
            theirs.keys().collect::<Vec<_>>()
        );
        // Same accept/reject decisions on a battery of report bodies.
        let protocol_validator = jsonschema::validator_for(&protocol).unwrap();
        let tools = tools();
        let bodies = [
            json!({"summary": "The status result answered the question."}),
            json!({"summary": "short"}),
            json!({"summary": "x".repeat(701)}),
            json!({"summary": "Worked fine overall.", "impact": "helped_with_friction", "confidence": 0.92}),
            json!({"summary": "Worked fine overall.", "impact": "great"}),
            json!({"summary": "Worked fine overall.", "confidence": 1.5}),
            json!({"summary": "Worked fine overall.", "confidence": -0.1}),
            json!({"summary": "Worked fine overall.", "findings": [{"kind": "friction", "topic": "latency", "severity": "minor", "detail": "The first request timed out."}]}),
            json!({"summary": "Worked fine overall.", "findings": [{"kind": "friction", "topic": "Latency", "detail": "abc"}]}),
            json!({"summary": "Worked fine overall.", "findings": [{"kind": "friction", "topic": "latency", "detail": "ab"}]}),
            json!({"summary": "Worked fine overall.", "findings": [{"kind": "friction", "topic": "latency", "detail": "abc", "extra": 1}]}),
            json!({"summary": "Worked fine overall.", "findings": vec![json!({"kind": "gap", "topic": "t", "detail": "abc"}); 9]}),
            json!({"summary": "Worked fine overall.", "workaround": {"used": true, "detail": "Retried once."}}),
            json!({"summary": "Worked fine overall.", "workaround": {"used": true}}),
            json!({"summary": "Worked fine overall.", "workaround": {"used": false}}),
            json!({"summary": "Worked fine overall.", "workaround": {"used": false, "detail": "ab"}}),
            json!({"summary": "Worked fine overall.", "consent": true}),
        ];
        for body in bodies {
            let mut args = body.as_object().unwrap().clone();
            args.insert("feedbackHandle".into(), json!(HANDLE));
            assert_eq!(
                tools.validate_report_args(&Value::Object(args)).is_ok(),
                protocol_validator.is_valid(&body),
                "{body}"
            );
        }
    }

    #[test]
    fn consent_arguments_forward_only_the_decision() {
        let tools = tools();
        let call = tools
            .validate_consent_args(&json!({"feedbackHandle": HANDLE, "decision": "approved"}))
            .unwrap();
        assert_eq!(call.handle.as_str(), HANDLE);
        assert_eq!(call.decision, Decision::Approved);
        assert_eq!(call.body, json!({"decision": "approved"}));
        // The forwarded body satisfies the protocol's decision schema.
        let decision_schema =
            jsonschema::validator_for(&fixture("consent-decision.schema.json")).unwrap();
        assert!(decision_schema.is_valid(&call.body));

        let declined = tools
            .validate_consent_args(&json!({"decision": "declined", "feedbackHandle": HANDLE}))
            .unwrap();
        assert_eq!(declined.body, json!({"decision": "declined"}));
    }

    #[test]
    fn invalid_consent_calls_say_what_is_wrong() {
        let tools = tools();
        let err = tools
            .validate_consent_args(
                &json!({"feedbackHandle": "afr1_x", "decision": "yes", "note": "hi"}),
            )
            .unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("Input validation error: Invalid arguments for tool record_product_feedback_consent: "), "{text}");
        assert!(text.contains("feedbackHandle: "), "{text}");
        assert!(text.contains("decision: "), "{text}");
        assert!(text.contains("'note'"), "{text}");

        for absent in [Value::Null, json!({})] {
            let err = tools.validate_consent_args(&absent).unwrap_err();
            assert!(err.to_string().contains("\"feedbackHandle\""), "{err}");
            assert!(err.to_string().contains("\"decision\""), "{err}");
        }
        for not_object in [json!([]), json!("afr2_x"), json!(3)] {
            assert!(tools.validate_consent_args(&not_object).is_err());
        }
        let result = err.to_result();
        assert_eq!(result["isError"], true);
        assert_eq!(result["content"][0]["text"], err.to_string());
        assert!(result.get("structuredContent").is_none());
    }

    #[test]
    fn report_arguments_forward_only_report_fields_unchanged() {
        let tools = tools();
        let args: Value = serde_json::from_str(&format!(
            r#"{{"workaround":{{"used":true,"detail":"The agent retried once."}},"confidence":0.920000000000000000001,"feedbackHandle":"{HANDLE}","summary":"The status result answered the question.","findings":[{{"kind":"strength","topic":"accuracy","detail":"The final status was correct."}}],"impact":"helped_with_friction"}}"#
        ))
        .unwrap();
        let call = tools.validate_report_args(&args).unwrap();
        assert_eq!(call.handle.as_str(), HANDLE);
        assert_eq!(
            call.body.to_string(),
            r#"{"summary":"The status result answered the question.","impact":"helped_with_friction","confidence":0.920000000000000000001,"findings":[{"kind":"strength","topic":"accuracy","detail":"The final status was correct."}],"workaround":{"used":true,"detail":"The agent retried once."}}"#
        );
        let minimal = tools
            .validate_report_args(
                &json!({"feedbackHandle": HANDLE, "summary": "Answered the question."}),
            )
            .unwrap();
        assert_eq!(minimal.body, json!({"summary": "Answered the question."}));
    }

    #[test]
    fn invalid_report_calls_list_every_problem_with_paths() {
        let tools = tools();
        let long_secret = "private words ".repeat(60);
        let err = tools
            .validate_report_args(&json!({
                "feedbackHandle": "x",
                "summary": long_secret,
                "confidence": 2,
                "extra": 1,
                "findings": [{"kind": "gap", "topic": "Bad Topic", "detail": "ok!"}],
                "workaround": {"used": true},
            }))
            .unwrap_err();
        let text = err.to_string();
        for expected in [
            "feedbackHandle: ",
            "summary: ",
            "confidence: ",
            "'extra'",
            "findings.0.topic: ",
            "workaround: ",
            "\"detail\"",
        ] {
            assert!(text.contains(expected), "{expected} missing from {text}");
        }
        assert!(!text.contains("private words"), "values are masked: {text}");

        let many: Vec<Value> = (0..40).map(|_| json!({"kind": 1})).collect();
        let err = tools
            .validate_report_args(
                &json!({"feedbackHandle": HANDLE, "summary": "Answered it.", "findings": many}),
            )
            .unwrap_err();
        assert_eq!(err.problems.len(), MAX_LISTED_PROBLEMS + 1);
        assert!(err.problems.last().unwrap().starts_with("and "));
    }

    #[test]
    fn consent_results() {
        let approved_body = json!({
            "state": "approved",
            "decidedAt": "2026-08-08T10:00:00Z",
            "changed": true,
            "feedback": {"state": "feedback_ready", "submit": {"authorization": format!("Bearer {HANDLE}")}},
        });
        let result = consent_success(Decision::Approved, approved_body.clone());
        assert_eq!(
            result["content"][0]["text"],
            format!("Permission approved. Now autonomously call report_product_feedback with feedbackHandle {HANDLE}, a concise summary, and any applicable findings. Do not ask again.")
        );
        let structured = result["structuredContent"].as_object().unwrap();
        let keys: Vec<&str> = structured.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "state",
                "decidedAt",
                "changed",
                "feedback",
                "reportTool",
                "feedbackHandle"
            ]
        );
        assert_eq!(structured["feedback"], approved_body["feedback"]);
        assert_eq!(structured["reportTool"], REPORT_TOOL);
        assert_eq!(structured["feedbackHandle"], HANDLE);
        assert!(result.get("isError").is_none());

        let declined = consent_success(
            Decision::Declined,
            json!({"state": "declined", "decidedAt": "2026-08-08T10:00:00Z", "changed": true, "feedback": null}),
        );
        assert_eq!(declined["content"][0]["text"], DECLINED_TEXT);
        assert_eq!(
            DECLINED_TEXT,
            "Permission declined. Do not submit product feedback."
        );
        assert!(declined["structuredContent"].get("reportTool").is_none());
        assert!(declined["structuredContent"]
            .get("feedbackHandle")
            .is_none());

        // Approved, but Epode returned no feedback action (e.g. a stale handle): no report.
        let stale = consent_success(
            Decision::Approved,
            json!({"state": "declined", "changed": false, "feedback": null}),
        );
        assert_eq!(stale["content"][0]["text"], DECLINED_TEXT);
        assert_eq!(
            consent_success(Decision::Approved, json!("not json"))["structuredContent"],
            json!({})
        );
    }

    #[test]
    fn report_results() {
        let receipt = json!({"accepted": true, "interactionId": "018f1f2e-7b4a-7c12-9c8d-123456789abc", "report": {"id": "r1"}});
        let result = report_success(receipt.clone());
        assert_eq!(result["structuredContent"], receipt);
        assert_eq!(result["content"][0]["text"], REPORT_ACCEPTED_TEXT);
        assert_eq!(report_success(Value::Null)["structuredContent"], json!({}));
    }

    #[test]
    fn failures_carry_the_contract_guidance_and_never_epode_text() {
        // (status, report retryable, consent retryable), the contract's table.
        let table = [
            (408, true, true),
            (429, true, true),
            (500, true, true),
            (503, true, true),
            (400, true, false),
            (422, true, false),
            (401, false, false),
            (403, false, false),
            (404, false, false),
            (409, false, false),
            (410, false, false),
            (418, false, false),
        ];
        for (status, report_retry, consent_retry) in table {
            let report = report_failure(EpodeFailure::Status(status));
            assert_eq!(report["isError"], true);
            assert_eq!(
                report["structuredContent"],
                json!({"accepted": false, "retryable": report_retry}),
                "{status}"
            );
            let text = report["content"][0]["text"].as_str().unwrap();
            assert_eq!(
                text,
                format!(
                    "Feedback submission failed with HTTP {status}. {}",
                    report_guidance(status).text
                )
            );

            let consent = consent_failure(EpodeFailure::Status(status));
            assert_eq!(
                consent["structuredContent"],
                json!({"accepted": false, "retryable": consent_retry}),
                "{status}"
            );
            let text = consent["content"][0]["text"].as_str().unwrap();
            assert_eq!(
                text,
                format!(
                    "Permission could not be recorded (HTTP {status}). {}",
                    consent_guidance(status).text
                )
            );
            assert_eq!(consent["content"].as_array().unwrap().len(), 1);
        }
        assert_eq!(report_guidance(400).text, "Retry this tool exactly once with only feedbackHandle and a concise summary; omit every optional field.");
        assert_eq!(report_guidance(403).text, "Consent is required or was declined; do not retry. Never call this tool unless a feedback_ready action returned it.");
        assert_eq!(consent_guidance(401).text, "The consent handle is invalid or expired; do not retry with the same handle. Do not assume approval.");

        let report = report_failure(EpodeFailure::Unavailable);
        assert_eq!(
            report["structuredContent"],
            json!({"accepted": false, "retryable": true})
        );
        assert_eq!(report["content"][0]["text"], REPORT_UNAVAILABLE_TEXT);
        let consent = consent_failure(EpodeFailure::Unavailable);
        assert_eq!(
            consent["structuredContent"],
            json!({"accepted": false, "retryable": true})
        );
        assert_eq!(consent["content"][0]["text"], CONSENT_UNAVAILABLE_TEXT);
    }

    fn feedback() -> (Value, String) {
        let key = ProductKey::parse(KEY).unwrap();
        let minted = mint(&key, UNIX_EPOCH + Duration::from_secs(1_715_000_000), None);
        let envelope = Envelope::new(
            Case::for_product_result(
                FeedbackMode::NeverAsk,
                crate::feedback::envelope::CachedConsent::Unknown,
            )
            .unwrap(),
            minted.handle,
            minted.claims.exp,
        );
        (envelope.agent_feedback(), envelope.restatement())
    }

    fn texts(result: &Value) -> Vec<&str> {
        result["content"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect()
    }

    #[test]
    fn schemaless_tool_gets_structured_content_feedback() {
        let (feedback, restatement) = feedback();
        let raw = r#"{"content":[{"type":"text","text":"ok \u00e9"}],"structuredContent":{"big":12345678901234567890, "f":0.1,"e":1e400,"s":"\ud83d\ude80"},"isError":false,"_meta":{"x":"\u00e9","n":1E5}}"#;
        let mut result: RawObject = serde_json::from_str(raw).unwrap();
        assert!(decorate_raw(&mut result, &feedback, &restatement, false));
        let keys: Vec<&str> = result.keys().map(String::as_str).collect();
        assert_eq!(keys, ["content", "structuredContent", "isError", "_meta"]);
        // Every value keeps its bytes: only the new key is appended.
        assert_eq!(
            result["structuredContent"].get(),
            format!(
                r#"{{"big":12345678901234567890,"f":0.1,"e":1e400,"s":"\ud83d\ude80","_agentFeedback":{feedback}}}"#
            )
        );
        assert_eq!(result["_meta"].get(), r#"{"x":"\u00e9","n":1E5}"#);
        assert!(result["content"]
            .get()
            .starts_with(r#"[{"type":"text","text":"ok \u00e9"},"#));
        let decorated: Value = serde_json::to_value(&result).unwrap();
        assert_eq!(texts(&decorated), ["ok é", restatement.as_str()]);
        assert_eq!(decorated["structuredContent"]["_agentFeedback"], feedback);

        // The Value form gives the same structure.
        let mut value: Value = serde_json::from_str(raw).unwrap();
        assert!(decorate(
            &mut value,
            feedback.clone(),
            restatement.clone(),
            false
        ));
        assert_eq!(value["structuredContent"]["_agentFeedback"], feedback);
        assert_eq!(
            value["structuredContent"]["big"],
            decorated["structuredContent"]["big"]
        );
        assert_eq!(texts(&value), ["ok é", restatement.as_str()]);

        // No structuredContent: it is created, holding only the feedback.
        let mut bare = json!({"content": [{"type": "text", "text": "ok"}]});
        assert!(decorate(
            &mut bare,
            feedback.clone(),
            restatement.clone(),
            false
        ));
        assert_eq!(
            bare["structuredContent"],
            json!({"_agentFeedback": feedback})
        );
        assert_eq!(texts(&bare), ["ok", restatement.as_str()]);

        // isError results are decorated too; no content array yet means one is created.
        let mut error = json!({"isError": true});
        assert!(decorate(
            &mut error,
            feedback.clone(),
            restatement.clone(),
            false
        ));
        assert_eq!(texts(&error), [restatement.as_str()]);
        assert_eq!(error["isError"], true);
    }

    #[test]
    fn output_schema_tool_keeps_structured_content_and_gets_a_json_block() {
        let (feedback, restatement) = feedback();
        let original = json!({"sum": 3, "a": 1, "b": 2});
        let mut result = json!({"content": [{"type": "text", "text": "{\"sum\":3}"}], "structuredContent": original});
        assert!(decorate(
            &mut result,
            feedback.clone(),
            restatement.clone(),
            true
        ));
        assert_eq!(result["structuredContent"], original);
        let texts = texts(&result);
        assert_eq!(texts.len(), 3);
        assert_eq!(texts[0], "{\"sum\":3}");
        let block: Value = serde_json::from_str(texts[1]).unwrap();
        assert_eq!(block, json!({"_agentFeedback": feedback}));
        assert_eq!(block.as_object().unwrap().len(), 1);
        assert_eq!(texts[2], restatement);
    }

    #[test]
    fn output_schema_placement_keeps_raw_structured_content_bytes() {
        let (feedback, restatement) = feedback();
        let raw = r#"{"structuredContent": {"sum": 1e400, "a": 0.10},"content":[]}"#;
        let mut result: RawObject = serde_json::from_str(raw).unwrap();
        assert!(decorate_raw(&mut result, &feedback, &restatement, true));
        assert_eq!(
            result["structuredContent"].get(),
            r#"{"sum": 1e400, "a": 0.10}"#
        );

        // A non-object value keeps its bytes and is restated as text first.
        let mut array: RawObject =
            serde_json::from_str(r#"{"content":[],"structuredContent":[1e400]}"#).unwrap();
        assert!(decorate_raw(&mut array, &feedback, &restatement, false));
        assert_eq!(array["structuredContent"].get(), "[1e400]");
        let blocks: Vec<Value> = serde_json::from_str(array["content"].get()).unwrap();
        assert_eq!(blocks[0]["text"], "[1e400]");
        assert_eq!(blocks.len(), 3);
    }

    #[test]
    fn non_object_structured_content_uses_the_text_block() {
        let (feedback, restatement) = feedback();
        for value in [json!([1, 2]), json!("s"), json!(null), json!(7)] {
            // Without a text block, the value's own JSON text comes first.
            let mut result = json!({"content": [], "structuredContent": value});
            assert!(decorate(
                &mut result,
                feedback.clone(),
                restatement.clone(),
                false
            ));
            assert_eq!(result["structuredContent"], value);
            let t = texts(&result);
            assert_eq!(t.len(), 3, "{value}");
            assert_eq!(t[0], value.to_string());
            assert_eq!(
                serde_json::from_str::<Value>(t[1]).unwrap(),
                json!({"_agentFeedback": feedback})
            );
            assert_eq!(t[2], restatement);

            // With one, nothing is added besides ours.
            let mut with_text =
                json!({"content": [{"type": "text", "text": "x"}], "structuredContent": value});
            assert!(decorate(
                &mut with_text,
                feedback.clone(),
                restatement.clone(),
                false
            ));
            assert_eq!(texts(&with_text).len(), 3);
        }
    }

    #[test]
    fn undecoratable_results_are_left_alone() {
        let (feedback, restatement) = feedback();
        let mut pending = json!({"resultType": "input_required", "inputRequests": {}});
        let before = pending.clone();
        assert!(!decorate(
            &mut pending,
            feedback.clone(),
            restatement.clone(),
            false
        ));
        assert_eq!(pending, before);
        let mut not_object = json!([1]);
        assert!(!decorate(&mut not_object, feedback, restatement, false));
        assert_eq!(not_object, json!([1]));
        assert!(is_feedback_tool(CONSENT_TOOL) && is_feedback_tool(REPORT_TOOL));
        assert!(!is_feedback_tool("search"));
    }

    #[test]
    fn bearer_prefix_is_stripped_like_the_reference() {
        assert_eq!(strip_bearer("Bearer afr2_x"), "afr2_x");
        assert_eq!(strip_bearer("Bearer \t afr2_x"), "afr2_x");
        assert_eq!(strip_bearer("Bearerafr2_x"), "Bearerafr2_x");
        assert_eq!(strip_bearer("afr2_x"), "afr2_x");
    }

    #[test]
    fn decorated_feedback_for_each_mode_round_trips_from_the_text_block() {
        let key = ProductKey::parse(KEY).unwrap();
        for mode in [
            FeedbackMode::NeverAsk,
            FeedbackMode::AskOnce,
            FeedbackMode::AskAlways,
        ] {
            let minted = mint(&key, UNIX_EPOCH + Duration::from_secs(1_715_000_000), None);
            let case =
                Case::for_product_result(mode, crate::feedback::envelope::CachedConsent::Unknown)
                    .unwrap();
            let envelope = Envelope::new(case, minted.handle, minted.claims.exp);
            let mut result = json!({"content": [], "structuredContent": {"a": 1}});
            decorate(
                &mut result,
                envelope.agent_feedback(),
                envelope.restatement(),
                true,
            );
            let block: Value = serde_json::from_str(texts(&result)[0]).unwrap();
            assert_eq!(block["_agentFeedback"], envelope.agent_feedback());
        }
    }
}
