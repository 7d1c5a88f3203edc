//! Epode's customer-context MCP binding, as pure pieces (`binding::customer` runs them): the
//! two tools (`share_customer_context`, `record_customer_context_consent`), their arguments
//! checked as the reference binding checks them before anything is sent, the results and
//! texts the agent reads, the contract a product result carries
//! (`structuredContent._epode.customerContext`) and where it goes, and the permission
//! question (an MRTR `elicitation/create` form).
//!
//! Texts and shapes follow the reference binding word for word
//! (open-software-network/os-agent-feedback at 37c2131, `sdk/node/src/customer-mcp.ts` and
//! `customer.ts`); where it and the backend disagree, the backend wins (no `summary` is
//! needed by it, so none is required here either).

use serde_json::{json, Map, Value};

use crate::mcp::raw::{is_object, raw, raw_object, RawMap};

/// The agent's answer tool.
pub(crate) const SHARE_TOOL: &str = "share_customer_context";
/// The explicit permission tool (compatibility: settings pages, products that asked already).
pub(crate) const CONSENT_TOOL: &str = "record_customer_context_consent";
/// The key of the permission question in an `input_required` result's `inputRequests`.
pub(crate) const PERMISSION_KEY: &str = "customer_context_permission";

/// Most items an answer carries (the tool's schema, the relay and the backend agree).
pub(crate) const MAX_ITEMS: usize = 8;
/// Longest item value, in characters.
pub(crate) const MAX_VALUE_CHARS: usize = 160;
/// Longest handle the sidecar forwards (Epode's are about 300 bytes).
pub(crate) const MAX_HANDLE_BYTES: usize = 2048;

/// Whether `name` is one of the two customer-context tools.
pub(crate) fn is_customer_tool(name: &str) -> bool {
    name == SHARE_TOOL || name == CONSENT_TOOL
}

/// The two tools as `tools/list` lists them, in the reference's order.
pub(crate) fn tool_definitions() -> [Value; 2] {
    let handle = json!({"type": "string", "pattern": "^aqr1_.*"});
    [
        json!({
            "name": CONSENT_TOOL,
            "title": "Record customer-context permission (explicit compatibility)",
            "description": "Explicit compatibility or profile-settings use only after the product integration separately obtained the customer's data-use choice. Never call automatically and never infer permission.",
            "inputSchema": {
                "type": "object",
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "properties": {
                    "requestHandle": handle,
                    "decision": {"type": "string", "enum": ["approved", "declined"]},
                    "remember": {"type": "boolean"}
                },
                "required": ["requestHandle", "decision"]
            },
            "annotations": {"readOnlyHint": false, "destructiveHint": false, "idempotentHint": true}
        }),
        json!({
            "name": SHARE_TOOL,
            "title": "Share customer context",
            "description": "Share up to eight relevant, non-sensitive context items. When a data-use choice is needed, this tool presents it once inside the MCP client, records the answer, and continues in the same call. Distinguish explicit statements, current-task context, and inference.",
            "inputSchema": {
                "type": "object",
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "properties": {
                    "requestHandle": handle,
                    "status": {"type": "string", "enum": ["answered", "declined", "no_relevant_context"]},
                    "items": {
                        "maxItems": MAX_ITEMS,
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "key": {"type": "string", "pattern": "^[a-z0-9][a-z0-9._-]{0,63}$"},
                                "type": {"type": "string", "pattern": "^[a-z][a-z0-9_]{0,47}$"},
                                "value": {"type": "string", "minLength": 1, "maxLength": MAX_VALUE_CHARS},
                                "summary": {"type": "string", "minLength": 3, "maxLength": 350},
                                "provenance": {"type": "string", "enum": PROVENANCES},
                                "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                                "remember": {"type": "boolean"},
                                "expiresAt": {"type": "string", "format": "date-time"}
                            },
                            "required": ["key", "type", "value", "provenance", "remember"]
                        }
                    }
                },
                "required": ["requestHandle", "status", "items"]
            },
            "annotations": {"readOnlyHint": false, "destructiveHint": false, "idempotentHint": true}
        }),
    ]
}

