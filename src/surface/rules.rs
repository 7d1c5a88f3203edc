//! Which responses the HTTP surface instruments (spec §3 and the issue's list), decided on the
//! response head before any body byte is read, and the reasons it skips the others: each
//! [`Skip`] is a metric label. The body-level reasons (`already_instrumented`, a chunked body
//! past the limit, an invalid operation) are named here and decided by the proxy.

use http::header::{HeaderName, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE};
use http::{HeaderMap, Method, StatusCode};

/// Why a response is passed through untouched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Skip {
    ModeOff,
    NotSuccess,
    Redirect,
    Head,
    /// Not a product request (OPTIONS, TRACE, or an extension method): no interaction.
    Method,
    ExcludedPath,
    StaticAsset,
    ContentType,
    Stream,
    TooLarge,
    Compressed,
    AlreadyInstrumented,
    SharedCacheable,
    InvalidOperation,
    /// In request cache mode, a request without `Agent-Feedback-Request: 1`.
    NotRequested,
}

impl Skip {
    /// Every reason, so each label can be registered at 0.
    pub(crate) const ALL: [Skip; 15] = [
        Skip::ModeOff,
        Skip::NotSuccess,
        Skip::Redirect,
        Skip::Head,
        Skip::Method,
        Skip::ExcludedPath,
        Skip::StaticAsset,
        Skip::ContentType,
        Skip::Stream,
        Skip::TooLarge,
        Skip::Compressed,
        Skip::AlreadyInstrumented,
        Skip::SharedCacheable,
        Skip::InvalidOperation,
        Skip::NotRequested,
    ];

    /// The `reason` label of `epode_sidecar_http_skipped_total`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Skip::ModeOff => "mode_off",
            Skip::NotSuccess => "not_success",
            Skip::Redirect => "redirect",
            Skip::Head => "head",
            Skip::Method => "method",
            Skip::ExcludedPath => "excluded_path",
            Skip::StaticAsset => "static_asset",
            Skip::ContentType => "content_type",
            Skip::Stream => "stream",
            Skip::TooLarge => "too_large",
            Skip::Compressed => "compressed",
            Skip::AlreadyInstrumented => "already_instrumented",
            Skip::SharedCacheable => "shared_cacheable",
            Skip::InvalidOperation => "invalid_operation",
            Skip::NotRequested => "not_requested",
        }
    }
}

/// `EPODE_SIDECAR_HTTP_CACHE_MODE`: whether explicitly shared-cacheable responses are skipped
/// (`Safe`) or instrumented and made private (`Private`), or only a request that asks with
/// `Agent-Feedback-Request: 1` is instrumented, cacheable or not (`Request`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CacheMode {
    Safe,
    Private,
    Request,
}

/// What an instrumented body is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Candidate {
    Json,
    Html,
}

/// Paths never instrumented: the sidecar's, Epode's and the usual probes', as the SDK's
/// `DEFAULT_EXCLUDE` has them (plus `/readyz`).
const DEFAULT_EXCLUDE: [&str; 10] = [
    "/health",
    "/healthz",
    "/readyz",
    "/metrics",
    "/favicon.ico",
    "/robots.txt",
    "/_agent-feedback/**",
    "/_epode/**",
    "/api/v2/reports",
    "/api/v2/consent/**",
];

/// One element of a compiled glob.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token {
    Byte(u8),
    /// `*`: any run of bytes other than `/`.
    Star,
    /// `**`: any run of bytes.
    Any,
}

/// An anchored path glob, as the SDK's `matchPattern` reads it: `**` spans `/`, `*` does
/// not, everything else is literal.
#[derive(Clone, Debug)]
struct Glob(Vec<Token>);

impl Glob {
    fn compile(glob: &str) -> Glob {
        let bytes = glob.as_bytes();
        let mut tokens = Vec::with_capacity(bytes.len());
        let mut at = 0;
        while at < bytes.len() {
            let token = match (bytes[at], bytes.get(at + 1)) {
                (b'*', Some(b'*')) => Token::Any,
                (b'*', _) => Token::Star,
                (byte, _) => Token::Byte(byte),
            };
            at += if token == Token::Any { 2 } else { 1 };
            tokens.push(token);
        }
        Glob(tokens)
    }

