//! `subscriptions/listen` in front of a 2025-era upstream, which has none: a 2025 server
//! tells a session of its changes (`notifications/tools/list_changed`, `prompts/…`,
//! `resources/list_changed`, `resources/updated`) on that session's GET stream, on the stream
//! of the call that made the change, or, over stdio, on the pipe. The sidecar keeps one
//! [`Feed`] per 2025 session its listeners' requests use (the caller's credentials and
//! declared capabilities, as `session.rs` keys them; for a stdio child, the pipe's notices):
//! while at least one listener wants it, it holds the session's GET stream open (reopened
//! with back-off when it drops), sends `resources/subscribe` for the URIs its listeners
//! named, and hands each notice to the listeners that opted in, with their
//! `subscriptionId`. Nothing is buffered without bound: a listener has a small queue, and one
//! that does not read is cut (its stream ends with an error; it listens again). A notice on a
//! 2026 client's call stream is taken off it (2026 sends them only on listen streams) and fed
//! here the same way.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::stream;
use http::{header, HeaderMap, HeaderValue, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use serde_json::value::RawValue;
use serde_json::Value;
use tokio::sync::{mpsc, Notify};

use super::caller::{Caller, Client};
use crate::body::{self, Body, BoxError};
use crate::error::{Error, ErrorKind};
use crate::ledger::{Charge, Ledger, Pool};
use crate::mcp::method::{is_change_notice, CHANGE_NOTICES};
use crate::mcp::raw::{self, RawMap};
use crate::mcp::sse::{
    event_data, message_event, EventSplitter, Inbox, Question, Routed, MAX_QUESTIONS,
};
use crate::mcp::version::META_SUBSCRIPTION_ID;
use crate::metrics::Metrics;

/// A comment on an idle listen stream this often (2026 asks for keep-alives there).
pub(crate) const LISTEN_KEEPALIVE: Duration = Duration::from_secs(15);

/// Notices waiting for one listener to read them; past it the listener is cut.
const LISTENER_QUEUE: usize = 16;

/// The most `resourceSubscriptions` one listener may name, and the longest URI.
pub(crate) const MAX_URIS: usize = 64;
pub(crate) const MAX_URI: usize = 2048;

/// The GET stream is reopened after a pause that doubles from the first to the last.
const BACKOFF_FIRST: Duration = Duration::from_millis(250);
const BACKOFF_LAST: Duration = Duration::from_secs(30);

/// A stream that lived this long was healthy: the next pause starts again from the first.
const HEALTHY: Duration = Duration::from_secs(30);

/// How long a feed keeps its stream once nobody is in it (the next call in the session then
/// finds it open).
const LINGER: Duration = Duration::from_secs(30);

/// How long a question routed to a call waits for the call's stream to take it; then it is
/// declined upstream (the call's answer is no stream, or it ended).
const ROUTED_GRACE: Duration = Duration::from_secs(2);

/// How long a call waits for its session's stream to open before it is sent.
const OPEN_WAIT: Duration = Duration::from_secs(2);

/// The change notices, as a listener opts into them.
const TOOLS: &str = CHANGE_NOTICES[0];
const PROMPTS: &str = CHANGE_NOTICES[1];
const RESOURCES: &str = CHANGE_NOTICES[2];
const UPDATED: &str = CHANGE_NOTICES[3];

/// What a listener asked to hear (`params.notifications` of its `subscriptions/listen`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Want {
    pub(crate) tools: bool,
    pub(crate) prompts: bool,
    pub(crate) resources: bool,
    pub(crate) uris: Vec<String>,
}

impl Want {
    /// The filter of a listen request's body; `Err` says what is wrong with it.
    pub(crate) fn of_request(bytes: &[u8]) -> Result<Want, String> {
        let msg: Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        let Some(n) = msg.pointer("/params/notifications") else {
            return Ok(Want::default());
        };
        let Some(n) = n.as_object() else {
            return Err("params.notifications must be an object".into());
        };
        let flag = |k: &str| -> Result<bool, String> {
            match n.get(k) {
                None | Some(Value::Null) => Ok(false),
                Some(Value::Bool(b)) => Ok(*b),
                Some(_) => Err(format!("params.notifications.{k} must be a boolean")),
            }
        };
        let mut uris = Vec::new();
        match n.get("resourceSubscriptions") {
            None | Some(Value::Null) => {}
            Some(Value::Array(list)) => {
                if list.len() > MAX_URIS {
                    return Err(format!(
                        "params.notifications.resourceSubscriptions names {} URIs; at most {MAX_URIS} are taken per listen stream (listen more than once for more)",
                        list.len()
                    ));
                }
                for u in list {
                    let Some(u) = u.as_str() else {
                        return Err(
                            "params.notifications.resourceSubscriptions must list strings".into(),
                        );
                    };
                    if u.is_empty() || u.len() > MAX_URI {
                        return Err(format!(
                            "a resourceSubscriptions URI must have 1 to {MAX_URI} bytes"
                        ));
                    }
                    if !uris.iter().any(|k: &String| k == u) {
                        uris.push(u.to_owned());
                    }
                }
            }
            Some(_) => {
                return Err("params.notifications.resourceSubscriptions must be an array".into())
            }
        }
        Ok(Want {
            tools: flag("toolsListChanged")?,
            prompts: flag("promptsListChanged")?,
            resources: flag("resourcesListChanged")?,
            uris,
        })
    }

