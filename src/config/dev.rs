//! The local trial (`--dev`): an embedded Epode with an ephemeral key, a JSON-lines record of
//! what it receives, and the live console: its settings and the [`DevConfig`] built from them.
//! That it stays on loopback is checked where `dev` meets `listen` (`Config::read`).

use std::path::{Path, PathBuf};

use super::setting::{
    boolean, bounded, number, read_all, setting, settings, Accepts, Bad, Layers, Refused,
};
use super::types::DevConfig;

/// The trial's settings, read when `--dev` is on.
pub(super) fn read(l: &Layers) -> Result<DevConfig, Refused> {
    read_all!(DevConfig {
        log: l.get_or_default(&DEV_LOG),
        log_max_bytes: l.get(&DEV_LOG_MAX_BYTES),
    })
}

fn dev_log(log: &str) -> Result<PathBuf, Bad> {
    if log.ends_with('/') || Path::new(log).is_dir() {
        return Err(Bad::Whole);
    }
    Ok(PathBuf::from(log))
}

settings! {
    /// The local trial's settings.
    pub(super) TRIAL {
        DEV: bool = setting(
            "dev",
            &["EPODE_SIDECAR_DEV"],
            Some("false"),
            "true or false (also the flag --dev)",
            "The local trial, for a product without an Epode account yet: the sidecar makes an ephemeral product key and serves the Epode endpoints it uses itself, strictly as the real service does, records what arrives in `EPODE_SIDECAR_DEV_LOG`, and shows it live on a console at `/_dev/` on the listener. Refuses a non-loopback listener and an `EPODE_API_KEY`; says so at start and on every report.",
            boolean,
            |c| c.dev.is_some().to_string(),
        )
        .switch(
            "dev",
            "The local trial: an embedded Epode with an ephemeral key, and a live console at /_dev/",
        ),
        DEV_LOG: PathBuf = setting(
            "dev_log",
            &["EPODE_SIDECAR_DEV_LOG"],
            Some("epode-dev.jsonl"),
            "a file path",
            "With `--dev`: the file the embedded Epode appends what it receives to, one JSON object per line (`kind`: `telemetry`, `consent`, `report`; the request body; the status it answered). When it cannot be written (a read-only container), a file of the same name in the temporary directory, else none; a warning says which.",
            dev_log,
            |c| c.dev.as_ref().map_or("<not used>".to_owned(), |d| d.log.display().to_string()),
        ),
        DEV_LOG_MAX_BYTES: u64 = bounded(
            "dev_log_max_bytes",
            &["EPODE_SIDECAR_DEV_LOG_MAX_BYTES"],
            Some("67108864"),
            Accepts::whole("bytes", 1024, u64::MAX),
            "With `--dev`: the JSON-lines file stops growing past this size (one warning says so).",
            number,
            |c| c.dev.as_ref().map_or("<not used>".to_owned(), |d| d.log_max_bytes.to_string()),
        ),
    }
}
