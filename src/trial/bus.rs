//! What the local trial's console shows, as it happens: every part of the sidecar that has
//! something to show (the request path, the binding, the embedded Epode) publishes one JSON
//! object per event; the console's streams follow along. Bounded: the history keeps the latest
//! [`HISTORY`] events for a page that opens later, and a stream that falls behind skips ahead.
//! The request path and the binding reach it only as their [`Observer`]; the embedded Epode
//! publishes to it directly.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde_json::{json, Map, Value};
use tokio::sync::{broadcast, watch};

use crate::observe::{
    millis, Decorated, FeedbackTool, HttpServed, McpServed, Noted, Observer, Refused,
};

/// Events kept for a console page opened after they happened.
pub(crate) const HISTORY: usize = 500;
/// Events a console stream may fall behind by before it skips ahead.
const LAG: usize = 256;

pub(crate) struct Bus {
    /// The MCP endpoint's path (the console shows where clients connect).
    mcp_path: String,
    /// Whether MCP requests need a bearer token (authorization on): the command to try says so.
    bearer: bool,
    live: broadcast::Sender<Arc<str>>,
    history: Mutex<VecDeque<Arc<str>>>,
    closed: watch::Sender<bool>,
}

impl Bus {
    pub(crate) fn new(mcp_path: &str, bearer: bool) -> Arc<Self> {
        let (live, _) = broadcast::channel(LAG);
        let (closed, _) = watch::channel(false);
        Arc::new(Bus {
            mcp_path: mcp_path.to_owned(),
            bearer,
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

    /// Whether MCP requests need a bearer token.
    pub(crate) fn bearer(&self) -> bool {
        self.bearer
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
    time_text(SystemTime::now())
}

fn time_text(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

/// The console shows what the request path and the binding publish.
impl Observer for Bus {
    fn request(&self, served: McpServed) {
        let mut event = Map::new();
        event.insert("startedAt".into(), Value::from(time_text(served.started)));
        for fact in served.noted {
            let (key, value) = match fact {
                Noted::InteractionId(i) => ("interactionId", Value::from(i)),
                Noted::IsError(e) => ("isError", Value::from(e)),
                Noted::Outcome(o) => ("outcome", Value::from(o)),
            };
            event.insert(key.into(), value);
        }
        event.insert("method".into(), served.method.into());
        event.insert("tool".into(), served.tool.into());
        event.insert("era".into(), served.era.into());
        event.insert("status".into(), served.status.into());
        event.insert("durationMs".into(), millis(served.duration).into());
        if let Some(t) = served.trace_id {
            event.insert("traceId".into(), t.into());
        }
        self.publish("call", Value::Object(event));
    }

    fn decorated(&self, d: Decorated<'_>) {
        self.publish(
            "feedback",
            json!({"tool": d.tool, "isError": d.is_error, "state": d.state, "mode": d.mode, "interactionId": d.interaction_id}),
        );
    }

    fn refused(&self, r: Refused<'_>) {
        let kind = match r.tool {
            FeedbackTool::Report => "report",
            FeedbackTool::Consent => "consent",
        };
        self.publish(
            kind,
            json!({"refused": r.reason, "by": "sidecar", "interactionId": r.interaction_id}),
        );
    }

    fn http(&self, h: HttpServed<'_>) {
        let mut event = Map::new();
        event.insert("startedAt".into(), Value::from(time_text(h.started)));
        if let Some(i) = h.interaction_id {
            event.insert("interactionId".into(), Value::from(i));
        }
        event.insert("method".into(), Value::from(h.method));
        event.insert("path".into(), Value::from(h.path));
        event.insert("status".into(), h.status.into());
        event.insert("surface".into(), h.surface.into());
        event.insert("state".into(), h.state.into());
        event.insert("skipped".into(), h.skipped.into());
        event.insert("durationMs".into(), millis(h.duration).into());
        self.publish("http", Value::Object(event));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_history_is_bounded_and_followers_see_what_comes_next() {
        let bus = Bus::new("/mcp", false);
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
    fn an_http_request_shows_its_surface_or_why_it_was_skipped() {
        let bus = Bus::new("/mcp", false);
        bus.http(HttpServed {
            started: SystemTime::UNIX_EPOCH,
            method: "GET",
            path: "/search",
            status: 200,
            surface: Some("http_json"),
            skipped: None,
            state: Some("feedback_ready"),
            interaction_id: Some("i"),
            duration: std::time::Duration::from_millis(3),
        });
        let (history, _) = bus.follow();
        let event: Value = serde_json::from_str(&history[0]).unwrap();
        assert_eq!(event["kind"], "http");
        assert_eq!(event["interactionId"], "i");
        assert_eq!(event["surface"], "http_json");
        assert_eq!(event["skipped"], Value::Null);
        assert_eq!(event["path"], "/search");
    }

    #[test]
    fn a_request_shows_what_was_noted_of_it_then_how_it_was_served() {
        let bus = Bus::new("/mcp", false);
        bus.request(McpServed {
            started: SystemTime::UNIX_EPOCH,
            noted: vec![Noted::IsError(false), Noted::InteractionId("i".into())],
            method: "tools/call",
            tool: Some("add".into()),
            era: "2025",
            status: 200,
            duration: std::time::Duration::from_micros(2_750),
            trace_id: None,
        });
        let (history, _) = bus.follow();
        let event: Value = serde_json::from_str(&history[0]).unwrap();
        let keys: Vec<&str> = event
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            [
                "kind",
                "at",
                "startedAt",
                "isError",
                "interactionId",
                "method",
                "tool",
                "era",
                "status",
                "durationMs"
            ]
        );
        assert_eq!(event["kind"], "call");
        assert_eq!(event["startedAt"], "1970-01-01T00:00:00.000Z");
        assert_eq!(event["durationMs"].to_string(), "2.8");
        assert_eq!(event["tool"], "add");
    }
}
