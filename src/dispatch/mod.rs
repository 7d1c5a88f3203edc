//! One worker's request path for the MCP endpoint: the one front every route shares
//! (`crate::request`: head, rate, in flight, body, token, then the caller), the message read
//! (`frontdoor::admit`) and its scopes, the method table (`table`), and the one record that
//! ends every request after its body. A request still running when the sidecar cuts
//! in-flight work at shutdown gets a JSON-RPC error, not a closed connection.

mod customer;
mod table;

use std::net::SocketAddr;
use std::sync::Arc;

use http::{Response, StatusCode};
use hyper::body::Incoming;
use tokio::sync::watch;

use crate::auth::{Authorizer, Principal};
use crate::binding::FeedbackBinding;
use crate::body::{self, Body};
use crate::caller::Caller;
use crate::config::Config;
use crate::error::Level;
use crate::frontdoor;
use crate::limits::RateLimits;
use crate::mcp::end::Abandoned;
use crate::mcp::method::Method;
use crate::metrics::Metrics;
use crate::otel::{self, Otel};
use crate::replica::{Replicas, Retry};
use crate::request::{Admitted, Front, Record, Recorder, Surface};
use crate::upstream::{Client, Refusal, Upstream};

use self::table::MethodTable;

/// One worker's request path: the method table (with the configuration, its view of the
/// upstream, the binding), and the front and the records every worker shares.
pub(crate) struct Dispatcher {
    table: MethodTable,
    /// The CORS answers' settings.
    config: Arc<Config>,
    front: Arc<Front>,
    records: Arc<Recorder>,
    /// The authorization front door, when on (the scopes of a request).
    auth: Option<Arc<Authorizer>>,
    /// The other replicas, with `EPODE_SIDECAR_REPLICA_URL` (a retry of a call one of them
    /// holds goes there).
    replicas: Option<Arc<Replicas>>,
    metrics: Arc<Metrics>,
}

/// What a request path is made of: the pieces it shares with the routes and the shutdown
/// (`cli` builds them once), and the signal that cuts in-flight requests.
pub(crate) struct Parts {
    pub(crate) config: Arc<Config>,
    /// This worker's view of the upstream.
    pub(crate) upstream: Arc<Upstream>,
    pub(crate) binding: Arc<FeedbackBinding>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) rates: Arc<RateLimits>,
    /// The one front and where the records are written (shared with the HTTP surface).
    pub(crate) front: Arc<Front>,
    pub(crate) records: Arc<Recorder>,
    /// Turns true when the sidecar cuts in-flight requests short at shutdown.
    pub(crate) cut: watch::Receiver<bool>,
    pub(crate) auth: Option<Arc<Authorizer>>,
    pub(crate) otel: Option<Arc<Otel>>,
    pub(crate) replicas: Option<Arc<Replicas>>,
}

impl Dispatcher {
    /// A request path from its parts (nothing is started here: `cli` started the binding and
    /// the upstream when it built them).
    pub(crate) fn new(parts: Parts) -> Self {
        let Parts {
            config,
            upstream,
            binding,
            metrics,
            rates,
            front,
            records,
            cut,
            auth,
            otel,
            replicas,
        } = parts;
        Dispatcher {
            table: MethodTable::new(
                config.clone(),
                upstream,
                binding,
                metrics.clone(),
                rates,
                cut,
                otel,
            ),
            config,
            front,
            records,
            auth,
            replicas,
            metrics,
        }
    }

    /// The same request path for another worker, through that worker's view of the upstream
    /// (its own connection pool, which the worker's `/readyz` reads too).
    pub(crate) fn for_worker(&self, upstream: Arc<Upstream>) -> Self {
        Dispatcher {
            table: self.table.for_worker(upstream),
            config: self.config.clone(),
            front: self.front.clone(),
            records: self.records.clone(),
            auth: self.auth.clone(),
            replicas: self.replicas.clone(),
            metrics: self.metrics.clone(),
        }
    }

    /// The one front (the authorization facade's token requests are let in there too).
    pub(crate) fn front(&self) -> &Arc<Front> {
        &self.front
    }

    /// One message to the MCP path, from the front to the answer, recorded once after its
    /// body.
    pub(crate) async fn mcp(
        &self,
        req: http::Request<Incoming>,
        peer: SocketAddr,
        abandoned: Abandoned,
    ) -> Response<Body> {
        let mut record = self.records.mcp(&req, peer, abandoned.clone());
        let cors = frontdoor::cors::allowed_origin(&self.config, req.headers());
        let mut resp = self.serve(req, peer, abandoned, &mut record).await;
        if let Some(origin) = cors {
            frontdoor::cors::allow(origin, resp.headers_mut());
        }
        record.end(resp)
    }

