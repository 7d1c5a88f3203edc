//! The spans of one MCP request, named and attributed by the OpenTelemetry MCP semantic
//! conventions: the server span (from the request's arrival to its answer's end, its parent
//! the client's context from `params._meta` or the `traceparent` header) and the client span
//! of the upstream hop (whose context goes upstream in both places).

use std::net::SocketAddr;
use std::time::{Instant, SystemTime};

use http::HeaderMap;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use serde::Deserialize;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use super::shared::Shared;
use crate::mcp::end::Failure;
use crate::observe::Noted;

/// What the server span says of a request, as the front door read it.
pub(crate) struct Call<'a> {
    /// The method as the client wrote it (a span shows it, cut to [`MAX_NAME`]).
    pub(crate) method: &'a str,
    /// Its catalogue entry: what the histograms show (`other` for a method it does not list).
    pub(crate) listed: Option<crate::mcp::method::Method>,
    /// A `tools/call`'s tool, a `prompts/get`'s prompt.
    pub(crate) name: Option<&'a str>,
    /// Whether `name` is a tool the upstream lists: only then is it a histogram's attribute.
    pub(crate) tool_listed: bool,
    /// A resource request's URI.
    pub(crate) uri: Option<&'a str>,
    /// The request's id as it was written (a string keeps its quotes).
    pub(crate) id: &'a RawValue,
    /// The client's MCP version.
    pub(crate) protocol_version: &'static str,
    pub(crate) headers: &'a HeaderMap,
    /// The request's `params._meta`, where the conventions put the trace context.
    pub(crate) meta: Option<&'a RawValue>,
    pub(crate) peer: SocketAddr,
    pub(crate) http_version: http::Version,
    /// When the request arrived.
    pub(crate) started: SystemTime,
}

/// The longest method, tool or prompt name, or request id, a span or its name carries; the
/// longest URI. A client's string is cut there (at a character's boundary, marked `…`), so
/// no request can make a span (queued while the collector is slow) hold more.
pub(crate) const MAX_NAME: usize = 256;
pub(crate) const MAX_URI: usize = 1024;

/// `s`, cut to at most `max` bytes at a character's boundary (marked with `…`).
pub(crate) fn cut(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if s.len() <= max {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{}…", &s[..end]))
}

const TRACEPARENT: &str = "traceparent";
const TRACESTATE: &str = "tracestate";

/// The trace context keys of `params._meta`.
#[derive(Deserialize, Default)]
struct MetaContext<'a> {
    #[serde(borrow, default)]
    traceparent: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    tracestate: Option<std::borrow::Cow<'a, str>>,
}

impl Extractor for MetaContext<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            TRACEPARENT => self.traceparent.as_deref(),
            TRACESTATE => self.tracestate.as_deref(),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT, TRACESTATE]
    }
}

/// The client's context: `params._meta` first (the conventions' place), else the headers.
fn parent(call: &Call<'_>) -> Context {
    let propagator = TraceContextPropagator::new();
    let meta: MetaContext<'_> = call
        .meta
        .filter(|m| m.get().contains(TRACEPARENT))
        .and_then(|m| serde_json::from_str(m.get()).ok())
        .unwrap_or_default();
    if meta.traceparent.is_some() {
        let cx = propagator.extract(&meta);
        if cx.span().span_context().is_valid() {
            return cx;
        }
    }
    if call.headers.contains_key(TRACEPARENT) {
        return propagator.extract(&opentelemetry_http::HeaderExtractor(call.headers));
    }
    Context::new()
}

/// A request id as the conventions write it: a string without its quotes, a number as is;
/// none for `null`; cut to [`MAX_NAME`].
fn request_id(id: &RawValue) -> Option<String> {
    let raw = id.get();
    if raw == "null" {
        return None;
    }
    let id = match serde_json::from_str::<String>(raw) {
        Ok(s) => s,
        Err(_) => raw.to_owned(),
    };
    Some(cut(&id, MAX_NAME).into_owned())
}

/// A 2025 client's `Mcp-Session-Id`, as the span names it: the first 16 bytes of its SHA-256
/// in hex (the id the sidecar mints seals the client's capabilities; it is never shown).
pub(crate) fn session_ref(id: &str) -> String {
    let digest = Sha256::digest(id.as_bytes());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

fn http_version(v: http::Version) -> &'static str {
    match v {
        http::Version::HTTP_09 => "0.9",
        http::Version::HTTP_10 => "1.0",
        http::Version::HTTP_2 => "2",
        http::Version::HTTP_3 => "3",
        _ => "1.1",
    }
}

