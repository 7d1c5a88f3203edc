//! The method table: for each validated request, what is answered here, what is translated,
//! and what is forwarded. Local: `server/discover` (the upstream's, merged with the feedback
//! rule), `initialize` for 2025 clients, `ping` and `subscriptions/listen` where the upstream's
//! era has none, and the two feedback tools. Rewritten: `tools/list` and product `tools/call`.
//! Everything else goes to the upstream in its era and comes back in the client's.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http::{header, HeaderValue, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Incoming;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use crate::binding::FeedbackBinding;
use crate::body::{self, Body, BoxError};
use crate::config::Config;
use crate::error::{Error, Kind, Side};
use crate::frontdoor::{self, Request};
use crate::mcp::raw::{self, raw};
use crate::mcp::rewrite::{Abandoned, ResultPlan};
use crate::mcp::version::{self, LEGACY_LATEST};
use crate::upstream::answer;
use crate::upstream::{Era, Upstream};

/// Comment lines on a listen stream the sidecar serves itself, so idle connections stay open.
const LISTEN_KEEPALIVE: Duration = Duration::from_secs(15);

/// One worker's request path: the configuration, its view of the upstream, the binding.
pub(crate) struct Dispatcher {
    config: Arc<Config>,
    upstream: Upstream,
    binding: Arc<FeedbackBinding>,
}

impl Dispatcher {
    /// Builds the request path; with feedback on, this starts the telemetry task, so it must
    /// run inside the runtime.
    pub(crate) fn new(config: Arc<Config>) -> Result<Self, Error> {
        let binding = FeedbackBinding::new(config.feedback.clone())?;
        Ok(Dispatcher {
            upstream: Upstream::new(&config),
            config,
            binding,
        })
    }

    /// The same request path for another worker (its own upstream connection pool).
    pub(crate) fn for_worker(&self) -> Self {
        Dispatcher {
            config: self.config.clone(),
            upstream: self.upstream.for_worker(),
            binding: self.binding.clone(),
        }
    }

    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    pub(crate) fn binding(&self) -> &FeedbackBinding {
        &self.binding
    }

    /// Whether the upstream answers (readiness).
    pub(crate) async fn ready(&self) -> bool {
        self.upstream.ready().await
    }

    /// One message to the MCP path, from the front door to the answer.
    pub(crate) async fn mcp(
        &self,
        req: http::Request<Incoming>,
        abandoned: Abandoned,
    ) -> Response<Body> {
        let (parts, body) = req.into_parts();
        if let Err(e) = frontdoor::check_head(&self.config, &parts) {
            tracing::warn!(error = %e, "refused at the front door");
            return e.into_response(None);
        }
        let bytes = match frontdoor::read_body(&parts, body, self.config.max_body_bytes).await {
            Ok(b) => b,
            Err(e) => return e.into_response(None),
        };
        let request = match frontdoor::admit(&parts, &bytes) {
            Ok(Some(r)) => r,
            Ok(None) => {
                let mut resp = Response::new(body::empty());
                *resp.status_mut() = StatusCode::ACCEPTED;
                return resp;
            }
            Err((e, id)) => {
                tracing::debug!(error = %e, "refused at the front door");
                return e.into_response(id);
            }
        };
        match self.dispatch(&request, abandoned).await {
            Ok(resp) => resp,
            Err(e) => {
                let side = e.side().as_str();
                match e.side() {
                    Side::Client => tracing::debug!(error = %e, side, "request refused"),
                    _ => {
                        tracing::warn!(error = %e, side, retryable = e.retryable(), "request failed")
                    }
                }
                e.into_response(Some(request.id))
            }
        }
    }

