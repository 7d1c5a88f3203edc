//! The configuration: a table of settings, each declared once (`setting::Setting`: key,
//! environment variables, default, what it accepts (for a bounded value, its bounds, which
//! are both the check and the text), README text, parser, and how `--check-config` shows it),
//! in groups (`core`, `stdio`, `limits`, `tls`, `feedback`, `http`, `dev`), the one source of
//! the README's settings tables, `--check-config`, the errors that name a setting, and the
//! probe's address (`healthcheck`); `chart_tests` holds the Helm chart to it. The layers
//! (built-in defaults, then an optional TOML file, then environment variables, then
//! command-line flags) are merged into one map of strings by key ([`Layers`]); each group then
//! reads its typed struct from it through its declarations, so an error names the setting and
//! what it accepts, and never shows a product key. Settings that depend on each other are
//! checked here, where they meet (only when each has parsed), and so are the variables that
//! are no setting. Reading goes on past a mistake, so every one is reported at once
//! ([`ConfigErrors`]), in the order the settings are declared.
//!
//! Imports inside `config/` go one way: `types` (the typed structs) ← `setting` ← the group
//! files ← this file.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

mod auth;
#[cfg(test)]
mod chart_tests;
mod core;
mod dev;
mod feedback;
mod http;
mod limits;
mod otel;
mod setting;
mod stdio;
#[cfg(test)]
mod tests;
mod tls;
mod types;

use self::setting::{read_all, Doc, Layers, Place, Refused};
pub(crate) use self::setting::{ConfigError, ConfigErrors};
pub(crate) use self::types::{
    redact_url, AuthConfig, AuthMode, Config, ConnectionCap, CustomerConfig, DevConfig,
    FeedbackConfig, FlagValues, HostPolicy, HttpCacheMode, HttpSurface, Limits, ListenerTls,
    LogFormat, OperationKind, OriginPolicy, OtelConfig, Rate, RouteTemplate, RunAs, Sampling,
    StdioChildren, StdioCommand, UpstreamEpode, UpstreamProtocol, UpstreamTarget, UpstreamTls,
    UpstreamTransport,
};

/// An `auth_operation_scopes` value read, for other modules' tests.
#[cfg(test)]
pub(crate) fn tests_support_operation_scopes(raw: &str) -> Vec<types::OperationScopes> {
    auth::operation_scopes(raw).unwrap_or_default()
}

/// The file named by `--config` or this variable is read as TOML, with the settings' keys.
pub(crate) const CONFIG_FILE_ENV: &str = "EPODE_SIDECAR_CONFIG";

/// The settings that are also command-line flags, in the order `--help` lists them; each
/// declares its flag (`.flag(…)` or `.switch(…)`), and [`FlagValues`] holds them by key.
pub(crate) const FLAGS: [&Doc; 6] = [
    &core::LISTEN.doc,
    &core::UPSTREAM.doc,
    &core::PATH.doc,
    &core::LOG.doc,
    &core::LOG_FORMAT.doc,
    &dev::DEV.doc,
];

/// Every setting the sidecar reads, in groups, in the order the README lists them.
const GROUPS: &[(&str, &[&Doc])] = &[
    ("Upstream, listener and MCP front", core::CORE),
    ("A stdio upstream", stdio::STDIO),
    ("Limits", limits::LIMITS),
    ("TLS and the admin listener", tls::TLS),
    ("Rate limits", limits::RATES),
    ("Epode feedback", feedback::FEEDBACK),
    ("The HTTP surface", http::HTTP),
    ("Authorization (the MCP front door)", auth::AUTH_GROUP),
    ("OpenTelemetry (traces and metrics over OTLP)", otel::OTEL),
    ("The local trial (--dev)", dev::TRIAL),
];

/// Every setting.
fn all() -> impl Iterator<Item = &'static Doc> {
    GROUPS.iter().flat_map(|(_, group)| group.iter().copied())
}

