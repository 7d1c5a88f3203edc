//! The one front: every route's checks in one order, the refusals in the route's words, and
//! the caller decided once (see the module above).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::request::Parts;
use http::{Response, StatusCode};
use hyper::body::Incoming;

use super::record::Record;
use crate::auth::{Authorizer, Principal};
use crate::body::{self, Body};
use crate::budget::{MemoryBudget, Reservation};
use crate::caller::Caller;
use crate::config::Config;
use crate::error::{Error, ErrorKind};
use crate::frontdoor;
use crate::gate::{Gate, Permit};
use crate::limits::{retry_after_secs, RateLimits};
use crate::metrics::{HeadRefusal, LimitKind, Metrics};
use crate::replica::Replicas;

/// A step's refusal, the client's answer (boxed: an answer is large beside a step's `Ok`).
type Refused = Box<Response<Body>>;

/// Which route a request is for: its checks' words and its own limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Surface {
    /// The MCP path: JSON-RPC errors.
    Mcp,
    /// The HTTP surface (the product's other routes): plain messages.
    Http,
}

/// What the front shares with every worker: the settings, the rate limits, the budget, the
/// authorization front door, and each route's requests in flight.
pub(crate) struct Front {
    config: Arc<Config>,
    rates: Arc<RateLimits>,
    budget: Arc<MemoryBudget>,
    metrics: Arc<Metrics>,
    auth: Option<Arc<Authorizer>>,
    /// The other replicas, with `EPODE_SIDECAR_REPLICA_URL` (their forwarded retries).
    replicas: Option<Arc<Replicas>>,
    /// The MCP requests being served (every worker's), and the surface's, apart and bounded
    /// the same (`EPODE_SIDECAR_MAX_IN_FLIGHT`), so neither can fill the other's.
    in_flight: [Gate; 2],
}

/// A request the front let in: its head and body, who its caller is, and its place in flight
/// (given back when this is dropped).
pub(crate) struct Admitted {
    pub(crate) parts: Parts,
    pub(crate) bytes: Bytes,
    /// The body's bytes in the memory budget.
    pub(crate) held: Reservation,
    pub(crate) caller: Caller,
    /// Who its verified token says is calling (with auth on).
    pub(crate) principal: Option<Arc<Principal>>,
    /// The client's address, as the front decided it (the one another replica sealed, for a
    /// retry it forwarded).
    pub(crate) address: IpAddr,
    /// The client's `Authorization` as it sent it, with auth on (the headers going upstream
    /// may not carry it): a retry forwarded to another replica carries it there.
    pub(crate) authorization: Option<HeaderValue>,
    /// Whether another replica forwarded it (it is never forwarded again).
    pub(crate) forwarded: bool,
    pub(crate) _in_flight: Permit,
}

impl Front {
    /// The front; `in_flight` is the MCP path's gate (the operations' gauge reads it), the
    /// surface gets one of the same size.
    pub(crate) fn new(
        config: Arc<Config>,
        (rates, budget): (Arc<RateLimits>, Arc<MemoryBudget>),
        metrics: Arc<Metrics>,
        (auth, replicas): (Option<Arc<Authorizer>>, Option<Arc<Replicas>>),
        in_flight: Gate,
    ) -> Arc<Front> {
        let surface = Gate::new(config.limits.max_in_flight);
        Arc::new(Front {
            config,
            rates,
            budget,
            metrics,
            auth,
            replicas,
            in_flight: [in_flight, surface],
        })
    }

    /// The request's checks, in order: head, rate, in flight, body, token; then its caller.
    /// `Err` is the refusal, in the route's words; `record` learns what it needs of each step
    /// (a refusal made before any work is not spanned; the token's introspection is).
    pub(crate) async fn admit(
        &self,
        surface: Surface,
        mut parts: Parts,
        body: Incoming,
        peer: SocketAddr,
        record: &mut Record,
    ) -> Result<Admitted, Response<Body>> {
        self.head(surface, &parts, record).map_err(|r| *r)?;
        let (address, forwarded) = self.address(peer, &mut parts.headers);
        self.rate(surface, address, record).map_err(|r| *r)?;
        let in_flight = self.in_flight(surface, record).map_err(|r| *r)?;
        let limits = &self.config.limits;
        let read = frontdoor::read_body(
            &parts,
            body,
            self.config.max_body_bytes,
            &self.budget,
            limits.body_timeout,
        )
        .await;
        let (bytes, held) = read.map_err(|e| self.body_refused(surface, e))?;
        let at = Caller::of_address(address, peer);
        let authorization = self
            .auth
            .as_ref()
            .and_then(|_| parts.headers.get(header::AUTHORIZATION).cloned());
        let principal = self.token(surface, &mut parts, &bytes, &at, record).await?;
        // Who the caller is, decided once: every table keyed by caller uses it.
        let caller = Caller::decide(
            principal.as_ref().map(|p| p.caller),
            &parts.headers,
            address,
            peer,
        );
        Ok(Admitted {
            parts,
            bytes,
            held,
            caller,
            principal,
            address,
            authorization,
            forwarded,
            _in_flight: in_flight,
        })
    }

