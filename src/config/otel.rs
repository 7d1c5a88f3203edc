//! OpenTelemetry export: where spans and metrics go over OTLP, and the standard `OTEL_*`
//! variables a user sets for every other OpenTelemetry component, read here so a bad value is
//! refused at start with the others (the SDK would fall back silently). Off unless an endpoint
//! is set.

use std::time::Duration;

use url::Url;

use super::setting::{
    a_duration, boolean, bounded, duration, number, read_all, setting, settings, split_list,
    Accepts, Bad, ConfigError, Layers, Refused,
};
use super::types::{redact_url, OtelConfig, Sampling};

/// The OpenTelemetry settings, when an endpoint is set.
pub(super) fn read(l: &Layers) -> Result<Option<OtelConfig>, Refused> {
    // Off, whatever else is set: nothing else of OpenTelemetry's is read.
    if l.get(&SDK_DISABLED)? {
        return Ok(None);
    }
    let endpoint = l.optional(&OTLP_ENDPOINT)?;
    let traces = l.optional(&OTLP_TRACES_ENDPOINT)?;
    let metrics = l.optional(&OTLP_METRICS_ENDPOINT)?;
    let traces_url = match (traces, &endpoint) {
        (Some(t), _) => t,
        (None, Some(base)) => signal_url(base, "traces"),
        (None, None) if metrics.is_some() && l.get(&OTLP_METRICS)? != MetricsExport::Off => {
            return Err(l.refuse(
                &OTLP_ENDPOINT.doc,
                ConfigError::Missing {
                    name: OTLP_ENDPOINT.doc.name(),
                    accepts: "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is set, and the sidecar exports its metrics only beside its traces: set the base endpoint (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) too".into(),
                },
            ))
        }
        (None, None) => return Ok(None),
    };
    let metrics_url = metrics.or_else(|| endpoint.as_ref().map(|b| signal_url(b, "metrics")));
    l.get(&OTLP_PROTOCOL)?;
    // Read so a value the sidecar cannot honour is refused, never ignored.
    l.optional(&OTLP_COMPRESSION)?;
    l.optional(&OTLP_CLIENT_CERTIFICATE)?;
    let sampler = l.get(&TRACES_SAMPLER);
    let arg = l.optional(&TRACES_SAMPLER_ARG);
    let sampling = match (sampler, arg) {
        (Ok(s), Ok(arg)) => Ok(s.with_ratio(arg.unwrap_or(1.0))),
        (Err(r), _) | (_, Err(r)) => Err(r),
    };
    read_all!(OtelConfig {
        endpoint: Ok(endpoint),
        traces_url: Ok(traces_url),
        queue: l.get(&OTLP_QUEUE),
        timeout: l.get(&OTLP_TIMEOUT),
        metrics_every: match (l.get(&OTLP_METRICS), l.get(&OTLP_METRICS_INTERVAL)) {
            (Ok(_), _) if metrics_url.is_none() => Ok(None),
            (Ok(MetricsExport::Off), _) => Ok(None),
            (Ok(_), every) => every.map(Some),
            (Err(r), _) => Err(r),
        },
        metrics_families: l.get(&OTLP_METRICS).map(|m| m == MetricsExport::All),
        metrics_url: Ok(metrics_url),
        headers: l.optional(&OTLP_HEADERS).map(Option::unwrap_or_default),
        service_name: l.optional(&SERVICE_NAME),
        resource: l
            .optional(&RESOURCE_ATTRIBUTES)
            .map(Option::unwrap_or_default),
        sampling,
        ca_file: l.optional(&OTLP_CERTIFICATE),
    })
    .map(Some)
}

/// Which metrics go over OTLP (`EPODE_SIDECAR_OTLP_METRICS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MetricsExport {
    /// The conventions' histograms and the `/metrics` families.
    All,
    /// The conventions' histograms only.
    Conventions,
    Off,
}

