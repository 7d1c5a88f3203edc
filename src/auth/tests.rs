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
        fetch_timeout: Duration::from_secs(1),
        documentation: None,
        introspection_cache: Duration::from_secs(60),
        http_surface: false,
        operation_scopes: Vec::new(),
        implies: Default::default(),
    }
}

fn authorizer() -> Arc<Authorizer> {
    Authorizer::new(test_config(), Arc::new(Metrics::new(|_| {})), None).unwrap()
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
    };
    a.to_upstream(&mut h, &p);
    assert!(!h.contains_key("authorization"));
    assert_eq!(h["epode-auth-subject"], "alice");
    assert_eq!(h.get_all("epode-auth-subject").iter().count(), 1);
    assert_eq!(h["epode-auth-scopes"], "mcp:tools");
    assert_eq!(h["epode-auth-client"], "app");
    assert_eq!(h["x-other"], "1");
    let mut forged = headers(&[("epode-auth-scopes", "admin"), ("epode-auth-client", "x")]);
    strip_owned(&mut forged);
    assert!(forged.is_empty());
}

#[test]
fn claims_become_a_principal_with_refs() {
    let a = authorizer();
    let claims: Map<String, Value> = serde_json::from_value(serde_json::json!({
        "sub": "user 1", "org": "acme", "scope": "mcp:tools  mcp:read", "client_id": "app"
    }))
    .unwrap();
    let p = a.principal_of(&claims);
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
    let a = Authorizer::new(config, Arc::new(Metrics::new(|_| {})), None).unwrap();
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
    let holding = |scopes: &[&str]| Principal {
        subject: None,
        scopes: scopes.iter().map(|s| (*s).to_owned()).collect(),
        client_id: None,
        refs: IdentityRefs::default(),
    };
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
