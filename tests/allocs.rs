//! What one request costs the sidecar in heap allocations: the number and the bytes, counted by
//! a heap profiler (`dhat`) that is this binary's global allocator, for the pass-through
//! (`prompts/list`) and the decorated call (`tools/call` in never_ask, its telemetry event
//! delivered), each through a sidecar of its own.
//!
//! The binary is its own child: started with `EPODE_ALLOCS_CHILD=1` and no arguments it is the
//! sidecar (the library's `main`, configured from the environment as the image's binary is),
//! under the profiler; a line on its stdin makes it print the allocations so far. The parent
//! runs a tiny upstream and Epode (threads, plain `std` sockets: their allocations are not the
//! child's), sends the warm-up, reads the count, sends `N` requests on one keep-alive
//! connection, reads it again. Every answer is checked whole.
//!
//! `cargo test --test allocs` fails when a request costs more than twice what it cost when the
//! figures below were last measured (so a change that doubles them is seen), and prints the
//! figures beside the targets. `bench/allocs` runs it optimised and names where the
//! allocations are made (`--sites`: the profiler's file, its sites by count).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

const CHILD: &str = "EPODE_ALLOCS_CHILD";
const KEY: &str = "af_live_0123456789abcdef0123456789abcdef_fedcba9876543210fedcba9876543210_allocs_secret_not_a_real_key";

/// The figures last measured (allocations and bytes per request, `cargo test --test allocs`,
/// unoptimised as CI builds it: the counts are an optimised build's too, the bytes a little
/// more, its request future being larger); the test fails at twice these. Lower them when a
/// change makes a request cheaper.
const MEASURED: [(&str, u64, u64); 2] = [("pass-through", 29, 30_095), ("decorated", 95, 69_261)];

/// Issue 45's targets, printed beside the figures.
const TARGETS: [(&str, u64); 2] = [("pass-through", 10), ("decorated", 40)];

