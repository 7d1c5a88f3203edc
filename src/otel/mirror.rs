//! The `/metrics` families as OTLP metrics, for an operator whose pipeline is OpenTelemetry
//! (`EPODE_SIDECAR_OTLP_METRICS=all`): read as data from the registry when an export is due
//! ([`Metrics::snapshot`](crate::metrics::Metrics::snapshot)), so a request pays nothing for
//! them. Each family keeps its `/metrics` name (a counter's with `_total`), so one name finds
//! it in either pipeline: a counter is a monotonic cumulative sum, a gauge a gauge, a
//! histogram a cumulative explicit-bucket histogram whose exemplars carry the sampled
//! requests' trace and span ids; labels are attributes, values doubles. This is the mapping
//! the OpenTelemetry Collector's Prometheus receiver makes of the same families.

use std::time::SystemTime;

use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{
    exemplar, metric, number_data_point, AggregationTemporality, Exemplar, Gauge, Histogram,
    HistogramDataPoint, Metric, NumberDataPoint, ScopeMetrics, Sum,
};
use prometheus_client::encoding::prometheus_protobuf::prometheus_data_model as prom;

/// The instrumentation scope the families are exported under.
pub(super) const SCOPE: &str = "epode-sidecar.prometheus";

/// Nanoseconds since the Unix epoch.
pub(super) fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The families as one scope's metrics, their values counted from `start` (when the
/// families were made) to `now`.
pub(super) fn scope_metrics(
    families: Vec<prom::MetricFamily>,
    start: u64,
    now: u64,
) -> ScopeMetrics {
    ScopeMetrics {
        scope: Some(InstrumentationScope {
            name: SCOPE.to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            ..Default::default()
        }),
        metrics: families
            .into_iter()
            .filter_map(|f| family(f, start, now))
            .collect(),
        schema_url: String::new(),
    }
}

/// One family, or none when it is of a kind the sidecar does not make.
fn family(f: prom::MetricFamily, start: u64, now: u64) -> Option<Metric> {
    let number = |attributes, start_time_unix_nano, value| NumberDataPoint {
        attributes,
        start_time_unix_nano,
        time_unix_nano: now,
        value: Some(number_data_point::Value::AsDouble(value)),
        ..Default::default()
    };
    let metrics = f.metric.into_iter();
    let data = match prom::MetricType::try_from(f.r#type).ok()? {
        prom::MetricType::Counter => metric::Data::Sum(Sum {
            data_points: metrics
                .filter_map(|m| Some(number(attributes(&m.label), start, m.counter?.value)))
                .collect(),
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
            is_monotonic: true,
        }),
        prom::MetricType::Gauge => metric::Data::Gauge(Gauge {
            data_points: metrics
                .filter_map(|m| Some(number(attributes(&m.label), 0, m.gauge?.value)))
                .collect(),
        }),
        prom::MetricType::Histogram => metric::Data::Histogram(Histogram {
            data_points: metrics
                .filter_map(|m| {
                    let labels = attributes(&m.label);
                    Some(histogram_point(m.histogram?, labels, start, now))
                })
                .collect(),
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
        }),
        _ => return None,
    };
    Some(Metric {
        name: f.name,
        description: f.help,
        unit: f.unit,
        data: Some(data),
        ..Default::default()
    })
}

fn attributes(labels: &[prom::LabelPair]) -> Vec<KeyValue> {
    labels.iter().map(|l| string(&l.name, &l.value)).collect()
}

fn string(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_owned())),
        }),
        ..Default::default()
    }
}

/// A histogram's point: Prometheus counts each bucket with those below it, OTLP each on its
/// own; OTLP's bounds leave out the last (`+Inf`) bucket's.
fn histogram_point(
    h: prom::Histogram,
    attributes: Vec<KeyValue>,
    start: u64,
    now: u64,
) -> HistogramDataPoint {
    let mut below = 0;
    let mut counts: Vec<u64> = h
        .bucket
        .iter()
        .map(|b| {
            let own = b.cumulative_count.saturating_sub(below);
            below = b.cumulative_count;
            own
        })
        .collect();
    let mut explicit_bounds: Vec<f64> = h.bucket.iter().map(|b| b.upper_bound).collect();
    // prometheus-client writes `+Inf` as f64::MAX.
    if explicit_bounds
        .last()
        .is_some_and(|b| b.is_infinite() || *b == f64::MAX)
    {
        explicit_bounds.pop();
    } else {
        // No `+Inf` bucket written: what is above every bound.
        counts.push(h.sample_count.saturating_sub(below));
    }
    HistogramDataPoint {
        attributes,
        start_time_unix_nano: start,
        time_unix_nano: now,
        count: h.sample_count,
        sum: Some(h.sample_sum),
        bucket_counts: counts,
        explicit_bounds,
        exemplars: h
            .bucket
            .into_iter()
            .filter_map(|b| b.exemplar)
            .map(|e| exemplar_of(e, now))
            .collect(),
        ..Default::default()
    }
}

