//! `subscriptions/listen` in front of a 2025-era server (which has none): a 2026 listener
//! hears the server's change notices (`tools/list_changed` sent on its session's GET stream,
//! on the call's own stream, or on a stdio child's pipe; `resources/updated` for the URIs it
//! named, `resources/subscribe` sent upstream for them), each with its `subscriptionId`,
//! within a second of the change; the next `tools/list` shows the new tool with the feedback
//! tools still last. The servers are FastMCP 4.1.6 and the Python `mcp` 2.3.0 SDK, with no
//! change to them; the listener is the official TypeScript client pinned to 2026-07-28
//! (`Client.listen`), or a raw one.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::fake_epode::{FakeConfig, FakeEpode, DEMO_PRODUCT_KEY};
use crate::support::{
    eventually_async, http, last_message, metric, modern_body, modern_headers, peers_dir, python,
    repo_root, Sidecar, Upstream, UpstreamKind,
};

const ERA_2025: (&str, &str) = ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2025-11-25");
const FEEDBACK_TOOLS: [&str; 2] = ["record_product_feedback_consent", "report_product_feedback"];

fn feedback_env(epode: &FakeEpode) -> Vec<(&'static str, String)> {
    vec![
        ("EPODE_API_KEY", epode.product_key().to_owned()),
        ("EPODE_API_URL", epode.url()),
        ("AGENT_FEEDBACK_MODE", "never_ask".to_owned()),
        (ERA_2025.0, ERA_2025.1.to_owned()),
    ]
}

