//! The typed configuration and its layering: built-in defaults, then an optional TOML file, then
//! environment variables, then command-line flags (figment merges the layers; every value is
//! then parsed here, so an error names the setting and what it accepts).

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::providers::{Format, Serialized, Toml};
use figment::value::Value;
use figment::Figment;
use url::Url;

use crate::feedback::capability::{ProductKey, ProductKeyError};
use crate::feedback::identity::RefKind;
use crate::feedback::FeedbackMode;

/// One setting: its TOML key, its environment variable(s), its default and what it accepts.
#[derive(Debug)]
pub struct Setting {
    pub key: &'static str,
    /// The first name is the documented one; the others are accepted aliases.
    pub env: &'static [&'static str],
    pub default: Option<&'static str>,
    pub accepts: &'static str,
    pub help: &'static str,
    pub secret: bool,
}

const fn setting(
    key: &'static str,
    env: &'static [&'static str],
    default: Option<&'static str>,
    accepts: &'static str,
    help: &'static str,
) -> Setting {
    Setting {
        key,
        env,
        default,
        accepts,
        help,
        secret: false,
    }
}

/// Every setting the sidecar reads. README.md documents each of them (a test checks it).
pub const SETTINGS: &[Setting] = &[
    setting(
        "listen",
        &["EPODE_SIDECAR_LISTEN"],
        Some("127.0.0.1:8080"),
        "a socket address such as 127.0.0.1:8080 or [::]:8080",
        "Address the sidecar listens on.",
    ),
    setting(
        "upstream",
        &["EPODE_SIDECAR_UPSTREAM"],
        None,
        "an http:// URL of the upstream MCP endpoint, such as http://127.0.0.1:8000/mcp",
        "The upstream MCP server's Streamable HTTP endpoint (required).",
    ),
    setting(
        "path",
        &["EPODE_SIDECAR_PATH"],
        Some("/mcp"),
        "a URL path starting with /",
        "The path clients post MCP messages to.",
    ),
    setting(
        "allowed_origins",
        &["EPODE_SIDECAR_ALLOWED_ORIGINS"],
        None,
        "comma-separated exact origins such as https://app.example.com, or *",
        "Origins allowed to call the sidecar. Unset: loopback origins on a loopback listener, none otherwise. A request without Origin always passes.",
    ),
    setting(
        "allowed_hosts",
        &["EPODE_SIDECAR_ALLOWED_HOSTS"],
        None,
        "comma-separated host names, each optionally with :port",
        "Host header values accepted (DNS-rebinding protection). Unset: loopback names on a loopback listener, no check otherwise.",
    ),
    setting(
        "max_body_bytes",
        &["EPODE_SIDECAR_MAX_BODY_BYTES"],
        Some("4194304"),
        "a whole number of bytes from 1 to 1073741824",
        "Largest request body accepted; larger bodies get 413.",
    ),
    setting(
        "upstream_timeout",
        &["EPODE_SIDECAR_UPSTREAM_TIMEOUT"],
        Some("30s"),
        "a duration such as 30s, 500ms or 2m",
        "How long to wait for the upstream's response to begin; then 504.",
    ),
    setting(
        "shutdown_grace",
        &["EPODE_SIDECAR_SHUTDOWN_GRACE"],
        Some("10s"),
        "a duration such as 10s, 500ms or 2m",
        "On SIGTERM/SIGINT, how long in-flight requests may take to finish.",
    ),
    setting(
        "workers",
        &["EPODE_SIDECAR_WORKERS"],
        Some("auto"),
        "auto (one per CPU core) or a whole number from 1 to 256",
        "Server worker threads; each serves its own connections on its own event loop.",
    ),
    setting(
        "upstream_protocol",
        &["EPODE_SIDECAR_UPSTREAM_PROTOCOL"],
        Some("auto"),
        "auto, 2026-07-28 or 2025-11-25",
        "The upstream's protocol era: auto probes with server/discover and falls back to the initialize handshake.",
    ),
    setting(
        "server_name",
        &["EPODE_SIDECAR_SERVER_NAME"],
        None,
        "a non-empty name",
        "Server name reported to clients instead of the upstream's.",
    ),
    setting(
        "server_version",
        &["EPODE_SIDECAR_SERVER_VERSION"],
        None,
        "a non-empty version string",
        "Server version reported to clients instead of the upstream's.",
    ),
    setting(
        "cache_ttl_ms",
        &["EPODE_SIDECAR_CACHE_TTL_MS"],
        Some("0"),
        "a whole number of milliseconds, 0 or more",
        "ttlMs put on cacheable 2026 results when the upstream gives none.",
    ),
    setting(
        "cache_scope",
        &["EPODE_SIDECAR_CACHE_SCOPE"],
        Some("private"),
        "private or public",
        "cacheScope put on cacheable 2026 results when the upstream gives none.",
    ),
    Setting {
        key: "api_key",
        env: &["EPODE_API_KEY", "AGENT_FEEDBACK_KEY"],
        default: None,
        accepts: "an Epode product (write) key af_live_<32 hex>_[<32 hex>_]<secret of 20+ characters>",
        help: "The product key: signs feedback handles and authorises telemetry. Required unless feedback is off. Never printed.",
        secret: true,
    },
    setting(
        "api_url",
        &["EPODE_API_URL", "AGENT_FEEDBACK_URL"],
        Some("https://app.epode.ai"),
        "an https:// URL (http:// only for a loopback host)",
        "The Epode API origin.",
    ),
    setting(
        "feedback_mode",
        &["AGENT_FEEDBACK_MODE"],
        Some("never_ask"),
        "never_ask, ask_once, ask_always or off",
        "How feedback is asked for.",
    ),
    setting(
        "feedback_enabled",
        &["AGENT_FEEDBACK_ENABLED"],
        Some("true"),
        "true or false",
        "Kill switch: false is the same as AGENT_FEEDBACK_MODE=off.",
    ),
    setting(
        "consent_timeout_ms",
        &["AGENT_FEEDBACK_CONSENT_TIMEOUT_MS"],
        Some("750"),
        "a whole number of milliseconds from 1 to 60000",
        "Deadline of the background Ask-once consent-state lookup.",
    ),
    setting(
        "include_tools",
        &["EPODE_SIDECAR_INCLUDE_TOOLS"],
        None,
        "comma-separated glob patterns of tool names, such as search_*,get_order",
        "Product tools that get feedback and telemetry. Unset: all.",
    ),
    setting(
        "exclude_tools",
        &["EPODE_SIDECAR_EXCLUDE_TOOLS"],
        None,
        "comma-separated glob patterns of tool names",
        "Tools that never get feedback or telemetry (wins over the include list).",
    ),
    setting(
        "feedback_tools",
        &["EPODE_SIDECAR_FEEDBACK_TOOLS"],
        None,
        "comma-separated glob patterns of tool names",
        "Of the included tools, those whose results carry the _agentFeedback action. Unset: all included tools; the others get telemetry only.",
    ),
    setting(
        "identity_headers",
        &["EPODE_SIDECAR_IDENTITY_HEADERS"],
        None,
        "comma-separated ref=Header pairs, refs being accountRef, userRef, anonymousRef, customerRef, sessionRef",
        "Request headers, set by a trusted authenticating gateway, that carry identity references.",
    ),
    setting(
        "telemetry_queue",
        &["EPODE_SIDECAR_TELEMETRY_QUEUE"],
        Some("1000"),
        "a whole number of events from 1 to 1000000",
        "Capacity of the telemetry queue; events beyond it are dropped and counted.",
    ),
    setting(
        "telemetry_shutdown",
        &["EPODE_SIDECAR_TELEMETRY_SHUTDOWN"],
        Some("10s"),
        "a duration such as 10s, 500ms or 2m",
        "On shutdown, how long queued telemetry may take to be delivered.",
    ),
    setting(
        "log",
        &["EPODE_SIDECAR_LOG"],
        Some("info"),
        "a tracing filter such as info, debug or epode_sidecar=debug,warn",
        "Log filter.",
    ),
    setting(
        "log_format",
        &["EPODE_SIDECAR_LOG_FORMAT"],
        Some("text"),
        "text or json",
        "Log line format.",
    ),
];

