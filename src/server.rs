//! The listeners and workers, and the routes. One worker thread per core, each with its own
//! single-threaded event loop, its own `SO_REUSEPORT` listener on the shared address and its
//! own request path ([`Dispatcher::for_worker`]: its own upstream connection pool), so a
//! request is served start to finish on one thread with no cross-thread wake-ups. Routes: the
//! MCP path, `/healthz` and `/health`, `/readyz`, `/metrics`. On shutdown every worker stops
//! accepting and lets its in-flight requests finish within the grace period.

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
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;

use crate::body::{self, Body};
use crate::dispatch::Dispatcher;
use crate::mcp::rewrite::Abandoned;
use crate::metrics;

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

/// Runs the workers until `shutdown` turns true, then drains them. Returns whether every
/// worker finished within the grace period.
pub(crate) async fn serve(
    listeners: Listeners,
    dispatcher: &Dispatcher,
    shutdown: watch::Receiver<bool>,
) -> bool {
    let mut handles = Vec::new();
    for (index, listener) in listeners.listeners.into_iter().enumerate() {
        let dispatcher = dispatcher.for_worker();
        let shutdown = shutdown.clone();
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
                runtime.block_on(worker(listener, Arc::new(dispatcher), shutdown))
            });
        match handle {
            Ok(h) => handles.push(h),
            Err(e) => tracing::error!(error = %e, "cannot start a worker thread"),
        }
    }
    tokio::task::spawn_blocking(move || {
        // Join every worker (no short-circuit), then report whether all drained in time.
        let drained: Vec<bool> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or(false))
            .collect();
        drained.into_iter().all(|ok| ok)
    })
    .await
    .unwrap_or(false)
}

async fn worker(
    listener: std::net::TcpListener,
    dispatcher: Arc<Dispatcher>,
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
    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    let grace = dispatcher.config().shutdown_grace;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors and the like: pause instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let dispatcher = dispatcher.clone();
                let service = service_fn(move |req| {
                    let dispatcher = dispatcher.clone();
                    async move { Ok::<_, std::convert::Infallible>(route(&dispatcher, req).await) }
                });
                let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
                let conn = graceful.watch(conn.into_owned());
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
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
    tokio::select! {
        () = graceful.shutdown() => true,
        () = tokio::time::sleep(grace) => {
            tracing::warn!("shutdown grace elapsed with requests still in flight; closing them");
            false
        }
    }
}

/// Routes one request: the MCP path, health, readiness, metrics, or 404.
async fn route(dispatcher: &Dispatcher, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path();
    if path == dispatcher.config().path {
        let abandoned = Abandoned::default();
        return OnAbandon::new(dispatcher.mcp(req, abandoned.clone()), abandoned).await;
    }
    match (req.method(), path) {
        (&Method::GET | &Method::HEAD, "/healthz" | "/health") => {
            body::json(StatusCode::OK, r#"{"status":"ok"}"#)
        }
        (&Method::GET | &Method::HEAD, "/readyz") => {
            if dispatcher.ready().await {
                body::json(StatusCode::OK, r#"{"status":"ready"}"#)
            } else {
                body::json(
                    StatusCode::SERVICE_UNAVAILABLE,
                    r#"{"status":"not ready","reason":"the upstream MCP server has not answered"}"#,
                )
            }
        }
        (&Method::GET, "/metrics") => {
            let mut resp = Response::new(body::full(metrics::render(
                dispatcher.binding().telemetry().map(|t| &**t),
            )));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            resp
        }
        _ => body::json(
            StatusCode::NOT_FOUND,
            r#"{"error":"not found: MCP clients post to the configured path"}"#,
        ),
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
