//! The Epode feedback binding, black-box: a real Python upstream (`mcp==2.3.0`), the strict
//! fake Epode, and the official TypeScript client through the sidecar, in every mode.

use crate::support::fake_epode::{
    Endpoint, FakeConfig, FakeEpode, Fault, DEMO_PRODUCT_KEY, FAULT_SECRET,
};
use crate::support::*;
use serde_json::{json, Value};

struct Rig {
    _up: Upstream,
    epode: FakeEpode,
    sc: Sidecar,
}

fn rig(mode: &str, extra: &[(&str, &str)]) -> Rig {
    let up = Upstream::start_with(UpstreamKind::Python, &["--identity"]);
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, mode));
    let sc = feedback_sidecar(&up.url(), &epode, mode, extra);
    Rig { _up: up, epode, sc }
}

fn call(rig: &Rig, mode: &str, tool: &str, args: Value) -> Value {
    ts_result(&rig.sc.url(), mode, tool, &args)
}

/// `_agentFeedback` wherever the placement rules put it.
fn agent_feedback(result: &Value) -> Option<Value> {
    if let Some(f) = result["structuredContent"].get("_agentFeedback") {
        return Some(f.clone());
    }
    result["content"].as_array()?.iter().find_map(|b| {
        let text = b["text"].as_str()?;
        let v: Value = serde_json::from_str(text).ok()?;
        v.get("_agentFeedback").cloned()
    })
}

fn text_of(result: &Value) -> String {
    result["content"]
        .as_array()
        .map(|blocks| {
            blocks
                .iter()
                .filter_map(|b| b["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

fn report_args(handle: &str, summary: &str) -> Value {
    json!({"feedbackHandle": handle, "summary": summary, "impact": "helped",
           "findings": [{"kind": "strength", "topic": "adding", "detail": "fast and exact"}]})
}

#[test]
fn never_ask_lists_decorates_and_reports() {
    let r = rig("never_ask", &[]);
    let list = ts_call(&r.sc.url(), "pin", None, &[]);
    let names: Vec<&str> = list["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "echo",
            "add",
            "slow",
            "account",
            "record_product_feedback_consent",
            "report_product_feedback"
        ],
        "the upstream's order (echo, add, slow, account), then the feedback tools once, at the end"
    );
    let tools = list["tools"].as_array().unwrap();
    for t in &tools[4..] {
        assert_eq!(t["inputSchema"]["additionalProperties"], false, "{t}");
        assert!(
            t["title"].is_string() && t["description"].is_string(),
            "{t}"
        );
        assert_eq!(t["annotations"]["idempotentHint"], true, "{t}");
    }
    let report = &tools[5]["inputSchema"];
    assert_eq!(
        report["properties"]["summary"]["maxLength"], 700,
        "{report}"
    );
    assert_eq!(report["properties"]["findings"]["maxItems"], 8, "{report}");
    let instructions = list["instructions"].as_str().unwrap_or_default();
    assert!(
        instructions.starts_with("After each selected product tool call"),
        "{instructions}"
    );

    // A schema-less tool: the action sits in structuredContent, then a plain restatement.
    let echo = call(&r, "pin", "echo", json!({"text": "hi"}));
    let fb = echo["structuredContent"]["_agentFeedback"].clone();
    assert_eq!(fb["state"], "feedback_ready", "{echo}");
    assert_eq!(fb["mode"], "never_ask");
    assert_eq!(fb["reportTool"], "report_product_feedback");
    assert!(
        fb.get("consentTool").is_none() && fb.get("question").is_none(),
        "{fb}"
    );
    let handle = fb["feedbackHandle"].as_str().unwrap().to_owned();
    assert!(handle.starts_with("afr2_"));
    let claims = r
        .epode
        .verify(&handle)
        .expect("the fake Epode accepts the sidecar's handle");
    let last = echo["content"].as_array().unwrap().last().unwrap()["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        last.contains(&format!(
            "Call report_product_feedback with feedbackHandle {handle}"
        )),
        "{last}"
    );

    // A tool with outputSchema: structuredContent untouched, the action in a JSON text block.
    let add = call(&r, "pin", "add", json!({"a": 2, "b": 3}));
    assert_eq!(add["structuredContent"], json!({"sum": 5, "a": 2, "b": 3}));
    let fb_add = agent_feedback(&add).expect("a standalone _agentFeedback block");
    assert_eq!(fb_add["state"], "feedback_ready");
    assert_ne!(
        fb_add["feedbackHandle"], fb["feedbackHandle"],
        "a fresh handle per call"
    );

    // The report is accepted; a duplicate returns the first.
    let ok = call(
        &r,
        "pin",
        "report_product_feedback",
        report_args(&handle, "Echo answered exactly as asked."),
    );
    assert_eq!(ok["structuredContent"]["accepted"], true, "{ok}");
    assert_ne!(ok["isError"], true);
    let again = call(
        &r,
        "pin",
        "report_product_feedback",
        report_args(&handle, "A different second summary."),
    );
    assert_eq!(
        again["structuredContent"]["report"]["id"],
        ok["structuredContent"]["report"]["id"]
    );
    assert_eq!(
        again["structuredContent"]["report"]["summary"],
        "Echo answered exactly as asked."
    );
    let stored = r.epode.reports();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0]["interactionId"], claims.i.to_string().as_str());
    // Only the report fields went to Epode.
    let sent = &r.epode.requests(Endpoint::Reports)[0].body;
    assert!(sent.get("feedbackHandle").is_none(), "{sent}");

    // A 2025-era client gets the same decoration.
    let legacy = call(&r, "legacy", "echo", json!({"text": "hi"}));
    assert_eq!(
        legacy["structuredContent"]["_agentFeedback"]["state"],
        "feedback_ready"
    );
}

