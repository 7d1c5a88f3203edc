//! The one record of a request (see the module above): what is known of it as it travels,
//! and the one end that writes it all down, after its body.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use http::{Response, StatusCode};

use crate::auth::Asked;
use crate::body::{self, Body};
use crate::config::Config;
use crate::frontdoor;
use crate::mcp::end::{Abandoned, Failure};
use crate::mcp::method::{self, Method};
use crate::metrics::{MethodLabels, Metrics, RequestLabels, SkipLabels, SurfaceLabels};
use crate::observe::{HttpServed, McpServed, Millis, Note, Observer, ACCESS_TARGET};
use crate::otel::{self, Otel, ServerSpan};

/// What every record shares: where it is written.
pub(crate) struct Recorder {
    config: Arc<Config>,
    metrics: Arc<Metrics>,
    /// Whoever watches the requests (the local trial's console, with `--dev`).
    observer: Option<Arc<dyn Observer>>,
    /// OpenTelemetry, when on.
    otel: Option<Arc<Otel>>,
    /// `https` when the listener speaks TLS, for the spans' `url.scheme`.
    scheme: &'static str,
}

impl Recorder {
    pub(crate) fn new(
        config: Arc<Config>,
        metrics: Arc<Metrics>,
        observer: Option<Arc<dyn Observer>>,
        otel: Option<Arc<Otel>>,
    ) -> Arc<Recorder> {
        let scheme = if config.tls.is_some() {
            "https"
        } else {
            "http"
        };
        Arc::new(Recorder {
            config,
            metrics,
            observer,
            otel,
            scheme,
        })
    }

    /// The record of an MCP request, from its arrival.
    pub(crate) fn mcp<B>(
        self: &Arc<Self>,
        req: &http::Request<B>,
        peer: SocketAddr,
        abandoned: Abandoned,
    ) -> Record {
        let otel = self.otel.is_some();
        Record {
            recorder: self.clone(),
            started: Instant::now(),
            arrived: otel.then(SystemTime::now),
            asked: None,
            peer,
            kind: Kind::Mcp(Mcp {
                method: "-",
                era: "-",
                tool: None,
                note: self.observer.as_ref().map(|_| Arc::new(Note::at_start())),
                span: None,
                failure: None,
                trace_id: None,
                head: if otel { Head::of(req) } else { None },
                abandoned,
            }),
        }
    }

    /// The record of a request to the HTTP surface, from its arrival: its span starts now
    /// (its token's check runs inside it). `path` is the path as the routes read it.
    pub(crate) fn http(
        self: &Arc<Self>,
        parts: &http::request::Parts,
        path: &str,
        peer: SocketAddr,
    ) -> Record {
        let span = self.otel.as_ref().map(|o| {
            o.http_span(&otel::HttpCall {
                method: &parts.method,
                path,
                // A product's route: the sidecar does not know its template.
                route: None,
                scheme: self.scheme,
                headers: &parts.headers,
                peer,
                http_version: parts.version,
                started: None,
            })
        });
        Record {
            recorder: self.clone(),
            started: Instant::now(),
            arrived: Some(SystemTime::now()),
            asked: None,
            peer,
            kind: Kind::Http(HttpRoute {
                method: parts.method.clone(),
                path: self
                    .observer
                    .as_ref()
                    .map(|_| parts.uri.path().to_owned())
                    .unwrap_or_default(),
                span,
                outcome: HttpOutcome::Refused,
            }),
        }
    }
}

