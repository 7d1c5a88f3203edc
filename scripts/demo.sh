#!/usr/bin/env bash
# Runs the sidecar's main job on a laptop: the example Python MCP server on 127.0.0.1:8000 and
# epode-sidecar in front of it on 127.0.0.1:8080 (EPODE_SIDECAR_LISTEN overrides). Ctrl-C stops
# both. The first run installs a Python venv with mcp==2.3.0 into .peers/ and builds the binary.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
EPODE_PEERS_ONLY=py bash scripts/install-peers.sh >/dev/null
peers="${EPODE_PEERS_DIR:-$PWD/.peers}"
port="${DEMO_UPSTREAM_PORT:-8000}"
cargo build --release --quiet --bin epode-sidecar

"$peers/py/bin/python" examples/python-server/server.py --port "$port" &
upstream=$!
trap 'kill $upstream 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  sleep 0.1
done

export EPODE_SIDECAR_UPSTREAM="http://127.0.0.1:$port/mcp"
echo "demo: example server on $EPODE_SIDECAR_UPSTREAM; MCP clients connect to http://${EPODE_SIDECAR_LISTEN:-127.0.0.1:8080}/mcp" >&2
target/release/epode-sidecar
