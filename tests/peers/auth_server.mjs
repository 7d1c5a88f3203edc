// OAuth 2.1 authorization server peer for epode-sidecar's authorization tests:
// oidc-provider 9.13.3 (panva, OpenID Certified) behind one node:http server that
// adds test controls under /_test/ and a scriptable login/consent interaction.
//
// Run from the installed copy (bare imports resolve against $D/ts/node_modules):
//   node $D/ts/auth_server.mjs [--port N] [--config JSON]
// The configuration is the JSON of --config, else of $EPODE_AS_CONFIG, else {}.
// --port (or "port") defaults to 0: a free port. Issuer: http://127.0.0.1:<port>
// (no trailing slash). When listening it prints ONE line on stdout:
//   {"issuer":"http://127.0.0.1:PORT","port":PORT}
// and nothing else on stdout (oidc-provider's notices go to stderr).
//
// Configuration (every field optional):
//   resource     string or array: the resource indicators (RFC 8707) it knows, e.g.
//                the sidecar's canonical URI "http://127.0.0.1:9000/mcp". Default
//                ["http://127.0.0.1/mcp"]. Any other `resource` gets invalid_target.
//   format       "jwt" (default): a token requested with a known `resource` is a JWT
//                access token (RFC 9068, header typ "at+jwt", RS256, aud = resource);
//                "opaque": an opaque token (introspect it).
//   scopes       the resource's scopes, default ["mcp:tools","mcp:read","mcp:admin"].
//                They are also registered as the AS's scopes (so that registered
//                clients may name them in their `scope` metadata).
//   ttl          access token lifetime in seconds, default 300.
//   org          the default `org` claim, default "acme".
//   clients      static confidential client_credentials clients, default
//                [{"client_id":"svc-client","client_secret":"svc-secret",
//                  "scope":"mcp:tools mcp:read","org":"acme"}]
//                `scope` is what that client may ask for (more: invalid_scope);
//                `org` its tokens' org claim (default: the default org).
//                They authenticate with client_secret_basic or client_secret_post.
//   introspector the sidecar's confidential client for introspection (RFC 7662) and
//                revocation (RFC 7009), default
//                {"client_id":"sidecar-introspector","client_secret":"introspector-secret"}
//   accounts     {"<account id>": {"org": "..."}} for the authorization-code flow;
//                any account id may log in, unknown ones get the default org.
//   entra        true: behave as Microsoft Entra ID does where MCP clients meet it: an
//                authorization or token request carrying RFC 8707's `resource` is refused
//                (invalid_target, "AADSTS9010010: The resource parameter provided in the
//                request doesn't match with the requested scopes."; the authorization
//                request's error goes to the client's redirect_uri, as Entra sends it);
//                no RFC 8414 document (404: OpenID discovery only), whose
//                code_challenge_methods_supported and
//                authorization_response_iss_parameter_supported are left out, and no
//                RFC 9207 `iss` in authorization responses. Tokens are then for
//                `defaultResource`. Default false.
//   defaultResource the resource indicator a request without `resource` gets (one of
//                `resource`, such as an application id URI "api://…"), default none.
//   algs         signing algorithms of the generated keys, default
//                ["RS256","ES256","EdDSA"]; RS256 (when listed) signs access tokens,
//                else the first one listed.
//
// What it serves (oidc-provider's own endpoints, see /.well-known/openid-configuration
// and /.well-known/oauth-authorization-server):
//   grants authorization_code (PKCE S256 required for every client), refresh_token
//   (issued to every client allowed the grant, no offline_access needed),
//   client_credentials; dynamic client registration (RFC 7591, open); introspection;
//   revocation; JWKS at /jwks.
//   Tokens: `sub` (client id for client_credentials, account id for the code flow),
//   `org`, `scope`, `client_id`, `iss`, `aud` (the resource), `iat`, `exp`, `jti`.
//   A token asked for WITHOUT `resource` is opaque and has no audience (oidc-provider
//   issues those for its own userinfo endpoint); introspection shows it without `aud`.
//   JWT access tokens are never stored by oidc-provider: its introspection and
//   revocation endpoints refuse them (400 unsupported_token_type).
//
// Interactions (the login and consent pages of the code flow), JSON instead of HTML:
//   GET  /interaction/<uid>  {"uid","prompt":{name,reasons,details},"params"}
//   POST /interaction/<uid>  body (JSON or form) {"account":"alice"} logs in as that
//        account (login prompt) or grants every requested scope and resource (consent
//        prompt); {"deny":true} ends the flow with error=access_denied. Answers 303 to
//        where the flow goes on. tests/peers/as_login.mjs drives it (approve()).
//
// Test controls (only this peer has them), JSON in and out:
//   POST /_test/mint {"header":{},"claims":{},"key":"current","secret":"pem","bare":false}
//        -> {"token": "<compact JWT>"}. Header defaults {alg:"RS256",typ:"at+jwt",kid:<the
//        current key of that alg>}; claims default to what a real token holds (iss, aud =
//        the first resource, sub, client_id, scope = all scopes, org, iat, exp = now+ttl,
//        jti) unless "bare": true; given fields override, a null one is removed.
//        key: "current"  signed with the AS's current private key of header.alg
//             "previous" with the key the last /_test/rotate retired (still in the JWKS)
//             "foreign"  with a key of that alg the JWKS never lists (kid kept as given)
//             "none"     unsigned: alg "none", empty signature
//             "hs256-public" HS256 whose HMAC secret is the current RSA public key as
//                        PEM (SPKI, "secret":"pem", default; /_test/keys "pem") or as
//                        the JSON of its public JWK in the order /_test/keys lists it
//                        (kty, n, e, kid, alg, use; "secret":"jwk"): the
//                        algorithm-confusion attack
//   POST /_test/rotate   new keys for every alg; the JWKS becomes [new..., old...] and new
//        tokens carry the new kid -> {"kids":[...new],"previous":[...old]}. (oidc-provider
//        keeps its keys for its lifetime, so a new Provider takes over; sessions, grants,
//        tokens and registered clients live in one memory store (100,000 entries, LRU)
//        that every Provider of the process shares, and survive.)
//   POST /_test/revoke {"token":"..."} -> {"revoked":bool}: destroys a stored (opaque)
//        access, client_credentials or refresh token.
//   GET  /_test/jwks-hits -> {"hits":N}: requests to /jwks so far (every mode counts).
//   POST /_test/jwks-mode {"mode":"normal"|"hang"|"huge"|"many"} -> {"mode":...}
//        hang: /jwks never answers; huge: a 50 MB JSON body, streamed; many: 10,000 keys
//        in all: copies of the RSA public key under filler kids, then the real keys
//        (current and previous) last.
//   GET  /_test/keys -> {"current":[public JWKs],"previous":[...],"pem":"<RSA SPKI PEM>"}
import { createServer } from 'node:http';
import * as crypto from 'node:crypto';
import { once } from 'node:events';
import { format } from 'node:util';
import Provider, { errors } from 'oidc-provider';
// oidc-provider's own in-memory adapter, over one store that every Provider instance of
// this process shares (its default gives each instance a store of its own, 1,000 entries),
// so that sessions, grants, tokens and registered clients outlive a key rotation. Deep
// imports: the package has no "exports" map, and its version is pinned.
import MemoryAdapter from 'oidc-provider/lib/adapters/memory_adapter.js';
import LRU from 'oidc-provider/lib/helpers/lru.js';

