//! Server-sent events, streamed: the upstream's body is split into events as bytes arrive; every
//! event goes on to the client at once, as it was, except the JSON-RPC response, which a
//! rewrite may change. Dropping the resulting body (the client went away) drops the upstream's.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use futures_util::stream;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use serde_json::Value;

use crate::body::{Body, BoxError};

/// Splits a byte stream into SSE event blocks (each with its terminating blank line).
#[derive(Default)]
pub struct EventSplitter {
    buf: BytesMut,
}

impl EventSplitter {
    pub fn push(&mut self, chunk: &[u8], out: &mut VecDeque<Bytes>) {
        self.buf.extend_from_slice(chunk);
        while let Some(end) = find_event_end(&self.buf) {
            out.push_back(self.buf.split_to(end).freeze());
        }
    }

    /// Whatever is left when the stream ends (an unterminated last event).
    pub fn finish(self) -> Option<Bytes> {
        (!self.buf.is_empty()).then(|| self.buf.freeze())
    }
}

/// The end (exclusive) of the first complete event: a line terminator followed directly by
/// another. A `\r` at the very end is not decided yet (it may start `\r\n`).
fn find_event_end(buf: &[u8]) -> Option<usize> {
    let mut i = 0;
    let mut line_start = true;
    while i < buf.len() {
        let term_len = match buf[i] {
            b'\n' => 1,
            b'\r' => {
                if i + 1 == buf.len() {
                    return None;
                }
                if buf[i + 1] == b'\n' {
                    2
                } else {
                    1
                }
            }
            _ => {
                line_start = false;
                i += 1;
                continue;
            }
        };
        if line_start && i > 0 {
            return Some(i + term_len);
        }
        line_start = true;
        i += term_len;
    }
    None
}

fn lines(block: &[u8]) -> impl Iterator<Item = &[u8]> {
    block
        .split(|b| *b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
}

/// The event's data (its `data:` lines joined with `\n`), if it has any.
pub fn event_data(block: &[u8]) -> Option<String> {
    let mut data: Option<String> = None;
    for line in lines(block) {
        let Some(rest) = line.strip_prefix(b"data") else {
            continue;
        };
        let value = match rest.first() {
            None => &rest[..0],
            Some(b':') => rest[1..].strip_prefix(b" ").unwrap_or(&rest[1..]),
            Some(_) => continue, // a field such as `dataX`
        };
        let value = String::from_utf8_lossy(value);
        match &mut data {
            Some(d) => {
                d.push('\n');
                d.push_str(&value);
            }
            None => data = Some(value.into_owned()),
        }
    }
    data
}

/// The same event with its data replaced by `data` (one line; compact JSON has no newline).
pub fn replace_data(block: &[u8], data: &str) -> Bytes {
    let mut out = Vec::with_capacity(block.len() + data.len());
    let mut wrote = false;
    for line in lines(block) {
        if line.is_empty() {
            continue;
        }
        if line.starts_with(b"data:") || line == b"data" {
            if !wrote {
                out.extend_from_slice(b"data: ");
                out.extend_from_slice(data.as_bytes());
                out.push(b'\n');
                wrote = true;
            }
            continue;
        }
        out.extend_from_slice(line);
        out.push(b'\n');
    }
    out.push(b'\n');
    Bytes::from(out)
}

/// Whether a JSON-RPC message is a response (not a request or notification).
pub fn is_response(msg: &Value) -> bool {
    msg.get("method").is_none() && (msg.get("result").is_some() || msg.get("error").is_some())
}

use super::rewrite::{self, RawMap};

struct State<B, F> {
    body: B,
    splitter: EventSplitter,
    pending: VecDeque<Bytes>,
    rewrite: F,
    done: bool,
    /// The request's id, when a stream that breaks before the response should end with a
    /// JSON-RPC error for it instead of a cut-off body.
    id: Option<Box<serde_json::value::RawValue>>,
    saw_response: bool,
}

/// Reads the upstream's stream until its first event that carries data (a priming event with
/// only an id, as some servers send first, is skipped) or its end; returns the bytes read and
/// that event. Used where the HTTP status depends on the first message.
pub async fn peek_first_message<B>(upstream: &mut B) -> Result<(Bytes, Option<Bytes>), BoxError>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut read = BytesMut::new();
    let mut scanned = 0;
    loop {
        while let Some(end) = find_event_end(&read[scanned..]) {
            let block = &read[scanned..scanned + end];
            scanned += end;
            if event_data(block).is_some_and(|d| !d.trim().is_empty()) {
                let first = Bytes::copy_from_slice(block);
                return Ok((read.freeze(), Some(first)));
            }
        }
        match upstream.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    read.extend_from_slice(&data);
                }
            }
            Some(Err(e)) => return Err(e.into()),
            None => {
                let rest = Bytes::copy_from_slice(&read[scanned..]);
                let first = (!rest.is_empty()).then_some(rest);
                return Ok((read.freeze(), first));
            }
        }
    }
}

