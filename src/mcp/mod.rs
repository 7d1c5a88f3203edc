//! The MCP wire, and nothing else: protocol versions and the per-request envelope keys, the
//! method catalogue, the routing headers, reading a client message, raw JSON maps, SSE framing, rewriting a
//! result for the client's era, and the one end of every request. No I/O, no policy.

pub(crate) mod end;
pub(crate) mod era;
pub(crate) mod headers;
pub(crate) mod message;
pub(crate) mod method;
pub(crate) mod raw;
pub(crate) mod rewrite;
pub(crate) mod sse;
pub(crate) mod version;