// stdout carries the ready line only.
for (const level of ['log', 'info', 'warn', 'debug']) {
  console[level] = (...args) => process.stderr.write(`${format(...args)}\n`);
}

function usage(msg) {
  if (msg) console.error(`auth_server: ${msg}`);
  console.error('usage: node auth_server.mjs [--port N] [--config JSON]');
  process.exit(64);
}

const argv = process.argv.slice(2);
let portArg;
let configText = process.env.EPODE_AS_CONFIG;
for (let i = 0; i < argv.length; i++) {
  const a = argv[i];
  if (a === '--port') portArg = argv[++i];
  else if (a.startsWith('--port=')) portArg = a.slice('--port='.length);
  else if (a === '--config') configText = argv[++i];
  else if (a.startsWith('--config=')) configText = a.slice('--config='.length);
  else if (a === '-h' || a === '--help') usage();
  else usage(`unknown argument ${a}`);
}
let cfgIn;
try {
  cfgIn = configText ? JSON.parse(configText) : {};
} catch (e) {
  usage(`the configuration is not JSON: ${e.message}`);
}

const cfg = {
  port: Number(portArg ?? cfgIn.port ?? 0),
  resources: [].concat(cfgIn.resource ?? 'http://127.0.0.1/mcp'),
  format: cfgIn.format ?? 'jwt',
  scopes: cfgIn.scopes ?? ['mcp:tools', 'mcp:read', 'mcp:admin'],
  ttl: cfgIn.ttl ?? 300,
  org: cfgIn.org ?? 'acme',
  clients: cfgIn.clients ?? [
    { client_id: 'svc-client', client_secret: 'svc-secret', scope: 'mcp:tools mcp:read', org: 'acme' },
  ],
  introspector: cfgIn.introspector ?? {
    client_id: 'sidecar-introspector',
    client_secret: 'introspector-secret',
  },
  accounts: cfgIn.accounts ?? {},
  algs: cfgIn.algs ?? ['RS256', 'ES256', 'EdDSA'],
  entra: cfgIn.entra === true,
  defaultResource: cfgIn.defaultResource,
};
if (!Number.isInteger(cfg.port) || cfg.port < 0) usage('--port N must be a port number');
if (!['jwt', 'opaque'].includes(cfg.format)) usage('format must be "jwt" or "opaque"');
for (const alg of cfg.algs) {
  if (!['RS256', 'ES256', 'EdDSA'].includes(alg)) usage(`unsupported alg ${alg}`);
}
const tokenAlg = cfg.algs.includes('RS256') ? 'RS256' : cfg.algs[0];

