//! The HTTP surface's pure pieces: where the envelope goes in a JSON object, an HTML page or the
//! headers (`place`), the telemetry operation of a path (`operation`), and which responses are
//! instrumented at all (`rules`). Nothing here does I/O; the proxy calls these on bytes it holds.

// Nothing calls these yet: the proxy that uses them lands on another branch; this goes when it does.
#![allow(dead_code)]

pub(crate) mod operation;
pub(crate) mod place;
pub(crate) mod rules;
