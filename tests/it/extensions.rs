//! The 2026-07-28 extensions a product carries pass through the sidecar: tasks
//! (`io.modelcontextprotocol/tasks`) and MCP Apps (`io.modelcontextprotocol/ui`), against a
//! real FastMCP 4.1.6 server carrying both (`tests/peers/fastmcp_tasks.py`). A task's creation
//! passes as the upstream wrote it, never decorated nor counted; the first terminal
//! `tasks/get` answer is the product call's outcome (decorated, one telemetry event);
//! `tasks/*` name their task in `Mcp-Name`; a tool's `_meta.ui` and a `ui://` resource pass
//! untouched; the upstream's `capabilities.extensions` reach both eras' clients.

use std::time::Duration;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::support::fake_epode::{FakeConfig, FakeEpode, DEMO_PRODUCT_KEY};
use crate::support::{
    eventually_async, feedback_sidecar, http, last_message, modern_headers, Sidecar, Upstream,
    UpstreamKind,
};

const TASKS: &str = "io.modelcontextprotocol/tasks";
const UI: &str = "io.modelcontextprotocol/ui";
const EPODE: &str = "ai.epode/agent-feedback";

/// A 2026 request of `method` to `url`, declaring `caps`: the raw body of its answer.
async fn send(
    url: &str,
    id: u64,
    method: &str,
    name: Option<&str>,
    params: Value,
    caps: Value,
) -> String {
    let mut params = params;
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": caps,
        "io.modelcontextprotocol/clientInfo": {"name": "extensions-tests", "version": "0"}
    });
    let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let mut req = http().post(url).body(body.to_string());
    for (k, v) in modern_headers(method, name) {
        req = req.header(k, v);
    }
    let resp = req.send().await.unwrap();
    let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
    let text = resp.text().await.unwrap();
    if ct.starts_with("text/event-stream") {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
            .rfind(|d| !d.is_empty())
            .unwrap_or_default()
            .to_owned()
    } else {
        text
    }
}

fn tasks_caps() -> Value {
    json!({"extensions": {TASKS: {}}})
}

/// The raw `result` of a JSON-RPC message, as its sender wrote it.
fn raw_result(msg: &str) -> String {
    #[derive(Deserialize)]
    struct Msg<'a> {
        #[serde(borrow)]
        result: &'a RawValue,
    }
    serde_json::from_str::<Msg<'_>>(msg)
        .unwrap_or_else(|e| panic!("{e}: {msg}"))
        .result
        .get()
        .to_owned()
}

/// A task's result with what differs between two tasks (its id, its times) masked.
fn masked(result: &str) -> String {
    let v: Value = serde_json::from_str(result).unwrap();
    let mut out = result.to_owned();
    for k in ["taskId", "createdAt", "lastUpdatedAt"] {
        if let Some(s) = v[k].as_str() {
            out = out.replace(s, &format!("<{k}>"));
        }
    }
    out
}

/// `_agentFeedback` wherever the placement rules put it in a tool result.
fn agent_feedback(result: &Value) -> Option<Value> {
    if let Some(f) = result["structuredContent"].get("_agentFeedback") {
        return Some(f.clone());
    }
    result["content"].as_array()?.iter().find_map(|b| {
        let v: Value = serde_json::from_str(b["text"].as_str()?).ok()?;
        v.get("_agentFeedback").cloned()
    })
}

