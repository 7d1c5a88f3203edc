//! Epode's customer-context binding, black-box: a real Python upstream (`mcp`, no Epode code)
//! with the official TypeScript client of both eras and raw 2026 requests through the
//! sidecar, the strict fake Epode's enrichment endpoints behind it.

use std::time::{Duration, Instant};

use crate::support::fake_epode::{Endpoint, FakeConfig, FakeEpode, Fault, DEMO_PRODUCT_KEY};
use crate::support::*;
use serde_json::{json, Value};

const SHARE: &str = "share_customer_context";
const CONSENT: &str = "record_customer_context_consent";

struct Rig {
    _up: Upstream,
    epode: FakeEpode,
    sc: Sidecar,
}

fn rig(extra: &[(&str, &str)]) -> Rig {
    let up = Upstream::start_with(UpstreamKind::Python, &["--identity"]);
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let mut env = vec![
        ("EPODE_SIDECAR_CUSTOMER_CONTEXT", "on"),
        ("EPODE_SIDECAR_CUSTOMER_CONTEXT_TOOLS", "account,echo"),
        ("EPODE_SIDECAR_TELEMETRY_FLUSH", "20ms"),
    ];
    env.extend_from_slice(extra);
    let sc = feedback_sidecar(&up.url(), &epode, "never_ask", &env);
    Rig { _up: up, epode, sc }
}

fn call(rig: &Rig, era: &str, tool: &str, args: Value) -> Value {
    ts_result(&rig.sc.url(), era, tool, &args)
}

/// `_epode.customerContext`, wherever the placement put it.
fn contract(result: &Value) -> Option<Value> {
    if let Some(c) = result["structuredContent"]["_epode"].get("customerContext") {
        return Some(c.clone());
    }
    result["content"].as_array()?.iter().find_map(|b| {
        let v: Value = serde_json::from_str(b["text"].as_str()?).ok()?;
        v["_epode"].get("customerContext").cloned()
    })
}

fn item(key: &str, kind: &str, value: &str, remember: bool) -> Value {
    json!({"key": key, "type": kind, "value": value, "summary": format!("{key} is {value}"),
           "provenance": "agent_reports_user_statement", "confidence": 1, "remember": remember})
}

fn interaction_ids(epode: &FakeEpode) -> Vec<String> {
    epode
        .events()
        .iter()
        .filter_map(|e| e["interactionId"].as_str().map(str::to_owned))
        .collect()
}

