#!/usr/bin/env python3
"""Python upstream peer for epode-sidecar's tests: the official `mcp==2.3.0` SDK.

Serves MCP 2025-11-25 (legacy, stateless) and 2026-07-28 (modern) on one URL,
http://127.0.0.1:PORT/mcp, with three tools:

  echo  {text}    -> no outputSchema; text content = JSON {"echoed", "len"}
  add   {a, b}    -> outputSchema {sum, a, b}; structuredContent + JSON text
  slow  {steps=3} -> one notifications/progress every ~100 ms (only when the
                     request carries _meta.progressToken), then text "done N";
                     no outputSchema (same as the TS peer)

Usage (run with the venv python from scripts/install-peers.sh):
  $D/py/bin/python tests/peers/py_server.py --port N [--json] [--require-token TOKEN] [--logging-completion] [--whoami]
  $D/py/bin/python tests/peers/py_server.py --stdio [--identity] [--extras]
  $D/py/bin/python tests/peers/py_server.py --port N|--stdio --questions [--era 2025] [--stateless]

  --port N               port on 127.0.0.1; 0 picks a free port
  --stdio                speak MCP over stdin/stdout (newline-delimited JSON-RPC) instead
  --json                 json_response=True: never SSE (mid-call progress is dropped)
  --require-token TOKEN  every HTTP request must carry `Authorization: Bearer TOKEN`,
                         otherwise 401 + WWW-Authenticate + a JSON error body
  --tls-cert PEM --tls-key PEM  serve HTTPS (for the sidecar's https:// upstream tests)
  --questions            also serve the tools that ask the client (server-initiated requests):
                           ask_count        elicitation/create, form {count: integer};
                                            "count N" / "declined" / "cancelled"
                           cancelled        "cancelled N": how many ask_count calls a
                                            notifications/cancelled ended while they waited
                           ask_twice {together=false}  two elicitations ("Your name?" {name},
                                            "Your age?" {age}), one after the other, or both at
                                            once (together=true); "name=.. age=.."
                           ask_many {n=1000} n elicitations at once; "answered A, refused R"
                           ask_forever {n=1000} n elicitations one after the other;
                                            "asked N times"
                           sample           sampling/createMessage (user text "Say hello",
                                            maxTokens 50); "sampled: <text>"
                           roots            roots/list, as with --extras (NOT related to the call:
                                            over HTTP it goes on the standalone GET stream)
                           roots_call       roots/list related to the call (rides its SSE stream)
                           sample_unrelated, ask_unrelated  sampling/createMessage and an
                                            elicitation/create form {count} not related to the
                                            call (over HTTP: the session's GET stream);
                                            "sampled: <text>", "count N"
                           grow {name="grown", related=false}  adds tool NAME (answers "grown
                                            NAME") and sends notifications/tools/list_changed:
                                            session-wide (GET stream) or, related=true, on the
                                            call's own stream; "grew NAME"
                           test_trigger_tool_change, test_trigger_prompt_change  the
                                            conformance suite's hooks: add a tool (a prompt)
                                            and send tools/ (prompts/) list_changed
                                            session-wide
                           touch {uri}      sends notifications/resources/updated for URI
                                            (session-wide: the GET stream over HTTP); says
                                            "touched URI; subscribed: U1,U2" (the URIs any
                                            resources/subscribe named). Resources
                                            note://a and note://b, subscribable.
                         Over HTTP --questions makes the server stateful (Mcp-Session-Id): the
                         SDK's stateless 2025 path has no back-channel (can_send_request=False),
                         so every server request fails there with -32600 "Cannot send
                         'elicitation/create': this transport context has no back-channel ...".
                         --stateless keeps it stateless anyway (to see that failure).
  --stateful / --stateless  force the HTTP session mode (default: stateless, or stateful
                         with --questions)
  --otlp URL             export the SDK's own spans (one per request, by the MCP semantic
                         conventions, parented from params._meta) to an OTLP/HTTP receiver
  --era 2025             speak ONLY the handshake era (2025-11-25 and older). mcp 2.3.0 has no
                         switch for it, so: over HTTP a request whose MCP-Protocol-Version
                         header is not a handshake version gets 400 + a JSON-RPC error (as the
                         TS SDK v1 answers it); over stdio the server runs the SDK's
                         handshake-only loop (serve_loop) instead of the dual-era one.
                         Default `both`: 2025-11-25 and 2026-07-28 on the same URL / pipe.
  --logging-completion   also handle logging/setLevel and completion/complete (a prompt
                         `greet {name}` whose name completes from Ada, Alan, Grace), so
                         both are advertised in either era, as FastMCP does; 2026-07-28
                         removed logging/setLevel, so a 2026 request for it still gets
                         404 / -32601

Readiness: once uvicorn accepts connections the server prints exactly one line
`READY <port>` to stdout (flushed); with --port 0 that is the port it got.
Waiting for that line is the reliable readiness signal; a TCP connect also
works (the socket is bound before the line is printed). Never probe with a
GET: the legacy stateless GET stream never ends.

DNS-rebinding protection is on (SDK default for host 127.0.0.1): Host must be
127.0.0.1:*, localhost:* or [::1]:*, else 421; a foreign Origin gets 403.
"""

