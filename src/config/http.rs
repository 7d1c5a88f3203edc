//! The HTTP surface (the product's routes that are not MCP, proxied to the upstream's origin
//! and instrumented as Epode's HTTP protocol says): its settings and the [`HttpSurface`] built
//! from them. Off by default, so nothing changes for a sidecar in front of an MCP server only.

use super::setting::{
    a_size, bounded, percent, read_all, setting, settings, split_list, Accepts, Bad, Layers,
    Refused,
};
use super::types::{HttpCacheMode, HttpSurface, RouteTemplate};

/// The HTTP surface's settings; `None` when it is off.
pub(super) fn read(l: &Layers) -> Result<Option<HttpSurface>, Refused> {
    if !l.get(&HTTP_SURFACE)? {
        return Ok(None);
    }
    read_all!(HttpSurface {
        max_body: l.get(&HTTP_MAX_BODY),
        cache_mode: l.get(&HTTP_CACHE_MODE),
        exclude: l.optional(&HTTP_EXCLUDE).map(Option::unwrap_or_default),
        operations_prefix: l.get(&OPERATIONS_PREFIX),
        routes: l.optional(&HTTP_ROUTES).map(Option::unwrap_or_default),
        upstream_share: l.get(&HTTP_UPSTREAM_SHARE),
        request_observation: l.get(&REQUEST_OBSERVATION),
    })
    .map(Some)
}

fn on_off(v: &str) -> Result<bool, Bad> {
    match v.to_ascii_lowercase().as_str() {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(Bad::Whole),
    }
}

fn cache_mode(v: &str) -> Result<HttpCacheMode, Bad> {
    match v.to_ascii_lowercase().as_str() {
        "safe" => Ok(HttpCacheMode::Safe),
        "private" => Ok(HttpCacheMode::Private),
        "request" => Ok(HttpCacheMode::Request),
        _ => Err(Bad::Whole),
    }
}

/// Path globs: each starts with `/`, without a query, fragment or space.
fn globs(raw: &str) -> Result<Vec<String>, Bad> {
    let list = split_list(raw);
    if let Some(bad) = list
        .iter()
        .find(|g| !g.starts_with('/') || g.contains(['?', '#', ' ']))
    {
        return Err(Bad::Entry(bad.clone()));
    }
    Ok(list)
}

/// The most route templates: each request may be compared with every one.
const ROUTES_MAX: usize = 64;

/// Route templates such as `/users/{id}/orders/{id}` (`RouteTemplate::parse`), at most
/// [`ROUTES_MAX`].
fn routes(raw: &str) -> Result<Vec<RouteTemplate>, Bad> {
    let list = split_list(raw);
    if list.len() > ROUTES_MAX {
        return Err(Bad::Described("more than 64 route templates"));
    }
    list.iter()
        .map(|t| RouteTemplate::parse(t).ok_or_else(|| Bad::Entry(t.clone())))
        .collect()
}

/// A whole percentage from 1 to 99, with or without `%`.
/// A percentage, `50%` or `50` (its bounds are the declaration's, checked before).
/// A path prefix such as `/_epode-sidecar`: starts with `/`, does not end with one, and is
/// more than `/`.
fn prefix(v: &str) -> Result<String, Bad> {
    let ok = v.starts_with('/')
        && v.len() > 1
        && !v.ends_with('/')
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/_-.~".contains(&b));
    if ok {
        Ok(v.to_owned())
    } else {
        Err(Bad::Whole)
    }
}

fn shown<T>(c: &super::types::Config, f: impl Fn(&HttpSurface) -> T) -> Option<T> {
    c.http.as_ref().map(f)
}

