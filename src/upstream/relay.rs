//! A 2025-era HTTP upstream's questions asked of the 2025 client whose call they came in:
//! an `elicitation/create`, `sampling/createMessage` or `roots/list` on the call's stream goes
//! on to the client under an id of the sidecar's own (`asks.rs`), so no client can answer
//! another's, and the client's POSTed answer goes back in the call's upstream session under
//! the upstream's id. Each open question is one of its caller's places in the ledger; one past
//! the caller's share is not asked (the upstream hears an error, and the call goes on). The
//! questions still open when the call's stream ends are forgotten with it.

use std::sync::Arc;

use http::HeaderMap;

use super::asks::{Asks, Target, UpstreamQuestion};
use super::bridge::{declined_message, Answers};
use super::caller::Caller;
use super::held::Reply;
use crate::mcp::raw;
use crate::mcp::sse::{Decline, Question, Relay, Told};

/// One 2025 client's call: where its questions are recorded, and how the upstream is told.
pub(super) struct Relaying {
    pub(super) asks: Arc<Asks>,
    pub(super) answers: Arc<dyn Answers>,
    pub(super) headers: HeaderMap,
    pub(super) caller: Caller,
    /// The upstream session the call runs in.
    pub(super) session: UpstreamQuestion,
    /// The questions asked in this call and not answered yet (forgotten when it ends).
    pub(super) open: Vec<u128>,
}

impl Relay for Relaying {
    fn relay(&mut self, question: &Question) -> Result<Box<serde_json::value::RawValue>, Decline> {
        let Ok(mut place) = self.asks.places(&self.caller, 1) else {
            return Err(Decline::Bounded);
        };
        let Some(place) = place.pop() else {
            return Err(Decline::Bounded);
        };
        let target = Target::Upstream(UpstreamQuestion {
            id: question.id.clone(),
            ..self.session.clone()
        });
        let (key, id) = self.asks.ask(self.caller, place, target);
        // Answered ones are gone from the table already; the list stays as small as the
        // questions one call asks.
        self.open.push(key);
        Ok(raw::raw(&id))
    }

    fn decline(&self, question: &Question, why: Decline) -> Told {
        let reply = Reply::Http {
            session: self.session.session.clone(),
            version: self.session.version.clone(),
        };
        self.answers.clone().answer(
            self.headers.clone(),
            self.caller,
            reply,
            declined_message(question, why),
        )
    }
}

impl Drop for Relaying {
    fn drop(&mut self) {
        for key in self.open.drain(..) {
            self.asks.forget(key);
        }
    }
}

/// The session a relayed call runs in, as its answers need it.
pub(super) fn session_of(session: Option<&super::session::LegacySession>) -> UpstreamQuestion {
    UpstreamQuestion {
        session: session.and_then(|s| s.id.clone()),
        version: session.map_or_else(
            || crate::mcp::version::LEGACY_LATEST.to_owned(),
            |s| s.version.clone(),
        ),
        id: raw::null(),
    }
}
