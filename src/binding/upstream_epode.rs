//! Epode in the upstream itself: a server that already carries one of Epode's SDKs (the
//! Python, Rust and Go bindings record their own telemetry; the Node binding also lists
//! Epode's tools and decorates its results). Each SDK records its call under an interaction
//! id of its own making and takes none from outside, so the sidecar's event and the
//! upstream's cannot be one interaction: where the upstream carries Epode, the sidecar steps
//! back from the binding (no event, no `_agentFeedback`, no feedback tools or rule of its
//! own; the upstream's pass untouched), so that every call is counted once and every handle
//! an agent sees is one the upstream's Epode issued.
//!
//! What is looked for (`EPODE_SIDECAR_UPSTREAM_EPODE=auto`): `ai.epode/agent-feedback` in
//! the capabilities of its `server/discover` or `initialize` answer; one of Epode's tool names
//! in its `tools/list`; `_agentFeedback` already in a product result. Whatever the setting, a
//! result that already carries `_agentFeedback` is never decorated again nor counted.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use serde_json::Value;

use crate::config::UpstreamEpode;
use crate::mcp::raw::RawMap;
use crate::metrics::{CarriesLabels, Metrics};

/// The extension id Epode's SDKs advertise the binding under (its Python SDK's
/// `MCPInstrumentation.identifier`).
pub(crate) const EPODE_EXTENSION: &str = "ai.epode/agent-feedback";

/// The tools Epode's SDKs register (the Node binding's control tools).
pub(super) const EPODE_TOOLS: [&str; 4] = [
    "record_product_feedback_consent",
    "report_product_feedback",
    "share_customer_context",
    "record_customer_context_consent",
];

/// What of Epode the upstream carries, in order: each is more than the one before.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Carries {
    Nothing = 0,
    /// Its own telemetry (its capabilities advertise the extension).
    Telemetry = 1,
    /// The binding (Epode's tools in its list, `_agentFeedback` in its results).
    Binding = 2,
}

impl Carries {
    const ALL: [Carries; 3] = [Carries::Nothing, Carries::Telemetry, Carries::Binding];

    fn label(self) -> &'static str {
        match self {
            Carries::Nothing => "nothing",
            Carries::Telemetry => "telemetry",
            Carries::Binding => "binding",
        }
    }
}

/// What the sidecar has seen of Epode in the upstream (the process's one upstream).
pub(super) struct Carried {
    setting: UpstreamEpode,
    seen: AtomicU8,
    metrics: Arc<Metrics>,
}

impl Carried {
    pub(super) fn new(setting: UpstreamEpode, metrics: Arc<Metrics>) -> Self {
        let carried = Carried {
            setting,
            seen: AtomicU8::new(Carries::Nothing as u8),
            metrics,
        };
        carried.show(Carries::Nothing);
        carried
    }

    /// Whether the sidecar steps back from the binding: the upstream carries Epode.
    pub(super) fn stepped_back(&self) -> bool {
        self.seen.load(Ordering::Relaxed) != Carries::Nothing as u8
    }

    /// Whether the sidecar looks for Epode in the upstream.
    pub(super) fn looks(&self) -> bool {
        self.setting == UpstreamEpode::Auto
    }

    /// The upstream was seen to carry `what` (`why` says where): said once, in the log and
    /// the gauge, the first time it is more than was seen before.
    pub(super) fn heard(&self, what: Carries, why: &'static str) {
        if !self.looks() {
            return;
        }
        let before = self.seen.fetch_max(what as u8, Ordering::AcqRel);
        if before < what as u8 {
            tracing::warn!(
                carries = what.label(),
                seen = why,
                "the upstream carries Epode itself: the sidecar steps back from the binding for it (no telemetry event, no _agentFeedback, no feedback tools or instructions of its own; the upstream's pass untouched), so no call is counted twice; EPODE_SIDECAR_UPSTREAM_EPODE=none binds anyway"
            );
            self.show(what);
        }
    }

    fn show(&self, now: Carries) {
        for c in Carries::ALL {
            self.metrics
                .upstream_epode
                .get_or_create(&CarriesLabels { carries: c.label() })
                .set(i64::from(c == now));
        }
    }
}

/// Whether discovery capabilities `caps` advertise Epode's binding.
pub(super) fn advertises(caps: &Value) -> bool {
    caps.get("extensions")
        .and_then(|e| e.get(EPODE_EXTENSION))
        .is_some()
}

/// Whether a tool result already carries `_agentFeedback`: in `structuredContent`, or as
/// the JSON text block Epode's Node binding writes (`{"_agentFeedback":…}`).
pub(super) fn already_decorated(result: &RawMap) -> bool {
    let structured = result
        .get("structuredContent")
        .and_then(|s| serde_json::from_str::<RawMap>(s.get()).ok())
        .is_some_and(|s| s.contains_key("_agentFeedback"));
    structured
        || result
            .get("content")
            .is_some_and(|c| c.get().contains(r#""{\"_agentFeedback\":"#))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(json: &str) -> RawMap {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn a_decorated_result_is_told_from_one_that_mentions_the_name() {
        assert!(already_decorated(&map(
            r#"{"content":[],"structuredContent":{"x":1,"_agentFeedback":{"v":1}}}"#
        )));
        assert!(already_decorated(&map(
            r#"{"content":[{"type":"text","text":"{\"_agentFeedback\":{\"v\":1}}"}]}"#
        )));
        // Text that only names it, or a nested key, is the product's own.
        assert!(!already_decorated(&map(
            r#"{"content":[{"type":"text","text":"what is _agentFeedback?"}],"structuredContent":{"a":{"_agentFeedback":1}}}"#
        )));
    }

    #[test]
    fn what_is_seen_only_grows_and_none_sees_nothing() {
        let metrics = Arc::new(Metrics::new(|_| {}));
        let c = Carried::new(UpstreamEpode::Auto, metrics.clone());
        assert!(!c.stepped_back());
        c.heard(Carries::Binding, "test");
        c.heard(Carries::Telemetry, "test");
        assert!(c.stepped_back());
        assert_eq!(c.seen.load(Ordering::Relaxed), Carries::Binding as u8);
        let none = Carried::new(UpstreamEpode::None, metrics);
        none.heard(Carries::Binding, "test");
        assert!(!none.stepped_back());
        assert!(advertises(
            &serde_json::json!({"extensions": {EPODE_EXTENSION: {}}})
        ));
        assert!(!advertises(&serde_json::json!({"extensions": {}})));
    }
}
