//! A 2025-era server's questions (elicitation, sampling, roots) asked of a 2026 client as
//! `input_required` rounds (MRTR), by a raw client that does the rounds by hand: the server
//! is FastMCP 4.1.6 or the Python `mcp` 2.3.0 SDK, over stdio and over HTTP, with no change
//! to it (the sidecar speaks 2025 to it: `EPODE_SIDECAR_UPSTREAM_PROTOCOL=2025-11-25`).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::{
    last_message, post_modern, python, repo_root, Sidecar, Upstream, UpstreamKind,
};

const PREFIX: &str = "epode-sidecar.held.v1.";
const ERA_2025: (&str, &str) = ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2025-11-25");

/// Every capability a question may need.
fn all_capabilities() -> Value {
    json!({"elicitation": {"form": {}}, "sampling": {}, "roots": {}})
}

/// A 2026 `tools/call` of `tool` declaring `caps`.
fn call_body(id: u64, tool: &str, args: Value, caps: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": tool, "arguments": args,
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": caps,
            "io.modelcontextprotocol/clientInfo": {"name": "raw-mrtr-client", "version": "0"}
        }
    }})
}

/// The retry of `first` under `id`: the same method and params, with `responses` and the
/// `state` echoed.
fn retry(first: &Value, id: u64, state: &str, responses: Value) -> Value {
    let mut r = first.clone();
    r["id"] = json!(id);
    r["params"]["inputResponses"] = responses;
    r["params"]["requestState"] = json!(state);
    r
}

async fn call(sc: &Sidecar, body: &Value) -> Value {
    let tool = body["params"]["name"].as_str().unwrap().to_owned();
    let resp = post_modern(&sc.url(), "tools/call", Some(&tool), body).await;
    let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
    last_message(&ct, &resp.text().await.unwrap())
}

/// The `input_required` result's questions, after checking its shape (2026-07-28 §MRTR).
fn questions(msg: &Value) -> (&serde_json::Map<String, Value>, String) {
    let r = &msg["result"];
    assert_eq!(r["resultType"], "input_required", "{msg}");
    let state = r["requestState"]
        .as_str()
        .unwrap_or_else(|| panic!("{msg}"));
    assert!(state.starts_with(PREFIX), "{msg}");
    let asked = r["inputRequests"]
        .as_object()
        .unwrap_or_else(|| panic!("{msg}"));
    for q in asked.values() {
        assert!(q.get("id").is_none() && q.get("jsonrpc").is_none(), "{q}");
    }
    (asked, state.to_owned())
}

fn text_of(msg: &Value) -> String {
    assert_eq!(msg["result"]["resultType"], "complete", "{msg}");
    msg["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{msg}"))
        .to_owned()
}

fn fastmcp_stdio() -> Sidecar {
    let py = python();
    let script = repo_root().join("tests/peers/fastmcp_server.py");
    Sidecar::start_stdio(
        &[py.to_str().unwrap(), script.to_str().unwrap(), "--stdio"],
        &[ERA_2025],
    )
}

fn py_stdio() -> Sidecar {
    let py = python();
    let script = repo_root().join("tests/peers/py_server.py");
    Sidecar::start_stdio(
        &[
            py.to_str().unwrap(),
            script.to_str().unwrap(),
            "--stdio",
            "--questions",
            "--era",
            "2025",
        ],
        &[ERA_2025],
    )
}

