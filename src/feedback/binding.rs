//! The binding at run time: the pure pieces of this module put together with the Epode client,
//! the consent cache, the tool catalog and the telemetry queue. The proxy asks it for a hook
//! per `tools/list` and `tools/call` response, and hands it the two feedback tools' calls.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use http::HeaderMap;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::capability::{self, ProductKey};
use super::catalog::ToolCatalog;
use super::consent::{ConsentCache, Decided};
use super::envelope::{self, CachedConsent, Case, Envelope};
use super::identity::{self, IdentityRefs};
use super::tools::{self, EpodeFailure, FeedbackTools};
use super::{FeedbackMode, CONSENT_TOOL, REPORT_TOOL};
use crate::config::FeedbackConfig;
use crate::epode::telemetry::{self, McpCompletion, Outcome, QueueSettings, Telemetry};
use crate::epode::EpodeClient;
use crate::mcp::rewrite::{self, open, raw, RawMap, ResultHook};

pub const DECISIONS_PATH: &str = "/api/v2/consent/decisions";
pub const REPORTS_PATH: &str = "/api/v2/reports";
/// Deadline of the two feedback tools' calls to Epode.
const TOOL_TIMEOUT: Duration = Duration::from_secs(10);

/// The parts that exist only when feedback is on.
struct Active {
    /// The two tool definitions, serialised once.
    definitions: Vec<Box<RawValue>>,
    key: ProductKey,
    client: Arc<EpodeClient>,
    consent: Arc<ConsentCache>,
    telemetry: Arc<Telemetry>,
    tools: FeedbackTools,
}

pub struct FeedbackBinding {
    pub config: FeedbackConfig,
    active: Option<Active>,
    pub catalog: ToolCatalog,
    warned_shadowing: AtomicBool,
}

impl FeedbackBinding {
    /// Builds the binding; with feedback on, starts the telemetry task on the current runtime.
    pub fn new(config: FeedbackConfig) -> Result<Arc<Self>, String> {
        let active = match (&config.key, config.mode.is_enabled()) {
            (Some(key), true) => {
                let client = Arc::new(EpodeClient::new(config.api_url.clone(), key.clone())?);
                let settings = QueueSettings {
                    capacity: config.telemetry_queue,
                    ..QueueSettings::default()
                };
                let tools = FeedbackTools::new().map_err(|e| e.to_string())?;
                Some(Active {
                    definitions: tools.definitions().iter().map(raw).collect(),
                    key: key.clone(),
                    consent: ConsentCache::new(client.clone(), config.consent_timeout),
                    telemetry: Telemetry::start(client.clone(), settings),
                    client,
                    tools,
                })
            }
            _ => None,
        };
        Ok(Arc::new(FeedbackBinding {
            config,
            active,
            catalog: ToolCatalog::default(),
            warned_shadowing: AtomicBool::new(false),
        }))
    }

    pub fn enabled(&self) -> bool {
        self.active.is_some()
    }

    pub fn mode(&self) -> FeedbackMode {
        self.config.mode
    }

    pub fn telemetry(&self) -> Option<&Arc<Telemetry>> {
        self.active.as_ref().map(|a| &a.telemetry)
    }

    /// The server instructions with the feedback rule near the start (none when off).
    pub fn instructions(&self, upstream: Option<&str>) -> Option<String> {
        if !self.enabled() {
            return upstream.map(str::to_owned);
        }
        envelope::merge_instructions(self.config.mode, upstream)
    }

    /// Whether a tool call is one of the two feedback tools the sidecar answers itself.
    pub fn is_local_tool(&self, name: &str) -> bool {
        self.enabled() && tools::is_feedback_tool(name)
    }

    /// Whether the sidecar should list the upstream's tools before this call: the tool is one
    /// feedback would observe, but the catalog has not seen the upstream list it.
    pub fn needs_listing(&self, tool: &str) -> bool {
        self.enabled()
            && self.config.includes(tool)
            && self.catalog.listed(tool).is_none()
            && self.catalog.claim_fetch()
    }

