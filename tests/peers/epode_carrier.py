#!/usr/bin/env python3
"""An MCP server that carries Epode itself, for the sidecar's "never count a call twice"
tests: the official `mcp==2.3.0` SDK (`MCPServer`, both eras on http://127.0.0.1:PORT/mcp),
one product tool, `lookup {q}` -> structured {"found": q}.

  --carries telemetry   advertise capabilities.extensions["ai.epode/agent-feedback"] through
                        the SDK's own extension mechanism, as Epode's Python SDK
                        (`agent_feedback.mcp.MCPInstrumentation`) does. With --sdk SRC it IS that
                        SDK, imported from SRC (`sdk/python/src` of
                        open-software-network/os-agent-feedback; it is on no registry), and it
                        records one telemetry event per call to --epode URL with --key KEY.
  --carries binding     also list Epode's `report_product_feedback` tool and return
                        `_agentFeedback` in lookup's structuredContent, as Epode's Node binding
                        decorates a tool without an outputSchema (no event is sent).

Readiness: `READY <port>` on stdout (tests/peers/uvicorn_ready.py).
"""

from __future__ import annotations

import argparse
import sys

import mcp.types as types
from mcp.server import MCPServer
from mcp.server.extension import Extension

import uvicorn_ready

# What Epode's Node binding puts in a result (the fields a reader checks; no real handle).
NODE_DECORATION = {"v": 1, "mode": "never_ask", "state": "feedback_ready", "reportTool": "report_product_feedback"}


class Advertised(Extension):
    """Advertises Epode's binding and does nothing else (what the sidecar reads of the SDK)."""

    identifier = "ai.epode/agent-feedback"


def build(carries: str, sdk: str | None, epode: str | None, key: str | None) -> MCPServer:
    instrument = None
    if carries == "telemetry" and sdk:
        sys.path.insert(0, sdk)
        from agent_feedback import AgentFeedback, AgentFeedbackOptions
        from agent_feedback.mcp import MCPInstrumentation

        feedback = AgentFeedback(AgentFeedbackOptions(api_key=key, endpoint=epode, flush_interval=0.1))
        extension = MCPInstrumentation(feedback)
        instrument = extension.instrument_tool
    elif carries == "telemetry":
        extension = Advertised()
    else:
        extension = None
    server = MCPServer("epode-carrier", version="0.0.1", extensions=[extension] if extension else None)

    def lookup(q: str) -> types.CallToolResult:
        """Looks q up."""
        found = {"found": q}
        if carries == "binding":
            found["_agentFeedback"] = NODE_DECORATION
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=f"found {q}")], structured_content=found
        )

    server.tool()(instrument(lookup) if instrument else lookup)
    if carries == "binding":

        @server.tool()
        def report_product_feedback(feedbackHandle: str, summary: str) -> str:  # noqa: N803
            """Epode's report tool, as the Node binding registers it."""
            return "report accepted"

    return server


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True, help="port on 127.0.0.1 (0 = pick a free one)")
    p.add_argument("--carries", choices=["telemetry", "binding"], required=True)
    p.add_argument("--sdk", metavar="SRC", help="with --carries telemetry: Epode's own Python SDK, from SRC")
    p.add_argument("--epode", metavar="URL", help="with --sdk: Epode's URL")
    p.add_argument("--key", metavar="KEY", help="with --sdk: the product key")
    args = p.parse_args()
    server = build(args.carries, args.sdk, args.epode, args.key)
    app = server.streamable_http_app(stateless_http=True, json_response=False, host="127.0.0.1")
    uvicorn_ready.serve(app, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
