//! Where the HTTP envelope goes (spec §2): spliced as the last member of a JSON object, embedded
//! as a `<script id="agent-feedback">` tag at an HTML page's real document boundary, or carried
//! in the `Agent-Feedback` header with the discovery `Link`. Every function works on the
//! product's bytes as they are (not necessarily UTF-8) and keeps them byte for byte.

use std::fmt;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::de::{self, Deserializer as _, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;

/// What a body under a JSON content type is, for placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JsonBody {
    /// A JSON object without an own `_agentFeedback` member: the envelope is spliced in.
    Object,
    /// A JSON object that already has `_agentFeedback` (its key possibly written with escapes).
    OwnsFeedback,
    /// An array, scalar, null, or not JSON at all.
    Other,
}

const FEEDBACK_KEY: &str = "_agentFeedback";

/// JSON's insignificant whitespace (RFC 8259 §2).
fn json_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

/// A member name, decoded (so `"_agent\u0046eedback"` counts), kept only as "is it ours".
struct IsFeedbackKey(bool);

impl<'de> Deserialize<'de> for IsFeedbackKey {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = IsFeedbackKey;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_str<E: de::Error>(self, key: &str) -> Result<IsFeedbackKey, E> {
                Ok(IsFeedbackKey(key == FEEDBACK_KEY))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// Walks an object's members without keeping any value.
struct ObjectVisitor;

impl<'de> Visitor<'de> for ObjectVisitor {
    type Value = JsonBody;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<JsonBody, A::Error> {
        let mut owns = false;
        while let Some(IsFeedbackKey(ours)) = map.next_key()? {
            map.next_value::<IgnoredAny>()?;
            owns |= ours;
        }
        Ok(if owns {
            JsonBody::OwnsFeedback
        } else {
            JsonBody::Object
        })
    }
}

/// Classifies a body under a JSON content type. Only a body that starts with `{` is parsed:
/// anything else is `Other` whether it is valid JSON or not, and parsing an object (rather than
/// any value) keeps serde_json's arbitrary-precision numbers, which arrive as maps, out of it.
/// Member values are skipped without being built (serde_json skips them without recursing).
pub(crate) fn json_body(body: &[u8]) -> JsonBody {
    if body.iter().find(|&&byte| !json_space(byte)) != Some(&b'{') {
        return JsonBody::Other;
    }
    // JSON text is UTF-8 (RFC 8259 §8.1), and serde_json does not check the strings it skips.
    if std::str::from_utf8(body).is_err() {
        return JsonBody::Other;
    }
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    match (&mut deserializer).deserialize_map(ObjectVisitor) {
        Ok(kind) if deserializer.end().is_ok() => kind,
        _ => JsonBody::Other,
    }
}

/// `body` with `,"_agentFeedback":<envelope>` spliced before the object's closing brace
/// (`{}` gets no comma); every byte before it untouched. None unless `json_body` is Object.
/// `envelope` is compact JSON the caller serialised; it is inserted as it is.
pub(crate) fn splice_json(body: &[u8], envelope: &str) -> Option<Vec<u8>> {
    if json_body(body) != JsonBody::Object {
        return None;
    }
    // A valid object ends with `}` and optional whitespace; the byte before that brace (past
    // whitespace) is `{` only for an empty object, since no member value ends with `{`.
    let close = body.iter().rposition(|&byte| !json_space(byte))?;
    let before = body[..close].iter().rposition(|&byte| !json_space(byte))?;
    let comma = if body[before] == b'{' { "" } else { "," };
    let mut out = Vec::with_capacity(body.len() + envelope.len() + FEEDBACK_KEY.len() + 4);
    out.extend_from_slice(&body[..close]);
    out.extend_from_slice(comma.as_bytes());
    out.extend_from_slice(b"\"_agentFeedback\":");
    out.extend_from_slice(envelope.as_bytes());
    out.extend_from_slice(&body[close..]);
    Some(out)
}

/// `\s` as the SDK's regular expressions see it, on ASCII (a non-ASCII space never matters
/// inside a tag's markup here).
fn space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

fn word(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_'
}

fn starts_with_ignore_case(bytes: &[u8], at: usize, prefix: &[u8]) -> bool {
    bytes
        .get(at..at + prefix.len())
        .is_some_and(|slice| slice.eq_ignore_ascii_case(prefix))
}

/// Whether the page already has `<script … id="agent-feedback" …>` (spec §2.2 regex).
///
/// The SDK's pattern, `<script\b[^>]*\s+id\s*=\s*(?:"agent-feedback"|'agent-feedback'|
/// agent-feedback)(?=\s|\/?>)` case-insensitive, matched by hand: an `id` attribute can only
/// sit between a `<script` and the next `>`, so each such span is searched once and the scan
/// resumes after it (a `<script` inside the span has a smaller span: nothing new to find).
pub(crate) fn has_html_marker(html: &[u8]) -> bool {
    let mut at = 0;
    while let Some(offset) = find_ignore_case(&html[at..], b"<script") {
        let start = at + offset + b"<script".len();
        let end = html[start..]
            .iter()
            .position(|&byte| byte == b'>')
            .map_or(html.len(), |offset| start + offset);
        let bounded = html.get(start).is_none_or(|&byte| !word(byte));
        if bounded && span_has_marker_id(html, start, end) {
            return true;
        }
        at = end;
    }
    false
}

/// In `html[start..end]` (a script tag's attributes, `end` at its `>` or the end): whitespace,
/// `id`, `=`, the value `agent-feedback` (quoted or not), then whitespace, `>` or `/>`.
fn span_has_marker_id(html: &[u8], start: usize, end: usize) -> bool {
    let skip_space = |mut at: usize| {
        while at < end && space(html[at]) {
            at += 1;
        }
        at
    };
    (start + 1..end).any(|at| {
        if !space(html[at - 1]) || !starts_with_ignore_case(&html[..end], at, b"id") {
            return false;
        }
        let equals = skip_space(at + 2);
        if equals >= end || html[equals] != b'=' {
            return false;
        }
        let value = skip_space(equals + 1);
        [
            &b"\"agent-feedback\""[..],
            b"'agent-feedback'",
            b"agent-feedback",
        ]
        .iter()
        .any(|form| {
            let after = value + form.len();
            after <= end && starts_with_ignore_case(html, value, form) && marker_ends(html, after)
        })
    })
}

/// The regex's lookahead `(?=\s|\/?>)` at `at`.
fn marker_ends(html: &[u8], at: usize) -> bool {
    match html.get(at) {
        Some(&byte) if space(byte) || byte == b'>' => true,
        Some(b'/') => html.get(at + 1) == Some(&b'>'),
        _ => false,
    }
}

/// Case-insensitive (ASCII) search for a short needle; linear for a fixed needle.
fn find_ignore_case(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || haystack.len() < needle.len() {
        return None;
    }
    (0..=haystack.len() - needle.len())
        .find(|&at| haystack[at..at + needle.len()].eq_ignore_ascii_case(needle))
}

/// HTML's whitespace as its tokenizer sees it (a CR is a newline once the input is preprocessed).
fn html_space(byte: u8) -> bool {
    matches!(byte, b'\t' | b'\n' | 0x0c | b'\r' | b' ')
}

/// Where `needle` (exact bytes) first starts in `html` at or after `from`.
fn find_from(html: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    html.get(from..)?
        .windows(needle.len())
        .position(|window| window == needle)
        .map(|offset| from + offset)
}

/// Past the first `>` at or after `from` (a bogus comment, `<!doctype …>` or `<?…>` ends there
/// whatever quotes it holds).
fn past_gt(html: &[u8], from: usize) -> Option<usize> {
    find_from(html, from, b">").map(|at| at + 1)
}

/// Past the first `-->` or `--!>` at or after `from`: how a comment ends.
fn comment_end(html: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    while let Some(dash) = find_from(html, at, b"--") {
        match html.get(dash + 2) {
            Some(b'>') => return Some(dash + 3),
            Some(b'!') if html.get(dash + 3) == Some(&b'>') => return Some(dash + 4),
            _ => at = dash + 1,
        }
    }
    None
}

/// One piece of markup found by the boundary scan: where it ends, its tag name as written (empty
/// for a comment, doctype, CDATA section, bogus comment or a `<` that is text), and whether it
/// is an end tag.
struct Tag<'a> {
    end: usize,
    name: &'a [u8],
    closing: bool,
}

impl Tag<'_> {
    fn is(&self, name: &[u8]) -> bool {
        self.name.eq_ignore_ascii_case(name)
    }

