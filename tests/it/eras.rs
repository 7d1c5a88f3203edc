//! Any client era in front of any upstream era, against real peers: the official TypeScript
//! client (pinned 2026-07-28 and default legacy) and the TypeScript SDK v1 client (2025-11-25,
//! what most clients run) through the sidecar to Python `mcp==2.3.0`, the TypeScript server
//! (dual-era and modern-only) and server-everything (2025-only, stateful, issues session ids).

use std::time::Duration;

use crate::support::*;
use serde_json::{json, Value};

fn assert_client_works(report: &Value, era: &str, what: &str) {
    assert!(report.get("error").is_none(), "{what}: {report}");
    assert_eq!(report["era"], era, "{what}: {report}");
    assert!(
        !report["tools"].as_array().unwrap().is_empty(),
        "{what}: {report}"
    );
}

#[test]
fn modern_client_reaches_a_2025_only_stateful_upstream() {
    let up = Upstream::start(UpstreamKind::Everything);
    // Directly, the pinned client cannot talk to it at all.
    let direct = ts_client(&up.url(), "pin", &["--everything"]);
    assert!(direct.get("error").is_some(), "{direct}");
    let sc = Sidecar::start(&up.url(), &[]);
    let via = ts_client(&sc.url(), "pin", &["--everything"]);
    assert_client_works(&via, "modern", "pin via sidecar");
    assert_eq!(via["negotiatedVersion"], "2026-07-28");
    assert!(via["serverInfo"]["name"].as_str().is_some(), "{via}");
    let echo = via["calls"]["echo"].to_string();
    assert!(echo.contains("hi ✓"), "{echo}");
    assert_eq!(via["calls"]["add"]["isError"], Value::Null, "{via}");
    assert!(via["calls"]["add"].to_string().contains('5'), "{via}");
    // Progress from the upstream's stream reaches the 2026 client before the result.
    let progress = via["progress"].as_array().unwrap();
    assert_eq!(progress.len(), 2, "{via}");
    // The tools are what the upstream has (the 2026 client drops 2025-only fields such as
    // `execution`, so names are compared).
    let legacy = ts_client(&up.url(), "legacy", &["--everything"]);
    let names = |r: &Value| -> Vec<String> {
        r["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(names(&legacy), names(&via));
}

#[test]
fn legacy_client_through_the_sidecar_to_a_2025_only_upstream() {
    let up = Upstream::start(UpstreamKind::Everything);
    let sc = Sidecar::start(&up.url(), &[]);
    let direct = ts_client(&up.url(), "legacy", &["--everything"]);
    let via = ts_client(&sc.url(), "legacy", &["--everything"]);
    assert_client_works(&via, "legacy", "legacy via sidecar");
    assert_eq!(direct["tools"], via["tools"]);
    assert_eq!(direct["calls"]["echo"], via["calls"]["echo"]);
    assert_eq!(direct["calls"]["add"], via["calls"]["add"]);
    assert_eq!(direct["serverInfo"], via["serverInfo"]);
}

#[test]
fn legacy_client_reaches_a_modern_only_upstream() {
    let up = Upstream::start(UpstreamKind::TypeScriptModernOnly);
    let direct = ts_client(&up.url(), "legacy", &[]);
    assert!(
        direct.get("error").is_some(),
        "direct legacy must fail: {direct}"
    );
    let sc = Sidecar::start(&up.url(), &[]);
    let via = ts_client(&sc.url(), "legacy", &[]);
    assert_client_works(&via, "legacy", "legacy via sidecar");
    let modern = ts_client(&up.url(), "pin", &[]);
    assert_eq!(modern["tools"], via["tools"]);
    // The same results, in 2025 shape (identity travels in initialize, not per result).
    let mut calls = modern["calls"].clone();
    for c in calls.as_object_mut().unwrap().values_mut() {
        c.as_object_mut().unwrap().remove("_meta");
    }
    assert_eq!(calls, via["calls"]);
    assert_eq!(
        via["serverInfo"],
        json!({"name": "ts-peer", "version": "0.0.1"})
    );
    assert_eq!(via["progress"].as_array().unwrap().len(), 2, "{via}");
}

#[test]
fn pinned_and_legacy_clients_on_every_upstream() {
    for kind in [UpstreamKind::Python, UpstreamKind::TypeScript] {
        let up = Upstream::start(kind);
        let sc = Sidecar::start(&up.url(), &[]);
        for (mode, era) in [("pin", "modern"), ("legacy", "legacy")] {
            let via = ts_client(&sc.url(), mode, &[]);
            assert_client_works(&via, era, &format!("{kind:?} {mode}"));
            assert_eq!(via["calls"]["add"]["structuredContent"]["sum"], 5);
        }
    }
}

async fn discover(url: &str, id: u64, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut req = http()
        .post(url)
        .body(modern_body(json!(id), "server/discover", json!({})).to_string());
    for (k, v) in modern_headers("server/discover", None) {
        req = req.header(k, v);
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

#[tokio::test]
async fn discovery_of_a_2025_upstream_has_the_2026_shape() {
    let up = Upstream::start(UpstreamKind::Everything);
    let sc = Sidecar::start(
        &up.url(),
        &[
            ("EPODE_SIDECAR_CACHE_TTL_MS", "60000"),
            ("EPODE_SIDECAR_CACHE_SCOPE", "public"),
            ("EPODE_SIDECAR_SERVER_NAME", "orders"),
        ],
    );
    let resp = discover(&sc.url(), 1, &[]).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("mcp-session-id").is_none());
    let v: Value = resp.json().await.unwrap();
    let r = &v["result"];
    assert_eq!(v["id"], 1);
    assert_eq!(r["resultType"], "complete");
    assert_eq!(r["supportedVersions"], json!(["2026-07-28"]));
    assert!(r["capabilities"]["tools"].is_object(), "{r}");
    assert_eq!(r["ttlMs"], 60000);
    assert_eq!(r["cacheScope"], "public");
    let info = &r["_meta"]["io.modelcontextprotocol/serverInfo"];
    assert_eq!(info["name"], "orders", "{r}");
    assert!(info["version"].is_string(), "{r}");

    // A later request carries the same identity and cache hints, and no session id.
    let body = modern_body(json!(2), "tools/list", json!({}));
    let resp = post_modern(&sc.url(), "tools/list", None, &body).await;
    assert!(resp.headers().get("mcp-session-id").is_none());
    let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
    let v = last_message(&ct, &resp.text().await.unwrap());
    assert_eq!(v["result"]["resultType"], "complete");
    assert_eq!(v["result"]["ttlMs"], 60000);
    assert_eq!(
        v["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "orders"
    );
    let names: Vec<&str> = v["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        direct_legacy_tool_names(&up.url()).await,
        "tools/list keeps the upstream's own order"
    );
}

/// The tool names a 2025-era upstream lists, in its order, over its own session.
async fn direct_legacy_tool_names(url: &str) -> Vec<String> {
    let post = |body: Value, session: Option<String>| {
        let mut req = http()
            .post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body.to_string());
        if let Some(s) = session {
            req = req
                .header("mcp-session-id", s)
                .header("mcp-protocol-version", "2025-11-25");
        }
        req.send()
    };
    let init = post(
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}),
        None,
    )
    .await
    .unwrap();
    let session = init.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let _ = init.text().await;
    let _ = post(
        json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
        Some(session.clone()),
    )
    .await
    .unwrap();
    let list = post(
        json!({"jsonrpc":"2.0","id":2,"method":"tools/list"}),
        Some(session),
    )
    .await
    .unwrap();
    let ct = list.headers()["content-type"].to_str().unwrap().to_owned();
    let v = last_message(&ct, &list.text().await.unwrap());
    v["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn upstream_cache_hints_win_over_defaults() {
    let up = Upstream::start(UpstreamKind::Python);
    let sc = Sidecar::start(&up.url(), &[("EPODE_SIDECAR_CACHE_TTL_MS", "60000")]);
    let body = modern_body(json!(1), "tools/list", json!({}));
    let resp = post_modern(&sc.url(), "tools/list", None, &body).await;
    let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
    let v = last_message(&ct, &resp.text().await.unwrap());
    assert_eq!(
        v["result"]["ttlMs"], 0,
        "the upstream's own ttlMs is kept: {v}"
    );
    assert_eq!(v["result"]["cacheScope"], "private");
}

/// Discovery and `initialize` go upstream with the client's credentials: a product that
/// requires authentication still refuses an unauthenticated discovery, as it would directly.
#[tokio::test]
async fn discovery_is_not_answered_for_an_upstream_that_refuses() {
    let up = Upstream::start_with(UpstreamKind::Python, &["--require-token", "s3cret"]);
    let sc = Sidecar::start(&up.url(), &[]);
    let resp = discover(&sc.url(), 1, &[]).await;
    assert_eq!(resp.status(), 401);
    assert!(resp.headers().get("www-authenticate").is_some());
    let ok = discover(&sc.url(), 2, &[("authorization", "Bearer s3cret")]).await;
    assert_eq!(ok.status(), 200);
    // Once the sidecar knows the era, an unauthenticated discovery is still refused.
    let again = discover(&sc.url(), 3, &[]).await;
    assert_eq!(again.status(), 401);

    let resp = initialize(&sc.url(), "2025-11-25").await;
    assert_eq!(resp.status(), 401);
}

/// A 2025-era `initialize` asking for `version`, with no session and no version header.
async fn initialize(url: &str, version: &str) -> reqwest::Response {
    let init = json!({"jsonrpc":"2.0","id":"i","method":"initialize","params":{
        "protocolVersion":version,"capabilities":{},"clientInfo":{"name":"t","version":"0"}}});
    http()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(init.to_string())
        .send()
        .await
        .unwrap()
}

/// `initialize` is answered per request: no session id is minted, and the client gets the
/// version it asked for when the sidecar serves it.
#[tokio::test]
async fn legacy_initialize_is_stateless() {
    let up = Upstream::start(UpstreamKind::Python);
    let sc = Sidecar::start(&up.url(), &[]);
    for (asked, expect) in [("2025-06-18", "2025-06-18"), ("1999-01-01", "2025-11-25")] {
        let resp = initialize(&sc.url(), asked).await;
        assert_eq!(resp.status(), 200);
        assert!(resp.headers().get("mcp-session-id").is_none());
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["result"]["protocolVersion"], expect);
        assert_eq!(v["result"]["serverInfo"]["name"], "py-peer");
        assert!(v["result"]["capabilities"]["tools"].is_object());
        assert!(v["result"].get("resultType").is_none());
    }
}

/// Waits until nothing answers on `port` any more (a stopped peer's socket is gone).
fn wait_port_free(port: u16) {
    assert!(
        eventually(Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
        }),
        "port {port} still answers"
    );
}

