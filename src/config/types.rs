//! The typed configuration the rest of the sidecar reads: [`Config`] and the structs of its
//! groups. Nothing here reads a setting; the group files (`limits`, `feedback`, …) build these
//! from the declared settings, and the declarations show them back (`--check-config`). Kept
//! apart from those files so that the declarations can name `Config` without an import circle.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use url::Url;

use crate::feedback::capability::ProductKey;
use crate::feedback::identity::RefKind;
use crate::feedback::FeedbackMode;

/// Which `Origin` values are accepted. A request without `Origin` always passes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OriginPolicy {
    /// `http(s)://localhost`, `127.0.0.1` or `[::1]`, any port (the default on a loopback
    /// listener).
    Loopback,
    /// Every present Origin is refused (the default on any other listener).
    RefuseAll,
    Any,
    Exact(Vec<String>),
}

/// Which `Host` values are accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HostPolicy {
    Loopback,
    Any,
    /// Entries are `name` (any port) or `name:port`, compared case-insensitively.
    List(Vec<String>),
}

/// Which era the upstream speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UpstreamProtocol {
    Auto,
    /// 2026-07-28.
    Modern,
    /// 2025-11-25 (the `initialize` handshake).
    Legacy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

/// How the sidecar reaches the upstream MCP server.
#[derive(Debug, Clone)]
pub(crate) enum UpstreamTransport {
    /// A Streamable HTTP endpoint.
    Http(UpstreamTarget),
    /// A child process spoken to over stdin/stdout.
    Stdio(StdioCommand),
}

impl UpstreamTransport {
    /// How logs show the upstream (a URL without its credentials and query, or the program
    /// the sidecar runs).
    pub(crate) fn shown(&self) -> String {
        match self {
            UpstreamTransport::Http(t) => redact_url(t.url.as_str()).into_owned(),
            UpstreamTransport::Stdio(c) => format!("stdio: {}", c.shown()),
        }
    }
}

/// The upstream MCP endpoint.
#[derive(Debug, Clone)]
pub(crate) struct UpstreamTarget {
    pub(crate) url: Url,
    /// `host:port` as sent in the `Host` header.
    pub(crate) authority: String,
}

#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// What the operator should hear about the configuration once logging runs.
    pub(crate) warnings: Vec<String>,
    pub(crate) listen: SocketAddr,
    pub(crate) upstream: UpstreamTransport,
    pub(crate) path: String,
    pub(crate) allowed_origins: OriginPolicy,
    pub(crate) allowed_hosts: HostPolicy,
    pub(crate) max_body_bytes: usize,
    pub(crate) upstream_timeout: Duration,
    pub(crate) shutdown_grace: Duration,
    /// Server worker threads (each a single-threaded event loop with its own listener).
    pub(crate) workers: usize,
    pub(crate) upstream_protocol: UpstreamProtocol,
    pub(crate) server_name: Option<String>,
    pub(crate) server_version: Option<String>,
    pub(crate) cache_ttl_ms: u64,
    /// `private` or `public`.
    pub(crate) cache_scope: &'static str,
    pub(crate) feedback: FeedbackConfig,
    pub(crate) limits: Limits,
    /// HTTPS on the listener, when set.
    pub(crate) tls: Option<ListenerTls>,
    pub(crate) upstream_tls: UpstreamTls,
    /// The admin listener (metrics and probes), when set.
    pub(crate) admin_listen: Option<SocketAddr>,
    pub(crate) log: String,
    pub(crate) log_format: LogFormat,
    /// One access line per request (`epode_sidecar::access`), whatever `log` says.
    pub(crate) access_log: bool,
    /// Where the other replicas reach this one (a held call's retry is forwarded there).
    pub(crate) replica_url: Option<url::Url>,
    /// The local trial (`--dev`), when on.
    pub(crate) dev: Option<DevConfig>,
    /// The HTTP surface, when on.
    pub(crate) http: Option<HttpSurface>,
    /// The authorization front door, when on.
    pub(crate) auth: Option<AuthConfig>,
    /// OpenTelemetry export, when an OTLP endpoint is set.
    pub(crate) otel: Option<OtelConfig>,
}

