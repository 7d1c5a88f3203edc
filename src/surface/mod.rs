//! The HTTP surface: every request that is not for the MCP path (with
//! `EPODE_SIDECAR_HTTP_SURFACE=on`), proxied to the upstream's origin with its own method, path,
//! query, headers and body, through the same connection pool, limits and TLS as the MCP hop;
//! and its response instrumented as Epode's HTTP protocol says. The order, top to bottom: the
//! one front every route passes (`crate::request`: the `Host` check; the per-client rate
//! limit, counted apart from the MCP path's, and the surface's own requests in flight, 429 or
//! 503 with `Retry-After`; the request body, read whole within `EPODE_SIDECAR_MAX_BODY_BYTES`
//! and the memory budget, 413 past it; with `EPODE_SIDECAR_AUTH_HTTP_SURFACE`, the token);
//! the upstream's answer, its `Epode-Identity` header always
//! taken off; the decision on its head (`rules::on_head`); a candidate body held up to
//! `EPODE_SIDECAR_HTTP_MAX_BODY` (past it, or past the upstream timeout, what was read and the
//! rest stream through untouched); the decision on the body; the envelope (the binding's:
//! mode, consent, capability) placed where the body's kind says (`place`); the telemetry event
//! (`operation`: the operator's route templates, else every segment that is no route word
//! as `:id`). The upstream connections it uses are its own share of the cap (the pool's
//! `Share::Surface`), so it cannot starve the MCP path. Every response not instrumented is the upstream's, untouched but for its
//! hop-by-hop headers and `Epode-Identity`; every reason is counted.

mod discovery;
mod operation;
mod place;
mod rules;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderName};
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::Value;

use self::operation::OperationNames;
use self::place::JsonBody;
use self::rules::{CacheMode, Candidate, Paths, Skip};
use crate::binding::{FeedbackBinding, HttpEnvelope};
use crate::body::{self, Body, BoxError};
use crate::budget::{self, MemoryBudget, Reservation};
use crate::caller::CallerKey;
use crate::config::{Config, HttpCacheMode, HttpSurface};
use crate::epode::telemetry::{HttpCompletion, RequestObservation, Surface as Placed};
use crate::feedback::identity::{sanitize_ref, IdentityRefs, RefKind};
use crate::log_summary::LogSummary;
use crate::metrics::Metrics;
use crate::request::{plain, plain_refusal, Front, HttpOutcome, Recorder, Surface};
use crate::upstream::http::{strip_hop_by_hop, HttpUpstream};
use crate::upstream::Upstream;

/// The response header the app names the caller with; never reaches a client.
pub(crate) const IDENTITY_HEADER: HeaderName = HeaderName::from_static("epode-identity");

/// Headers a shared cache reads besides `Cache-Control`: removed from an instrumented response.
const CDN_CACHE: [&str; 3] = [
    "cdn-cache-control",
    "cloudflare-cdn-cache-control",
    "surrogate-control",
];

/// Validators of a body that is no longer the upstream's.
const VALIDATORS: [&str; 6] = [
    "etag",
    "content-md5",
    "digest",
    "content-digest",
    "repr-digest",
    "accept-ranges",
];

/// Who a surface request's client is, for its event: the verified caller its handle is bound
/// to (with auth on the surface), and what the request said of it (with
/// `EPODE_SIDECAR_REQUEST_OBSERVATION`).
#[derive(Clone, Copy)]
struct Requester<'a> {
    bound: Option<CallerKey>,
    observed: Option<&'a RequestObservation>,
}

/// The HTTP surface, shared by every worker (each passes its own view of the upstream).
pub(crate) struct HttpSurfaceRoute {
    config: Arc<Config>,
    paths: Paths,
    operations: OperationNames,
    cache: CacheMode,
    max_body: u64,
    /// Whether events carry the request's observation.
    observe: bool,
    /// The one front (the surface's rate, in-flight requests, body and token) and where the
    /// records are written.
    front: Arc<Front>,
    records: Arc<Recorder>,
    binding: Arc<FeedbackBinding>,
    metrics: Arc<Metrics>,
    budget: Arc<MemoryBudget>,
    /// Invalid `Epode-Identity` headers, logged as a counted summary.
    invalid_identity: LogSummary,
}

