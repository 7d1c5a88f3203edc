//! The upstream hop over Streamable HTTP: a connection pool per worker (`pool`) under one
//! bound on connections for the process (`pool::ConnectionBound`: a request past it waits briefly, then
//! gets 503 with nothing sent), header hygiene (hop-by-hop headers dropped, the upstream's own
//! authority as `Host`, no `Origin`), a deadline for the response head, and a record of when
//! the upstream last answered (for `/readyz`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, HeaderValue, Request, Response, Uri};
use http_body_util::Full;
use hyper_rustls::HttpsConnectorBuilder;
use hyper_util::client::legacy::connect::HttpConnector;

use super::dns::Resolver;
pub(crate) use super::pool::PooledBody;
use super::pool::{ConnectionBound, Connector, IdleBound, Pool, PoolError, Share};
use super::ready::NotReady;
use crate::config::UpstreamTarget;
use crate::error::{Error, ErrorKind};
use crate::metrics::LimitKind;

/// Headers that describe one connection, not the message (RFC 9110 §7.6.1), never forwarded,
/// and `Transfer-Encoding` (each hop frames the body itself). Names, not strings: removing by a
/// string parses it first, on every request; a `static`, so no array is built per lookup.
static HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    header::TRANSFER_ENCODING,
];

/// Removes hop-by-hop headers, including any named by `Connection`, and `Transfer-Encoding`.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    if !headers.keys().any(|k| HOP_BY_HOP.contains(k)) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
}

/// When the upstream last answered, shared by every worker's pool (for readiness).
#[derive(Debug)]
struct LastAnswer {
    started: Instant,
    /// Milliseconds since `started` of the last answer (any HTTP response), plus one; 0 =
    /// never.
    ms: AtomicU64,
}

/// One worker's connection pool to the upstream. Each server worker has its own (a pooled
/// connection's task lives on the event loop that opened it); [`HttpUpstream::for_worker`]
/// makes another that shares what the workers must agree on.
#[derive(Clone)]
pub(crate) struct HttpUpstream {
    pool: Pool,
    tls: Arc<rustls::ClientConfig>,
    target: UpstreamTarget,
    host: HeaderValue,
    /// The upstream's path and query as requests carry them (origin form), built once (a
    /// client's query string makes another).
    base_uri: Uri,
    timeout: Duration,
    idle: IdleBound,
    gate: Arc<ConnectionBound>,
    last_answer: Arc<LastAnswer>,
    resolver: Resolver,
    on_limit: OnLimit,
}

/// Counts a refusal at a limit (in the metrics).
pub(crate) type OnLimit = Arc<dyn Fn(LimitKind) + Send + Sync>;

/// The bounds of the hop: the upstream timeout, the idle connections a worker keeps, the
/// process's connections and how long a request waits for one.
pub(crate) struct HttpBounds {
    pub(crate) timeout: Duration,
    pub(crate) idle: IdleBound,
    pub(crate) max_connections: usize,
    /// With the HTTP surface on: how many of them the surface may hold at once.
    pub(crate) surface_connections: Option<usize>,
    pub(crate) wait: Duration,
    pub(crate) on_limit: OnLimit,
    /// Counts the connections open.
    pub(crate) gauge: prometheus_client::metrics::gauge::Gauge,
}

fn pool(
    target: &UpstreamTarget,
    timeout: Duration,
    idle: IdleBound,
    gate: &Arc<ConnectionBound>,
    tls: &rustls::ClientConfig,
    resolver: &Resolver,
) -> Pool {
    let mut connector = HttpConnector::new_with_resolver(resolver.clone());
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(timeout.min(Duration::from_secs(10))));
    connector.enforce_http(false);
    let connector: Connector = HttpsConnectorBuilder::new()
        .with_tls_config(tls.clone())
        .https_or_http()
        .enable_http1()
        .wrap_connector(connector);
    let origin = format!("{}://{}/", target.url.scheme(), target.authority)
        .parse()
        .unwrap_or_else(|_| Uri::from_static("http://localhost/"));
    Pool::new(connector, origin, idle, gate.clone())
}

