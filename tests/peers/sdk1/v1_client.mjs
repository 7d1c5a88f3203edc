// The 2025-era client most MCP clients run, for epode-sidecar's tests: the official
// TypeScript SDK v1 (`@modelcontextprotocol/sdk` 1.32.2) with its Streamable HTTP client
// transport, which negotiates 2025-11-25 with `initialize` and then opens the optional GET
// stream (a 405 tells it there is none).
//
// Run from the installed copy (bare imports resolve against $D/sdk1/node_modules):
//   node $D/sdk1/v1_client.mjs URL
//
// It connects, then runs each operation below in turn and prints one JSON line:
//   {"protocolVersion", "serverInfo", "capabilities",
//    "ops": {NAME: {"ok": result} | {"error": {"kind", "code", "message"}}},
//    "transportErrors": [message, ...]}
// An error's kind is "mcp" for a JSON-RPC error (McpError: code is the JSON-RPC code) and
// "transport" for an HTTP failure (StreamableHTTPError: code is the HTTP status), which a
// 2025 client reads as a broken connection (a 404: its session is gone). Operations:
//   ping, setLevel (logging/setLevel "info", as MCP Inspector sends after initialize),
//   complete (prompt `greet`, argument name="A"), listTools, add (tools/call add {a:2,b:3}),
//   listPrompts, readMissing (resources/read of a URI no server here has).
// Exit 0 when it printed the line (failed operations included), 1 when it could not connect.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { McpError } from '@modelcontextprotocol/sdk/types.js';

const url = process.argv[2];
if (!url) {
  console.error('usage: node v1_client.mjs URL');
  process.exit(64);
}

const transportErrors = [];
const client = new Client({ name: 'epode-sidecar-tests-v1', version: '0' });
client.onerror = (e) => transportErrors.push(String(e?.message ?? e));
const transport = new StreamableHTTPClientTransport(new URL(url));

function described(e) {
  if (e instanceof McpError) return { kind: 'mcp', code: e.code, message: e.message };
  return { kind: 'transport', code: e?.code ?? null, message: String(e?.message ?? e) };
}

try {
  await client.connect(transport);
} catch (e) {
  process.stdout.write(JSON.stringify({ connectError: described(e), transportErrors }) + '\n');
  process.exit(1);
}

const ops = {
  ping: () => client.ping(),
  setLevel: () => client.setLoggingLevel('info'),
  complete: () =>
    client.complete({ ref: { type: 'ref/prompt', name: 'greet' }, argument: { name: 'name', value: 'A' } }),
  listTools: () => client.listTools(),
  add: () => client.callTool({ name: 'add', arguments: { a: 2, b: 3 } }),
  listPrompts: () => client.listPrompts(),
  readMissing: () => client.readResource({ uri: 'epode-test://missing' }),
};
const results = {};
for (const [name, op] of Object.entries(ops)) {
  try {
    results[name] = { ok: await op() };
  } catch (e) {
    results[name] = { error: described(e) };
  }
}

const report = {
  protocolVersion: transport.protocolVersion ?? null,
  serverInfo: client.getServerVersion() ?? null,
  capabilities: client.getServerCapabilities() ?? null,
  ops: results,
  transportErrors,
};
await client.close();
process.stdout.write(JSON.stringify(report) + '\n');
