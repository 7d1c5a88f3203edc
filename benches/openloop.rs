//! The open-loop upstream benchmark: calls arrive at a fixed rate whether or not earlier ones
//! have finished (as a fleet of independent clients sends them), first straight to a fast
//! upstream, then through the sidecar to the same upstream. A closed loop (the overhead
//! benchmark) slows down with whatever it measures; an open loop shows what happens when the
//! path stalls: requests pile up, and a proxy that opens a connection per waiting request
//! floods the upstream. Entered through `bench/run --only openloop`; `cargo bench --bench
//! openloop -- [--rate N] [--seconds S] [--after S] [--threads T] [--mode off|never_ask]
//! [--json]` runs it directly.
//!
//! It reports the calls answered, refused with 503 and failed otherwise, the p50/p99/max
//! latency of each path and what the sidecar adds, the most connections the sidecar had open
//! to the upstream (sampled with `ss` every 100 ms), and the sidecar's RSS idle before the
//! load, at its peak and 30 s after the load ended. Latency is counted from the moment a call
//! was due, not from when it was sent, so a generator that falls behind shows up in it.
//! `MIMALLOC_*` and `EPODE_SIDECAR_*` variables in the environment are passed to the sidecar
//! (to measure an allocator option or a setting).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;

mod support;
use support::*;

const KEY: &str = "af_live_0123456789abcdef0123456789abcdef_fedcba9876543210fedcba9876543210_bench_secret_not_a_real_key";

// ---------------------------------------------------------------------------------------
// The upstream: answers every MCP request at once (and Epode's telemetry endpoint).

const SERVER_INFO: &str =
    r#"{"io.modelcontextprotocol/serverInfo":{"name":"bench-upstream","version":"1.0.0"}}"#;

fn reply(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Req<'a> {
        #[serde(borrow)]
        id: Option<&'a serde_json::value::RawValue>,
        method: Option<String>,
    }
    let Ok(req) = serde_json::from_slice::<Req<'_>>(body) else {
        return r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse"}}"#.into();
    };
    let id = req.id.map(|r| r.get()).unwrap_or("null");
    let result = match req.method.as_deref().unwrap_or_default() {
        "server/discover" => format!(
            r#"{{"resultType":"complete","supportedVersions":["2026-07-28"],"capabilities":{{"tools":{{}}}},"ttlMs":0,"cacheScope":"private","_meta":{SERVER_INFO}}}"#
        ),
        "tools/list" => format!(
            r#"{{"resultType":"complete","tools":[{{"name":"search","description":"Search the catalogue","inputSchema":{{"type":"object","properties":{{"q":{{"type":"string"}}}},"required":["q"]}}}}],"ttlMs":0,"cacheScope":"private","_meta":{SERVER_INFO}}}"#
        ),
        "tools/call" => format!(
            r#"{{"resultType":"complete","content":[{{"type":"text","text":"{{\"hits\":3}}"}}],"_meta":{SERVER_INFO}}}"#
        ),
        _ => {
            return format!(
                r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32601,"message":"Method not found"}}}}"#
            )
        }
    };
    format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#)
}

async fn serve(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let telemetry = req.uri().path() == "/api/v2/telemetry/batches";
    let body = req
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let (status, text) = if telemetry {
        let n = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v["events"].as_array().map(Vec::len))
            .unwrap_or(0);
        (202, format!(r#"{{"accepted":{n},"dropped":0}}"#))
    } else {
        (200, reply(&body))
    };
    let mut resp = Response::new(Full::new(Bytes::from(text)));
    *resp.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or_default();
    resp.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    Ok(resp)
}

fn run_responder(port: u16) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), hyper::service::service_fn(serve))
                    .await;
            });
        }
    });
}

// ---------------------------------------------------------------------------------------
// The load generator.

/// What one open-loop run saw.
#[derive(Default)]
struct Outcome {
    /// Latencies of the calls answered with their result, from when each was due.
    ok_us: Vec<u32>,
    refused_503: u64,
    other_status: u64,
    /// No answer (connection refused or broken).
    failed: u64,
    /// How late the generator sent a call, at most (its own lag: a figure above a few
    /// milliseconds means the machine, not the target, limited the run).
    max_send_lag_us: u64,
    elapsed: Duration,
}

impl Outcome {
    fn pct(&self, p: f64) -> f64 {
        let mut v = self.ok_us.clone();
        if v.is_empty() {
            return f64::NAN;
        }
        v.sort_unstable();
        v[((v.len() - 1) as f64 * p).round() as usize] as f64
    }

