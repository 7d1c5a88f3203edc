//! Unit tests of `telemetry`.
use super::*;
use serde_json::json;

fn vectors() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/protocol/epode-v1/conformance.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn completion(input: &Value) -> McpCompletion {
    let s = |k: &str| input.get(k).and_then(Value::as_str).map(str::to_owned);
    McpCompletion {
        interaction_id: "018f1f2e-7b4a-4c12-9c8d-123456789abc".into(),
        operation: s("operation").unwrap_or_default(),
        outcome: match input["outcome"].as_str() {
            Some("success") => Some(Outcome::Success),
            Some("error") => Some(Outcome::Error),
            _ => None,
        },
        duration: None,
        refs: IdentityRefs::from_meta(input),
        runtime_hint: s("runtimeHint"),
    }
}

/// Every `mcpCompletion` vector: the event, less the generated fields, equals the expected
/// event exactly; invalid inputs produce no event and the expected error kind.
#[test]
fn conformance_mcp_completion_vectors() {
    let v = vectors();
    let cases = v["mcpCompletion"]["vectors"].as_array().unwrap();
    assert!(cases.len() >= 11);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let got = build_event(&completion(&case["input"]), SystemTime::now());
        match case.get("expectedErrorKind").and_then(Value::as_str) {
            Some(kind) => {
                let err = got.expect_err(name);
                assert!(err.to_string().starts_with(kind), "{name}: {err}");
            }
            None => {
                let mut obj = got.unwrap_or_else(|e| panic!("{name}: {e}"));
                for generated in ["interactionId", "occurredAt"] {
                    assert!(obj.remove(generated).is_some(), "{name}: {generated}");
                }
                assert_eq!(&Value::Object(obj), &case["expectedEvent"], "{name}");
            }
        }
    }
}

#[test]
fn events_validate_against_the_batch_schema() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/protocol/epode-v1/telemetry-batch.schema.json"
    );
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let mut c = completion(
        &json!({"operation":"get_summary","outcome":"error","accountRef":"a_1","sessionRef":"s:1","runtimeHint":"x 1"}),
    );
    c.duration = Some(Duration::from_millis(12));
    let mut event = build_event(&c, SystemTime::now()).unwrap();
    event.insert("sequence".into(), Value::from(1));
    let batch = json!({"events": [event]});
    assert!(validator.is_valid(&batch), "{batch}");
    assert_eq!(batch["events"][0]["durationMs"], 12);
}

fn answer(status: u16, body: &str) -> Answer {
    Answer {
        status,
        headers: Default::default(),
        body: bytes::Bytes::from(body.to_owned()),
    }
}

