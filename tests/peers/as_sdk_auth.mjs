// The official TypeScript MCP client's own OAuth flow (`auth()` of
// @modelcontextprotocol/client 2.4.0) against tests/peers/auth_server.mjs, with
// as_login.mjs's approve() as its redirectToAuthorization: proof that the AS peer
// serves what the SDK asks (RFC 9728 discovery, RFC 7591 registration, PKCE, RFC 8707
// `resource`), independent of the sidecar.
//
//   node $D/ts/as_sdk_auth.mjs ISSUER RESOURCE [--account A] [--scope S]
//
// The Protected Resource Metadata of RESOURCE (authorization_servers: [ISSUER]) is
// served by this script on a port of its own and given to auth() as
// resourceMetadataUrl, so RESOURCE need not be listening. Prints one JSON line:
// {"results":["REDIRECT","AUTHORIZED"],"client":{registered client},"authorize":URL,
//  "tokens":{saved tokens},"claims":{...of the access token}} or {"error"} (exit 1).
import { createServer } from 'node:http';
import { once } from 'node:events';
import { auth } from '@modelcontextprotocol/client';
import { approve } from './as_login.mjs';

const argv = process.argv.slice(2);
const [issuer, resource] = argv;
let account = 'alice';
let scope = 'mcp:tools';
for (let i = 2; i < argv.length; i++) {
  if (argv[i] === '--account') account = argv[++i];
  else if (argv[i] === '--scope') scope = argv[++i];
  else throw new Error(`unknown argument ${argv[i]}`);
}
if (!issuer || !resource) {
  console.error('usage: node as_sdk_auth.mjs ISSUER RESOURCE [--account A] [--scope S]');
  process.exit(64);
}

const prm = createServer((req, res) => {
  res.writeHead(200, { 'content-type': 'application/json' });
  res.end(JSON.stringify({
    resource,
    authorization_servers: [issuer],
    scopes_supported: scope.split(' '),
  }));
});
prm.listen(0, '127.0.0.1');
await once(prm, 'listening');
const resourceMetadataUrl = new URL(`http://127.0.0.1:${prm.address().port}/.well-known/oauth-protected-resource`);

const redirectUrl = 'http://127.0.0.1:1/callback';
const state = {};
const provider = {
  get redirectUrl() { return redirectUrl; },
  get clientMetadata() {
    return {
      client_name: 'as_sdk_auth',
      redirect_uris: [redirectUrl],
      grant_types: ['authorization_code', 'refresh_token'],
      response_types: ['code'],
      token_endpoint_auth_method: 'none',
    };
  },
  clientInformation() { return state.client; },
  saveClientInformation(info) { state.client = info; },
  tokens() { return state.tokens; },
  saveTokens(tokens) { state.tokens = tokens; },
  async redirectToAuthorization(url) {
    state.authorize = url.href;
    state.redirected = await approve(url.href, { account });
  },
  saveCodeVerifier(v) { state.verifier = v; },
  codeVerifier() { return state.verifier; },
  saveDiscoveryState(s) { state.discovery = s; },
  discoveryState() { return state.discovery; },
};

try {
  const first = await auth(provider, { serverUrl: resource, scope, resourceMetadataUrl });
  const back = new URL(state.redirected);
  const second = await auth(provider, {
    serverUrl: resource,
    resourceMetadataUrl,
    authorizationCode: back.searchParams.get('code'),
    iss: back.searchParams.get('iss') ?? undefined,
  });
  const parts = state.tokens.access_token.split('.');
  const claims = parts.length === 3 ? JSON.parse(Buffer.from(parts[1], 'base64url')) : null;
  process.stdout.write(`${JSON.stringify({
    results: [first, second],
    client: state.client,
    authorize: state.authorize,
    tokens: state.tokens,
    claims,
  })}\n`);
} catch (e) {
  process.stdout.write(`${JSON.stringify({ error: String(e?.stack ?? e) })}\n`);
  process.exitCode = 1;
} finally {
  prm.close();
}