/// The file named by `--config` or this variable is read as TOML, with the keys above.
pub const CONFIG_FILE_ENV: &str = "EPODE_SIDECAR_CONFIG";

fn lookup(key: &str) -> &'static Setting {
    SETTINGS
        .iter()
        .find(|s| s.key == key)
        .expect("every key read by Config::from_layers is in SETTINGS")
}

/// A setting that could not be used, naming it and what it accepts. Secret values are not shown.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{name}: `{value}` is not valid; expected {accepts}")]
    Invalid {
        name: String,
        value: String,
        accepts: &'static str,
    },
    #[error("{name} is required: {accepts}")]
    Missing { name: String, accepts: &'static str },
    #[error("configuration file {path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("configuration file {path}: unknown setting `{key}`; known settings are: {known}")]
    UnknownKey {
        path: PathBuf,
        key: String,
        known: String,
    },
}

fn display_name(s: &Setting) -> String {
    format!("{} (config key `{}`)", s.env[0], s.key)
}

fn invalid(key: &str, value: &str) -> ConfigError {
    let s = lookup(key);
    ConfigError::Invalid {
        name: display_name(s),
        value: if s.secret {
            "<redacted>".to_owned()
        } else {
            value.to_owned()
        },
        accepts: s.accepts,
    }
}