    /// What of it the upstream can honour, by the capabilities of its `initialize` result:
    /// list changes of the kinds it serves, and resource updates when it takes
    /// `resources/subscribe`. (Many 2025 servers send `list_changed` without declaring
    /// `listChanged`, so a served kind is enough.)
    pub(crate) fn honoured(&self, capabilities: Option<&Value>) -> Want {
        let has = |k: &str| {
            capabilities
                .and_then(|c| c.get(k))
                .is_some_and(Value::is_object)
        };
        let subscribe = capabilities
            .and_then(|c| c.pointer("/resources/subscribe"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        Want {
            tools: self.tools && has("tools"),
            prompts: self.prompts && has("prompts"),
            resources: self.resources && has("resources"),
            uris: if subscribe {
                self.uris.clone()
            } else {
                Vec::new()
            },
        }
    }

    /// The filter as the acknowledgement states it.
    fn as_json(&self) -> Value {
        let mut m = serde_json::Map::new();
        for (k, on) in [
            ("toolsListChanged", self.tools),
            ("promptsListChanged", self.prompts),
            ("resourcesListChanged", self.resources),
        ] {
            if on {
                m.insert(k.into(), Value::Bool(true));
            }
        }
        if !self.uris.is_empty() {
            m.insert("resourceSubscriptions".into(), self.uris.clone().into());
        }
        Value::Object(m)
    }

    fn wants(&self, method: &str, uri: Option<&str>) -> bool {
        match method {
            TOOLS => self.tools,
            PROMPTS => self.prompts,
            RESOURCES => self.resources,
            UPDATED => uri.is_some_and(|u| self.uris.iter().any(|w| w == u)),
            _ => false,
        }
    }
}

/// What goes down a listener's stream.
enum Out {
    Notice(Bytes),
    /// The subscription ends normally (the upstream refused the feed's credentials, or the
    /// sidecar shuts down): the closing result, then the end of the stream.
    Close,
}

struct Listener {
    /// Its `subscriptionId`: the listen request's id, as the client wrote it.
    id: Box<RawValue>,
    want: Want,
    tx: mpsc::Sender<Out>,
}

/// A feed's credentials: the first listener's (every listener of a feed has the same ones,
/// since they are part of its key), owned for the feed's task.
struct Owner {
    headers: HeaderMap,
    caller: Caller,
    caps: Option<String>,
}

/// A call in flight in the feed's session, which the questions the upstream sends on the
/// session's stream may be asked of.
struct InFlight {
    /// Whether its client declared the capability a question takes.
    covers: Covers,
    tx: mpsc::Sender<Routed>,
}

/// Whether a call's client can be asked a question.
pub(crate) type Covers = Box<dyn Fn(&Question) -> bool + Send + Sync>;

#[derive(Default)]
struct FeedState {
    listeners: HashMap<u64, Listener>,
    /// The calls in flight in the session, by serial (the newest is asked first).
    calls: std::collections::BTreeMap<u64, InFlight>,
    /// Since when nobody has been in the feed (it stops [`LINGER`] later), when a task
    /// waits to stop it.
    idle_since: Option<Instant>,
    /// The upstream keeps no stream for its sessions (405): calls do not wait for one.
    no_stream: bool,
    /// The URIs the upstream was told to send updates of, on the stream open now.
    subscribed: HashSet<String>,
    task: Option<tokio::task::AbortHandle>,
    /// The upstream connection its GET stream keeps, charged to its caller while its task
    /// runs (over HTTP).
    connection: Option<Charge>,
}

impl FeedState {
    fn is_empty(&self) -> bool {
        self.listeners.is_empty() && self.calls.is_empty()
    }

    fn wanted_uris(&self) -> HashSet<String> {
        self.listeners
            .values()
            .flat_map(|l| l.want.uris.iter().cloned())
            .collect()
    }
}

/// The notices of one 2025 session (or one stdio pipe), for the listeners whose requests
/// use it.
struct Feed {
    state: Mutex<FeedState>,
    /// Wakes the task when the URIs wanted changed.
    changed: Notify,
    /// The session whose stream is open now, if any (a call waits for its own session's
    /// before it is sent: a 2025 server drops what it sends on a session stream nobody reads).
    open: tokio::sync::watch::Sender<Opened>,
    /// Tells the task a call waits for its session's stream: one of a replaced session is
    /// left for the new one's at once, a pause before opening again is cut short.
    replaced: Notify,
    /// Whether the last try to open the stream failed (a call does not wait for it then).
    failing: std::sync::atomic::AtomicBool,
}

/// Which session's stream a feed has open.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Opened {
    Closed,
    /// Open, in the session of this id (`None`: an upstream without session ids).
    Open(Option<HeaderValue>),
}

impl Feed {
    fn new() -> Self {
        Feed {
            state: Mutex::default(),
            changed: Notify::new(),
            open: tokio::sync::watch::Sender::new(Opened::Closed),
            replaced: Notify::new(),
            failing: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl Feed {
    fn lock(&self) -> std::sync::MutexGuard<'_, FeedState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands a notice to each listener that wants it; cuts the ones with no room.
    fn deliver(
        &self,
        method: &str,
        params: Option<&RawValue>,
        cut: &prometheus_client::metrics::counter::Counter,
    ) {
        let uri = params.and_then(raw::open).and_then(|p| {
            p.get("uri")
                .and_then(|u| raw::as_str(u).map(|s| s.into_owned()))
        });
        let mut st = self.lock();
        let mut gone = Vec::new();
        for (k, l) in &st.listeners {
            if !l.want.wants(method, uri.as_deref()) {
                continue;
            }
            let msg = notice(method, uri.as_deref(), &l.id);
            match l.tx.try_send(Out::Notice(msg)) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    cut.inc();
                    gone.push(*k);
                }
                Err(mpsc::error::TrySendError::Closed(_)) => gone.push(*k),
            }
        }
        for k in gone {
            // Dropping its sender ends its stream with an error: it did not keep up.
            st.listeners.remove(&k);
        }
    }

    /// Routes a question of the session's stream to the newest call in flight whose client
    /// can answer it: the flag that says whether it was claimed, and the question (to decline
    /// it when nobody claims it in time); or the question back when no call can take it.
    fn route(
        &self,
        q: Question,
    ) -> Result<(Arc<std::sync::atomic::AtomicBool>, Question), Question> {
        let st = self.lock();
        for call in st.calls.values().rev() {
            if !(call.covers)(&q) {
                continue;
            }
            let claimed = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let routed = Routed {
                question: q.clone(),
                claimed: claimed.clone(),
            };
            if call.tx.try_send(routed).is_ok() {
                return Ok((claimed, q));
            }
        }
        Err(q)
    }

    /// Ends every listener's stream normally.
    fn close_all(&self) {
        let mut st = self.lock();
        for (_, l) in st.listeners.drain() {
            let _ = l.tx.try_send(Out::Close);
        }
    }
}

/// A notice as one listener gets it: the method, the URI of an update, its subscription id.
fn notice(method: &str, uri: Option<&str>, id: &RawValue) -> Bytes {
    let mut meta = RawMap::default();
    meta.insert(META_SUBSCRIPTION_ID.to_owned(), id.to_owned());
    let mut params = RawMap::default();
    if let Some(u) = uri {
        params.insert("uri".to_owned(), raw::raw(u));
    }
    params.insert("_meta".to_owned(), raw::raw(&meta));
    let mut msg = RawMap::default();
    msg.insert("jsonrpc".to_owned(), raw::raw("2.0"));
    msg.insert("method".to_owned(), raw::raw(method));
    msg.insert("params".to_owned(), raw::raw(&params));
    raw::to_bytes(&msg)
}

/// What a feed's task needs of the upstream (implemented by `Upstream`, in `mod.rs`).
pub(crate) trait Watched: Send + Sync + 'static {
    /// The session the caller's requests use: its headers for a request in it, and the
    /// upstream's `initialize` result. `stale`: a session the upstream forgot; when the
    /// table still holds it, a new handshake replaces it.
    fn session_headers(
        &self,
        client: &Client<'_>,
        caps: Option<&str>,
        stale: Option<&HeaderValue>,
    ) -> impl std::future::Future<Output = Result<(HeaderMap, Value), Error>> + Send;
    /// Opens the session's notices (the GET stream; a stdio child's pipe).
    fn watch(
        &self,
        caller: &Caller,
        headers: HeaderMap,
    ) -> impl std::future::Future<Output = Result<http::Response<super::hop::UpstreamBody>, Error>> + Send;
    /// POSTs one message in the session, its answer read and dropped.
    fn post_in_session(
        &self,
        caller: &Caller,
        headers: HeaderMap,
        body: Bytes,
    ) -> impl std::future::Future<Output = Result<StatusCode, Error>> + Send;
    /// Whether the upstream is a stdio child (whose one pipe may serve other callers too:
    /// it is never told `resources/unsubscribe`).
    fn shares_notices(&self) -> bool;
    /// The largest SSE event read.
    fn max_event(&self) -> usize;
    /// How often a feed marks its session used (so it is not closed as idle under it).
    fn keep_every(&self) -> Duration;
}

/// The listeners and their feeds, shared by every worker (how many may be open, in all and
/// per caller, is the ledger's).
pub(crate) struct Listeners {
    feeds: Mutex<HashMap<u64, Arc<Feed>>>,
    hasher: RandomState,
    ledger: Arc<Ledger>,
    serial: AtomicUsize,
    metrics: Arc<Metrics>,
    /// Told of every `tools/list_changed` heard (the binding forgets its catalog).
    tools_changed: OnceLock<Arc<dyn Fn() + Send + Sync>>,
    /// Whether a session's stream is read while calls are in flight in it.
    for_calls: bool,
}

impl Listeners {
    /// `for_calls`: whether a session's stream is read while calls are in flight in it too
    /// (`EPODE_SIDECAR_SESSION_STREAM_QUESTIONS`).
    pub(crate) fn new(ledger: Arc<Ledger>, metrics: Arc<Metrics>, for_calls: bool) -> Self {
        Listeners {
            feeds: Mutex::default(),
            hasher: RandomState::new(),
            ledger,
            serial: AtomicUsize::new(1),
            metrics,
            tools_changed: OnceLock::new(),
            for_calls,
        }
    }

