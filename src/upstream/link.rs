//! The raw exchange with the upstream, below any era decision: the hop (HTTP pool or stdio
//! child), the headers every upstream MCP request starts from, the ids of the sidecar's own
//! requests, reading an answer whole within its bounds, and the server identity (kept as the
//! upstream describes itself). The era resolver, the 2025 sessions and `Upstream` all send through
//! it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ::http::{header, HeaderMap, HeaderValue, Response};
use bytes::Bytes;

use super::answer::{read_answer, AnswerBounds, ReadAnswer};
use super::caller::Caller;
use super::caller::ServerRequests;
use super::hop::{Hop, UpstreamBody};
use super::identity::ServerIdentity;
use crate::error::Error;
use crate::mcp::headers as mcp_headers;

/// Headers the sidecar sets itself on every upstream MCP request.
const MCP_ROUTING: [&str; 5] = [
    mcp_headers::PROTOCOL_VERSION,
    mcp_headers::METHOD,
    mcp_headers::NAME,
    mcp_headers::SESSION_ID,
    "last-event-id",
];

/// What every worker's link shares.
struct Shared {
    counter: AtomicU64,
    identity: ServerIdentity,
}

/// One worker's way to the upstream.
pub(crate) struct Link {
    hop: Hop,
    bounds: AnswerBounds,
    shared: Arc<Shared>,
}

impl Link {
    pub(crate) fn new(hop: Hop, bounds: AnswerBounds, identity: ServerIdentity) -> Self {
        Link {
            hop,
            bounds,
            shared: Arc::new(Shared {
                counter: AtomicU64::new(0),
                identity,
            }),
        }
    }

    /// The same link for another worker: its own pool, the same counter and knowledge.
    pub(crate) fn for_worker(&self) -> Self {
        Link {
            hop: self.hop.for_worker(),
            bounds: self.bounds.clone(),
            shared: self.shared.clone(),
        }
    }

    pub(crate) fn hop(&self) -> &Hop {
        &self.hop
    }

    pub(crate) fn bounds(&self) -> &AnswerBounds {
        &self.bounds
    }

    /// A fresh id for a request the sidecar sends on its own (`what` says which).
    pub(crate) fn next_id(&self, what: &str) -> String {
        format!(
            "epode-sidecar-{what}-{}",
            self.shared.counter.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// The server identity, which the link keeps as the upstream describes itself.
    pub(crate) fn identity(&self) -> &ServerIdentity {
        &self.shared.identity
    }

    /// The client's end-to-end headers for an upstream MCP request, without the routing
    /// headers the sidecar sets itself.
    pub(crate) fn base_headers(&self, client: &HeaderMap) -> HeaderMap {
        let mut h = self.hop.base_headers(client);
        for name in MCP_ROUTING {
            h.remove(name);
        }
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        h
    }

    /// A modern client's headers for a modern upstream: its routing headers were validated
    /// against the body, so they go as they are (less any session id).
    pub(crate) fn base_headers_modern(&self, client: &HeaderMap) -> HeaderMap {
        let mut headers = self.hop.base_headers(client);
        headers.remove(mcp_headers::SESSION_ID);
        headers
    }

    /// POSTs one JSON-RPC message upstream.
    pub(crate) async fn post(
        &self,
        caller: &Caller,
        headers: HeaderMap,
        body: Bytes,
        query: Option<&str>,
        relay: ServerRequests,
    ) -> Result<Response<UpstreamBody>, Error> {
        self.hop.post(caller, headers, body, query, relay).await
    }

    /// Sends one of the sidecar's own requests and reads its answer whole.
    pub(crate) async fn exchange(
        &self,
        caller: &Caller,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<ReadAnswer, Error> {
        let resp = self
            .post(caller, headers, body, None, ServerRequests::Withheld)
            .await?;
        read_answer(resp, &self.bounds).await
    }
}
