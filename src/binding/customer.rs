//! Epode's customer-context binding at run time (`EPODE_SIDECAR_CUSTOMER_CONTEXT=on`): after
//! a product call's successful result, the enrichment request to Epode (product key, within
//! the budget, failing open), whose contract the result then carries; and the two
//! customer-context tools, answered here and forwarded to Epode with the request's `aqr1_`
//! handle only. The shapes and texts are `feedback::customer`'s.
//!
//! The enrichment request confirms the call's interaction at Epode (as the reference binding
//! relies on), so a call whose request Epode took records no telemetry event of its own; one
//! Epode did not take (refused, late, unreachable) records it as any call does, under the same
//! interaction id, so Epode counts the call once either way.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::value::RawValue;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use super::issued::IssuedHandles;
use crate::caller::CallerKey;
use crate::config::CustomerConfig;
use crate::epode::client::{
    EpodeClient, EpodeError, ANSWERS_PATH, CONTEXT_CONSENT_PATH, INSPECT_PATH,
};
use crate::feedback::customer::{self as cc, Contract, Permission};
use crate::feedback::identity::IdentityRefs;
use crate::ledger::{Ledger, Pool};
use crate::mcp::end::{Amendment, Amends};
use crate::mcp::raw::raw;
use crate::metrics::{ContextToolLabels, EnrichmentLabels, Metrics};

/// What the enrichment request says of one product call.
pub(crate) struct Ask {
    pub(crate) interaction_id: String,
    pub(crate) operation: String,
    /// From verified sources only (the product's `_meta` identity, a verified token, a
    /// trusted gateway's headers), as for feedback.
    pub(crate) refs: IdentityRefs,
    pub(crate) runtime_hint: Option<String>,
    /// The call's duration, as its telemetry event says it (Epode refuses a request whose
    /// facts differ from the event's under the same interaction id).
    pub(crate) duration: Duration,
    /// Whether the tool declares an `outputSchema` (the contract then goes as text).
    pub(crate) has_output_schema: bool,
    /// The verified caller (auth on) the handle is placed for.
    pub(crate) bound: Option<CallerKey>,
    /// The caller the request is charged to, in the ledger's `context_requests` pool.
    pub(crate) caller: CallerKey,
}

pub(crate) struct CustomerContext {
    config: CustomerConfig,
    client: Arc<EpodeClient>,
    definitions: Vec<Box<RawValue>>,
    metrics: Arc<Metrics>,
    ledger: Arc<Ledger>,
    /// The handles placed in verified callers' results, and to whom (`super::issued`).
    issued: Mutex<IssuedHandles>,
}

impl CustomerContext {
    pub(crate) fn new(
        config: CustomerConfig,
        client: Arc<EpodeClient>,
        metrics: Arc<Metrics>,
        ledger: Arc<Ledger>,
    ) -> Self {
        CustomerContext {
            config,
            client,
            definitions: cc::tool_definitions().iter().map(raw).collect(),
            metrics,
            ledger,
            issued: Mutex::new(IssuedHandles::new()),
        }
    }

    /// Whether `handle` was placed in another caller's result than `bound`'s.
    fn foreign(&self, handle: &str, bound: Option<CallerKey>) -> bool {
        let Some(caller) = bound else {
            return false;
        };
        let issued = self.issued.lock().unwrap_or_else(|p| p.into_inner());
        issued.foreign(handle, caller)
    }

    /// Whether customer context is asked for after `tool`'s results (never one of Epode's,
    /// nor a name Epode would refuse as an operation: a client's 1 MB name never goes out).
    pub(crate) fn follows(&self, tool: &str) -> bool {
        crate::epode::telemetry::valid_operation(tool)
            && !cc::is_customer_tool(tool)
            && !crate::feedback::tools::is_feedback_tool(tool)
            && self.config.follows(tool)
    }

    /// Whether `name` is one of the two tools this binding answers.
    pub(crate) fn answers(&self, name: &str) -> bool {
        cc::is_customer_tool(name)
    }

    /// The two tools' definitions, as `tools/list` appends them.
    pub(crate) fn definitions(&self) -> &[Box<RawValue>] {
        &self.definitions
    }