    async fn serve(
        &self,
        req: http::Request<Incoming>,
        peer: SocketAddr,
        abandoned: Abandoned,
        record: &mut Record,
    ) -> Response<Body> {
        let (parts, body) = req.into_parts();
        if frontdoor::cors::is_preflight(&parts) {
            return frontdoor::cors::preflight(&self.config, &parts);
        }
        let admitted = match self
            .front
            .admit(Surface::Mcp, parts, body, peer, record)
            .await
        {
            Ok(a) => a,
            Err(refused) => return refused,
        };
        let (parts, bytes) = (&admitted.parts, &admitted.bytes);
        let request = match frontdoor::admit(parts, bytes) {
            Ok(Some(r)) => r,
            Ok(None) => {
                let client = Client::new(&parts.headers, admitted.caller);
                self.table.tell(&client, bytes).await;
                return body::answer(StatusCode::ACCEPTED, None, body::empty());
            }
            Err((e, id)) => {
                tracing::debug!(error = %e, "refused at the front door");
                return e.into_response(id);
            }
        };
        let tool_listed = request.listed == Some(Method::ToolsCall)
            && request.rpc.name().is_some_and(|n| self.table.lists(&n));
        record.admitted(&request, tool_listed);
        let request = match self.scoped(request, admitted.principal.clone(), record) {
            Ok(r) => r,
            Err(refused) => return *refused,
        };
        if let Some((replicas, owner)) = self.held_elsewhere(&request, &admitted) {
            return self
                .forward(replicas, owner, &request, &admitted, record)
                .await;
        }
        self.answer(&request, admitted.caller, abandoned, record)
            .await
    }

    /// Where a retry continuing a call another replica holds goes (the owner its sealed
    /// `requestState` names), unless another replica forwarded it here already.
    fn held_elsewhere(
        &self,
        request: &frontdoor::Request<'_>,
        admitted: &Admitted,
    ) -> Option<(&Replicas, url::Url)> {
        let replicas = self.replicas.as_deref().filter(|_| !admitted.forwarded)?;
        request.listed.filter(|m| m.entry().input_required)?;
        let owner = self
            .table
            .held_elsewhere(request.rpc.params.request_state?)?;
        Some((replicas, owner))
    }

    /// The retry sent to the replica that holds its call, and that replica's answer; no
    /// decoration nor event here (the owner's plan is the call's).
    async fn forward(
        &self,
        replicas: &Replicas,
        owner: url::Url,
        request: &frontdoor::Request<'_>,
        admitted: &Admitted,
        record: &mut Record,
    ) -> Response<Body> {
        let retry = Retry {
            headers: &admitted.parts.headers,
            authorization: admitted.authorization.as_ref(),
            address: admitted.address,
            body: admitted.bytes.clone(),
        };
        let (answered, outcome) = replicas.forward(owner, retry).await;
        self.metrics.held_call_forwarded(outcome);
        if outcome == "owner_gone" {
            self.metrics.held_call_refused(Refusal::OwnerGone.label());
        }
        answered.unwrap_or_else(|e| {
            record.failed(e.code());
            tracing::debug!(error = %e, outcome, "a retry forwarded to the replica that holds its call");
            e.into_response(Some(request.id))
        })
    }

    /// The request with its caller, once its token holds every scope it needs (with auth on);
    /// else the 403, its JSON-RPC code noted for the request's span.
    fn scoped<'a>(
        &self,
        r: frontdoor::Request<'a>,
        principal: Option<Arc<Principal>>,
        record: &mut Record,
    ) -> Result<frontdoor::Request<'a>, Box<Response<Body>>> {
        if let (Some(auth), Some(p)) = (&self.auth, &principal) {
            if let Err(e) = self.table.require_scopes(auth, p, &r) {
                record.failed(e.code());
                return Err(Box::new(e.into_response(Some(r.id))));
            }
        }
        Ok(frontdoor::Request { principal, ..r })
    }

    /// An admitted request's answer from the method table; the sidecar's own error answer
    /// carries the request's id.
    async fn answer(
        &self,
        request: &frontdoor::Request<'_>,
        caller: Caller,
        abandoned: Abandoned,
        record: &mut Record,
    ) -> Response<Body> {
        let client = Client::new(&request.parts.headers, caller);
        // The request's work (the calls to Epode it makes) runs with its span as the context.
        let answered = otel::within(
            record.span(),
            self.table
                .dispatch(request, client, abandoned, record.note(), record.span()),
        )
        .await;
        answered.unwrap_or_else(|e| {
            record.failed(e.code());
            let side = e.side().as_str();
            match e.level() {
                Level::Debug => tracing::debug!(error = %e, side, "request refused"),
                Level::Warn => {
                    tracing::warn!(error = %e, side, retryable = e.retryable(), "request failed")
                }
            }
            e.into_response(Some(request.id))
        })
    }
}
