//! What an operator sees on `/metrics`: the sidecar's metric families (prometheus-client), in
//! the Prometheus text format with `HELP` lines, or OpenMetrics (with the request duration's
//! exemplars: a sampled request's trace) for a scraper that asks for it; the same families as
//! data ([`Metrics::snapshot`]) for the OTLP export. Label values come from fixed sets (method
//! names the sidecar knows, statuses, modes), so no client can grow the number of series.

use prometheus_client::encoding::prometheus_protobuf::prometheus_data_model::MetricFamily;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

pub(crate) use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// OpenMetrics 1.0, the text format that carries exemplars.
pub(crate) const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A sampled request's trace, the exemplar of the request duration's bucket it fell in
/// (OpenMetrics' and OpenTelemetry's names for it; 60 characters of the 128 an exemplar may
/// hold).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TraceLabels {
    pub(crate) trace_id: String,
    pub(crate) span_id: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    pub(crate) method: &'static str,
    pub(crate) era: &'static str,
    pub(crate) status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct MethodLabels {
    pub(crate) method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DecorationLabels {
    pub(crate) mode: &'static str,
    pub(crate) state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct FeedbackCallLabels {
    pub(crate) tool: &'static str,
    pub(crate) outcome: &'static str,
}

/// `outcome` of a customer-context enrichment request (`customer_context_requests_total`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct EnrichmentLabels {
    pub(crate) outcome: &'static str,
}

impl EnrichmentLabels {
    /// Every outcome: its contract placed in the result; Epode refused it (a 4xx or 5xx, an
    /// answer that is no contract); no answer within the budget; Epode not reached.
    pub(crate) const OUTCOMES: [&'static str; 4] = ["placed", "refused", "late", "unreachable"];
}

/// `tool` and `outcome` of a customer-context tool call (`customer_context_tool_calls_total`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ContextToolLabels {
    pub(crate) tool: &'static str,
    pub(crate) outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SurfaceLabels {
    pub(crate) surface: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SkipLabels {
    pub(crate) reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct LimitLabels {
    pub(crate) kind: &'static str,
}

/// Every limit that can refuse something: the `kind` label of `limits_hit_total`, each shown
/// from the start (at 0). The README's metrics table lists them all (a test checks it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum LimitKind {
    Connections,
    AdminConnections,
    DevEpodeConnections,
    HeaderTimeout,
    IdleTimeout,
    WriteTimeout,
    BodyTimeout,
    BodySize,
    BodyRead,
    InFlight,
    MemoryBudget,
    ClientRate,
    ToolRate,
    UpstreamAnswerSize,
    SseEventSize,
    UpstreamStdin,
    StdioNotOwner,
    UpstreamConnections,
    ListenStreams,
    HeldCalls,
    Questions,
    UpstreamSessions,
    StdioChildren,
    Introspections,
    HeldConnections,
    Tasks,
    ContextRequests,
}

impl LimitKind {
    pub(crate) const ALL: [LimitKind; 27] = [
        LimitKind::Connections,
        LimitKind::AdminConnections,
        LimitKind::DevEpodeConnections,
        LimitKind::HeaderTimeout,
        LimitKind::IdleTimeout,
        LimitKind::WriteTimeout,
        LimitKind::BodyTimeout,
        LimitKind::BodySize,
        LimitKind::BodyRead,
        LimitKind::InFlight,
        LimitKind::MemoryBudget,
        LimitKind::ClientRate,
        LimitKind::ToolRate,
        LimitKind::UpstreamAnswerSize,
        LimitKind::SseEventSize,
        LimitKind::UpstreamStdin,
        LimitKind::StdioNotOwner,
        LimitKind::UpstreamConnections,
        LimitKind::ListenStreams,
        LimitKind::HeldCalls,
        LimitKind::Questions,
        LimitKind::UpstreamSessions,
        LimitKind::StdioChildren,
        LimitKind::Introspections,
        LimitKind::HeldConnections,
        LimitKind::Tasks,
        LimitKind::ContextRequests,
    ];

    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LimitKind::Connections => "connections",
            LimitKind::AdminConnections => "admin_connections",
            LimitKind::DevEpodeConnections => "dev_epode_connections",
            LimitKind::HeaderTimeout => "header_timeout",
            LimitKind::IdleTimeout => "idle_timeout",
            LimitKind::WriteTimeout => "write_timeout",
            LimitKind::BodyTimeout => "body_timeout",
            LimitKind::BodySize => "body_size",
            LimitKind::BodyRead => "body_read",
            LimitKind::InFlight => "in_flight",
            LimitKind::MemoryBudget => "memory_budget",
            LimitKind::ClientRate => "client_rate",
            LimitKind::ToolRate => "tool_rate",
            LimitKind::UpstreamAnswerSize => "upstream_answer_size",
            LimitKind::SseEventSize => "sse_event_size",
            LimitKind::UpstreamStdin => "upstream_stdin",
            LimitKind::StdioNotOwner => "stdio_not_owner",
            LimitKind::UpstreamConnections => "upstream_connections",
            LimitKind::ListenStreams => "listen_streams",
            LimitKind::HeldCalls => "held_calls",
            LimitKind::Questions => "questions",
            LimitKind::UpstreamSessions => "upstream_sessions",
            LimitKind::StdioChildren => "stdio_children",
            LimitKind::Introspections => "introspections",
            LimitKind::HeldConnections => "held_connections",
            LimitKind::Tasks => "tasks",
            LimitKind::ContextRequests => "context_requests",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PoolLabels {
    pub(crate) pool: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PoolRefusedLabels {
    pub(crate) pool: &'static str,
    pub(crate) reason: &'static str,
}

/// The ledger's pools: what every caller holds past its request's head.
#[derive(Default)]
pub(crate) struct PoolMetrics {
    /// Places held now.
    pub(crate) in_use: Family<PoolLabels, Gauge>,
    /// Callers holding at least one place now.
    pub(crate) callers: Family<PoolLabels, Gauge>,
    /// The cap, and the share one caller may hold.
    pub(crate) capacity: Family<PoolLabels, Gauge>,
    pub(crate) share: Family<PoolLabels, Gauge>,
    /// Places refused: a caller past its share, or the process at the cap.
    pub(crate) refused: Family<PoolRefusedLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RefusedLabels {
    pub(crate) reason: &'static str,
}

/// Why the front door refused a request by its head alone: the `reason` label of
/// `front_door_refused_total`, each shown from the start (at 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum HeadRefusal {
    Host,
    Origin,
    /// A 2025 client's optional GET stream (it opens one at connect; 405 says there is none).
    GetStream,
    /// A 2025 client's `DELETE` of its session (405: there are no sessions to end).
    SessionDelete,
    /// Any other HTTP method than POST.
    Method,
    ContentType,
}

impl HeadRefusal {
    pub(crate) const ALL: [HeadRefusal; 6] = [
        HeadRefusal::Host,
        HeadRefusal::Origin,
        HeadRefusal::GetStream,
        HeadRefusal::SessionDelete,
        HeadRefusal::Method,
        HeadRefusal::ContentType,
    ];

    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            HeadRefusal::Host => "host",
            HeadRefusal::Origin => "origin",
            HeadRefusal::GetStream => "get_stream",
            HeadRefusal::SessionDelete => "session_delete",
            HeadRefusal::Method => "method",
            HeadRefusal::ContentType => "content_type",
        }
    }

    /// Whether it is what well-behaved clients send (2025 clients' GET and DELETE, which the
    /// 2025 spec lets a server refuse with 405): counted, not warned about.
    pub(crate) fn expected(self) -> bool {
        matches!(self, HeadRefusal::GetStream | HeadRefusal::SessionDelete)
    }
}

/// How a call of one of the two feedback tools ended: what the binding branches on, the
/// `outcome` label of `feedback_calls_total`, and what the console is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FeedbackOutcome {
    /// Epode took the report.
    Accepted,
    /// Epode recorded the consent decision.
    Approved,
    Declined,
    /// Epode answered with a status that is not a success.
    Refused,
    /// Epode could not be reached, or answered something that is not its answer.
    Unavailable,
    /// Refused by the sidecar before Epode: the arguments are not the tool's.
    InvalidArguments,
    /// Refused by the sidecar before Epode: the handle is not this product's, or has expired.
    InvalidHandle,
}

impl FeedbackOutcome {
    pub(crate) const ALL: [FeedbackOutcome; 7] = [
        FeedbackOutcome::Accepted,
        FeedbackOutcome::Approved,
        FeedbackOutcome::Declined,
        FeedbackOutcome::Refused,
        FeedbackOutcome::Unavailable,
        FeedbackOutcome::InvalidArguments,
        FeedbackOutcome::InvalidHandle,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            FeedbackOutcome::Accepted => "accepted",
            FeedbackOutcome::Approved => "approved",
            FeedbackOutcome::Declined => "declined",
            FeedbackOutcome::Refused => "refused",
            FeedbackOutcome::Unavailable => "unavailable",
            FeedbackOutcome::InvalidArguments => "invalid_arguments",
            FeedbackOutcome::InvalidHandle => "invalid_handle",
        }
    }
}

/// 100 µs to about 26 s.
fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.0001, 2.0, 19)
}

