//! The embedded Epode's customer-context endpoints: the product's enrichment request (its
//! key), and the agent's inspect, consent and answer (the request's `aqr1_` handle), answered
//! as the real service answers them (the backend at open-software-network/os-agent-feedback
//! 37c2131): unknown members refused, a request answered once, a decline remembered for the
//! customer when the request remembers. Its catalog is the global v1 catalog's keys; a value
//! is checked for length and sensitivity only (the real service also checks it against the
//! catalog's allowed values). Each step is shown on the console as `context`.

use serde_json::{json, Map, Value};

use super::{error, keep, now_text, reply, Asked, DevEpode, Reply};
use crate::feedback::customer;

/// The global v1 catalog's keys (`docs/reference/customer-context.mdx`).
const CATALOG: [&str; 22] = [
    "shopping.priority",
    "shopping.sustainability",
    "shopping.budget_band",
    "shopping.delivery_window",
    "content.format",
    "content.topic_depth",
    "interest.topic",
    "travel.stay_style",
    "travel.location_priority",
    "travel.room_priority",
    "finance.explanation_style",
    "finance.liquidity_preference",
    "care.communication_style",
    "care.visit_mode",
    "care.appointment_timing",
    "education.learning_format",
    "education.learning_level",
    "b2b.company_size",
    "b2b.primary_goal",
    "b2b.purchase_timeline",
    "b2b.integration_priority",
    "interest.category",
];

const REQUEST_KEYS: [&str; 15] = [
    "accountRef",
    "userRef",
    "anonymousRef",
    "customerRef",
    "interactionId",
    "operation",
    "fieldKeys",
    "surface",
    "statusCode",
    "durationMs",
    "sessionRef",
    "runtimeHint",
    "purpose",
    "remember",
    "handlerOwner",
];

const READY: &str = "Finish the user's product task first. Then submit at most one bounded answer using the provided schema. Include only relevant, non-sensitive context for this product experience; do not infer identity or sensitive traits.";
const NO_ACTION: &str = "No enrichment action is permitted for this request.";

fn opaque(v: &str) -> bool {
    (1..=160).contains(&v.len())
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
}

impl DevEpode {
    fn shown(&self, step: &str, a: &Asked, more: Value) -> Value {
        let mut e = json!({"step": step, "interactionId": a.interaction_id, "state": a.state,
                           "operation": a.body.get("operation"), "at": now_text()});
        if let (Some(o), Some(m)) = (e.as_object_mut(), more.as_object()) {
            o.extend(m.clone());
        }
        e
    }

    /// `POST /api/v2/enrichment/requests` (the product key).
    pub(super) fn enrichment_request(&self, bearer: Option<&str>, body: &Value) -> Reply {
        if !self.product_key_ok(bearer) {
            return error(401, "Invalid API key");
        }
        let Some(o) = body.as_object() else {
            return error(400, "Invalid request: expected an object");
        };
        if let Some(k) = o.keys().find(|k| !REQUEST_KEYS.contains(&k.as_str())) {
            return error(400, &format!("Invalid request: unknown field `{k}`"));
        }
        if let Err(why) = check_request(o) {
            return error(400, why);
        }
        let text = |k: &str| o.get(k).and_then(Value::as_str);
        let interaction = text("interactionId").unwrap_or_default().to_owned();
        let mut state = self.lock();
        let known = state
            .enrichment
            .iter()
            .find(|(_, a)| a.interaction_id == interaction)
            .map(|(h, a)| (h.clone(), a.clone()));
        if let Some((handle, a)) = known {
            drop(state);
            if &a.body != body {
                return error(
                    409,
                    "interactionId was already used with a different or expired enrichment request",
                );
            }
            return reply(200, &self.contract(&handle, &a));
        }
        let identified = ["accountRef", "userRef", "anonymousRef", "customerRef"]
            .iter()
            .any(|k| text(k).is_some());
        let remember = o.get("remember").and_then(Value::as_bool).unwrap_or(false) && identified;
        let purpose = text("purpose")
            .unwrap_or("product_personalization")
            .to_owned();
        let subject = match (
            remember,
            text("customerRef")
                .or(text("accountRef"))
                .or(text("userRef")),
        ) {
            (true, Some(who)) => format!("afsub1_{who}:{purpose}"),
            _ => format!("afint1_{interaction}"),
        };
        let declined = state
            .context_declined
            .get(&subject)
            .copied()
            .unwrap_or(false);
        let a = Asked {
            request_id: uuid::Uuid::new_v4().to_string(),
            interaction_id: interaction,
            purpose,
            remember,
            subject,
            state: if declined { "declined" } else { "answer_ready" },
            body: body.clone(),
        };
        let handle = format!("aqr1_{}", uuid::Uuid::new_v4().simple());
        keep(&mut state.enrichment, handle.clone(), a.clone());
        drop(state);
        let shown = self.shown("request", &a, json!({"remember": a.remember}));
        reply(200, &self.contract(&handle, &a)).showing("context", shown)
    }

