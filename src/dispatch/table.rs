//! The method table (`MethodTable`, one per worker): for each validated request, what is
//! answered here, what is translated, and what is forwarded. Local: `server/discover` (the
//! upstream's, merged with the feedback rule), `initialize` for 2025 clients, `ping` and
//! `subscriptions/listen` where the upstream's era has none, a 2025 client's `logging/setLevel`
//! for a 2026 upstream, and the two feedback tools. Rewritten: `tools/list` and product
//! `tools/call`. Everything else goes to the upstream in its era and comes back in the client's.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use serde_json::{json, Map, Value};
use tokio::sync::watch;

use crate::binding::FeedbackBinding;
use crate::body::{self, Body};
use crate::config::Config;
use crate::error::{Error, ErrorKind};
use crate::frontdoor::Request;
use crate::limits::{retry_after_secs, RateLimits};
use crate::mcp::end::{Abandoned, Failure};
use crate::mcp::era::Era;
use crate::mcp::headers;
use crate::mcp::method::{Answer, Method};
use crate::mcp::raw::{self, raw};
use crate::mcp::version::{self, LEGACY_LATEST};
use crate::metrics::{LimitKind, Metrics};
use crate::observe::Note;
use crate::otel::{self, HopSpan, Otel, ServerSpan};
use crate::upstream::{translate, Client, RequestContext, Upstream};

/// The method table and what it answers with: the configuration, one worker's view of the
/// upstream, the binding, the tools' rate limits.
pub(super) struct MethodTable {
    config: Arc<Config>,
    upstream: Arc<Upstream>,
    binding: Arc<FeedbackBinding>,
    metrics: Arc<Metrics>,
    rates: Arc<RateLimits>,
    /// Turns true when the sidecar cuts in-flight requests short at shutdown.
    cut: watch::Receiver<bool>,
    /// OpenTelemetry, when on (the upstream hop's span).
    otel: Option<Arc<Otel>>,
}

impl MethodTable {
    pub(super) fn new(
        config: Arc<Config>,
        upstream: Arc<Upstream>,
        binding: Arc<FeedbackBinding>,
        metrics: Arc<Metrics>,
        rates: Arc<RateLimits>,
        cut: watch::Receiver<bool>,
        otel: Option<Arc<Otel>>,
    ) -> Self {
        MethodTable {
            config,
            upstream,
            binding,
            metrics,
            rates,
            cut,
            otel,
        }
    }

    /// The same table for another worker, through that worker's view of the upstream.
    pub(super) fn for_worker(&self, upstream: Arc<Upstream>) -> Self {
        MethodTable {
            config: self.config.clone(),
            upstream,
            binding: self.binding.clone(),
            metrics: self.metrics.clone(),
            rates: self.rates.clone(),
            cut: self.cut.clone(),
            otel: self.otel.clone(),
        }
    }

    /// Answers one validated request: here, or through the upstream; a request still running
    /// when the sidecar cuts in-flight work at shutdown gets `ShuttingDown`.
    pub(super) async fn dispatch(
        &self,
        req: &Request<'_>,
        client: Client<'_>,
        abandoned: Abandoned,
        note: Option<&Arc<Note>>,
        span: Option<&ServerSpan>,
    ) -> Result<Response<Body>, Error> {
        let mut cut = self.cut.clone();
        let mut client = client;
        if req.era == Era::Modern {
            client.meta = req.rpc.params.meta;
        }
        tokio::select! {
            answered = self.answer(req, client, abandoned, note, span) => answered,
            _ = cut.wait_for(|c| *c) => Err(Error::new(ErrorKind::ShuttingDown, "")),
        }
    }

    /// Where another replica holding the call a retry's `requestState` names is reached.
    pub(super) fn held_elsewhere(&self, state: &serde_json::value::RawValue) -> Option<url::Url> {
        self.upstream.held_elsewhere(state)
    }

    /// Whether the upstream lists the tool `name` (as far as the catalog has learned).
    pub(super) fn lists(&self, name: &str) -> bool {
        self.binding.listed(name).is_some()
    }

    /// A client's message that needs no answer (its answer to a server request, a
    /// notification) goes to the upstream, when the upstream is told such things
    /// ([`Upstream::tell`]).
    pub(super) async fn tell(&self, client: &Client<'_>, bytes: &Bytes) {
        self.upstream.tell(client, bytes).await;
    }

