//! The keyed tables under load (issue 19): the per-client rate limiter's table fed many
//! distinct client addresses, and the tool catalog fed an upstream that lists many tools.
//!
//! ```text
//! cargo bench --bench tables -- clients [--keys 1000000] [--same 200000] [--max-secs 300]
//! cargo bench --bench tables -- tools [--tools 100000] [--lists 3] [--secs 10]
//! ```
//!
//! `clients`: a sidecar behind a trusted proxy (127.0.0.1) with a per-client limit that never
//! refuses (1/m, burst 10,000,000, so every key stays live for two minutes) answers
//! pass-through requests, first all from one `X-Forwarded-For` address, then each from a new
//! one; it prints the rate and the sidecar's CPU per request for each window of requests.
//! `tools`: an upstream listing that many tools; `tools/list` timed directly and through the
//! sidecar (feedback on), then another client's `tools/call` latency alone and while one
//! client loops `tools/list`. `EPODE_SIDECAR_BIN` names the sidecar binary (another build, to
//! compare); otherwise the release build beside this benchmark. Only ratios from one run mean
//! much on a shared machine.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;

mod support;
use support::*;

const KEY: &str = "af_live_0123456789abcdef0123456789abcdef_fedcba9876543210fedcba9876543210_bench_secret_not_a_real_key";

const SERVER_INFO: &str =
    r#"{"io.modelcontextprotocol/serverInfo":{"name":"bench-upstream","version":"1.0.0"}}"#;

// ---------------------------------------------------------------------------------------
// The responder: an MCP 2026-07-28 upstream that lists `tools` tools, and Epode's telemetry.

/// The `tools/list` result with `n` tools, the last ones declaring an `outputSchema`.
fn tools_result(n: usize) -> String {
    let mut out = String::with_capacity(n * 96 + 256);
    out.push_str(r#"{"resultType":"complete","tools":["#);
    for i in 0..n {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&format!(
            r#"{{"name":"tool_{i:06}","description":"Tool {i}","inputSchema":{{"type":"object"}}}}"#
        ));
    }
    out.push_str(&format!(
        r#"],"ttlMs":0,"cacheScope":"private","_meta":{SERVER_INFO}}}"#
    ));
    out
}

fn reply(body: &[u8], tools: &str) -> String {
    let req: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let id = req["id"].to_string();
    let result = match req["method"].as_str().unwrap_or_default() {
        "server/discover" => format!(
            r#"{{"resultType":"complete","supportedVersions":["2026-07-28"],"capabilities":{{"tools":{{}},"prompts":{{}}}},"ttlMs":0,"cacheScope":"private","_meta":{SERVER_INFO}}}"#
        ),
        "prompts/list" => format!(
            r#"{{"resultType":"complete","prompts":[],"ttlMs":0,"cacheScope":"private","_meta":{SERVER_INFO}}}"#
        ),
        "tools/list" => tools.to_owned(),
        "tools/call" => format!(
            r#"{{"resultType":"complete","content":[{{"type":"text","text":"ok"}}],"_meta":{SERVER_INFO}}}"#
        ),
        _ => {
            return format!(
                r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32601,"message":"Method not found"}}}}"#
            )
        }
    };
    format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#)
}

async fn responder_service(
    req: Request<Incoming>,
    tools: Arc<String>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_owned();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let (status, msg) = if path.starts_with("/api/") {
        (202, r#"{"accepted":0,"dropped":0}"#.to_owned())
    } else {
        (200, reply(&body, &tools))
    };
    let mut resp = Response::new(Full::new(Bytes::from(msg)));
    *resp.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
    resp.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    Ok(resp)
}

fn run_responder(port: u16, tools: usize) {
    let tools = Arc::new(tools_result(tools));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
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
            let tools = tools.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |r| responder_service(r, tools.clone()));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
}

