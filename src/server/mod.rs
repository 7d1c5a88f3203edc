//! The listeners and workers, and the routes. One worker thread per core, each with its own
//! single-threaded event loop, its own `SO_REUSEPORT` listener on the shared address and its
//! own request path ([`Dispatcher::for_worker`]: its own view of the upstream, with its own
//! connection pool, which the worker's `/readyz` reads too), so a
//! request is served start to finish on one thread with no cross-thread wake-ups. A single
//! worker (the default for a stdio upstream) runs on the main thread's loop, where a stdio
//! child's pipe is read and written and telemetry runs. Every
//! listener (the MCP port, the admin port, the `--dev` Epode's) runs the same way
//! (`crate::listener`: its share of the connection cap, the head, idle and write deadlines,
//! the header size and count); TLS (HTTP/1.1 and HTTP/2 by ALPN) on the MCP port when
//! configured. Routes: the MCP path, what is [`Mounted`] beside it (the local trial's console),
//! `/healthz` and `/health`, `/readyz`, and `/metrics` (on the admin listener when there is
//! one). `/readyz` on the MCP port says why the upstream is not ready without where; the
//! admin listener's says where too. With the HTTP surface on, those four move under its operations prefix on this port
//! (the admin listener keeps them bare) and every other path goes to the surface
//! (`crate::surface`), so the app's own `/health` reaches the app. The route is chosen once,
//! on the request path's canonical form (`target`), after the refusals every route shares
//! (CONNECT; a `Host` that is not one well-formed authority). On shutdown every worker stops
//! accepting and lets its in-flight requests finish; the caller cuts what outlives the grace
//! period.

mod target;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use crate::auth::{Authorizer, FacadeRoute};
use crate::body::{self, Body};
use crate::budget::MemoryBudget;
use crate::config::Config;
use crate::dispatch::Dispatcher;
use crate::error::{Error, ErrorKind};
use crate::gate::Gate;
use crate::limits::RateLimits;
use crate::listener::{self, Admitted, Bounds, Role, Shares};
use crate::mcp::end::Abandoned;
use crate::metrics::{self, Metrics};
use crate::surface::{HttpSurfaceRoute, IDENTITY_HEADER};
use crate::upstream::{NotReady, Upstream};

use self::target::{Owner, Refusal, Routing};

/// How long responses cut at shutdown have to reach their clients before workers give up.
pub(crate) const CUT_FLUSH: Duration = Duration::from_secs(2);

/// Binds `addr` with `SO_REUSEPORT`, so every worker can bind the same address.
fn reuseport_listener(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.set_nodelay(true)?;
    socket.bind(addr)?;
    let listener = socket.listen(1024)?;
    listener.into_std()
}

/// The bound listeners, one per worker. The first is bound to the configured address (port 0
/// picks one); the others to the address it got.
pub(crate) struct Listeners {
    pub(crate) local_addr: SocketAddr,
    listeners: Vec<std::net::TcpListener>,
}

/// Binds the listeners. Must run inside a runtime (the sockets are registered later, by each
/// worker's own runtime).
pub(crate) fn bind(addr: SocketAddr, workers: usize) -> std::io::Result<Listeners> {
    let first = reuseport_listener(addr)?;
    let local_addr = first.local_addr()?;
    let mut listeners = vec![first];
    for _ in 1..workers.max(1) {
        listeners.push(reuseport_listener(local_addr)?);
    }
    Ok(Listeners {
        local_addr,
        listeners,
    })
}

/// Routes another part of the sidecar serves on the MCP listener (the local trial's console,
/// under `/_dev`), behind the same Host and Origin checks as the MCP path. The server owns
/// this seam, so it routes to what it does not know.
pub(crate) trait Mounted: Send + Sync {
    /// Where its paths start: a whole segment, matched on the canonical path (`target`); a
    /// request there is checked, then offered to [`Mounted::route`].
    fn prefix(&self) -> &str;
    /// The answer to a request under [`Mounted::prefix`], given the prefix and the canonical
    /// rest of its path (`/_dev/events` for `/_DEV//events/`); `None` falls through to the
    /// operations' routes.
    fn route(&self, method: &Method, path: &str) -> Option<Response<Body>>;
}

