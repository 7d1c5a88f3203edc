//! The official MCP clients through the whole OAuth flow against the sidecar's authorization
//! front door, with no token made by the test: the TypeScript client 2.4.0
//! (`tests/peers/ts_oauth.mjs`, its `OAuthClientProvider` on `StreamableHTTPClientTransport`)
//! and the Python client 2.3.0 (`tests/peers/py_oauth.py`, `mcp.client.auth.OAuthClientProvider`
//! on its httpx2 client), in each era. Each one gets the sidecar's 401, reads its Protected
//! Resource Metadata and the authorization server's metadata (oidc-provider, `support::auth`),
//! registers itself, authorizes with PKCE and `resource` (logging in as an account through the
//! AS's login and consent), exchanges the code and calls again; the upstream (the Python peer
//! with `whoami`) is told the account and never the token.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::auth::{AuthOptions, AuthServer};
use crate::support::*;

/// The authorization server, the upstream and the sidecar in front of it with auth on.
struct Stack {
    auth: AuthServer,
    upstream: Upstream,
    sidecar: Sidecar,
}

impl Stack {
    /// The sidecar listens on a port known before it starts (the resource URI names it) and
    /// needs `mcp:tools` for every request; `extra` settings on top.
    fn start(extra: &[(&str, &str)]) -> Stack {
        let (port, resource) = crate::auth::resource();
        let auth = AuthServer::start(AuthOptions::for_resource(&resource));
        let upstream = Upstream::start_with(UpstreamKind::Python, &["--whoami"]);
        let listen = format!("127.0.0.1:{port}");
        let mut env: Vec<(&str, &str)> = vec![
            ("EPODE_SIDECAR_LISTEN", &listen),
            ("EPODE_SIDECAR_AUTH", "jwt"),
            ("EPODE_SIDECAR_AUTH_ISSUER", auth.issuer()),
            ("EPODE_SIDECAR_AUTH_RESOURCE", &resource),
            ("EPODE_SIDECAR_AUTH_SCOPES", "mcp:tools"),
            ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28"),
        ];
        env.extend_from_slice(extra);
        let sidecar = Sidecar::start(&upstream.url(), &env);
        assert_eq!(sidecar.url(), resource);
        Stack {
            auth,
            upstream,
            sidecar,
        }
    }

    fn resource(&self) -> &str {
        self.auth.resource()
    }

    /// The upstream's own tool names, listed directly (no sidecar, no auth).
    fn upstream_tools(&self) -> Vec<String> {
        let listed = ts_call(&self.upstream.url(), "pin", None, &[]);
        let mut names: Vec<String> = listed["tools"]
            .as_array()
            .unwrap_or_else(|| panic!("the upstream's tools: {listed}"))
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect();
        names.sort();
        names
    }
}

/// Which official client runs the flow.
#[derive(Clone, Copy, Debug)]
enum OAuthClient {
    TypeScript,
    Python,
}

/// Runs `client` in `mode` (`legacy`, `auto`, `pin`) against `url` as `account`, calling
/// each `(tool, args)`: its one-line JSON report and how long it took.
fn run_client(
    client: OAuthClient,
    url: &str,
    mode: &str,
    account: &str,
    calls: &[(&str, Value)],
) -> (Value, Duration) {
    let mut cmd = match client {
        OAuthClient::TypeScript => {
            let script = peers_dir().join("ts/ts_oauth.mjs");
            assert!(
                script.exists(),
                "{} is missing: run `bash scripts/install-peers.sh`",
                script.display()
            );
            let mut c = Command::new("node");
            c.arg(script);
            c
        }
        OAuthClient::Python => {
            let script: PathBuf = repo_root().join("tests/peers/py_oauth.py");
            let mut c = Command::new(python());
            c.arg(script);
            c
        }
    };
    cmd.args([url, mode, "--account", account]);
    for (tool, args) in calls {
        cmd.args(["--tool", tool, "--args", &args.to_string()]);
    }
    let started = Instant::now();
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("run {client:?}: {e}"));
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
        panic!(
            "{client:?} printed no JSON (exit {:?}):\n{stdout}\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(
        report.get("error").is_none(),
        "{client:?} {mode}: {report:#}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{client:?} {mode}: the flow and the calls took {took:?}");
    (report, took)
}

