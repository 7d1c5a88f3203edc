//! The bounds on every resource the sidecar holds, and the rate limits: their settings, each
//! with a default a production operator would accept without tuning, and the [`Limits`] built
//! from them.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use ipnet::IpNet;

use super::setting::{
    a_duration, bounded, duration, number, percent, read_all, setting, settings, split_list,
    Accepts, Bad, Layers, Refused, AT_LEAST_1MS,
};
use super::types::{ConnectionCap, Limits, Rate, ToolRate};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;
const A_DAY: Duration = Duration::from_secs(24 * 3600);

/// Reads the limits.
pub(super) fn read(l: &Layers) -> Result<Limits, Refused> {
    read_all!(Limits {
        max_header_bytes: l.get(&MAX_HEADER_BYTES),
        max_headers: l.get(&MAX_HEADERS),
        header_timeout: l.get(&HEADER_TIMEOUT),
        body_timeout: l.get(&BODY_TIMEOUT),
        idle_timeout: l.get(&IDLE_TIMEOUT),
        max_connections: l.get(&MAX_CONNECTIONS),
        max_in_flight: l.get(&MAX_IN_FLIGHT),
        memory_budget: l.get(&MEMORY_BUDGET_BYTES),
        max_upstream_answer: l.get(&MAX_UPSTREAM_ANSWER_BYTES),
        max_sse_event: l.get(&MAX_SSE_EVENT_BYTES),
        upstream_sessions: l.get(&UPSTREAM_SESSIONS),
        upstream_session_idle: l.get(&UPSTREAM_SESSION_IDLE),
        held_calls: l.get(&HELD_CALLS),
        held_call_wait: l.get(&HELD_CALL_WAIT),
        held_calls_per_caller: l.get(&HELD_CALLS_PER_CALLER),
        listen_streams: l.get(&LISTEN_STREAMS),
        listen_streams_per_caller: l.get(&LISTEN_STREAMS_PER_CALLER),
        questions: l.get(&QUESTIONS),
        questions_per_caller: l.get(&QUESTIONS_PER_CALLER),
        session_stream_questions: l.get(&SESSION_STREAM_QUESTIONS),
        tasks: l.get(&TASKS),
        tasks_per_caller: l.get(&TASKS_PER_CALLER),
        context_requests: l.get(&CUSTOMER_CONTEXT_REQUESTS),
        context_requests_per_caller: l.get(&CUSTOMER_CONTEXT_REQUESTS_PER_CALLER),
        upstream_sessions_per_caller: l.get(&UPSTREAM_SESSIONS_PER_CALLER),
        upstream_hold_share: l.get(&UPSTREAM_HOLD_SHARE),
        introspections: l.get(&INTROSPECTIONS),
        introspections_per_caller: l.get(&INTROSPECTIONS_PER_CALLER),
        upstream_max_idle: l.get(&UPSTREAM_MAX_IDLE),
        upstream_idle_timeout: l.get(&UPSTREAM_IDLE_TIMEOUT),
        upstream_max_connections: l.get(&UPSTREAM_MAX_CONNECTIONS),
        upstream_wait: l.get(&UPSTREAM_WAIT),
        rate_limit: l.optional(&RATE_LIMIT),
        rate_burst: l.optional(&RATE_BURST),
        rate_limit_clients: l.get(&RATE_LIMIT_CLIENTS),
        tool_rate_limits: l.optional(&TOOL_RATE_LIMITS).map(Option::unwrap_or_default),
        trusted_proxies: l.optional(&TRUSTED_PROXIES).map(Option::unwrap_or_default),
    })
}

fn on_off(v: &str) -> Result<bool, Bad> {
    match v.to_ascii_lowercase().as_str() {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(Bad::Whole),
    }
}

fn connection_cap(v: &str) -> Result<ConnectionCap, Bad> {
    match v {
        "auto" => Ok(ConnectionCap::Auto),
        n => number(n).map(ConnectionCap::Fixed),
    }
}

