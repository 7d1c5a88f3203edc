//! A stdio MCP server behind the sidecar: the official Python SDK (`mcp==2.3.0`, stdio
//! transport) run as the sidecar's child, reached by both client eras, many calls at once over
//! the one pipe, a child that dies mid-call, one that stops reading, and shutdown.

use std::time::{Duration, Instant};

use crate::support::*;
use futures_util::StreamExt as _;
use serde_json::{json, Value};

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

/// With a stdio upstream, `EPODE_SIDECAR_WORKERS=auto` is one worker, serving calls on the
/// main thread, where the child's pipe is read and written: no worker thread of its own, so a
/// call wakes no other thread. With two workers set, there are two worker threads.
#[test]
fn a_stdio_upstream_is_served_on_the_thread_of_its_pipe() {
    let workers = |sc: &Sidecar| -> Vec<String> {
        std::fs::read_dir(format!("/proc/{}/task", sc.pid()))
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .map(|name| name.trim().to_owned())
            .filter(|name| name.starts_with("epode-worker"))
            .collect()
    };
    for (env, expected) in [(None, 0), (Some(("EPODE_SIDECAR_WORKERS", "2")), 2)] {
        let sc = start(&[], env.as_slice());
        let added = ts_call(
            &sc.url(),
            "pin",
            Some(("add", &json!({"a": 2, "b": 40}))),
            &[],
        );
        assert_eq!(added["result"]["structuredContent"]["sum"], 42, "{added}");
        assert_eq!(workers(&sc).len(), expected, "{env:?}: {:?}", workers(&sc));
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
    // At once, not at the 30 s upstream timeout (with room for a loaded machine).
    assert!(took < Duration::from_secs(5), "the error took {took:?}");
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

    // A 2026 client that declared no roots capability is never asked: the server hears the
    // error a 2025 client without it sends, at once (this one passes it on as its answer),
    // and nothing waits.
    let modern = ts_call(&sc.url(), "pin", Some(("roots", &json!({}))), &[]);
    let message = modern["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{modern}"));
    assert!(
        message.contains("did not declare the capability roots/list takes"),
        "{message}"
    );
    // The official TypeScript client pinned to 2026-07-28 that declares it is asked as
    // input_required, follows the round itself, and gets the result for its answer.
    let modern = ts_call_roots(
        &sc.url(),
        "pin",
        ("roots", &json!({})),
        "file:///srv/ts",
        &[],
    );
    assert_eq!(
        modern["result"]["content"][0]["text"], "1 roots: file:///srv/ts",
        "{modern}"
    );

    // After a restart, the session the sidecar kept names the old child: the new one answers
    // 404 for it, and the sidecar initialises the new child once and goes on.
    let mut log = Vec::new();
    let pid = child_pids(&sc, &mut log)[0];
    let ended = |log: &[String]| {
        log.iter()
            .filter(|l| l.contains("the MCP server process ended"))
            .count()
    };
    let ended_before = ended(&log);
    std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    // Until the sidecar has seen the child end.
    eventually(Duration::from_secs(10), || {
        log.extend(sc.logs());
        ended(&log) > ended_before
    });
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
    let started = Instant::now();
    let shouted = ts_call(
        &sc.url(),
        "pin",
        Some(("shout", &json!({"lines": 200}))),
        &[],
    );
    assert_eq!(shouted["result"]["content"][0]["text"], "shouted 200");
    // The scenario: the rate's window refills (5/s), so the next line is logged and carries
    // the count of those that were not.
    std::thread::sleep(Duration::from_millis(1200));
    ts_call(&sc.url(), "pin", Some(("shout", &json!({"lines": 1}))), &[]);
    let mut logs = Vec::new();
    let carried = eventually(Duration::from_secs(10), || {
        logs.extend(sc.logs());
        logs.iter().any(|l| l.contains("unlogged="))
    });
    let elapsed = started.elapsed().as_secs_f64();
    assert!(carried, "no line carried the count: {logs:?}");
    // Every line of the child's stderr the log got, summaries included: the burst (5) and
    // 5 a second after it, nothing more.
    let upstream: Vec<&String> = logs
        .iter()
        .filter(|l| l.contains("epode_sidecar::upstream"))
        .collect();
    let allowed = 5 + (5.0 * elapsed).ceil() as usize;
    assert!(
        (1..=allowed).contains(&upstream.len()),
        "{} lines in {elapsed:.1} s: {upstream:?}",
        upstream.len()
    );
    let summary = logs.iter().find(|l| l.contains("unlogged=")).unwrap();
    let unlogged: u64 = summary
        .split("unlogged=")
        .nth(1)
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    assert!(unlogged >= 185, "{summary}");
    assert!(
        summary.contains("shout line 0") || summary.contains("not logged"),
        "the count rides on a line of the child's: {summary}"
    );
    assert!(upstream.iter().any(|l| l.contains("shout line 0")));
}