impl HttpSurfaceRoute {
    /// The surface when the configuration turns it on; `Err` names the bad exclusion glob.
    pub(crate) fn new(
        config: Arc<Config>,
        binding: Arc<FeedbackBinding>,
        metrics: Arc<Metrics>,
        budget: Arc<MemoryBudget>,
        (front, records): (Arc<Front>, Arc<Recorder>),
    ) -> Result<Option<Arc<Self>>, String> {
        let Some(settings) = config.http.clone() else {
            return Ok(None);
        };
        let HttpSurface {
            max_body,
            cache_mode,
            exclude,
            routes,
            request_observation,
            ..
        } = settings;
        let paths = Paths::new(&exclude).map_err(|e| format!("EPODE_SIDECAR_HTTP_EXCLUDE: {e}"))?;
        let surfaces = Placed::ALL.map(Placed::as_str);
        let reasons = Skip::ALL.map(Skip::label);
        metrics.preregister_http(&surfaces, &reasons);
        Ok(Some(Arc::new(HttpSurfaceRoute {
            config,
            paths,
            operations: OperationNames::new(&routes),
            cache: match cache_mode {
                HttpCacheMode::Safe => CacheMode::Safe,
                HttpCacheMode::Private => CacheMode::Private,
                HttpCacheMode::Request => CacheMode::Request,
            },
            max_body,
            observe: request_observation,
            front,
            records,
            binding,
            metrics,
            budget,
            invalid_identity: LogSummary::new(
                "Epode-Identity response headers that are not a compact JSON object of valid refs (accountRef, userRef, anonymousRef, customerRef, sessionRef: 1-160 of A-Z a-z 0-9 _ . : -); removed, and the responses instrumented without identity",
                Duration::from_secs(60),
            ),
        })))
    }

    /// One request to the HTTP surface from `peer`, proxied through `upstream` (the worker's
    /// own view) and instrumented, recorded once after its body. The skip rules and the
    /// operation read the path's canonical form (`respelled`, when it is not the path as
    /// sent), so `/%69nternal/x` is excluded as `/internal/x` is; the app gets the path as
    /// sent.
    pub(crate) async fn serve(
        &self,
        upstream: &Upstream,
        req: Request<Incoming>,
        peer: SocketAddr,
        respelled: Option<String>,
    ) -> Response<Body> {
        let started = Instant::now();
        let (parts, body) = req.into_parts();
        let path = respelled.as_deref().unwrap_or(parts.uri.path());
        let mut record = self.records.http(&parts, path, peer);
        let admitted = match self
            .front
            .admit(Surface::Http, parts, body, peer, &mut record)
            .await
        {
            Ok(a) => a,
            Err(refused) => return record.end(refused),
        };
        let mut parts = admitted.parts;
        if let Some(span) = record.http_span() {
            span.inject(&mut parts.headers);
        }
        let path = respelled.as_deref().unwrap_or(parts.uri.path());
        let body = (admitted.bytes, admitted.held);
        // With auth on the surface, the handle is issued to the verified caller.
        let bound = admitted.principal.as_ref().map(|p| p.caller);
        let observed = self
            .observe
            .then(|| RequestObservation::of(&parts.method, admitted.address, &parts.headers));
        let requester = Requester {
            bound,
            observed: observed.as_ref(),
        };
        let (resp, outcome) = self
            .proxy(upstream, (&parts, path, requester), body, started)
            .await;
        record.outcome(outcome);
        record.end(resp)
    }

