//! What both benchmarks share: processes, ports, CPU and memory readings, latency samples.

#![allow(dead_code)] // each benchmark uses its own part

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub(crate) struct Proc(pub(crate) Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    /// Stops it as a user would (SIGTERM, then SIGKILL after 10 s) and returns the processes
    /// it had started that are still running afterwards: none, when it cleaned up after itself.
    pub(crate) fn stop(mut self) -> Vec<u32> {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        let started = descendants(self.0.id());
        let _ = kill(Pid::from_raw(self.0.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Its children may take a moment more to notice their pipes closed.
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline && started.iter().any(|p| alive(*p)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        started.into_iter().filter(|p| alive(*p)).collect()
        // Dropped here: SIGKILL if it is still running.
    }
}

/// Every process below `pid`.
pub(crate) fn descendants(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut next = vec![pid];
    while let Some(p) = next.pop() {
        let children = children_of(p);
        next.extend(&children);
        out.extend(children);
    }
    out
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub(crate) fn wait_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("nothing listens on {port}");
}

pub(crate) fn sidecar_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("EPODE_SIDECAR_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().unwrap();
    // target/release/deps/overhead-… → target/release/epode-sidecar
    exe.parent()
        .and_then(Path::parent)
        .unwrap()
        .join("epode-sidecar")
}

/// (utime + stime) of a process in clock ticks, and its resident set (current, peak) in KiB.
pub(crate) fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or_default();
    let f: Vec<&str> = after.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // Fields after the command: state is 0, utime is 11, stime is 12.
    num(11) + num(12)
}

pub(crate) fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let get = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (get("VmRSS:"), get("VmHWM:"))
}

pub(crate) fn clock_ticks_per_sec() -> u64 {
    // sysconf(_SC_CLK_TCK) is 100 on every Linux this runs on; `getconf` confirms it.
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

#[derive(Default, Clone)]
pub(crate) struct Sample {
    pub(crate) latencies_us: Vec<u32>,
    pub(crate) elapsed: Duration,
    pub(crate) errors: u64,
    /// Connections the target closed between requests (nginx after `keepalive_requests`,
    /// Node after its idle timeout), opened again: not errors.
    pub(crate) reconnects: u64,
}

impl Sample {
    pub(crate) fn merge(&mut self, other: Sample) {
        self.latencies_us.extend(other.latencies_us);
        self.reconnects += other.reconnects;
        self.elapsed += other.elapsed;
        self.errors += other.errors;
    }

    pub(crate) fn pct(&self, p: f64) -> f64 {
        let mut v = self.latencies_us.clone();
        if v.is_empty() {
            return f64::NAN;
        }
        v.sort_unstable();
        v[((v.len() - 1) as f64 * p).round() as usize] as f64
    }

    pub(crate) fn rps(&self) -> f64 {
        self.latencies_us.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

pub(crate) fn stats(s: &Sample) -> Value {
    json!({"p50_us": s.pct(0.5), "p99_us": s.pct(0.99), "p999_us": s.pct(0.999),
           "rps": (s.rps() * 10.0).round() / 10.0, "requests": s.latencies_us.len(), "errors": s.errors,
           "reconnects": s.reconnects})
}

/// The sample of a slice's tasks, each giving its latencies and errors.
pub(crate) async fn collect(
    tasks: Vec<tokio::task::JoinHandle<(Vec<u32>, u64, u64)>>,
    started: Instant,
) -> Sample {
    let mut sample = Sample::default();
    for t in tasks {
        let (lat, errors, reconnects) = t.await.unwrap();
        sample.latencies_us.extend(lat);
        sample.errors += errors;
        sample.reconnects += reconnects;
    }
    sample.elapsed = started.elapsed();
    sample
}

/// A new HTTP/1.1 connection (its driver spawned on the current runtime).
pub(crate) async fn connect_http1(
    addr: std::net::SocketAddr,
) -> Option<hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>> {
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream.set_nodelay(true).ok()?;
    let io = hyper_util::rt::TokioIo::new(stream);
    let (send, conn) = hyper::client::conn::http1::handshake(io).await.ok()?;
    tokio::spawn(conn);
    Some(send)
}

/// Processes still running whose command line contains `marker` (what a run left behind).
pub(crate) fn leftovers(marker: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let zombie = state
                .rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'));
            !zombie && String::from_utf8_lossy(&cmd).contains(marker)
        })
        .collect()
}

/// Whether a process runs (and is not a zombie).
pub(crate) fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .map(|r| !r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// The processes whose parent is `pid`.
pub(crate) fn children_of(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            let status =
                std::fs::read_to_string(format!("/proc/{child}/status")).unwrap_or_default();
            status
                .lines()
                .find_map(|l| l.strip_prefix("PPid:"))
                .and_then(|v| v.trim().parse::<u32>().ok())
                == Some(pid)
        })
        .collect()
}

/// A 2026-07-28 MCP `POST` to `uri` (a path, or an absolute URL), with the headers the
/// sidecar's front door checks.
pub(crate) fn mcp_request(
    uri: &str,
    method: &str,
    name: Option<&str>,
) -> hyper::http::request::Builder {
    let mut req = hyper::Request::post(uri)
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method);
    if let Some(n) = name {
        req = req.header("mcp-name", n);
    }
    req
}

/// Writes a benchmark's whole report (every raw figure with it) where `EPODE_BENCH_JSON`
/// names, for `bench/run`'s artefact; nothing when unset.
pub(crate) fn keep_artefact(report: &Value) {
    if let Some(path) = std::env::var_os("EPODE_BENCH_JSON") {
        if let Err(e) = std::fs::write(&path, report.to_string()) {
            eprintln!("bench: cannot write {}: {e}", PathBuf::from(path).display());
        }
    }
}