/// The upstream restarts and forgets its sessions: the sidecar initialises again and the
/// client never notices. Then the upstream is redeployed as another era on the same port.
#[test]
fn upstream_restart_and_redeploy() {
    let port = free_port();
    let up = Upstream::start_on(UpstreamKind::Everything, port, &[]);
    let sc = Sidecar::start(&format!("http://127.0.0.1:{port}/mcp"), &[]);
    let first = ts_client(&sc.url(), "pin", &["--everything"]);
    assert_client_works(&first, "modern", "before restart");
    drop(up);
    let up = Upstream::start_on(UpstreamKind::Everything, port, &[]);
    let second = ts_client(&sc.url(), "pin", &["--everything"]);
    assert_client_works(&second, "modern", "after restart (new sessions upstream)");
    drop(up);
    wait_port_free(port);

    // Redeployed as a 2026 server: the era is checked again, not cached forever.
    let up = Upstream::start_on(UpstreamKind::TypeScriptModernOnly, port, &[]);
    let third = ts_client(&sc.url(), "legacy", &[]);
    assert_client_works(&third, "legacy", "after redeploy as a 2026-only server");
    assert_eq!(third["serverInfo"]["name"], "ts-peer");
    drop(up);
    wait_port_free(port);

    // And back to a 2025-only server.
    let _up = Upstream::start_on(UpstreamKind::Everything, port, &[]);
    let fourth = ts_client(&sc.url(), "pin", &["--everything"]);
    assert_client_works(
        &fourth,
        "modern",
        "after redeploy back to a 2025-only server",
    );
}