    async fn proxy(
        &self,
        upstream: &Upstream,
        (parts, path, requester): (&Parts, &str, Requester<'_>),
        body: (Bytes, Reservation),
        started: Instant,
    ) -> (Response<Body>, HttpOutcome) {
        let Some(hop) = upstream.http() else {
            // The configuration refuses the surface with a stdio upstream.
            return (
                plain(
                    StatusCode::BAD_GATEWAY,
                    "the HTTP surface needs an HTTP upstream",
                ),
                HttpOutcome::Refused,
            );
        };
        let sent = match self.send(hop, parts, body).await {
            Ok(resp) => resp,
            Err(resp) => return (resp, HttpOutcome::Refused),
        };
        let (mut head, upstream_body) = sent.into_parts();
        let identity = take_identity(&mut head.headers);
        if let Some(skip) = self.on_request(parts, path, &mut head) {
            return (
                passed(head, upstream_body),
                HttpOutcome::Skipped(skip.label()),
            );
        }
        let kind = match self.candidate(path, &parts.method, &mut head) {
            Ok(kind) => kind,
            Err(skip) => {
                return (
                    passed(head, upstream_body),
                    HttpOutcome::Skipped(skip.label()),
                )
            }
        };
        let max = usize::try_from(self.max_body).unwrap_or(usize::MAX);
        let (bytes, held) = match hold(
            upstream_body,
            max,
            &self.budget,
            self.config.upstream_timeout,
        )
        .await
        {
            Held::Whole(bytes, held) => (bytes, held),
            Held::Partial {
                read,
                rest,
                why,
                held,
            } => {
                let body = Prefixed {
                    read,
                    rest,
                    held: Some(held),
                }
                .boxed_unsync();
                return (
                    Response::from_parts(head, body),
                    HttpOutcome::Skipped(why.label()),
                );
            }
            Held::Failed(e) => {
                tracing::warn!(error = %e, "the upstream's response body broke off");
                return (
                    plain(
                        StatusCode::BAD_GATEWAY,
                        "the upstream's response broke off before its end",
                    ),
                    HttpOutcome::Refused,
                );
            }
        };
        self.instrument(
            (parts, path, requester),
            head,
            (bytes, held),
            kind,
            identity,
            started,
        )
    }

    /// Feedback off: `ModeOff`. In request cache mode, on a path the surface instruments: the answer varies on
    /// `Agent-Feedback-Request`, and one its request did not ask for is passed with the
    /// discovery link when it could have been instrumented (`Skip::NotRequested`).
    fn on_request(
        &self,
        parts: &Parts,
        path: &str,
        head: &mut http::response::Parts,
    ) -> Option<Skip> {
        if !self.binding.enabled() {
            return Some(Skip::ModeOff);
        }
        if !self.binding.binds() {
            // The app carries Epode itself (`EPODE_SIDECAR_UPSTREAM_EPODE=auto`): its answers
            // are its own, enveloped or not.
            return Some(Skip::AlreadyInstrumented);
        }
        if self.cache != CacheMode::Request || self.paths.excluded(path) {
            return None;
        }
        discovery::vary(&mut head.headers);
        if discovery::requested(&parts.headers) {
            return None;
        }
        let target = parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path(), |p| p.as_str());
        discovery::advertise(&parts.method, target, head.status, &mut head.headers);
        Some(Skip::NotRequested)
    }

    /// Whether the answer's head makes it a candidate, and its kind; a HEAD answer's fields are
    /// made as GET's would be.
    fn candidate(
        &self,
        path: &str,
        method: &Method,
        head: &mut http::response::Parts,
    ) -> Result<Candidate, Skip> {
        let candidate = self.on_head(method, path, head);
        if candidate == Err(Skip::Head) {
            self.as_get_would_be(path, head);
        }
        candidate
    }

    /// The decision on the answer's head for a request of `method` (`rules::on_head` with the
    /// surface's settings).
    fn on_head(
        &self,
        method: &Method,
        path: &str,
        head: &http::response::Parts,
    ) -> Result<Candidate, Skip> {
        rules::on_head(
            method,
            path,
            &self.paths,
            head.status,
            &head.headers,
            self.cache,
            self.max_body,
        )
    }