from __future__ import annotations

import argparse
import json
import sys

import anyio
import uvicorn_ready
from pydantic import BaseModel

import mcp.types as types
import warnings
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from mcp.server.mcpserver import Context, MCPServer

mcp = MCPServer(name="py-peer", version="0.0.1")


@mcp.tool(structured_output=False)
def echo(text: str) -> dict:
    """Echo the text back (no outputSchema; the dict becomes a JSON text block)."""
    return {"echoed": text, "len": len(text)}


class AddResult(BaseModel):
    sum: int
    a: int
    b: int


@mcp.tool()
def add(a: int, b: int) -> AddResult:
    """Add two integers (outputSchema + structuredContent)."""
    return AddResult(sum=a + b, a=a, b=b)


@mcp.tool(structured_output=False)
async def slow(ctx: Context, steps: int = 3) -> str:
    """Sleep ~100 ms per step, reporting progress after each step."""
    for i in range(1, steps + 1):
        await anyio.sleep(0.1)
        await ctx.report_progress(i, steps)
    return f"done {steps}"


def add_identity_tools() -> None:
    """Tools whose results carry the product's private identity for the sidecar
    (`_meta["ai.epode/identity"]`), which the sidecar must remove before the client sees it.
    `account` takes the customer as an argument, so tests can act as several customers."""
    @mcp.tool()
    def account(customer: str, fail: bool = False) -> types.CallToolResult:
        """Look up the caller's account (identity travels in _meta for the sidecar)."""
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=f"account of {customer}")],
            is_error=fail,
            meta={
                "ai.epode/identity": {
                    "accountRef": customer,
                    "customerRef": customer,
                    "userRef": "user_1",
                    "sessionRef": "journey:1",
                    "runtimeHint": "py-peer 0.0.1",
                },
                "vendor.example/keep": "kept",
            },
        )


def add_whoami_tool() -> None:
    """A tool that says who the HTTP request named: whether it carried `Authorization` and
    the claims headers an authorizing gateway sets (`Epode-Auth-*`), so tests see what the
    server behind the sidecar is told."""
    @mcp.tool()
    def whoami(ctx: Context) -> dict:
        """Who is calling, as the HTTP request says."""
        request = ctx.request_context.request
        headers = request.headers if request is not None else {}
        return {
            "authorization": headers.get("authorization") is not None,
            "subject": headers.get("epode-auth-subject"),
            "scopes": headers.get("epode-auth-scopes"),
            "client": headers.get("epode-auth-client"),
        }


def add_stdio_tools() -> None:
    """Tools for the stdio transport's tests: a server request (roots/list, which a 2025
    session can make), a chatty stderr, and an answer of any size."""

    add_roots_tool()

    @mcp.tool(structured_output=False)
    def shout(lines: int) -> str:
        """Write that many lines to stderr."""
        for i in range(lines):
            print(f"shout line {i}", file=sys.stderr)
        sys.stderr.flush()
        return f"shouted {lines}"

    @mcp.tool(structured_output=False)
    def big(size: int) -> str:
        """A text answer of `size` characters."""
        return "x" * size


_roots_added = False


def add_roots_tool() -> None:
    """`roots`: ask the client for its roots (roots/list). The SDK's list_roots() takes no
    related request, so over stateful HTTP the request goes on the standalone GET stream."""
    global _roots_added
    if _roots_added:
        return
    _roots_added = True

    @mcp.tool(structured_output=False)
    async def roots(ctx: Context) -> str:
        """Ask the client for its roots (a server-initiated request)."""
        got = await ctx.session.list_roots()
        return f"{len(got.roots)} roots: " + ",".join(str(r.uri) for r in got.roots)


class Count(BaseModel):
    count: int


class Name(BaseModel):
    name: str


class Age(BaseModel):
    age: int