fn main() -> ExitCode {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    let args: Vec<String> = std::env::args().collect();
    let sites = args.iter().any(|a| a == "--sites");
    let requests: usize = std::env::var("EPODE_ALLOCS_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let upstream = Upstream::start();
    let mut failed = Vec::new();
    for scenario in [Scenario::PassThrough, Scenario::Decorated] {
        let (blocks, bytes) = measure(scenario, upstream.port, requests, sites);
        let per = |n: u64| n as f64 / requests as f64;
        let (_, base_blocks, base_bytes) = MEASURED
            .iter()
            .find(|m| m.0 == scenario.name())
            .copied()
            .expect("a figure per scenario");
        let target = TARGETS.iter().find(|t| t.0 == scenario.name()).unwrap().1;
        println!(
            "allocs: {:<13} {:>7.1} allocations, {:>8.0} bytes per request \
             (last measured {base_blocks}, {base_bytes}; issue 45's target {target})",
            scenario.name(),
            per(blocks),
            per(bytes),
        );
        if per(blocks) > 2.0 * base_blocks as f64 {
            failed.push(format!(
                "{}: {:.1} allocations per request, more than twice the {base_blocks} measured",
                scenario.name(),
                per(blocks)
            ));
        }
        if per(bytes) > 2.0 * base_bytes as f64 {
            failed.push(format!(
                "{}: {:.0} bytes allocated per request, more than twice the {base_bytes} measured",
                scenario.name(),
                per(bytes)
            ));
        }
    }
    if failed.is_empty() {
        return ExitCode::SUCCESS;
    }
    for f in failed {
        eprintln!("allocs: FAILED: {f}");
    }
    ExitCode::FAILURE
}

#[derive(Clone, Copy)]
enum Scenario {
    PassThrough,
    Decorated,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::PassThrough => "pass-through",
            Scenario::Decorated => "decorated",
        }
    }

    /// The request's bytes, sent again and again on one connection.
    fn request(self, port: u16) -> Vec<u8> {
        let (method, name, params) = match self {
            Scenario::PassThrough => ("prompts/list", None, "{\"_meta\":{META}}"),
            Scenario::Decorated => (
                "tools/call",
                Some("search"),
                "{\"name\":\"search\",\"arguments\":{\"q\":\"shoes\"},\"_meta\":{META}}",
            ),
        };
        let meta = r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"{method}","params":{}}}"#,
            params.replace("{META}", meta)
        );
        let mut head = format!(
            "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n\
             accept: application/json, text/event-stream\r\nmcp-protocol-version: 2026-07-28\r\n\
             mcp-method: {method}\r\ncontent-length: {}\r\n",
            body.len()
        );
        if let Some(n) = name {
            head.push_str(&format!("mcp-name: {n}\r\n"));
        }
        head.push_str("\r\n");
        head.push_str(&body);
        head.into_bytes()
    }

    /// Whether an answer is this request's whole result.
    fn whole(self, body: &str) -> bool {
        let result = body.contains(r#""id":7,"result":{"#);
        let feedback = body.contains(r#""_agentFeedback":"#);
        result
            && match self {
                Scenario::PassThrough => body.contains(r#""prompts":["#) && !feedback,
                Scenario::Decorated => body.contains(r#""hits"#) && feedback,
            }
    }
}

// ---------------------------------------------------------------------------------------
// The child: the sidecar under the profiler.

fn child() -> ExitCode {
    let profiler = match std::env::var_os("EPODE_ALLOCS_SITES") {
        Some(file) => dhat::Profiler::builder().file_name(file).build(),
        None => dhat::Profiler::builder().testing().build(),
    };
    std::thread::spawn(|| {
        for line in std::io::stdin().lines() {
            if line.is_err() {
                break;
            }
            let stats = dhat::HeapStats::get();
            println!("allocs {} {}", stats.total_blocks, stats.total_bytes);
        }
    });
    let code = epode_sidecar::main();
    drop(profiler);
    code
}

struct Sidecar {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    port: u16,
}

impl Sidecar {
    fn start(upstream: u16, sites: Option<&str>) -> Sidecar {
        let mut child = Command::new(std::env::current_exe().expect("this binary"))
            .env_clear()
            .env(CHILD, "1")
            .env("EPODE_SIDECAR_LISTEN", "127.0.0.1:0")
            .env(
                "EPODE_SIDECAR_UPSTREAM",
                format!("http://127.0.0.1:{upstream}/mcp"),
            )
            .env("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28")
            .env("EPODE_API_KEY", KEY)
            .env("EPODE_API_URL", format!("http://127.0.0.1:{upstream}"))
            .env("AGENT_FEEDBACK_MODE", "never_ask")
            .env("EPODE_SIDECAR_LOG", "warn")
            // One worker: the request path as a single-core deployment runs it.
            .env("EPODE_SIDECAR_WORKERS", "1")
            .envs(sites.map(|f| ("EPODE_ALLOCS_SITES", f)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start this binary as the sidecar");
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let port = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = lines
                .recv_timeout(left)
                .expect("the sidecar says where it listens within 60 s");
            if let Some(addr) = line.strip_prefix("epode-sidecar listening on ") {
                break addr
                    .rsplit(':')
                    .next()
                    .and_then(|p| p.parse().ok())
                    .expect("an address with a port");
            }
        };
        Sidecar {
            child,
            stdin,
            lines,
            port,
        }
    }

    /// The allocations (count, bytes) the sidecar has made so far.
    fn allocated(&mut self) -> (u64, u64) {
        writeln!(self.stdin).expect("the sidecar reads its stdin");
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(30))
                .expect("the sidecar prints its allocations within 30 s");
            if let Some(rest) = line.strip_prefix("allocs ") {
                let mut n = rest.split(' ').map(|v| v.parse::<u64>().expect("numbers"));
                return (n.next().unwrap(), n.next().unwrap());
            }
        }
    }

    /// Stops it as an operator does (SIGTERM: drain, flush, the profiler's file written).
    fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Allocations (count, bytes) `requests` of `scenario` cost a sidecar of its own, after a
/// warm-up (connections, the tool catalog, the allocator's and tables' first growth).
fn measure(scenario: Scenario, upstream: u16, requests: usize, sites: bool) -> (u64, u64) {
    let file = format!("target/allocs-{}.json", scenario.name());
    let mut sidecar = Sidecar::start(upstream, sites.then_some(file.as_str()));
    let request = scenario.request(sidecar.port);
    let mut conn = Client::connect(sidecar.port);
    for _ in 0..200 {
        conn.call(scenario, &request);
    }
    // The warm-up's telemetry delivered before counting (the batches go every so often).
    std::thread::sleep(Duration::from_millis(1200));
    let before = sidecar.allocated();
    for _ in 0..requests {
        conn.call(scenario, &request);
    }
    // The counted calls' telemetry delivered too: a decorated call's event is its cost.
    std::thread::sleep(Duration::from_millis(1200));
    let after = sidecar.allocated();
    drop(conn);
    sidecar.stop();
    if sites {
        println!("allocs: {}: the sites in {file}", scenario.name());
    }
    (after.0 - before.0, after.1 - before.1)
}

// ---------------------------------------------------------------------------------------
// Both ends of plain HTTP/1.1 with `content-length` bodies: just enough for this test.

/// Reads one message (head and `content-length` body) from `r`; `None` at the end.
fn read_message(r: &mut BufReader<TcpStream>) -> Option<(String, Vec<u8>)> {
    let mut head = String::new();
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().ok()?;
            }
        }
        head.push_str(&line);
    }
    let mut body = vec![0; length];
    r.read_exact(&mut body).ok()?;
    Some((head, body))
}

