"""The official Python MCP client (`mcp` 2.3.0) through the whole OAuth flow against an MCP
server that requires authorization (the sidecar with EPODE_SIDECAR_AUTH on), as an
application runs it: `mcp.client.auth.OAuthClientProvider` (an `httpx2.Auth`) with in-memory
token storage, on the `httpx2.AsyncClient` the Streamable HTTP transport uses. Nothing here
makes or asks for a token: the SDK does, from the server's 401.

  $D/py/bin/python tests/peers/py_oauth.py URL legacy|auto|pin [--account A] [--scope S]
      [--tool NAME [--args JSON]]...

The SDK runs the flow inline, inside the request that got the 401: it reads the Protected
Resource Metadata (RFC 9728) and the AS metadata (RFC 8414), registers (RFC 7591), builds the
authorization URL (PKCE S256, `state`, `resource` per RFC 8707) and calls the redirect
handler, then the callback handler for the code, exchanges it (with `resource`) and resends
the request. Here the redirect handler drives the AS's login and consent over plain HTTP, as
tests/peers/as_login.mjs does (follow the authorization URL, POST {"account": A} as JSON to
each /interaction/<uid>, until the redirect to the client's redirect_uri), and the callback
handler returns that redirect's code, state and iss. A 403 insufficient_scope makes the SDK
re-authorize inline the same way (SEP-2350: the union of the scopes it had and the
challenge's). Then tools/list and each --tool in turn (default: whoami).

--scope S is the client metadata's `scope` (the SDK replaces it with the scope it selects).
Modes: legacy = mode="legacy" (the initialize handshake, 2025-11-25), auto = mode="auto"
(server/discover, falling back to initialize), pin = mode="2026-07-28".

Prints ONE JSON line and exits 0:
  {"protocolVersion","tools":[names, sorted],"calls":[{"name","result"}],
   "unauthorized":N,"forbidden":N,             # 401s / 403s the MCP endpoint answered
   "authorizations":[{"url","params":{...query},"redirect"}],
   "tokenRequests":[{"grant_type","resource","scope"}],
   "registrations":N,"client_id",
   "tokens":{"scope","token_type","expires_in","refresh":bool},
   "claims":{...the last access token's claims, unverified},
   "steps":["POST sidecar /mcp 401", ...]}
On error: {"error":{"name","message"},"steps":[...]} and exit 2. Run with the peers'
venv ($D/py/bin/python); it needs nothing beyond the `mcp` package.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
from typing import Any
from urllib.parse import parse_qsl, urljoin, urlparse

import httpx2

from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

MODES = {"legacy": "legacy", "auto": "auto", "pin": "2026-07-28"}
REDIRECT_URI = "http://127.0.0.1:1/callback"


class Trace:
    """What the client did: every HTTP request its httpx2 client sent (the MCP requests and,
    through the auth flow, discovery, registration and token requests)."""

    def __init__(self, mcp_url: str) -> None:
        self.mcp = urlparse(mcp_url)
        self.steps: list[str] = []
        self.unauthorized = 0
        self.forbidden = 0
        self.registrations = 0
        self.token_requests: list[dict[str, Any]] = []
        self.authorizations: list[dict[str, Any]] = []

    async def on_response(self, response: httpx2.Response) -> None:
        req = response.request
        url = urlparse(str(req.url))
        who = "sidecar" if url.netloc == self.mcp.netloc else "as"
        what = ""
        if who == "sidecar" and url.path == self.mcp.path and req.method == "POST":
            try:
                what = " " + json.loads(req.content).get("method", "response")
            except (ValueError, AttributeError, httpx2.RequestNotRead):
                pass
            if response.status_code == 401:
                self.unauthorized += 1
            if response.status_code == 403:
                self.forbidden += 1
        if req.method == "POST" and not (who == "sidecar" and url.path == self.mcp.path):
            try:
                form = dict(parse_qsl(req.content.decode()))
            except (UnicodeDecodeError, httpx2.RequestNotRead):
                form = {}
            if "grant_type" in form:
                self.token_requests.append({k: form.get(k) for k in ("grant_type", "resource", "scope")})
            elif b'"redirect_uris"' in req.content and response.status_code < 300:
                self.registrations += 1
        self.steps.append(f"{req.method} {who} {url.path}{what} {response.status_code}")


class MemoryStorage:
    """`mcp.client.auth.TokenStorage` in memory."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


