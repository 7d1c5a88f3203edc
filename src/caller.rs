//! Who sent a request, decided once at the front and never collapsing: a [`Caller`] whose
//! [`CallerKey`] every table keyed by caller uses (2025 sessions, per-client children, held
//! calls, questions asked of 2025 clients, listen feeds, the ledger's shares, the feedback
//! handles when auth is on). The key comes from the strongest source the request has:
//!
//! 1. a verified token (the authorization front door's): its issuer and subject; with no
//!    subject, the OAuth client it was issued to (`client_id`, else `azp`); with neither, the
//!    token itself (its digest), so two tokens without the user claim are never one caller;
//! 2. else the client's own credentials (`Authorization`, `Cookie`, `X-API-Key`), as a keyed
//!    hash;
//! 3. else its address: the peer's, or, behind a trusted proxy, the nearest untrusted address
//!    in `X-Forwarded-For` (the rate limit's; IPv6 by /64).
//!
//! A key is a keyed 128-bit hash (random per process): it says nothing outside the process,
//! and it is never shown. The connection a request came on is kept beside it, for what only
//! the connection may do when nothing vouches for the caller (cancel a request on a shared
//! pipe).

use std::hash::BuildHasher;
use std::net::{IpAddr, SocketAddr};
use std::sync::OnceLock;

use http::HeaderMap;

/// The client's own credentials: what keys a caller when no token was verified.
pub(crate) const CREDENTIAL_HEADERS: [&str; 3] = ["authorization", "cookie", "x-api-key"];

/// Two hashers for the process, keyed at random: a key says nothing outside it.
fn hashers() -> &'static (
    std::collections::hash_map::RandomState,
    std::collections::hash_map::RandomState,
) {
    static HASHERS: OnceLock<(
        std::collections::hash_map::RandomState,
        std::collections::hash_map::RandomState,
    )> = OnceLock::new();
    HASHERS.get_or_init(Default::default)
}

/// A caller's key: equal for the requests of one caller, distinct (but for a 2^-128 chance)
/// for two callers.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct CallerKey(u128);

impl std::fmt::Debug for CallerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never its value: a key is an identity ref of a kind.
        f.write_str("CallerKey(..)")
    }
}

impl CallerKey {
    /// The key of `parts` under `tag` (which keeps the sources apart).
    fn of<T: std::hash::Hash>(tag: u8, parts: T) -> CallerKey {
        let (a, b) = hashers();
        let high = a.hash_one((tag, &parts));
        let low = b.hash_one((tag, &parts));
        CallerKey((u128::from(high) << 64) | u128::from(low))
    }

    /// A verified token's caller: `issuer` and `subject`, else the `client` it was issued to,
    /// else the token itself (`token_digest`, its SHA-256). Unlike the others, the same on
    /// every replica (a SHA-256, made once per token): a feedback handle is bound to it, and
    /// any replica checks the binding.
    pub(crate) fn of_token(
        issuer: &str,
        subject: Option<&str>,
        client: Option<&str>,
        token_digest: &[u8; 32],
    ) -> CallerKey {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        let mut part = |tag: u8, bytes: &[u8]| {
            h.update([tag]);
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        };
        part(0, issuer.as_bytes());
        match (subject, client) {
            (Some(s), _) => part(1, s.as_bytes()),
            (None, Some(c)) => part(2, c.as_bytes()),
            (None, None) => part(3, token_digest),
        }
        let digest: [u8; 32] = h.finalize().into();
        let mut key = [0_u8; 16];
        key.copy_from_slice(&digest[..16]);
        CallerKey(u128::from_le_bytes(key))
    }

    /// The key as bytes, for a MAC that binds something to the caller.
    pub(crate) fn to_bytes(self) -> [u8; 16] {
        self.0.to_le_bytes()
    }
}

/// What vouches for a caller's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Vouched {
    /// A token the authorization front door verified.
    Token,
    /// The client's own credentials (unverified: anyone may send any).
    Credentials,
    /// Nothing: its address.
    Address,
    /// The sidecar itself (its readiness probe, its own requests).
    Sidecar,
}

