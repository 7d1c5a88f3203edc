//! Delivery to the collector, off the request path: a finished span goes into a bounded
//! queue (`try_send`, never waited for; a full queue drops it, counted), and one task on the
//! main loop sends the queue in batches through the official OTLP exporter, each export
//! within its timeout; metrics are collected and sent by the same kind of task at their
//! interval. Failures are counted and logged as summaries, never one line per failure.
//!
//! A metrics export is one OTLP request: the SDK's collection written by OTLP's own transform
//! (`opentelemetry-proto`, what the official exporter uses), and the `/metrics` families
//! (`mirror.rs`) as a second scope of the same resource. The official metric exporter takes
//! only the SDK's data, whose types cannot be made outside the SDK, so the request is encoded
//! here and posted through the same client as the spans.
//!
//! The SDK's own `BatchSpanProcessor` runs its own thread and reports the spans it drops only
//! in its internal log at shutdown; this queue is the one piece written here, so the drops are
//! a metric an operator can alert on and delivery shares the main loop's reqwest client.

use std::sync::{Arc, Weak};
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::reader::MetricReader;
use opentelemetry_sdk::metrics::{InstrumentKind, ManualReader, Pipeline, Temporality};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use tokio::sync::{mpsc, watch};

use crate::log_summary::LogSummary;
use crate::metrics::{Metrics, SignalLabels};

/// Spans sent in one export at most.
const MAX_BATCH: usize = 512;
/// How long the first span of a batch waits for others.
const BATCH_DELAY: Duration = Duration::from_millis(500);

pub(super) const TRACES: SignalLabels = SignalLabels { signal: "traces" };
pub(super) const METRICS: SignalLabels = SignalLabels { signal: "metrics" };

/// The tracer provider's one processor: the bounded queue's sending end.
pub(super) struct SpanQueue {
    tx: mpsc::Sender<SpanData>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for SpanQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpanQueue")
            .field("capacity", &self.tx.max_capacity())
            .finish()
    }
}

/// How full the span queue is, read without holding it open.
pub(super) struct QueueRoom {
    tx: mpsc::WeakSender<SpanData>,
    capacity: usize,
}

impl QueueRoom {
    /// Whether at most half of the queue is taken.
    pub(super) fn half_free(&self) -> bool {
        self.tx
            .upgrade()
            .is_some_and(|tx| tx.capacity() * 2 >= self.capacity)
    }
}

impl SpanQueue {
    /// What tells how full the queue is.
    pub(super) fn room(&self) -> QueueRoom {
        QueueRoom {
            tx: self.tx.downgrade(),
            capacity: self.tx.max_capacity(),
        }
    }

    pub(super) fn new(
        capacity: usize,
        metrics: Arc<Metrics>,
    ) -> (SpanQueue, mpsc::Receiver<SpanData>) {
        let (tx, rx) = mpsc::channel(capacity);
        (SpanQueue { tx, metrics }, rx)
    }
}

impl SpanProcessor for SpanQueue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if self.tx.try_send(span).is_err() {
            self.metrics.otlp.dropped.get_or_create(&TRACES).inc();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// What one export came to, for the counters and the summary line.
fn counted(
    metrics: &Metrics,
    signal: &SignalLabels,
    failures: &LogSummary,
    n: u64,
    outcome: Result<OTelSdkResult, tokio::time::error::Elapsed>,
) {
    let reason = match outcome {
        Ok(Ok(())) => {
            metrics.otlp.exported.get_or_create(signal).inc_by(n);
            return;
        }
        Ok(Err(e)) => {
            tracing::debug!(signal = signal.signal, error = %e, "OTLP export failed");
            "refused or unreachable"
        }
        Err(_) => "timed out",
    };
    metrics.otlp.failed.get_or_create(signal).inc();
    if signal.signal == TRACES.signal {
        metrics.otlp.dropped.get_or_create(signal).inc_by(n);
    }
    failures.add(reason, 1);
}

/// Sends the queued spans until `stop` turns true, then what is left, once, within `timeout`.
pub(super) async fn ship_spans<E: SpanExporter>(
    mut rx: mpsc::Receiver<SpanData>,
    exporter: E,
    metrics: Arc<Metrics>,
    timeout: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let failures = LogSummary::new("OTLP span exports failed", Duration::from_secs(60));
    let mut batch = Vec::with_capacity(MAX_BATCH);
    loop {
        let first = tokio::select! {
            s = rx.recv() => s,
            _ = stop.wait_for(|s| *s) => None,
        };
        let Some(first) = first else { break };
        batch.push(first);
        let gather = tokio::time::sleep(BATCH_DELAY);
        tokio::pin!(gather);
        while batch.len() < MAX_BATCH {
            tokio::select! {
                s = rx.recv() => match s {
                    Some(s) => batch.push(s),
                    None => break,
                },
                () = &mut gather => break,
                _ = stop.wait_for(|s| *s) => break,
            }
        }
        let n = batch.len() as u64;
        let sent = tokio::time::timeout(timeout, exporter.export(std::mem::take(&mut batch))).await;
        counted(&metrics, &TRACES, &failures, n, sent);
        failures.flush_if_due();
    }
    // Shutdown: what is queued goes in one last export, within the same timeout.
    while let Ok(s) = rx.try_recv() {
        batch.push(s);
    }
    if !batch.is_empty() {
        let n = batch.len() as u64;
        let sent = tokio::time::timeout(timeout, exporter.export(batch)).await;
        counted(&metrics, &TRACES, &failures, n, sent);
    }
    failures.flush();
}

/// The meter provider's reader, shared with the task that collects from it.
#[derive(Debug, Clone)]
pub(super) struct SharedReader(pub(super) Arc<ManualReader>);

impl MetricReader for SharedReader {
    fn register_pipeline(&self, pipeline: Weak<Pipeline>) {
        self.0.register_pipeline(pipeline);
    }

