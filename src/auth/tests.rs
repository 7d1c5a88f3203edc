use super::*;

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    h
}

#[test]
fn the_token_comes_from_one_bearer_header_only() {
    let ok = headers(&[("authorization", "Bearer abc.def-ghi_~+/==")]);
    assert_eq!(bearer(&ok, None).unwrap(), "abc.def-ghi_~+/==");
    assert_eq!(
        bearer(&headers(&[("authorization", "bearer t")]), None).unwrap(),
        "t"
    );
    assert_eq!(
        bearer(&HeaderMap::new(), None).unwrap_err().reason,
        Reason::Missing
    );
    let malformed = |h: &HeaderMap, q: Option<&str>| {
        let r = bearer(h, q).unwrap_err();
        r.reason == Reason::Malformed && r.detail.as_deref() == Some(MALFORMED_REQUEST)
    };
    assert!(malformed(
        &headers(&[("authorization", "Bearer a"), ("authorization", "Bearer b")]),
        None
    ));
    assert!(malformed(
        &headers(&[("authorization", "Basic dXNlcjpwYXNz")]),
        None
    ));
    assert!(malformed(&headers(&[("authorization", "Bearer")]), None));
    assert!(malformed(
        &headers(&[("authorization", "Bearer a b")]),
        None
    ));
    assert!(malformed(
        &headers(&[("authorization", "Bearer t")]),
        Some("x=1&access_token=t")
    ));
    let long = format!("Bearer {}", "a".repeat(MAX_TOKEN + 1));
    assert!(malformed(&headers(&[("authorization", &long)]), None));
}

#[test]
fn the_metadata_url_puts_the_well_known_segment_before_the_path() {
    assert_eq!(
        metadata_url("https://mcp.example.com/mcp"),
        "https://mcp.example.com/.well-known/oauth-protected-resource/mcp"
    );
    assert_eq!(
        metadata_url("https://mcp.example.com"),
        "https://mcp.example.com/.well-known/oauth-protected-resource"
    );
    assert_eq!(
        metadata_url("http://127.0.0.1:9000/a/b"),
        "http://127.0.0.1:9000/.well-known/oauth-protected-resource/a/b"
    );
}

#[test]
fn refs_are_ids_or_keyed_hashes_never_the_raw_value() {
    let key = ProductKey::ephemeral();
    let other = ProductKey::ephemeral();
    let config = test_config();
    let refs = RefMaker::new(&config, Some(&key));
    assert_eq!(refs.make("user-123"), "user-123");
    let hashed = refs.make("jane@example.com");
    assert!(hashed.starts_with("h:") && hashed.len() == 34, "{hashed}");
    assert!(!hashed.contains("jane"));
    assert_eq!(hashed, refs.make("jane@example.com"), "stable for one key");
    assert_ne!(
        hashed,
        RefMaker::new(&config, Some(&other)).make("jane@example.com"),
        "keyed"
    );
    assert!(
        crate::feedback::identity::IdentityRefs::from_values(|_| Some(hashed.as_str()))
            .user_ref
            .is_some(),
        "a valid ref"
    );
}

pub(super) fn test_config() -> AuthConfig {
    AuthConfig {
        mode: AuthMode::Jwt,
        issuer: "http://127.0.0.1:1".into(),
        resource: "http://127.0.0.1:2/mcp".into(),
        scopes: vec!["mcp:tools".into(), "mcp:read".into()],
        algorithms: vec![jsonwebtoken::Algorithm::RS256],
        leeway: Duration::from_secs(30),
        token_type: None,
        user_claim: "sub".into(),
        account_claim: Some("org".into()),
        client_id: None,
        client_secret: None,
        forward_token: false,
        cache_entries: 4,
        keys_refresh: Duration::from_secs(30),
        keys_max_age: Duration::from_secs(86_400),
        fetch_timeout: Duration::from_secs(1),
        documentation: None,
        introspection_cache: Duration::from_secs(60),
        http_surface: false,
        operation_scopes: Vec::new(),
        implies: Default::default(),
        audience: Vec::new(),
        facade: false,
    }
}

