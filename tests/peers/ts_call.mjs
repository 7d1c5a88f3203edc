// One MCP operation with the official TypeScript client (@modelcontextprotocol/client 2.4.0),
// for tests that need more than ts_client.mjs's fixed tour.
//
//   node $D/ts/ts_call.mjs URL legacy|auto|pin list [--header 'K: V']...
//   node $D/ts/ts_call.mjs URL legacy|auto|pin call TOOL 'ARGS_JSON' [--header 'K: V']...
//   [--roots URI]: declare the roots capability and answer roots/list with this one root
//   [--answer N]: declare elicitation (form), sampling and roots, and answer each: a form with
//        every property filled (integers N, strings "ts", booleans true), a sampling request
//        with the text "sampled by ts", roots/list with file:///ts-root; `asked` in the output
//        lists the methods asked, in order
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
  let answer = null;
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--roots') root = argv[++i];
    else if (argv[i] === '--answer') answer = Number(argv[++i]);
    else if (argv[i] === '--header') {
      const h = argv[++i] ?? '';
      const idx = h.indexOf(':');
      headers[h.slice(0, idx).trim()] = h.slice(idx + 1).trim();
    } else positional.push(argv[i]);
  }
  const [url, modeName, op, tool, args] = positional;
  setTimeout(() => finish({ error: { name: 'Timeout', message: 'no answer within 30 s' } }, 2), 30000).unref();
  const asked = [];
  const capabilities = answer !== null
    ? { roots: {}, sampling: {}, elicitation: { form: {} } }
    : root ? { roots: {} } : {};
  const client = new Client(
    { name: 'epode-peer-ts-call', version: '0.0.1' },
    { versionNegotiation: { mode: MODES[modeName] }, capabilities },
  );
  if (root) client.setRequestHandler('roots/list', async () => ({ roots: [{ uri: root, name: root }] }));
  if (answer !== null) {
    client.setRequestHandler('roots/list', async () => {
      asked.push('roots/list');
      return { roots: [{ uri: 'file:///ts-root', name: 'ts' }] };
    });
    client.setRequestHandler('sampling/createMessage', async () => {
      asked.push('sampling/createMessage');
      return { role: 'assistant', content: { type: 'text', text: 'sampled by ts' }, model: 'ts' };
    });
    client.setRequestHandler('elicitation/create', async (req) => {
      asked.push('elicitation/create');
      const props = req.params?.requestedSchema?.properties ?? {};
      const content = {};
      for (const [k, v] of Object.entries(props)) {
        content[k] = v.type === 'string' ? 'ts' : v.type === 'boolean' ? true : answer;
      }
      return { action: 'accept', content };
    });
  }
  await client.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } }));
  const era = client.getProtocolEra() ?? null;
  if (op === 'list') {
    const { tools } = await client.listTools();
    const instructions = client.getInstructions?.() ?? client.getDiscoverResult?.()?.instructions ?? null;
    finish({ era, instructions, tools }, 0);
  } else {
    const result = await client.callTool({ name: tool, arguments: JSON.parse(args ?? '{}') });
    finish({ era, result, asked }, 0);
  }
}

main().catch((err) =>
  finish({ error: { name: err?.name, message: err?.message, code: err?.code ?? null, status: err?.status ?? err?.data?.status } }, 2),
);
