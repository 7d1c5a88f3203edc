//! One worker's request path for the MCP endpoint: the limits that are cheap to check before a
//! body is read (rate, requests in flight), the front door, the method table (`table`), and the
//! accounting of every request (metrics, one log line). A request still running when the
//! sidecar cuts in-flight work at shutdown gets a JSON-RPC error, not a closed connection.

mod table;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use http::{Response, StatusCode};
use hyper::body::Incoming;
use tokio::sync::watch;

use crate::auth::{Authorizer, Principal};
use crate::binding::FeedbackBinding;
use crate::body::{self, Body};
use crate::budget::MemoryBudget;
use crate::caller::Caller;
use crate::config::Config;
use crate::error::{Error, ErrorKind, Level};
use crate::frontdoor;
use crate::gate::Gate;
use crate::limits::{retry_after_secs, RateLimits};
use crate::mcp::end::{Abandoned, Failure};
use crate::mcp::method::{self, Method};
use crate::metrics::{HeadRefusal, LimitKind, MethodLabels, Metrics, RequestLabels};
use crate::observe::{McpServed, Millis, Note, Observer, ACCESS_TARGET};
use crate::otel::{self, Otel, ServerSpan};
use crate::upstream::{Client, Upstream};

use self::table::MethodTable;

/// One worker's request path: the method table (with the configuration, its view of the
/// upstream, the binding), and the limits and metrics every worker shares.
pub(crate) struct Dispatcher {
    table: MethodTable,
    /// The front door's settings, the body's bounds, the access log.
    config: Arc<Config>,
    /// The accounting of every request and of every limit met before the table.
    metrics: Arc<Metrics>,
    /// The clients' rate limits (the tools' are the table's).
    rates: Arc<RateLimits>,
    budget: Arc<MemoryBudget>,
    /// The MCP requests being served (every worker's).
    in_flight: Gate,
    /// Whoever watches the requests (the local trial's console, with `--dev`).
    observer: Option<Arc<dyn Observer>>,
    /// The authorization front door, when on.
    auth: Option<Arc<Authorizer>>,
    /// OpenTelemetry, when on.
    otel: Option<Arc<Otel>>,
}

/// What is known of a request for its accounting, as it travels.
struct Seen {
    method: &'static str,
    era: &'static str,
    /// The tool of a `tools/call`, noted only for an observer.
    tool: Option<String>,
    /// What the binding notes for an observer (only when there is one), or for a sampled
    /// span.
    note: Option<Arc<Note>>,
    /// Its server span, once the front door admitted it (with OpenTelemetry on).
    span: Option<ServerSpan>,
    /// The sidecar's own error answer, when it made one.
    failure: Option<Failure>,
    /// When it arrived (with OpenTelemetry on: its span's start).
    arrived: Option<std::time::SystemTime>,
    /// Its trace, for an observer (OpenTelemetry on, the span sampled).
    trace_id: Option<String>,
    /// The call its token's check made to the introspection endpoint, spanned under the
    /// request's span once that exists.
    asked: Option<crate::auth::Asked>,
    /// What a refused request's span is made of (OpenTelemetry on, and the client sent a
    /// trace context): the request's head as it came, before the front door read it.
    head: Option<Head>,
}

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

/// What a request path is made of: the pieces it shares with the routes and the shutdown
/// (`cli` builds them once), the signal that cuts in-flight requests, and whoever watches the
/// requests (the local trial's console, with `--dev`).
pub(crate) struct Parts {
    pub(crate) config: Arc<Config>,
    /// This worker's view of the upstream.
    pub(crate) upstream: Arc<Upstream>,
    pub(crate) binding: Arc<FeedbackBinding>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) rates: Arc<RateLimits>,
    pub(crate) budget: Arc<MemoryBudget>,
    /// The MCP requests being served (every worker's).
    pub(crate) in_flight: Gate,
    /// Turns true when the sidecar cuts in-flight requests short at shutdown.
    pub(crate) cut: watch::Receiver<bool>,
    pub(crate) observer: Option<Arc<dyn Observer>>,
    pub(crate) auth: Option<Arc<Authorizer>>,
    pub(crate) otel: Option<Arc<Otel>>,
}