/// OpenTelemetry export (`config/otel.rs`).
#[derive(Debug, Clone)]
pub(crate) struct OtelConfig {
    /// The OTLP/HTTP receiver's base URL, when given (`/v1/traces`, `/v1/metrics` are
    /// appended for a signal that has no endpoint of its own).
    pub(crate) endpoint: Option<url::Url>,
    /// Where spans are posted.
    pub(crate) traces_url: url::Url,
    /// Where metrics are posted; none when neither the base nor a metrics endpoint is set.
    pub(crate) metrics_url: Option<url::Url>,
    /// Finished spans waiting for export.
    pub(crate) queue: usize,
    pub(crate) timeout: Duration,
    /// How often metrics are exported; `None`: traces only.
    pub(crate) metrics_every: Option<Duration>,
    /// Whether the `/metrics` families go with the conventions' histograms.
    pub(crate) metrics_families: bool,
    /// Sent with every export (secret).
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) service_name: Option<String>,
    pub(crate) resource: Vec<(String, String)>,
    pub(crate) sampling: Sampling,
    /// More roots for an `https://` collector (`OTEL_EXPORTER_OTLP_CERTIFICATE`).
    pub(crate) ca_file: Option<std::path::PathBuf>,
}

/// The samplers the OpenTelemetry specification names (`OTEL_TRACES_SAMPLER`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Sampling {
    AlwaysOn,
    AlwaysOff,
    Ratio(f64),
    ParentOn,
    ParentOff,
    ParentRatio(f64),
}

impl Sampling {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Sampling::AlwaysOn => "always_on",
            Sampling::AlwaysOff => "always_off",
            Sampling::Ratio(_) => "traceidratio",
            Sampling::ParentOn => "parentbased_always_on",
            Sampling::ParentOff => "parentbased_always_off",
            Sampling::ParentRatio(_) => "parentbased_traceidratio",
        }
    }

    /// The ratio, for the ratio samplers.
    pub(crate) fn ratio(self) -> Option<f64> {
        match self {
            Sampling::Ratio(r) | Sampling::ParentRatio(r) => Some(r),
            _ => None,
        }
    }

    /// The same sampler with its ratio (others ignore it).
    pub(crate) fn with_ratio(self, r: f64) -> Sampling {
        match self {
            Sampling::Ratio(_) => Sampling::Ratio(r),
            Sampling::ParentRatio(_) => Sampling::ParentRatio(r),
            other => other,
        }
    }
}

/// Whether `url` names this machine (`localhost` or a loopback address): where `http://` is
/// allowed for the services the sidecar calls (Epode, an authorization server).
pub(crate) fn loopback_url(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(d)) => d == "localhost",
        None => false,
    }
}

/// How the authorization front door checks a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AuthMode {
    Off,
    /// JWT access tokens, verified with the issuer's published keys.
    Jwt,
    /// Opaque tokens, asked of the issuer's introspection endpoint (RFC 7662).
    Introspect,
}

impl AuthMode {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            AuthMode::Off => "off",
            AuthMode::Jwt => "jwt",
            AuthMode::Introspect => "introspect",
        }
    }
}

/// The authorization front door's settings, present when it is on.
#[derive(Clone)]
pub(crate) struct AuthConfig {
    pub(crate) mode: AuthMode,
    /// The issuer, exactly as tokens write `iss`.
    pub(crate) issuer: String,
    /// The canonical resource URI, which every token's `aud` must hold.
    pub(crate) resource: String,
    /// The scopes every request needs.
    pub(crate) scopes: Vec<String>,
    pub(crate) algorithms: Vec<jsonwebtoken::Algorithm>,
    pub(crate) leeway: Duration,
    /// The `typ` every JWT must carry, when set.
    pub(crate) token_type: Option<String>,
    /// The claim that becomes `userRef` and the subject the upstream is told.
    pub(crate) user_claim: String,
    /// The claim that becomes `accountRef`, when set.
    pub(crate) account_claim: Option<String>,
    pub(crate) client_id: Option<String>,
    pub(crate) client_secret: Option<String>,
    pub(crate) forward_token: bool,
    pub(crate) cache_entries: usize,
    pub(crate) keys_refresh: Duration,
    /// The longest the issuer's keys are kept, whatever their cache lifetime says.
    pub(crate) keys_max_age: Duration,
    pub(crate) fetch_timeout: Duration,
    pub(crate) documentation: Option<String>,
    /// How long an active opaque token's introspection answer is kept.
    pub(crate) introspection_cache: Duration,
    /// Whether the HTTP surface's routes are checked too.
    pub(crate) http_surface: bool,
    /// Scopes needed beyond `scopes` by the tools, prompts and resources whose names match.
    pub(crate) operation_scopes: Vec<OperationScopes>,
    /// What each scope also grants (the operator's hierarchy, already closed: a scope maps
    /// to every scope it grants, directly or through others).
    pub(crate) implies: BTreeMap<String, Vec<String>>,
    /// The `aud` values accepted besides the resource.
    pub(crate) audience: Vec<String>,
    /// Whether the sidecar serves the issuer's endpoints through its own (`auth::facade`).
    pub(crate) facade: bool,
}

