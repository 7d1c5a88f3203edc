#!/usr/bin/env bash
# Runs every test: installs the pinned real peers into .peers/ (or $EPODE_PEERS_DIR) when they
# are missing, then `cargo test --no-fail-fast` (every test binary runs, and every failure is
# reported). Extra arguments go to cargo test (e.g. `--lib`, or `--test it -- stdio::` for one area).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install-peers.sh >/dev/null
cargo build --quiet --bin epode-sidecar
# Most tests wait on sockets and child processes (the suite uses about 0.6 of a core at 4 test
# threads): 8 at a time finish it in about half the time of the default (one per core), and
# each test is written to hold on a loaded machine. RUST_TEST_THREADS overrides.
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-8}"
cargo test --no-fail-fast "$@"