async def approve(authorization_url: str, account: str) -> str:
    """as_login.mjs's approve(): follows the authorization URL, as a browser does, through
    whatever redirects it (an authorization facade's included) and the AS's login and consent
    interactions (logging in as `account`, granting what is asked) with a cookie jar of its
    own, and returns the URL of the client's redirect_uri it finally reaches, unfetched."""
    url = authorization_url
    post = False
    async with httpx2.AsyncClient(follow_redirects=False, timeout=10) as http:
        for _ in range(20):
            if post:
                res = await http.post(url, json={"account": account})
            else:
                res = await http.get(url)
            location = res.headers.get("location")
            if not (300 <= res.status_code < 400) or not location:
                raise RuntimeError(f"approve: {'POST' if post else 'GET'} {url} answered {res.status_code}: {res.text[:500]}")
            nxt = urljoin(url, location)
            parsed = urlparse(nxt)
            if nxt.startswith(REDIRECT_URI):
                return nxt
            post = parsed.path.startswith("/interaction/")
            url = nxt
    raise RuntimeError(f"approve: more than 20 redirects from {authorization_url}")


def claims_of(token: str | None) -> dict[str, Any] | None:
    parts = (token or "").split(".")
    if len(parts) != 3:
        return None
    return json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))


async def run(args: argparse.Namespace, calls: list[tuple[str, dict[str, Any]]], trace: Trace) -> dict[str, Any]:
    storage = MemoryStorage()
    pending: list[str] = []

    async def redirect_handler(authorization_url: str) -> None:
        redirect = await approve(authorization_url, args.account)
        query = dict(parse_qsl(urlparse(redirect).query))
        trace.steps.append(f"authorize as {args.account} -> {'code' if 'code' in query else 'no code'}")
        trace.authorizations.append(
            {"url": authorization_url, "params": dict(parse_qsl(urlparse(authorization_url).query)), "redirect": redirect}
        )
        pending.append(redirect)

    async def callback_handler() -> AuthorizationCodeResult:
        query = dict(parse_qsl(urlparse(pending.pop()).query))
        if "code" not in query:
            raise RuntimeError(f"the authorization ended without a code: {query}")
        return AuthorizationCodeResult(code=query["code"], state=query.get("state"), iss=query.get("iss"))

    metadata: dict[str, Any] = {
        "client_name": "epode-py-oauth",
        "redirect_uris": [REDIRECT_URI],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
    }
    if args.scope:
        metadata["scope"] = args.scope
    provider = OAuthClientProvider(
        server_url=args.url,
        client_metadata=OAuthClientMetadata.model_validate(metadata),
        storage=storage,
        redirect_handler=redirect_handler,
        callback_handler=callback_handler,
    )
    http = httpx2.AsyncClient(
        auth=provider,
        timeout=httpx2.Timeout(30, read=300),
        event_hooks={"response": [trace.on_response]},
    )
    async with http:
        async with Client(streamable_http_client(args.url, http_client=http), mode=MODES[args.mode]) as client:
            version = client.protocol_version
            tools = await client.list_tools()
            results = []
            for name, arguments in calls:
                result = await client.call_tool(name, arguments)
                results.append({"name": name, "result": result.model_dump(mode="json", by_alias=True, exclude_none=True)})
    tokens = storage.tokens
    return {
        "protocolVersion": version,
        "tools": sorted(t.name for t in tools.tools),
        "calls": results,
        "client_id": storage.client.client_id if storage.client else None,
        "tokens": {
            "scope": tokens.scope if tokens else None,
            "token_type": tokens.token_type if tokens else None,
            "expires_in": tokens.expires_in if tokens else None,
            "refresh": bool(tokens and tokens.refresh_token),
        },
        "claims": claims_of(tokens.access_token if tokens else None),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("url")
    p.add_argument("mode", choices=sorted(MODES))
    p.add_argument("--account", default="alice")
    p.add_argument("--scope")
    p.add_argument("--tool", action="append", default=[], help="a tool to call (repeatable)")
    p.add_argument("--args", action="append", default=[], help="the JSON arguments of the --tool before it")
    args = p.parse_args()
    # --args belongs to the --tool just before it: pair them by position in argv.
    calls: list[tuple[str, dict[str, Any]]] = []
    argv = sys.argv[1:]
    for i, a in enumerate(argv):
        if a == "--tool":
            calls.append((argv[i + 1], {}))
        elif a == "--args":
            if not calls:
                p.error("--args comes after a --tool")
            calls[-1] = (calls[-1][0], json.loads(argv[i + 1]))
    if not calls:
        calls = [("whoami", {})]
    trace = Trace(args.url)

    def counts() -> dict[str, Any]:
        return {
            "unauthorized": trace.unauthorized,
            "forbidden": trace.forbidden,
            "authorizations": trace.authorizations,
            "tokenRequests": trace.token_requests,
            "registrations": trace.registrations,
            "steps": trace.steps,
        }

    try:
        out = asyncio.run(asyncio.wait_for(run(args, calls, trace), 30))
    except BaseException as e:  # noqa: BLE001 - any failure is reported as JSON
        while isinstance(e, BaseExceptionGroup) and len(e.exceptions) == 1:
            e = e.exceptions[0]
        print(json.dumps({"error": {"name": type(e).__name__, "message": str(e)}, **counts()}), flush=True)
        return 2
    print(json.dumps({**out, **counts()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
