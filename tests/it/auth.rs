//! The MCP authorization front door (`EPODE_SIDECAR_AUTH`), black-box, against a real
//! authorization server (oidc-provider, `support::auth`) and real or scripted upstreams: the
//! metadata, the challenges, the attacks (each refused with its status and reason, none
//! reaching the upstream), the keys' fetches, rotation and bad JWKS endpoints, introspection,
//! and what the upstream and Epode are told of the caller.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::auth::{AuthOptions, AuthServer, JwksMode, MintKey, TokenFormat};
use crate::support::scripted::{Reply, Scripted, ScriptedUpstream};
use crate::support::*;

/// A sidecar on a port known before it starts (the resource URI names it), with auth on
/// for the AS, and `extra` settings.
pub(crate) fn sidecar_for(
    up: &str,
    auth: &AuthServer,
    port: u16,
    extra: &[(&str, &str)],
) -> Sidecar {
    let listen = format!("127.0.0.1:{port}");
    let mode = match auth.options().format {
        TokenFormat::Jwt => "jwt",
        TokenFormat::Opaque => "introspect",
    };
    let (id, secret) = auth.options().introspector.clone();
    let mut env: Vec<(&str, &str)> = vec![
        ("EPODE_SIDECAR_LISTEN", &listen),
        ("EPODE_SIDECAR_AUTH", mode),
        ("EPODE_SIDECAR_AUTH_ISSUER", auth.issuer()),
        ("EPODE_SIDECAR_AUTH_RESOURCE", auth.resource()),
        ("EPODE_SIDECAR_AUTH_SCOPES", "mcp:tools"),
        ("EPODE_SIDECAR_AUTH_CLIENT_ID", &id),
        ("EPODE_SIDECAR_AUTH_CLIENT_SECRET", &secret),
        ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28"),
    ];
    env.extend_from_slice(extra);
    Sidecar::start(up, &env)
}

/// The authorization server, a scripted upstream and the sidecar with auth on in front of it.
struct Rig {
    auth: AuthServer,
    up: Scripted,
    sc: Sidecar,
    resource: String,
}

impl Rig {
    /// JWT access tokens, and `extra` settings.
    fn jwt(extra: &[(&str, &str)]) -> Rig {
        Rig::with(|r| AuthServer::start(AuthOptions::for_resource(r)), extra)
    }

    /// Opaque tokens, introspected.
    fn opaque(extra: &[(&str, &str)]) -> Rig {
        Rig::with(opaque_server, extra)
    }

    fn with(server: impl FnOnce(&str) -> AuthServer, extra: &[(&str, &str)]) -> Rig {
        let (port, resource) = resource();
        let auth = server(&resource);
        let up = scripted();
        let sc = sidecar_for(&up.url(), &auth, port, extra);
        Rig {
            auth,
            up,
            sc,
            resource,
        }
    }
}

/// A free port and the resource URI of a sidecar listening on it. The port is chosen below
/// the kernel's ephemeral range, so the authorization server (started first, on port 0) or
/// another test's connection cannot take it before the sidecar binds it.
pub(crate) fn resource() -> (u16, String) {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let start = 20_000 + (std::process::id() % 5_000) as u16;
    loop {
        let port = start + NEXT.fetch_add(1, Ordering::Relaxed) % 7_000;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return (port, format!("http://127.0.0.1:{port}/mcp"));
        }
    }
}

