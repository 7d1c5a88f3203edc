//! The integration tests, in one binary (the support code and the fake Epode compile once).
//! Each module is one area, black box: the sidecar binary is started as a user would start it,
//! against real peers (the Python `mcp` SDK, the official TypeScript client, the conformance
//! suite) and the strict fake Epode in `support`. Run one area with
//! `cargo test --test it -- stdio::` (or `bash scripts/test.sh -- stdio::`).

mod support;

mod auth;
mod auth_clients;
mod auth_server;
mod bridge;
mod callers;
mod cli;
mod conformance;
mod customer_context;
mod deploy;
mod dev;
mod edges;
mod eras;
mod extensions;
mod fake_epode_selftest;
mod feedback;
mod front_door;
mod hop;
mod http_surface;
mod isolation;
mod ledger;
mod limits;
mod listeners;
mod operations;
mod operations_kit;
mod otel;
mod questions;
mod rate_limits;
mod replicas;
mod secrets;
mod shutdown;
mod soak;
mod stdio;
mod subscriptions;
mod targets;
mod telemetry;
mod tls;
mod transparency;
mod upstream_epode;
