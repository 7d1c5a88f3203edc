//! The binding's part in the HTTP surface: the identity of an HTTP response (the app's
//! `Epode-Identity`, else a trusted gateway's headers, with the customerRef rule), the envelope
//! for its mode and the cached consent (as a product tool result gets, in the HTTP shape), and
//! its telemetry event and consent warm-up once it is answered. Where the envelope goes is the
//! HTTP surface's business.

use http::HeaderMap;

use super::feedback_binding::{FeedbackBinding, Grant};
use crate::caller::CallerKey;
use crate::epode::telemetry::HttpCompletion;
use crate::feedback::envelope::Envelope;
use crate::feedback::identity::IdentityRefs;

/// The envelope made for one HTTP response.
pub(crate) struct HttpEnvelope {
    /// The protocol's HTTP envelope, compact JSON.
    pub(crate) json: String,
    /// The capability's `i`: the telemetry event's and the report's interaction.
    pub(crate) interaction_id: String,
    /// The consent stage (`feedback_ready`, `consent_required`, `feedback_disabled`).
    pub(crate) state: &'static str,
    /// The Ask-once consent subject, warmed once the response is answered.
    subject: Option<String>,
}

impl FeedbackBinding {
    /// The references of an HTTP response: the app's (`Epode-Identity`) first, then a trusted
    /// gateway's request headers, then the one customerRef rule. Never the client's own.
    pub(crate) fn http_refs(&self, app: IdentityRefs, request: &HeaderMap) -> IdentityRefs {
        self.shared_refs(app, self.header_refs(request))
    }

    /// Mints the response's handle and builds its envelope, as `hooks.rs` does for a product
    /// tool result: the consent subject from customerRef in Ask once, the cached decision and
    /// its revision (the cache only: a response never waits for Epode). `None` when feedback
    /// is off. With auth on, `bound` is the verified caller the handle is issued to.
    pub(crate) fn http_envelope(
        &self,
        refs: &IdentityRefs,
        bound: Option<CallerKey>,
    ) -> Option<HttpEnvelope> {
        let Grant {
            subject,
            case,
            minted,
        } = self.grant(refs, "HTTP responses without a customerRef", bound)?;
        let case = case?;
        let envelope = Envelope::new(case, minted.handle, minted.claims.exp);
        Some(HttpEnvelope {
            json: envelope.http(self.endpoint()).to_string(),
            interaction_id: minted.claims.i,
            state: case.stage().as_str(),
            subject,
        })
    }

    /// The response was answered with `envelope`: its telemetry event goes to the queue, and
    /// an Ask-once subject's consent is looked up in the background for the next response.
    pub(crate) fn http_answered(&self, envelope: &HttpEnvelope, completion: &HttpCompletion) {
        self.record_http(completion);
        if let Some(s) = &envelope.subject {
            self.refresh_consent(s);
        }
    }
}
