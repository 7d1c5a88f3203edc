//! The MCP authorization front door: the sidecar as the OAuth 2.1 resource server MCP
//! 2026-07-28 describes (`basic/authorization`), so the product behind it writes no OAuth.
//!
//! - Protected Resource Metadata (RFC 9728) at `/.well-known/oauth-protected-resource` and its
//!   path-suffixed forms ([`Authorizer::metadata_route`]), built once at start.
//! - Every MCP request's bearer token checked ([`Authorizer::check`]): read from one
//!   `Authorization: Bearer` header (never from the query), then a verified-token cache (by
//!   the token's SHA-256, never past its expiry, bounded LRU), then the check of the mode:
//!   a JWT with the issuer's keys (`jwt`, `keys`), or the issuer's introspection endpoint
//!   (`introspect`). Then the scopes every call needs.
//! - A refusal is an [`Error`] with its challenge (`WWW-Authenticate: Bearer …`, RFC 6750 §3
//!   and RFC 9728 §5.1), counted by a fixed reason ([`Reason`]); the token, its claims and
//!   the refs never reach a log line, a metric label or an error message.
//! - What a verified token says travels as a [`Principal`]: the subject and scopes the
//!   upstream is told in headers the sidecar owns ([`Authorizer::to_upstream`]; the client's
//!   token itself only with `auth_forward_token`), and the identity refs for Epode.
//!
//! Cost: a cached token is one SHA-256 of it and one LRU lookup under a lock (the whole check
//! under 1 µs for a 700-byte token); a first sight of a JWT adds one signature check (RS256,
//! 2048-bit key: about 20 µs, the whole first check 22–25 µs; release build,
//! `cargo test --release --lib auth_costs -- --ignored --nocapture`, docs/benchmark.md); an
//! opaque token one introspection round trip, then cached.

mod facade;
mod fetch;
mod introspect;
mod jwt;
mod keys;
mod reason;

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode};
use lru::LruCache;
use parking_lot::Mutex;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::body::{self, Body};
use crate::caller::CallerKey;
use crate::config::{AuthConfig, AuthMode, OperationKind};
use crate::error::{Error, ErrorKind};
use crate::feedback::capability::ProductKey;
use crate::feedback::identity::IdentityRefs;
use crate::ledger::{self, Ledger, Pool};
use crate::metrics::Metrics;

pub(crate) use self::facade::{Facade, FacadeRoute, MAX_FORM as FACADE_MAX_FORM};
use self::keys::{KeyFetch, KeyStore, Metadata};
pub(crate) use self::reason::Reason;

/// The headers the sidecar owns on the way upstream: removed from every client request, set
/// from a verified token.
pub(crate) const SUBJECT_HEADER: HeaderName = HeaderName::from_static("epode-auth-subject");
pub(crate) const SCOPES_HEADER: HeaderName = HeaderName::from_static("epode-auth-scopes");
pub(crate) const CLIENT_HEADER: HeaderName = HeaderName::from_static("epode-auth-client");

/// The well-known path of Protected Resource Metadata (RFC 9728 §3).
pub(crate) const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// The longest token read: real access tokens are a few KiB.
const MAX_TOKEN: usize = 16 * 1024;

/// A refusal, before it becomes a response.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub(crate) reason: Reason,
    /// For the operator's log: what the sidecar was doing (never the token or its claims).
    detail: Option<String>,
    /// Why the ledger gave no introspection a place ([`Reason::IntrospectionsBusy`]).
    busy: Option<ledger::Refused>,
}

impl From<Reason> for Refusal {
    fn from(reason: Reason) -> Self {
        Refusal {
            reason,
            detail: None,
            busy: None,
        }
    }
}

/// A call the check made to the introspection endpoint, for the request's trace: it was
/// made before the request's span could exist, so it is kept and spanned afterwards.
pub(crate) struct Asked {
    pub(crate) started: std::time::SystemTime,
    pub(crate) ended: std::time::SystemTime,
    /// The endpoint, scheme to path (no query, no credential).
    pub(crate) url: String,
    pub(crate) host: Option<String>,
    pub(crate) port: Option<u16>,
    /// The endpoint's status, when it answered.
    pub(crate) status: Option<u16>,
    /// What the answer said of the token (`active`, or the reason it was refused).
    pub(crate) outcome: &'static str,
    /// Why the call itself failed (`timeout`, `network`, the status …), when it did.
    pub(crate) error: Option<String>,
}

