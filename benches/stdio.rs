//! The stdio benchmark: the same Python stdio MCP server (`tests/peers/py_server.py --stdio`,
//! the official SDK `mcp==2.3.0`) reached four ways in one run, interleaved:
//!
//! - **direct**: this harness speaks to its own child over the pipe (the floor: no HTTP at all);
//! - **epode-sidecar** (`-- python server.py --stdio`, feedback off: the bridge alone), a
//!   2026-07-28 client, one child for every client;
//! - **supergateway --stateful** (npm, the stdio-to-Streamable-HTTP bridge people use), a
//!   2025-11-25 client with a session per connection, one child per session;
//! - **supergateway** (stateless), a 2026-07-28 client: it starts a child per request.
//!
//! `tools/call` of `echo`, at concurrency 1 and 8; throughput and the latency each bridge adds
//! to the direct pipe. Entered through `bench/run` (which builds in release mode and installs
//! supergateway into the peers folder); `SUPERGATEWAY=<path to dist/index.js>` and
//! `EPODE_PEERS_DIR` locate the peers when run directly:
//! `cargo bench --bench stdio -- [--quick] [--json]`. `EPODE_BENCH_BASELINE_BIN=<another build>`
//! adds that build of the sidecar as a fifth path, interleaved with the others.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::oneshot;

mod support;
use support::*;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn peers() -> PathBuf {
    std::env::var_os("EPODE_PEERS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".peers"))
}

/// The Python stdio server's command line.
fn server_argv() -> Vec<String> {
    vec![
        peers().join("py/bin/python").display().to_string(),
        repo()
            .join("tests/peers/py_server.py")
            .display()
            .to_string(),
        "--stdio".to_owned(),
    ]
}

fn meta() -> Value {
    json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
           "io.modelcontextprotocol/clientCapabilities": {}})
}

fn call_body(id: u64, modern: bool) -> String {
    let mut params = json!({"name": "echo", "arguments": {"text": "hello"}});
    if modern {
        params["_meta"] = meta();
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}).to_string()
}

// ---------------------------------------------------------------------------------------
// Direct: the harness is the stdio client.

type Waiters = Arc<Mutex<HashMap<u64, oneshot::Sender<()>>>>;

async fn direct(concurrency: usize, for_how_long: Duration) -> Sample {
    let argv = server_argv();
    let mut child = tokio::process::Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdin = Arc::new(tokio::sync::Mutex::new(child.stdin.take().unwrap()));
    let waiters: Waiters = Arc::default();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let reading = {
        let waiters = waiters.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
                if let Some(id) = v["id"].as_u64() {
                    if let Some(w) = waiters.lock().unwrap().remove(&id) {
                        let _ = w.send(());
                    }
                }
            }
        })
    };
    let send = move |id: u64, body: String| {
        let stdin = stdin.clone();
        let waiters = waiters.clone();
        async move {
            let (tx, rx) = oneshot::channel();
            waiters.lock().unwrap().insert(id, tx);
            let mut line = body.into_bytes();
            line.push(b'\n');
            stdin.lock().await.write_all(&line).await.unwrap();
            rx.await.is_ok()
        }
    };
    // The era is fixed by the first message, as the sidecar's probe does.
    let discover = json!({"jsonrpc": "2.0", "id": 0, "method": "server/discover", "params": {"_meta": meta()}});
    assert!(send(0, discover.to_string()).await);
    let next = Arc::new(std::sync::atomic::AtomicU64::new(1));
    let started = Instant::now();
    let deadline = started + for_how_long;
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let next = next.clone();
        let send = send.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut errors = 0;
            while Instant::now() < deadline {
                let id = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let t = Instant::now();
                if send(id, call_body(id, true)).await {
                    lat.push(t.elapsed().as_micros() as u32);
                } else {
                    errors += 1;
                }
            }
            (lat, errors, 0)
        }));
    }
    let sample = collect(tasks, started).await;
    reading.abort();
    sample
}

// ---------------------------------------------------------------------------------------
// Over HTTP: a bridge in front of the same server.

