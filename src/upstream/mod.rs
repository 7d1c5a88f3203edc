//! The one place that knows how to reach the upstream MCP server and in which era. `http` is
//! the raw hop (over `pool`, each worker's keep-alive connections; `stdio` for a child
//! process; `hop` chooses between them) and `link` the exchange over it; `era` is the
//! resolver that decides the upstream's era and gives a request its one retry when the
//! upstream changed era; `session` keeps a 2025-era upstream's sessions; `translate` moves
//! requests between the eras; `answer` reads what comes back and finishes it for the client.
//! `Upstream` puts them together for one worker.

mod answer;
mod asks;
mod bridge;
mod caller;
mod context;
mod dns;
pub(crate) mod era;
mod held;
mod hop;
pub(crate) mod http;
mod identity;
mod link;
mod listen;
mod mirror;
mod pool;
mod ready;
mod relay;
mod session;
mod stdio;
pub(crate) use self::stdio::exec;
pub(crate) mod translate;

use std::sync::Arc;

use ::http::{Response, StatusCode};
use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use self::answer::{read_answer, AnswerBounds};
use self::caller::ServerRequests;
pub(crate) use self::caller::{Caller, Client};
pub(crate) use self::context::RequestContext;
pub(crate) use self::era::Discovery;
use self::era::EraResolver;
pub(crate) use self::held::{unix_now, Refusal};
use self::hop::Hop;
pub(crate) use self::hop::UpstreamBody;
use self::http::{HttpBounds, HttpUpstream};
use self::identity::{ServerIdentity, Shown};
use self::link::Link;
pub(crate) use self::link::{OwnSpan, OwnSpans};
pub(crate) use self::mirror::AsksAgain;
use self::pool::IdleBound;
pub(crate) use self::ready::NotReady;
use self::session::Sessions;
use self::stdio::{StdioBounds, StdioUpstream};
use self::translate::set_modern_headers;
use crate::body::Body;
use crate::budget::MemoryBudget;
use crate::config::{Config, UpstreamTransport};
use crate::error::{Error, ErrorKind};
use crate::ledger::Ledger;
use crate::mcp::era::Era;
use crate::mcp::method::{Called, Method};
use crate::metrics::{LimitKind, MethodLabels, Metrics};

/// The longest shutdown waits for the upstream to close the 2025-era sessions.
const SESSION_CLOSE_AT_SHUTDOWN: std::time::Duration = std::time::Duration::from_secs(5);

/// Pages of `tools/list` the sidecar reads when it lists the tools itself.
const MAX_LIST_PAGES: usize = 20;

/// A request sent upstream: the response head, and what the sidecar learned on the way.
struct Sent {
    response: Response<UpstreamBody>,
    era: Era,
    /// The upstream's identity from a 2025-era handshake (2026 results carry their own).
    server_info: Option<Value>,
    /// The 2025-era session it went in.
    session: Option<Arc<session::LegacySession>>,
}

/// What every worker must agree on about the upstream: its era and its 2025 sessions.
struct Known {
    resolver: EraResolver,
    sessions: Sessions,
    /// Calls held while a 2026 client answers their questions (`bridge.rs`).
    held: Arc<held::HeldCalls>,
    /// Questions asked of 2025 clients under the sidecar's ids: a 2026 upstream's
    /// (`mirror.rs`) and a 2025 HTTP upstream's (`relay.rs`).
    asks: Arc<asks::Asks>,
    /// How long a question waits for its client.
    wait: std::time::Duration,
    /// The listen streams served for a 2025-era upstream, and their feeds (`listen.rs`).
    listeners: Arc<listen::Listeners>,
    /// What every caller holds past its request's head (`crate::ledger`).
    ledger: Arc<Ledger>,
}

/// One worker's view of the upstream: its own link (its own connection pool, or the shared
/// child process), shared knowledge.
pub(crate) struct Upstream {
    link: Link,
    known: Arc<Known>,
    metrics: Arc<Metrics>,
}

/// Who sends a request upstream: a client of an era, or the sidecar itself (learning the
/// upstream's tools). The sidecar writes its own requests in 2025 form and takes none of the
/// server's own requests (elicitation, sampling, roots): it has nobody to ask.
#[derive(Clone, Copy)]
enum Asker {
    Client(Era),
    Sidecar,
}

impl Asker {
    /// The era the request's body is written in.
    fn writes(self) -> Era {
        match self {
            Asker::Client(era) => era,
            Asker::Sidecar => Era::Legacy,
        }
    }
}

