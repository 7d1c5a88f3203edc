//! The response hooks: what the binding does to a `tools/list` answer (learn the tools, hide
//! upstream tools that shadow the feedback tools, append the feedback tools to the last page),
//! to a product `tools/call` answer (remove the private identity, decorate, record one
//! telemetry event; a task it creates is followed instead, `tasks.rs`) and to a `tasks/get`
//! answer with a followed task's terminal status (the call's outcome, decorated and recorded
//! as the call's would be), and the binding's methods that make them. They reach the binding
//! only through its methods (`feedback_binding`).

use std::sync::Arc;
use std::time::Instant;

use http::HeaderMap;
use serde_json::value::RawValue;
use serde_json::Value;

use super::customer::{Ask, CustomerContext};
use super::feedback_binding::{FeedbackBinding, Grant};
use crate::caller::CallerKey;
use crate::epode::telemetry::{McpCompletion, Outcome};
use crate::feedback::envelope::Envelope;
use crate::feedback::identity::{self, IdentityRefs};
use crate::feedback::{customer, placement, tools};
use crate::mcp::end::{Amends, Ending, ResultHook};
use crate::mcp::raw::{as_str, is_object, is_true, open, raw, RawMap};
use crate::observe::{Note, Noted};

impl FeedbackBinding {
    /// The hook of a `tools/list` response: with feedback on, it learns the tools, hides
    /// those named like the feedback tools and appends them; with feedback off and `learn`
    /// (OpenTelemetry's histograms name listed tools only), it learns the tools and changes
    /// nothing; else there is none.
    pub(crate) fn list_hook(self: &Arc<Self>, learn: bool) -> Option<Box<dyn ResultHook>> {
        let customer = self.customer().is_some();
        (self.enabled() || learn || customer).then(|| {
            Box::new(ListHook {
                binding: self.clone(),
                feedback: self.enabled(),
                customer,
            }) as Box<dyn ResultHook>
        })
    }

    /// The hook of a product `tools/call` response: it always removes the upstream's private
    /// identity; with feedback on it decorates and records telemetry for listed tools.
    /// `verified` are the refs of the caller's verified token (the authorization front
    /// door's); a trusted gateway's headers fill what they lack. `amends` is given for a
    /// call customer context follows only (`FeedbackBinding::customer_follows`, checked once
    /// by the caller).
    pub(crate) fn call_hook(
        self: &Arc<Self>,
        tool: &str,
        caller: CallerKey,
        client: &HeaderMap,
        verified: Option<(&IdentityRefs, CallerKey)>,
        note: Option<Arc<Note>>,
        amends: Option<Amends>,
    ) -> Box<dyn ResultHook> {
        let trusted = self.trusted_refs(client, verified);
        let mut hook = CallHook::new(self.clone(), tool, self.listed(tool), trusted, note);
        hook.bound = verified.map(|(_, caller)| caller);
        hook.caller = Some(caller);
        hook.customer = amends.and_then(|a| Some((self.customer()?.clone(), a, caller)));
        Box::new(hook)
    }

    /// The hook of a `tasks/get` response (with feedback on): a terminal status of a task
    /// `caller` created in a product call is that call's outcome.
    pub(crate) fn task_hook(
        self: &Arc<Self>,
        caller: CallerKey,
        client: &HeaderMap,
        verified: Option<(&IdentityRefs, CallerKey)>,
        note: Option<Arc<Note>>,
    ) -> Option<Box<dyn ResultHook>> {
        self.enabled().then(|| {
            Box::new(TaskHook {
                binding: self.clone(),
                caller,
                header_refs: self.trusted_refs(client, verified),
                bound: verified.map(|(_, caller)| caller),
                note,
                outcome: None,
            }) as Box<dyn ResultHook>
        })
    }

    /// The refs a verified token gives, with a trusted gateway's headers filling the rest.
    fn trusted_refs(
        &self,
        client: &HeaderMap,
        verified: Option<(&IdentityRefs, CallerKey)>,
    ) -> IdentityRefs {
        match verified {
            Some((v, _)) => v.clone().or(self.header_refs(client)),
            None => self.header_refs(client),
        }
    }
}

