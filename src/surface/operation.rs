//! The telemetry `operation` of an HTTP request (spec §5): the path without its query, named
//! by the first of the operator's route templates it matches (`EPODE_SIDECAR_HTTP_ROUTES`, each
//! `{…}` reported as `:id`), else by the default collapse: every segment that does not look like
//! a route word becomes `:id`. Epode's contract forbids deriving anything from names, e-mails
//! or caller input, so the default keeps only what a route table would hold (short lowercase
//! words, `v2`), and everything else (ids, tokens, JWTs, e-mail addresses, `john.smith`,
//! `jane-doe-1985`, anything percent-encoded) is collapsed. The result is always in Epode's
//! operation charset; a path whose operation would be longer than Epode accepts has none.

use crate::config::RouteTemplate;

/// The longest operation Epode accepts.
const MAX_LEN: usize = 160;

/// The longest segment kept as a route word: longer ones are slugs, tokens or ids.
const WORD_MAX: usize = 24;

/// A word longer than this must have a vowel (`a e i o u y`) to be kept: a short one may be an
/// abbreviation (`api`, `cdn`, `html`), a long one without a vowel is no word.
const ABBREVIATION_MAX: usize = 4;

/// The most consonants in a row a kept word may have (`lengths` has five): more is a token.
const CONSONANT_RUN_MAX: usize = 5;

/// The file extensions a route word may carry (`/feed.json`, `/index.html`); any other dot
/// (`john.smith`, `a.b.c`) makes the segment an id.
const EXTENSIONS: [&str; 5] = ["json", "html", "htm", "xml", "txt"];

const ID: &str = ":id";

/// How the HTTP surface names a request's operation: the operator's templates, then the
/// default collapse.
pub(crate) struct OperationNames {
    templates: Vec<RouteMatcher>,
}

/// One route template, ready to match: its segments (`None` a placeholder) and the operation
/// it reports.
struct RouteMatcher {
    segments: Vec<Option<String>>,
    operation: String,
}

impl OperationNames {
    /// The templates are checked where they are read (`config`): each yields a valid operation.
    pub(crate) fn new(templates: &[RouteTemplate]) -> Self {
        OperationNames {
            templates: templates
                .iter()
                .map(|t| RouteMatcher {
                    segments: t.segments.clone(),
                    operation: t.operation(),
                })
                .collect(),
        }
    }

    /// The operation of `path` (its query, if any, ignored): the first template it matches,
    /// else [`collapse`]; None when the result is longer than Epode accepts.
    pub(crate) fn of(&self, path: &str) -> Option<String> {
        let path = path.split('?').next().unwrap_or_default();
        if !self.templates.is_empty() {
            if let Some(rest) = path.strip_prefix('/') {
                // One trailing `/` is ignored; the segments are counted once (no allocation),
                // and most templates differ in count from the path.
                let rest = rest.strip_suffix('/').unwrap_or(rest);
                let count = if rest.is_empty() {
                    0
                } else {
                    rest.split('/').count()
                };
                let mut alike = self
                    .templates
                    .iter()
                    .filter(|t| t.segments.len() == count)
                    .peekable();
                if alike.peek().is_some() {
                    // Split once, whatever the number of templates compared.
                    let segments: Vec<&str> = if count == 0 {
                        Vec::new()
                    } else {
                        rest.split('/').collect()
                    };
                    if let Some(t) = alike.find(|t| t.matches(&segments)) {
                        return Some(t.operation.clone());
                    }
                }
            }
        }
        collapse(path)
    }
}

impl RouteMatcher {
    /// Whether a path's segments (as many as the template's) are the template's: each
    /// literal the same bytes, each placeholder any non-empty segment.
    fn matches(&self, segments: &[&str]) -> bool {
        segments
            .iter()
            .zip(&self.segments)
            .all(|(segment, want)| match want {
                Some(literal) => segment == literal,
                None => !segment.is_empty(),
            })
    }
}

/// The default operation of a path without its query: each segment that is not a route word
/// ([`route_word`]) becomes `:id`, empty segments stay; None when longer than Epode accepts.
pub(crate) fn collapse(path: &str) -> Option<String> {
    let path = if path.is_empty() { "/" } else { path };
    let mut out = String::with_capacity(path.len().min(MAX_LEN));
    for (i, segment) in path.split('/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        if segment.is_empty() || route_word(segment) {
            out.push_str(segment);
        } else {
            out.push_str(ID);
        }
        // Stops early: a path may be kilobytes long.
        if out.len() > MAX_LEN {
            return None;
        }
    }
    Some(out)
}