    fn nameless(end: usize) -> Self {
        Tag {
            end,
            name: b"",
            closing: false,
        }
    }
}

/// Where a start or end tag's attributes are, as the tokenizer's attribute states see it: a
/// quote opens a value only right after `=`, and only a `>` outside a quoted value ends the tag.
#[derive(Clone, Copy)]
enum Attr {
    BeforeName,
    /// In a name or after one (both go on to a value at `=`).
    InName,
    BeforeValue,
    Quoted(u8),
    Unquoted,
}

/// The markup starting at `html[start] == b'<'`, read as the HTML tokenizer reads it from the
/// data state; None when it is unterminated. A `<` that starts no markup is text, one byte long.
fn scan_tag(html: &[u8], start: usize) -> Option<Tag<'_>> {
    let rest = &html[start..];
    if rest.starts_with(b"<!--") {
        // `<!-->` and `<!--->` are whole (empty) comments.
        if rest.starts_with(b"<!-->") {
            return Some(Tag::nameless(start + 5));
        }
        if rest.starts_with(b"<!--->") {
            return Some(Tag::nameless(start + 6));
        }
        return comment_end(html, start + 4).map(Tag::nameless);
    }
    if rest.starts_with(b"<![CDATA[") {
        // A CDATA section in SVG or MathML ends at `]]>`; elsewhere it is a bogus comment that
        // ends at the first `>`. Taking `]]>` everywhere never puts the tag inside the section,
        // at worst later than needed (this scan does not track foreign content).
        return find_from(html, start + 9, b"]]>").map(|at| Tag::nameless(at + 3));
    }
    let closing = rest.get(1) == Some(&b'/');
    let name_start = start + 1 + usize::from(closing);
    match html.get(name_start) {
        Some(byte) if byte.is_ascii_alphabetic() => {}
        Some(b'!' | b'?') if !closing => return past_gt(html, name_start).map(Tag::nameless),
        Some(b'>') if closing => return Some(Tag::nameless(name_start + 1)),
        Some(_) if closing => return past_gt(html, name_start).map(Tag::nameless),
        // A page that ends in `</` would make the tag appended after it a bogus comment.
        None if closing => return None,
        _ => return Some(Tag::nameless(start + 1)),
    }
    let mut at = name_start;
    while html
        .get(at)
        .is_some_and(|&byte| !html_space(byte) && byte != b'/' && byte != b'>')
    {
        at += 1;
    }
    let name = &html[name_start..at];
    let mut state = Attr::BeforeName;
    while let Some(&byte) = html.get(at) {
        state = match state {
            Attr::Quoted(quote) if byte == quote => Attr::BeforeName,
            Attr::Quoted(_) => state,
            _ if byte == b'>' => {
                return Some(Tag {
                    end: at + 1,
                    name,
                    closing,
                })
            }
            Attr::BeforeName if byte == b'/' || html_space(byte) => Attr::BeforeName,
            Attr::BeforeName => Attr::InName,
            Attr::InName if byte == b'/' => Attr::BeforeName,
            Attr::InName if byte == b'=' => Attr::BeforeValue,
            Attr::InName => Attr::InName,
            Attr::BeforeValue if byte == b'"' || byte == b'\'' => Attr::Quoted(byte),
            Attr::BeforeValue if html_space(byte) => Attr::BeforeValue,
            Attr::BeforeValue => Attr::Unquoted,
            Attr::Unquoted if html_space(byte) => Attr::BeforeName,
            Attr::Unquoted => Attr::Unquoted,
        };
        at += 1;
    }
    None
}

