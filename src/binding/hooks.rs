//! The response hooks: what the binding does to a `tools/list` answer (learn the tools, hide
//! upstream tools that shadow the feedback tools, append the feedback tools to the last page)
//! and to a product `tools/call` answer (remove the private identity, decorate, record one
//! telemetry event).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use serde_json::value::RawValue;
use serde_json::Value;

use super::{Active, FeedbackBinding, Grant};
use crate::epode::telemetry::{self, McpCompletion, Outcome};
use crate::feedback::envelope::{Case, Envelope};
use crate::feedback::identity::{self, IdentityRefs};
use crate::feedback::{placement, tools};
use crate::mcp::end::{Ending, ResultHook};
use crate::mcp::raw::{as_str, is_object, is_true, open, raw, RawMap};
use crate::metrics::DecorationLabels;
use crate::observe::{Decorated, Note, Noted};

pub(super) struct ListHook {
    pub(super) binding: Arc<FeedbackBinding>,
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
            if tools::is_feedback_tool(&name) {
                if !self.binding.warned_shadowing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(tool = %name, "the upstream has a tool named like an Epode feedback tool; it is hidden, and the sidecar answers that name itself");
                }
                changed = true;
                continue;
            }
            learned.push((name, has_schema));
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
pub(super) struct CallHook {
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
    pub(super) fn new(
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
        }
    }

    /// The binding's active parts, when this call is a product operation it observes.
    fn observed(&self) -> Option<&Active> {
        let observed = self.listed.is_some()
            && self.binding.config.includes(&self.tool)
            && telemetry::valid_operation(&self.tool);
        self.binding.active.as_ref().filter(|_| observed)
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
        }
    }

    /// Mints the call's handle and places the action its mode and consent state allow;
    /// returns the interaction id and whether the result changed.
    fn decorate(
        &self,
        active: &Active,
        result: &mut RawMap,
        refs: &IdentityRefs,
        is_error: bool,
    ) -> (String, bool) {
        let mode = self.binding.config.mode;
        let Grant {
            subject,
            cached,
            minted,
        } = self
            .binding
            .grant(active, refs, "calls without a customerRef");
        let mut changed = false;
        if let Some(case) = Case::for_product_result(mode, cached) {
            self.binding
                .metrics
                .decorations
                .get_or_create(&DecorationLabels {
                    mode: mode.as_str(),
                    state: case.stage().as_str(),
                })
                .inc();
            if let Some(observer) = &self.binding.observer {
                observer.decorated(Decorated {
                    tool: &self.tool,
                    is_error,
                    state: case.stage().as_str(),
                    mode: mode.as_str(),
                    interaction_id: &minted.claims.i,
                });
            }
            let env = Envelope::new(case, minted.handle.clone(), minted.claims.exp);
            if let Some(decoration) = env.decoration() {
                changed = placement::decorate(result, &decoration, self.listed.unwrap_or(true));
            }
        }
        if let Some(s) = &subject {
            active.consent.warm(s, false);
        }
        (minted.claims.i, changed)
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
        let input_required = result
            .get("resultType")
            .and_then(|v| as_str(v))
            .is_some_and(|t| t == "input_required");
        let Some(active) = self.observed().filter(|_| !input_required) else {
            return changed;
        };
        let identity = identity.unwrap_or(Value::Null);
        // customerRef leaves the sidecar only in ask_once, and only without a conflict: the
        // one rule for the consent subject and for telemetry.
        // What the product says wins; a reference it names otherwise than the verified
        // token (or the trusted gateway) is counted.
        let product = IdentityRefs::from_meta(&identity);
        if product.disagrees(&self.header_refs) {
            self.binding.metrics.auth.identity_disagreements.inc();
        }
        let mut refs = product.or(self.header_refs.clone());
        refs.apply_customer_rule(self.binding.config.mode);
        let hint = identity
            .get("runtimeHint")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let outcome = if is_error {
            Outcome::Error
        } else {
            Outcome::Success
        };
        let interaction_id = if self.binding.config.decorates(&self.tool) {
            let (id, decorated) = self.decorate(active, result, &refs, is_error);
            changed |= decorated;
            id
        } else {
            uuid::Uuid::new_v4().hyphenated().to_string()
        };
        if let Some(note) = &self.note {
            note.set(Noted::InteractionId(interaction_id.clone()));
        }
        self.answered = Some(self.event(interaction_id, outcome, refs, hint));
        changed
    }

    /// Records the call's one telemetry event: the result's, or a failure's; nothing for a
    /// request never sent or whose client went away.
    fn end(&mut self, ending: Ending) {
        let event = match ending {
            Ending::Answered => self.answered.take(),
            ending if ending.failed() && self.observed().is_some() => {
                let id = uuid::Uuid::new_v4().hyphenated().to_string();
                let mut refs = self.header_refs.clone();
                refs.apply_customer_rule(self.binding.config.mode);
                Some(self.event(id, Outcome::Error, refs, None))
            }
            _ => None,
        };
        if let (Some(event), Some(active)) = (event, self.observed()) {
            active.telemetry.record(event);
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