/// A verified caller holding `scopes`.
fn holding(scopes: &[&str]) -> Principal {
    Principal {
        subject: None,
        scopes: scopes.iter().map(|s| (*s).to_owned()).collect(),
        client_id: None,
        refs: IdentityRefs::default(),
        caller: crate::caller::CallerKey::of_token("i", None, None, &[0; 32]),
    }
}

fn test_ledger() -> Arc<crate::ledger::Ledger> {
    crate::ledger::Ledger::with(crate::ledger::Pool::Introspections, 4, 2)
}

/// A client address as a caller.
fn who() -> crate::caller::CallerKey {
    crate::caller::CallerKey::of_token("address", None, None, &[7; 32])
}

fn authorizer() -> Arc<Authorizer> {
    Authorizer::new(
        test_config(),
        Arc::new(Metrics::new(|_| {})),
        None,
        test_ledger(),
    )
    .unwrap()
}

#[test]
fn every_refusal_has_its_status_and_challenge() {
    let a = authorizer();
    let challenge = |r: Refusal| {
        let e = a.refuse(&r);
        let status = e.status();
        let resp = e.into_response(None);
        let h = resp
            .headers()
            .get(http::header::WWW_AUTHENTICATE)
            .map(|v| v.to_str().unwrap().to_owned());
        (status.as_u16(), h)
    };
    let (s, h) = challenge(Reason::Missing.into());
    assert_eq!(s, 401);
    assert_eq!(h.unwrap(), "Bearer resource_metadata=\"http://127.0.0.1:2/.well-known/oauth-protected-resource/mcp\", scope=\"mcp:tools mcp:read\"");
    let (s, h) = challenge(Reason::Expired.into());
    assert_eq!(s, 401);
    assert!(h.unwrap().starts_with("Bearer error=\"invalid_token\", error_description=\"the token has expired\", resource_metadata="));
    let (s, h) = challenge(Reason::InsufficientScope.into());
    assert_eq!(s, 403);
    assert!(h.unwrap().contains("error=\"insufficient_scope\""));
    let (s, h) = challenge(Refusal {
        reason: Reason::Malformed,
        detail: Some(MALFORMED_REQUEST.into()),
        busy: None,
    });
    assert_eq!(s, 400);
    assert!(h.unwrap().starts_with("Bearer error=\"invalid_request\""));
    let (s, _) = challenge(Reason::Malformed.into());
    assert_eq!(
        s, 401,
        "a malformed token (not request) is an invalid token"
    );
    let (s, h) = challenge(Reason::KeysUnavailable.into());
    assert_eq!((s, h), (503, None));
    for r in Reason::ALL {
        assert!(!r.description().contains(['"', '\\']), "{r:?}");
    }
}

#[test]
fn the_metadata_is_served_at_its_well_known_paths_only() {
    let a = authorizer();
    for path in [METADATA_PATH, "/.well-known/oauth-protected-resource/mcp"] {
        let resp = a
            .metadata_route(&Method::GET, path, "/mcp")
            .unwrap_or_else(|| panic!("{path}"));
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.headers()[http::header::ACCESS_CONTROL_ALLOW_ORIGIN],
            "*"
        );
    }
    assert!(a
        .metadata_route(
            &Method::GET,
            "/.well-known/oauth-protected-resource/other",
            "/mcp"
        )
        .is_none());
    assert!(a
        .metadata_route(
            &Method::GET,
            "/.well-known/oauth-protected-resourcex",
            "/mcp"
        )
        .is_none());
    assert_eq!(
        a.metadata_route(&Method::POST, METADATA_PATH, "/mcp")
            .unwrap()
            .status(),
        405
    );
    let doc: Value = serde_json::from_slice(&a.metadata).unwrap();
    assert_eq!(doc["resource"], "http://127.0.0.1:2/mcp");
    assert_eq!(
        doc["authorization_servers"],
        serde_json::json!(["http://127.0.0.1:1"])
    );
    assert_eq!(
        doc["scopes_supported"],
        serde_json::json!(["mcp:tools", "mcp:read"])
    );
    assert_eq!(
        doc["bearer_methods_supported"],
        serde_json::json!(["header"])
    );
}