def _said(result, field: str) -> str:
    if result.action == "accept":
        return str(getattr(result.data, field))
    return "declined" if result.action == "decline" else "cancelled"


# ask_count calls cancelled (notifications/cancelled) while waiting for their answer.
CANCELLED_WAITS = [0]


def add_question_tools() -> None:
    """Tools that ask the client things mid-call (server-initiated requests)."""
    add_roots_tool()

    @mcp.tool(structured_output=False)
    async def ask_count(ctx: Context) -> str:
        """Ask the user for a count (elicitation/create, form mode)."""
        try:
            got = await ctx.elicit("How many?", schema=Count)
        except anyio.get_cancelled_exc_class():
            # notifications/cancelled for this call ended the wait (what `cancelled` tells).
            CANCELLED_WAITS[0] += 1
            raise
        if got.action == "accept":
            return f"count {got.data.count}"
        return "declined" if got.action == "decline" else "cancelled"

    @mcp.tool(structured_output=False)
    async def cancelled() -> str:
        """How many ask_count calls were cancelled while they waited for the answer."""
        return f"cancelled {CANCELLED_WAITS[0]}"

    @mcp.tool(structured_output=False)
    async def ask_twice(ctx: Context, together: bool = False) -> str:
        """Ask two questions: one after the other, or both at once (together=true)."""
        if together:
            answers: dict[str, object] = {}

            async def one(key: str, message: str, schema) -> None:
                answers[key] = await ctx.elicit(message, schema=schema)

            async with anyio.create_task_group() as tg:
                tg.start_soon(one, "name", "Your name?", Name)
                tg.start_soon(one, "age", "Your age?", Age)
            name, age = answers["name"], answers["age"]
        else:
            name = await ctx.elicit("Your name?", schema=Name)
            age = await ctx.elicit("Your age?", schema=Age)
        return f"name={_said(name, 'name')} age={_said(age, 'age')}"

    @mcp.tool(structured_output=False)
    async def ask_many(ctx: Context, n: int = 1000) -> str:
        """Ask N counts at once; say how many were answered and how many came back an error."""
        results: list[object] = [None] * n

        async def one(i: int) -> None:
            try:
                results[i] = await ctx.elicit(f"Count {i}?", schema=Count)
            except Exception as e:  # the client (or the sidecar) refused to ask it
                results[i] = e

        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)
        answered = sum(1 for r in results if getattr(r, "action", None) == "accept")
        refused = sum(1 for r in results if isinstance(r, Exception))
        return f"answered {answered}, refused {refused}"

    @mcp.tool(structured_output=False)
    async def ask_forever(ctx: Context, n: int = 1000) -> str:
        """Ask a count N times, one after the other; "asked N times" if every one is answered."""
        for i in range(n):
            await ctx.elicit(f"Count {i}?", schema=Count)
        return f"asked {n} times"

    @mcp.tool(structured_output=False)
    async def sample(ctx: Context) -> str:
        """Ask the client's model to say hello (sampling/createMessage)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = await ctx.session.create_message(
                messages=[types.SamplingMessage(role="user", content=types.TextContent(type="text", text="Say hello"))],
                max_tokens=50,
                related_request_id=ctx.request_id,
            )
        content = got.content
        text = getattr(content, "text", None)
        return f"sampled: {text if text is not None else content}"

    @mcp.tool(structured_output=False)
    async def sample_unrelated(ctx: Context) -> str:
        """The same, without related_request_id: over HTTP it goes on the session's GET stream."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = await ctx.session.create_message(
                messages=[types.SamplingMessage(role="user", content=types.TextContent(type="text", text="Say hello"))],
                max_tokens=50,
            )
        content = got.content
        text = getattr(content, "text", None)
        return f"sampled: {text if text is not None else content}"

    @mcp.tool(structured_output=False)
    async def ask_unrelated(ctx: Context) -> str:
        """Ask for a count without relating the question to the call: the session's GET stream."""
        got = await ctx.session.elicit_form(
            "How many?",
            {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]},
        )
        if got.action == "accept":
            return f"count {(got.content or {}).get('count')}"
        return "declined" if got.action == "decline" else "cancelled"

    @mcp.tool(structured_output=False)
    async def roots_call(ctx: Context) -> str:
        """Ask the client for its roots on the call's own stream (roots/list, related)."""
        got = await ctx.session.send_request(
            types.ListRootsRequest(),
            types.ListRootsResult,
            metadata=ServerMessageMetadata(related_request_id=ctx.request_id),
        )
        return f"{len(got.roots)} roots: " + ",".join(str(r.uri) for r in got.roots)

    @mcp.tool(structured_output=False)
    async def grow(ctx: Context, name: str = "grown", related: bool = False) -> str:
        """Add a tool at run time and send notifications/tools/list_changed."""

        def grown() -> str:
            return f"grown {name}"

        mcp.add_tool(grown, name=name, description=f"Added at run time by grow ({name}).", structured_output=False)
        await ctx.session.send_notification(
            types.ToolListChangedNotification(), related_request_id=ctx.request_id if related else None
        )
        return f"grew {name}"