    fn collect(&self, rm: &mut ResourceMetrics) -> OTelSdkResult {
        self.0.collect(rm)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn temporality(&self, kind: InstrumentKind) -> Temporality {
        self.0.temporality(kind)
    }
}

/// What one metrics export sends, and where: the SDK's instruments (the conventions'
/// histograms) and, with `families`, the `/metrics` families, in one OTLP request.
pub(super) struct MetricsExport {
    pub(super) reader: SharedReader,
    pub(super) client: super::http::Client,
    /// `<endpoint>/v1/metrics`.
    pub(super) url: http::Uri,
    /// `OTEL_EXPORTER_OTLP_HEADERS`, with the content type.
    pub(super) headers: http::HeaderMap,
    /// Reads the gauges that are read when shown, then the families are taken from
    /// `metrics`; `None`: the conventions' histograms only.
    pub(super) families: Option<Box<dyn Fn() + Send + Sync>>,
}

impl MetricsExport {
    /// The request: the SDK's collection as OTLP's own transform writes it, the families as
    /// one more scope of the same resource.
    fn request(&self, metrics: &Metrics) -> Option<Vec<u8>> {
        let mut rm = ResourceMetrics::default();
        self.reader.collect(&mut rm).ok()?;
        let mut request = ExportMetricsServiceRequest::from(&rm);
        if let (Some(read_gauges), Some(resource)) =
            (&self.families, request.resource_metrics.first_mut())
        {
            read_gauges();
            if let Some(set) = metrics.snapshot() {
                let now = super::mirror::unix_nanos(std::time::SystemTime::now());
                let start = super::mirror::unix_nanos(metrics.created());
                resource
                    .scope_metrics
                    .push(super::mirror::scope_metrics(set, start, now));
            }
        }
        Some(prost::Message::encode_to_vec(&request))
    }

    /// Sends `body`; a status other than 2xx is a failure.
    async fn send(&self, body: Vec<u8>) -> OTelSdkResult {
        let mut request = http::Request::new(bytes::Bytes::from(body));
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = self.url.clone();
        *request.headers_mut() = self.headers.clone();
        let answer = opentelemetry_http::HttpClient::send_bytes(&self.client, request)
            .await
            .map_err(|e| OTelSdkError::InternalFailure(e.to_string()))?;
        if answer.status().is_success() {
            Ok(())
        } else {
            Err(OTelSdkError::InternalFailure(format!(
                "the collector answered {}",
                answer.status()
            )))
        }
    }
}

/// Collects and sends the metrics every `every` until `stop`, then once more.
pub(super) async fn ship_metrics(
    export: MetricsExport,
    metrics: Arc<Metrics>,
    every: Duration,
    timeout: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let failures = LogSummary::new("OTLP metric exports failed", Duration::from_secs(60));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        let last = tokio::select! {
            _ = tick.tick() => false,
            _ = stop.wait_for(|s| *s) => true,
        };
        if let Some(body) = export.request(&metrics) {
            let sent = tokio::time::timeout(timeout, export.send(body)).await;
            counted(&metrics, &METRICS, &failures, 1, sent);
        }
        failures.flush_if_due();
        if last {
            break;
        }
    }
    failures.flush();
}