/// The elements whose content the tokenizer reads as text up to their own end tag: the raw text
/// elements (`noscript` is one while scripting is on, as in every browser that runs the page's
/// script, and a `</head>` inside it is no boundary either way) and the escapable raw text
/// elements `textarea` and `title`.
const RAW_TEXT: [&[u8]; 9] = [
    b"script",
    b"style",
    b"xmp",
    b"iframe",
    b"noembed",
    b"noframes",
    b"noscript",
    b"textarea",
    b"title",
];

/// Past the end tag that closes `name`'s raw text starting at `from`: the first `</name`
/// (any case) followed by whitespace, `/` or `>`. None when there is none or it is unterminated.
/// (`<script>`'s escaped states, `<!--<script>` inside a script, are not followed.)
fn raw_text_end(html: &[u8], from: usize, name: &[u8]) -> Option<usize> {
    let mut at = from;
    loop {
        let candidate = find_from(html, at, b"</")?;
        let after = candidate + 2 + name.len();
        if starts_with_ignore_case(html, candidate + 2, name)
            && html
                .get(after)
                .is_some_and(|&byte| html_space(byte) || byte == b'/' || byte == b'>')
        {
            return scan_tag(html, candidate).map(|tag| tag.end);
        }
        at = candidate + 2;
    }
}

