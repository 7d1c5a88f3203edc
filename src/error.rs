//! The one error type of the request path, and the one place it becomes an HTTP response: a
//! status plus a JSON-RPC error body that echoes the request id when it is known. As in
//! pingora, an error records what went wrong ([`ErrorKind`]), which side caused it ([`Side`]) and
//! whether the same request may succeed if sent again; the status and code follow from the
//! kind alone, so every refusal of one kind looks the same on the wire.

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

/// What went wrong. Each kind has one HTTP status and one JSON-RPC code.
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
}

/// Whether a peer's HTTP status says the same request may succeed if sent again: a timeout
/// (408), too many requests (429) or a server error (5xx). The one rule for every peer: the
/// upstream's refusals, Epode's answers to the feedback tools and to telemetry.
pub(crate) fn transient(status: u16) -> bool {
    status == 408 || status == 429 || (500..600).contains(&status)
}

#[derive(Debug)]
pub(crate) struct Error {
    kind: ErrorKind,
    /// What a person needs to act on it (never a secret, a handle or a body).
    cause: String,
    /// Refused before any of the request reached the upstream.
    unsent: bool,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, cause: impl Into<String>) -> Self {
        Error {
            kind,
            cause: cause.into(),
            unsent: false,
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
        match &self.kind {
            ErrorKind::UpstreamRefused(answer) => Some(answer),
            _ => None,
        }
    }

    pub(crate) fn kind(&self) -> &ErrorKind {
        &self.kind
    }

    /// What a person needs to act on it, without the kind's wording.
    pub(crate) fn cause(&self) -> &str {
        &self.cause
    }

    pub(crate) fn side(&self) -> Side {
        match self.kind {
            ErrorKind::UpstreamUnreachable
            | ErrorKind::UpstreamTimeout(_)
            | ErrorKind::UpstreamFailed
            | ErrorKind::SessionGone
            | ErrorKind::UpstreamTooLarge { .. }
            | ErrorKind::UpstreamRefused(_) => Side::Upstream,
            ErrorKind::Internal | ErrorKind::Overloaded { .. } | ErrorKind::ShuttingDown => {
                Side::Sidecar
            }
            _ => Side::Client,
        }
    }

    /// Whether the same request, sent again unchanged, may succeed.
    pub(crate) fn retryable(&self) -> bool {
        match &self.kind {
            ErrorKind::UpstreamUnreachable
            | ErrorKind::UpstreamTimeout(_)
            | ErrorKind::UpstreamFailed
            | ErrorKind::RateLimited { .. }
            | ErrorKind::Overloaded { .. }
            | ErrorKind::ShuttingDown
            | ErrorKind::RequestTimeout => true,
            ErrorKind::UpstreamRefused(answer) => transient(answer.status.as_u16()),
            _ => false,
        }
    }

    pub(crate) fn status(&self) -> StatusCode {
        match &self.kind {
            ErrorKind::BadHost | ErrorKind::BadOrigin => StatusCode::FORBIDDEN,
            ErrorKind::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::BodyRead
            | ErrorKind::Parse
            | ErrorKind::InvalidRequest
            | ErrorKind::InvalidParams
            | ErrorKind::HeaderMismatch
            | ErrorKind::UnsupportedVersion { .. } => StatusCode::BAD_REQUEST,
            ErrorKind::MethodNotFound { .. } | ErrorKind::SessionGone => StatusCode::NOT_FOUND,
            ErrorKind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorKind::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorKind::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ErrorKind::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::Overloaded { .. } | ErrorKind::ShuttingDown => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ErrorKind::UpstreamUnreachable
            | ErrorKind::UpstreamFailed
            | ErrorKind::UpstreamTooLarge { .. } => StatusCode::BAD_GATEWAY,
            ErrorKind::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ErrorKind::UpstreamRefused(answer) => answer.status,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub(crate) fn code(&self) -> i64 {
        match &self.kind {
            ErrorKind::Parse => code::PARSE_ERROR,
            ErrorKind::InvalidRequest => code::INVALID_REQUEST,
            ErrorKind::InvalidParams => code::INVALID_PARAMS,
            ErrorKind::HeaderMismatch => code::HEADER_MISMATCH,
            ErrorKind::UnsupportedVersion { .. } => code::UNSUPPORTED_VERSION,
            ErrorKind::MethodNotFound { .. } => code::METHOD_NOT_FOUND,
            ErrorKind::UpstreamUnreachable
            | ErrorKind::UpstreamTimeout(_)
            | ErrorKind::UpstreamFailed
            | ErrorKind::SessionGone
            | ErrorKind::UpstreamTooLarge { .. }
            | ErrorKind::Internal => code::INTERNAL_ERROR,
            ErrorKind::BadHost
            | ErrorKind::BadOrigin
            | ErrorKind::BodyTooLarge { .. }
            | ErrorKind::BodyRead
            | ErrorKind::MethodNotAllowed
            | ErrorKind::UnsupportedMediaType
            | ErrorKind::RequestTimeout
            | ErrorKind::RateLimited { .. }
            | ErrorKind::Overloaded { .. }
            | ErrorKind::ShuttingDown
            | ErrorKind::UpstreamRefused(_) => code::SERVER_ERROR,
        }
    }

    fn data(&self) -> Option<serde_json::Value> {
        match &self.kind {
            ErrorKind::UnsupportedVersion {
                requested,
                supported,
            } => Some(serde_json::json!({"supported": supported, "requested": requested})),
            ErrorKind::MethodNotFound { method } => Some(serde_json::Value::String(method.clone())),
            _ => None,
        }
    }

    /// The JSON-RPC error message for `id` (`null` when unknown).
    pub(crate) fn body(&self, id: Option<&RawValue>) -> Bytes {
        error_body(id, self.code(), &self.to_string(), self.data().as_ref())
    }

    /// Seconds after which the same request may succeed, for `Retry-After`.
    pub(crate) fn retry_after(&self) -> Option<u64> {
        match self.kind {
            ErrorKind::RateLimited { retry_after } | ErrorKind::Overloaded { retry_after } => {
                Some(retry_after)
            }
            ErrorKind::ShuttingDown => Some(1),
            _ => None,
        }
    }

    /// The HTTP response for this error; `id` is the request's id when it could be read.
    pub(crate) fn into_response(self, id: Option<&RawValue>) -> Response<Body> {
        let status = self.status();
        let body = self.body(id);
        let retry_after = self.retry_after();
        if let ErrorKind::UpstreamRefused(answer) = self.kind {
            return answer.into_response();
        }
        let mut resp = body::json(status, body);
        if status == StatusCode::METHOD_NOT_ALLOWED {
            resp.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("POST"));
        }
        if let Some(secs) = retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if status == StatusCode::REQUEST_TIMEOUT || matches!(self.kind, ErrorKind::ShuttingDown) {
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.cause;
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
                f.write_str(c)
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
        }
    }
}

impl std::error::Error for Error {}

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
}
