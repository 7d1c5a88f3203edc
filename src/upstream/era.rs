//! The upstream's era resolver: which era the upstream speaks and how long that verdict is
//! trusted (30 s, or for good when the setting pins it), discovery (`server/discover`, or a
//! 2025 handshake when the upstream refuses it the way only a 2025 server does), how an
//! answer says the upstream changed era (a redeploy with another SDK), and the one retry a
//! request gets when that happens.

use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::StatusCode;
use serde_json::{json, Value};

use super::caller::Client;
use super::link::Link;
use super::session::Sessions;
use super::translate::{discover_from_init, set_modern_headers, sidecar_info};
use crate::config::UpstreamProtocol;
use crate::error::{code, Error, ErrorKind};
use crate::mcp::era::Era;
use crate::mcp::method::Method;
use crate::mcp::version::{self, MODERN};

/// How long an era verdict is trusted before the next request checks it again (an upstream
/// redeployed with another SDK changes era without the sidecar restarting).
const VERDICT_TTL: Duration = Duration::from_secs(30);

/// The upstream's discovery, in the 2026 shape whatever its era.
pub(crate) struct Discovery {
    /// The `server/discover` result (or one built from the `initialize` result).
    pub(crate) result: Value,
}

/// The era the `EPODE_SIDECAR_UPSTREAM_PROTOCOL` setting pins, `None` for `auto`.
fn pinned(setting: UpstreamProtocol) -> Option<Era> {
    match setting {
        UpstreamProtocol::Modern => Some(Era::Modern),
        UpstreamProtocol::Legacy => Some(Era::Legacy),
        UpstreamProtocol::Auto => None,
    }
}

/// Decides the upstream's era and keeps the verdict; shared by every worker.
pub(crate) struct EraResolver {
    /// The era the setting pins; `None` when it is found by probing.
    pinned: Option<Era>,
    decided: Mutex<Option<(Era, Instant)>>,
}

