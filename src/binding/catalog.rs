//! What the sidecar knows of the upstream's tools: the names the upstream lists and, for each,
//! whether it declares an `outputSchema` (which decides where `_agentFeedback` goes). Only a
//! listed tool is a product operation: a call naming anything else gets neither decoration nor
//! telemetry, so a client cannot invent operations in the product's Epode data.
//!
//! Calls are stateless, so this is learned from every `tools/list` answer that passes through
//! (lists may vary by authorisation, so a name stays known for the TTL after any list showed
//! it), and from the sidecar's own listing when a call names a tool it does not know (at most
//! once per `REFETCH_AFTER`). A `notifications/tools/list_changed` forgets everything.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const TTL: Duration = Duration::from_secs(300);
const MAX_TOOLS: usize = 10_000;
/// How often the sidecar may list the tools itself for a tool it does not know.
const REFETCH_AFTER: Duration = Duration::from_secs(30);

#[derive(Default)]
pub(crate) struct ToolCatalog {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Name → (declares an outputSchema, when a list last showed it).
    tools: HashMap<String, (bool, Instant)>,
    /// When the sidecar last listed the tools itself: an unknown name must not make every
    /// call list them again.
    fetched_at: Option<Instant>,
}

impl ToolCatalog {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `Some(declares outputSchema)` when the upstream listed `name` within the TTL.
    pub(crate) fn listed(&self, name: &str) -> Option<bool> {
        self.lock()
            .tools
            .get(name)
            .filter(|(_, seen)| seen.elapsed() < TTL)
            .map(|(schema, _)| *schema)
    }

    /// Learns the tools of one `tools/list` page.
    pub(crate) fn learn(&self, tools: impl IntoIterator<Item = (String, bool)>) {
        let mut inner = self.lock();
        let now = Instant::now();
        for (name, has_schema) in tools {
            if inner.tools.len() >= MAX_TOOLS && !inner.tools.contains_key(&name) {
                inner.tools.retain(|_, (_, seen)| seen.elapsed() < TTL);
                if inner.tools.len() >= MAX_TOOLS {
                    continue;
                }
            }
            inner.tools.insert(name, (has_schema, now));
        }
    }

    /// Whether the sidecar should list the tools itself now (and, if so, notes that it does).
    pub(crate) fn claim_fetch(&self) -> bool {
        let mut inner = self.lock();
        if inner
            .fetched_at
            .is_some_and(|at| at.elapsed() < REFETCH_AFTER)
        {
            return false;
        }
        inner.fetched_at = Some(Instant::now());
        true
    }

    /// The upstream's tool list changed: everything is to be learned again.
    pub(crate) fn invalidate(&self) {
        let mut inner = self.lock();
        inner.tools.clear();
        inner.fetched_at = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_listed_names_are_known() {
        let c = ToolCatalog::default();
        assert_eq!(c.listed("add"), None);
        c.learn([("add".to_owned(), true), ("echo".to_owned(), false)]);
        c.learn([("other".to_owned(), false)]);
        assert_eq!(
            c.listed("add"),
            Some(true),
            "a later page or list keeps earlier names"
        );
        assert_eq!(c.listed("echo"), Some(false));
        assert_eq!(c.listed("invented"), None);
        assert!(c.claim_fetch());
        assert!(!c.claim_fetch(), "at most one listing per interval");
        c.invalidate();
        assert_eq!(c.listed("add"), None);
        assert!(c.claim_fetch());
    }
}
