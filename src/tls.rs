//! TLS with rustls on both sides: the listener's certificate (read from PEM files, read again
//! when they change or on SIGHUP, a bad new pair refused and the old one kept), and the
//! client configuration for an `https://` upstream (the system's roots, or the bundled Mozilla
//! roots when the system has none, plus an optional CA file; an optional client certificate).

use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use rustls::crypto::ring::default_provider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::{ListenerTls, UpstreamTls};

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no PEM certificate in it", path.display()));
    }
    Ok(certs)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// The client configuration for an `https://` upstream.
pub(crate) fn client_config(tls: &UpstreamTls) -> Result<ClientConfig, String> {
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    let (added, _) = roots.add_parsable_certificates(native.certs);
    if added == 0 {
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    }
    if let Some(ca) = &tls.ca_file {
        for cert in certs(ca)? {
            roots
                .add(cert)
                .map_err(|e| format!("{}: {e}", ca.display()))?;
        }
    }
    let builder = ClientConfig::builder_with_provider(Arc::new(default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    // hyper-rustls sets ALPN itself (http/1.1 only).
    let config = match &tls.client_cert {
        Some((cert, key_path)) => builder
            .with_client_auth_cert(certs(cert)?, key(key_path)?)
            .map_err(|e| format!("{}: {e}", cert.display()))?,
        None => builder.with_no_client_auth(),
    };
    Ok(config)
}

/// The listener's certificate, replaced in place when its files change.
#[derive(Debug)]
pub(crate) struct ListenerCert {
    tls: ListenerTls,
    current: RwLock<(Arc<CertifiedKey>, Option<SystemTime>)>,
}

impl ListenerCert {
    fn load(tls: &ListenerTls) -> Result<Arc<CertifiedKey>, String> {
        let chain = certs(&tls.cert)?;
        let key = key(&tls.key)?;
        let signing = default_provider()
            .key_provider
            .load_private_key(key)
            .map_err(|e| format!("{}: {e}", tls.key.display()))?;
        let certified = CertifiedKey::new(chain, signing);
        certified
            .keys_match()
            .map_err(|e| format!("{} and {}: {e}", tls.cert.display(), tls.key.display()))?;
        Ok(Arc::new(certified))
    }

    fn modified(tls: &ListenerTls) -> Option<SystemTime> {
        let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        m(&tls.cert).max(m(&tls.key))
    }

    /// Reads the pair again when `force` or when a file changed; keeps the old pair (and
    /// says why) when the new one is bad.
    pub(crate) fn reload(&self, force: bool) {
        let modified = Self::modified(&self.tls);
        let current = self.current.read().unwrap_or_else(|e| e.into_inner()).1;
        if !force && modified == current {
            return;
        }
        match Self::load(&self.tls) {
            Ok(key) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = (key, modified);
                tracing::info!(cert = %self.tls.cert.display(), "TLS certificate loaded");
            }
            Err(e) => {
                tracing::error!(error = %e, "TLS certificate not reloaded; the previous one stays in use")
            }
        }
    }

    pub(crate) fn reload_every(&self) -> std::time::Duration {
        self.tls.reload_every
    }
}

impl ResolvesServerCert for ListenerCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .0
                .clone(),
        )
    }
}

/// The listener's TLS configuration (HTTP/2 and HTTP/1.1 by ALPN) and its reloadable
/// certificate.
pub(crate) fn server_config(
    tls: &ListenerTls,
) -> Result<(Arc<ServerConfig>, Arc<ListenerCert>), String> {
    let key = ListenerCert::load(tls)?;
    let cert = Arc::new(ListenerCert {
        tls: tls.clone(),
        current: RwLock::new((key, ListenerCert::modified(tls))),
    });
    let mut config = ServerConfig::builder_with_provider(Arc::new(default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_cert_resolver(cert.clone());
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((Arc::new(config), cert))
}
