//! A 2025-era upstream's sessions: the sidecar performs the `initialize` handshake itself,
//! keeps one session per distinct client credential, and initialises again once when the
//! upstream forgets a session (it restarted). The table is bounded: the least recently used
//! session makes room for a new one, and a session unused for the idle time goes; either way
//! it is closed upstream with a `DELETE` carrying its `Mcp-Session-Id`.

use lru::LruCache;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use serde_json::{json, Value};

use super::answer::read_answer;
use super::hop::{Hop, UpstreamBody};
use super::translate::sidecar_info;
use super::Upstream;
use crate::error::{Error, Kind};
use crate::mcp::headers;
use crate::mcp::version::{self, LEGACY_LATEST};

use super::caller::{Client, CREDENTIAL_HEADERS};

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

struct Entry {
    session: Arc<LegacySession>,
    /// The credentials the session was opened with (to close it with them).
    credentials: HeaderMap,
    used: Instant,
}

/// A session the table let go, to be closed upstream.
pub(crate) struct Closed {
    session: Arc<LegacySession>,
    credentials: HeaderMap,
}

/// The open sessions, by a hash of the client's credentials; bounded, least recently used
/// first out (O(1) per request, whatever the table's size).
pub(crate) struct Sessions {
    table: Mutex<LruCache<u64, Entry>>,
    hasher: RandomState,
    cap: usize,
    idle: Duration,
}