/// The sender of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Caller {
    key: CallerKey,
    vouched: Vouched,
    /// The connection it came on: the peer's address and port, unique while it is open.
    connection: SocketAddr,
}

impl Caller {
    /// The caller of a request: `verified` (a token's key) when there is one, else the
    /// credentials in `headers`, else `address` (the client's address, trusted-proxy aware).
    pub(crate) fn decide(
        verified: Option<CallerKey>,
        headers: &HeaderMap,
        address: IpAddr,
        connection: SocketAddr,
    ) -> Caller {
        if let Some(key) = verified {
            return Caller {
                key,
                vouched: Vouched::Token,
                connection,
            };
        }
        match credential_key(headers) {
            Some(key) => Caller {
                key,
                vouched: Vouched::Credentials,
                connection,
            },
            None => Caller::of_address(address, connection),
        }
    }

    /// A caller known only by its address (what a request is before its token is checked).
    pub(crate) fn of_address(address: IpAddr, connection: SocketAddr) -> Caller {
        Caller {
            key: CallerKey::of(5, address_key(address)),
            vouched: Vouched::Address,
            connection,
        }
    }

    /// The sidecar itself (its readiness probe): owns nothing a client sent.
    pub(crate) fn internal() -> Caller {
        Caller {
            key: CallerKey::of(6, ()),
            vouched: Vouched::Sidecar,
            connection: SocketAddr::from(([0, 0, 0, 0], 0)),
        }
    }

    pub(crate) fn key(&self) -> CallerKey {
        self.key
    }

    #[cfg(test)]
    pub(crate) fn vouched(&self) -> Vouched {
        self.vouched
    }

    /// What a caller's requests are grouped by on a shared pipe: its key, and, when nothing
    /// vouches for it, its connection too.
    pub(crate) fn group(&self) -> (CallerKey, Option<SocketAddr>) {
        match self.vouched {
            Vouched::Address => (self.key, Some(self.connection)),
            _ => (self.key, None),
        }
    }

    /// Whether this caller may act on (cancel) a request `owner` sent: the same caller, and,
    /// when nothing vouches for it, on the same connection.
    pub(crate) fn may_act_for(&self, owner: &Caller) -> bool {
        self.group() == owner.group()
    }

    /// Whether this caller may answer a question relayed to `owner` under an id only `owner`
    /// was shown: the same caller (a client's answer usually comes on another connection
    /// than the stream it read).
    pub(crate) fn may_answer_for(&self, owner: &Caller) -> bool {
        self.key == owner.key
    }
}

/// A keyed hash of the credential headers in `headers`, `None` when it carries none.
fn credential_key(headers: &HeaderMap) -> Option<CallerKey> {
    if !CREDENTIAL_HEADERS.iter().any(|n| headers.contains_key(*n)) {
        return None;
    }
    let values: Vec<Vec<&[u8]>> = CREDENTIAL_HEADERS
        .iter()
        .map(|n| headers.get_all(*n).iter().map(|v| v.as_bytes()).collect())
        .collect();
    Some(CallerKey::of(4, values))
}