/// What every worker shares besides its request path: the configuration, the bounds of each
/// listener (their shares of the one connection cap), the MCP port's TLS, and the routes
/// mounted beside it.
#[derive(Clone)]
pub(crate) struct Serving {
    config: Arc<Config>,
    pub(crate) mcp: Bounds,
    admin: Option<Bounds>,
    dev_epode: Option<Bounds>,
    pub(crate) tls: Option<TlsAcceptor>,
    mounted: Option<Arc<dyn Mounted>>,
    /// The HTTP surface, when on.
    surface: Option<Arc<HttpSurfaceRoute>>,
    /// The authorization front door, when on: its Protected Resource Metadata is served on
    /// every route's port, before the HTTP surface.
    auth: Option<Arc<Authorizer>>,
}

impl Serving {
    /// `max_connections`: the one cap, shared between the listeners the configuration has;
    /// `budget`: the one memory budget (the MCP listener's connections count what they hold
    /// in it); `mounted`: routes served beside the MCP path (the local trial's console).
    pub(crate) fn new(
        config: Arc<Config>,
        metrics: &Arc<Metrics>,
        budget: Arc<MemoryBudget>,
        max_connections: usize,
        tls: Option<TlsAcceptor>,
        mounted: Option<Arc<dyn Mounted>>,
    ) -> Self {
        let shares = Shares::of(
            max_connections,
            config.admin_listen.is_some(),
            config.dev.is_some(),
        );
        tracing::info!(
            mcp = shares.mcp,
            admin = shares.admin,
            dev_epode = shares.dev_epode,
            "connection cap shares"
        );
        let bounds =
            |role, cap, budget| Bounds::new(role, cap, &config.limits, metrics.clone(), budget);
        Serving {
            mcp: bounds(Role::Mcp, shares.mcp, Some(budget)),
            admin: (shares.admin > 0).then(|| bounds(Role::Admin, shares.admin, None)),
            dev_epode: (shares.dev_epode > 0)
                .then(|| bounds(Role::DevEpode, shares.dev_epode, None)),
            config,
            tls,
            mounted,
            surface: None,
            auth: None,
        }
    }

    /// The authorization front door, whose metadata the MCP port serves.
    pub(crate) fn with_auth(mut self, auth: Option<Arc<Authorizer>>) -> Self {
        self.auth = auth;
        self
    }

    /// Every path that is neither the MCP path nor mounted nor the operations' goes to
    /// `surface` (the HTTP surface, when on).
    pub(crate) fn with_surface(mut self, surface: Option<Arc<HttpSurfaceRoute>>) -> Self {
        self.surface = surface;
        self
    }

    /// The admin listener's bounds (when there is one).
    pub(crate) fn admin(&self) -> Option<Bounds> {
        self.admin.clone()
    }

    /// The `--dev` Epode listener's bounds (when there is one).
    pub(crate) fn dev_epode(&self) -> Option<Bounds> {
        self.dev_epode.clone()
    }
}

/// Who reaches a listener's operations' routes, which decides what `/readyz` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Audience {
    /// The admin listener: why not ready, and where (the upstream's address, redacted).
    Operator,
    /// The MCP port: why not ready, never where (the upstream's address is no client's).
    Clients,
}

/// What the operations' routes read: the upstream's readiness (`/readyz`), and the metrics
/// with the gauges of what is held now (`/metrics`).
#[derive(Clone)]
pub(crate) struct Operations {
    /// The admin listener's view of the upstream, or a worker's own.
    upstream: Arc<Upstream>,
    audience: Audience,
    metrics: Arc<Metrics>,
    /// The MCP requests being served, the bytes buffered, the clients tracked for their rate:
    /// read for their gauges when the metrics are rendered.
    in_flight: Gate,
    budget: Arc<MemoryBudget>,
    rates: Arc<RateLimits>,
    /// The authorization front door, when on: not ready while the issuer cannot be read.
    auth: Option<Arc<Authorizer>>,
}

