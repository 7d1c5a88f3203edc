//! Talking to Epode: the API client, the Ask-once consent cache (a read-through view of what
//! Epode remembers) and the telemetry queue that delivers confirmed events in the background.

pub(crate) mod client;
pub(crate) mod consent;
pub(crate) mod telemetry;
