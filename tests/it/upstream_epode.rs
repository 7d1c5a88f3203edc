//! An upstream that carries Epode itself (`EPODE_SIDECAR_UPSTREAM_EPODE`): a real `mcp`
//! 2.3.0 server (`tests/peers/epode_carrier.py`) that advertises `ai.epode/agent-feedback`
//! through the SDK's extension mechanism, as Epode's Python SDK does, or that lists Epode's
//! tools and decorates its results, as Epode's Node binding does. The sidecar steps back: no
//! event of its own, no second `_agentFeedback`, no feedback tools beside the upstream's;
//! said in the log and in `epode_sidecar_upstream_epode`. With Epode's own Python SDK in the
//! server (an acceptance run: the SDK is on no registry), each call is one event at Epode.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::fake_epode::{FakeConfig, FakeEpode, DEMO_PRODUCT_KEY};
use crate::support::{
    eventually, feedback_sidecar, get_blocking, last_message, modern_body, post_modern, Sidecar,
    Upstream, UpstreamKind,
};

const EPODE: &str = "ai.epode/agent-feedback";

/// A 2026 request of `method` (naming `name`) with `params`: its answer's message.
async fn ask(sc: &Sidecar, id: u64, method: &str, name: Option<&str>, params: Value) -> Value {
    let body = modern_body(json!(id), method, params);
    let resp = post_modern(&sc.url(), method, name, &body).await;
    let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
    last_message(&ct, &resp.text().await.unwrap())
}

async fn lookup(sc: &Sidecar, id: u64) -> Value {
    let msg = ask(
        sc,
        id,
        "tools/call",
        Some("lookup"),
        json!({"name": "lookup", "arguments": {"q": format!("item {id}")}}),
    )
    .await;
    assert_eq!(
        msg["result"]["content"][0]["text"],
        format!("found item {id}"),
        "{msg}"
    );
    msg
}

