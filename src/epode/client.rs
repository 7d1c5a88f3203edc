//! The Epode API client: the endpoints the sidecar calls (feedback's four, customer context's four). Agent-side calls (consent
//! decisions, reports) carry the feedback handle as Bearer; product calls (telemetry, consent
//! state) carry the product key. Neither ever reaches a log. Nothing Epode sends is trusted:
//! redirects are not followed and at most [`MAX_ANSWER_BYTES`] of an answer is read.

use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{HeaderMap, AUTHORIZATION, CONTENT_TYPE};
use serde_json::Value;
use url::Url;

use crate::feedback::capability::ProductKey;

pub(crate) const DECISIONS_PATH: &str = "/api/v2/consent/decisions";
pub(crate) const REPORTS_PATH: &str = "/api/v2/reports";
pub(crate) const STATE_PATH: &str = "/api/v2/consent/state";
pub(crate) const BATCHES_PATH: &str = "/api/v2/telemetry/batches";
pub(crate) const ENRICHMENT_PATH: &str = "/api/v2/enrichment/requests";
pub(crate) const INSPECT_PATH: &str = "/api/v2/enrichment/requests/inspect";
pub(crate) const CONTEXT_CONSENT_PATH: &str = "/api/v2/enrichment/consent/decisions";
pub(crate) const ANSWERS_PATH: &str = "/api/v2/enrichment/answers";

/// The most of an Epode answer the sidecar reads: its answers are small JSON objects (a
/// receipt, a consent state, a stored report of at most a few KiB).
pub(crate) const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// A call that produced no usable HTTP answer: the network failed, the deadline passed, or
/// the answer was larger than any answer Epode gives.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EpodeError {
    #[error("Epode did not answer within {0:?}")]
    Timeout(Duration),
    #[error("Epode could not be reached: {0}")]
    Network(String),
    #[error("Epode's answer is larger than {MAX_ANSWER_BYTES} bytes; it was not read")]
    TooLarge,
}

impl EpodeError {
    /// The failure's `error.type`.
    fn kind(&self) -> &'static str {
        match self {
            EpodeError::Timeout(_) => "timeout",
            EpodeError::Network(_) => "network",
            EpodeError::TooLarge => "answer_too_large",
        }
    }
}

/// An HTTP answer from Epode.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl Answer {
    pub(crate) fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }
}

pub(crate) struct EpodeClient {
    http: reqwest::Client,
    base: Url,
    key: ProductKey,
}

