#!/usr/bin/env python3
"""The official Python `mcp==2.3.0` client as a 2025-11-25 client (mode="legacy") that answers
the server's questions: an elicitation callback that accepts with `{"value": N}` (or
declines with --decline), and a sampling callback that says "sampled by py". Calls one tool
and prints one JSON line: {"text": <first text block>, "isError": bool, "asked": [methods]},
or {"error": "..."}.

Usage: $D/py/bin/python tests/peers/py_asked.py URL TOOL [--value N] [--decline] [--mode legacy|auto]
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
    a = p.parse_args()

    async def elicit(_ctx, params):
        asked.append("elicitation/create")
        if a.decline:
            return types.ElicitResult(action="decline")
        return types.ElicitResult(action="accept", content={"value": a.value})

    async def sample(_ctx, params):
        asked.append("sampling/createMessage")
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="sampled by py"), model="py"
        )

    try:
        async with Client(
            streamable_http_client(a.url),
            mode=a.mode,
            elicitation_callback=elicit,
            sampling_callback=sample,
        ) as client:
            result = await client.call_tool(a.tool, {})
            text = next((c.text for c in result.content if getattr(c, "type", "") == "text"), None)
            print(json.dumps({"text": text, "isError": bool(result.is_error), "asked": asked}))
    except Exception as e:  # noqa: BLE001 - the test reads the failure
        while isinstance(e, BaseExceptionGroup) and e.exceptions:
            e = e.exceptions[0]
        print(json.dumps({"error": f"{type(e).__name__}: {e}", "asked": asked}))


asyncio.run(main())