/// FastMCP's `party` (`await ctx.elicit("How many people?", response_type=int)`): one
/// `elicitation/create` round, then the result for the answer; the same state twice, or
/// altered, is refused within seconds with an error that says to start again.
async fn one_elicitation_round(sc: &Sidecar) {
    let first = call_body(1, "party", json!({}), all_capabilities());
    let msg = call(sc, &first).await;
    assert_eq!(msg["id"], 1, "{msg}");
    let (asked, state) = questions(&msg);
    assert_eq!(asked.len(), 1, "{msg}");
    let (key, q) = asked.iter().next().unwrap();
    assert_eq!(q["method"], "elicitation/create", "{q}");
    assert_eq!(q["params"]["message"], "How many people?", "{q}");
    let answer = json!({key.clone(): {"action": "accept", "content": {"value": 7}}});
    let again = retry(&first, 2, &state, answer.clone());
    let msg = call(sc, &again).await;
    assert_eq!(msg["id"], 2, "{msg}");
    assert_eq!(text_of(&msg), "party for 7");

    // The same state again: answered already.
    let started = Instant::now();
    let msg = call(sc, &retry(&first, 3, &state, answer.clone())).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(msg["id"], 3, "{msg}");
    let text = msg["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{msg}"));
    assert!(
        text.contains("answered already") && text.contains("start the call again"),
        "{text}"
    );

    // A forged state: a fresh question, its state altered in its last character.
    let msg = call(sc, &call_body(4, "party", json!({}), all_capabilities())).await;
    let (_, state) = questions(&msg);
    let mut forged = state.clone();
    let last = forged.pop().unwrap();
    forged.push(if last == 'A' { 'B' } else { 'A' });
    let started = Instant::now();
    let msg = call(sc, &retry(&first, 5, &forged, answer)).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    let text = msg["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{msg}"));
    assert_eq!(msg["error"]["code"], -32602, "{msg}");
    assert!(text.contains("not one this sidecar issued"), "{text}");
}

#[tokio::test]
async fn fastmcp_asks_a_2026_client_over_stdio_in_input_required_rounds() {
    let sc = fastmcp_stdio();
    one_elicitation_round(&sc).await;
}

#[tokio::test]
async fn fastmcp_asks_a_2026_client_over_http_in_input_required_rounds() {
    let up = Upstream::start(UpstreamKind::FastMcp);
    let sc = Sidecar::start(&up.url(), &[ERA_2025]);
    one_elicitation_round(&sc).await;
}

/// Two questions asked at once (FastMCP's `asyncio.gather`) become one `inputRequests` map;
/// a retry that answers one is asked the other again; both answered, the result.
#[tokio::test]
async fn two_questions_at_once_are_one_round_and_an_unanswered_one_is_asked_again() {
    let sc = fastmcp_stdio();
    let first = call_body(1, "two_questions", json!({}), all_capabilities());
    let msg = call(&sc, &first).await;
    let (asked, state) = questions(&msg);
    assert_eq!(asked.len(), 2, "{msg}");
    let key_of = |message: &str| {
        asked
            .iter()
            .find(|(_, q)| q["params"]["message"] == message)
            .map(|(k, _)| k.clone())
            .unwrap_or_else(|| panic!("{message} in {msg}"))
    };
    let (name, age) = (key_of("Your name?"), key_of("Your age?"));
    let msg = call(
        &sc,
        &retry(
            &first,
            2,
            &state,
            json!({name: {"action": "accept", "content": {"value": "Ada"}}}),
        ),
    )
    .await;
    let (asked, state) = questions(&msg);
    assert_eq!(asked.keys().collect::<Vec<_>>(), vec![&age], "{msg}");
    let msg = call(
        &sc,
        &retry(
            &first,
            3,
            &state,
            json!({age.clone(): {"action": "accept", "content": {"value": 7}}}),
        ),
    )
    .await;
    assert_eq!(text_of(&msg), "name=Ada age=7");
}

/// A client that declared no elicitation capability is never asked: the server hears the
/// error a 2025 client without it sends, and the call ends with the server's own answer.
#[tokio::test]
async fn a_client_without_the_capability_is_never_asked() {
    let sc = fastmcp_stdio();
    // The child is started (and its imports done) before the clock runs.
    let warm = call(&sc, &call_body(9, "plain", json!({}), json!({}))).await;
    assert_eq!(warm["result"]["resultType"], "complete", "{warm}");
    let started = Instant::now();
    let msg = call(
        &sc,
        &call_body(1, "party", json!({}), json!({"sampling": {}})),
    )
    .await;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(msg["id"], 1, "{msg}");
    assert_ne!(msg["result"]["resultType"], "input_required", "{msg}");
    // The server heard the sidecar's decline, the error a client without the capability sends.
    assert!(
        msg.to_string()
            .contains("did not declare the capability elicitation/create takes"),
        "{msg}"
    );
}