const PROVENANCES: [&str; 3] = [
    "agent_reports_user_statement",
    "agent_reports_current_task",
    "agent_inference",
];
const STATUSES: [&str; 3] = ["answered", "declined", "no_relevant_context"];
const ITEM_KEYS: [&str; 8] = [
    "key",
    "type",
    "value",
    "summary",
    "provenance",
    "confidence",
    "remember",
    "expiresAt",
];

/// A `share_customer_context` call's arguments, checked: the handle, and the answer as it is
/// forwarded (`status`, `items`, each item with only the keys the answer takes).
#[derive(Debug, PartialEq)]
pub(crate) struct Share {
    pub(crate) handle: String,
    pub(crate) answer: Value,
}

/// The reason arguments are refused, as the agent reads it (`Input validation error: …`).
pub(crate) type Refusal = String;

/// Checks a `share_customer_context` call's arguments as the tool's schema and the reference
/// relay do, before anything is sent: a handle, a status, at most eight items with valid keys,
/// types, values and provenance, none with text that looks sensitive (an `@`, a control
/// character, a credential's word).
pub(crate) fn share(args: &Value) -> Result<Share, Refusal> {
    let handle = handle(args)?;
    let status = args
        .get("status")
        .and_then(Value::as_str)
        .filter(|s| STATUSES.contains(s))
        .ok_or("status: expected one of \"answered\"|\"declined\"|\"no_relevant_context\"")?;
    let items = args
        .get("items")
        .and_then(Value::as_array)
        .ok_or("items: expected an array")?;
    if items.len() > MAX_ITEMS {
        return Err(format!(
            "items: Too big: expected array to have <={MAX_ITEMS} items"
        ));
    }
    if (status == "answered") == items.is_empty() {
        return Err(
            "items: answered needs 1 to 8 items; declined and no_relevant_context need none"
                .to_owned(),
        );
    }
    let items = items
        .iter()
        .enumerate()
        .map(|(i, item)| checked_item(item).map_err(|e| format!("items.{i}.{e}")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Share {
        handle,
        answer: json!({"status": status, "items": items}),
    })
}

/// The `requestHandle` argument: an `aqr1_` handle of the characters Epode's handles use.
pub(crate) fn handle(args: &Value) -> Result<String, Refusal> {
    let h = args
        .get("requestHandle")
        .and_then(Value::as_str)
        .ok_or("requestHandle: expected a string")?;
    let ok = h.len() <= MAX_HANDLE_BYTES
        && h.strip_prefix("aqr1_").is_some_and(|rest| {
            !rest.is_empty()
                && rest
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        });
    if ok {
        Ok(h.to_owned())
    } else {
        Err("requestHandle: Invalid string: must start with \"aqr1_\" (a handle from a product result's customerContext)".to_owned())
    }
}

fn checked_item(item: &Value) -> Result<Value, String> {
    let o = item.as_object().ok_or("expected an object")?;
    let text = |k: &str| o.get(k).and_then(Value::as_str);
    let key = text("key").ok_or("key: expected a string")?;
    if !pattern_ok(key, 64, |b| b.is_ascii_digit()) {
        return Err("key: Invalid string: must match ^[a-z0-9][a-z0-9._-]{0,63}$".into());
    }
    let kind = text("type").ok_or("type: expected a string")?;
    if !pattern_ok(kind, 48, |_| false) || kind.contains(['.', '-']) {
        return Err("type: Invalid string: must match ^[a-z][a-z0-9_]{0,47}$".into());
    }
    let value = text("value").ok_or("value: expected a string")?;
    let chars = value.chars().count();
    if chars == 0 || chars > MAX_VALUE_CHARS {
        return Err(format!("value: 1 to {MAX_VALUE_CHARS} characters"));
    }
    let summary = match o.get("summary") {
        None => None,
        Some(s) => Some(
            s.as_str()
                .filter(|s| (3..=350).contains(&s.chars().count()))
                .ok_or("summary: 3 to 350 characters")?,
        ),
    };
    for (field, t) in [("value", Some(value)), ("summary", summary)] {
        if t.is_some_and(sensitive) {
            return Err(format!("{field}: looks sensitive (an @, a control character or a credential's word); share only catalogued, non-sensitive context"));
        }
    }
    text("provenance")
        .filter(|p| PROVENANCES.contains(p))
        .ok_or("provenance: expected one of \"agent_reports_user_statement\"|\"agent_reports_current_task\"|\"agent_inference\"")?;
    o.get("remember")
        .and_then(Value::as_bool)
        .ok_or("remember: expected a boolean")?;
    if let Some(c) = o.get("confidence") {
        c.as_f64()
            .filter(|c| (0.0..=1.0).contains(c))
            .ok_or("confidence: a number from 0 to 1")?;
    }
    if let Some(e) = o.get("expiresAt") {
        e.as_str()
            .filter(|e| is_utc_datetime(e))
            .ok_or("expiresAt: an ISO 8601 date-time in UTC, such as 2026-12-31T23:59:59Z")?;
    }
    // Unknown keys are dropped, as the reference's schema strips them.
    let kept: Map<String, Value> = o
        .iter()
        .filter(|(k, _)| ITEM_KEYS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Ok(Value::Object(kept))
}

/// `^[a-z<digits when first_digit>][a-z0-9._-]{0,max-1}$`-like: lowercase ASCII letters,
/// digits, `_`, and for keys `.` and `-`.
fn pattern_ok(s: &str, max: usize, first_digit: impl Fn(u8) -> bool) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= max
        && (b[0].is_ascii_lowercase() || first_digit(b[0]))
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"._-".contains(c))
}