impl Operations {
    pub(crate) fn new(
        upstream: Arc<Upstream>,
        metrics: Arc<Metrics>,
        in_flight: Gate,
        budget: Arc<MemoryBudget>,
        rates: Arc<RateLimits>,
        auth: Option<Arc<Authorizer>>,
    ) -> Self {
        Operations {
            upstream,
            audience: Audience::Operator,
            metrics,
            in_flight,
            budget,
            rates,
            auth,
        }
    }

    /// Whether the upstream answers and, with auth on, the issuer's metadata and keys were
    /// read (readiness); `Err` says why not.
    async fn ready(&self) -> Result<(), NotReady> {
        if let Some(why) = self.auth.as_ref().and_then(|a| a.not_ready()) {
            return Err(NotReady::passing(
                "the authorization server's metadata or keys cannot be read",
                why,
            ));
        }
        self.upstream.ready().await
    }

    /// `/metrics`, with the gauges read now: OpenMetrics (with exemplars) or the Prometheus
    /// text format, and its content type. OpenMetrics only for the operator: an exemplar
    /// names one request's trace, which no other client may see on the MCP port.
    fn render_metrics(&self, openmetrics: bool) -> (String, &'static str) {
        self.gauges().read();
        if openmetrics && self.audience == Audience::Operator {
            (
                self.metrics.render_openmetrics(),
                metrics::OPENMETRICS_CONTENT_TYPE,
            )
        } else {
            (self.metrics.render(), metrics::CONTENT_TYPE)
        }
    }

    /// What reads the sampled gauges (for the OTLP export too).
    pub(crate) fn gauges(&self) -> GaugeReader {
        GaugeReader {
            metrics: self.metrics.clone(),
            in_flight: self.in_flight.clone(),
            budget: self.budget.clone(),
            rates: self.rates.clone(),
        }
    }
}

/// The gauges that are read when shown, not kept up to date (requests in flight, bytes
/// buffered, clients tracked for their rate): read before `/metrics` renders and before each
/// OTLP metrics export.
pub(crate) struct GaugeReader {
    metrics: Arc<Metrics>,
    in_flight: Gate,
    budget: Arc<MemoryBudget>,
    rates: Arc<RateLimits>,
}

impl GaugeReader {
    pub(crate) fn read(&self) {
        self.metrics.in_flight.set(self.in_flight.held() as i64);
        self.metrics.buffered_bytes.set(self.budget.used() as i64);
        self.metrics
            .rate_limit_clients
            .set(self.rates.tracked_clients() as i64);
    }
}

/// One worker's routes: the MCP path (its own request path), what is mounted beside it, and
/// the operations' routes, all through the worker's own view of the upstream.
struct Routes {
    config: Arc<Config>,
    /// The sidecar's own routes, as canonical keys: what `route` decides on.
    routing: Arc<Routing>,
    mcp: Dispatcher,
    mounted: Option<Arc<dyn Mounted>>,
    operations: Operations,
    surface: Option<Arc<HttpSurfaceRoute>>,
    auth: Option<Arc<Authorizer>>,
}