impl Asked {
    /// The call as a client span under `parent` (the request's span), by the HTTP client
    /// conventions; when OpenTelemetry is on and `parent` is sampled.
    pub(crate) fn span_under(&self, parent: &opentelemetry::Context) {
        use opentelemetry::KeyValue;
        let path = self
            .url
            .split_once("://")
            .map_or("/", |(_, rest)| rest.find('/').map_or("/", |i| &rest[i..]));
        crate::otel::past(
            parent,
            format!("POST {path}"),
            (self.started, self.ended),
            || {
                let mut a = vec![
                    KeyValue::new("http.request.method", "POST"),
                    KeyValue::new("url.full", self.url.clone()),
                    KeyValue::new("epode.auth.outcome", self.outcome),
                ];
                if let Some(h) = &self.host {
                    a.push(KeyValue::new("server.address", h.clone()));
                }
                if let Some(p) = self.port {
                    a.push(KeyValue::new("server.port", i64::from(p)));
                }
                if let Some(s) = self.status {
                    a.push(KeyValue::new("http.response.status_code", i64::from(s)));
                }
                a
            },
            self.error.as_deref(),
        );
    }
}

/// Who a verified token says is calling.
#[derive(Debug, Clone)]
pub(crate) struct Principal {
    /// The user claim's value, as the upstream is told it (`Epode-Auth-Subject`).
    pub(crate) subject: Option<String>,
    pub(crate) scopes: Vec<String>,
    /// The OAuth client the token was issued to (`client_id`, else `azp`), when it says.
    pub(crate) client_id: Option<String>,
    /// The refs for Epode (`userRef`, `accountRef`, `customerRef` = `accountRef`).
    pub(crate) refs: IdentityRefs,
    /// Who it is as a caller (`crate::caller`): the issuer and subject, else the OAuth
    /// client, else the token itself; never two principals' one.
    pub(crate) caller: CallerKey,
}

enum Cached {
    Valid(Arc<Principal>),
    Refused(Reason),
}

struct Entry {
    value: Cached,
    until: Instant,
    /// The key set a JWT was verified with (when it was fetched): once the issuer's keys
    /// are fetched again, the token is verified again with them, so a token whose key left
    /// the set is refused from then on, not at its own `exp`.
    verified_with: Option<Instant>,
}

/// The longest a verified token is kept, whatever its `exp` says.
const MAX_KEEP: Duration = Duration::from_secs(24 * 3600);

/// `now` plus `d`, kept within [`MAX_KEEP`] (a far `exp` never overflows an `Instant`).
fn kept_until(now: Instant, d: Duration) -> Instant {
    now + d.min(MAX_KEEP)
}

/// What the check of the mode needs, learned from the issuer's metadata at start.
enum Backend {
    Jwt(Arc<KeyStore>),
    Introspect(url::Url),
}

/// The front door's state, shared by every worker.
pub(crate) struct Authorizer {
    config: AuthConfig,
    client: reqwest::Client,
    backend: tokio::sync::OnceCell<Backend>,
    /// Why the issuer's metadata or keys could not be read, for `/readyz` (the operator's).
    not_ready: Mutex<Option<String>>,
    /// One discovery at a time, and not more often than `auth_keys_refresh`.
    discovering: tokio::sync::Mutex<Option<Instant>>,
    cache: Mutex<LruCache<[u8; 32], Entry>>,
    metrics: Arc<Metrics>,
    refs: RefMaker,
    metadata: Bytes,
    /// `resource_metadata="…"` and the base `scope="…"`, written once.
    challenge_tail: String,
    /// Where the introspections in flight are charged to the client's address.
    ledger: Arc<Ledger>,
    /// The authorization facade, with `auth_facade`.
    facade: Option<Facade>,
}

impl Authorizer {
    /// The front door for `config`, its metadata document written; the issuer's metadata and
    /// keys are read by [`Authorizer::prepare`].
    pub(crate) fn new(
        config: AuthConfig,
        metrics: Arc<Metrics>,
        key: Option<&ProductKey>,
        ledger: Arc<Ledger>,
    ) -> Result<Arc<Self>, Error> {
        let client = reqwest::Client::builder()
            .connect_timeout(config.fetch_timeout)
            .timeout(config.fetch_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("epode-sidecar/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| {
                Error::caused_by(
                    ErrorKind::Internal,
                    "building the authorization server's HTTP client",
                    e,
                )
            })?;
        let metadata_url = metadata_url(&config.resource);
        let mut doc = Map::new();
        doc.insert("resource".into(), Value::from(config.resource.clone()));
        let facade = config
            .facade
            .then(|| Facade::new(&config.resource))
            .flatten();
        let named = facade
            .as_ref()
            .map_or_else(|| config.issuer.clone(), Facade::issuer);
        doc.insert("authorization_servers".into(), Value::from(vec![named]));
        // Every scope a call may need: the base ones, the operations', and the hierarchy's.
        let mut supported = config.scopes.clone();
        let more = config.operation_scopes.iter().flat_map(|r| r.scopes.iter());
        for s in more
            .chain(config.implies.keys())
            .chain(config.implies.values().flatten())
        {
            if !supported.contains(s) {
                supported.push(s.clone());
            }
        }
        if !supported.is_empty() {
            doc.insert("scopes_supported".into(), Value::from(supported));
        }
        // (No `resource_signing_alg_values_supported`: RFC 9728 means the algorithms the
        // resource signs its own responses with, and the sidecar signs none.)
        doc.insert(
            "bearer_methods_supported".into(),
            serde_json::json!(["header"]),
        );
        if let Some(d) = &config.documentation {
            doc.insert("resource_documentation".into(), Value::from(d.clone()));
        }
        let mut challenge_tail = format!("resource_metadata=\"{metadata_url}\"");
        if !config.scopes.is_empty() {
            challenge_tail.push_str(&format!(", scope=\"{}\"", config.scopes.join(" ")));
        }
        let cache =
            LruCache::new(NonZeroUsize::new(config.cache_entries).unwrap_or(NonZeroUsize::MIN));
        for reason in Reason::ALL {
            metrics.auth_refused(reason.as_str(), 0);
        }
        Ok(Arc::new(Authorizer {
            refs: RefMaker::new(&config, key),
            config,
            client,
            backend: tokio::sync::OnceCell::new(),
            not_ready: Mutex::new(Some(
                "the authorization server's metadata has not been read yet".into(),
            )),
            discovering: tokio::sync::Mutex::new(None),
            cache: Mutex::new(cache),
            metrics,
            metadata: Bytes::from(Value::Object(doc).to_string()),
            challenge_tail,
            ledger,
            facade,
        }))
    }