impl EraResolver {
    pub(crate) fn new(setting: UpstreamProtocol) -> Self {
        EraResolver {
            pinned: pinned(setting),
            decided: Mutex::new(None),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(Era, Instant)>> {
        self.decided.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the era is found by probing (not pinned by configuration).
    fn is_auto(&self) -> bool {
        self.pinned.is_none()
    }

    /// The era, when it is pinned or was decided within the TTL before `now`.
    fn known_at(&self, now: Instant) -> Option<Era> {
        self.pinned.or_else(|| {
            self.lock()
                .filter(|(_, at)| now.saturating_duration_since(*at) < VERDICT_TTL)
                .map(|(e, _)| e)
        })
    }

    pub(crate) fn known(&self) -> Option<Era> {
        self.known_at(Instant::now())
    }

    fn decide_at(&self, era: Era, now: Instant) {
        if self.is_auto() {
            let previous = self.lock().replace((era, now));
            if previous.map(|(e, _)| e) != Some(era) {
                tracing::info!(era = ?era, "upstream era decided");
            }
        }
    }

    fn decide(&self, era: Era) {
        self.decide_at(era, Instant::now());
    }

    /// Forgets the verdict (the upstream became unreachable, or changed era).
    pub(crate) fn forget(&self) {
        *self.lock() = None;
    }

    /// Forgets the verdict and lets go of the 2025 sessions: the upstream may come back as
    /// another build.
    fn forget_all(&self, link: &Link, sessions: &Sessions) {
        self.forget();
        sessions.clear(link);
    }

    /// The era of the upstream, probing with `server/discover` (with the caller's
    /// credentials) when it is not known.
    pub(crate) async fn era(
        &self,
        link: &Link,
        sessions: &Sessions,
        client: &Client<'_>,
    ) -> Result<Era, Error> {
        if let Some(era) = self.known() {
            return Ok(era);
        }
        Ok(self.discover(link, sessions, client, None, None).await?.0)
    }

    /// Discovery per request, which is also how the era is found: `server/discover` goes
    /// upstream with the client's credentials (`client_body` is a modern client's own
    /// `server/discover`, forwarded as it was); for an upstream that does not speak 2026,
    /// the discovery is the `initialize` result of a fresh handshake (a redeploy shows at
    /// once), whose session is the one the caller's requests then use: it declares `caps`,
    /// as they will (the client's capabilities), and replaces the one they used before.
    /// An upstream known to speak 2025 whose handshake is refused may have been redeployed as
    /// a 2026-only server: it is probed again.
    pub(crate) async fn discover(
        &self,
        link: &Link,
        sessions: &Sessions,
        client: &Client<'_>,
        client_body: Option<Bytes>,
        caps: Option<&str>,
    ) -> Result<(Era, Discovery), Error> {
        let cached = self.known();
        if cached != Some(Era::Legacy) {
            if let Some(d) = self.probe_modern(link, client, client_body.clone()).await? {
                return Ok((Era::Modern, d));
            }
        }
        match sessions.handshake(link, client, caps).await {
            Ok(session) => {
                self.decide(Era::Legacy);
                let result = discover_from_init(&session.init);
                Ok((Era::Legacy, Discovery { result }))
            }
            Err(e)
                if cached == Some(Era::Legacy)
                    && self.is_auto()
                    && matches!(e.kind(), ErrorKind::UpstreamRefused(a) if !is_final_refusal(a.status)) =>
            {
                self.forget_all(link, sessions);
                match self.probe_modern(link, client, client_body).await? {
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
        link: &Link,
        client: &Client<'_>,
        client_body: Option<Bytes>,
    ) -> Result<Option<Discovery>, Error> {
        let reason = if client_body.is_some() {
            "discover"
        } else {
            "era_probe"
        };
        let body = client_body.unwrap_or_else(|| {
            Bytes::from(
                json!({
                    "jsonrpc": "2.0",
                    "id": link.next_id("discover"),
                    "method": Method::ServerDiscover.wire(),
                    "params": {"_meta": {
                        version::META_PROTOCOL_VERSION: MODERN,
                        version::META_CLIENT_CAPABILITIES: {},
                        version::META_CLIENT_INFO: sidecar_info(),
                    }},
                })
                .to_string(),
            )
        });
        let mut headers = link.base_headers(client);
        set_modern_headers(&mut headers, Method::ServerDiscover.wire(), None);
        let (body, span) = link.own("server/discover", reason, &mut headers, body);
        let answer = link.exchange(&client.caller, headers, body).await?;
        if let Some(span) = &span {
            span.answered(answer.status().as_u16());
        }
        if let Some(result) = answer.result().filter(|r| supports_modern(r)).cloned() {
            self.decide(Era::Modern);
            link.heard_capabilities(&result);
            link.identity().remember(
                result
                    .get("_meta")
                    .and_then(|m| m.get(version::META_SERVER_INFO)),
            );
            return Ok(Some(Discovery { result }));
        }
        if is_final_refusal(answer.status()) || self.pinned == Some(Era::Modern) {
            return Err(answer.into_refusal());
        }
        Ok(None)
    }

    /// Runs `send` in the upstream's era; when the upstream's refusal says it now speaks the
    /// other era, forgets what it knew and runs it once more in the era found then.
    pub(crate) async fn with_retry<T, F, Fut>(
        &self,
        link: &Link,
        sessions: &Sessions,
        client: &Client<'_>,
        send: F,
    ) -> Result<T, Error>
    where
        F: FnMut(Era) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        self.retry_once(
            || self.era(link, sessions, client),
            || self.forget_all(link, sessions),
            send,
        )
        .await
    }

    /// The one retry, apart from how the era is found and what forgetting lets go of.
    async fn retry_once<T, E, EFut, F, Fut>(
        &self,
        mut era: E,
        forget: impl FnOnce(),
        mut send: F,
    ) -> Result<T, Error>
    where
        E: FnMut() -> EFut,
        EFut: Future<Output = Result<Era, Error>>,
        F: FnMut(Era) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let sent = era().await?;
        match send(sent).await {
            Err(e) if self.is_auto() && signals_change(&e, sent) => {
                tracing::info!("the upstream's answer says it changed era; checking again");
                forget();
                let era = era().await?;
                send(era).await
            }
            other => other,
        }
    }
}

/// Whether the upstream's refusal says it now speaks the other era (it was redeployed): a
/// 2026-only server refuses 2025 traffic with -32022; a 2025-only server refuses 2026 traffic
/// with a generic 400 (-32000 "not initialized", "unsupported protocol version", or no
/// JSON-RPC body at all).
pub(crate) fn signals_change(error: &Error, sent: Era) -> bool {
    let ErrorKind::UpstreamRefused(answer) = error.kind() else {
        return false;
    };
    if answer.status != StatusCode::BAD_REQUEST {
        return false;
    }
    let code = serde_json::from_slice::<Value>(&answer.bytes)
        .ok()
        .and_then(|m| m.get("error")?.get("code")?.as_i64());
    match sent {
        Era::Legacy => code == Some(code::UNSUPPORTED_VERSION),
        Era::Modern => matches!(code, None | Some(code::SERVER_ERROR)),
    }
}

/// Statuses that say "not you" or "not now" rather than "not this era": passed to the client.
pub(crate) fn is_final_refusal(status: StatusCode) -> bool {
    matches!(status.as_u16(), 401 | 403 | 407 | 429) || status.is_server_error()
}

/// Whether a `server/discover` result offers 2026-07-28.
pub(crate) fn supports_modern(result: &Value) -> bool {
    result
        .get("supportedVersions")
        .and_then(Value::as_array)
        .is_some_and(|v| v.iter().any(|x| x.as_str() == Some(MODERN)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::Buffered;

    fn refusal(status: u16, body: &str) -> Error {
        Error::upstream_refused(Buffered {
            status: StatusCode::from_u16(status).unwrap(),
            headers: Default::default(),
            bytes: bytes::Bytes::from(body.to_owned()),
        })
    }

    #[test]
    fn era_change_signals() {
        let unsupported = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32022,"message":"x"}}"#;
        assert!(signals_change(&refusal(400, unsupported), Era::Legacy));
        assert!(!signals_change(&refusal(400, unsupported), Era::Modern));
        let not_initialized = r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"Bad Request: Server not initialized"}}"#;
        assert!(signals_change(&refusal(400, not_initialized), Era::Modern));
        assert!(signals_change(&refusal(400, "Bad Request"), Era::Modern));
        assert!(!signals_change(&refusal(401, ""), Era::Modern));
        let mismatch = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32020,"message":"x"}}"#;
        assert!(!signals_change(&refusal(400, mismatch), Era::Modern));
        assert!(!signals_change(
            &Error::new(ErrorKind::UpstreamFailed, "x"),
            Era::Modern
        ));
    }

