//! One request's journey through the sidecar, top to bottom: front-door checks, then the
//! upstream hop, then the response streamed back.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::body::{full, Body};
use crate::config::Config;
use crate::frontdoor;
use crate::mcp::message::{self, Inbound};
use crate::upstream::HttpUpstream;

/// How recently the upstream must have answered for `/readyz` to say ready without a probe.
const READY_WINDOW: Duration = Duration::from_secs(10);

pub struct Sidecar {
    pub config: Arc<Config>,
    pub upstream: HttpUpstream,
}

impl Sidecar {
    pub fn new(config: Arc<Config>) -> Self {
        let upstream = HttpUpstream::new(config.upstream.clone(), config.upstream_timeout);
        Sidecar { config, upstream }
    }

    /// Routes one request: the MCP path, health, readiness, or 404.
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path();
        if path == self.config.path {
            return self.mcp(req).await;
        }
        match (req.method(), path) {
            (&Method::GET | &Method::HEAD, "/healthz" | "/health") => {
                json_response(StatusCode::OK, r#"{"status":"ok"}"#)
            }
            (&Method::GET | &Method::HEAD, "/readyz") => self.readyz().await,
            _ => json_response(
                StatusCode::NOT_FOUND,
                r#"{"error":"not found: MCP clients post to the configured path"}"#,
            ),
        }
    }

    async fn readyz(&self) -> Response<Body> {
        if self.upstream.answered_within(READY_WINDOW) || self.upstream.probe().await {
            json_response(StatusCode::OK, r#"{"status":"ready"}"#)
        } else {
            json_response(
                StatusCode::SERVICE_UNAVAILABLE,
                r#"{"status":"not ready","reason":"the upstream MCP server has not answered"}"#,
            )
        }
    }

    async fn mcp(&self, req: Request<Incoming>) -> Response<Body> {
        let (parts, body) = req.into_parts();
        if let Err(e) = frontdoor::check_host(&self.config.allowed_hosts, &parts)
            .and_then(|()| frontdoor::check_origin(&self.config.allowed_origins, &parts.headers))
        {
            tracing::warn!(error = %e, "refused at the front door");
            return e.into_response(None);
        }
        let bytes = if parts.method == Method::POST {
            match frontdoor::read_body(&parts, body, self.config.max_body_bytes).await {
                Ok(b) => b,
                Err(e) => return e.into_response(None),
            }
        } else {
            drop(body);
            Bytes::new()
        };

        let mut id = None;
        if parts.method == Method::POST {
            match message::parse(&bytes) {
                Ok(Inbound::Single(envelope)) => {
                    id = envelope.id.map(|r| r.to_owned());
                }
                Ok(Inbound::Batch) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "malformed request body");
                    return e.into_response(None);
                }
            }
        }

        match self.upstream.forward(&parts, bytes).await {
            Ok(resp) => stream_back(resp),
            Err(e) => {
                tracing::warn!(error = %e, "upstream hop failed");
                e.into_response(id.as_deref())
            }
        }
    }
}

/// The upstream's response as is: status, end-to-end headers, and the body streamed frame by
/// frame (an SSE event reaches the client when the upstream sends it).
fn stream_back(resp: Response<Incoming>) -> Response<Body> {
    let (parts, body) = resp.into_parts();
    Response::from_parts(parts, body.map_err(Into::into).boxed())
}

fn json_response(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}