#[test]
fn the_upstream_gets_the_claims_and_not_the_token() {
    let a = authorizer();
    let mut h = headers(&[
        ("authorization", "Bearer t"),
        ("epode-auth-subject", "forged"),
        ("x-other", "1"),
    ]);
    let p = Principal {
        subject: Some("alice".into()),
        scopes: vec!["mcp:tools".into()],
        client_id: Some("app".into()),
        refs: IdentityRefs::default(),
        caller: crate::caller::CallerKey::of_token("i", None, None, &[0; 32]),
    };
    a.to_upstream(&mut h, &p);
    assert!(!h.contains_key("authorization"));
    assert_eq!(h["epode-auth-subject"], "alice");
    assert_eq!(h.get_all("epode-auth-subject").iter().count(), 1);
    assert_eq!(h["epode-auth-scopes"], "mcp:tools");
    assert_eq!(h["epode-auth-client"], "app");
    assert_eq!(h["x-other"], "1");
    // A subject no header can hold is told as its ref.
    let mut h2 = HeaderMap::new();
    let odd = Principal {
        subject: Some("line\nbreak".into()),
        scopes: vec![],
        client_id: None,
        refs: IdentityRefs {
            user_ref: Some("h:0123".into()),
            ..IdentityRefs::default()
        },
        caller: crate::caller::CallerKey::of_token("i", None, None, &[1; 32]),
    };
    a.to_upstream(&mut h2, &odd);
    assert_eq!(h2["epode-auth-subject"], "h:0123");
    let mut forged = headers(&[("epode-auth-scopes", "admin"), ("epode-auth-client", "x")]);
    strip_owned(&mut forged);
    assert!(forged.is_empty());
    // Every spelling an app server may fold to one of them goes too; others stay.
    let mut spelled = headers(&[
        ("epode_auth_subject", "alice"),
        ("Epode_Auth_Scopes", "admin"),
        ("x-epode-auth-subject", "alice"),
        ("x_epode_auth_client", "c"),
        ("epode.auth.subject", "alice"),
        ("x-epode-identity", "{}"),
        ("epode_identity", "{}"),
        ("x-epode-auth-subjects", "kept"),
        ("epode-auth", "kept"),
        ("xepode-auth-subject", "kept"),
    ]);
    strip_owned(&mut spelled);
    let mut left: Vec<&str> = spelled.keys().map(|k| k.as_str()).collect();
    left.sort_unstable();
    assert_eq!(
        left,
        ["epode-auth", "x-epode-auth-subjects", "xepode-auth-subject"]
    );
}

#[test]
fn claims_become_a_principal_with_refs() {
    let a = authorizer();
    let claims: Map<String, Value> = serde_json::from_value(serde_json::json!({
        "sub": "user 1", "org": "acme", "scope": "mcp:tools  mcp:read", "client_id": "app"
    }))
    .unwrap();
    let p = a.principal_of(&claims, &[0; 32]);
    assert_eq!(p.subject.as_deref(), Some("user 1"));
    assert_eq!(p.scopes, ["mcp:tools", "mcp:read"]);
    assert!(
        p.refs.user_ref.as_deref().unwrap().starts_with("h:"),
        "a space is no ref character"
    );
    assert_eq!(p.refs.account_ref.as_deref(), Some("acme"));
    assert_eq!(p.refs.customer_ref.as_deref(), Some("acme"));
    assert_eq!(p.client_id.as_deref(), Some("app"));
}