fn latency() -> Histogram {
    Histogram::new(latency_buckets())
}

fn latency_traced() -> HistogramWithExemplars<TraceLabels> {
    HistogramWithExemplars::new(latency_buckets())
}

/// Every metric family of the sidecar.
pub(crate) struct Metrics {
    registry: Registry,
    /// When the families were made (what their cumulative values count from).
    created: std::time::SystemTime,
    pub(crate) requests: Family<RequestLabels, Counter>,
    /// Each bucket's exemplar the last sampled request that fell in it (OpenTelemetry on).
    pub(crate) request_seconds: Family<
        MethodLabels,
        HistogramWithExemplars<TraceLabels>,
        fn() -> HistogramWithExemplars<TraceLabels>,
    >,
    pub(crate) upstream_seconds: Family<MethodLabels, Histogram, fn() -> Histogram>,
    pub(crate) decorations: Family<DecorationLabels, Counter>,
    pub(crate) feedback_calls: Family<FeedbackCallLabels, Counter>,
    pub(crate) enrichment_requests: Family<EnrichmentLabels, Counter>,
    pub(crate) context_tool_calls: Family<ContextToolLabels, Counter>,
    pub(crate) limits_hit: Family<LimitLabels, Counter>,
    /// Requests the front door refused by their head, by reason.
    pub(crate) front_door_refused: Family<RefusedLabels, Counter>,
    /// HTTP responses instrumented, by surface (the HTTP surface).
    pub(crate) http_instrumented: Family<SurfaceLabels, Counter>,
    /// HTTP responses passed on untouched, by reason.
    pub(crate) http_skipped: Family<SkipLabels, Counter>,
    /// `Epode-Identity` headers that were not a valid identity object.
    pub(crate) http_identity_invalid: Counter,
    pub(crate) open_connections: Gauge,
    pub(crate) in_flight: Gauge,
    pub(crate) buffered_bytes: Gauge,
    pub(crate) upstream_sessions: Gauge,
    pub(crate) rate_limit_clients: Gauge,
    pub(crate) upstream_connections: Gauge,
    pub(crate) auth: AuthMetrics,
    pub(crate) held: HeldMetrics,
    /// 1 for what of Epode the upstream carries itself (`nothing`, `telemetry`, `binding`).
    pub(crate) upstream_epode: Family<CarriesLabels, Gauge>,
    pub(crate) listen: ListenMetrics,
    pub(crate) otlp: OtlpMetrics,
    pub(crate) pools: PoolMetrics,
}