impl Upstream {
    pub(crate) fn new(
        config: &Config,
        budget: Arc<MemoryBudget>,
        metrics: Arc<Metrics>,
        ledger: Arc<Ledger>,
    ) -> Result<Self, Error> {
        let tls = crate::tls::client_config(&config.upstream_tls).map_err(|e| {
            Error::new(
                ErrorKind::Internal,
                format!("the upstream TLS configuration: {e}"),
            )
        })?;
        let on_limit: Arc<dyn Fn(LimitKind) + Send + Sync> = {
            let metrics = metrics.clone();
            Arc::new(move |kind| metrics.limit(kind))
        };
        let hop = match &config.upstream {
            UpstreamTransport::Http(target) => Hop::Http(HttpUpstream::new(
                target.clone(),
                Arc::new(tls),
                HttpBounds {
                    timeout: config.upstream_timeout,
                    idle: IdleBound {
                        max: config.limits.upstream_max_idle,
                        timeout: config.limits.upstream_idle_timeout,
                    },
                    max_connections: config.limits.upstream_max_connections,
                    surface_connections: config
                        .http
                        .as_ref()
                        .map(|h| h.upstream_connections(config.limits.upstream_max_connections)),
                    wait: config.limits.upstream_wait,
                    on_limit: on_limit.clone(),
                    gauge: metrics.upstream_connections.clone(),
                },
            )),
            UpstreamTransport::Stdio(command) => Hop::Stdio(StdioUpstream::start(
                command,
                StdioBounds {
                    timeout: config.upstream_timeout,
                    budget: budget.clone(),
                    max_line: config.limits.max_upstream_answer,
                    on_limit: on_limit.clone(),
                    wait: config.limits.upstream_wait,
                    modern: config.upstream_protocol == crate::config::UpstreamProtocol::Modern,
                },
                ledger.clone(),
            )?),
        };
        let bounds = AnswerBounds {
            budget,
            max_answer: config.limits.max_upstream_answer,
            max_event: config.limits.max_sse_event,
            timeout: config.upstream_timeout,
            on_limit,
        };
        Ok(Upstream {
            link: Link::new(hop, bounds, ServerIdentity::new(config)),
            known: Arc::new(Known {
                resolver: EraResolver::new(config.upstream_protocol),
                sessions: Sessions::new(ledger.clone(), config.limits.upstream_session_idle),
                held: held::HeldCalls::new(
                    config.limits.held_call_wait,
                    config.feedback.key.as_ref().map(|k| k.expose_secret()),
                    config.replica_url.as_ref(),
                    &metrics.held,
                ),
                asks: Arc::new(asks::Asks::new(ledger.clone())),
                wait: config.limits.held_call_wait,
                listeners: Arc::new(listen::Listeners::new(
                    ledger.clone(),
                    metrics.clone(),
                    config.limits.session_stream_questions,
                )),
                ledger,
            }),
            metrics,
        })
    }

    /// The same upstream for another worker: its own pool, the same knowledge.
    pub(crate) fn for_worker(&self) -> Self {
        Upstream {
            link: self.link.for_worker(),
            known: self.known.clone(),
            metrics: self.metrics.clone(),
        }
    }

    /// Makes the sidecar's own upstream requests spans of their own (OpenTelemetry's).
    pub(crate) fn trace_own_requests(&self, spans: Arc<dyn OwnSpans>) {
        self.link.trace_own_requests(spans);
    }

    /// `f` hears the upstream's capabilities whenever a discovery or a handshake says them.
    pub(crate) fn on_capabilities(&self, f: Arc<dyn Fn(&Value) + Send + Sync>) {
        self.link.on_capabilities(f);
    }

    /// Closes upstream the sessions unused for the idle time (call now and then).
    pub(crate) fn sweep_sessions(&self) {
        self.known.sessions.sweep(&self.link);
        self.metrics
            .upstream_sessions
            .set(self.known.sessions.len() as i64);
    }

    /// The server identity clients see (see [`ServerIdentity::shown`]).
    pub(crate) fn server_info(&self, upstream: Option<Value>) -> Shown {
        self.link.identity().shown(upstream)
    }

    /// The identity a 2025 client's `initialize` result carries.
    pub(crate) fn server_info_for_initialize(&self, upstream: Option<Value>) -> Value {
        self.link.identity().for_initialize(upstream)
    }

    /// Forgets what the sidecar knew of the upstream (it became unreachable, or changed era:
    /// it may come back as another build).
    pub(crate) fn forget(&self) {
        self.known.resolver.forget();
        self.known.sessions.clear(&self.link);
    }

    /// An unreachable upstream is forgotten (it may come back as another build).
    fn noted<T>(&self, r: Result<T, Error>) -> Result<T, Error> {
        if let Err(e) = &r {
            if matches!(e.kind(), ErrorKind::UpstreamUnreachable) {
                self.forget();
            }
        }
        r
    }

