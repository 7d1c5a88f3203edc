//! The Epode binding at run time: the pure pieces of `feedback` joined with the Epode client,
//! the consent cache, the telemetry queue and the tool catalog. The dispatch table asks it
//! for a hook per `tools/list` and `tools/call` response (`hooks`), and hands it the two
//! feedback tools' calls; the HTTP surface asks it for an HTTP response's envelope
//! (`http_surface`). `feedback_binding` is the binding itself, whose fields only it touches;
//! `catalog` is what it knows of the upstream's tools; `customer`, Epode's customer-context
//! binding (the enrichment request after a product call, and its two tools); `tasks`, the tasks (the 2026 tasks
//! extension) it follows to their outcome; `upstream_epode`, whether the upstream carries
//! Epode itself (then it steps back).

mod catalog;
mod customer;
mod feedback_binding;
mod hooks;
mod http_surface;
mod issued;
mod tasks;
mod upstream_epode;

pub(crate) use self::customer::CustomerContext;
pub(crate) use self::feedback_binding::FeedbackBinding;
pub(crate) use self::http_surface::HttpEnvelope;
