//! The configuration: one table of settings (`settings`, in groups, the single source for the
//! README's settings tables and for `--check-config`), layered with figment (built-in defaults, then an
//! optional TOML file, then environment variables, then command-line flags) into a
//! `#[derive(Deserialize)]` [`RawConfig`], then checked into the typed [`Config`] by
//! `TryFrom`, so an error names the setting and what it accepts.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use figment::providers::{Format, Serialized, Toml};
use figment::Figment;
use serde::Deserialize;
use url::Url;

mod dev;
mod feedback;
mod limits;
mod settings;
mod stdio;
#[cfg(test)]
mod tests;
mod tls;

pub(crate) use self::dev::DevConfig;
use self::dev::RawDev;
pub(crate) use self::feedback::FeedbackConfig;
use self::feedback::RawFeedback;
use self::limits::RawLimits;
pub(crate) use self::limits::{ConnectionCap, Limits, Rate};
pub(crate) use self::settings::settings_markdown;
pub(crate) use self::settings::ConfigError;
use self::settings::{invalid, missing, CONFIG_FILE_ENV};
use self::stdio::RawStdio;
pub(crate) use self::stdio::{RunAs, StdioChildren, StdioCommand};
use self::tls::RawTls;
pub(crate) use self::tls::{ListenerTls, UpstreamTls};

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
pub(crate) enum Transport {
    /// A Streamable HTTP endpoint.
    Http(UpstreamTarget),
    /// A child process spoken to over stdin/stdout.
    Stdio(StdioCommand),
}

impl Transport {
    /// How logs show the upstream (a URL without its credentials, or the program the sidecar
    /// runs).
    pub(crate) fn shown(&self) -> String {
        match self {
            Transport::Http(t) => redact_userinfo(t.url.as_str()).into_owned(),
            Transport::Stdio(c) => format!("stdio: {}", c.shown()),
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
    pub(crate) upstream: Transport,
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
    /// The local trial (`--dev`), when on.
    pub(crate) dev: Option<DevConfig>,
}

/// Values given on the command line; absent ones leave the lower layers in force.
#[derive(Debug, Default, Clone)]
pub(crate) struct FlagValues {
    pub(crate) config_file: Option<PathBuf>,
    pub(crate) values: BTreeMap<&'static str, String>,
    /// A stdio MCP server's command line, as given after `--`.
    pub(crate) command: Vec<String>,
}

/// A setting's value as any layer gives it: a string (environment, flags), or a TOML string,
/// number, boolean, or list of those (a list means the comma-separated form).
#[derive(Debug, Clone)]
pub(super) struct Scalar(String);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Any {
            S(String),
            I(i64),
            F(f64),
            B(bool),
            L(Vec<Scalar>),
        }
        Ok(Scalar(match Any::deserialize(d)? {
            Any::S(s) => s,
            Any::I(i) => i.to_string(),
            Any::F(f) => f.to_string(),
            Any::B(b) => b.to_string(),
            Any::L(items) => items.into_iter().map(|s| s.0).collect::<Vec<_>>().join(","),
        }))
    }
}

