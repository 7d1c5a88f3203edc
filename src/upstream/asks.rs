//! The questions the sidecar asks 2025 clients under ids of its own
//! (`"epode-sidecar-ask-<32 hex>"`, unguessable), and where each one's answer goes: a 2026
//! upstream's `input_required` asked on a 2025 client's stream waits for its answer here
//! (`mirror.rs`), and a 2025 HTTP upstream's own server request, relayed to the 2025 client
//! whose call it came in (`relay.rs`), has its answer POSTed back in the upstream session
//! under the upstream's own id. Only the caller that was asked is heard; each open question
//! is one place of its caller's in the ledger (`questions`), given back when it is answered
//! or its call ends.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::HeaderValue;
use serde_json::value::RawValue;
use serde_json::Value;
use tokio::sync::oneshot;

use super::caller::Caller;
use crate::error::Error;
use crate::ledger::{Charge, Ledger, Pool};
use crate::mcp::raw;

/// How the sidecar's questions to a 2025 client are named: the client answers under this id.
pub(super) const ASK_PREFIX: &str = "epode-sidecar-ask-";

/// An answer the asked client POSTed: its JSON-RPC response.
pub(super) type Answered = Value;

/// Where a question's answer goes.
pub(super) enum Target {
    /// To the round that waits for it (`mirror.rs`).
    Waiting(oneshot::Sender<Answered>),
    /// Back upstream, in the 2025 session the question came in, under the upstream's id.
    Upstream(UpstreamQuestion),
}

/// A question of a 2025 HTTP upstream's, relayed to a client.
#[derive(Clone)]
pub(super) struct UpstreamQuestion {
    /// The session it came in (`None`: a stateless upstream).
    pub(super) session: Option<HeaderValue>,
    pub(super) version: String,
    /// Its id as the upstream wrote it.
    pub(super) id: Box<RawValue>,
}

struct Ask {
    owner: Caller,
    target: Target,
    /// Its place in the ledger (`questions`), charged to its caller.
    _charge: Charge,
}

/// What a client's POSTed message was to the open questions.
pub(super) enum Heard {
    /// Not an answer to one of the sidecar's questions.
    NotAnAnswer,
    /// An answer, delivered to the round waiting for it, or ignored (another caller's, or
    /// to no open question).
    Taken,
    /// An answer to go upstream: this message (the upstream's id back), in this session.
    Upstream(UpstreamQuestion, Bytes),
}

/// The questions asked of 2025 clients and not answered yet, shared by every worker; how
/// many may be open, in all and per caller, is the ledger's.
pub(crate) struct Asks {
    open: Mutex<HashMap<u128, Ask>>,
    ledger: Arc<Ledger>,
}