/// Completes when `shutdown` turns true (or its sender is gone).
async fn stopped(mut shutdown: watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// Runs the workers until `shutdown` turns true, then drains them. Returns whether every
/// worker finished (within the grace period, or after the caller cut what was left).
/// Each worker's request path is `dispatcher`'s, and its operations' routes are
/// `operations`', both through the worker's own view of the upstream.
pub(crate) async fn serve(
    listeners: Listeners,
    dispatcher: &Dispatcher,
    operations: &Operations,
    shared: Serving,
    shutdown: watch::Receiver<bool>,
) -> bool {
    let operations_prefix = shared
        .surface
        .as_ref()
        .and(shared.config.http.as_ref())
        .map(|http| http.operations_prefix.as_str());
    let routing = Arc::new(Routing::new(
        &shared.config.path,
        shared.mounted.as_deref().map(|m| m.prefix()),
        operations_prefix,
    ));
    let routes = |upstream: Arc<Upstream>| Routes {
        config: shared.config.clone(),
        routing: routing.clone(),
        mcp: dispatcher.for_worker(upstream.clone()),
        mounted: shared.mounted.clone(),
        surface: shared.surface.clone(),
        auth: shared.auth.clone(),
        operations: Operations {
            upstream,
            audience: Audience::Clients,
            ..operations.clone()
        },
    };
    let mut listeners = listeners.listeners;
    if listeners.len() == 1 {
        // One worker: it runs on this thread's loop, where the upstream's own tasks run (a
        // stdio child's pipe, telemetry): a call then never wakes another thread.
        let listener = listeners.remove(0);
        let routes = Arc::new(routes(Arc::new(operations.upstream.for_worker())));
        return worker(listener, routes, shared.clone(), shutdown).await;
    }
    let mut handles = Vec::new();
    for (index, listener) in listeners.into_iter().enumerate() {
        let routes = routes(Arc::new(operations.upstream.for_worker()));
        let shutdown = shutdown.clone();
        let shared = shared.clone();
        let handle = std::thread::Builder::new()
            .name(format!("epode-worker-{index}"))
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot start a worker's event loop");
                        return false;
                    }
                };
                runtime.block_on(worker(listener, Arc::new(routes), shared, shutdown))
            });
        match handle {
            Ok(h) => handles.push(h),
            Err(e) => tracing::error!(error = %e, "cannot start a worker thread"),
        }
    }
    tokio::task::spawn_blocking(move || {
        // Join every worker (no short-circuit), then report whether all drained.
        let drained: Vec<bool> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or(false))
            .collect();
        drained.into_iter().all(|ok| ok)
    })
    .await
    .unwrap_or(false)
}

/// Keeps a timer due within a second on the worker's loop, always. Every request arms
/// deadlines tens of seconds away (the upstream's answer, the connection's idle time); when
/// one is due sooner than anything the timer wheel holds, tokio wakes its own loop through an
/// eventfd write so that it sleeps less: one system call and one extra event per request,
/// measured with `strace -c` under the benchmark. With this timer nearer than any of them,
/// they never are. It costs one wake-up a second.
async fn timer_pacer() {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
    }
}

/// A task stopped when this is dropped.
struct Aborted(tokio::task::JoinHandle<()>);

impl Drop for Aborted {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn worker(
    listener: std::net::TcpListener,
    routes: Arc<Routes>,
    shared: Serving,
    shutdown: watch::Receiver<bool>,
) -> bool {
    let listener = match listener::register(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "cannot register the listener");
            return false;
        }
    };
    // Stopped with the worker (whose loop may be the main thread's, which outlives it).
    let _pacer = Aborted(tokio::spawn(timer_pacer()));
    // Every connection holds a receiver: once they are all gone, the worker has drained.
    let (drain, draining) = watch::channel(false);
    let bounds = &shared.mcp;
    bounds
        .accept_until(&listener, stopped(shutdown), |stream, admitted| {
            tokio::spawn(serve_mcp(
                stream,
                admitted,
                routes.clone(),
                shared.clone(),
                draining.clone(),
            ));
        })
        .await;
    drop(listener);
    drop(draining);
    let _ = drain.send(true);
    let grace = routes.config.shutdown_grace;
    tokio::select! {
        () = drain.closed() => true,
        // The caller cuts what is left after the grace period; the flush window lets those
        // answers reach their clients.
        () = tokio::time::sleep(grace + CUT_FLUSH) => {
            tracing::warn!("connections still open after the grace period and the cut; closing them");
            false
        }
    }
}

/// Serves one connection of the MCP port (after its TLS handshake, when configured).
async fn serve_mcp(
    stream: TcpStream,
    admitted: Admitted,
    routes: Arc<Routes>,
    shared: Serving,
    drain: watch::Receiver<bool>,
) {
    let peer = admitted.peer;
    let handler = move |req| {
        let routes = routes.clone();
        async move { route(&routes, req, peer).await }
    };
    let bounds = &shared.mcp;
    match &shared.tls {
        None => bounds.serve(stream, admitted, handler, Some(drain)).await,
        Some(acceptor) => {
            let due = admitted.head_due(bounds);
            if let Some(tls) = tls_handshake(acceptor, stream, due).await {
                bounds.serve(tls, admitted, handler, Some(drain)).await;
            }
        }
    }
}