    /// [`MethodTable::dispatch`] before the cut.
    async fn answer(
        &self,
        req: &Request<'_>,
        client: Client<'_>,
        abandoned: Abandoned,
        note: Option<&Arc<Note>>,
        span: Option<&ServerSpan>,
    ) -> Result<Response<Body>, Error> {
        let client = &client;
        let tool_call = req.listed == Some(Method::ToolsCall);
        let feedback_tool = tool_call
            && req
                .rpc
                .name()
                .is_some_and(|n| self.binding.is_local_tool(&n));
        let hop = Hop {
            span,
            abandoned: abandoned.clone(),
        };
        let ctx = self.context(req, abandoned);
        if tool_call {
            let name = req.rpc.name().unwrap_or_default();
            if let Err(wait) = self.rates.check_tool(&name) {
                self.metrics.limit(LimitKind::ToolRate);
                return Ok(ctx.local_result(tool_rate_limited(&name, wait)));
            }
        }
        match route(req.listed, req.era, feedback_tool) {
            Route::Removed => Err(Error::new(
                ErrorKind::MethodNotFound {
                    method: req.method().to_owned(),
                },
                "",
            )),
            Route::Discover => self.discover(req, client, ctx).await,
            Route::Initialize => self.initialize(req, client).await,
            Route::Ping | Route::SetLevel if self.upstream.era(client).await? == Era::Modern => {
                Ok(ctx.local_result(json!({})))
            }
            Route::Listen if self.upstream.era(client).await? == Era::Legacy => {
                self.upstream
                    .listen(client, req.id, req.bytes, self.cut.clone())
                    .await
            }
            Route::FeedbackTool => {
                let name = req.rpc.name().unwrap_or_default();
                match self.binding.customer().filter(|c| c.answers(&name)) {
                    Some(c) => super::customer::answer(c, &self.upstream, req, client, ctx).await,
                    None => self.feedback_tool(req, ctx, note).await,
                }
            }
            Route::ToolCall => self.tool_call(req, client, ctx, note, hop).await,
            Route::ToolList => {
                let mut ctx = ctx;
                ctx.plan
                    .set_hook(self.binding.list_hook(self.otel.is_some()));
                self.forward(req, client, ctx, hop).await
            }
            Route::Forward if req.listed == Some(Method::TasksGet) => {
                // A followed task's terminal status is its product call's outcome.
                let mut ctx = ctx;
                ctx.plan.set_hook(self.binding.task_hook(
                    client.caller.key(),
                    &req.parts.headers,
                    req.principal.as_ref().map(|p| (&p.refs, p.caller)),
                    note.cloned(),
                ));
                self.forward(req, client, ctx, hop).await
            }
            Route::Ping | Route::SetLevel | Route::Listen | Route::Forward => {
                self.forward(req, client, ctx, hop).await
            }
        }
    }

    /// The request's context; its plan is what a response gets besides its hook: for a 2026
    /// client, the server identity and, on cacheable methods, the configured cache hints.
    fn context<'a>(&self, req: &'a Request<'_>, abandoned: Abandoned) -> RequestContext<'a> {
        let method = req.method();
        let mut ctx = RequestContext::new(
            req.id,
            method,
            req.listed,
            req.era,
            abandoned,
            self.cut.clone(),
        );
        ctx.request_state = req.rpc.params.request_state;
        if req.era == Era::Modern {
            let shown = self.upstream.server_info(None);
            ctx.plan.server_info = shown.info;
            ctx.plan.force_server_info = shown.forced;
            if req.listed.is_some_and(Method::is_cacheable) {
                ctx.plan.cache = Some((self.config.cache_ttl_ms, self.config.cache_scope));
            }
        }
        ctx
    }

    /// `server/discover`: the upstream's discovery (its own, or one built from its 2025
    /// handshake), with the feedback rule.
    async fn discover(
        &self,
        req: &Request<'_>,
        client: &Client<'_>,
        ctx: RequestContext<'_>,
    ) -> Result<Response<Body>, Error> {
        let (_, discovery) = self
            .upstream
            .discover(client, Some(req.bytes.clone()), None)
            .await?;
        let result = self.binding.with_binding(discovery.result);
        Ok(ctx.local_result(result))
    }

