#!/usr/bin/env python3
"""Raw wire probe: how a server asks the client a question (elicitation/create,
sampling/createMessage, roots/list) and how the answer goes back.

Standard library only (http.client, threads, subprocess), so any python runs it.
It starts the peer itself and prints a transcript, one wire message a line:

  -> POST#n {...}              a POST body sent (n counts the POSTs)
  <- POST#n 200 ct=... sid=..  the POST's status line and headers
  <- POST#n sse {...}          an SSE `data:` event on that POST's response stream
  <- POST#n json {...}         a plain JSON body
  <- GET sse {...}             an event on the standalone GET stream
  -> stdin {...} / <- stdout {...}   the stdio transport

Usage:
  probe_questions.py --server fastmcp|py [--python PY] [--scenario NAME ...]
  probe_questions.py --list

`--python` defaults to this interpreter; give the peer's venv python
(PEER_FASTMCP_PYTHON / PEER_PYTHON from scripts/install-peers.sh).
The answers it gives: elicitation -> accept with every requested property filled
(integer 7, number 1.5, boolean true, string "Ada") unless the scenario says
decline/cancel; sampling -> assistant text "sampled hello"; roots -> one root
file:///tmp/probe-root.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import queue
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
V2025 = "2025-11-25"
V2026 = "2026-07-28"
ALL_CAPS = {"elicitation": {"form": {}}, "sampling": {}, "roots": {"listChanged": True}}


def log(line: str) -> None:
    print(line, flush=True)


def compact(obj) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def answer_for(req: dict, action: str) -> dict:
    """The JSON-RPC response a client would send to a server request."""
    method = req.get("method")
    if method == "elicitation/create":
        if action != "accept":
            return {"jsonrpc": "2.0", "id": req["id"], "result": {"action": action}}
        props = ((req.get("params") or {}).get("requestedSchema") or {}).get("properties") or {}
        fill = {"integer": 7, "number": 1.5, "boolean": True, "string": "Ada"}
        content = {k: fill.get(v.get("type"), "Ada") for k, v in props.items()}
        return {"jsonrpc": "2.0", "id": req["id"], "result": {"action": "accept", "content": content}}
    if method == "sampling/createMessage":
        return {"jsonrpc": "2.0", "id": req["id"], "result": {
            "role": "assistant", "content": {"type": "text", "text": "sampled hello"},
            "model": "probe-model", "stopReason": "endTurn"}}
    if method == "roots/list":
        return {"jsonrpc": "2.0", "id": req["id"], "result": {
            "roots": [{"uri": "file:///tmp/probe-root", "name": "probe"}]}}
    if method == "ping":
        return {"jsonrpc": "2.0", "id": req["id"], "result": {}}
    return {"jsonrpc": "2.0", "id": req["id"], "error": {"code": -32601, "message": "Method not found"}}


# ---------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------
class Http:
    def __init__(self, port: int) -> None:
        self.port = port
        self.sid: str | None = None
        self.version: str | None = None  # MCP-Protocol-Version header, once negotiated
        self.events: "queue.Queue[tuple[str, dict]]" = queue.Queue()
        self.n = 0
        self.conns: list[http.client.HTTPConnection] = []

    def _headers(self, extra: dict | None) -> dict:
        h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
             "Host": f"127.0.0.1:{self.port}"}
        if self.sid:
            h["Mcp-Session-Id"] = self.sid
        if self.version:
            h["MCP-Protocol-Version"] = self.version
        h.update(extra or {})
        return h

    def _read_stream(self, label: str, resp: http.client.HTTPResponse) -> None:
        data: list[str] = []
        try:
            while True:
                line = resp.readline()
                if not line:
                    break
                s = line.decode("utf-8").rstrip("\r\n")
                if s.startswith("data:"):
                    data.append(s[5:].lstrip())
                elif s == "":
                    if data:
                        text = "\n".join(data)
                        data = []
                        try:
                            msg = json.loads(text)
                        except ValueError:
                            log(f"<- {label} sse (not json) {text!r}")
                            continue
                        log(f"<- {label} sse {compact(msg)}")
                        self.events.put((label, msg))
                elif s.startswith(("id:", "event:", "retry:", ":")):
                    log(f"<- {label} sse-field {s}")
        except Exception as e:  # noqa: BLE001 - a closed socket ends the reader
            log(f"<- {label} stream error {type(e).__name__}: {e}")
        log(f"<- {label} stream closed")
        self.events.put((label, {"_closed": label}))

    def _open(self, method: str, label: str, body: bytes | None, extra: dict | None, wait: bool):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        self.conns.append(conn)
        conn.request(method, "/mcp", body=body, headers=self._headers(extra))
        resp = conn.getresponse()
        ct = resp.getheader("content-type") or ""
        sid = resp.getheader("mcp-session-id")
        log(f"<- {label} {resp.status} ct={ct or '-'}" + (f" sid={sid}" if sid else ""))
        if sid and not self.sid:
            self.sid = sid
        if ct.startswith("text/event-stream"):
            t = threading.Thread(target=self._read_stream, args=(label, resp), daemon=True)
            t.start()
            if wait:
                t.join(30)
            return resp.status, None
        raw = resp.read()
        if raw:
            try:
                msg = json.loads(raw)
                log(f"<- {label} json {compact(msg)}")
                self.events.put((label, msg))
                return resp.status, msg
            except ValueError:
                log(f"<- {label} body {raw[:300]!r}")
        return resp.status, None

    def post(self, msg: dict, extra: dict | None = None, wait: bool = False):
        self.n += 1
        label = f"POST#{self.n}"
        shown = "" if not extra else " headers=" + compact(extra)
        log(f"-> {label} {compact(msg)}{shown}")
        return self._open("POST", label, json.dumps(msg).encode(), extra, wait)

    def get_stream(self) -> None:
        log("-> GET (standalone stream)")
        self._open("GET", "GET", None, None, wait=False)

    def delete(self) -> None:
        if self.sid:
            log("-> DELETE session")
            self._open("DELETE", "DELETE", None, None, wait=True)

    def close(self) -> None:
        for c in self.conns:
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass


def serve_questions(io, call_id, action: str = "accept", timeout: float = 10.0, actions=None,
                    batch: int = 1) -> dict | None:
    """Answer every server request until the response to call_id arrives.

    batch=N holds the answers until N server requests are outstanding, then sends them
    all: with N=2 that shows two questions really are open at the same time (a server
    that asks one after the other never sends the second, and the probe times out)."""
    deadline = time.monotonic() + timeout
    answered = 0
    held: list[dict] = []
    while time.monotonic() < deadline:
        try:
            label, msg = io.events.get(timeout=max(0.05, deadline - time.monotonic()))
        except queue.Empty:
            break
        if "method" in msg and "id" in msg:
            held.append(msg)
            if len(held) < batch:
                continue
            if batch > 1:
                log(f"   ({len(held)} server requests outstanding at once; answering them now)")
            for req in held:
                act = actions[answered] if actions and answered < len(actions) else action
                answered += 1
                io.reply(answer_for(req, act))
            held, batch = [], 1
        elif msg.get("id") == call_id and ("result" in msg or "error" in msg):
            return msg
    log("!! no final response within the timeout")
    return None


class HttpIO(Http):
    def reply(self, response: dict) -> None:
        self.post(response, wait=True)


def http_2025_init(h: HttpIO, caps: dict) -> None:
    h.post({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
        "protocolVersion": V2025, "capabilities": caps,
        "clientInfo": {"name": "probe", "version": "0"}}}, wait=True)
    # Drain the initialize result.
    while True:
        _label, msg = h.events.get(timeout=10)
        if msg.get("id") == "init":
            h.version = (msg.get("result") or {}).get("protocolVersion", V2025)
            break
    h.post({"jsonrpc": "2.0", "method": "notifications/initialized"}, wait=True)


def http_2025_call(port: int, tool: str, caps: dict, action="accept", args=None, get_stream=True, actions=None,
                   then_list=False, batch=1) -> None:
    h = HttpIO(port)
    http_2025_init(h, caps)
    if get_stream:
        h.get_stream()
        time.sleep(0.2)
    h.post({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": tool, "arguments": args or {}}})
    serve_questions(h, 2, action, actions=actions, batch=batch)
    if then_list:
        h.post({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, wait=True)
        time.sleep(0.3)
    time.sleep(0.3)  # let late events show
    h.delete()
    time.sleep(0.2)
    h.close()


def envelope(caps: dict) -> dict:
    return {"io.modelcontextprotocol/protocolVersion": V2026,
            "io.modelcontextprotocol/clientInfo": {"name": "probe", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": caps}


def http_2026_call(port: int, tool: str, caps: dict, args=None) -> None:
    h = HttpIO(port)
    h.version = V2026
    h.post({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": envelope(caps)}},
           extra={"Mcp-Method": "server/discover"}, wait=True)
    h.post({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": tool, "arguments": args or {}, "_meta": envelope(caps)}},
           extra={"Mcp-Method": "tools/call", "Mcp-Name": tool}, wait=True)
    time.sleep(0.2)
    h.close()


def http_2026_mrtr(port: int, tool: str, caps: dict, action: str = "accept") -> None:
    """A 2026 call that may answer input_required: answer its inputRequests and retry
    (new JSON-RPC id, same name/arguments, plus inputResponses and requestState)."""
    h = HttpIO(port)
    h.version = V2026
    params: dict = {"name": tool, "arguments": {}, "_meta": envelope(caps)}
    for rid in range(2, 6):
        _status, msg = h.post({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params},
                              extra={"Mcp-Method": "tools/call", "Mcp-Name": tool}, wait=True)
        if msg is None:
            try:
                while True:
                    _l, msg = h.events.get(timeout=5)
                    if msg.get("id") == rid:
                        break
            except queue.Empty:
                log("!! no answer")
                break
        result = msg.get("result") or {}
        if result.get("resultType") != "input_required":
            break
        responses = {k: answer_for({"id": k, **req}, action)["result"]
                     for k, req in (result.get("inputRequests") or {}).items()}
        params = {**params, "inputResponses": responses}
        if "requestState" in result:
            params["requestState"] = result["requestState"]
    h.close()


# ---------------------------------------------------------------------------
# stdio
# ---------------------------------------------------------------------------
class StdioIO:
    def __init__(self, cmd: list[str]) -> None:
        log("$ " + " ".join(cmd))
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.events: "queue.Queue[tuple[str, dict]]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.p.stdout
        for line in self.p.stdout:
            s = line.decode("utf-8").strip()
            if not s:
                continue
            try:
                msg = json.loads(s)
            except ValueError:
                log(f"<- stdout (not json) {s!r}")
                continue
            log(f"<- stdout {compact(msg)}")
            self.events.put(("stdout", msg))

    def send(self, msg: dict) -> None:
        log(f"-> stdin {compact(msg)}")
        assert self.p.stdin
        self.p.stdin.write((json.dumps(msg) + "\n").encode())
        self.p.stdin.flush()

    reply = send

    def wait_id(self, rid, timeout=10.0) -> dict | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                _l, msg = self.events.get(timeout=max(0.05, deadline - time.monotonic()))
            except queue.Empty:
                break
            if msg.get("id") == rid and "method" not in msg:
                return msg
        return None

    def close(self) -> None:
        try:
            assert self.p.stdin
            self.p.stdin.close()
        except Exception:  # noqa: BLE001
            pass
        try:
            self.p.wait(5)
        except subprocess.TimeoutExpired:
            self.p.kill()


def stdio_2025_call(cmd, tool, caps, action="accept", args=None) -> None:
    s = StdioIO(cmd)
    s.send({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
        "protocolVersion": V2025, "capabilities": caps, "clientInfo": {"name": "probe", "version": "0"}}})
    s.wait_id("init")
    s.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    s.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": tool, "arguments": args or {}}})
    serve_questions(s, 2, action)
    s.close()


def stdio_2026_call(cmd, tool, caps, args=None) -> None:
    s = StdioIO(cmd)
    s.send({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": envelope(caps)}})
    s.wait_id(1)
    s.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": tool, "arguments": args or {}, "_meta": envelope(caps)}})
    s.wait_id(2)
    s.close()


# ---------------------------------------------------------------------------
# peers and scenarios
# ---------------------------------------------------------------------------
def start_http(cmd: list[str]) -> tuple[subprocess.Popen, int]:
    log("$ " + " ".join(cmd))
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert p.stdout
    line = p.stdout.readline().decode().strip()
    if not line.startswith("READY "):
        p.kill()
        raise SystemExit(f"peer did not print READY (got {line!r})")
    return p, int(line.split()[1])


def peer_cmd(server: str, python: str, http: bool, extra: list[str]) -> list[str]:
    if server == "fastmcp":
        base = [python, os.path.join(HERE, "fastmcp_server.py")]
    else:
        base = [python, os.path.join(HERE, "py_server.py"), "--questions"]
    return base + (["--port", "0"] if http else ["--stdio"]) + extra


def scenarios(server: str):
    ask = "party" if server == "fastmcp" else "ask_count"
    twice = "two_questions" if server == "fastmcp" else "ask_twice"
    s = {
        "http-2025-accept": ("http", lambda port, cmd: http_2025_call(port, ask, ALL_CAPS)),
        "http-2025-decline": ("http", lambda port, cmd: http_2025_call(port, ask, ALL_CAPS, "decline", get_stream=False)),
        "http-2025-cancel": ("http", lambda port, cmd: http_2025_call(port, ask, ALL_CAPS, "cancel", get_stream=False)),
        "http-2025-nocaps": ("http", lambda port, cmd: http_2025_call(port, ask, {}, get_stream=False)),
        "http-2025-twice": ("http", lambda port, cmd: http_2025_call(
            port, twice, ALL_CAPS, get_stream=False, batch=2 if server == "fastmcp" else 1)),
        "http-2025-grow": ("http", lambda port, cmd: http_2025_call(port, "grow", ALL_CAPS, then_list=True)),
        "http-2026-ask": ("http", lambda port, cmd: http_2026_call(port, ask, ALL_CAPS)),
        "stdio-2025-accept": ("stdio", lambda port, cmd: stdio_2025_call(cmd, ask, ALL_CAPS)),
        "stdio-2025-nocaps": ("stdio", lambda port, cmd: stdio_2025_call(cmd, ask, {})),
        "stdio-2026-ask": ("stdio", lambda port, cmd: stdio_2026_call(cmd, ask, ALL_CAPS)),
    }
    if server == "fastmcp":
        s["http-2026-mrtr"] = ("http", lambda port, cmd: http_2026_mrtr(port, "party_mrtr", ALL_CAPS))
        s["http-2026-mrtr-decline"] = ("http", lambda port, cmd: http_2026_mrtr(port, "party_mrtr", ALL_CAPS, "decline"))
        s["http-2025-mrtr"] = ("http", lambda port, cmd: http_2025_call(port, "party_mrtr", ALL_CAPS, get_stream=False))
    if server == "py":
        s["http-2025-sample"] = ("http", lambda port, cmd: http_2025_call(port, "sample", ALL_CAPS, get_stream=False))
        s["http-2025-roots"] = ("http", lambda port, cmd: http_2025_call(port, "roots", ALL_CAPS))
        s["http-2025-roots-call"] = ("http", lambda port, cmd: http_2025_call(port, "roots_call", ALL_CAPS, get_stream=False))
        s["http-2025-roots-noget"] = ("http", lambda port, cmd: http_2025_call(port, "roots", ALL_CAPS, get_stream=False))
        s["http-2025-grow-related"] = ("http", lambda port, cmd: http_2025_call(
            port, "grow", ALL_CAPS, args={"related": True}, then_list=True))
        s["http-2026-sample"] = ("http", lambda port, cmd: http_2026_call(port, "sample", ALL_CAPS))
        s["http-2025-twice-together"] = ("http", lambda port, cmd: http_2025_call(
            port, "ask_twice", ALL_CAPS, args={"together": True}, get_stream=False, batch=2))
        s["http-2026-echo"] = ("http", lambda port, cmd: http_2026_call(port, "echo", ALL_CAPS, args={"text": "hi"}))
        s["stdio-2026-echo"] = ("stdio", lambda port, cmd: stdio_2026_call(cmd, "echo", ALL_CAPS, args={"text": "hi"}))
        s["stdio-2025-sample"] = ("stdio", lambda port, cmd: stdio_2025_call(cmd, "sample", ALL_CAPS))
        s["stdio-2025-roots"] = ("stdio", lambda port, cmd: stdio_2025_call(cmd, "roots", ALL_CAPS))
    return s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", choices=["fastmcp", "py"], default="fastmcp")
    ap.add_argument("--python", default=sys.executable, help="the peer's python")
    ap.add_argument("--peer-arg", action="append", default=[], help="extra argument for the peer (repeatable)")
    ap.add_argument("--scenario", action="append", help="run only these (repeatable); default all")
    ap.add_argument("--list", action="store_true", help="list the scenarios")
    args = ap.parse_args()
    table = scenarios(args.server)
    if args.list:
        for k in table:
            print(k)
        return 0
    chosen = args.scenario or list(table)
    for name in chosen:
        kind, fn = table[name]
        log(f"\n===== {args.server} {name} =====")
        cmd = peer_cmd(args.server, args.python, kind == "http", args.peer_arg)
        if kind == "http":
            p, port = start_http(cmd)
            try:
                fn(port, cmd)
            finally:
                p.terminate()
                p.wait(5)
        else:
            fn(None, cmd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