    /// A HEAD answer gets the header fields a GET of the same route would (RFC 9110 §9.3.2):
    /// where GET's answer is instrumented, private and without the validators, and without
    /// the app's `Content-Length`, which the envelope would change (a HEAD may leave out a
    /// field known only once the content is made). No handle is minted: HEAD is no interaction.
    fn as_get_would_be(&self, path: &str, head: &mut http::response::Parts) {
        if self.on_head(&Method::GET, path, head).is_ok() {
            made_private(&mut head.headers);
            for name in VALIDATORS {
                head.headers.remove(name);
            }
            head.headers.remove(header::CONTENT_LENGTH);
        }
    }

    /// A held candidate body, instrumented unless its content says otherwise.
    fn instrument(
        &self,
        (parts, path, requester): (&Parts, &str, Requester<'_>),
        mut head: http::response::Parts,
        (bytes, held): (Bytes, Reservation),
        kind: Candidate,
        identity: AppIdentity,
        started: Instant,
    ) -> (Response<Body>, HttpOutcome) {
        let Some(operation) = self.operations.of(path) else {
            return untouched(head, bytes, held, Skip::InvalidOperation);
        };
        let own = head.headers.contains_key("agent-feedback");
        let surface = match surface_of(kind, &bytes) {
            Ok(_) if own => Err(Skip::AlreadyInstrumented),
            placed => placed,
        };
        let surface = match surface {
            Ok(surface) => surface,
            Err(why) => {
                if why == Skip::AlreadyInstrumented {
                    self.binding.heard_http_envelope();
                }
                return untouched(head, bytes, held, why);
            }
        };
        let (app_refs, hint) = self.app_refs(identity);
        let refs = self.binding.http_refs(app_refs, &parts.headers);
        let Some(envelope) = self.binding.http_envelope(&refs, requester.bound) else {
            return untouched(head, bytes, held, Skip::ModeOff);
        };
        let (surface, body) = self.place(&mut head.headers, surface, (bytes, held), &envelope);
        let completion = HttpCompletion {
            interaction_id: envelope.interaction_id.clone(),
            surface,
            operation,
            status: head.status.as_u16(),
            duration: started.elapsed(),
            refs,
            runtime_hint: hint,
            observation: requester.observed.cloned(),
        };
        self.binding.http_answered(&envelope, &completion);
        let served = HttpOutcome::Instrumented {
            surface: surface.as_str(),
            state: envelope.state,
            interaction_id: envelope.interaction_id,
        };
        (Response::from_parts(head, body), served)
    }

    /// The app's references and runtime hint; an invalid header is counted and gives none.
    fn app_refs(&self, identity: AppIdentity) -> (IdentityRefs, Option<String>) {
        match identity {
            AppIdentity::Valid(refs, hint) => (refs, hint),
            AppIdentity::Absent => Default::default(),
            AppIdentity::Invalid => {
                self.metrics.http_identity_invalid.inc();
                self.invalid_identity.add("invalid", 1);
                Default::default()
            }
        }
    }

    /// Places the envelope as `surface` says (a JSON object that cannot take the splice falls
    /// back to the header) and makes the response private; returns the surface used and the
    /// body.
    fn place(
        &self,
        headers: &mut HeaderMap,
        surface: Placed,
        (bytes, held): (Bytes, Reservation),
        envelope: &HttpEnvelope,
    ) -> (Placed, Body) {
        let (surface, placed) = match surface {
            Placed::Json => match place::splice_json(&bytes, &envelope.json) {
                Some(b) => (Placed::Json, Some(b)),
                None => (Placed::Headers, None),
            },
            Placed::Html => (
                Placed::Html,
                Some(place::inject_html(&bytes, &envelope.json)),
            ),
            Placed::Headers => (Placed::Headers, None),
        };
        made_private(headers);
        let body = match placed {
            Some(changed) => {
                for name in VALIDATORS {
                    headers.remove(name);
                }
                headers.insert(header::CONTENT_LENGTH, HeaderValue::from(changed.len()));
                drop(held);
                body::full(budget::counted(&self.budget, Bytes::from(changed)))
            }
            None => {
                self.header_placement(headers, envelope);
                headers.insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
                body::held(bytes, held)
            }
        };
        (surface, body)
    }

    /// `Agent-Feedback` (the envelope, base64url) and the `Link` to Epode's discovery document.
    fn header_placement(&self, headers: &mut HeaderMap, envelope: &HttpEnvelope) {
        let value = place::header_value(&envelope.json);
        let link = place::discovery_link(self.binding.endpoint());
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert(HeaderName::from_static("agent-feedback"), v);
        }
        if let Ok(v) = HeaderValue::from_str(&link) {
            headers.append(header::LINK, v);
        }
    }