/// Every setting as the merged layers give it, before it is checked.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    listen: Option<Scalar>,
    upstream: Option<Scalar>,
    path: Option<Scalar>,
    allowed_origins: Option<Scalar>,
    allowed_hosts: Option<Scalar>,
    max_body_bytes: Option<Scalar>,
    upstream_timeout: Option<Scalar>,
    upstream_protocol: Option<Scalar>,
    shutdown_grace: Option<Scalar>,
    workers: Option<Scalar>,
    server_name: Option<Scalar>,
    server_version: Option<Scalar>,
    cache_ttl_ms: Option<Scalar>,
    cache_scope: Option<Scalar>,
    api_key: Option<Scalar>,
    api_url: Option<Scalar>,
    feedback_mode: Option<Scalar>,
    feedback_enabled: Option<Scalar>,
    consent_timeout_ms: Option<Scalar>,
    feedback_timeout: Option<Scalar>,
    include_tools: Option<Scalar>,
    exclude_tools: Option<Scalar>,
    feedback_tools: Option<Scalar>,
    identity_headers: Option<Scalar>,
    max_tools: Option<Scalar>,
    telemetry_queue: Option<Scalar>,
    telemetry_batch: Option<Scalar>,
    telemetry_concurrency: Option<Scalar>,
    telemetry_flush: Option<Scalar>,
    telemetry_retry_base: Option<Scalar>,
    telemetry_shutdown: Option<Scalar>,
    log: Option<Scalar>,
    log_format: Option<Scalar>,
    max_header_bytes: Option<Scalar>,
    max_headers: Option<Scalar>,
    header_timeout: Option<Scalar>,
    body_timeout: Option<Scalar>,
    idle_timeout: Option<Scalar>,
    max_connections: Option<Scalar>,
    max_in_flight: Option<Scalar>,
    memory_budget_bytes: Option<Scalar>,
    max_upstream_answer_bytes: Option<Scalar>,
    max_sse_event_bytes: Option<Scalar>,
    upstream_sessions: Option<Scalar>,
    upstream_session_idle: Option<Scalar>,
    upstream_max_idle: Option<Scalar>,
    upstream_idle_timeout: Option<Scalar>,
    upstream_max_connections: Option<Scalar>,
    upstream_wait: Option<Scalar>,
    rate_limit: Option<Scalar>,
    rate_burst: Option<Scalar>,
    rate_limit_clients: Option<Scalar>,
    tool_rate_limits: Option<Scalar>,
    trusted_proxies: Option<Scalar>,
    tls_cert: Option<Scalar>,
    tls_key: Option<Scalar>,
    tls_reload: Option<Scalar>,
    ca_file: Option<Scalar>,
    upstream_client_cert: Option<Scalar>,
    upstream_client_key: Option<Scalar>,
    admin_listen: Option<Scalar>,
    upstream_command: Option<Scalar>,
    upstream_cwd: Option<Scalar>,
    upstream_env: Option<Scalar>,
    upstream_stop_grace: Option<Scalar>,
    upstream_restart_max_delay: Option<Scalar>,
    upstream_stdin_queue: Option<Scalar>,
    upstream_stderr_rate: Option<Scalar>,
    upstream_user: Option<Scalar>,
    stdio_children: Option<Scalar>,
    stdio_max_children: Option<Scalar>,
    stdio_child_idle: Option<Scalar>,
    dev: Option<Scalar>,
    dev_log: Option<Scalar>,
    dev_log_max_bytes: Option<Scalar>,
    /// The command line after `--` (not a layer's key).
    #[serde(skip)]
    argv: Vec<String>,
}

/// A raw value, trimmed; blank counts as unset.
pub(super) fn value(raw: Option<Scalar>) -> Option<String> {
    raw.map(|s| s.0.trim().to_owned()).filter(|s| !s.is_empty())
}

pub(super) fn required(raw: Option<Scalar>, key: &str) -> Result<String, ConfigError> {
    value(raw).ok_or_else(|| missing(key))
}

/// A required value converted by `parse`; `None` from it names the setting.
pub(super) fn parsed<T>(
    raw: Option<Scalar>,
    key: &str,
    parse: impl FnOnce(&str) -> Option<T>,
) -> Result<T, ConfigError> {
    let v = required(raw, key)?;
    parse(&v).ok_or_else(|| invalid(key, &v))
}

pub(super) fn number<T: std::str::FromStr + PartialOrd>(
    raw: Option<Scalar>,
    key: &str,
    range: std::ops::RangeInclusive<T>,
) -> Result<T, ConfigError> {
    parsed(raw, key, |v| v.parse().ok().filter(|n| range.contains(n)))
}

pub(super) fn duration_in(
    raw: Option<Scalar>,
    key: &str,
    range: std::ops::RangeInclusive<Duration>,
) -> Result<Duration, ConfigError> {
    parsed(raw, key, |v| {
        humantime::parse_duration(v)
            .ok()
            .filter(|d| range.contains(d))
    })
}