impl HttpUpstream {
    pub(crate) fn new(
        target: UpstreamTarget,
        tls: Arc<rustls::ClientConfig>,
        bounds: HttpBounds,
    ) -> Self {
        let host = HeaderValue::from_str(&target.authority)
            .unwrap_or_else(|_| HeaderValue::from_static("localhost"));
        let resolver = Resolver::default();
        let HttpBounds {
            timeout,
            idle,
            max_connections,
            surface_connections,
            wait,
            on_limit,
            gauge,
        } = bounds;
        // The wait is part of the time the answer's head has.
        let gate = ConnectionBound::new(
            max_connections,
            surface_connections,
            wait.min(timeout),
            gauge,
        );
        HttpUpstream {
            pool: pool(&target, timeout, idle, &gate, &tls, &resolver),
            idle,
            gate,
            on_limit,
            resolver,
            tls,
            base_uri: build_uri(&target, None),
            target,
            host,
            timeout,
            last_answer: Arc::new(LastAnswer {
                started: Instant::now(),
                ms: AtomicU64::new(0),
            }),
        }
    }

    /// The same upstream with a pool of its own, for another worker.
    pub(crate) fn for_worker(&self) -> Self {
        HttpUpstream {
            pool: pool(
                &self.target,
                self.timeout,
                self.idle,
                &self.gate,
                &self.tls,
                &self.resolver,
            ),
            idle: self.idle,
            gate: self.gate.clone(),
            on_limit: self.on_limit.clone(),
            resolver: self.resolver.clone(),
            tls: self.tls.clone(),
            target: self.target.clone(),
            host: self.host.clone(),
            base_uri: self.base_uri.clone(),
            timeout: self.timeout,
            last_answer: self.last_answer.clone(),
        }
    }

    fn uri(&self, client_query: Option<&str>) -> Uri {
        match client_query {
            Some(q) if self.target.url.query().is_none() => build_uri(&self.target, Some(q)),
            _ => self.base_uri.clone(),
        }
    }

    /// The client's end-to-end headers as they go upstream: no hop-by-hop headers, no `Origin`
    /// (the sidecar checked it), the upstream's own authority as `Host`.
    pub(crate) fn base_headers(&self, client: &HeaderMap) -> HeaderMap {
        let mut headers = client.clone();
        strip_hop_by_hop(&mut headers);
        headers.remove(header::ORIGIN);
        headers.remove(header::CONTENT_LENGTH);
        headers.insert(header::HOST, self.host.clone());
        headers
    }

    /// The upstream's own authority, as `Host`.
    pub(crate) fn host(&self) -> &HeaderValue {
        &self.host
    }

    /// POSTs a body upstream. The response head must arrive within the configured timeout;
    /// its body then streams for as long as both ends want.
    pub(crate) async fn post(
        &self,
        headers: HeaderMap,
        body: Bytes,
        client_query: Option<&str>,
    ) -> Result<Response<PooledBody>, Error> {
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = http::Method::POST;
        *req.uri_mut() = self.uri(client_query);
        *req.headers_mut() = headers;
        self.send(req).await
    }

    /// GETs the upstream's session stream (a 2025-era upstream's notices). Its head must
    /// arrive within the timeout; its body then streams for as long as both ends want.
    pub(crate) async fn get(&self, headers: HeaderMap) -> Result<Response<PooledBody>, Error> {
        let mut req = Request::new(Full::new(Bytes::new()));
        *req.method_mut() = http::Method::GET;
        *req.uri_mut() = self.uri(None);
        *req.headers_mut() = headers;
        self.send(req).await
    }

    /// DELETEs the upstream's session (a 2025-era upstream's way to close one).
    pub(crate) async fn delete(&self, headers: HeaderMap) -> Result<http::StatusCode, Error> {
        let mut req = Request::new(Full::new(Bytes::new()));
        *req.method_mut() = http::Method::DELETE;
        *req.uri_mut() = self.uri(None);
        *req.headers_mut() = headers;
        Ok(self.send(req).await?.status())
    }