    /// The request as the service answers it (the request, inspect).
    fn contract(&self, handle: &str, a: &Asked) -> Value {
        let ready = a.state == "answer_ready";
        let catalog: Vec<Value> = CATALOG.iter().map(|k| json!({"key": k})).collect();
        json!({
            "requestId": a.request_id,
            "interactionId": a.interaction_id,
            "state": a.state,
            "purpose": a.purpose,
            "surface": "mcp",
            "identityLevel": if a.remember { "pseudonymous" } else { "ephemeral" },
            "stageInstruction": if ready { READY } else { NO_ACTION },
            "question": null,
            "answerInstruction": ready.then_some("Provide only non-sensitive context the user explicitly shared or that is directly relevant to the current task for this product experience by this company. Never include prompts, transcripts, names, emails, credentials, or raw customer content."),
            "expiresAt": humantime::format_rfc3339_seconds(std::time::SystemTime::now() + std::time::Duration::from_secs(7200)).to_string(),
            "consent": {"url": format!("{}/api/v2/enrichment/consent/decisions", self.origin), "method": "POST",
                        "authorization": format!("Bearer {handle}"), "contentType": "application/json"},
            "submit": ready.then(|| json!({
                "url": format!("{}/api/v2/enrichment/answers", self.origin), "method": "POST",
                "authorization": format!("Bearer {handle}"), "contentType": "application/json",
                "bodySchema": {"status": ["answered", "declined", "no_relevant_context"],
                               "items": {"maximum": customer::MAX_ITEMS, "required": ["key", "type", "value", "provenance", "remember"],
                                         "catalogVersion": "v1", "catalog": catalog}}
            })),
        })
    }

    fn asked(&self, bearer: Option<&str>) -> Option<(String, Asked)> {
        let token = bearer?;
        let state = self.lock();
        state
            .enrichment
            .get(token)
            .map(|a| (token.to_owned(), a.clone()))
    }

    /// `POST /api/v2/enrichment/requests/inspect` (the handle).
    pub(super) fn enrichment_inspect(&self, bearer: Option<&str>) -> Reply {
        match self.asked(bearer) {
            Some((handle, a)) => reply(200, &self.contract(&handle, &a)),
            None => error(401, "Authentication required"),
        }
    }

    /// `POST /api/v2/enrichment/consent/decisions` (the handle).
    pub(super) fn enrichment_consent(&self, bearer: Option<&str>, body: &Value) -> Reply {
        let keys_ok = body
            .as_object()
            .is_some_and(|o| o.keys().all(|k| k == "decision" || k == "remember"));
        let decision = body.get("decision").and_then(Value::as_str);
        if !keys_ok || !matches!(decision, Some("approved" | "declined")) {
            return error(400, "decision must be approved or declined");
        }
        let Some((handle, mut a)) = self.asked(bearer) else {
            return error(401, "Authentication required");
        };
        if matches!(a.state, "answered" | "no_relevant_context") {
            return error(
                409,
                "Retention cannot change after customer context is resolved",
            );
        }
        if body.get("remember") == Some(&Value::Bool(true)) && !a.remember {
            return error(400, "Consent cannot widen the request retention contract");
        }
        let before = a.state;
        a.state = if decision == Some("declined") {
            "declined"
        } else {
            "answer_ready"
        };
        {
            let mut state = self.lock();
            let declined = a.state == "declined";
            keep(&mut state.context_declined, a.subject.clone(), declined);
            keep(&mut state.enrichment, handle.clone(), a.clone());
        }
        let c = self.contract(&handle, &a);
        let mut out = Map::new();
        for k in [
            "requestId",
            "state",
            "stageInstruction",
            "answerInstruction",
            "submit",
        ] {
            out.insert(k.into(), c[k].clone());
        }
        out.insert("changed".into(), json!(before != a.state));
        let shown = self.shown("consent", &a, json!({"decision": decision}));
        reply(200, &Value::Object(out)).showing("context", shown)
    }