/// What an answer of the HTTP surface came to, for its counters and the console.
pub(crate) enum HttpOutcome {
    Instrumented {
        /// Where the envelope went (the metrics' label).
        surface: &'static str,
        state: &'static str,
        interaction_id: String,
    },
    /// Passed on untouched, and why (the metrics' label).
    Skipped(&'static str),
    /// The sidecar answered itself (a refusal, the upstream's failure).
    Refused,
}

/// One request, from its arrival to its end.
pub(crate) struct Record {
    recorder: Arc<Recorder>,
    started: Instant,
    /// When it arrived (with OpenTelemetry on: its span's start).
    arrived: Option<SystemTime>,
    /// The call its token's check made to the introspection endpoint, spanned under the
    /// request's span once that exists (the MCP path's starts after the check).
    asked: Option<Asked>,
    peer: SocketAddr,
    kind: Kind,
}

// One record per request, on the stack of its future: boxing the larger variant would cost
// every MCP request an allocation.
#[allow(clippy::large_enum_variant)]
enum Kind {
    Mcp(Mcp),
    Http(HttpRoute),
}

/// What is known of an MCP request.
struct Mcp {
    method: &'static str,
    era: &'static str,
    /// The tool of a `tools/call`, noted only for an observer (cut to [`SHOWN_NAME`]).
    tool: Option<String>,
    /// What the binding notes for an observer (only when there is one), or for a sampled
    /// span.
    note: Option<Arc<Note>>,
    /// Its server span, once the front door admitted it (with OpenTelemetry on).
    span: Option<ServerSpan>,
    /// The sidecar's own error answer, when it made one.
    failure: Option<Failure>,
    /// Its trace, for an observer (OpenTelemetry on, the span sampled).
    trace_id: Option<String>,
    /// What a refused request's span is made of (OpenTelemetry on, and the client sent a
    /// trace context): the request's head as it came, before the front read it.
    head: Option<Head>,
    /// How its plan ended, when only a drop could say (the client gone, a cut).
    abandoned: Abandoned,
}

/// What is known of a request to the HTTP surface.
struct HttpRoute {
    method: http::Method,
    /// Its path, for an observer.
    path: String,
    span: Option<otel::HttpSpan>,
    outcome: HttpOutcome,
}

/// The longest tool name a console entry shows.
const SHOWN_NAME: usize = 128;

/// The part of a request's head the span of its refusal needs (the header values are
/// shared, not copied).
struct Head {
    method: http::Method,
    version: http::Version,
    traceparent: http::HeaderValue,
    tracestate: Option<http::HeaderValue>,
}

impl Head {
    /// None when the request carries no `traceparent`: its refusal starts no trace.
    fn of<B>(req: &http::Request<B>) -> Option<Head> {
        Some(Head {
            traceparent: req.headers().get("traceparent")?.clone(),
            tracestate: req.headers().get("tracestate").cloned(),
            method: req.method().clone(),
            version: req.version(),
        })
    }
}

impl Record {
    /// A refusal made before any work (a client over its rate, a sidecar at its in-flight
    /// bound, a 2025 client's expected GET): never spanned, so a flood of them never crowds
    /// the span queue.
    pub(crate) fn unspanned(&mut self) {
        if let Kind::Mcp(m) = &mut self.kind {
            m.head = None;
        }
    }

    /// The introspection the token's check made: spanned under the surface's span now, or
    /// kept for the MCP request's span (or its refusal's).
    pub(crate) fn asked(&mut self, asked: Option<Asked>) {
        match &self.kind {
            Kind::Http(h) => {
                if let (Some(span), Some(asked)) = (&h.span, &asked) {
                    asked.span_under(span.context());
                }
            }
            Kind::Mcp(_) => self.asked = asked,
        }
    }

    /// The HTTP surface's span (its context goes upstream).
    pub(crate) fn http_span(&self) -> Option<&otel::HttpSpan> {
        match &self.kind {
            Kind::Http(h) => h.span.as_ref(),
            Kind::Mcp(_) => None,
        }
    }

    /// What an answer of the HTTP surface came to.
    pub(crate) fn outcome(&mut self, outcome: HttpOutcome) {
        if let Kind::Http(h) = &mut self.kind {
            h.outcome = outcome;
        }
    }

