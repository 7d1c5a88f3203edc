//! The one error type of the request path, and the one place it becomes an HTTP response: a
//! status plus a JSON-RPC error body that echoes the request id when it is known. As in
//! pingora, an error records what went wrong ([`ErrorKind`]), which side caused it ([`Side`]) and
//! whether the same request may succeed if sent again; the status and code follow from the
//! kind alone, so every refusal of one kind looks the same on the wire.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use serde_json::value::RawValue;

use crate::body::{self, Body, Buffered};

/// JSON-RPC error codes the sidecar sends.
pub(crate) mod code {
    pub(crate) const PARSE_ERROR: i64 = -32700;
    pub(crate) const INVALID_REQUEST: i64 = -32600;
    pub(crate) const METHOD_NOT_FOUND: i64 = -32601;
    pub(crate) const INVALID_PARAMS: i64 = -32602;
    pub(crate) const INTERNAL_ERROR: i64 = -32603;
    /// Implementation-defined server error (the SDKs use it for transport-level refusals).
    pub(crate) const SERVER_ERROR: i64 = -32000;
    pub(crate) const HEADER_MISMATCH: i64 = -32020;
    pub(crate) const MISSING_CLIENT_CAPABILITY: i64 = -32021;
    pub(crate) const UNSUPPORTED_VERSION: i64 = -32022;
}

/// Which side of the sidecar a failure came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// The client sent something the sidecar refuses.
    Client,
    /// The upstream could not be reached, did not answer in time, or refused.
    Upstream,
    /// The sidecar itself.
    Sidecar,
}

impl Side {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Upstream => "upstream",
            Side::Sidecar => "sidecar",
        }
    }
}

/// What went wrong. Each kind says once, in [`ErrorKind::traits`], everything that follows
/// from it; its wording is in `Display for Error`. Both matches list every kind, so a new one
/// is a variant, a row and a line of wording, the compiler pointing at the two.
#[derive(Debug)]
pub(crate) enum ErrorKind {
    BadHost,
    BadOrigin,
    BodyTooLarge {
        limit: usize,
    },
    BodyRead,
    Parse,
    InvalidRequest,
    MethodNotAllowed,
    /// A POST whose `Content-Type` is not `application/json`.
    UnsupportedMediaType,
    InvalidParams,
    HeaderMismatch,
    UnsupportedVersion {
        requested: String,
        supported: &'static [&'static str],
    },
    MethodNotFound {
        method: String,
    },
    /// The request's head or body did not arrive in time.
    RequestTimeout,
    /// Too many requests from this client (or for this tool); retry after this many seconds.
    RateLimited {
        retry_after: u64,
    },
    /// The sidecar is at a limit (requests in flight, memory budget); retry after this many
    /// seconds.
    Overloaded {
        retry_after: u64,
    },
    /// The sidecar is shutting down and cut the request short.
    ShuttingDown,
    /// The upstream's answer is larger than the sidecar reads.
    UpstreamTooLarge {
        limit: usize,
    },
    UpstreamUnreachable,
    UpstreamTimeout(Duration),
    UpstreamFailed,
    /// The upstream session a request names is gone (a stdio MCP server process restarted):
    /// 404, which tells a 2025 client to initialise again.
    SessionGone,
    /// The upstream's own refusal (its 401, its 5xx, …), passed to the client as it was.
    UpstreamRefused(Box<Buffered>),
    Internal,
    /// No valid access token (the authorization front door): 401 with its challenge.
    Unauthorized {
        challenge: String,
    },
    /// A malformed `Authorization` (two headers, another scheme, a token in the query): 400.
    BadAuthorization {
        challenge: String,
    },
    /// A valid token without a scope the request needs: 403 with the step-up challenge.
    InsufficientScope {
        challenge: String,
    },
    /// The authorization server cannot be asked (its keys, its introspection endpoint): 503.
    AuthUnavailable {
        retry_after: u64,
    },
}

/// Whether the same request, sent again unchanged, may succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    Again,
    Never,
}

impl Retry {
    /// What a peer's HTTP status says (see [`transient`]).
    fn after(status: StatusCode) -> Self {
        if transient(status.as_u16()) {
            Retry::Again
        } else {
            Retry::Never
        }
    }
}

