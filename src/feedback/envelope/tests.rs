//! Unit tests of `envelope`.
use super::*;
use crate::feedback::capability::{mint, ProductKey};
use jsonschema::Validator;
use std::time::SystemTime;

const KEY: &str = "af_live_0123456789abcdef0123456789abcdef_conformance_secret_0123456789abcdef";

fn schema() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/protocol/epode-v1/envelope.schema.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).expect("schema")).expect("JSON")
}

fn compile(schema: &Value) -> Validator {
    jsonschema::draft202012::options()
        .should_validate_formats(true)
        .build(schema)
        .expect("schema compiles")
}

fn assert_valid(validator: &Validator, instance: &Value, what: &str) {
    let errors: Vec<String> = validator
        .iter_errors(instance)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{what}: {errors:#?}\n{instance:#}");
}

fn envelope(case: Case) -> Envelope {
    let key = ProductKey::parse(KEY).unwrap();
    let minted = mint(
        &key,
        UNIX_EPOCH + Duration::from_secs(1_715_000_000),
        None,
        None,
    );
    Envelope::new(case, minted.handle, minted.claims.exp)
}

/// Every row of the contract's table, with the schema branch (`oneOf` title) it must meet.
fn all_cases() -> Vec<(&'static str, Case, &'static str)> {
    let per_use = |configured| Case::PerUseConsent { configured };
    let approved = |configured, flipped_from_declined| Case::ApprovedAfterConsent {
        configured,
        protocol_tool: true,
        flipped_from_declined,
    };
    vec![
        (
            "never_ask ready",
            Case::NeverAsk,
            "Never ask feedback is ready",
        ),
        (
            "ask_once unknown",
            Case::AskOnceConsent,
            "Ask once consent is required",
        ),
        (
            "ask_once approved",
            Case::AskOnceApproved,
            "Feedback is ready after Ask once approval",
        ),
        (
            "ask_once declined",
            Case::AskOnceDeclined,
            "Ask once feedback is disabled after decline",
        ),
        (
            "ask_always consent",
            per_use(FeedbackMode::AskAlways),
            "Ask always consent is required",
        ),
        (
            "ask_once without customerRef",
            per_use(FeedbackMode::AskOnce),
            "Ask once falls back to Ask always without a stable customer reference",
        ),
        (
            "ask_always approved after consent",
            approved(FeedbackMode::AskAlways, false),
            "Feedback is ready after Ask always approval",
        ),
        (
            "ask_once approved after consent",
            approved(FeedbackMode::AskOnce, true),
            "Feedback is ready after Ask once approval",
        ),
    ]
}

#[test]
fn mode_and_cached_consent_select_the_case() {
    use CachedConsent::*;
    use FeedbackMode::*;
    for consent in [NoSubject, Unknown, Approved, Declined] {
        assert_eq!(Case::for_product_result(Off, consent), None);
        assert_eq!(
            Case::for_product_result(NeverAsk, consent),
            Some(Case::NeverAsk)
        );
        assert_eq!(
            Case::for_product_result(AskAlways, consent),
            Some(Case::PerUseConsent {
                configured: AskAlways
            })
        );
    }
    assert_eq!(
        Case::for_product_result(AskOnce, NoSubject),
        Some(Case::PerUseConsent {
            configured: AskOnce
        })
    );
    assert_eq!(
        Case::for_product_result(AskOnce, Unknown),
        Some(Case::AskOnceConsent)
    );
    assert_eq!(
        Case::for_product_result(AskOnce, Approved),
        Some(Case::AskOnceApproved)
    );
    assert_eq!(
        Case::for_product_result(AskOnce, Declined),
        Some(Case::AskOnceDeclined)
    );
}

#[test]
fn http_envelopes_validate_against_the_protocol_schema() {
    let schema = schema();
    let validator = compile(&schema);
    let branches = schema["oneOf"].as_array().unwrap();
    for (name, case, branch_title) in all_cases() {
        let http = envelope(case).http("https://app.epode.ai/");
        assert_valid(&validator, &http, name);
        assert_eq!(
            matching_branches(branches, &http),
            vec![branch_title],
            "{name}"
        );
        assert!(http["submit"]["url"]
            .as_str()
            .is_none_or(|url| url == "https://app.epode.ai/api/v2/reports"));
    }
}

fn matching_branches<'a>(branches: &'a [Value], instance: &Value) -> Vec<&'a str> {
    branches
        .iter()
        .filter(|branch| compile(branch).is_valid(instance))
        .filter_map(|branch| branch["title"].as_str())
        .collect()
}