/// Text the reference refuses to forward: an `@`, a control character, or a word that starts
/// a credential (`bearer `, `password`, `passwd`, `secret`, `api key`, `access token`,
/// `refresh token`, `sk-…`), at a word's start, in any case.
pub(crate) fn sensitive(text: &str) -> bool {
    if text
        .chars()
        .any(|c| c == '@' || (c as u32) <= 31 || c as u32 == 127)
    {
        return true;
    }
    let lower = text.to_ascii_lowercase();
    let b = lower.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    (0..b.len())
        .filter(|&i| i == 0 || !word(b[i - 1]))
        .any(|i| credential_at(&b[i..]))
}

fn credential_at(s: &[u8]) -> bool {
    let sep = |s: &[u8], word: &[u8], then: &[u8]| {
        s.strip_prefix(word).is_some_and(|rest| {
            let rest = match rest.first() {
                Some(b'_' | b' ' | b'-') => &rest[1..],
                _ => rest,
            };
            rest.starts_with(then)
        })
    };
    s.strip_prefix(b"bearer")
        .is_some_and(|r| r.first().is_some_and(u8::is_ascii_whitespace))
        || s.starts_with(b"password")
        || s.starts_with(b"passwd")
        || s.starts_with(b"secret")
        || sep(s, b"api", b"key")
        || sep(s, b"access", b"token")
        || sep(s, b"refresh", b"token")
        || s.strip_prefix(b"sk-")
            .is_some_and(|r| r.first().is_some_and(u8::is_ascii_alphanumeric))
}

/// `YYYY-MM-DDTHH:MM[:SS[.fraction]]Z`, a real calendar date and time.
fn is_utc_datetime(s: &str) -> bool {
    let Some(body) = s.strip_suffix('Z') else {
        return false;
    };
    let Some((date, time)) = body.split_once('T') else {
        return false;
    };
    let num = |t: &str, n: usize| {
        (t.len() == n && t.bytes().all(|b| b.is_ascii_digit())).then(|| t.parse::<u32>().ok())?
    };
    let mut d = date.split('-');
    let (Some(y), Some(m), Some(day), None) = (
        d.next().and_then(|t| num(t, 4)),
        d.next().and_then(|t| num(t, 2)),
        d.next().and_then(|t| num(t, 2)),
        d.next(),
    ) else {
        return false;
    };
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    if day == 0 || day > days {
        return false;
    }
    let (hms, fraction) = match time.split_once('.') {
        Some((hms, f)) => (hms, Some(f)),
        None => (time, None),
    };
    if fraction.is_some_and(|f| f.is_empty() || !f.bytes().all(|b| b.is_ascii_digit())) {
        return false;
    }
    let mut t = hms.split(':');
    let (Some(h), Some(min), sec, None) = (
        t.next().and_then(|t| num(t, 2)),
        t.next().and_then(|t| num(t, 2)),
        t.next(),
        t.next(),
    ) else {
        return false;
    };
    let sec_ok = match sec {
        Some(s) => num(s, 2).is_some_and(|s| s < 60),
        None => fraction.is_none(),
    };
    h < 24 && min < 60 && sec_ok
}