    /// Reads the issuer's metadata and (for JWTs) its keys; on failure says why in `/readyz`
    /// and the log, and tries again at most every `auth_keys_refresh` when a request needs it
    /// (and in `watch`).
    pub(crate) async fn prepare(&self) -> Result<(), String> {
        let result = self.backend().await.map(|_| ());
        *self.not_ready.lock() = result.as_ref().err().cloned();
        result
    }

    /// Keeps trying until the issuer is read (so `/readyz` turns ready without a request).
    pub(crate) async fn watch(self: Arc<Self>) {
        let mut wait = Duration::from_millis(500);
        loop {
            match self.prepare().await {
                Ok(()) => {
                    tracing::info!(issuer = %self.config.issuer, "read the authorization server's metadata and keys");
                    return;
                }
                Err(why) => {
                    tracing::warn!(%why, "the authorization server cannot be read yet; MCP requests get 503 until it can")
                }
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(self.config.keys_refresh);
        }
    }

    /// Why requests cannot be checked now, for `/readyz`; `None` when they can.
    pub(crate) fn not_ready(&self) -> Option<String> {
        self.not_ready.lock().clone()
    }

    async fn backend(&self) -> Result<&Backend, String> {
        if let Some(b) = self.backend.get() {
            return Ok(b);
        }
        let mut last = self.discovering.lock().await;
        if let Some(b) = self.backend.get() {
            return Ok(b);
        }
        if last.is_some_and(|t| t.elapsed() < self.config.keys_refresh.min(Duration::from_secs(5)))
        {
            return Err(self
                .not_ready()
                .unwrap_or_else(|| "the authorization server cannot be read".into()));
        }
        *last = Some(Instant::now());
        let metadata = keys::discover(&self.client, &self.config.issuer, self.config.fetch_timeout)
            .await
            .map_err(|e| e.0)?;
        if let Some(f) = &self.facade {
            f.learn(&metadata.document)?;
        }
        let backend = self.backend_from(metadata)?;
        if let Backend::Jwt(store) = &backend {
            let (fetched, result) = store.refresh(None, keys::Why::Start).await;
            self.count_fetch(fetched, store);
            result.map_err(|e| e.0)?;
        }
        let _ = self.backend.set(backend);
        Ok(self.backend.get().unwrap_or_else(|| unreachable!()))
    }

    fn backend_from(&self, m: Metadata) -> Result<Backend, String> {
        match self.config.mode {
            AuthMode::Introspect => m.introspection_endpoint.map(Backend::Introspect).ok_or_else(|| {
                format!("the metadata of {} names no introspection_endpoint (EPODE_SIDECAR_AUTH=introspect needs one)", self.config.issuer)
            }),
            _ => m
                .jwks_uri
                .map(|u| Backend::Jwt(Arc::new(KeyStore::new(u, self.client.clone(), (self.config.fetch_timeout, self.config.keys_refresh, self.config.keys_max_age)))))
                .ok_or_else(|| format!("the metadata of {} names no jwks_uri (EPODE_SIDECAR_AUTH=jwt needs one)", self.config.issuer)),
        }
    }

    fn count_fetch(&self, fetched: KeyFetch, store: &KeyStore) {
        count_fetch(&self.metrics, fetched, store);
    }

    /// Protected Resource Metadata, for a GET (or HEAD) of its well-known path: bare, with
    /// the resource's path, or with the MCP path. Public (any origin may read it).
    pub(crate) fn metadata_route(
        &self,
        method: &Method,
        path: &str,
        mcp_path: &str,
    ) -> Option<Response<Body>> {
        let rest = path.strip_prefix(METADATA_PATH)?;
        let resource_path = url::Url::parse(&self.config.resource)
            .map(|u| u.path().trim_end_matches('/').to_owned())
            .unwrap_or_default();
        if !(rest.is_empty() || rest == resource_path || rest == mcp_path) {
            return None;
        }
        if method != Method::GET && method != Method::HEAD {
            let mut resp = body::error(
                StatusCode::METHOD_NOT_ALLOWED,
                "the protected resource metadata is read with GET",
            );
            resp.headers_mut()
                .insert(http::header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            return Some(resp);
        }
        let mut resp = body::json(StatusCode::OK, self.metadata.clone());
        let h = resp.headers_mut();
        h.insert(
            http::header::CACHE_CONTROL,
            HeaderValue::from_static("public, max-age=3600"),
        );
        h.insert(
            http::header::ACCESS_CONTROL_ALLOW_ORIGIN,
            HeaderValue::from_static("*"),
        );
        Some(resp)
    }

    /// The 404's words for an OAuth endpoint a client looked for on the sidecar: the
    /// authorization server is elsewhere, and where the client learns it.
    pub(crate) fn not_here(&self, path: &str) -> String {
        let issuer = self
            .facade
            .as_ref()
            .map_or_else(|| self.config.issuer.clone(), Facade::issuer);
        format!(
            "not found: epode-sidecar serves no {path}. It is this MCP server's resource server, \
             not its authorization server: that is {issuer}, named in the protected resource \
             metadata at {} (MCP 2025-06-18 and later; RFC 9728). A client looking for {path} \
             here guessed it from the MCP server's address (the 2025-03-26 fallback): it should \
             read that metadata, or be given the authorization server's endpoints",
            metadata_url(&self.config.resource)
        )
    }

    /// The caller of one MCP request, or why it is refused (counted); `asked` notes the
    /// introspection call the check made, if any; `address` is the client's address as a
    /// caller (an introspection in flight is charged to it).
    pub(crate) async fn check(
        &self,
        headers: &HeaderMap,
        query: Option<&str>,
        address: CallerKey,
        asked: &mut Option<Asked>,
    ) -> Result<Arc<Principal>, Refusal> {
        let result = self.principal(headers, query, address, asked).await;
        if let Err(r) = &result {
            self.count(r);
        }
        result
    }

    fn count(&self, r: &Refusal) {
        self.metrics.auth_refused(r.reason.as_str(), 1);
        match &r.detail {
            Some(detail) if r.reason != Reason::Malformed => {
                tracing::warn!(reason = r.reason.as_str(), %detail, "a request's token could not be checked")
            }
            _ => tracing::debug!(reason = r.reason.as_str(), "a request's token was refused"),
        }
    }

    /// Every scope a request needs: the base ones, and those of every rule its tool's or
    /// prompt's name or its resource's URI matches (`local`: one of the feedback tools,
    /// which need the base scopes only).
    pub(crate) fn needed(
        &self,
        kind: Option<OperationKind>,
        name: Option<&str>,
        local: bool,
    ) -> Vec<String> {
        let mut needed = self.config.scopes.clone();
        if let (Some(kind), Some(name), false) = (kind, name, local) {
            for rule in self
                .config
                .operation_scopes
                .iter()
                .filter(|r| r.kind == kind)
            {
                if rule.matcher.is_match(name) {
                    for s in &rule.scopes {
                        if !needed.contains(s) {
                            needed.push(s.clone());
                        }
                    }
                }
            }
        }
        needed
    }

    /// Whether `principal` holds every scope in `needed` (directly or through the operator's
    /// hierarchy); else the 403 that names them all (counted).
    pub(crate) fn require(&self, principal: &Principal, needed: &[String]) -> Result<(), Error> {
        let holds = |want: &String| {
            let bare = self.bare_scope(want);
            principal.scopes.iter().any(|s| {
                s == want
                    || Some(s.as_str()) == bare
                    || self.config.implies.get(s).is_some_and(|g| g.contains(want))
            })
        };
        if needed.iter().all(holds) {
            return Ok(());
        }
        self.count(&Reason::InsufficientScope.into());
        Err(self.insufficient(needed))
    }

    /// The bare name of a scope written `<audience>/<name>` for one of the audiences
    /// configured (Entra asks clients for `api://…/mcp.tools` and writes `mcp.tools` in the
    /// token's `scp`).
    fn bare_scope<'a>(&self, scope: &'a str) -> Option<&'a str> {
        self.config.audience.iter().find_map(|a| {
            scope
                .strip_prefix(a.as_str())?
                .strip_prefix('/')
                .filter(|s| !s.is_empty())
        })
    }

