//! One ledger for everything a request leaves held past its head, charged to its caller
//! (`crate::caller`) in one place: each [`Pool`] has a cap for the whole process and a share
//! no one caller may pass, both settings. A [`Charge`] is one place taken, given back when it
//! is dropped (with whatever held it: a held call, a question, a listen stream, a 2025
//! session, a stdio child, an introspection in flight, an upstream connection a long-lived
//! holder keeps). Past a caller's share the answer is 429 with `Retry-After`, naming the
//! setting; past the cap, 503 with `Retry-After`. The long-lived holders (held calls and
//! listen feeds) have their own pool of upstream connections, a part of the cap, so calls
//! always have the rest.
//!
//! Each pool's use, its callers, its bounds and its refusals are on `/metrics`
//! (`epode_sidecar_pool_*{pool}`). Charging is a lock and a hash-map update, on the paths
//! that hold something only (a question asked, a call held, a stream opened); a plain call
//! never touches the ledger.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use prometheus_client::metrics::gauge::Gauge;

use crate::caller::CallerKey;
use crate::error::{Error, ErrorKind};
use crate::metrics::{LimitKind, Metrics, PoolLabels, PoolRefusedLabels};

/// What a caller may hold past its request's head.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Pool {
    /// Calls of a 2025-era upstream held while a 2026 client answers their questions.
    HeldCalls,
    /// Questions of a 2026 upstream asked of a 2025 client, waiting for its answer.
    Questions,
    /// `subscriptions/listen` streams served for a 2025-era upstream.
    ListenStreams,
    /// 2025-era upstream sessions (one per caller and capability set).
    Sessions,
    /// stdio MCP server processes, one per caller (`EPODE_SIDECAR_STDIO_CHILDREN=per-client`).
    Children,
    /// Introspection calls in flight (a token not seen before), per client address.
    Introspections,
    /// Upstream connections held by held calls and listen feeds.
    HeldConnections,
    /// Tasks (the `io.modelcontextprotocol/tasks` extension) followed to their terminal
    /// result, the product call's outcome.
    Tasks,
    /// Customer context's enrichment requests in flight (each ends within its budget).
    ContextRequests,
}

impl Pool {
    pub(crate) const ALL: [Pool; 9] = [
        Pool::HeldCalls,
        Pool::Questions,
        Pool::ListenStreams,
        Pool::Sessions,
        Pool::Children,
        Pool::Introspections,
        Pool::HeldConnections,
        Pool::Tasks,
        Pool::ContextRequests,
    ];

    /// The `pool` label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Pool::HeldCalls => "held_calls",
            Pool::Questions => "questions",
            Pool::ListenStreams => "listen_streams",
            Pool::Sessions => "upstream_sessions",
            Pool::Children => "stdio_children",
            Pool::Introspections => "introspections",
            Pool::HeldConnections => "held_connections",
            Pool::Tasks => "tasks",
            Pool::ContextRequests => "context_requests",
        }
    }

    /// What one place of it is, in an error message.
    fn what(self) -> &'static str {
        match self {
            Pool::HeldCalls => "calls held for their client's answers",
            Pool::Questions => "questions waiting for a 2025 client's answers",
            Pool::ListenStreams => "listen streams",
            Pool::Sessions => "2025-era upstream sessions",
            Pool::Children => "MCP server processes",
            Pool::Introspections => "token introspections in flight",
            Pool::HeldConnections => "upstream connections held by waiting calls and listen feeds",
            Pool::Tasks => "tasks followed to their result",
            Pool::ContextRequests => "customer-context enrichment requests in flight",
        }
    }

    /// The limit's kind (`limits_hit_total`).
    fn limit(self) -> LimitKind {
        match self {
            Pool::HeldCalls => LimitKind::HeldCalls,
            Pool::Questions => LimitKind::Questions,
            Pool::ListenStreams => LimitKind::ListenStreams,
            Pool::Sessions => LimitKind::UpstreamSessions,
            Pool::Children => LimitKind::StdioChildren,
            Pool::Introspections => LimitKind::Introspections,
            Pool::HeldConnections => LimitKind::HeldConnections,
            Pool::Tasks => LimitKind::Tasks,
            Pool::ContextRequests => LimitKind::ContextRequests,
        }
    }
}

/// A pool's bounds and the settings that set them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    /// Places in the whole process.
    pub(crate) cap: usize,
    /// Places one caller may hold (at most the cap).
    pub(crate) share: usize,
    pub(crate) cap_setting: &'static str,
    pub(crate) share_setting: &'static str,
    /// Seconds a refused caller is told to wait.
    pub(crate) retry_after: u64,
}

/// Why a place was not given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The caller holds its share.
    Share,
    /// The process holds the cap.
    Cap,
}

impl Refused {
    fn as_str(self) -> &'static str {
        match self {
            Refused::Share => "share",
            Refused::Cap => "cap",
        }
    }
}