fn start_responder(tools: usize) -> (Proc, SocketAddr) {
    let port = free_port();
    let proc = Proc(
        Command::new(std::env::current_exe().unwrap())
            .args(["--responder", &port.to_string(), &tools.to_string()])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_port(port);
    (proc, SocketAddr::from(([127, 0, 0, 1], port)))
}

fn start_sidecar(upstream: SocketAddr, env: &[(&str, String)]) -> (Proc, SocketAddr) {
    let port = free_port();
    let mut cmd = Command::new(sidecar_binary());
    cmd.env_clear()
        .env("EPODE_SIDECAR_LISTEN", format!("127.0.0.1:{port}"))
        .env("EPODE_SIDECAR_UPSTREAM", format!("http://{upstream}/mcp"))
        .env("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28")
        .env("EPODE_SIDECAR_LOG", "warn")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    // Settings a newer build has, passed on when set.
    for k in [
        "EPODE_SIDECAR_RATE_LIMIT_CLIENTS",
        "EPODE_SIDECAR_MAX_TOOLS",
    ] {
        if let Ok(v) = std::env::var(k) {
            cmd.env(k, v);
        }
    }
    let child = cmd
        .spawn()
        .expect("start the sidecar (cargo build --release)");
    wait_port(port);
    (Proc(child), SocketAddr::from(([127, 0, 0, 1], port)))
}

fn body(method: &str, params: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"{method}","params":{{{params}"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}}}}}}}}"#
    )
}

/// The argument after `flag`, or `default`.
fn arg(args: &[String], flag: &str, default: u64) -> u64 {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

// ---------------------------------------------------------------------------------------
// clients

/// A distinct IPv4 address for each `i` (never in 127/8).
fn address(i: u64) -> String {
    let i = i as u32;
    format!(
        "{}.{}.{}.{}",
        11 + (i >> 24),
        (i >> 16) & 255,
        (i >> 8) & 255,
        i & 255
    )
}

/// Sends `total` pass-through requests on `concurrency` connections, each from a new client
/// address unless `same`; prints a line per `window` requests; gives up after `max`.
fn drive_clients(
    rt: &tokio::runtime::Runtime,
    addr: SocketAddr,
    pid: u32,
    same: bool,
    total: u64,
    window: u64,
    max: Duration,
) -> Value {
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut tasks = Vec::new();
    let payload = Bytes::from(body("prompts/list", ""));
    for _ in 0..32 {
        let (done, errors, stop, payload) =
            (done.clone(), errors.clone(), stop.clone(), payload.clone());
        tasks.push(rt.spawn(async move {
            let Some(mut send) = connect_http1(addr).await else {
                errors.fetch_add(1, Ordering::Relaxed);
                return;
            };
            while !stop.load(Ordering::Relaxed) {
                let n = done.fetch_add(1, Ordering::Relaxed);
                if n >= total {
                    break;
                }
                let client = if same { address(0) } else { address(n) };
                let req = mcp_request("/mcp", "prompts/list", None)
                    .header("x-forwarded-for", client)
                    .body(Full::new(payload.clone()))
                    .unwrap();
                if send.ready().await.is_err() {
                    break;
                }
                match send.send_request(req).await {
                    Ok(r) if r.status() == 200 => {
                        let _ = r.into_body().collect().await;
                    }
                    _ => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    let tick_us = 1_000_000.0 / clock_ticks_per_sec() as f64;
    let mut windows = Vec::new();
    let (mut last_n, mut last_t, mut last_cpu) = (0u64, Instant::now(), cpu_ticks(pid));
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let n = done.load(Ordering::Relaxed).min(total);
        let finished = n >= total && tasks.iter().all(|t| t.is_finished());
        let over = started.elapsed() > max;
        if n - last_n >= window || finished || over {
            let (now, cpu) = (Instant::now(), cpu_ticks(pid));
            let served = (n - last_n).max(1);
            let w = serde_json::json!({
                "requests": format!("{last_n}..{n}"),
                "rps": (served as f64 / (now - last_t).as_secs_f64()).round(),
                "cpu_us_per_request": ((cpu - last_cpu) as f64 * tick_us / served as f64 * 10.0).round() / 10.0,
            });
            eprintln!("bench: {w}");
            windows.push(w);
            (last_n, last_t, last_cpu) = (n, now, cpu);
        }
        if finished || over {
            stop.store(true, Ordering::Relaxed);
            break;
        }
    }
    for t in tasks {
        let _ = rt.block_on(t);
    }
    serde_json::json!({
        "client_addresses": if same { "one".to_owned() } else { "a new one per request".to_owned() },
        "requests": done.load(Ordering::Relaxed).min(total),
        "errors": errors.load(Ordering::Relaxed),
        "seconds": started.elapsed().as_secs_f64(),
        "gave_up": started.elapsed() > max,
        "windows": windows,
    })
}

fn clients(rt: &tokio::runtime::Runtime, args: &[String]) -> Value {
    let keys = arg(args, "--keys", 1_000_000);
    let same = arg(args, "--same", 200_000);
    let max = Duration::from_secs(arg(args, "--max-secs", 300));
    let window = arg(args, "--window", 100_000);
    let (_up, upstream) = start_responder(1);
    let env = [
        ("AGENT_FEEDBACK_MODE", "off".to_owned()),
        ("EPODE_SIDECAR_TRUSTED_PROXIES", "127.0.0.1".to_owned()),
        ("EPODE_SIDECAR_RATE_LIMIT", "1/m".to_owned()),
        ("EPODE_SIDECAR_RATE_BURST", "10000000".to_owned()),
    ];
    let mut runs = Vec::new();
    for (is_same, total) in [(true, same), (false, keys)] {
        let (sidecar, addr) = start_sidecar(upstream, &env);
        runs.push(drive_clients(
            rt,
            addr,
            sidecar.0.id(),
            is_same,
            total,
            window.min(total),
            max,
        ));
        let (rss, hwm) = rss_kib(sidecar.0.id());
        runs.last_mut().unwrap()["rss_kib"] = serde_json::json!({"now": rss, "peak": hwm});
    }
    serde_json::json!({"clients": runs})
}

// ---------------------------------------------------------------------------------------
// tools

async fn send(
    addr: SocketAddr,
    method: &str,
    name: Option<&str>,
    payload: &str,
    limit: Duration,
) -> Result<(Duration, Bytes), String> {
    let t = Instant::now();
    let go = async {
        let mut send = connect_http1(addr).await.ok_or("connect")?;
        let req = mcp_request("/mcp", method, name)
            .body(Full::new(Bytes::from(payload.to_owned())))
            .unwrap();
        let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let b = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        if status != 200 {
            return Err(format!("status {status}"));
        }
        Ok(b)
    };
    match tokio::time::timeout(limit, go).await {
        Ok(Ok(b)) => Ok((t.elapsed(), b)),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(format!("no answer within {limit:?}")),
    }
}

fn count_tools(b: &Bytes) -> usize {
    serde_json::from_slice::<Value>(b)
        .ok()
        .and_then(|v| v["result"]["tools"].as_array().map(Vec::len))
        .unwrap_or(0)
}

/// `tools/call` latencies (µs) of one client calling back to back for `secs`, and the lists
/// another client completed meanwhile when `lister` is on.
async fn calls_while(addr: SocketAddr, name: &str, secs: Duration, lister: bool) -> Value {
    let stop = Arc::new(AtomicBool::new(false));
    let lists = Arc::new(AtomicU64::new(0));
    let looping = lister.then(|| {
        let (stop, lists) = (stop.clone(), lists.clone());
        tokio::spawn(async move {
            let list = body("tools/list", "");
            while !stop.load(Ordering::Relaxed) {
                if send(addr, "tools/list", None, &list, Duration::from_secs(120))
                    .await
                    .is_ok()
                {
                    lists.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    });
    let call = body(
        "tools/call",
        &format!(r#""name":"{name}","arguments":{{}},"#),
    );
    let mut sample = Sample::default();
    let started = Instant::now();
    let mut send_req = connect_http1(addr).await.unwrap();
    while started.elapsed() < secs {
        let req = mcp_request("/mcp", "tools/call", Some(name))
            .body(Full::new(Bytes::from(call.clone())))
            .unwrap();
        let t = Instant::now();
        if send_req.ready().await.is_err() {
            send_req = connect_http1(addr).await.unwrap();
        }
        let ok = match send_req.send_request(req).await {
            Ok(r) => r.status() == 200 && r.into_body().collect().await.is_ok(),
            Err(_) => false,
        };
        if ok {
            sample
                .latencies_us
                .push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
        } else {
            sample.errors += 1;
            send_req = connect_http1(addr).await.unwrap();
        }
    }
    sample.elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    if let Some(l) = looping {
        let _ = tokio::time::timeout(Duration::from_secs(130), l).await;
    }
    let max = sample.latencies_us.iter().max().copied().unwrap_or(0);
    let mut v = stats(&sample);
    v["max_us"] = max.into();
    if lister {
        v["lists_completed_meanwhile"] = lists.load(Ordering::Relaxed).into();
    }
    v
}

async fn list_times(addr: SocketAddr, n: u64, limit: Duration) -> Value {
    let list = body("tools/list", "");
    let mut times = Vec::new();
    let mut tools = 0;
    for _ in 0..n {
        match send(addr, "tools/list", None, &list, limit).await {
            Ok((t, b)) => {
                times.push(t.as_secs_f64());
                tools = count_tools(&b);
            }
            Err(e) => return serde_json::json!({"error": e, "seconds": times}),
        }
    }
    times.sort_by(f64::total_cmp);
    serde_json::json!({"median_s": times[times.len() / 2], "seconds": times, "tools_in_answer": tools})
}

fn tools(rt: &tokio::runtime::Runtime, args: &[String]) -> Value {
    let n = arg(args, "--tools", 100_000) as usize;
    let lists = arg(args, "--lists", 3);
    let secs = Duration::from_secs(arg(args, "--secs", 10));
    let limit = Duration::from_secs(arg(args, "--timeout", 120));
    let (_up, upstream) = start_responder(n);
    let env = [
        ("EPODE_API_KEY", KEY.to_owned()),
        ("EPODE_API_URL", format!("http://{upstream}")),
        ("AGENT_FEEDBACK_MODE", "never_ask".to_owned()),
    ];
    let (_sidecar, addr) = start_sidecar(upstream, &env);
    let last = format!("tool_{:06}", n - 1);
    rt.block_on(async {
        let direct = list_times(upstream, lists, limit).await;
        eprintln!("bench: direct {direct}");
        let sidecar = list_times(addr, lists, limit).await;
        eprintln!("bench: through the sidecar {sidecar}");
        let ratio = sidecar["median_s"].as_f64().unwrap_or(f64::NAN)
            / direct["median_s"].as_f64().unwrap_or(f64::NAN);
        let alone = calls_while(addr, &last, secs, false).await;
        eprintln!("bench: tools/call alone {alone}");
        let looping = calls_while(addr, &last, secs, true).await;
        eprintln!("bench: tools/call while another client loops tools/list {looping}");
        serde_json::json!({
            "tools": n,
            "list_direct": direct,
            "list_sidecar": sidecar,
            "list_ratio_sidecar_to_direct": (ratio * 100.0).round() / 100.0,
            "call_alone": alone,
            "call_while_listing": looping,
        })
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--responder") {
        run_responder(args[i + 1].parse().unwrap(), args[i + 2].parse().unwrap());
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let report = if args.iter().any(|a| a == "tools") {
        tools(&rt, &args)
    } else if args.iter().any(|a| a == "clients") {
        clients(&rt, &args)
    } else {
        eprintln!("usage: cargo bench --bench tables -- clients|tools [options]");
        std::process::exit(2);
    };
    println!("{report:#}");
}