    /// The HTTP hop, when the upstream is reached over HTTP (the HTTP surface proxies the
    /// product's other routes through its pool).
    pub(crate) fn http(&self) -> Option<&http::HttpUpstream> {
        match self.link.hop() {
            hop::Hop::Http(h) => Some(h),
            hop::Hop::Stdio(_) => None,
        }
    }

    /// Whether the upstream answered recently, or answers a POSTed `ping` now (a stdio
    /// child: whether it runs and answers); `Err` says why not.
    pub(crate) async fn ready(&self) -> Result<(), NotReady> {
        self.link.hop().ready().await
    }

    /// A client's message that needs no answer: its answer to a server request, or a
    /// `notifications/cancelled`. A stdio child is told (the sidecar routes them); an HTTP
    /// upstream has no session of the client's to tell, so nothing goes.
    pub(crate) async fn tell(&self, client: &Client<'_>, bytes: &Bytes) {
        // An answer to a question the sidecar asked under its own id: a 2026 upstream's
        // (`mirror.rs`), or a 2025 HTTP upstream's, which goes back in its session.
        match self.known.asks.answer(bytes, &client.caller) {
            asks::Heard::NotAnAnswer => {}
            asks::Heard::Taken => return,
            asks::Heard::Upstream(q, back) => {
                let reply = held::Reply::Http {
                    session: q.session,
                    version: q.version,
                };
                self.answer_question(client.headers, client.caller, &reply, back)
                    .await;
                return;
            }
        }
        let hop = self.link.hop();
        if !hop.takes_client_notes() {
            return;
        }
        let Some(msg) = crate::mcp::raw::parse_message(bytes) else {
            return;
        };
        let relevant = match msg.get("method") {
            None => msg.contains_key("id"),
            Some(m) => m.get() == r#""notifications/cancelled""#,
        };
        if !relevant {
            return;
        }
        let headers = hop.base_headers(client);
        if let Err(e) = hop
            .post(
                &client.caller,
                headers,
                bytes.clone(),
                None,
                ServerRequests::Relayed,
            )
            .await
        {
            tracing::debug!(error = %e, "a client's message did not reach the upstream");
        }
    }

    /// Closes the 2025-era sessions still open (`DELETE`, within the upstream timeout, at
    /// most 5 s), then stops a stdio upstream's child process and waits until it is gone.
    pub(crate) async fn shutdown(&self) {
        let within = self.link.bounds().timeout.min(SESSION_CLOSE_AT_SHUTDOWN);
        self.known.sessions.close_all(&self.link, within).await;
        self.metrics.upstream_sessions.set(0);
        self.link.hop().shutdown().await;
    }

    /// The era of the upstream, probing with `server/discover` (with the caller's
    /// credentials) when it is not known.
    pub(crate) async fn era(&self, client: &Client<'_>) -> Result<Era, Error> {
        let known = &self.known;
        self.noted(
            known
                .resolver
                .era(&self.link, &known.sessions, client)
                .await,
        )
    }

    /// The upstream's discovery for a client (`client_body`: a modern client's own
    /// `server/discover`, forwarded as it was; `legacy_caps`: what a 2025 client declares in
    /// its `initialize`); see [`EraResolver::discover`]. Over a 2025 upstream it comes from
    /// the session the client's later requests use.
    pub(crate) async fn discover(
        &self,
        client: &Client<'_>,
        client_body: Option<Bytes>,
        legacy_caps: Option<&RawValue>,
    ) -> Result<(Era, Discovery), Error> {
        let known = &self.known;
        let caps = match legacy_caps {
            // Kept as its session id will carry them (`session_for`): an object, not empty.
            Some(c) => self
                .session_for(Some(c))
                .and_then(|sid| self.client_capabilities_of(&sid)),
            None => Self::session_caps(client),
        };
        self.noted(
            known
                .resolver
                .discover(
                    &self.link,
                    &known.sessions,
                    client,
                    client_body,
                    caps.as_deref().map(RawValue::get),
                )
                .await,
        )
    }

    /// Where another replica holding the call a retry's `requestState` names is reached
    /// (`src/replica.rs` forwards the retry there), when it is one.
    pub(crate) fn held_elsewhere(&self, state: &RawValue) -> Option<url::Url> {
        let state = bridge::held_state(state)?;
        self.known.held.held_elsewhere(&state)
    }

