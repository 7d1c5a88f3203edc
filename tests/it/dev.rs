//! The local trial: `epode-sidecar --dev -- python examples/python-server/server.py --stdio`,
//! as the README's first command runs it. A never_ask call and its report show on the console
//! (its event stream, and the page in a real Chromium), in the terminal and in the JSON-lines
//! record; an invalid report is refused with the guidance the strict fake of the real service
//! produces. At start it says, at INFO, where clients connect, where the console is and a
//! command that works when pasted; the empty console shows the same. A record it cannot write
//! goes to the temporary directory, or nowhere, and it says so. The console tells a product
//! owner each interaction in one group: `isError`, the feedback tools' outcomes, reports refused
//! by the sidecar or by the embedded Epode with why, a duplicate report flagged; durations to a
//! tenth of a millisecond. The README's own Python server and client run as written, and
//! `scripts/demo.sh` refuses at once, in one line, when Rust or Python is missing.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::fake_epode::{FakeConfig, FakeEpode, DEMO_PRODUCT_KEY};
use crate::support::*;
use futures_util::StreamExt as _;
use serde_json::{json, Value};

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
        ("EPODE_SIDECAR_ACCESS_LOG", "on"),
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
    assert!(call["durationMs"].is_number());
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
    // The call, its _agentFeedback, its telemetry and the report: one interaction's group.
    let group = &verdict["groups"][0]["rows"];
    assert!(group.as_array().unwrap().len() >= 4, "{verdict}");
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

/// Reads the sidecar's log (which drains as it is read) into `seen` until `until` holds.
fn wait_logs(sc: &Sidecar, seen: &mut Vec<String>, until: impl Fn(&[String]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        seen.extend(sc.logs());
        if until(seen) {
            return;
        }
        assert!(Instant::now() < deadline, "not in the log: {seen:#?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn line_with<'a>(logs: &'a [String], needle: &str) -> &'a str {
    logs.iter()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?}: {logs:#?}"))
}

/// Runs a shell command line as a user would paste it; returns its stdout as JSON.
fn run_pasted(command: &str) -> Value {
    let out = Command::new("sh").arg("-c").arg(command).output().unwrap();
    assert!(out.status.success(), "{command}: {out:?}");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{command}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn tool_names(answer: &Value) -> Vec<String> {
    answer["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools: {answer}"))
        .iter()
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn at_start_dev_says_at_info_where_clients_connect_the_console_and_a_command_that_works() {
    let dir = tempfile::tempdir().unwrap();
    let sc = dev(&dir.path().join("r.jsonl"));
    let mut logs = Vec::new();
    wait_logs(&sc, &mut logs, |l| {
        l.iter().any(|l| l.contains("--dev: try it"))
    });
    let endpoint = format!("--dev: MCP clients connect to {}", sc.url());
    let console = format!("--dev: watch it live on the console: {}/_dev/", sc.base());
    for needle in [
        "--dev: the local trial is on",
        &endpoint,
        &console,
        "--dev: try it",
    ] {
        let line = line_with(&logs, needle);
        assert!(line.contains(" INFO "), "at INFO: {line}");
    }
    assert!(
        !logs.iter().any(|l| l.contains(" WARN ")),
        "nothing to warn about: {logs:#?}"
    );
    // The command, pasted as printed, lists the example server's tools and the feedback tools.
    let tried = line_with(&logs, "--dev: try it");
    let command = &tried[tried.find("curl ").unwrap()..];
    assert!(
        command.starts_with(&format!("curl -s {} ", sc.url())),
        "{command}"
    );
    let names = tool_names(&run_pasted(command));
    assert!(
        names.contains(&"search_help".to_owned())
            && names.contains(&"report_product_feedback".to_owned()),
        "{names:?}"
    );
}

/// With authorization on, `--dev` says what a request needs and its command to try sends the
/// token in `$TOKEN`: pasted as printed it lists the tools with a token, and gets the 401
/// challenge without one.
#[tokio::test]
async fn with_authorization_on_dev_says_how_to_call_with_a_token() {
    use crate::support::auth::{AuthOptions, AuthServer};
    let (port, resource) = crate::auth::resource();
    let auth = AuthServer::start(AuthOptions::for_resource(&resource));
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("r.jsonl");
    let listen = format!("127.0.0.1:{port}");
    let sc = start(&[
        ("EPODE_SIDECAR_DEV", "1"),
        ("EPODE_SIDECAR_DEV_LOG", record.to_str().unwrap()),
        ("EPODE_SIDECAR_LISTEN", &listen),
        ("EPODE_SIDECAR_AUTH", "jwt"),
        ("EPODE_SIDECAR_AUTH_ISSUER", auth.issuer()),
        ("EPODE_SIDECAR_AUTH_RESOURCE", &resource),
        ("EPODE_SIDECAR_AUTH_SCOPES", "mcp:tools"),
    ]);
    let mut logs = Vec::new();
    wait_logs(&sc, &mut logs, |l| {
        l.iter().any(|l| l.contains("--dev: try it"))
    });
    let said = line_with(&logs, "--dev: authorization is on");
    assert!(
        said.contains(auth.issuer()) && said.contains(&resource) && said.contains("mcp:tools"),
        "{said}"
    );
    let tried = line_with(&logs, "--dev: try it");
    let command = tried[tried.find("curl ").unwrap()..].to_owned();
    assert!(
        command.contains(r#"-H "authorization: Bearer $TOKEN""#),
        "{command}"
    );
    let token = auth.client_credentials("mcp:tools", Some(&resource)).await;
    let with = {
        let command = command.clone();
        tokio::task::spawn_blocking(move || {
            Command::new("sh")
                .arg("-c")
                .arg(&command)
                .env("TOKEN", token)
                .output()
                .unwrap()
        })
    };
    let out = with.await.unwrap();
    let answer: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stdout)));
    assert!(
        tool_names(&answer).contains(&"search_help".to_owned()),
        "{answer}"
    );
    // Pasted with no token, the empty bearer is refused, saying what is missing.
    let without = tokio::task::spawn_blocking(move || {
        Command::new("sh")
            .arg("-c")
            .arg(command.replace("curl -s ", "curl -s -w ' %{http_code}' "))
            .env_remove("TOKEN")
            .output()
            .unwrap()
    });
    let out = without.await.unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.ends_with(" 400") && said.contains("Bearer"), "{said}");
}