pub(super) fn any_duration(raw: Option<Scalar>, key: &str) -> Result<Duration, ConfigError> {
    duration_in(raw, key, Duration::ZERO..=Duration::MAX)
}

/// A duration of at least a millisecond: a zero timeout would fail every request.
pub(super) fn positive_duration(raw: Option<Scalar>, key: &str) -> Result<Duration, ConfigError> {
    duration_in(raw, key, Duration::from_millis(1)..=Duration::MAX)
}

/// Whether the sidecar reads the environment variable `name`: a setting's, or one of its
/// prefixes (a misspelt setting is still the operator's, and may hold a secret).
fn read_by_sidecar(name: &str) -> bool {
    name == CONFIG_FILE_ENV
        || ["EPODE_", "AGENT_FEEDBACK_"]
            .iter()
            .any(|p| name.starts_with(p))
        || settings::all().any(|s| s.env.contains(&name))
}

/// The process environment as text. A variable that is not valid UTF-8 is left out when the
/// sidecar does not read it (it may belong to anything else on the machine), and refused by
/// name when it does; its value is never shown.
pub(crate) fn text_environment<I>(vars: I) -> Result<Vec<(String, String)>, ConfigError>
where
    I: IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
{
    let mut out = Vec::new();
    for (name, value) in vars {
        match (name.into_string(), value.into_string()) {
            (Ok(name), Ok(value)) => out.push((name, value)),
            (Ok(name), Err(_)) if read_by_sidecar(&name) => {
                return Err(ConfigError::NotText { name })
            }
            // A name that is not text is no name the sidecar reads.
            _ => {}
        }
    }
    Ok(out)
}

/// A TOML error without the lines it quotes from the file (`2 | api_key = "…`), which may
/// hold a secret: the position and the reason are left.
fn without_source_lines(message: &str) -> String {
    message
        .lines()
        .filter(|l| {
            let gutter = l
                .trim_start()
                .trim_start_matches(|c: char| c.is_ascii_digit());
            !gutter.trim_start().starts_with('|')
        })
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// A URL as it may be printed: its user name and password (`http://user:pass@host`)
/// replaced by `<redacted>`. Also for text that does not parse as a URL.
pub(crate) fn redact_userinfo(raw: &str) -> std::borrow::Cow<'_, str> {
    let Some(scheme_end) = raw.find("://").map(|i| i + 3) else {
        return raw.into();
    };
    let rest = &raw[scheme_end..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{}<redacted>{}", &raw[..scheme_end], &rest[at..]).into(),
        None => raw.into(),
    }
}

pub(super) fn split_list(raw: &str) -> Vec<String> {
    raw.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

impl Config {
    /// Builds the configuration from an environment (any iterator of name/value pairs, so tests
    /// never touch the process environment) and the flags.
    pub(crate) fn from_layers<I, K, V>(env: I, flags: &FlagValues) -> Result<Config, ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let env: BTreeMap<String, String> = env
            .into_iter()
            .map(|(k, v)| (k.as_ref().to_owned(), v.as_ref().to_owned()))
            .collect();
        let defaults: BTreeMap<&str, &str> = settings::all()
            .filter_map(|s| s.default.map(|d| (s.key, d)))
            .collect();
        let mut figment = Figment::new().merge(Serialized::defaults(defaults));
        let file = flags
            .config_file
            .clone()
            .or_else(|| env.get(CONFIG_FILE_ENV).map(PathBuf::from));
        if let Some(path) = &file {
            let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
                path: path.clone(),
                message: e.to_string(),
            })?;
            check_file_keys(&text).map_err(|e| ConfigError::File {
                path: path.clone(),
                message: e.to_string(),
            })?;
            figment = figment.merge(Toml::string(&text));
        }
        // Within the environment, the documented name wins over an alias.
        let from_env: BTreeMap<&str, &String> = settings::all()
            .filter_map(|s| Some((s.key, s.env.iter().find_map(|name| env.get(*name))?)))
            .collect();
        let mut raw: RawConfig = figment
            .merge(Serialized::defaults(from_env))
            .merge(Serialized::defaults(&flags.values))
            .extract()
            .map_err(|e| ConfigError::File {
                path: file.unwrap_or_else(|| PathBuf::from("<settings>")),
                message: without_source_lines(&e.to_string()),
            })?;
        raw.argv.clone_from(&flags.command);
        let warnings = unknown_variables(&env)?;
        let mut config = Config::try_from(raw)?;
        config.warnings = warnings;
        if let Transport::Stdio(command) = &mut config.upstream {
            command.select_env(&env);
        }
        Ok(config)
    }

    /// The effective configuration as TOML, secrets redacted (`--check-config`): a value
    /// that can be fed back is a line; one that is only described (unset, derived, secret) is
    /// a comment.
    pub(crate) fn describe(&self) -> String {
        let mut out = String::new();
        for s in settings::all() {
            let value = (s.show)(self);
            let described = value.starts_with('<') && value.ends_with('>');
            let line = if s.secret && (value == "<set>" || !described) {
                format!("# {} = <set, redacted>", s.key)
            } else if described {
                format!("# {} = {value}", s.key)
            } else {
                format!("{} = {}", s.key, toml_string(&value))
            };
            out.push_str(&format!("{line:<60}  # {}\n", s.env[0]));
        }
        out
    }
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

