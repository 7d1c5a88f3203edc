//! The MCP authorization front door's settings (the sidecar as an OAuth 2.1 resource server,
//! MCP 2026-07-28 `basic/authorization`) and the [`AuthConfig`] built from them. Off by
//! default: nothing changes for a sidecar whose callers are trusted by where they stand.

use std::time::Duration;

use url::Url;

use super::setting::{
    a_duration, boolean, bounded, duration, number, read_all, setting, settings, split_list, text,
    Accepts, Bad, ConfigError, Layers, Refused,
};
use std::collections::BTreeMap;

use super::types::{redact_url, AuthConfig, AuthMode, Config, OperationKind, OperationScopes};

/// The authorization settings; `None` when `auth` is off.
pub(super) fn read(l: &Layers) -> Result<Option<AuthConfig>, Refused> {
    let mode = l.get(&AUTH)?;
    if mode == AuthMode::Off {
        return Ok(None);
    }
    let required = |doc: &super::setting::Doc| {
        l.refuse(
            doc,
            ConfigError::Missing {
                name: doc.name(),
                accepts: format!(
                    "{}; it is needed with EPODE_SIDECAR_AUTH={}",
                    doc.accepts.text(),
                    mode.as_str()
                )
                .into(),
            },
        )
    };
    let issuer = l
        .optional(&AUTH_ISSUER)
        .and_then(|i| i.ok_or_else(|| required(&AUTH_ISSUER.doc)));
    let resource = l
        .optional(&AUTH_RESOURCE)
        .and_then(|r| r.ok_or_else(|| required(&AUTH_RESOURCE.doc)));
    let client_id = l.optional(&AUTH_CLIENT_ID);
    let client_secret = l.optional(&AUTH_CLIENT_SECRET);
    // Introspection authenticates the sidecar: both are needed, and both are named when missing.
    let needed = |value: Result<Option<String>, Refused>, doc| match (mode, value) {
        (AuthMode::Introspect, Ok(None)) => Err(required(doc)),
        (_, value) => value,
    };
    let client_id = needed(client_id, &AUTH_CLIENT_ID.doc);
    let client_secret = needed(client_secret, &AUTH_CLIENT_SECRET.doc);
    let user_claim = l.get(&AUTH_USER_CLAIM);
    let account_claim = l.optional(&AUTH_ACCOUNT_CLAIM);
    read_all!(AuthConfig {
        mode: Ok(mode),
        issuer,
        resource,
        scopes: l.optional(&AUTH_SCOPES).map(Option::unwrap_or_default),
        algorithms: l.get(&AUTH_ALGORITHMS),
        leeway: l.get(&AUTH_LEEWAY),
        token_type: l.optional(&AUTH_TOKEN_TYPE),
        user_claim,
        account_claim,
        client_id,
        client_secret,
        forward_token: l.get(&AUTH_FORWARD_TOKEN),
        cache_entries: l.get(&AUTH_CACHE_ENTRIES),
        keys_refresh: l.get(&AUTH_KEYS_REFRESH),
        keys_max_age: l.get(&AUTH_KEYS_MAX_AGE),
        fetch_timeout: l.get(&AUTH_FETCH_TIMEOUT),
        documentation: l.optional(&AUTH_DOCUMENTATION),
        introspection_cache: l.get(&AUTH_INTROSPECTION_CACHE),
        http_surface: l.get(&AUTH_HTTP_SURFACE),
        operation_scopes: l
            .optional(&AUTH_OPERATION_SCOPES)
            .map(Option::unwrap_or_default),
        implies: l
            .optional(&AUTH_SCOPE_IMPLIES)
            .map(Option::unwrap_or_default),
        audience: l.optional(&AUTH_AUDIENCE).map(Option::unwrap_or_default),
        facade: l.get(&AUTH_FACADE),
    })
    .map(Some)
}

fn mode(v: &str) -> Result<AuthMode, Bad> {
    match v.to_ascii_lowercase().as_str() {
        "off" => Ok(AuthMode::Off),
        "jwt" => Ok(AuthMode::Jwt),
        "introspect" => Ok(AuthMode::Introspect),
        _ => Err(Bad::Whole),
    }
}

