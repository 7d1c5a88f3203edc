//! The listeners and workers, and the routes. One worker thread per core, each with its own
//! single-threaded event loop, its own `SO_REUSEPORT` listener on the shared address and its
//! own request path ([`Dispatcher::for_worker`]: its own upstream connection pool), so a
//! request is served start to finish on one thread with no cross-thread wake-ups. Every
//! connection is bounded (`conn`): the connection cap, the head and idle deadlines, the header
//! size and count; TLS (HTTP/1.1 and HTTP/2 by ALPN) when configured. Routes: the MCP path,
//! `/healthz` and `/health`, `/readyz`, and `/metrics` (on the admin listener when there is
//! one). On shutdown every worker stops accepting and lets its in-flight requests finish; the
//! caller cuts what outlives the grace period.

mod conn;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use self::conn::{Connections, Deadlines, Watched};
use crate::body::{self, Body};
use crate::dispatch::Dispatcher;
use crate::log_summary::LogSummary;
use crate::mcp::rewrite::Abandoned;
use crate::metrics;

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

/// What every worker shares besides its request path.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) connections: Arc<Connections>,
    pub(crate) tls: Option<TlsAcceptor>,
    /// Repeated accept failures (out of descriptors) are logged as summaries.
    pub(crate) accept_errors: Arc<LogSummary>,
}

impl Shared {
    pub(crate) fn new(
        dispatcher: &Dispatcher,
        max_connections: usize,
        tls: Option<TlsAcceptor>,
    ) -> Self {
        Shared {
            connections: Connections::new(max_connections, dispatcher.metrics_handle()),
            tls,
            accept_errors: Arc::new(LogSummary::new(
                "accepting connections failed",
                Duration::from_secs(10),
            )),
        }
    }
}

/// Runs the workers until `shutdown` turns true, then drains them. Returns whether every
/// worker finished (within the grace period, or after the caller cut what was left).
pub(crate) async fn serve(
    listeners: Listeners,
    dispatcher: &Dispatcher,
    shared: Shared,
    shutdown: watch::Receiver<bool>,
) -> bool {
    let mut handles = Vec::new();
    for (index, listener) in listeners.listeners.into_iter().enumerate() {
        let dispatcher = dispatcher.for_worker();
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
                runtime.block_on(worker(listener, Arc::new(dispatcher), shared, shutdown))
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

/// The HTTP/1 and HTTP/2 server settings every connection gets.
fn http_builder(dispatcher: &Dispatcher) -> auto::Builder<TokioExecutor> {
    let limits = &dispatcher.config().limits;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        // hyper answers a head larger than its read buffer, or with more fields, with 431.
        .max_buf_size(limits.max_header_bytes.max(8192))
        .max_headers(limits.max_headers);
    builder
        .http2()
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX));
    builder
}

async fn worker(
    listener: std::net::TcpListener,
    dispatcher: Arc<Dispatcher>,
    shared: Shared,
    mut shutdown: watch::Receiver<bool>,
) -> bool {
    let listener = match listener
        .set_nonblocking(true)
        .and_then(|()| TcpListener::from_std(listener))
    {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "cannot register the listener");
            return false;
        }
    };
    let builder = Arc::new(http_builder(&dispatcher));
    let graceful = GracefulShutdown::new();
    let _pacer = tokio::spawn(timer_pacer());
    let limits = &dispatcher.config().limits;
    let deadlines = Deadlines {
        head: limits.header_timeout,
        idle: limits.idle_timeout,
    };
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors and the like: pause instead of spinning.
                        shared.accept_errors.add(accept_error_kind(&e), 1);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Some(slot) = shared.connections.admit() else {
                    // Past the cap: closed at once (a reset), costing nothing more.
                    // A zero linger resets the connection at close; it never blocks.
                    #[allow(deprecated)]
                    let _ = stream.set_linger(Some(Duration::ZERO));
                    drop(stream);
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let ctx = ConnCtx {
                    dispatcher: dispatcher.clone(),
                    builder: builder.clone(),
                    watcher: graceful.watcher(),
                    deadlines,
                    peer,
                };
                let tls = shared.tls.clone();
                tokio::spawn(async move {
                    match tls {
                        None => serve_io(stream, slot, ctx).await,
                        Some(acceptor) => {
                            let head = ctx.deadlines.head;
                            if let Some(tls) = tls_handshake(&acceptor, stream, head).await {
                                serve_io(tls, slot, ctx).await;
                            }
                        }
                    }
                });
            }
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    break;
                }
            }
        }
    }
    drop(listener);
    let grace = dispatcher.config().shutdown_grace;
    tokio::select! {
        () = graceful.shutdown() => true,
        // The caller cuts what is left after the grace period; the flush window lets those
        // answers reach their clients.
        () = tokio::time::sleep(grace + CUT_FLUSH) => {
            tracing::warn!("connections still open after the grace period and the cut; closing them");
            false
        }
    }
}

