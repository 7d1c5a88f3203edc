//! A bounded soak: minutes of mixed traffic through every path (pass-through, decorated product
//! calls, the feedback tools, refusals and errors) against the real Python upstream and the
//! strict fake Epode. Memory and open descriptors must stay flat and nothing may fail. Its
//! figures are printed and kept in `target/soak.txt`. `EPODE_SOAK_SECS` sets the length: 10 s
//! by default (a `cargo test` stays short), longer where it is asked for (`.ci/run` asks 60 s).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::fake_epode::{FakeConfig, FakeEpode, DEMO_PRODUCT_KEY};
use crate::support::*;
use serde_json::{json, Value};

async fn send(
    client: &reqwest::Client,
    url: &str,
    method: &str,
    name: Option<&str>,
    body: &Value,
) -> (u16, Value) {
    let mut req = client.post(url).body(body.to_string());
    for (k, v) in modern_headers(method, name) {
        req = req.header(k, v);
    }
    let resp = req.send().await.expect("the sidecar answers");
    let status = resp.status().as_u16();
    let ct = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let text = resp.text().await.unwrap();
    (
        status,
        if text.is_empty() {
            Value::Null
        } else {
            last_message(&ct, &text)
        },
    )
}

/// One round of every path; returns how many requests it made.
async fn round(client: &reqwest::Client, sc: &str, i: u64) -> u64 {
    let (s, v) = send(
        client,
        sc,
        "tools/list",
        None,
        &modern_body(json!(i), "tools/list", json!({})),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = send(
        client,
        sc,
        "prompts/list",
        None,
        &modern_body(json!(i), "prompts/list", json!({})),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = send(
        client,
        sc,
        "tools/call",
        Some("echo"),
        &modern_body(
            json!(i),
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "soak"}}),
        ),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let handle = v["result"]["structuredContent"]["_agentFeedback"]["feedbackHandle"]
        .as_str()
        .expect("decorated")
        .to_owned();
    let report = json!({"name": "report_product_feedback", "arguments": {"feedbackHandle": handle, "summary": "Soak round went fine."}});
    let (s, v) = send(
        client,
        sc,
        "tools/call",
        Some("report_product_feedback"),
        &modern_body(json!(i), "tools/call", report),
    )
    .await;
    assert_eq!(
        (s, v["result"]["structuredContent"]["accepted"].clone()),
        (200, json!(true)),
        "{v}"
    );
    let (s, _) = send(
        client,
        sc,
        "nope/x",
        None,
        &modern_body(json!(i), "nope/x", json!({})),
    )
    .await;
    assert!(s == 404 || s == 200, "{s}");
    let resp = client
        .post(sc)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let (s, v) = send(
        client,
        sc,
        "tools/call",
        Some("invented"),
        &modern_body(
            json!(i),
            "tools/call",
            json!({"name": "invented", "arguments": {}}),
        ),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    7
}

/// Waits until nothing is left of a load: no request in flight, no telemetry queued or in
/// delivery, no client connection but the one asking. Whether that happened within 30 s.
async fn drained(sc: &Sidecar) -> bool {
    eventually_async(Duration::from_secs(30), || async {
        let Ok(resp) = http().get(format!("{}/metrics", sc.base())).send().await else {
            return false;
        };
        let text = resp.text().await.unwrap_or_default();
        metric_value(&text, "epode_sidecar_in_flight_requests") == 0
            && metric_value(&text, "epode_sidecar_telemetry_queue_depth") == 0
            && metric_value(&text, "epode_sidecar_open_connections") <= 1
    })
    .await
}

#[tokio::test]
async fn soak_through_every_path() {
    let secs: u64 = std::env::var("EPODE_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    // About six samples whatever the length, one every 10 s at most.
    let every = Duration::from_secs(secs.div_ceil(6).clamp(1, 10));
    let up = Upstream::start(UpstreamKind::PythonJson);
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let sc = feedback_sidecar(
        &up.url(),
        &epode,
        "never_ask",
        &[("EPODE_SIDECAR_LOG", "warn")],
    );
    let url = sc.url();
    let done = Arc::new(AtomicU64::new(0));
    // Warm up, then measure from a steady state.
    let client = http();
    for i in 0..20 {
        round(&client, &url, i).await;
    }
    drop(client);
    assert!(drained(&sc).await, "the warm-up never drained");
    let (rss0, fds0) = (rss_kib(sc.pid()), open_fds(sc.pid()));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(secs);
    let mut samples = Vec::new();
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (url, done) = (url.clone(), done.clone());
            tokio::spawn(async move {
                let client = http();
                let mut i = w * 1_000_000;
                while Instant::now() < deadline {
                    done.fetch_add(round(&client, &url, i).await, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    while Instant::now() < deadline {
        // The scenario: a sample every `every` while the load runs.
        tokio::time::sleep(every.min(deadline - Instant::now())).await;
        samples.push((
            started.elapsed().as_secs(),
            rss_kib(sc.pid()),
            open_fds(sc.pid()),
        ));
    }
    for w in workers {
        w.await.expect("a soak worker failed");
    }
    assert!(drained(&sc).await, "the load never drained");
    let (rss1, fds1) = (rss_kib(sc.pid()), open_fds(sc.pid()));
    // Flat from the first sample under load (pools and caches are warm by then) to the end.
    let (_, rss_warm, fds_warm) = samples.first().copied().unwrap_or((0, rss0, fds0));
    let requests = done.load(Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    let delivered = epode.events().len();
    let mut report = format!(
        "soak: {requests} requests in {elapsed:.0} s ({:.0}/s) through every path, 0 failures; RSS {rss0} KiB before the load, {rss_warm} KiB at the first sample, {rss1} KiB at the end; open fds {fds0} before, {fds_warm} at the first sample, {fds1} at the end; {delivered} telemetry events delivered\n",
        requests as f64 / elapsed
    );
    for (t, rss, fds) in &samples {
        report.push_str(&format!("  t={t:>4} s  RSS {rss} KiB  fds {fds}\n"));
    }
    eprint!("{report}");
    let _ = std::fs::create_dir_all(repo_root().join("target"));
    let _ = std::fs::write(repo_root().join("target/soak.txt"), &report);
    assert!(
        rss1 <= rss_warm + 4 * 1024,
        "RSS grew from {rss_warm} to {rss1} KiB"
    );
    assert!(
        fds1 <= fds_warm + 4,
        "open fds grew from {fds_warm} to {fds1}"
    );
    assert!(requests > 0);
}
