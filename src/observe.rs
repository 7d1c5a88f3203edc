//! What the request path and the binding show to whoever watches them, as it happens: the
//! [`Observer`] they publish to. The request path owns this seam, so neither it nor the
//! binding knows who watches (with `--dev`, the local trial's console implements it; without,
//! there is no observer and nothing is noted). A request's own event is filled in as it
//! travels ([`Note`]): the binding notes what only it knows (the interaction, `isError`, a
//! feedback tool's outcome) before the request path publishes the request when it ends.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// Whoever watches the sidecar work. Every method is called on the request path: an
/// implementation returns at once (it must not wait for a reader).
pub(crate) trait Observer: Send + Sync {
    /// A request was answered (a tool call answered as a stream: its stream is over).
    fn request(&self, served: McpServed);
    /// A product tool's result was decorated with `_agentFeedback`.
    fn decorated(&self, decorated: Decorated<'_>);
    /// The sidecar refused a feedback tool's call itself: it never reached Epode.
    fn refused(&self, refused: Refused<'_>);
    /// A request to the HTTP surface (a route that is not MCP) was answered.
    fn http(&self, served: HttpServed<'_>);
}

/// One request to the HTTP surface, as it was answered.
pub(crate) struct HttpServed<'a> {
    pub(crate) started: SystemTime,
    pub(crate) method: &'a str,
    /// The request's path, without its query.
    pub(crate) path: &'a str,
    pub(crate) status: u16,
    /// Where the envelope went (`http_json`, `http_html`, `http_headers`), when it was
    /// instrumented.
    pub(crate) surface: Option<&'static str>,
    /// Why it was not instrumented (the metrics' label), when it was not.
    pub(crate) skipped: Option<&'static str>,
    /// The envelope's consent stage, when instrumented.
    pub(crate) state: Option<&'static str>,
    pub(crate) interaction_id: Option<&'a str>,
    /// From arrival to the response head (the body ready, when instrumented).
    pub(crate) duration: Duration,
}

/// One request, as it was served.
pub(crate) struct McpServed {
    /// When it arrived.
    pub(crate) started: SystemTime,
    /// What was noted of it on the way, in the order it was learned.
    pub(crate) noted: Vec<Noted>,
    /// The method's metrics label (`-` before it was known).
    pub(crate) method: &'static str,
    /// The tool of a `tools/call`.
    pub(crate) tool: Option<String>,
    /// The client's era (`-` before it was known).
    pub(crate) era: &'static str,
    pub(crate) status: u16,
    /// From arrival to the response head.
    pub(crate) duration: Duration,
    /// Its trace, when OpenTelemetry is on and the request's span is sampled (hex).
    pub(crate) trace_id: Option<String>,
}

/// One thing learned of a request while it travels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Noted {
    /// The interaction its `_agentFeedback` handle (or telemetry event) names.
    InteractionId(String),
    /// Whether its result says `isError`.
    IsError(bool),
    /// A feedback tool call's outcome (the metrics' label).
    Outcome(&'static str),
}

impl Noted {
    fn same_kind(&self, other: &Noted) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }
}

/// What is noted of one request while it travels; published with the request's own event.
pub(crate) struct Note {
    started: SystemTime,
    noted: Mutex<Vec<Noted>>,
}

impl Note {
    /// A request's note, made as it starts: its start time orders it before what it led to
    /// (its own event is published when it ends).
    pub(crate) fn at_start() -> Self {
        Note {
            started: SystemTime::now(),
            noted: Mutex::new(Vec::new()),
        }
    }

    /// Notes `fact`; a later fact of the same kind replaces the earlier one in its place.
    pub(crate) fn set(&self, fact: Noted) {
        let mut noted = self.noted.lock().unwrap_or_else(|e| e.into_inner());
        match noted.iter_mut().find(|n| n.same_kind(&fact)) {
            Some(earlier) => *earlier = fact,
            None => noted.push(fact),
        }
    }

    pub(crate) fn started(&self) -> SystemTime {
        self.started
    }

    /// What was noted so far.
    pub(crate) fn noted(&self) -> Vec<Noted> {
        self.noted.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A product tool result decorated with `_agentFeedback`.
pub(crate) struct Decorated<'a> {
    pub(crate) tool: &'a str,
    pub(crate) is_error: bool,
    /// The consent stage the decoration asks for.
    pub(crate) state: &'static str,
    pub(crate) mode: &'static str,
    pub(crate) interaction_id: &'a str,
}

/// Which of the two feedback tools.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FeedbackTool {
    Consent,
    Report,
}

/// A feedback tool's call the sidecar refused itself.
pub(crate) struct Refused<'a> {
    pub(crate) tool: FeedbackTool,
    /// Why, as the console shows it.
    pub(crate) reason: &'a str,
    /// The interaction its handle names, when the handle is genuine.
    pub(crate) interaction_id: Option<&'a str>,
}

/// A duration in tenths of a millisecond, rounded to the nearest.
fn tenths(d: Duration) -> u128 {
    (d.as_micros() + 50) / 100
}

/// A duration as the console and the access log show it: milliseconds, to a tenth.
pub(crate) fn millis(d: Duration) -> f64 {
    // Exact below 2^53 tenths (28 000 years).
    tenths(d) as f64 / 10.0
}

/// The access log's target (`EPODE_SIDECAR_ACCESS_LOG`).
pub(crate) const ACCESS_TARGET: &str = "epode_sidecar::access";

/// [`millis`] as text, written from integers: the access line is made on every request, and
/// formatting a float there costs more than the rest of the line.
pub(crate) struct Millis(pub(crate) Duration);

impl std::fmt::Display for Millis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tenths = tenths(self.0);
        match tenths % 10 {
            0 => write!(f, "{}", tenths / 10),
            tenth => write!(f, "{}.{tenth}", tenths / 10),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_access_log_writes_durations_as_the_console_shows_them() {
        let micros = (0..20_000).chain([99_949, 99_950, 3_000_000, 123_456_789_012]);
        for d in micros.map(Duration::from_micros) {
            assert_eq!(Millis(d).to_string(), millis(d).to_string(), "{d:?}");
        }
    }

    #[test]
    fn durations_are_shown_to_a_tenth_of_a_millisecond() {
        assert_eq!(millis(Duration::from_nanos(2_726_285)).to_string(), "2.7");
        assert_eq!(millis(Duration::from_micros(12_050)).to_string(), "12.1");
        assert_eq!(millis(Duration::from_micros(40)).to_string(), "0");
        assert_eq!(millis(Duration::from_secs(3)).to_string(), "3000");
    }

    #[test]
    fn a_fact_noted_again_replaces_the_earlier_one_in_its_place() {
        let note = Note::at_start();
        note.set(Noted::IsError(false));
        note.set(Noted::InteractionId("a".into()));
        note.set(Noted::IsError(true));
        assert_eq!(
            note.noted(),
            [Noted::IsError(true), Noted::InteractionId("a".into())]
        );
    }
}