/// The OpenTelemetry export (`EPODE_SIDECAR_OTLP_ENDPOINT`), by signal (`traces`, `metrics`).
#[derive(Default)]
pub(crate) struct OtlpMetrics {
    /// Spans (or metric exports) sent and accepted.
    pub(crate) exported: Family<SignalLabels, Counter>,
    /// Spans dropped: the queue full, or their batch's export failed.
    pub(crate) dropped: Family<SignalLabels, Counter>,
    /// Exports that failed (refused, timed out, unreachable).
    pub(crate) failed: Family<SignalLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SignalLabels {
    pub(crate) signal: &'static str,
}

/// The `subscriptions/listen` streams the sidecar serves for a 2025-era upstream.
#[derive(Default)]
pub(crate) struct ListenMetrics {
    /// Open now.
    pub(crate) streams: Gauge,
    /// Cut because they did not read their notices.
    pub(crate) cut: Counter,
    /// Times a feed's GET stream was reopened after it ended or broke.
    pub(crate) reopened: Counter,
}

/// The calls held while a 2026 client answers a 2025-era upstream's questions.
#[derive(Default)]
pub(crate) struct HeldMetrics {
    /// Held now.
    pub(crate) calls: Gauge,
    /// Cancelled at their deadline, their client never back.
    pub(crate) expired: Counter,
    /// Retries whose `requestState` continued nothing, by reason.
    refused: Family<SkipLabels, Counter>,
    /// Retries forwarded to the replica that holds their call, by outcome.
    forwarded: Family<OutcomeLabels, Counter>,
}

/// The authorization front door's families.
#[derive(Default)]
pub(crate) struct AuthMetrics {
    /// Requests it refused, by reason.
    refused: Family<SkipLabels, Counter>,
    /// Fetches of the issuer's keys, by outcome.
    key_fetches: Family<OutcomeLabels, Counter>,
    /// The keys held, and when they were fetched (Unix seconds).
    pub(crate) keys: Gauge,
    pub(crate) keys_fetched: Gauge,
    /// Tool calls whose product identity and the verified identity name different refs.
    pub(crate) identity_disagreements: Counter,
    /// Requests to the authorization facade, by endpoint and outcome.
    facade: Family<FacadeLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct FacadeLabels {
    pub(crate) endpoint: &'static str,
    pub(crate) outcome: &'static str,
}

/// What of Epode the upstream carries itself (`epode_sidecar_upstream_epode`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CarriesLabels {
    pub(crate) carries: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OutcomeLabels {
    pub(crate) outcome: &'static str,
}

impl Metrics {
    /// The families, with what `telemetry` registers (the telemetry queue's counters) beside
    /// them under the `telemetry` prefix. The queue registers its own counters: this module
    /// stays below the Epode client and knows none of its types.
    pub(crate) fn new(telemetry: impl FnOnce(&mut Registry)) -> Self {
        let mut m = Metrics {
            registry: Registry::with_prefix("epode_sidecar"),
            created: std::time::SystemTime::now(),
            requests: Family::default(),
            request_seconds: Family::new_with_constructor(latency_traced),
            upstream_seconds: Family::new_with_constructor(latency),
            decorations: Family::default(),
            feedback_calls: Family::default(),
            enrichment_requests: Family::default(),
            context_tool_calls: Family::default(),
            limits_hit: Family::default(),
            front_door_refused: Family::default(),
            http_instrumented: Family::default(),
            http_skipped: Family::default(),
            http_identity_invalid: Counter::default(),
            open_connections: Gauge::default(),
            in_flight: Gauge::default(),
            buffered_bytes: Gauge::default(),
            upstream_sessions: Gauge::default(),
            rate_limit_clients: Gauge::default(),
            upstream_connections: Gauge::default(),
            auth: AuthMetrics::default(),
            held: HeldMetrics::default(),
            upstream_epode: Family::default(),
            listen: ListenMetrics::default(),
            otlp: OtlpMetrics::default(),
            pools: PoolMetrics::default(),
        };
        let r = &mut m.registry;
        r.register(
            "requests",
            "MCP requests answered, by method, client era and HTTP status",
            m.requests.clone(),
        );
        r.register(
            "request_duration_seconds",
            "Time from a request's arrival to its response head, by method",
            m.request_seconds.clone(),
        );
        r.register(
            "upstream_duration_seconds",
            "Time the upstream took to begin its answer, by method",
            m.upstream_seconds.clone(),
        );
        r.register(
            "decorations",
            "Product tool results that carried _agentFeedback, by mode and state",
            m.decorations.clone(),
        );
        r.register(
            "feedback_tool_calls",
            "Calls of the two feedback tools, by tool and outcome",
            m.feedback_calls.clone(),
        );
        r.register(
            "customer_context_requests",
            "Customer-context enrichment requests after product calls, by outcome (placed, refused, late, unreachable); all but placed leave the result as the upstream sent it",
            m.enrichment_requests.clone(),
        );
        r.register(
            "customer_context_tool_calls",
            "Calls of the two customer-context tools, by tool and outcome (ok, error, refused: arguments refused before anything was sent)",
            m.context_tool_calls.clone(),
        );
        r.register(
            "limits_hit",
            "Requests and connections refused by a limit, by kind",
            m.limits_hit.clone(),
        );
        m.register_front_door();
        m.register_http();
        m.register_pools();
        for (name, help, gauge) in m.gauges() {
            m.registry.register(name, help, gauge);
        }
        telemetry(m.registry.sub_registry_with_prefix("telemetry"));
        m.preregister();
        m
    }

