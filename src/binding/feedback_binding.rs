//! The binding itself: its settings, the parts that exist only when feedback is on (the
//! Epode client, the consent cache, the telemetry queue, the two feedback tools), the tool
//! catalog, and what it counts and shows. The fields are this file's: the response hooks
//! (`hooks`) and the HTTP surface's part (`http_surface`) go through the methods below, each
//! named for what it does. The two feedback tools' calls are answered here.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::HeaderMap;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::catalog::ToolCatalog;
use super::customer::CustomerContext;
use super::tasks::{Followed, FollowedTasks};
use super::upstream_epode::{self, Carried, Carries, EPODE_EXTENSION};
use crate::caller::CallerKey;
use crate::config::FeedbackConfig;
use crate::epode::client::{EpodeClient, EpodeError};
use crate::epode::consent::{ConsentCache, Decided};
use crate::epode::telemetry::{Counters, HttpCompletion, McpCompletion, QueueSettings, Telemetry};
use crate::error::{Error, ErrorKind};
use crate::feedback::capability::{self, Claims, Minted, ProductKey};
use crate::feedback::envelope::{self, CachedConsent, Case};
use crate::feedback::identity::IdentityRefs;
use crate::feedback::tools::{self, Decision, EpodeFailure, FeedbackTools};
use crate::feedback::{customer, CONSENT_TOOL, REPORT_TOOL};
use crate::log_summary::LogSummary;
use crate::mcp::raw::{raw, RawMap};
use crate::metrics::{DecorationLabels, FeedbackCallLabels, FeedbackOutcome, Metrics};
use crate::observe::{Decorated, FeedbackTool, Note, Noted, Observer, Refused};

/// The parts that exist only when feedback is on.
struct Active {
    /// The two tool definitions, serialised once.
    definitions: Vec<Box<RawValue>>,
    key: ProductKey,
    client: Arc<EpodeClient>,
    consent: Arc<ConsentCache>,
    telemetry: Arc<Telemetry>,
    tools: FeedbackTools,
    /// Deadline of the two feedback tools' calls to Epode.
    timeout: Duration,
}

/// What a product answer's envelope is made from, on either surface: the Ask-once consent
/// subject (from customerRef), the case the mode and the decision cached for the subject
/// make (the cache only: an answer never waits for Epode; `None`: no envelope) and the
/// capability minted for the interaction, which carries the subject and the decision's
/// revision.
pub(super) struct Grant {
    pub(super) subject: Option<String>,
    pub(super) case: Option<Case>,
    pub(super) minted: Minted,
}

pub(crate) struct FeedbackBinding {
    config: FeedbackConfig,
    active: Option<Active>,
    catalog: ToolCatalog,
    /// Product calls answered with a task, followed to their outcome.
    tasks: FollowedTasks,
    warned_shadowing: AtomicBool,
    /// What of Epode the upstream carries itself (the sidecar steps back where it does).
    carried: Carried,
    /// ask_once calls that had no customerRef to ask once for (logged now and then).
    no_subject: LogSummary,
    metrics: Arc<Metrics>,
    /// Whoever watches (the local trial's console, with `--dev`).
    observer: Option<Arc<dyn Observer>>,
    /// Epode's customer-context binding, when it is on.
    customer: Option<Arc<CustomerContext>>,
}

impl FeedbackBinding {
    /// The grant for an answer with `refs` (`None` when feedback is off); `without_customer`
    /// names what is counted when Ask once has no customerRef to ask once for.
    pub(super) fn grant(
        &self,
        refs: &IdentityRefs,
        without_customer: &'static str,
        bound: Option<CallerKey>,
    ) -> Option<Grant> {
        let active = self.active.as_ref()?;
        let ask_once = self.config.mode == crate::feedback::FeedbackMode::AskOnce;
        let subject = ask_once
            .then(|| refs.customer_ref.as_deref().map(|c| active.key.subject(c)))
            .flatten();
        let (cached, revision) = match &subject {
            Some(s) => active.consent.get(s),
            None => {
                if ask_once {
                    self.no_subject.add(without_customer, 1);
                }
                (CachedConsent::NoSubject, 0)
            }
        };
        let minted = capability::mint(
            &active.key,
            SystemTime::now(),
            subject.clone().map(|s| (s, revision)),
            bound.map(CallerKey::to_bytes).as_ref().map(|b| &b[..]),
        );
        Some(Grant {
            subject,
            case: Case::for_product_result(self.config.mode, cached),
            minted,
        })
    }