/// `subscriptions/listen` stays open beyond the request timeout, its first event is the
/// acknowledgement, and a client that leaves closes it upstream.
#[tokio::test]
async fn listen_streams_stay_open() {
    for kind in [UpstreamKind::Python, UpstreamKind::Everything] {
        let up = Upstream::start(kind);
        let sc = Sidecar::start(&up.url(), &[("EPODE_SIDECAR_UPSTREAM_TIMEOUT", "500ms")]);
        let body = modern_body(
            json!("listen-1"),
            "subscriptions/listen",
            json!({"notifications": {"toolsListChanged": true}}),
        );
        let mut resp = post_modern(&sc.url(), "subscriptions/listen", None, &body).await;
        assert_eq!(resp.status(), 200, "{kind:?}");
        assert!(resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"));
        let first = tokio::time::timeout(Duration::from_secs(5), resp.chunk())
            .await
            .expect("first event")
            .unwrap()
            .unwrap();
        let text = String::from_utf8_lossy(&first).into_owned();
        assert!(
            text.contains("notifications/subscriptions/acknowledged"),
            "{kind:?}: {text}"
        );
        assert!(
            text.contains("\"io.modelcontextprotocol/subscriptionId\":\"listen-1\""),
            "{text}"
        );
        // Still open after more than twice the upstream timeout.
        let more = tokio::time::timeout(Duration::from_millis(1200), resp.chunk()).await;
        match more {
            Err(_) => {}          // nothing more yet: open
            Ok(Ok(Some(_))) => {} // a keep-alive or notification: open
            Ok(other) => panic!("{kind:?}: listen stream ended: {other:?}"),
        }
        drop(resp);
    }
}

/// A 2025-era upstream whose sessions are still open when the sidecar is told to stop gets a
/// `DELETE` for each (with its `Mcp-Session-Id` and the credentials it was opened with)
/// before the sidecar exits, as an idle or displaced session does.
#[test]
fn live_2025_sessions_get_their_delete_at_shutdown() {
    use std::sync::{Arc, Mutex};
    let deleted: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = deleted.clone();
    let up = ScriptedUpstream::new()
        .when_fn(
            |r| r.http_method() == "DELETE",
            move |r| {
                let session = r.header("mcp-session-id").unwrap_or_default();
                let auth = r.header("authorization").unwrap_or_default();
                seen.lock().unwrap().push(format!("{session} {auth}"));
                Reply::json("{}")
            },
        )
        .when(|r| r.json.get("id").is_none(), Reply::empty(202))
        .when_fn(
            |r| r.method() == "initialize",
            |r| {
                let token = r.header("authorization").unwrap_or_default();
                let session = format!("session-of-{}", token.replace("Bearer ", ""));
                let init = json!({"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": {"name": "raw", "version": "1"}});
                Reply::result(init).header("mcp-session-id", &session)
            },
        )
        .otherwise(Reply::result(json!({"tools": []})))
        .start();
    let mut sc = Sidecar::start(
        &up.url(),
        &[("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2025-11-25")],
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    for user in ["alice", "bob"] {
        let body = modern_body(json!(user), "tools/list", json!({}));
        let mut req = http()
            .post(sc.url())
            .header("authorization", format!("Bearer {user}"))
            .body(body.to_string());
        for (k, v) in modern_headers("tools/list", None) {
            req = req.header(k, v);
        }
        let status = rt.block_on(async { req.send().await.unwrap().status() });
        assert_eq!(status, 200);
    }
    assert!(deleted.lock().unwrap().is_empty(), "closed before shutdown");
    sc.terminate();
    assert_eq!(sc.wait_exit(Duration::from_secs(20)), Some(0));
    let mut closed = deleted.lock().unwrap().clone();
    closed.sort();
    assert_eq!(
        closed,
        ["session-of-alice Bearer alice", "session-of-bob Bearer bob"],
        "every live session closed with its own credentials"
    );
}

/// One operation of a [`v1_client`] report, which must have succeeded.
fn v1_ok<'a>(report: &'a Value, op: &str) -> &'a Value {
    let r = &report["ops"][op];
    assert!(r.get("ok").is_some(), "{op}: {r}\nreport: {report}");
    &r["ok"]
}

