//! epode-sidecar: a reverse proxy that sits beside an MCP server and gives it a stateless MCP
//! 2026-07-28 front and the Epode agent-feedback binding.
//!
//! The request path, in the order a request travels it: `server` (listeners, workers, routes)
//! → `frontdoor` (head, body, message, era ladder) → `dispatch` (the method table) →
//! `upstream` (the hop, in the upstream's era) → back through `mcp::rewrite` with the
//! `binding`'s hooks. Beside the MCP path, `surface` (the HTTP surface: the product's other
//! routes, proxied and instrumented). Below them: `feedback` (the protocol's pure pieces), `epode` (the Epode
//! API, the consent cache, the telemetry queue), `mcp` (the wire), `config`, `error`, `body`;
//! `listener` (how every listener runs), `observe` (what the request path shows whoever
//! watches), `gate` (counted places). `trial` (`--dev`) is reached only from `cli`. The
//! imports form no cycle, between modules or between files (`scripts/module-graph.py` and its
//! `--files` check).

// No function in src/ over 80 lines, unit tests included (clippy.toml sets the threshold).
#![warn(clippy::too_many_lines)]

mod auth;
mod binding;
mod body;
mod budget;
mod caller;
mod cli;
mod config;
mod dispatch;
mod epode;
mod error;
mod feedback;
mod frontdoor;
mod gate;
mod healthcheck;
mod ledger;
mod limits;
mod listener;
mod log_summary;
mod mcp;
mod metrics;
mod observe;
mod otel;
mod replica;
mod request;
mod server;
mod surface;
mod tls;
mod trial;
mod upstream;

pub use cli::{is_stdio_trampoline, main};

#[doc(hidden)]
pub mod fuzzing;