impl RawConfig {
    fn take_tls(&mut self) -> RawTls {
        RawTls {
            tls_cert: self.tls_cert.take(),
            tls_key: self.tls_key.take(),
            tls_reload: self.tls_reload.take(),
            ca_file: self.ca_file.take(),
            upstream_client_cert: self.upstream_client_cert.take(),
            upstream_client_key: self.upstream_client_key.take(),
            admin_listen: self.admin_listen.take(),
        }
    }

    fn take_limits(&mut self) -> RawLimits {
        RawLimits {
            max_header_bytes: self.max_header_bytes.take(),
            max_headers: self.max_headers.take(),
            header_timeout: self.header_timeout.take(),
            body_timeout: self.body_timeout.take(),
            idle_timeout: self.idle_timeout.take(),
            max_connections: self.max_connections.take(),
            max_in_flight: self.max_in_flight.take(),
            memory_budget_bytes: self.memory_budget_bytes.take(),
            max_upstream_answer_bytes: self.max_upstream_answer_bytes.take(),
            max_sse_event_bytes: self.max_sse_event_bytes.take(),
            upstream_sessions: self.upstream_sessions.take(),
            upstream_session_idle: self.upstream_session_idle.take(),
            upstream_max_idle: self.upstream_max_idle.take(),
            upstream_idle_timeout: self.upstream_idle_timeout.take(),
            upstream_max_connections: self.upstream_max_connections.take(),
            upstream_wait: self.upstream_wait.take(),
            rate_limit: self.rate_limit.take(),
            rate_burst: self.rate_burst.take(),
            rate_limit_clients: self.rate_limit_clients.take(),
            tool_rate_limits: self.tool_rate_limits.take(),
            trusted_proxies: self.trusted_proxies.take(),
        }
    }

    fn take_stdio(&mut self) -> RawStdio {
        RawStdio {
            upstream: self.upstream.take(),
            upstream_command: self.upstream_command.take(),
            upstream_cwd: self.upstream_cwd.take(),
            upstream_env: self.upstream_env.take(),
            upstream_stop_grace: self.upstream_stop_grace.take(),
            upstream_restart_max_delay: self.upstream_restart_max_delay.take(),
            upstream_stdin_queue: self.upstream_stdin_queue.take(),
            upstream_stderr_rate: self.upstream_stderr_rate.take(),
            upstream_user: self.upstream_user.take(),
            stdio_children: self.stdio_children.take(),
            stdio_max_children: self.stdio_max_children.take(),
            stdio_child_idle: self.stdio_child_idle.take(),
        }
    }

    fn take_dev(&mut self) -> RawDev {
        RawDev {
            dev: self.dev.take(),
            dev_log: self.dev_log.take(),
            dev_log_max_bytes: self.dev_log_max_bytes.take(),
        }
    }