    /// The client's request (its body read whole by the front), sent to the upstream's origin
    /// with its own path and query; `Err` is the sidecar's own plain-text answer.
    async fn send(
        &self,
        hop: &HttpUpstream,
        parts: &Parts,
        (bytes, held): (Bytes, Reservation),
    ) -> Result<Response<crate::upstream::http::PooledBody>, Response<Body>> {
        let mut req = Request::new(Full::new(budget::keep(bytes, held)));
        *req.method_mut() = parts.method.clone();
        *req.uri_mut() = parts
            .uri
            .path_and_query()
            .and_then(|pq| pq.as_str().parse().ok())
            .unwrap_or_else(|| http::Uri::from_static("/"));
        let headers = req.headers_mut();
        *headers = parts.headers.clone();
        strip_hop_by_hop(headers);
        headers.remove(header::CONTENT_LENGTH);
        // Identity comes from the app's response only, never from the client.
        headers.remove(IDENTITY_HEADER);
        headers.insert(header::HOST, hop.host().clone());
        hop.send_surface(req).await.map_err(|e| plain_refusal(&e))
    }
}

/// The upstream's response as it came (less its hop-by-hop headers and `Epode-Identity`).
fn passed(head: http::response::Parts, body: crate::upstream::http::PooledBody) -> Response<Body> {
    Response::from_parts(head, body.map_err(BoxError::from).boxed_unsync())
}

/// Where a held candidate's envelope goes, by its content, or why it gets none: a JSON object
/// takes `_agentFeedback`, other valid JSON the header, a page without the marker the script.
fn surface_of(kind: Candidate, bytes: &[u8]) -> Result<Placed, Skip> {
    match kind {
        Candidate::Json => match place::json_body(bytes) {
            JsonBody::Object => Ok(Placed::Json),
            JsonBody::OwnsFeedback => Err(Skip::AlreadyInstrumented),
            JsonBody::Other if is_json(bytes) => Ok(Placed::Headers),
            JsonBody::Other => Err(Skip::ContentType),
        },
        Candidate::Html if place::has_html_marker(bytes) => Err(Skip::AlreadyInstrumented),
        Candidate::Html => Ok(Placed::Html),
    }
}

/// A held body passed on as it came, with why it was not instrumented.
fn untouched(
    head: http::response::Parts,
    bytes: Bytes,
    held: Reservation,
    why: Skip,
) -> (Response<Body>, HttpOutcome) {
    let resp = Response::from_parts(head, body::held(bytes, held));
    (resp, HttpOutcome::Skipped(why.label()))
}

/// Every instrumented response is private: a shared cache must not hand one caller's envelope
/// (its handle) to another.
fn made_private(headers: &mut HeaderMap) {
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, no-store"),
    );
    for name in CDN_CACHE {
        headers.remove(name);
    }
}

fn is_json(bytes: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_ok()
}

