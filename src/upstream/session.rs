//! A 2025-era upstream's sessions, as one component: the sidecar performs the `initialize`
//! handshake itself, keeps one session per distinct client credential, initialises again once
//! when the upstream forgets a session (it restarted), and closes every session it lets go
//! with a `DELETE` carrying its `Mcp-Session-Id`. The table is bounded: the least recently
//! used session makes room for a new one, and a session unused for the idle time goes.

use lru::LruCache;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use serde_json::{json, Value};

use super::answer::read_answer;
use super::caller::{Client, ServerRequests};
use super::hop::{Hop, UpstreamBody};
use super::link::Link;
use super::translate::sidecar_info;
use crate::caller::CallerKey;
use crate::error::{Error, ErrorKind};
use crate::ledger::{Charge, Ledger, Pool};
use crate::mcp::headers;
use crate::mcp::version::{self, LEGACY_LATEST};

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
    pub(super) fn apply(&self, headers: &mut HeaderMap) {
        if let Ok(v) = HeaderValue::from_str(&self.version) {
            headers.insert(headers::PROTOCOL_VERSION, v);
        }
        if let Some(id) = &self.id {
            headers.insert(headers::SESSION_ID, id.clone());
        }
    }
}

/// The headers a session is opened with, and closed with: the client's credentials and the
/// caller the sidecar told the upstream of (`Epode-Auth-Subject`, set from a verified token).
const SESSION_HEADERS: [&str; 4] = ["authorization", "cookie", "x-api-key", "epode-auth-subject"];

struct Entry {
    session: Arc<LegacySession>,
    /// The credentials the session was opened with (to close it with them).
    credentials: HeaderMap,
    used: Instant,
    /// Its place in the ledger, charged to its caller.
    charge: Charge,
}

/// A session the table let go, to be closed upstream.
pub(crate) struct Closed {
    session: Arc<LegacySession>,
    credentials: HeaderMap,
}

impl Closed {
    fn from_entry(e: Entry) -> Self {
        Closed {
            session: e.session,
            credentials: e.credentials,
        }
    }

    /// The headers of the `DELETE` that closes the session upstream, over `base` (the
    /// session's credentials as the hop sends them): its id and protocol version. A session
    /// without an id (a stateless upstream) needs no `DELETE`.
    fn delete_headers(&self, mut base: HeaderMap) -> Option<HeaderMap> {
        let id = self.session.id.clone()?;
        base.insert(headers::SESSION_ID, id);
        if let Ok(v) = HeaderValue::from_str(&self.session.version) {
            base.insert(headers::PROTOCOL_VERSION, v);
        }
        Some(base)
    }
}

/// The open sessions, by caller and declared capabilities; bounded, least recently used
/// first out (O(1) per request, whatever the table's size), and each caller to its share of
/// the ledger's pool (past it, its own least recently used session makes room: one caller's
/// capability sets never close another's sessions). Times are passed in, so the eviction and
/// idle rules are tested without waiting.
struct SessionTable {
    lru: Mutex<LruCache<u64, Entry>>,
    hasher: RandomState,
    cap: usize,
    share: usize,
    idle: Duration,
    ledger: Arc<Ledger>,
}

