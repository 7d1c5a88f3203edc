//! The bounds on every resource the sidecar holds, and the rate limits. Each is a setting with
//! a default a production operator would accept without tuning.

use std::num::NonZeroU32;
use std::time::Duration;

use ipnet::IpNet;

use super::settings::{duration, invalid, setting, ConfigError, Setting};
use super::{duration_in, number, parsed, positive_duration, split_list, value, Scalar};

/// How many connections the sidecar keeps open at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConnectionCap {
    /// About 80% of the process's file-descriptor limit, read at start.
    Auto,
    Fixed(usize),
}

/// `count` per `per`, such as 100/s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rate {
    pub(crate) count: NonZeroU32,
    pub(crate) per: Duration,
}

impl Rate {
    pub(super) fn parse(raw: &str) -> Option<Rate> {
        let (count, unit) = raw.trim().split_once('/')?;
        let count = NonZeroU32::new(count.trim().parse().ok()?)?;
        let per = match unit.trim() {
            "s" | "sec" | "second" => Duration::from_secs(1),
            "m" | "min" | "minute" => Duration::from_secs(60),
            "h" | "hour" => Duration::from_secs(3600),
            _ => return None,
        };
        Some(Rate { count, per })
    }

    pub(super) fn shown(&self) -> String {
        let unit = match self.per.as_secs() {
            1 => "s",
            60 => "m",
            _ => "h",
        };
        format!("{}/{unit}", self.count)
    }
}

/// A rate limit on the calls of the tools whose names match a pattern.
#[derive(Debug, Clone)]
pub(crate) struct ToolRate {
    pub(crate) pattern: String,
    pub(crate) matcher: globset::GlobMatcher,
    pub(crate) rate: Rate,
}

#[derive(Debug, Clone)]
pub(crate) struct Limits {
    pub(crate) max_header_bytes: usize,
    pub(crate) max_headers: usize,
    pub(crate) header_timeout: Duration,
    pub(crate) body_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) max_connections: ConnectionCap,
    pub(crate) max_in_flight: usize,
    pub(crate) memory_budget: usize,
    pub(crate) max_upstream_answer: usize,
    pub(crate) max_sse_event: usize,
    pub(crate) upstream_sessions: usize,
    pub(crate) upstream_session_idle: Duration,
    /// Idle keep-alive connections to an HTTP upstream kept per worker, and for how long.
    pub(crate) upstream_max_idle: usize,
    pub(crate) upstream_idle_timeout: Duration,
    /// Connections to an HTTP upstream open at once, for the whole process.
    pub(crate) upstream_max_connections: usize,
    /// How long a request waits for a free upstream connection, or for room in a stdio
    /// child's stdin queue, before 503.
    pub(crate) upstream_wait: Duration,
    pub(crate) rate_limit: Option<Rate>,
    pub(crate) rate_burst: Option<NonZeroU32>,
    /// Client keys the per-client limiter keeps; past it the least recently seen is evicted.
    pub(crate) rate_limit_clients: usize,
    pub(crate) tool_rate_limits: Vec<ToolRate>,
    pub(crate) trusted_proxies: Vec<IpNet>,
}

/// The limits' raw settings.
#[derive(Default)]
pub(super) struct RawLimits {
    pub(super) max_header_bytes: Option<Scalar>,
    pub(super) max_headers: Option<Scalar>,
    pub(super) header_timeout: Option<Scalar>,
    pub(super) body_timeout: Option<Scalar>,
    pub(super) idle_timeout: Option<Scalar>,
    pub(super) max_connections: Option<Scalar>,
    pub(super) max_in_flight: Option<Scalar>,
    pub(super) memory_budget_bytes: Option<Scalar>,
    pub(super) max_upstream_answer_bytes: Option<Scalar>,
    pub(super) max_sse_event_bytes: Option<Scalar>,
    pub(super) upstream_sessions: Option<Scalar>,
    pub(super) upstream_session_idle: Option<Scalar>,
    pub(super) upstream_max_idle: Option<Scalar>,
    pub(super) upstream_idle_timeout: Option<Scalar>,
    pub(super) upstream_max_connections: Option<Scalar>,
    pub(super) upstream_wait: Option<Scalar>,
    pub(super) rate_limit: Option<Scalar>,
    pub(super) rate_burst: Option<Scalar>,
    pub(super) rate_limit_clients: Option<Scalar>,
    pub(super) tool_rate_limits: Option<Scalar>,
    pub(super) trusted_proxies: Option<Scalar>,
}

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;