    /// Simulates the glob as an automaton over the set of positions reached: time is the
    /// path's length times the glob's, with no backtracking.
    fn matches(&self, path: &[u8]) -> bool {
        let tokens = &self.0;
        let mut live = vec![false; tokens.len() + 1];
        let mut next = live.clone();
        live[0] = true;
        Self::close(tokens, &mut live);
        for &byte in path {
            next.fill(false);
            for (state, token) in tokens.iter().enumerate().filter(|(state, _)| live[*state]) {
                match *token {
                    Token::Byte(want) if want == byte => next[state + 1] = true,
                    Token::Star if byte != b'/' => next[state] = true,
                    Token::Any => next[state] = true,
                    _ => {}
                }
            }
            Self::close(tokens, &mut next);
            if !next.contains(&true) {
                return false;
            }
            std::mem::swap(&mut live, &mut next);
        }
        live[tokens.len()]
    }

    /// A wildcard may match nothing: reaching it reaches what follows it.
    fn close(tokens: &[Token], live: &mut [bool]) {
        for (state, token) in tokens.iter().enumerate() {
            if live[state] && matches!(token, Token::Star | Token::Any) {
                live[state + 1] = true;
            }
        }
    }
}

/// The compiled excluded paths: the defaults plus `EPODE_SIDECAR_HTTP_EXCLUDE`.
#[derive(Clone, Debug)]
pub(crate) struct Paths {
    globs: Vec<Glob>,
}

impl Paths {
    /// Each extra glob (surrounding whitespace ignored) must be non-empty and start with `/`;
    /// the error names the first that does not.
    pub(crate) fn new(extra: &[String]) -> Result<Paths, String> {
        let mut globs: Vec<Glob> = DEFAULT_EXCLUDE
            .iter()
            .map(|glob| Glob::compile(glob))
            .collect();
        for glob in extra {
            let trimmed = glob.trim();
            if !trimmed.starts_with('/') {
                return Err(format!(
                    "the excluded path {glob:?} is not a path glob: it must start with `/`"
                ));
            }
            globs.push(Glob::compile(trimmed));
        }
        Ok(Paths { globs })
    }

    /// Whether `path` (its query, if any, ignored) matches one glob, anchored at both ends.
    pub(crate) fn excluded(&self, path: &str) -> bool {
        let path = path.split('?').next().unwrap_or_default().as_bytes();
        self.globs.iter().any(|glob| glob.matches(path))
    }
}

/// Extensions of files that are never a page or an API answer.
const STATIC_EXTENSIONS: [&str; 24] = [
    "js", "mjs", "css", "map", "png", "jpg", "jpeg", "gif", "webp", "avif", "svg", "ico", "woff",
    "woff2", "ttf", "otf", "eot", "mp4", "webm", "mp3", "wasm", "pdf", "zip", "gz",
];

fn static_asset(path: &str) -> bool {
    let path = path.split('?').next().unwrap_or_default();
    let last = path.rsplit('/').next().unwrap_or_default();
    last.rsplit_once('.').is_some_and(|(_, extension)| {
        STATIC_EXTENSIONS
            .iter()
            .any(|known| known.eq_ignore_ascii_case(extension))
    })
}

/// The response's media type, lower-cased, without parameters.
pub(super) fn media_type(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(CONTENT_TYPE)?.to_str().ok()?;
    let essence = value.split(';').next().unwrap_or_default().trim();
    Some(essence.to_ascii_lowercase())
}

pub(super) fn kind_of(media: &str) -> Option<Candidate> {
    let json = media == "application/json"
        || media
            .split_once('/')
            .is_some_and(|(_, subtype)| subtype.ends_with("+json"));
    match media {
        _ if json => Some(Candidate::Json),
        "text/html" => Some(Candidate::Html),
        _ => None,
    }
}

/// Any coding other than `identity` in any `Content-Encoding` value.
fn compressed(headers: &HeaderMap) -> bool {
    headers.get_all(CONTENT_ENCODING).iter().any(|value| {
        value.as_bytes().split(|&byte| byte == b',').any(|coding| {
            let coding = coding.trim_ascii();
            !coding.is_empty() && !coding.eq_ignore_ascii_case(b"identity")
        })
    })
}

fn too_large(headers: &HeaderMap, max_body: u64) -> bool {
    headers
        .get(CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok())
        .is_some_and(|length| length > max_body)
}

/// The caching headers the SDK reads for shared cacheability.
const CACHE_HEADERS: [&str; 4] = [
    "cache-control",
    "cdn-cache-control",
    "cloudflare-cdn-cache-control",
    "surrogate-control",
];