    /// Shows every fixed label value from the start (at 0).
    fn preregister(&self) {
        let m = self;
        for tool in ["record_product_feedback_consent", "report_product_feedback"] {
            for outcome in FeedbackOutcome::ALL {
                drop(m.feedback_calls.get_or_create(&FeedbackCallLabels {
                    tool,
                    outcome: outcome.label(),
                }));
            }
        }
        for outcome in EnrichmentLabels::OUTCOMES {
            drop(
                m.enrichment_requests
                    .get_or_create(&EnrichmentLabels { outcome }),
            );
        }
        for kind in LimitKind::ALL {
            drop(m.limits_hit.get_or_create(&LimitLabels {
                kind: kind.as_str(),
            }));
        }
        for refusal in HeadRefusal::ALL {
            drop(m.front_door_refused.get_or_create(&RefusedLabels {
                reason: refusal.as_str(),
            }));
        }
    }

    /// The gauges, with their names and help.
    fn gauges(&self) -> [(&'static str, &'static str, Gauge); 10] {
        [
            (
                "listen_streams",
                "subscriptions/listen streams the sidecar serves for a 2025-era upstream (at most listen_streams)",
                self.listen.streams.clone(),
            ),
            (
                "held_calls",
                "Calls of a 2025-era upstream held while a 2026 client answers their questions (at most held_calls)",
                self.held.calls.clone(),
            ),
            ("open_connections", "Client connections open now, on every listener", self.open_connections.clone()),
            ("in_flight_requests", "MCP requests being served now", self.in_flight.clone()),
            ("buffered_bytes", "Bytes held against the memory budget now", self.buffered_bytes.clone()),
            ("upstream_sessions", "2025-era upstream sessions open now", self.upstream_sessions.clone()),
            (
                "rate_limit_clients",
                "Client addresses the per-client rate limits track now (at most rate_limit_clients each on the MCP path and the HTTP surface)",
                self.rate_limit_clients.clone(),
            ),
            (
                "upstream_connections",
                "Connections open to an HTTP upstream now, all workers together (at most upstream_max_connections)",
                self.upstream_connections.clone(),
            ),
            (
                "auth_keys",
                "Verification keys held from the authorization server's JWKS",
                self.auth.keys.clone(),
            ),
            (
                "auth_keys_fetched_timestamp_seconds",
                "When the authorization server's keys were last fetched (Unix time; their age is time() minus this)",
                self.auth.keys_fetched.clone(),
            ),
        ]
    }