settings! {
    /// The HTTP surface's settings.
    pub(super) HTTP {
        HTTP_SURFACE: bool = setting(
            "http_surface",
            &["EPODE_SIDECAR_HTTP_SURFACE"],
            Some("off"),
            "on or off",
            "The HTTP surface: with `on`, every request that is not for the MCP path goes to the origin (scheme, host, port) of `EPODE_SIDECAR_UPSTREAM` with its own path and query, and its response is instrumented as Epode's HTTP protocol says (`_agentFeedback` in a JSON object, a script tag in an HTML page, the `Agent-Feedback` header otherwise). The upstream names the caller with a response header `Epode-Identity`, which the sidecar always removes. `EPODE_SIDECAR_UPSTREAM` may then be a bare origin (`http://127.0.0.1:8000`), the MCP endpoint being `EPODE_SIDECAR_PATH` on it; the sidecar's health, readiness and metrics move under `EPODE_SIDECAR_OPERATIONS_PREFIX` on this port. Request bodies to the app are read whole, up to `EPODE_SIDECAR_MAX_BODY_BYTES`. Needs an HTTP upstream.",
            on_off,
            |c| if c.http.is_some() { "on" } else { "off" }.to_owned(),
        ),
        HTTP_MAX_BODY: u64 = bounded(
            "http_max_body",
            &["EPODE_SIDECAR_HTTP_MAX_BODY"],
            Some("1MiB"),
            Accepts::size(1, 1 << 30, "1048576, 512KiB or 1MiB"),
            "With the HTTP surface: the largest JSON or HTML response the sidecar holds (within the memory budget) to instrument; a larger one streams through untouched.",
            a_size,
            |c| shown(c, |h| h.max_body.to_string()).unwrap_or_else(|| "<not used>".into()),
        ),
        HTTP_CACHE_MODE: HttpCacheMode = setting(
            "http_cache_mode",
            &["EPODE_SIDECAR_HTTP_CACHE_MODE"],
            Some("safe"),
            "safe, private or request",
            "With the HTTP surface: `safe` leaves responses a shared cache may keep (`public`, `s-maxage`, `max-age`, `immutable`, `stale-while-revalidate` in `Cache-Control` or a CDN's cache header) untouched; `private` instruments them too; `request` (Epode's `cacheMode: \"request\"`) instruments a response only when its request carries `Agent-Feedback-Request: 1`, cacheable or not, advertises that on an ordinary complete JSON or HTML `GET`/`HEAD` response with `Link: </path?query>; rel=\"agent-feedback\"; request-header=\"Agent-Feedback-Request: 1\"`, and adds `Vary: Agent-Feedback-Request` to every response of an instrumented path, as Epode's Node SDK does. Every instrumented response is made `Cache-Control: private, no-store`.",
            cache_mode,
            |c| shown(c, |h| match h.cache_mode {
                HttpCacheMode::Safe => "safe",
                HttpCacheMode::Private => "private",
                HttpCacheMode::Request => "request",
            }.to_owned()).unwrap_or_else(|| "<not used>".into()),
        ),
        HTTP_EXCLUDE: Vec<String> = setting(
            "http_exclude",
            &["EPODE_SIDECAR_HTTP_EXCLUDE"],
            None,
            "comma-separated path globs starting with /, `*` matching within one segment and `**` anything",
            "With the HTTP surface: paths never instrumented (proxied untouched), besides the defaults `/health`, `/healthz`, `/readyz`, `/metrics`, `/favicon.ico`, `/robots.txt`, `/_agent-feedback/**`, `/_epode/**`, `/api/v2/reports`, `/api/v2/consent/**`.",
            globs,
            |c| shown(c, |h| h.exclude.join(",")).filter(|s| !s.is_empty()).unwrap_or_else(|| "<the defaults only>".into()),
        ),
        OPERATIONS_PREFIX: String = setting(
            "operations_prefix",
            &["EPODE_SIDECAR_OPERATIONS_PREFIX"],
            Some("/_epode-sidecar"),
            "a URL path starting with / and not ending with one, such as /_epode-sidecar",
            "With the HTTP surface: the sidecar's own routes on its port are `<prefix>/healthz`, `<prefix>/health`, `<prefix>/readyz` (and `<prefix>/metrics` when there is no admin listener), so the app's own `/health` reaches the app. The admin listener keeps the bare paths.",
            prefix,
            |c| shown(c, |h| h.operations_prefix.clone()).unwrap_or_else(|| "<not used>".into()),
        ),
        HTTP_ROUTES: Vec<RouteTemplate> = setting(
            "http_routes",
            &["EPODE_SIDECAR_HTTP_ROUTES"],
            None,
            "comma-separated route templates, at most 64, each starting with / and naming an operation of at most 160 characters, its segments separated by / and each a literal of A-Z a-z 0-9 _ . - or a placeholder {name}, such as /users/{id}/orders/{id}",
            "With the HTTP surface: the operation an instrumented response's telemetry event names, for paths the default gets wrong. A path matching a template (the same number of segments, one trailing / ignored; each literal the same, each placeholder any non-empty segment) is reported as the template with every placeholder as `:id` (`/users/{id}/orders/{id}` → `/users/:id/orders/:id`); the first that matches wins. Any other path is named by the default: each segment that is not a route word (lowercase letters, words joined by single - or _, at most 24 characters, no digits but a version such as v2) becomes `:id`, so ids, tokens, names and e-mail addresses never reach Epode.",
            routes,
            |c| shown(c, |h| h.routes.iter().map(|r| r.written.as_str()).collect::<Vec<_>>().join(",")).filter(|s| !s.is_empty()).unwrap_or_else(|| "<the default operation names only>".into()),
        ),
        REQUEST_OBSERVATION: bool = setting(
            "request_observation",
            &["EPODE_SIDECAR_REQUEST_OBSERVATION"],
            Some("off"),
            "on or off",
            "With the HTTP surface: `on` adds to each instrumented response's telemetry event what the request says of its client (Epode's `requestObservation`), from the fixed allowlist Epode's Node adapters use: the client's address (as `EPODE_SIDECAR_TRUSTED_PROXIES` resolves it), the method, `User-Agent`, `Accept-Language`, the referrer's origin and the client hints `Sec-CH-UA`, `Sec-CH-UA-Platform`, `Sec-CH-UA-Mobile`, each trimmed and cut to Epode's bounds; never cookies, credentials, bodies, a full referrer or a query string. Epode takes it on HTTP events only, so MCP events never carry it. Off by default: it is personal data the product must be entitled to send.",
            on_off,
            |c| shown(c, |h| if h.request_observation { "on" } else { "off" }.to_owned()).unwrap_or_else(|| "<not used>".into()),
        ),
        HTTP_UPSTREAM_SHARE: u8 = bounded(
            "http_upstream_share",
            &["EPODE_SIDECAR_HTTP_UPSTREAM_SHARE"],
            Some("50%"),
            Accepts::whole("%", 1, 99),
            "With the HTTP surface: its share of `upstream_max_connections` (rounded down, at least 1 connection); the MCP path has the rest, so neither can take the connections the other needs. A request past its path's share waits up to `upstream_wait`, then gets 503 with `Retry-After: 1`, nothing sent. `upstream_max_connections` must then be at least 2.",
            percent,
            |c| shown(c, |h| format!("{}%", h.upstream_share)).unwrap_or_else(|| "<not used>".into()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_a_unit_and_stay_within_the_declared_bounds() {
        assert_eq!(HTTP_MAX_BODY.value("1MiB").unwrap(), 1 << 20);
        assert_eq!(HTTP_MAX_BODY.value("512KiB").unwrap(), 512 << 10);
        assert_eq!(HTTP_MAX_BODY.value("2MB").unwrap(), 2_000_000);
        assert_eq!(HTTP_MAX_BODY.value("1048576").unwrap(), 1 << 20);
        assert_eq!(HTTP_MAX_BODY.value("1GiB").unwrap(), 1 << 30);
        for bad in ["0", "2GiB", "1 mb", "MiB", "-1", "1.5MiB", ""] {
            assert!(HTTP_MAX_BODY.value(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn prefixes_and_globs_are_checked() {
        assert_eq!(prefix("/_ops").unwrap(), "/_ops");
        for bad in ["/", "ops", "/ops/", "/a b", "/a?b"] {
            assert!(prefix(bad).is_err(), "{bad}");
        }
        assert_eq!(
            globs("/a/*, /b/**").unwrap(),
            vec!["/a/*".to_owned(), "/b/**".to_owned()]
        );
        assert!(matches!(globs("/a,b"), Err(Bad::Entry(e)) if e == "b"));
    }

    #[test]
    fn route_templates_are_checked_and_bounded() {
        let got = routes("/users/{id}/orders/{id}, /Reports/{year}/, /, /u/{}").unwrap();
        let ops: Vec<String> = got.iter().map(RouteTemplate::operation).collect();
        assert_eq!(
            ops,
            ["/users/:id/orders/:id", "/Reports/:id", "/", "/u/:id"]
        );
        assert_eq!(got[1].written, "/Reports/{year}/");
        assert_eq!(got[1].segments, [Some("Reports".to_owned()), None]);
        for bad in [
            "users/{id}",
            "/users//{id}",
            "//",
            "/users/{id",
            "/users/{i-d}",
            "/users/x{id}",
            "/a b",
            "/a:b",
            "/a*",
            "/a%20b",
            "/caf\u{e9}",
        ] {
            assert!(
                matches!(routes(&format!("/ok,{bad}")), Err(Bad::Entry(e)) if e == bad),
                "{bad}"
            );
        }
        let longest = format!("/{}", "a".repeat(159));
        assert!(routes(&longest).is_ok());
        assert!(matches!(routes(&format!("{longest}b")), Err(Bad::Entry(_))));
        // `{}` grows to `:id`: the operation's length counts.
        let grows = format!("/{}/{{}}", "a".repeat(156));
        assert_eq!(grows.len(), 160);
        assert!(routes(&grows).is_err());
        let many: Vec<String> = (0..65).map(|i| format!("/r{i}")).collect();
        assert!(routes(&many[..64].join(",")).is_ok());
        assert!(matches!(routes(&many.join(",")), Err(Bad::Described(_))));
    }

    #[test]
    fn the_upstream_share_is_a_percentage_and_leaves_mcp_some() {
        assert_eq!(percent("50%").unwrap(), 50);
        assert_eq!(percent(" 25 ").unwrap(), 25);
        // 0 and 100% are the declaration's bounds (`bounds_are_checked_and_stated_from_one_place`).
        for bad in ["50.5%", "half", "", "-1"] {
            assert!(percent(bad).is_err(), "{bad}");
        }
        let surface = |share| HttpSurface {
            max_body: 1,
            cache_mode: HttpCacheMode::Safe,
            exclude: Vec::new(),
            operations_prefix: "/_ops".into(),
            routes: Vec::new(),
            upstream_share: share,
            request_observation: false,
        };
        for (share, max, want) in [
            (50, 4, 2),
            (50, 256, 128),
            (50, 3, 1),
            (50, 2, 1),
            (1, 10, 1),
            (99, 10, 9),
            (99, 2, 1),
        ] {
            assert_eq!(
                surface(share).upstream_connections(max),
                want,
                "{share}% of {max}"
            );
        }
    }
}