/// Which `Origin` values are accepted. A request without `Origin` always passes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OriginPolicy {
    /// `http(s)://localhost`, `127.0.0.1` or `[::1]`, any port (the default on a loopback listener).
    Loopback,
    /// Every present Origin is refused (the default on any other listener).
    RefuseAll,
    Any,
    Exact(Vec<String>),
}

/// Which `Host` values are accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPolicy {
    Loopback,
    Any,
    /// Entries are `name` (any port) or `name:port`, compared case-insensitively.
    List(Vec<String>),
}

/// Which era the upstream speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamProtocol {
    Auto,
    /// 2026-07-28.
    Modern,
    /// 2025-11-25 (the `initialize` handshake).
    Legacy,
}

/// The Epode binding's settings.
#[derive(Debug, Clone)]
pub struct FeedbackConfig {
    pub mode: FeedbackMode,
    /// Present whenever `mode` is not off.
    pub key: Option<ProductKey>,
    pub api_url: Url,
    pub consent_timeout: Duration,
    pub include: Option<ToolPatterns>,
    pub exclude: Option<ToolPatterns>,
    pub feedback_tools: Option<ToolPatterns>,
    pub identity_headers: Vec<(RefKind, http::HeaderName)>,
    pub telemetry_queue: usize,
    pub telemetry_shutdown: Duration,
}

/// Glob patterns over tool names, kept with their source text for display.
#[derive(Debug, Clone)]
pub struct ToolPatterns {
    pub set: globset::GlobSet,
    pub text: Vec<String>,
}

impl ToolPatterns {
    pub fn matches(&self, name: &str) -> bool {
        self.set.is_match(name)
    }
}

impl FeedbackConfig {
    /// Whether a tool is a product tool: telemetry, and the feedback action when `decorates`.
    pub fn includes(&self, tool: &str) -> bool {
        self.mode.is_enabled()
            && self.include.as_ref().is_none_or(|p| p.matches(tool))
            && !self.exclude.as_ref().is_some_and(|p| p.matches(tool))
    }

