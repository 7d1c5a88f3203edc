//! Telemetry identity references (`accountRef`, `userRef`, `anonymousRef`, `customerRef`,
//! `sessionRef`), read only from sources the operator trusts: the upstream's private
//! `_meta["ai.epode/identity"]` object or configured header values. Each value is trimmed and
//! validated as protocol v1 says ("Completed MCP interaction contract"); an invalid one is
//! dropped, never truncated, and never suppresses the interaction. These references go to
//! telemetry only, never into a capability, an envelope or a report.

use serde_json::Value;

use super::FeedbackMode;

/// The private `_meta` key the upstream puts its identity object under.
pub(crate) const META_KEY: &str = "ai.epode/identity";
/// Longest accepted reference, in (ASCII) characters.
pub(crate) const MAX_REF_LEN: usize = 160;

/// One kind of reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum RefKind {
    Account,
    User,
    Anonymous,
    Customer,
    Session,
}

impl RefKind {
    /// Every kind, in telemetry field order.
    pub(crate) const ALL: [RefKind; 5] = [
        RefKind::Account,
        RefKind::User,
        RefKind::Anonymous,
        RefKind::Customer,
        RefKind::Session,
    ];

    /// The JSON field name, in telemetry and in the `_meta` identity object.
    pub(crate) fn key(self) -> &'static str {
        match self {
            RefKind::Account => "accountRef",
            RefKind::User => "userRef",
            RefKind::Anonymous => "anonymousRef",
            RefKind::Customer => "customerRef",
            RefKind::Session => "sessionRef",
        }
    }
}

/// The validated references of one product tool call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct IdentityRefs {
    pub(crate) account_ref: Option<String>,
    pub(crate) user_ref: Option<String>,
    pub(crate) anonymous_ref: Option<String>,
    pub(crate) customer_ref: Option<String>,
    pub(crate) session_ref: Option<String>,
}

impl IdentityRefs {
    /// Reads `_meta["ai.epode/identity"]`: an object whose string fields are the references.
    /// Anything else (not an object, a non-string field, an invalid value) contributes nothing.
    pub(crate) fn from_meta(identity: &Value) -> Self {
        let object = identity.as_object();
        Self::from_values(|kind| object?.get(kind.key())?.as_str())
    }

