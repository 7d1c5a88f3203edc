//! What readiness says when the upstream is not ready: why, and whether a person must look.

/// Why the upstream is not ready, and whether that is likely to last (a wrong path, an
/// error status: a person must look) or to pass (not reachable yet, still starting).
#[derive(Debug)]
pub(crate) struct NotReady {
    pub(crate) reason: String,
    pub(crate) lasting: bool,
}

impl NotReady {
    pub(crate) fn passing(reason: impl Into<String>) -> Self {
        NotReady {
            reason: reason.into(),
            lasting: false,
        }
    }

    pub(crate) fn lasting(reason: impl Into<String>) -> Self {
        NotReady {
            reason: reason.into(),
            lasting: true,
        }
    }
}