#[tokio::test]
async fn a_record_that_cannot_be_written_goes_to_the_temporary_directory_or_nowhere_and_says_so() {
    // /proc takes no new file, whoever asks: as the filesystem of a read-only container.
    let unwritable = "/proc/epode-dev.jsonl";
    let tmp = tempfile::tempdir().unwrap();
    let tmp_dir = tmp.path().to_str().unwrap();
    let sc = start(&[
        ("EPODE_SIDECAR_DEV", "1"),
        ("EPODE_SIDECAR_DEV_LOG", unwritable),
        ("TMPDIR", tmp_dir),
    ]);
    let mut logs = Vec::new();
    wait_logs(&sc, &mut logs, |l| {
        l.iter().any(|l| l.contains("--dev: try it"))
    });
    let fallback = tmp.path().join("epode-dev.jsonl");
    let said = line_with(&logs, "cannot write the record at /proc/epode-dev.jsonl");
    assert!(
        said.contains(&format!("it goes to {} instead", fallback.display()))
            && said.contains("EPODE_SIDECAR_DEV_LOG")
            && said.contains("--tmpfs"),
        "{said}"
    );
    let on = line_with(&logs, "--dev: the local trial is on");
    assert!(
        on.contains(&format!("appended to {}", fallback.display())),
        "{on}"
    );
    let handle = product_call(&sc);
    assert_eq!(
        report(&sc, &handle, SUMMARY)["structuredContent"]["accepted"],
        true
    );
    let recorded = std::fs::read_to_string(&fallback).unwrap();
    assert!(recorded.contains(SUMMARY), "{recorded}");
    drop(sc);

    // Nowhere writable: the trial still runs; the console alone shows what arrives.
    let sc = start(&[
        ("EPODE_SIDECAR_DEV", "1"),
        ("EPODE_SIDECAR_DEV_LOG", unwritable),
        ("TMPDIR", "/proc"),
    ]);
    let mut logs = Vec::new();
    wait_logs(&sc, &mut logs, |l| {
        l.iter().any(|l| l.contains("--dev: try it"))
    });
    let said = line_with(&logs, "cannot write the record at /proc/epode-dev.jsonl");
    assert!(
        said.contains("no record is kept")
            && said.contains("EPODE_SIDECAR_DEV_LOG")
            && said.contains("--tmpfs"),
        "{said}"
    );
    let handle = product_call(&sc);
    assert_eq!(
        report(&sc, &handle, SUMMARY)["structuredContent"]["accepted"],
        true
    );
    let events = console_events(&sc, |e| e.iter().any(|e| e["kind"] == "report")).await;
    let shown = events.iter().find(|e| e["kind"] == "report").unwrap();
    assert_eq!(shown["report"]["summary"], SUMMARY);
}