#[test]
fn ask_always_asks_then_reports_only_after_approval() {
    let r = rig("ask_always", &[]);
    let first = call(&r, "pin", "echo", json!({"text": "hi"}));
    let fb = agent_feedback(&first).unwrap();
    assert_eq!(fb["state"], "consent_required", "{fb}");
    assert_eq!(fb["mode"], "ask_always");
    assert_eq!(fb["consentTool"], "record_product_feedback_consent");
    assert!(fb["question"].as_str().unwrap().contains("about this use"));
    assert!(
        fb.get("reportTool").is_none(),
        "no report action before consent: {fb}"
    );
    let handle = fb["feedbackHandle"].as_str().unwrap();

    let approved = call(
        &r,
        "pin",
        "record_product_feedback_consent",
        json!({"feedbackHandle": handle, "decision": "approved"}),
    );
    assert!(
        text_of(&approved).starts_with("Permission approved."),
        "{approved}"
    );
    assert_eq!(approved["structuredContent"]["feedbackHandle"], handle);
    assert_eq!(
        approved["structuredContent"]["reportTool"],
        "report_product_feedback"
    );
    assert_eq!(
        r.epode.requests(Endpoint::ConsentDecisions)[0].body,
        json!({"decision": "approved"})
    );
    let ok = call(
        &r,
        "pin",
        "report_product_feedback",
        report_args(handle, "Echo answered exactly as asked."),
    );
    assert_eq!(ok["structuredContent"]["accepted"], true, "{ok}");

    // Refusal: no action, and a report with that handle is refused.
    let second = call(&r, "pin", "echo", json!({"text": "again"}));
    let h2 = agent_feedback(&second).unwrap()["feedbackHandle"]
        .as_str()
        .unwrap()
        .to_owned();
    let declined = call(
        &r,
        "pin",
        "record_product_feedback_consent",
        json!({"feedbackHandle": h2, "decision": "declined"}),
    );
    assert_eq!(
        text_of(&declined),
        "Permission declined. Do not submit product feedback."
    );
    assert!(declined["structuredContent"].get("reportTool").is_none());
    let refused = call(
        &r,
        "pin",
        "report_product_feedback",
        report_args(&h2, "Should never be stored."),
    );
    assert_eq!(refused["isError"], true);
    assert_eq!(
        refused["structuredContent"],
        json!({"accepted": false, "retryable": false})
    );
    assert_eq!(r.epode.reports().len(), 1);
}

