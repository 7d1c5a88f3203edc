// The official TypeScript MCP client (@modelcontextprotocol/client 2.4.0) through the whole
// OAuth flow against an MCP server that requires authorization (the sidecar with
// EPODE_SIDECAR_AUTH on), as an application runs it: an in-memory OAuthClientProvider
// (dynamic registration, PKCE verifier, tokens, discovery state) given to
// StreamableHTTPClientTransport as `authProvider`, whose redirectToAuthorization(url) logs in
// and consents with as_login.mjs's approve() and keeps the redirect. Nothing here makes or
// asks for a token: the SDK does, from the server's 401.
//
//   node $D/ts/ts_oauth.mjs URL legacy|auto|pin [--account A] [--scope S]
//        [--tool NAME [--args JSON]]...
//
// The flow, as an app does it (the SDK's simpleOAuthClient example): connect; the 401 makes
// the SDK read the Protected Resource Metadata (RFC 9728) and the AS metadata (RFC 8414),
// register (RFC 7591), and authorize with PKCE and `resource` (RFC 8707), which ends in
// redirectToAuthorization and an UnauthorizedError; the app calls transport.finishAuth() with
// the redirect's parameters (code, iss), which exchanges the code, and connects again on a
// new transport. Then tools/list and each --tool in turn (default: whoami). A 403
// insufficient_scope on a call makes the transport step up by itself (the union of the scopes
// it had and the challenge's, a fresh authorization); as that authorization is interactive it
// ends in UnauthorizedError too, and the app finishes it the same way and calls again.
// An AS that holds a client to the scope it registered with (oidc-provider does; the SDK
// registers with the first challenge's scope) answers that step-up `invalid_scope`: the app
// then forgets the registration, and the SDK registers again with the wider scope on the
// next 403.
//
// --scope S goes into the client metadata (`scope`, the fallback the SDK uses when neither
// the challenge nor the metadata names one).
// Modes: legacy = versionNegotiation 'legacy' (2025-11-25), auto = 'auto', pin =
// {pin:'2026-07-28'}, as ts_call.mjs.
//
// Prints ONE JSON line and exits 0:
//   {"era","negotiatedVersion","tools":[names, sorted],
//    "calls":[{"name","result"}],               // CallToolResult per --tool
//    "unauthorized":N, "forbidden":N,           // 401s / 403s the MCP endpoint answered
//    "authorizations":[{"url","params":{...query},"redirect"}],   // one per authorization
//    "tokenRequests":[{"grant_type","resource","scope"}],         // form fields sent
//    "registrations":N, "reregistrations":N,  // dynamic registrations; forgotten ones
//    "client_id",                                // of the last registration
//    "tokens":{"scope","token_type","expires_in","refresh":bool}, // the last saved tokens
//    "claims":{...the last access token's claims, unverified},
//    "steps":["POST sidecar /mcp 401", "GET sidecar /.well-known/... 200", ...]}
// On error: {"error":{"name","message","code","status"},"steps":[...]} and exit 2.
import { Client, StreamableHTTPClientTransport, UnauthorizedError } from '@modelcontextprotocol/client';
import { approve } from './as_login.mjs';

const MODES = { legacy: 'legacy', auto: 'auto', pin: { pin: '2026-07-28' } };

const argv = process.argv.slice(2);
const positional = [];
let account = 'alice';
let metadataScope;
const calls = [];
for (let i = 0; i < argv.length; i++) {
  const a = argv[i];
  if (a === '--account') account = argv[++i];
  else if (a === '--scope') metadataScope = argv[++i];
  else if (a === '--tool') calls.push({ name: argv[++i], args: {} });
  else if (a === '--args') {
    if (!calls.length) throw new Error('--args comes after a --tool');
    calls[calls.length - 1].args = JSON.parse(argv[++i]);
  } else positional.push(a);
}
const [url, modeName] = positional;
if (!url || !(modeName in MODES)) {
  console.error('usage: node ts_oauth.mjs URL legacy|auto|pin [--account A] [--scope S] [--tool NAME [--args JSON]]...');
  process.exit(64);
}
if (!calls.length) calls.push({ name: 'whoami', args: {} });

const mcpUrl = new URL(url);
const steps = [];
let unauthorized = 0;
let forbidden = 0;
let registrations = 0;
let reregistrations = 0;
const tokenRequests = [];
const authorizations = [];

function finish(obj, code) {
  process.stdout.write(`${JSON.stringify({ ...obj, steps })}\n`, () => process.exit(code));
}
setTimeout(() => finish({ error: { name: 'Timeout', message: 'no answer within 30 s' } }, 2), 30000).unref();

