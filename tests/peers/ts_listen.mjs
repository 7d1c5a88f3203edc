// The official TypeScript client (@modelcontextprotocol/client), pinned to 2026-07-28, as a
// listener: it opens `subscriptions/listen` with Client.listen(), calls a tool that changes
// the server's tool list, waits for the change notice on its listen stream, and lists the
// tools again.
//
//   node $D/ts/ts_listen.mjs URL TOOL NEW_TOOL [--header 'K: V']...
//
// It calls TOOL {name: NEW_TOOL} (the peers' `grow`), and prints ONE JSON object, exit 0:
//   {"honoredFilter": {...}, "call": "<the call's text>",
//    "heard": ["notifications/tools/list_changed", ...],
//    "heardAfterMs": ms from the call's answer to the first notice (negative: before it),
//    "tools": [names in the order tools/list gives them]}
// On an error: {"error": {"name","message","code"}} and exit 2. A watchdog
// (PEER_CLIENT_TIMEOUT_MS, default 30000) turns a hang into an error; a notice that never
// comes ends after 5 s with "heard": [].
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';

function finish(obj, code) {
  process.stdout.write(JSON.stringify(obj) + '\n', () => process.exit(code));
}

const args = process.argv.slice(2);
const [url, tool, newTool] = args;
const headers = {};
for (let i = 3; i < args.length; i++) {
  if (args[i] === '--header') {
    const [k, ...v] = args[++i].split(':');
    headers[k.trim()] = v.join(':').trim();
  }
}
setTimeout(
  () => finish({ error: { name: 'Timeout', message: 'watchdog', code: null } }, 2),
  Number(process.env.PEER_CLIENT_TIMEOUT_MS ?? 30000),
).unref();

try {
  const client = new Client(
    { name: 'ts-listen', version: '0' },
    { versionNegotiation: { mode: { pin: '2026-07-28' } } },
  );
  const heard = [];
  let heardAt = null;
  let wake = () => {};
  client.setNotificationHandler('notifications/tools/list_changed', () => {
    heard.push('notifications/tools/list_changed');
    heardAt ??= performance.now();
    wake();
  });
  await client.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } }));
  const sub = await client.listen({ toolsListChanged: true });
  const result = await client.callTool({ name: tool, arguments: { name: newTool } });
  const answeredAt = performance.now();
  if (heardAt === null) {
    await new Promise((resolve) => {
      wake = resolve;
      setTimeout(resolve, 5000);
    });
  }
  const listed = await client.listTools();
  await sub.close();
  finish(
    {
      honoredFilter: sub.honoredFilter,
      call: result.content?.[0]?.text ?? null,
      heard,
      heardAfterMs: heardAt === null ? null : Math.round((heardAt - answeredAt) * 1000) / 1000,
      tools: listed.tools.map((t) => t.name),
    },
    0,
  );
} catch (err) {
  finish({ error: { name: err?.name ?? typeof err, message: err?.message ?? String(err), code: err?.code ?? null } }, 2);
}