    /// A 2025-era `initialize`, answered per request from the upstream's discovery: no
    /// session id, the client's version when it is one the sidecar serves, and only the
    /// capabilities the sidecar can serve a 2025 client (nothing pushed).
    async fn initialize(
        &self,
        req: &Request<'_>,
        client: &Client<'_>,
    ) -> Result<Response<Body>, Error> {
        // The capabilities it declares: its session id will carry them, and the 2025
        // upstream session its later requests use is the one opened (or found) now.
        let caps = req
            .rpc
            .params_raw
            .and_then(raw::open)
            .and_then(|p| p.get("capabilities").map(|c| c.to_owned()));
        let (_, discovery) = self
            .upstream
            .discover(client, None, caps.as_deref())
            .await?;
        let discover = self.binding.with_binding(discovery.result);
        let requested = req.rpc.params.protocol_version.and_then(raw::as_str);
        let protocol = requested
            .as_deref()
            .filter(|v| version::is_legacy(v))
            .unwrap_or(LEGACY_LATEST);
        let upstream_info = discover
            .get("_meta")
            .and_then(|m| m.get(version::META_SERVER_INFO))
            .cloned();
        let info = self.upstream.server_info_for_initialize(upstream_info);
        let mut r = Map::new();
        r.insert("protocolVersion".into(), Value::from(protocol));
        r.insert(
            "capabilities".into(),
            discover
                .get("capabilities")
                .map_or_else(|| json!({}), translate::for_legacy_client),
        );
        r.insert("serverInfo".into(), info);
        if let Some(i) = discover.get("instructions").filter(|i| i.is_string()) {
            r.insert("instructions".into(), i.clone());
        }
        let msg = raw::result_message(req.id, raw(&r));
        let mut resp = body::json(StatusCode::OK, raw::to_bytes(&msg));
        // The client's capabilities travel in the session id it now sends on every request,
        // so they reach the upstream with no state kept here: any replica reads them.
        if let Some(sid) = self.upstream.session_for(caps.as_deref()) {
            resp.headers_mut().insert(headers::SESSION_ID, sid);
        }
        Ok(resp)
    }

    /// One of the two feedback tools, answered here.
    async fn feedback_tool(
        &self,
        req: &Request<'_>,
        ctx: RequestContext<'_>,
        note: Option<&Arc<Note>>,
    ) -> Result<Response<Body>, Error> {
        let name = req.rpc.name().unwrap_or_default();
        let args = req
            .rpc
            .params
            .arguments
            .and_then(|a| serde_json::from_str(a.get()).ok())
            .unwrap_or_else(|| json!({}));
        let bound = req.principal.as_ref().map(|p| p.caller);
        let result = self.binding.call_local(&name, &args, note, bound).await;
        Ok(ctx.local_result(result))
    }

    /// Whether the caller's token holds every scope the request needs (its tool's,
    /// prompt's or resource's, besides the base ones); else the 403 naming them all.
    pub(super) fn require_scopes(
        &self,
        auth: &crate::auth::Authorizer,
        principal: &crate::auth::Principal,
        req: &Request<'_>,
    ) -> Result<(), Error> {
        use crate::config::OperationKind;
        let (kind, name) = match req.listed {
            Some(Method::ToolsCall) => (Some(OperationKind::Tool), req.rpc.name()),
            Some(Method::PromptsGet) => (Some(OperationKind::Prompt), req.rpc.name()),
            Some(Method::ResourcesRead) => (
                Some(OperationKind::Resource),
                req.rpc.params.uri.and_then(crate::mcp::raw::as_str),
            ),
            _ => (None, None),
        };
        let local = kind == Some(OperationKind::Tool)
            && name
                .as_deref()
                .is_some_and(|n| self.binding.is_local_tool(n));
        auth.require(principal, &auth.needed(kind, name.as_deref(), local))
    }

    /// A product `tools/call`: upstream with the binding's hook (the catalog learns the
    /// upstream's tools first when it has not seen this one listed).
    async fn tool_call(
        &self,
        req: &Request<'_>,
        client: &Client<'_>,
        mut ctx: RequestContext<'_>,
        note: Option<&Arc<Note>>,
        hop: Hop<'_>,
    ) -> Result<Response<Body>, Error> {
        let name = req.rpc.name().unwrap_or_default();
        if self.binding.needs_listing(&name) {
            // With OpenTelemetry on, the catalog's own tools/list is a span of the call.
            let tools = self.upstream.list_tools(client).await;
            self.binding.learn(tools);
        }
        if let (Some(span), Some(_)) = (hop.span, self.binding.listed(&name)) {
            span.tool_listed();
        }
        // Customer context may amend the result once Epode answers (within its budget).
        let amends = self
            .binding
            .customer_follows(&name)
            .then(crate::mcp::end::Amends::default);
        if let Some(a) = &amends {
            ctx.plan.set_amends(a.clone());
        }
        ctx.plan.set_hook(Some(self.binding.call_hook(
            &name,
            client.caller.key(),
            &req.parts.headers,
            req.principal.as_ref().map(|p| (&p.refs, p.caller)),
            note.cloned(),
            amends,
        )));
        self.forward(req, client, ctx, hop).await
    }