    /// An admitted MCP request: what its accounting needs (its method's label, its era, its
    /// tool for an observer), and its server span, which starts once the message is read
    /// (its context may be in `_meta`), before the scopes are checked, so a 403 is a span of
    /// the request too. `tool_listed`: whether its tool is one the upstream lists (only such a
    /// name becomes a metric attribute).
    pub(crate) fn admitted(&mut self, request: &frontdoor::Request<'_>, tool_listed: bool) {
        let (otel, observed) = (self.recorder.otel.clone(), self.recorder.observer.is_some());
        let (peer, arrived) = (self.peer, self.arrived);
        let asked = self.asked.take();
        let Kind::Mcp(m) = &mut self.kind else { return };
        m.method = method::label(request.listed);
        m.era = request.era.label();
        if observed && request.listed == Some(Method::ToolsCall) {
            m.tool = request
                .rpc
                .name()
                .map(|n| otel::cut(&n, SHOWN_NAME).into_owned());
        }
        let Some(otel) = otel else { return };
        let name = request.rpc.name();
        let uri = request
            .rpc
            .params
            .uri
            .and_then(|u| serde_json::from_str::<std::borrow::Cow<'_, str>>(u.get()).ok());
        let span = otel.server_span(&otel::Call {
            method: request.method(),
            listed: request.listed,
            name: name.as_deref(),
            tool_listed,
            uri: uri.as_deref(),
            id: request.id,
            protocol_version: protocol_version(request),
            headers: &request.parts.headers,
            meta: request.rpc.params.meta,
            peer,
            http_version: request.parts.version,
            started: arrived.unwrap_or_else(SystemTime::now),
        });
        if span.recording() && m.note.is_none() {
            m.note = Some(Arc::new(Note::at_start()));
        }
        if observed {
            m.trace_id = span.trace_id();
        }
        if let Some(asked) = asked {
            asked.span_under(span.context());
        }
        m.head = None;
        m.span = Some(span);
    }

    /// The sidecar's own error answer, by its JSON-RPC code.
    pub(crate) fn failed(&mut self, code: i64) {
        if let Kind::Mcp(m) = &mut self.kind {
            m.failure = Some(Failure::Code(code));
        }
    }

    /// What the binding notes of the request (for an observer, or a sampled span).
    pub(crate) fn note(&self) -> Option<&Arc<Note>> {
        match &self.kind {
            Kind::Mcp(m) => m.note.as_ref(),
            Kind::Http(_) => None,
        }
    }

    /// The MCP request's server span.
    pub(crate) fn span(&self) -> Option<&ServerSpan> {
        match &self.kind {
            Kind::Mcp(m) => m.span.as_ref(),
            Kind::Http(_) => None,
        }
    }

    /// Ends the request with its answer `resp`: once, after its body (a stream's at its end
    /// or its client's leaving, any other's now). The plan an ending only a drop signalled
    /// (a cut, a path that reported nothing) ends first, counted as a failure.
    pub(crate) fn end(mut self, resp: Response<Body>) -> Response<Body> {
        let head_elapsed = self.started.elapsed();
        let status = resp.status();
        let streams = match &mut self.kind {
            Kind::Mcp(m) => {
                // A streamed answer's plan lives on in its body and ends with it.
                m.abandoned.end_left();
                body::is_event_stream(resp.headers())
            }
            // The HTTP surface's answers may stream whatever their type.
            Kind::Http(_) => true,
        };
        if status.as_u16() >= 400 {
            self.refusal_span(status.as_u16());
        }
        let ending = Ending {
            record: Some(self),
            status,
            head_elapsed,
        };
        if streams {
            body::hold_until_end(resp, ending)
        } else {
            drop(ending);
            resp
        }
    }

    /// An MCP request refused before the front admitted it (its head, its body, its token, or
    /// a message that is not MCP) whose client sent a trace context: an HTTP server span by
    /// the HTTP conventions, its parent that `traceparent` (the message was not admitted, so
    /// its `_meta` is not read), with the token's introspection under it when the check made
    /// one; within the bound OpenTelemetry sets on refusals' spans, so they never crowd out
    /// those of admitted requests.
    fn refusal_span(&mut self, status: u16) {
        let (Some(otel), Kind::Mcp(m)) = (&self.recorder.otel, &mut self.kind) else {
            return;
        };
        let (None, Some(head)) = (&m.span, m.head.take()) else {
            return;
        };
        if !otel.may_span_refusal() {
            return;
        }
        let config = &self.recorder.config;
        let mut headers = http::HeaderMap::new();
        headers.insert("traceparent", head.traceparent);
        if let Some(ts) = head.tracestate {
            headers.insert("tracestate", ts);
        }
        let span = otel.http_span(&otel::HttpCall {
            method: &head.method,
            path: &config.path,
            route: Some(&config.path),
            scheme: self.recorder.scheme,
            headers: &headers,
            peer: self.peer,
            http_version: head.version,
            started: self.arrived,
        });
        if let Some(asked) = self.asked.take() {
            asked.span_under(span.context());
        }
        span.end(status);
    }

    /// Writes the request down: counters and duration, access line, span, console entry.
    fn close(self, status: StatusCode, head_elapsed: Duration) {
        let Record {
            recorder,
            kind,
            arrived,
            ..
        } = self;
        match kind {
            Kind::Mcp(m) => recorder.mcp_done(m, status, head_elapsed),
            Kind::Http(h) => recorder.http_done(h, status, (arrived, head_elapsed)),
        }
    }
}

/// The MCP version a request speaks: 2026-07-28, or the 2025 one its header names (the
/// latest when it names none the sidecar knows).
fn protocol_version(request: &frontdoor::Request<'_>) -> &'static str {
    use crate::mcp::version;
    match request.era {
        crate::mcp::era::Era::Modern => version::MODERN,
        crate::mcp::era::Era::Legacy => request
            .parts
            .headers
            .get(crate::mcp::headers::PROTOCOL_VERSION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                version::LEGACY_VERSIONS
                    .iter()
                    .copied()
                    .find(|known| *known == v)
            })
            .unwrap_or(version::LEGACY_LATEST),
    }
}

/// A record waiting for its answer's end; it writes itself down when dropped.
struct Ending {
    record: Option<Record>,
    status: StatusCode,
    head_elapsed: Duration,
}

impl Drop for Ending {
    fn drop(&mut self) {
        if let Some(record) = self.record.take() {
            record.close(self.status, self.head_elapsed);
        }
    }
}

impl Recorder {
    /// An MCP request's end: its counter and duration (with its span's exemplar), its access
    /// line, its span, its console entry.
    fn mcp_done(&self, m: Mcp, status: StatusCode, elapsed: Duration) {
        let code = status.as_u16();
        // A sampled request is its duration bucket's exemplar, with when it ended.
        let exemplar = m.span.as_ref().and_then(ServerSpan::exemplar);
        let at = exemplar.as_ref().map(|_| SystemTime::now());
        self.metrics
            .requests
            .get_or_create(&RequestLabels {
                method: m.method,
                era: m.era,
                status: code,
            })
            .inc();
        self.metrics
            .request_seconds
            .get_or_create(&MethodLabels { method: m.method })
            .observe(elapsed.as_secs_f64(), exemplar, at);
        if self.config.access_log {
            tracing::info!(
                target: ACCESS_TARGET,
                method = m.method,
                era = m.era,
                status = code,
                duration_ms = %Millis(elapsed),
                "request"
            );
        }
        let noted = m.note.as_ref().map(|n| n.noted()).unwrap_or_default();
        if let Some(span) = m.span {
            let failure = m.failure.or_else(|| m.abandoned.failure());
            span.end(code, failure, &noted);
        }
        if let (Some(observer), Some(note)) = (&self.observer, &m.note) {
            observer.request(McpServed {
                started: note.started(),
                noted,
                method: m.method,
                tool: m.tool,
                era: m.era,
                status: code,
                duration: elapsed,
                trace_id: m.trace_id,
            });
        }
    }

