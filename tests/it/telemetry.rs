//! Confirmed telemetry through the sidecar to the strict fake Epode: exact events, sequence
//! numbers, several deliveries in flight within an adaptive limit, retries judged by the
//! receipt, Epode's pauses, overflow, shutdown flush, and product latency that does not
//! depend on Epode. The fake's cost model (`BatchCost`) makes batches take time, as the real
//! backend's do, with small numbers to keep the tests short.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::support::fake_epode::{
    BatchCost, Endpoint, FakeConfig, FakeEpode, Fault, DEMO_PRODUCT_KEY,
};
use crate::support::*;
use serde_json::{json, Value};

/// A 2026 upstream: `tools/list` names `work` (schema-less) and `ask` (which answers
/// `input_required`); `tools/call` of `work` succeeds, `fail` is an `isError` result, `slow`
/// succeeds after 400 ms.
fn work_upstream() -> Scripted {
    let tool = |name: &'static str| move |r: &Request| r.tool() == Some(name);
    ScriptedUpstream::new()
        .on(
            "tools/list",
            Reply::result(json!({"tools": [
                {"name": "work", "inputSchema": {"type": "object"}},
                {"name": "fail", "inputSchema": {"type": "object"}},
                {"name": "ask", "inputSchema": {"type": "object"}},
                {"name": "slow", "inputSchema": {"type": "object"}}]})),
        )
        .when(
            tool("ask"),
            Reply::result(json!({"resultType": "input_required", "requestState": "s"})),
        )
        .when(
            tool("fail"),
            Reply::result(json!({"content": [{"type": "text", "text": "no"}], "isError": true})),
        )
        .when(
            tool("slow"),
            Reply::result(json!({"content": [{"type": "text", "text": "ok"}]}))
                .delayed(Duration::from_millis(400)),
        )
        .otherwise_fn(|r| {
            // The customer a call names in its arguments (else acct_1).
            let account = r.json["params"]["arguments"]["customer"]
                .as_str()
                .unwrap_or("acct_1");
            Reply::result(json!({"content": [{"type": "text", "text": "ok"}],
                                 "_meta": {"ai.epode/identity": {"accountRef": account, "sessionRef": "s:1"}}}))
        })
        .start()
}

fn sidecar(up: &Scripted, epode: &FakeEpode, extra: &[(&str, &str)]) -> Sidecar {
    let mut env = vec![("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28")];
    env.extend_from_slice(extra);
    feedback_sidecar(&up.url(), epode, "never_ask", &env)
}