/// The journeys of Epode's own end-to-end test (answered and remembered, a second visit,
/// declined and remembered as declined, an unknown key refused by Epode), with a 2026 client
/// and a 2025 client: the tools listed, the contract on the followed tools' results beside
/// `_agentFeedback`, the answer forwarded with only the handle, no telemetry event for a call
/// the enrichment request confirmed and one for a call it does not follow.
#[test]
fn the_reference_journeys_with_both_eras() {
    let rig = rig(&[]);
    for (n, era) in ["pin", "legacy"].into_iter().enumerate() {
        let listed = ts_call(&rig.sc.url(), era, None, &[]);
        let names: Vec<&str> = listed["tools"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["name"].as_str())
            .collect();
        for t in [SHARE, CONSENT, "report_product_feedback", "echo"] {
            assert!(names.contains(&t), "{era}: {names:?}");
        }

        // Answered and remembered.
        let who = format!("household_{n}");
        let r = call(&rig, era, "account", json!({"customer": who}));
        let c = contract(&r).unwrap_or_else(|| panic!("{era}: {r}"));
        assert_eq!(c["state"], "answer_ready", "{c}");
        let handle = c["requestHandle"].as_str().unwrap().to_owned();
        assert!(handle.starts_with("aqr1_"));
        assert!(r["structuredContent"]["_agentFeedback"].is_object(), "{r}");
        let last = r["content"].as_array().unwrap().last().unwrap().clone();
        assert!(
            last["text"]
                .as_str()
                .unwrap()
                .starts_with("Finish the user's product task first."),
            "{last}"
        );
        assert!(
            !r.to_string().contains("ai.epode/identity"),
            "the identity never leaks"
        );
        let stored = rig.epode.enrichment_requests();
        let req = stored.last().unwrap();
        assert_eq!(req.body["operation"], "account");
        assert_eq!(req.body["accountRef"], who.as_str());
        assert_eq!(req.body["surface"], "mcp");
        assert!(
            req.body.get("customerRef").is_none(),
            "never_ask keeps customerRef in"
        );
        let confirmed = req.interaction_id.clone();

        let shared = call(
            &rig,
            era,
            SHARE,
            json!({"requestHandle": handle, "status": "answered",
                   "items": [item("shopping.priority", "preference", "sustainability", true),
                             item("shopping.budget_band", "constraint", "50_150", false)]}),
        );
        assert_eq!(shared["isError"], false, "{shared}");
        assert_eq!(
            shared["structuredContent"]["signals"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
        let answers = rig.epode.requests(Endpoint::EnrichmentAnswers);
        let sent = answers.last().unwrap();
        assert_eq!(
            sent.header("authorization"),
            Some(format!("Bearer {handle}").as_str())
        );
        assert!(!sent.raw_body.contains(DEMO_PRODUCT_KEY));
        // Answered once: a second share says so without writing.
        let again = call(
            &rig,
            era,
            SHARE,
            json!({"requestHandle": handle, "status": "no_relevant_context", "items": []}),
        );
        assert_eq!(
            again["structuredContent"]["alreadyCompleted"], true,
            "{again}"
        );

        // A second visit, then declined (remembered for the account), then declined again.
        let second = call(&rig, era, "account", json!({"customer": who}));
        let h2 = contract(&second).unwrap()["requestHandle"]
            .as_str()
            .unwrap()
            .to_owned();
        let declined = call(
            &rig,
            era,
            CONSENT,
            json!({"requestHandle": h2, "decision": "declined", "remember": true}),
        );
        assert_eq!(
            declined["structuredContent"]["state"], "declined",
            "{declined}"
        );
        let refused = call(
            &rig,
            era,
            SHARE,
            json!({"requestHandle": h2, "status": "answered",
                                                   "items": [item("content.topic_depth", "preference", "practical", true)]}),
        );
        assert_eq!(
            refused["structuredContent"],
            json!({"accepted": false, "state": "declined"})
        );
        let third = call(&rig, era, "account", json!({"customer": who}));
        let c3 = contract(&third).unwrap();
        assert_eq!(c3["state"], "declined", "{c3}");
        assert!(c3.get("requestHandle").is_none(), "{c3}");

        // An unknown key: Epode refuses it, the agent is told.
        let other = call(&rig, era, "echo", json!({"text": "x"}));
        let h4 = contract(&other).unwrap()["requestHandle"]
            .as_str()
            .unwrap()
            .to_owned();
        let bad = call(
            &rig,
            era,
            SHARE,
            json!({"requestHandle": h4, "status": "answered",
                                               "items": [item("creditworthiness", "constraint", "excellent", false)]}),
        );
        assert_eq!(bad["isError"], true, "{bad}");
        assert_eq!(
            bad["structuredContent"]["error"],
            "Unknown customer context catalog key"
        );

        // No relevant context: accepted, nothing stored.
        let other = call(&rig, era, "echo", json!({"text": "z"}));
        let h5 = contract(&other).unwrap()["requestHandle"]
            .as_str()
            .unwrap()
            .to_owned();
        let none = call(
            &rig,
            era,
            SHARE,
            json!({"requestHandle": h5, "status": "no_relevant_context", "items": []}),
        );
        assert_eq!(none["structuredContent"]["accepted"], true, "{none}");
        let stored = rig.epode.enrichment_requests();
        let req = stored.iter().find(|s| s.handle == h5).unwrap();
        assert_eq!(
            (req.state.as_str(), req.items.len()),
            ("no_relevant_context", 0)
        );

        // A tool customer context does not follow records its event; a confirmed call none.
        let add = call(&rig, era, "add", json!({"a": 1, "b": 2}));
        assert!(contract(&add).is_none(), "{add}");
        assert!(
            eventually(Duration::from_secs(10), || interaction_ids(&rig.epode)
                .len()
                > n),
            "{:?}",
            interaction_ids(&rig.epode)
        );
        assert!(
            !interaction_ids(&rig.epode).contains(&confirmed),
            "counted twice"
        );
    }
}

async fn raw_call(
    sc: &Sidecar,
    tool: &str,
    args: Value,
    caps: Value,
    responses: Option<Value>,
) -> Value {
    let mut body = modern_body(
        json!(7),
        "tools/call",
        json!({"name": tool, "arguments": args}),
    );
    body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] = caps;
    if let Some(r) = responses {
        body["params"]["inputResponses"] = r;
    }
    let resp = post_modern(&sc.url(), "tools/call", Some(tool), &body).await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["id"], 7, "{v}");
    v["result"].clone()
}