impl Dispatcher {
    /// A request path from its parts (nothing is started here: `cli` started the binding and
    /// the upstream when it built them).
    pub(crate) fn new(parts: Parts) -> Self {
        let Parts {
            config,
            upstream,
            binding,
            metrics,
            rates,
            budget,
            in_flight,
            cut,
            observer,
            auth,
            otel,
        } = parts;
        Dispatcher {
            table: MethodTable::new(
                config.clone(),
                upstream,
                binding,
                metrics.clone(),
                rates.clone(),
                cut,
                otel.clone(),
            ),
            config,
            metrics,
            rates,
            budget,
            in_flight,
            observer,
            auth,
            otel,
        }
    }

    /// The same request path for another worker, through that worker's view of the upstream
    /// (its own connection pool, which the worker's `/readyz` reads too).
    pub(crate) fn for_worker(&self, upstream: Arc<Upstream>) -> Self {
        Dispatcher {
            table: self.table.for_worker(upstream),
            config: self.config.clone(),
            metrics: self.metrics.clone(),
            rates: self.rates.clone(),
            budget: self.budget.clone(),
            in_flight: self.in_flight.clone(),
            observer: self.observer.clone(),
            auth: self.auth.clone(),
            otel: self.otel.clone(),
        }
    }

    /// One message to the MCP path, from the limits and the front door to the answer, counted
    /// and logged.
    pub(crate) async fn mcp(
        &self,
        req: http::Request<Incoming>,
        peer: SocketAddr,
        abandoned: Abandoned,
    ) -> Response<Body> {
        let started = Instant::now();
        let mut seen = Seen {
            method: "-",
            era: "-",
            tool: None,
            note: self.observer.as_ref().map(|_| Arc::new(Note::at_start())),
            span: None,
            failure: None,
            arrived: self.otel.as_ref().map(|_| std::time::SystemTime::now()),
            trace_id: None,
            asked: None,
            head: self.otel.as_ref().and_then(|_| Head::of(&req)),
        };
        let cors = frontdoor::cors::allowed_origin(&self.config, req.headers());
        let mut resp = self.serve(req, peer, abandoned.clone(), &mut seen).await;
        // The request's end step for an ending only a drop signalled: a plan the shutdown
        // cut (or a path that reported nothing) dropped unended ends here, recorded as a
        // failure. A streamed answer's plan lives on in its body and ends with it.
        abandoned.end_left();
        if let Some(origin) = cors {
            frontdoor::cors::allow(origin, resp.headers_mut());
        }
        let status = resp.status();
        if let (Some(otel), None, Some(head)) = (&self.otel, &seen.span, seen.head.take()) {
            if status.as_u16() >= 400 {
                self.refused_span(otel, head, &mut seen, peer, status.as_u16());
            }
        }
        // A sampled request is its duration bucket's exemplar, with when it ended.
        let exemplar = seen.span.as_ref().and_then(ServerSpan::exemplar);
        let at = exemplar.as_ref().map(|_| std::time::SystemTime::now());
        if let Some(span) = seen.span.take() {
            resp = otel::end_with_body(
                resp,
                SpanEnd {
                    span: Some(span),
                    status: status.as_u16(),
                    failure: seen.failure,
                    abandoned: abandoned.clone(),
                    note: seen.note.clone(),
                },
            );
        }
        let elapsed = started.elapsed();
        self.metrics
            .requests
            .get_or_create(&RequestLabels {
                method: seen.method,
                era: seen.era,
                status: status.as_u16(),
            })
            .inc();
        self.metrics
            .request_seconds
            .get_or_create(&MethodLabels {
                method: seen.method,
            })
            .observe(elapsed.as_secs_f64(), exemplar, at);
        if self.config.access_log {
            tracing::info!(
                target: ACCESS_TARGET,
                method = seen.method,
                era = seen.era,
                status = status.as_u16(),
                duration_ms = %Millis(elapsed),
                "request"
            );
        }
        match (&self.observer, seen.note.take()) {
            (Some(observer), Some(note)) => {
                show_call(observer.clone(), note, seen, status, elapsed, resp)
            }
            _ => resp,
        }
    }

