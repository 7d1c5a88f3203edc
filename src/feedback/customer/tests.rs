use serde_json::{json, Value};

use super::*;
use crate::mcp::raw::open;

const H: &str = "aqr1_0123abcd.eyJ2IjoxfQ.c2ln";

fn item(key: &str, value: &str) -> Value {
    json!({"key": key, "type": "preference", "value": value, "summary": format!("{key} is {value}"),
           "provenance": "agent_reports_user_statement", "confidence": 1, "remember": true})
}

#[test]
fn a_share_is_checked_and_forwarded_with_only_the_answer_keys() {
    let mut it = item("shopping.priority", "sustainability");
    it["extra"] = json!("dropped");
    let s = share(&json!({"requestHandle": H, "status": "answered", "items": [it], "more": 1}))
        .expect("valid");
    assert_eq!(s.handle, H);
    assert_eq!(s.answer["status"], "answered");
    assert_eq!(s.answer["items"][0].get("extra"), None);
    assert_eq!(s.answer["items"][0]["value"], "sustainability");
    assert_eq!(s.answer.as_object().unwrap().len(), 2);
    // no_relevant_context takes no items; no summary is needed.
    let mut bare = item("shopping.priority", "x");
    bare.as_object_mut().unwrap().remove("summary");
    assert!(share(&json!({"requestHandle": H, "status": "answered", "items": [bare]})).is_ok());
    assert!(
        share(&json!({"requestHandle": H, "status": "no_relevant_context", "items": []})).is_ok()
    );
}

#[test]
fn shares_that_cannot_be_sent_are_refused_saying_which_argument() {
    let nine: Vec<Value> = (0..9).map(|i| item(&format!("k{i}"), "v")).collect();
    let cases = [
        (json!({"status": "answered", "items": []}), "requestHandle"),
        (
            json!({"requestHandle": "afr2_x", "status": "answered", "items": []}),
            "requestHandle",
        ),
        (
            json!({"requestHandle": "aqr1_a b", "status": "answered", "items": []}),
            "requestHandle",
        ),
        (
            json!({"requestHandle": H, "status": "maybe", "items": []}),
            "status",
        ),
        (
            json!({"requestHandle": H, "status": "answered", "items": nine}),
            "Too big",
        ),
        (
            json!({"requestHandle": H, "status": "answered", "items": []}),
            "1 to 8",
        ),
        (
            json!({"requestHandle": H, "status": "declined", "items": [item("a.b", "v")]}),
            "need none",
        ),
        (
            json!({"requestHandle": H, "status": "answered", "items": [item("Bad Key", "v")]}),
            "items.0.key",
        ),
        (
            json!({"requestHandle": H, "status": "answered", "items": [item("a.b", "me@example.com")]}),
            "items.0.value: looks sensitive",
        ),
        (
            json!({"requestHandle": H, "status": "answered", "items": [item("a.b", &"x".repeat(161))]}),
            "items.0.value",
        ),
    ];
    for (args, says) in cases {
        let why = share(&args).expect_err(&args.to_string());
        assert!(why.contains(says), "{args}: {why}");
    }
    let long = format!("aqr1_{}", "a".repeat(MAX_HANDLE_BYTES));
    let why =
        share(&json!({"requestHandle": long, "status": "declined", "items": []})).unwrap_err();
    assert!(why.starts_with("requestHandle"), "{why}");
    let longest = format!("aqr1_{}", "a".repeat(MAX_HANDLE_BYTES - 5));
    assert!(share(&json!({"requestHandle": longest, "status": "declined", "items": []})).is_ok());
    let mut bad = item("a.b", "v");
    bad["expiresAt"] = json!("2026-02-30T00:00:00Z");
    assert!(share(&json!({"requestHandle": H, "status": "answered", "items": [bad]})).is_err());
    bad["expiresAt"] = json!("2026-12-31T23:59:59.5Z");
    assert!(share(&json!({"requestHandle": H, "status": "answered", "items": [bad]})).is_ok());
}

