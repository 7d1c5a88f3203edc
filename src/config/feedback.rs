//! The Epode binding's settings and the [`FeedbackConfig`] built from them, checked together
//! (the key is needed unless feedback is off, and refused with `--dev`).

use std::time::Duration;

use url::Url;

use super::setting::{
    a_duration, boolean, bounded, duration, number, read_all, setting, settings, split_list,
    Accepts, Bad, ConfigError, Layers, Refused, AT_LEAST_1MS,
};
use super::types::{
    redact_url, Config, CustomerConfig, FeedbackConfig, ToolPatterns, UpstreamEpode,
};
use crate::feedback::capability::{ProductKey, ProductKeyError};
use crate::feedback::identity::RefKind;
use crate::feedback::FeedbackMode;

/// `dev`: the local trial, which makes its own ephemeral key and refuses a real one (`None`
/// when `dev` itself was refused: the checks that depend on it are then left out).
pub(super) fn read(l: &Layers, dev: Option<bool>) -> Result<FeedbackConfig, Refused> {
    let mode = match (l.get(&FEEDBACK_MODE), l.get(&FEEDBACK_ENABLED)) {
        (_, Ok(false)) => Ok(FeedbackMode::Off),
        (mode, enabled) => enabled.and(mode),
    };
    let customer_on = l.get(&CUSTOMER_CONTEXT);
    let needs_key = mode.as_ref().is_ok_and(|m| m.is_enabled()) || matches!(customer_on, Ok(true));
    let key = match (l.optional(&API_KEY), dev) {
        (Ok(Some(_)), Some(true)) => Err(l.refuse(&API_KEY.doc, ConfigError::Invalid {
            name: API_KEY.doc.name(),
            value: "<set, while --dev is on>".to_owned(),
            accepts: "no key with --dev (EPODE_SIDECAR_DEV): the local trial makes an ephemeral key for its embedded Epode and never talks to the real service; unset EPODE_API_KEY, or drop --dev to use it".into(),
        })),
        (Ok(None), Some(true)) => Ok(Some(ProductKey::ephemeral())),
        (Ok(None), Some(false)) if needs_key => {
            Err(l.refuse(&API_KEY.doc, ConfigError::Missing {
                name: API_KEY.doc.name(),
                accepts: "an Epode product key af_live_… from your Epode workspace. To try the sidecar without an Epode account, run it with --dev (or EPODE_SIDECAR_DEV=1): an embedded Epode on this machine, with a live console. To run without feedback, set AGENT_FEEDBACK_MODE=off".into(),
            }))
        }
        (key, _) => key,
    };
    read_all!(FeedbackConfig {
        mode,
        key,
        api_url: l.get(&API_URL),
        consent_timeout: l.get(&CONSENT_TIMEOUT_MS),
        tool_timeout: l.get(&FEEDBACK_TIMEOUT),
        include: l.optional(&INCLUDE_TOOLS),
        exclude: l.optional(&EXCLUDE_TOOLS),
        feedback_tools: l.optional(&FEEDBACK_TOOLS),
        identity_headers: l.optional(&IDENTITY_HEADERS).map(Option::unwrap_or_default),
        max_tools: l.get(&MAX_TOOLS),
        telemetry_queue: l.get(&TELEMETRY_QUEUE),
        telemetry_batch: l.get(&TELEMETRY_BATCH),
        telemetry_concurrency: l.get(&TELEMETRY_CONCURRENCY),
        telemetry_flush: l.get(&TELEMETRY_FLUSH),
        telemetry_retry_base: l.get(&TELEMETRY_RETRY_BASE),
        telemetry_shutdown: l.get(&TELEMETRY_SHUTDOWN),
        upstream_epode: l.get(&UPSTREAM_EPODE),
        customer: customer(l, customer_on),
    })
}