#[test]
fn ask_once_remembers_the_customer() {
    let r = rig("ask_once", &[]);
    // First use by a customer: the ask-once question.
    let first = call(&r, "pin", "account", json!({"customer": "cust_1"}));
    let fb = agent_feedback(&first).unwrap();
    assert_eq!(fb["state"], "consent_required", "{fb}");
    assert_eq!(fb["mode"], "ask_once");
    assert!(fb["question"]
        .as_str()
        .unwrap()
        .contains("future uses without asking again"));
    let handle = fb["feedbackHandle"].as_str().unwrap();
    let claims = r.epode.verify(handle).unwrap();
    assert_eq!(
        claims.s.as_deref(),
        r.epode.subject_for("cust_1").as_deref()
    );
    assert_eq!(claims.r, Some(0));
    call(
        &r,
        "pin",
        "record_product_feedback_consent",
        json!({"feedbackHandle": handle, "decision": "approved"}),
    );
    // A new call by the same customer: ready, without asking.
    let next = call(&r, "pin", "account", json!({"customer": "cust_1"}));
    let fb = agent_feedback(&next).unwrap();
    assert_eq!(fb["state"], "feedback_ready", "{fb}");
    assert_eq!(fb["configuredMode"], "ask_once");
    assert_eq!(fb["manageConsent"]["current"], "approved");
    let h = fb["feedbackHandle"].as_str().unwrap();
    let ok = call(
        &r,
        "pin",
        "report_product_feedback",
        report_args(h, "Account lookup was instant."),
    );
    assert_eq!(ok["structuredContent"]["accepted"], true, "{ok}");

    // Another customer declines: later calls are feedback_disabled.
    let other = call(&r, "pin", "account", json!({"customer": "cust_2"}));
    let h2 = agent_feedback(&other).unwrap()["feedbackHandle"]
        .as_str()
        .unwrap()
        .to_owned();
    call(
        &r,
        "pin",
        "record_product_feedback_consent",
        json!({"feedbackHandle": h2, "decision": "declined"}),
    );
    let later = call(&r, "pin", "account", json!({"customer": "cust_2"}));
    let fb = agent_feedback(&later).unwrap();
    assert_eq!(fb["state"], "feedback_disabled", "{fb}");
    assert_eq!(fb["manageConsent"]["current"], "declined");
    assert!(fb.get("reportTool").is_none());

    // Identified calls say nothing in the log about a missing customer.
    let mut logs = r.sc.logs();
    assert!(
        !logs.iter().any(|l| l.contains("name no customer")),
        "{logs:?}"
    );
    // Without a customerRef, Ask once falls back to the per-use question, and the log says
    // why, once, with how to name the customer.
    for _ in 0..3 {
        let anon = call(&r, "pin", "echo", json!({"text": "hi"}));
        let fb = agent_feedback(&anon).unwrap();
        assert_eq!(fb["state"], "consent_required");
        assert_eq!(fb["mode"], "ask_always");
        assert_eq!(fb["configuredMode"], "ask_once");
    }
    assert!(eventually(std::time::Duration::from_secs(10), || {
        logs.extend(r.sc.logs());
        logs.iter().any(|l| l.contains("name no customer"))
    }));
    let warned: Vec<&String> = logs
        .iter()
        .filter(|l| l.contains("name no customer"))
        .collect();
    assert_eq!(warned.len(), 1, "rate-limited: {warned:?}");
    assert!(
        warned[0].contains("WARN") && warned[0].contains(r#"ai.epode/identity"#),
        "{}",
        warned[0]
    );
}

#[test]
fn off_adds_nothing_and_identity_never_leaks() {
    for mode in ["off", "never_ask"] {
        let up = Upstream::start_with(UpstreamKind::Python, &["--identity"]);
        let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, mode));
        let sc = if mode == "off" {
            Sidecar::start(&up.url(), &[("AGENT_FEEDBACK_MODE", "off")])
        } else {
            feedback_sidecar(&up.url(), &epode, mode, &[])
        };
        let acct = ts_call(
            &sc.url(),
            "pin",
            Some(("account", &json!({"customer": "c_9"}))),
            &[],
        );
        let meta = &acct["result"]["_meta"];
        assert!(
            meta.get("ai.epode/identity").is_none(),
            "{mode}: identity leaked: {acct}"
        );
        assert_eq!(meta["vendor.example/keep"], "kept", "{mode}: {acct}");
        assert!(!acct.to_string().contains("journey:1"), "{mode}: {acct}");
        if mode == "off" {
            let list = ts_call(&sc.url(), "pin", None, &[]);
            assert_eq!(list["tools"].as_array().unwrap().len(), 4, "{list}");
            assert!(list["instructions"].is_null(), "{list}");
            let echo = ts_call(&sc.url(), "pin", Some(("echo", &json!({"text": "x"}))), &[]);
            assert!(agent_feedback(&echo["result"]).is_none(), "{echo}");
            assert!(epode.all_requests().is_empty(), "off mode talked to Epode");
        }
    }
}

async fn call_raw(sc: &Sidecar, tool: &str, args: Value) -> Value {
    let body = modern_body(
        json!(1),
        "tools/call",
        json!({"name": tool, "arguments": args}),
    );
    let resp = post_modern(&sc.url(), "tools/call", Some(tool), &body).await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    v["result"].clone()
}

