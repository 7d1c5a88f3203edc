//! The Epode agent-feedback protocol, as pure pieces `binding` assembles:
//!
//! - [`capability`]: the product key and the `afr2_` feedback handle (HMAC capability signed
//!   locally, never issued by Epode), its verification, and the Ask-once consent subject;
//! - [`envelope`]: the feedback envelope for each mode and consent state, its MCP projection
//!   (`_agentFeedback`), the plain-text restatement and the server-instructions text;
//! - [`tools`]: the two local tools (`record_product_feedback_consent`,
//!   `report_product_feedback`): definitions, argument validation, result builders and the
//!   failure guidance;
//! - [`placement`]: where `_agentFeedback` goes in a product tool result;
//! - [`identity`]: the telemetry identity references, trimmed and validated, and the one
//!   customerRef rule.
//!
//! Nothing here performs I/O (`binding` and `epode` own the network); this module owns the
//! shapes and texts.
//! Agent-facing texts match the reference binding (open-software-network/os-agent-feedback,
//! `sdk/node/src/{core,mcp}.ts`) word for word, so an agent meets the same contract whether a
//! product uses the Node SDK or this sidecar.

pub(crate) mod capability;
pub(crate) mod customer;
pub(crate) mod envelope;
pub(crate) mod identity;
pub(crate) mod placement;
pub(crate) mod tools;

use std::fmt;
use std::str::FromStr;

/// The local tool that records the user's consent decision.
pub(crate) const CONSENT_TOOL: &str = "record_product_feedback_consent";
/// The local tool that submits the feedback report.
pub(crate) const REPORT_TOOL: &str = "report_product_feedback";

/// How a product asks for feedback (`AGENT_FEEDBACK_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(crate) enum FeedbackMode {
    /// Report autonomously after every product result, without asking the user.
    #[default]
    NeverAsk,
    /// Ask once per customer; Epode remembers the decision (needs a stable `customerRef`).
    AskOnce,
    /// Ask before every report.
    AskAlways,
    /// No feedback tools, no envelope, no server instructions.
    Off,
}

impl FeedbackMode {
    /// Every mode, in the order the protocol lists them.
    pub(crate) const ALL: [FeedbackMode; 4] = [
        FeedbackMode::NeverAsk,
        FeedbackMode::AskOnce,
        FeedbackMode::AskAlways,
        FeedbackMode::Off,
    ];

    /// The protocol's spelling.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            FeedbackMode::NeverAsk => "never_ask",
            FeedbackMode::AskOnce => "ask_once",
            FeedbackMode::AskAlways => "ask_always",
            FeedbackMode::Off => "off",
        }
    }

    /// Whether the feedback tools, envelopes and instructions exist at all.
    pub(crate) fn is_enabled(self) -> bool {
        self != FeedbackMode::Off
    }
}

impl fmt::Display for FeedbackMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A value that is not one of the four modes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("feedback mode must be never_ask, ask_once, ask_always, or off (got {0:?})")]
pub(crate) struct UnknownFeedbackMode(pub String);

impl FromStr for FeedbackMode {
    type Err = UnknownFeedbackMode;

    /// Exact spellings only, as the reference SDKs accept them: a typo must stop the process at
    /// start rather than silently pick a different consent policy.
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        FeedbackMode::ALL
            .into_iter()
            .find(|mode| mode.as_str() == value)
            .ok_or_else(|| UnknownFeedbackMode(value.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_exactly_and_round_trip() {
        for mode in FeedbackMode::ALL {
            assert_eq!(mode.as_str().parse::<FeedbackMode>(), Ok(mode));
            assert_eq!(mode.to_string(), mode.as_str());
        }
        for bad in ["", "Never_Ask", "ask-once", " off", "always", "never_ask "] {
            let err = bad.parse::<FeedbackMode>().unwrap_err();
            assert!(err
                .to_string()
                .contains("never_ask, ask_once, ask_always, or off"));
        }
        assert_eq!(FeedbackMode::default(), FeedbackMode::NeverAsk);
        assert!(!FeedbackMode::Off.is_enabled());
        assert!(FeedbackMode::AskOnce.is_enabled());
    }
}