/// The issuer, exactly as the authorization server writes it in `iss`: an `https://` URL
/// (`http://` only on a loopback host), no query, no fragment.
fn issuer(raw: &str) -> Result<String, Bad> {
    let url = Url::parse(raw).map_err(|_| Bad::Whole)?;
    let scheme_ok =
        url.scheme() == "https" || (url.scheme() == "http" && super::types::loopback_url(&url));
    if !scheme_ok || url.query().is_some() || url.fragment().is_some() || url.host().is_none() {
        return Err(Bad::Whole);
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(Bad::Described("an issuer URL with credentials in it"));
    }
    // Kept as written: `iss` is compared as a string (RFC 8414 §3.3, RFC 9068 §4).
    Ok(raw.to_owned())
}

/// The canonical URI of this MCP server (RFC 8707, MCP's "canonical server URI"): scheme,
/// host, port and path, lower-case scheme and host, no fragment, no query, no trailing `/`.
fn resource(raw: &str) -> Result<String, Bad> {
    let url = Url::parse(raw).map_err(|_| Bad::Whole)?;
    if !matches!(url.scheme(), "https" | "http") || url.host().is_none() {
        return Err(Bad::Whole);
    }
    if url.fragment().is_some() || url.query().is_some() {
        return Err(Bad::Described("a resource URI with a query or fragment"));
    }
    if raw.ends_with('/') {
        return Err(Bad::Described(
            "a resource URI ending in / (write it without the trailing slash)",
        ));
    }
    // `Url` lower-cases the scheme and host; an empty path stays empty.
    let mut canonical = url.to_string();
    if url.path() == "/" && !raw.ends_with('/') {
        canonical.pop();
    }
    Ok(canonical)
}

/// The audiences a token may name besides the resource: identifiers as the issuer writes
/// them in `aud` (an Entra application id, `api://…`, a Keycloak client id), at most 8.
fn audiences(raw: &str) -> Result<Vec<String>, Bad> {
    let mut out: Vec<String> = Vec::new();
    for a in split_list(raw) {
        let printable = a.bytes().all(|b| (0x21..=0x7E).contains(&b));
        if !printable || a.len() > 256 {
            return Err(Bad::Entry(a));
        }
        if !out.contains(&a) {
            out.push(a);
        }
    }
    if out.len() > 8 {
        return Err(Bad::Described("more than 8 audiences"));
    }
    Ok(out)
}

/// A URL the metadata may point people to.
fn documentation(raw: &str) -> Result<String, Bad> {
    let url = Url::parse(raw).map_err(|_| Bad::Whole)?;
    matches!(url.scheme(), "https" | "http")
        .then(|| url.to_string())
        .ok_or(Bad::Whole)
}

/// A scope token (RFC 6749 §3.3: printable ASCII but space, `"` and `\`).
fn scope_token(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b == 0x21 || (0x23..=0x5B).contains(&b) || (0x5D..=0x7E).contains(&b))
}

/// Scopes separated by spaces or commas; `offline_access` is no scope of a resource (MCP:
/// it SHOULD NOT appear in a challenge or `scopes_supported`).
fn scopes(raw: &str) -> Result<Vec<String>, Bad> {
    let mut out: Vec<String> = Vec::new();
    for s in raw
        .split([' ', ','])
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        if !scope_token(s) || s == "offline_access" {
            return Err(Bad::Entry(s.to_owned()));
        }
        if !out.iter().any(|o| o == s) {
            out.push(s.to_owned());
        }
    }
    if out.len() > 32 {
        return Err(Bad::Described("more than 32 scopes"));
    }
    Ok(out)
}

/// Asymmetric JWS algorithms only: an HMAC algorithm would verify with a public key as its
/// secret (the classic confusion), and `none` verifies nothing.
const ALGORITHMS: [&str; 9] = [
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA",
];

fn algorithms(raw: &str) -> Result<Vec<jsonwebtoken::Algorithm>, Bad> {
    let list = split_list(raw);
    if list.is_empty() {
        return Err(Bad::Whole);
    }
    list.iter()
        .map(|a| {
            ALGORITHMS
                .iter()
                .find(|k| k.eq_ignore_ascii_case(a))
                .and_then(|k| k.parse().ok())
                .ok_or_else(|| Bad::Entry(a.clone()))
        })
        .collect()
}

