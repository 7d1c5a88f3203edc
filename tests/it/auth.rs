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
fn sidecar_for(up: &str, auth: &AuthServer, port: u16, extra: &[(&str, &str)]) -> Sidecar {
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

/// A free port and the resource URI of a sidecar listening on it.
fn resource() -> (u16, String) {
    let port = free_port();
    (port, format!("http://127.0.0.1:{port}/mcp"))
}

fn scripted() -> Scripted {
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
    let body = modern_body(
        json!(id),
        "tools/call",
        json!({"name": "echo", "arguments": {}}),
    );
    let mut req = http().post(url).body(body.to_string());
    for (k, v) in modern_headers("tools/call", Some("echo")) {
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

fn bearer(token: &str) -> String {
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
    let text = http()
        .get(format!("{}/metrics", sc.base()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = format!("epode_sidecar_auth_refused_total{{reason=\"{reason}\"}}");
    text.lines()
        .find_map(|l| l.strip_prefix(&line))
        .map_or(0, |v| v.trim().parse().unwrap())
}

#[tokio::test]
async fn the_metadata_and_the_challenge_lead_a_client_to_the_authorization_server() {
    let (port, resource) = resource();
    let auth = AuthServer::start(AuthOptions::for_resource(&resource));
    let up = scripted();
    let sc = sidecar_for(&up.url(), &auth, port, &[]);
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
        format!("Bearer resource_metadata=\"http://127.0.0.1:{port}/.well-known/oauth-protected-resource/mcp\", scope=\"mcp:tools\"")
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
    let body = modern_body(
        json!(1),
        "tools/call",
        json!({"name": "whoami", "arguments": {}}),
    );
    let mut req = http().post(sc.url()).body(body.to_string());
    for (k, v) in modern_headers("tools/call", Some("whoami")) {
        req = req.header(k, v);
    }
    let resp = req
        .header("authorization", bearer(&token))
        .header("epode-auth-subject", "admin")
        .header("epode-auth-scopes", "mcp:admin")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
    let msg = last_message(&ct, &resp.text().await.unwrap());
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
    let (port, resource) = resource();
    let auth = AuthServer::start(AuthOptions::for_resource(&resource));
    let up = scripted();
    let sc = sidecar_for(&up.url(), &auth, port, &[]);
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
    let (port, resource) = resource();
    let auth = AuthServer::start(AuthOptions::for_resource(&resource));
    let up = scripted();
    let sc = sidecar_for(
        &up.url(),
        &auth,
        port,
        &[("EPODE_SIDECAR_AUTH_KEYS_REFRESH", "60s")],
    );
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
    let sc = sidecar_for(
        &up.url(),
        &auth,
        port,
        &[("EPODE_SIDECAR_AUTH_KEYS_REFRESH", "1s")],
    );
    let mut id = 0;
    for round in 0..3 {
        // An authorization server publishes a new key before it signs with it; this one signs
        // at once, so each rotation comes once the refresh interval since the last fetch is
        // over (a new kid within it waits for the next interval, by design: see
        // a_flood_of_unknown_keys_costs_one_fetch_per_interval).
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let kids = auth.rotate().await;
        assert_eq!(kids.len(), 1);
        for _ in 0..5 {
            id += 1;
            let token = auth.client_credentials("mcp:tools", Some(&resource)).await;
            let (status, _, msg) = call(&sc, id, &[("authorization", &bearer(&token))]).await;
            assert_eq!(status, 200, "after rotation {round}: {msg}");
        }
        // Tokens of the key before the rotation still pass (the set lists both).
        id += 1;
        let old = auth.mint(json!({}), json!({}), MintKey::Previous).await;
        let (status, _, msg) = call(&sc, id, &[("authorization", &bearer(&old))]).await;
        assert_eq!(
            status, 200,
            "the previous key after rotation {round}: {msg}"
        );
    }
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
    let (port, resource) = resource();
    let mut options = AuthOptions::for_resource(&resource);
    options.format = TokenFormat::Opaque;
    let auth = AuthServer::start(options);
    let up = scripted();
    let sc = sidecar_for(
        &up.url(),
        &auth,
        port,
        &[("EPODE_SIDECAR_AUTH_INTROSPECTION_CACHE", "1s")],
    );
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
    let (port, resource) = resource();
    let mut options = AuthOptions::for_resource(&resource);
    options.format = TokenFormat::Opaque;
    let auth = AuthServer::start(options);
    let up = scripted();
    let sc = sidecar_for(
        &up.url(),
        &auth,
        port,
        &[("EPODE_SIDECAR_AUTH_CLIENT_SECRET", "wrong")],
    );
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
