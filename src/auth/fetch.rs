//! Requests to the authorization server (its metadata, its keys, its introspection endpoint):
//! each bounded in time (`auth_fetch_timeout`) and in size ([`MAX_ANSWER`]), and its HTTP
//! cache lifetime read from `Cache-Control`.

use std::time::Duration;

use serde_json::Value;

/// The most of an answer the sidecar reads: a key set of 100 RSA keys is about 50 KiB.
pub(super) const MAX_ANSWER: usize = 1 << 20;

/// Why a request to the authorization server gave nothing usable. The text names the URL's
/// host and path only, never a query or a credential.
#[derive(Debug)]
pub(super) struct FetchError(pub(super) String, pub(super) Option<u16>);

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for FetchError {}

impl FetchError {
    /// A failure before any answer (or one whose status does not matter).
    pub(super) fn at(text: String) -> FetchError {
        FetchError(text, None)
    }
}

/// Where a URL points, for a message: scheme, host, port and path.
pub(super) fn shown(url: &url::Url) -> String {
    let mut u = url.clone();
    u.set_query(None);
    u.set_fragment(None);
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.to_string()
}

/// An answer's JSON object and how long it may be kept (`max-age`, `None` without one).
pub(super) struct Answer {
    pub(super) status: u16,
    pub(super) json: Value,
    pub(super) max_age: Option<Duration>,
}

/// Sends `req` and reads its JSON answer within the deadline and [`MAX_ANSWER`].
pub(super) async fn json(
    req: reqwest::RequestBuilder,
    what: &str,
    url: &url::Url,
    deadline: Duration,
) -> Result<Answer, FetchError> {
    let at = shown(url);
    let read =
        async {
            let mut resp = req.send().await.map_err(|e| {
                FetchError::at(format!(
                    "{what} ({at}) could not be fetched: {}",
                    without_url(&e)
                ))
            })?;
            let status = resp.status().as_u16();
            let max_age = resp
                .headers()
                .get(http::header::CACHE_CONTROL)
                .and_then(|v| v.to_str().ok())
                .and_then(max_age);
            if let Some(len) = resp.content_length() {
                if len > MAX_ANSWER as u64 {
                    return Err(FetchError::at(format!(
                    "{what} ({at}) is {len} bytes, more than the {MAX_ANSWER} the sidecar reads"
                )));
                }
            }
            let mut body = Vec::new();
            while let Some(chunk) = resp.chunk().await.map_err(|e| {
                FetchError::at(format!("{what} ({at}) broke off: {}", without_url(&e)))
            })? {
                if body.len() + chunk.len() > MAX_ANSWER {
                    return Err(FetchError::at(format!(
                        "{what} ({at}) is more than the {MAX_ANSWER} bytes the sidecar reads"
                    )));
                }
                body.extend_from_slice(&chunk);
            }
            let json: Value = serde_json::from_slice(&body).map_err(|_| {
                FetchError(
                    format!("{what} ({at}) answered {status} with no JSON"),
                    Some(status),
                )
            })?;
            Ok(Answer {
                status,
                json,
                max_age,
            })
        };
    tokio::time::timeout(deadline, read)
        .await
        .unwrap_or_else(|_| {
            Err(FetchError::at(format!(
                "{what} ({at}) did not answer within {deadline:?}"
            )))
        })
}

/// A reqwest error's text without the URL it carries (which may hold a query).
fn without_url(e: &reqwest::Error) -> String {
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "connection refused or unreachable"
    } else if e.is_body() || e.is_decode() {
        "its answer could not be read"
    } else {
        "the request failed"
    };
    match std::error::Error::source(e) {
        Some(src) => format!("{what}: {src}"),
        None => what.to_owned(),
    }
}

/// `max-age` of a `Cache-Control` value; `no-store`/`no-cache` count as 0.
pub(super) fn max_age(cc: &str) -> Option<Duration> {
    let mut age = None;
    for d in cc.split(',').map(str::trim) {
        let lower = d.to_ascii_lowercase();
        if lower == "no-store" || lower == "no-cache" {
            return Some(Duration::ZERO);
        }
        if let Some(n) = lower.strip_prefix("max-age=") {
            age = n
                .trim_matches('"')
                .parse::<u64>()
                .ok()
                .map(Duration::from_secs);
        }
    }
    age
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_control_gives_the_lifetime() {
        assert_eq!(
            max_age("public, max-age=600"),
            Some(Duration::from_secs(600))
        );
        assert_eq!(max_age("no-store"), Some(Duration::ZERO));
        assert_eq!(max_age("private"), None);
        assert_eq!(max_age("max-age=x"), None);
    }

    #[test]
    fn a_shown_url_has_no_query_or_credentials() {
        let u = url::Url::parse("https://u:p@as.example.com/jwks?sig=SECRET#x").unwrap();
        assert_eq!(shown(&u), "https://as.example.com/jwks");
    }
}
