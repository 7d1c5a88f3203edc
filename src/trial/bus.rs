//! What the local trial's console shows, as it happens: every part of the sidecar that has
//! something to show (the request path, the binding, the embedded Epode) publishes one JSON
//! object per event; the console's streams follow along. Bounded: the history keeps the latest
//! [`HISTORY`] events for a page that opens later, and a stream that falls behind skips ahead.
//! A request's own event is filled in as it travels ([`Note`]): the binding adds what only it
//! knows (the interaction, `isError`, a feedback tool's outcome) before the request path
//! publishes it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde_json::{Map, Value};
use tokio::sync::{broadcast, watch};

/// Events kept for a console page opened after they happened.
pub(crate) const HISTORY: usize = 500;
/// Events a console stream may fall behind by before it skips ahead.
const LAG: usize = 256;

pub(crate) struct Bus {
    /// The MCP endpoint's path (the console shows where clients connect).
    mcp_path: String,
    live: broadcast::Sender<Arc<str>>,
    history: Mutex<VecDeque<Arc<str>>>,
    closed: watch::Sender<bool>,
}

impl Bus {
    pub(crate) fn new(mcp_path: &str) -> Arc<Self> {
        let (live, _) = broadcast::channel(LAG);
        let (closed, _) = watch::channel(false);
        Arc::new(Bus {
            mcp_path: mcp_path.to_owned(),
            live,
            history: Mutex::new(VecDeque::with_capacity(HISTORY)),
            closed,
        })
    }

    /// Publishes one event: `fields` with its `kind` and the time.
    pub(crate) fn publish(&self, kind: &str, fields: Value) {
        let mut event = Map::new();
        event.insert("kind".into(), Value::from(kind));
        event.insert("at".into(), Value::from(now_text()));
        if let Value::Object(f) = fields {
            event.extend(f);
        }
        let text: Arc<str> = Value::Object(event).to_string().into();
        {
            let mut history = self.history.lock().unwrap_or_else(|e| e.into_inner());
            if history.len() == HISTORY {
                history.pop_front();
            }
            history.push_back(text.clone());
        }
        let _ = self.live.send(text);
    }

    /// What happened so far, and the events from now on.
    pub(crate) fn follow(&self) -> (Vec<Arc<str>>, broadcast::Receiver<Arc<str>>) {
        let history = self.history.lock().unwrap_or_else(|e| e.into_inner());
        (history.iter().cloned().collect(), self.live.subscribe())
    }

    pub(crate) fn mcp_path(&self) -> &str {
        &self.mcp_path
    }

    /// Ends every console stream (the sidecar is stopping).
    pub(crate) fn close(&self) {
        self.closed.send_replace(true);
    }

    pub(crate) fn closed(&self) -> watch::Receiver<bool> {
        self.closed.subscribe()
    }
}

fn now_text() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// What the console shows of one request beyond its method and status, noted by whoever
/// learns it while the request travels; published with the request's own event.
#[derive(Default)]
pub(crate) struct Note(Mutex<Map<String, Value>>);

impl Note {
    /// A request's note, made as it starts: its start time orders it before what it led to
    /// (its own event is published when it ends).
    pub(crate) fn at_start() -> Self {
        let note = Note::default();
        note.set("startedAt", now_text());
        note
    }

    pub(crate) fn set(&self, key: &str, value: impl Into<Value>) {
        let mut fields = self.0.lock().unwrap_or_else(|e| e.into_inner());
        fields.insert(key.to_owned(), value.into());
    }

    /// What was noted so far.
    pub(crate) fn fields(&self) -> Map<String, Value> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A duration as the console and the access log show it: milliseconds, to a tenth.
pub(crate) fn millis(d: std::time::Duration) -> f64 {
    let tenths = (d.as_micros() + 50) / 100;
    // Exact below 2^53 tenths (28 000 years).
    tenths as f64 / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_history_is_bounded_and_followers_see_what_comes_next() {
        let bus = Bus::new("/mcp");
        for i in 0..HISTORY + 10 {
            bus.publish("call", serde_json::json!({"n": i}));
        }
        let (history, mut live) = bus.follow();
        assert_eq!(history.len(), HISTORY);
        assert!(history[0].contains(r#""n":10"#), "{}", history[0]);
        bus.publish("report", serde_json::json!({"summary": "s"}));
        let next = live.try_recv().unwrap();
        assert!(next.starts_with(r#"{"kind":"report","at":""#), "{next}");
    }

    #[test]
    fn durations_are_shown_to_a_tenth_of_a_millisecond() {
        use std::time::Duration;
        assert_eq!(millis(Duration::from_nanos(2_726_285)).to_string(), "2.7");
        assert_eq!(millis(Duration::from_micros(12_050)).to_string(), "12.1");
        assert_eq!(millis(Duration::from_micros(40)).to_string(), "0");
        assert_eq!(millis(Duration::from_secs(3)).to_string(), "3000");
    }
}
