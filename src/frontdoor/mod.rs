//! The front door: everything a message to the MCP path passes before the dispatch table sees
//! it, in the order it is checked. The head (Host, Origin, method, `Content-Type`; a CORS
//! preflight is answered here, `cors`), the body (size), the
//! message (well-formed JSON-RPC, one message, no duplicated routing keys), and for a 2026
//! request the validation ladder. What comes out is a [`Request`] whose era is known and whose
//! headers agree with its body; everything refused gets its status and JSON-RPC error here.
//! One head check runs for every route the sidecar serves, before any is chosen: the
//! request's authority ([`check_authority`]: one well-formed `Host`, RFC 9112).

mod checks;
pub(crate) mod cors;
mod ladder;

use bytes::Bytes;
use http::request::Parts;
use http::Method;
use serde_json::value::RawValue;

pub(crate) use self::checks::{check_authority, check_host, read_body};
use crate::config::Config;
use crate::error::{Error, ErrorKind};
use crate::mcp::era::Era;
use crate::mcp::message::{self, Inbound, RpcMessage};
use crate::mcp::method;

/// A validated request: its era is known and its routing headers agree with its body.
pub(crate) struct Request<'a> {
    pub(crate) parts: &'a Parts,
    /// The body exactly as the client sent it.
    pub(crate) bytes: &'a Bytes,
    pub(crate) id: &'a RawValue,
    pub(crate) rpc: RpcMessage<'a>,
    pub(crate) era: Era,
    /// Its catalogue entry, looked up once; `None` for a method the sidecar does not know.
    pub(crate) listed: Option<method::Method>,
    /// Who its verified token says is calling (the authorization front door's; `None` with
    /// auth off).
    pub(crate) principal: Option<std::sync::Arc<crate::auth::Principal>>,
}

impl Request<'_> {
    pub(crate) fn method(&self) -> &str {
        self.rpc.method.as_deref().unwrap_or_default()
    }
}

/// Host and Origin (DNS-rebinding protection), for every page the sidecar serves.
pub(crate) fn check_host_and_origin(config: &Config, parts: &Parts) -> Result<(), Error> {
    checks::check_host(&config.allowed_hosts, parts)?;
    checks::check_origin(&config.allowed_origins, &parts.headers)
}

/// The head checks: Host, Origin, POST only, and a JSON body (415 otherwise, before anything
/// runs: a POST a web page can send without a preflight never has that type).
pub(crate) fn check_head(config: &Config, parts: &Parts) -> Result<(), Error> {
    check_host_and_origin(config, parts)?;
    if parts.method != Method::POST {
        return Err(Error::new(
            ErrorKind::MethodNotAllowed,
            format!(
                "{} is not served: this MCP endpoint is stateless; POST one JSON-RPC message per request",
                parts.method
            ),
        ));
    }
    checks::check_content_type(&parts.headers)
}

/// Reads and validates the message in `bytes`: the request, or `None` for a notification
/// (or a 2025 client's response to a server request), which is accepted with 202 since a
/// stateless front has nothing to do with it. A refusal carries the message's id when it
/// could be read.
pub(crate) fn admit<'a>(
    parts: &'a Parts,
    bytes: &'a Bytes,
) -> Result<Option<Request<'a>>, (Error, Option<&'a RawValue>)> {
    let rpc = match message::parse(bytes)? {
        Inbound::Single(rpc) => rpc,
        Inbound::Batch => {
            return Err((
                Error::new(
                    ErrorKind::InvalidRequest,
                    "JSON-RPC batches are not supported; send one message per POST",
                ),
                None,
            ))
        }
    };
    if rpc.method.is_none() {
        // A 2025-era client may post a response to a server request; with no sessions there
        // is nothing it can answer, so it is accepted and dropped.
        return Ok(None);
    }
    let listed = rpc.method.as_deref().and_then(method::Method::from_wire);
    let era = ladder::classify(&parts.headers, &rpc, listed).map_err(|e| (e, rpc.id))?;
    let Some(id) = rpc.id else {
        // 2026 defines no client notifications over HTTP; 2025's (initialized, cancelled)
        // mean nothing to a stateless front.
        return Ok(None);
    };
    Ok(Some(Request {
        parts,
        bytes,
        id,
        rpc,
        era,
        listed,
        principal: None,
    }))
}
