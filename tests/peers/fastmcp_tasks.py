#!/usr/bin/env python3
"""FastMCP 4.1.6 upstream peer with the 2026-07-28 extensions a product may carry: tasks
(`io.modelcontextprotocol/tasks`, SEP-2663) and MCP Apps (`io.modelcontextprotocol/ui`).

FastMCP's own extension API (`fastmcp.server.extensions.ServerExtension`) carries both; the
tasks extension here is written on it in a few lines, in memory (the `fastmcp-tasks` package
needs Redis and another fastmcp), and follows the extension's text:

  long_job {fail=false, ms=300} -> to a client that declares the tasks extension in the
                    request's clientCapabilities: a CreateTaskResult (`resultType: "task"`,
                    taskId, status "working", ttlMs 60000, pollIntervalMs 100) at once; after
                    `ms` the task is "completed" with the tool result {text "job done"} (or
                    "failed" with a JSON-RPC error when fail=true). To any other client: the
                    result itself, synchronously ("job done").
  tasks/get {taskId}     -> the task (`resultType: "complete"` plus the Task, with `result` or
                    `error` once terminal); an unknown id is -32602.
  tasks/update {taskId, inputResponses} -> {} (nothing is asked here).
  tasks/cancel {taskId}  -> {}; a working task becomes "cancelled".
  clock             -> a tool bound to the UI resource ui://clock/app.html (`_meta.ui`), as MCP
                    Apps binds one; resources/read of it answers the HTML with the
                    `text/html;profile=mcp-app` MIME type.
  plain             -> "plain answer"

Both eras on one URL (FastMCP on mcp 2.3.0); the extensions answer 2026-07-28 requests.

Usage: $PY tests/peers/fastmcp_tasks.py --port N    (prints `READY <port>` once serving)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid
from datetime import datetime, timezone
from typing import Any

os.environ.setdefault("FASTMCP_SHOW_SERVER_BANNER", "false")
os.environ.setdefault("FASTMCP_CHECK_FOR_UPDATES", "off")

import mcp_types  # noqa: E402
import uvicorn_ready  # noqa: E402
from fastmcp import FastMCP  # noqa: E402
from fastmcp.server.extensions import MethodBinding, ServerExtension  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402
from pydantic import BaseModel, ConfigDict  # noqa: E402

TASKS = "io.modelcontextprotocol/tasks"
UI = "io.modelcontextprotocol/ui"
APP_MIME = "text/html;profile=mcp-app"
CLOCK_HTML = "<!doctype html><html><body><p id=t></p><script>t.textContent=Date()</script></body></html>"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


class TaskIdParams(mcp_types.RequestParams):
    model_config = ConfigDict(extra="allow")
    taskId: str


class UpdateParams(TaskIdParams):
    inputResponses: dict[str, Any] = {}


class Wire(BaseModel):
    """A result written as given (the extension's shapes are not the SDK's)."""

    model_config = ConfigDict(extra="allow")


class Tasks(ServerExtension):
    identifier = TASKS

    def __init__(self) -> None:
        self.tasks: dict[str, dict[str, Any]] = {}

    def methods(self):
        return (
            MethodBinding("tasks/get", TaskIdParams, self.get),
            MethodBinding("tasks/update", UpdateParams, self.update),
            MethodBinding("tasks/cancel", TaskIdParams, self.cancel),
        )

    async def intercept_tool_call(self, params, context, call_next):
        if params.name != "long_job" or context.client_extension_settings(TASKS) is None:
            return await call_next()
        args = params.arguments or {}
        task_id = str(uuid.uuid4())
        now = _now()
        task = {
            "taskId": task_id,
            "status": "working",
            "createdAt": now,
            "lastUpdatedAt": now,
            "ttlMs": 60000,
            "pollIntervalMs": 100,
        }
        self.tasks[task_id] = task
        asyncio.get_running_loop().create_task(self._run(task, bool(args.get("fail")), int(args.get("ms", 300))))
        return Wire(resultType="task", **task)

    async def _run(self, task: dict[str, Any], fail: bool, ms: int) -> None:
        await asyncio.sleep(ms / 1000)
        if task["status"] != "working":
            return
        task["lastUpdatedAt"] = _now()
        if fail:
            task["status"] = "failed"
            task["error"] = {"code": -32603, "message": "the job failed"}
        else:
            task["status"] = "completed"
            task["result"] = {"content": [{"type": "text", "text": "job done"}], "isError": False}

    def _task(self, params) -> dict[str, Any]:
        task = self.tasks.get(params.taskId)
        if task is None:
            raise MCPError(code=-32602, message=f"no task {params.taskId}")
        return task

    async def get(self, ctx, params):
        return Wire(resultType="complete", **self._task(params))

    async def update(self, ctx, params):
        self._task(params)
        return Wire(resultType="complete")

    async def cancel(self, ctx, params):
        task = self._task(params)
        if task["status"] == "working":
            task["status"] = "cancelled"
            task["lastUpdatedAt"] = _now()
        return Wire(resultType="complete")


class Apps(ServerExtension):
    identifier = UI


mcp = FastMCP(name="fastmcp-extensions-peer", version="0.0.1")
mcp.add_extension(Tasks())
mcp.add_extension(Apps())


@mcp.tool
async def long_job(fail: bool = False, ms: int = 300) -> str:
    """A job that runs as a task for clients that take tasks."""
    await asyncio.sleep(ms / 1000)
    if fail:
        raise ValueError("the job failed")
    return "job done"


@mcp.tool(meta={"ui": {"resourceUri": "ui://clock/app.html", "visibility": ["model", "app"]}})
def clock() -> str:
    """The time, with a UI (MCP Apps)."""
    return _now()


@mcp.resource("ui://clock/app.html", mime_type=APP_MIME, meta={"ui": {"prefersBorder": True}})
def clock_app() -> str:
    return CLOCK_HTML


@mcp.tool
def plain() -> str:
    """No question: a plain text answer."""
    return "plain answer"



def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args()
    app = mcp.http_app(path="/mcp", stateless_http=False, json_response=False)
    uvicorn_ready.serve(app, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