    /// Counts a product tool result decorated in `case`, and shows it to whoever watches.
    pub(super) fn note_decorated(
        &self,
        tool: &str,
        is_error: bool,
        case: Case,
        interaction_id: &str,
    ) {
        let (mode, state) = (self.config.mode.as_str(), case.stage().as_str());
        self.metrics
            .decorations
            .get_or_create(&DecorationLabels { mode, state })
            .inc();
        crate::otel::event("epode.decorated", || {
            vec![
                opentelemetry::KeyValue::new("epode.feedback.state", state),
                opentelemetry::KeyValue::new("epode.feedback.mode", mode),
            ]
        });
        if let Some(observer) = &self.observer {
            observer.decorated(Decorated {
                tool,
                is_error,
                state,
                mode,
                interaction_id,
            });
        }
    }

    /// Looks the Ask-once `subject`'s consent up with Epode in the background, for the next
    /// answer (an answer itself never waits for it).
    pub(super) fn refresh_consent(&self, subject: &str) {
        if let Some(active) = &self.active {
            active.consent.warm(subject, false);
        }
    }

    /// Queues a product tool call's telemetry event (nothing when feedback is off).
    pub(super) fn record(&self, event: McpCompletion) {
        if let Some(active) = &self.active {
            active.telemetry.record(event);
        }
    }

    /// Queues an HTTP response's telemetry event (nothing when feedback is off).
    pub(super) fn record_http(&self, completion: &HttpCompletion) {
        if let Some(active) = &self.active {
            active.telemetry.record_http(completion);
        }
    }

    /// Follows `caller`'s task `task_id`, the outcome of a call of `tool` made at `started`
    /// (`listed`: what the catalog knew of the tool then), for `ttl_ms` at most.
    pub(super) fn follow_task(
        &self,
        caller: CallerKey,
        task_id: &str,
        tool: (&str, Option<bool>),
        started: std::time::Instant,
        ttl_ms: Option<u64>,
    ) -> bool {
        self.tasks.follow(caller, task_id, tool, started, ttl_ms)
    }

    /// `caller`'s followed task `task_id`, when its outcome has come.
    pub(super) fn take_task(&self, caller: CallerKey, task_id: &str) -> Option<Followed> {
        self.tasks.take(caller, task_id)
    }

    /// Whether calls of `tool` are observed (decorated as the settings say, and recorded):
    /// feedback is on, the settings include the tool, and its name is an operation Epode
    /// takes.
    pub(super) fn observes(&self, tool: &str) -> bool {
        self.binds() && self.config.includes(tool) && crate::epode::telemetry::valid_operation(tool)
    }

    /// Whether the settings decorate results of `tool` (an observed tool may be recorded only).
    pub(super) fn decorates(&self, tool: &str) -> bool {
        self.config.decorates(tool)
    }

    /// The references an answer's telemetry and consent subject use: the answer's own (a tool
    /// result's `_meta` identity, an HTTP response's `Epode-Identity`) first, then a trusted
    /// gateway's, then the mode's one customerRef rule.
    pub(super) fn shared_refs(&self, own: IdentityRefs, gateway: IdentityRefs) -> IdentityRefs {
        // What the product says wins; a ref it names otherwise than the verified token (or
        // the trusted gateway) is counted.
        if own.disagrees(&gateway) {
            self.metrics.auth.identity_disagreements.inc();
        }
        let mut refs = own.or(gateway);
        refs.apply_customer_rule(self.config.mode);
        refs
    }

