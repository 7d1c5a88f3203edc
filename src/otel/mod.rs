//! OpenTelemetry, on when an OTLP endpoint is set (`EPODE_SIDECAR_OTLP_ENDPOINT`): the
//! tracer and the meter every request path shares ([`Otel`]), the spans of one request
//! (`span.rs`, by the MCP semantic conventions), and their delivery (`export.rs`: a bounded
//! queue and the official OTLP/HTTP exporter, `http.rs` its client). Off, nothing here is
//! built and a request pays one `Option` check.

mod export;
mod http;
mod mirror;
mod shared;
mod span;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use opentelemetry::metrics::{Histogram, MeterProvider as _};
use opentelemetry::trace::{
    Link, SpanContext, SpanKind, Status, TraceContextExt as _, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::metrics::{ManualReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider, SpanExporter as _};
use opentelemetry_sdk::Resource;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::{OtelConfig, Sampling, UpstreamTransport};
use crate::metrics::Metrics;

use self::shared::{HopTarget, Shared};
pub(crate) use self::span::{cut, Call, HopSpan, HttpCall, HttpSpan, ServerSpan};

/// A response whose span ends when its body does: a stream's at its end (or when its client
/// leaves), any other's now.
pub(crate) fn end_with_body<G: Send + Unpin + 'static>(
    resp: ::http::Response<crate::body::Body>,
    guard: G,
) -> ::http::Response<crate::body::Body> {
    if crate::body::is_event_stream(resp.headers()) {
        crate::body::hold_until_end(resp, guard)
    } else {
        drop(guard);
        resp
    }
}

/// The tracer and the instruments, shared by every worker; the delivery tasks run on the
/// main loop until [`Otel::shutdown`].
pub(crate) struct Otel {
    shared: Arc<Shared>,
    /// How full the span queue is, and how fast refusals may be spanned.
    room: export::QueueRoom,
    refusals: governor::DefaultDirectRateLimiter,
    provider: SdkTracerProvider,
    meters: Option<SdkMeterProvider>,
    stop: watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    timeout: Duration,
}

/// Refused requests spanned at most, a second (a burst as large).
const REFUSAL_SPANS: governor::Quota =
    governor::Quota::per_second(std::num::NonZeroU32::new(20).unwrap());

/// The tracer for the spans made below a request or beside it (the calls to Epode, the
/// telemetry deliveries); set once, when OpenTelemetry starts. Unset, [`child`] and [`linked`]
/// return at once.
static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// A span below the request path's (a call to Epode), or a delivery's linked to the calls it
/// carries; ended when dropped.
pub(crate) struct Child {
    cx: Context,
}

impl Child {
    /// Records an attribute.
    pub(crate) fn set(&self, kv: KeyValue) {
        self.cx.span().set_attribute(kv);
    }

    /// Records a failure: `error.type` and the error status.
    pub(crate) fn failed(&self, error_type: &str) {
        let span = self.cx.span();
        span.set_attribute(KeyValue::new("error.type", error_type.to_owned()));
        span.set_status(Status::error(error_type.to_owned()));
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.cx.span().end();
    }
}

/// A client span under the current context's span (the request's, while the method table
/// serves it), when OpenTelemetry is on and that span is sampled.
pub(crate) fn child(
    name: &'static str,
    attributes: impl FnOnce() -> Vec<KeyValue>,
) -> Option<Child> {
    let tracer = TRACER.get()?;
    Context::map_current(|cx| {
        if !cx.span().span_context().is_sampled() {
            return None;
        }
        let span = tracer
            .span_builder(name)
            .with_kind(SpanKind::Client)
            .with_attributes(attributes())
            .start_with_context(tracer, cx);
        Some(Child {
            cx: cx.with_span(span),
        })
    })
}

/// The spans of the sidecar's own upstream requests (`upstream::OwnSpans`): a client span
/// named for what it asks, under the request being served, or a root when none is (a listen
/// feed's stream, a held call let go by the sweeper), with `epode.reason` saying why.
pub(crate) struct OwnRequests;

