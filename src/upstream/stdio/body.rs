//! The body of a stdio server's answer, as an HTTP server would have sent it: one JSON message,
//! or an SSE stream of the request's notifications ending with its response. While the
//! request is open a [`Waiter`] keeps its place in the table; dropped before the response (the
//! client went away), it tells the child with `notifications/cancelled`.

use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::Frame;
use tokio::sync::{mpsc, oneshot};

use super::pipe::Pipe;
use super::table::{Answer, Held, Key};
use crate::body::BoxError;

/// A request's place in the table, given up when it is dropped.
pub(super) struct Waiter {
    pub(super) pipe: Arc<Pipe>,
    pub(super) key: Key,
    pub(super) generation: u64,
    /// Whether the child was sent the request (then a client that leaves cancels it).
    pub(super) sent: bool,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let still_waiting = self.pipe.lock().remove(self.key);
        if still_waiting && self.sent {
            self.pipe.cancel(self.generation, self.key);
        }
    }
}

/// A watcher's place in the table (`RequestTable::watch`), given up when it is dropped.
pub(crate) struct Watching {
    pub(super) pipe: Arc<Pipe>,
    pub(super) key: Key,
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.pipe.lock().unwatch(self.key);
    }
}

/// A stream's parts: the notifications, the response, and the place in the table.
pub(crate) struct Streamed {
    pub(super) notes: mpsc::Receiver<Held>,
    pub(super) done: oneshot::Receiver<Answer>,
    pub(super) waiter: Waiter,
}

pub(crate) enum StdioBody {
    Json(Option<Held>),
    Stream {
        first: Option<Held>,
        parts: Option<Streamed>,
        /// The response, once it arrived, kept until the notifications before it are out.
        answer: Option<Result<Answer, oneshot::error::RecvError>>,
    },
    /// The child's change notices, as the GET stream of a 2025 session carries them; it
    /// ends when the pipe is gone.
    Watch {
        notes: mpsc::Receiver<Held>,
        _watching: Watching,
    },
}

/// One SSE event carrying a JSON-RPC message.
fn event(bytes: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(bytes.len() + 22);
    out.extend_from_slice(b"event: message\ndata: ");
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\n\n");
    out.freeze()
}

impl http_body::Body for StdioBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            StdioBody::Json(held) => Poll::Ready(held.take().map(|(b, _)| Ok(Frame::data(b)))),
            StdioBody::Watch { notes, .. } => notes
                .poll_recv(cx)
                .map(|n| n.map(|(b, _)| Ok(Frame::data(event(&b))))),
            StdioBody::Stream {
                first,
                parts,
                answer,
            } => {
                if let Some((b, _)) = first.take() {
                    return Poll::Ready(Some(Ok(Frame::data(event(&b)))));
                }
                let Some(p) = parts.as_mut() else {
                    return Poll::Ready(None);
                };
                if answer.is_none() {
                    if let Poll::Ready(Some((b, _))) = p.notes.poll_recv(cx) {
                        return Poll::Ready(Some(Ok(Frame::data(event(&b)))));
                    }
                    *answer = Some(ready!(Pin::new(&mut p.done).poll(cx)));
                }
                // The response is in: first what the child wrote before it.
                if let Ok((b, _)) = p.notes.try_recv() {
                    return Poll::Ready(Some(Ok(Frame::data(event(&b)))));
                }
                if let Some(mut p) = parts.take() {
                    p.waiter.sent = false;
                }
                Poll::Ready(Some(match answer.take() {
                    Some(Ok(Ok((b, _)))) => Ok(Frame::data(event(&b))),
                    Some(Ok(Err(e))) if e.cause().is_empty() => Err(e.to_string().into()),
                    Some(Ok(Err(e))) => Err(e.cause().into()),
                    _ => Err("the MCP server process went away before answering".into()),
                }))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            StdioBody::Json(held) => held.is_none(),
            StdioBody::Stream { first, parts, .. } => first.is_none() && parts.is_none(),
            StdioBody::Watch { .. } => false,
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            StdioBody::Json(held) => {
                http_body::SizeHint::with_exact(held.as_ref().map_or(0, |(b, _)| b.len() as u64))
            }
            StdioBody::Stream { .. } | StdioBody::Watch { .. } => http_body::SizeHint::default(),
        }
    }
}
