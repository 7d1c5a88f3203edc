//! Telemetry: one event per completed product tool call (confirmed MCP) or instrumented HTTP
//! response (unclassified, `http_json`/`http_html`/`http_headers`), numbered (`sequence`)
//! and enqueued without waiting (a product response never waits for Epode) on a bounded
//! channel. One dispatcher task forms batches of up to `batch_max` (sent as soon as one is
//! full, or `flush_every` after its first event) and starts a delivery task for each, as many
//! in flight as the adaptive limit of [`limit`] allows (at most `concurrency`). A delivery is
//! judged by its receipt; only network failures, timeouts, 408, 429 and 5xx are retried, with
//! exponential backoff (`backon`) or the `Retry-After` Epode gives, which also holds back every
//! other delivery. Epode orders interactions by `(occurredAt, sequence)` and upserts each event
//! by its id, so batches may arrive in any order and a duplicate is harmless.
//!
//! The parts, each importing only those before it: [`event`] (a completion made an event),
//! [`receipt`] (judging Epode's answer), [`limit`] (how many deliveries may be in flight),
//! [`customers`] (which batches may be in flight together), [`counters`] (what operators see),
//! [`shared`] (the settings and what the dispatcher and deliveries share), [`delivery`]
//! (sending a batch, retrying), [`queue`] (the handle and the dispatcher that forms batches).
//! Only what the rest of the crate uses is re-exported here.

mod counters;
mod customers;
mod delivery;
mod event;
mod limit;
mod observation;
mod queue;
mod receipt;
mod shared;

pub(crate) use counters::Counters;
pub(crate) use event::{valid_operation, HttpCompletion, McpCompletion, Outcome, Surface};
pub(crate) use observation::RequestObservation;
pub(crate) use queue::Telemetry;
pub(crate) use shared::QueueSettings;
