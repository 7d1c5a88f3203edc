//! One request's journey through the sidecar, top to bottom: front-door checks, era
//! classification and validation, the dispatch table (what is answered locally, what is
//! translated, what is forwarded), then the upstream's answer rewritten for the client's era
//! and streamed back.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http::request::Parts;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Limited, StreamBody};
use hyper::body::Incoming;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use crate::body::{empty, full, Body, BoxError};
use crate::config::Config;
use crate::epode::telemetry::Counters;
use crate::error::ProxyError;
use crate::feedback::binding::FeedbackBinding;
use crate::frontdoor;
use crate::mcp::classify::{classify, ClientEra};
use crate::mcp::headers as mcp_headers;
use crate::mcp::message::{self, Envelope, Inbound};
use crate::mcp::rewrite::{self, RawMap, ResultPlan};
use crate::mcp::sse;
use crate::mcp::version::{self, LEGACY_LATEST, MODERN};
use crate::upstream::{
    self, is_event_stream, set_modern_headers, Early, Era, HttpUpstream, Upstream,
    MAX_UPSTREAM_BODY,
};

/// How recently the upstream must have answered for `/readyz` to say ready without a probe.
const READY_WINDOW: Duration = Duration::from_secs(10);
/// Comment lines on a listen stream the sidecar serves itself, so idle connections stay open.
const LISTEN_KEEPALIVE: Duration = Duration::from_secs(15);

pub struct Sidecar {
    pub config: Arc<Config>,
    pub upstream: Upstream,
    pub feedback: Arc<FeedbackBinding>,
}

impl Sidecar {
    /// Builds the sidecar; with feedback on, this starts the telemetry task, so it must run
    /// inside the runtime.
    pub fn new(config: Arc<Config>) -> Result<Self, String> {
        let http = HttpUpstream::new(
            config.upstream.clone(),
            config.upstream_timeout,
            config.workers,
        );
        let upstream = Upstream::new(http, config.upstream_protocol);
        let feedback = FeedbackBinding::new(config.feedback.clone())?;
        Ok(Sidecar {
            config,
            upstream,
            feedback,
        })
    }