    /// Warns, once, that the upstream lists a tool named like a feedback tool (it is hidden,
    /// and the sidecar answers that name itself).
    pub(super) fn warn_shadowing(&self, tool: &str) {
        if !self.warned_shadowing.swap(true, Ordering::Relaxed) {
            tracing::warn!(tool = %tool, "the upstream has a tool named like an Epode feedback tool; it is hidden, and the sidecar answers that name itself");
        }
    }

    /// Appends the two feedback tools' definitions to a `tools/list` page (the last); returns
    /// whether it did (not when feedback is off, nor where the upstream carries Epode).
    pub(super) fn append_feedback_tools(&self, tools: &mut Vec<Box<RawValue>>) -> bool {
        let Some(active) = self.active.as_ref().filter(|_| self.binds()) else {
            return false;
        };
        tools.extend(active.definitions.iter().cloned());
        true
    }

    /// Appends the two customer-context tools to a `tools/list` page (the last), when
    /// customer context is on; returns whether it did.
    pub(super) fn append_customer_tools(&self, tools: &mut Vec<Box<RawValue>>) -> bool {
        let Some(c) = self.customer() else {
            return false;
        };
        tools.extend(c.definitions().iter().cloned());
        true
    }

    /// What the catalog knows of `tool`: `Some(declares an outputSchema)` when the upstream
    /// lists it.
    pub(crate) fn listed(&self, tool: &str) -> Option<bool> {
        self.catalog.listed(tool)
    }

    /// The upstream said its tools changed: the catalog learns them again.
    pub(super) fn forget_tools(&self) {
        self.catalog.invalidate();
    }

    /// The upstream said its tools changed, where no response hook heard it (a listen feed
    /// of a 2025-era upstream's session, a notice taken off a 2026 client's call).
    pub(crate) fn tools_changed(&self) {
        self.forget_tools();
    }

    /// Epode's origin, for the envelope's URLs and the discovery link.
    pub(crate) fn endpoint(&self) -> &str {
        self.config.api_url.as_str()
    }

    /// Builds the binding; with feedback on, starts the telemetry task on the current runtime.
    pub(crate) fn new(
        config: FeedbackConfig,
        counters: Counters,
        metrics: Arc<Metrics>,
        observer: Option<Arc<dyn Observer>>,
        ledger: Arc<crate::ledger::Ledger>,
    ) -> Result<Arc<Self>, Error> {
        let active = match (&config.key, config.mode.is_enabled()) {
            (Some(key), true) => {
                let client = Arc::new(
                    EpodeClient::new(config.api_url.clone(), key.clone())
                        .map_err(|e| Error::new(ErrorKind::Internal, e))?,
                );
                let settings = QueueSettings {
                    capacity: config.telemetry_queue,
                    batch_max: config.telemetry_batch,
                    concurrency: config.telemetry_concurrency,
                    flush_every: config.telemetry_flush,
                    backoff_base: config.telemetry_retry_base,
                    ..QueueSettings::default()
                };
                let tools = FeedbackTools::new()
                    .map_err(|e| Error::new(ErrorKind::Internal, e.to_string()))?;
                Some(Active {
                    definitions: tools.definitions().iter().map(raw).collect(),
                    key: key.clone(),
                    consent: ConsentCache::new(client.clone(), config.consent_timeout),
                    telemetry: Telemetry::start(client.clone(), settings, counters),
                    client,
                    tools,
                    timeout: config.tool_timeout,
                })
            }
            _ => None,
        };
        let customer = match (&config.customer, &config.key) {
            (Some(cfg), Some(key)) => {
                let client = match &active {
                    Some(a) => a.client.clone(),
                    None => Arc::new(
                        EpodeClient::new(config.api_url.clone(), key.clone())
                            .map_err(|e| Error::new(ErrorKind::Internal, e))?,
                    ),
                };
                Some(Arc::new(CustomerContext::new(
                    cfg.clone(),
                    client,
                    metrics.clone(),
                    ledger.clone(),
                )))
            }
            _ => None,
        };
        let catalog = ToolCatalog::new(config.max_tools);
        let carried = Carried::new(config.upstream_epode, metrics.clone());
        Ok(Arc::new(FeedbackBinding {
            config,
            active,
            catalog,
            tasks: FollowedTasks::new(ledger),
            warned_shadowing: AtomicBool::new(false),
            carried,
            no_subject: LogSummary::new(
                "AGENT_FEEDBACK_MODE=ask_once, but tool results name no customer, so agents are asked for consent on every call as in ask_always. Name the caller on each tool result with _meta[\"ai.epode/identity\"] = {\"customerRef\": \"<your customer id>\"} (the sidecar removes it before the client sees it), or have a gateway set a header listed in EPODE_SIDECAR_IDENTITY_HEADERS; see \"Who the caller is\" in the README",
                std::time::Duration::from_secs(600),
            ),
            metrics,
            observer,
            customer,
        }))
    }

