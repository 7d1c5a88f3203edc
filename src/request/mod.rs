//! Every request's one front and one record, for the MCP path and the HTTP surface alike.
//!
//! - The front ([`Front::admit`]) runs every route's checks in one order: the head (the MCP
//!   path's Host, Origin, method and `Content-Type`; the surface's Host), the client's rate,
//!   the requests in flight, the body (within its size and the memory budget), the caller's
//!   token; then it decides the caller (`crate::caller`), once. Each refusal is made there,
//!   in the route's own words (a JSON-RPC error on the MCP path, a plain message on the
//!   surface). The scopes a request needs are checked by the route once it has read what the
//!   request is for (the MCP message's tool, prompt or resource).
//! - The record ([`Record`]) follows a request from its arrival and ends it once, after its
//!   body (a stream's at its end, any other's at once): its counters and duration, its
//!   access line, its span, its console entry and, on the MCP path, the end of its telemetry
//!   event. A refusal's span (a client that sent a trace context) is made there too, within
//!   a bound ([`crate::otel::Otel::may_span_refusal`]).
//!
//! A new per-request observation is a field of the record and a line of its end; a new
//! check, a step of the front.

mod front;
mod record;

pub(crate) use self::front::{plain, plain_refusal, Admitted, Front, Surface};
pub(crate) use self::record::{HttpOutcome, Record, Recorder};
