//! What an operator sees: metrics on the admin listener (never on the MCP port when it is
//! set), one access-log line per request with nothing private in it, and W3C trace context
//! carried to the upstream.

mod support;

use std::io::Write as _;
use std::net::TcpStream;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use support::fake_epode::{FakeConfig, FakeEpode, DEMO_PRODUCT_KEY};
use support::*;

/// Every request an upstream saw: its head (lowercase) and its body.
type Seen = Arc<Mutex<Vec<(String, Value)>>>;

/// A 2026 upstream that keeps every request's head and body.
fn recording_upstream() -> (RawUpstream, Seen) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let up = RawUpstream::start(move |mut s: TcpStream| {
        while let Some((head, body)) = read_http_request(&mut s) {
            let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            s2.lock()
                .unwrap()
                .push((head.to_ascii_lowercase(), req.clone()));
            let result = if req["method"] == "tools/list" {
                json!({"tools": [{"name": "lookup", "inputSchema": {"type": "object"}}]})
            } else {
                json!({"content": [{"type": "text", "text": "secret-result-text"}],
                       "_meta": {"ai.epode/identity": {"accountRef": "acct_secret_ref"}}})
            };
            let reply = json!({"jsonrpc": "2.0", "id": req["id"], "result": result}).to_string();
            let _ = write!(s, "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{reply}", reply.len());
        }
    });
    (up, seen)
}

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[tokio::test]
async fn metrics_live_on_the_admin_listener_with_help_lines() {
    let (up, _) = recording_upstream();
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let sc = feedback_sidecar(
        &up.url(),
        &epode,
        "never_ask",
        &[
            ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28"),
            ("EPODE_SIDECAR_ADMIN_LISTEN", "127.0.0.1:0"),
        ],
    );
    let admin = sc.admin.expect("the admin listener");
    let body = modern_body(
        json!(1),
        "tools/call",
        json!({"name": "lookup", "arguments": {}}),
    );
    assert_eq!(
        post_modern(&sc.url(), "tools/call", Some("lookup"), &body)
            .await
            .status(),
        200
    );
    let unknown = modern_body(json!(2), "nope/nope", json!({}));
    let _ = post_modern(&sc.url(), "nope/nope", None, &unknown).await;
    // Not on the MCP port.
    let on_mcp = http()
        .get(format!("{}/metrics", sc.base()))
        .send()
        .await
        .unwrap();
    assert_eq!(on_mcp.status(), 404);
    let resp = http()
        .get(format!("http://{admin}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    let text = resp.text().await.unwrap();
    for family in [
        "epode_sidecar_requests_total",
        "epode_sidecar_request_duration_seconds",
        "epode_sidecar_upstream_duration_seconds",
        "epode_sidecar_decorations_total",
        "epode_sidecar_feedback_tool_calls_total",
        "epode_sidecar_limits_hit_total",
        "epode_sidecar_open_connections",
        "epode_sidecar_in_flight_requests",
        "epode_sidecar_buffered_bytes",
        "epode_sidecar_telemetry_queue_depth",
        "epode_sidecar_telemetry_delivered_total",
        "epode_sidecar_telemetry_dropped_total",
    ] {
        assert!(
            text.contains(&format!("# HELP {family} ")),
            "no HELP for {family}\n{text}"
        );
    }
    assert!(
        text.contains(
            r#"epode_sidecar_requests_total{method="tools/call",era="2026-07-28",status="200"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains(r#"method="other""#),
        "an unknown method is counted as other: {text}"
    );
    assert!(
        !text.contains("nope/nope"),
        "a client's method name became a series"
    );
    assert!(
        text.contains(
            r#"epode_sidecar_decorations_total{mode="never_ask",state="feedback_ready"} 1"#
        ),
        "{text}"
    );
    for probe in ["healthz", "readyz"] {
        let r = http()
            .get(format!("http://{admin}/{probe}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{probe}");
    }
}

#[tokio::test]
async fn one_access_line_per_request_with_nothing_private() {
    let (up, _) = recording_upstream();
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let sc = feedback_sidecar(
        &up.url(),
        &epode,
        "never_ask",
        &[("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28")],
    );
    let body = modern_body(
        json!("c1"),
        "tools/call",
        json!({"name": "lookup", "arguments": {"query": "secret-argument"}}),
    );
    let resp = post_modern(&sc.url(), "tools/call", Some("lookup"), &body).await;
    let answer: Value = resp.json().await.unwrap();
    let handle = answer["result"]["structuredContent"]["_agentFeedback"]["feedbackHandle"]
        .as_str()
        .unwrap()
        .to_owned();
    let report = modern_body(
        json!("r1"),
        "tools/call",
        json!({"name": "report_product_feedback",
        "arguments": {"feedbackHandle": handle, "summary": "A sound product run."}}),
    );
    let _ = post_modern(
        &sc.url(),
        "tools/call",
        Some("report_product_feedback"),
        &report,
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let logs = sc.logs();
    let access: Vec<&String> = logs
        .iter()
        .filter(|l| l.contains("epode_sidecar::access"))
        .collect();
    assert_eq!(access.len(), 2, "{access:?}");
    for line in &access {
        assert!(
            line.contains("method=\"tools/call\"")
                && line.contains("status=200")
                && line.contains("duration_ms="),
            "{line}"
        );
    }
    for secret in [
        DEMO_PRODUCT_KEY,
        handle.as_str(),
        "acct_secret_ref",
        "secret-argument",
        "secret-result-text",
    ] {
        assert!(
            !logs.iter().any(|l| l.contains(secret)),
            "{secret} reached the log"
        );
    }
}

#[tokio::test]
async fn trace_context_reaches_the_upstream_in_the_header_and_in_meta() {
    let (up, seen) = recording_upstream();
    let sc = Sidecar::start(
        &up.url(),
        &[("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28")],
    );
    // In the header only: copied into params._meta.
    let body = modern_body(json!(1), "tools/list", json!({}));
    let mut req = http()
        .post(sc.url())
        .body(body.to_string())
        .header("traceparent", TRACEPARENT);
    for (k, v) in modern_headers("tools/list", None) {
        req = req.header(k, v);
    }
    assert_eq!(req.send().await.unwrap().status(), 200);
    // In _meta only: copied into the header.
    let mut body = modern_body(json!(2), "tools/list", json!({}));
    body["params"]["_meta"]["traceparent"] = json!(TRACEPARENT);
    assert_eq!(
        post_modern(&sc.url(), "tools/list", None, &body)
            .await
            .status(),
        200
    );
    let seen = seen.lock().unwrap();
    let (head, req) = &seen[0];
    assert!(
        head.contains(&format!("traceparent: {TRACEPARENT}")),
        "{head}"
    );
    assert_eq!(req["params"]["_meta"]["traceparent"], TRACEPARENT, "{req}");
    let (head, _) = &seen[1];
    assert!(
        head.contains(&format!("traceparent: {TRACEPARENT}")),
        "{head}"
    );
}

/// `epode-sidecar healthcheck` (the image's `HEALTHCHECK`): 0 while the sidecar answers, 1
/// with the reason when it does not; `--ready` follows `/readyz`.
#[test]
fn the_healthcheck_subcommand_probes_the_running_sidecar() {
    let (up, _) = recording_upstream();
    let sc = Sidecar::start(
        &up.url(),
        &[
            ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28"),
            ("EPODE_SIDECAR_ADMIN_LISTEN", "127.0.0.1:0"),
        ],
    );
    let admin = sc.admin.expect("the admin listener").to_string();
    let probe = |env: &[(&str, &str)], args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_epode-sidecar"))
            .arg("healthcheck")
            .args(args)
            .env_clear()
            .envs(env.iter().copied())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let listen = sc.addr.to_string();
    assert_eq!(
        probe(&[("EPODE_SIDECAR_ADMIN_LISTEN", &admin)], &[]).0,
        Some(0)
    );
    assert_eq!(
        probe(&[("EPODE_SIDECAR_LISTEN", &listen)], &["--ready"]).0,
        Some(0)
    );
    let url = format!("http://{listen}");
    assert_eq!(probe(&[], &["--url", &url]).0, Some(0));
    drop(sc);
    let (code, why) = probe(&[("EPODE_SIDECAR_LISTEN", &listen)], &[]);
    assert_eq!(code, Some(1));
    assert!(why.contains("refused"), "{why}");
}
