//! The two endpoints an agent's feedback handle opens: the consent decision (the first
//! decision of an interaction wins; an Ask-once subject changes only with the revision the
//! handle saw) and the report (one per interaction, only with consent where the mode asks for
//! it, never in mode `off`).

use serde_json::{json, Value};

use super::{error, has_forbidden_key, is_sensitive_text, keep, now_text, reply, schema_error};
use super::{Decision, DevEpode, Reply, FORBIDDEN_KEYS_MESSAGE};
use crate::feedback::capability::{Claims, FeedbackHandle};
use crate::feedback::envelope::{Case, Envelope};
use crate::feedback::FeedbackMode;

/// What a decision call settles.
struct Settled {
    state: &'static str,
    decided_at: String,
    changed: bool,
    /// The report action may be given (the standing decision is an approval).
    report_allowed: bool,
    flipped_from_declined: bool,
}

/// Every report text field the service checks for sensitive content.
fn report_texts(body: &Value) -> Vec<&str> {
    let mut texts: Vec<&str> = body["summary"].as_str().into_iter().collect();
    for f in body["findings"].as_array().into_iter().flatten() {
        texts.extend(f["detail"].as_str());
    }
    texts.extend(body["workaround"]["detail"].as_str());
    texts
}

impl DevEpode {
    pub(super) fn decision(&self, bearer: Option<&str>, body: &Value) -> Reply {
        if !bearer.is_some_and(|t| t.starts_with("afr2_")) {
            return error(401, "Authentication required");
        }
        if has_forbidden_key(body) {
            return error(400, FORBIDDEN_KEYS_MESSAGE);
        }
        if let Some(e) = schema_error(&self.validators.decision, body) {
            return error(400, &e);
        }
        let Some((claims, handle)) = self.claims(bearer) else {
            return error(401, "Authentication required");
        };
        if !matches!(self.mode, FeedbackMode::AskOnce | FeedbackMode::AskAlways) {
            return error(
                409,
                "This product does not currently require a consent decision",
            );
        }
        let requested = if body["decision"] == "approved" {
            "approved"
        } else {
            "declined"
        };
        let settled = self.settle(&claims, requested);
        let feedback = if settled.report_allowed {
            self.envelope(&claims, handle, settled.flipped_from_declined)
        } else {
            Value::Null
        };
        let shown = json!({"interactionId": claims.i, "requested": requested, "state": settled.state, "changed": settled.changed});
        reply(
            200,
            &json!({"state": settled.state, "decidedAt": settled.decided_at, "changed": settled.changed, "feedback": feedback}),
        )
        .showing("consent", shown)
    }

    /// Records the decision (or finds the standing one).
    fn settle(&self, claims: &Claims, requested: &'static str) -> Settled {
        let mut state = self.lock();
        if let Some(d) = state.decisions.get(&claims.i).cloned() {
            return Settled {
                state: d.state,
                decided_at: d.decided_at,
                changed: false,
                report_allowed: d.state == "approved",
                flipped_from_declined: false,
            };
        }
        let decided_at = now_text();
        let subject = claims
            .s
            .clone()
            .filter(|_| self.mode == FeedbackMode::AskOnce);
        let mut flipped_from_declined = false;
        if let Some(s) = subject {
            let (standing, revision) = state.subjects.get(&s).copied().unwrap_or(("unknown", 0));
            let seen = claims.r.unwrap_or(0);
            let exists = state.subjects.contains_key(&s);
            // Compare and set: 0 may only create the subject; otherwise the revision seen must
            // be the current one. A stale handle gets the standing decision.
            if (seen == 0 && exists) || (seen > 0 && seen != revision) {
                return Settled {
                    state: standing,
                    decided_at,
                    changed: false,
                    report_allowed: false,
                    flipped_from_declined: false,
                };
            }
            flipped_from_declined = standing == "declined" && requested == "approved";
            keep(&mut state.subjects, s, (requested, revision + 1));
        }
        let decision = Decision {
            state: requested,
            decided_at: decided_at.clone(),
        };
        keep(&mut state.decisions, claims.i.clone(), decision);
        Settled {
            state: requested,
            decided_at,
            changed: true,
            report_allowed: requested == "approved",
            flipped_from_declined,
        }
    }

