#!/usr/bin/env python3
"""Customer context against the real Epode backend: a wire-level port of the journeys of
Epode's own `tests/customer-context-mcp-e2e.mjs` (open-software-network/os-agent-feedback
37c2131) through the sidecar, in front of a plain Python MCP server with no Epode code
(`tests/peers/shop_server.py`), with the official Python client as a 2026 client (`auto`)
and as a 2025 client (`legacy`). What the backend stored is then checked with its own reader
(`setup_matrix_db read-enrichment`), as the original test checks it.

An acceptance run for a session, not a CI test: it needs the backend built and running on
PostgreSQL with a seeded product key (docs/customer-context.md, "Against the real backend").

  $D/py/bin/python scripts/real-epode/customer-context.py \\
      --backend http://127.0.0.1:3186 --api-key af_live_… \\
      --reader '/work/epode-real/read.sh WORKSPACE PRODUCT' [--sidecar target/debug/epode-sidecar]

Identity reaches the sidecar as a trusted gateway's headers (the server has no Epode code to
put it in `_meta`): `X-Account-Ref`, `X-User-Ref`, `X-Session-Ref`
(`EPODE_SIDECAR_IDENTITY_HEADERS`). Prints each check and exits 1 if any failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

ROOT = Path(__file__).resolve().parents[2]
PEERS = Path(os.environ.get("EPODE_PEERS_DIR", ROOT / ".peers"))
failures: list[str] = []


def check(ok: bool, what: str, detail: object = "") -> None:
    print(("ok   " if ok else "FAIL ") + what + ("" if ok else f": {detail}"), flush=True)
    if not ok:
        failures.append(what)


def ready_line(proc: subprocess.Popen, needle: str, within: float = 30) -> str:
    deadline = time.time() + within
    while time.time() < deadline:
        line = proc.stdout.readline()
        if needle in line:
            return line.strip()
        if not line and proc.poll() is not None:
            break
    raise SystemExit(f"{proc.args}: no {needle!r} within {within} s")


def free_port() -> int:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_http(url: str, within: float = 30) -> None:
    deadline = time.time() + within
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except Exception:  # noqa: BLE001 - polling until it answers
            time.sleep(0.1)
    raise SystemExit(f"{url} did not answer within {within} s")


def item(key: str, kind: str, value: str, prov: str = "agent_reports_user_statement") -> dict:
    return {"key": key, "type": kind, "value": value, "summary": f"{key} is {value}",
            "provenance": prov, "confidence": 1, "remember": True}


class Journeys:
    def __init__(self, url: str, mode: str, backend: str, key: str) -> None:
        self.url, self.mode, self.backend, self.key = url, mode, backend, key

    async def call(self, tool: str, args: dict, who: dict | None = None, session: str | None = None):
        headers = {}
        if who:
            headers["X-Account-Ref"] = who["accountRef"]
            headers["X-User-Ref"] = who["userRef"]
        if session:
            headers["X-Session-Ref"] = session
        async with Client(
            streamable_http_client(self.url, http_client=create_mcp_http_client(headers=headers)),
            mode=self.mode,
        ) as client:
            r = await client.call_tool(tool, args)
            return {"isError": bool(r.is_error), "structured": r.structured_content,
                    "content": [c.model_dump(by_alias=True) for c in r.content]}

    async def search(self, tool: str, who: dict, session: str) -> dict:
        r = await self.call(tool, {"query": "bounded test query"}, who, session)
        s = r["structured"] or {}
        check(s.get("operation") == tool, f"[{self.mode}] {tool} keeps the product's result", s)
        c = (s.get("_epode") or {}).get("customerContext") or {}
        check(bool(c), f"[{self.mode}] {tool} carries _epode.customerContext", r)
        return c

    def customer_context(self, who: dict, interaction: str | None = None) -> dict:
        body = {**who, "purpose": "product_personalization"}
        if interaction:
            body["interactionId"] = interaction
        req = urllib.request.Request(
            f"{self.backend}/api/v2/customer-context", data=json.dumps(body).encode(),
            headers={"authorization": f"Bearer {self.key}", "content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    async def run(self, n: str) -> dict:
        ids: dict = {}
        # 1. Answered and remembered.
        shopper = {"accountRef": f"shop_household_{n}", "userRef": f"shopper_{n}"}
        c = await self.search("search_catalog", shopper, f"shop_journey_1_{n}")
        check(c.get("state") == "answer_ready" and "question" not in c and c.get("requestHandle"),
              f"[{self.mode}] a new request is answer_ready with a handle", c)
        r = await self.call("share_customer_context", {
            "requestHandle": c.get("requestHandle"), "status": "answered",
            "items": [item("shopping.priority", "preference", "sustainability"),
                      item("shopping.budget_band", "constraint", "50_150", "agent_reports_current_task")]})
        signals = (r["structured"] or {}).get("signals") or []
        check(r["isError"] is False and len(signals) == 2, f"[{self.mode}] the answer is accepted", r)
        got = self.customer_context(shopper)
        keys = sorted(i.get("key") for i in got.get("items", []))
        # (The e2e also reads an `available` flag the backend at 37c2131 no longer answers.)
        check(keys == ["shopping.budget_band", "shopping.priority"],
              f"[{self.mode}] the remembered context is available to the product", got)
        # 2. A second visit.
        c2 = await self.search("search_catalog", shopper, f"shop_journey_2_{n}")
        check(c2.get("state") == "answer_ready", f"[{self.mode}] a second visit is answer_ready", c2)
        # 3. Session only.
        traveler = {"accountRef": f"travel_loyalty_{n}", "userRef": f"traveler_{n}"}
        c3 = await self.search("search_stays", traveler, f"paris_planning_{n}")
        it = {**item("shopping.budget_band", "constraint", "150_500"), "remember": False}
        r = await self.call("share_customer_context",
                            {"requestHandle": c3.get("requestHandle"), "status": "answered", "items": [it]})
        signals = (r["structured"] or {}).get("signals") or [{}]
        check(signals[0].get("remembered") is False, f"[{self.mode}] a session-only item is not remembered", r)
        check(self.customer_context(traveler).get("items") == [],
              f"[{self.mode}] nothing session-only is remembered for the customer")
        scoped = self.customer_context(traveler, c3.get("interactionId"))
        check([i.get("key") for i in scoped.get("items", [])] == ["shopping.budget_band"],
              f"[{self.mode}] the session-only item is there for its interaction", scoped)
        ids["session"] = c3.get("interactionId")
        c3b = await self.search("search_stays", traveler, f"tokyo_planning_{n}")
        check(c3b.get("state") == "answer_ready", f"[{self.mode}] the next trip is answer_ready", c3b)
        # 4. Declined is honoured.
        investor = {"accountRef": f"finance_account_{n}", "userRef": f"investor_{n}"}
        c4 = await self.search("compare_funds", investor, f"research_1_{n}")
        r = await self.call("record_customer_context_consent",
                            {"requestHandle": c4.get("requestHandle"), "decision": "declined"})
        check((r["structured"] or {}).get("state") == "declined", f"[{self.mode}] the decline is recorded", r)
        r = await self.call("share_customer_context", {
            "requestHandle": c4.get("requestHandle"), "status": "answered",
            "items": [item("content.topic_depth", "preference", "practical")]})
        s = r["structured"] or {}
        check(s.get("state") == "declined" and s.get("accepted") is False,
              f"[{self.mode}] a declined request shares nothing", r)
        c4b = await self.search("compare_funds", investor, f"research_2_{n}")
        check(c4b.get("state") == "declined", f"[{self.mode}] the customer's decline holds on the next call", c4b)
        check(self.customer_context(investor).get("items") == [], f"[{self.mode}] nothing stored for the decliner")
        # No relevant context: answered with nothing; asked again, it was handled already.
        reader = {"accountRef": f"care_patient_{n}", "userRef": f"patient_{n}"}
        c6 = await self.search("prepare_visit", reader, f"visit_1_{n}")
        r = await self.call("share_customer_context", {
            "requestHandle": c6.get("requestHandle"), "status": "no_relevant_context", "items": []})
        check(r["isError"] is False and (r["structured"] or {}).get("accepted") is True,
              f"[{self.mode}] no relevant context is accepted", r)
        r = await self.call("share_customer_context", {
            "requestHandle": c6.get("requestHandle"), "status": "no_relevant_context", "items": []})
        s = r["structured"] or {}
        check(s.get("alreadyCompleted") is True and s.get("state") == "no_relevant_context",
              f"[{self.mode}] asked again, it was handled already", r)
        check(self.customer_context(reader).get("items") == [], f"[{self.mode}] nothing stored for no relevant context")
        # 5. An unknown or sensitive key.
        other = {"accountRef": f"finance_account_x{n}", "userRef": f"investor_x{n}"}
        c5 = await self.search("compare_funds", other, f"research_sensitive_{n}")
        r = await self.call("share_customer_context", {
            "requestHandle": c5.get("requestHandle"), "status": "answered",
            "items": [item("creditworthiness", "constraint", "excellent")]})
        check(r["isError"] is True and (r["structured"] or {}).get("error") == "Unknown customer context catalog key",
              f"[{self.mode}] an unknown key is refused by Epode, and the agent told", r)
        check(self.customer_context(other).get("items") == [], f"[{self.mode}] nothing stored for the unknown key")
        return ids


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="http://127.0.0.1:3186")
    p.add_argument("--api-key", required=True)
    p.add_argument("--reader", required=True, help="a command printing read-enrichment's JSON")
    p.add_argument("--sidecar", default=str(ROOT / "target/debug/epode-sidecar"))
    a = p.parse_args()

    shop_port, sc_port, admin = free_port(), free_port(), free_port()
    shop = subprocess.Popen([str(PEERS / "py/bin/python"), str(ROOT / "tests/peers/shop_server.py"),
                             "--port", str(shop_port)], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT / "tests/peers")
    ready_line(shop, "READY")
    env = {"PATH": os.environ.get("PATH", ""),
           "EPODE_SIDECAR_LISTEN": f"127.0.0.1:{sc_port}",
           "EPODE_SIDECAR_ADMIN_LISTEN": f"127.0.0.1:{admin}",
           "EPODE_SIDECAR_UPSTREAM": f"http://127.0.0.1:{shop_port}/mcp",
           "EPODE_API_KEY": a.api_key, "EPODE_API_URL": a.backend,
           "AGENT_FEEDBACK_MODE": "never_ask",
           "EPODE_SIDECAR_CUSTOMER_CONTEXT": "on",
           "EPODE_SIDECAR_CUSTOMER_CONTEXT_TOOLS": "search_*,compare_*,explain_*,prepare_*",
           "EPODE_SIDECAR_CUSTOMER_CONTEXT_BUDGET": "2s",
           "EPODE_SIDECAR_IDENTITY_HEADERS":
               "accountRef=X-Account-Ref,userRef=X-User-Ref,sessionRef=X-Session-Ref"}
    sidecar = subprocess.Popen([a.sidecar], env=env, stdout=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{admin}/readyz")
        url = f"http://127.0.0.1:{sc_port}/mcp"
        run_id = str(int(time.time()))
        ids = {}
        for mode in ["auto", "legacy"]:
            ids[mode] = asyncio.run(Journeys(url, mode, a.backend, a.api_key).run(f"{mode}_{run_id}"))
        out = subprocess.run(shlex.split(a.reader) + ["read-enrichment"], capture_output=True, text=True)
        lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
        stored = json.loads(lines[-1]) if lines else {}
        signals, requests = stored.get("signals", []), stored.get("requests", [])
        interactions = stored.get("interactions", [])
        check(any(s.get("key") == "shopping.priority" and s.get("value") == "sustainability"
                  and s.get("provenance") == "agent_reports_user_statement" for s in signals),
              "stored: the remembered priority, as the user stated it", signals)
        for mode in ids:
            sid = ids[mode]["session"]
            check(any(s.get("key") == "shopping.budget_band" and s.get("interactionId") == sid
                      and s.get("expiresAt") for s in signals),
                  f"stored: [{mode}] the session-only budget with its interaction and an expiry", signals)
        check(not any(s.get("key") == "creditworthiness" for s in signals), "stored: no unknown key")
        check(any(r.get("state") == "declined" for r in requests), "stored: a declined request")
        check(any(r.get("state") == "no_relevant_context" for r in requests),
              "stored: a request answered with no relevant context")
        check(interactions and all(i.get("surface") == "mcp" for i in interactions),
              "stored: every interaction is an MCP one", interactions[:3])
        check(all(i.get("classification") == "confirmed" for i in interactions),
              "stored: every interaction confirmed (by its enrichment request)", interactions[:3])
    finally:
        sidecar.terminate()
        shop.terminate()
    print(f"{'FAILED' if failures else 'PASSED'}: {len(failures)} check(s) failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