/// A scripted upstream for the authorization tests: `echo` listed and every call answered.
pub(crate) fn scripted() -> Scripted {
    ScriptedUpstream::new()
        .on(
            "tools/list",
            Reply::result(json!({"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]})),
        )
        .on(
            "tools/call",
            Reply::result(json!({"content": [{"type": "text", "text": "echoed"}]})),
        )
        .start()
}

/// A 2026 `tools/call` of `echo` with `headers` (`Authorization` and whatever the test adds).
async fn call(
    sc: &Sidecar,
    id: u64,
    headers: &[(&str, &str)],
) -> (u16, reqwest::header::HeaderMap, Value) {
    call_at(&sc.url(), id, headers).await
}

async fn call_at(
    url: &str,
    id: u64,
    headers: &[(&str, &str)],
) -> (u16, reqwest::header::HeaderMap, Value) {
    post_tool(url, id, "echo", json!({}), headers).await
}

/// A 2026 `tools/call` of `tool` with `args` and `headers` at `url`: the status, the headers
/// and the JSON-RPC message (`Null` for an empty body).
pub(crate) async fn post_tool(
    url: &str,
    id: u64,
    tool: &str,
    args: Value,
    headers: &[(&str, &str)],
) -> (u16, reqwest::header::HeaderMap, Value) {
    let body = modern_body(
        json!(id),
        "tools/call",
        json!({"name": tool, "arguments": args}),
    );
    let mut req = http().post(url).body(body.to_string());
    for (k, v) in modern_headers("tools/call", Some(tool)) {
        req = req.header(k, v);
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let h = resp.headers().clone();
    let ct = h
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let text = resp.text().await.unwrap();
    let msg = if text.is_empty() {
        Value::Null
    } else {
        last_message(&ct, &text)
    };
    (status, h, msg)
}

pub(crate) fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

fn challenge(h: &reqwest::header::HeaderMap) -> String {
    h.get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

fn tool_calls(up: &Scripted) -> usize {
    up.requests()
        .iter()
        .filter(|r| r.method() == "tools/call")
        .count()
}

async fn refused(sc: &Sidecar, reason: &str) -> u64 {
    metric(
        sc,
        &format!("epode_sidecar_auth_refused_total{{reason=\"{reason}\"}}"),
    )
    .await
}

#[tokio::test]
async fn the_metadata_and_the_challenge_lead_a_client_to_the_authorization_server() {
    let Rig {
        auth,
        up,
        sc,
        resource,
    } = Rig::jwt(&[]);
    for path in [
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
    ] {
        let resp = http()
            .get(format!("{}{path}", sc.base()))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        assert!(resp.headers()["cache-control"]
            .to_str()
            .unwrap()
            .contains("max-age"));
        let doc: Value = resp.json().await.unwrap();
        assert_eq!(doc["resource"], resource.as_str());
        assert_eq!(doc["authorization_servers"], json!([auth.issuer()]));
        assert_eq!(doc["scopes_supported"], json!(["mcp:tools"]));
        assert_eq!(doc["bearer_methods_supported"], json!(["header"]));
    }
    // No token: 401, the challenge names the metadata and the scope, the error the id.
    let (status, h, msg) = call(&sc, 7, &[]).await;
    assert_eq!(status, 401, "{msg}");
    assert_eq!(
        challenge(&h),
        format!(
            "Bearer resource_metadata=\"{}/.well-known/oauth-protected-resource/mcp\", scope=\"mcp:tools\"",
            sc.base()
        )
    );
    assert_eq!(msg["id"], 7);
    assert!(
        msg["error"]["message"]
            .as_str()
            .unwrap()
            .contains("access token"),
        "{msg}"
    );
    // The metadata's document leads to the AS, which issues a token for the resource.
    let token = auth.client_credentials("mcp:tools", Some(&resource)).await;
    let (status, h, msg) = call(&sc, 8, &[("authorization", &bearer(&token))]).await;
    assert_eq!(status, 200, "{msg} {h:?}");
    assert_eq!(msg["result"]["content"][0]["text"], "echoed");
    // The upstream got the call with the claims and without the token.
    let reqs = up.requests();
    let seen = reqs
        .iter()
        .find(|r| r.method() == "tools/call")
        .expect("the call reached the upstream");
    assert_eq!(
        seen.header("authorization"),
        None,
        "the token went upstream"
    );
    assert_eq!(
        seen.header("epode-auth-subject").as_deref(),
        Some("svc-client")
    );
    assert_eq!(
        seen.header("epode-auth-scopes").as_deref(),
        Some("mcp:tools")
    );
    assert_eq!(
        seen.header("epode-auth-client").as_deref(),
        Some("svc-client")
    );
    assert_eq!(tool_calls(&up), 1);
}

#[tokio::test]
async fn the_upstream_sees_the_verified_claims_and_never_the_token_or_a_forged_claim() {
    let (port, resource) = resource();
    let auth = AuthServer::start(AuthOptions::for_resource(&resource));
    let py = Upstream::start_with(UpstreamKind::Python, &["--whoami"]);
    let sc = sidecar_for(&py.url(), &auth, port, &[]);
    let token = auth
        .client_credentials("mcp:tools mcp:read", Some(&resource))
        .await;
    let auth_header = bearer(&token);
    let forged = [
        ("authorization", auth_header.as_str()),
        ("epode-auth-subject", "admin"),
        ("epode-auth-scopes", "mcp:admin"),
    ];
    let (status, _, msg) = post_tool(&sc.url(), 1, "whoami", json!({}), &forged).await;
    assert_eq!(status, 200, "{msg}");
    let text = msg["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    let said: Value = serde_json::from_str(text).unwrap_or_else(|_| panic!("{msg}"));
    assert_eq!(said["authorization"], false, "{msg}");
    assert_eq!(said["subject"], "svc-client", "{msg}");
    assert_eq!(said["scopes"], "mcp:tools mcp:read", "{msg}");
}

#[tokio::test]
async fn every_forged_foreign_or_broken_token_is_refused_and_never_reaches_the_upstream() {
    let Rig {
        auth,
        up,
        sc,
        resource,
    } = Rig::jwt(&[]);
    let now = now();
    let cur = MintKey::Current;
    let keys = auth.keys().await;
    let current_kid = keys["current"][0]["kid"].as_str().unwrap().to_owned();
    let cases: Vec<(&str, Value, Value, MintKey, &str)> = vec![
        (
            "expired",
            json!({}),
            json!({"exp": now - 600, "iat": now - 900}),
            cur,
            "expired",
        ),
        (
            "not yet valid",
            json!({}),
            json!({"nbf": now + 600}),
            cur,
            "not_yet_valid",
        ),
        (
            "issued in the future",
            json!({}),
            json!({"iat": now + 600}),
            cur,
            "not_yet_valid",
        ),
        (
            "wrong issuer",
            json!({}),
            json!({"iss": "http://127.0.0.1:1"}),
            cur,
            "wrong_issuer",
        ),
        (
            "no audience",
            json!({}),
            json!({"aud": null}),
            cur,
            "wrong_audience",
        ),
        (
            "another resource",
            json!({}),
            json!({"aud": "http://127.0.0.1:9/mcp"}),
            cur,
            "wrong_audience",
        ),
        (
            "another resource among others",
            json!({}),
            json!({"aud": ["http://a/mcp", "http://b/mcp"]}),
            cur,
            "wrong_audience",
        ),
        ("alg none", json!({}), json!({}), MintKey::None, "algorithm"),
        (
            "HS256 with the public key (PEM)",
            json!({}),
            json!({}),
            MintKey::Hs256PublicPem,
            "algorithm",
        ),
        (
            "HS256 with the public key (JWK)",
            json!({}),
            json!({}),
            MintKey::Hs256PublicJwk,
            "algorithm",
        ),
        (
            "signed with another key under the issuer's kid",
            json!({"kid": current_kid}),
            json!({}),
            MintKey::Foreign,
            "bad_signature",
        ),
        (
            "an unknown kid",
            json!({"kid": "no-such-key"}),
            json!({}),
            MintKey::Foreign,
            "unknown_key",
        ),
    ];
    let mut id = 100;
    for (what, header, claims, key, reason) in cases {
        let token = auth.mint(header, claims, key).await;
        let before = refused(&sc, reason).await;
        id += 1;
        let (status, h, msg) = call(&sc, id, &[("authorization", &bearer(&token))]).await;
        assert_eq!(status, 401, "{what}: {msg}");
        let c = challenge(&h);
        assert!(
            c.starts_with("Bearer error=\"invalid_token\", error_description=\""),
            "{what}: {c}"
        );
        assert!(c.contains("resource_metadata=\""), "{what}: {c}");
        assert_eq!(msg["id"], id, "{what}");
        assert_eq!(
            refused(&sc, reason).await,
            before + 1,
            "{what}: counted as {reason}"
        );
        assert!(
            !format!("{msg}").contains(&token),
            "{what}: the token is echoed"
        );
    }
    // Malformed requests: 400 invalid_request.
    let token = auth.client_credentials("mcp:tools", Some(&resource)).await;
    let body = modern_body(
        json!(1),
        "tools/call",
        json!({"name": "echo", "arguments": {}}),
    );
    let mut two = http().post(sc.url()).body(body.to_string());
    for (k, v) in modern_headers("tools/call", Some("echo")) {
        two = two.header(k, v);
    }
    let resp = two
        .header("authorization", bearer(&token))
        .header("authorization", bearer(&token))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400, "two Authorization headers");
    assert!(challenge(resp.headers()).starts_with("Bearer error=\"invalid_request\""));
    let in_query = format!("{}?access_token={token}", sc.url());
    let (status, _, _) = call_at(&in_query, 2, &[]).await;
    assert_eq!(status, 400, "a token in the query");
    let (status, _, _) = call_at(&in_query, 3, &[("authorization", &bearer(&token))]).await;
    assert_eq!(status, 400, "a token in the query beside a valid header");
    let (status, _, _) = call(&sc, 4, &[("authorization", "Basic c3ZjOnNlY3JldA==")]).await;
    assert_eq!(status, 400, "another scheme");
    let big = format!("Bearer {}", "a".repeat(1 << 20));
    let resp = {
        let mut r = http().post(sc.url()).body(body.to_string());
        for (k, v) in modern_headers("tools/call", Some("echo")) {
            r = r.header(k, v);
        }
        r.header("authorization", big).send().await
    };
    // A 1 MB header is refused before it is read whole (431), or the connection closed.
    if let Ok(resp) = resp {
        assert!(
            matches!(resp.status().as_u16(), 400 | 431),
            "{}",
            resp.status()
        );
    }
    assert_eq!(tool_calls(&up), 0, "a refused call reached the upstream");
    // The valid one passes, and a token for too few scopes is a 403 naming them.
    let (status, _, msg) = call(&sc, 5, &[("authorization", &bearer(&token))]).await;
    assert_eq!(status, 200, "{msg}");
    let narrow = auth.client_credentials("mcp:read", Some(&resource)).await;
    let (status, h, msg) = call(&sc, 6, &[("authorization", &bearer(&narrow))]).await;
    assert_eq!(status, 403, "{msg}");
    let c = challenge(&h);
    assert!(
        c.starts_with("Bearer error=\"insufficient_scope\", scope=\"mcp:tools\""),
        "{c}"
    );
    assert_eq!(msg["id"], 6);
    assert_eq!(tool_calls(&up), 1);
    drop(sc);
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

#[tokio::test]
async fn a_flood_of_unknown_keys_costs_one_fetch_per_interval() {
    let Rig {
        auth,
        up,
        sc,
        resource,
    } = Rig::jwt(&[("EPODE_SIDECAR_AUTH_KEYS_REFRESH", "60s")]);
    // The keys are fetched once at start.
    let token = auth.client_credentials("mcp:tools", Some(&resource)).await;
    let (status, _, _) = call(&sc, 1, &[("authorization", &bearer(&token))]).await;
    assert_eq!(status, 200);
    let before = auth.jwks_hits().await;
    let mut tokens = Vec::new();
    for i in 0..40 {
        tokens.push(
            auth.mint(
                json!({"kid": format!("flood-{i}")}),
                json!({}),
                MintKey::Foreign,
            )
            .await,
        );
    }
    let calls = tokens.iter().enumerate().map(|(i, t)| {
        let sc = &sc;
        async move {
            let h = bearer(t);
            call(sc, 1000 + i as u64, &[("authorization", &h)]).await.0
        }
    });
    let statuses = futures_util::future::join_all(calls).await;
    assert!(statuses.iter().all(|s| *s == 401), "{statuses:?}");
    let fetched = auth.jwks_hits().await - before;
    assert!(
        fetched <= 1,
        "{fetched} fetches of the keys for 40 unknown kids"
    );
    assert_eq!(refused(&sc, "unknown_key").await, 40);
    assert_eq!(tool_calls(&up), 1);
}

#[tokio::test]
async fn keys_rotated_at_the_authorization_server_fail_no_call() {
    let (port, resource) = resource();
    let mut options = AuthOptions::for_resource(&resource);
    options.algs = vec!["RS256".into()];
    let auth = AuthServer::start(options);
    let up = scripted();
    // The default refresh interval (30 s): the rotation comes within it, while calls flow.
    let sc = sidecar_for(&up.url(), &auth, port, &[]);
    let calls = std::sync::atomic::AtomicU64::new(0);
    let flowing = async {
        let mut failed = Vec::new();
        // Calls with fresh tokens, one after another, until well after the rotation.
        for id in 0..60u64 {
            let token = auth.client_credentials("mcp:tools", Some(&resource)).await;
            let (status, _, msg) = call(&sc, id, &[("authorization", &bearer(&token))]).await;
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if status != 200 {
                failed.push(format!("{id}: {status} {msg}"));
            }
        }
        failed
    };
    let rotating = async {
        // Rotate once the calls are flowing (the sidecar fetched the keys at start, and more
        // than a second has passed: no fetch is ever closer to the last than that).
        let flowing = eventually_async(Duration::from_secs(20), || async {
            calls.load(std::sync::atomic::Ordering::SeqCst) >= 10
        })
        .await;
        assert!(flowing);
        tokio::time::sleep(Duration::from_millis(1000)).await;
        auth.rotate().await
    };
    let (failed, kids) = tokio::join!(flowing, rotating);
    assert_eq!(kids.len(), 1);
    assert!(
        failed.is_empty(),
        "calls failed across the rotation: {failed:?}"
    );
    // Tokens of the key before the rotation still pass (the set lists both).
    let old = auth.mint(json!({}), json!({}), MintKey::Previous).await;
    let (status, _, msg) = call(&sc, 100, &[("authorization", &bearer(&old))]).await;
    assert_eq!(status, 200, "the previous key after the rotation: {msg}");
    assert_eq!(refused(&sc, "unknown_key").await, 0);
}

#[tokio::test]
async fn a_jwks_endpoint_that_hangs_is_huge_or_holds_too_many_keys_fails_closed() {
    for mode in [JwksMode::Hang, JwksMode::Huge, JwksMode::Many] {
        let (port, resource) = resource();
        let auth = AuthServer::start(AuthOptions::for_resource(&resource));
        auth.set_jwks_mode(mode).await;
        let up = scripted();
        let sc = sidecar_for(
            &up.url(),
            &auth,
            port,
            &[("EPODE_SIDECAR_AUTH_FETCH_TIMEOUT", "1s")],
        );
        let token = auth.client_credentials("mcp:tools", Some(&resource)).await;
        let started = std::time::Instant::now();
        let (status, h, msg) = call(&sc, 1, &[("authorization", &bearer(&token))]).await;
        assert_eq!(status, 503, "{mode:?}: {msg}");
        assert!(h.contains_key("retry-after"), "{mode:?}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{mode:?}: {:?}",
            started.elapsed()
        );
        let ready = http()
            .get(format!("{}/readyz", sc.base()))
            .send()
            .await
            .unwrap();
        assert_eq!(ready.status(), 503, "{mode:?}");
        let rss = rss_kib(sc.pid());
        assert!(rss < 200 * 1024, "{mode:?}: {rss} KiB");
        assert_eq!(tool_calls(&up), 0, "{mode:?}");
        // Back to normal: the sidecar reads the keys and the same token passes.
        auth.set_jwks_mode(JwksMode::Normal).await;
        let ok = eventually_async(Duration::from_secs(20), || async {
            call(&sc, 2, &[("authorization", &bearer(&token))]).await.0 == 200
        })
        .await;
        assert!(
            ok,
            "{mode:?}: the keys were never read once the endpoint recovered"
        );
    }
}

#[tokio::test]
async fn opaque_tokens_are_introspected_and_a_revoked_one_is_refused_once_its_answer_expires() {
    let Rig {
        auth,
        up,
        sc,
        resource,
    } = Rig::opaque(&[("EPODE_SIDECAR_AUTH_INTROSPECTION_CACHE", "1s")]);
    let token = auth.client_credentials("mcp:tools", Some(&resource)).await;
    assert_eq!(token.split('.').count(), 1, "an opaque token: {token}");
    let (status, _, msg) = call(&sc, 1, &[("authorization", &bearer(&token))]).await;
    assert_eq!(status, 200, "{msg}");
    let seen = up
        .requests()
        .into_iter()
        .find(|r| r.method() == "tools/call")
        .unwrap();
    assert_eq!(
        seen.header("epode-auth-subject").as_deref(),
        Some("svc-client")
    );
    assert!(auth.revoke(&token).await);
    let refused_soon = eventually_async(Duration::from_secs(10), || async {
        call(&sc, 2, &[("authorization", &bearer(&token))]).await.0 == 401
    })
    .await;
    assert!(refused_soon, "a revoked token still passes");
    assert!(refused(&sc, "inactive").await >= 1);
    // A token for another resource is active but not ours.
    let (status, _, _) = call(
        &sc,
        3,
        &[("authorization", "Bearer not-a-token-anyone-issued")],
    )
    .await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn an_introspection_endpoint_that_refuses_the_sidecar_is_a_503_never_a_pass() {
    let Rig {
        auth,
        up,
        sc,
        resource,
    } = Rig::opaque(&[("EPODE_SIDECAR_AUTH_CLIENT_SECRET", "wrong")]);
    let token = auth.client_credentials("mcp:tools", Some(&resource)).await;
    let (status, h, msg) = call(&sc, 1, &[("authorization", &bearer(&token))]).await;
    assert_eq!(status, 503, "{msg}");
    assert!(h.contains_key("retry-after"));
    assert_eq!(tool_calls(&up), 0);
    assert_eq!(refused(&sc, "introspection_unavailable").await, 1);
    assert!(
        sc.logs()
            .iter()
            .all(|l| !l.contains(&token) && !l.contains("wrong\"")),
        "a token or secret in the log"
    );
}

/// An authorization server issuing opaque tokens (to be introspected) for `resource`.
fn opaque_server(resource: &str) -> AuthServer {
    let mut options = AuthOptions::for_resource(resource);
    options.format = TokenFormat::Opaque;
    AuthServer::start(options)
}

/// A sidecar with auth on and feedback in `mode` at the strict fake Epode, the account ref
/// from the token's `org`.
pub(crate) fn feedback_sidecar_for(
    up: &str,
    auth: &AuthServer,
    port: u16,
    epode: &crate::support::fake_epode::FakeEpode,
    mode: &str,
) -> Sidecar {
    let url = epode.url();
    sidecar_for(
        up,
        auth,
        port,
        &[
            ("EPODE_API_KEY", epode.product_key()),
            ("EPODE_API_URL", &url),
            ("AGENT_FEEDBACK_MODE", mode),
            ("EPODE_SIDECAR_AUTH_ACCOUNT_CLAIM", "org"),
        ],
    )
}

/// A 2026 `tools/call` of `tool` with `args` and the token: the JSON-RPC message.
pub(crate) async fn call_tool(
    sc: &Sidecar,
    id: u64,
    token: &str,
    tool: &str,
    args: Value,
) -> Value {
    let auth = bearer(token);
    let (status, _, msg) = post_tool(&sc.url(), id, tool, args, &[("authorization", &auth)]).await;
    assert_eq!(status, 200, "{tool}: {msg}");
    msg
}

/// `_agentFeedback` wherever the placement rules put it (`structuredContent`, or a JSON text
/// block).
pub(crate) fn feedback_of(msg: &Value) -> Value {
    let result = &msg["result"];
    if let Some(f) = result["structuredContent"].get("_agentFeedback") {
        return f.clone();
    }
    result["content"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|b| {
            let v: Value = serde_json::from_str(b["text"].as_str()?).ok()?;
            v.get("_agentFeedback").cloned()
        })
        .unwrap_or(Value::Null)
}

/// The product writes no identity code: the refs Epode gets, and the customer `ask_once`
/// asks once, come from the verified token (`sub`, and `org` as the account).
#[tokio::test]
async fn telemetry_refs_and_ask_once_come_from_the_token_with_no_product_code() {
    use crate::support::fake_epode::{FakeConfig, FakeEpode, DEMO_PRODUCT_KEY};
    let (port, resource) = resource();
    let auth = AuthServer::start(AuthOptions::for_resource(&resource));
    let py = Upstream::start(UpstreamKind::Python);
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "ask_once"));
    let sc = feedback_sidecar_for(&py.url(), &auth, port, &epode, "ask_once");
    let acme = auth.client_credentials("mcp:tools", Some(&resource)).await;
    let globex = auth
        .mint(
            json!({}),
            json!({"sub": "user-b@globex.example", "org": "globex", "client_id": "other"}),
            MintKey::Current,
        )
        .await;
    // acme's first use: asked once, for acme.
    let first = call_tool(&sc, 1, &acme, "add", json!({"a": 1, "b": 2})).await;
    let fb = feedback_of(&first);
    assert_eq!(fb["state"], "consent_required", "{first}");
    let handle = fb["feedbackHandle"].as_str().unwrap().to_owned();
    let claims = epode.verify(&handle).unwrap();
    assert_eq!(
        claims.s.as_deref(),
        epode.subject_for("acme").as_deref(),
        "the consent subject is the token's account"
    );
    let consent = call_tool(
        &sc,
        2,
        &acme,
        "record_product_feedback_consent",
        json!({"feedbackHandle": handle, "decision": "approved"}),
    )
    .await;
    assert!(consent.get("error").is_none(), "{consent}");
    // acme again: not asked; globex: asked, for globex.
    let again = call_tool(&sc, 3, &acme, "add", json!({"a": 2, "b": 2})).await;
    assert_eq!(feedback_of(&again)["state"], "feedback_ready", "{again}");
    let other = call_tool(&sc, 4, &globex, "add", json!({"a": 3, "b": 2})).await;
    let fb = feedback_of(&other);
    assert_eq!(fb["state"], "consent_required", "{other}");
    let claims = epode
        .verify(fb["feedbackHandle"].as_str().unwrap())
        .unwrap();
    assert_eq!(claims.s.as_deref(), epode.subject_for("globex").as_deref());
    // Every product call's event carries the token's refs; an e-mail-like sub is hashed.
    let delivered = eventually_async(Duration::from_secs(15), || async {
        epode.events().len() >= 3
    })
    .await;
    assert!(delivered, "{:?}", epode.events());
    let events = epode.events();
    let of = |account: &str| {
        events
            .iter()
            .filter(|e| e["accountRef"] == account)
            .cloned()
            .collect::<Vec<_>>()
    };
    let acme_events = of("acme");
    assert_eq!(acme_events.len(), 2, "{events:?}");
    for e in &acme_events {
        assert_eq!(e["userRef"], "svc-client", "{e}");
        assert_eq!(e["customerRef"], "acme", "{e}");
    }
    let globex_events = of("globex");
    assert_eq!(globex_events.len(), 1, "{events:?}");
    let user = globex_events[0]["userRef"].as_str().unwrap();
    assert!(
        user.starts_with("h:") && !user.contains("globex.example"),
        "{user}"
    );
    assert!(
        !format!("{events:?}").contains("user-b@"),
        "a raw e-mail reached Epode"
    );
}

/// With auth on, a 2025 upstream's sessions are the principal's: another token's calls never
/// ride a session opened for the first.
#[tokio::test]
async fn a_2025_session_is_never_used_by_another_principal() {
    let (port, resource) = resource();
    let auth = AuthServer::start(AuthOptions::for_resource(&resource));
    // A session per initialize, numbered; every session's calls are recorded with it.
    let opened = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let up = ScriptedUpstream::new()
        .when(|r| r.http_method() == "DELETE", Reply::json("{}"))
        .when(|r| r.json.get("id").is_none(), Reply::empty(202))
        .when_fn(
            |r| r.method() == "initialize",
            move |_| {
                let n = opened.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let init = json!({"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": {"name": "s", "version": "1"}});
                Reply::result(init).header("mcp-session-id", &format!("session-{n}"))
            },
        )
        .on("tools/list", Reply::result(json!({"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]})))
        .on("tools/call", Reply::result(json!({"content": [{"type": "text", "text": "echoed"}]})))
        .start();
    let listen = format!("127.0.0.1:{port}");
    let sc = Sidecar::start(
        &up.url(),
        &[
            ("EPODE_SIDECAR_LISTEN", &listen),
            ("EPODE_SIDECAR_AUTH", "jwt"),
            ("EPODE_SIDECAR_AUTH_ISSUER", auth.issuer()),
            ("EPODE_SIDECAR_AUTH_RESOURCE", auth.resource()),
            ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2025-11-25"),
        ],
    );
    let alice = auth
        .mint(json!({}), json!({"sub": "alice"}), MintKey::Current)
        .await;
    let bob = auth
        .mint(json!({}), json!({"sub": "bob"}), MintKey::Current)
        .await;
    for (i, token) in [&alice, &bob, &alice, &bob].iter().enumerate() {
        let (status, _, msg) = call(&sc, i as u64 + 1, &[("authorization", &bearer(token))]).await;
        assert_eq!(status, 200, "{msg}");
    }
    let calls: Vec<_> = up
        .requests()
        .into_iter()
        .filter(|r| r.method() == "tools/call")
        .collect();
    assert_eq!(calls.len(), 4);
    let session_of = |who: &str| -> Vec<String> {
        calls
            .iter()
            .filter(|r| r.header("epode-auth-subject").as_deref() == Some(who))
            .map(|r| r.header("mcp-session-id").unwrap_or_default())
            .collect()
    };
    let (a, b) = (session_of("alice"), session_of("bob"));
    assert_eq!(a.len(), 2);
    assert_eq!(b.len(), 2);
    assert!(
        !a[0].is_empty() && a[0] == a[1],
        "alice keeps her session: {a:?}"
    );
    assert!(!b[0].is_empty() && b[0] == b[1], "bob keeps his: {b:?}");
    assert_ne!(a[0], b[0], "one session for two principals");
    // Bob replays Alice's session id: his call still rides his own session.
    let replay = a[0].clone();
    let (status, _, msg) = call(
        &sc,
        9,
        &[
            ("authorization", &bearer(&bob)),
            ("mcp-session-id", &replay),
        ],
    )
    .await;
    assert!(
        status == 200 || status == 400 || status == 404,
        "{status} {msg}"
    );
    let last = up
        .requests()
        .into_iter()
        .rfind(|r| r.method() == "tools/call")
        .unwrap();
    if status == 200 {
        assert_eq!(last.header("epode-auth-subject").as_deref(), Some("bob"));
        assert_eq!(
            last.header("mcp-session-id").as_deref(),
            Some(b[0].as_str()),
            "bob rode alice's session"
        );
    }
    assert!(
        up.requests()
            .iter()
            .filter(|r| r.header("mcp-session-id").as_deref() == Some(a[0].as_str()))
            .all(|r| r.header("epode-auth-subject").as_deref() == Some("alice")),
        "a request of another principal rode alice's session"
    );
}

/// A stdio upstream gets the same front: the child never sees an unauthorised request.
#[tokio::test]
async fn a_stdio_upstream_is_behind_the_same_front() {
    let (port, resource) = resource();
    let auth = AuthServer::start(AuthOptions::for_resource(&resource));
    let listen = format!("127.0.0.1:{port}");
    let script = repo_root().join("tests/peers/py_server.py");
    let python = python();
    let sc = Sidecar::start_stdio(
        &[
            python.to_str().unwrap(),
            script.to_str().unwrap(),
            "--stdio",
        ],
        &[
            ("EPODE_SIDECAR_LISTEN", &listen),
            ("EPODE_SIDECAR_AUTH", "jwt"),
            ("EPODE_SIDECAR_AUTH_ISSUER", auth.issuer()),
            ("EPODE_SIDECAR_AUTH_RESOURCE", auth.resource()),
        ],
    );
    let (status, h, _) = call(&sc, 1, &[]).await;
    assert_eq!(status, 401);
    assert!(challenge(&h).contains("resource_metadata="));
    let token = auth.client_credentials("mcp:tools", Some(&resource)).await;
    let (status, _, msg) = call(&sc, 2, &[("authorization", &bearer(&token))]).await;
    assert_eq!(status, 200, "{msg}");
    // The child answered it (its arguments are wrong on purpose: any answer of the child's).
    assert_eq!(
        msg["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "py-peer",
        "{msg}"
    );
}

/// The HTTP surface's routes: the sidecar's `Epode-Auth-*` headers never pass from a client
/// to the app, and with `EPODE_SIDECAR_AUTH_HTTP_SURFACE` the routes are checked as MCP is.
#[tokio::test]
async fn the_http_surface_never_passes_a_forged_claim_and_is_checked_when_asked() {
    for checked in [false, true] {
        let (port, resource) = resource();
        let auth = AuthServer::start(AuthOptions::for_resource(&resource));
        let app = ScriptedUpstream::new()
            .on("tools/list", Reply::result(json!({"tools": []})))
            .otherwise(Reply::echo())
            .start();
        let origin = app.url().trim_end_matches("/mcp").to_owned();
        let on = if checked { "true" } else { "false" };
        let sc = sidecar_for(
            &origin,
            &auth,
            port,
            &[
                ("EPODE_SIDECAR_HTTP_SURFACE", "on"),
                ("EPODE_SIDECAR_AUTH_HTTP_SURFACE", on),
            ],
        );
        let page = format!("{}/orders/latest", sc.base());
        let forged = http()
            .get(&page)
            .header("epode-auth-subject", "admin")
            .send()
            .await
            .unwrap();
        let seen = |app: &Scripted| {
            app.requests()
                .into_iter()
                .filter(|r| r.head.contains("/orders/latest"))
                .collect::<Vec<_>>()
        };
        if checked {
            assert_eq!(forged.status(), 401, "no token on a checked route");
            assert!(challenge(forged.headers()).contains("resource_metadata="));
            assert!(seen(&app).is_empty(), "a refused request reached the app");
            let token = auth.client_credentials("mcp:tools", Some(&resource)).await;
            let ok = http()
                .get(&page)
                .header("authorization", bearer(&token))
                .send()
                .await
                .unwrap();
            assert_eq!(ok.status(), 200);
            let r = seen(&app).pop().expect("the app got the checked request");
            assert_eq!(
                r.header("epode-auth-subject").as_deref(),
                Some("svc-client")
            );
            assert_eq!(r.header("authorization"), None, "the token went to the app");
        } else {
            assert_eq!(forged.status(), 200);
            let r = seen(&app).pop().expect("the app got the request");
            assert_eq!(
                r.header("epode-auth-subject"),
                None,
                "a forged claim reached the app"
            );
        }
    }
}

/// What the product says of the caller (`_meta["ai.epode/identity"]`) wins over the token's
/// refs, field by field, and a field both name differently is counted.
#[tokio::test]
async fn the_products_identity_wins_over_the_tokens_and_a_disagreement_is_counted() {
    use crate::support::fake_epode::{FakeConfig, FakeEpode, DEMO_PRODUCT_KEY};
    let (port, resource) = resource();
    let auth = AuthServer::start(AuthOptions::for_resource(&resource));
    let py = Upstream::start_with(UpstreamKind::Python, &["--identity"]);
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let sc = feedback_sidecar_for(&py.url(), &auth, port, &epode, "never_ask");
    let token = auth.client_credentials("mcp:tools", Some(&resource)).await;
    // The token says account acme, user svc-client; the product says cust_9 and user_1.
    let msg = call_tool(&sc, 1, &token, "account", json!({"customer": "cust_9"})).await;
    assert!(msg.get("error").is_none(), "{msg}");
    assert!(
        !msg.to_string().contains("ai.epode/identity"),
        "the product's identity leaked"
    );
    let got = eventually_async(Duration::from_secs(15), || async {
        !epode.events().is_empty()
    })
    .await;
    assert!(got);
    let e = &epode.events()[0];
    assert_eq!(e["accountRef"], "cust_9", "{e}");
    assert_eq!(e["userRef"], "user_1", "{e}");
    assert_eq!(
        metric(&sc, "epode_sidecar_auth_identity_disagreements_total").await,
        1
    );
}

/// A `tools/call` with `token` and a sampled `traceparent` (trace `n`): its status and
/// message, the client's span id, and the spans of its trace once `count` have arrived.
async fn traced_call(
    sc: &Sidecar,
    receiver: &crate::otel::Receiver,
    (n, token): (u8, &str),
    count: usize,
) -> (u16, Value, String, Vec<Value>) {
    let (trace, parent) = crate::otel::trace_ids(n);
    let tp = format!("00-{trace}-{parent}-01");
    let headers = [("authorization", bearer(token)), ("traceparent", tp)];
    let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (status, _, msg) = call(sc, u64::from(n), &headers).await;
    let spans = receiver.trace(&trace, count).await;
    (status, msg, parent, spans)
}

/// The trace's server span (the request's, or its refusal's) and the introspection's client
/// span, which is its child.
fn server_and_introspection(spans: &[Value]) -> (&Value, &Value) {
    use crate::otel::one;
    let server = one(spans, "the server span", |s| {
        s["kind"] == "SPAN_KIND_SERVER"
    });
    let asked = one(spans, "the introspection", |s| {
        s["kind"] == "SPAN_KIND_CLIENT"
    });
    assert_eq!(asked["parentSpanId"], server["spanId"], "{asked:#}");
    (server, asked)
}

/// With OpenTelemetry on, a token's introspection is a client span of the request it was
/// made for: under the request's MCP span when the token passed (and when it lacks a scope:
/// the 403 is the request's own span), under the HTTP span of the refusal when it did not (a
/// refused request is spanned too). No span carries the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_introspection_is_a_span_under_its_request_and_a_refusal_is_spanned_too() {
    let receiver = crate::otel::Receiver::start();
    let url = receiver.url();
    let Rig {
        auth, sc, resource, ..
    } = Rig::opaque(&[("EPODE_SIDECAR_OTLP_ENDPOINT", &url)]);
    let token = auth.client_credentials("mcp:tools", Some(&resource)).await;
    let (status, msg, _, spans) = traced_call(&sc, &receiver, (40, &token), 3).await;
    assert_eq!(status, 200, "{msg}");
    // The request's span, the hop's, and the introspection's under the request's.
    let server = crate::otel::one(&spans, "the request's span", |s| {
        s["kind"] == "SPAN_KIND_SERVER"
    });
    let asked = crate::otel::one(&spans, "the introspection", |s| {
        s["attributes"]["epode.auth.outcome"].is_string()
    });
    assert_eq!(asked["kind"], "SPAN_KIND_CLIENT", "{asked:#}");
    assert_eq!(asked["parentSpanId"], server["spanId"], "{asked:#}");
    assert_eq!(server["name"], "tools/call echo", "{server:#}");
    let endpoint = auth.metadata()["introspection_endpoint"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = endpoint.trim_start_matches(auth.issuer());
    assert_eq!(asked["name"], format!("POST {path}"), "{asked:#}");
    let a = &asked["attributes"];
    assert_eq!(a["url.full"], endpoint.as_str(), "{asked:#}");
    assert_eq!(a["http.request.method"], "POST", "{asked:#}");
    assert_eq!(a["http.response.status_code"], 200, "{asked:#}");
    assert_eq!(a["epode.auth.outcome"], "active", "{asked:#}");
    assert_eq!(a["server.port"], i64::from(auth.port()), "{asked:#}");
    // Within its request, in time.
    let (start, end) = (
        asked["startNs"].as_u64().unwrap(),
        asked["endNs"].as_u64().unwrap(),
    );
    assert!(
        start >= server["startNs"].as_u64().unwrap()
            && end <= server["endNs"].as_u64().unwrap()
            && start < end,
        "{asked:#} in {server:#}"
    );

    // A token nobody issued: 401, an HTTP server span with its introspection under it.
    let forged = "forged-token-3e9a1c";
    let (status, _, parent, spans) = traced_call(&sc, &receiver, (41, forged), 2).await;
    assert_eq!(status, 401);
    let (refused, asked) = server_and_introspection(&spans);
    assert_eq!(refused["name"], "POST /mcp", "{refused:#}");
    assert_eq!(refused["parentSpanId"], parent.as_str(), "{refused:#}");
    assert_eq!(
        refused["attributes"]["http.response.status_code"], 401,
        "{refused:#}"
    );
    assert_eq!(refused["attributes"]["url.path"], "/mcp", "{refused:#}");
    assert_eq!(
        asked["attributes"]["epode.auth.outcome"], "inactive",
        "{asked:#}"
    );
    // A token for too few scopes: the message was read, so the 403 is the request's own
    // span, failed, with the introspection under it.
    let narrow = auth.client_credentials("mcp:read", Some(&resource)).await;
    let (status, msg, parent, spans) = traced_call(&sc, &receiver, (42, &narrow), 2).await;
    assert_eq!(status, 403, "{msg}");
    let (server, _) = server_and_introspection(&spans);
    assert_eq!(server["name"], "tools/call echo", "{server:#}");
    assert_eq!(server["parentSpanId"], parent.as_str(), "{server:#}");
    let code = msg["error"]["code"].to_string();
    assert_eq!(
        server["attributes"]["error.type"],
        code.as_str(),
        "{server:#}"
    );
    assert_eq!(server["status"]["code"], "STATUS_CODE_ERROR", "{server:#}");
    // The tokens are in no span.
    for s in receiver.spans().await {
        let raw = s["raw"].as_str().unwrap_or_default();
        for secret in [token.as_str(), forged, narrow.as_str()] {
            let hex: String = secret.bytes().map(|b| format!("{b:02x}")).collect();
            assert!(!raw.contains(&hex), "a token in an exported span");
        }
    }
}

/// The HTTP surface's token check (`EPODE_SIDECAR_AUTH_HTTP_SURFACE`) runs inside the route's
/// span: the introspection is below it, and a refused route is spanned with its 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_surfaces_introspection_is_below_its_route_span() {
    use crate::otel::{trace_ids, Receiver};
    let receiver = Receiver::start();
    let url = receiver.url();
    let (port, resource) = resource();
    let auth = opaque_server(&resource);
    let app = ScriptedUpstream::new()
        .on("tools/list", Reply::result(json!({"tools": []})))
        .otherwise(Reply::echo())
        .start();
    let origin = app.url().trim_end_matches("/mcp").to_owned();
    let sc = sidecar_for(
        &origin,
        &auth,
        port,
        &[
            ("EPODE_SIDECAR_HTTP_SURFACE", "on"),
            ("EPODE_SIDECAR_AUTH_HTTP_SURFACE", "true"),
            ("EPODE_SIDECAR_OTLP_ENDPOINT", &url),
        ],
    );
    let page = format!("{}/orders/latest", sc.base());
    let token = auth.client_credentials("mcp:tools", Some(&resource)).await;
    for (n, token, status, outcome) in [
        (43, token.as_str(), 200, "active"),
        (44, "forged-token-77e1", 401, "inactive"),
    ] {
        let (trace, parent) = trace_ids(n);
        let resp = http()
            .get(&page)
            .header("authorization", bearer(token))
            .header("traceparent", format!("00-{trace}-{parent}-01"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), status);
        let spans = receiver.trace(&trace, 2).await;
        let (route, asked) = server_and_introspection(&spans);
        assert_eq!(route["name"], "GET", "{route:#}");
        assert_eq!(route["parentSpanId"], parent.as_str(), "{route:#}");
        assert_eq!(
            route["attributes"]["http.response.status_code"], status,
            "{route:#}"
        );
        assert_eq!(
            asked["attributes"]["epode.auth.outcome"], outcome,
            "{asked:#}"
        );
    }
}
