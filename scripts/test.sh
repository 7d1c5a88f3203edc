#!/usr/bin/env bash
# Runs every test: installs the pinned real peers into .peers/ (or $EPODE_PEERS_DIR) when they
# are missing, then `cargo test --no-fail-fast` (every test binary runs, and every failure is
# reported). Extra arguments go to cargo test (e.g. `--lib`, or `--test it -- stdio::` for one area).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install-peers.sh >/dev/null
cargo build --quiet --bin epode-sidecar
cargo test --no-fail-fast "$@"
