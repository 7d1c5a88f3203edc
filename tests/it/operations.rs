//! What an operator sees: metrics on the admin listener (never on the MCP port when it is
//! set), one access-log line per request when it is on, with nothing private in it, and W3C trace context
//! carried to the upstream.

use std::time::Duration;

use crate::support::fake_epode::{FakeConfig, FakeEpode, DEMO_PRODUCT_KEY};
use crate::support::*;
use serde_json::{json, Value};

/// A 2026 upstream that lists `lookup`, whose calls answer private text and identity.
fn lookup_upstream() -> Scripted {
    ScriptedUpstream::new()
        .on(
            "tools/list",
            Reply::result(
                json!({"tools": [{"name": "lookup", "inputSchema": {"type": "object"}}]}),
            ),
        )
        .otherwise(Reply::result(
            json!({"content": [{"type": "text", "text": "secret-result-text"}],
                   "_meta": {"ai.epode/identity": {"accountRef": "acct_secret_ref"}}}),
        ))
        .start()
}

/// A never_ask sidecar (2026 upstream, `lookup_upstream`) with `env` too, and its Epode.
fn lookup_sidecar(env: &[(&str, &str)]) -> (Scripted, FakeEpode, Sidecar) {
    let up = lookup_upstream();
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let mut all = vec![("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28")];
    all.extend_from_slice(env);
    let sc = feedback_sidecar(&up.url(), &epode, "never_ask", &all);
    (up, epode, sc)
}