    /// Reads raw values from any source, such as the configured request or response headers.
    pub(crate) fn from_values<'a>(mut raw: impl FnMut(RefKind) -> Option<&'a str>) -> Self {
        let mut refs = IdentityRefs::default();
        for kind in RefKind::ALL {
            if let Some(value) = raw(kind) {
                refs.set(kind, value);
            }
        }
        refs
    }

    pub(crate) fn get(&self, kind: RefKind) -> Option<&str> {
        self.slot(kind).as_deref()
    }

    /// Sets `kind` from a raw value if it is valid; returns whether it was kept. An invalid value
    /// leaves any earlier valid one in place.
    pub(crate) fn set(&mut self, kind: RefKind, raw: &str) -> bool {
        match sanitize_ref(raw) {
            Some(value) => {
                *self.slot_mut(kind) = Some(value);
                true
            }
            None => false,
        }
    }

    /// Whether `other` names another value for a reference both hold (the product's identity
    /// against the verified token's, say).
    pub(crate) fn disagrees(&self, other: &IdentityRefs) -> bool {
        RefKind::ALL
            .iter()
            .any(|k| matches!((self.get(*k), other.get(*k)), (Some(a), Some(b)) if a != b))
    }

    /// Fills the references this one lacks from `fallback` (e.g. upstream `_meta` first, then
    /// gateway headers).
    pub(crate) fn or(mut self, fallback: IdentityRefs) -> Self {
        let IdentityRefs {
            account_ref,
            user_ref,
            anonymous_ref,
            customer_ref,
            session_ref,
        } = fallback;
        for (slot, value) in [
            (&mut self.account_ref, account_ref),
            (&mut self.user_ref, user_ref),
            (&mut self.anonymous_ref, anonymous_ref),
            (&mut self.customer_ref, customer_ref),
            (&mut self.session_ref, session_ref),
        ] {
            if slot.is_none() {
                *slot = value;
            }
        }
        self
    }

    /// The one customerRef rule, for the consent subject and for telemetry alike:
    /// `customerRef` is the legacy Ask-once subject, so it leaves the sidecar only in
    /// `ask_once` (the real Epode service records it as a leak on any other interaction), and
    /// there only without a conflict (see [`IdentityRefs::drop_conflicting_customer`]).
    /// Apply once, after every source has been merged.
    pub(crate) fn apply_customer_rule(&mut self, mode: FeedbackMode) {
        if mode == FeedbackMode::AskOnce {
            self.drop_conflicting_customer();
        } else {
            self.customer_ref = None;
        }
    }

    /// As the reference binding and the protocol's telemetry vectors: when a richer identity
    /// (`accountRef` or `userRef`) is present, `customerRef` is kept only if it equals
    /// `accountRef`. Only `customerRef` is dropped on a conflict.
    pub(crate) fn drop_conflicting_customer(&mut self) {
        let conflict = match (&self.customer_ref, &self.account_ref, &self.user_ref) {
            (Some(customer), Some(account), _) => customer != account,
            (Some(_), None, Some(_)) => true,
            _ => false,
        };
        if conflict {
            self.customer_ref = None;
        }
    }

    /// The present references, in telemetry field order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (RefKind, &str)> + '_ {
        RefKind::ALL
            .into_iter()
            .filter_map(|kind| self.get(kind).map(|value| (kind, value)))
    }

    fn slot(&self, kind: RefKind) -> &Option<String> {
        match kind {
            RefKind::Account => &self.account_ref,
            RefKind::User => &self.user_ref,
            RefKind::Anonymous => &self.anonymous_ref,
            RefKind::Customer => &self.customer_ref,
            RefKind::Session => &self.session_ref,
        }
    }

    fn slot_mut(&mut self, kind: RefKind) -> &mut Option<String> {
        match kind {
            RefKind::Account => &mut self.account_ref,
            RefKind::User => &mut self.user_ref,
            RefKind::Anonymous => &mut self.anonymous_ref,
            RefKind::Customer => &mut self.customer_ref,
            RefKind::Session => &mut self.session_ref,
        }
    }
}

