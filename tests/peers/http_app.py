#!/usr/bin/env python3
"""A plain FastAPI product for the sidecar's HTTP-surface tests (tests/it/http_surface.rs).

No Epode code at all: the sidecar in front of it instruments its non-MCP routes. The only
thing the app does for Epode is the `Epode-Identity` response header, the verified caller
(from a simplified product auth: `Authorization: Bearer user-<ref>`) as a compact JSON object
`{"accountRef": ref, "userRef": "user." + ref, "customerRef": ref}`; `Bearer anon-<ref>` gives
`{"anonymousRef": "anon." + ref}` (a caller without a customerRef). The sidecar must strip the
header in every mode and keep customerRef only in ask_once.

Routes (GET unless said):
  /search           JSON object, formatted unusually (byte-for-byte splice check)
  /list             JSON array
  /docs/test        HTML with a <head>
  /page-no-head     HTML without <head>
  /tricky           HTML whose script, comment and text contain `</script>`, `</head>`, `<!--`
  /big              10 MB JSON object with Content-Length
  /big-chunked      the same 10 MB, chunked (no Content-Length)
  /stream           endless SSE, one event every 50 ms
  /stream-json      endless chunked application/json, 64 KiB chunks every 10 ms
  /cached           JSON object, Cache-Control: public, max-age=60
  /redirect         302 to /search
  /missing          404 JSON
  /created          201 JSON
  /gz               gzip Content-Encoding JSON
  /binary           application/octet-stream
  /static/app.js    JavaScript
  /health           the app's own health (JSON {"status": "app-ok"})
  /owns             JSON object that already carries `_agentFeedback`
  /marked           HTML that already has <script id="agent-feedback">
  /weird/{name}     JSON object on any one-segment path (invalid operations like `a%20b`)
  /internal/{name}  JSON object (excluded by the tests' EPODE_SIDECAR_HTTP_EXCLUDE)
  /echo             any method: {"method", "body", "query", "headers": {selected}}
  /bad-identity     JSON object with a malformed Epode-Identity header
  --mcp: also the Python MCP peer (tests/peers/py_server.py's tools) at /mcp.

Usage: $D/py/bin/python tests/peers/http_app.py --port N [--mcp]
Readiness: one line `READY <port>` on stdout once uvicorn serves (port 0 picks one).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import os
import sys

import uvicorn_ready
from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse

SEARCH = b'{"stack": "manual-http",  "answer":"manual-http-result", "n": 1.50, "u": "\\u00e9", "nested": {"a": [1, 2 ,3]}}'
LIST = b'[{"id": 1}, {"id": 2}]'
DOCS = (
    b"<!doctype html><html><head><title>Manual docs</title></head>"
    b"<body>manual-http-docs-result</body></html>"
)
NO_HEAD = b"<html><body><p>no head here</p></body></html>"
TRICKY = (
    b"<!doctype html><html><head><title>t</title>"
    b'<script>var a = "<!--"; var b = "<\\/script>"; var c = "</head>";</script>'
    b"<style>/* </head> </style-ish */ p { color: red }</style>"
    b"<!-- a comment with </head> and <script> inside -->"
    b'<meta name="x" content="</head>">'
    b"</head><body><p>Close scripts with &lt;/script&gt;; a stray </script> here.</p>"
    b"<!-- trailing <!-- comment --></body></html>"
)
MARKED = (
    b'<html><head><script type="application/json" id="agent-feedback">{"mine":true}</script>'
    b"</head><body>already</body></html>"
)
OWNS = b'{"result": 1, "_agentFeedback": {"mine": true}}'
BIG_SIZE = 10 * 1024 * 1024


def big_body() -> bytes:
    # `{"data":"xxxx…"}` of exactly BIG_SIZE bytes, with some variety so a hash means something.
    filler = (b"0123456789abcdef" * ((BIG_SIZE // 16) + 1))[: BIG_SIZE - len(b'{"data":""}')]
    return b'{"data":"' + filler + b'"}'


BIG = big_body()


def identity_header(request: Request) -> dict[str, str]:
    auth = request.headers.get("authorization", "")
    token = auth[len("Bearer ") :] if auth.startswith("Bearer ") else ""
    if token.startswith("user-") and len(token) > 5:
        ref = token[5:]
        value = {"accountRef": ref, "userRef": "user." + ref, "customerRef": ref}
    elif token.startswith("anon-") and len(token) > 5:
        value = {"anonymousRef": "anon." + token[5:]}
    else:
        return {}
    return {"Epode-Identity": json.dumps(value, separators=(",", ":"))}


def raw(request: Request, body: bytes, media: str, status: int = 200, **headers: str) -> Response:
    h = identity_header(request)
    h.update({k.replace("_", "-"): v for k, v in headers.items()})
    return Response(content=body, status_code=status, media_type=media, headers=h)


class IdentityOnMcp:
    """The MCP app, whose responses also carry `Epode-Identity` (the sidecar strips it there too)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        token = headers.get("authorization", "")
        extra = []
        if token.startswith("Bearer user-"):
            ref = token[len("Bearer user-") :]
            extra = [(b"epode-identity", json.dumps({"accountRef": ref}, separators=(",", ":")).encode())]

        async def send_with(message) -> None:
            if message["type"] == "http.response.start" and extra:
                message = {**message, "headers": list(message.get("headers", [])) + extra}
            await send(message)

        await self.app(scope, receive, send_with)


