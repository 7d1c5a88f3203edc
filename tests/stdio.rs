//! A stdio MCP server behind the sidecar: the official Python SDK (`mcp==2.3.0`, stdio
//! transport) run as the sidecar's child, reached by both client eras, many calls at once over
//! the one pipe, a child that dies mid-call, one that stops reading, and shutdown.

mod support;

use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use serde_json::{json, Value};
use support::*;

fn py_server(extra: &[&str]) -> Vec<String> {
    let mut argv = vec![
        python().display().to_string(),
        repo_root()
            .join("tests/peers/py_server.py")
            .display()
            .to_string(),
        "--stdio".to_owned(),
    ];
    argv.extend(extra.iter().map(|s| (*s).to_owned()));
    argv
}

fn start(extra: &[&str], env: &[(&str, &str)]) -> Sidecar {
    let argv = py_server(extra);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    Sidecar::start_stdio(&argv, env)
}

/// The pids of the child processes the sidecar started, from its log.
fn child_pids(sc: &Sidecar, seen: &mut Vec<String>) -> Vec<u32> {
    seen.extend(sc.logs());
    seen.iter()
        .filter(|l| l.contains("the MCP server process started"))
        .filter_map(|l| {
            l.split("pid=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// Whether a process exists and is not a zombie.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .map(|r| !r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// Every process in process group `pgid`.
fn group_members(pgid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    let after = s.rsplit(')').next()?.to_owned();
                    after.split_whitespace().nth(2)?.parse::<u32>().ok()
                })
                == Some(pgid)
        })
        .collect()
}