    fn calls(&self) -> u64 {
        self.ok_us.len() as u64 + self.refused_503 + self.other_status + self.failed
    }

    fn json(&self) -> Value {
        let ms = |us: f64| (us / 10.0).round() / 100.0;
        json!({
            "calls": self.calls(),
            "ok": self.ok_us.len(),
            "refused_503": self.refused_503,
            "other_status": self.other_status,
            "failed": self.failed,
            "p50_ms": ms(self.pct(0.5)),
            "p99_ms": ms(self.pct(0.99)),
            "max_ms": ms(self.pct(1.0)),
            "max_send_lag_ms": ms(self.max_send_lag_us as f64),
            "answered_per_s": (self.ok_us.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)).round(),
        })
    }
}

/// The connections a generator keeps to its target: any idle one is reused, else a new one
/// is opened (a call never waits for another to finish).
type Idle = Arc<Mutex<Vec<SendRequest<Full<Bytes>>>>>;

enum Answer {
    Ok,
    Refused,
    Other,
    Failed,
}

async fn call(target: SocketAddr, idle: Idle, body: Bytes) -> Answer {
    let mut taken = idle.lock().unwrap().pop();
    if let Some(s) = taken.as_mut() {
        if s.ready().await.is_err() {
            taken = None;
        }
    }
    let mut send = match taken {
        Some(s) => s,
        None => match connect_http1(target).await {
            Some(s) => s,
            None => return Answer::Failed,
        },
    };
    let req = Request::post("/mcp")
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "search")
        .body(Full::new(body))
        .unwrap();
    let Ok(resp) = send.send_request(req).await else {
        return Answer::Failed;
    };
    let status = resp.status().as_u16();
    let Ok(got) = resp.into_body().collect().await.map(|c| c.to_bytes()) else {
        return Answer::Failed;
    };
    idle.lock().unwrap().push(send);
    const RESULT: &[u8] = br#""result":{"resultType":"complete""#;
    match status {
        200 if got.windows(RESULT.len()).any(|w| w == RESULT) => Answer::Ok,
        503 => Answer::Refused,
        _ => Answer::Other,
    }
}

fn call_body() -> Bytes {
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": {}});
    Bytes::from(
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
               "params": {"name": "search", "arguments": {"q": "shoes"}, "_meta": meta}})
        .to_string(),
    )
}

/// `rate` calls a second to `target` for `length`, each sent when due; and the connections
/// the clients leave open (dropped: closed).
async fn open_loop(target: SocketAddr, rate: f64, length: Duration) -> (Outcome, Idle) {
    let idle: Idle = Arc::default();
    let body = call_body();
    let total = (rate * length.as_secs_f64()).round() as u64;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let started = Instant::now() + Duration::from_millis(5);
    let mut max_lag = Duration::ZERO;
    for i in 0..total {
        let due = started + Duration::from_secs_f64(i as f64 / rate);
        let now = Instant::now();
        if due > now {
            tokio::time::sleep_until(due.into()).await;
        } else {
            max_lag = max_lag.max(now - due);
        }
        let (idle, body, tx) = (idle.clone(), body.clone(), tx.clone());
        tokio::spawn(async move {
            let answer = call(target, idle, body).await;
            let _ = tx.send((answer, due.elapsed()));
        });
    }
    drop(tx);
    let mut out = Outcome {
        max_send_lag_us: max_lag.as_micros() as u64,
        ..Outcome::default()
    };
    while let Some((answer, took)) = rx.recv().await {
        match answer {
            Answer::Ok => out
                .ok_us
                .push(took.as_micros().min(u32::MAX as u128) as u32),
            Answer::Refused => out.refused_503 += 1,
            Answer::Other => out.other_status += 1,
            Answer::Failed => out.failed += 1,
        }
    }
    out.elapsed = started.elapsed();
    (out, idle)
}

// ---------------------------------------------------------------------------------------
// Readings of the sidecar while the load runs.

/// Connections open from this machine to `port` now (established or being opened; not those
/// being closed), by `ss`.
fn connections_to(port: u16) -> usize {
    Command::new("ss")
        .args(["-Htn", "state", "established", "state", "syn-sent"])
        .arg(format!("( dport = :{port} )"))
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().count())
        .unwrap_or(0)
}

#[derive(Default)]
struct Samples {
    max_connections: usize,
    max_rss_kib: u64,
}

/// Samples the upstream connections and the RSS every 100 ms until `stop`.
fn sample(
    pid: u32,
    upstream: u16,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Samples> {
    std::thread::spawn(move || {
        let mut s = Samples::default();
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            s.max_connections = s.max_connections.max(connections_to(upstream));
            s.max_rss_kib = s.max_rss_kib.max(rss_kib(pid).0);
            std::thread::sleep(Duration::from_millis(100));
        }
        s
    })
}