/// How loudly the request path logs a request that ended in this error: a client's mistake
/// is the client's to see (debug); the sidecar's or the upstream's failure is the operator's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    Debug,
    Warn,
}

/// The `data` of the JSON-RPC error, when the kind has one.
#[derive(Debug, Clone, Copy)]
enum Data<'a> {
    None,
    Versions {
        requested: &'a str,
        supported: &'static [&'static str],
    },
    Method(&'a str),
}

/// Everything that follows from an [`ErrorKind`], the same for every error of that kind.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KindTraits<'a> {
    pub(crate) status: StatusCode,
    pub(crate) code: i64,
    pub(crate) side: Side,
    pub(crate) retry: Retry,
    pub(crate) level: Level,
    /// Seconds for `Retry-After`.
    pub(crate) retry_after: Option<u64>,
    /// `Connection: close`: the client's connection is not worth keeping (it was too slow, or
    /// the sidecar is going away).
    pub(crate) close: bool,
    /// `Allow`, for a refused HTTP method.
    pub(crate) allow: Option<&'static str>,
    /// `WWW-Authenticate`, for a refusal of the authorization front door.
    pub(crate) challenge: Option<&'a str>,
    data: Data<'a>,
}

impl<'a> KindTraits<'a> {
    const fn row(status: StatusCode, code: i64, side: Side, retry: Retry, level: Level) -> Self {
        KindTraits {
            status,
            code,
            side,
            retry,
            level,
            retry_after: None,
            close: false,
            allow: None,
            challenge: None,
            data: Data::None,
        }
    }

    const fn challenge(mut self, challenge: &'a str) -> Self {
        self.challenge = Some(challenge);
        self
    }

    const fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }

    const fn close(mut self) -> Self {
        self.close = true;
        self
    }

    const fn allow(mut self, methods: &'static str) -> Self {
        self.allow = Some(methods);
        self
    }

    const fn data(mut self, data: Data<'a>) -> Self {
        self.data = data;
        self
    }
}

