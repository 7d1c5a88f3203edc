#!/usr/bin/env bash
# The local trial in one command: the example Python MCP server (examples/python-server) over
# stdio, run by epode-sidecar with --dev: an embedded Epode on this machine with an ephemeral
# key (no account needed), a live console at http://127.0.0.1:8080/_dev/ and a JSON-lines record
# (epode-dev.jsonl). MCP clients connect to http://127.0.0.1:8080/mcp. Ctrl-C stops both.
#
# Needs Rust (cargo) and Python 3.10+ with its venv module; nothing else (Node is only for the
# tests). Checks both first and stops with one line saying what is missing and how to get it.
# The first run installs a Python venv with mcp==2.3.0 into .peers/ and builds in release mode
# (minutes; cargo shows its progress); later runs start in seconds.
#
#   bash scripts/demo.sh
#   AGENT_FEEDBACK_MODE=ask_always bash scripts/demo.sh    # any mode
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf 'demo: %s\n' "$*" >&2; }

# ---- what the trial needs, before anything is installed or built ------------
missing=()
if ! command -v cargo >/dev/null 2>&1; then
  missing+=("Rust's cargo (install Rust from https://rustup.rs, then open a new shell)")
fi
get_python="Python 3.10 or newer: apt-get install python3 python3-venv, brew install python, or https://www.python.org/downloads/"
py_version=""
if command -v python3 >/dev/null 2>&1; then
  py_version="$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true)"
fi
if ! command -v python3 >/dev/null 2>&1; then
  missing+=("python3 ($get_python)")
elif [[ -z "$py_version" ]]; then
  missing+=("a python3 that runs (\"python3\" is $(command -v python3) but does not start; $get_python)")
elif ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  missing+=("Python 3.10 or newer (python3 is $py_version; the MCP SDK needs 3.10+: https://www.python.org/downloads/)")
elif ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  missing+=("Python's venv module (apt-get install python3-venv)")
fi
if ((${#missing[@]})); then
  list="${missing[0]}"
  ((${#missing[@]} == 1)) || list="$list and ${missing[1]}"
  say "cannot start: missing $list"
  exit 1
fi

# ---- the example server's Python SDK (first run only: about half a minute) ---
EPODE_PEERS_ONLY=py bash scripts/install-peers.sh >/dev/null
peers="${EPODE_PEERS_DIR:-$PWD/.peers}"

# ---- the sidecar, in release mode --------------------------------------------
if [[ -x "${CARGO_TARGET_DIR:-target}/release/epode-sidecar" ]]; then
  say "building epode-sidecar (seconds when nothing changed)"
else
  say "building epode-sidecar in release mode: the first build takes minutes (4 on an idle 2-core machine, measured: 3 min 58 s; longer on a busy one; the last 1 to 2 minutes are epode-sidecar itself, and this script says every 30 s that it is still working)"
fi
build() { cargo build --release --bin epode-sidecar; }
# cargo prints a line per crate (on a terminal, a progress bar) and then nothing while its last
# crate, epode-sidecar itself, is optimised and linked: minutes of one core. Say every 30 s
# that it is still working, on a terminal too.
build &
pid=$!
trap 'kill "$pid" 2>/dev/null || true' EXIT
started=$SECONDS
next=$((started + 30))
while kill -0 "$pid" 2>/dev/null; do
  sleep 1
  if ((SECONDS >= next)); then
    [[ -t 2 ]] && printf '\n' >&2
    say "still building ($((SECONDS - started)) s so far)"
    next=$((next + 30))
  fi
done
wait "$pid"
trap - EXIT

say "starting: the sidecar says where MCP clients connect, the console, and a command to try"
exec cargo run --release --quiet --bin epode-sidecar -- \
  --dev -- "$peers/py/bin/python" examples/python-server/server.py --stdio