/// A product call's interaction, as the feedback event on the console names it.
fn interaction_of(events: &[Value], tool: &str) -> String {
    events
        .iter()
        .find(|e| e["kind"] == "feedback" && e["tool"] == tool)
        .and_then(|e| e["interactionId"].as_str())
        .unwrap_or_else(|| panic!("no feedback event for {tool}: {events:#?}"))
        .to_owned()
}

const LEAKY: &str = "Mail the results to someone@example.com afterwards";
const SECOND: &str = "A second opinion on the same interaction, sent again.";

/// What a product owner should see: one interaction with every kind of report outcome (a
/// forged handle, invalid arguments, a report the service refuses, one accepted, a duplicate)
/// and a product call that fails. Returns the search_help call's handle.
fn outcomes(sc: &Sidecar) -> String {
    let handle = product_call(sc);
    let forged = report(sc, "afr2_forged.e30.AAAA", SUMMARY);
    assert_eq!(forged["isError"], true, "{forged}");
    let args = json!({"feedbackHandle": handle, "impact": "helped"});
    let invalid = ts_call(
        &sc.url(),
        "pin",
        Some(("report_product_feedback", &args)),
        &[],
    );
    assert_eq!(invalid["result"]["isError"], true, "{invalid}");
    assert_eq!(report(sc, &handle, LEAKY)["isError"], true);
    for summary in [SUMMARY, SECOND] {
        let r = report(sc, &handle, summary);
        assert_eq!(r["structuredContent"]["accepted"], true, "{r}");
    }
    let failing = ts_call(
        &sc.url(),
        "pin",
        Some(("get_order", &json!({"order_id": "Z-0"}))),
        &[],
    );
    assert_eq!(failing["result"]["isError"], true, "{failing}");
    handle
}

#[tokio::test]
async fn the_console_stream_tells_outcomes_errors_refusals_and_duplicates_per_interaction() {
    let dir = tempfile::tempdir().unwrap();
    let sc = dev(&dir.path().join("r.jsonl"));
    outcomes(&sc);
    let events = console_events(&sc, |events| {
        events.iter().any(|e| e["duplicate"] == true)
            && events
                .iter()
                .any(|e| e["kind"] == "call" && e["tool"] == "get_order")
    })
    .await;
    let id = interaction_of(&events, "search_help");
    let calls = |tool: &str| -> Vec<&Value> {
        events
            .iter()
            .filter(|e| e["kind"] == "call" && e["tool"] == tool)
            .collect()
    };
    let product = calls("search_help");
    assert_eq!(product[0]["interactionId"], id.as_str(), "{product:?}");
    assert_eq!(product[0]["isError"], false);
    let failed = calls("get_order");
    assert_eq!(failed[0]["isError"], true, "{failed:?}");
    assert!(failed[0]["interactionId"].is_string() && failed[0]["interactionId"] != id.as_str());

    // The feedback tool's calls: outcome, isError, and the interaction when the handle is ours.
    let reported: Vec<(&str, bool, Option<&str>)> = calls("report_product_feedback")
        .iter()
        .map(|c| {
            (
                c["outcome"].as_str().unwrap_or("-"),
                c["isError"] == true,
                c["interactionId"].as_str(),
            )
        })
        .collect();
    let i = Some(id.as_str());
    assert_eq!(
        reported,
        [
            ("invalid_handle", true, None),
            ("invalid_arguments", true, i),
            ("refused", true, i),
            ("accepted", false, i),
            ("accepted", false, i),
        ]
    );

    assert_reports(&events, &id);
    assert_durations(&sc, &events);
}