/// The Python SDK's sampling (`ctx.session.create_message`), its sequential questions and
/// its `roots/list`, over stdio and over HTTP: each a round of its own, until the result.
async fn sampling_and_sequential_rounds(sc: &Sidecar) {
    let first = call_body(1, "sample", json!({}), all_capabilities());
    let msg = call(sc, &first).await;
    let (asked, state) = questions(&msg);
    let (key, q) = asked.iter().next().unwrap();
    assert_eq!(q["method"], "sampling/createMessage", "{q}");
    assert_eq!(
        q["params"]["messages"][0]["content"]["text"], "Say hello",
        "{q}"
    );
    let answer = json!({key.clone(): {"role": "assistant", "content": {"type": "text", "text": "hi there"}, "model": "m", "stopReason": "endTurn"}});
    let msg = call(sc, &retry(&first, 2, &state, answer)).await;
    assert_eq!(text_of(&msg), "sampled: hi there");

    let first = call_body(3, "ask_twice", json!({}), all_capabilities());
    let mut msg = call(sc, &first).await;
    for (id, (field, value)) in [(4, ("name", json!("Ada"))), (5, ("age", json!(7)))] {
        let (asked, state) = questions(&msg);
        assert_eq!(asked.len(), 1, "{msg}");
        let key = asked.keys().next().unwrap().clone();
        let answer = json!({key: {"action": "accept", "content": {field: value}}});
        msg = call(sc, &retry(&first, id, &state, answer)).await;
    }
    assert_eq!(text_of(&msg), "name=Ada age=7");

    // roots/list, related to the call.
    let first = call_body(6, "roots_call", json!({}), all_capabilities());
    let msg = call(sc, &first).await;
    let (asked, state) = questions(&msg);
    let (key, q) = asked.iter().next().unwrap();
    assert_eq!(q["method"], "roots/list", "{q}");
    let answer = json!({key.clone(): {"roots": [{"uri": "file:///work", "name": "work"}]}});
    let msg = call(sc, &retry(&first, 7, &state, answer)).await;
    assert_eq!(text_of(&msg), "1 roots: file:///work");
}

#[tokio::test]
async fn the_python_sdks_sampling_and_questions_over_stdio() {
    let sc = py_stdio();
    sampling_and_sequential_rounds(&sc).await;
}

#[tokio::test]
async fn the_python_sdks_sampling_and_questions_over_http() {
    let up = Upstream::start_with(UpstreamKind::Python, &["--questions", "--era", "2025"]);
    let sc = Sidecar::start(&up.url(), &[ERA_2025]);
    sampling_and_sequential_rounds(&sc).await;
}

/// A retry from another caller (other credentials) is refused, and the call stays for its
/// own caller.
#[tokio::test]
async fn a_state_answers_only_for_the_caller_it_was_issued_to() {
    let sc = fastmcp_stdio();
    let first = call_body(1, "party", json!({}), all_capabilities());
    let post = |body: Value, token: &'static str| {
        let url = sc.url();
        async move {
            let mut req = crate::support::http().post(url).body(body.to_string());
            for (k, v) in crate::support::modern_headers("tools/call", Some("party")) {
                req = req.header(k, v);
            }
            let resp = req.header("authorization", token).send().await.unwrap();
            let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
            last_message(&ct, &resp.text().await.unwrap())
        }
    };
    let msg = post(first.clone(), "Bearer alice").await;
    let (asked, state) = questions(&msg);
    let key = asked.keys().next().unwrap().clone();
    let answer = json!({key: {"action": "accept", "content": {"value": 3}}});
    let msg = post(retry(&first, 2, &state, answer.clone()), "Bearer mallory").await;
    let text = msg["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{msg}"));
    assert!(text.contains("another caller"), "{text}");
    // Another target from the right caller is refused too.
    let mut other = retry(&first, 3, &state, answer.clone());
    other["params"]["arguments"] = json!({"x": 1});
    let msg = post(other, "Bearer alice").await;
    let text = msg["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{msg}"));
    assert!(text.contains("another request"), "{text}");
    let msg = post(retry(&first, 4, &state, answer), "Bearer alice").await;
    assert_eq!(text_of(&msg), "party for 3");
}