/// What kind of thing an operation scope rule names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OperationKind {
    Tool,
    Prompt,
    Resource,
}

/// One rule of `auth_operation_scopes`: the names it matches and the scopes they need.
#[derive(Debug, Clone)]
pub(crate) struct OperationScopes {
    pub(crate) kind: OperationKind,
    /// As written (for `--check-config`).
    pub(crate) pattern: String,
    pub(crate) matcher: globset::GlobMatcher,
    pub(crate) scopes: Vec<String>,
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthConfig")
            .field("mode", &self.mode)
            .field("issuer", &self.issuer)
            .field("resource", &self.resource)
            .field("scopes", &self.scopes)
            .field(
                "client_secret",
                &self.client_secret.as_ref().map(|_| "<redacted>"),
            )
            .finish_non_exhaustive()
    }
}

/// Whether the HTTP surface instruments responses a shared cache may keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HttpCacheMode {
    /// Leaves them untouched.
    Safe,
    /// Instruments them, and makes them private.
    Private,
    /// Instruments a response only for a request with `Agent-Feedback-Request: 1` (cacheable
    /// or not), and advertises that on the others (Epode's `cacheMode: "request"`).
    Request,
}

/// The HTTP surface's settings, present when it is on.
#[derive(Debug, Clone)]
pub(crate) struct HttpSurface {
    /// The largest candidate response body held to instrument it.
    pub(crate) max_body: u64,
    pub(crate) cache_mode: HttpCacheMode,
    /// Path globs never instrumented, besides the defaults.
    pub(crate) exclude: Vec<String>,
    /// Where the sidecar's own routes move on the main port.
    pub(crate) operations_prefix: String,
    /// The operator's route templates, tried in order before the default operation names.
    pub(crate) routes: Vec<RouteTemplate>,
    /// The percentage of `upstream_max_connections` the surface may hold at once.
    pub(crate) upstream_share: u8,
    /// Whether instrumented responses' events carry the request's observation.
    pub(crate) request_observation: bool,
}

impl HttpSurface {
    /// The upstream connections the surface may hold of `max` (at least 2, checked where the
    /// settings meet): its share rounded down, at least 1, and at least 1 left for MCP.
    pub(crate) fn upstream_connections(&self, max: usize) -> usize {
        let share = max.saturating_mul(usize::from(self.upstream_share)) / 100;
        share.clamp(1, max.saturating_sub(1).max(1))
    }
}

/// One of the HTTP surface's route templates (`EPODE_SIDECAR_HTTP_ROUTES`), such as
/// `/users/{id}/orders/{id}`: its segments after the leading `/`, `None` for a placeholder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RouteTemplate {
    /// As the operator wrote it.
    pub(crate) written: String,
    pub(crate) segments: Vec<Option<String>>,
}

/// The longest operation Epode accepts: a template's must fit.
const OPERATION_MAX: usize = 160;

impl RouteTemplate {
    /// `/` then segments separated by `/` (one trailing `/` ignored), each a literal of
    /// `A-Z a-z 0-9 _ . -` or a placeholder `{name}` (`name` of `A-Z a-z 0-9 _`, maybe
    /// empty), its operation within Epode's 160 characters.
    pub(crate) fn parse(raw: &str) -> Option<RouteTemplate> {
        let rest = raw.strip_prefix('/')?;
        let rest = match rest.strip_suffix('/') {
            Some(r) if !r.is_empty() => r,
            _ => rest,
        };
        let segments = if rest.is_empty() {
            Vec::new()
        } else {
            rest.split('/')
                .map(template_segment)
                .collect::<Option<Vec<_>>>()?
        };
        let template = RouteTemplate {
            written: raw.to_owned(),
            segments,
        };
        (template.operation().len() <= OPERATION_MAX).then_some(template)
    }