/// The TLS handshake, by the head deadline.
async fn tls_handshake(
    acceptor: &TlsAcceptor,
    stream: TcpStream,
    due: Instant,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    match tokio::time::timeout_at(due, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => Some(tls),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!("TLS handshake timed out");
            None
        }
    }
}

/// Routes one request on the MCP listener: the MCP path, the mounted routes, health,
/// readiness, metrics (unless the admin listener serves them), or 404; with the HTTP surface
/// on, the operations' routes under its prefix and everything else to the surface. Decided
/// once, for every route, on the request's canonical path (`target`), after the checks every
/// route shares: no CONNECT, one well-formed `Host`.
async fn route(routes: &Routes, req: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
    if let Some(resp) = shared_checks(&req) {
        return resp;
    }
    let routed = match routes.routing.route(req.uri().path()) {
        Ok(routed) => routed,
        Err(why) => return refused_target(req.uri().path(), why),
    };
    let metrics_here = routes.config.admin_listen.is_none();
    if let Some(auth) = &routes.auth {
        if let Some(resp) = auth.metadata_route(req.method(), routed.key(), &routes.config.path) {
            return resp;
        }
        if let Some(facade) = auth.facade_route(routed.key()) {
            return serve_facade(routes, auth, facade, req, peer).await;
        }
    }
    match routed.owner {
        Owner::Mcp => {
            let abandoned = Abandoned::default();
            let mut resp =
                OnAbandon::new(routes.mcp.mcp(req, peer, abandoned.clone()), abandoned).await;
            // The app's private identity header never reaches a client, on any path.
            resp.headers_mut().remove(IDENTITY_HEADER);
            resp
        }
        Owner::Mounted(_) => {
            let Some(mounted) = routes.mounted.as_deref() else {
                return operations(&routes.operations, req.method(), routed.key(), None).await;
            };
            let path = format!("{}{}", mounted.prefix(), routed.rest());
            let (parts, _) = req.into_parts();
            if let Err(e) = crate::frontdoor::check_host_and_origin(&routes.config, &parts) {
                return e.into_response(None);
            }
            if let Some(resp) = mounted.route(&parts.method, &path) {
                return resp;
            }
            operations(&routes.operations, &parts.method, &path, None).await
        }
        Owner::Operations(_) => {
            let metrics = metrics_here.then(|| req.headers());
            operations(&routes.operations, req.method(), routed.rest(), metrics).await
        }
        Owner::Other => match &routes.surface {
            Some(surface) => {
                let respelled = routed.respelled();
                surface
                    .serve(&routes.operations.upstream, req, peer, respelled)
                    .await
            }
            None => {
                if let Some(resp) = oauth_hint(routes.auth.as_deref(), routed.key()) {
                    return resp;
                }
                let metrics = metrics_here.then(|| req.headers());
                operations(&routes.operations, req.method(), routed.key(), metrics).await
            }
        },
    }
}

/// A request to the authorization facade (`auth_facade`): its metadata and the authorization
/// request's redirect at once; a token request let in by the front (its host, its client's
/// rate, its body) and passed to the issuer.
async fn serve_facade(
    routes: &Routes,
    auth: &Authorizer,
    route: FacadeRoute,
    req: Request<Incoming>,
    peer: SocketAddr,
) -> Response<Body> {
    if route != FacadeRoute::Token {
        return auth
            .facade_plain(route, req.method(), req.uri().query())
            .await;
    }
    if req.method() == Method::OPTIONS {
        return crate::auth::Facade::token_preflight();
    }
    if let Err(resp) = auth.facade_token_head(req.method(), req.headers()).await {
        return *resp;
    }
    let (parts, body) = req.into_parts();
    let front = routes.mcp.front();
    match front
        .admit_issuer_call(parts, body, peer, crate::auth::FACADE_MAX_FORM)
        .await
    {
        Ok((parts, caller, form)) => auth.facade_token(&parts.headers, &form, caller).await,
        Err(refused) => refused,
    }
}

