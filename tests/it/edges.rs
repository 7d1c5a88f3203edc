//! Edge cases of the front door and the upstream hop, against raw upstreams that misbehave on
//! purpose (never answering, dying, echoing what they got). Real-peer behaviour is in
//! `transparency.rs`.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::support::*;
use serde_json::{json, Value};

/// The raw upstreams here answer whatever they are sent; the sidecar is told their era so it
/// does not probe them.
const MODERN_UP: &[(&str, &str)] = &[("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28")];

const ENVELOPE: &str = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;

/// A modern request with `id` and `method` (no `Mcp-Name` needed), and its headers.
fn modern(id: &str, method: &str) -> (String, [(&'static str, String); 2]) {
    (
        format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{{{ENVELOPE}}}}}"#),
        [
            ("mcp-protocol-version", "2026-07-28".to_owned()),
            ("mcp-method", method.to_owned()),
        ],
    )
}

fn post(
    url: &str,
    (body, headers): (String, [(&'static str, String); 2]),
) -> reqwest::RequestBuilder {
    let mut req = http()
        .post(url)
        .header("content-type", "application/json")
        .body(body);
    for (k, v) in headers {
        req = req.header(k, v);
    }
    req
}

/// An upstream that echoes the request head and body it received inside a JSON-RPC result.
fn echo_upstream() -> Scripted {
    ScriptedUpstream::new()
        .headers(&[
            ("connection", "keep-alive, x-hop"),
            ("x-hop", "secret"),
            ("x-end-to-end", "kept"),
        ])
        .otherwise(Reply::echo())
        .start()
}

/// The progress notification the streaming upstreams here send first.
const PROGRESS: &str = r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}"#;

async fn error_of(resp: reqwest::Response) -> (u16, Value) {
    let status = resp.status().as_u16();
    let ct = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned());
    let body: Value = resp.json().await.expect("error responses have a JSON body");
    assert_eq!(ct.as_deref(), Some("application/json"));
    assert_eq!(body["jsonrpc"], "2.0");
    (status, body)
}

#[tokio::test]
async fn request_goes_upstream_byte_for_byte_with_clean_headers() {
    let up = echo_upstream();
    let sc = Sidecar::start(&up.url(), MODERN_UP);
    // Numbers beyond f64, escapes and odd spacing must arrive exactly as sent.
    let raw = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":12345678901234567890,\"method\":\"tools/list\",\n \"params\":{{\"x\":1e400,\"y\":0.1,\"s\":\"\\u00e9\\ud83d\\ude80\",{ENVELOPE}}}}}"
    );
    let resp = http()
        .post(sc.url())
        .header("content-type", "application/json")
        .header("authorization", "Bearer product-token")
        .header("origin", "http://localhost:3000")
        .header("x-custom", "yes")
        .header("connection", "x-private")
        .header("x-private", "drop-me")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/list")
        .body(raw.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers().get("x-hop").is_none(),
        "hop-by-hop header leaked back"
    );
    assert_eq!(resp.headers()["x-end-to-end"], "kept");
    let seen: Value = resp.json().await.unwrap();
    assert_eq!(seen["body"], raw);
    let head = seen["head"].as_str().unwrap().to_ascii_lowercase();
    assert!(head.starts_with("post /mcp http/1.1"), "{head}");
    assert!(
        head.contains(&format!("host: 127.0.0.1:{}\r\n", up.port)),
        "{head}"
    );
    assert!(
        head.contains("authorization: bearer product-token"),
        "{head}"
    );
    assert!(head.contains("x-custom: yes"), "{head}");
    assert!(head.contains("mcp-method: tools/list"), "{head}");
    assert!(
        !head.contains("origin:"),
        "Origin must not go upstream: {head}"
    );
    assert!(
        !head.contains("x-private"),
        "Connection-named header leaked: {head}"
    );
}