/// Where the tag goes (the SDK's `htmlInjectionBoundary`): before the first real `</head>`,
/// else before the first real `</body>`, else at the end, in one forward scan. Not real: one
/// in a comment, a CDATA section, an attribute value, the text of a raw text element
/// (`RAW_TEXT`) or inside a `<template>` (inert content; templates nest). Nothing after
/// `<plaintext>` is markup, so it ends the scan as an unterminated construct does: the tag goes
/// before a `</body>` seen so far, else before the construct (before the outermost open
/// `<template>`, when inside one).
fn boundary(html: &[u8]) -> usize {
    let mut at = 0;
    let mut body = None;
    let mut templates = 0_usize;
    let mut outer_template = 0;
    while let Some(offset) = html[at..].iter().position(|&byte| byte == b'<') {
        let start = at + offset;
        let stop = body.unwrap_or(if templates > 0 { outer_template } else { start });
        let Some(tag) = scan_tag(html, start) else {
            return stop;
        };
        at = tag.end;
        if tag.closing {
            if tag.is(b"template") {
                templates = templates.saturating_sub(1);
            } else if templates == 0 && tag.is(b"head") {
                return start;
            } else if templates == 0 && tag.is(b"body") && body.is_none() {
                body = Some(start);
            }
        } else if tag.is(b"plaintext") {
            return stop;
        } else if tag.is(b"template") {
            if templates == 0 {
                outer_template = start;
            }
            templates += 1;
        } else if let Some(raw) = RAW_TEXT.into_iter().find(|raw| tag.is(raw)) {
            match raw_text_end(html, tag.end, raw) {
                Some(end) => at = end,
                None => return stop,
            }
        }
    }
    body.unwrap_or(if templates > 0 {
        outer_template
    } else {
        html.len()
    })
}

/// The envelope made safe anywhere in HTML: no `<`, `>` or `&` (so never `</script` nor
/// `<!--`), and no U+2028/U+2029; each is a JSON escape, valid where they can occur (inside
/// strings, as compact JSON has them nowhere else).
fn escape_for_script(envelope: &str) -> String {
    let mut out = String::with_capacity(envelope.len() + 16);
    for character in envelope.chars() {
        match character {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            other => out.push(other),
        }
    }
    out
}

/// The page with `<script id="agent-feedback" type="application/json">ESCAPED</script>` inserted
/// at the boundary of spec §2.2 (before the first real </head>, else </body>, else at the end;
/// see `boundary` for what is not real). ESCAPED = `envelope` with every
/// `<` as `\u003c` (also `>` as `\u003e`, `&` as `\u0026`, U+2028/2029 escaped: safe anywhere).
pub(crate) fn inject_html(html: &[u8], envelope: &str) -> Vec<u8> {
    let at = boundary(html);
    let escaped = escape_for_script(envelope);
    let open = b"<script id=\"agent-feedback\" type=\"application/json\">";
    let mut out = Vec::with_capacity(html.len() + open.len() + escaped.len() + 9);
    out.extend_from_slice(&html[..at]);
    out.extend_from_slice(open);
    out.extend_from_slice(escaped.as_bytes());
    out.extend_from_slice(b"</script>");
    out.extend_from_slice(&html[at..]);
    out
}

/// `Agent-Feedback` header value: base64url without padding of `envelope`.
pub(crate) fn header_value(envelope: &str) -> String {
    URL_SAFE_NO_PAD.encode(envelope)
}