/// `{mcp.method.name} {target}`, the target the tool or prompt (never a URI); each cut to
/// [`MAX_NAME`].
fn span_name(method: &str, name: Option<&str>) -> String {
    let method = cut(method, MAX_NAME);
    match name {
        Some(n) if matches!(&*method, "tools/call" | "prompts/get") => {
            format!("{method} {}", cut(n, MAX_NAME))
        }
        _ => method.into_owned(),
    }
}

/// The attributes the conventions name for the request itself, the server's and the hop's
/// alike: the method, tool and prompt as the client named them (cut), then the request's own.
fn request_attributes(call: &Call<'_>, out: &mut Vec<KeyValue>) {
    out.push(KeyValue::new(
        "mcp.method.name",
        cut(call.method, MAX_NAME).into_owned(),
    ));
    out.push(KeyValue::new("mcp.protocol.version", call.protocol_version));
    match (call.method, call.name) {
        ("tools/call", Some(n)) => {
            out.push(KeyValue::new(
                "gen_ai.tool.name",
                cut(n, MAX_NAME).into_owned(),
            ));
            out.push(KeyValue::new("gen_ai.operation.name", "execute_tool"));
        }
        ("prompts/get", Some(n)) => out.push(KeyValue::new(
            "gen_ai.prompt.name",
            cut(n, MAX_NAME).into_owned(),
        )),
        _ => {}
    }
    if let Some(id) = request_id(call.id) {
        out.push(KeyValue::new("jsonrpc.request.id", id));
    }
    if let Some(uri) = call.uri {
        out.push(KeyValue::new(
            "mcp.resource.uri",
            cut(uri, MAX_URI).into_owned(),
        ));
    }
    if let Some(session) = call
        .headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
    {
        out.push(KeyValue::new("mcp.session.id", session_ref(session)));
    }
}

/// The attributes of the duration histograms: low cardinality only, from fixed sets. The
/// method is the catalogue's (`other` for one it does not list); the tool is one the
/// upstream lists, else `other`; a prompt is `other` (nothing lists the prompts): no client
/// can make the process keep an attribute set of its invention.
fn metric_attributes(call: &Call<'_>, transport: &'static str) -> Vec<KeyValue> {
    let mut out = Vec::with_capacity(6);
    out.push(KeyValue::new(
        "mcp.method.name",
        crate::mcp::method::label(call.listed),
    ));
    out.push(KeyValue::new("mcp.protocol.version", call.protocol_version));
    out.push(KeyValue::new("network.transport", transport));
    match (call.listed, call.name) {
        (Some(crate::mcp::method::Method::ToolsCall), Some(n)) => {
            let tool = if call.tool_listed {
                Value::from(std::sync::Arc::<str>::from(n))
            } else {
                Value::from("other")
            };
            out.push(KeyValue::new("gen_ai.tool.name", tool));
            out.push(KeyValue::new("gen_ai.operation.name", "execute_tool"));
        }
        (Some(crate::mcp::method::Method::PromptsGet), Some(_)) => {
            out.push(KeyValue::new("gen_ai.prompt.name", "other"));
        }
        _ => {}
    }
    out
}

fn error_type(f: Failure) -> String {
    match f {
        Failure::Code(c) => c.to_string(),
        Failure::ToolError => "tool_error".to_owned(),
        Failure::Other => "_OTHER".to_owned(),
    }
}

/// How a span ends: the answer's HTTP status and what its answer showed.
fn finish(
    span: &opentelemetry::trace::SpanRef<'_>,
    status: u16,
    failure: Option<Failure>,
) -> Option<String> {
    let error = match failure {
        Some(f) => Some(error_type(f)),
        None if status >= 400 => Some(status.to_string()),
        None => None,
    };
    if let Some(e) = &error {
        span.set_attribute(KeyValue::new("error.type", e.clone()));
        if let Some(Failure::Code(c)) = failure {
            span.set_attribute(KeyValue::new("rpc.response.status_code", c.to_string()));
        }
        span.set_status(Status::error(match failure {
            Some(Failure::ToolError) => "the tool's result says isError",
            Some(Failure::Code(_)) => "the answer is a JSON-RPC error",
            _ => "the request failed",
        }));
    }
    error
}