/// `\s` on ASCII, as the SDK's pattern has it.
fn space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// The SDK's `/(?:^|,)\s*(?:public|s-maxage\s*=|max-age\s*=|immutable|
/// stale-while-revalidate\s*=)/i` on one header value: at the start or after any comma,
/// whitespace, then one of the directives (`max-age=0` included, as in the SDK).
fn shared_cacheable_value(value: &[u8]) -> bool {
    value.split(|&byte| byte == b',').any(|directive| {
        let start = directive.iter().position(|&byte| !space(byte));
        let directive = start.map_or(&[][..], |start| &directive[start..]);
        let starts = |prefix: &[u8]| {
            directive
                .get(..prefix.len())
                .is_some_and(|head| head.eq_ignore_ascii_case(prefix))
        };
        let assigns = |name: &[u8]| {
            starts(name)
                && directive[name.len()..].iter().find(|&&byte| !space(byte)) == Some(&b'=')
        };
        starts(b"public")
            || starts(b"immutable")
            || assigns(b"s-maxage")
            || assigns(b"max-age")
            || assigns(b"stale-while-revalidate")
    })
}

fn shared_cacheable(headers: &HeaderMap) -> bool {
    CACHE_HEADERS.iter().any(|name| {
        let name = HeaderName::from_static(name);
        headers
            .get_all(&name)
            .iter()
            .any(|value| shared_cacheable_value(value.as_bytes()))
    })
}

/// Whether an answer to `method` can be a product interaction: the methods that ask the product
/// for something (GET, POST, PUT, PATCH, DELETE). OPTIONS (a CORS preflight), TRACE, CONNECT and
/// extension methods are the HTTP machinery's, never an interaction.
pub(crate) fn is_product_method(method: &Method) -> bool {
    [
        Method::GET,
        Method::POST,
        Method::PUT,
        Method::PATCH,
        Method::DELETE,
    ]
    .contains(method)
}

