#!/usr/bin/env python3
"""The official Python `mcp==2.3.0` client as a 2025-11-25 client (mode="legacy") or a
2026-07-28 one (mode="auto") that answers the server's questions: an elicitation callback
that accepts with `{"value": N}` (or `{"count": N}` with --field count; declines with
--decline), a sampling callback that says "sampled by py", and a roots callback with one root,
file:///py-root. Calls one tool and prints one JSON line: {"text": <first text block>,
"isError": bool, "asked": [methods]}, or {"error": "..."}.

Usage: $D/py/bin/python tests/peers/py_asked.py URL TOOL [--value N] [--field F] [--decline] [--mode legacy|auto]
"""

from __future__ import annotations

import argparse
import asyncio
import json

import mcp.types as types
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

asked: list[str] = []


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("tool")
    p.add_argument("--value", type=int, default=4)
    p.add_argument("--decline", action="store_true")
    p.add_argument("--mode", default="legacy")
    p.add_argument("--field", default="value")
    a = p.parse_args()

    async def elicit(_ctx, params):
        asked.append("elicitation/create")
        if a.decline:
            return types.ElicitResult(action="decline")
        return types.ElicitResult(action="accept", content={a.field: a.value})

    async def sample(_ctx, params):
        asked.append("sampling/createMessage")
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="sampled by py"), model="py"
        )

    async def roots(_ctx):
        asked.append("roots/list")
        return types.ListRootsResult(roots=[types.Root(uri="file:///py-root", name="py")])

    try:
        async with Client(
            streamable_http_client(a.url),
            mode=a.mode,
            elicitation_callback=elicit,
            sampling_callback=sample,
            list_roots_callback=roots,
        ) as client:
            result = await client.call_tool(a.tool, {})
            text = next((c.text for c in result.content if getattr(c, "type", "") == "text"), None)
            print(json.dumps({"text": text, "isError": bool(result.is_error), "asked": asked}))
    except Exception as e:  # noqa: BLE001 - the test reads the failure
        while isinstance(e, BaseExceptionGroup) and e.exceptions:
            e = e.exceptions[0]
        print(json.dumps({"error": f"{type(e).__name__}: {e}", "asked": asked}))


asyncio.run(main())