impl SessionTable {
    fn new(ledger: Arc<Ledger>, idle: Duration) -> Self {
        let bounds = ledger.bounds(Pool::Sessions);
        SessionTable {
            lru: Mutex::new(LruCache::unbounded()),
            hasher: RandomState::new(),
            cap: bounds.cap.max(1),
            share: bounds.share,
            idle,
            ledger,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<u64, Entry>> {
        self.lru.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn len(&self) -> usize {
        self.lock().len()
    }

    fn credentials(client: &HeaderMap) -> HeaderMap {
        let mut out = HeaderMap::new();
        for name in SESSION_HEADERS {
            for v in client.get_all(name) {
                out.append(name, v.clone());
            }
        }
        out
    }

    /// A session is its caller's, with the capabilities the sidecar declared for it.
    fn key(&self, caller: CallerKey, caps: Option<&str>) -> u64 {
        self.hasher.hash_one((caller, caps))
    }

    fn get(
        &self,
        caller: CallerKey,
        caps: Option<&str>,
        now: Instant,
    ) -> Option<Arc<LegacySession>> {
        let key = self.key(caller, caps);
        let mut table = self.lock();
        let entry = table.get_mut(&key)?;
        if now.saturating_duration_since(entry.used) >= self.idle {
            return None; // the next sweep or insert closes it
        }
        entry.used = now;
        Some(entry.session.clone())
    }

    /// Keeps `session` for these credentials; returns the sessions it displaced (the one it
    /// replaces, idle ones, and the least recently used when the table is full).
    fn insert(
        &self,
        caller: CallerKey,
        credentials: HeaderMap,
        caps: Option<&str>,
        session: Arc<LegacySession>,
        now: Instant,
    ) -> Vec<Closed> {
        let key = self.key(caller, caps);
        let mut table = self.lock();
        let mut closed = Self::sweep_locked(&mut table, self.idle, now);
        if let Some(old) = table.pop(&key) {
            closed.push(Closed::from_entry(old));
        }
        // At its share, the caller's own least recently used session makes room.
        while self.ledger.held_by(Pool::Sessions, caller) >= self.share {
            let Some(own) = table
                .iter()
                .rev()
                .find(|(_, e)| e.charge.caller() == caller)
                .map(|(k, _)| *k)
            else {
                break;
            };
            closed.extend(table.pop(&own).map(Closed::from_entry));
        }
        while table.len() >= self.cap {
            let Some((_, e)) = table.pop_lru() else { break };
            closed.push(Closed::from_entry(e));
        }
        match self.ledger.try_charge(Pool::Sessions, caller) {
            Ok(charge) => {
                table.put(
                    key,
                    Entry {
                        session,
                        credentials,
                        used: now,
                        charge,
                    },
                );
            }
            // Only this table charges the pool, under its lock, after making room: kept
            // nowhere, the session is closed at once.
            Err(_) => closed.push(Closed {
                session,
                credentials,
            }),
        }
        closed
    }

    /// The sessions idle for `idle`, from the least recently used end: no scan of the rest.
    fn sweep_locked(table: &mut LruCache<u64, Entry>, idle: Duration, now: Instant) -> Vec<Closed> {
        let mut closed = Vec::new();
        while table
            .peek_lru()
            .is_some_and(|(_, e)| now.saturating_duration_since(e.used) >= idle)
        {
            if let Some((_, e)) = table.pop_lru() {
                closed.push(Closed::from_entry(e));
            }
        }
        closed
    }

    /// Lets go of the sessions unused for the idle time.
    fn sweep(&self, now: Instant) -> Vec<Closed> {
        Self::sweep_locked(&mut self.lock(), self.idle, now)
    }

    /// Lets go of every session (the upstream is gone, or changed era).
    fn clear(&self) -> Vec<Closed> {
        let mut table = self.lock();
        std::iter::from_fn(|| table.pop_lru())
            .map(|(_, e)| Closed::from_entry(e))
            .collect()
    }
}

/// What a status answered inside a session says about the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InSession {
    /// An answer to the request: it goes to the client.
    Answered,
    /// 404: the upstream no longer knows the session (it restarted).
    Forgotten,
    /// 400: forgotten only if the answer names the session (some servers say so this way).
    ReadToTell,
}

fn in_session(status: StatusCode) -> InSession {
    match status {
        StatusCode::NOT_FOUND => InSession::Forgotten,
        StatusCode::BAD_REQUEST => InSession::ReadToTell,
        _ => InSession::Answered,
    }
}

fn mentions_session(bytes: &[u8]) -> bool {
    String::from_utf8_lossy(bytes)
        .to_ascii_lowercase()
        .contains("session")
}

/// The `DELETE` that closes a session upstream, with the session's id and the credentials
/// it was opened with.
fn close_one(hop: &Hop, c: Closed) -> Option<impl std::future::Future<Output = ()>> {
    let headers = c.delete_headers(hop.base_headers(&c.credentials))?;
    let hop = hop.clone();
    Some(async move {
        match hop.delete(headers).await {
            Ok(status) => tracing::debug!(%status, "upstream session closed"),
            Err(e) => tracing::debug!(error = %e, "closing an upstream session failed"),
        }
    })
}

/// Closes sessions upstream in the background.
fn close_in_background(hop: &Hop, closed: Vec<Closed>) {
    for c in closed {
        if let Some(close) = close_one(hop, c) {
            tokio::spawn(close);
        }
    }
}

/// `notifications/initialized`, which completes a handshake (its answer carries nothing).
async fn initialized(
    link: &Link,
    client: &Client<'_>,
    mut headers: HeaderMap,
    session: &LegacySession,
) {
    session.apply(&mut headers);
    let (note, _span) = link.own(
        "notifications/initialized",
        "session",
        &mut headers,
        Bytes::from_static(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
    );
    match link
        .post(
            &client.caller,
            headers,
            note,
            None,
            ServerRequests::Withheld,
        )
        .await
    {
        Ok(resp) if resp.status().is_success() => {}
        Ok(resp) => {
            tracing::warn!(status = %resp.status(), "upstream refused notifications/initialized")
        }
        Err(e) => tracing::warn!(error = %e, "notifications/initialized failed"),
    }
}

/// A 2025-era upstream's sessions: the table, the handshake that fills it, the one
/// re-initialisation, and the `DELETE` of every session let go. Shared by every worker.
pub(crate) struct Sessions {
    table: SessionTable,
}

impl Sessions {
    pub(crate) fn new(ledger: Arc<Ledger>, idle: Duration) -> Self {
        Sessions {
            table: SessionTable::new(ledger, idle),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    /// How long a session may go unused before it is closed.
    pub(crate) fn idle(&self) -> Duration {
        self.table.idle
    }

    /// Closes upstream the sessions unused for the idle time (in the background).
    pub(crate) fn sweep(&self, link: &Link) {
        close_in_background(link.hop(), self.table.sweep(Instant::now()));
    }

    /// Lets go of every session, closing each upstream in the background (the upstream is
    /// gone, or changed era).
    pub(crate) fn clear(&self, link: &Link) {
        close_in_background(link.hop(), self.table.clear());
    }

    /// Closes every session upstream now, all at once, waiting at most `within` (shutdown).
    pub(crate) async fn close_all(&self, link: &Link, within: Duration) {
        let closed = self.table.clear();
        let n = closed.len();
        let all = futures_util::future::join_all(
            closed.into_iter().filter_map(|c| close_one(link.hop(), c)),
        );
        if tokio::time::timeout(within, all).await.is_err() {
            tracing::warn!(
                sessions = n,
                "upstream sessions not all closed before shutdown"
            );
        } else if n > 0 {
            tracing::info!(sessions = n, "upstream sessions closed");
        }
    }

    /// A fresh `initialize` handshake with the client's credentials, declaring `caps` (a 2025
    /// client's own capabilities, when it declared any; else none); the session it opens
    /// replaces any kept for those credentials and capabilities.
    pub(crate) async fn handshake(
        &self,
        link: &Link,
        client: &Client<'_>,
        caps: Option<&str>,
    ) -> Result<Arc<LegacySession>, Error> {
        let capabilities = caps
            .and_then(|c| serde_json::from_str::<Value>(c).ok())
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
        let body = json!({
            "jsonrpc": "2.0",
            "id": link.next_id("initialize"),
            "method": "initialize",
            "params": {
                "protocolVersion": LEGACY_LATEST,
                "capabilities": capabilities,
                "clientInfo": sidecar_info(),
            },
        });
        let mut headers = link.base_headers(client);
        let (init_body, span) = link.own(
            "initialize",
            "session",
            &mut headers,
            Bytes::from(body.to_string()),
        );
        let answer = link
            .exchange(&client.caller, headers.clone(), init_body)
            .await?;
        if let Some(span) = &span {
            span.answered(answer.status().as_u16());
        }
        drop(span);
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
                ErrorKind::UpstreamFailed,
                format!("the upstream refused the initialize handshake: {why}"),
            ));
        };
        link.heard_capabilities(&init);
        let version = init
            .get("protocolVersion")
            .and_then(Value::as_str)
            .filter(|v| version::is_legacy(v))
            .unwrap_or(LEGACY_LATEST)
            .to_owned();
        let id = answer.answer.headers.get(headers::SESSION_ID).cloned();
        let session = Arc::new(LegacySession { id, version, init });
        link.identity().remember(session.init.get("serverInfo"));

        initialized(link, client, headers, &session).await;
        let closed = self.table.insert(
            client.caller.key(),
            SessionTable::credentials(client.headers),
            caps,
            session.clone(),
            Instant::now(),
        );
        close_in_background(link.hop(), closed);
        Ok(session)
    }

    /// The kept session for these credentials, or a new one.
    pub(crate) async fn session(
        &self,
        link: &Link,
        client: &Client<'_>,
        caps: Option<&str>,
    ) -> Result<Arc<LegacySession>, Error> {
        match self.table.get(client.caller.key(), caps, Instant::now()) {
            Some(s) => Ok(s),
            None => self.handshake(link, client, caps).await,
        }
    }

    /// Sends a request to a 2025-era upstream inside the caller's session; when the upstream
    /// no longer knows the session (it restarted), initialises again once and retries.
    pub(crate) async fn send(
        &self,
        link: &Link,
        client: &Client<'_>,
        body: Bytes,
        relay: ServerRequests,
        caps: Option<&str>,
    ) -> Result<(Response<UpstreamBody>, Arc<LegacySession>), Error> {
        let mut session = self.session(link, client, caps).await?;
        let mut retried = false;
        loop {
            let mut headers = link.base_headers(client);
            session.apply(&mut headers);
            let resp = link
                .post(&client.caller, headers, body.clone(), None, relay)
                .await?;
            if retried || session.id.is_none() {
                return Ok((resp, session));
            }
            match in_session(resp.status()) {
                InSession::Answered => return Ok((resp, session)),
                InSession::Forgotten => {
                    tracing::info!("upstream forgot its session; initialising again");
                }
                InSession::ReadToTell => {
                    let answer = read_answer(resp, link.bounds()).await?;
                    if !mentions_session(&answer.answer.bytes) {
                        return Err(answer.into_refusal());
                    }
                    tracing::info!("upstream refused its session; initialising again");
                }
            }
            session = self.handshake(link, client, caps).await?;
            retried = true;
        }
    }
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

    fn key(token: &str) -> CallerKey {
        CallerKey::of_token("https://as", Some(token), None, &[0; 32])
    }

    fn creds(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_str(token).unwrap());
        h
    }

    #[test]
    fn the_table_is_bounded_least_recently_used_first() {
        let t = SessionTable::new(
            Ledger::with(Pool::Sessions, 2, 1000),
            Duration::from_secs(600),
        );
        let t0 = Instant::now();
        assert!(t
            .insert(key("a"), creds("a"), None, session("s1"), t0)
            .is_empty());
        assert!(t
            .insert(key("b"), creds("b"), None, session("s2"), t0)
            .is_empty());
        let t1 = t0 + Duration::from_millis(5);
        assert!(t.get(key("a"), None, t1).is_some()); // a is now the most recently used
        let closed = t.insert(key("c"), creds("c"), None, session("s3"), t1);
        assert_eq!(closed.len(), 1);
        assert_eq!(closed[0].session.id.as_ref().unwrap(), "s2");
        assert_eq!(
            closed[0].credentials["authorization"], "b",
            "closed with its own credentials"
        );
        assert_eq!(t.len(), 2);
        let replaced = t.insert(key("a"), creds("a"), None, session("s4"), t1);
        assert_eq!(replaced[0].session.id.as_ref().unwrap(), "s1");
    }

    #[test]
    fn a_full_table_makes_room_in_constant_time() {
        let n = 50_000;
        let t = SessionTable::new(
            Ledger::with(Pool::Sessions, n, 1000),
            Duration::from_secs(600),
        );
        let now = Instant::now();
        let fill = |from: usize, to: usize| {
            let started = Instant::now();
            for i in from..to {
                t.insert(
                    key(&format!("c{i}")),
                    creds(&format!("c{i}")),
                    None,
                    session("s"),
                    now,
                );
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
    fn a_caller_at_its_share_closes_its_own_oldest_session_never_anothers() {
        let t = SessionTable::new(
            Ledger::with(Pool::Sessions, 100, 2),
            Duration::from_secs(600),
        );
        let t0 = Instant::now();
        assert!(t
            .insert(key("b"), creds("b"), None, session("b1"), t0)
            .is_empty());
        assert!(t
            .insert(key("a"), creds("a"), Some("1"), session("a1"), t0)
            .is_empty());
        assert!(t
            .insert(key("a"), creds("a"), Some("2"), session("a2"), t0)
            .is_empty());
        // A third capability set of a's: a's least recently used goes, not b's older one.
        let closed = t.insert(key("a"), creds("a"), Some("3"), session("a3"), t0);
        assert_eq!(closed.len(), 1);
        assert_eq!(closed[0].session.id.as_ref().unwrap(), "a1");
        assert!(t.get(key("b"), None, t0).is_some());
        assert_eq!(t.ledger.held_by(Pool::Sessions, key("a")), 2);
        assert_eq!(t.ledger.in_use(Pool::Sessions), 3);
        drop(t.clear());
        assert_eq!(t.ledger.in_use(Pool::Sessions), 0, "every place given back");
    }

    #[test]
    fn idle_sessions_go() {
        let t = SessionTable::new(
            Ledger::with(Pool::Sessions, 10, 1000),
            Duration::from_millis(1),
        );
        let t0 = Instant::now();
        t.insert(key("a"), creds("a"), None, session("s1"), t0);
        let later = t0 + Duration::from_millis(5);
        assert!(t.get(key("a"), None, later).is_none());
        assert_eq!(t.sweep(later).len(), 1);
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn a_session_in_use_is_not_idle() {
        let t = SessionTable::new(
            Ledger::with(Pool::Sessions, 10, 1000),
            Duration::from_secs(60),
        );
        let t0 = Instant::now();
        t.insert(key("a"), creds("a"), None, session("s1"), t0);
        assert!(t
            .get(key("a"), None, t0 + Duration::from_secs(50))
            .is_some());
        // Used at 50 s: still kept at 100 s, gone at 110 s.
        assert!(t.sweep(t0 + Duration::from_secs(100)).is_empty());
        assert_eq!(t.sweep(t0 + Duration::from_secs(110)).len(), 1);
    }

    #[test]
    fn every_session_let_go_gets_its_delete() {
        let t = SessionTable::new(
            Ledger::with(Pool::Sessions, 1, 1000),
            Duration::from_secs(600),
        );
        let now = Instant::now();
        t.insert(key("a"), creds("a"), None, session("s1"), now);
        let evicted = t.insert(key("b"), creds("b"), None, session("s2"), now);
        assert_eq!(evicted.len(), 1);
        let base = SessionTable::credentials(&evicted[0].credentials);
        let delete = evicted[0].delete_headers(base).unwrap();
        assert_eq!(delete[headers::SESSION_ID], "s1");
        assert_eq!(delete[headers::PROTOCOL_VERSION], "2025-11-25");
        assert_eq!(
            delete["authorization"], "a",
            "with the session's own credentials"
        );
        // At shutdown (or an era change) the rest go too, each with its DELETE.
        let rest = t.clear();
        assert_eq!(rest.len(), 1);
        assert_eq!(t.len(), 0);
        let delete = rest[0].delete_headers(HeaderMap::new()).unwrap();
        assert_eq!(delete[headers::SESSION_ID], "s2");
        // A stateless upstream's session has no id: nothing to close.
        let stateless = Closed {
            session: Arc::new(LegacySession {
                id: None,
                version: "2025-11-25".into(),
                init: json!({}),
            }),
            credentials: HeaderMap::new(),
        };
        assert!(stateless.delete_headers(HeaderMap::new()).is_none());
    }

    #[test]
    fn a_forgotten_session_is_initialised_again() {
        assert_eq!(in_session(StatusCode::NOT_FOUND), InSession::Forgotten);
        assert_eq!(in_session(StatusCode::BAD_REQUEST), InSession::ReadToTell);
        assert_eq!(in_session(StatusCode::OK), InSession::Answered);
        assert_eq!(in_session(StatusCode::UNAUTHORIZED), InSession::Answered);
        // A 400 is a forgotten session only when it names the session.
        assert!(mentions_session(
            br#"{"error":{"message":"Bad Request: No valid Session ID"}}"#
        ));
        assert!(!mentions_session(
            br#"{"error":{"code":-32602,"message":"Invalid params"}}"#
        ));
    }
}
