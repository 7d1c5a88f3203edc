//! OpenTelemetry: the sidecar's spans and metrics, received over OTLP/HTTP by a receiver that
//! decodes them with the official schema (`tests/peers/otlp_receiver.py`, the
//! `opentelemetry-proto` package), and checked attribute by attribute against the MCP
//! semantic conventions. The upstream is the Python `mcp` 2.3.0 SDK, which makes its own
//! server span per request (parented from `params._meta`), exported with the official
//! `opentelemetry-sdk` and OTLP/HTTP exporter to the same receiver: one trace from the
//! client's parent to the Python server's span, with the sidecar's server and upstream spans
//! between them. Then the collector down, hanging, answering 500 or 429: calls go on, the
//! queue stays bounded, drops are counted.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::fake_epode::{FakeConfig, FakeEpode};
use crate::support::{
    eventually_async, http, message_of, metric, modern_body, modern_headers, python, repo_root,
    spawn_ready, Proc, Sidecar, Upstream, UpstreamKind,
};

/// The receiver, on a port it picked.
pub(crate) struct Receiver {
    port: u16,
    _proc: Proc,
}

impl Receiver {
    pub(crate) fn start() -> Receiver {
        let mut cmd = Command::new(python());
        cmd.arg(repo_root().join("tests/peers/otlp_receiver.py"));
        let (proc, port) = spawn_ready(
            cmd,
            "otlp_receiver.py",
            "is opentelemetry-proto installed? run scripts/install-peers.sh",
        );
        Receiver { port, _proc: proc }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What the receiver shows at `path` (`/spans`, `/metrics`): a JSON list.
    pub(crate) async fn list(&self, path: &str) -> Vec<Value> {
        let v: Value = http()
            .get(format!("{}{path}", self.url()))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v.as_array().cloned().unwrap_or_default()
    }

    pub(crate) async fn spans(&self) -> Vec<Value> {
        self.list("/spans").await
    }

    pub(crate) async fn metrics(&self) -> Vec<Value> {
        self.list("/metrics").await
    }

    pub(crate) async fn mode(&self, m: &str) {
        http()
            .post(format!("{}/mode/{m}", self.url()))
            .send()
            .await
            .unwrap();
    }

    /// The spans of one trace, once `n` of them (at least) have arrived.
    pub(crate) async fn trace(&self, trace_id: &str, n: usize) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let found: Vec<Value> = self
                .spans()
                .await
                .into_iter()
                .filter(|s| s["traceId"] == trace_id)
                .collect();
            if found.len() >= n {
                return found;
            }
            assert!(
                Instant::now() < deadline,
                "trace {trace_id}: {} spans arrived, {n} expected: {found:#?}",
                found.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

const SECRET_ARGUMENT: &str = "argument-value-9f3c1e";
const SECRET_TOKEN: &str = "bearer-token-7d2a55";
/// An identity ref a trusted gateway sets (`EPODE_SIDECAR_IDENTITY_HEADERS`), which goes to
/// Epode with the telemetry event and into no span.
const SECRET_USER_REF: &str = "user-ref-51c0de";

pub(crate) fn one<'a>(spans: &'a [Value], what: &str, pred: impl Fn(&Value) -> bool) -> &'a Value {
    let found: Vec<&Value> = spans.iter().filter(|s| pred(s)).collect();
    assert_eq!(found.len(), 1, "{what}: {found:#?}\nall: {spans:#?}");
    found[0]
}

fn sidecar_span<'a>(spans: &'a [Value], kind: &str) -> &'a Value {
    one(spans, &format!("the sidecar's {kind} span"), |s| {
        s["resource"]["service.name"] == "epode-sidecar" && s["kind"] == kind
    })
}

fn python_span(spans: &[Value]) -> &Value {
    one(spans, "the Python server's span of the call", |s| {
        s["resource"]["service.name"] == "py-upstream"
            && s["kind"] == "SPAN_KIND_SERVER"
            && s["name"] == "tools/call echo"
    })
}

/// The attributes every span of a `tools/call echo` carries, by the conventions.
fn assert_call_attributes(span: &Value, protocol: &str, id: &str, what: &str) {
    let a = &span["attributes"];
    assert_eq!(span["name"], "tools/call echo", "{what}: {span:#}");
    assert_eq!(a["mcp.method.name"], "tools/call", "{what}: {span:#}");
    assert_eq!(a["mcp.protocol.version"], protocol, "{what}: {span:#}");
    assert_eq!(a["jsonrpc.request.id"], id, "{what}: {span:#}");
    assert_eq!(a["gen_ai.tool.name"], "echo", "{what}: {span:#}");
    assert_eq!(
        a["gen_ai.operation.name"], "execute_tool",
        "{what}: {span:#}"
    );
    assert!(a.get("error.type").is_none(), "{what}: {span:#}");
}

/// The chain client parent → sidecar server span → upstream client span → Python span.
fn assert_chain(spans: &[Value], parent: &str, transport: &str) -> (Value, Value) {
    let server = sidecar_span(spans, "SPAN_KIND_SERVER").clone();
    // The upstream hop (the catalog's own tools/list, when the first call made one, is
    // another client span).
    let hop = one(spans, "the sidecar's hop span", |s| {
        s["resource"]["service.name"] == "epode-sidecar"
            && s["kind"] == "SPAN_KIND_CLIENT"
            && s["name"] == server["name"]
    })
    .clone();
    let py = python_span(spans);
    assert_eq!(server["parentSpanId"], parent, "server span: {server:#}");
    assert_eq!(hop["parentSpanId"], server["spanId"], "hop span: {hop:#}");
    assert_eq!(py["parentSpanId"], hop["spanId"], "python span: {py:#}");
    assert_eq!(
        server["attributes"]["network.transport"], "tcp",
        "{server:#}"
    );
    assert_eq!(
        server["attributes"]["network.protocol.name"], "http",
        "{server:#}"
    );
    assert_eq!(
        server["attributes"]["client.address"], "127.0.0.1",
        "{server:#}"
    );
    assert_eq!(hop["attributes"]["network.transport"], transport, "{hop:#}");
    // The Python SDK's own span names the request as the sidecar sent it upstream.
    assert_eq!(py["name"], "tools/call echo", "{py:#}");
    assert_eq!(py["attributes"]["gen_ai.tool.name"], "echo", "{py:#}");
    assert!(
        hop["startNs"].as_u64() >= server["startNs"].as_u64()
            && hop["endNs"].as_u64() <= server["endNs"].as_u64(),
        "the hop lies within the server span: {server:#} {hop:#}"
    );
    (server, hop)
}

