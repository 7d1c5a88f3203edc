//! Reaching the upstream MCP server in whichever era it speaks. `http` is the raw hop; this
//! module decides the upstream's era (probing with `server/discover`, falling back to the
//! `initialize` handshake), keeps a 2025-era upstream's session per client credential, and
//! re-initialises once when the upstream forgets it.

pub mod http;

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ::http::{header, HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde_json::{json, Value};

pub use self::http::HttpUpstream;
use crate::body::{full, Body};
use crate::config::UpstreamProtocol;
use crate::error::ProxyError;
use crate::mcp::headers as mcp_headers;
use crate::mcp::sse;
use crate::mcp::version::{self, LEGACY_LATEST, MODERN};

/// How long an era verdict is trusted before the next request checks it again (an upstream
/// redeployed with another SDK changes era without the sidecar restarting).
const VERDICT_TTL: Duration = Duration::from_secs(30);
/// Upper bound on bodies the sidecar reads whole (handshakes, probes, rewritten JSON results).
pub const MAX_UPSTREAM_BODY: usize = 64 * 1024 * 1024;
/// Legacy sessions kept (one per distinct client credential).
const MAX_SESSIONS: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    Modern,
    Legacy,
}

/// A 2025-era upstream's session, opened by the sidecar's own handshake.
#[derive(Debug)]
pub struct LegacySession {
    pub id: Option<HeaderValue>,
    pub version: String,
    /// The upstream's `initialize` result (capabilities, serverInfo, instructions).
    pub init: Value,
}

/// A complete upstream answer the sidecar read whole: what it needs to either use it or pass it
/// to the client exactly as it was.
pub struct ReadAnswer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub bytes: Bytes,
    /// The JSON-RPC response in it (the last `data:` of an SSE answer), when there is one.
    pub message: Option<Value>,
}

impl ReadAnswer {
    /// The answer as the client should see it (the upstream's session id never leaves).
    pub fn into_response(self) -> Response<Body> {
        let mut resp = Response::new(full(self.bytes));
        *resp.status_mut() = self.status;
        *resp.headers_mut() = self.headers;
        resp.headers_mut().remove(mcp_headers::SESSION_ID);
        resp.headers_mut().remove(header::CONTENT_LENGTH);
        resp
    }

    pub fn result(&self) -> Option<&Value> {
        self.message.as_ref().and_then(|m| m.get("result"))
    }
}

/// What stops a request before its own upstream call: an answer to pass through as it was
/// (401 from the product's auth, say), or an error of the sidecar's.
pub enum Early {
    PassThrough(Box<ReadAnswer>),
    Error(ProxyError),
}

impl From<ProxyError> for Early {
    fn from(e: ProxyError) -> Self {
        Early::Error(e)
    }
}

/// The upstream's discovery, in the 2026 shape whatever its era.
pub struct Discovery {
    pub era: Era,
    /// The `server/discover` result (or one built from the `initialize` result).
    pub result: Value,
}

pub struct Upstream {
    pub http: HttpUpstream,
    setting: UpstreamProtocol,
    verdict: Mutex<Option<(Era, Instant)>>,
    sessions: Mutex<HashMap<u64, Arc<LegacySession>>>,
    hasher: RandomState,
    /// The upstream's identity as last seen, for results that lack it.
    server_info: Mutex<Option<Value>>,
    counter: AtomicU64,
}

/// Headers that identify the caller to the upstream; a legacy session is kept per distinct set.
const CREDENTIAL_HEADERS: [&str; 3] = ["authorization", "cookie", "x-api-key"];

/// Headers the sidecar sets itself on every upstream MCP request.
const MCP_ROUTING: [&str; 5] = [
    mcp_headers::PROTOCOL_VERSION,
    mcp_headers::METHOD,
    mcp_headers::NAME,
    mcp_headers::SESSION_ID,
    "last-event-id",
];

impl Upstream {
    pub fn new(http: HttpUpstream, setting: UpstreamProtocol) -> Self {
        Upstream {
            http,
            setting,
            verdict: Mutex::new(None),
            sessions: Mutex::new(HashMap::new()),
            hasher: RandomState::new(),
            server_info: Mutex::new(None),
            counter: AtomicU64::new(0),
        }
    }

    fn next_id(&self, what: &str) -> String {
        format!(
            "epode-sidecar-{what}-{}",
            self.counter.fetch_add(1, Ordering::Relaxed)
        )
    }

    pub fn known_server_info(&self) -> Option<Value> {
        lock(&self.server_info).clone()
    }

    fn remember_server_info(&self, info: Option<&Value>) {
        if let Some(info) = info.filter(|i| i.is_object()) {
            *lock(&self.server_info) = Some(info.clone());
        }
    }