/// The console's report events of [`outcomes`]: who refused which and why, the duplicate
/// flagged; all but the forged handle's in interaction `id`.
fn assert_reports(events: &[Value], id: &str) {
    let i = Some(id);
    let reports: Vec<&Value> = events.iter().filter(|e| e["kind"] == "report").collect();
    assert_eq!(reports.len(), 5, "{reports:#?}");
    fn refused_by(r: &Value) -> (Option<&str>, Option<&str>) {
        (r["by"].as_str(), r["interactionId"].as_str())
    }
    assert_eq!(refused_by(reports[0]), (Some("sidecar"), None));
    let why = reports[0]["refused"].as_str().unwrap();
    assert!(why.starts_with("bad feedback handle: "), "{why}");
    assert_eq!(refused_by(reports[1]), (Some("sidecar"), i));
    let why = reports[1]["refused"].as_str().unwrap();
    assert!(
        why.contains("Invalid arguments") && why.contains("summary"),
        "{why}"
    );
    assert_eq!(refused_by(reports[2]), (Some("embedded Epode"), i));
    assert_eq!(reports[2]["status"], 400);
    assert!(reports[2]["refused"]
        .as_str()
        .unwrap()
        .contains("sensitive data"));
    assert_eq!(
        (
            reports[3]["report"]["summary"].as_str(),
            reports[3]["duplicate"].as_bool()
        ),
        (Some(SUMMARY), None)
    );
    assert_eq!(reports[4]["duplicate"], true);
    assert_eq!(reports[4]["report"]["summary"], SECOND);
    assert_eq!(reports[4]["stands"]["summary"], SUMMARY);
}

/// Durations to a tenth of a millisecond, on the console and in the access log.
fn assert_durations(sc: &Sidecar, events: &[Value]) {
    let tenth = |text: &str| {
        let (whole, frac) = text.split_once('.').unwrap_or((text, "0"));
        !whole.is_empty() && whole.chars().all(|c| c.is_ascii_digit()) && frac.len() == 1
    };
    for c in events.iter().filter(|e| e["kind"] == "call") {
        assert!(tenth(&c["durationMs"].to_string()), "{c}");
    }
    let mut logs = Vec::new();
    wait_logs(sc, &mut logs, |l| {
        l.iter()
            .filter(|l| l.contains("epode_sidecar::access"))
            .count()
            >= 8
    });
    for l in logs.iter().filter(|l| l.contains("epode_sidecar::access")) {
        let d = l
            .split("duration_ms=")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap();
        assert!(tenth(d), "{l}");
    }
}

#[tokio::test]
async fn a_tool_call_answered_as_a_stream_shows_with_its_result_and_interaction() {
    let dir = tempfile::tempdir().unwrap();
    let sc = dev(&dir.path().join("r.jsonl"));
    // Progress makes the example server answer as a stream; the result comes at its end.
    let mut body = modern_body(
        json!(1),
        "tools/call",
        json!({"name": "export_orders", "arguments": {"batches": 2}}),
    );
    body["params"]["_meta"]["progressToken"] = json!("p1");
    let resp = post_modern(&sc.url(), "tools/call", Some("export_orders"), &body).await;
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let text = resp.text().await.unwrap();
    assert!(
        text.contains("notifications/progress") && text.contains("_agentFeedback"),
        "{text}"
    );
    let events = console_events(&sc, |e| {
        e.iter()
            .any(|e| e["kind"] == "call" && e["tool"] == "export_orders")
    })
    .await;
    let call = events
        .iter()
        .find(|e| e["kind"] == "call" && e["tool"] == "export_orders")
        .unwrap();
    assert_eq!(call["isError"], false, "{call}");
    assert_eq!(
        call["interactionId"],
        interaction_of(&events, "export_orders").as_str(),
        "{call}"
    );
}