    /// The ledger's pools.
    fn register_pools(&mut self) {
        let r = &mut self.registry;
        let p = &self.pools;
        r.register(
            "pool_in_use",
            "Places of each ledger pool held now (held calls, questions, listen streams, upstream sessions, stdio children, introspections, held upstream connections)",
            p.in_use.clone(),
        );
        r.register(
            "pool_callers",
            "Callers holding at least one place of each ledger pool now",
            p.callers.clone(),
        );
        r.register(
            "pool_capacity",
            "Each ledger pool's cap, for the whole process",
            p.capacity.clone(),
        );
        r.register(
            "pool_share",
            "Places of each ledger pool one caller may hold",
            p.share.clone(),
        );
        r.register(
            "pool_refused",
            "Places of a ledger pool refused, by pool and reason (share: the caller held its share, 429; cap: the process held the cap, 503)",
            p.refused.clone(),
        );
    }

    /// A limit refused something.
    fn register_http(&mut self) {
        self.registry.register(
            "http_instrumented",
            "HTTP responses (not MCP) that carried an Epode envelope, by surface",
            self.http_instrumented.clone(),
        );
        self.registry.register(
            "http_skipped",
            "HTTP responses (not MCP) passed on untouched, by reason",
            self.http_skipped.clone(),
        );
        self.registry.register(
            "http_identity_invalid",
            "Epode-Identity response headers that were not a valid identity object (removed, unused)",
            self.http_identity_invalid.clone(),
        );
    }

