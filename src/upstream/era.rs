//! Which era the upstream speaks: the verdict and how long it is trusted, how an answer says
//! the upstream changed era (a redeploy with another SDK), and the one retry a request gets
//! when that happens.

use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::Value;

use super::Upstream;
use crate::config::UpstreamProtocol;
use crate::error::{code, Error, Kind};
use crate::mcp::version::MODERN;

/// How long an era verdict is trusted before the next request checks it again (an upstream
/// redeployed with another SDK changes era without the sidecar restarting).
const VERDICT_TTL: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Era {
    Modern,
    Legacy,
}

/// The era as configured or last decided.
pub(crate) struct Verdict {
    setting: UpstreamProtocol,
    decided: Mutex<Option<(Era, Instant)>>,
}

impl Verdict {
    pub(crate) fn new(setting: UpstreamProtocol) -> Self {
        Verdict {
            setting,
            decided: Mutex::new(None),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(Era, Instant)>> {
        self.decided.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the era is found by probing (not fixed by configuration).
    pub(crate) fn is_auto(&self) -> bool {
        self.setting == UpstreamProtocol::Auto
    }

    pub(crate) fn fixed(&self) -> Option<Era> {
        match self.setting {
            UpstreamProtocol::Modern => Some(Era::Modern),
            UpstreamProtocol::Legacy => Some(Era::Legacy),
            UpstreamProtocol::Auto => None,
        }
    }

    /// The era, when it is fixed or was decided within the TTL.
    pub(crate) fn get(&self) -> Option<Era> {
        self.fixed().or_else(|| {
            self.lock()
                .filter(|(_, at)| at.elapsed() < VERDICT_TTL)
                .map(|(e, _)| e)
        })
    }

    pub(crate) fn set(&self, era: Era) {
        if self.is_auto() {
            let previous = self.lock().replace((era, Instant::now()));
            if previous.map(|(e, _)| e) != Some(era) {
                tracing::info!(era = ?era, "upstream era decided");
            }
        }
    }

    pub(crate) fn forget(&self) {
        *self.lock() = None;
    }
}

/// Whether the upstream's refusal says it now speaks the other era (it was redeployed): a
/// 2026-only server refuses 2025 traffic with -32022; a 2025-only server refuses 2026 traffic
/// with a generic 400 (-32000 "not initialized", "unsupported protocol version", or no
/// JSON-RPC body at all).
pub(crate) fn signals_change(error: &Error, sent: Era) -> bool {
    let Kind::UpstreamRefused(answer) = error.kind() else {
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

impl Upstream {
    /// Runs `send` in the upstream's era; when the upstream's refusal says it now speaks the
    /// other era, forgets what it knew and runs it once more in the era found then.
    pub(crate) async fn with_era_retry<'a, T, F, Fut>(
        &'a self,
        client: &'a super::Client<'a>,
        mut send: F,
    ) -> Result<T, Error>
    where
        F: FnMut(Era) -> Fut,
        Fut: Future<Output = Result<T, Error>> + 'a,
    {
        let era = self.era(client).await?;
        match send(era).await {
            Err(e) if self.shared.verdict.is_auto() && signals_change(&e, era) => {
                tracing::info!("the upstream's answer says it changed era; checking again");
                self.forget();
                let era = self.era(client).await?;
                send(era).await
            }
            other => other,
        }
    }
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
            &Error::new(Kind::UpstreamFailed, "x"),
            Era::Modern
        ));
    }

    #[test]
    fn verdict_is_fixed_or_decided() {
        let v = Verdict::new(UpstreamProtocol::Auto);
        assert_eq!(v.get(), None);
        v.set(Era::Legacy);
        assert_eq!(v.get(), Some(Era::Legacy));
        v.forget();
        assert_eq!(v.get(), None);
        let v = Verdict::new(UpstreamProtocol::Modern);
        v.set(Era::Legacy);
        assert_eq!(v.get(), Some(Era::Modern));
    }
}
