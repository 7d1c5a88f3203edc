//! TLS with rustls on both sides: the official TypeScript client over HTTPS trusting a test
//! CA (and refused with another CA), the certificate reloaded on SIGHUP and when its files
//! change, and an `https://` upstream (the Python SDK under uvicorn's TLS) verified against a
//! CA file, refused without it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::*;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use serde_json::json;

/// A test CA, written as PEM into `dir`.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pem: PathBuf,
}

fn ca(dir: &Path, name: &str) -> Ca {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let pem = dir.join(format!("{name}.pem"));
    std::fs::write(&pem, issuer.pem()).unwrap();
    Ca { issuer, pem }
}

/// A certificate for 127.0.0.1 and localhost signed by `ca`: (chain, key) paths.
fn leaf(ca: &Ca, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let params =
        CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    let (c, k) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (c, k)
}

fn https_url(sc: &Sidecar) -> String {
    format!("https://127.0.0.1:{}/mcp", sc.addr.port())
}

fn client_trusting(ca: &Path) -> reqwest::Client {
    let cert = reqwest::Certificate::from_pem(&std::fs::read(ca).unwrap()).unwrap();
    reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(cert)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

async fn discover_over(client: &reqwest::Client, sc: &Sidecar) -> Result<u16, reqwest::Error> {
    let body = modern_body(json!(1), "server/discover", json!({}));
    let mut req = client.post(https_url(sc)).body(body.to_string());
    for (k, v) in modern_headers("server/discover", None) {
        req = req.header(k, v);
    }
    Ok(req.send().await?.status().as_u16())
}

#[tokio::test]
async fn the_typescript_client_connects_over_https_with_the_test_ca() {
    let dir = tempfile::tempdir().unwrap();
    let good = ca(dir.path(), "good-ca");
    let other = ca(dir.path(), "other-ca");
    let (cert, key) = leaf(&good, dir.path(), "sidecar");
    let up = Upstream::start(UpstreamKind::Python);
    let sc = Sidecar::start(
        &up.url(),
        &[
            ("EPODE_SIDECAR_TLS_CERT", cert.to_str().unwrap()),
            ("EPODE_SIDECAR_TLS_KEY", key.to_str().unwrap()),
        ],
    );
    let ca_env = |p: &Path| vec![("NODE_EXTRA_CA_CERTS", p.to_str().unwrap().to_owned())];
    let env = ca_env(&good.pem);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    for mode in ["pin", "legacy"] {
        let out = ts_call_env(
            &https_url(&sc),
            mode,
            Some(("add", &json!({"a": 2, "b": 3}))),
            &[],
            &env,
        );
        assert_eq!(
            out["result"]["structuredContent"]["sum"], 5,
            "{mode}: {out}"
        );
    }
    let env = ca_env(&other.pem);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let refused = ts_call_env(&https_url(&sc), "pin", None, &[], &env);
    assert!(
        refused.get("error").is_some(),
        "a client trusting another CA connected: {refused}"
    );
    // HTTP/2 by ALPN as well as HTTP/1.1.
    let h2 = client_trusting(&good.pem);
    let body = modern_body(json!(1), "tools/list", json!({}));
    let mut req = h2
        .post(https_url(&sc))
        .version(reqwest::Version::HTTP_2)
        .body(body.to_string());
    for (k, v) in modern_headers("tools/list", None) {
        req = req.header(k, v);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(
        (resp.status().as_u16(), resp.version()),
        (200, reqwest::Version::HTTP_2)
    );
}

/// Waits (up to 10 s) until a client trusting `ca` is served: a reload has taken effect.
async fn served_with(ca: &Ca, sc: &Sidecar) {
    eventually_async(Duration::from_secs(10), || async {
        matches!(discover_over(&client_trusting(&ca.pem), sc).await, Ok(s) if s == 200)
    })
    .await;
}

#[tokio::test]
async fn the_certificate_is_reloaded_on_sighup_and_on_change() {
    let dir = tempfile::tempdir().unwrap();
    let first = ca(dir.path(), "first-ca");
    let second = ca(dir.path(), "second-ca");
    let (cert, key) = leaf(&first, dir.path(), "sidecar");
    let up = Upstream::start(UpstreamKind::Python);
    let sc = Sidecar::start(
        &up.url(),
        &[
            ("EPODE_SIDECAR_TLS_CERT", cert.to_str().unwrap()),
            ("EPODE_SIDECAR_TLS_KEY", key.to_str().unwrap()),
            ("EPODE_SIDECAR_TLS_RELOAD", "1h"),
        ],
    );
    assert_eq!(
        discover_over(&client_trusting(&first.pem), &sc)
            .await
            .unwrap(),
        200
    );
    // A bad pair is refused and the old one kept.
    std::fs::write(&key, "not a key").unwrap();
    std::process::Command::new("kill")
        .args(["-HUP", &sc.pid().to_string()])
        .status()
        .unwrap();
    // The reload was tried once the log says it was refused.
    let mut logs = Vec::new();
    let refused = |logs: &[String]| {
        logs.iter()
            .any(|l| l.contains("TLS certificate not reloaded"))
    };
    eventually_async(Duration::from_secs(10), || {
        logs.extend(sc.logs());
        std::future::ready(refused(&logs))
    })
    .await;
    assert_eq!(
        discover_over(&client_trusting(&first.pem), &sc)
            .await
            .unwrap(),
        200
    );
    assert!(refused(&logs));
    // A good new pair, signed by another CA, is taken on SIGHUP.
    let (new_cert, new_key) = leaf(&second, dir.path(), "renewed");
    std::fs::copy(&new_cert, &cert).unwrap();
    std::fs::copy(&new_key, &key).unwrap();
    std::process::Command::new("kill")
        .args(["-HUP", &sc.pid().to_string()])
        .status()
        .unwrap();
    served_with(&second, &sc).await;
    assert_eq!(
        discover_over(&client_trusting(&second.pem), &sc)
            .await
            .unwrap(),
        200
    );
    assert!(discover_over(&client_trusting(&first.pem), &sc)
        .await
        .is_err());

    // Without a signal, a change is noticed at the next check.
    let polled = Sidecar::start(
        &up.url(),
        &[
            ("EPODE_SIDECAR_TLS_CERT", cert.to_str().unwrap()),
            ("EPODE_SIDECAR_TLS_KEY", key.to_str().unwrap()),
            ("EPODE_SIDECAR_TLS_RELOAD", "200ms"),
        ],
    );
    assert_eq!(
        discover_over(&client_trusting(&second.pem), &polled)
            .await
            .unwrap(),
        200
    );
    tokio::time::sleep(Duration::from_millis(1100)).await; // file times have 1 s resolution on some filesystems
    let (third_cert, third_key) = leaf(&first, dir.path(), "third");
    std::fs::copy(&third_cert, &cert).unwrap();
    std::fs::copy(&third_key, &key).unwrap();
    served_with(&first, &polled).await;
    assert_eq!(
        discover_over(&client_trusting(&first.pem), &polled)
            .await
            .unwrap(),
        200
    );
}

#[tokio::test]
async fn an_https_upstream_is_verified_against_the_ca_file() {
    let dir = tempfile::tempdir().unwrap();
    let upstream_ca = ca(dir.path(), "upstream-ca");
    let (cert, key) = leaf(&upstream_ca, dir.path(), "upstream");
    let up = Upstream::start_with(
        UpstreamKind::Python,
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    let https = format!("https://127.0.0.1:{}/mcp", up.port);
    let sc = Sidecar::start(
        &https,
        &[("EPODE_SIDECAR_CA_FILE", upstream_ca.pem.to_str().unwrap())],
    );
    for mode in ["pin", "legacy"] {
        let out = ts_call(
            &sc.url(),
            mode,
            Some(("add", &json!({"a": 20, "b": 22}))),
            &[],
        );
        assert_eq!(
            out["result"]["structuredContent"]["sum"],
            42,
            "{mode}: {out}\n{}",
            sc.logs().join("\n")
        );
    }
    // Without the CA file, the upstream's certificate is not trusted: 502, with the id.
    let untrusting = Sidecar::start(&https, &[]);
    let body = modern_body(json!("u1"), "tools/list", json!({}));
    let resp = post_modern(&untrusting.url(), "tools/list", None, &body).await;
    assert_eq!(resp.status(), 502);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["id"], "u1", "{v}");
}