    /// A request the sidecar passes to the authorization server for its client (the
    /// authorization facade's token request): its `Host`, the client's address and its rate
    /// (the MCP path's), then its body, at most `limit` bytes, in the memory budget and
    /// within the body deadline. The refusals are plain messages; `Ok` is the client's
    /// address as a caller, and the body.
    pub(crate) async fn admit_issuer_call(
        &self,
        mut parts: Parts,
        body: Incoming,
        peer: SocketAddr,
        limit: usize,
    ) -> Result<(Parts, crate::caller::CallerKey, Bytes), Response<Body>> {
        frontdoor::check_host(&self.config.allowed_hosts, &parts)
            .map_err(|e| plain(StatusCode::FORBIDDEN, &e.to_string()))?;
        let (address, _) = self.address(peer, &mut parts.headers);
        self.rate_of(Surface::Mcp, address).map_err(|r| *r)?;
        let read = frontdoor::read_body(
            &parts,
            body,
            limit,
            &self.budget,
            self.config.limits.body_timeout,
        )
        .await;
        let (bytes, _held) = read.map_err(|e| self.body_refused(Surface::Http, e))?;
        Ok((parts, Caller::of_address(address, peer).key(), bytes))
    }

    /// The client's address: the one another replica of this deployment sealed, for a retry
    /// it forwarded here; else the connection's (behind a trusted proxy, its
    /// `X-Forwarded-For`'s). The sealed header goes no further either way.
    fn address(&self, peer: SocketAddr, headers: &mut http::HeaderMap) -> (IpAddr, bool) {
        let sealed = headers
            .remove(&crate::replica::FORWARDED)
            .and_then(|v| self.replicas.as_ref()?.forwarded_for(&v));
        match sealed {
            Some(address) => (address, true),
            None => (self.rates.client_address(peer, headers), false),
        }
    }

    /// The MCP path's head: Host, Origin, POST, `Content-Type`; the surface's: Host.
    fn head(&self, surface: Surface, parts: &Parts, record: &mut Record) -> Result<(), Refused> {
        let refused = match surface {
            Surface::Mcp => frontdoor::check_head(&self.config, parts).map_err(|e| {
                let refusal = head_refusal(&e, &parts.method);
                self.metrics.refused(refusal);
                if refusal.expected() {
                    // What well-behaved 2025 clients send: counted, not traced.
                    record.unspanned();
                    tracing::debug!(error = %e, "refused at the front door");
                } else {
                    tracing::warn!(error = %e, "refused at the front door");
                }
                e.into_response(None)
            }),
            Surface::Http => frontdoor::check_host(&self.config.allowed_hosts, parts)
                .map_err(|e| plain(StatusCode::FORBIDDEN, &e.to_string())),
        };
        refused.map_err(Box::new)
    }

    /// The client's rate, counted per route. A client over its rate gets no span: the
    /// refusal costs as little as it can, and a flood never crowds the span queue.
    fn rate(&self, surface: Surface, address: IpAddr, record: &mut Record) -> Result<(), Refused> {
        let refused = self.rate_of(surface, address);
        if refused.is_err() {
            record.unspanned();
        }
        refused
    }

    /// The client's rate, counted per route (the refusal not recorded).
    fn rate_of(&self, surface: Surface, address: IpAddr) -> Result<(), Refused> {
        let checked = match surface {
            Surface::Mcp => self.rates.check_client(address),
            Surface::Http => self.rates.check_surface_client(address),
        };
        let Err(wait) = checked else { return Ok(()) };
        self.metrics.limit(LimitKind::ClientRate);
        let e = Error::new(
            ErrorKind::RateLimited {
                retry_after: retry_after_secs(wait),
            },
            match surface {
                Surface::Mcp => "this client sent more requests than its rate limit allows",
                Surface::Http => "this client sent more requests than its rate limit allows (EPODE_SIDECAR_RATE_LIMIT, counted on the HTTP surface apart from the MCP path)",
            },
        );
        Err(Box::new(render(surface, e, None)))
    }

    /// A place among the route's requests in flight (no span for a refusal, as for the rate).
    fn in_flight(&self, surface: Surface, record: &mut Record) -> Result<Permit, Refused> {
        if let Some(permit) = self.in_flight[surface as usize].try_enter() {
            return Ok(permit);
        }
        record.unspanned();
        self.metrics.limit(LimitKind::InFlight);
        let e = Error::new(
            ErrorKind::Overloaded { retry_after: 1 },
            match surface {
                Surface::Mcp => "it is serving as many requests as it may at once",
                Surface::Http => "the HTTP surface is serving as many requests as it may at once (EPODE_SIDECAR_MAX_IN_FLIGHT)",
            },
        );
        Err(Box::new(render(surface, e, None)))
    }

