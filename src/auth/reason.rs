//! Why the authorization front door refused a request: one fixed set, the `reason` label of
//! `auth_refused_total`, each with the challenge's `error_description`.

/// Why a request was refused: the `reason` label of `auth_refused_total`, one fixed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Reason {
    Missing,
    Malformed,
    Expired,
    NotYetValid,
    BadSignature,
    UnknownKey,
    WrongIssuer,
    WrongAudience,
    Algorithm,
    Inactive,
    InsufficientScope,
    IntrospectionUnavailable,
    /// The issuer's keys could not be fetched (at start, or since): no token can be checked.
    KeysUnavailable,
    /// As many introspections are in flight as may be (for the client's address, or for the
    /// process): the token is not asked about now.
    IntrospectionsBusy,
}

impl Reason {
    pub(crate) const ALL: [Reason; 14] = [
        Reason::Missing,
        Reason::Malformed,
        Reason::Expired,
        Reason::NotYetValid,
        Reason::BadSignature,
        Reason::UnknownKey,
        Reason::WrongIssuer,
        Reason::WrongAudience,
        Reason::Algorithm,
        Reason::Inactive,
        Reason::InsufficientScope,
        Reason::IntrospectionUnavailable,
        Reason::KeysUnavailable,
        Reason::IntrospectionsBusy,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Reason::Missing => "missing",
            Reason::Malformed => "malformed",
            Reason::Expired => "expired",
            Reason::NotYetValid => "not_yet_valid",
            Reason::BadSignature => "bad_signature",
            Reason::UnknownKey => "unknown_key",
            Reason::WrongIssuer => "wrong_issuer",
            Reason::WrongAudience => "wrong_audience",
            Reason::Algorithm => "algorithm",
            Reason::Inactive => "inactive",
            Reason::InsufficientScope => "insufficient_scope",
            Reason::IntrospectionUnavailable => "introspection_unavailable",
            Reason::KeysUnavailable => "keys_unavailable",
            Reason::IntrospectionsBusy => "introspections_busy",
        }
    }

    /// The challenge's `error_description` (RFC 6750 allows no `"` or `\` in it).
    pub(super) fn description(self) -> &'static str {
        match self {
            Reason::Missing => "no access token",
            Reason::Malformed => "the token is not a well-formed access token of the expected type",
            Reason::Expired => "the token has expired",
            Reason::NotYetValid => "the token is not valid yet",
            Reason::BadSignature => "the token's signature does not verify",
            Reason::UnknownKey => "the token is signed with a key the issuer does not publish",
            Reason::WrongIssuer => "the token is from another issuer",
            Reason::WrongAudience => "the token was not issued for this resource (aud)",
            Reason::Algorithm => "the token's signature algorithm is not accepted",
            Reason::Inactive => "the token is not active",
            Reason::InsufficientScope => "the token lacks a scope this request needs",
            Reason::IntrospectionUnavailable => "the token could not be checked now",
            Reason::KeysUnavailable => "the token could not be checked now",
            Reason::IntrospectionsBusy => "the token could not be checked now",
        }
    }
}
