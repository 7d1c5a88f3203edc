//! The one error type of the front door and the upstream hop, and the one place it becomes an
//! HTTP response: a status plus a JSON-RPC error body that echoes the request id when known.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use serde_json::value::RawValue;

use crate::body::{full, Body};

/// Where a failure came from, in the pingora sense.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The client sent something the sidecar refuses.
    Downstream,
    /// The upstream could not be reached or did not answer in time.
    Upstream,
}

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("Invalid Host header: {0}")]
    BadHost(String),
    #[error("Invalid Origin header: {0}")]
    BadOrigin(String),
    #[error("Request body is larger than the limit of {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("Could not read the request body: {0}")]
    BodyRead(String),
    #[error("Parse error: the request body is not valid JSON ({0})")]
    Parse(String),
    #[error("Invalid Request: {0}")]
    InvalidRequest(String),
    #[error("Method not allowed: {0}")]
    MethodNotAllowed(String),
    #[error("{0}")]
    InvalidParams(String),
    #[error("{0}")]
    HeaderMismatch(String),
    #[error("Unsupported protocol version: {requested}")]
    UnsupportedVersion { requested: String },
    #[error("Method not found: {0}")]
    MethodNotFound(String),
    #[error("{0}")]
    Internal(String),
    #[error("Upstream MCP server is unreachable: {0}")]
    UpstreamUnreachable(String),
    #[error("Upstream MCP server did not answer within {0:?}")]
    UpstreamTimeout(std::time::Duration),
    #[error("Upstream MCP server failed: {0}")]
    UpstreamFailed(String),
}

impl ProxyError {
    pub fn source_side(&self) -> Source {
        match self {
            ProxyError::UpstreamUnreachable(_)
            | ProxyError::UpstreamTimeout(_)
            | ProxyError::UpstreamFailed(_) => Source::Upstream,
            _ => Source::Downstream,
        }
    }

    /// Whether the same request may succeed if sent again unchanged.
    pub fn retryable(&self) -> bool {
        self.source_side() == Source::Upstream
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::BadHost(_) | ProxyError::BadOrigin(_) => StatusCode::FORBIDDEN,
            ProxyError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::BodyRead(_)
            | ProxyError::Parse(_)
            | ProxyError::InvalidRequest(_)
            | ProxyError::InvalidParams(_)
            | ProxyError::HeaderMismatch(_)
            | ProxyError::UnsupportedVersion { .. } => StatusCode::BAD_REQUEST,
            ProxyError::MethodNotFound(_) => StatusCode::NOT_FOUND,
            ProxyError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ProxyError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ProxyError::UpstreamUnreachable(_) | ProxyError::UpstreamFailed(_) => {
                StatusCode::BAD_GATEWAY
            }
            ProxyError::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    pub fn code(&self) -> i64 {
        match self {
            ProxyError::Parse(_) => -32700,
            ProxyError::InvalidRequest(_) => -32600,
            ProxyError::InvalidParams(_) => -32602,
            ProxyError::HeaderMismatch(_) => -32020,
            ProxyError::UnsupportedVersion { .. } => -32022,
            ProxyError::MethodNotFound(_) => -32601,
            ProxyError::Internal(_) => -32603,
            ProxyError::UpstreamUnreachable(_)
            | ProxyError::UpstreamTimeout(_)
            | ProxyError::UpstreamFailed(_) => -32603,
            _ => -32000,
        }
    }

    /// The HTTP response for this error; `id` is the request's id when it could be read.
    pub fn into_response(self, id: Option<&RawValue>) -> Response<Body> {
        let status = self.status();
        let data = match &self {
            ProxyError::UnsupportedVersion { requested } => Some(serde_json::json!({
                "supported": crate::mcp::version::MODERN_VERSIONS,
                "requested": requested,
            })),
            ProxyError::MethodNotFound(m) => Some(serde_json::Value::String(m.clone())),
            _ => None,
        };
        let body = error_body_with_data(id, self.code(), &self.to_string(), data.as_ref());
        let mut resp = Response::new(full(body));
        *resp.status_mut() = status;
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if status == StatusCode::METHOD_NOT_ALLOWED {
            resp.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("POST"));
        }
        resp
    }
}

/// `{"jsonrpc":"2.0","id":…,"error":{"code":…,"message":…}}`, with `id: null` when unknown.
pub fn error_body(id: Option<&RawValue>, code: i64, message: &str) -> Bytes {
    error_body_with_data(id, code, message, None)
}

pub fn error_body_with_data(
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
        let body = error_body(Some(&id), -32700, "bad \"json\"\n");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["id"], "abc");
        assert_eq!(v["error"]["code"], -32700);
        assert_eq!(v["error"]["message"], "bad \"json\"\n");
        let v: serde_json::Value = serde_json::from_slice(&error_body(None, -1, "x")).unwrap();
        assert!(v["id"].is_null());
    }

    #[test]
    fn statuses() {
        assert_eq!(ProxyError::BodyTooLarge { limit: 1 }.status(), 413);
        assert_eq!(ProxyError::UpstreamUnreachable("x".into()).status(), 502);
        assert_eq!(
            ProxyError::UpstreamTimeout(std::time::Duration::from_secs(1)).status(),
            504
        );
        assert!(ProxyError::UpstreamTimeout(std::time::Duration::from_secs(1)).retryable());
        assert!(!ProxyError::BadOrigin("x".into()).retryable());
    }
}
