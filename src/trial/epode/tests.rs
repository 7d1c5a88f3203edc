use std::time::SystemTime;

use super::*;
use crate::feedback::capability;

fn epode(mode: FeedbackMode) -> (DevEpode, ProductKey, Arc<Bus>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let key = ProductKey::ephemeral();
    let bus = Bus::new("/mcp", false);
    let dev = DevConfig {
        log: dir.path().join("dev.jsonl"),
        log_max_bytes: 1 << 20,
    };
    let e = DevEpode::new(
        key.clone(),
        mode,
        "http://127.0.0.1:1".into(),
        &dev,
        bus.clone(),
    )
    .unwrap();
    (e, key, bus, dir)
}

fn post(e: &DevEpode, path: &str, bearer: &str, body: &Value) -> (u16, Value) {
    let bytes = body.to_string();
    let r = e.answer(path, Some(bearer), true, Some(bytes.as_bytes()));
    (
        r.status.as_u16(),
        serde_json::from_str(&r.body).unwrap_or(Value::Null),
    )
}

fn handle(key: &ProductKey) -> (String, String) {
    let m = capability::mint(key, SystemTime::now(), None, None);
    (m.handle.as_str().to_owned(), m.claims.i)
}

fn event(id: &str) -> Value {
    json!({"interactionId": id, "surface": "mcp", "operation": "search", "classification": "confirmed",
           "confirmationMethod": "mcp", "statusCode": 200,
           "occurredAt": humantime::format_rfc3339_millis(SystemTime::now()).to_string()})
}

#[test]
fn telemetry_needs_the_key_and_a_valid_batch() {
    let (e, key, bus, _d) = epode(FeedbackMode::NeverAsk);
    let batch = json!({"events": [event(&uuid::Uuid::new_v4().to_string())]});
    assert_eq!(
        post(&e, "/api/v2/telemetry/batches", "af_live_wrong", &batch).0,
        401
    );
    let (status, body) = post(&e, "/api/v2/telemetry/batches", key.expose_secret(), &batch);
    assert_eq!((status, body), (202, json!({"accepted": 1, "dropped": 0})));
    let mut stale = event(&uuid::Uuid::new_v4().to_string());
    stale["occurredAt"] = json!("2020-01-01T00:00:00Z");
    let (status, body) = post(
        &e,
        "/api/v2/telemetry/batches",
        key.expose_secret(),
        &json!({"events": [stale]}),
    );
    assert_eq!((status, body), (202, json!({"accepted": 0, "dropped": 1})));
    let unknown = json!({"events": [event("x")], "extra": 1});
    assert_eq!(
        post(
            &e,
            "/api/v2/telemetry/batches",
            key.expose_secret(),
            &unknown
        )
        .0,
        400
    );
    let raw = json!({"events": [], "prompt": "hi"});
    let (status, body) = post(&e, "/api/v2/telemetry/batches", key.expose_secret(), &raw);
    assert_eq!(status, 400);
    assert_eq!(body["error"], FORBIDDEN_KEYS_MESSAGE);
    assert_eq!(bus.follow().0.len(), 2, "each event of a batch is shown");
}