    /// Identity references from the headers of a trusted gateway, as configured.
    pub fn header_refs(&self, headers: &HeaderMap) -> IdentityRefs {
        let mut refs = IdentityRefs::default();
        for (kind, name) in &self.config.identity_headers {
            if let Some(v) = headers.get(name).and_then(|v| v.to_str().ok()) {
                refs.set(*kind, v);
            }
        }
        refs
    }

    pub fn list_hook(self: &Arc<Self>) -> Box<dyn ResultHook> {
        Box::new(ListHook {
            binding: self.clone(),
        })
    }

    pub fn call_hook(
        self: &Arc<Self>,
        tool: &str,
        header_refs: IdentityRefs,
    ) -> Box<dyn ResultHook> {
        Box::new(CallHook {
            binding: self.clone(),
            tool: tool.to_owned(),
            listed: self.catalog.listed(tool),
            header_refs,
            started: Instant::now(),
            done: false,
        })
    }

    /// Answers a call of one of the two feedback tools: validated locally (arguments, then the
    /// handle's signature and expiry with the product key), forwarded to Epode with only the
    /// fields Epode takes, and answered with the reference binding's result.
    pub async fn call_local(&self, name: &str, arguments: &Value) -> Value {
        let Some(active) = &self.active else {
            return json!({"content": [], "isError": true});
        };
        if name == CONSENT_TOOL {
            let call = match active.tools.validate_consent_args(arguments) {
                Ok(c) => c,
                Err(invalid) => return invalid.to_result(),
            };
            if let Err(why) = verify_handle(active, call.handle.as_str()) {
                tracing::info!(
                    reason = why,
                    "consent decision refused locally: bad feedback handle"
                );
                return tools::consent_failure(EpodeFailure::InvalidHandle);
            }
            let sent = active
                .client
                .post_with_handle(
                    DECISIONS_PATH,
                    call.handle.as_str(),
                    &call.body,
                    TOOL_TIMEOUT,
                )
                .await;
            match sent {
                Ok(a) if (200..300).contains(&a.status) => {
                    let Some(body) = a.json().filter(is_consent_answer) else {
                        tracing::warn!(
                            status = a.status,
                            "Epode's consent answer is not a consent state"
                        );
                        return tools::consent_failure(EpodeFailure::Unavailable);
                    };
                    self.remember_decision(active, call.handle.as_str(), &body);
                    tracing::info!(
                        decision = call.decision.as_str(),
                        "feedback consent recorded"
                    );
                    tools::consent_success(call.decision, body)
                }
                Ok(a) => {
                    tracing::warn!(status = a.status, "Epode refused the consent decision");
                    tools::consent_failure(EpodeFailure::Status(a.status))
                }
                Err(e) => {
                    tracing::warn!(error = %e, "consent decision not delivered");
                    tools::consent_failure(EpodeFailure::Unavailable)
                }
            }
        } else if name == REPORT_TOOL {
            let call = match active.tools.validate_report_args(arguments) {
                Ok(c) => c,
                Err(invalid) => return invalid.to_result(),
            };
            if let Err(why) = verify_handle(active, call.handle.as_str()) {
                tracing::info!(
                    reason = why,
                    "feedback report refused locally: bad feedback handle"
                );
                return tools::report_failure(EpodeFailure::InvalidHandle);
            }
            let sent = active
                .client
                .post_with_handle(REPORTS_PATH, call.handle.as_str(), &call.body, TOOL_TIMEOUT)
                .await;
            match sent {
                Ok(a) if (200..300).contains(&a.status) => {
                    let Some(body) = a.json().filter(is_report_receipt) else {
                        tracing::warn!(status = a.status, "Epode's report answer is not a receipt");
                        return tools::report_failure(EpodeFailure::Unavailable);
                    };
                    tracing::info!("feedback report accepted");
                    tools::report_success(body)
                }
                Ok(a) => {
                    tracing::warn!(status = a.status, "Epode refused the feedback report");
                    tools::report_failure(EpodeFailure::Status(a.status))
                }
                Err(e) => {
                    tracing::warn!(error = %e, "feedback report not delivered");
                    tools::report_failure(EpodeFailure::Unavailable)
                }
            }
        } else {
            json!({"content": [], "isError": true})
        }
    }