fn accept_error_kind(e: &std::io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(24 | 23) => "out_of_file_descriptors",
        _ => "other",
    }
}

/// The TLS handshake, within the head deadline.
async fn tls_handshake(
    acceptor: &TlsAcceptor,
    stream: TcpStream,
    within: Duration,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    match tokio::time::timeout(within, acceptor.accept(stream)).await {
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

/// What serving one connection needs.
struct ConnCtx {
    dispatcher: Arc<Dispatcher>,
    builder: Arc<auto::Builder<TokioExecutor>>,
    watcher: hyper_util::server::graceful::Watcher,
    deadlines: Deadlines,
    peer: SocketAddr,
}

/// Serves one connection (plain, or after its TLS handshake) to its end.
async fn serve_io<IO>(io: IO, slot: conn::Slot, ctx: ConnCtx)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let watched = Watched::new(io, ctx.deadlines, slot, ctx.dispatcher.metrics_handle());
    let state = watched.state();
    let dispatcher = ctx.dispatcher.clone();
    let peer = ctx.peer;
    let service = service_fn(move |req| {
        let dispatcher = dispatcher.clone();
        let guard = state.request_started();
        async move {
            let resp = route(&dispatcher, req, peer).await;
            Ok::<_, std::convert::Infallible>(resp.map(|b| conn::track(b, guard)))
        }
    });
    let conn = ctx
        .builder
        .serve_connection_with_upgrades(TokioIo::new(watched), service)
        .into_owned();
    if let Err(e) = ctx.watcher.watch(conn).await {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

/// Routes one request on the MCP listener: the MCP path, health, readiness, metrics (unless
/// the admin listener serves them), or 404.
async fn route(
    dispatcher: &Dispatcher,
    req: Request<Incoming>,
    peer: SocketAddr,
) -> Response<Body> {
    if req.uri().path() == dispatcher.config().path {
        let abandoned = Abandoned::default();
        return OnAbandon::new(dispatcher.mcp(req, peer, abandoned.clone()), abandoned).await;
    }
    if let Some(bus) = dispatcher.console() {
        if req.uri().path().starts_with("/_dev") {
            let (parts, _) = req.into_parts();
            if let Err(e) = crate::frontdoor::check_host_and_origin(dispatcher.config(), &parts) {
                return e.into_response(None);
            }
            if let Some(resp) = crate::trial::console::route(bus, &parts.method, parts.uri.path()) {
                return resp;
            }
            return operations(dispatcher, &Request::from_parts(parts, ()), false).await;
        }
    }
    let metrics_here = dispatcher.config().admin_listen.is_none();
    operations(dispatcher, &req, metrics_here).await
}

/// `/healthz` (and `/health`), `/readyz`, and `/metrics` when `metrics` is set; else 404.
pub(crate) async fn operations<B>(
    dispatcher: &Dispatcher,
    req: &Request<B>,
    metrics: bool,
) -> Response<Body> {
    match (req.method(), req.uri().path()) {
        (&Method::GET | &Method::HEAD, "/healthz" | "/health") => {
            body::json(StatusCode::OK, r#"{"status":"ok"}"#)
        }
        (&Method::GET | &Method::HEAD, "/readyz") => match dispatcher.ready().await {
            Ok(()) => body::json(StatusCode::OK, r#"{"status":"ready"}"#),
            Err(not) => body::json(
                StatusCode::SERVICE_UNAVAILABLE,
                serde_json::json!({"status": "not ready", "reason": not.reason}).to_string(),
            ),
        },
        (&Method::GET, "/metrics") if metrics => {
            let mut resp = Response::new(body::full(dispatcher.render_metrics()));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(metrics::CONTENT_TYPE),
            );
            resp
        }
        _ => body::json(
            StatusCode::NOT_FOUND,
            r#"{"error":"not found: MCP clients post to the configured path"}"#,
        ),
    }
}

/// The admin listener: `/metrics`, `/healthz`, `/readyz`, plain HTTP/1.1, on the caller's
/// event loop, until `shutdown`.
pub(crate) async fn admin(
    listener: std::net::TcpListener,
    dispatcher: Arc<Dispatcher>,
    mut shutdown: watch::Receiver<bool>,
) {
    let listener = match listener
        .set_nonblocking(true)
        .and_then(|()| TcpListener::from_std(listener))
    {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "cannot register the admin listener");
            return;
        }
    };
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let dispatcher = dispatcher.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let dispatcher = dispatcher.clone();
                        async move {
                            Ok::<_, std::convert::Infallible>(
                                operations(&dispatcher, &req, true).await,
                            )
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    return;
                }
            }
        }
    }
}

/// A request's future that marks the request abandoned when it is dropped before it
/// completes (the client went away): its plan then reports nothing. The mark is set before
/// the inner future, and the plan in it, is dropped.
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
