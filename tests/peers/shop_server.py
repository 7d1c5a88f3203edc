#!/usr/bin/env python3
"""A plain MCP server with no Epode code (the official Python `mcp` SDK): the four product
tools of Epode's own customer-context end-to-end test (`tests/customer-context-mcp-e2e.mjs` at
open-software-network/os-agent-feedback 37c2131), each answering
`{"content": [{"type": "text", "text": "<name> completed"}], "structuredContent":
{"operation": <name>, "results": 2}}`. Stateless streamable HTTP, SSE answers (the SDK's
default). Prints `READY <port>` once it serves.

Usage: $D/py/bin/python tests/peers/shop_server.py --port N
"""

from __future__ import annotations

import argparse

import uvicorn_ready

import mcp.types as types
from mcp.server.mcpserver import MCPServer

mcp = MCPServer(name="shop", version="1.0.0")


def product_tool(name: str) -> None:
    def run(query: str = "") -> types.CallToolResult:
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=f"{name} completed")],
            structured_content={"operation": name, "results": 2},
        )

    run.__name__ = name
    mcp.tool(name=name, description=f"{name.replace('_', ' ')} (a product tool)")(run)


for tool in ["search_catalog", "search_stays", "compare_funds", "prepare_visit"]:
    product_tool(tool)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    a = p.parse_args()
    app = mcp.streamable_http_app(stateless_http=True, host="127.0.0.1")
    uvicorn_ready.serve(app, a.port)


if __name__ == "__main__":
    main()
