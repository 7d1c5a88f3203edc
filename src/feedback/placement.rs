//! Where `_agentFeedback` goes in a product tool's result, as the reference binding places it
//! (`sdk/node/src/mcp.ts`), on the raw result so every other value keeps its exact bytes.

use serde_json::value::{to_raw_value, RawValue};
use serde_json::{json, Value};

use indexmap::IndexMap;

use crate::mcp::raw::{as_str, RawMap};

fn raw_is_input_required(result: &RawMap) -> bool {
    result
        .get("resultType")
        .and_then(|value| as_str(value))
        .is_some_and(|kind| kind == "input_required")
}

/// An object's members read in place: the values stay in the upstream's text (only the keys
/// are copied), since all placement does is add a member and write the object again.
type Members<'a> = IndexMap<String, &'a RawValue, foldhash::fast::RandomState>;

/// The JSON a decoration adds to a result: the `_agentFeedback` object, the standalone text
/// block that carries it (`{"_agentFeedback": …}` as text), and the plain-text restatement
/// block. [`Envelope::decoration`](super::envelope::Envelope::decoration) builds it from text
/// serialised once per case.
pub(crate) struct Decoration {
    feedback: Box<RawValue>,
    feedback_block: Box<RawValue>,
    restatement_block: Box<RawValue>,
}

impl Decoration {
    /// From the projection and the restatement (the reference form, and the fallback).
    pub(crate) fn new(agent_feedback: &Value, restatement: &str) -> Option<Self> {
        let feedback = to_raw_value(agent_feedback).ok()?;
        let feedback_block = raw_text_block(&format!("{{\"_agentFeedback\":{}}}", feedback.get()));
        Some(Decoration {
            feedback,
            feedback_block,
            restatement_block: raw_text_block(restatement),
        })
    }

    /// From the three pieces, already JSON.
    pub(crate) fn from_raw(
        feedback: Box<RawValue>,
        feedback_block: Box<RawValue>,
        restatement_block: Box<RawValue>,
    ) -> Self {
        Decoration {
            feedback,
            feedback_block,
            restatement_block,
        }
    }

    /// The three pieces as JSON text.
    pub(crate) fn json(&self) -> [&str; 3] {
        [
            self.feedback.get(),
            self.feedback_block.get(),
            self.restatement_block.get(),
        ]
    }
}

/// Places `_agentFeedback` in a product tool result, as the reference binding does:
///
/// - a tool without `outputSchema` whose `structuredContent` is absent or an object gets
///   `structuredContent._agentFeedback` (creating `structuredContent` when absent);
/// - a tool with `outputSchema`, or a non-object `structuredContent`, keeps `structuredContent`
///   exactly as it was, and the object goes in a standalone JSON text block
///   `{"_agentFeedback": {...}}`; a non-object value with no text block first gets its own JSON
///   text, so adding ours does not hide it from clients that fall back to text;
/// - then one plain-text restatement.
///
/// Only `structuredContent` and `content` are rewritten, and every value inside them keeps its
/// exact bytes (`1e400` stays `1e400`). Returns false, changing nothing, for an
/// `input_required` result.
pub(crate) fn decorate(
    result: &mut RawMap,
    decoration: &Decoration,
    has_output_schema: bool,
) -> bool {
    if raw_is_input_required(result) {
        return false;
    }
    let structured = result.get("structuredContent");
    let structured_object: Option<Members<'_>> = structured
        .filter(|value| value.get().trim_start().starts_with('{'))
        .and_then(|value| serde_json::from_str(value.get()).ok());
    let non_object_structured = structured.is_some() && structured_object.is_none();
    // A `content` that is not an array is not MCP; like the reference, start a fresh one.
    let mut content: Vec<&RawValue> = result
        .get("content")
        .and_then(|value| serde_json::from_str(value.get()).ok())
        .unwrap_or_default();

    let own_text = match structured {
        Some(value) if non_object_structured && !content.iter().any(|b| is_text_block(b)) => {
            Some(raw_text_block(value.get().trim()))
        }
        _ => None,
    };
    if let Some(block) = &own_text {
        content.push(block);
    }
    let new_structured = if has_output_schema || non_object_structured {
        content.push(&decoration.feedback_block);
        None
    } else {
        let mut object = structured_object.unwrap_or_default();
        object.insert("_agentFeedback".into(), &decoration.feedback);
        match to_raw_value(&object) {
            Ok(value) => Some(value),
            Err(_) => return false,
        }
    };
    content.push(&decoration.restatement_block);
    let Ok(content) = to_raw_value(&content) else {
        return false;
    };
    // The reference builds `{...result, structuredContent, content}`: existing keys keep their
    // place, new ones follow in this order.
    if let Some(value) = new_structured {
        result.insert("structuredContent".into(), value);
    }
    result.insert("content".into(), content);
    true
}