/// A span's duration in its histogram (when metrics are on), `error.type` among the
/// attributes when it failed.
fn record(
    histogram: Option<&opentelemetry::metrics::Histogram<f64>>,
    started: Instant,
    attributes: &mut Vec<KeyValue>,
    error: Option<String>,
) {
    if let Some(h) = histogram {
        if let Some(e) = error {
            attributes.push(KeyValue::new("error.type", e));
        }
        h.record(started.elapsed().as_secs_f64(), attributes);
    }
}

/// One request's server span, ended by [`ServerSpan::end`] (or, when its answer is a stream
/// the client leaves, when dropped).
pub(crate) struct ServerSpan {
    cx: Context,
    name: String,
    /// The request's own attributes, for the hop's span (empty when not recording).
    call: Vec<KeyValue>,
    /// The duration histogram's attributes (empty when metrics are off).
    metric: Vec<KeyValue>,
    /// A `tools/call`'s tool, when the upstream did not list it as the request arrived: the
    /// histograms name it once it is listed (the call's own listing may teach it), else
    /// `other`.
    unlisted_tool: Option<(std::sync::Arc<str>, std::sync::atomic::AtomicBool)>,
    started: Instant,
    otel: std::sync::Arc<Shared>,
    ended: bool,
}

impl ServerSpan {
    pub(super) fn start(otel: &std::sync::Arc<Shared>, call: &Call<'_>) -> ServerSpan {
        let parent = parent(call);
        let name = span_name(call.method, call.name);
        let mut span = otel
            .tracer
            .span_builder(name.clone())
            .with_kind(SpanKind::Server)
            .with_start_time(call.started)
            .start_with_context(&otel.tracer, &parent);
        let recording = span.is_recording();
        let metrics = otel.server_duration.is_some();
        let base = if metrics {
            metric_attributes(call, "tcp")
        } else {
            Vec::new()
        };
        let mut attributes = Vec::new();
        if recording {
            attributes.reserve(12);
            request_attributes(call, &mut attributes);
            let mut own = attributes.clone();
            own.push(KeyValue::new("network.transport", "tcp"));
            own.push(KeyValue::new("network.protocol.name", "http"));
            own.push(KeyValue::new(
                "network.protocol.version",
                http_version(call.http_version),
            ));
            own.push(KeyValue::new("client.address", call.peer.ip().to_string()));
            own.push(KeyValue::new("client.port", i64::from(call.peer.port())));
            span.set_attributes(own);
        }
        let unlisted_tool = match (call.listed, call.name) {
            (Some(crate::mcp::method::Method::ToolsCall), Some(n))
                if metrics && !call.tool_listed =>
            {
                let name = std::sync::Arc::<str>::from(cut(n, MAX_NAME));
                Some((name, std::sync::atomic::AtomicBool::new(false)))
            }
            _ => None,
        };
        ServerSpan {
            cx: parent.with_span(span),
            name,
            call: attributes,
            metric: if metrics { base } else { Vec::new() },
            unlisted_tool,
            started: Instant::now(),
            otel: otel.clone(),
            ended: false,
        }
    }

    /// Its context (the parent of what the request's work makes).
    pub(crate) fn context(&self) -> &Context {
        &self.cx
    }

    /// Its trace id (hex), when it is sampled.
    pub(crate) fn trace_id(&self) -> Option<String> {
        let span = self.cx.span();
        let sc = span.span_context();
        sc.is_sampled().then(|| sc.trace_id().to_string())
    }

    /// Its trace and span ids, when it is sampled: the exemplar of the duration it is counted in.
    pub(crate) fn exemplar(&self) -> Option<crate::metrics::TraceLabels> {
        let span = self.cx.span();
        let sc = span.span_context();
        sc.is_sampled().then(|| crate::metrics::TraceLabels {
            trace_id: sc.trace_id().to_string(),
            span_id: sc.span_id().to_string(),
        })
    }