#[test]
fn an_operation_needs_its_rules_scopes_and_the_hierarchy_grants_them() {
    let mut config = test_config();
    config.scopes = vec!["mcp:tools".into()];
    config.operation_scopes = crate::config::tests_support_operation_scopes(
        "tool:delete_*=mcp:admin; prompt:*=mcp:prompts",
    );
    config.implies = [(
        "mcp:root".to_owned(),
        vec!["mcp:admin".to_owned(), "mcp:tools".to_owned()],
    )]
    .into_iter()
    .collect();
    let a = Authorizer::new(config, Arc::new(Metrics::new(|_| {})), None, test_ledger()).unwrap();
    let doc: Value = serde_json::from_slice(&a.metadata).unwrap();
    assert_eq!(
        doc["scopes_supported"],
        serde_json::json!(["mcp:tools", "mcp:admin", "mcp:prompts", "mcp:root"]),
        "the metadata names every scope a call may need"
    );
    assert!(doc.get("resource_signing_alg_values_supported").is_none());
    let needed = a.needed(Some(OperationKind::Tool), Some("delete_user"), false);
    assert_eq!(needed, ["mcp:tools", "mcp:admin"]);
    assert_eq!(
        a.needed(Some(OperationKind::Tool), Some("delete_user"), true),
        ["mcp:tools"],
        "a feedback tool needs the base scopes"
    );
    assert_eq!(
        a.needed(Some(OperationKind::Tool), Some("list"), false),
        ["mcp:tools"]
    );
    assert_eq!(
        a.needed(Some(OperationKind::Prompt), Some("x"), false),
        ["mcp:tools", "mcp:prompts"]
    );
    assert!(a
        .require(&holding(&["mcp:tools", "mcp:admin"]), &needed)
        .is_ok());
    assert!(
        a.require(&holding(&["mcp:root"]), &needed).is_ok(),
        "granted through the hierarchy"
    );
    let e = a.require(&holding(&["mcp:tools"]), &needed).unwrap_err();
    assert_eq!(e.status(), 403);
    let resp = e.into_response(None);
    let challenge = resp.headers()[http::header::WWW_AUTHENTICATE]
        .to_str()
        .unwrap();
    assert!(
        challenge.contains("scope=\"mcp:tools mcp:admin\""),
        "{challenge}"
    );
}

#[test]
fn an_audience_of_the_issuers_own_is_accepted_and_its_prefixed_scopes_held_bare() {
    let mut config = test_config();
    config.audience = vec!["api://1b2c".into(), "1b2c".into()];
    config.scopes = vec!["api://1b2c/mcp.tools".into()];
    let claims = |aud: Value| {
        let mut m = serde_json::Map::new();
        m.insert("aud".into(), aud);
        m
    };
    for good in [
        serde_json::json!("api://1b2c"),
        serde_json::json!(["other", "1b2c"]),
        serde_json::json!("http://127.0.0.1:2/mcp"),
    ] {
        assert!(
            super::jwt::check_audience(&claims(good.clone()), &config).is_ok(),
            "{good}"
        );
    }
    for bad in [
        serde_json::json!("api://1b2"),
        serde_json::json!(["1b2c/x"]),
        Value::Null,
    ] {
        assert_eq!(
            super::jwt::check_audience(&claims(bad.clone()), &config),
            Err(Reason::WrongAudience),
            "{bad}"
        );
    }
    let a = Authorizer::new(config, Arc::new(Metrics::new(|_| {})), None, test_ledger()).unwrap();
    let needed = a.base_scopes().to_vec();
    assert!(
        a.require(&holding(&["mcp.tools"]), &needed).is_ok(),
        "Entra's bare scp"
    );
    assert!(a
        .require(&holding(&["api://1b2c/mcp.tools"]), &needed)
        .is_ok());
    assert!(a.require(&holding(&["mcp.read"]), &needed).is_err());
    assert!(
        a.require(&holding(&["1b2c/mcp.tools"]), &needed).is_err(),
        "another audience's prefix is no bare name"
    );
    assert_eq!(a.bare_scope("api://1b2c/"), None, "an empty name is none");
}