/// A `record_customer_context_consent` call's arguments, checked: the handle and the body
/// forwarded (`decision`, and `remember` when given).
pub(crate) fn consent(args: &Value) -> Result<(String, Value), Refusal> {
    let handle = handle(args)?;
    let decision = args
        .get("decision")
        .and_then(Value::as_str)
        .filter(|d| matches!(*d, "approved" | "declined"))
        .ok_or("decision: expected one of \"approved\"|\"declined\"")?;
    let mut body = json!({ "decision": decision });
    match args.get("remember") {
        None => {}
        Some(Value::Bool(r)) => body["remember"] = Value::Bool(*r),
        Some(_) => return Err("remember: expected a boolean".into()),
    }
    Ok((handle, body))
}

/// The result of arguments refused before anything was sent (the MCP SDKs' wording).
pub(crate) fn invalid_arguments(tool: &str, why: &str) -> Value {
    json!({
        "content": [{"type": "text", "text": format!("Input validation error: Invalid arguments for tool {tool}: {why}")}],
        "isError": true
    })
}

fn text_result(text: &str, structured: Option<Value>, is_error: Option<bool>) -> Value {
    let mut r = json!({"content": [{"type": "text", "text": text}]});
    if let Some(s) = structured {
        r["structuredContent"] = s;
    }
    if let Some(e) = is_error {
        r["isError"] = Value::Bool(e);
    }
    r
}

/// An object answer as it is, else `{}`.
fn object_or_empty(body: Option<Value>) -> Value {
    body.filter(Value::is_object).unwrap_or_else(|| json!({}))
}

/// The inspection failed (an error status, an answer that is no object).
pub(crate) fn unverified(body: Option<Value>) -> Value {
    text_result(
        "The customer-context request could not be verified. Do not share context.",
        Some(object_or_empty(body)),
        Some(true),
    )
}

/// The request was declined (for this customer, or for this request).
pub(crate) fn declined() -> Value {
    text_result(
        "No customer context will be shared for this request. Continue the product task.",
        Some(json!({"accepted": false, "state": "declined"})),
        None,
    )
}

/// The request was answered already.
pub(crate) fn already_completed(state: &str) -> Value {
    text_result(
        "Customer context was already handled for this request. Continue the product task.",
        Some(json!({"accepted": true, "state": state, "alreadyCompleted": true})),
        None,
    )
}

/// The answer's outcome (Epode's `/answers` status and body).
pub(crate) fn answered(status: u16, body: Option<Value>) -> Value {
    let failed = status >= 400;
    let text = if failed {
        "Customer context was not accepted. Retry once only when retryable is true."
    } else {
        "Customer context was accepted. Continue the customer's product task without mentioning routine bookkeeping."
    };
    text_result(text, Some(object_or_empty(body)), Some(failed))
}

/// The client cannot be asked the permission question (no form elicitation).
pub(crate) fn unsupported() -> Value {
    text_result(
        "Optional personalization is unavailable in this MCP client. Continue the product task without sharing customer context, and do not ask the user separately in chat.",
        Some(json!({"accepted": false, "state": "unsupported", "reason": "form_elicitation_unavailable"})),
        None,
    )
}

/// The client's answer to the permission question, as the reference reads it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Permission {
    /// Not an answer the question takes.
    Invalid,
    /// Dismissed: nothing is recorded.
    Canceled,
    /// Declined (the action, or `dont_allow`).
    Declined,
    /// An accept whose choice is none of the three.
    BadChoice,
    /// Approved; `remember` for `always_allow`.
    Approved { remember: bool },
}

/// Reads `inputResponses.customer_context_permission` (an `ElicitResult`).
pub(crate) fn permission(response: &Value) -> Permission {
    let Some(o) = response.as_object() else {
        return Permission::Invalid;
    };
    let choice = match o.get("action").and_then(Value::as_str) {
        Some("cancel") => return Permission::Canceled,
        Some("decline") => return Permission::Declined,
        Some("accept") => o
            .get("content")
            .and_then(|c| c.get("choice"))
            .and_then(Value::as_str),
        _ => return Permission::Invalid,
    };
    match choice {
        Some("dont_allow") => Permission::Declined,
        Some("always_allow") => Permission::Approved { remember: true },
        Some("this_session_only") => Permission::Approved { remember: false },
        _ => Permission::BadChoice,
    }
}