/// A request still asking permission first (as Epode's older rows do): the share is an MRTR
/// round whose question is a form, only for a client that declared form elicitation; the
/// retry's "this session only" is recorded and the items go interaction-scoped.
#[tokio::test]
async fn the_permission_question_is_an_mrtr_round() {
    let rig = rig(&[]);
    rig.epode.set_consent_first(true);
    let forms = json!({"elicitation": {}});
    let r = raw_call(
        &rig.sc,
        "account",
        json!({"customer": "traveler_7"}),
        json!({}),
        None,
    )
    .await;
    let c = contract(&r).unwrap();
    assert_eq!(c["state"], "consent_required", "{c}");
    assert_eq!(c["permissionMode"], "best_effort_mcp_elicitation");
    let handle = c["requestHandle"].as_str().unwrap().to_owned();
    let args = json!({"requestHandle": handle, "status": "answered",
                      "items": [item("travel.stay_style", "preference", "boutique", true)]});

    let unsupported = raw_call(
        &rig.sc,
        SHARE,
        args.clone(),
        json!({"elicitation": {"url": {}}}),
        None,
    )
    .await;
    assert_eq!(
        unsupported["structuredContent"]["state"], "unsupported",
        "{unsupported}"
    );
    let asked = raw_call(&rig.sc, SHARE, args.clone(), forms.clone(), None).await;
    assert_eq!(asked["resultType"], "input_required", "{asked}");
    let q = &asked["inputRequests"]["customer_context_permission"];
    assert_eq!(q["method"], "elicitation/create");
    assert_eq!(q["params"]["mode"], "form");
    assert!(
        rig.epode.requests(Endpoint::EnrichmentConsent).is_empty(),
        "nothing recorded yet"
    );

    let answer = json!({"customer_context_permission": {"action": "accept", "content": {"choice": "this_session_only"}}});
    let done = raw_call(&rig.sc, SHARE, args, forms, Some(answer)).await;
    assert_eq!(done["isError"], false, "{done}");
    let consent = rig.epode.requests(Endpoint::EnrichmentConsent);
    assert_eq!(
        consent.last().unwrap().body,
        json!({"decision": "approved", "remember": false})
    );
    let stored = rig.epode.enrichment_requests();
    let items = &stored.iter().find(|s| s.handle == handle).unwrap().items;
    assert_eq!(items[0]["remember"], false, "this session only: {items:?}");
}

/// Epode slow past the budget, down, or refusing: the product's result is the upstream's,
/// on time, and counted; the call's telemetry event is recorded as for any call.
#[tokio::test]
async fn epode_slow_or_down_leaves_the_result_as_it_came() {
    let rig = rig(&[("EPODE_SIDECAR_CUSTOMER_CONTEXT_BUDGET", "250ms")]);
    let plain = {
        let r = raw_call(&rig.sc, "echo", json!({"text": "y"}), json!({}), None).await;
        assert!(contract(&r).is_some(), "{r}");
        r
    };
    // What the upstream said: the first block and structuredContent less the bindings' own.
    let product = |r: &Value| {
        let mut s = r["structuredContent"].clone();
        if let Some(o) = s.as_object_mut() {
            o.remove("_agentFeedback");
            o.remove("_epode");
        }
        (r["content"][0].clone(), s)
    };
    let expected = product(&plain);
    rig.epode
        .inject(Endpoint::Enrichment, Fault::Delay(Duration::from_secs(3)));
    let t = Instant::now();
    let late = raw_call(&rig.sc, "echo", json!({"text": "y"}), json!({}), None).await;
    let took = t.elapsed();
    assert!(contract(&late).is_none(), "{late}");
    assert!(
        took < Duration::from_millis(2000),
        "waited {took:?} past a 250 ms budget"
    );
    assert!(
        late["structuredContent"]["_agentFeedback"].is_object(),
        "feedback unchanged"
    );
    let late_id = rig
        .epode
        .enrichment_requests()
        .last()
        .unwrap()
        .interaction_id
        .clone();

    rig.epode.inject(Endpoint::Enrichment, Fault::Status(500));
    let refused = raw_call(&rig.sc, "echo", json!({"text": "y"}), json!({}), None).await;
    assert!(contract(&refused).is_none(), "{refused}");
    rig.epode.set_down(true);
    let down = raw_call(&rig.sc, "echo", json!({"text": "y"}), json!({}), None).await;
    assert!(contract(&down).is_none(), "{down}");
    for r in [&late, &refused, &down] {
        assert_eq!(product(r), expected, "{r}");
        let texts = r["content"].as_array().unwrap().len();
        assert_eq!(texts, plain["content"].as_array().unwrap().len() - 1, "{r}");
    }
    rig.epode.set_down(false);
    let metrics = metrics_text(&rig.sc).await;
    for outcome in ["placed", "late", "refused", "unreachable"] {
        let line =
            format!("epode_sidecar_customer_context_requests_total{{outcome=\"{outcome}\"}} 1");
        assert!(metrics.contains(&line), "{line}\n{metrics}");
    }
    // The late call's event is recorded (Epode did not confirm it in time).
    assert!(
        eventually(Duration::from_secs(10), || interaction_ids(&rig.epode)
            .contains(&late_id)),
        "{:?}",
        interaction_ids(&rig.epode)
    );
}

