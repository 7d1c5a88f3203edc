//! PLACEHOLDER: replaced at merge by branch w5-place
//!
//! What the HTTP surface instruments (spec §3): the decision on a response head, and the skip
//! reasons (metric labels).

use http::{header, HeaderMap, Method, StatusCode};

/// Why a response was not instrumented.
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CacheMode {
    Safe,
    Private,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Json,
    Html,
}

const DEFAULTS: [&str; 10] = [
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

/// The excluded path globs: the defaults and the operator's.
pub(crate) struct Paths {
    globs: Vec<String>,
}

impl Paths {
    pub(crate) fn new(extra: &[String]) -> Result<Paths, String> {
        if let Some(bad) = extra.iter().find(|g| !g.starts_with('/')) {
            return Err(format!("the path glob `{bad}` does not start with /"));
        }
        let mut globs: Vec<String> = DEFAULTS.iter().map(|g| (*g).to_owned()).collect();
        globs.extend(extra.iter().cloned());
        Ok(Paths { globs })
    }

    pub(crate) fn excluded(&self, path: &str) -> bool {
        self.globs
            .iter()
            .any(|g| glob_match(g.as_bytes(), path.as_bytes()))
    }
}

fn glob_match(g: &[u8], p: &[u8]) -> bool {
    match g {
        [] => p.is_empty(),
        [b'*', b'*', rest @ ..] => (0..=p.len()).any(|i| glob_match(rest, &p[i..])),
        [b'*', rest @ ..] => {
            let seg = p.iter().position(|b| *b == b'/').unwrap_or(p.len());
            (0..=seg).any(|i| glob_match(rest, &p[i..]))
        }
        [c, rest @ ..] => p.first() == Some(c) && glob_match(rest, &p[1..]),
    }
}

const STATIC: [&str; 25] = [
    ".js", ".mjs", ".css", ".map", ".png", ".jpg", ".jpeg", ".gif", ".webp", ".avif", ".svg",
    ".ico", ".woff", ".woff2", ".ttf", ".otf", ".eot", ".mp4", ".webm", ".mp3", ".wasm", ".pdf",
    ".zip", ".gz", ".br",
];

fn text<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

fn shared_cacheable(v: &str) -> bool {
    v.to_ascii_lowercase().split(',').any(|d| {
        let d = d.trim();
        d == "public"
            || d == "immutable"
            || d.starts_with("s-maxage")
            || d.starts_with("max-age")
            || d.starts_with("stale-while-revalidate")
    })
}

/// The decision on the response head: the kind to instrument, or why not.
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
    let lower = path.to_ascii_lowercase();
    if STATIC.iter().any(|e| lower.ends_with(e)) {
        return Err(Skip::StaticAsset);
    }
    if status.is_redirection() {
        return Err(Skip::Redirect);
    }
    if !status.is_success()
        || matches!(status.as_u16(), 204..=206)
        || headers.contains_key(header::CONTENT_RANGE)
    {
        return Err(Skip::NotSuccess);
    }
    let ct = text(headers, "content-type").to_ascii_lowercase();
    let essence = ct.split(';').next().unwrap_or_default().trim();
    if essence == "text/event-stream" {
        return Err(Skip::Stream);
    }
    let kind = if essence == "application/json" || essence.ends_with("+json") {
        Kind::Json
    } else if essence == "text/html" {
        Kind::Html
    } else {
        return Err(Skip::ContentType);
    };
    let encoding = text(headers, "content-encoding")
        .trim()
        .to_ascii_lowercase();
    if !encoding.is_empty() && encoding != "identity" {
        return Err(Skip::Compressed);
    }
    let length = text(headers, "content-length").trim().parse::<u64>().ok();
    if length.is_some_and(|n| n > max_body) {
        return Err(Skip::TooLarge);
    }
    if cache == CacheMode::Safe
        && [
            "cache-control",
            "cdn-cache-control",
            "cloudflare-cdn-cache-control",
            "surrogate-control",
        ]
        .iter()
        .any(|h| shared_cacheable(text(headers, h)))
    {
        return Err(Skip::SharedCacheable);
    }
    Ok(kind)
}