#[test]
fn sensitive_text_is_told_as_the_reference_tells_it() {
    for s in [
        "a@b",
        "line\nbreak",
        "Bearer abc",
        "my password",
        "passwd1",
        "SECRET",
        "api key",
        "api_key",
        "apikey",
        "access-token",
        "refresh token",
        "sk-abc",
    ] {
        assert!(sensitive(s), "{s}");
    }
    for s in [
        "sustainability",
        "50_150",
        "bearer",
        "secretary",
        "topsecret",
        "desk-1",
        "sk-",
    ] {
        // "secretary" starts with a credential's word, as the reference's \b…secret reads it.
        assert_eq!(sensitive(s), s == "secretary", "{s}");
    }
}

#[test]
fn a_consent_call_forwards_its_decision_and_remember_when_given() {
    assert_eq!(
        consent(&json!({"requestHandle": H, "decision": "declined"})).unwrap(),
        (H.to_owned(), json!({"decision": "declined"}))
    );
    assert_eq!(
        consent(&json!({"requestHandle": H, "decision": "approved", "remember": false}))
            .unwrap()
            .1,
        json!({"decision": "approved", "remember": false})
    );
    assert!(consent(&json!({"requestHandle": H, "decision": "yes"})).is_err());
    assert!(
        consent(&json!({"requestHandle": H, "decision": "approved", "remember": "no"})).is_err()
    );
}

fn ready() -> Value {
    json!({
        "requestId": "r", "interactionId": "i", "state": "answer_ready", "purpose": "product_personalization",
        "surface": "mcp", "identityLevel": "verified", "constraints": {"catalog": {}},
        "stageInstruction": "Finish first.", "question": null, "answerInstruction": "Only relevant.",
        "expiresAt": "2026-12-07T10:00:00Z",
        "consent": {"url": "https://epode/consent", "authorization": "Bearer aqr1_tok"},
        "submit": {"url": "https://epode/answers", "authorization": "Bearer aqr1_tok", "bodySchema": {"status": []}}
    })
}

#[test]
fn the_contract_carries_the_handle_and_schema_only_when_an_answer_is_taken() {
    let c = Contract::from_answer(&ready()).unwrap();
    assert_eq!(c.contract["requestHandle"], "aqr1_tok");
    assert_eq!(c.contract["answerTool"], SHARE_TOOL);
    assert_eq!(c.contract["answerSchema"], json!({"status": []}));
    for gone in ["surface", "constraints", "consent", "submit", "question"] {
        assert!(c.contract.get(gone).is_none(), "{gone}");
    }
    assert_eq!(c.instruction, "Finish first. Only relevant.");
    assert!(!c.contract.to_string().contains("https://"), "no URL");

    let mut declined = ready();
    declined["state"] = json!("declined");
    declined["submit"] = Value::Null;
    declined["answerInstruction"] = Value::Null;
    declined["stageInstruction"] = json!("No enrichment action is permitted for this request.");
    let c = Contract::from_answer(&declined).unwrap();
    assert!(c.contract.get("requestHandle").is_none());
    assert_eq!(
        c.instruction,
        "No enrichment action is permitted for this request."
    );

    let mut asks = ready();
    asks["state"] = json!("consent_required");
    asks["submit"] = Value::Null;
    let c = Contract::from_answer(&asks).unwrap();
    assert_eq!(c.contract["permissionMode"], "best_effort_mcp_elicitation");
    assert_eq!(c.contract["requestHandle"], "aqr1_tok");
    assert!(c
        .instruction
        .starts_with("After finishing the product task"));
    assert!(Contract::from_answer(&json!({"error": "x"})).is_none());
}

fn result(json: &str) -> RawMap {
    open(&serde_json::value::RawValue::from_string(json.to_owned()).unwrap()).unwrap()
}