/// A stdio child that reads nothing: `sleep`.
fn deaf_child(timeout: &str, budget: &str) -> Sidecar {
    Sidecar::start_stdio(
        &["sleep", "600"],
        &[
            ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28"),
            ("EPODE_SIDECAR_UPSTREAM_TIMEOUT", timeout),
            ("EPODE_SIDECAR_MEMORY_BUDGET_BYTES", budget),
        ],
    )
}

#[tokio::test]
async fn a_child_that_stops_reading_is_restarted_and_nothing_is_held_past_the_budget() {
    let budget = 16 * 1024 * 1024;
    let sc = deaf_child("2s", &budget.to_string());
    let baseline = status_kib(sc.pid(), "VmRSS");
    let big = "y".repeat(1024 * 1024);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let calls = (0..300).map(|i| {
        let body = call_body(json!(i), "echo", json!({"text": big}), None).to_string();
        let (url, client) = (sc.url(), client.clone());
        async move {
            let mut req = client.post(&url).body(body);
            for (k, v) in modern_headers("tools/call", Some("echo")) {
                req = req.header(k, v);
            }
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            let v: Value = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
            (i, status, v)
        }
    });
    let results = futures_util::future::join_all(calls).await;
    let mut reasons = std::collections::BTreeMap::<u16, usize>::new();
    for (i, status, v) in &results {
        assert!(matches!(status, 502..=504), "{status} {v}");
        // A body refused for the budget was never read: its id is not known.
        let unread = *status == 503 && v["id"].is_null();
        assert!(unread || v["id"] == *i, "{v}");
        *reasons.entry(*status).or_default() += 1;
    }
    assert!(
        results.iter().any(|(_, _, v)| v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("stopped reading its stdin")),
        "{reasons:?}"
    );
    // Every byte held (the bodies being read, the lines queued for the child) was inside the
    // one budget: the peak stays within twice the budget of the idle figure, plus what each
    // of the 300 connections costs whatever it sends (hyper's first 8 KiB read buffer, the
    // task, the socket's state: 16 KiB is allowed each). Before the budget covered queued
    // lines the peak was 235 MB.
    let peak = status_kib(sc.pid(), "VmHWM");
    let bound = baseline + 2 * budget / 1024 + 300 * 16;
    eprintln!("stdin budget: VmHWM {peak} KiB, idle {baseline} KiB, bound {bound} KiB, statuses {reasons:?}");
    assert!(
        peak <= bound,
        "VmHWM {peak} KiB, idle {baseline} KiB, bound {bound} KiB ({reasons:?})"
    );
    let mut log = Vec::new();
    assert!(
        eventually(Duration::from_secs(10), || child_pids(&sc, &mut log).len()
            >= 2),
        "the child that stopped reading was not restarted: {log:?}"
    );
    let ready = http()
        .get(format!("{}/readyz", sc.base()))
        .send()
        .await
        .unwrap();
    assert_eq!(
        ready.status(),
        503,
        "a child that answers nothing is not ready"
    );
    assert!(sc.logs().iter().all(|l| !l.contains("panicked")));
}

#[tokio::test]
async fn a_child_that_closes_its_stdin_fails_calls_at_once_and_is_restarted() {
    let script = "import os, sys, time\nos.close(0)\nprint('closed stdin', file=sys.stderr, flush=True)\ntime.sleep(600)";
    let py = python().display().to_string();
    let sc = Sidecar::start_stdio(
        &[&py, "-c", script],
        &[
            ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28"),
            ("EPODE_SIDECAR_UPSTREAM_TIMEOUT", "20s"),
        ],
    );
    let mut log = Vec::new();
    assert!(eventually(Duration::from_secs(20), || {
        log.extend(sc.logs());
        log.iter().any(|l| l.contains("closed stdin"))
    }));
    for i in 0..3 {
        let started = Instant::now();
        let body = call_body(json!(i), "echo", json!({"text": "x"}), None);
        let resp = post_modern(&sc.url(), "tools/call", Some("echo"), &body).await;
        let status = resp.status().as_u16();
        let v: Value = resp.json().await.unwrap();
        let took = started.elapsed();
        assert_eq!(status, 502, "{v}");
        assert_eq!(v["id"], i);
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("closed its stdin") || message.contains("stopped taking requests"),
            "{message}"
        );
        // Failed when the write failed, not at the 20 s upstream timeout.
        assert!(took < Duration::from_secs(10), "{took:?}");
    }
    assert!(
        eventually(Duration::from_secs(20), || child_pids(&sc, &mut log).len()
            >= 2),
        "never restarted: {log:?}"
    );
    let ready = http()
        .get(format!("{}/readyz", sc.base()))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
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

