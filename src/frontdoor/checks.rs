//! The checks on the request head and body before anything is parsed: the request's authority
//! (one well-formed `Host`, on every route), Host (DNS-rebinding protection), Origin,
//! `Content-Type`, and the body size.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, request::Parts, HeaderMap, Uri, Version};
use hyper::body::Incoming;
use url::Url;

use crate::budget::{self, Collect, MemoryBudget, Reservation};

use crate::config::{HostPolicy, OriginPolicy};
use crate::error::{Error, ErrorKind};

const LOOPBACK_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// Splits `name[:port]` (with `[v6]` literals) into the name and the optional port.
fn split_host_port(authority: &str) -> (&str, Option<&str>) {
    if let Some(rest) = authority.strip_prefix('[') {
        if let Some(end) = rest.find(']') {
            let name = &authority[..end + 2];
            let port = authority[end + 2..].strip_prefix(':');
            return (name, port);
        }
        return (authority, None);
    }
    match authority.rsplit_once(':') {
        Some((name, port)) => (name, Some(port)),
        None => (authority, None),
    }
}

/// Refuses (400) a request whose authority is not the one RFC 9112 §3.2 and RFC 9113 §8.3.1
/// ask for: more than one `Host`; a `Host` or target authority that is not `host[:port]`
/// (userinfo such as `127.0.0.1:80@evil.com`, a port past 65535); a target authority
/// (absolute form, HTTP/2's `:authority`) that names another host than `Host`; no authority
/// at all in an HTTP/1.1 or HTTP/2 request. One scan of a short header, no allocation.
pub(crate) fn check_authority(
    headers: &HeaderMap,
    uri: &Uri,
    version: Version,
) -> Result<(), Error> {
    let bad = |what: &str| {
        Error::new(
            ErrorKind::InvalidRequest,
            format!("{what}; send exactly one Host header naming the server as host[:port]"),
        )
    };
    let mut hosts = headers.get_all(header::HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err(bad("the request has more than one Host header"));
    }
    let host = match host.map(|h| h.to_str()) {
        None => None,
        Some(Ok(h)) if authority_syntax(h) => Some(h),
        Some(_) => {
            let shown = String::from_utf8_lossy(host.map_or(&[][..], |h| h.as_bytes()));
            return Err(bad(&format!(
                "its Host header {:?} is not host[:port]",
                truncate(&shown)
            )));
        }
    };
    let target = uri.authority().map(|a| a.as_str());
    if let Some(t) = target {
        if !authority_syntax(t) {
            return Err(bad(&format!(
                "its target's authority {:?} is not host[:port]",
                truncate(t)
            )));
        }
    }
    match (host, target) {
        (Some(h), Some(t)) if !same_authority(h, t, uri.scheme_str()) => Err(bad(&format!(
            "its Host header {:?} names another server than its target {:?}",
            truncate(h),
            truncate(t)
        ))),
        (None, None) if version == Version::HTTP_11 || version == Version::HTTP_2 => {
            Err(bad("the request has no Host header"))
        }
        (None, Some(_)) if version == Version::HTTP_11 => {
            Err(bad("the request has no Host header"))
        }
        _ => Ok(()),
    }
}

/// `host[:port]` as RFC 3986 §3.2.2 and §3.2.3 write it: an IP literal in brackets or a
/// reg-name (unreserved, `%XX`, sub-delims but `,`, how two `Host` lines fold into one),
/// and a port of at most 65535. No userinfo.
fn authority_syntax(authority: &str) -> bool {
    let (name, port) = match authority.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((inner, after)) if !inner.is_empty() && inner.bytes().all(literal_byte) => {
                match after.strip_prefix(':') {
                    Some(port) => ("", Some(port)),
                    None if after.is_empty() => ("", None),
                    None => return false,
                }
            }
            _ => return false,
        },
        None => match authority.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (authority, None),
        },
    };
    let port_ok = port.is_none_or(|p| {
        p.len() <= 5
            && p.bytes().all(|b| b.is_ascii_digit())
            && p.parse::<u32>().map_or(p.is_empty(), |n| n <= 65535)
    });
    port_ok && reg_name(name.as_bytes())
}

/// An IP literal's byte (IPv6, or RFC 3986's IPvFuture).
fn literal_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b":.-_~!$&'()*+;=".contains(&b)
}