    /// A body that could not be read within the limits, counted by the limit.
    fn body_refused(&self, surface: Surface, e: Error) -> Response<Body> {
        self.metrics.limit(match e.kind() {
            ErrorKind::BodyTooLarge { .. } => LimitKind::BodySize,
            ErrorKind::RequestTimeout => LimitKind::BodyTimeout,
            ErrorKind::Overloaded { .. } => LimitKind::MemoryBudget,
            _ => LimitKind::BodyRead,
        });
        render(surface, e, None)
    }

    /// The caller's token, with auth on (on the surface, with `auth_http_surface`): the
    /// sidecar's own headers (`Epode-Auth-*`, in every spelling an app server may read as
    /// them) removed from every request and, with a verified token, set from it (whose
    /// `Authorization` goes no further unless configured). An MCP refusal echoes the
    /// message's id when it has one. The introspection a check makes is the record's.
    async fn token(
        &self,
        surface: Surface,
        parts: &mut Parts,
        bytes: &Bytes,
        at: &Caller,
        record: &mut Record,
    ) -> Result<Option<Arc<Principal>>, Response<Body>> {
        let Some(auth) = self.auth.as_ref().filter(|a| match surface {
            Surface::Mcp => true,
            Surface::Http => a.checks_surface(),
        }) else {
            crate::auth::strip_owned(&mut parts.headers);
            return Ok(None);
        };
        let mut asked = None;
        let checked = auth
            .check(&parts.headers, parts.uri.query(), at.key(), &mut asked)
            .await;
        record.asked(asked);
        let refused = match checked {
            Ok(principal) => match surface {
                Surface::Mcp => {
                    auth.to_upstream(&mut parts.headers, &principal);
                    return Ok(Some(principal));
                }
                // The surface has no message to name its scopes: the base ones.
                Surface::Http => match auth.require(&principal, auth.base_scopes()) {
                    Ok(()) => {
                        auth.to_upstream(&mut parts.headers, &principal);
                        return Ok(Some(principal));
                    }
                    Err(e) => e,
                },
            },
            Err(refusal) => auth.refuse(&refusal),
        };
        // A JSON-RPC error on either route: the challenge is what clients read.
        let id = match surface {
            Surface::Mcp => match frontdoor::admit(parts, bytes) {
                Ok(Some(r)) => Some(r.id.to_owned()),
                Ok(None) => None,
                Err((_, id)) => id.map(ToOwned::to_owned),
            },
            Surface::Http => None,
        };
        Err(refused.into_response(id.as_deref()))
    }
}

/// A refusal in the route's words.
fn render(surface: Surface, e: Error, id: Option<&serde_json::value::RawValue>) -> Response<Body> {
    match surface {
        Surface::Mcp => e.into_response(id),
        Surface::Http => plain_refusal(&e),
    }
}

/// Why the front door refused a head (see [`frontdoor::check_head`]).
fn head_refusal(e: &Error, method: &http::Method) -> HeadRefusal {
    match e.kind() {
        ErrorKind::BadHost => HeadRefusal::Host,
        ErrorKind::BadOrigin => HeadRefusal::Origin,
        ErrorKind::MethodNotAllowed if method == http::Method::GET => HeadRefusal::GetStream,
        ErrorKind::MethodNotAllowed if method == http::Method::DELETE => HeadRefusal::SessionDelete,
        ErrorKind::MethodNotAllowed => HeadRefusal::Method,
        // The last of the head checks, and the only other refusal it makes.
        _ => HeadRefusal::ContentType,
    }
}

/// A refusal, or the upstream's failure, as plain text: the HTTP surface is not MCP, so no
/// JSON-RPC error.
pub(crate) fn plain_refusal(e: &Error) -> Response<Body> {
    let message = match e.kind() {
        ErrorKind::BodyTooLarge { limit } => format!(
            "the request body is larger than the sidecar's limit of {limit} bytes (EPODE_SIDECAR_MAX_BODY_BYTES)"
        ),
        ErrorKind::UpstreamUnreachable => format!("the upstream is unreachable: {}", e.cause()),
        ErrorKind::UpstreamTimeout(d) => format!(
            "the upstream did not answer within {}",
            humantime::format_duration(*d)
        ),
        ErrorKind::UpstreamFailed => format!("the upstream failed: {}", e.cause()),
        _ => e.to_string(),
    };
    let status = match e.kind() {
        ErrorKind::UpstreamUnreachable | ErrorKind::UpstreamFailed => StatusCode::BAD_GATEWAY,
        _ => e.status(),
    };
    let mut resp = plain(status, &message);
    if let Some(after) = e.retry_after() {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(after));
    }
    resp
}

/// A plain-text answer of the sidecar's own on the HTTP surface, never cached.
pub(crate) fn plain(status: StatusCode, message: &str) -> Response<Body> {
    let mut resp = body::answer(
        status,
        Some("text/plain; charset=utf-8"),
        body::full(format!("epode-sidecar: {message}\n")),
    );
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}