def build(with_mcp: bool) -> FastAPI:
    mcp_app = None
    lifespan = None
    if with_mcp:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import py_server  # the MCP peer's tools, served at /mcp

        mcp_app = IdentityOnMcp(
            py_server.mcp.streamable_http_app(stateless_http=True, json_response=True, host="127.0.0.1")
        )

        @contextlib.asynccontextmanager
        async def lifespan(_app):
            async with mcp_app.app.router.lifespan_context(mcp_app.app):
                yield

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    # Every read route answers HEAD too (FastAPI's `get` alone would say 405).
    def get(path: str):
        return app.api_route(path, methods=["GET", "HEAD"])

    J = "application/json"
    H = "text/html; charset=utf-8"

    # Validators and a CDN header the sidecar must drop once it changes the body (and keep
    # when it does not: /list's body is never changed).
    @get("/search")
    async def search(request: Request):
        return raw(request, SEARCH, J, ETag='"search-v1"', Surrogate_Control="no-store")

    @get("/list")
    async def list_(request: Request):
        return raw(request, LIST, J, ETag='"list-v1"')

    @get("/docs/test")
    async def docs(request: Request):
        return raw(request, DOCS, H)

    @get("/page-no-head")
    async def no_head(request: Request):
        return raw(request, NO_HEAD, H)

    @get("/tricky")
    async def tricky(request: Request):
        return raw(request, TRICKY, H)

    @get("/big")
    async def big(request: Request):
        return raw(request, BIG, J)

    @get("/big-chunked")
    async def big_chunked(request: Request):
        async def chunks():
            for i in range(0, len(BIG), 256 * 1024):
                yield BIG[i : i + 256 * 1024]

        return StreamingResponse(chunks(), media_type=J, headers=identity_header(request))

    @get("/stream")
    async def stream(request: Request):
        async def events():
            n = 0
            while True:
                yield f"data: tick {n}\n\n".encode()
                n += 1
                await asyncio.sleep(0.05)

        return StreamingResponse(events(), media_type="text/event-stream", headers=identity_header(request))

    @get("/stream-json")
    async def stream_json(request: Request):
        async def chunks():
            yield b'{"items": ['
            chunk = b'"' + b"y" * (64 * 1024) + b'",'
            while True:
                yield chunk
                await asyncio.sleep(0.01)

        return StreamingResponse(chunks(), media_type=J, headers=identity_header(request))

    @get("/cached")
    async def cached(request: Request):
        return raw(request, b'{"cached": true}', J, Cache_Control="public, max-age=60")

    @get("/redirect")
    async def redirect(request: Request):
        return raw(request, b"", "text/plain", 302, Location="/search")

    @get("/missing")
    async def missing(request: Request):
        return raw(request, b'{"error": "missing"}', J, 404)

    @get("/created")
    async def created(request: Request):
        return raw(request, b'{"created": true}', J, 201)

    @get("/gz")
    async def gz(request: Request):
        return raw(request, gzip.compress(b'{"zipped": true}'), J, Content_Encoding="gzip")

    @get("/binary")
    async def binary(request: Request):
        return raw(request, bytes(range(256)), "application/octet-stream")

    @get("/static/app.js")
    async def app_js(request: Request):
        return raw(request, b'{"looks": "like json but is a static asset"}', J)

    @get("/health")
    async def health(request: Request):
        return raw(request, b'{"status": "app-ok"}', J)

    @get("/owns")
    async def owns(request: Request):
        return raw(request, OWNS, J)

    @get("/marked")
    async def marked(request: Request):
        return raw(request, MARKED, H)

    @get("/weird/{name}")
    async def weird(name: str, request: Request):
        return raw(request, json.dumps({"weird": name}).encode(), J)

    # Any depth: a path whose operation is longer than Epode accepts.
    @get("/deep/{rest:path}")
    async def deep(rest: str, request: Request):
        return raw(request, b'{"deep": true}', J)

    @get("/internal/{name}")
    async def internal(name: str, request: Request):
        return raw(request, json.dumps({"internal": name}).encode(), J)

    @app.api_route("/echo", methods=["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"])
    async def echo(request: Request):
        body = await request.body()
        wanted = ["content-type", "x-custom", "authorization", "epode-identity", "x-customer-ref", "accept", "traceparent", "tracestate"]
        out = {
            "method": request.method,
            "body": body.decode("utf-8", "replace"),
            "query": request.url.query,
            "headers": {k: request.headers[k] for k in wanted if k in request.headers},
        }
        return raw(request, json.dumps(out).encode(), J, 200, X_Echo="yes")

    @get("/bad-identity")
    async def bad_identity(request: Request):
        return Response(
            content=b'{"bad": "identity"}',
            media_type=J,
            headers={"Epode-Identity": '{"accountRef": "has space", broken'},
        )

    if mcp_app is not None:
        app.mount("/", mcp_app)
    return app



def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True, help="port on 127.0.0.1 (0 = pick a free one)")
    p.add_argument("--mcp", action="store_true", help="also serve the Python MCP peer at /mcp")
    args = p.parse_args()
    app = build(args.mcp)
    uvicorn_ready.serve(app, args.port)


if __name__ == "__main__":
    sys.exit(main())
