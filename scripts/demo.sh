#!/usr/bin/env bash
# The local trial in one command: the example Python MCP server (examples/python-server) over
# stdio, run by epode-sidecar with --dev: an embedded Epode on this machine with an ephemeral
# key (no account needed), a live console at http://127.0.0.1:8080/_dev/ and a JSON-lines record
# (epode-dev.jsonl). MCP clients connect to http://127.0.0.1:8080/mcp. Ctrl-C stops both.
# The first run installs a Python venv with mcp==2.3.0 into .peers/ and builds in release mode.
#
#   bash scripts/demo.sh
#   AGENT_FEEDBACK_MODE=ask_always bash scripts/demo.sh    # any mode
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
EPODE_PEERS_ONLY=py bash scripts/install-peers.sh >/dev/null
peers="${EPODE_PEERS_DIR:-$PWD/.peers}"
exec cargo run --release --quiet --bin epode-sidecar -- \
  --dev -- "$peers/py/bin/python" examples/python-server/server.py --stdio
