//! Every listener bounded the same way, and every byte held for a slow client in the budget:
//! the MCP port, the admin port and the `--dev` Epode's port each keep their share of the one
//! connection cap (a flood of one leaves the others answering), close a connection that
//! sends nothing at the header timeout, cut a body held past the body timeout with 408, and
//! cut a client that does not read at the idle timeout; answers waiting for a client that
//! does not read stay counted in the memory budget (HTTP/1 and HTTP/2); a client that
//! half-closes after a complete request still gets its answer.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::support::*;
use serde_json::json;

const MODERN: (&str, &str) = ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28");

/// A 2026 upstream: `tools/list` answered at once; `tools/call` answered with a result whose
/// text is `big` bytes long (a JSON answer the sidecar reads whole).
fn big_call_upstream(big: usize) -> Scripted {
    ScriptedUpstream::new()
        .on(
            "tools/call",
            Reply::body("application/json")
                .text(r#"{"jsonrpc":"2.0","id":"#)
                .id()
                .text(r#","result":{"content":[{"type":"text","text":""#)
                .repeat(&[b'x'; 64 * 1024], Some(big))
                .text(r#""}]}"#),
        )
        .otherwise(Reply::result(json!({"tools": []})))
        .start()
}

/// The raw bytes of a modern POST of `method` (a `tools/call` of `big` when asked).
fn raw_request(id: &str, method: &str) -> Vec<u8> {
    let params = if method == "tools/call" {
        json!({"name": "big", "arguments": {}})
    } else {
        json!({})
    };
    let body = modern_body(json!(id), method, params).to_string();
    let mut req = format!(
        "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {}\r\n",
        body.len()
    );
    let name = (method == "tools/call").then_some("big");
    for (k, v) in modern_headers(method, name) {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(&body);
    req.into_bytes()
}

/// A new client's `tools/list` on the MCP port is answered within a second.
fn mcp_answers_within_a_second(addr: SocketAddr) {
    let started = Instant::now();
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))
        .expect("the MCP port takes no new connection");
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    s.write_all(&raw_request("probe", "tools/list")).unwrap();
    let mut got = [0u8; 12];
    s.read_exact(&mut got)
        .expect("the MCP port did not answer within a second");
    assert_eq!(&got, b"HTTP/1.1 200", "{}", String::from_utf8_lossy(&got));
    assert!(started.elapsed() < Duration::from_secs(1));
}

/// A new client's `GET path` on `addr` is answered with 200 within a second.
fn get_answers_within_a_second(addr: SocketAddr, path: &str) {
    let started = Instant::now();
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))
        .unwrap_or_else(|e| panic!("{addr} takes no new connection: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut got = [0u8; 12];
    s.read_exact(&mut got)
        .unwrap_or_else(|e| panic!("GET {path} on {addr} was not answered within a second: {e}"));
    assert_eq!(&got, b"HTTP/1.1 200", "{}", String::from_utf8_lossy(&got));
    assert!(started.elapsed() < Duration::from_secs(1));
}

/// How many of `conns` the peer has closed or reset, polled until at least `want` have or
/// `within` passes.
fn count_closed(conns: &mut [TcpStream], want: usize, within: Duration) -> usize {
    let deadline = Instant::now() + within;
    let mut closed = vec![false; conns.len()];
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        for (s, c) in conns.iter_mut().zip(closed.iter_mut()) {
            if *c {
                continue;
            }
            s.set_nonblocking(true).unwrap();
            // Whatever arrived is read (an answer may be megabytes), then the end, if any.
            *c = loop {
                match s.read(&mut buf) {
                    Ok(0) => break true,
                    Ok(_) => continue,
                    Err(e) => break e.kind() != std::io::ErrorKind::WouldBlock,
                }
            };
            s.set_nonblocking(false).unwrap();
        }
        let n = closed.iter().filter(|c| **c).count();
        if n >= want || Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn metrics_of(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text
}

/// 400 silent connections to the admin port of a process allowed 256 descriptors: the admin
/// listener keeps to its share of the connection cap (a sixteenth: 12 here) and resets the
/// rest, so the MCP port still takes and answers new clients; the silent ones are closed at
/// the header timeout, and the admin port answers again.
#[test]
fn an_admin_flood_leaves_the_mcp_port_answering() {
    let up = big_call_upstream(0);
    let sc = Sidecar::start_with_prelude(
        "ulimit -n 256",
        &up.url(),
        &[
            MODERN,
            ("EPODE_SIDECAR_ADMIN_LISTEN", "127.0.0.1:0"),
            ("EPODE_SIDECAR_HEADER_TIMEOUT", "2s"),
            ("EPODE_SIDECAR_WORKERS", "1"),
        ],
    );
    let admin = sc.admin.unwrap();
    mcp_answers_within_a_second(sc.addr);
    let mut flood: Vec<TcpStream> = (0..400)
        .filter_map(|_| TcpStream::connect_timeout(&admin, Duration::from_millis(500)).ok())
        .collect();
    // Past its share, the admin port resets new connections at once. (On a loaded machine
    // some connects time out in the listen backlog: they never reach the sidecar.)
    assert!(flood.len() >= 300, "{} connections", flood.len());
    let want = flood.len() - 40;
    let reset = count_closed(&mut flood, want, Duration::from_secs(10));
    mcp_answers_within_a_second(sc.addr);
    assert!(open_fds(sc.pid()) < 256, "{}", open_fds(sc.pid()));
    assert!(
        reset >= want,
        "{reset} of {} admin connections refused past the admin share",
        flood.len()
    );
    // The silent ones go at the header timeout; then the probes are answered again.
    let started = Instant::now();
    let all = flood.len();
    let closed = count_closed(&mut flood, all, Duration::from_secs(30));
    assert_eq!(closed, all, "silent admin connections closed");
    assert!(started.elapsed() < Duration::from_secs(20));
    get_answers_within_a_second(admin, "/healthz");
    let metrics = metrics_of(admin);
    let refused = metric_value(
        &metrics,
        "epode_sidecar_limits_hit_total{kind=\"admin_connections\"}",
    );
    assert!(refused >= 300, "{refused}\n{metrics}");
}

/// 400 silent connections to the MCP port of a process allowed 256 descriptors, with
/// `max_connections` set far above what the descriptors allow: the cap is held to 80% of
/// the limit, the admin listener keeps its share, and the kubelet's probes on the admin
/// port are answered throughout.
#[test]
fn an_mcp_flood_leaves_the_admin_port_answering() {
    let up = big_call_upstream(0);
    let sc = Sidecar::start_with_prelude(
        "ulimit -n 256",
        &up.url(),
        &[
            MODERN,
            ("EPODE_SIDECAR_ADMIN_LISTEN", "127.0.0.1:0"),
            ("EPODE_SIDECAR_MAX_CONNECTIONS", "10000"),
            ("EPODE_SIDECAR_WORKERS", "1"),
        ],
    );
    let admin = sc.admin.unwrap();
    get_answers_within_a_second(admin, "/readyz");
    let mut flood: Vec<TcpStream> = (0..400)
        .filter_map(|_| TcpStream::connect(sc.addr).ok())
        .collect();
    let reset = count_closed(&mut flood, 150, Duration::from_secs(10));
    get_answers_within_a_second(admin, "/healthz");
    get_answers_within_a_second(admin, "/readyz");
    assert!(open_fds(sc.pid()) < 256, "{}", open_fds(sc.pid()));
    assert!(reset >= 150, "{reset} of 400 MCP connections refused");
    let logs = sc.logs().join("\n");
    assert!(
        logs.contains("max_connections is above 80% of the file-descriptor limit"),
        "{logs}"
    );
}

/// Connections that never send a byte, on the MCP port and on the admin port, are closed at
/// the header timeout (1 s, counted from accept, as nginx's `client_header_timeout`), not at
/// the idle timeout (60 s), and get no answer: there is no request to answer. One that
/// started a head still gets 408.
#[test]
fn a_silent_connection_is_closed_at_the_header_timeout() {
    let up = big_call_upstream(0);
    let sc = Sidecar::start(
        &up.url(),
        &[
            MODERN,
            ("EPODE_SIDECAR_ADMIN_LISTEN", "127.0.0.1:0"),
            ("EPODE_SIDECAR_HEADER_TIMEOUT", "1s"),
            ("EPODE_SIDECAR_IDLE_TIMEOUT", "60s"),
        ],
    );
    let admin = sc.admin.unwrap();
    let started = Instant::now();
    let mut silent: Vec<TcpStream> = (0..50)
        .map(|_| TcpStream::connect(sc.addr).unwrap())
        .chain((0..20).map(|_| TcpStream::connect(admin).unwrap()))
        .collect();
    let mut started_head = TcpStream::connect(sc.addr).unwrap();
    started_head.write_all(b"POST /mcp HTTP/1.1\r\n").unwrap();
    for s in &mut silent {
        let (closed, got) = closed_within(s, Duration::from_secs(15));
        assert!(closed, "a silent connection was still open after 15 s");
        assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    }
    let (closed, got) = closed_within(&mut started_head, Duration::from_secs(15));
    assert!(
        closed && got.starts_with(b"HTTP/1.1 408"),
        "{closed} {got:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    mcp_answers_within_a_second(sc.addr);
}

/// A client that shuts its side after sending a complete request still gets the answer (an
/// HTTP/1.1 client reads past the interim 100 the sidecar sends to tell a half-close from a
/// client gone for good, which still cancels its request: `tests/edges.rs`); an idle
/// connection is still closed at the client's end of stream.
#[test]
fn a_half_closed_connection_gets_its_answer() {
    let up = big_call_upstream(100_000);
    let sc = Sidecar::start(&up.url(), &[MODERN]);
    for method in ["tools/list", "tools/call"] {
        let mut s = TcpStream::connect(sc.addr).unwrap();
        s.write_all(&raw_request("half", method)).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let (closed, got) = closed_within(&mut s, Duration::from_secs(10));
        let text = String::from_utf8_lossy(&got);
        // An interim 100 may come first (an HTTP/1.1 client reads past any 1xx).
        let text = text.trim_start_matches("HTTP/1.1 100 Continue\r\n\r\n");
        assert!(text.starts_with("HTTP/1.1 200"), "{method}: {text:?}");
        assert!(text.contains("\"id\":\"half\""), "{method}");
        assert!(
            closed,
            "{method}: the connection stayed open after the answer"
        );
    }
    // Idle after an answer, then the client's end: closed at once, not at the idle timeout.
    let mut s = TcpStream::connect(sc.addr).unwrap();
    s.write_all(&raw_request("first", "tools/list")).unwrap();
    let mut head = [0u8; 12];
    s.read_exact(&mut head).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(
        closed_within(&mut s, Duration::from_secs(10)).0,
        "an idle connection stayed open after the client's end"
    );
}

/// The peak resident set size of a process, in KiB.
fn vm_hwm_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

const MIB: u64 = 1024;

/// 40 clients each ask for a 12 MiB answer and never read it, with a 32 MiB budget: every
/// byte held for them stays counted until written, so the budget refuses the answers past it
/// (503) instead of holding 480 MiB, and the peak resident size stays under the baseline plus
/// twice the budget. The clients that do not read are cut at the idle timeout, and the
/// memory comes back.
#[test]
fn clients_that_do_not_read_stay_within_the_budget() {
    let up = big_call_upstream(12 << 20);
    let sc = Sidecar::start(
        &up.url(),
        &[
            MODERN,
            ("EPODE_SIDECAR_MEMORY_BUDGET_BYTES", "33554432"),
            ("EPODE_SIDECAR_IDLE_TIMEOUT", "3s"),
            ("EPODE_SIDECAR_ADMIN_LISTEN", "127.0.0.1:0"),
        ],
    );
    let admin = sc.admin.unwrap();
    mcp_answers_within_a_second(sc.addr);
    let baseline = vm_hwm_kib(sc.pid());
    // One after another, each once the one before has its answer started (or refused):
    // then none is refused for another's bytes still being read from the upstream.
    let mut clients: Vec<TcpStream> = Vec::new();
    let mut statuses = Vec::new();
    for i in 0..40 {
        let mut s = TcpStream::connect(sc.addr).unwrap();
        s.write_all(&raw_request(&format!("big-{i}"), "tools/call"))
            .unwrap();
        // The status line only: nothing more is read.
        let mut status = [0u8; 12];
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.read_exact(&mut status).unwrap();
        statuses.push(String::from_utf8_lossy(&status[9..]).into_owned());
        clients.push(s);
    }
    let peak = vm_hwm_kib(sc.pid());
    eprintln!("VmHWM {peak} KiB, baseline {baseline} KiB, statuses {statuses:?}");
    assert!(
        peak < baseline + 2 * 32 * MIB,
        "peak resident size {peak} KiB: baseline {baseline} KiB plus more than twice the 32 MiB budget"
    );
    assert!(statuses.iter().any(|s| s == "503"), "{statuses:?}");
    let closed = count_closed(&mut clients, 40, Duration::from_secs(30));
    assert_eq!(closed, 40, "clients that do not read were not all cut");
    let text = metrics_of(admin);
    assert_eq!(
        metric_value(&text, "epode_sidecar_buffered_bytes"),
        0,
        "{text}"
    );
    assert!(
        metric_value(
            &text,
            "epode_sidecar_limits_hit_total{kind=\"memory_budget\"}"
        ) > 0,
        "{text}"
    );
    mcp_answers_within_a_second(sc.addr);
}

/// A client that asks for an endless event stream and never reads it is cut at the idle
/// timeout (a write that makes no progress), not held for as long as the upstream streams.
#[test]
fn a_client_that_does_not_read_is_cut_at_the_idle_timeout() {
    let event = format!(
        "event: message\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{{\"level\":\"info\",\"data\":\"{}\"}}}}\n\n",
        "x".repeat(16 * 1024)
    );
    let up = ScriptedUpstream::new()
        .on("tools/call", Reply::sse().repeat(event.as_bytes(), None))
        .otherwise(Reply::result(json!({"tools": []})))
        .start();
    let sc = Sidecar::start(&up.url(), &[MODERN, ("EPODE_SIDECAR_IDLE_TIMEOUT", "2s")]);
    let mut s = TcpStream::connect(sc.addr).unwrap();
    s.write_all(&raw_request("stream", "tools/call")).unwrap();
    let started = Instant::now();
    let open = || metric_value(&metrics_of(sc.addr), "epode_sidecar_open_connections");
    let deadline = started + Duration::from_secs(30);
    while open() < 2 {
        assert!(Instant::now() < deadline, "the connection was never taken");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Nothing is read until the sidecar gives up (the socket buffers fill first): then the
    // only connection left open is the one asking for the metrics (on the MCP port).
    let text = loop {
        let text = metrics_of(sc.addr);
        if metric_value(&text, "epode_sidecar_open_connections") <= 1 {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "a client that does not read was still served after 30 s (idle timeout 2 s)"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        metric_value(
            &text,
            "epode_sidecar_limits_hit_total{kind=\"write_timeout\"}"
        ),
        1,
        "{text}"
    );
    assert!(started.elapsed() > Duration::from_secs(2));
    let mut sink = Vec::new();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.read_to_end(&mut sink);
    assert!(
        sink.len() < 64 << 20,
        "the stream went on: {} bytes",
        sink.len()
    );
    mcp_answers_within_a_second(sc.addr);
}

/// An HTTP/2 (prior knowledge) connection on which the client sends the head and part of a
/// body of `len` bytes, then holds: the stream's answer, when it came, and whether the
/// connection then ended within `within`.
async fn h2_held_body(addr: SocketAddr, len: usize, within: Duration) -> (u16, String, bool) {
    use http_body_util::BodyExt as _;
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    let conn = tokio::spawn(conn);
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(4);
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        let b = rx.recv().await?;
        Some((
            Ok::<_, std::convert::Infallible>(http_body::Frame::data(b)),
            rx,
        ))
    });
    let body = http_body_util::StreamBody::new(Box::pin(stream));
    let mut req =
        hyper::Request::post("http://127.0.0.1/mcp").header("content-length", len.to_string());
    for (k, v) in modern_headers("tools/list", None) {
        req = req.header(k, v);
    }
    let req = req.body(body).unwrap();
    tx.send(bytes::Bytes::from(vec![b' '; len / 2]))
        .await
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let text =
        String::from_utf8_lossy(&resp.into_body().collect().await.unwrap().to_bytes()).into_owned();
    let ended = tokio::time::timeout(within, conn).await.is_ok();
    drop(tx);
    (status, text, ended)
}

/// A head and all but 115 bytes of a 4 MiB body, then nothing: what the sidecar answered
/// and whether it closed the connection, within `within`.
fn h1_held_body(addr: SocketAddr, within: Duration) -> (bool, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    let len = 4 << 20;
    let mut head = format!("POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {len}\r\n");
    for (k, v) in modern_headers("tools/list", None) {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    let chunk = vec![b' '; 64 * 1024];
    let mut sent = 0;
    while sent + chunk.len() <= len - 115 && s.write_all(&chunk).is_ok() {
        sent += chunk.len();
    }
    let (closed, got) = closed_within(&mut s, within);
    (closed, String::from_utf8_lossy(&got).into_owned())
}

/// 10 clients over HTTP/1.1 and 10 over HTTP/2 each send the head and part of a 4 MiB body
/// and hold, all inside the memory budget: each gets 408 with a JSON-RPC error at the body
/// timeout (1 s) and its connection is closed (on HTTP/2 too: the stream's answer says the
/// connection closes, so the connection goes away, not at the idle timeout, 60 s).
#[test]
fn a_held_body_is_cut_with_408_at_the_body_timeout() {
    let up = big_call_upstream(0);
    let sc = Sidecar::start(
        &up.url(),
        &[
            MODERN,
            ("EPODE_SIDECAR_BODY_TIMEOUT", "1s"),
            ("EPODE_SIDECAR_IDLE_TIMEOUT", "60s"),
        ],
    );
    let addr = sc.addr;
    let started = Instant::now();
    let h1: Vec<_> = (0..10)
        .map(|_| std::thread::spawn(move || h1_held_body(addr, Duration::from_secs(20))))
        .collect();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let h2: Vec<(u16, String, bool)> = runtime.block_on(async {
        let held: Vec<_> = (0..10)
            .map(|_| tokio::spawn(h2_held_body(addr, 4 << 20, Duration::from_secs(20))))
            .collect();
        let mut out = Vec::new();
        for h in held {
            out.push(h.await.unwrap());
        }
        out
    });
    for (closed, text) in h1.into_iter().map(|h| h.join().unwrap()) {
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
        assert!(text.contains("\"code\":-32000"), "{text}");
        assert!(closed, "an HTTP/1.1 connection stayed open after its 408");
    }
    for (status, text, ended) in h2 {
        assert_eq!(status, 408, "{text}");
        assert!(text.contains("\"code\":-32000"), "{text}");
        assert!(ended, "an HTTP/2 connection stayed open after its 408");
    }
    assert!(started.elapsed() < Duration::from_secs(30));
    mcp_answers_within_a_second(sc.addr);
}

/// The `--dev` embedded Epode's address, from the sidecar's start-up log.
fn dev_epode_addr(sc: &Sidecar) -> SocketAddr {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    loop {
        seen.extend(sc.logs());
        let found = seen.iter().find_map(|l| {
            let at = l.find("embedded_epode=")? + "embedded_epode=".len();
            l[at..].split_whitespace().next()?.parse().ok()
        });
        if let Some(addr) = found {
            return addr;
        }
        assert!(
            Instant::now() < deadline,
            "no embedded Epode in\n{}",
            seen.join("\n")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `--dev` embedded Epode's listener is bounded like the others: a connection that sends
/// nothing is closed at the header timeout, a body held past the body timeout gets 408 and
/// the connection is closed, an idle keep-alive connection is closed at the idle timeout.
#[test]
fn the_dev_epode_listener_is_bounded_like_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("record.jsonl");
    let up = big_call_upstream(0);
    let sc = Sidecar::start(
        &up.url(),
        &[
            MODERN,
            ("EPODE_SIDECAR_DEV", "1"),
            ("EPODE_SIDECAR_DEV_LOG", record.to_str().unwrap()),
            ("EPODE_SIDECAR_HEADER_TIMEOUT", "1s"),
            ("EPODE_SIDECAR_BODY_TIMEOUT", "1s"),
            ("EPODE_SIDECAR_IDLE_TIMEOUT", "3s"),
        ],
    );
    let epode = dev_epode_addr(&sc);
    let started = Instant::now();
    let mut silent = TcpStream::connect(epode).unwrap();
    let mut held = TcpStream::connect(epode).unwrap();
    held.write_all(b"POST /v1/telemetry/batches HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"events\":[")
        .unwrap();
    let mut idle = TcpStream::connect(epode).unwrap();
    idle.write_all(b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let (closed, got) = closed_within(&mut silent, Duration::from_secs(10));
    assert!(closed && got.is_empty(), "silent: {closed} {got:?}");
    let (closed, got) = closed_within(&mut held, Duration::from_secs(10));
    let text = String::from_utf8_lossy(&got);
    assert!(
        closed && text.starts_with("HTTP/1.1 408"),
        "held body: {text}"
    );
    let (closed, got) = closed_within(&mut idle, Duration::from_secs(15));
    assert!(closed && !got.is_empty(), "idle: {closed} {got:?}");
    assert!(started.elapsed() < Duration::from_secs(20));
    // And it still answers.
    let mut s = TcpStream::connect(epode).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
        .unwrap();
    let (_, got) = closed_within(&mut s, Duration::from_secs(5));
    assert!(got.starts_with(b"HTTP/1.1 "), "{got:?}");
}

/// The same non-reading clients over HTTP/2 by TLS ALPN (each its own connection): the
/// answers a connection holds for them are counted in the budget until written, so most
/// are refused with 503, the peak resident size stays under the baseline plus twice the
/// budget, and a stream whose client holds the flow-control window shut is cut at the idle
/// timeout, giving its memory back.
#[tokio::test]
async fn http2_clients_that_do_not_read_stay_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
    let (crt, key) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
    std::fs::write(&crt, cert.cert.pem()).unwrap();
    std::fs::write(&key, cert.signing_key.serialize_pem()).unwrap();
    let up = big_call_upstream(12 << 20);
    let sc = Sidecar::start(
        &up.url(),
        &[
            MODERN,
            ("EPODE_SIDECAR_TLS_CERT", crt.to_str().unwrap()),
            ("EPODE_SIDECAR_TLS_KEY", key.to_str().unwrap()),
            ("EPODE_SIDECAR_MEMORY_BUDGET_BYTES", "33554432"),
            ("EPODE_SIDECAR_IDLE_TIMEOUT", "3s"),
            ("EPODE_SIDECAR_ADMIN_LISTEN", "127.0.0.1:0"),
        ],
    );
    let admin = sc.admin.unwrap();
    let url = format!("https://127.0.0.1:{}/mcp", sc.addr.port());
    let call = |i: usize| {
        let client = reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .build()
            .unwrap();
        let body = modern_body(
            json!(format!("big-{i}")),
            "tools/call",
            json!({"name": "big", "arguments": {}}),
        );
        let mut req = client
            .post(&url)
            .version(reqwest::Version::HTTP_2)
            .body(body.to_string());
        for (k, v) in modern_headers("tools/call", Some("big")) {
            req = req.header(k, v);
        }
        req.send()
    };
    let client = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let body = modern_body(json!("warm"), "tools/list", json!({}));
    let mut req = client
        .post(&url)
        .version(reqwest::Version::HTTP_2)
        .body(body.to_string());
    for (k, v) in modern_headers("tools/list", None) {
        req = req.header(k, v);
    }
    let warm = req.send().await.unwrap();
    assert_eq!(warm.version(), reqwest::Version::HTTP_2);
    assert_eq!(warm.status(), 200);
    let baseline = vm_hwm_kib(sc.pid());
    // One after another, each once the one before has its answer's head; no body is read.
    let mut held = Vec::new();
    for i in 0..40 {
        held.push(call(i).await.unwrap());
    }
    let statuses: Vec<u16> = held.iter().map(|r| r.status().as_u16()).collect();
    let peak = vm_hwm_kib(sc.pid());
    eprintln!("VmHWM {peak} KiB, baseline {baseline} KiB, statuses {statuses:?}");
    assert!(
        peak < baseline + 2 * 32 * MIB,
        "peak resident size {peak} KiB: baseline {baseline} KiB plus more than twice the 32 MiB budget"
    );
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 503),
        "{statuses:?}"
    );
    assert!(statuses.contains(&503), "{statuses:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = tokio::task::spawn_blocking(move || metrics_of(admin))
            .await
            .unwrap();
        if metric_value(&text, "epode_sidecar_buffered_bytes") == 0 {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "the held answers were never given back\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        metric_value(
            &text,
            "epode_sidecar_limits_hit_total{kind=\"write_timeout\"}"
        ) > 0,
        "{text}"
    );
    drop(held);
}