fn steps(report: &Value) -> Vec<String> {
    report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

/// `wanted` appear in `steps` in this order (each a prefix of a step), others between them.
fn assert_in_order(steps: &[String], wanted: &[&str]) {
    let mut at = 0;
    for w in wanted {
        match steps[at..].iter().position(|s| s.starts_with(w)) {
            Some(i) => at += i + 1,
            None => panic!("no step {w:?} after step {at} in {steps:#?}"),
        }
    }
}

/// What `whoami` said: the upstream's view of the request.
fn whoami(result: &Value) -> Value {
    let text = result["content"][0]["text"].as_str().unwrap_or_default();
    serde_json::from_str(text).unwrap_or_else(|_| panic!("whoami: {result}"))
}

fn call<'a>(report: &'a Value, i: usize, name: &str) -> &'a Value {
    let c = &report["calls"][i];
    assert_eq!(c["name"], name, "{report:#}");
    assert_ne!(c["result"]["isError"], true, "{name}: {c}");
    &c["result"]
}

/// The flow went 401 → metadata → registration → authorization → token → the call again,
/// once, with no 403; the token is the code flow's (the account's, for this resource, of
/// the client that registered); the tools are the upstream's; the calls' results are right
/// and the upstream saw the account's claims and no token.
fn assert_one_flow(stack: &Stack, report: &Value, first: &str, account: &str) {
    let resource = stack.resource();
    assert_eq!(report["unauthorized"], 1, "{report:#}");
    assert_eq!(report["forbidden"], 0, "{report:#}");
    let challenged = format!("POST sidecar /mcp {first} 401");
    let authorized = format!("authorize as {account} -> code");
    let retried = format!("POST sidecar /mcp {first} 200");
    let mut wanted = vec![
        challenged.as_str(),
        "GET sidecar /.well-known/oauth-protected-resource/mcp 200",
        "GET as /.well-known/oauth-authorization-server 200",
        "POST as /reg 201",
        authorized.as_str(),
        "POST as /token 200",
        retried.as_str(),
    ];
    if first != "tools/list" {
        wanted.push("POST sidecar /mcp tools/list 200");
    }
    wanted.extend(["POST sidecar /mcp tools/call 200"; 2]);
    assert_in_order(&steps(report), &wanted);
    assert_eq!(report["registrations"], 1, "{report:#}");
    let client_id = report["client_id"].as_str().expect("a registered client");
    let authorizations = report["authorizations"].as_array().unwrap();
    assert_eq!(authorizations.len(), 1, "{report:#}");
    let params = &authorizations[0]["params"];
    assert_eq!(params["resource"], resource, "{params}");
    assert_eq!(params["code_challenge_method"], "S256", "{params}");
    assert_eq!(params["client_id"], client_id, "{params}");
    let asked = params["scope"].as_str().unwrap_or_default();
    assert!(asked.split(' ').any(|s| s == "mcp:tools"), "{params}");
    assert_eq!(
        report["tokenRequests"],
        json!([{"grant_type": "authorization_code", "resource": resource, "scope": null}]),
        "{report:#}"
    );
    let claims = &report["claims"];
    assert_eq!(claims["sub"], account, "{claims}");
    assert_eq!(claims["aud"], resource, "{claims}");
    assert_eq!(claims["iss"], stack.auth.issuer(), "{claims}");
    assert_eq!(claims["client_id"], client_id, "{claims}");
    assert_eq!(claims["scope"], "mcp:tools", "{claims}");
    let tools: Vec<&str> = report["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tools, stack.upstream_tools(), "{report:#}");
    let said = whoami(call(report, 0, "whoami"));
    assert_eq!(
        said,
        json!({"authorization": false, "subject": account, "scopes": "mcp:tools", "client": client_id}),
        "the upstream's view"
    );
    let added = call(report, 1, "add");
    assert_eq!(
        added["structuredContent"],
        json!({"sum": 5, "a": 2, "b": 3}),
        "{added}"
    );
}

fn whoami_then_add() -> Vec<(&'static str, Value)> {
    vec![("whoami", json!({})), ("add", json!({"a": 2, "b": 3}))]
}

/// One client in one mode against a fresh stack.
fn one_flow(client: OAuthClient, mode: &str, account: &str, first: &str, era: &str) {
    let stack = Stack::start(&[]);
    let (report, took) = run_client(
        client,
        &stack.sidecar.url(),
        mode,
        account,
        &whoami_then_add(),
    );
    let version = match client {
        OAuthClient::TypeScript => &report["negotiatedVersion"],
        OAuthClient::Python => &report["protocolVersion"],
    };
    assert_eq!(version, era, "{report:#}");
    assert_one_flow(&stack, &report, first, account);
    assert!(
        took < Duration::from_secs(20),
        "{client:?} {mode}: {took:?}"
    );
}

#[test]
fn the_typescript_client_authorizes_itself_through_the_sidecar_in_the_2025_era() {
    one_flow(
        OAuthClient::TypeScript,
        "legacy",
        "alice",
        "initialize",
        "2025-11-25",
    );
}

#[test]
fn the_typescript_client_authorizes_itself_through_the_sidecar_in_the_2026_era() {
    one_flow(
        OAuthClient::TypeScript,
        "pin",
        "bob",
        "server/discover",
        "2026-07-28",
    );
}

#[test]
fn the_python_client_authorizes_itself_through_the_sidecar_in_the_2025_era() {
    one_flow(
        OAuthClient::Python,
        "legacy",
        "carol",
        "initialize",
        "2025-11-25",
    );
}

#[test]
fn the_python_client_authorizes_itself_through_the_sidecar_in_the_2026_era_discovered() {
    // `auto` (the Python client's default): the 401 answers its server/discover probe.
    one_flow(
        OAuthClient::Python,
        "auto",
        "dave",
        "server/discover",
        "2026-07-28",
    );
}

#[test]
fn the_python_client_authorizes_itself_through_the_sidecar_in_the_2026_era_pinned() {
    // A pinned version sends no probe: the 401 answers its first request, tools/list.
    one_flow(
        OAuthClient::Python,
        "pin",
        "erin",
        "tools/list",
        "2026-07-28",
    );
}

/// `add` needs `mcp:admin` besides `mcp:tools`: the TypeScript client's first token (the 401
/// challenge's `mcp:tools`) calls `whoami`, gets 403 `insufficient_scope` naming both for
/// `add`, and steps up by itself (a fresh authorization for the union of the scopes).
///
/// oidc-provider holds a dynamically registered client to the `scope` it registered with
/// (RFC 7591: what the client may ask for), and the SDK registered with the first challenge's
/// scope, so the AS answers the first step-up `invalid_scope`; the app (`ts_oauth.mjs`) then
/// forgets that registration, the next 403 makes the SDK register again with the union and
/// authorize, and the call passes. The token in the end holds both scopes, and the upstream
/// is told them.
#[test]
fn the_typescript_client_steps_up_to_the_scope_a_tool_needs() {
    let stack = Stack::start(&[("EPODE_SIDECAR_AUTH_OPERATION_SCOPES", "tool:add=mcp:admin")]);
    let calls = vec![
        ("whoami", json!({})),
        ("add", json!({"a": 2, "b": 3})),
        ("whoami", json!({})),
    ];
    let (report, took) = run_client(
        OAuthClient::TypeScript,
        &stack.sidecar.url(),
        "pin",
        "alice",
        &calls,
    );
    assert_eq!(report["unauthorized"], 1, "{report:#}");
    assert_eq!(report["forbidden"], 2, "{report:#}");
    assert_in_order(
        &steps(&report),
        &[
            "POST sidecar /mcp server/discover 401",
            "POST as /reg 201",
            "authorize as alice -> code",
            "POST as /token 200",
            "POST sidecar /mcp tools/call 200",
            "POST sidecar /mcp tools/call 403",
            "authorize as alice -> no code",
            "the AS refused the scope for this registration (invalid_scope)",
            "POST sidecar /mcp tools/call 403",
            "POST as /reg 201",
            "authorize as alice -> code",
            "POST as /token 200",
            "POST sidecar /mcp tools/call 200",
            "POST sidecar /mcp tools/call 200",
        ],
    );
    let auths = report["authorizations"].as_array().unwrap();
    assert_eq!(auths.len(), 3, "{report:#}");
    let scopes = |i: usize| -> Vec<&str> {
        let mut s: Vec<&str> = auths[i]["params"]["scope"]
            .as_str()
            .unwrap()
            .split(' ')
            .filter(|s| *s != "offline_access")
            .collect();
        s.sort_unstable();
        s
    };
    assert_eq!(scopes(0), ["mcp:tools"]);
    assert_eq!(scopes(1), ["mcp:admin", "mcp:tools"], "the step-up's union");
    assert!(auths[1]["redirect"]
        .as_str()
        .unwrap()
        .contains("error=invalid_scope"));
    assert_eq!(scopes(2), ["mcp:admin", "mcp:tools"]);
    for a in auths {
        assert_eq!(a["params"]["resource"], stack.resource(), "{a}");
    }
    assert_eq!(report["registrations"], 2, "{report:#}");
    let before = whoami(call(&report, 0, "whoami"));
    assert_eq!(before["scopes"], "mcp:tools", "{before}");
    let added = call(&report, 1, "add");
    assert_eq!(added["structuredContent"]["sum"], 5, "{added}");
    let after = whoami(call(&report, 2, "whoami"));
    assert_eq!(after["authorization"], false, "{after}");
    assert_eq!(after["subject"], "alice", "{after}");
    assert_eq!(after["scopes"], "mcp:tools mcp:admin", "{after}");
    assert_eq!(after["client"], report["client_id"], "{after}");
    let claims = &report["claims"];
    assert_eq!(claims["scope"], "mcp:tools mcp:admin", "{claims}");
    assert_eq!(claims["aud"], stack.resource(), "{claims}");
    assert_eq!(claims["sub"], "alice", "{claims}");
    assert!(took < Duration::from_secs(20), "{took:?}");
}

/// An issuer that refuses RFC 8707's `resource` as Entra ID does (`AADSTS9010010`, OpenID
/// discovery only, no RFC 9207 `iss`, tokens for its application id URI with the bare scope
/// names): the Python client, unchanged, fails against it directly, and completes the flow
/// through the sidecar's authorization facade (`EPODE_SIDECAR_AUTH_FACADE`), which passes its
/// authorization and token requests on without `resource`; the token's audience and bare
/// scope are accepted by `EPODE_SIDECAR_AUTH_AUDIENCE`.
#[test]
fn the_python_client_completes_the_flow_through_the_facade_of_an_issuer_that_refuses_resource() {
    const APP: &str = "api://epode-test";
    let (port, resource) = crate::auth::resource();
    let mut options = AuthOptions::for_resource(&resource);
    options.resources = vec![APP.to_owned()];
    options.default_resource = Some(APP.to_owned());
    options.entra = true;
    let auth = AuthServer::start(options);
    let upstream = Upstream::start_with(UpstreamKind::Python, &["--whoami"]);
    let listen = format!("127.0.0.1:{port}");
    let scope = format!("{APP}/mcp:tools");
    let mut env = vec![
        ("EPODE_SIDECAR_LISTEN", listen.as_str()),
        ("EPODE_SIDECAR_AUTH", "jwt"),
        ("EPODE_SIDECAR_AUTH_ISSUER", auth.issuer()),
        ("EPODE_SIDECAR_AUTH_RESOURCE", resource.as_str()),
        ("EPODE_SIDECAR_AUTH_SCOPES", scope.as_str()),
        ("EPODE_SIDECAR_AUTH_AUDIENCE", APP),
        ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28"),
    ];
    // Without the facade the issuer refuses the client's authorization request.
    let sidecar = Sidecar::start(&upstream.url(), &env);
    let refused = Command::new(python())
        .arg(repo_root().join("tests/peers/py_oauth.py"))
        .args([&sidecar.url(), "pin", "--account", "carol"])
        .output()
        .expect("run the Python client");
    let said = String::from_utf8_lossy(&refused.stdout);
    assert!(
        said.contains("invalid_target") && said.contains("AADSTS9010010"),
        "without the facade: {said}"
    );
    drop(sidecar);
    env.push(("EPODE_SIDECAR_AUTH_FACADE", "true"));
    let sidecar = Sidecar::start(&upstream.url(), &env);
    let calls = [("whoami", json!({}))];
    let (report, _) = run_client(OAuthClient::Python, &sidecar.url(), "pin", "carol", &calls);
    assert_in_order(
        &steps(&report),
        &[
            "POST sidecar /mcp",
            "GET sidecar /.well-known/oauth-protected-resource/mcp 200",
            "GET sidecar /.well-known/oauth-authorization-server/oauth 200",
            "POST as /reg 201",
            "authorize as carol -> code",
            "POST sidecar /oauth/token 200",
            "POST sidecar /mcp",
        ],
    );
    let params = &report["authorizations"][0]["params"];
    assert!(
        report["authorizations"][0]["url"]
            .as_str()
            .unwrap()
            .starts_with(&format!("http://{listen}/oauth/authorize?")),
        "{report:#}"
    );
    assert_eq!(
        params["resource"], resource,
        "the client sent it, unchanged"
    );
    let asked = params["scope"].as_str().unwrap_or_default();
    assert!(asked.split(' ').any(|s| s == scope), "{params}");
    assert_eq!(
        report["tokenRequests"][0]["resource"], resource,
        "{report:#}"
    );
    let claims = &report["claims"];
    assert_eq!(claims["aud"], APP, "{claims}");
    assert_eq!(claims["scope"], "mcp:tools", "{claims}");
    assert_eq!(claims["iss"], auth.issuer(), "{claims}");
    let said = whoami(call(&report, 0, "whoami"));
    assert_eq!(said["subject"], "carol", "{said}");
    assert_eq!(said["authorization"], false, "the token goes no further");
    let addr: std::net::SocketAddr = listen.parse().unwrap();
    let metrics = get_blocking(addr, "/metrics");
    for endpoint in ["metadata", "authorize", "token"] {
        let name = format!(
            "epode_sidecar_auth_facade_requests_total{{endpoint=\"{endpoint}\",outcome=\"served\"}}"
        );
        assert!(metric_value(&metrics, &name) >= 1, "{endpoint}\n{metrics}");
    }
    // The token endpoint's bounds and refusals, each with its status and an OAuth error body.
    let token_url = format!("http://{listen}/oauth/token");
    let curl = |args: &[&str]| -> String {
        let out = Command::new("curl")
            .args(["-s", "-w", " %{http_code}"])
            .args(args)
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let big = format!(
        "grant_type=authorization_code&code={}",
        "x".repeat(70 * 1024)
    );
    let said = curl(&[
        "-H",
        "content-type: application/x-www-form-urlencoded",
        "--data-binary",
        &big,
        &token_url,
    ]);
    assert!(said.ends_with(" 413"), "a 70 KiB token request: {said}");
    let said = curl(&[
        "-H",
        "content-type: application/json",
        "-d",
        "{}",
        &token_url,
    ]);
    assert!(
        said.ends_with(" 400") && said.contains("application/x-www-form-urlencoded"),
        "{said}"
    );
    let said = curl(&[&token_url]);
    assert!(said.ends_with(" 405"), "GET: {said}");
    let said = curl(&[
        "-X",
        "OPTIONS",
        "-i",
        "-H",
        "origin: https://inspector.example",
        &token_url,
    ]);
    assert!(
        said.ends_with(" 204")
            && said
                .to_ascii_lowercase()
                .contains("access-control-allow-origin: *"),
        "{said}"
    );
    // A client that looks for the issuer's endpoints on the MCP server is told where they are.
    // A long path is echoed cut to 200 bytes.
    let long = format!("/.well-known/openid-configuration/{}", "a".repeat(20_000));
    let body = get_blocking(addr, &long);
    assert!(
        body.contains("not found") && body.contains('…') && body.len() < 2_000,
        "{}",
        body.len()
    );
    let body = get_blocking(addr, "/register");
    assert!(body.contains("not found"), "{body}");
    assert!(
        body.contains("/.well-known/oauth-protected-resource/mcp")
            && body.contains(&format!("http://{listen}/oauth")),
        "{body}"
    );
}
