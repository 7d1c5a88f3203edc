//! Who serves a request on the MCP listener, decided once, on the path's canonical form,
//! before any route runs. An app behind the HTTP surface may decode `%XX`, resolve dot
//! segments, merge slashes, drop `;params` or fold case before it routes, so the sidecar routes
//! on the form that does all of that (RFC 3986 §6.2.2: unreserved characters decoded, other
//! escapes in upper case, dot segments removed; then empty segments and `;params` dropped),
//! compared with the MCP path, the mounted prefix and the operations prefix without regard to
//! ASCII case: every spelling an app could take for one of them meets the sidecar's route.
//! Refused with 400: a broken `%` escape, `%00`, a `..` above the root, and a path whose
//! readings disagree about who serves it (an encoded `/` or `\`, a raw `\`, a doubly encoded
//! `%`: one app reads them as separators or decodes twice, another does not).
//!
//! Cost: an already canonical path (no `%`, `;`, `\`, empty, `.` or `..` segment, trailing
//! `/`) is one scan of its bytes and is borrowed, never copied; only another spelling builds a
//! key (one or two small allocations).

use std::borrow::Cow;

/// Who serves a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    /// The MCP front.
    Mcp,
    /// What is mounted (the trial's console); the rest of the key starts at this offset.
    Mounted(usize),
    /// The operations' routes under their prefix (with the HTTP surface on); the rest of the
    /// key starts at this offset.
    Operations(usize),
    /// Everything else: the HTTP surface when it is on, else the operations' routes.
    Other,
}

/// A request's route: its owner and its canonical path.
#[derive(Debug)]
pub(crate) struct Routed<'a> {
    pub(crate) owner: Owner,
    key: Cow<'a, str>,
}

impl Routed<'_> {
    /// The canonical path.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// The canonical path when it is not the path as sent (which is then the canonical one).
    pub(crate) fn respelled(self) -> Option<String> {
        match self.key {
            Cow::Owned(key) => Some(key),
            Cow::Borrowed(_) => None,
        }
    }

    /// What follows the owner's prefix (`""` or `/…`); the whole key for the others.
    pub(crate) fn rest(&self) -> &str {
        match self.owner {
            Owner::Mounted(at) | Owner::Operations(at) => &self.key[at..],
            Owner::Mcp | Owner::Other => &self.key,
        }
    }
}

/// Why a path is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Neither `/…` nor `*`.
    NotAPath,
    /// A `%` not followed by two hex digits.
    BrokenEscape,
    /// `%00`.
    Nul,
    /// A `..` that climbs above the root.
    AboveRoot,
    /// Its readings (an encoded `/` or `\` read as data or as a separator, a `%25` decoded
    /// once or twice) disagree about who serves it.
    Ambiguous,
}

impl Refusal {
    /// What the client should do, for the 400's message.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Refusal::NotAPath => "is not an absolute path (it must start with /)",
            Refusal::BrokenEscape => "has a % not followed by two hex digits; encode a literal % as %25",
            Refusal::Nul => "holds an encoded NUL (%00)",
            Refusal::AboveRoot => "climbs above the root with ..",
            Refusal::Ambiguous => "is ambiguous: an encoded / or \\ (%2F, %5C), a raw \\ or a doubly encoded % (%25..) would route it elsewhere when read another way; send the plain path",
        }
    }
}

/// The sidecar's own routes, as canonical keys.
#[derive(Debug)]
pub(crate) struct Routing {
    mcp: String,
    mounted: Option<String>,
    operations: Option<String>,
}

impl Routing {
    /// The configured MCP path, the mounted prefix (when something is mounted) and the
    /// operations prefix (when the HTTP surface is on).
    pub(crate) fn new(mcp: &str, mounted: Option<&str>, operations: Option<&str>) -> Self {
        // A configured path that has no canonical form is compared as written.
        let key = |p: &str| canonical(p, false).map_or_else(|_| p.to_owned(), Cow::into_owned);
        Routing {
            mcp: key(mcp),
            mounted: mounted.map(key),
            operations: operations.map(key),
        }
    }

