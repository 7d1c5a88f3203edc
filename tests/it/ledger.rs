//! One caller, one ledger: what a caller leaves held past its request's head (held calls,
//! listen streams, 2025 sessions, questions asked of a 2025 client) is charged to it, within a
//! share no caller can pass and a cap for the sidecar; one caller without credentials never
//! takes what another caller's calls need. Held calls keep one deadline however often they
//! are retried, and are let go upstream with `notifications/cancelled`. The headers the
//! sidecar owns never pass in another spelling. Black box, against a scripted 2025 upstream
//! (sessions, a question in the call's stream, a GET stream) and a scripted 2026 one (an
//! `input_required` result).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::StreamExt;
use serde_json::{json, Value};

use crate::support::scripted::{Reply, Request, Scripted, ScriptedUpstream};
use crate::support::{
    eventually_async, get_blocking, http, last_message, metric, metric_value, modern_body,
    modern_headers, status_kib, Sidecar,
};

const ERA_2025: (&str, &str) = ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2025-11-25");
const ERA_2026: (&str, &str) = ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28");

const QUESTION: &str = r#"{"jsonrpc":"2.0","id":"q1","method":"elicitation/create","params":{"mode":"form","message":"How many?","requestedSchema":{"type":"object","properties":{"n":{"type":"integer"}}}}}"#;

/// A 2025 upstream with sessions (a new id per `initialize`), whose `ask` tool asks its
/// client a question and waits, whose `echo` answers at once, whose sessions' GET streams stay
/// open, and which takes `resources/subscribe`.
fn asking_upstream() -> Scripted {
    let sessions = Arc::new(AtomicUsize::new(0));
    ScriptedUpstream::new()
        .when(|r| r.http_method() == "GET", Reply::sse().then_hang())
        .when(|r| r.http_method() == "DELETE", Reply::empty(200))
        .when(|r| r.json.get("id").is_none(), Reply::empty(202))
        .when_fn(
            |r| r.method() == "initialize",
            move |_| {
                let n = sessions.fetch_add(1, Ordering::SeqCst) + 1;
                Reply::result(json!({"protocolVersion": "2025-11-25",
                    "capabilities": {"tools": {}, "resources": {"subscribe": true}},
                    "serverInfo": {"name": "asks", "version": "1"}}))
                .header("mcp-session-id", &format!("s-{n}"))
            },
        )
        .when(
            |r| r.tool() == Some("ask"),
            Reply::sse().event(QUESTION).then_hang(),
        )
        .when(
            |r| r.tool() == Some("echo"),
            Reply::result(json!({"content": [{"type": "text", "text": "echoed"}]})),
        )
        .otherwise(Reply::result(json!({"tools": []})))
        .start()
}

/// Every capability a question may need.
fn all_capabilities() -> Value {
    json!({"elicitation": {"form": {}}, "sampling": {}, "roots": {}})
}

/// A 2026 `tools/call` of `tool` declaring `caps`.
fn call_body(id: u64, tool: &str, caps: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": tool, "arguments": {},
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": caps,
            "io.modelcontextprotocol/clientInfo": {"name": "ledger-tests", "version": "0"}
        }
    }})
}

/// A 2026 request `body` with `extra` headers: its status, `Retry-After` and message.
async fn post(
    url: &str,
    method: &str,
    name: Option<&str>,
    body: &Value,
    extra: &[(&str, &str)],
) -> (u16, Option<String>, Value) {
    let mut req = http().post(url).body(body.to_string());
    for (k, v) in modern_headers(method, name) {
        req = req.header(k, v);
    }
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let retry = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
    let text = resp.text().await.unwrap();
    (status, retry, last_message(&ct, &text))
}