def add_subscription_tools() -> None:
    """Resources a client may subscribe to, and a tool that changes one."""
    subscribed: set[str] = set()

    @mcp.resource("note://a", name="note-a")
    def note_a() -> str:
        return "note a"

    @mcp.resource("note://b", name="note-b")
    def note_b() -> str:
        return "note b"

    async def on_subscribe(ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
        subscribed.add(str(params.uri))
        return types.EmptyResult()

    async def on_unsubscribe(ctx, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        subscribed.discard(str(params.uri))
        return types.EmptyResult()

    low = mcp._lowlevel_server
    low.add_request_handler("resources/subscribe", types.SubscribeRequestParams, on_subscribe)
    low.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, on_unsubscribe)

    changes = {"tool": 0, "prompt": 0}

    @mcp.tool(structured_output=False)
    async def test_trigger_tool_change(ctx: Context) -> str:
        """The conformance suite's hook: add a tool, tell the session (session-wide)."""
        changes["tool"] += 1
        n = changes["tool"]

        def changed() -> str:
            return f"changed {n}"

        mcp.add_tool(changed, name=f"changed_{n}", structured_output=False)
        await ctx.session.send_tool_list_changed()
        return f"tool list changed ({n})"

    @mcp.tool(structured_output=False)
    async def test_trigger_prompt_change(ctx: Context) -> str:
        """The conformance suite's hook: add a prompt, tell the session (session-wide)."""
        changes["prompt"] += 1
        n = changes["prompt"]

        def prompt() -> str:
            return f"prompt {n}"

        mcp.prompt(name=f"prompt_{n}")(prompt)
        await ctx.session.send_prompt_list_changed()
        return f"prompt list changed ({n})"

    @mcp.tool(structured_output=False)
    async def touch(ctx: Context, uri: str) -> str:
        """Send notifications/resources/updated for URI (session-wide); say who subscribed."""
        await ctx.session.send_resource_updated(uri)
        return f"touched {uri}; subscribed: " + ",".join(sorted(subscribed))


class Era2025Only:
    """ASGI wrapper: a request naming a protocol version the handshake era does not have
    (MCP-Protocol-Version: 2026-07-28, say) gets 400 + a JSON-RPC error, as a 2025-only
    server (the TS SDK v1) answers it; everything else reaches the SDK's legacy path."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            got = [v for k, v in scope.get("headers", []) if k.lower() == b"mcp-protocol-version"]
            if got and got[0].decode("latin-1") not in HANDSHAKE_PROTOCOL_VERSIONS:
                supported = ", ".join(reversed(HANDSHAKE_PROTOCOL_VERSIONS))
                body = json.dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": None,
                        "error": {
                            "code": -32000,
                            "message": f"Bad Request: Unsupported protocol version: {got[0].decode('latin-1')}"
                            f" (supported versions: {supported})",
                        },
                    }
                ).encode()
                await receive_body(receive)
                await send(
                    {
                        "type": "http.response.start",
                        "status": 400,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


async def receive_body(receive) -> None:
    """Drain the request body (so the connection can be reused)."""
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body"):
            return


async def run_stdio_2025_only() -> None:
    """stdio with the SDK's handshake-only loop (what the streamable-HTTP manager uses per
    session) instead of Server.run's dual-era loop: no 2026-07-28 envelope is served."""
    from mcp.server.runner import serve_loop
    from mcp.server.stdio import stdio_server

    low = mcp._lowlevel_server
    async with stdio_server() as (read_stream, write_stream):
        async with low.lifespan(low) as state:
            await serve_loop(
                low, read_stream, write_stream, lifespan_state=state, init_options=low.create_initialization_options()
            )


