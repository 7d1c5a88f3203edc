//! The rate limits the request path enforces at run time, shared by every worker (per client
//! address on the MCP path, the same limit counted apart on the HTTP surface, and per tool,
//! with governor). Each refusal is a defined answer, made where the
//! limit is hit. (The in-flight request count is a `gate`; the memory budget is in
//! `budget`.) The per-client limiter keeps its state in [`ClientTable`], bounded, with O(1)
//! eviction of the least recently seen client.

use std::hash::BuildHasher;
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::nanos::Nanos;
use governor::state::keyed::ShrinkableKeyedStateStore;
use governor::state::StateStore;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use http::HeaderMap;
use ipnet::IpNet;
use lru::LruCache;

use crate::caller::address_key;
use crate::config::{Limits, Rate};

/// Shards of the client table: requests from different clients rarely wait for one lock.
const CLIENT_SHARDS: usize = 16;

/// The per-client limiter's state (governor's GCRA "theoretical arrival time" per client key),
/// bounded: at most `capacity` keys, in shards each kept in least-recently-used order. A new
/// client in a full shard evicts that shard's least recently seen client, in O(1); an evicted
/// client that comes back starts with a fresh allowance (a full burst). No request ever scans
/// the table; [`ShrinkableKeyedStateStore::retain_recent`] (the sweeper's, now and then) drops
/// fully recovered keys from the least recently used end only.
pub(crate) struct ClientTable {
    shards: Box<[Mutex<LruCache<IpAddr, u64>>]>,
    /// Picks a key's shard (randomly seeded: no client can choose its shard).
    pick: foldhash::fast::RandomState,
}

impl ClientTable {
    pub(crate) fn new(capacity: usize) -> Self {
        Self::with_shards(capacity, CLIENT_SHARDS)
    }

    /// `capacity` keys over `shards` shards (fewer when the capacity is smaller), shared out
    /// so that the shards' bounds add up to exactly `capacity`.
    fn with_shards(capacity: usize, shards: usize) -> Self {
        let capacity = capacity.max(1);
        let n = shards.clamp(1, capacity);
        let shards = (0..n)
            .map(|i| {
                let cap = capacity / n + usize::from(i < capacity % n);
                // `sparse`: nothing is allocated for keys not yet seen.
                Mutex::new(LruCache::sparse(
                    std::num::NonZeroUsize::new(cap).unwrap_or(std::num::NonZeroUsize::MIN),
                ))
            })
            .collect();
        ClientTable {
            shards,
            pick: foldhash::fast::RandomState::default(),
        }
    }