    async fn dispatch(
        &self,
        req: &Request<'_>,
        abandoned: Abandoned,
    ) -> Result<Response<Body>, Error> {
        let method = req.method();
        let modern = req.era.is_modern();
        let client = &req.parts.headers;
        let feedback_tool = method == "tools/call"
            && req
                .env
                .name()
                .is_some_and(|n| self.binding.is_local_tool(&n));
        let plan = self.plan(method, modern, abandoned);
        match route(method, modern, feedback_tool) {
            Route::Removed => Err(Error::new(
                Kind::MethodNotFound {
                    method: method.to_owned(),
                },
                "",
            )),
            Route::Discover => self.discover(req, plan).await,
            Route::Initialize => self.initialize(req).await,
            Route::Ping if self.upstream.era(client).await? == Era::Modern => {
                Ok(local_result(req.id, json!({}), plan))
            }
            Route::Listen if self.upstream.era(client).await? == Era::Legacy => {
                Ok(local_listen(req.id))
            }
            Route::FeedbackTool => self.feedback_tool(req, plan).await,
            Route::ToolCall => self.tool_call(req, plan).await,
            Route::ToolList => {
                let mut plan = plan;
                plan.hook = self.binding.list_hook();
                self.forward(req, plan).await
            }
            Route::Ping | Route::Listen | Route::Forward => self.forward(req, plan).await,
        }
    }

    /// What a response gets besides its hook: for a 2026 client, the server identity and,
    /// on cacheable methods, the configured cache hints.
    fn plan(&self, method: &str, modern: bool, abandoned: Abandoned) -> ResultPlan {
        let mut plan = ResultPlan::new(method, modern, abandoned);
        if modern {
            let (info, force) = self.server_info(None);
            plan.server_info = info;
            plan.force_server_info = force;
            if version::is_cacheable(method) {
                plan.cache = Some((self.config.cache_ttl_ms, self.config.cache_scope));
            }
        }
        plan
    }

    /// The identity clients see: the upstream's, with the configured name/version over it;
    /// and whether it is forced over what results carry.
    fn server_info(&self, upstream_info: Option<Value>) -> (Option<Value>, bool) {
        let (name, ver) = (&self.config.server_name, &self.config.server_version);
        let base = upstream_info.or_else(|| self.upstream.known_server_info());
        if name.is_none() && ver.is_none() {
            return (base, false);
        }
        let mut info = base
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({"name": "mcp-server", "version": "0"}));
        if let Some(n) = name {
            info["name"] = Value::from(n.as_str());
        }
        if let Some(v) = ver {
            info["version"] = Value::from(v.as_str());
        }
        (Some(info), true)
    }

    /// `server/discover`: the upstream's discovery (its own, or one built from its 2025
    /// handshake), with the feedback rule.
    async fn discover(&self, req: &Request<'_>, plan: ResultPlan) -> Result<Response<Body>, Error> {
        let (_, discovery) = self
            .upstream
            .discover(&req.parts.headers, Some(req.bytes.clone()))
            .await?;
        let result = self.binding.with_instructions(discovery.result);
        Ok(local_result(req.id, result, plan))
    }

    /// A 2025-era `initialize`, answered per request from the upstream's discovery: no
    /// session id, the client's version when it is one the sidecar serves.
    async fn initialize(&self, req: &Request<'_>) -> Result<Response<Body>, Error> {
        let (_, discovery) = self.upstream.discover(&req.parts.headers, None).await?;
        let discover = self.binding.with_instructions(discovery.result);
        let requested = req.env.params.protocol_version.and_then(raw::as_str);
        let protocol = requested
            .as_deref()
            .filter(|v| version::is_legacy(v))
            .unwrap_or(LEGACY_LATEST);
        let upstream_info = discover
            .get("_meta")
            .and_then(|m| m.get(version::META_SERVER_INFO))
            .cloned();
        let (info, _) = self.server_info(upstream_info);
        let mut r = Map::new();
        r.insert("protocolVersion".into(), Value::from(protocol));
        r.insert(
            "capabilities".into(),
            discover
                .get("capabilities")
                .cloned()
                .unwrap_or_else(|| json!({})),
        );
        r.insert(
            "serverInfo".into(),
            info.unwrap_or_else(|| json!({"name": "mcp-server", "version": "0"})),
        );
        if let Some(i) = discover.get("instructions").filter(|i| i.is_string()) {
            r.insert("instructions".into(), i.clone());
        }
        let msg = raw::result_message(req.id, raw(&r));
        Ok(body::json(StatusCode::OK, raw::to_bytes(&msg)))
    }

    /// One of the two feedback tools, answered here.
    async fn feedback_tool(
        &self,
        req: &Request<'_>,
        plan: ResultPlan,
    ) -> Result<Response<Body>, Error> {
        let name = req.env.name().unwrap_or_default();
        let args = req
            .env
            .params
            .arguments
            .and_then(|a| serde_json::from_str(a.get()).ok())
            .unwrap_or_else(|| json!({}));
        let result = self.binding.call_local(&name, &args).await;
        Ok(local_result(req.id, result, plan))
    }

    /// A product `tools/call`: upstream with the binding's hook (the catalog learns the
    /// upstream's tools first when it has not seen this one listed).
    async fn tool_call(
        &self,
        req: &Request<'_>,
        mut plan: ResultPlan,
    ) -> Result<Response<Body>, Error> {
        let name = req.env.name().unwrap_or_default();
        if self.binding.needs_listing(&name) {
            let tools = self.upstream.list_tools(&req.parts.headers).await;
            self.binding.learn(tools);
        }
        plan.hook = Some(self.binding.call_hook(&name, &req.parts.headers));
        self.forward(req, plan).await
    }

    /// Sends the request upstream in its era and finishes its answer for the client.
    async fn forward(
        &self,
        req: &Request<'_>,
        mut plan: ResultPlan,
    ) -> Result<Response<Body>, Error> {
        let method = req.method();
        let modern = req.era.is_modern();
        let sent = self
            .upstream
            .forward(
                &req.parts.headers,
                req.parts.uri.query(),
                req.bytes,
                method,
                modern,
            )
            .await?;
        if method == "subscriptions/listen" {
            return Ok(answer::stream_back(sent.response));
        }
        if modern && !plan.force_server_info && sent.server_info.is_some() {
            plan.server_info = sent.server_info;
        }
        let fix_status = modern && sent.era == Era::Legacy;
        answer::finish(
            sent.response,
            req.id,
            plan,
            fix_status,
            self.upstream.timeout(),
        )
        .await
    }
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