/// Customer context's settings, when it is on: the tools it follows are required.
fn customer(l: &Layers, on: Result<bool, Refused>) -> Result<Option<CustomerConfig>, Refused> {
    // Every value is checked, on or off, so a mistake is found before the day it is turned on.
    let tools = match (&on, l.optional(&CUSTOMER_CONTEXT_TOOLS)) {
        (_, Err(e)) => Err(e),
        (Ok(true), Ok(None)) => Err(l.refuse(&CUSTOMER_CONTEXT_TOOLS.doc, ConfigError::Missing {
            name: CUSTOMER_CONTEXT_TOOLS.doc.name(),
            accepts: "with EPODE_SIDECAR_CUSTOMER_CONTEXT=on, the product tools after which customer context is asked for, as glob patterns such as search_*,compare_* (Epode's binding asks for them explicitly)".into(),
        })),
        (_, Ok(t)) => Ok(t),
    };
    let read = read_all!(CustomerRead {
        tools,
        fields: l.optional(&CUSTOMER_CONTEXT_FIELDS),
        purpose: l.get(&CUSTOMER_CONTEXT_PURPOSE),
        budget: l.get(&CUSTOMER_CONTEXT_BUDGET),
        timeout: l.get(&CUSTOMER_CONTEXT_TIMEOUT),
    });
    let (on, read) = (on?, read?);
    Ok(match (on, read.tools) {
        (true, Some(tools)) => Some(CustomerConfig {
            tools,
            fields: read.fields,
            purpose: read.purpose,
            budget: read.budget,
            timeout: read.timeout,
        }),
        _ => None,
    })
}

/// Customer context's settings as read, before whether it is on decides.
struct CustomerRead {
    tools: Option<ToolPatterns>,
    fields: Option<Vec<String>>,
    purpose: &'static str,
    budget: Duration,
    timeout: Duration,
}

/// Epode's customer-context field keys: `namespace.name`, 1 to 8 distinct, none `epode.*`.
fn field_keys(raw: &str) -> Result<Vec<String>, Bad> {
    let keys = split_list(raw);
    let shaped = |k: &str| {
        let part = |p: &str, max: usize| {
            let b = p.as_bytes();
            !b.is_empty()
                && b.len() <= max
                && b[0].is_ascii_lowercase()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_')
        };
        k.split_once('.')
            .is_some_and(|(ns, name)| ns != "epode" && part(ns, 31) && part(name, 47))
    };
    if let Some(bad) = keys.iter().find(|k| !shaped(k)) {
        return Err(Bad::Entry(bad.clone()));
    }
    let distinct: std::collections::BTreeSet<&String> = keys.iter().collect();
    if keys.is_empty() || keys.len() > 8 || distinct.len() != keys.len() {
        return Err(Bad::Whole);
    }
    Ok(keys)
}

fn purpose(raw: &str) -> Result<&'static str, Bad> {
    match raw {
        "product_personalization" => Ok("product_personalization"),
        "targeted_advertising" => Ok("targeted_advertising"),
        _ => Err(Bad::Whole),
    }
}

fn upstream_epode(v: &str) -> Result<UpstreamEpode, Bad> {
    match v.to_ascii_lowercase().as_str() {
        "auto" => Ok(UpstreamEpode::Auto),
        "none" => Ok(UpstreamEpode::None),
        _ => Err(Bad::Whole),
    }
}

fn product_key(raw: &str) -> Result<ProductKey, Bad> {
    ProductKey::parse(raw).map_err(|e| match e {
        ProductKeyError::ReadKey => Bad::Described(
            "<redacted: a read key (af_read_…), which cannot sign or send telemetry>",
        ),
        _ => Bad::Whole,
    })
}

/// An `https://` Epode origin, or `http://` for a loopback host; no query.
fn parse_api_url(raw: &str) -> Option<Url> {
    let url = Url::parse(raw).ok()?;
    let loopback = super::types::loopback_url(&url);
    let scheme_ok = url.scheme() == "https" || (url.scheme() == "http" && loopback);
    (scheme_ok && url.query().is_none()).then_some(url)
}

const A_MINUTE: Duration = Duration::from_secs(60);

fn patterns(raw: &str) -> Result<ToolPatterns, Bad> {
    let text = split_list(raw);
    let mut builder = globset::GlobSetBuilder::new();
    for p in &text {
        // `*` stays within one `/` segment and `**` crosses them, as the reference binding's
        // patterns do.
        let glob = globset::GlobBuilder::new(p)
            .literal_separator(true)
            .build()
            .map_err(|_| Bad::Entry(p.clone()))?;
        builder.add(glob);
    }
    let set = builder.build().map_err(|_| Bad::Whole)?;
    Ok(ToolPatterns { set, text })
}