    /// Sends a request of the MCP path (or the sidecar's own). (Not an `async fn`: that would
    /// hold the request twice in the request's future.)
    fn send(
        &self,
        req: Request<Full<Bytes>>,
    ) -> impl std::future::Future<Output = Result<Response<PooledBody>, Error>> + '_ {
        self.send_for(req, Share::Mcp)
    }

    /// Sends a request of the HTTP surface, within the surface's share of the connections.
    pub(crate) async fn send_surface(
        &self,
        req: Request<Full<Bytes>>,
    ) -> Result<Response<PooledBody>, Error> {
        self.send_for(req, Share::Surface).await
    }

    async fn send_for(
        &self,
        req: Request<Full<Bytes>>,
        share: Share,
    ) -> Result<Response<PooledBody>, Error> {
        match tokio::time::timeout(self.timeout, self.pool.send_for(req, share)).await {
            Err(_) => Err(Error::new(ErrorKind::UpstreamTimeout(self.timeout), "")),
            Ok(Err(PoolError::Connect(e))) => Err(Error::new(ErrorKind::UpstreamUnreachable, e)),
            Ok(Err(PoolError::Request(e))) => Err(Error::caused_by(ErrorKind::UpstreamFailed, "", e)),
            Ok(Err(PoolError::Busy(waited, share))) => {
                (self.on_limit)(LimitKind::UpstreamConnections);
                Err(busy(waited, share))
            }
            // The sidecar never asks for an upgrade (it strips `Upgrade`), so a 101 is one
            // nobody asked for: relaying it would leave the client's connection unusable.
            Ok(Ok(resp)) if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS => {
                Err(Error::new(
                    ErrorKind::UpstreamFailed,
                    "the upstream answered 101 Switching Protocols to a request that asked for no upgrade",
                ))
            }
            Ok(Ok(mut resp)) => {
                // A 404 (a wrong path, until the probe reads it) or a 5xx is no sign of health.
                let status = resp.status();
                if status != http::StatusCode::NOT_FOUND && !status.is_server_error() {
                    self.mark_answered();
                }
                strip_hop_by_hop(resp.headers_mut());
                Ok(resp)
            }
        }
    }

    fn mark_answered(&self) {
        let a = &self.last_answer;
        let ms = a.started.elapsed().as_millis() as u64 + 1;
        a.ms.store(ms, Ordering::Relaxed);
    }

    /// Whether the upstream answered within `window`.
    pub(crate) fn answered_within(&self, window: Duration) -> bool {
        let a = &self.last_answer;
        let last = a.ms.load(Ordering::Relaxed);
        if last == 0 {
            return false;
        }
        let now = a.started.elapsed().as_millis() as u64 + 1;
        now.saturating_sub(last) <= window.as_millis() as u64
    }

    /// Readiness probe: a POSTed JSON-RPC `ping`, never a GET (a stateless Python upstream
    /// answers GET with a stream that never ends). An answer below 500 means it is serving,
    /// but for a 404 that is not a JSON-RPC answer (a 2026 server may refuse `ping` with one):
    /// then the path is wrong. `Err` says why it is not ready.
    pub(crate) async fn probe(&self) -> Result<(), NotReady> {
        let body = Bytes::from_static(
            br#"{"jsonrpc":"2.0","id":"epode-sidecar-readiness","method":"ping"}"#,
        );
        let req = Request::post(self.uri(None))
            .header(header::HOST, self.host.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream")
            .body(Full::new(body))
            .map_err(|e| NotReady::lasting(PROBE_NOT_BUILT, e.to_string()))?;
        let within = Duration::from_secs(2);
        let url = crate::config::redact_url(self.target.url.as_str()).into_owned();
        let resp = match tokio::time::timeout(within, self.pool.send(req)).await {
            Err(_) => {
                return Err(NotReady::passing(
                    "the upstream MCP server did not answer within 2 s",
                    format!("the upstream {url} did not answer within 2 s"),
                ))
            }
            Ok(Err(PoolError::Connect(e))) => {
                return Err(NotReady::passing(
                    "the upstream MCP server is unreachable",
                    format!("the upstream {url} is unreachable: {e}"),
                ))
            }
            Ok(Err(PoolError::Request(e))) => {
                return Err(NotReady::passing(
                    "the request to the upstream MCP server failed",
                    format!("the upstream {url} failed: {}", super::pool::chain(&e)),
                ))
            }
            Ok(Err(PoolError::Busy(waited, share))) => {
                return Err(NotReady::passing(
                    "every connection to the upstream MCP server is busy",
                    busy(waited, share).to_string(),
                ))
            }
            Ok(Ok(resp)) => resp,
        };
        let status = resp.status();
        if status.is_server_error() {
            return Err(NotReady::lasting(
                "the upstream MCP server answers with a server error",
                format!("the upstream {url} answers {status}"),
            ));
        }
        // Read to its end (a small answer): the connection then goes back to the pool.
        let json_rpc = is_json_rpc(resp, within).await;
        if status == http::StatusCode::NOT_FOUND && !json_rpc {
            return Err(NotReady::lasting(
                "the upstream answers 404 Not Found at the configured MCP path",
                format!("the upstream answers 404 Not Found at {url}: is the path right? It is usually /mcp (EPODE_SIDECAR_UPSTREAM)"),
            ));
        }
        self.mark_answered();
        Ok(())
    }
}