#[test]
fn the_contract_goes_in_structured_content_unless_a_schema_owns_it() {
    let c = Contract::from_answer(&ready()).unwrap();
    let mut r =
        result(r#"{"content":[{"type":"text","text":"done"}],"structuredContent":{"n":1e400}}"#);
    assert!(c.place(&mut r, false));
    let s = r["structuredContent"].get();
    assert!(
        s.starts_with(r#"{"n":1e400,"_epode":{"customerContext":{"#),
        "{s}"
    );
    let content: Vec<Value> = serde_json::from_str(r["content"].get()).unwrap();
    assert_eq!(content.len(), 2);
    assert_eq!(content[1]["text"], c.instruction);

    let mut r = result(r#"{"content":[],"structuredContent":{"n":1}}"#);
    c.place(&mut r, true);
    assert_eq!(
        r["structuredContent"].get(),
        r#"{"n":1}"#,
        "the schema's, untouched"
    );
    let content: Vec<Value> = serde_json::from_str(r["content"].get()).unwrap();
    let block: Value = serde_json::from_str(content[0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(block["_epode"]["customerContext"], c.contract);

    // Not an object: kept as it is (the reference would lose it), the contract as text.
    let mut r = result(r#"{"content":[],"structuredContent":[1,2]}"#);
    c.place(&mut r, false);
    assert_eq!(r["structuredContent"].get(), "[1,2]");
    // Absent: made.
    let mut r = result(r#"{"content":[]}"#);
    c.place(&mut r, false);
    assert!(r["structuredContent"].get().contains("customerContext"));
}

#[test]
fn the_permission_answer_is_read_as_the_reference_reads_it() {
    let p = |v: Value| permission(&v);
    assert_eq!(p(json!("yes")), Permission::Invalid);
    assert_eq!(p(json!({"action": "maybe"})), Permission::Invalid);
    assert_eq!(p(json!({"action": "cancel"})), Permission::Canceled);
    assert_eq!(p(json!({"action": "decline"})), Permission::Declined);
    assert_eq!(
        p(json!({"action": "accept", "content": {"choice": "dont_allow"}})),
        Permission::Declined
    );
    assert_eq!(
        p(json!({"action": "accept", "content": {"choice": "always_allow"}})),
        Permission::Approved { remember: true }
    );
    assert_eq!(
        p(json!({"action": "accept", "content": {"choice": "this_session_only"}})),
        Permission::Approved { remember: false }
    );
    assert_eq!(p(json!({"action": "accept"})), Permission::BadChoice);
    assert!(takes_form_elicitation(Some(&json!({"elicitation": {}}))));
    assert!(takes_form_elicitation(Some(
        &json!({"elicitation": {"form": {}, "url": {}}})
    )));
    assert!(!takes_form_elicitation(Some(
        &json!({"elicitation": {"url": {}}})
    )));
    assert!(!takes_form_elicitation(Some(&json!({}))));
    assert!(!takes_form_elicitation(None));
    let q = permission_question(None);
    assert_eq!(
        q["inputRequests"][PERMISSION_KEY]["params"]["requestedSchema"]["properties"]["choice"]
            ["oneOf"][2]["const"],
        "dont_allow"
    );
}

#[test]
fn a_recorded_consent_names_the_next_call_and_no_url() {
    let body = json!({"requestId": "r", "state": "answer_ready", "changed": true,
                      "submit": {"url": "https://epode/answers", "authorization": "Bearer aqr1_next"}});
    let r = consent_recorded(200, Some(body));
    assert_eq!(r["isError"], false);
    assert_eq!(r["structuredContent"]["requestHandle"], "aqr1_next");
    assert!(r["structuredContent"]["submit"].get("url").is_none());
    assert!(r["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("requestHandle aqr1_next"));
    let r = consent_recorded(200, Some(json!({"state": "declined", "submit": null})));
    assert_eq!(
        r["content"][0]["text"],
        "Permission declined. Do not share customer context."
    );
    assert_eq!(consent_recorded(401, None)["isError"], true);
}