/// Opens the console in Chromium (`tests/peers/console_check.mjs`), waits for READY, runs
/// `then`, and returns the page's verdict once every text showed.
fn in_chromium(sc: &Sidecar, shot: &str, texts: &[&str], then: impl FnOnce()) -> Value {
    let shot = repo_root().join("target").join(shot);
    let _ = std::fs::remove_file(&shot);
    let browser = Command::new("node")
        .arg(peers_dir().join("ts/console_check.mjs"))
        .arg(format!("{}/_dev/", sc.base()))
        .arg(&shot)
        .args(texts)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut browser = Proc {
        child: browser,
        name: "console_check".into(),
    };
    let mut out = BufReader::new(browser.child.stdout.take().unwrap()).lines();
    let first = out.next().unwrap().unwrap();
    assert_eq!(first, "READY", "{first}");
    then();
    let verdict: Value = serde_json::from_str(&out.next().unwrap().unwrap()).unwrap();
    let status = browser.child.wait().unwrap();
    assert!(status.success(), "{verdict:#}");
    verdict
}

#[test]
fn the_empty_console_shows_the_endpoint_and_a_call_to_copy_that_works() {
    let dir = tempfile::tempdir().unwrap();
    let sc = dev(&dir.path().join("r.jsonl"));
    let verdict = in_chromium(&sc, "console-empty.png", &[], || {});
    let empty = &verdict["empty"];
    assert_eq!(empty["shown"], true, "{verdict:#}");
    assert_eq!(empty["endpoint"], sc.url().as_str(), "{verdict:#}");
    let command = empty["try"].as_str().unwrap();
    assert!(
        command.starts_with(&format!("curl -s {} ", sc.url())),
        "{command}"
    );
    let names = tool_names(&run_pasted(command));
    assert!(names.contains(&"search_help".to_owned()), "{names:?}");
}

#[test]
fn the_console_page_groups_each_interaction_with_its_outcomes_refusals_and_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let sc = dev(&dir.path().join("r.jsonl"));
    let texts = [
        "the first one stands",
        "sensitive data",
        "bad feedback handle",
        "Input validation error",
        "delivery accepted",
        "get_order",
    ];
    let verdict = in_chromium(&sc, "console-outcomes.png", &texts, || {
        outcomes(&sc);
    });
    let low = |v: &Value| v.as_str().unwrap_or_default().to_lowercase();
    let groups = verdict["groups"].as_array().unwrap();
    let rows_of = |pred: &dyn Fn(&[String]) -> bool| -> Vec<String> {
        groups
            .iter()
            .map(|g| {
                g["rows"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(low)
                    .collect::<Vec<_>>()
            })
            .find(|rows| pred(rows))
            .unwrap_or_else(|| panic!("no such group: {verdict:#}"))
    };
    // The search_help interaction: its call first, then what it led to, all in one group.
    assert_interaction_rows(&rows_of(&|rows| {
        rows.iter().any(|r| r.contains("search_help"))
    }));
    // The failing product call: its own group, isError shown.
    let rows = rows_of(&|rows| rows.iter().any(|r| r.contains("get_order")));
    assert!(
        rows.iter()
            .any(|r| r.starts_with("call") && r.contains("iserror true")),
        "{rows:#?}"
    );
    // The forged handle names no interaction: its call and refusal stand alone.
    let loose: Vec<String> = verdict["loose"]
        .as_array()
        .unwrap()
        .iter()
        .map(low)
        .collect();
    assert!(
        loose
            .iter()
            .any(|r| r.starts_with("report refused") && r.contains("bad feedback handle")),
        "{loose:#?}"
    );
    assert!(
        loose
            .iter()
            .any(|r| r.starts_with("call") && r.contains("outcome invalid_handle")),
        "{loose:#?}"
    );
}

