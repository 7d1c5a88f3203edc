//! The one place that knows how to reach the upstream MCP server and in which era. `http` is
//! the raw hop (over `pool`, each worker's keep-alive connections; `stdio` for a child
//! process; `hop` chooses between them); `era` decides the upstream's era and gives a request
//! its one retry when the upstream changed era; `session` keeps a 2025-era upstream's
//! sessions; `translate` moves requests between the eras; `answer` reads what comes back and
//! finishes it for the client.

pub(crate) mod answer;
mod caller;
mod dns;
pub(crate) mod era;
mod hop;
pub(crate) mod http;
mod pool;
mod ready;
mod session;
mod stdio;
pub(crate) use self::stdio::exec;
pub(crate) mod translate;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ::http::{header, HeaderMap, HeaderValue, Response};
use bytes::Bytes;
use serde_json::{json, Value};

use self::answer::{read_answer, AnswerBounds, ReadAnswer};
pub(crate) use self::caller::{Caller, Client};
pub(crate) use self::era::Era;
use self::era::{is_final_refusal, supports_modern, Verdict};
use self::hop::Hop;
pub(crate) use self::hop::UpstreamBody;
use self::http::{HttpBounds, HttpUpstream};
use self::pool::IdleBound;
pub(crate) use self::ready::NotReady;
use self::session::{close_upstream, close_upstream_within, Sessions};
use self::stdio::{StdioBounds, StdioUpstream};
use self::translate::{discover_from_init, set_modern_headers, sidecar_info};
use crate::budget::MemoryBudget;
use crate::config::{Config, Transport};
use crate::error::{Error, Kind};
use crate::mcp::headers as mcp_headers;
use crate::mcp::version::{self, MODERN};
use crate::metrics::{method_label, LimitKind, MethodLabels, Metrics};

/// The longest shutdown waits for the upstream to close the 2025-era sessions.
const SESSION_CLOSE_AT_SHUTDOWN: std::time::Duration = std::time::Duration::from_secs(5);

/// Pages of `tools/list` the sidecar reads when it lists the tools itself.
const MAX_LIST_PAGES: usize = 20;

/// Headers the sidecar sets itself on every upstream MCP request.
const MCP_ROUTING: [&str; 5] = [
    mcp_headers::PROTOCOL_VERSION,
    mcp_headers::METHOD,
    mcp_headers::NAME,
    mcp_headers::SESSION_ID,
    "last-event-id",
];

/// The upstream's discovery, in the 2026 shape whatever its era.
pub(crate) struct Discovery {
    /// The `server/discover` result (or one built from the `initialize` result).
    pub(crate) result: Value,
}

/// A request sent upstream: the response head, and what the sidecar learned on the way.
pub(crate) struct Sent {
    pub(crate) response: Response<UpstreamBody>,
    pub(crate) era: Era,
    /// The upstream's identity from a 2025-era handshake (2026 results carry their own).
    pub(crate) server_info: Option<Value>,
}

/// What every worker must agree on about the upstream.
struct UpstreamCommon {
    verdict: Verdict,
    sessions: Sessions,
    /// The upstream's identity as last seen, for results that lack it.
    server_info: Mutex<Option<Value>>,
    counter: AtomicU64,
}

/// One worker's view of the upstream: its own connection pool (or the shared child process),
/// shared knowledge.
pub(crate) struct Upstream {
    hop: Hop,
    shared: Arc<UpstreamCommon>,
    bounds: AnswerBounds,
    metrics: Arc<Metrics>,
}