fn identity_headers(raw: &str) -> Result<Vec<(RefKind, http::HeaderName)>, Bad> {
    split_list(raw)
        .iter()
        .map(|pair| {
            let bad = || Bad::Entry(pair.clone());
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

settings! {
    /// The Epode binding's settings.
    pub(super) FEEDBACK {
        API_KEY: ProductKey = setting(
            "api_key",
            &["EPODE_API_KEY", "AGENT_FEEDBACK_KEY"],
            None,
            "an Epode product (write) key af_live_<32 hex>_[<32 hex>_]<secret of 20+ characters>",
            "The Epode product key `af_live_…`: signs feedback handles and authorises telemetry. Required unless feedback is off. Never printed.",
            product_key,
            |c| {
                match (c.dev.is_some(), c.feedback.key.is_some()) {
                    (true, _) => "<an ephemeral key made at start by --dev>",
                    (false, true) => "<set>",
                    (false, false) => "<unset>",
                }
                .to_owned()
            },
        )
        .secret(),
        API_URL: Url = setting(
            "api_url",
            &["EPODE_API_URL", "AGENT_FEEDBACK_URL"],
            Some("https://app.epode.ai"),
            "an https:// URL (http:// only for a loopback host)",
            "The Epode API origin; `http://` only for a loopback host.",
            |u| parse_api_url(u).ok_or(Bad::Whole),
            |c| match c.dev {
                Some(_) => "<the embedded Epode of --dev, on a loopback port chosen at start>".to_owned(),
                None => redact_url(c.feedback.api_url.as_str()).into_owned(),
            },
        ),
        FEEDBACK_MODE: FeedbackMode = setting(
            "feedback_mode",
            &["AGENT_FEEDBACK_MODE"],
            Some("never_ask"),
            "never_ask, ask_once, ask_always or off",
            "`never_ask`, `ask_once`, `ask_always` or `off`.",
            |m| m.parse().map_err(|_| Bad::Whole),
            |c| c.feedback.mode.to_string(),
        ),
        FEEDBACK_ENABLED: bool = setting(
            "feedback_enabled",
            &["AGENT_FEEDBACK_ENABLED"],
            Some("true"),
            "true or false",
            "Kill switch: `false` is the same as `AGENT_FEEDBACK_MODE=off`.",
            boolean,
            |c| c.feedback.mode.is_enabled().to_string(),
        ),
        CONSENT_TIMEOUT_MS: Duration = bounded(
            "consent_timeout_ms",
            &["AGENT_FEEDBACK_CONSENT_TIMEOUT_MS"],
            Some("750"),
            Accepts::whole("milliseconds", 1, 60_000),
            "Deadline of the background Ask-once consent-state lookup.",
            |v| number(v).map(Duration::from_millis),
            |c| c.feedback.consent_timeout.as_millis().to_string(),
        ),
        FEEDBACK_TIMEOUT: Duration = bounded(
            "feedback_timeout",
            &["EPODE_SIDECAR_FEEDBACK_TIMEOUT"],
            Some("10s"),
            Accepts::duration(AT_LEAST_1MS, A_MINUTE, "10s"),
            "Deadline of the two feedback tools' calls to Epode; past it the tool answers a retryable failure.",
            a_duration,
            |c| duration(c.feedback.tool_timeout),
        ),
        UPSTREAM_EPODE: UpstreamEpode = setting(
            "upstream_epode",
            &["EPODE_SIDECAR_UPSTREAM_EPODE"],
            Some("auto"),
            "auto or none",
            "An upstream that carries Epode itself (one of Epode's SDKs): `auto` looks for it (`ai.epode/agent-feedback` in its `server/discover` or `initialize` capabilities, Epode's tool names in its `tools/list`, `_agentFeedback` already in a result, its own envelope on an HTTP response of the HTTP surface) and, where found, steps back from the binding, so that no call is counted twice: no telemetry event, no `_agentFeedback`, no feedback tools or instructions of its own (the upstream's pass untouched); said once in the log and in `epode_sidecar_upstream_epode`. `none`: the upstream is taken to carry none and the sidecar binds whatever it says. Either way a result that already carries `_agentFeedback` is never decorated again nor counted.",
            upstream_epode,
            |c| match c.feedback.upstream_epode {
                UpstreamEpode::Auto => "auto".to_owned(),
                UpstreamEpode::None => "none".to_owned(),
            },
        ),
        CUSTOMER_CONTEXT: bool = setting(
            "customer_context",
            &["EPODE_SIDECAR_CUSTOMER_CONTEXT"],
            Some("off"),
            "on or off",
            "Epode's customer-context binding (docs/customer-context.md): `share_customer_context` and `record_customer_context_consent` in `tools/list`, answered here and forwarded to Epode with the request's `aqr1_` handle only; after a successful result of a tool `EPODE_SIDECAR_CUSTOMER_CONTEXT_TOOLS` names, an enrichment request to Epode within `EPODE_SIDECAR_CUSTOMER_CONTEXT_BUDGET`, whose contract the result carries at `structuredContent._epode.customerContext`. Needs the product key.",
            boolean,
            |c| if c.feedback.customer.is_some() { "on" } else { "off" }.to_owned(),
        ),
        CUSTOMER_CONTEXT_TOOLS: ToolPatterns = setting(
            "customer_context_tools",
            &["EPODE_SIDECAR_CUSTOMER_CONTEXT_TOOLS"],
            None,
            "comma-separated glob patterns of tool names, such as search_*,compare_*",
            "Patterns (`*` within a `/` segment, `**` across) of the product tools after whose successful results customer context is asked for; required with customer context on. Epode's four tool names never match.",
            patterns,
            |c| c.feedback.customer.as_ref().map_or_else(|| "<off>".to_owned(), |cc| cc.tools.text.join(",")),
        ),
        CUSTOMER_CONTEXT_FIELDS: Vec<String> = setting(
            "customer_context_fields",
            &["EPODE_SIDECAR_CUSTOMER_CONTEXT_FIELDS"],
            None,
            "1 to 8 distinct comma-separated field keys namespace.name, such as shopping.budget_band,shopping.priority",
            "The catalogued fields an enrichment request asks for (`fieldKeys`). Unset: Epode's default for the product and the operation.",
            field_keys,
            |c| c.feedback.customer.as_ref().and_then(|cc| cc.fields.as_ref()).map_or_else(|| "<Epode's default>".to_owned(), |f| f.join(",")),
        ),
        CUSTOMER_CONTEXT_PURPOSE: &'static str = setting(
            "customer_context_purpose",
            &["EPODE_SIDECAR_CUSTOMER_CONTEXT_PURPOSE"],
            Some("product_personalization"),
            "product_personalization or targeted_advertising",
            "What the context is for, as the enrichment request tells Epode (`purpose`).",
            purpose,
            |c| c.feedback.customer.as_ref().map_or("product_personalization", |cc| cc.purpose).to_owned(),
        ),
        CUSTOMER_CONTEXT_BUDGET: Duration = bounded(
            "customer_context_budget",
            &["EPODE_SIDECAR_CUSTOMER_CONTEXT_BUDGET"],
            Some("250ms"),
            Accepts::duration(AT_LEAST_1MS, Duration::from_secs(5), "250ms"),
            "The most a product result waits for Epode's answer to its enrichment request; past it, or on any failure, the result goes as the upstream sent it (counted in `epode_sidecar_customer_context_requests_total`).",
            a_duration,
            |c| duration(c.feedback.customer.as_ref().map_or(Duration::from_millis(250), |cc| cc.budget)),
        ),
        CUSTOMER_CONTEXT_TIMEOUT: Duration = bounded(
            "customer_context_timeout",
            &["EPODE_SIDECAR_CUSTOMER_CONTEXT_TIMEOUT"],
            Some("5s"),
            Accepts::duration(AT_LEAST_1MS, A_MINUTE, "5s"),
            "Deadline of each of the customer-context tools' calls to Epode (inspect, consent, answers); past it the tool answers a retryable failure.",
            a_duration,
            |c| duration(c.feedback.customer.as_ref().map_or(Duration::from_secs(5), |cc| cc.timeout)),
        ),
        INCLUDE_TOOLS: ToolPatterns = setting(
            "include_tools",
            &["EPODE_SIDECAR_INCLUDE_TOOLS"],
            None,
            "comma-separated glob patterns of tool names, such as search_*,get_order",
            "Comma-separated glob patterns (`*` within a `/` segment, `**` across) of product tools that get telemetry and feedback. Unset: every tool.",
            patterns,
            |c| globs(c, 0, "<all>"),
        ),
        EXCLUDE_TOOLS: ToolPatterns = setting(
            "exclude_tools",
            &["EPODE_SIDECAR_EXCLUDE_TOOLS"],
            None,
            "comma-separated glob patterns of tool names",
            "Patterns of tools that never get telemetry or feedback; wins over the include list.",
            patterns,
            |c| globs(c, 1, "<none>"),
        ),
        FEEDBACK_TOOLS: ToolPatterns = setting(
            "feedback_tools",
            &["EPODE_SIDECAR_FEEDBACK_TOOLS"],
            None,
            "comma-separated glob patterns of tool names",
            "Of the included tools, those whose results carry `_agentFeedback`; the others get telemetry only. Unset: every included tool.",
            patterns,
            |c| globs(c, 2, "<all included>"),
        ),
        IDENTITY_HEADERS: Vec<(RefKind, http::HeaderName)> = setting(
            "identity_headers",
            &["EPODE_SIDECAR_IDENTITY_HEADERS"],
            None,
            "comma-separated ref=Header pairs, refs being accountRef, userRef, anonymousRef, customerRef, sessionRef",
            "`ref=Header` pairs, such as `accountRef=X-Auth-Request-User`, naming request headers a trusted gateway sets.",
            identity_headers,
            |c| {
                c.feedback
                    .identity_headers
                    .iter()
                    .map(|(k, h)| format!("{}={}", k.key(), h))
                    .collect::<Vec<_>>()
                    .join(",")
            },
        ),
        MAX_TOOLS: usize = bounded(
            "max_tools",
            &["EPODE_SIDECAR_MAX_TOOLS"],
            Some("100000"),
            Accepts::whole("", 1, 10_000_000),
            "Upstream tool names the feedback binding remembers from `tools/list` answers (a tool must have been listed to be decorated and observed), at most 160 bytes each; past it the name listed longest ago is forgotten.",
            number,
            |c| c.feedback.max_tools.to_string(),
        ),
        TELEMETRY_QUEUE: usize = bounded(
            "telemetry_queue",
            &["EPODE_SIDECAR_TELEMETRY_QUEUE"],
            Some("1000"),
            Accepts::whole("events", 1, 1_000_000),
            "Telemetry queue capacity; events beyond it are dropped and counted. Besides the queue, up to `EPODE_SIDECAR_TELEMETRY_CONCURRENCY` batches may be in delivery.",
            number,
            |c| c.feedback.telemetry_queue.to_string(),
        ),
        TELEMETRY_BATCH: usize = bounded(
            "telemetry_batch",
            &["EPODE_SIDECAR_TELEMETRY_BATCH"],
            Some("100"),
            Accepts::whole("events", 1, 100),
            "Most events per telemetry batch (Epode takes up to 100); a batch whose body would pass Epode's 64 KiB limit is sent in parts.",
            number,
            |c| c.feedback.telemetry_batch.to_string(),
        ),
        TELEMETRY_CONCURRENCY: usize = bounded(
            "telemetry_concurrency",
            &["EPODE_SIDECAR_TELEMETRY_CONCURRENCY"],
            Some("16"),
            Accepts::whole("deliveries", 1, 256),
            "Most telemetry batches in delivery at once. The number in flight adapts below it: it starts at a quarter, doubles each round trip while Epode answers, halves on a 429, 5xx, timeout or network failure, and no batch starts before Epode's `Retry-After` has passed. Up to this many batches of events are held in delivery besides the queue.",
            number,
            |c| c.feedback.telemetry_concurrency.to_string(),
        ),
        TELEMETRY_FLUSH: Duration = bounded(
            "telemetry_flush",
            &["EPODE_SIDECAR_TELEMETRY_FLUSH"],
            Some("500ms"),
            Accepts::duration(AT_LEAST_1MS, A_MINUTE, "500ms"),
            "How long the first event of a batch waits for others before the batch is sent.",
            a_duration,
            |c| duration(c.feedback.telemetry_flush),
        ),
        TELEMETRY_RETRY_BASE: Duration = bounded(
            "telemetry_retry_base",
            &["EPODE_SIDECAR_TELEMETRY_RETRY_BASE"],
            Some("500ms"),
            Accepts::duration(AT_LEAST_1MS, A_MINUTE, "500ms"),
            "First retry delay of a failed batch; it doubles for each of the at most 6 attempts (Epode's `Retry-After` wins).",
            a_duration,
            |c| duration(c.feedback.telemetry_retry_base),
        ),
        TELEMETRY_SHUTDOWN: Duration = bounded(
            "telemetry_shutdown",
            &["EPODE_SIDECAR_TELEMETRY_SHUTDOWN"],
            Some("10s"),
            Accepts::duration(Duration::ZERO, Duration::MAX, "10s, 500ms or 2m"),
            "On shutdown, how long queued telemetry may take to be delivered. `0s`: what is queued is dropped (and counted).",
            a_duration,
            |c| duration(c.feedback.telemetry_shutdown),
        ),
    }
}