/// A 2025-era Python child that can ask its client for roots, in front of which clients
/// come and go.
fn legacy_child(env: &[(&str, &str)]) -> Sidecar {
    let mut all = vec![
        ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2025-11-25"),
        ("EPODE_SIDECAR_UPSTREAM_TIMEOUT", "20s"),
    ];
    all.extend_from_slice(env);
    start(&["--extras"], &all)
}

/// A 2025 client's POST with its credentials (`None`: none).
async fn post_as(sc: &Sidecar, bearer: Option<&str>, body: &Value) -> reqwest::Response {
    let mut req = reqwest::Client::new()
        .post(sc.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .body(body.to_string());
    if let Some(b) = bearer {
        req = req.header("authorization", format!("Bearer {b}"));
    }
    req.send().await.unwrap()
}

/// Reads an SSE stream until a message matches `pick`, keeping what it read.
async fn read_until(
    stream: &mut (impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    text: &mut String,
    pick: impl Fn(&Value) -> bool,
) -> Value {
    loop {
        if let Some(m) = messages("text/event-stream", text)
            .into_iter()
            .find(|m| pick(m))
        {
            return m;
        }
        let chunk = stream
            .next()
            .await
            .unwrap_or_else(|| panic!("the stream ended: {text}"))
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
}

/// The sidecar's count of client messages it ignored because the client did not own them.
async fn not_owner_count(sc: &Sidecar) -> u64 {
    let text = metrics_text(sc).await;
    text.lines()
        .find(|l| l.contains(r#"kind="stdio_not_owner""#))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap_or(0.0) as u64
}

#[tokio::test]
async fn only_the_client_a_server_request_was_asked_of_can_answer_it() {
    let sc = legacy_child(&[]);
    let ask = json!({"jsonrpc": "2.0", "id": 11, "method": "tools/call", "params": {"name": "roots", "arguments": {}}});
    let resp = post_as(&sc, Some("alice"), &ask).await;
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let mut text = String::new();
    let asked = read_until(&mut stream, &mut text, |m| m["method"] == "roots/list").await;
    let id = asked["id"].as_str().unwrap().to_owned();
    assert!(
        id.len() >= 40 && !id.ends_with("srv-1"),
        "the id is unguessable: {id}"
    );
    let forged = |id: &str| json!({"jsonrpc": "2.0", "id": id, "result": {"roots": [{"uri": "file:///forged"}]}});
    // The sequential id an attacker would guess, then the real one from others: all ignored.
    for (who, id) in [
        (None, "epode-sidecar-srv-1"),
        (None, id.as_str()),
        (Some("mallory"), id.as_str()),
    ] {
        assert_eq!(post_as(&sc, who, &forged(id)).await.status(), 202);
    }
    assert!(not_owner_count(&sc).await >= 3);
    // Its own client answers, from another connection.
    let answer =
        json!({"jsonrpc": "2.0", "id": id, "result": {"roots": [{"uri": "file:///alice"}]}});
    assert_eq!(post_as(&sc, Some("alice"), &answer).await.status(), 202);
    while let Some(chunk) = stream.next().await {
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    let last = messages("text/event-stream", &text).pop().unwrap();
    assert_eq!(last["id"], 11, "{text}");
    assert_eq!(
        last["result"]["content"][0]["text"], "1 roots: file:///alice",
        "{text}"
    );
}

#[tokio::test]
async fn a_server_request_never_reaches_a_client_that_did_not_cause_it() {
    let sc = legacy_child(&[]);
    // Bob (the official TypeScript client, answering roots with his own) waits on a slow call.
    let url = sc.url();
    let bob = std::thread::spawn(move || {
        ts_call_roots(
            &url,
            "legacy",
            ("slow", &json!({"steps": 60})),
            "file:///bob",
            &["Authorization: Bearer bob"],
        )
    });
    // Bob's call is open once his client's handshake is done and a request stays in flight
    // for a second (the call lasts six).
    let metric = |sc: &Sidecar, prefix: &str| {
        get_blocking(sc.addr, "/metrics")
            .lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let initialized = r#"epode_sidecar_requests_total{method="initialize""#;
    let mut since: Option<Instant> = None;
    assert!(
        eventually(Duration::from_secs(60), || {
            let open = metric(&sc, initialized) >= 1.0
                && metric(&sc, "epode_sidecar_in_flight_requests ") >= 1.0;
            since = if open {
                since.or(Some(Instant::now()))
            } else {
                None
            };
            since.is_some_and(|t| t.elapsed() >= Duration::from_secs(1))
        }),
        "bob's call never started"
    );
    // Alice's tool asks its client for roots while Bob's request is open: the sidecar cannot
    // tell whose request caused it, so it asks nobody and the server hears why.
    let alice = ts_call_roots(
        &sc.url(),
        "legacy",
        ("roots", &json!({})),
        "file:///alice",
        &["Authorization: Bearer alice"],
    );
    let seen = alice.to_string();
    assert!(!seen.contains("file:///bob"), "{seen}");
    assert!(seen.contains("more than one client"), "{seen}");
    let bob = bob.join().unwrap();
    assert_eq!(bob["result"]["content"][0]["text"], "done 60", "{bob}");
    // Alone, Alice is asked, and answers for herself.
    let alone = ts_call_roots(
        &sc.url(),
        "legacy",
        ("roots", &json!({})),
        "file:///alice",
        &["Authorization: Bearer alice"],
    );
    assert_eq!(
        alone["result"]["content"][0]["text"], "1 roots: file:///alice",
        "{alone}"
    );
}

#[tokio::test]
async fn with_a_child_per_client_two_official_clients_are_asked_at_once() {
    let sc = legacy_child(&[("EPODE_SIDECAR_STDIO_CHILDREN", "per-client")]);
    let calls: Vec<_> = ["alice", "bob"]
        .into_iter()
        .map(|who| {
            let url = sc.url();
            std::thread::spawn(move || {
                let header = format!("Authorization: Bearer {who}");
                (
                    who,
                    ts_call_roots(
                        &url,
                        "legacy",
                        ("roots", &json!({})),
                        &format!("file:///{who}"),
                        &[&header],
                    ),
                )
            })
        })
        .collect();
    for call in calls {
        let (who, got) = call.join().unwrap();
        assert_eq!(
            got["result"]["content"][0]["text"],
            format!("1 roots: file:///{who}"),
            "{got}"
        );
    }
    let mut log = Vec::new();
    let pids = child_pids(&sc, &mut log);
    assert!(
        pids.len() >= 3,
        "one child for clients without credentials, one each for alice and bob: {pids:?}"
    );
}

#[tokio::test]
async fn a_child_per_client_is_bounded_and_stopped_when_idle() {
    let sc = legacy_child(&[
        ("EPODE_SIDECAR_STDIO_CHILDREN", "per-client"),
        ("EPODE_SIDECAR_STDIO_MAX_CHILDREN", "1"),
        ("EPODE_SIDECAR_STDIO_CHILD_IDLE", "1s"),
    ]);
    // Ready first: the start-up probe is done with the first child (while its ping is in
    // flight, that child is busy, and the only place in the pool is taken).
    let mut seen = Vec::new();
    assert!(
        eventually(Duration::from_secs(20), || {
            seen.extend(sc.logs());
            seen.iter()
                .any(|l| l.contains("the upstream MCP server answers: ready"))
        }),
        "never ready: {seen:?}"
    );
    let slow = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "slow", "arguments": {"steps": 20}, "_meta": {"progressToken": "p"}}});
    let resp = post_as(&sc, Some("alice"), &slow).await;
    let mut stream = resp.bytes_stream();
    let mut text = String::new();
    read_until(&mut stream, &mut text, |m| {
        m["method"] == "notifications/progress"
    })
    .await;
    // Alice's child is the only one allowed, and busy: Bob is turned away, not queued.
    let echo = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "b"}}});
    let refused = post_as(&sc, Some("bob"), &echo).await;
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    let v: Value = refused.json().await.unwrap();
    assert_eq!(v["id"], 2);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("EPODE_SIDECAR_STDIO_MAX_CHILDREN"),
        "{v}"
    );
    while let Some(chunk) = stream.next().await {
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    assert!(text.contains("done 20"), "{text}");
    // Once Alice's child is idle, Bob's request takes its place.
    let mut log = seen;
    let ok = post_as(&sc, Some("bob"), &echo).await;
    assert_eq!(ok.status(), 200);
    let before = child_pids(&sc, &mut log);
    assert!(
        eventually(Duration::from_secs(20), || {
            log.extend(sc.logs());
            log.iter().any(|l| l.contains("idle for"))
        }),
        "no idle child stopped: {log:?}"
    );
    for pid in before.iter().take(before.len().saturating_sub(1)) {
        assert!(
            eventually(Duration::from_secs(10), || !alive(*pid)),
            "process {pid} outlived its place in the pool"
        );
    }
}