impl Limits {
    pub(super) fn try_from_raw(raw: RawLimits) -> Result<Limits, ConfigError> {
        let positive = Duration::from_millis(1)..=Duration::from_secs(24 * 3600);
        Ok(Limits {
            max_header_bytes: number(raw.max_header_bytes, "max_header_bytes", 1024..=MIB)?,
            max_headers: number(raw.max_headers, "max_headers", 8..=1000)?,
            header_timeout: duration_in(raw.header_timeout, "header_timeout", positive.clone())?,
            body_timeout: duration_in(raw.body_timeout, "body_timeout", positive.clone())?,
            idle_timeout: duration_in(raw.idle_timeout, "idle_timeout", positive.clone())?,
            max_connections: parsed(raw.max_connections, "max_connections", |v| match v {
                "auto" => Some(ConnectionCap::Auto),
                n => n
                    .parse()
                    .ok()
                    .filter(|n| (1..=1_000_000).contains(n))
                    .map(ConnectionCap::Fixed),
            })?,
            max_in_flight: number(raw.max_in_flight, "max_in_flight", 1..=1_000_000)?,
            memory_budget: number(
                raw.memory_budget_bytes,
                "memory_budget_bytes",
                MIB..=1 << 40,
            )?,
            max_upstream_answer: number(
                raw.max_upstream_answer_bytes,
                "max_upstream_answer_bytes",
                KIB..=1 << 40,
            )?,
            max_sse_event: number(
                raw.max_sse_event_bytes,
                "max_sse_event_bytes",
                KIB..=1 << 40,
            )?,
            upstream_sessions: number(raw.upstream_sessions, "upstream_sessions", 1..=100_000)?,
            upstream_session_idle: positive_duration(
                raw.upstream_session_idle,
                "upstream_session_idle",
            )?,
            upstream_max_idle: number(raw.upstream_max_idle, "upstream_max_idle", 0..=10_000)?,
            upstream_idle_timeout: duration_in(
                raw.upstream_idle_timeout,
                "upstream_idle_timeout",
                positive.clone(),
            )?,
            upstream_max_connections: number(
                raw.upstream_max_connections,
                "upstream_max_connections",
                1..=1_000_000,
            )?,
            upstream_wait: duration_in(
                raw.upstream_wait,
                "upstream_wait",
                Duration::ZERO..=Duration::from_secs(3600),
            )?,
            rate_limit: value(raw.rate_limit)
                .map(|r| Rate::parse(&r).ok_or_else(|| invalid("rate_limit", &r)))
                .transpose()?,
            rate_burst: value(raw.rate_burst)
                .map(|b| {
                    b.parse()
                        .ok()
                        .and_then(NonZeroU32::new)
                        .ok_or_else(|| invalid("rate_burst", &b))
                })
                .transpose()?,
            rate_limit_clients: number(
                raw.rate_limit_clients,
                "rate_limit_clients",
                1..=10_000_000,
            )?,
            tool_rate_limits: tool_rates(value(raw.tool_rate_limits))?,
            trusted_proxies: trusted_proxies(value(raw.trusted_proxies))?,
        })
    }
}

fn tool_rates(raw: Option<String>) -> Result<Vec<ToolRate>, ConfigError> {
    let Some(raw) = raw else {
        return Ok(Vec::new());
    };
    split_list(&raw)
        .into_iter()
        .map(|entry| {
            let bad = || invalid("tool_rate_limits", &entry);
            let (pattern, rate) = entry.split_once('=').ok_or_else(bad)?;
            let matcher = globset::GlobBuilder::new(pattern.trim())
                .literal_separator(true)
                .build()
                .map_err(|_| bad())?
                .compile_matcher();
            let rate = Rate::parse(rate).ok_or_else(bad)?;
            Ok(ToolRate {
                pattern: pattern.trim().to_owned(),
                matcher,
                rate,
            })
        })
        .collect()
}

fn trusted_proxies(raw: Option<String>) -> Result<Vec<IpNet>, ConfigError> {
    let Some(raw) = raw else {
        return Ok(Vec::new());
    };
    split_list(&raw)
        .into_iter()
        .map(|entry| {
            entry
                .parse::<IpNet>()
                .or_else(|_| entry.parse::<std::net::IpAddr>().map(IpNet::from))
                .map_err(|_| invalid("trusted_proxies", &entry))
        })
        .collect()
}

fn bytes(n: usize) -> String {
    n.to_string()
}