    /// An HTTP surface request's end: what its answer came to, counted; its console entry,
    /// its access line, its span.
    fn http_done(
        &self,
        h: HttpRoute,
        status: StatusCode,
        (arrived, elapsed): (Option<SystemTime>, Duration),
    ) {
        let code = status.as_u16();
        match &h.outcome {
            HttpOutcome::Instrumented { surface, .. } => {
                self.metrics
                    .http_instrumented
                    .get_or_create(&SurfaceLabels { surface })
                    .inc();
            }
            HttpOutcome::Skipped(reason) => {
                self.metrics
                    .http_skipped
                    .get_or_create(&SkipLabels { reason })
                    .inc();
            }
            HttpOutcome::Refused => {}
        }
        if let Some(observer) = &self.observer {
            let (surface, state, skipped, interaction_id) = match &h.outcome {
                HttpOutcome::Instrumented {
                    surface,
                    state,
                    interaction_id,
                } => (
                    Some(*surface),
                    Some(*state),
                    None,
                    Some(interaction_id.as_str()),
                ),
                HttpOutcome::Skipped(skip) => (None, None, Some(*skip), None),
                HttpOutcome::Refused => (None, None, None, None),
            };
            observer.http(HttpServed {
                started: arrived.unwrap_or_else(SystemTime::now),
                method: h.method.as_str(),
                path: &h.path,
                status: code,
                surface,
                skipped,
                state,
                interaction_id,
                duration: elapsed,
            });
        }
        if self.config.access_log {
            tracing::info!(
                target: ACCESS_TARGET,
                surface = "http",
                method = h.method.as_str(),
                status = code,
                duration_ms = %Millis(elapsed),
                "request"
            );
        }
        if let Some(span) = h.span {
            span.end(code);
        }
    }
}