/// The TypeScript SDK v1 client (2025-11-25) in front of an upstream that speaks 2026 and
/// advertises `logging` and `completions` in both eras, as FastMCP does, while 2026 removed
/// `logging/setLevel`. Direct, the client negotiates 2025 with the upstream and every
/// operation works; through the sidecar it must work the same: `logging/setLevel` is answered
/// by the sidecar, `completion/complete` by the upstream, and the upstream's JSON-RPC error
/// (400 / -32602 for a resource it does not have) reaches the client as a JSON-RPC error with
/// 200, not as an HTTP failure a 2025 client reads as its connection broken.
#[test]
fn a_2025_client_in_front_of_a_2026_server() {
    let up = Upstream::start_with(UpstreamKind::Python, &["--logging-completion"]);
    let direct = v1_client(&up.url());
    let sc = Sidecar::start(&up.url(), &[]);
    let via = v1_client(&sc.url());
    for report in [&direct, &via] {
        assert_eq!(report["protocolVersion"], "2025-11-25", "{report}");
        assert_eq!(report["transportErrors"], json!([]), "{report}");
        assert_eq!(v1_ok(report, "setLevel"), &json!({}));
        assert_eq!(
            v1_ok(report, "complete")["completion"]["values"],
            json!(["Ada", "Alan"])
        );
        assert_eq!(v1_ok(report, "add")["structuredContent"]["sum"], 5);
        let missing = &report["ops"]["readMissing"]["error"];
        assert_eq!(missing["kind"], "mcp", "{report}");
        assert_eq!(missing["code"], -32602, "{report}");
    }
    assert_eq!(v1_ok(&direct, "listTools"), v1_ok(&via, "listTools"));
    // What the sidecar advertises to a 2025 client, it serves: logging and completions, but
    // nothing pushed (no GET stream, no resources/subscribe at a 2026 upstream).
    let caps = &via["capabilities"];
    assert_eq!(caps["logging"], json!({}), "{via}");
    assert_eq!(caps["completions"], json!({}), "{via}");
    for kind in ["tools", "prompts", "resources"] {
        assert_eq!(caps[kind], json!({}), "{kind}: {via}");
    }
}

