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

  --port N               port on 127.0.0.1; 0 picks a free port
  --stdio                speak MCP over stdin/stdout (newline-delimited JSON-RPC) instead
  --json                 json_response=True: never SSE (mid-call progress is dropped)
  --require-token TOKEN  every HTTP request must carry `Authorization: Bearer TOKEN`,
                         otherwise 401 + WWW-Authenticate + a JSON error body
  --tls-cert PEM --tls-key PEM  serve HTTPS (for the sidecar's https:// upstream tests)
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
import asyncio
import json
import socket
import sys

import anyio
import uvicorn
from pydantic import BaseModel

import mcp.types as types
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

    @mcp.tool(structured_output=False)
    async def roots(ctx: Context) -> str:
        """Ask the client for its roots (a server-initiated request)."""
        got = await ctx.session.list_roots()
        return f"{len(got.roots)} roots: " + ",".join(str(r.uri) for r in got.roots)

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


class ReadyServer(uvicorn.Server):
    """Prints `READY <port>` once uvicorn has started serving."""

    def __init__(self, config: uvicorn.Config, port: int) -> None:
        super().__init__(config)
        self.ready_port = port

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets=sockets)
        if not self.should_exit:
            print(f"READY {self.ready_port}", flush=True)


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
    args = p.parse_args()
    if args.identity:
        add_identity_tools()
    if args.whoami:
        add_whoami_tool()
    if args.extras:
        add_stdio_tools()
    if args.logging_completion:
        add_logging_and_completion()
    if args.stdio:
        mcp.run("stdio")
        return
    if args.port is None:
        p.error("--port is required (or --stdio)")

    app = mcp.streamable_http_app(
        stateless_http=True,
        json_response=args.json,
        host="127.0.0.1",  # turns on the SDK's localhost Host/Origin checks
    )
    asgi = RequireBearer(app, args.require_token) if args.require_token else app

    # Bind ourselves so that --port 0 works and the port is known up front.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(128)
    port = sock.getsockname()[1]

    tls = {"ssl_certfile": args.tls_cert, "ssl_keyfile": args.tls_key} if args.tls_cert else {}
    config = uvicorn.Config(
        asgi, log_level="warning", lifespan="on", access_log=False, timeout_keep_alive=args.keep_alive, **tls
    )
    server = ReadyServer(config, port)
    try:
        asyncio.run(server.serve(sockets=[sock]))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
