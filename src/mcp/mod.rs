//! JSON-RPC and MCP wire pieces: reading just enough of a message to route it, the routing
//! headers, era classification and validation, SSE framing, and result rewriting.

pub mod classify;
pub mod headers;
pub mod message;
pub mod rewrite;
pub mod sse;
pub mod version;