/// A held call whose client never comes back is cancelled at its deadline and counted; the
/// late retry is told to start again, and the gauge is back at 0.
#[tokio::test]
async fn a_call_whose_client_never_retries_is_cancelled_at_its_deadline_and_counted() {
    let py = python();
    let script = repo_root().join("tests/peers/fastmcp_server.py");
    let sc = Sidecar::start_stdio(
        &[py.to_str().unwrap(), script.to_str().unwrap(), "--stdio"],
        &[ERA_2025, ("EPODE_SIDECAR_HELD_CALL_WAIT", "1s")],
    );
    let metrics = || crate::support::get_blocking(sc.addr, "/metrics");
    let first = call_body(1, "party", json!({}), all_capabilities());
    let msg = call(&sc, &first).await;
    let (asked, state) = questions(&msg);
    assert_eq!(
        crate::support::metric_value(&metrics(), "epode_sidecar_held_calls "),
        1
    );
    assert!(
        crate::support::eventually(Duration::from_secs(20), || {
            let m = metrics();
            crate::support::metric_value(&m, "epode_sidecar_held_calls_expired_total") == 1
                && crate::support::metric_value(&m, "epode_sidecar_held_calls ") == 0
        }),
        "{}",
        metrics()
    );
    let key = asked.keys().next().unwrap().clone();
    let late = retry(
        &first,
        2,
        &state,
        json!({key: {"action": "accept", "content": {"value": 2}}}),
    );
    let msg = call(&sc, &late).await;
    let text = msg["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{msg}"));
    assert!(text.contains("start the call again"), "{text}");
    // The server lives on: a new call is asked afresh.
    let msg = call(&sc, &call_body(3, "party", json!({}), all_capabilities())).await;
    questions(&msg);
}

/// The JSON-RPC messages of an SSE answer, read as they come.
struct Events {
    resp: reqwest::Response,
    seen: String,
    taken: usize,
}

impl Events {
    fn new(resp: reqwest::Response) -> Self {
        Events {
            resp,
            seen: String::new(),
            taken: 0,
        }
    }

    /// The next message (after the last one returned) satisfying `want`, within 20 s.
    async fn next(&mut self, want: &dyn Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let msgs: Vec<Value> = self
                .seen
                .split("\n\n")
                .filter_map(|ev| ev.lines().find_map(|l| l.strip_prefix("data:")))
                .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
                .collect();
            if let Some(i) = (self.taken..msgs.len()).find(|i| want(&msgs[*i])) {
                self.taken = i + 1;
                return msgs[i].clone();
            }
            assert!(Instant::now() < deadline, "nothing wanted in {}", self.seen);
            let chunk = tokio::time::timeout(Duration::from_secs(20), self.resp.chunk())
                .await
                .expect("the stream went quiet")
                .unwrap()
                .unwrap_or_else(|| panic!("the stream ended: {}", self.seen));
            self.seen.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
}

/// The other direction: a 2026 server's `input_required` (FastMCP's `party_mrtr`) for a 2025
/// client that takes a stream becomes a server request on its call's stream, under the
/// sidecar's own id; only the asked client's POSTed answer counts, and the call's result
/// follows on the same stream.
async fn a_2025_client_is_asked_as_2025_servers_ask(sc: &Sidecar) {
    let legacy = |body: &Value, token: &str| {
        crate::support::http()
            .post(sc.url())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .header("authorization", token.to_owned())
            .body(body.to_string())
    };
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "party_mrtr", "arguments": {}}});
    let resp = legacy(&call, "Bearer alice").send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let mut events = Events::new(resp);
    let mut next = async |want: &dyn Fn(&Value) -> bool| events.next(want).await;
    let asked = next(&|m| m.get("method").is_some()).await;
    assert_eq!(asked["method"], "elicitation/create", "{asked}");
    let id = asked["id"].as_str().unwrap().to_owned();
    assert!(
        id.starts_with("epode-sidecar-ask-") && id.len() == 18 + 32,
        "{id}"
    );
    let answer = |value: u64| json!({"jsonrpc": "2.0", "id": id, "result": {"action": "accept", "content": {"value": value}}});
    // Another client's answer is taken (202) and counts for nothing.
    let other = legacy(&answer(1), "Bearer mallory").send().await.unwrap();
    assert_eq!(other.status(), 202);
    let mine = legacy(&answer(5), "Bearer alice").send().await.unwrap();
    assert_eq!(mine.status(), 202);
    let last = next(&|m| m.get("result").is_some() || m.get("error").is_some()).await;
    assert_eq!(last["id"], 7, "{last}");
    assert!(last["result"].get("resultType").is_none(), "{last}");
    assert_eq!(
        last["result"]["content"][0]["text"], "party for 5",
        "{last}"
    );

    // A client that takes JSON only cannot be asked: it is told so at once.
    let json_only = crate::support::http()
        .post(sc.url())
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .header("mcp-protocol-version", "2025-11-25")
        .body(call.to_string())
        .send()
        .await
        .unwrap();
    let text = json_only.text().await.unwrap();
    assert!(text.contains("2025-era client cannot handle"), "{text}");
}

