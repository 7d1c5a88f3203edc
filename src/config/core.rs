//! The core settings (the upstream, the listener, the MCP front, logs), the first group of
//! the table, and their parsers.

use std::net::SocketAddr;
use std::time::Duration;

use url::Url;

use super::setting::{
    a_duration, boolean, bounded, duration, number, setting, settings, split_list, text, Accepts,
    Bad, AT_LEAST_1MS,
};
use super::types::{
    redact_url, HostPolicy, LogFormat, OriginPolicy, UpstreamProtocol, UpstreamTarget,
    UpstreamTransport,
};

settings! {
    /// The core settings: the upstream, the listener, the MCP front, logs.
    pub(super) CORE {
        UPSTREAM: UpstreamTarget = setting(
            "upstream",
            &["EPODE_SIDECAR_UPSTREAM"],
            None,
            "an http:// or https:// URL of the upstream MCP endpoint, such as http://127.0.0.1:8000/mcp",
            "The upstream MCP server's Streamable HTTP endpoint. Required, unless the upstream is a stdio MCP server the sidecar runs (`EPODE_SIDECAR_UPSTREAM_COMMAND`, or a command after `--`).",
            |v| parse_upstream(v).ok_or(Bad::Whole),
            |c| match &c.upstream {
                UpstreamTransport::Http(t) => redact_url(t.url.as_str()).into_owned(),
                UpstreamTransport::Stdio(_) => "<unset: the upstream is a stdio command>".to_owned(),
            },
        )
        .flag("upstream", "URL", "Upstream MCP endpoint URL"),
        LISTEN: SocketAddr = setting(
            "listen",
            &["EPODE_SIDECAR_LISTEN"],
            Some("127.0.0.1:8080"),
            "a socket address such as 127.0.0.1:8080 or [::]:8080",
            "Address to listen on.",
            |v| v.parse().map_err(|_| Bad::Whole),
            |c| c.listen.to_string(),
        )
        .flag("listen", "ADDR", "Listen address"),
        PATH: String = setting(
            "path",
            &["EPODE_SIDECAR_PATH"],
            Some("/mcp"),
            "a URL path starting with /",
            "The path clients post MCP messages to.",
            url_path,
            |c| c.path.clone(),
        )
        .flag("path", "PATH", "Path clients post to"),
        REPLICA_URL: Url = setting(
            "replica_url",
            &["EPODE_SIDECAR_REPLICA_URL"],
            None,
            "an http:// or https:// URL at which the other replicas reach this one's MCP path, such as http://10.1.2.3:8080/mcp (a Kubernetes $(POD_IP) must be defined earlier in env to be expanded)",
            "This replica's own address for the others (the chart sets it from the pod's IP). A held call's `requestState` names it, sealed; a retry that reaches another replica is forwarded there (the caller checked again there, the head within `EPODE_SIDECAR_UPSTREAM_TIMEOUT`, a replica that is gone told within a second as a call to start again). Replicas must share the product key (`EPODE_API_KEY`), which seals states. Unset: a retry must reach the replica that asked (client affinity).",
            replica_url,
            |c| c.replica_url.as_ref().map_or_else(|| "<unset: retries stay on their replica>".to_owned(), |u| u.to_string()),
        ),
        ALLOWED_ORIGINS: OriginPolicy = setting(
            "allowed_origins",
            &["EPODE_SIDECAR_ALLOWED_ORIGINS"],
            None,
            "comma-separated exact origins such as https://app.example.com, or *",
            "Origins allowed to call the sidecar (`*` for any). A request carrying another `Origin` gets 403; a request without `Origin` passes. Unset: loopback origins (`http://localhost:*`, `http://127.0.0.1:*`, `http://[::1]:*`) on a loopback listener; on any other listener every present `Origin` is refused until you list the allowed ones.",
            origins,
            |c| match &c.allowed_origins {
                OriginPolicy::Loopback => "<loopback origins>".to_owned(),
                OriginPolicy::RefuseAll => "<none: every present Origin is refused>".to_owned(),
                OriginPolicy::Any => "*".to_owned(),
                OriginPolicy::Exact(l) => l.join(","),
            },
        ),
        ALLOWED_HOSTS: HostPolicy = setting(
            "allowed_hosts",
            &["EPODE_SIDECAR_ALLOWED_HOSTS"],
            None,
            "comma-separated host names, each optionally with :port, or *",
            "`Host` values accepted, each `name` (any port) or `name:port` (`*` for any). Unset: on a loopback listener only loopback names are accepted (DNS-rebinding protection, as the official SDKs do); otherwise no `Host` check. Refusals get 403.",
            hosts,
            |c| match &c.allowed_hosts {
                HostPolicy::Loopback => "<loopback names>".to_owned(),
                HostPolicy::Any => "<no Host check>".to_owned(),
                HostPolicy::List(l) => l.join(","),
            },
        ),
        MAX_BODY_BYTES: usize = bounded(
            "max_body_bytes",
            &["EPODE_SIDECAR_MAX_BODY_BYTES"],
            Some("4194304"),
            Accepts::whole("bytes", 1, 1 << 30),
            "Largest request body; larger gets 413.",
            number,
            |c| c.max_body_bytes.to_string(),
        ),
        UPSTREAM_TIMEOUT: Duration = bounded(
            "upstream_timeout",
            &["EPODE_SIDECAR_UPSTREAM_TIMEOUT"],
            Some("30s"),
            Accepts::duration(AT_LEAST_1MS, Duration::MAX, "30s, 500ms or 2m"),
            "How long the upstream may take to begin its answer; then 504. A streamed (SSE) answer may then last as long as both ends want.",
            a_duration,
            |c| duration(c.upstream_timeout),
        ),
        UPSTREAM_PROTOCOL: UpstreamProtocol = setting(
            "upstream_protocol",
            &["EPODE_SIDECAR_UPSTREAM_PROTOCOL"],
            Some("auto"),
            "auto, 2026-07-28 or 2025-11-25",
            "The upstream's era: `auto` probes with `server/discover` (with the calling request's credentials) and falls back to the `initialize` handshake; `2026-07-28` or `2025-11-25` fix it. A stdio server that serves both eras takes the era of the first message it reads: the sidecar's readiness `ping` makes it 2025 unless this is `2026-07-28`; a server that asks its questions only in 2025 (FastMCP 4.1.6's `ctx.elicit`) needs `2025-11-25`.",
            upstream_protocol,
            |c| {
                match c.upstream_protocol {
                    UpstreamProtocol::Auto => "auto",
                    UpstreamProtocol::Modern => "2026-07-28",
                    UpstreamProtocol::Legacy => "2025-11-25",
                }
                .to_owned()
            },
        ),
        SHUTDOWN_GRACE: Duration = bounded(
            "shutdown_grace",
            &["EPODE_SIDECAR_SHUTDOWN_GRACE"],
            Some("10s"),
            Accepts::duration(Duration::ZERO, Duration::MAX, "10s, 500ms or 2m"),
            "On SIGTERM/SIGINT, how long in-flight requests may take to finish. `0s`: they are cut at once.",
            a_duration,
            |c| duration(c.shutdown_grace),
        ),
        WORKERS: usize = bounded(
            "workers",
            &["EPODE_SIDECAR_WORKERS"],
            Some("auto"),
            Accepts::whole("", 1, 256).or("auto"),
            "Server worker threads. Each serves its own connections start to finish on its own event loop, with its own upstream connection pool. `auto` is one per CPU core for an HTTP upstream, and one for a stdio upstream: that one runs on the loop that reads and writes the child's pipe, so a call never wakes another thread (a Python child is far slower than one worker). One worker always runs on the main thread's loop, beside telemetry.",
            workers,
            |c| c.workers.to_string(),
        ),
        SERVER_NAME: String = setting(
            "server_name",
            &["EPODE_SIDECAR_SERVER_NAME"],
            None,
            "a non-empty name",
            "Server name clients see instead of the upstream's (in `_meta[\"io.modelcontextprotocol/serverInfo\"]` and `initialize`).",
            text,
            |c| c.server_name.clone().unwrap_or_else(|| "<the upstream's>".into()),
        ),
        SERVER_VERSION: String = setting(
            "server_version",
            &["EPODE_SIDECAR_SERVER_VERSION"],
            None,
            "a non-empty version string",
            "Server version clients see instead of the upstream's.",
            text,
            |c| c.server_version.clone().unwrap_or_else(|| "<the upstream's>".into()),
        ),
        CACHE_TTL_MS: u64 = bounded(
            "cache_ttl_ms",
            &["EPODE_SIDECAR_CACHE_TTL_MS"],
            Some("0"),
            Accepts::whole("milliseconds", 0, u64::MAX),
            "`ttlMs` on cacheable 2026 results (`server/discover`, the four lists, `resources/read`) when the upstream gives none.",
            number,
            |c| c.cache_ttl_ms.to_string(),
        ),
        CACHE_SCOPE: &'static str = setting(
            "cache_scope",
            &["EPODE_SIDECAR_CACHE_SCOPE"],
            Some("private"),
            "private or public",
            "`cacheScope` on those results when the upstream gives none.",
            cache_scope,
            |c| c.cache_scope.to_owned(),
        ),
        LOG: String = setting(
            "log",
            &["EPODE_SIDECAR_LOG"],
            Some("info"),
            "comma-separated levels (trace, debug, info, warn, error, off) or target=level directives, such as info or epode_sidecar=debug,warn",
            "Log filter (`debug`, `epode_sidecar=debug,warn`, …). Logs go to stderr.",
            log_filter,
            |c| c.log.clone(),
        )
        .flag("log", "FILTER", "Log filter"),
        LOG_FORMAT: LogFormat = setting(
            "log_format",
            &["EPODE_SIDECAR_LOG_FORMAT"],
            Some("text"),
            "text or json",
            "`text` or `json`.",
            log_format,
            |c| {
                match c.log_format {
                    LogFormat::Text => "text",
                    LogFormat::Json => "json",
                }
                .to_owned()
            },
        )
        .flag("log-format", "FORMAT", "Log format, text or json"),
        ACCESS_LOG: bool = setting(
            "access_log",
            &["EPODE_SIDECAR_ACCESS_LOG"],
            Some("off"),
            "on or off (also true, false, 1, 0)",
            "One INFO line per request (target `epode_sidecar::access`: method, era, status, `duration_ms`), whatever `EPODE_SIDECAR_LOG` says. Off by default, as in the mesh sidecars (Envoy under Istio, linkerd2-proxy): it costs CPU on every request (measured on decorated `tools/call`: 13 % more per request at 32 concurrent calls, about 20 % at 8) and one log line per call in the pod's pipeline, while the per-request counts and durations are on `/metrics` anyway.",
            boolean,
            |c| if c.access_log { "on" } else { "off" }.to_owned(),
        ),
    }
}

