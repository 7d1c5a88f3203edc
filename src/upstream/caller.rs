//! A client's request as the upstream hop sees it: its headers (credentials and all), its
//! caller (decided once at the front: `crate::caller`) and, for a 2026 request, its
//! `params._meta`. And whether the client may be sent the server's own requests
//! (`ServerRequests`), which the hop and the stdio child both read.

use http::HeaderMap;

pub(crate) use crate::caller::Caller;

/// A client's request as the upstream hop sees it: its headers (credentials and all) and who
/// sent it. Reads as the headers wherever only they matter.
#[derive(Clone, Copy)]
pub(crate) struct Client<'a> {
    pub(crate) headers: &'a HeaderMap,
    pub(crate) caller: Caller,
    /// A 2026 request's `params._meta` (its declared capabilities are read from it only
    /// where they are needed: the handshake of a 2025 session).
    pub(crate) meta: Option<&'a serde_json::value::RawValue>,
}

impl<'a> Client<'a> {
    pub(crate) fn new(headers: &'a HeaderMap, caller: Caller) -> Self {
        Client {
            headers,
            caller,
            meta: None,
        }
    }

    /// The capabilities a 2026 request declares in its envelope.
    pub(crate) fn declared_capabilities(&self) -> Option<Box<serde_json::value::RawValue>> {
        #[derive(serde::Deserialize)]
        struct Envelope<'m> {
            #[serde(borrow, rename = "io.modelcontextprotocol/clientCapabilities")]
            caps: Option<&'m serde_json::value::RawValue>,
        }
        let meta = serde_json::from_str::<Envelope<'_>>(self.meta?.get()).ok()?;
        meta.caps.map(ToOwned::to_owned)
    }
}

impl std::ops::Deref for Client<'_> {
    type Target = HeaderMap;

    fn deref(&self) -> &HeaderMap {
        self.headers
    }
}

/// Whether the server's own requests (elicitation, sampling, roots) made while answering a
/// message may go to the client that sent it: only a 2025 client (or a client's own answer or
/// cancellation) can take them; the sidecar's own requests and a 2026 client's cannot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ServerRequests {
    Relayed,
    /// Asked of a 2026 client as `input_required` (the SSE reader takes them off the stream).
    Bridged,
    Withheld,
}