    /// The upstream lists the request's tool now (the call's own listing taught it): the
    /// histograms name it.
    pub(crate) fn tool_listed(&self) {
        if let Some((_, listed)) = &self.unlisted_tool {
            listed.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The histograms' attributes as they stand: the tool named once it is listed.
    fn metric_now(&self) -> Vec<KeyValue> {
        let mut metric = self.metric.clone();
        if let Some((name, listed)) = &self.unlisted_tool {
            if listed.load(std::sync::atomic::Ordering::Relaxed) {
                for kv in &mut metric {
                    if kv.key.as_str() == "gen_ai.tool.name" {
                        *kv = KeyValue::new("gen_ai.tool.name", Value::from(name.clone()));
                    }
                }
            }
        }
        metric
    }

    /// Whether it is sampled (its events are worth noting).
    pub(crate) fn recording(&self) -> bool {
        self.cx.span().is_recording()
    }

    /// Ends it: `status` the answer's HTTP status, `failure` what the answer showed, `noted`
    /// what the binding did (span events).
    pub(crate) fn end(mut self, status: u16, failure: Option<Failure>, noted: &[Noted]) {
        self.close(status, failure, noted);
    }

    fn close(&mut self, status: u16, failure: Option<Failure>, noted: &[Noted]) {
        if self.ended {
            return;
        }
        self.ended = true;
        let span = self.cx.span();
        for n in noted {
            match n {
                Noted::InteractionId(i) => span.add_event(
                    "epode.interaction",
                    vec![KeyValue::new("epode.interaction.id", i.clone())],
                ),
                Noted::Outcome(o) => span.add_event(
                    "epode.feedback",
                    vec![KeyValue::new("epode.feedback.outcome", *o)],
                ),
                Noted::IsError(_) => {}
            }
        }
        let error = finish(&span, status, failure);
        span.end();
        if self.otel.server_duration.is_some() {
            let mut metric = self.metric_now();
            record(
                self.otel.server_duration.as_ref(),
                self.started,
                &mut metric,
                error,
            );
        }
    }
}

impl Drop for ServerSpan {
    fn drop(&mut self) {
        // A stream whose client left: the answer never ended.
        self.close(499, None, &[]);
    }
}

/// The upstream hop's client span; its context is what goes upstream.
pub(crate) struct HopSpan {
    cx: Context,
    metric: Vec<KeyValue>,
    started: Instant,
    otel: std::sync::Arc<Shared>,
    ended: bool,
}

/// The W3C fields of a context, for the upstream's headers and `params._meta`.
#[derive(Default)]
pub(crate) struct Fields(pub(crate) Vec<(&'static str, String)>);

impl Injector for Fields {
    fn set(&mut self, key: &str, value: String) {
        let key = match key {
            TRACEPARENT => TRACEPARENT,
            TRACESTATE => TRACESTATE,
            _ => return,
        };
        self.0.push((key, value));
    }
}

impl HopSpan {
    pub(super) fn start(otel: &std::sync::Arc<Shared>, server: &ServerSpan) -> HopSpan {
        let hop = &otel.hop;
        let mut span = otel
            .tracer
            .span_builder(server.name.clone())
            .with_kind(SpanKind::Client)
            .start_with_context(&otel.tracer, &server.cx);
        if span.is_recording() {
            let mut attributes = server.call.clone();
            attributes.push(KeyValue::new("network.transport", hop.transport));
            if let Some(a) = &hop.address {
                attributes.push(KeyValue::new("server.address", a.clone()));
            }
            if let Some(p) = hop.port {
                attributes.push(KeyValue::new("server.port", p));
            }
            if hop.transport == "tcp" {
                attributes.push(KeyValue::new("network.protocol.name", "http"));
            }
            span.set_attributes(attributes);
        }
        let mut metric = Vec::new();
        if otel.client_duration.is_some() {
            metric = server.metric_now();
            for kv in &mut metric {
                if kv.key.as_str() == "network.transport" {
                    *kv = KeyValue::new("network.transport", hop.transport);
                }
            }
        }
        HopSpan {
            cx: server.cx.with_span(span),
            metric,
            started: Instant::now(),
            otel: otel.clone(),
            ended: false,
        }
    }

    /// `traceparent` (and `tracestate`) of this span, for the upstream.
    pub(crate) fn fields(&self) -> Fields {
        let mut f = Fields::default();
        TraceContextPropagator::new().inject_context(&self.cx, &mut f);
        f
    }

    pub(crate) fn end(mut self, status: u16, failure: Option<Failure>) {
        self.close(status, failure);
    }

    fn close(&mut self, status: u16, failure: Option<Failure>) {
        if self.ended {
            return;
        }
        self.ended = true;
        let span = self.cx.span();
        let error = finish(&span, status, failure);
        span.end();
        record(
            self.otel.client_duration.as_ref(),
            self.started,
            &mut self.metric,
            error,
        );
    }
}

impl Drop for HopSpan {
    fn drop(&mut self) {
        self.close(499, None);
    }
}

/// A request to the HTTP surface (a product route that is not MCP): an HTTP server span by
/// the HTTP conventions, its parent the client's `traceparent`; its context goes upstream in
/// the same header.
pub(crate) struct HttpSpan {
    cx: Context,
    ended: bool,
}

/// What the HTTP server span says of a request.
pub(crate) struct HttpCall<'a> {
    pub(crate) method: &'a http::Method,
    /// The path as the route matched it (no query).
    pub(crate) path: &'a str,
    /// The route, when the sidecar knows it (the MCP path): `http.route`, and in the name.
    pub(crate) route: Option<&'a str>,
    /// `http` or `https`, as the client reached the sidecar.
    pub(crate) scheme: &'static str,
    pub(crate) headers: &'a HeaderMap,
    pub(crate) peer: SocketAddr,
    pub(crate) http_version: http::Version,
    /// When the request arrived, if before now.
    pub(crate) started: Option<SystemTime>,
}

impl HttpSpan {
    pub(super) fn start(otel: &Shared, call: &HttpCall<'_>) -> HttpSpan {
        let parent = if call.headers.contains_key(TRACEPARENT) {
            TraceContextPropagator::new()
                .extract(&opentelemetry_http::HeaderExtractor(call.headers))
        } else {
            Context::new()
        };
        let method = http_method(call.method);
        let name = match call.route {
            Some(route) => format!("{method} {route}"),
            None => method.to_owned(),
        };
        let mut builder = otel.tracer.span_builder(name).with_kind(SpanKind::Server);
        if let Some(at) = call.started {
            builder = builder.with_start_time(at);
        }
        let mut span = builder.start_with_context(&otel.tracer, &parent);
        if span.is_recording() {
            if let Some(route) = call.route {
                span.set_attribute(KeyValue::new("http.route", route.to_owned()));
            }
            span.set_attributes([
                KeyValue::new("http.request.method", method),
                KeyValue::new("url.path", cut(call.path, MAX_URI).into_owned()),
                KeyValue::new("url.scheme", call.scheme),
                KeyValue::new("network.protocol.name", "http"),
                KeyValue::new("network.protocol.version", http_version(call.http_version)),
                KeyValue::new("client.address", call.peer.ip().to_string()),
                KeyValue::new("client.port", i64::from(call.peer.port())),
            ]);
        }
        HttpSpan {
            cx: parent.with_span(span),
            ended: false,
        }
    }

    /// Its context (the parent of a call made for the request).
    pub(crate) fn context(&self) -> &Context {
        &self.cx
    }

    /// Sets this span's context as the request's `traceparent` (and `tracestate`) upstream.
    pub(crate) fn inject(&self, headers: &mut HeaderMap) {
        headers.remove(TRACESTATE);
        TraceContextPropagator::new()
            .inject_context(&self.cx, &mut opentelemetry_http::HeaderInjector(headers));
    }

    pub(crate) fn end(mut self, status: u16) {
        self.close(status);
    }

    fn close(&mut self, status: u16) {
        if self.ended {
            return;
        }
        self.ended = true;
        let span = self.cx.span();
        answered_with(&span, status, "");
        span.end();
    }
}

/// An HTTP client span's answer: its status, and from 500 on the error type and status
/// (`description`: the status's, where one is wanted).
pub(super) fn answered_with(
    span: &opentelemetry::trace::SpanRef<'_>,
    status: u16,
    description: &str,
) {
    span.set_attribute(KeyValue::new(
        "http.response.status_code",
        i64::from(status),
    ));
    if status >= 500 {
        span.set_attribute(KeyValue::new("error.type", status.to_string()));
        span.set_status(Status::error(description.to_owned()));
    }
}

impl Drop for HttpSpan {
    fn drop(&mut self) {
        // The client left before the answer's end.
        self.close(499);
    }
}

/// The method as the HTTP conventions name it (`_OTHER` for one they do not know).
fn http_method(m: &http::Method) -> &'static str {
    match m.as_str() {
        "GET" => "GET",
        "POST" => "POST",
        "PUT" => "PUT",
        "DELETE" => "DELETE",
        "PATCH" => "PATCH",
        "HEAD" => "HEAD",
        "OPTIONS" => "OPTIONS",
        "CONNECT" => "CONNECT",
        "TRACE" => "TRACE",
        _ => "_OTHER",
    }
}