fn replica_url(v: &str) -> Result<Url, Bad> {
    // `$(POD_IP)` left as written: the variable it names was not defined before it.
    if v.contains("$(") {
        return Err(Bad::Whole);
    }
    let u = Url::parse(v).map_err(|_| Bad::Whole)?;
    let ok = matches!(u.scheme(), "http" | "https")
        && u.host().is_some()
        && u.username().is_empty()
        && u.password().is_none()
        && u.query().is_none()
        && u.fragment().is_none()
        && u.as_str().len() <= 512;
    if ok {
        Ok(u)
    } else {
        Err(Bad::Whole)
    }
}

fn url_path(p: &str) -> Result<String, Bad> {
    if p.starts_with('/') && !p.contains(['?', '#', ' ']) {
        Ok(p.to_owned())
    } else {
        Err(Bad::Whole)
    }
}

fn upstream_protocol(p: &str) -> Result<UpstreamProtocol, Bad> {
    match p {
        "auto" => Ok(UpstreamProtocol::Auto),
        "2026-07-28" => Ok(UpstreamProtocol::Modern),
        "2025-11-25" => Ok(UpstreamProtocol::Legacy),
        _ => Err(Bad::Whole),
    }
}

/// `workers = auto`, before the upstream is known.
pub(super) const AUTO_WORKERS: usize = 0;

