//! What the spans of a request share with the handle that built them: the tracer, the
//! duration histograms (when metrics are on), and where the upstream hop goes.

use opentelemetry::metrics::Histogram;
use opentelemetry_sdk::trace::SdkTracer;

/// Where the upstream hop goes, as its client span says.
pub(super) struct HopTarget {
    /// `tcp` for HTTP, `pipe` for a stdio child.
    pub(super) transport: &'static str,
    pub(super) address: Option<String>,
    pub(super) port: Option<i64>,
}

pub(super) struct Shared {
    pub(super) tracer: SdkTracer,
    pub(super) server_duration: Option<Histogram<f64>>,
    pub(super) client_duration: Option<Histogram<f64>>,
    pub(super) hop: HopTarget,
}