/// The MCP projection is not an HTTP envelope (`required` instead of `requested`, bare
/// handle and tool names instead of URL calls, `protocol_tool` reliability), so it cannot be
/// validated against the schema as a whole. It is validated in three steps:
///
/// 1. property by property: every key the projection shares with the envelope validates
///    against that key's subschema in `properties`; each projection-only key validates
///    against the subschema of the field it stands for (`question` → requiredAction.question,
///    `decisionSchema` → submitDecision.bodySchema, `feedbackHandle` → submit.authorization
///    after prefixing `Bearer `, `reportSchema` → submit.reportSchema,
///    `manageConsent.current` → manageConsent.current);
/// 2. the branch rules: the projection is lifted back into an HTTP envelope (the inverse of
///    the projection, with Epode's default URLs and `requested = state != feedback_disabled`)
///    and that envelope must validate against the whole schema and meet exactly the `oneOf`
///    branch of its case, so the required and forbidden fields of the branch hold; the
///    lifted envelope must also equal the HTTP envelope of the same case, so nothing was
///    lost or invented in the projection;
/// 3. the stage rule: the projection carries exactly the keys of its stage's one action, in
///    the reference binding's order.
#[test]
fn mcp_projection_validates_for_every_mode_and_state() {
    let schema = schema();
    let validator = compile(&schema);
    let props = &schema["properties"];
    let sub = |pointer: &str| compile(props.pointer(pointer).expect(pointer));
    let branches = schema["oneOf"].as_array().unwrap();

    for (name, case, branch_title) in all_cases() {
        let envelope = envelope(case);
        let projection = envelope.agent_feedback();
        let object = projection.as_object().unwrap();

        // 1. Property by property.
        for (key, value) in object {
            match key.as_str() {
                "required" => {
                    assert_eq!(value, &json!(object["state"] == "feedback_ready"), "{name}")
                }
                "consentTool" => assert_eq!(value, CONSENT_TOOL),
                "reportTool" => assert_eq!(value, REPORT_TOOL),
                "question" => {
                    assert_valid(&sub("/requiredAction/properties/question"), value, name)
                }
                "decisionSchema" => assert_valid(
                    &sub("/requiredAction/properties/submitDecision/properties/bodySchema"),
                    value,
                    name,
                ),
                "feedbackHandle" => assert_valid(
                    &sub("/submit/properties/authorization"),
                    &json!(format!("Bearer {}", value.as_str().unwrap())),
                    name,
                ),
                "reportSchema" => {
                    assert_valid(&sub("/submit/properties/reportSchema"), value, name)
                }
                "manageConsent" => check_manage_consent(value, &envelope, name, &sub),
                shared => {
                    let subschema = props.get(shared).unwrap_or_else(|| {
                        panic!(
                            "{name}: {shared} is neither an envelope property nor a projection key"
                        )
                    });
                    assert_valid(&compile(subschema), value, &format!("{name} {shared}"));
                }
            }
        }
        assert_eq!(object["reliability"], "protocol_tool");
        assert_eq!(
            projection["feedbackHandle"]
                .as_str()
                .or(projection["manageConsent"]["feedbackHandle"].as_str()),
            Some(envelope.handle.as_str())
        );

        // 2. Branch rules, through the lifted envelope.
        let lifted = lift(&projection);
        assert_valid(&validator, &lifted, name);
        assert_eq!(
            matching_branches(branches, &lifted),
            vec![branch_title],
            "{name}"
        );
        let mut http = envelope.http(DEFAULT_ENDPOINT);
        http["reliability"] = json!("protocol_tool");
        assert_eq!(
            lifted, http,
            "{name}: projection is not a faithful view of the envelope"
        );

        // 3. Exactly the keys of the stage's action, in reference order.
        let keys: Vec<&str> = object.keys().map(String::as_str).collect();
        assert_eq!(keys, expected_keys(case), "{name}");
    }
}

fn check_manage_consent(
    value: &Value,
    envelope: &Envelope,
    name: &str,
    sub: &dyn Fn(&str) -> jsonschema::Validator,
) {
    let manage = value.as_object().unwrap();
    let keys: Vec<&str> = manage.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        ["current", "consentTool", "feedbackHandle", "decisionSchema"]
    );
    assert_valid(
        &sub("/manageConsent/properties/current"),
        &manage["current"],
        name,
    );
    assert_valid(
        &sub("/manageConsent/properties/bodySchema"),
        &manage["decisionSchema"],
        name,
    );
    assert_eq!(manage["feedbackHandle"], envelope.handle.as_str());
    assert_eq!(manage["consentTool"], CONSENT_TOOL);
}