/// The limits the sidecar hit (from its `/metrics`): where its refusals came from.
fn limits_hit(port: u16) -> Value {
    use std::io::{Read, Write};
    let mut text = String::new();
    if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        );
        let _ = s.read_to_string(&mut text);
    }
    let hits: serde_json::Map<String, Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("epode_sidecar_limits_hit_total{kind=\""))
        .filter_map(|l| {
            let (kind, rest) = l.split_once('"')?;
            let n: f64 = rest.rsplit(' ').next()?.parse().ok()?;
            (n > 0.0).then(|| (kind.to_owned(), json!(n as u64)))
        })
        .collect();
    Value::Object(hits)
}

/// The resident set by kind (KiB): the heap and stacks (`RssAnon`), the binary's pages read
/// from its file (`RssFile`, clean: the kernel drops them under pressure), and the threads.
fn rss_parts(pid: u32) -> Value {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let get = |k: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    json!({"rss": get("VmRSS:"), "anon": get("RssAnon:"), "file": get("RssFile:"), "threads": get("Threads:")})
}

fn start_sidecar(port: u16, upstream: u16, epode: u16, mode: &str) -> Proc {
    let passed = std::env::vars().filter(|(k, _)| {
        k.starts_with("MIMALLOC_") || (k.starts_with("EPODE_SIDECAR_") && k != "EPODE_SIDECAR_BIN")
    });
    let child = Command::new(sidecar_binary())
        .env_clear()
        .env("EPODE_SIDECAR_LISTEN", format!("127.0.0.1:{port}"))
        .env(
            "EPODE_SIDECAR_UPSTREAM",
            format!("http://127.0.0.1:{upstream}/mcp"),
        )
        .env("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28")
        .env("EPODE_API_KEY", KEY)
        .env("EPODE_API_URL", format!("http://127.0.0.1:{epode}"))
        .env("AGENT_FEEDBACK_MODE", mode)
        .env("EPODE_SIDECAR_LOG", "warn")
        .envs(passed)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the sidecar (`bench/run` builds it; EPODE_SIDECAR_BIN names another)");
    wait_port(port);
    Proc(child)
}

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--responder") {
        run_responder(args[i + 1].parse().unwrap());
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let rate: f64 = arg(&args, "--rate", 5000.0);
    let seconds: f64 = arg(&args, "--seconds", if quick { 8.0 } else { 20.0 });
    let after: u64 = arg(&args, "--after", 30);
    let threads: usize = arg(&args, "--threads", 1);
    let mode: String = arg(&args, "--mode", "off".to_owned());
    let as_json = args.iter().any(|a| a == "--json");
    let keep = args.iter().any(|a| a == "--keep");
    let length = Duration::from_secs_f64(seconds);
    let log = |msg: String| eprintln!("bench: {msg}");

    // The upstream, and Epode's stand-in on a port of its own (so the connections counted to
    // the upstream are the hop's only).
    let responder = |port: u16| {
        let p = Proc(
            Command::new(std::env::current_exe().unwrap())
                .args(["--responder", &port.to_string()])
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        );
        wait_port(port);
        p
    };
    let (up_port, epode_port) = (free_port(), free_port());
    let _upstream = responder(up_port);
    let _epode = responder(epode_port);
    let sc_port = free_port();
    let sidecar = start_sidecar(sc_port, up_port, epode_port, &mode);
    let sc_pid = sidecar.0.id();
    let direct = SocketAddr::from(([127, 0, 0, 1], up_port));
    let via_sidecar = SocketAddr::from(([127, 0, 0, 1], sc_port));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap();

    log(format!(
        "warm-up, then {rate} calls/s for {seconds} s straight to the upstream"
    ));
    rt.block_on(open_loop(via_sidecar, 200.0, Duration::from_secs(1)));
    let direct_run = rt.block_on(open_loop(direct, rate, length)).0;
    // The sidecar at rest after its warm-up: the idle figure.
    std::thread::sleep(Duration::from_secs(5));
    let (rss_idle, _) = rss_kib(sc_pid);
    let parts_idle = rss_parts(sc_pid);

    log(format!(
        "{rate} calls/s for {seconds} s through the sidecar"
    ));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = sample(sc_pid, up_port, stop.clone());
    let ticks = cpu_ticks(sc_pid);
    let (sidecar_run, clients) = rt.block_on(open_loop(via_sidecar, rate, length));
    // The clients go away (their connections close), unless told to stay (`--keep`: idle
    // keep-alive connections, closed by the sidecar after its idle timeout).
    let kept = clients.lock().unwrap().len();
    if !keep {
        clients.lock().unwrap().clear();
    }
    let cpu_us_per_call = (cpu_ticks(sc_pid) - ticks) as f64 * 1e6
        / clock_ticks_per_sec() as f64
        / sidecar_run.calls().max(1) as f64;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let samples = sampler.join().unwrap();
    let (rss_end, hwm) = rss_kib(sc_pid);
    log(format!(
        "load over; RSS {rss_end} KiB; reading it for {after} s"
    ));
    let mut rss_after = Vec::new();
    for s in 1..=after {
        std::thread::sleep(Duration::from_secs(1));
        if [1, 5, 10, 20, 30].contains(&s) || s == after {
            rss_after.push(json!({"s": s, "rss_kib": rss_kib(sc_pid).0}));
        }
    }
    let (rss_final, _) = rss_kib(sc_pid);
    let parts_final = rss_parts(sc_pid);
    drop(clients);
    let limits = limits_hit(sc_port);
    let left = sidecar.stop();

    let added = |p: f64| {
        let d = sidecar_run.pct(p) - direct_run.pct(p);
        (d / 10.0).round() / 100.0
    };
    let report = json!({
        "rate": rate, "seconds": seconds, "generator_threads": threads, "mode": mode,
        "direct": direct_run.json(),
        "sidecar": sidecar_run.json(),
        "added_ms": {"p50": added(0.5), "p99": added(0.99)},
        "sidecar_cpu_us_per_call": (cpu_us_per_call * 10.0).round() / 10.0,
        "upstream_connections_max": samples.max_connections,
        "client_connections": kept, "client_connections_kept": keep,
        "sidecar_limits_hit": limits,
        "rss_kib": {"idle": rss_idle, "peak": samples.max_rss_kib.max(rss_end), "hwm": hwm,
                     "end_of_load": rss_end, "after": rss_after, "final": rss_final,
                     "final_minus_idle": rss_final as i64 - rss_idle as i64,
                     "parts_idle": parts_idle, "parts_final": parts_final},
        "left_behind": left,
    });
    keep_artefact(&report);
    if as_json {
        println!("{report}");
    } else {
        print_report(&report);
    }
}

