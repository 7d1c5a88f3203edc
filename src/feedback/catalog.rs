//! What the sidecar knows of the upstream's tools: for each name, whether it declares an
//! `outputSchema` (which decides where `_agentFeedback` goes). Calls are stateless, so this is
//! learned from every `tools/list` answer that passes through, and refreshed on a TTL and when
//! the upstream says its list changed.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const TTL: Duration = Duration::from_secs(300);
const MAX_TOOLS: usize = 10_000;

#[derive(Default)]
pub struct ToolCatalog {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    tools: HashMap<String, bool>,
    at: Option<Instant>,
    /// When the sidecar last listed the tools itself: a tool missing from the list must not
    /// make every call list them again.
    fetched_at: Option<Instant>,
}

/// How often the sidecar may list the tools itself for a tool it does not know.
const REFETCH_AFTER: Duration = Duration::from_secs(30);

impl ToolCatalog {
    /// Whether `name` declares an `outputSchema`; `None` when the catalog does not know it
    /// (or is stale).
    pub fn output_schema(&self, name: &str) -> Option<bool> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.at.is_none_or(|at| at.elapsed() >= TTL) {
            return None;
        }
        inner.tools.get(name).copied()
    }

    /// Learns one page of a `tools/list` answer. The first page starts a new generation.
    pub fn learn(&self, first_page: bool, tools: impl IntoIterator<Item = (String, bool)>) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if first_page {
            inner.tools.clear();
        }
        for (name, has_schema) in tools {
            if inner.tools.len() < MAX_TOOLS {
                inner.tools.insert(name, has_schema);
            }
        }
        inner.at = Some(Instant::now());
    }

    /// Whether the sidecar should list the tools itself now (and, if so, notes that it does).
    pub fn claim_fetch(&self) -> bool {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
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
    pub fn invalidate(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.at = None;
        inner.fetched_at = None;
    }
}
