//! The two MCP eras, as one type for both sides of the sidecar: the era a client's request
//! belongs to (decided by the front door's ladder) and the era the upstream speaks (decided
//! by the upstream's era resolver). Everything that differs between them on the request path
//! asks this type, not a boolean.

/// An MCP era on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Era {
    /// 2026-07-28: stateless, every request carries its version and capabilities.
    Modern,
    /// 2025-11-25 and before: the `initialize` handshake and its session.
    Legacy,
}

impl Era {
    /// How metrics, access lines and the console name the era.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Era::Modern => "2026-07-28",
            Era::Legacy => "2025",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert_eq!(Era::Modern.label(), "2026-07-28");
        assert_eq!(Era::Legacy.label(), "2025");
    }
}