#[derive(Default)]
struct Held {
    used: usize,
    by_caller: HashMap<CallerKey, usize>,
}

struct Account {
    bounds: Bounds,
    held: Mutex<Held>,
    in_use: Gauge,
    callers: Gauge,
}

/// Every pool's account, shared by every worker.
pub(crate) struct Ledger {
    accounts: Vec<Account>,
    metrics: Arc<Metrics>,
}

/// One place of a pool, charged to a caller; given back when dropped.
pub(crate) struct Charge {
    ledger: Arc<Ledger>,
    pool: Pool,
    caller: CallerKey,
}

impl std::fmt::Debug for Charge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Charge").field("pool", &self.pool).finish()
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.ledger.release(self.pool, self.caller);
    }
}

impl Charge {
    /// The caller it is charged to.
    pub(crate) fn caller(&self) -> CallerKey {
        self.caller
    }
}

impl Ledger {
    /// The ledger with `bounds` for each pool (in [`Pool::ALL`]'s order).
    pub(crate) fn new(bounds: [Bounds; 9], metrics: Arc<Metrics>) -> Arc<Self> {
        let accounts = Pool::ALL
            .iter()
            .zip(bounds)
            .map(|(&pool, mut bounds)| {
                bounds.share = bounds.share.clamp(1, bounds.cap.max(1));
                let labels = PoolLabels {
                    pool: pool.as_str(),
                };
                metrics
                    .pools
                    .capacity
                    .get_or_create(&labels)
                    .set(bounds.cap as i64);
                metrics
                    .pools
                    .share
                    .get_or_create(&labels)
                    .set(bounds.share as i64);
                for reason in [Refused::Share, Refused::Cap] {
                    drop(metrics.pools.refused.get_or_create(&PoolRefusedLabels {
                        pool: pool.as_str(),
                        reason: reason.as_str(),
                    }));
                }
                Account {
                    bounds,
                    held: Mutex::new(Held::default()),
                    in_use: metrics.pools.in_use.get_or_create(&labels).clone(),
                    callers: metrics.pools.callers.get_or_create(&labels).clone(),
                }
            })
            .collect();
        Arc::new(Ledger { accounts, metrics })
    }

    fn account(&self, pool: Pool) -> &Account {
        &self.accounts[pool as usize]
    }

    /// The bounds of `pool`.
    pub(crate) fn bounds(&self, pool: Pool) -> Bounds {
        self.account(pool).bounds
    }

    /// One place of `pool` for `caller`, or why not (counted).
    pub(crate) fn try_charge(
        self: &Arc<Self>,
        pool: Pool,
        caller: CallerKey,
    ) -> Result<Charge, Refused> {
        let account = self.account(pool);
        let mut held = account.held.lock();
        let mine = held.by_caller.get(&caller).copied().unwrap_or(0);
        // A full pool is the sidecar's limit whoever asks; a caller at its share, its own.
        let refused = if held.used >= account.bounds.cap {
            Some(Refused::Cap)
        } else if mine >= account.bounds.share {
            Some(Refused::Share)
        } else {
            None
        };
        if let Some(why) = refused {
            drop(held);
            self.metrics
                .pools
                .refused
                .get_or_create(&PoolRefusedLabels {
                    pool: pool.as_str(),
                    reason: why.as_str(),
                })
                .inc();
            self.metrics.limit(pool.limit());
            return Err(why);
        }
        held.used += 1;
        *held.by_caller.entry(caller).or_insert(0) += 1;
        account.in_use.set(held.used as i64);
        account.callers.set(held.by_caller.len() as i64);
        Ok(Charge {
            ledger: self.clone(),
            pool,
            caller,
        })
    }

    /// [`Ledger::try_charge`], its refusal as the client's answer.
    pub(crate) fn charge(self: &Arc<Self>, pool: Pool, caller: CallerKey) -> Result<Charge, Error> {
        self.try_charge(pool, caller)
            .map_err(|why| self.refusal(pool, why))
    }

    /// What a caller refused a place of `pool` is told: 429 past its share, 503 past the cap,
    /// each with `Retry-After` and the setting to change.
    pub(crate) fn refusal(&self, pool: Pool, why: Refused) -> Error {
        let b = self.bounds(pool);
        match why {
            Refused::Share => Error::new(
                ErrorKind::RateLimited {
                    retry_after: b.retry_after,
                },
                format!(
                    "this caller holds {} {}, the most one caller may ({}); let one end, then retry",
                    b.share,
                    pool.what(),
                    b.share_setting
                ),
            ),
            Refused::Cap => Error::new(
                ErrorKind::Overloaded {
                    retry_after: b.retry_after,
                },
                format!(
                    "it holds {} {}, the most it may ({})",
                    b.cap,
                    pool.what(),
                    b.cap_setting
                ),
            ),
        }
    }

