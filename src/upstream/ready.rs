//! What readiness says when the upstream is not ready: why, in two forms (the operator's,
//! with where; a client's, without), and whether a person must look.

/// Why the upstream is not ready, and whether that is likely to last (a wrong path, an
/// error status: a person must look) or to pass (not reachable yet, still starting).
#[derive(Debug)]
pub(crate) struct NotReady {
    /// For the operator (the log, the admin listener's `/readyz`): what failed and where (the
    /// upstream's address without credentials or query, what a child printed).
    pub(crate) reason: String,
    /// For a port clients reach: what failed, never where.
    pub(crate) summary: &'static str,
    pub(crate) lasting: bool,
}

impl NotReady {
    pub(crate) fn passing(summary: &'static str, reason: impl Into<String>) -> Self {
        NotReady {
            reason: reason.into(),
            summary,
            lasting: false,
        }
    }

    pub(crate) fn lasting(summary: &'static str, reason: impl Into<String>) -> Self {
        NotReady {
            reason: reason.into(),
            summary,
            lasting: true,
        }
    }
}