/// A fixed RS256 key pair for the cost measurement below (ring, under jsonwebtoken, cannot make
/// RSA keys; made once with Node's `crypto.generateKeyPairSync('rsa', {modulusLength: 2048})`):
/// the private key as PKCS#1 DER in base64, the public key's JWK `n` (base64url) and `e`.
const COST_KEY_PKCS1_DER: [&str; 19] = [
    "MIIEpAIBAAKCAQEAkkuuZev24FDVi6LuaGenoAOlt7gruo2D29NV6JllDbDBlbSdHvV0AWxekyutlYe8mRWy6BBT",
    "TNIQcVNH7iOdalJlr2soea6DxQFzWDVjpOL2WDFh4S5beoqDF4oDXQKzMg+zWvkLcMgbFWBG2t2bCtOFAltFu6hI",
    "Yj0Dml3hCR+2TN+HNiFuRC+UUmC6FglTvIUhgMcyGc7sumd5WrWbLY50CKj7IhEkFsBMVjTgZWi9tyRONK8xK1rU",
    "iDI9fOeelISfj+guP6QCd4VQuyBDshmYLYUljfiAnqtv1Bzl7qjhKEMqv1b3r7uVTa2XSHMgHEQ/sODcxSNCud5M",
    "VtzZFwIDAQABAoIBAC0QmxxSX64huGZXPlFy/LPR6854MSA6T4/7vc700agx9rAC/xN2UNHPbCKxpbsWIQaXJJFP",
    "1hkn7GC8Yr/8wJTr5N7wh3tUQssA82MMrzEvqOrp61jOSueom1E49mhEWKbnJzyy0s9fFNi02563/PaMycA8FXMF",
    "F6cLXHzExnlkkClLhOoU3emIZ49j1YDEnZ5/5dIjiyG1BLSrXy3zYaah09Y3N7XOERclc1qcnCJz4rYE3P+6DNN5",
    "2Lgpig50yuK37XBOr22L7bTiusnwiyr7aeFYaNdsH6huUGBs7J6mCCGMHDKOglr+egu1bnW+N9M1DhYdijkYpeyO",
    "B8l8tqECgYEAxJrqr3VYf2eKmyFQCNYtjWV5j5QTxmrM5VZg6/OUB5ywISjNI1sBsydTgeNd+EoaSJBLqrqZIQMn",
    "FCF5v1y4ywCT04qO4uI6sVi2N8A2fXdKPW5CgTwpxZg+D3+g5BFpYjbqcDuc5GiQQ9oHcjLIHVvxpef8zy3EY7y1",
    "8nzInxMCgYEAvn3rIGtLMLiNBKhftTK+uxc3Vw9T145XHJ9R7c+Wpo/CWAwz7LaafMoCfnbl1c621MqjCV9Q/xg9",
    "vdbxRkePCAgpmt38bG74Q6sak+y4Gi7BfwEr4+C7uJVXGTtpH//OwPBhOlqbU1KFSbbQKrmywGMiCs55oatrqmyl",
    "1fpIKm0CgYBd76rsNIQZM46dOlh0MGlJYs+nE1gzeHn3pcLfWd1DmdDptwX0u5nfUI3sxIb0h+tw+ki9BTT++fOl",
    "Aa2bCiFdFSSMcWp96xuh+sHtd1BRuDpniZQLDYTj3S7h1tg3wD366EQxZbo7w94SHU1reen1ZSXbYDGBh9uKz/Kb",
    "LpXoswKBgQCYk+kZ/XarXpbtTSPj0fJ9jpnv7MH+HO/faClKbwS/AtTqi1On3ZceLvwSaY+sUreU933hSuxodvU1",
    "Mo3s+fIxv7/7YKUIAVZvdQSDyY6owhyQatLJ4r7ZmRy7hB+u1sm3NpLaF6rj8Wv7YCeaoUTw3jZtK3a3LMO/LOkj",
    "3CWjfQKBgQCzv3umhQvRitVPYYEHZCVEIGszf0ET0iQtWLBp+gEvTJeN8lXsGlFZ8+CnrNSvatMItyHBrdw3fQAi",
    "yhWER0NQZmy118NfRwhh2cy6ingxxXIxYlenbhfGI2fBDI54HtOEG1Pmvz9pUIX9UtTvzJH5f3RgyOCt8nzXHuG7",
    "Esn5Lg==",
];
const COST_KEY_N: [&str; 4] = [
    "kkuuZev24FDVi6LuaGenoAOlt7gruo2D29NV6JllDbDBlbSdHvV0AWxekyutlYe8mRWy6BBTTNIQcVNH7iOdalJl",
    "r2soea6DxQFzWDVjpOL2WDFh4S5beoqDF4oDXQKzMg-zWvkLcMgbFWBG2t2bCtOFAltFu6hIYj0Dml3hCR-2TN-H",
    "NiFuRC-UUmC6FglTvIUhgMcyGc7sumd5WrWbLY50CKj7IhEkFsBMVjTgZWi9tyRONK8xK1rUiDI9fOeelISfj-gu",
    "P6QCd4VQuyBDshmYLYUljfiAnqtv1Bzl7qjhKEMqv1b3r7uVTa2XSHMgHEQ_sODcxSNCud5MVtzZFw",
];
const COST_KEY_E: &str = "AQAB";