/// Once the children were stopped for idleness, readiness holds on the last one's answer: a
/// probe (every few seconds from the kubelet) starts no process and takes no client's place.
#[tokio::test]
async fn readiness_starts_no_child_once_the_children_went_idle() {
    let sc = legacy_child(&[
        ("EPODE_SIDECAR_STDIO_CHILDREN", "per-client"),
        ("EPODE_SIDECAR_STDIO_MAX_CHILDREN", "1"),
        ("EPODE_SIDECAR_STDIO_CHILD_IDLE", "1s"),
    ]);
    let ready = format!("{}/readyz", sc.base());
    let mut log = Vec::new();
    assert!(
        eventually(Duration::from_secs(20), || {
            log.extend(sc.logs());
            log.iter().any(|l| l.contains("idle for"))
        }),
        "no idle child stopped: {log:?}"
    );
    let started = child_pids(&sc, &mut log);
    for pid in &started {
        assert!(
            eventually(Duration::from_secs(10), || !alive(*pid)),
            "process {pid} outlived its idle time"
        );
    }
    for _ in 0..3 {
        assert_eq!(http().get(&ready).send().await.unwrap().status(), 200);
    }
    assert_eq!(
        child_pids(&sc, &mut log),
        started,
        "a readiness probe started a process"
    );
    // A client still gets its child (on a loaded machine its start may outlast the upstream
    // timeout, a 504, once: the child then serves the next request).
    let echo = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "b"}}});
    let ok = eventually_async(Duration::from_secs(90), || async {
        post_as(&sc, Some("bob"), &echo).await.status() == 200
    })
    .await;
    assert!(ok, "bob never got an answer from a child of his own");
    assert_eq!(child_pids(&sc, &mut log).len(), started.len() + 1);
}