/// A Prometheus exemplar as OTLP's: its `trace_id` and `span_id` labels as the ids, any
/// other label an attribute.
fn exemplar_of(e: prom::Exemplar, now: u64) -> Exemplar {
    let mut out = Exemplar {
        time_unix_nano: e.timestamp.map_or(now, |t| {
            u64::try_from(t.seconds)
                .unwrap_or(0)
                .saturating_mul(1_000_000_000)
                .saturating_add(u64::try_from(t.nanos).unwrap_or(0))
        }),
        value: Some(exemplar::Value::AsDouble(e.value)),
        ..Default::default()
    };
    for label in e.label {
        match (label.name.as_str(), hex(&label.value)) {
            ("trace_id", Some(id)) if id.len() == 16 => out.trace_id = id,
            ("span_id", Some(id)) if id.len() == 8 => out.span_id = id,
            _ => out
                .filtered_attributes
                .push(string(&label.name, &label.value)),
        }
    }
    out
}

/// Hex as bytes.
fn hex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use opentelemetry_proto::tonic::metrics::v1::{metric::Data, number_data_point::Value};

    use super::{scope_metrics, unix_nanos, SCOPE};
    use crate::metrics::{
        FeedbackOutcome, LimitKind, MethodLabels, Metrics, RequestLabels, TraceLabels,
    };

    fn metric<'a>(
        scope: &'a opentelemetry_proto::tonic::metrics::v1::ScopeMetrics,
        name: &str,
    ) -> &'a opentelemetry_proto::tonic::metrics::v1::Metric {
        scope
            .metrics
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| {
                let names: Vec<&str> = scope.metrics.iter().map(|m| m.name.as_str()).collect();
                panic!("no {name} among {names:?}")
            })
    }

    fn attribute<'a>(
        kvs: &'a [opentelemetry_proto::tonic::common::v1::KeyValue],
        key: &str,
    ) -> Option<&'a str> {
        kvs.iter().find(|kv| kv.key == key).and_then(|kv| {
            match kv.value.as_ref()?.value.as_ref()? {
                super::any_value::Value::StringValue(s) => Some(s.as_str()),
                _ => None,
            }
        })
    }

    /// Every family of `/metrics` arrives, each kind as its OTLP kind, with its labels and its
    /// values.
    #[test]
    fn each_family_is_its_otlp_kind_with_its_values() {
        let m = Metrics::new(|_| {});
        m.requests
            .get_or_create(&RequestLabels {
                method: "tools/call",
                era: "2026-07-28",
                status: 200,
            })
            .inc_by(3);
        m.limit(LimitKind::ClientRate);
        m.in_flight.set(7);
        let scope = scope_metrics(m.snapshot().unwrap(), 5, 9);
        assert_eq!(scope.scope.as_ref().unwrap().name, SCOPE);

        let Some(Data::Sum(sum)) = &metric(&scope, "epode_sidecar_requests_total").data else {
            panic!("requests is not a sum")
        };
        assert!(sum.is_monotonic);
        assert_eq!(sum.aggregation_temporality, 2, "cumulative");
        let p = &sum.data_points[0];
        assert_eq!(p.value, Some(Value::AsDouble(3.0)));
        assert_eq!((p.start_time_unix_nano, p.time_unix_nano), (5, 9));
        assert_eq!(attribute(&p.attributes, "method"), Some("tools/call"));
        assert_eq!(attribute(&p.attributes, "era"), Some("2026-07-28"));
        assert_eq!(attribute(&p.attributes, "status"), Some("200"));

        // Every limit kind shown from the start, the one hit at 1.
        let Some(Data::Sum(limits)) = &metric(&scope, "epode_sidecar_limits_hit_total").data else {
            panic!("limits_hit is not a sum")
        };
        assert_eq!(limits.data_points.len(), LimitKind::ALL.len());
        let hit = limits
            .data_points
            .iter()
            .find(|p| attribute(&p.attributes, "kind") == Some("client_rate"))
            .unwrap();
        assert_eq!(hit.value, Some(Value::AsDouble(1.0)));
        let Some(Data::Sum(feedback)) =
            &metric(&scope, "epode_sidecar_feedback_tool_calls_total").data
        else {
            panic!("feedback_tool_calls is not a sum")
        };
        assert_eq!(feedback.data_points.len(), 2 * FeedbackOutcome::ALL.len());

        let Some(Data::Gauge(g)) = &metric(&scope, "epode_sidecar_in_flight_requests").data else {
            panic!("in_flight_requests is not a gauge")
        };
        assert_eq!(g.data_points[0].value, Some(Value::AsDouble(7.0)));
    }

    /// A histogram's points: each bucket's own count, OTLP's bounds, and the sampled
    /// request's exemplar as a trace and span id.
    #[test]
    fn a_histogram_has_each_buckets_count_and_the_exemplar() {
        let m = Metrics::new(|_| {});
        let seconds = m.request_seconds.get_or_create(&MethodLabels {
            method: "tools/call",
        });
        // 150 µs (the second bucket), 1 ms twice (the fifth), one sampled.
        seconds.observe(0.00015, None, None);
        seconds.observe(0.001, None, None);
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        seconds.observe(
            0.001,
            Some(TraceLabels {
                trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
                span_id: "00f067aa0ba902b7".into(),
            }),
            Some(at),
        );
        drop(seconds);
        let scope = scope_metrics(m.snapshot().unwrap(), 5, 9);
        let Some(Data::Histogram(h)) =
            &metric(&scope, "epode_sidecar_request_duration_seconds").data
        else {
            panic!("request_duration_seconds is not a histogram")
        };
        assert_eq!(h.aggregation_temporality, 2, "cumulative");
        let p = &h.data_points[0];
        assert_eq!(p.count, 3);
        assert!((p.sum.unwrap() - 0.00215).abs() < 1e-9, "{:?}", p.sum);
        assert_eq!(p.explicit_bounds.len(), 19);
        assert_eq!(p.bucket_counts.len(), 20);
        assert_eq!(
            p.bucket_counts.iter().sum::<u64>(),
            3,
            "{:?}",
            p.bucket_counts
        );
        assert_eq!(p.bucket_counts[1], 1, "{:?}", p.bucket_counts);
        assert_eq!(p.bucket_counts[4], 2, "{:?}", p.bucket_counts);
        assert_eq!(p.exemplars.len(), 1);
        let e = &p.exemplars[0];
        assert_eq!(
            e.trace_id,
            [
                0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e,
                0x47, 0x36
            ]
        );
        assert_eq!(e.span_id, [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]);
        assert_eq!(e.time_unix_nano, unix_nanos(at));
        assert!(e.filtered_attributes.is_empty());
    }

    /// A histogram written without a `+Inf` bucket keeps what is above its bounds in OTLP's
    /// last bucket.
    #[test]
    fn a_histogram_without_an_infinite_bucket_keeps_what_is_above() {
        use prometheus_client::encoding::prometheus_protobuf::prometheus_data_model as prom;
        let bucket = |upper_bound: f64, cumulative_count: u64| prom::Bucket {
            upper_bound,
            cumulative_count,
            ..Default::default()
        };
        let h = prom::Histogram {
            sample_count: 6,
            sample_sum: 9.0,
            bucket: vec![bucket(1.0, 1), bucket(2.0, 4)],
            ..Default::default()
        };
        let p = super::histogram_point(h, Vec::new(), 0, 1);
        assert_eq!(p.bucket_counts, [1, 3, 2]);
        assert_eq!(p.explicit_bounds, [1.0, 2.0]);
    }

    /// What one export of the families costs, off the request path: the registry read as
    /// data, made OTLP and encoded, with each method's request series and histograms filled.
    #[test]
    #[ignore = "a measurement: run it by hand in release"]
    fn cost_of_an_export_of_the_families() {
        let m = Metrics::new(|_| {});
        for method in [
            "tools/call",
            "tools/list",
            "initialize",
            "ping",
            "resources/read",
            "prompts/get",
        ] {
            for status in [200, 400, 401, 429, 503] {
                m.requests
                    .get_or_create(&RequestLabels {
                        method,
                        era: "2026-07-28",
                        status,
                    })
                    .inc();
            }
            m.request_seconds
                .get_or_create(&MethodLabels { method })
                .observe(0.01, None, None);
            m.upstream_seconds
                .get_or_create(&MethodLabels { method })
                .observe(0.01);
        }
        let n = 2_000;
        let t = std::time::Instant::now();
        let mut bytes = 0;
        for _ in 0..n {
            let scope = scope_metrics(m.snapshot().unwrap(), 1, 2);
            bytes = prost::Message::encode_to_vec(&scope).len();
        }
        println!(
            "one export of the families: {:?}, {bytes} bytes encoded",
            t.elapsed() / n
        );
    }
}