    /// Sends the enrichment request for a call whose result the hook has seen; `amends` gets
    /// what places the contract, awaited by the answer path within the budget. `unconfirmed`
    /// runs when Epode did not take the request (the call's telemetry event, recorded then).
    pub(crate) fn ask(
        self: &Arc<Self>,
        ask: Ask,
        amends: &Amends,
        unconfirmed: Option<Box<dyn FnOnce() + Send>>,
    ) {
        // Held until the request ends (within the budget), in its caller's share; past the
        // share or the cap, no request: the result goes as it came, its event recorded.
        let Ok(place) = self.ledger.try_charge(Pool::ContextRequests, ask.caller) else {
            self.metrics
                .enrichment_requests
                .get_or_create(&EnrichmentLabels { outcome: "shed" })
                .inc();
            if let Some(record) = unconfirmed {
                record();
            }
            return;
        };
        let bound = ask.bound;
        let (tx, rx) = oneshot::channel::<Option<Amendment>>();
        // The answer path waits a little past the budget: the request's own deadline ends it.
        amends.set(rx, self.config.budget + Duration::from_millis(50));
        let this = self.clone();
        let body = self.request_body(&ask);
        let schema = ask.has_output_schema;
        // Its own task: the request ends within the budget even when its client has gone,
        // and then records what it must.
        tokio::spawn(async move {
            let answered = this
                .client
                .enrichment_request(&body, this.config.budget)
                .await;
            let (outcome, contract) = match answered {
                Ok(a) if (200..300).contains(&a.status) => {
                    match a.json().as_ref().and_then(Contract::from_answer) {
                        Some(c) => ("placed", Some(c)),
                        None => ("refused", None),
                    }
                }
                Ok(a) => {
                    tracing::warn!(status = a.status, "customer context: Epode refused an enrichment request; the product result goes as it came");
                    ("refused", None)
                }
                Err(EpodeError::Timeout(_)) => ("late", None),
                Err(e) => {
                    tracing::warn!(error = %e, "customer context: Epode was not reached; the product result goes as it came");
                    ("unreachable", None)
                }
            };
            this.metrics
                .enrichment_requests
                .get_or_create(&EnrichmentLabels { outcome })
                .inc();
            if contract.is_none() {
                if let Some(record) = unconfirmed {
                    record();
                }
            }
            let handle = contract
                .as_ref()
                .and_then(|c| c.contract.get("requestHandle")?.as_str());
            if let (Some(caller), Some(h)) = (bound, handle) {
                let mut issued = this.issued.lock().unwrap_or_else(|p| p.into_inner());
                issued.place(h, caller);
            }
            let amendment = contract.map(|c| {
                Box::new(move |result: &mut crate::mcp::raw::RawMap| c.place(result, schema))
                    as Amendment
            });
            // The answer may have gone already (the budget passed, the client left).
            let _ = tx.send(amendment);
            drop(place);
        });
    }