fn metrics_export(v: &str) -> Result<MetricsExport, Bad> {
    match v.to_ascii_lowercase().as_str() {
        "all" => Ok(MetricsExport::All),
        "conventions" => Ok(MetricsExport::Conventions),
        other => boolean(other).map(|on| {
            if on {
                MetricsExport::All
            } else {
                MetricsExport::Off
            }
        }),
    }
}

/// `<base>/v1/<signal>`, as the specification derives a signal's URL from the base.
fn signal_url(base: &Url, signal: &str) -> Url {
    let mut url = base.clone();
    let path = format!("{}/v1/{signal}", base.path().trim_end_matches('/'));
    url.set_path(&path);
    url
}

/// A duration as the OpenTelemetry specification writes its timeouts and intervals, a whole
/// number of milliseconds (`10000`), or with a unit (`10s`).
fn millis_or_duration(v: &str) -> Result<Duration, Bad> {
    match v.trim().parse::<u64>() {
        Ok(ms) => Ok(Duration::from_millis(ms)),
        Err(_) => a_duration(v),
    }
}

/// `none`: the one OTLP compression the sidecar sends (gzip is refused at start, never
/// ignored).
fn compression(v: &str) -> Result<(), Bad> {
    match v.trim().to_ascii_lowercase().as_str() {
        "none" => Ok(()),
        "gzip" => Err(Bad::Described(
            "gzip: the sidecar sends OTLP uncompressed (its exports are small and local to the pod's network); unset it or set none",
        )),
        _ => Err(Bad::Whole),
    }
}

/// A client certificate for the collector: refused (not supported), never ignored.
fn client_certificate(_: &str) -> Result<(), Bad> {
    Err(Bad::Described(
        "the sidecar presents no client certificate to a collector: terminate mutual TLS in a collector beside it (an OpenTelemetry Collector agent), or unset this",
    ))
}

/// A PEM file of CA certificates, readable and holding at least one.
fn pem_bundle(v: &str) -> Result<std::path::PathBuf, Bad> {
    let text =
        std::fs::read(v.trim()).map_err(|_| Bad::Described("no readable file at that path"))?;
    reqwest::Certificate::from_pem_bundle(&text)
        .ok()
        .filter(|c| !c.is_empty())
        .map(|_| std::path::PathBuf::from(v.trim()))
        .ok_or(Bad::Described("a file with no PEM certificate in it"))
}

/// `http/protobuf`, the one OTLP protocol the sidecar speaks.
fn protocol(v: &str) -> Result<(), Bad> {
    match v.trim() {
        "http/protobuf" => Ok(()),
        _ => Err(Bad::Whole),
    }
}

fn endpoint(v: &str) -> Result<Url, Bad> {
    let url = Url::parse(v).map_err(|_| Bad::Whole)?;
    if !matches!(url.scheme(), "http" | "https")
        || url.host_str().is_none()
        // A credential goes in OTEL_EXPORTER_OTLP_HEADERS (a secret), never in the URL, which
        // errors and logs may show.
        || !url.username().is_empty()
        || url.password().is_some()
        || url.query().is_some()
        || url.fragment().is_some()
    {
        return Err(Bad::Whole);
    }
    Ok(url)
}

/// `key=value` pairs separated by commas, as the OpenTelemetry specification writes headers
/// and resource attributes (values percent-decoded).
fn pairs(v: &str) -> Result<Vec<(String, String)>, Bad> {
    let mut out = Vec::new();
    for entry in split_list(v) {
        let Some((k, val)) = entry.split_once('=') else {
            return Err(Bad::Described("each entry must be key=value"));
        };
        let k = k.trim();
        if k.is_empty() || !k.bytes().all(|b| b.is_ascii_graphic() && b != b'"') {
            return Err(Bad::Described(
                "each entry must be key=value, the key printable ASCII",
            ));
        }
        let val = percent_decode(val.trim())
            .ok_or(Bad::Described("a value is not valid percent-encoded UTF-8"))?;
        out.push((k.to_owned(), val));
    }
    Ok(out)
}

