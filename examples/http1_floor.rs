//! The floor under the sidecar's pass-through: the least an HTTP/1 proxy hop costs on this
//! stack, with none of the sidecar's work. Two proxies, started as the overhead benchmark
//! starts the sidecar (`EPODE_SIDECAR_LISTEN`, `EPODE_SIDECAR_UPSTREAM`), so `bench/floor`
//! loads them with the benchmark's own load and watches them with `perf stat`:
//!
//! - `EPODE_FLOOR=hyper`: hyper's HTTP/1 server and client as the sidecar drives them (one
//!   single-threaded event loop per core on its own `SO_REUSEPORT` listener; per worker a stack
//!   of idle client connections, each driven by a task of its own; the bodies read whole).
//! - `EPODE_FLOOR=raw` (or the binary's name ending in `-raw`): the same threads and listeners, HTTP/1 read and written by hand
//!   (`httparse`; `Content-Length` bodies, and chunked ones ended by a bare last chunk): per client connection one upstream
//!   connection, used in the connection's own task, and one read and one write buffer each,
//!   kept for the connection's life.
//!
//! Not a proxy for anything but this measurement (no chunked bodies, no limits, no errors
//! told): it answers "how much of the sidecar's CPU per request is the HTTP stack's".

use std::cell::RefCell;
use std::net::SocketAddr;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1 as client;
use hyper::server::conn::http1 as server;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let listen: SocketAddr = std::env::var("EPODE_SIDECAR_LISTEN")
        .expect("EPODE_SIDECAR_LISTEN")
        .parse()
        .expect("EPODE_SIDECAR_LISTEN is host:port");
    let upstream = std::env::var("EPODE_SIDECAR_UPSTREAM").expect("EPODE_SIDECAR_UPSTREAM");
    let rest = upstream
        .strip_prefix("http://")
        .expect("an http:// upstream");
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let up: SocketAddr = authority.parse().expect("the upstream is host:port");
    let path: &'static str = Box::leak(path.to_owned().into_boxed_str());
    // The benchmark clears the environment: the binary's name chooses, too.
    let raw = std::env::var("EPODE_FLOOR").as_deref() == Ok("raw")
        || std::env::args().next().is_some_and(|a| a.ends_with("-raw"));
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let threads: Vec<_> = (0..workers)
        .map(|_| {
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(serve(listen, up, path, raw));
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

fn listener(at: SocketAddr) -> TcpListener {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.set_reuse_address(true).unwrap();
    s.set_reuse_port(true).unwrap();
    s.set_nonblocking(true).unwrap();
    s.bind(&at.into()).unwrap();
    s.listen(1024).unwrap();
    TcpListener::from_std(s.into()).unwrap()
}

async fn serve(at: SocketAddr, up: SocketAddr, path: &'static str, raw: bool) {
    let l = listener(at);
    loop {
        let Ok((conn, _)) = l.accept().await else {
            continue;
        };
        let _ = conn.set_nodelay(true);
        if raw {
            tokio::spawn(raw_conn(conn, up, path));
        } else {
            tokio::spawn(hyper_conn(conn, up, path));
        }
    }
}

// ---------------------------------------------------------------------------------------
// hyper's server and client.

type Sender = client::SendRequest<Full<Bytes>>;

thread_local! {
    static IDLE: RefCell<Vec<Sender>> = const { RefCell::new(Vec::new()) };
}

async fn hyper_conn(conn: TcpStream, up: SocketAddr, path: &'static str) {
    let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        forward(req, up, path)
    });
    let _ = server::Builder::new()
        .serve_connection(TokioIo::new(conn), svc)
        .await;
}

async fn forward(
    req: hyper::Request<hyper::body::Incoming>,
    up: SocketAddr,
    path: &'static str,
) -> Result<hyper::Response<Full<Bytes>>, hyper::Error> {
    let (head, body) = req.into_parts();
    let body = body.collect().await?.to_bytes();
    let mut out = hyper::Request::post(path)
        .body(Full::new(body))
        .expect("a request");
    *out.headers_mut() = head.headers;
    let mut sender = match IDLE.with(|i| i.borrow_mut().pop()) {
        Some(s) => s,
        None => {
            let s = TcpStream::connect(up).await.expect("the upstream");
            let _ = s.set_nodelay(true);
            let (sender, conn) = client::handshake(TokioIo::new(s)).await?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            sender
        }
    };
    let resp = sender.send_request(out).await?;
    let (head, body) = resp.into_parts();
    let body = body.collect().await?.to_bytes();
    IDLE.with(|i| i.borrow_mut().push(sender));
    Ok(hyper::Response::from_parts(head, Full::new(body)))
}

