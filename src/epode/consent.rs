//! The Ask-once consent cache: a process-local, read-through view of what Epode remembers per
//! consent subject. It is only ever read on the response path; lookups happen in the
//! background (750 ms deadline by default, at most 8 at once), and only decided states are
//! kept, for 5 minutes.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::client::EpodeClient;
use crate::feedback::envelope::CachedConsent;
const TTL: Duration = Duration::from_secs(300);
const MAX_LOOKUPS: usize = 8;
const MAX_ENTRIES: usize = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Decided {
    pub(crate) approved: bool,
    pub(crate) revision: u64,
}

struct Entry {
    decided: Decided,
    at: Instant,
}

pub(crate) struct ConsentCache {
    client: Arc<EpodeClient>,
    timeout: Duration,
    entries: Mutex<HashMap<String, Entry>>,
    in_flight: Mutex<HashSet<String>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ConsentCache {
    pub(crate) fn new(client: Arc<EpodeClient>, timeout: Duration) -> Arc<Self> {
        Arc::new(ConsentCache {
            client,
            timeout,
            entries: Mutex::new(HashMap::new()),
            in_flight: Mutex::new(HashSet::new()),
        })
    }

    /// What the cache knows of a subject, and the revision a new handle should carry.
    pub(crate) fn get(&self, subject: &str) -> (CachedConsent, u64) {
        match lock(&self.entries).get(subject) {
            Some(e) if e.at.elapsed() < TTL => (
                if e.decided.approved {
                    CachedConsent::Approved
                } else {
                    CachedConsent::Declined
                },
                e.decided.revision,
            ),
            _ => (CachedConsent::Unknown, 0),
        }
    }

    /// Records a decision the consent tool just made.
    pub(crate) fn put(&self, subject: &str, decided: Decided) {
        let mut entries = lock(&self.entries);
        if entries.len() >= MAX_ENTRIES {
            entries.retain(|_, e| e.at.elapsed() < TTL);
        }
        if entries.len() < MAX_ENTRIES {
            entries.insert(
                subject.to_owned(),
                Entry {
                    decided,
                    at: Instant::now(),
                },
            );
        }
    }

    /// Starts a background lookup unless the subject is fresh, already being looked up, or
    /// too many lookups are running. Never awaited by a product response.
    pub(crate) fn warm(self: &Arc<Self>, subject: &str, force: bool) {
        if !force
            && lock(&self.entries)
                .get(subject)
                .is_some_and(|e| e.at.elapsed() < TTL)
        {
            return;
        }
        {
            let mut in_flight = lock(&self.in_flight);
            if in_flight.len() >= MAX_LOOKUPS || !in_flight.insert(subject.to_owned()) {
                return;
            }
        }
        let me = self.clone();
        let subject = subject.to_owned();
        tokio::spawn(async move {
            me.lookup(&subject).await;
            lock(&me.in_flight).remove(&subject);
        });
    }

    async fn lookup(&self, subject: &str) {
        let started = Instant::now();
        let answer = match self.client.consent_state(subject, self.timeout).await {
            Ok(a) if a.status == 200 => a,
            Ok(a) => {
                tracing::debug!(status = a.status, "consent state lookup refused");
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e, "consent state lookup failed");
                return;
            }
        };
        let Some(v) = answer.json() else { return };
        self.settle(subject, started, &v);
    }

    /// Keeps what a lookup that `started` then learned, unless a decision was recorded since
    /// (a slow lookup begun before the user answered must not forget the answer).
    fn settle(&self, subject: &str, started: Instant, answer: &Value) {
        let revision = answer.get("revision").and_then(Value::as_u64);
        let decided = match (answer.get("state").and_then(Value::as_str), revision) {
            (Some("approved"), Some(r)) if r > 0 => Some(Decided {
                approved: true,
                revision: r,
            }),
            (Some("declined"), Some(r)) if r > 0 => Some(Decided {
                approved: false,
                revision: r,
            }),
            // "unknown" (revision 0) is not kept: the next call looks again.
            _ => None,
        };
        let mut entries = lock(&self.entries);
        if entries.get(subject).is_some_and(|e| e.at > started) {
            return;
        }
        match decided {
            Some(decided) => {
                drop(entries);
                self.put(subject, decided);
            }
            None => {
                entries.remove(subject);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cache() -> Arc<ConsentCache> {
        let base = url::Url::parse("http://127.0.0.1:9").unwrap();
        let key = crate::feedback::capability::ProductKey::ephemeral();
        let client = EpodeClient::new(base, key).unwrap();
        ConsentCache::new(Arc::new(client), Duration::from_millis(10))
    }

    #[test]
    fn a_lookup_begun_before_a_decision_never_forgets_it() {
        let c = cache();
        let started = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        let approved = Decided {
            approved: true,
            revision: 1,
        };
        c.put("s", approved);
        c.settle("s", started, &json!({"state": "unknown", "revision": 0}));
        assert_eq!(c.get("s"), (CachedConsent::Approved, 1));
        c.settle("s", started, &json!({"state": "declined", "revision": 7}));
        assert_eq!(c.get("s"), (CachedConsent::Approved, 1));
    }

    #[test]
    fn a_lookup_begun_after_a_decision_is_kept() {
        let c = cache();
        c.put(
            "s",
            Decided {
                approved: true,
                revision: 1,
            },
        );
        std::thread::sleep(Duration::from_millis(2));
        c.settle(
            "s",
            Instant::now(),
            &json!({"state": "declined", "revision": 2}),
        );
        assert_eq!(c.get("s"), (CachedConsent::Declined, 2));
        c.settle(
            "s",
            Instant::now(),
            &json!({"state": "unknown", "revision": 0}),
        );
        assert_eq!(c.get("s"), (CachedConsent::Unknown, 0));
    }
}
