//! The hop to the upstream, whichever transport carries it: Streamable HTTP (a pool per
//! worker) or a stdio child process (one for all workers). Both answer a POSTed JSON-RPC
//! message with an HTTP response whose body is JSON or SSE, so everything above this module
//! is the same for both.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};
use http_body::Frame;

use super::caller::{Caller, ServerRequests};
use super::http::HttpUpstream;
use super::pool::PooledBody;
use super::ready::NotReady;
use super::stdio::{StdioBody, StdioUpstream};
use crate::body::BoxError;
use crate::error::Error;

/// How recently the upstream must have answered for readiness to hold without a probe.
const READY_WINDOW: Duration = Duration::from_secs(10);

/// One per worker, built once and never moved on the request path, so the HTTP pool stays
/// inline rather than behind one more pointer.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub(crate) enum Hop {
    Http(HttpUpstream),
    Stdio(StdioUpstream),
}

/// An upstream answer's body.
pub(crate) enum UpstreamBody {
    Http(PooledBody),
    Stdio(StdioBody),
}

impl http_body::Body for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            UpstreamBody::Http(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            UpstreamBody::Stdio(b) => Pin::new(b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::Http(b) => b.is_end_stream(),
            UpstreamBody::Stdio(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            UpstreamBody::Http(b) => b.size_hint(),
            UpstreamBody::Stdio(b) => b.size_hint(),
        }
    }
}

impl Hop {
    /// The same hop for another worker (an HTTP pool of its own; the one child process).
    pub(crate) fn for_worker(&self) -> Self {
        match self {
            Hop::Http(h) => Hop::Http(h.for_worker()),
            Hop::Stdio(s) => Hop::Stdio(s.clone()),
        }
    }

    /// The client's end-to-end headers as they go upstream.
    pub(crate) fn base_headers(&self, client: &HeaderMap) -> HeaderMap {
        match self {
            Hop::Http(h) => h.base_headers(client),
            // Nothing of them reaches a child but the session the sidecar gave it.
            Hop::Stdio(_) => {
                let mut h = client.clone();
                super::http::strip_hop_by_hop(&mut h);
                h
            }
        }
    }

    /// POSTs one JSON-RPC message; `relay` says whether its client may be sent the server's
    /// own requests (only a stdio child needs to know).
    pub(crate) async fn post(
        &self,
        caller: &Caller,
        headers: HeaderMap,
        body: Bytes,
        query: Option<&str>,
        relay: ServerRequests,
    ) -> Result<Response<UpstreamBody>, Error> {
        match self {
            Hop::Http(h) => Ok(h.post(headers, body, query).await?.map(UpstreamBody::Http)),
            Hop::Stdio(s) => Ok(s
                .post(caller, &headers, &body, relay)
                .await?
                .map(UpstreamBody::Stdio)),
        }
    }

    /// Opens a 2025-era session's notices: the GET stream of an HTTP upstream, or the
    /// notices a stdio child writes that answer no request, as an SSE body.
    pub(crate) async fn watch(
        &self,
        caller: &Caller,
        headers: HeaderMap,
    ) -> Result<Response<UpstreamBody>, Error> {
        match self {
            Hop::Http(h) => Ok(h.get(headers).await?.map(UpstreamBody::Http)),
            Hop::Stdio(s) => Ok(s.watch(caller).await?.map(UpstreamBody::Stdio)),
        }
    }

    /// Closes a 2025-era session (a child's only session is its pipe: nothing to do).
    pub(crate) async fn delete(&self, headers: HeaderMap) -> Result<StatusCode, Error> {
        match self {
            Hop::Http(h) => h.delete(headers).await,
            Hop::Stdio(_) => Ok(StatusCode::OK),
        }
    }

    /// Whether the upstream answered recently or answers a probe now (HTTP), or runs and
    /// answers (stdio); `Err` says why not.
    pub(crate) async fn ready(&self) -> Result<(), NotReady> {
        match self {
            Hop::Http(h) if h.answered_within(READY_WINDOW) => Ok(()),
            Hop::Http(h) => h.probe().await,
            Hop::Stdio(s) => s.ready().await,
        }
    }

    /// Whether a client's messages that need no answer (its answers to the server's requests,
    /// its cancellations) mean anything upstream: only to a stdio child, whose one session
    /// they belong to.
    pub(crate) fn takes_client_notes(&self) -> bool {
        matches!(self, Hop::Stdio(_))
    }

    /// Stops a stdio child (and waits for it); nothing for HTTP.
    pub(crate) async fn shutdown(&self) {
        if let Hop::Stdio(s) = self {
            s.shutdown().await;
        }
    }
}
