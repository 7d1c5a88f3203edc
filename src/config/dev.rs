//! The local trial (`--dev`): an embedded Epode with an ephemeral key, a JSON-lines record of
//! what it receives, and the live console. Loopback only.

use std::path::PathBuf;

use super::settings::{invalid, setting, ConfigError, Setting};
use super::{number, parsed, value, Scalar};

/// The local trial's settings, present when `--dev` is on.
#[derive(Debug, Clone)]
pub(crate) struct DevConfig {
    /// Where what the embedded Epode receives is appended, as JSON lines.
    pub(crate) log: PathBuf,
    /// The file stops growing past this size (a warning says so once).
    pub(crate) log_max_bytes: u64,
}

#[derive(Default)]
pub(super) struct RawDev {
    pub(super) dev: Option<Scalar>,
    pub(super) dev_log: Option<Scalar>,
    pub(super) dev_log_max_bytes: Option<Scalar>,
}

pub(super) fn is_on(raw: Option<Scalar>) -> Result<bool, ConfigError> {
    parsed(raw, "dev", |v| match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    })
}

/// The trial's settings; `--dev` requires a listener that stays on this machine.
pub(super) fn check(
    raw: RawDev,
    listen: std::net::SocketAddr,
) -> Result<Option<DevConfig>, ConfigError> {
    if !is_on(raw.dev)? {
        return Ok(None);
    }
    if !listen.ip().is_loopback() {
        return Err(ConfigError::Invalid {
            name: "EPODE_SIDECAR_LISTEN (config key `listen`)".to_owned(),
            value: listen.to_string(),
            accepts: "a loopback address such as 127.0.0.1:8080 with --dev: the local trial's embedded Epode and console are for this machine only",
        });
    }
    let log = value(raw.dev_log).unwrap_or_else(|| "epode-dev.jsonl".to_owned());
    if log.ends_with('/') || std::path::Path::new(&log).is_dir() {
        return Err(invalid("dev_log", &log));
    }
    Ok(Some(DevConfig {
        log: PathBuf::from(log),
        log_max_bytes: number(raw.dev_log_max_bytes, "dev_log_max_bytes", 1024..=u64::MAX)?,
    }))
}

pub(super) const DEV: &[Setting] = &[
    setting(
        "dev",
        &["EPODE_SIDECAR_DEV"],
        Some("false"),
        "true or false (also the flag --dev)",
        "The local trial, for a product without an Epode account yet: the sidecar makes an ephemeral product key and serves the Epode endpoints it uses itself, strictly as the real service does, records what arrives in `EPODE_SIDECAR_DEV_LOG`, and shows it live on a console at `/_dev/` on the listener. Refuses a non-loopback listener and an `EPODE_API_KEY`; says so at start and on every report.",
        |c| c.dev.is_some().to_string(),
    ),
    setting(
        "dev_log",
        &["EPODE_SIDECAR_DEV_LOG"],
        Some("epode-dev.jsonl"),
        "a file path",
        "With `--dev`: the file the embedded Epode appends what it receives to, one JSON object per line (`kind`: `telemetry`, `consent`, `report`; the request body; the status it answered). When it cannot be written (a read-only container), a file of the same name in the temporary directory, else none; a warning says which.",
        |c| c.dev.as_ref().map_or("<not used>".to_owned(), |d| d.log.display().to_string()),
    ),
    setting(
        "dev_log_max_bytes",
        &["EPODE_SIDECAR_DEV_LOG_MAX_BYTES"],
        Some("67108864"),
        "a whole number of bytes, at least 1024",
        "With `--dev`: the JSON-lines file stops growing past this size (one warning says so).",
        |c| c.dev.as_ref().map_or("<not used>".to_owned(), |d| d.log_max_bytes.to_string()),
    ),
];