/// Arguments the tool cannot send are refused here, naming the argument; nothing reaches
/// Epode, and the product key never does on an agent's call.
#[tokio::test]
async fn a_share_that_cannot_be_sent_is_refused_here() {
    let rig = rig(&[]);
    for args in [
        json!({"requestHandle": "afr2_x", "status": "answered", "items": []}),
        json!({"requestHandle": "aqr1_x", "status": "answered", "items": [item("a.b", "preference", "me@example.com", false)]}),
        json!({"requestHandle": "aqr1_x", "status": "answered", "items": (0..9).map(|i| item(&format!("k{i}"), "preference", "v", false)).collect::<Vec<_>>()}),
    ] {
        let r = raw_call(&rig.sc, SHARE, args.clone(), json!({}), None).await;
        assert_eq!(r["isError"], true, "{args}: {r}");
        assert!(
            r["content"][0]["text"]
                .as_str()
                .unwrap()
                .starts_with("Input validation error"),
            "{r}"
        );
    }
    assert!(rig.epode.requests(Endpoint::EnrichmentInspect).is_empty());
    let r = raw_call(
        &rig.sc,
        SHARE,
        json!({"requestHandle": "aqr1_unknown", "status": "no_relevant_context", "items": []}),
        json!({}),
        None,
    )
    .await;
    assert_eq!(r["isError"], true, "{r}");
    assert_eq!(
        r["content"][0]["text"],
        "The customer-context request could not be verified. Do not share context."
    );
    for seen in rig.epode.all_requests() {
        if seen.endpoint != Endpoint::Enrichment && seen.endpoint != Endpoint::Telemetry {
            assert!(
                !seen
                    .header("authorization")
                    .unwrap_or_default()
                    .contains(DEMO_PRODUCT_KEY),
                "{seen:?}"
            );
        }
    }
}

/// The official Python client as a 2025 client (`legacy`), its elicitation callback choosing
/// `choice`: what its `share_customer_context` call printed.
fn py_legacy_share(sc: &Sidecar, args: &Value, choice: Option<&str>) -> Value {
    let mut cmd = std::process::Command::new(python());
    cmd.arg(repo_root().join("tests/peers/py_asked.py"))
        .args([sc.url().as_str(), SHARE, "--mode", "legacy", "--args"])
        .arg(args.to_string());
    match choice {
        Some(c) => cmd.args(["--string", c]),
        None => cmd.arg("--decline"),
    };
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim().lines().last().unwrap_or_default())
        .unwrap_or_else(|_| panic!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr)))
}