/// Polls `tasks/get` through `url` until the task is terminal: the raw answer.
async fn until_terminal(url: &str, task_id: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut id = 100;
    loop {
        id += 1;
        let got = send(
            url,
            id,
            "tasks/get",
            Some(task_id),
            json!({"taskId": task_id}),
            tasks_caps(),
        )
        .await;
        let v: Value = serde_json::from_str(&got).unwrap();
        let status = v["result"]["status"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if ["completed", "failed", "cancelled"].contains(&status.as_str()) {
            return got;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still {status}: {got}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A product call answered with a task: its creation passes as the upstream wrote it (the
/// same bytes as direct, its id and times aside), with no `_agentFeedback` and no event; the
/// first terminal `tasks/get` is the call's outcome, decorated once and counted once (a
/// later poll passes untouched and counts nothing); a failed task is one error event.
#[tokio::test]
async fn a_task_is_passed_as_written_and_its_terminal_answer_is_the_calls_outcome() {
    let up = Upstream::start(UpstreamKind::FastMcpExtensions);
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let sc = feedback_sidecar(&up.url(), &epode, "never_ask", &[]);
    let call = |url: String, id: u64, args: Value| async move {
        let params = json!({"name": "long_job", "arguments": args});
        send(
            &url,
            id,
            "tools/call",
            Some("long_job"),
            params,
            tasks_caps(),
        )
        .await
    };
    let direct = call(up.url(), 1, json!({})).await;
    let through = call(sc.url(), 1, json!({})).await;
    let created = raw_result(&through);
    assert!(created.contains(r#""resultType":"task""#), "{through}");
    assert!(!created.contains("_agentFeedback"), "{created}");
    assert_eq!(
        masked(&created),
        masked(&raw_result(&direct)),
        "byte for byte"
    );
    let task: Value = serde_json::from_str(&created).unwrap();
    let task_id = task["taskId"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        epode.events().is_empty(),
        "the creation counted: {:?}",
        epode.events()
    );

    let done = until_terminal(&sc.url(), &task_id).await;
    let v: Value = serde_json::from_str(&done).unwrap();
    assert_eq!(v["result"]["status"], "completed", "{done}");
    let fb = agent_feedback(&v["result"]["result"]).unwrap_or_else(|| panic!("{done}"));
    assert_eq!(fb["state"], "feedback_ready", "{fb}");
    let handle = fb["feedbackHandle"].as_str().unwrap();
    let claims = epode.verify(handle).unwrap();
    let arrived = eventually_async(Duration::from_secs(10), || {
        std::future::ready(!epode.events().is_empty())
    })
    .await;
    assert!(arrived, "no event for the task's outcome");
    // Polled again: passed as the upstream answers it, nothing counted twice.
    let again = send(
        &sc.url(),
        200,
        "tasks/get",
        Some(&task_id),
        json!({"taskId": task_id}),
        tasks_caps(),
    )
    .await;
    assert!(!again.contains("_agentFeedback"), "{again}");
    let failed = call(sc.url(), 2, json!({"fail": true})).await;
    let failed_id = serde_json::from_str::<Value>(&failed).unwrap()["result"]["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    let failed_done = until_terminal(&sc.url(), &failed_id).await;
    assert!(
        failed_done.contains(r#""status":"failed""#),
        "{failed_done}"
    );
    let two = eventually_async(Duration::from_secs(10), || {
        std::future::ready(epode.events().len() >= 2)
    })
    .await;
    assert!(two, "{:?}", epode.events());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let events = epode.events();
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0]["operation"], "long_job");
    assert_eq!(events[0]["statusCode"], 200, "a success: {events:?}");
    assert!(
        events[0]["durationMs"].as_u64() >= Some(250),
        "from the call to the task's end: {events:?}"
    );
    assert_eq!(
        events[0]["interactionId"],
        claims.i.as_str(),
        "the handle names the event"
    );
    assert_eq!(events[1]["statusCode"], 500, "an error: {events:?}");
    // A client that takes no tasks gets the result itself, decorated and counted as ever.
    let sync = send(
        &sc.url(),
        3,
        "tools/call",
        Some("long_job"),
        json!({"name": "long_job", "arguments": {"ms": 10}}),
        json!({}),
    )
    .await;
    let v: Value = serde_json::from_str(&sync).unwrap();
    assert_eq!(v["result"]["resultType"], "complete", "{sync}");
    assert!(agent_feedback(&v["result"]).is_some(), "{sync}");
}

/// `tasks/get`, `tasks/update` and `tasks/cancel` name their task in `Mcp-Name` (the
/// extension's routing header): checked against `params.taskId` like a tool's name, and
/// forwarded and answered when they agree.
#[tokio::test]
async fn the_task_methods_name_their_task_in_mcp_name() {
    let up = Upstream::start(UpstreamKind::FastMcpExtensions);
    let sc = Sidecar::start(&up.url(), &[]);
    let created = send(
        &sc.url(),
        1,
        "tools/call",
        Some("long_job"),
        json!({"name": "long_job", "arguments": {"ms": 5000}}),
        tasks_caps(),
    )
    .await;
    let task_id = serde_json::from_str::<Value>(&created).unwrap()["result"]["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    let wrong = send(
        &sc.url(),
        2,
        "tasks/get",
        Some("another-task"),
        json!({"taskId": task_id}),
        tasks_caps(),
    )
    .await;
    let v: Value = serde_json::from_str(&wrong).unwrap();
    assert_eq!(v["error"]["code"], -32020, "{wrong}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("Mcp-Name"),
        "{wrong}"
    );
    let update = send(
        &sc.url(),
        3,
        "tasks/update",
        Some(&task_id),
        json!({"taskId": task_id, "inputResponses": {}}),
        tasks_caps(),
    )
    .await;
    assert_eq!(
        serde_json::from_str::<Value>(&update).unwrap()["result"]["resultType"],
        "complete",
        "{update}"
    );
    let cancel = send(
        &sc.url(),
        4,
        "tasks/cancel",
        Some(&task_id),
        json!({"taskId": task_id}),
        tasks_caps(),
    )
    .await;
    assert!(
        serde_json::from_str::<Value>(&cancel)
            .unwrap()
            .get("error")
            .is_none(),
        "{cancel}"
    );
    let get = send(
        &sc.url(),
        5,
        "tasks/get",
        Some(&task_id),
        json!({"taskId": task_id}),
        tasks_caps(),
    )
    .await;
    assert_eq!(
        serde_json::from_str::<Value>(&get).unwrap()["result"]["status"],
        "cancelled",
        "{get}"
    );
}

/// MCP Apps pass untouched: a tool's `_meta.ui` in `tools/list` and a `ui://` resource's
/// contents are the upstream's bytes, and the upstream's `capabilities.extensions` reach a
/// 2026 client's `server/discover` and a 2025 client's `initialize`.
#[tokio::test]
async fn apps_and_the_upstreams_extensions_pass_in_both_eras() {
    let up = Upstream::start(UpstreamKind::FastMcpExtensions);
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let sc = feedback_sidecar(&up.url(), &epode, "never_ask", &[]);
    let tool_of = |msg: &str, name: &str| -> String {
        #[derive(Deserialize)]
        struct List<'a> {
            #[serde(borrow)]
            tools: Vec<&'a RawValue>,
        }
        let result = raw_result(msg);
        let list: List<'_> = serde_json::from_str(&result).unwrap();
        list.tools
            .iter()
            .find(|t| t.get().contains(&format!(r#""name":"{name}""#)))
            .unwrap_or_else(|| panic!("no {name} in {result}"))
            .get()
            .to_owned()
    };
    let direct = send(&up.url(), 1, "tools/list", None, json!({}), json!({})).await;
    let through = send(&sc.url(), 1, "tools/list", None, json!({}), json!({})).await;
    let clock = tool_of(&through, "clock");
    assert_eq!(clock, tool_of(&direct, "clock"));
    assert!(
        clock.contains(r#""ui":{"resourceUri":"ui://clock/app.html""#),
        "{clock}"
    );
    let read = |url: String| async move {
        let got = send(
            &url,
            2,
            "resources/read",
            Some("ui://clock/app.html"),
            json!({"uri": "ui://clock/app.html"}),
            json!({}),
        )
        .await;
        #[derive(Deserialize)]
        struct Read<'a> {
            #[serde(borrow)]
            contents: &'a RawValue,
        }
        let result = raw_result(&got);
        serde_json::from_str::<Read<'_>>(&result)
            .unwrap()
            .contents
            .get()
            .to_owned()
    };
    let contents = read(sc.url()).await;
    assert_eq!(contents, read(up.url()).await);
    assert!(contents.contains("text/html;profile=mcp-app"), "{contents}");

    // Beside the upstream's, the binding's own, as Epode's SDKs advertise it.
    let discover = send(&sc.url(), 3, "server/discover", None, json!({}), json!({})).await;
    let v: Value = serde_json::from_str(&discover).unwrap();
    for ext in [TASKS, UI, EPODE] {
        assert!(
            v["result"]["capabilities"]["extensions"].get(ext).is_some(),
            "{discover}"
        );
    }
    assert_eq!(v["result"]["capabilities"]["extensions"][EPODE], json!({}));
    let init = http()
        .post(sc.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "legacy", "version": "0"}}})
            .to_string(),
        )
        .send()
        .await
        .unwrap();
    let ct = init.headers()["content-type"].to_str().unwrap().to_owned();
    let v = last_message(&ct, &init.text().await.unwrap());
    for ext in [TASKS, UI, EPODE] {
        assert!(
            v["result"]["capabilities"]["extensions"].get(ext).is_some(),
            "{v}"
        );
    }
    // Feedback off: the upstream's extensions only.
    let off = Sidecar::start(&up.url(), &[]);
    let discover = send(&off.url(), 4, "server/discover", None, json!({}), json!({})).await;
    let v: Value = serde_json::from_str(&discover).unwrap();
    let extensions = &v["result"]["capabilities"]["extensions"];
    assert!(
        extensions.get(TASKS).is_some() && extensions.get(EPODE).is_none(),
        "{discover}"
    );
}