#[tokio::test]
async fn a_clients_cancel_reaches_only_its_own_request() {
    let sc = legacy_child(&[]);
    let slow = |id: u64, steps: u64| json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "slow", "arguments": {"steps": steps}, "_meta": {"progressToken": format!("p{id}")}}});
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7, "reason": "x"}});
    let resp = post_as(&sc, Some("alice"), &slow(7, 10)).await;
    let mut stream = resp.bytes_stream();
    let mut text = String::new();
    read_until(&mut stream, &mut text, |m| {
        m["method"] == "notifications/progress"
    })
    .await;
    // Another client, and a client without credentials on another connection, name id 7.
    assert_eq!(post_as(&sc, Some("mallory"), &cancel).await.status(), 202);
    assert_eq!(post_as(&sc, None, &cancel).await.status(), 202);
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(chunk) = stream.next().await {
            text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        }
    })
    .await;
    assert!(ended.is_ok(), "alice's call never ended: {text}");
    let last = messages("text/event-stream", &text).pop().unwrap();
    assert_eq!(last["result"]["content"][0]["text"], "done 10", "{text}");
    assert!(not_owner_count(&sc).await >= 2);
    // Alice's own cancel, from another connection, does reach the server.
    let resp = post_as(&sc, Some("alice"), &slow(7, 100)).await;
    let mut stream = resp.bytes_stream();
    let mut text = String::new();
    read_until(&mut stream, &mut text, |m| {
        m["method"] == "notifications/progress"
    })
    .await;
    assert_eq!(post_as(&sc, Some("alice"), &cancel).await.status(), 202);
    let ended = tokio::time::timeout(Duration::from_secs(15), async {
        while let Some(chunk) = stream.next().await {
            text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        }
    })
    .await;
    assert!(ended.is_ok(), "the cancelled call did not end: {text}");
    assert!(!text.contains("done 100"), "{text}");
    assert!(text.contains("cancelled by its client"), "{text}");
}

