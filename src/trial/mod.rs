//! The local trial (`--dev`): for a product team without an Epode account yet. An embedded
//! Epode (`epode`, its admission rules in `rules`) listens on a loopback port of its own
//! (bounded as every listener is: its share of the connection cap, the head, body and idle
//! deadlines) and the sidecar's Epode client talks to it exactly as to the real service, with
//! an ephemeral key; what happens is published on a `bus` and shown live by the `console`
//! page the sidecar serves at `/_dev/`.

pub(crate) mod bus;
pub(crate) mod console;
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
use crate::config::{Config, DevConfig};
use crate::server::Bounds;

/// The trial: the console's bus, and the embedded Epode until it is served.
pub(crate) struct Trial {
    pub(crate) bus: Arc<Bus>,
    listener: tokio::net::TcpListener,
    epode: Arc<DevEpode>,
}

impl Trial {
    /// Binds the embedded Epode on a free loopback port (on the current runtime) and points
    /// the binding at it; [`Trial::serve`] then serves it.
    pub(crate) fn start(config: &mut Config) -> Result<Self, String> {
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
        let bus = Bus::new();
        let key = config
            .feedback
            .key
            .clone()
            .ok_or("--dev makes its own key, but there is none")?;
        let epode = DevEpode::new(key, config.feedback.mode, origin.clone(), &dev, bus.clone())?;
        config.feedback.api_url = url::Url::parse(&origin).map_err(|e| e.to_string())?;
        announce(config, &dev, addr);
        Ok(Trial {
            bus,
            listener,
            epode: Arc::new(epode),
        })
    }

    /// Serves the embedded Epode within `bounds`, until the process ends (telemetry queued
    /// at shutdown is still delivered to it).
    pub(crate) fn serve(self, bounds: Bounds) {
        tokio::spawn(serve(self.listener, self.epode, bounds));
    }
}

fn announce(config: &Config, dev: &DevConfig, epode: SocketAddr) {
    tracing::warn!(
        target: "epode_sidecar::dev",
        mode = config.feedback.mode.as_str(),
        embedded_epode = %epode,
        record = %dev.log.display(),
        console = %format!("http://{}/_dev/", config.listen),
        "--dev: the local trial is on. Feedback goes to an embedded Epode on this machine, with an ephemeral key; nothing reaches the real Epode. Watch it live on the console; what arrives is also appended to the record"
    );
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
    let mut resp = Response::new(body::full(reply.body));
    *resp.status_mut() = reply.status;
    let ct = if reply.json {
        "application/json"
    } else {
        "text/plain; charset=utf-8"
    };
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    resp
}

/// A body that did not arrive within the body timeout: 408, and the connection is closed.
fn body_timed_out(within: Duration) -> Response<Body> {
    let message = format!(
        "Request timeout: the body did not arrive within {}",
        humantime::format_duration(within)
    );
    let mut resp = body::json(
        StatusCode::REQUEST_TIMEOUT,
        serde_json::json!({ "error": message }).to_string(),
    );
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}