/// The workers to run: as set, or for `auto` one per CPU core (one for a stdio upstream).
pub(super) fn resolve_workers(set: usize, stdio: bool) -> usize {
    match (set, stdio) {
        (AUTO_WORKERS, true) => 1,
        (AUTO_WORKERS, false) => std::thread::available_parallelism().map_or(2, |n| n.get()),
        (n, _) => n,
    }
}

fn workers(w: &str) -> Result<usize, Bad> {
    match w {
        // Resolved once the upstream is known (`resolve_workers`).
        "auto" => Ok(AUTO_WORKERS),
        n => number(n),
    }
}

fn cache_scope(s: &str) -> Result<&'static str, Bad> {
    match s {
        "private" => Ok("private"),
        "public" => Ok("public"),
        _ => Err(Bad::Whole),
    }
}

fn log_format(f: &str) -> Result<LogFormat, Bad> {
    match f.to_ascii_lowercase().as_str() {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        _ => Err(Bad::Whole),
    }
}

/// The levels a log filter may name.
const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// A log filter: comma-separated `level` or `target=level` directives. tracing takes a bare
/// word for a target, so `verbose` would silently turn every line off: refused here.
fn log_filter(log: &str) -> Result<String, Bad> {
    let level_ok = |l: &str| LEVELS.contains(&l.trim().to_ascii_lowercase().as_str());
    let target_ok = |t: &str| {
        !t.is_empty()
            && t.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '-' | '.'))
    };
    let directive_ok = |d: &str| match d.split_once('=') {
        Some((target, level)) => target_ok(target.trim()) && level_ok(level),
        None => level_ok(d),
    };
    let ok = log
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .all(directive_ok)
        && tracing_subscriber::EnvFilter::builder().parse(log).is_ok();
    if ok {
        Ok(log.to_owned())
    } else {
        Err(Bad::Whole)
    }
}