#[tokio::test]
async fn a_2026_servers_input_required_asks_a_2025_client_over_http() {
    let up = Upstream::start(UpstreamKind::FastMcp);
    let sc = Sidecar::start(&up.url(), &[]);
    a_2025_client_is_asked_as_2025_servers_ask(&sc).await;
}

/// The official Python client as a 2025-11-25 client (its elicitation callback answering) is
/// asked the 2026 server's question through the sidecar and gets the result, with no code of
/// its own for `input_required`.
#[tokio::test]
async fn the_python_client_in_2025_mode_answers_a_2026_servers_question() {
    let up = Upstream::start(UpstreamKind::FastMcp);
    let sc = Sidecar::start(&up.url(), &[]);
    let script = repo_root().join("tests/peers/py_asked.py");
    let url = sc.url();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python())
            .arg(script)
            .args([url.as_str(), "party_mrtr", "--value", "6"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let got: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|_| panic!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(got["text"], "party for 6", "{got}");
    assert_eq!(got["asked"], json!(["elicitation/create"]), "{got}");
}

/// A 2025 client's declared capabilities reach the upstream although the sidecar keeps no
/// session: its `initialize` answer carries a session id that is the capabilities, sealed,
/// and each later request is sent with them (here to `server-everything`, a 2025 server that
/// lists `get-roots-list` only to a client that declares `roots`).
#[tokio::test]
async fn a_2025_clients_capabilities_reach_the_upstream_in_its_session_id() {
    let up = Upstream::start(UpstreamKind::Everything);
    let sc = Sidecar::start(&up.url(), &[]);
    let post = |body: Value, sid: Option<String>| {
        let mut req = crate::support::http()
            .post(sc.url())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .body(body.to_string());
        if let Some(s) = sid {
            req = req.header("mcp-session-id", s);
        }
        req.send()
    };
    let tools = async |caps: Value| -> (Option<String>, Vec<String>) {
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": caps,
            "clientInfo": {"name": "inspector-like", "version": "0"}}});
        let resp = post(init, None).await.unwrap();
        let sid = resp
            .headers()
            .get("mcp-session-id")
            .map(|v| v.to_str().unwrap().to_owned());
        let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}});
        let resp = post(list, sid.clone()).await.unwrap();
        let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
        let msg = last_message(&ct, &resp.text().await.unwrap());
        let names = msg["result"]["tools"]
            .as_array()
            .unwrap_or_else(|| panic!("{msg}"))
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect();
        (sid, names)
    };
    let (sid, with_roots) = tools(json!({"roots": {"listChanged": true}})).await;
    let sid = sid.expect("a session id carrying the capabilities");
    assert!(sid.starts_with("epode-sidecar.caps.v1."), "{sid}");
    assert!(
        with_roots.iter().any(|n| n == "get-roots-list"),
        "{with_roots:?}"
    );
    let (none, without) = tools(json!({})).await;
    assert_eq!(none, None, "no capabilities, no session id");
    assert!(
        !without.iter().any(|n| n == "get-roots-list"),
        "{without:?}"
    );
    assert_eq!(
        with_roots.len(),
        without.len() + 1,
        "{with_roots:?} {without:?}"
    );

    // A 2026 client's declared capabilities reach it the same way (its 2025 session is the
    // one for those capabilities).
    let modern = async |caps: Value| -> Vec<String> {
        let body = call_body(3, "x", json!({}), caps);
        let mut list = body.clone();
        list["method"] = json!("tools/list");
        list["params"] = json!({"_meta": body["params"]["_meta"]});
        let resp = post_modern(&sc.url(), "tools/list", None, &list).await;
        let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
        let msg = last_message(&ct, &resp.text().await.unwrap());
        msg["result"]["tools"]
            .as_array()
            .unwrap_or_else(|| panic!("{msg}"))
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let names = modern(json!({"roots": {}})).await;
    assert!(names.iter().any(|n| n == "get-roots-list"), "{names:?}");
    let names = modern(json!({})).await;
    assert!(!names.iter().any(|n| n == "get-roots-list"), "{names:?}");
}