fn env_refs<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// The official TypeScript client as a listener (`tests/peers/ts_listen.mjs`): it listens for
/// `toolsListChanged`, calls `grow {name}`, waits for the notice, lists the tools.
fn ts_listen(url: &str, new_tool: &str, headers: &[&str]) -> Value {
    let mut cmd = std::process::Command::new("node");
    cmd.arg(peers_dir().join("ts/ts_listen.mjs"))
        .arg(url)
        .arg("grow")
        .arg(new_tool);
    for h in headers {
        cmd.args(["--header", h]);
    }
    let out = cmd.output().expect("run ts_listen");
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
        panic!(
            "ts_listen printed no JSON (exit {:?}):\n{stdout}\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// What the issue asks of every server and transport: the notice within 1 s of the change,
/// then the new tool listed, the feedback tools still last.
fn assert_heard_and_listed(report: &Value, new_tool: &str, what: &str) {
    assert!(report.get("error").is_none(), "{what}: {report}");
    assert_eq!(
        report["honoredFilter"],
        json!({"toolsListChanged": true}),
        "{what}: {report}"
    );
    assert_eq!(
        report["call"],
        format!("grew {new_tool}"),
        "{what}: {report}"
    );
    assert_eq!(
        report["heard"],
        json!(["notifications/tools/list_changed"]),
        "{what}: {report}"
    );
    let after = report["heardAfterMs"].as_f64().unwrap();
    assert!(after < 1000.0, "{what}: heard {after} ms after the call");
    let tools: Vec<&str> = report["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert!(tools.contains(&new_tool), "{what}: {tools:?}");
    assert_eq!(
        tools[tools.len() - 2..],
        FEEDBACK_TOOLS,
        "{what}: {tools:?}"
    );
}

#[test]
fn the_typescript_client_hears_the_python_sdks_new_tool_over_http() {
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let up = Upstream::start_with(UpstreamKind::Python, &["--questions", "--era", "2025"]);
    let env = feedback_env(&epode);
    let sc = Sidecar::start(&up.url(), &env_refs(&env));
    // `grow` sends its notice session-wide: on the session's GET stream.
    let report = ts_listen(&sc.url(), "grown_http", &[]);
    assert_heard_and_listed(&report, "grown_http", "mcp 2.3.0 over HTTP (GET stream)");
}

#[test]
fn the_typescript_client_hears_the_python_sdks_new_tool_over_stdio() {
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let env = feedback_env(&epode);
    let py = python();
    let script = repo_root().join("tests/peers/py_server.py");
    let sc = Sidecar::start_stdio(
        &[
            py.to_str().unwrap(),
            script.to_str().unwrap(),
            "--stdio",
            "--questions",
            "--era",
            "2025",
        ],
        &env_refs(&env),
    );
    let report = ts_listen(&sc.url(), "grown_stdio", &[]);
    assert_heard_and_listed(&report, "grown_stdio", "mcp 2.3.0 over stdio");
}

#[test]
fn the_typescript_client_hears_fastmcps_new_tool_over_http_and_stdio() {
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let env = feedback_env(&epode);
    // FastMCP sends it related to the call: on the tools/call's own stream, taken off it.
    let up = Upstream::start(UpstreamKind::FastMcp);
    let sc = Sidecar::start(&up.url(), &env_refs(&env));
    let report = ts_listen(&sc.url(), "grown_fast", &[]);
    assert_heard_and_listed(
        &report,
        "grown_fast",
        "FastMCP over HTTP (the call's stream)",
    );
    drop(sc);

    let py = python();
    let script = repo_root().join("tests/peers/fastmcp_server.py");
    let sc = Sidecar::start_stdio(
        &[py.to_str().unwrap(), script.to_str().unwrap(), "--stdio"],
        &env_refs(&env),
    );
    let report = ts_listen(&sc.url(), "grown_fast_stdio", &[]);
    assert_heard_and_listed(&report, "grown_fast_stdio", "FastMCP over stdio");
}

/// A raw listen stream: its events as they come.
struct Listening {
    resp: reqwest::Response,
    buf: String,
}

impl Listening {
    async fn open(sc: &Sidecar, id: Value, notifications: Value, token: Option<&str>) -> Self {
        let body = modern_body(
            id,
            "subscriptions/listen",
            json!({"notifications": notifications}),
        );
        let mut req = http().post(sc.url()).body(body.to_string());
        for (k, v) in modern_headers("subscriptions/listen", None) {
            req = req.header(k, v);
        }
        if let Some(t) = token {
            req = req.header("authorization", t);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 200);
        Listening {
            resp,
            buf: String::new(),
        }
    }

    /// The next message, within 1 s: the notice `method`.
    async fn heard(&mut self, method: &str) -> Value {
        let heard = self
            .next(Duration::from_secs(1))
            .await
            .unwrap_or_else(|| panic!("no {method} within 1 s"));
        assert_eq!(heard["method"], method, "{heard}");
        heard
    }

    /// The next JSON-RPC message within `within`, skipping keep-alives.
    async fn next(&mut self, within: Duration) -> Option<Value> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let event: String = self.buf.drain(..end + 2).collect();
                let data: Vec<&str> = event
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(str::trim)
                    .collect();
                if data.is_empty() {
                    continue;
                }
                return Some(serde_json::from_str(&data.join("\n")).unwrap());
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            match tokio::time::timeout(left, self.resp.chunk()).await {
                Ok(Ok(Some(c))) => self.buf.push_str(&String::from_utf8_lossy(&c)),
                Ok(_) => return None,
                Err(_) => return None,
            }
        }
    }
}

/// A 2026 `tools/call` through the sidecar with `token`: the whole answer body and its last
/// message.
async fn call(
    sc: &Sidecar,
    id: u64,
    tool: &str,
    args: Value,
    token: Option<&str>,
) -> (String, Value) {
    let body = modern_body(
        json!(id),
        "tools/call",
        json!({"name": tool, "arguments": args}),
    );
    let mut req = http().post(sc.url()).body(body.to_string());
    for (k, v) in modern_headers("tools/call", Some(tool)) {
        req = req.header(k, v);
    }
    if let Some(t) = token {
        req = req.header("authorization", t);
    }
    let resp = req.send().await.unwrap();
    let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
    let text = resp.text().await.unwrap();
    let last = last_message(&ct, &text);
    (text, last)
}

fn sub_id(msg: &Value) -> &Value {
    &msg["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"]
}

/// Over HTTP, each listener hears only what it opted into, with its own subscription id:
/// `tools/list_changed` from the GET stream and from the call's own stream (which no longer
/// carries it: 2026 sends it only on listen streams), `resources/updated` only for a URI it
/// named (the upstream was sent `resources/subscribe` for it); a caller with other
/// credentials hears nothing of this session's.
#[tokio::test]
async fn each_listener_hears_what_it_opted_into_and_no_other_callers_notices() {
    let up = Upstream::start_with(UpstreamKind::Python, &["--questions", "--era", "2025"]);
    let sc = Sidecar::start(&up.url(), &[ERA_2025]);
    let alice = Some("Bearer alice");
    let mut tools = Listening::open(
        &sc,
        json!("tools-1"),
        json!({"toolsListChanged": true}),
        alice,
    )
    .await;
    let ack = tools.next(Duration::from_secs(10)).await.expect("an ack");
    assert_eq!(
        ack["method"], "notifications/subscriptions/acknowledged",
        "{ack}"
    );
    assert_eq!(
        ack["params"]["notifications"],
        json!({"toolsListChanged": true}),
        "{ack}"
    );
    assert_eq!(sub_id(&ack), "tools-1");
    let mut notes = Listening::open(
        &sc,
        json!(7),
        json!({"resourceSubscriptions": ["note://a"]}),
        alice,
    )
    .await;
    let ack = notes.next(Duration::from_secs(10)).await.expect("an ack");
    assert_eq!(
        ack["params"]["notifications"],
        json!({"resourceSubscriptions": ["note://a"]}),
        "{ack}"
    );
    assert_eq!(sub_id(&ack), 7);
    let mut bob = Listening::open(
        &sc,
        json!("bob-1"),
        json!({"toolsListChanged": true}),
        Some("Bearer bob"),
    )
    .await;
    bob.next(Duration::from_secs(10)).await.expect("bob's ack");

    // Session-wide (the GET stream).
    let (_, msg) = call(&sc, 1, "grow", json!({"name": "g_get"}), alice).await;
    assert_eq!(msg["result"]["content"][0]["text"], "grew g_get", "{msg}");
    let heard = tools.heard("notifications/tools/list_changed").await;
    assert_eq!(sub_id(&heard), "tools-1");
    // Related to the call: taken off its stream, heard on the listen stream.
    let (text, msg) = call(
        &sc,
        2,
        "grow",
        json!({"name": "g_call", "related": true}),
        alice,
    )
    .await;
    assert_eq!(msg["result"]["content"][0]["text"], "grew g_call", "{msg}");
    assert!(
        !text.contains("list_changed"),
        "the call's own stream carried it: {text}"
    );
    tools.heard("notifications/tools/list_changed").await;

    // resources/updated: only for the URI named, and the upstream was told of it.
    let (_, msg) = call(&sc, 3, "touch", json!({"uri": "note://b"}), alice).await;
    assert_eq!(
        msg["result"]["content"][0]["text"], "touched note://b; subscribed: note://a",
        "{msg}"
    );
    let (_, msg) = call(&sc, 4, "touch", json!({"uri": "note://a"}), alice).await;
    assert_eq!(
        msg["result"]["content"][0]["text"], "touched note://a; subscribed: note://a",
        "{msg}"
    );
    let heard = notes.heard("notifications/resources/updated").await;
    assert_eq!(heard["params"]["uri"], "note://a", "{heard} (not note://b)");
    assert_eq!(sub_id(&heard), 7);
    // Neither listener heard what it did not ask for; bob heard nothing of alice's session.
    assert!(tools.next(Duration::from_millis(300)).await.is_none());
    assert!(notes.next(Duration::from_millis(300)).await.is_none());
    assert!(
        bob.next(Duration::from_millis(500)).await.is_none(),
        "bob heard alice's session"
    );
    // Bob's own change reaches bob.
    call(&sc, 5, "grow", json!({"name": "g_bob"}), Some("Bearer bob")).await;
    let heard = bob
        .next(Duration::from_secs(1))
        .await
        .expect("bob heard his own");
    assert_eq!(sub_id(&heard), "bob-1");
    assert!(
        tools.next(Duration::from_millis(300)).await.is_none(),
        "alice heard bob's"
    );
}

/// Listen streams are bounded (`EPODE_SIDECAR_LISTEN_STREAMS`): one past it gets 503 with
/// Retry-After and a JSON-RPC error with its id naming the setting; a closed one makes room.
/// A bad filter gets -32602 with a message that says what is wrong.
#[tokio::test]
async fn listen_streams_are_bounded_and_a_bad_filter_is_refused() {
    let up = Upstream::start_with(UpstreamKind::Python, &["--questions", "--era", "2025"]);
    let sc = Sidecar::start(
        &up.url(),
        &[ERA_2025, ("EPODE_SIDECAR_LISTEN_STREAMS", "2")],
    );
    let filter = json!({"toolsListChanged": true});
    let mut one = Listening::open(&sc, json!(1), filter.clone(), None).await;
    one.next(Duration::from_secs(10)).await.expect("ack 1");
    let mut two = Listening::open(&sc, json!(2), filter.clone(), None).await;
    two.next(Duration::from_secs(10)).await.expect("ack 2");
    let url = sc.url();
    let post = |id: u64, filter: Value| crate::ledger::listen(&url, id, filter, &[]);
    let third = post(3, filter.clone()).await;
    assert_eq!(third.status(), 503);
    assert_eq!(third.headers()["retry-after"], "5");
    let msg: Value = third.json().await.unwrap();
    assert_eq!(msg["id"], 3, "{msg}");
    assert!(
        msg["error"]["message"]
            .as_str()
            .unwrap()
            .contains("EPODE_SIDECAR_LISTEN_STREAMS"),
        "{msg}"
    );
    assert_eq!(metric(&sc, "epode_sidecar_listen_streams ").await, 2);
    drop(one);
    let room = eventually_async(Duration::from_secs(10), || {
        let post = &post;
        let filter = filter.clone();
        async move { post(4, filter).await.status() == 200 }
    })
    .await;
    assert!(room, "a closed listen stream made no room");

    let bad = post(5, json!({"toolsListChanged": "yes"})).await;
    assert_eq!(bad.status(), 400);
    let msg: Value = bad.json().await.unwrap();
    assert_eq!(msg["id"], 5, "{msg}");
    assert_eq!(msg["error"]["code"], -32602, "{msg}");
    assert!(
        msg["error"]["message"]
            .as_str()
            .unwrap()
            .contains("must be a boolean"),
        "{msg}"
    );
    drop(two);
}

/// The session's GET stream is reopened when the upstream drops it: a 2025 server restarted
/// on the same port (its sessions gone) is listened to again in a new session, and a change
/// after the restart is heard.
#[tokio::test]
async fn a_feed_reopens_after_the_upstream_restarts() {
    let port = crate::support::free_port();
    let up = Upstream::start_on(
        UpstreamKind::Python,
        port,
        &["--questions", "--era", "2025"],
    );
    let sc = Sidecar::start(&up.url(), &[ERA_2025]);
    let mut tools = Listening::open(&sc, json!("t"), json!({"toolsListChanged": true}), None).await;
    tools.next(Duration::from_secs(10)).await.expect("ack");
    call(&sc, 1, "grow", json!({"name": "before"}), None).await;
    tools
        .next(Duration::from_secs(1))
        .await
        .expect("heard before the restart");
    drop(up);
    let _up = Upstream::start_on(
        UpstreamKind::Python,
        port,
        &["--questions", "--era", "2025"],
    );
    // The feed reopens with back-off (a new session: the old one is gone with the process).
    let reopened = eventually_async(Duration::from_secs(20), || async {
        metric(&sc, "epode_sidecar_listen_feed_reopened_total").await >= 1
    })
    .await;
    assert!(reopened, "the feed did not reopen");
    // A change after the restart is heard (the call may land before the feed is back: try
    // until it is heard, each try a new tool).
    let mut heard = None;
    for i in 0..20 {
        call(
            &sc,
            10 + i,
            "grow",
            json!({"name": format!("after{i}")}),
            None,
        )
        .await;
        if let Some(m) = tools.next(Duration::from_millis(750)).await {
            heard = Some(m);
            break;
        }
    }
    let heard = heard.expect("no notice after the restart");
    assert_eq!(
        heard["method"], "notifications/tools/list_changed",
        "{heard}"
    );
    assert_eq!(sub_id(&heard), "t");
}