// ---- keys ------------------------------------------------------------------------
async function generateKey(alg) {
  const generate = (type, options) => new Promise((resolve, reject) => {
    crypto.generateKeyPair(type, options, (err, publicKey, privateKey) => (
      err ? reject(err) : resolve({ publicKey, privateKey })));
  });
  let pair;
  if (alg === 'RS256') pair = await generate('rsa', { modulusLength: 2048 });
  else if (alg === 'ES256') pair = await generate('ec', { namedCurve: 'P-256' });
  else pair = await generate('ed25519', {});
  const kid = `${alg.toLowerCase()}-${crypto.randomBytes(6).toString('hex')}`;
  const meta = { kid, alg, use: 'sig' };
  return {
    alg,
    kid,
    privateKey: pair.privateKey,
    publicKey: pair.publicKey,
    privateJwk: { ...pair.privateKey.export({ format: 'jwk' }), ...meta },
    publicJwk: { ...pair.publicKey.export({ format: 'jwk' }), ...meta },
  };
}

const generateSet = () => Promise.all(cfg.algs.map(generateKey));

let currentKeys;
let previousKeys = [];
let foreignKeys;

// ---- the provider ----------------------------------------------------------------
const cookieKeys = [crypto.randomBytes(32).toString('base64url')];
const store = new LRU({ maxSize: 100000 });
const adapter = (model) => new MemoryAdapter(model, store);
let issuer;
let provider;
let handler;

function orgOfClient(clientId) {
  return cfg.clients.find((c) => c.client_id === clientId)?.org ?? cfg.org;
}

