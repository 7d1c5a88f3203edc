//! The bounds the request path enforces at run time, shared by every worker: the in-flight
//! request count and the rate limits (per client address and per tool, with governor). Each
//! refusal is a defined answer, made where the limit is hit. (The memory budget is in
//! `budget`.)

use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota};
use http::HeaderMap;
use ipnet::IpNet;

use crate::config::{Limits, Rate};

/// The MCP requests being served, bounded.
#[derive(Debug)]
pub(crate) struct InFlight {
    limit: usize,
    current: AtomicUsize,
}

/// One request counted in flight until dropped.
pub(crate) struct InFlightGuard(Arc<InFlight>);

impl InFlight {
    pub(crate) fn new(limit: usize) -> Arc<Self> {
        Arc::new(InFlight {
            limit,
            current: AtomicUsize::new(0),
        })
    }

    pub(crate) fn enter(self: &Arc<Self>) -> Option<InFlightGuard> {
        self.current
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .ok()
            .map(|_| InFlightGuard(self.clone()))
    }

    pub(crate) fn current(&self) -> usize {
        self.current.load(Ordering::Relaxed)
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.current.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Client addresses kept by the per-client limiter before stale ones are swept at once.
const MAX_TRACKED_CLIENTS: usize = 100_000;

fn quota(rate: Rate, burst: Option<NonZeroU32>) -> Quota {
    let period = rate.per / rate.count.get();
    Quota::with_period(period.max(Duration::from_nanos(1)))
        .unwrap_or_else(|| Quota::per_second(rate.count))
        .allow_burst(burst.unwrap_or(rate.count))
}

/// The rate limits: per client address, and per tool pattern.
pub(crate) struct RateLimits {
    client: Option<DefaultKeyedRateLimiter<IpAddr>>,
    tools: Vec<(globset::GlobMatcher, DefaultDirectRateLimiter)>,
    trusted: Vec<IpNet>,
    clock: DefaultClock,
}

impl RateLimits {
    pub(crate) fn new(limits: &Limits) -> Arc<Self> {
        Arc::new(RateLimits {
            client: limits
                .rate_limit
                .map(|r| DefaultKeyedRateLimiter::keyed(quota(r, limits.rate_burst))),
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

    /// `Err(wait)` when the client is over its limit.
    pub(crate) fn check_client(&self, ip: IpAddr) -> Result<(), Duration> {
        let Some(limiter) = &self.client else {
            return Ok(());
        };
        if limiter.len() > MAX_TRACKED_CLIENTS {
            limiter.retain_recent();
        }
        limiter
            .check_key(&client_key(ip))
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

    /// Forgets clients whose limit has fully recovered (call now and then).
    pub(crate) fn sweep(&self) {
        if let Some(limiter) = &self.client {
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
    }
}

/// IPv6 clients are limited per /64 (one host usually has a whole /64 to pick from).
fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_none() => {
            let mut octets = v6.octets();
            octets[8..].fill(0);
            IpAddr::from(octets)
        }
        IpAddr::V6(v6) => IpAddr::V4(
            v6.to_ipv4_mapped()
                .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED),
        ),
        v4 => v4,
    }
}

/// Whole seconds to wait, at least one, for `Retry-After`.
pub(crate) fn retry_after_secs(wait: Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_flight_is_bounded() {
        let f = InFlight::new(2);
        let a = f.enter().unwrap();
        let _b = f.enter().unwrap();
        assert!(f.enter().is_none());
        drop(a);
        assert!(f.enter().is_some());
    }

    fn limits(rate: Option<&str>, trusted: &[&str]) -> Limits {
        let env: Vec<(String, String)> = [
            ("EPODE_SIDECAR_UPSTREAM", "http://127.0.0.1:1/mcp"),
            ("AGENT_FEEDBACK_MODE", "off"),
        ]
        .into_iter()
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
        assert!(r.check_tool("export_csv").is_ok());
        let wait = r.check_tool("export_pdf").unwrap_err();
        assert!(wait > Duration::from_secs(50), "{wait:?}");
        assert!(
            r.check_tool("search").is_ok(),
            "unlisted tools are not limited"
        );
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(
            client_key("2001:db8::1".parse().unwrap()),
            client_key("2001:db8::ffff".parse().unwrap())
        );
    }
}
