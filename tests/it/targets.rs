//! What a request is for, decided once before any route (issue 30): every spelling of the MCP
//! path an app could take for its MCP endpoint (percent-encoded letters, dot segments, `//`,
//! `;params`, a trailing `/`, another case) meets the MCP front (checked, decorated,
//! rate-limited, one telemetry event) or is refused with 400, against the project's own
//! example server (Starlette, which decodes `%XX`) behind the HTTP surface; so do the
//! spellings of the operations prefix; `--dev` takes `/_dev` only as a whole segment; CONNECT
//! gets 501 and nothing upstream; a doubled, malformed or disagreeing `Host` gets 400 on every
//! route. Requests go over raw sockets: an HTTP client library would tidy the paths first.

use crate::support::fake_epode::{FakeConfig, FakeEpode, DEMO_PRODUCT_KEY};
use crate::support::*;

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

/// The project's example server (examples/python-server/server.py) over HTTP.
struct Example {
    port: u16,
    _proc: Proc,
}

impl Example {
    fn start() -> Example {
        let port = free_port();
        let mut child = Command::new(python())
            .arg(repo_root().join("examples/python-server/server.py"))
            .args(["--port", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start examples/python-server/server.py");
        wait_for_port(port, &mut child, "examples/python-server/server.py");
        Example {
            port,
            _proc: Proc {
                child,
                name: "example-server".into(),
            },
        }
    }

    /// Its bare origin: the surface proxies every path that is not the sidecar's to it.
    fn origin(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// One answer, read to the connection's end.
struct Answer {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The JSON-RPC message (JSON, or an SSE stream's last event); `Null` when there is none.
    fn message(&self) -> Value {
        let ct = self.header("content-type").unwrap_or_default();
        if ct.starts_with("application/json") || ct.starts_with("text/event-stream") {
            last_message(&ct, &self.text())
        } else {
            Value::Null
        }
    }
}

/// Sends `request` as written on a new connection and reads the answer to its end.
fn exchange(addr: SocketAddr, request: &[u8]) -> Answer {
    let mut s = TcpStream::connect(addr).expect("connect to the sidecar");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(request).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read the answer");
    let at = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {:?}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8_lossy(&raw[..at]).into_owned();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    let mut answer = Answer {
        status,
        head,
        body: raw[at + 4..].to_vec(),
    };
    if answer
        .header("transfer-encoding")
        .is_some_and(|t| t.eq_ignore_ascii_case("chunked"))
    {
        answer.body = dechunk(&answer.body);
    }
    answer
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = raw.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&raw[..eol]).unwrap_or_default();
        let size = usize::from_str_radix(size.split(';').next().unwrap_or_default().trim(), 16)
            .unwrap_or_else(|_| panic!("bad chunk size {size:?}"));
        if size == 0 {
            break;
        }
        out.extend_from_slice(&raw[eol + 2..eol + 2 + size]);
        raw = &raw[eol + 2 + size + 2..];
    }
    out
}

/// A request with `Host: 127.0.0.1` (unless `headers` has Hosts of its own) that closes the
/// connection after its answer.
fn request(method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Vec<u8> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nconnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        head.push_str("host: 127.0.0.1\r\n");
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!("content-length: {}\r\n\r\n{body}", body.len()));
    head.into_bytes()
}

/// What the sidecar must do with a spelling.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Expect {
    /// Serve it at its MCP front.
    Front,
    /// Refuse it with 400.
    Refused,
}

/// Spellings of `/mcp` (EPODE_SIDECAR_PATH): what Starlette decodes to its MCP endpoint and
/// the forms other apps resolve or fold (dot segments, `//`, `;params`, case, a trailing `/`),
/// and the ambiguous or broken forms.
const MCP_SPELLINGS: &[(&str, Expect)] = &[
    ("/mcp", Expect::Front),
    ("/%6dcp", Expect::Front),
    ("/%6Dcp", Expect::Front),
    ("/%6d%63%70", Expect::Front),
    ("/m%63p", Expect::Front),
    ("/mc%70", Expect::Front),
    ("/%6D%43%50", Expect::Front),
    ("/MCP", Expect::Front),
    ("/Mcp", Expect::Front),
    ("/mcp/", Expect::Front),
    ("//mcp", Expect::Front),
    ("///mcp//", Expect::Front),
    ("/./mcp", Expect::Front),
    ("/mcp/.", Expect::Front),
    ("/x/../mcp", Expect::Front),
    ("/%2e/mcp", Expect::Front),
    ("/x/%2E%2E/mcp", Expect::Front),
    ("/mcp;x=1", Expect::Front),
    ("/mcp;", Expect::Front),
    ("/x/..;/mcp", Expect::Front),
    ("/%2Fmcp", Expect::Refused),
    ("/mcp%2F", Expect::Refused),
    ("/mcp%2f", Expect::Refused),
    ("/x%2F..%2Fmcp", Expect::Refused),
    ("/..%2Fmcp", Expect::Refused),
    ("/../mcp", Expect::Refused),
    ("/%2e%2e/mcp", Expect::Refused),
    ("/mcp%5C", Expect::Refused),
    ("/mcp\\", Expect::Refused),
    ("/%256dcp", Expect::Refused),
    ("/mcp%00", Expect::Refused),
    ("/mcp%", Expect::Refused),
];

fn modern(method: &str, name: Option<&str>) -> Vec<(&'static str, String)> {
    modern_headers(method, name)
}

fn as_refs<'a>(h: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    h.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

fn search_call(id: u64) -> String {
    modern_body(
        json!(id),
        "tools/call",
        json!({"name": "search_help", "arguments": {"query": "refund"}}),
    )
    .to_string()
}

/// A refusal of the path itself: 400 with a JSON-RPC error naming the path.
fn assert_refused(got: &Answer, path: &str, what: &str) {
    assert_eq!(got.status, 400, "{path} ({what}): {}", got.text());
    let message = got.message();
    let text = message["error"]["message"].as_str().unwrap_or_default();
    assert!(
        text.contains("request path"),
        "{path} ({what}): {}",
        got.text()
    );
}

/// Every spelling of the MCP path meets the front: the front's own Origin and Content-Type
/// refusals, then a product call decorated with `_agentFeedback` and counted in telemetry; or
/// is refused with 400. Before, `/%6dcp` went to the app's MCP endpoint as a plain route.
#[test]
fn every_spelling_of_the_mcp_path_meets_the_front_or_is_refused() {
    let app = Example::start();
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let sc = feedback_sidecar(
        &app.origin(),
        &epode,
        "never_ask",
        &[
            ("EPODE_SIDECAR_HTTP_SURFACE", "on"),
            ("EPODE_SIDECAR_TELEMETRY_FLUSH", "20ms"),
        ],
    );
    let list = modern("tools/list", None);
    let call = modern("tools/call", Some("search_help"));
    let list_body = modern_body(json!(1), "tools/list", json!({})).to_string();
    let mut served = 0;
    for (i, &(path, expect)) in MCP_SPELLINGS.iter().enumerate() {
        let mut evil = as_refs(&list);
        evil.push(("origin", "http://evil.example"));
        let origin = exchange(sc.addr, &request("POST", path, &evil, &list_body));
        let mut plain = as_refs(&list);
        plain.retain(|(k, _)| *k != "content-type");
        plain.push(("content-type", "text/plain"));
        let typed = exchange(sc.addr, &request("POST", path, &plain, &list_body));
        let called = exchange(
            sc.addr,
            &request("POST", path, &as_refs(&call), &search_call(i as u64)),
        );
        if expect == Expect::Refused {
            for (got, what) in [
                (&origin, "origin"),
                (&typed, "content-type"),
                (&called, "call"),
            ] {
                assert_refused(got, path, what);
            }
            continue;
        }
        served += 1;
        // The front's refusals are JSON-RPC errors (the app's own are plain text).
        assert_eq!(origin.status, 403, "{path}: {}", origin.text());
        assert_eq!(
            origin.message()["error"]["message"],
            "Invalid Origin header: http://evil.example",
            "{path}: the front's Origin check"
        );
        assert_eq!(
            typed.status,
            415,
            "{path}: the front's Content-Type check: {}",
            typed.text()
        );
        assert_eq!(called.status, 200, "{path}: {}", called.text());
        let result = &called.message()["result"];
        assert_eq!(
            result["structuredContent"]["_agentFeedback"]["mode"],
            "never_ask",
            "{path}: a product result decorated by the front: {}",
            called.text()
        );
    }
    assert!(served >= 20, "{served} spellings served");
    let arrived = eventually(Duration::from_secs(10), || epode.events().len() >= served);
    let events = epode.events();
    assert!(
        arrived && events.len() == served,
        "one telemetry event per product call at the front: {served} calls, {} events",
        events.len()
    );
    assert!(
        events.iter().all(|e| e["operation"] == "search_help"),
        "{events:#?}"
    );
}

/// With `EPODE_SIDECAR_RATE_LIMIT=2/m` spent on `/mcp`, every other spelling gets the front's
/// 429 (or the 400), never the app's 200.
#[test]
fn every_spelling_of_the_mcp_path_is_rate_limited() {
    let app = Example::start();
    let sc = Sidecar::start(
        &app.origin(),
        &[
            ("EPODE_SIDECAR_HTTP_SURFACE", "on"),
            ("EPODE_SIDECAR_RATE_LIMIT", "2/m"),
        ],
    );
    let list = modern("tools/list", None);
    let body = modern_body(json!(1), "tools/list", json!({})).to_string();
    for _ in 0..2 {
        let got = exchange(sc.addr, &request("POST", "/mcp", &as_refs(&list), &body));
        assert_eq!(got.status, 200, "{}", got.text());
    }
    for &(path, expect) in MCP_SPELLINGS {
        let got = exchange(sc.addr, &request("POST", path, &as_refs(&list), &body));
        match expect {
            Expect::Front => {
                assert_eq!(got.status, 429, "{path}: {}", got.text());
                assert!(got.header("retry-after").is_some(), "{path}");
            }
            Expect::Refused => assert_refused(&got, path, "rate"),
        }
    }
}

/// Spellings of the operations prefix are the sidecar's (its health), never the app's 404;
/// one whose readings disagree is refused.
#[test]
fn every_spelling_of_the_operations_prefix_is_the_sidecars() {
    let app = Example::start();
    let sc = Sidecar::start(&app.origin(), &[("EPODE_SIDECAR_HTTP_SURFACE", "on")]);
    for path in [
        "/_epode-sidecar/healthz",
        "/%5Fepode-sidecar/healthz",
        "/%5fepode-sidecar/%68ealthz",
        "/_EPODE-SIDECAR/healthz",
        "//_epode-sidecar//healthz",
        "/x/../_epode-sidecar/healthz",
        "/_epode-sidecar;x/healthz",
        "/_epode-sidecar/healthz/",
    ] {
        let got = exchange(sc.addr, &request("GET", path, &[], ""));
        assert_eq!(got.status, 200, "{path}: {}", got.text());
        assert_eq!(
            serde_json::from_slice::<Value>(&got.body).ok(),
            Some(json!({"status": "ok"})),
            "{path}: the sidecar's health, not the app's"
        );
    }
    for path in [
        "/_epode-sidecar%2Fhealthz",
        "/_epode-sidecar/%2E%2E/%2E%2E/x",
    ] {
        let got = exchange(sc.addr, &request("GET", path, &[], ""));
        assert_refused(&got, path, "operations");
    }
    // The app keeps its own routes, whatever their spelling.
    let help = exchange(sc.addr, &request("GET", "/%68elp", &[], ""));
    assert_eq!(help.status, 200, "{}", help.text());
    assert!(help.text().contains("<h1>Help</h1>"), "{}", help.text());
}

/// `--dev` mounts the console at the segment `/_dev` only: the app's `/_devtools`,
/// `/_dev-api/x` and `/_dev.json` reach the app.
#[test]
fn dev_mounts_only_the_dev_segment() {
    let app = Example::start();
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("epode-dev.jsonl");
    let sc = Sidecar::start(
        &app.origin(),
        &[
            ("EPODE_SIDECAR_DEV", "1"),
            ("EPODE_SIDECAR_DEV_LOG", record.to_str().unwrap()),
            ("EPODE_SIDECAR_HTTP_SURFACE", "on"),
        ],
    );
    for path in ["/_devtools", "/_dev-api/x", "/_dev.json", "/_dev_x"] {
        let got = exchange(sc.addr, &request("GET", path, &[], ""));
        assert!(
            got.status == 404 && got.text() == "Not Found",
            "{path} must reach the app (Starlette's plain 404): {} {}",
            got.status,
            got.text()
        );
    }
    for path in ["/_dev/", "/_dev", "/_DEV/", "/%5Fdev/"] {
        let got = exchange(sc.addr, &request("GET", path, &[], ""));
        assert_eq!(got.status, 200, "{path}: {}", got.text());
        assert!(
            got.header("content-type")
                .is_some_and(|t| t.starts_with("text/html")),
            "{path}: the console page"
        );
    }
    let other = exchange(sc.addr, &request("GET", "/_dev/nothing", &[], ""));
    assert_eq!(other.status, 404);
    assert!(
        other.text().contains("the console is GET /_dev/"),
        "{}",
        other.text()
    );
}

/// A scripted upstream that answers every request, and a sidecar with the surface on in front
/// of it (the era pinned, so no request but the test's reaches it).
fn scripted_rig() -> (Scripted, Sidecar) {
    let up = ScriptedUpstream::new()
        .on(
            "tools/list",
            Reply::result(json!({"tools": [], "resultType": "complete"})),
        )
        .otherwise(Reply::json(r#"{"app":true}"#))
        .start();
    let sc = Sidecar::start(
        &up.url(),
        &[
            ("EPODE_SIDECAR_HTTP_SURFACE", "on"),
            ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28"),
        ],
    );
    (up, sc)
}

/// CONNECT gets 501 on every route, and nothing reaches the upstream; before, the surface sent
/// `CONNECT /` to the app and the client's connection closed with no status.
#[test]
fn connect_is_refused_and_nothing_is_sent_upstream() {
    let (up, sc) = scripted_rig();
    let url = up.url();
    let authority = url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    for target in [authority.as_str(), "127.0.0.1:443", "example.com:80"] {
        let got = exchange(
            sc.addr,
            &request("CONNECT", target, &[("host", target)], ""),
        );
        assert_eq!(got.status, 501, "CONNECT {target}: {}", got.text());
        let message = got.message();
        assert!(
            message["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("CONNECT")),
            "{}",
            got.text()
        );
    }
    let seen: Vec<String> = up.requests().iter().map(|r| r.head.clone()).collect();
    assert!(
        seen.iter().all(|h| !h.starts_with("CONNECT")),
        "a CONNECT reached the upstream: {seen:#?}"
    );
    // The surface itself still passes a plain request on.
    let got = exchange(sc.addr, &request("GET", "/after-connect", &[], ""));
    assert_eq!(got.status, 200, "{}", got.text());
    assert!(up
        .requests()
        .iter()
        .any(|r| r.head.starts_with("GET /after-connect")));
}

/// Two `Host` headers, userinfo in `Host`, a port past 65535, or an HTTP/2 `:authority` that
/// names another server than `host`: 400 on the MCP path, the surface and the operations'
/// routes alike, and nothing reaches the upstream.
#[tokio::test]
async fn a_lenient_host_is_refused_on_every_route() {
    let (up, sc) = scripted_rig();
    let list = modern("tools/list", None);
    let body = modern_body(json!(1), "tools/list", json!({})).to_string();
    let bad_hosts: [&[&str]; 4] = [
        &["127.0.0.1", "evil.example"],
        &["127.0.0.1:80@evil.example"],
        &["127.0.0.1:99999"],
        &["127.0.0.1:1:2"],
    ];
    let routes = [
        ("POST", "/mcp?probe=mcp"),
        ("GET", "/probe-surface"),
        ("GET", "/_epode-sidecar/healthz"),
    ];
    let addr = sc.addr;
    let answers = tokio::task::spawn_blocking(move || {
        let mut answers = Vec::new();
        for hosts in bad_hosts {
            for (method, path) in routes {
                let mut headers: Vec<(&str, &str)> = hosts.iter().map(|h| ("host", *h)).collect();
                headers.extend(as_refs(&list));
                let got = exchange(addr, &request(method, path, &headers, &body));
                answers.push((format!("{method} {path} {hosts:?}"), got));
            }
        }
        answers
    })
    .await
    .unwrap();
    for (what, got) in &answers {
        assert_eq!(got.status, 400, "{what}: {}", got.text());
        let message = got.message();
        assert!(
            message["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("Host")),
            "{what}: {}",
            got.text()
        );
    }
    // HTTP/2: an `:authority` another server than `host`, then one that agrees.
    for (authority, host, want) in [
        ("evil.example", Some("127.0.0.1"), 400),
        ("127.0.0.1", Some("evil.example"), 400),
        ("127.0.0.1:99999", None, 400),
        ("127.0.0.1", Some("127.0.0.1"), 200),
        ("127.0.0.1", None, 200),
    ] {
        for path in ["/_epode-sidecar/healthz", "/probe-h2"] {
            let (status, text) = h2_get(sc.addr, authority, host, path).await;
            assert_eq!(status, want, "h2 {authority} host {host:?} {path}: {text}");
            if want == 400 {
                assert!(text.contains("Host"), "{text}");
            }
        }
    }
    let probes: Vec<String> = up
        .requests()
        .iter()
        .map(|r| r.head.lines().next().unwrap_or_default().to_owned())
        .filter(|l| l.contains("probe"))
        .collect();
    assert_eq!(
        probes,
        vec!["GET /probe-h2 HTTP/1.1"; 2],
        "only the two well-formed HTTP/2 requests reach the upstream"
    );
}

/// One HTTP/2 (prior knowledge) GET with this `:authority` and `host`: its status and body.
async fn h2_get(
    addr: SocketAddr,
    authority: &str,
    host: Option<&str>,
    path: &str,
) -> (u16, String) {
    use http_body_util::BodyExt as _;
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let mut req = hyper::Request::get(format!("http://{authority}{path}"));
    if let Some(h) = host {
        req = req.header("host", h);
    }
    let req = req
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}