fn tool_names(list: &Value) -> Vec<String> {
    list["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{list}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The gauge's value for `carries`.
fn carries(sc: &Sidecar, what: &str) -> bool {
    let metrics = get_blocking(sc.addr, "/metrics");
    metrics.contains(&format!(
        "epode_sidecar_upstream_epode{{carries=\"{what}\"}} 1"
    ))
}

/// Nothing of the sidecar's own reaches Epode in a while.
async fn no_events(epode: &FakeEpode) {
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(epode.events().is_empty(), "{:?}", epode.events());
}

#[tokio::test]
async fn an_upstream_that_records_its_own_telemetry_is_counted_once() {
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let up = Upstream::start_with(UpstreamKind::EpodeCarrier, &["--carries", "telemetry"]);
    let sc = feedback_sidecar(&up.url(), &epode, "never_ask", &[]);
    for id in 1..=3 {
        let msg = lookup(&sc, id).await;
        assert!(!msg.to_string().contains("_agentFeedback"), "{msg}");
    }
    no_events(&epode).await;
    // The upstream's own advertisement, its own tools only, no feedback rule.
    let list = ask(&sc, 4, "tools/list", None, json!({})).await;
    assert_eq!(tool_names(&list), ["lookup"], "{list}");
    let discover = ask(&sc, 5, "server/discover", None, json!({})).await;
    assert_eq!(
        discover["result"]["capabilities"]["extensions"][EPODE],
        json!({})
    );
    assert!(
        discover["result"].get("instructions").is_none(),
        "{discover}"
    );
    assert!(carries(&sc, "telemetry") && !carries(&sc, "nothing"));
    let said = eventually(Duration::from_secs(5), || {
        sc.logs()
            .iter()
            .any(|l| l.contains("the upstream carries Epode itself") && l.contains("telemetry"))
    });
    assert!(said, "{:?}", sc.logs());
}

#[tokio::test]
async fn an_upstream_that_binds_epode_itself_keeps_its_tools_and_its_decoration() {
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let up = Upstream::start_with(UpstreamKind::EpodeCarrier, &["--carries", "binding"]);
    let sc = feedback_sidecar(&up.url(), &epode, "never_ask", &[]);
    let list = ask(&sc, 1, "tools/list", None, json!({})).await;
    assert_eq!(
        tool_names(&list),
        ["lookup", "report_product_feedback"],
        "the upstream's report tool, once, and none of the sidecar's: {list}"
    );
    let msg = lookup(&sc, 2).await;
    let text = msg.to_string();
    assert_eq!(text.matches("_agentFeedback").count(), 1, "{text}");
    assert_eq!(msg["result"]["structuredContent"]["_agentFeedback"]["v"], 1);
    // The report goes to the upstream's own tool.
    let report = ask(
        &sc,
        3,
        "tools/call",
        Some("report_product_feedback"),
        json!({"name": "report_product_feedback",
               "arguments": {"feedbackHandle": "h", "summary": "worked well"}}),
    )
    .await;
    assert_eq!(
        report["result"]["content"][0]["text"], "report accepted",
        "{report}"
    );
    no_events(&epode).await;
    assert!(carries(&sc, "binding"));
}

/// `none`: the sidecar binds whatever the upstream says, but a result that already carries
/// `_agentFeedback` is still neither decorated again nor counted.
#[tokio::test]
async fn told_the_upstream_carries_none_the_sidecar_binds_but_never_decorates_twice() {
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let up = Upstream::start_with(UpstreamKind::EpodeCarrier, &["--carries", "binding"]);
    let sc = feedback_sidecar(
        &up.url(),
        &epode,
        "never_ask",
        &[("EPODE_SIDECAR_UPSTREAM_EPODE", "none")],
    );
    let list = ask(&sc, 1, "tools/list", None, json!({})).await;
    assert_eq!(
        tool_names(&list),
        [
            "lookup",
            "record_product_feedback_consent",
            "report_product_feedback"
        ],
        "{list}"
    );
    let msg = lookup(&sc, 2).await;
    assert_eq!(
        msg.to_string().matches("_agentFeedback").count(),
        1,
        "{msg}"
    );
    no_events(&epode).await;
    assert!(carries(&sc, "nothing"));
}

/// Acceptance with Epode's own Python SDK (`sdk/python` of open-software-network/
/// os-agent-feedback at the pinned commit, on no registry):
/// `EPODE_PY_SDK=<repo>/sdk/python/src cargo test --test it -- --ignored upstream_epode`.
/// Three product calls are three confirmed events at Epode (the last landed binary: six).
#[tokio::test]
#[ignore = "needs Epode's Python SDK source: EPODE_PY_SDK=<os-agent-feedback>/sdk/python/src"]
async fn epodes_own_python_sdk_behind_the_sidecar_counts_each_call_once() {
    let sdk = std::env::var("EPODE_PY_SDK").expect("EPODE_PY_SDK");
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let url = epode.url();
    let up = Upstream::start_with(
        UpstreamKind::EpodeCarrier,
        &[
            "--carries",
            "telemetry",
            "--sdk",
            &sdk,
            "--epode",
            &url,
            "--key",
            epode.product_key(),
        ],
    );
    let sc = feedback_sidecar(&up.url(), &epode, "never_ask", &[]);
    for id in 1..=3 {
        let msg = lookup(&sc, id).await;
        assert!(!msg.to_string().contains("_agentFeedback"), "{msg}");
    }
    let three = eventually(Duration::from_secs(10), || epode.events().len() >= 3);
    assert!(three, "{:?}", epode.events());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let events = epode.events();
    assert_eq!(events.len(), 3, "{events:?}");
    for e in &events {
        assert_eq!(e["operation"], "lookup", "{e}");
        assert_eq!(e["classification"], "confirmed", "{e}");
    }
    assert!(carries(&sc, "telemetry"));
}
