//! Held calls on any replica: a retry that continues a call another replica holds is
//! forwarded to it. The held call's `requestState` names its replica's URL
//! (`EPODE_SIDECAR_REPLICA_URL`), sealed under the product key every replica shares
//! (`upstream::held`), so no client chooses where a retry goes; this module sends the retry
//! there and passes back what the owner answers.
//!
//! The owner checks the retry again as if it had come straight to it: its token, its scopes,
//! its caller. A caller known only by its address is the one address the first replica saw:
//! the forwarded retry carries it in [`FORWARDED`], sealed and valid for 30 seconds, which
//! the owner's front takes instead of the connection's (and which the front removes from
//! every request that does not carry a valid one). A forwarded retry is never forwarded again.
//!
//! Bounds: the owner must accept the connection within a second (else it is gone, and the
//! client is told to start the call again), and begin its answer within the upstream
//! timeout; a JSON answer is read whole up to `EPODE_SIDECAR_MAX_UPSTREAM_ANSWER_BYTES`, in
//! the memory budget until written, an event stream passed on chunk by chunk, as the owner
//! bounds its events. A retry being forwarded is a request in flight, and its caller's.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use bytes::Bytes;
use hmac::{Hmac, Mac};
use http::{header, HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use http_body_util::BodyExt as _;
use sha2::Sha256;

use crate::body::{self, Body, BoxError};
use crate::budget::{MemoryBudget, Reservation};
use crate::error::{Error, ErrorKind};
use crate::upstream::{unix_now, Refusal};

/// The header a forwarded retry carries: the client's address, sealed. The sidecar's own:
/// taken off every request at the front.
pub(crate) const FORWARDED: HeaderName = HeaderName::from_static("epode-sidecar-forwarded");

/// How long a sealed address is taken.
const FORWARDED_FOR: u64 = 30;

/// How long the owner has to accept the connection before it counts as gone.
const CONNECT_WITHIN: Duration = Duration::from_secs(1);

/// The headers not passed on, either way: the connection's own, and what the sidecar sets.
const NOT_PASSED: [HeaderName; 8] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::CONTENT_LENGTH,
    header::TE,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
    HeaderName::from_static("keep-alive"),
    FORWARDED,
];

/// What the replicas of one deployment share: the key that seals a forwarded address, and
/// the client that sends retries to their owners.
pub(crate) struct Replicas {
    mac: Hmac<Sha256>,
    http: reqwest::Client,
    /// How long the owner may take to begin its answer.
    head_within: Duration,
    /// The longest JSON answer passed on.
    max_answer: usize,
    /// Where a JSON answer's bytes are counted while it is read and until it is written.
    budget: Arc<MemoryBudget>,
}

/// A retry to forward: what the client sent, as the front let it in.
pub(crate) struct Retry<'a> {
    pub(crate) headers: &'a HeaderMap,
    /// The client's `Authorization`, as it sent it (the front may have taken it off the
    /// headers going upstream).
    pub(crate) authorization: Option<&'a HeaderValue>,
    /// The client's address, as the front decided it.
    pub(crate) address: IpAddr,
    pub(crate) body: Bytes,
}