    /// Sends a client's request in the upstream's era, translating it from the client's,
    /// and returns its answer finished for the client: in the client's era, through the
    /// request's plan (the hook hears the outcome, or the failure where it is found). A
    /// `subscriptions/listen` stream comes back as it is.
    pub(crate) async fn forward(
        self: &Arc<Self>,
        client: &Client<'_>,
        query: Option<&str>,
        bytes: &Bytes,
        mut ctx: RequestContext<'_>,
    ) -> Result<Response<Body>, Error> {
        let asks = ctx.era == Era::Modern && ctx.listed.is_some_and(|m| m.entry().input_required);
        // A call that may ask, in a 2025 session over HTTP: the questions the server sends on
        // the session's stream while it runs may be asked of it.
        let inbox = self.in_flight(client, bytes, ctx.listed, ctx.era).await;
        if let Some(state) = ctx
            .request_state
            .filter(|_| asks)
            .and_then(bridge::held_state)
        {
            let mut way = self.bridge_way(client);
            way.inbox = inbox;
            return bridge::resume(way, client, bytes, &state, ctx).await;
        }
        let sent = match self
            .send_with_retry(client, query, bytes, ctx.called(), Asker::Client(ctx.era))
            .await
        {
            Ok(sent) => sent,
            Err(e) => {
                let (era, id) = (ctx.era, ctx.id);
                let e = ctx.fail(e);
                // A 2026 upstream's 400 (read whole to tell an era change) may be a JSON-RPC
                // error for the request, which a 2025 client gets with 200.
                let in_band = e
                    .upstream_answer()
                    .filter(|_| era == Era::Legacy)
                    .and_then(|answer| answer::for_legacy_client(answer, id));
                return in_band.ok_or(e);
            }
        };
        if ctx.listed.is_some_and(|m| m.entry().streams) {
            return Ok(answer::stream_back(sent.response));
        }
        if ctx.era == Era::Modern && !ctx.plan.force_server_info && sent.server_info.is_some() {
            ctx.plan.server_info = sent.server_info.clone().map(Arc::new);
        }
        // A 2026 upstream's input_required for a 2025 client that takes a stream is asked of
        // it as 2025 servers ask.
        if ctx.era == Era::Legacy
            && sent.era == Era::Modern
            && ctx.listed.is_some_and(|m| m.entry().input_required)
            && mirror::accepts_stream(client.headers)
            && sent.response.status() == StatusCode::OK
            && !crate::body::is_event_stream(sent.response.headers())
        {
            return self.answer_or_ask(client, bytes, sent, ctx).await;
        }
        let questions = self.questions(client, bytes, &sent, &ctx);
        // 2026 sends change notices only on listen streams: a 2025 upstream's on a 2026
        // client's call (an event stream: a JSON answer holds none) go to the listeners of
        // its session.
        let notices = (ctx.era == Era::Modern
            && sent.era == Era::Legacy
            && crate::body::is_event_stream(sent.response.headers()))
        .then(|| self.notices_for(client));
        let aside = answer::Aside {
            questions,
            notices,
            inbox,
        };
        answer::finish(sent.response, ctx, sent.era, self.link.bounds(), aside).await
    }

    /// A call of a method that may ask, for a 2025-era HTTP upstream, in flight in its
    /// session: the questions the server sends on the session's stream while it runs may be
    /// asked of it, when its client declared the capability they take (a 2025 client that
    /// declared none is asked whatever its server asks). The session is opened first, and the
    /// call waits (a first call in a session, at most 2 s) for its stream to be read.
    async fn in_flight(
        self: &Arc<Self>,
        client: &Client<'_>,
        bytes: &Bytes,
        listed: Option<Method>,
        era: Era,
    ) -> Option<crate::mcp::sse::Inbox> {
        let may_ask = listed.is_some_and(|m| m.entry().input_required);
        if !may_ask || self.link.hop().takes_client_notes() {
            return None;
        }
        if self.era(client).await.ok()? != Era::Legacy {
            return None;
        }
        let (caps, covers): (Option<Box<RawValue>>, listen::Covers) = match era {
            Era::Modern => {
                let declared = bridge::capabilities_of(bytes);
                (
                    Self::session_caps(client),
                    Box::new(move |q| bridge::covers(&declared, q)),
                )
            }
            Era::Legacy => {
                let caps = self.client_capabilities(client.headers);
                let declared = caps
                    .as_deref()
                    .and_then(|c| serde_json::from_str::<Value>(c.get()).ok());
                let covers: listen::Covers = match declared {
                    Some(d) => Box::new(move |q| bridge::covers(&d, q)),
                    None => Box::new(|_| true),
                };
                (caps, covers)
            }
        };
        let caps = caps.map(|c| c.get().to_owned());
        // The session the call goes in, open before its stream is read.
        let session = self
            .known
            .sessions
            .session(&self.link, client, caps.as_deref())
            .await
            .ok()?;
        self.known
            .listeners
            .clone()
            .in_flight(self.clone(), client, (caps, session.id.clone()), covers)
            .await
    }

