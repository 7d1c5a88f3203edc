//! Unit tests of `capability`.
use super::*;
use serde_json::{Map, Value};
use std::time::Duration;

const KEY: &str = "af_live_0123456789abcdef0123456789abcdef_conformance_secret_0123456789abcdef";

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn conformance() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/protocol/epode-v1/conformance.json"
    );
    let text = std::fs::read_to_string(path).expect("conformance fixture");
    serde_json::from_str(&text).expect("conformance JSON")
}

fn key() -> ProductKey {
    ProductKey::parse(KEY).expect("conformance key")
}

fn scoped_key() -> ProductKey {
    ProductKey::parse(&format!(
        "af_live_{}_{}_{}",
        "ABCDEF0123456789abcdef0123456789",
        "FEDCBA9876543210fedcba9876543210",
        "s3cret-s3cret-s3cret-s3cret"
    ))
    .expect("scoped key")
}

#[test]
fn conformance_vector_reproduces_byte_for_byte() {
    let vector = conformance();
    let capability = &vector["capability"];
    let key = ProductKey::parse(capability["apiKey"].as_str().unwrap()).unwrap();
    assert_eq!(key.key_id(), capability["keyId"].as_str().unwrap());
    let claims: Claims = serde_json::from_value(capability["claims"].clone()).unwrap();
    let handle = sign(&key, &claims);
    assert_eq!(handle.as_str(), capability["token"].as_str().unwrap());
    assert!(handle
        .as_str()
        .ends_with(".wxJ0YGS21x9eW-Cn33t9V1INhyGNj1_U3qoQns3vdWA"));
    // The fixture's claims object is itself in protocol order.
    assert_eq!(claims.to_json(), capability["claims"].to_string());
    // And Epode's checks accept it inside its lifetime.
    assert_eq!(verify(&key, handle.as_str(), at(1_715_000_001)), Ok(claims));
}

#[test]
fn claims_serialise_in_protocol_order_with_optional_subject() {
    let claims = Claims {
        v: 1,
        i: "018f1f2e-7b4a-7c12-9c8d-123456789abc".into(),
        iat: 10,
        exp: 7210,
        n: "AQIDBAUGBwgJCgsMDQ4PEBES".into(),
        s: Some(format!("{SUBJECT_PREFIX}{}", "A".repeat(43))),
        r: Some(3),
    };
    let json = claims.to_json();
    assert_eq!(
        json,
        format!(
            r#"{{"v":1,"i":"018f1f2e-7b4a-7c12-9c8d-123456789abc","iat":10,"exp":7210,"n":"AQIDBAUGBwgJCgsMDQ4PEBES","s":"afsub1_{}","r":3}}"#,
            "A".repeat(43)
        )
    );
}

#[test]
fn product_keys_parse_like_the_reference_regex() {
    let legacy = key();
    assert_eq!(legacy.consent_scope(), legacy.key_id());

    let scoped = scoped_key();
    assert_eq!(scoped.key_id(), "abcdef0123456789abcdef0123456789");
    assert_eq!(scoped.consent_scope(), "fedcba9876543210fedcba9876543210");

    // A scope-shaped prefix followed by a too-short secret is the legacy form (regex
    // backtracking): the whole remainder is the secret.
    let short = format!("af_live_{}_{}_short", "a".repeat(32), "b".repeat(32));
    let parsed = ProductKey::parse(&short).unwrap();
    assert_eq!(parsed.consent_scope(), "a".repeat(32));

    for bad in [
        "",
        "af_live_",
        "af_live_0123456789abcdef0123456789abcdef_short",
        "af_live_0123456789abcdef0123456789abcdeg_conformance_secret_0123456789",
        "af_live_0123456789abcdef0123456789abcdef-conformance_secret_0123456789",
        "af_live_0123456789abcdef0123456789abcdef_twenty_chars_but\nnewline__",
        "xx_live_0123456789abcdef0123456789abcdef_conformance_secret_0123456789",
        "af_live_é123456789abcdef0123456789abcdef_conformance_secret_0123456789",
    ] {
        assert_eq!(
            ProductKey::parse(bad).unwrap_err(),
            ProductKeyError::Malformed,
            "{bad:?}"
        );
    }
    assert_eq!(
        ProductKey::parse("af_read_0123456789abcdef0123456789abcdef_conformance_secret_01234")
            .unwrap_err(),
        ProductKeyError::ReadKey
    );
    // Twenty UTF-16 units: ten astral characters are enough, as in JavaScript.
    let astral = format!("af_live_{}_{}", "c".repeat(32), "🚀".repeat(10));
    assert!(ProductKey::parse(&astral).is_ok());
}

