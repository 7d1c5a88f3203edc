//! The admission rules the real Epode service applies to what it receives, as the embedded
//! Epode of the local trial applies them: no payload field that could carry raw content, and
//! no report text that reads like a credential, an email address or a prompt echo. Written
//! from the service's published behaviour (os-agent-feedback `backend/src`).

use serde_json::Value;

/// Keys refused anywhere in a body, compared lowercase with `-` read as `_`.
const FORBIDDEN_KEYS: [&str; 17] = [
    "prompt",
    "prompts",
    "transcript",
    "messages",
    "raw_input",
    "raw_output",
    "tool_input",
    "tool_output",
    "secret",
    "api_key",
    "authorization",
    "customer_data",
    "email",
    "name",
    "user",
    "user_data",
    "personal_data",
];

/// The service's answer to a body with a forbidden key.
pub(crate) const FORBIDDEN_KEYS_MESSAGE: &str =
    "Raw prompts, transcripts, secrets, customer data, and tool payloads are not accepted";

/// Text that signals a credential, or a prompt or transcript pasted into a report.
const SENSITIVE_PHRASES: [&str; 18] = [
    "af_live_",
    "af_read_",
    "github_pat_",
    "ghp_",
    "aws_secret",
    "sk-ant-",
    "sk-proj-",
    "xoxb-",
    "xoxp-",
    "-----begin ",
    "api key",
    "password",
    "prompt was",
    "user asked",
    "transcript:",
    "prompt:",
    "raw input:",
    "raw output:",
];

/// Whether any object in `value`, at any depth, has a forbidden key.
pub(crate) fn has_forbidden_key(value: &Value) -> bool {
    match value {
        Value::Object(map) => map.iter().any(|(key, v)| {
            let key: String = key
                .to_lowercase()
                .chars()
                .map(|c| if c == '-' { '_' } else { c })
                .collect();
            FORBIDDEN_KEYS.contains(&key.as_str()) || has_forbidden_key(v)
        }),
        Value::Array(items) => items.iter().any(has_forbidden_key),
        _ => false,
    }
}

/// An AWS access key id: `AKIA`/`ASIA` then twelve uppercase letters or digits (case matters,
/// so the word "Asia" is fine).
fn has_aws_key_id(text: &str) -> bool {
    ["AKIA", "ASIA"].iter().any(|prefix| {
        text.match_indices(prefix).any(|(at, _)| {
            let rest = &text.as_bytes()[at + prefix.len()..];
            rest.len() >= 12
                && rest[..12]
                    .iter()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
        })
    })
}

fn has_email(lower: &str) -> bool {
    lower.split_whitespace().any(|word| {
        let word = word.trim_matches(|c: char| !(c.is_ascii_alphanumeric() || "@._+-".contains(c)));
        word.split_once('@')
            .is_some_and(|(local, domain)| !local.is_empty() && domain.contains('.'))
    })
}

/// `Bearer ` followed by a token-like word of 20 or more characters.
fn has_bearer_token(lower: &str) -> bool {
    let token_char = |c: char| c.is_ascii_alphanumeric() || "-._~+/=".contains(c);
    lower.match_indices("bearer ").any(|(at, m)| {
        let word = lower[at + m.len()..]
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .trim_matches(|c: char| !token_char(c));
        word.len() >= 20 && word.chars().all(token_char)
    })
}

/// Whether report text would be refused as sensitive.
pub(crate) fn is_sensitive_text(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    has_aws_key_id(text)
        || SENSITIVE_PHRASES.iter().any(|p| lower.contains(p))
        || has_email(&lower)
        || has_bearer_token(&lower)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn forbidden_keys_are_found_at_any_depth() {
        assert!(has_forbidden_key(&json!({"a": [{"Raw-Input": 1}]})));
        assert!(has_forbidden_key(&json!({"meta": {"transcript": "x"}})));
        assert!(!has_forbidden_key(
            &json!({"summary": "metadata only", "findings": []})
        ));
    }

    #[test]
    fn sensitive_text_is_refused_and_ordinary_text_is_not() {
        for bad in [
            "write to ops@example.com for access",
            "the password field was empty",
            "key AKIAIOSFODNN7EXAMPLE leaked",
            "sent Bearer abcdefghijklmnopqrstuvwxyz123 upstream",
            "The user asked for a refund",
        ] {
            assert!(is_sensitive_text(bad), "{bad}");
        }
        for fine in [
            "Order lookup returned the status quickly",
            "Shipping to Asia took longer than documented",
            "The bearer of good news",
        ] {
            assert!(!is_sensitive_text(fine), "{fine}");
        }
    }
}