    fn shard(&self, key: &IpAddr) -> MutexGuard<'_, LruCache<IpAddr, u64>> {
        let i = (self.pick.hash_one(key) % self.shards.len() as u64) as usize;
        self.shards[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl StateStore for ClientTable {
    type Key = IpAddr;

    fn measure_and_replace<T, F, E>(&self, key: &IpAddr, f: F) -> Result<T, E>
    where
        F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
    {
        let mut shard = self.shard(key);
        // `get_mut` makes the key the most recently used, also when it is refused.
        if let Some(tat) = shard.get_mut(key) {
            let (out, next) = f(Some(Nanos::from(*tat)))?;
            *tat = next.into();
            return Ok(out);
        }
        let (out, next) = f(None)?;
        // A full shard evicts its least recently used key here.
        shard.push(*key, next.into());
        Ok(out)
    }
}

impl ShrinkableKeyedStateStore<IpAddr> for ClientTable {
    /// Drops keys indistinguishable from fresh ones, from each shard's least recently used
    /// end up to the first that is not: amortised O(1) per key dropped, never a full scan.
    fn retain_recent(&self, drop_below: Nanos) {
        let drop_below = u64::from(drop_below);
        for shard in &self.shards {
            let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            while shard.peek_lru().is_some_and(|(_, tat)| *tat <= drop_below) {
                shard.pop_lru();
            }
        }
    }

    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

type ClientLimiter = RateLimiter<IpAddr, ClientTable, DefaultClock>;

fn quota(rate: Rate, burst: Option<NonZeroU32>) -> Quota {
    let period = rate.per / rate.count.get();
    Quota::with_period(period.max(Duration::from_nanos(1)))
        .unwrap_or_else(|| Quota::per_second(rate.count))
        .allow_burst(burst.unwrap_or(rate.count))
}

/// The rate limits: per client address, and per tool pattern.
pub(crate) struct RateLimits {
    client: Option<ClientLimiter>,
    /// The same per-client limit for the HTTP surface, counted apart: a client (or every
    /// client behind one untrusted proxy) busy on one surface keeps its allowance on the other.
    surface: Option<ClientLimiter>,
    tools: Vec<(globset::GlobMatcher, DefaultDirectRateLimiter)>,
    trusted: Vec<IpNet>,
    clock: DefaultClock,
}

impl RateLimits {
    pub(crate) fn new(limits: &Limits) -> Arc<Self> {
        let client = || {
            limits.rate_limit.map(|r| {
                RateLimiter::new(
                    quota(r, limits.rate_burst),
                    ClientTable::new(limits.rate_limit_clients),
                    DefaultClock::default(),
                )
            })
        };
        Arc::new(RateLimits {
            client: client(),
            // Its table is sparse: nothing is allocated until the surface sees a client.
            surface: client(),
            tools: limits
                .tool_rate_limits
                .iter()
                .map(|t| {
                    (
                        t.matcher.clone(),
                        DefaultDirectRateLimiter::direct(quota(t.rate, None)),
                    )
                })
                .collect(),
            trusted: limits.trusted_proxies.clone(),
            clock: DefaultClock::default(),
        })
    }

    /// The client's address: the peer's, or, when the peer is a trusted proxy, the nearest
    /// address in `X-Forwarded-For` that is not one.
    pub(crate) fn client_address(&self, peer: SocketAddr, headers: &HeaderMap) -> IpAddr {
        let trusted = |ip: &IpAddr| self.trusted.iter().any(|net| net.contains(ip));
        let mut client = peer.ip();
        if !trusted(&client) {
            return client;
        }
        let hops = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect::<Vec<_>>();
        for hop in hops.iter().rev() {
            match hop.parse::<IpAddr>() {
                Ok(ip) => {
                    client = ip;
                    if !trusted(&ip) {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        client
    }

    /// `Err(wait)` when the client is over its limit on the MCP path.
    pub(crate) fn check_client(&self, ip: IpAddr) -> Result<(), Duration> {
        self.check(self.client.as_ref(), ip)
    }

    /// `Err(wait)` when the client is over its limit on the HTTP surface.
    pub(crate) fn check_surface_client(&self, ip: IpAddr) -> Result<(), Duration> {
        self.check(self.surface.as_ref(), ip)
    }

    fn check(&self, limiter: Option<&ClientLimiter>, ip: IpAddr) -> Result<(), Duration> {
        let Some(limiter) = limiter else {
            return Ok(());
        };
        limiter
            .check_key(&address_key(ip))
            .map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }

    /// `Err(wait)` when the tool is over its limit.
    pub(crate) fn check_tool(&self, tool: &str) -> Result<(), Duration> {
        match self.tools.iter().find(|(m, _)| m.is_match(tool)) {
            Some((_, limiter)) => limiter
                .check()
                .map_err(|not_until| not_until.wait_time_from(self.clock.now())),
            None => Ok(()),
        }
    }

    /// Forgets clients whose limit has fully recovered, from the least recently seen (call
    /// now and then).
    pub(crate) fn sweep(&self) {
        for limiter in [&self.client, &self.surface].into_iter().flatten() {
            limiter.retain_recent();
        }
    }

    /// The client keys the per-client limiters hold now (at most `rate_limit_clients` each).
    pub(crate) fn tracked_clients(&self) -> usize {
        [&self.client, &self.surface]
            .into_iter()
            .flatten()
            .map(|l| l.len())
            .sum()
    }
}

/// Whole seconds to wait, at least one, for `Retry-After`.
pub(crate) fn retry_after_secs(wait: Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(rate: Option<&str>, trusted: &[&str]) -> Limits {
        limits_with(rate, trusted, &[])
    }

    fn limits_with(rate: Option<&str>, trusted: &[&str], extra: &[(&str, &str)]) -> Limits {
        let env: Vec<(String, String)> = [
            ("EPODE_SIDECAR_UPSTREAM", "http://127.0.0.1:1/mcp"),
            ("AGENT_FEEDBACK_MODE", "off"),
        ]
        .into_iter()
        .chain(extra.iter().copied())
        .chain(rate.map(|r| ("EPODE_SIDECAR_RATE_LIMIT", r)))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .chain(std::iter::once((
            "EPODE_SIDECAR_TRUSTED_PROXIES".to_owned(),
            trusted.join(","),
        )))
        .chain(std::iter::once((
            "EPODE_SIDECAR_TOOL_RATE_LIMITS".to_owned(),
            "export_*=1/m".to_owned(),
        )))
        .collect();
        crate::config::Config::from_layers(env, &Default::default())
            .unwrap()
            .limits
    }

    #[test]
    fn client_address_trusts_only_listed_proxies() {
        let r = RateLimits::new(&limits(None, &["10.0.0.0/8"]));
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "203.0.113.9, 10.1.1.1".parse().unwrap());
        let proxy: SocketAddr = "10.0.0.5:1234".parse().unwrap();
        let direct: SocketAddr = "198.51.100.7:1234".parse().unwrap();
        assert_eq!(
            r.client_address(proxy, &h),
            "203.0.113.9".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            r.client_address(direct, &h),
            direct.ip(),
            "an untrusted peer's header is ignored"
        );
        h.insert("x-forwarded-for", "garbage".parse().unwrap());
        assert_eq!(r.client_address(proxy, &h), proxy.ip());
    }

    #[test]
    fn limits_refuse_with_a_wait() {
        let r = RateLimits::new(&limits(Some("2/s"), &[]));
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        assert!(r.check_client(ip).is_ok());
        assert!(r.check_client(ip).is_ok());
        let wait = r.check_client(ip).unwrap_err();
        assert!(wait <= Duration::from_secs(1), "{wait:?}");
        assert!(
            r.check_client("192.0.2.2".parse().unwrap()).is_ok(),
            "per client"
        );
        // The HTTP surface has the same limit, counted apart.
        assert!(r.check_surface_client(ip).is_ok());
        assert!(r.check_surface_client(ip).is_ok());
        assert!(r.check_surface_client(ip).is_err());
        assert!(r.check_client(ip).is_err(), "still over on the MCP path");
        assert_eq!(r.tracked_clients(), 3);
        assert!(r.check_tool("export_csv").is_ok());
        let wait = r.check_tool("export_pdf").unwrap_err();
        assert!(wait > Duration::from_secs(50), "{wait:?}");
        assert!(
            r.check_tool("search").is_ok(),
            "unlisted tools are not limited"
        );
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(
            address_key("2001:db8::1".parse().unwrap()),
            address_key("2001:db8::ffff".parse().unwrap())
        );
    }

    fn ip(i: u32) -> IpAddr {
        IpAddr::from(std::net::Ipv4Addr::from(0x0b00_0000 + i))
    }

    #[test]
    fn the_client_table_evicts_the_least_recently_seen_client() {
        let t = ClientTable::with_shards(3, 1);
        let put = |i: u32| {
            t.measure_and_replace(&ip(i), |old| {
                Ok::<_, ()>((old, Nanos::from(u64::from(i) + 1)))
            })
            .unwrap()
        };
        for i in 0..3 {
            assert_eq!(put(i), None);
        }
        // Seen again: 0 is the most recent, 1 the least.
        assert_eq!(put(0), Some(Nanos::from(1)));
        assert_eq!(put(3), None);
        assert_eq!(t.len(), 3, "bounded");
        assert_eq!(put(1), None, "the least recently seen went");
        assert_eq!(put(0), Some(Nanos::from(1)), "a recently seen one stayed");
        // Sweeping drops recovered keys from the stale end only, up to a live one.
        t.retain_recent(Nanos::from(10));
        assert!(t.is_empty());
        // Many shards still add up to the bound exactly.
        let t = ClientTable::with_shards(1000, 16);
        for i in 0..10_000 {
            t.measure_and_replace(&ip(i), |_| Ok::<_, ()>(((), Nanos::from(1))))
                .unwrap();
        }
        assert_eq!(t.len(), 1000);
    }

    #[test]
    fn an_evicted_client_starts_again_with_a_full_burst() {
        let limits = limits_with(
            Some("1/m"),
            &[],
            &[("EPODE_SIDECAR_RATE_LIMIT_CLIENTS", "1")],
        );
        let r = RateLimits::new(&limits);
        assert!(r.check_client(ip(1)).is_ok());
        assert!(r.check_client(ip(1)).is_err(), "over its limit");
        assert!(r.check_client(ip(2)).is_ok(), "takes the only place");
        assert_eq!(r.tracked_clients(), 1);
        assert!(r.check_client(ip(1)).is_ok(), "forgotten, so fresh");
    }

    /// Time per check for `n` checks of the clients `key(i)`, the best of `runs` runs.
    fn per_check(r: &RateLimits, runs: u32, n: u32, key: impl Fn(u32) -> IpAddr) -> Duration {
        (0..runs)
            .map(|run| {
                let t = std::time::Instant::now();
                for i in 0..n {
                    assert!(r.check_client(key(run * n + i)).is_ok());
                }
                t.elapsed() / n
            })
            .min()
            .unwrap_or_default()
    }

    /// With the table full (100,000 clients, the default bound) every new client evicts one
    /// in O(1): a check costs what it costs with one client. (The earlier limiter scanned the
    /// whole table on every check once past the bound: 6 ms a check in a debug build, 2,000
    /// times one client's.)
    #[test]
    fn a_full_client_table_costs_each_check_what_one_client_does() {
        let limits = limits_with(
            Some("1/m"),
            &[],
            &[("EPODE_SIDECAR_RATE_BURST", "100000000")],
        );
        let r = RateLimits::new(&limits);
        let one = per_check(&r, 3, 20_000, |_| ip(0));
        for i in 0..100_000 {
            assert!(r.check_client(ip(1 + i)).is_ok());
        }
        // Shards fill unevenly (a client's shard is random): a full one evicts while others
        // still have room. 100,000 keys over 16 shards of 6,250: with an ideal hash the room
        // left averages about 500 and stayed under 800 in 300 simulated fills; a run here,
        // with the real hash of sequential addresses, left more than 1,000. 3,000 allows it.
        assert!((97_000..=100_000).contains(&r.tracked_clients()));
        // 20,000 fresh clients past the bound per run, three runs in a row (the best counts:
        // a loaded machine preempts a run): the clients are not given time to recover (which
        // would let a sweep of the table find little to keep).
        let full = per_check(&r, 3, 20_000, |i| ip(200_000 + i));
        let tracked = r.tracked_clients();
        assert!((97_000..=100_000).contains(&tracked), "bounded: {tracked}");
        // The scan this guards against cost 2,000 times one client's; on a loaded 2-core
        // machine the full table's cache misses alone cost tens of times more.
        assert!(
            full < one * 50 + Duration::from_micros(50),
            "{full:?} per check with the table full, {one:?} with one client"
        );
    }
}
