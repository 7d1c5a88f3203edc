//! The settings table: every setting's key, environment variables, default, what it accepts,
//! what it does and how its effective value is shown. It is the one source for the README's
//! settings table (`--settings-markdown`), `--check-config` and the errors that name a
//! setting.

use std::path::PathBuf;
use std::time::Duration;

use super::{Config, HostPolicy, LogFormat, OriginPolicy, UpstreamProtocol};

/// One setting: its TOML key, its environment variable(s), its default, what it accepts, what
/// it does, and how its effective value is shown.
pub(crate) struct Setting {
    pub(crate) key: &'static str,
    /// The first name is the documented one; the others are accepted aliases.
    pub(crate) env: &'static [&'static str],
    pub(crate) default: Option<&'static str>,
    pub(crate) accepts: &'static str,
    pub(crate) help: &'static str,
    pub(crate) secret: bool,
    pub(super) show: fn(&Config) -> String,
}

pub(super) const fn setting(
    key: &'static str,
    env: &'static [&'static str],
    default: Option<&'static str>,
    accepts: &'static str,
    help: &'static str,
    show: fn(&Config) -> String,
) -> Setting {
    Setting {
        key,
        env,
        default,
        accepts,
        help,
        secret: false,
        show,
    }
}

pub(super) fn duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// The core settings: the upstream, the listener, the MCP front, logs.
pub(super) const CORE: &[Setting] = &[
    setting(
        "upstream",
        &["EPODE_SIDECAR_UPSTREAM"],
        None,
        "an http:// or https:// URL of the upstream MCP endpoint, such as http://127.0.0.1:8000/mcp",
        "The upstream MCP server's Streamable HTTP endpoint. Required, unless the upstream is a stdio MCP server the sidecar runs (`EPODE_SIDECAR_UPSTREAM_COMMAND`, or a command after `--`).",
        |c| match &c.upstream {
            super::Transport::Http(t) => super::redact_userinfo(t.url.as_str()).into_owned(),
            super::Transport::Stdio(_) => "<unset: the upstream is a stdio command>".to_owned(),
        },
    ),
    setting(
        "listen",
        &["EPODE_SIDECAR_LISTEN"],
        Some("127.0.0.1:8080"),
        "a socket address such as 127.0.0.1:8080 or [::]:8080",
        "Address to listen on.",
        |c| c.listen.to_string(),
    ),
    setting(
        "path",
        &["EPODE_SIDECAR_PATH"],
        Some("/mcp"),
        "a URL path starting with /",
        "The path clients post MCP messages to.",
        |c| c.path.clone(),
    ),
    setting(
        "allowed_origins",
        &["EPODE_SIDECAR_ALLOWED_ORIGINS"],
        None,
        "comma-separated exact origins such as https://app.example.com, or *",
        "Origins allowed to call the sidecar (`*` for any). A request carrying another `Origin` gets 403; a request without `Origin` passes. Unset: loopback origins (`http://localhost:*`, `http://127.0.0.1:*`, `http://[::1]:*`) on a loopback listener; on any other listener every present `Origin` is refused until you list the allowed ones.",
        |c| match &c.allowed_origins {
            OriginPolicy::Loopback => "<loopback origins>".to_owned(),
            OriginPolicy::RefuseAll => "<none: every present Origin is refused>".to_owned(),
            OriginPolicy::Any => "*".to_owned(),
            OriginPolicy::Exact(l) => l.join(","),
        },
    ),
    setting(
        "allowed_hosts",
        &["EPODE_SIDECAR_ALLOWED_HOSTS"],
        None,
        "comma-separated host names, each optionally with :port, or *",
        "`Host` values accepted, each `name` (any port) or `name:port` (`*` for any). Unset: on a loopback listener only loopback names are accepted (DNS-rebinding protection, as the official SDKs do); otherwise no `Host` check. Refusals get 403.",
        |c| match &c.allowed_hosts {
            HostPolicy::Loopback => "<loopback names>".to_owned(),
            HostPolicy::Any => "<no Host check>".to_owned(),
            HostPolicy::List(l) => l.join(","),
        },
    ),
    setting(
        "max_body_bytes",
        &["EPODE_SIDECAR_MAX_BODY_BYTES"],
        Some("4194304"),
        "a whole number of bytes from 1 to 1073741824",
        "Largest request body; larger gets 413.",
        |c| c.max_body_bytes.to_string(),
    ),
    setting(
        "upstream_timeout",
        &["EPODE_SIDECAR_UPSTREAM_TIMEOUT"],
        Some("30s"),
        "a duration of at least 1ms, such as 30s, 500ms or 2m",
        "How long the upstream may take to begin its answer; then 504. A streamed (SSE) answer may then last as long as both ends want.",
        |c| duration(c.upstream_timeout),
    ),
    setting(
        "upstream_protocol",
        &["EPODE_SIDECAR_UPSTREAM_PROTOCOL"],
        Some("auto"),
        "auto, 2026-07-28 or 2025-11-25",
        "The upstream's era: `auto` probes with `server/discover` (with the calling request's credentials) and falls back to the `initialize` handshake; `2026-07-28` or `2025-11-25` fix it.",
        |c| {
            match c.upstream_protocol {
                UpstreamProtocol::Auto => "auto",
                UpstreamProtocol::Modern => "2026-07-28",
                UpstreamProtocol::Legacy => "2025-11-25",
            }
            .to_owned()
        },
    ),
    setting(
        "shutdown_grace",
        &["EPODE_SIDECAR_SHUTDOWN_GRACE"],
        Some("10s"),
        "a duration such as 10s, 500ms or 2m",
        "On SIGTERM/SIGINT, how long in-flight requests may take to finish. `0s`: they are cut at once.",
        |c| duration(c.shutdown_grace),
    ),
    setting(
        "workers",
        &["EPODE_SIDECAR_WORKERS"],
        Some("auto"),
        "auto (one per CPU core) or a whole number from 1 to 256",
        "Server worker threads, `auto` being one per CPU core. Each serves its own connections start to finish on its own event loop, with its own upstream connection pool.",
        |c| c.workers.to_string(),
    ),
    setting(
        "server_name",
        &["EPODE_SIDECAR_SERVER_NAME"],
        None,
        "a non-empty name",
        "Server name clients see instead of the upstream's (in `_meta[\"io.modelcontextprotocol/serverInfo\"]` and `initialize`).",
        |c| c.server_name.clone().unwrap_or_else(|| "<the upstream's>".into()),
    ),
    setting(
        "server_version",
        &["EPODE_SIDECAR_SERVER_VERSION"],
        None,
        "a non-empty version string",
        "Server version clients see instead of the upstream's.",
        |c| c.server_version.clone().unwrap_or_else(|| "<the upstream's>".into()),
    ),
    setting(
        "cache_ttl_ms",
        &["EPODE_SIDECAR_CACHE_TTL_MS"],
        Some("0"),
        "a whole number of milliseconds, 0 or more",
        "`ttlMs` on cacheable 2026 results (`server/discover`, the four lists, `resources/read`) when the upstream gives none.",
        |c| c.cache_ttl_ms.to_string(),
    ),
    setting(
        "cache_scope",
        &["EPODE_SIDECAR_CACHE_SCOPE"],
        Some("private"),
        "private or public",
        "`cacheScope` on those results when the upstream gives none.",
        |c| c.cache_scope.to_owned(),
    ),
    setting(
        "log",
        &["EPODE_SIDECAR_LOG"],
        Some("info"),
        "comma-separated levels (trace, debug, info, warn, error, off) or target=level directives, such as info or epode_sidecar=debug,warn",
        "Log filter (`debug`, `epode_sidecar=debug,warn`, …). Logs go to stderr.",
        |c| c.log.clone(),
    ),
    setting(
        "log_format",
        &["EPODE_SIDECAR_LOG_FORMAT"],
        Some("text"),
        "text or json",
        "`text` or `json`.",
        |c| {
            match c.log_format {
                LogFormat::Text => "text",
                LogFormat::Json => "json",
            }
            .to_owned()
        },
    ),
];