/// Streams `upstream` through, applying `rewrite` to each JSON-RPC message event. `rewrite`
/// returns whether it changed the message; an unchanged event is forwarded byte for byte.
pub fn rewrite_stream<B, F>(upstream: B, rewrite: F) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
    F: FnMut(&mut RawMap) -> bool + Send + 'static,
{
    rewrite_stream_after(Bytes::new(), upstream, None, rewrite)
}

/// As [`rewrite_stream`], for a stream whose first bytes (`read`) were already taken. With
/// `id`, a stream that fails or ends before its response event ends instead with a JSON-RPC
/// error event for that id (passed through `rewrite` like any response), never cut off.
pub fn rewrite_stream_after<B, F>(
    read: Bytes,
    upstream: B,
    id: Option<Box<serde_json::value::RawValue>>,
    rewrite: F,
) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
    F: FnMut(&mut RawMap) -> bool + Send + 'static,
{
    let mut state = State {
        body: upstream,
        splitter: EventSplitter::default(),
        pending: VecDeque::new(),
        rewrite,
        done: false,
        id,
        saw_response: false,
    };
    state.splitter.push(&read, &mut state.pending);
    let s = stream::unfold(state, |mut st| async move {
        loop {
            if let Some(block) = st.pending.pop_front() {
                let block = transform(&block, &mut st).unwrap_or(block);
                return Some((Ok::<_, BoxError>(Frame::data(block)), st));
            }
            if st.done {
                return None;
            }
            match st.body.frame().await {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => st.splitter.push(&data, &mut st.pending),
                    Err(frame) => {
                        if let Ok(trailers) = frame.into_trailers() {
                            return Some((Ok(Frame::trailers(trailers)), st));
                        }
                    }
                },
                Some(Err(e)) => {
                    st.done = true;
                    if st.saw_response {
                        // The answer is delivered; what broke after it does not matter.
                        return None;
                    }
                    let e: BoxError = e.into();
                    match broken_event(&mut st, &format!("the event stream broke off ({e})")) {
                        Some(event) => return Some((Ok(Frame::data(event)), st)),
                        None => return Some((Err(e), st)),
                    }
                }
                None => {
                    st.done = true;
                    let rest = std::mem::take(&mut st.splitter).finish();
                    st.pending.extend(rest);
                    if !st.saw_response {
                        // Decided after the tail is scanned: it may hold the response.
                        st.pending.push_back(Bytes::new());
                    }
                }
            }
        }
    });
    StreamBody::new(s).boxed_unsync()
}