    /// Sends the request upstream, which answers it finished for the client. With
    /// OpenTelemetry on, the hop is a client span whose context goes upstream in the headers
    /// and `params._meta`; off, a W3C `traceparent` the client sent in one place goes
    /// upstream in both.
    async fn forward(
        &self,
        req: &Request<'_>,
        client: &Client<'_>,
        ctx: RequestContext<'_>,
        hop: Hop<'_>,
    ) -> Result<Response<Body>, Error> {
        let span = match (&self.otel, hop.span) {
            (Some(otel), Some(server)) => Some(otel.hop_span(server)),
            _ => None,
        };
        let (headers, bytes) = match &span {
            Some(span) => translate::with_trace_fields_at(
                &req.parts.headers,
                req.bytes,
                &span.fields().0,
                req.rpc.params.meta,
                req.rpc.params_raw,
            ),
            None => translate::with_traceparent(&req.parts.headers, req.bytes),
        };
        let client = Client {
            headers: &headers,
            caller: client.caller,
            meta: client.meta,
        };
        let answered = self
            .upstream
            .forward(&client, req.parts.uri.query(), &bytes, ctx)
            .await;
        let Some(span) = span else {
            return answered;
        };
        match answered {
            Ok(resp) => {
                let status = resp.status().as_u16();
                Ok(otel::end_with_body(
                    resp,
                    HopEnd {
                        span: Some(span),
                        status,
                        abandoned: hop.abandoned,
                    },
                ))
            }
            Err(e) => {
                span.end(e.status().as_u16(), Some(Failure::Code(e.code())));
                Err(e)
            }
        }
    }
}

/// What the upstream hop's span needs: the request's server span, and where its answer's
/// outcome is recorded.
struct Hop<'a> {
    span: Option<&'a ServerSpan>,
    abandoned: Abandoned,
}

/// The hop's span, ended when the upstream's answer is over.
struct HopEnd {
    span: Option<HopSpan>,
    status: u16,
    abandoned: Abandoned,
}

impl Drop for HopEnd {
    fn drop(&mut self) {
        if let Some(span) = self.span.take() {
            span.end(self.status, self.abandoned.failure());
        }
    }
}

/// The answer to a `tools/call` over its tool's rate limit: a tool result an agent can act
/// on, not a protocol error.
fn tool_rate_limited(name: &str, wait: Duration) -> Value {
    let secs = retry_after_secs(wait);
    json!({
        "content": [{"type": "text", "text": format!(
            "The tool {name} is over its rate limit. Retry this call after {secs} seconds."
        )}],
        "isError": true,
    })
}

/// Where the table sends a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// A method 2026-07-28 removed, asked by a 2026 client: 404, -32601.
    Removed,
    /// `server/discover` from a 2026 client: the upstream's discovery, with the feedback rule.
    Discover,
    /// `initialize` from a 2025 client: answered per request, no session.
    Initialize,
    /// A 2025 client's `ping`: answered here when the upstream speaks 2026 (which has none).
    Ping,
    /// A 2025 client's `logging/setLevel`: answered here when the upstream speaks 2026 (which
    /// removed it, though it may still advertise `logging`). A stateless front keeps no level:
    /// the upstream is asked for no log messages, as 2026 requests without `logLevel` are.
    SetLevel,
    /// `subscriptions/listen`: answered here when the upstream speaks 2025 (which has none).
    Listen,
    /// `tools/call` of a feedback tool: answered here.
    FeedbackTool,
    /// `tools/call` of a product tool: decorated and counted.
    ToolCall,
    /// `tools/list`: the feedback tools appended.
    ToolList,
    /// Everything else: to the upstream in its era, back in the client's.
    Forward,
}