function makeProvider(keys) {
  const resourceServerInfo = (ctx, indicator) => {
    if (!cfg.resources.includes(indicator)) throw new errors.InvalidTarget();
    return {
      scope: cfg.scopes.join(' '),
      audience: indicator,
      accessTokenTTL: cfg.ttl,
      accessTokenFormat: cfg.format,
      ...(cfg.format === 'jwt' ? { jwt: { sign: { alg: tokenAlg } } } : {}),
    };
  };
  const p = new Provider(issuer, {
    adapter,
    clients: [
      ...cfg.clients.map((c) => ({
        client_id: c.client_id,
        client_secret: c.client_secret,
        grant_types: ['client_credentials'],
        response_types: [],
        redirect_uris: [],
        token_endpoint_auth_method: c.token_endpoint_auth_method ?? 'client_secret_basic',
        ...(c.scope !== undefined ? { scope: c.scope } : {}),
      })),
      {
        client_id: cfg.introspector.client_id,
        client_secret: cfg.introspector.client_secret,
        grant_types: [],
        response_types: [],
        redirect_uris: [],
      },
    ],
    clientAuthMethods: ['client_secret_basic', 'client_secret_post', 'none'],
    jwks: { keys: keys.map((k) => k.privateJwk) },
    cookies: { keys: cookieKeys },
    scopes: ['openid', 'offline_access', ...cfg.scopes],
    pkce: { required: () => true },
    responseTypes: ['code'],
    findAccount: async (ctx, sub) => ({
      accountId: sub,
      claims: async () => ({ sub, org: cfg.accounts[sub]?.org ?? cfg.org }),
    }),
    extraTokenClaims: async (ctx, token) => {
      if (token.accountId) return { org: cfg.accounts[token.accountId]?.org ?? cfg.org };
      // client_credentials: `sub` is the client (oidc-provider puts it in the JWT itself;
      // this also shows it in the introspection of an opaque token).
      return { sub: token.clientId, org: orgOfClient(token.clientId) };
    },
    issueRefreshToken: async (ctx, client) => client.grantTypeAllowed('refresh_token'),
    ttl: {
      AccessToken: (ctx, token) => token.resourceServer?.accessTokenTTL ?? cfg.ttl,
      ClientCredentials: (ctx, token) => token.resourceServer?.accessTokenTTL ?? cfg.ttl,
      IdToken: 3600,
      Interaction: 600,
      Session: 3600,
      Grant: 3600,
      RefreshToken: 24 * 3600,
    },
    features: {
      devInteractions: { enabled: false },
      clientCredentials: { enabled: true },
      registration: { enabled: true },
      introspection: {
        enabled: true,
        allowedPolicy: async (ctx, client, token) => (
          client.clientAuthMethod !== 'none' || token.clientId === client.clientId),
      },
      revocation: {
        enabled: true,
        allowedPolicy: async (ctx, client, token) => (
          client.clientId === cfg.introspector.client_id || token.clientId === client.clientId),
      },
      resourceIndicators: {
        enabled: true,
        defaultResource: async (ctx, client, oneOf) => oneOf ?? cfg.defaultResource,
        useGrantedResource: async () => true,
        getResourceServerInfo: async (ctx, indicator) => resourceServerInfo(ctx, indicator),
      },
      rpInitiatedLogout: { enabled: false },
    },
    renderError: async (ctx, out) => {
      ctx.type = 'json';
      ctx.body = out;
    },
  });
  p.on('server_error', (ctx, err) => console.error('auth_server: server_error', err));
  return p;
}

function install(keys) {
  provider = makeProvider(keys);
  handler = provider.callback();
}

// ---- helpers ---------------------------------------------------------------------
async function readBody(req, limit = 1 << 20) {
  const chunks = [];
  let size = 0;
  for await (const chunk of req) {
    size += chunk.length;
    if (size > limit) throw new Error('body too large');
    chunks.push(chunk);
  }
  return Buffer.concat(chunks).toString('utf8');
}

async function readParams(req) {
  const text = await readBody(req);
  if (!text) return {};
  // JSON unless it is a form that does not look like JSON (`curl -d '{...}'` says form).
  const form = (req.headers['content-type'] ?? '').includes('application/x-www-form-urlencoded');
  if (form && !text.trimStart().startsWith('{')) return Object.fromEntries(new URLSearchParams(text));
  return JSON.parse(text);
}

function sendJson(res, status, value) {
  const body = JSON.stringify(value);
  res.writeHead(status, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(body),
    'cache-control': 'no-store',
  });
  res.end(body);
}

const b64url = (v) => Buffer.from(typeof v === 'string' ? v : JSON.stringify(v)).toString('base64url');

function signWith(alg, key, data) {
  if (alg === 'RS256') return crypto.sign('sha256', data, key);
  if (alg === 'ES256') return crypto.sign('sha256', data, { key, dsaEncoding: 'ieee-p1363' });
  if (alg === 'EdDSA' || alg === 'Ed25519') return crypto.sign(null, data, key);
  throw new Error(`cannot sign ${alg} with an asymmetric key`);
}

function merge(defaults, given) {
  const out = { ...defaults, ...given };
  for (const [k, v] of Object.entries(out)) if (v === null) delete out[k];
  return out;
}

function findKey(set, alg) {
  const want = alg === 'Ed25519' ? 'EdDSA' : alg;
  return set.find((k) => k.alg === want);
}