#[derive(Clone, Copy, PartialEq)]
enum Client {
    /// 2026-07-28, stateless.
    Modern,
    /// 2025-11-25 with a session per connection (initialize, initialized, then calls).
    LegacySession,
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn post(
    send: &mut Sender,
    body: String,
    headers: &[(&str, String)],
) -> Option<hyper::Response<Bytes>> {
    let mut req = Request::post("/mcp")
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    for (k, v) in headers {
        req = req.header(*k, v.as_str());
    }
    let resp = send
        .send_request(req.body(Full::new(Bytes::from(body))).ok()?)
        .await
        .inspect_err(|e| eprintln!("bench: a request failed: {e}"))
        .ok()?;
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.ok()?.to_bytes();
    Some(hyper::Response::from_parts(parts, bytes))
}

/// Opens a connection and, for a session client, its session: the headers for calls.
async fn open(addr: SocketAddr, client: Client) -> Option<(Sender, Vec<(&'static str, String)>)> {
    let mut send = connect_http1(addr).await?;
    if client == Client::Modern {
        let headers = vec![
            ("mcp-protocol-version", "2026-07-28".to_owned()),
            ("mcp-method", "tools/call".to_owned()),
            ("mcp-name", "echo".to_owned()),
        ];
        return Some((send, headers));
    }
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}});
    let resp = post(&mut send, init.to_string(), &[]).await?;
    let session = resp
        .headers()
        .get("mcp-session-id")?
        .to_str()
        .ok()?
        .to_owned();
    let mut headers = vec![
        ("mcp-protocol-version", "2025-11-25".to_owned()),
        ("mcp-session-id", session),
    ];
    let note = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_owned();
    post(&mut send, note, &headers).await?;
    headers.push(("mcp-method", "tools/call".to_owned()));
    Some((send, headers))
}

/// Whether an answer is the echo's result (JSON, or the last event of an SSE stream).
fn answered(resp: &hyper::Response<Bytes>) -> bool {
    let text = String::from_utf8_lossy(resp.body());
    resp.status() == 200 && text.contains("\"result\"") && text.contains("hello")
}

