"""An example product MCP server, written with the official Python SDK (mcp==2.3.0) and knowing
nothing of the sidecar. Over stdio (the SDK's default transport) epode-sidecar runs it as its
child; over HTTP it listens on 127.0.0.1:8000 with the sidecar in front.

    epode-sidecar --dev -- python server.py --stdio
    python server.py [--port 8000]

Over HTTP it also serves two plain routes beside MCP, as most products do: a JSON API
(`GET /api/orders/A-1001`) and a help page (`GET /help`). With EPODE_SIDECAR_HTTP_SURFACE=on the
sidecar instruments those too (docs/http-surface.md); each says who the caller is with the
`Epode-Identity` response header (here a fixed demo account).
"""

import argparse
import json

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse

from mcp.server.mcpserver import Context, MCPServer

mcp = MCPServer(
    name="example-orders",
    version="1.0.0",
    instructions="Look up orders and search the help centre of the Example shop.",
)

ORDERS = {
    "A-1001": {"status": "shipped", "items": 2, "total_cents": 4599},
    "A-1002": {"status": "processing", "items": 1, "total_cents": 1299},
}


@mcp.tool(structured_output=False)
def search_help(query: str) -> dict:
    """Search the help centre; returns matching article titles."""
    articles = ["Returns and refunds", "Shipping times", "Changing an order"]
    hits = [a for a in articles if any(w.lower() in a.lower() for w in query.split())]
    return {"query": query, "articles": hits}


class Order(BaseModel):
    order_id: str
    status: str
    items: int
    total_cents: int


@mcp.tool()
def get_order(order_id: str) -> Order:
    """Fetch one order by id (try A-1001)."""
    found = ORDERS.get(order_id)
    if found is None:
        raise ValueError(f"no order {order_id}")
    return Order(order_id=order_id, **found)


@mcp.tool()
async def export_orders(ctx: Context, batches: int = 3) -> str:
    """Export all orders, reporting progress per batch."""
    import anyio

    for i in range(1, batches + 1):
        await anyio.sleep(0.2)
        await ctx.report_progress(i, batches)
    return f"exported {len(ORDERS)} orders in {batches} batches"


# Who the caller is, for the sidecar only (it removes the header before the client sees it). A
# real app derives it from its own authentication.
IDENTITY = {"Epode-Identity": json.dumps({"accountRef": "acct.demo"}, separators=(",", ":"))}


@mcp.custom_route("/api/orders/{order_id}", methods=["GET"])
async def order_api(request: Request) -> JSONResponse:
    order_id = request.path_params["order_id"]
    found = ORDERS.get(order_id)
    if found is None:
        return JSONResponse({"error": f"no order {order_id}"}, status_code=404)
    return JSONResponse({"order_id": order_id, **found}, headers=IDENTITY)


@mcp.custom_route("/help", methods=["GET"])
async def help_page(request: Request) -> HTMLResponse:
    page = (
        "<!doctype html><html><head><title>Example shop help</title></head><body>"
        "<h1>Help</h1><p>Orders ship in two days. Returns within 30 days.</p></body></html>"
    )
    return HTMLResponse(page, headers=IDENTITY)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--stdio", action="store_true", help="speak MCP over stdin/stdout")
    parser.add_argument("--port", type=int, default=8000, help="the HTTP port (without --stdio)")
    args = parser.parse_args()
    if args.stdio:
        mcp.run("stdio")
    else:
        mcp.run("streamable-http", host="127.0.0.1", port=args.port, stateless_http=True)