impl ErrorKind {
    /// The one row per kind: HTTP status, JSON-RPC code, the side at fault, whether to send
    /// again, log level, then the headers and `data` a kind adds.
    #[rustfmt::skip]
    pub(crate) fn traits(&self) -> KindTraits<'_> {
        use code::*;
        use Level::{Debug, Warn};
        use Retry::{Again, Never};
        use Side::{Client, Sidecar, Upstream};
        use StatusCode as S;
        let row = KindTraits::row;
        match self {
            ErrorKind::BadHost =>                row(S::FORBIDDEN,              SERVER_ERROR,        Client,   Never, Debug),
            ErrorKind::BadOrigin =>              row(S::FORBIDDEN,              SERVER_ERROR,        Client,   Never, Debug),
            ErrorKind::BodyTooLarge { .. } =>    row(S::PAYLOAD_TOO_LARGE,      SERVER_ERROR,        Client,   Never, Debug),
            ErrorKind::BodyRead =>               row(S::BAD_REQUEST,            SERVER_ERROR,        Client,   Never, Debug),
            ErrorKind::Parse =>                  row(S::BAD_REQUEST,            PARSE_ERROR,         Client,   Never, Debug),
            ErrorKind::InvalidRequest =>         row(S::BAD_REQUEST,            INVALID_REQUEST,     Client,   Never, Debug),
            ErrorKind::MethodNotAllowed =>       row(S::METHOD_NOT_ALLOWED,     SERVER_ERROR,        Client,   Never, Debug)
                .allow("POST"),
            ErrorKind::UnsupportedMediaType =>   row(S::UNSUPPORTED_MEDIA_TYPE, SERVER_ERROR,        Client,   Never, Debug),
            ErrorKind::InvalidParams =>          row(S::BAD_REQUEST,            INVALID_PARAMS,      Client,   Never, Debug),
            ErrorKind::HeaderMismatch =>         row(S::BAD_REQUEST,            HEADER_MISMATCH,     Client,   Never, Debug),
            ErrorKind::UnsupportedVersion { requested, supported } =>
                                                 row(S::BAD_REQUEST,            UNSUPPORTED_VERSION, Client,   Never, Debug)
                .data(Data::Versions { requested, supported }),
            ErrorKind::MethodNotFound { method } =>
                                                 row(S::NOT_FOUND,              METHOD_NOT_FOUND,    Client,   Never, Debug)
                .data(Data::Method(method)),
            ErrorKind::RequestTimeout =>         row(S::REQUEST_TIMEOUT,        SERVER_ERROR,        Client,   Again, Debug)
                .close(),
            ErrorKind::RateLimited { retry_after } =>
                                                 row(S::TOO_MANY_REQUESTS,      SERVER_ERROR,        Client,   Again, Debug)
                .retry_after(*retry_after),
            ErrorKind::Overloaded { retry_after } =>
                                                 row(S::SERVICE_UNAVAILABLE,    SERVER_ERROR,        Sidecar,  Again, Warn)
                .retry_after(*retry_after),
            ErrorKind::ShuttingDown =>           row(S::SERVICE_UNAVAILABLE,    SERVER_ERROR,        Sidecar,  Again, Warn)
                .retry_after(1).close(),
            ErrorKind::UpstreamTooLarge { .. } =>row(S::BAD_GATEWAY,            INTERNAL_ERROR,      Upstream, Never, Warn),
            ErrorKind::UpstreamUnreachable =>    row(S::BAD_GATEWAY,            INTERNAL_ERROR,      Upstream, Again, Warn),
            ErrorKind::UpstreamTimeout(_) =>     row(S::GATEWAY_TIMEOUT,        INTERNAL_ERROR,      Upstream, Again, Warn),
            ErrorKind::UpstreamFailed =>         row(S::BAD_GATEWAY,            INTERNAL_ERROR,      Upstream, Again, Warn),
            ErrorKind::SessionGone =>            row(S::NOT_FOUND,              INTERNAL_ERROR,      Upstream, Never, Warn),
            // Passed on as it came: its status, and what that status says about sending again.
            ErrorKind::UpstreamRefused(answer) =>
                                                 row(answer.status,             SERVER_ERROR,        Upstream, Retry::after(answer.status), Warn),
            ErrorKind::Internal =>               row(S::INTERNAL_SERVER_ERROR,  INTERNAL_ERROR,      Sidecar,  Never, Warn),
            ErrorKind::Unauthorized { challenge } =>
                                                 row(S::UNAUTHORIZED,           SERVER_ERROR,        Client,   Never, Debug)
                .challenge(challenge),
            ErrorKind::BadAuthorization { challenge } =>
                                                 row(S::BAD_REQUEST,            INVALID_REQUEST,     Client,   Never, Debug)
                .challenge(challenge),
            ErrorKind::InsufficientScope { challenge } =>
                                                 row(S::FORBIDDEN,              SERVER_ERROR,        Client,   Never, Debug)
                .challenge(challenge),
            ErrorKind::AuthUnavailable { retry_after } =>
                                                 row(S::SERVICE_UNAVAILABLE,    SERVER_ERROR,        Sidecar,  Again, Warn)
                .retry_after(*retry_after),
        }
    }
}

/// Whether a peer's HTTP status says the same request may succeed if sent again: a timeout
/// (408), too many requests (429) or a server error (5xx). The one rule for every peer: the
/// upstream's refusals, Epode's answers to the feedback tools and to telemetry.
pub(crate) fn transient(status: u16) -> bool {
    status == 408 || status == 429 || (500..600).contains(&status)
}

