//! The fake's customer-context endpoints (`/api/v2/enrichment/…`), modelled on the real
//! backend at open-software-network/os-agent-feedback 37c2131 (`backend/src/main.rs`, the
//! enrichment handlers): the product key for the request, the request's `aqr1_` handle for
//! the agent's calls, unknown members refused, one answer per request, the global catalog's
//! keys and values only. The backend asks no consent question (a new request is
//! `answer_ready` unless the customer declined); [`Store::consent_first`] makes new requests
//! `consent_required`, as rows made before it still are.

use std::collections::{BTreeMap, HashMap};

use serde_json::{json, Value};

use super::{bearer_token, Reply, Shared, State};

/// The catalog the fake knows (a part of the global v1 catalog): key, type, allowed values.
const CATALOG: [(&str, &str, &[&str]); 4] = [
    (
        "shopping.priority",
        "preference",
        &["sustainability", "price", "quality", "speed"],
    ),
    (
        "shopping.budget_band",
        "constraint",
        &["under_50", "50_150", "150_500", "over_500", "flexible"],
    ),
    (
        "content.topic_depth",
        "preference",
        &["overview", "practical", "deep"],
    ),
    (
        "travel.stay_style",
        "preference",
        &["boutique", "family", "business"],
    ),
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

const READY_STAGE: &str = "Finish the user's product task first. Then submit at most one bounded answer using the provided schema. Include only relevant, non-sensitive context for this product experience; do not infer identity or sensitive traits.";
const NO_ACTION: &str = "No enrichment action is permitted for this request.";

/// One enrichment request, as stored.
#[derive(Clone, Debug)]
pub struct StoredRequest {
    pub request_id: String,
    pub interaction_id: String,
    pub handle: String,
    /// The request's body as it came (idempotency: an identical retry gets the same handle).
    pub body: Value,
    pub state: String,
    pub remember: bool,
    /// Whom a decline binds: the account (remembered) or the interaction.
    pub subject: String,
    /// The answer's items, once answered.
    pub items: Vec<Value>,
}

#[derive(Default)]
pub struct Store {
    pub requests: Vec<StoredRequest>,
    by_interaction: HashMap<String, usize>,
    by_handle: HashMap<String, usize>,
    /// Subjects that declined.
    declined: BTreeMap<String, bool>,
    /// New requests ask the permission question first (legacy rows).
    pub consent_first: bool,
}

fn valid_ref(v: &str) -> bool {
    (1..=160).contains(&v.len())
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
}

fn catalog(key: &str) -> Option<(&'static str, &'static [&'static str])> {
    CATALOG
        .iter()
        .find(|(k, _, _)| *k == key)
        .map(|(_, t, v)| (*t, *v))
}

/// `POST /api/v2/enrichment/requests` (product key).
pub(super) fn request(
    shared: &Shared,
    state: &mut State,
    headers: &BTreeMap<String, String>,
    body: &Value,
) -> Reply {
    if bearer_token(headers).as_deref() != Some(shared.product_key.as_str()) {
        return Reply::error(401, "Invalid API key");
    }
    let Some(o) = body.as_object() else {
        return Reply::error(400, "Invalid request: expected an object");
    };
    if let Some(k) = o.keys().find(|k| !REQUEST_KEYS.contains(&k.as_str())) {
        return Reply::error(400, &format!("Invalid request: unknown field `{k}`"));
    }
    let text = |k: &str| o.get(k).and_then(Value::as_str);
    let Some(interaction) = text("interactionId").filter(|i| uuid::Uuid::parse_str(i).is_ok())
    else {
        return Reply::error(400, "Invalid request: interactionId must be a UUID");
    };
    if text("surface") != Some("mcp") && text("surface") != Some("http") {
        return Reply::error(400, "Invalid request: surface");
    }
    let purpose = text("purpose").unwrap_or("product_personalization");
    if !["product_personalization", "targeted_advertising"].contains(&purpose) {
        return Reply::error(400, "Invalid enrichment purpose");
    }
    let status = o.get("statusCode").and_then(Value::as_u64);
    let duration = o.get("durationMs").and_then(Value::as_u64);
    let status_ok = status.is_some_and(|s| (100..=599).contains(&s));
    let duration_ok = duration.is_some_and(|d| d <= 86_400_000);
    if !(status_ok && duration_ok) {
        return Reply::error(400, "Invalid response status or duration");
    }
    for k in [
        "accountRef",
        "userRef",
        "anonymousRef",
        "customerRef",
        "sessionRef",
    ] {
        if text(k).is_some_and(|v| !valid_ref(v)) || o.get(k).is_some_and(|v| !v.is_string()) {
            return Reply::error(
                400,
                &format!("{k} must be a bounded opaque identifier, never a name or email"),
            );
        }
    }
    if let (Some(c), true) = (
        text("customerRef"),
        text("accountRef").is_some() || text("userRef").is_some(),
    ) {
        if text("accountRef") != Some(c) {
            return Reply::error(
                400,
                "customerRef may accompany richer identity only when it exactly matches accountRef",
            );
        }
    }
    if !text("operation").is_some_and(|op| (1..=160).contains(&op.len())) {
        return Reply::error(400, "operation must be a normalized route or tool name");
    }
    if let Some(keys) = o.get("fieldKeys") {
        let keys: Vec<&str> = keys
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if keys.is_empty() || keys.len() > 8 {
            return Reply::error(
                400,
                "fieldKeys must name 1 to 8 distinct customer context fields",
            );
        }
        if keys.iter().any(|k| catalog(k).is_none()) {
            return Reply::error(400, "Unknown customer context catalog key");
        }
    }
    // The facts must be those the interaction's telemetry event says, when it came first.
    if let Some(&i) = state.event_index.get(interaction) {
        let event = &state.events[i];
        if event
            .get("durationMs")
            .and_then(Value::as_u64)
            .is_some_and(|d| Some(d) != duration)
        {
            return Reply::error(
                409,
                "interactionId belongs to a different interaction payload",
            );
        }
    }
    let store = &mut state.enrichment;
    if let Some(&i) = store.by_interaction.get(interaction) {
        let r = &store.requests[i];
        if &r.body != body {
            return Reply::error(
                409,
                "interactionId was already used with a different or expired enrichment request",
            );
        }
        return Reply::json(200, &answer(shared, r));
    }
    let identified = ["accountRef", "userRef", "anonymousRef", "customerRef"]
        .iter()
        .any(|k| text(k).is_some());
    let remember = o.get("remember").and_then(Value::as_bool).unwrap_or(false) && identified;
    let subject = match (
        remember,
        text("accountRef")
            .or(text("customerRef"))
            .or(text("userRef")),
    ) {
        (true, Some(who)) => format!("afsub1_{who}:{purpose}"),
        _ => format!("afint1_{interaction}"),
    };
    let declined = store.declined.get(&subject).copied().unwrap_or(false);
    let state_now = if declined {
        "declined"
    } else if store.consent_first {
        "consent_required"
    } else {
        "answer_ready"
    };
    let request_id = uuid::Uuid::new_v4().to_string();
    let handle = format!(
        "aqr1_{}.{}",
        request_id.replace('-', ""),
        uuid::Uuid::new_v4().simple()
    );
    let stored = StoredRequest {
        request_id,
        interaction_id: interaction.to_owned(),
        handle: handle.clone(),
        body: body.clone(),
        state: state_now.to_owned(),
        remember,
        subject,
        items: Vec::new(),
    };
    let reply = answer(shared, &stored);
    store.requests.push(stored);
    let i = store.requests.len() - 1;
    store.by_interaction.insert(interaction.to_owned(), i);
    store.by_handle.insert(handle, i);
    Reply::json(200, &reply)
}

/// The request as Epode answers it (the request, inspect).
fn answer(shared: &Shared, r: &StoredRequest) -> Value {
    let ready = r.state == "answer_ready";
    let submit = ready.then(|| json!({
        "url": format!("{}/api/v2/enrichment/answers", shared.public_base_url),
        "method": "POST",
        "authorization": format!("Bearer {}", r.handle),
        "contentType": "application/json",
        "bodySchema": {"status": ["answered", "declined", "no_relevant_context"],
                       "items": {"maximum": 8, "required": ["key", "type", "value", "provenance", "remember"],
                                 "catalog": CATALOG.iter().map(|(k, t, v)| json!({"key": k, "type": t, "allowedValues": v})).collect::<Vec<_>>()}}
    }));
    json!({
        "requestId": r.request_id,
        "interactionId": r.interaction_id,
        "state": r.state,
        "purpose": r.body.get("purpose").cloned().unwrap_or(json!("product_personalization")),
        "surface": "mcp",
        "identityLevel": if r.remember { "verified" } else { "ephemeral" },
        "constraints": {"handlerOwner": "company_mcp", "catalog": {"version": "v1"}},
        "stageInstruction": if ready { READY_STAGE } else { NO_ACTION },
        "question": null,
        "answerInstruction": ready.then_some("Provide only non-sensitive context the user explicitly shared or that is directly relevant to the current task for this product experience by this company. Never include prompts, transcripts, names, emails, credentials, or raw customer content."),
        "expiresAt": "2099-01-01T00:00:00Z",
        "consent": {"url": format!("{}/api/v2/enrichment/consent/decisions", shared.public_base_url),
                    "method": "POST", "authorization": format!("Bearer {}", r.handle)},
        "submit": submit,
    })
}

fn by_handle<'a>(
    state: &'a mut State,
    headers: &BTreeMap<String, String>,
) -> Option<&'a mut StoredRequest> {
    let token = bearer_token(headers)?;
    let i = *state.enrichment.by_handle.get(&token)?;
    state.enrichment.requests.get_mut(i)
}

