// One MCP operation with the official TypeScript client (@modelcontextprotocol/client 2.4.0),
// for tests that need more than ts_client.mjs's fixed tour.
//
//   node $D/ts/ts_call.mjs URL legacy|auto|pin list [--header 'K: V']...
//   node $D/ts/ts_call.mjs URL legacy|auto|pin call TOOL 'ARGS_JSON' [--header 'K: V']...
//   [--roots URI]: declare the roots capability and answer roots/list with this one root
//
// Prints ONE JSON object and exits 0: {"era","instructions","tools"} for `list` (tools in the
// server's order), {"era","result"} for `call`. On error: {"error":{"name","message","code",
// "status"?}} and exit 2.
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';

const MODES = { legacy: 'legacy', auto: 'auto', pin: { pin: '2026-07-28' } };

function finish(obj, code) {
  process.stdout.write(JSON.stringify(obj) + '\n', () => process.exit(code));
}

async function main() {
  const argv = process.argv.slice(2);
  const positional = [];
  const headers = {};
  let root = null;
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--roots') root = argv[++i];
    else if (argv[i] === '--header') {
      const h = argv[++i] ?? '';
      const idx = h.indexOf(':');
      headers[h.slice(0, idx).trim()] = h.slice(idx + 1).trim();
    } else positional.push(argv[i]);
  }
  const [url, modeName, op, tool, args] = positional;
  setTimeout(() => finish({ error: { name: 'Timeout', message: 'no answer within 30 s' } }, 2), 30000).unref();
  const client = new Client(
    { name: 'epode-peer-ts-call', version: '0.0.1' },
    { versionNegotiation: { mode: MODES[modeName] }, ...(root ? { capabilities: { roots: {} } } : {}) },
  );
  if (root) client.setRequestHandler('roots/list', async () => ({ roots: [{ uri: root, name: root }] }));
  await client.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } }));
  const era = client.getProtocolEra() ?? null;
  if (op === 'list') {
    const { tools } = await client.listTools();
    const instructions = client.getInstructions?.() ?? client.getDiscoverResult?.()?.instructions ?? null;
    finish({ era, instructions, tools }, 0);
  } else {
    const result = await client.callTool({ name: tool, arguments: JSON.parse(args ?? '{}') });
    finish({ era, result }, 0);
  }
}

main().catch((err) =>
  finish({ error: { name: err?.name, message: err?.message, code: err?.code ?? null, status: err?.status ?? err?.data?.status } }, 2),
);
