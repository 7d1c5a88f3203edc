#!/usr/bin/env bash
# Builds the epode-sidecar image offline: the static binary on this machine, then the `prebuilt`
# target of docker/Dockerfile (the same runtime stage as the from-source build) with a context
# that holds only that binary. No registry is needed: the image starts FROM scratch.
#
#   bash docker/build.sh            # prints progress, the image's size, and on its LAST line
#                                   # the image reference (epode-sidecar:<version>)
#
#   bash docker/build.sh --binary   # only step 2 (no Docker engine needed): the static binary;
#                                   # prints its path on its last line
#
# Environment: EPODE_SIDECAR_IMAGE (default epode-sidecar:<Cargo.toml version>); CARGO_TARGET_DIR
# (where cargo builds, as for cargo itself); EPODE_SIDECAR_BINARY: a static binary already built
# (CI: the one its tests ran, the `ci` profile), used instead of step 2's build, stripped of its
# symbols on the way into the image as the dist profile strips them; EPODE_SIDECAR_BINARY_PROFILE
# names its profile in the image's label ai.epode.build-profile (default prebuilt; dist when
# built here).
# When no Docker engine answers, installs Debian's docker.io (as root) and starts dockerd in
# the background (log: ${TMPDIR:-/tmp}/epode-dockerd.log); it is left running.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

log() { printf 'docker/build.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

BINARY_ONLY=false
case "${1:-}" in
  "") ;;
  --binary) BINARY_ONLY=true ;;
  *) die "unknown argument '$1' (the one option is --binary)" ;;
esac

# ---- 1. a Docker engine ------------------------------------------------------------------------
if ! $BINARY_ONLY && ! docker info >/dev/null 2>&1; then
  if ! command -v dockerd >/dev/null; then
    [[ $(id -u) == 0 ]] || die "no Docker engine answers and this is not root: install Docker (or run as root)"
    log "installing Debian's docker.io"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io) >&2
  fi
  if ! docker info >/dev/null 2>&1; then
    [[ $(id -u) == 0 ]] || die "dockerd is installed but not running, and this is not root"
    dlog="${TMPDIR:-/tmp}/epode-dockerd.log"
    log "starting dockerd (log: $dlog)"
    nohup dockerd >"$dlog" 2>&1 </dev/null &
    for _ in $(seq 1 60); do
      docker info >/dev/null 2>&1 && break
      sleep 0.5
    done
    docker info >/dev/null 2>&1 || { tail -20 "$dlog" >&2; die "dockerd did not start within 30 s"; }
  fi
fi

# ---- 2. the static binary ----------------------------------------------------------------------
# glibc linked statically, names resolved in Rust (hickory), CA roots built in: nothing is read
# from the filesystem, so it runs FROM scratch. The dist profile: fat LTO, symbols stripped.
TRIPLE=x86_64-unknown-linux-gnu
[[ "$(uname -m)" == x86_64 ]] || die "this offline build makes an x86_64 image; on $(uname -m) use: docker build -f docker/Dockerfile ."
PROFILE=dist
if [[ -n "${EPODE_SIDECAR_BINARY:-}" ]]; then
  BIN="$EPODE_SIDECAR_BINARY"
  PROFILE="${EPODE_SIDECAR_BINARY_PROFILE:-prebuilt}"
  [[ -x "$BIN" ]] || die "EPODE_SIDECAR_BINARY=$BIN is not an executable file"
  log "using the binary already built: $BIN"
else
  log "building the static binary (cargo build --profile dist --target $TRIPLE)"
  RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --profile dist --target "$TRIPLE" --bin epode-sidecar >&2
  BIN="${CARGO_TARGET_DIR:-target}/$TRIPLE/dist/epode-sidecar"
fi
file_out="$(file -b "$BIN" 2>/dev/null || true)"
if [[ -n "$file_out" && "$file_out" != *static* ]]; then
  die "$BIN is not statically linked: $file_out"
fi
if $BINARY_ONLY; then
  echo "$BIN"
  exit 0
fi

# ---- 3. the image ------------------------------------------------------------------------------
VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)"
[[ -n "$VERSION" ]] || die "no version in Cargo.toml"
IMAGE="${EPODE_SIDECAR_IMAGE:-epode-sidecar:$VERSION}"
REVISION="$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
if [[ -n "$(git status --porcelain -- src Cargo.toml Cargo.lock 2>/dev/null)" ]]; then
  REVISION="$REVISION-dirty"
fi
CTX="$(mktemp -d)"
trap 'rm -rf "$CTX"' EXIT
install -m 0555 "$BIN" "$CTX/epode-sidecar"
if [[ -n "${EPODE_SIDECAR_BINARY:-}" ]]; then
  # As the dist profile does (strip = "symbols"): the symbols are no use in an image.
  strip --strip-all "$CTX/epode-sidecar" || die "strip $BIN failed (binutils' strip is needed)"
fi
log "building $IMAGE (docker/Dockerfile, target prebuilt)"
docker build --quiet \
  -f docker/Dockerfile --target prebuilt \
  --build-arg "VERSION=$VERSION" \
  --build-arg "REVISION=$REVISION" \
  --build-arg "PROFILE=$PROFILE" \
  --build-arg "CREATED=$(git log -1 --format=%cI 2>/dev/null || echo unknown)" \
  -t "$IMAGE" "$CTX" >&2

SIZE="$(docker image inspect -f '{{.Size}}' "$IMAGE")"
log "$IMAGE: $SIZE bytes ($(awk -v s="$SIZE" 'BEGIN { printf "%.1f MB", s / 1000000 }'), $(awk -v s="$SIZE" 'BEGIN { printf "%.1f MiB", s / 1048576 }'))"
echo "$IMAGE"
