//! Shared test fixtures: the real peers (Python `mcp` and TypeScript SDK upstreams, the
//! TypeScript clients of both SDK generations, the conformance suite) installed by
//! `scripts/install-peers.sh`, the sidecar binary itself, (in `scripted`) the scripted
//! upstream for edge cases real peers cannot produce, and (in `auth`) the OAuth
//! authorization server peer (oidc-provider) with its test controls.
#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod auth;
pub mod fake_epode;
pub mod scripted;

pub use scripted::{Reply, Request, Scripted, ScriptedUpstream};

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Where `scripts/install-peers.sh` put the peers. Tests fail (never skip) when they are absent.
pub fn peers_dir() -> PathBuf {
    let dir = std::env::var_os("EPODE_PEERS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".peers"));
    assert!(
        dir.join("py/bin/python").exists() && dir.join("ts/node_modules").exists(),
        "the MCP test peers are not installed in {}: run `bash scripts/install-peers.sh` first \
         (scripts/test.sh does it for you)",
        dir.display()
    );
    dir
}

pub fn python() -> PathBuf {
    peers_dir().join("py/bin/python")
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn wait_for_port(port: u16, child: &mut Child, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited before listening: {status}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what} did not listen on {port} within 30 s");
}

/// Starts a peer that binds a port itself and prints `READY <port>` first: its process (killed
/// when dropped) and the port; whatever it prints after is drained. `hint` says what to do when
/// it does not start.
pub fn spawn_ready(mut cmd: Command, name: &str, hint: &str) -> (Proc, u16) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start {name}: {e}"));
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line)
        .unwrap_or_else(|e| panic!("read {name}'s READY line: {e}"));
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    let port = line
        .trim()
        .strip_prefix("READY ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{name} did not start ({hint}): {line:?}"));
    wait_for_port(port, &mut child, name);
    (
        Proc {
            child,
            name: name.to_owned(),
        },
        port,
    )
}

/// A child process killed when dropped.
pub struct Proc {
    pub child: Child,
    pub name: String,
}

impl Drop for Proc {
    /// Kills the process and everything it started, so a failed test leaves nothing running.
    fn drop(&mut self) {
        let tree = descendants(self.child.id());
        let _ = self.child.kill();
        let _ = self.child.wait();
        for pid in tree {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}

/// Every live process descended from `root` (from `/proc`).
pub fn descendants(root: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
                .filter_map(|pid| {
                    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                    let ppid = stat
                        .rsplit(')')
                        .next()?
                        .split_whitespace()
                        .nth(1)?
                        .parse()
                        .ok()?;
                    Some((pid, ppid))
                })
                .collect()
        })
        .unwrap_or_default();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    found.remove(0);
    found
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpstreamKind {
    /// Python `mcp==2.3.0` `MCPServer`, may answer with SSE.
    Python,
    /// The same with `json_response=True`.
    PythonJson,
    /// TypeScript `createMcpHandler`, both eras.
    TypeScript,
    /// TypeScript, modern era only (`legacy: 'reject'`).
    TypeScriptModernOnly,
    /// `@modelcontextprotocol/server-everything` (SDK v1): 2025 only, stateful sessions.
    Everything,
    /// FastMCP 4.1.6 (`tests/peers/fastmcp_server.py`): both eras, stateful sessions; its
    /// tools ask their client questions.
    FastMcp,
    /// FastMCP 4.1.6 with the 2026 tasks and MCP Apps extensions
    /// (`tests/peers/fastmcp_tasks.py`).
    FastMcpExtensions,
    /// Python `mcp==2.3.0` carrying Epode itself (`tests/peers/epode_carrier.py`: give
    /// `--carries telemetry|binding`).
    EpodeCarrier,
}

pub struct Upstream {
    pub kind: UpstreamKind,
    pub port: u16,
    _proc: Proc,
}

impl Upstream {
    pub fn start(kind: UpstreamKind) -> Upstream {
        Self::start_with(kind, &[])
    }