    /// The operation a matching path is reported as: each placeholder as `:id`, as the
    /// default names every id.
    pub(crate) fn operation(&self) -> String {
        if self.segments.is_empty() {
            return "/".to_owned();
        }
        let mut out = String::new();
        for segment in &self.segments {
            out.push('/');
            out.push_str(segment.as_deref().unwrap_or(":id"));
        }
        out
    }
}

/// A literal (`Some`) or a placeholder (`None`); `None` outside when it is neither.
fn template_segment(s: &str) -> Option<Option<String>> {
    if let Some(name) = s.strip_prefix('{').and_then(|n| n.strip_suffix('}')) {
        let ok = name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        return ok.then_some(None);
    }
    let ok = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    ok.then(|| Some(s.to_owned()))
}

/// Values given on the command line; absent ones leave the lower layers in force.
#[derive(Debug, Default, Clone)]
pub(crate) struct FlagValues {
    pub(crate) config_file: Option<PathBuf>,
    pub(crate) values: BTreeMap<&'static str, String>,
    /// A stdio MCP server's command line, as given after `--`.
    pub(crate) command: Vec<String>,
}

/// A URL as it may be printed: its user name and password (`http://user:pass@host`), and its
/// query and fragment (`?api_key=…`), each replaced by `<redacted>`; the query and fragment
/// end at the first white space (the value may be followed by words). Also for text that
/// does not parse as a URL.
pub(crate) fn redact_url(raw: &str) -> std::borrow::Cow<'_, str> {
    let Some(scheme_end) = raw.find("://").map(|i| i + 3) else {
        return raw.into();
    };
    let (head, rest) = raw.split_at(scheme_end);
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, after) = rest.split_at(authority_end);
    let userinfo = authority.rfind('@');
    let query = after.find(['?', '#']);
    if userinfo.is_none() && query.is_none() {
        return raw.into();
    }
    let mut out = String::with_capacity(raw.len());
    out.push_str(head);
    match userinfo {
        Some(at) => {
            out.push_str("<redacted>");
            out.push_str(&authority[at..]);
        }
        None => out.push_str(authority),
    }
    match query {
        Some(q) => {
            let (path, tail) = after.split_at(q);
            out.push_str(path);
            out.push_str(&tail[..1]);
            out.push_str("<redacted>");
            out.push_str(&tail[tail.find(char::is_whitespace).unwrap_or(tail.len())..]);
        }
        None => out.push_str(after),
    }
    out.into()
}

/// Glob patterns over tool names, kept with their source text for display.
#[derive(Debug, Clone)]
pub(crate) struct ToolPatterns {
    pub(super) set: globset::GlobSet,
    pub(super) text: Vec<String>,
}

impl ToolPatterns {
    fn matches(&self, name: &str) -> bool {
        self.set.is_match(name)
    }
}

/// The Epode binding's settings.
#[derive(Debug, Clone)]
pub(crate) struct FeedbackConfig {
    pub(crate) mode: FeedbackMode,
    /// Present whenever `mode` is not off.
    pub(crate) key: Option<ProductKey>,
    pub(crate) api_url: Url,
    pub(crate) consent_timeout: Duration,
    /// Deadline of the feedback tools' calls to Epode.
    pub(crate) tool_timeout: Duration,
    pub(super) include: Option<ToolPatterns>,
    pub(super) exclude: Option<ToolPatterns>,
    pub(super) feedback_tools: Option<ToolPatterns>,
    pub(crate) identity_headers: Vec<(RefKind, http::HeaderName)>,
    /// Upstream tool names the catalog keeps at most.
    pub(crate) max_tools: usize,
    pub(crate) telemetry_queue: usize,
    pub(crate) telemetry_batch: usize,
    pub(crate) telemetry_concurrency: usize,
    pub(crate) telemetry_flush: Duration,
    pub(crate) telemetry_retry_base: Duration,
    pub(crate) telemetry_shutdown: Duration,
    /// Whether the sidecar looks for Epode in the upstream itself, and steps back there.
    pub(crate) upstream_epode: UpstreamEpode,
    /// Customer context's settings, when it is on.
    pub(crate) customer: Option<CustomerConfig>,
}

