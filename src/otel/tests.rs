//! What a request pays for OpenTelemetry on the request path (`cost_per_request`, run by hand
//! in release: `cargo test --release --lib otel::tests -- --ignored --nocapture`), and the
//! pieces' rules.

use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use ::http::HeaderMap;
use bytes::Bytes;
use serde_json::value::RawValue;

use super::*;
use crate::config::{OtelConfig, Sampling, UpstreamTarget, UpstreamTransport};
use crate::upstream::translate;

fn config(sampling: Sampling) -> OtelConfig {
    config_with(sampling, Some(Duration::from_secs(3600)))
}

fn config_with(sampling: Sampling, metrics_every: Option<Duration>) -> OtelConfig {
    OtelConfig {
        // Nothing listens there: the spans are queued, then dropped; the request path's cost
        // is what is measured.
        endpoint: None,
        traces_url: url::Url::parse("http://127.0.0.1:9/v1/traces").unwrap(),
        metrics_url: Some(url::Url::parse("http://127.0.0.1:9/v1/metrics").unwrap()),
        queue: 2048,
        timeout: Duration::from_millis(100),
        metrics_every,
        metrics_families: true,
        headers: Vec::new(),
        service_name: None,
        resource: Vec::new(),
        sampling,
        ca_file: None,
    }
}

/// OpenTelemetry started with `config` for the stdio upstream, no gauges to read.
fn started(config: &OtelConfig, metrics: &Arc<Metrics>) -> Arc<Otel> {
    Otel::start(config, &upstream(), metrics.clone(), Box::new(|| {})).unwrap()
}

fn upstream() -> UpstreamTransport {
    let url = url::Url::parse("http://127.0.0.1:8000/mcp").unwrap();
    UpstreamTransport::Http(UpstreamTarget {
        authority: "127.0.0.1:8000".into(),
        url,
    })
}

const BODY: &str = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"bench","version":"0"}}}}"#;

fn call<'a>(headers: &'a HeaderMap, id: &'a RawValue, meta: Option<&'a RawValue>) -> Call<'a> {
    Call {
        method: "tools/call",
        listed: Some(crate::mcp::method::Method::ToolsCall),
        name: Some("echo"),
        tool_listed: true,
        uri: None,
        id,
        protocol_version: "2026-07-28",
        headers,
        meta,
        peer: SocketAddr::from(([127, 0, 0, 1], 40000)),
        http_version: ::http::Version::HTTP_11,
        started: SystemTime::now(),
    }
}

/// One request's OpenTelemetry work, as the request path does it.
fn one(otel: &Otel, headers: &HeaderMap, body: &Bytes, id: &RawValue, meta: Option<&RawValue>) {
    let server = otel.server_span(&call(headers, id, meta));
    let hop = otel.hop_span(&server);
    let (h, b) = translate::with_trace_fields_at(headers, body, &hop.fields().0, meta, None);
    std::hint::black_box((&h, &b));
    hop.end(200, None);
    server.end(200, None, &[]);
}

/// The measured request: no headers, [`BODY`], its id.
fn request() -> (HeaderMap, Bytes, Box<RawValue>) {
    (
        HeaderMap::new(),
        Bytes::from_static(BODY.as_bytes()),
        RawValue::from_string("7".into()).unwrap(),
    )
}

/// The body's `params._meta`, as the front door finds it.
fn meta_of(body: &Bytes) -> Option<&RawValue> {
    match crate::mcp::message::parse(body) {
        Ok(crate::mcp::message::Inbound::Single(msg)) => msg.params.meta,
        _ => panic!("the body parses"),
    }
}

fn per_request(n: u32, f: impl Fn()) -> Duration {
    for _ in 0..n / 10 {
        f();
    }
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed() / n
}

#[tokio::test(flavor = "current_thread")]
#[ignore = "a measurement: run it by hand in release"]
async fn cost_per_request() {
    let metrics = Arc::new(Metrics::new(|_| {}));
    let (headers, body, id) = request();
    let meta = meta_of(&body);
    let n = 200_000;
    let off = per_request(n, || {
        let (h, b) = translate::with_traceparent(&headers, &body);
        std::hint::black_box((&h, &b));
    });
    let unsampled = started(&config(Sampling::AlwaysOff), &metrics);
    let not_sampled = per_request(n, || one(&unsampled, &headers, &body, &id, meta));
    let sampled_otel = started(&config(Sampling::AlwaysOn), &metrics);
    let sampled = per_request(n / 4, || one(&sampled_otel, &headers, &body, &id, meta));
    let no_metrics = started(&config_with(Sampling::AlwaysOff, None), &metrics);
    let spans_only = per_request(n, || one(&no_metrics, &headers, &body, &id, meta));
    let inject = per_request(n, || {
        let server = no_metrics.server_span(&call(&headers, &id, None));
        let hop = no_metrics.hop_span(&server);
        let f = hop.fields();
        std::hint::black_box(&f);
    });
    println!("not sampled, no metrics: {spans_only:?}; spans and fields, no body: {inject:?}");
    println!(
        "per request: off {off:?}, not sampled {not_sampled:?} (+{:?}), sampled {sampled:?} (+{:?})",
        not_sampled.saturating_sub(off),
        sampled.saturating_sub(off)
    );
}