async fn handle_for(sc: &Sidecar) -> String {
    let r = call_raw(sc, "echo", json!({"text": "x"})).await;
    agent_feedback(&r).unwrap()["feedbackHandle"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Every row of the failure guidance table, for both tools: an `isError` result with
/// `{accepted: false, retryable}` and the contract's text; Epode's own text never relayed.
#[tokio::test]
async fn failure_guidance_table() {
    let up = Upstream::start(UpstreamKind::Python);
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "ask_always"));
    let sc = feedback_sidecar(&up.url(), &epode, "ask_always", &[]);
    // (fault, report retryable, consent retryable, text the report result must contain)
    let rows: Vec<(Fault, bool, bool, &str)> = vec![
        (Fault::Hangup, true, true, "temporarily unavailable"),
        (Fault::Status(408), true, true, "HTTP 408"),
        (Fault::StatusRetryAfter(429, 1), true, true, "HTTP 429"),
        (Fault::Status(500), true, true, "HTTP 500"),
        (Fault::Status(503), true, true, "HTTP 503"),
        (Fault::Status(400), true, false, "HTTP 400"),
        (Fault::Status(422), true, false, "HTTP 422"),
        (Fault::Status(401), false, false, "HTTP 401"),
        (Fault::Status(403), false, false, "HTTP 403"),
        (Fault::Status(404), false, false, "HTTP 404"),
        (Fault::Status(409), false, false, "HTTP 409"),
        (Fault::Status(410), false, false, "HTTP 410"),
    ];
    for (fault, report_retry, consent_retry, text) in rows {
        let handle = handle_for(&sc).await;
        epode.inject(Endpoint::Reports, fault.clone());
        let r = call_raw(
            &sc,
            "report_product_feedback",
            report_args(&handle, "A sound product run."),
        )
        .await;
        assert_eq!(r["isError"], true, "{fault:?}: {r}");
        assert_eq!(
            r["structuredContent"],
            json!({"accepted": false, "retryable": report_retry}),
            "{fault:?}"
        );
        let t = text_of(&r);
        assert!(t.contains(text), "{fault:?}: {t}");
        assert!(
            !r.to_string().contains(FAULT_SECRET),
            "Epode's text relayed: {r}"
        );

        epode.inject(Endpoint::ConsentDecisions, fault.clone());
        let c = call_raw(
            &sc,
            "record_product_feedback_consent",
            json!({"feedbackHandle": handle, "decision": "approved"}),
        )
        .await;
        assert_eq!(c["isError"], true, "{fault:?}: {c}");
        assert_eq!(
            c["structuredContent"],
            json!({"accepted": false, "retryable": consent_retry}),
            "{fault:?}"
        );
        assert!(
            !c.to_string().contains(FAULT_SECRET),
            "Epode's text relayed: {c}"
        );
    }
    // A retryable report says to retry once; a 400 says to retry with only handle and summary.
    let handle = handle_for(&sc).await;
    epode.inject(Endpoint::Reports, Fault::Status(400));
    let r = call_raw(
        &sc,
        "report_product_feedback",
        report_args(&handle, "A sound product run."),
    )
    .await;
    assert!(text_of(&r).contains("summary"), "{r}");
}

/// Epode not answering within the deadline is a retryable failure, not a hang.
#[tokio::test]
async fn epode_timeout_is_retryable() {
    let up = Upstream::start(UpstreamKind::Python);
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    // The deadline (10 s by default) shortened so the test does not wait it out.
    let sc = feedback_sidecar(
        &up.url(),
        &epode,
        "never_ask",
        &[("EPODE_SIDECAR_FEEDBACK_TIMEOUT", "1s")],
    );
    let handle = handle_for(&sc).await;
    epode.inject(
        Endpoint::Reports,
        Fault::Delay(std::time::Duration::from_secs(5)),
    );
    let started = std::time::Instant::now();
    let r = call_raw(
        &sc,
        "report_product_feedback",
        report_args(&handle, "A sound product run."),
    )
    .await;
    let took = started.elapsed();
    assert!(
        took >= std::time::Duration::from_secs(1) && took < std::time::Duration::from_secs(3),
        "the 1 s deadline gave {took:?}"
    );
    assert_eq!(
        r["structuredContent"],
        json!({"accepted": false, "retryable": true}),
        "{r}"
    );
}