    /// After an Ask-once decision, the cache learns it at once (the next call must not ask
    /// again), then checks with Epode in the background. Compare-and-set on the revision:
    /// a decision made with `r = 0` creates revision 1, one made with `r > 0` makes `r + 1`.
    fn remember_decision(&self, active: &Active, handle: &str, body: &Value) {
        let Ok(claims) = capability::verify(&active.key, handle, SystemTime::now()) else {
            return;
        };
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
}

/// Checks a handle an agent sent back before it goes anywhere: bounded, signed by this
/// product's key, unexpired. Returns the reason (never the handle) when it is not.
fn verify_handle(active: &Active, handle: &str) -> Result<(), &'static str> {
    if handle.len() > tools::MAX_HANDLE_LEN {
        return Err("the handle is too long");
    }
    capability::verify(&active.key, handle, SystemTime::now())
        .map(|_| ())
        .map_err(|e| match e {
            capability::VerifyError::Expired => "the handle has expired",
            capability::VerifyError::KeyMismatch | capability::VerifyError::BadSignature => {
                "the handle was not signed with this product's key"
            }
            _ => "the handle is malformed",
        })
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

/// Reads the `tools/list` answers that pass through: learns each tool's `outputSchema`, hides
/// upstream tools that shadow the feedback tools, and appends the feedback tools to the last
/// page.
struct ListHook {
    binding: Arc<FeedbackBinding>,
}

impl ResultHook for ListHook {
    fn result(&mut self, result: &mut RawMap) -> bool {
        let Some(list) = result
            .get("tools")
            .and_then(|t| serde_json::from_str::<Vec<Box<RawValue>>>(t.get()).ok())
        else {
            return false;
        };
        let mut kept = Vec::with_capacity(list.len() + 2);
        let mut learned = Vec::with_capacity(list.len());
        let mut changed = false;
        for tool in list {
            let Some(t) = open(&tool) else {
                kept.push(tool);
                continue;
            };
            let name = t
                .get("name")
                .and_then(|n| rewrite::as_str(n))
                .unwrap_or_default();
            if tools::is_feedback_tool(&name) {
                if !self.binding.warned_shadowing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(tool = %name, "the upstream has a tool named like an Epode feedback tool; it is hidden, and the sidecar answers that name itself");
                }
                changed = true;
                continue;
            }
            learned.push((name, t.contains_key("outputSchema")));
            kept.push(tool);
        }
        self.binding.catalog.learn(learned);
        let last_page = result
            .get("nextCursor")
            .is_none_or(|c| c.get().trim() == "null");
        if last_page {
            if let Some(active) = &self.binding.active {
                kept.extend(active.definitions.iter().cloned());
                changed = true;
            }
        }
        if changed {
            result.insert("tools".into(), raw(&kept));
        }
        changed
    }

    fn notification(&mut self, method: &str) {
        if method == "notifications/tools/list_changed" {
            self.binding.catalog.invalidate();
        }
    }
}

/// One product `tools/call`: removes the upstream's private identity `_meta`, decorates the
/// result with the feedback action its mode allows, and records its telemetry event.
struct CallHook {
    binding: Arc<FeedbackBinding>,
    tool: String,
    /// `Some(declares outputSchema)` when the upstream lists the tool; an unlisted name is
    /// not a product operation (no decoration, no telemetry).
    listed: Option<bool>,
    header_refs: IdentityRefs,
    started: Instant,
    done: bool,
}

