//! Calls of a 2025-era upstream held open while a 2026 client answers the questions the
//! upstream asked in them (MRTR, SEP-2322, bridged): the table every worker shares, its
//! bounds (each call's places in the ledger, its bytes in the memory budget, one deadline
//! from when it was first held, however often it is retried), the one task that lets calls
//! go at their deadline (telling a 2025 upstream, which takes a dropped stream for no
//! cancellation), and the `requestState` that names a held call to the client's retry.
//!
//! The state is sealed (HMAC-SHA256, keyed from the product key, or at random per process
//! without one) and binds the held call's key, the replica that holds it (a random id per
//! process, and where the others reach it, `EPODE_SIDECAR_REPLICA_URL`, when set), the
//! caller (its key, `crate::caller`) and an expiry. Another replica with the same key reads
//! where the call is held and forwards the retry there (`src/replica.rs`): the address is
//! sealed, so no client chooses where a retry goes. The call itself, with
//! what the retry must repeat (the method and its target), stays here: a state opens at most
//! once, since opening takes the call out of the table.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use http::HeaderValue;
use serde_json::value::RawValue;
use serde_json::Value;
use sha2::Sha256;

use crate::budget::Reservation;
use crate::caller::CallerKey;
use crate::error::{Error, ErrorKind};
use crate::ledger::Charge;
use crate::mcp::method::Method;
use crate::mcp::sse::{HeldStream, Question, Told};
use crate::metrics::HeldMetrics;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

/// How the sidecar's states start: a state without it is the upstream's own, passed on.
pub(crate) const STATE_PREFIX: &str = "epode-sidecar.held.v1.";

/// How the session ids the sidecar gives 2025 clients start: the rest is the capabilities the
/// client declared at `initialize`, sealed, so every replica with the same key reads them.
pub(crate) const CAPS_PREFIX: &str = "epode-sidecar.caps.v1.";

/// The longest capability set a session id carries (a header stays small).
const MAX_CAPS: usize = 2048;

/// Bytes of a sealed state's payload before the replica's URL (when it has one): key (16),
/// replica (8), expiry (8) and owner (16).
const PAYLOAD: usize = 48;

/// How a held call's answers reach the upstream.
#[derive(Clone)]
pub(crate) enum Reply {
    /// Over the stdio child's pipe, which routes an answer by the sidecar's own id.
    Stdio,
    /// A POST in the 2025 session the call runs in.
    Http {
        session: Option<HeaderValue>,
        version: String,
    },
}

/// What ends a held call upstream when it is let go unanswered (its deadline, its round
/// limit): a 2025 server takes a dropped stream for no cancellation, so it is told.
pub(crate) type Cancel = Option<Told>;

/// Tells the upstream a call ends (`told`), then lets `rest` go (the call's stream, its
/// places, its bytes): in that order, so the upstream hears the cancellation before the
/// stream drops.
pub(crate) fn let_go_after<T: Send + 'static>(told: Cancel, rest: T) {
    match told {
        Some(told) => {
            tokio::spawn(async move {
                told.await;
                drop(rest);
            });
        }
        None => drop(rest),
    }
}

/// A call waiting for its client's answers.
pub(crate) struct HeldCall {
    /// The caller it was asked of (only it may continue it).
    pub(crate) owner: CallerKey,
    pub(crate) method: Method,
    /// What the retry must repeat: the tool or prompt name or resource URI, and the
    /// arguments.
    pub(crate) target: Value,
    /// The questions the client was asked and has not answered.
    pub(crate) asked: Vec<Question>,
    pub(crate) stream: HeldStream,
    pub(crate) reply: Reply,
    /// The call's own id upstream (its cancellation names it).
    pub(crate) upstream_id: Box<RawValue>,
    /// The round of questions it is held in (1: the call's first).
    pub(crate) round: usize,
    /// When it is let go if its client has not come back with every answer: set when it is
    /// first held, kept through every retry (a retry without answers renews nothing).
    pub(crate) deadline: Option<Instant>,
    /// Tells the upstream the call ends, when it is let go unanswered.
    pub(crate) cancel: Cancel,
    /// Its places in the ledger (the held call's, the upstream connection's), given back
    /// when it ends.
    pub(crate) _places: Vec<Charge>,
    /// Its bytes in the memory budget, given back when it ends.
    pub(crate) _bytes: Reservation,
}

