//! A 2025-era upstream's sessions: the sidecar performs the `initialize` handshake itself,
//! keeps one session per distinct client credential, and initialises again once when the
//! upstream forgets a session (it restarted).

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::{json, Value};

use super::answer::read_answer;
use super::translate::sidecar_info;
use super::Upstream;
use crate::error::{Error, Kind};
use crate::mcp::headers;
use crate::mcp::version::{self, LEGACY_LATEST};

/// Legacy sessions kept (one per distinct client credential).
const MAX_SESSIONS: usize = 1024;

/// Headers that identify the caller to the upstream; a legacy session is kept per distinct
/// set.
const CREDENTIAL_HEADERS: [&str; 3] = ["authorization", "cookie", "x-api-key"];

/// A 2025-era upstream's session, opened by the sidecar's own handshake.
#[derive(Debug)]
pub(crate) struct LegacySession {
    pub(crate) id: Option<HeaderValue>,
    pub(crate) version: String,
    /// The upstream's `initialize` result (capabilities, serverInfo, instructions).
    pub(crate) init: Value,
}

impl LegacySession {
    /// Puts the session's id and protocol version on an upstream request.
    fn apply(&self, headers: &mut HeaderMap) {
        if let Ok(v) = HeaderValue::from_str(&self.version) {
            headers.insert(headers::PROTOCOL_VERSION, v);
        }
        if let Some(id) = &self.id {
            headers.insert(headers::SESSION_ID, id.clone());
        }
    }
}

/// The open sessions, by a hash of the client's credentials.
#[derive(Default)]
pub(crate) struct Sessions {
    table: Mutex<HashMap<u64, Arc<LegacySession>>>,
    hasher: RandomState,
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<LegacySession>>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn key(&self, client: &HeaderMap) -> u64 {
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

    fn get(&self, client: &HeaderMap) -> Option<Arc<LegacySession>> {
        self.lock().get(&self.key(client)).cloned()
    }

    fn insert(&self, client: &HeaderMap, session: Arc<LegacySession>) {
        let key = self.key(client);
        let mut table = self.lock();
        if table.len() >= MAX_SESSIONS && !table.contains_key(&key) {
            if let Some(k) = table.keys().next().copied() {
                table.remove(&k);
            }
        }
        table.insert(key, session);
    }

    pub(crate) fn clear(&self) {
        self.lock().clear();
    }
}

impl Upstream {
    /// A fresh `initialize` handshake with the client's credentials; the session it opens
    /// replaces any kept for those credentials.
    pub(crate) async fn handshake(&self, client: &HeaderMap) -> Result<Arc<LegacySession>, Error> {
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
        if !answer.status().is_success() {
            return Err(answer.into_refusal());
        }
        let Some(init) = answer.result().cloned() else {
            let why = answer
                .message
                .as_ref()
                .and_then(|m| m.get("error")?.get("message")?.as_str())
                .unwrap_or("no JSON-RPC result")
                .to_owned();
            return Err(Error::new(
                Kind::UpstreamFailed,
                format!("the upstream refused the initialize handshake: {why}"),
            ));
        };
        let version = init
            .get("protocolVersion")
            .and_then(Value::as_str)
            .filter(|v| version::is_legacy(v))
            .unwrap_or(LEGACY_LATEST)
            .to_owned();
        let id = answer.answer.headers.get(headers::SESSION_ID).cloned();
        let session = Arc::new(LegacySession { id, version, init });
        self.remember_server_info(session.init.get("serverInfo"));

        // notifications/initialized completes the handshake; its answer carries nothing.
        let mut h = headers;
        session.apply(&mut h);
        let note = Bytes::from_static(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        match self.http.post(h, note, None).await {
            Ok(resp) if resp.status().is_success() => {}
            Ok(resp) => {
                tracing::warn!(status = %resp.status(), "upstream refused notifications/initialized")
            }
            Err(e) => tracing::warn!(error = %e, "notifications/initialized failed"),
        }
        self.shared.sessions.insert(client, session.clone());
        Ok(session)
    }

    /// The kept session for these credentials, or a new one.
    async fn session(&self, client: &HeaderMap) -> Result<Arc<LegacySession>, Error> {
        match self.shared.sessions.get(client) {
            Some(s) => Ok(s),
            None => self.handshake(client).await,
        }
    }

    /// Sends a request to a 2025-era upstream inside the caller's session; when the upstream
    /// no longer knows the session (it restarted), initialises again once and retries.
    pub(crate) async fn send_legacy(
        &self,
        client: &HeaderMap,
        body: Bytes,
    ) -> Result<(Response<Incoming>, Arc<LegacySession>), Error> {
        let mut session = self.session(client).await?;
        let mut retried = false;
        loop {
            let mut headers = self.base_headers(client);
            session.apply(&mut headers);
            let resp = self.post(headers, body.clone(), None).await?;
            if retried || session.id.is_none() {
                return Ok((resp, session));
            }
            match resp.status() {
                StatusCode::NOT_FOUND => {
                    tracing::info!("upstream forgot its session; initialising again");
                }
                StatusCode::BAD_REQUEST => {
                    // Some servers answer 400 naming the session; read it to be sure.
                    let answer = read_answer(resp, self.http.timeout()).await?;
                    if !mentions_session(&answer.answer.bytes) {
                        return Err(answer.into_refusal());
                    }
                    tracing::info!("upstream refused its session; initialising again");
                }
                _ => return Ok((resp, session)),
            }
            session = self.handshake(client).await?;
            retried = true;
        }
    }
}

fn mentions_session(bytes: &[u8]) -> bool {
    String::from_utf8_lossy(bytes)
        .to_ascii_lowercase()
        .contains("session")
}