    /// The step-up answer: 403 naming every scope the request needs, in one challenge.
    fn insufficient(&self, needed: &[String]) -> Error {
        let metadata_url = metadata_url(&self.config.resource);
        Error::new(
            ErrorKind::InsufficientScope {
                challenge: format!(
                    "Bearer error=\"insufficient_scope\", scope=\"{}\", resource_metadata=\"{metadata_url}\", error_description=\"{}\"",
                    needed.join(" "),
                    Reason::InsufficientScope.description()
                ),
            },
            format!(
                "the access token lacks a scope this request needs (it needs: {})",
                needed.join(" ")
            ),
        )
    }

    async fn principal(
        &self,
        headers: &HeaderMap,
        query: Option<&str>,
        address: CallerKey,
        asked: &mut Option<Asked>,
    ) -> Result<Arc<Principal>, Refusal> {
        let token = bearer(headers, query)?;
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let now = Instant::now();
        if let Some(hit) = self.cached(&digest, now) {
            return hit;
        }
        let backend = self.backend().await.map_err(|why| Refusal {
            reason: match self.config.mode {
                AuthMode::Introspect => Reason::IntrospectionUnavailable,
                _ => Reason::KeysUnavailable,
            },
            detail: Some(why),
            busy: None,
        })?;
        let (claims, until, verified_with) = match backend {
            Backend::Jwt(store) => {
                let (claims, exp, set) = self.verify_jwt(store, token).await?;
                (claims, kept_until(now, until_unix(exp)), Some(set))
            }
            Backend::Introspect(endpoint) => {
                let (claims, exp) = self
                    .introspected(endpoint, token, &digest, address, asked)
                    .await?;
                let keep = self.config.introspection_cache;
                let until = exp.map_or(keep, |exp| until_unix(exp).min(keep));
                (claims, kept_until(now, until), None)
            }
        };
        let principal = Arc::new(self.principal_of(&claims, &digest));
        self.remember(
            digest,
            Entry {
                value: Cached::Valid(principal.clone()),
                until,
                verified_with,
            },
        );
        Ok(principal)
    }