    /// The customer-context binding, when it is on and the upstream does not carry Epode.
    pub(crate) fn customer(&self) -> Option<&Arc<CustomerContext>> {
        self.customer
            .as_ref()
            .filter(|_| !self.carried.stepped_back())
    }

    /// Whether a product call of `tool` may get customer context.
    pub(crate) fn customer_follows(&self, tool: &str) -> bool {
        self.customer().is_some_and(|c| c.follows(tool))
    }

    pub(crate) fn enabled(&self) -> bool {
        self.active.is_some()
    }

    /// Whether the binding is the sidecar's to make: feedback is on and the upstream does not
    /// carry Epode itself (`upstream_epode.rs`).
    pub(crate) fn binds(&self) -> bool {
        self.enabled() && !self.carried.stepped_back()
    }

    /// Whether the sidecar looks for Epode in the upstream (feedback on, `auto`).
    pub(crate) fn looks_for_epode(&self) -> bool {
        self.enabled() && self.carried.looks()
    }

    /// The upstream's discovery capabilities (a `server/discover` or `initialize` answer), for
    /// whether it advertises Epode's binding.
    pub(crate) fn heard_capabilities(&self, caps: &Value) {
        if self.enabled() && upstream_epode::advertises(caps) {
            self.carried.heard(
                Carries::Telemetry,
                "its capabilities advertise ai.epode/agent-feedback",
            );
        }
    }

    /// Whether a tool the upstream lists is one of Epode's own, kept as it is because the
    /// upstream carries Epode (then the sidecar steps back); `false` when the sidecar looks
    /// for none (a feedback tool's name is then the sidecar's).
    pub(super) fn upstreams_epode_tool(&self, name: &str) -> bool {
        let epode = upstream_epode::EPODE_TOOLS.contains(&name);
        if epode && self.enabled() && self.carried.looks() {
            self.carried
                .heard(Carries::Binding, "its tools/list names Epode's tools");
            return true;
        }
        false
    }

    /// A product result that already carries `_agentFeedback` (its upstream's Epode made it):
    /// never decorated again nor counted.
    pub(super) fn decorated_upstream(&self, result: &RawMap) -> bool {
        let decorated = self.enabled() && upstream_epode::already_decorated(result);
        if decorated {
            self.carried
                .heard(Carries::Binding, "its results carry _agentFeedback");
        }
        decorated
    }

    /// An HTTP response of the upstream carried Epode's envelope itself (its `_agentFeedback`,
    /// its page's script, its `Agent-Feedback` header): with `auto`, the sidecar steps back, as
    /// for a tool result that carries `_agentFeedback` (a response the app's own SDK leaves
    /// bare, as after a customer's "no", must stay bare).
    pub(crate) fn heard_http_envelope(&self) {
        if self.enabled() {
            self.carried.heard(
                Carries::Binding,
                "its HTTP responses carry Epode's envelope",
            );
        }
    }

    pub(crate) fn telemetry(&self) -> Option<&Arc<Telemetry>> {
        self.active.as_ref().map(|a| &a.telemetry)
    }

    /// Flushes queued telemetry within the configured deadline; returns the events lost.
    pub(crate) async fn shutdown(&self) -> u64 {
        match self.telemetry() {
            Some(t) => t.shutdown(self.config.telemetry_shutdown).await,
            None => 0,
        }
    }

