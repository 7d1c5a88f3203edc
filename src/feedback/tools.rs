//! The two local tools the sidecar adds to `tools/list` and answers itself,
//! `record_product_feedback_consent` and `report_product_feedback`: their definitions, the
//! strict validation of their arguments, the bodies forwarded to Epode, the results returned to
//! the agent (success, failure with its guidance, invalid arguments), and the placement of
//! `_agentFeedback` in a product tool's result.
//!
//! Texts and result shapes follow the reference binding (`sdk/node/src/mcp.ts`). Epode's own
//! error text is never relayed: a failure result says only the status, whether to retry, and how.

use serde_json::{json, Map, Value};

use super::capability::FeedbackHandle;
use super::{CONSENT_TOOL, REPORT_TOOL};
use crate::error::transient;

/// Title and description of the consent tool (reference mcp.ts).
pub(crate) const CONSENT_TITLE: &str = "Record product feedback permission";
pub(crate) const CONSENT_DESCRIPTION: &str = "After asking the exact question returned by a product tool, record only the user's explicit approved or declined answer. Never infer approval from silence. Epode returns a separate report action only after approval.";
/// Title and description of the report tool (reference mcp.ts).
pub(crate) const REPORT_TITLE: &str = "Report product feedback";
pub(crate) const REPORT_DESCRIPTION: &str = "Submit one structured feedback report only when the product result or permission tool returned this report action. Describe the contribution and applicable findings without forcing a success/failure verdict. Never include prompts, transcripts, credentials, personal data, or raw product content.";

/// Consent result texts (reference mcp.ts).
pub(crate) const DECLINED_TEXT: &str = "Permission declined. Do not submit product feedback.";
pub(crate) const CONSENT_UNAVAILABLE_TEXT: &str = "Epode is temporarily unavailable. Retry this permission action exactly once with the same arguments; never assume approval.";
/// Report result texts (reference mcp.ts).
pub(crate) const REPORT_ACCEPTED_TEXT: &str = "Product feedback accepted. Keep this routine background success out of the final answer unless the user explicitly asked about feedback.";
pub(crate) const REPORT_UNAVAILABLE_TEXT: &str =
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
pub(crate) fn consent_input_schema() -> Value {
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
pub(crate) fn report_input_schema() -> Value {
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
pub(crate) fn consent_tool() -> Value {
    json!({
        "name": CONSENT_TOOL,
        "title": CONSENT_TITLE,
        "description": CONSENT_DESCRIPTION,
        "inputSchema": consent_input_schema(),
        "annotations": annotations(),
    })
}

/// The `tools/list` entry of the report tool.
pub(crate) fn report_tool() -> Value {
    json!({
        "name": REPORT_TOOL,
        "title": REPORT_TITLE,
        "description": REPORT_DESCRIPTION,
        "inputSchema": report_input_schema(),
        "annotations": annotations(),
    })
}

/// Whether a tool name is one of the two local tools (they are never forwarded or decorated).
pub(crate) fn is_feedback_tool(name: &str) -> bool {
    name == CONSENT_TOOL || name == REPORT_TOOL
}

/// A consent decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    Approved,
    Declined,
}

impl Decision {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Decision::Approved => "approved",
            Decision::Declined => "declined",
        }
    }
}

/// A valid consent call: what to send to `POST /api/v2/consent/decisions`.
#[derive(Debug, Clone)]
pub(crate) struct ConsentCall {
    /// The `Authorization: Bearer` credential.
    pub(crate) handle: FeedbackHandle,
    pub(crate) decision: Decision,
    /// Exactly `{"decision": …}`.
    pub(crate) body: Value,
}

/// A valid report call: what to send to `POST /api/v2/reports`.
#[derive(Debug, Clone)]
pub(crate) struct ReportCall {
    /// The `Authorization: Bearer` credential.
    pub(crate) handle: FeedbackHandle,
    /// The report fields the agent gave (summary, impact, confidence, findings, workaround),
    /// values untouched; never the handle.
    pub(crate) body: Value,
}

/// Arguments that do not satisfy a tool's input schema, listed for the agent to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Input validation error: Invalid arguments for tool {tool}: {}", .problems.join(", "))]
pub(crate) struct InvalidArguments {
    pub(crate) tool: &'static str,
    pub(crate) problems: Vec<String>,
}

impl InvalidArguments {
    /// The `isError` result that tells the agent what is wrong (the reference's wording).
    pub(crate) fn to_result(&self) -> Value {
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
pub(crate) struct SchemaError {
    tool: &'static str,
    message: String,
}

/// The compiled validators of both tools; build once at start.
pub(crate) struct FeedbackTools {
    consent: jsonschema::Validator,
    report: jsonschema::Validator,
}

impl std::fmt::Debug for FeedbackTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeedbackTools").finish_non_exhaustive()
    }
}

impl FeedbackTools {
    pub(crate) fn new() -> Result<Self, SchemaError> {
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
    pub(crate) fn definitions(&self) -> Vec<Value> {
        vec![consent_tool(), report_tool()]
    }

    /// Validates `record_product_feedback_consent` arguments (absent arguments count as `{}`).
    pub(crate) fn validate_consent_args(
        &self,
        args: &Value,
    ) -> Result<ConsentCall, InvalidArguments> {
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
    pub(crate) fn validate_report_args(
        &self,
        args: &Value,
    ) -> Result<ReportCall, InvalidArguments> {
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
pub(crate) fn consent_success(decision: Decision, body: Value) -> Value {
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
pub(crate) fn report_success(body: Value) -> Value {
    let body = if body.is_object() { body } else { json!({}) };
    json!({
        "content": [text_block(REPORT_ACCEPTED_TEXT)],
        "structuredContent": body,
    })
}

/// How a call to Epode failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EpodeFailure {
    /// A response outside 2xx.
    Status(u16),
    /// No response: connection error or the 10 s timeout (or an answer that is not one).
    Unavailable,
    /// The handle is not one this product's key signed, or it expired: checked locally,
    /// never sent to Epode.
    InvalidHandle,
}

/// The longest handle the sidecar looks at; one it signs is under 400 characters.
pub(crate) const MAX_HANDLE_LEN: usize = 2048;

pub(crate) const INVALID_HANDLE_REPORT_TEXT: &str = "Feedback submission failed: the feedbackHandle is invalid or expired. Do not retry with this handle; use the feedbackHandle from a newer product result.";
pub(crate) const INVALID_HANDLE_CONSENT_TEXT: &str = "Permission could not be recorded: the feedbackHandle is invalid or expired. Do not retry with this handle; use the feedbackHandle from a newer product result. Never assume approval.";

/// What the agent may do after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Guidance {
    pub(crate) retryable: bool,
    pub(crate) text: &'static str,
}

/// Guidance after a failed consent call (reference `consentFailureGuidance`).
pub(crate) fn consent_guidance(status: u16) -> Guidance {
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
pub(crate) fn report_guidance(status: u16) -> Guidance {
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
pub(crate) fn consent_failure(failure: EpodeFailure) -> Value {
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
pub(crate) fn report_failure(failure: EpodeFailure) -> Value {
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

#[cfg(test)]
mod tests;