#[tokio::test]
async fn origin_and_host_are_checked_by_the_sidecar() {
    let up = echo_upstream();
    let sc = Sidecar::start(&up.url(), MODERN_UP);
    let body = || modern("1", "tools/list");

    let resp = post(&sc.url(), body())
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    let (status, err) = error_of(resp).await;
    assert_eq!(status, 403);
    assert!(
        err["error"]["message"].as_str().unwrap().contains("Origin"),
        "{err}"
    );

    let resp = post(&sc.url(), body())
        .header("host", "evil.example.com")
        .send()
        .await
        .unwrap();
    let (status, err) = error_of(resp).await;
    assert_eq!(status, 403);
    assert!(
        err["error"]["message"].as_str().unwrap().contains("Host"),
        "{err}"
    );

    // No Origin, or a loopback Origin, passes.
    for origin in [None, Some("http://127.0.0.1:5173")] {
        let mut req = post(&sc.url(), body());
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        assert_eq!(req.send().await.unwrap().status(), 200);
    }

    // An explicit allowlist replaces the loopback default.
    let sc = Sidecar::start(
        &up.url(),
        &[
            MODERN_UP[0],
            ("EPODE_SIDECAR_ALLOWED_ORIGINS", "https://app.example.com"),
        ],
    );
    let send = |o: &'static str| post(&sc.url(), body()).header("origin", o).send();
    assert_eq!(send("https://app.example.com").await.unwrap().status(), 200);
    assert_eq!(send("http://localhost:3000").await.unwrap().status(), 403);
}