/// A 2025-era client's POST (no session: the front is stateless).
async fn post_legacy(sc: &Sidecar, body: &Value) -> reqwest::Response {
    http()
        .post(sc.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

fn call_body(id: Value, tool: &str, args: Value, token: Option<&str>) -> Value {
    let mut body = modern_body(id, "tools/call", json!({"name": tool, "arguments": args}));
    if let Some(t) = token {
        body["params"]["_meta"]["progressToken"] = json!(t);
    }
    body
}

/// The JSON-RPC messages of a response (one for JSON, each `data:` for SSE).
fn messages(content_type: &str, body: &str) -> Vec<Value> {
    if content_type.starts_with("text/event-stream") {
        body.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    } else {
        vec![serde_json::from_str(body).unwrap()]
    }
}

#[test]
fn both_client_eras_reach_a_python_stdio_server() {
    let sc = start(&[], &[]);
    for mode in ["pin", "legacy"] {
        let listed = ts_call(&sc.url(), mode, None, &[]);
        let names: Vec<&str> = listed["tools"]
            .as_array()
            .unwrap_or_else(|| panic!("{listed}"))
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["echo", "add", "slow"], "{mode}");
        let added = ts_call(
            &sc.url(),
            mode,
            Some(("add", &json!({"a": 2, "b": 40}))),
            &[],
        );
        assert_eq!(
            added["result"]["structuredContent"]["sum"], 42,
            "{mode}: {added}"
        );
        let expected_era = if mode == "pin" { "modern" } else { "legacy" };
        assert_eq!(added["era"], expected_era);
    }
}

#[tokio::test]
async fn fifty_concurrent_calls_get_their_own_answers_and_progress() {
    let sc = start(&[], &[]);
    let url = sc.url();
    let calls = (0..50).map(|i| {
        let url = url.clone();
        async move {
            let steps = 1 + i % 6;
            let token = format!("tok-{i}");
            // Every client uses the same request id: the sidecar's own ids keep them apart.
            let body = call_body(json!("same"), "slow", json!({"steps": steps}), Some(&token));
            let resp = post_modern(&url, "tools/call", Some("slow"), &body).await;
            assert_eq!(resp.status(), 200);
            let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
            let text = resp.text().await.unwrap();
            (i, steps, token, messages(&ct, &text))
        }
    });
    let results = futures_util::future::join_all(calls).await;
    for (i, steps, token, msgs) in results {
        let (last, notes) = msgs.split_last().unwrap();
        assert_eq!(last["id"], "same", "call {i}: {last}");
        assert_eq!(
            last["result"]["content"][0]["text"],
            format!("done {steps}"),
            "call {i}"
        );
        assert_eq!(notes.len(), steps, "call {i}: {notes:?}");
        for (n, note) in notes.iter().enumerate() {
            assert_eq!(note["method"], "notifications/progress");
            assert_eq!(note["params"]["progressToken"], token.as_str(), "call {i}");
            assert_eq!(note["params"]["progress"], n as u64 + 1, "call {i}");
        }
    }
}

#[tokio::test]
async fn a_killed_child_fails_its_call_at_once_and_the_next_call_succeeds() {
    let sc = start(&[], &[]);
    let mut log = Vec::new();
    // The first call starts the child's conversation (era discovery).
    assert_eq!(
        ts_call(
            &sc.url(),
            "pin",
            Some(("echo", &json!({"text": "hi"}))),
            &[]
        )["era"],
        "modern"
    );
    let pid = child_pids(&sc, &mut log)[0];
    let body = call_body(json!("doomed"), "slow", json!({"steps": 100}), Some("p"));
    let resp = post_modern(&sc.url(), "tools/call", Some("slow"), &body).await;
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let mut text = String::new();
    while !text.contains("notifications/progress") {
        text.push_str(&String::from_utf8_lossy(
            &stream.next().await.unwrap().unwrap(),
        ));
    }
    let killed = Instant::now();
    std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    while let Some(chunk) = stream.next().await {
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(1), "the error took {took:?}");
    let last = messages("text/event-stream", &text).pop().unwrap();
    assert_eq!(last["id"], "doomed", "{text}");
    assert_eq!(last["error"]["code"], -32603, "{text}");
    let message = last["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("exited") && message.contains("restarted"),
        "{message}"
    );
    // The next call goes to the restarted child.
    let again = ts_call(
        &sc.url(),
        "pin",
        Some(("echo", &json!({"text": "again"}))),
        &[],
    );
    assert!(
        again["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("again"),
        "{again}"
    );
    let pids = child_pids(&sc, &mut log);
    assert_eq!(pids.len(), 2, "{log:?}");
    assert!(!alive(pid));
}

#[test]
fn no_child_remains_after_sigterm() {
    // A shell that leaves a grandchild in the child's process group, then becomes the server.
    let server = py_server(&[]).join(" ");
    let script = format!("sleep 300 & exec {server}");
    let mut sc = Sidecar::start_stdio(&["sh", "-c", &script], &[]);
    let listed = ts_call(&sc.url(), "pin", None, &[]);
    assert!(listed["tools"].is_array(), "{listed}");
    let mut log = Vec::new();
    let pid = child_pids(&sc, &mut log)[0];
    let group = group_members(pid);
    assert!(group.len() >= 2, "the server and its sleep: {group:?}");
    sc.terminate();
    assert_eq!(sc.wait_exit(Duration::from_secs(10)), Some(0));
    for p in &group {
        assert!(
            !alive(*p),
            "process {p} of the child's group outlived the sidecar"
        );
    }
}

#[tokio::test]
async fn a_2025_session_over_stdio_relays_server_requests_and_survives_a_restart() {
    let sc = start(
        &["--extras"],
        &[("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2025-11-25")],
    );
    // A 2025 client calls a tool that asks it for its roots mid-call.
    let body = json!({"jsonrpc": "2.0", "id": 11, "method": "tools/call", "params": {"name": "roots", "arguments": {}}});
    let resp = post_legacy(&sc, &body).await;
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let mut text = String::new();
    let asked = loop {
        text.push_str(&String::from_utf8_lossy(
            &stream.next().await.unwrap().unwrap(),
        ));
        if let Some(m) = messages("text/event-stream", &text)
            .into_iter()
            .find(|m| m["method"] == "roots/list")
        {
            break m;
        }
    };
    let answer = json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"roots": [{"uri": "file:///srv/a"}]}});
    let posted = post_legacy(&sc, &answer).await;
    assert_eq!(posted.status(), 202);
    while let Some(chunk) = stream.next().await {
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    let last = messages("text/event-stream", &text).pop().unwrap();
    assert_eq!(last["id"], 11, "{text}");
    assert_eq!(
        last["result"]["content"][0]["text"], "1 roots: file:///srv/a",
        "{text}"
    );

    // A 2026 client cannot be asked: the server hears so at once (this one passes the error
    // on as its answer) and nothing waits.
    let modern = ts_call(&sc.url(), "pin", Some(("roots", &json!({}))), &[]);
    assert_eq!(modern["error"]["code"], -32603, "{modern}");
    let message = modern["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("no client that can answer roots/list"),
        "{message}"
    );

    // After a restart, the session the sidecar kept names the old child: the new one answers
    // 404 for it, and the sidecar initialises the new child once and goes on.
    let mut log = Vec::new();
    let pid = child_pids(&sc, &mut log)[0];
    std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let body = json!({"jsonrpc": "2.0", "id": 12, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "back"}}});
    let resp = post_legacy(&sc, &body).await;
    assert_eq!(resp.status(), 200);
    let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
    let last = messages(&ct, &resp.text().await.unwrap()).pop().unwrap();
    assert!(
        last["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("back"),
        "{last}"
    );
    log.extend(sc.logs());
    assert!(
        log.iter().any(|l| l.contains("initialising again")),
        "{log:?}"
    );
    for mode in ["legacy", "pin"] {
        let echoed = ts_call(&sc.url(), mode, Some(("echo", &json!({"text": "on"}))), &[]);
        assert!(
            echoed["result"]["content"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .contains("on"),
            "{mode}: {echoed}"
        );
    }
}

#[tokio::test]
async fn stderr_is_logged_line_by_line_at_a_bounded_rate() {
    let sc = start(
        &["--extras"],
        &[("EPODE_SIDECAR_UPSTREAM_STDERR_RATE", "5/s")],
    );
    let shouted = ts_call(
        &sc.url(),
        "pin",
        Some(("shout", &json!({"lines": 200}))),
        &[],
    );
    assert_eq!(shouted["result"]["content"][0]["text"], "shouted 200");
    std::thread::sleep(Duration::from_millis(1200));
    ts_call(&sc.url(), "pin", Some(("shout", &json!({"lines": 1}))), &[]);
    std::thread::sleep(Duration::from_millis(300));
    let logs = sc.logs();
    let lines = logs.iter().filter(|l| l.contains("shout line")).count();
    assert!((1..=12).contains(&lines), "{lines} stderr lines logged");
    let summary = logs
        .iter()
        .find(|l| l.contains("were not logged"))
        .unwrap_or_else(|| panic!("no summary line in {logs:?}"));
    let unlogged: u64 = summary
        .split("unlogged=")
        .nth(1)
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    assert!(unlogged >= 185, "{summary}");
    assert!(logs
        .iter()
        .any(|l| l.contains("epode_sidecar::upstream") && l.contains("shout line 0")));
}

#[tokio::test]
async fn a_child_that_stops_reading_cannot_make_the_sidecar_buffer() {
    let sc = Sidecar::start_stdio(
        &["sleep", "600"],
        &[
            ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28"),
            ("EPODE_SIDECAR_UPSTREAM_TIMEOUT", "1s"),
            ("EPODE_SIDECAR_UPSTREAM_STDIN_QUEUE", "2"),
        ],
    );
    let big = "y".repeat(1024 * 1024);
    let started = Instant::now();
    let calls = (0..12).map(|i| {
        let body = call_body(json!(i), "echo", json!({"text": big}), None);
        let url = sc.url();
        async move {
            let resp = post_modern(&url, "tools/call", Some("echo"), &body).await;
            let status = resp.status().as_u16();
            let v: Value = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
            (i, status, v)
        }
    });
    let results = futures_util::future::join_all(calls).await;
    let took = started.elapsed();
    for (i, status, v) in results {
        assert_eq!(status, 504, "{v}");
        assert_eq!(v["id"], i, "{v}");
    }
    assert!(took < Duration::from_secs(4), "{took:?}");
    // The twelve bodies were held by their requests (each counted in the memory budget) and
    // never queued past the two stdin slots; what stays resident is those bodies' copies and
    // the allocator's retained pages: 75-79 MiB in a debug build, measured over ten runs.
    let rss = rss_kib(sc.pid());
    assert!(rss < 100 * 1024, "RSS {rss} KiB");
    let health = http()
        .get(format!("{}/healthz", sc.base()))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    assert!(sc.logs().iter().all(|l| !l.contains("panicked")));
}

#[tokio::test]
async fn an_answer_longer_than_the_cap_is_refused_with_the_requests_id() {
    let sc = start(
        &["--extras"],
        &[("EPODE_SIDECAR_MAX_UPSTREAM_ANSWER_BYTES", "1048576")],
    );
    let body = call_body(json!("huge"), "big", json!({"size": 3_000_000}), None);
    let resp = post_modern(&sc.url(), "tools/call", Some("big"), &body).await;
    assert_eq!(resp.status(), 502);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["id"], "huge", "{v}");
    // The pipe stays in step: the next answer is read as usual.
    let small = call_body(json!("small"), "big", json!({"size": 10}), None);
    let resp = post_modern(&sc.url(), "tools/call", Some("big"), &small).await;
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["result"]["content"][0]["text"], "xxxxxxxxxx", "{v}");
}

#[test]
fn a_command_that_cannot_start_is_refused_at_once() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_epode-sidecar"))
        .args(["--", "/nonexistent/mcp-server"])
        .env_clear()
        .env("AGENT_FEEDBACK_MODE", "off")
        .env("EPODE_SIDECAR_LISTEN", "127.0.0.1:0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot start the MCP server `/nonexistent/mcp-server`"),
        "{err}"
    );
}