    /// What becomes of the questions a 2025-era upstream asks in a call's stream: a 2026
    /// client is asked them as `input_required` (`bridge.rs`); a 2025 client is asked them on
    /// its stream, a stdio child's relayed by the pipe, an HTTP upstream's under the sidecar's
    /// ids (`relay.rs`); a call of a method that never asks has nobody to ask.
    fn questions(
        self: &Arc<Self>,
        client: &Client<'_>,
        bytes: &Bytes,
        sent: &Sent,
        ctx: &RequestContext<'_>,
    ) -> crate::mcp::sse::Questions {
        use crate::mcp::sse::Questions;
        let stdio = self.link.hop().takes_client_notes();
        let may_ask = ctx.listed.filter(|m| m.entry().input_required);
        match (ctx.era, sent.era, may_ask) {
            (Era::Modern, Era::Legacy, Some(method)) => {
                Questions::Bridged(self.asking(client, bytes, method, sent, ctx))
            }
            (Era::Legacy, _, _) if stdio => Questions::Carried,
            (Era::Legacy, Era::Legacy, Some(_)) => Questions::Relayed(Box::new(relay::Relaying {
                asks: self.known.asks.clone(),
                answers: self.clone(),
                headers: client.headers.clone(),
                caller: client.caller,
                session: relay::session_of(sent.session.as_deref()),
                open: Vec::new(),
            })),
            _ if stdio => Questions::Carried,
            _ => Questions::Refused,
        }
    }

    /// A 2026 client's `subscriptions/listen` for a 2025-era upstream (which has none):
    /// served from the session its requests use (`listen.rs`).
    pub(crate) async fn listen(
        self: &Arc<Self>,
        client: &Client<'_>,
        id: &RawValue,
        bytes: &[u8],
        cut: tokio::sync::watch::Receiver<bool>,
    ) -> Result<Response<Body>, Error> {
        let caps = Self::session_caps(client).map(|c| c.get().to_owned());
        self.known
            .listeners
            .clone()
            .listen(self.clone(), client, caps, id, bytes, cut)
            .await
    }

    /// What is told when the upstream's tools changed (the binding forgets its catalog).
    pub(crate) fn on_tools_changed(&self, f: Arc<dyn Fn() + Send + Sync>) {
        self.known.listeners.on_tools_changed(f);
    }

    /// The capabilities a 2026 client's 2025 session is opened with (and keyed by).
    fn session_caps(client: &Client<'_>) -> Option<Box<RawValue>> {
        client.declared_capabilities().filter(|c| c.get() != "{}")
    }

    /// Where the change notices on a 2026 client's call go: its session's listeners.
    fn notices_for(&self, client: &Client<'_>) -> crate::mcp::sse::Notices {
        let caps = Self::session_caps(client);
        let listeners = self.known.listeners.clone();
        let key = listeners.key(&client.caller, caps.as_deref().map(RawValue::get));
        Arc::new(move |method, params| listeners.heard(key, method, params))
    }

    /// A 2026 upstream's JSON answer for a 2025 client: finished as it is, or, when it asks
    /// for input, asked of the client on a stream (`mirror.rs`).
    async fn answer_or_ask(
        self: &Arc<Self>,
        client: &Client<'_>,
        bytes: &Bytes,
        sent: Sent,
        ctx: RequestContext<'_>,
    ) -> Result<Response<Body>, Error> {
        let read = match read_answer(sent.response, self.link.bounds()).await {
            Ok(read) => read,
            Err(e) => return Err(ctx.fail(e)),
        };
        if !mirror::is_input_required(read.result()) {
            return answer::finish_read(read, ctx, sent.era).await;
        }
        let first = read.result().cloned().unwrap_or_default();
        self.ask_legacy_client(client, bytes, ctx, first, self.clone())
    }

    /// The bridge that asks a 2026 client a 2025-era upstream's questions in its call
    /// (`bridge.rs`): answered over the pipe, or in the call's 2025 session.
    fn asking(
        self: &Arc<Self>,
        client: &Client<'_>,
        bytes: &Bytes,
        method: Method,
        sent: &Sent,
        ctx: &RequestContext<'_>,
    ) -> Box<dyn crate::mcp::sse::Bridge> {
        let reply = match (&sent.session, self.link.hop().takes_client_notes()) {
            (_, true) => held::Reply::Stdio,
            (Some(s), false) => held::Reply::Http {
                session: s.id.clone(),
                version: s.version.clone(),
            },
            (None, false) => held::Reply::Http {
                session: None,
                version: crate::mcp::version::LEGACY_LATEST.to_owned(),
            },
        };
        Box::new(bridge::Asking {
            answers: self.clone(),
            headers: client.headers.clone(),
            caller: client.caller,
            method,
            request: bytes.clone(),
            reply,
            upstream_id: ctx.id.to_owned(),
            held: self.known.held.clone(),
            budget: self.link.bounds().budget.clone(),
            ledger: self.known.ledger.clone(),
            round: 1,
            reserved: None,
        })
    }

