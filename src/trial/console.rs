//! The live console of the local trial: `/_dev/` is one static page (no build step, no
//! external assets) and `/_dev/events` an SSE stream of what the bus publishes, the recent
//! history first. A stream ends when the sidecar stops; one that falls behind skips ahead.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http::{header, HeaderValue, Method, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt as _, StreamBody};
use tokio::sync::broadcast::error::RecvError;

use super::bus::Bus;
use crate::body::{self, Body, BoxError};
use crate::server::Mounted;

const PAGE: &str = include_str!("console.html");
/// Where the page's script puts the origin it was loaded from.
const ORIGIN: &str = "__ORIGIN__";
/// A comment line on an idle stream, so proxies and browsers keep it open.
const KEEPALIVE: Duration = Duration::from_secs(15);

/// The console, mounted on the MCP listener under `/_dev`.
pub(crate) struct Console(pub(crate) Arc<Bus>);

impl Mounted for Console {
    fn prefix(&self) -> &str {
        "/_dev"
    }

    fn route(&self, method: &Method, path: &str) -> Option<Response<Body>> {
        route(&self.0, method, path)
    }
}

/// The console's routes: `Some` answer for a path under `/_dev/`.
fn route(bus: &Arc<Bus>, method: &Method, path: &str) -> Option<Response<Body>> {
    let resp = match (method, path) {
        (&Method::GET, "/_dev" | "/_dev/") => page(bus.mcp_path(), bus.bearer()),
        (&Method::GET, "/_dev/events") => events(bus),
        (_, p) if p == "/_dev" || p.starts_with("/_dev/") => body::error(
            StatusCode::NOT_FOUND,
            "the console is GET /_dev/ (and its stream GET /_dev/events)",
        ),
        _ => return None,
    };
    Some(resp)
}

/// One command that calls the sidecar at `endpoint` as a 2026 MCP client would: `tools/list`,
/// which every server answers (the terminal and the empty console show it); with `bearer`
/// (authorization on) it sends the token in `$TOKEN`.
pub(super) fn try_command(endpoint: &str, bearer: bool) -> String {
    format!(
        "curl -s {endpoint} -H 'content-type: application/json' -H 'accept: application/json, text/event-stream' -H 'mcp-protocol-version: 2026-07-28' -H 'mcp-method: tools/list'{auth} -d '{body}'",
        auth = if bearer { r#" -H "authorization: Bearer $TOKEN""# } else { "" },
        body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#
    )
}

/// Text for an HTML element's content or a double-quoted attribute.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The page, with the MCP endpoint and the command to try filled in (the page's script puts
/// its own origin in place of [`ORIGIN`]).
fn page(mcp_path: &str, bearer: bool) -> Response<Body> {
    let endpoint = format!("{ORIGIN}{mcp_path}");
    let filled = PAGE
        .replace("__ENDPOINT__", &escape(&endpoint))
        .replace("__TRY__", &escape(&try_command(&endpoint, bearer)));
    let html = Some("text/html; charset=utf-8");
    let mut resp = body::answer(StatusCode::OK, html, body::full(filled));
    let h = resp.headers_mut();
    // The page and its script are this file alone.
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'",
        ),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

fn frame(event: &str) -> Result<Frame<Bytes>, BoxError> {
    Ok(Frame::data(Bytes::from(format!("data: {event}\n\n"))))
}

fn events(bus: &Arc<Bus>) -> Response<Body> {
    let (history, live) = bus.follow();
    let closed = bus.closed();
    let past = stream::iter(history.into_iter().map(|e| frame(&e)));
    let next = stream::unfold((live, closed), |(mut live, mut closed)| async move {
        loop {
            let got = tokio::select! {
                got = live.recv() => Some(got),
                _ = closed.wait_for(|c| *c) => return None,
                () = tokio::time::sleep(KEEPALIVE) => None,
            };
            match got {
                None => {
                    let ping = Ok(Frame::data(Bytes::from_static(b": keep-alive\n\n")));
                    return Some((ping, (live, closed)));
                }
                Some(Ok(e)) => return Some((frame(&e), (live, closed))),
                Some(Err(RecvError::Lagged(_))) => continue,
                Some(Err(RecvError::Closed)) => return None,
            }
        }
    });
    let stream = futures_util::StreamExt::chain(past, next);
    let sse = Some("text/event-stream");
    let mut resp = body::answer(StatusCode::OK, sse, StreamBody::new(stream).boxed_unsync());
    let h = resp.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}