/// A 2025 client is asked the permission question on its call's stream (a server request, as
/// 2025 servers ask), its answer recorded as a 2026 client's is; declining records "declined".
#[test]
fn a_2025_client_is_asked_on_its_stream() {
    let rig = rig(&[]);
    rig.epode.set_consent_first(true);
    let handle = |customer: &str| {
        let r = call(&rig, "legacy", "account", json!({"customer": customer}));
        contract(&r).unwrap()["requestHandle"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let h = handle("household_9");
    let args = json!({"requestHandle": h, "status": "answered",
                      "items": [item("shopping.priority", "preference", "quality", true)]});
    let out = py_legacy_share(&rig.sc, &args, Some("always_allow"));
    assert_eq!(out["asked"], json!(["elicitation/create"]), "{out}");
    assert_eq!(out["isError"], false, "{out}");
    assert!(
        out["text"]
            .as_str()
            .unwrap()
            .starts_with("Customer context was accepted"),
        "{out}"
    );
    let consent = rig.epode.requests(Endpoint::EnrichmentConsent);
    assert_eq!(
        consent.last().unwrap().body,
        json!({"decision": "approved", "remember": true})
    );
    let stored = rig.epode.enrichment_requests();
    assert_eq!(
        stored.iter().find(|s| s.handle == h).unwrap().items[0]["remember"],
        true
    );

    let h2 = handle("household_10");
    let args = json!({"requestHandle": h2, "status": "answered",
                      "items": [item("shopping.priority", "preference", "quality", true)]});
    let out = py_legacy_share(&rig.sc, &args, None);
    assert_eq!(out["isError"], false, "{out}");
    assert!(
        out["text"]
            .as_str()
            .unwrap()
            .starts_with("The customer chose not to allow"),
        "{out}"
    );
    assert_eq!(
        rig.epode
            .requests(Endpoint::EnrichmentConsent)
            .last()
            .unwrap()
            .body,
        json!({"decision": "declined"})
    );
    assert!(rig
        .epode
        .requests(Endpoint::EnrichmentAnswers)
        .iter()
        .all(|a| !a.raw_body.contains(&h2)));
}

/// A product call a 2026 upstream answers with its own questions, asked of a 2025 client on
/// its call's stream (the mirror): the call's final result carries the contract too.
#[test]
fn a_call_asked_through_the_mirror_carries_the_contract() {
    let up = Upstream::start(UpstreamKind::TypeScript);
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let sc = feedback_sidecar(
        &up.url(),
        &epode,
        "never_ask",
        &[
            ("EPODE_SIDECAR_CUSTOMER_CONTEXT", "on"),
            ("EPODE_SIDECAR_CUSTOMER_CONTEXT_TOOLS", "deploy"),
        ],
    );
    let out = std::process::Command::new("node")
        .arg(peers_dir().join("ts/ts_call.mjs"))
        .args([
            sc.url().as_str(),
            "legacy",
            "call",
            "deploy",
            r#"{"env":"prod"}"#,
        ])
        .args(["--answer", "1"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let got: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|_| panic!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(got["era"], "legacy", "{got}");
    let result = &got["result"];
    let text = result["content"][0]["text"].as_str().unwrap_or_default();
    assert!(text.starts_with("deployed to prod"), "{got}");
    let c = contract(result).unwrap_or_else(|| panic!("no contract: {got}"));
    assert_eq!(c["state"], "answer_ready", "{c}");
    assert_eq!(epode.enrichment_requests().len(), 1);
}

/// A tool name Epode would refuse as an operation (here 300 bytes) is never followed: no
/// enrichment request carries it, and its result goes as it came.
#[tokio::test]
async fn a_name_epode_would_refuse_is_not_followed() {
    use crate::support::scripted::{Reply, ScriptedUpstream};
    let long = format!("search_{}", "x".repeat(300));
    let up = ScriptedUpstream::new()
        .on(
            "tools/list",
            Reply::result(json!({"tools": [{"name": long, "inputSchema": {"type": "object"}},
                                           {"name": "search_ok", "inputSchema": {"type": "object"}}]})),
        )
        .on(
            "tools/call",
            Reply::result(json!({"resultType": "complete", "content": [{"type": "text", "text": "done"}]})),
        )
        .start();
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let sc = feedback_sidecar(
        &up.url(),
        &epode,
        "never_ask",
        &[
            ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28"),
            ("EPODE_SIDECAR_CUSTOMER_CONTEXT", "on"),
            ("EPODE_SIDECAR_CUSTOMER_CONTEXT_TOOLS", "search_*"),
        ],
    );
    let r = raw_call(&sc, &long, json!({}), json!({}), None).await;
    assert!(contract(&r).is_none(), "{r}");
    assert!(epode.requests(Endpoint::Enrichment).is_empty());
    // A name Epode takes, through the same pattern, is followed.
    let ok = raw_call(&sc, "search_ok", json!({}), json!({}), None).await;
    assert!(contract(&ok).is_some(), "{ok}");
}