impl Sessions {
    pub(crate) fn new(cap: usize, idle: Duration) -> Self {
        Sessions {
            table: Mutex::new(LruCache::unbounded()),
            hasher: RandomState::new(),
            cap: cap.max(1),
            idle,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<u64, Entry>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn credentials(client: &HeaderMap) -> HeaderMap {
        let mut out = HeaderMap::new();
        for name in CREDENTIAL_HEADERS {
            for v in client.get_all(name) {
                out.append(name, v.clone());
            }
        }
        out
    }

    fn key(&self, credentials: &HeaderMap) -> u64 {
        self.hasher.hash_one(
            CREDENTIAL_HEADERS
                .iter()
                .map(|n| {
                    credentials
                        .get_all(*n)
                        .iter()
                        .map(|v| v.as_bytes().to_vec())
                        .collect::<Vec<_>>()
                })
                .collect::<Vec<_>>(),
        )
    }

    fn get(&self, client: &HeaderMap) -> Option<Arc<LegacySession>> {
        let key = self.key(&Self::credentials(client));
        let mut table = self.lock();
        let entry = table.get_mut(&key)?;
        if entry.used.elapsed() >= self.idle {
            return None; // the next sweep or insert closes it
        }
        entry.used = Instant::now();
        Some(entry.session.clone())
    }

    /// Keeps `session` for these credentials; returns the sessions it displaced (the one it
    /// replaces, idle ones, and the least recently used when the table is full).
    fn insert(&self, client: &HeaderMap, session: Arc<LegacySession>) -> Vec<Closed> {
        let credentials = Self::credentials(client);
        let key = self.key(&credentials);
        let mut table = self.lock();
        let mut closed = Self::sweep_locked(&mut table, self.idle);
        if let Some(old) = table.pop(&key) {
            closed.push(Closed {
                session: old.session,
                credentials: old.credentials,
            });
        }
        while table.len() >= self.cap {
            let Some((_, e)) = table.pop_lru() else { break };
            closed.push(Closed {
                session: e.session,
                credentials: e.credentials,
            });
        }
        table.put(
            key,
            Entry {
                session,
                credentials,
                used: Instant::now(),
            },
        );
        closed
    }

    /// The sessions idle for `idle`, from the least recently used end: no scan of the rest.
    fn sweep_locked(table: &mut LruCache<u64, Entry>, idle: Duration) -> Vec<Closed> {
        let mut closed = Vec::new();
        while table
            .peek_lru()
            .is_some_and(|(_, e)| e.used.elapsed() >= idle)
        {
            if let Some((_, e)) = table.pop_lru() {
                closed.push(Closed {
                    session: e.session,
                    credentials: e.credentials,
                });
            }
        }
        closed
    }

    /// Lets go of the sessions unused for the idle time.
    pub(crate) fn sweep(&self) -> Vec<Closed> {
        Self::sweep_locked(&mut self.lock(), self.idle)
    }

    /// Lets go of every session (the upstream is gone, or changed era).
    pub(crate) fn clear(&self) -> Vec<Closed> {
        let mut table = self.lock();
        std::iter::from_fn(|| table.pop_lru())
            .map(|(_, e)| Closed {
                session: e.session,
                credentials: e.credentials,
            })
            .collect()
    }
}

/// The `DELETE` that closes a session upstream, with the session's id and the credentials
/// it was opened with. A session without an id (a stateless upstream) needs nothing.
fn close_one(hop: &Hop, c: Closed) -> Option<impl std::future::Future<Output = ()>> {
    let id = c.session.id.clone()?;
    let mut headers = hop.base_headers(&c.credentials);
    headers.insert(headers::SESSION_ID, id);
    if let Ok(v) = HeaderValue::from_str(&c.session.version) {
        headers.insert(headers::PROTOCOL_VERSION, v);
    }
    let hop = hop.clone();
    Some(async move {
        match hop.delete(headers).await {
            Ok(status) => tracing::debug!(%status, "upstream session closed"),
            Err(e) => tracing::debug!(error = %e, "closing an upstream session failed"),
        }
    })
}

/// Closes sessions upstream in the background.
pub(crate) fn close_upstream(hop: &Hop, closed: Vec<Closed>) {
    for c in closed {
        if let Some(close) = close_one(hop, c) {
            tokio::spawn(close);
        }
    }
}

/// Closes sessions upstream now, all at once, waiting at most `within` (shutdown).
pub(crate) async fn close_upstream_within(hop: &Hop, closed: Vec<Closed>, within: Duration) {
    let n = closed.len();
    let all = futures_util::future::join_all(closed.into_iter().filter_map(|c| close_one(hop, c)));
    if tokio::time::timeout(within, all).await.is_err() {
        tracing::warn!(
            sessions = n,
            "upstream sessions not all closed before shutdown"
        );
    } else if n > 0 {
        tracing::info!(sessions = n, "upstream sessions closed");
    }
}

impl Upstream {
    /// A fresh `initialize` handshake with the client's credentials; the session it opens
    /// replaces any kept for those credentials.
    pub(crate) async fn handshake(&self, client: &Client<'_>) -> Result<Arc<LegacySession>, Error> {
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
            .exchange(
                &client.caller,
                headers.clone(),
                Bytes::from(body.to_string()),
            )
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
        match self.hop.post(&client.caller, h, note, None, false).await {
            Ok(resp) if resp.status().is_success() => {}
            Ok(resp) => {
                tracing::warn!(status = %resp.status(), "upstream refused notifications/initialized")
            }
            Err(e) => tracing::warn!(error = %e, "notifications/initialized failed"),
        }
        let closed = self.shared.sessions.insert(client, session.clone());
        close_upstream(&self.hop, closed);
        Ok(session)
    }

    /// The kept session for these credentials, or a new one.
    async fn session(&self, client: &Client<'_>) -> Result<Arc<LegacySession>, Error> {
        match self.shared.sessions.get(client) {
            Some(s) => Ok(s),
            None => self.handshake(client).await,
        }
    }

    /// Sends a request to a 2025-era upstream inside the caller's session; when the upstream
    /// no longer knows the session (it restarted), initialises again once and retries.
    pub(crate) async fn send_legacy(
        &self,
        client: &Client<'_>,
        body: Bytes,
        answers: bool,
    ) -> Result<(Response<UpstreamBody>, Arc<LegacySession>), Error> {
        let mut session = self.session(client).await?;
        let mut retried = false;
        loop {
            let mut headers = self.base_headers(client);
            session.apply(&mut headers);
            let resp = self
                .post(&client.caller, headers, body.clone(), None, answers)
                .await?;
            if retried || session.id.is_none() {
                return Ok((resp, session));
            }
            match resp.status() {
                StatusCode::NOT_FOUND => {
                    tracing::info!("upstream forgot its session; initialising again");
                }
                StatusCode::BAD_REQUEST => {
                    // Some servers answer 400 naming the session; read it to be sure.
                    let answer = read_answer(resp, &self.bounds).await?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn session(id: &str) -> Arc<LegacySession> {
        Arc::new(LegacySession {
            id: Some(HeaderValue::from_str(id).unwrap()),
            version: "2025-11-25".into(),
            init: json!({}),
        })
    }

    fn creds(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_str(token).unwrap());
        h
    }

    #[test]
    fn the_table_is_bounded_least_recently_used_first() {
        let t = Sessions::new(2, Duration::from_secs(600));
        assert!(t.insert(&creds("a"), session("s1")).is_empty());
        assert!(t.insert(&creds("b"), session("s2")).is_empty());
        std::thread::sleep(Duration::from_millis(5));
        assert!(t.get(&creds("a")).is_some()); // a is now the most recently used
        let closed = t.insert(&creds("c"), session("s3"));
        assert_eq!(closed.len(), 1);
        assert_eq!(closed[0].session.id.as_ref().unwrap(), "s2");
        assert_eq!(
            closed[0].credentials["authorization"], "b",
            "closed with its own credentials"
        );
        assert_eq!(t.len(), 2);
        let replaced = t.insert(&creds("a"), session("s4"));
        assert_eq!(replaced[0].session.id.as_ref().unwrap(), "s1");
    }

    #[test]
    fn a_full_table_makes_room_in_constant_time() {
        let n = 50_000;
        let t = Sessions::new(n, Duration::from_secs(600));
        let fill = |from: usize, to: usize| {
            let started = Instant::now();
            for i in from..to {
                t.insert(&creds(&format!("c{i}")), session("s"));
            }
            started.elapsed()
        };
        let filling = fill(0, 10_000);
        fill(10_000, n);
        // Past the cap, each new session evicts the least recently used one.
        let evicting = fill(n, n + 10_000);
        assert_eq!(t.len(), n);
        assert!(
            evicting < filling * 20 + Duration::from_millis(200),
            "{evicting:?} for 10,000 evicting inserts, {filling:?} for 10,000 filling ones"
        );
    }

    #[test]
    fn idle_sessions_go() {
        let t = Sessions::new(10, Duration::from_millis(1));
        t.insert(&creds("a"), session("s1"));
        std::thread::sleep(Duration::from_millis(5));
        assert!(t.get(&creds("a")).is_none());
        assert_eq!(t.sweep().len(), 1);
        assert_eq!(t.len(), 0);
    }
}
