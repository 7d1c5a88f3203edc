#!/usr/bin/env python3
"""The official Python `mcp==2.3.0` client as a 2025-11-25 client (mode="legacy") or a
2026-07-28 one (mode="auto") that answers the server's questions: an elicitation callback
that accepts with every property of the requested form filled (integers N, strings "py",
booleans true; declines with --decline), a sampling callback that says "sampled by py", and a
roots callback with one root, file:///py-root. Calls one tool and prints one JSON line:
{"text": <first text block>, "isError": bool, "asked": [methods]}, or {"error": "..."}.

Usage: $D/py/bin/python tests/peers/py_asked.py URL TOOL [--value N] [--decline] [--mode legacy|auto] [--bearer T]
       [--args JSON] [--string S]
(--bearer: sent as `Authorization: Bearer T`, to be a caller of its own; --args: the tool's
arguments, {} by default; --string: what string properties are filled with, "py" by default.
The printed line also carries the result's "structured" content.)
"""

from __future__ import annotations

import argparse
import asyncio
import json

import mcp.types as types
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

asked: list[str] = []


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("tool")
    p.add_argument("--value", type=int, default=4)
    p.add_argument("--decline", action="store_true")
    p.add_argument("--mode", default="legacy")
    p.add_argument("--bearer")
    p.add_argument("--args", default="{}")
    p.add_argument("--string", default="py")
    a = p.parse_args()

    async def elicit(_ctx, params):
        asked.append("elicitation/create")
        if a.decline:
            return types.ElicitResult(action="decline")
        props = (getattr(params, "requested_schema", None) or {}).get("properties") or {}
        content = {
            k: (a.string if v.get("type") == "string" else True if v.get("type") == "boolean" else a.value)
            for k, v in props.items()
        }
        return types.ElicitResult(action="accept", content=content)

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
            streamable_http_client(
                a.url,
                http_client=create_mcp_http_client(
                    headers={"Authorization": f"Bearer {a.bearer}"} if a.bearer else None
                ),
            ),
            mode=a.mode,
            elicitation_callback=elicit,
            sampling_callback=sample,
            list_roots_callback=roots,
        ) as client:
            result = await client.call_tool(a.tool, json.loads(a.args))
            text = next((c.text for c in result.content if getattr(c, "type", "") == "text"), None)
            structured = getattr(result, "structured_content", None)
            print(json.dumps({"text": text, "isError": bool(result.is_error), "asked": asked,
                              "structured": structured}))
    except Exception as e:  # noqa: BLE001 - the test reads the failure
        while isinstance(e, BaseExceptionGroup) and e.exceptions:
            e = e.exceptions[0]
        print(json.dumps({"error": f"{type(e).__name__}: {e}", "asked": asked}))


asyncio.run(main())
