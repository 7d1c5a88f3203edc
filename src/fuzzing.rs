//! Entry points for the coverage-guided fuzz targets under `fuzz/` (and the property tests):
//! the three places hostile bytes enter the sidecar. Each must return for any input, without
//! panicking, in time and memory linear in the input.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::frontdoor;
use crate::mcp::{headers, sse};

/// The front door on a message: the body parsed, its era classified and the ladder run
/// against headers taken from the first bytes of `data` (`name: value` lines up to a blank
/// line; the rest is the body).
pub fn frontdoor(data: &[u8]) {
    let (head, body) = match data.windows(2).position(|w| w == b"\n\n") {
        Some(i) => (&data[..i], &data[i + 2..]),
        None => (&[][..], data),
    };
    let mut map = HeaderMap::new();
    for line in head.split(|b| *b == b'\n') {
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(line[colon + 1..].trim_ascii()),
        ) {
            map.append(name, value);
        }
    }
    let mut parts = http::Request::new(()).into_parts().0;
    parts.method = http::Method::POST;
    parts.headers = map;
    let bytes = Bytes::copy_from_slice(body);
    let _ = frontdoor::admit(&parts, &bytes);
}

/// The routing-header decoder, on a header value made of `data`.
pub fn header(data: &[u8]) {
    if let Ok(value) = HeaderValue::from_bytes(data) {
        if let Some(decoded) = headers::decode(&value) {
            // What decodes encodes back to something that decodes to the same text.
            let again = headers::encode(&decoded)
                .and_then(|v| headers::decode(&v).map(std::borrow::Cow::into_owned));
            assert_eq!(again.as_deref(), Some(&*decoded));
        }
    }
}

/// The SSE splitter, on `data` cut into chunks at the offsets its first byte picks.
pub fn sse(data: &[u8]) {
    let Some((&step, rest)) = data.split_first() else {
        return;
    };
    let step = usize::from(step).max(1);
    let mut splitter = sse::EventSplitter::default();
    let mut events = std::collections::VecDeque::new();
    for chunk in rest.chunks(step) {
        splitter.push(chunk, &mut events);
        assert!(splitter.held() <= rest.len());
    }
    let tail = splitter.finish();
    // Nothing is lost or invented: the events and the tail are the input, in order.
    let total: usize = events.iter().map(Bytes::len).sum::<usize>() + tail.map_or(0, |t| t.len());
    assert_eq!(total, rest.len());
    for event in &events {
        let _ = sse::event_data(event);
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use proptest::prelude::*;

    use super::*;

    /// Inputs near the shapes the parsers expect, and plain noise.
    fn message() -> impl Strategy<Value = Vec<u8>> {
        let json_ish = proptest::string::string_regex(
            r#"(mcp-protocol-version: (2026-07-28|2025-11-25|x)\n|mcp-method: [a-z/]{0,12}\n|mcp-name: [=?a-z0-9]{0,12}\n){0,4}\n\{"jsonrpc":"2.0","id":(1|"a"|null|\[\]),"method":"(tools/call|tools/list|initialize|x)"(,"params":\{("name":"[a-z]{0,3}",?|"_meta":\{("io.modelcontextprotocol/protocolVersion":"2026-07-28",?|"io.modelcontextprotocol/clientCapabilities":\{\},?){0,3}\},?|"arguments":[\[\{]?,?){0,4}\})?\}"#,
        )
        .unwrap()
        .prop_map(String::into_bytes);
        prop_oneof![json_ish, proptest::collection::vec(any::<u8>(), 0..512)]
    }

    fn sse_stream() -> impl Strategy<Value = Vec<u8>> {
        let text = proptest::string::string_regex(
            r"((event|data|id|retry|:)(: ?[a-z{}\x22:,]{0,8})?(\r\n|\n|\r)){0,12}",
        )
        .unwrap()
        .prop_map(String::into_bytes);
        (
            any::<u8>(),
            prop_oneof![text, proptest::collection::vec(any::<u8>(), 0..512)],
        )
            .prop_map(|(step, mut body)| {
                body.insert(0, step);
                body
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn the_front_door_takes_any_message(data in message()) {
            let started = Instant::now();
            frontdoor(&data);
            prop_assert!(started.elapsed() < Duration::from_secs(1));
        }

        #[test]
        fn the_header_decoder_takes_any_value(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            header(&data);
        }

        #[test]
        fn base64_header_values_round_trip(text in "\\PC{0,40}") {
            if let Some(v) = headers::encode(&text) {
                prop_assert_eq!(headers::decode(&v).map(std::borrow::Cow::into_owned), Some(text));
            }
        }

        #[test]
        fn the_sse_splitter_takes_any_stream_in_any_chunks(data in sse_stream()) {
            let started = Instant::now();
            sse(&data);
            prop_assert!(started.elapsed() < Duration::from_secs(1));
        }
    }

    /// Chunking never changes the events: pushing byte by byte gives what one push gives.
    #[test]
    fn chunking_is_invisible() {
        let body = b"event: message\r\ndata: {\"a\":1}\r\n\r\n: keep\n\ndata: x\rdata: y\r\r";
        let whole = {
            let mut s = sse::EventSplitter::default();
            let mut out = std::collections::VecDeque::new();
            s.push(body, &mut out);
            out
        };
        let mut s = sse::EventSplitter::default();
        let mut out = std::collections::VecDeque::new();
        for b in body {
            s.push(&[*b], &mut out);
        }
        assert_eq!(out, whole);
    }
}