    /// Flushes queued telemetry within the configured deadline; returns the events lost.
    pub async fn shutdown(&self) -> u64 {
        match self.feedback.telemetry() {
            Some(t) => {
                let lost = t.shutdown(self.config.feedback.telemetry_shutdown).await;
                let c = &t.counters;
                tracing::info!(
                    delivered = Counters::get(&c.delivered),
                    lost,
                    "telemetry flushed"
                );
                lost
            }
            None => 0,
        }
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
            (&Method::GET, "/metrics") => self.metrics(),
            _ => json_response(
                StatusCode::NOT_FOUND,
                r#"{"error":"not found: MCP clients post to the configured path"}"#,
            ),
        }
    }

    /// Counters in the Prometheus text format.
    fn metrics(&self) -> Response<Body> {
        let mut out = String::new();
        if let Some(t) = self.feedback.telemetry() {
            let c = &t.counters;
            let rows: [(&str, &str, u64); 5] = [
                (
                    "epode_sidecar_telemetry_enqueued_total",
                    "counter",
                    Counters::get(&c.enqueued),
                ),
                (
                    "epode_sidecar_telemetry_delivered_total",
                    "counter",
                    Counters::get(&c.delivered),
                ),
                (
                    "epode_sidecar_telemetry_retries_total",
                    "counter",
                    Counters::get(&c.retried),
                ),
                (
                    "epode_sidecar_telemetry_queue_depth",
                    "gauge",
                    t.depth() as u64,
                ),
                (
                    "epode_sidecar_telemetry_deliveries_in_flight",
                    "gauge",
                    Counters::get(&c.deliveries_in_flight),
                ),
            ];
            for (name, kind, v) in rows {
                out.push_str(&format!("# TYPE {name} {kind}\n{name} {v}\n"));
            }
            out.push_str("# TYPE epode_sidecar_telemetry_dropped_total counter\n");
            for (reason, v) in [
                ("queue_full", &c.dropped_queue_full),
                ("invalid", &c.dropped_invalid),
                ("epode_dropped", &c.dropped_by_epode),
                ("rejected", &c.dropped_rejected),
                ("retries_exhausted", &c.dropped_retries_exhausted),
                ("shutdown", &c.dropped_at_shutdown),
            ] {
                out.push_str(&format!(
                    "epode_sidecar_telemetry_dropped_total{{reason=\"{reason}\"}} {}\n",
                    Counters::get(v)
                ));
            }
        }
        let mut resp = Response::new(full(out));
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        );
        resp
    }

    async fn readyz(&self) -> Response<Body> {
        let http = &self.upstream.http;
        if http.answered_within(READY_WINDOW) || http.probe().await {
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
        if parts.method != Method::POST {
            return ProxyError::MethodNotAllowed(format!(
                "{} is not served: this MCP endpoint is stateless; POST one JSON-RPC message per request",
                parts.method
            ))
            .into_response(None);
        }
        let bytes = match frontdoor::read_body(&parts, body, self.config.max_body_bytes).await {
            Ok(b) => b,
            Err(e) => return e.into_response(None),
        };
        let env = match message::parse(&bytes) {
            Ok(Inbound::Single(env)) => env,
            Ok(Inbound::Batch) => {
                return ProxyError::InvalidRequest(
                    "JSON-RPC batches are not supported; send one message per POST".to_owned(),
                )
                .into_response(None)
            }
            Err((e, id)) => return e.into_response(id),
        };
        let id = env.id;
        if env.method.is_none() {
            // A 2025-era client may post a response to a server request; with no sessions
            // there is nothing it can answer, so it is accepted and dropped.
            return accepted();
        }
        let era = match classify(&parts.headers, &env) {
            Ok(era) => era,
            Err(e) => {
                tracing::debug!(error = %e, "refused by the validation ladder");
                return e.into_response(id);
            }
        };
        let Some(id) = id else {
            // 2026 defines no client notifications over HTTP; 2025's (initialized,
            // cancelled) mean nothing to a stateless front.
            return accepted();
        };
        match self.dispatch(&parts, &bytes, &env, id, era).await {
            Ok(resp) => resp,
            Err(Early::PassThrough(answer)) => answer.into_response(),
            Err(Early::Error(e)) => {
                tracing::warn!(error = %e, "request failed");
                e.into_response(Some(id))
            }
        }
    }

    /// The dispatch table. Everything not named here is forwarded in the upstream's era.
    async fn dispatch(
        &self,
        parts: &Parts,
        bytes: &Bytes,
        env: &Envelope<'_>,
        id: &RawValue,
        era: ClientEra,
    ) -> Result<Response<Body>, Early> {
        let method = env.method.as_deref().unwrap_or_default();
        let client = &parts.headers;
        let modern_client = era.is_modern();
        if modern_client && version::REMOVED_IN_MODERN.contains(&method) {
            return Err(ProxyError::MethodNotFound(method.to_owned()).into());
        }
        match method {
            "server/discover" if modern_client => {
                let discovery = self.upstream.discover(client, Some(bytes.clone())).await?;
                let result = self.with_feedback_instructions(discovery.result);
                let mut msg = raw_message(&result_message(id, result));
                self.plan(method, true).apply(&mut msg);
                return Ok(json_bytes(rewrite::to_bytes(&msg)));
            }
            "initialize" if !modern_client => {
                let discovery = self.upstream.discover(client, None).await?;
                let discover = self.with_feedback_instructions(discovery.result);
                let requested = env.params.protocol_version.and_then(message::as_str);
                let result = self.initialize_result(&discover, requested.as_deref());
                return Ok(json_message(&result_message(id, result)));
            }
            "ping" if !modern_client && self.upstream.era(client).await? == Era::Modern => {
                return Ok(json_message(&result_message(id, json!({}))));
            }
            "subscriptions/listen" if self.upstream.era(client).await? == Era::Legacy => {
                return Ok(local_listen(id));
            }
            "tools/call" => {
                let name = env.name().unwrap_or_default();
                if self.feedback.is_local_tool(&name) {
                    let args = env
                        .params
                        .arguments
                        .and_then(|a| serde_json::from_str(a.get()).ok())
                        .unwrap_or_else(|| json!({}));
                    let result = self.feedback.call_local(&name, &args).await;
                    let mut msg = raw_message(&result_message(id, result));
                    self.plan(method, modern_client).apply(&mut msg);
                    return Ok(json_bytes(rewrite::to_bytes(&msg)));
                }
                if self.feedback.needs_listing(&name) {
                    self.learn_tools(client).await;
                }
                let mut plan = self.plan(method, modern_client);
                plan.hook = Some(
                    self.feedback
                        .call_hook(&name, self.feedback.header_refs(client)),
                );
                return self.forward(parts, bytes, id, method, plan).await;
            }
            "tools/list" => {
                let mut plan = self.plan(method, modern_client);
                if self.feedback.enabled() {
                    plan.hook = Some(self.feedback.list_hook());
                }
                return self.forward(parts, bytes, id, method, plan).await;
            }
            _ => {}
        }
        let plan = self.plan(method, modern_client);
        self.forward(parts, bytes, id, method, plan).await
    }

    /// The discovery with the feedback rule near the start of its instructions, and the
    /// `tools` capability the feedback tools need.
    fn with_feedback_instructions(&self, mut discover: Value) -> Value {
        if !self.feedback.enabled() {
            return discover;
        }
        let upstream = discover
            .get("instructions")
            .and_then(Value::as_str)
            .map(str::to_owned);
        if let (Some(obj), Some(text)) = (
            discover.as_object_mut(),
            self.feedback.instructions(upstream.as_deref()),
        ) {
            obj.insert("instructions".into(), Value::from(text));
            let caps = obj.entry("capabilities").or_insert_with(|| json!({}));
            if let Some(caps) = caps.as_object_mut() {
                caps.entry("tools").or_insert_with(|| json!({}));
            }
        }
        discover
    }

    /// Lists the upstream's tools (every page, with the calling request's credentials) so the
    /// catalog knows which declare an `outputSchema`. Failures leave the catalog as it was.
    async fn learn_tools(&self, client: &HeaderMap) {
        let Ok(era) = self.upstream.era(client).await else {
            return;
        };
        let mut cursor: Option<Value> = None;
        for page in 0..20 {
            let mut params = json!({});
            if let Some(c) = cursor.take() {
                params["cursor"] = c;
            }
            let sent = match era {
                Era::Modern => {
                    let mut p = params.clone();
                    p["_meta"] = json!({
                        version::META_PROTOCOL_VERSION: MODERN,
                        version::META_CLIENT_CAPABILITIES: {},
                    });
                    let body = json!({"jsonrpc": "2.0", "id": format!("epode-sidecar-tools-{page}"), "method": "tools/list", "params": p});
                    let mut headers = self.upstream.base_headers(client);
                    set_modern_headers(&mut headers, "tools/list", None);
                    self.upstream
                        .send_modern(headers, Bytes::from(body.to_string()), None)
                        .await
                        .map_err(Early::from)
                }
                Era::Legacy => {
                    let body = json!({"jsonrpc": "2.0", "id": format!("epode-sidecar-tools-{page}"), "method": "tools/list", "params": params});
                    self.upstream
                        .send_legacy(client, Bytes::from(body.to_string()))
                        .await
                        .map(|(r, _)| r)
                }
            };
            let Ok(resp) = sent else { return };
            let Ok(answer) = upstream::read_answer(resp, self.upstream.http.timeout()).await else {
                return;
            };
            let Some(result) = answer.result() else {
                return;
            };
            let tools = result
                .get("tools")
                .and_then(Value::as_array)
                .into_iter()
                .flatten();
            self.feedback.catalog.learn(tools.filter_map(|t| {
                let name = t.get("name")?.as_str()?.to_owned();
                Some((name, t.get("outputSchema").is_some()))
            }));
            match result.get("nextCursor") {
                Some(c) if !c.is_null() => cursor = Some(c.clone()),
                _ => return,
            }
        }
    }

    /// Sends a request upstream in the upstream's era, translating it from the client's. When
    /// the upstream's refusal says it now speaks the other era (a redeploy), the sidecar
    /// forgets what it knew and tries once more.
    async fn forward(
        &self,
        parts: &Parts,
        bytes: &Bytes,
        id: &RawValue,
        method: &str,
        mut plan: ResultPlan,
    ) -> Result<Response<Body>, Early> {
        let client = &parts.headers;
        let query = parts.uri.query();
        let modern_client = plan.modern_client;
        for attempt in 0..2 {
            let era = self.upstream.era(client).await?;
            let sent = match (era, modern_client) {
                (Era::Modern, true) => {
                    let mut headers = self.upstream.http.base_headers(client);
                    headers.remove(mcp_headers::SESSION_ID);
                    self.upstream
                        .send_modern(headers, bytes.clone(), query)
                        .await
                        .map(|r| (r, None))
                        .map_err(Early::from)
                }
                (Era::Modern, false) => {
                    let (body, name) = translate_to_modern(bytes, method);
                    let mut headers = self.upstream.base_headers(client);
                    set_modern_headers(&mut headers, method, name.as_deref());
                    self.upstream
                        .send_modern(headers, body, query)
                        .await
                        .map(|r| (r, None))
                        .map_err(Early::from)
                }
                (Era::Legacy, _) => {
                    let body = if modern_client {
                        translate_to_legacy(bytes)
                    } else {
                        bytes.clone()
                    };
                    self.upstream
                        .send_legacy(client, body)
                        .await
                        .map(|(r, s)| (r, s.init.get("serverInfo").cloned()))
                }
            };
            let (resp, info) = match sent {
                Err(Early::PassThrough(answer))
                    if attempt == 0 && upstream::signals_era_change(&answer, era) =>
                {
                    tracing::info!("the upstream's answer says it changed era; checking again");
                    self.upstream.forget();
                    continue;
                }
                Err(e) => {
                    plan.failed();
                    return Err(e);
                }
                Ok(ok) => ok,
            };
            if era == Era::Modern && resp.status() == StatusCode::BAD_REQUEST {
                let answer = upstream::read_answer(resp, self.upstream.http.timeout()).await?;
                if attempt == 0 && upstream::signals_era_change(&answer, era) {
                    tracing::info!("the upstream's answer says it changed era; checking again");
                    self.upstream.forget();
                    continue;
                }
                plan.failed();
                return Ok(answer.into_response());
            }
            if method == "subscriptions/listen" {
                return Ok(stream_back(resp));
            }
            if modern_client && !plan.force_server_info && info.is_some() {
                plan.server_info = info;
            }
            let fix_status = modern_client && era == Era::Legacy;
            return Ok(self.finish(resp, id, plan, fix_status).await);
        }
        plan.failed();
        Err(Early::Error(ProxyError::UpstreamFailed(
            "the upstream changed protocol era twice in one request".to_owned(),
        )))
    }

    /// The identity clients see: the upstream's, with the configured name/version over it.
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

    fn plan(&self, method: &str, modern_client: bool) -> ResultPlan {
        let mut plan = ResultPlan::new(method, modern_client);
        if modern_client {
            let (info, force) = self.server_info(None);
            plan.server_info = info;
            plan.force_server_info = force;
            if version::is_cacheable(method) {
                plan.cache = Some((self.config.cache_ttl_ms, self.config.cache_scope.clone()));
            }
        }
        plan
    }

    /// A 2025-era `initialize` result from the upstream's discovery, minted per request:
    /// no session id, the client's version when it is one the sidecar serves.
    fn initialize_result(&self, discover: &Value, requested: Option<&str>) -> Value {
        let protocol = requested
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
        Value::Object(r)
    }

    /// The upstream's answer for the client: error statuses as they were; a JSON result
    /// rewritten whole; an SSE stream event by event, only the response event rewritten.
    /// `fix_status`: the upstream speaks 2025 and the client 2026, so a JSON-RPC error the
    /// upstream sent with 200 gets the status 2026 gives it (404 for an unknown method).
    async fn finish(
        &self,
        resp: Response<Incoming>,
        id: &RawValue,
        mut plan: ResultPlan,
        fix_status: bool,
    ) -> Response<Body> {
        let (mut parts, mut body) = resp.into_parts();
        parts.headers.remove(mcp_headers::SESSION_ID);
        if !parts.status.is_success() || parts.status == StatusCode::ACCEPTED {
            if !parts.status.is_success() {
                plan.failed();
            }
            return Response::from_parts(parts, body.map_err(Into::into).boxed_unsync());
        }
        if is_event_stream(&parts.headers) {
            parts.headers.remove(header::CONTENT_LENGTH);
            parts
                .headers
                .insert("x-accel-buffering", HeaderValue::from_static("no"));
            let mut read = Bytes::new();
            if fix_status {
                // The status goes out with the head, so wait for the first event: when it is
                // already the (error) response, answer it as JSON with its status.
                match sse::peek_first_message(&mut body).await {
                    Ok((bytes, first)) => {
                        let msg = first
                            .as_deref()
                            .and_then(sse::event_data)
                            .and_then(|d| rewrite::parse_message(d.as_bytes()))
                            .filter(rewrite::is_response);
                        if let Some(status) = msg.as_ref().and_then(rewrite::modern_error_status) {
                            let mut resp = json_bytes(rewrite::to_bytes(&msg.unwrap_or_default()));
                            *resp.status_mut() = status;
                            return resp;
                        }
                        read = bytes;
                    }
                    Err(e) => {
                        plan.failed();
                        return ProxyError::UpstreamFailed(format!("reading the answer: {e}"))
                            .into_response(Some(id));
                    }
                }
            }
            let body = sse::rewrite_stream_after(
                read,
                body,
                Some(id.to_owned()),
                move |m: &mut RawMap| plan.apply(m),
            );
            return Response::from_parts(parts, body);
        }
        let timeout = self.upstream.http.timeout();
        let collected =
            tokio::time::timeout(timeout, Limited::new(body, MAX_UPSTREAM_BODY).collect()).await;
        let bytes = match collected {
            Ok(Ok(c)) => c.to_bytes(),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "reading the upstream's answer failed");
                plan.failed();
                return ProxyError::UpstreamFailed(format!("reading the answer: {e}"))
                    .into_response(Some(id));
            }
            Err(_) => {
                plan.failed();
                return ProxyError::UpstreamTimeout(timeout).into_response(Some(id));
            }
        };
        parts.headers.remove(header::CONTENT_LENGTH);
        let out = match rewrite::parse_message(&bytes) {
            Some(mut msg) if rewrite::is_response(&msg) || msg.contains_key("method") => {
                if let Some(status) = modern_status(fix_status, &msg) {
                    parts.status = status;
                }
                if plan.apply(&mut msg) {
                    rewrite::to_bytes(&msg)
                } else {
                    bytes
                }
            }
            _ => bytes,
        };
        Response::from_parts(parts, full(out))
    }
}