function mint({ header = {}, claims = {}, key = 'current', secret = 'pem', bare = false }) {
  const now = Math.floor(Date.now() / 1000);
  const defaultClaims = bare ? {} : {
    iss: issuer,
    aud: cfg.resources[0],
    sub: cfg.clients[0]?.client_id ?? 'minted',
    client_id: cfg.clients[0]?.client_id ?? 'minted',
    scope: cfg.scopes.join(' '),
    org: cfg.org,
    iat: now,
    exp: now + cfg.ttl,
    jti: crypto.randomBytes(12).toString('base64url'),
  };
  const payload = merge(defaultClaims, claims);
  const rsa = findKey(currentKeys, 'RS256');
  let h;
  let signature;
  switch (key) {
    case 'none': {
      h = merge({ alg: 'none', typ: 'at+jwt' }, header);
      return `${b64url(h)}.${b64url(payload)}.`;
    }
    case 'hs256-public': {
      if (!rsa) throw new Error('hs256-public needs an RS256 key (algs)');
      h = merge({ alg: 'HS256', typ: 'at+jwt', kid: rsa.kid }, header);
      let hmacKey;
      if (secret === 'pem') hmacKey = rsa.publicKey.export({ type: 'spki', format: 'pem' });
      else if (secret === 'jwk') hmacKey = JSON.stringify(rsa.publicJwk);
      else throw new Error('secret must be "pem" or "jwk"');
      const input = `${b64url(h)}.${b64url(payload)}`;
      signature = crypto.createHmac('sha256', hmacKey).update(input).digest();
      return `${input}.${signature.toString('base64url')}`;
    }
    case 'current':
    case 'previous':
    case 'foreign': {
      const set = { current: currentKeys, previous: previousKeys, foreign: foreignKeys }[key];
      const alg = header.alg ?? tokenAlg;
      const k = findKey(set, alg);
      if (!k) throw new Error(`no ${key} key for ${alg}`);
      h = merge({ alg, typ: 'at+jwt', kid: k.kid }, header);
      const input = `${b64url(h)}.${b64url(payload)}`;
      signature = signWith(alg, k.privateKey, Buffer.from(input));
      return `${input}.${signature.toString('base64url')}`;
    }
    default:
      throw new Error(`unknown key ${key}`);
  }
}

// ---- the JWKS endpoint's misbehaviours ---------------------------------------------
let jwksHits = 0;
let jwksMode = 'normal';
let manyBody;

function publicJwks(keys) {
  return keys.map((k) => k.publicJwk);
}

async function serveHuge(res) {
  const total = 50 * 1024 * 1024;
  const chunk = Buffer.alloc(64 * 1024, 'A');
  res.writeHead(200, { 'content-type': 'application/jwk-set+json' });
  let closed = false;
  res.on('close', () => { closed = true; });
  res.write('{"keys":[{"kty":"oct","kid":"huge","k":"');
  for (let sent = 0; sent < total && !closed; sent += chunk.length) {
    if (!res.write(chunk)) {
      await Promise.race([once(res, 'drain'), once(res, 'close')]);
    }
  }
  if (!closed) res.end('"}]}');
}

function serveMany(res) {
  if (!manyBody) {
    const real = publicJwks([...currentKeys, ...previousKeys]);
    const rsa = findKey(currentKeys, 'RS256') ?? currentKeys[0];
    const fillers = [];
    for (let i = 0; fillers.length + real.length < 10000; i++) {
      fillers.push({ ...rsa.publicJwk, kid: `filler-${i}` });
    }
    manyBody = JSON.stringify({ keys: [...fillers, ...real] });
  }
  res.writeHead(200, { 'content-type': 'application/jwk-set+json', 'content-length': Buffer.byteLength(manyBody) });
  res.end(manyBody);
}

