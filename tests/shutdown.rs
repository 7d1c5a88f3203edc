//! SIGTERM: stop accepting, let in-flight requests finish within the grace, exit 0.

mod support;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use support::*;

fn slow_upstream(delay: Duration) -> RawUpstream {
    RawUpstream::start(move |mut s: TcpStream| {
        while read_http_request(&mut s).is_some() {
            std::thread::sleep(delay);
            let body =
                r#"{"jsonrpc":"2.0","id":1,"result":{"content":[],"resultType":"complete"}}"#;
            reply_json(&mut s, body);
        }
    })
}

#[tokio::test]
async fn sigterm_lets_in_flight_requests_finish_then_exits_zero() {
    let up = slow_upstream(Duration::from_millis(1200));
    let mut sc = Sidecar::start(
        &up.url(),
        &[
            ("EPODE_SIDECAR_SHUTDOWN_GRACE", "5s"),
            ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28"),
        ],
    );
    let url = sc.url();
    let in_flight = tokio::spawn(async move {
        let resp = http()
            .post(url)
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow"}}"#)
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), resp.text().await.unwrap())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    sc.terminate();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        TcpStream::connect(sc.addr).is_err(),
        "the sidecar still accepts connections after SIGTERM"
    );
    let (status, body) = in_flight.await.unwrap();
    assert_eq!(status, 200);
    assert!(body.contains("\"content\":[]"), "{body}");
    let code = tokio::task::spawn_blocking(move || sc.wait_exit(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(code, Some(0));
}

#[tokio::test]
async fn shutdown_grace_bounds_the_wait() {
    let up = slow_upstream(Duration::from_secs(30));
    let mut sc = Sidecar::start(
        &up.url(),
        &[
            ("EPODE_SIDECAR_SHUTDOWN_GRACE", "500ms"),
            ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28"),
        ],
    );
    let url = sc.url();
    let _stuck = tokio::spawn(async move { http().post(url).body("{}").send().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    sc.terminate();
    let code = tokio::task::spawn_blocking(move || sc.wait_exit(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(code, Some(0));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}