fn modern_status(fix_status: bool, msg: &RawMap) -> Option<StatusCode> {
    fix_status
        .then(|| rewrite::modern_error_status(msg))
        .flatten()
}

/// A modern request for a 2025-era upstream: the 2026 envelope keys leave `params._meta`
/// (the rest, such as `progressToken`, stays).
fn translate_to_legacy(bytes: &Bytes) -> Bytes {
    let Ok(mut msg) = serde_json::from_slice::<Value>(bytes) else {
        return bytes.clone();
    };
    let Some(params) = msg.get_mut("params").and_then(Value::as_object_mut) else {
        return bytes.clone();
    };
    if let Some(Value::Object(meta)) = params.get_mut("_meta") {
        for key in version::ENVELOPE_KEYS {
            meta.remove(key);
        }
        if meta.is_empty() {
            params.remove("_meta");
        }
    }
    Bytes::from(msg.to_string())
}

/// A 2025-era request for a 2026-07-28 upstream: the `_meta` envelope added (the client's
/// capabilities were told to `initialize`, which the sidecar does not keep: none are claimed),
/// and the name the `Mcp-Name` header must mirror.
fn translate_to_modern(bytes: &Bytes, method: &str) -> (Bytes, Option<String>) {
    let Ok(mut msg) = serde_json::from_slice::<Value>(bytes) else {
        return (bytes.clone(), None);
    };
    let Some(obj) = msg.as_object_mut() else {
        return (bytes.clone(), None);
    };
    let params = obj.entry("params").or_insert_with(|| json!({}));
    let name_key = match method {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        _ => None,
    };
    let name = name_key
        .and_then(|k| params.get(k))
        .and_then(Value::as_str)
        .map(str::to_owned);
    if let Some(p) = params.as_object_mut() {
        let meta = p.entry("_meta").or_insert_with(|| json!({}));
        if let Some(m) = meta.as_object_mut() {
            m.insert(version::META_PROTOCOL_VERSION.into(), Value::from(MODERN));
            m.entry(version::META_CLIENT_CAPABILITIES)
                .or_insert_with(|| json!({}));
            m.entry(version::META_CLIENT_INFO)
                .or_insert_with(upstream::sidecar_info);
        }
    }
    (Bytes::from(msg.to_string()), name)
}