#[tokio::test]
async fn an_over_long_line_fails_only_the_request_its_top_level_id_names() {
    // A child of our own: it holds the first request, then answers the second with a line
    // past the cap whose result names the first request's id before its own.
    let script = r#"
import json, sys
held = None
for line in sys.stdin:
    m = json.loads(line)
    if "id" not in m or "method" not in m:
        continue
    if m["method"] == "initialize":
        print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": {"name": "raw", "version": "0"}}}), flush=True)
    elif m["method"] == "tools/call" and m["params"]["name"] == "hold":
        held = m["id"]
        print("holding the first request", file=sys.stderr, flush=True)
    elif m["method"] == "tools/call":
        pad = "x" * 200000
        text = json.dumps({"jsonrpc": "2.0", "result": {"content": [{"id": held, "type": "text", "text": pad}]}, "id": m["id"]})
        print(text, flush=True)
        print(json.dumps({"jsonrpc": "2.0", "id": held, "result": {"content": [{"type": "text", "text": "released"}]}}), flush=True)
    elif m["method"] == "ping":
        print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": {}}), flush=True)
"#;
    let py = python().display().to_string();
    let sc = Sidecar::start_stdio(
        &[&py, "-c", script],
        &[
            ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2025-11-25"),
            ("EPODE_SIDECAR_MAX_UPSTREAM_ANSWER_BYTES", "65536"),
        ],
    );
    let call = |id: u64, name: &str| json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": {}}});
    let hold = call(1, "hold");
    let (held, big) = tokio::join!(post_as(&sc, Some("victim"), &hold), async {
        // Once the child holds the first request (it says so on stderr, which is logged).
        let mut seen = Vec::new();
        let holding = eventually_async(Duration::from_secs(10), || {
            seen.extend(sc.logs());
            std::future::ready(seen.iter().any(|l| l.contains("holding the first request")))
        })
        .await;
        assert!(holding, "the child never got the first request: {seen:?}");
        post_as(&sc, Some("other"), &call(2, "big")).await
    });
    assert_eq!(big.status(), 502);
    let v: Value = big.json().await.unwrap();
    assert_eq!(v["id"], 2, "{v}");
    assert_eq!(held.status(), 200);
    let ct = held.headers()["content-type"].to_str().unwrap().to_owned();
    let last = messages(&ct, &held.text().await.unwrap()).pop().unwrap();
    assert_eq!(last["id"], 1, "{last}");
    assert_eq!(last["result"]["content"][0]["text"], "released", "{last}");
}

#[test]
fn a_sigkilled_sidecar_takes_its_child_with_it() {
    // A child that does not exit when its stdin closes (a Python server would).
    let sc = Sidecar::start_stdio(
        &["sleep", "600"],
        &[("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28")],
    );
    let mut log = Vec::new();
    assert!(eventually(Duration::from_secs(10), || !child_pids(
        &sc, &mut log
    )
    .is_empty()));
    let pid = child_pids(&sc, &mut log)[0];
    assert!(alive(pid));
    std::process::Command::new("kill")
        .args(["-KILL", &sc.pid().to_string()])
        .status()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(10), || !alive(pid)),
        "the child {pid} outlived a SIGKILLed sidecar"
    );
}

#[test]
fn stderr_under_a_steady_flood_stays_within_its_rate() {
    let script = "i=0; while [ $i -lt 400 ]; do echo \"noise $i\" >&2; i=$((i+1)); sleep 0.01; done; exec sleep 600";
    let sc = Sidecar::start_stdio(
        &["sh", "-c", script],
        &[
            ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28"),
            ("EPODE_SIDECAR_UPSTREAM_STDERR_RATE", "5/s"),
        ],
    );
    let started = Instant::now();
    let mut logs = Vec::new();
    // Until the flood is over (the last line, or the count of the unlogged ones at its end).
    assert!(eventually(Duration::from_secs(60), || {
        logs.extend(sc.logs());
        logs.iter().filter(|l| l.contains("noise")).count() >= 12
            && started.elapsed() > Duration::from_secs(3)
    }));
    let elapsed = started.elapsed().as_secs_f64();
    let lines = logs
        .iter()
        .filter(|l| l.contains("epode_sidecar::upstream"))
        .count();
    let allowed = 5 + (5.0 * elapsed).ceil() as usize + 1;
    assert!(
        lines <= allowed,
        "{lines} lines of the child's stderr logged in {elapsed:.1} s at 5/s: {logs:?}"
    );
}

#[test]
fn a_grandchild_that_left_the_childs_session_is_stopped_at_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("escaped.pid");
    let server = py_server(&[]).join(" ");
    let script = format!(
        "setsid sleep 300 & echo $! > {} ; exec {server}",
        pidfile.display()
    );
    let mut sc = Sidecar::start_stdio(&["sh", "-c", &script], &[]);
    let listed = ts_call(&sc.url(), "pin", None, &[]);
    assert!(listed["tools"].is_array(), "{listed}");
    let mut escaped = 0;
    assert!(eventually(Duration::from_secs(10), || {
        escaped = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        escaped > 0
    }));
    assert!(alive(escaped));
    sc.terminate();
    assert_eq!(sc.wait_exit(Duration::from_secs(20)), Some(0));
    assert!(
        eventually(Duration::from_secs(5), || !alive(escaped)),
        "the setsid grandchild {escaped} outlived the sidecar"
    );
}