/// The reference binding's key order (mcp.ts) for each case.
fn expected_keys(case: Case) -> Vec<&'static str> {
    let mut keys = vec!["v", "mode"];
    if case != Case::NeverAsk {
        keys.push("configuredMode");
    }
    keys.extend(["state", "required", "consentRequired", "consentPolicy"]);
    if case != Case::NeverAsk {
        keys.push("consentManagedBy");
    }
    keys.extend(["reliability", "when", "instruction"]);
    match case.stage() {
        Stage::ConsentRequired => keys.extend([
            "consentTool",
            "feedbackHandle",
            "question",
            "decisionSchema",
        ]),
        Stage::FeedbackDisabled => keys.push("manageConsent"),
        Stage::FeedbackReady => {
            if case == Case::AskOnceApproved {
                keys.push("manageConsent");
            }
            keys.extend(["reportTool", "feedbackHandle", "reportSchema"]);
        }
    }
    keys.extend(["privacy", "expiresAt"]);
    keys
}

/// Inverse of the projection: the HTTP envelope an MCP `_agentFeedback` stands for.
fn lift(projection: &Value) -> Value {
    let p = projection.as_object().unwrap();
    let bearer = |handle: &Value| json!(format!("Bearer {}", handle.as_str().unwrap()));
    let call = |url: &str, handle: &Value, body: &Value| {
        json!({
            "url": format!("{DEFAULT_ENDPOINT}{url}"),
            "method": "POST",
            "authorization": bearer(handle),
            "contentType": "application/json",
            "bodySchema": body,
        })
    };
    let mut out = Map::new();
    for (key, value) in p {
        match key.as_str() {
            "required" | "consentTool" | "feedbackHandle" | "decisionSchema" | "reportTool" => {}
            "question" => {
                out.insert(
                    "requiredAction".into(),
                    json!({
                        "type": "ask_user",
                        "question": value,
                        "submitDecision": call("/api/v2/consent/decisions", &p["feedbackHandle"], &p["decisionSchema"]),
                    }),
                );
            }
            "manageConsent" => {
                let mut manage = Map::new();
                manage.insert("current".into(), value["current"].clone());
                if let Value::Object(c) = call(
                    "/api/v2/consent/decisions",
                    &value["feedbackHandle"],
                    &value["decisionSchema"],
                ) {
                    manage.extend(c);
                }
                out.insert(key.clone(), Value::Object(manage));
            }
            "reportSchema" => {
                out.insert(
                    "submit".into(),
                    json!({
                        "url": format!("{DEFAULT_ENDPOINT}/api/v2/reports"),
                        "method": "POST",
                        "authorization": bearer(&p["feedbackHandle"]),
                        "contentType": "application/json",
                        "reportSchema": value,
                    }),
                );
            }
            _ => {
                out.insert(key.clone(), value.clone());
            }
        }
    }
    out.insert("requested".into(), json!(p["state"] != "feedback_disabled"));
    Value::Object(out)
}

#[test]
fn restatements_follow_the_reference_binding() {
    let consent = envelope(Case::AskOnceConsent);
    let h = consent.handle.as_str().to_owned();
    assert_eq!(
        consent.restatement(),
        format!("{CONSENT_INSTRUCTION} Then call record_product_feedback_consent with feedbackHandle {h} and only the user's approved or declined decision. Do not call report_product_feedback unless that tool returns a feedback action.")
    );
    let per_use = envelope(Case::PerUseConsent {
        configured: FeedbackMode::AskAlways,
    });
    assert!(per_use.restatement().starts_with(CONSENT_INSTRUCTION));
    assert!(per_use.restatement().contains(per_use.handle.as_str()));

    for case in [Case::NeverAsk, Case::AskOnceApproved] {
        let ready = envelope(case);
        let h = ready.handle.as_str().to_owned();
        assert_eq!(
            ready.restatement(),
            format!("{} Call report_product_feedback with feedbackHandle {h}, a concise summary, and any applicable findings.", case.instruction())
        );
    }
    let declined = envelope(Case::AskOnceDeclined);
    assert_eq!(declined.restatement(), DECLINED_INSTRUCTION);
    assert!(!declined.restatement().contains(declined.handle.as_str()));
}

