//! Unit tests of `tools`.
use super::*;

const HANDLE: &str = "afr2_0123456789abcdef0123456789abcdef.payload.sig";

fn tools() -> FeedbackTools {
    FeedbackTools::new().expect("schemas compile")
}

fn fixture(name: &str) -> Value {
    let path = format!("{}/protocol/epode-v1/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("JSON")
}

#[test]
fn definitions_match_the_reference_binding() {
    let defs = tools().definitions();
    let names: Vec<&str> = defs.iter().filter_map(|d| d["name"].as_str()).collect();
    assert_eq!(names, [CONSENT_TOOL, REPORT_TOOL]);
    for def in &defs {
        let keys: Vec<&str> = def
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            ["name", "title", "description", "inputSchema", "annotations"]
        );
        assert_eq!(
            def["annotations"],
            json!({"readOnlyHint": false, "destructiveHint": false, "idempotentHint": true})
        );
        assert_eq!(def["inputSchema"]["type"], "object");
        assert_eq!(def["inputSchema"]["additionalProperties"], false);
        assert_eq!(
            def["inputSchema"]["properties"]["feedbackHandle"]["pattern"],
            "^afr2_"
        );
    }
    assert_eq!(defs[0]["title"], "Record product feedback permission");
    assert_eq!(defs[1]["title"], "Report product feedback");
    assert_eq!(
        defs[0]["inputSchema"]["required"],
        json!(["feedbackHandle", "decision"])
    );
    assert_eq!(
        defs[1]["inputSchema"]["required"],
        json!(["feedbackHandle", "summary"])
    );
}

/// The report tool carries every limit of the protocol's report schema: its properties,
/// minus the handle, are the protocol's properties with the same constraints.
#[test]
fn report_schema_carries_the_full_protocol_limits() {
    let protocol = fixture("feedback-report.schema.json");
    let ours = report_input_schema();
    let mut props = ours["properties"].as_object().unwrap().clone();
    assert!(props.shift_remove("feedbackHandle").is_some());
    let theirs = protocol["properties"].as_object().unwrap();
    assert_eq!(
        props.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>()
    );
    // Same accept/reject decisions on a battery of report bodies.
    let protocol_validator = jsonschema::validator_for(&protocol).unwrap();
    let tools = tools();
    let bodies = [
        json!({"summary": "The status result answered the question."}),
        json!({"summary": "short"}),
        json!({"summary": "x".repeat(701)}),
        json!({"summary": "Worked fine overall.", "impact": "helped_with_friction", "confidence": 0.92}),
        json!({"summary": "Worked fine overall.", "impact": "great"}),
        json!({"summary": "Worked fine overall.", "confidence": 1.5}),
        json!({"summary": "Worked fine overall.", "confidence": -0.1}),
        json!({"summary": "Worked fine overall.", "findings": [{"kind": "friction", "topic": "latency", "severity": "minor", "detail": "The first request timed out."}]}),
        json!({"summary": "Worked fine overall.", "findings": [{"kind": "friction", "topic": "Latency", "detail": "abc"}]}),
        json!({"summary": "Worked fine overall.", "findings": [{"kind": "friction", "topic": "latency", "detail": "ab"}]}),
        json!({"summary": "Worked fine overall.", "findings": [{"kind": "friction", "topic": "latency", "detail": "abc", "extra": 1}]}),
        json!({"summary": "Worked fine overall.", "findings": vec![json!({"kind": "gap", "topic": "t", "detail": "abc"}); 9]}),
        json!({"summary": "Worked fine overall.", "workaround": {"used": true, "detail": "Retried once."}}),
        json!({"summary": "Worked fine overall.", "workaround": {"used": true}}),
        json!({"summary": "Worked fine overall.", "workaround": {"used": false}}),
        json!({"summary": "Worked fine overall.", "workaround": {"used": false, "detail": "ab"}}),
        json!({"summary": "Worked fine overall.", "consent": true}),
    ];
    for body in bodies {
        let mut args = body.as_object().unwrap().clone();
        args.insert("feedbackHandle".into(), json!(HANDLE));
        assert_eq!(
            tools.validate_report_args(&Value::Object(args)).is_ok(),
            protocol_validator.is_valid(&body),
            "{body}"
        );
    }
}

#[test]
fn consent_arguments_forward_only_the_decision() {
    let tools = tools();
    let call = tools
        .validate_consent_args(&json!({"feedbackHandle": HANDLE, "decision": "approved"}))
        .unwrap();
    assert_eq!(call.handle.as_str(), HANDLE);
    assert_eq!(call.decision, Decision::Approved);
    assert_eq!(call.body, json!({"decision": "approved"}));
    // The forwarded body satisfies the protocol's decision schema.
    let decision_schema =
        jsonschema::validator_for(&fixture("consent-decision.schema.json")).unwrap();
    assert!(decision_schema.is_valid(&call.body));

    let declined = tools
        .validate_consent_args(&json!({"decision": "declined", "feedbackHandle": HANDLE}))
        .unwrap();
    assert_eq!(declined.body, json!({"decision": "declined"}));
}

