//! Who sent a request, as far as the upstream hop needs to know to keep clients apart on a
//! shared stdio pipe: the client's credentials (`Authorization`, `Cookie`, `X-API-Key`, kept
//! only as a keyed hash) and the connection it came on. A client with credentials owns its
//! requests across connections (as a 2025 session would); a client without any owns them only
//! on its own connection, since anyone can send no credentials. And whether the client may be
//! sent the server's own requests (`ServerRequests`), which the hop and the stdio child both read.

use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::sync::OnceLock;

use http::HeaderMap;

/// Headers that identify the caller to the upstream: the client's own credentials, and the
/// subject the authorization front door verified (a header only the sidecar sets), so with
/// auth on a caller's requests, children and 2025 sessions are its principal's.
pub(crate) const CREDENTIAL_HEADERS: [&str; 4] =
    ["authorization", "cookie", "x-api-key", "epode-auth-subject"];

/// One hasher for the process, keyed at random: a credential's hash says nothing outside it.
fn hasher() -> &'static std::collections::hash_map::RandomState {
    static HASHER: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    HASHER.get_or_init(Default::default)
}

/// A keyed hash of the credential headers in `client`, `None` when it carries none.
pub(crate) fn credential_hash(client: &HeaderMap) -> Option<u64> {
    if !CREDENTIAL_HEADERS.iter().any(|n| client.contains_key(*n)) {
        return None;
    }
    let values: Vec<Vec<&[u8]>> = CREDENTIAL_HEADERS
        .iter()
        .map(|n| client.get_all(*n).iter().map(|v| v.as_bytes()).collect())
        .collect();
    Some(hasher().hash_one(values))
}

/// A client's request as the upstream hop sees it: its headers (credentials and all) and who
/// sent it. Reads as the headers wherever only they matter.
#[derive(Clone, Copy)]
pub(crate) struct Client<'a> {
    pub(crate) headers: &'a HeaderMap,
    pub(crate) caller: Caller,
    /// A 2026 request's `params._meta` (its declared capabilities are read from it only
    /// where they are needed: the handshake of a 2025 session).
    pub(crate) meta: Option<&'a serde_json::value::RawValue>,
}

impl<'a> Client<'a> {
    pub(crate) fn new(headers: &'a HeaderMap, peer: SocketAddr) -> Self {
        Client {
            headers,
            caller: Caller::new(peer, headers),
            meta: None,
        }
    }

    /// The capabilities a 2026 request declares in its envelope.
    pub(crate) fn declared_capabilities(&self) -> Option<Box<serde_json::value::RawValue>> {
        #[derive(serde::Deserialize)]
        struct Envelope<'m> {
            #[serde(borrow, rename = "io.modelcontextprotocol/clientCapabilities")]
            caps: Option<&'m serde_json::value::RawValue>,
        }
        let meta = serde_json::from_str::<Envelope<'_>>(self.meta?.get()).ok()?;
        meta.caps.map(ToOwned::to_owned)
    }
}

impl std::ops::Deref for Client<'_> {
    type Target = HeaderMap;

    fn deref(&self) -> &HeaderMap {
        self.headers
    }
}

/// The sender of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Caller {
    /// The connection: the peer's address and port, unique while it is open.
    peer: SocketAddr,
    credential: Option<u64>,
}

/// What a caller's requests are grouped by: its credentials, or its connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Group {
    Credential(u64),
    Connection(SocketAddr),
}

impl Caller {
    pub(crate) fn new(peer: SocketAddr, client: &HeaderMap) -> Self {
        Caller {
            peer,
            credential: credential_hash(client),
        }
    }

    /// The sidecar itself (its readiness probe): owns nothing a client sent.
    pub(crate) fn internal() -> Self {
        Caller {
            peer: SocketAddr::from(([0, 0, 0, 0], 0)),
            credential: None,
        }
    }

    pub(crate) fn group(&self) -> Group {
        match self.credential {
            Some(c) => Group::Credential(c),
            None => Group::Connection(self.peer),
        }
    }

    /// Whether this caller may act on (cancel) a request `owner` sent: the same credentials,
    /// or, without any, the same connection.
    pub(crate) fn may_act_for(&self, owner: &Caller) -> bool {
        self.group() == owner.group()
    }

    /// Whether this caller may answer a server request relayed to `owner` under an id only
    /// `owner` was shown: with credentials, only the same ones; without, the id is the proof
    /// (a client's answer usually comes on another connection than the stream it read).
    pub(crate) fn may_answer_for(&self, owner: &Caller) -> bool {
        owner.credential.is_none() || owner.credential == self.credential
    }

    /// Which child serves this caller when each client has its own: its credentials' hash, or
    /// 0 for every client without credentials.
    pub(crate) fn child_key(&self) -> u64 {
        self.credential.unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn ownership_follows_credentials_or_the_connection() {
        let one: SocketAddr = "10.0.0.1:1000".parse().unwrap();
        let two: SocketAddr = "10.0.0.1:1001".parse().unwrap();
        let alice = headers(&[("authorization", "Bearer alice")]);
        let bob = headers(&[("authorization", "Bearer bob")]);
        let a1 = Caller::new(one, &alice);
        let a2 = Caller::new(two, &alice);
        let b1 = Caller::new(one, &bob);
        assert!(
            a2.may_act_for(&a1),
            "the same credentials on another connection"
        );
        assert!(
            !b1.may_act_for(&a1),
            "other credentials on the same connection"
        );
        let anon1 = Caller::new(one, &HeaderMap::new());
        let anon2 = Caller::new(two, &HeaderMap::new());
        assert!(anon1.may_act_for(&anon1));
        assert!(
            !anon2.may_act_for(&anon1),
            "no credentials: only the connection"
        );
        assert!(!anon1.may_act_for(&a1) && !a1.may_act_for(&anon1));
        assert!(
            anon2.may_answer_for(&anon1),
            "the unguessable id is the proof"
        );
        assert!(!anon2.may_answer_for(&a1) && !b1.may_answer_for(&a1));
        assert!(a2.may_answer_for(&a1));
        assert_eq!(a1.child_key(), a2.child_key());
        assert_ne!(a1.child_key(), b1.child_key());
        assert_eq!(anon1.child_key(), 0);
        let cookie = headers(&[("cookie", "s=1")]);
        assert_ne!(credential_hash(&cookie), credential_hash(&alice));
        assert_eq!(credential_hash(&HeaderMap::new()), None);
    }
}

/// Whether the server's own requests (elicitation, sampling, roots) made while answering a
/// message may go to the client that sent it: only a 2025 client (or a client's own answer or
/// cancellation) can take them; the sidecar's own requests and a 2026 client's cannot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ServerRequests {
    Relayed,
    /// Asked of a 2026 client as `input_required` (the SSE reader takes them off the stream).
    Bridged,
    Withheld,
}