/// A `subscriptions/listen` stream for a 2025-era upstream: acknowledged with no
/// notification types honoured (the sidecar has no session stream to relay them from), then
/// kept open with comments until the client leaves.
fn local_listen(id: &RawValue) -> Response<Body> {
    let ack = json!({
        "jsonrpc": "2.0",
        "method": "notifications/subscriptions/acknowledged",
        "params": {
            "notifications": {},
            "_meta": {"io.modelcontextprotocol/subscriptionId": serde_json::from_str::<Value>(id.get()).unwrap_or(Value::Null)},
        },
    });
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

fn result_message(id: &RawValue, result: Value) -> Value {
    let id: Value = serde_json::from_str(id.get()).unwrap_or(Value::Null);
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

fn raw_message(msg: &Value) -> RawMap {
    rewrite::parse_message(msg.to_string().as_bytes()).unwrap_or_default()
}

fn json_message(msg: &Value) -> Response<Body> {
    json_bytes(Bytes::from(msg.to_string()))
}

fn json_bytes(bytes: Bytes) -> Response<Body> {
    let mut resp = Response::new(full(bytes));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// The upstream's response as is (minus its session id), streamed frame by frame.
fn stream_back(resp: Response<Incoming>) -> Response<Body> {
    let (mut parts, body) = resp.into_parts();
    parts.headers.remove(mcp_headers::SESSION_ID);
    Response::from_parts(parts, body.map_err(Into::into).boxed_unsync())
}

fn accepted() -> Response<Body> {
    let mut resp = Response::new(empty());
    *resp.status_mut() = StatusCode::ACCEPTED;
    resp
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