    /// An opaque token asked of the issuer's introspection endpoint, in one of `address`'s
    /// places (and the process's) while in flight: its claims and `exp`; the call noted in
    /// `asked` for the request's span; an inactive token remembered a few seconds.
    async fn introspected(
        &self,
        endpoint: &url::Url,
        token: &str,
        digest: &[u8; 32],
        address: CallerKey,
        asked: &mut Option<Asked>,
    ) -> Result<(Map<String, Value>, Option<u64>), Refusal> {
        let _place = self
            .ledger
            .try_charge(Pool::Introspections, address)
            .map_err(|why| Refusal {
                reason: Reason::IntrospectionsBusy,
                detail: None,
                busy: Some(why),
            })?;
        let started = std::time::SystemTime::now();
        let mut status = None;
        let answer =
            introspect::introspect(&self.client, endpoint, token, &self.config, &mut status).await;
        *asked = Some(Asked {
            started,
            ended: std::time::SystemTime::now(),
            url: fetch::shown(endpoint),
            host: endpoint.host_str().map(str::to_owned),
            port: endpoint.port_or_known_default(),
            status,
            outcome: answer
                .as_ref()
                .map_or_else(|(r, _)| r.as_str(), |_| "active"),
            error: introspect::failure(&answer, status),
        });
        answer.map_err(|(reason, detail)| {
            if detail.is_none() {
                self.remember(
                    *digest,
                    Entry {
                        value: Cached::Refused(reason),
                        until: Instant::now() + introspect::NEGATIVE_KEEP,
                        verified_with: None,
                    },
                );
            }
            Refusal {
                reason,
                detail,
                busy: None,
            }
        })
    }

    /// A token seen before: its principal or its refusal, while that holds (a JWT verified
    /// with keys fetched since is not: it is verified again).
    fn cached(&self, digest: &[u8; 32], now: Instant) -> Option<Result<Arc<Principal>, Refusal>> {
        let keys = match self.backend.get() {
            Some(Backend::Jwt(store)) => store.current().map(|set| {
                // Keys past their lifetime are fetched again even while every request is a
                // cached token's: the tokens are then verified again with the new ones.
                if !set.fresh() {
                    self.refresh_in_background(store, set.fetched);
                }
                set.fetched
            }),
            _ => None,
        };
        let mut cache = self.cache.lock();
        let entry = cache.get(digest)?;
        let stale_keys = entry.verified_with.is_some_and(|v| Some(v) != keys);
        if entry.until <= now || stale_keys {
            cache.pop(digest);
            return None;
        }
        Some(match &entry.value {
            Cached::Valid(p) => Ok(p.clone()),
            Cached::Refused(r) => Err((*r).into()),
        })
    }

    fn remember(&self, digest: [u8; 32], entry: Entry) {
        self.cache.lock().put(digest, entry);
    }