/// The results of a permission answer the binding ends the call with.
pub(crate) fn permission_result(p: &Permission) -> Option<Value> {
    match p {
        Permission::Invalid => Some(text_result(
            "The personalization response was invalid.",
            None,
            Some(true),
        )),
        Permission::Canceled => Some(text_result(
            "The customer dismissed optional personalization. Continue without sharing context.",
            Some(json!({"accepted": false, "state": "canceled"})),
            None,
        )),
        Permission::BadChoice => Some(text_result(
            "The personalization choice was invalid.",
            None,
            Some(true),
        )),
        Permission::Declined | Permission::Approved { .. } => None,
    }
}

/// The customer's "don't allow", recorded (Epode's consent status and body).
pub(crate) fn permission_declined(status: u16, body: Option<Value>) -> Value {
    let structured = body
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({"accepted": false, "state": "declined"}));
    text_result(
        "The customer chose not to allow personalization. Continue without sharing context.",
        Some(structured),
        Some(status >= 400),
    )
}

/// The customer's choice could not be recorded.
pub(crate) fn permission_unrecorded(body: Option<Value>) -> Value {
    text_result(
        "The customer's personalization choice could not be recorded.",
        Some(object_or_empty(body)),
        Some(true),
    )
}

/// `record_customer_context_consent`'s result (Epode's consent status and body).
pub(crate) fn consent_recorded(status: u16, body: Option<Value>) -> Value {
    let mut structured = object_or_empty(body);
    let next = next_handle(&structured);
    let text = if status >= 400 {
        "Permission could not be recorded. Retry once only when retryable is true; never assume approval.".to_owned()
    } else if let Some(h) = &next {
        format!("Permission recorded. Call share_customer_context once with requestHandle {h}.")
    } else {
        "Permission declined. Do not share customer context.".to_owned()
    };
    if let Some(o) = structured.as_object_mut() {
        // The agent never reaches Epode's URLs: the actions are the tools.
        for action in ["submit", "consent"] {
            if let Some(a) = o.get_mut(action).and_then(Value::as_object_mut) {
                a.remove("url");
            }
        }
        if let Some(h) = next {
            o.insert("answerTool".into(), json!(SHARE_TOOL));
            o.insert("requestHandle".into(), json!(h));
        }
    }
    text_result(&text, Some(structured), Some(status >= 400))
}

/// The `aqr1_` handle of an answer action (`submit.authorization`, `Bearer …`).
pub(crate) fn next_handle(body: &Value) -> Option<String> {
    bearer(body.get("submit")?.get("authorization")?.as_str()?)
}

/// The permission question, as an `input_required` result asks it.
pub(crate) fn permission_question(question: Option<&str>) -> Value {
    let message = question.unwrap_or(
        "Choose whether this product may use relevant, non-sensitive context to personalize your experience.",
    );
    json!({
        "resultType": "input_required",
        "inputRequests": {
            PERMISSION_KEY: {
                "method": "elicitation/create",
                "params": {
                    "mode": "form",
                    "message": message,
                    "requestedSchema": {
                        "type": "object",
                        "properties": {
                            "choice": {
                                "type": "string",
                                "title": "Optional personalization",
                                "description": "Choose whether this product may use relevant preferences, interests, intent, and constraints shared through your assistant.",
                                "oneOf": [
                                    {"const": "always_allow", "title": "Always allow"},
                                    {"const": "this_session_only", "title": "This session only"},
                                    {"const": "dont_allow", "title": "Don't allow"}
                                ]
                            }
                        },
                        "required": ["choice"]
                    }
                }
            }
        }
    })
}

/// Whether a client's declared capabilities take a form elicitation: `elicitation` an object
/// with `form`, or without `url` (a bare `{}` is form, as the specification reads it).
pub(crate) fn takes_form_elicitation(capabilities: Option<&Value>) -> bool {
    let Some(e) = capabilities
        .and_then(|c| c.get("elicitation"))
        .and_then(Value::as_object)
    else {
        return false;
    };
    e.contains_key("form") || !e.contains_key("url")
}

/// What a product result carries of Epode's answer to the enrichment request: the contract
/// (its handle and schema only when an answer is taken) and the one instruction.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Contract {
    pub(crate) contract: Value,
    pub(crate) instruction: String,
}

