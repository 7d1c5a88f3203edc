//! Which responses the HTTP surface instruments (spec §3 and the list), decided on the
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
    ExcludedPath,
    StaticAsset,
    ContentType,
    Stream,
    TooLarge,
    Compressed,
    AlreadyInstrumented,
    SharedCacheable,
    InvalidOperation,
}

impl Skip {
    /// Every reason, so each label can be registered at 0.
    pub(crate) const ALL: [Skip; 13] = [
        Skip::ModeOff,
        Skip::NotSuccess,
        Skip::Redirect,
        Skip::Head,
        Skip::ExcludedPath,
        Skip::StaticAsset,
        Skip::ContentType,
        Skip::Stream,
        Skip::TooLarge,
        Skip::Compressed,
        Skip::AlreadyInstrumented,
        Skip::SharedCacheable,
        Skip::InvalidOperation,
    ];

    /// The `reason` label of `epode_sidecar_http_skipped_total`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Skip::ModeOff => "mode_off",
            Skip::NotSuccess => "not_success",
            Skip::Redirect => "redirect",
            Skip::Head => "head",
            Skip::ExcludedPath => "excluded_path",
            Skip::StaticAsset => "static_asset",
            Skip::ContentType => "content_type",
            Skip::Stream => "stream",
            Skip::TooLarge => "too_large",
            Skip::Compressed => "compressed",
            Skip::AlreadyInstrumented => "already_instrumented",
            Skip::SharedCacheable => "shared_cacheable",
            Skip::InvalidOperation => "invalid_operation",
        }
    }
}

/// `EPODE_SIDECAR_HTTP_CACHE_MODE`: whether explicitly shared-cacheable responses are skipped
/// (`Safe`) or instrumented and made private (`Private`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CacheMode {
    Safe,
    Private,
}

/// What an instrumented body is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
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
fn media_type(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(CONTENT_TYPE)?.to_str().ok()?;
    let essence = value.split(';').next().unwrap_or_default().trim();
    Some(essence.to_ascii_lowercase())
}

fn kind_of(media: &str) -> Option<Kind> {
    let json = media == "application/json"
        || media
            .split_once('/')
            .is_some_and(|(_, subtype)| subtype.ends_with("+json"));
    match media {
        _ if json => Some(Kind::Json),
        "text/html" => Some(Kind::Html),
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

/// The decision on the response head (before any body byte is read): the kind to instrument, or
/// why not. Order: Head, ExcludedPath, StaticAsset, Redirect (3xx), NotSuccess (not 2xx, or
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
) -> Result<Kind, Skip> {
    if method == Method::HEAD {
        return Err(Skip::Head);
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