struct ListHook {
    binding: Arc<FeedbackBinding>,
    /// Whether feedback is on: the feedback tools' names are then the sidecar's.
    feedback: bool,
    /// Whether customer context is on: its tools' names are then the sidecar's.
    customer: bool,
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
            let Some((name, has_schema)) = tool_head(&tool) else {
                kept.push(tool);
                continue;
            };
            // The upstream's own Epode tools: it carries Epode, and they pass as they are.
            if self.binding.upstreams_epode_tool(&name) {
                kept.push(tool);
                continue;
            }
            let ours = (self.feedback && tools::is_feedback_tool(&name))
                || (self.customer && customer::is_customer_tool(&name));
            if ours {
                self.binding.warn_shadowing(&name);
                changed = true;
                continue;
            }
            learned.push((name, has_schema));
            kept.push(tool);
        }
        self.binding.learn(learned);
        let last_page = result
            .get("nextCursor")
            .is_none_or(|c| c.get().trim() == "null");
        if last_page {
            changed |= self.binding.append_feedback_tools(&mut kept);
            changed |= self.binding.append_customer_tools(&mut kept);
        }
        if changed {
            result.insert("tools".into(), raw(&kept));
        }
        changed
    }

    fn notification(&mut self, method: &str) {
        if method == "notifications/tools/list_changed" {
            self.binding.forget_tools();
        }
    }
}

/// What the catalog needs of a tool definition: its name and whether it declares an
/// `outputSchema`, read without building a map of the definition (a list may hold 100,000).
#[derive(serde::Deserialize)]
struct ToolHead<'a> {
    #[serde(borrow, default)]
    name: Option<&'a str>,
    #[serde(rename = "outputSchema", default)]
    output_schema: Present,
}

/// Whether a member is there, whatever its value (`null` too).
#[derive(Default)]
struct Present(bool);

impl<'de> serde::Deserialize<'de> for Present {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(d).map(|_| Present(true))
    }
}

/// A tool definition's name (empty when it has none) and whether it declares an
/// `outputSchema`; `None` when it is not an object. A name with escapes, or a definition with
/// a member twice, is read the slower, general way.
fn tool_head(tool: &RawValue) -> Option<(String, bool)> {
    if !is_object(tool) {
        return None;
    }
    if let Ok(head) = serde_json::from_str::<ToolHead<'_>>(tool.get()) {
        return Some((
            head.name.unwrap_or_default().to_owned(),
            head.output_schema.0,
        ));
    }
    let t = open(tool)?;
    let name = t
        .get("name")
        .and_then(|n| as_str(n))
        .map(|n| n.into_owned())
        .unwrap_or_default();
    Some((name, t.contains_key("outputSchema")))
}

/// One product `tools/call`.
struct CallHook {
    binding: Arc<FeedbackBinding>,
    tool: String,
    /// `Some(declares outputSchema)` when the upstream lists the tool; an unlisted name is
    /// not a product operation (no decoration, no telemetry).
    listed: Option<bool>,
    header_refs: IdentityRefs,
    started: Instant,
    /// The request's note (interaction, `isError`), when someone observes.
    note: Option<Arc<Note>>,
    /// The result's telemetry event, recorded by the request's end step.
    answered: Option<McpCompletion>,
    /// The request's span (OpenTelemetry on, sampled), for its event's delivery to link to.
    link: Option<opentelemetry::trace::SpanContext>,
    /// The verified caller the handle is issued to (with auth on).
    bound: Option<CallerKey>,
    /// The caller, whose task a call's task is (`None`: the call's own outcome, a task's).
    caller: Option<CallerKey>,
    /// Customer context, when it follows this tool, where its amendment goes, and the caller
    /// its enrichment request is charged to.
    customer: Option<(Arc<CustomerContext>, Amends, CallerKey)>,
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
    fn new(
        binding: Arc<FeedbackBinding>,
        tool: &str,
        listed: Option<bool>,
        header_refs: IdentityRefs,
        note: Option<Arc<Note>>,
    ) -> Self {
        CallHook {
            binding,
            tool: tool.to_owned(),
            listed,
            header_refs,
            started: Instant::now(),
            note,
            answered: None,
            link: crate::otel::current_link(),
            bound: None,
            caller: None,
            customer: None,
        }
    }

    /// Whether this call is a product operation the binding observes.
    fn observed(&self) -> bool {
        self.listed.is_some() && self.binding.observes(&self.tool)
    }