fn markdown_row(s: &Doc) -> String {
    let mut variable = format!("`{}`", s.env[0]);
    if s.env.len() > 1 {
        let aliases: Vec<String> = s.env[1..].iter().map(|e| format!("`{e}`")).collect();
        variable.push_str(&format!(" (or {})", aliases.join(", ")));
    }
    let default = match s.default {
        Some(d) => format!("`{d}`"),
        None if s.key == core::UPSTREAM.doc.key => "(required, or a command)".to_owned(),
        None => "unset".to_owned(),
    };
    format!(
        "| {variable} | `{}` | {default} | {} Accepts {}. |\n",
        s.key,
        s.help,
        s.accepts.text()
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
        for s in group.iter().copied() {
            out.push_str(&markdown_row(s));
        }
    }
    out.push_str(&format!(
        "\nAnd `{CONFIG_FILE_ENV}` (or `--config FILE`): a TOML file with the keys above. Unknown keys are refused.\n"
    ));
    out
}

/// Whether the sidecar reads the environment variable `name`: a setting's, or one of its
/// prefixes (a misspelt setting is still the operator's, and may hold a secret).
fn read_by_sidecar(name: &str) -> bool {
    name == CONFIG_FILE_ENV
        || ["EPODE_", "AGENT_FEEDBACK_"]
            .iter()
            .any(|p| name.starts_with(p))
        || all().any(|s| s.env.contains(&name))
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

/// A file value as the settings read it: a string, number or boolean as its text, a list as
/// the comma-separated form; `None` for a table or a date.
fn scalar(value: &toml::Value) -> Option<String> {
    Some(match value {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Float(f) => f.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        toml::Value::Array(items) => items
            .iter()
            .map(scalar)
            .collect::<Option<Vec<_>>>()?
            .join(","),
        toml::Value::Datetime(_) | toml::Value::Table(_) => return None,
    })
}

/// The configuration file's settings; its keys must all be settings (each that is not is
/// listed, and the others are read). A file that cannot be read or parsed, or with a value
/// that is no scalar, is refused whole: the settings are then not judged without it.
fn file_layer(path: &PathBuf, layers: &mut Layers) -> Result<(), Refused> {
    let error = |message: String| ConfigError::File {
        path: path.clone(),
        message,
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| layers.record(Place::File, error(e.to_string())))?;
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        layers.record(Place::File, error(without_source_lines(&e.to_string())))
    })?;
    for key in table.keys() {
        if !all().any(|s| s.key == key) {
            layers.record(
                Place::File,
                error(
                    ConfigError::Unknown {
                        what: "the configuration file's key",
                        name: key.clone(),
                        hint: did_you_mean(key, &all().map(|s| s.key).collect::<Vec<_>>()),
                    }
                    .to_string(),
                ),
            );
        }
    }
    let mut whole = Ok(());
    for s in all() {
        if let Some(value) = table.get(s.key) {
            match scalar(value) {
                Some(text) => layers.set(s.key, text),
                None => {
                    whole = Err(layers.record(
                        Place::File,
                        error(format!(
                            "`{}` is not a string, a number, a boolean or a list of those",
                            s.key
                        )),
                    ))
                }
            }
        }
    }
    whole
}

/// The layers merged: built-in defaults, then the file (from the flags or the environment),
/// then the environment (the documented name winning over an alias), then the flags; and
/// whether the file could be used (its mistakes are in the layers' list).
fn layers(env: &BTreeMap<String, String>, flags: &FlagValues) -> (Layers, Result<(), Refused>) {
    let mut layers = Layers::default();
    for s in all() {
        if let Some(d) = s.default {
            layers.set(s.key, d.to_owned());
        }
    }
    let file = flags
        .config_file
        .clone()
        .or_else(|| env.get(CONFIG_FILE_ENV).map(PathBuf::from));
    let read = match &file {
        Some(path) => file_layer(path, &mut layers),
        None => Ok(()),
    };
    for s in all() {
        if let Some(v) = s.env.iter().find_map(|name| env.get(*name)) {
            layers.set(s.key, v.clone());
        }
    }
    for (key, v) in &flags.values {
        layers.set(key, v.clone());
    }
    (layers, read)
}

