//! The pool against a hand-written HTTP/1.1 server that counts connections and requests.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use http_body_util::BodyExt;
use hyper_rustls::HttpsConnectorBuilder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Barrier;

use super::*;

/// What the server does after answering a request on a connection.
#[derive(Clone, Copy)]
enum After {
    KeepAlive,
    /// Closes the connection (an upstream's keep-alive timeout, without saying so).
    Close,
}

#[derive(Default)]
struct Counts {
    connections: AtomicUsize,
    requests: AtomicUsize,
}

/// Serves `body` to every request; `gate`, when given, holds each first answer until that
/// many connections are open.
async fn server(
    body: &'static str,
    status: u16,
    after: After,
    gate: Option<Arc<Barrier>>,
) -> (Uri, Arc<Counts>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counts = Arc::new(Counts::default());
    let c = counts.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            c.connections.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve(stream, body, status, after, gate.clone(), c.clone()));
        }
    });
    (format!("http://{addr}/").parse().unwrap(), counts)
}

async fn serve(
    mut s: TcpStream,
    body: &'static str,
    status: u16,
    after: After,
    gate: Option<Arc<Barrier>>,
    counts: Arc<Counts>,
) {
    let mut buf = Vec::new();
    let mut gate = gate;
    loop {
        // One request: its head, then a Content-Length body.
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 4096];
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
        assert!(
            head.starts_with("post / http/1.1\r\n"),
            "origin form: {head}"
        );
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map(|v| v.trim().parse().unwrap())
            .unwrap_or(0);
        while buf.len() < head_end + len {
            let mut chunk = [0u8; 4096];
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..head_end + len);
        counts.requests.fetch_add(1, Ordering::SeqCst);
        if let Some(g) = gate.take() {
            g.wait().await;
        }
        let answer = format!(
            "HTTP/1.1 {status} X\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if s.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
        if let After::Close = after {
            return;
        }
    }
}

const MAX_IDLE: usize = 64;

fn pool(origin: Uri) -> Pool {
    bounded(origin, MAX_IDLE, Duration::from_secs(3))
}

fn bounded(origin: Uri, max: usize, timeout: Duration) -> Pool {
    capped(
        origin,
        max,
        timeout,
        &ConnectionBound::new(10_000, None, Duration::from_secs(30), Gauge::default()),
    )
}

fn capped(origin: Uri, max: usize, timeout: Duration, gate: &Arc<ConnectionBound>) -> Pool {
    let mut http = HttpConnector::new_with_resolver(Resolver::default());
    http.enforce_http(false);
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(rustls::RootCertStore::empty())
    .with_no_client_auth();
    let connector = HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Pool::new(connector, origin, IdleBound { max, timeout }, gate.clone())
}

fn request(origin: &Uri) -> Request<Full<Bytes>> {
    Request::post("/")
        .header(http::header::HOST, origin.authority().unwrap().as_str())
        .body(Full::new(Bytes::from_static(b"{\"jsonrpc\":\"2.0\"}")))
        .unwrap()
}

async fn read(resp: Response<PooledBody>) -> Bytes {
    resp.into_body().collect().await.unwrap().to_bytes()
}

#[tokio::test]
async fn answers_read_to_their_end_reuse_one_connection() {
    let (origin, counts) = server("hello", 200, After::KeepAlive, None).await;
    let pool = pool(origin.clone());
    for _ in 0..5 {
        let resp = pool.send(request(&origin)).await.unwrap();
        assert_eq!(&read(resp).await[..], b"hello");
    }
    assert_eq!(counts.connections.load(Ordering::SeqCst), 1);
    assert_eq!(counts.requests.load(Ordering::SeqCst), 5);
    assert_eq!(pool.idle(), 1);
}