/// Whether a claim's name says it holds a person's name, address, handle or contact: Epode's
/// contract forbids refs derived from them. Read on the name's last part (`cognito:username`,
/// `https://example.com/email`), case aside: any name with `name` (`preferred_username`,
/// `given_name`, `unique_name`), `mail`, `login`, `phone`, `address` or `upn` in it.
fn is_personal_claim(name: &str) -> bool {
    let last = name
        .rsplit([':', '/'])
        .next()
        .unwrap_or(name)
        .to_ascii_lowercase();
    ["name", "mail", "login", "phone", "address", "upn", "birth"]
        .iter()
        .any(|p| last.contains(p))
}

fn claim(raw: &str) -> Result<String, Bad> {
    let name = raw.trim();
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-:./".contains(&b));
    if !ok {
        return Err(Bad::Whole);
    }
    if is_personal_claim(name) {
        return Err(Bad::Described(
            "a claim that names a person (an e-mail, a name, a user name): Epode's refs must be opaque ids, never derived from them; name a claim holding an id, such as sub or a tenant id",
        ));
    }
    Ok(name.to_owned())
}

fn token_type(raw: &str) -> Result<String, Bad> {
    let t = raw.trim();
    let ok = !t.is_empty() && t.len() <= 64 && t.bytes().all(|b| b.is_ascii_graphic());
    ok.then(|| t.to_owned()).ok_or(Bad::Whole)
}

/// The most rules in `auth_operation_scopes` (each request may be compared with every one).
const RULES_MAX: usize = 64;

/// `tool:search_*=mcp:read; prompt:*=mcp:prompts; resource:file:///private/**=mcp:private`:
/// rules separated by `;`, each a kind, `:`, a glob of names (`*` within a `/` segment, `**`
/// across), `=` and the scopes (the last `=` splits, so a resource URI may hold one).
pub(super) fn operation_scopes(raw: &str) -> Result<Vec<OperationScopes>, Bad> {
    let rules: Vec<&str> = raw
        .split(';')
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .collect();
    if rules.len() > RULES_MAX {
        return Err(Bad::Described("more than 64 rules"));
    }
    rules
        .iter()
        .map(|rule| {
            let bad = || Bad::Entry((*rule).to_owned());
            let (kind, rest) = rule.split_once(':').ok_or_else(bad)?;
            let kind = match kind.trim() {
                "tool" => OperationKind::Tool,
                "prompt" => OperationKind::Prompt,
                "resource" => OperationKind::Resource,
                _ => return Err(bad()),
            };
            let (pattern, needs) = rest.rsplit_once('=').ok_or_else(bad)?;
            let pattern = pattern.trim();
            let scopes = scopes(needs).map_err(|_| bad())?;
            if pattern.is_empty() || scopes.is_empty() {
                return Err(bad());
            }
            let matcher = globset::GlobBuilder::new(pattern)
                .literal_separator(true)
                .build()
                .map_err(|_| bad())?
                .compile_matcher();
            Ok(OperationScopes {
                kind,
                pattern: pattern.to_owned(),
                matcher,
                scopes,
            })
        })
        .collect()
}

/// `mcp:admin=mcp:tools mcp:read; mcp:tools=mcp:read`: what a scope also grants, closed
/// (a scope grants what the scopes it grants grant), at most 64 rules.
fn implies(raw: &str) -> Result<BTreeMap<String, Vec<String>>, Bad> {
    let mut direct: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let rules: Vec<&str> = raw
        .split(';')
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .collect();
    if rules.len() > RULES_MAX {
        return Err(Bad::Described("more than 64 rules"));
    }
    for rule in rules {
        let bad = || Bad::Entry(rule.to_owned());
        let (parent, children) = rule.split_once('=').ok_or_else(bad)?;
        let parent = parent.trim();
        if !scope_token(parent) || parent.contains('=') {
            return Err(bad());
        }
        let children = scopes(children).map_err(|_| bad())?;
        direct
            .entry(parent.to_owned())
            .or_default()
            .extend(children);
    }
    let mut closed = BTreeMap::new();
    for parent in direct.keys() {
        let mut granted: Vec<String> = Vec::new();
        let mut todo: Vec<&str> = direct[parent].iter().map(String::as_str).collect();
        while let Some(s) = todo.pop() {
            if s == parent || granted.iter().any(|g| g == s) {
                continue;
            }
            granted.push(s.to_owned());
            if let Some(more) = direct.get(s) {
                todo.extend(more.iter().map(String::as_str));
            }
        }
        closed.insert(parent.clone(), granted);
    }
    Ok(closed)
}

