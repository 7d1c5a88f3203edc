//! Every refusal of the 2026-07-28 front door: exact HTTP status, JSON-RPC code and id, and
//! nothing sent upstream. The upstream here is a raw responder that counts what reaches it.

use crate::support::*;
use serde_json::{json, Value};

/// A 2026-style upstream that answers every request with an empty tools list (and records
/// what reaches it).
fn empty_list_upstream() -> Scripted {
    ScriptedUpstream::new()
        .otherwise(Reply::result(
            json!({"tools": [], "resultType": "complete"}),
        ))
        .start()
}

fn start() -> (Scripted, Sidecar) {
    let up = empty_list_upstream();
    let sc = Sidecar::start(
        &up.url(),
        &[("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28")],
    );
    (up, sc)
}

fn envelope() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}
    })
}

async fn send(sc: &Sidecar, headers: &[(&str, &str)], body: &str) -> (u16, Value) {
    let mut req = http().post(sc.url()).body(body.to_owned());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    let v = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"))
    };
    (status, v)
}

const JSON: (&str, &str) = ("content-type", "application/json");
const ACCEPT: (&str, &str) = ("accept", "application/json, text/event-stream");
const V: (&str, &str) = ("mcp-protocol-version", "2026-07-28");

fn call_body(id: Value, name: &str) -> String {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":name,"arguments":{},"_meta":envelope()}}).to_string()
}

