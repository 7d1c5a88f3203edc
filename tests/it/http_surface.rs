//! Epode's HTTP surface, black-box (issue 23): a real FastAPI product (`tests/peers/http_app.py`,
//! no Epode code, the caller's identity in its `Epode-Identity` response header) behind the
//! sidecar with `EPODE_SIDECAR_HTTP_SURFACE=on`, and the strict fake Epode. Per mode: JSON
//! objects spliced byte for byte, HTML pages given the script tag, arrays given the header and
//! the discovery link, the identity header never reaching the client, one telemetry event per
//! instrumented response; every skip reason counted under its label; a 10 MB body and endless
//! streams passed through within the limits; methods, headers, bodies and statuses untouched;
//! and, with the surface off, nothing changed. Against a scripted product (issue 30): no token,
//! name or address reaches Epode in an operation (the route templates too), and the surface and
//! the MCP path cannot starve each other (connection shares, rate and in-flight limits), and
//! Chromium finds the HTML envelope on pages whose first `</head>`/`</body>` is no real one
//! (`tests/peers/html_check.mjs`).

use crate::support::fake_epode::{
    http_envelope_errors, FakeConfig, FakeEpode, HandleClaims, DEMO_PRODUCT_KEY,
};
use crate::support::*;

use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};

/// The tag the sidecar inserts, exactly (design: `inject_html`).
const TAG_OPEN: &str = r#"<script id="agent-feedback" type="application/json">"#;
/// The product bytes of the app's routes (tests/peers/http_app.py), to compare byte for byte.
const SEARCH: &[u8] = br#"{"stack": "manual-http",  "answer":"manual-http-result", "n": 1.50, "u": "\u00e9", "nested": {"a": [1, 2 ,3]}}"#;
const LIST: &[u8] = br#"[{"id": 1}, {"id": 2}]"#;
const DOCS: &[u8] = b"<!doctype html><html><head><title>Manual docs</title></head><body>manual-http-docs-result</body></html>";
const NO_HEAD: &[u8] = b"<html><body><p>no head here</p></body></html>";
const TRICKY: &[u8] = concat!(
    "<!doctype html><html><head><title>t</title>",
    r#"<script>var a = "<!--"; var b = "<\/script>"; var c = "</head>";</script>"#,
    "<style>/* </head> </style-ish */ p { color: red }</style>",
    "<!-- a comment with </head> and <script> inside -->",
    r#"<meta name="x" content="</head>">"#,
    "</head><body><p>Close scripts with &lt;/script&gt;; a stray </script> here.</p>",
    "<!-- trailing <!-- comment --></body></html>"
)
.as_bytes();
const OWNS: &[u8] = br#"{"result": 1, "_agentFeedback": {"mine": true}}"#;
const MARKED: &[u8] = br#"<html><head><script type="application/json" id="agent-feedback">{"mine":true}</script></head><body>already</body></html>"#;
const BIG_SIZE: usize = 10 * 1024 * 1024;

/// Every skip label of the agreed design (`surface::rules::Skip::label`).
const SKIP_LABELS: [&str; 14] = [
    "mode_off",
    "not_success",
    "redirect",
    "head",
    "method",
    "excluded_path",
    "static_asset",
    "content_type",
    "stream",
    "too_large",
    "compressed",
    "already_instrumented",
    "shared_cacheable",
    "invalid_operation",
];

/// The FastAPI product, on a port it picked itself.
pub(crate) struct App {
    port: u16,
    _proc: Proc,
}

impl App {
    pub(crate) fn start(with_mcp: bool) -> App {
        let mut cmd = Command::new(python());
        cmd.arg(repo_root().join("tests/peers/http_app.py"))
            .args(["--port", "0"]);
        if with_mcp {
            cmd.arg("--mcp");
        }
        let (proc, port) = spawn_ready(
            cmd,
            "http_app.py",
            "is fastapi installed? run scripts/install-peers.sh",
        );
        App { port, _proc: proc }
    }

    /// The bare origin: the surface proxies every non-MCP path to it.
    pub(crate) fn origin(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

struct Rig {
    _app: App,
    epode: FakeEpode,
    sc: Sidecar,
}

/// The app, the fake Epode in `mode`, and a sidecar with the surface on in front of the
/// app's bare origin (telemetry flushed every 20 ms so tests do not wait for it).
fn rig(mode: &str, extra: &[(&str, &str)]) -> Rig {
    rig_with(mode, false, extra)
}

fn rig_with(mode: &str, with_mcp: bool, extra: &[(&str, &str)]) -> Rig {
    let app = App::start(with_mcp);
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, mode));
    let mut env: Vec<(&str, &str)> = vec![
        ("EPODE_SIDECAR_HTTP_SURFACE", "on"),
        ("EPODE_SIDECAR_TELEMETRY_FLUSH", "20ms"),
    ];
    env.extend_from_slice(extra);
    let sc = feedback_sidecar(&app.origin(), &epode, mode, &env);
    Rig {
        _app: app,
        epode,
        sc,
    }
}

/// A client that never follows redirects nor decompresses: the test sees what the sidecar sent.
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

/// One whole answer.
struct Got {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Vec<u8>,
}

impl Got {
    fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("ASCII header").to_owned())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

async fn send(req: reqwest::RequestBuilder) -> Got {
    let resp = req.send().await.expect("request through the sidecar");
    Got {
        status: resp.status().as_u16(),
        headers: resp.headers().clone(),
        body: resp.bytes().await.expect("body").to_vec(),
    }
}

/// `GET path`, as the caller `token` (`user-<ref>` or `anon-<ref>`) when given.
async fn get(sc: &Sidecar, path: &str, token: Option<&str>) -> Got {
    let mut req = client().get(format!("{}{path}", sc.base()));
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    send(req).await
}

/// The envelope wherever the placement put it, read the way Epode's own harness reads it
/// (`envelopeFrom`): a JSON body's `_agentFeedback`, else the HTML script tag, else the
/// `Agent-Feedback` header.
fn envelope_from(got: &Got) -> Option<Value> {
    let ct = got.header("content-type").unwrap_or_default();
    if ct.contains("json") {
        if let Ok(Value::Object(o)) = serde_json::from_slice::<Value>(&got.body) {
            if let Some(f) = o.get("_agentFeedback") {
                return Some(f.clone());
            }
        }
    } else if let Some((_, json)) = script_tag(&got.body) {
        return Some(serde_json::from_str(&json).expect("the script tag holds JSON"));
    }
    let header = got.header("agent-feedback")?;
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(header.as_bytes())
        .expect("Agent-Feedback is base64url without padding");
    Some(serde_json::from_slice(&raw).expect("Agent-Feedback holds JSON"))
}

/// The inserted tag: (its byte offset, its JSON text). Panics when there is more than one.
fn script_tag(page: &[u8]) -> Option<(usize, String)> {
    let text = std::str::from_utf8(page).expect("UTF-8 page");
    let count = text.matches(TAG_OPEN).count();
    assert!(count <= 1, "the tag appears {count} times:\n{text}");
    let at = text.find(TAG_OPEN)?;
    let rest = &text[at + TAG_OPEN.len()..];
    let end = rest.find("</script>").expect("the tag is closed");
    Some((at, rest[..end].to_owned()))
}

/// The page with the tag (and its content) cut out, and where it was.
fn without_tag(page: &[u8]) -> (Vec<u8>, usize) {
    let (at, json) = script_tag(page).unwrap_or_else(|| {
        panic!(
            "no agent-feedback script tag in:\n{}",
            String::from_utf8_lossy(page)
        )
    });
    let len = TAG_OPEN.len() + json.len() + "</script>".len();
    let mut out = page[..at].to_vec();
    out.extend_from_slice(&page[at + len..]);
    (out, at)
}

fn schema_ok(env: &Value, what: &str) {
    let errors = http_envelope_errors(env);
    assert!(
        errors.is_empty(),
        "{what}: the envelope fails the HTTP envelope schema: {errors:?}\n{env}"
    );
    assert!(
        !env.to_string().contains("af_live_"),
        "{what}: the product key leaked into the envelope: {env}"
    );
}

/// Checks every instrumented-response header rule; returns the verified capability.
fn instrumented(got: &Got, epode: &FakeEpode, what: &str) -> (Value, HandleClaims) {
    assert_eq!(got.status / 100, 2, "{what}: status {}", got.status);
    assert_eq!(
        got.header("cache-control").as_deref(),
        Some("private, no-store"),
        "{what}: an instrumented response must be private, no-store"
    );
    for h in [
        "cdn-cache-control",
        "cloudflare-cdn-cache-control",
        "surrogate-control",
        "epode-identity",
    ] {
        assert!(
            got.header(h).is_none(),
            "{what}: {h} must not reach the client"
        );
    }
    let len = got.header("content-length");
    assert_eq!(
        len.as_deref().and_then(|l| l.parse::<usize>().ok()),
        Some(got.body.len()),
        "{what}: Content-Length must be the (new) body's length, got {len:?}"
    );
    let env = envelope_from(got).unwrap_or_else(|| panic!("{what}: no envelope:\n{}", got.text()));
    schema_ok(&env, what);
    let auth = env["submit"]["authorization"]
        .as_str()
        .or_else(|| env["requiredAction"]["submitDecision"]["authorization"].as_str())
        .or_else(|| env["manageConsent"]["authorization"].as_str())
        .unwrap_or_else(|| panic!("{what}: no capability in {env}"));
    let handle = auth
        .strip_prefix("Bearer ")
        .unwrap_or_else(|| panic!("{what}: authorization is not a bearer: {auth}"));
    let claims = epode
        .verify(handle)
        .unwrap_or_else(|e| panic!("{what}: the fake Epode refuses the capability: {e}"));
    (env, claims)
}

/// The body as the app sent it, without a trace of the surface.
fn untouched(got: &Got, product: &[u8], what: &str) {
    assert_eq!(
        got.body,
        product,
        "{what}: the body must pass untouched:\n{}",
        got.text()
    );
    assert!(
        got.header("agent-feedback").is_none(),
        "{what}: no Agent-Feedback header on a skipped response"
    );
    assert!(
        !got.header("link")
            .unwrap_or_default()
            .contains("agent-feedback"),
        "{what}: no discovery link on a skipped response"
    );
    assert!(
        got.header("epode-identity").is_none(),
        "{what}: Epode-Identity must never reach the client"
    );
}

