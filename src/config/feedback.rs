//! The Epode binding's settings, checked together (the key is needed unless feedback is off).

use std::time::Duration;

use url::Url;

use super::settings::{display_name, duration, invalid, lookup, setting, ConfigError, Setting};
use super::Config;
use super::{any_duration, duration_in, number, parsed, split_list, value, Scalar};
use crate::feedback::capability::{ProductKey, ProductKeyError};
use crate::feedback::identity::RefKind;
use crate::feedback::FeedbackMode;

/// Glob patterns over tool names, kept with their source text for display.
#[derive(Debug, Clone)]
pub(crate) struct ToolPatterns {
    set: globset::GlobSet,
    text: Vec<String>,
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
    include: Option<ToolPatterns>,
    exclude: Option<ToolPatterns>,
    feedback_tools: Option<ToolPatterns>,
    pub(crate) identity_headers: Vec<(RefKind, http::HeaderName)>,
    /// Upstream tool names the catalog keeps at most.
    pub(crate) max_tools: usize,
    pub(crate) telemetry_queue: usize,
    pub(crate) telemetry_batch: usize,
    pub(crate) telemetry_concurrency: usize,
    pub(crate) telemetry_flush: Duration,
    pub(crate) telemetry_retry_base: Duration,
    pub(crate) telemetry_shutdown: Duration,
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

/// The feedback settings, taken out of [`RawConfig`] to be checked together.
pub(super) struct RawFeedback {
    pub(super) feedback_mode: Option<Scalar>,
    pub(super) feedback_enabled: Option<Scalar>,
    pub(super) api_key: Option<Scalar>,
    pub(super) api_url: Option<Scalar>,
    pub(super) consent_timeout_ms: Option<Scalar>,
    pub(super) feedback_timeout: Option<Scalar>,
    pub(super) include_tools: Option<Scalar>,
    pub(super) exclude_tools: Option<Scalar>,
    pub(super) feedback_tools: Option<Scalar>,
    pub(super) identity_headers: Option<Scalar>,
    pub(super) max_tools: Option<Scalar>,
    pub(super) telemetry_queue: Option<Scalar>,
    pub(super) telemetry_batch: Option<Scalar>,
    pub(super) telemetry_concurrency: Option<Scalar>,
    pub(super) telemetry_flush: Option<Scalar>,
    pub(super) telemetry_retry_base: Option<Scalar>,
    pub(super) telemetry_shutdown: Option<Scalar>,
}

impl FeedbackConfig {
    /// `dev`: the local trial, which makes its own ephemeral key and refuses a real one.
    pub(super) fn try_from_raw(
        raw: &mut RawFeedback,
        dev: bool,
    ) -> Result<FeedbackConfig, ConfigError> {
        let mut mode: FeedbackMode = parsed(raw.feedback_mode.take(), "feedback_mode", |m| {
            m.parse().ok()
        })?;
        let enabled = parsed(raw.feedback_enabled.take(), "feedback_enabled", |e| match e
            .to_ascii_lowercase()
            .as_str()
        {
            "true" | "1" | "yes" | "on" => Some(true),
            "false" | "0" | "no" | "off" => Some(false),
            _ => None,
        })?;
        if !enabled {
            mode = FeedbackMode::Off;
        }
        let mut key = parse_product_key(value(raw.api_key.take()))?;
        if dev {
            if key.is_some() {
                return Err(ConfigError::Invalid {
                    name: display_name(lookup("api_key")),
                    value: "<set, while --dev is on>".to_owned(),
                    accepts: "no key with --dev (EPODE_SIDECAR_DEV): the local trial makes an ephemeral key for its embedded Epode and never talks to the real service; unset EPODE_API_KEY, or drop --dev to use it",
                });
            }
            key = Some(ProductKey::ephemeral());
        }
        if key.is_none() && mode.is_enabled() {
            let s = lookup("api_key");
            return Err(ConfigError::Missing {
                name: display_name(s),
                accepts: "an Epode product key af_live_… from your Epode workspace. To try the sidecar without an Epode account, run it with --dev (or EPODE_SIDECAR_DEV=1): an embedded Epode on this machine, with a live console. To run without feedback, set AGENT_FEEDBACK_MODE=off",
            });
        }
        Ok(FeedbackConfig {
            mode,
            key,
            api_url: parsed(raw.api_url.take(), "api_url", parse_api_url)?,
            consent_timeout: Duration::from_millis(number(
                raw.consent_timeout_ms.take(),
                "consent_timeout_ms",
                1..=60_000,
            )?),
            tool_timeout: duration_in(
                raw.feedback_timeout.take(),
                "feedback_timeout",
                Duration::from_millis(1)..=Duration::from_secs(60),
            )?,
            include: parse_patterns("include_tools", value(raw.include_tools.take()))?,
            exclude: parse_patterns("exclude_tools", value(raw.exclude_tools.take()))?,
            feedback_tools: parse_patterns("feedback_tools", value(raw.feedback_tools.take()))?,
            identity_headers: parse_identity_headers(value(raw.identity_headers.take()))?,
            max_tools: number(raw.max_tools.take(), "max_tools", 1..=10_000_000)?,
            telemetry_queue: number(raw.telemetry_queue.take(), "telemetry_queue", 1..=1_000_000)?,
            telemetry_batch: number(raw.telemetry_batch.take(), "telemetry_batch", 1..=100)?,
            telemetry_concurrency: number(
                raw.telemetry_concurrency.take(),
                "telemetry_concurrency",
                1..=256,
            )?,
            telemetry_flush: duration_in(
                raw.telemetry_flush.take(),
                "telemetry_flush",
                Duration::from_millis(1)..=Duration::from_secs(60),
            )?,
            telemetry_retry_base: duration_in(
                raw.telemetry_retry_base.take(),
                "telemetry_retry_base",
                Duration::from_millis(1)..=Duration::from_secs(60),
            )?,
            telemetry_shutdown: any_duration(raw.telemetry_shutdown.take(), "telemetry_shutdown")?,
        })
    }
}

fn parse_product_key(raw: Option<String>) -> Result<Option<ProductKey>, ConfigError> {
    let Some(raw) = raw else { return Ok(None) };
    match ProductKey::parse(&raw) {
        Ok(k) => Ok(Some(k)),
        Err(ProductKeyError::ReadKey) => Err(ConfigError::Invalid {
            name: display_name(lookup("api_key")),
            value: "<redacted: a read key (af_read_…), which cannot sign or send telemetry>"
                .to_owned(),
            accepts: lookup("api_key").accepts,
        }),
        Err(_) => Err(invalid("api_key", &raw)),
    }
}

/// An `https://` Epode origin, or `http://` for a loopback host; no query.
fn parse_api_url(raw: &str) -> Option<Url> {
    let url = Url::parse(raw).ok()?;
    let loopback = match url.host()? {
        url::Host::Ipv4(ip) => ip.is_loopback(),
        url::Host::Ipv6(ip) => ip.is_loopback(),
        url::Host::Domain(d) => d == "localhost",
    };
    let scheme_ok = url.scheme() == "https" || (url.scheme() == "http" && loopback);
    (scheme_ok && url.query().is_none()).then_some(url)
}

fn parse_patterns(key: &str, raw: Option<String>) -> Result<Option<ToolPatterns>, ConfigError> {
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

fn parse_identity_headers(
    raw: Option<String>,
) -> Result<Vec<(RefKind, http::HeaderName)>, ConfigError> {
    let Some(raw) = raw else {
        return Ok(Vec::new());
    };
    split_list(&raw)
        .iter()
        .map(|pair| {
            let bad = || invalid("identity_headers", pair);
            let (kind, header) = pair.split_once('=').ok_or_else(bad)?;
            let kind = RefKind::ALL
                .into_iter()
                .find(|k| k.key() == kind.trim())
                .ok_or_else(bad)?;
            let header =
                http::HeaderName::from_bytes(header.trim().as_bytes()).map_err(|_| bad())?;
            Ok((kind, header))
        })
        .collect()
}

/// One of the configured pattern lists (include, exclude, feedback tools), or `none`.
fn globs(c: &Config, which: usize, none: &str) -> String {
    c.feedback.pattern_texts()[which]
        .clone()
        .unwrap_or_else(|| none.to_owned())
}

pub(super) const FEEDBACK: &[Setting] = &[
    Setting {
        key: "api_key",
        env: &["EPODE_API_KEY", "AGENT_FEEDBACK_KEY"],
        default: None,
        accepts: "an Epode product (write) key af_live_<32 hex>_[<32 hex>_]<secret of 20+ characters>",
        help: "The Epode product key `af_live_…`: signs feedback handles and authorises telemetry. Required unless feedback is off. Never printed.",
        secret: true,
        show: |c| {
            match (c.dev.is_some(), c.feedback.key.is_some()) {
                (true, _) => "<an ephemeral key made at start by --dev>",
                (false, true) => "<set>",
                (false, false) => "<unset>",
            }
            .to_owned()
        },
    },
    setting(
        "api_url",
        &["EPODE_API_URL", "AGENT_FEEDBACK_URL"],
        Some("https://app.epode.ai"),
        "an https:// URL (http:// only for a loopback host)",
        "The Epode API origin; `http://` only for a loopback host.",
        |c| match c.dev {
            Some(_) => "<the embedded Epode of --dev, on a loopback port chosen at start>".to_owned(),
            None => super::redact_userinfo(c.feedback.api_url.as_str()).into_owned(),
        },
    ),
    setting(
        "feedback_mode",
        &["AGENT_FEEDBACK_MODE"],
        Some("never_ask"),
        "never_ask, ask_once, ask_always or off",
        "`never_ask`, `ask_once`, `ask_always` or `off`.",
        |c| c.feedback.mode.to_string(),
    ),
    setting(
        "feedback_enabled",
        &["AGENT_FEEDBACK_ENABLED"],
        Some("true"),
        "true or false",
        "Kill switch: `false` is the same as `AGENT_FEEDBACK_MODE=off`.",
        |c| c.feedback.mode.is_enabled().to_string(),
    ),
    setting(
        "consent_timeout_ms",
        &["AGENT_FEEDBACK_CONSENT_TIMEOUT_MS"],
        Some("750"),
        "a whole number of milliseconds from 1 to 60000",
        "Deadline of the background Ask-once consent-state lookup.",
        |c| c.feedback.consent_timeout.as_millis().to_string(),
    ),
    setting(
        "feedback_timeout",
        &["EPODE_SIDECAR_FEEDBACK_TIMEOUT"],
        Some("10s"),
        "a duration from 1ms to 1m, such as 10s",
        "Deadline of the two feedback tools' calls to Epode; past it the tool answers a retryable failure.",
        |c| duration(c.feedback.tool_timeout),
    ),
    setting(
        "include_tools",
        &["EPODE_SIDECAR_INCLUDE_TOOLS"],
        None,
        "comma-separated glob patterns of tool names, such as search_*,get_order",
        "Comma-separated glob patterns (`*` within a `/` segment, `**` across) of product tools that get telemetry and feedback. Unset: every tool.",
        |c| globs(c, 0, "<all>"),
    ),
    setting(
        "exclude_tools",
        &["EPODE_SIDECAR_EXCLUDE_TOOLS"],
        None,
        "comma-separated glob patterns of tool names",
        "Patterns of tools that never get telemetry or feedback; wins over the include list.",
        |c| globs(c, 1, "<none>"),
    ),
    setting(
        "feedback_tools",
        &["EPODE_SIDECAR_FEEDBACK_TOOLS"],
        None,
        "comma-separated glob patterns of tool names",
        "Of the included tools, those whose results carry `_agentFeedback`; the others get telemetry only. Unset: every included tool.",
        |c| globs(c, 2, "<all included>"),
    ),
    setting(
        "identity_headers",
        &["EPODE_SIDECAR_IDENTITY_HEADERS"],
        None,
        "comma-separated ref=Header pairs, refs being accountRef, userRef, anonymousRef, customerRef, sessionRef",
        "`ref=Header` pairs, such as `accountRef=X-Auth-Request-User`, naming request headers a trusted gateway sets.",
        |c| {
            c.feedback
                .identity_headers
                .iter()
                .map(|(k, h)| format!("{}={}", k.key(), h))
                .collect::<Vec<_>>()
                .join(",")
        },
    ),
    setting(
        "max_tools",
        &["EPODE_SIDECAR_MAX_TOOLS"],
        Some("100000"),
        "a whole number from 1 to 10000000",
        "Upstream tool names the feedback binding remembers from `tools/list` answers (a tool must have been listed to be decorated and observed), at most 160 bytes each; past it the name listed longest ago is forgotten.",
        |c| c.feedback.max_tools.to_string(),
    ),
    setting(
        "telemetry_queue",
        &["EPODE_SIDECAR_TELEMETRY_QUEUE"],
        Some("1000"),
        "a whole number of events from 1 to 1000000",
        "Telemetry queue capacity; events beyond it are dropped and counted. Besides the queue, up to `EPODE_SIDECAR_TELEMETRY_CONCURRENCY` batches may be in delivery.",
        |c| c.feedback.telemetry_queue.to_string(),
    ),
    setting(
        "telemetry_batch",
        &["EPODE_SIDECAR_TELEMETRY_BATCH"],
        Some("100"),
        "a whole number of events from 1 to 100",
        "Most events per telemetry batch (Epode takes up to 100); a batch whose body would pass Epode's 64 KiB limit is sent in parts.",
        |c| c.feedback.telemetry_batch.to_string(),
    ),
    setting(
        "telemetry_concurrency",
        &["EPODE_SIDECAR_TELEMETRY_CONCURRENCY"],
        Some("16"),
        "a whole number of deliveries from 1 to 256",
        "Most telemetry batches in delivery at once. The number in flight adapts below it: it starts at a quarter, doubles each round trip while Epode answers, halves on a 429, 5xx, timeout or network failure, and no batch starts before Epode's `Retry-After` has passed. Up to this many batches of events are held in delivery besides the queue.",
        |c| c.feedback.telemetry_concurrency.to_string(),
    ),
    setting(
        "telemetry_flush",
        &["EPODE_SIDECAR_TELEMETRY_FLUSH"],
        Some("500ms"),
        "a duration from 1ms to 1m, such as 500ms",
        "How long the first event of a batch waits for others before the batch is sent.",
        |c| duration(c.feedback.telemetry_flush),
    ),
    setting(
        "telemetry_retry_base",
        &["EPODE_SIDECAR_TELEMETRY_RETRY_BASE"],
        Some("500ms"),
        "a duration from 1ms to 1m, such as 500ms",
        "First retry delay of a failed batch; it doubles for each of the at most 6 attempts (Epode's `Retry-After` wins).",
        |c| duration(c.feedback.telemetry_retry_base),
    ),
    setting(
        "telemetry_shutdown",
        &["EPODE_SIDECAR_TELEMETRY_SHUTDOWN"],
        Some("10s"),
        "a duration such as 10s, 500ms or 2m",
        "On shutdown, how long queued telemetry may take to be delivered. `0s`: what is queued is dropped (and counted).",
        |c| duration(c.feedback.telemetry_shutdown),
    ),
];