/// The underlying failure an [`Error`] wraps, kept as an error (for [`std::error::Error::source`])
/// and rendered only where the message is made.
type Source = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug)]
pub(crate) struct Error {
    kind: ErrorKind,
    /// What a person needs to act on it (never a secret, a handle or a body); with a
    /// `source`, what the sidecar was doing when it failed.
    context: String,
    source: Option<Source>,
    /// Refused before any of the request reached the upstream.
    unsent: bool,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, cause: impl Into<String>) -> Self {
        Error {
            kind,
            context: cause.into(),
            source: None,
            unsent: false,
        }
    }

    /// An error of `kind` caused by `source` while the sidecar was doing `context` (which may
    /// be empty): the message reads `context: source`.
    pub(crate) fn caused_by(
        kind: ErrorKind,
        context: impl Into<String>,
        source: impl Into<Source>,
    ) -> Self {
        Error {
            source: Some(source.into()),
            ..Error::new(kind, context)
        }
    }

    /// A refusal made before any of the request reached the upstream (a limit of the
    /// sidecar's own on the way there): no product call happened.
    pub(crate) fn unsent(mut self) -> Self {
        self.unsent = true;
        self
    }

    /// Whether nothing of the request reached the upstream.
    pub(crate) fn was_unsent(&self) -> bool {
        self.unsent
    }

    /// The upstream's answer, to pass on unchanged.
    pub(crate) fn upstream_refused(answer: Buffered) -> Self {
        let cause = format!("the upstream answered {}", answer.status);
        Error::new(ErrorKind::UpstreamRefused(Box::new(answer)), cause)
    }

    /// The upstream's answer this error passes on, when it is one.
    pub(crate) fn upstream_answer(&self) -> Option<&Buffered> {
        if let ErrorKind::UpstreamRefused(answer) = &self.kind {
            Some(answer)
        } else {
            None
        }
    }

    pub(crate) fn kind(&self) -> &ErrorKind {
        &self.kind
    }

    /// What a person needs to act on it, without the kind's wording: the context, then the
    /// chain of causes.
    pub(crate) fn cause(&self) -> Cow<'_, str> {
        match &self.source {
            None => Cow::Borrowed(&self.context),
            Some(_) => Cow::Owned(self.chain().to_string()),
        }
    }

    fn chain(&self) -> Chain<'_> {
        Chain {
            context: &self.context,
            source: self.source.as_deref(),
        }
    }

    fn traits(&self) -> KindTraits<'_> {
        self.kind.traits()
    }

    pub(crate) fn side(&self) -> Side {
        self.traits().side
    }

    /// Whether the same request, sent again unchanged, may succeed.
    pub(crate) fn retryable(&self) -> bool {
        self.traits().retry == Retry::Again
    }

    /// How loudly to log the request this error ended.
    pub(crate) fn level(&self) -> Level {
        self.traits().level
    }

    pub(crate) fn status(&self) -> StatusCode {
        self.traits().status
    }

    pub(crate) fn code(&self) -> i64 {
        self.traits().code
    }

    fn data(&self) -> Option<serde_json::Value> {
        match self.traits().data {
            Data::None => None,
            Data::Versions {
                requested,
                supported,
            } => Some(serde_json::json!({"supported": supported, "requested": requested})),
            Data::Method(method) => Some(serde_json::Value::String(method.to_owned())),
        }
    }

    /// The JSON-RPC error message for `id` (`null` when unknown).
    pub(crate) fn body(&self, id: Option<&RawValue>) -> Bytes {
        error_body(id, self.code(), &self.to_string(), self.data().as_ref())
    }

    /// Seconds after which the same request may succeed, for `Retry-After`.
    pub(crate) fn retry_after(&self) -> Option<u64> {
        self.traits().retry_after
    }

    /// The HTTP response for this error; `id` is the request's id when it could be read.
    pub(crate) fn into_response(self, id: Option<&RawValue>) -> Response<Body> {
        let KindTraits {
            status,
            retry_after,
            close,
            allow,
            challenge,
            ..
        } = self.traits();
        let challenge = challenge.and_then(|c| HeaderValue::from_str(c).ok());
        let body = self.body(id);
        if let ErrorKind::UpstreamRefused(answer) = self.kind {
            return answer.into_response();
        }
        let mut resp = body::json(status, body);
        if let Some(methods) = allow {
            resp.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(methods));
        }
        if let Some(secs) = retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if close {
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if let Some(c) = challenge {
            resp.headers_mut().insert(header::WWW_AUTHENTICATE, c);
        }
        resp
    }
}

