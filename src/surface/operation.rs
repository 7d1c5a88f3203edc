//! The telemetry `operation` of an HTTP request (spec §5): the path without its query, with
//! the SDK's `normalizeOperation` applied (UUID-like runs and all-digit segments become `:id`)
//! plus one rule of ours for a proxy without a route table (long id-like segments become `:id`
//! too), so operations stay few; the result is checked against what Epode accepts.

/// The longest operation Epode accepts.
const MAX_LEN: usize = 160;

/// A segment at least this long, of base64url characters with a digit, is an id.
const ID_LIKE_MIN: usize = 16;

const ID: &str = ":id";

/// The normalised route of a path (query stripped; UUID-like segments and all-digit segments
/// become `:id`; long hex/base64-ish id-like segments (≥ 16 chars with a digit) too), or None
/// when the result is not a valid Epode operation (1–160 chars of `[A-Za-z0-9/_:.*{}-]`).
pub(crate) fn normalise(path: &str) -> Option<String> {
    let path = path.split('?').next().unwrap_or_default();
    let path = if path.is_empty() { "/" } else { path };
    // Checked first: everything below is ASCII-only and a path that fails here cannot pass.
    if !path.bytes().all(allowed) {
        return None;
    }
    let uuids_out = replace_uuids(path.as_bytes());
    let segments: Vec<&str> = uuids_out.split('/').map(collapse_segment).collect();
    let operation = segments.join("/");
    (operation.len() <= MAX_LEN).then_some(operation)
}

/// Epode's operation charset.
fn allowed(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"/_:.*{}-".contains(&byte)
}

fn collapse_segment(segment: &str) -> &str {
    let all_digits = !segment.is_empty() && segment.bytes().all(|byte| byte.is_ascii_digit());
    let id_like = segment.len() >= ID_LIKE_MIN
        && segment.bytes().any(|byte| byte.is_ascii_digit())
        && segment
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-');
    if all_digits || id_like {
        ID
    } else {
        segment
    }
}

fn word(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_'
}

/// A regex `\b` between `bytes[at - 1]` and `bytes[at]` (outside the slice is a non-word).
fn word_boundary(bytes: &[u8], at: usize) -> bool {
    let before = at > 0 && word(bytes[at - 1]);
    let after = bytes.get(at).is_some_and(|&byte| word(byte));
    before != after
}

fn uuid_char(byte: u8) -> bool {
    byte.is_ascii_hexdigit() || byte == b'-'
}

/// The SDK's `/\b[0-9a-f]{8}-[0-9a-f-]{27,}\b/gi` → `:id`, in one pass. A match lies inside a
/// maximal run of `[0-9a-f-]`; its greedy end is the run's last word boundary, the same for
/// every start in the run, so each run is looked at once and holds at most one match (the
/// leftmost start far enough before that end). `bytes` is ASCII (checked by the caller).
fn replace_uuids(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if !uuid_char(bytes[at]) {
            out.push(char::from(bytes[at]));
            at += 1;
            continue;
        }
        let run_end = at
            + bytes[at..]
                .iter()
                .take_while(|&&byte| uuid_char(byte))
                .count();
        let last_boundary = (at..=run_end).rev().find(|&end| word_boundary(bytes, end));
        let start = last_boundary.and_then(|end| {
            (at..end.saturating_sub(35))
                .find(|&start| uuid_starts(bytes, start))
                .map(|start| (start, end))
        });
        let (copy_to, resume) = match start {
            Some((start, end)) => (start, end),
            None => (run_end, run_end),
        };
        bytes[at..copy_to]
            .iter()
            .for_each(|&byte| out.push(char::from(byte)));
        if start.is_some() {
            out.push_str(ID);
        }
        bytes[resume..run_end]
            .iter()
            .for_each(|&byte| out.push(char::from(byte)));
        at = run_end;
    }
    out
}