/// The value read, when no mistake was found; else every mistake, in their places' order
/// (the file's, then each setting's as declared, then the misspelt variables), none showing
/// the product key.
fn finish<T>(l: &Layers, read: Result<T, Refused>) -> Result<T, ConfigErrors> {
    let position = |place: &Place| match place {
        Place::File => 0,
        Place::Setting(key) => 1 + all().position(|s| s.key == *key).unwrap_or(usize::MAX - 2),
        Place::Variable => usize::MAX,
    };
    let mut mistakes = l.take_mistakes();
    // Stable: two mistakes in one place stay in the order found.
    mistakes.sort_by_key(|(place, _)| position(place));
    let key = l.text(&feedback::API_KEY);
    match (
        read,
        ConfigErrors::new(mistakes.into_iter().map(|(_, e)| e).collect()),
    ) {
        (Ok(v), None) => Ok(v),
        (_, Some(errors)) => Err(errors.without_key(key.as_deref())),
        (Err(_), None) => unreachable!("a value is refused only as its mistake is recorded"),
    }
}

fn env_map<I, K, V>(env: I) -> BTreeMap<String, String>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: AsRef<str>,
{
    env.into_iter()
        .map(|(k, v)| (k.as_ref().to_owned(), v.as_ref().to_owned()))
        .collect()
}

/// What `epode-sidecar healthcheck` needs to find the running sidecar, read through the same
/// settings (the environment with its aliases, and the file when one is given).
#[derive(Debug)]
pub(crate) struct ProbeSettings {
    pub(crate) listen: SocketAddr,
    pub(crate) admin_listen: Option<SocketAddr>,
    /// Whether the listener serves TLS (a certificate is set).
    pub(crate) tls: bool,
}

impl ProbeSettings {
    pub(crate) fn from_layers<I, K, V>(
        env: I,
        config_file: Option<PathBuf>,
    ) -> Result<ProbeSettings, ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let flags = FlagValues {
            config_file,
            ..FlagValues::default()
        };
        let (l, file) = layers(&env_map(env), &flags);
        let probe = file.and_then(|()| {
            read_all!(ProbeSettings {
                listen: l.get(&core::LISTEN),
                admin_listen: l.optional(&tls::ADMIN_LISTEN),
                tls: Ok(l.text(&tls::TLS_CERT).is_some()),
            })
        });
        // The probe says what stops it finding the sidecar: the first mistake is enough.
        finish(&l, probe).map_err(ConfigErrors::into_first)
    }
}