    fn take_feedback(&mut self) -> RawFeedback {
        RawFeedback {
            feedback_mode: self.feedback_mode.take(),
            feedback_enabled: self.feedback_enabled.take(),
            api_key: self.api_key.take(),
            api_url: self.api_url.take(),
            consent_timeout_ms: self.consent_timeout_ms.take(),
            feedback_timeout: self.feedback_timeout.take(),
            include_tools: self.include_tools.take(),
            exclude_tools: self.exclude_tools.take(),
            feedback_tools: self.feedback_tools.take(),
            identity_headers: self.identity_headers.take(),
            max_tools: self.max_tools.take(),
            telemetry_queue: self.telemetry_queue.take(),
            telemetry_batch: self.telemetry_batch.take(),
            telemetry_concurrency: self.telemetry_concurrency.take(),
            telemetry_flush: self.telemetry_flush.take(),
            telemetry_retry_base: self.telemetry_retry_base.take(),
            telemetry_shutdown: self.telemetry_shutdown.take(),
        }
    }
}

impl TryFrom<RawConfig> for Config {
    type Error = ConfigError;

    fn try_from(mut raw: RawConfig) -> Result<Config, ConfigError> {
        let (tls, upstream_tls, admin_listen) = tls::check(raw.take_tls())?;
        let limits = Limits::try_from_raw(raw.take_limits())?;
        let mut raw_feedback = raw.take_feedback();
        let upstream = stdio::check(raw.take_stdio(), &raw.argv)?;
        let raw_dev = raw.take_dev();
        let listen: SocketAddr = parsed(raw.listen, "listen", |v| v.parse().ok())?;
        let loopback = listen.ip().is_loopback();
        let dev = dev::check(raw_dev, listen)?;
        Ok(Config {
            warnings: Vec::new(),
            listen,
            upstream,
            limits,
            tls,
            upstream_tls,
            admin_listen,
            path: parsed(raw.path, "path", |p| {
                (p.starts_with('/') && !p.contains(['?', '#', ' '])).then(|| p.to_owned())
            })?,
            allowed_origins: origins(value(raw.allowed_origins), loopback)?,
            allowed_hosts: hosts(value(raw.allowed_hosts), loopback)?,
            max_body_bytes: number(raw.max_body_bytes, "max_body_bytes", 1..=1 << 30)?,
            upstream_timeout: positive_duration(raw.upstream_timeout, "upstream_timeout")?,
            shutdown_grace: any_duration(raw.shutdown_grace, "shutdown_grace")?,
            workers: parsed(raw.workers, "workers", |w| match w {
                "auto" => Some(std::thread::available_parallelism().map_or(2, |n| n.get())),
                n => n.parse().ok().filter(|n| (1..=256).contains(n)),
            })?,
            upstream_protocol: parsed(raw.upstream_protocol, "upstream_protocol", |p| match p {
                "auto" => Some(UpstreamProtocol::Auto),
                "2026-07-28" => Some(UpstreamProtocol::Modern),
                "2025-11-25" => Some(UpstreamProtocol::Legacy),
                _ => None,
            })?,
            server_name: value(raw.server_name),
            server_version: value(raw.server_version),
            cache_ttl_ms: number(raw.cache_ttl_ms, "cache_ttl_ms", 0..=u64::MAX)?,
            cache_scope: parsed(raw.cache_scope, "cache_scope", |s| match s {
                "private" => Some("private"),
                "public" => Some("public"),
                _ => None,
            })?,
            feedback: FeedbackConfig::try_from_raw(&mut raw_feedback, dev.is_some())?,
            dev,
            log: log_filter(required(raw.log, "log")?)?,
            log_format: parsed(raw.log_format, "log_format", |f| {
                match f.to_ascii_lowercase().as_str() {
                    "text" => Some(LogFormat::Text),
                    "json" => Some(LogFormat::Json),
                    _ => None,
                }
            })?,
        })
    }
}

/// The closest known name to `name` among `known`, with its edit distance.
fn closest<'a>(name: &str, known: impl Iterator<Item = &'a str>) -> Option<(&'a str, usize)> {
    known
        .map(|k| (k, strsim::levenshtein(name, k)))
        .min_by_key(|(_, d)| *d)
}