pub(crate) fn trace_ids(n: u8) -> (String, String) {
    (
        format!("{:032x}", 0x4bf9_2f35_77b3_4da6_u128 * 1000 + u128::from(n)),
        format!("{:016x}", 0x00f0_67aa_0ba9_0200_u64 + u64::from(n)),
    )
}

async fn call(sc: &Sidecar, id: u64, header: Option<&str>, meta: Option<&str>) -> Value {
    call_tool(
        sc,
        id,
        "echo",
        json!({"text": SECRET_ARGUMENT}),
        header,
        meta,
    )
    .await
}

async fn call_tool(
    sc: &Sidecar,
    id: u64,
    tool: &str,
    arguments: Value,
    header: Option<&str>,
    meta: Option<&str>,
) -> Value {
    let mut body = modern_body(
        json!(id),
        "tools/call",
        json!({"name": tool, "arguments": arguments}),
    );
    if let Some(tp) = meta {
        body["params"]["_meta"]["traceparent"] = json!(tp);
        body["params"]["_meta"]["tracestate"] = json!("vendor=abc");
    }
    let mut req = http().post(sc.url()).body(body.to_string());
    for (k, v) in modern_headers("tools/call", Some(tool)) {
        req = req.header(k, v);
    }
    req = req
        .header("authorization", format!("Bearer {SECRET_TOKEN}"))
        .header("x-user", SECRET_USER_REF);
    if let Some(tp) = header {
        req = req.header("traceparent", tp);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    message_of(resp).await
}

async fn legacy_call(sc: &Sidecar, id: u64, tp: &str) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": SECRET_ARGUMENT}}});
    let resp = http()
        .post(sc.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .header("traceparent", tp)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    message_of(resp).await
}

fn otel_env<'a>(receiver: &'a str, epode: &'a FakeEpode) -> Vec<(&'static str, String)> {
    vec![
        ("EPODE_SIDECAR_OTLP_ENDPOINT", receiver.to_owned()),
        ("EPODE_SIDECAR_OTLP_METRICS_INTERVAL", "1s".to_owned()),
        ("EPODE_API_KEY", epode.product_key().to_owned()),
        ("EPODE_API_URL", epode.url()),
        ("AGENT_FEEDBACK_MODE", "never_ask".to_owned()),
        ("EPODE_SIDECAR_TELEMETRY_FLUSH", "200ms".to_owned()),
        (
            "EPODE_SIDECAR_IDENTITY_HEADERS",
            "userRef=X-User".to_owned(),
        ),
    ]
}