fn print_report(r: &Value) {
    println!(
        "open loop, {} calls/s for {} s, generator threads {}, feedback {}",
        r["rate"], r["seconds"], r["generator_threads"], r["mode"]
    );
    println!(
        "{:<8} | {:>7} {:>7} {:>5} {:>6} | {:>8} {:>8} {:>8} | {:>9} {:>8}",
        "path", "calls", "ok", "503", "other", "p50 ms", "p99 ms", "max ms", "answered/s", "lag ms"
    );
    for path in ["direct", "sidecar"] {
        let p = &r[path];
        let f = |k: &str| p[k].to_string();
        let other = p["other_status"].as_u64().unwrap_or(0) + p["failed"].as_u64().unwrap_or(0);
        println!(
            "{:<8} | {:>7} {:>7} {:>5} {:>6} | {:>8} {:>8} {:>8} | {:>9} {:>8}",
            path,
            f("calls"),
            f("ok"),
            f("refused_503"),
            other,
            f("p50_ms"),
            f("p99_ms"),
            f("max_ms"),
            f("answered_per_s"),
            f("max_send_lag_ms")
        );
    }
    let rss = &r["rss_kib"];
    println!(
        "added by the sidecar: p50 {} ms, p99 {} ms ({} µs of its CPU per call); upstream connections open at most {}; limits the sidecar hit: {}",
        r["added_ms"]["p50"], r["added_ms"]["p99"], r["sidecar_cpu_us_per_call"], r["upstream_connections_max"], r["sidecar_limits_hit"]
    );
    println!(
        "client connections at the end: {} ({})",
        r["client_connections"],
        if r["client_connections_kept"] == true {
            "kept open through the readings after"
        } else {
            "closed as the load ended"
        }
    );
    println!(
        "sidecar RSS: idle {} KiB, peak {} KiB, end of load {} KiB, after: {}; final - idle = {} KiB",
        rss["idle"],
        rss["peak"],
        rss["end_of_load"],
        rss["after"]
            .as_array()
            .map(|a| a
                .iter()
                .map(|x| format!("{} s {} KiB", x["s"], x["rss_kib"]))
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default(),
        rss["final_minus_idle"]
    );
    println!(
        "  of which: idle {}, final {}",
        rss["parts_idle"], rss["parts_final"]
    );
}
