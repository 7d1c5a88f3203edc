//! TLS on both sides (rustls: no OpenSSL anywhere), and the admin listener: their settings
//! and the [`ListenerTls`] and [`UpstreamTls`] built from them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::setting::{
    a_duration, bounded, duration, setting, settings, Accepts, Bad, Layers, Refused, Setting,
};
use super::types::{ListenerTls, UpstreamTls};

/// The checked TLS settings: the listener's, the upstream's, and the admin address.
pub(super) type Checked = (Option<ListenerTls>, UpstreamTls, Option<SocketAddr>);

fn existing_file(path: &str) -> Result<PathBuf, Bad> {
    if Path::new(path).is_file() {
        Ok(PathBuf::from(path))
    } else {
        Err(Bad::Whole)
    }
}

/// Both or neither of a certificate and its key.
fn pair(
    l: &Layers,
    cert: &Setting<PathBuf>,
    key: &Setting<PathBuf>,
) -> Result<Option<(PathBuf, PathBuf)>, Refused> {
    // Both read first, so a bad value in each is reported.
    let (c, k) = (l.optional(cert), l.optional(key));
    match (c?, k?) {
        (Some(c), Some(k)) => Ok(Some((c, k))),
        (None, None) => Ok(None),
        (Some(c), None) => Err(l.refuse(
            &key.doc,
            key.doc.invalid(&format!(
                "<unset, while {} is {}>",
                cert.doc.key,
                c.display()
            )),
        )),
        (None, Some(k)) => Err(l.refuse(
            &cert.doc,
            cert.doc.invalid(&format!(
                "<unset, while {} is {}>",
                key.doc.key,
                k.display()
            )),
        )),
    }
}

pub(super) fn read(l: &Layers) -> Result<Checked, Refused> {
    let listener = pair(l, &TLS_CERT, &TLS_KEY);
    let reload_every = l.get(&TLS_RELOAD);
    let ca_file = l.optional(&CA_FILE);
    let client_cert = pair(l, &UPSTREAM_CLIENT_CERT, &UPSTREAM_CLIENT_KEY);
    let admin_listen = l.optional(&ADMIN_LISTEN);
    let reload_every = reload_every?;
    let listener = listener?.map(|(cert, key)| ListenerTls {
        cert,
        key,
        reload_every,
    });
    let upstream = UpstreamTls {
        ca_file: ca_file?,
        client_cert: client_cert?,
    };
    Ok((listener, upstream, admin_listen?))
}

fn path(p: &Option<PathBuf>) -> String {
    p.as_ref()
        .map_or_else(|| "<unset>".to_owned(), |p| p.display().to_string())
}

settings! {
    /// TLS on both sides, and the admin listener.
    pub(super) TLS {
        TLS_CERT: PathBuf = setting(
            "tls_cert",
            &["EPODE_SIDECAR_TLS_CERT"],
            None,
            "the path of a PEM file holding the certificate chain",
            "With `tls_key`, the listener serves HTTPS (HTTP/1.1 and HTTP/2 by ALPN). The files are read again when they change and on SIGHUP; a bad new pair is refused with an error and the old one kept.",
            existing_file,
            |c| path(&c.tls.as_ref().map(|t| t.cert.clone())),
        ),
        TLS_KEY: PathBuf = setting(
            "tls_key",
            &["EPODE_SIDECAR_TLS_KEY"],
            None,
            "the path of a PEM file holding the private key",
            "The listener's private key (see `tls_cert`).",
            existing_file,
            |c| path(&c.tls.as_ref().map(|t| t.key.clone())),
        ),
        TLS_RELOAD: Duration = bounded(
            "tls_reload",
            &["EPODE_SIDECAR_TLS_RELOAD"],
            Some("10s"),
            Accepts::duration(Duration::from_millis(100), Duration::from_secs(24 * 3600), ""),
            "How often the listener's certificate files are checked for a change.",
            a_duration,
            |c| {
                c.tls
                    .as_ref()
                    .map_or_else(|| "<no TLS>".to_owned(), |t| duration(t.reload_every))
            },
        ),
        CA_FILE: PathBuf = setting(
            "ca_file",
            &["EPODE_SIDECAR_CA_FILE"],
            None,
            "the path of a PEM file of CA certificates",
            "Roots trusted for an `https://` upstream, besides the system's (the bundled Mozilla roots when the system has none).",
            existing_file,
            |c| path(&c.upstream_tls.ca_file),
        ),
        UPSTREAM_CLIENT_CERT: PathBuf = setting(
            "upstream_client_cert",
            &["EPODE_SIDECAR_UPSTREAM_CLIENT_CERT"],
            None,
            "the path of a PEM file holding a certificate chain",
            "With `upstream_client_key`, the certificate the sidecar presents to an `https://` upstream that asks for one.",
            existing_file,
            |c| path(&c.upstream_tls.client_cert.as_ref().map(|p| p.0.clone())),
        ),
        UPSTREAM_CLIENT_KEY: PathBuf = setting(
            "upstream_client_key",
            &["EPODE_SIDECAR_UPSTREAM_CLIENT_KEY"],
            None,
            "the path of a PEM file holding a private key",
            "The key of `upstream_client_cert`.",
            existing_file,
            |c| path(&c.upstream_tls.client_cert.as_ref().map(|p| p.1.clone())),
        ),
        ADMIN_LISTEN: SocketAddr = setting(
            "admin_listen",
            &["EPODE_SIDECAR_ADMIN_LISTEN"],
            None,
            "a socket address such as 127.0.0.1:9090 or [::]:9090",
            "A second, plain-HTTP listener for `/metrics`, `/healthz` and `/readyz`. Set, `/metrics` is served only there, never on the MCP port. Unset: all three on the MCP listener.",
            |a| a.parse().map_err(|_| Bad::Whole),
            |c| c.admin_listen.map_or_else(|| "<unset>".to_owned(), |a| a.to_string()),
        ),
    }
}