/// The rows (lower case) of the search_help interaction of [`outcomes`] on the page: its call
/// first, then what it led to.
fn assert_interaction_rows(rows: &[String]) {
    // Each call before what it led to; the telemetry event whenever its batch was delivered.
    let summary = SUMMARY.to_lowercase();
    let second = SECOND.to_lowercase();
    let expected: [&[&str]; 10] = [
        &["call", "search_help", "iserror false"],
        &["_agentfeedback", "feedback_ready", "iserror false"],
        &[
            "call",
            "report_product_feedback",
            "outcome invalid_arguments",
            "iserror true",
        ],
        &["report refused", "by sidecar", "input validation error"],
        &[
            "call",
            "report_product_feedback",
            "outcome refused",
            "iserror true",
        ],
        &["report refused", "by embedded epode", "sensitive data"],
        &[
            "call",
            "report_product_feedback",
            "outcome accepted",
            "iserror false",
        ],
        &["report", "impact helped", &summary],
        &[
            "call",
            "report_product_feedback",
            "outcome accepted",
            "iserror false",
        ],
        &["duplicate report", "the first one stands", &second],
    ];
    let (telemetry, others): (Vec<&String>, Vec<&String>) =
        rows.iter().partition(|r| r.starts_with("telemetry"));
    assert!(
        telemetry.len() == 1 && telemetry[0].contains("delivery accepted"),
        "{rows:#?}"
    );
    assert_eq!(others.len(), expected.len(), "{rows:#?}");
    for (row, words) in others.iter().zip(expected) {
        assert!(
            row.starts_with(words[0]) && words.iter().all(|w| row.contains(w)),
            "{words:?} in order: {rows:#?}"
        );
    }
}

/// The README's "your own Python server" blocks (server.py, client.py), its commands checked.
fn readme_own_server() -> (String, String) {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let block = |first: &str| -> String {
        let start = readme
            .find(&format!("```python\n{first}"))
            .unwrap_or_else(|| panic!("no python block starting {first:?} in the README"))
            + "```python\n".len();
        let len = readme[start..].find("\n```").unwrap();
        readme[start..start + len + 1].to_owned()
    };
    let (server, client) = (block("# server.py\n"), block("# client.py"));
    for command in [
        "target/release/epode-sidecar --dev -- python server.py ",
        "python server.py --http &",
        "target/release/epode-sidecar --dev --upstream http://127.0.0.1:8000/mcp ",
        "python client.py ",
    ] {
        assert!(readme.contains(command), "{command}");
    }
    (server, client)
}

#[test]
fn the_readme_python_server_and_client_work_as_written_over_stdio_and_http() {
    let (server, client) = readme_own_server();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    assert!(server.contains("port=8000"), "{server}");
    let server_py = dir.path().join("server.py");
    std::fs::write(
        &server_py,
        server.replace("port=8000", &format!("port={port}")),
    )
    .unwrap();
    let run_client = |sc: &Sidecar| {
        assert!(client.contains("\"http://127.0.0.1:8080/mcp\""), "{client}");
        let client_py = dir.path().join("client.py");
        std::fs::write(
            &client_py,
            client.replace("http://127.0.0.1:8080/mcp", &sc.url()),
        )
        .unwrap();
        let out = Command::new(python()).arg(&client_py).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let printed = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(
            printed.lines().collect::<Vec<_>>(),
            ["Hello, Ada! feedback_ready", "report accepted: True"],
            "{printed}"
        );
    };
    let record = dir.path().join("r.jsonl");
    let dev_env = [
        ("EPODE_SIDECAR_DEV", "1"),
        ("EPODE_SIDECAR_DEV_LOG", record.to_str().unwrap()),
    ];

    // stdio: the sidecar runs the server.
    let python_path = python().display().to_string();
    let sc = Sidecar::start_stdio(&[&python_path, server_py.to_str().unwrap()], &dev_env);
    run_client(&sc);
    drop(sc);

    // HTTP: the server on its port, the sidecar in front.
    let mut http_server = Proc {
        child: Command::new(python())
            .arg(&server_py)
            .arg("--http")
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
        name: "server.py --http".into(),
    };
    wait_for_port(port, &mut http_server.child, "server.py --http");
    let sc = Sidecar::start(&format!("http://127.0.0.1:{port}/mcp"), &dev_env);
    run_client(&sc);
}

/// `bash scripts/demo.sh` with only `tools` on its PATH (links in a temporary directory).
fn demo_with(tools: &[(&str, std::path::PathBuf)]) -> (Option<i32>, String, Duration) {
    let bin = tempfile::tempdir().unwrap();
    for (name, target) in tools {
        std::os::unix::fs::symlink(target, bin.path().join(name)).unwrap();
    }
    let started = Instant::now();
    let out = Command::new(which("bash"))
        .arg(repo_root().join("scripts/demo.sh"))
        .env_clear()
        .env("PATH", bin.path())
        .env("EPODE_PEERS_DIR", bin.path().join("peers"))
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        started.elapsed(),
    )
}