impl EpodeClient {
    /// Builds the client. Redirects are never followed (an agent-side call carries a bearer
    /// credential, and Epode never redirects its API; a 3xx is a failure like any non-2xx).
    pub(crate) fn new(base: Url, key: ProductKey) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .user_agent(concat!("epode-sidecar/", env!("CARGO_PKG_VERSION")))
            .pool_idle_timeout(Duration::from_secs(30))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("cannot build the Epode HTTP client: {e}"))?;
        Ok(EpodeClient { http, base, key })
    }

    /// `<base>/api/v2/…`
    fn url(&self, path: &str) -> String {
        let base = self.base.as_str().trim_end_matches('/');
        format!("{base}{path}")
    }

    async fn post(
        &self,
        path: &str,
        bearer: &str,
        body: Bytes,
        timeout: Duration,
    ) -> Result<Answer, EpodeError> {
        let span = crate::otel::child(operation_span(path), || self.span_attributes(path));
        let answered = self.send(path, bearer, body, timeout).await;
        if let Some(span) = &span {
            match &answered {
                Ok(a) => {
                    span.set(opentelemetry::KeyValue::new(
                        "http.response.status_code",
                        i64::from(a.status),
                    ));
                    if a.status >= 400 {
                        span.failed(&a.status.to_string());
                    }
                }
                Err(e) => span.failed(e.kind()),
            }
        }
        answered
    }

    /// The attributes of a call's span, by the HTTP client conventions (no credential).
    fn span_attributes(&self, path: &str) -> Vec<opentelemetry::KeyValue> {
        use opentelemetry::KeyValue;
        let mut out = vec![
            KeyValue::new("http.request.method", "POST"),
            KeyValue::new("url.full", self.shown_url(path)),
            KeyValue::new("epode.operation", operation(path)),
        ];
        if let Some(h) = self.base.host_str() {
            out.push(KeyValue::new("server.address", h.to_owned()));
        }
        if let Some(p) = self.base.port_or_known_default() {
            out.push(KeyValue::new("server.port", i64::from(p)));
        }
        out
    }

    /// `<base>/api/v2/…` as a span shows it: no user information, query or fragment.
    fn shown_url(&self, path: &str) -> String {
        let mut base = self.base.clone();
        let _ = base.set_username("");
        let _ = base.set_password(None);
        base.set_query(None);
        base.set_fragment(None);
        format!("{}{path}", base.as_str().trim_end_matches('/'))
    }

    async fn send(
        &self,
        path: &str,
        bearer: &str,
        body: Bytes,
        timeout: Duration,
    ) -> Result<Answer, EpodeError> {
        let req = self
            .http
            .post(self.url(path))
            .header(AUTHORIZATION, format!("Bearer {bearer}"))
            .header(CONTENT_TYPE, "application/json")
            .body(body)
            .timeout(timeout);
        let mut resp = req.send().await.map_err(|e| classify(&e, timeout))?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        if resp
            .content_length()
            .is_some_and(|n| n > MAX_ANSWER_BYTES as u64)
        {
            return Err(EpodeError::TooLarge);
        }
        let mut body = bytes::BytesMut::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| classify(&e, timeout))? {
            if body.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(EpodeError::TooLarge);
            }
            body.extend_from_slice(&chunk);
        }
        let body = body.freeze();
        Ok(Answer {
            status,
            headers,
            body,
        })
    }

    /// Records a consent decision (agent-side: the handle is the credential).
    pub(crate) async fn post_decision(
        &self,
        handle: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<Answer, EpodeError> {
        self.post(DECISIONS_PATH, handle, json_body(body), timeout)
            .await
    }

    /// Submits a feedback report (agent-side: the handle is the credential).
    pub(crate) async fn post_report(
        &self,
        handle: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<Answer, EpodeError> {
        self.post(REPORTS_PATH, handle, json_body(body), timeout)
            .await
    }

    /// Looks up an Ask-once consent subject's state (product key).
    pub(crate) async fn consent_state(
        &self,
        subject: &str,
        timeout: Duration,
    ) -> Result<Answer, EpodeError> {
        let body = serde_json::json!({ "subject": subject });
        self.post(
            STATE_PATH,
            self.key.expose_secret(),
            json_body(&body),
            timeout,
        )
        .await
    }

    /// Asks for customer context after a product call (product key).
    pub(crate) async fn enrichment_request(
        &self,
        body: &Value,
        timeout: Duration,
    ) -> Result<Answer, EpodeError> {
        self.post(
            ENRICHMENT_PATH,
            self.key.expose_secret(),
            json_body(body),
            timeout,
        )
        .await
    }

    /// One of the customer-context agent calls (inspect, consent, answers: `path`); the
    /// request's `aqr1_` handle is the credential.
    pub(crate) async fn enrichment_agent(
        &self,
        path: &'static str,
        handle: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<Answer, EpodeError> {
        self.post(path, handle, json_body(body), timeout).await
    }

    /// Delivers a telemetry batch, its body already serialised (product key).
    pub(crate) async fn post_batch(
        &self,
        body: Bytes,
        timeout: Duration,
    ) -> Result<Answer, EpodeError> {
        self.post(BATCHES_PATH, self.key.expose_secret(), body, timeout)
            .await
    }
}

/// What a call to Epode is, by its path (`epode.operation`).
fn operation(path: &str) -> &'static str {
    match path {
        DECISIONS_PATH => "consent_decision",
        REPORTS_PATH => "report",
        STATE_PATH => "consent_state",
        BATCHES_PATH => "telemetry_batch",
        ENRICHMENT_PATH => "enrichment_request",
        INSPECT_PATH => "enrichment_inspect",
        CONTEXT_CONSENT_PATH => "enrichment_consent",
        ANSWERS_PATH => "enrichment_answer",
        _ => "other",
    }
}

/// A call's span name: `POST` and its route, as the HTTP client conventions write it.
fn operation_span(path: &str) -> &'static str {
    match path {
        DECISIONS_PATH => "POST /api/v2/consent/decisions",
        REPORTS_PATH => "POST /api/v2/reports",
        STATE_PATH => "POST /api/v2/consent/state",
        BATCHES_PATH => "POST /api/v2/telemetry/batches",
        ENRICHMENT_PATH => "POST /api/v2/enrichment/requests",
        INSPECT_PATH => "POST /api/v2/enrichment/requests/inspect",
        CONTEXT_CONSENT_PATH => "POST /api/v2/enrichment/consent/decisions",
        ANSWERS_PATH => "POST /api/v2/enrichment/answers",
        _ => "POST",
    }
}

fn json_body(body: &Value) -> Bytes {
    Bytes::from(body.to_string())
}

fn classify(e: &reqwest::Error, timeout: Duration) -> EpodeError {
    if e.is_timeout() {
        EpodeError::Timeout(timeout)
    } else {
        // Only the kind of failure: reqwest's text can carry the URL, never a credential.
        let kind = if e.is_connect() {
            "connection failed"
        } else if e.is_body() || e.is_decode() {
            "the answer broke off"
        } else {
            "request failed"
        };
        EpodeError::Network(kind.to_owned())
    }
}