def add_logging_and_completion() -> None:
    """A logging/setLevel handler (which makes the server advertise `logging`) and a
    completable prompt (which makes it advertise `completions`)."""

    async def set_level(ctx, params: types.SetLevelRequestParams) -> types.EmptyResult:
        return types.EmptyResult()

    mcp._lowlevel_server.add_request_handler("logging/setLevel", types.SetLevelRequestParams, set_level)

    @mcp.prompt()
    def greet(name: str) -> str:
        """Greet someone by name."""
        return f"Hello, {name}!"

    @mcp.completion()
    async def complete(ref, argument, context) -> types.Completion | None:
        if isinstance(ref, types.PromptReference) and ref.name == "greet" and argument.name == "name":
            names = ["Ada", "Alan", "Grace"]
            return types.Completion(values=[n for n in names if n.startswith(argument.value)])
        return None


class RequireBearer:
    """ASGI wrapper: HTTP requests without `Authorization: Bearer TOKEN` get 401.

    Lifespan (and anything not HTTP) passes straight through, so the wrapped
    Starlette app still starts the session manager.
    """

    BODY = json.dumps(
        {"error": "invalid_token", "error_description": "peer requires a bearer token"}
    ).encode()

    def __init__(self, app, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            auth = [v for k, v in scope.get("headers", []) if k.lower() == b"authorization"]
            if auth != [self.expected]:
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(self.BODY)).encode()),
                            (b"www-authenticate", b'Bearer realm="peer"'),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": self.BODY})
                return
        await self.app(scope, receive, send)



def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, help="port on 127.0.0.1 (0 = pick a free one)")
    p.add_argument("--stdio", action="store_true", help="speak MCP over stdin/stdout instead of HTTP")
    p.add_argument("--extras", action="store_true", help="also serve roots, shout and big (the stdio tests' tools)")
    p.add_argument("--json", action="store_true", help="json_response=True (never SSE)")
    p.add_argument("--require-token", metavar="TOKEN", help="require Authorization: Bearer TOKEN")
    p.add_argument("--whoami", action="store_true", help="also serve the `whoami` tool (the request's Authorization and Epode-Auth-* headers)")
    p.add_argument("--identity", action="store_true", help="also serve the `account` tool, whose result carries _meta identity")
    p.add_argument("--tls-cert", metavar="PEM", help="serve HTTPS with this certificate chain (with --tls-key)")
    p.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
    p.add_argument("--logging-completion", action="store_true", help="also handle logging/setLevel and completion/complete")
    p.add_argument("--keep-alive", type=float, default=5, metavar="SECONDS", help="uvicorn's keep-alive timeout (its default: 5)")
    p.add_argument("--questions", action="store_true", help="also serve ask_count, ask_twice, sample, roots, roots_call, grow (HTTP: stateful)")
    p.add_argument("--era", choices=["both", "2025"], default="both", help="2025: speak only the handshake era (2025-11-25)")
    p.add_argument("--otlp", metavar="URL", help="export the SDK's own OpenTelemetry spans (mcp 2.3.0 makes one per request) to URL/v1/traces with the official opentelemetry-sdk and OTLP/HTTP exporter, one by one")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--stateful", action="store_true", help="HTTP sessions (Mcp-Session-Id)")
    mode.add_argument("--stateless", action="store_true", help="no HTTP sessions (the default without --questions)")
    args = p.parse_args()
    if args.otlp:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor

        provider = TracerProvider(resource=Resource.create({"service.name": "py-upstream"}))
        provider.add_span_processor(
            SimpleSpanProcessor(OTLPSpanExporter(endpoint=args.otlp.rstrip("/") + "/v1/traces"))
        )
        trace.set_tracer_provider(provider)
    if args.questions:
        add_question_tools()
        add_subscription_tools()
    if args.identity:
        add_identity_tools()
    if args.whoami:
        add_whoami_tool()
    if args.extras:
        add_stdio_tools()
    if args.logging_completion:
        add_logging_and_completion()
    if args.stdio:
        if args.era == "2025":
            anyio.run(run_stdio_2025_only)
        else:
            mcp.run("stdio")
        return
    if args.port is None:
        p.error("--port is required (or --stdio)")

    stateless = not (args.stateful or (args.questions and not args.stateless))
    app = mcp.streamable_http_app(
        stateless_http=stateless,
        json_response=args.json,
        host="127.0.0.1",  # turns on the SDK's localhost Host/Origin checks
    )
    asgi = Era2025Only(app) if args.era == "2025" else app
    asgi = RequireBearer(asgi, args.require_token) if args.require_token else asgi

    tls = {"ssl_certfile": args.tls_cert, "ssl_keyfile": args.tls_key} if args.tls_cert else {}
    uvicorn_ready.serve(asgi, args.port, timeout_keep_alive=args.keep_alive, **tls)


if __name__ == "__main__":
    sys.exit(main())