/// `POST /api/v2/enrichment/requests/inspect` (the handle).
pub(super) fn inspect(
    shared: &Shared,
    state: &mut State,
    headers: &BTreeMap<String, String>,
) -> Reply {
    match by_handle(state, headers) {
        Some(r) => {
            let a = answer(shared, r);
            Reply::json(200, &a)
        }
        None => Reply::error(401, "Authentication required"),
    }
}

/// `POST /api/v2/enrichment/consent/decisions` (the handle).
pub(super) fn consent(
    shared: &Shared,
    state: &mut State,
    headers: &BTreeMap<String, String>,
    body: &Value,
) -> Reply {
    if body
        .as_object()
        .is_some_and(|o| o.keys().any(|k| k != "decision" && k != "remember"))
    {
        return Reply::error(400, "Invalid request: unknown field");
    }
    let decision = body.get("decision").and_then(Value::as_str);
    if !matches!(decision, Some("approved" | "declined")) {
        return Reply::error(400, "decision must be approved or declined");
    }
    let Some(r) = by_handle(state, headers) else {
        return Reply::error(401, "Authentication required");
    };
    if r.state == "answered" || r.state == "no_relevant_context" {
        return Reply::error(
            409,
            "Retention cannot change after customer context is resolved",
        );
    }
    if body.get("remember") == Some(&Value::Bool(true)) && !r.remember {
        return Reply::error(400, "Consent cannot widen the request retention contract");
    }
    let before = r.state.clone();
    r.state = if decision == Some("declined") {
        "declined"
    } else {
        "answer_ready"
    }
    .to_owned();
    let (subject, now) = (r.subject.clone(), r.state.clone());
    let mut a = answer(shared, r);
    let changed = before != now;
    state.enrichment.declined.insert(subject, now == "declined");
    let o = a.as_object_mut().expect("an object");
    o.retain(|k, _| {
        [
            "requestId",
            "state",
            "stageInstruction",
            "answerInstruction",
            "submit",
        ]
        .contains(&k.as_str())
    });
    o.insert("changed".into(), json!(changed));
    Reply::json(200, &a)
}