/// An address as a caller (and as a client the rate limit counts): IPv6 by its /64 (one host
/// usually has a whole /64 to pick from).
pub(crate) fn address_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_none() => {
            let mut octets = v6.octets();
            octets[8..].fill(0);
            IpAddr::from(octets)
        }
        IpAddr::V6(v6) => IpAddr::V4(
            v6.to_ipv4_mapped()
                .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED),
        ),
        v4 => v4,
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

    fn caller(h: &HeaderMap, ip: &str, port: u16) -> Caller {
        let ip: IpAddr = ip.parse().unwrap();
        Caller::decide(None, h, ip, SocketAddr::new(ip, port))
    }

    #[test]
    fn ownership_follows_the_caller_and_without_credentials_the_connection() {
        let alice = headers(&[("authorization", "Bearer alice")]);
        let bob = headers(&[("authorization", "Bearer bob")]);
        let a1 = caller(&alice, "10.0.0.1", 1000);
        let a2 = caller(&alice, "10.0.0.2", 1001);
        let b1 = caller(&bob, "10.0.0.1", 1000);
        assert!(
            a2.may_act_for(&a1),
            "the same credentials on another connection"
        );
        assert!(
            !b1.may_act_for(&a1),
            "other credentials on the same connection"
        );
        let none = HeaderMap::new();
        let anon1 = caller(&none, "10.0.0.1", 1000);
        let anon2 = caller(&none, "10.0.0.1", 1001);
        let far = caller(&none, "10.0.0.9", 1000);
        assert!(anon1.may_act_for(&anon1));
        assert!(
            !anon2.may_act_for(&anon1),
            "no credentials: only the connection"
        );
        assert!(anon2.may_answer_for(&anon1), "the same address answers");
        assert!(!far.may_answer_for(&anon1), "another address does not");
        assert_ne!(anon1.key(), far.key());
        assert!(!anon1.may_act_for(&a1) && !a1.may_act_for(&anon1));
        assert!(!anon2.may_answer_for(&a1) && !b1.may_answer_for(&a1));
        assert!(a2.may_answer_for(&a1));
        assert_eq!(a1.key(), a2.key());
        assert_ne!(a1.key(), b1.key());
        let cookie = headers(&[("cookie", "s=1")]);
        assert_ne!(caller(&cookie, "10.0.0.1", 1).key(), a1.key());
        assert_eq!(caller(&none, "10.0.0.1", 1).vouched(), Vouched::Address);
        // A client-sent subject header is no credential: it keys nothing.
        let forged = headers(&[("epode-auth-subject", "alice")]);
        assert_eq!(caller(&forged, "10.0.0.1", 1).key(), anon1.key());
    }

    #[test]
    fn a_verified_token_is_its_own_caller_even_without_a_subject() {
        let digest = |b: u8| [b; 32];
        let one = CallerKey::of_token("https://as", None, None, &digest(1));
        let two = CallerKey::of_token("https://as", None, None, &digest(2));
        assert_ne!(one, two, "two tokens with neither subject nor client");
        let c1 = CallerKey::of_token("https://as", None, Some("svc-1"), &digest(1));
        let c2 = CallerKey::of_token("https://as", None, Some("svc-2"), &digest(1));
        assert_ne!(c1, c2, "two OAuth clients");
        assert_eq!(
            c1,
            CallerKey::of_token("https://as", None, Some("svc-1"), &digest(9)),
            "one client's tokens are one caller"
        );
        let s = CallerKey::of_token("https://as", Some("alice"), Some("svc-1"), &digest(1));
        assert_eq!(
            s,
            CallerKey::of_token("https://as", Some("alice"), Some("svc-2"), &digest(2))
        );
        assert_ne!(
            s,
            CallerKey::of_token("https://other", Some("alice"), None, &digest(1))
        );
        assert_ne!(
            CallerKey::of_token("https://as", Some("svc-1"), None, &digest(1)),
            c1,
            "a subject is not a client of the same name"
        );
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let with_token = Caller::decide(
            Some(s),
            &headers(&[("cookie", "x")]),
            ip,
            SocketAddr::new(ip, 1),
        );
        assert_eq!(
            (with_token.key(), with_token.vouched()),
            (s, Vouched::Token)
        );
    }

    #[test]
    fn an_ipv6_caller_is_its_64() {
        let a = address_key("2001:db8::1".parse().unwrap());
        let b = address_key("2001:db8::ffff:1".parse().unwrap());
        assert_eq!(a, b);
        assert_ne!(a, address_key("2001:db8:0:1::1".parse().unwrap()));
        assert_eq!(
            address_key("::ffff:10.0.0.1".parse().unwrap()),
            "10.0.0.1".parse::<IpAddr>().unwrap()
        );
    }
}