    /// A request the sidecar refused before its front door admitted it (its head, its body,
    /// its token, or a message that is not MCP) whose client sent a trace context: an HTTP
    /// server span by the HTTP conventions, its parent that `traceparent` (the message was
    /// not admitted, so its `_meta` is not read), with the token's introspection under it
    /// when the check made one. A refusal with no trace context starts no trace: a flood of
    /// bad requests never crowds the span queue.
    fn refused_span(
        &self,
        otel: &Otel,
        head: Head,
        seen: &mut Seen,
        peer: SocketAddr,
        status: u16,
    ) {
        let mut headers = http::HeaderMap::new();
        headers.insert("traceparent", head.traceparent);
        if let Some(ts) = head.tracestate {
            headers.insert("tracestate", ts);
        }
        let span = otel.http_span(&otel::HttpCall {
            method: &head.method,
            path: &self.config.path,
            route: Some(&self.config.path),
            scheme: if self.config.tls.is_some() {
                "https"
            } else {
                "http"
            },
            headers: &headers,
            peer,
            http_version: head.version,
            started: seen.arrived,
        });
        if let Some(asked) = seen.asked.take() {
            asked.span_under(span.context());
        }
        span.end(status);
    }

    /// The caller of a request whose body was read, with auth on; the sidecar's own
    /// headers (`Epode-Auth-*`) removed from the client's and, with auth on, set from its
    /// verified token (whose `Authorization` goes no further unless configured). A refusal
    /// echoes the request's id when the message has one.
    async fn authorize(
        &self,
        parts: &mut http::request::Parts,
        bytes: &bytes::Bytes,
        address: &Caller,
        asked: &mut Option<crate::auth::Asked>,
    ) -> Result<Option<Arc<Principal>>, Response<Body>> {
        let Some(auth) = &self.auth else {
            crate::auth::strip_owned(&mut parts.headers);
            return Ok(None);
        };
        let checked = auth
            .check(&parts.headers, parts.uri.query(), address.key(), asked)
            .await;
        match checked {
            Ok(principal) => {
                auth.to_upstream(&mut parts.headers, &principal);
                Ok(Some(principal))
            }
            Err(refusal) => {
                let id = match frontdoor::admit(parts, bytes) {
                    Ok(Some(r)) => Some(r.id.to_owned()),
                    Ok(None) => None,
                    Err((_, id)) => id.map(ToOwned::to_owned),
                };
                Err(auth.refuse(&refusal).into_response(id.as_deref()))
            }
        }
    }