/// `*`, or exact origins. Unset, the policy depends on the listener (`Config::read`).
fn origins(raw: &str) -> Result<OriginPolicy, Bad> {
    let list = split_list(raw);
    if list.iter().any(|o| o == "*") {
        return Ok(OriginPolicy::Any);
    }
    for o in &list {
        // An origin is scheme://host[:port] with nothing after it.
        let ok = Url::parse(o).is_ok_and(|u| {
            u.host().is_some()
                && u.path() == "/"
                && !o.ends_with('/')
                && u.query().is_none()
                && u.fragment().is_none()
                && u.username().is_empty()
        });
        if !ok {
            return Err(Bad::Entry(o.clone()));
        }
    }
    Ok(OriginPolicy::Exact(list))
}

/// `*`, or host names. Unset, the policy depends on the listener (`Config::read`).
fn hosts(raw: &str) -> Result<HostPolicy, Bad> {
    let list: Vec<String> = split_list(raw)
        .into_iter()
        .map(|h| h.to_ascii_lowercase())
        .collect();
    if list.iter().any(|h| h == "*") {
        return Ok(HostPolicy::Any);
    }
    if let Some(bad) = list.iter().find(|h| h.contains(['/', ' ', '@'])) {
        return Err(Bad::Entry(bad.clone()));
    }
    Ok(HostPolicy::List(list))
}

fn parse_upstream(raw: &str) -> Option<UpstreamTarget> {
    let url = Url::parse(raw).ok()?;
    if !matches!(url.scheme(), "http" | "https") || url.fragment().is_some() {
        return None;
    }
    let host = url.host_str()?.to_owned();
    let authority = match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host,
    };
    Some(UpstreamTarget { url, authority })
}
