//! Calls of a 2025-era upstream held open while a 2026 client answers the questions the
//! upstream asked in them (MRTR, SEP-2322, bridged): the table every worker shares, its
//! bounds (a count, a wait, bytes in the memory budget), and the `requestState` that names a
//! held call to the client's retry.
//!
//! The state is sealed (HMAC-SHA256, keyed from the product key, or at random per process
//! without one) and binds the held call's key, the replica that holds it (a random id per
//! process), the caller's credentials (their keyed hash) and an expiry. The call itself, with
//! what the retry must repeat (the method and its target), stays here: a state opens at most
//! once, since opening takes the call out of the table.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use http::HeaderValue;
use serde_json::value::RawValue;
use serde_json::Value;
use sha2::Sha256;

use crate::budget::Reservation;
use crate::error::{Error, ErrorKind};
use crate::mcp::method::Method;
use crate::mcp::sse::{HeldStream, Question};
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

/// Bytes of a sealed state's payload: key (16), replica (8), expiry (8), owner flag (1) and
/// owner (8).
const PAYLOAD: usize = 41;

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

/// A call waiting for its client's answers.
pub(crate) struct HeldCall {
    /// The keyed hash of the caller's credentials (`None`: none were sent).
    pub(crate) owner: Option<u64>,
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
    /// Its bytes in the memory budget, given back when it ends.
    pub(crate) _bytes: Reservation,
}

/// Why a retry's `requestState` does not continue a held call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Not one this sidecar sealed (forged, altered, or sealed with another key).
    Forged,
    /// Sealed by another replica of the sidecar, which holds the call.
    OtherReplica,
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
            Refusal::OtherReplica => "the requestState names a call another replica of the sidecar holds; a retry must reach the replica that asked (give the Service client affinity: the chart's service.sessionAffinity: ClientIP)",
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

/// The held calls of the process, shared by every worker.
pub(crate) struct HeldCalls {
    calls: Mutex<HashMap<u128, HeldCall>>,
    max: usize,
    wait: Duration,
    mac: Hmac<Sha256>,
    replica: u64,
    /// Calls held now, and those cancelled at their deadline.
    gauge: Gauge,
    expired: Counter,
}

impl HeldCalls {
    /// At most `max` calls, each waiting `wait`; states keyed from `secret` (the product key),
    /// or at random when there is none.
    pub(crate) fn new(
        max: usize,
        wait: Duration,
        secret: Option<&str>,
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
            calls: Mutex::new(HashMap::new()),
            max,
            wait,
            mac: <Hmac<Sha256> as Mac>::new_from_slice(&key)
                .expect("HMAC takes a key of any length"),
            replica: rand::random(),
            gauge: metrics.calls.clone(),
            expired: metrics.expired.clone(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u128, HeldCall>> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Holds `call` until its deadline; the `requestState` that continues it, or 503 when as
    /// many calls are held as may be.
    pub(crate) fn hold(self: &Arc<Self>, call: HeldCall) -> Result<String, Error> {
        let key: u128 = rand::random();
        let owner = call.owner;
        {
            let mut calls = self.lock();
            if calls.len() >= self.max {
                return Err(Error::new(
                    ErrorKind::Overloaded { retry_after: 1 },
                    "it holds as many calls waiting for their client's answers as it may (EPODE_SIDECAR_HELD_CALLS)",
                ));
            }
            calls.insert(key, call);
            self.gauge.set(calls.len() as i64);
        }
        let expires = unix_now() + self.wait.as_secs().max(1);
        let me = Arc::clone(self);
        let wait = self.wait;
        // The deadline: a call whose client never retries is cancelled upstream (dropping its
        // stream cancels it) and counted.
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let mut calls = me.lock();
            let gone = calls.remove(&key);
            me.gauge.set(calls.len() as i64);
            drop(calls);
            if gone.is_some() {
                me.expired.inc();
            }
        });
        Ok(self.seal(key, expires, owner))
    }

    /// The held call a retry's `state` names, taken out of the table: the retry must come
    /// from `owner` (the keyed hash of its credentials) and repeat `method` and `target`.
    pub(crate) fn take(
        &self,
        state: &str,
        owner: Option<u64>,
        method: Method,
        target: &Value,
    ) -> Result<HeldCall, Refusal> {
        let (key, replica, expires, sealed_owner) = self.open(state)?;
        if replica != self.replica {
            return Err(Refusal::OtherReplica);
        }
        if unix_now() > expires {
            return Err(Refusal::Expired);
        }
        if sealed_owner != owner {
            return Err(Refusal::OtherCaller);
        }
        let mut calls = self.lock();
        let call = calls.get(&key).ok_or(Refusal::Gone)?;
        if call.method != method || &call.target != target {
            return Err(Refusal::OtherRequest);
        }
        let call = calls.remove(&key).ok_or(Refusal::Gone);
        self.gauge.set(calls.len() as i64);
        call
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

    fn seal(&self, key: u128, expires: u64, owner: Option<u64>) -> String {
        let mut payload = Vec::with_capacity(PAYLOAD);
        payload.extend_from_slice(&key.to_le_bytes());
        payload.extend_from_slice(&self.replica.to_le_bytes());
        payload.extend_from_slice(&expires.to_le_bytes());
        payload.push(u8::from(owner.is_some()));
        payload.extend_from_slice(&owner.unwrap_or(0).to_le_bytes());
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

    fn open(&self, state: &str) -> Result<(u128, u64, u64, Option<u64>), Refusal> {
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
        if payload.len() != PAYLOAD {
            return Err(Refusal::Forged);
        }
        let word =
            |at: usize| u64::from_le_bytes(payload[at..at + 8].try_into().unwrap_or_default());
        let key = u128::from_le_bytes(payload[..16].try_into().unwrap_or_default());
        let owner = (payload[32] == 1).then(|| word(33));
        Ok((key, word(16), word(24), owner))
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(secret: Option<&str>) -> Arc<HeldCalls> {
        HeldCalls::new(4, Duration::from_secs(60), secret, &HeldMetrics::default())
    }

    #[test]
    fn a_state_opens_only_with_its_key_and_unaltered() {
        let t = table(Some("k"));
        let s = t.seal(7, unix_now() + 60, Some(9));
        assert_eq!(t.open(&s), Ok((7, t.replica, unix_now() + 60, Some(9))));
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
        let (_, replica, _, _) = other_replica.open(&s).unwrap();
        assert_ne!(replica, other_replica.replica);
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
            table(None).open(&table(None).seal(1, 0, None)),
            Err(Refusal::Forged)
        );
    }
}