/// Held calls are bounded (`EPODE_SIDECAR_HELD_CALLS`): past the bound a question fails its
/// call with 503 and Retry-After, naming the setting; an answered call makes room again.
#[tokio::test]
async fn past_the_held_calls_bound_a_question_fails_its_call_with_503() {
    let up = Upstream::start(UpstreamKind::FastMcp);
    let sc = Sidecar::start(&up.url(), &[ERA_2025, ("EPODE_SIDECAR_HELD_CALLS", "1")]);
    let first = call_body(1, "party", json!({}), all_capabilities());
    let (asked, state) = {
        let msg = call(&sc, &first).await;
        let (a, s) = questions(&msg);
        (a.clone(), s)
    };
    let second = call_body(2, "party", json!({}), all_capabilities());
    let resp = post_modern(&sc.url(), "tools/call", Some("party"), &second).await;
    let retry_after = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
    let status = resp.status().as_u16();
    let msg = last_message(&ct, &resp.text().await.unwrap());
    let text = msg["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{status} {msg}"));
    assert!(text.contains("EPODE_SIDECAR_HELD_CALLS"), "{text}");
    // On an event stream already begun the status is 200; else 503 with Retry-After.
    assert!(
        status == 200 || (status == 503 && retry_after.as_deref() == Some("1")),
        "{status} {retry_after:?}"
    );
    assert_eq!(msg["id"], 2, "{msg}");
    // The first call still goes on, and once answered the bound has room again.
    let key = asked.keys().next().unwrap().clone();
    let answer = json!({key: {"action": "accept", "content": {"value": 3}}});
    let msg = call(&sc, &retry(&first, 3, &state, answer)).await;
    assert_eq!(text_of(&msg), "party for 3");
    let msg = call(&sc, &call_body(4, "party", json!({}), all_capabilities())).await;
    questions(&msg);
}

/// Answers every question of an `input_required` result with a count.
fn answer_counts(asked: &serde_json::Map<String, Value>) -> Value {
    Value::Object(
        asked
            .keys()
            .map(|k| {
                (
                    k.clone(),
                    json!({"action": "accept", "content": {"count": 1}}),
                )
            })
            .collect(),
    )
}

/// An upstream that asks 1,000 questions at once has 16 of them asked (one round) and the
/// rest declined at once, so the call goes on; one that asks 1,000 times, one after the
/// other, is asked 8 rounds and then its call ends with an error naming the bound. The
/// server is not stuck after either.
#[tokio::test]
async fn an_upstream_that_asks_a_thousand_times_is_bounded() {
    let up = Upstream::start_with(UpstreamKind::Python, &["--questions", "--era", "2025"]);
    let sc = Sidecar::start(&up.url(), &[ERA_2025]);

    let first = call_body(1, "ask_many", json!({"n": 1000}), all_capabilities());
    let mut msg = call(&sc, &first).await;
    let (asked, _) = questions(&msg);
    // A round gathers the questions that come within 20 ms of each other: all 16 it holds on
    // a quiet machine, fewer when the server is slowed down between two of them.
    assert!(
        (1..=16).contains(&asked.len()),
        "the first round asks at most what a round holds: {}",
        asked.len()
    );
    let mut id = 2;
    let mut rounds = 0;
    while msg["result"]["resultType"] == "input_required" {
        rounds += 1;
        assert!(rounds <= 8, "{rounds} rounds");
        let (asked, state) = questions(&msg);
        assert!(asked.len() <= 16, "{}", asked.len());
        msg = call(&sc, &retry(&first, id, &state, answer_counts(asked))).await;
        id += 1;
    }
    let text = text_of(&msg);
    let counts: Vec<u64> = text
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(counts.len(), 2, "{text}");
    assert_eq!(counts[0] + counts[1], 1000, "{text}");
    assert!(
        counts[0] >= 1 && counts[0] <= 16 * rounds,
        "{text} in {rounds} rounds"
    );

    let first = call_body(100, "ask_forever", json!({"n": 1000}), all_capabilities());
    let mut msg = call(&sc, &first).await;
    let mut rounds = 0;
    let mut id = 101;
    while msg["result"]["resultType"] == "input_required" {
        rounds += 1;
        assert!(rounds <= 8, "{rounds} rounds");
        let (asked, state) = questions(&msg);
        msg = call(&sc, &retry(&first, id, &state, answer_counts(asked))).await;
        id += 1;
    }
    assert_eq!(rounds, 8, "{msg}");
    let error = msg["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{msg}"));
    assert!(error.contains("more than 8 rounds"), "{error}");
    // The server still answers.
    let msg = call(
        &sc,
        &call_body(200, "echo", json!({"text": "still here"}), json!({})),
    )
    .await;
    assert_eq!(msg["result"]["resultType"], "complete", "{msg}");
}