/// What the app said of the caller.
#[derive(Debug, PartialEq, Eq)]
enum AppIdentity {
    Absent,
    /// The references, and a runtime hint.
    Valid(IdentityRefs, Option<String>),
    /// Not one compact JSON object of valid references: none of it is used.
    Invalid,
}

/// Removes every `Epode-Identity` header (it must never reach the client) and reads it: one
/// JSON object whose reference fields (`accountRef`, `userRef`, `anonymousRef`, `customerRef`,
/// `sessionRef`) are each a valid reference, as `_meta["ai.epode/identity"]` on the MCP path.
/// Other fields are ignored, but for a string `runtimeHint`.
fn take_identity(headers: &mut HeaderMap) -> AppIdentity {
    let values: Vec<HeaderValue> = match headers.entry(IDENTITY_HEADER) {
        header::Entry::Occupied(e) => e.remove_entry_mult().1.collect(),
        header::Entry::Vacant(_) => return AppIdentity::Absent,
    };
    let [value] = values.as_slice() else {
        return AppIdentity::Invalid;
    };
    let Some(object) = value
        .to_str()
        .ok()
        .and_then(|v| serde_json::from_str::<Value>(v).ok())
        .and_then(|v| match v {
            Value::Object(o) => Some(o),
            _ => None,
        })
    else {
        return AppIdentity::Invalid;
    };
    let mut refs = IdentityRefs::default();
    for kind in RefKind::ALL {
        match object.get(kind.key()) {
            None => {}
            Some(Value::String(s)) if sanitize_ref(s).is_some() => {
                refs.set(kind, s);
            }
            Some(_) => return AppIdentity::Invalid,
        }
    }
    let hint = object
        .get("runtimeHint")
        .and_then(Value::as_str)
        .map(str::to_owned);
    AppIdentity::Valid(refs, hint)
}

/// A candidate body, held or not.
enum Held<B> {
    /// Read to its end within the bounds.
    Whole(Bytes, Reservation),
    /// Past the bound (`TooLarge`) or the deadline (`Stream`): what was read, and the rest.
    Partial {
        read: VecDeque<Bytes>,
        rest: B,
        why: Skip,
        held: Reservation,
    },
    Failed(String),
}

/// Reads a candidate body to its end, at most `max` bytes, each counted in the budget, within
/// `within`. A body past either bound (the budget too: it counts as too large) is not lost:
/// what was read comes back with the rest.
async fn hold<B>(mut body: B, max: usize, budget: &Arc<MemoryBudget>, within: Duration) -> Held<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let deadline = tokio::time::Instant::now() + within;
    let mut held = budget.start();
    let mut read = VecDeque::new();
    let mut len = 0_usize;
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => {
                return Held::Partial {
                    read,
                    rest: body,
                    why: Skip::Stream,
                    held,
                }
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => return Held::Failed(e.to_string()),
            Ok(Some(Ok(frame))) => frame,
        };
        // Trailers of a held body are dropped (`Trailer` is hop-by-hop here anyway).
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let past = len + data.len() > max || !held.grow(data.len());
        len += data.len();
        read.push_back(data);
        if past {
            return Held::Partial {
                read,
                rest: body,
                why: Skip::TooLarge,
                held,
            };
        }
    }
    let bytes = match read.len() {
        0 => Bytes::new(),
        1 => read.pop_front().unwrap_or_default(),
        _ => {
            let mut buf = BytesMut::with_capacity(len);
            for chunk in read {
                buf.extend_from_slice(&chunk);
            }
            buf.freeze()
        }
    };
    Held::Whole(bytes, held)
}

/// What was read of a body, then the rest of it, untouched.
struct Prefixed<B> {
    read: VecDeque<Bytes>,
    rest: B,
    /// The read part's bytes in the budget, given back once it is sent.
    held: Option<Reservation>,
}