    /// Shows every HTTP surface and skip reason from the start (at 0); the labels are the
    /// HTTP surface's own.
    pub(crate) fn preregister_http(&self, surfaces: &[&'static str], reasons: &[&'static str]) {
        for &surface in surfaces {
            drop(
                self.http_instrumented
                    .get_or_create(&SurfaceLabels { surface }),
            );
        }
        for &reason in reasons {
            drop(self.http_skipped.get_or_create(&SkipLabels { reason }));
        }
    }

    pub(crate) fn limit(&self, kind: LimitKind) {
        self.limits_hit
            .get_or_create(&LimitLabels {
                kind: kind.as_str(),
            })
            .inc();
    }

    /// A refusal of the authorization front door (`by` 0 shows the reason from the start).
    /// The front door's refusals, and the authorization front door's families (registered
    /// whether it is on or not).
    fn register_front_door(&mut self) {
        let r = &mut self.registry;
        r.register(
            "front_door_refused",
            "MCP requests refused by their head alone (Host, Origin, HTTP method, Content-Type), by reason",
            self.front_door_refused.clone(),
        );
        r.register(
            "auth_refused",
            "MCP requests the authorization front door refused (EPODE_SIDECAR_AUTH), by reason",
            self.auth.refused.clone(),
        );
        r.register(
            "auth_facade_requests",
            "Requests to the authorization facade (EPODE_SIDECAR_AUTH_FACADE), by endpoint (metadata, authorize, token) and outcome (served, refused, failed)",
            self.auth.facade.clone(),
        );
        r.register(
            "auth_key_fetches",
            "Fetches of the authorization server's keys (JWKS), by outcome (fetched, failed)",
            self.auth.key_fetches.clone(),
        );
        r.register(
            "held_calls_expired",
            "Held calls cancelled upstream at their deadline (EPODE_SIDECAR_HELD_CALL_WAIT), their client never back with the answers",
            self.held.expired.clone(),
        );
        r.register(
            "listeners_cut",
            "subscriptions/listen streams cut because their client did not read the notices (it listens again)",
            self.listen.cut.clone(),
        );
        r.register(
            "listen_feed_reopened",
            "Times the GET stream of a 2025-era upstream's session, feeding listen streams, was reopened after it ended or broke",
            self.listen.reopened.clone(),
        );
        r.register(
            "otlp_exported",
            "OpenTelemetry items the collector accepted, by signal (traces: spans; metrics: exports)",
            self.otlp.exported.clone(),
        );
        r.register(
            "otlp_dropped",
            "Spans never delivered to the collector (the queue EPODE_SIDECAR_OTLP_QUEUE full, or their export failed), by signal",
            self.otlp.dropped.clone(),
        );
        r.register(
            "otlp_export_failed",
            "OTLP exports that failed (refused, timed out, unreachable), by signal",
            self.otlp.failed.clone(),
        );
        r.register(
            "held_call_refused",
            "Retries whose requestState continued no held call, by reason (forged, other_replica, owner_gone, expired, gone, other_caller, other_request)",
            self.held.refused.clone(),
        );
        r.register(
            "upstream_epode",
            "1 for what of Epode the upstream carries itself, as far as the sidecar has seen (carries: nothing; telemetry, its capabilities advertise ai.epode/agent-feedback; binding, it lists Epode's tools or decorates its results); where it carries any, the sidecar steps back from the binding (EPODE_SIDECAR_UPSTREAM_EPODE)",
            self.upstream_epode.clone(),
        );
        r.register(
            "held_call_forwarded",
            "Retries forwarded to the replica that holds their call (EPODE_SIDECAR_REPLICA_URL), by outcome (answered, owner_gone, timeout, failed)",
            self.held.forwarded.clone(),
        );
        r.register(
            "auth_identity_disagreements",
            "Product tool calls whose identity from the product (_meta) names other refs than the verified token",
            self.auth.identity_disagreements.clone(),
        );
    }

