//! Secrets in the configuration never reach what the sidecar writes: the product key (in its
//! own setting, or put in a wrong one) and a secret in the upstream URL's query are looked for
//! in every line it writes: its output from start to exit, `--check-config`, configuration
//! errors at start and in `--check-config`, `/readyz` on both ports, `/metrics`, an MCP error,
//! and with `--dev` the console's page and its event stream.

use std::io::Read as _;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::fake_epode::{FakeConfig, FakeEpode};
use crate::support::*;
use futures_util::StreamExt as _;
use serde_json::{json, Value};

/// The secret part of the key below; no line may hold it.
const TAIL: &str = "KeyTailNeverPrinted4242";
const QUERY_SECRET: &str = "QUERYSECRET";

fn key() -> String {
    format!("af_live_{}_{TAIL}", "0123456789abcdef".repeat(2))
}

/// Whether `text` holds a product key (`af_live_` and hex, as every key starts): the `--dev`
/// key is made at start, so it is looked for by its shape.
fn holds_a_key(text: &str) -> bool {
    text.match_indices("af_live_").any(|(at, m)| {
        text[at + m.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_hexdigit())
    })
}

#[track_caller]
fn assert_clean(what: &str, text: &str) {
    assert!(
        !text.contains(TAIL) && !text.contains(QUERY_SECRET) && !holds_a_key(text),
        "{what} shows a secret:\n{text}"
    );
}

/// The sidecar binary with only `env`; everything it writes on stdout and stderr is kept.
struct Run {
    child: Child,
    written: Arc<Mutex<String>>,
}

impl Run {
    fn start(env: &[(&str, &str)], args: &[&str]) -> Run {
        let mut child = Command::new(env!("CARGO_BIN_EXE_epode-sidecar"))
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(env.iter().copied())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let written = Arc::new(Mutex::new(String::new()));
        let mut out = child.stdout.take().unwrap();
        let mut err = child.stderr.take().unwrap();
        for mut pipe in [
            Box::new(move |b: &mut [u8]| out.read(b)) as Box<dyn FnMut(&mut [u8]) -> _ + Send>,
            Box::new(move |b: &mut [u8]| err.read(b)),
        ] {
            let written = written.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = pipe(&mut buf) {
                    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                    written.lock().unwrap().push_str(&text);
                }
            });
        }
        Run { child, written }
    }

    fn written(&self) -> String {
        self.written.lock().unwrap().clone()
    }

    /// The address after `prefix` in a line it wrote (`epode-sidecar listening on `).
    fn address(&self, prefix: &str) -> std::net::SocketAddr {
        let mut found = None;
        eventually(Duration::from_secs(20), || {
            found = self
                .written()
                .lines()
                .find_map(|l| l.strip_prefix(prefix)?.trim().parse().ok());
            found.is_some()
        });
        found.unwrap_or_else(|| panic!("no `{prefix}` line:\n{}", self.written()))
    }

    /// Stops it (SIGTERM), waits for it to exit, and returns all it wrote.
    fn finish(self) -> String {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        self.exit().1
    }

    /// Waits for it to exit (by itself: a refused configuration, `--check-config`): its exit
    /// code and all it wrote.
    fn exit(mut self) -> (Option<i32>, String) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "still running:\n{}",
                self.written()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        // The readers hold the text until their pipes end, with the process.
        let readers_done = eventually(Duration::from_secs(10), || {
            Arc::strong_count(&self.written) == 1
        });
        assert!(readers_done, "the output pipes stayed open");
        (status.code(), self.written())
    }
}

/// A refused configuration, at start and in `--check-config`: exit 2 both times, and all it
/// wrote each time.
fn refused(env: &[(&str, &str)], args: &[&str]) -> Vec<String> {
    [false, true]
        .into_iter()
        .map(|check| {
            let mut all: Vec<&str> = args.to_vec();
            if check {
                all.insert(0, "--check-config");
            }
            let (code, text) = Run::start(env, &all).exit();
            assert_eq!(code, Some(2), "{env:?} {all:?}:\n{text}");
            text
        })
        .collect()
}

