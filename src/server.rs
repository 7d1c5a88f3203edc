//! The listener: accepts connections (HTTP/1.1 and h2c), serves each with the sidecar, and on
//! shutdown stops accepting and lets in-flight requests finish within the grace period.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use crate::proxy::Sidecar;

/// Binds the configured address. Separate from `serve` so a caller can learn the bound port.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves until `shutdown` resolves, then drains in-flight connections for at most the grace.
/// Returns whether everything finished within the grace.
pub async fn serve(
    listener: TcpListener,
    sidecar: Arc<Sidecar>,
    shutdown: impl Future<Output = ()>,
) -> bool {
    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    let grace = sidecar.config.shutdown_grace;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors and the like: pause instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
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
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    tracing::info!(grace = ?grace, "shutting down: no new connections; waiting for in-flight requests");
    tokio::select! {
        () = graceful.shutdown() => {
            tracing::info!("all connections closed");
            true
        }
        () = tokio::time::sleep(grace) => {
            tracing::warn!("shutdown grace elapsed with requests still in flight; closing them");
            false
        }
    }
}