/// The decision on the response head (before any body byte is read): the kind to instrument, or
/// why not. Order: Head, Method (not a product method), ExcludedPath, StaticAsset, Redirect (3xx), NotSuccess (not 2xx, or
/// 204/205/206, or Content-Range), Stream (text/event-stream), ContentType (not JSON nor HTML),
/// Compressed, TooLarge (Content-Length over `max_body`), SharedCacheable (`Safe` mode only).
pub(crate) fn on_head(
    method: &Method,
    path: &str,
    paths: &Paths,
    status: StatusCode,
    headers: &HeaderMap,
    cache: CacheMode,
    max_body: u64,
) -> Result<Candidate, Skip> {
    if method == Method::HEAD {
        return Err(Skip::Head);
    }
    if !is_product_method(method) {
        return Err(Skip::Method);
    }
    if paths.excluded(path) {
        return Err(Skip::ExcludedPath);
    }
    if static_asset(path) {
        return Err(Skip::StaticAsset);
    }
    if status.is_redirection() {
        return Err(Skip::Redirect);
    }
    let partial = matches!(status.as_u16(), 204..=206) || headers.contains_key(CONTENT_RANGE);
    if !status.is_success() || partial {
        return Err(Skip::NotSuccess);
    }
    let media = media_type(headers).unwrap_or_default();
    if media == "text/event-stream" {
        return Err(Skip::Stream);
    }
    let kind = kind_of(&media).ok_or(Skip::ContentType)?;
    if compressed(headers) {
        return Err(Skip::Compressed);
    }
    if too_large(headers, max_body) {
        return Err(Skip::TooLarge);
    }
    if cache == CacheMode::Safe && shared_cacheable(headers) {
        return Err(Skip::SharedCacheable);
    }
    Ok(kind)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn paths() -> Paths {
        Paths::new(&["/private/*".to_owned(), " /assets/**/raw ".to_owned()]).unwrap()
    }

    #[test]
    fn labels_are_the_agreed_ones_and_distinct() {
        let labels: Vec<&str> = Skip::ALL.iter().map(|skip| skip.label()).collect();
        assert_eq!(
            labels.join(" "),
            "mode_off not_success redirect head method excluded_path static_asset content_type stream \
             too_large compressed already_instrumented shared_cacheable invalid_operation not_requested"
        );
    }

    #[test]
    fn globs_are_anchored_and_star_stays_in_a_segment() {
        let paths = paths();
        let excluded = [
            "/health",
            "/healthz",
            "/readyz",
            "/metrics",
            "/favicon.ico",
            "/robots.txt",
            "/_agent-feedback/",
            "/_agent-feedback/a/b",
            "/_epode/x",
            "/api/v2/reports",
            "/api/v2/consent/state",
            "/api/v2/consent/a/b",
            "/private/",
            "/private/x",
            "/assets//raw",
            "/assets/a/b/raw",
            "/health?probe=1",
        ];
        let kept = [
            "/",
            "/health/",
            "/healthx",
            "/x/health",
            "/HEALTH",
            "/_agent-feedback",
            "/api/v2/reports/1",
            "/private",
            "/private/x/y",
            "/assets/raw",
            "/assets/raw/x",
            "/assets/a/rawx",
            "/search",
            "/docs/test",
        ];
        for path in excluded {
            assert!(paths.excluded(path), "{path}");
        }
        for path in kept {
            assert!(!paths.excluded(path), "{path}");
        }
        let literal = Paths::new(&["/a.b/(c)+".to_owned()]).unwrap();
        assert!(literal.excluded("/a.b/(c)+"));
        assert!(!literal.excluded("/axb/(c)+"));
        let stars = Paths::new(&["/a/***".to_owned(), "/b*c*d".to_owned()]).unwrap();
        assert!(stars.excluded("/a/x/y") && stars.excluded("/a/"));
        assert!(stars.excluded("/bcd") && stars.excluded("/bxxcyyd") && !stars.excluded("/bc/d"));
    }

    #[test]
    fn bad_globs_are_refused_by_name() {
        for bad in ["", "  ", "health", "*/x", "**"] {
            let err = Paths::new(&["/ok".to_owned(), bad.to_owned()]).unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn globs_are_linear() {
        let paths =
            Paths::new(&["/*a*a*a*a*a*a*a*a*b".to_owned(), "/**a**a**a**b".to_owned()]).unwrap();
        assert!(!paths.excluded(&format!("/{}", "a".repeat(100_000))));
    }

    fn head(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        headers
    }

    fn decide(
        method: Method,
        path: &str,
        status: u16,
        pairs: &[(&str, &str)],
    ) -> Result<Candidate, Skip> {
        let status = StatusCode::from_u16(status).unwrap();
        on_head(
            &method,
            path,
            &paths(),
            status,
            &head(pairs),
            CacheMode::Safe,
            1000,
        )
    }

    const JSON: (&str, &str) = ("content-type", "application/json");

    #[test]
    fn supported_kinds() {
        let cases: &[(&str, Result<Candidate, Skip>)] = &[
            ("application/json", Ok(Candidate::Json)),
            ("Application/JSON; charset=utf-8", Ok(Candidate::Json)),
            ("application/problem+json", Ok(Candidate::Json)),
            ("application/vnd.api+json ; x=y", Ok(Candidate::Json)),
            ("text/html", Ok(Candidate::Html)),
            ("TEXT/HTML;charset=ISO-8859-1", Ok(Candidate::Html)),
            ("text/event-stream", Err(Skip::Stream)),
            ("text/plain", Err(Skip::ContentType)),
            ("application/octet-stream", Err(Skip::ContentType)),
            ("application/jsonx", Err(Skip::ContentType)),
            ("application/xhtml+xml", Err(Skip::ContentType)),
            ("image/png", Err(Skip::ContentType)),
            ("", Err(Skip::ContentType)),
        ];
        for (media, want) in cases {
            assert_eq!(
                decide(Method::GET, "/x", 200, &[("content-type", media)]),
                *want,
                "{media}"
            );
        }
        assert_eq!(decide(Method::GET, "/x", 200, &[]), Err(Skip::ContentType));
    }

    /// Method, path, status, headers, decision.
    type Case = (
        Method,
        &'static str,
        u16,
        &'static [(&'static str, &'static str)],
        Result<Candidate, Skip>,
    );

    const HEAD_CASES: &[Case] = &[
        (Method::GET, "/search", 200, &[JSON], Ok(Candidate::Json)),
        (Method::POST, "/search", 201, &[JSON], Ok(Candidate::Json)),
        (Method::HEAD, "/health", 500, &[], Err(Skip::Head)),
        (Method::OPTIONS, "/search", 200, &[JSON], Err(Skip::Method)),
        (Method::TRACE, "/search", 200, &[JSON], Err(Skip::Method)),
        (Method::GET, "/health", 500, &[], Err(Skip::ExcludedPath)),
        (Method::GET, "/app.js", 302, &[JSON], Err(Skip::StaticAsset)),
        (
            Method::GET,
            "/a/IMG.PNG?x=1",
            200,
            &[JSON],
            Err(Skip::StaticAsset),
        ),
        (
            Method::GET,
            "/x.tar.gz",
            200,
            &[JSON],
            Err(Skip::StaticAsset),
        ),
        (Method::GET, "/data.json", 200, &[JSON], Ok(Candidate::Json)),
        (Method::GET, "/js/page", 200, &[JSON], Ok(Candidate::Json)),
        (Method::GET, "/x", 301, &[JSON], Err(Skip::Redirect)),
        (Method::GET, "/x", 304, &[JSON], Err(Skip::Redirect)),
        (Method::GET, "/x", 404, &[JSON], Err(Skip::NotSuccess)),
        (Method::GET, "/x", 401, &[JSON], Err(Skip::NotSuccess)),
        (Method::GET, "/x", 500, &[JSON], Err(Skip::NotSuccess)),
        (Method::GET, "/x", 101, &[JSON], Err(Skip::NotSuccess)),
        (Method::GET, "/x", 204, &[JSON], Err(Skip::NotSuccess)),
        (Method::GET, "/x", 205, &[JSON], Err(Skip::NotSuccess)),
        (Method::GET, "/x", 206, &[JSON], Err(Skip::NotSuccess)),
        (
            Method::GET,
            "/x",
            200,
            &[JSON, ("content-range", "bytes 0-1/2")],
            Err(Skip::NotSuccess),
        ),
        (
            Method::GET,
            "/x",
            200,
            &[
                ("content-type", "text/event-stream"),
                ("content-encoding", "gzip"),
            ],
            Err(Skip::Stream),
        ),
        (
            Method::GET,
            "/x",
            200,
            &[("content-type", "image/png"), ("content-encoding", "gzip")],
            Err(Skip::ContentType),
        ),
        (
            Method::GET,
            "/x",
            200,
            &[
                JSON,
                ("content-encoding", "gzip"),
                ("content-length", "99999"),
            ],
            Err(Skip::Compressed),
        ),
        (
            Method::GET,
            "/x",
            200,
            &[JSON, ("content-encoding", "identity, br")],
            Err(Skip::Compressed),
        ),
        (
            Method::GET,
            "/x",
            200,
            &[JSON, ("content-encoding", "IDENTITY")],
            Ok(Candidate::Json),
        ),
        (
            Method::GET,
            "/x",
            200,
            &[
                JSON,
                ("content-length", "1001"),
                ("cache-control", "public"),
            ],
            Err(Skip::TooLarge),
        ),
        (
            Method::GET,
            "/x",
            200,
            &[JSON, ("content-length", "1000")],
            Ok(Candidate::Json),
        ),
        (
            Method::GET,
            "/x",
            200,
            &[JSON, ("cache-control", "public")],
            Err(Skip::SharedCacheable),
        ),
    ];

    #[test]
    fn head_level_skips_in_order() {
        for (method, path, status, pairs, want) in HEAD_CASES {
            assert_eq!(
                decide(method.clone(), path, *status, pairs),
                *want,
                "{method} {path} {status} {pairs:?}"
            );
        }
    }

    #[test]
    fn shared_cacheable_as_the_sdk_pattern() {
        let cacheable = [
            "public",
            "PUBLIC",
            "private, public",
            "no-cache,public",
            "max-age=0",
            "max-age = 60",
            "Max-Age=60",
            "s-maxage=10",
            "immutable",
            "stale-while-revalidate=30",
            " ,\tpublic",
            "publicity",
            "max-age=60, private",
        ];
        let not = [
            "",
            "private",
            "no-store",
            "private, no-store",
            "no-cache",
            "max-age",
            "x-max-age=5",
            "private max-age=5",
            "stale-while-revalidate",
            "must-revalidate",
            "s-maxage",
        ];
        for value in cacheable {
            assert!(shared_cacheable_value(value.as_bytes()), "{value}");
        }
        for value in not {
            assert!(!shared_cacheable_value(value.as_bytes()), "{value}");
        }
        for name in CACHE_HEADERS {
            let headers = head(&[JSON, (name, "no-store"), (name, "public")]);
            let decide = |cache| {
                on_head(
                    &Method::GET,
                    "/x",
                    &paths(),
                    StatusCode::OK,
                    &headers,
                    cache,
                    10,
                )
            };
            assert_eq!(
                decide(CacheMode::Safe),
                Err(Skip::SharedCacheable),
                "{name}"
            );
            assert_eq!(decide(CacheMode::Private), Ok(Candidate::Json), "{name}");
        }
        assert!(shared_cacheable_value(b"\xff, public"));
    }

    proptest! {
        #[test]
        fn nothing_panics(path in any::<String>(), glob in "/[a-z*/]{0,12}", value in proptest::collection::vec(any::<u8>(), 0..64)) {
            let paths = Paths::new(&[glob]).unwrap();
            let _ = paths.excluded(&path);
            let _ = static_asset(&path);
            let _ = shared_cacheable_value(&value);
        }
    }
}