#[test]
fn invalid_consent_calls_say_what_is_wrong() {
    let tools = tools();
    let err = tools
        .validate_consent_args(
            &json!({"feedbackHandle": "afr1_x", "decision": "yes", "note": "hi"}),
        )
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with(
            "Input validation error: Invalid arguments for tool record_product_feedback_consent: "
        ),
        "{text}"
    );
    assert!(text.contains("feedbackHandle: "), "{text}");
    assert!(text.contains("decision: "), "{text}");
    assert!(text.contains("'note'"), "{text}");

    for absent in [Value::Null, json!({})] {
        let err = tools.validate_consent_args(&absent).unwrap_err();
        assert!(err.to_string().contains("\"feedbackHandle\""), "{err}");
        assert!(err.to_string().contains("\"decision\""), "{err}");
    }
    for not_object in [json!([]), json!("afr2_x"), json!(3)] {
        assert!(tools.validate_consent_args(&not_object).is_err());
    }
    let result = err.to_result();
    assert_eq!(result["isError"], true);
    assert_eq!(result["content"][0]["text"], err.to_string());
    assert!(result.get("structuredContent").is_none());
}

#[test]
fn report_arguments_forward_only_report_fields_unchanged() {
    let tools = tools();
    let args: Value = serde_json::from_str(&format!(
        r#"{{"workaround":{{"used":true,"detail":"The agent retried once."}},"confidence":0.920000000000000000001,"feedbackHandle":"{HANDLE}","summary":"The status result answered the question.","findings":[{{"kind":"strength","topic":"accuracy","detail":"The final status was correct."}}],"impact":"helped_with_friction"}}"#
    ))
    .unwrap();
    let call = tools.validate_report_args(&args).unwrap();
    assert_eq!(call.handle.as_str(), HANDLE);
    assert_eq!(
        call.body.to_string(),
        r#"{"summary":"The status result answered the question.","impact":"helped_with_friction","confidence":0.920000000000000000001,"findings":[{"kind":"strength","topic":"accuracy","detail":"The final status was correct."}],"workaround":{"used":true,"detail":"The agent retried once."}}"#
    );
    let minimal = tools
        .validate_report_args(
            &json!({"feedbackHandle": HANDLE, "summary": "Answered the question."}),
        )
        .unwrap();
    assert_eq!(minimal.body, json!({"summary": "Answered the question."}));
}

#[test]
fn invalid_report_calls_list_every_problem_with_paths() {
    let tools = tools();
    let long_secret = "private words ".repeat(60);
    let err = tools
        .validate_report_args(&json!({
            "feedbackHandle": "x",
            "summary": long_secret,
            "confidence": 2,
            "extra": 1,
            "findings": [{"kind": "gap", "topic": "Bad Topic", "detail": "ok!"}],
            "workaround": {"used": true},
        }))
        .unwrap_err();
    let text = err.to_string();
    for expected in [
        "feedbackHandle: ",
        "summary: ",
        "confidence: ",
        "'extra'",
        "findings.0.topic: ",
        "workaround: ",
        "\"detail\"",
    ] {
        assert!(text.contains(expected), "{expected} missing from {text}");
    }
    assert!(!text.contains("private words"), "values are masked: {text}");

    let many: Vec<Value> = (0..40).map(|_| json!({"kind": 1})).collect();
    let err = tools
        .validate_report_args(
            &json!({"feedbackHandle": HANDLE, "summary": "Answered it.", "findings": many}),
        )
        .unwrap_err();
    assert_eq!(err.problems.len(), MAX_LISTED_PROBLEMS + 1);
    assert!(err.problems.last().unwrap().starts_with("and "));
}