pub(super) const LIMITS: &[Setting] = &[
    setting(
        "max_header_bytes",
        &["EPODE_SIDECAR_MAX_HEADER_BYTES"],
        Some("32768"),
        "a whole number of bytes from 1024 to 1048576",
        "Largest request head (request line and headers); larger gets 431 and the connection is closed.",
        |c| bytes(c.limits.max_header_bytes),
    ),
    setting(
        "max_headers",
        &["EPODE_SIDECAR_MAX_HEADERS"],
        Some("100"),
        "a whole number from 8 to 1000",
        "Most header fields in a request; more gets 431.",
        |c| c.limits.max_headers.to_string(),
    ),
    setting(
        "header_timeout",
        &["EPODE_SIDECAR_HEADER_TIMEOUT"],
        Some("10s"),
        "a duration from 1ms to 24h, such as 10s",
        "Time a client has to send a request's head, on every listener: a new connection's first from its accept (one that sends nothing is closed then, without an answer, or at the idle timeout when that is nearer), a later one from its first byte; then 408 (when the client can still read it) and the connection is closed.",
        |c| duration(c.limits.header_timeout),
    ),
    setting(
        "body_timeout",
        &["EPODE_SIDECAR_BODY_TIMEOUT"],
        Some("30s"),
        "a duration from 1ms to 24h, such as 30s",
        "Time a client has to send a request's body once its head arrived; then 408 with a JSON-RPC error and the connection is closed (on HTTP/2, once its other streams have ended).",
        |c| duration(c.limits.body_timeout),
    ),
    setting(
        "idle_timeout",
        &["EPODE_SIDECAR_IDLE_TIMEOUT"],
        Some("60s"),
        "a duration from 1ms to 24h, such as 60s",
        "How long a keep-alive connection may stay idle between requests before the sidecar closes it, and how long a client may take no part of an answer (its writes make no progress) before its connection is cut; on every listener.",
        |c| duration(c.limits.idle_timeout),
    ),
    setting(
        "max_connections",
        &["EPODE_SIDECAR_MAX_CONNECTIONS"],
        Some("auto"),
        "auto or a whole number from 1 to 1000000",
        "Most client connections open at once, on every listener together. The admin listener and the `--dev` Epode each keep a sixteenth of it (4 to 256 connections) and the MCP port has the rest, so a flood of one cannot lock out another; past its share a listener closes a new connection at once. `auto`: 80% of the process's file-descriptor limit (raised to its hard limit at start); a number above that is lowered to it, so upstream and Epode connections always have descriptors left.",
        |c| match c.limits.max_connections {
            ConnectionCap::Auto => "auto".to_owned(),
            ConnectionCap::Fixed(n) => n.to_string(),
        },
    ),
    setting(
        "max_in_flight",
        &["EPODE_SIDECAR_MAX_IN_FLIGHT"],
        Some("1024"),
        "a whole number from 1 to 1000000",
        "Most MCP requests being served at once; past it 503 with `Retry-After: 1` and a JSON-RPC error.",
        |c| c.limits.max_in_flight.to_string(),
    ),
    setting(
        "memory_budget_bytes",
        &["EPODE_SIDECAR_MEMORY_BUDGET_BYTES"],
        Some("134217728"),
        "a whole number of bytes, at least 1048576",
        "One budget for everything the sidecar holds in memory at once (request bodies, upstream answers it must parse, SSE events it must rewrite, answers waiting for a slow client until written, Epode answers); a request that would pass it gets 503 with `Retry-After: 1`.",
        |c| bytes(c.limits.memory_budget),
    ),
    setting(
        "max_upstream_answer_bytes",
        &["EPODE_SIDECAR_MAX_UPSTREAM_ANSWER_BYTES"],
        Some("16777216"),
        "a whole number of bytes, at least 1024",
        "Largest upstream JSON answer the sidecar reads whole to rewrite it; larger gets 502 with the request's id.",
        |c| bytes(c.limits.max_upstream_answer),
    ),
    setting(
        "max_sse_event_bytes",
        &["EPODE_SIDECAR_MAX_SSE_EVENT_BYTES"],
        Some("16777216"),
        "a whole number of bytes, at least 1024",
        "Largest upstream SSE event the sidecar holds to rewrite it; a larger one ends the stream with a JSON-RPC error event for the request. The same default as `max_upstream_answer_bytes`, so a result has the same limit whether it comes as JSON or as an event.",
        |c| bytes(c.limits.max_sse_event),
    ),
    setting(
        "upstream_sessions",
        &["EPODE_SIDECAR_UPSTREAM_SESSIONS"],
        Some("256"),
        "a whole number from 1 to 100000",
        "Most 2025-era upstream sessions kept (one per client credential); the least recently used is closed upstream (`DELETE`) to make room.",
        |c| c.limits.upstream_sessions.to_string(),
    ),
    setting(
        "upstream_session_idle",
        &["EPODE_SIDECAR_UPSTREAM_SESSION_IDLE"],
        Some("10m"),
        "a duration of at least 1ms, such as 10m",
        "A 2025-era upstream session unused this long is closed upstream (`DELETE`).",
        |c| duration(c.limits.upstream_session_idle),
    ),
    setting(
        "upstream_max_idle",
        &["EPODE_SIDECAR_UPSTREAM_MAX_IDLE"],
        Some("64"),
        "a whole number from 0 to 10000",
        "Idle keep-alive connections to an HTTP upstream kept for reuse, per worker; past it a connection is closed when its answer ends. 0: a new connection per request.",
        |c| c.limits.upstream_max_idle.to_string(),
    ),
    setting(
        "upstream_idle_timeout",
        &["EPODE_SIDECAR_UPSTREAM_IDLE_TIMEOUT"],
        Some("3s"),
        "a duration from 1ms to 24h, such as 3s",
        "How long a keep-alive connection to an HTTP upstream may stay idle before the sidecar closes it. Keep it below the upstream's own keep-alive timeout (uvicorn and Node: 5 s), so a request is never sent on a connection the upstream is closing; behind gunicorn (2 s) lower it, to 1s say.",
        |c| duration(c.limits.upstream_idle_timeout),
    ),
    setting(
        "upstream_max_connections",
        &["EPODE_SIDECAR_UPSTREAM_MAX_CONNECTIONS"],
        Some("256"),
        "a whole number from 1 to 1000000",
        "Most connections open to an HTTP upstream at once, all workers together (each request, and each SSE answer while it streams, holds one). A request that finds none free waits for the first its worker gets back (or room to open one; at most 32 are opened at once) up to `upstream_wait`, then gets 503 with `Retry-After: 1` and a JSON-RPC error, and nothing is sent upstream. Raise it when the upstream serves more requests at once (long tool calls).",
        |c| c.limits.upstream_max_connections.to_string(),
    ),
    setting(
        "upstream_wait",
        &["EPODE_SIDECAR_UPSTREAM_WAIT"],
        Some("1s"),
        "a duration from 0s to 1h, such as 1s",
        "How long a request may wait for a free connection to an HTTP upstream (`upstream_max_connections`) or for room in a stdio MCP server's stdin queue (`upstream_stdin_queue`); then 503 with `Retry-After: 1` and a JSON-RPC error with its id, nothing sent. At most `upstream_timeout` (which counts the wait). 0s: 503 at once.",
        |c| duration(c.limits.upstream_wait),
    ),
];

