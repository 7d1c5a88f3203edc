//! What the sidecar knows of the upstream's tools: the names the upstream lists and, for each,
//! whether it declares an `outputSchema` (which decides where `_agentFeedback` goes). Only a
//! listed tool is a product operation: a call naming anything else gets neither decoration nor
//! telemetry, so a client cannot invent operations in the product's Epode data.
//!
//! Calls are stateless, so this is learned from every `tools/list` answer that passes through
//! (lists may vary by authorisation, so a name stays known for the TTL after any list showed
//! it), and from the sidecar's own listing when a call names a tool it does not know (at most
//! once per `REFETCH_AFTER`). A `notifications/tools/list_changed` forgets everything.
//!
//! The catalog is bounded (`max_tools` names; a name longer than an operation may be is never
//! learned) and kept in the order the names were last listed: learning a name is O(1), a
//! name listed again moves to the fresh end, and past the bound the name listed longest ago is
//! forgotten. A page is learned a slice at a time, the lock held for one slice only and then
//! handed to any waiting request, so a lookup never waits for a whole 100,000-tool page.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lru::LruCache;
use parking_lot::{Mutex, MutexGuard};

use crate::epode::telemetry::valid_operation;

const TTL: Duration = Duration::from_secs(300);
/// How often the sidecar may list the tools itself for a tool it does not know.
const REFETCH_AFTER: Duration = Duration::from_secs(30);
/// Names learned per hold of the lock (well under a millisecond's work).
const SLICE: usize = 256;

pub(crate) struct ToolCatalog {
    listed: Mutex<ListedTools>,
    max: NonZeroUsize,
    /// Whether the operator was told that the upstream lists more tools than `max`.
    warned_full: AtomicBool,
}

/// What the upstream's tool lists showed, and when the sidecar last listed them itself.
struct ListedTools {
    /// Name → (declares an outputSchema, when a list last showed it), the least recently
    /// listed first.
    tools: LruCache<String, (bool, Instant)>,
    /// When the sidecar last listed the tools itself: an unknown name must not make every
    /// call list them again.
    fetched_at: Option<Instant>,
}

impl ToolCatalog {
    /// A catalog of at most `max` names.
    pub(crate) fn new(max: usize) -> Self {
        let max = NonZeroUsize::new(max).unwrap_or(NonZeroUsize::MIN);
        ToolCatalog {
            listed: Mutex::new(ListedTools {
                tools: LruCache::sparse(max),
                fetched_at: None,
            }),
            max,
            warned_full: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ListedTools> {
        self.listed.lock()
    }

    /// `Some(declares outputSchema)` when the upstream listed `name` within the TTL.
    pub(crate) fn listed(&self, name: &str) -> Option<bool> {
        self.lock()
            .tools
            .peek(name)
            .filter(|(_, seen)| seen.elapsed() < TTL)
            .map(|(schema, _)| *schema)
    }

    /// Learns the tools of one `tools/list` page, a slice at a time: after each, the lock is
    /// handed to a request waiting for it (a fair unlock), so none waits for more than a slice.
    pub(crate) fn learn(&self, tools: impl IntoIterator<Item = (String, bool)>) {
        let now = Instant::now();
        let mut tools = tools
            .into_iter()
            .filter(|(name, _)| valid_operation(name))
            .peekable();
        let mut evicted = false;
        while tools.peek().is_some() {
            let mut listed = self.lock();
            listed.expire();
            for (name, has_schema) in tools.by_ref().take(SLICE) {
                if let Some(entry) = listed.tools.get_mut(&name) {
                    *entry = (has_schema, now);
                } else {
                    evicted |= listed.tools.push(name, (has_schema, now)).is_some();
                }
            }
            MutexGuard::unlock_fair(listed);
        }
        if evicted && !self.warned_full.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                max_tools = self.max.get(),
                "the upstream lists more tools than the catalog keeps (EPODE_SIDECAR_MAX_TOOLS): the tools listed longest ago are not decorated nor observed until listed again"
            );
        }
    }

    /// Whether the sidecar should list the tools itself now (and, if so, notes that it does).
    pub(crate) fn claim_fetch(&self) -> bool {
        let mut listed = self.lock();
        if listed
            .fetched_at
            .is_some_and(|at| at.elapsed() < REFETCH_AFTER)
        {
            return false;
        }
        listed.fetched_at = Some(Instant::now());
        true
    }

