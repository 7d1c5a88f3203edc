//! The local trial (`--dev`): for a product team without an Epode account yet. An embedded
//! Epode (`epode`, its admission rules in `rules`) listens on a loopback port of its own
//! (bounded as every listener is: its share of the connection cap, the head, body and idle
//! deadlines) and the sidecar's Epode client talks to it exactly as to the real service, with
//! an ephemeral key; what happens is published on a `bus` and shown live by the `console`
//! page the sidecar serves at `/_dev/`.

mod bus;
mod console;
mod epode;
mod rules;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Limited};
use hyper::body::Incoming;

use self::bus::Bus;
use self::epode::{DevEpode, BODY_LIMIT};
use crate::body::{self, Body};
use crate::config::Config;
use crate::listener::Bounds;
use crate::observe::Observer;
use crate::server::Mounted;

/// The running trial: the console's bus, the embedded Epode until it is served, and what its
/// start lines say.
pub(crate) struct Trial {
    bus: Arc<Bus>,
    listener: tokio::net::TcpListener,
    epode: Arc<DevEpode>,
    embedded: SocketAddr,
    /// Where the binding reaches the embedded Epode.
    epode_url: url::Url,
    /// Where the record goes (`None`: nowhere writable, the console alone shows it).
    record: Option<std::path::PathBuf>,
}

impl Trial {
    /// Binds the embedded Epode on a free loopback port (on the current runtime); the binding
    /// is pointed at [`Trial::epode_url`], and [`Trial::serve`] then serves it.
    pub(crate) fn start(config: &Config) -> Result<Self, String> {
        let Some(dev) = config.dev.clone() else {
            return Err("the local trial is off".to_owned());
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .and_then(|l| tokio::net::TcpListener::from_std(l))
            .map_err(|e| format!("cannot listen for the embedded Epode: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("the embedded Epode's address: {e}"))?;
        let origin = format!("http://{addr}");
        let bus = Bus::new(&config.path, config.auth.is_some());
        let key = config
            .feedback
            .key
            .clone()
            .ok_or("--dev makes its own key, but there is none")?;
        let epode = DevEpode::new(key, config.feedback.mode, origin.clone(), &dev, bus.clone())?;
        let record = epode.record_path();
        let epode_url = url::Url::parse(&origin).map_err(|e| e.to_string())?;
        Ok(Trial {
            bus,
            listener,
            epode: Arc::new(epode),
            embedded: addr,
            epode_url,
            record,
        })
    }

    /// Where the binding reaches the embedded Epode (in place of the real service's API).
    pub(crate) fn epode_url(&self) -> url::Url {
        self.epode_url.clone()
    }

    /// What the request path and the binding publish to: the console's bus.
    pub(crate) fn observer(&self) -> Arc<dyn Observer> {
        self.bus.clone()
    }

    /// The console's routes, for the MCP listener.
    pub(crate) fn console(&self) -> Arc<dyn Mounted> {
        Arc::new(console::Console(self.bus.clone()))
    }

    /// What ends the console's streams when the sidecar stops.
    pub(crate) fn closer(&self) -> Closer {
        Closer(self.bus.clone())
    }

    /// Serves the embedded Epode within `bounds`, until the process ends (telemetry queued
    /// at shutdown is still delivered to it).
    pub(crate) fn serve(self, bounds: Bounds) {
        tokio::spawn(serve(self.listener, self.epode, bounds));
    }

    /// The start lines, once the listener is bound at `local`: what the trial is, where MCP
    /// clients connect, the console, and one command to try.
    pub(crate) fn announce(&self, config: &Config, local: SocketAddr) {
        let scheme = if config.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let origin = format!("{scheme}://{local}");
        let record = self.record.as_ref().map_or_else(
            || "no record is kept (see above); the console shows everything".to_owned(),
            |r| format!("what arrives is also appended to {}", r.display()),
        );
        tracing::info!(
            target: "epode_sidecar::dev",
            mode = config.feedback.mode.as_str(),
            embedded_epode = %self.embedded,
            "--dev: the local trial is on. Feedback goes to an embedded Epode on this machine, with an ephemeral key; nothing reaches the real Epode; {record}"
        );
        tracing::info!(target: "epode_sidecar::dev", "--dev: MCP clients connect to {origin}{}", config.path);
        tracing::info!(target: "epode_sidecar::dev", "--dev: watch it live on the console: {origin}/_dev/");
        if let Some(auth) = &config.auth {
            let scopes = if auth.scopes.is_empty() {
                String::new()
            } else {
                format!(" with the scopes {}", auth.scopes.join(" "))
            };
            tracing::info!(
                target: "epode_sidecar::dev",
                "--dev: authorization is on (EPODE_SIDECAR_AUTH={}): every MCP request needs an access token from {} for {}{scopes}. An MCP client with OAuth gets one itself; for curl, put one in TOKEN (e.g. a client-credentials grant at the issuer's token endpoint): without a token the answer is 401 with the challenge, with an empty one 400",
                auth.mode.as_str(),
                auth.issuer,
                auth.resource
            );
        }
        tracing::info!(
            target: "epode_sidecar::dev",
            "--dev: try it (lists the tools; then call one the same way with tools/call): {}",
            console::try_command(&format!("{origin}{}", config.path), config.auth.is_some())
        );
    }
}

/// Ends every console stream (the sidecar is stopping).
pub(crate) struct Closer(Arc<Bus>);

impl Closer {
    pub(crate) fn close(&self) {
        self.0.close();
    }
}

async fn serve(listener: tokio::net::TcpListener, epode: Arc<DevEpode>, bounds: Bounds) {
    let within = bounds.body_timeout();
    bounds
        .accept_until(&listener, std::future::pending(), |stream, admitted| {
            let epode = epode.clone();
            let bounds = bounds.clone();
            tokio::spawn(async move {
                let handler = move |req| {
                    let epode = epode.clone();
                    async move { answer(&epode, req, within).await }
                };
                bounds.serve(stream, admitted, handler, None).await;
            });
        })
        .await;
}

async fn answer(epode: &DevEpode, req: Request<Incoming>, within: Duration) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let bearer = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|v| v.trim().to_owned());
    let json_body = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(';').next().unwrap_or_default().trim() == "application/json");
    let reply = if parts.method == http::Method::POST {
        let read = Limited::new(body, BODY_LIMIT).collect();
        let Ok(read) = tokio::time::timeout(within, read).await else {
            return body_timed_out(within);
        };
        let bytes = read.ok().map(|c| c.to_bytes());
        epode.answer(
            parts.uri.path(),
            bearer.as_deref(),
            json_body,
            bytes.as_deref(),
        )
    } else {
        epode.answer("", None, false, None)
    };
    let ct = if reply.json {
        body::JSON
    } else {
        "text/plain; charset=utf-8"
    };
    body::answer(reply.status, Some(ct), body::full(reply.body))
}

/// A body that did not arrive within the body timeout: 408, and the connection is closed.
fn body_timed_out(within: Duration) -> Response<Body> {
    let message = format!(
        "Request timeout: the body did not arrive within {}",
        humantime::format_duration(within)
    );
    let mut resp = body::error(StatusCode::REQUEST_TIMEOUT, &message);
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}