impl crate::upstream::OwnSpans for OwnRequests {
    fn start(
        &self,
        name: &'static str,
        reason: &'static str,
    ) -> Option<Box<dyn crate::upstream::OwnSpan>> {
        let tracer = TRACER.get()?;
        let attributes = vec![
            KeyValue::new("mcp.method.name", name),
            KeyValue::new("epode.reason", reason),
        ];
        let cx = Context::map_current(|cx| {
            if !cx.has_active_span() {
                // Nothing is being served: a root (sampled as the sampler says).
                let span = tracer
                    .span_builder(name)
                    .with_kind(SpanKind::Client)
                    .with_attributes(attributes)
                    .start_with_context(tracer, &Context::new());
                return Some(Context::new().with_span(span));
            }
            if !cx.span().span_context().is_sampled() {
                return None;
            }
            let span = tracer
                .span_builder(name)
                .with_kind(SpanKind::Client)
                .with_attributes(attributes)
                .start_with_context(tracer, cx);
            Some(cx.with_span(span))
        })?;
        cx.span()
            .span_context()
            .is_sampled()
            .then(|| Box::new(Child { cx }) as Box<dyn crate::upstream::OwnSpan>)
    }
}

impl crate::upstream::OwnSpan for Child {
    fn fields(&self) -> Vec<(&'static str, String)> {
        let mut f = span::Fields::default();
        opentelemetry::propagation::TextMapPropagator::inject_context(
            &opentelemetry_sdk::propagation::TraceContextPropagator::new(),
            &self.cx,
            &mut f,
        );
        f.0
    }

    fn answered(&self, status: u16) {
        span::answered_with(&self.cx.span(), status, &status.to_string());
    }
}

/// An event on the current context's span (the request's, while the method table serves it),
/// when OpenTelemetry is on and that span is sampled.
pub(crate) fn event(name: &'static str, attributes: impl FnOnce() -> Vec<KeyValue>) {
    if TRACER.get().is_none() {
        return;
    }
    Context::map_current(|cx| {
        let span = cx.span();
        if span.span_context().is_sampled() {
            span.add_event(name, attributes());
        }
    });
}

/// The current request's span context, to link to from work done later for it (its
/// telemetry event's delivery); none when OpenTelemetry is off or the span is not sampled.
pub(crate) fn current_link() -> Option<SpanContext> {
    TRACER.get()?;
    Context::map_current(|cx| {
        let span = cx.span();
        let sc = span.span_context();
        sc.is_sampled().then(|| sc.clone())
    })
}

/// A root span linked to the requests whose work it does (a telemetry batch), when any of
/// them was sampled.
pub(crate) fn linked(
    name: &'static str,
    links: Vec<SpanContext>,
    attributes: Vec<KeyValue>,
) -> Option<Child> {
    let tracer = TRACER.get()?;
    if links.is_empty() {
        return None;
    }
    let span = tracer
        .span_builder(name)
        .with_kind(SpanKind::Client)
        .with_attributes(attributes)
        .with_links(links.into_iter().map(Link::with_context).collect())
        .start_with_context(tracer, &Context::new());
    Some(Child {
        cx: Context::new().with_span(span),
    })
}

/// A client span under `parent` for a call made for its request before that request's span
/// could exist (the token's introspection, made before the message is read), with the times
/// the call had; when OpenTelemetry is on and `parent` is sampled.
pub(crate) fn past(
    parent: &Context,
    name: String,
    (started, ended): (std::time::SystemTime, std::time::SystemTime),
    attributes: impl FnOnce() -> Vec<KeyValue>,
    error: Option<&str>,
) {
    let Some(tracer) = TRACER.get() else { return };
    if !parent.span().span_context().is_sampled() {
        return;
    }
    let mut span = tracer
        .span_builder(name)
        .with_kind(SpanKind::Client)
        .with_start_time(started)
        .with_attributes(attributes())
        .start_with_context(tracer, parent);
    if let Some(e) = error {
        opentelemetry::trace::Span::set_attribute(
            &mut span,
            KeyValue::new("error.type", e.to_owned()),
        );
        opentelemetry::trace::Span::set_status(&mut span, Status::error(e.to_owned()));
    }
    opentelemetry::trace::Span::end_with_timestamp(&mut span, ended);
}

/// Runs `fut` with `span` as the current context (the spans its work makes hang below it).
///
/// A plain function returning one of two futures, not an `async fn`: an `async fn` keeps its
/// argument and the future it awaits, so a request's future held the method table's twice
/// (18 KB instead of 9 in a debug build, `-Zprint-type-sizes`), copied and polled through
/// on every request.
pub(crate) fn within<F: std::future::Future>(
    span: Option<&ServerSpan>,
    fut: F,
) -> impl std::future::Future<Output = F::Output> {
    use futures_util::future::Either;
    match span {
        Some(span) => Either::Left(opentelemetry::trace::FutureExt::with_context(
            fut,
            span.context().clone(),
        )),
        None => Either::Right(fut),
    }
}