    pub fn start_with(kind: UpstreamKind, extra: &[&str]) -> Upstream {
        // The peer binds port 0 itself and says which it got: a port picked here and bound
        // there could be taken in between by another test running in parallel.
        let port = if kind == UpstreamKind::Everything {
            free_port()
        } else {
            0
        };
        Self::start_on(kind, port, extra)
    }

    /// Starts on a given port (to restart an upstream where a sidecar expects it).
    pub fn start_on(kind: UpstreamKind, port: u16, extra: &[&str]) -> Upstream {
        let peers = peers_dir();
        let port_s = port.to_string();
        let mut cmd = match kind {
            UpstreamKind::Python | UpstreamKind::PythonJson => {
                let mut c = Command::new(python());
                c.arg(repo_root().join("tests/peers/py_server.py"))
                    .args(["--port", &port_s]);
                if kind == UpstreamKind::PythonJson {
                    c.arg("--json");
                }
                c
            }
            UpstreamKind::FastMcp
            | UpstreamKind::FastMcpExtensions
            | UpstreamKind::EpodeCarrier => {
                let script = match kind {
                    UpstreamKind::FastMcp => "tests/peers/fastmcp_server.py",
                    UpstreamKind::EpodeCarrier => "tests/peers/epode_carrier.py",
                    _ => "tests/peers/fastmcp_tasks.py",
                };
                let mut c = Command::new(python());
                c.arg(repo_root().join(script)).args(["--port", &port_s]);
                c
            }
            UpstreamKind::Everything => {
                let mut c = Command::new("node");
                c.arg("-r")
                    .arg(repo_root().join("tests/peers/force-loopback.cjs"))
                    .arg(peers.join(
                        "everything/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
                    ))
                    .arg("streamableHttp")
                    .env("PORT", &port_s);
                c
            }
            UpstreamKind::TypeScript | UpstreamKind::TypeScriptModernOnly => {
                let mut c = Command::new("node");
                c.arg(peers.join("ts/ts_server.mjs"))
                    .args(["--port", &port_s]);
                if kind == UpstreamKind::TypeScriptModernOnly {
                    c.arg("--reject-legacy");
                }
                c
            }
        };
        cmd.args(extra)
            .stdin(Stdio::null())
            .stdout(if port == 0 {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stderr(Stdio::null());
        let mut child = cmd.spawn().expect("start upstream peer");
        let port = if port == 0 {
            let mut line = String::new();
            let mut out = BufReader::new(child.stdout.take().unwrap());
            out.read_line(&mut line)
                .expect("read the peer's READY line");
            // Whatever else it prints is drained, never left to fill the pipe or break it.
            std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
            line.trim()
                .strip_prefix("READY ")
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("{kind:?} upstream did not start: {line:?}"))
        } else {
            port
        };
        wait_for_port(port, &mut child, &format!("{kind:?} upstream"));
        Upstream {
            kind,
            port,
            _proc: Proc {
                child,
                name: format!("{kind:?}"),
            },
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }
}

/// The sidecar binary, started with only the given environment.
pub struct Sidecar {
    pub addr: SocketAddr,
    /// The admin listener, when `EPODE_SIDECAR_ADMIN_LISTEN` was set.
    pub admin: Option<SocketAddr>,
    proc: Proc,
    stderr: mpsc::Receiver<String>,
}

/// A field of `/proc/PID/status` in KiB (`VmRSS`, `VmHWM`).
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// A plain blocking `GET` of `path` on `addr`: the response's body (for tests outside a
/// runtime, such as polling `/metrics` while a client runs in another thread).
pub fn get_blocking(addr: SocketAddr, path: &str) -> String {
    use std::io::Write as _;
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
}

/// Polls `check` until it is true or `within` passes; whether it became true.
pub fn eventually(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// [`eventually`] for async tests, with a check that may itself be async (a sync one is
/// written `|| std::future::ready(condition)`): polls every 25 ms without blocking the
/// runtime (a single-threaded test runtime must keep driving what the check waits for).
pub async fn eventually_async<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The sidecar's `/metrics` on its MCP port, as text.
pub async fn metrics_text(sc: &Sidecar) -> String {
    http()
        .get(format!("{}/metrics", sc.base()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value of the metric `name` (with its labels) on the sidecar's `/metrics` on its MCP port.
pub async fn metric(sc: &Sidecar, name: &str) -> u64 {
    metric_value(&metrics_text(sc).await, name)
}

/// The value of the metric line that starts with `name` (a name with its labels) in a
/// Prometheus text exposition, as an integer.
pub fn metric_value(text: &str, name: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

/// Whether the peer closed `s` (or reset it) within `within`, and what it sent first.
pub fn closed_within(s: &mut TcpStream, within: Duration) -> (bool, Vec<u8>) {
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (false, got);
        }
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut buf) {
            Ok(0) => return (true, got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                return (false, got)
            }
            Err(_) => return (true, got),
        }
    }
}

/// The resident set size of a process, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// The CPU time (user + system) a process has used, in milliseconds.
pub fn cpu_ms(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks * 10 // USER_HZ is 100 on Linux
}

/// The open file descriptors of a process.
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

impl Sidecar {
    pub fn start(upstream_url: &str, env: &[(&str, &str)]) -> Sidecar {
        Self::start_in(None, Some(upstream_url), &[], env)
    }

    /// Started through `sh -c "<prelude> && exec sidecar"`, such as `ulimit -n 256`.
    pub fn start_with_prelude(prelude: &str, upstream_url: &str, env: &[(&str, &str)]) -> Sidecar {
        Self::start_in(Some(prelude), Some(upstream_url), &[], env)
    }

    /// In front of a stdio MCP server it runs: `epode-sidecar -- <command>`.
    pub fn start_stdio(command: &[&str], env: &[(&str, &str)]) -> Sidecar {
        Self::start_in(None, None, command, env)
    }

    /// The same, from a copy of the binary at `bin` (which a test may then replace on disk).
    pub fn start_stdio_from(bin: &Path, command: &[&str], env: &[(&str, &str)]) -> Sidecar {
        Self::start_from(bin, None, None, command, env)
    }

    fn start_in(
        prelude: Option<&str>,
        upstream_url: Option<&str>,
        command: &[&str],
        env: &[(&str, &str)],
    ) -> Sidecar {
        // `EPODE_TEST_SIDECAR_BIN` runs the tests against another build (a new test against
        // the last landed binary, to see it fail there).
        let other = std::env::var_os("EPODE_TEST_SIDECAR_BIN").map(PathBuf::from);
        let bin = other
            .as_deref()
            .unwrap_or(Path::new(env!("CARGO_BIN_EXE_epode-sidecar")));
        Self::start_from(bin, prelude, upstream_url, command, env)
    }

    fn start_from(
        bin: &Path,
        prelude: Option<&str>,
        upstream_url: Option<&str>,
        command: &[&str],
        env: &[(&str, &str)],
    ) -> Sidecar {
        let mut cmd = match prelude {
            None => Command::new(bin),
            Some(p) => {
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(format!("{p} && exec \"$0\" \"$@\""))
                    .arg(bin);
                c
            }
        };
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("EPODE_SIDECAR_LISTEN", "127.0.0.1:0")
            .env("EPODE_SIDECAR_LOG", "debug");
        if let Some(url) = upstream_url {
            cmd.env("EPODE_SIDECAR_UPSTREAM", url);
        }
        if !command.is_empty() {
            cmd.arg("--").args(command);
        }
        // Feedback is off unless the test configures it (a transparent proxy by default).
        if !env.iter().any(|(k, _)| {
            matches!(
                *k,
                "EPODE_API_KEY" | "AGENT_FEEDBACK_MODE" | "EPODE_SIDECAR_DEV"
            )
        }) {
            cmd.env("AGENT_FEEDBACK_MODE", "off");
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start epode-sidecar");
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut stdout = BufReader::new(stdout);
        let mut first = String::new();
        stdout.read_line(&mut first).expect("read sidecar stdout");
        let admin = env
            .iter()
            .any(|(k, _)| *k == "EPODE_SIDECAR_ADMIN_LISTEN")
            .then(|| {
                let mut line = String::new();
                stdout.read_line(&mut line).expect("read sidecar stdout");
                line.trim()
                    .strip_prefix("epode-sidecar admin listening on ")
                    .unwrap_or_else(|| panic!("no admin line: {line:?}"))
                    .parse()
                    .unwrap()
            });
        let addr = first
            .trim()
            .strip_prefix("epode-sidecar listening on ")
            .unwrap_or_else(|| {
                let logs: Vec<String> = rx.try_iter().collect();
                panic!("sidecar did not start: {first:?}\n{}", logs.join("\n"))
            })
            .parse()
            .unwrap();
        Sidecar {
            addr,
            admin,
            proc: Proc {
                child,
                name: "epode-sidecar".into(),
            },
            stderr: rx,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn pid(&self) -> u32 {
        self.proc.child.id()
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.proc.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit, returning its exit code.
    pub fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(status) = self.proc.child.try_wait().unwrap() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Every log line written so far.
    pub fn logs(&self) -> Vec<String> {
        self.stderr.try_iter().collect()
    }
}

/// Runs the official TypeScript client (`tests/peers/ts_client.mjs`) and returns its JSON report.
/// Each extra is an HTTP header (`K: V`), or a flag of the driver (`--everything`).
pub fn ts_client(url: &str, mode: &str, extras: &[&str]) -> Value {
    let script = peers_dir().join("ts/ts_client.mjs");
    let mut cmd = Command::new("node");
    cmd.arg(script).arg(url).arg(mode);
    for e in extras {
        if e.starts_with("--") {
            cmd.arg(e);
        } else {
            cmd.args(["--header", e]);
        }
    }
    let out = cmd.output().expect("run ts_client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
        panic!(
            "ts_client printed no JSON (exit {:?}):\n{stdout}\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Runs the TypeScript SDK v1 client (`tests/peers/sdk1/v1_client.mjs`, the 2025-era client
/// most clients run) against `url` and returns its JSON report: each operation's result or
/// error, told apart as a JSON-RPC error (`mcp`) or an HTTP failure (`transport`).
pub fn v1_client(url: &str) -> Value {
    let script = peers_dir().join("sdk1/v1_client.mjs");
    assert!(
        script.exists(),
        "{} is missing: run `bash scripts/install-peers.sh`",
        script.display()
    );
    let out = Command::new("node")
        .arg(script)
        .arg(url)
        .output()
        .expect("run v1_client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
        panic!(
            "v1_client printed no JSON (exit {:?}):\n{stdout}\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// The modern (2026-07-28) request headers for `method`, with `Mcp-Name` when given.
pub fn modern_headers(method: &str, name: Option<&str>) -> Vec<(&'static str, String)> {
    let mut h = vec![
        ("content-type", "application/json".to_owned()),
        ("accept", "application/json, text/event-stream".to_owned()),
        ("mcp-protocol-version", "2026-07-28".to_owned()),
        ("mcp-method", method.to_owned()),
    ];
    if let Some(n) = name {
        h.push(("mcp-name", n.to_owned()));
    }
    h
}

/// A modern request body with the required `_meta` envelope merged into `params`.
pub fn modern_body(id: Value, method: &str, mut params: Value) -> Value {
    params["_meta"] = serde_json::json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "epode-sidecar-tests", "version": "0"}
    });
    serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

pub async fn post_modern(
    url: &str,
    method: &str,
    name: Option<&str>,
    body: &Value,
) -> reqwest::Response {
    let mut req = http().post(url).body(body.to_string());
    for (k, v) in modern_headers(method, name) {
        req = req.header(k, v);
    }
    req.send().await.unwrap()
}

/// The JSON-RPC message a response carries (its body read whole; see [`last_message`]).
pub async fn message_of(resp: reqwest::Response) -> Value {
    let ct = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap_or_default().to_owned())
        .unwrap_or_default();
    let text = resp.text().await.unwrap();
    last_message(&ct, &text)
}

/// The JSON-RPC message in a response body, whether JSON or the last `data:` of an SSE stream.
pub fn last_message(content_type: &str, body: &str) -> Value {
    if content_type.starts_with("text/event-stream") {
        let data = body
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
            .rfind(|d| !d.is_empty())
            .unwrap_or_else(|| panic!("no SSE data in {body:?}"));
        serde_json::from_str(data).unwrap()
    } else {
        serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {body:?}"))
    }
}

pub fn path_exists(p: &Path) -> bool {
    p.exists()
}

/// One operation with the official TypeScript client (`tests/peers/ts_call.mjs`): `list`, or
/// `call` of `tool` with `args`. Extras are HTTP headers (`K: V`).
pub fn ts_call(url: &str, mode: &str, tool: Option<(&str, &Value)>, headers: &[&str]) -> Value {
    ts_call_env(url, mode, tool, headers, &[])
}

/// A `tools/call` of `tool` with the official TypeScript client that must succeed: its result.
pub fn ts_result(url: &str, mode: &str, tool: &str, args: &Value) -> Value {
    let out = ts_call(url, mode, Some((tool, args)), &[]);
    assert!(out.get("error").is_none(), "{tool}: {out}");
    out["result"].clone()
}

/// [`ts_call`] with the client answering `roots/list` with `root` (a 2025 server may ask).
pub fn ts_call_roots(
    url: &str,
    mode: &str,
    tool: (&str, &Value),
    root: &str,
    headers: &[&str],
) -> Value {
    let mut all: Vec<String> = vec!["--roots".into(), root.into()];
    all.extend(
        headers
            .iter()
            .flat_map(|h| ["--header".to_owned(), (*h).to_owned()]),
    );
    let script = peers_dir().join("ts/ts_call.mjs");
    let out = Command::new("node")
        .arg(script)
        .args([url, mode, "call", tool.0, &tool.1.to_string()])
        .args(&all)
        .output()
        .expect("run ts_call");
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
        panic!(
            "ts_call printed no JSON (exit {:?}):\n{stdout}\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// [`ts_call`] with extra environment for node (such as `NODE_EXTRA_CA_CERTS`).
pub fn ts_call_env(
    url: &str,
    mode: &str,
    tool: Option<(&str, &Value)>,
    headers: &[&str],
    env: &[(&str, &str)],
) -> Value {
    let script = peers_dir().join("ts/ts_call.mjs");
    let mut cmd = Command::new("node");
    cmd.envs(env.iter().copied());
    cmd.arg(script).arg(url).arg(mode);
    match tool {
        Some((name, args)) => {
            cmd.arg("call").arg(name).arg(args.to_string());
        }
        None => {
            cmd.arg("list");
        }
    }
    for h in headers {
        cmd.args(["--header", h]);
    }
    let out = cmd.output().expect("run ts_call");
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
        panic!(
            "ts_call printed no JSON (exit {:?}):\n{stdout}\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// A sidecar with feedback on, in front of `upstream`, talking to `epode`.
pub fn feedback_sidecar(
    upstream: &str,
    epode: &fake_epode::FakeEpode,
    mode: &str,
    extra: &[(&str, &str)],
) -> Sidecar {
    let url = epode.url();
    let mut env: Vec<(&str, &str)> = vec![
        ("EPODE_API_KEY", epode.product_key()),
        ("EPODE_API_URL", url.as_str()),
        ("AGENT_FEEDBACK_MODE", mode),
    ];
    env.extend_from_slice(extra);
    Sidecar::start(upstream, &env)
}