/// RFC 3986's reg-name, less the `,` (how two `Host` lines fold into one).
fn reg_name(name: &[u8]) -> bool {
    let mut i = 0;
    while i < name.len() {
        let ok = if name[i] == b'%' {
            i += 2;
            name.get(i - 1..=i)
                .is_some_and(|p| p.iter().all(u8::is_ascii_hexdigit))
        } else {
            name[i].is_ascii_alphanumeric() || b"-._~!$&'()*+;=".contains(&name[i])
        };
        if !ok {
            return false;
        }
        i += 1;
    }
    true
}

/// Whether two well-formed authorities name one server: the same name (ASCII case aside)
/// and the same port, an absent one being the scheme's default.
fn same_authority(a: &str, b: &str, scheme: Option<&str>) -> bool {
    let default = match scheme {
        Some(s) if s.eq_ignore_ascii_case("http") => Some(80),
        Some(s) if s.eq_ignore_ascii_case("https") => Some(443),
        _ => None,
    };
    let (a_name, a_port) = split_host_port(a);
    let (b_name, b_port) = split_host_port(b);
    let port = |p: Option<&str>| p.and_then(|p| p.parse::<u16>().ok()).or(default);
    a_name.eq_ignore_ascii_case(b_name) && port(a_port) == port(b_port)
}

/// Refuses a Host the policy does not allow. HTTP/2 requests carry it as `:authority`.
pub(crate) fn check_host(policy: &HostPolicy, parts: &Parts) -> Result<(), Error> {
    if *policy == HostPolicy::Any {
        return Ok(());
    }
    // Read in place, compared without regard to ASCII case: nothing is copied for a request
    // that passes.
    let host = match parts.headers.get(header::HOST) {
        Some(v) => v.to_str().ok(),
        None => parts.uri.authority().map(http::uri::Authority::as_str),
    };
    let Some(host) = host else {
        return Err(Error::new(ErrorKind::BadHost, "(missing)".to_owned()));
    };
    let trimmed = host.trim();
    let (name, _) = split_host_port(trimmed);
    let ok = match policy {
        HostPolicy::Any => true,
        HostPolicy::Loopback => LOOPBACK_NAMES.iter().any(|n| n.eq_ignore_ascii_case(name)),
        HostPolicy::List(list) => list.iter().any(|entry| {
            let (entry_name, entry_port) = split_host_port(entry);
            match entry_port {
                None => entry_name.eq_ignore_ascii_case(name),
                Some(_) => entry.eq_ignore_ascii_case(trimmed),
            }
        }),
    };
    if ok {
        Ok(())
    } else {
        Err(Error::new(ErrorKind::BadHost, truncate(host)))
    }
}

/// Refuses a present Origin the policy does not allow; a request without Origin passes.
pub(crate) fn check_origin(policy: &OriginPolicy, headers: &HeaderMap) -> Result<(), Error> {
    let mut values = headers.get_all(header::ORIGIN).iter();
    let Some(value) = values.next() else {
        return Ok(());
    };
    if values.next().is_some() {
        return Err(Error::new(
            ErrorKind::BadOrigin,
            "more than one Origin header".to_owned(),
        ));
    }
    let origin = value
        .to_str()
        .map_err(|_| Error::new(ErrorKind::BadOrigin, "(not ASCII)".to_owned()))?;
    let ok = match policy {
        OriginPolicy::Any => true,
        OriginPolicy::RefuseAll => false,
        OriginPolicy::Exact(list) => list.iter().any(|o| o.eq_ignore_ascii_case(origin)),
        OriginPolicy::Loopback => Url::parse(origin).is_ok_and(|u| {
            matches!(u.scheme(), "http" | "https")
                && u.host_str()
                    .is_some_and(|h| LOOPBACK_NAMES.contains(&h.to_ascii_lowercase().as_str()))
        }),
    };
    if ok {
        Ok(())
    } else {
        Err(Error::new(ErrorKind::BadOrigin, truncate(origin)))
    }
}

/// Refuses a POST whose one `Content-Type` is not `application/json` (parameters such as
/// `charset` allowed), as Streamable HTTP requires.
pub(crate) fn check_content_type(headers: &HeaderMap) -> Result<(), Error> {
    let mut values = headers.get_all(header::CONTENT_TYPE).iter();
    let refused = |what: String| {
        Error::new(
            ErrorKind::UnsupportedMediaType,
            format!("Content-Type must be application/json; {what}"),
        )
    };
    let Some(value) = values.next() else {
        return Err(refused("this request has none".to_owned()));
    };
    if values.next().is_some() {
        return Err(refused("this request has more than one".to_owned()));
    }
    let text = String::from_utf8_lossy(value.as_bytes());
    let essence = text.split(';').next().unwrap_or_default().trim();
    if essence.eq_ignore_ascii_case("application/json") {
        Ok(())
    } else {
        Err(refused(format!("this request's is {}", truncate(&text))))
    }
}