#[test]
fn receipts_are_judged() {
    assert_eq!(
        judge(&answer(202, r#"{"accepted":3,"dropped":0}"#), 3),
        Delivery::Receipt {
            accepted: 3,
            dropped: 0
        }
    );
    // A partial receipt: the accepted events are delivered, only the dropped ones lost.
    assert_eq!(
        judge(&answer(202, r#"{"accepted":2,"dropped":1}"#), 3),
        Delivery::Receipt {
            accepted: 2,
            dropped: 1
        }
    );
    assert_eq!(
        judge(&answer(202, r#"{"accepted":2,"dropped":0}"#), 3),
        Delivery::Rejected {
            reason: "the receipt (2 accepted, 0 dropped) does not account for the 3 events sent"
                .into(),
            reported: Some((2, 0))
        }
    );
    assert!(matches!(
        judge(
            &answer(202, r#"{"accepted":18446744073709551615,"dropped":1}"#),
            3
        ),
        Delivery::Rejected { reported: None, .. }
    ));
    assert!(matches!(
        judge(&answer(202, "ok"), 3),
        Delivery::Rejected { .. }
    ));
    assert!(matches!(
        judge(&answer(202, r#"{"accepted":"3","dropped":0}"#), 3),
        Delivery::Rejected { .. }
    ));
    assert!(matches!(
        judge(&answer(200, r#"{"accepted":3,"dropped":0}"#), 3),
        Delivery::Rejected { .. }
    ));
    for s in [408, 429, 500, 503] {
        assert!(
            matches!(judge(&answer(s, ""), 3), Delivery::Retryable { .. }),
            "{s}"
        );
    }
    for s in [400, 401, 413] {
        assert!(
            matches!(judge(&answer(s, ""), 3), Delivery::Rejected { .. }),
            "{s}"
        );
    }
    let mut a = answer(429, "");
    a.headers
        .insert(reqwest::header::RETRY_AFTER, "2".parse().unwrap());
    assert_eq!(
        judge(&a, 1),
        Delivery::Retryable {
            reason: "HTTP 429".into(),
            retry_after: Some(Duration::from_secs(2))
        }
    );
}

#[test]
fn operations() {
    assert!(valid_operation("tools/get_summary"));
    assert!(!valid_operation("get_summary?customer=42"));
    assert!(!valid_operation("https://customer.example/tool"));
    assert!(!valid_operation(""));
    assert!(!valid_operation(&"x".repeat(161)));
}

fn event_of(bytes: usize, sequence: u64) -> Map<String, Value> {
    let mut e = Map::new();
    e.insert("sequence".into(), Value::from(sequence));
    e.insert("runtimeHint".into(), Value::from("é".repeat(bytes / 2)));
    e
}

/// A batch whose body would pass Epode's 64 KiB limit goes in parts that each fit, in
/// order; a batch that fits goes whole.
#[test]
fn large_batches_are_sent_in_parts_that_fit() {
    let batch: Vec<_> = (1..=100).map(|i| event_of(1800, i)).collect();
    let parts = bodies(batch);
    assert!(parts.len() > 1, "{} parts", parts.len());
    let mut seen = Vec::new();
    for (n, body) in &parts {
        assert!(body.len() <= MAX_BATCH_BYTES, "{}", body.len());
        let v: Value = serde_json::from_slice(body).unwrap();
        let events = v["events"].as_array().unwrap();
        assert_eq!(events.len(), *n);
        seen.extend(events.iter().map(|e| e["sequence"].as_u64().unwrap()));
    }
    assert_eq!(seen, (1..=100).collect::<Vec<_>>());
    let small: Vec<_> = (1..=100).map(|i| event_of(300, i)).collect();
    assert_eq!(bodies(small).len(), 1);
    // One event larger than the limit is sent alone (Epode's answer judges it).
    assert_eq!(bodies(vec![event_of(70_000, 1)]).len(), 1);
}

fn http_completion() -> HttpCompletion {
    HttpCompletion {
        interaction_id: "018f1f2e-7b4a-4c12-9c8d-123456789abc".into(),
        surface: Surface::Json,
        operation: "/search/:id".into(),
        status: 201,
        duration: Duration::from_millis(7),
        refs: IdentityRefs::from_meta(
            &json!({"accountRef":"acct_1","userRef":"user.acct_1","customerRef":"acct_1","sessionRef":"s1"}),
        ),
        runtime_hint: Some("claude-code".into()),
    }
}

#[test]
fn an_http_event_is_unclassified_with_its_surface_and_real_status() {
    let mut event = build_http_event(&http_completion(), SystemTime::now()).unwrap();
    assert!(event.remove("occurredAt").is_some());
    assert_eq!(
        Value::Object(event.clone()),
        json!({
            "interactionId": "018f1f2e-7b4a-4c12-9c8d-123456789abc",
            "surface": "http_json",
            "operation": "/search/:id",
            "classification": "unclassified",
            "statusCode": 201,
            "durationMs": 7,
            "accountRef": "acct_1",
            "userRef": "user.acct_1",
            "customerRef": "acct_1",
            "sessionRef": "s1",
            "sessionSource": "customer",
            "runtimeHint": "claude-code",
            "runtimeHintSource": "http"
        })
    );
    assert!(!event.contains_key("confirmationMethod"));
    let keys: Vec<&str> = event.keys().map(String::as_str).collect();
    assert_eq!(&keys[..3], ["interactionId", "surface", "operation"]);
}

#[test]
fn http_events_validate_against_the_batch_schema() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/protocol/epode-v1/telemetry-batch.schema.json"
    );
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    for surface in Surface::ALL {
        let mut c = http_completion();
        c.surface = surface;
        let mut event = build_http_event(&c, SystemTime::now()).unwrap();
        event.insert("sequence".into(), Value::from(1));
        let batch = json!({"events": [event]});
        assert!(validator.is_valid(&batch), "{batch}");
    }
    let mut bad = http_completion();
    bad.operation = "/a b".into();
    assert_eq!(
        build_http_event(&bad, SystemTime::now()).unwrap_err(),
        InvalidCompletion::Operation
    );
}