#[test]
fn consent_results() {
    let approved_body = json!({
        "state": "approved",
        "decidedAt": "2026-08-08T10:00:00Z",
        "changed": true,
        "feedback": {"state": "feedback_ready", "submit": {"authorization": format!("Bearer {HANDLE}")}},
    });
    let result = consent_success(Decision::Approved, approved_body.clone());
    assert_eq!(
        result["content"][0]["text"],
        format!("Permission approved. Now autonomously call report_product_feedback with feedbackHandle {HANDLE}, a concise summary, and any applicable findings. Do not ask again.")
    );
    let structured = result["structuredContent"].as_object().unwrap();
    let keys: Vec<&str> = structured.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "state",
            "decidedAt",
            "changed",
            "feedback",
            "reportTool",
            "feedbackHandle"
        ]
    );
    assert_eq!(structured["feedback"], approved_body["feedback"]);
    assert_eq!(structured["reportTool"], REPORT_TOOL);
    assert_eq!(structured["feedbackHandle"], HANDLE);
    assert!(result.get("isError").is_none());

    let declined = consent_success(
        Decision::Declined,
        json!({"state": "declined", "decidedAt": "2026-08-08T10:00:00Z", "changed": true, "feedback": null}),
    );
    assert_eq!(declined["content"][0]["text"], DECLINED_TEXT);
    assert_eq!(
        DECLINED_TEXT,
        "Permission declined. Do not submit product feedback."
    );
    assert!(declined["structuredContent"].get("reportTool").is_none());
    assert!(declined["structuredContent"]
        .get("feedbackHandle")
        .is_none());

    // Approved, but Epode returned no feedback action (e.g. a stale handle): no report.
    let stale = consent_success(
        Decision::Approved,
        json!({"state": "declined", "changed": false, "feedback": null}),
    );
    assert_eq!(stale["content"][0]["text"], DECLINED_TEXT);
    assert_eq!(
        consent_success(Decision::Approved, json!("not json"))["structuredContent"],
        json!({})
    );
}

#[test]
fn report_results() {
    let receipt = json!({"accepted": true, "interactionId": "018f1f2e-7b4a-7c12-9c8d-123456789abc", "report": {"id": "r1"}});
    let result = report_success(receipt.clone());
    assert_eq!(result["structuredContent"], receipt);
    assert_eq!(result["content"][0]["text"], REPORT_ACCEPTED_TEXT);
    assert_eq!(report_success(Value::Null)["structuredContent"], json!({}));
}

#[test]
fn failures_carry_the_contract_guidance_and_never_epode_text() {
    // (status, report retryable, consent retryable), the contract's table.
    let table = [
        (408, true, true),
        (429, true, true),
        (500, true, true),
        (503, true, true),
        (400, true, false),
        (422, true, false),
        (401, false, false),
        (403, false, false),
        (404, false, false),
        (409, false, false),
        (410, false, false),
        (418, false, false),
    ];
    for (status, report_retry, consent_retry) in table {
        let report = report_failure(EpodeFailure::Status(status));
        assert_eq!(report["isError"], true);
        assert_eq!(
            report["structuredContent"],
            json!({"accepted": false, "retryable": report_retry}),
            "{status}"
        );
        let text = report["content"][0]["text"].as_str().unwrap();
        assert_eq!(
            text,
            format!(
                "Feedback submission failed with HTTP {status}. {}",
                report_guidance(status).text
            )
        );

        let consent = consent_failure(EpodeFailure::Status(status));
        assert_eq!(
            consent["structuredContent"],
            json!({"accepted": false, "retryable": consent_retry}),
            "{status}"
        );
        let text = consent["content"][0]["text"].as_str().unwrap();
        assert_eq!(
            text,
            format!(
                "Permission could not be recorded (HTTP {status}). {}",
                consent_guidance(status).text
            )
        );
        assert_eq!(consent["content"].as_array().unwrap().len(), 1);
    }
    assert_eq!(report_guidance(400).text, "Retry this tool exactly once with only feedbackHandle and a concise summary; omit every optional field.");
    assert_eq!(report_guidance(403).text, "Consent is required or was declined; do not retry. Never call this tool unless a feedback_ready action returned it.");
    assert_eq!(consent_guidance(401).text, "The consent handle is invalid or expired; do not retry with the same handle. Do not assume approval.");

    let report = report_failure(EpodeFailure::Unavailable);
    assert_eq!(
        report["structuredContent"],
        json!({"accepted": false, "retryable": true})
    );
    assert_eq!(report["content"][0]["text"], REPORT_UNAVAILABLE_TEXT);
    let consent = consent_failure(EpodeFailure::Unavailable);
    assert_eq!(
        consent["structuredContent"],
        json!({"accepted": false, "retryable": true})
    );
    assert_eq!(consent["content"][0]["text"], CONSENT_UNAVAILABLE_TEXT);
}

#[test]
fn feedback_tool_names() {
    assert!(is_feedback_tool(CONSENT_TOOL) && is_feedback_tool(REPORT_TOOL));
    assert!(!is_feedback_tool("search"));
}

#[test]
fn bearer_prefix_is_stripped_like_the_reference() {
    assert_eq!(strip_bearer("Bearer afr2_x"), "afr2_x");
    assert_eq!(strip_bearer("Bearer \t afr2_x"), "afr2_x");
    assert_eq!(strip_bearer("Bearerafr2_x"), "Bearerafr2_x");
    assert_eq!(strip_bearer("afr2_x"), "afr2_x");
}