    /// Forgets what the sidecar knew of the upstream (after it became unreachable: it may
    /// come back as another build).
    pub fn forget(&self) {
        *lock(&self.verdict) = None;
        lock(&self.sessions).clear();
    }

    fn cached_verdict(&self) -> Option<Era> {
        match self.setting {
            UpstreamProtocol::Modern => return Some(Era::Modern),
            UpstreamProtocol::Legacy => return Some(Era::Legacy),
            UpstreamProtocol::Auto => {}
        }
        let v = *lock(&self.verdict);
        v.filter(|(_, at)| at.elapsed() < VERDICT_TTL)
            .map(|(e, _)| e)
    }

    fn set_verdict(&self, era: Era) {
        if self.setting == UpstreamProtocol::Auto {
            let previous = lock(&self.verdict).replace((era, Instant::now()));
            if previous.map(|(e, _)| e) != Some(era) {
                tracing::info!(era = ?era, "upstream era decided");
            }
        }
    }

    /// The client's end-to-end headers for an upstream MCP request, without the routing
    /// headers the sidecar sets itself.
    pub fn base_headers(&self, client: &HeaderMap) -> HeaderMap {
        let mut h = self.http.base_headers(client);
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

    fn credential_key(&self, client: &HeaderMap) -> u64 {
        self.hasher.hash_one(
            CREDENTIAL_HEADERS
                .iter()
                .map(|n| {
                    client
                        .get_all(*n)
                        .iter()
                        .map(|v| v.as_bytes().to_vec())
                        .collect::<Vec<_>>()
                })
                .collect::<Vec<_>>(),
        )
    }

    /// Sends one request and reads its answer whole.
    async fn exchange(&self, headers: HeaderMap, body: Bytes) -> Result<ReadAnswer, ProxyError> {
        let resp = self.http.post(headers, body, None).await;
        if matches!(resp, Err(ProxyError::UpstreamUnreachable(_))) {
            self.forget();
        }
        read_answer(resp?, self.http.timeout()).await
    }

    /// The era of the upstream, probing with `server/discover` (with the caller's
    /// credentials) when it is not known.
    pub async fn era(&self, client: &HeaderMap) -> Result<Era, Early> {
        if let Some(era) = self.cached_verdict() {
            return Ok(era);
        }
        Ok(self.discover(client, None).await?.era)
    }

    /// Discovery per request: `server/discover` goes upstream with the client's credentials;
    /// a 2025-era upstream gets a fresh handshake instead. `client_body` is a modern client's
    /// own `server/discover` body, forwarded as it was.
    pub async fn discover(
        &self,
        client: &HeaderMap,
        client_body: Option<Bytes>,
    ) -> Result<Discovery, Early> {
        let cached = self.cached_verdict();
        if cached != Some(Era::Legacy) {
            if let Some(d) = self.probe_modern(client, client_body.clone()).await? {
                return Ok(d);
            }
        }
        match self.handshake(client).await {
            Ok(session) => {
                self.set_verdict(Era::Legacy);
                Ok(Discovery {
                    era: Era::Legacy,
                    result: discover_from_init(&session.init),
                })
            }
            // The upstream was redeployed as a 2026-only server: `initialize` is refused.
            Err(Early::PassThrough(answer))
                if cached == Some(Era::Legacy)
                    && self.setting == UpstreamProtocol::Auto
                    && !is_final_refusal(answer.status) =>
            {
                self.forget();
                match self.probe_modern(client, client_body).await? {
                    Some(d) => Ok(d),
                    None => Err(Early::PassThrough(answer)),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// `server/discover` upstream: the discovery when the upstream speaks 2026-07-28, `None`
    /// when it does not, or the upstream's refusal (401, 5xx, …) to pass on.
    async fn probe_modern(
        &self,
        client: &HeaderMap,
        client_body: Option<Bytes>,
    ) -> Result<Option<Discovery>, Early> {
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
        let answer = self.exchange(headers, body).await?;
        if let Some(result) = answer.result().filter(|r| supports_modern(r)).cloned() {
            self.set_verdict(Era::Modern);
            self.remember_server_info(
                result
                    .get("_meta")
                    .and_then(|m| m.get(version::META_SERVER_INFO)),
            );
            return Ok(Some(Discovery {
                era: Era::Modern,
                result,
            }));
        }
        if is_final_refusal(answer.status) || self.setting == UpstreamProtocol::Modern {
            return Err(Early::PassThrough(Box::new(answer)));
        }
        Ok(None)
    }

    /// A fresh `initialize` handshake with the client's credentials; the session it opens
    /// replaces any kept for those credentials.
    pub async fn handshake(&self, client: &HeaderMap) -> Result<Arc<LegacySession>, Early> {
        let body = json!({
            "jsonrpc": "2.0",
            "id": self.next_id("initialize"),
            "method": "initialize",
            "params": {
                "protocolVersion": LEGACY_LATEST,
                "capabilities": {},
                "clientInfo": sidecar_info(),
            },
        });
        let headers = self.base_headers(client);
        let answer = self
            .exchange(headers.clone(), Bytes::from(body.to_string()))
            .await?;
        if !answer.status.is_success() {
            return Err(Early::PassThrough(Box::new(answer)));
        }
        let Some(init) = answer.result().cloned() else {
            let why = answer
                .message
                .as_ref()
                .and_then(|m| m.get("error"))
                .and_then(|e| e.get("message"))
                .and_then(Value::as_str)
                .unwrap_or("no JSON-RPC result")
                .to_owned();
            return Err(Early::Error(ProxyError::UpstreamFailed(format!(
                "the upstream refused the initialize handshake: {why}"
            ))));
        };
        let version = init
            .get("protocolVersion")
            .and_then(Value::as_str)
            .filter(|v| version::is_legacy(v))
            .unwrap_or(LEGACY_LATEST)
            .to_owned();
        let id = answer.headers.get(mcp_headers::SESSION_ID).cloned();
        let session = Arc::new(LegacySession { id, version, init });
        self.remember_server_info(session.init.get("serverInfo"));

        // notifications/initialized completes the handshake; its answer carries nothing.
        let mut h = headers;
        apply_session(&mut h, &session);
        let note = Bytes::from_static(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        match self.http.post(h, note, None).await {
            Ok(resp) if resp.status().is_success() => {}
            Ok(resp) => {
                tracing::warn!(status = %resp.status(), "upstream refused notifications/initialized")
            }
            Err(e) => tracing::warn!(error = %e, "notifications/initialized failed"),
        }

        let key = self.credential_key(client);
        let mut sessions = lock(&self.sessions);
        if sessions.len() >= MAX_SESSIONS && !sessions.contains_key(&key) {
            if let Some(k) = sessions.keys().next().copied() {
                sessions.remove(&k);
            }
        }
        sessions.insert(key, session.clone());
        Ok(session)
    }

    /// The kept session for these credentials, or a new one.
    pub async fn session(&self, client: &HeaderMap) -> Result<Arc<LegacySession>, Early> {
        let key = self.credential_key(client);
        if let Some(s) = lock(&self.sessions).get(&key).cloned() {
            return Ok(s);
        }
        self.handshake(client).await
    }

    /// Sends a request to a 2025-era upstream inside the caller's session; when the upstream
    /// no longer knows the session (it restarted), re-initialises once and retries.
    pub async fn send_legacy(
        &self,
        client: &HeaderMap,
        body: Bytes,
    ) -> Result<(Response<Incoming>, Arc<LegacySession>), Early> {
        let mut session = self.session(client).await?;
        for attempt in 0..2 {
            let mut headers = self.base_headers(client);
            apply_session(&mut headers, &session);
            let resp = self.http.post(headers, body.clone(), None).await;
            if matches!(resp, Err(ProxyError::UpstreamUnreachable(_))) {
                self.forget();
            }
            let resp = resp?;
            if attempt == 0 && session.id.is_some() {
                match resp.status() {
                    StatusCode::NOT_FOUND => {
                        tracing::info!("upstream forgot its session; initialising again");
                        session = self.handshake(client).await?;
                        continue;
                    }
                    StatusCode::BAD_REQUEST => {
                        // Some servers answer 400 naming the session; read it to be sure.
                        let answer = read_answer(resp, self.http.timeout()).await?;
                        if !mentions_session(&answer.bytes) {
                            return Err(Early::PassThrough(Box::new(answer)));
                        }
                        tracing::info!("upstream refused its session; initialising again");
                        session = self.handshake(client).await?;
                        continue;
                    }
                    _ => {}
                }
            }
            return Ok((resp, session));
        }
        unreachable_retry()
    }

    /// Sends a request to a 2026-07-28 upstream.
    pub async fn send_modern(
        &self,
        headers: HeaderMap,
        body: Bytes,
        query: Option<&str>,
    ) -> Result<Response<Incoming>, ProxyError> {
        let resp = self.http.post(headers, body, query).await;
        if matches!(resp, Err(ProxyError::UpstreamUnreachable(_))) {
            self.forget();
        }
        resp
    }
}

fn unreachable_retry() -> Result<(Response<Incoming>, Arc<LegacySession>), Early> {
    Err(Early::Error(ProxyError::UpstreamFailed(
        "the upstream kept refusing its session".to_owned(),
    )))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn mentions_session(bytes: &[u8]) -> bool {
    String::from_utf8_lossy(bytes)
        .to_ascii_lowercase()
        .contains("session")
}

/// Whether an upstream refusal says the upstream now speaks the other era (it was
/// redeployed): a 2026-only server refuses 2025 traffic with -32022; a 2025-only server
/// refuses 2026 traffic with a generic 400 (-32000 "not initialized", "unsupported protocol
/// version", or no JSON-RPC body at all).
pub fn signals_era_change(answer: &ReadAnswer, sent: Era) -> bool {
    if answer.status != StatusCode::BAD_REQUEST {
        return false;
    }
    let code = answer
        .message
        .as_ref()
        .and_then(|m| m.get("error"))
        .and_then(|e| e.get("code"))
        .and_then(Value::as_i64);
    match sent {
        Era::Legacy => code == Some(-32022),
        Era::Modern => matches!(code, None | Some(-32000)),
    }
}

/// Statuses that say "not you" or "not now" rather than "not this era": passed to the client.
fn is_final_refusal(status: StatusCode) -> bool {
    matches!(status.as_u16(), 401 | 403 | 407 | 429) || status.is_server_error()
}

fn supports_modern(result: &Value) -> bool {
    result
        .get("supportedVersions")
        .and_then(Value::as_array)
        .is_some_and(|v| v.iter().any(|x| x.as_str() == Some(MODERN)))
}

pub fn sidecar_info() -> Value {
    json!({"name": "epode-sidecar", "version": env!("CARGO_PKG_VERSION")})
}

fn apply_session(headers: &mut HeaderMap, session: &LegacySession) {
    if let Ok(v) = HeaderValue::from_str(&session.version) {
        headers.insert(mcp_headers::PROTOCOL_VERSION, v);
    }
    if let Some(id) = &session.id {
        headers.insert(mcp_headers::SESSION_ID, id.clone());
    }
}

/// Sets the 2026-07-28 routing headers for `method` (and `Mcp-Name` when given).
pub fn set_modern_headers(headers: &mut HeaderMap, method: &str, name: Option<&str>) {
    headers.insert(
        mcp_headers::PROTOCOL_VERSION,
        HeaderValue::from_static(MODERN),
    );
    if let Some(v) = mcp_headers::encode(method) {
        headers.insert(mcp_headers::METHOD, v);
    }
    if let Some(v) = name.and_then(mcp_headers::encode) {
        headers.insert(HeaderName::from_static(mcp_headers::NAME), v);
    }
}

/// Capabilities a stateless 2026 front cannot deliver for a 2025-era upstream: change
/// notifications would need the upstream's session stream.
fn without_push_capabilities(caps: &Value) -> Value {
    let mut caps = caps.clone();
    if let Some(obj) = caps.as_object_mut() {
        for key in ["tools", "prompts", "resources"] {
            if let Some(Value::Object(c)) = obj.get_mut(key) {
                c.remove("listChanged");
                c.remove("subscribe");
            }
        }
        obj.remove("tasks");
    }
    caps
}

/// A `server/discover` result built from a 2025-era `initialize` result.
pub fn discover_from_init(init: &Value) -> Value {
    let mut r = serde_json::Map::new();
    r.insert("resultType".into(), "complete".into());
    r.insert("supportedVersions".into(), json!([MODERN]));
    r.insert(
        "capabilities".into(),
        without_push_capabilities(init.get("capabilities").unwrap_or(&json!({}))),
    );
    if let Some(i) = init.get("instructions").filter(|i| i.is_string()) {
        r.insert("instructions".into(), i.clone());
    }
    if let Some(info) = init.get("serverInfo") {
        r.insert("_meta".into(), json!({ version::META_SERVER_INFO: info }));
    }
    Value::Object(r)
}

/// Reads an upstream answer whole (JSON, or an SSE stream to its end).
pub async fn read_answer(
    resp: Response<Incoming>,
    timeout: Duration,
) -> Result<ReadAnswer, ProxyError> {
    let (parts, body) = resp.into_parts();
    let collected = tokio::time::timeout(timeout, Limited::new(body, MAX_UPSTREAM_BODY).collect())
        .await
        .map_err(|_| ProxyError::UpstreamTimeout(timeout))?
        .map_err(|e| ProxyError::UpstreamFailed(format!("reading the answer: {e}")))?;
    let bytes = collected.to_bytes();
    let message = parse_message(&parts.headers, &bytes);
    Ok(ReadAnswer {
        status: parts.status,
        headers: parts.headers,
        bytes,
        message,
    })
}

pub fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

fn parse_message(headers: &HeaderMap, bytes: &Bytes) -> Option<Value> {
    if is_event_stream(headers) {
        let mut splitter = sse::EventSplitter::default();
        let mut events = std::collections::VecDeque::new();
        splitter.push(bytes, &mut events);
        events.extend(splitter.finish());
        events
            .iter()
            .filter_map(|e| sse::event_data(e))
            .filter_map(|d| serde_json::from_str::<Value>(&d).ok())
            .rfind(sse::is_response)
    } else {
        serde_json::from_slice(bytes).ok()
    }
}