#[tokio::test]
async fn invalid_arguments_are_refused_locally() {
    let up = Upstream::start(UpstreamKind::Python);
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let sc = feedback_sidecar(&up.url(), &epode, "never_ask", &[]);
    let handle = handle_for(&sc).await;
    for (tool, args, mentions) in [
        (
            "report_product_feedback",
            json!({"feedbackHandle": handle, "summary": "short"}),
            "summary",
        ),
        (
            "report_product_feedback",
            json!({"feedbackHandle": handle, "summary": "long enough text", "extra": 1}),
            "extra",
        ),
        (
            "report_product_feedback",
            json!({"feedbackHandle": "nope", "summary": "long enough text"}),
            "feedbackHandle",
        ),
        (
            "record_product_feedback_consent",
            json!({"feedbackHandle": handle, "decision": "maybe"}),
            "decision",
        ),
    ] {
        let r = call_raw(&sc, tool, args).await;
        assert_eq!(r["isError"], true, "{r}");
        assert!(text_of(&r).contains(mentions), "{tool}: {r}");
    }
    assert_eq!(epode.request_count(Endpoint::Reports), 0);
    assert_eq!(epode.request_count(Endpoint::ConsentDecisions), 0);
}

/// Calls are stateless: a call that names a tool the sidecar has never seen listed is still
/// placed right (the sidecar lists the tools itself), and an SSE answer is decorated in its
/// final event with the progress events before it untouched.
#[tokio::test]
async fn decorates_without_a_prior_list_and_on_streams() {
    let up = Upstream::start(UpstreamKind::Python);
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let sc = feedback_sidecar(&up.url(), &epode, "never_ask", &[]);
    let add = call_raw(&sc, "add", json!({"a": 2, "b": 3})).await;
    assert_eq!(
        add["structuredContent"],
        json!({"sum": 5, "a": 2, "b": 3}),
        "{add}"
    );
    assert!(agent_feedback(&add).is_some(), "{add}");
    let echo = call_raw(&sc, "echo", json!({"text": "x"})).await;
    assert!(
        echo["structuredContent"]["_agentFeedback"].is_object(),
        "{echo}"
    );

    let mut body = modern_body(
        json!("p"),
        "tools/call",
        json!({"name": "slow", "arguments": {"steps": 2}}),
    );
    body["params"]["_meta"]["progressToken"] = json!("tok");
    let resp = post_modern(&sc.url(), "tools/call", Some("slow"), &body).await;
    let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(ct.starts_with("text/event-stream"), "{ct}");
    let text = resp.text().await.unwrap();
    assert_eq!(text.matches("notifications/progress").count(), 2, "{text}");
    let last = last_message(&ct, &text);
    assert_eq!(last["id"], "p");
    assert!(
        last["result"]["structuredContent"]["_agentFeedback"]["feedbackHandle"].is_string(),
        "{last}"
    );
}