fn percent_decode(v: &str) -> Option<String> {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = v.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn sampler(v: &str) -> Result<Sampling, Bad> {
    Ok(match v {
        "always_on" => Sampling::AlwaysOn,
        "always_off" => Sampling::AlwaysOff,
        "traceidratio" => Sampling::Ratio(1.0),
        "parentbased_always_on" => Sampling::ParentOn,
        "parentbased_always_off" => Sampling::ParentOff,
        "parentbased_traceidratio" => Sampling::ParentRatio(1.0),
        _ => return Err(Bad::Whole),
    })
}

fn ratio(v: &str) -> Result<f64, Bad> {
    match v.trim().parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(Bad::Whole),
    }
}

fn shown<T>(c: &super::types::Config, f: impl Fn(&OtelConfig) -> T) -> Option<T> {
    c.otel.as_ref().map(f)
}

const OFF: &str = "<not used: no OTLP endpoint>";

settings! {
    /// OpenTelemetry export.
    pub(super) OTEL {
        SDK_DISABLED: bool = setting(
            "otel_sdk_disabled",
            &["OTEL_SDK_DISABLED"],
            Some("false"),
            "true or false (also on, off, 1, 0)",
            "`true` turns OpenTelemetry off even with an endpoint set, as for every OpenTelemetry component.",
            boolean,
            |c| if c.otel.is_some() { "false" } else { "<off>" }.to_owned(),
        ),
        OTLP_ENDPOINT: Url = setting(
            "otlp_endpoint",
            &["EPODE_SIDECAR_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"],
            None,
            "an http:// or https:// URL of an OTLP/HTTP receiver with no user information or query, such as http://otel-collector:4318",
            "Where the sidecar sends its traces (`/v1/traces`) and metrics (`/v1/metrics`), as OTLP/HTTP protobuf (no gRPC); a signal's own endpoint (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `…_METRICS_ENDPOINT`) is used instead when set. Unset, and no traces endpoint either: no span is made and nothing is exported (the default; `/metrics` is unchanged either way). One server span per MCP request by the MCP semantic conventions, a client span for the upstream hop (its context goes upstream in `traceparent` and `params._meta`), and one per call to Epode; see docs/operations.md.",
            endpoint,
            |c| shown(c, |o| o.endpoint.as_ref().map_or_else(|| "<unset>".to_owned(), |u| redact_url(u.as_str()).into_owned())).unwrap_or_else(|| "<unset: off>".to_owned()),
        ),
        OTLP_TRACES_ENDPOINT: Url = setting(
            "otlp_traces_endpoint",
            &["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"],
            None,
            "an http:// or https:// URL with no user information or query, used as it is, such as http://otel-collector:4318/v1/traces",
            "Where spans are posted, when not `<otlp_endpoint>/v1/traces` (the specification's per-signal endpoint). Set alone, it turns tracing on (metrics then need `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`).",
            endpoint,
            |c| shown(c, |o| redact_url(o.traces_url.as_str()).into_owned()).unwrap_or_else(|| OFF.to_owned()),
        ),
        OTLP_METRICS_ENDPOINT: Url = setting(
            "otlp_metrics_endpoint",
            &["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"],
            None,
            "an http:// or https:// URL with no user information or query, used as it is, such as http://otel-collector:4318/v1/metrics",
            "Where metrics are posted, when not `<otlp_endpoint>/v1/metrics`. Metrics go only beside traces: set alone, it is refused.",
            endpoint,
            |c| shown(c, |o| o.metrics_url.as_ref().map_or_else(|| "<none: no metrics endpoint>".to_owned(), |u| redact_url(u.as_str()).into_owned())).unwrap_or_else(|| OFF.to_owned()),
        ),
        OTLP_PROTOCOL: () = setting(
            "otlp_protocol",
            &["OTEL_EXPORTER_OTLP_PROTOCOL"],
            Some("http/protobuf"),
            "http/protobuf: the sidecar speaks OTLP over HTTP with protobuf only, not grpc or http/json (point the endpoint at the collector's OTLP/HTTP port, 4318, not gRPC's 4317)",
            "The OTLP protocol, read so that a `grpc` meant for other components is refused at start rather than every export failing.",
            protocol,
            |c| shown(c, |_| "http/protobuf".to_owned()).unwrap_or_else(|| OFF.to_owned()),
        ),
        OTLP_HEADERS: Vec<(String, String)> = setting(
            "otlp_headers",
            &["OTEL_EXPORTER_OTLP_HEADERS"],
            None,
            "comma-separated key=value pairs, values percent-encoded",
            "Headers sent with every export (an API key for a hosted collector). Never passed to a stdio child.",
            pairs,
            |c| shown(c, |o| if o.headers.is_empty() { "<unset>" } else { "<set>" }.to_owned()).unwrap_or_else(|| OFF.to_owned()),
        )
        .secret(),
        OTLP_QUEUE: usize = bounded(
            "otlp_queue",
            &["EPODE_SIDECAR_OTLP_QUEUE"],
            Some("2048"),
            Accepts::whole("spans", 16, 1_000_000),
            "Finished spans waiting for export. Past it a span is dropped (`epode_sidecar_otlp_dropped_total{signal=\"traces\"}`), never waited for: a collector that is down or slow never slows a call. About 1 KiB each.",
            number,
            |c| shown(c, |o| o.queue.to_string()).unwrap_or_else(|| OFF.to_owned()),
        ),
        OTLP_TIMEOUT: Duration = bounded(
            "otlp_timeout",
            &["EPODE_SIDECAR_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT"],
            Some("10s"),
            Accepts::duration(Duration::from_millis(100), Duration::from_secs(300), "10s, 500ms, or 10000 (milliseconds, as OTEL_EXPORTER_OTLP_TIMEOUT writes it)"),
            "How long one export may take before it counts as failed (`epode_sidecar_otlp_export_failed_total`); one timeout for traces and metrics. A failed batch is not retried: its spans are counted as dropped.",
            millis_or_duration,
            |c| shown(c, |o| duration(o.timeout)).unwrap_or_else(|| OFF.to_owned()),
        ),
        OTLP_METRICS: MetricsExport = setting(
            "otlp_metrics",
            &["EPODE_SIDECAR_OTLP_METRICS"],
            Some("all"),
            "all, conventions or off (on and true mean all; false means off)",
            "Which metrics are exported over OTLP beside the traces. `all`: the MCP semantic conventions' `mcp.server.operation.duration` and `mcp.client.operation.duration`, and every family of `/metrics` under its `/metrics` name (a counter as a monotonic cumulative sum; the request duration with exemplars: sampled requests' trace ids), read when an export is due, at no cost to a request. `conventions`: the two histograms only (for an operator whose Prometheus scrapes `/metrics` already). `off`: traces only.",
            metrics_export,
            |c| shown(c, |o| match (o.metrics_every, o.metrics_families) { (None, _) => "off", (Some(_), true) => "all", (Some(_), false) => "conventions" }.to_owned()).unwrap_or_else(|| OFF.to_owned()),
        ),
        OTLP_METRICS_INTERVAL: Duration = bounded(
            "otlp_metrics_interval",
            &["EPODE_SIDECAR_OTLP_METRICS_INTERVAL", "OTEL_METRIC_EXPORT_INTERVAL"],
            Some("60s"),
            Accepts::duration(Duration::from_secs(1), Duration::from_secs(3600), "60s, 10s, or 60000 (milliseconds, as OTEL_METRIC_EXPORT_INTERVAL writes it)"),
            "How often the metrics are exported over OTLP.",
            millis_or_duration,
            |c| shown(c, |o| o.metrics_every.map_or("<not used: otlp_metrics off>".to_owned(), duration)).unwrap_or_else(|| OFF.to_owned()),
        ),
        OTLP_CERTIFICATE: std::path::PathBuf = setting(
            "otlp_certificate",
            &["OTEL_EXPORTER_OTLP_CERTIFICATE", "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE"],
            None,
            "the path of a PEM file of CA certificates",
            "Roots trusted for an `https://` collector, besides the bundled Mozilla roots (a collector with a private CA's certificate); read at start, a file with no certificate refused.",
            pem_bundle,
            |c| shown(c, |o| o.ca_file.as_ref().map_or_else(|| "<none>".to_owned(), |p| p.display().to_string())).unwrap_or_else(|| OFF.to_owned()),
        ),
        OTLP_COMPRESSION: () = setting(
            "otlp_compression",
            &["OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION"],
            None,
            "none",
            "The exports' compression: `none`, the one the sidecar sends; `gzip` is refused at start (never silently ignored).",
            compression,
            |c| shown(c, |_| "none".to_owned()).unwrap_or_else(|| OFF.to_owned()),
        ),
        OTLP_CLIENT_CERTIFICATE: () = setting(
            "otlp_client_certificate",
            &["OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "OTEL_EXPORTER_OTLP_CLIENT_KEY", "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE", "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", "OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE", "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY"],
            None,
            "nothing: refused when set",
            "A client certificate for the collector (mutual TLS): not supported, so refused at start rather than ignored; terminate mutual TLS in a collector beside the sidecar.",
            client_certificate,
            |c| shown(c, |_| "<none>".to_owned()).unwrap_or_else(|| OFF.to_owned()),
        ),
        SERVICE_NAME: String = setting(
            "otel_service_name",
            &["OTEL_SERVICE_NAME"],
            None,
            "a name",
            "The resource's `service.name` (unset: the one in `OTEL_RESOURCE_ATTRIBUTES`, else `epode-sidecar`).",
            |v| if v.trim().is_empty() { Err(Bad::Whole) } else { Ok(v.trim().to_owned()) },
            |c| shown(c, |o| o.service_name.clone().unwrap_or_else(|| "<unset>".to_owned())).unwrap_or_else(|| OFF.to_owned()),
        ),
        RESOURCE_ATTRIBUTES: Vec<(String, String)> = setting(
            "otel_resource_attributes",
            &["OTEL_RESOURCE_ATTRIBUTES"],
            None,
            "comma-separated key=value pairs, values percent-encoded",
            "More resource attributes (`k8s.pod.name=…,deployment.environment=prod`); a `service.name` here yields to `OTEL_SERVICE_NAME`.",
            pairs,
            |c| shown(c, |o| o.resource.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")).unwrap_or_else(|| OFF.to_owned()),
        ),
        TRACES_SAMPLER: Sampling = setting(
            "otel_traces_sampler",
            &["OTEL_TRACES_SAMPLER"],
            Some("parentbased_always_on"),
            "always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio",
            "Which requests are traced, as the OpenTelemetry specification names samplers: by default every request whose client's trace is sampled, or that has no parent.",
            sampler,
            |c| shown(c, |o| o.sampling.name().to_owned()).unwrap_or_else(|| OFF.to_owned()),
        ),
        TRACES_SAMPLER_ARG: f64 = setting(
            "otel_traces_sampler_arg",
            &["OTEL_TRACES_SAMPLER_ARG"],
            None,
            "a ratio such as 0.25 (0 keeps no trace, 1 every trace; nothing outside them)",
            "The ratio of the `traceidratio` samplers (unset: 1).",
            ratio,
            |c| shown(c, |o| o.sampling.ratio().map_or("<not used>".to_owned(), |r| r.to_string())).unwrap_or_else(|| OFF.to_owned()),
        ),
    }
}