/// `count` distinct RS256 access tokens for `config`'s issuer and resource, shaped like an
/// authorization server's (oidc-provider's claims), signed with the fixed cost key, and the
/// key set that verifies them (kid `cost`).
fn cost_tokens(config: &AuthConfig, count: usize) -> (Vec<String>, Arc<keys::KeySet>) {
    use base64::Engine;
    let der = base64::engine::general_purpose::STANDARD
        .decode(COST_KEY_PKCS1_DER.concat())
        .unwrap();
    let signing = jsonwebtoken::EncodingKey::from_rsa_der(&der);
    let jwk = serde_json::json!({"kty": "RSA", "kid": "cost", "use": "sig", "alg": "RS256",
        "n": COST_KEY_N.concat(), "e": COST_KEY_E});
    let set = keys::key_set(&serde_json::json!({ "keys": [jwk] }), keys::DEFAULT_KEEP).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
    header.kid = Some("cost".into());
    header.typ = Some("at+jwt".into());
    let tokens = (0..count)
        .map(|i| {
            let claims = serde_json::json!({
                "iss": config.issuer, "aud": config.resource, "sub": "svc-client",
                "client_id": "svc-client", "scope": "mcp:tools mcp:read", "org": "acme",
                "iat": now, "exp": now + 3600, "jti": format!("cost-{i:06}-{}", "x".repeat(21)),
            });
            jsonwebtoken::encode(&header, &claims, &signing).unwrap()
        })
        .collect();
    (tokens, Arc::new(set))
}

/// An authorizer for `config` whose keys are `set`, as if fetched (nothing is asked of a
/// server while they are fresh), its token cache empty.
fn authorizer_with_keys(config: &AuthConfig, set: &Arc<keys::KeySet>) -> Arc<Authorizer> {
    let store = keys::KeyStore::new(
        url::Url::parse("http://127.0.0.1:1/jwks").unwrap(),
        reqwest::Client::new(),
        (
            Duration::from_secs(1),
            Duration::from_secs(30),
            Duration::from_secs(86_400),
        ),
    );
    *store.held.write() = Some(set.clone());
    let a = Authorizer::new(
        config.clone(),
        Arc::new(Metrics::new(|_| {})),
        None,
        test_ledger(),
    )
    .unwrap();
    assert!(a.backend.set(Backend::Jwt(Arc::new(store))).is_ok());
    a
}