fn is_text_block(block: &RawValue) -> bool {
    #[derive(serde::Deserialize)]
    struct Block<'a> {
        #[serde(rename = "type", borrow)]
        kind: Option<std::borrow::Cow<'a, str>>,
    }
    serde_json::from_str::<Block>(block.get()).is_ok_and(|b| b.kind.as_deref() == Some("text"))
}

fn text_block(text: &str) -> Value {
    json!({ "type": "text", "text": text })
}

fn raw_text_block(text: &str) -> Box<RawValue> {
    // A text block of a plain string always serialises; the default (`null`) would mark a bug.
    to_raw_value(&text_block(text)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::feedback::capability::{mint, ProductKey};
    use crate::feedback::envelope::{Case, Envelope};
    use crate::feedback::FeedbackMode;
    use std::time::{Duration, UNIX_EPOCH};

    const KEY: &str =
        "af_live_0123456789abcdef0123456789abcdef_conformance_secret_0123456789abcdef";

    /// [`decorate`] on a result given as a `Value` (for tests that build results with `json!`).
    fn decorate_value(
        result: &mut Value,
        agent_feedback: Value,
        restatement: String,
        has_output_schema: bool,
    ) -> bool {
        let Some(mut raw) = serde_json::from_str::<RawMap>(&result.to_string()).ok() else {
            return false;
        };
        let decoration = Decoration::new(&agent_feedback, &restatement).unwrap();
        if !decorate(&mut raw, &decoration, has_output_schema) {
            return false;
        }
        *result = serde_json::from_str(&serde_json::to_string(&raw).unwrap()).unwrap();
        true
    }

    fn feedback() -> (Value, String) {
        let key = ProductKey::parse(KEY).unwrap();
        let minted = mint(
            &key,
            UNIX_EPOCH + Duration::from_secs(1_715_000_000),
            None,
            None,
        );
        let envelope = Envelope::new(
            Case::for_product_result(
                FeedbackMode::NeverAsk,
                crate::feedback::envelope::CachedConsent::Unknown,
            )
            .unwrap(),
            minted.handle,
            minted.claims.exp,
        );
        (envelope.agent_feedback(), envelope.restatement())
    }

    fn texts(result: &Value) -> Vec<&str> {
        result["content"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect()
    }

    #[test]
    fn schemaless_tool_gets_structured_content_feedback() {
        let (feedback, restatement) = feedback();
        let raw = r#"{"content":[{"type":"text","text":"ok \u00e9"}],"structuredContent":{"big":12345678901234567890, "f":0.1,"e":1e400,"s":"\ud83d\ude80"},"isError":false,"_meta":{"x":"\u00e9","n":1E5}}"#;
        let mut result: RawMap = serde_json::from_str(raw).unwrap();
        let decoration = Decoration::new(&feedback, &restatement).unwrap();
        assert!(decorate(&mut result, &decoration, false));
        let keys: Vec<&str> = result.keys().map(String::as_str).collect();
        assert_eq!(keys, ["content", "structuredContent", "isError", "_meta"]);
        // Every value keeps its bytes: only the new key is appended.
        assert_eq!(
            result["structuredContent"].get(),
            format!(
                r#"{{"big":12345678901234567890,"f":0.1,"e":1e400,"s":"\ud83d\ude80","_agentFeedback":{feedback}}}"#
            )
        );
        assert_eq!(result["_meta"].get(), r#"{"x":"\u00e9","n":1E5}"#);
        assert!(result["content"]
            .get()
            .starts_with(r#"[{"type":"text","text":"ok \u00e9"},"#));
        let decorated: Value = serde_json::to_value(&result).unwrap();
        assert_eq!(texts(&decorated), ["ok é", restatement.as_str()]);
        assert_eq!(decorated["structuredContent"]["_agentFeedback"], feedback);

        // The Value form gives the same structure.
        let mut value: Value = serde_json::from_str(raw).unwrap();
        assert!(decorate_value(
            &mut value,
            feedback.clone(),
            restatement.clone(),
            false
        ));
        assert_eq!(value["structuredContent"]["_agentFeedback"], feedback);
        assert_eq!(
            value["structuredContent"]["big"],
            decorated["structuredContent"]["big"]
        );
        assert_eq!(texts(&value), ["ok é", restatement.as_str()]);

        // No structuredContent: it is created, holding only the feedback.
        let mut bare = json!({"content": [{"type": "text", "text": "ok"}]});
        assert!(decorate_value(
            &mut bare,
            feedback.clone(),
            restatement.clone(),
            false
        ));
        assert_eq!(
            bare["structuredContent"],
            json!({"_agentFeedback": feedback})
        );
        assert_eq!(texts(&bare), ["ok", restatement.as_str()]);

        // isError results are decorated too; no content array yet means one is created.
        let mut error = json!({"isError": true});
        assert!(decorate_value(
            &mut error,
            feedback.clone(),
            restatement.clone(),
            false
        ));
        assert_eq!(texts(&error), [restatement.as_str()]);
        assert_eq!(error["isError"], true);
    }

    #[test]
    fn output_schema_tool_keeps_structured_content_and_gets_a_json_block() {
        let (feedback, restatement) = feedback();
        let original = json!({"sum": 3, "a": 1, "b": 2});
        let mut result = json!({"content": [{"type": "text", "text": "{\"sum\":3}"}], "structuredContent": original});
        assert!(decorate_value(
            &mut result,
            feedback.clone(),
            restatement.clone(),
            true
        ));
        assert_eq!(result["structuredContent"], original);
        let texts = texts(&result);
        assert_eq!(texts.len(), 3);
        assert_eq!(texts[0], "{\"sum\":3}");
        let block: Value = serde_json::from_str(texts[1]).unwrap();
        assert_eq!(block, json!({"_agentFeedback": feedback}));
        assert_eq!(block.as_object().unwrap().len(), 1);
        assert_eq!(texts[2], restatement);
    }

    #[test]
    fn output_schema_placement_keeps_raw_structured_content_bytes() {
        let (feedback, restatement) = feedback();
        let raw = r#"{"structuredContent": {"sum": 1e400, "a": 0.10},"content":[]}"#;
        let mut result: RawMap = serde_json::from_str(raw).unwrap();
        let decoration = Decoration::new(&feedback, &restatement).unwrap();
        assert!(decorate(&mut result, &decoration, true));
        assert_eq!(
            result["structuredContent"].get(),
            r#"{"sum": 1e400, "a": 0.10}"#
        );

        // A non-object value keeps its bytes and is restated as text first.
        let mut array: RawMap =
            serde_json::from_str(r#"{"content":[],"structuredContent":[1e400]}"#).unwrap();
        assert!(decorate(&mut array, &decoration, false));
        assert_eq!(array["structuredContent"].get(), "[1e400]");
        let blocks: Vec<Value> = serde_json::from_str(array["content"].get()).unwrap();
        assert_eq!(blocks[0]["text"], "[1e400]");
        assert_eq!(blocks.len(), 3);
    }

    #[test]
    fn non_object_structured_content_uses_the_text_block() {
        let (feedback, restatement) = feedback();
        for value in [json!([1, 2]), json!("s"), json!(null), json!(7)] {
            // Without a text block, the value's own JSON text comes first.
            let mut result = json!({"content": [], "structuredContent": value});
            assert!(decorate_value(
                &mut result,
                feedback.clone(),
                restatement.clone(),
                false
            ));
            assert_eq!(result["structuredContent"], value);
            let t = texts(&result);
            assert_eq!(t.len(), 3, "{value}");
            assert_eq!(t[0], value.to_string());
            assert_eq!(
                serde_json::from_str::<Value>(t[1]).unwrap(),
                json!({"_agentFeedback": feedback})
            );
            assert_eq!(t[2], restatement);

            // With one, nothing is added besides ours.
            let mut with_text =
                json!({"content": [{"type": "text", "text": "x"}], "structuredContent": value});
            assert!(decorate_value(
                &mut with_text,
                feedback.clone(),
                restatement.clone(),
                false
            ));
            assert_eq!(texts(&with_text).len(), 3);
        }
    }

    #[test]
    fn undecoratable_results_are_left_alone() {
        let (feedback, restatement) = feedback();
        let mut pending = json!({"resultType": "input_required", "inputRequests": {}});
        let before = pending.clone();
        assert!(!decorate_value(
            &mut pending,
            feedback.clone(),
            restatement.clone(),
            false
        ));
        assert_eq!(pending, before);
        let mut not_object = json!([1]);
        assert!(!decorate_value(
            &mut not_object,
            feedback,
            restatement,
            false
        ));
        assert_eq!(not_object, json!([1]));
    }

    #[test]
    fn decorated_feedback_for_each_mode_round_trips_from_the_text_block() {
        let key = ProductKey::parse(KEY).unwrap();
        for mode in [
            FeedbackMode::NeverAsk,
            FeedbackMode::AskOnce,
            FeedbackMode::AskAlways,
        ] {
            let minted = mint(
                &key,
                UNIX_EPOCH + Duration::from_secs(1_715_000_000),
                None,
                None,
            );
            let case =
                Case::for_product_result(mode, crate::feedback::envelope::CachedConsent::Unknown)
                    .unwrap();
            let envelope = Envelope::new(case, minted.handle, minted.claims.exp);
            let mut result = json!({"content": [], "structuredContent": {"a": 1}});
            decorate_value(
                &mut result,
                envelope.agent_feedback(),
                envelope.restatement(),
                true,
            );
            let block: Value = serde_json::from_str(texts(&result)[0]).unwrap();
            assert_eq!(block["_agentFeedback"], envelope.agent_feedback());
        }
    }
}