    /// The request with its caller, once its token holds every scope it needs (with auth on);
    /// else the 403, its JSON-RPC code noted for the request's span.
    fn scoped<'a>(
        &self,
        r: frontdoor::Request<'a>,
        principal: Option<Arc<Principal>>,
        seen: &mut Seen,
    ) -> Result<frontdoor::Request<'a>, Box<Response<Body>>> {
        if let (Some(auth), Some(p)) = (&self.auth, &principal) {
            if let Err(e) = self.table.require_scopes(auth, p, &r) {
                seen.failure = Some(Failure::Code(e.code()));
                return Err(Box::new(e.into_response(Some(r.id))));
            }
        }
        Ok(frontdoor::Request { principal, ..r })
    }

    /// A body that could not be read within the limits, counted by the limit.
    fn body_refused(&self, e: Error) -> Response<Body> {
        self.metrics.limit(match e.kind() {
            ErrorKind::BodyTooLarge { .. } => LimitKind::BodySize,
            ErrorKind::RequestTimeout => LimitKind::BodyTimeout,
            ErrorKind::Overloaded { .. } => LimitKind::MemoryBudget,
            _ => LimitKind::BodyRead,
        });
        e.into_response(None)
    }

    /// What the accounting of a request needs to know of it.
    fn note(&self, seen: &mut Seen, request: &frontdoor::Request<'_>) {
        seen.method = method::label(request.listed);
        if self.observer.is_some() && request.listed == Some(Method::ToolsCall) {
            seen.tool = request.rpc.name().map(|n| n.into_owned());
        }
        seen.era = request.era.label();
    }

    /// The request's server span; a sampled one has its binding's doings noted.
    fn start_span(
        &self,
        otel: &Arc<Otel>,
        seen: &mut Seen,
        request: &frontdoor::Request<'_>,
        peer: SocketAddr,
    ) {
        let name = request.rpc.name();
        let uri = request
            .rpc
            .params
            .uri
            .and_then(|u| serde_json::from_str::<std::borrow::Cow<'_, str>>(u.get()).ok());
        let protocol_version = match request.era {
            crate::mcp::era::Era::Modern => crate::mcp::version::MODERN,
            crate::mcp::era::Era::Legacy => request
                .parts
                .headers
                .get(crate::mcp::headers::PROTOCOL_VERSION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| {
                    crate::mcp::version::LEGACY_VERSIONS
                        .iter()
                        .copied()
                        .find(|known| *known == v)
                })
                .unwrap_or(crate::mcp::version::LEGACY_LATEST),
        };
        let span = otel.server_span(&otel::Call {
            method: request.method(),
            name: name.as_deref(),
            uri: uri.as_deref(),
            id: request.id,
            protocol_version,
            headers: &request.parts.headers,
            meta: request.rpc.params.meta,
            peer,
            http_version: request.parts.version,
            started: seen.arrived.unwrap_or_else(std::time::SystemTime::now),
        });
        if span.recording() && seen.note.is_none() {
            seen.note = Some(Arc::new(Note::at_start()));
        }
        if self.observer.is_some() {
            seen.trace_id = span.trace_id();
        }
        if let Some(asked) = seen.asked.take() {
            asked.span_under(span.context());
        }
        seen.head = None;
        seen.span = Some(span);
    }

    /// A request refused by its head: counted by reason, and a warning unless it is what
    /// well-behaved clients send (a 2025 client's GET stream).
    fn refuse_head(&self, e: Error, method: &http::Method) -> Response<Body> {
        let refusal = head_refusal(&e, method);
        self.metrics.refused(refusal);
        if refusal.expected() {
            tracing::debug!(error = %e, "refused at the front door");
        } else {
            tracing::warn!(error = %e, "refused at the front door");
        }
        e.into_response(None)
    }

    async fn serve(
        &self,
        req: http::Request<Incoming>,
        peer: SocketAddr,
        abandoned: Abandoned,
        seen: &mut Seen,
    ) -> Response<Body> {
        let (mut parts, body) = req.into_parts();
        if frontdoor::cors::is_preflight(&parts) {
            return frontdoor::cors::preflight(&self.config, &parts);
        }
        if let Err(e) = frontdoor::check_head(&self.config, &parts) {
            if head_refusal(&e, &parts.method).expected() {
                // What well-behaved 2025 clients send: counted, not traced.
                seen.head = None;
            }
            return self.refuse_head(e, &parts.method);
        }
        let client = self.rates.client_address(peer, &parts.headers);
        if let Err(wait) = self.rates.check_client(client) {
            // A client over its rate, or a sidecar at its in-flight bound, gets no span: the
            // refusal costs as little as it can, and a flood never crowds the span queue.
            seen.head = None;
            self.metrics.limit(LimitKind::ClientRate);
            let retry_after = retry_after_secs(wait);
            return Error::new(
                ErrorKind::RateLimited { retry_after },
                "this client sent more requests than its rate limit allows",
            )
            .into_response(None);
        }
        let Some(_in_flight) = self.in_flight.try_enter() else {
            seen.head = None;
            self.metrics.limit(LimitKind::InFlight);
            return Error::new(
                ErrorKind::Overloaded { retry_after: 1 },
                "it is serving as many requests as it may at once",
            )
            .into_response(None);
        };
        let limits = &self.config.limits;
        let read = frontdoor::read_body(
            &parts,
            body,
            self.config.max_body_bytes,
            &self.budget,
            limits.body_timeout,
        )
        .await;
        let (bytes, _held) = match read {
            Ok(b) => b,
            Err(e) => return self.body_refused(e),
        };
        let address = Caller::of_address(client, peer);
        let principal = match self
            .authorize(&mut parts, &bytes, &address, &mut seen.asked)
            .await
        {
            Ok(principal) => principal,
            Err(refused) => return refused,
        };
        // Who the caller is, decided once: every table keyed by caller uses it.
        let caller = Caller::decide(
            principal.as_ref().map(|p| p.caller),
            &parts.headers,
            client,
            peer,
        );
        let request = match frontdoor::admit(&parts, &bytes) {
            Ok(Some(r)) => r,
            Ok(None) => {
                self.table
                    .tell(&Client::new(&parts.headers, caller), &bytes)
                    .await;
                return body::answer(StatusCode::ACCEPTED, None, body::empty());
            }
            Err((e, id)) => {
                tracing::debug!(error = %e, "refused at the front door");
                return e.into_response(id);
            }
        };
        self.note(seen, &request);
        // The span starts once the message is read (its context may be in `_meta`), before
        // the scopes are checked, so a 403 is a span of the request too.
        if let Some(otel) = &self.otel {
            self.start_span(otel, seen, &request, peer);
        }
        let request = match self.scoped(request, principal, seen) {
            Ok(r) => r,
            Err(refused) => return *refused,
        };
        self.answer(&request, caller, abandoned, seen).await
    }

    /// An admitted request's answer from the method table; the sidecar's own error answer
    /// carries the request's id.
    async fn answer(
        &self,
        request: &frontdoor::Request<'_>,
        caller: Caller,
        abandoned: Abandoned,
        seen: &mut Seen,
    ) -> Response<Body> {
        let caller = Client::new(&request.parts.headers, caller);
        // The request's work (the calls to Epode it makes) runs with its span as the context.
        let answered = otel::within(
            seen.span.as_ref(),
            self.table.dispatch(
                request,
                caller,
                abandoned,
                seen.note.as_ref(),
                seen.span.as_ref(),
            ),
        )
        .await;
        answered.unwrap_or_else(|e| {
            seen.failure = Some(Failure::Code(e.code()));
            let side = e.side().as_str();
            match e.level() {
                Level::Debug => tracing::debug!(error = %e, side, "request refused"),
                Level::Warn => {
                    tracing::warn!(error = %e, side, retryable = e.retryable(), "request failed")
                }
            }
            e.into_response(Some(request.id))
        })
    }
}