/// What the front door costs per request, release build: a cached token's check
/// (`Authorizer::check`: the bearer read, its SHA-256, the LRU lookup), and a first sight of
/// an RS256 JWT (2048-bit key): the header read and the signature and claims checked
/// (`jwt::head` + `jwt::verify`), and the whole `check` of a token not cached (that, the
/// principal made and cached). The keys are set as if fetched; nothing is asked of a server:
/// `cargo test --release --lib auth_costs -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement, not a check"]
fn auth_costs() {
    use std::hint::black_box;

    const TOKENS: usize = 2_000;
    const CACHED: u32 = 200_000;
    let mut config = test_config();
    config.cache_entries = 10_000;
    let (tokens, set) = cost_tokens(&config, TOKENS);
    println!("{TOKENS} RS256 tokens of {} bytes", tokens[0].len());
    let a = authorizer_with_keys(&config, &set);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let bearer_headers: Vec<HeaderMap> = tokens
        .iter()
        .map(|t| headers(&[("authorization", &format!("Bearer {t}"))]))
        .collect();
    for round in 1..=3 {
        println!("round {round}");
        let start = Instant::now();
        for t in &tokens {
            let head = jwt::head(t, &config).unwrap();
            black_box(jwt::verify(t, &head, &set, &config).unwrap());
        }
        let ns = start.elapsed().as_nanos() / TOKENS as u128;
        println!("first sight, RS256 verify (jwt::head + jwt::verify): {ns} ns");
        // A fresh authorizer each round, so every token is a cache miss.
        let fresh = authorizer_with_keys(&config, &set);
        let start = Instant::now();
        rt.block_on(async {
            for h in &bearer_headers {
                black_box(fresh.check(h, None, who(), &mut None).await.unwrap());
            }
        });
        let ns = start.elapsed().as_nanos() / TOKENS as u128;
        println!("first sight, Authorizer::check (verified, principal made, cached): {ns} ns");
        // The cached path: the same token again and again, cached by its first check.
        let h = &bearer_headers[round];
        rt.block_on(a.check(h, None, who(), &mut None)).unwrap();
        let start = Instant::now();
        rt.block_on(async {
            for _ in 0..CACHED {
                black_box(a.check(h, None, who(), &mut None).await.unwrap());
            }
        });
        let ns = start.elapsed().as_nanos() / u128::from(CACHED);
        println!("cached, Authorizer::check (bearer, SHA-256, LRU lookup): {ns} ns");
    }
}

#[test]
fn the_verified_token_cache_is_bounded_and_forgets_the_least_recent_and_the_expired() {
    // `test_config` keeps 4 tokens.
    let a = authorizer();
    let principal = || {
        Arc::new(Principal {
            subject: Some("s".into()),
            scopes: vec![],
            client_id: None,
            refs: IdentityRefs::default(),
            caller: crate::caller::CallerKey::of_token("i", Some("s"), None, &[0; 32]),
        })
    };
    let now = Instant::now();
    let later = now + Duration::from_secs(60);
    for i in 0..5u8 {
        a.remember(
            [i; 32],
            Entry {
                value: Cached::Valid(principal()),
                until: later,
                verified_with: None,
            },
        );
    }
    assert_eq!(a.cache.lock().len(), 4, "past its bound");
    assert!(
        a.cached(&[0; 32], now).is_none(),
        "the least recently used is forgotten"
    );
    for i in 1..5u8 {
        assert!(a.cached(&[i; 32], now).unwrap().is_ok(), "{i}");
    }
    // Never past the token's expiry, and an expired entry leaves the cache.
    a.remember(
        [9; 32],
        Entry {
            value: Cached::Valid(principal()),
            until: now,
            verified_with: None,
        },
    );
    assert!(a.cached(&[9; 32], now).is_none());
    assert!(a.cache.lock().peek(&[9; 32]).is_none());
    // A refusal remembered (an inactive introspected token) answers as the refusal.
    a.remember(
        [7; 32],
        Entry {
            value: Cached::Refused(Reason::Inactive),
            until: later,
            verified_with: None,
        },
    );
    assert_eq!(
        a.cached(&[7; 32], now).unwrap().unwrap_err().reason,
        Reason::Inactive
    );
}