fn shown<T>(c: &Config, f: impl Fn(&AuthConfig) -> T) -> Option<T> {
    c.auth.as_ref().map(f)
}

const NOT_USED: &str = "<not used>";

settings! {
    /// The authorization front door's settings.
    pub(super) AUTH_GROUP {
        AUTH: AuthMode = setting(
            "auth",
            &["EPODE_SIDECAR_AUTH"],
            Some("off"),
            "off, jwt or introspect",
            "The MCP authorization front door (MCP 2026-07-28 authorization: the sidecar is the OAuth 2.1 resource server). `off`: requests are not authorised here (the client's `Authorization` goes upstream as before). `jwt`: every MCP request needs a JWT access token from `EPODE_SIDECAR_AUTH_ISSUER` for `EPODE_SIDECAR_AUTH_RESOURCE`, checked against the issuer's published keys. `introspect`: opaque tokens, checked at the issuer's introspection endpoint (RFC 7662) with `EPODE_SIDECAR_AUTH_CLIENT_ID`/`_SECRET`. With `jwt` or `introspect` the sidecar serves Protected Resource Metadata (RFC 9728) at `/.well-known/oauth-protected-resource` and its path-suffixed form, answers a missing or invalid token with 401 and a `WWW-Authenticate` challenge, and never passes the client's token upstream unless `EPODE_SIDECAR_AUTH_FORWARD_TOKEN` says so. See docs/authorization.md.",
            mode,
            |c| c.auth.as_ref().map_or(AuthMode::Off, |a| a.mode).as_str().to_owned(),
        ),
        AUTH_ISSUER: String = setting(
            "auth_issuer",
            &["EPODE_SIDECAR_AUTH_ISSUER"],
            None,
            "the authorization server's issuer identifier, an https:// URL (http:// only on a loopback host) exactly as its tokens' iss claim writes it",
            "With auth on: the one authorization server whose tokens are accepted. Its metadata (RFC 8414 `/.well-known/oauth-authorization-server`, else OpenID discovery) gives the keys (`jwks_uri`) or the introspection endpoint; a token's `iss` must equal it exactly. Required with auth on.",
            issuer,
            |c| shown(c, |a| redact_url(&a.issuer).into_owned()).unwrap_or_else(|| NOT_USED.into()),
        ),
        AUTH_RESOURCE: String = setting(
            "auth_resource",
            &["EPODE_SIDECAR_AUTH_RESOURCE"],
            None,
            "this MCP server's canonical URI as its clients reach it, such as https://mcp.example.com/mcp (no trailing slash, query or fragment)",
            "With auth on: the resource identifier (RFC 8707, RFC 9728 `resource`) and the audience every token must name in `aud`. A token without `aud`, or for another resource, is refused whatever else it carries. Required with auth on.",
            resource,
            |c| shown(c, |a| a.resource.clone()).unwrap_or_else(|| NOT_USED.into()),
        ),
        AUTH_SCOPES: Vec<String> = setting(
            "auth_scopes",
            &["EPODE_SIDECAR_AUTH_SCOPES"],
            None,
            "scopes separated by spaces or commas, at most 32 (not offline_access)",
            "With auth on: the scopes every MCP request needs (also the metadata's `scopes_supported` and the challenge's `scope`). A token lacking one gets 403 `insufficient_scope` naming them all. Unset: any valid token for the resource.",
            scopes,
            |c| shown(c, |a| a.scopes.join(" ")).filter(|s| !s.is_empty()).unwrap_or_else(|| "<none>".into()),
        ),
        AUTH_ALGORITHMS: Vec<jsonwebtoken::Algorithm> = setting(
            "auth_algorithms",
            &["EPODE_SIDECAR_AUTH_ALGORITHMS"],
            Some("RS256,PS256,ES256,EdDSA"),
            "comma-separated JWS algorithms among RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA",
            "With `auth=jwt`: the signature algorithms a token may use. HMAC algorithms and `none` are never accepted.",
            algorithms,
            |c| shown(c, |a| a.algorithms.iter().map(|x| format!("{x:?}")).collect::<Vec<_>>().join(",")).unwrap_or_else(|| NOT_USED.into()),
        ),
        AUTH_LEEWAY: Duration = bounded(
            "auth_leeway",
            &["EPODE_SIDECAR_AUTH_LEEWAY"],
            Some("30s"),
            Accepts::duration(Duration::ZERO, Duration::from_secs(300), "30s"),
            "With auth on: the clock skew allowed when checking a token's `exp`, `nbf` and `iat`.",
            a_duration,
            |c| shown(c, |a| duration(a.leeway)).unwrap_or_else(|| NOT_USED.into()),
        ),
        AUTH_TOKEN_TYPE: String = setting(
            "auth_token_type",
            &["EPODE_SIDECAR_AUTH_TOKEN_TYPE"],
            None,
            "a JWT typ such as at+jwt",
            "With `auth=jwt`: the `typ` header every token must carry (RFC 9068 access tokens say `at+jwt`; `application/at+jwt` is the same). Unset: not checked.",
            token_type,
            |c| shown(c, |a| a.token_type.clone().unwrap_or_else(|| "<not checked>".into())).unwrap_or_else(|| NOT_USED.into()),
        ),
        AUTH_USER_CLAIM: String = setting(
            "auth_user_claim",
            &["EPODE_SIDECAR_AUTH_USER_CLAIM"],
            Some("sub"),
            "a claim name holding an opaque id (not email, name or another claim naming a person)",
            "With auth on: the claim that becomes Epode's `userRef` (and the subject the upstream is told, `Epode-Auth-Subject`). Epode gets a keyed hash of it (stable for one product key), never the value, unless the token is an OAuth client's own (its subject its `client_id`, as client-credentials tokens are) and the value already an Epode ref (`A-Z a-z 0-9 _ . : -`, 1 to 160). A claim whose name says it names a person (containing `name`, `mail`, `login`, `phone`, `address`, `upn`, `birth`) is refused at start.",
            claim,
            |c| shown(c, |a| a.user_claim.clone()).unwrap_or_else(|| NOT_USED.into()),
        ),
        AUTH_ACCOUNT_CLAIM: String = setting(
            "auth_account_claim",
            &["EPODE_SIDECAR_AUTH_ACCOUNT_CLAIM"],
            None,
            "a claim name holding a tenant or organisation id, such as org_id or tid",
            "With auth on: the claim that becomes Epode's `accountRef` (and `customerRef` in `ask_once`, which then asks once per account). Unset: no `accountRef` from the token.",
            claim,
            |c| shown(c, |a| a.account_claim.clone().unwrap_or_else(|| "<none>".into())).unwrap_or_else(|| NOT_USED.into()),
        ),
        AUTH_CLIENT_ID: String = setting(
            "auth_client_id",
            &["EPODE_SIDECAR_AUTH_CLIENT_ID"],
            None,
            "the sidecar's client id at the authorization server",
            "With `auth=introspect`: the client id the sidecar authenticates with at the introspection endpoint (HTTP Basic). Required there.",
            text,
            |c| shown(c, |a| a.client_id.clone().unwrap_or_else(|| "<unset>".into())).unwrap_or_else(|| NOT_USED.into()),
        ),
        AUTH_CLIENT_SECRET: String = setting(
            "auth_client_secret",
            &["EPODE_SIDECAR_AUTH_CLIENT_SECRET"],
            None,
            "the sidecar's client secret at the authorization server",
            "With `auth=introspect`: the client secret for the introspection endpoint. Required there; never printed (the chart takes it from a Secret only).",
            text,
            |c| shown(c, |a| if a.client_secret.is_some() { "<set>" } else { "<unset>" }.to_owned()).unwrap_or_else(|| NOT_USED.into()),
        )
        .secret(),
        AUTH_FORWARD_TOKEN: bool = setting(
            "auth_forward_token",
            &["EPODE_SIDECAR_AUTH_FORWARD_TOKEN"],
            Some("false"),
            "true or false",
            "With auth on: `true` passes the client's verified token upstream in `Authorization` besides the claims headers. MCP forbids passing a token on to a service it was not issued for: use it only when the upstream is the same resource (it validates the same audience). Default: the upstream never sees the token.",
            boolean,
            |c| shown(c, |a| a.forward_token.to_string()).unwrap_or_else(|| NOT_USED.into()),
        ),
        AUTH_CACHE_ENTRIES: usize = bounded(
            "auth_cache_entries",
            &["EPODE_SIDECAR_AUTH_CACHE_ENTRIES"],
            Some("10000"),
            Accepts::whole("tokens", 1, 1_000_000),
            "With auth on: how many verified tokens are remembered (by their SHA-256, until they expire, the least recently used forgotten first), so a client's repeated calls cost no signature check or introspection.",
            number,
            |c| shown(c, |a| a.cache_entries.to_string()).unwrap_or_else(|| NOT_USED.into()),
        ),
        AUTH_KEYS_REFRESH: Duration = bounded(
            "auth_keys_refresh",
            &["EPODE_SIDECAR_AUTH_KEYS_REFRESH"],
            Some("30s"),
            Accepts::duration(Duration::from_secs(1), Duration::from_secs(3600), "30s"),
            "With `auth=jwt`: how often the issuer's keys may be fetched again. A token naming a key (`kid`) the sidecar does not hold fetches them again (a rotation is caught at once), but such fetches happen at most once per interval, so a flood of unknown keys costs one fetch per interval; the keys are otherwise kept for their HTTP cache lifetime (1 minute to 1 day, 5 minutes without one) and fetched again then, also at most once per interval. Two fetches are never less than a second apart.",
            a_duration,
            |c| shown(c, |a| duration(a.keys_refresh)).unwrap_or_else(|| NOT_USED.into()),
        ),
        AUTH_KEYS_MAX_AGE: Duration = bounded(
            "auth_keys_max_age",
            &["EPODE_SIDECAR_AUTH_KEYS_MAX_AGE"],
            Some("24h"),
            Accepts::duration(Duration::from_secs(1), Duration::from_secs(24 * 3600), "1h"),
            "With `auth=jwt`: how long the issuer's keys are kept at most, whatever their HTTP cache lifetime says (a shorter lifetime still wins). Once they are past it, a request uses them while they are fetched again in the background (a key endpoint that hangs never holds a request), and a token verified with the keys before is verified again with the new ones (a token whose key left the set is refused from then on, not at its own `exp`). Lower it where the issuer can revoke a key without waiting for its caches.",
            a_duration,
            |c| shown(c, |a| duration(a.keys_max_age)).unwrap_or_else(|| NOT_USED.into()),
        ),
        AUTH_FETCH_TIMEOUT: Duration = bounded(
            "auth_fetch_timeout",
            &["EPODE_SIDECAR_AUTH_FETCH_TIMEOUT"],
            Some("5s"),
            Accepts::duration(Duration::from_millis(100), Duration::from_secs(60), "5s"),
            "With auth on: the deadline of each request to the authorization server (metadata, keys, introspection); its answers are read up to 1 MiB.",
            a_duration,
            |c| shown(c, |a| duration(a.fetch_timeout)).unwrap_or_else(|| NOT_USED.into()),
        ),
        AUTH_HTTP_SURFACE: bool = setting(
            "auth_http_surface",
            &["EPODE_SIDECAR_AUTH_HTTP_SURFACE"],
            Some("false"),
            "true or false",
            "With auth on and the HTTP surface on: `true` checks the product's other routes the same way (a bearer token for the resource with the base scopes, the claims headers set and the token removed), answering 401/403 with the challenge. Default: only the MCP path is checked (the sidecar's `Epode-Auth-*` headers are removed from every request either way).",
            boolean,
            |c| shown(c, |a| a.http_surface.to_string()).unwrap_or_else(|| NOT_USED.into()),
        ),
        AUTH_INTROSPECTION_CACHE: Duration = bounded(
            "auth_introspection_cache",
            &["EPODE_SIDECAR_AUTH_INTROSPECTION_CACHE"],
            Some("60s"),
            Accepts::duration(Duration::from_secs(1), Duration::from_secs(3600), "60s"),
            "With `auth=introspect`: how long an active token's introspection answer is kept (never past its `exp`): a token revoked at the authorization server is refused within this time. An inactive token's answer is kept 5 seconds.",
            a_duration,
            |c| shown(c, |a| duration(a.introspection_cache)).unwrap_or_else(|| NOT_USED.into()),
        ),
        AUTH_DOCUMENTATION: String = setting(
            "auth_documentation",
            &["EPODE_SIDECAR_AUTH_DOCUMENTATION"],
            None,
            "an http(s) URL",
            "With auth on: `resource_documentation` in the Protected Resource Metadata, a page for people about this server's authorization.",
            documentation,
            |c| shown(c, |a| a.documentation.clone().unwrap_or_else(|| "<none>".into())).unwrap_or_else(|| NOT_USED.into()),
        ),
        AUTH_OPERATION_SCOPES: Vec<OperationScopes> = setting(
            "auth_operation_scopes",
            &["EPODE_SIDECAR_AUTH_OPERATION_SCOPES"],
            None,
            "rules separated by ;, at most 64, each tool:, prompt: or resource: then a glob of names, = and the scopes, such as tool:delete_*=mcp:admin; resource:file:///private/**=mcp:private",
            "With auth on: scopes a `tools/call`, `prompts/get` or `resources/read` needs besides `EPODE_SIDECAR_AUTH_SCOPES`, by the tool's or prompt's name or the resource's URI (`*` within a `/` segment, `**` across; every rule that matches adds its scopes). A token lacking one gets 403 `insufficient_scope` naming every scope the call needs, so the client can ask for them at once. The two feedback tools need only the base scopes.",
            operation_scopes,
            |c| shown(c, |a| a.operation_scopes.iter().map(|r| format!("{}:{}={}", match r.kind { OperationKind::Tool => "tool", OperationKind::Prompt => "prompt", OperationKind::Resource => "resource" }, r.pattern, r.scopes.join(" "))).collect::<Vec<_>>().join("; ")).filter(|s| !s.is_empty()).unwrap_or_else(|| "<none>".into()),
        ),
        AUTH_AUDIENCE: Vec<String> = setting(
            "auth_audience",
            &["EPODE_SIDECAR_AUTH_AUDIENCE"],
            None,
            "audience identifiers separated by commas, at most 8, each as the issuer writes it in aud (such as api://1b2c… or an application id)",
            "With auth on: the `aud` values a token may name instead of `EPODE_SIDECAR_AUTH_RESOURCE`, for an issuer whose tokens name an audience of its own (Entra ID: the application id, or its Application ID URI `api://…`; Keycloak: a client id; Okta and Auth0: the audience configured there). A token naming the resource is accepted either way. A scope the sidecar needs written `<audience>/<name>` (Entra's `api://…/mcp.tools`, what the client must ask for) is also held by a token whose scope claim says the bare `<name>` when `<audience>` is one of these. Unset: only the resource. See docs/oauth/.",
            audiences,
            |c| shown(c, |a| a.audience.join(",")).filter(|s| !s.is_empty()).unwrap_or_else(|| "<the resource>".into()),
        ),
        AUTH_FACADE: bool = setting(
            "auth_facade",
            &["EPODE_SIDECAR_AUTH_FACADE"],
            Some("false"),
            "true or false (on or off)",
            "With auth on: `true` makes the sidecar stand in front of the issuer's authorization and token endpoints for an issuer that refuses RFC 8707's `resource` parameter, which every MCP client sends (Entra ID: `AADSTS9010010`). It serves authorization server metadata of its own (issuer `<the resource's origin>/oauth`, at `/.well-known/oauth-authorization-server/oauth` and `/.well-known/openid-configuration/oauth`), copied from the issuer's but for `authorization_endpoint` (`/oauth/authorize`: a redirect to the issuer's without `resource`), `token_endpoint` (`/oauth/token`: the form passed to the issuer's without `resource`, 64 KiB at most, within `EPODE_SIDECAR_AUTH_FETCH_TIMEOUT`, in the caller's place of `EPODE_SIDECAR_AUTH_INTROSPECTIONS_PER_CALLER`), `code_challenge_methods_supported` (`S256` when the issuer omits it) and no RFC 9207 `iss` promise; the Protected Resource Metadata names it as the authorization server. Tokens are still the issuer's, checked as before. For an issuer that sends RFC 9207's `iss` in its authorization responses (Keycloak, oidc-provider) it cannot work: a client compares that `iss` with the facade's. See docs/oauth/entra-id.md.",
            boolean,
            |c| shown(c, |a| a.facade.to_string()).unwrap_or_else(|| NOT_USED.into()),
        ),
        AUTH_SCOPE_IMPLIES: BTreeMap<String, Vec<String>> = setting(
            "auth_scope_implies",
            &["EPODE_SIDECAR_AUTH_SCOPE_IMPLIES"],
            None,
            "rules separated by ;, at most 64, each a scope, = and the scopes it grants, such as mcp:admin=mcp:write mcp:read; mcp:write=mcp:read",
            "With auth on: the scope hierarchy (MCP asks a server to honour the hierarchies it defines): a token holding a scope also holds every scope it grants, directly or through others.",
            implies,
            |c| shown(c, |a| a.implies.iter().map(|(k, v)| format!("{k}={}", v.join(" "))).collect::<Vec<_>>().join("; ")).filter(|s| !s.is_empty()).unwrap_or_else(|| "<none>".into()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_rules_and_the_hierarchy_are_read() {
        let rules = operation_scopes(
            "tool:delete_*=mcp:admin mcp:write; resource:file:///a/**?x=1=mcp:private",
        )
        .unwrap();
        assert_eq!(rules.len(), 2);
        assert!(rules[0].matcher.is_match("delete_user") && !rules[0].matcher.is_match("list"));
        assert_eq!(rules[0].scopes, ["mcp:admin", "mcp:write"]);
        assert_eq!(rules[1].kind, OperationKind::Resource);
        assert_eq!(rules[1].pattern, "file:///a/**?x=1");
        for bad in [
            "delete_*=mcp:admin",
            "tool:x",
            "tool:=a",
            "tool:x=",
            "thing:x=a",
        ] {
            assert!(operation_scopes(bad).is_err(), "{bad}");
        }
        let h = implies("mcp:admin=mcp:write; mcp:write=mcp:read; mcp:read=mcp:admin").unwrap();
        assert_eq!(h["mcp:admin"], ["mcp:write", "mcp:read"]);
        assert_eq!(h["mcp:read"], ["mcp:admin", "mcp:write"], "a circle ends");
        assert!(implies("a").is_err());
    }

    #[test]
    fn the_resource_is_canonical_or_refused() {
        assert_eq!(
            resource("HTTPS://MCP.Example.com/mcp").unwrap(),
            "https://mcp.example.com/mcp"
        );
        assert_eq!(
            resource("https://mcp.example.com").unwrap(),
            "https://mcp.example.com"
        );
        assert_eq!(
            resource("http://127.0.0.1:9000/mcp").unwrap(),
            "http://127.0.0.1:9000/mcp"
        );
        for bad in [
            "https://a.example/mcp/",
            "https://a.example/mcp#x",
            "https://a.example/mcp?x=1",
            "mcp",
            "ftp://a/x",
            "https://a.example/",
        ] {
            assert!(resource(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn issuers_are_https_or_loopback_and_kept_as_written() {
        assert_eq!(
            issuer("https://as.example.com/realms/x").unwrap(),
            "https://as.example.com/realms/x"
        );
        assert_eq!(
            issuer("https://as.example.com/").unwrap(),
            "https://as.example.com/"
        );
        assert!(issuer("http://127.0.0.1:4000").is_ok());
        for bad in [
            "http://as.example.com",
            "https://u:p@as.example.com",
            "https://as.example.com?x",
            "as",
        ] {
            assert!(issuer(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_asymmetric_algorithms_are_taken() {
        assert_eq!(algorithms("RS256, es256").unwrap().len(), 2);
        for bad in ["HS256", "none", "RS256,HS512", ""] {
            assert!(algorithms(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn scopes_are_tokens_and_claims_are_no_personal_data() {
        assert_eq!(
            scopes("mcp:tools, mcp:read mcp:tools").unwrap(),
            ["mcp:tools", "mcp:read"]
        );
        assert!(scopes("offline_access").is_err());
        assert!(scopes("a\"b").is_err());
        for good in [
            "org_id",
            "sub",
            "oid",
            "tid",
            "org",
            "azp",
            "https://example.com/tenant",
        ] {
            assert_eq!(claim(good).unwrap(), good);
        }
        for bad in [
            "email",
            "Name",
            "preferred_username",
            "username",
            "cognito:username",
            "login",
            "mail",
            "https://example.com/email",
            "upn",
            "phone_number",
            "a b",
            "",
        ] {
            assert!(claim(bad).is_err(), "{bad}");
        }
    }
}