    pub(crate) fn held_call_refused(&self, reason: &'static str) {
        self.held
            .refused
            .get_or_create(&SkipLabels { reason })
            .inc();
    }

    pub(crate) fn auth_refused(&self, reason: &'static str, by: u64) {
        self.auth
            .refused
            .get_or_create(&SkipLabels { reason })
            .inc_by(by);
    }

    pub(crate) fn held_call_forwarded(&self, outcome: &'static str) {
        self.held
            .forwarded
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    pub(crate) fn auth_facade(&self, endpoint: &'static str, outcome: &'static str) {
        self.auth
            .facade
            .get_or_create(&FacadeLabels { endpoint, outcome })
            .inc();
    }

    pub(crate) fn auth_key_fetch(&self, outcome: &'static str) {
        self.auth
            .key_fetches
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    pub(crate) fn refused(&self, refusal: HeadRefusal) {
        self.front_door_refused
            .get_or_create(&RefusedLabels {
                reason: refusal.as_str(),
            })
            .inc();
    }

    /// The exposition, in the Prometheus text format.
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry);
        out
    }

    /// The exposition in OpenMetrics 1.0 (exemplars included).
    pub(crate) fn render_openmetrics(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// When the families were made (the start of every cumulative value).
    pub(crate) fn created(&self) -> std::time::SystemTime {
        self.created
    }

    /// Every family's values now, as data (for the OTLP export); `None` if a family cannot be
    /// written as Prometheus data (none of the sidecar's kinds fails).
    pub(crate) fn snapshot(&self) -> Option<Vec<MetricFamily>> {
        prometheus_client::encoding::prometheus_protobuf::encode(&self.registry).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::{HeadRefusal, LimitKind};

    /// The label values the metrics table documents for `metric` (its row in the README or
    /// docs/operations.md), in order.
    fn documented(metric: &str, label: &str) -> Vec<String> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let docs = ["README.md", "docs/operations.md"]
            .iter()
            .filter_map(|f| std::fs::read_to_string(root.join(f)).ok())
            .collect::<String>();
        let row = docs
            .lines()
            .find(|l| l.starts_with(&format!("| `{metric}`")))
            .unwrap_or_else(|| panic!("a metrics table row for {metric}"));
        row.split('`')
            .skip(1)
            .step_by(2)
            .filter(|w| *w != metric && *w != label)
            .map(str::to_owned)
            .collect()
    }

    /// The documented `limits_hit_total` row names every kind the code counts, and no other.
    #[test]
    fn the_documented_limit_kinds_are_the_counted_ones() {
        let counted: Vec<&str> = LimitKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(documented("limits_hit_total", "kind"), counted);
    }

    /// The same for `front_door_refused_total`.
    #[test]
    fn the_documented_refusal_reasons_are_the_counted_ones() {
        let counted: Vec<&str> = HeadRefusal::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(documented("front_door_refused_total", "reason"), counted);
        let expected: Vec<&str> = HeadRefusal::ALL
            .iter()
            .filter(|r| r.expected())
            .map(|r| r.as_str())
            .collect();
        assert_eq!(expected, ["get_stream", "session_delete"]);
    }
}