/// The JSON object splice: every product byte before the closing brace unchanged, then
/// `,"_agentFeedback":…}` as the last member.
fn spliced(got: &Got, product: &[u8], what: &str) {
    let head = &product[..product.len() - 1];
    assert!(
        got.body.starts_with(head),
        "{what}: the product's bytes must be kept as they were (no re-encoding):\n{}",
        got.text()
    );
    let tail = std::str::from_utf8(&got.body[head.len()..]).expect("UTF-8 tail");
    assert!(
        tail.starts_with(r#","_agentFeedback":"#) && tail.ends_with('}'),
        "{what}: the envelope must be spliced before the closing brace: {tail}"
    );
    let parsed = got.json();
    let keys: Vec<&String> = parsed.as_object().expect("object").keys().collect();
    assert_eq!(
        keys.last().map(|k| k.as_str()),
        Some("_agentFeedback"),
        "{what}: _agentFeedback must be the last member: {keys:?}"
    );
}

async fn metrics(sc: &Sidecar) -> String {
    let got = get(sc, "/_epode-sidecar/metrics", None).await;
    assert_eq!(
        got.status,
        200,
        "the metrics must be at /_epode-sidecar/metrics with the surface on: {}",
        got.text()
    );
    got.text()
}

fn skipped(text: &str, reason: &str) -> u64 {
    metric_value(
        text,
        &format!("epode_sidecar_http_skipped_total{{reason=\"{reason}\"}}"),
    )
}

fn instrumented_count(text: &str, surface: &str) -> u64 {
    metric_value(
        text,
        &format!("epode_sidecar_http_instrumented_total{{surface=\"{surface}\"}}"),
    )
}

/// Waits until the fake Epode holds `n` events, then checks there are exactly `n` and that
/// it dropped none (the real service would have refused them).
async fn events(epode: &FakeEpode, n: usize) -> Vec<Value> {
    let arrived = eventually_async(Duration::from_secs(10), || {
        std::future::ready(epode.events().len() >= n)
    })
    .await;
    let all = epode.events();
    assert!(
        arrived && all.len() == n,
        "expected exactly {n} telemetry events, the fake Epode holds {}: {all:#?}",
        all.len()
    );
    assert!(
        epode.dropped_events().is_empty(),
        "the fake Epode (as the real one) dropped events: {:#?}",
        epode.dropped_events()
    );
    all
}

fn event_for<'a>(all: &'a [Value], claims: &HandleClaims) -> &'a Value {
    all.iter()
        .find(|e| e["interactionId"] == claims.i.as_str())
        .unwrap_or_else(|| {
            panic!(
                "no telemetry event with the capability's interaction id {}: {all:#?}",
                claims.i
            )
        })
}

fn check_event(e: &Value, surface: &str, operation: &str, status: u16) {
    assert_eq!(e["surface"], surface, "surface of {e}");
    assert_eq!(e["operation"], operation, "operation of {e}");
    assert_eq!(e["statusCode"], status, "statusCode of {e}");
    assert_eq!(e["classification"], "unclassified", "classification of {e}");
    assert!(
        e.get("confirmationMethod").is_none(),
        "an HTTP event carries no confirmationMethod: {e}"
    );
    assert!(
        e["durationMs"].as_u64().is_some(),
        "durationMs must be a whole number: {e}"
    );
}