    pub fn decorates(&self, tool: &str) -> bool {
        self.includes(tool) && self.feedback_tools.as_ref().is_none_or(|p| p.matches(tool))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// The upstream MCP endpoint.
#[derive(Debug, Clone)]
pub struct UpstreamTarget {
    pub url: Url,
    /// `host:port` as sent in the `Host` header.
    pub authority: String,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub upstream: UpstreamTarget,
    pub path: String,
    pub allowed_origins: OriginPolicy,
    pub allowed_hosts: HostPolicy,
    pub max_body_bytes: usize,
    pub upstream_timeout: Duration,
    pub shutdown_grace: Duration,
    /// Server worker threads (each a single-threaded event loop with its own listener).
    pub workers: usize,
    pub upstream_protocol: UpstreamProtocol,
    pub server_name: Option<String>,
    pub server_version: Option<String>,
    pub cache_ttl_ms: u64,
    /// `private` or `public`.
    pub cache_scope: String,
    pub feedback: FeedbackConfig,
    pub log: String,
    pub log_format: LogFormat,
}

/// Values given on the command line; `None` leaves the lower layers in force.
#[derive(Debug, Default, Clone)]
pub struct FlagValues {
    pub config_file: Option<PathBuf>,
    pub values: BTreeMap<&'static str, String>,
}

fn value_to_string(v: &Value) -> String {
    match v {
        Value::String(_, s) => s.clone(),
        Value::Char(_, c) => c.to_string(),
        Value::Bool(_, b) => b.to_string(),
        Value::Num(_, n) => {
            if let Some(i) = n.to_i128() {
                i.to_string()
            } else if let Some(f) = n.to_f64() {
                f.to_string()
            } else {
                String::new()
            }
        }
        Value::Array(_, items) => items
            .iter()
            .map(value_to_string)
            .collect::<Vec<_>>()
            .join(","),
        Value::Dict(..) | Value::Empty(..) => String::new(),
    }
}

impl Config {
    /// Builds the configuration from an environment (any iterator of name/value pairs, so tests
    /// never touch the process environment) and the flags.
    pub fn from_layers<I, K, V>(env: I, flags: &FlagValues) -> Result<Config, ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let env: BTreeMap<String, String> = env
            .into_iter()
            .map(|(k, v)| (k.as_ref().to_owned(), v.as_ref().to_owned()))
            .collect();

        let defaults: BTreeMap<&str, &str> = SETTINGS
            .iter()
            .filter_map(|s| s.default.map(|d| (s.key, d)))
            .collect();
        let mut figment = Figment::new().merge(Serialized::defaults(defaults));

        let file = flags
            .config_file
            .clone()
            .or_else(|| env.get(CONFIG_FILE_ENV).map(PathBuf::from));
        if let Some(path) = file {
            figment = figment.merge(read_file(&path)?);
        }

        // Within the environment, the documented name wins over an alias.
        let mut from_env = BTreeMap::new();
        for s in SETTINGS {
            if let Some(v) = s.env.iter().find_map(|name| env.get(*name)) {
                from_env.insert(s.key, v.clone());
            }
        }
        figment = figment
            .merge(Serialized::defaults(from_env))
            .merge(Serialized::defaults(flags.values.clone()));

        let merged: BTreeMap<String, Value> = figment.extract().map_err(|e| ConfigError::File {
            path: PathBuf::from("<merged>"),
            message: e.to_string(),
        })?;
        let get = |key: &str| -> Option<String> {
            merged
                .get(key)
                .map(value_to_string)
                .filter(|v| !v.trim().is_empty())
        };
        let required = |key: &str| -> Result<String, ConfigError> {
            get(key).ok_or_else(|| {
                let s = lookup(key);
                ConfigError::Missing {
                    name: display_name(s),
                    accepts: s.accepts,
                }
            })
        };

        let listen_raw = required("listen")?;
        let listen: SocketAddr = listen_raw
            .trim()
            .parse()
            .map_err(|_| invalid("listen", &listen_raw))?;

        let upstream = parse_upstream(&required("upstream")?)?;

        let path = required("path")?.trim().to_owned();
        if !path.starts_with('/') || path.contains(['?', '#', ' ']) {
            return Err(invalid("path", &path));
        }

        let loopback = is_loopback_listener(listen.ip());
        let allowed_origins = match get("allowed_origins") {
            None => {
                if loopback {
                    OriginPolicy::Loopback
                } else {
                    OriginPolicy::RefuseAll
                }
            }
            Some(raw) => {
                let list = split_list(&raw);
                if list.iter().any(|o| o == "*") {
                    OriginPolicy::Any
                } else {
                    for o in &list {
                        validate_origin_entry(o).map_err(|_| invalid("allowed_origins", o))?;
                    }
                    OriginPolicy::Exact(list)
                }
            }
        };
        let allowed_hosts = match get("allowed_hosts") {
            None if loopback => HostPolicy::Loopback,
            None => HostPolicy::Any,
            Some(raw) => {
                let list: Vec<String> = split_list(&raw)
                    .into_iter()
                    .map(|h| h.to_ascii_lowercase())
                    .collect();
                if list.iter().any(|h| h == "*") {
                    HostPolicy::Any
                } else {
                    for h in &list {
                        if h.contains(['/', ' ', '@']) {
                            return Err(invalid("allowed_hosts", h));
                        }
                    }
                    HostPolicy::List(list)
                }
            }
        };

        let body_raw = required("max_body_bytes")?;
        let max_body_bytes: usize = body_raw
            .trim()
            .parse()
            .ok()
            .filter(|n| (1..=1 << 30).contains(n))
            .ok_or_else(|| invalid("max_body_bytes", &body_raw))?;

        let upstream_timeout = parse_duration("upstream_timeout", &required("upstream_timeout")?)?;
        let shutdown_grace = parse_duration("shutdown_grace", &required("shutdown_grace")?)?;

        let workers_raw = required("workers")?;
        let workers = match workers_raw.trim() {
            "auto" => std::thread::available_parallelism().map_or(2, |n| n.get()),
            n => n
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=256).contains(n))
                .ok_or_else(|| invalid("workers", &workers_raw))?,
        };
        let protocol_raw = required("upstream_protocol")?;
        let upstream_protocol = match protocol_raw.trim() {
            "auto" => UpstreamProtocol::Auto,
            "2026-07-28" => UpstreamProtocol::Modern,
            "2025-11-25" => UpstreamProtocol::Legacy,
            _ => return Err(invalid("upstream_protocol", &protocol_raw)),
        };
        let server_name = get("server_name").map(|s| s.trim().to_owned());
        let server_version = get("server_version").map(|s| s.trim().to_owned());
        let ttl_raw = required("cache_ttl_ms")?;
        let cache_ttl_ms: u64 = ttl_raw
            .trim()
            .parse()
            .map_err(|_| invalid("cache_ttl_ms", &ttl_raw))?;
        let scope_raw = required("cache_scope")?;
        let cache_scope = match scope_raw.trim() {
            s @ ("private" | "public") => s.to_owned(),
            _ => return Err(invalid("cache_scope", &scope_raw)),
        };

