//! SIGTERM: stop accepting, let in-flight requests finish within the grace, exit 0; past the
//! grace, answer what is left with an error and exit 3.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::support::*;

/// An upstream that answers every request after `delay`.
fn slow_upstream(delay: Duration) -> Scripted {
    ScriptedUpstream::new()
        .otherwise(
            Reply::json(
                r#"{"jsonrpc":"2.0","id":1,"result":{"content":[],"resultType":"complete"}}"#,
            )
            .delayed(delay),
        )
        .start()
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
            .header("content-type", "application/json")
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow"}}"#)
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), resp.text().await.unwrap())
    });
    // Terminated once the call is in flight (the upstream has it and takes 1.2 s).
    assert!(
        eventually_async(Duration::from_secs(10), || std::future::ready(
            up.request_count() == 1
        ))
        .await
    );
    sc.terminate();
    assert!(
        eventually_async(Duration::from_secs(5), || {
            std::future::ready(TcpStream::connect(sc.addr).is_err())
        })
        .await,
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

/// Work still running when the grace period ends is answered before its connection closes:
/// a JSON call gets 503 with a JSON-RPC error naming it, a stream gets an error event naming
/// it, and the exit status (3) says that work was cut.
#[tokio::test]
async fn work_past_the_grace_period_is_answered_and_the_exit_says_so() {
    // `json` hangs before answering; `sse` sends a progress event and then hangs.
    let up = ScriptedUpstream::new()
        .when(
            |r| *r.id() == "sse",
            Reply::sse()
                .event(r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}"#)
                .then_hang(),
        )
        .otherwise(Reply::silent())
        .start();
    let mut sc = Sidecar::start(
        &up.url(),
        &[
            ("EPODE_SIDECAR_SHUTDOWN_GRACE", "500ms"),
            ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28"),
        ],
    );
    // Each call says when its answer's head has arrived (only the stream's does before the
    // shutdown).
    let (head_tx, mut head_rx) = tokio::sync::mpsc::unbounded_channel();
    let call = |id: &'static str| {
        let url = sc.url();
        let head_tx = head_tx.clone();
        tokio::spawn(async move {
            let body = modern_body(serde_json::json!(id), "tools/list", serde_json::json!({}));
            let resp = post_modern(&url, "tools/list", None, &body).await;
            let _ = head_tx.send(id);
            let status = resp.status().as_u16();
            let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
            (status, ct, resp.text().await.unwrap())
        })
    };
    let (json_call, sse_call) = (call("json"), call("sse"));
    // Terminated once both are in flight: the upstream holds both, and the stream has begun.
    assert!(
        eventually_async(Duration::from_secs(10), || std::future::ready(
            up.request_count() == 2
        ))
        .await
    );
    let begun = tokio::time::timeout(Duration::from_secs(10), head_rx.recv()).await;
    assert_eq!(begun.ok().flatten(), Some("sse"));
    let started = Instant::now();
    sc.terminate();
    let (status, ct, body) = json_call.await.unwrap();
    assert_eq!(status, 503, "{body}");
    let v = last_message(&ct, &body);
    assert_eq!(v["id"], "json", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("shutting down"),
        "{v}"
    );
    let (status, ct, body) = sse_call.await.unwrap();
    assert_eq!(status, 200);
    assert!(body.contains("notifications/progress"), "{body}");
    let v = last_message(&ct, &body);
    assert_eq!(v["id"], "sse", "{body}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("shutting down"),
        "{v}"
    );
    let code = tokio::task::spawn_blocking(move || sc.wait_exit(Duration::from_secs(8)))
        .await
        .unwrap();
    assert_eq!(code, Some(3), "the exit status says work was cut");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// SIGHUP without TLS configured is logged and otherwise ignored: the process keeps serving
/// (it used to die on the signal, with no drain), and SIGTERM still drains it and exits 0.
#[tokio::test]
async fn sighup_without_tls_is_logged_not_fatal() {
    let up = slow_upstream(Duration::ZERO);
    let mut sc = Sidecar::start(
        &up.url(),
        &[("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28")],
    );
    let pid = sc.pid().to_string();
    let mut logged = false;
    for _ in 0..3 {
        let status = std::process::Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap();
        assert!(status.success());
        // The log line, or the process's end, within a generous deadline.
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline && !logged {
            // Reaps the process if it ended (a signal's death has no exit code); then it is gone.
            let _ = sc.wait_exit(Duration::from_millis(50));
            let alive = std::process::Command::new("kill")
                .args(["-0", &pid])
                .status()
                .unwrap()
                .success();
            assert!(alive, "the sidecar died on SIGHUP");
            logged = sc.logs().iter().any(|l| l.contains("SIGHUP"));
        }
        assert!(logged, "SIGHUP was not logged");
        logged = false;
    }
    let body = modern_body(serde_json::json!(1), "tools/list", serde_json::json!({}));
    let resp = post_modern(&sc.url(), "tools/list", None, &body).await;
    assert_eq!(resp.status(), 200);
    sc.terminate();
    let code = tokio::task::spawn_blocking(move || sc.wait_exit(Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(code, Some(0));
}