impl Replicas {
    /// The replicas keyed by the product key `secret`; `head_within`: the upstream timeout.
    pub(crate) fn new(
        secret: &str,
        head_within: Duration,
        (max_answer, budget): (usize, Arc<MemoryBudget>),
    ) -> Result<Replicas, String> {
        let mut derive =
            <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes()).map_err(|e| e.to_string())?;
        derive.update(b"epode-sidecar forwarded retry");
        let key = derive.finalize().into_bytes();
        let http = reqwest::Client::builder()
            .user_agent(concat!("epode-sidecar/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(CONNECT_WITHIN)
            .pool_idle_timeout(Duration::from_secs(30))
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()
            .map_err(|e| format!("cannot build the client that forwards retries: {e}"))?;
        Ok(Replicas {
            mac: <Hmac<Sha256> as Mac>::new_from_slice(&key).map_err(|e| e.to_string())?,
            http,
            head_within,
            max_answer,
            budget,
        })
    }

    /// `address`, sealed for [`FORWARDED`].
    fn seal(&self, address: IpAddr, now: u64) -> HeaderValue {
        let mut payload = (now + FORWARDED_FOR).to_le_bytes().to_vec();
        match address {
            IpAddr::V4(a) => payload.extend_from_slice(&a.octets()),
            IpAddr::V6(a) => payload.extend_from_slice(&a.octets()),
        }
        let mut mac = self.mac.clone();
        mac.update(&payload);
        let tag = mac.finalize().into_bytes();
        let value = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(&payload),
            URL_SAFE_NO_PAD.encode(tag)
        );
        HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("-"))
    }

    /// The client address a forwarded retry's [`FORWARDED`] holds, when another replica of
    /// this deployment sealed it in the last 30 seconds.
    pub(crate) fn forwarded_for(&self, value: &HeaderValue) -> Option<IpAddr> {
        self.open(value.to_str().ok()?, unix_now())
    }

    fn open(&self, value: &str, now: u64) -> Option<IpAddr> {
        let (payload, tag) = value.split_once('.')?;
        let payload = URL_SAFE_NO_PAD.decode(payload).ok()?;
        let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
        let mut mac = self.mac.clone();
        mac.update(&payload);
        mac.verify_slice(&tag).ok()?;
        let (expires, address) = payload.split_at_checked(8)?;
        if now > u64::from_le_bytes(expires.try_into().ok()?) {
            return None;
        }
        match address.len() {
            4 => Some(IpAddr::from(<[u8; 4]>::try_from(address).ok()?)),
            16 => Some(IpAddr::from(<[u8; 16]>::try_from(address).ok()?)),
            _ => None,
        }
    }

    /// Sends `retry` to `owner` and answers what it answers; the outcome's label for the
    /// metrics beside it.
    pub(crate) async fn forward(
        &self,
        owner: url::Url,
        retry: Retry<'_>,
    ) -> (Result<Response<Body>, Error>, &'static str) {
        let mut headers = retry.headers.clone();
        for name in &NOT_PASSED {
            headers.remove(name);
        }
        if let Some(a) = retry.authorization {
            headers.insert(header::AUTHORIZATION, a.clone());
        }
        headers.insert(FORWARDED, self.seal(retry.address, unix_now()));
        let sent = self
            .http
            .post(owner)
            .headers(headers)
            .body(retry.body)
            .timeout(self.head_within + CONNECT_WITHIN)
            .send();
        let answer = match tokio::time::timeout(self.head_within + CONNECT_WITHIN, sent).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) if e.is_connect() => return (Err(Refusal::OwnerGone.error()), "owner_gone"),
            Ok(Err(e)) if !e.is_timeout() => {
                let e = Error::new(
                    ErrorKind::UpstreamFailed,
                    format!("the replica of the sidecar that holds this call failed to answer its retry ({e}); start the call again without inputResponses and requestState"),
                );
                return (Err(e), "failed");
            }
            _ => {
                let e = Error::new(
                    ErrorKind::UpstreamTimeout(self.head_within),
                    "the replica of the sidecar that holds this call did not begin its answer in time",
                );
                return (Err(e), "timeout");
            }
        };
        (self.passed_back(answer).await, "answered")
    }

    /// The owner's answer as the client's: its status and headers (not the connection's),
    /// its body whole when it is JSON, passed on as it comes when it is a stream.
    async fn passed_back(&self, answer: reqwest::Response) -> Result<Response<Body>, Error> {
        let status = answer.status();
        let mut headers = answer.headers().clone();
        for name in &NOT_PASSED {
            headers.remove(name);
        }
        let streams = body::is_event_stream(&headers);
        let body = if streams {
            streamed(answer)
        } else {
            let (bytes, held) = self.whole(answer).await?;
            body::held(bytes, held)
        };
        let mut resp = Response::new(body);
        *resp.status_mut() = StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::OK);
        *resp.headers_mut() = headers;
        Ok(resp)
    }

    /// A JSON answer, read whole within the upstream timeout, the answer limit and the memory
    /// budget (its bytes stay counted until they are written).
    async fn whole(&self, mut answer: reqwest::Response) -> Result<(Bytes, Reservation), Error> {
        let read = async {
            let mut whole = Vec::new();
            let mut held = self.budget.start();
            while let Some(chunk) = answer.chunk().await.map_err(|e| {
                Error::new(
                    ErrorKind::UpstreamFailed,
                    format!("the replica of the sidecar that holds this call broke off its answer ({e})"),
                )
            })? {
                if whole.len() + chunk.len() > self.max_answer {
                    return Err(Error::new(
                        ErrorKind::UpstreamTooLarge {
                            limit: self.max_answer,
                        },
                        "the answer of the replica that holds this call",
                    ));
                }
                if !held.grow(chunk.len()) {
                    return Err(Error::new(
                        ErrorKind::Overloaded { retry_after: 1 },
                        "its memory budget is spent",
                    ));
                }
                whole.extend_from_slice(&chunk);
            }
            Ok((Bytes::from(whole), held))
        };
        tokio::time::timeout(self.head_within, read)
            .await
            .unwrap_or_else(|_| {
                Err(Error::new(
                    ErrorKind::UpstreamTimeout(self.head_within),
                    "the replica of the sidecar that holds this call did not finish its answer in time",
                ))
            })
    }
}

/// An event stream passed on chunk by chunk (the owner bounds its events; one chunk at a time
/// is held here).
fn streamed(answer: reqwest::Response) -> Body {
    let chunks = futures_util::stream::unfold(Some(answer), |answer| async move {
        let mut answer = answer?;
        match answer.chunk().await {
            Ok(Some(chunk)) => Some((Ok(http_body::Frame::data(chunk)), Some(answer))),
            Ok(None) => None,
            Err(e) => Some((Err(Box::new(e) as BoxError), None)),
        }
    });
    http_body_util::StreamBody::new(chunks).boxed_unsync()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replicas(key: &str) -> Replicas {
        let budget = MemoryBudget::new(1 << 20);
        Replicas::new(key, Duration::from_secs(1), (1024, budget)).unwrap()
    }

    #[test]
    fn an_address_is_taken_only_sealed_by_the_deployment_and_fresh() {
        let r = replicas("k");
        for address in ["203.0.113.9", "2001:db8::7"] {
            let address: IpAddr = address.parse().unwrap();
            let now = unix_now();
            let sealed = r.seal(address, now);
            assert_eq!(r.forwarded_for(&sealed), Some(address));
            let value = sealed.to_str().unwrap();
            // Another deployment's key, a stale seal, an altered one, a client's own value.
            assert_eq!(replicas("other").open(value, now), None);
            assert_eq!(r.open(value, now + FORWARDED_FOR + 1), None);
            let (payload, tag) = value.split_once('.').unwrap();
            let other = r.seal("198.51.100.1".parse().unwrap(), now);
            let (other_payload, _) = other.to_str().unwrap().split_once('.').unwrap();
            assert_eq!(r.open(&format!("{other_payload}.{tag}"), now), None);
            assert_eq!(r.open(payload, now), None);
            assert_eq!(r.open("127.0.0.1", now), None);
        }
    }
}
