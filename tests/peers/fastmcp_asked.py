#!/usr/bin/env python3
"""FastMCP 4.1.6's own client (`fastmcp.Client`) that answers the server's questions: an
elicitation handler that fills every property of the requested form (integers N, strings
"fm", booleans true), a sampling handler that says "sampled by fastmcp", and one root,
file:///fastmcp-root. Calls one tool and prints one JSON line: {"text": <first text block>,
"isError": bool, "asked": [methods]}, or {"error": "..."}.

Usage: $PY tests/peers/fastmcp_asked.py URL TOOL [--value N] [--mode legacy|auto] [--bearer T]
(--bearer: sent as `Authorization: Bearer T`, to be a caller of its own)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os

os.environ.setdefault("FASTMCP_SHOW_SERVER_BANNER", "false")
os.environ.setdefault("FASTMCP_CHECK_FOR_UPDATES", "off")

from fastmcp import Client  # noqa: E402

asked: list[str] = []


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("tool")
    p.add_argument("--value", type=int, default=4)
    p.add_argument("--mode", default="auto")
    p.add_argument("--bearer")
    a = p.parse_args()

    async def elicit(message, response_type, params, ctx):
        asked.append("elicitation/create")
        props = (getattr(params, "requested_schema", None) or {}).get("properties") or {}
        return {
            k: ("fm" if v.get("type") == "string" else True if v.get("type") == "boolean" else a.value)
            for k, v in props.items()
        }

    async def sample(messages, params, ctx):
        asked.append("sampling/createMessage")
        return "sampled by fastmcp"

    def roots(ctx):
        asked.append("roots/list")
        return ["file:///fastmcp-root"]

    try:
        async with Client(
            a.url,
            mode=a.mode,
            elicitation_handler=elicit,
            sampling_handler=sample,
            roots=roots,
            timeout=30,
            auth=a.bearer,
        ) as client:
            result = await client.call_tool(a.tool, {}, raise_on_error=False)
            text = next((c.text for c in result.content if getattr(c, "type", "") == "text"), None)
            print(json.dumps({"text": text, "isError": bool(result.is_error), "asked": asked}))
    except Exception as e:  # noqa: BLE001 - the test reads the failure
        while isinstance(e, BaseExceptionGroup) and e.exceptions:
            e = e.exceptions[0]
        print(json.dumps({"error": f"{type(e).__name__}: {e}", "asked": asked}))


asyncio.run(main())