/// The method table: the catalogue entry's answer, for the client's era. A method the
/// catalogue does not list is forwarded; one it lists for 2025 only is refused to a 2026
/// client; one new in 2026 is still forwarded for a 2025 client (the upstream decides).
fn route(method: Option<Method>, client_era: Era, feedback_tool: bool) -> Route {
    let Some(method) = method else {
        return Route::Forward;
    };
    if client_era == Era::Modern && method.removed_in_modern() {
        return Route::Removed;
    }
    match method.entry().answer {
        Answer::Discover if client_era == Era::Modern => Route::Discover,
        Answer::Discover | Answer::Upstream => Route::Forward,
        Answer::Initialize => Route::Initialize,
        Answer::Ping => Route::Ping,
        Answer::SetLevel => Route::SetLevel,
        Answer::Listen => Route::Listen,
        Answer::ToolCall if feedback_tool => Route::FeedbackTool,
        Answer::ToolCall => Route::ToolCall,
        Answer::ToolList => Route::ToolList,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_method_table() {
        let modern = |m| route(Method::from_wire(m), Era::Modern, false);
        let legacy = |m| route(Method::from_wire(m), Era::Legacy, false);
        assert_eq!(modern("server/discover"), Route::Discover);
        assert_eq!(
            legacy("server/discover"),
            Route::Forward,
            "not a 2025 method"
        );
        assert_eq!(legacy("initialize"), Route::Initialize);
        for removed in [
            "initialize",
            "ping",
            "logging/setLevel",
            "resources/subscribe",
        ] {
            assert_eq!(modern(removed), Route::Removed, "{removed}");
        }
        assert_eq!(legacy("ping"), Route::Ping);
        assert_eq!(legacy("logging/setLevel"), Route::SetLevel);
        assert_eq!(modern("subscriptions/listen"), Route::Listen);
        assert_eq!(modern("tools/call"), Route::ToolCall);
        assert_eq!(
            route(Some(Method::ToolsCall), Era::Legacy, true),
            Route::FeedbackTool
        );
        assert_eq!(
            route(Some(Method::ToolsList), Era::Modern, true),
            Route::ToolList
        );
        for other in [
            "prompts/list",
            "resources/read",
            "completion/complete",
            "x/y",
        ] {
            assert_eq!(modern(other), Route::Forward, "{other}");
            assert_eq!(legacy(other), Route::Forward, "{other}");
        }
    }

    /// Every catalogue entry in both eras: a new method fails here until its disposition is
    /// written down.
    #[test]
    fn every_catalogued_method_routes_as_stated() {
        use Route::*;
        let stated = [
            (Method::Initialize, Removed, Initialize),
            (Method::Ping, Removed, Ping),
            (Method::ServerDiscover, Discover, Forward),
            (Method::ToolsList, ToolList, ToolList),
            (Method::ToolsCall, ToolCall, ToolCall),
            (Method::PromptsList, Forward, Forward),
            (Method::PromptsGet, Forward, Forward),
            (Method::ResourcesList, Forward, Forward),
            (Method::ResourcesRead, Forward, Forward),
            (Method::ResourcesTemplatesList, Forward, Forward),
            (Method::ResourcesSubscribe, Removed, Forward),
            (Method::ResourcesUnsubscribe, Removed, Forward),
            (Method::CompletionComplete, Forward, Forward),
            (Method::LoggingSetLevel, Removed, SetLevel),
            (Method::SubscriptionsListen, Listen, Listen),
            (Method::NotificationsInitialized, Removed, Forward),
            (Method::NotificationsCancelled, Forward, Forward),
            (Method::NotificationsProgress, Forward, Forward),
            (Method::NotificationsRootsListChanged, Removed, Forward),
            (Method::TasksGet, Forward, Forward),
            (Method::TasksUpdate, Forward, Forward),
            (Method::TasksCancel, Forward, Forward),
        ];
        let methods: Vec<Method> = stated.iter().map(|s| s.0).collect();
        assert_eq!(
            methods,
            Method::ALL,
            "one row per catalogue entry, in order"
        );
        for (m, modern, legacy) in stated {
            assert_eq!(route(Some(m), Era::Modern, false), modern, "{}", m.wire());
            assert_eq!(route(Some(m), Era::Legacy, false), legacy, "{}", m.wire());
            let feedback = if m == Method::ToolsCall {
                FeedbackTool
            } else {
                modern
            };
            assert_eq!(route(Some(m), Era::Modern, true), feedback, "{}", m.wire());
        }
        assert_eq!(route(None, Era::Modern, false), Forward);
        assert_eq!(route(None, Era::Legacy, true), Forward);
    }
}
