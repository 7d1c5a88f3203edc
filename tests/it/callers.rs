//! The caller, decided once from a verified token and never collapsing: two tokens without the
//! user claim are two callers (their own 2025 sessions, held calls and listen feeds); the
//! token's times are read as NumericDates that saturate; introspections in flight are bounded
//! per client address and in all; the issuer's keys past their lifetime serve while they are
//! fetched again, and a cached token is refused once its key leaves the set; a person's
//! subject reaches Epode hashed, and the claims naming a person are refused at start; a
//! feedback handle is its caller's only; and the HTTP surface checks its Host, rate and load
//! before the token. Black box, against the real authorization server (oidc-provider) or a
//! scripted one, scripted upstreams and the strict fake Epode.

use std::time::{Duration, Instant};

use futures_util::stream::StreamExt;
use serde_json::{json, Value};

use crate::auth::{
    bearer, call_tool, feedback_of, feedback_sidecar_for, post_tool, resource, scripted,
    sidecar_for,
};
use crate::support::auth::{AuthOptions, AuthServer, JwksMode, MintKey};
use crate::support::fake_epode::{Endpoint, FakeConfig, FakeEpode, Fault, DEMO_PRODUCT_KEY};
use crate::support::scripted::{Reply, Request, Scripted, ScriptedUpstream};
use crate::support::{
    eventually_async, http, last_message, metric, modern_body, modern_headers, Sidecar,
};

const QUESTION: &str = r#"{"jsonrpc":"2.0","id":"q1","method":"elicitation/create","params":{"mode":"form","message":"How many?","requestedSchema":{"type":"object","properties":{"n":{"type":"integer"}}}}}"#;
const SECRET_REPORT: &str = "file:///two/secret-report";

/// A scripted 2025 upstream with a session per `initialize`; `ask` asks a question and
/// waits; `echo` answers. A session's GET stream sends an update of [`SECRET_REPORT`] when
/// its request names the OAuth client `notify_for` (`Epode-Auth-Client`), else stays quiet.
fn upstream_2025(notify_for: &'static str) -> Scripted {
    let opened = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let update = format!(
        r#"{{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{{"uri":"{SECRET_REPORT}"}}}}"#
    );
    ScriptedUpstream::new()
        .when_fn(
            |r| r.http_method() == "GET",
            move |r| {
                if r.header("epode-auth-client").as_deref() == Some(notify_for) {
                    Reply::sse()
                        .pause(Duration::from_millis(500))
                        .event(&update)
                        .then_hang()
                } else {
                    Reply::sse().then_hang()
                }
            },
        )
        .when(|r| r.http_method() == "DELETE", Reply::empty(200))
        .when(|r| r.json.get("id").is_none(), Reply::empty(202))
        .when_fn(
            |r| r.method() == "initialize",
            move |_| {
                let n = opened.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Reply::result(json!({"protocolVersion": "2025-11-25",
                    "capabilities": {"tools": {}, "resources": {"subscribe": true}},
                    "serverInfo": {"name": "s", "version": "1"}}))
                .header("mcp-session-id", &format!("session-{n}"))
            },
        )
        .when(
            |r| r.tool() == Some("ask"),
            Reply::sse().event(QUESTION).then_hang(),
        )
        .on("resources/subscribe", Reply::result(json!({})))
        .otherwise(Reply::result(
            json!({"content": [{"type": "text", "text": "echoed"}], "tools": []}),
        ))
        .start()
}