/// `\b[0-9a-f]{8}-` at `start` (the rest of the match is the run up to its end).
fn uuid_starts(bytes: &[u8], start: usize) -> bool {
    word_boundary(bytes, start)
        && bytes
            .get(start..start + 8)
            .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
        && bytes.get(start + 8) == Some(&b'-')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn paths_normalise_as_the_sdk_plus_id_like_segments() {
        let cases: &[(&str, Option<&str>)] = &[
            ("/search", Some("/search")),
            ("/docs/test", Some("/docs/test")),
            ("/search?q=1&x=%20", Some("/search")),
            ("", Some("/")),
            ("?q", Some("/")),
            ("/", Some("/")),
            ("/users/42", Some("/users/:id")),
            ("/users/42/", Some("/users/:id/")),
            ("/users/42/posts/7", Some("/users/:id/posts/:id")),
            ("/v2/items", Some("/v2/items")),
            ("/a1/12b", Some("/a1/12b")),
            ("/files/1.5", Some("/files/1.5")),
            (
                "/orders/123e4567-e89b-12d3-a456-426614174000",
                Some("/orders/:id"),
            ),
            (
                "/orders/123E4567-E89B-12D3-A456-426614174000/items",
                Some("/orders/:id/items"),
            ),
            // The SDK replaces a UUID inside a segment too.
            (
                "/r/report-123e4567-e89b-12d3-a456-426614174000.pdf",
                Some("/r/report-:id.pdf"),
            ),
            // Greedy to the last word boundary; a trailing `-` is not part of it.
            ("/x/123e4567-e89b-12d3-a456-426614174000-", Some("/x/:id-")),
            // No word boundary before the hex run: not a UUID (then id-like by our rule).
            ("/x/g123e4567-e89b-12d3-a456-426614174000", Some("/x/:id")),
            // Too short after the first dash: not a UUID, and too short to be id-like.
            ("/x/deadbeef-0123", Some("/x/deadbeef-0123")),
            ("/t/9f86d081884c7d659a2feaa0c55ad015", Some("/t/:id")),
            ("/t/AbCdEfGh12345678", Some("/t/:id")),
            ("/t/AbCdEfGh1234567", Some("/t/AbCdEfGh1234567")),
            (
                "/t/abcdefghijklmnopqrstuvwxyz",
                Some("/t/abcdefghijklmnopqrstuvwxyz"),
            ),
            (
                "/t/tok_0123456789abcdef.json",
                Some("/t/tok_0123456789abcdef.json"),
            ),
            ("/api/{id}/*.json", Some("/api/{id}/*.json")),
            ("*", Some("*")),
            ("/a%20b", None),
            ("/caf\u{e9}", None),
            ("/a b", None),
            ("/a+b", None),
            ("/a,b", None),
            ("/~user", None),
            ("/a@b", None),
            ("/a#b", None),
        ];
        for (path, want) in cases {
            assert_eq!(normalise(path).as_deref(), *want, "{path}");
        }
    }

    #[test]
    fn length_is_checked_after_collapsing() {
        let long = format!("/{}", "a".repeat(MAX_LEN - 1));
        assert_eq!(normalise(&long).as_deref(), Some(long.as_str()));
        assert_eq!(normalise(&format!("{long}b")), None);
        let collapsing = format!("/items/{}", "1".repeat(10_000));
        assert_eq!(normalise(&collapsing).as_deref(), Some("/items/:id"));
    }

    #[test]
    fn long_hex_runs_are_linear() {
        // A scanner that retried the UUID pattern from every start would be quadratic here.
        let run = "a-".repeat(200_000);
        assert_eq!(normalise(&format!("/{run}")), None);
        let run = "0123456789abcdef".repeat(20_000);
        assert_eq!(normalise(&format!("/{run}")).as_deref(), Some("/:id"));
    }

    fn valid(operation: &str) -> bool {
        (1..=MAX_LEN).contains(&operation.len()) && operation.bytes().all(allowed)
    }

    proptest! {
        #[test]
        fn output_is_always_valid_or_none(path in "[/a-f0-9A-Z_:.*{}%?~ -]{0,200}") {
            if let Some(operation) = normalise(&path) {
                prop_assert!(valid(&operation), "{operation}");
            }
        }

        #[test]
        fn arbitrary_text_never_panics(path in any::<String>()) {
            if let Some(operation) = normalise(&path) {
                prop_assert!(valid(&operation), "{operation}");
            }
        }

        #[test]
        fn plain_word_paths_are_unchanged(path in "(/[a-z_.-]{1,12}){0,8}") {
            let want = if path.is_empty() { "/".to_owned() } else { path.clone() };
            prop_assert_eq!(normalise(&path), Some(want));
        }
    }
}