/// One `tools/call` of `lookup` with `arguments`.
async fn call_lookup(sc: &Sidecar, id: Value, arguments: Value) -> reqwest::Response {
    let body = modern_body(
        id,
        "tools/call",
        json!({"name": "lookup", "arguments": arguments}),
    );
    post_modern(&sc.url(), "tools/call", Some("lookup"), &body).await
}

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[tokio::test]
async fn metrics_live_on_the_admin_listener_with_help_lines() {
    let (_up, _epode, sc) = lookup_sidecar(&[("EPODE_SIDECAR_ADMIN_LISTEN", "127.0.0.1:0")]);
    let admin = sc.admin.expect("the admin listener");
    assert_eq!(call_lookup(&sc, json!(1), json!({})).await.status(), 200);
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

/// Without `EPODE_SIDECAR_ACCESS_LOG`, no access line is written, even at the INFO level the
/// other lines are written at (off by default, as in the mesh sidecars).
#[tokio::test]
async fn the_access_log_is_off_by_default() {
    let (_up, epode, sc) = lookup_sidecar(&[("EPODE_SIDECAR_LOG", "info")]);
    let resp = call_lookup(&sc, json!("c1"), json!({"query": "q"})).await;
    assert_eq!(resp.status(), 200);
    let _ = resp.bytes().await.unwrap();
    // The call's telemetry is delivered after the answer: once Epode has it, the request's
    // end (where an access line would be written) is long past.
    assert!(
        eventually(Duration::from_secs(10), || !epode.events().is_empty()),
        "the call's event never reached Epode"
    );
    let logs = sc.logs();
    assert!(
        logs.iter().any(|l| l.contains(" INFO ")),
        "INFO lines are written: {logs:?}"
    );
    assert!(
        !logs.iter().any(|l| l.contains("epode_sidecar::access")),
        "{logs:?}"
    );
}

#[tokio::test]
async fn one_access_line_per_request_with_nothing_private() {
    let (_up, _epode, sc) = lookup_sidecar(&[("EPODE_SIDECAR_ACCESS_LOG", "on")]);
    let resp = call_lookup(&sc, json!("c1"), json!({"query": "secret-argument"})).await;
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
    // Access lines are written as answers end: wait for both.
    let mut logs = Vec::new();
    eventually_async(Duration::from_secs(5), || {
        logs.extend(sc.logs());
        let access = logs.iter().filter(|l| l.contains("epode_sidecar::access"));
        std::future::ready(access.count() >= 2)
    })
    .await;
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
    let up = lookup_upstream();
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
    // Every request's head (lowercase) and body. (The sidecar's own readiness ping at start
    // is not one of them.)
    let seen: Vec<(String, Value)> = up
        .requests()
        .into_iter()
        .map(|r| (r.head.to_ascii_lowercase(), r.json))
        .collect();
    let seen: Vec<_> = seen
        .iter()
        .filter(|(_, req)| req["method"] == "tools/list")
        .collect();
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
    let up = lookup_upstream();
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

/// `/readyz` on the MCP port as a JSON value, with its status.
async fn readyz(sc: &Sidecar) -> (u16, Value) {
    readyz_at(&sc.base()).await
}

/// `/readyz` on the admin listener (the sidecar started with `EPODE_SIDECAR_ADMIN_LISTEN`).
async fn admin_readyz(sc: &Sidecar) -> (u16, Value) {
    readyz_at(&format!("http://{}", sc.admin.expect("an admin listener"))).await
}

async fn readyz_at(base: &str) -> (u16, Value) {
    let resp = http().get(format!("{base}/readyz")).send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

const ADMIN: (&str, &str) = ("EPODE_SIDECAR_ADMIN_LISTEN", "127.0.0.1:0");

/// Waits for a log line containing `needle`.
fn log_line(sc: &Sidecar, seen: &mut Vec<String>, needle: &str) -> Option<String> {
    eventually(Duration::from_secs(20), || {
        seen.extend(sc.logs());
        seen.iter().any(|l| l.contains(needle))
    });
    seen.iter().find(|l| l.contains(needle)).cloned()
}

#[tokio::test]
async fn readyz_says_why_when_the_upstream_path_is_wrong_or_nothing_listens() {
    // A real Python server, reached at a path it does not serve: every call would be 404.
    // The admin listener says where; the MCP port, which clients reach, only what.
    let up = Upstream::start(UpstreamKind::Python);
    let wrong = format!("http://127.0.0.1:{}/wrong", up.port);
    let sc = Sidecar::start(&wrong, &[ADMIN]);
    let (status, v) = admin_readyz(&sc).await;
    assert_eq!(status, 503, "{v}");
    let reason = v["reason"].as_str().unwrap();
    assert!(
        reason.contains("404") && reason.contains("usually /mcp") && reason.contains(&wrong),
        "{reason}"
    );
    let (status, v) = readyz(&sc).await;
    assert_eq!(status, 503, "{v}");
    let reason = v["reason"].as_str().unwrap();
    assert!(reason.contains("404"), "{reason}");
    assert!(
        !reason.contains("/wrong") && !reason.contains(&up.port.to_string()),
        "the MCP port names the upstream: {reason}"
    );
    let mut seen = Vec::new();
    let line = log_line(&sc, &mut seen, "is the path right").expect("no start-up line");
    assert!(line.contains("WARN"), "{line}");
    // The right path: ready.
    let right = Sidecar::start(&up.url(), &[]);
    assert_eq!(readyz(&right).await.0, 200);
    let mut seen = Vec::new();
    assert!(
        log_line(&right, &mut seen, "answers: ready").is_some(),
        "{seen:?}"
    );
    // Nothing listening: not ready, saying so (and where, on the admin listener only).
    let port = free_port().to_string();
    let nobody = Sidecar::start(&format!("http://127.0.0.1:{port}/mcp"), &[ADMIN]);
    let (status, v) = readyz(&nobody).await;
    assert_eq!(status, 503);
    let reason = v["reason"].as_str().unwrap();
    assert!(
        reason.contains("unreachable") && !reason.contains(&port),
        "{v}"
    );
    let (status, v) = admin_readyz(&nobody).await;
    assert_eq!(status, 503);
    let reason = v["reason"].as_str().unwrap();
    assert!(
        reason.contains("unreachable") && reason.contains(&port),
        "{v}"
    );
}

#[tokio::test]
async fn readyz_is_503_while_a_stdio_server_crashes_at_start() {
    let py = python().display().to_string();
    let sc = Sidecar::start_stdio(
        &[&py, "-c", "import no_such_module_for_the_test"],
        &[("EPODE_SIDECAR_UPSTREAM_RESTART_MAX_DELAY", "200ms"), ADMIN],
    );
    let mut seen = Vec::new();
    let line = log_line(&sc, &mut seen, "exits at start").expect("no line about the exit");
    assert!(line.contains("ERROR"), "{line}");
    assert!(
        line.contains("ModuleNotFoundError") && line.contains("check the command"),
        "{line}"
    );
    // Not ready at any look while the child crashes, until it has been restarted (and has
    // failed again) twice more.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut last;
    loop {
        let (status, v) = admin_readyz(&sc).await;
        assert_eq!(status, 503, "{v}");
        last = v;
        seen.extend(sc.logs());
        if seen.iter().filter(|l| l.contains("exits at start")).count() >= 3 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the child was not restarted twice: {seen:#?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let reason = last["reason"].as_str().unwrap();
    assert!(
        reason.contains("ModuleNotFoundError") || reason.contains("said nothing"),
        "{reason}"
    );
    // The MCP port says the process is down, never what it printed.
    let (status, v) = readyz(&sc).await;
    assert_eq!(status, 503, "{v}");
    let reason = v["reason"].as_str().unwrap();
    assert!(reason.contains("MCP server process"), "{reason}");
    assert!(!reason.contains("ModuleNotFoundError"), "{reason}");
}