/// Decoration rewrites only what it adds: every other value keeps its exact bytes. The raw
/// upstream cannot list its tools, so the sidecar uses the placement that never touches
/// `structuredContent`.
#[tokio::test]
async fn decoration_keeps_every_other_byte() {
    let up = ScriptedUpstream::new()
        .on(
            "tools/call",
            Reply::result_raw(r#"{"content":[{"type":"text","text":"\u00e9"}],"structuredContent":{"big":1e400,"n":12345678901234567890,"f":0.1,"s":"\u00e9\ud83d\ude80"},"resultType":"complete"}"#),
        )
        // `odd` declares an outputSchema: the action goes in its own text block and
        // structuredContent stays as it was.
        .on(
            "tools/list",
            Reply::result_raw(r#"{"tools":[{"name":"odd","inputSchema":{"type":"object"},"outputSchema":{"type":"object"}}]}"#),
        )
        .otherwise(Reply::error(-32601, "no"))
        .start();
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let sc = feedback_sidecar(
        &up.url(),
        &epode,
        "never_ask",
        &[("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28")],
    );
    let body = modern_body(
        json!(1),
        "tools/call",
        json!({"name": "odd", "arguments": {}}),
    );
    let text = post_modern(&sc.url(), "tools/call", Some("odd"), &body)
        .await
        .text()
        .await
        .unwrap();
    assert!(
        text.contains(r#""structuredContent":{"big":1e400,"n":12345678901234567890,"f":0.1,"s":"\u00e9\ud83d\ude80"}"#),
        "{text}"
    );
    assert!(
        text.contains(
            r#"[{"type":"text","text":"\u00e9"},{"type":"text","text":"{\"_agentFeedback\""#
        ),
        "{text}"
    );
}

/// customerRef is the legacy Ask-once subject: the real Epode service records it as a leak on
/// any interaction outside ask_once. The Python upstream's identity carries customerRef equal
/// to accountRef; only ask_once telemetry may carry it.
#[test]
fn customer_ref_reaches_epode_only_in_ask_once() {
    for mode in ["never_ask", "ask_always", "ask_once"] {
        let r = rig(mode, &[]);
        call(&r, "pin", "account", json!({"customer": "acct_7"}));
        let events = r
            .epode
            .wait_for_events(1, std::time::Duration::from_secs(10));
        assert_eq!(events.len(), 1, "{mode}: {events:?}");
        let e = &events[0];
        assert_eq!(e["accountRef"], "acct_7", "{mode}: {e}");
        assert_eq!(e["userRef"], "user_1", "{mode}: {e}");
        if mode == "ask_once" {
            assert_eq!(e["customerRef"], "acct_7", "{mode}: {e}");
        } else {
            assert!(
                e.get("customerRef").is_none(),
                "{mode}: legacy customerRef leaked into Epode: {e}"
            );
        }
    }
}

/// A call naming a tool the upstream does not list passes through untouched: the upstream's
/// own answer, no `_agentFeedback`, no telemetry event; in both client eras.
#[tokio::test]
async fn unknown_tools_are_not_product_operations() {
    let up = Upstream::start(UpstreamKind::Python);
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let sc = feedback_sidecar(&up.url(), &epode, "never_ask", &[]);
    let modern = call_raw(&sc, "invented_tool", json!({})).await;
    assert_eq!(modern["isError"], true, "{modern}");
    assert!(text_of(&modern).contains("Unknown tool"), "{modern}");
    assert!(agent_feedback(&modern).is_none(), "{modern}");
    let legacy = http()
        .post(sc.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"also_invented","arguments":{}}}"#)
        .send()
        .await
        .unwrap();
    let ct = legacy.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    let legacy = last_message(&ct, &legacy.text().await.unwrap());
    assert_eq!(legacy["result"]["isError"], true, "{legacy}");
    assert!(agent_feedback(&legacy["result"]).is_none(), "{legacy}");
    // A listed tool is still a product operation, and it is the only event.
    let echo = call_raw(&sc, "echo", json!({"text": "x"})).await;
    assert!(agent_feedback(&echo).is_some(), "{echo}");
    // `echo` began after both unknown calls were answered: once its event is at Epode and
    // the sidecar has nothing queued or in delivery, an event of theirs would be at Epode too,
    // or at least counted as enqueued.
    let settled = eventually_async(std::time::Duration::from_secs(10), || async {
        epode.events().iter().any(|e| e["operation"] == "echo")
            && metric(&sc, "epode_sidecar_telemetry_queue_depth").await == 0
    })
    .await;
    let events = epode.events();
    assert!(settled, "the echo event was not delivered: {events:?}");
    let ops: Vec<&str> = events
        .iter()
        .filter_map(|e| e["operation"].as_str())
        .collect();
    assert_eq!(ops, ["echo"], "{events:?}");
    assert_eq!(
        metric(&sc, "epode_sidecar_telemetry_enqueued_total").await,
        1
    );
}

/// Handles the sidecar did not sign, or that expired, or that are malformed or huge, are
/// refused locally and never reach Epode: not retryable, and the agent is told to use a newer
/// product result's handle.
#[tokio::test]
async fn bad_handles_never_reach_epode() {
    let up = Upstream::start(UpstreamKind::Python);
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "ask_always"));
    let sc = feedback_sidecar(&up.url(), &epode, "ask_always", &[]);
    let good = handle_for(&sc).await;
    let (head, sig) = good.rsplit_once('.').unwrap();
    let tampered = format!("{head}.{}", sig.chars().rev().collect::<String>());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let expired = crate::support::fake_epode::mint_handle(
        DEMO_PRODUCT_KEY,
        &json!({"v": 1, "i": "018f1f2e-7b4a-4c12-9c8d-123456789abc", "iat": now - 7300,
                "exp": now - 100, "n": "AQIDBAUGBwgJCgsMDQ4PEBES"}),
    )
    .unwrap();
    let other_key = crate::support::fake_epode::mint_handle(
        "af_live_ffffffffffffffffffffffffffffffff_another_products_secret_0123",
        &json!({"v": 1, "i": "018f1f2e-7b4a-4c12-9c8d-123456789abc", "iat": now,
                "exp": now + 60, "n": "AQIDBAUGBwgJCgsMDQ4PEBES"}),
    )
    .unwrap();
    let huge = format!("afr2_{}", "A".repeat(100_000));
    for bad in [
        tampered,
        expired,
        other_key,
        huge,
        "afr2_not.a.handle".to_owned(),
    ] {
        let r = call_raw(
            &sc,
            "report_product_feedback",
            report_args(&bad, "A sound product run."),
        )
        .await;
        assert_eq!(r["isError"], true, "{r}");
        assert_eq!(
            r["structuredContent"],
            json!({"accepted": false, "retryable": false}),
            "{r}"
        );
        let t = text_of(&r);
        assert!(
            t.contains("invalid or expired") && t.contains("newer product result"),
            "{t}"
        );
        let c = call_raw(
            &sc,
            "record_product_feedback_consent",
            json!({"feedbackHandle": bad, "decision": "approved"}),
        )
        .await;
        assert_eq!(
            c["structuredContent"],
            json!({"accepted": false, "retryable": false}),
            "{c}"
        );
        assert!(text_of(&c).contains("Never assume approval"), "{c}");
    }
    assert_eq!(epode.request_count(Endpoint::Reports), 0);
    assert_eq!(epode.request_count(Endpoint::ConsentDecisions), 0);
    // The good handle still works.
    let c = call_raw(
        &sc,
        "record_product_feedback_consent",
        json!({"feedbackHandle": good, "decision": "approved"}),
    )
    .await;
    assert!(c.get("isError").is_none(), "{c}");
}