    /// A JWT's verified claims, its `exp`, and when the key set that verified it was fetched.
    /// Keys past their lifetime are used while fresh ones are fetched in the background (a
    /// hanging key endpoint never holds a request); a key the set does not hold is fetched
    /// for (at most once per interval) before the token is refused.
    async fn verify_jwt(
        &self,
        store: &Arc<KeyStore>,
        token: &str,
    ) -> Result<(Map<String, Value>, u64, Instant), Refusal> {
        let head = jwt::head(token, &self.config)?;
        let set = store.current();
        if let Some(s) = &set {
            if !s.fresh() {
                self.refresh_in_background(store, s.fetched);
            }
        }
        let Some(first) = set else {
            return Err(Reason::KeysUnavailable.into());
        };
        match jwt::verify(token, &head, &first, &self.config) {
            Err(Reason::UnknownKey) => {
                // A key the sidecar does not hold: perhaps a rotation. One fetch per interval,
                // however many tokens name unknown keys.
                let (fetched, _) = store
                    .refresh(Some(first.fetched), keys::Why::UnknownKid)
                    .await;
                self.count_fetch(fetched, store);
                let again = store.current().ok_or(Reason::KeysUnavailable)?;
                if Arc::ptr_eq(&again, &first) {
                    return Err(Reason::UnknownKey.into());
                }
                let (claims, exp) = jwt::verify(token, &head, &again, &self.config)?;
                Ok((claims, exp, again.fetched))
            }
            Ok((claims, exp)) => Ok((claims, exp, first.fetched)),
            Err(r) => Err(r.into()),
        }
    }

    /// Fetches the keys again in the background (at most once per interval, one fetch at a
    /// time: `KeyStore::refresh`); a failure keeps the keys held.
    fn refresh_in_background(&self, store: &Arc<KeyStore>, seen: Instant) {
        if !store.start_refreshing() {
            return;
        }
        let (store, metrics) = (store.clone(), self.metrics.clone());
        tokio::spawn(async move {
            let (fetched, _) = store.refresh(Some(seen), keys::Why::Expired).await;
            count_fetch(&metrics, fetched, &store);
            store.done_refreshing();
        });
    }

    fn principal_of(&self, claims: &Map<String, Value>, digest: &[u8; 32]) -> Principal {
        let text = |name: &str| match claims.get(name) {
            Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            _ => None,
        };
        let scopes = match claims.get("scope").or_else(|| claims.get("scp")) {
            Some(Value::String(s)) => s
                .split(' ')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
            _ => Vec::new(),
        };
        let subject = text(&self.config.user_claim);
        let account = self.config.account_claim.as_deref().and_then(text);
        let client_id = text("client_id").or_else(|| text("azp"));
        let mut refs = IdentityRefs::default();
        if let Some(s) = &subject {
            // A person's subject is never sent as it is, however ref-shaped (`john.smith`):
            // only an OAuth client's own (a client-credentials token, whose subject is its
            // client id) may be.
            let service = client_id.as_deref() == Some(s.as_str());
            refs.user_ref = Some(if service {
                self.refs.make(s)
            } else {
                self.refs.hashed(s)
            });
        }
        if let Some(a) = &account {
            let r = self.refs.make(a);
            refs.customer_ref = Some(r.clone());
            refs.account_ref = Some(r);
        }
        let caller = CallerKey::of_token(
            &self.config.issuer,
            subject.as_deref().or(text("sub").as_deref()),
            client_id.as_deref(),
            digest,
        );
        Principal {
            subject,
            scopes,
            client_id,
            refs,
            caller,
        }
    }

    /// The refusal as the client's answer: 401 with the challenge (the `error` and its
    /// description when a token was given), 400 for a malformed request, 403
    /// `insufficient_scope` naming every scope needed, 503 with `Retry-After` when the
    /// issuer cannot be asked.
    pub(crate) fn refuse(&self, refusal: &Refusal) -> Error {
        let r = refusal.reason;
        let kind = |challenge: String| ErrorKind::Unauthorized { challenge };
        if let Some(why) = refusal.busy {
            return self.ledger.refusal(Pool::Introspections, why);
        }
        match r {
            Reason::IntrospectionUnavailable | Reason::KeysUnavailable => Error::new(
                ErrorKind::AuthUnavailable { retry_after: 5 },
                "the authorization server cannot be reached to check the token; retry shortly",
            ),
            Reason::Missing => Error::new(
                kind(format!("Bearer {}", self.challenge_tail)),
                "this MCP server needs an access token: send Authorization: Bearer <token>, obtained from the authorization server its protected resource metadata names",
            ),
            Reason::Malformed if refusal.detail.as_deref() == Some(MALFORMED_REQUEST) => Error::new(
                ErrorKind::BadAuthorization {
                    challenge: format!("Bearer error=\"invalid_request\", error_description=\"{}\", {}", MALFORMED_REQUEST, self.challenge_tail),
                },
                "the Authorization header is malformed: send exactly one Authorization: Bearer <token>, never a token in the query string",
            ),
            Reason::InsufficientScope => self.insufficient(&self.config.scopes),
            _ => Error::new(
                kind(format!("Bearer error=\"invalid_token\", error_description=\"{}\", {}", r.description(), self.challenge_tail)),
                format!("the access token is refused: {}", r.description()),
            ),
        }
    }

    /// Whether requests to the HTTP surface are checked too (`auth_http_surface`): with the
    /// base scopes, their headers made as an MCP request's are.
    pub(crate) fn checks_surface(&self) -> bool {
        self.config.http_surface
    }

    /// The scopes every request needs.
    pub(crate) fn base_scopes(&self) -> &[String] {
        &self.config.scopes
    }