    /// How many places of `pool` `caller` holds now.
    pub(crate) fn held_by(&self, pool: Pool, caller: CallerKey) -> usize {
        let held = self.account(pool).held.lock();
        held.by_caller.get(&caller).copied().unwrap_or(0)
    }

    /// How many places of `pool` are held now.
    #[cfg(test)]
    pub(crate) fn in_use(&self, pool: Pool) -> usize {
        self.account(pool).held.lock().used
    }

    /// A ledger whose `pool` has `cap` and `share` (every other pool 1,000 and 1,000), for
    /// the tests of what charges it.
    #[cfg(test)]
    pub(crate) fn with(pool: Pool, cap: usize, share: usize) -> Arc<Ledger> {
        let bounds = Pool::ALL.map(|p| {
            let (cap, share) = if p == pool {
                (cap, share)
            } else {
                (1000, 1000)
            };
            Bounds {
                cap,
                share,
                cap_setting: "CAP",
                share_setting: "SHARE",
                retry_after: 1,
            }
        });
        Ledger::new(bounds, Arc::new(Metrics::new(|_| {})))
    }

    fn release(&self, pool: Pool, caller: CallerKey) {
        let account = self.account(pool);
        let mut held = account.held.lock();
        held.used = held.used.saturating_sub(1);
        if let std::collections::hash_map::Entry::Occupied(mut e) = held.by_caller.entry(caller) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
        account.in_use.set(held.used as i64);
        account.callers.set(held.by_caller.len() as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> CallerKey {
        CallerKey::of_token("i", None, None, &[n; 32])
    }

    fn ledger(cap: usize, share: usize) -> Arc<Ledger> {
        let b = Bounds {
            cap,
            share,
            cap_setting: "CAP",
            share_setting: "SHARE",
            retry_after: 1,
        };
        Ledger::new([b; 9], Arc::new(Metrics::new(|_| {})))
    }

    #[test]
    fn a_caller_holds_at_most_its_share_and_everyone_at_most_the_cap() {
        let l = ledger(4, 2);
        let a1 = l.try_charge(Pool::HeldCalls, key(1)).unwrap();
        let _a2 = l.try_charge(Pool::HeldCalls, key(1)).unwrap();
        assert_eq!(
            l.try_charge(Pool::HeldCalls, key(1)).unwrap_err(),
            Refused::Share
        );
        let _b1 = l.try_charge(Pool::HeldCalls, key(2)).unwrap();
        let _c1 = l.try_charge(Pool::HeldCalls, key(3)).unwrap();
        assert_eq!(
            l.try_charge(Pool::HeldCalls, key(4)).unwrap_err(),
            Refused::Cap
        );
        assert_eq!(
            l.try_charge(Pool::HeldCalls, key(1)).unwrap_err(),
            Refused::Cap,
            "a full pool is the cap's refusal, whoever asks"
        );
        assert_eq!(l.in_use(Pool::HeldCalls), 4);
        assert_eq!(l.held_by(Pool::HeldCalls, key(1)), 2);
        // Another pool is another account.
        assert!(l.try_charge(Pool::Questions, key(1)).is_ok());
        drop(a1);
        assert_eq!(l.held_by(Pool::HeldCalls, key(1)), 1);
        let again = l.try_charge(Pool::HeldCalls, key(4)).unwrap();
        assert_eq!(again.caller(), key(4));
        let text = l.metrics.render();
        assert!(
            text.contains(r#"epode_sidecar_pool_in_use{pool="held_calls"} 4"#),
            "{text}"
        );
        assert!(text
            .contains(r#"epode_sidecar_pool_refused_total{pool="held_calls",reason="share"} 1"#));
        assert!(
            text.contains(r#"epode_sidecar_pool_refused_total{pool="held_calls",reason="cap"} 2"#)
        );
        assert!(text.contains(r#"epode_sidecar_pool_callers{pool="held_calls"} 4"#));
    }

    #[test]
    fn a_refusal_names_the_setting_and_says_when_to_retry() {
        let l = ledger(1, 1);
        let share = l.refusal(Pool::ListenStreams, Refused::Share);
        assert_eq!(share.status(), http::StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(share.retry_after(), Some(1));
        assert!(share.to_string().contains("SHARE"), "{share}");
        let cap = l.refusal(Pool::ListenStreams, Refused::Cap);
        assert_eq!(cap.status(), http::StatusCode::SERVICE_UNAVAILABLE);
        assert!(cap.to_string().contains("CAP"), "{cap}");
    }

    #[test]
    fn a_share_is_never_above_the_cap_nor_zero() {
        let l = ledger(3, 10);
        assert_eq!(l.bounds(Pool::Children).share, 3);
        let l = ledger(3, 0);
        assert_eq!(l.bounds(Pool::Children).share, 1);
    }
}
