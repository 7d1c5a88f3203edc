//! Self-tests of the authorization server peer (`tests/peers/auth_server.mjs`, oidc-provider)
//! and its driver (`tests/it/support/auth.rs`), no sidecar involved: what the authorization
//! tests rely on it to do.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::auth::{
    decode_jwt, now_secs, AuthOptions, AuthServer, JwksMode, MintKey, TokenFormat,
};
use crate::support::http;

const RESOURCE: &str = "http://127.0.0.1:9000/mcp";

fn kids(jwks: &Value) -> Vec<String> {
    jwks["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["kid"].as_str().unwrap().to_owned())
        .collect()
}

async fn jwks(auth: &AuthServer) -> Value {
    http()
        .get(auth.jwks_uri())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test]
async fn discovery_names_the_endpoints() {
    let auth = AuthServer::start(AuthOptions::for_resource(RESOURCE));
    eprintln!("auth server started in {} ms", auth.startup.as_millis());
    let m = auth.metadata();
    assert_eq!(m["issuer"], auth.issuer());
    assert!(!auth.issuer().ends_with('/'), "{}", auth.issuer());
    assert_eq!(auth.issuer(), format!("http://127.0.0.1:{}", auth.port()));
    for name in [
        "jwks_uri",
        "introspection_endpoint",
        "registration_endpoint",
        "token_endpoint",
        "authorization_endpoint",
        "revocation_endpoint",
    ] {
        let url = m[name].as_str().unwrap_or_else(|| panic!("no {name}: {m}"));
        assert!(url.starts_with(auth.issuer()), "{name}: {url}");
    }
    assert_eq!(m["code_challenge_methods_supported"], json!(["S256"]));
    let grants = m["grant_types_supported"].as_array().unwrap();
    for g in ["authorization_code", "refresh_token", "client_credentials"] {
        assert!(grants.contains(&json!(g)), "{grants:?}");
    }
    // The OpenID discovery document says the same.
    let oidc: Value = http()
        .get(format!(
            "{}/.well-known/openid-configuration",
            auth.issuer()
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(oidc["jwks_uri"], m["jwks_uri"]);
    let keys = jwks(&auth).await;
    let algs: Vec<&str> = keys["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["alg"].as_str().unwrap())
        .collect();
    assert_eq!(algs, ["RS256", "ES256", "EdDSA"]);
}

#[tokio::test]
async fn a_client_credentials_token_for_the_resource_is_a_jwt_access_token() {
    let auth = AuthServer::start(AuthOptions::for_resource(RESOURCE));
    let before = now_secs();
    let token = auth
        .client_credentials("mcp:tools mcp:read", Some(RESOURCE))
        .await;
    let (header, claims) = decode_jwt(&token);
    eprintln!("JWT access token header {header}\nclaims {claims}");
    assert_eq!(header["typ"], "at+jwt");
    assert_eq!(header["alg"], "RS256");
    let current = auth.keys().await;
    assert_eq!(header["kid"], current["current"][0]["kid"], "{current}");
    assert_eq!(claims["iss"], auth.issuer());
    assert_eq!(claims["aud"], RESOURCE);
    assert_eq!(claims["scope"], "mcp:tools mcp:read");
    assert_eq!(claims["sub"], "svc-client");
    assert_eq!(claims["client_id"], "svc-client");
    assert_eq!(claims["org"], "acme");
    assert!(claims["jti"].is_string(), "{claims}");
    let iat = claims["iat"].as_u64().unwrap();
    let exp = claims["exp"].as_u64().unwrap();
    assert!(iat + 1 >= before && iat <= now_secs() + 1, "iat {iat}");
    assert_eq!(exp - iat, 300);

    // oidc-provider never stores a JWT access token: its introspection refuses one.
    let (status, body) = auth.introspect(&token).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"], "unsupported_token_type");
}

#[tokio::test]
async fn the_token_endpoint_refuses_what_it_must() {
    let auth = AuthServer::start(AuthOptions::for_resource(RESOURCE));
    let c = &auth.options().clients[0];
    let basic = Some((c.client_id.as_str(), c.client_secret.as_str()));
    // A scope the client may not have.
    let reply = auth
        .token_request(
            basic,
            &[
                ("grant_type", "client_credentials"),
                ("scope", "mcp:admin"),
                ("resource", RESOURCE),
            ],
        )
        .await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert_eq!(reply.body["error"], "invalid_scope");
    // A resource it does not know.
    let reply = auth
        .token_request(
            basic,
            &[
                ("grant_type", "client_credentials"),
                ("scope", "mcp:tools"),
                ("resource", "http://127.0.0.1:9001/mcp"),
            ],
        )
        .await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert_eq!(reply.body["error"], "invalid_target");
    // A wrong secret.
    let reply = auth
        .token_request(
            Some((c.client_id.as_str(), "wrong")),
            &[("grant_type", "client_credentials"), ("scope", "mcp:tools")],
        )
        .await;
    assert_eq!(reply.status, 401, "{}", reply.body);
    assert_eq!(reply.body["error"], "invalid_client");
}

#[tokio::test]
async fn without_resource_the_token_is_opaque_and_has_no_audience() {
    let auth = AuthServer::start(AuthOptions::for_resource(RESOURCE));
    let token = auth.client_credentials("mcp:tools", None).await;
    assert!(!token.contains('.'), "not opaque: {token}");
    let (status, body) = auth.introspect(&token).await;
    assert_eq!(status, 200);
    assert_eq!(body["active"], true, "{body}");
    assert_eq!(body["scope"], "mcp:tools");
    assert!(body.get("aud").is_none(), "{body}");
}

#[tokio::test]
async fn opaque_tokens_introspect_until_revoked() {
    let mut options = AuthOptions::for_resource(RESOURCE);
    options.format = TokenFormat::Opaque;
    let auth = AuthServer::start(options);
    let token = auth.client_credentials("mcp:tools", Some(RESOURCE)).await;
    assert!(!token.contains('.'), "not opaque: {token}");
    let (status, body) = auth.introspect(&token).await;
    eprintln!("introspection of an opaque token: {body}");
    assert_eq!(status, 200);
    assert_eq!(body["active"], true, "{body}");
    assert_eq!(body["aud"], RESOURCE);
    assert_eq!(body["scope"], "mcp:tools");
    assert_eq!(body["client_id"], "svc-client");
    assert_eq!(body["sub"], "svc-client");
    assert_eq!(body["org"], "acme");
    assert_eq!(body["iss"], auth.issuer());
    assert!(body["exp"].as_u64().unwrap() > now_secs(), "{body}");

    // Introspection is for confidential clients: a wrong secret is refused.
    let res = http()
        .post(auth.introspection_endpoint())
        .basic_auth("sidecar-introspector", Some("wrong"))
        .form(&[("token", token.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 401);

    assert!(auth.revoke(&token).await);
    let (_, body) = auth.introspect(&token).await;
    assert_eq!(body, json!({ "active": false }));
    assert!(!auth.revoke(&token).await, "revoked twice");
}

#[tokio::test]
async fn mint_signs_what_it_is_told() {
    let auth = AuthServer::start(AuthOptions::for_resource(RESOURCE));
    let keys = auth.keys().await;
    let rsa_kid = keys["current"][0]["kid"].clone();

    let unsigned = auth
        .mint(json!({}), json!({ "aud": null }), MintKey::None)
        .await;
    assert!(unsigned.ends_with('.'), "{unsigned}");
    let (header, claims) = decode_jwt(&unsigned);
    assert_eq!(header, json!({ "alg": "none", "typ": "at+jwt" }));
    assert!(claims.get("aud").is_none(), "{claims}");
    assert_eq!(claims["iss"], auth.issuer());

    let expired = auth
        .mint(
            json!({}),
            json!({ "exp": now_secs() - 60, "iss": "http://evil.example" }),
            MintKey::Current,
        )
        .await;
    let (header, claims) = decode_jwt(&expired);
    assert_eq!(header["alg"], "RS256");
    assert_eq!(header["kid"], rsa_kid);
    assert_eq!(claims["iss"], "http://evil.example");
    assert_eq!(claims["aud"], RESOURCE);
    assert!(claims["exp"].as_u64().unwrap() < now_secs());

    let es = auth
        .mint(json!({ "alg": "ES256" }), json!({}), MintKey::Current)
        .await;
    let (header, _) = decode_jwt(&es);
    assert_eq!(header["kid"], keys["current"][1]["kid"]);

    let foreign = auth.mint(json!({}), json!({}), MintKey::Foreign).await;
    let (header, _) = decode_jwt(&foreign);
    assert!(!kids(&jwks(&auth).await).contains(&header["kid"].as_str().unwrap().to_owned()));

    for key in [MintKey::Hs256PublicPem, MintKey::Hs256PublicJwk] {
        let confused = auth.mint(json!({}), json!({}), key).await;
        let (header, _) = decode_jwt(&confused);
        assert_eq!(header["alg"], "HS256");
        assert_eq!(header["kid"], rsa_kid);
    }

    let bare = auth
        .mint_raw(json!({ "claims": { "sub": "x" }, "bare": true }))
        .await;
    assert_eq!(decode_jwt(&bare).1, json!({ "sub": "x" }));
}

#[tokio::test]
async fn rotation_changes_the_kid_and_the_jwks_lists_both_keys() {
    let mut options = AuthOptions::for_resource(RESOURCE);
    options.algs = vec!["RS256".to_owned()];
    let auth = AuthServer::start(options);
    let old = decode_jwt(&auth.client_credentials("mcp:tools", Some(RESOURCE)).await).0["kid"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(kids(&jwks(&auth).await), std::slice::from_ref(&old));

    let new = auth.rotate().await;
    assert_eq!(new.len(), 1);
    assert_ne!(new[0], old);
    assert_eq!(kids(&jwks(&auth).await), [new[0].clone(), old.clone()]);
    let (header, _) = decode_jwt(&auth.client_credentials("mcp:tools", Some(RESOURCE)).await);
    assert_eq!(header["kid"], new[0].as_str());
    // The retired key still signs minted tokens, under its own kid.
    let (header, _) = decode_jwt(&auth.mint(json!({}), json!({}), MintKey::Previous).await);
    assert_eq!(header["kid"], old.as_str());
}

#[tokio::test]
async fn stored_state_survives_a_rotation() {
    let auth = AuthServer::start(AuthOptions::for_resource(RESOURCE));
    // An opaque token (no resource) issued before the provider is swapped still introspects.
    let token = auth.client_credentials("mcp:tools", None).await;
    auth.rotate().await;
    let (_, body) = auth.introspect(&token).await;
    assert_eq!(body["active"], true, "{body}");
}

#[tokio::test]
async fn the_jwks_endpoint_counts_and_misbehaves_on_demand() {
    let auth = AuthServer::start(AuthOptions::for_resource(RESOURCE));
    assert_eq!(auth.jwks_hits().await, 0);
    jwks(&auth).await;
    jwks(&auth).await;
    assert_eq!(auth.jwks_hits().await, 2);

    auth.set_jwks_mode(JwksMode::Many).await;
    let many = jwks(&auth).await;
    let listed = kids(&many);
    assert_eq!(listed.len(), 10_000);
    let real = kids(&json!({ "keys": auth.keys().await["current"] }));
    assert_eq!(listed[listed.len() - real.len()..], real[..]);

    auth.set_jwks_mode(JwksMode::Huge).await;
    let mut res = http().get(auth.jwks_uri()).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let mut size = 0usize;
    while let Some(chunk) = res.chunk().await.unwrap() {
        size += chunk.len();
    }
    assert!(size > 50 * 1024 * 1024, "{size}");

    auth.set_jwks_mode(JwksMode::Hang).await;
    let hung = http()
        .get(auth.jwks_uri())
        .timeout(Duration::from_millis(500))
        .send()
        .await;
    assert!(hung.unwrap_err().is_timeout());

    auth.set_jwks_mode(JwksMode::Normal).await;
    assert_eq!(kids(&jwks(&auth).await), real);
    assert_eq!(auth.jwks_hits().await, 6);
}

#[tokio::test]
async fn the_code_flow_gives_a_jwt_for_the_resource() {
    let auth = AuthServer::start(AuthOptions::for_resource(RESOURCE));
    let report = auth.authorization_code("bob", "mcp:tools mcp:admin", &[]);
    eprintln!("code flow: {report}");
    assert!(report.get("error").is_none(), "{report}");
    let redirect = report["redirect"].as_str().unwrap();
    assert!(
        redirect.starts_with("http://127.0.0.1:1/callback?code="),
        "{redirect}"
    );
    assert_eq!(report["header"]["typ"], "at+jwt");
    let claims = &report["claims"];
    assert_eq!(claims["aud"], RESOURCE);
    assert_eq!(claims["scope"], "mcp:tools mcp:admin");
    assert_eq!(claims["sub"], "bob");
    assert_eq!(claims["org"], "globex");
    assert_eq!(claims["iss"], auth.issuer());
    assert_eq!(claims["client_id"], report["client_id"]);
    // The refresh token gives another token for the same resource.
    let refreshed = report["refreshed"]["access_token"].as_str().unwrap();
    let (_, again) = decode_jwt(refreshed);
    assert_eq!(again["aud"], RESOURCE);
    assert_eq!(again["sub"], "bob");
    assert_ne!(again["jti"], claims["jti"]);

    let denied = auth.authorization_code("alice", "mcp:tools", &["--deny"]);
    assert_eq!(denied["error"], "access_denied", "{denied}");
}

#[tokio::test]
async fn the_mcp_sdk_client_completes_its_own_oauth_flow() {
    let auth = AuthServer::start(AuthOptions::for_resource(RESOURCE));
    let report = auth.sdk_authorization("carol", "mcp:tools");
    assert!(report.get("error").is_none(), "{report}");
    assert_eq!(report["results"], json!(["REDIRECT", "AUTHORIZED"]));
    // It registered itself (RFC 7591) and asked with the resource (RFC 8707).
    assert_eq!(report["client"]["token_endpoint_auth_method"], "none");
    let authorize = report["authorize"].as_str().unwrap();
    assert!(
        authorize.contains("code_challenge_method=S256"),
        "{authorize}"
    );
    assert!(
        authorize.contains("resource=http%3A%2F%2F127.0.0.1%3A9000%2Fmcp"),
        "{authorize}"
    );
    let claims = &report["claims"];
    assert_eq!(claims["aud"], RESOURCE);
    assert_eq!(claims["sub"], "carol");
    assert_eq!(claims["scope"], "mcp:tools");
    assert!(report["tokens"]["refresh_token"].is_string(), "{report}");
}
