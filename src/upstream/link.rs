//! The raw exchange with the upstream, below any era decision: the hop (HTTP pool or stdio
//! child), the headers every upstream MCP request starts from, the ids and the trace context
//! of the sidecar's own requests, reading an answer whole within its bounds, and the server
//! identity (kept as the upstream describes itself). The era resolver, the 2025 sessions and
//! `Upstream` all send through it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use ::http::{header, HeaderMap, HeaderValue, Response};
use bytes::Bytes;
use serde_json::Value;

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

/// The trace context a request carries, in its headers and its `params._meta`.
const TRACE_FIELDS: [&str; 3] = ["traceparent", "tracestate", "baggage"];

/// Spans of the sidecar's own upstream requests (OpenTelemetry's, when it is on: `cli` hands
/// them in, as `otel` implements them).
pub(crate) trait OwnSpans: Send + Sync {
    /// A span for one of the sidecar's own requests, `name` for `reason`: a child of the
    /// request being served when there is one (none when that request is not sampled), else
    /// a root.
    fn start(&self, name: &'static str, reason: &'static str) -> Option<Box<dyn OwnSpan>>;
}

/// One of those spans, ended when dropped.
pub(crate) trait OwnSpan: Send {
    /// Its `traceparent` (and `tracestate`), for the upstream.
    fn fields(&self) -> Vec<(&'static str, String)>;
    /// The upstream's answer, by its HTTP status.
    fn answered(&self, status: u16);
}

/// What every worker's link shares.
struct Shared {
    counter: AtomicU64,
    identity: ServerIdentity,
    spans: OnceLock<Arc<dyn OwnSpans>>,
    /// Who hears the upstream's capabilities, each time a discovery or a handshake says them.
    capabilities: OnceLock<HearsCapabilities>,
}

/// Who hears the upstream's capabilities.
pub(crate) type HearsCapabilities = Arc<dyn Fn(&Value) + Send + Sync>;

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
                spans: OnceLock::new(),
                capabilities: OnceLock::new(),
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

    /// Makes the sidecar's own requests spans of their own (set once, when OpenTelemetry
    /// starts).
    pub(crate) fn trace_own_requests(&self, spans: Arc<dyn OwnSpans>) {
        let _ = self.shared.spans.set(spans);
    }

    /// `f` hears the upstream's capabilities whenever its `server/discover` or `initialize`
    /// answer says them (set once).
    pub(crate) fn on_capabilities(&self, f: HearsCapabilities) {
        let _ = self.shared.capabilities.set(f);
    }

    /// The upstream said its capabilities (in a discovery, or a 2025 handshake's result).
    pub(crate) fn heard_capabilities(&self, answer: &Value) {
        if let (Some(f), Some(caps)) = (self.shared.capabilities.get(), answer.get("capabilities"))
        {
            f(caps);
        }
    }

    /// One of the sidecar's own requests (`name`, for `reason`), as it goes upstream: never
    /// with the trace context of the client whose request caused it (in `headers` and in the
    /// body's `params._meta`); with OpenTelemetry on, with its own span's, which is returned
    /// (it ends when dropped).
    pub(crate) fn own(
        &self,
        name: &'static str,
        reason: &'static str,
        headers: &mut HeaderMap,
        body: Bytes,
    ) -> (Bytes, Option<Box<dyn OwnSpan>>) {
        for f in TRACE_FIELDS {
            headers.remove(f);
        }
        let span = self.shared.spans.get().and_then(|s| s.start(name, reason));
        let fields = span.as_ref().map(|s| s.fields()).unwrap_or_default();
        let (h, body) = super::translate::own_trace_fields(headers, &body, &TRACE_FIELDS, &fields);
        *headers = h;
        (body, span)
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
    ///
    /// A plain function handing back the hop's future: an `async fn` here would hold the
    /// headers and body twice in the request's future (its arguments, and the hop's).
    pub(crate) fn post<'a>(
        &'a self,
        caller: &'a Caller,
        headers: HeaderMap,
        body: Bytes,
        query: Option<&'a str>,
        relay: ServerRequests,
    ) -> impl std::future::Future<Output = Result<Response<UpstreamBody>, Error>> + 'a {
        self.hop.post(caller, headers, body, query, relay)
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