    /// The request's headers as they go upstream: the headers the sidecar owns set from the
    /// verified token, and the client's token removed unless `auth_forward_token`.
    pub(crate) fn to_upstream(&self, headers: &mut HeaderMap, principal: &Principal) {
        strip_owned(headers);
        if !self.config.forward_token {
            headers.remove(http::header::AUTHORIZATION);
        }
        let mut set = |name: HeaderName, value: &str| match HeaderValue::from_str(value) {
            Ok(v) => {
                headers.insert(name, v);
                true
            }
            Err(_) => false,
        };
        if let Some(s) = &principal.subject {
            // A subject no header can hold is told as its ref (a keyed hash of it), so every
            // principal still has its own sessions and children.
            if !set(SUBJECT_HEADER, s) {
                if let Some(r) = &principal.refs.user_ref {
                    set(SUBJECT_HEADER, r);
                }
            }
        }
        set(SCOPES_HEADER, &principal.scopes.join(" "));
        if let Some(c) = &principal.client_id {
            set(CLIENT_HEADER, c);
        }
    }
}

/// A fetch of the keys, for the metrics.
fn count_fetch(metrics: &Metrics, fetched: KeyFetch, store: &KeyStore) {
    let outcome = match fetched {
        KeyFetch::Done => "fetched",
        KeyFetch::Failed => "failed",
        KeyFetch::Skipped => return,
    };
    metrics.auth_key_fetch(outcome);
    if let Some(set) = store.current() {
        metrics.auth.keys.set(set.len() as i64);
        let at = set
            .fetched_at
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        metrics.auth.keys_fetched.set(at as i64);
    }
}

/// The headers the sidecar owns, removed from a client's request (whether auth is on or not:
/// a client never names itself to the upstream), in every spelling an app server may read as
/// one of them: WSGI and CGI (and Puma before 6.4.3) fold `_` into `-`; `.` and an `X-` prefix
/// are read alike by others (nginx and Envoy drop names with `_` for this reason). The app's
/// own `Epode-Identity` (a response header) is never taken from a client either.
pub(crate) fn strip_owned(headers: &mut HeaderMap) {
    // One pass over the names, each a few bytes' look: most requests have none to remove.
    let doomed: Vec<HeaderName> = headers
        .keys()
        .filter(|n| is_owned_spelling(n.as_str()))
        .cloned()
        .collect();
    for name in doomed {
        headers.remove(name);
    }
}

/// Whether a header name (lower case, as `http` keeps them) is one the sidecar owns in some
/// spelling: `epode-auth-subject`, `Epode_Auth_Subject`, `X-Epode-Auth-Subject`,
/// `epode.auth.subject`, `x_epode_identity`…
fn is_owned_spelling(name: &str) -> bool {
    const STEMS: [&str; 4] = [
        "epode-auth-subject",
        "epode-auth-scopes",
        "epode-auth-client",
        "epode-identity",
    ];
    let b = name.as_bytes();
    let rest = match b {
        [b'x', b'-' | b'_' | b'.', rest @ ..] => rest,
        _ => b,
    };
    STEMS.iter().any(|stem| {
        stem.len() == rest.len()
            && stem
                .bytes()
                .zip(rest)
                .all(|(want, got)| want == *got || (want == b'-' && matches!(got, b'_' | b'.')))
    })
}

/// The authorization facade's routes (`facade.rs`), as the front door serves them.
impl Authorizer {
    /// Which facade route `path` is, when the facade is on.
    pub(crate) fn facade_route(&self, path: &str) -> Option<FacadeRoute> {
        self.facade.as_ref().and(Facade::route(path))
    }

    /// The facade, its issuer's metadata read (tried now when it was not yet, at most as
    /// often as the front door tries).
    async fn facade_read(&self) -> Option<&Facade> {
        let f = self.facade.as_ref()?;
        if !f.ready() {
            let _ = self.prepare().await;
        }
        Some(f)
    }

    /// A GET of the facade's metadata, or the authorization request's redirect.
    pub(crate) async fn facade_plain(
        &self,
        route: FacadeRoute,
        method: &Method,
        query: Option<&str>,
    ) -> Response<Body> {
        let Some(f) = self.facade_read().await else {
            return body::error(StatusCode::NOT_FOUND, "no authorization facade here");
        };
        let resp = match route {
            FacadeRoute::Authorize => f.authorize(method, query),
            _ => f.metadata(method),
        };
        let outcome = if resp.status().is_success() || resp.status().is_redirection() {
            "served"
        } else {
            "refused"
        };
        self.metrics.auth_facade(route.as_str(), outcome);
        resp
    }

    /// The token request's head: `Err` is the answer (counted).
    pub(crate) async fn facade_token_head(
        &self,
        method: &Method,
        headers: &HeaderMap,
    ) -> Result<(), Box<Response<Body>>> {
        let Some(f) = self.facade_read().await else {
            return Err(Box::new(body::error(
                StatusCode::NOT_FOUND,
                "no authorization facade here",
            )));
        };
        f.token_head(method, headers).inspect_err(|_| {
            self.metrics
                .auth_facade(FacadeRoute::Token.as_str(), "refused");
        })
    }