#[test]
fn reports_follow_the_mode_consent_and_admission_rules() {
    let (e, key, bus, dir) = epode(FeedbackMode::NeverAsk);
    let (h, i) = handle(&key);
    let report =
        json!({"summary": "The order lookup answered quickly and clearly.", "impact": "helped"});
    let (status, body) = post(&e, "/api/v2/reports", &h, &report);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["interactionId"], i.as_str());
    // One report per interaction: a second gets the first back.
    let other = json!({"summary": "A different summary of the same use."});
    let (_, again) = post(&e, "/api/v2/reports", &h, &other);
    assert_eq!(again["report"]["summary"], report["summary"]);
    // Sensitive text and schema violations are 400; a bad handle is 401.
    let (h2, _) = handle(&key);
    let leaky = json!({"summary": "Mail me at someone@example.com about it"});
    assert_eq!(post(&e, "/api/v2/reports", &h2, &leaky).0, 400);
    assert_eq!(
        post(&e, "/api/v2/reports", &h2, &json!({"summary": "short"})).0,
        400
    );
    let mut forged = h2.clone();
    forged.push('x');
    assert_eq!(post(&e, "/api/v2/reports", &forged, &report).0, 401);
    let other_key = ProductKey::ephemeral();
    assert_eq!(
        post(&e, "/api/v2/reports", &handle(&other_key).0, &report).0,
        401
    );
    // Every report request is on the console and in the record.
    let kinds: Vec<String> = bus.follow().0.iter().map(|e| e.to_string()).collect();
    assert!(
        kinds
            .iter()
            .filter(|e| e.contains(r#""kind":"report""#))
            .count()
            >= 4,
        "{kinds:?}"
    );
    let record = std::fs::read_to_string(dir.path().join("dev.jsonl")).unwrap();
    assert_eq!(record.lines().count(), 6);
    assert!(
        !record.contains("afr2_"),
        "the handle never reaches the record"
    );
}

#[test]
fn ask_always_needs_an_approval_and_the_first_decision_wins() {
    let (e, key, _bus, _d) = epode(FeedbackMode::AskAlways);
    let (h, _) = handle(&key);
    let report = json!({"summary": "The export finished and the counts were right."});
    assert_eq!(post(&e, "/api/v2/reports", &h, &report).0, 403);
    let (status, body) = post(
        &e,
        "/api/v2/consent/decisions",
        &h,
        &json!({"decision": "approved"}),
    );
    assert_eq!(status, 200);
    assert_eq!(body["state"], "approved");
    assert_eq!(body["changed"], true);
    assert_eq!(body["feedback"]["state"], "feedback_ready");
    assert_eq!(
        body["feedback"]["submit"]["authorization"],
        format!("Bearer {h}")
    );
    let (_, repeat) = post(
        &e,
        "/api/v2/consent/decisions",
        &h,
        &json!({"decision": "declined"}),
    );
    assert_eq!(
        (repeat["state"].clone(), repeat["changed"].clone()),
        (json!("approved"), json!(false))
    );
    assert_eq!(post(&e, "/api/v2/reports", &h, &report).0, 200);
    assert_eq!(
        post(
            &e,
            "/api/v2/consent/decisions",
            &h,
            &json!({"decision": "maybe"})
        )
        .0,
        400
    );
}

#[test]
fn decisions_are_refused_outside_the_ask_modes_and_reports_when_off() {
    let (e, key, _bus, _d) = epode(FeedbackMode::NeverAsk);
    let (h, _) = handle(&key);
    assert_eq!(
        post(
            &e,
            "/api/v2/consent/decisions",
            &h,
            &json!({"decision": "approved"})
        )
        .0,
        409
    );
    let (off, key, _bus, _d2) = epode(FeedbackMode::Off);
    let (h, _) = handle(&key);
    let report = json!({"summary": "The export finished and the counts were right."});
    assert_eq!(post(&off, "/api/v2/reports", &h, &report).0, 410);
}

#[test]
fn the_record_stops_growing_at_its_cap() {
    let dir = tempfile::tempdir().unwrap();
    let key = ProductKey::ephemeral();
    let dev = DevConfig {
        log: dir.path().join("dev.jsonl"),
        log_max_bytes: 1024,
    };
    let e = DevEpode::new(
        key.clone(),
        FeedbackMode::NeverAsk,
        "http://x".into(),
        &dev,
        Bus::new("/mcp", false),
    )
    .unwrap();
    for _ in 0..20 {
        let batch = json!({"events": [event(&uuid::Uuid::new_v4().to_string())]});
        post(&e, "/api/v2/telemetry/batches", key.expose_secret(), &batch);
    }
    assert!(
        std::fs::metadata(dir.path().join("dev.jsonl"))
            .unwrap()
            .len()
            <= 1024
    );
}

#[test]
fn http_telemetry_is_taken_unclassified_and_a_report_for_its_interaction_is_accepted() {
    let (e, key, _bus, _d) = epode(FeedbackMode::NeverAsk);
    let (bearer, id) = handle(&key);
    let mut http = event(&id);
    http["surface"] = json!("http_json");
    http["operation"] = json!("/search/:id");
    http["classification"] = json!("unclassified");
    http.as_object_mut().unwrap().remove("confirmationMethod");
    let mut confirmed = event(&uuid::Uuid::new_v4().to_string());
    confirmed["surface"] = json!("http_html");
    let batch = json!({"events": [http, confirmed]});
    let (status, body) = post(&e, "/api/v2/telemetry/batches", key.expose_secret(), &batch);
    assert_eq!(
        (status, body),
        (202, json!({"accepted": 1, "dropped": 1})),
        "an HTTP event that claims confirmation is dropped, as the service does"
    );
    let report = json!({"summary": "The search page answered well.", "impact": "helped"});
    let (status, body) = post(&e, "/api/v2/reports", &bearer, &report);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["interactionId"], json!(id));
}
