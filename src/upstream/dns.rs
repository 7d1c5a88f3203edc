//! Name resolution for the upstream pool without glibc's NSS (so the statically linked binary
//! resolves names in a `FROM scratch` image): hickory-resolver reading `/etc/resolv.conf` and
//! `/etc/hosts`, as the Epode client's reqwest does with its `hickory-dns` feature. IP
//! literals never reach it (the connector connects to them directly).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use hickory_resolver::config::LookupIpStrategy;
use hickory_resolver::TokioResolver;
use hyper_util::client::legacy::connect::dns::Name;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A resolver shared by every worker's pool, built on first use (it reads the system's DNS
/// configuration then; a missing one is an error of that lookup, named).
#[derive(Clone, Default)]
pub(crate) struct Resolver {
    inner: Arc<OnceLock<Result<TokioResolver, String>>>,
}

fn build() -> Result<TokioResolver, String> {
    let mut builder = TokioResolver::builder_tokio()
        .map_err(|e| format!("no DNS configuration (/etc/resolv.conf): {e}"))?;
    builder.options_mut().ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
    Ok(builder.build())
}

impl tower_service::Service<Name> for Resolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let inner = self.inner.clone();
        Box::pin(async move {
            let resolver = inner.get_or_init(build).as_ref().map_err(|e| e.clone())?;
            let found = resolver.lookup_ip(name.as_str()).await?;
            // The connector sets the port.
            let addrs: Vec<SocketAddr> = found.iter().map(|ip| SocketAddr::new(ip, 0)).collect();
            Ok(addrs.into_iter())
        })
    }
}