    /// The enrichment request's body, its members in the reference binding's order; a
    /// customerRef that Epode would refuse beside a richer identity (not the accountRef) is
    /// left out.
    fn request_body(&self, ask: &Ask) -> Value {
        let r = &ask.refs;
        let customer = r.customer_ref.as_ref().filter(|c| {
            (r.account_ref.is_none() && r.user_ref.is_none()) || r.account_ref.as_ref() == Some(*c)
        });
        let mut body = serde_json::Map::new();
        let mut put = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                body.insert(k.to_owned(), v);
            }
        };
        put("accountRef", r.account_ref.clone().map(Value::from));
        put("userRef", r.user_ref.clone().map(Value::from));
        put("anonymousRef", r.anonymous_ref.clone().map(Value::from));
        put("customerRef", customer.cloned().map(Value::from));
        put("interactionId", Some(json!(ask.interaction_id)));
        put("operation", Some(json!(ask.operation)));
        put("fieldKeys", self.config.fields.as_ref().map(|f| json!(f)));
        put("surface", Some(json!("mcp")));
        put("statusCode", Some(json!(200)));
        let ms = u64::try_from(ask.duration.as_millis()).unwrap_or(u64::MAX);
        put("durationMs", Some(json!(ms.min(86_400_000))));
        put("sessionRef", r.session_ref.clone().map(Value::from));
        put("runtimeHint", ask.runtime_hint.clone().map(Value::from));
        put("purpose", Some(json!(self.config.purpose)));
        let identified = r.account_ref.is_some()
            || r.user_ref.is_some()
            || r.anonymous_ref.is_some()
            || customer.is_some();
        put("remember", Some(Value::Bool(identified)));
        Value::Object(body)
    }

    /// Answers one of the two tools. `capabilities` are the client's (a 2026 request's
    /// envelope; `None` for a 2025 client, which is not asked the permission question here),
    /// `input_responses` a retry's answers.
    pub(crate) async fn call_tool(
        &self,
        name: &str,
        args: &Value,
        (capabilities, input_responses): (Option<&Value>, Option<&Value>),
        bound: Option<CallerKey>,
    ) -> Value {
        let (tool, result) = if name == cc::CONSENT_TOOL {
            (cc::CONSENT_TOOL, self.consent_tool(args, bound).await)
        } else {
            let answer = self
                .share_tool(args, capabilities, input_responses, bound)
                .await;
            (cc::SHARE_TOOL, answer)
        };
        let outcome = match &result {
            Err(_) => "refused",
            Ok(r) if r.get("isError") == Some(&Value::Bool(true)) => "error",
            Ok(_) => "ok",
        };
        self.metrics
            .context_tool_calls
            .get_or_create(&ContextToolLabels { tool, outcome })
            .inc();
        result.unwrap_or_else(|why| cc::invalid_arguments(tool, &why))
    }

    async fn consent_tool(
        &self,
        args: &Value,
        bound: Option<CallerKey>,
    ) -> Result<Value, cc::Refusal> {
        let (handle, body) = cc::consent(args)?;
        if self.foreign(&handle, bound) {
            tracing::info!(
                "customer context: a handle placed in another caller's result is refused"
            );
            return Ok(cc::unverified(None));
        }
        let (status, body) = self.relay(CONTEXT_CONSENT_PATH, &handle, &body).await;
        Ok(cc::consent_recorded(status, body))
    }

    async fn share_tool(
        &self,
        args: &Value,
        capabilities: Option<&Value>,
        input_responses: Option<&Value>,
        bound: Option<CallerKey>,
    ) -> Result<Value, cc::Refusal> {
        let share = cc::share(args)?;
        if self.foreign(&share.handle, bound) {
            tracing::info!(
                "customer context: a handle placed in another caller's result is refused"
            );
            return Ok(cc::unverified(None));
        }
        let (status, inspected) = self.relay(INSPECT_PATH, &share.handle, &json!({})).await;
        let state = inspected
            .as_ref()
            .filter(|b| status < 400 && b.is_object())
            .and_then(|b| b.get("state").and_then(Value::as_str).map(str::to_owned));
        let Some(state) = state else {
            return Ok(cc::unverified(inspected));
        };
        Ok(match state.as_str() {
            "declined" => cc::declined(),
            "answered" | "no_relevant_context" => cc::already_completed(&state),
            "consent_required" => {
                let question = inspected
                    .as_ref()
                    .and_then(|b| b.get("question"))
                    .and_then(Value::as_str)
                    .filter(|q| !q.is_empty())
                    .map(str::to_owned);
                let response = input_responses.and_then(|r| r.get(cc::PERMISSION_KEY));
                match response {
                    Some(r) => self.permitted(&share, r).await,
                    None if cc::takes_form_elicitation(capabilities) => {
                        cc::permission_question(question.as_deref())
                    }
                    None => cc::unsupported(),
                }
            }
            _ => {
                let (status, body) = self.relay(ANSWERS_PATH, &share.handle, &share.answer).await;
                cc::answered(status, body)
            }
        })
    }

    /// The client's answer to the permission question: recorded, then the share sent under
    /// the handle the decision gives (every item interaction-scoped for "this session only").
    async fn permitted(&self, share: &cc::Share, response: &Value) -> Value {
        let permission = cc::permission(response);
        if let Some(done) = cc::permission_result(&permission) {
            return done;
        }
        let Permission::Approved { remember } = permission else {
            let (status, body) = self
                .relay(
                    CONTEXT_CONSENT_PATH,
                    &share.handle,
                    &json!({"decision": "declined"}),
                )
                .await;
            return cc::permission_declined(status, body);
        };
        let (status, body) = self
            .relay(
                CONTEXT_CONSENT_PATH,
                &share.handle,
                &json!({"decision": "approved", "remember": remember}),
            )
            .await;
        let next = body.as_ref().and_then(cc::next_handle);
        let (Some(next), false) = (next, status >= 400) else {
            return cc::permission_unrecorded(body);
        };
        let mut answer = share.answer.clone();
        if !remember {
            if let Some(items) = answer.get_mut("items").and_then(Value::as_array_mut) {
                for item in items {
                    item["remember"] = Value::Bool(false);
                }
            }
        }
        let (status, body) = self.relay(ANSWERS_PATH, &next, &answer).await;
        cc::answered(status, body)
    }

    /// One agent-side call: Epode's status and its JSON body; a call that got no answer is
    /// the reference relay's local one (503 retryable; a redirect, 502).
    async fn relay(&self, path: &'static str, handle: &str, body: &Value) -> (u16, Option<Value>) {
        match self
            .client
            .enrichment_agent(path, handle, body, self.config.timeout)
            .await
        {
            Ok(a) if (300..400).contains(&a.status) => {
                (502, Some(json!({"error": "epode_redirect_rejected"})))
            }
            Ok(a) => (a.status, a.json()),
            Err(e) => {
                tracing::warn!(error = %e, "customer context: a tool's call to Epode got no answer");
                (
                    503,
                    Some(
                        json!({"error": "customer_context_temporarily_unavailable", "retryable": true}),
                    ),
                )
            }
        }
    }
}