impl Config {
    /// Builds the configuration from an environment (any iterator of name/value pairs, so tests
    /// never touch the process environment) and the flags.
    pub(crate) fn from_layers<I, K, V>(env: I, flags: &FlagValues) -> Result<Config, ConfigErrors>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let env = env_map(env);
        let (layers, file) = layers(&env, flags);
        let warnings = unknown_variables(&env, &layers);
        let config = file.and_then(|()| Config::read_groups(&layers, &flags.command));
        let mut config = finish(&layers, config)?;
        config.warnings = warnings;
        if let UpstreamTransport::Stdio(command) = &mut config.upstream {
            command.select_env(&env);
        }
        Ok(config)
    }

    /// Every group read from the merged layers, with the checks between them; `argv` is the
    /// command line after `--`. Every mistake is listed (see [`finish`]).
    #[cfg(test)]
    fn read(l: &Layers, argv: &[String]) -> Result<Config, ConfigErrors> {
        finish(l, Config::read_groups(l, argv))
    }

    /// Every group read, each mistake recorded in the layers and reading going on; a check
    /// between settings runs only on values that parsed.
    fn read_groups(l: &Layers, argv: &[String]) -> Result<Config, Refused> {
        let tls = tls::read(l);
        let limits = limits::read(l);
        let http = http::read(l);
        let auth = auth::read(l);
        let otel = otel::read(l);
        let upstream = transport(l, argv);
        let upstream = match (&http, upstream) {
            (Ok(Some(_)), Ok(mut upstream)) => bare_origin(l, &mut upstream).map(|()| upstream),
            (_, upstream) => upstream,
        };
        if let (Ok(Some(_)), Ok(limits)) = (&http, &limits) {
            // Each surface keeps a share of the upstream connections (`upstream_connections`).
            if limits.upstream_max_connections < 2 {
                l.refuse(&limits::UPSTREAM_MAX_CONNECTIONS.doc, ConfigError::Invalid {
                    name: limits::UPSTREAM_MAX_CONNECTIONS.doc.name(),
                    value: limits.upstream_max_connections.to_string(),
                    accepts: "at least 2 with the HTTP surface on: the MCP path and the surface each keep a share of the upstream connections (EPODE_SIDECAR_HTTP_UPSTREAM_SHARE)".into(),
                });
            }
        }
        let listen: Result<SocketAddr, Refused> = l.get(&core::LISTEN);
        let loopback = listen.as_ref().is_ok_and(|a| a.ip().is_loopback());
        let (dev, dev_on) = trial(l, &listen);
        let feedback = feedback::read(l, dev_on);
        let replica_url = replica_url(l, &feedback);
        let stdio = matches!(upstream, Ok(UpstreamTransport::Stdio(_)));
        let (tls, upstream_tls, admin_listen) = match tls {
            Ok((tls, upstream_tls, admin_listen)) => (Ok(tls), Ok(upstream_tls), Ok(admin_listen)),
            Err(refused) => (Err(refused), Err(refused), Err(refused)),
        };
        read_all!(Config {
            warnings: Ok(Vec::new()),
            listen,
            upstream,
            limits,
            tls,
            upstream_tls,
            admin_listen,
            path: l.get(&core::PATH),
            // Unset, the Origin and Host policies follow the listener.
            allowed_origins: l.optional(&core::ALLOWED_ORIGINS).map(|o| {
                o.unwrap_or(if loopback {
                    OriginPolicy::Loopback
                } else {
                    OriginPolicy::RefuseAll
                })
            }),
            allowed_hosts: l.optional(&core::ALLOWED_HOSTS).map(|h| {
                h.unwrap_or(if loopback {
                    HostPolicy::Loopback
                } else {
                    HostPolicy::Any
                })
            }),
            max_body_bytes: l.get(&core::MAX_BODY_BYTES),
            upstream_timeout: l.get(&core::UPSTREAM_TIMEOUT),
            shutdown_grace: l.get(&core::SHUTDOWN_GRACE),
            workers: l
                .get(&core::WORKERS)
                .map(|w| core::resolve_workers(w, stdio)),
            upstream_protocol: l.get(&core::UPSTREAM_PROTOCOL),
            server_name: l.optional(&core::SERVER_NAME),
            server_version: l.optional(&core::SERVER_VERSION),
            cache_ttl_ms: l.get(&core::CACHE_TTL_MS),
            cache_scope: l.get(&core::CACHE_SCOPE),
            feedback,
            dev,
            http,
            auth,
            otel,
            log: l.get(&core::LOG),
            log_format: l.get(&core::LOG_FORMAT),
            access_log: l.get(&core::ACCESS_LOG),
            replica_url,
        })
    }

    /// The effective configuration as TOML, secrets redacted (`--check-config`): a value
    /// that can be fed back is a line; one that is only described (unset, derived, secret) is
    /// a comment.
    pub(crate) fn describe(&self) -> String {
        let mut out = String::new();
        for s in all() {
            let value = (s.show)(self);
            let described = value.starts_with('<') && value.ends_with('>');
            let line = if s.secret && (value == "<set>" || !described) {
                format!("# {} = <set, redacted>", s.key)
            } else if described {
                format!("# {} = {value}", s.key)
            } else if value.contains("<redacted>") {
                // Fed back, a redacted value would be another value: a comment, to set again.
                format!("# {} = {}", s.key, toml_string(&value))
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

/// `EPODE_SIDECAR_REPLICA_URL`, refused without the product key that seals the states
/// naming a replica.
fn replica_url(
    l: &Layers,
    feedback: &Result<FeedbackConfig, Refused>,
) -> Result<Option<url::Url>, Refused> {
    let replica_url = l.optional(&core::REPLICA_URL);
    if let (Ok(Some(url)), Ok(f)) = (&replica_url, feedback) {
        if f.key.is_none() {
            l.refuse(&core::REPLICA_URL.doc, ConfigError::Invalid {
                name: core::REPLICA_URL.doc.name(),
                value: url.to_string(),
                accepts: "a URL only with EPODE_API_KEY set, the same on every replica: the product key seals the requestState that names this replica".into(),
            });
        }
    }
    replica_url
}

/// The local trial's settings when `dev` is on, and whether it is (`None`: `dev` refused).
/// The trial requires a listener that stays on this machine.
fn trial(
    l: &Layers,
    listen: &Result<SocketAddr, Refused>,
) -> (Result<Option<DevConfig>, Refused>, Option<bool>) {
    let on = l.get(&dev::DEV);
    if let (Ok(true), Ok(listen)) = (&on, listen) {
        if !listen.ip().is_loopback() {
            l.refuse(&core::LISTEN.doc, ConfigError::Invalid {
                name: core::LISTEN.doc.name(),
                value: listen.to_string(),
                accepts: "a loopback address such as 127.0.0.1:8080 with --dev: the local trial's embedded Epode and console are for this machine only".into(),
            });
        }
    }
    match on {
        Ok(true) => (dev::read(l).map(Some), Some(true)),
        Ok(false) => (Ok(None), Some(false)),
        Err(refused) => (Err(refused), None),
    }
}

/// The upstream: an HTTP endpoint (`upstream`), or a command (from the command line after
/// `--`, which wins, or `upstream_command`); exactly one of them.
fn transport(l: &Layers, argv: &[String]) -> Result<UpstreamTransport, Refused> {
    let url = l.text(&core::UPSTREAM);
    let argv = if argv.is_empty() {
        l.optional(&stdio::UPSTREAM_COMMAND)?.unwrap_or_default()
    } else {
        argv.to_vec()
    };
    match (url, argv.split_first()) {
        (Some(_), None) => l.get(&core::UPSTREAM).map(UpstreamTransport::Http),
        (Some(url), Some(_)) => Err(l.refuse(
            &core::UPSTREAM.doc,
            core::UPSTREAM.doc.invalid(&format!(
                "{url}, while a command to run is also given; give one of them"
            )),
        )),
        (None, None) => Err(l.refuse(&core::UPSTREAM.doc, ConfigError::Missing {
            name: "the upstream: EPODE_SIDECAR_UPSTREAM (an http:// or https:// URL), or a command to run after `--` (or EPODE_SIDECAR_UPSTREAM_COMMAND)".to_owned(),
            accepts: "for instance `epode-sidecar -- python server.py` for a stdio MCP server, or EPODE_SIDECAR_UPSTREAM=http://127.0.0.1:8000/mcp".into(),
        })),
        (None, Some((program, args))) => stdio::read(l, program, args).map(UpstreamTransport::Stdio),
    }
}

/// With the HTTP surface on: the upstream must be reached over HTTP (its routes are proxied to
/// its origin), and a bare origin (`http://127.0.0.1:8000`, no path at all) has its MCP
/// endpoint at `EPODE_SIDECAR_PATH`.
fn bare_origin(l: &Layers, upstream: &mut UpstreamTransport) -> Result<(), Refused> {
    let UpstreamTransport::Http(target) = upstream else {
        return Err(l.refuse(&http::HTTP_SURFACE.doc, http::HTTP_SURFACE.doc.invalid(
            "on, while the upstream is a stdio command; the HTTP surface proxies to an HTTP upstream (EPODE_SIDECAR_UPSTREAM)",
        )));
    };
    let raw = l.text(&core::UPSTREAM).unwrap_or_default();
    let after_scheme = raw.split_once("://").map_or("", |(_, rest)| rest);
    let no_path = !after_scheme.contains('/');
    if no_path {
        let path: String = l.get(&core::PATH)?;
        target.url.set_path(&path);
    }
    Ok(())
}

/// The closest known name to `name` among `known`, with its edit distance.
fn closest<'a>(name: &str, known: impl Iterator<Item = &'a str>) -> Option<(&'a str, usize)> {
    known
        .map(|k| (k, strsim::levenshtein(name, k)))
        .min_by_key(|(_, d)| *d)
}

/// Edits from a known name that make a name a typo of it (refused, not ignored).
const TYPO: usize = 2;

/// The hint for a name that is no setting: the known name a typo away; else one it begins or
/// extends word by word (`…_MAX_BODY` means `…_MAX_BODY_BYTES`, though fewer edits make
/// `…_MAX_TOOLS`); else the closest within six edits; else none.
fn did_you_mean(name: &str, known: &[&str]) -> String {
    let Some((near, distance)) = closest(name, known.iter().copied()) else {
        return String::new();
    };
    let extends = |long: &str, short: &str| {
        long.strip_prefix(short)
            .is_some_and(|rest| rest.starts_with('_'))
    };
    let meant = if distance <= TYPO {
        Some(near)
    } else {
        known
            .iter()
            .copied()
            .filter(|k| extends(k, name) || extends(name, k))
            .min_by_key(|k| k.len().abs_diff(name.len()))
            .or((distance <= 6).then_some(near))
    };
    meant.map_or_else(String::new, |k| format!("; did you mean `{k}`?"))
}

/// The beginnings of the sidecar's environment variables (every setting's has one of them): a
/// variable with one that is no setting is the operator's mistake, and is reported.
const PREFIXES: [&str; 3] = ["EPODE_SIDECAR_", "EPODE_API_", "AGENT_FEEDBACK_"];

/// The OpenTelemetry specification's variables (`OTEL_SERVICE_NAME`, …): the sidecar reads a
/// few of them as every OpenTelemetry component does, but a pod carries many others meant for
/// other components (the OpenTelemetry Operator injects them), so an unknown one is nobody's
/// mistake and is not reported.
#[cfg(test)]
const STANDARD_PREFIXES: [&str; 1] = ["OTEL_"];

/// What follows a prefix in the names Kubernetes puts in a pod's environment for a Service
/// named after it (`epode-sidecar`, `epode-api`: service links): not settings, never refused.
fn service_link(rest: &str) -> bool {
    rest.starts_with("SERVICE_") || rest == "PORT" || rest.starts_with("PORT_")
}

/// Variables with one of the sidecar's prefixes that are no setting: one a typo away from a
/// setting is refused (a misspelt limit or kill switch must not be silently ignored), each
/// listed in the layers' mistakes; any other is a warning, with the setting it may have meant.
fn unknown_variables(env: &BTreeMap<String, String>, l: &Layers) -> Vec<String> {
    let known: Vec<&str> = all()
        .flat_map(|s| s.env.iter().copied())
        .chain(std::iter::once(CONFIG_FILE_ENV))
        .collect();
    let mut warnings = Vec::new();
    for name in env.keys() {
        let Some(prefix) = PREFIXES.iter().find(|p| name.starts_with(*p)) else {
            continue;
        };
        if known.contains(&name.as_str()) || service_link(&name[prefix.len()..]) {
            continue;
        }
        if closest(name, known.iter().copied()).is_some_and(|(_, d)| d <= TYPO) {
            l.record(
                Place::Variable,
                ConfigError::Unknown {
                    what: "the environment variable",
                    name: name.clone(),
                    hint: did_you_mean(name, &known),
                },
            );
            continue;
        }
        warnings.push(format!(
            "the environment variable {name} is not a setting and is ignored{}",
            did_you_mean(name, &known)
        ));
    }
    warnings
}
