#!/usr/bin/env bash
# Runs every test: installs the pinned real peers into .peers/ (or $EPODE_PEERS_DIR) when they
# are missing, then `cargo test`. Extra arguments go to cargo test (e.g. `--test edges`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install-peers.sh >/dev/null
cargo build --quiet --bin epode-sidecar
cargo test "$@"