    /// The HTTP `feedback_ready` envelope an approval returns (the same handle reports).
    fn envelope(&self, claims: &Claims, handle: FeedbackHandle, flipped: bool) -> Value {
        let protocol_tool = self
            .lock()
            .events
            .get(&claims.i)
            .is_some_and(|e| e["surface"] == "mcp" && e["confirmationMethod"] == "mcp");
        let case = Case::ApprovedAfterConsent {
            configured: self.mode,
            protocol_tool,
            flipped_from_declined: flipped,
        };
        Envelope::new(case, handle, claims.exp).http(&self.origin)
    }

    pub(super) fn report(&self, bearer: Option<&str>, body: &Value) -> Reply {
        if !bearer.is_some_and(|t| t.starts_with("afr2_")) {
            return error(401, "Authentication required");
        }
        if has_forbidden_key(body) {
            return error(400, FORBIDDEN_KEYS_MESSAGE);
        }
        // The interaction, for the console only: the checks below keep the service's order.
        let interaction = self.claims(bearer).map(|(c, _)| c.i);
        let refused =
            |status, why: &str| self.refused_report(body, interaction.as_deref(), status, why);
        if let Some(e) = schema_error(&self.validators.report, body) {
            return refused(400, &e);
        }
        if report_texts(body).into_iter().any(is_sensitive_text) {
            return refused(400, "The feedback report appears to contain sensitive data");
        }
        let Some((claims, _)) = self.claims(bearer) else {
            return error(401, "Authentication required");
        };
        if self.mode == FeedbackMode::Off {
            return refused(410, "Feedback collection is disabled");
        }
        if self.mode != FeedbackMode::NeverAsk && !self.approved(&claims) {
            return refused(403, "Required user consent is missing or invalid");
        }
        let (stored, duplicate) = {
            let mut state = self.lock();
            match state.reports.get(&claims.i) {
                Some(first) => (first.clone(), true),
                None => {
                    let report = stored_report(&claims.i, body);
                    keep(&mut state.reports, claims.i.clone(), report.clone());
                    (report, false)
                }
            }
        };
        if duplicate {
            tracing::info!(
                target: "epode_sidecar::dev",
                interaction = %claims.i,
                "--dev: a second feedback report for one interaction: the first one stands (the embedded Epode answers with it)"
            );
        } else {
            tracing::info!(
                target: "epode_sidecar::dev",
                interaction = %claims.i,
                impact = stored["impact"].as_str().unwrap_or("-"),
                findings = stored["findings"].as_array().map_or(0, Vec::len),
                summary = stored["summary"].as_str().unwrap_or_default(),
                "--dev: feedback report received by the embedded Epode (the real Epode never sees it)"
            );
        }
        let shown = if duplicate {
            json!({"interactionId": claims.i, "status": 200, "duplicate": true, "report": body, "stands": stored})
        } else {
            json!({"interactionId": claims.i, "status": 200, "report": stored})
        };
        reply(
            200,
            &json!({"accepted": true, "interactionId": claims.i, "report": stored}),
        )
        .showing("report", shown)
    }

    /// Whether the interaction's consent (or its Ask-once subject's) is an approval.
    fn approved(&self, claims: &Claims) -> bool {
        let state = self.lock();
        let by_interaction = state
            .decisions
            .get(&claims.i)
            .is_some_and(|d| d.state == "approved");
        let by_subject = self.mode == FeedbackMode::AskOnce
            && claims
                .s
                .as_ref()
                .and_then(|s| state.subjects.get(s))
                .is_some_and(|(d, _)| *d == "approved");
        by_interaction || by_subject
    }

    /// A refused report: shown on the console (and the terminal) with why, then answered.
    fn refused_report(
        &self,
        body: &Value,
        interaction: Option<&str>,
        status: u16,
        why: &str,
    ) -> Reply {
        tracing::warn!(target: "epode_sidecar::dev", status, reason = why, "--dev: the embedded Epode refused a feedback report");
        error(status, why).showing(
            "report",
            json!({"status": status, "refused": why, "by": "embedded Epode", "interactionId": interaction, "report": body}),
        )
    }
}

/// The report as the service stores and returns it.
fn stored_report(interaction: &str, body: &Value) -> Value {
    json!({
        "id": uuid::Uuid::new_v4().hyphenated().to_string(),
        "workspaceId": "dev",
        "interactionId": interaction,
        "summary": body["summary"],
        "impact": body.get("impact").cloned().unwrap_or(Value::Null),
        "confidence": body.get("confidence").cloned().unwrap_or(Value::Null),
        "findings": body.get("findings").cloned().unwrap_or_else(|| json!([])),
        "workaround": body.get("workaround").cloned().unwrap_or(Value::Null),
        "source": "agent",
        "createdAt": now_text(),
    })
}
