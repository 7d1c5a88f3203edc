// The authorization-code flow against tests/peers/auth_server.mjs, end to end, with
// plain fetch and as_login.mjs's approve(): what an MCP client does.
//
//   node $D/ts/as_code_flow.mjs ISSUER RESOURCE [--account A] [--scope "S ..."] [--deny]
//
// 1. discovery (/.well-known/oauth-authorization-server);
// 2. dynamic registration (RFC 7591) of a public client (token_endpoint_auth_method
//    none, grant types authorization_code + refresh_token, a loopback redirect_uri);
// 3. PKCE S256, an authorization request with `resource` and `scope`;
// 4. approve() (login as the account, consent);
// 5. the code exchanged at the token endpoint with `resource` (and the verifier);
// 6. the refresh token exchanged once more, with `resource`.
// Prints one JSON line: {"client_id","redirect","token":{...token response},
// "header":{...},"claims":{...} (of the access token when it is a JWT),
// "refreshed":{...token response}} or {"error": "..."} (exit 1).
import * as crypto from 'node:crypto';
import { approve } from './as_login.mjs';

const argv = process.argv.slice(2);
const [issuer, resource] = argv;
let account = 'alice';
let scope = 'mcp:tools mcp:read';
let deny = false;
for (let i = 2; i < argv.length; i++) {
  if (argv[i] === '--account') account = argv[++i];
  else if (argv[i] === '--scope') scope = argv[++i];
  else if (argv[i] === '--deny') deny = true;
  else throw new Error(`unknown argument ${argv[i]}`);
}
if (!issuer || !resource) {
  console.error('usage: node as_code_flow.mjs ISSUER RESOURCE [--account A] [--scope S] [--deny]');
  process.exit(64);
}

function decode(jwt) {
  const [h, p] = jwt.split('.');
  return {
    header: JSON.parse(Buffer.from(h, 'base64url')),
    claims: JSON.parse(Buffer.from(p, 'base64url')),
  };
}

async function json(res, what) {
  const text = await res.text();
  if (!res.ok) throw new Error(`${what}: ${res.status} ${text}`);
  return JSON.parse(text);
}

async function main() {
  const meta = await json(await fetch(`${issuer}/.well-known/oauth-authorization-server`), 'discovery');
  const redirectUri = 'http://127.0.0.1:1/callback';
  const client = await json(await fetch(meta.registration_endpoint, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      client_name: 'as_code_flow',
      redirect_uris: [redirectUri],
      grant_types: ['authorization_code', 'refresh_token'],
      response_types: ['code'],
      token_endpoint_auth_method: 'none',
      scope,
    }),
  }), 'registration');

  const verifier = crypto.randomBytes(32).toString('base64url');
  const challenge = crypto.createHash('sha256').update(verifier).digest('base64url');
  const state = crypto.randomBytes(8).toString('hex');
  const auth = new URL(meta.authorization_endpoint);
  for (const [k, v] of Object.entries({
    client_id: client.client_id,
    response_type: 'code',
    redirect_uri: redirectUri,
    scope,
    resource,
    state,
    code_challenge: challenge,
    code_challenge_method: 'S256',
  })) auth.searchParams.set(k, v);

  const redirect = await approve(auth.href, { account, deny });
  const back = new URL(redirect);
  if (back.searchParams.get('error')) {
    return { client_id: client.client_id, redirect, error: back.searchParams.get('error') };
  }
  if (back.searchParams.get('state') !== state) throw new Error(`state mismatch in ${redirect}`);

  const tokenRequest = (params) => fetch(meta.token_endpoint, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ client_id: client.client_id, resource, ...params }),
  });
  const token = await json(await tokenRequest({
    grant_type: 'authorization_code',
    code: back.searchParams.get('code'),
    redirect_uri: redirectUri,
    code_verifier: verifier,
  }), 'code exchange');
  const out = { client_id: client.client_id, redirect, token };
  if (token.access_token.split('.').length === 3) Object.assign(out, decode(token.access_token));
  if (token.refresh_token) {
    out.refreshed = await json(await tokenRequest({
      grant_type: 'refresh_token',
      refresh_token: token.refresh_token,
    }), 'refresh');
  }
  return out;
}

main().then(
  (out) => process.stdout.write(`${JSON.stringify(out)}\n`),
  (e) => {
    process.stdout.write(`${JSON.stringify({ error: String(e?.message ?? e) })}\n`);
    process.exit(1);
  },
);
