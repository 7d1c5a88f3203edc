//! The top-level `id` of a message too long to keep, found as its bytes stream past: a
//! scanner that follows JSON's nesting and strings (so an `"id"` inside a result, or inside a
//! string, is never taken for the message's own) with a few bytes of state, whatever the
//! message's length. It checks only what it needs: anything it cannot follow gives no id.

/// The longest id value kept (the sidecar's own are 34 bytes with their quotes).
const MAX_ID: usize = 64;

#[derive(Default)]
pub(super) struct IdScan {
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// At depth 1: a key is expected next (after `{` or `,`).
    expect_key: bool,
    /// The key being read at depth 1, as far as it could be `id`.
    key: Vec<u8>,
    reading_key: bool,
    /// The last key read at depth 1 was `id`; its value is read next.
    id_next: bool,
    /// The `id` value as it is read.
    value: Option<Vec<u8>>,
    found: Option<Vec<u8>>,
    /// The message is not something the scanner can vouch for (two ids, a value too long).
    broken: bool,
}

impl IdScan {
    pub(super) fn new() -> Self {
        IdScan::default()
    }

    /// Feeds the next bytes of the message.
    pub(super) fn feed(&mut self, bytes: &[u8]) {
        if self.broken {
            return;
        }
        for &b in bytes {
            self.byte(b);
        }
    }

    /// The top-level `id`'s JSON text, when the message had exactly one.
    pub(super) fn id(&self) -> Option<&[u8]> {
        if self.broken {
            return None;
        }
        self.found.as_deref()
    }

    fn take_value_byte(&mut self, b: u8) {
        if let Some(v) = self.value.as_mut() {
            if v.len() >= MAX_ID {
                self.broken = true;
            } else {
                v.push(b);
            }
        }
    }

    fn end_value(&mut self) {
        if let Some(v) = self.value.take() {
            if self.found.is_some() {
                self.broken = true; // an id given twice: no answer is safe
            } else {
                self.found = Some(v);
            }
        }
    }

    fn byte(&mut self, b: u8) {
        if self.in_string {
            self.string_byte(b);
            return;
        }
        // A scalar id value (number, literal) ends at the first byte that cannot be in it.
        if self.value.is_some() && !matches!(b, b'"') {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'+' | b'.') {
                self.take_value_byte(b);
                return;
            }
            self.end_value();
        }
        match b {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.expect_key {
                    self.reading_key = true;
                    self.key.clear();
                } else if self.depth == 1 && self.id_next {
                    self.id_next = false;
                    self.value = Some(vec![b'"']);
                }
            }
            b'{' | b'[' => {
                self.depth += 1;
                if self.depth == 1 {
                    self.expect_key = b == b'{';
                } else if self.depth == 2 && self.id_next {
                    self.id_next = false; // an object or array as the id: not ours
                }
            }
            b'}' | b']' => self.depth = self.depth.saturating_sub(1),
            b',' if self.depth == 1 => self.expect_key = true,
            b':' if self.depth == 1 => {}
            b if b.is_ascii_whitespace() => {}
            b if self.depth == 1 && self.id_next => {
                self.id_next = false;
                self.value = Some(vec![b]);
            }
            _ => {}
        }
    }

    fn string_byte(&mut self, b: u8) {
        if self.escaped {
            self.escaped = false;
            self.string_content(b, true);
            return;
        }
        match b {
            b'\\' => self.escaped = true,
            b'"' => {
                self.in_string = false;
                if self.reading_key {
                    self.reading_key = false;
                    self.expect_key = false;
                    self.id_next = self.key == b"id";
                } else if self.value.is_some() {
                    self.take_value_byte(b'"');
                    self.end_value();
                }
            }
            _ => self.string_content(b, false),
        }
    }

    fn string_content(&mut self, b: u8, escaped: bool) {
        if self.reading_key {
            // An escaped character never makes the key `id` (the sidecar writes its ids plainly).
            if escaped || self.key.len() > 2 {
                self.key.clear();
                self.key.extend_from_slice(b"???");
            } else {
                self.key.push(b);
            }
        } else if self.value.is_some() {
            if escaped {
                self.take_value_byte(b'\\');
            }
            self.take_value_byte(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id_of(parts: &[&[u8]]) -> Option<String> {
        let mut s = IdScan::new();
        for p in parts {
            s.feed(p);
        }
        s.id().map(|b| String::from_utf8_lossy(b).into_owned())
    }

    #[test]
    fn the_top_level_id_is_found_wherever_it_stands() {
        assert_eq!(
            id_of(&[br#"{"jsonrpc":"2.0","id":"ab12","result":{}}"#]),
            Some(r#""ab12""#.into())
        );
        assert_eq!(id_of(&[br#"{"id" : 42 , "x":1}"#]), Some("42".into()));
        // The real id after a long result holding ids of its own, fed in small pieces.
        let mut text =
            br#"{"jsonrpc":"2.0","result":{"content":[{"id":"victim","text":"a \"id\":1 "#.to_vec();
        text.extend(std::iter::repeat_n(b'x', 100_000));
        text.extend(br#""}],"id":"inner"},"id":"mine"}"#);
        let chunks: Vec<&[u8]> = text.chunks(7).collect();
        assert_eq!(id_of(&chunks), Some(r#""mine""#.into()));
        // Split across pieces inside the key and the value.
        assert_eq!(
            id_of(&[br#"{"i"#, br#"d":"ke"#, br#"y1"}"#]),
            Some(r#""key1""#.into())
        );
    }

    #[test]
    fn nothing_uncertain_is_taken_for_an_id() {
        assert_eq!(id_of(&[br#"{"result":{"id":"nested"}}"#]), None);
        assert_eq!(id_of(&[br#"{"x":"\"id\":\"s\""}"#]), None);
        assert_eq!(id_of(&[br#"{"id":1,"id":2}"#]), None, "two ids");
        assert_eq!(id_of(&[br#"{"id":{"a":1}}"#]), None);
        assert_eq!(id_of(&[br#"{"i\u0064":"x"}"#]), None);
        let long = format!(r#"{{"id":"{}"}}"#, "z".repeat(100));
        assert_eq!(
            id_of(&[long.as_bytes()]),
            None,
            "an id longer than any of ours"
        );
        assert_eq!(id_of(&[br#"["id","x"]"#]), None);
    }
}