/// The conventions' duration buckets (seconds).
const BUCKETS: [f64; 14] = [
    0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

fn sampler(s: Sampling) -> Sampler {
    match s {
        Sampling::AlwaysOn => Sampler::AlwaysOn,
        Sampling::AlwaysOff => Sampler::AlwaysOff,
        Sampling::Ratio(r) => Sampler::TraceIdRatioBased(r),
        Sampling::ParentOn => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
        Sampling::ParentOff => Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
        Sampling::ParentRatio(r) => Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(r))),
    }
}

fn resource(config: &OtelConfig) -> Resource {
    let mut attributes: Vec<KeyValue> = config
        .resource
        .iter()
        .map(|(k, v)| KeyValue::new(k.clone(), v.clone()))
        .collect();
    let named = config.resource.iter().any(|(k, _)| k == "service.name");
    let service = match (&config.service_name, named) {
        (Some(s), _) => Some(s.clone()),
        (None, true) => None,
        (None, false) => Some("epode-sidecar".to_owned()),
    };
    attributes.retain(|kv| service.is_none() || kv.key.as_str() != "service.name");
    if let Some(s) = service {
        attributes.push(KeyValue::new("service.name", s));
    }
    if !config.resource.iter().any(|(k, _)| k == "service.version") {
        attributes.push(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
    }
    attributes.push(KeyValue::new("telemetry.sdk.name", "opentelemetry"));
    attributes.push(KeyValue::new("telemetry.sdk.language", "rust"));
    Resource::builder_empty()
        .with_attributes(attributes)
        .build()
}

fn hop_target(upstream: &UpstreamTransport) -> HopTarget {
    match upstream {
        UpstreamTransport::Http(t) => HopTarget {
            transport: "tcp",
            address: t.url.host_str().map(str::to_owned),
            port: t.url.port_or_known_default().map(i64::from),
        },
        UpstreamTransport::Stdio(_) => HopTarget {
            transport: "pipe",
            address: None,
            port: None,
        },
    }
}

/// The meter, its two histograms, and the task that exports them (and, with
/// `families`, the `/metrics` families) every `every`.
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
fn meter(
    config: &OtelConfig,
    every: Duration,
    client: http::Client,
    headers: ::http::HeaderMap,
    resource: Resource,
    metrics: Arc<Metrics>,
    families: Option<Box<dyn Fn() + Send + Sync>>,
    stopped: watch::Receiver<bool>,
) -> Result<
    (
        SdkMeterProvider,
        Histogram<f64>,
        Histogram<f64>,
        JoinHandle<()>,
    ),
    String,
> {
    let url = config
        .metrics_url
        .as_ref()
        .ok_or("no OTLP metrics endpoint")?
        .as_str()
        .parse::<::http::Uri>()
        .map_err(|e| format!("the OTLP metrics URL is not a URI: {e}"))?;
    let reader = export::SharedReader(Arc::new(ManualReader::builder().build()));
    let provider = SdkMeterProvider::builder()
        .with_reader(reader.clone())
        .with_resource(resource)
        .build();
    let meter = provider.meter("epode-sidecar");
    let server = meter
        .f64_histogram("mcp.server.operation.duration")
        .with_unit("s")
        .with_description("MCP request duration as observed on the receiver from the time it was received until the result or ack is sent.")
        .with_boundaries(BUCKETS.to_vec())
        .build();
    let client_duration = meter
        .f64_histogram("mcp.client.operation.duration")
        .with_unit("s")
        .with_description("The duration of the MCP request or notification as observed on the sender from the time it was sent until the response or ack is received.")
        .with_boundaries(BUCKETS.to_vec())
        .build();
    let export = export::MetricsExport {
        reader,
        client,
        url,
        headers,
        families,
    };
    let task = tokio::spawn(export::ship_metrics(
        export,
        metrics,
        every,
        config.timeout,
        stopped,
    ));
    Ok((provider, server, client_duration, task))
}

/// The headers of every metrics export: the operator's (`OTEL_EXPORTER_OTLP_HEADERS`), and
/// the protobuf content type.
fn metric_headers(headers: &[(String, String)]) -> Result<::http::HeaderMap, String> {
    let mut out = ::http::HeaderMap::new();
    for (k, v) in headers {
        let name = ::http::HeaderName::from_bytes(k.as_bytes()).map_err(|_| {
            format!("OTEL_EXPORTER_OTLP_HEADERS names a header that is not a header name: {k}")
        })?;
        // The value is a secret: never shown.
        let value = ::http::HeaderValue::from_str(v).map_err(|_| {
            format!("OTEL_EXPORTER_OTLP_HEADERS gives {k} a value that cannot be a header value")
        })?;
        out.append(name, value);
    }
    out.insert(
        ::http::header::CONTENT_TYPE,
        ::http::HeaderValue::from_static("application/x-protobuf"),
    );
    Ok(out)
}

impl Otel {
    /// Builds the tracer and the meter and starts their delivery (on the current loop).
    /// `read_gauges` reads the gauges that are read when shown, before each export of the
    /// `/metrics` families.
    pub(crate) fn start(
        config: &OtelConfig,
        upstream: &UpstreamTransport,
        metrics: Arc<Metrics>,
        read_gauges: Box<dyn Fn() + Send + Sync>,
    ) -> Result<Arc<Otel>, String> {
        let resource = resource(config);
        let headers: std::collections::HashMap<String, String> =
            config.headers.iter().cloned().collect();
        let client = http::Client::new(config.timeout, config.ca_file.as_deref())?;
        let mut spans = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client.clone())
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(config.traces_url.as_str())
            .with_timeout(config.timeout)
            .with_headers(headers)
            .build()
            .map_err(|e| format!("cannot build the OTLP span exporter: {e}"))?;
        spans.set_resource(&resource);
        for s in [export::TRACES, export::METRICS] {
            let _ = metrics.otlp.exported.get_or_create(&s);
            let _ = metrics.otlp.failed.get_or_create(&s);
        }
        let _ = metrics.otlp.dropped.get_or_create(&export::TRACES);
        let (queue, rx) = export::SpanQueue::new(config.queue, metrics.clone());
        let room = queue.room();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(queue)
            .with_sampler(sampler(config.sampling))
            .with_resource(resource.clone())
            .with_max_events_per_span(32)
            .with_max_attributes_per_span(32)
            .build();
        let tracer = provider.tracer("epode-sidecar");
        // One provider per process: a second start (tests build several in one process) keeps
        // the first tracer for the spans made beside the request path.
        let _ = TRACER.set(tracer.clone());
        let (stop, stopped) = watch::channel(false);
        let mut tasks = vec![tokio::spawn(export::ship_spans(
            rx,
            spans,
            metrics.clone(),
            config.timeout,
            stopped.clone(),
        ))];
        let (meters, server_duration, client_duration) = match config.metrics_every {
            None => (None, None, None),
            Some(every) => {
                let families = config.metrics_families.then_some(read_gauges);
                let (provider, server, client, task) = meter(
                    config,
                    every,
                    client,
                    metric_headers(&config.headers)?,
                    resource,
                    metrics,
                    families,
                    stopped,
                )?;
                tasks.push(task);
                (Some(provider), Some(server), Some(client))
            }
        };
        Ok(Arc::new(Otel {
            room,
            refusals: governor::RateLimiter::direct(REFUSAL_SPANS),
            shared: Arc::new(Shared {
                tracer,
                server_duration,
                client_duration,
                hop: hop_target(upstream),
            }),
            provider,
            meters,
            stop,
            tasks: Mutex::new(tasks),
            timeout: config.timeout,
        }))
    }

    /// Whether a refused request may be spanned now: while at most half of the span queue is
    /// taken, and at most [`REFUSAL_SPANS`] a second, so refusals (a flood of them, each with
    /// a sampled `traceparent`) never crowd out the spans of admitted requests.
    pub(crate) fn may_span_refusal(&self) -> bool {
        self.room.half_free() && self.refusals.check().is_ok()
    }

    /// A request's server span.
    pub(crate) fn server_span(&self, call: &Call<'_>) -> ServerSpan {
        ServerSpan::start(&self.shared, call)
    }

    /// A request to the HTTP surface's server span.
    pub(crate) fn http_span(&self, call: &HttpCall<'_>) -> HttpSpan {
        HttpSpan::start(&self.shared, call)
    }

    /// The upstream hop's client span, under `server`.
    pub(crate) fn hop_span(&self, server: &ServerSpan) -> HopSpan {
        HopSpan::start(&self.shared, server)
    }

    /// Sends what is queued (spans, the last metrics) within the export timeout, then stops.
    pub(crate) async fn shutdown(&self) {
        let _ = self.stop.send(true);
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        let all = futures_util::future::join_all(tasks);
        if tokio::time::timeout(self.timeout + Duration::from_secs(1), all)
            .await
            .is_err()
        {
            tracing::warn!("OpenTelemetry export did not finish within its timeout at shutdown");
        }
        let _ = self.provider.shutdown();
        if let Some(m) = &self.meters {
            let _ = m.shutdown();
        }
    }
}

#[cfg(test)]
mod tests;
