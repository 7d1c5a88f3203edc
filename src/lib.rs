//! epode-sidecar: a reverse proxy that sits beside an MCP server and gives it a stateless MCP
//! 2026-07-28 front and the Epode agent-feedback binding. The request path, in the order a
//! request travels it: `server` (listener) → `proxy` (routing) → `frontdoor` (checks) →
//! `upstream` (the hop) → back through `proxy`.

pub mod body;
pub mod config;
pub mod epode;
pub mod error;
pub mod feedback;
pub mod frontdoor;
pub mod log_summary;
pub mod mcp;
pub mod proxy;
pub mod server;
pub mod upstream;