#[tokio::test]
async fn an_empty_answer_gives_its_connection_back_unread() {
    let (origin, counts) = server("", 202, After::KeepAlive, None).await;
    let pool = pool(origin.clone());
    for _ in 0..3 {
        let resp = pool.send(request(&origin)).await.unwrap();
        assert_eq!(resp.status(), 202);
        drop(resp);
    }
    assert_eq!(counts.connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_answer_dropped_before_its_end_closes_its_connection() {
    let (origin, counts) = server("not read", 200, After::KeepAlive, None).await;
    let pool = pool(origin.clone());
    for _ in 0..3 {
        drop(pool.send(request(&origin)).await.unwrap());
    }
    assert_eq!(counts.connections.load(Ordering::SeqCst), 3);
    assert_eq!(pool.idle(), 0);
}

#[tokio::test]
async fn a_connection_the_upstream_closed_while_idle_is_replaced_and_nothing_is_sent_twice() {
    let (origin, counts) = server("bye", 200, After::Close, None).await;
    let pool = pool(origin.clone());
    for i in 1..=4 {
        let resp = pool.send(request(&origin)).await.unwrap();
        assert_eq!(&read(resp).await[..], b"bye");
        // Let the connection's task see the close, or not: both must work.
        if i % 2 == 0 {
            tokio::task::yield_now().await;
        }
    }
    assert_eq!(counts.connections.load(Ordering::SeqCst), 4);
    assert_eq!(counts.requests.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn no_upstream_is_a_connect_error_that_names_the_cause() {
    let unused = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin: Uri = format!("http://{}/", unused.local_addr().unwrap())
        .parse()
        .unwrap();
    drop(unused);
    match pool(origin.clone()).send(request(&origin)).await {
        Err(PoolError::Connect(why)) => assert!(why.contains("refused"), "{why}"),
        other => panic!(
            "expected a connect error, got {:?}",
            other.map(|r| r.status())
        ),
    }
}

#[tokio::test]
async fn at_most_max_idle_connections_are_kept() {
    let n = MAX_IDLE + 6;
    let gate = Arc::new(Barrier::new(n));
    let (origin, counts) = server("x", 200, After::KeepAlive, Some(gate)).await;
    let pool = pool(origin.clone());
    let mut all = tokio::task::JoinSet::new();
    for _ in 0..n {
        let (pool, origin) = (pool.clone(), origin.clone());
        all.spawn(async move { read(pool.send(request(&origin)).await.unwrap()).await });
    }
    while let Some(done) = all.join_next().await {
        assert_eq!(&done.unwrap()[..], b"x");
    }
    assert_eq!(counts.connections.load(Ordering::SeqCst), n);
    assert_eq!(pool.idle(), MAX_IDLE);
}

#[tokio::test]
async fn a_connection_idle_past_its_timeout_is_closed_and_not_reused() {
    let (origin, counts) = server("x", 200, After::KeepAlive, None).await;
    let pool = bounded(origin.clone(), MAX_IDLE, Duration::from_millis(50));
    read(pool.send(request(&origin)).await.unwrap()).await;
    assert_eq!(pool.idle(), 1);
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert_eq!(pool.idle(), 0);
    read(pool.send(request(&origin)).await.unwrap()).await;
    assert_eq!(counts.connections.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn no_idle_connections_kept_means_one_connection_per_request() {
    let (origin, counts) = server("x", 200, After::KeepAlive, None).await;
    let pool = bounded(origin.clone(), 0, Duration::from_secs(3));
    for _ in 0..3 {
        read(pool.send(request(&origin)).await.unwrap()).await;
    }
    assert_eq!(counts.connections.load(Ordering::SeqCst), 3);
    assert_eq!(pool.idle(), 0);
}

#[tokio::test]
async fn at_the_cap_requests_wait_for_a_connection_given_back() {
    let (origin, counts) = server("x", 200, After::KeepAlive, None).await;
    let gate = ConnectionBound::new(2, None, Duration::from_secs(30), Gauge::default());
    // Two workers' pools under one cap.
    let pools = [
        capped(origin.clone(), MAX_IDLE, Duration::from_secs(3), &gate),
        capped(origin.clone(), MAX_IDLE, Duration::from_secs(3), &gate),
    ];
    let mut all = tokio::task::JoinSet::new();
    for i in 0..40 {
        let (pool, origin) = (pools[i % 2].clone(), origin.clone());
        all.spawn(async move { read(pool.send(request(&origin)).await.unwrap()).await });
    }
    while let Some(done) = all.join_next().await {
        assert_eq!(&done.unwrap()[..], b"x");
    }
    assert!(counts.connections.load(Ordering::SeqCst) >= 1);
    assert_eq!(counts.requests.load(Ordering::SeqCst), 40);
    assert!(pools[0].idle() + pools[1].idle() <= 2);
}

#[tokio::test]
async fn past_the_wait_a_request_is_busy_and_not_sent() {
    // The first answer waits until a second request arrives, which never does.
    let gate_open = Arc::new(Barrier::new(2));
    let (origin, counts) = server("x", 200, After::KeepAlive, Some(gate_open)).await;
    let gate = ConnectionBound::new(1, None, Duration::from_millis(50), Gauge::default());
    let pool = capped(origin.clone(), MAX_IDLE, Duration::from_secs(3), &gate);
    let first = {
        let (pool, origin) = (pool.clone(), origin.clone());
        tokio::spawn(async move { pool.send(request(&origin)).await.map(|r| r.status()) })
    };
    let arrived = async {
        while counts.requests.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), arrived)
        .await
        .expect("the first request reached the server");
    match pool.send(request(&origin)).await {
        Err(PoolError::Busy(waited, None)) => assert_eq!(waited, Duration::from_millis(50)),
        other => panic!("expected busy, got {:?}", other.map(|r| r.status())),
    }
    assert_eq!(counts.requests.load(Ordering::SeqCst), 1);
    assert_eq!(counts.connections.load(Ordering::SeqCst), 1);
    first.abort();
}

#[tokio::test]
async fn each_path_holds_at_most_its_share_and_leaves_the_other_its_own() {
    let (origin, counts) = server("x", 200, After::KeepAlive, None).await;
    // Three connections: one for the surface, two for MCP.
    let gate = ConnectionBound::new(3, Some(1), Duration::from_millis(50), Gauge::default());
    let pool = capped(origin.clone(), MAX_IDLE, Duration::from_secs(3), &gate);
    let send = |share| pool.send_for(request(&origin), share);
    // An answer not yet read holds its connection, and its place in the share.
    let surface = send(Share::Surface).await.unwrap();
    match send(Share::Surface).await {
        Err(PoolError::Busy(_, Some(Share::Surface))) => {}
        other => panic!(
            "expected the surface's share busy, got {:?}",
            other.map(|r| r.status())
        ),
    }
    let mcp = [
        send(Share::Mcp).await.unwrap(),
        send(Share::Mcp).await.unwrap(),
    ];
    match send(Share::Mcp).await {
        Err(PoolError::Busy(_, Some(Share::Mcp))) => {}
        other => panic!(
            "expected the MCP share busy, got {:?}",
            other.map(|r| r.status())
        ),
    }
    assert_eq!(
        counts.requests.load(Ordering::SeqCst),
        3,
        "nothing busy was sent"
    );
    // A connection given back gives back its place: the next request of that path is served
    // on it.
    assert_eq!(&read(surface).await[..], b"x");
    assert_eq!(&read(send(Share::Surface).await.unwrap()).await[..], b"x");
    let [first, second] = mcp;
    assert_eq!(&read(first).await[..], b"x");
    assert_eq!(&read(send(Share::Mcp).await.unwrap()).await[..], b"x");
    drop(second);
    assert_eq!(counts.connections.load(Ordering::SeqCst), 3);
}