pub(super) const RATES: &[Setting] = &[
    setting(
        "rate_limit",
        &["EPODE_SIDECAR_RATE_LIMIT"],
        None,
        "N/s, N/m or N/h, such as 100/s",
        "Requests per client address on the MCP path; past it 429 with `Retry-After` and a JSON-RPC error. Unset: no limit.",
        |c| {
            c.limits
                .rate_limit
                .map_or_else(|| "<none>".to_owned(), |r| r.shown())
        },
    ),
    setting(
        "rate_burst",
        &["EPODE_SIDECAR_RATE_BURST"],
        None,
        "a whole number, at least 1",
        "Requests a client address may send at once before `rate_limit` applies. Unset: the rate's count.",
        |c| {
            c.limits
                .rate_burst
                .map_or_else(|| "<the rate's count>".to_owned(), |b| b.to_string())
        },
    ),
    setting(
        "rate_limit_clients",
        &["EPODE_SIDECAR_RATE_LIMIT_CLIENTS"],
        Some("100000"),
        "a whole number from 1 to 10000000",
        "Client addresses (IPv6: /64 prefixes) the per-client limit keeps track of, about 100 bytes each; past it the least recently seen is forgotten, and starts again with a full burst if it comes back. Each request costs the same however many clients there are.",
        |c| c.limits.rate_limit_clients.to_string(),
    ),
    setting(
        "tool_rate_limits",
        &["EPODE_SIDECAR_TOOL_RATE_LIMITS"],
        None,
        "comma-separated pattern=N/unit pairs, such as search=10/s,export_*=1/m",
        "Calls per tool (all clients together), by glob pattern, the first match applying; past it the call gets a tool result with `isError` that says when to retry.",
        |c| {
            c.limits
                .tool_rate_limits
                .iter()
                .map(|t| format!("{}={}", t.pattern, t.rate.shown()))
                .collect::<Vec<_>>()
                .join(",")
        },
    ),
    setting(
        "trusted_proxies",
        &["EPODE_SIDECAR_TRUSTED_PROXIES"],
        None,
        "comma-separated IP addresses or CIDR ranges, such as 10.0.0.0/8",
        "Peers whose `X-Forwarded-For` names the client address (for the rate limit). Unset: the peer address is the client.",
        |c| {
            c.limits
                .trusted_proxies
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        },
    ),
];
