//! The per-request context a request's answer is finished with: the request's id, its
//! method, the client's era, the `ResultPlan` (the binding's hook, the request's one end and
//! its hand-over point), and the shutdown cut. The method table builds it; whoever answers
//! (the table for a local result, `Upstream::forward` for the upstream's) consumes it, and
//! reports a failure to the plan where the failure is known.

use http::{Response, StatusCode};
use serde_json::value::RawValue;
use serde_json::Value;
use tokio::sync::watch;

use crate::body::{self, Body};
use crate::error::Error;
use crate::mcp::end::Abandoned;
use crate::mcp::era::Era;
use crate::mcp::method::{Called, Method};
use crate::mcp::raw::{self, raw};
use crate::mcp::rewrite::ResultPlan;

/// One request on its way to its answer.
pub(crate) struct RequestContext<'a> {
    pub(crate) id: &'a RawValue,
    pub(crate) method: &'a str,
    /// Its catalogue entry; `None` for a method the sidecar does not know.
    pub(crate) listed: Option<Method>,
    /// The client's era: the answer goes back in it.
    pub(crate) era: Era,
    /// An MRTR retry's `requestState`, as the client sent it.
    pub(crate) request_state: Option<&'a RawValue>,
    /// What the answer passes through (hook, identity, cache hints).
    pub(crate) plan: ResultPlan,
    /// Turns true when the sidecar cuts in-flight requests short at shutdown.
    pub(crate) cut: watch::Receiver<bool>,
}

impl<'a> RequestContext<'a> {
    pub(crate) fn new(
        id: &'a RawValue,
        method: &'a str,
        listed: Option<Method>,
        era: Era,
        abandoned: Abandoned,
        cut: watch::Receiver<bool>,
    ) -> Self {
        RequestContext {
            id,
            method,
            listed,
            era,
            request_state: None,
            plan: ResultPlan::new(listed, era, abandoned),
            cut,
        }
    }

    /// Its method as it travels: the wire name and the catalogue entry.
    pub(crate) fn called(&self) -> Called<'a> {
        Called {
            wire: self.method,
            listed: self.listed,
        }
    }

    /// A result the sidecar made, through the plan (for the client's era and the hook).
    pub(crate) fn local_result(mut self, result: Value) -> Response<Body> {
        let mut msg = raw::result_message(self.id, raw(&result));
        let bytes = self
            .plan
            .rewrite(&mut msg)
            .unwrap_or_else(|| raw::to_bytes(&msg));
        body::json(StatusCode::OK, bytes)
    }

    /// The request failed with `error` before an answer came: the plan hears it now, unless a
    /// limit of the sidecar's own refused it before anything was sent (the upstream
    /// connection cap, a full stdin queue), which is no product call at all.
    pub(crate) fn fail(mut self, error: Error) -> Error {
        if error.was_unsent() {
            self.plan.not_sent();
        } else {
            self.plan.fail();
        }
        error
    }
}