impl<B> http_body::Body for Prefixed<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(chunk) = self.read.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        self.held = None;
        Pin::new(&mut self.rest).poll_frame(cx).map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_empty() && self.rest.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(values: &[&str]) -> (AppIdentity, HeaderMap) {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(IDENTITY_HEADER, HeaderValue::from_str(v).unwrap());
        }
        h.insert("x-other", HeaderValue::from_static("1"));
        let got = take_identity(&mut h);
        (got, h)
    }

    #[test]
    fn the_identity_header_is_always_removed_and_read_as_the_meta_object() {
        let (got, left) = identity(&[
            r#"{"accountRef":"acct_1","userRef":"user.acct_1","anonymousRef":"anon.acct_1","customerRef":"acct_1","runtimeHint":"x","other":7}"#,
        ]);
        assert!(!left.contains_key(IDENTITY_HEADER));
        assert!(left.contains_key("x-other"));
        let AppIdentity::Valid(refs, hint) = got else {
            panic!("{got:?}")
        };
        assert_eq!(refs.account_ref.as_deref(), Some("acct_1"));
        assert_eq!(refs.user_ref.as_deref(), Some("user.acct_1"));
        assert_eq!(refs.anonymous_ref.as_deref(), Some("anon.acct_1"));
        assert_eq!(refs.customer_ref.as_deref(), Some("acct_1"));
        assert_eq!(hint.as_deref(), Some("x"));
        assert_eq!(identity(&[]).0, AppIdentity::Absent);
        assert_eq!(
            identity(&[r#" {"userRef" : " u1 "} "#]).0,
            AppIdentity::Valid(
                IdentityRefs {
                    user_ref: Some("u1".into()),
                    ..IdentityRefs::default()
                },
                None
            ),
            "trimmed as on the MCP path"
        );
    }

    #[test]
    fn an_invalid_identity_header_is_removed_and_none_of_it_used() {
        for bad in [
            "not json",
            "[1]",
            r#""acct""#,
            r#"{"accountRef":"has space"}"#,
            r#"{"accountRef":7}"#,
            r#"{"accountRef":"a@b"}"#,
            r#"{"userRef":"ok","customerRef":""}"#,
        ] {
            let (got, left) = identity(&[bad]);
            assert_eq!(got, AppIdentity::Invalid, "{bad}");
            assert!(!left.contains_key(IDENTITY_HEADER), "{bad}");
        }
        let (got, left) = identity(&[r#"{"accountRef":"a"}"#, r#"{"accountRef":"b"}"#]);
        assert_eq!(got, AppIdentity::Invalid, "two headers");
        assert!(!left.contains_key(IDENTITY_HEADER));
    }

    #[tokio::test]
    async fn a_body_past_the_bound_comes_back_whole_with_what_was_read() {
        use http_body_util::StreamBody;
        let budget = MemoryBudget::new(1 << 20);
        let chunks: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = (0..4)
            .map(|i| Ok(Frame::data(Bytes::from(vec![b'a' + i; 10]))))
            .collect();
        let body = StreamBody::new(futures_util::stream::iter(chunks));
        let Held::Partial {
            read,
            rest,
            why,
            held,
        } = hold(body, 25, &budget, Duration::from_secs(5)).await
        else {
            panic!("not partial")
        };
        assert_eq!(why, Skip::TooLarge);
        let all = Prefixed {
            read,
            rest,
            held: Some(held),
        }
        .collect()
        .await
        .unwrap()
        .to_bytes();
        assert_eq!(all.len(), 40);
        assert_eq!(&all[..11], b"aaaaaaaaaab");
        assert_eq!(budget.used(), 0);

        let whole = Full::new(Bytes::from_static(b"{\"a\":1}"));
        let Held::Whole(bytes, held) = hold(whole, 25, &budget, Duration::from_secs(5)).await
        else {
            panic!("not whole")
        };
        assert_eq!(&bytes[..], b"{\"a\":1}");
        assert_eq!(budget.used(), 7);
        drop(held);
    }
}