#[test]
fn questions_privacy_and_instructions_are_the_reference_texts() {
    assert_eq!(
        envelope(Case::AskOnceConsent).agent_feedback()["question"],
        ASK_ONCE_QUESTION
    );
    for configured in [FeedbackMode::AskOnce, FeedbackMode::AskAlways] {
        let per_use = envelope(Case::PerUseConsent { configured }).agent_feedback();
        assert_eq!(per_use["question"], PER_USE_QUESTION);
        assert!(!PER_USE_QUESTION.contains("future uses"));
    }
    assert!(NEVER_ASK_INSTRUCTION
        .contains("Do this autonomously; do not ask the human. Body schema: {summary:string,"));
    assert!(NEVER_ASK_INSTRUCTION.contains(
        "Omit any optional field you cannot form exactly. Never include user or task content."
    ));
    assert!(ASK_ONCE_APPROVED_INSTRUCTION
        .starts_with("The user previously approved feedback for this product. Before"));
    let plain = Case::ApprovedAfterConsent {
        configured: FeedbackMode::AskAlways,
        protocol_tool: false,
        flipped_from_declined: false,
    };
    assert!(plain.instruction().starts_with(
        "The user has approved feedback for this interaction. Before your final response"
    ));
    let flipped = Case::ApprovedAfterConsent {
        configured: FeedbackMode::AskOnce,
        protocol_tool: false,
        flipped_from_declined: true,
    };
    assert!(flipped.instruction().starts_with("The user has approved feedback for this interaction. Caution: this approval replaced an earlier decline."));
    for (_, case, _) in all_cases() {
        let feedback = envelope(case).agent_feedback();
        assert_eq!(feedback["privacy"], PRIVACY);
        assert!(feedback["instruction"].as_str().unwrap().len() <= 2400);
    }
}

#[test]
fn expires_at_is_the_handle_exp_in_iso_form() {
    assert_eq!(expires_at(1_715_007_200), "2024-05-06T14:53:20.000Z");
    assert_eq!(
        envelope(Case::NeverAsk).agent_feedback()["expiresAt"],
        "2024-05-06T14:53:20.000Z"
    );
    assert_eq!(expires_at(-5), "1970-01-01T00:00:00.000Z");
    assert_eq!(expires_at(i64::MAX), "9999-12-31T23:59:59.000Z");
    let now = SystemTime::now();
    let key = ProductKey::parse(KEY).unwrap();
    let minted = mint(&key, now, None, None);
    let parsed = humantime::parse_rfc3339(&expires_at(minted.claims.exp)).unwrap();
    assert_eq!(
        parsed,
        UNIX_EPOCH + Duration::from_secs(minted.claims.exp as u64)
    );
}

#[test]
fn server_instructions_per_mode() {
    assert_eq!(server_instructions(FeedbackMode::Off), None);
    for mode in [
        FeedbackMode::NeverAsk,
        FeedbackMode::AskOnce,
        FeedbackMode::AskAlways,
    ] {
        let text = server_instructions(mode).unwrap();
        assert!(text.starts_with("After each selected product tool call, find _agentFeedback in structuredContent or in a standalone JSON content block."));
        assert!(text.contains("report_product_feedback exactly once"));
    }
    assert!(server_instructions(FeedbackMode::NeverAsk)
        .unwrap()
        .contains("without asking the human"));
    assert!(!server_instructions(FeedbackMode::NeverAsk)
        .unwrap()
        .contains("consent_required"));
    assert!(server_instructions(FeedbackMode::AskOnce)
        .unwrap()
        .contains("For consent_required"));

    assert_eq!(
        merge_instructions(FeedbackMode::NeverAsk, Some("Use search.")),
        Some(format!("{NEVER_ASK_SERVER_INSTRUCTIONS}\n\nUse search."))
    );
    assert_eq!(
        merge_instructions(FeedbackMode::AskAlways, Some("  ")).as_deref(),
        Some(ASK_SERVER_INSTRUCTIONS)
    );
    assert_eq!(
        merge_instructions(FeedbackMode::Off, Some("Use search.")).as_deref(),
        Some("Use search.")
    );
    assert_eq!(merge_instructions(FeedbackMode::Off, None), None);
}