    /// A discovery result with the feedback rule near the start of its instructions, the
    /// `tools` capability the feedback tools need, and the binding advertised as Epode's SDKs
    /// advertise it (`capabilities.extensions["ai.epode/agent-feedback"]`, beside the
    /// upstream's extensions); unchanged when feedback is off.
    pub(crate) fn with_binding(&self, mut discover: Value) -> Value {
        if let Some(caps) = discover.get("capabilities") {
            self.heard_capabilities(caps);
        }
        if !self.binds() {
            return discover;
        }
        let upstream = discover
            .get("instructions")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let text = envelope::merge_instructions(self.config.mode, upstream.as_deref());
        if let (Some(obj), Some(text)) = (discover.as_object_mut(), text) {
            obj.insert("instructions".into(), Value::from(text));
            let caps = obj.entry("capabilities").or_insert_with(|| json!({}));
            if let Some(caps) = caps.as_object_mut() {
                caps.entry("tools").or_insert_with(|| json!({}));
                let extensions = caps.entry("extensions").or_insert_with(|| json!({}));
                if let Some(extensions) = extensions.as_object_mut() {
                    extensions
                        .entry(EPODE_EXTENSION)
                        .or_insert_with(|| json!({}));
                }
            }
        }
        discover
    }

    /// Whether a tool call is one of the two feedback tools the sidecar answers itself.
    pub(crate) fn is_local_tool(&self, name: &str) -> bool {
        (self.binds() && tools::is_feedback_tool(name))
            || (self.customer().is_some() && customer::is_customer_tool(name))
    }

    /// Whether the sidecar should list the upstream's tools before this call: the tool is one
    /// feedback would observe, but the catalog has not seen the upstream list it.
    pub(crate) fn needs_listing(&self, tool: &str) -> bool {
        (self.observes(tool) || self.customer_follows(tool))
            && self.catalog.listed(tool).is_none()
            && self.catalog.claim_fetch()
    }

    /// Learns the upstream's tools: a `tools/list` page passing through, or the listing the
    /// sidecar made itself.
    pub(crate) fn learn(&self, tools: Vec<(String, bool)>) {
        for (name, _) in &tools {
            self.upstreams_epode_tool(name);
        }
        self.catalog.learn(tools);
    }

    /// Identity references from the headers of a trusted gateway, as configured.
    pub(super) fn header_refs(&self, headers: &HeaderMap) -> IdentityRefs {
        let mut refs = IdentityRefs::default();
        for (kind, name) in &self.config.identity_headers {
            if let Some(v) = headers.get(name).and_then(|v| v.to_str().ok()) {
                refs.set(*kind, v);
            }
        }
        refs
    }

    /// Answers a call of one of the two feedback tools: validated locally (arguments, then the
    /// handle's signature and expiry with the product key, and, with auth on, that it was
    /// issued to `bound`, the caller), forwarded to Epode with only the fields Epode takes, and
    /// answered with the reference binding's result. With an observer, the request's `note`
    /// learns the outcome.
    pub(crate) async fn call_local(
        &self,
        name: &str,
        arguments: &Value,
        note: Option<&Arc<Note>>,
        bound: Option<CallerKey>,
    ) -> Value {
        let Some(active) = &self.active else {
            return json!({"content": [], "isError": true});
        };
        let (tool, (result, outcome)) = match name {
            CONSENT_TOOL => (
                CONSENT_TOOL,
                self.record_consent(active, arguments, bound).await,
            ),
            REPORT_TOOL => (REPORT_TOOL, report(active, arguments, bound).await),
            _ => return json!({"content": [], "isError": true}),
        };
        self.metrics
            .feedback_calls
            .get_or_create(&FeedbackCallLabels {
                tool,
                outcome: outcome.label(),
            })
            .inc();
        if let Some(note) = note {
            self.show_local(active, note, (tool, arguments, bound), (&result, outcome));
        }
        result
    }