/// What comes back from Epode is not trusted: a redirect is not followed (the handle would go
/// elsewhere), an answer over 64 KiB is not read, and a 2xx that is not Epode's answer is a
/// failure, never "accepted".
#[tokio::test]
async fn epode_answers_are_not_trusted() {
    let up = Upstream::start(UpstreamKind::Python);
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "ask_always"));
    let sc = feedback_sidecar(&up.url(), &epode, "ask_always", &[]);
    // Consent first (approved), so reports are accepted when no fault is injected.
    let handle = handle_for(&sc).await;
    epode.inject(
        Endpoint::ConsentDecisions,
        Fault::Redirect("/elsewhere".into()),
    );
    let c = call_raw(
        &sc,
        "record_product_feedback_consent",
        json!({"feedbackHandle": handle, "decision": "approved"}),
    )
    .await;
    assert_eq!(c["isError"], true, "{c}");
    assert!(text_of(&c).contains("HTTP 307"), "{c}");
    let c = call_raw(
        &sc,
        "record_product_feedback_consent",
        json!({"feedbackHandle": handle, "decision": "approved"}),
    )
    .await;
    assert!(c.get("isError").is_none(), "{c}");
    for (fault, what) in [
        (Fault::Redirect("/elsewhere".into()), "HTTP 307"),
        (Fault::Oversized(100 * 1024), "temporarily unavailable"),
        (Fault::MalformedReceipt, "temporarily unavailable"),
    ] {
        epode.inject(Endpoint::Reports, fault.clone());
        let r = call_raw(
            &sc,
            "report_product_feedback",
            report_args(&handle, "A sound product run."),
        )
        .await;
        assert_eq!(r["isError"], true, "{fault:?}: {r}");
        assert_eq!(r["structuredContent"]["accepted"], false, "{fault:?}: {r}");
        assert!(text_of(&r).contains(what), "{fault:?}: {r}");
    }
    assert_eq!(
        epode.request_count(Endpoint::Other),
        0,
        "a redirect was followed"
    );
    // Without a fault, the same report is accepted.
    let ok = call_raw(
        &sc,
        "report_product_feedback",
        report_args(&handle, "A sound product run."),
    )
    .await;
    assert_eq!(ok["structuredContent"]["accepted"], true, "{ok}");
}