    /// Sends a client's request in the upstream's era; when the upstream's refusal says it
    /// changed era, once more in the new one. A 2026 upstream's 400 is read whole to tell an
    /// era change from a refusal to pass on.
    async fn send_with_retry(
        &self,
        client: &Client<'_>,
        query: Option<&str>,
        bytes: &Bytes,
        method: Called<'_>,
        asker: Asker,
    ) -> Result<Sent, Error> {
        let (link, known) = (&self.link, &self.known);
        let sent = known
            .resolver
            .with_retry(link, &known.sessions, client, |era| async move {
                self.send(client, query, bytes, method, asker, era).await
            })
            .await;
        self.noted(sent)
    }

    /// One try of [`Upstream::send_with_retry`], in the era `upstream` speaks.
    async fn send(
        &self,
        client: &Client<'_>,
        query: Option<&str>,
        bytes: &Bytes,
        method: Called<'_>,
        asker: Asker,
        upstream: Era,
    ) -> Result<Sent, Error> {
        let link = &self.link;
        match upstream {
            Era::Modern => {
                let (body, headers) = match asker.writes() {
                    Era::Modern => (bytes.clone(), link.base_headers_modern(client)),
                    Era::Legacy => {
                        let caps = self.client_capabilities(client.headers);
                        let (body, name) = translate::to_modern(bytes, method, caps.as_deref());
                        let mut headers = link.base_headers(client);
                        set_modern_headers(&mut headers, method.wire, name.as_deref());
                        (body, headers)
                    }
                };
                let started = std::time::Instant::now();
                let response = link
                    .post(
                        &client.caller,
                        headers,
                        body,
                        query,
                        ServerRequests::Withheld,
                    )
                    .await?;
                self.observe(method, started);
                if response.status() == StatusCode::BAD_REQUEST {
                    return Err(read_answer(response, link.bounds()).await?.into_refusal());
                }
                Ok(Sent {
                    response,
                    era: upstream,
                    server_info: None,
                    session: None,
                })
            }
            Era::Legacy => {
                // Only a 2025 client can take the server's own requests; a 2026 client's
                // request, and the sidecar's own, withhold them.
                let (body, relay) = match asker {
                    // Asked of the client as input_required, where the method may answer so.
                    Asker::Client(Era::Modern)
                        if method.listed.is_some_and(|m| m.entry().input_required) =>
                    {
                        (translate::to_legacy(bytes), ServerRequests::Bridged)
                    }
                    Asker::Client(Era::Modern) => {
                        (translate::to_legacy(bytes), ServerRequests::Withheld)
                    }
                    Asker::Client(Era::Legacy) => (bytes.clone(), ServerRequests::Relayed),
                    Asker::Sidecar => (bytes.clone(), ServerRequests::Withheld),
                };
                let started = std::time::Instant::now();
                // A 2025 client's own capabilities are declared in its session's handshake.
                // So is a 2026 client's (its envelope's), for the servers that ask only
                // clients that declared they can answer.
                let caps = match asker {
                    Asker::Client(Era::Legacy) => self.client_capabilities(client.headers),
                    Asker::Client(Era::Modern) => Self::session_caps(client),
                    Asker::Sidecar => None,
                };
                let (response, session) = self
                    .known
                    .sessions
                    .send(
                        link,
                        client,
                        body,
                        relay,
                        caps.as_deref().map(RawValue::get),
                    )
                    .await?;
                self.observe(method, started);
                Ok(Sent {
                    response,
                    era: upstream,
                    server_info: session.init.get("serverInfo").cloned(),
                    session: Some(session),
                })
            }
        }
    }

    fn observe(&self, method: Called<'_>, started: std::time::Instant) {
        self.metrics
            .upstream_seconds
            .get_or_create(&MethodLabels {
                method: method.label(),
            })
            .observe(started.elapsed().as_secs_f64());
        self.metrics
            .upstream_sessions
            .set(self.known.sessions.len() as i64);
    }