/// The method table.
fn route(method: &str, modern: bool, feedback_tool: bool) -> Route {
    match method {
        m if modern && version::REMOVED_IN_MODERN.contains(&m) => Route::Removed,
        "server/discover" if modern => Route::Discover,
        "initialize" => Route::Initialize,
        "ping" => Route::Ping,
        "subscriptions/listen" => Route::Listen,
        "tools/call" if feedback_tool => Route::FeedbackTool,
        "tools/call" => Route::ToolCall,
        "tools/list" => Route::ToolList,
        _ => Route::Forward,
    }
}

/// A result the sidecar made, through the plan (for the client's era and the hook).
fn local_result(id: &RawValue, result: Value, mut plan: ResultPlan) -> Response<Body> {
    let mut msg = raw::result_message(id, raw(&result));
    plan.apply(&mut msg);
    body::json(StatusCode::OK, raw::to_bytes(&msg))
}

/// A `subscriptions/listen` stream for a 2025-era upstream: acknowledged with no
/// notification types honoured (the sidecar has no session stream to relay them from), then
/// kept open with comments until the client leaves.
fn local_listen(id: &RawValue) -> Response<Body> {
    let ack = format!(
        r#"{{"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged","params":{{"notifications":{{}},"_meta":{{"io.modelcontextprotocol/subscriptionId":{}}}}}}}"#,
        id.get()
    );
    let first = Bytes::from(format!("event: message\ndata: {ack}\n\n"));
    let s = stream::unfold(Some(first), |first| async move {
        match first {
            Some(b) => Some((Ok::<_, BoxError>(Frame::data(b)), None)),
            None => {
                tokio::time::sleep(LISTEN_KEEPALIVE).await;
                Some((
                    Ok(Frame::data(Bytes::from_static(b": keep-alive\n\n"))),
                    None,
                ))
            }
        }
    });
    let mut resp = Response::new(StreamBody::new(s).boxed_unsync());
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_method_table() {
        let modern = |m| route(m, true, false);
        let legacy = |m| route(m, false, false);
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
        assert_eq!(legacy("logging/setLevel"), Route::Forward);
        assert_eq!(modern("subscriptions/listen"), Route::Listen);
        assert_eq!(modern("tools/call"), Route::ToolCall);
        assert_eq!(route("tools/call", false, true), Route::FeedbackTool);
        assert_eq!(route("tools/list", true, true), Route::ToolList);
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
}