/// A `tools/list` result of `n` tools named `tool_000000`….
fn tools_page(n: usize) -> String {
    let tools: Vec<String> = (0..n)
        .map(|i| {
            format!(r#"{{"name":"tool_{i:06}","description":"Tool {i}","inputSchema":{{"type":"object"}}}}"#)
        })
        .collect();
    format!(
        r#"{{"tools":[{}],"resultType":"complete"}}"#,
        tools.join(",")
    )
}

/// Lists the tools at `url`; returns the time to the parsed answer and how many it lists.
async fn timed_list(url: &str) -> (std::time::Duration, usize) {
    let started = std::time::Instant::now();
    let body = modern_body(json!("l"), "tools/list", json!({}));
    let resp = post_modern(url, "tools/list", None, &body).await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    let n = v["result"]["tools"].as_array().map_or(0, Vec::len);
    (started.elapsed(), n)
}

/// An upstream that lists 25,000 tools. The catalog used to keep 10,000 names and rescan them
/// all for every new name past that, under the lock every call's lookup takes (8 s per list of
/// 20,000 in a release build, other clients' calls waiting as long). Now the list through the
/// sidecar takes a small multiple of fetching and parsing it directly, calls made while a list
/// is being learned are not held up, and the tool listed last is decorated.
#[tokio::test]
async fn an_upstream_listing_25_000_tools_is_listed_and_decorated_without_a_cliff() {
    const N: usize = 25_000;
    let page = std::sync::Arc::new(tools_page(N));
    let up = ScriptedUpstream::new()
        .on("tools/list", Reply::result_raw(page.as_str()))
        .otherwise(Reply::result_raw(
            r#"{"content":[{"type":"text","text":"done"}],"resultType":"complete"}"#,
        ))
        .start();
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let sc = feedback_sidecar(
        &up.url(),
        &epode,
        "never_ask",
        &[("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28")],
    );
    let mut direct = std::time::Duration::MAX;
    for _ in 0..3 {
        let (took, n) = timed_list(&up.url()).await;
        assert_eq!(n, N);
        direct = direct.min(took);
    }
    let (first, n) = timed_list(&sc.url()).await;
    assert_eq!(n, N + 2, "the upstream's tools and the two feedback tools");
    assert!(
        first < direct * 10,
        "the list took {first:?} through the sidecar, {direct:?} directly"
    );
    // Another client calls a listed tool over and over while the list is learned again (on a
    // thread of its own: this one is busy parsing the list).
    let url = sc.url();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let caller = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let mut slowest = std::time::Duration::ZERO;
                let mut calls = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let started = std::time::Instant::now();
                    let body = modern_body(
                        json!(calls),
                        "tools/call",
                        json!({"name": "tool_000000", "arguments": {}}),
                    );
                    let resp = post_modern(&url, "tools/call", Some("tool_000000"), &body).await;
                    assert_eq!(resp.status(), 200);
                    let r: Value = resp.json().await.unwrap();
                    assert!(agent_feedback(&r["result"]).is_some(), "{r}");
                    slowest = slowest.max(started.elapsed());
                    calls += 1;
                }
                (calls, slowest)
            })
        })
    };
    let (again, _) = timed_list(&sc.url()).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (calls, slowest) = caller.join().unwrap();
    assert!(
        calls >= 3 && slowest < again / 2,
        "{calls} calls during a {again:?} list, the slowest {slowest:?}"
    );
    let last = call_raw(&sc, &format!("tool_{:06}", N - 1), json!({})).await;
    assert!(
        agent_feedback(&last).is_some(),
        "the tool listed last is decorated: {last}"
    );
}

/// A handle that expires while Epode is still answering its consent decision: the decision
/// is remembered all the same (it was verified when it arrived), so the customer is not asked
/// again. It once was: the cache verified the handle a second time, after Epode's answer,
/// found it expired and kept the old state without a word.
#[test]
fn a_consent_decided_as_its_handle_expires_is_remembered() {
    // Epode's answer takes 12 s, within the feedback tools' deadline.
    let r = rig("ask_once", &[("EPODE_SIDECAR_FEEDBACK_TIMEOUT", "40s")]);
    let first = call(&r, "pin", "account", json!({"customer": "cust_late"}));
    let fb = agent_feedback(&first).unwrap();
    assert_eq!(fb["state"], "consent_required", "{fb}");
    let claims = r
        .epode
        .verify(fb["feedbackHandle"].as_str().unwrap())
        .unwrap();
    let subject = claims
        .s
        .clone()
        .expect("an ask-once handle names its subject");
    // The same interaction and subject, minted to expire eight seconds from now (time enough
    // for the client to start on a loaded machine), while Epode takes twelve to answer.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    r.epode.set_now(Some(now + 8 - 7200));
    let late = r.epode.mint(&claims.i, Some((&subject, 0)));
    r.epode.set_now(None);
    r.epode.inject(
        Endpoint::ConsentDecisions,
        Fault::Delay(std::time::Duration::from_secs(12)),
    );
    let decided = call(
        &r,
        "pin",
        "record_product_feedback_consent",
        json!({"feedbackHandle": late, "decision": "approved"}),
    );
    assert_eq!(
        decided["structuredContent"]["state"], "approved",
        "{decided}"
    );
    let next = call(&r, "pin", "account", json!({"customer": "cust_late"}));
    let fb = agent_feedback(&next).unwrap();
    assert_eq!(fb["state"], "feedback_ready", "asked again: {fb}");
}
