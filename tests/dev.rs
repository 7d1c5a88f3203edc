//! The local trial: `epode-sidecar --dev -- python examples/python-server/server.py --stdio`,
//! as the README's first command runs it. A never_ask call and its report show on the console
//! (its event stream, and the page in a real Chromium), in the terminal and in the JSON-lines
//! record; an invalid report is refused with the guidance the strict fake of the real service
//! produces.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use serde_json::{json, Value};
use support::fake_epode::{FakeConfig, FakeEpode, DEMO_PRODUCT_KEY};
use support::*;

fn example_server() -> Vec<String> {
    vec![
        python().display().to_string(),
        repo_root()
            .join("examples/python-server/server.py")
            .display()
            .to_string(),
        "--stdio".to_owned(),
    ]
}

fn start(env: &[(&str, &str)]) -> Sidecar {
    let argv = example_server();
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    Sidecar::start_stdio(&argv, env)
}

fn dev(record: &std::path::Path) -> Sidecar {
    start(&[
        ("EPODE_SIDECAR_DEV", "1"),
        ("EPODE_SIDECAR_DEV_LOG", record.to_str().unwrap()),
    ])
}

/// A never_ask product call: its result, and the feedback handle it carries.
fn product_call(sc: &Sidecar) -> String {
    let called = ts_call(
        &sc.url(),
        "pin",
        Some(("search_help", &json!({"query": "refund"}))),
        &[],
    );
    let fb = &called["result"]["structuredContent"]["_agentFeedback"];
    assert_eq!(fb["mode"], "never_ask", "{called}");
    assert_eq!(fb["state"], "feedback_ready", "{called}");
    fb["feedbackHandle"].as_str().unwrap().to_owned()
}

const SUMMARY: &str = "Search found the refund article on the first try.";

fn report(sc: &Sidecar, handle: &str, summary: &str) -> Value {
    let args = json!({
        "feedbackHandle": handle,
        "summary": summary,
        "impact": "helped",
        "findings": [{"kind": "strength", "topic": "search", "detail": "The right article ranked first."}],
    });
    ts_call(
        &sc.url(),
        "pin",
        Some(("report_product_feedback", &args)),
        &[],
    )["result"]
        .clone()
}

/// Reads the console's event stream until an event satisfies `until`; returns them all.
async fn console_events(sc: &Sidecar, until: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let resp = http()
        .get(format!("{}/_dev/events", sc.base()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut stream = resp.bytes_stream();
    let mut text = String::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let events: Vec<Value> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str(d).ok())
            .collect();
        if until(&events) {
            return events;
        }
        assert!(Instant::now() < deadline, "not on the console: {text}");
        let chunk = tokio::time::timeout(Duration::from_secs(10), stream.next()).await;
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap().unwrap().unwrap()));
    }
}

#[tokio::test]
async fn a_never_ask_call_and_its_report_show_on_the_console_in_the_terminal_and_in_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("epode-dev.jsonl");
    let sc = dev(&record);
    let handle = product_call(&sc);
    let answer = report(&sc, &handle, SUMMARY);
    assert_eq!(answer["structuredContent"]["accepted"], true, "{answer}");

    // The console: the call (with its _agentFeedback state), the report, the telemetry event.
    // The telemetry batch may be delivered before the report is: wait for both.
    let events = console_events(&sc, |events| {
        ["telemetry", "report"]
            .iter()
            .all(|kind| events.iter().any(|e| e["kind"] == *kind))
    })
    .await;
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["kind"].as_str()).collect();
    let call = events
        .iter()
        .find(|e| e["kind"] == "call" && e["tool"] == "search_help")
        .unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(
        (call["era"].as_str(), call["status"].as_u64()),
        (Some("2026-07-28"), Some(200))
    );
    assert!(call["durationMs"].is_u64());
    let fb = events.iter().find(|e| e["kind"] == "feedback").unwrap();
    assert_eq!(
        (fb["state"].as_str(), fb["mode"].as_str()),
        (Some("feedback_ready"), Some("never_ask"))
    );
    let shown = events.iter().find(|e| e["kind"] == "report").unwrap();
    assert_eq!(shown["report"]["summary"], SUMMARY);
    assert_eq!(shown["report"]["findings"][0]["topic"], "search");
    let tele = events.iter().find(|e| e["kind"] == "telemetry").unwrap();
    assert_eq!(tele["event"]["operation"], "search_help");
    assert_eq!(tele["delivery"], "accepted");
    assert_eq!(
        tele["event"]["interactionId"], fb["interactionId"],
        "{kinds:?}"
    );
    assert_eq!(shown["interactionId"], fb["interactionId"]);

    // The terminal: it said so at start, and on the report.
    let logs = sc.logs();
    assert!(
        logs.iter()
            .any(|l| l.contains("--dev: the local trial is on")),
        "{logs:?}"
    );
    let line = logs
        .iter()
        .find(|l| l.contains("feedback report received by the embedded Epode"))
        .unwrap_or_else(|| panic!("{logs:?}"));
    assert!(line.contains(SUMMARY), "{line}");
    assert!(
        logs.iter().all(|l| !l.contains(&handle)),
        "the handle never reaches the log"
    );

    // The record.
    let lines: Vec<Value> = std::fs::read_to_string(&record)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let rec = lines.iter().find(|l| l["kind"] == "report").unwrap();
    assert_eq!(
        (rec["status"].as_u64(), rec["body"]["summary"].as_str()),
        (Some(200), Some(SUMMARY))
    );
    assert!(lines
        .iter()
        .any(|l| l["kind"] == "telemetry" && l["status"] == 202));
}