/// Whether a path segment is kept as it is: at most [`WORD_MAX`] bytes, and either an API
/// version (`v1` to `v99`), `.well-known`, or lowercase words joined by single `-` or `_`
/// (each word of more than [`ABBREVIATION_MAX`] letters with a vowel and no more than
/// [`CONSONANT_RUN_MAX`] consonants in a row), optionally with one of [`EXTENSIONS`]. No
/// digits, capitals, dots elsewhere or escapes: those are how ids, tokens, names and e-mail
/// addresses look.
fn route_word(segment: &str) -> bool {
    if segment.len() > WORD_MAX {
        return false;
    }
    if segment == ".well-known" || version(segment.as_bytes()) {
        return true;
    }
    let stem = match segment.split_once('.') {
        Some((stem, ext)) if EXTENSIONS.contains(&ext) => stem,
        Some(_) => return false,
        None => segment,
    };
    stem.split(['-', '_']).all(|w| word(w.as_bytes()))
}

/// `v` and one or two digits.
fn version(segment: &[u8]) -> bool {
    matches!(segment, [b'v', rest @ ..] if (1..=2).contains(&rest.len()) && rest.iter().all(u8::is_ascii_digit))
}

fn word(w: &[u8]) -> bool {
    if w.is_empty() || !w.iter().all(u8::is_ascii_lowercase) {
        return false;
    }
    if w.len() <= ABBREVIATION_MAX {
        return true;
    }
    let vowel = |b: &u8| b"aeiouy".contains(b);
    let mut run = 0;
    for b in w {
        run = if vowel(b) { 0 } else { run + 1 };
        if run > CONSONANT_RUN_MAX {
            return false;
        }
    }
    w.iter().any(vowel)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn operations(templates: &[&str]) -> OperationNames {
        let parsed: Vec<RouteTemplate> = templates
            .iter()
            .map(|t| RouteTemplate::parse(t).unwrap())
            .collect();
        OperationNames::new(&parsed)
    }

    #[test]
    fn personal_data_and_tokens_collapse_to_id() {
        let none = operations(&[]);
        let cases: &[(&str, &str)] = &[
            // The paths issue 30 saw reach Epode as operations.
            (
                "/reset/eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjMifQ.c2lnbmF0dXJl",
                "/reset/:id",
            ),
            ("/invite/Xk9fQ2mZ7pLw", "/invite/:id"),
            ("/search/jane-doe-1985", "/search/:id"),
            ("/users/john.smith/orders/42", "/users/:id/orders/:id"),
            // E-mail addresses, raw and percent-encoded; any escape.
            ("/users/jane@example.com", "/users/:id"),
            ("/users/jane%40example.com/profile", "/users/:id/profile"),
            ("/search/jane%20doe", "/search/:id"),
            ("/caf%C3%A9", "/:id"),
            // Ids of every shape.
            ("/users/42", "/users/:id"),
            (
                "/orders/123e4567-e89b-12d3-a456-426614174000",
                "/orders/:id",
            ),
            (
                "/r/report-123e4567-e89b-12d3-a456-426614174000.pdf",
                "/r/:id",
            ),
            ("/t/9f86d081884c7d659a2feaa0c55ad015", "/t/:id"),
            ("/api/orders/A-1001", "/api/orders/:id"),
            ("/files/1.5", "/files/:id"),
            ("/a1/12b", "/:id/:id"),
            // Capitals, long lowercase runs, consonant runs, no vowel.
            ("/Users/Jane", "/:id/:id"),
            ("/t/abcdefghijklmnopqrstuvwxyz", "/t/:id"),
            ("/t/xkcdqwrtzp", "/t/:id"),
            ("/t/bcdfg", "/t/:id"),
            ("/t/tok_0123456789abcdef.json", "/t/:id"),
            ("/api/{id}/*.json", "/api/:id/:id"),
            ("/x/a--b", "/x/:id"),
            ("/x/-a", "/x/:id"),
            ("/x/report.pdf", "/x/:id"),
            ("*", ":id"),
        ];
        for (path, want) in cases {
            assert_eq!(none.of(path).as_deref(), Some(*want), "{path}");
        }
    }

    #[test]
    fn route_words_stay() {
        let none = operations(&[]);
        for path in [
            "/",
            "/search",
            "/docs/test",
            "/page-no-head",
            "/api/v2/orders",
            "/v1/users/me",
            "/sign-in",
            "/api_keys/list",
            "/feed.json",
            "/docs/index.html",
            "/.well-known/openid-configuration",
            "/api/cdn/html",
            "/sync/rhythm",
            "/lengths",
            "/users/42/",
            "//double",
        ] {
            let want = path.replace("/42", "/:id");
            assert_eq!(none.of(path).as_deref(), Some(want.as_str()), "{path}");
        }
        assert_eq!(none.of("").as_deref(), Some("/"));
        assert_eq!(none.of("?q=1").as_deref(), Some("/"));
        assert_eq!(none.of("/search?q=jane%20doe").as_deref(), Some("/search"));
    }

    #[test]
    fn templates_name_what_the_default_guesses_wrong() {
        let ops = operations(&[
            "/users/{id}/orders/{id}",
            "/Reports/{year}",
            "/u/{}",
            "/",
            "/users/me",
            "/users/{id}",
        ]);
        let cases: &[(&str, &str)] = &[
            ("/users/jane/orders/42", "/users/:id/orders/:id"),
            ("/users/jane/orders/42/", "/users/:id/orders/:id"),
            ("/users/jane/orders/42?x=1", "/users/:id/orders/:id"),
            // Literals are the operator's: kept as written (the default would collapse them).
            ("/Reports/2024", "/Reports/:id"),
            ("/u/bob", "/u/:id"),
            ("/", "/"),
            // The first template that matches wins.
            ("/users/me", "/users/me"),
            ("/users/jane", "/users/:id"),
            // Unmatched: the default.
            ("/users/jane/orders", "/users/jane/orders"),
            ("/users//orders/42", "/users//orders/:id"),
            ("/reports/2024", "/reports/:id"),
            (
                "/users/jane/orders/42/items",
                "/users/jane/orders/:id/items",
            ),
        ];
        for (path, want) in cases {
            assert_eq!(ops.of(path).as_deref(), Some(*want), "{path}");
        }
    }

    #[test]
    fn length_is_checked_after_collapsing() {
        let long = format!("/{}", "ab/".repeat(53));
        assert_eq!(long.len(), 160);
        assert_eq!(collapse(&long).as_deref(), Some(long.as_str()));
        assert_eq!(collapse(&format!("{long}x")), None);
        let collapsing = format!("/items/{}", "1".repeat(10_000));
        assert_eq!(collapse(&collapsing).as_deref(), Some("/items/:id"));
        // Stops at the bound, however long the path.
        assert_eq!(collapse(&"/ab".repeat(200_000)), None);
    }

    /// The per-request cost of naming an operation: `cargo test --release --lib
    /// operation_costs -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, not a check"]
    fn operation_costs() {
        use std::hint::black_box;
        use std::time::Instant;
        const N: u32 = 1_000_000;
        let set = |f: &dyn Fn(usize) -> String| {
            let all: Vec<String> = (0..64).map(f).collect();
            operations(&all.iter().map(String::as_str).collect::<Vec<_>>())
        };
        let none = operations(&[]);
        let other = set(&|i| format!("/t{i}/{{id}}/x"));
        // The worst case: as many segments as the path, each compared up to the last.
        let alike = set(&|i| format!("/api/v2/users/{{id}}/orders/t{i}"));
        for path in [
            "/search",
            "/api/v2/users/john.smith/orders/123e4567-e89b-12d3-a456-426614174000",
            "/reset/eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjMifQ.c2lnbmF0dXJl?next=/home",
        ] {
            for (what, ops) in [
                ("no templates", &none),
                ("64 templates", &other),
                ("64 templates, the path's length", &alike),
            ] {
                let start = Instant::now();
                for _ in 0..N {
                    black_box(ops.of(black_box(path)));
                }
                let ns = start.elapsed().as_nanos() / u128::from(N);
                println!("{path} ({what}): {ns} ns");
            }
        }
    }

    fn valid(operation: &str) -> bool {
        (1..=MAX_LEN).contains(&operation.len())
            && operation
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"/_:.*{}-".contains(&b))
    }

    proptest! {
        #[test]
        fn output_is_always_valid_or_none(path in any::<String>()) {
            if let Some(operation) = collapse(&path) {
                prop_assert!(valid(&operation), "{operation}");
            }
        }

        /// Nothing of a segment that is not a route word reaches Epode: every kept segment is
        /// a lowercase word (or a version), so no digit run, capital, `@`, `%` or `.` but an
        /// extension's survives.
        #[test]
        fn kept_segments_are_route_words(path in "(/[a-zA-Z0-9@%._~+-]{0,30}){0,6}") {
            if let Some(operation) = collapse(&path) {
                for segment in operation.split('/') {
                    prop_assert!(
                        segment.is_empty() || segment == ID || route_word(segment),
                        "{segment} of {operation}"
                    );
                    prop_assert!(!segment.contains(['@', '%', '~', '+']) && !segment.chars().any(|c| c.is_ascii_uppercase()), "{segment}");
                    prop_assert!(
                        version(segment.as_bytes()) || !segment.chars().any(|c| c.is_ascii_digit()),
                        "{segment}"
                    );
                }
            }
        }

        #[test]
        fn short_word_paths_are_unchanged(path in "(/[a-z]{1,4}([-_][a-z]{1,4}){0,2}){0,8}") {
            let want = if path.is_empty() { "/".to_owned() } else { path.clone() };
            prop_assert_eq!(collapse(&path), Some(want));
        }
    }
}