/// A 2026 `subscriptions/listen` held open: the response, once its head came.
pub(crate) async fn listen(
    url: &str,
    id: u64,
    filter: Value,
    extra: &[(&str, &str)],
) -> reqwest::Response {
    let body = modern_body(
        json!(id),
        "subscriptions/listen",
        json!({"notifications": filter}),
    );
    let mut req = http().post(url).body(body.to_string());
    for (k, v) in modern_headers("subscriptions/listen", None) {
        req = req.header(k, v);
    }
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

/// One caller without credentials, at the default settings, holds calls and listen streams
/// until it is refused (429, naming its share), and meanwhile another caller's 100 calls all
/// succeed: the caller's held calls never take the upstream connections calls need (before,
/// 256 asking calls held all 256, and every other call got 503 after a second).
#[tokio::test]
async fn one_caller_without_credentials_never_takes_what_anothers_calls_need() {
    let up = asking_upstream();
    let sc = Sidecar::start(&up.url(), &[ERA_2025]);
    let url = sc.url();
    // 300 asking calls, 64 at a time.
    let outcomes: Vec<(u16, Option<String>, Value)> = futures_util::stream::iter(0..300u64)
        .map(|i| {
            let url = url.clone();
            async move {
                let body = call_body(i, "ask", all_capabilities());
                post(&url, "tools/call", Some("ask"), &body, &[]).await
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let held = outcomes
        .iter()
        .filter(|(_, _, m)| m["result"]["resultType"] == "input_required")
        .count();
    assert_eq!(held, 16, "the default share of held calls");
    for (status, retry, msg) in outcomes
        .iter()
        .filter(|(_, _, m)| m["result"]["resultType"] != "input_required")
    {
        assert_eq!(*status, 429, "{msg}");
        assert_eq!(retry.as_deref(), Some("1"), "{msg}");
        let text = msg["error"]["message"].as_str().unwrap_or_default();
        assert!(
            text.contains("EPODE_SIDECAR_HELD_CALLS_PER_CALLER"),
            "{text}"
        );
    }
    // Listen streams, until refused: 16 open, then 429.
    let mut open = Vec::new();
    let mut refused = 0;
    for i in 0..40u64 {
        let resp = listen(&url, 1000 + i, json!({"toolsListChanged": true}), &[]).await;
        match resp.status().as_u16() {
            200 => open.push(resp),
            429 => refused += 1,
            s => panic!("listen {i}: {s} {:?}", resp.text().await),
        }
    }
    assert_eq!((open.len(), refused), (16, 24));
    // Another caller: 100 calls, every one answered.
    for i in 0..100u64 {
        let body = call_body(5000 + i, "echo", json!({}));
        let (status, _, msg) = post(
            &url,
            "tools/call",
            Some("echo"),
            &body,
            &[("authorization", "Bearer bob")],
        )
        .await;
        assert_eq!(status, 200, "call {i}: {msg}");
        assert_eq!(msg["result"]["content"][0]["text"], "echoed", "{msg}");
    }
    let m = get_blocking(sc.addr, "/metrics");
    assert_eq!(
        metric_value(&m, r#"epode_sidecar_pool_in_use{pool="held_calls"}"#),
        16
    );
    assert_eq!(
        metric_value(&m, r#"epode_sidecar_pool_in_use{pool="listen_streams"}"#),
        16
    );
    assert!(
        metric_value(
            &m,
            r#"epode_sidecar_pool_refused_total{pool="held_calls",reason="share"}"#
        ) >= 284
    );
    // 16 held calls, one listen feed, and the session streams read for the two callers'
    // calls in flight: the upstream connections they keep, charged.
    assert_eq!(
        metric_value(&m, r#"epode_sidecar_pool_in_use{pool="held_connections"}"#),
        19
    );
    // Sessions: ten capability sets, each a 2025 session of its own; the caller keeps its
    // share (4), its own least recently used making room, and another caller's calls go on.
    for i in 0..10u64 {
        let mut body = modern_body(json!(9000 + i), "tools/list", json!({}));
        body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] =
            json!({"experimental": {format!("set-{i}"): {}}});
        let (status, _, msg) = post(&url, "tools/list", None, &body, &[]).await;
        assert_eq!(status, 200, "{msg}");
        let body = call_body(9100 + i, "echo", json!({}));
        let bob = [("authorization", "Bearer bob")];
        let (status, _, msg) = post(&url, "tools/call", Some("echo"), &body, &bob).await;
        assert_eq!(status, 200, "{msg}");
    }
    let m = get_blocking(sc.addr, "/metrics");
    let sessions = metric_value(&m, r#"epode_sidecar_pool_in_use{pool="upstream_sessions"}"#);
    assert!(
        sessions <= 5,
        "{sessions} sessions: the caller's 4 and bob's 1 at most"
    );
    drop(open);
}

/// A held call retried again and again without its answers is the same call: one deadline
/// from when it was first held (a retry renews nothing), no memory per retry. 50,000 retries
/// keep the sidecar within its memory budget plus 32 MB (before, each retry started a deadline
/// task of its own: 524 bytes a retry, outside the budget).
#[tokio::test]
async fn a_retry_storm_of_one_held_call_renews_nothing_and_holds_no_memory() {
    let up = asking_upstream();
    let sc = Sidecar::start(
        &up.url(),
        &[
            ERA_2025,
            ("EPODE_SIDECAR_MEMORY_BUDGET_BYTES", "16777216"),
            ("EPODE_SIDECAR_HELD_CALL_WAIT", "1h"),
        ],
    );
    let url = sc.url();
    let first = call_body(1, "ask", all_capabilities());
    let (_, _, msg) = post(&url, "tools/call", Some("ask"), &first, &[]).await;
    let mut state = msg["result"]["requestState"].as_str().unwrap().to_owned();
    let retry_of = |state: &str, id: u64| {
        let mut r = first.clone();
        r["id"] = json!(id);
        r["params"]["inputResponses"] = json!({});
        r["params"]["requestState"] = json!(state);
        r
    };
    let client = http();
    let started = Instant::now();
    for i in 0..50_000u64 {
        let body = retry_of(&state, 10 + i);
        let mut req = client.post(&url).body(body.to_string());
        for (k, v) in modern_headers("tools/call", Some("ask")) {
            req = req.header(k, v);
        }
        let resp = req.send().await.unwrap();
        let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
        let msg = last_message(&ct, &resp.text().await.unwrap());
        state = msg["result"]["requestState"]
            .as_str()
            .unwrap_or_else(|| panic!("retry {i}: {msg}"))
            .to_owned();
    }
    let took = started.elapsed();
    let peak_kib = status_kib(sc.pid(), "VmHWM");
    // The memory budget (16 MiB) plus 32 MB: the process's whole peak, its start included.
    assert!(
        peak_kib < 16 * 1024 + 32 * 1024,
        "peak RSS {peak_kib} KiB after 50,000 retries in {took:?}"
    );
    assert_eq!(metric(&sc, "epode_sidecar_held_calls ").await, 1);
    eprintln!("50,000 retries in {took:?}; peak RSS {peak_kib} KiB");
}

/// A retry without answers does not move the deadline: a call held with a 3 s wait and
/// retried every 200 ms is let go 3 s after it was first held (before, each retry held it
/// for another wait, without end).
#[tokio::test]
async fn a_held_calls_deadline_is_when_it_was_first_held() {
    let up = asking_upstream();
    let sc = Sidecar::start(
        &up.url(),
        &[ERA_2025, ("EPODE_SIDECAR_HELD_CALL_WAIT", "3s")],
    );
    let url = sc.url();
    let first = call_body(1, "ask", all_capabilities());
    let (_, _, msg) = post(&url, "tools/call", Some("ask"), &first, &[]).await;
    let held_at = Instant::now();
    let mut state = msg["result"]["requestState"].as_str().unwrap().to_owned();
    let gone_at = loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut r = first.clone();
        r["id"] = json!(2);
        r["params"]["inputResponses"] = json!({});
        r["params"]["requestState"] = json!(state);
        let (status, _, msg) = post(&url, "tools/call", Some("ask"), &r, &[]).await;
        match msg["result"]["requestState"].as_str() {
            Some(s) => state = s.to_owned(),
            None => {
                assert_eq!(status, 400, "{msg}");
                let text = msg["error"]["message"].as_str().unwrap();
                assert!(
                    text.contains("expired") || text.contains("cancelled"),
                    "{text}"
                );
                break held_at.elapsed();
            }
        }
        assert!(
            held_at.elapsed() < Duration::from_secs(20),
            "still held after 20 s of retries"
        );
    };
    assert!(
        gone_at >= Duration::from_millis(2500) && gone_at < Duration::from_secs(8),
        "let go after {gone_at:?}"
    );
}

/// The same with the real peer: the Python SDK's stateful 2025 server, whose `ask_count`
/// waits in `ctx.elicit`, sees its wait cancelled once the sidecar lets the call go (before,
/// the tool waited on: `cancelled 0`).
#[tokio::test]
async fn a_python_tool_waiting_for_its_answer_is_cancelled_when_its_call_is_let_go() {
    use crate::support::{Upstream, UpstreamKind};
    let up = Upstream::start_with(UpstreamKind::Python, &["--questions", "--era", "2025"]);
    let sc = Sidecar::start(
        &up.url(),
        &[ERA_2025, ("EPODE_SIDECAR_HELD_CALL_WAIT", "1s")],
    );
    let first = call_body(7, "ask_count", all_capabilities());
    let (_, _, msg) = post(&sc.url(), "tools/call", Some("ask_count"), &first, &[]).await;
    assert_eq!(msg["result"]["resultType"], "input_required", "{msg}");
    let said = std::sync::Mutex::new(Value::Null);
    let ended = eventually_async(Duration::from_secs(15), || async {
        let body = call_body(8, "cancelled", all_capabilities());
        let (_, _, msg) = post(&sc.url(), "tools/call", Some("cancelled"), &body, &[]).await;
        let text = msg["result"]["content"][0]["text"].clone();
        let done = text == "cancelled 1";
        *said.lock().unwrap() = text;
        done
    })
    .await;
    let said = said.into_inner().unwrap();
    assert!(ended, "the tool's wait was never cancelled: {said}");
}

/// A held call let go at its deadline is cancelled upstream: the 2025 server gets
/// `notifications/cancelled` for it in its session (a disconnect is no cancellation there, so
/// a FastMCP tool waiting in `ctx.elicit` would otherwise wait on). Before, it was only
/// disconnected.
#[tokio::test]
async fn a_held_call_let_go_is_cancelled_upstream() {
    let up = asking_upstream();
    let sc = Sidecar::start(
        &up.url(),
        &[ERA_2025, ("EPODE_SIDECAR_HELD_CALL_WAIT", "1s")],
    );
    let first = call_body(7, "ask", all_capabilities());
    let (_, _, msg) = post(&sc.url(), "tools/call", Some("ask"), &first, &[]).await;
    assert_eq!(msg["result"]["resultType"], "input_required", "{msg}");
    let cancelled =
        |r: &Request| r.method() == "notifications/cancelled" && r.json["params"]["requestId"] == 7;
    let told = eventually_async(Duration::from_secs(10), || {
        std::future::ready(up.requests().iter().any(cancelled))
    })
    .await;
    assert!(told, "{:?}", up.methods());
    let cancel = up.requests().into_iter().find(|r| cancelled(r)).unwrap();
    let call = up
        .requests()
        .into_iter()
        .find(|r| r.tool() == Some("ask"))
        .unwrap();
    assert_eq!(
        cancel.header("mcp-session-id"),
        call.header("mcp-session-id"),
        "in the call's session"
    );
    assert_eq!(
        metric(&sc, "epode_sidecar_held_calls_expired_total").await,
        1
    );
}

/// Past the held calls' bound, a question that is the call's first message fails the call
/// with 503 and `Retry-After` (the answer's own status, not an error event after 200); past
/// a caller's share, with 429. Before, both were 200 with no `Retry-After`.
#[tokio::test]
async fn past_a_bound_a_question_is_refused_with_its_status_and_retry_after() {
    let up = asking_upstream();
    let sc = Sidecar::start(&up.url(), &[ERA_2025, ("EPODE_SIDECAR_HELD_CALLS", "1")]);
    let (_, _, msg) = post(
        &sc.url(),
        "tools/call",
        Some("ask"),
        &call_body(1, "ask", all_capabilities()),
        &[],
    )
    .await;
    assert_eq!(msg["result"]["resultType"], "input_required", "{msg}");
    let (status, retry, msg) = post(
        &sc.url(),
        "tools/call",
        Some("ask"),
        &call_body(2, "ask", all_capabilities()),
        &[("authorization", "Bearer another")],
    )
    .await;
    assert_eq!((status, retry.as_deref()), (503, Some("1")), "{msg}");
    assert_eq!(msg["id"], 2, "{msg}");
    assert!(msg["error"]["message"]
        .as_str()
        .unwrap()
        .contains("EPODE_SIDECAR_HELD_CALLS"));

    let sc = Sidecar::start(
        &up.url(),
        &[ERA_2025, ("EPODE_SIDECAR_HELD_CALLS_PER_CALLER", "1")],
    );
    let body = call_body(1, "ask", all_capabilities());
    let (_, _, msg) = post(&sc.url(), "tools/call", Some("ask"), &body, &[]).await;
    assert_eq!(msg["result"]["resultType"], "input_required", "{msg}");
    let (status, retry, msg) = post(&sc.url(), "tools/call", Some("ask"), &body, &[]).await;
    assert_eq!((status, retry.as_deref()), (429, Some("1")), "{msg}");
    assert!(msg["error"]["message"]
        .as_str()
        .unwrap()
        .contains("EPODE_SIDECAR_HELD_CALLS_PER_CALLER"));
    // Another caller still has its own share.
    let (_, _, msg) = post(
        &sc.url(),
        "tools/call",
        Some("ask"),
        &body,
        &[("authorization", "Bearer another")],
    )
    .await;
    assert_eq!(msg["result"]["resultType"], "input_required", "{msg}");
}

/// A 2026 upstream that asks for input on every call (an `input_required` result with one
/// question).
fn input_required_upstream() -> Scripted {
    ScriptedUpstream::new()
        .on(
            "server/discover",
            Reply::result(json!({"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}},
                "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "asks", "version": "1"}}})),
        )
        .on(
            "tools/call",
            Reply::result(json!({"resultType": "input_required",
                "inputRequests": {"q": {"method": "elicitation/create", "params": {"mode": "form", "message": "Sure?", "requestedSchema": {"type": "object"}}}},
                "requestState": "opaque"})),
        )
        .otherwise(Reply::result(json!({"tools": []})))
        .start()
}

/// A 2025 client's call of a 2026 upstream that asks: the response, kept open while the
/// question waits for its answer.
async fn legacy_call(url: &str, id: u64, token: Option<&str>) -> reqwest::Response {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "confirm", "arguments": {}}});
    let mut req = http()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .body(body.to_string());
    if let Some(t) = token {
        req = req.header("authorization", t);
    }
    req.send().await.unwrap()
}

/// One 2025 client cannot hold every question the sidecar asks for 2026 upstreams: past its
/// share (64) its call is refused with 429 and `Retry-After` (the first round's places are
/// taken before the answer's head), and another client is still asked. Before, one client
/// could hold all 4,096.
#[tokio::test]
async fn one_client_holds_at_most_its_share_of_the_questions() {
    let up = input_required_upstream();
    let sc = Sidecar::start(&up.url(), &[ERA_2026]);
    let url = sc.url();
    let mut streams = Vec::new();
    let mut refused = 0;
    for i in 0..80u64 {
        let resp = legacy_call(&url, i, None).await;
        match resp.status().as_u16() {
            200 => streams.push(resp),
            429 => {
                assert_eq!(resp.headers()["retry-after"], "1");
                let msg: Value = resp.json().await.unwrap();
                assert_eq!(msg["id"], i, "{msg}");
                assert!(msg["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("EPODE_SIDECAR_QUESTIONS_PER_CALLER"));
                refused += 1;
            }
            s => panic!("call {i}: {s}"),
        }
    }
    assert_eq!((streams.len(), refused), (64, 16));
    // Another client is asked.
    let mut other = legacy_call(&url, 999, Some("Bearer bob")).await;
    assert_eq!(other.status(), 200);
    let first = tokio::time::timeout(Duration::from_secs(10), other.chunk())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&first);
    assert!(text.contains("elicitation/create"), "{text}");
    // And another caller's 100 requests are all answered meanwhile.
    for i in 0..100u64 {
        let body = modern_body(json!(2000 + i), "tools/list", json!({}));
        let bob = [("authorization", "Bearer bob")];
        let (status, _, msg) = post(&url, "tools/list", None, &body, &bob).await;
        assert_eq!(status, 200, "request {i}: {msg}");
        assert!(msg["result"]["tools"].is_array(), "{msg}");
    }
    assert_eq!(
        metric(&sc, r#"epode_sidecar_pool_in_use{pool="questions"}"#).await,
        65
    );
    drop(streams);
}

/// A caller's capability sets never close another caller's 2025 session: one caller holds
/// at most its share of sessions (4; its own least recently used makes room). Before, each
/// capability set opened another session and, at the cap, closed other callers'.
#[tokio::test]
async fn a_callers_capability_sets_never_close_another_callers_session() {
    let up = asking_upstream();
    let sc = Sidecar::start(
        &up.url(),
        &[ERA_2025, ("EPODE_SIDECAR_UPSTREAM_SESSIONS", "8")],
    );
    let url = sc.url();
    let bob = [("authorization", "Bearer bob")];
    let list = |caps: Value| {
        let mut b = modern_body(json!(1), "tools/list", json!({}));
        b["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] = caps;
        b
    };
    let (status, _, _) = post(&url, "tools/list", None, &list(json!({})), &bob).await;
    assert_eq!(status, 200);
    for i in 0..10 {
        let caps = json!({"experimental": {format!("set-{i}"): {}}});
        let (status, _, msg) = post(
            &url,
            "tools/list",
            None,
            &list(caps),
            &[("authorization", "Bearer alice")],
        )
        .await;
        assert_eq!(status, 200, "{msg}");
    }
    let (status, _, _) = post(&url, "tools/list", None, &list(json!({})), &bob).await;
    assert_eq!(status, 200);
    let bobs: Vec<String> = up
        .requests()
        .iter()
        .filter(|r| {
            r.method() == "tools/list" && r.header("authorization").as_deref() == Some("Bearer bob")
        })
        .filter_map(|r| r.header("mcp-session-id"))
        .collect();
    assert_eq!(bobs.len(), 2);
    assert_eq!(bobs[0], bobs[1], "bob's session was closed by alice's");
    let m = get_blocking(sc.addr, "/metrics");
    assert_eq!(
        metric_value(&m, r#"epode_sidecar_pool_in_use{pool="upstream_sessions"}"#),
        5,
        "alice's share (4) and bob's one"
    );
}

/// A 2025 client's `initialize` opens the upstream session its later requests use: one
/// handshake upstream, not one for the `initialize` and another for the requests.
#[tokio::test]
async fn a_2025_clients_initialize_opens_the_session_its_requests_use() {
    let up = asking_upstream();
    let sc = Sidecar::start(&up.url(), &[ERA_2025]);
    let legacy = |body: Value, session: Option<&str>| {
        let mut req = http()
            .post(sc.url())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .body(body.to_string());
        if let Some(s) = session {
            req = req.header("mcp-session-id", s);
        }
        req.send()
    };
    let init = legacy(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {"roots": {}},
            "clientInfo": {"name": "legacy", "version": "0"}}}),
        None,
    )
    .await
    .unwrap();
    assert_eq!(init.status(), 200);
    let sid = init.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let list = legacy(
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}),
        Some(&sid),
    )
    .await
    .unwrap();
    assert_eq!(list.status(), 200);
    let initializes = up
        .requests()
        .iter()
        .filter(|r| r.method() == "initialize")
        .count();
    assert_eq!(initializes, 1, "{:?}", up.methods());
}

/// A listen feed tells the upstream its listeners' URIs while it reads its stream: a notice
/// on the session's GET stream reaches the listener at once, however many URIs are being
/// subscribed (before, the feed subscribed them one at a time before reading again: 64 URIs
/// at 100 ms each held the notice for 6.4 s).
#[tokio::test]
async fn a_listen_feeds_notice_never_waits_for_its_subscriptions() {
    let notice = r#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#;
    let up = ScriptedUpstream::new()
        .when(
            |r| r.http_method() == "GET",
            Reply::sse()
                .pause(Duration::from_millis(300))
                .event(notice)
                .then_hang(),
        )
        .when(|r| r.json.get("id").is_none(), Reply::empty(202))
        .on(
            "initialize",
            Reply::result(json!({"protocolVersion": "2025-11-25",
                "capabilities": {"tools": {"listChanged": true}, "resources": {"subscribe": true}},
                "serverInfo": {"name": "subs", "version": "1"}}))
            .header("mcp-session-id", "s-1"),
        )
        .on(
            "resources/subscribe",
            Reply::result(json!({})).delayed(Duration::from_millis(100)),
        )
        .otherwise(Reply::result(json!({"tools": []})))
        .start();
    let sc = Sidecar::start(&up.url(), &[ERA_2025]);
    let uris: Vec<String> = (0..64).map(|i| format!("file:///doc-{i}")).collect();
    let started = Instant::now();
    let mut resp = listen(
        &sc.url(),
        1,
        json!({"toolsListChanged": true, "resourceSubscriptions": uris}),
        &[],
    )
    .await;
    assert_eq!(resp.status(), 200);
    let mut seen = String::new();
    let heard = loop {
        let chunk = tokio::time::timeout(Duration::from_secs(20), resp.chunk())
            .await
            .expect("no notice within 20 s")
            .unwrap()
            .expect("the stream ended");
        seen.push_str(&String::from_utf8_lossy(&chunk));
        if seen.contains("notifications/tools/list_changed") {
            break started.elapsed();
        }
    };
    assert!(heard < Duration::from_secs(3), "the notice took {heard:?}");
}

/// The headers the sidecar owns never reach the upstream in another spelling an app server
/// may read as them (`Epode_Auth_Subject` folded by WSGI, `X-Epode-Auth-*`,
/// `Epode.Auth.Subject`): on the MCP path and the HTTP surface. Before, they passed.
#[tokio::test]
async fn owned_headers_never_pass_in_another_spelling() {
    let up = ScriptedUpstream::new()
        .on(
            "tools/call",
            Reply::result(json!({"content": [{"type": "text", "text": "ok"}]})),
        )
        .when(
            |r| r.http_method() == "GET",
            Reply::body("text/plain").text("page"),
        )
        .otherwise(Reply::result(json!({"tools": []})))
        .start();
    let sc = Sidecar::start(&up.url(), &[ERA_2026, ("EPODE_SIDECAR_HTTP_SURFACE", "on")]);
    let forged = [
        ("Epode_Auth_Subject", "admin"),
        ("Epode_Auth_Scopes", "mcp:admin"),
        ("X-Epode-Auth-Subject", "admin"),
        ("x_epode_auth_client", "trusted"),
        ("Epode.Auth.Subject", "admin"),
        ("X-Epode-Identity", r#"{"accountRef":"acct_1"}"#),
    ];
    let (status, _, msg) = post(
        &sc.url(),
        "tools/call",
        Some("echo"),
        &call_body(1, "echo", json!({})),
        &forged,
    )
    .await;
    assert_eq!(status, 200, "{msg}");
    let mut req = http().get(format!("{}/page", sc.base()));
    for (k, v) in forged {
        req = req.header(k, v);
    }
    let page = req.send().await.unwrap();
    assert_eq!(page.status(), 200);
    let heads: Vec<String> = up
        .requests()
        .iter()
        .filter(|r| r.tool() == Some("echo") || r.http_method() == "GET")
        .map(|r| r.head.to_ascii_lowercase())
        .collect();
    assert_eq!(heads.len(), 2, "{heads:?}");
    for head in heads {
        let folded = head.replace(['_', '.'], "-");
        assert!(!folded.contains("epode-auth"), "{head}");
        assert!(!folded.contains("epode-identity"), "{head}");
    }
}