/// A 2026-only upstream that has no prompts and no completions answers them 404 / -32601; a
/// 2025 client of the sidecar gets that JSON-RPC error with 200 (a 404 would tell it its
/// session is gone), and its connection keeps working.
#[test]
fn a_2025_client_gets_a_2026_servers_errors_as_json_rpc_errors() {
    let up = Upstream::start(UpstreamKind::TypeScriptModernOnly);
    let sc = Sidecar::start(&up.url(), &[]);
    let via = v1_client(&sc.url());
    assert_eq!(via["transportErrors"], json!([]), "{via}");
    for op in ["complete", "listPrompts"] {
        let e = &via["ops"][op]["error"];
        assert_eq!(e["kind"], "mcp", "{op}: {via}");
        assert_eq!(e["code"], -32601, "{op}: {via}");
    }
    assert_eq!(v1_ok(&via, "add")["structuredContent"]["sum"], 5);
    assert_eq!(v1_ok(&via, "setLevel"), &json!({}));
}

/// A 2025 client opens the optional GET stream at connect and the sidecar answers 405, as the
/// spec allows: that is expected traffic, counted (`front_door_refused_total`, reason
/// `get_stream`) and logged at DEBUG, never a WARN. A `DELETE` of a session is counted too; a
/// method no MCP client sends is still a warning.
#[tokio::test]
async fn a_2025_clients_get_stream_is_counted_not_warned() {
    let up = Upstream::start(UpstreamKind::TypeScriptModernOnly);
    let sc = Sidecar::start(&up.url(), &[("EPODE_SIDECAR_ADMIN_LISTEN", "127.0.0.1:0")]);
    let url = sc.url();
    let via = tokio::task::spawn_blocking(move || v1_client(&url))
        .await
        .unwrap();
    assert_eq!(v1_ok(&via, "add")["structuredContent"]["sum"], 5);
    let delete = http().delete(sc.url()).send().await.unwrap();
    assert_eq!(delete.status(), 405);
    let put = http().put(sc.url()).send().await.unwrap();
    assert_eq!(put.status(), 405);

    let mut logs = Vec::new();
    assert!(
        eventually_async(Duration::from_secs(10), || {
            logs.extend(sc.logs());
            let logged = |what: &str| logs.iter().any(|l| l.contains(what));
            std::future::ready(logged("GET is not served") && logged("PUT is not served"))
        })
        .await,
        "every refusal is logged:\n{}",
        logs.join("\n")
    );
    let level = |l: &str| l.split_whitespace().nth(1).unwrap_or_default().to_owned();
    for l in logs
        .iter()
        .filter(|l| l.contains("refused at the front door"))
    {
        let expected = l.contains("GET is not served") || l.contains("DELETE is not served");
        assert_eq!(level(l), if expected { "DEBUG" } else { "WARN" }, "{l}");
    }

    let metrics = get_blocking(sc.admin.unwrap(), "/metrics");
    let refused = |reason: &str| {
        metric_value(
            &metrics,
            &format!("epode_sidecar_front_door_refused_total{{reason=\"{reason}\"}}"),
        )
    };
    assert!(refused("get_stream") >= 1, "{metrics}");
    assert_eq!(refused("session_delete"), 1, "{metrics}");
    assert_eq!(refused("method"), 1, "{metrics}");
    assert_eq!(refused("host"), 0, "{metrics}");
}