fn big_body() -> Vec<u8> {
    let filler_len = BIG_SIZE - r#"{"data":""}"#.len();
    let filler: Vec<u8> = b"0123456789abcdef"
        .iter()
        .cycle()
        .take(filler_len)
        .copied()
        .collect();
    let mut out = br#"{"data":""#.to_vec();
    out.extend_from_slice(&filler);
    out.extend_from_slice(br#""}"#);
    out
}

// ---------------------------------------------------------------------------------------
// never_ask: the three placements, the headers, telemetry
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn never_ask_places_the_envelope_by_content_type() {
    let r = rig("never_ask", &[]);
    let user = Some("user-acme");

    // A JSON object: spliced byte for byte.
    let search = get(&r.sc, "/search", user).await;
    let (env, search_claims) = instrumented(&search, &r.epode, "/search");
    spliced(&search, SEARCH, "/search");
    assert_eq!(env["state"], "feedback_ready", "{env}");
    assert_eq!(env["mode"], "never_ask", "{env}");
    assert_eq!(env["requested"], true, "{env}");
    assert!(env.get("configuredMode").is_none(), "{env}");
    assert_eq!(
        env["submit"]["url"],
        format!("{}/api/v2/reports", r.epode.url()),
        "the report goes straight to Epode: {env}"
    );
    assert!(
        search_claims.s.is_none(),
        "never_ask has no consent subject"
    );
    assert!(
        search.header("etag").is_none(),
        "/search: a changed body loses the app's ETag"
    );

    // HTML with a head: the tag once, right before </head>, the page otherwise unchanged.
    let docs = get(&r.sc, "/docs/test", user).await;
    let (_, docs_claims) = instrumented(&docs, &r.epode, "/docs/test");
    let (page, at) = without_tag(&docs.body);
    assert_eq!(page, DOCS, "/docs/test: only the tag may be added");
    assert!(
        page[at..].starts_with(b"</head>"),
        "/docs/test: the tag goes right before </head>: {}",
        docs.text()
    );

    // HTML without a head: before </body>.
    let no_head = get(&r.sc, "/page-no-head", user).await;
    let (_, no_head_claims) = instrumented(&no_head, &r.epode, "/page-no-head");
    let (page, at) = without_tag(&no_head.body);
    assert_eq!(page, NO_HEAD, "/page-no-head: only the tag may be added");
    assert!(
        page[at..].starts_with(b"</body>"),
        "/page-no-head: the tag goes right before </body>: {}",
        no_head.text()
    );

    // `</script>`, `</head>` and `<!--` in scripts, styles, comments, attributes and text:
    // the tag goes before the one real </head>, the page is intact, the JSON cannot end the tag.
    let tricky = get(&r.sc, "/tricky", user).await;
    let (_, tricky_claims) = instrumented(&tricky, &r.epode, "/tricky");
    let (page, at) = without_tag(&tricky.body);
    assert_eq!(
        page, TRICKY,
        "/tricky: the page must be intact apart from the tag"
    );
    let real_head = std::str::from_utf8(TRICKY)
        .unwrap()
        .find("\"></head><body>")
        .unwrap()
        + 2;
    assert_eq!(
        at,
        real_head,
        "/tricky: the tag must go before the real </head>, not one inside a script, style, \
         comment or attribute:\n{}",
        tricky.text()
    );
    let (_, json) = script_tag(&tricky.body).unwrap();
    assert!(
        !json.contains('<'),
        "the embedded JSON must have every `<` escaped: {json}"
    );

    // A JSON array: body untouched, the envelope in Agent-Feedback, the discovery link.
    let list = get(&r.sc, "/list", user).await;
    let (env, list_claims) = instrumented(&list, &r.epode, "/list");
    assert_eq!(list.body, LIST, "/list: an array's body is never changed");
    assert_eq!(
        list.header("etag").as_deref(),
        Some("\"list-v1\""),
        "/list: an unchanged body keeps its ETag"
    );
    assert_eq!(env["state"], "feedback_ready");
    let link = list.header("link").unwrap_or_default();
    assert!(
        link.contains(&format!(
            "<{}/.well-known/agent-feedback-v1.json>; rel=\"agent-feedback\"; type=\"application/json\"",
            r.epode.url()
        )),
        "/list: the discovery link: {link:?}"
    );

    // 201 is a complete success: instrumented, and its status recorded.
    let created = get(&r.sc, "/created", user).await;
    assert_eq!(created.status, 201);
    let (_, created_claims) = instrumented(&created, &r.epode, "/created");
    spliced(&created, br#"{"created": true}"#, "/created");

    // Id-like path segments are collapsed in the operation, so operations do not explode.
    let numeric = get(&r.sc, "/weird/12345", user).await;
    let (_, numeric_claims) = instrumented(&numeric, &r.epode, "/weird/12345");
    let uuid = get(&r.sc, "/weird/0f8fad5b-d9cb-469f-a165-70867728950e", user).await;
    let (_, uuid_claims) = instrumented(&uuid, &r.epode, "/weird/<uuid>");

    // One event per instrumented response, with the app's identity (no customerRef outside
    // ask_once) and the capability's interaction id.
    let all = events(&r.epode, 8).await;
    for (claims, surface, operation, status) in [
        (&search_claims, "http_json", "/search", 200),
        (&docs_claims, "http_html", "/docs/test", 200),
        (&no_head_claims, "http_html", "/page-no-head", 200),
        (&tricky_claims, "http_html", "/tricky", 200),
        (&list_claims, "http_headers", "/list", 200),
        (&created_claims, "http_json", "/created", 201),
        (&numeric_claims, "http_json", "/weird/:id", 200),
        (&uuid_claims, "http_json", "/weird/:id", 200),
    ] {
        let e = event_for(&all, claims);
        check_event(e, surface, operation, status);
        assert_eq!(e["accountRef"], "acme", "the app's identity: {e}");
        assert_eq!(e["userRef"], "user.acme", "the app's identity: {e}");
        assert!(
            e.get("customerRef").is_none(),
            "customerRef reaches Epode only in ask_once: {e}"
        );
    }
    let text = metrics(&r.sc).await;
    assert_eq!(instrumented_count(&text, "http_json"), 4, "{text}");
    assert_eq!(instrumented_count(&text, "http_html"), 3, "{text}");
    assert_eq!(instrumented_count(&text, "http_headers"), 1, "{text}");
}

#[tokio::test]
async fn identity_comes_from_the_app_only() {
    let r = rig("never_ask", &[]);
    // The client claims an identity every way it could: it is ignored.
    let spoofed = send(
        client()
            .get(format!("{}/search", r.sc.base()))
            .header(
                "epode-identity",
                r#"{"accountRef":"spoof","customerRef":"spoof"}"#,
            )
            .header("x-customer-ref", "spoof"),
    )
    .await;
    let (_, spoofed_claims) = instrumented(&spoofed, &r.epode, "/search from a spoofing client");
    // The app's malformed header: instrumented without identity, counted, stripped.
    let bad = get(&r.sc, "/bad-identity", None).await;
    let (_, bad_claims) = instrumented(&bad, &r.epode, "/bad-identity");
    spliced(&bad, br#"{"bad": "identity"}"#, "/bad-identity");
    // An anonymous caller of the app.
    let anon = get(&r.sc, "/search", Some("anon-7")).await;
    let (_, anon_claims) = instrumented(&anon, &r.epode, "/search anonymous");

    let all = events(&r.epode, 3).await;
    for key in ["accountRef", "userRef", "anonymousRef", "customerRef"] {
        assert!(
            event_for(&all, &spoofed_claims).get(key).is_none(),
            "identity must never come from the client's request: {all:#?}"
        );
        assert!(
            event_for(&all, &bad_claims).get(key).is_none(),
            "an invalid Epode-Identity gives no identity: {all:#?}"
        );
    }
    let anon_event = event_for(&all, &anon_claims);
    assert_eq!(anon_event["anonymousRef"], "anon.7", "{anon_event}");
    assert!(
        !serde_json::to_string(&all).unwrap().contains("spoof"),
        "nothing the client sent reaches Epode: {all:#?}"
    );
    let text = metrics(&r.sc).await;
    assert_eq!(
        metric_value(&text, "epode_sidecar_http_identity_invalid_total"),
        1,
        "the invalid header is counted:\n{text}"
    );
}

// ---------------------------------------------------------------------------------------
// Consent modes
// ---------------------------------------------------------------------------------------

async fn decide(env: &Value, decision: &str) {
    let call = &env["requiredAction"]["submitDecision"];
    let resp = client()
        .post(call["url"].as_str().expect("submitDecision.url"))
        .header("authorization", call["authorization"].as_str().unwrap())
        .header("content-type", "application/json")
        .body(json!({ "decision": decision }).to_string())
        .send()
        .await
        .expect("post the decision to the fake Epode");
    assert_eq!(resp.status(), 200, "the fake Epode refused the decision");
}

fn consent_envelope(env: &Value, mode: &str, configured: &str, what: &str) {
    assert_eq!(env["state"], "consent_required", "{what}: {env}");
    assert_eq!(env["mode"], mode, "{what}: {env}");
    assert_eq!(env["configuredMode"], configured, "{what}: {env}");
    assert_eq!(env["consentRequired"], true, "{what}: {env}");
    assert_eq!(env["consentManagedBy"], "epode", "{what}: {env}");
    assert!(
        env.get("submit").is_none(),
        "{what}: no submit before consent: {env}"
    );
    assert_eq!(env["requiredAction"]["type"], "ask_user", "{what}: {env}");
    assert_eq!(
        env["requiredAction"]["submitDecision"]["bodySchema"],
        json!({"decision": ["approved", "declined"]}),
        "{what}: {env}"
    );
}

#[tokio::test]
async fn ask_once_with_a_customer_remembers_the_decision() {
    let r = rig("ask_once", &[]);
    // First use: the ask-once question, bound to the customer's subject.
    let first = get(&r.sc, "/search", Some("user-acme")).await;
    let (env, claims) = instrumented(&first, &r.epode, "ask_once first /search");
    spliced(&first, SEARCH, "ask_once /search");
    consent_envelope(&env, "ask_once", "ask_once", "ask_once with a customer");
    assert_eq!(env["consentPolicy"], "once", "{env}");
    let question = env["requiredAction"]["question"]
        .as_str()
        .unwrap_or_default();
    assert!(
        question.contains("future uses without asking again"),
        "{question}"
    );
    assert_eq!(
        claims.s.as_deref(),
        r.epode.subject_for("acme").as_deref(),
        "the consent subject comes from the app's customerRef"
    );
    assert_eq!(claims.r, Some(0), "a cold cache has revision 0");
    decide(&env, "approved").await;

    // The decision is learnt off the response path: poll until a page is feedback_ready.
    let mut ready = None;
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while ready.is_none() && Instant::now() < deadline {
        let page = get(&r.sc, "/docs/test", Some("user-acme")).await;
        let (env, claims) = instrumented(&page, &r.epode, "ask_once /docs/test");
        if env["state"] == "feedback_ready" {
            ready = Some((env, claims));
        } else {
            consent_envelope(
                &env,
                "ask_once",
                "ask_once",
                "ask_once before the cache knows",
            );
            seen.push(claims);
        }
    }
    let (env, ready_claims) =
        ready.expect("the approved decision never reached the sidecar's cache");
    assert_eq!(env["mode"], "never_ask", "{env}");
    assert_eq!(env["configuredMode"], "ask_once", "{env}");
    assert_eq!(env["manageConsent"]["current"], "approved", "{env}");
    assert!(env["submit"].is_object(), "{env}");
    assert!(
        ready_claims.r.unwrap_or(0) >= 1,
        "the cached revision is signed"
    );

    // Another customer declines: feedback_disabled once the sidecar knows.
    let other = get(&r.sc, "/search", Some("user-bob")).await;
    let (env, _) = instrumented(&other, &r.epode, "ask_once bob");
    decide(&env, "declined").await;
    let mut disabled = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while disabled.is_none() && Instant::now() < deadline {
        let got = get(&r.sc, "/search", Some("user-bob")).await;
        let (env, claims) = instrumented(&got, &r.epode, "ask_once bob again");
        if env["state"] == "feedback_disabled" {
            disabled = Some(env);
        }
        seen.push(claims);
    }
    let env = disabled.expect("the declined decision never reached the sidecar's cache");
    assert_eq!(env["requested"], false, "{env}");
    assert_eq!(env["manageConsent"]["current"], "declined", "{env}");

    // Telemetry: every instrumented response, each with customerRef (ask_once keeps it).
    let n = 2 + seen.len() + 1;
    let all = events(&r.epode, n).await;
    let e = event_for(&all, &claims);
    check_event(e, "http_json", "/search", 200);
    assert_eq!(e["customerRef"], "acme", "ask_once keeps customerRef: {e}");
    assert_eq!(e["accountRef"], "acme", "{e}");
    for e in &all {
        assert!(
            e["customerRef"].is_string(),
            "ask_once keeps customerRef: {e}"
        );
    }
    assert!(
        r.epode
            .all_requests()
            .iter()
            .any(|q| q.path == "/api/v2/consent/state"),
        "the sidecar learns decisions from Epode's consent state"
    );
}

#[tokio::test]
async fn ask_once_without_a_customer_asks_per_use() {
    let r = rig("ask_once", &[]);
    let got = get(&r.sc, "/search", Some("anon-9")).await;
    let (env, claims) = instrumented(&got, &r.epode, "ask_once anonymous");
    consent_envelope(
        &env,
        "ask_always",
        "ask_once",
        "ask_once without a customerRef",
    );
    assert_eq!(env["consentPolicy"], "always", "{env}");
    assert!(claims.s.is_none(), "no subject without a customerRef");
    let all = events(&r.epode, 1).await;
    let e = event_for(&all, &claims);
    check_event(e, "http_json", "/search", 200);
    assert_eq!(e["anonymousRef"], "anon.9", "{e}");
    assert!(e.get("customerRef").is_none(), "{e}");
}

#[tokio::test]
async fn ask_always_asks_every_time() {
    let r = rig("ask_always", &[]);
    let mut claims = Vec::new();
    for (path, what) in [
        ("/search", "json"),
        ("/docs/test", "html"),
        ("/list", "array"),
    ] {
        let got = get(&r.sc, path, Some("user-acme")).await;
        let (env, c) = instrumented(&got, &r.epode, what);
        consent_envelope(&env, "ask_always", "ask_always", what);
        let question = env["requiredAction"]["question"]
            .as_str()
            .unwrap_or_default();
        assert!(!question.contains("future uses"), "{question}");
        claims.push(c);
    }
    let all = events(&r.epode, 3).await;
    for (c, (surface, op)) in claims.iter().zip([
        ("http_json", "/search"),
        ("http_html", "/docs/test"),
        ("http_headers", "/list"),
    ]) {
        let e = event_for(&all, c);
        check_event(e, surface, op, 200);
        assert_eq!(e["accountRef"], "acme", "{e}");
        assert!(
            e.get("customerRef").is_none(),
            "customerRef reaches Epode only in ask_once: {e}"
        );
    }
}

#[tokio::test]
async fn off_passes_everything_untouched_and_still_strips_identity() {
    let r = rig("off", &[]);
    let search = get(&r.sc, "/search", Some("user-acme")).await;
    assert_eq!(search.status, 200);
    untouched(&search, SEARCH, "off /search");
    assert_eq!(
        (
            search.header("etag").as_deref(),
            search.header("surrogate-control").as_deref()
        ),
        (Some("\"search-v1\""), Some("no-store")),
        "off mode keeps every header of the app but Epode-Identity"
    );
    assert!(
        search.header("cache-control").is_none(),
        "off mode adds no Cache-Control"
    );
    let docs = get(&r.sc, "/docs/test", Some("user-acme")).await;
    untouched(&docs, DOCS, "off /docs/test");
    let list = get(&r.sc, "/list", Some("user-acme")).await;
    untouched(&list, LIST, "off /list");
    let text = metrics(&r.sc).await;
    assert_eq!(skipped(&text, "mode_off"), 3, "{text}");
    for surface in ["http_json", "http_html", "http_headers"] {
        assert_eq!(instrumented_count(&text, surface), 0, "{text}");
    }
    let talked = eventually_async(Duration::from_millis(500), || {
        std::future::ready(!r.epode.all_requests().is_empty())
    })
    .await;
    assert!(
        !talked,
        "off mode must not talk to Epode: {:?}",
        r.epode.all_requests()
    );
}

// ---------------------------------------------------------------------------------------
// Skips
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn every_skip_reason_is_counted_under_its_label() {
    // `none`: an app's own envelope (`/owns`, `/marked`) is counted, and the sidecar binds on.
    let r = rig(
        "never_ask",
        &[
            ("EPODE_SIDECAR_HTTP_EXCLUDE", "/internal/*"),
            ("EPODE_SIDECAR_UPSTREAM_EPODE", "none"),
        ],
    );
    let before = metrics(&r.sc).await;
    for label in SKIP_LABELS {
        assert_eq!(
            skipped(&before, label),
            0,
            "every skip label is registered at 0 before any request:\n{before}"
        );
    }
    let user = Some("user-acme");
    let missing = get(&r.sc, "/missing", user).await;
    assert_eq!(missing.status, 404);
    untouched(&missing, br#"{"error": "missing"}"#, "/missing");

    let redirect = get(&r.sc, "/redirect", user).await;
    assert_eq!(redirect.status, 302);
    assert_eq!(redirect.header("location").as_deref(), Some("/search"));
    untouched(&redirect, b"", "/redirect");

    let head = send(
        client()
            .head(format!("{}/search", r.sc.base()))
            .header("authorization", "Bearer user-acme"),
    )
    .await;
    assert_eq!(head.status, 200);
    untouched(&head, b"", "HEAD /search");

    let health = get(&r.sc, "/health", user).await;
    untouched(&health, br#"{"status": "app-ok"}"#, "/health (the app's)");
    let internal = get(&r.sc, "/internal/x", user).await;
    untouched(
        &internal,
        br#"{"internal": "x"}"#,
        "/internal/x (EPODE_SIDECAR_HTTP_EXCLUDE)",
    );

    let js = get(&r.sc, "/static/app.js", user).await;
    untouched(
        &js,
        br#"{"looks": "like json but is a static asset"}"#,
        "/static/app.js",
    );

    let binary = get(&r.sc, "/binary", user).await;
    let bytes: Vec<u8> = (0..=255).collect();
    untouched(&binary, &bytes, "/binary");

    let gz = get(&r.sc, "/gz", user).await;
    assert_eq!(gz.header("content-encoding").as_deref(), Some("gzip"));
    assert_eq!(
        &gz.body[..2],
        b"\x1f\x8b",
        "/gz: still the app's gzip bytes"
    );
    assert!(gz.header("agent-feedback").is_none() && gz.header("epode-identity").is_none());

    let owns = get(&r.sc, "/owns", user).await;
    untouched(&owns, OWNS, "/owns");
    let marked = get(&r.sc, "/marked", user).await;
    untouched(&marked, MARKED, "/marked");

    let cached = get(&r.sc, "/cached", user).await;
    untouched(&cached, br#"{"cached": true}"#, "/cached");
    assert_eq!(
        cached.header("cache-control").as_deref(),
        Some("public, max-age=60"),
        "a skipped shared-cacheable response keeps its Cache-Control"
    );

    // Forty route words: an operation past Epode's 160 characters (an escaped or id-like
    // segment is collapsed, never refused: `every_segment_that_is_no_route_word_…`).
    let deep = format!("/deep/{}", "abcd/".repeat(40));
    let deep_got = get(&r.sc, &deep, user).await;
    untouched(&deep_got, br#"{"deep": true}"#, "/deep/abcd/…");

    let big = get(&r.sc, "/big", user).await;
    assert_eq!(big.body.len(), BIG_SIZE, "/big: every byte delivered");
    assert!(big.header("agent-feedback").is_none() && big.header("epode-identity").is_none());

    // The endless SSE stream: its first event, then the client goes.
    let mut stream = client()
        .get(format!("{}/stream", r.sc.base()))
        .send()
        .await
        .expect("stream");
    assert!(stream.headers().get("epode-identity").is_none());
    let first = tokio::time::timeout(Duration::from_secs(5), stream.chunk())
        .await
        .expect("the first SSE event within 5 s")
        .expect("stream body")
        .expect("a chunk");
    assert!(String::from_utf8_lossy(&first).contains("data: tick"));
    drop(stream);

    // A streamed answer is recorded once its body ends: when the sidecar sees the client go.
    let ended = eventually_async(Duration::from_secs(10), || async {
        skipped(&metrics(&r.sc).await, "stream") >= 1
    })
    .await;
    assert!(ended, "the dropped stream is counted once it ends");
    let text = metrics(&r.sc).await;
    for (label, n) in [
        ("not_success", 1),
        ("redirect", 1),
        ("head", 1),
        ("excluded_path", 2),
        ("static_asset", 1),
        ("content_type", 1),
        ("compressed", 1),
        ("already_instrumented", 2),
        ("shared_cacheable", 1),
        ("invalid_operation", 1),
        ("too_large", 1),
        ("stream", 1),
        ("mode_off", 0),
    ] {
        assert_eq!(
            skipped(&text, label),
            n,
            "epode_sidecar_http_skipped_total{{reason=\"{label}\"}}:\n{text}"
        );
    }
    for surface in ["http_json", "http_html", "http_headers"] {
        assert_eq!(
            instrumented_count(&text, surface),
            0,
            "nothing above is instrumented:\n{text}"
        );
    }
    let sent = eventually_async(Duration::from_millis(500), || {
        std::future::ready(!r.epode.events().is_empty())
    })
    .await;
    assert!(
        !sent,
        "skipped responses send no telemetry: {:?}",
        r.epode.events()
    );
}

#[tokio::test]
async fn private_cache_mode_instruments_shared_cacheable_responses() {
    let r = rig("never_ask", &[("EPODE_SIDECAR_HTTP_CACHE_MODE", "private")]);
    let cached = get(&r.sc, "/cached", Some("user-acme")).await;
    instrumented(&cached, &r.epode, "/cached in private mode");
    spliced(&cached, br#"{"cached": true}"#, "/cached in private mode");
    let all = events(&r.epode, 1).await;
    check_event(&all[0], "http_json", "/cached", 200);
}

/// Epode's `cacheMode: "request"`, with the values Epode's Node SDK sends for the same route
/// (its own test, `sdk/node/test/express.test.mjs`): an ordinary GET or HEAD of a JSON or
/// HTML route keeps its body and its cache policy and advertises the opt-in for the exact
/// target; one with `Agent-Feedback-Request: 1` is instrumented (cacheable or not) and
/// private; both vary on the header; an excluded path gets neither.
#[tokio::test]
async fn request_cache_mode_instruments_only_what_asks_and_advertises_the_rest() {
    let r = rig("never_ask", &[("EPODE_SIDECAR_HTTP_CACHE_MODE", "request")]);
    let link = |target: &str| {
        format!(r#"<{target}>; rel="agent-feedback"; request-header="Agent-Feedback-Request: 1""#)
    };
    let varies = |got: &Got| {
        got.headers
            .get_all("vary")
            .iter()
            .any(|v| v.to_str().unwrap().contains("Agent-Feedback-Request"))
    };
    let plain = |path: &str| client().get(format!("{}{path}", r.sc.base()));
    let asking = |path: &str| plain(path).header("agent-feedback-request", "1");
    for (path, target, product) in [
        (
            "/cached?scope=private",
            "/cached?scope=private",
            &br#"{"cached": true}"#[..],
        ),
        ("/search?", "/search", SEARCH),
        ("/docs/test", "/docs/test", DOCS),
    ] {
        let ordinary = send(plain(path)).await;
        assert_eq!(ordinary.body, product, "{path}: untouched");
        assert_eq!(
            ordinary.header("link").as_deref(),
            Some(link(target).as_str()),
            "{path}"
        );
        assert!(varies(&ordinary), "{path}: {:?}", ordinary.headers);
        assert!(ordinary.header("agent-feedback").is_none(), "{path}");
        assert_ne!(
            ordinary.header("cache-control").as_deref(),
            Some("private, no-store")
        );
        let asked = send(asking(path)).await;
        instrumented(&asked, &r.epode, path);
        assert!(
            asked.header("link").is_none(),
            "{path}: {:?}",
            asked.headers
        );
        assert!(varies(&asked), "{path}");
    }
    let head = send(client().head(format!("{}/search", r.sc.base()))).await;
    assert_eq!(
        head.header("link").as_deref(),
        Some(link("/search").as_str())
    );
    // An excluded path: neither the link nor the Vary.
    let health = send(plain("/health")).await;
    assert!(
        health.header("link").is_none() && !varies(&health),
        "{:?}",
        health.headers
    );
    // Only the requests that asked are interactions.
    let all = events(&r.epode, 3).await;
    assert_eq!(all.len(), 3, "{all:?}");
}

/// `EPODE_SIDECAR_REQUEST_OBSERVATION=on`: an instrumented response's event carries what the
/// request said of its client, by Epode's allowlist only (the strict fake Epode validates it
/// and, as the real service does, would refuse it on an MCP event); off (the default), none.
#[tokio::test]
async fn request_observations_follow_the_allowlist_and_are_off_by_default() {
    let ask = |sc: &Sidecar| {
        client()
            .get(format!("{}/search?q=private-query", sc.base()))
            .header("user-agent", "  agent-browser/1.0  ")
            .header("accept-language", "fr-CH, fr;q=0.9")
            .header("referer", "https://user:pw@shop.example/cart?id=42")
            .header("sec-ch-ua", r#""Chromium";v="140""#)
            .header("sec-ch-ua-platform", r#""Linux""#)
            .header("sec-ch-ua-mobile", "?1")
            .header("cookie", "session=cookie-secret")
    };
    let on = rig("never_ask", &[("EPODE_SIDECAR_REQUEST_OBSERVATION", "on")]);
    let got = send(ask(&on.sc)).await;
    instrumented(&got, &on.epode, "/search observed");
    let e = &events(&on.epode, 1).await[0];
    assert_eq!(
        e["requestObservation"],
        json!({
            "clientIp": "127.0.0.1", "method": "GET", "userAgent": "agent-browser/1.0",
            "acceptLanguage": "fr-CH, fr;q=0.9", "referrerOrigin": "https://shop.example",
            "secChUa": r#""Chromium";v="140""#, "secChUaPlatform": r#""Linux""#,
            "secChUaMobile": "?1"
        }),
        "{e}"
    );
    let text = e.to_string();
    assert!(!text.contains("secret") && !text.contains("cart") && !text.contains("private-query"));
    let off = rig("never_ask", &[]);
    send(ask(&off.sc)).await;
    let e = &events(&off.epode, 1).await[0];
    assert!(e.get("requestObservation").is_none(), "{e}");
}

// ---------------------------------------------------------------------------------------
// Size, streams, memory
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn big_bodies_and_endless_streams_pass_within_the_limits() {
    // A 4 MiB budget: a sidecar that buffered the 10 MB body could not answer.
    let r = rig(
        "never_ask",
        &[("EPODE_SIDECAR_MEMORY_BUDGET_BYTES", "4194304")],
    );
    let expected = Sha256::digest(big_body());
    let warm = get(&r.sc, "/search", None).await;
    assert_eq!(warm.status, 200);
    let idle = rss_kib(r.sc.pid());

    for path in ["/big", "/big-chunked"] {
        let mut resp = client()
            .get(format!("{}{path}", r.sc.base()))
            .send()
            .await
            .expect("big");
        assert_eq!(resp.status(), 200, "{path}");
        // Read the first chunk, then check another request is served meanwhile.
        let mut hash = Sha256::new();
        let mut n = 0usize;
        let first = resp.chunk().await.expect("body").expect("a first chunk");
        hash.update(&first);
        n += first.len();
        let beside = get(&r.sc, "/search", Some("user-acme")).await;
        instrumented(&beside, &r.epode, "/search beside a 10 MB body");
        while let Some(chunk) = resp.chunk().await.expect("body") {
            hash.update(&chunk);
            n += chunk.len();
        }
        assert_eq!(n, BIG_SIZE, "{path}: every byte delivered");
        assert_eq!(
            hash.finalize(),
            expected,
            "{path}: the 10 MB body must pass untouched"
        );
    }
    let peak = status_kib(r.sc.pid(), "VmHWM");
    assert!(
        peak < idle + 8 * 1024,
        "the 10 MB bodies were held in memory: VmHWM {peak} KiB against {idle} KiB idle"
    );
    let text = metrics(&r.sc).await;
    assert_eq!(skipped(&text, "too_large"), 2, "{text}");

    // An endless chunked JSON body: past the bound it streams, incrementally.
    let mut json_stream = client()
        .get(format!("{}/stream-json", r.sc.base()))
        .send()
        .await
        .expect("stream-json");
    let mut got = 0usize;
    let deadline = Instant::now() + Duration::from_secs(10);
    while got < 2 * 1024 * 1024 {
        let left = deadline.saturating_duration_since(Instant::now());
        let chunk = tokio::time::timeout(left, json_stream.chunk())
            .await
            .expect("an endless JSON body must flow once past the bound, not be held")
            .expect("body")
            .expect("the stream does not end");
        got += chunk.len();
    }
    drop(json_stream);

    // The endless SSE stream: incremental, and over when the client drops it.
    let fds = open_fds(r.sc.pid());
    let mut sse = client()
        .get(format!("{}/stream", r.sc.base()))
        .send()
        .await
        .expect("stream");
    assert!(
        sse.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream")),
        "the SSE stream keeps its type"
    );
    for i in 0..3 {
        let chunk = tokio::time::timeout(Duration::from_secs(5), sse.chunk())
            .await
            .unwrap_or_else(|_| panic!("SSE event {i} did not arrive within 5 s: not streamed"))
            .expect("body")
            .expect("a chunk");
        assert!(String::from_utf8_lossy(&chunk).contains("data: tick"));
    }
    drop(sse);
    let released = eventually_async(Duration::from_secs(10), || {
        std::future::ready(open_fds(r.sc.pid()) <= fds)
    })
    .await;
    assert!(
        released,
        "the sidecar kept the dropped stream's connections: {} fds, {fds} before",
        open_fds(r.sc.pid())
    );
    let after = get(&r.sc, "/search", None).await;
    assert_eq!(after.status, 200, "the sidecar still serves after the drop");
}

// ---------------------------------------------------------------------------------------
// Pass-through
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn methods_headers_bodies_and_statuses_pass_through() {
    let r = rig("never_ask", &[]);
    for method in ["POST", "PUT", "DELETE", "PATCH", "GET"] {
        let body = format!("body of {method} \u{e9}");
        let got = send(
            client()
                .request(
                    reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
                    format!("{}/echo?q=1&r=%2F", r.sc.base()),
                )
                .header("authorization", "Bearer user-acme")
                .header("content-type", "text/plain; charset=utf-8")
                .header("x-custom", "kept")
                .body(body.clone()),
        )
        .await;
        assert_eq!(got.status, 200, "{method}: {}", got.text());
        assert_eq!(
            got.header("x-echo").as_deref(),
            Some("yes"),
            "{method}: the app's own headers pass"
        );
        let echo = got.json();
        assert_eq!(echo["method"], method, "{echo}");
        assert_eq!(
            echo["body"], body,
            "{method}: the request body passes: {echo}"
        );
        assert_eq!(
            echo["query"], "q=1&r=%2F",
            "{method}: the query passes: {echo}"
        );
        assert_eq!(echo["headers"]["x-custom"], "kept", "{echo}");
        assert_eq!(
            echo["headers"]["authorization"], "Bearer user-acme",
            "{echo}"
        );
        assert_eq!(
            echo["headers"]["content-type"], "text/plain; charset=utf-8",
            "{echo}"
        );
        assert!(got.header("epode-identity").is_none(), "{method}");
        instrumented(&got, &r.epode, method);
    }
    let missing = get(&r.sc, "/missing", None).await;
    assert_eq!(missing.status, 404, "statuses pass");
    let created = get(&r.sc, "/created", None).await;
    assert_eq!(created.status, 201, "statuses pass");
    let unknown = get(&r.sc, "/no/such/route", None).await;
    assert_eq!(unknown.status, 404);
    assert_eq!(
        unknown.json(),
        json!({"detail": "Not Found"}),
        "an unknown path is the app's 404, not the sidecar's"
    );
}

// ---------------------------------------------------------------------------------------
// Routing: surface off, operations prefix, MCP beside HTTP
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn with_the_surface_off_nothing_changes() {
    let app = App::start(true);
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let sc = feedback_sidecar(&format!("{}/mcp", app.origin()), &epode, "never_ask", &[]);
    let search = get(&sc, "/search", Some("user-acme")).await;
    assert_eq!(search.status, 404, "{}", search.text());
    assert_eq!(
        search.json(),
        json!({"error": "not found: MCP clients post to the configured path"}),
        "a non-MCP path is answered as today"
    );
    for path in ["/healthz", "/health"] {
        let got = get(&sc, path, None).await;
        assert_eq!(got.status, 200, "{path}");
        assert_eq!(
            got.json(),
            json!({"status": "ok"}),
            "{path} is the sidecar's"
        );
    }
    let metrics = get(&sc, "/metrics", None).await;
    assert_eq!(metrics.status, 200, "/metrics stays on the main port");
    let prefixed = get(&sc, "/_epode-sidecar/healthz", None).await;
    assert_eq!(
        prefixed.status, 404,
        "no operations prefix with the surface off"
    );
    let list = ts_call(&sc.url(), "pin", None, &[]);
    assert!(
        list["tools"].as_array().is_some_and(|t| !t.is_empty()),
        "MCP still works: {list}"
    );
    // The app's identity header is taken off the MCP path whatever the surface setting.
    let mut req = client()
        .post(sc.url())
        .header("authorization", "Bearer user-acme")
        .body(modern_body(json!(1), "tools/list", json!({})).to_string());
    for (k, v) in modern_headers("tools/list", None) {
        req = req.header(k, v);
    }
    let mcp = send(req).await;
    assert_eq!(mcp.status, 200, "{}", mcp.text());
    assert!(
        mcp.header("epode-identity").is_none(),
        "Epode-Identity must not reach an MCP client, surface off too"
    );
}

#[tokio::test]
async fn with_the_surface_on_the_app_owns_its_paths_and_mcp_still_works() {
    let r = rig_with("never_ask", true, &[]);
    let health = get(&r.sc, "/health", None).await;
    assert_eq!(
        health.json(),
        json!({"status": "app-ok"}),
        "/health must reach the app"
    );
    // The app has no /healthz: its own 404 (Starlette's plain `Not Found`, the MCP app being
    // mounted at the root), not the sidecar's health nor the sidecar's 404.
    let healthz = get(&r.sc, "/healthz", None).await;
    assert!(
        healthz.status == 404 && healthz.text() == "Not Found",
        "/healthz must reach the app (which has none): {} {}",
        healthz.status,
        healthz.text()
    );
    let ours = get(&r.sc, "/_epode-sidecar/healthz", None).await;
    assert_eq!(ours.status, 200);
    assert_eq!(
        ours.json(),
        json!({"status": "ok"}),
        "the sidecar's own health"
    );
    let ready = get(&r.sc, "/_epode-sidecar/readyz", None).await;
    assert_eq!(ready.status, 200, "{}", ready.text());
    let text = metrics(&r.sc).await;
    assert!(text.contains("epode_sidecar_http_skipped_total"), "{text}");
    // The bare-origin upstream: MCP is EPODE_SIDECAR_PATH on it, decorated as before.
    let list = ts_call(&r.sc.url(), "pin", None, &[]);
    let names: Vec<&str> = list["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("MCP through a bare-origin upstream: {list}"))
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(
        names.contains(&"echo") && names.contains(&"report_product_feedback"),
        "{names:?}"
    );
    // The identity header is taken off MCP responses too.
    let mut req = client()
        .post(r.sc.url())
        .header("authorization", "Bearer user-acme")
        .body(modern_body(json!(1), "tools/list", json!({})).to_string());
    for (k, v) in modern_headers("tools/list", None) {
        req = req.header(k, v);
    }
    let mcp = send(req).await;
    assert_eq!(mcp.status, 200, "{}", mcp.text());
    assert!(
        mcp.header("epode-identity").is_none(),
        "Epode-Identity must not reach an MCP client either"
    );
    // And the HTTP side beside it.
    let search = get(&r.sc, "/search", Some("user-acme")).await;
    instrumented(&search, &r.epode, "/search beside MCP");
}

#[tokio::test]
async fn the_admin_listener_keeps_the_bare_operations_paths() {
    let r = rig(
        "never_ask",
        &[
            ("EPODE_SIDECAR_ADMIN_LISTEN", "127.0.0.1:0"),
            ("EPODE_SIDECAR_OPERATIONS_PREFIX", "/ops"),
        ],
    );
    let admin = r.sc.admin.expect("the admin listener");
    let text = get_blocking(admin, "/metrics");
    assert!(
        text.contains("epode_sidecar_http_skipped_total{reason=\"head\"}"),
        "the HTTP metrics on the admin listener:\n{text}"
    );
    assert!(get_blocking(admin, "/healthz").contains("ok"));
    let ours = get(&r.sc, "/ops/healthz", None).await;
    assert_eq!(ours.status, 200, "the operator's prefix");
    let health = get(&r.sc, "/health", None).await;
    assert_eq!(health.json(), json!({"status": "app-ok"}));
    let old = get(&r.sc, "/_epode-sidecar/healthz", None).await;
    assert_eq!(
        old.json(),
        json!({"detail": "Not Found"}),
        "with another prefix the default one is the app's"
    );
}

/// A request body past `EPODE_SIDECAR_MAX_BODY_BYTES` is refused with 413 and a plain message
/// naming the setting, for a declared length and for a chunked body alike; the next request on
/// the surface is served as usual.
#[tokio::test]
async fn a_request_body_past_the_limit_gets_413_naming_the_setting() {
    let r = rig("never_ask", &[("EPODE_SIDECAR_MAX_BODY_BYTES", "1000")]);
    let big = "x".repeat(5000);
    let declared = send(
        client()
            .post(format!("{}/echo", r.sc.base()))
            .header("content-type", "text/plain")
            .body(big.clone()),
    )
    .await;
    let chunks = futures_util::stream::iter(
        (0..5).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from("y".repeat(1000)))),
    );
    let chunked = send(
        client()
            .post(format!("{}/echo", r.sc.base()))
            .header("content-type", "text/plain")
            .body(reqwest::Body::wrap_stream(chunks)),
    )
    .await;
    for (got, what) in [(declared, "declared length"), (chunked, "chunked")] {
        assert_eq!(got.status, 413, "{what}: {}", got.text());
        assert!(
            got.text().contains("EPODE_SIDECAR_MAX_BODY_BYTES"),
            "{what}: {}",
            got.text()
        );
        assert!(
            envelope_from(&got).is_none(),
            "{what}: a refusal is never instrumented"
        );
    }
    let small = send(
        client()
            .post(format!("{}/echo", r.sc.base()))
            .header("content-type", "text/plain")
            .body("small"),
    )
    .await;
    assert_eq!(small.status, 200, "{}", small.text());
    assert_eq!(small.json()["body"], "small");
}

// ---------------------------------------------------------------------------------------
// Operations without personal data; the surface beside MCP under load (issue 30, rows 13, 14)
// ---------------------------------------------------------------------------------------

/// A product (scripted) that answers every GET with a JSON object, `GET /hang…` never, every
/// `tools/call` at once but one of the tool `hang`, which it never answers.
fn product() -> Scripted {
    ScriptedUpstream::new()
        .when(
            |r| r.http_method() == "GET" && r.head.starts_with("GET /hang"),
            Reply::silent(),
        )
        .when(|r| r.http_method() == "GET", Reply::json(r#"{"ok": true}"#))
        .when(|r| r.tool() == Some("hang"), Reply::silent())
        .on(
            "tools/call",
            Reply::result(json!({"content": [{"type": "text", "text": "done"}], "isError": false})),
        )
        .start()
}

/// A sidecar with the surface on in front of `up` (feedback off, a 2026 upstream).
fn surface_sidecar(up: &Scripted, extra: &[(&str, &str)]) -> Sidecar {
    let mut env = vec![
        ("EPODE_SIDECAR_HTTP_SURFACE", "on"),
        ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28"),
    ];
    env.extend_from_slice(extra);
    Sidecar::start(&up.url(), &env)
}

/// One MCP `tools/call` of `tool`: its status and body.
async fn call(sc: &Sidecar, tool: &str, id: u64) -> (u16, Value) {
    let body = modern_body(
        json!(id),
        "tools/call",
        json!({"name": tool, "arguments": {}}),
    );
    let resp = post_modern(&sc.url(), "tools/call", Some(tool), &body).await;
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    let v = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{status}: not JSON: {text}"));
    (status, v)
}

/// How many requests the product received for which `f` holds.
fn received(up: &Scripted, f: impl Fn(&Request) -> bool) -> usize {
    up.requests().iter().filter(|r| f(r)).count()
}

/// Starts `n` requests that never get an answer from the product, in the background.
fn hanging(
    sc: &Sidecar,
    n: usize,
    f: impl Fn(&Sidecar, usize) -> reqwest::RequestBuilder,
) -> Vec<tokio::task::JoinHandle<Got>> {
    (0..n)
        .map(|i| {
            let req = f(sc, i);
            tokio::spawn(send(req))
        })
        .collect()
}

/// Issue 30 row 13: Epode's contract forbids deriving anything from names, e-mails or caller
/// input, so no token, name or address reaches Epode as (part of) an operation: each segment
/// that is not a route word is `:id`, and the operator's templates name what the default gets
/// wrong (`/users/jane/orders/7` would keep `jane`).
#[tokio::test]
async fn every_segment_that_is_no_route_word_reaches_epode_as_id() {
    let up = product();
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let sc = feedback_sidecar(
        &up.url(),
        &epode,
        "never_ask",
        &[
            ("EPODE_SIDECAR_HTTP_SURFACE", "on"),
            ("EPODE_SIDECAR_TELEMETRY_FLUSH", "20ms"),
            (
                "EPODE_SIDECAR_HTTP_ROUTES",
                "/users/{id}/orders/{id}, /Reports/{year}",
            ),
        ],
    );
    let jwt = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJqYW5lQGV4YW1wbGUuY29tIn0.c2lnbmF0dXJlLXNpZ25hdHVyZQ";
    let cases = [
        (format!("/reset/{jwt}"), "/reset/:id"),
        ("/invite/Xk9fQ2mZ7pLw".to_owned(), "/invite/:id"),
        ("/search/jane-doe-1985".to_owned(), "/search/:id"),
        (
            "/accounts/john.smith/orders/42".to_owned(),
            "/accounts/:id/orders/:id",
        ),
        (
            "/profiles/jane%40example.com?tab=orders".to_owned(),
            "/profiles/:id",
        ),
        ("/profiles/jane@example.com".to_owned(), "/profiles/:id"),
        ("/weird/a%20b".to_owned(), "/weird/:id"),
        ("/api/v2/orders/A-1001".to_owned(), "/api/v2/orders/:id"),
        // The template: the default alone would have kept the name.
        ("/users/jane/orders/7".to_owned(), "/users/:id/orders/:id"),
        ("/users/jane/orders/7/".to_owned(), "/users/:id/orders/:id"),
        // A template's literals are the operator's, kept as written.
        ("/Reports/2024".to_owned(), "/Reports/:id"),
        ("/api/v2/orders".to_owned(), "/api/v2/orders"),
    ];
    let mut claims = Vec::new();
    for (path, _) in &cases {
        let got = get(&sc, path, None).await;
        claims.push(instrumented(&got, &epode, path).1);
    }
    let all = events(&epode, cases.len()).await;
    for ((path, want), claims) in cases.iter().zip(&claims) {
        let e = event_for(&all, claims);
        assert_eq!(e["operation"], *want, "the operation of {path}: {e}");
        check_event(e, "http_json", want, 200);
    }
    let sent = serde_json::to_string(&all).unwrap();
    for secret in [
        "eyJ", "Xk9f", "jane", "john", "smith", "1985", "example", "A-1001", "2024", "%",
    ] {
        assert!(
            !sent.contains(secret),
            "`{secret}` of a path reached Epode: {all:#?}"
        );
    }
}

/// A bad template is refused at start with a message naming the setting and the template.
#[test]
fn a_bad_route_template_is_refused_at_start_by_name() {
    let out = Command::new(env!("CARGO_BIN_EXE_epode-sidecar"))
        .arg("--check-config")
        .env_clear()
        .env("EPODE_SIDECAR_UPSTREAM", "http://127.0.0.1:9/mcp")
        .env("AGENT_FEEDBACK_MODE", "off")
        .env("EPODE_SIDECAR_HTTP_SURFACE", "on")
        .env("EPODE_SIDECAR_HTTP_ROUTES", "/users/{id}, /orders/{id")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("EPODE_SIDECAR_HTTP_ROUTES")
            && err.contains("`/orders/{id`")
            && err.contains("{name}"),
        "{err}"
    );
}

/// Issue 30 row 14: with 4 upstream connections, four surface requests the product never
/// answers hold only the surface's share (2): the two past it get 503 with `Retry-After`
/// after the wait, nothing sent, and every MCP call meanwhile is served.
#[tokio::test]
async fn hanging_surface_requests_leave_the_mcp_path_its_connections() {
    let up = product();
    let sc = surface_sidecar(
        &up,
        &[
            ("EPODE_SIDECAR_UPSTREAM_MAX_CONNECTIONS", "4"),
            ("EPODE_SIDECAR_UPSTREAM_WAIT", "300ms"),
            ("EPODE_SIDECAR_UPSTREAM_TIMEOUT", "2m"),
        ],
    );
    let stuck = hanging(&sc, 4, |sc, i| {
        client().get(format!("{}/hang/{i}", sc.base()))
    });
    let held = eventually_async(Duration::from_secs(10), || {
        std::future::ready(received(&up, |r| r.head.starts_with("GET /hang")) == 2)
    })
    .await;
    assert!(
        held,
        "two hanging surface requests should reach the product: {:?}",
        up.requests()
    );
    // The two past the surface's share: refused after the wait, not sent.
    let refused = eventually_async(Duration::from_secs(10), || {
        std::future::ready(stuck.iter().filter(|h| h.is_finished()).count() == 2)
    })
    .await;
    assert!(
        refused,
        "two surface requests past the share should be refused"
    );
    let mut still = Vec::new();
    for h in stuck {
        if h.is_finished() {
            let got = h.await.unwrap();
            assert_eq!(got.status, 503, "{}", got.text());
            assert_eq!(got.header("retry-after").as_deref(), Some("1"));
            assert!(
                got.text().contains("EPODE_SIDECAR_HTTP_UPSTREAM_SHARE"),
                "{}",
                got.text()
            );
        } else {
            still.push(h);
        }
    }
    assert_eq!(still.len(), 2);
    // The MCP path has its own two connections: every call is served, at once.
    for id in 0..10 {
        let started = Instant::now();
        let (status, v) = call(&sc, "work", id).await;
        assert_eq!(status, 200, "MCP call {id} while the surface hangs: {v}");
        assert_eq!(v["result"]["content"][0]["text"], "done", "{v}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }
    assert_eq!(
        received(&up, |r| r.head.starts_with("GET /hang")),
        2,
        "nothing refused was sent"
    );
    for h in still {
        h.abort();
    }
}

/// And the other way round: MCP calls the product never answers hold only the MCP path's
/// share, and the surface is served beside them.
#[tokio::test]
async fn hanging_mcp_calls_leave_the_surface_its_connections() {
    let up = product();
    let sc = surface_sidecar(
        &up,
        &[
            ("EPODE_SIDECAR_UPSTREAM_MAX_CONNECTIONS", "4"),
            ("EPODE_SIDECAR_UPSTREAM_WAIT", "300ms"),
            ("EPODE_SIDECAR_UPSTREAM_TIMEOUT", "2m"),
        ],
    );
    let calls: Vec<_> = (0..4)
        .map(|id| {
            let url = sc.url();
            tokio::spawn(async move {
                let body = modern_body(
                    json!(id),
                    "tools/call",
                    json!({"name": "hang", "arguments": {}}),
                );
                post_modern(&url, "tools/call", Some("hang"), &body)
                    .await
                    .status()
                    .as_u16()
            })
        })
        .collect();
    let held = eventually_async(Duration::from_secs(10), || {
        std::future::ready(received(&up, |r| r.tool() == Some("hang")) == 2)
    })
    .await;
    assert!(
        held,
        "two hanging calls should reach the product: {:?}",
        up.methods()
    );
    let refused = eventually_async(Duration::from_secs(10), || {
        std::future::ready(calls.iter().filter(|h| h.is_finished()).count() == 2)
    })
    .await;
    assert!(
        refused,
        "two calls past the MCP path's share should be refused"
    );
    for id in 0..10 {
        let got = get(&sc, &format!("/ok/{id}"), None).await;
        assert_eq!(
            got.status,
            200,
            "surface request {id} while MCP hangs: {}",
            got.text()
        );
        assert_eq!(got.json(), json!({"ok": true}));
    }
    let mut statuses = Vec::new();
    for h in calls {
        if h.is_finished() {
            statuses.push(h.await.unwrap());
        } else {
            h.abort();
        }
    }
    assert_eq!(statuses, [503, 503]);
    assert_eq!(received(&up, |r| r.tool() == Some("hang")), 2);
}

/// The per-client rate limit holds on the surface (429 with `Retry-After`, nothing sent), counted
/// apart from the MCP path: the same client's MCP calls keep their own allowance.
#[tokio::test]
async fn the_client_rate_limit_counts_surface_requests() {
    let up = product();
    let sc = surface_sidecar(&up, &[("EPODE_SIDECAR_RATE_LIMIT", "2/s")]);
    let started = Instant::now();
    let (mut passed, mut limited) = (0_u64, 0_u64);
    for i in 0..60 {
        let got = get(&sc, &format!("/ok/{i}"), None).await;
        match got.status {
            200 => passed += 1,
            429 => {
                limited += 1;
                let after: u64 = got
                    .header("retry-after")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                assert!((1..=2).contains(&after), "Retry-After {after}");
                assert!(
                    got.text().contains("EPODE_SIDECAR_RATE_LIMIT"),
                    "{}",
                    got.text()
                );
            }
            other => panic!("surface GET {i}: {other} {}", got.text()),
        }
    }
    // A burst of 2, then 2 a second.
    let allowed = 2 + 2 * started.elapsed().as_secs() + 2;
    assert!(
        limited > 0 && passed <= allowed,
        "{passed} passed, {limited} limited, at most {allowed} allowed"
    );
    assert_eq!(
        received(&up, |r| r.head.starts_with("GET /ok/")) as u64,
        passed,
        "a limited request is not sent"
    );
    let (status, v) = call(&sc, "work", 1).await;
    assert_eq!(status, 200, "the MCP path counts its own allowance: {v}");
    let text = metrics(&sc).await;
    let hits = metric_value(
        &text,
        "epode_sidecar_limits_hit_total{kind=\"client_rate\"}",
    );
    assert_eq!(hits, limited, "{text}");
}

/// The surface's requests in flight are bounded as the MCP path's (`EPODE_SIDECAR_MAX_IN_FLIGHT`)
/// and counted apart: past it 503 with `Retry-After` at once, and the MCP path still serves.
#[tokio::test]
async fn the_surface_has_its_own_in_flight_bound() {
    let up = product();
    let sc = surface_sidecar(
        &up,
        &[
            ("EPODE_SIDECAR_MAX_IN_FLIGHT", "2"),
            ("EPODE_SIDECAR_UPSTREAM_TIMEOUT", "2m"),
        ],
    );
    let stuck = hanging(&sc, 2, |sc, i| {
        client().get(format!("{}/hang/{i}", sc.base()))
    });
    let held = eventually_async(Duration::from_secs(10), || {
        std::future::ready(received(&up, |r| r.head.starts_with("GET /hang")) == 2)
    })
    .await;
    assert!(held, "{:?}", up.requests());
    let started = Instant::now();
    let third = get(&sc, "/ok/1", None).await;
    assert_eq!(third.status, 503, "{}", third.text());
    assert_eq!(third.header("retry-after").as_deref(), Some("1"));
    assert!(
        third.text().contains("EPODE_SIDECAR_MAX_IN_FLIGHT"),
        "{}",
        third.text()
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "refused at once: {:?}",
        started.elapsed()
    );
    assert_eq!(received(&up, |r| r.head.starts_with("GET /ok/")), 0);
    let (status, v) = call(&sc, "work", 1).await;
    assert_eq!(
        status, 200,
        "the MCP path has its own requests in flight: {v}"
    );
    for h in stuck {
        h.abort();
    }
}

// ---------------------------------------------------------------------------------------
// Issue 30 rows 5, 8, 16: HEAD as GET, no unasked 101, only product methods are interactions
// ---------------------------------------------------------------------------------------

/// A HEAD answer carries the header fields GET's does (RFC 9110 §9.3.2): on an instrumented
/// route private and without the app's `Content-Length`, which the envelope changes (it once
/// kept the app's `Content-Length: 8` and no `Cache-Control` while GET had 2361 and
/// `private, no-store`); on a skipped route the app's own fields, as GET's. HEAD mints nothing.
#[tokio::test]
async fn head_gets_the_header_fields_get_gets() {
    let r = rig("never_ask", &[]);
    let user = "Bearer user-acme";
    for path in ["/docs/test", "/search", "/cached"] {
        let get = send(
            client()
                .get(format!("{}{path}", r.sc.base()))
                .header("authorization", user),
        )
        .await;
        let head = send(
            client()
                .head(format!("{}{path}", r.sc.base()))
                .header("authorization", user),
        )
        .await;
        assert_eq!((get.status, head.status), (200, 200), "{path}");
        assert!(head.body.is_empty(), "{path}: HEAD has no body");
        for name in ["cache-control", "content-type", "etag", "last-modified"] {
            assert_eq!(
                head.header(name),
                get.header(name),
                "{path}: HEAD's {name} differs from GET's"
            );
        }
        let get_length = get.header("content-length");
        let head_length = head.header("content-length");
        assert!(
            head_length.is_none() || head_length == get_length,
            "{path}: HEAD says Content-Length {head_length:?}, GET {get_length:?}"
        );
        assert!(head.header("agent-feedback").is_none(), "{path}");
    }
    // Two instrumented GETs (the page and the JSON object); /cached is shared-cacheable.
    let all = events(&r.epode, 2).await;
    let operations: Vec<&str> = all.iter().filter_map(|e| e["operation"].as_str()).collect();
    assert_eq!(operations.len(), 2, "{all:?}");
    assert!(!operations.contains(&"/cached"), "{all:?}");
    let text = metrics(&r.sc).await;
    assert_eq!(skipped(&text, "head"), 3, "{text}");
}

/// OPTIONS (a CORS preflight) and TRACE are the HTTP machinery's, not the product's: their
/// answers pass untouched and are no interaction (no handle, no telemetry event). They once
/// each got a signed handle and an event.
#[tokio::test]
async fn options_and_trace_are_no_interactions() {
    let r = rig("never_ask", &[]);
    for method in ["OPTIONS", "TRACE"] {
        let got = send(
            client()
                .request(
                    reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
                    format!("{}/echo", r.sc.base()),
                )
                .header("authorization", "Bearer user-acme")
                .header("origin", r.sc.base())
                .header("access-control-request-method", "POST"),
        )
        .await;
        assert_eq!(got.status, 200, "{method}: {}", got.text());
        let echo = got.json();
        assert_eq!(echo["method"], method, "{echo}");
        assert!(echo.get("_agentFeedback").is_none(), "{method}: {echo}");
        assert!(got.header("agent-feedback").is_none(), "{method}");
        assert!(got.header("epode-identity").is_none(), "{method}");
    }
    // A product GET afterwards: its event is the only one.
    let product = get(&r.sc, "/echo", Some("user-acme")).await;
    instrumented(&product, &r.epode, "GET /echo");
    let all = events(&r.epode, 1).await;
    assert_eq!(all[0]["operation"], "/echo", "{all:?}");
    let text = metrics(&r.sc).await;
    assert_eq!(skipped(&text, "method"), 2, "{text}");
}

/// The statuses of the answers in `raw`, in order (a body may end without a line break).
fn statuses_in(raw: &[u8]) -> Vec<u16> {
    let text = String::from_utf8_lossy(raw);
    text.split("HTTP/1.1 ")
        .skip(1)
        .filter_map(|rest| rest.get(..3)?.parse().ok())
        .collect()
}

/// Reads answers from a raw connection until `n` status lines have come, the connection
/// ends, or 20 s pass.
async fn status_lines(stream: &mut tokio::net::TcpStream, n: usize) -> Vec<u16> {
    use tokio::io::AsyncReadExt as _;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while statuses_in(&seen).len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Ok(Ok(k)) if k > 0 => seen.extend_from_slice(&buf[..k]),
            _ => break,
        }
    }
    statuses_in(&seen)
}

/// A 101 the client did not ask for is the app's mistake: 502, and the client's connection
/// stays HTTP (its next pipelined request is answered). It was relayed, and the next request
/// never answered. The MCP path's hop says the same.
#[tokio::test]
async fn an_unasked_101_is_a_502_and_the_connection_goes_on() {
    use tokio::io::AsyncWriteExt as _;
    let switching = || {
        Reply::empty(101)
            .header("upgrade", "websocket")
            .header("connection", "upgrade")
    };
    let up = ScriptedUpstream::new()
        .when(|r| r.head.starts_with("GET /switch"), switching())
        .when(|r| r.http_method() == "GET", Reply::json(r#"{"ok": true}"#))
        .when(|r| r.tool() == Some("switch"), switching())
        .on(
            "tools/call",
            Reply::result(json!({"content": [{"type": "text", "text": "done"}], "isError": false})),
        )
        .start();
    let sc = surface_sidecar(&up, &[]);
    let host = sc.base().trim_start_matches("http://").to_owned();
    let mut stream = tokio::net::TcpStream::connect(&host).await.unwrap();
    let pipelined = format!(
        "GET /switch HTTP/1.1\r\nHost: {host}\r\n\r\nGET /after HTTP/1.1\r\nHost: {host}\r\n\r\n"
    );
    stream.write_all(pipelined.as_bytes()).await.unwrap();
    let statuses = status_lines(&mut stream, 2).await;
    assert_eq!(statuses, [502, 200], "the answers on one connection");

    let (status, body) = call(&sc, "switch", 7).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["id"], 7, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("101"),
        "{body}"
    );
    let (status, body) = call(&sc, "other", 8).await;
    assert_eq!(status, 200, "the MCP path goes on: {body}");
}

/// The skip rules read the path as the app does (decoded): an encoded spelling of an excluded
/// path is excluded too. `/%69nternal/x` was instrumented while `/internal/x` was not.
#[tokio::test]
async fn an_encoded_spelling_of_an_excluded_path_is_excluded() {
    let r = rig(
        "never_ask",
        &[("EPODE_SIDECAR_HTTP_EXCLUDE", "/internal/*")],
    );
    for path in [
        "/internal/x",
        "/%69nternal/x",
        "/%69%6Eternal/x",
        "/%69nternal/%78",
    ] {
        let got = get(&r.sc, path, Some("user-acme")).await;
        assert_eq!(got.status, 200, "{path}: {}", got.text());
        untouched(&got, br#"{"internal": "x"}"#, path);
    }
    let text = metrics(&r.sc).await;
    assert_eq!(skipped(&text, "excluded_path"), 4, "{text}");
}

/// Pages whose first `</head>` or `</body>` (as bytes) is no boundary a browser sees: it sits in
/// a title, a textarea, a raw text element, a template, after `<plaintext>`, in a comment or in
/// an SVG CDATA section. Each page's real boundary comes later (or, for `plaintext`, never).
const TRAPS: &[(&str, &str)] = &[
    (
        "title",
        "<!doctype html><html><head><title>Docs </head> and more</title><meta charset=\"utf-8\"></head><body><p>title trap</p></body></html>",
    ),
    (
        "title-upper",
        "<!DOCTYPE html><HTML><HEAD><TITLE lang=\"en\">Up </HEAD> case</TITLE ></HEAD><BODY><P>upper trap</P></BODY></HTML>",
    ),
    (
        "textarea",
        "<!doctype html><title>t</title><body><form><textarea name=\"note\">Dear team, </body> ends a page.</textarea></form><p>after</p></body></html>",
    ),
    (
        "textarea-upper",
        "<!doctype html><title>t</title><BODY><TEXTAREA cols=40>a </BODY> b</TextArea\n><p>after</p></BODY>",
    ),
    (
        "noscript-head",
        "<!doctype html><html><head><title>n</title><noscript><p>enable JS </head> please</p></noscript></head><body><p>noscript trap</p></body></html>",
    ),
    (
        "noscript-body",
        "<!doctype html><title>n</title><body><noscript>JS is off </body> here</noscript><p>after</p></body></html>",
    ),
    (
        "template",
        "<!doctype html><html><head><title>tp</title><template id=\"row\"><template><b>inner</b></template><p>a </head> b</p></template></head><body><p>template trap</p></body></html>",
    ),
    (
        "xmp",
        "<!doctype html><title>x</title><body><xmp>Example: <p>hi</p></body></xmp><p>after</p></body></html>",
    ),
    (
        "plaintext",
        "<!doctype html><title>p</title><body><p>before</p><plaintext>raw </body> text <b>not bold</b>",
    ),
    (
        "iframe",
        "<!doctype html><title>i</title><body><iframe>fallback </body> text</iframe><p>after</p></body></html>",
    ),
    (
        "noembed",
        "<!doctype html><title>e</title><body><noembed>no plugins </body> here</noembed><p>after</p></body></html>",
    ),
    (
        "noframes",
        "<!doctype html><title>f</title><body><noframes>no frames </body> here</noframes><p>after</p></body></html>",
    ),
    (
        "comment",
        "<!doctype html><html><head><title>c</title><!-- the old layout closed </head> here --></head><body><p>comment trap</p></body></html>",
    ),
    (
        "svg-cdata",
        "<!doctype html><title>s</title><body><svg width=\"200\" height=\"20\"><text x=\"0\" y=\"15\"><![CDATA[1 > 0 </body> ok]]></text></svg><p>after</p></body></html>",
    ),
];

/// Issue 30 row 4: for every trap, Chromium finds the envelope with
/// `getElementById('agent-feedback')` (a JSON script, the schema's envelope) and the page reads
/// as the product's own: the same title, visible body text and textarea values as the page
/// fetched straight from the product.
#[tokio::test]
async fn chromium_finds_the_html_envelope_and_reads_the_page_unchanged() {
    let up = ScriptedUpstream::new()
        .when_fn(
            |r| r.http_method() == "GET" && r.head.starts_with("GET /trap/"),
            |r| {
                let path = r.head.split(' ').nth(1).unwrap_or_default();
                match TRAPS
                    .iter()
                    .find(|(name, _)| path == format!("/trap/{name}"))
                {
                    Some((_, page)) => Reply::body("text/html; charset=utf-8").text(page),
                    None => Reply::empty(404),
                }
            },
        )
        .otherwise(Reply::empty(404))
        .start();
    let epode = FakeEpode::start(FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask"));
    let sc = feedback_sidecar(
        &up.url(),
        &epode,
        "never_ask",
        &[
            ("EPODE_SIDECAR_HTTP_SURFACE", "on"),
            ("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28"),
        ],
    );
    let origin = up.url().trim_end_matches("/mcp").to_owned();
    for (name, page) in TRAPS {
        let got = get(&sc, &format!("/trap/{name}"), None).await;
        let (rest, _) = without_tag(&got.body);
        assert_eq!(rest, page.as_bytes(), "{name}: the page's own bytes change");
    }
    let mut urls = Vec::new();
    for (name, _) in TRAPS {
        urls.push(format!("{origin}/trap/{name}"));
        urls.push(format!("{}/trap/{name}", sc.base()));
    }
    let out = Command::new("node")
        .arg(repo_root().join("tests/peers/html_check.mjs"))
        .args(&urls)
        .env("EPODE_PEERS_TS", peers_dir().join("ts"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let seen: Vec<Value> = serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
        panic!(
            "html_check printed no JSON:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(seen.len(), urls.len(), "{stdout}");
    let mut wrong = Vec::new();
    for ((name, _), pair) in TRAPS.iter().zip(seen.chunks(2)) {
        let (direct, proxied) = (&pair[0], &pair[1]);
        assert!(direct["error"].is_null(), "{name}: {direct}");
        assert!(proxied["error"].is_null(), "{name}: {proxied}");
        assert!(
            direct["feedback"].is_null(),
            "{name}: the product's page has no envelope: {direct}"
        );
        let feedback = &proxied["feedback"];
        match feedback["json"].as_str().map(serde_json::from_str::<Value>) {
            Some(Ok(env)) if feedback["tag"] == "SCRIPT" => {
                schema_ok(&env, name);
                assert_eq!(feedback["type"], "application/json", "{name}: {feedback}");
            }
            _ => wrong.push(format!(
                "{name}: no agent-feedback script element (title {}, text {})",
                short(&proxied["title"]),
                short(&proxied["text"])
            )),
        }
        for what in ["title", "text", "textareas"] {
            if direct[what] != proxied[what] {
                wrong.push(format!(
                    "{name}: {what} differs: direct {} vs through the sidecar {}",
                    short(&direct[what]),
                    short(&proxied[what])
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// `v` as JSON, cut to its first 160 characters (an envelope in the wrong place is long).
fn short(v: &Value) -> String {
    let text = v.to_string();
    match text.char_indices().nth(160) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}

/// An app that carries Epode itself, seen by one of its responses carrying its own envelope:
/// with `auto` (the default) the sidecar steps back on every later response, so one the app
/// leaves bare (as Epode's SDKs do after a customer's "no") stays bare and sends no event;
/// before it was seen, the sidecar instrumented as usual. (`none`:
/// `every_skip_reason_is_counted_under_its_label`.)
#[tokio::test]
async fn an_app_that_carries_epode_itself_is_left_to_it() {
    let r = rig("never_ask", &[]);
    let user = Some("user-acme");
    let before = get(&r.sc, "/search", user).await;
    assert!(
        String::from_utf8_lossy(&before.body).contains("_agentFeedback"),
        "instrumented before the app's own envelope was seen"
    );
    let owns = get(&r.sc, "/owns", user).await;
    untouched(&owns, OWNS, "/owns");
    let after = get(&r.sc, "/search", user).await;
    untouched(&after, SEARCH, "/search after /owns");
    assert!(after.header("agent-feedback").is_none());
    let text = metrics(&r.sc).await;
    assert!(
        text.contains("epode_sidecar_upstream_epode{carries=\"binding\"} 1"),
        "{text}"
    );
    // One event: the first /search's; none for what the app answers itself.
    let one = eventually_async(Duration::from_secs(10), || {
        std::future::ready(r.epode.events().len() == 1)
    })
    .await;
    assert!(one, "{:?}", r.epode.events());
    let more = eventually_async(Duration::from_millis(700), || {
        std::future::ready(r.epode.events().len() > 1)
    })
    .await;
    assert!(!more, "{:?}", r.epode.events());
}
