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
//! The parts: [`event`] (a completion made an event), [`queue`] (the handle, the counters and
//! the dispatcher that forms batches), [`customers`] (which batches may be in flight together),
//! [`limit`] (how many), [`delivery`] (sending a batch, retrying), [`receipt`] (judging Epode's
//! answer). Only what the rest of the crate uses is re-exported here.

mod customers;
mod delivery;
mod event;
mod limit;
mod queue;
mod receipt;

pub(crate) use event::{valid_operation, HttpCompletion, McpCompletion, Outcome, Surface};
pub(crate) use queue::{Counters, QueueSettings, Telemetry};
