#!/usr/bin/env python3
"""FastMCP 4.1.6 upstream peer for epode-sidecar's tests (server-initiated questions).

A real FastMCP server whose tools ask the client questions the 2025 way
(`ctx.elicit`, i.e. a server-to-client `elicitation/create` request):

  party          -> ctx.elicit("How many people?", response_type=int);
                    accept: "party for N", decline: "no party (declined)",
                    cancel: "no party (cancelled)"
  two_questions  -> two ctx.elicit calls run concurrently (asyncio.gather):
                    "Your name?" (str) and "Your age?" (int); the answer is
                    "name=<name|declined|cancelled> age=<n|declined|cancelled>".
                    FastMCP allows the concurrency: both elicitation/create
                    requests are on the wire before either is answered (ids 0 and 1
                    on HTTP; see tests/peers/probe_questions.py).
  grow {name="grown"} -> registers a new tool NAME at run time (it answers "grown
                    NAME") and sends notifications/tools/list_changed, related to the
                    call (so over HTTP it rides the tools/call's own SSE stream);
                    "grew NAME"
  party_mrtr     -> the 2026 way (guard pattern): on a 2026-07-28 call it returns
                    resultType "input_required" with inputRequests {"count": elicitation/create
                    form {value: integer}}; the retry carrying inputResponses.count answers
                    "party for N" / "no party (decline|cancel)". On a 2025 connection FastMCP
                    refuses it (JSON-RPC -32602 "... only exists at MCP 2026-07-28 ...").
  sample_call, roots_call -> sampling/createMessage, roots/list on the call's stream
                    (related_request_id); "sampled: <text>", "N roots: <uris>"
  sample_unrelated, roots_unrelated, ask_unrelated -> the same and a form {count: integer}
                    NOT related to the call: over HTTP on the session's GET stream
                    ("count N")
  plain          -> no question; "plain answer"

Protocol eras. FastMCP 4.1.6 sits on `mcp==2.3.0`, so one URL serves both:
  * 2025-11-25 (and older handshake versions): `initialize` + Mcp-Session-Id
    (stateful; this peer never runs stateless). `ctx.elicit` sends
    `elicitation/create` on the tools/call's SSE response stream; the client
    answers with a POST of the JSON-RPC response carrying Mcp-Session-Id.
  * 2026-07-28 (requests with MCP-Protocol-Version: 2026-07-28 and the _meta
    envelope; server/discover): sessionless. `ctx.elicit` is refused before
    anything is sent: the tools/call answers a CallToolResult with isError=true and
    the text "elicitation via server-initiated requests is unavailable on
    2026-07-28 connections." (FastMCP's _ELICIT_MODERN_ERROR, fastmcp/server/context.py).
    FastMCP never turns ctx.elicit into an `input_required` result; only a tool that
    itself returns an InputRequiredResult would produce one.
  * stdio: the same dual-era behaviour; the first request decides the era.

Usage (the python that scripts/install-peers.sh prints as PEER_FASTMCP_PYTHON):
  $PY tests/peers/fastmcp_server.py --port N     # http://127.0.0.1:N/mcp, stateful
  $PY tests/peers/fastmcp_server.py --stdio

Readiness (HTTP): once uvicorn accepts connections the server prints exactly one
line `READY <port>` to stdout (flushed); with --port 0 that is the port it got.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

# No banner, no update check, no rich logging on stdout (stdio carries JSON-RPC).
os.environ.setdefault("FASTMCP_SHOW_SERVER_BANNER", "false")
os.environ.setdefault("FASTMCP_CHECK_FOR_UPDATES", "off")

import mcp_types  # noqa: E402
import uvicorn_ready  # noqa: E402
from fastmcp import Context, FastMCP  # noqa: E402
from fastmcp.server.elicitation import AcceptedElicitation, CancelledElicitation  # noqa: E402

mcp = FastMCP(name="fastmcp-peer", version="0.0.1")


def _said(result, what: str = "value") -> str:
    if isinstance(result, AcceptedElicitation):
        return str(result.data)
    if isinstance(result, CancelledElicitation):
        return "cancelled"
    return "declined"


@mcp.tool
async def party(ctx: Context) -> str:
    """Ask how many people come (one elicitation, an int)."""
    got = await ctx.elicit("How many people?", response_type=int)
    if isinstance(got, AcceptedElicitation):
        return f"party for {got.data}"
    if isinstance(got, CancelledElicitation):
        return "no party (cancelled)"
    return "no party (declined)"


@mcp.tool
async def two_questions(ctx: Context) -> str:
    """Ask two questions at once (two concurrent elicitations)."""
    name, age = await asyncio.gather(
        ctx.elicit("Your name?", response_type=str),
        ctx.elicit("Your age?", response_type=int),
    )
    return f"name={_said(name)} age={_said(age)}"


@mcp.tool
async def grow(ctx: Context, name: str = "grown") -> str:
    """Add a tool at run time and tell the client the tool list changed."""

    def grown() -> str:
        return f"grown {name}"

    mcp.tool(grown, name=name, description=f"Added at run time by grow ({name}).")
    await ctx.send_notification(mcp_types.ToolListChangedNotification())
    return f"grew {name}"


@mcp.tool
async def party_mrtr(ctx: Context) -> str | mcp_types.InputRequiredResult:
    """The 2026 way (SEP-2322 guard pattern): return input_required, read the retry's answer."""
    got = (ctx.input_responses or {}).get("count")
    if got is None:
        return mcp_types.InputRequiredResult(
            input_requests={
                "count": mcp_types.ElicitRequest(
                    params=mcp_types.ElicitRequestFormParams(
                        message="How many people?",
                        requested_schema={
                            "type": "object",
                            "properties": {"value": {"type": "integer", "title": "Value"}},
                            "required": ["value"],
                        },
                    )
                )
            }
        )
    if getattr(got, "action", None) == "accept":
        return f"party for {(got.content or {}).get('value')}"
    return f"no party ({getattr(got, 'action', got)})"


