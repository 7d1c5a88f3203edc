//! Protocol versions and the per-request envelope keys of MCP 2026-07-28.

/// The modern revisions the sidecar serves to clients.
pub(crate) const MODERN_VERSIONS: [&str; 1] = ["2026-07-28"];
pub(crate) const MODERN: &str = "2026-07-28";

/// The handshake-era revisions (the `initialize` path), newest first.
pub(crate) const LEGACY_VERSIONS: [&str; 4] =
    ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];
pub(crate) const LEGACY_LATEST: &str = "2025-11-25";

pub(crate) const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
pub(crate) const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
pub(crate) const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
pub(crate) const META_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
pub(crate) const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
pub(crate) const META_SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// Envelope keys a 2025-era upstream does not know; removed before a request goes to one.
pub(crate) const ENVELOPE_KEYS: [&str; 4] = [
    META_PROTOCOL_VERSION,
    META_CLIENT_CAPABILITIES,
    META_CLIENT_INFO,
    META_LOG_LEVEL,
];

pub(crate) fn is_legacy(version: &str) -> bool {
    LEGACY_VERSIONS.contains(&version)
}

pub(crate) fn is_modern_supported(version: &str) -> bool {
    MODERN_VERSIONS.contains(&version)
}