#[test]
fn an_invalid_report_gets_the_guidance_the_real_service_would_produce() {
    // The same report, refused by the embedded Epode and by the strict fake of the service.
    let dir = tempfile::tempdir().unwrap();
    let sc = dev(&dir.path().join("r.jsonl"));
    let leaky = "Mail the results to someone@example.com afterwards";
    let from_dev = report(&sc, &product_call(&sc), leaky);

    let fake = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let url = fake.url();
    let real_like = start(&[
        ("EPODE_API_KEY", DEMO_PRODUCT_KEY),
        ("EPODE_API_URL", url.as_str()),
        ("AGENT_FEEDBACK_MODE", "never_ask"),
    ]);
    let from_fake = report(&real_like, &product_call(&real_like), leaky);
    assert_eq!(fake.reports().len(), 0);

    assert_eq!(from_dev["isError"], true, "{from_dev}");
    assert_eq!(from_dev, from_fake, "the same guidance");
    let text = from_dev["content"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with("Feedback submission failed with HTTP 400."),
        "{text}"
    );
}

#[test]
fn the_console_page_shows_a_call_and_a_report_live_in_chromium() {
    let dir = tempfile::tempdir().unwrap();
    let sc = dev(&dir.path().join("r.jsonl"));
    let shot = repo_root().join("target/console-screenshot.png");
    let _ = std::fs::remove_file(&shot);
    let mut browser = Command::new("node")
        .arg(peers_dir().join("ts/console_check.mjs"))
        .arg(format!("{}/_dev/", sc.base()))
        .arg(&shot)
        .args(["search_help", "feedback_ready", SUMMARY, "accepted"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(browser.stdout.take().unwrap()).lines();
    let first = out.next().unwrap().unwrap();
    assert_eq!(first, "READY", "{first}");
    // The page is open: what happens now must appear on it as it happens.
    let handle = product_call(&sc);
    assert_eq!(
        report(&sc, &handle, SUMMARY)["structuredContent"]["accepted"],
        true
    );
    let verdict: Value = serde_json::from_str(&out.next().unwrap().unwrap()).unwrap();
    let status = browser.wait().unwrap();
    assert!(status.success(), "{verdict}");
    assert_eq!(verdict["missing"], json!([]), "{verdict}");
    assert!(verdict["rows"].as_u64().unwrap() >= 4, "{verdict}");
    assert!(
        std::fs::metadata(&shot).unwrap().len() > 10_000,
        "a screenshot of the page"
    );
}

#[test]
fn without_a_key_the_sidecar_says_how_to_try_it_and_dev_stays_on_loopback() {
    let run = |env: &[(&str, &str)]| {
        let out = Command::new(env!("CARGO_BIN_EXE_epode-sidecar"))
            .args(["--", "python3", "server.py"])
            .env_clear()
            .envs(env.iter().copied())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&[]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("EPODE_API_KEY")
            && err.contains("--dev")
            && err.contains("AGENT_FEEDBACK_MODE=off"),
        "{err}"
    );
    let (code, err) = run(&[
        ("EPODE_SIDECAR_DEV", "1"),
        ("EPODE_SIDECAR_LISTEN", "0.0.0.0:0"),
    ]);
    assert_eq!(code, Some(2));
    assert!(err.contains("loopback"), "{err}");
}