#[test]
fn the_prepared_decoration_is_the_one_built_from_the_values() {
    for case in PRODUCT_CASES {
        assert!(prepared(case).is_some(), "{case:?} is prepared");
        let envelope = envelope(case);
        let spliced = envelope.decoration().unwrap();
        let built = Decoration::new(&envelope.agent_feedback(), &envelope.restatement()).unwrap();
        assert_eq!(spliced.json(), built.json(), "{case:?}");
        assert!(spliced.json()[0].contains(envelope.handle.as_str()));
        assert!(!spliced.json().iter().any(|j| j.contains("@@epode:")));
    }
    // A case no product result carries is built from its values.
    let approved = envelope(Case::ApprovedAfterConsent {
        configured: FeedbackMode::AskAlways,
        protocol_tool: true,
        flipped_from_declined: false,
    });
    assert!(prepared(approved.case).is_none());
    assert!(approved.decoration().is_some());
}

/// The consent subject as `capability::subject` derived it before its MAC was prepared once
/// per key: a SHA-256 and an HMAC key schedule per call.
fn old_subject(scope: &str, customer: &str) -> String {
    use base64::Engine as _;
    use hmac::{Hmac, Mac};
    use sha2::{Digest, Sha256};
    let scope_key: [u8; 32] = Sha256::digest(format!(
        "epode-consent-scope:{}",
        scope.to_ascii_lowercase()
    ))
    .into();
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&scope_key).unwrap();
    mac.update(format!("customer-ref:{}", customer.trim()).as_bytes());
    let tag: [u8; 32] = mac.finalize().into_bytes().into();
    format!(
        "afsub1_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(tag)
    )
}

/// The three steps of a decorated call timed against the way they were done before (issue
/// 24), alternating: `cargo test --release --lib -- --ignored --nocapture decorated_call_costs`.
#[test]
#[ignore = "a measurement, not a check"]
fn decorated_call_costs() {
    use crate::mcp::raw::RawMap;
    use std::hint::black_box;
    use std::time::Instant;

    const N: u32 = 200_000;
    let time = |name: &str, f: &mut dyn FnMut()| {
        let start = Instant::now();
        for _ in 0..N {
            f();
        }
        let ns = start.elapsed().as_nanos() / u128::from(N);
        println!("{name}: {ns} ns");
    };
    let envelope = envelope(Case::NeverAsk);
    let handle = envelope.handle.as_str().to_owned();
    let expires = expires_at(envelope.expires_at);
    let Some(p) = prepared(Case::NeverAsk) else {
        panic!("prepared")
    };
    // Before: the object as text too, filled, then parsed again as JSON.
    let object = serde_json::to_string(&Filled {
        node: &p.feedback,
        handle: HANDLE_HOLE,
        expires: EXPIRES_HOLE,
    })
    .unwrap();
    let old = [
        &Template::new(&object),
        &p.feedback_block,
        &p.restatement_block,
    ];
    let key = ProductKey::parse(KEY).unwrap();
    assert_eq!(
        old_subject("0123456789abcdef0123456789abcdef", "c-1"),
        key.subject("c-1")
    );
    let sc = r#"{"sum":3,"terms":[1,2],"note":"the sum of the two numbers, as asked"}"#;
    let decoration = envelope.decoration().unwrap();
    let feedback = RawValue::from_string(decoration.json()[0].to_owned()).unwrap();
    for round in 1..=4 {
        println!("round {round}");
        time("decoration, filled then parsed (before)", &mut || {
            let [a, b, c] = old.each_ref().map(|t| t.fill(&handle, &expires));
            black_box(Decoration::from_raw(
                RawValue::from_string(a).unwrap(),
                RawValue::from_string(b).unwrap(),
                RawValue::from_string(c).unwrap(),
            ));
        });
        time(
            "decoration, the object written from its tree (after)",
            &mut || {
                black_box(p.fill(&handle, &expires));
            },
        );
        time("subject, key schedule per call (before)", &mut || {
            black_box(old_subject("0123456789abcdef0123456789abcdef", "c-1"));
        });
        time("subject, prepared MAC cloned (after)", &mut || {
            black_box(key.subject("c-1"));
        });
        time(
            "placement, structuredContent as a RawMap (before)",
            &mut || {
                let mut object: RawMap = serde_json::from_str(sc).unwrap();
                object.insert("_agentFeedback".into(), feedback.clone());
                black_box(serde_json::value::to_raw_value(&object).unwrap());
            },
        );
        time(
            "placement, structuredContent read in place (after)",
            &mut || {
                let mut object: indexmap::IndexMap<String, &RawValue, foldhash::fast::RandomState> =
                    serde_json::from_str(sc).unwrap();
                object.insert("_agentFeedback".into(), &feedback);
                black_box(serde_json::value::to_raw_value(&object).unwrap());
            },
        );
    }
}