#[test]
fn the_child_runs_as_the_configured_user() {
    if !nix_is_root() {
        return; // only root may switch users; CI runs the tests as root
    }
    let sc = Sidecar::start_stdio(
        &[
            "sh",
            "-c",
            "echo \"uid=$(id -u) gid=$(id -g) groups=$(id -G)\" >&2; exec sleep 600",
        ],
        &[("EPODE_SIDECAR_UPSTREAM_USER", "65534:65533")],
    );
    let mut log = Vec::new();
    assert!(
        eventually(Duration::from_secs(10), || {
            log.extend(sc.logs());
            log.iter().any(|l| l.contains("uid="))
        }),
        "{log:?}"
    );
    let line = log.iter().find(|l| l.contains("uid=")).unwrap();
    assert!(line.contains("uid=65534 gid=65533 groups=65533"), "{line}");
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1).map(|e| e == "0"))
        .unwrap_or(false)
}

/// The lines of a file, none while it does not exist.
fn file_lines(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .map(|s| s.lines().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// The child's environment is exactly what `EPODE_SIDECAR_UPSTREAM_ENV` lets through: nothing
/// the sidecar sets for its own process (its allocator's option) reaches it.
#[test]
fn the_child_sees_only_the_variables_it_is_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("environ");
    // What the shell was started with (its own variables, such as PWD, are not in it).
    let script = format!(
        "tr '\\0' '\\n' < /proc/$$/environ > {out}.tmp && mv {out}.tmp {out}; exec sleep 600",
        out = out.display()
    );
    let sc = Sidecar::start_stdio(
        &["sh", "-c", &script],
        &[
            ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28"),
            ("EPODE_SIDECAR_UPSTREAM_ENV", "PATH,PROBE_*"),
            ("PROBE_ONE", "1"),
            ("PROBE_TWO", "two"),
            ("NOT_LISTED", "x"),
        ],
    );
    assert!(
        eventually(Duration::from_secs(20), || out.exists()),
        "the child wrote no environment"
    );
    let mut got = file_lines(&out);
    got.sort();
    let path = std::env::var("PATH").unwrap_or_default();
    assert_eq!(
        got,
        [
            format!("PATH={path}"),
            "PROBE_ONE=1".into(),
            "PROBE_TWO=two".into()
        ]
    );
    if nix_is_root() {
        // The sidecar itself still runs with its allocator's option (only root reads the
        // environment of a process that is not dumpable).
        let own = std::fs::read(format!("/proc/{}/environ", sc.pid())).unwrap();
        assert!(
            own.split(|b| *b == 0)
                .any(|v| v == b"MIMALLOC_PURGE_DELAY=0"),
            "{}",
            String::from_utf8_lossy(&own)
        );
    }
}

/// After the binary is replaced on disk (a package upgrade renames a new file over it), a new
/// child still starts from the binary that runs, never from a file found by its name: not
/// the new file, nor one named as the kernel names a deleted binary (`PATH (deleted)`).
#[test]
fn a_new_child_starts_through_the_running_binary_after_it_is_replaced_on_disk() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("epode-sidecar");
    std::fs::copy(env!("CARGO_BIN_EXE_epode-sidecar"), &bin).unwrap();
    let starts = dir.path().join("starts");
    let script = format!("echo $$ >> {}; exec sleep 600", starts.display());
    let _sc = Sidecar::start_stdio_from(
        &bin,
        &["sh", "-c", &script],
        &[("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28")],
    );
    assert!(
        eventually(Duration::from_secs(20), || file_lines(&starts).len() == 1),
        "the first child did not start"
    );
    let impostor = |name: &str, marker: &str| {
        let p = dir.path().join(name);
        let marker = dir.path().join(marker);
        std::fs::write(
            &p,
            format!("#!/bin/sh\necho \"$@\" > '{}'\n", marker.display()),
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        (p, marker)
    };
    let (new, replaced) = impostor("epode-sidecar.new", "ran-the-new-file");
    std::fs::rename(&new, &bin).unwrap();
    let (_, deleted) = impostor("epode-sidecar (deleted)", "ran-the-deleted-name");
    let first = file_lines(&starts)[0].clone();
    std::process::Command::new("kill")
        .args(["-KILL", &first])
        .status()
        .unwrap();
    let restarted = eventually(Duration::from_secs(20), || file_lines(&starts).len() >= 2);
    for marker in [&replaced, &deleted] {
        assert!(
            !marker.exists(),
            "{} ran, as root before the user switch: {:?}",
            marker.display(),
            std::fs::read_to_string(marker)
        );
    }
    assert!(
        restarted,
        "the child did not start again: {:?}",
        file_lines(&starts)
    );
}

/// A 2025-era stdio MCP server that starts two processes outside its process group: one in a
/// session of its own (`setsid`), and one a double fork left behind (its parent exits at
/// once). It appends `<its pid> <the setsid one> <the orphan>` to the file `$1`.
const SPAWNER: &str = r#"
import json, os, subprocess, sys

quiet = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
own = subprocess.Popen(["setsid", "sleep", "1000"], **quiet)
orphan = subprocess.run(
    ["sh", "-c", "setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $!"],
    stdin=subprocess.DEVNULL, capture_output=True, text=True,
).stdout.strip()
with open(sys.argv[1], "a") as f:
    f.write(f"{os.getpid()} {own.pid} {orphan}\n")
for line in sys.stdin:
    if not line.strip():
        continue
    msg = json.loads(line)
    if "id" not in msg or "method" not in msg:
        continue
    method = msg["method"]
    if method == "initialize":
        result = {
            "protocolVersion": msg["params"].get("protocolVersion", "2025-11-25"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "spawner", "version": "0"},
        }
    elif method == "tools/list":
        result = {"tools": []}
    else:
        result = {}
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
"#;

/// With a child per client and room for two, eight clients in turn: each child that makes room
/// for a newer one stops with everything it started, whether that left its process group or
/// was orphaned, while the sidecar runs on; the processes of the children still running (the
/// last two clients') are left alone.
#[tokio::test]
async fn a_stopped_child_per_client_takes_its_processes_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("spawner.py");
    std::fs::write(&script, SPAWNER).unwrap();
    let started = dir.path().join("started");
    let (py, script_arg, started_arg) = (
        python().display().to_string(),
        script.display().to_string(),
        started.display().to_string(),
    );
    let sc = Sidecar::start_stdio(
        &[&py, &script_arg, &started_arg],
        &[
            ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2025-11-25"),
            ("EPODE_SIDECAR_UPSTREAM_TIMEOUT", "20s"),
            ("EPODE_SIDECAR_STDIO_CHILDREN", "per-client"),
            ("EPODE_SIDECAR_STDIO_MAX_CHILDREN", "2"),
        ],
    );
    // The child of clients without credentials has started its processes (it is the first
    // to make room, maybe before it answered anything).
    assert!(
        eventually(Duration::from_secs(20), || file_lines(&started).len() == 1),
        "the first child did not start"
    );
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    for client in 0..8 {
        let resp = post_as(&sc, Some(&format!("client-{client}")), &list).await;
        assert_eq!(
            resp.status(),
            200,
            "client {client}: {:?}",
            resp.text().await
        );
    }
    // One line per child: the one of clients without credentials, and one per client.
    let mut lines = Vec::new();
    assert!(
        eventually(Duration::from_secs(20), || {
            lines = file_lines(&started);
            lines.len() == 9
        }),
        "{lines:?}"
    );
    let pids: Vec<Vec<u32>> = lines
        .iter()
        .map(|l| l.split_whitespace().map(|p| p.parse().unwrap()).collect())
        .collect();
    // The children that made room are those that exited (they started in turn, but wrote
    // their lines as fast as Python started).
    let (mut stopped, mut running) = (Vec::new(), Vec::new());
    let mut left = Vec::new();
    let gone = eventually(Duration::from_secs(30), || {
        (stopped, running) = pids.iter().cloned().partition(|p| !alive(p[0]));
        left = stopped
            .iter()
            .flatten()
            .copied()
            .filter(|p| alive(*p))
            .collect();
        stopped.len() == 7 && left.is_empty()
    });
    assert!(alive(sc.pid()), "the sidecar exited: {:?}", sc.logs());
    assert_eq!(stopped.len(), 7, "children that stopped: {stopped:?}");
    assert!(
        gone,
        "processes of stopped children still run: {left:?} (of child, setsid'd, orphaned: {stopped:?})"
    );
    for p in running.iter().flatten() {
        assert!(
            alive(*p),
            "{p} of a running child was stopped ({running:?})"
        );
    }
}