/// `Link` value: `<{endpoint}/.well-known/agent-feedback-v1.json>; rel="agent-feedback"; type="application/json"`
/// (endpoint's trailing `/` stripped).
pub(crate) fn discovery_link(endpoint: &str) -> String {
    format!(
        "<{}/.well-known/agent-feedback-v1.json>; rel=\"agent-feedback\"; type=\"application/json\"",
        endpoint.trim_end_matches('/')
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ENVELOPE: &str = r#"{"v":1,"note":"a</script><!--b>&c\u2028"}"#;
    const TAG_OPEN: &str = r#"<script id="agent-feedback" type="application/json">"#;

    #[test]
    fn json_bodies_are_classified() {
        let cases: &[(&[u8], JsonBody)] = &[
            (b"{}", JsonBody::Object),
            (b" \n{ }\r\n", JsonBody::Object),
            (br#"{"a":1,"b":[{"_agentFeedback":1}]}"#, JsonBody::Object),
            (br#"{"a":{"_agentFeedback":true}}"#, JsonBody::Object),
            (br#"{"a":1e400,"b":-0.1}"#, JsonBody::Object),
            (br#"{"_agentFeedback":null}"#, JsonBody::OwnsFeedback),
            (br#"{"a":1,"_agentFeedback":{}}"#, JsonBody::OwnsFeedback),
            (br#"{"_agent\u0046eedback":1}"#, JsonBody::OwnsFeedback),
            (br#"{"\u005fagentFeedback":1}"#, JsonBody::OwnsFeedback),
            (br#"{"_agentFeedback ":1}"#, JsonBody::Object),
            (br#"{"_agentfeedback":1}"#, JsonBody::Object),
            (b"[]", JsonBody::Other),
            (br#"[{"a":1}]"#, JsonBody::Other),
            (b"1", JsonBody::Other),
            (b"\"s\"", JsonBody::Other),
            (b"null", JsonBody::Other),
            (b"true", JsonBody::Other),
            (b"", JsonBody::Other),
            (b"   ", JsonBody::Other),
            (b"{", JsonBody::Other),
            (b"{}}", JsonBody::Other),
            (b"{} {}", JsonBody::Other),
            (b"{\"a\":1,}", JsonBody::Other),
            (b"{\"a\":\"\xff\"}", JsonBody::Other),
            (b"\xef\xbb\xbf{}", JsonBody::Other),
            (b"{'a':1}", JsonBody::Other),
            (br#"{"a":"\q"}"#, JsonBody::Other),
            (b"{\"a\":1}\xff", JsonBody::Other),
        ];
        for (body, want) in cases {
            assert_eq!(json_body(body), *want, "{}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn deep_nesting_inside_a_member_is_fine_and_does_not_overflow() {
        // serde_json skips an ignored value without recursing, so depth is no limit here.
        let deep = format!("{{\"a\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(json_body(deep.as_bytes()), JsonBody::Object);
        assert!(splice_json(deep.as_bytes(), "{}").is_some());
        let broken = format!("{{\"a\":{}{}}}", "[".repeat(100_000), "]".repeat(99_999));
        assert_eq!(json_body(broken.as_bytes()), JsonBody::Other);
    }

    #[test]
    fn splice_appends_the_last_member_and_keeps_every_byte() {
        let cases: &[(&str, &str)] = &[
            ("{}", r#"{"_agentFeedback":{"v":1}}"#),
            ("{ }", r#"{ "_agentFeedback":{"v":1}}"#),
            ("{\n}\n", "{\n\"_agentFeedback\":{\"v\":1}}\n"),
            (r#"{"a":1}"#, r#"{"a":1,"_agentFeedback":{"v":1}}"#),
            (
                "{\"b\":2, \"a\":1 }  ",
                "{\"b\":2, \"a\":1 ,\"_agentFeedback\":{\"v\":1}}  ",
            ),
            (r#"{"x":{}}"#, r#"{"x":{},"_agentFeedback":{"v":1}}"#),
            (r#"{"x":"}"}"#, r#"{"x":"}","_agentFeedback":{"v":1}}"#),
            (
                r#"{"n":1.50,"u":"\u00e9"}"#,
                r#"{"n":1.50,"u":"\u00e9","_agentFeedback":{"v":1}}"#,
            ),
        ];
        for (body, want) in cases {
            let out = splice_json(body.as_bytes(), r#"{"v":1}"#).unwrap();
            assert_eq!(String::from_utf8(out).unwrap(), *want);
        }
        for not_object in ["[]", "1", "null", "{", r#"{"_agentFeedback":1}"#, ""] {
            assert_eq!(
                splice_json(not_object.as_bytes(), "{}"),
                None,
                "{not_object}"
            );
        }
    }

    #[test]
    fn markers_are_found_as_the_sdk_pattern_finds_them() {
        let found = [
            r#"<script id="agent-feedback">"#,
            r#"<SCRIPT type="application/json" ID='AGENT-FEEDBACK'></SCRIPT>"#,
            "<script\n\tid = agent-feedback>",
            "<script id=agent-feedback/>",
            "<script id=agent-feedback >",
            "<script data-x='a' id=\"agent-feedback\"\n>",
            "x<script<script id=agent-feedback>",
            "<script async id=\"agent-feedback\" type=x>",
        ];
        let not_found = [
            "",
            "<script>",
            r#"<scripts id="agent-feedback">"#,
            r#"<script_x id="agent-feedback">"#,
            r#"<script data-id="agent-feedback">"#,
            r#"<script id="agent-feedback-2">"#,
            r#"<script id="agent-feedback""#,
            "<script id=agent-feedbackx>",
            "<script id=agent-feedback/x>",
            r#"<script> id="agent-feedback"</script>"#,
            r#"<div id="agent-feedback">"#,
            r#"<script id= >"agent-feedback""#,
            "<script",
        ];
        for html in found {
            assert!(has_html_marker(html.as_bytes()), "{html}");
        }
        for html in not_found {
            assert!(!has_html_marker(html.as_bytes()), "{html}");
        }
        assert!(has_html_marker(b"\xff\xfe<script \xff id=agent-feedback>"));
    }

    /// `^` marks where the tag goes.
    const BOUNDARIES: &[&str] = &[
        "<html><head><title>Manual docs</title>^</head><body>x</body></html>",
        "<HTML><HEAD>^</HEAD><BODY></BODY>",
        "<head>^</head ><body></body>",
        "<html><body><p>hi</p>^</body></html>",
        "<p>no head nor body</p>^",
        "^",
        "plain text^",
        "<head><!-- </head> -->^</head>",
        "<!-- <!-- </head> -->^</head>",
        "<head><script>if (a</head>) {}</script>^</head>",
        "<head><script>x = '</script'; y</script >^</head>",
        "<head><script>a</scriptx></script>^</head>",
        "<head><style>p::after { content: '</head>' }</style>^</head>",
        "<head><SCRIPT>'</head>'</Script>^</head>",
        r#"<head><meta content="a > </head> b">^</head>"#,
        r#"<head><meta content='</head>'>^</head>"#,
        "<p>1 < 2 and <!-- in text -->^</head>",
        "<p>a <!doctype b></p>^</body>",
        "<head><title>x</title>^</head><head></head>",
        "<body>a</body><head>^</head>",
        // Unterminated: before a </body> seen so far, else at the start of the construct.
        "<body>^</body><!-- never closed",
        "<p>x</p>^<!-- never closed </head>",
        "<p>x</p>^<script>never closed </head>",
        "<p>x</p>^<div title=\"never closed></head>",
        "<p>x</p>^<script>x</script never closed",
        "<p>x</p>^<style>",
        "<body>^</body>",
        "<p>x</p>^<p",
        // Escapable raw text: a </head> or </body> in a title or a textarea is text.
        "<head><title>a </head> b</title>^</head>",
        "<HEAD><TITLE>a </HEAD> b</TITLE >^</HEAD>",
        "<head><Title lang=\"x>y\">a</head></title/>^</head>",
        "<head><title>a</titlex></head></title>^</head>",
        "<head><title-x>^</head></title-x>",
        "<body><textarea name=t>Dear </body> x</textarea>^</body>",
        "<body><TEXTAREA>a</body></TextArea\n>^</body>",
        // Raw text.
        "<head><noscript><p>enable JS</head></p></noscript>^</head>",
        "<body><xmp>code </body> sample</xmp>^</body>",
        "<body><iframe>fallback </body></iframe>^</body>",
        "<body><noembed>a </body></noembed>^</body>",
        "<body><noframes>a </body></noframes>^</body>",
        "<head><style>a</head></style>^</head>",
        "<body><xmp>a</xmp >b^</body></xmp></body>",
        // Template content is inert, and templates nest.
        "<head><template><p>a</head></template>^</head>",
        "<head><template><template></template></head></template>^</head>",
        "<head><TEMPLATE><title></template></title></head></Template>^</head>",
        "<body>^</body><template>",
        "<p>x</p>^<template><template></template></head>",
        "<p>x</p>^<template><script>never closed",
        "<p>x</p></template>^</head>",
        // Nothing after <plaintext> is markup: the tag goes before it.
        "<body><p>a</p>^<plaintext>b </body> c",
        "<body>^</body><plaintext></head>",
        "<head><title>t</title>^<PLAINTEXT></head>",
        "<p>x</p>^<template><plaintext></template></head>",
        // Comments as the tokenizer ends them.
        "<!--> ^</head> -->",
        "<!--->^</head>-->",
        "<!-- a --!>^</head>",
        "<!--!></head>-->^</head>",
        "<!-- a -- > </head> -->^</head>",
        "<p>x</p>^<!-- -- >",
        // CDATA (real in SVG and MathML) ends at ]]>; doctypes and bogus comments at the first >.
        "<svg><text><![CDATA[ 1 > 0 </body> ]]></text></svg>^</body>",
        "<p>x</p>^<![CDATA[ </head>",
        "<!doctype html \"a>^</head>",
        "<?xml a=\"</head>\"?>\">^</head>",
        "</ </head>^</head>",
        "</>^</head>",
        "<p>x</p>^</",
        "<p>x</p><^",
        // Quotes open a value only after `=`.
        "<p don't>^</head>",
        "<a b=c='x>'^</head>",
        "<a =\"x>\"^</head>",
        "<a b = 'x > </head>'>^</head>",
        "<a b / = \"</head>\">^</head>",
        // End tags are tokenized with attributes too; a name ends only at space, / or >.
        "<head></title a=\"</head>\">^</head>",
        "<headx></headx>^</head/>",
        "<head.></head.>^</head\t>",
    ];

    #[test]
    fn the_tag_goes_at_the_real_boundary() {
        for case in BOUNDARIES {
            let at = case.find('^').unwrap();
            let html = case.replacen('^', "", 1);
            let out = inject_html(html.as_bytes(), "{}");
            let tag = format!("{TAG_OPEN}{{}}</script>");
            let want = format!("{}{tag}{}", &html[..at], &html[at..]);
            assert_eq!(String::from_utf8(out).unwrap(), want, "{case}");
        }
    }

    #[test]
    fn the_envelope_is_escaped_for_any_html_context() {
        let out = inject_html(b"<head></head>", ENVELOPE);
        let out = String::from_utf8(out).unwrap();
        let inside = out
            .strip_prefix(&format!("<head>{TAG_OPEN}"))
            .and_then(|rest| rest.strip_suffix("</script></head>"))
            .unwrap();
        assert!(
            !inside.contains(['<', '>', '&', '\u{2028}', '\u{2029}']),
            "{inside}"
        );
        let original: serde_json::Value = serde_json::from_str(ENVELOPE).unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(inside).unwrap(),
            original
        );
    }

    #[test]
    fn non_utf8_pages_keep_their_bytes() {
        let html = b"\xff<head>\xfe\x00</head>\xc3";
        let out = inject_html(html, "{}");
        let tag = format!("{TAG_OPEN}{{}}</script>");
        let mut want = b"\xff<head>\xfe\x00".to_vec();
        want.extend_from_slice(tag.as_bytes());
        want.extend_from_slice(b"</head>\xc3");
        assert_eq!(out, want);
    }

    #[test]
    fn header_and_link() {
        assert_eq!(header_value(r#"{"v":1}"#), "eyJ2IjoxfQ");
        assert_eq!(header_value("??>"), "Pz8-");
        let link = "<https://e.example/.well-known/agent-feedback-v1.json>; \
                    rel=\"agent-feedback\"; type=\"application/json\"";
        assert_eq!(discovery_link("https://e.example"), link);
        assert_eq!(discovery_link("https://e.example/"), link);
    }

    #[test]
    fn long_adversarial_pages_are_linear() {
        // Each would be quadratic for a scanner that rescans from every `<`; a debug build
        // still finishes these in well under a second.
        let n = 200_000;
        for page in [
            "<script".repeat(n),
            "<script id=".repeat(n),
            "<!--".repeat(n),
            "<a \"".repeat(n),
            format!("<script>{}", "</scriptx".repeat(n)),
            format!("<script>{}", "</script\"".repeat(n)),
            "< id id id".repeat(n),
            "<title>".repeat(n),
            format!("<title>{}", "</titlex".repeat(n)),
            format!("<textarea>{}", "</".repeat(n)),
            "<template>".repeat(n),
            "<template></template>".repeat(n),
            "<!--".repeat(n),
            "<!-- --".repeat(n),
            "<![CDATA[".repeat(n),
            "<a b='".repeat(n),
            "<a b=".repeat(n),
        ] {
            let out = inject_html(page.as_bytes(), "{}");
            assert_eq!(out.len(), page.len() + TAG_OPEN.len() + 11);
            has_html_marker(page.as_bytes());
        }
    }

    fn json_object() -> impl Strategy<Value = serde_json::Map<String, serde_json::Value>> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            "[ -~\u{e9}\u{2028}<>]{0,8}".prop_map(serde_json::Value::from),
        ];
        let value = leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                proptest::collection::btree_map("[a-z_]{0,6}", inner, 0..4)
                    .prop_map(|map| serde_json::Value::Object(map.into_iter().collect())),
            ]
        });
        proptest::collection::vec(("[a-zA-Z_]{0,8}", value), 0..6).prop_map(|members| {
            members
                .into_iter()
                .filter(|(key, _)| key != FEEDBACK_KEY)
                .collect()
        })
    }

    proptest! {
        #[test]
        fn splice_keeps_the_product_and_appends_last(
            object in json_object(),
            pretty in any::<bool>(),
            trailing in "[ \n\t\r]{0,3}",
        ) {
            let mut body = if pretty {
                serde_json::to_vec_pretty(&object).unwrap()
            } else {
                serde_json::to_vec(&object).unwrap()
            };
            body.extend_from_slice(trailing.as_bytes());
            let out = splice_json(&body, ENVELOPE).unwrap();
            let close = body.iter().rposition(|&byte| byte == b'}').unwrap();
            prop_assert_eq!(&out[..close], &body[..close]);
            prop_assert_eq!(&out[out.len() - (body.len() - close)..], &body[close..]);
            let parsed: serde_json::Map<String, serde_json::Value> =
                serde_json::from_slice(&out).unwrap();
            let keys: Vec<&String> = parsed.keys().collect();
            prop_assert_eq!(keys.last().map(|key| key.as_str()), Some(FEEDBACK_KEY));
            let mut rest = parsed.clone();
            let feedback = rest.shift_remove(FEEDBACK_KEY).unwrap();
            prop_assert_eq!(feedback, serde_json::from_str::<serde_json::Value>(ENVELOPE).unwrap());
            prop_assert_eq!(rest, object);
        }

        #[test]
        fn inject_keeps_the_page_and_adds_one_safe_tag(page in html_ish()) {
            let out = inject_html(&page, ENVELOPE);
            let tag = format!("{TAG_OPEN}{}</script>", escape_for_script(ENVELOPE));
            let inside = escape_for_script(ENVELOPE);
            prop_assert!(!inside.contains("</") && !inside.contains("<!--"));
            prop_assert_eq!(out.len(), page.len() + tag.len());
            let spliced = (0..=page.len()).any(|at| {
                out[..at] == page[..at]
                    && out[at..at + tag.len()] == *tag.as_bytes()
                    && out[at + tag.len()..] == page[at..]
            });
            prop_assert!(spliced);
            let count = |bytes: &[u8]| {
                bytes.windows(TAG_OPEN.len()).filter(|w| *w == TAG_OPEN.as_bytes()).count()
            };
            prop_assert_eq!(count(&out), count(&page) + 1);
        }

        #[test]
        fn nothing_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = json_body(&bytes);
            let _ = splice_json(&bytes, "{}");
            let _ = has_html_marker(&bytes);
            let _ = inject_html(&bytes, ENVELOPE);
        }
    }

    /// Pages built from the pieces the scanner cares about, with arbitrary bytes between them.
    fn html_ish() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            Just(b"<head>".to_vec()),
            Just(b"</head>".to_vec()),
            Just(b"</HEAD >".to_vec()),
            Just(b"<body>".to_vec()),
            Just(b"</body>".to_vec()),
            Just(b"<script>".to_vec()),
            Just(b"</script>".to_vec()),
            Just(b"<style>".to_vec()),
            Just(b"</style".to_vec()),
            Just(b"<!--".to_vec()),
            Just(b"-->".to_vec()),
            Just(b"<title>".to_vec()),
            Just(b"</TITLE ".to_vec()),
            Just(b"<textarea>".to_vec()),
            Just(b"<template>".to_vec()),
            Just(b"</template>".to_vec()),
            Just(b"<plaintext>".to_vec()),
            Just(b"<!-->".to_vec()),
            Just(b"<![CDATA[".to_vec()),
            Just(b"]]>".to_vec()),
            Just(b"<a title=\"".to_vec()),
            Just(b"'".to_vec()),
            Just(b">".to_vec()),
            Just(b"<".to_vec()),
            Just(TAG_OPEN.as_bytes().to_vec()),
            proptest::collection::vec(any::<u8>(), 0..6),
        ];
        proptest::collection::vec(piece, 0..24).prop_map(|pieces| pieces.concat())
    }
}