/// Epode's customer-context binding's settings (`EPODE_SIDECAR_CUSTOMER_CONTEXT=on`).
#[derive(Debug, Clone)]
pub(crate) struct CustomerConfig {
    /// The product tools after whose successful results context is asked for.
    pub(crate) tools: ToolPatterns,
    /// The field keys asked for (`None`: Epode's default).
    pub(crate) fields: Option<Vec<String>>,
    pub(crate) purpose: &'static str,
    /// The most a product result waits for the enrichment request.
    pub(crate) budget: Duration,
    /// Deadline of each agent-side call (inspect, consent, answers).
    pub(crate) timeout: Duration,
}

impl CustomerConfig {
    /// Whether customer context follows `tool`.
    pub(crate) fn follows(&self, tool: &str) -> bool {
        self.tools.matches(tool)
    }
}

/// What the sidecar assumes of Epode in the upstream (`EPODE_SIDECAR_UPSTREAM_EPODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UpstreamEpode {
    /// Looked for (its capabilities, its tools, its results); where found, the sidecar steps
    /// back from the binding so that no call is counted twice.
    Auto,
    /// Taken to carry none: the sidecar binds whatever the upstream says (a result already
    /// carrying `_agentFeedback` is still neither decorated again nor counted).
    None,
}

impl FeedbackConfig {
    /// The include, exclude and feedback-tools patterns as configured (for display).
    pub(super) fn pattern_texts(&self) -> [Option<String>; 3] {
        [&self.include, &self.exclude, &self.feedback_tools]
            .map(|p| p.as_ref().map(|p| p.text.join(",")))
    }

    /// Whether a tool is a product tool: telemetry, and the feedback action when `decorates`.
    pub(crate) fn includes(&self, tool: &str) -> bool {
        self.mode.is_enabled()
            && self.include.as_ref().is_none_or(|p| p.matches(tool))
            && !self.exclude.as_ref().is_some_and(|p| p.matches(tool))
    }

    pub(crate) fn decorates(&self, tool: &str) -> bool {
        self.includes(tool) && self.feedback_tools.as_ref().is_none_or(|p| p.matches(tool))
    }
}

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
    /// Calls of a 2025-era upstream held while a 2026 client answers their questions, at
    /// most, and how long each waits for the client's retry.
    pub(crate) held_calls: usize,
    pub(crate) held_call_wait: Duration,
    /// Held calls one caller may hold at once.
    pub(crate) held_calls_per_caller: usize,
    /// Most listen streams served for a 2025-era upstream, and per caller.
    pub(crate) listen_streams: usize,
    pub(crate) listen_streams_per_caller: usize,
    /// Questions asked of 2025 clients and not answered yet, and per caller.
    pub(crate) questions: usize,
    pub(crate) questions_per_caller: usize,
    /// Whether a 2025 session's GET stream is read while calls are in flight in it.
    pub(crate) session_stream_questions: bool,
    /// Tasks followed to their terminal result, at once and for one caller.
    pub(crate) tasks: usize,
    pub(crate) tasks_per_caller: usize,
    /// Customer context's enrichment requests in flight, and one caller's share of them.
    pub(crate) context_requests: usize,
    pub(crate) context_requests_per_caller: usize,
    /// 2025-era upstream sessions one caller may hold (one per capability set).
    pub(crate) upstream_sessions_per_caller: usize,
    /// The part of the upstream connections held calls and listen feeds may hold together
    /// (percent).
    pub(crate) upstream_hold_share: u8,
    /// Introspection calls in flight at once, and per client address.
    pub(crate) introspections: usize,
    pub(crate) introspections_per_caller: usize,
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

impl Limits {
    /// The upstream connections held calls and listen feeds may hold together: their share
    /// of `connections` (the MCP path's), at least 1 and never all of them.
    pub(crate) fn held_connections(&self, connections: usize) -> usize {
        let share = connections.saturating_mul(usize::from(self.upstream_hold_share)) / 100;
        share.clamp(1, connections.saturating_sub(1).max(1))
    }
}

/// Variables a child never sees, whatever the allowlist says: the sidecar's own secrets.
const NEVER_PASSED: [&str; 5] = [
    "EPODE_API_KEY",
    "AGENT_FEEDBACK_KEY",
    "EPODE_SIDECAR_*",
    // The sidecar's own collector credentials.
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_*_HEADERS",
];