    /// The route of a request for `path` (the request target's path, without its query).
    pub(crate) fn route<'a>(&self, path: &'a str) -> Result<Routed<'a>, Refusal> {
        let plain = canonical(path, false)?;
        let owner = self.owner(&plain);
        if path.contains(['%', '\\']) {
            let loose = canonical(path, true)?;
            let agree = (owner == Owner::Other && self.owner(&loose) == Owner::Other)
                || plain.eq_ignore_ascii_case(&loose);
            if !agree {
                return Err(Refusal::Ambiguous);
            }
        }
        Ok(Routed { owner, key: plain })
    }

    fn owner(&self, key: &str) -> Owner {
        if key.eq_ignore_ascii_case(&self.mcp) {
            return Owner::Mcp;
        }
        if let Some(at) = self.mounted.as_deref().and_then(|p| under(key, p)) {
            return Owner::Mounted(at);
        }
        if let Some(at) = self.operations.as_deref().and_then(|p| under(key, p)) {
            return Owner::Operations(at);
        }
        Owner::Other
    }
}

/// Where the rest of `key` starts when `key` is `prefix` or under it as a whole segment
/// (`/_dev`, `/_dev/x`; not `/_devtools`), ASCII case aside.
fn under(key: &str, prefix: &str) -> Option<usize> {
    let (key, n) = (key.as_bytes(), prefix.len());
    let head = key.get(..n)?;
    (head.eq_ignore_ascii_case(prefix.as_bytes()) && matches!(key.get(n), None | Some(b'/')))
        .then_some(n)
}

/// The canonical form of `path`. `loose` reads the ambiguous forms the other way: an encoded
/// `/` or `\` and a raw `\` as separators, and a `%25` followed by two hex digits decoded
/// twice.
fn canonical(path: &str, loose: bool) -> Result<Cow<'_, str>, Refusal> {
    let bytes = path.as_bytes();
    if path == "*" {
        return Ok(Cow::Borrowed(path));
    }
    if bytes.first() != Some(&b'/') {
        return Err(Refusal::NotAPath);
    }
    if !loose && is_canonical(bytes) {
        return Ok(Cow::Borrowed(path));
    }
    let decoded = decode(bytes, loose)?;
    let mut out: Vec<u8> = Vec::with_capacity(decoded.len());
    // Where each kept segment starts in `out`, so a `..` can take the last one back.
    let mut starts: Vec<usize> = Vec::new();
    for segment in decoded.split(|&b| b == b'/') {
        let segment = segment.split(|&b| b == b';').next().unwrap_or_default();
        match segment {
            b"" | b"." => {}
            b".." => out.truncate(starts.pop().ok_or(Refusal::AboveRoot)?),
            _ => {
                starts.push(out.len());
                out.push(b'/');
                out.extend_from_slice(segment);
            }
        }
    }
    if out.is_empty() {
        out.push(b'/');
    }
    // Only ASCII was added; whatever else is the path's own (already UTF-8) bytes.
    String::from_utf8(out)
        .map(Cow::Owned)
        .map_err(|_| Refusal::BrokenEscape)
}

/// Whether `path` (starting with `/`) is its own canonical form.
fn is_canonical(path: &[u8]) -> bool {
    if path == b"/" {
        return true;
    }
    let mut start = 1;
    for (i, &b) in path.iter().enumerate().skip(1) {
        match b {
            b'%' | b';' | b'\\' => return false,
            b'/' => {
                if matches!(&path[start..i], b"" | b"." | b"..") {
                    return false;
                }
                start = i + 1;
            }
            _ => {}
        }
    }
    !matches!(&path[start..], b"" | b"." | b"..")
}

/// `path` with its escapes decoded where that is safe: unreserved characters as themselves,
/// every other byte kept as an escape in upper case (an encoded `/` stays data unless
/// `loose`).
fn decode(path: &[u8], loose: bool) -> Result<Vec<u8>, Refusal> {
    let mut out = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        let b = path[i];
        i += 1;
        if b == b'\\' && loose {
            out.push(b'/');
        } else if b != b'%' {
            out.push(b);
        } else {
            let mut byte = hex_pair(path.get(i..i + 2)).ok_or(Refusal::BrokenEscape)?;
            i += 2;
            if loose && byte == b'%' {
                if let Some(twice) = hex_pair(path.get(i..i + 2)) {
                    byte = twice;
                    i += 2;
                }
            }
            push_decoded(&mut out, byte, loose)?;
        }
    }
    Ok(out)
}

fn push_decoded(out: &mut Vec<u8>, byte: u8, loose: bool) -> Result<(), Refusal> {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    match byte {
        0 => return Err(Refusal::Nul),
        b'/' | b'\\' if loose => out.push(b'/'),
        b if b.is_ascii_alphanumeric() || b"-._~".contains(&b) => out.push(b),
        b => out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]),
    }
    Ok(())
}