// Every request the SDK makes (MCP, discovery, registration, token) goes through this fetch:
// the transport's own and, through it, auth()'s fetchFn.
async function tracingFetch(input, init) {
  const target = new URL(typeof input === 'string' || input instanceof URL ? input : input.url);
  const method = init?.method ?? 'GET';
  const who = target.origin === mcpUrl.origin ? 'sidecar' : 'as';
  if (who === 'as' && method === 'POST' && init?.body instanceof URLSearchParams) {
    const f = init.body;
    if (f.get('grant_type')) {
      tokenRequests.push({ grant_type: f.get('grant_type'), resource: f.get('resource'), scope: f.get('scope') });
    }
  }
  const res = await fetch(input, init);
  let what = '';
  if (who === 'sidecar' && target.pathname === mcpUrl.pathname && method === 'POST') {
    try { what = ` ${JSON.parse(init.body).method ?? 'response'}`; } catch { /* not JSON */ }
    if (res.status === 401) unauthorized++;
    if (res.status === 403) forbidden++;
  }
  const registering = typeof init?.body === 'string' && init.body.includes('"redirect_uris"');
  if (who === 'as' && method === 'POST' && registering && res.status < 300) registrations++;
  steps.push(`${method} ${who} ${target.pathname}${what} ${res.status}`);
  return res;
}

const redirectUrl = 'http://127.0.0.1:1/callback';
const state = {};
const provider = {
  get redirectUrl() { return redirectUrl; },
  get clientMetadata() {
    return {
      client_name: 'epode-ts-oauth',
      redirect_uris: [redirectUrl],
      grant_types: ['authorization_code', 'refresh_token'],
      response_types: ['code'],
      token_endpoint_auth_method: 'none',
      ...(metadataScope ? { scope: metadataScope } : {}),
    };
  },
  clientInformation() { return state.client; },
  saveClientInformation(info) { state.client = info; },
  tokens() { return state.tokens; },
  saveTokens(tokens) { state.tokens = tokens; },
  async redirectToAuthorization(authorizationUrl) {
    const redirect = await approve(authorizationUrl.href, { account });
    steps.push(`authorize as ${account} -> ${new URL(redirect).searchParams.has('code') ? 'code' : 'no code'}`);
    authorizations.push({
      url: authorizationUrl.href,
      params: Object.fromEntries(authorizationUrl.searchParams),
      redirect,
    });
    state.redirected = redirect;
  },
  saveCodeVerifier(v) { state.verifier = v; },
  codeVerifier() { return state.verifier; },
  saveDiscoveryState(s) { state.discovery = s; },
  discoveryState() { return state.discovery; },
};

// The app's side of an interactive authorization: the SDK redirected (UnauthorizedError);
// give the transport the callback's parameters (code and iss) to exchange.
async function completeAuthorization(transport, error) {
  if (!(error instanceof UnauthorizedError) || !state.redirected) throw error;
  const back = new URL(state.redirected);
  state.redirected = null;
  if (back.searchParams.get('error') === 'invalid_scope' && state.client) {
    // The SDK registered the client with the scope it asked for first (registerClient's
    // `scope`), and an AS that holds a client to its registered scope (RFC 7591 `scope`:
    // what the client may ask for; oidc-provider does) refuses a step-up beyond it. The
    // registration is what is wrong, so the app forgets it: on the next call the SDK
    // registers again with the scopes it now asks for.
    steps.push(`the AS refused the scope for this registration (invalid_scope): forget client ${state.client.client_id}`);
    reregistrations++;
    state.client = undefined;
    return;
  }
  if (!back.searchParams.has('code')) throw new Error(`the authorization ended without a code: ${back.href}`);
  await transport.finishAuth(back.searchParams);
  steps.push('finishAuth: code exchanged');
}

function newTransport() {
  return new StreamableHTTPClientTransport(mcpUrl, { authProvider: provider, fetch: tracingFetch });
}

async function main() {
  let client;
  let transport;
  for (let attempt = 0; ; attempt++) {
    transport = newTransport();
    client = new Client(
      { name: 'epode-peer-ts-oauth', version: '0.0.1' },
      { versionNegotiation: { mode: MODES[modeName] } },
    );
    try {
      await client.connect(transport);
      break;
    } catch (e) {
      if (attempt >= 2) throw e;
      await completeAuthorization(transport, e);
      await client.close().catch(() => {});
    }
  }
  const era = client.getProtocolEra?.() ?? null;
  const negotiatedVersion = client.getNegotiatedProtocolVersion?.() ?? null;
  const { tools } = await client.listTools();
  const results = [];
  for (const c of calls) {
    let result;
    for (let attempt = 0; ; attempt++) {
      try {
        result = await client.callTool({ name: c.name, arguments: c.args });
        break;
      } catch (e) {
        if (attempt >= 3) throw e;
        await completeAuthorization(transport, e);
      }
    }
    results.push({ name: c.name, result });
  }
  const t = state.tokens ?? {};
  const parts = (t.access_token ?? '').split('.');
  const claims = parts.length === 3 ? JSON.parse(Buffer.from(parts[1], 'base64url')) : null;
  finish({
    era,
    negotiatedVersion,
    tools: tools.map((x) => x.name).sort(),
    calls: results,
    unauthorized,
    forbidden,
    authorizations,
    tokenRequests,
    registrations,
    reregistrations,
    client_id: state.client?.client_id ?? null,
    tokens: { scope: t.scope ?? null, token_type: t.token_type ?? null, expires_in: t.expires_in ?? null, refresh: !!t.refresh_token },
    claims,
  }, 0);
}

main().catch((err) =>
  finish({
    error: {
      name: err?.name,
      message: err?.message,
      code: err?.code ?? null,
      status: err?.status ?? err?.data?.status ?? null,
    },
    unauthorized,
    forbidden,
    authorizations,
    tokenRequests,
  }, 2),
);
