//! Rate limits (governor): per client address, with `X-Forwarded-For` believed only from the
//! trusted proxies, and per tool, where an agent gets a tool result it can act on.

use std::time::Duration;

use crate::support::*;
use serde_json::{json, Value};

/// A 2026 upstream: `tools/list` names `search` and `export_csv`; every call succeeds.
fn listing_upstream() -> Scripted {
    ScriptedUpstream::new()
        .on(
            "tools/list",
            Reply::result(json!({"tools": [{"name": "search", "inputSchema": {"type": "object"}},
                                             {"name": "export_csv", "inputSchema": {"type": "object"}}]})),
        )
        .otherwise(Reply::result(json!({"content": [{"type": "text", "text": "done"}]})))
        .start()
}

async fn list(sc: &Sidecar, forwarded_for: Option<&str>) -> reqwest::Response {
    let body = modern_body(json!(1), "tools/list", json!({}));
    let mut req = http().post(sc.url()).body(body.to_string());
    for (k, v) in modern_headers("tools/list", None) {
        req = req.header(k, v);
    }
    if let Some(f) = forwarded_for {
        req = req.header("x-forwarded-for", f);
    }
    req.send().await.unwrap()
}

async fn call(sc: &Sidecar, tool: &str) -> Value {
    let body = modern_body(
        json!(tool),
        "tools/call",
        json!({"name": tool, "arguments": {}}),
    );
    let resp = post_modern(&sc.url(), "tools/call", Some(tool), &body).await;
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

#[tokio::test]
async fn a_client_over_its_limit_gets_429_with_retry_after() {
    let up = listing_upstream();
    let sc = Sidecar::start(
        &up.url(),
        &[
            ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28"),
            ("EPODE_SIDECAR_RATE_LIMIT", "2/s"),
            ("EPODE_SIDECAR_RATE_BURST", "3"),
        ],
    );
    for _ in 0..3 {
        assert_eq!(list(&sc, None).await.status(), 200);
    }
    let refused = list(&sc, None).await;
    assert_eq!(refused.status(), 429);
    let wait: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=2).contains(&wait), "{wait}");
    let v: Value = refused.json().await.unwrap();
    assert_eq!(v["jsonrpc"], "2.0");
    assert_eq!(v["error"]["code"], -32000);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("rate limit"),
        "{v}"
    );
    // The scenario: the client waits as long as Retry-After said (the bucket refills).
    tokio::time::sleep(Duration::from_secs(wait)).await;
    assert_eq!(
        list(&sc, None).await.status(),
        200,
        "served again after Retry-After"
    );
}

#[tokio::test]
async fn forwarded_for_is_believed_only_from_trusted_proxies() {
    let up = listing_upstream();
    let base = [
        ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28"),
        ("EPODE_SIDECAR_RATE_LIMIT", "2/m"),
    ];
    // Not trusted: the header is ignored, every request is the loopback peer's.
    let sc = Sidecar::start(&up.url(), &base);
    assert_eq!(list(&sc, Some("203.0.113.1")).await.status(), 200);
    assert_eq!(list(&sc, Some("203.0.113.2")).await.status(), 200);
    assert_eq!(list(&sc, Some("203.0.113.3")).await.status(), 429);
    // Trusted: each forwarded client has its own limit.
    let mut env = base.to_vec();
    env.push(("EPODE_SIDECAR_TRUSTED_PROXIES", "127.0.0.1/32"));
    let sc = Sidecar::start(&up.url(), &env);
    for client in ["203.0.113.1", "203.0.113.2", "198.51.100.7, 203.0.113.3"] {
        assert_eq!(list(&sc, Some(client)).await.status(), 200, "{client}");
        assert_eq!(list(&sc, Some(client)).await.status(), 200, "{client}");
        assert_eq!(list(&sc, Some(client)).await.status(), 429, "{client}");
    }
}

#[tokio::test]
async fn a_tool_over_its_limit_answers_a_result_the_agent_can_act_on() {
    let up = listing_upstream();
    let sc = Sidecar::start(
        &up.url(),
        &[
            ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28"),
            (
                "EPODE_SIDECAR_TOOL_RATE_LIMITS",
                "export_*=1/m, search=100/s",
            ),
        ],
    );
    let first = call(&sc, "export_csv").await;
    assert!(first["result"].get("isError").is_none(), "{first}");
    let second = call(&sc, "export_csv").await;
    let r = &second["result"];
    assert_eq!(r["isError"], true, "{second}");
    let text = r["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("rate limit") && text.contains("Retry this call after"),
        "{text}"
    );
    assert_eq!(second["id"], "export_csv");
    for _ in 0..5 {
        let ok = call(&sc, "search").await;
        assert!(
            ok["result"].get("isError").is_none(),
            "another tool is not limited: {ok}"
        );
    }
}

/// Sends `count` requests, 8 at a time, the `i`th from the client address `client(i)` through
/// the trusted proxy; every one must be served. Returns the sidecar's CPU time per request.
async fn cpu_per_request(sc: &Sidecar, count: u32, client: impl Fn(u32) -> String) -> Duration {
    let http = http();
    let body = modern_body(json!(1), "tools/list", json!({})).to_string();
    let before = cpu_ms(sc.pid());
    let mut next = 0;
    while next < count {
        let batch: Vec<_> = (next..(next + 8).min(count))
            .map(|i| {
                let mut req = http.post(sc.url()).body(body.clone());
                for (k, v) in modern_headers("tools/list", None) {
                    req = req.header(k, v);
                }
                req.header("x-forwarded-for", client(i)).send()
            })
            .collect();
        for r in futures_util::future::join_all(batch).await {
            assert_eq!(r.unwrap().status(), 200);
        }
        next += 8;
    }
    Duration::from_millis(cpu_ms(sc.pid()) - before) / count
}

/// Behind a trusted proxy, 12,000 distinct client addresses against a table of 2,000: the
/// table stays at its bound (the least recently seen client is evicted) and a request costs
/// about what it costs from one client. (The earlier limiter rescanned its whole table on every
/// request once past its bound: CPU per request ×245 at 100,000 clients.)
#[tokio::test]
async fn many_client_addresses_keep_the_table_bounded_and_each_request_cheap() {
    let up = listing_upstream();
    let sc = Sidecar::start(
        &up.url(),
        &[
            ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28"),
            ("EPODE_SIDECAR_TRUSTED_PROXIES", "127.0.0.1"),
            // Never refused, and every client stays live for two minutes.
            ("EPODE_SIDECAR_RATE_LIMIT", "1/m"),
            ("EPODE_SIDECAR_RATE_BURST", "100000000"),
            ("EPODE_SIDECAR_RATE_LIMIT_CLIENTS", "2000"),
            ("EPODE_SIDECAR_LOG", "warn"),
        ],
    );
    let address = |i: u32| std::net::Ipv4Addr::from(0x0b00_0000 + i).to_string();
    cpu_per_request(&sc, 200, |_| address(0)).await;
    let one = cpu_per_request(&sc, 3000, |_| address(0)).await;
    let many = cpu_per_request(&sc, 12_000, |i| address(1 + i)).await;
    let metrics = metrics_text(&sc).await;
    let tracked = metric_value(&metrics, "epode_sidecar_rate_limit_clients ");
    assert_eq!(tracked, 2000, "{metrics}");
    assert!(
        many < one * 3 + Duration::from_micros(100),
        "{many:?} CPU per request from 12,000 clients, {one:?} from one"
    );
}
