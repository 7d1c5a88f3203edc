//! The checks on the request head and body before anything is parsed: Host (DNS-rebinding
//! protection), Origin, `Content-Type`, and the body size.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, request::Parts, HeaderMap};
use hyper::body::Incoming;
use url::Url;

use crate::budget::{self, Collect, MemoryBudget, Reservation};

use crate::config::{HostPolicy, OriginPolicy};
use crate::error::{Error, Kind};

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

/// Refuses a Host the policy does not allow. HTTP/2 requests carry it as `:authority`.
pub(crate) fn check_host(policy: &HostPolicy, parts: &Parts) -> Result<(), Error> {
    if *policy == HostPolicy::Any {
        return Ok(());
    }
    let host = match parts.headers.get(header::HOST) {
        Some(v) => v.to_str().ok().map(str::to_owned),
        None => parts.uri.authority().map(|a| a.as_str().to_owned()),
    };
    let Some(host) = host else {
        return Err(Error::new(Kind::BadHost, "(missing)".to_owned()));
    };
    let lower = host.trim().to_ascii_lowercase();
    let (name, _) = split_host_port(&lower);
    let ok = match policy {
        HostPolicy::Any => true,
        HostPolicy::Loopback => LOOPBACK_NAMES.contains(&name),
        HostPolicy::List(list) => list.iter().any(|entry| {
            let (entry_name, entry_port) = split_host_port(entry);
            match entry_port {
                None => entry_name == name,
                Some(_) => *entry == lower,
            }
        }),
    };
    if ok {
        Ok(())
    } else {
        Err(Error::new(Kind::BadHost, truncate(&host)))
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
            Kind::BadOrigin,
            "more than one Origin header".to_owned(),
        ));
    }
    let origin = value
        .to_str()
        .map_err(|_| Error::new(Kind::BadOrigin, "(not ASCII)".to_owned()))?;
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
        Err(Error::new(Kind::BadOrigin, truncate(origin)))
    }
}

/// Refuses a POST whose one `Content-Type` is not `application/json` (parameters such as
/// `charset` allowed), as Streamable HTTP requires.
pub(crate) fn check_content_type(headers: &HeaderMap) -> Result<(), Error> {
    let mut values = headers.get_all(header::CONTENT_TYPE).iter();
    let refused = |what: String| {
        Error::new(
            Kind::UnsupportedMediaType,
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

fn truncate(s: &str) -> String {
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
            return Err(Error::new(Kind::BodyTooLarge { limit }, ""));
        }
    }
    match budget::collect(body, limit, budget, within).await {
        Ok(read) => Ok(read),
        Err(Collect::TooLarge) => Err(Error::new(Kind::BodyTooLarge { limit }, "")),
        Err(Collect::OverBudget) => Err(Error::new(
            Kind::Overloaded { retry_after: 1 },
            "its memory budget for request bodies and answers is spent",
        )),
        Err(Collect::TimedOut) => Err(Error::new(
            Kind::RequestTimeout,
            format!(
                "the request body did not arrive within {}",
                humantime::format_duration(within)
            ),
        )),
        Err(Collect::Failed(e)) => Err(Error::new(Kind::BodyRead, e)),
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
