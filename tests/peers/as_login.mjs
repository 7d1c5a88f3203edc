// Login helper for the authorization-code flow against tests/peers/auth_server.mjs.
//
//   import { approve } from './as_login.mjs';
//   const redirected = await approve(authorizationUrl, { account: 'alice' });
//   // -> 'http://127.0.0.1:PORT/callback?code=...&state=...&iss=...'
//
// With plain fetch (redirects followed by hand, cookies kept in a jar of its own), it
// follows the authorization URL through the AS's interactions: at the login prompt it
// logs in as `account`, at the consent prompt it grants every requested scope and
// resource; `{ deny: true }` refuses instead (the redirect then carries
// error=access_denied). It returns the URL the AS finally redirects to (the client's
// redirect_uri with `code` and `state`, or with `error`), without fetching it.
// An AS error page (an unknown client, a bad redirect_uri...) throws, with the AS's answer.
// Used where the TypeScript MCP client's OAuth provider calls
// redirectToAuthorization(url). Needs no package: runs on any Node >= 18.

function storeCookies(jar, res) {
  for (const line of res.headers.getSetCookie()) {
    const [pair, ...attrs] = line.split(';');
    const eq = pair.indexOf('=');
    if (eq < 1) continue;
    const name = pair.slice(0, eq).trim();
    const value = pair.slice(eq + 1).trim();
    const expired = attrs.some((a) => {
      const [k, v] = a.split('=').map((s) => s?.trim());
      if (k.toLowerCase() === 'max-age') return Number(v) <= 0;
      if (k.toLowerCase() === 'expires') return Date.parse(v) <= Date.now();
      return false;
    });
    if (expired || value === '') jar.delete(name);
    else jar.set(name, value);
  }
}

const cookieHeader = (jar) => [...jar].map(([k, v]) => `${k}=${v}`).join('; ');

export async function approve(authorizationUrl, { account = 'alice', deny = false } = {}) {
  const jar = new Map();
  const asOrigin = new URL(authorizationUrl).origin;
  let url = new URL(authorizationUrl);
  let post = false;
  for (let hop = 0; hop < 20; hop++) {
    const init = { redirect: 'manual', headers: { cookie: cookieHeader(jar) } };
    if (post) {
      init.method = 'POST';
      init.headers['content-type'] = 'application/json';
      init.body = JSON.stringify(deny ? { deny: true } : { account });
    }
    const res = await fetch(url, init);
    storeCookies(jar, res);
    const location = res.headers.get('location');
    if (res.status < 300 || res.status >= 400 || !location) {
      const text = await res.text();
      throw new Error(`approve: ${init.method ?? 'GET'} ${url} answered ${res.status}: ${text.slice(0, 500)}`);
    }
    await res.arrayBuffer().catch(() => {});
    const next = new URL(location, url);
    const onAs = next.origin === asOrigin
      && (next.pathname.startsWith('/auth') || next.pathname.startsWith('/interaction/'));
    if (!onAs) return next.href;
    post = next.pathname.startsWith('/interaction/');
    url = next;
  }
  throw new Error(`approve: more than 20 redirects from ${authorizationUrl}`);
}