/// Removes `_meta["ai.epode/identity"]` (it must never reach the client) and returns it.
fn take_identity(result: &mut RawMap) -> Option<Value> {
    let mut meta = result.get("_meta").and_then(|m| open(m))?;
    let identity = meta.shift_remove(identity::META_KEY)?;
    if meta.is_empty() {
        result.shift_remove("_meta");
    } else {
        result.insert("_meta".into(), raw(&meta));
    }
    Some(serde_json::from_str(identity.get()).unwrap_or(Value::Null))
}

impl CallHook {
    fn observed(&self) -> bool {
        self.binding.enabled()
            && self.listed.is_some()
            && self.binding.config.includes(&self.tool)
            && telemetry::valid_operation(&self.tool)
    }

    /// Enqueues the call's event. `refs` have had the mode's customerRef rule applied.
    fn record(
        &self,
        active: &Active,
        interaction_id: String,
        outcome: Outcome,
        refs: &IdentityRefs,
        hint: Option<String>,
    ) {
        active.telemetry.record(&McpCompletion {
            interaction_id,
            operation: self.tool.clone(),
            outcome: Some(outcome),
            duration: Some(self.started.elapsed()),
            account_ref: refs.account_ref.clone(),
            user_ref: refs.user_ref.clone(),
            anonymous_ref: refs.anonymous_ref.clone(),
            customer_ref: refs.customer_ref.clone(),
            session_ref: refs.session_ref.clone(),
            runtime_hint: hint,
        });
    }
}

impl ResultHook for CallHook {
    fn result(&mut self, result: &mut RawMap) -> bool {
        let identity = take_identity(result);
        let mut changed = identity.is_some();
        let input_required = result
            .get("resultType")
            .and_then(|v| rewrite::as_str(v))
            .is_some_and(|t| t == "input_required");
        if input_required || self.done || !self.observed() {
            return changed;
        }
        self.done = true;
        let Some(active) = &self.binding.active else {
            return changed;
        };
        let identity = identity.unwrap_or(Value::Null);
        let mode = self.binding.config.mode;
        // customerRef leaves the sidecar only in ask_once, and only without a conflict: the
        // one rule for the consent subject and for telemetry.
        let mut refs = IdentityRefs::from_meta(&identity).or(self.header_refs.clone());
        refs.apply_customer_rule(mode);
        let hint = identity
            .get("runtimeHint")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let is_error = result
            .get("isError")
            .is_some_and(|v| v.get().trim() == "true");
        let outcome = if is_error {
            Outcome::Error
        } else {
            Outcome::Success
        };

        let interaction_id = if self.binding.config.decorates(&self.tool) {
            // The consent subject: Ask once with a stable customerRef only.
            let subject = (mode == FeedbackMode::AskOnce)
                .then(|| refs.customer_ref.as_deref().map(|c| active.key.subject(c)))
                .flatten();
            let (cached, revision) = match &subject {
                Some(s) => active.consent.get(s),
                None => (CachedConsent::NoSubject, 0),
            };
            let minted = capability::mint(
                &active.key,
                SystemTime::now(),
                subject.clone().map(|s| (s, revision)),
            );
            if let Some(case) = Case::for_product_result(mode, cached) {
                let env = Envelope::new(case, minted.handle.clone(), minted.claims.exp);
                let has_schema = self.listed.unwrap_or(true);
                changed |= tools::decorate_raw(
                    result,
                    &env.agent_feedback(),
                    &env.restatement(),
                    has_schema,
                );
            }
            if let Some(s) = &subject {
                active.consent.warm(s, false);
            }
            minted.claims.i
        } else {
            uuid::Uuid::new_v4().hyphenated().to_string()
        };
        self.record(active, interaction_id, outcome, &refs, hint);
        changed
    }

    fn failed(&mut self) {
        if self.done || !self.observed() {
            return;
        }
        self.done = true;
        if let Some(active) = &self.binding.active {
            let id = uuid::Uuid::new_v4().hyphenated().to_string();
            let mut refs = self.header_refs.clone();
            refs.apply_customer_rule(self.binding.config.mode);
            self.record(active, id, Outcome::Error, &refs, None);
        }
    }
}