// ---- interactions ------------------------------------------------------------------
async function interaction(req, res, uid) {
  const p = provider;
  let details;
  try {
    details = await p.interactionDetails(req, res);
  } catch (e) {
    return sendJson(res, 400, { error: 'invalid_request', error_description: e.message });
  }
  if (details.uid !== uid) {
    return sendJson(res, 400, { error: 'invalid_request', error_description: 'interaction uid mismatch' });
  }
  if (req.method === 'GET') {
    return sendJson(res, 200, { uid: details.uid, prompt: details.prompt, params: details.params });
  }
  if (req.method !== 'POST') return sendJson(res, 405, { error: 'method not allowed' });
  const body = await readParams(req);
  if (body.deny === true || body.deny === 'true') {
    return p.interactionFinished(req, res, {
      error: 'access_denied',
      error_description: 'the test denied the request',
    }, { mergeWithLastSubmission: false });
  }
  const { prompt, params } = details;
  if (prompt.name === 'login') {
    const account = body.account;
    if (typeof account !== 'string' || !account) {
      return sendJson(res, 400, { error: 'invalid_request', error_description: 'account is required' });
    }
    return p.interactionFinished(req, res, { login: { accountId: account } }, { mergeWithLastSubmission: false });
  }
  if (prompt.name === 'consent') {
    const { accountId } = details.session;
    const grant = details.grantId
      ? await p.Grant.find(details.grantId)
      : new p.Grant({ accountId, clientId: params.client_id });
    const d = prompt.details;
    if (d.missingOIDCScope) grant.addOIDCScope(d.missingOIDCScope.join(' '));
    if (d.missingOIDCClaims) grant.addOIDCClaims(d.missingOIDCClaims);
    if (d.missingResourceScopes) {
      for (const [indicator, scopes] of Object.entries(d.missingResourceScopes)) {
        grant.addResourceScope(indicator, scopes.join(' '));
      }
    }
    const grantId = await grant.save();
    return p.interactionFinished(req, res, { consent: { grantId } }, { mergeWithLastSubmission: true });
  }
  return sendJson(res, 400, { error: 'invalid_request', error_description: `unknown prompt ${prompt.name}` });
}

// ---- test controls -----------------------------------------------------------------
async function testControl(req, res, path) {
  if (path === '/_test/jwks-hits' && req.method === 'GET') return sendJson(res, 200, { hits: jwksHits });
  if (path === '/_test/keys' && req.method === 'GET') {
    const rsa = findKey(currentKeys, 'RS256');
    return sendJson(res, 200, {
      current: publicJwks(currentKeys),
      previous: publicJwks(previousKeys),
      pem: rsa ? rsa.publicKey.export({ type: 'spki', format: 'pem' }) : null,
    });
  }
  if (req.method !== 'POST') return sendJson(res, 404, { error: 'not found' });
  const body = await readParams(req);
  switch (path) {
    case '/_test/mint':
      try {
        return sendJson(res, 200, { token: mint(body) });
      } catch (e) {
        return sendJson(res, 400, { error: e.message });
      }
    case '/_test/rotate': {
      const fresh = await generateSet();
      previousKeys = currentKeys;
      currentKeys = fresh;
      manyBody = undefined;
      install([...currentKeys, ...previousKeys]);
      return sendJson(res, 200, {
        kids: currentKeys.map((k) => k.kid),
        previous: previousKeys.map((k) => k.kid),
      });
    }
    case '/_test/revoke': {
      const { token } = body;
      if (typeof token !== 'string') return sendJson(res, 400, { error: 'token is required' });
      const found = (await provider.AccessToken.find(token))
        ?? (await provider.ClientCredentials.find(token))
        ?? (await provider.RefreshToken.find(token));
      if (found) await found.destroy();
      return sendJson(res, 200, { revoked: !!found });
    }
    case '/_test/jwks-mode': {
      if (!['normal', 'hang', 'huge', 'many'].includes(body.mode)) {
        return sendJson(res, 400, { error: 'mode must be normal, hang, huge or many' });
      }
      jwksMode = body.mode;
      return sendJson(res, 200, { mode: jwksMode });
    }
    default:
      return sendJson(res, 404, { error: 'not found' });
  }
}

// ---- the server --------------------------------------------------------------------
// ---- Entra ID's ways (cfg.entra) -----------------------------------------------------
const AADSTS9010010 = "AADSTS9010010: The resource parameter provided in the request doesn't match with the requested scopes.";