async fn call(client: &reqwest::Client, sc: &Sidecar, tool: &str, id: u64) -> Value {
    let body = modern_body(
        json!(id),
        "tools/call",
        json!({"name": tool, "arguments": {}}),
    );
    let mut req = client.post(sc.url()).body(body.to_string());
    for (k, v) in modern_headers("tools/call", Some(tool)) {
        req = req.header(k, v);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

fn handle_of(v: &Value) -> String {
    v["result"]["structuredContent"]["_agentFeedback"]["feedbackHandle"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The events Epode has, once there are `n` (or `within` passed).
async fn wait_events(epode: &FakeEpode, n: usize, within: Duration) -> Vec<Value> {
    epode
        .wait_until_async(within, |e| e.events().len() >= n)
        .await;
    epode.events()
}

/// Waits until an event of the interaction `last` is at Epode and the sidecar has nothing
/// queued or in delivery (`queue_depth` falls only once a batch is delivered, dropped or
/// given up): every event enqueued before `last`'s is then at Epode or counted. Whether that
/// happened within 10 s.
async fn settled_after(sc: &Sidecar, epode: &FakeEpode, last: &str) -> bool {
    eventually_async(Duration::from_secs(10), move || async move {
        epode.events().iter().any(|e| e["interactionId"] == last)
            && metric(sc, "epode_sidecar_telemetry_queue_depth").await == 0
    })
    .await
}

#[tokio::test]
async fn one_exact_event_per_completed_product_call() {
    let up = work_upstream();
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let sc = sidecar(&up, &epode, &[]);
    let c = http();
    let ok = call(&c, &sc, "work", 1).await;
    let failed = call(&c, &sc, "fail", 2).await;
    let asked = call(&c, &sc, "ask", 3).await;
    assert_eq!(asked["result"]["resultType"], "input_required");
    // The feedback tools themselves are not product calls.
    let report = modern_body(
        json!(4),
        "tools/call",
        json!({"name": "report_product_feedback",
        "arguments": {"feedbackHandle": handle_of(&ok), "summary": "Worked as expected today."}}),
    );
    let resp = post_modern(
        &sc.url(),
        "tools/call",
        Some("report_product_feedback"),
        &report,
    )
    .await;
    assert_eq!(resp.status(), 200);

    // A later product call: once its event is at Epode and nothing is queued or in delivery,
    // an event of the `input_required` call or of the feedback tool (both answered before it
    // began) would be at Epode too, or at least counted as enqueued.
    let later = call(&c, &sc, "work", 5).await;
    let later = epode.verify(&handle_of(&later)).unwrap().i.to_string();
    assert!(
        settled_after(&sc, &epode, &later).await,
        "the later call's event was not delivered: {:?}",
        epode.events()
    );
    let mut events = epode.events();
    events.retain(|e| e["interactionId"] != later.as_str());
    assert_eq!(
        events.len(),
        2,
        "one event per completed product call: {events:?}"
    );
    assert_eq!(
        metric(&sc, "epode_sidecar_telemetry_enqueued_total").await,
        3,
        "events enqueued: the two above and the later call's"
    );
    let claims = epode.verify(&handle_of(&ok)).unwrap();
    let e = &events[0];
    assert_eq!(
        e["interactionId"],
        claims.i.to_string().as_str(),
        "the handle's interaction id"
    );
    let mut projected = e.clone();
    let obj = projected.as_object_mut().unwrap();
    for generated in ["interactionId", "sequence", "occurredAt", "durationMs"] {
        assert!(obj.remove(generated).is_some(), "{generated} missing: {e}");
    }
    assert_eq!(
        projected,
        json!({"surface": "mcp", "operation": "work", "classification": "confirmed",
               "confirmationMethod": "mcp", "statusCode": 200, "accountRef": "acct_1",
               "sessionRef": "s:1", "sessionSource": "mcp"})
    );
    assert!(e["sequence"].as_u64().unwrap() >= 1);
    assert!(e["durationMs"].as_u64().is_some());
    assert_eq!(events[1]["operation"], "fail");
    assert_eq!(events[1]["statusCode"], 500);
    assert!(events[1]["sequence"].as_u64() > events[0]["sequence"].as_u64());
    // The failed call was decorated too, with its own interaction.
    let h2 = failed["result"]["structuredContent"]["_agentFeedback"]["feedbackHandle"]
        .as_str()
        .unwrap();
    assert_eq!(
        events[1]["interactionId"],
        epode.verify(h2).unwrap().i.to_string().as_str()
    );
}

/// A listed tool whose call fails upstream (the connection drops without an answer) is a
/// completed product call with statusCode 500. (An unlisted name would not be a product
/// operation at all.)
#[tokio::test]
async fn upstream_failures_are_500_events() {
    let up = ScriptedUpstream::new()
        .on("tools/call", Reply::hang_up())
        .otherwise(Reply::result(
            json!({"tools": [{"name": "work", "inputSchema": {"type": "object"}}]}),
        ))
        .start();
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let sc = sidecar(&up, &epode, &[]);
    let body = modern_body(
        json!(1),
        "tools/call",
        json!({"name": "work", "arguments": {}}),
    );
    let resp = post_modern(&sc.url(), "tools/call", Some("work"), &body).await;
    assert_eq!(resp.status(), 502);
    let events = wait_events(&epode, 1, Duration::from_secs(5)).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["statusCode"], 500);
    assert_eq!(events[0]["operation"], "work");
}

/// `workers` concurrent loops of `per_worker` calls of `work`. (A first call alone makes the
/// sidecar learn the tool: calls made while it is not yet listed are not product calls.)
/// `per_worker` calls from each of `workers` clients, each call naming a customer of its own.
async fn calls(sc: &Sidecar, workers: u64, per_worker: u64) {
    calls_naming(sc, workers, per_worker, u64::MAX).await;
}

/// The same, the calls naming `customers` customers in turn.
async fn calls_naming(sc: &Sidecar, workers: u64, per_worker: u64, customers: u64) {
    let c = http();
    let mut tasks = Vec::new();
    for w in 0..workers {
        let c = c.clone();
        let url = sc.url();
        tasks.push(tokio::spawn(async move {
            for i in 0..per_worker {
                let n = w * 100_000 + i;
                let body = modern_body(
                    json!(n),
                    "tools/call",
                    json!({"name": "work", "arguments": {"customer": format!("acct_{}", n % customers)}}),
                );
                let mut req = c.post(&url).body(body.to_string());
                for (k, v) in modern_headers("tools/call", Some("work")) {
                    req = req.header(k, v);
                }
                assert_eq!(req.send().await.unwrap().status(), 200);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// Every delivery the fake accepted: each event exactly once, numbered 1..=n, and numbered
/// in order within each batch. (Batches may interleave: an event that names a customer a
/// batch in flight names waits for a later batch.)
fn assert_sequences(epode: &FakeEpode, n: u64) {
    let batches: Vec<Vec<u64>> = epode
        .requests(Endpoint::Telemetry)
        .iter()
        .filter(|r| r.status == 202)
        .map(|r| {
            r.body["events"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["sequence"].as_u64().unwrap())
                .collect()
        })
        .collect();
    for b in &batches {
        assert!(
            b.windows(2).all(|w| w[0] < w[1]),
            "a batch out of order: {b:?}"
        );
    }
    let mut all: Vec<u64> = batches.concat();
    all.sort_unstable();
    assert_eq!(
        all,
        (1..=n).collect::<Vec<_>>(),
        "each sequence exactly once"
    );
    let mut ids: Vec<String> = epode
        .deliveries()
        .iter()
        .map(|e| e["interactionId"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(
        ids.len() as u64,
        n,
        "each interaction delivered exactly once"
    );
}

/// 2,000 rapid calls against an Epode whose batches take time (the cost model, scaled
/// down): deliveries overlap, every event arrives exactly once with its sequence, batches
/// hold up to the protocol's 100 events, and the sidecar's memory stays flat.
#[tokio::test]
async fn two_thousand_calls_in_parallel_deliveries_each_exactly_once() {
    let up = work_upstream();
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    // Slower than the flush interval (500 ms), so deliveries overlap at any call rate.
    epode.set_batch_cost(Some(BatchCost {
        base: Duration::from_millis(1000),
        per_event: Duration::from_millis(1),
        at_once: 10,
    }));
    // Every event fits in the queue, however fast the calls come (on an idle machine they
    // come faster than the fake takes them at first, and the default queue of 1,000 fills).
    let sc = sidecar(&up, &epode, &[("EPODE_SIDECAR_TELEMETRY_QUEUE", "2000")]);
    calls(&sc, 1, 200).await;
    let rss_warm = rss_kib(sc.pid());
    let started = Instant::now();
    calls(&sc, 4, 450).await;
    let calls_took = started.elapsed();
    let rss_after = rss_kib(sc.pid());
    let events = wait_events(&epode, 2000, Duration::from_secs(30)).await;
    assert_eq!(events.len(), 2000, "every event delivered");
    assert_sequences(&epode, 2000);
    let overlap = epode.max_concurrent(Endpoint::Telemetry);
    assert!(
        (2..=16).contains(&overlap),
        "deliveries in flight at once: {overlap} (the cap is 16)"
    );
    let batches = epode.requests(Endpoint::Telemetry);
    let largest = batches
        .iter()
        .map(|b| b.body["events"].as_array().unwrap().len())
        .max()
        .unwrap();
    assert!(largest <= 100, "a batch of {largest}");
    eprintln!(
        "2000 calls ({calls_took:?} for the last 1800); {} batches, the largest {largest}, {overlap} in flight at most; RSS {rss_warm} KiB warm, {rss_after} KiB after",
        batches.len()
    );
    assert!(
        rss_after < rss_warm + 8 * 1024,
        "memory grew from {rss_warm} KiB to {rss_after} KiB"
    );
    assert_eq!(
        metric(&sc, "epode_sidecar_telemetry_delivered_total").await,
        2000
    );
    assert_eq!(
        metric(&sc, "epode_sidecar_telemetry_epode_accepted_total").await,
        2000
    );
}

/// The fake processes any number of batches at once, so what it sees in flight is the
/// sidecar's limit: it reaches `EPODE_SIDECAR_TELEMETRY_CONCURRENCY` (4) and never goes past
/// it, and the gauges say so.
#[tokio::test]
async fn deliveries_overlap_up_to_the_limit_and_never_beyond() {
    let up = work_upstream();
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    epode.set_batch_cost(Some(BatchCost {
        base: Duration::from_millis(200),
        per_event: Duration::ZERO,
        at_once: 1000,
    }));
    let sc = sidecar(
        &up,
        &epode,
        &[
            ("EPODE_SIDECAR_TELEMETRY_CONCURRENCY", "4"),
            ("EPODE_SIDECAR_TELEMETRY_BATCH", "5"),
            ("EPODE_SIDECAR_TELEMETRY_FLUSH", "20ms"),
        ],
    );
    calls(&sc, 1, 1).await;
    calls(&sc, 4, 60).await;
    let mut gauge_max = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while epode.events().len() < 241 && Instant::now() < deadline {
        gauge_max =
            gauge_max.max(metric(&sc, "epode_sidecar_telemetry_deliveries_in_flight").await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(epode.events().len(), 241);
    assert_eq!(
        epode.max_concurrent(Endpoint::Telemetry),
        4,
        "deliveries in flight at once, with a limit of 4"
    );
    assert!((1..=4).contains(&gauge_max), "the gauge showed {gauge_max}");
    assert_eq!(
        metric(&sc, "epode_sidecar_telemetry_concurrency_limit").await,
        4
    );
    assert_sequences(&epode, 241);
}

#[tokio::test]
async fn server_error_then_accepted_is_delivered_once() {
    let up = work_upstream();
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    epode.inject(Endpoint::Telemetry, Fault::Status(500));
    let sc = sidecar(&up, &epode, &[]);
    call(&http(), &sc, "work", 1).await;
    let events = wait_events(&epode, 1, Duration::from_secs(5)).await;
    assert_eq!(events.len(), 1);
    let sent = epode.requests(Endpoint::Telemetry);
    assert_eq!(sent.len(), 2, "one failure, one retry");
    assert_eq!(
        sent[0].body, sent[1].body,
        "the retry resends the identical events"
    );
    let gap = sent[1].at.duration_since(sent[0].at);
    assert!(
        gap >= Duration::from_millis(450),
        "backoff of 0.5 s: {gap:?}"
    );
    assert_eq!(
        metric(&sc, "epode_sidecar_telemetry_retries_total").await,
        1
    );
}

#[tokio::test]
async fn too_many_requests_waits_for_retry_after() {
    let up = work_upstream();
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    epode.inject(Endpoint::Telemetry, Fault::StatusRetryAfter(429, 2));
    let sc = sidecar(&up, &epode, &[]);
    call(&http(), &sc, "work", 1).await;
    let events = wait_events(&epode, 1, Duration::from_secs(8)).await;
    assert_eq!(events.len(), 1);
    let sent = epode.requests(Endpoint::Telemetry);
    let gap = sent[1].at.duration_since(sent[0].at);
    assert!(
        gap >= Duration::from_millis(1900),
        "Retry-After: 2 not honoured: {gap:?}"
    );
}

/// A 429 with `Retry-After` while several deliveries are allowed: the limit is halved, and
/// no batch reaches Epode until the pause is over, however many are waiting; then every
/// event arrives.
#[tokio::test]
async fn too_many_requests_halves_the_limit_and_pauses_every_delivery() {
    let up = work_upstream();
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    epode.set_batch_cost(Some(BatchCost {
        base: Duration::from_millis(100),
        per_event: Duration::ZERO,
        at_once: 1000,
    }));
    let sc = sidecar(
        &up,
        &epode,
        &[
            ("EPODE_SIDECAR_TELEMETRY_CONCURRENCY", "8"),
            ("EPODE_SIDECAR_TELEMETRY_BATCH", "5"),
            ("EPODE_SIDECAR_TELEMETRY_FLUSH", "20ms"),
        ],
    );
    let limit = "epode_sidecar_telemetry_concurrency_limit";
    // Enough batches for the limit to grow from 2 to its cap of 8.
    calls(&sc, 1, 1).await;
    calls(&sc, 4, 40).await;
    assert!(
        epode
            .wait_until_async(Duration::from_secs(20), |e| e.events().len() == 161)
            .await
    );
    assert_eq!(metric(&sc, limit).await, 8);
    epode.inject(Endpoint::Telemetry, Fault::StatusRetryAfter(429, 2));
    calls(&sc, 1, 5).await;
    eventually_async(Duration::from_secs(10), || async {
        metric(&sc, limit).await != 8
    })
    .await;
    assert_eq!(metric(&sc, limit).await, 4, "the limit after a 429");
    // Many batches now wait; none may start before the pause ends.
    calls(&sc, 4, 25).await;
    assert!(
        epode
            .wait_until_async(Duration::from_secs(20), |e| e.events().len() == 266)
            .await,
        "every event arrives after the pause"
    );
    let sent = epode.requests(Endpoint::Telemetry);
    let refused = sent.iter().position(|r| r.status == 429).expect("the 429");
    let pause_end = sent[refused].answered.unwrap() + Duration::from_secs(2);
    let early: Vec<Duration> = sent[refused + 1..]
        .iter()
        .filter(|r| r.at < pause_end)
        .map(|r| pause_end - r.at)
        .collect();
    assert!(
        early.is_empty(),
        "{} batches arrived before Retry-After had passed (by {early:?})",
        early.len()
    );
    assert!(sent.len() - refused > 20, "the batches after the 429");
}

/// A 202 whose receipt says Epode stored 3 of 5 events and dropped 2: the 3 are delivered,
/// only the 2 are counted as `epode_dropped`, and the receipt's counts are on `/metrics` as
/// Epode reported them.
#[tokio::test]
async fn a_partial_receipt_counts_only_the_dropped_events() {
    let up = work_upstream();
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    epode.inject(Endpoint::Telemetry, Fault::Dropped(2));
    let sc = sidecar(
        &up,
        &epode,
        &[
            ("EPODE_SIDECAR_TELEMETRY_BATCH", "5"),
            ("EPODE_SIDECAR_TELEMETRY_FLUSH", "2s"),
        ],
    );
    calls(&sc, 1, 5).await;
    assert!(
        epode
            .wait_until_async(Duration::from_secs(10), |e| e.events().len() == 3)
            .await
    );
    let sent = epode.requests(Endpoint::Telemetry);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].body["events"].as_array().unwrap().len(), 5);
    let m = |name: &'static str| metric(&sc, name);
    eventually_async(Duration::from_secs(5), || async {
        m("epode_sidecar_telemetry_queue_depth").await == 0
    })
    .await;
    assert_eq!(m("epode_sidecar_telemetry_delivered_total").await, 3);
    assert_eq!(
        m("epode_sidecar_telemetry_dropped_total{reason=\"epode_dropped\"}").await,
        2
    );
    assert_eq!(m("epode_sidecar_telemetry_epode_accepted_total").await, 3);
    assert_eq!(m("epode_sidecar_telemetry_epode_dropped_total").await, 2);
    assert_eq!(
        m("epode_sidecar_telemetry_dropped_total{reason=\"rejected\"}").await,
        0
    );
}

/// SIGTERM while several slow deliveries are in flight and the queue is full: everything
/// accepted is delivered before exit, within the shutdown setting. One delivery at a time
/// would need about 18 batches x 2 s, far longer than the 10 s allowed. (Deliveries of 2 s
/// drain 40 events a second: even a loaded machine's calls outpace that and fill the queue.)
#[tokio::test]
async fn sigterm_flushes_every_delivery_in_flight_and_a_full_queue() {
    let up = work_upstream();
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    epode.set_batch_cost(Some(BatchCost {
        base: Duration::from_secs(2),
        per_event: Duration::ZERO,
        at_once: 1000,
    }));
    let mut sc = sidecar(
        &up,
        &epode,
        &[
            ("EPODE_SIDECAR_TELEMETRY_QUEUE", "100"),
            ("EPODE_SIDECAR_TELEMETRY_BATCH", "10"),
            ("EPODE_SIDECAR_TELEMETRY_CONCURRENCY", "8"),
            ("EPODE_SIDECAR_TELEMETRY_FLUSH", "20ms"),
            ("EPODE_SIDECAR_TELEMETRY_SHUTDOWN", "10s"),
        ],
    );
    calls(&sc, 1, 1).await;
    // Calls until the queue has been full (on a loaded machine they come slower than the
    // deliveries drain it at first), within a deadline.
    let mut full = 0;
    for _ in 0..20 {
        calls(&sc, 4, 30).await;
        full = metric(
            &sc,
            "epode_sidecar_telemetry_dropped_total{reason=\"queue_full\"}",
        )
        .await;
        if full > 0 {
            break;
        }
    }
    assert!(full > 0, "the queue never filled");
    let enqueued = metric(&sc, "epode_sidecar_telemetry_enqueued_total").await;
    assert!(
        epode.in_flight(Endpoint::Telemetry) >= 2,
        "deliveries in flight: {}",
        epode.in_flight(Endpoint::Telemetry)
    );
    let stopped = Instant::now();
    sc.terminate();
    let (code, sc) = tokio::task::spawn_blocking(move || {
        let code = sc.wait_exit(Duration::from_secs(15));
        (code, sc)
    })
    .await
    .unwrap();
    let took = stopped.elapsed();
    assert_eq!(code, Some(0), "{}", sc.logs().join("\n"));
    assert_eq!(
        epode.events().len() as u64,
        enqueued,
        "accepted events were lost at shutdown ({took:?})"
    );
    assert!(took < Duration::from_secs(12), "shutdown took {took:?}");
    eprintln!("{enqueued} events flushed in {took:?}; {full} dropped while the queue was full");
}

/// Events as large as the protocol allows (three refs of 160 characters, a runtime hint of
/// 200 four-byte characters: about 1.7 KB each): a batch of them would pass Epode's 64 KiB
/// body limit (a 413, every event lost), so it goes in parts that each fit.
#[tokio::test]
async fn large_events_go_in_batches_epode_reads_whole() {
    let long = |c: &str| c.repeat(160);
    let identity = json!({"accountRef": long("a"), "userRef": long("u"), "sessionRef": long("s"),
                          "runtimeHint": "\u{1F680}".repeat(200)});
    let up = ScriptedUpstream::new()
        .on(
            "tools/list",
            Reply::result(json!({"tools": [{"name": "work", "inputSchema": {"type": "object"}}]})),
        )
        .otherwise(Reply::result(
            json!({"content": [{"type": "text", "text": "ok"}],
                                          "_meta": {"ai.epode/identity": identity}}),
        ))
        .start();
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let sc = sidecar(&up, &epode, &[("EPODE_SIDECAR_TELEMETRY_FLUSH", "3s")]);
    calls(&sc, 1, 60).await;
    let events = wait_events(&epode, 60, Duration::from_secs(15)).await;
    let sent = epode.requests(Endpoint::Telemetry);
    let sizes: Vec<(u16, usize)> = sent.iter().map(|r| (r.status, r.raw_body.len())).collect();
    assert_eq!(events.len(), 60, "requests (status, bytes): {sizes:?}");
    assert!(events[0]["runtimeHint"].as_str().is_some());
    assert!(sent.len() >= 2, "{sizes:?}");
    assert!(sizes.iter().all(|(status, _)| *status == 202), "{sizes:?}");
}

/// Many callers at once, a batch of 2 and a flush time of a minute: a batch leaves as soon
/// as it is full, every time. (The request path says "a full batch is waiting"; when two
/// calls enqueued at once stepped over the count it watched for, nobody said it, and the
/// batch waited for the flush while the queue filled.)
#[tokio::test]
async fn full_batches_leave_at_once_whatever_the_concurrency() {
    let up = work_upstream();
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let sc = sidecar(
        &up,
        &epode,
        &[
            ("EPODE_SIDECAR_TELEMETRY_BATCH", "2"),
            ("EPODE_SIDECAR_TELEMETRY_FLUSH", "1m"),
        ],
    );
    calls(&sc, 1, 2).await;
    calls(&sc, 16, 40).await;
    let events = wait_events(&epode, 642, Duration::from_secs(20)).await;
    assert_eq!(
        events.len(),
        642,
        "events still waiting for the flush: {}",
        metric(&sc, "epode_sidecar_telemetry_queue_depth").await
    );
}

#[tokio::test]
async fn reported_drops_and_malformed_receipts_are_not_retried() {
    for fault in [
        Fault::Dropped(1),
        Fault::MalformedReceipt,
        Fault::ShortAccepted,
    ] {
        let up = work_upstream();
        let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
        epode.inject(Endpoint::Telemetry, fault.clone());
        // A retry would come 50 ms after the answer, before the batch leaves the queue.
        let sc = sidecar(
            &up,
            &epode,
            &[
                ("EPODE_SIDECAR_TELEMETRY_FLUSH", "20ms"),
                ("EPODE_SIDECAR_TELEMETRY_RETRY_BASE", "50ms"),
            ],
        );
        call(&http(), &sc, "work", 1).await;
        // The batch's end: counted as dropped and out of the queue (`queue_depth` falls only
        // after the last attempt, so a retry, 50 ms later, would come before it).
        let sc = &sc;
        let ended = eventually_async(Duration::from_secs(10), move || async move {
            let dropped = metric(
                sc,
                "epode_sidecar_telemetry_dropped_total{reason=\"epode_dropped\"}",
            )
            .await
                + metric(
                    sc,
                    "epode_sidecar_telemetry_dropped_total{reason=\"rejected\"}",
                )
                .await;
            dropped > 0 && metric(sc, "epode_sidecar_telemetry_queue_depth").await == 0
        })
        .await;
        assert!(ended, "{fault:?}: the batch never ended");
        assert_eq!(
            metric(sc, "epode_sidecar_telemetry_retries_total").await,
            0,
            "{fault:?} was retried"
        );
        assert_eq!(
            epode.request_count(Endpoint::Telemetry),
            1,
            "{fault:?} was retried"
        );
        let dropped = metric(
            sc,
            "epode_sidecar_telemetry_dropped_total{reason=\"epode_dropped\"}",
        )
        .await
            + metric(
                sc,
                "epode_sidecar_telemetry_dropped_total{reason=\"rejected\"}",
            )
            .await;
        assert_eq!(dropped, 1, "{fault:?}");
        let logs = sc.logs().join("\n");
        assert!(logs.contains("not retried"), "{fault:?}: {logs}");
        assert!(
            !logs.contains(DEMO_PRODUCT_KEY),
            "the product key reached the log"
        );
    }
}

#[tokio::test]
async fn a_full_queue_drops_and_counts() {
    let up = work_upstream();
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    epode.set_down(true);
    let sc = sidecar(
        &up,
        &epode,
        &[
            ("EPODE_SIDECAR_TELEMETRY_QUEUE", "5"),
            ("EPODE_SIDECAR_TELEMETRY_CONCURRENCY", "2"),
        ],
    );
    let c = http();
    for i in 0..40 {
        call(&c, &sc, "work", i).await;
    }
    let dropped = metric(
        &sc,
        "epode_sidecar_telemetry_dropped_total{reason=\"queue_full\"}",
    )
    .await;
    assert!(dropped >= 20, "only {dropped} dropped");
    // The bound: 5 queued, plus the batches in delivery (at most 2, of at most 5: a batch
    // is never larger than the queue).
    assert!(metric(&sc, "epode_sidecar_telemetry_queue_depth").await <= 15);
}

#[tokio::test]
async fn sigterm_delivers_queued_events_before_exit() {
    let up = work_upstream();
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let mut sc = sidecar(&up, &epode, &[]);
    let c = http();
    for i in 0..120 {
        call(&c, &sc, "work", i).await;
    }
    sc.terminate();
    let code = tokio::task::spawn_blocking(move || {
        let code = sc.wait_exit(Duration::from_secs(15));
        (code, sc)
    })
    .await
    .unwrap();
    assert_eq!(code.0, Some(0));
    assert_eq!(
        epode.events().len(),
        120,
        "queued events were lost at shutdown"
    );
}

fn percentile(mut v: Vec<Duration>, p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// Epode unreachable for a minute: product calls are as fast as with Epode up.
#[tokio::test]
async fn epode_down_never_delays_product_calls() {
    let up = work_upstream();
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    // The queue's clock, scaled down 25 times (flush, first retry) and a small queue, so the
    // seconds Epode is down cover many complete retry cycles, full queues and given-up
    // batches: what a minute of the default settings would show.
    let sc = sidecar(
        &up,
        &epode,
        &[
            ("EPODE_SIDECAR_TELEMETRY_FLUSH", "20ms"),
            ("EPODE_SIDECAR_TELEMETRY_RETRY_BASE", "20ms"),
            ("EPODE_SIDECAR_TELEMETRY_BATCH", "10"),
            ("EPODE_SIDECAR_TELEMETRY_QUEUE", "50"),
        ],
    );
    let c = http();
    let measure = |secs: u64| {
        let c = c.clone();
        let url = sc.url();
        async move {
            let mut lat = Vec::new();
            let end = Instant::now() + Duration::from_secs(secs);
            let mut i = 0u64;
            while Instant::now() < end {
                let body = modern_body(
                    json!(i),
                    "tools/call",
                    json!({"name": "work", "arguments": {}}),
                );
                let mut req = c.post(&url).body(body.to_string());
                for (k, v) in modern_headers("tools/call", Some("work")) {
                    req = req.header(k, v);
                }
                let t = Instant::now();
                let resp = req.send().await.unwrap();
                assert_eq!(resp.status(), 200);
                let _ = resp.bytes().await.unwrap();
                lat.push(t.elapsed());
                i += 1;
                // The scenario: a steady client, a call every few milliseconds.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            lat
        }
    };
    let up_lat = measure(2).await;
    drop(epode); // Epode is gone: connections are refused from now on.
    let mut down_lat = measure(4).await;
    // On a loaded machine the calls come slower: the down phase lasts until the queue has been
    // full and a batch given up (each second more is measured too), within a deadline.
    let dropped = |reason: &'static str| {
        let sc = &sc;
        async move {
            metric(
                sc,
                &format!("epode_sidecar_telemetry_dropped_total{{reason=\"{reason}\"}}"),
            )
            .await
        }
    };
    for _ in 0..20 {
        if dropped("queue_full").await > 0 && dropped("retries_exhausted").await > 0 {
            break;
        }
        down_lat.extend(measure(1).await);
    }
    let (p50_up, p99_up) = (
        percentile(up_lat.clone(), 0.5),
        percentile(up_lat.clone(), 0.99),
    );
    let (p50_down, p99_down) = (
        percentile(down_lat.clone(), 0.5),
        percentile(down_lat.clone(), 0.99),
    );
    eprintln!(
        "product calls: Epode up {} calls p50 {p50_up:?} p99 {p99_up:?}; Epode down 4 s {} calls p50 {p50_down:?} p99 {p99_down:?}",
        up_lat.len(),
        down_lat.len()
    );
    let _ = std::fs::create_dir_all(repo_root().join("target"));
    let _ = std::fs::write(
        repo_root().join("target/telemetry-latency.txt"),
        format!("Epode up: p50 {p50_up:?} p99 {p99_up:?}; Epode down (4 s, queue clock x25): p50 {p50_down:?} p99 {p99_down:?}\n"),
    );
    assert!(
        p99_down <= p99_up * 2 + Duration::from_millis(3),
        "Epode down slowed product calls: p99 {p99_down:?} vs {p99_up:?}"
    );
    assert!(metric(&sc, "epode_sidecar_telemetry_retries_total").await > 0);
    for reason in ["retries_exhausted", "queue_full"] {
        let name = format!("epode_sidecar_telemetry_dropped_total{{reason=\"{reason}\"}}");
        assert!(
            metric(&sc, &name).await > 0,
            "{reason}: the down phase did not reach it"
        );
    }
}

/// A receipt whose counts overflow when added is a malformed receipt (counted, not retried),
/// not a panic of the delivery task: later events are still delivered.
#[tokio::test]
async fn an_overflowing_receipt_is_rejected_and_delivery_goes_on() {
    let up = work_upstream();
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    epode.inject(Endpoint::Telemetry, Fault::ReceiptOverflow);
    let sc = sidecar(&up, &epode, &[]);
    let c = http();
    call(&c, &sc, "work", 1).await;
    assert!(
        epode
            .wait_until_async(Duration::from_secs(5), |e| e
                .request_count(Endpoint::Telemetry)
                == 1)
            .await
    );
    call(&c, &sc, "work", 2).await;
    assert!(
        epode
            .wait_until_async(Duration::from_secs(5), |e| e
                .request_count(Endpoint::Telemetry)
                == 2)
            .await,
        "the delivery task stopped after the overflowing receipt"
    );
    let rejected = "epode_sidecar_telemetry_dropped_total{reason=\"rejected\"}";
    eventually_async(Duration::from_secs(5), || async {
        metric(&sc, rejected).await >= 1
    })
    .await;
    // The second receipt is counted once the sidecar has read it, which may be after the
    // fake counted the request.
    let delivered = "epode_sidecar_telemetry_delivered_total";
    eventually_async(Duration::from_secs(5), || async {
        metric(&sc, delivered).await >= 1
    })
    .await;
    assert_eq!(metric(&sc, rejected).await, 1);
    assert_eq!(metric(&sc, delivered).await, 1);
}

/// Dropped telemetry is logged as counted summaries, never one line per event: 100 drops
/// give one line at the first drop and one summary (with the count) at shutdown.
#[tokio::test]
async fn dropped_telemetry_is_logged_as_summaries() {
    let up = work_upstream();
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    epode.set_down(true);
    let mut sc = sidecar(
        &up,
        &epode,
        &[
            ("EPODE_SIDECAR_TELEMETRY_QUEUE", "1"),
            ("EPODE_SIDECAR_TELEMETRY_CONCURRENCY", "1"),
            ("EPODE_SIDECAR_TELEMETRY_SHUTDOWN", "1s"),
        ],
    );
    let c = http();
    for i in 0..100 {
        call(&c, &sc, "work", i).await;
    }
    let full = metric(
        &sc,
        "epode_sidecar_telemetry_dropped_total{reason=\"queue_full\"}",
    )
    .await;
    assert!(full >= 98, "{full}");
    sc.terminate();
    assert!(sc.wait_exit(Duration::from_secs(10)).is_some());
    let logs = sc.logs();
    let drop_lines: Vec<&String> = logs
        .iter()
        .filter(|l| l.contains("dropped") && !l.contains("DEBUG"))
        .collect();
    assert!(
        drop_lines.len() <= 3,
        "one line per drop instead of a summary:\n{}",
        drop_lines
            .iter()
            .map(|l| l.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    let summary = drop_lines
        .iter()
        .find(|l| l.contains("more in the last"))
        .unwrap_or_else(|| panic!("no summary line: {drop_lines:?}"));
    assert!(
        summary.contains(&format!("queue_full={}", full - 1)),
        "{summary}"
    );
}

/// The real Epode locks every customer a batch names, in the batch's interaction order, until
/// the batch commits: batches in flight whose customers form a cycle (X and Y both naming A
/// and B; or X: A, B; Y: B, C; Z: C, A) can deadlock there. With calls of a few customers and
/// batches that take time, the batches Epode is processing at any moment, joined to the
/// customers they name, never form a cycle (they still all arrive, and they do overlap).
#[tokio::test]
async fn batches_in_flight_never_name_customers_in_a_cycle() {
    let up = work_upstream();
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    epode.set_batch_cost(Some(BatchCost {
        base: Duration::from_millis(100),
        per_event: Duration::ZERO,
        at_once: 10,
    }));
    let sc = sidecar(&up, &epode, &[("EPODE_SIDECAR_TELEMETRY_BATCH", "4")]);
    // A first call makes the sidecar learn the tool; then twelve customers over 8 x 40
    // calls, in batches of 4 naming at most four of them.
    calls(&sc, 1, 1).await;
    calls_naming(&sc, 8, 40, 12).await;
    let events = wait_events(&epode, 321, Duration::from_secs(60)).await;
    assert_eq!(events.len(), 321, "every event delivered");
    let batches: Vec<(Instant, Instant, Vec<String>)> = epode
        .requests(Endpoint::Telemetry)
        .into_iter()
        .filter(|r| r.status == 202)
        .map(|r| {
            let mut customers: Vec<String> = r.body["events"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|e| e["accountRef"].as_str().map(str::to_owned))
                .collect();
            customers.sort();
            customers.dedup();
            (r.at, r.answered.unwrap(), customers)
        })
        .collect();
    let mut shared = 0;
    // At each batch's arrival, the batches in flight and their customers: a forest.
    for (at, _, _) in &batches {
        let flying: Vec<&Vec<String>> = batches
            .iter()
            .filter(|(a, b, _)| a <= at && at < b)
            .map(|(_, _, c)| c)
            .collect();
        // Union-find over batches (by index) and customers (by name).
        let mut parent: HashMap<String, String> = HashMap::new();
        fn find(p: &mut HashMap<String, String>, k: &str) -> String {
            let up = p
                .entry(k.to_owned())
                .or_insert_with(|| k.to_owned())
                .clone();
            if up == k {
                return up;
            }
            let root = find(p, &up);
            p.insert(k.to_owned(), root.clone());
            root
        }
        for (i, customers) in flying.iter().enumerate() {
            for c in customers.iter() {
                let (b, c) = (
                    find(&mut parent, &format!("batch {i}")),
                    find(&mut parent, c),
                );
                assert_ne!(
                    b, c,
                    "the batches in flight close a cycle through {c}: {flying:?}"
                );
                parent.insert(b, c);
            }
        }
        let mut named: Vec<&String> = flying.iter().flat_map(|c| c.iter()).collect();
        let all = named.len();
        named.sort();
        named.dedup();
        shared += all - named.len();
    }
    assert!(
        shared > 0,
        "no two batches in flight shared a customer: nothing was shown"
    );
}

/// A call the sidecar refuses before any of it is sent (every upstream connection it may open
/// stayed busy past the wait: 503) never became a product call: only the calls the upstream
/// served are events. (At 5,000 calls/s against the real Epode, each such 503 was an event.)
#[tokio::test]
async fn a_call_refused_before_it_is_sent_is_no_event() {
    let up = work_upstream();
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let sc = sidecar(
        &up,
        &epode,
        &[
            ("EPODE_SIDECAR_UPSTREAM_MAX_CONNECTIONS", "1"),
            ("EPODE_SIDECAR_UPSTREAM_WAIT", "100ms"),
            ("EPODE_SIDECAR_TELEMETRY_FLUSH", "100ms"),
        ],
    );
    let c = http();
    call(&c, &sc, "work", 0).await;
    let calls = (1..=8).map(|i| {
        let (c, url) = (c.clone(), sc.url());
        async move {
            let body = modern_body(
                json!(i),
                "tools/call",
                json!({"name": "slow", "arguments": {}}),
            );
            let mut req = c.post(&url).body(body.to_string());
            for (k, v) in modern_headers("tools/call", Some("slow")) {
                req = req.header(k, v);
            }
            req.send().await.unwrap().status().as_u16()
        }
    });
    let statuses = futures_util::future::join_all(calls).await;
    let served = statuses.iter().filter(|s| **s == 200).count();
    let refused = statuses.iter().filter(|s| **s == 503).count();
    assert_eq!(served + refused, 8, "{statuses:?}");
    assert!(served > 0 && refused > 0, "{statuses:?}");
    let events = wait_events(&epode, 1 + served, Duration::from_secs(10)).await;
    assert_eq!(events.len(), 1 + served, "{statuses:?}");
    // Nothing more is queued or on its way: every call has been counted.
    assert_eq!(
        metric(&sc, "epode_sidecar_telemetry_enqueued_total").await,
        1 + served as u64,
        "{statuses:?}"
    );
    assert!(events.iter().all(|e| e["statusCode"] != 503), "{events:?}");
}

/// Epode answers every batch with a receipt the sidecar cannot read: nothing is delivered, and
/// the shutdown line says so in figures that add up (it once said `delivered=0 lost=0`, the
/// rejected events in no figure at all).
#[tokio::test]
async fn the_shutdown_line_accounts_for_every_event() {
    let up = work_upstream();
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    for _ in 0..40 {
        epode.inject(Endpoint::Telemetry, Fault::MalformedReceipt);
    }
    let mut sc = sidecar(&up, &epode, &[("EPODE_SIDECAR_TELEMETRY_FLUSH", "20ms")]);
    let c = http();
    for i in 0..10 {
        call(&c, &sc, "work", i).await;
    }
    let rejected = eventually_async(Duration::from_secs(20), || async {
        metric(
            &sc,
            "epode_sidecar_telemetry_dropped_total{reason=\"rejected\"}",
        )
        .await
            == 10
    })
    .await;
    assert!(rejected, "the ten events were not all rejected");
    sc.terminate();
    assert_eq!(sc.wait_exit(Duration::from_secs(15)), Some(0));
    let logs = sc.logs();
    let line = logs
        .iter()
        .find(|l| l.contains("telemetry flushed"))
        .unwrap_or_else(|| panic!("no shutdown line:\n{}", logs.join("\n")));
    for figure in [
        "accepted=10",
        "delivered=0",
        "undelivered=10",
        "refused=0",
        "by_reason=rejected=10",
        "lost_at_shutdown=0",
    ] {
        assert!(line.contains(figure), "{figure} missing: {line}");
    }
}

/// A product call still running when the grace period ends is cut (503 for the client) and
/// is one failure event, delivered before exit: the request's future is dropped by the cut,
/// and its end step, not a destructor, records the event.
#[tokio::test]
async fn a_call_cut_at_shutdown_is_one_failure_event() {
    let up = ScriptedUpstream::new()
        .on("tools/call", Reply::silent())
        .otherwise(Reply::result(
            json!({"tools": [{"name": "work", "inputSchema": {"type": "object"}}]}),
        ))
        .start();
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let mut sc = sidecar(&up, &epode, &[("EPODE_SIDECAR_SHUTDOWN_GRACE", "300ms")]);
    let url = sc.url();
    let cut = tokio::spawn(async move {
        let body = modern_body(
            json!(1),
            "tools/call",
            json!({"name": "work", "arguments": {}}),
        );
        let resp = post_modern(&url, "tools/call", Some("work"), &body).await;
        resp.status().as_u16()
    });
    let held = eventually_async(Duration::from_secs(10), || {
        std::future::ready(up.requests().iter().any(|r| r.method() == "tools/call"))
    })
    .await;
    assert!(held, "the call never reached the upstream");
    sc.terminate();
    assert_eq!(cut.await.unwrap(), 503);
    let (code, _sc) = tokio::task::spawn_blocking(move || {
        let code = sc.wait_exit(Duration::from_secs(15));
        (code, sc)
    })
    .await
    .unwrap();
    assert_eq!(code, Some(3), "the exit status says work was cut");
    let events = epode.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["statusCode"], 500);
    assert_eq!(events[0]["operation"], "work");
}