    /// What an observer is shown of a feedback tool's call: its outcome, and a call the
    /// sidecar refused itself (it never reached Epode) with the reason.
    fn show_local(
        &self,
        active: &Active,
        note: &Note,
        (tool, arguments, bound): (&'static str, &Value, Option<CallerKey>),
        (result, outcome): (&Value, FeedbackOutcome),
    ) {
        let handle = arguments.get("feedbackHandle").and_then(Value::as_str);
        let interaction = handle
            .filter(|h| h.len() <= tools::MAX_HANDLE_LEN)
            .and_then(|h| capability::verify(&active.key, h, SystemTime::now()).ok())
            .map(|claims| claims.i);
        note.set(Noted::Outcome(outcome.label()));
        note.set(Noted::IsError(
            result.get("isError") == Some(&Value::Bool(true)),
        ));
        if let Some(i) = &interaction {
            note.set(Noted::InteractionId(i.clone()));
        }
        let refused = match outcome {
            FeedbackOutcome::InvalidArguments => result["content"][0]["text"]
                .as_str()
                .unwrap_or("invalid arguments")
                .to_owned(),
            FeedbackOutcome::InvalidHandle => {
                let why = handle.map_or(Err("there is none"), |h| verify_handle(active, h, bound));
                format!("bad feedback handle: {}", why.err().unwrap_or("invalid"))
            }
            // Epode's own answers: no refusal of the sidecar's to show.
            FeedbackOutcome::Accepted
            | FeedbackOutcome::Approved
            | FeedbackOutcome::Declined
            | FeedbackOutcome::Refused
            | FeedbackOutcome::Unavailable => return,
        };
        if let Some(observer) = &self.observer {
            observer.refused(Refused {
                tool: if tool == REPORT_TOOL {
                    FeedbackTool::Report
                } else {
                    FeedbackTool::Consent
                },
                reason: &refused,
                interaction_id: interaction.as_deref(),
            });
        }
    }

    async fn record_consent(
        &self,
        active: &Active,
        arguments: &Value,
        bound: Option<CallerKey>,
    ) -> (Value, FeedbackOutcome) {
        let call = match active.tools.validate_consent_args(arguments) {
            Ok(c) => c,
            Err(invalid) => return (invalid.to_result(), FeedbackOutcome::InvalidArguments),
        };
        // Verified once: the decision is remembered from these claims however long Epode takes
        // to answer (a handle may expire meanwhile; the decision it carried still stands).
        let claims = match verify_handle(active, call.handle.as_str(), bound) {
            Ok(claims) => claims,
            Err(why) => {
                tracing::info!(
                    reason = why,
                    "consent decision refused locally: bad feedback handle"
                );
                return (
                    tools::consent_failure(EpodeFailure::InvalidHandle),
                    FeedbackOutcome::InvalidHandle,
                );
            }
        };
        let sent = active
            .client
            .post_decision(call.handle.as_str(), &call.body, active.timeout)
            .await;
        match sent {
            Ok(a) if (200..300).contains(&a.status) => {
                let Some(body) = a.json().filter(is_consent_answer) else {
                    tracing::warn!(
                        status = a.status,
                        "Epode's consent answer is not a consent state"
                    );
                    return (
                        tools::consent_failure(EpodeFailure::Unavailable),
                        FeedbackOutcome::Unavailable,
                    );
                };
                remember_decision(active, claims, &body);
                tracing::info!(
                    decision = call.decision.as_str(),
                    "feedback consent recorded"
                );
                (
                    tools::consent_success(call.decision, body),
                    match call.decision {
                        Decision::Approved => FeedbackOutcome::Approved,
                        Decision::Declined => FeedbackOutcome::Declined,
                    },
                )
            }
            Ok(a) => {
                tracing::warn!(status = a.status, "Epode refused the consent decision");
                (
                    tools::consent_failure(EpodeFailure::Status(a.status)),
                    FeedbackOutcome::Refused,
                )
            }
            Err(e) => {
                log_unavailable(&e, "consent decision not delivered");
                (
                    tools::consent_failure(EpodeFailure::Unavailable),
                    FeedbackOutcome::Unavailable,
                )
            }
        }
    }
}

/// After an Ask-once decision, the cache learns it at once (the next call must not ask
/// again), then checks with Epode in the background. Compare-and-set on the revision:
/// a decision made with `r = 0` creates revision 1, one made with `r > 0` makes `r + 1`.
fn remember_decision(active: &Active, claims: Claims, body: &Value) {
    let Some(subject) = claims.s else { return };
    let approved = match body.get("state").and_then(Value::as_str) {
        Some("approved") => true,
        Some("declined") => false,
        _ => return,
    };
    if body.get("changed").and_then(Value::as_bool) == Some(true) {
        let r = claims.r.unwrap_or(0).max(0) as u64;
        active.consent.put(
            &subject,
            Decided {
                approved,
                revision: r + 1,
            },
        );
    }
    active.consent.warm(&subject, true);
}

async fn report(
    active: &Active,
    arguments: &Value,
    bound: Option<CallerKey>,
) -> (Value, FeedbackOutcome) {
    let call = match active.tools.validate_report_args(arguments) {
        Ok(c) => c,
        Err(invalid) => return (invalid.to_result(), FeedbackOutcome::InvalidArguments),
    };
    if let Err(why) = verify_handle(active, call.handle.as_str(), bound) {
        tracing::info!(
            reason = why,
            "feedback report refused locally: bad feedback handle"
        );
        return (
            tools::report_failure(EpodeFailure::InvalidHandle),
            FeedbackOutcome::InvalidHandle,
        );
    }
    let sent = active
        .client
        .post_report(call.handle.as_str(), &call.body, active.timeout)
        .await;
    match sent {
        Ok(a) if (200..300).contains(&a.status) => {
            let Some(body) = a.json().filter(is_report_receipt) else {
                tracing::warn!(status = a.status, "Epode's report answer is not a receipt");
                return (
                    tools::report_failure(EpodeFailure::Unavailable),
                    FeedbackOutcome::Unavailable,
                );
            };
            tracing::info!("feedback report accepted");
            (tools::report_success(body), FeedbackOutcome::Accepted)
        }
        Ok(a) => {
            tracing::warn!(status = a.status, "Epode refused the feedback report");
            (
                tools::report_failure(EpodeFailure::Status(a.status)),
                FeedbackOutcome::Refused,
            )
        }
        Err(e) => {
            log_unavailable(&e, "feedback report not delivered");
            (
                tools::report_failure(EpodeFailure::Unavailable),
                FeedbackOutcome::Unavailable,
            )
        }
    }
}

fn log_unavailable(e: &EpodeError, what: &'static str) {
    tracing::warn!(error = %e, "{what}");
}

/// Checks a handle an agent sent back before it goes anywhere: bounded, signed by this
/// product's key, unexpired, and, with `bound` (auth on: the verified caller), when it was
/// issued to a caller (every handle of an answer to a verified caller is), issued to that one.
/// (A handle bound to no caller came from a route the token does not guard, which anyone may
/// call.) Returns the reason (never the handle) when it is not.
fn verify_handle(
    active: &Active,
    handle: &str,
    bound: Option<CallerKey>,
) -> Result<Claims, &'static str> {
    if handle.len() > tools::MAX_HANDLE_LEN {
        return Err("the handle is too long");
    }
    let claims =
        capability::verify(&active.key, handle, SystemTime::now()).map_err(|e| match e {
            capability::VerifyError::Expired => "the handle has expired",
            capability::VerifyError::KeyMismatch | capability::VerifyError::BadSignature => {
                "the handle was not signed with this product's key"
            }
            _ => "the handle is malformed",
        })?;
    if let Some(caller) = bound {
        if capability::is_bound(&claims)
            && !capability::issued_to(&active.key, &claims, &caller.to_bytes())
        {
            return Err("the handle was issued to another caller");
        }
    }
    Ok(claims)
}

/// A 2xx consent answer is Epode's consent state: an object whose `state` is one of three.
fn is_consent_answer(body: &Value) -> bool {
    matches!(
        body.get("state").and_then(Value::as_str),
        Some("approved" | "declined" | "unknown")
    )
}

/// A 2xx report answer is Epode's receipt: an object with `accepted: true`.
fn is_report_receipt(body: &Value) -> bool {
    body.get("accepted").and_then(Value::as_bool) == Some(true)
}