/// Trims ASCII whitespace (U+0009–U+000D, U+0020; not Unicode spaces) from both ends, then
/// accepts 1–160 characters of `^[A-Za-z0-9_.:-]+$`.
pub(crate) fn sanitize_ref(raw: &str) -> Option<String> {
    let trimmed = raw.trim_matches(|c| matches!(c, '\t'..='\r' | ' '));
    let valid = (1..=MAX_REF_LEN).contains(&trimmed.len())
        && trimmed
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'));
    valid.then(|| trimmed.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conformance_vectors() -> Vec<Value> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/protocol/epode-v1/conformance.json"
        );
        let text = std::fs::read_to_string(path).expect("conformance fixture");
        let value: Value = serde_json::from_str(&text).expect("conformance JSON");
        value["mcpCompletion"]["vectors"]
            .as_array()
            .cloned()
            .expect("vectors")
    }

    #[test]
    fn references_are_trimmed_and_validated() {
        assert_eq!(
            sanitize_ref("  account_42  ").as_deref(),
            Some("account_42")
        );
        assert_eq!(
            sanitize_ref("\t\n\u{b}\u{c}\rsummary:canonical_42 ").as_deref(),
            Some("summary:canonical_42")
        );
        assert_eq!(sanitize_ref("A-z.0_9:x").as_deref(), Some("A-z.0_9:x"));
        assert_eq!(sanitize_ref(&"x".repeat(160)).map(|v| v.len()), Some(160));
        for bad in [
            "",
            "   ",
            "account@example.com",
            "user/42",
            "visitor 42",
            "\u{a0}account_42",
            "accoünt",
            &"x".repeat(161),
        ] {
            assert_eq!(sanitize_ref(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn meta_object_is_read_field_by_field() {
        let refs = IdentityRefs::from_meta(&json!({
            "accountRef": " account_42 ",
            "userRef": "user/42",
            "anonymousRef": 42,
            "sessionRef": "summary:s1",
            "other": "ignored",
        }));
        assert_eq!(
            refs,
            IdentityRefs {
                account_ref: Some("account_42".into()),
                session_ref: Some("summary:s1".into()),
                ..IdentityRefs::default()
            }
        );
        for not_object in [json!(null), json!("account_42"), json!(["account_42"])] {
            assert_eq!(
                IdentityRefs::from_meta(&not_object),
                IdentityRefs::default()
            );
        }
    }

    #[test]
    fn header_values_and_precedence() {
        let headers = [("x-account", "acct_1"), ("x-user", "bad value")];
        let from_headers = IdentityRefs::from_values(|kind| match kind {
            RefKind::Account => Some(headers[0].1),
            RefKind::User => Some(headers[1].1),
            _ => None,
        });
        assert_eq!(from_headers.get(RefKind::Account), Some("acct_1"));
        assert_eq!(from_headers.get(RefKind::User), None);

        let meta = IdentityRefs::from_meta(&json!({"userRef": "u1"}));
        let merged = meta.or(from_headers);
        assert_eq!(
            merged.iter().collect::<Vec<_>>(),
            vec![(RefKind::Account, "acct_1"), (RefKind::User, "u1")]
        );

        let mut refs = merged;
        assert!(!refs.set(RefKind::Account, "no good"));
        assert_eq!(refs.get(RefKind::Account), Some("acct_1"));
    }

    #[test]
    fn customer_ref_rule() {
        let refs = |account: Option<&str>, user: Option<&str>, customer: &str| IdentityRefs {
            account_ref: account.map(str::to_owned),
            user_ref: user.map(str::to_owned),
            customer_ref: Some(customer.to_owned()),
            ..IdentityRefs::default()
        };
        let kept = |mut r: IdentityRefs, mode| {
            r.apply_customer_rule(mode);
            r.customer_ref.is_some()
        };
        assert!(kept(refs(None, None, "c1"), FeedbackMode::AskOnce));
        assert!(kept(refs(Some("a1"), None, "a1"), FeedbackMode::AskOnce));
        assert!(kept(
            refs(Some("a1"), Some("u1"), "a1"),
            FeedbackMode::AskOnce
        ));
        assert!(!kept(
            refs(Some("a1"), Some("u1"), "c1"),
            FeedbackMode::AskOnce
        ));
        // A userRef alone is a richer identity the customerRef cannot match (reference mcp.ts).
        assert!(!kept(refs(None, Some("u1"), "u1"), FeedbackMode::AskOnce));
        for mode in [
            FeedbackMode::NeverAsk,
            FeedbackMode::AskAlways,
            FeedbackMode::Off,
        ] {
            assert!(!kept(refs(Some("a1"), None, "a1"), mode));
        }
        // The conflict drops only customerRef.
        let mut conflict = refs(Some("a1"), Some("u1"), "c1");
        conflict.apply_customer_rule(FeedbackMode::AskOnce);
        assert_eq!(conflict.account_ref.as_deref(), Some("a1"));
        assert_eq!(conflict.user_ref.as_deref(), Some("u1"));
    }

    /// The conformance vectors' identity handling (trim, drop invalid, customerRef conflict),
    /// with the customerRef rule applied as in ask_once, where customerRef is kept.
    #[test]
    fn conformance_vectors_identity_projection() {
        let mut checked = 0;
        for vector in conformance_vectors() {
            let Some(expected) = vector["expectedEvent"].as_object() else {
                continue;
            };
            let mut refs = IdentityRefs::from_meta(&vector["input"]);
            refs.apply_customer_rule(FeedbackMode::AskOnce);
            for kind in RefKind::ALL {
                assert_eq!(
                    refs.get(kind),
                    expected.get(kind.key()).and_then(Value::as_str),
                    "{} {}",
                    vector["name"],
                    kind.key()
                );
            }
            checked += 1;
        }
        assert_eq!(checked, 8);
    }
}