struct Client {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Client {
    fn connect(port: u16) -> Client {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to the sidecar");
        stream.set_nodelay(true).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Client {
            writer: stream.try_clone().unwrap(),
            reader: BufReader::new(stream),
        }
    }

    fn call(&mut self, scenario: Scenario, request: &[u8]) {
        self.writer.write_all(request).expect("send a request");
        let (head, body) = read_message(&mut self.reader).expect("an answer");
        let body = String::from_utf8_lossy(&body);
        assert!(
            head.starts_with("HTTP/1.1 200") && scenario.whole(&body),
            "{}: not a whole answer: {head}{body}",
            scenario.name()
        );
    }
}

/// The upstream MCP server and Epode's telemetry endpoint, on one port.
struct Upstream {
    port: u16,
}

impl Upstream {
    fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the upstream");
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                std::thread::spawn(move || serve(stream));
            }
        });
        Upstream { port }
    }
}

fn serve(stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    while let Some((head, body)) = read_message(&mut reader) {
        let (status, answer) = answer(&head, &body);
        let msg = format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
            answer.len()
        );
        if writer.write_all(msg.as_bytes()).is_err() {
            return;
        }
    }
}

/// The answer to one request: Epode's to a telemetry batch, else the MCP server's.
fn answer(head: &str, body: &[u8]) -> (&'static str, String) {
    let message: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    if head.starts_with("POST /api/v2/telemetry/batches ") {
        let n = message["events"].as_array().map_or(0, Vec::len);
        return ("202 Accepted", format!(r#"{{"accepted":{n},"dropped":0}}"#));
    }
    let id = message["id"].to_string();
    let info = r#""_meta":{"io.modelcontextprotocol/serverInfo":{"name":"allocs-upstream","version":"1.0.0"}}"#;
    let result = match message["method"].as_str().unwrap_or_default() {
        "server/discover" => format!(
            r#"{{"resultType":"complete","supportedVersions":["2026-07-28"],"capabilities":{{"tools":{{}},"prompts":{{}}}},{info}}}"#
        ),
        // A list as a 2026 server gives it: its cache hints and identity included.
        "prompts/list" => format!(
            r#"{{"resultType":"complete","prompts":[{{"name":"summarise"}}],"ttlMs":0,"cacheScope":"private",{info}}}"#
        ),
        "tools/list" => format!(
            r#"{{"resultType":"complete","tools":[{{"name":"search","inputSchema":{{"type":"object"}}}}],"ttlMs":0,"cacheScope":"private",{info}}}"#
        ),
        "tools/call" => format!(
            r#"{{"resultType":"complete","content":[{{"type":"text","text":"{{\"hits\":3}}"}}],{info}}}"#
        ),
        _ => {
            return (
                "200 OK",
                format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32601,"message":"Method not found"}}}}"#
                ),
            )
        }
    };
    (
        "200 OK",
        format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#),
    )
}