/// A 2025-era HTTP server that asks its client a question in the middle of a call (a server
/// request on the call's event stream) never leaves the call waiting: a 2026 client is asked
/// at once, as `input_required` (the rounds themselves: `bridge.rs`), and a 2025 client is
/// asked at once on its call's stream, under an id of the sidecar's own (its answers:
/// `questions.rs`); before, its call ended with an error.
#[tokio::test]
async fn a_2025_servers_question_over_http_is_asked_at_once_of_either_era() {
    use crate::support::scripted::{Reply, ScriptedUpstream};
    let question = r#"{"jsonrpc":"2.0","id":"q-1","method":"elicitation/create","params":{"message":"How many people?","requestedSchema":{"type":"object","properties":{"n":{"type":"integer"}}}}}"#;
    let up = ScriptedUpstream::new()
        .when(|r| r.http_method() == "DELETE", Reply::json("{}"))
        .when(|r| r.json.get("id").is_none(), Reply::empty(202))
        .on(
            "initialize",
            Reply::result(json!({"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": {"name": "asks", "version": "1"}}))
                .header("mcp-session-id", "s-1"),
        )
        .on("tools/list", Reply::result(json!({"tools": [{"name": "book", "inputSchema": {"type": "object"}}]})))
        .on("tools/call", Reply::sse().event(question).then_hang())
        .start();
    let sc = Sidecar::start(
        &up.url(),
        &[("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2025-11-25")],
    );
    // A 2026 client that can answer.
    let started = std::time::Instant::now();
    let mut body = modern_body(
        json!(1),
        "tools/call",
        json!({"name": "book", "arguments": {}}),
    );
    body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] =
        json!({"elicitation": {}});
    let resp = post_modern(&sc.url(), "tools/call", Some("book"), &body).await;
    let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
    let msg = last_message(&ct, &resp.text().await.unwrap());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(msg["id"], 1, "{msg}");
    assert_eq!(msg["result"]["resultType"], "input_required", "{msg}");
    assert_eq!(
        msg["result"]["inputRequests"]["qq-1"]["method"], "elicitation/create",
        "{msg}"
    );
    // A 2025 client: the same, on its stream.
    let started = std::time::Instant::now();
    let legacy = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "book", "arguments": {}}});
    let resp = http()
        .post(sc.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .body(legacy.to_string())
        .send()
        .await
        .unwrap();
    let mut resp = resp;
    let mut seen = String::new();
    while !seen.contains("elicitation/create") {
        let chunk = tokio::time::timeout(Duration::from_secs(5), resp.chunk())
            .await
            .expect("the question within 5 s")
            .unwrap()
            .expect("the stream goes on");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let data = seen
        .lines()
        .find_map(|l| {
            l.strip_prefix("data:")
                .filter(|d| d.contains("elicitation"))
        })
        .unwrap();
    let asked: Value = serde_json::from_str(data.trim()).unwrap();
    let id = asked["id"].as_str().unwrap_or_default();
    assert!(id.starts_with("epode-sidecar-ask-"), "{asked}");
    assert_eq!(asked["params"]["message"], "How many people?", "{asked}");
}