fn did_you_mean(closest: Option<(&str, usize)>, within: usize) -> String {
    match closest {
        Some((k, d)) if d <= within => format!("; did you mean `{k}`?"),
        _ => String::new(),
    }
}

/// Names Kubernetes puts in a pod's environment for a Service named `epode-sidecar`
/// (service links): not settings, never refused.
fn service_link(name: &str) -> bool {
    let rest = &name["EPODE_SIDECAR_".len()..];
    rest.starts_with("SERVICE_") || rest == "PORT" || rest.starts_with("PORT_")
}

/// `EPODE_SIDECAR_*` variables that are no setting: one a typo away from a setting is
/// refused (a misspelt limit must not be silently ignored); any other is a warning.
fn unknown_variables(env: &BTreeMap<String, String>) -> Result<Vec<String>, ConfigError> {
    let known = || {
        settings::all()
            .flat_map(|s| s.env.iter().copied())
            .chain(std::iter::once(CONFIG_FILE_ENV))
    };
    let mut warnings = Vec::new();
    for name in env.keys().filter(|n| n.starts_with("EPODE_SIDECAR_")) {
        if known().any(|k| k == name) || service_link(name) {
            continue;
        }
        let near = closest(name, known());
        if near.is_some_and(|(_, d)| d <= 2) {
            return Err(ConfigError::Unknown {
                what: "the environment variable",
                name: name.clone(),
                hint: did_you_mean(near, 2),
            });
        }
        warnings.push(format!(
            "the environment variable {name} is not a setting and is ignored{}",
            did_you_mean(near, 6)
        ));
    }
    Ok(warnings)
}

/// A configuration file's keys must all be settings.
fn check_file_keys(text: &str) -> Result<(), ConfigError> {
    let Ok(data) = figment::Provider::data(&Toml::string(text)) else {
        return Ok(()); // its syntax error is reported by the extraction
    };
    for key in data.values().flat_map(|dict| dict.keys()) {
        if settings::all().any(|s| s.key == key) {
            continue;
        }
        return Err(ConfigError::Unknown {
            what: "the configuration file's key",
            name: key.clone(),
            hint: did_you_mean(closest(key, settings::all().map(|s| s.key)), 6),
        });
    }
    Ok(())
}

/// The levels a log filter may name.
const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// A log filter: comma-separated `level` or `target=level` directives. tracing takes a bare
/// word for a target, so `verbose` would silently turn every line off: refused here.
fn log_filter(log: String) -> Result<String, ConfigError> {
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
        && tracing_subscriber::EnvFilter::builder().parse(&log).is_ok();
    if ok {
        Ok(log)
    } else {
        Err(invalid("log", &log))
    }
}

fn origins(raw: Option<String>, loopback: bool) -> Result<OriginPolicy, ConfigError> {
    let Some(raw) = raw else {
        return Ok(if loopback {
            OriginPolicy::Loopback
        } else {
            OriginPolicy::RefuseAll
        });
    };
    let list = split_list(&raw);
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
            return Err(invalid("allowed_origins", o));
        }
    }
    Ok(OriginPolicy::Exact(list))
}

fn hosts(raw: Option<String>, loopback: bool) -> Result<HostPolicy, ConfigError> {
    let Some(raw) = raw else {
        return Ok(if loopback {
            HostPolicy::Loopback
        } else {
            HostPolicy::Any
        });
    };
    let list: Vec<String> = split_list(&raw)
        .into_iter()
        .map(|h| h.to_ascii_lowercase())
        .collect();
    if list.iter().any(|h| h == "*") {
        return Ok(HostPolicy::Any);
    }
    if let Some(bad) = list.iter().find(|h| h.contains(['/', ' ', '@'])) {
        return Err(invalid("allowed_hosts", bad));
    }
    Ok(HostPolicy::List(list))
}

pub(super) fn parse_upstream(raw: &str) -> Option<UpstreamTarget> {
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