/// The error event that ends a stream broken before its response (when the id is known).
fn broken_event<B, F: FnMut(&mut RawMap) -> bool>(
    st: &mut State<B, F>,
    why: &str,
) -> Option<Bytes> {
    let id = st.id.take()?;
    st.saw_response = true;
    let error = crate::error::ProxyError::UpstreamFailed(format!(
        "{why}, before the response; the request may be sent again"
    ));
    let body = crate::error::error_body(Some(&id), error.code(), &error.to_string());
    let mut msg = rewrite::parse_message(&body)?;
    (st.rewrite)(&mut msg);
    let out = rewrite::to_bytes(&msg);
    let mut event = b"event: message\ndata: ".to_vec();
    event.extend_from_slice(&out);
    event.extend_from_slice(b"\n\n");
    Some(Bytes::from(event))
}

fn transform<B, F: FnMut(&mut RawMap) -> bool>(
    block: &Bytes,
    st: &mut State<B, F>,
) -> Option<Bytes> {
    if block.is_empty() {
        // The end-of-stream marker: the stream ended without a response.
        if st.saw_response {
            return None;
        }
        return Some(broken_event(st, "the event stream ended").unwrap_or_default());
    }
    let data = event_data(block)?;
    let mut msg = rewrite::parse_message(data.as_bytes())?;
    st.saw_response |= rewrite::is_response(&msg);
    if !(st.rewrite)(&mut msg) {
        return None;
    }
    let out = rewrite::to_bytes(&msg);
    Some(replace_data(block, &String::from_utf8_lossy(&out)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(chunks: &[&[u8]]) -> Vec<Bytes> {
        let mut s = EventSplitter::default();
        let mut out = VecDeque::new();
        for c in chunks {
            s.push(c, &mut out);
        }
        out.extend(s.finish());
        out.into_iter().collect()
    }

    #[test]
    fn splits_across_chunks_and_line_endings() {
        let ev = split(&[
            b"event: message\ndata: {\"a\":1}\n",
            b"\nevent: message\r\ndata: 2\r",
            b"\n\r\n: ping\n\n",
        ]);
        assert_eq!(ev.len(), 3);
        assert_eq!(&ev[0][..], b"event: message\ndata: {\"a\":1}\n\n");
        assert_eq!(event_data(&ev[1]).as_deref(), Some("2"));
        assert_eq!(event_data(&ev[2]), None);
        // Multi-line data joins with \n; an unterminated tail is still delivered.
        let ev = split(&[b"data: a\ndata: b\n\ndata: tail"]);
        assert_eq!(event_data(&ev[0]).as_deref(), Some("a\nb"));
        assert_eq!(&ev[1][..], b"data: tail");
    }

    #[test]
    fn replaces_only_data() {
        let out = replace_data(b"event: message\nid: 7\ndata: {\"x\":1}\n\n", "{\"y\":2}");
        assert_eq!(&out[..], b"event: message\nid: 7\ndata: {\"y\":2}\n\n");
    }

    #[tokio::test]
    async fn stream_rewrites_only_the_response() {
        let body = http_body_util::Full::new(Bytes::from_static(
            b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n",
        ));
        let out = rewrite_stream(body, |m: &mut RawMap| {
            if !rewrite::is_response(m) {
                return false;
            }
            m.insert(
                "result".into(),
                rewrite::raw(&serde_json::json!({"resultType": "complete"})),
            );
            true
        });
        let bytes = out.collect().await.unwrap().to_bytes();
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        assert!(text.starts_with("event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n"));
        assert!(
            text.ends_with(
                "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"resultType\":\"complete\"}}\n\n"
            ),
            "{text}"
        );
    }

    #[tokio::test]
    async fn peek_skips_a_priming_event() {
        let mut body = http_body_util::Full::new(Bytes::from_static(
            b"id: abc\ndata: \n\nevent: message\ndata: {\"id\":1,\"error\":{\"code\":-32601}}\n\nrest",
        ));
        let (read, first) = peek_first_message(&mut body).await.unwrap();
        assert!(read.ends_with(b"rest"));
        assert_eq!(
            event_data(&first.unwrap()).as_deref(),
            Some("{\"id\":1,\"error\":{\"code\":-32601}}")
        );
    }
}
