//! The response body type shared by every path (bytes the sidecar made, or the upstream's body
//! streamed through frame by frame), and a whole answer kept to be passed on as it was.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use http_body::Frame;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Empty, Full};

use crate::budget::Reservation;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub(crate) type Body = UnsyncBoxBody<Bytes, BoxError>;

pub(crate) fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Bytes the sidecar made, still counted in the memory budget until they are sent.
pub(crate) fn held(bytes: Bytes, reservation: Reservation) -> Body {
    Held {
        bytes: Some(bytes),
        reservation: Some(reservation),
    }
    .boxed_unsync()
}

struct Held {
    bytes: Option<Bytes>,
    reservation: Option<Reservation>,
}

impl http_body::Body for Held {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let frame = self.bytes.take().map(|b| Ok(Frame::data(b)));
        if frame.is_none() {
            self.reservation = None;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.bytes.is_none()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.bytes.as_ref().map_or(0, |b| b.len() as u64))
    }
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