fn refs<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// No span carries what the client sent as a secret or an argument, nor the product key.
async fn assert_nothing_leaked(receiver: &Receiver, product_key: &str, handle: &str) {
    let spans = receiver.spans().await;
    for secret in [
        SECRET_ARGUMENT,
        SECRET_TOKEN,
        SECRET_USER_REF,
        product_key,
        handle,
        "feedbackHandle",
    ] {
        let hex: String = secret.bytes().map(|b| format!("{b:02x}")).collect();
        let sidecar_raw: Vec<&Value> = spans
            .iter()
            .filter(|s| s["resource"]["service.name"] == "epode-sidecar")
            .collect();
        for s in &sidecar_raw {
            assert!(
                !s["raw"].as_str().unwrap_or_default().contains(&hex),
                "{secret} in an export of the sidecar's: {s:#}"
            );
            let mut shown = (*s).clone();
            shown["raw"] = Value::Null;
            assert!(!shown.to_string().contains(secret), "{secret} in {shown:#}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_is_one_trace_from_the_client_through_the_sidecar_to_the_python_server() {
    let receiver = Receiver::start();
    let epode = FakeEpode::start(FakeConfig::default());
    let up = Upstream::start_with(UpstreamKind::Python, &["--otlp", &receiver.url()]);
    let env = otel_env(&receiver.url(), &epode);
    let sc = Sidecar::start(&up.url(), &refs(&env));

    // traceparent in the header.
    let (trace, parent) = trace_ids(1);
    let tp = format!("00-{trace}-{parent}-01");
    let answer = call(&sc, 7, Some(&tp), None).await;
    assert!(
        answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains(SECRET_ARGUMENT),
        "{answer}"
    );
    // The sidecar's server and hop spans, the era probe's and the catalog's, and the Python
    // server's three.
    let spans = receiver.trace(&trace, 7).await;
    let (server, hop) = assert_chain(&spans, &parent, "tcp");
    assert_call_attributes(&server, "2026-07-28", "7", "server span");
    assert_call_attributes(&hop, "2026-07-28", "7", "hop span");
    // The first call found the upstream's era and made the catalog learn the tools: those
    // are requests of the sidecar's own, spans of their own under the call's, and the
    // upstream's spans for them hang from them (not from the client's span).
    for (name, reason) in [("server/discover", "era_probe"), ("tools/list", "catalog")] {
        let own = one(&spans, &format!("the sidecar's {name}"), |s| {
            s["resource"]["service.name"] == "epode-sidecar" && s["name"] == name
        });
        assert_eq!(own["kind"], "SPAN_KIND_CLIENT", "{own:#}");
        assert_eq!(own["parentSpanId"], server["spanId"], "{own:#}");
        assert_eq!(own["attributes"]["epode.reason"], reason, "{own:#}");
        let theirs = one(&spans, &format!("the Python server's {name}"), |s| {
            s["resource"]["service.name"] == "py-upstream" && s["name"] == name
        });
        assert_eq!(theirs["parentSpanId"], own["spanId"], "{theirs:#}");
    }
    assert_eq!(hop["attributes"]["server.address"], "127.0.0.1", "{hop:#}");
    assert_eq!(hop["attributes"]["server.port"], up.port as i64, "{hop:#}");
    assert!(
        server["attributes"].get("mcp.session.id").is_none(),
        "a 2026 request has no session: {server:#}"
    );
    // What the binding did: the decorated call's interaction, as a span event.
    let events: Vec<&str> = server["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        events,
        ["epode.decorated", "epode.interaction"],
        "{server:#}"
    );
    let decorated = &server["events"][0]["attributes"];
    assert_eq!(
        decorated["epode.feedback.state"], "feedback_ready",
        "{server:#}"
    );
    assert_eq!(decorated["epode.feedback.mode"], "never_ask", "{server:#}");
    assert_eq!(server["status"]["code"], "STATUS_CODE_UNSET", "{server:#}");
    let first_call = server["spanId"].as_str().unwrap().to_owned();
    let handle = answer["result"]["structuredContent"]["_agentFeedback"]["feedbackHandle"]
        .as_str()
        .unwrap_or_else(|| panic!("no handle in {answer}"))
        .to_owned();

    // The report, answered by the sidecar: its span, and the call to Epode below it.
    let (trace, parent) = trace_ids(6);
    let report = call_tool(
        &sc,
        12,
        "report_product_feedback",
        json!({"feedbackHandle": handle, "summary": "Echo answered exactly.", "impact": "helped"}),
        Some(&format!("00-{trace}-{parent}-01")),
        None,
    )
    .await;
    assert_eq!(
        report["result"]["structuredContent"]["accepted"], true,
        "{report}"
    );
    let spans = receiver.trace(&trace, 2).await;
    let server = sidecar_span(&spans, "SPAN_KIND_SERVER");
    assert_eq!(
        server["name"], "tools/call report_product_feedback",
        "{server:#}"
    );
    assert_eq!(server["parentSpanId"], parent.as_str(), "{server:#}");
    let epode_call = sidecar_span(&spans, "SPAN_KIND_CLIENT");
    assert_eq!(epode_call["name"], "POST /api/v2/reports", "{epode_call:#}");
    assert_eq!(
        epode_call["parentSpanId"], server["spanId"],
        "{epode_call:#}"
    );
    assert_eq!(
        epode_call["attributes"]["epode.operation"], "report",
        "{epode_call:#}"
    );
    assert_eq!(
        epode_call["attributes"]["http.request.method"], "POST",
        "{epode_call:#}"
    );
    let status = epode_call["attributes"]["http.response.status_code"]
        .as_i64()
        .unwrap_or_default();
    assert!((200..300).contains(&status), "{epode_call:#}");
    let outcomes: Vec<&Value> = server["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "epode.feedback")
        .map(|e| &e["attributes"]["epode.feedback.outcome"])
        .collect();
    assert_eq!(outcomes, [&json!("accepted")], "{server:#}");

    // The telemetry batch that carried the first call's event: its own span, linked to it.
    let deadline = Instant::now() + Duration::from_secs(20);
    let delivery = loop {
        let found = receiver.spans().await.into_iter().find(|s| {
            s["name"] == "epode telemetry delivery"
                && s["links"]
                    .as_array()
                    .is_some_and(|l| l.iter().any(|l| l["spanId"] == first_call.as_str()))
        });
        if let Some(d) = found {
            break d;
        }
        assert!(
            Instant::now() < deadline,
            "no delivery span linked to {first_call}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(delivery["kind"], "SPAN_KIND_CLIENT", "{delivery:#}");
    assert_eq!(delivery["parentSpanId"], "", "a root span: {delivery:#}");
    assert!(
        delivery["attributes"]["epode.telemetry.events"].as_i64() >= Some(1),
        "{delivery:#}"
    );

    // traceparent (and tracestate) in params._meta, the conventions' place.
    let (trace, parent) = trace_ids(2);
    let tp = format!("00-{trace}-{parent}-01");
    call(&sc, 8, None, Some(&tp)).await;
    let spans = receiver.trace(&trace, 3).await;
    let (server, _) = assert_chain(&spans, &parent, "tcp");
    assert_call_attributes(&server, "2026-07-28", "8", "server span (_meta)");

    // A 2025 client, its request translated upstream: the same chain, in its era.
    let (trace, parent) = trace_ids(3);
    let tp = format!("00-{trace}-{parent}-01");
    let answer = legacy_call(&sc, 9, &tp).await;
    assert!(answer.get("result").is_some(), "{answer}");
    let spans = receiver.trace(&trace, 3).await;
    let (server, hop) = assert_chain(&spans, &parent, "tcp");
    assert_call_attributes(&server, "2025-11-25", "9", "server span (2025)");
    assert_call_attributes(&hop, "2025-11-25", "9", "hop span (2025)");

    // A client whose trace is not sampled: the sidecar makes no span of its own either.
    let (trace, parent) = trace_ids(4);
    call(&sc, 10, Some(&format!("00-{trace}-{parent}-00")), None).await;

    // The conventions' duration histograms, over OTLP.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let metrics = receiver.metrics().await;
        let names: Vec<String> = metrics
            .iter()
            .filter(|m| {
                m["points"].as_array().is_some_and(|p| {
                    p.iter().any(|p| {
                        p["attributes"]["mcp.method.name"] == "tools/call"
                            && p["attributes"]["gen_ai.tool.name"] == "echo"
                            && p["attributes"]["mcp.protocol.version"] == "2026-07-28"
                            // Three 2026 calls, the unsampled one counted too.
                            && p["count"].as_u64() >= Some(3)
                    })
                })
            })
            .map(|m| m["name"].as_str().unwrap().to_owned())
            .collect();
        if names.iter().any(|n| n == "mcp.server.operation.duration")
            && names.iter().any(|n| n == "mcp.client.operation.duration")
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "histograms received: {names:?} of {metrics:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let unsampled = receiver
        .spans()
        .await
        .into_iter()
        .filter(|s| s["traceId"] == trace && s["resource"]["service.name"] == "epode-sidecar")
        .count();
    assert_eq!(unsampled, 0, "an unsampled trace got the sidecar's spans");
    // The ref did travel, to Epode, where it belongs.
    let events = epode.events();
    assert!(
        events
            .iter()
            .any(|e| e.to_string().contains(SECRET_USER_REF)),
        "the identity ref reached Epode: {events:?}"
    );
    assert_nothing_leaked(&receiver, epode.product_key(), &handle).await;
    assert!(metric(&sc, "epode_sidecar_otlp_exported_total{signal=\"traces\"}").await >= 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_child_continues_the_trace_over_its_pipe() {
    let receiver = Receiver::start();
    let py = python();
    let server = repo_root().join("tests/peers/py_server.py");
    let url = receiver.url();
    let sc = Sidecar::start_stdio(
        &[
            py.to_str().unwrap(),
            server.to_str().unwrap(),
            "--stdio",
            "--otlp",
            &url,
        ],
        &[
            ("EPODE_SIDECAR_OTLP_ENDPOINT", &url),
            ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28"),
        ],
    );
    let (trace, parent) = trace_ids(5);
    call(&sc, 11, Some(&format!("00-{trace}-{parent}-01")), None).await;
    let spans = receiver.trace(&trace, 3).await;
    let server = sidecar_span(&spans, "SPAN_KIND_SERVER");
    let hop = sidecar_span(&spans, "SPAN_KIND_CLIENT");
    let py = python_span(&spans);
    assert_eq!(server["parentSpanId"], parent.as_str());
    assert_eq!(hop["parentSpanId"], server["spanId"]);
    assert_eq!(py["parentSpanId"], hop["spanId"], "{py:#}");
    assert_call_attributes(server, "2026-07-28", "11", "server span (stdio)");
    assert_eq!(hop["attributes"]["network.transport"], "pipe", "{hop:#}");
    assert!(hop["attributes"].get("server.address").is_none(), "{hop:#}");
}

/// A client's `server/discover` goes upstream as a request of the sidecar's own: a client span
/// of its own under the request's server span, from which the upstream's span hangs (before,
/// the upstream's hung from the client's span, beside the sidecar's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxied_discovery_is_a_span_of_the_sidecars_own() {
    let receiver = Receiver::start();
    let up = Upstream::start_with(UpstreamKind::Python, &["--otlp", &receiver.url()]);
    let sc = Sidecar::start(
        &up.url(),
        &[("EPODE_SIDECAR_OTLP_ENDPOINT", &receiver.url())],
    );
    let (trace, parent) = trace_ids(60);
    let mut req = http()
        .post(sc.url())
        .header("traceparent", format!("00-{trace}-{parent}-01"))
        .body(modern_body(json!(1), "server/discover", json!({})).to_string());
    for (k, v) in modern_headers("server/discover", None) {
        req = req.header(k, v);
    }
    let msg = message_of(req.send().await.unwrap()).await;
    assert!(msg["result"]["supportedVersions"].is_array(), "{msg}");
    let spans = receiver.trace(&trace, 3).await;
    let server = sidecar_span(&spans, "SPAN_KIND_SERVER");
    assert_eq!(server["parentSpanId"], parent.as_str(), "{server:#}");
    let own = sidecar_span(&spans, "SPAN_KIND_CLIENT");
    assert_eq!(own["name"], "server/discover", "{own:#}");
    assert_eq!(own["parentSpanId"], server["spanId"], "{own:#}");
    assert_eq!(own["attributes"]["epode.reason"], "discover", "{own:#}");
    let theirs = one(&spans, "the Python server's span", |s| {
        s["resource"]["service.name"] == "py-upstream"
    });
    assert_eq!(theirs["parentSpanId"], own["spanId"], "{theirs:#}");
}

/// 200 calls, each checked; how long they took.
async fn calls(sc: &Sidecar, n: u64) -> Duration {
    let t = Instant::now();
    for i in 0..n {
        let (trace, parent) = trace_ids((i % 200) as u8);
        let answer = call(sc, 1000 + i, Some(&format!("00-{trace}-{parent}-01")), None).await;
        assert!(answer.get("result").is_some(), "{answer}");
    }
    t.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_down_hanging_or_refusing_never_touches_a_call() {
    let receiver = Receiver::start();
    let up = Upstream::start(UpstreamKind::PythonJson);
    let url = receiver.url();
    let sc = Sidecar::start(
        &up.url(),
        &[
            ("EPODE_SIDECAR_OTLP_ENDPOINT", &url),
            ("EPODE_SIDECAR_OTLP_QUEUE", "16"),
            ("EPODE_SIDECAR_OTLP_TIMEOUT", "300ms"),
            ("EPODE_SIDECAR_OTLP_METRICS_INTERVAL", "1s"),
        ],
    );
    let healthy = calls(&sc, 100).await;
    assert!(
        eventually_async(Duration::from_secs(10), || async {
            metric(&sc, "epode_sidecar_otlp_exported_total{signal=\"traces\"}").await >= 200
        })
        .await
    );
    for mode in ["hang", "500", "429", "drop"] {
        receiver.mode(mode).await;
        let failed_before = metric(
            &sc,
            "epode_sidecar_otlp_export_failed_total{signal=\"traces\"}",
        )
        .await;
        let took = calls(&sc, 100).await;
        eprintln!("100 calls with the collector {mode}: {took:?} (healthy: {healthy:?})");
        assert!(
            took < healthy * 3 + Duration::from_secs(2),
            "{mode}: 100 calls took {took:?}, {healthy:?} with a healthy collector"
        );
        let grew = eventually_async(Duration::from_secs(10), || async {
            metric(
                &sc,
                "epode_sidecar_otlp_export_failed_total{signal=\"traces\"}",
            )
            .await
                > failed_before
        })
        .await;
        assert!(grew, "{mode}: no failed export counted");
    }
    // 500 spans made while the collector failed; the queue held at most 16 of them at a time.
    let dropped = metric(&sc, "epode_sidecar_otlp_dropped_total{signal=\"traces\"}").await;
    assert!(dropped >= 100, "dropped {dropped}");
    // The collector gone altogether.
    drop(receiver);
    let took = calls(&sc, 100).await;
    eprintln!("100 calls with the collector gone: {took:?} (healthy: {healthy:?})");
    assert!(
        took < healthy * 3 + Duration::from_secs(2),
        "down: {took:?} vs {healthy:?}"
    );
}

#[tokio::test]
async fn off_by_default_no_span_is_made() {
    let up = Upstream::start(UpstreamKind::PythonJson);
    let sc = Sidecar::start(&up.url(), &[]);
    let (trace, parent) = trace_ids(9);
    call(&sc, 1, Some(&format!("00-{trace}-{parent}-01")), None).await;
    let text = crate::support::metrics_text(&sc).await;
    assert!(!text.contains("otlp_exported_total{"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_surface_route_is_an_http_server_span_whose_context_reaches_the_app() {
    let receiver = Receiver::start();
    let app = crate::http_surface::App::start(false);
    // The specification's per-signal endpoint alone: tracing on, used as it is.
    let url = format!("{}/v1/traces", receiver.url());
    let sc = Sidecar::start(
        &app.origin(),
        &[
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &url),
            ("EPODE_SIDECAR_HTTP_SURFACE", "on"),
        ],
    );
    let (trace, parent) = trace_ids(20);
    let resp = http()
        .get(format!("{}/echo?q={SECRET_ARGUMENT}", sc.base()))
        .header("traceparent", format!("00-{trace}-{parent}-01"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let echo: Value = resp.json().await.unwrap();
    let spans = receiver.trace(&trace, 1).await;
    let span = sidecar_span(&spans, "SPAN_KIND_SERVER");
    assert_eq!(span["name"], "GET", "{span:#}");
    assert_eq!(span["parentSpanId"], parent.as_str(), "{span:#}");
    let a = &span["attributes"];
    assert_eq!(a["http.request.method"], "GET", "{span:#}");
    assert_eq!(a["url.path"], "/echo", "{span:#}");
    assert_eq!(a["url.scheme"], "http", "{span:#}");
    assert!(a.get("http.route").is_none(), "{span:#}");
    assert_eq!(a["http.response.status_code"], 200, "{span:#}");
    assert!(
        !span.to_string().contains(SECRET_ARGUMENT),
        "the query in a span: {span:#}"
    );
    // The app got the sidecar's span as its parent.
    let sent = echo["headers"]["traceparent"].as_str().unwrap_or_default();
    assert_eq!(
        sent,
        format!("00-{trace}-{}-01", span["spanId"].as_str().unwrap()),
        "{echo}"
    );
}

/// A `/metrics` exposition as the official Prometheus Python client parses it
/// (`tests/peers/metrics_parse.py`, `format` openmetrics or prometheus).
fn parse_metrics(format: &str, text: &str) -> Value {
    use std::io::Write as _;
    let mut child = Command::new(python())
        .arg(repo_root().join("tests/peers/metrics_parse.py"))
        .arg(format)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the {format} parser refused /metrics: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A metric the receiver got, by name (the last export's).
fn received<'a>(metrics: &'a [Value], name: &str) -> Option<&'a Value> {
    metrics.iter().rev().find(|m| m["name"] == name)
}

/// With the default `EPODE_SIDECAR_OTLP_METRICS=all`, every `/metrics` family arrives over
/// OTLP under its `/metrics` name, each as its OTLP kind, with the values `/metrics` shows; the
/// request duration's exemplar is a sampled call's trace and span, on `/metrics` too when the
/// scraper asks for OpenMetrics. With `conventions`, only the MCP histograms arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_families_go_over_otlp_with_their_exemplars() {
    let receiver = Receiver::start();
    let epode = FakeEpode::start(FakeConfig::default());
    let up = Upstream::start(UpstreamKind::PythonJson);
    let mut env = otel_env(&receiver.url(), &epode);
    env.push(("EPODE_SIDECAR_ADMIN_LISTEN", "127.0.0.1:0".to_owned()));
    let sc = Sidecar::start(&up.url(), &refs(&env));
    let admin_metrics = format!("http://{}/metrics", sc.admin.unwrap());
    let (trace, parent) = trace_ids(30);
    call(&sc, 1, Some(&format!("00-{trace}-{parent}-01")), None).await;
    // Three calls whose client's trace is not sampled: no exemplar of theirs.
    for id in 2..=4 {
        let (t, p) = trace_ids(30 + id as u8);
        call(&sc, id, Some(&format!("00-{t}-{p}-00")), None).await;
    }
    let spans = receiver.trace(&trace, 2).await;
    let server = sidecar_span(&spans, "SPAN_KIND_SERVER");
    let span_id = server["spanId"].as_str().unwrap().to_owned();

    // The counters as /metrics shows them, then over OTLP (the same value, once an export
    // after the fourth call has come).
    let text = http()
        .get(&admin_metrics)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = r#"epode_sidecar_requests_total{method="tools/call",era="2026-07-28",status="200"}"#;
    assert_eq!(crate::support::metric_value(&text, line), 4, "{text}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let metrics = loop {
        let metrics = receiver.metrics().await;
        let calls = received(&metrics, "epode_sidecar_requests_total").and_then(|m| {
            m["points"].as_array().unwrap().iter().find(|p| {
                p["attributes"]["method"] == "tools/call" && p["attributes"]["status"] == "200"
            })?["value"]
                .as_f64()
        });
        if calls == Some(4.0) {
            break metrics;
        }
        assert!(
            Instant::now() < deadline,
            "tools/call count over OTLP: {calls:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let requests = received(&metrics, "epode_sidecar_requests_total").unwrap();
    assert_eq!(
        requests["scope"], "epode-sidecar.prometheus",
        "{requests:#}"
    );
    assert_eq!(requests["kind"], "sum", "{requests:#}");
    assert_eq!(requests["monotonic"], true, "{requests:#}");
    assert_eq!(
        requests["temporality"], "AGGREGATION_TEMPORALITY_CUMULATIVE",
        "{requests:#}"
    );
    let point = &requests["points"][0];
    assert_eq!(point["attributes"]["era"], "2026-07-28", "{requests:#}");
    assert!(point["startNs"].as_u64() > Some(0), "{requests:#}");
    // Every family of /metrics is there, by its name.
    let families: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    assert!(families.len() > 30, "{families:?}");
    for family in &families {
        assert!(
            received(&metrics, family).is_some(),
            "{family} of /metrics did not arrive over OTLP"
        );
    }
    let gauge = received(&metrics, "epode_sidecar_open_connections").unwrap();
    assert_eq!(gauge["kind"], "gauge", "{gauge:#}");
    // The histogram: each bucket's own count, the four calls, and the sampled call's exemplar.
    let duration = received(&metrics, "epode_sidecar_request_duration_seconds").unwrap();
    assert_eq!(duration["kind"], "histogram", "{duration:#}");
    let point = duration["points"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["attributes"]["method"] == "tools/call")
        .unwrap();
    assert_eq!(point["count"], 4, "{point:#}");
    let counts: u64 = point["bucketCounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_u64().unwrap())
        .sum();
    assert_eq!(counts, 4, "{point:#}");
    assert_eq!(
        point["bucketCounts"].as_array().unwrap().len(),
        point["bounds"].as_array().unwrap().len() + 1,
        "{point:#}"
    );
    let exemplars = point["exemplars"].as_array().unwrap();
    assert_eq!(exemplars.len(), 1, "one call was sampled: {point:#}");
    assert_eq!(exemplars[0]["traceId"], trace.as_str(), "{point:#}");
    assert_eq!(exemplars[0]["spanId"], span_id.as_str(), "{point:#}");
    // The conventions' histograms come in the same export.
    assert!(received(&metrics, "mcp.server.operation.duration").is_some());

    // /metrics: the Prometheus text format by default (no exemplar), OpenMetrics with the
    // exemplar when asked for.
    assert!(
        !text.contains(&trace),
        "an exemplar in the Prometheus text format"
    );
    let resp = http()
        .get(&admin_metrics)
        .header(
            "accept",
            "application/openmetrics-text;version=1.0.0;q=0.9,text/plain;q=0.5",
        )
        .send()
        .await
        .unwrap();
    let content_type = resp.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    let open = resp.text().await.unwrap();
    // Both formats as the official Prometheus client's parsers read them: the same families,
    // and the sampled call's exemplar on a request duration bucket in OpenMetrics.
    let om = parse_metrics("openmetrics", &open);
    let prom = parse_metrics("prometheus", &text);
    assert_eq!(om["families"], prom["families"], "the two formats differ");
    assert_eq!(
        om["families"]["epode_sidecar_request_duration_seconds"], "histogram",
        "{om}"
    );
    let with_exemplar: Vec<&Value> = om["samples"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| !s["exemplar"].is_null())
        .collect();
    assert_eq!(with_exemplar.len(), 1, "{with_exemplar:#?}");
    let bucket = with_exemplar[0];
    assert_eq!(
        bucket["name"], "epode_sidecar_request_duration_seconds_bucket",
        "{bucket:#}"
    );
    assert_eq!(bucket["labels"]["method"], "tools/call", "{bucket:#}");
    let labels = &bucket["exemplar"]["labels"];
    assert_eq!(labels["trace_id"], trace.as_str(), "{bucket:#}");
    assert_eq!(labels["span_id"], span_id.as_str(), "{bucket:#}");

    // Nothing a client sent as a secret is in any metrics export.
    let raw: Vec<Value> = receiver.list("/metrics-raw").await;
    let raw: String = raw.iter().filter_map(|r| r.as_str()).collect();
    for secret in [
        SECRET_ARGUMENT,
        SECRET_TOKEN,
        SECRET_USER_REF,
        epode.product_key(),
    ] {
        let hex: String = secret.bytes().map(|b| format!("{b:02x}")).collect();
        assert!(!raw.contains(&hex), "{secret} in a metrics export");
    }
    drop(sc);

    // conventions: the MCP histograms only.
    let receiver = Receiver::start();
    let mut env = otel_env(&receiver.url(), &epode);
    env.push(("EPODE_SIDECAR_OTLP_METRICS", "conventions".to_owned()));
    let sc = Sidecar::start(&up.url(), &refs(&env));
    call(&sc, 1, None, None).await;
    let arrived = eventually_async(Duration::from_secs(20), || async {
        let metrics = receiver.metrics().await;
        received(&metrics, "mcp.server.operation.duration").is_some()
    })
    .await;
    assert!(arrived, "the histograms did not arrive over OTLP");
    let names: Vec<String> = receiver
        .metrics()
        .await
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        names.iter().all(|n| n.starts_with("mcp.")),
        "conventions sent more: {names:?}"
    );
    // /metrics on the MCP port (no admin listener), which clients reach: never OpenMetrics,
    // so no exemplar names another client's trace there.
    let (trace, parent) = trace_ids(35);
    call(&sc, 2, Some(&format!("00-{trace}-{parent}-01")), None).await;
    let resp = http()
        .get(format!("{}/metrics", sc.base()))
        .header("accept", "application/openmetrics-text;version=1.0.0")
        .send()
        .await
        .unwrap();
    let content_type = resp.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    let text = resp.text().await.unwrap();
    assert!(
        text.contains("epode_sidecar_request_duration_seconds_bucket"),
        "{text}"
    );
    assert!(
        !text.contains(&trace),
        "a trace id on the MCP port's /metrics"
    );
}

/// POSTs `body` as `content_type` to `url` (with `traceparent` when given): the status.
async fn post_raw(url: &str, content_type: &str, body: &'static str, tp: Option<&str>) -> u16 {
    let mut req = http()
        .post(url)
        .header("content-type", content_type)
        .header("accept", "application/json, text/event-stream")
        .body(body);
    if let Some(tp) = tp {
        req = req.header("traceparent", tp);
    }
    req.send().await.unwrap().status().as_u16()
}

/// A request refused before the front door admitted it (a message that is not JSON-RPC, a
/// `Content-Type` that is not JSON) is an HTTP server span by the HTTP conventions, under the
/// client's `traceparent`: its status, the MCP path as its route, no error status for a 4xx;
/// one with no trace context starts no trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_before_the_front_door_admits_it_is_an_http_server_span() {
    let receiver = Receiver::start();
    let up = Upstream::start(UpstreamKind::PythonJson);
    let url = receiver.url();
    let sc = Sidecar::start(&up.url(), &[("EPODE_SIDECAR_OTLP_ENDPOINT", &url)]);
    // The start says OpenTelemetry is on, and where its spans go.
    let traces = format!("{}/v1/traces", url.trim_end_matches('/'));
    assert!(
        crate::support::eventually(Duration::from_secs(10), || sc
            .logs()
            .iter()
            .any(|l| l.contains("OpenTelemetry on") && l.contains(&traces))),
        "{:#?}",
        sc.logs()
    );
    // Refusals with no trace context start no trace: sent first, they would be exported
    // before the ones below.
    for _ in 0..3 {
        assert_eq!(
            post_raw(&sc.url(), "application/json", "{not json", None).await,
            400
        );
    }
    for (n, content_type, body, status) in [
        (50, "application/json", "{not json", 400),
        (51, "text/plain", "{}", 415),
    ] {
        let (trace, parent) = trace_ids(n);
        let tp = format!("00-{trace}-{parent}-01");
        assert_eq!(
            post_raw(&sc.url(), content_type, body, Some(&tp)).await,
            status
        );
        let spans = receiver.trace(&trace, 1).await;
        let span = sidecar_span(&spans, "SPAN_KIND_SERVER");
        assert_eq!(span["name"], "POST /mcp", "{span:#}");
        assert_eq!(span["parentSpanId"], parent.as_str(), "{span:#}");
        let a = &span["attributes"];
        assert_eq!(a["http.request.method"], "POST", "{span:#}");
        assert_eq!(a["http.route"], "/mcp", "{span:#}");
        assert_eq!(a["url.path"], "/mcp", "{span:#}");
        assert_eq!(a["url.scheme"], "http", "{span:#}");
        assert_eq!(a["http.response.status_code"], status, "{span:#}");
        assert_eq!(span["status"]["code"], "STATUS_CODE_UNSET", "{span:#}");
    }
    let refusals = receiver
        .spans()
        .await
        .into_iter()
        .filter(|s| s["name"] == "POST /mcp")
        .count();
    assert_eq!(refusals, 2, "a refusal with no trace context was spanned");
}

/// A 2025-era `tools/call` of `tool` (no `Mcp-Name` header: any length goes), id `id`: its
/// status.
async fn legacy_named_call(sc: &Sidecar, id: &str, tool: &str) -> u16 {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": tool, "arguments": {}}});
    http()
        .post(sc.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .header(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
        .body(body.to_string())
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// A 2025 upstream that answers every call (whatever its tool's name).
fn answering_2025() -> crate::support::Scripted {
    use crate::support::scripted::{Reply, ScriptedUpstream};
    ScriptedUpstream::new()
        .when(|r| r.json.get("id").is_none(), Reply::empty(202))
        .on(
            "initialize",
            Reply::result(
                json!({"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                "serverInfo": {"name": "any", "version": "1"}}),
            ),
        )
        .otherwise(Reply::result(
            json!({"content": [{"type": "text", "text": "done"}]}),
        ))
        .start()
}

/// What a client names (a tool, a method, its request id) reaches a span cut to a bound, and a
/// histogram only when the catalogue or the upstream's list names it (anything else is
/// `other`): distinct 100 KB tool names and methods make no span larger and no new series.
/// Before, span names and attributes took them whole, and each became an attribute set the
/// histograms kept for the life of the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_strings_are_bounded_in_spans_and_never_series() {
    let receiver = Receiver::start();
    let up = answering_2025();
    let url = receiver.url();
    let sc = Sidecar::start(
        &up.url(),
        &[
            ("EPODE_SIDECAR_OTLP_ENDPOINT", &url),
            ("EPODE_SIDECAR_OTLP_METRICS_INTERVAL", "1s"),
            ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2025-11-25"),
        ],
    );
    for i in 0..10 {
        let tool = format!("{i}{}", "t".repeat(100 * 1024));
        let id = format!("{i}{}", "i".repeat(100 * 1024));
        assert_eq!(legacy_named_call(&sc, &id, &tool).await, 200);
    }
    let got = eventually_async(Duration::from_secs(20), || async {
        receiver
            .spans()
            .await
            .iter()
            .filter(|s| s["resource"]["service.name"] == "epode-sidecar")
            .count()
            >= 20
    })
    .await;
    assert!(got, "the spans did not arrive");
    for s in receiver
        .spans()
        .await
        .iter()
        .filter(|s| s["resource"]["service.name"] == "epode-sidecar")
    {
        let name = s["name"].as_str().unwrap();
        assert!(name.len() <= 600, "a span named {} bytes", name.len());
        for (k, v) in s["attributes"].as_object().unwrap() {
            let len = v.as_str().map_or(0, str::len);
            assert!(len <= 1100, "{k}: {len} bytes");
        }
    }
    // The histograms: every tool here is `other`, and the methods are the catalogue's.
    let settled = eventually_async(Duration::from_secs(20), || async {
        receiver.metrics().await.iter().any(|m| {
            m["name"] == "mcp.server.operation.duration"
                && m["points"].as_array().is_some_and(|p| {
                    p.iter().any(|p| {
                        p["count"].as_u64() >= Some(10)
                            && p["attributes"]["gen_ai.tool.name"] == "other"
                    })
                })
        })
    })
    .await;
    assert!(settled, "{:#?}", receiver.metrics().await);
    for m in receiver.metrics().await {
        if !m["name"].as_str().unwrap().starts_with("mcp.") {
            continue;
        }
        for p in m["points"].as_array().unwrap() {
            for (k, v) in p["attributes"].as_object().unwrap() {
                let len = v.as_str().map_or(0, str::len);
                assert!(len <= 64, "{}: {k} is {len} bytes", m["name"]);
            }
        }
    }
}

/// 100 calls naming 1 MB tools while the collector hangs: the sidecar stays within its memory
/// budget plus 32 MB (before, the queued spans held every name: 15 → 355 MB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_collector_and_megabyte_names_stay_within_the_budget() {
    let receiver = Receiver::start();
    receiver.mode("hang").await;
    let up = answering_2025();
    let url = receiver.url();
    let sc = Sidecar::start(
        &up.url(),
        &[
            ("EPODE_SIDECAR_OTLP_ENDPOINT", &url),
            ("EPODE_SIDECAR_MEMORY_BUDGET_BYTES", "16777216"),
            ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2025-11-25"),
        ],
    );
    for i in 0..100 {
        let tool = format!("{i}{}", "t".repeat(1024 * 1024));
        assert_eq!(legacy_named_call(&sc, &i.to_string(), &tool).await, 200);
    }
    let peak = crate::support::status_kib(sc.pid(), "VmHWM");
    assert!(
        peak < 16 * 1024 + 32 * 1024,
        "peak RSS {peak} KiB after 100 calls naming 1 MB tools"
    );
}

/// A flood of refusals, each with a sampled trace context, never crowds the spans of the
/// requests that were served out of the span queue: every one of 20 calls made during 2,000
/// refusals is exported (before, none of them was).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_refusals_never_crowds_out_the_served_requests_spans() {
    use futures_util::stream::StreamExt as _;
    let receiver = Receiver::start();
    let up = Upstream::start(UpstreamKind::PythonJson);
    let url = receiver.url();
    let sc = Sidecar::start(
        &up.url(),
        &[
            ("EPODE_SIDECAR_OTLP_ENDPOINT", &url),
            ("EPODE_SIDECAR_OTLP_QUEUE", "64"),
            ("EPODE_SIDECAR_OTLP_METRICS", "off"),
        ],
    );
    let flood = futures_util::stream::iter(0..2000u32)
        .map(|i| {
            let url = sc.url();
            async move {
                let tp = format!("00-{:032x}-{:016x}-01", 0xdead_0000_u128 + u128::from(i), 7);
                assert_eq!(
                    post_raw(&url, "text/plain", "not json", Some(&tp)).await,
                    415
                );
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>();
    let served = async {
        let mut traces = Vec::new();
        for i in 0..20u8 {
            let (trace, parent) = trace_ids(100 + i);
            call(
                &sc,
                5000 + u64::from(i),
                Some(&format!("00-{trace}-{parent}-01")),
                None,
            )
            .await;
            traces.push(trace);
        }
        traces
    };
    let ((), traces) = futures_util::join!(async { drop(flood.await) }, served);
    let arrived = eventually_async(Duration::from_secs(20), || async {
        let spans = receiver.spans().await;
        traces.iter().all(|t| {
            spans.iter().any(|s| {
                &s["traceId"] == t
                    && s["kind"] == "SPAN_KIND_SERVER"
                    && s["resource"]["service.name"] == "epode-sidecar"
            })
        })
    })
    .await;
    let spans = receiver.spans().await;
    let exported = traces
        .iter()
        .filter(|t| {
            spans
                .iter()
                .any(|s| &s["traceId"] == *t && s["kind"] == "SPAN_KIND_SERVER")
        })
        .count();
    assert!(
        arrived,
        "{exported} of 20 served requests' spans exported during the flood"
    );
}