    /// The call's event, for the request's end step to record. `refs` have had the mode's
    /// customerRef rule applied.
    fn event(
        &self,
        interaction_id: String,
        outcome: Outcome,
        refs: IdentityRefs,
        hint: Option<String>,
    ) -> McpCompletion {
        McpCompletion {
            interaction_id,
            operation: self.tool.clone(),
            outcome: Some(outcome),
            duration: Some(self.started.elapsed()),
            refs,
            runtime_hint: hint,
            link: self.link.clone(),
        }
    }

    /// Follows the task a product call's answer created (its outcome comes in `tasks/get`).
    fn follow(&self, result: &RawMap) {
        let (Some(caller), true) = (self.caller, self.observed()) else {
            return;
        };
        let Some(task_id) = result.get("taskId").and_then(|t| as_str(t)) else {
            return;
        };
        let ttl = result
            .get("ttlMs")
            .and_then(|t| t.get().parse::<u64>().ok());
        let followed = self.binding.follow_task(
            caller,
            &task_id,
            (&self.tool, self.listed),
            self.started,
            ttl,
        );
        if !followed {
            tracing::debug!("a product call's task is not followed (past the tasks bound): its outcome records nothing");
        }
    }

    /// Mints the call's handle and places the action its mode and consent state allow;
    /// returns the interaction id and whether the result changed (`None`: feedback is off).
    fn decorate(
        &self,
        result: &mut RawMap,
        refs: &IdentityRefs,
        is_error: bool,
    ) -> Option<(String, bool)> {
        let Grant {
            subject,
            case,
            minted,
        } = self
            .binding
            .grant(refs, "calls without a customerRef", self.bound)?;
        let mut changed = false;
        if let Some(case) = case {
            self.binding
                .note_decorated(&self.tool, is_error, case, &minted.claims.i);
            let env = Envelope::new(case, minted.handle.clone(), minted.claims.exp);
            if let Some(decoration) = env.decoration() {
                changed = placement::decorate(result, &decoration, self.listed.unwrap_or(true));
            }
        }
        if let Some(s) = &subject {
            self.binding.refresh_consent(s);
        }
        Some((minted.claims.i, changed))
    }
}

impl CallHook {
    /// Starts the call's enrichment request, under its telemetry event's interaction id and
    /// facts; the event is recorded only if Epode does not take the request (which confirms
    /// the interaction itself).
    fn ask_customer(
        &mut self,
        customer: &Arc<CustomerContext>,
        (amends, caller): (&Amends, CallerKey),
        event: McpCompletion,
        observed: bool,
    ) {
        let ask = Ask {
            interaction_id: event.interaction_id.clone(),
            operation: event.operation.clone(),
            refs: event.refs.clone(),
            runtime_hint: event.runtime_hint.clone(),
            duration: event.duration.unwrap_or_default(),
            has_output_schema: self.listed == Some(true),
            bound: self.bound,
            caller,
        };
        let binding = self.binding.clone();
        let unconfirmed =
            observed.then(|| Box::new(move || binding.record(event)) as Box<dyn FnOnce() + Send>);
        customer.ask(ask, amends, unconfirmed);
    }
}

impl ResultHook for CallHook {
    fn result(&mut self, result: &mut RawMap) -> bool {
        let identity = take_identity(result);
        let mut changed = identity.is_some();
        let is_error = result.get("isError").is_some_and(|v| is_true(v));
        if let Some(note) = &self.note {
            note.set(Noted::IsError(is_error));
        }
        // Only a complete result is the call's outcome: `input_required` asks first, a task
        // (the tasks extension) is followed to its own, any other kind passes as it is.
        let kind = result.get("resultType").and_then(|v| as_str(v));
        match kind.as_deref() {
            None | Some("complete") => {}
            Some("task") => {
                self.follow(result);
                return changed;
            }
            Some(_) => return changed,
        }
        // Decorated upstream (its own Epode): never decorated twice nor counted twice.
        let observed = self.observed() && !self.binding.decorated_upstream(result);
        // Customer context follows a successful result only.
        let customer = self.customer.take().filter(|_| !is_error);
        if !observed && customer.is_none() {
            return changed;
        }
        let identity = identity.unwrap_or(Value::Null);
        // customerRef leaves the sidecar only in ask_once, and only without a conflict: the
        // one rule for the consent subject and for telemetry.
        let refs = self
            .binding
            .shared_refs(IdentityRefs::from_meta(&identity), self.header_refs.clone());
        let hint = identity
            .get("runtimeHint")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let outcome = if is_error {
            Outcome::Error
        } else {
            Outcome::Success
        };
        let decorated = (observed && self.binding.decorates(&self.tool))
            .then(|| self.decorate(result, &refs, is_error))
            .flatten();
        let interaction_id = match decorated {
            Some((id, decorated)) => {
                changed |= decorated;
                id
            }
            None => uuid::Uuid::new_v4().hyphenated().to_string(),
        };
        if let Some(note) = &self.note {
            note.set(Noted::InteractionId(interaction_id.clone()));
        }
        let event = self.event(interaction_id, outcome, refs, hint);
        match customer {
            Some((customer, amends, caller)) => {
                self.ask_customer(&customer, (&amends, caller), event, observed)
            }
            None => self.answered = Some(event),
        }
        changed
    }