// Answers as Entra does, or returns false to let oidc-provider answer. A token request's
// form is read here and handed on (oidc-provider reads `req.body` when it is set).
async function entra(req, res, path) {
  const url = new URL(req.url, 'http://x');
  if (path === '/.well-known/oauth-authorization-server') return sendJson(res, 404, { error: 'not found' });
  if (path === '/.well-known/openid-configuration') {
    // oidc-provider's own document, asked of itself (past this function).
    const own = await fetch(`${issuer}/.well-known/openid-configuration`, { headers: { 'x-stand-in-own': '1' } });
    const doc = await own.json();
    delete doc.code_challenge_methods_supported;
    delete doc.authorization_response_iss_parameter_supported;
    return sendJson(res, 200, doc);
  }
  // Entra reads a scope `<application id URI>/<name>` as <name> of that application.
  const bare = (scope) => scope?.split(' ').map((x) => (
    cfg.defaultResource && x.startsWith(`${cfg.defaultResource}/`) ? x.slice(cfg.defaultResource.length + 1) : x)).join(' ');
  if (path === '/auth' && url.searchParams.has('scope')) {
    url.searchParams.set('scope', bare(url.searchParams.get('scope')));
    req.url = `${url.pathname}?${url.searchParams}`;
  }
  if (path === '/auth' && url.searchParams.has('resource')) {
    const back = new URL(url.searchParams.get('redirect_uri') ?? 'http://invalid/');
    back.searchParams.set('error', 'invalid_target');
    back.searchParams.set('error_description', AADSTS9010010);
    if (url.searchParams.has('state')) back.searchParams.set('state', url.searchParams.get('state'));
    res.writeHead(302, { location: back.toString() });
    return res.end();
  }
  if (path === '/reg' && req.method === 'POST') {
    // (Entra has no registration endpoint; the stand-in keeps oidc-provider's, which reads
    // the client's scope as Entra would.)
    const doc = JSON.parse(await readBody(req));
    if (typeof doc.scope === 'string') doc.scope = bare(doc.scope);
    req.body = doc;
    return false;
  }
  if (path === '/token' && req.method === 'POST') {
    const text = await readBody(req);
    const form = new URLSearchParams(text);
    if (form.has('resource')) return sendJson(res, 400, { error: 'invalid_target', error_description: AADSTS9010010 });
    if (form.has('scope')) form.set('scope', bare(form.get('scope')));
    req.body = Object.fromEntries(form);
    return false;
  }
  if (path === '/auth' || path.startsWith('/auth/') || path.startsWith('/interaction/')) {
    // No RFC 9207 `iss` on the way back to the client.
    const writeHead = res.writeHead.bind(res);
    res.writeHead = (status, ...rest) => {
      const loc = res.getHeader('location');
      if (typeof loc === 'string' && loc.includes('iss=')) {
        const u = new URL(loc);
        u.searchParams.delete('iss');
        res.setHeader('location', u.toString());
      }
      return writeHead(status, ...rest);
    };
  }
  return false;
}

const server = createServer(async (req, res) => {
  const path = new URL(req.url, 'http://x').pathname;
  try {
    if (path.startsWith('/_test/')) return await testControl(req, res, path);
    const own = req.headers['x-stand-in-own'] === '1';
    if (cfg.entra && !own && (await entra(req, res, path)) !== false) return undefined;
    if (path === '/jwks') {
      jwksHits += 1;
      if (jwksMode === 'hang') return undefined; // never answered
      if (jwksMode === 'huge') return await serveHuge(res);
      if (jwksMode === 'many') return serveMany(res);
    }
    const m = /^\/interaction\/([^/]+)$/.exec(path);
    if (m) return await interaction(req, res, m[1]);
    return handler(req, res);
  } catch (e) {
    console.error('auth_server:', e);
    if (!res.headersSent) return sendJson(res, 500, { error: String(e?.message ?? e) });
    res.destroy();
    return undefined;
  }
});

const t0 = performance.now();
const keysReady = Promise.all([generateSet(), generateSet()]);
server.listen(cfg.port, '127.0.0.1');
await once(server, 'listening');
const { port } = server.address();
issuer = `http://127.0.0.1:${port}`;
[currentKeys, foreignKeys] = await keysReady;
install(currentKeys);
console.error(`auth_server: ready in ${Math.round(performance.now() - t0)} ms`);
process.stdout.write(`${JSON.stringify({ issuer, port })}\n`);

for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => process.exit(0));