/// What the request duration's record costs with exemplars (`request_duration_seconds`):
/// the plain histogram it was, the same with no exemplar (a request not sampled), and a
/// sampled request's (its ids written out, the time read, the exemplar stored).
#[tokio::test(flavor = "current_thread")]
#[ignore = "a measurement: run it by hand in release"]
async fn cost_of_the_duration_exemplar() {
    use prometheus_client::metrics::exemplar::HistogramWithExemplars;
    use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
    let metrics = Arc::new(Metrics::new(|_| {}));
    let (headers, _, id) = request();
    let n = 1_000_000;
    let plain = Histogram::new(exponential_buckets(0.0001, 2.0, 19));
    let traced: HistogramWithExemplars<crate::metrics::TraceLabels> =
        HistogramWithExemplars::new(exponential_buckets(0.0001, 2.0, 19));
    let before = per_request(n, || plain.observe(std::hint::black_box(0.001)));
    let unsampled = per_request(n, || {
        traced.observe(std::hint::black_box(0.001), None, None)
    });
    let otel = started(&config(Sampling::AlwaysOn), &metrics);
    let span = otel.server_span(&call(&headers, &id, None));
    let sampled = per_request(n, || {
        let e = span.exemplar();
        let at = e.as_ref().map(|_| std::time::SystemTime::now());
        traced.observe(std::hint::black_box(0.001), e, at);
    });
    println!(
        "duration record: plain {before:?}, with exemplars not sampled {unsampled:?} (+{:?}), sampled {sampled:?} (+{:?})",
        unsampled.saturating_sub(before),
        sampled.saturating_sub(before)
    );
}

/// This process's CPU time (user and system), from `/proc/self/stat`.
fn cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .rsplit(')')
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    // utime and stime are fields 14 and 15 of stat; 12 and 13 after the name and the state.
    let ticks = fields.get(10).copied().unwrap_or(0) + fields.get(11).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// A sampled request's whole cost, export included: `n` requests' spans sent to a collector
/// that answers at once (`EPODE_OTEL_SINK`, such as an nginx `return 200` on :4318), in CPU
/// time of this process, against the same loop with OpenTelemetry off.
#[tokio::test(flavor = "current_thread")]
#[ignore = "a measurement: run it by hand in release, with a sink"]
async fn cost_per_sampled_request_with_export() {
    let Ok(sink) = std::env::var("EPODE_OTEL_SINK") else {
        println!("EPODE_OTEL_SINK is unset: nothing measured");
        return;
    };
    let metrics = Arc::new(Metrics::new(|_| {}));
    let (headers, body, id) = request();
    let meta = meta_of(&body);
    let n: u64 = 100_000;
    let mut c = config(Sampling::AlwaysOn);
    c.traces_url = url::Url::parse(&format!("{}/v1/traces", sink.trim_end_matches('/'))).unwrap();
    c.queue = 1_000_000;
    let otel = started(&c, &metrics);
    let t = cpu();
    for i in 0..n {
        one(&otel, &headers, &body, &id, meta);
        if i % 256 == 0 {
            tokio::task::yield_now().await;
        }
    }
    let exported = || metrics.otlp.exported.get_or_create(&export::TRACES).get();
    let deadline = Instant::now() + Duration::from_secs(120);
    while exported() < 2 * n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let with = cpu() - t;
    let dropped = metrics.otlp.dropped.get_or_create(&export::TRACES).get();
    let t = cpu();
    for i in 0..n {
        let (h, b) = translate::with_traceparent(&headers, &body);
        std::hint::black_box((&h, &b));
        if i % 256 == 0 {
            tokio::task::yield_now().await;
        }
    }
    let without = cpu() - t;
    println!(
        "sampled, exported: {:?} per request (exported {} spans, dropped {dropped}); off: {:?}",
        with / n as u32,
        exported(),
        without / n as u32
    );
}