    /// Lists the upstream's tools (every page, with the calling request's credentials): each
    /// name and whether it declares an `outputSchema`. Failures end the listing early. Each
    /// page is a request of the sidecar's own (its own span, never the client's trace).
    pub(crate) async fn list_tools(&self, client: &Client<'_>) -> Vec<(String, bool)> {
        let mut tools = Vec::new();
        let mut cursor: Option<Value> = None;
        for _ in 0..MAX_LIST_PAGES {
            let mut params = json!({});
            if let Some(c) = cursor.take() {
                params["cursor"] = c;
            }
            let body = json!({"jsonrpc": "2.0", "id": self.link.next_id("tools"), "method": Method::ToolsList.wire(), "params": params});
            let mut headers = client.headers.clone();
            let (body, span) = self.link.own(
                Method::ToolsList.wire(),
                "catalog",
                &mut headers,
                Bytes::from(body.to_string()),
            );
            let own = Client {
                headers: &headers,
                caller: client.caller,
                meta: None,
            };
            let Ok(sent) = self
                .send_with_retry(
                    &own,
                    None,
                    &body,
                    Called::of(Method::ToolsList),
                    Asker::Sidecar,
                )
                .await
            else {
                break;
            };
            if let Some(span) = &span {
                span.answered(sent.response.status().as_u16());
            }
            let Ok(answer) = read_answer(sent.response, self.link.bounds()).await else {
                break;
            };
            let Some(result) = answer.result() else { break };
            for t in result
                .get("tools")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(name) = t.get("name").and_then(Value::as_str) {
                    tools.push((name.to_owned(), t.get("outputSchema").is_some()));
                }
            }
            match result.get("nextCursor") {
                Some(c) if !c.is_null() => cursor = Some(c.clone()),
                _ => break,
            }
        }
        tools
    }
}

/// A 2025 client's call goes again to the 2026 upstream with its answers (`mirror.rs`).
impl mirror::AsksAgain for Upstream {
    fn call_again(
        self: Arc<Self>,
        headers: ::http::HeaderMap,
        caller: caller::Caller,
        (method, listed): (String, Option<Method>),
        body: Bytes,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Value, Error>> + Send>> {
        Box::pin(async move {
            let client = Client {
                headers: &headers,
                caller,
                meta: None,
            };
            let called = Called {
                wire: &method,
                listed,
            };
            let sent = self
                .send_with_retry(&client, None, &body, called, Asker::Client(Era::Legacy))
                .await?;
            let read = read_answer(sent.response, self.link.bounds()).await?;
            if !read.status().is_success() {
                return Err(read.into_refusal());
            }
            read.message.ok_or_else(|| {
                Error::new(
                    ErrorKind::UpstreamFailed,
                    "the upstream's answer held no result",
                )
            })
        })
    }
}

/// A bridged call's answers go upstream through the worker's link, in the call's 2025
/// session when it has one (`bridge.rs`).
impl bridge::Answers for Upstream {
    fn answer(
        self: Arc<Self>,
        headers: ::http::HeaderMap,
        caller: caller::Caller,
        reply: held::Reply,
        bytes: Bytes,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>> {
        Box::pin(async move { self.answer_question(&headers, caller, &reply, bytes).await })
    }
}

impl Upstream {
    /// The session id a 2025 client's `initialize` answer carries: the capabilities it
    /// declared, sealed (any replica with the same product key reads them back), so its later
    /// requests reach the upstream with them although the sidecar keeps no session. `None`
    /// when it declared none (or too many to carry).
    pub(crate) fn session_for(&self, caps: Option<&RawValue>) -> Option<::http::HeaderValue> {
        let caps: Value = serde_json::from_str(caps?.get()).ok()?;
        if caps.as_object().is_none_or(serde_json::Map::is_empty) {
            return None;
        }
        let sealed = self.known.held.seal_capabilities(&caps.to_string())?;
        ::http::HeaderValue::from_str(&sealed).ok()
    }

    /// What a 2025 client declared at `initialize` (its session id carries it), when it can
    /// also be asked on an event stream: the sidecar may then ask it a question of its own.
    pub(crate) fn askable_legacy_client(&self, client: &Client<'_>) -> Option<Value> {
        if !mirror::accepts_stream(client.headers) {
            return None;
        }
        serde_json::from_str(self.client_capabilities(client.headers)?.get()).ok()
    }

    /// A result that asks a 2025 client for input (a 2026 upstream's `input_required`, or a
    /// customer-context tool's answered here): asked on an event stream (`mirror.rs`), with
    /// `again` answering each retry. `request` is the client's call as it sent it.
    pub(crate) fn ask_legacy_client(
        &self,
        client: &Client<'_>,
        request: &Bytes,
        ctx: RequestContext<'_>,
        first: Value,
        again: Arc<dyn AsksAgain>,
    ) -> Result<Response<Body>, Error> {
        let m = mirror::Mirror {
            upstream: again,
            asks: self.known.asks.clone(),
            headers: client.headers.clone(),
            caller: client.caller,
            method: (ctx.method.to_owned(), ctx.listed),
            request: request.clone(),
            id: ctx.id.to_owned(),
            wait: self.known.wait,
        };
        mirror::answer_by_asking(m, ctx.plan, first)
    }

    /// The capabilities a 2025 client's session id carries, when it is one of the sidecar's.
    fn client_capabilities(&self, headers: &::http::HeaderMap) -> Option<Box<RawValue>> {
        self.client_capabilities_of(headers.get(crate::mcp::headers::SESSION_ID)?)
    }

