//! One way to run a listener, used by all three: the MCP port (a listener per worker), the
//! admin port and the `--dev` embedded Epode's port. Each has its share of the one connection
//! cap ([`Shares`]); past it a new connection is reset at once, so a flood on one listener
//! cannot lock out the others. Every connection gets the same bounds (`conn`: the head
//! deadline counted from accept, the idle deadline, a write that makes no progress cut at the
//! idle deadline), the same HTTP settings ([`http_builder`]) and the same back-off when
//! accepting fails (out of descriptors, say). It sits below everything that serves HTTP (the
//! `server`'s listeners, the local trial's Epode), so none of them imports another to listen.

mod conn;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{header, Request, Response, Version};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

use self::conn::{ClientStream, Deadlines, Watched, CHUNK};
use crate::body::Body;
use crate::budget::MemoryBudget;
use crate::config::Limits;
use crate::gate::{Gate, Permit};
use crate::log_summary::LogSummary;
use crate::metrics::{LimitKind, Metrics};

/// Which listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    Mcp,
    Admin,
    DevEpode,
}

impl Role {
    /// The limit kind counted when the listener refuses a connection past its share.
    fn refused(self) -> LimitKind {
        match self {
            Role::Mcp => LimitKind::Connections,
            Role::Admin => LimitKind::AdminConnections,
            Role::DevEpode => LimitKind::DevEpodeConnections,
        }
    }

    fn accept_failed(self) -> &'static str {
        match self {
            Role::Mcp => "accepting connections failed",
            Role::Admin => "accepting connections on the admin listener failed",
            Role::DevEpode => "accepting connections for the embedded Epode failed",
        }
    }
}

/// How the one connection cap is shared. The admin listener and the `--dev` Epode (when
/// there are) each keep a sixteenth of it for themselves (at least 4 connections, at most
/// 256, never more than a quarter of the cap); the MCP port has the rest. A flood of the MCP
/// port then leaves the probes their connections, and a flood of the admin port costs the
/// MCP port nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shares {
    pub(crate) mcp: usize,
    pub(crate) admin: usize,
    pub(crate) dev_epode: usize,
}

impl Shares {
    pub(crate) fn of(cap: usize, admin: bool, dev_epode: bool) -> Shares {
        let reserved = (cap / 16).clamp(4, 256).min(cap / 4).max(1);
        let admin = if admin { reserved } else { 0 };
        let dev_epode = if dev_epode { reserved } else { 0 };
        Shares {
            mcp: cap.saturating_sub(admin + dev_epode).max(1),
            admin,
            dev_epode,
        }
    }
}

/// The HTTP/1 and HTTP/2 settings of every connection, on every listener.
fn http_builder(limits: &Limits) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        // hyper answers a head larger than its read buffer, or with more fields, with 431.
        // The same size bounds its write buffer: it takes another piece of a body only
        // while it holds less.
        .max_buf_size(limits.max_header_bytes.max(8192))
        .max_headers(limits.max_headers)
        // Not `half_close`: hyper would then never read a busy connection, and a client
        // that leaves before its answer would not cancel its request; `conn` tells the two
        // apart instead.
        .half_close(false);
    builder
        .http2()
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
        // A stream asks its body for more only while it holds less than this.
        .max_send_buf_size(CHUNK);
    builder
}

/// A listener's bounds, shared by its connections (on the MCP port, by every worker's).
#[derive(Clone)]
pub(crate) struct Bounds(Arc<ListenerShared>);

struct ListenerShared {
    /// The connections open, under the listener's share of the cap.
    connections: Gate,
    /// The limit kind counted when a connection is refused.
    refused: LimitKind,
    deadlines: Deadlines,
    body_timeout: Duration,
    http: auto::Builder<TokioExecutor>,
    accept_errors: LogSummary,
    metrics: Arc<Metrics>,
    /// Counts what HTTP/2 streams hand to their connection until it is written: one
    /// connection may carry many answers at once.
    budget: Option<Arc<MemoryBudget>>,
}

/// A connection let in: where from, its place under the cap, and when it was accepted.
pub(crate) struct Admitted {
    pub(crate) peer: SocketAddr,
    place: Permit,
    accepted: Instant,
}

impl Admitted {
    /// When its first request head is due (a TLS handshake included).
    pub(crate) fn head_due(&self, bounds: &Bounds) -> Instant {
        self.accepted + bounds.0.deadlines.head
    }
}

impl Bounds {
    pub(crate) fn new(
        role: Role,
        cap: usize,
        limits: &Limits,
        metrics: Arc<Metrics>,
        budget: Option<Arc<MemoryBudget>>,
    ) -> Self {
        Bounds(Arc::new(ListenerShared {
            connections: Gate::with_gauge(cap, metrics.open_connections.clone()),
            refused: role.refused(),
            deadlines: Deadlines {
                head: limits.header_timeout,
                idle: limits.idle_timeout,
            },
            body_timeout: limits.body_timeout,
            http: http_builder(limits),
            accept_errors: LogSummary::new(role.accept_failed(), Duration::from_secs(10)),
            metrics,
            budget,
        }))
    }

