//! The response body type shared by every path (bytes the sidecar made, or the upstream's body
//! streamed through frame by frame), and a whole answer kept to be passed on as it was.

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Empty, Full};

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub(crate) type Body = UnsyncBoxBody<Bytes, BoxError>;

pub(crate) fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

pub(crate) fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

/// A response with a JSON body.
pub(crate) fn json(status: StatusCode, bytes: impl Into<Bytes>) -> Response<Body> {
    let mut resp = Response::new(full(bytes));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// A complete HTTP answer read whole, to be passed on exactly as it was.
#[derive(Debug)]
pub(crate) struct Buffered {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) bytes: Bytes,
}

impl Buffered {
    pub(crate) fn into_response(self) -> Response<Body> {
        let mut resp = Response::new(full(self.bytes));
        *resp.status_mut() = self.status;
        *resp.headers_mut() = self.headers;
        resp.headers_mut().remove(header::CONTENT_LENGTH);
        resp
    }
}