fn borrowed<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

async fn get(url: String) -> (u16, String) {
    let resp = http().get(url).send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

#[tokio::test]
async fn no_line_shows_the_key_or_a_query_secret() {
    let key = key();
    let epode = FakeEpode::start(FakeConfig::new(key.clone(), "never_ask"));
    let down = free_port().to_string();
    let upstream = format!("http://127.0.0.1:{down}/mcp?api_key={QUERY_SECRET}");
    let shown_upstream = format!("127.0.0.1:{down}/mcp?<redacted>");
    let env = |admin: bool| {
        let mut env = vec![
            ("EPODE_SIDECAR_UPSTREAM", upstream.clone()),
            ("EPODE_API_KEY", key.clone()),
            ("EPODE_API_URL", epode.url()),
            ("EPODE_SIDECAR_LISTEN", "127.0.0.1:0".to_owned()),
            ("EPODE_SIDECAR_LOG", "debug".to_owned()),
            ("EPODE_SIDECAR_ACCESS_LOG", "on".to_owned()),
            ("EPODE_SIDECAR_SHUTDOWN_GRACE", "0s".to_owned()),
        ];
        if admin {
            env.push(("EPODE_SIDECAR_ADMIN_LISTEN", "127.0.0.1:0".to_owned()));
        }
        env
    };
    // --check-config: the URL is there, redacted.
    let plain = env(false);
    let (code, text) = Run::start(&borrowed(&plain), &["--check-config"]).exit();
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains(&shown_upstream), "{text}");
    assert_clean("--check-config", &text);

    // Served without an admin listener: /readyz, /metrics and an MCP error on the MCP port.
    let run = Run::start(&borrowed(&plain), &[]);
    let base = format!("http://{}", run.address("epode-sidecar listening on "));
    let (status, ready) = get(format!("{base}/readyz")).await;
    assert_eq!(status, 503, "{ready}");
    assert!(ready.contains("unreachable"), "{ready}");
    assert!(
        !ready.contains(&down),
        "the MCP port names the upstream: {ready}"
    );
    let (status, metrics) = get(format!("{base}/metrics")).await;
    assert_eq!(status, 200);
    let call = post_modern(
        &format!("{base}/mcp"),
        "tools/list",
        None,
        &modern_body(json!(1), "tools/list", json!({})),
    )
    .await;
    let call = call.text().await.unwrap();
    assert!(call.contains("unreachable"), "{call}");
    let written = run.finish();
    assert!(
        written.contains(&shown_upstream),
        "no start line: {written}"
    );
    for (what, text) in [
        ("/readyz on the MCP port", &ready),
        ("/metrics", &metrics),
        ("the MCP error", &call),
        ("the output", &written),
    ] {
        assert_clean(what, text);
    }

    // With an admin listener: its /readyz says where, redacted.
    let admin = env(true);
    let run = Run::start(&borrowed(&admin), &[]);
    let admin_base = format!(
        "http://{}",
        run.address("epode-sidecar admin listening on ")
    );
    let (status, ready) = get(format!("{admin_base}/readyz")).await;
    assert_eq!(status, 503, "{ready}");
    let reason: Value = serde_json::from_str(&ready).unwrap();
    assert!(
        reason["reason"].as_str().unwrap().contains(&shown_upstream),
        "{ready}"
    );
    let (_, metrics) = get(format!("{admin_base}/metrics")).await;
    let written = run.finish();
    for (what, text) in [
        ("/readyz on the admin listener", &ready),
        ("/metrics on the admin listener", &metrics),
        ("the output", &written),
    ] {
        assert_clean(what, text);
    }

    // The key put in the wrong setting, at start and in --check-config.
    let good = [
        ("EPODE_SIDECAR_UPSTREAM", "http://127.0.0.1:1/mcp"),
        ("EPODE_API_KEY", key.as_str()),
    ];
    for name in [
        "EPODE_API_URL",
        "EPODE_SIDECAR_UPSTREAM",
        "AGENT_FEEDBACK_MODE",
        "EPODE_SIDECAR_LISTEN",
        "EPODE_SIDECAR_LOG",
        "EPODE_SIDECAR_SERVER_NAME",
    ] {
        let mut env = good.to_vec();
        env.retain(|(k, _)| *k != name);
        env.push((name, key.as_str()));
        for text in refused(&env, &[]) {
            assert!(text.contains(name), "{text}");
            assert_clean(&format!("the error for the key in {name}"), &text);
        }
    }
    // A refused upstream URL with a query secret.
    let with_fragment = format!("{upstream}#part");
    for (env, args) in [
        (
            vec![
                ("EPODE_SIDECAR_UPSTREAM", with_fragment.as_str()),
                ("AGENT_FEEDBACK_MODE", "off"),
            ],
            vec![],
        ),
        (
            vec![
                ("EPODE_SIDECAR_UPSTREAM", upstream.as_str()),
                ("AGENT_FEEDBACK_MODE", "off"),
            ],
            vec!["--", "python", "server.py"],
        ),
    ] {
        for text in refused(&env, &args) {
            assert!(text.contains("EPODE_SIDECAR_UPSTREAM"), "{text}");
            assert_clean("the error for the upstream URL", &text);
        }
    }
}