    /// The token request passed to the issuer, in one of the caller's places for calls to
    /// the issuer (the introspections' pool): 429 or 503 past them.
    pub(crate) async fn facade_token(
        &self,
        headers: &HeaderMap,
        form: &Bytes,
        caller: CallerKey,
    ) -> Response<Body> {
        let endpoint = FacadeRoute::Token.as_str();
        let Some(f) = self.facade.as_ref() else {
            return body::error(StatusCode::NOT_FOUND, "no authorization facade here");
        };
        let _place = match self.ledger.try_charge(Pool::Introspections, caller) {
            Ok(place) => place,
            Err(why) => {
                self.metrics.auth_facade(endpoint, "refused");
                let e = self.ledger.refusal(Pool::Introspections, why);
                let mut resp =
                    facade::oauth_error(e.status(), "temporarily_unavailable", &e.to_string());
                resp.headers_mut()
                    .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
                return resp;
            }
        };
        match f
            .token(&self.client, headers, form, self.config.fetch_timeout)
            .await
        {
            Ok(resp) => {
                self.metrics.auth_facade(endpoint, "served");
                resp
            }
            Err(failed) => {
                let (resp, why) = *failed;
                self.metrics.auth_facade(endpoint, "failed");
                tracing::warn!(%why, "the authorization facade could not pass a token request on");
                resp
            }
        }
    }
}

/// The PRM URL for a resource (RFC 9728 §3.1: the well-known segment between the host and
/// the resource's path).
fn metadata_url(resource: &str) -> String {
    match url::Url::parse(resource) {
        Ok(u) => {
            let path = u.path().trim_end_matches('/');
            format!("{}{METADATA_PATH}{path}", u.origin().ascii_serialization())
        }
        Err(_) => format!("{resource}{METADATA_PATH}"),
    }
}

fn until_unix(exp: u64) -> Duration {
    Duration::from_secs(exp.saturating_sub(jwt::now()))
}

/// The detail that marks a malformed request (400) rather than a malformed token (401).
const MALFORMED_REQUEST: &str =
    "send exactly one Authorization Bearer header and no token in the query";

/// The bearer token of a request: exactly one `Authorization: Bearer <token68>` header, and
/// no `access_token` in the query (RFC 6750 §2.3 is never accepted).
fn bearer<'h>(headers: &'h HeaderMap, query: Option<&str>) -> Result<&'h str, Refusal> {
    let bad = || Refusal {
        reason: Reason::Malformed,
        detail: Some(MALFORMED_REQUEST.to_owned()),
        busy: None,
    };
    if query.is_some_and(|q| {
        url::form_urlencoded::parse(q.as_bytes()).any(|(k, _)| k == "access_token")
    }) {
        return Err(bad());
    }
    let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
    let Some(value) = values.next() else {
        return Err(Reason::Missing.into());
    };
    if values.next().is_some() {
        return Err(bad());
    }
    let value = value.to_str().map_err(|_| bad())?;
    let (scheme, token) = value.split_once(' ').ok_or_else(bad)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(bad());
    }
    let token = token.trim_start_matches(' ');
    let token68 = !token.is_empty()
        && token.len() <= MAX_TOKEN
        && token
            .trim_end_matches('=')
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~+/".contains(&b));
    if !token68 {
        return Err(bad());
    }
    Ok(token)
}

/// Epode refs from claims: a tenant's id (the account claim) or an OAuth client's own that
/// already matches the ref rule is used as it is; a person's subject, and any other value (too
/// long, other characters, an `@`), becomes a keyed hash of it, stable for one product key.
struct RefMaker {
    mac: Option<hmac::Hmac<Sha256>>,
}

impl RefMaker {
    fn new(_config: &AuthConfig, key: Option<&ProductKey>) -> Self {
        use hmac::Mac;
        RefMaker {
            mac: key.and_then(|k| {
                hmac::Hmac::<Sha256>::new_from_slice(k.expose_secret().as_bytes()).ok()
            }),
        }
    }

    fn make(&self, value: &str) -> String {
        let plain = !value.is_empty()
            && value.len() <= crate::feedback::identity::MAX_REF_LEN
            && value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b));
        if plain {
            return value.to_owned();
        }
        self.hashed(value)
    }

    /// A keyed hash of `value`, whatever it looks like.
    fn hashed(&self, value: &str) -> String {
        use hmac::Mac;
        let digest = match &self.mac {
            Some(mac) => {
                let mut mac = mac.clone();
                mac.update(b"epode-sidecar auth ref\0");
                mac.update(value.as_bytes());
                mac.finalize().into_bytes().to_vec()
            }
            None => Sha256::digest(value.as_bytes()).to_vec(),
        };
        let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        format!("h:{hex}")
    }
}

#[cfg(test)]
mod tests;
