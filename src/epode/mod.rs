//! Talking to Epode: the HTTP client for the agent-side calls (consent decisions, reports,
//! consent state) and the telemetry queue that delivers confirmed events in the background.

pub mod client;
pub mod telemetry;

pub use client::{EpodeClient, EpodeError};
