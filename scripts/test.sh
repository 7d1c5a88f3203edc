#!/usr/bin/env bash
# Runs every test: installs the pinned real peers into .peers/ (or $EPODE_PEERS_DIR) when they
# are missing, then `cargo test --no-fail-fast` (every test binary runs, and every failure is
# reported; it builds the binary the integration tests start, with the features the tests
# unify, so nothing is built twice). Extra arguments go to cargo test (e.g. `--lib`, or
# `--test it -- stdio::` for one area).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install-peers.sh >/dev/null
echo "-- test.sh: peers ready at ${SECONDS} s" >&2
# EPODE_TEST_CARGO_ARGS (e.g. "--profile ci --target x86_64-unknown-linux-gnu") and
# EPODE_TEST_RUSTFLAGS build and run the tests in another profile (CI: the one build whose
# binary the image holds); both unset: a plain debug build.
read -r -a build_args <<<"${EPODE_TEST_CARGO_ARGS:-}"
if [[ -n "${EPODE_TEST_RUSTFLAGS:-}" ]]; then export RUSTFLAGS="$EPODE_TEST_RUSTFLAGS"; fi
# Most tests wait on sockets and child processes (the suite uses about 0.6 of a core at 4 test
# threads): 8 at a time finish it in about half the time of the default (one per core), and
# each test is written to hold on a loaded machine. RUST_TEST_THREADS overrides.
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-8}"
status=0
cargo test "${build_args[@]}" --no-fail-fast "$@" || status=$?
echo "-- test.sh: tests ended at ${SECONDS} s" >&2
exit "$status"