/// An error's cause as text: its context, then `: ` and each cause in the chain whose text
/// the ones before do not already say (a `hyper::Error` repeats its source's text).
struct Chain<'a> {
    context: &'a str,
    source: Option<&'a (dyn std::error::Error + Send + Sync + 'static)>,
}

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.context)?;
        let Some(first) = self.source else {
            return Ok(());
        };
        let mut said = first.to_string();
        if !self.context.is_empty() {
            f.write_str(": ")?;
        }
        f.write_str(&said)?;
        let mut next = first.source();
        while let Some(cause) = next {
            let text = cause.to_string();
            if !said.contains(&text) {
                write!(f, ": {text}")?;
                said.push_str(": ");
                said.push_str(&text);
            }
            next = cause.source();
        }
        Ok(())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.chain();
        match &self.kind {
            ErrorKind::BadHost => write!(f, "Invalid Host header: {c}"),
            ErrorKind::BadOrigin => write!(f, "Invalid Origin header: {c}"),
            ErrorKind::BodyTooLarge { limit } => {
                write!(f, "Request body is larger than the limit of {limit} bytes")
            }
            ErrorKind::BodyRead => write!(f, "Could not read the request body: {c}"),
            ErrorKind::Parse => write!(f, "Parse error: the request body is not valid JSON ({c})"),
            ErrorKind::InvalidRequest => write!(f, "Invalid Request: {c}"),
            ErrorKind::MethodNotAllowed => write!(f, "Method not allowed: {c}"),
            ErrorKind::UnsupportedMediaType => write!(f, "Unsupported Media Type: {c}"),
            ErrorKind::InvalidParams | ErrorKind::HeaderMismatch | ErrorKind::Internal => {
                write!(f, "{c}")
            }
            ErrorKind::UnsupportedVersion { requested, .. } => {
                write!(f, "Unsupported protocol version: {requested}")
            }
            ErrorKind::MethodNotFound { method } => write!(f, "Method not found: {method}"),
            ErrorKind::RequestTimeout => write!(f, "Request timeout: {c}"),
            ErrorKind::RateLimited { retry_after } => {
                write!(f, "Too many requests: {c}; retry after {retry_after} s")
            }
            ErrorKind::Overloaded { retry_after } => {
                write!(
                    f,
                    "The sidecar is at a limit: {c}; retry after {retry_after} s"
                )
            }
            ErrorKind::ShuttingDown => write!(
                f,
                "The sidecar is shutting down and cut this request short; send it again"
            ),
            ErrorKind::UpstreamTooLarge { limit } => write!(
                f,
                "Upstream MCP server's answer is larger than the {limit} bytes the sidecar reads"
            ),
            ErrorKind::UpstreamUnreachable => write!(f, "Upstream MCP server is unreachable: {c}"),
            ErrorKind::UpstreamTimeout(d) => {
                write!(f, "Upstream MCP server did not answer within {d:?}")
            }
            ErrorKind::UpstreamFailed | ErrorKind::SessionGone => {
                write!(f, "Upstream MCP server failed: {c}")
            }
            ErrorKind::UpstreamRefused(_) => write!(f, "Upstream MCP server refused: {c}"),
            ErrorKind::Unauthorized { .. } => write!(f, "Unauthorized: {c}"),
            ErrorKind::BadAuthorization { .. } => write!(f, "Bad Authorization header: {c}"),
            ErrorKind::InsufficientScope { .. } => write!(f, "Insufficient scope: {c}"),
            ErrorKind::AuthUnavailable { retry_after } => {
                write!(
                    f,
                    "Authorization unavailable: {c}; retry after {retry_after} s"
                )
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

/// `{"jsonrpc":"2.0","id":…,"error":{"code":…,"message":…[,"data":…]}}`, `id: null` when
/// unknown.
pub(crate) fn error_body(
    id: Option<&RawValue>,
    code: i64,
    message: &str,
    data: Option<&serde_json::Value>,
) -> Bytes {
    let id = id.map(RawValue::get).unwrap_or("null");
    let message = serde_json::to_string(message).unwrap_or_else(|_| "\"error\"".to_owned());
    let data = data.map(|d| format!(r#","data":{d}"#)).unwrap_or_default();
    Bytes::from(format!(
        r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":{code},"message":{message}{data}}}}}"#
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_body_echoes_id_and_escapes_message() {
        let id = RawValue::from_string("\"abc\"".to_owned()).unwrap();
        let body = error_body(Some(&id), -32700, "bad \"json\"\n", None);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["id"], "abc");
        assert_eq!(v["error"]["code"], -32700);
        assert_eq!(v["error"]["message"], "bad \"json\"\n");
        let v: serde_json::Value =
            serde_json::from_slice(&error_body(None, -1, "x", None)).unwrap();
        assert!(v["id"].is_null());
    }

    #[test]
    fn kinds_map_to_one_status_and_code() {
        let e = Error::new(ErrorKind::BodyTooLarge { limit: 1 }, "");
        assert_eq!(
            (e.status(), e.side()),
            (StatusCode::PAYLOAD_TOO_LARGE, Side::Client)
        );
        let e = Error::new(ErrorKind::UpstreamUnreachable, "refused");
        assert_eq!((e.status().as_u16(), e.code()), (502, -32603));
        assert!(e.retryable() && e.side() == Side::Upstream);
        let e = Error::new(ErrorKind::UpstreamTimeout(Duration::from_secs(1)), "");
        assert_eq!(e.status(), 504);
        assert!(!Error::new(ErrorKind::BadOrigin, "x").retryable());
        let e = Error::new(
            ErrorKind::UnsupportedVersion {
                requested: "1".into(),
                supported: &["2026-07-28"],
            },
            "",
        );
        let v: serde_json::Value = serde_json::from_slice(&e.body(None)).unwrap();
        assert_eq!(v["error"]["data"]["supported"][0], "2026-07-28");
        let passed = Error::upstream_refused(Buffered {
            status: StatusCode::UNAUTHORIZED,
            headers: Default::default(),
            bytes: Bytes::from_static(b"no"),
        });
        assert_eq!(passed.status(), 401);
        assert!(!passed.retryable());
    }

    /// The row of each kind, against the statuses, codes, sides, retry answers, log levels and
    /// `Retry-After`s the request path has always given (the black-box suite asserts them on
    /// the wire; this says which row a change would be in).
    /// Status, JSON-RPC code, side, retryable, log level, `Retry-After`.
    type Row = (u16, i64, Side, bool, Level, Option<u64>);

    fn row_of(kind: ErrorKind) -> Row {
        let e = Error::new(kind, "why");
        let (status, code, side) = (e.status().as_u16(), e.code(), e.side());
        (
            status,
            code,
            side,
            e.retryable(),
            e.level(),
            e.retry_after(),
        )
    }

    #[test]
    fn every_kind_keeps_its_row() {
        use ErrorKind as K;
        use Level::{Debug, Warn};
        use Side::{Client, Sidecar, Upstream};
        let refused = |status| {
            K::UpstreamRefused(Box::new(Buffered {
                status,
                headers: Default::default(),
                bytes: Bytes::new(),
            }))
        };
        let version = K::UnsupportedVersion {
            requested: "1".into(),
            supported: &[],
        };
        let method = K::MethodNotFound { method: "m".into() };
        let timeout = K::UpstreamTimeout(Duration::from_secs(1));
        let rows: Vec<(K, Row)> = vec![
            (K::BadHost, (403, -32000, Client, false, Debug, None)),
            (K::BadOrigin, (403, -32000, Client, false, Debug, None)),
            (
                K::BodyTooLarge { limit: 1 },
                (413, -32000, Client, false, Debug, None),
            ),
            (K::BodyRead, (400, -32000, Client, false, Debug, None)),
            (K::Parse, (400, -32700, Client, false, Debug, None)),
            (K::InvalidRequest, (400, -32600, Client, false, Debug, None)),
            (
                K::MethodNotAllowed,
                (405, -32000, Client, false, Debug, None),
            ),
            (
                K::UnsupportedMediaType,
                (415, -32000, Client, false, Debug, None),
            ),
            (K::InvalidParams, (400, -32602, Client, false, Debug, None)),
            (K::HeaderMismatch, (400, -32020, Client, false, Debug, None)),
            (version, (400, -32022, Client, false, Debug, None)),
            (method, (404, -32601, Client, false, Debug, None)),
            (K::RequestTimeout, (408, -32000, Client, true, Debug, None)),
            (
                K::RateLimited { retry_after: 7 },
                (429, -32000, Client, true, Debug, Some(7)),
            ),
            (
                K::Overloaded { retry_after: 3 },
                (503, -32000, Sidecar, true, Warn, Some(3)),
            ),
            (K::ShuttingDown, (503, -32000, Sidecar, true, Warn, Some(1))),
            (
                K::UpstreamTooLarge { limit: 1 },
                (502, -32603, Upstream, false, Warn, None),
            ),
            (
                K::UpstreamUnreachable,
                (502, -32603, Upstream, true, Warn, None),
            ),
            (timeout, (504, -32603, Upstream, true, Warn, None)),
            (K::UpstreamFailed, (502, -32603, Upstream, true, Warn, None)),
            (K::SessionGone, (404, -32603, Upstream, false, Warn, None)),
            (
                refused(StatusCode::UNAUTHORIZED),
                (401, -32000, Upstream, false, Warn, None),
            ),
            (
                refused(StatusCode::BAD_GATEWAY),
                (502, -32000, Upstream, true, Warn, None),
            ),
            (K::Internal, (500, -32603, Sidecar, false, Warn, None)),
        ];
        for (kind, want) in rows {
            let name = format!("{kind:?}");
            assert_eq!(row_of(kind), want, "{name}");
        }
    }

    /// The headers a kind adds come from its row: `Allow` for 405, `Connection: close` for a
    /// slow client and for shutdown, `Retry-After` where the row has one.
    #[test]
    fn rows_add_their_headers() {
        let resp = Error::new(ErrorKind::MethodNotAllowed, "GET").into_response(None);
        assert_eq!(resp.headers()[header::ALLOW], "POST");
        assert!(resp.headers().get(header::CONNECTION).is_none());
        let resp = Error::new(ErrorKind::ShuttingDown, "").into_response(None);
        assert_eq!(resp.headers()[header::CONNECTION], "close");
        assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
        let resp = Error::new(ErrorKind::RequestTimeout, "slow").into_response(None);
        assert_eq!(resp.headers()[header::CONNECTION], "close");
        assert!(resp.headers().get(header::RETRY_AFTER).is_none());
        let resp = Error::new(ErrorKind::Internal, "x").into_response(None);
        assert!(resp.headers().get(header::ALLOW).is_none());
        assert!(resp.headers().get(header::CONNECTION).is_none());
    }

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl fmt::Display for Layer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|l| l as _)
        }
    }

    /// A cause stays an error behind `source()`, and the message reads as the flattened
    /// string did: `context: cause`, each deeper cause once.
    #[test]
    fn a_cause_is_kept_as_a_chain_and_rendered_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let e = Error::caused_by(
            ErrorKind::UpstreamUnreachable,
            "cannot start the MCP server `x`",
            io,
        );
        let source = std::error::Error::source(&e).expect("the cause is kept");
        assert_eq!(
            source.downcast_ref::<std::io::Error>().map(|e| e.kind()),
            Some(std::io::ErrorKind::NotFound)
        );
        assert_eq!(
            e.to_string(),
            "Upstream MCP server is unreachable: cannot start the MCP server `x`: no such file"
        );
        assert_eq!(e.cause(), "cannot start the MCP server `x`: no such file");

        // hyper's errors say their source's text again: it is not repeated.
        let deep = Layer(
            "connection error: reset",
            Some(Box::new(Layer(
                "reset",
                Some(Box::new(Layer("os error 104", None))),
            ))),
        );
        let e = Error::caused_by(ErrorKind::UpstreamFailed, "", deep);
        assert_eq!(
            e.to_string(),
            "Upstream MCP server failed: connection error: reset: os error 104"
        );
        let parse = serde_json::from_slice::<serde_json::Value>(b"{").unwrap_err();
        let text = parse.to_string();
        let e = Error::caused_by(ErrorKind::Parse, "", parse);
        assert_eq!(e.cause(), text);
        assert!(std::error::Error::source(&e).is_some());
        assert!(std::error::Error::source(&Error::new(ErrorKind::Internal, "x")).is_none());
    }
}