#[tokio::test]
async fn with_dev_no_line_nor_the_console_shows_a_key_or_a_query_secret() {
    let up = Upstream::start(UpstreamKind::Python);
    let upstream = format!("{}?api_key={QUERY_SECRET}", up.url());
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("dev.jsonl");
    let env = [
        ("EPODE_SIDECAR_UPSTREAM", upstream.as_str()),
        ("EPODE_SIDECAR_LISTEN", "127.0.0.1:0"),
        ("EPODE_SIDECAR_LOG", "debug"),
        ("EPODE_SIDECAR_ACCESS_LOG", "on"),
        ("EPODE_SIDECAR_DEV_LOG", record.to_str().unwrap()),
        ("EPODE_SIDECAR_SHUTDOWN_GRACE", "0s"),
    ];
    let (code, text) = Run::start(&env, &["--dev", "--check-config"]).exit();
    assert_eq!(code, Some(0), "{text}");
    assert_clean("--dev --check-config", &text);

    let run = Run::start(&env, &["--dev"]);
    let base = format!("http://{}", run.address("epode-sidecar listening on "));
    let mcp = format!("{base}/mcp");
    let listed = post_modern(
        &mcp,
        "tools/list",
        None,
        &modern_body(json!(1), "tools/list", json!({})),
    )
    .await
    .text()
    .await
    .unwrap();
    assert!(listed.contains("echo"), "{listed}");
    let called = post_modern(
        &mcp,
        "tools/call",
        Some("echo"),
        &modern_body(
            json!(2),
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "hello"}}),
        ),
    )
    .await
    .text()
    .await
    .unwrap();
    assert!(called.contains("feedbackHandle"), "{called}");
    let (status, page) = get(format!("{base}/_dev/")).await;
    assert_eq!(status, 200);
    // The console's stream, until it shows the call.
    let resp = http()
        .get(format!("{base}/_dev/events"))
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    let mut events = String::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !events.contains("\"echo\"") {
        assert!(
            Instant::now() < deadline,
            "the call is not on the console: {events}"
        );
        match tokio::time::timeout(Duration::from_secs(20), stream.next()).await {
            Ok(Some(Ok(chunk))) => events.push_str(&String::from_utf8_lossy(&chunk)),
            other => panic!("the console's stream ended: {other:?}\n{events}"),
        }
    }
    drop(stream);
    let (_, ready) = get(format!("{base}/readyz")).await;
    let (_, metrics) = get(format!("{base}/metrics")).await;
    let written = run.finish();
    let recorded = std::fs::read_to_string(&record).unwrap_or_default();
    for (what, text) in [
        ("the console page", &page),
        ("the console's events", &events),
        ("/readyz", &ready),
        ("/metrics", &metrics),
        ("the output", &written),
        ("the --dev record", &recorded),
    ] {
        assert_clean(what, text);
    }
    assert!(
        written.contains("mcp?<redacted>"),
        "no start line: {written}"
    );
}