impl HeldCall {
    /// Lets the call go unanswered: its upstream is told, then its stream is dropped.
    pub(crate) fn let_go(mut self) {
        let told = self.cancel.take();
        let_go_after(told, self);
    }
}

/// Why a retry's `requestState` does not continue a held call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Not one this sidecar sealed (forged, altered, or sealed with another key).
    Forged,
    /// Sealed by another replica of the sidecar, which holds the call, and which this one
    /// cannot reach (it has no URL, or the retry was forwarded here already).
    OtherReplica,
    /// Held by another replica that could not be reached (stopped, or restarted).
    OwnerGone,
    /// Past its wait.
    Expired,
    /// Answered already (a replay), or cancelled.
    Gone,
    /// Sent by another caller than the one asked.
    OtherCaller,
    /// Not the same method and target as the call it continues.
    OtherRequest,
}

impl Refusal {
    /// The metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Refusal::Forged => "forged",
            Refusal::OtherReplica => "other_replica",
            Refusal::OwnerGone => "owner_gone",
            Refusal::Expired => "expired",
            Refusal::Gone => "gone",
            Refusal::OtherCaller => "other_caller",
            Refusal::OtherRequest => "other_request",
        }
    }

    /// The error the client gets: what happened, and to start the call again.
    pub(crate) fn error(self) -> Error {
        let why = match self {
            Refusal::Forged => "the requestState is not one this sidecar issued (altered, or from another deployment)",
            Refusal::OtherReplica => "the requestState names a call another replica of the sidecar holds, and this one cannot reach it (set EPODE_SIDECAR_REPLICA_URL on every replica, as the chart does, or give the Service client affinity)",
            Refusal::OwnerGone => "the replica of the sidecar that holds this call cannot be reached (it stopped or restarted), and its call is gone with it",
            Refusal::Expired => "the requestState has expired: the call waited longer than EPODE_SIDECAR_HELD_CALL_WAIT for its answers and was cancelled",
            Refusal::Gone => "the requestState was answered already, or its call was cancelled",
            Refusal::OtherCaller => "the requestState was issued to another caller",
            Refusal::OtherRequest => "the requestState was issued for another request (a retry repeats the method, name and arguments of the call it continues)",
        };
        Error::new(
            ErrorKind::InvalidParams,
            format!("{why}; start the call again without inputResponses and requestState"),
        )
        .unsent()
    }
}

/// The held calls, and their deadlines in order (the sweeper reads the soonest first).
#[derive(Default)]
struct Table {
    calls: HashMap<u128, HeldCall>,
    deadlines: BTreeSet<(Instant, u128)>,
}

/// The held calls of the process, shared by every worker.
pub(crate) struct HeldCalls {
    table: Mutex<Table>,
    wait: Duration,
    mac: Hmac<Sha256>,
    replica: u64,
    /// Where the other replicas reach this one, sealed into every state.
    url: Option<String>,
    /// Whether the task that lets expired calls go runs.
    sweeping: AtomicBool,
    /// Calls held now, and those cancelled at their deadline.
    gauge: Gauge,
    expired: Counter,
}

