// A web page in Debian's Chromium (headless, driven by playwright-core), served from
// http://localhost:<a free port> as the MCP Inspector is, calls the sidecar at URL as a
// browser MCP client would: a JSON `tools/list` (which the browser preflights), then a
// `tools/call` sent as text/plain (which a browser sends without a preflight). Prints ONE
// JSON line: {"json":{"status":N,"body":...}|{"error":...},
// "plain":{"status":N}|{"error":...}}.
//
//   node cors_check.mjs URL
//
// The page is served by a real loopback server (a page the browser cannot place, such as a
// routed one, would be refused access to loopback by Chromium's Local Network Access rules).
//
// playwright-core is loaded from $EPODE_PEERS_TS/node_modules, so the script runs from the
// source tree as well. CHROMIUM_PATH overrides the browser (default /usr/bin/chromium).
import { existsSync } from 'node:fs';
import { createServer } from 'node:http';
import { createRequire } from 'node:module';

const require = createRequire(`${process.env.EPODE_PEERS_TS}/`);
const { chromium } = require('playwright-core');

const [url] = process.argv.slice(2);
const executablePath =
  process.env.CHROMIUM_PATH || ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find((p) => existsSync(p));
if (!executablePath) {
  console.log(JSON.stringify({ error: 'no Chromium: apt-get install chromium, or set CHROMIUM_PATH' }));
  process.exit(2);
}
const browser = await chromium.launch({ executablePath, headless: true, args: ['--no-sandbox'] });
const server = createServer((_, res) => {
  res.writeHead(200, { 'content-type': 'text/html' });
  res.end('<!doctype html><title>page</title>');
});
await new Promise((ok) => server.listen(0, '127.0.0.1', ok));
try {
  const page = await browser.newPage();
  await page.goto(`http://localhost:${server.address().port}/`);
  const result = await page.evaluate(async (url) => {
    const meta = {
      'io.modelcontextprotocol/protocolVersion': '2026-07-28',
      'io.modelcontextprotocol/clientCapabilities': {},
    };
    const out = {};
    try {
      const r = await fetch(url, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          accept: 'application/json, text/event-stream',
          'mcp-protocol-version': '2026-07-28',
          'mcp-method': 'tools/list',
        },
        body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list', params: { _meta: meta } }),
      });
      out.json = { status: r.status, body: await r.json() };
    } catch (e) {
      out.json = { error: String(e) };
    }
    try {
      const r = await fetch(url, {
        method: 'POST',
        headers: { 'content-type': 'text/plain' },
        body: JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'add', arguments: {} } }),
      });
      out.plain = { status: r.status };
    } catch (e) {
      out.plain = { error: String(e) };
    }
    return out;
  }, url);
  console.log(JSON.stringify(result));
} finally {
  await browser.close();
  server.close();
}
