//! PLACEHOLDER: replaced at merge by branch w5-place
//!
//! The telemetry operation of an HTTP request (spec §5): its normalised route.

/// The normalised route of a path (query stripped; all-digit segments become `:id`), or None
/// when the result is not a valid Epode operation (1–160 chars of `[A-Za-z0-9/_:.*{}-]`).
pub(crate) fn normalise(path: &str) -> Option<String> {
    let path = path.split('?').next().unwrap_or_default();
    let op = path
        .split('/')
        .map(|s| {
            if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
                ":id"
            } else {
                s
            }
        })
        .collect::<Vec<_>>()
        .join("/");
    let ok = (1..=160).contains(&op.len())
        && op
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/_:.*{}-".contains(&b));
    ok.then_some(op)
}