    pub(crate) fn body_timeout(&self) -> Duration {
        self.0.body_timeout
    }

    /// Accepts connections on `listener` until `stop` completes; each one let in under the
    /// cap is handed to `admitted`, one past it is reset at once.
    pub(crate) async fn accept_until<F>(
        &self,
        listener: &TcpListener,
        stop: impl Future<Output = ()>,
        mut admitted: F,
    ) where
        F: FnMut(TcpStream, Admitted),
    {
        tokio::pin!(stop);
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = &mut stop => return,
            };
            let (stream, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: pause instead of spinning.
                    self.0.accept_errors.add(accept_error_kind(&e), 1);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Some(place) = self.0.connections.try_enter() else {
                self.0.metrics.limit(self.0.refused);
                // Past the cap: closed at once, costing nothing more. A zero linger resets
                // the connection at close; it never blocks.
                #[allow(deprecated)]
                let _ = stream.set_linger(Some(Duration::ZERO));
                drop(stream);
                continue;
            };
            let _ = stream.set_nodelay(true);
            admitted(
                stream,
                Admitted {
                    peer,
                    place,
                    accepted: Instant::now(),
                },
            );
        }
    }

    /// Serves one connection (plain, or after its TLS handshake) to its end, each request
    /// answered by `handler`. With `drain`, the connection finishes its requests and closes
    /// once it turns true (the receiver is dropped when the connection has ended). On plain
    /// TCP a client that shuts its sending side after a complete request still gets its
    /// answer (`conn`: its end is probed; a client gone for good is still cut).
    pub(crate) async fn serve<IO, H, F>(
        &self,
        io: IO,
        admitted: Admitted,
        handler: H,
        drain: Option<watch::Receiver<bool>>,
    ) where
        IO: ClientStream + Send + 'static,
        H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
        F: Future<Output = Response<Body>> + Send + 'static,
    {
        let shared = &self.0;
        let peer = admitted.peer;
        let watched = Watched::new(
            io,
            shared.deadlines,
            admitted.place,
            shared.metrics.clone(),
            admitted.accepted,
        );
        let state = watched.state();
        let in_service = state.clone();
        let budget = shared.budget.clone();
        let service = service_fn(move |req: Request<Incoming>| {
            let guard = in_service.request_started(req.version() == Version::HTTP_11);
            let h2 = req.version() == Version::HTTP_2;
            let counted = if h2 { budget.clone() } else { None };
            let closing = h2.then(|| in_service.clone());
            let answer = handler(req);
            async move {
                let mut resp = answer.await;
                if let Some(state) = closing {
                    if resp.headers_mut().remove(header::CONNECTION).is_some() {
                        // `Connection: close` (a cut request, shutdown): on HTTP/2, the
                        // connection's other streams finish, then it closes (GOAWAY).
                        state.close_when_done();
                    }
                }
                Ok::<_, Infallible>(resp.map(|b| conn::track(b, guard, counted)))
            }
        });
        let conn = shared
            .http
            .serve_connection_with_upgrades(TokioIo::new(watched), service)
            .into_owned();
        tokio::pin!(conn);
        // Held until the connection has ended: the drain waits for every receiver to go.
        let mut drain = drain;
        let stop = async {
            let drained = async {
                match drain.as_mut() {
                    Some(drain) => drop(drain.wait_for(|d| *d).await),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = drained => {}
                () = state.closing() => {}
            }
        };
        tokio::pin!(stop);
        let mut stopping = false;
        let ended = loop {
            tokio::select! {
                biased;
                ended = conn.as_mut() => break ended,
                () = &mut stop, if !stopping => {
                    stopping = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        };
        if let Err(e) = ended {
            tracing::debug!(%peer, error = %e, "connection ended with an error");
        }
    }
}

fn accept_error_kind(e: &std::io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(24 | 23) => "out_of_file_descriptors",
        _ => "other",
    }
}

/// Registers a bound listener on the current event loop.
pub(crate) fn register(listener: std::net::TcpListener) -> std::io::Result<TcpListener> {
    listener.set_nonblocking(true)?;
    TcpListener::from_std(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_shared_and_never_passed() {
        for cap in [1, 2, 3, 4, 10, 16, 100, 204, 819, 16_000, 1_000_000] {
            for (admin, dev) in [(false, false), (true, false), (false, true), (true, true)] {
                let s = Shares::of(cap, admin, dev);
                assert!(s.mcp >= 1, "{cap}: {s:?}");
                assert_eq!(s.admin > 0, admin);
                assert_eq!(s.dev_epode > 0, dev);
                if cap >= 4 {
                    assert_eq!(s.mcp + s.admin + s.dev_epode, cap, "{cap}: {s:?}");
                }
            }
        }
        assert_eq!(
            Shares::of(204, true, false),
            Shares {
                mcp: 192,
                admin: 12,
                dev_epode: 0
            }
        );
        assert_eq!(Shares::of(1_000_000, true, true).admin, 256);
        assert_eq!(Shares::of(20, true, true).admin, 4);
    }
}