impl Asks {
    pub(crate) fn new(ledger: Arc<Ledger>) -> Self {
        Asks {
            open: Mutex::default(),
            ledger,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u128, Ask>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `n` places for `owner`'s questions, or the refusal to answer with.
    pub(super) fn places(&self, owner: &Caller, n: usize) -> Result<Vec<Charge>, Error> {
        (0..n)
            .map(|_| self.ledger.charge(Pool::Questions, owner.key()))
            .collect()
    }

    /// A new question for `owner`, in the place `charge` took, its answer going to `target`:
    /// its key and its id (a JSON string).
    pub(super) fn ask(&self, owner: Caller, charge: Charge, target: Target) -> (u128, String) {
        let mut open = self.lock();
        let key: u128 = rand::random();
        open.insert(
            key,
            Ask {
                owner,
                target,
                _charge: charge,
            },
        );
        let mut id = String::with_capacity(ASK_PREFIX.len() + 32);
        let _ = write!(id, "{ASK_PREFIX}{key:032x}");
        (key, id)
    }

    pub(super) fn forget(&self, key: u128) {
        self.lock().remove(&key);
    }

    /// A client's POSTed message, when it answers one of the sidecar's questions: taken
    /// when `caller` is the client that was asked, and only once.
    pub(super) fn answer(&self, bytes: &[u8], caller: &Caller) -> Heard {
        if !bytes
            .windows(ASK_PREFIX.len())
            .any(|w| w == ASK_PREFIX.as_bytes())
        {
            return Heard::NotAnAnswer;
        }
        let Ok(msg) = serde_json::from_slice::<Value>(bytes) else {
            return Heard::NotAnAnswer;
        };
        let Some(key) = msg
            .get("id")
            .and_then(Value::as_str)
            .and_then(|id| id.strip_prefix(ASK_PREFIX))
            .filter(|hex| hex.len() == 32)
            .and_then(|hex| u128::from_str_radix(hex, 16).ok())
        else {
            return Heard::NotAnAnswer;
        };
        if msg.get("method").is_some() {
            return Heard::NotAnAnswer;
        }
        let mut open = self.lock();
        match open.get(&key) {
            Some(ask) if caller.may_answer_for(&ask.owner) => {
                let Some(ask) = open.remove(&key) else {
                    return Heard::Taken;
                };
                drop(open);
                match ask.target {
                    Target::Waiting(tx) => {
                        let _ = tx.send(msg);
                        Heard::Taken
                    }
                    Target::Upstream(q) => {
                        let Some(mut back) = raw::parse_message(bytes) else {
                            return Heard::Taken;
                        };
                        back.insert("id".to_owned(), q.id.clone());
                        Heard::Upstream(q, raw::to_bytes(&back))
                    }
                }
            }
            Some(_) => {
                tracing::debug!("an answer from a client the question was not asked of");
                Heard::Taken
            }
            None => {
                tracing::debug!("an answer to no open question");
                Heard::Taken
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;
    use serde_json::json;
    use std::net::SocketAddr;

    fn caller(token: &str) -> Caller {
        let mut h = HeaderMap::new();
        h.insert("authorization", http::HeaderValue::from_str(token).unwrap());
        let peer = "10.0.0.1:1".parse::<SocketAddr>().unwrap();
        Caller::decide(None, &h, peer.ip(), peer)
    }

    #[test]
    fn an_answer_counts_only_from_the_client_asked_and_only_once() {
        let asks = Asks::new(Ledger::with(Pool::Questions, 10, 2));
        let alice = caller("Bearer alice");
        let place = asks.places(&alice, 1).unwrap().pop().unwrap();
        let (tx, mut rx) = oneshot::channel();
        let (_, id) = asks.ask(alice, place, Target::Waiting(tx));
        let answer =
            json!({"jsonrpc": "2.0", "id": id, "result": {"action": "accept"}}).to_string();
        // Mallory's answer is taken as an answer to a question, but not delivered.
        assert!(matches!(
            asks.answer(answer.as_bytes(), &caller("Bearer mallory")),
            Heard::Taken
        ));
        assert!(rx.try_recv().is_err());
        assert!(matches!(
            asks.answer(answer.as_bytes(), &alice),
            Heard::Taken
        ));
        assert_eq!(rx.try_recv().unwrap()["result"]["action"], "accept");
        // Not one of the sidecar's ids, a request, or garbage: not an answer of this kind.
        let not = |b: &[u8]| matches!(asks.answer(b, &alice), Heard::NotAnAnswer);
        assert!(not(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#));
        let request = json!({"jsonrpc": "2.0", "id": id, "method": "x"}).to_string();
        assert!(not(request.as_bytes()));
        assert!(not(b"epode-sidecar-ask-"));
        // Answered: its place is given back. A caller has its share of places, no more.
        assert_eq!(asks.ledger.in_use(Pool::Questions), 0);
        let two = asks.places(&alice, 2).unwrap();
        let e = asks.places(&alice, 1).unwrap_err();
        assert_eq!(e.status(), http::StatusCode::TOO_MANY_REQUESTS);
        assert!(asks.places(&caller("Bearer bob"), 2).is_ok());
        drop(two);
    }

    #[test]
    fn an_upstreams_question_is_answered_upstream_under_its_own_id() {
        let asks = Asks::new(Ledger::with(Pool::Questions, 10, 2));
        let alice = caller("Bearer alice");
        let place = asks.places(&alice, 1).unwrap().pop().unwrap();
        let q = UpstreamQuestion {
            session: Some(HeaderValue::from_static("s-1")),
            version: "2025-11-25".into(),
            id: raw::raw(&0),
        };
        let (_, id) = asks.ask(alice, place, Target::Upstream(q));
        let answer = json!({"jsonrpc": "2.0", "id": id, "result": {"roots": []}}).to_string();
        assert!(matches!(
            asks.answer(answer.as_bytes(), &caller("Bearer bob")),
            Heard::Taken
        ));
        let Heard::Upstream(q, back) = asks.answer(answer.as_bytes(), &alice) else {
            panic!("alice's answer goes upstream")
        };
        assert_eq!(q.session.unwrap(), "s-1");
        assert_eq!(
            &back[..],
            br#"{"jsonrpc":"2.0","id":0,"result":{"roots":[]}}"#
        );
        assert!(
            matches!(asks.answer(answer.as_bytes(), &alice), Heard::Taken),
            "once"
        );
        assert_eq!(asks.ledger.in_use(Pool::Questions), 0);
    }
}