impl Upstream {
    pub(crate) fn new(
        config: &Config,
        budget: Arc<MemoryBudget>,
        metrics: Arc<Metrics>,
    ) -> Result<Self, Error> {
        let tls = crate::tls::client_config(&config.upstream_tls).map_err(|e| {
            Error::new(
                Kind::Internal,
                format!("the upstream TLS configuration: {e}"),
            )
        })?;
        let on_limit: Arc<dyn Fn(LimitKind) + Send + Sync> = {
            let metrics = metrics.clone();
            Arc::new(move |kind| metrics.limit(kind))
        };
        let hop = match &config.upstream {
            Transport::Http(target) => Hop::Http(HttpUpstream::new(
                target.clone(),
                Arc::new(tls),
                HttpBounds {
                    timeout: config.upstream_timeout,
                    idle: IdleBound {
                        max: config.limits.upstream_max_idle,
                        timeout: config.limits.upstream_idle_timeout,
                    },
                    max_connections: config.limits.upstream_max_connections,
                    wait: config.limits.upstream_wait,
                    on_limit: on_limit.clone(),
                    gauge: metrics.upstream_connections.clone(),
                },
            )),
            Transport::Stdio(command) => Hop::Stdio(StdioUpstream::start(
                command,
                StdioBounds {
                    timeout: config.upstream_timeout,
                    budget: budget.clone(),
                    max_line: config.limits.max_upstream_answer,
                    on_limit: on_limit.clone(),
                    wait: config.limits.upstream_wait,
                },
            )?),
        };
        Ok(Upstream {
            hop,
            shared: Arc::new(UpstreamCommon {
                verdict: Verdict::new(config.upstream_protocol),
                sessions: Sessions::new(
                    config.limits.upstream_sessions,
                    config.limits.upstream_session_idle,
                ),
                server_info: Mutex::new(None),
                counter: AtomicU64::new(0),
            }),
            bounds: AnswerBounds {
                budget,
                max_answer: config.limits.max_upstream_answer,
                max_event: config.limits.max_sse_event,
                timeout: config.upstream_timeout,
                on_limit,
            },
            metrics,
        })
    }

    /// The same upstream for another worker: its own pool, the same knowledge.
    pub(crate) fn for_worker(&self) -> Self {
        Upstream {
            hop: self.hop.for_worker(),
            shared: self.shared.clone(),
            bounds: self.bounds.clone(),
            metrics: self.metrics.clone(),
        }
    }

    pub(crate) fn bounds(&self) -> &AnswerBounds {
        &self.bounds
    }

    /// Closes upstream the sessions unused for the idle time (call now and then).
    pub(crate) fn sweep_sessions(&self) {
        close_upstream(&self.hop, self.shared.sessions.sweep());
        self.metrics
            .upstream_sessions
            .set(self.shared.sessions.len() as i64);
    }

    fn next_id(&self, what: &str) -> String {
        format!(
            "epode-sidecar-{what}-{}",
            self.shared.counter.fetch_add(1, Ordering::Relaxed)
        )
    }

