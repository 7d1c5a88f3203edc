//! Tasks followed to their outcome (the 2026-07-28 tasks extension, `io.modelcontextprotocol/tasks`).
//! A product `tools/call` answered with `resultType: "task"` has not happened yet: its
//! creation passes untouched (no `_agentFeedback`, no telemetry event), and the task is
//! remembered here, for its caller, with the tool it runs and when it was called. The first
//! `tasks/get` answer this replica relays with the task's terminal status is the call's
//! outcome: a `completed` task's `result` is decorated as a tool result is and recorded by
//! its `isError`, a `failed` one is recorded as an error, a `cancelled` one records nothing
//! (its client let it go). A task is followed at most until its `ttlMs` from its creation (a
//! day at the most), in its caller's share of the ledger's `tasks` pool; one past a bound is
//! not followed, and its outcome records nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::caller::CallerKey;
use crate::ledger::{Charge, Ledger, Pool};

/// The longest a task is followed, whatever its `ttlMs` says (`null`: unlimited).
const LONGEST: Duration = Duration::from_secs(24 * 3600);

/// The longest task id followed (a longer one passes, unfollowed).
pub(crate) const MAX_TASK_ID: usize = 256;

/// A task's product call, waiting for its outcome.
pub(crate) struct Followed {
    pub(crate) tool: String,
    /// `Some(declares outputSchema)`: what the catalog knew of the tool at the call.
    pub(crate) listed: Option<bool>,
    /// When the call was made (its event's duration runs to the terminal answer).
    pub(crate) started: Instant,
    until: Instant,
    _place: Charge,
}

/// The tasks followed, by caller and task id; bounded by the ledger's `tasks` pool.
pub(crate) struct FollowedTasks {
    open: Mutex<HashMap<(CallerKey, String), Followed>>,
    ledger: Arc<Ledger>,
}

impl FollowedTasks {
    pub(crate) fn new(ledger: Arc<Ledger>) -> Self {
        FollowedTasks {
            open: Mutex::default(),
            ledger,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(CallerKey, String), Followed>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Follows `caller`'s task `task_id` of `tool` (called at `started`), for `ttl_ms` at
    /// most; whether it is followed (not past a bound, nor an id too long).
    pub(crate) fn follow(
        &self,
        caller: CallerKey,
        task_id: &str,
        (tool, listed): (&str, Option<bool>),
        started: Instant,
        ttl_ms: Option<u64>,
    ) -> bool {
        if task_id.is_empty() || task_id.len() > MAX_TASK_ID {
            return false;
        }
        let now = Instant::now();
        let mut open = self.lock();
        // Tasks past their time make room first (their outcome will not be seen).
        open.retain(|_, f| f.until > now);
        let Ok(place) = self.ledger.try_charge(Pool::Tasks, caller) else {
            return false;
        };
        let ttl = ttl_ms.map_or(LONGEST, Duration::from_millis).min(LONGEST);
        open.insert(
            (caller, task_id.to_owned()),
            Followed {
                tool: tool.to_owned(),
                listed,
                started,
                until: now + ttl,
                _place: place,
            },
        );
        true
    }

    /// The followed task `task_id` of `caller`, no longer followed (its outcome is seen).
    pub(crate) fn take(&self, caller: CallerKey, task_id: &str) -> Option<Followed> {
        if task_id.len() > MAX_TASK_ID {
            return None;
        }
        let mut open = self.lock();
        let followed = open.remove(&(caller, task_id.to_owned()))?;
        (followed.until > Instant::now()).then_some(followed)
    }

    /// Whether `caller`'s task `task_id` is followed (for the tests).
    #[cfg(test)]
    fn follows(&self, caller: CallerKey, task_id: &str) -> bool {
        self.lock().contains_key(&(caller, task_id.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> CallerKey {
        CallerKey::of_token("https://as", Some(&n.to_string()), None, &[0; 32])
    }

    #[test]
    fn a_task_is_its_callers_once_and_within_its_bounds() {
        let tasks = FollowedTasks::new(Ledger::with(Pool::Tasks, 3, 2));
        let now = Instant::now();
        assert!(tasks.follow(key(1), "t1", ("job", Some(false)), now, Some(60_000)));
        assert!(tasks.follow(key(1), "t2", ("job", None), now, None));
        // Past the caller's share, past the cap, or an id too long: not followed.
        assert!(!tasks.follow(key(1), "t3", ("job", None), now, None));
        assert!(!tasks.follow(
            key(2),
            &"x".repeat(MAX_TASK_ID + 1),
            ("job", None),
            now,
            None
        ));
        assert!(tasks.follow(key(2), "t1", ("job", None), now, None));
        assert!(!tasks.follow(key(3), "t9", ("job", None), now, None));
        // Another caller's id names nothing of this one's; a task is taken once.
        assert!(tasks.take(key(3), "t1").is_none());
        let t = tasks.take(key(1), "t1").unwrap();
        assert_eq!((t.tool.as_str(), t.listed), ("job", Some(false)));
        assert!(tasks.take(key(1), "t1").is_none());
        assert!(tasks.follows(key(2), "t1"));
        drop(t);
        // Its place is given back: another task of the caller's is followed.
        assert!(tasks.follow(key(1), "t4", ("job", None), now, None));
    }

    #[test]
    fn a_task_past_its_ttl_is_no_longer_followed() {
        let tasks = FollowedTasks::new(Ledger::with(Pool::Tasks, 10, 10));
        let now = Instant::now();
        assert!(tasks.follow(key(1), "t1", ("job", None), now, Some(0)));
        assert!(tasks.take(key(1), "t1").is_none());
        assert!(tasks.follow(key(1), "t2", ("job", None), now, Some(0)));
        std::thread::sleep(Duration::from_millis(2));
        // Following another makes room: the expired one is gone, its place given back.
        assert!(tasks.follow(key(1), "t3", ("job", None), now, None));
        assert!(!tasks.follows(key(1), "t2"));
    }
}