/// Why readiness cannot be told (no request could be made): no address to hide.
const PROBE_NOT_BUILT: &str = "the readiness probe could not be built";

/// Every connection to the upstream the process may open (or the path's share of them) was
/// busy for `waited`.
fn busy(waited: Duration, share: Option<Share>) -> Error {
    let which = match share {
        None => "it may open (EPODE_SIDECAR_UPSTREAM_MAX_CONNECTIONS)",
        Some(Share::Mcp) => "the MCP path may hold (EPODE_SIDECAR_UPSTREAM_MAX_CONNECTIONS less the HTTP surface's share, EPODE_SIDECAR_HTTP_UPSTREAM_SHARE)",
        Some(Share::Surface) => "the HTTP surface may hold (its share, EPODE_SIDECAR_HTTP_UPSTREAM_SHARE of EPODE_SIDECAR_UPSTREAM_MAX_CONNECTIONS)",
    };
    Error::new(
        ErrorKind::Overloaded { retry_after: 1 },
        format!(
            "every connection to the upstream {which} stayed busy for {}, so the request was not sent",
            humantime::format_duration(waited)
        ),
    )
    .unsent()
}

/// Whether a (small) answer's body is a JSON-RPC message: an MCP endpoint's refusal, not a
/// web framework's page for a path it does not serve. An SSE answer counts by its content
/// type (its stream may not end).
async fn is_json_rpc(resp: Response<PooledBody>, within: Duration) -> bool {
    use http_body_util::BodyExt as _;
    if crate::body::is_event_stream(resp.headers()) {
        return true;
    }
    let body = http_body_util::Limited::new(resp.into_body(), 64 * 1024).collect();
    match tokio::time::timeout(within, body).await {
        Ok(Ok(b)) => serde_json::from_slice::<serde_json::Value>(&b.to_bytes())
            .is_ok_and(|v| v.get("jsonrpc").is_some()),
        _ => false,
    }
}

/// The upstream's path and query as a request line carries them: its own query string, else
/// the client's.
fn build_uri(target: &UpstreamTarget, client_query: Option<&str>) -> Uri {
    let url = &target.url;
    let query = url.query().or(client_query);
    let mut s = url.path().to_owned();
    if let Some(q) = query {
        s.push('?');
        s.push_str(q);
    }
    s.parse().unwrap_or_else(|_| Uri::from_static("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_hop_by_hop_and_connection_named() {
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("close, x-private"));
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("authorization", HeaderValue::from_static("Bearer t"));
        h.insert("mcp-session-id", HeaderValue::from_static("s"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 2);
        assert!(h.contains_key("authorization"));
        assert!(h.contains_key("mcp-session-id"));
    }
}