fn hex_pair(pair: Option<&[u8]>) -> Option<u8> {
    let digit = |c: u8| char::from(c).to_digit(16);
    match pair? {
        [hi, lo] => Some(u8::try_from(digit(*hi)? * 16 + digit(*lo)?).ok()?),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routing() -> Routing {
        Routing::new("/mcp", Some("/_dev"), Some("/_epode-sidecar"))
    }

    /// What a path should route to: an owner and the canonical key, or a refusal.
    enum Want {
        To(Owner, &'static str),
        No(Refusal),
    }
    use Owner::{Mcp, Mounted, Operations, Other};
    use Want::{No, To};

    /// Every spelling, what it routes to, and the canonical key (or the refusal).
    const CASES: &[(&str, Want)] = &[
        // Already canonical: borrowed as they are.
        ("/mcp", To(Mcp, "/mcp")),
        ("/", To(Other, "/")),
        ("/api/orders/A-1001", To(Other, "/api/orders/A-1001")),
        ("*", To(Other, "*")),
        // Encoded unreserved characters, in either hex case.
        ("/%6dcp", To(Mcp, "/mcp")),
        ("/%6Dcp", To(Mcp, "/mcp")),
        ("/%6d%63%70", To(Mcp, "/mcp")),
        ("/m%43p", To(Mcp, "/mCp")),
        // Case: an app may fold it.
        ("/MCP", To(Mcp, "/MCP")),
        ("/Mcp", To(Mcp, "/Mcp")),
        // Slashes, dot segments, params.
        ("/mcp/", To(Mcp, "/mcp")),
        ("//mcp", To(Mcp, "/mcp")),
        ("///mcp//", To(Mcp, "/mcp")),
        ("/./mcp", To(Mcp, "/mcp")),
        ("/mcp/.", To(Mcp, "/mcp")),
        ("/x/../mcp", To(Mcp, "/mcp")),
        ("/x/%2e%2E/mcp", To(Mcp, "/mcp")),
        ("/%2e/mcp", To(Mcp, "/mcp")),
        ("/mcp;x=1", To(Mcp, "/mcp")),
        ("/mcp;", To(Mcp, "/mcp")),
        ("/x/..;y/mcp", To(Mcp, "/mcp")),
        ("/;x/mcp", To(Mcp, "/mcp")),
        // Not the MCP path: a segment of its own, or more after it.
        ("/mcp/x", To(Other, "/mcp/x")),
        ("/mcpx", To(Other, "/mcpx")),
        ("/x/mcp", To(Other, "/x/mcp")),
        ("/mcp%20", To(Other, "/mcp%20")),
        ("/caf%c3%a9", To(Other, "/caf%C3%A9")),
        // The mounted prefix, by whole segment only.
        ("/_dev", To(Mounted(5), "/_dev")),
        ("/_dev/", To(Mounted(5), "/_dev")),
        ("/_dev/events", To(Mounted(5), "/_dev/events")),
        ("/_DEV/events", To(Mounted(5), "/_DEV/events")),
        ("/%5Fdev/events", To(Mounted(5), "/_dev/events")),
        ("/_devtools", To(Other, "/_devtools")),
        ("/_dev-api/x", To(Other, "/_dev-api/x")),
        ("/_dev.json", To(Other, "/_dev.json")),
        // The operations prefix, the same way.
        (
            "/_epode-sidecar/healthz",
            To(Operations(15), "/_epode-sidecar/healthz"),
        ),
        (
            "/_epode-sidecar//healthz/",
            To(Operations(15), "/_epode-sidecar/healthz"),
        ),
        (
            "/%5fepode-sidecar/healthz",
            To(Operations(15), "/_epode-sidecar/healthz"),
        ),
        (
            "/x/../_Epode-Sidecar/metrics",
            To(Operations(15), "/_Epode-Sidecar/metrics"),
        ),
        ("/_epode-sidecar", To(Operations(15), "/_epode-sidecar")),
        (
            "/_epode-sidecarx/healthz",
            To(Other, "/_epode-sidecarx/healthz"),
        ),
        // Encoded separators: data for the surface when every reading leaves it there…
        ("/files/a%2Fb", To(Other, "/files/a%2Fb")),
        ("/files/a%5cb", To(Other, "/files/a%5Cb")),
        ("/files/100%25", To(Other, "/files/100%25")),
        ("/a\\b", To(Other, "/a\\b")),
        // …refused when a reading would route it to the sidecar.
        ("/%2Fmcp", No(Refusal::Ambiguous)),
        ("/mcp%2F", No(Refusal::Ambiguous)),
        ("/mcp%2f", No(Refusal::Ambiguous)),
        ("/x%2F..%2Fmcp", No(Refusal::Ambiguous)),
        ("/mcp%5C", No(Refusal::Ambiguous)),
        ("/mcp\\", No(Refusal::Ambiguous)),
        ("/x\\..\\mcp", No(Refusal::Ambiguous)),
        ("/%256dcp", No(Refusal::Ambiguous)),
        ("/%252Fmcp", No(Refusal::Ambiguous)),
        ("/_epode-sidecar%2Fhealthz", No(Refusal::Ambiguous)),
        ("/_epode-sidecar/a%2Fb", No(Refusal::Ambiguous)),
        ("/_dev%2Fevents", No(Refusal::Ambiguous)),
        // Never well-formed.
        ("/mcp%00", No(Refusal::Nul)),
        ("/%2500", No(Refusal::Nul)),
        ("/mcp%", No(Refusal::BrokenEscape)),
        ("/mcp%4", No(Refusal::BrokenEscape)),
        ("/%zzmcp", No(Refusal::BrokenEscape)),
        ("/../mcp", No(Refusal::AboveRoot)),
        ("/x/../../mcp", No(Refusal::AboveRoot)),
        ("/%2e%2e/mcp", No(Refusal::AboveRoot)),
        ("/..%2Fmcp", No(Refusal::AboveRoot)),
        ("", No(Refusal::NotAPath)),
        ("mcp", No(Refusal::NotAPath)),
    ];

    #[test]
    fn every_spelling_routes_on_its_canonical_form() {
        let r = routing();
        for (path, want) in CASES {
            let want = match want {
                To(owner, key) => Ok((*owner, (*key).to_owned())),
                No(why) => Err(*why),
            };
            let got = r
                .route(path)
                .map(|routed| (routed.owner, routed.key().to_owned()));
            assert_eq!(got, want, "{path:?}");
        }
    }

    #[test]
    fn a_canonical_path_is_borrowed_and_another_spelling_is_not() {
        let r = routing();
        for path in [
            "/mcp",
            "/",
            "/api/orders/A-1001",
            "/_dev/events",
            "/a.b/c..d/.e",
        ] {
            let routed = r.route(path).unwrap();
            assert!(matches!(routed.key, Cow::Borrowed(_)), "{path}");
            assert_eq!(routed.key(), path);
        }
        for path in ["/mcp/", "/%6dcp", "/a/./b", "/a//b", "/a;b"] {
            assert!(
                matches!(r.route(path).unwrap().key, Cow::Owned(_)),
                "{path}"
            );
        }
    }

    #[test]
    fn the_rest_follows_the_prefix() {
        let r = routing();
        assert_eq!(r.route("/_dev/").unwrap().rest(), "");
        assert_eq!(r.route("/_DEV/events").unwrap().rest(), "/events");
        assert_eq!(r.route("/_epode-sidecar/readyz").unwrap().rest(), "/readyz");
        assert_eq!(r.route("/healthz/").unwrap().rest(), "/healthz");
    }

    proptest::proptest! {
        /// Any path is routed or refused, and a key is its own canonical form: routed again it
        /// has the same owner and key, borrowed unless it keeps an escape or a `\`.
        #[test]
        fn a_key_is_a_fixed_point(path in "/[/a-zA-Z0-9%;.\\\\_~-]{0,40}") {
            if let Ok(routed) = routing().route(&path) {
                let again = routing().route(routed.key()).expect("a key routes");
                proptest::prop_assert_eq!(again.owner, routed.owner);
                let kept = routed.key().contains(['%', '\\']);
                proptest::prop_assert!(kept || matches!(again.key, Cow::Borrowed(_)), "{:?}", again);
                proptest::prop_assert_eq!(again.key(), routed.key());
            }
        }

        #[test]
        fn arbitrary_text_never_panics(path in proptest::prelude::any::<String>()) {
            let _ = routing().route(&path);
        }
    }

    #[test]
    fn configured_paths_are_canonical_too() {
        let r = Routing::new("/api/mcp/", None, None);
        assert_eq!(r.route("/api/mcp").unwrap().owner, Owner::Mcp);
        assert_eq!(r.route("/API//%6Dcp").unwrap().owner, Owner::Mcp);
        // Nothing mounted, no operations prefix: those paths are the app's.
        assert_eq!(r.route("/_dev/").unwrap().owner, Owner::Other);
        assert_eq!(
            r.route("/_epode-sidecar/healthz").unwrap().owner,
            Owner::Other
        );
        let root = Routing::new("/", None, None);
        assert_eq!(root.route("//").unwrap().owner, Owner::Mcp);
        assert_eq!(root.route("/x").unwrap().owner, Owner::Other);
    }
}