#[tokio::test]
async fn oversized_bodies_get_413() {
    let up = echo_upstream();
    let sc = Sidecar::start(
        &up.url(),
        &[MODERN_UP[0], ("EPODE_SIDECAR_MAX_BODY_BYTES", "1024")],
    );
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"pad":"{}"}}}}"#,
        "x".repeat(2000)
    );
    // Declared length.
    let resp = http()
        .post(sc.url())
        .header("content-type", "application/json")
        .body(big.clone())
        .send()
        .await
        .unwrap();
    let (status, err) = error_of(resp).await;
    assert_eq!(status, 413);
    assert!(
        err["error"]["message"].as_str().unwrap().contains("1024"),
        "{err}"
    );
    // Chunked, with no declared length.
    let stream = futures_stream(big.into_bytes());
    let resp = http()
        .post(sc.url())
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    // Just under the limit passes.
    let ok = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"pad":"{}"}}}}"#,
        "x".repeat(900)
    );
    assert_eq!(
        http()
            .post(sc.url())
            .header("content-type", "application/json")
            .body(ok)
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

fn futures_stream(
    bytes: Vec<u8>,
) -> impl futures_util::Stream<Item = Result<Vec<u8>, std::io::Error>> {
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        bytes.chunks(100).map(|c| Ok(c.to_vec())).collect();
    futures_util::stream::iter(chunks)
}

#[tokio::test]
async fn malformed_json_is_refused_with_a_jsonrpc_error() {
    let up = echo_upstream();
    let sc = Sidecar::start(&up.url(), MODERN_UP);
    for (body, code) in [
        (&b"{\"jsonrpc\":\"2.0\",\"id\":1,"[..], -32700),
        (&b"\xff\xfe not json"[..], -32700),
        (&b""[..], -32700),
        (&b"\"just a string\""[..], -32600),
    ] {
        let resp = http()
            .post(sc.url())
            .header("content-type", "application/json")
            .body(body.to_vec())
            .send()
            .await
            .unwrap();
        let (status, err) = error_of(resp).await;
        assert_eq!(status, 400, "{err}");
        assert_eq!(err["error"]["code"], code, "{err}");
        assert!(err["id"].is_null());
    }
    // The sidecar is still serving.
    let resp = post(&sc.url(), modern("1", "tools/list"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn dead_upstream_gives_502_with_the_request_id() {
    let port = free_port(); // nothing listens there
    let sc = Sidecar::start(&format!("http://127.0.0.1:{port}/mcp"), &[]);
    let resp = http()
        .post(sc.url())
        .header("content-type", "application/json")
        .body(r#"{"jsonrpc":"2.0","id":"req-7","method":"tools/list"}"#)
        .send()
        .await
        .unwrap();
    let (status, err) = error_of(resp).await;
    assert_eq!(status, 502);
    assert_eq!(err["id"], "req-7");
    assert_eq!(err["error"]["code"], -32603);
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unreachable"),
        "{err}"
    );

    let ready = http()
        .get(format!("{}/readyz", sc.base()))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
    let health = http()
        .get(format!("{}/healthz", sc.base()))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let health = http()
        .get(format!("{}/health", sc.base()))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
}

#[tokio::test]
async fn silent_upstream_gives_504_within_the_timeout() {
    let up = ScriptedUpstream::new().otherwise(Reply::silent()).start();
    let sc = Sidecar::start(
        &up.url(),
        &[MODERN_UP[0], ("EPODE_SIDECAR_UPSTREAM_TIMEOUT", "500ms")],
    );
    let started = Instant::now();
    let resp = http()
        .post(sc.url())
        .header("content-type", "application/json")
        .body(r#"{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"x"}}"#)
        .send()
        .await
        .unwrap();
    let (status, err) = error_of(resp).await;
    assert_eq!(status, 504);
    assert_eq!(err["id"], 42);
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn upstream_error_statuses_pass_through_unchanged() {
    let up = ScriptedUpstream::new()
        .otherwise(
            Reply::json(r#"{"error":"invalid_token"}"#)
                .status(401)
                .header(
                    "www-authenticate",
                    "Bearer resource_metadata=\"http://x/.well-known\"",
                )
                .then_close(),
        )
        .start();
    let sc = Sidecar::start(&up.url(), MODERN_UP);
    let resp = http()
        .post(sc.url())
        .header("content-type", "application/json")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    assert_eq!(
        resp.headers()["www-authenticate"],
        "Bearer resource_metadata=\"http://x/.well-known\""
    );
    assert_eq!(resp.text().await.unwrap(), r#"{"error":"invalid_token"}"#);
}

/// A client that goes away while the upstream is still working cancels the upstream request:
/// the sidecar closes its upstream connection, both before the response head and mid-stream.
#[tokio::test]
async fn client_disconnect_cancels_the_upstream_request() {
    for mid_stream in [false, true] {
        let reply = if mid_stream {
            Reply::body("text/event-stream")
                .chunked()
                .event(PROGRESS)
                .then_hang()
        } else {
            Reply::silent()
        };
        let up = ScriptedUpstream::new().otherwise(reply).start();
        let sc = Sidecar::start(&up.url(), MODERN_UP);
        let mut client = TcpStream::connect(sc.addr).unwrap();
        let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow"}}"#;
        write!(
            client,
            "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{}",
            body.len(),
            body
        )
        .unwrap();
        if mid_stream {
            // Wait for the first event to reach the client, then hang up.
            let mut buf = [0u8; 512];
            let mut got = Vec::new();
            client
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            while !String::from_utf8_lossy(&got).contains("notifications/progress") {
                let n = std::io::Read::read(&mut client, &mut buf).unwrap();
                assert!(n > 0, "sidecar closed before streaming the event");
                got.extend_from_slice(&buf[..n]);
            }
        } else {
            // Wait for the request to reach the upstream, then hang up.
            assert!(eventually(Duration::from_secs(5), || up.request_count() == 1));
        }
        drop(client);
        let closed = eventually(Duration::from_secs(5), || {
            up.request_connections_closed() == 1
        });
        assert!(
            closed,
            "upstream connection stayed open after the client left (mid_stream={mid_stream})"
        );
    }
}

/// `input_required` results, retries carrying `inputResponses`, unknown fields and foreign
/// `_meta` keys cross the sidecar untouched.
#[tokio::test]
async fn input_required_rounds_and_unknown_fields_pass_through() {
    let up = ScriptedUpstream::new()
        .when_fn(
            |r| r.json["params"].get("inputResponses").is_some(),
            |r| {
                // Echo what the retry carried, exactly.
                let seen = serde_json::to_string(&String::from_utf8_lossy(&r.body)).unwrap();
                Reply::result_raw(format!(
                    r#"{{"content":[{{"type":"text","text":{seen}}}],"resultType":"complete"}}"#
                ))
            },
        )
        .otherwise(Reply::result_raw(
            r#"{"resultType":"input_required","inputRequests":{"q":{"method":"elicitation/create","params":{"mode":"form","message":"Which?","requestedSchema":{}}}},"requestState":"c3RhdGU=.sig","x-vendor":{"n":1e400},"_meta":{"vendor.example/trace":"t-1"}}"#,
        ))
        .start();
    let sc = Sidecar::start(&up.url(), MODERN_UP);
    let call = |extra: &str| {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":"r1","method":"tools/call","params":{{"name":"pick","arguments":{{}}{extra},{ENVELOPE}}}}}"#
        );
        http()
            .post(sc.url())
            .header("content-type", "application/json")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", "pick")
            .body(body)
            .send()
    };
    let first = call("").await.unwrap();
    assert_eq!(first.status(), 200);
    let text = first.text().await.unwrap();
    assert!(text.contains(r#""requestState":"c3RhdGU=.sig""#), "{text}");
    assert!(text.contains(r#""x-vendor":{"n":1e400}"#), "{text}");
    assert!(text.contains(r#""vendor.example/trace":"t-1""#), "{text}");
    assert!(
        !text.contains("ttlMs"),
        "input_required results carry no cache hints: {text}"
    );
    let retry_extra = r#","inputResponses":{"q":{"action":"accept","content":{"x":12345678901234567890}}},"requestState":"c3RhdGU=.sig""#;
    let second = call(retry_extra).await.unwrap();
    let v: Value = second.json().await.unwrap();
    let seen = v["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        seen.contains(retry_extra),
        "the retry changed on its way: {seen}"
    );
}

/// An upstream that starts its answer and then breaks: JSON cut off mid-body, JSON stalled
/// mid-body, and an SSE stream that ends after a progress event without its response. Each
/// error the client gets names the request's id, and the stream ends with an error event
/// rather than a cut-off body.
#[tokio::test]
async fn upstream_breaking_mid_body_gives_errors_that_name_the_request() {
    let cut_json = || {
        Reply::body("application/json")
            .declared_length(100)
            .text(r#"{"jsonrpc":"#)
    };
    let up = ScriptedUpstream::new()
        .when(|r| *r.id() == "cut", cut_json().then_close())
        .when(|r| *r.id() == "stall", cut_json().then_hang())
        .otherwise(Reply::sse().event(PROGRESS))
        .start();
    let sc = Sidecar::start(
        &up.url(),
        &[MODERN_UP[0], ("EPODE_SIDECAR_UPSTREAM_TIMEOUT", "1s")],
    );
    let (status, err) = error_of(
        post(&sc.url(), modern(r#""cut""#, "tools/list"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, err["id"].clone()), (502, json!("cut")), "{err}");
    let started = Instant::now();
    let (status, err) = error_of(
        post(&sc.url(), modern(r#""stall""#, "tools/list"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, err["id"].clone()), (504, json!("stall")), "{err}");
    assert!(started.elapsed() < Duration::from_secs(4));

    let resp = post(&sc.url(), modern(r#""sse""#, "tools/list"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp
        .text()
        .await
        .expect("the stream ends cleanly, not cut off");
    assert!(text.contains("notifications/progress"), "{text}");
    let last = last_message("text/event-stream", &text);
    assert_eq!(last["id"], "sse", "{text}");
    assert_eq!(last["error"]["code"], -32603, "{text}");
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .contains("before the response"),
        "{text}"
    );
}

/// An upstream that answers every request with an empty result; it counts the connections
/// that carried a client's request (not the sidecar's own readiness ping at start) and the
/// ones of them that ended.
fn complete_upstream() -> Scripted {
    ScriptedUpstream::new()
        .otherwise(Reply::json(
            r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete"}}"#,
        ))
        .start()
}

async fn prompts_list(sc: &Sidecar) {
    let resp = post(&sc.url(), modern("1", "prompts/list"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
}

/// The upstream keep-alive settings reach each worker's pool: sequential requests share one
/// connection; `UPSTREAM_MAX_IDLE=0` opens one per request; a connection idle past
/// `UPSTREAM_IDLE_TIMEOUT` is closed by the sidecar and the next request opens another.
#[tokio::test]
async fn upstream_connections_are_reused_and_bounded_as_configured() {
    let one_worker = ("EPODE_SIDECAR_WORKERS", "1");

    let up = complete_upstream();
    let sc = Sidecar::start(&up.url(), &[MODERN_UP[0], one_worker]);
    for _ in 0..5 {
        prompts_list(&sc).await;
    }
    assert_eq!(
        up.request_connections(),
        1,
        "5 requests, one kept-alive connection"
    );

    let up = complete_upstream();
    let no_idle = ("EPODE_SIDECAR_UPSTREAM_MAX_IDLE", "0");
    let sc = Sidecar::start(&up.url(), &[MODERN_UP[0], one_worker, no_idle]);
    for _ in 0..5 {
        prompts_list(&sc).await;
    }
    assert_eq!(up.request_connections(), 5, "no idle connection kept");
    eventually_async(Duration::from_secs(5), || {
        std::future::ready(up.request_connections_closed() == 5)
    })
    .await;
    assert_eq!(
        up.request_connections_closed(),
        5,
        "each closed after its answer"
    );

    let up = complete_upstream();
    let short = ("EPODE_SIDECAR_UPSTREAM_IDLE_TIMEOUT", "100ms");
    let sc = Sidecar::start(&up.url(), &[MODERN_UP[0], one_worker, short]);
    prompts_list(&sc).await;
    eventually_async(Duration::from_secs(5), || {
        std::future::ready(up.request_connections_closed() == 1)
    })
    .await;
    assert_eq!(
        up.request_connections_closed(),
        1,
        "the idle connection closed by the sidecar"
    );
    prompts_list(&sc).await;
    assert_eq!(up.request_connections(), 2);
}