/// 10,000 calls whose upstream asks a question in each: at most `EPODE_SIDECAR_HELD_CALLS`
/// are held, every other one fails at once with 503 naming the setting (none hangs), and the
/// sidecar answers other requests meanwhile within its memory. (Their deadline is
/// `a_call_whose_client_never_retries_is_cancelled_at_its_deadline_and_counted`'s.)
#[tokio::test]
async fn ten_thousand_calls_that_ask_hold_at_most_the_bound() {
    use crate::support::scripted::{Reply, ScriptedUpstream};
    use futures_util::stream::StreamExt;
    let ask = r#"{"jsonrpc":"2.0","id":"q1","method":"elicitation/create","params":{"mode":"form","message":"Count?","requestedSchema":{"type":"object","properties":{"count":{"type":"integer"}}}}}"#;
    let up = ScriptedUpstream::new()
        .when(|r| r.json.get("id").is_none(), Reply::empty(202))
        .on(
            "initialize",
            Reply::result(json!({"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": {"name": "asks", "version": "1"}}))
                .header("mcp-session-id", "s-1"),
        )
        .on("tools/call", Reply::sse().event(ask).then_hang())
        .otherwise(Reply::result(json!({"tools": []})))
        .start();
    let sc = Sidecar::start(
        &up.url(),
        &[
            ERA_2025,
            ("EPODE_SIDECAR_HELD_CALLS", "64"),
            // One client: its share is the whole bound here (the share is another test's).
            ("EPODE_SIDECAR_HELD_CALLS_PER_CALLER", "64"),
            ("EPODE_SIDECAR_HELD_CALL_WAIT", "10m"),
        ],
    );
    let rss_before = crate::support::rss_kib(sc.pid());
    let started = Instant::now();
    let outcomes: Vec<(u16, Value)> = futures_util::stream::iter(0..10_000u64)
        .map(|i| {
            let url = sc.url();
            async move {
                let body = call_body(i, "count", json!({}), all_capabilities());
                let resp = post_modern(&url, "tools/call", Some("count"), &body).await;
                let status = resp.status().as_u16();
                let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
                (status, last_message(&ct, &resp.text().await.unwrap()))
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let took = started.elapsed();
    let mut held = 0;
    let mut refused = 0;
    for (status, msg) in &outcomes {
        if msg["result"]["resultType"] == "input_required" {
            held += 1;
            continue;
        }
        let text = msg["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("{status} {msg}"));
        assert!(text.contains("EPODE_SIDECAR_HELD_CALLS"), "{status} {text}");
        assert!(*status == 503 || *status == 200, "{status} {msg}");
        refused += 1;
    }
    assert_eq!(held, 64, "held {held}, refused {refused}");
    assert_eq!(refused, 10_000 - 64);
    let rss_after = crate::support::rss_kib(sc.pid());
    assert!(
        rss_after < rss_before + 64 * 1024,
        "RSS grew from {rss_before} KiB to {rss_after} KiB"
    );
    // Meanwhile it answers at once.
    let t = Instant::now();
    let body = json!({"jsonrpc": "2.0", "id": "l", "method": "tools/list", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}}}});
    let resp = post_modern(&sc.url(), "tools/list", None, &body).await;
    assert_eq!(resp.status(), 200);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    eprintln!("10,000 asking calls in {took:?}; RSS {rss_before} -> {rss_after} KiB");
    let m = crate::support::get_blocking(sc.addr, "/metrics");
    assert_eq!(
        crate::support::metric_value(&m, "epode_sidecar_held_calls "),
        64
    );
}

/// The same over stdio: FastMCP as a child spoken to in 2026
/// (`EPODE_SIDECAR_UPSTREAM_PROTOCOL=2026-07-28`: its readiness probe is then a 2026
/// `server/discover`, which does not pin the dual-era child to 2025 as a `ping` would), a 2025
/// client asked its `input_required` question on the call's stream.
#[tokio::test]
async fn a_2026_servers_input_required_asks_a_2025_client_over_stdio() {
    let py = python();
    let script = repo_root().join("tests/peers/fastmcp_server.py");
    let sc = Sidecar::start_stdio(
        &[py.to_str().unwrap(), script.to_str().unwrap(), "--stdio"],
        &[("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28")],
    );
    a_2025_client_is_asked_as_2025_servers_ask(&sc).await;
}

/// A 2026 TypeScript server's `input_required` (the SDK's `inputRequired(...)`) asked of a raw
/// 2025 client over two rounds: an elicitation and a `roots/list` at once, then a sampling;
/// each answer goes to the question it answers, the call is sent again with the upstream's
/// `requestState` untouched, and the result ends the stream.
#[tokio::test]
async fn a_2026_typescript_servers_rounds_are_asked_of_a_2025_client() {
    let up = Upstream::start(UpstreamKind::TypeScript);
    let sc = Sidecar::start(&up.url(), &[]);
    // The client declares what it can answer at initialize (the server asks only then); the
    // sidecar's session id carries it.
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {"elicitation": {"form": {}}, "sampling": {}, "roots": {}},
        "clientInfo": {"name": "raw-2025", "version": "0"}}});
    let resp = crate::support::http()
        .post(sc.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(init.to_string())
        .send()
        .await
        .unwrap();
    let sid = resp.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let legacy = |body: &Value| {
        crate::support::http()
            .post(sc.url())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .header("mcp-session-id", sid.clone())
            .body(body.to_string())
    };
    let call = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "deploy", "arguments": {"env": "prod"}}});
    let resp = legacy(&call).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut events = Events::new(resp);
    let mut next = async || events.next(&|_| true).await;
    let answer = |id: &Value, result: Value| json!({"jsonrpc": "2.0", "id": id, "result": result});
    // Round 1: two questions at once.
    let (a, b) = (next().await, next().await);
    let mut methods = [a["method"].as_str().unwrap(), b["method"].as_str().unwrap()];
    methods.sort();
    assert_eq!(methods, ["elicitation/create", "roots/list"], "{a} {b}");
    for q in [&a, &b] {
        let result = match q["method"].as_str().unwrap() {
            "elicitation/create" => {
                assert_eq!(q["params"]["message"], "Deploy to prod?", "{q}");
                json!({"action": "accept", "content": {"confirm": true}})
            }
            _ => json!({"roots": [{"uri": "file:///a"}, {"uri": "file:///b"}]}),
        };
        let r = legacy(&answer(&q["id"], result)).send().await.unwrap();
        assert_eq!(r.status(), 202);
    }
    // Round 2: the sampling.
    let c = next().await;
    assert_eq!(c["method"], "sampling/createMessage", "{c}");
    assert_eq!(
        c["params"]["messages"][0]["content"]["text"], "Say deployed",
        "{c}"
    );
    let r = legacy(&answer(
        &c["id"],
        json!({"role": "assistant", "content": {"type": "text", "text": "done!"}, "model": "m"}),
    ))
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), 202);
    let last = next().await;
    assert_eq!(last["id"], 9, "{last}");
    assert_eq!(
        last["result"]["content"][0]["text"], "deployed to prod (2 roots): done!",
        "{last}"
    );
}