/// The 404 for an OAuth endpoint a client looked for on the sidecar (`/register`,
/// `/authorize`, `/token`, the authorization server's metadata): what it is looking for and
/// where it is.
fn oauth_hint(auth: Option<&Authorizer>, path: &str) -> Option<Response<Body>> {
    let oauth = matches!(path, "/register" | "/authorize" | "/token")
        || [
            "/.well-known/oauth-authorization-server",
            "/.well-known/openid-configuration",
            crate::auth::METADATA_PATH,
        ]
        .iter()
        .any(|p| {
            path == *p
                || path
                    .strip_prefix(p)
                    .is_some_and(|rest| rest.starts_with('/'))
        });
    if !oauth {
        return None;
    }
    // The path is the client's: cut to the bound every echoed path has.
    let (shown, more) = shown_path(path);
    let path = format!("{shown}{more}");
    let path = path.as_str();
    let message = match auth {
        Some(auth) => auth.not_here(path),
        None => format!(
            "not found: epode-sidecar serves no {path}. Its authorization front door is off \
             (EPODE_SIDECAR_AUTH), so it publishes no authorization server; a client asked \
             for a token by the MCP server behind it needs that server's own protected \
             resource metadata (docs/authorization.md)"
        ),
    };
    Some(body::error(StatusCode::NOT_FOUND, &message))
}

/// What every route of the MCP port refuses before one is chosen: CONNECT (501: the sidecar
/// tunnels nothing, so nothing is sent on), and a request whose authority is not one
/// well-formed `Host` (400).
fn shared_checks<B>(req: &Request<B>) -> Option<Response<Body>> {
    if req.method() == Method::CONNECT {
        let message = "CONNECT is not served: epode-sidecar is no forward proxy or tunnel";
        let body = crate::error::error_body(None, crate::error::code::SERVER_ERROR, message, None);
        return Some(body::json(StatusCode::NOT_IMPLEMENTED, body));
    }
    crate::frontdoor::check_authority(req.headers(), req.uri(), req.version())
        .err()
        .map(|e| e.into_response(None))
}

/// Whether a scraper asks for OpenMetrics (Prometheus does when it keeps exemplars) and takes
/// it before the Prometheus text format, by the `Accept` header's order and quality.
fn wants_openmetrics(headers: &http::HeaderMap) -> bool {
    let mut best: Option<(f32, bool)> = None;
    for range in headers
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
    {
        let mut parts = range.split(';').map(str::trim);
        let kind = parts.next().unwrap_or_default().to_ascii_lowercase();
        let q = parts
            .find_map(|p| p.strip_prefix("q="))
            .and_then(|q| q.parse::<f32>().ok())
            .unwrap_or(1.0);
        let open = match kind.as_str() {
            "application/openmetrics-text" => true,
            "text/plain" | "*/*" => false,
            _ => continue,
        };
        if q > 0.0 && best.is_none_or(|(b, _)| q > b) {
            best = Some((q, open));
        }
    }
    best.is_some_and(|(_, open)| open)
}

/// The 400 for a path whose canonical form is refused, naming the path (shortened) and why.
fn refused_target(path: &str, why: Refusal) -> Response<Body> {
    let (shown, more) = shown_path(path);
    Error::new(
        ErrorKind::InvalidRequest,
        format!("the request path {shown}{more} {}", why.reason()),
    )
    .into_response(None)
}

/// A client's path as a message shows it: its first 200 bytes (at a character's boundary),
/// and `…` when there was more.
fn shown_path(path: &str) -> (&str, &'static str) {
    const SHOWN: usize = 200;
    let mut end = path.len().min(SHOWN);
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    (&path[..end], if end < path.len() { "…" } else { "" })
}