    /// Records the call's one telemetry event: the result's, or a failure's; nothing for a
    /// request never sent or whose client went away.
    fn end(&mut self, ending: Ending) {
        let event = match ending {
            Ending::Answered => self.answered.take(),
            ending if ending.failed() && self.observed() => {
                let id = uuid::Uuid::new_v4().hyphenated().to_string();
                let refs = self
                    .binding
                    .shared_refs(IdentityRefs::default(), self.header_refs.clone());
                Some(self.event(id, Outcome::Error, refs, None))
            }
            _ => None,
        };
        if let Some(event) = event.filter(|_| self.observed()) {
            self.binding.record(event);
        }
    }
}

/// A `tasks/get` answer: when it carries the terminal status of a task a product call of this
/// caller's created, that call's outcome.
struct TaskHook {
    binding: Arc<FeedbackBinding>,
    caller: CallerKey,
    header_refs: IdentityRefs,
    bound: Option<CallerKey>,
    note: Option<Arc<Note>>,
    /// The followed call's hook and whether its task failed, once the outcome is seen.
    outcome: Option<(CallHook, bool)>,
}

impl ResultHook for TaskHook {
    fn result(&mut self, result: &mut RawMap) -> bool {
        let status = result.get("status").and_then(|s| as_str(s));
        let failed = match status.as_deref() {
            Some("completed") => false,
            Some("failed") => true,
            // Cancelled: its client let the call go, which records nothing.
            Some("cancelled") => {
                if let Some(id) = result.get("taskId").and_then(|t| as_str(t)) {
                    drop(self.binding.take_task(self.caller, &id));
                }
                return false;
            }
            _ => return false,
        };
        let Some(task_id) = result.get("taskId").and_then(|t| as_str(t)) else {
            return false;
        };
        let Some(followed) = self.binding.take_task(self.caller, &task_id) else {
            return false;
        };
        let mut call = CallHook::new(
            self.binding.clone(),
            &followed.tool,
            followed.listed,
            std::mem::take(&mut self.header_refs),
            self.note.take(),
        );
        call.started = followed.started;
        call.bound = self.bound;
        let mut changed = false;
        if !failed {
            if let Some(mut inner) = result.get("result").and_then(|r| open(r)) {
                if call.result(&mut inner) {
                    result.insert("result".into(), crate::mcp::raw::raw_object(&inner));
                    changed = true;
                }
            }
        }
        self.outcome = Some((call, failed));
        changed
    }

    fn end(&mut self, ending: Ending) {
        if let Some((mut call, failed)) = self.outcome.take() {
            call.end(if failed { Ending::Failed } else { ending });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(json: &str) -> Option<(String, bool)> {
        tool_head(&RawValue::from_string(json.to_owned()).unwrap())
    }

    #[test]
    fn a_tool_head_reads_the_name_and_whether_an_output_schema_is_declared() {
        let h = |n: &str, s: bool| Some((n.to_owned(), s));
        assert_eq!(head(r#"{"name":"add","inputSchema":{}}"#), h("add", false));
        assert_eq!(
            head(r#"{"outputSchema":{"type":"object"},"name":"add"}"#),
            h("add", true)
        );
        assert_eq!(head(r#"{"name":"a","outputSchema":null}"#), h("a", true));
        assert_eq!(head(r#"{"name":"caf\u00e9"}"#), h("café", false), "escapes");
        assert_eq!(
            head(r#"{"name":"a","name":"b"}"#),
            h("b", false),
            "the last wins"
        );
        assert_eq!(head(r#"{"name":7}"#), h("", false));
        assert_eq!(head(r#"{"inputSchema":{}}"#), h("", false));
        assert_eq!(head(r#"["add"]"#), None);
    }
}