impl HeldCalls {
    /// Calls each waiting `wait`; states keyed from `secret` (the product key), or at random
    /// when there is none. (How many may be held, in all and per caller, is the ledger's.)
    /// `url`: where the other replicas reach this one.
    pub(crate) fn new(
        wait: Duration,
        secret: Option<&str>,
        url: Option<&url::Url>,
        metrics: &HeldMetrics,
    ) -> Arc<Self> {
        let random: [u8; 32] = rand::random();
        let key: Vec<u8> = match secret {
            Some(s) => {
                let mut m = <Hmac<Sha256> as Mac>::new_from_slice(s.as_bytes())
                    .expect("HMAC takes a key of any length");
                m.update(b"epode-sidecar held-call requestState");
                m.finalize().into_bytes().to_vec()
            }
            None => random.to_vec(),
        };
        Arc::new(HeldCalls {
            table: Mutex::new(Table::default()),
            wait,
            mac: <Hmac<Sha256> as Mac>::new_from_slice(&key)
                .expect("HMAC takes a key of any length"),
            replica: rand::random(),
            url: url.map(|u| u.as_str().to_owned()),
            sweeping: AtomicBool::new(false),
            gauge: metrics.calls.clone(),
            expired: metrics.expired.clone(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Holds `call` until its deadline (the wait from now, when it has none yet); the
    /// `requestState` that continues it. Its places in the ledger were taken by whoever
    /// holds it.
    pub(crate) fn hold(self: &Arc<Self>, mut call: HeldCall) -> String {
        let key: u128 = rand::random();
        let owner = call.owner;
        let deadline = *call
            .deadline
            .get_or_insert_with(|| Instant::now() + self.wait);
        let left = deadline.saturating_duration_since(Instant::now());
        let expires = unix_now() + left.as_secs().max(1);
        {
            let mut table = self.lock();
            table.deadlines.insert((deadline, key));
            table.calls.insert(key, call);
            self.gauge.set(table.calls.len() as i64);
        }
        self.sweep_from_now();
        self.seal(key, expires, owner)
    }

    /// Starts the one task that lets calls go at their deadline (once, on the runtime of the
    /// first call held: every worker's calls are in the one table).
    fn sweep_from_now(self: &Arc<Self>) {
        if self.sweeping.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = Arc::downgrade(self);
        let every = (self.wait / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(me) = me.upgrade() else { return };
                for call in me.expired_by(Instant::now()) {
                    me.expired.inc();
                    // Told upstream, then dropped: its stream, its places, its bytes.
                    call.let_go();
                }
            }
        });
    }

    /// Takes out every call whose deadline is past `now`.
    fn expired_by(&self, now: Instant) -> Vec<HeldCall> {
        let mut table = self.lock();
        let mut gone = Vec::new();
        while let Some(&(deadline, key)) = table.deadlines.first() {
            if deadline > now {
                break;
            }
            table.deadlines.pop_first();
            gone.extend(table.calls.remove(&key));
        }
        self.gauge.set(table.calls.len() as i64);
        gone
    }

    /// The held call a retry's `state` names, taken out of the table: the retry must come
    /// from `owner` (the caller asked) and repeat `method` and `target`.
    pub(crate) fn take(
        &self,
        state: &str,
        owner: CallerKey,
        method: Method,
        target: &Value,
    ) -> Result<HeldCall, Refusal> {
        let sealed = self.open(state)?;
        if sealed.replica != self.replica {
            return Err(Refusal::OtherReplica);
        }
        if unix_now() > sealed.expires {
            return Err(Refusal::Expired);
        }
        let key = sealed.key;
        if sealed.owner != owner.to_bytes() {
            return Err(Refusal::OtherCaller);
        }
        let mut table = self.lock();
        let call = table.calls.get(&key).ok_or(Refusal::Gone)?;
        if call.method != method || &call.target != target {
            return Err(Refusal::OtherRequest);
        }
        let call = table.calls.remove(&key).ok_or(Refusal::Gone)?;
        if let Some(d) = call.deadline {
            table.deadlines.remove(&(d, key));
        }
        self.gauge.set(table.calls.len() as i64);
        Ok(call)
    }

    /// Where the replica that holds the call `state` names is reached, when it is another
    /// replica with a URL (not this one's), and the state is unaltered and unexpired: a retry
    /// of it is forwarded there. (Who may continue it is the owner's to check.)
    pub(crate) fn held_elsewhere(&self, state: &str) -> Option<url::Url> {
        let sealed = self.open(state).ok()?;
        if sealed.replica == self.replica || unix_now() > sealed.expires {
            return None;
        }
        let url = sealed.url.filter(|u| Some(u) != self.url.as_ref())?;
        url::Url::parse(&url).ok()
    }

    /// A 2025 client's session id holding its declared capabilities `caps` (compact JSON);
    /// `None` when they are too large to carry.
    pub(crate) fn seal_capabilities(&self, caps: &str) -> Option<String> {
        if caps.len() > MAX_CAPS {
            return None;
        }
        let mut mac = self.mac.clone();
        mac.update(CAPS_PREFIX.as_bytes());
        mac.update(caps.as_bytes());
        let tag = mac.finalize().into_bytes();
        Some(format!(
            "{CAPS_PREFIX}{}.{}",
            URL_SAFE_NO_PAD.encode(caps),
            URL_SAFE_NO_PAD.encode(tag)
        ))
    }

    /// The capabilities a session id of the sidecar's holds, when it is one and unaltered.
    pub(crate) fn open_capabilities(&self, id: &str) -> Option<String> {
        let (caps, tag) = id.strip_prefix(CAPS_PREFIX)?.split_once('.')?;
        let caps = URL_SAFE_NO_PAD.decode(caps).ok()?;
        let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
        let mut mac = self.mac.clone();
        mac.update(CAPS_PREFIX.as_bytes());
        mac.update(&caps);
        mac.verify_slice(&tag).ok()?;
        String::from_utf8(caps).ok()
    }

    fn seal(&self, key: u128, expires: u64, owner: CallerKey) -> String {
        let mut payload = Vec::with_capacity(PAYLOAD);
        payload.extend_from_slice(&key.to_le_bytes());
        payload.extend_from_slice(&self.replica.to_le_bytes());
        payload.extend_from_slice(&expires.to_le_bytes());
        payload.extend_from_slice(&owner.to_bytes());
        if let Some(url) = &self.url {
            payload.extend_from_slice(url.as_bytes());
        }
        let mut mac = self.mac.clone();
        mac.update(STATE_PREFIX.as_bytes());
        mac.update(&payload);
        let tag = mac.finalize().into_bytes();
        format!(
            "{STATE_PREFIX}{}.{}",
            URL_SAFE_NO_PAD.encode(&payload),
            URL_SAFE_NO_PAD.encode(tag)
        )
    }

    fn open(&self, state: &str) -> Result<Sealed, Refusal> {
        let rest = state.strip_prefix(STATE_PREFIX).ok_or(Refusal::Forged)?;
        let (payload, tag) = rest.split_once('.').ok_or(Refusal::Forged)?;
        let payload = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| Refusal::Forged)?;
        let tag = URL_SAFE_NO_PAD.decode(tag).map_err(|_| Refusal::Forged)?;
        let mut mac = self.mac.clone();
        mac.update(STATE_PREFIX.as_bytes());
        mac.update(&payload);
        mac.verify_slice(&tag).map_err(|_| Refusal::Forged)?;
        if payload.len() < PAYLOAD {
            return Err(Refusal::Forged);
        }
        let word =
            |at: usize| u64::from_le_bytes(payload[at..at + 8].try_into().unwrap_or_default());
        let url = &payload[PAYLOAD..];
        Ok(Sealed {
            key: u128::from_le_bytes(payload[..16].try_into().unwrap_or_default()),
            replica: word(16),
            expires: word(24),
            owner: payload[32..48].try_into().unwrap_or_default(),
            url: (!url.is_empty())
                .then(|| String::from_utf8(url.to_vec()).ok())
                .flatten(),
        })
    }
}

/// What a state holds, opened.
#[derive(Debug, PartialEq, Eq)]
struct Sealed {
    key: u128,
    replica: u64,
    expires: u64,
    owner: [u8; 16],
    /// Where the replica that holds the call is reached, when it said.
    url: Option<String>,
}

/// Seconds since the Unix epoch (0 before it): what sealed states and addresses expire by.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(secret: Option<&str>) -> Arc<HeldCalls> {
        HeldCalls::new(
            Duration::from_secs(60),
            secret,
            None,
            &HeldMetrics::default(),
        )
    }

    fn replica(secret: &str, url: &str) -> Arc<HeldCalls> {
        let url = url::Url::parse(url).unwrap();
        HeldCalls::new(
            Duration::from_secs(60),
            Some(secret),
            Some(&url),
            &HeldMetrics::default(),
        )
    }

    #[test]
    fn a_state_opens_only_with_its_key_and_unaltered() {
        let t = table(Some("k"));
        let owner = CallerKey::of_token("https://as", Some("alice"), None, &[0; 32]);
        let s = t.seal(7, unix_now() + 60, owner);
        let expires = unix_now() + 60;
        assert_eq!(
            t.open(&s),
            Ok(Sealed {
                key: 7,
                replica: t.replica,
                expires,
                owner: owner.to_bytes(),
                url: None
            })
        );
        // Another key (another deployment), a flipped byte, a cut tag, no prefix.
        assert_eq!(table(Some("other")).open(&s), Err(Refusal::Forged));
        let mut flipped = s.clone().into_bytes();
        let i = STATE_PREFIX.len() + 3;
        flipped[i] = if flipped[i] == b'A' { b'B' } else { b'A' };
        assert_eq!(
            t.open(&String::from_utf8(flipped).unwrap()),
            Err(Refusal::Forged)
        );
        assert_eq!(t.open(&s[..s.len() - 2]), Err(Refusal::Forged));
        assert_eq!(t.open(&s[STATE_PREFIX.len()..]), Err(Refusal::Forged));
        assert_eq!(t.open("epode-sidecar.held.v1.x.y"), Err(Refusal::Forged));
        // The same product key on another replica opens it, and is told whose call it is.
        let other_replica = table(Some("k"));
        let sealed = other_replica.open(&s).unwrap();
        assert_ne!(sealed.replica, other_replica.replica);
        // A session id's capabilities open with the same key only, unaltered.
        let sid = t.seal_capabilities(r#"{"roots":{}}"#).unwrap();
        assert_eq!(
            t.open_capabilities(&sid).as_deref(),
            Some(r#"{"roots":{}}"#)
        );
        assert_eq!(table(Some("other")).open_capabilities(&sid), None);
        assert_eq!(t.open_capabilities(&sid.replace("eyJy", "eyJz")), None);
        assert_eq!(t.open(&sid), Err(Refusal::Forged));
        assert!(t.seal_capabilities(&"x".repeat(4096)).is_none());
        // Without a product key every process has its own key.
        assert_eq!(
            table(None).open(&table(None).seal(1, 0, owner)),
            Err(Refusal::Forged)
        );
    }

    #[test]
    fn a_state_names_its_replica_to_the_others_and_to_no_one_else() {
        let owner = CallerKey::of_token("https://as", Some("alice"), None, &[0; 32]);
        let a = replica("k", "http://10.0.0.1:8080/mcp");
        let b = replica("k", "http://10.0.0.2:8080/mcp");
        let s = a.seal(9, unix_now() + 60, owner);
        // Another replica with the key is told where the call is; the owner is not sent
        // to itself, nor is a replica that shares its URL (the owner restarted).
        assert_eq!(
            b.held_elsewhere(&s).map(|u| u.to_string()).as_deref(),
            Some("http://10.0.0.1:8080/mcp")
        );
        assert_eq!(a.held_elsewhere(&s), None);
        assert_eq!(
            replica("k", "http://10.0.0.1:8080/mcp").held_elsewhere(&s),
            None
        );
        // The URL is sealed: another key, an altered state, an expired one name nowhere.
        assert_eq!(replica("other", "http://x:1/mcp").held_elsewhere(&s), None);
        let altered = s.replacen('A', "B", 1);
        assert!(altered == s || b.held_elsewhere(&altered).is_none());
        assert_eq!(b.held_elsewhere(&a.seal(9, unix_now() - 1, owner)), None);
        // A state sealed without a URL names nowhere: the retry stays refused.
        assert_eq!(
            b.held_elsewhere(&table(Some("k")).seal(9, unix_now() + 60, owner)),
            None
        );
        assert_eq!(
            b.take(&s, owner, Method::ToolsCall, &Value::Null).err(),
            Some(Refusal::OtherReplica)
        );
    }
}