        let feedback = feedback_config(&get, &required)?;

        let log = required("log")?;
        if tracing_subscriber::EnvFilter::builder()
            .parse(&log)
            .is_err()
        {
            return Err(invalid("log", &log));
        }
        let log_format_raw = required("log_format")?;
        let log_format = match log_format_raw.trim().to_ascii_lowercase().as_str() {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            _ => return Err(invalid("log_format", &log_format_raw)),
        };

        Ok(Config {
            listen,
            upstream,
            path,
            allowed_origins,
            allowed_hosts,
            max_body_bytes,
            upstream_timeout,
            shutdown_grace,
            workers,
            upstream_protocol,
            server_name,
            server_version,
            cache_ttl_ms,
            cache_scope,
            feedback,
            log,
            log_format,
        })
    }

    /// The effective configuration as TOML-like lines, secrets redacted (for `--check-config`).
    pub fn describe(&self) -> String {
        let origins = match &self.allowed_origins {
            OriginPolicy::Loopback => "<loopback origins>".to_owned(),
            OriginPolicy::RefuseAll => "<none: every present Origin is refused>".to_owned(),
            OriginPolicy::Any => "*".to_owned(),
            OriginPolicy::Exact(l) => l.join(","),
        };
        let hosts = match &self.allowed_hosts {
            HostPolicy::Loopback => "<loopback names>".to_owned(),
            HostPolicy::Any => "<no Host check>".to_owned(),
            HostPolicy::List(l) => l.join(","),
        };
        let protocol = match self.upstream_protocol {
            UpstreamProtocol::Auto => "auto",
            UpstreamProtocol::Modern => "2026-07-28",
            UpstreamProtocol::Legacy => "2025-11-25",
        };
        let fb = &self.feedback;
        let globs = |p: &Option<ToolPatterns>, none: &str| {
            p.as_ref()
                .map(|p| p.text.join(","))
                .unwrap_or_else(|| none.to_owned())
        };
        let rows: [(&str, String); 27] = [
            ("listen", self.listen.to_string()),
            ("upstream", self.upstream.url.to_string()),
            ("path", self.path.clone()),
            ("allowed_origins", origins),
            ("allowed_hosts", hosts),
            ("max_body_bytes", self.max_body_bytes.to_string()),
            (
                "upstream_timeout",
                humantime::format_duration(self.upstream_timeout).to_string(),
            ),
            (
                "shutdown_grace",
                humantime::format_duration(self.shutdown_grace).to_string(),
            ),
            ("workers", self.workers.to_string()),
            ("upstream_protocol", protocol.to_owned()),
            (
                "server_name",
                self.server_name
                    .clone()
                    .unwrap_or_else(|| "<the upstream's>".into()),
            ),
            (
                "server_version",
                self.server_version
                    .clone()
                    .unwrap_or_else(|| "<the upstream's>".into()),
            ),
            ("cache_ttl_ms", self.cache_ttl_ms.to_string()),
            ("cache_scope", self.cache_scope.clone()),
            (
                "api_key",
                if fb.key.is_some() { "<set>" } else { "<unset>" }.to_owned(),
            ),
            ("api_url", fb.api_url.to_string()),
            ("feedback_mode", fb.mode.to_string()),
            ("feedback_enabled", fb.mode.is_enabled().to_string()),
            (
                "consent_timeout_ms",
                fb.consent_timeout.as_millis().to_string(),
            ),
            ("include_tools", globs(&fb.include, "<all>")),
            ("exclude_tools", globs(&fb.exclude, "<none>")),
            (
                "feedback_tools",
                globs(&fb.feedback_tools, "<all included>"),
            ),
            (
                "identity_headers",
                fb.identity_headers
                    .iter()
                    .map(|(k, h)| format!("{}={}", k.key(), h))
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            ("telemetry_queue", fb.telemetry_queue.to_string()),
            (
                "telemetry_shutdown",
                humantime::format_duration(fb.telemetry_shutdown).to_string(),
            ),
            ("log", self.log.clone()),
            (
                "log_format",
                match self.log_format {
                    LogFormat::Text => "text",
                    LogFormat::Json => "json",
                }
                .to_owned(),
            ),
        ];
        let mut out = String::new();
        for (key, value) in rows {
            let s = lookup(key);
            let shown = match (s.secret, value.as_str()) {
                (true, "<unset>") | (false, _) => value,
                (true, _) => "<set, redacted>".to_owned(),
            };
            out.push_str(&format!("{key} = {shown:?}    # {}\n", s.env[0]));
        }
        out
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

fn patterns(key: &str, raw: Option<String>) -> Result<Option<ToolPatterns>, ConfigError> {
    let Some(raw) = raw else { return Ok(None) };
    let text = split_list(&raw);
    let mut builder = globset::GlobSetBuilder::new();
    for p in &text {
        // `*` stays within one `/` segment and `**` crosses them, as the reference binding's
        // patterns do.
        let glob = globset::GlobBuilder::new(p)
            .literal_separator(true)
            .build()
            .map_err(|_| invalid(key, p))?;
        builder.add(glob);
    }
    let set = builder.build().map_err(|_| invalid(key, &raw))?;
    Ok(Some(ToolPatterns { set, text }))
}

fn feedback_config(
    get: &dyn Fn(&str) -> Option<String>,
    required: &dyn Fn(&str) -> Result<String, ConfigError>,
) -> Result<FeedbackConfig, ConfigError> {
    let mode_raw = required("feedback_mode")?;
    let mut mode: FeedbackMode = mode_raw
        .trim()
        .parse()
        .map_err(|_| invalid("feedback_mode", &mode_raw))?;
    let enabled_raw = required("feedback_enabled")?;
    match enabled_raw.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => {}
        "false" | "0" | "no" | "off" => mode = FeedbackMode::Off,
        _ => return Err(invalid("feedback_enabled", &enabled_raw)),
    }
    let key =
        match get("api_key") {
            Some(raw) => match ProductKey::parse(raw.trim()) {
                Ok(k) => Some(k),
                Err(ProductKeyError::ReadKey) => return Err(ConfigError::Invalid {
                    name: display_name(lookup("api_key")),
                    value:
                        "<redacted: a read key (af_read_…), which cannot sign or send telemetry>"
                            .to_owned(),
                    accepts: lookup("api_key").accepts,
                }),
                Err(_) => return Err(invalid("api_key", &raw)),
            },
            None => None,
        };
    if key.is_none() && mode.is_enabled() {
        let s = lookup("api_key");
        return Err(ConfigError::Missing {
            name: format!(
                "{} (or AGENT_FEEDBACK_MODE=off to run without feedback)",
                display_name(s)
            ),
            accepts: s.accepts,
        });
    }
    let url_raw = required("api_url")?;
    let api_url = Url::parse(url_raw.trim()).map_err(|_| invalid("api_url", &url_raw))?;
    let loopback = match api_url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(d)) => d == "localhost",
        None => false,
    };
    let scheme_ok = api_url.scheme() == "https" || (api_url.scheme() == "http" && loopback);
    if !scheme_ok || api_url.query().is_some() {
        return Err(invalid("api_url", &url_raw));
    }
    let timeout_raw = required("consent_timeout_ms")?;
    let consent_timeout = timeout_raw
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|n| (1..=60_000).contains(n))
        .map(Duration::from_millis)
        .ok_or_else(|| invalid("consent_timeout_ms", &timeout_raw))?;
    let mut identity_headers = Vec::new();
    if let Some(raw) = get("identity_headers") {
        for pair in split_list(&raw) {
            let (kind, header) = pair
                .split_once('=')
                .ok_or_else(|| invalid("identity_headers", &pair))?;
            let kind = RefKind::ALL
                .into_iter()
                .find(|k| k.key() == kind.trim())
                .ok_or_else(|| invalid("identity_headers", &pair))?;
            let header = http::HeaderName::from_bytes(header.trim().as_bytes())
                .map_err(|_| invalid("identity_headers", &pair))?;
            identity_headers.push((kind, header));
        }
    }
    let queue_raw = required("telemetry_queue")?;
    let telemetry_queue = queue_raw
        .trim()
        .parse::<usize>()
        .ok()
        .filter(|n| (1..=1_000_000).contains(n))
        .ok_or_else(|| invalid("telemetry_queue", &queue_raw))?;
    let telemetry_shutdown =
        parse_duration("telemetry_shutdown", &required("telemetry_shutdown")?)?;
    Ok(FeedbackConfig {
        mode,
        key,
        api_url,
        consent_timeout,
        include: patterns("include_tools", get("include_tools"))?,
        exclude: patterns("exclude_tools", get("exclude_tools"))?,
        feedback_tools: patterns("feedback_tools", get("feedback_tools"))?,
        identity_headers,
        telemetry_queue,
        telemetry_shutdown,
    })
}

