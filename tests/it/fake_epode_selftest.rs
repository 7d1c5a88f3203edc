//! Black-box tests of the fake Epode service (tests/it/support/fake_epode.rs), driven over
//! HTTP with reqwest (and once with a raw socket from a plain `#[test]`).

use crate::support::fake_epode;

use std::io::{Read as _, Write as _};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fake_epode::{
    consent_subject, decode_handle, feedback_envelope, format_timestamp, http_envelope_errors,
    mint_handle, product_key_parts, verify_handle, BatchCost, Endpoint, FakeConfig, FakeEpode,
    Fault, DEMO_PRODUCT_KEY, FAKE_WORKSPACE_ID, FAULT_SECRET, PROTOCOL_DIR,
};
use serde_json::{json, Value};

/// One minute after the conformance vector's iat.
const VECTOR_NOW: u64 = 1_715_000_060;

struct Resp {
    status: u16,
    headers: reqwest::header::HeaderMap,
    text: String,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or(Value::Null)
    }

    fn header(&self, name: &str) -> String {
        self.headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    }

    fn assert_error(&self, status: u16, message: &str) {
        assert_eq!(self.status, status, "body: {}", self.text);
        assert!(
            self.header("content-type").starts_with("application/json"),
            "{}",
            self.header("content-type")
        );
        assert_eq!(self.json(), json!({ "error": message }), "status {status}");
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("reqwest client")
}

async fn send(request: reqwest::RequestBuilder) -> Resp {
    let response = request.send().await.expect("request failed");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.expect("body");
    Resp {
        status,
        headers,
        text,
    }
}

async fn post(url: &str, bearer: Option<&str>, body: &Value) -> Resp {
    let mut request = client()
        .post(url)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body).expect("json"));
    if let Some(token) = bearer {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    send(request).await
}

fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

fn unix_now() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_secs(),
    )
    .expect("seconds")
}

fn timestamp(offset_seconds: i64) -> String {
    format_timestamp(unix_now() + offset_seconds, 0)
}

fn mcp_event(id: &str) -> Value {
    json!({
        "interactionId": id,
        "surface": "mcp",
        "operation": "get_summary",
        "statusCode": 200,
        "classification": "confirmed",
        "confirmationMethod": "mcp",
        "occurredAt": timestamp(0),
    })
}

fn vector() -> (String, String, Value) {
    let conformance: Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{PROTOCOL_DIR}/conformance.json"))
            .expect("conformance.json"),
    )
    .expect("conformance json");
    let capability = &conformance["capability"];
    (
        capability["apiKey"].as_str().expect("apiKey").to_owned(),
        capability["token"].as_str().expect("token").to_owned(),
        capability["claims"].clone(),
    )
}

fn start(mode: &str) -> FakeEpode {
    FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, mode))
}

fn telemetry_url(fake: &FakeEpode) -> String {
    fake.endpoint_url(Endpoint::Telemetry)
}

fn good_report() -> Value {
    json!({
        "summary": "The search tool returned the right results quickly.",
        "impact": "helped",
        "confidence": 0.8,
        "findings": [{"kind": "strength", "topic": "search", "detail": "Fast and relevant."}],
    })
}

// ---------------------------------------------------------------------------------------
// Capability verification and subject derivation
// ---------------------------------------------------------------------------------------

#[test]
fn conformance_vector_is_reproduced_and_verified_independently() {
    let (key, token, claims) = vector();
    assert_eq!(mint_handle(&key, &claims).as_deref(), Some(token.as_str()));
    assert!(token.ends_with(".wxJ0YGS21x9eW-Cn33t9V1INhyGNj1_U3qoQns3vdWA"));
    let verified = verify_handle(&key, &token, 1_715_000_060).expect("vector verifies");
    assert_eq!(verified.i, "018f1f2e-7b4a-7c12-9c8d-123456789abc");
    assert_eq!((verified.iat, verified.exp), (1_715_000_000, 1_715_007_200));
    assert_eq!(verified.s, None);
    assert_eq!(decode_handle(&token), Some(claims));
    // Boundaries of the validity window.
    assert!(verify_handle(&key, &token, 1_715_007_199).is_ok());
    assert!(verify_handle(&key, &token, 1_715_007_200).is_err());
    assert!(verify_handle(&key, &token, 1_715_000_000 - 300).is_ok());
    assert!(verify_handle(&key, &token, 1_715_000_000 - 301).is_err());
    assert!(verify_handle(DEMO_PRODUCT_KEY, &token, 1_715_000_060).is_err());
}

#[test]
fn consent_subjects_match_an_independent_reference() {
    // Expected values computed with Python's hmac/hashlib from contract §2 step 5.
    let (key, _, _) = vector();
    let legacy = "afsub1_VcjuPNrN_45bCJ84wsfDD_dzPTqfmDPI6VdbrEuKTWQ";
    assert_eq!(
        consent_subject(&key, "customer_42").as_deref(),
        Some(legacy)
    );
    assert_eq!(
        consent_subject(&key, "  customer_42\t").as_deref(),
        Some(legacy)
    );
    assert_eq!(
        consent_subject(DEMO_PRODUCT_KEY, "acct_7").as_deref(),
        Some("afsub1_J1gTAtPQkR9vzWL13HFEpq2CcI1llmIVFEFeDyU36JM")
    );
    assert_eq!(
        product_key_parts(&key),
        Some((
            "0123456789abcdef0123456789abcdef".to_owned(),
            "0123456789abcdef0123456789abcdef".to_owned()
        ))
    );
    assert_eq!(
        product_key_parts(DEMO_PRODUCT_KEY).map(|parts| parts.1),
        Some("fedcba9876543210fedcba9876543210".to_owned())
    );
    assert_eq!(
        product_key_parts("af_live_0123456789ABCDEF0123456789abcdef_secret_that_is_long_enough")
            .map(|parts| parts.0),
        Some("0123456789abcdef0123456789abcdef".to_owned())
    );
    // A scope followed by a too-short secret makes the whole tail the (legacy) secret.
    assert_eq!(
        product_key_parts(
            "af_live_0123456789abcdef0123456789abcdef_fedcba9876543210fedcba9876543210_short"
        )
        .map(|parts| parts.1),
        Some("0123456789abcdef0123456789abcdef".to_owned())
    );
    assert_eq!(product_key_parts("af_live_0123_short"), None);
    assert_eq!(
        product_key_parts("af_read_0123456789abcdef0123456789abcdef_secret_long_enough_x"),
        None
    );
}

#[tokio::test]
async fn conformance_vector_decision_is_accepted_in_ask_always() {
    let (key, token, _) = vector();
    let fake = FakeEpode::start(
        FakeConfig::new(key, "ask_always")
            .with_now(VECTOR_NOW)
            .with_public_base_url("https://epode.test"),
    );
    let url = fake.endpoint_url(Endpoint::ConsentDecisions);
    let response = post(&url, Some(&token), &json!({"decision": "approved"})).await;
    assert_eq!(response.status, 200, "{}", response.text);
    assert_eq!(response.header("cache-control"), "private, no-store");
    let body = response.json();
    assert_eq!(body["state"], "approved");
    assert_eq!(body["changed"], true);
    assert_eq!(body["decidedAt"], "2024-05-06T12:54:20Z");
    let feedback = &body["feedback"];
    assert_eq!(feedback["state"], "feedback_ready");
    assert_eq!(feedback["mode"], "never_ask");
    assert_eq!(feedback["configuredMode"], "ask_always");
    assert_eq!(feedback["consentManagedBy"], "epode");
    assert_eq!(feedback["reliability"], "best_effort_without_agent_adapter");
    assert_eq!(feedback["expiresAt"], "2024-05-06T14:53:20+00:00");
    assert_eq!(
        feedback["submit"]["url"],
        "https://epode.test/api/v2/reports"
    );
    assert_eq!(
        feedback["submit"]["authorization"],
        format!("Bearer {token}")
    );
    assert_eq!(feedback["submit"]["reportSchema"]["maxFindings"], 8);
    // The envelope satisfies the published envelope schema.
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{PROTOCOL_DIR}/envelope.schema.json")).expect("schema"),
    )
    .expect("schema json");
    let validator = jsonschema::validator_for(&schema).expect("envelope schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(feedback)
        .map(|error| error.to_string())
        .collect();
    assert!(errors.is_empty(), "{errors:?}");

    let decisions = fake.decisions();
    assert_eq!(decisions.len(), 1);
    assert_eq!(
        decisions[0].interaction_id,
        "018f1f2e-7b4a-7c12-9c8d-123456789abc"
    );
    assert_eq!(decisions[0].decision, "approved");

    // The same handle then submits the report.
    let report = post(
        &fake.endpoint_url(Endpoint::Reports),
        Some(&token),
        &good_report(),
    )
    .await;
    assert_eq!(report.status, 200, "{}", report.text);

    // Without the clock override the vector is long expired.
    fake.set_now(None);
    post(&url, Some(&token), &json!({"decision": "approved"}))
        .await
        .assert_error(401, "Authentication required");
}