/// A request's server span, ended when its answer's body is over (a stream's end, or its
/// client gone), with what the answer showed and what the binding did.
struct SpanEnd {
    span: Option<ServerSpan>,
    status: u16,
    failure: Option<Failure>,
    abandoned: Abandoned,
    note: Option<Arc<Note>>,
}

impl Drop for SpanEnd {
    fn drop(&mut self) {
        if let Some(span) = self.span.take() {
            let noted = self.note.as_ref().map(|n| n.noted()).unwrap_or_default();
            let failure = self.failure.or_else(|| self.abandoned.failure());
            span.end(self.status, failure, &noted);
        }
    }
}

/// Why the front door refused a head (see [`frontdoor::check_head`]).
fn head_refusal(e: &Error, method: &http::Method) -> HeadRefusal {
    match e.kind() {
        ErrorKind::BadHost => HeadRefusal::Host,
        ErrorKind::BadOrigin => HeadRefusal::Origin,
        ErrorKind::MethodNotAllowed if method == http::Method::GET => HeadRefusal::GetStream,
        ErrorKind::MethodNotAllowed if method == http::Method::DELETE => HeadRefusal::SessionDelete,
        ErrorKind::MethodNotAllowed => HeadRefusal::Method,
        // The last of the head checks, and the only other refusal it makes.
        _ => HeadRefusal::ContentType,
    }
}

/// A streamed tool call's event, published when its stream is over: only then are its result,
/// and what the binding notes of it, known. Dropping is the one moment that sees both a stream
/// that ended and one whose client left before its end.
struct Shown {
    observer: Arc<dyn Observer>,
    note: Arc<Note>,
    seen: Option<Seen>,
    status: StatusCode,
    elapsed: std::time::Duration,
}

impl Shown {
    fn publish(&mut self) {
        let Some(seen) = self.seen.take() else {
            return;
        };
        self.observer.request(McpServed {
            started: self.note.started(),
            noted: self.note.noted(),
            method: seen.method,
            tool: seen.tool,
            era: seen.era,
            status: self.status.as_u16(),
            duration: self.elapsed,
            trace_id: seen.trace_id,
        });
    }
}

impl Drop for Shown {
    fn drop(&mut self) {
        self.publish();
    }
}

/// Shows a request to the observer: now, or, for a tool call answered as a stream (its
/// result, and what the binding notes of it, come at its end), once the stream is over.
fn show_call(
    observer: Arc<dyn Observer>,
    note: Arc<Note>,
    seen: Seen,
    status: StatusCode,
    elapsed: std::time::Duration,
    resp: Response<Body>,
) -> Response<Body> {
    let streamed =
        seen.method == Method::ToolsCall.label() && body::is_event_stream(resp.headers());
    let mut shown = Shown {
        observer,
        note,
        seen: Some(seen),
        status,
        elapsed,
    };
    if !streamed {
        shown.publish();
        return resp;
    }
    body::hold_until_end(resp, shown)
}