fn tool_rates(raw: &str) -> Result<Vec<ToolRate>, Bad> {
    split_list(raw)
        .into_iter()
        .map(|entry| {
            let bad = || Bad::Entry(entry.clone());
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

fn trusted_proxies(raw: &str) -> Result<Vec<IpNet>, Bad> {
    split_list(raw)
        .into_iter()
        .map(|entry| {
            entry
                .parse::<IpNet>()
                .or_else(|_| entry.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| Bad::Entry(entry))
        })
        .collect()
}

fn bytes(n: usize) -> String {
    n.to_string()
}

settings! {
    /// The bounds on what the sidecar holds.
    pub(super) LIMITS {
        MAX_HEADER_BYTES: usize = bounded(
            "max_header_bytes",
            &["EPODE_SIDECAR_MAX_HEADER_BYTES"],
            Some("32768"),
            Accepts::whole("bytes", KIB, MIB),
            "Largest request head (request line and headers); larger gets 431 and the connection is closed.",
            number,
            |c| bytes(c.limits.max_header_bytes),
        ),
        MAX_HEADERS: usize = bounded(
            "max_headers",
            &["EPODE_SIDECAR_MAX_HEADERS"],
            Some("100"),
            Accepts::whole("", 8, 1000),
            "Most header fields in a request; more gets 431.",
            number,
            |c| c.limits.max_headers.to_string(),
        ),
        HEADER_TIMEOUT: Duration = bounded(
            "header_timeout",
            &["EPODE_SIDECAR_HEADER_TIMEOUT"],
            Some("10s"),
            Accepts::duration(AT_LEAST_1MS, A_DAY, "10s"),
            "Time a client has to send a request's head, on every listener: a new connection's first from its accept (one that sends nothing is closed then, without an answer, or at the idle timeout when that is nearer), a later one from its first byte; then 408 (when the client can still read it) and the connection is closed.",
            a_duration,
            |c| duration(c.limits.header_timeout),
        ),
        BODY_TIMEOUT: Duration = bounded(
            "body_timeout",
            &["EPODE_SIDECAR_BODY_TIMEOUT"],
            Some("30s"),
            Accepts::duration(AT_LEAST_1MS, A_DAY, "30s"),
            "Time a client has to send a request's body once its head arrived; then 408 with a JSON-RPC error and the connection is closed (on HTTP/2, once its other streams have ended).",
            a_duration,
            |c| duration(c.limits.body_timeout),
        ),
        IDLE_TIMEOUT: Duration = bounded(
            "idle_timeout",
            &["EPODE_SIDECAR_IDLE_TIMEOUT"],
            Some("60s"),
            Accepts::duration(AT_LEAST_1MS, A_DAY, "60s"),
            "How long a keep-alive connection may stay idle between requests before the sidecar closes it, and how long a client may take no part of an answer (its writes make no progress) before its connection is cut; on every listener.",
            a_duration,
            |c| duration(c.limits.idle_timeout),
        ),
        MAX_CONNECTIONS: ConnectionCap = bounded(
            "max_connections",
            &["EPODE_SIDECAR_MAX_CONNECTIONS"],
            Some("auto"),
            Accepts::whole("", 1, 1_000_000).or("auto"),
            "Most client connections open at once, on every listener together. The admin listener and the `--dev` Epode each keep a sixteenth of it (4 to 256 connections) and the MCP port has the rest, so a flood of one cannot lock out another; past its share a listener closes a new connection at once. `auto`: 80% of the process's file-descriptor limit (raised to its hard limit at start); a number above that is lowered to it, so upstream and Epode connections always have descriptors left.",
            connection_cap,
            |c| match c.limits.max_connections {
                ConnectionCap::Auto => "auto".to_owned(),
                ConnectionCap::Fixed(n) => n.to_string(),
            },
        ),
        MAX_IN_FLIGHT: usize = bounded(
            "max_in_flight",
            &["EPODE_SIDECAR_MAX_IN_FLIGHT"],
            Some("1024"),
            Accepts::whole("", 1, 1_000_000),
            "Most MCP requests being served at once; past it 503 with `Retry-After: 1` and a JSON-RPC error. With the HTTP surface on, it has as many of its own (503 with `Retry-After: 1` and a plain message past them), so neither fills the other's.",
            number,
            |c| c.limits.max_in_flight.to_string(),
        ),
        MEMORY_BUDGET_BYTES: usize = bounded(
            "memory_budget_bytes",
            &["EPODE_SIDECAR_MEMORY_BUDGET_BYTES"],
            Some("134217728"),
            Accepts::whole("bytes", MIB, 1 << 40),
            "One budget for everything the sidecar holds in memory at once (request bodies, upstream answers it must parse, SSE events it must rewrite, answers waiting for a slow client until written, Epode answers); a request that would pass it gets 503 with `Retry-After: 1`.",
            number,
            |c| bytes(c.limits.memory_budget),
        ),
        MAX_UPSTREAM_ANSWER_BYTES: usize = bounded(
            "max_upstream_answer_bytes",
            &["EPODE_SIDECAR_MAX_UPSTREAM_ANSWER_BYTES"],
            Some("16777216"),
            Accepts::whole("bytes", KIB, 1 << 40),
            "Largest upstream JSON answer the sidecar reads whole to rewrite it; larger gets 502 with the request's id.",
            number,
            |c| bytes(c.limits.max_upstream_answer),
        ),
        MAX_SSE_EVENT_BYTES: usize = bounded(
            "max_sse_event_bytes",
            &["EPODE_SIDECAR_MAX_SSE_EVENT_BYTES"],
            Some("16777216"),
            Accepts::whole("bytes", KIB, 1 << 40),
            "Largest upstream SSE event the sidecar holds to rewrite it; a larger one ends the stream with a JSON-RPC error event for the request. The same default as `max_upstream_answer_bytes`, so a result has the same limit whether it comes as JSON or as an event.",
            number,
            |c| bytes(c.limits.max_sse_event),
        ),
        UPSTREAM_SESSIONS: usize = bounded(
            "upstream_sessions",
            &["EPODE_SIDECAR_UPSTREAM_SESSIONS"],
            Some("256"),
            Accepts::whole("", 1, 100_000),
            "Most 2025-era upstream sessions kept (one per caller and capability set it declares: a verified token's subject, else the client's credentials, else its address); the least recently used is closed upstream (`DELETE`) to make room.",
            number,
            |c| c.limits.upstream_sessions.to_string(),
        ),
        UPSTREAM_SESSION_IDLE: Duration = bounded(
            "upstream_session_idle",
            &["EPODE_SIDECAR_UPSTREAM_SESSION_IDLE"],
            Some("10m"),
            Accepts::duration(AT_LEAST_1MS, Duration::MAX, "10m"),
            "A 2025-era upstream session unused this long is closed upstream (`DELETE`).",
            a_duration,
            |c| duration(c.limits.upstream_session_idle),
        ),
        HELD_CALLS: usize = bounded(
            "held_calls",
            &["EPODE_SIDECAR_HELD_CALLS"],
            Some("256"),
            Accepts::whole("", 1, 100_000),
            "Most calls of a 2025-era upstream held open while a 2026-07-28 client answers the questions the upstream asked in them (elicitation, sampling, roots, asked as `input_required`); a question past it fails its call with 503 and `Retry-After` (when the question is the call's first message; later, an error event ends its stream). Their bytes count in the memory budget.",
            number,
            |c| c.limits.held_calls.to_string(),
        ),
        HELD_CALL_WAIT: Duration = bounded(
            "held_call_wait",
            &["EPODE_SIDECAR_HELD_CALL_WAIT"],
            Some("10m"),
            Accepts::duration(Duration::from_secs(1), A_DAY, "10m"),
            "How long a held call waits for its client's retry with the answers (long enough for a person to fill in a form); then it is cancelled upstream and counted (`epode_sidecar_held_calls_expired_total`), and a late retry is told to start the call again.",
            a_duration,
            |c| duration(c.limits.held_call_wait),
        ),
        LISTEN_STREAMS: usize = bounded(
            "listen_streams",
            &["EPODE_SIDECAR_LISTEN_STREAMS"],
            Some("1024"),
            Accepts::whole("", 1, 100_000),
            "Most `subscriptions/listen` streams the sidecar serves itself in front of a 2025-era upstream (whose sessions' GET streams feed them: one per caller's session, open while one of its listeners is); past it a listen gets 503 with Retry-After. A listener that does not read 16 notices is cut.",
            number,
            |c| c.limits.listen_streams.to_string(),
        ),
        HELD_CALLS_PER_CALLER: usize = bounded(
            "held_calls_per_caller",
            &["EPODE_SIDECAR_HELD_CALLS_PER_CALLER"],
            Some("16"),
            Accepts::whole("", 1, 100_000),
            "Held calls (`held_calls`) one caller may hold at once (a caller: a verified token's subject, else the client's credentials, else its address); a question past it fails its call with 429 and `Retry-After`.",
            number,
            |c| c.limits.held_calls_per_caller.to_string(),
        ),
        LISTEN_STREAMS_PER_CALLER: usize = bounded(
            "listen_streams_per_caller",
            &["EPODE_SIDECAR_LISTEN_STREAMS_PER_CALLER"],
            Some("16"),
            Accepts::whole("", 1, 100_000),
            "Listen streams (`listen_streams`) one caller may hold open at once; past it a listen gets 429 with `Retry-After`.",
            number,
            |c| c.limits.listen_streams_per_caller.to_string(),
        ),
        QUESTIONS: usize = bounded(
            "questions",
            &["EPODE_SIDECAR_QUESTIONS"],
            Some("4096"),
            Accepts::whole("", 1, 1_000_000),
            "Most questions of a 2026-07-28 upstream (its `input_required`) asked of 2025 clients on their call's stream and not answered yet; past it the call ends with a JSON-RPC error on its stream (503 when it is the stream's first event).",
            number,
            |c| c.limits.questions.to_string(),
        ),
        QUESTIONS_PER_CALLER: usize = bounded(
            "questions_per_caller",
            &["EPODE_SIDECAR_QUESTIONS_PER_CALLER"],
            Some("64"),
            Accepts::whole("", 1, 1_000_000),
            "Questions (`questions`) one caller may have open at once; past it its call ends with a JSON-RPC error on its stream (429 when it is the stream's first event).",
            number,
            |c| c.limits.questions_per_caller.to_string(),
        ),
        SESSION_STREAM_QUESTIONS: bool = setting(
            "session_stream_questions",
            &["EPODE_SIDECAR_SESSION_STREAM_QUESTIONS"],
            Some("on"),
            "on or off",
            "Whether the sidecar reads a 2025-era HTTP upstream's session stream (its GET stream) while calls are in flight in the session, to ask the questions the server sends there (the Python SDK's `list_roots()`, or `create_message()` without `related_request_id`) of the newest call in flight whose client can answer them. The stream stays open 30 s after the last call, and keeps one of the connections `EPODE_SIDECAR_UPSTREAM_HOLD_SHARE` gives long-lived holders. `off`: only listen feeds read it, and such a question reaches no client.",
            on_off,
            |c| if c.limits.session_stream_questions { "on" } else { "off" }.to_owned(),
        ),
        TASKS: usize = bounded(
            "tasks",
            &["EPODE_SIDECAR_TASKS"],
            Some("4096"),
            Accepts::whole("", 1, 1_000_000),
            "Most tasks (a `tools/call` answered with `resultType: \"task\"`, the 2026-07-28 tasks extension) the sidecar follows at once to their terminal `tasks/get` answer, the product call's outcome (its `_agentFeedback` and its one telemetry event). A task past it, or past its caller's share, still passes untouched; it is only not followed (no event), and counted in `epode_sidecar_pool_refused_total{pool=\"tasks\"}`.",
            number,
            |c| c.limits.tasks.to_string(),
        ),
        TASKS_PER_CALLER: usize = bounded(
            "tasks_per_caller",
            &["EPODE_SIDECAR_TASKS_PER_CALLER"],
            Some("64"),
            Accepts::whole("", 1, 1_000_000),
            "Tasks (`tasks`) of one caller followed at once.",
            number,
            |c| c.limits.tasks_per_caller.to_string(),
        ),
        CUSTOMER_CONTEXT_REQUESTS: usize = bounded(
            "customer_context_requests",
            &["EPODE_SIDECAR_CUSTOMER_CONTEXT_REQUESTS"],
            Some("1024"),
            Accepts::whole("", 1, 1_000_000),
            "With customer context on: most enrichment requests to Epode in flight at once (each ends within `EPODE_SIDECAR_CUSTOMER_CONTEXT_BUDGET`). A followed call past it, or past its caller's share, gets its result as the upstream sent it, with no request made (its telemetry event recorded as any call's), counted in `epode_sidecar_customer_context_requests_total{outcome=\"shed\"}` and `epode_sidecar_pool_refused_total{pool=\"context_requests\"}`.",
            number,
            |c| c.limits.context_requests.to_string(),
        ),
        CUSTOMER_CONTEXT_REQUESTS_PER_CALLER: usize = bounded(
            "customer_context_requests_per_caller",
            &["EPODE_SIDECAR_CUSTOMER_CONTEXT_REQUESTS_PER_CALLER"],
            Some("64"),
            Accepts::whole("", 1, 1_000_000),
            "Enrichment requests (`EPODE_SIDECAR_CUSTOMER_CONTEXT_REQUESTS`) one caller's calls hold at once.",
            number,
            |c| c.limits.context_requests_per_caller.to_string(),
        ),
        UPSTREAM_SESSIONS_PER_CALLER: usize = bounded(
            "upstream_sessions_per_caller",
            &["EPODE_SIDECAR_UPSTREAM_SESSIONS_PER_CALLER"],
            Some("4"),
            Accepts::whole("", 1, 100_000),
            "2025-era upstream sessions one caller may hold (one per capability set it declares); past it the caller's own least recently used session is closed upstream (`DELETE`) to make room, never another caller's.",
            number,
            |c| c.limits.upstream_sessions_per_caller.to_string(),
        ),
        UPSTREAM_HOLD_SHARE: u8 = bounded(
            "upstream_hold_share",
            &["EPODE_SIDECAR_UPSTREAM_HOLD_SHARE"],
            Some("50%"),
            Accepts::whole("%", 1, 99),
            "The part of the MCP path's upstream connections (`upstream_max_connections`, less the HTTP surface's share) that long-lived holders may keep together: calls held for their client's answers and listen feeds' GET streams (rounded down, at least 1, never all). Calls always have the rest. Past it a question gets 503 and `Retry-After` (a listen, too). What one caller's may keep follows from its shares of held calls and sessions (`held_calls_per_caller`, `upstream_sessions_per_caller`).",
            percent,
            |c| format!("{}%", c.limits.upstream_hold_share),
        ),
        INTROSPECTIONS: usize = bounded(
            "introspections",
            &["EPODE_SIDECAR_AUTH_INTROSPECTIONS"],
            Some("32"),
            Accepts::whole("", 1, 100_000),
            "With `auth=introspect`: most introspection calls in flight at once (each a token not seen before, or past its cache time); past it 503 and `Retry-After`, the issuer not asked.",
            number,
            |c| c.limits.introspections.to_string(),
        ),
        INTROSPECTIONS_PER_CALLER: usize = bounded(
            "introspections_per_caller",
            &["EPODE_SIDECAR_AUTH_INTROSPECTIONS_PER_CALLER"],
            Some("4"),
            Accepts::whole("", 1, 100_000),
            "With `auth=introspect`: introspection calls in flight at once for one client address (trusted-proxy aware); past it 429 and `Retry-After`, so one client sending tokens never seen before cannot take them all.",
            number,
            |c| c.limits.introspections_per_caller.to_string(),
        ),
        UPSTREAM_MAX_IDLE: usize = bounded(
            "upstream_max_idle",
            &["EPODE_SIDECAR_UPSTREAM_MAX_IDLE"],
            Some("64"),
            Accepts::whole("", 0, 10_000),
            "Idle keep-alive connections to an HTTP upstream kept for reuse, per worker; past it a connection is closed when its answer ends. 0: a new connection per request.",
            number,
            |c| c.limits.upstream_max_idle.to_string(),
        ),
        UPSTREAM_IDLE_TIMEOUT: Duration = bounded(
            "upstream_idle_timeout",
            &["EPODE_SIDECAR_UPSTREAM_IDLE_TIMEOUT"],
            Some("3s"),
            Accepts::duration(AT_LEAST_1MS, A_DAY, "3s"),
            "How long a keep-alive connection to an HTTP upstream may stay idle before the sidecar closes it. Keep it below the upstream's own keep-alive timeout (uvicorn and Node: 5 s), so a request is never sent on a connection the upstream is closing; behind gunicorn (2 s) lower it, to 1s say.",
            a_duration,
            |c| duration(c.limits.upstream_idle_timeout),
        ),
        UPSTREAM_MAX_CONNECTIONS: usize = bounded(
            "upstream_max_connections",
            &["EPODE_SIDECAR_UPSTREAM_MAX_CONNECTIONS"],
            Some("256"),
            Accepts::whole("", 1, 1_000_000),
            "Most connections open to an HTTP upstream at once, all workers together (each request, and each SSE answer while it streams, holds one). A request that finds none free waits for the first its worker gets back (or room to open one; at most 32 are opened at once) up to `upstream_wait`, then gets 503 with `Retry-After: 1` and a JSON-RPC error, and nothing is sent upstream. Raise it when the upstream serves more requests at once (long tool calls).",
            number,
            |c| c.limits.upstream_max_connections.to_string(),
        ),
        UPSTREAM_WAIT: Duration = bounded(
            "upstream_wait",
            &["EPODE_SIDECAR_UPSTREAM_WAIT"],
            Some("1s"),
            Accepts::duration(Duration::ZERO, Duration::from_secs(3600), "1s"),
            "How long a request may wait for a free connection to an HTTP upstream (`upstream_max_connections`) or for room in a stdio MCP server's stdin queue (`upstream_stdin_queue`); then 503 with `Retry-After: 1` and a JSON-RPC error with its id, nothing sent. At most `upstream_timeout` (which counts the wait). 0s: 503 at once.",
            a_duration,
            |c| duration(c.limits.upstream_wait),
        ),
    }
}

settings! {
    /// The rate limits.
    pub(super) RATES {
        RATE_LIMIT: Rate = setting(
            "rate_limit",
            &["EPODE_SIDECAR_RATE_LIMIT"],
            None,
            "N/s, N/m or N/h, such as 100/s",
            "Requests per client address on the MCP path; past it 429 with `Retry-After` and a JSON-RPC error. With the HTTP surface on, the same limit holds for its requests, counted apart (429 with `Retry-After` and a plain message), so a client busy on one surface keeps its allowance on the other. Unset: no limit.",
            |r| Rate::parse(r).ok_or(Bad::Whole),
            |c| {
                c.limits
                    .rate_limit
                    .map_or_else(|| "<none>".to_owned(), |r| r.shown())
            },
        ),
        RATE_BURST: NonZeroU32 = bounded(
            "rate_burst",
            &["EPODE_SIDECAR_RATE_BURST"],
            None,
            Accepts::whole("", 1, u32::MAX as u64),
            "Requests a client address may send at once before `rate_limit` applies. Unset: the rate's count.",
            number,
            |c| {
                c.limits
                    .rate_burst
                    .map_or_else(|| "<the rate's count>".to_owned(), |b| b.to_string())
            },
        ),
        RATE_LIMIT_CLIENTS: usize = bounded(
            "rate_limit_clients",
            &["EPODE_SIDECAR_RATE_LIMIT_CLIENTS"],
            Some("100000"),
            Accepts::whole("", 1, 10_000_000),
            "Client addresses (IPv6: /64 prefixes) the per-client limit keeps track of, about 100 bytes each; past it the least recently seen is forgotten, and starts again with a full burst if it comes back (with the HTTP surface on, as many again for its own count). Each request costs the same however many clients there are.",
            number,
            |c| c.limits.rate_limit_clients.to_string(),
        ),
        TOOL_RATE_LIMITS: Vec<ToolRate> = setting(
            "tool_rate_limits",
            &["EPODE_SIDECAR_TOOL_RATE_LIMITS"],
            None,
            "comma-separated pattern=N/unit pairs, such as search=10/s,export_*=1/m",
            "Calls per tool (all clients together), by glob pattern, the first match applying; past it the call gets a tool result with `isError` that says when to retry.",
            tool_rates,
            |c| {
                c.limits
                    .tool_rate_limits
                    .iter()
                    .map(|t| format!("{}={}", t.pattern, t.rate.shown()))
                    .collect::<Vec<_>>()
                    .join(",")
            },
        ),
        TRUSTED_PROXIES: Vec<IpNet> = setting(
            "trusted_proxies",
            &["EPODE_SIDECAR_TRUSTED_PROXIES"],
            None,
            "comma-separated IP addresses or CIDR ranges, such as 10.0.0.0/8",
            "Peers whose `X-Forwarded-For` names the client address (for the rate limit). Unset: the peer address is the client.",
            trusted_proxies,
            |c| {
                c.limits
                    .trusted_proxies
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            },
        ),
    }
}