/// A client's value as a message shows it: at most 200 bytes (a message may be logged, and a
/// client's string reaches no log uncut).
pub(super) fn truncate(s: &str) -> String {
    const MAX: usize = 200;
    if s.len() <= MAX {
        return s.to_owned();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Reads the whole body within `within`, refusing more than `limit` bytes (early, from
/// Content-Length, when it is declared), each byte counted in the memory budget.
pub(crate) async fn read_body(
    parts: &Parts,
    body: Incoming,
    limit: usize,
    budget: &Arc<MemoryBudget>,
    within: Duration,
) -> Result<(Bytes, Reservation), Error> {
    if let Some(len) = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        if len > limit as u64 {
            return Err(Error::new(ErrorKind::BodyTooLarge { limit }, ""));
        }
    }
    match budget::collect(body, limit, budget, within).await {
        Ok(read) => Ok(read),
        Err(Collect::TooLarge) => Err(Error::new(ErrorKind::BodyTooLarge { limit }, "")),
        Err(Collect::OverBudget) => Err(Error::new(
            ErrorKind::Overloaded { retry_after: 1 },
            "its memory budget for request bodies and answers is spent",
        )),
        Err(Collect::TimedOut) => Err(Error::new(
            ErrorKind::RequestTimeout,
            format!(
                "the request body did not arrive within {}",
                humantime::format_duration(within)
            ),
        )),
        Err(Collect::Failed(e)) => Err(Error::new(ErrorKind::BodyRead, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn parts(host: Option<&str>, origin: Option<&str>) -> Parts {
        let mut b = Request::builder().uri("/mcp");
        if let Some(h) = host {
            b = b.header(header::HOST, h);
        }
        if let Some(o) = origin {
            b = b.header(header::ORIGIN, o);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn loopback_hosts() {
        for ok in [
            "localhost",
            "localhost:8080",
            "127.0.0.1:1",
            "[::1]:9",
            "LOCALHOST:1",
        ] {
            check_host(&HostPolicy::Loopback, &parts(Some(ok), None)).unwrap();
        }
        for bad in [
            "evil.example.com",
            "evil.example.com:8080",
            "127.0.0.2:80",
            "localhost.evil:1",
        ] {
            assert!(
                check_host(&HostPolicy::Loopback, &parts(Some(bad), None)).is_err(),
                "{bad}"
            );
        }
        assert!(check_host(&HostPolicy::Loopback, &parts(None, None)).is_err());
        check_host(&HostPolicy::Any, &parts(Some("anything"), None)).unwrap();
    }

    #[test]
    fn the_authority_is_one_well_formed_host() {
        let check = |version: Version, uri: &str, hosts: &[&str]| {
            let mut b = Request::builder().version(version).uri(uri);
            for h in hosts {
                b = b.header(header::HOST, *h);
            }
            let p = b.body(()).unwrap().into_parts().0;
            check_authority(&p.headers, &p.uri, p.version)
        };
        let h11 = Version::HTTP_11;
        let h2 = Version::HTTP_2;
        for (version, uri, hosts) in [
            (h11, "/mcp", &["127.0.0.1:8080"][..]),
            (h11, "/mcp", &["localhost"]),
            (h11, "/mcp", &["[::1]:9"]),
            (h11, "/mcp", &["Example.COM:65535"]),
            (h11, "/mcp", &["host:"]),
            (h11, "/mcp", &["xn--bcher-kva.example"]),
            (h11, "/mcp", &["a%2Db.example"]),
            (h11, "http://127.0.0.1/mcp", &["127.0.0.1:80"]),
            (h11, "http://LOCALHOST:8080/mcp", &["localhost:8080"]),
            (Version::HTTP_10, "/mcp", &[]),
            (h2, "http://127.0.0.1:8080/mcp", &[]),
            (h2, "https://a.example/mcp", &["a.example:443"]),
            (h2, "/mcp", &["a.example"]),
        ] {
            check(version, uri, hosts).unwrap_or_else(|e| panic!("{uri} {hosts:?}: {e}"));
        }
        for (version, uri, hosts) in [
            (h11, "/mcp", &["127.0.0.1", "evil.example"][..]),
            (h11, "/mcp", &["127.0.0.1", "127.0.0.1"]),
            (h11, "/mcp", &["127.0.0.1:80@evil.example"]),
            (h11, "/mcp", &["user@127.0.0.1"]),
            (h11, "/mcp", &["127.0.0.1:99999"]),
            (h11, "/mcp", &["127.0.0.1:123456"]),
            (h11, "/mcp", &["127.0.0.1:8o"]),
            (h11, "/mcp", &["127.0.0.1:80:80"]),
            (h11, "/mcp", &["a.example, b.example"]),
            (h11, "/mcp", &["a example"]),
            (h11, "/mcp", &["[::1"]),
            (h11, "/mcp", &["[::1]x"]),
            (h11, "/mcp", &["[]"]),
            (h11, "/mcp", &["::1"]),
            (h11, "/mcp", &["a%zz"]),
            (h11, "/mcp", &[]),
            (h11, "http://127.0.0.1/mcp", &[]),
            (h11, "http://evil.example/mcp", &["127.0.0.1"]),
            (h11, "http://127.0.0.1:81/mcp", &["127.0.0.1"]),
            (h2, "http://evil.example/mcp", &["127.0.0.1"]),
            (h2, "http://127.0.0.1:99999/mcp", &[]),
            (h2, "/mcp", &[]),
        ] {
            let e = check(version, uri, hosts).expect_err(&format!("{uri} {hosts:?}"));
            assert_eq!(e.status(), 400, "{uri} {hosts:?}");
            assert!(e.to_string().contains("Host"), "{e}");
        }
    }

    #[test]
    fn listed_hosts() {
        let p = HostPolicy::List(vec!["mcp.example.com".into(), "other:8443".into()]);
        check_host(&p, &parts(Some("mcp.example.com:1234"), None)).unwrap();
        check_host(&p, &parts(Some("other:8443"), None)).unwrap();
        assert!(check_host(&p, &parts(Some("other:8444"), None)).is_err());
        assert!(check_host(&p, &parts(Some("evil"), None)).is_err());
    }

    #[test]
    fn content_types() {
        let h = |values: &[&str]| {
            let mut b = Request::builder().uri("/mcp");
            for v in values {
                b = b.header(header::CONTENT_TYPE, *v);
            }
            b.body(()).unwrap().into_parts().0.headers
        };
        for ok in [
            "application/json",
            "Application/JSON",
            "application/json; charset=utf-8",
            " application/json ;charset=UTF-8",
        ] {
            check_content_type(&h(&[ok])).unwrap();
        }
        for bad in [
            &[][..],
            &["text/plain"],
            &["text/plain;charset=UTF-8"],
            &["application/x-www-form-urlencoded"],
            &["multipart/form-data; boundary=x"],
            &["application/jsonx"],
            &["application/json", "application/json"],
        ] {
            let e = check_content_type(&h(bad)).unwrap_err();
            assert_eq!(e.status(), 415, "{bad:?}");
        }
    }

    #[test]
    fn origins() {
        let h = |o: &str| parts(None, Some(o)).headers;
        check_origin(&OriginPolicy::Loopback, &parts(None, None).headers).unwrap();
        check_origin(&OriginPolicy::Loopback, &h("http://localhost:3000")).unwrap();
        check_origin(&OriginPolicy::Loopback, &h("http://[::1]:3000")).unwrap();
        check_origin(&OriginPolicy::Loopback, &h("http://127.0.0.1")).unwrap();
        for bad in [
            "http://evil.example",
            "null",
            "http://localhost.evil.example",
            "file://x",
        ] {
            assert!(
                check_origin(&OriginPolicy::Loopback, &h(bad)).is_err(),
                "{bad}"
            );
        }
        assert!(check_origin(&OriginPolicy::RefuseAll, &h("http://localhost")).is_err());
        check_origin(&OriginPolicy::RefuseAll, &parts(None, None).headers).unwrap();
        let exact = OriginPolicy::Exact(vec!["https://app.example.com".into()]);
        check_origin(&exact, &h("https://app.example.com")).unwrap();
        assert!(check_origin(&exact, &h("https://app.example.com:444")).is_err());
    }
}
