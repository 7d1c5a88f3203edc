//! The listeners: one worker thread per core, each with its own single-threaded event loop,
//! its own `SO_REUSEPORT` listener on the shared address and its own upstream connection pool,
//! so a request is served start to finish on one thread with no cross-thread wake-ups. On
//! shutdown every worker stops accepting and lets its in-flight requests finish within the
//! grace period.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;

use crate::proxy::Sidecar;
use crate::upstream::http::set_worker_index;

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
pub struct Listeners {
    pub local_addr: SocketAddr,
    listeners: Vec<std::net::TcpListener>,
}

/// Binds the listeners. Must run inside a runtime (the sockets are registered later, by each
/// worker's own runtime).
pub fn bind(addr: SocketAddr, workers: usize) -> std::io::Result<Listeners> {
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
pub async fn serve(
    listeners: Listeners,
    sidecar: Arc<Sidecar>,
    shutdown: watch::Receiver<bool>,
) -> bool {
    let mut handles = Vec::new();
    for (index, listener) in listeners.listeners.into_iter().enumerate() {
        let sidecar = sidecar.clone();
        let shutdown = shutdown.clone();
        let handle = std::thread::Builder::new()
            .name(format!("epode-worker-{index}"))
            .spawn(move || {
                set_worker_index(index);
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("worker runtime");
                runtime.block_on(worker(listener, sidecar, shutdown))
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
    sidecar: Arc<Sidecar>,
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
    let grace = sidecar.config.shutdown_grace;
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
                let sidecar = sidecar.clone();
                let service = service_fn(move |req| {
                    let sidecar = sidecar.clone();
                    async move { Ok::<_, std::convert::Infallible>(sidecar.handle(req).await) }
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
