//! A 2025-era server's questions, wherever it asks them, reach the clients people run through
//! the sidecar, over HTTP: sampling, roots and elicitation, asked on the call's own stream
//! (`related_request_id`) and on the session's GET stream (the Python SDK's `list_roots()`,
//! `create_message()` without a related request), by the Python `mcp` 2.3.0 server and by
//! FastMCP 4.1.6, with `EPODE_SIDECAR_UPSTREAM_PROTOCOL=2025-11-25`; answered by the Python
//! client in both its modes (2026 `auto`, 2025 `legacy`), the TypeScript v2 client pinned to
//! 2026-07-28 and FastMCP's own client, each with its callbacks. A question nobody can answer
//! ends its call within the upstream timeout and a second.

use std::time::{Duration, Instant};

use futures_util::stream::StreamExt;
use serde_json::{json, Value};

use crate::support::{
    modern_body, peers_dir, post_modern, python, repo_root, Sidecar, Upstream, UpstreamKind,
};

/// The clients, each an official SDK's (or FastMCP's) with its question callbacks.
#[derive(Clone, Copy, Debug)]
enum Asked {
    /// The Python `mcp` client in `auto` mode: a 2026-07-28 client.
    PyModern,
    /// The Python `mcp` client in `legacy` mode: a 2025-11-25 client.
    PyLegacy,
    /// The TypeScript v2 client pinned to 2026-07-28.
    TsPinned,
    /// FastMCP's `Client` (auto: 2026-07-28).
    FastMcp,
}

const CLIENTS: [Asked; 4] = [
    Asked::PyModern,
    Asked::PyLegacy,
    Asked::TsPinned,
    Asked::FastMcp,
];