fn read_file(path: &Path) -> Result<Figment, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    let table: BTreeMap<String, Value> =
        Figment::from(Toml::string(&text))
            .extract()
            .map_err(|e| ConfigError::File {
                path: path.to_owned(),
                message: e.to_string(),
            })?;
    if let Some(key) = table.keys().find(|k| !SETTINGS.iter().any(|s| s.key == *k)) {
        return Err(ConfigError::UnknownKey {
            path: path.to_owned(),
            key: key.clone(),
            known: SETTINGS
                .iter()
                .map(|s| s.key)
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    Ok(Figment::from(Toml::string(&text)))
}

fn split_list(raw: &str) -> Vec<String> {
    raw.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

fn validate_origin_entry(origin: &str) -> Result<(), ()> {
    let url = Url::parse(origin).map_err(|_| ())?;
    // An origin is scheme://host[:port] with nothing after it.
    if url.host().is_none() || url.path() != "/" || origin.ends_with('/') {
        return Err(());
    }
    if url.query().is_some() || url.fragment().is_some() || !url.username().is_empty() {
        return Err(());
    }
    Ok(())
}

fn parse_duration(key: &str, raw: &str) -> Result<Duration, ConfigError> {
    humantime::parse_duration(raw.trim()).map_err(|_| invalid(key, raw))
}

fn parse_upstream(raw: &str) -> Result<UpstreamTarget, ConfigError> {
    let url = Url::parse(raw.trim()).map_err(|_| invalid("upstream", raw))?;
    if url.scheme() != "http" || url.host_str().is_none() || url.fragment().is_some() {
        return Err(invalid("upstream", raw));
    }
    let host = url.host_str().unwrap_or_default();
    let authority = match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_owned(),
    };
    Ok(UpstreamTarget { url, authority })
}

fn is_loopback_listener(ip: IpAddr) -> bool {
    ip.is_loopback()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const UP: (&str, &str) = ("EPODE_SIDECAR_UPSTREAM", "http://127.0.0.1:8000/mcp");
    const OFF: (&str, &str) = ("AGENT_FEEDBACK_MODE", "off");
    const KEY: &str =
        "af_live_0123456789abcdef0123456789abcdef_conformance_secret_0123456789abcdef";

    #[test]
    fn defaults_apply() {
        let c = Config::from_layers(env(&[UP, OFF]), &FlagValues::default()).unwrap();
        assert_eq!(c.listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(c.path, "/mcp");
        assert_eq!(c.max_body_bytes, 4 * 1024 * 1024);
        assert_eq!(c.upstream_timeout, Duration::from_secs(30));
        assert_eq!(c.shutdown_grace, Duration::from_secs(10));
        assert_eq!(c.allowed_origins, OriginPolicy::Loopback);
        assert_eq!(c.allowed_hosts, HostPolicy::Loopback);
        assert_eq!(c.upstream.authority, "127.0.0.1:8000");
        assert_eq!(c.log_format, LogFormat::Text);
    }

    #[test]
    fn non_loopback_listener_refuses_origins_and_skips_host_check() {
        let c = Config::from_layers(
            env(&[UP, OFF, ("EPODE_SIDECAR_LISTEN", "0.0.0.0:9000")]),
            &FlagValues::default(),
        )
        .unwrap();
        assert_eq!(c.allowed_origins, OriginPolicy::RefuseAll);
        assert_eq!(c.allowed_hosts, HostPolicy::Any);
    }

    #[test]
    fn upstream_is_required_and_named() {
        let err = Config::from_layers(env(&[]), &FlagValues::default()).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("EPODE_SIDECAR_UPSTREAM"), "{msg}");
        assert!(msg.contains("http://"), "{msg}");
    }

    #[test]
    fn bad_values_name_the_setting_and_what_it_accepts() {
        for (name, value, expect) in [
            ("EPODE_SIDECAR_LISTEN", "nowhere", "socket address"),
            ("EPODE_SIDECAR_UPSTREAM_TIMEOUT", "soon", "duration"),
            ("EPODE_SIDECAR_MAX_BODY_BYTES", "-1", "whole number"),
            ("EPODE_SIDECAR_LOG_FORMAT", "xml", "text or json"),
            ("EPODE_SIDECAR_PATH", "mcp", "starting with /"),
            (
                "EPODE_SIDECAR_ALLOWED_ORIGINS",
                "example.com",
                "exact origins",
            ),
        ] {
            let err = Config::from_layers(env(&[UP, OFF, (name, value)]), &FlagValues::default())
                .unwrap_err()
                .to_string();
            assert!(err.contains(name), "{err}");
            assert!(err.contains(expect), "{err}");
        }
        let err = Config::from_layers(
            env(&[("EPODE_SIDECAR_UPSTREAM", "https://x.example/mcp"), OFF]),
            &FlagValues::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("EPODE_SIDECAR_UPSTREAM"));
    }

    #[test]
    fn layers_override_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "upstream = \"http://127.0.0.1:1/mcp\"\nmax_body_bytes = 10\npath = \"/file\"\nallowed_origins = [\"https://a.example\", \"https://b.example\"]\n",
        )
        .unwrap();
        let flags = FlagValues {
            config_file: Some(file),
            values: [("path", "/flag".to_owned())].into_iter().collect(),
        };
        let c = Config::from_layers(
            env(&[
                ("EPODE_SIDECAR_MAX_BODY_BYTES", "20"),
                ("EPODE_SIDECAR_PATH", "/env"),
                OFF,
            ]),
            &flags,
        )
        .unwrap();
        assert_eq!(c.upstream.url.as_str(), "http://127.0.0.1:1/mcp");
        assert_eq!(c.max_body_bytes, 20);
        assert_eq!(c.path, "/flag");
        assert_eq!(
            c.allowed_origins,
            OriginPolicy::Exact(vec!["https://a.example".into(), "https://b.example".into()])
        );
    }

    #[test]
    fn unknown_file_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "upstreem = \"http://127.0.0.1:1/mcp\"\n").unwrap();
        let flags = FlagValues {
            config_file: Some(file),
            ..Default::default()
        };
        let err = Config::from_layers(env(&[UP]), &flags)
            .unwrap_err()
            .to_string();
        assert!(err.contains("upstreem"), "{err}");
    }

    #[test]
    fn missing_file_is_an_error() {
        let err = Config::from_layers(
            env(&[UP, OFF, (CONFIG_FILE_ENV, "/nonexistent/epode.toml")]),
            &FlagValues::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("/nonexistent/epode.toml"), "{err}");
    }

    #[test]
    fn feedback_needs_a_key_unless_off() {
        let err = Config::from_layers(env(&[UP]), &FlagValues::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("EPODE_API_KEY") && err.contains("AGENT_FEEDBACK_MODE=off"),
            "{err}"
        );
        let c = Config::from_layers(
            env(&[
                UP,
                ("AGENT_FEEDBACK_KEY", KEY),
                ("AGENT_FEEDBACK_MODE", "ask_once"),
            ]),
            &FlagValues::default(),
        )
        .unwrap();
        assert_eq!(c.feedback.mode, FeedbackMode::AskOnce);
        assert!(c.feedback.key.is_some());
        let c = Config::from_layers(
            env(&[
                UP,
                ("EPODE_API_KEY", KEY),
                ("AGENT_FEEDBACK_ENABLED", "false"),
            ]),
            &FlagValues::default(),
        )
        .unwrap();
        assert_eq!(c.feedback.mode, FeedbackMode::Off);
    }

    #[test]
    fn bad_keys_and_urls_are_refused_without_echoing_the_key() {
        let secret = "af_live_0123456789abcdef0123456789abcdef_short";
        let err = Config::from_layers(
            env(&[UP, ("EPODE_API_KEY", secret)]),
            &FlagValues::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("EPODE_API_KEY"), "{err}");
        assert!(!err.contains("short"), "the key leaked: {err}");
        for url in ["http://epode.example.com", "ftp://x", "not a url"] {
            let err = Config::from_layers(
                env(&[UP, ("EPODE_API_KEY", KEY), ("EPODE_API_URL", url)]),
                &FlagValues::default(),
            )
            .unwrap_err()
            .to_string();
            assert!(err.contains("EPODE_API_URL"), "{err}");
        }
        Config::from_layers(
            env(&[
                UP,
                ("EPODE_API_KEY", KEY),
                ("EPODE_API_URL", "http://127.0.0.1:9/"),
            ]),
            &FlagValues::default(),
        )
        .unwrap();
    }

    #[test]
    fn tool_selection() {
        let c = Config::from_layers(
            env(&[
                UP,
                ("EPODE_API_KEY", KEY),
                ("EPODE_SIDECAR_INCLUDE_TOOLS", "browser_*,get_order"),
                ("EPODE_SIDECAR_EXCLUDE_TOOLS", "browser_internal"),
                ("EPODE_SIDECAR_FEEDBACK_TOOLS", "browser_close"),
                (
                    "EPODE_SIDECAR_IDENTITY_HEADERS",
                    "accountRef=X-Auth-Request-User",
                ),
            ]),
            &FlagValues::default(),
        )
        .unwrap();
        let f = &c.feedback;
        assert!(f.includes("browser_navigate") && !f.decorates("browser_navigate"));
        assert!(f.includes("browser_close") && f.decorates("browser_close"));
        assert!(!f.includes("browser_internal"));
        assert!(!f.includes("admin_health"));
        assert!(!f.includes("browser_a/b"), "* does not cross /");
        assert!(f.includes("get_order"));
        assert_eq!(f.identity_headers.len(), 1);
    }
}