    /// The capabilities session id `id` carries, when it is one of the sidecar's.
    fn client_capabilities_of(&self, id: &::http::HeaderValue) -> Option<Box<RawValue>> {
        let caps = self.known.held.open_capabilities(id.to_str().ok()?)?;
        RawValue::from_string(caps).ok()
    }

    /// What continuing a held call takes of this upstream.
    fn bridge_way(self: &Arc<Self>, client: &Client<'_>) -> bridge::Way {
        bridge::Way {
            answers: self.clone(),
            held: self.known.held.clone(),
            ledger: self.known.ledger.clone(),
            bounds: self.link.bounds().clone(),
            metrics: self.metrics.clone(),
            notices: Some(self.notices_for(client)),
            inbox: None,
        }
    }

    /// Sends the client's answer to one of the upstream's questions (or the error that says
    /// it cannot answer) where the question came from.
    async fn answer_question(
        &self,
        headers: &::http::HeaderMap,
        caller: caller::Caller,
        reply: &held::Reply,
        bytes: Bytes,
    ) {
        let mut h = self.link.base_headers(headers);
        if let held::Reply::Http { session, version } = reply {
            if let Some(s) = session {
                h.insert(crate::mcp::headers::SESSION_ID, s.clone());
            }
            if let Ok(v) = ::http::HeaderValue::from_str(version) {
                h.insert(crate::mcp::headers::PROTOCOL_VERSION, v);
            }
        }
        let cancels = bytes
            .windows(b"notifications/cancelled".len())
            .any(|w| w == b"notifications/cancelled");
        let (name, reason) = if cancels {
            ("notifications/cancelled", "cancel")
        } else {
            ("answer", "question")
        };
        let (bytes, span) = self.link.own(name, reason, &mut h, bytes);
        let sent = self
            .link
            .post(&caller, h, bytes, None, ServerRequests::Relayed)
            .await;
        if let (Some(span), Ok(resp)) = (&span, &sent) {
            span.answered(resp.status().as_u16());
        }
        match sent {
            Ok(resp) if resp.status().is_success() => {}
            Ok(resp) => {
                tracing::info!(status = %resp.status(), "the upstream refused an answer to its question")
            }
            Err(e) => {
                tracing::info!(error = %e, "an answer to the upstream's question did not reach it")
            }
        }
    }
}

/// A listen feed reaches the upstream through this worker's link, in the session its
/// listeners' requests use (`listen.rs`).
impl listen::Watched for Upstream {
    async fn session_headers(
        &self,
        client: &Client<'_>,
        caps: Option<&str>,
        stale: Option<&::http::HeaderValue>,
    ) -> Result<(::http::HeaderMap, Value), Error> {
        let sessions = &self.known.sessions;
        let mut session = sessions.session(&self.link, client, caps).await?;
        if stale.is_some() && session.id.as_ref() == stale {
            session = sessions.handshake(&self.link, client, caps).await?;
        }
        let mut headers = self.link.base_headers(client);
        session.apply(&mut headers);
        Ok((headers, session.init.clone()))
    }

    async fn watch(
        &self,
        caller: &caller::Caller,
        mut headers: ::http::HeaderMap,
    ) -> Result<Response<UpstreamBody>, Error> {
        let (_, span) = self
            .link
            .own("GET", "listen_feed", &mut headers, Bytes::new());
        let resp = self.link.hop().watch(caller, headers).await?;
        if let Some(span) = &span {
            span.answered(resp.status().as_u16());
        }
        Ok(resp)
    }

    async fn post_in_session(
        &self,
        caller: &caller::Caller,
        mut headers: ::http::HeaderMap,
        body: Bytes,
    ) -> Result<StatusCode, Error> {
        let name = if body.windows(11).any(|w| w == b"unsubscribe") {
            "resources/unsubscribe"
        } else if body.windows(9).any(|w| w == b"subscribe") {
            "resources/subscribe"
        } else {
            "answer"
        };
        let (body, span) = self.link.own(name, "listen_feed", &mut headers, body);
        let resp = self
            .link
            .post(caller, headers, body, None, ServerRequests::Withheld)
            .await?;
        if let Some(span) = &span {
            span.answered(resp.status().as_u16());
        }
        let read = read_answer(resp, self.link.bounds()).await?;
        Ok(read.status())
    }

    fn shares_notices(&self) -> bool {
        self.link.hop().takes_client_notes()
    }

    fn max_event(&self) -> usize {
        self.link.bounds().max_event
    }

    fn keep_every(&self) -> std::time::Duration {
        (self.known.sessions.idle() / 2).min(std::time::Duration::from_secs(60))
    }
}