    #[test]
    fn verdict_is_fixed_or_decided() {
        let v = EraResolver::new(UpstreamProtocol::Auto);
        assert_eq!(v.known(), None);
        v.decide(Era::Legacy);
        assert_eq!(v.known(), Some(Era::Legacy));
        v.forget();
        assert_eq!(v.known(), None);
        let v = EraResolver::new(UpstreamProtocol::Modern);
        v.decide(Era::Legacy);
        assert_eq!(v.known(), Some(Era::Modern));
    }

    #[test]
    fn the_verdict_is_rechecked_after_30_s() {
        let v = EraResolver::new(UpstreamProtocol::Auto);
        let t0 = Instant::now();
        v.decide_at(Era::Modern, t0);
        assert_eq!(v.known_at(t0 + Duration::from_secs(29)), Some(Era::Modern));
        assert_eq!(v.known_at(t0 + VERDICT_TTL), None, "checked again");
        // A pinned era is never checked again.
        let v = EraResolver::new(UpstreamProtocol::Legacy);
        assert_eq!(
            v.known_at(t0 + Duration::from_secs(3600)),
            Some(Era::Legacy)
        );
    }

    /// Runs `retry_once` with an upstream whose era is `eras` in turn and whose answers are
    /// `answers` in turn; returns the result, the eras requests were sent in, and how many
    /// times the resolver forgot.
    async fn retried(
        setting: UpstreamProtocol,
        eras: &[Era],
        answers: Vec<Result<u32, Error>>,
    ) -> (Result<u32, Error>, Vec<Era>, u32) {
        let v = EraResolver::new(setting);
        let eras = std::cell::RefCell::new(eras.iter().copied());
        let answers = std::cell::RefCell::new(answers.into_iter());
        let sent = std::cell::RefCell::new(Vec::new());
        let forgot = std::cell::Cell::new(0);
        let r = v
            .retry_once(
                || async { Ok(eras.borrow_mut().next().unwrap()) },
                || forgot.set(forgot.get() + 1),
                |era| {
                    sent.borrow_mut().push(era);
                    let answer = answers.borrow_mut().next().unwrap();
                    async move { answer }
                },
            )
            .await;
        (r, sent.into_inner(), forgot.get())
    }

    const NOT_INITIALIZED: &str = r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"Bad Request: Server not initialized"}}"#;
    const UNSUPPORTED: &str = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32022,"message":"x"}}"#;

    #[tokio::test]
    async fn an_era_change_gets_exactly_one_retry() {
        // Sent as 2026, refused the way a 2025 server does: once more, in 2025.
        let (r, sent, forgot) = retried(
            UpstreamProtocol::Auto,
            &[Era::Modern, Era::Legacy],
            vec![Err(refusal(400, NOT_INITIALIZED)), Ok(7)],
        )
        .await;
        assert_eq!(r.unwrap(), 7);
        assert_eq!(sent, [Era::Modern, Era::Legacy]);
        assert_eq!(forgot, 1);
        // The retry refused the same way again: no third try, its refusal is the answer.
        let (r, sent, forgot) = retried(
            UpstreamProtocol::Auto,
            &[Era::Legacy, Era::Modern],
            vec![
                Err(refusal(400, UNSUPPORTED)),
                Err(refusal(400, NOT_INITIALIZED)),
            ],
        )
        .await;
        assert_eq!(r.unwrap_err().status(), 400);
        assert_eq!(sent, [Era::Legacy, Era::Modern]);
        assert_eq!(forgot, 1);
    }

    #[tokio::test]
    async fn no_retry_without_an_era_change() {
        // A refusal that is not about the era goes to the client as it is.
        let (r, sent, forgot) = retried(
            UpstreamProtocol::Auto,
            &[Era::Modern],
            vec![Err(refusal(401, ""))],
        )
        .await;
        assert_eq!(r.unwrap_err().status(), 401);
        assert_eq!((sent, forgot), (vec![Era::Modern], 0));
        // A pinned era is never changed by an answer.
        let (r, sent, forgot) = retried(
            UpstreamProtocol::Modern,
            &[Era::Modern],
            vec![Err(refusal(400, NOT_INITIALIZED))],
        )
        .await;
        assert_eq!(r.unwrap_err().status(), 400);
        assert_eq!((sent, forgot), (vec![Era::Modern], 0));
    }
}