/// `POST /api/v2/enrichment/answers` (the handle).
pub(super) fn answers(
    _shared: &Shared,
    state: &mut State,
    headers: &BTreeMap<String, String>,
    body: &Value,
) -> Reply {
    let Some(o) = body.as_object() else {
        return Reply::error(400, "Invalid request: expected an object");
    };
    if o.keys().any(|k| k != "status" && k != "items") {
        return Reply::error(400, "Invalid request: unknown field");
    }
    let status = o.get("status").and_then(Value::as_str).unwrap_or_default();
    if !["answered", "declined", "no_relevant_context"].contains(&status) {
        return Reply::error(400, "Invalid enrichment answer status");
    }
    let items = o
        .get("items")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if (status == "answered") != (1..=8).contains(&items.len()) {
        return Reply::error(
            400,
            "answered requires 1 to 8 items; other statuses require none",
        );
    }
    let Some(r) = by_handle(state, headers) else {
        return Reply::error(401, "Authentication required");
    };
    if r.state == "declined" {
        return Reply::error(
            403,
            "Customer context sharing was declined for this customer",
        );
    }
    if r.state != "answer_ready" {
        if r.state == status && r.items == items {
            return Reply::json(
                200,
                &json!({"accepted": true, "requestId": r.request_id, "interactionId": r.interaction_id, "signals": signals(r)}),
            );
        }
        return Reply::error(
            if r.state == "consent_required" {
                403
            } else {
                409
            },
            if r.state == "consent_required" {
                "Customer context sharing is not approved for this request"
            } else {
                "This enrichment request already has a different answer"
            },
        );
    }
    for item in &items {
        let key = item.get("key").and_then(Value::as_str).unwrap_or_default();
        let Some((kind, values)) = catalog(key) else {
            return Reply::error(400, "Unknown customer context catalog key");
        };
        let value = item
            .get("value")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if item.get("type").and_then(Value::as_str) != Some(kind) || !values.contains(&value) {
            return Reply::error(
                400,
                "Customer context type or value is not allowed by the catalog",
            );
        }
        if item.get("remember") == Some(&Value::Bool(true)) && !r.remember {
            return Reply::error(400, "This permission does not allow remembered context");
        }
        if let Some(k) = item.as_object().and_then(|i| {
            i.keys().find(|k| {
                ![
                    "key",
                    "type",
                    "value",
                    "summary",
                    "provenance",
                    "confidence",
                    "remember",
                    "expiresAt",
                ]
                .contains(&k.as_str())
            })
        }) {
            return Reply::error(400, &format!("Invalid request: unknown field `{k}`"));
        }
    }
    r.state = status.to_owned();
    r.items = items;
    Reply::json(
        200,
        &json!({"accepted": true, "requestId": r.request_id, "interactionId": r.interaction_id, "signals": signals(r)}),
    )
}

fn signals(r: &StoredRequest) -> Vec<Value> {
    r.items
        .iter()
        .map(|i| json!({"key": i["key"], "type": i["type"], "value": i["value"], "provenance": i["provenance"],
                        "remembered": i.get("remember") == Some(&Value::Bool(true)) && r.remember}))
        .collect()
}