/// Open connections (and sessions) of one client kind to one bridge, kept across slices as a
/// long-lived client keeps them.
type Conns = Vec<(Sender, Vec<(&'static str, String)>)>;

async fn connect(addr: SocketAddr, client: Client, n: usize) -> Conns {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        let conn = tokio::spawn(open(addr, client)).await.ok().flatten();
        conns.push(conn.unwrap_or_else(|| panic!("cannot open a connection to {addr}")));
    }
    conns
}

/// A bridge's load: each connection sends calls back to back. A connection the bridge closed
/// while it was idle between slices (Node closes idle keep-alive connections after 5 s) is
/// opened again, with the same session, and counted as a reconnect, not an error.
async fn over_http(
    addr: SocketAddr,
    conns: Conns,
    client: Client,
    for_how_long: Duration,
) -> (Sample, Conns) {
    let started = Instant::now();
    let deadline = started + for_how_long;
    let mut tasks = Vec::new();
    for (mut send, headers) in conns {
        tasks.push(tokio::spawn(async move {
            let (mut lat, mut errors, mut reconnects) = (Vec::new(), 0, 0);
            let mut id = 1;
            let modern = client == Client::Modern;
            while Instant::now() < deadline {
                id += 1;
                if send.is_closed() || send.ready().await.is_err() {
                    match connect_http1(addr).await {
                        Some(s) => (send, reconnects) = (s, reconnects + 1),
                        None => {
                            errors += 1;
                            break;
                        }
                    }
                }
                let t = Instant::now();
                match post(&mut send, call_body(id, modern), &headers).await {
                    Some(r) if answered(&r) => lat.push(t.elapsed().as_micros() as u32),
                    _ => errors += 1,
                }
            }
            (lat, errors, reconnects, (send, headers))
        }));
    }
    let mut sample = Sample::default();
    let mut kept = Vec::new();
    for t in tasks {
        let (lat, errors, reconnects, conn) = t.await.unwrap();
        sample.latencies_us.extend(lat);
        sample.errors += errors;
        sample.reconnects += reconnects;
        kept.push(conn);
    }
    sample.elapsed = started.elapsed();
    (sample, kept)
}

// ---------------------------------------------------------------------------------------

fn start_sidecar(port: u16, binary: PathBuf) -> Proc {
    let child = Command::new(binary)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("EPODE_SIDECAR_LISTEN", format!("127.0.0.1:{port}"))
        .env("AGENT_FEEDBACK_MODE", "off")
        .env("EPODE_SIDECAR_LOG", "warn")
        .arg("--")
        .args(server_argv())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the sidecar (`bench/run` builds it; EPODE_SIDECAR_BIN names another)");
    wait_port(port);
    Proc(child)
}

fn supergateway() -> Option<PathBuf> {
    std::env::var_os("SUPERGATEWAY")
        .map(PathBuf::from)
        .or_else(|| Some(peers().join("supergateway/node_modules/supergateway/dist/index.js")))
        .filter(|p| p.exists())
}

fn start_supergateway(script: &PathBuf, port: u16, stateful: bool) -> Proc {
    let mut cmd = Command::new("node");
    cmd.arg(script)
        .args(["--stdio", &server_argv().join(" ")])
        .args(["--outputTransport", "streamableHttp"])
        .args(["--port", &port.to_string(), "--logLevel", "none"]);
    if stateful {
        cmd.arg("--stateful");
    }
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start supergateway");
    wait_port(port);
    Proc(child)
}

struct Target {
    name: &'static str,
    addr: Option<SocketAddr>,
    client: Client,
    conns: Conns,
    /// Slices are capped for a bridge that starts a process per request.
    slow: bool,
    sample: Sample,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let as_json = args.iter().any(|a| a == "--json");
    // Three rounds either way, the targets' order rotated each round; a quick run's slices
    // are shorter.
    let (rounds, slice) = if quick {
        (3, Duration::from_millis(500))
    } else {
        (3, Duration::from_secs(2))
    };
    let sc_port = free_port();
    let sidecar = start_sidecar(sc_port, sidecar_binary());
    // EPODE_BENCH_BASELINE_BIN: another build of the sidecar measured in the same run, its
    // slices interleaved with the others (a before/after that the machine's drift between
    // runs cannot blur).
    let baseline = std::env::var_os("EPODE_BENCH_BASELINE_BIN").map(|bin| {
        let port = free_port();
        (port, start_sidecar(port, PathBuf::from(bin)))
    });
    let sg = supergateway();
    if sg.is_none() {
        eprintln!(
            "bench: supergateway not found (bench/run installs it); comparing with direct only"
        );
    }
    let (sg_stateful_port, sg_port) = (free_port(), free_port());
    let sg_procs = sg.as_ref().map(|s| {
        (
            start_supergateway(s, sg_stateful_port, true),
            start_supergateway(s, sg_port, false),
        )
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let at = |p: u16| Some(SocketAddr::from(([127, 0, 0, 1], p)));
    let mut report = Vec::new();
    let mut raw: Vec<serde_json::Value> = Vec::new();
    for concurrency in [1usize, 8] {
        let mut targets = vec![
            Target {
                name: "direct (pipe)",
                addr: None,
                client: Client::Modern,
                slow: false,
                sample: Sample::default(),
                conns: Vec::new(),
            },
            Target {
                name: "epode-sidecar",
                addr: at(sc_port),
                client: Client::Modern,
                slow: false,
                sample: Sample::default(),
                conns: Vec::new(),
            },
        ];
        if let Some((port, _)) = &baseline {
            targets.push(Target {
                name: "epode-sidecar (baseline)",
                addr: at(*port),
                client: Client::Modern,
                slow: false,
                sample: Sample::default(),
                conns: Vec::new(),
            });
        }
        if sg.is_some() {
            targets.push(Target {
                name: "supergateway --stateful",
                addr: at(sg_stateful_port),
                client: Client::LegacySession,
                slow: false,
                sample: Sample::default(),
                conns: Vec::new(),
            });
            targets.push(Target {
                name: "supergateway (stateless)",
                addr: at(sg_port),
                client: Client::Modern,
                slow: true,
                sample: Sample::default(),
                conns: Vec::new(),
            });
        }
        // Connections (and sessions: children started) opened once; a warm-up slice each.
        for t in &mut targets {
            if let Some(addr) = t.addr {
                let conns = rt.block_on(connect(addr, t.client, concurrency));
                let warm = Duration::from_millis(800);
                t.conns = rt.block_on(over_http(addr, conns, t.client, warm)).1;
            }
        }
        for round in 0..rounds {
            // The order rotated each round, so no target is always measured first or last.
            let n = targets.len();
            for position in 0..n {
                let t = &mut targets[(round + position) % n];
                eprintln!("bench: stdio {} at concurrency {concurrency}", t.name);
                let slice = if t.slow {
                    slice.min(Duration::from_secs(2))
                } else {
                    slice
                };
                let s = match t.addr {
                    None => rt.block_on(direct(concurrency, slice)),
                    Some(addr) => {
                        let conns = std::mem::take(&mut t.conns);
                        let (s, conns) = rt.block_on(over_http(addr, conns, t.client, slice));
                        t.conns = conns;
                        s
                    }
                };
                // Every slice's own figures, kept in the artefact as measured.
                raw.push(
                    json!({"target": t.name, "concurrency": concurrency, "round": round,
                                "position": position, "figures": stats(&s)}),
                );
                t.sample.merge(s);
            }
        }
        let direct_p50 = targets[0].sample.pct(0.5);
        for t in &targets {
            let mut v = stats(&t.sample);
            v["name"] = json!(t.name);
            v["concurrency"] = json!(concurrency);
            v["added_p50_us"] = json!(t.sample.pct(0.5) - direct_p50);
            report.push(v);
        }
    }
    let mut failed: Vec<String> = report
        .iter()
        .filter(|r| r["errors"].as_u64().unwrap_or(0) > 0)
        .map(|r| {
            format!(
                "{} at concurrency {}: {} errors",
                r["name"], r["concurrency"], r["errors"]
            )
        })
        .collect();
    // Every bridge stopped with SIGTERM; what it started must be gone with it.
    let mut stopped = vec![("epode-sidecar", sidecar)];
    if let Some((_, proc)) = baseline {
        stopped.push(("epode-sidecar (baseline)", proc));
    }
    if let Some((stateful, stateless)) = sg_procs {
        stopped.push(("supergateway --stateful", stateful));
        stopped.push(("supergateway (stateless)", stateless));
    }
    for (name, proc) in stopped {
        let left = proc.stop();
        if !left.is_empty() {
            failed.push(format!(
                "{name} left processes running after SIGTERM: {left:?}"
            ));
        }
    }
    let report = json!({"quick": quick, "rounds": rounds, "slice_ms": slice.as_millis() as u64, "rows": report, "failures": failed, "raw": raw});
    if !failed.is_empty() {
        for f in &failed {
            eprintln!("bench: FAILED: {f}");
        }
        eprintln!("bench: this run is not a result: a path had errors or left processes behind");
    }
    keep_artefact(&report);
    if as_json {
        println!("{report}");
        std::process::exit(i32::from(
            !report["failures"].as_array().is_none_or(Vec::is_empty),
        ));
    }
    println!(
        "{:<26} {:>4} | {:>10} {:>10} | {:>9} | {:>13} | {:>6} {:>10}",
        "stdio tools/call echo",
        "conc",
        "p50 µs",
        "p99 µs",
        "rps",
        "added p50 µs",
        "errors",
        "reconnects"
    );
    for r in report["rows"].as_array().unwrap() {
        println!(
            "{:<26} {:>4} | {:>10.0} {:>10.0} | {:>9.1} | {:>13.0} | {:>6} {:>10}",
            r["name"].as_str().unwrap(),
            r["concurrency"],
            r["p50_us"].as_f64().unwrap_or(f64::NAN),
            r["p99_us"].as_f64().unwrap_or(f64::NAN),
            r["rps"].as_f64().unwrap_or(0.0),
            r["added_p50_us"].as_f64().unwrap_or(f64::NAN),
            r["errors"],
            r["reconnects"],
        );
    }
    if !report["failures"].as_array().is_none_or(Vec::is_empty) {
        std::process::exit(1);
    }
}
