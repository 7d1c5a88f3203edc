// Official TypeScript MCP client (@modelcontextprotocol/client 2.4.0) as a test driver.
//
// Run from the installed copy (bare imports resolve against $D/ts/node_modules):
//   node $D/ts/ts_client.mjs URL legacy|auto|pin [--header 'K: V']... [--everything]
//
//   legacy  versionNegotiation {mode:'legacy'}  -> initialize handshake (2025-11-25)
//   auto    versionNegotiation {mode:'auto'}    -> server/discover probe, falls back to initialize
//   pin     versionNegotiation {mode:{pin:'2026-07-28'}} -> modern only, no fallback
//   --header 'K: V'   extra HTTP header on every request (repeatable), e.g.
//                     --header 'Authorization: Bearer s3cret'
//   --everything      call server-everything's equivalents instead (same output keys):
//                     echo {message:"hi ✓"}, get-sum {a:2,b:3} as "add",
//                     trigger-long-running-operation {duration:0.2,steps:2} as "slow"
//
// It connects, lists tools, then calls
//   echo {text:"hi ✓"}, add {a:2,b:3}, slow {steps:2} (with onprogress)
// and prints ONE JSON object on stdout, exit 0:
//   {"era","negotiatedVersion","serverInfo","tools":[...sorted by name],
//    "calls":{"echo":result,"add":result,"slow":result},
//    "progress":[{"progress","total","atMs"}],"slowResultAtMs"}
// atMs / slowResultAtMs are milliseconds (3 decimals) since the slow call started.
//
// On any error it prints {"error":{"name","message","code","status"?,"data"?}} and
// exits 2. `status` is the HTTP status when the SDK error carries one
// (SdkHttpError.status / data.status, e.g. 401); `code` is the SdkErrorCode
// string (e.g. "CLIENT_HTTP_AUTHENTICATION") or the JSON-RPC code number.
// A watchdog (PEER_CLIENT_TIMEOUT_MS, default 30000) turns a hang into an error.
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';

const MODES = { legacy: 'legacy', auto: 'auto', pin: { pin: '2026-07-28' } };

// output key -> [tool name, arguments]
const OUR_TOOLS = {
  echo: ['echo', { text: 'hi ✓' }],
  add: ['add', { a: 2, b: 3 }],
  slow: ['slow', { steps: 2 }],
};
const EVERYTHING_TOOLS = {
  echo: ['echo', { message: 'hi ✓' }],
  add: ['get-sum', { a: 2, b: 3 }],
  slow: ['trigger-long-running-operation', { duration: 0.2, steps: 2 }],
};

function finish(obj, code) {
  process.stdout.write(JSON.stringify(obj) + '\n', () => process.exit(code));
}

function jsonSafe(v) {
  if (v === undefined) return undefined;
  try {
    return JSON.parse(JSON.stringify(v));
  } catch {
    return String(v);
  }
}

function describeError(err) {
  const out = { name: err?.name ?? typeof err, message: err?.message ?? String(err) };
  out.code = err?.code ?? null;
  // HTTP status: SdkHttpError has a `status` getter (= data.status); walk the cause chain too.
  for (let e = err, depth = 0; e && depth < 5; e = e.cause, depth++) {
    const status = typeof e.status === 'number' ? e.status : e.data?.status;
    if (typeof status === 'number') {
      out.status = status;
      break;
    }
  }
  const data = jsonSafe(err?.data);
  if (data !== undefined) out.data = data;
  return out;
}

function usage(msg) {
  finish({ error: { name: 'Usage', message: `${msg}; usage: ts_client.mjs URL legacy|auto|pin [--header 'K: V']... [--everything]`, code: null } }, 2);
}

async function main() {
  const argv = process.argv.slice(2);
  const positional = [];
  const headers = {};
  let toolSet = OUR_TOOLS;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--header') {
      const h = argv[++i];
      const idx = h === undefined ? -1 : h.indexOf(':');
      if (idx <= 0) return usage(`bad --header ${JSON.stringify(h)}`);
      headers[h.slice(0, idx).trim()] = h.slice(idx + 1).trim();
    } else if (a === '--everything') toolSet = EVERYTHING_TOOLS;
    else positional.push(a);
  }
  if (positional.length !== 2 || !(positional[1] in MODES)) return usage('need URL and mode');
  const [url, modeName] = positional;

  const watchdogMs = Number(process.env.PEER_CLIENT_TIMEOUT_MS ?? 30000);
  setTimeout(
    () => finish({ error: { name: 'Timeout', message: `no result within ${watchdogMs} ms`, code: null } }, 2),
    watchdogMs,
  ).unref();

  const client = new Client(
    { name: 'epode-peer-ts-client', version: '0.0.1' },
    { versionNegotiation: { mode: MODES[modeName] } },
  );
  const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
  await client.connect(transport);

  const serverInfo =
    client.getServerVersion() ??
    client.getDiscoverResult()?._meta?.['io.modelcontextprotocol/serverInfo'] ??
    null;
  const era = client.getProtocolEra() ?? null;
  const negotiatedVersion = client.getNegotiatedProtocolVersion() ?? null;

  const { tools } = await client.listTools();
  tools.sort((x, y) => (x.name < y.name ? -1 : x.name > y.name ? 1 : 0));

  const calls = {};
  for (const key of ['echo', 'add']) {
    const [name, args] = toolSet[key];
    calls[key] = await client.callTool({ name, arguments: args });
  }

  const progress = [];
  const t0 = performance.now();
  const ms = () => Math.round((performance.now() - t0) * 1000) / 1000;
  calls.slow = await client.callTool(
    { name: toolSet.slow[0], arguments: toolSet.slow[1] },
    { onprogress: (p) => progress.push({ progress: p.progress, total: p.total ?? null, atMs: ms() }) },
  );
  const slowResultAtMs = ms();

  try {
    await client.close();
  } catch {
    /* closing is best effort */
  }
  finish({ era, negotiatedVersion, serverInfo, tools, calls, progress, slowResultAtMs }, 0);
}

main().catch((err) => finish({ error: describeError(err) }, 2));