/// `/healthz` (and `/health`), `/readyz`, and `/metrics` when `metrics` (the request's
/// headers, for its `Accept`) is given here; else 404.
async fn operations(
    ops: &Operations,
    method: &Method,
    path: &str,
    metrics: Option<&http::HeaderMap>,
) -> Response<Body> {
    match (method, path) {
        (&Method::GET | &Method::HEAD, "/healthz" | "/health") => {
            body::json(StatusCode::OK, r#"{"status":"ok"}"#)
        }
        (&Method::GET | &Method::HEAD, "/readyz") => match ops.ready().await {
            Ok(()) => body::json(StatusCode::OK, r#"{"status":"ready"}"#),
            Err(not) => {
                let reason = match ops.audience {
                    Audience::Operator => not.reason,
                    Audience::Clients => not.summary.to_owned(),
                };
                body::json(
                    StatusCode::SERVICE_UNAVAILABLE,
                    serde_json::json!({"status": "not ready", "reason": reason}).to_string(),
                )
            }
        },
        (&Method::GET, "/metrics") if metrics.is_some() => {
            let openmetrics = metrics.is_some_and(wants_openmetrics);
            let (text, content_type) = ops.render_metrics(openmetrics);
            body::answer(StatusCode::OK, Some(content_type), body::full(text))
        }
        _ => body::error(
            StatusCode::NOT_FOUND,
            "not found: MCP clients post to the configured path",
        ),
    }
}

/// The admin listener: `/metrics`, `/healthz`, `/readyz`, on the caller's event loop, within
/// its own share of the connection cap, until `shutdown`.
pub(crate) async fn admin(
    listener: std::net::TcpListener,
    ops: Operations,
    bounds: Bounds,
    shutdown: watch::Receiver<bool>,
) {
    let listener = match listener::register(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "cannot register the admin listener");
            return;
        }
    };
    let ops = Arc::new(ops);
    bounds
        .accept_until(&listener, stopped(shutdown), |stream, admitted| {
            let ops = ops.clone();
            let bounds = bounds.clone();
            tokio::spawn(async move {
                let handler = move |req: Request<Incoming>| {
                    let ops = ops.clone();
                    async move {
                        if let Some(resp) = shared_checks(&req) {
                            return resp;
                        }
                        operations(&ops, req.method(), req.uri().path(), Some(req.headers())).await
                    }
                };
                bounds.serve(stream, admitted, handler, None).await;
            });
        })
        .await;
}

/// A request's future that marks the request abandoned when it is dropped before it
/// completes (the client went away): its plan then reports nothing. The mark is set before
/// the inner future, and the plan in it, is dropped.
///
/// The future is boxed, one allocation per request (about 21 KB): held in place instead, it
/// would make hyper's per-connection slot for a request's future that large for every
/// connection, idle or not (300 idle keep-alive connections took 66 MB rather than under 64;
/// `limits::slowloris_and_idle_keep_alive_are_closed`).
struct OnAbandon<F> {
    inner: Pin<Box<F>>,
    abandoned: Abandoned,
    done: bool,
}

impl<F> OnAbandon<F> {
    fn new(inner: F, abandoned: Abandoned) -> Self {
        OnAbandon {
            inner: Box::pin(inner),
            abandoned,
            done: false,
        }
    }
}

impl<F: Future> Future for OnAbandon<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let out = self.inner.as_mut().poll(cx);
        if out.is_ready() {
            self.done = true;
        }
        out
    }
}

impl<F> Drop for OnAbandon<F> {
    fn drop(&mut self) {
        if !self.done {
            self.abandoned.set();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::wants_openmetrics;

    fn accept(values: &[&str]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for v in values {
            h.append(http::header::ACCEPT, v.parse().unwrap());
        }
        h
    }

    /// OpenMetrics when the scraper prefers it (Prometheus 2 and 3 as they send it, protobuf
    /// first or not); the Prometheus text format otherwise.
    #[test]
    fn openmetrics_is_served_when_the_scraper_prefers_it() {
        for (values, open) in [
            (&[][..], false),
            (&["text/plain"][..], false),
            (&["*/*"][..], false),
            (
                &["application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"][..],
                true,
            ),
            (
                &["application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.6,application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"][..],
                true,
            ),
            (&["text/plain;q=0.9", "application/openmetrics-text;q=0.5"][..], false),
            (&["application/openmetrics-text;q=0"][..], false),
            (&["Application/OpenMetrics-Text"][..], true),
        ] {
            assert_eq!(wants_openmetrics(&accept(values)), open, "{values:?}");
        }
    }
}
