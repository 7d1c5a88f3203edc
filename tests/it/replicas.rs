//! Held calls on any replica: three sidecar processes on loopback with one product key, each
//! with its own `EPODE_SIDECAR_REPLICA_URL`, in front of one FastMCP 4.1.6 server spoken to in
//! 2025-11-25. A 2026 client's first round on one replica and its retry on another completes
//! (the retry forwarded to the replica holding the call, the caller checked again there, the
//! call decorated and counted once); a retry from another caller is refused by the owner; with
//! the owner stopped, a retry on the third replica is told to start again within a second.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::fake_epode::{FakeConfig, FakeEpode, DEMO_PRODUCT_KEY};
use crate::support::{
    eventually_async, feedback_sidecar, free_port, get_blocking, http, last_message, metric_value,
    modern_headers, Sidecar, Upstream, UpstreamKind,
};

/// A replica: its own port, and its URL for the others.
fn replica(upstream: &str, epode: &FakeEpode) -> Sidecar {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let url = format!("http://127.0.0.1:{port}/mcp");
    feedback_sidecar(
        upstream,
        epode,
        "never_ask",
        &[
            ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2025-11-25"),
            ("EPODE_SIDECAR_LISTEN", &listen),
            ("EPODE_SIDECAR_REPLICA_URL", &url),
        ],
    )
}

/// FastMCP's `party` as a 2026 client calls it, elicitation declared.
fn party(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": "party", "arguments": {},
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
            "io.modelcontextprotocol/clientInfo": {"name": "replicas-tests", "version": "0"}
        }
    }})
}

/// `party`'s retry under `id` with the answer to the one question `asked` asked.
fn retry(id: u64, asked: &Value, people: u64) -> Value {
    let r = &asked["result"];
    let key = r["inputRequests"]
        .as_object()
        .and_then(|q| q.keys().next())
        .unwrap_or_else(|| panic!("{asked}"))
        .clone();
    let mut again = party(id);
    again["params"]["inputResponses"] =
        json!({key: {"action": "accept", "content": {"value": people}}});
    again["params"]["requestState"] = r["requestState"].clone();
    again
}

/// Posts `body` to `sc` with `headers` besides the 2026 ones: the last message of its answer.
async fn post(sc: &Sidecar, body: &Value, headers: &[(&str, &str)]) -> Value {
    let mut req = http().post(sc.url()).body(body.to_string());
    for (k, v) in modern_headers("tools/call", Some("party")) {
        req = req.header(k, v);
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
    last_message(&ct, &resp.text().await.unwrap())
}

fn asked(msg: &Value) {
    assert_eq!(msg["result"]["resultType"], "input_required", "{msg}");
}

const ALICE: &[(&str, &str)] = &[("authorization", "Bearer alice")];

/// Retries `sc` forwarded with `outcome` (none yet: 0).
fn forwarded(sc: &Sidecar, outcome: &str) -> u64 {
    let text = get_blocking(sc.addr, "/metrics");
    let name = format!("epode_sidecar_held_call_forwarded_total{{outcome=\"{outcome}\"}}");
    if text.contains(&name) {
        metric_value(&text, &name)
    } else {
        0
    }
}

#[tokio::test]
async fn a_held_calls_retry_completes_on_any_replica_and_is_refused_in_time_once_its_owner_is_gone()
{
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let up = Upstream::start(UpstreamKind::FastMcp);
    let mut a = replica(&up.url(), &epode);
    let b = replica(&up.url(), &epode);
    let c = replica(&up.url(), &epode);

    // The first round on A, the retry on B: answered by A's held call, decorated once. A
    // client's own Epode-Sidecar-Forwarded (not sealed by the deployment) changes nothing.
    let first = post(&a, &party(1), &[]).await;
    asked(&first);
    let forged = [("epode-sidecar-forwarded", "AAAAAAAAAAB_AAAB.AAAA")];
    let done = post(&b, &retry(2, &first, 7), &forged).await;
    assert_eq!(done["id"], 2, "{done}");
    assert_eq!(done["result"]["resultType"], "complete", "{done}");
    assert_eq!(
        done["result"]["content"][0]["text"], "party for 7",
        "{done}"
    );
    let text = done.to_string();
    assert_eq!(text.matches("_agentFeedback").count(), 1, "{text}");
    let one = eventually_async(Duration::from_secs(10), || {
        std::future::ready(!epode.events().is_empty())
    })
    .await;
    assert!(one, "no event for the call");
    assert_eq!(forwarded(&b, "answered"), 1);
    assert_eq!(forwarded(&a, "answered") + forwarded(&c, "answered"), 0);

    // The owner checks the caller: a retry of alice's call from mallory, through C, is
    // refused by A, and alice's own retry through C completes.
    let alice = post(&a, &party(3), ALICE).await;
    asked(&alice);
    let msg = post(
        &c,
        &retry(4, &alice, 3),
        &[("authorization", "Bearer mallory")],
    )
    .await;
    let why = msg["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{msg}"));
    assert!(why.contains("another caller"), "{msg}");
    let msg = post(&c, &retry(5, &alice, 3), ALICE).await;
    assert_eq!(msg["result"]["content"][0]["text"], "party for 3", "{msg}");
    // Each call counted once, at the replica that held it.
    let two = eventually_async(Duration::from_secs(10), || {
        std::future::ready(epode.events().len() >= 2)
    })
    .await;
    assert!(two, "{:?}", epode.events());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(epode.events().len(), 2, "{:?}", epode.events());

    // The owner stopped: the retry on C is told to start again, within a second.
    let held = post(&a, &party(6), &[]).await;
    asked(&held);
    a.terminate();
    assert!(
        a.wait_exit(Duration::from_secs(30)).is_some(),
        "A did not stop"
    );
    let started = Instant::now();
    let msg = post(&c, &retry(7, &held, 5), &[]).await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(1), "{took:?}: {msg}");
    assert_eq!(msg["id"], 7, "{msg}");
    assert_eq!(msg["error"]["code"], -32602, "{msg}");
    let why = msg["error"]["message"].as_str().unwrap_or_default();
    assert!(
        why.contains("cannot be reached") && why.contains("start the call again"),
        "{msg}"
    );
    assert_eq!(forwarded(&c, "owner_gone"), 1);
}

/// A retry that reaches another replica is refused as before when replicas have no URL; a
/// URL is refused without the product key that seals it, and unexpanded.
#[test]
fn a_replica_url_needs_the_product_key_and_an_address() {
    let bin = env!("CARGO_BIN_EXE_epode-sidecar");
    for (env, says) in [
        (
            vec![("EPODE_SIDECAR_REPLICA_URL", "http://10.0.0.1:8080/mcp")],
            "EPODE_API_KEY",
        ),
        (
            vec![
                ("EPODE_SIDECAR_REPLICA_URL", "http://$(POD_IP):8080/mcp"),
                ("EPODE_API_KEY", DEMO_PRODUCT_KEY),
            ],
            "POD_IP",
        ),
    ] {
        let out = std::process::Command::new(bin)
            .env_clear()
            .env("EPODE_SIDECAR_UPSTREAM", "http://127.0.0.1:9/mcp")
            .env("AGENT_FEEDBACK_MODE", "off")
            .envs(env)
            .arg("--check-config")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(
            err.contains("EPODE_SIDECAR_REPLICA_URL") && err.contains(says),
            "{err}"
        );
    }
}
