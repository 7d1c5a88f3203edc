//! Request observations (`requestObservation` in Epode's telemetry batch schema): what an HTTP
//! request says of its client, from the fixed allowlist Epode's Node adapters use
//! (`automaticRequestObservation`): the client's address as the trusted-proxy rules resolved
//! it, the method, `User-Agent`, `Accept-Language`, the referrer's origin, and the three UA
//! client hints `Sec-CH-UA`, `Sec-CH-UA-Platform`, `Sec-CH-UA-Mobile`. Never cookies,
//! credentials, bodies, a full referrer or a query string. Each text is trimmed, dropped when
//! empty or holding a control character, and cut to its length in code points. Epode takes
//! them on HTTP events only (its service refuses them on `mcp` ones).

use std::net::IpAddr;

use http::{HeaderMap, Method};
use serde_json::{Map, Value};

/// One request's observation; empty fields are left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RequestObservation {
    client_ip: Option<String>,
    method: Option<String>,
    user_agent: Option<String>,
    accept_language: Option<String>,
    referrer_origin: Option<String>,
    sec_ch_ua: Option<String>,
    sec_ch_ua_platform: Option<String>,
    sec_ch_ua_mobile: Option<&'static str>,
}

impl RequestObservation {
    /// What the request of `method` from `client` with `headers` says, by the allowlist.
    pub(crate) fn of(method: &Method, client: IpAddr, headers: &HeaderMap) -> Self {
        let header = |name: &str, max: usize| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| bounded(v, max))
        };
        let method = method.as_str().to_ascii_uppercase();
        RequestObservation {
            client_ip: Some(client.to_string()),
            method: (!method.is_empty()
                && method.len() <= 16
                && method.bytes().all(|b| b.is_ascii_alphabetic()))
            .then_some(method),
            user_agent: header("user-agent", 512),
            accept_language: header("accept-language", 256),
            referrer_origin: header("referer", 2048)
                .or_else(|| header("referrer", 2048))
                .and_then(|r| origin(&r)),
            sec_ch_ua: header("sec-ch-ua", 512),
            sec_ch_ua_platform: header("sec-ch-ua-platform", 80),
            sec_ch_ua_mobile: match header("sec-ch-ua-mobile", 2).as_deref() {
                Some("?0") => Some("?0"),
                Some("?1") => Some("?1"),
                _ => None,
            },
        }
    }

    /// The object the event carries, `None` when nothing was observed.
    pub(crate) fn to_json(&self) -> Option<Value> {
        let mut o = Map::new();
        let mut put = |k: &str, v: Option<&str>| {
            if let Some(v) = v {
                o.insert(k.into(), Value::from(v));
            }
        };
        put("clientIp", self.client_ip.as_deref());
        put("method", self.method.as_deref());
        put("userAgent", self.user_agent.as_deref());
        put("acceptLanguage", self.accept_language.as_deref());
        put("referrerOrigin", self.referrer_origin.as_deref());
        put("secChUa", self.sec_ch_ua.as_deref());
        put("secChUaPlatform", self.sec_ch_ua_platform.as_deref());
        put("secChUaMobile", self.sec_ch_ua_mobile);
        (!o.is_empty()).then_some(Value::Object(o))
    }
}

/// A header's text, trimmed; `None` when empty or holding a control character; cut to `max`
/// code points.
fn bounded(v: &str, max: usize) -> Option<String> {
    let t = v.trim();
    if t.is_empty() || t.chars().any(|c| (c as u32) < 32 || c as u32 == 127) {
        return None;
    }
    Some(t.chars().take(max).collect())
}

/// An http(s) referrer's origin (no path, query, fragment or credentials).
fn origin(referrer: &str) -> Option<String> {
    let u = url::Url::parse(referrer).ok()?;
    if !matches!(u.scheme(), "http" | "https") || u.host().is_none() {
        return None;
    }
    let o = u.origin().ascii_serialization();
    let host = o.split_once("://")?.1;
    (o.len() <= 300 && !host.is_empty() && !host.contains(['/', '?', '#', '@'])).then_some(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_allowlist_leaves_bounded_and_the_referrer_as_its_origin() {
        let mut h = HeaderMap::new();
        h.insert(
            "user-agent",
            format!(" {} ", "u".repeat(600)).parse().unwrap(),
        );
        h.insert("accept-language", "fr-CH, fr;q=0.9".parse().unwrap());
        h.insert(
            "referer",
            "https://user:pw@shop.example:8443/cart?id=42#x"
                .parse()
                .unwrap(),
        );
        h.insert("sec-ch-ua", r#""Chromium";v="140""#.parse().unwrap());
        h.insert("sec-ch-ua-platform", r#""Linux""#.parse().unwrap());
        h.insert("sec-ch-ua-mobile", "?0".parse().unwrap());
        h.insert("cookie", "session=secret".parse().unwrap());
        h.insert("authorization", "Bearer secret".parse().unwrap());
        let o = RequestObservation::of(&Method::GET, "203.0.113.9".parse().unwrap(), &h);
        let v = o.to_json().unwrap();
        assert_eq!(v["clientIp"], "203.0.113.9");
        assert_eq!(v["method"], "GET");
        assert_eq!(v["userAgent"].as_str().unwrap().chars().count(), 512);
        assert_eq!(v["referrerOrigin"], "https://shop.example:8443");
        assert_eq!(v["secChUaMobile"], "?0");
        let text = v.to_string();
        assert!(!text.contains("secret") && !text.contains("cart") && !text.contains("id=42"));
        assert_eq!(v.as_object().unwrap().len(), 8);
        // A control character, a mobile hint out of its two values, a non-http referrer.
        let mut h = HeaderMap::new();
        h.insert(
            "user-agent",
            http::HeaderValue::from_bytes(b"a\tb").unwrap(),
        );
        h.insert("sec-ch-ua-mobile", "?2".parse().unwrap());
        h.insert("referer", "android-app://x".parse().unwrap());
        let v = RequestObservation::of(&Method::POST, "::1".parse().unwrap(), &h)
            .to_json()
            .unwrap();
        assert_eq!(v.as_object().unwrap().len(), 2, "{v}");
        assert_eq!(v["clientIp"], "::1");
    }
}