/// The MCP server to run as a child process.
#[derive(Clone)]
pub(crate) struct StdioCommand {
    pub(crate) program: String,
    pub(crate) args: Vec<String>,
    pub(crate) cwd: Option<PathBuf>,
    /// The allowlist as configured (names and `*` patterns).
    pub(crate) env_allow: Vec<String>,
    /// The variables the child gets: the sidecar's own, filtered by the allowlist.
    pub(crate) env: Vec<(String, String)>,
    /// After SIGTERM, how long the child has before SIGKILL.
    pub(crate) stop_grace: Duration,
    /// The longest pause between restarts of a child that keeps exiting.
    pub(crate) restart_max_delay: Duration,
    /// Messages waiting for the child to read its stdin, at most.
    pub(crate) stdin_queue: usize,
    /// Lines of the child's stderr logged, at most; the rest are counted.
    pub(crate) stderr_rate: Rate,
    /// The user and group the child runs as (the sidecar must run as root to switch).
    pub(crate) run_as: Option<RunAs>,
    /// One child for every client, or one per client credential.
    pub(crate) children: StdioChildren,
}

/// A user and group for the child to run as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RunAs {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

/// How clients share the stdio MCP server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StdioChildren {
    /// One child process for every client (isolated by the sidecar's own ids and ownership).
    Shared,
    /// One child per client credential, at most `max` at once, each stopped after `idle`.
    PerClient { max: usize, idle: Duration },
}

impl StdioChildren {
    pub(super) fn shown(&self) -> &'static str {
        match self {
            StdioChildren::Shared => "shared",
            StdioChildren::PerClient { .. } => "per-client",
        }
    }
}

impl std::fmt::Debug for StdioCommand {
    /// Never the environment's values, nor the arguments (either may hold a credential).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StdioCommand")
            .field("program", &self.program)
            .field("args", &self.args.len())
            .field("cwd", &self.cwd)
            .field("env", &self.env.iter().map(|(k, _)| k).collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl StdioCommand {
    /// How logs and `--check-config` show it: the program and how many arguments.
    pub(crate) fn shown(&self) -> String {
        match self.args.len() {
            0 => self.program.clone(),
            1 => format!("{} (and 1 argument)", self.program),
            n => format!("{} (and {n} arguments)", self.program),
        }
    }

    /// Keeps the variables of `env` the allowlist names, never the sidecar's secrets.
    pub(super) fn select_env(&mut self, env: &BTreeMap<String, String>) {
        let allowed = globs(&self.env_allow);
        let never = globs(&NEVER_PASSED.map(str::to_owned));
        self.env = env
            .iter()
            .filter(|(k, _)| allowed.is_match(k.as_str()) && !never.is_match(k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
    }
}

fn globs(patterns: &[String]) -> globset::GlobSet {
    let mut set = globset::GlobSetBuilder::new();
    for p in patterns {
        if let Ok(g) = globset::GlobBuilder::new(p)
            .literal_separator(false)
            .build()
        {
            set.add(g);
        }
    }
    set.build().unwrap_or_else(|_| globset::GlobSet::empty())
}

/// The listener's certificate and key (PEM files), reloaded when they change.
#[derive(Debug, Clone)]
pub(crate) struct ListenerTls {
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
    /// How often the files are checked for a change (SIGHUP reloads at once).
    pub(crate) reload_every: Duration,
}

/// How the sidecar verifies an `https://` upstream, and what it presents to it.
#[derive(Debug, Clone, Default)]
pub(crate) struct UpstreamTls {
    /// Extra trusted roots (PEM), besides the system's.
    pub(crate) ca_file: Option<PathBuf>,
    /// A client certificate and key (PEM) for upstreams that ask for one.
    pub(crate) client_cert: Option<(PathBuf, PathBuf)>,
}

/// The local trial's settings, present when `--dev` is on.
#[derive(Debug, Clone)]
pub(crate) struct DevConfig {
    /// Where what the embedded Epode receives is appended, as JSON lines.
    pub(crate) log: PathBuf,
    /// The file stops growing past this size (a warning says so once).
    pub(crate) log_max_bytes: u64,
}