    pub(crate) fn known_server_info(&self) -> Option<Value> {
        self.shared
            .server_info
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn remember_server_info(&self, info: Option<&Value>) {
        if let Some(info) = info.filter(|i| i.is_object()) {
            *self
                .shared
                .server_info
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(info.clone());
        }
    }

    /// Forgets what the sidecar knew of the upstream (it became unreachable, or changed era:
    /// it may come back as another build).
    pub(crate) fn forget(&self) {
        self.shared.verdict.forget();
        close_upstream(&self.hop, self.shared.sessions.clear());
    }

    /// Whether the upstream answered recently, or answers a POSTed `ping` now (a stdio
    /// child: whether it runs and answers); `Err` says why not.
    pub(crate) async fn ready(&self) -> Result<(), NotReady> {
        self.hop.ready().await
    }

    /// A client's message that needs no answer: its answer to a server request, or a
    /// `notifications/cancelled`. A stdio child is told (the sidecar routes them); an HTTP
    /// upstream has no session of the client's to tell, so nothing goes.
    pub(crate) async fn tell(&self, client: &Client<'_>, bytes: &Bytes) {
        if !self.hop.takes_client_notes() {
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
        let headers = self.hop.base_headers(client);
        if let Err(e) = self
            .hop
            .post(&client.caller, headers, bytes.clone(), None, true)
            .await
        {
            tracing::debug!(error = %e, "a client's message did not reach the upstream");
        }
    }

    /// Closes the 2025-era sessions still open (`DELETE`, within the upstream timeout, at
    /// most 5 s), then stops a stdio upstream's child process and waits until it is gone.
    pub(crate) async fn shutdown(&self) {
        let within = self.bounds.timeout.min(SESSION_CLOSE_AT_SHUTDOWN);
        close_upstream_within(&self.hop, self.shared.sessions.clear(), within).await;
        self.metrics.upstream_sessions.set(0);
        self.hop.shutdown().await;
    }

    /// The client's end-to-end headers for an upstream MCP request, without the routing
    /// headers the sidecar sets itself.
    fn base_headers(&self, client: &HeaderMap) -> HeaderMap {
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

    /// POSTs upstream; an unreachable upstream is forgotten (it may come back as another
    /// build). `answers`: the client may be sent the server's own requests.
    async fn post(
        &self,
        caller: &Caller,
        headers: HeaderMap,
        body: Bytes,
        query: Option<&str>,
        answers: bool,
    ) -> Result<Response<UpstreamBody>, Error> {
        let resp = self.hop.post(caller, headers, body, query, answers).await;
        if let Err(e) = &resp {
            if matches!(e.kind(), Kind::UpstreamUnreachable) {
                self.forget();
            }
        }
        resp
    }

    /// Sends one request and reads its answer whole.
    async fn exchange(
        &self,
        caller: &Caller,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<ReadAnswer, Error> {
        let resp = self.post(caller, headers, body, None, false).await?;
        read_answer(resp, &self.bounds).await
    }

    /// The era of the upstream, probing with `server/discover` (with the caller's
    /// credentials) when it is not known.
    pub(crate) async fn era(&self, client: &Client<'_>) -> Result<Era, Error> {
        if let Some(era) = self.shared.verdict.get() {
            return Ok(era);
        }
        Ok(self.discover(client, None).await?.0)
    }

    /// Discovery per request, which is also how the era is found: `server/discover` goes
    /// upstream with the client's credentials (`client_body` is a modern client's own
    /// `server/discover`, forwarded as it was); an upstream that does not speak 2026 gets a
    /// fresh `initialize` handshake instead. An upstream known to speak 2025 whose handshake
    /// is refused may have been redeployed as a 2026-only server: it is probed again.
    pub(crate) async fn discover(
        &self,
        client: &Client<'_>,
        client_body: Option<Bytes>,
    ) -> Result<(Era, Discovery), Error> {
        let cached = self.shared.verdict.get();
        if cached != Some(Era::Legacy) {
            if let Some(d) = self.probe_modern(client, client_body.clone()).await? {
                return Ok((Era::Modern, d));
            }
        }
        match self.handshake(client).await {
            Ok(session) => {
                self.shared.verdict.set(Era::Legacy);
                let result = discover_from_init(&session.init);
                Ok((Era::Legacy, Discovery { result }))
            }
            Err(e)
                if cached == Some(Era::Legacy)
                    && self.shared.verdict.is_auto()
                    && matches!(e.kind(), Kind::UpstreamRefused(a) if !is_final_refusal(a.status)) =>
            {
                self.forget();
                match self.probe_modern(client, client_body).await? {
                    Some(d) => Ok((Era::Modern, d)),
                    None => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// `server/discover` upstream: the discovery when the upstream speaks 2026-07-28, `None`
    /// when it does not, or the upstream's refusal (401, 5xx, …) to pass on.
    async fn probe_modern(
        &self,
        client: &Client<'_>,
        client_body: Option<Bytes>,
    ) -> Result<Option<Discovery>, Error> {
        let body = client_body.unwrap_or_else(|| {
            Bytes::from(
                json!({
                    "jsonrpc": "2.0",
                    "id": self.next_id("discover"),
                    "method": "server/discover",
                    "params": {"_meta": {
                        version::META_PROTOCOL_VERSION: MODERN,
                        version::META_CLIENT_CAPABILITIES: {},
                        version::META_CLIENT_INFO: sidecar_info(),
                    }},
                })
                .to_string(),
            )
        });
        let mut headers = self.base_headers(client);
        set_modern_headers(&mut headers, "server/discover", None);
        let answer = self.exchange(&client.caller, headers, body).await?;
        if let Some(result) = answer.result().filter(|r| supports_modern(r)).cloned() {
            self.shared.verdict.set(Era::Modern);
            self.remember_server_info(
                result
                    .get("_meta")
                    .and_then(|m| m.get(version::META_SERVER_INFO)),
            );
            return Ok(Some(Discovery { result }));
        }
        if is_final_refusal(answer.status()) || self.shared.verdict.fixed() == Some(Era::Modern) {
            return Err(answer.into_refusal());
        }
        Ok(None)
    }

    /// Sends a client's request in the upstream's era, translating it from the client's;
    /// when the upstream's refusal says it changed era, once more in the new one. A 2026
    /// upstream's 400 is read whole to tell an era change from a refusal to pass on.
    pub(crate) async fn forward(
        &self,
        client: &Client<'_>,
        query: Option<&str>,
        bytes: &Bytes,
        method: &str,
        modern_client: bool,
    ) -> Result<Sent, Error> {
        self.with_era_retry(client, |era| async move {
            match era {
                Era::Modern => {
                    let (body, headers) = if modern_client {
                        (bytes.clone(), self.base_headers_modern(client))
                    } else {
                        let (body, name) = translate::to_modern(bytes, method);
                        let mut headers = self.base_headers(client);
                        set_modern_headers(&mut headers, method, name.as_deref());
                        (body, headers)
                    };
                    let started = std::time::Instant::now();
                    let response = self
                        .post(&client.caller, headers, body, query, false)
                        .await?;
                    self.observe(method, started);
                    if response.status() == ::http::StatusCode::BAD_REQUEST {
                        return Err(read_answer(response, &self.bounds).await?.into_refusal());
                    }
                    Ok(Sent {
                        response,
                        era,
                        server_info: None,
                    })
                }
                Era::Legacy => {
                    let body = if modern_client {
                        translate::to_legacy(bytes)
                    } else {
                        bytes.clone()
                    };
                    let started = std::time::Instant::now();
                    let (response, session) =
                        self.send_legacy(client, body, !modern_client).await?;
                    self.observe(method, started);
                    Ok(Sent {
                        response,
                        era,
                        server_info: session.init.get("serverInfo").cloned(),
                    })
                }
            }
        })
        .await
    }

    fn observe(&self, method: &str, started: std::time::Instant) {
        self.metrics
            .upstream_seconds
            .get_or_create(&MethodLabels {
                method: method_label(method),
            })
            .observe(started.elapsed().as_secs_f64());
        self.metrics
            .upstream_sessions
            .set(self.shared.sessions.len() as i64);
    }

    /// A modern client's headers for a modern upstream: its routing headers were validated
    /// against the body, so they go as they are (less any session id).
    fn base_headers_modern(&self, client: &HeaderMap) -> HeaderMap {
        let mut headers = self.hop.base_headers(client);
        headers.remove(mcp_headers::SESSION_ID);
        headers
    }

    /// Lists the upstream's tools (every page, with the calling request's credentials): each
    /// name and whether it declares an `outputSchema`. Failures end the listing early.
    pub(crate) async fn list_tools(&self, client: &Client<'_>) -> Vec<(String, bool)> {
        let mut tools = Vec::new();
        let mut cursor: Option<Value> = None;
        for _ in 0..MAX_LIST_PAGES {
            let mut params = json!({});
            if let Some(c) = cursor.take() {
                params["cursor"] = c;
            }
            let body = json!({"jsonrpc": "2.0", "id": self.next_id("tools"), "method": "tools/list", "params": params});
            let Ok(sent) = self
                .forward(
                    client,
                    None,
                    &Bytes::from(body.to_string()),
                    "tools/list",
                    false,
                )
                .await
            else {
                break;
            };
            let Ok(answer) = read_answer(sent.response, &self.bounds).await else {
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