    /// The upstream's tool list changed: everything is to be learned again. The old names are
    /// freed after the lock is released.
    pub(crate) fn invalidate(&self) {
        let old = {
            let mut listed = self.lock();
            listed.fetched_at = None;
            std::mem::replace(&mut listed.tools, LruCache::sparse(self.max))
        };
        drop(old);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().tools.len()
    }
}

impl ListedTools {
    /// Forgets names past the TTL from the stale end: O(1) per name forgotten.
    fn expire(&mut self) {
        while self
            .tools
            .peek_lru()
            .is_some_and(|(_, (_, seen))| seen.elapsed() >= TTL)
        {
            self.tools.pop_lru();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_listed_names_are_known() {
        let c = ToolCatalog::new(100);
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

    #[test]
    fn the_catalog_is_bounded_and_forgets_the_name_listed_longest_ago() {
        let c = ToolCatalog::new(3);
        c.learn(["a", "b", "c"].map(|n| (n.to_owned(), false)));
        // Listed again: `a` is fresh, `b` is now the oldest.
        c.learn([("a".to_owned(), true)]);
        c.learn([("d".to_owned(), false)]);
        assert_eq!(c.len(), 3);
        assert_eq!(c.listed("b"), None, "the name listed longest ago goes");
        assert_eq!(c.listed("a"), Some(true), "a name listed again stays");
        assert_eq!(c.listed("c"), Some(false));
        assert_eq!(c.listed("d"), Some(false));
        // A name longer than any operation is never learned.
        c.learn([("x".repeat(161), false)]);
        assert_eq!(c.listed(&"x".repeat(161)), None);
        assert_eq!(c.listed("c"), Some(false), "and evicts nothing");
    }

    /// 100,000 names, in one page and again: linear (the earlier catalog rescanned every name
    /// per new name past 10,000, minutes of work), bounded by `max`, and the lock is never
    /// held for a whole page: lookups from another thread go on while pages are learned.
    #[test]
    fn a_page_of_100_000_tools_is_learned_in_linear_time_without_holding_the_lock() {
        use std::sync::atomic::AtomicUsize;
        use std::sync::Arc;
        let c = Arc::new(ToolCatalog::new(100_000));
        let page: Vec<(String, bool)> = (0..100_000)
            .map(|i| (format!("tool_{i:06}"), i % 2 == 0))
            .collect();
        let (learning, stop) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let (lookups, any) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let prober = {
            let (c, learning, stop, lookups, any) = (
                c.clone(),
                learning.clone(),
                stop.clone(),
                lookups.clone(),
                any.clone(),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let during = learning.load(Ordering::Relaxed);
                    let _ = c.listed("tool_000001");
                    any.fetch_add(1, Ordering::Relaxed);
                    if during && learning.load(Ordering::Relaxed) {
                        lookups.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        };
        // The prober is looking things up before the first page starts.
        while any.load(Ordering::Relaxed) == 0 {
            std::thread::yield_now();
        }
        let t = Instant::now();
        learning.store(true, Ordering::Relaxed);
        c.learn(page.clone());
        let page_time = t.elapsed();
        assert_eq!(c.listed("tool_099999"), Some(false));
        assert_eq!(c.listed("tool_000000"), Some(true));
        c.learn(page.iter().map(|(n, s)| (format!("{n}_b"), *s)));
        learning.store(false, Ordering::Relaxed);
        stop.store(true, Ordering::Relaxed);
        prober.join().unwrap();
        assert_eq!(c.len(), 100_000, "bounded");
        assert_eq!(c.listed("tool_000000"), None, "the older page went");
        assert_eq!(c.listed("tool_099999_b"), Some(false));
        assert!(
            page_time < Duration::from_secs(10),
            "a 100,000-tool page took {page_time:?}"
        );
        // Two pages are 780 slices: a lookup between most of them. Holding the lock for a
        // whole page would let at most a few through.
        let lookups = lookups.load(Ordering::Relaxed);
        assert!(
            lookups >= 50,
            "only {lookups} lookups got through while two pages were learned"
        );
    }
}