impl Contract {
    /// Reads Epode's enrichment answer; `None` when it is not one (no state or ids).
    pub(crate) fn from_answer(answer: &Value) -> Option<Contract> {
        let o = answer.as_object()?;
        let state = o.get("state")?.as_str()?;
        let mut c = Map::new();
        for k in [
            "requestId",
            "interactionId",
            "state",
            "purpose",
            "identityLevel",
            "stageInstruction",
            "expiresAt",
        ] {
            if let Some(v) = o.get(k) {
                c.insert(k.to_owned(), v.clone());
            }
        }
        for k in ["question", "answerInstruction"] {
            if let Some(v) = o.get(k).filter(|v| truthy(v)) {
                c.insert(k.to_owned(), v.clone());
            }
        }
        let consent = o.get("consent").and_then(|a| a.get("authorization"));
        if state == "consent_required" {
            if let Some(h) = consent.and_then(Value::as_str).and_then(bearer) {
                c.insert("answerTool".into(), json!(SHARE_TOOL));
                c.insert("requestHandle".into(), json!(h));
                c.insert(
                    "permissionMode".into(),
                    json!("best_effort_mcp_elicitation"),
                );
                if let Some(s) = o.get("submit").and_then(|s| s.get("bodySchema")) {
                    c.insert("answerSchema".into(), s.clone());
                }
            }
        }
        if let Some(submit) = o.get("submit").filter(|s| s.is_object()) {
            if let Some(h) = submit
                .get("authorization")
                .and_then(Value::as_str)
                .and_then(bearer)
            {
                c.insert("answerTool".into(), json!(SHARE_TOOL));
                c.insert("requestHandle".into(), json!(h));
                if let Some(s) = submit.get("bodySchema") {
                    c.insert("answerSchema".into(), s.clone());
                }
            }
        }
        let instruction = if state == "consent_required" {
            "After finishing the product task, call share_customer_context once with only relevant, non-sensitive context. When the MCP client supports resumable form elicitation, the tool will present the company's optional-personalization choice inline. Otherwise it will share nothing; do not ask the user separately in chat.".to_owned()
        } else {
            ["stageInstruction", "answerInstruction"]
                .iter()
                .filter_map(|k| o.get(*k).and_then(Value::as_str).filter(|s| !s.is_empty()))
                .collect::<Vec<_>>()
                .join(" ")
        };
        Some(Contract {
            contract: Value::Object(c),
            instruction,
        })
    }

    /// Places the contract in a product result: in `structuredContent._epode.customerContext`
    /// when the tool declares no `outputSchema` and `structuredContent` is an object or
    /// absent; else (the schema owns `structuredContent`, or it is not an object, which is
    /// kept as it is) as a JSON text block `{"_epode":{"customerContext":…}}`; then the
    /// instruction as a text block. Values the result already had keep their bytes.
    pub(crate) fn place(&self, result: &mut RawMap, has_output_schema: bool) -> bool {
        let wrapped = json!({ "customerContext": self.contract });
        let mut content: Vec<Box<serde_json::value::RawValue>> = result
            .get("content")
            .and_then(|c| serde_json::from_str(c.get()).ok())
            .unwrap_or_default();
        let structured = result.get("structuredContent");
        let object = structured.is_none_or(|s| is_object(s));
        if has_output_schema || !object {
            content.push(text_block(&json!({ "_epode": wrapped }).to_string()));
        } else {
            let mut map: RawMap = structured
                .and_then(|s| serde_json::from_str(s.get()).ok())
                .unwrap_or_default();
            map.insert("_epode".into(), raw(&wrapped));
            result.insert("structuredContent".into(), raw_object(&map));
        }
        content.push(text_block(&self.instruction));
        result.insert("content".into(), raw(&content));
        true
    }
}

fn text_block(text: &str) -> Box<serde_json::value::RawValue> {
    raw(&json!({"type": "text", "text": text}))
}

fn truthy(v: &Value) -> bool {
    !matches!(v, Value::Null | Value::Bool(false)) && v.as_str().is_none_or(|s| !s.is_empty())
}

fn bearer(authorization: &str) -> Option<String> {
    let h = authorization.strip_prefix("Bearer")?.trim_start();
    h.starts_with("aqr1_").then(|| h.to_owned())
}

#[cfg(test)]
mod tests;