#[test]
fn secrets_never_appear_in_debug_output_or_errors() {
    let shown = format!("{:?}", key());
    assert!(!shown.contains("conformance_secret"), "{shown}");
    assert!(shown.contains("0123456789abcdef0123456789abcdef"));
    let err = ProductKey::parse("af_live_nothex_conformance_secret_0123456789").unwrap_err();
    assert!(!err.to_string().contains("conformance_secret"));

    let minted = mint(&key(), at(1_715_000_000), None, None);
    let shown = format!("{:?}", minted.handle);
    assert!(!shown.contains(minted.handle.as_str()));
    assert!(!shown.contains(&minted.claims.n));
}

#[test]
fn mint_uses_fresh_ids_nonces_and_a_two_hour_lifetime() {
    let key = key();
    let now = at(1_715_000_000);
    let a = mint(&key, now, None, None);
    let b = mint(&key, now, None, None);
    assert_ne!(a.claims.i, b.claims.i);
    assert_ne!(a.claims.n, b.claims.n);
    assert_ne!(a.handle, b.handle);
    for minted in [&a, &b] {
        let id = Uuid::parse_str(&minted.claims.i).unwrap();
        assert_eq!(id.get_version_num(), 4);
        assert_eq!(minted.claims.n.len(), 24);
        assert_eq!(URL_SAFE_NO_PAD.decode(&minted.claims.n).unwrap().len(), 18);
        assert_eq!(minted.claims.iat, 1_715_000_000);
        assert_eq!(minted.claims.exp, 1_715_007_200);
        assert_eq!((minted.claims.s.as_ref(), minted.claims.r), (None, None));
        assert_eq!(
            verify(&key, minted.handle.as_str(), now),
            Ok(minted.claims.clone())
        );
    }

    let subject = key.subject("account_42");
    let ask_once = mint(&key, now, Some((subject.clone(), 0)), None);
    assert_eq!(ask_once.claims.s.as_deref(), Some(subject.as_str()));
    assert_eq!(ask_once.claims.r, Some(0));
    let json = ask_once.claims.to_json();
    assert!(
        json.ends_with(&format!(r#","s":"{subject}","r":0}}"#)),
        "{json}"
    );
    assert_eq!(
        verify(&key, ask_once.handle.as_str(), now),
        Ok(ask_once.claims)
    );
}

#[test]
fn expired_and_premature_handles_fail() {
    let key = key();
    let minted = mint(&key, at(1_000_000), None, None);
    let token = minted.handle.as_str();
    assert!(verify(&key, token, at(1_000_000 + 7199)).is_ok());
    assert_eq!(
        verify(&key, token, at(1_000_000 + 7200)),
        Err(VerifyError::Expired)
    );
    assert_eq!(
        verify(&key, token, at(1_000_000 + 99_999)),
        Err(VerifyError::Expired)
    );
    // Five minutes of clock skew is tolerated, not more.
    assert!(verify(&key, token, at(1_000_000 - 300)).is_ok());
    assert_eq!(
        verify(&key, token, at(1_000_000 - 301)),
        Err(VerifyError::IssuedInFuture)
    );
}

fn with_claims(key: &ProductKey, edit: impl FnOnce(&mut Claims)) -> String {
    let mut claims = mint(key, at(1_000_000), None, None).claims;
    edit(&mut claims);
    sign(key, &claims).as_str().to_owned()
}

#[test]
fn every_server_claim_check_is_enforced() {
    let key = key();
    let now = at(1_000_000);
    let subject = key.subject("c1");
    let cases: Vec<(String, VerifyError)> = vec![
        (
            with_claims(&key, |c| c.v = 2),
            VerifyError::UnsupportedVersion,
        ),
        (
            with_claims(&key, |c| c.i = "not-a-uuid".into()),
            VerifyError::BadInteractionId,
        ),
        (
            with_claims(&key, |c| c.n = "x".repeat(15)),
            VerifyError::BadNonce,
        ),
        (
            with_claims(&key, |c| c.n = "x".repeat(129)),
            VerifyError::BadNonce,
        ),
        (
            with_claims(&key, |c| c.exp = c.iat + 7201),
            VerifyError::BadLifetime,
        ),
        (
            with_claims(&key, |c| {
                c.iat += 200;
                c.exp = c.iat - 100;
            }),
            VerifyError::BadLifetime,
        ),
        (
            with_claims(&key, |c| c.s = Some("afsub1_short".into())),
            VerifyError::BadSubject,
        ),
        (
            with_claims(&key, |c| c.r = Some(0)),
            VerifyError::BadRevision,
        ),
        (
            with_claims(&key, |c| {
                c.s = Some(subject.clone());
                c.r = Some(-1);
            }),
            VerifyError::BadRevision,
        ),
    ];
    for (token, expected) in cases {
        assert_eq!(verify(&key, &token, now), Err(expected));
    }
    assert!(verify(&key, &with_claims(&key, |c| c.n = "x".repeat(16)), now).is_ok());
    assert!(verify(&key, &with_claims(&key, |c| c.n = "x".repeat(128)), now).is_ok());
    // A subject without a revision is what a legacy signer sends; Epode accepts it.
    assert!(verify(
        &key,
        &with_claims(&key, |c| c.s = Some(subject.clone())),
        now
    )
    .is_ok());
}

#[test]
fn tampered_tokens_fail() {
    let key = key();
    let now = at(1_000_000);
    let token = mint(&key, now, None, None).handle.as_str().to_owned();
    let (input, signature) = token.rsplit_once('.').unwrap();
    let (prefix, payload) = input.rsplit_once('.').unwrap();

    // Flip one payload character: the signature no longer matches.
    let mut bytes = payload.as_bytes().to_vec();
    bytes[3] = if bytes[3] == b'A' { b'B' } else { b'A' };
    let forged = format!("{prefix}.{}.{signature}", String::from_utf8(bytes).unwrap());
    assert_eq!(verify(&key, &forged, now), Err(VerifyError::BadSignature));

    // Re-encode different claims under the old signature.
    let longer = with_claims(&key, |c| c.exp += 1);
    let other_payload = longer.split('.').nth(1).unwrap();
    let swapped = format!("{prefix}.{other_payload}.{signature}");
    assert_eq!(verify(&key, &swapped, now), Err(VerifyError::BadSignature));

    // A different key with the same key id (rotated secret) does not verify.
    let rotated =
        ProductKey::parse("af_live_0123456789abcdef0123456789abcdef_another_secret_0123456789")
            .unwrap();
    assert_eq!(
        verify(&rotated, &token, now),
        Err(VerifyError::BadSignature)
    );
    assert_eq!(
        verify(&scoped_key(), &token, now),
        Err(VerifyError::KeyMismatch)
    );

    let truncated_sig = &token[..token.len() - 2];
    assert_eq!(
        verify(&key, truncated_sig, now),
        Err(VerifyError::BadSignature)
    );
    for malformed in [
        "",
        "afr2_",
        "afr1_0123456789abcdef0123456789abcdef.e30.AAAA",
        "afr2_0123456789abcdef0123456789abcdef.e30",
        &format!("{token}.extra"),
    ] {
        assert_eq!(
            verify(&key, malformed, now),
            Err(VerifyError::Malformed),
            "{malformed}"
        );
    }
    // Correctly signed garbage claims are refused as claims, without a panic.
    for payload in [
        "not json",
        "{}",
        r#"{"v":1,"extra":true}"#,
        "[1]",
        "\u{fffd}",
    ] {
        let encoded = URL_SAFE_NO_PAD.encode(payload);
        let input = format!("afr2_{}.{encoded}", key.key_id());
        let sig = URL_SAFE_NO_PAD.encode(mac(
            &Sha256::digest(KEY.as_bytes()).into(),
            input.as_bytes(),
        ));
        assert_eq!(
            verify(&key, &format!("{input}.{sig}"), now),
            Err(VerifyError::BadClaims),
            "{payload}"
        );
    }
    // An upper-case key id passes the key check (Epode parses it as a UUID) but changes
    // the signed input.
    let upper = token.replacen("abcdef", "ABCDEF", 1);
    assert_ne!(upper, token);
    assert_eq!(verify(&key, &upper, now), Err(VerifyError::BadSignature));
}

#[test]
fn subject_matches_the_protocol_derivation() {
    // Independent derivation with the primitives, as protocol step 8 states it.
    let scope = "FEDCBA9876543210fedcba9876543210";
    let scope_key: [u8; 32] =
        Sha256::digest(b"epode-consent-scope:fedcba9876543210fedcba9876543210".as_slice()).into();
    let expected = format!(
        "afsub1_{}",
        URL_SAFE_NO_PAD.encode(mac(&scope_key, b"customer-ref:account_42"))
    );
    assert_eq!(subject(scope, "  account_42\u{feff}\n"), expected);
    assert_eq!(scoped_key().subject("account_42"), expected);
    assert!(valid_subject(&expected));
    assert_eq!(expected.len(), "afsub1_".len() + 43);
    assert_ne!(subject(scope, "account_43"), expected);
    // A legacy key's scope is its key id.
    assert_eq!(
        key().subject("x"),
        subject("0123456789abcdef0123456789abcdef", "x")
    );
}

#[test]
fn subject_validation_is_strict() {
    let ok = format!("afsub1_{}", "a-_Z9".repeat(8) + "abc");
    assert!(valid_subject(&ok));
    assert!(!valid_subject(&ok[..ok.len() - 1]));
    assert!(!valid_subject(&format!("{ok}a")));
    assert!(!valid_subject(&ok.replace('a', "+")));
    assert!(!valid_subject(&ok.replacen("afsub1_", "afsub2_", 1)));
}

/// The claims written field by field are the bytes the map-built JSON was (the signature
/// covers them, and Epode verifies against the same text).
#[test]
fn claims_are_written_as_the_map_built_json_was() {
    fn map_built(c: &Claims) -> String {
        let mut map = Map::new();
        map.insert("v".into(), Value::from(c.v));
        map.insert("i".into(), Value::from(c.i.as_str()));
        map.insert("iat".into(), Value::from(c.iat));
        map.insert("exp".into(), Value::from(c.exp));
        map.insert("n".into(), Value::from(c.n.as_str()));
        if let Some(s) = &c.s {
            map.insert("s".into(), Value::from(s.as_str()));
        }
        if let Some(r) = c.r {
            map.insert("r".into(), Value::from(r));
        }
        Value::Object(map).to_string()
    }
    let key = ProductKey::parse(KEY).unwrap();
    for subject in [
        None,
        Some(("afsub1_a\"b\\c\u{e9}".to_owned(), 7)),
        Some((String::new(), u64::MAX)),
    ] {
        let minted = mint(&key, at(1_800_000_000), subject, None);
        assert_eq!(minted.claims.to_json(), map_built(&minted.claims));
    }
    let odd = Claims {
        v: 1,
        i: "x\u{2028}\n".into(),
        iat: -1,
        exp: i64::MAX,
        n: String::new(),
        s: None,
        r: Some(3),
    };
    assert_eq!(odd.to_json(), map_built(&odd));
}

#[test]
fn key_shapes_are_found_anywhere_but_not_in_the_sidecars_own_ellipsis() {
    for secret in [
        "af_live_0123456789abcdef0123456789abcdef_secret",
        "https://h/mcp?key=af_live_x",
        "AF_LIVE_abc",
        "x af_read_1",
    ] {
        assert!(has_key_shape(secret), "{secret}");
    }
    for fine in [
        "an Epode product key af_live_… from your workspace",
        "af_live_",
        "<redacted: a read key (af_read_…)>",
        "http://127.0.0.1:8000/mcp",
        "af_lived",
    ] {
        assert!(!has_key_shape(fine), "{fine}");
    }
}

/// With auth on, a handle is issued to its verified caller: its nonce (still 16 to 128
/// base64url characters, as Epode checks) binds it, and only that caller's id opens it.
#[test]
fn a_bound_handle_is_issued_to_its_caller_only() {
    let key = key();
    let now = SystemTime::now();
    let alice = [1_u8; 16];
    let bob = [2_u8; 16];
    let minted = mint(&key, now, None, Some(&alice));
    let claims = verify(&key, minted.handle.as_str(), now).unwrap();
    assert!((16..=128).contains(&claims.n.len()), "{}", claims.n);
    assert!(is_bound(&claims));
    assert!(issued_to(&key, &claims, &alice));
    assert!(!issued_to(&key, &claims, &bob));
    let unbound = mint(&key, now, None, None);
    let claims = verify(&key, unbound.handle.as_str(), now).unwrap();
    assert!(!is_bound(&claims));
    assert!(
        !issued_to(&key, &claims, &alice),
        "a handle issued to no caller"
    );
    // Another product key computes another tag.
    let other = ProductKey::parse(
        "af_live_00000000000000000000000000000000_11111111111111111111111111111111_abcdefghijklmnopqrstuvwxyz",
    )
    .unwrap();
    let bound = verify(&key, minted.handle.as_str(), now).unwrap();
    assert!(!issued_to(&other, &bound, &alice));
}