    /// What to tell when a `tools/list_changed` is heard (set once, at start).
    pub(crate) fn on_tools_changed(&self, f: Arc<dyn Fn() + Send + Sync>) {
        let _ = self.tools_changed.set(f);
    }

    fn feeds(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Feed>>> {
        self.feeds.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The feed a caller's requests share: the caller's, with its declared capabilities.
    pub(crate) fn key(&self, caller: &Caller, caps: Option<&str>) -> u64 {
        self.hasher.hash_one((caller.key(), caps.unwrap_or("")))
    }

    /// A notice heard on a call's stream (or anywhere but a feed's own stream), for the
    /// feed of `key`.
    pub(crate) fn heard(&self, key: u64, method: &str, params: Option<&RawValue>) {
        if method == TOOLS {
            if let Some(f) = self.tools_changed.get() {
                f();
            }
        }
        let feed = self.feeds().get(&key).cloned();
        if let Some(feed) = feed {
            feed.deliver(method, params, &self.metrics.listen.cut);
        }
    }

    /// A listen stream for a 2026 client of a 2025 upstream: acknowledged with what the
    /// upstream honours, then its notices, keep-alives, and at shutdown the closing result.
    pub(crate) async fn listen<W: Watched>(
        self: &Arc<Self>,
        upstream: Arc<W>,
        client: &Client<'_>,
        caps: Option<String>,
        id: &RawValue,
        bytes: &[u8],
        cut: tokio::sync::watch::Receiver<bool>,
    ) -> Result<http::Response<Body>, Error> {
        let want =
            Want::of_request(bytes).map_err(|why| Error::new(ErrorKind::InvalidParams, why))?;
        let place = self
            .ledger
            .charge(Pool::ListenStreams, client.caller.key())?;
        // The upstream's capabilities say what is honoured (a handshake if none is open).
        let (_, init) = upstream
            .session_headers(client, caps.as_deref(), None)
            .await?;
        let want = want.honoured(init.get("capabilities"));
        let key = self.key(&client.caller, caps.as_deref());
        let (tx, rx) = mpsc::channel(LISTENER_QUEUE);
        let serial = self.serial.fetch_add(1, Ordering::Relaxed) as u64;
        let ack = Bytes::from(format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged","params":{{"notifications":{},"_meta":{{"{META_SUBSCRIPTION_ID}":{}}}}}}}"#,
            want.as_json(),
            id.get()
        ));
        let listener = Listener {
            id: id.to_owned(),
            want,
            tx,
        };
        let feed = self.join(
            key,
            Member::Listener(serial, listener),
            upstream,
            client,
            caps,
        )?;
        self.metrics.listen.streams.inc();
        feed.changed.notify_one();
        let guard = Leaving {
            listeners: self.clone(),
            feed,
            key,
            serial,
            call: false,
            _place: Some(place),
        };
        Ok(listen_stream(ack, id.to_owned(), rx, cut, guard))
    }

    /// Puts `member` in the feed of `key`, starting its task when it has none (whose GET
    /// stream, over HTTP, takes one of the caller's held upstream connections first).
    fn join<W: Watched>(
        self: &Arc<Self>,
        key: u64,
        member: Member,
        upstream: Arc<W>,
        client: &Client<'_>,
        caps: Option<String>,
    ) -> Result<Arc<Feed>, Error> {
        let mut feeds = self.feeds();
        let feed = feeds
            .entry(key)
            .or_insert_with(|| Arc::new(Feed::new()))
            .clone();
        let mut st = feed.lock();
        let starts = st.task.is_none() && !st.no_stream;
        if starts && !upstream.shares_notices() {
            match self
                .ledger
                .charge(Pool::HeldConnections, client.caller.key())
            {
                Ok(c) => st.connection = Some(c),
                Err(e) => {
                    let empty = st.is_empty();
                    drop(st);
                    if empty && feeds.get(&key).is_some_and(|f| Arc::ptr_eq(f, &feed)) {
                        feeds.remove(&key);
                    }
                    return Err(e);
                }
            }
        }
        match member {
            Member::Listener(serial, listener) => {
                st.listeners.insert(serial, listener);
            }
            Member::Call(serial, call) => {
                st.calls.insert(serial, call);
            }
        }
        if starts {
            let owner = Owner {
                headers: client.headers.clone(),
                caller: client.caller,
                caps,
            };
            let task = tokio::spawn(run_feed(
                feed.clone(),
                upstream,
                owner,
                self.metrics.clone(),
                self.clone(),
            ));
            st.task = Some(task.abort_handle());
        }
        drop(st);
        Ok(feed)
    }

    /// A call in flight in the 2025 session `client`'s requests use (`caps`, as the session
    /// is keyed; the session is open): the questions the upstream sends on the session's
    /// stream while it runs are routed to it (the newest call whose client `covers` them
    /// first). Waits at most [`OPEN_WAIT`] for the stream to be open, since a 2025 server
    /// drops what it sends on a stream nobody reads. `None` when the stream is not read for
    /// calls (a stdio child, `EPODE_SIDECAR_SESSION_STREAM_QUESTIONS` off, an upstream with
    /// no session stream, or the caller holds its share of the connections long-lived
    /// holders keep).
    pub(crate) async fn in_flight<W: Watched>(
        self: &Arc<Self>,
        upstream: Arc<W>,
        client: &Client<'_>,
        (caps, session): (Option<String>, Option<HeaderValue>),
        covers: Covers,
    ) -> Option<Inbox> {
        if !self.for_calls || upstream.shares_notices() {
            return None;
        }
        let key = self.key(&client.caller, caps.as_deref());
        let (tx, rx) = mpsc::channel(MAX_QUESTIONS);
        let serial = self.serial.fetch_add(1, Ordering::Relaxed) as u64;
        let call = InFlight { covers, tx };
        let feed = self
            .join(key, Member::Call(serial, call), upstream, client, caps)
            .ok()?;
        let leaving = Leaving {
            listeners: self.clone(),
            feed: feed.clone(),
            key,
            serial,
            call: true,
            _place: None,
        };
        if feed.lock().no_stream {
            return None;
        }
        // Its stream must be its session's: one open in a session since replaced (another
        // client's discovery opens a new one) is opened again at once.
        let want = Opened::Open(session);
        let mut open = feed.open.subscribe();
        if *open.borrow() != want {
            // Wakes a feed waiting out its back-off, or reading a replaced session's stream.
            feed.replaced.notify_one();
            // A stream that failed to open last time is not waited for (the call would pay
            // the wait every time).
            if !feed.failing.load(Ordering::Relaxed) {
                let _ = tokio::time::timeout(OPEN_WAIT, open.wait_for(|o| *o == want)).await;
            }
        }
        Some(Inbox {
            rx,
            early: None,
            _place: Box::new(leaving),
        })
    }

    /// Stops the feed of `key` once nobody has been in it for [`LINGER`] (a call or a
    /// listener that comes back meanwhile keeps its stream): one waiting task per feed.
    fn stop_when_idle(self: &Arc<Self>, key: u64, feed: &Arc<Feed>) {
        let mut st = feed.lock();
        let waiting = st.idle_since.is_some();
        st.idle_since = Some(Instant::now());
        drop(st);
        if waiting {
            return;
        }
        let (me, feed) = (self.clone(), feed.clone());
        tokio::spawn(async move {
            loop {
                let since = match feed.lock().idle_since {
                    Some(since) => since,
                    None => return,
                };
                tokio::time::sleep_until((since + LINGER).into()).await;
                let mut feeds = me.feeds();
                let mut st = feed.lock();
                if !st.is_empty() {
                    st.idle_since = None;
                    return;
                }
                if st.idle_since.is_some_and(|s| s.elapsed() < LINGER) {
                    continue;
                }
                // Nobody came back: the stream closes with the task, its connection's place
                // is given back.
                st.idle_since = None;
                if let Some(task) = st.task.take() {
                    task.abort();
                }
                st.connection = None;
                drop(st);
                if feeds.get(&key).is_some_and(|f| Arc::ptr_eq(f, &feed)) {
                    feeds.remove(&key);
                }
                return;
            }
        });
    }
}

/// Who joins a feed.
enum Member {
    Listener(u64, Listener),
    Call(u64, InFlight),
}

/// A listener's or a call's place in its feed (and a listener's in the ledger), given up
/// when its stream ends.
struct Leaving {
    listeners: Arc<Listeners>,
    feed: Arc<Feed>,
    key: u64,
    serial: u64,
    /// A call in flight (not a listener).
    call: bool,
    _place: Option<Charge>,
}

impl Drop for Leaving {
    fn drop(&mut self) {
        let mut st = self.feed.lock();
        if self.call {
            st.calls.remove(&self.serial);
        } else {
            self.listeners.metrics.listen.streams.dec();
            st.listeners.remove(&self.serial);
        }
        let empty = st.is_empty();
        drop(st);
        if empty {
            self.listeners.stop_when_idle(self.key, &self.feed);
        } else if !self.call {
            self.feed.changed.notify_one();
        }
    }
}

/// The listener's SSE answer.
fn listen_stream(
    ack: Bytes,
    id: Box<RawValue>,
    rx: mpsc::Receiver<Out>,
    cut: tokio::sync::watch::Receiver<bool>,
    guard: Leaving,
) -> http::Response<Body> {
    struct St {
        first: Option<Bytes>,
        id: Box<RawValue>,
        rx: mpsc::Receiver<Out>,
        cut: tokio::sync::watch::Receiver<bool>,
        done: bool,
        _guard: Leaving,
    }
    let st = St {
        first: Some(message_event(&ack)),
        id,
        rx,
        cut,
        done: false,
        _guard: guard,
    };
    let closing = |id: &RawValue| {
        message_event(
            format!(
                r#"{{"jsonrpc":"2.0","id":{0},"result":{{"resultType":"complete","_meta":{{"{META_SUBSCRIPTION_ID}":{0}}}}}}}"#,
                id.get()
            )
            .as_bytes(),
        )
    };
    let s = stream::unfold(st, move |mut st| async move {
        if let Some(b) = st.first.take() {
            return Some((Ok::<_, BoxError>(Frame::data(b)), st));
        }
        if st.done {
            return None;
        }
        let out = tokio::select! {
            out = st.rx.recv() => out.map(Some),
            () = tokio::time::sleep(LISTEN_KEEPALIVE) => Some(None),
            _ = st.cut.wait_for(|c| *c) => Some(Some(Out::Close)),
        };
        match out {
            Some(Some(Out::Notice(b))) => Some((Ok(Frame::data(message_event(&b))), st)),
            Some(None) => Some((Ok(Frame::data(Bytes::from_static(b": keep-alive\n\n"))), st)),
            Some(Some(Out::Close)) => {
                st.done = true;
                let b = closing(&st.id);
                Some((Ok(Frame::data(b)), st))
            }
            // Cut: it did not read its notices; its stream breaks off and it listens again.
            None => {
                st.done = true;
                Some((
                    Err("the listener did not keep up with its notices and was cut".into()),
                    st,
                ))
            }
        }
    });
    let mut resp = body::event_stream(StreamBody::new(s).boxed_unsync());
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// How one opening of the feed's stream ended.
enum Ended {
    /// It was open and then ended or broke: reopen after a pause.
    Dropped(String),
    /// The upstream no longer knows the session (404): reopen in a new one.
    Forgotten(Option<HeaderValue>),
    /// The upstream keeps no stream for the session (405): list changes on call streams
    /// are still fed; nothing more to open.
    NoStream,
    /// The upstream refused the credentials: the listeners' subscriptions end (they listen
    /// again with fresh ones).
    Refused(StatusCode),
    /// Its session was replaced: the new one's stream is opened at once.
    Replaced,
}

async fn run_feed<W: Watched>(
    feed: Arc<Feed>,
    upstream: Arc<W>,
    owner: Owner,
    metrics: Arc<Metrics>,
    listeners: Arc<Listeners>,
) {
    let mut pause = BACKOFF_FIRST;
    let mut stale = None;
    loop {
        let opened = Instant::now();
        let mut was_open = feed.open.subscribe();
        was_open.mark_unchanged();
        let ended = feed_once(&feed, &upstream, &owner, &listeners, stale.take()).await;
        // Opened during this try, or failed before it could (a call then does not wait).
        let failed = !was_open.has_changed().unwrap_or(false) && !matches!(ended, Ended::Replaced);
        feed.failing.store(failed, Ordering::Relaxed);
        match ended {
            Ended::NoStream => {
                tracing::info!("the upstream keeps no GET stream for its sessions (405): only the change notices it sends on calls' streams reach listeners");
                // No stream, no connection kept; calls do not wait for one.
                let mut st = feed.lock();
                st.connection = None;
                st.no_stream = true;
                return;
            }
            Ended::Refused(status) => {
                tracing::info!(%status, "the upstream refused a listen feed's credentials; its listeners' subscriptions end");
                feed.close_all();
                // A listener that joins later starts the feed again.
                let mut st = feed.lock();
                st.task = None;
                st.connection = None;
                return;
            }
            Ended::Dropped(why) => {
                metrics.listen.reopened.inc();
                tracing::debug!(why, "a listen feed's stream ended; reopening");
            }
            Ended::Replaced => {
                metrics.listen.reopened.inc();
                pause = BACKOFF_FIRST;
                continue;
            }
            Ended::Forgotten(session) => {
                metrics.listen.reopened.inc();
                tracing::debug!(
                    "the upstream forgot a listen feed's session; reopening in a new one"
                );
                stale = session;
            }
        }
        if opened.elapsed() >= HEALTHY {
            pause = BACKOFF_FIRST;
        }
        let jitter =
            Duration::from_millis(rand::random::<u64>() % (pause.as_millis() as u64 / 4 + 1));
        // A call that waits for the stream cuts the pause short.
        tokio::select! {
            () = tokio::time::sleep(pause + jitter) => {}
            () = feed.replaced.notified() => {}
        }
        pause = (pause * 2).min(BACKOFF_LAST);
    }
}

/// Opens the feed's stream once and reads it until it ends.
async fn feed_once<W: Watched>(
    feed: &Feed,
    upstream: &Arc<W>,
    owner: &Owner,
    listeners: &Listeners,
    stale: Option<HeaderValue>,
) -> Ended {
    let client = Client {
        headers: &owner.headers,
        caller: owner.caller,
        meta: None,
    };
    let (headers, resp) = match open_stream(&**upstream, &client, owner, stale).await {
        Ok(opened) => opened,
        Err(ended) => return ended,
    };
    // A new stream (perhaps a new session): what it was told is told again.
    feed.lock().subscribed.clear();
    feed.open.send_replace(Opened::Open(
        headers.get(crate::mcp::headers::SESSION_ID).cloned(),
    ));
    let _closed = Closes(&feed.open);
    let mut body = resp.into_body();
    let mut splitter = EventSplitter::default();
    let mut events = VecDeque::new();
    let mut keep = tokio::time::interval(upstream.keep_every().max(Duration::from_millis(100)));
    keep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    keep.tick().await;
    // The subscriptions are told while the stream is read: a notice never waits for them.
    let sync = || Box::pin(sync_subscriptions(feed, &**upstream, owner, &headers));
    let mut syncing = Some(sync());
    let mut again = false;
    loop {
        tokio::select! {
            () = async { syncing.as_mut().expect("polled only while syncing").await }, if syncing.is_some() => {
                syncing = again.then(sync);
                again = false;
            }
            frame = body.frame() => match frame {
                Some(Ok(f)) => {
                    let Ok(data) = f.into_data() else { continue };
                    splitter.push(&data, &mut events);
                    if splitter.held() > upstream.max_event() {
                        return Ended::Dropped("an event larger than the sidecar reads".into());
                    }
                    while let Some(ev) = events.pop_front() {
                        on_event(&ev, upstream, owner, &headers, listeners, feed).await;
                    }
                }
                Some(Err(e)) => return Ended::Dropped(format!("the stream broke off ({e})")),
                None => return Ended::Dropped("the upstream ended the stream".into()),
            },
            () = feed.replaced.notified() => {
                // A call found its session's stream is not this one: checked, not assumed
                // (the stream may have moved to the new session meanwhile).
                if let Some(ended) = replaced(&**upstream, &client, owner, &headers).await {
                    return ended;
                }
            }
            () = feed.changed.notified() => {
                if syncing.is_some() {
                    again = true;
                } else {
                    syncing = Some(sync());
                }
            }
            _ = keep.tick() => {
                // Marks the session used; one that was replaced (evicted, or the upstream
                // forgot it) means this stream is no longer its.
                if let Some(ended) = replaced(&**upstream, &client, owner, &headers).await {
                    return ended;
                }
            }
        }
    }
}

/// Opens the stream of the session the feed's requests use: its headers and the stream, or
/// how the try ended.
async fn open_stream<W: Watched>(
    upstream: &W,
    client: &Client<'_>,
    owner: &Owner,
    stale: Option<HeaderValue>,
) -> Result<(HeaderMap, http::Response<super::hop::UpstreamBody>), Ended> {
    let (headers, _) = upstream
        .session_headers(client, owner.caps.as_deref(), stale.as_ref())
        .await
        .map_err(|e| Ended::Dropped(e.to_string()))?;
    let mut get = headers.clone();
    get.insert(
        header::ACCEPT,
        HeaderValue::from_static("text/event-stream"),
    );
    let resp = upstream
        .watch(&owner.caller, get)
        .await
        .map_err(|e| Ended::Dropped(e.to_string()))?;
    match resp.status() {
        StatusCode::METHOD_NOT_ALLOWED => Err(Ended::NoStream),
        StatusCode::NOT_FOUND => Err(Ended::Forgotten(
            headers.get(crate::mcp::headers::SESSION_ID).cloned(),
        )),
        s @ (StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) => Err(Ended::Refused(s)),
        s if !s.is_success() => Err(Ended::Dropped(format!("the upstream answered {s}"))),
        _ => Ok((headers, resp)),
    }
}

/// How the stream of the session in `headers` ends when that is no longer the session the
/// feed's requests use (it was replaced, or looking it up failed); `None` while it is.
async fn replaced<W: Watched>(
    upstream: &W,
    client: &Client<'_>,
    owner: &Owner,
    headers: &HeaderMap,
) -> Option<Ended> {
    let now = upstream
        .session_headers(client, owner.caps.as_deref(), None)
        .await;
    let ours = headers.get(crate::mcp::headers::SESSION_ID);
    match now {
        Ok((h, _)) if h.get(crate::mcp::headers::SESSION_ID) == ours => None,
        Ok(_) => Some(Ended::Replaced),
        Err(e) => Some(Ended::Dropped(e.to_string())),
    }
}

/// Marks a feed's stream closed when its reading ends.
struct Closes<'a>(&'a tokio::sync::watch::Sender<Opened>);

impl Drop for Closes<'_> {
    fn drop(&mut self) {
        self.0.send_replace(Opened::Closed);
    }
}

/// One event of the feed's stream: a notice goes to the listeners; a request of the server's
/// (a question) is asked of the newest call in flight in the session whose client can answer
/// it, or, when none can, answered at once with the error a client without the capability
/// sends (`ping` is answered).
async fn on_event<W: Watched>(
    ev: &[u8],
    upstream: &Arc<W>,
    owner: &Owner,
    headers: &HeaderMap,
    listeners: &Listeners,
    feed: &Feed,
) {
    let Some(msg) = event_data(ev).and_then(|d| raw::parse_message(d.as_bytes())) else {
        return;
    };
    let Some(method) = msg.get("method").and_then(|m| raw::as_str(m)) else {
        return;
    };
    if let Some(id) = msg.get("id") {
        if method == "ping" {
            let answer = format!(r#"{{"jsonrpc":"2.0","id":{},"result":{{}}}}"#, id.get());
            tell_in_session(&**upstream, owner, headers, Bytes::from(answer)).await;
            return;
        }
        let Some(question) = Question::of(&msg) else {
            return;
        };
        match feed.route(question) {
            Ok((claimed, question)) => {
                // A call that has not taken it in time (its answer is no stream, or it
                // ended) does not leave the server waiting.
                let (upstream, caller, headers) = (upstream.clone(), owner.caller, headers.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(ROUTED_GRACE).await;
                    if !claimed.swap(true, Ordering::AcqRel) {
                        let why = "the call in flight it was asked of did not take it (its answer is not a stream, or it ended)";
                        let answer = unasked(&question, crate::error::code::INTERNAL_ERROR, why);
                        if let Err(e) = upstream.post_in_session(&caller, headers, answer).await {
                            tracing::debug!(error = %e, "a declined question did not reach the upstream");
                        }
                    }
                });
            }
            Err(question) => {
                let why = "no call in flight in this session has a client that can answer it (a 2026-07-28 client is asked within the call that needs the answer, when it declared the capability the question takes)";
                let answer = unasked(&question, crate::error::code::METHOD_NOT_FOUND, why);
                tell_in_session(&**upstream, owner, headers, answer).await;
            }
        }
        return;
    }
    if !is_change_notice(&method) {
        return;
    }
    if method == TOOLS {
        if let Some(f) = listeners.tools_changed.get() {
            f();
        }
    }
    feed.deliver(
        &method,
        msg.get("params").map(|p| &**p),
        &listeners.metrics.listen.cut,
    );
}

/// The error the upstream gets for a question of its session's stream asked of nobody.
fn unasked(q: &Question, code: i64, why: &str) -> Bytes {
    let msg = serde_json::json!({
        "jsonrpc": "2.0",
        "id": &*q.id,
        "error": {"code": code, "message": format!("epode-sidecar: {} is asked of nobody: {why}", q.method)},
    });
    Bytes::from(msg.to_string())
}

/// Posts `answer` in the feed's session (its answer read and dropped).
async fn tell_in_session<W: Watched>(
    upstream: &W,
    owner: &Owner,
    headers: &HeaderMap,
    answer: Bytes,
) {
    if let Err(e) = upstream
        .post_in_session(&owner.caller, headers.clone(), answer)
        .await
    {
        tracing::debug!(error = %e, "an answer on a session's stream did not reach the upstream");
    }
}

/// Subscriptions told at once, at most, while a feed's listeners change.
const SUBSCRIBING: usize = 16;

/// Tells the upstream to send updates of the URIs the feed's listeners want and it was not
/// told of yet, and (over HTTP, where the session is the feed's own) to stop those nobody
/// wants any more: [`SUBSCRIBING`] requests at a time, while the feed's stream is read.
async fn sync_subscriptions<W: Watched>(
    feed: &Feed,
    upstream: &W,
    owner: &Owner,
    headers: &HeaderMap,
) {
    use futures_util::StreamExt as _;
    let (add, remove) = {
        let st = feed.lock();
        let wanted = st.wanted_uris();
        let add: Vec<String> = wanted.difference(&st.subscribed).cloned().collect();
        let remove: Vec<String> = if upstream.shares_notices() {
            Vec::new()
        } else {
            st.subscribed.difference(&wanted).cloned().collect()
        };
        (add, remove)
    };
    let mut told = add
        .into_iter()
        .map(|uri| ("resources/subscribe", uri))
        .chain(remove.into_iter().map(|uri| ("resources/unsubscribe", uri)));
    let mut running = futures_util::stream::FuturesUnordered::new();
    loop {
        while running.len() < SUBSCRIBING {
            let Some((method, uri)) = told.next() else {
                break;
            };
            running.push(tell_one(feed, upstream, owner, headers, method, uri));
        }
        if running.next().await.is_none() {
            return;
        }
    }
}

/// One `resources/subscribe` (or `unsubscribe`) in the feed's session; what the upstream
/// was told is remembered.
async fn tell_one<W: Watched>(
    feed: &Feed,
    upstream: &W,
    owner: &Owner,
    headers: &HeaderMap,
    method: &'static str,
    uri: String,
) {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": format!("epode-sidecar-listen-{:016x}", rand::random::<u64>()),
        "method": method,
        "params": {"uri": uri},
    });
    let sent = upstream
        .post_in_session(
            &owner.caller,
            headers.clone(),
            Bytes::from(body.to_string()),
        )
        .await;
    match sent {
        Ok(s) if s.is_success() => {
            let mut st = feed.lock();
            if method == "resources/subscribe" {
                st.subscribed.insert(uri);
            } else {
                st.subscribed.remove(&uri);
            }
        }
        Ok(s) => {
            tracing::debug!(status = %s, method, "the upstream refused a listen feed's subscription")
        }
        Err(e) => {
            tracing::debug!(error = %e, method, "a listen feed's subscription did not reach the upstream")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listen_filter_is_read_and_bounded() {
        let w = Want::of_request(br#"{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{"notifications":{"toolsListChanged":true,"resourceSubscriptions":["file:///a","file:///a","file:///b"]}}}"#).unwrap();
        assert!(w.tools && !w.prompts && !w.resources);
        assert_eq!(w.uris, ["file:///a", "file:///b"]);
        assert_eq!(
            Want::of_request(br#"{"params":{}}"#).unwrap(),
            Want::default()
        );
        let many: Vec<String> = (0..=MAX_URIS).map(|i| format!("u{i}")).collect();
        let body = serde_json::json!({"params":{"notifications":{"resourceSubscriptions": many}}});
        let e = Want::of_request(body.to_string().as_bytes()).unwrap_err();
        assert!(e.contains("at most 64"), "{e}");
        assert!(
            Want::of_request(br#"{"params":{"notifications":{"toolsListChanged":"yes"}}}"#)
                .unwrap_err()
                .contains("boolean")
        );
        let long = "x".repeat(MAX_URI + 1);
        let body =
            serde_json::json!({"params":{"notifications":{"resourceSubscriptions": [long]}}});
        assert!(Want::of_request(body.to_string().as_bytes()).is_err());
    }

    #[test]
    fn what_is_honoured_follows_the_upstreams_capabilities() {
        let w = Want {
            tools: true,
            prompts: true,
            resources: true,
            uris: vec!["file:///a".into()],
        };
        let caps = serde_json::json!({"tools": {}, "resources": {"subscribe": false}});
        let h = w.honoured(Some(&caps));
        assert!(h.tools && !h.prompts && h.resources && h.uris.is_empty());
        assert_eq!(
            h.as_json(),
            serde_json::json!({"toolsListChanged": true, "resourcesListChanged": true})
        );
        let caps = serde_json::json!({"resources": {"subscribe": true}});
        assert_eq!(w.honoured(Some(&caps)).uris, ["file:///a"]);
        assert_eq!(w.honoured(None), Want::default());
    }

    #[test]
    fn a_notice_goes_only_to_the_listeners_that_want_it_and_a_full_one_is_cut() {
        let feed = Feed::new();
        let cut = prometheus_client::metrics::counter::Counter::default();
        let (tx1, mut rx1) = mpsc::channel(LISTENER_QUEUE);
        let (tx2, mut rx2) = mpsc::channel(LISTENER_QUEUE);
        {
            let mut st = feed.lock();
            st.listeners.insert(
                1,
                Listener {
                    id: raw::raw(&7),
                    want: Want {
                        tools: true,
                        ..Want::default()
                    },
                    tx: tx1,
                },
            );
            st.listeners.insert(
                2,
                Listener {
                    id: raw::raw("s-2"),
                    want: Want {
                        uris: vec!["file:///a".into()],
                        ..Want::default()
                    },
                    tx: tx2,
                },
            );
        }
        feed.deliver(TOOLS, None, &cut);
        let Ok(Out::Notice(b)) = rx1.try_recv() else {
            panic!("listener 1 wants tools")
        };
        assert_eq!(
            &b[..],
            br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed","params":{"_meta":{"io.modelcontextprotocol/subscriptionId":7}}}"#
        );
        assert!(rx2.try_recv().is_err(), "listener 2 did not ask for tools");
        let p = raw::raw(&serde_json::json!({"uri": "file:///b"}));
        feed.deliver(UPDATED, Some(&p), &cut);
        assert!(rx2.try_recv().is_err(), "not the URI it named");
        let p = raw::raw(&serde_json::json!({"uri": "file:///a", "extra": "dropped"}));
        feed.deliver(UPDATED, Some(&p), &cut);
        let Ok(Out::Notice(b)) = rx2.try_recv() else {
            panic!("listener 2 named file:///a")
        };
        assert_eq!(
            &b[..],
            br#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"file:///a","_meta":{"io.modelcontextprotocol/subscriptionId":"s-2"}}}"#
        );
        // Listener 1 reads nothing more: past its queue it is cut, and counted.
        for _ in 0..=LISTENER_QUEUE {
            feed.deliver(TOOLS, None, &cut);
        }
        assert_eq!(cut.get(), 1);
        assert_eq!(feed.lock().listeners.len(), 1);
        let mut n = 0;
        while let Ok(Out::Notice(_)) = rx1.try_recv() {
            n += 1;
        }
        assert_eq!(n, LISTENER_QUEUE);
        assert!(
            rx1.try_recv().is_err(),
            "its sender is gone: its stream ends"
        );
    }
}
