// TypeScript upstream peer for epode-sidecar's tests: the official
// @modelcontextprotocol/server 2.4.0 `createMcpHandler`, mounted on node:http
// through @modelcontextprotocol/node 2.1.2.
//
// Run from the installed copy (bare imports resolve against $D/ts/node_modules):
//   node $D/ts/ts_server.mjs --port N [--reject-legacy] [--json]
//
//   --port N          port on 127.0.0.1; 0 picks a free port
//   --reject-legacy   legacy:'reject' -> 2026-07-28 only (2025 traffic gets 400 / -32022)
//                     default legacy:'stateless' -> 2025-11-25 and 2026-07-28 on one URL
//   --json            responseMode:'json' (never SSE); default 'auto' (SSE once a
//                     notification such as progress is sent before the result)
//
// Endpoint: http://127.0.0.1:PORT/mcp (other paths 404). Host/Origin are checked
// with the SDK's localhost guards (403 otherwise), as createMcpHandler does none.
// Prints `READY <port>` on stdout once listening.
//
// Tools (same behaviour as py_server.py):
//   echo {text}    no outputSchema; text = JSON {"echoed","len"}
//   add  {a,b}     outputSchema {sum,a,b}; structuredContent + JSON text
//   deploy {env}   2026 MRTR (the SDK's inputRequired): round 1 asks `confirm`
//                  (elicitation, {confirm: boolean}) and `roots` (roots/list) at once,
//                  round 2 `say` (sampling); then "deployed to ENV (N roots): TEXT", or
//                  "not deployed" when not confirmed. requestState is unsealed (a test peer).
//   slow {steps=3} one notifications/progress every ~100 ms when the request
//                  has _meta.progressToken, then text "done N"; no outputSchema
import { createServer } from 'node:http';
import { McpServer, createMcpHandler, inputRequired, acceptedContent } from '@modelcontextprotocol/server';
import { toNodeHandler, localhostHostValidation, localhostOriginValidation } from '@modelcontextprotocol/node';
import * as z from 'zod';

function usage(msg) {
  if (msg) console.error(`ts_server: ${msg}`);
  console.error('usage: node ts_server.mjs --port N [--reject-legacy] [--json]');
  process.exit(64);
}

const argv = process.argv.slice(2);
let port;
let legacy = 'stateless';
let responseMode = 'auto';
for (let i = 0; i < argv.length; i++) {
  const a = argv[i];
  if (a === '--port') port = argv[++i];
  else if (a.startsWith('--port=')) port = a.slice('--port='.length);
  else if (a === '--reject-legacy') legacy = 'reject';
  else if (a === '--json') responseMode = 'json';
  else if (a === '-h' || a === '--help') usage();
  else usage(`unknown argument ${a}`);
}
if (port === undefined || !/^\d+$/.test(port)) usage('--port N is required');
port = Number(port);

const factory = () => {
  const s = new McpServer({ name: 'ts-peer', version: '0.0.1' });
  s.registerTool(
    'echo',
    { description: 'Echo the text back (no outputSchema).', inputSchema: z.object({ text: z.string() }) },
    async ({ text }) => ({ content: [{ type: 'text', text: JSON.stringify({ echoed: text, len: text.length }) }] }),
  );
  s.registerTool(
    'add',
    {
      description: 'Add two integers (outputSchema + structuredContent).',
      inputSchema: z.object({ a: z.number().int(), b: z.number().int() }),
      outputSchema: z.object({ sum: z.number().int(), a: z.number().int(), b: z.number().int() }),
    },
    async ({ a, b }) => {
      const out = { sum: a + b, a, b };
      return { content: [{ type: 'text', text: JSON.stringify(out) }], structuredContent: out };
    },
  );
  s.registerTool(
    'deploy',
    {
      description: 'Ask before deploying (2026 MRTR): round 1 asks confirm (elicitation) and roots at once, round 2 asks a sampling; then "deployed to ENV (N roots): TEXT", or "not deployed".',
      inputSchema: z.object({ env: z.string() }),
    },
    async ({ env }, ctx) => {
      const read = (v) => (typeof v === 'function' ? v.call(ctx.mcpReq) : v);
      const state = read(ctx.mcpReq.requestState);
      const responses = read(ctx.mcpReq.inputResponses);
      if (state === undefined) {
        return inputRequired({
          inputRequests: {
            confirm: inputRequired.elicit({
              message: `Deploy to ${env}?`,
              requestedSchema: z.object({ confirm: z.boolean() }),
            }),
            roots: inputRequired.listRoots(),
          },
          requestState: 'round-1',
        });
      }
      if (state === 'round-1') {
        if (acceptedContent(responses, 'confirm')?.confirm !== true) {
          return { content: [{ type: 'text', text: 'not deployed' }] };
        }
        const n = responses?.roots?.roots?.length ?? 0;
        return inputRequired({
          inputRequests: {
            say: inputRequired.createMessage({
              messages: [{ role: 'user', content: { type: 'text', text: 'Say deployed' } }],
              maxTokens: 20,
            }),
          },
          requestState: `round-2:${n}`,
        });
      }
      const n = state.split(':')[1];
      const said = responses?.say?.content?.text ?? '?';
      return { content: [{ type: 'text', text: `deployed to ${env} (${n} roots): ${said}` }] };
    },
  );
  s.registerTool(
    'slow',
    {
      description: 'Sleep ~100 ms per step, reporting progress after each step.',
      inputSchema: z.object({ steps: z.number().int().optional() }),
    },
    async ({ steps = 3 }, ctx) => {
      const token = ctx.mcpReq._meta?.progressToken;
      for (let i = 1; i <= steps; i++) {
        await new Promise((r) => setTimeout(r, 100));
        if (token !== undefined) {
          await ctx.mcpReq.notify({
            method: 'notifications/progress',
            params: { progressToken: token, progress: i, total: steps },
          });
        }
      }
      return { content: [{ type: 'text', text: `done ${steps}` }] };
    },
  );
  return s;
};

const handler = toNodeHandler(
  createMcpHandler(factory, { legacy, responseMode, onerror: (e) => console.error('ts_server: mcp error:', e.message) }),
);
const okHost = localhostHostValidation();
const okOrigin = localhostOriginValidation();

const server = createServer((req, res) => {
  if (new URL(req.url, 'http://x').pathname !== '/mcp') {
    res.writeHead(404).end();
    return;
  }
  if (!okHost(req, res) || !okOrigin(req, res)) return;
  handler(req, res);
});
server.on('error', (e) => {
  console.error(`ts_server: ${e.message}`);
  process.exit(1);
});
server.listen(port, '127.0.0.1', () => {
  process.stdout.write(`READY ${server.address().port}\n`);
});
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => process.exit(0));