def _hello() -> list:
    return [mcp_types.SamplingMessage(role="user", content=mcp_types.TextContent(type="text", text="Say hello"))]


def _sampled(got) -> str:
    text = getattr(got.content, "text", None)
    return f"sampled: {text if text is not None else got.content}"


@mcp.tool
async def sample_call(ctx: Context) -> str:
    """Ask the client's model to say hello, on the call's stream."""
    got = await ctx.session.create_message(
        messages=_hello(), max_tokens=50, related_request_id=ctx.request_id
    )
    return _sampled(got)


@mcp.tool
async def roots_call(ctx: Context) -> str:
    """Ask the client for its roots, on the call's stream."""
    from mcp.shared.message import ServerMessageMetadata

    got = await ctx.session.send_request(
        mcp_types.ListRootsRequest(),
        mcp_types.ListRootsResult,
        metadata=ServerMessageMetadata(related_request_id=ctx.request_id),
    )
    return f"{len(got.roots)} roots: " + ",".join(str(r.uri) for r in got.roots)


@mcp.tool
async def sample_unrelated(ctx: Context) -> str:
    """The same, not related to the call: over HTTP, the session's GET stream."""
    got = await ctx.session.create_message(messages=_hello(), max_tokens=50)
    return _sampled(got)


@mcp.tool
async def roots_unrelated(ctx: Context) -> str:
    """Ask the client for its roots, not related to the call (the session's GET stream)."""
    got = await ctx.session.list_roots()
    return f"{len(got.roots)} roots: " + ",".join(str(r.uri) for r in got.roots)


@mcp.tool
async def ask_unrelated(ctx: Context) -> str:
    """Ask for a count, not related to the call (the session's GET stream)."""
    got = await ctx.session.elicit_form(
        "How many?",
        {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]},
    )
    if got.action == "accept":
        return f"count {(got.content or {}).get('count')}"
    return "declined" if got.action == "decline" else "cancelled"


@mcp.tool
def plain() -> str:
    """No question: a plain text answer."""
    return "plain answer"



def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, help="port on 127.0.0.1 (0 = pick a free one)")
    p.add_argument("--stdio", action="store_true", help="speak MCP over stdin/stdout instead of HTTP")
    args = p.parse_args()
    if args.stdio:
        mcp.run("stdio", show_banner=False)
        return 0
    if args.port is None:
        p.error("--port is required (or --stdio)")

    app = mcp.http_app(path="/mcp", stateless_http=False, json_response=False)

    uvicorn_ready.serve(app, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