fn assert_error(got: (u16, Value), status: u16, code: i64, id: Value) -> String {
    let (s, v) = got;
    assert_eq!(s, status, "{v}");
    assert_eq!(v["jsonrpc"], "2.0", "{v}");
    assert_eq!(v["error"]["code"], code, "{v}");
    assert_eq!(v["id"], id, "{v}");
    v["error"]["message"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn missing_envelope_is_400_invalid_params() {
    let (c, sc) = start();
    let body = json!({"jsonrpc":"2.0","id":"m1","method":"tools/list","params":{}}).to_string();
    let msg = assert_error(
        send(&sc, &[JSON, ACCEPT, V, ("mcp-method", "tools/list")], &body).await,
        400,
        -32602,
        json!("m1"),
    );
    assert!(msg.contains("_meta"), "{msg}");
    let body = json!({"jsonrpc":"2.0","id":"m2","method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}).to_string();
    let msg = assert_error(
        send(&sc, &[JSON, ACCEPT, V, ("mcp-method", "tools/list")], &body).await,
        400,
        -32602,
        json!("m2"),
    );
    assert!(msg.contains("clientCapabilities"), "{msg}");
    assert_eq!(c.request_count(), 0);
}

#[tokio::test]
async fn header_mismatches_are_400_header_mismatch_naming_both_values() {
    let (c, sc) = start();
    let body = call_body(json!(7), "add");
    // Mcp-Name differs.
    let msg = assert_error(
        send(
            &sc,
            &[
                JSON,
                ACCEPT,
                V,
                ("mcp-method", "tools/call"),
                ("mcp-name", "sub"),
            ],
            &body,
        )
        .await,
        400,
        -32020,
        json!(7),
    );
    assert!(
        msg.contains("Mcp-Name") && msg.contains("'sub'") && msg.contains("'add'"),
        "{msg}"
    );
    // Mcp-Name missing.
    let msg = assert_error(
        send(&sc, &[JSON, ACCEPT, V, ("mcp-method", "tools/call")], &body).await,
        400,
        -32020,
        json!(7),
    );
    assert!(msg.contains("Mcp-Name"), "{msg}");
    // Mcp-Method differs.
    let msg = assert_error(
        send(
            &sc,
            &[
                JSON,
                ACCEPT,
                V,
                ("mcp-method", "tools/list"),
                ("mcp-name", "add"),
            ],
            &body,
        )
        .await,
        400,
        -32020,
        json!(7),
    );
    assert!(
        msg.contains("Mcp-Method") && msg.contains("'tools/list'") && msg.contains("'tools/call'"),
        "{msg}"
    );
    // MCP-Protocol-Version differs from _meta.
    let msg = assert_error(
        send(
            &sc,
            &[
                JSON,
                ACCEPT,
                ("mcp-protocol-version", "2025-11-25"),
                ("mcp-method", "tools/call"),
                ("mcp-name", "add"),
            ],
            &body,
        )
        .await,
        400,
        -32020,
        json!(7),
    );
    assert!(
        msg.contains("MCP-Protocol-Version")
            && msg.contains("2025-11-25")
            && msg.contains("2026-07-28"),
        "{msg}"
    );
    // Envelope present, version header absent: refused, not served as legacy.
    let msg = assert_error(
        send(
            &sc,
            &[
                JSON,
                ACCEPT,
                ("mcp-method", "tools/call"),
                ("mcp-name", "add"),
            ],
            &body,
        )
        .await,
        400,
        -32020,
        json!(7),
    );
    assert!(msg.contains("MCP-Protocol-Version"), "{msg}");
    // prompts/get and resources/read mirror name and uri.
    let body = json!({"jsonrpc":"2.0","id":8,"method":"resources/read","params":{"uri":"file:///a.txt","_meta":envelope()}}).to_string();
    let msg = assert_error(
        send(
            &sc,
            &[
                JSON,
                ACCEPT,
                V,
                ("mcp-method", "resources/read"),
                ("mcp-name", "file:///b.txt"),
            ],
            &body,
        )
        .await,
        400,
        -32020,
        json!(8),
    );
    assert!(msg.contains("file:///a.txt"), "{msg}");
    let body = json!({"jsonrpc":"2.0","id":9,"method":"prompts/get","params":{"name":"greet","_meta":envelope()}}).to_string();
    assert_error(
        send(
            &sc,
            &[
                JSON,
                ACCEPT,
                V,
                ("mcp-method", "prompts/get"),
                ("mcp-name", "other"),
            ],
            &body,
        )
        .await,
        400,
        -32020,
        json!(9),
    );
    assert_eq!(
        c.request_count(),
        0,
        "a refused request reached the upstream"
    );
}

#[tokio::test]
async fn duplicated_routing_headers_are_refused() {
    let (c, sc) = start();
    let body = call_body(json!("d"), "add");
    let msg = assert_error(
        send(
            &sc,
            &[
                JSON,
                ACCEPT,
                V,
                ("mcp-method", "tools/call"),
                ("mcp-method", "tools/call"),
                ("mcp-name", "add"),
            ],
            &body,
        )
        .await,
        400,
        -32020,
        json!("d"),
    );
    assert!(msg.contains("more than once"), "{msg}");
    assert_error(
        send(
            &sc,
            &[
                JSON,
                ACCEPT,
                V,
                V,
                ("mcp-method", "tools/call"),
                ("mcp-name", "add"),
            ],
            &body,
        )
        .await,
        400,
        -32020,
        json!("d"),
    );
    assert_eq!(c.request_count(), 0);
}

#[tokio::test]
async fn base64_mcp_name_is_decoded_and_the_request_goes_upstream() {
    let (c, sc) = start();
    let name = "grüße ✓";
    let b64 = format!("=?base64?{}?=", base64_encode(name.as_bytes()));
    let (status, v) = send(
        &sc,
        &[
            JSON,
            ACCEPT,
            V,
            ("mcp-method", "tools/call"),
            ("mcp-name", &b64),
        ],
        &call_body(json!(1), name),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(c.request_count(), 1);
    // A broken encoding is a mismatch.
    assert_error(
        send(
            &sc,
            &[
                JSON,
                ACCEPT,
                V,
                ("mcp-method", "tools/call"),
                ("mcp-name", "=?base64?%%%?="),
            ],
            &call_body(json!(2), name),
        )
        .await,
        400,
        -32020,
        json!(2),
    );
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[tokio::test]
async fn unsupported_version_is_400_with_supported_and_requested() {
    let (c, sc) = start();
    let body = json!({"jsonrpc":"2.0","id":"u","method":"tools/list","params":{"_meta":{
        "io.modelcontextprotocol/protocolVersion":"2099-01-01",
        "io.modelcontextprotocol/clientCapabilities":{}}}})
    .to_string();
    let (status, v) = send(
        &sc,
        &[
            JSON,
            ACCEPT,
            ("mcp-protocol-version", "2099-01-01"),
            ("mcp-method", "tools/list"),
        ],
        &body,
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(v["id"], "u");
    assert_eq!(v["error"]["code"], -32022);
    assert_eq!(v["error"]["data"]["supported"], json!(["2026-07-28"]));
    assert_eq!(v["error"]["data"]["requested"], "2099-01-01");
    assert_eq!(c.request_count(), 0);
}

#[tokio::test]
async fn batches_malformed_json_and_other_methods() {
    let (c, sc) = start();
    let batch = format!("[{}]", call_body(json!(1), "add"));
    assert_error(
        send(&sc, &[JSON, ACCEPT, V], &batch).await,
        400,
        -32600,
        Value::Null,
    );
    assert_error(
        send(&sc, &[JSON, ACCEPT, V], "{\"jsonrpc\":").await,
        400,
        -32700,
        Value::Null,
    );
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let resp = http()
            .request(method.clone(), sc.url())
            .header("accept", "text/event-stream")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 405, "{method}");
        assert_eq!(resp.headers()["allow"], "POST");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["jsonrpc"], "2.0");
    }
    assert_eq!(c.request_count(), 0);
}

#[tokio::test]
async fn removed_methods_are_404_method_not_found() {
    let (c, sc) = start();
    for (i, method) in [
        "ping",
        "initialize",
        "logging/setLevel",
        "resources/subscribe",
    ]
    .iter()
    .enumerate()
    {
        let body = json!({"jsonrpc":"2.0","id":i,"method":method,"params":{"_meta":envelope()}})
            .to_string();
        assert_error(
            send(&sc, &[JSON, ACCEPT, V, ("mcp-method", method)], &body).await,
            404,
            -32601,
            json!(i),
        );
    }
    assert_eq!(c.request_count(), 0);
}

#[tokio::test]
async fn notifications_are_accepted_with_202() {
    let (c, sc) = start();
    let (status, v) = send(
        &sc,
        &[JSON, ACCEPT],
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    )
    .await;
    assert_eq!((status, v), (202, Value::Null));
    let (status, _) = send(
        &sc,
        &[JSON, ACCEPT, V],
        &json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1,"_meta":envelope()}}).to_string(),
    )
    .await;
    assert_eq!(status, 202);
    assert_eq!(c.request_count(), 0);
}

/// A key the sidecar routes on, given twice, is refused in both eras (400, -32600, naming the
/// key, with the request's id) before anything goes upstream: the upstream would take one of
/// the two and a product call would slip past decoration and telemetry.
#[tokio::test]
async fn duplicate_keys_are_refused_in_both_eras() {
    let (c, sc) = start();
    let meta = envelope().to_string();
    // 2026: duplicate `name` (the headers name the first).
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":"d1","method":"tools/call","params":{{"name":"echo","name":"add","arguments":{{}},"_meta":{meta}}}}}"#
    );
    let msg = assert_error(
        send(
            &sc,
            &[
                JSON,
                ACCEPT,
                V,
                ("mcp-method", "tools/call"),
                ("mcp-name", "echo"),
            ],
            &body,
        )
        .await,
        400,
        -32600,
        json!("d1"),
    );
    assert!(msg.contains("`name`"), "{msg}");
    // 2025 era: duplicate `arguments`, and duplicate `name`.
    for (id, params, key) in [
        (
            "d2",
            r#"{"name":"add","arguments":{"a":1,"b":2},"arguments":{"a":5,"b":6}}"#,
            "`arguments`",
        ),
        (
            "d3",
            r#"{"name":"echo","arguments":{"text":"x"},"name":"add"}"#,
            "`name`",
        ),
    ] {
        let body =
            format!(r#"{{"jsonrpc":"2.0","id":"{id}","method":"tools/call","params":{params}}}"#);
        let msg = assert_error(
            send(&sc, &[JSON, ACCEPT], &body).await,
            400,
            -32600,
            json!(id),
        );
        assert!(msg.contains(key), "{msg}");
    }
    // A duplicated top-level key still gets its id back when `id` itself is single.
    let msg = assert_error(
        send(
            &sc,
            &[JSON, ACCEPT],
            r#"{"jsonrpc":"2.0","id":"d4","method":"tools/list","method":"tools/call"}"#,
        )
        .await,
        400,
        -32600,
        json!("d4"),
    );
    assert!(msg.contains("`method`"), "{msg}");
    assert_eq!(c.request_count(), 0);
}

/// The request any web page can send without a preflight: a `tools/call` with a loopback
/// `Origin` and `Content-Type: text/plain` (or a form type, or none). It is refused with 415
/// and a JSON-RPC error before anything runs, and nothing reaches the upstream; JSON with
/// parameters passes.
#[tokio::test]
async fn a_post_that_is_not_json_is_415_before_anything_runs() {
    let (c, sc) = start();
    let body = call_body(json!("t"), "add");
    let origin = ("origin", "http://localhost:3000");
    let call = [
        ACCEPT,
        V,
        origin,
        ("mcp-method", "tools/call"),
        ("mcp-name", "add"),
    ];
    for ct in [
        Some("text/plain;charset=UTF-8"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        Some("application/json-seq"),
        None,
    ] {
        let mut headers = call.to_vec();
        if let Some(ct) = ct {
            headers.push(("content-type", ct));
        }
        let msg = assert_error(send(&sc, &headers, &body).await, 415, -32000, Value::Null);
        assert!(msg.contains("application/json"), "{ct:?}: {msg}");
    }
    assert_eq!(c.request_count(), 0, "a refused call ran");
    let mut headers = call.to_vec();
    headers.push(("content-type", "application/json; charset=utf-8"));
    let (status, v) = send(&sc, &headers, &body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(c.request_count(), 1);
}

async fn preflight(sc: &Sidecar, origin: &str) -> reqwest::Response {
    http()
        .request(reqwest::Method::OPTIONS, sc.url())
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "content-type,mcp-protocol-version,mcp-method,mcp-name,authorization,x-tenant",
        )
        .send()
        .await
        .unwrap()
}

/// A CORS preflight is granted to the origins the Origin policy allows (204 and every grant a
/// browser MCP client needs), refused (403, JSON-RPC error) to the others; the answer to an
/// allowed cross-origin request names its origin so the page can read it, and exposes the
/// headers a client reads.
#[tokio::test]
async fn cors_preflights_are_granted_to_allowed_origins_only() {
    let (c, sc) = start();
    let resp = preflight(&sc, "http://localhost:6274").await;
    assert_eq!(resp.status(), 204);
    let h = resp.headers().clone();
    assert_eq!(h["access-control-allow-origin"], "http://localhost:6274");
    assert!(h["access-control-allow-methods"]
        .to_str()
        .unwrap()
        .contains("POST"));
    let allowed = h["access-control-allow-headers"].to_str().unwrap();
    for name in [
        "content-type",
        "authorization",
        "mcp-protocol-version",
        "mcp-method",
        "mcp-name",
        "mcp-session-id",
        "last-event-id",
        "x-tenant",
    ] {
        assert!(allowed.split(", ").any(|n| n == name), "{name}: {allowed}");
    }
    let max_age: u64 = h["access-control-max-age"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(max_age >= 600, "{max_age}");

    for evil in [
        "http://evil.example",
        "null",
        "http://localhost.evil.example",
    ] {
        let resp = preflight(&sc, evil).await;
        assert_eq!(resp.status(), 403, "{evil}");
        assert!(resp.headers().get("access-control-allow-origin").is_none());
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["jsonrpc"], "2.0");
    }

    let resp = http()
        .post(sc.url())
        .header("origin", "http://localhost:6274")
        .header("content-type", "application/json")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/list")
        .body(
            json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":envelope()}})
                .to_string(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["access-control-allow-origin"],
        "http://localhost:6274"
    );
    let exposed = resp.headers()["access-control-expose-headers"]
        .to_str()
        .unwrap();
    assert!(exposed.contains("mcp-session-id"), "{exposed}");
    // A request without Origin (not a browser's) gets no CORS headers.
    let (status, _) = send(
        &sc,
        &[JSON, ACCEPT, V, ("mcp-method", "tools/list")],
        &json!({"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"_meta":envelope()}})
            .to_string(),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(c.request_count(), 2, "preflights never go upstream");
}

/// With an exact origin list, only those origins' preflights are granted.
#[tokio::test]
async fn cors_follows_a_configured_origin_list() {
    let c = empty_list_upstream();
    let sc = Sidecar::start(
        &c.url(),
        &[
            ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28"),
            (
                "EPODE_SIDECAR_ALLOWED_ORIGINS",
                "https://inspector.example.com",
            ),
        ],
    );
    let resp = preflight(&sc, "https://inspector.example.com").await;
    assert_eq!(resp.status(), 204);
    assert_eq!(
        resp.headers()["access-control-allow-origin"],
        "https://inspector.example.com"
    );
    assert_eq!(preflight(&sc, "http://localhost:6274").await.status(), 403);
    // OPTIONS that is no preflight is an unserved method, as before.
    let resp = http()
        .request(reqwest::Method::OPTIONS, sc.url())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 405);
}

/// JSON-RPC ids are strings or numbers: an object, an array, a boolean or `null` as the id of
/// a request gets 400 -32600 (id `null`), in both eras, and nothing reaches the upstream;
/// `"id": null` is no notification (it was a silent 202).
#[tokio::test]
async fn ids_that_are_not_strings_or_numbers_are_400() {
    let (c, sc) = start();
    for id in ["{\"a\":1}", "[1]", "true", "false", "null"] {
        let modern = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/list","params":{{"_meta":{}}}}}"#,
            envelope()
        );
        let msg = assert_error(
            send(
                &sc,
                &[JSON, ACCEPT, V, ("mcp-method", "tools/list")],
                &modern,
            )
            .await,
            400,
            -32600,
            Value::Null,
        );
        assert!(msg.contains("id"), "{msg}");
        let legacy = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/list"}}"#);
        assert_error(
            send(&sc, &[JSON, ACCEPT], &legacy).await,
            400,
            -32600,
            Value::Null,
        );
    }
    assert_eq!(c.request_count(), 0);
    for id in [json!("s"), json!(-3), json!(1.5)] {
        let body =
            json!({"jsonrpc":"2.0","id":id,"method":"tools/list","params":{"_meta":envelope()}});
        let (status, v) = send(
            &sc,
            &[JSON, ACCEPT, V, ("mcp-method", "tools/list")],
            &body.to_string(),
        )
        .await;
        assert_eq!((status, &v["id"]), (200, &id), "{v}");
    }
}

/// A real browser (Chromium) on a loopback origin, as the MCP Inspector runs: its JSON call is
/// preflighted, granted and readable; the `text/plain` call a page can send without a
/// preflight is refused with 415 (readable by the page) and never runs.
#[test]
fn a_browser_page_calls_through_cors_and_cannot_post_text() {
    let (c, sc) = start();
    let out = std::process::Command::new("node")
        .arg(repo_root().join("tests/peers/cors_check.mjs"))
        .arg(sc.url())
        .env("EPODE_PEERS_TS", peers_dir().join("ts"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
        panic!(
            "cors_check printed no JSON:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(v["json"]["status"], 200, "{v}");
    assert!(v["json"]["body"]["result"]["tools"].is_array(), "{v}");
    assert_eq!(v["plain"]["status"], 415, "{v}");
    assert_eq!(c.request_count(), 1, "the text/plain call ran: {v}");
}
