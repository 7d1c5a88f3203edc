//! TLS on both sides (rustls: no OpenSSL anywhere), and the admin listener.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::settings::{duration, invalid, setting, ConfigError, Setting};
use super::{duration_in, value, Scalar};

/// The listener's certificate and key (PEM files), reloaded when they change.
#[derive(Debug, Clone)]
pub(crate) struct ListenerTls {
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
    /// How often the files are checked for a change (SIGHUP reloads at once).
    pub(crate) reload_every: Duration,
}

/// How the sidecar verifies an `https://` upstream, and what it presents to it.
#[derive(Debug, Clone, Default)]
pub(crate) struct UpstreamTls {
    /// Extra trusted roots (PEM), besides the system's.
    pub(crate) ca_file: Option<PathBuf>,
    /// A client certificate and key (PEM) for upstreams that ask for one.
    pub(crate) client_cert: Option<(PathBuf, PathBuf)>,
}

#[derive(Default)]
pub(super) struct RawTls {
    pub(super) tls_cert: Option<Scalar>,
    pub(super) tls_key: Option<Scalar>,
    pub(super) tls_reload: Option<Scalar>,
    pub(super) ca_file: Option<Scalar>,
    pub(super) upstream_client_cert: Option<Scalar>,
    pub(super) upstream_client_key: Option<Scalar>,
    pub(super) admin_listen: Option<Scalar>,
}

/// The checked TLS settings: the listener's, the upstream's, and the admin address.
pub(super) type Checked = (Option<ListenerTls>, UpstreamTls, Option<SocketAddr>);

fn existing_file(raw: Option<Scalar>, key: &str) -> Result<Option<PathBuf>, ConfigError> {
    let Some(path) = value(raw) else {
        return Ok(None);
    };
    if !std::path::Path::new(&path).is_file() {
        return Err(invalid(key, &path));
    }
    Ok(Some(PathBuf::from(path)))
}

/// Both or neither of a certificate and its key.
fn pair(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    cert_key: &str,
    key_key: &str,
) -> Result<Option<(PathBuf, PathBuf)>, ConfigError> {
    match (cert, key) {
        (Some(c), Some(k)) => Ok(Some((c, k))),
        (None, None) => Ok(None),
        (Some(c), None) => Err(invalid(
            key_key,
            &format!("<unset, while {cert_key} is {}>", c.display()),
        )),
        (None, Some(k)) => Err(invalid(
            cert_key,
            &format!("<unset, while {key_key} is {}>", k.display()),
        )),
    }
}

pub(super) fn check(raw: RawTls) -> Result<Checked, ConfigError> {
    let listener = pair(
        existing_file(raw.tls_cert, "tls_cert")?,
        existing_file(raw.tls_key, "tls_key")?,
        "tls_cert",
        "tls_key",
    )?;
    let reload_every = duration_in(
        raw.tls_reload,
        "tls_reload",
        Duration::from_millis(100)..=Duration::from_secs(24 * 3600),
    )?;
    let listener = listener.map(|(cert, key)| ListenerTls {
        cert,
        key,
        reload_every,
    });
    let upstream = UpstreamTls {
        ca_file: existing_file(raw.ca_file, "ca_file")?,
        client_cert: pair(
            existing_file(raw.upstream_client_cert, "upstream_client_cert")?,
            existing_file(raw.upstream_client_key, "upstream_client_key")?,
            "upstream_client_cert",
            "upstream_client_key",
        )?,
    };
    let admin = value(raw.admin_listen)
        .map(|a| a.parse().map_err(|_| invalid("admin_listen", &a)))
        .transpose()?;
    Ok((listener, upstream, admin))
}

fn path(p: &Option<PathBuf>) -> String {
    p.as_ref()
        .map_or_else(|| "<unset>".to_owned(), |p| p.display().to_string())
}

pub(super) const TLS: &[Setting] = &[
    setting(
        "tls_cert",
        &["EPODE_SIDECAR_TLS_CERT"],
        None,
        "the path of a PEM file holding the certificate chain",
        "With `tls_key`, the listener serves HTTPS (HTTP/1.1 and HTTP/2 by ALPN). The files are read again when they change and on SIGHUP; a bad new pair is refused with an error and the old one kept.",
        |c| path(&c.tls.as_ref().map(|t| t.cert.clone())),
    ),
    setting(
        "tls_key",
        &["EPODE_SIDECAR_TLS_KEY"],
        None,
        "the path of a PEM file holding the private key",
        "The listener's private key (see `tls_cert`).",
        |c| path(&c.tls.as_ref().map(|t| t.key.clone())),
    ),
    setting(
        "tls_reload",
        &["EPODE_SIDECAR_TLS_RELOAD"],
        Some("10s"),
        "a duration from 100ms to 24h",
        "How often the listener's certificate files are checked for a change.",
        |c| {
            c.tls
                .as_ref()
                .map_or_else(|| "<no TLS>".to_owned(), |t| duration(t.reload_every))
        },
    ),
    setting(
        "ca_file",
        &["EPODE_SIDECAR_CA_FILE"],
        None,
        "the path of a PEM file of CA certificates",
        "Roots trusted for an `https://` upstream, besides the system's (the bundled Mozilla roots when the system has none).",
        |c| path(&c.upstream_tls.ca_file),
    ),
    setting(
        "upstream_client_cert",
        &["EPODE_SIDECAR_UPSTREAM_CLIENT_CERT"],
        None,
        "the path of a PEM file holding a certificate chain",
        "With `upstream_client_key`, the certificate the sidecar presents to an `https://` upstream that asks for one.",
        |c| path(&c.upstream_tls.client_cert.as_ref().map(|p| p.0.clone())),
    ),
    setting(
        "upstream_client_key",
        &["EPODE_SIDECAR_UPSTREAM_CLIENT_KEY"],
        None,
        "the path of a PEM file holding a private key",
        "The key of `upstream_client_cert`.",
        |c| path(&c.upstream_tls.client_cert.as_ref().map(|p| p.1.clone())),
    ),
    setting(
        "admin_listen",
        &["EPODE_SIDECAR_ADMIN_LISTEN"],
        None,
        "a socket address such as 127.0.0.1:9090 or [::]:9090",
        "A second, plain-HTTP listener for `/metrics`, `/healthz` and `/readyz`. Set, `/metrics` is served only there, never on the MCP port. Unset: all three on the MCP listener.",
        |c| c.admin_listen.map_or_else(|| "<unset>".to_owned(), |a| a.to_string()),
    ),
];