// ---------------------------------------------------------------------------------------
// By hand.

/// How an HTTP/1 message's body ends.
enum BodyEnd {
    Length(usize),
    /// `Transfer-Encoding: chunked`: at the last chunk (the floor's upstream ends every
    /// chunked body with `0\r\n\r\n` and no trailers).
    Chunked,
}

/// One HTTP/1 message's head read into `buf`: its length and how its body ends.
fn parsed(buf: &[u8], request: bool) -> Option<(usize, BodyEnd)> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let head = if request {
        let mut r = httparse::Request::new(&mut headers);
        match r.parse(buf).ok()? {
            httparse::Status::Complete(n) => n,
            httparse::Status::Partial => return None,
        }
    } else {
        let mut r = httparse::Response::new(&mut headers);
        match r.parse(buf).ok()? {
            httparse::Status::Complete(n) => n,
            httparse::Status::Partial => return None,
        }
    };
    let named = |name: &str| {
        headers
            .iter()
            .take_while(|h| !h.name.is_empty())
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .and_then(|h| std::str::from_utf8(h.value).ok())
    };
    if named("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        return Some((head, BodyEnd::Chunked));
    }
    let len = named("content-length")
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    Some((head, BodyEnd::Length(len)))
}

/// Reads one whole message into `buf` (which may hold the start of it already); its length.
async fn read_message(s: &mut TcpStream, buf: &mut BytesMut, request: bool) -> Option<usize> {
    loop {
        if let Some((head, end)) = parsed(buf, request) {
            loop {
                let whole = match end {
                    BodyEnd::Length(n) => (buf.len() >= head + n).then_some(head + n),
                    BodyEnd::Chunked => buf[head..]
                        .windows(5)
                        .position(|w| w == b"0\r\n\r\n")
                        .map(|at| head + at + 5),
                };
                if let Some(n) = whole {
                    return Some(n);
                }
                if s.read_buf(buf).await.ok()? == 0 {
                    return None;
                }
            }
        }
        if s.read_buf(buf).await.ok()? == 0 {
            return None;
        }
    }
}

async fn raw_conn(mut conn: TcpStream, up: SocketAddr, path: &'static str) {
    let mut upstream: Option<TcpStream> = None;
    let (mut inb, mut upb, mut out) = (
        BytesMut::with_capacity(8192),
        BytesMut::with_capacity(8192),
        Vec::with_capacity(8192),
    );
    while let Some(n) = read_message(&mut conn, &mut inb, true).await {
        // The request again, its target the upstream's path, its headers as they came.
        out.clear();
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut r = httparse::Request::new(&mut headers);
        let Ok(httparse::Status::Complete(head)) = r.parse(&inb[..n]) else {
            return;
        };
        out.extend_from_slice(r.method.unwrap_or("POST").as_bytes());
        out.extend_from_slice(b" ");
        out.extend_from_slice(path.as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\n");
        for h in r.headers.iter() {
            out.extend_from_slice(h.name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(h.value);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&inb[head..n]);
        let _ = inb.split_to(n);
        if upstream.is_none() {
            let s = TcpStream::connect(up).await.expect("the upstream");
            let _ = s.set_nodelay(true);
            upstream = Some(s);
        }
        let u = upstream.as_mut().expect("connected");
        if u.write_all(&out).await.is_err() {
            return;
        }
        let Some(m) = read_message(u, &mut upb, false).await else {
            return;
        };
        if conn.write_all(&upb[..m]).await.is_err() {
            return;
        }
        let _ = upb.split_to(m);
        if inb.capacity() < 4096 {
            inb.reserve(8192);
        }
        if upb.capacity() < 4096 {
            upb.reserve(8192);
        }
    }
}