#[tokio::test]
async fn invalid_capabilities_get_401() {
    let fake = start("ask_always");
    let decisions = fake.endpoint_url(Endpoint::ConsentDecisions);
    let reports = fake.endpoint_url(Endpoint::Reports);
    let now = unix_now();
    let id = new_id();
    let valid = fake.mint(&id, None);
    let claims = |iat: i64, exp: i64| json!({"v": 1, "i": id, "iat": iat, "exp": exp, "n": "AQIDBAUGBwgJCgsMDQ4PEBES"});
    let mint = |value: Value| mint_handle(DEMO_PRODUCT_KEY, &value).expect("mint");
    let other_key =
        "af_live_0123456789abcdef0123456789abcdef_fedcba9876543210fedcba9876543210_another_secret_value";
    let other_key_id = "af_live_ffffffffffffffffffffffffffffffff_another_secret_value_123";

    let mut tampered_signature = valid.clone();
    let last = tampered_signature.pop().expect("char");
    tampered_signature.push(if last == 'A' { 'B' } else { 'A' });
    let parts: Vec<&str> = valid.split('.').collect();
    let mut forged_claims = claims(now, now + 3600);
    forged_claims["i"] = json!(new_id());
    let tampered_payload = format!(
        "{}.{}.{}",
        parts[0],
        base64_url(&serde_json::to_vec(&forged_claims).expect("json")),
        parts[2]
    );
    let mut with_extra = claims(now, now + 3600);
    with_extra["x"] = json!(1);
    let mut short_nonce = claims(now, now + 3600);
    short_nonce["n"] = json!("too-short");
    let mut v2 = claims(now, now + 3600);
    v2["v"] = json!(2);
    let mut r_without_s = claims(now, now + 3600);
    r_without_s["r"] = json!(0);
    let mut bad_subject = claims(now, now + 3600);
    bad_subject["s"] = json!("afsub1_short");
    let mut negative_r = claims(now, now + 3600);
    negative_r["s"] = json!(fake.subject_for("acct_1").expect("subject"));
    negative_r["r"] = json!(-1);

    let cases: Vec<(&str, String)> = vec![
        ("tampered signature", tampered_signature),
        ("tampered payload", tampered_payload),
        ("expired", mint(claims(now - 7200, now - 1))),
        ("lifetime over 2 h", mint(claims(now, now + 7201))),
        ("issued in the future", mint(claims(now + 400, now + 3600))),
        ("exp before iat", mint(claims(now, now - 10))),
        ("unknown claim", mint(with_extra)),
        ("short nonce", mint(short_nonce)),
        ("v = 2", mint(v2)),
        ("r without s", mint(r_without_s)),
        ("malformed subject", mint(bad_subject)),
        ("negative r", mint(negative_r)),
        (
            "other key, same keyId",
            mint_handle(other_key, &claims(now, now + 3600)).expect("mint"),
        ),
        (
            "unknown keyId",
            mint_handle(other_key_id, &claims(now, now + 3600)).expect("mint"),
        ),
        ("extra segment", format!("{valid}.x")),
        ("not a capability", DEMO_PRODUCT_KEY.to_owned()),
        ("garbage", "afr2_%%%".to_owned()),
    ];
    for (name, token) in &cases {
        let response = post(&decisions, Some(token), &json!({"decision": "approved"})).await;
        assert_eq!(response.status, 401, "{name}: {}", response.text);
        response.assert_error(401, "Authentication required");
        post(&reports, Some(token), &good_report())
            .await
            .assert_error(401, "Authentication required");
    }
    // Missing or wrongly-cased scheme.
    post(&decisions, None, &json!({"decision": "approved"}))
        .await
        .assert_error(401, "Authentication required");
    let lowercase_scheme = send(
        client()
            .post(&decisions)
            .header("content-type", "application/json")
            .header("authorization", format!("bearer {valid}"))
            .body(r#"{"decision":"approved"}"#),
    )
    .await;
    lowercase_scheme.assert_error(401, "Authentication required");
    // x-api-key is accepted as a fallback carrier, as in the real service.
    let via_api_key = send(
        client()
            .post(&decisions)
            .header("content-type", "application/json")
            .header("x-api-key", &valid)
            .body(r#"{"decision":"approved"}"#),
    )
    .await;
    assert_eq!(via_api_key.status, 200, "{}", via_api_key.text);
    assert!(fake.verify(&valid).is_ok());
    // An expired product key invalidates its capabilities.
    fake.set_key_expired(true);
    post(&reports, Some(&valid), &good_report())
        .await
        .assert_error(401, "Authentication required");
    assert_eq!(fake.decisions().len(), 1);
}

fn base64_url(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

// ---------------------------------------------------------------------------------------
// Consent decisions
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn decisions_conflict_unless_an_ask_mode() {
    let fake = start("never_ask");
    let url = fake.endpoint_url(Endpoint::ConsentDecisions);
    let handle = fake.mint(&new_id(), None);
    let message = "This product does not currently require a consent decision";
    post(&url, Some(&handle), &json!({"decision": "approved"}))
        .await
        .assert_error(409, message);
    fake.set_mode("off");
    post(&url, Some(&handle), &json!({"decision": "declined"}))
        .await
        .assert_error(409, message);
    fake.set_mode("ask_once");
    let response = post(&url, Some(&handle), &json!({"decision": "declined"})).await;
    assert_eq!(response.status, 200);
    assert_eq!(response.json()["feedback"], Value::Null);
}

#[tokio::test]
async fn decision_body_must_be_exactly_a_decision() {
    let fake = start("ask_always");
    let url = fake.endpoint_url(Endpoint::ConsentDecisions);
    let handle = fake.mint(&new_id(), None);
    for body in [
        json!({}),
        json!([]),
        json!("approved"),
        json!({"decision": "approved", "note": "x"}),
        json!({"decision": true}),
        json!({"decision": null}),
    ] {
        let response = post(&url, Some(&handle), &body).await;
        assert_eq!(response.status, 400, "{body}: {}", response.text);
        assert!(response.json()["error"].is_string());
    }
    post(&url, Some(&handle), &json!({"decision": "maybe"}))
        .await
        .assert_error(400, "decision must be approved or declined");
    post(
        &url,
        Some(&handle),
        &json!({"decision": "approved", "user": "x"}),
    )
    .await
    .assert_error(
        400,
        "Raw prompts, transcripts, secrets, customer data, and tool payloads are not accepted",
    );
    // The body is validated before the capability is verified.
    post(&url, Some("afr2_bogus"), &json!({"decision": "maybe"}))
        .await
        .assert_error(400, "decision must be approved or declined");
    assert!(fake.decisions().is_empty());
}

#[tokio::test]
async fn first_decision_per_interaction_wins() {
    let fake = start("ask_always");
    let url = fake.endpoint_url(Endpoint::ConsentDecisions);
    let approved = fake.mint(&new_id(), None);
    let first = post(&url, Some(&approved), &json!({"decision": "approved"}))
        .await
        .json();
    assert_eq!(
        (first["state"].clone(), first["changed"].clone()),
        (json!("approved"), json!(true))
    );
    assert!(first["feedback"].is_object());
    let again = post(&url, Some(&approved), &json!({"decision": "declined"}))
        .await
        .json();
    assert_eq!(again["state"], "approved");
    assert_eq!(again["changed"], false);
    assert_eq!(again["decidedAt"], first["decidedAt"]);
    assert_eq!(
        again["feedback"]["submit"]["authorization"],
        format!("Bearer {approved}")
    );

    let declined = fake.mint(&new_id(), None);
    let first = post(&url, Some(&declined), &json!({"decision": "declined"}))
        .await
        .json();
    assert_eq!(first["state"], "declined");
    assert_eq!(first["changed"], true);
    assert_eq!(first["feedback"], Value::Null);
    let again = post(&url, Some(&declined), &json!({"decision": "approved"}))
        .await
        .json();
    assert_eq!(again["state"], "declined");
    assert_eq!(again["changed"], false);
    assert_eq!(again["feedback"], Value::Null);

    let decisions = fake.decisions();
    assert_eq!(decisions.len(), 2);
    assert_eq!(decisions[0].decision, "approved");
    assert_eq!(decisions[1].decision, "declined");
    assert_eq!(fake.counters().decisions_recorded, 2);
}

#[tokio::test]
async fn ask_once_subjects_use_compare_and_set() {
    let fake = start("ask_once");
    let url = fake.endpoint_url(Endpoint::ConsentDecisions);
    let state_url = fake.endpoint_url(Endpoint::ConsentState);
    let subject = fake.subject_for("acct_1").expect("subject");
    let key = DEMO_PRODUCT_KEY;
    let state = || async {
        post(&state_url, Some(key), &json!({ "subject": subject }))
            .await
            .json()
    };
    assert_eq!(state().await, json!({"state": "unknown", "revision": 0}));

    // r = 0 creates the subject.
    let h1 = fake.mint(&new_id(), Some((&subject, 0)));
    let body = post(&url, Some(&h1), &json!({"decision": "approved"}))
        .await
        .json();
    assert_eq!(
        (body["state"].clone(), body["changed"].clone()),
        (json!("approved"), json!(true))
    );
    assert!(body["feedback"].is_object());
    assert_eq!(body["feedback"]["configuredMode"], "ask_once");
    assert_eq!(state().await, json!({"state": "approved", "revision": 1}));

    // A second r = 0 signer is stale: current state, no report action.
    let h2 = fake.mint(&new_id(), Some((&subject, 0)));
    let body = post(&url, Some(&h2), &json!({"decision": "declined"}))
        .await
        .json();
    assert_eq!(body["state"], "approved");
    assert_eq!(body["changed"], false);
    assert_eq!(body["feedback"], Value::Null);

    // r = current revision changes the subject and bumps the revision.
    let h3 = fake.mint(&new_id(), Some((&subject, 1)));
    let body = post(&url, Some(&h3), &json!({"decision": "declined"}))
        .await
        .json();
    assert_eq!(
        (body["state"].clone(), body["changed"].clone()),
        (json!("declined"), json!(true))
    );
    assert_eq!(body["feedback"], Value::Null);
    assert_eq!(state().await, json!({"state": "declined", "revision": 2}));

    // Stale again.
    let h4 = fake.mint(&new_id(), Some((&subject, 1)));
    let body = post(&url, Some(&h4), &json!({"decision": "approved"}))
        .await
        .json();
    assert_eq!(
        (body["state"].clone(), body["changed"].clone()),
        (json!("declined"), json!(false))
    );
    assert_eq!(body["feedback"], Value::Null);

    // Flip back to approved: the envelope carries the caution.
    let h5 = fake.mint(&new_id(), Some((&subject, 2)));
    let body = post(&url, Some(&h5), &json!({"decision": "approved"}))
        .await
        .json();
    assert_eq!(body["state"], "approved");
    let instruction = body["feedback"]["instruction"]
        .as_str()
        .expect("instruction");
    assert!(
        instruction.contains("replaced an earlier decline"),
        "{instruction}"
    );
    let subject_state = fake.subject_state(&subject).expect("subject");
    assert_eq!(subject_state.revision, 3);
    assert_eq!(subject_state.flipped_from.as_deref(), Some("declined"));

    // The first handle's approval no longer applies to the current revision.
    let body = post(&url, Some(&h1), &json!({"decision": "approved"}))
        .await
        .json();
    assert_eq!(
        (body["state"].clone(), body["changed"].clone()),
        (json!("approved"), json!(false))
    );
    assert_eq!(body["feedback"], Value::Null);

    // An approved subject lets any of its interactions report without a decision.
    let h6 = fake.mint(&new_id(), Some((&subject, 3)));
    let report = post(
        &fake.endpoint_url(Endpoint::Reports),
        Some(&h6),
        &good_report(),
    )
    .await;
    assert_eq!(report.status, 200, "{}", report.text);
    let other = fake.subject_for("acct_2").expect("subject");
    let h7 = fake.mint(&new_id(), Some((&other, 0)));
    post(
        &fake.endpoint_url(Endpoint::Reports),
        Some(&h7),
        &good_report(),
    )
    .await
    .assert_error(
        403,
        "Ask-once feedback requires an approved Epode consent decision",
    );
    // Without a subject, ask_once falls back to a per-interaction decision.
    let h8 = fake.mint(&new_id(), None);
    post(
        &fake.endpoint_url(Endpoint::Reports),
        Some(&h8),
        &good_report(),
    )
    .await
    .assert_error(
        403,
        "Ask-once feedback requires an approved Epode consent decision",
    );
    post(&url, Some(&h8), &json!({"decision": "approved"})).await;
    let report = post(
        &fake.endpoint_url(Endpoint::Reports),
        Some(&h8),
        &good_report(),
    )
    .await;
    assert_eq!(report.status, 200, "{}", report.text);
}

#[tokio::test]
async fn consent_state_endpoint() {
    let fake = start("ask_once");
    let url = fake.endpoint_url(Endpoint::ConsentState);
    let subject = fake.subject_for("acct_9").expect("subject");
    post(
        &url,
        Some(DEMO_PRODUCT_KEY),
        &json!({ "subject": "afsub1_nope" }),
    )
    .await
    .assert_error(400, "Invalid opaque consent subject");
    let extra = post(
        &url,
        Some(DEMO_PRODUCT_KEY),
        &json!({ "subject": subject, "x": 1 }),
    )
    .await;
    assert_eq!(extra.status, 400);
    post(&url, Some("af_live_wrong"), &json!({ "subject": subject }))
        .await
        .assert_error(401, "Invalid API key");
    let handle = fake.mint(&new_id(), None);
    post(&url, Some(&handle), &json!({ "subject": subject }))
        .await
        .assert_error(401, "Invalid API key");
    fake.seed_subject(&subject, "approved", 3);
    assert_eq!(
        post(&url, Some(DEMO_PRODUCT_KEY), &json!({ "subject": subject }))
            .await
            .json(),
        json!({"state": "approved", "revision": 3})
    );
    fake.set_mode("never_ask");
    assert_eq!(
        post(&url, Some(DEMO_PRODUCT_KEY), &json!({ "subject": subject }))
            .await
            .json(),
        json!({"state": "approved", "revision": 0})
    );
    fake.set_mode("ask_always");
    assert_eq!(
        post(&url, Some(DEMO_PRODUCT_KEY), &json!({ "subject": subject }))
            .await
            .json(),
        json!({"state": "unknown", "revision": 0})
    );
}

#[tokio::test]
async fn approval_reports_protocol_tool_only_after_mcp_telemetry() {
    let fake = start("ask_always");
    let url = fake.endpoint_url(Endpoint::ConsentDecisions);
    let with_telemetry = new_id();
    let response = post(
        &telemetry_url(&fake),
        Some(DEMO_PRODUCT_KEY),
        &json!({ "events": [mcp_event(&with_telemetry)] }),
    )
    .await;
    assert_eq!(response.json(), json!({"accepted": 1, "dropped": 0}));
    let body = post(
        &url,
        Some(&fake.mint(&with_telemetry, None)),
        &json!({"decision": "approved"}),
    )
    .await
    .json();
    assert_eq!(body["feedback"]["reliability"], "protocol_tool");
    let body = post(
        &url,
        Some(&fake.mint(&new_id(), None)),
        &json!({"decision": "approved"}),
    )
    .await
    .json();
    assert_eq!(
        body["feedback"]["reliability"],
        "best_effort_without_agent_adapter"
    );
}

// ---------------------------------------------------------------------------------------
// Reports
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn report_shape_and_duplicates_return_the_first() {
    let fake = start("never_ask");
    let url = fake.endpoint_url(Endpoint::Reports);
    let id = new_id();
    let handle = fake.mint(&id, None);
    let response = post(
        &url,
        Some(&handle),
        &json!({"summary": "  Worked   well\nfor the task  "}),
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.text);
    assert_eq!(response.header("cache-control"), "private, no-store");
    let body = response.json();
    assert_eq!(body["accepted"], true);
    assert_eq!(body["interactionId"], id);
    let report = &body["report"];
    let keys: Vec<&str> = report
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "id",
            "workspaceId",
            "interactionId",
            "summary",
            "impact",
            "confidence",
            "findings",
            "workaround",
            "source",
            "createdAt"
        ]
    );
    assert_eq!(report["summary"], "Worked well for the task");
    assert_eq!(report["workspaceId"], FAKE_WORKSPACE_ID);
    assert_eq!(report["impact"], Value::Null);
    assert_eq!(report["confidence"], Value::Null);
    assert_eq!(report["findings"], json!([]));
    assert_eq!(report["workaround"], Value::Null);
    assert_eq!(report["source"], "customer_agent");
    assert!(fake_epode::parse_rfc3339(report["createdAt"].as_str().expect("createdAt")).is_some());

    let duplicate = post(&url, Some(&handle), &good_report()).await;
    assert_eq!(duplicate.status, 200);
    assert_eq!(duplicate.json()["report"], *report);
    assert_eq!(fake.reports(), vec![report.clone()]);
    let counters = fake.counters();
    assert_eq!(
        (counters.reports_accepted, counters.duplicate_reports),
        (1, 1)
    );

    // Normalised optional fields.
    let full = post(
        &url,
        Some(&fake.mint(&new_id(), None)),
        &json!({
            "summary": "Mostly worked, one rough edge.",
            "impact": "helped_with_friction",
            "confidence": 1,
            "findings": [{"kind": "friction", "topic": "paging", "detail": "  Needed   two calls ", "severity": "minor"},
                         {"kind": "gap", "topic": "export", "detail": "No CSV export."}],
            "workaround": {"used": false},
        }),
    )
    .await
    .json();
    let report = &full["report"];
    assert_eq!(report["confidence"], json!(1.0));
    assert_eq!(
        report["findings"],
        json!([
            {"kind": "friction", "topic": "paging", "severity": "minor", "detail": "Needed two calls"},
            {"kind": "gap", "topic": "export", "severity": null, "detail": "No CSV export."}
        ])
    );
    assert_eq!(report["workaround"], json!({"used": false, "detail": null}));
}

#[tokio::test]
async fn report_consent_gates_and_mode_off() {
    let fake = start("ask_always");
    let url = fake.endpoint_url(Endpoint::Reports);
    let decisions = fake.endpoint_url(Endpoint::ConsentDecisions);
    let forbidden = "Ask-every-time feedback requires an approved decision for this interaction";
    let handle = fake.mint(&new_id(), None);
    post(&url, Some(&handle), &good_report())
        .await
        .assert_error(403, forbidden);
    let declined = fake.mint(&new_id(), None);
    post(
        &decisions,
        Some(&declined),
        &json!({"decision": "declined"}),
    )
    .await;
    post(&url, Some(&declined), &good_report())
        .await
        .assert_error(403, forbidden);
    post(&decisions, Some(&handle), &json!({"decision": "approved"})).await;
    assert_eq!(post(&url, Some(&handle), &good_report()).await.status, 200);

    fake.set_mode("off");
    post(&url, Some(&fake.mint(&new_id(), None)), &good_report())
        .await
        .assert_error(410, "Feedback collection is disabled");
    // Verification comes before the mode check.
    post(&url, Some("afr2_x.y.z"), &good_report())
        .await
        .assert_error(401, "Authentication required");
    assert_eq!(fake.reports().len(), 1);
}

#[tokio::test]
async fn invalid_reports_get_400() {
    let fake = start("never_ask");
    let url = fake.endpoint_url(Endpoint::Reports);
    let handle = fake.mint(&new_id(), None);
    let sensitive = "The feedback report appears to contain sensitive data";
    let nine: Vec<Value> = (0..9)
        .map(|n| json!({"kind": "other", "topic": format!("t{n}"), "detail": "detail"}))
        .collect();
    let cases = vec![
        (json!({}), None),
        (json!({"summary": "short"}), None),
        (json!({"summary": "x".repeat(701)}), None),
        (json!({"summary": "Long enough summary", "outcome": "success"}), None),
        (json!({"summary": "Long enough summary", "note": "legacy"}), None),
        (json!({"summary": "Long enough summary", "impact": "great"}), None),
        (json!({"summary": "Long enough summary", "confidence": 1.5}), None),
        (json!({"summary": "Long enough summary", "confidence": null}), None),
        (json!({"summary": "Long enough summary", "findings": nine}), None),
        (json!({"summary": "Long enough summary", "findings": [{"kind": "gap", "topic": "Bad Topic", "detail": "abc"}]}), None),
        (json!({"summary": "Long enough summary", "findings": [{"kind": "gap", "topic": "ok"}]}), None),
        (json!({"summary": "Long enough summary", "findings": [{"kind": "gap", "topic": "ok", "detail": "abc", "severity": "huge"}]}), None),
        (json!({"summary": "Long enough summary", "workaround": {"used": true}}), None),
        (json!({"summary": "Long enough summary", "workaround": {"used": true, "detail": "    "}}), None),
        (json!({"summary": "  a      b      "}), Some("summary must contain 8 to 700 characters")),
        (json!({"summary": "Contact jane.doe@example.com about it"}), Some(sensitive)),
        (json!({"summary": "Long enough summary", "findings": [{"kind": "defect", "topic": "auth", "detail": "The password was shown"}]}), Some(sensitive)),
        (json!({"summary": "Long enough summary", "workaround": {"used": true, "detail": "used af_live_abc"}}), Some(sensitive)),
        (json!({"summary": "Long enough summary", "prompt": "secret stuff"}), Some("Raw prompts, transcripts, secrets, customer data, and tool payloads are not accepted")),
        (json!({"summary": "Long enough summary", "findings": [{"kind": "gap", "topic": "ok", "detail": "abc", "Raw-Input": 1}]}), Some("Raw prompts, transcripts, secrets, customer data, and tool payloads are not accepted")),
    ];
    for (body, message) in cases {
        let response = post(&url, Some(&handle), &body).await;
        assert_eq!(response.status, 400, "{body}: {}", response.text);
        match message {
            Some(message) => response.assert_error(400, message),
            None => assert!(response.json()["error"].is_string(), "{}", response.text),
        }
    }
    // The body is validated before the capability.
    post(
        &url,
        Some("afr2_bogus"),
        &json!({"summary": "Contact a@b.io now"}),
    )
    .await
    .assert_error(400, sensitive);
    assert!(fake.reports().is_empty());
}

#[tokio::test]
async fn foreign_interactions_conflict() {
    let fake = start("ask_always");
    let id = new_id();
    fake.mark_foreign(&id);
    let handle = fake.mint(&id, None);
    post(
        &fake.endpoint_url(Endpoint::ConsentDecisions),
        Some(&handle),
        &json!({"decision": "approved"}),
    )
    .await
    .assert_error(409, "interactionId belongs to another product environment");
    fake.set_mode("never_ask");
    post(
        &fake.endpoint_url(Endpoint::Reports),
        Some(&handle),
        &good_report(),
    )
    .await
    .assert_error(409, "interactionId belongs to another product environment");
    let receipt = post(
        &telemetry_url(&fake),
        Some(DEMO_PRODUCT_KEY),
        &json!({ "events": [mcp_event(&id)] }),
    )
    .await;
    assert_eq!(receipt.json(), json!({"accepted": 0, "dropped": 1}));
}

#[tokio::test]
async fn introspection_reports_the_verified_state() {
    let fake = start("ask_always");
    let url = fake.endpoint_url(Endpoint::Introspect);
    let handle = fake.mint(&new_id(), None);
    let inspect = |token: String| {
        let url = url.clone();
        async move {
            send(
                client()
                    .post(url)
                    .header("authorization", format!("Bearer {token}")),
            )
            .await
        }
    };
    let body = inspect(handle.clone()).await.json();
    assert_eq!(body["state"], "consent_required");
    assert_eq!(body["consentPolicy"], "always");
    assert!(body["canonicalQuestion"]
        .as_str()
        .expect("question")
        .starts_with("May I send Demo Product's provider"));
    post(
        &fake.endpoint_url(Endpoint::ConsentDecisions),
        Some(&handle),
        &json!({"decision": "approved"}),
    )
    .await;
    let body = inspect(handle.clone()).await.json();
    assert_eq!(body["state"], "feedback_ready");
    assert_eq!(body["canonicalQuestion"], Value::Null);
    assert_eq!(inspect("afr2_nope".into()).await.status, 401);
    fake.set_mode("off");
    inspect(handle)
        .await
        .assert_error(410, "Feedback collection is disabled");
}

// ---------------------------------------------------------------------------------------
// Telemetry
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn telemetry_is_accepted_and_upserted_in_arrival_order() {
    let fake = start("never_ask");
    let url = telemetry_url(&fake);
    let (a, b, c) = (new_id(), new_id(), new_id());
    let batch = json!({ "events": [mcp_event(&b), mcp_event(&a)] });
    let response = post(&url, Some(DEMO_PRODUCT_KEY), &batch).await;
    assert_eq!(response.status, 202, "{}", response.text);
    assert_eq!(response.json(), json!({"accepted": 2, "dropped": 0}));
    // A retry resends the identical batch; the x-api-key carrier works too.
    let retry = send(
        client()
            .post(&url)
            .header("content-type", "application/json")
            .header("x-api-key", DEMO_PRODUCT_KEY)
            .body(serde_json::to_vec(&batch).expect("json")),
    )
    .await;
    assert_eq!(retry.json(), json!({"accepted": 2, "dropped": 0}));
    let mut http = json!({
        "interactionId": c,
        "surface": "http_json",
        "operation": "/orders/:id",
        "classification": "unclassified",
        "occurredAt": timestamp(-60),
        "durationMs": 12,
        "customerRef": "acct_1",
        "accountRef": "acct_1",
        "userRef": "user_1",
        "sequence": 3,
    });
    let response = post(
        &url,
        Some(DEMO_PRODUCT_KEY),
        &json!({ "events": [http.clone()] }),
    )
    .await;
    assert_eq!(response.json(), json!({"accepted": 1, "dropped": 0}));
    // The same id again with an extra field fills it in; first values win.
    http["statusCode"] = json!(204);
    http["durationMs"] = json!(99);
    post(&url, Some(DEMO_PRODUCT_KEY), &json!({ "events": [http] })).await;

    let events = fake.events();
    let ids: Vec<&str> = events
        .iter()
        .map(|event| event["interactionId"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, [b.as_str(), a.as_str(), c.as_str()]);
    assert_eq!(events[2]["statusCode"], 204);
    assert_eq!(events[2]["durationMs"], 12);
    assert_eq!(fake.deliveries().len(), 6);
    let recorded = fake.requests(Endpoint::Telemetry);
    assert_eq!(recorded.len(), 4);
    assert_eq!(
        recorded[0].header("Authorization"),
        Some(format!("Bearer {DEMO_PRODUCT_KEY}").as_str())
    );
    assert_eq!(recorded[0].body, batch);
    assert_eq!(recorded[0].status, 202);
    assert!(recorded[0].at <= recorded[1].at);

    // 100 events are fine.
    let hundred: Vec<Value> = (0..100).map(|_| mcp_event(&new_id())).collect();
    let response = post(&url, Some(DEMO_PRODUCT_KEY), &json!({ "events": hundred })).await;
    assert_eq!(response.json(), json!({"accepted": 100, "dropped": 0}));
    assert_eq!(fake.wait_for_events(103, Duration::from_secs(1)).len(), 103);
}

#[tokio::test]
async fn telemetry_requires_the_product_key() {
    let fake = start("never_ask");
    let url = telemetry_url(&fake);
    let batch = json!({ "events": [mcp_event(&new_id())] });
    post(&url, None, &batch)
        .await
        .assert_error(401, "Invalid API key");
    post(
        &url,
        Some("af_live_0123456789abcdef0123456789abcdef_wrong_secret_wrong_secret"),
        &batch,
    )
    .await
    .assert_error(401, "Invalid API key");
    let handle = fake.mint(&new_id(), None);
    post(&url, Some(&handle), &batch)
        .await
        .assert_error(401, "Invalid API key");
    fake.set_key_expired(true);
    post(&url, Some(DEMO_PRODUCT_KEY), &batch)
        .await
        .assert_error(401, "API key expired");
    assert!(fake.events().is_empty());
}

#[tokio::test]
async fn invalid_telemetry_batches_get_400() {
    let fake = start("never_ask");
    let url = telemetry_url(&fake);
    let forbidden =
        "Raw prompts, transcripts, secrets, customer data, and tool payloads are not accepted";
    let with = |key: &str, value: Value| {
        let mut event = mcp_event(&new_id());
        event[key] = value;
        json!({ "events": [event] })
    };
    let without = |key: &str| {
        let mut event = mcp_event(&new_id());
        event.as_object_mut().expect("object").remove(key);
        json!({ "events": [event] })
    };
    let too_many: Vec<Value> = (0..101).map(|_| mcp_event(&new_id())).collect();
    let cases = vec![
        (json!({}), None),
        (
            json!({"events": []}),
            Some("events must contain between 1 and 100 interactions"),
        ),
        (
            json!({ "events": too_many }),
            Some("events must contain between 1 and 100 interactions"),
        ),
        (json!({"events": [mcp_event(&new_id())], "extra": 1}), None),
        (with("interactionId", json!("not-a-uuid")), None),
        (with("surface", json!("grpc")), None),
        (with("statusCode", json!(700)), None),
        (with("sequence", json!(0)), None),
        (with("occurredAt", json!("yesterday")), None),
        (with("accountRef", json!("a@b.example")), None),
        (with("outcome", json!("success")), None),
        (with("runtimeHint", json!("")), None),
        (with("durationMs", json!(u64::MAX)), None),
        (without("occurredAt"), None),
        (without("classification"), None),
        (
            with("experience", json!({"needState": {"Name": "x"}})),
            Some(forbidden),
        ),
        (
            json!({"events": [mcp_event(&new_id())], "user": "x"}),
            Some(forbidden),
        ),
    ];
    for (body, message) in cases {
        let response = post(&url, Some(DEMO_PRODUCT_KEY), &body).await;
        assert_eq!(response.status, 400, "{body}: {}", response.text);
        match message {
            Some(message) => response.assert_error(400, message),
            None => assert!(response.json()["error"].is_string(), "{}", response.text),
        }
    }
    assert!(fake.events().is_empty());
}

#[tokio::test]
async fn telemetry_drops_bad_events_individually() {
    let fake = start("never_ask");
    let url = telemetry_url(&fake);
    let foreign = new_id();
    fake.mark_foreign(&foreign);
    let with = |pairs: &[(&str, Value)]| {
        let mut event = mcp_event(&new_id());
        for (key, value) in pairs {
            event[*key] = value.clone();
        }
        event
    };
    let good_future = with(&[("occurredAt", json!(timestamp(240)))]);
    let good_old = with(&[("occurredAt", json!(timestamp(-6 * 86_400)))]);
    let good_linked = with(&[
        ("customerRef", json!("acct_1")),
        ("accountRef", json!("acct_1")),
        ("runtimeHint", json!("python-mcp 2.0")),
        ("runtimeHintSource", json!("mcp")),
        ("sessionRef", json!("summary:1")),
        ("sessionSource", json!("mcp")),
    ]);
    let mut unclassified = mcp_event(&new_id());
    unclassified["classification"] = json!("unclassified");
    unclassified
        .as_object_mut()
        .expect("object")
        .remove("confirmationMethod");
    let bad = vec![
        with(&[
            ("customerRef", json!("acct_2")),
            ("accountRef", json!("acct_1")),
        ]),
        with(&[
            ("customerRef", json!("acct_2")),
            ("userRef", json!("user_1")),
        ]),
        with(&[("occurredAt", json!(timestamp(-8 * 86_400)))]),
        with(&[("occurredAt", json!(timestamp(600)))]),
        with(&[("operation", json!("get summary"))]),
        with(&[("operation", json!("get_summary?customer=42"))]),
        with(&[("runtimeHint", json!("go-mcp 1.2"))]),
        with(&[
            ("runtimeHint", json!("go-mcp 1.2")),
            ("runtimeHintSource", json!("http")),
        ]),
        with(&[("durationMs", json!(86_400_001))]),
        with(&[("requestObservation", json!({"method": "GET"}))]),
        with(&[("interactionId", json!(foreign))]),
        unclassified,
        json!({
            "interactionId": new_id(),
            "surface": "http_json",
            "operation": "/x",
            "classification": "confirmed",
            "confirmationMethod": "mcp",
            "occurredAt": timestamp(0),
        }),
    ];
    let mut events = vec![good_future.clone(), good_old.clone(), good_linked.clone()];
    events.extend(bad.iter().cloned());
    let response = post(&url, Some(DEMO_PRODUCT_KEY), &json!({ "events": events })).await;
    assert_eq!(response.status, 202);
    assert_eq!(
        response.json(),
        json!({"accepted": 3, "dropped": bad.len()})
    );
    assert_eq!(
        fake.events(),
        vec![good_future, good_old, good_linked.clone()]
    );
    let reasons: Vec<String> = fake
        .dropped_events()
        .into_iter()
        .map(|(_, reason)| reason)
        .collect();
    assert_eq!(reasons.len(), bad.len());
    assert!(reasons.contains(&"occurredAt is outside the accepted window".to_owned()));
    // The same interaction re-sent with a different customerRef is dropped.
    let mut conflicting = good_linked;
    conflicting["customerRef"] = json!("acct_3");
    conflicting["accountRef"] = json!("acct_3");
    let response = post(
        &url,
        Some(DEMO_PRODUCT_KEY),
        &json!({ "events": [conflicting] }),
    )
    .await;
    assert_eq!(response.json(), json!({"accepted": 0, "dropped": 1}));
    let counters = fake.counters();
    assert_eq!(
        (counters.events_accepted, counters.events_dropped),
        (3, bad.len() + 1)
    );
}

#[tokio::test]
async fn http_surface_events_are_unclassified_and_strict() {
    let fake = start("never_ask");
    let url = telemetry_url(&fake);
    let http = |surface: &str, pairs: &[(&str, Value)]| {
        let mut event = json!({
            "interactionId": new_id(),
            "surface": surface,
            "operation": "/search",
            "statusCode": 201,
            "durationMs": 3,
            "classification": "unclassified",
            "occurredAt": timestamp(0),
        });
        for (key, value) in pairs {
            event[*key] = value.clone();
        }
        event
    };
    let good = vec![
        http(
            "http_json",
            &[
                ("accountRef", json!("acme")),
                ("customerRef", json!("acme")),
            ],
        ),
        http("http_html", &[("operation", json!("/docs/:id"))]),
        http(
            "http_headers",
            &[
                ("anonymousRef", json!("anon.x")),
                ("runtimeHint", json!("curl")),
                ("runtimeHintSource", json!("http")),
            ],
        ),
        http(
            "http_html",
            &[
                ("anonymousRef", json!("anon.x")),
                ("sessionRef", json!("s1")),
                ("sessionSource", json!("customer")),
                ("customerLinkSource", json!("product_link_click")),
            ],
        ),
    ];
    let bad = [
        http("http_json", &[("classification", json!("confirmed"))]),
        http("http_json", &[("confirmationMethod", json!("mcp"))]),
        http("http_headers", &[("operation", json!("/search?q=1"))]),
        http("http_html", &[("operation", json!("/a b"))]),
        http("http_json", &[("operation", json!("/a%20b"))]),
        http(
            "http_json",
            &[
                ("runtimeHint", json!("curl")),
                ("runtimeHintSource", json!("mcp")),
            ],
        ),
        http(
            "http_json",
            &[
                ("customerRef", json!("other")),
                ("accountRef", json!("acme")),
            ],
        ),
    ];
    let mut events = good.clone();
    events.extend(bad.iter().cloned());
    let response = post(&url, Some(DEMO_PRODUCT_KEY), &json!({ "events": events })).await;
    assert_eq!(response.status, 202, "{}", response.text);
    assert_eq!(
        response.json(),
        json!({"accepted": good.len(), "dropped": bad.len()}),
        "dropped: {:?}",
        fake.dropped_events()
    );
    // A status outside 100..=599 (or a ref the schema refuses) fails the whole batch.
    let schema_bad = [
        ("statusCode", json!(99)),
        ("statusCode", json!(600)),
        ("statusCode", json!("200")),
        ("userRef", json!("has space")),
        ("durationMs", json!(-1)),
        ("classification", Value::Null),
        ("customerLinkSource", json!("product_link_click")),
    ];
    for (key, status) in schema_bad {
        let event = http("http_json", &[(key, status.clone())]);
        let response = post(&url, Some(DEMO_PRODUCT_KEY), &json!({ "events": [event] })).await;
        assert_eq!(
            response.status, 400,
            "statusCode {status}: {}",
            response.text
        );
    }
    // An unknown surface too.
    let event = http("http_xml", &[]);
    let response = post(&url, Some(DEMO_PRODUCT_KEY), &json!({ "events": [event] })).await;
    assert_eq!(response.status, 400, "{}", response.text);
}

#[test]
fn http_envelopes_validate_against_the_relaxed_schema() {
    let (_, token, _) = vector();
    let ok = feedback_envelope(
        "http://127.0.0.1:9",
        &token,
        "ask_always",
        false,
        false,
        1_715_007_260,
    );
    assert!(
        http_envelope_errors(&ok).is_empty(),
        "{:?}",
        http_envelope_errors(&ok)
    );
    let mut extra = ok.clone();
    extra["surprise"] = json!(1);
    assert!(
        !http_envelope_errors(&extra).is_empty(),
        "an unknown member must fail"
    );
    let mut mcp = ok.clone();
    mcp["reliability"] = json!("protocol_tool");
    assert!(
        !http_envelope_errors(&mcp).is_empty(),
        "the MCP reliability must fail"
    );
    let mut ftp = ok;
    ftp["submit"]["url"] = json!("ftp://127.0.0.1:9/api/v2/reports");
    assert!(
        !http_envelope_errors(&ftp).is_empty(),
        "a non-http URL must fail"
    );
}

// ---------------------------------------------------------------------------------------
// Transport-level behaviour
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn transport_errors_match_the_real_extractors() {
    let fake = start("never_ask");
    let url = telemetry_url(&fake);
    let batch = serde_json::to_vec(&json!({ "events": [mcp_event(&new_id())] })).expect("json");
    let with_type = |content_type: Option<&str>, body: Vec<u8>| {
        let mut request = client()
            .post(&url)
            .header("authorization", format!("Bearer {DEMO_PRODUCT_KEY}"))
            .body(body);
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        send(request)
    };
    for content_type in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
    ] {
        let response = with_type(content_type, batch.clone()).await;
        assert_eq!(response.status, 415, "{content_type:?}");
        assert!(response.header("content-type").starts_with("text/plain"));
    }
    for content_type in [
        "application/json; charset=utf-8",
        "application/vnd.epode+json",
    ] {
        let response = with_type(Some(content_type), batch.clone()).await;
        assert_eq!(response.status, 202, "{content_type}: {}", response.text);
    }
    let response = with_type(Some("application/json"), b"{\"events\": [".to_vec()).await;
    assert_eq!(response.status, 400);
    assert!(response.header("content-type").starts_with("text/plain"));
    assert!(response
        .text
        .starts_with("Failed to parse the request body as JSON"));
    let mut big = json!({ "events": [mcp_event(&new_id())], "pad": "x".repeat(70 * 1024) });
    let response = with_type(
        Some("application/json"),
        serde_json::to_vec(&big).expect("json"),
    )
    .await;
    assert_eq!(response.status, 413);
    assert!(response.header("content-type").starts_with("text/plain"));
    big["pad"] = json!("x".repeat(60 * 1024));
    // Under the limit the body is parsed (and rejected by the schema instead).
    let response = with_type(
        Some("application/json"),
        serde_json::to_vec(&big).expect("json"),
    )
    .await;
    assert_eq!(response.status, 400);
    assert!(response
        .header("content-type")
        .starts_with("application/json"));

    let not_found = send(client().post(format!("{}/api/v2/outcomes", fake.url()))).await;
    assert_eq!(not_found.status, 404);
    let not_found = send(client().get(format!("{}/api/v2/reports/", fake.url()))).await;
    assert_eq!(not_found.status, 404);
    let wrong_method = send(client().get(fake.endpoint_url(Endpoint::Reports))).await;
    assert_eq!(wrong_method.status, 405);
    assert_eq!(fake.requests(Endpoint::Other).len(), 2);
}

#[test]
fn works_from_a_plain_test_over_a_raw_socket() {
    let fake = start("never_ask");
    let body = serde_json::to_string(&json!({ "events": [mcp_event(&new_id())] })).expect("json");
    let mut stream = std::net::TcpStream::connect(fake.addr()).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    write!(
        stream,
        "POST /api/v2/telemetry/batches HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {DEMO_PRODUCT_KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    assert!(response.starts_with("HTTP/1.1 202"), "{response}");
    assert!(
        response.ends_with(r#"{"accepted":1,"dropped":0}"#),
        "{response}"
    );
    assert_eq!(fake.events().len(), 1);
}

#[tokio::test]
async fn bad_input_never_breaks_the_server() {
    let fake = start("ask_always");
    let endpoints = [
        Endpoint::Telemetry,
        Endpoint::ConsentDecisions,
        Endpoint::ConsentState,
        Endpoint::Reports,
        Endpoint::Introspect,
    ];
    let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
    let huge_claims =
        json!({"v": 1, "i": new_id(), "iat": 1e30, "exp": 1, "n": "AQIDBAUGBwgJCgsMDQ4PEBES"});
    let extreme_claims = json!({"v": 1, "i": new_id(), "iat": i64::MIN, "exp": i64::MAX, "n": "AQIDBAUGBwgJCgsMDQ4PEBES"});
    let tokens = [
        DEMO_PRODUCT_KEY.to_owned(),
        "afr2_".to_owned(),
        "afr2_....".to_owned(),
        mint_handle(DEMO_PRODUCT_KEY, &huge_claims).expect("mint"),
        mint_handle(DEMO_PRODUCT_KEY, &extreme_claims).expect("mint"),
        mint_handle(DEMO_PRODUCT_KEY, &json!([1, 2])).expect("mint"),
    ];
    let bodies: Vec<Vec<u8>> = vec![
        deep.into_bytes(),
        b"null".to_vec(),
        b"12345678901234567890123456789012345678901234567890".to_vec(),
        b"\"\\ud800\"".to_vec(),
        vec![0xff, 0xfe, 0x00],
        br#"{"events":[{"interactionId":1e400}]}"#.to_vec(),
        br#"{"summary":"abcdefghij","confidence":1e400}"#.to_vec(),
        br#"{"events":[{"interactionId":"018f1f2e-7b4a-7c12-9c8d-123456789abc","surface":"mcp","operation":"x","classification":"confirmed","confirmationMethod":"mcp","occurredAt":"9999-12-31T23:59:60.999999999999+23:59"}]}"#.to_vec(),
        br#"{"events":[{"interactionId":"018f1f2e-7b4a-7c12-9c8d-123456789abc","surface":"mcp","operation":"x","classification":"confirmed","confirmationMethod":"mcp","occurredAt":"0000-01-01T00:00:00Z","durationMs":18446744073709551615}]}"#.to_vec(),
    ];
    for endpoint in endpoints {
        for token in &tokens {
            for body in &bodies {
                let response = client()
                    .post(fake.endpoint_url(endpoint))
                    .header("content-type", "application/json")
                    .header("authorization", format!("Bearer {token}"))
                    .body(body.clone())
                    .send()
                    .await
                    .expect("the fake answers");
                let status = response.status().as_u16();
                assert!((200..500).contains(&status), "{endpoint:?}: {status}");
            }
        }
    }
    // Still healthy.
    let response = post(
        &telemetry_url(&fake),
        Some(DEMO_PRODUCT_KEY),
        &json!({ "events": [mcp_event(&new_id())] }),
    )
    .await;
    assert_eq!(response.status, 202);
}

// ---------------------------------------------------------------------------------------
// Fault injection
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn status_faults_are_consumed_in_order() {
    let fake = start("never_ask");
    let url = telemetry_url(&fake);
    fake.inject(Endpoint::Telemetry, Fault::Status(500));
    fake.inject(Endpoint::Telemetry, Fault::StatusRetryAfter(429, 7));
    fake.inject(Endpoint::Telemetry, Fault::Status(408));
    assert_eq!(fake.pending_faults(Endpoint::Telemetry), 3);
    let batch = json!({ "events": [mcp_event(&new_id())] });
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let response = post(&url, Some(DEMO_PRODUCT_KEY), &batch).await;
        if response.status != 202 {
            assert!(response.text.contains(FAULT_SECRET), "{}", response.text);
            assert!(response.json()["error"].is_string());
        }
        if response.status == 429 {
            assert_eq!(response.header("retry-after"), "7");
        }
        statuses.push(response.status);
    }
    assert_eq!(statuses, [500, 429, 408, 202]);
    assert_eq!(fake.events().len(), 1);
    assert_eq!(fake.deliveries().len(), 1);
    let recorded: Vec<(u16, Option<Fault>)> = fake
        .requests(Endpoint::Telemetry)
        .into_iter()
        .map(|recorded| (recorded.status, recorded.fault))
        .collect();
    assert_eq!(recorded[0], (500, Some(Fault::Status(500))));
    assert_eq!(recorded[3], (202, None));

    // Error faults on the agent-side endpoints; the request is not processed.
    let reports = fake.endpoint_url(Endpoint::Reports);
    let handle = fake.mint(&new_id(), None);
    for status in [401, 403, 409, 410, 500] {
        fake.inject(Endpoint::Reports, Fault::Status(status));
        let response = post(&reports, Some(&handle), &good_report()).await;
        assert_eq!(response.status, status);
        assert!(response.text.contains(FAULT_SECRET));
    }
    assert!(fake.reports().is_empty());
    assert_eq!(
        post(&reports, Some(&handle), &good_report()).await.status,
        200
    );
    // Faults are per endpoint.
    fake.inject(Endpoint::ConsentDecisions, Fault::Status(500));
    assert_eq!(
        post(&reports, Some(&handle), &good_report()).await.status,
        200
    );
    fake.clear_faults(Endpoint::ConsentDecisions);
    assert_eq!(fake.pending_faults(Endpoint::ConsentDecisions), 0);
    assert_eq!(fake.counters().faults, 8);
}

#[tokio::test]
async fn delay_fault_provokes_client_timeouts() {
    let fake = start("never_ask");
    let url = fake.endpoint_url(Endpoint::Reports);
    let handle = fake.mint(&new_id(), None);
    fake.inject(Endpoint::Reports, Fault::Delay(Duration::from_secs(2)));
    let error = client()
        .post(&url)
        .timeout(Duration::from_millis(300))
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {handle}"))
        .body(serde_json::to_vec(&good_report()).expect("json"))
        .send()
        .await
        .expect_err("times out");
    assert!(error.is_timeout(), "{error}");
    // The delayed request was processed; the retry gets the first report.
    let first = fake.reports();
    assert_eq!(first.len(), 1);
    let retry = post(
        &url,
        Some(&handle),
        &json!({"summary": "A different summary text"}),
    )
    .await;
    assert_eq!(retry.status, 200);
    assert_eq!(retry.json()["report"], first[0]);

    // A patient client gets the normal response after the delay.
    fake.inject(
        Endpoint::Telemetry,
        Fault::Delay(Duration::from_millis(200)),
    );
    let started = std::time::Instant::now();
    let response = post(
        &telemetry_url(&fake),
        Some(DEMO_PRODUCT_KEY),
        &json!({ "events": [mcp_event(&new_id())] }),
    )
    .await;
    assert_eq!(response.status, 202);
    assert!(started.elapsed() >= Duration::from_millis(200));
}

#[tokio::test]
async fn receipt_faults_misreport_the_batch() {
    let fake = start("never_ask");
    let url = telemetry_url(&fake);
    let batch =
        |n: usize| json!({ "events": (0..n).map(|_| mcp_event(&new_id())).collect::<Vec<_>>() });

    fake.inject(Endpoint::Telemetry, Fault::ShortAccepted);
    let response = post(&url, Some(DEMO_PRODUCT_KEY), &batch(3)).await;
    assert_eq!(response.status, 202);
    assert_eq!(response.json(), json!({"accepted": 2, "dropped": 0}));
    assert_eq!(fake.events().len(), 2);

    fake.inject(Endpoint::Telemetry, Fault::Dropped(2));
    let response = post(&url, Some(DEMO_PRODUCT_KEY), &batch(3)).await;
    assert_eq!(response.json(), json!({"accepted": 1, "dropped": 2}));
    assert_eq!(fake.events().len(), 3);
    assert_eq!(fake.dropped_events().len(), 3);
    let counters = fake.counters();
    assert_eq!((counters.events_accepted, counters.events_dropped), (3, 2));

    fake.inject(Endpoint::Telemetry, Fault::MalformedReceipt);
    let response = post(&url, Some(DEMO_PRODUCT_KEY), &batch(1)).await;
    assert_eq!(response.status, 202);
    assert!(
        serde_json::from_str::<Value>(&response.text).is_err(),
        "{}",
        response.text
    );

    fake.inject(Endpoint::Telemetry, Fault::WrongTypedReceipt);
    let response = post(&url, Some(DEMO_PRODUCT_KEY), &batch(1)).await;
    assert_eq!(response.status, 202);
    assert_eq!(response.json(), json!({"accepted": "all", "dropped": null}));
    assert_eq!(fake.events().len(), 5);

    // Receipt faults leave error responses alone (the fault is still consumed).
    fake.inject(Endpoint::Telemetry, Fault::MalformedReceipt);
    post(&url, None, &batch(1))
        .await
        .assert_error(401, "Invalid API key");
    assert_eq!(
        post(&url, Some(DEMO_PRODUCT_KEY), &batch(1)).await.json(),
        json!({"accepted": 1, "dropped": 0})
    );
}

#[tokio::test]
async fn hangups_down_and_dropped_server() {
    let fake = start("never_ask");
    let url = telemetry_url(&fake);
    let batch = json!({ "events": [mcp_event(&new_id())] });
    let attempt = |url: String, batch: Value| async move {
        client()
            .post(url)
            .timeout(Duration::from_secs(5))
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {DEMO_PRODUCT_KEY}"))
            .body(serde_json::to_vec(&batch).expect("json"))
            .send()
            .await
    };
    fake.inject(Endpoint::Telemetry, Fault::Hangup);
    let error = attempt(url.clone(), batch.clone())
        .await
        .expect_err("hang-up");
    assert!(!error.is_timeout(), "{error}");
    assert_eq!(
        attempt(url.clone(), batch.clone())
            .await
            .expect("ok")
            .status(),
        202
    );

    fake.set_down(true);
    fake.inject(Endpoint::Telemetry, Fault::Status(500));
    for _ in 0..2 {
        let error = attempt(url.clone(), batch.clone()).await.expect_err("down");
        assert!(!error.is_timeout(), "{error}");
    }
    fake.set_down(false);
    // The fault was not consumed while down.
    assert_eq!(
        attempt(url.clone(), batch.clone())
            .await
            .expect("ok")
            .status(),
        500
    );
    assert_eq!(
        attempt(url.clone(), batch.clone())
            .await
            .expect("ok")
            .status(),
        202
    );
    let counters = fake.counters();
    assert_eq!(counters.hangups, 3);
    let statuses: Vec<u16> = fake
        .requests(Endpoint::Telemetry)
        .iter()
        .map(|recorded| recorded.status)
        .collect();
    assert_eq!(statuses, [0, 202, 0, 0, 500, 202]);

    drop(fake);
    let error = attempt(url, batch).await.expect_err("unreachable");
    assert!(error.is_connect(), "{error}");
}

#[tokio::test]
async fn max_concurrent_counts_requests_in_flight() {
    let fake = start("never_ask");
    for _ in 0..4 {
        fake.inject(
            Endpoint::Telemetry,
            Fault::Delay(Duration::from_millis(1500)),
        );
    }
    let url = telemetry_url(&fake);
    let requests = (0..4).map(|_| {
        let url = url.clone();
        tokio::spawn(async move {
            post(
                &url,
                Some(DEMO_PRODUCT_KEY),
                &json!({ "events": [mcp_event(&new_id())] }),
            )
            .await
        })
    });
    for request in requests.collect::<Vec<_>>() {
        assert_eq!(request.await.expect("join").status, 202);
    }
    assert_eq!(fake.max_concurrent(Endpoint::Telemetry), 4);
    assert_eq!(fake.max_concurrent(Endpoint::Reports), 0);
    assert!(
        fake.wait_until_async(Duration::from_secs(1), |fake| fake
            .in_flight(Endpoint::Telemetry)
            == 0)
            .await
    );
    // Sequential requests do not raise the maximum.
    let fake = start("never_ask");
    for _ in 0..3 {
        post(
            &url_of(&fake),
            Some(DEMO_PRODUCT_KEY),
            &json!({ "events": [mcp_event(&new_id())] }),
        )
        .await;
    }
    assert_eq!(fake.max_concurrent(Endpoint::Telemetry), 1);
}

/// The cost model: a batch is held `base + per_event × events` before it is stored, at most
/// `at_once` are processed together and the others wait their turn; a 429 with
/// `Retry-After` answers at once, without a turn.
#[tokio::test]
async fn batches_cost_time_and_wait_for_a_place() {
    let fake = start("never_ask");
    let cost = BatchCost {
        base: Duration::from_millis(300),
        per_event: Duration::from_millis(100),
        at_once: 2,
    };
    assert_eq!(cost.of(2), Duration::from_millis(500));
    assert!((cost.capacity(2) - 8.0).abs() < 1e-9);
    assert!((BatchCost::modelled().capacity(100) - 5882.35).abs() < 0.01);
    fake.set_batch_cost(Some(cost));
    let url = telemetry_url(&fake);
    let started = std::time::Instant::now();
    let requests: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                let events = [mcp_event(&new_id()), mcp_event(&new_id())];
                post(&url, Some(DEMO_PRODUCT_KEY), &json!({ "events": events })).await
            })
        })
        .collect();
    // Nothing is stored before a batch's cost has passed: not once two batches are held.
    let held = crate::support::eventually_async(Duration::from_secs(10), || {
        std::future::ready(fake.max_batches_processing() == 2)
    })
    .await;
    assert!(held, "the batches were never processed");
    assert_eq!(fake.events().len(), 0);
    for request in requests {
        assert_eq!(request.await.expect("join").status, 202);
    }
    let took = started.elapsed();
    assert_eq!(fake.events().len(), 8);
    assert_eq!(fake.max_concurrent(Endpoint::Telemetry), 4);
    assert_eq!(fake.max_batches_processing(), 2);
    // Two rounds of 500 ms: the second pair waited for the first.
    assert!(took >= Duration::from_millis(1000), "{took:?}");
    fake.inject(Endpoint::Telemetry, Fault::StatusRetryAfter(429, 3));
    let t = std::time::Instant::now();
    let resp = post(
        &url,
        Some(DEMO_PRODUCT_KEY),
        &json!({ "events": [mcp_event(&new_id())] }),
    )
    .await;
    assert_eq!(resp.status, 429);
    assert_eq!(resp.header("retry-after"), "3");
    assert!(
        t.elapsed() < Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    let last = fake.requests(Endpoint::Telemetry).pop().expect("recorded");
    assert!(last.answered.expect("answered") >= last.at);
    fake.reset_max_concurrent();
    assert_eq!(fake.max_batches_processing(), 0);
}

fn url_of(fake: &FakeEpode) -> String {
    telemetry_url(fake)
}

#[tokio::test]
async fn serves_http2_with_prior_knowledge() {
    let fake = start("never_ask");
    let response = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .build()
        .expect("client")
        .post(telemetry_url(&fake))
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {DEMO_PRODUCT_KEY}"))
        .body(serde_json::to_vec(&json!({ "events": [mcp_event(&new_id())] })).expect("json"))
        .send()
        .await
        .expect("h2 request");
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    assert_eq!(response.status().as_u16(), 202);
    assert_eq!(fake.events().len(), 1);
}