/// Calls `tool` through `url` as `who` (a caller of its own: `bearer`), answering with 7:
/// the tool's text, and the methods the client was asked.
async fn ask(who: Asked, url: String, tool: &'static str, bearer: String) -> (String, Value) {
    let out = tokio::task::spawn_blocking(move || {
        let mut cmd = match who {
            Asked::PyModern | Asked::PyLegacy => {
                let mut c = std::process::Command::new(python());
                c.arg(repo_root().join("tests/peers/py_asked.py"));
                let mode = if matches!(who, Asked::PyModern) {
                    "auto"
                } else {
                    "legacy"
                };
                c.args([url.as_str(), tool, "--mode", mode]);
                c
            }
            Asked::FastMcp => {
                let mut c = std::process::Command::new(python());
                c.arg(repo_root().join("tests/peers/fastmcp_asked.py"));
                c.args([url.as_str(), tool, "--mode", "auto"]);
                c
            }
            Asked::TsPinned => {
                let mut c = std::process::Command::new("node");
                c.arg(peers_dir().join("ts/ts_call.mjs"));
                c.args([url.as_str(), "pin", "call", tool, "{}"]);
                c
            }
        };
        match who {
            Asked::TsPinned => cmd
                .args(["--answer", "7", "--header"])
                .arg(format!("Authorization: Bearer {bearer}")),
            _ => cmd.args(["--value", "7", "--bearer", &bearer]),
        };
        cmd.output().unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let got: Value = serde_json::from_str(stdout.trim().lines().last().unwrap_or_default())
        .unwrap_or_else(|_| {
            panic!(
                "{who:?} {tool}: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let text = match who {
        Asked::TsPinned => got["result"]["content"][0]["text"].as_str(),
        _ => got["text"].as_str(),
    };
    let text = text.unwrap_or_else(|| panic!("{who:?} {tool}: {got}"));
    (text.to_owned(), got["asked"].clone())
}

/// Every client asks every tool (8 at a time, each a caller of its own, so no question of
/// one can be routed to another's call): what each tool answers, and what it asks.
async fn every_client_answers(url: &str, tools: &[(&'static str, &str, &str)]) {
    let runs: Vec<(Asked, &'static str, &str, &str)> = CLIENTS
        .iter()
        .flat_map(|c| {
            tools
                .iter()
                .map(move |(t, text, asked)| (*c, *t, *text, *asked))
        })
        .collect();
    let results = futures_util::stream::iter(runs.iter().enumerate())
        .map(|(i, (who, tool, _, _))| ask(*who, url.to_owned(), tool, format!("client-{i}")))
        .buffered(8)
        .collect::<Vec<_>>()
        .await;
    let mut failed = Vec::new();
    for ((who, tool, text, asked), (got, methods)) in runs.iter().zip(results) {
        if !got.starts_with(text) || methods != json!([asked]) {
            failed.push(format!("{who:?} {tool}: {got:?}, asked {methods}"));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// The Python `mcp` 2.3.0 server (stateful, 2025): its tools ask on the call's stream
/// (`ask_count`, `sample`, `roots_call`) and on the session's GET stream (`ask_unrelated`,
/// `sample_unrelated`, `roots`), and every client of either era is asked and answers.
#[tokio::test]
async fn the_python_sdks_questions_on_every_stream_reach_every_client() {
    let up = Upstream::start_with(UpstreamKind::Python, &["--questions", "--era", "2025"]);
    let sc = Sidecar::start(
        &up.url(),
        &[("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2025-11-25")],
    );
    every_client_answers(
        &sc.url(),
        &[
            ("ask_count", "count 7", "elicitation/create"),
            ("sample", "sampled: sampled by", "sampling/createMessage"),
            ("roots_call", "1 roots: file:///", "roots/list"),
            ("ask_unrelated", "count 7", "elicitation/create"),
            (
                "sample_unrelated",
                "sampled: sampled by",
                "sampling/createMessage",
            ),
            ("roots", "1 roots: file:///", "roots/list"),
        ],
    )
    .await;
}

/// The same with FastMCP 4.1.6 as the server: `party` (`ctx.elicit`), `sample_call`,
/// `roots_call` on the call's stream; `ask_unrelated`, `sample_unrelated`,
/// `roots_unrelated` on the GET stream. One setting serves both eras of client.
#[tokio::test]
async fn fastmcps_questions_on_every_stream_reach_every_client() {
    let up = Upstream::start(UpstreamKind::FastMcp);
    let sc = Sidecar::start(
        &up.url(),
        &[("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2025-11-25")],
    );
    every_client_answers(
        &sc.url(),
        &[
            ("party", "party for 7", "elicitation/create"),
            (
                "sample_call",
                "sampled: sampled by",
                "sampling/createMessage",
            ),
            ("roots_call", "1 roots: file:///", "roots/list"),
            ("ask_unrelated", "count 7", "elicitation/create"),
            (
                "sample_unrelated",
                "sampled: sampled by",
                "sampling/createMessage",
            ),
            ("roots_unrelated", "1 roots: file:///", "roots/list"),
        ],
    )
    .await;
}

/// A question nobody can answer ends its call within the upstream timeout and a second: on
/// the GET stream of a client that declared no capability (the server hears -32601 at once),
/// and on the GET stream of a server whose answers are JSON (no stream to ask on: the
/// question is declined once the call has not taken it).
#[tokio::test]
async fn a_question_nobody_can_answer_ends_its_call_in_time() {
    let timeout = ("EPODE_SIDECAR_UPSTREAM_TIMEOUT", "5s");
    let pinned = ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2025-11-25");
    let call = |url: String, tool: &'static str, id: u64| async move {
        let body = modern_body(
            json!(id),
            "tools/call",
            json!({"name": tool, "arguments": {}}),
        );
        let started = Instant::now();
        let resp = post_modern(&url, "tools/call", Some(tool), &body).await;
        let msg = crate::support::message_of(resp).await;
        (started.elapsed(), msg)
    };
    let up = Upstream::start_with(UpstreamKind::Python, &["--questions", "--era", "2025"]);
    let sc = Sidecar::start(&up.url(), &[pinned, timeout]);
    for (i, tool) in ["roots", "sample_unrelated", "ask_unrelated"]
        .into_iter()
        .enumerate()
    {
        let (took, msg) = call(sc.url(), tool, i as u64).await;
        assert!(took < Duration::from_secs(6), "{tool}: {took:?}");
        // The server's own answer to the error it heard: a JSON-RPC error (the SDK lets it
        // through), never a wait.
        let said = msg["error"]["message"].as_str().unwrap_or_default();
        assert!(said.contains("asked of nobody"), "{tool}: {msg}");
    }
    let json_up = Upstream::start_with(
        UpstreamKind::Python,
        &["--questions", "--era", "2025", "--json", "--stateful"],
    );
    let sc = Sidecar::start(&json_up.url(), &[pinned, timeout]);
    let mut body = modern_body(
        json!(9),
        "tools/call",
        json!({"name": "roots", "arguments": {}}),
    );
    body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] = json!({"roots": {}});
    let started = Instant::now();
    let resp = post_modern(&sc.url(), "tools/call", Some("roots"), &body).await;
    let msg = crate::support::message_of(resp).await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(6), "{took:?}: {msg}");
    assert_eq!(msg["id"], 9, "{msg}");
    let said = msg["error"]["message"].as_str().unwrap_or_default();
    assert!(said.contains("did not take it"), "{msg}");
}

/// A retry's `inputResponses` and `requestState` are typed as the 2026 schema types them:
/// `null`, a number or a string where the answers go (or a state that is no string) is
/// refused with -32602 naming the field, in front of a 2025 upstream too (before, `null`
/// started a new round).
#[tokio::test]
async fn a_retrys_answers_of_the_wrong_type_are_refused_before_anything_goes_upstream() {
    let up = Upstream::start_with(UpstreamKind::Python, &["--questions", "--era", "2025"]);
    let sc = Sidecar::start(
        &up.url(),
        &[("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2025-11-25")],
    );
    for (i, (field, value)) in [
        ("inputResponses", json!(null)),
        ("inputResponses", json!(42)),
        ("inputResponses", json!("x")),
        ("inputResponses", json!({"q0": 7})),
        ("requestState", json!(7)),
    ]
    .into_iter()
    .enumerate()
    {
        let mut params = json!({"name": "ask_count", "arguments": {}});
        params[field] = value.clone();
        let body = modern_body(json!(i), "tools/call", params);
        let resp = post_modern(&sc.url(), "tools/call", Some("ask_count"), &body).await;
        let msg = crate::support::message_of(resp).await;
        assert_eq!(msg["id"], i, "{field} {value}: {msg}");
        assert_eq!(msg["error"]["code"], -32602, "{field} {value}: {msg}");
        let said = msg["error"]["message"].as_str().unwrap_or_default();
        assert!(said.contains(field), "{field} {value}: {said}");
    }
}