/// A 2026 `tools/call` of `tool` declaring every capability a question needs.
fn asking_call(id: u64, tool: &str) -> Value {
    let mut b = modern_body(
        json!(id),
        "tools/call",
        json!({"name": tool, "arguments": {}}),
    );
    b["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] =
        json!({"elicitation": {"form": {}}, "roots": {}});
    b
}

async fn send(
    url: &str,
    method: &str,
    name: Option<&str>,
    body: &Value,
    token: &str,
) -> (u16, Value) {
    let mut req = http().post(url).body(body.to_string());
    for (k, v) in modern_headers(method, name) {
        req = req.header(k, v);
    }
    let resp = req
        .header("authorization", bearer(token))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
    (status, last_message(&ct, &resp.text().await.unwrap()))
}

/// Tokens without the user claim are callers of their own: two OAuth clients' tokens (and
/// two tokens naming no client at all) never share a 2025 session, never continue each
/// other's held call, and never hear each other's listen feed. Before, every such token was
/// one caller: client 2 completed client 1's `requestState`, and client 1's listener heard
/// client 2's update of a secret report.
#[tokio::test]
async fn tokens_without_a_subject_are_callers_of_their_own() {
    let (port, resource) = resource();
    let auth = AuthServer::start(AuthOptions::for_resource(&resource));
    let mint = |client: Option<&str>| {
        let claims = json!({"sub": null, "client_id": client});
        auth.mint(json!({}), claims, MintKey::Current)
    };
    let one = mint(Some("client-one")).await;
    let two = mint(Some("client-two")).await;
    let (three, four) = (mint(None).await, mint(None).await);
    let up = upstream_2025("client-two");
    let sc = sidecar_for(
        &up.url(),
        &auth,
        port,
        &[("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2025-11-25")],
    );
    let url = sc.url();
    // Each token's calls ride its own session.
    for (i, t) in [&one, &two, &three, &four, &one, &two, &three, &four]
        .iter()
        .enumerate()
    {
        let (status, msg) = send(
            &url,
            "tools/call",
            Some("echo"),
            &asking_call(i as u64, "echo"),
            t,
        )
        .await;
        assert_eq!(status, 200, "{msg}");
    }
    // The calls went one at a time: the i-th echo upstream is the i-th token's.
    let echoed: Vec<String> = up
        .requests()
        .iter()
        .filter(|r: &&Request| r.tool() == Some("echo"))
        .map(|r| r.header("mcp-session-id").unwrap_or_default())
        .collect();
    assert_eq!(echoed.len(), 8, "{echoed:?}");
    let sessions: Vec<Vec<String>> = (0..4)
        .map(|t| vec![echoed[t].clone(), echoed[t + 4].clone()])
        .collect();
    for s in &sessions {
        assert_eq!(s.len(), 2, "{sessions:?}");
        assert_eq!(s[0], s[1], "a token keeps its session: {sessions:?}");
    }
    let mut distinct: Vec<&String> = sessions.iter().map(|s| &s[0]).collect();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        4,
        "one session for two callers: {sessions:?}"
    );

    // Client one's held call: client two (and a token naming no client) cannot continue it.
    let first = asking_call(20, "ask");
    let (_, msg) = send(&url, "tools/call", Some("ask"), &first, &one).await;
    let state = msg["result"]["requestState"]
        .as_str()
        .unwrap_or_else(|| panic!("{msg}"))
        .to_owned();
    let mut retry = first.clone();
    retry["id"] = json!(21);
    retry["params"]["inputResponses"] = json!({"qq1": {"action": "accept", "content": {"n": 1}}});
    retry["params"]["requestState"] = json!(state);
    for other in [&two, &three] {
        let (status, msg) = send(&url, "tools/call", Some("ask"), &retry, other).await;
        assert_eq!(status, 400, "{msg}");
        assert!(
            msg["error"]["message"]
                .as_str()
                .unwrap()
                .contains("issued to another caller"),
            "{msg}"
        );
    }

    // Client one listens to the secret report too: only client two hears its update.
    let listen = |token: &str| {
        let body = modern_body(
            json!(30),
            "subscriptions/listen",
            json!({"notifications": {"resourceSubscriptions": [SECRET_REPORT]}}),
        );
        let mut req = http().post(&url).body(body.to_string());
        for (k, v) in modern_headers("subscriptions/listen", None) {
            req = req.header(k, v);
        }
        req.header("authorization", bearer(token)).send()
    };
    let mut heard_one = listen(&one).await.unwrap();
    let mut heard_two = listen(&two).await.unwrap();
    assert_eq!(
        (heard_one.status().as_u16(), heard_two.status().as_u16()),
        (200, 200)
    );
    let mut two_saw = String::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !two_saw.contains("notifications/resources/updated") {
        let left = deadline.saturating_duration_since(Instant::now());
        let chunk = tokio::time::timeout(left, heard_two.chunk())
            .await
            .expect("client two heard no update")
            .unwrap()
            .unwrap();
        two_saw.push_str(&String::from_utf8_lossy(&chunk));
    }
    let mut one_saw = String::new();
    let quiet_until = Instant::now() + Duration::from_secs(2);
    while let Ok(Ok(Some(chunk))) = tokio::time::timeout(
        quiet_until.saturating_duration_since(Instant::now()),
        heard_one.chunk(),
    )
    .await
    {
        one_saw.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(
        !one_saw.contains("notifications/resources/updated"),
        "{one_saw}"
    );
}

/// A token's times are NumericDates that saturate: an `exp` near 2^64 is a token valid for
/// as long as the sidecar keeps any (answered, and the next request too; before, it panicked
/// a worker and the request got no answer), and a `nbf` (or `exp`) that is not a number is a
/// malformed token (before, a string `nbf` was ignored and the token accepted).
#[tokio::test]
async fn a_tokens_times_saturate_and_a_string_time_is_refused() {
    let (port, resource) = resource();
    let auth = AuthServer::start(AuthOptions::for_resource(&resource));
    let up = scripted();
    let sc = sidecar_for(&up.url(), &auth, port, &[]);
    // 2^63 seconds: a JSON number every peer writes exactly, beyond any `Instant`.
    let far = auth.mint_raw(json!({"header": {}, "claims": {"exp": 1_u64 << 63}, "key": "current", "secret": "pem"})).await;
    for id in 1..=2 {
        let (status, _, msg) = echo_with(&sc, id, &far).await;
        assert_eq!(status, 200, "{msg}");
    }
    let later = (crate::support::auth::now_secs() + 3600).to_string();
    for claims in [
        json!({"nbf": later}),
        json!({"nbf": "0"}),
        json!({"exp": later}),
    ] {
        let token = auth.mint(json!({}), claims.clone(), MintKey::Current).await;
        let (status, h, msg) = echo_with(&sc, 3, &token).await;
        assert_eq!(status, 401, "{claims}: {msg}");
        assert!(h["www-authenticate"]
            .to_str()
            .unwrap()
            .contains("invalid_token"));
    }
    // Still serving.
    let (status, _, _) = echo_with(&sc, 4, &far).await;
    assert_eq!(status, 200);
}

/// A 2026 `tools/call` of `echo` with `token` as the bearer: status, headers, message.
async fn echo_with(sc: &Sidecar, id: u64, token: &str) -> (u16, reqwest::header::HeaderMap, Value) {
    post_tool(
        &sc.url(),
        id,
        "echo",
        json!({}),
        &[("authorization", &bearer(token))],
    )
    .await
}

/// A scripted authorization server whose introspection endpoint gives `answer`.
fn introspection_answering(answer: Reply) -> Scripted {
    ScriptedUpstream::new()
        .when_fn(
            |r| r.head.starts_with("GET /.well-known/oauth-authorization-server"),
            |r| {
                let issuer = format!("http://{}", r.header("host").unwrap());
                Reply::json(json!({"issuer": issuer, "introspection_endpoint": format!("{issuer}/introspect"),
                    "token_endpoint": format!("{issuer}/token")}).to_string())
            },
        )
        .when(|r| r.head.starts_with("POST /introspect"), answer)
        .otherwise(Reply::empty(404))
        .start()
}

/// A sidecar with `EPODE_SIDECAR_AUTH=introspect` at `issuer`, in front of `up`, on `port`.
fn introspecting_sidecar(up: &Scripted, issuer: &Scripted, port: u16, resource: &str) -> Sidecar {
    let listen = format!("127.0.0.1:{port}");
    let issuer_url = format!("http://127.0.0.1:{}", issuer.port);
    Sidecar::start(
        &up.url(),
        &[
            ("EPODE_SIDECAR_LISTEN", &listen),
            ("EPODE_SIDECAR_AUTH", "introspect"),
            ("EPODE_SIDECAR_AUTH_ISSUER", &issuer_url),
            ("EPODE_SIDECAR_AUTH_RESOURCE", resource),
            ("EPODE_SIDECAR_AUTH_CLIENT_ID", "sidecar"),
            ("EPODE_SIDECAR_AUTH_CLIENT_SECRET", "secret"),
            ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28"),
        ],
    )
}

/// An introspection answer's `exp` of 2^64 - 1 is a token valid as long as the sidecar keeps
/// any: answered, and again from the cache (before, the sum wrapped and it was expired: 401).
#[tokio::test]
async fn an_introspected_exp_near_two_to_the_64_saturates() {
    let (port, resource) = resource();
    let answer = format!(
        r#"{{"active":true,"exp":18446744073709551615,"sub":"svc","client_id":"c","aud":"{resource}"}}"#
    );
    let issuer = introspection_answering(Reply::json(answer));
    let up = scripted();
    let sc = introspecting_sidecar(&up, &issuer, port, &resource);
    for id in 1..=2 {
        let (status, _, msg) = echo_with(&sc, id, "opaque-far-token").await;
        assert_eq!(status, 200, "{msg}");
    }
}

/// Introspections in flight are bounded: one client sending 150 tokens never seen before at
/// once gets at most its share (4) asked of the issuer, the rest 429 with `Retry-After`,
/// the issuer not asked. Before, every distinct token cost one introspection, all at once.
#[tokio::test]
async fn introspections_in_flight_are_bounded_per_address() {
    let (port, resource) = resource();
    let slow = Reply::json(r#"{"active":false}"#).delayed(Duration::from_secs(2));
    let issuer = introspection_answering(slow);
    let up = scripted();
    let sc = introspecting_sidecar(&up, &issuer, port, &resource);
    let url = sc.url();
    let statuses: Vec<(u16, Option<String>)> = futures_util::stream::iter(0..150u64)
        .map(|i| {
            let url = url.clone();
            async move {
                let token = format!("bogus-token-{i}");
                let (status, h, _) = post_tool(
                    &url,
                    i,
                    "echo",
                    json!({}),
                    &[("authorization", &bearer(&token))],
                )
                .await;
                (
                    status,
                    h.get("retry-after").map(|v| v.to_str().unwrap().to_owned()),
                )
            }
        })
        .buffer_unordered(150)
        .collect()
        .await;
    let asked = issuer
        .requests()
        .iter()
        .filter(|r| r.head.starts_with("POST /introspect"))
        .count();
    let busy = statuses
        .iter()
        .filter(|(s, r)| *s == 429 && r.as_deref() == Some("1"))
        .count();
    let inactive = statuses.iter().filter(|(s, _)| *s == 401).count();
    assert!(
        asked <= 8,
        "{asked} introspections for one client's 150 tokens"
    );
    assert_eq!(busy + inactive, 150, "{statuses:?}");
    assert!(busy >= 140, "{busy} refused of 150");
    assert!(
        metric(
            &sc,
            r#"epode_sidecar_auth_refused_total{reason="introspections_busy"}"#
        )
        .await
            >= 140
    );
}

/// The issuer's keys past their lifetime keep serving while they are fetched again in the
/// background: a new token is answered at once though the key endpoint hangs (before, every
/// new token waited the whole fetch timeout). A cached token is verified again once the keys
/// are fetched again: one whose key left the set is refused then, not at its own `exp`.
#[tokio::test]
async fn stale_keys_serve_while_fetched_again_and_a_retired_keys_token_is_refused() {
    let (port, resource) = resource();
    let auth = AuthServer::start(AuthOptions::for_resource(&resource));
    let up = scripted();
    let sc = sidecar_for(
        &up.url(),
        &auth,
        port,
        &[
            ("EPODE_SIDECAR_AUTH_KEYS_MAX_AGE", "2s"),
            ("EPODE_SIDECAR_AUTH_KEYS_REFRESH", "1s"),
        ],
    );
    let old = auth.mint(json!({}), json!({}), MintKey::Current).await;
    let (status, _, _) = echo_with(&sc, 1, &old).await;
    assert_eq!(status, 200);
    // The keys expire; the key endpoint hangs: a new token is still answered at once.
    auth.set_jwks_mode(JwksMode::Hang).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let fresh = auth
        .mint(json!({}), json!({"jti": "fresh"}), MintKey::Current)
        .await;
    let started = Instant::now();
    let (status, _, msg) = echo_with(&sc, 2, &fresh).await;
    let took = started.elapsed();
    assert_eq!(status, 200, "{msg}");
    assert!(
        took < Duration::from_secs(2),
        "a new token waited {took:?} for a hanging key endpoint"
    );
    // The old key leaves the set (two rotations): the cached token is refused once the
    // keys are fetched again.
    auth.set_jwks_mode(JwksMode::Normal).await;
    auth.rotate().await;
    auth.rotate().await;
    let refused = eventually_async(Duration::from_secs(20), || async {
        echo_with(&sc, 3, &old).await.0 == 401
    })
    .await;
    assert!(refused, "a token whose key left the set is still accepted");
    let current = auth
        .mint(json!({}), json!({"jti": "current"}), MintKey::Current)
        .await;
    let (status, _, _) = echo_with(&sc, 4, &current).await;
    assert_eq!(status, 200);
}

/// A claim that names a person cannot become a ref (`username`, `cognito:username`, `login`,
/// `mail` … are refused at start), and a person's subject reaches Epode hashed however
/// ref-shaped it is (`john.smith`; before, it went as it was).
#[tokio::test]
async fn a_persons_claims_never_reach_epode() {
    for claim in [
        "username",
        "cognito:username",
        "login",
        "mail",
        "https://example.com/email",
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_epode-sidecar"))
            .env_clear()
            .env("EPODE_SIDECAR_UPSTREAM", "http://127.0.0.1:8000/mcp")
            .env("AGENT_FEEDBACK_MODE", "off")
            .env("EPODE_SIDECAR_AUTH", "jwt")
            .env("EPODE_SIDECAR_AUTH_ISSUER", "https://as.example.com")
            .env("EPODE_SIDECAR_AUTH_RESOURCE", "https://mcp.example.com/mcp")
            .env("EPODE_SIDECAR_AUTH_USER_CLAIM", claim)
            .arg("--check-config")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{claim} accepted");
        assert!(
            err.contains("EPODE_SIDECAR_AUTH_USER_CLAIM") && err.contains("names a person"),
            "{claim}: {err}"
        );
    }
    let (port, resource) = resource();
    let auth = AuthServer::start(AuthOptions::for_resource(&resource));
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let up = crate::support::Upstream::start(crate::support::UpstreamKind::Python);
    let sc = feedback_sidecar_for(&up.url(), &auth, port, &epode, "never_ask");
    let token = auth
        .mint(json!({}), json!({"sub": "john.smith"}), MintKey::Current)
        .await;
    let msg = call_tool(&sc, 1, &token, "add", json!({"a": 1, "b": 2})).await;
    assert!(msg.get("error").is_none(), "{msg}");
    assert!(
        eventually_async(Duration::from_secs(15), || async {
            !epode.events().is_empty()
        })
        .await
    );
    let e = &epode.events()[0];
    let user = e["userRef"].as_str().unwrap();
    assert!(user.starts_with("h:") && !user.contains("john"), "{e}");
    assert!(!format!("{:?}", epode.events()).contains("john.smith"));
}

/// With auth on, a feedback handle is its caller's: Bob cannot report with Alice's (refused
/// by the sidecar, Epode never asked; before, Epode took it), Alice can.
#[tokio::test]
async fn a_feedback_handle_is_its_callers_only() {
    let (port, resource) = resource();
    let auth = AuthServer::start(AuthOptions::for_resource(&resource));
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let up = crate::support::Upstream::start(crate::support::UpstreamKind::Python);
    let sc = feedback_sidecar_for(&up.url(), &auth, port, &epode, "never_ask");
    let alice = auth
        .mint(json!({}), json!({"sub": "alice"}), MintKey::Current)
        .await;
    let bob = auth
        .mint(json!({}), json!({"sub": "bob"}), MintKey::Current)
        .await;
    let msg = call_tool(&sc, 1, &alice, "add", json!({"a": 1, "b": 2})).await;
    let handle = feedback_of(&msg)["feedbackHandle"]
        .as_str()
        .unwrap_or_else(|| panic!("{msg}"))
        .to_owned();
    let report = json!({"feedbackHandle": handle, "summary": "The sum came back right.", "impact": "helped"});
    let stolen = call_tool(&sc, 2, &bob, "report_product_feedback", report.clone()).await;
    assert_eq!(stolen["result"]["isError"], true, "{stolen}");
    assert!(
        epode.requests(Endpoint::Reports).is_empty(),
        "Bob's report reached Epode"
    );
    let own = call_tool(&sc, 3, &alice, "report_product_feedback", report).await;
    assert_eq!(
        own["result"]["structuredContent"]["accepted"], true,
        "{own}"
    );
    assert_eq!(epode.requests(Endpoint::Reports).len(), 1);
}

/// Alice and Bob, verified by a real authorization server, in front of a sidecar with customer
/// context on for `echo` (a Python upstream, the strict fake Epode).
struct TwoCallers {
    _auth: AuthServer,
    _up: crate::support::Upstream,
    epode: FakeEpode,
    sc: Sidecar,
    alice: String,
    bob: String,
}

async fn two_callers_with_customer_context(extra: &[(&str, &str)]) -> TwoCallers {
    let (port, resource) = resource();
    let auth = AuthServer::start(AuthOptions::for_resource(&resource));
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let up = crate::support::Upstream::start(crate::support::UpstreamKind::Python);
    let url = epode.url();
    let mut env = vec![
        ("EPODE_API_KEY", epode.product_key()),
        ("EPODE_API_URL", url.as_str()),
        ("EPODE_SIDECAR_CUSTOMER_CONTEXT", "on"),
        ("EPODE_SIDECAR_CUSTOMER_CONTEXT_TOOLS", "echo"),
    ];
    env.extend_from_slice(extra);
    let sc = sidecar_for(&up.url(), &auth, port, &env);
    let mut minted = Vec::new();
    for sub in ["alice", "bob"] {
        minted.push(
            auth.mint(json!({}), json!({"sub": sub}), MintKey::Current)
                .await,
        );
    }
    let bob = minted.pop().unwrap();
    let alice = minted.pop().unwrap();
    TwoCallers {
        _auth: auth,
        _up: up,
        epode,
        sc,
        alice,
        bob,
    }
}

/// A customer-context handle placed in Alice's result is Alice's: Bob's share with it is
/// refused here, and nothing of it reaches Epode; Alice's goes.
#[tokio::test]
async fn a_customer_context_handle_is_its_callers_only() {
    let rig = two_callers_with_customer_context(&[]).await;
    let (epode, sc, alice, bob) = (&rig.epode, &rig.sc, &rig.alice, &rig.bob);
    let msg = call_tool(sc, 1, alice, "echo", json!({"text": "x"})).await;
    let handle = msg["result"]["structuredContent"]["_epode"]["customerContext"]["requestHandle"]
        .as_str()
        .unwrap_or_else(|| panic!("{msg}"))
        .to_owned();
    let share = json!({"requestHandle": handle, "status": "no_relevant_context", "items": []});
    let stolen = call_tool(sc, 2, bob, "share_customer_context", share.clone()).await;
    assert_eq!(stolen["result"]["isError"], true, "{stolen}");
    assert!(
        epode.requests(Endpoint::EnrichmentInspect).is_empty(),
        "Bob's share reached Epode"
    );
    let consent = json!({"requestHandle": handle, "decision": "declined"});
    let stolen = call_tool(sc, 3, bob, "record_customer_context_consent", consent).await;
    assert_eq!(stolen["result"]["isError"], true, "{stolen}");
    assert!(epode.requests(Endpoint::EnrichmentConsent).is_empty());
    let own = call_tool(sc, 4, alice, "share_customer_context", share).await;
    assert_eq!(
        own["result"]["structuredContent"]["accepted"], true,
        "{own}"
    );
}

/// A caller's followed calls hold at most its share of enrichment requests in flight: Alice's
/// second call while her first waits on a slow Epode is shed (its result as the upstream sent
/// it, at once, no request made, counted), and Bob's call meanwhile gets its contract.
#[tokio::test]
async fn enrichment_requests_in_flight_are_charged_to_their_caller() {
    let rig = two_callers_with_customer_context(&[
        ("EPODE_SIDECAR_CUSTOMER_CONTEXT_BUDGET", "5s"),
        ("EPODE_SIDECAR_CUSTOMER_CONTEXT_REQUESTS_PER_CALLER", "1"),
    ])
    .await;
    let (epode, sc, alice, bob) = (&rig.epode, &rig.sc, &rig.alice, &rig.bob);
    let contract = |msg: &Value| {
        msg["result"]["structuredContent"]["_epode"]
            .get("customerContext")
            .cloned()
    };
    // Alice's first call's request is held at Epode until the test lets it go.
    epode.inject(Endpoint::Enrichment, Fault::Delay(Duration::from_secs(3)));
    let first = {
        let (url, auth) = (sc.url(), bearer(alice));
        tokio::spawn(async move {
            let headers = [("authorization", auth.as_str())];
            post_tool(&url, 1, "echo", json!({"text": "first"}), &headers)
                .await
                .2
        })
    };
    assert!(
        eventually_async(Duration::from_secs(20), || async {
            epode.enrichment_requests().len() == 1
        })
        .await,
        "Alice's first request never reached Epode"
    );
    let t = Instant::now();
    let shed = call_tool(sc, 2, alice, "echo", json!({"text": "second"})).await;
    let took = t.elapsed();
    assert!(contract(&shed).is_none(), "past Alice's share: {shed}");
    let text = shed["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(text.contains(r#""echoed": "second""#), "{shed}");
    assert!(
        took < Duration::from_millis(2500),
        "a shed call waited {took:?}"
    );
    let other = call_tool(sc, 3, bob, "echo", json!({"text": "bob"})).await;
    assert!(contract(&other).is_some(), "Bob has his own share: {other}");
    assert_eq!(
        epode.enrichment_requests().len(),
        2,
        "the shed call sent none"
    );
    let first = first.await.unwrap();
    assert!(contract(&first).is_some(), "{first}");
    assert_eq!(
        metric(
            sc,
            "epode_sidecar_customer_context_requests_total{outcome=\"shed\"}"
        )
        .await,
        1
    );
    assert_eq!(
        metric(
            sc,
            "epode_sidecar_pool_refused_total{pool=\"context_requests\",reason=\"share\"}"
        )
        .await,
        1
    );
    // Every place given back.
    assert!(
        eventually_async(Duration::from_secs(10), || async {
            metric(sc, "epode_sidecar_pool_in_use{pool=\"context_requests\"}").await == 0
        })
        .await
    );
}

/// The HTTP surface runs the one front's order: its Host, then the client's rate, then its
/// token. A request with a foreign Host gets 403 and one past its rate 429 with no token
/// looked at (before, the token was checked first: 401 for both).
#[tokio::test]
async fn the_http_surface_checks_its_host_and_rate_before_the_token() {
    let (port, resource) = resource();
    let auth = AuthServer::start(AuthOptions::for_resource(&resource));
    let up = ScriptedUpstream::new()
        .when(
            |r| r.http_method() == "GET",
            Reply::body("text/plain").text("page"),
        )
        .otherwise(Reply::result(json!({"tools": []})))
        .start();
    let sc = sidecar_for(
        &up.url(),
        &auth,
        port,
        &[
            ("EPODE_SIDECAR_HTTP_SURFACE", "on"),
            ("EPODE_SIDECAR_AUTH_HTTP_SURFACE", "true"),
            ("EPODE_SIDECAR_RATE_LIMIT", "1/m"),
        ],
    );
    let page = format!("{}/page", sc.base());
    let foreign = http()
        .get(&page)
        .header("host", "evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(foreign.status(), 403);
    let token = auth.client_credentials("mcp:tools", Some(&resource)).await;
    let first = http()
        .get(&page)
        .header("authorization", bearer(&token))
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    let second = http().get(&page).send().await.unwrap();
    assert_eq!(second.status(), 429, "the rate before the token");
    assert!(second.headers().contains_key("retry-after"));
}
