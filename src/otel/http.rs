//! The OTLP exporter's HTTP client: the project's reqwest (rustls, no OpenSSL), behind the
//! exporter's `HttpClient` seam. `opentelemetry-otlp` 0.33 brings its own reqwest client only
//! for reqwest 0.13, a second HTTP stack beside ours; this newtype is the seam's whole
//! implementation (send, bounded response read).

use bytes::Bytes;
use http::{Request, Response};
use opentelemetry_http::{HttpClient, HttpError};

/// A collector's answer past this is cut (an OTLP answer is a few bytes of protobuf).
const MAX_ANSWER: usize = 64 * 1024;

#[derive(Debug, Clone)]
pub(super) struct Client(reqwest::Client);

impl Client {
    /// A client whose exports end within `timeout`, trusting the roots in `ca_file` too.
    pub(super) fn new(
        timeout: std::time::Duration,
        ca_file: Option<&std::path::Path>,
    ) -> Result<Client, String> {
        let mut builder = reqwest::Client::builder()
            .user_agent(concat!("epode-sidecar/", env!("CARGO_PKG_VERSION")))
            .timeout(timeout)
            .pool_idle_timeout(std::time::Duration::from_secs(30))
            .redirect(reqwest::redirect::Policy::none());
        if let Some(path) = ca_file {
            let pem = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let roots = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            for root in roots {
                builder = builder.add_root_certificate(root);
            }
        }
        builder
            .build()
            .map(Client)
            .map_err(|e| format!("cannot build the OTLP HTTP client: {e}"))
    }
}

/// A collector answer larger than [`MAX_ANSWER`].
#[derive(Debug)]
struct TooLarge;

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the collector's answer is over {MAX_ANSWER} bytes")
    }
}

impl std::error::Error for TooLarge {}

#[async_trait::async_trait]
impl HttpClient for Client {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let mut resp = self
            .0
            .request(parts.method, parts.uri.to_string())
            .headers(parts.headers)
            .body(body)
            .send()
            .await?;
        let mut answer = Response::builder().status(resp.status().as_u16());
        if let Some(h) = answer.headers_mut() {
            *h = std::mem::take(resp.headers_mut());
        }
        let mut read = Vec::new();
        while let Some(chunk) = resp.chunk().await? {
            if read.len() + chunk.len() > MAX_ANSWER {
                return Err(Box::new(TooLarge));
            }
            read.extend_from_slice(&chunk);
        }
        Ok(answer.body(Bytes::from(read))?)
    }
}