/// The file named by `--config` or this variable is read as TOML, with the keys above.
pub(crate) const CONFIG_FILE_ENV: &str = "EPODE_SIDECAR_CONFIG";

/// Every setting the sidecar reads, in groups, in the order the README lists them.
pub(super) const GROUPS: &[(&str, &[Setting])] = &[
    ("Upstream, listener and MCP front", CORE),
    ("A stdio upstream", super::stdio::STDIO),
    ("Limits", super::limits::LIMITS),
    ("TLS and the admin listener", super::tls::TLS),
    ("Rate limits", super::limits::RATES),
    ("Epode feedback", super::feedback::FEEDBACK),
    ("The local trial (--dev)", super::dev::DEV),
];

/// Every setting.
pub(super) fn all() -> impl Iterator<Item = &'static Setting> {
    GROUPS.iter().flat_map(|(_, group)| group.iter())
}

pub(super) fn lookup(key: &str) -> &'static Setting {
    all()
        .find(|s| s.key == key)
        .unwrap_or_else(|| unreachable!("every key the configuration reads is a setting"))
}

fn markdown_row(s: &Setting) -> String {
    let mut variable = format!("`{}`", s.env[0]);
    if s.env.len() > 1 {
        let aliases: Vec<String> = s.env[1..].iter().map(|e| format!("`{e}`")).collect();
        variable.push_str(&format!(" (or {})", aliases.join(", ")));
    }
    let default = match s.default {
        Some(d) => format!("`{d}`"),
        None if s.key == "upstream" => "(required, or a command)".to_owned(),
        None => "unset".to_owned(),
    };
    format!(
        "| {variable} | `{}` | {default} | {} Accepts {}. |\n",
        s.key, s.help, s.accepts
    )
}

/// The README's settings tables, one per group, generated from the settings
/// (`--settings-markdown`).
pub(crate) fn settings_markdown() -> String {
    let mut out = String::new();
    for (title, group) in GROUPS {
        out.push_str(&format!(
            "\n#### {title}\n\n| Variable | Key | Default | Meaning |\n|---|---|---|---|\n"
        ));
        for s in group.iter() {
            out.push_str(&markdown_row(s));
        }
    }
    out.push_str(&format!(
        "\nAnd `{CONFIG_FILE_ENV}` (or `--config FILE`): a TOML file with the keys above. Unknown keys are refused.\n"
    ));
    out
}

/// A setting that could not be used, naming it and what it accepts. Secret values are not shown.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfigError {
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
    #[error("the environment variable {name} is not valid UTF-8 text (its value is not shown); set it to text or unset it")]
    NotText { name: String },
    #[error("{what} `{name}` is not a setting{hint}")]
    Unknown {
        what: &'static str,
        name: String,
        hint: String,
    },
}

pub(super) fn display_name(s: &Setting) -> String {
    format!("{} (config key `{}`)", s.env[0], s.key)
}

pub(super) fn invalid(key: &str, value: &str) -> ConfigError {
    let s = lookup(key);
    ConfigError::Invalid {
        name: display_name(s),
        value: if s.secret {
            "<redacted>".to_owned()
        } else {
            super::redact_userinfo(value).into_owned()
        },
        accepts: s.accepts,
    }
}

pub(super) fn missing(key: &str) -> ConfigError {
    let s = lookup(key);
    ConfigError::Missing {
        name: display_name(s),
        accepts: s.accepts,
    }
}