fn which(program: &str) -> std::path::PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("no {program} on PATH"))
}

#[test]
fn the_demo_refuses_at_once_with_one_line_naming_what_is_missing() {
    // A real Python (not a shim that needs a PATH of its own), and a cargo that only says it ran.
    let real_python = Command::new(which("python3"))
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .unwrap();
    let real_python =
        std::path::PathBuf::from(String::from_utf8(real_python.stdout).unwrap().trim());
    let fake = tempfile::tempdir().unwrap();
    let ran = fake.path().join("cargo-ran");
    let cargo = fake.path().join("cargo");
    std::fs::write(&cargo, format!("#!/bin/sh\n: > '{}'\n", ran.display())).unwrap();
    std::fs::set_permissions(&cargo, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let dirname = ("dirname", which("dirname"));
    let bash = ("bash", which("bash"));

    let cases = [
        (
            vec![bash.clone(), dirname.clone(), ("python3", real_python)],
            &["Rust's cargo", "https://rustup.rs"][..],
        ),
        (
            vec![bash.clone(), dirname.clone(), ("cargo", cargo.clone())],
            &["python3", "Python 3.10 or newer", "python.org"],
        ),
        (
            vec![bash, dirname],
            &["Rust's cargo", "https://rustup.rs", "python3"],
        ),
    ];
    for (tools, named) in cases {
        let (code, err, took) = demo_with(&tools);
        assert_eq!(code, Some(1), "{err}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "one line: {err}");
        assert!(
            lines[0].starts_with("demo: cannot start: missing "),
            "{err}"
        );
        for n in named {
            assert!(lines[0].contains(n), "{n:?} in {err}");
        }
        // At once: nothing was installed or built (the first build takes minutes).
        assert!(took < Duration::from_secs(30), "{took:?}");
        assert!(!ran.exists(), "cargo was run");
    }
}

/// Customer context with `--dev` over a stdio upstream: the embedded Epode takes the
/// enrichment request and the agent's answer, and the console shows each step under the
/// call's interaction.
#[tokio::test]
async fn customer_context_shows_its_request_and_answer_on_the_console() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("dev.jsonl");
    let sc = start(&[
        ("EPODE_SIDECAR_DEV", "1"),
        ("EPODE_SIDECAR_DEV_LOG", record.to_str().unwrap()),
        ("EPODE_SIDECAR_CUSTOMER_CONTEXT", "on"),
        ("EPODE_SIDECAR_CUSTOMER_CONTEXT_TOOLS", "search_*"),
    ]);
    let called = ts_call(
        &sc.url(),
        "pin",
        Some(("search_help", &json!({"query": "refund"}))),
        &[],
    );
    let c = called["result"]["structuredContent"]["_epode"]["customerContext"].clone();
    assert_eq!(c["state"], "answer_ready", "{called}");
    let handle = c["requestHandle"].as_str().unwrap().to_owned();
    let args = json!({"requestHandle": handle, "status": "answered",
        "items": [{"key": "content.topic_depth", "type": "preference", "value": "practical",
                   "provenance": "agent_reports_user_statement", "remember": false}]});
    let shared = ts_call(
        &sc.url(),
        "pin",
        Some(("share_customer_context", &args)),
        &[],
    );
    assert_eq!(shared["result"]["isError"], false, "{shared}");
    let id = c["interactionId"].as_str().unwrap().to_owned();
    let events = console_events(&sc, |evs| {
        evs.iter()
            .any(|e| e["kind"] == "context" && e["step"] == "answer")
    })
    .await;
    let steps: Vec<&str> = events
        .iter()
        .filter(|e| e["kind"] == "context" && e["interactionId"] == id.as_str())
        .filter_map(|e| e["step"].as_str())
        .collect();
    assert_eq!(steps, ["request", "answer"], "{events:?}");
    let recorded = std::fs::read_to_string(&record).unwrap();
    assert!(recorded.contains("\"kind\":\"enrichment\""), "{recorded}");
    assert!(
        !recorded.contains(&handle),
        "the handle is a credential: never recorded"
    );
}
