//! Reaching the upstream MCP server.

pub mod http;

pub use self::http::HttpUpstream;