    /// `POST /api/v2/enrichment/answers` (the handle).
    pub(super) fn enrichment_answer(&self, bearer: Option<&str>, body: &Value) -> Reply {
        let Some(o) = body
            .as_object()
            .filter(|o| o.keys().all(|k| k == "status" || k == "items"))
        else {
            return error(400, "Invalid request: only status and items are taken");
        };
        let status = o.get("status").and_then(Value::as_str).unwrap_or_default();
        if !["answered", "declined", "no_relevant_context"].contains(&status) {
            return error(400, "Invalid enrichment answer status");
        }
        let items = o
            .get("items")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if (status == "answered") != (1..=customer::MAX_ITEMS).contains(&items.len()) {
            return error(
                400,
                "answered requires 1 to 8 items; other statuses require none",
            );
        }
        let Some((handle, mut a)) = self.asked(bearer) else {
            return error(401, "Authentication required");
        };
        match a.state {
            "declined" => {
                return error(
                    403,
                    "Customer context sharing was declined for this customer",
                )
            }
            "answer_ready" => {}
            _ => {
                return error(
                    409,
                    "This enrichment request already has a different answer",
                )
            }
        }
        for item in &items {
            if let Err(why) = check_item(item, a.remember) {
                return error(400, why);
            }
        }
        a.state = match status {
            "answered" => "answered",
            "declined" => "declined",
            _ => "no_relevant_context",
        };
        keep(&mut self.lock().enrichment, handle, a.clone());
        let signals: Vec<Value> = items
            .iter()
            .map(|i| json!({"key": i["key"], "type": i["type"], "value": i["value"], "provenance": i["provenance"],
                            "remembered": i["remember"] == true && a.remember}))
            .collect();
        let shown = self.shown("answer", &a, json!({"items": signals}));
        reply(200, &json!({"accepted": true, "requestId": a.request_id, "interactionId": a.interaction_id, "signals": signals}))
            .showing("context", shown)
    }
}

/// The service's checks of an enrichment request's members, in its words.
fn check_request(o: &Map<String, Value>) -> Result<(), &'static str> {
    let text = |k: &str| o.get(k).and_then(Value::as_str);
    if text("interactionId").is_none_or(|i| uuid::Uuid::parse_str(i).is_err()) {
        return Err("Invalid request: interactionId must be a UUID");
    }
    if !matches!(
        text("purpose").unwrap_or("product_personalization"),
        "product_personalization" | "targeted_advertising"
    ) {
        return Err("Invalid enrichment purpose");
    }
    let status = o.get("statusCode").and_then(Value::as_u64);
    let duration = o.get("durationMs").and_then(Value::as_u64);
    if !(status.is_some_and(|s| (100..=599).contains(&s))
        && duration.is_some_and(|d| d <= 86_400_000))
    {
        return Err("Invalid response status or duration");
    }
    for k in [
        "accountRef",
        "userRef",
        "anonymousRef",
        "customerRef",
        "sessionRef",
    ] {
        if o.get(k).is_some_and(|v| !v.as_str().is_some_and(opaque)) {
            return Err("identity and session refs must be bounded opaque identifiers, never a name or email");
        }
    }
    if !text("operation").is_some_and(|op| (1..=160).contains(&op.len())) {
        return Err("operation must be a normalized route or tool name");
    }
    if let Some(keys) = o.get("fieldKeys") {
        let keys: Vec<&str> = keys
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if keys.is_empty() || keys.len() > 8 || keys.iter().any(|k| !CATALOG.contains(k)) {
            return Err("fieldKeys must name 1 to 8 distinct customer context fields");
        }
    }
    Ok(())
}

fn check_item(item: &Value, request_remembers: bool) -> Result<(), &'static str> {
    let key = item.get("key").and_then(Value::as_str).unwrap_or_default();
    if !CATALOG.contains(&key) {
        return Err("Unknown customer context catalog key");
    }
    let kind = item.get("type").and_then(Value::as_str).unwrap_or_default();
    let value = item
        .get("value")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if !matches!(kind, "intent" | "preference" | "constraint")
        || value.is_empty()
        || value.chars().count() > customer::MAX_VALUE_CHARS
        || customer::sensitive(value)
    {
        return Err("Customer context type or value is not allowed by the catalog");
    }
    if item.get("remember") == Some(&Value::Bool(true)) && !request_remembers {
        return Err("This permission does not allow remembered context");
    }
    Ok(())
}
