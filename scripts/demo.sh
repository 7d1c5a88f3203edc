#!/usr/bin/env bash
# Runs the sidecar's main job on a laptop: the example Python MCP server on 127.0.0.1:8000,
# a local stand-in for the Epode API (the test suite's strict fake, on 127.0.0.1:8090), and
# epode-sidecar in front of the server on 127.0.0.1:8080 with feedback on. Ctrl-C stops all
# three. The first run installs a Python venv with mcp==2.3.0 into .peers/ and builds.
#
#   AGENT_FEEDBACK_MODE=ask_once bash scripts/demo.sh     # any mode; off needs no Epode
#   EPODE_API_KEY=af_live_… EPODE_API_URL=https://app.epode.ai bash scripts/demo.sh
#                                                       # the real Epode instead of the stand-in
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
EPODE_PEERS_ONLY=py bash scripts/install-peers.sh >/dev/null
peers="${EPODE_PEERS_DIR:-$PWD/.peers}"
port="${DEMO_UPSTREAM_PORT:-8000}"
mode="${AGENT_FEEDBACK_MODE:-never_ask}"
cargo build --release --quiet --bin epode-sidecar --example fake_epode

pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
wait_port() {
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "demo: nothing listens on port $1" >&2
  return 1
}

"$peers/py/bin/python" examples/python-server/server.py --port "$port" &
pids+=($!)
wait_port "$port"

if [[ -z "${EPODE_API_KEY:-}" && "$mode" != "off" ]]; then
  epode_port="${DEMO_EPODE_PORT:-8090}"
  target/release/examples/fake_epode --port "$epode_port" --mode "$mode" >&2 &
  pids+=($!)
  wait_port "$epode_port"
  # The stand-in's documented demo key (tests/support/fake_epode.rs): not a real credential.
  export EPODE_API_KEY="af_live_0123456789abcdef0123456789abcdef_fedcba9876543210fedcba9876543210_demo_secret_not_a_real_key"
  export EPODE_API_URL="http://127.0.0.1:$epode_port"
  echo "demo: Epode stand-in on $EPODE_API_URL (mode $mode)" >&2
fi

export EPODE_SIDECAR_UPSTREAM="http://127.0.0.1:$port/mcp"
export AGENT_FEEDBACK_MODE="$mode"
echo "demo: example server on $EPODE_SIDECAR_UPSTREAM; MCP clients connect to http://${EPODE_SIDECAR_LISTEN:-127.0.0.1:8080}/mcp" >&2
target/release/epode-sidecar &
pids+=($!)
wait "${pids[-1]}"
