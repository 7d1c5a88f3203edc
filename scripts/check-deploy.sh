#!/usr/bin/env bash
# The deployment checks (CI step "== deploy checks"): the Helm chart, the plain manifests, the
# systemd unit, compose.yaml and the container image, each checked with real tools.
#
#   1. helm lint --strict and helm template: default values and every helm/epode-sidecar/ci/*.yaml;
#      the authorization settings rendered from --set (the client secret by reference only),
#      and the renders the chart must refuse, with their messages (auth on without what it
#      needs, the client secret given as an env entry or a value);
#      the example parent chart (helm/examples/existing-app) that uses the named templates;
#      kubectl kustomize deploy/kubernetes
#   2. kubernetes-validate --strict for Kubernetes 1.29 to 1.33: every rendered object and every
#      manifest under deploy/kubernetes (CRDs and the Kustomization are skipped, with the reason)
#   3. deploy/kubernetes/deployment.yaml's sidecar == the chart's default render
#   4. checkov: the chart, every render, deploy/kubernetes and docker/, skipping only the ids in
#      deploy/checkov-skips.txt (which docs/deploy.md's table must list)
#   5. compose.yaml (docker compose config), the systemd unit (systemd-analyze verify, security)
#  5b. the operations kit: promtool check rules and test rules on deploy/prometheus/; the
#      dashboard (deploy/grafana/) valid JSON whose every expression parses as PromQL; the chart's
#      copies in helm/epode-sidecar/files/ byte-identical; the PrometheusRule and the dashboard's
#      ConfigMap rendered from them (and absent from the default render)
#   6. the image (bash docker/build.sh): the binary alone, under 20 MB (a dist build) or 64 MB (CI's
#      ci-profile build), UID 65532, no shell; run read-only with no
#      capabilities in front of the example Python server; the official TypeScript client calls
#      a tool through it (pin and legacy), feedback off and in --dev; HEALTHCHECK healthy;
#      SIGTERM (docker stop) exits 0
#   7. the pods, as the kubelet runs them (scripts/pod-check.py): the chart's default render
#      (with the example image, and with the same server in an unmodified python:3-style image
#      running as root), its hardened, classic-sidecar and server-exec-probes value sets, the
#      example parent chart and deploy/kubernetes/deployment.yaml, each pod's containers on
#      Docker in one network namespace, native-sidecar start order, every declared probe
#      executed from outside against the pod's address for 40 s (EPODE_POD_CHECK_SECONDS: more
#      than two periods of the liveness probe) and until the pod is ready, for up to 180 s
#      (EPODE_POD_CHECK_READY_WITHIN: seven Python servers importing the mcp SDK at once beside
#      the tests took 31 to 37 s here, and more than 45 s on a CI machine once), an MCP call through the pod's address once it is ready (the official
#      TypeScript client), then the pod deleted: no probe past its threshold, no restart, the
#      server stopped before the sidecar, within terminationGracePeriodSeconds
#
# EPODE_CHECK_PARTS picks what runs: "files" (1-5b), "image" (6-7), or both (the default). The
# renders of 1 are made in either (7 runs them). CI runs "files" while the tests run and
# "image" once the image is built. In "image", the pods (7) run while 6 checks the image.
#
# Exits non-zero at the first failed check. Cleans up its containers and processes on exit.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
started=$SECONDS

PARTS=" ${EPODE_CHECK_PARTS:-files image} "
for part in $PARTS; do
  [[ "$part" == files || "$part" == image ]] || { echo "check-deploy: EPODE_CHECK_PARTS: unknown part '$part' (files, image)" >&2; exit 2; }
done
want() { [[ "$PARTS" == *" $1 "* ]]; }

say() { printf -- '-- %s\n' "$*"; }
fail() { printf 'check-deploy: FAILED: %s\n' "$*" >&2; exit 1; }

WORK="$(mktemp -d)"
CONTAINERS=()
PIDS=()
cleanup() {
  local c p
  for c in "${CONTAINERS[@]}"; do docker rm -f "$c" >/dev/null 2>&1 || true; done
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

apt_install() {
  [[ $(id -u) == 0 ]] || fail "$1 is missing and this is not root"
  say "installing Debian's $*"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@") >/dev/null
}

# ---- tools ----------------------------------------------------------------------------------
t0=$SECONDS
eval "$(bash scripts/install-deploy-tools.sh)"
bash scripts/install-peers.sh >/dev/null
PEERS="${EPODE_PEERS_DIR:-$REPO/.peers}"
export PATH="$(dirname "$HELM"):$PATH"   # checkov's helm framework runs `helm`
say "tools ready in $((SECONDS - t0)) s: $("$HELM" version --template '{{.Version}}'), kubectl $("$KUBECTL" version --client -o json | "$PEERS/deploy-tools/py/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["clientVersion"]["gitVersion"])'), kubernetes-validate $("$KUBERNETES_VALIDATE" --version), checkov $("$CHECKOV" --version)"
PY="$PEERS/deploy-tools/py/bin/python"   # has PyYAML (a checkov dependency)

# ---- 1. helm lint / template, the example parent chart, kustomize ---------------------------
CHART=helm/epode-sidecar
R="$WORK/render"
mkdir -p "$R"
"$HELM" lint --strict "$CHART" >"$WORK/lint.txt" 2>&1 || { cat "$WORK/lint.txt"; fail "helm lint (default values)"; }
"$HELM" template demo "$CHART" >"$R/chart-default.yaml" || fail "helm template (default values)"
say "helm lint + template: default values ($(grep -c '^kind:' "$R/chart-default.yaml") objects)"
shopt -s nullglob
ci_values=("$CHART"/ci/*.yaml)
shopt -u nullglob
(( ${#ci_values[@]} >= 3 )) || fail "expected at least three value sets in $CHART/ci/"
for f in "${ci_values[@]}"; do
  name="$(basename "$f" .yaml)"
  "$HELM" lint --strict "$CHART" -f "$f" >"$WORK/lint.txt" 2>&1 || { cat "$WORK/lint.txt"; fail "helm lint -f $f"; }
  "$HELM" template demo "$CHART" -f "$f" >"$R/chart-$name.yaml" || fail "helm template -f $f"
  say "helm lint + template: $f ($(grep -c '^kind:' "$R/chart-$name.yaml") objects)"
done
# The authorization front door: the settings given with --set reach the sidecar's env, the
# client secret by reference only (with introspect only); then the renders the chart refuses.
AUTH_ON=(--set auth.issuer=https://as.example.com --set auth.resource=https://mcp.example.com/mcp)
# auth_env RENDER: the sidecar's env entries of the render's Deployment, as JSON.
auth_env() {
  "$PY" -c '
import json, sys, yaml
for doc in yaml.safe_load_all(open(sys.argv[1])):
    if doc and doc.get("kind") == "Deployment":
        print(json.dumps(doc["spec"]["template"]["spec"]["initContainers"][0]["env"]))' "$1"
}
"$HELM" template demo "$CHART" --set auth.mode=jwt "${AUTH_ON[@]}" >"$WORK/auth-jwt.yaml" || fail "helm template --set auth.mode=jwt"
"$PY" -c '
import json, sys
env = {e["name"]: e for e in json.loads(sys.argv[1])}
want = {"EPODE_SIDECAR_AUTH": "jwt", "EPODE_SIDECAR_AUTH_ISSUER": "https://as.example.com",
        "EPODE_SIDECAR_AUTH_RESOURCE": "https://mcp.example.com/mcp"}
bad = [f"{k}: {env.get(k)}" for k, v in want.items() if env.get(k, {}).get("value") != v]
bad += [f"{k} rendered" for k in env if k.startswith("EPODE_SIDECAR_AUTH_") and k not in want]
sys.exit("; ".join(bad) or None)' "$(auth_env "$WORK/auth-jwt.yaml")" \
  || fail "helm template --set auth.mode=jwt: not the auth settings expected"
"$HELM" template demo "$CHART" -f "$CHART/ci/auth-introspect-values.yaml" >"$WORK/auth-introspect.yaml" \
  || fail "helm template -f $CHART/ci/auth-introspect-values.yaml"
"$PY" -c '
import json, sys
env = {e["name"]: e for e in json.loads(sys.argv[1])}
secret = env.get("EPODE_SIDECAR_AUTH_CLIENT_SECRET") or {}
ref = secret.get("valueFrom", {}).get("secretKeyRef")
ok = "value" not in secret and ref == {"name": "epode-sidecar-auth", "key": "client-secret"}
sys.exit(None if ok and env["EPODE_SIDECAR_AUTH"]["value"] == "introspect" else f"got {secret}")' "$(auth_env "$WORK/auth-introspect.yaml")" \
  || fail "$CHART/ci/auth-introspect-values.yaml: the client secret is not a Secret reference"
say "helm template: auth.mode=jwt from --set renders EPODE_SIDECAR_AUTH, _ISSUER and _RESOURCE only; introspect takes the client secret by secretKeyRef"
# must_refuse MESSAGE ARGS...: helm template ARGS fails saying MESSAGE, and never repeats the
# secret the arguments may carry.
must_refuse() {
  local want="$1"; shift
  if "$HELM" template demo "$CHART" "$@" >"$WORK/refused.txt" 2>&1; then fail "helm template $*: rendered, not refused"; fi
  grep -qF -- "$want" "$WORK/refused.txt" || { cat "$WORK/refused.txt"; fail "helm template $*: refused without saying: $want"; }
  ! grep -qF NotARealSecret "$WORK/refused.txt" || fail "helm template $*: the refusal repeats the secret"
  say "helm template ${*//NotARealSecret/…}: refused, saying: $want"
}
must_refuse "auth.mode is jwt, which needs: auth.issuer (" --set auth.mode=jwt
must_refuse "auth.mode is jwt, which needs: auth.resource (" --set auth.mode=jwt --set auth.issuer=https://as.example.com
must_refuse "auth.mode is introspect, which needs: auth.clientSecret.existingSecret (" \
  --set auth.mode=introspect "${AUTH_ON[@]}" --set auth.clientId=epode-sidecar
must_refuse "auth.mode is introspect, which needs: auth.clientId (" \
  --set auth.mode=introspect "${AUTH_ON[@]}" --set auth.clientSecret.existingSecret=epode-sidecar-auth
must_refuse "sidecar.env.EPODE_SIDECAR_AUTH_CLIENT_SECRET is refused: the authorization client secret comes only from a Secret" \
  --set-string sidecar.env.EPODE_SIDECAR_AUTH_CLIENT_SECRET=NotARealSecret
must_refuse "sidecar.extraEnv EPODE_SIDECAR_AUTH_CLIENT_SECRET is refused" \
  --set-string 'sidecar.extraEnv[0].name=EPODE_SIDECAR_AUTH_CLIENT_SECRET,sidecar.extraEnv[0].value=NotARealSecret'
must_refuse "upstream.env EPODE_SIDECAR_AUTH_CLIENT_SECRET is refused" \
  --set-string 'upstream.env[0].name=EPODE_SIDECAR_AUTH_CLIENT_SECRET,upstream.env[0].value=NotARealSecret'
must_refuse "at '/auth/clientSecret'" --set-string auth.clientSecret=NotARealSecret
# Kubernetes 1.29: the preStop sleep action is off there, so the chart leaves it out.
for f in "" "$CHART/ci/classic-sidecar-values.yaml"; do
  name="k8s-1.29-$(basename "${f:-default}" .yaml)"
  "$HELM" template demo "$CHART" --kube-version 1.29.0 ${f:+-f "$f"} >"$R/chart-$name.yaml" || fail "helm template --kube-version 1.29.0 ${f}"
  ! grep -q 'sleep:' "$R/chart-$name.yaml" || fail "helm template --kube-version 1.29.0 ${f}: a preStop sleep was rendered"
  say "helm template --kube-version 1.29.0 ${f:-(default values)}: no preStop sleep action"
done
# The example parent chart, built in a copy (helm dependency build writes charts/ and a lock).
mkdir -p "$WORK/helm"
cp -r helm/epode-sidecar helm/examples "$WORK/helm/"
"$HELM" dependency build "$WORK/helm/examples/existing-app" >/dev/null || fail "helm dependency build (examples/existing-app)"
"$HELM" lint --strict "$WORK/helm/examples/existing-app" >"$WORK/lint.txt" 2>&1 || { cat "$WORK/lint.txt"; fail "helm lint (examples/existing-app)"; }
"$HELM" template demo "$WORK/helm/examples/existing-app" >"$R/existing-app.yaml" || fail "helm template (examples/existing-app)"
grep -q 'restartPolicy: Always' "$R/existing-app.yaml" || fail "examples/existing-app: no native sidecar rendered"
say "helm lint + template: helm/examples/existing-app (named templates from a parent chart)"
"$KUBECTL" kustomize deploy/kubernetes >"$R/kustomize-deploy-kubernetes.yaml" || fail "kubectl kustomize deploy/kubernetes"
say "kubectl kustomize deploy/kubernetes ($(grep -c '^kind:' "$R/kustomize-deploy-kubernetes.yaml") objects)"

if want files; then
# ---- 2. kubernetes-validate -------------------------------------------------------------------
manifests=()
for f in deploy/kubernetes/*.yaml; do
  if [[ "$(basename "$f")" == kustomization.yaml ]]; then
    say "kubernetes-validate: skipping $f (a Kustomization, not a Kubernetes object; its output is validated)"
    continue
  fi
  manifests+=("$f")
done
say "kubernetes-validate: skipping PodMonitor, PrometheusRule and HTTPRoute objects (CRDs of the Prometheus Operator and of the Gateway API; Kubernetes' schemas do not have them; tests/it/deploy.rs checks the HTTPRoute, 5b the rules)"
for k in 1.29.0 1.30.0 1.31.0 1.32.0 1.33.0; do
  if ! "$KUBERNETES_VALIDATE" --strict -k "$k" --quiet "$R"/*.yaml "${manifests[@]}" >"$WORK/kv.txt" 2>&1; then
    cat "$WORK/kv.txt"; fail "kubernetes-validate --strict -k $k"
  fi
  if grep -vE 'kind (PodMonitor|PrometheusRule) with api version monitoring.coreos.com/v1|kind HTTPRoute with api version gateway.networking.k8s.io/v1' "$WORK/kv.txt" | grep -q .; then
    cat "$WORK/kv.txt"; fail "kubernetes-validate -k $k: unexpected output"
  fi
  say "kubernetes-validate --strict -k $k: $(ls "$R"/*.yaml | wc -l) renders + ${#manifests[@]} manifests valid"
done

# ---- 3. the plain manifest's sidecar is the chart's --------------------------------------------
"$HELM" template epode-sidecar "$CHART" --set fullnameOverride=epode-sidecar >"$WORK/chart-as-deploy.yaml"
"$PY" - "$WORK/chart-as-deploy.yaml" deploy/kubernetes/deployment.yaml <<'PY' || fail "deploy/kubernetes/deployment.yaml differs from the chart's default render"
import sys, yaml
def deployment(path):
    for doc in yaml.safe_load_all(open(path)):
        if doc and doc.get("kind") == "Deployment":
            return doc
chart, plain = deployment(sys.argv[1]), deployment(sys.argv[2])
cs, ps = chart["spec"]["template"]["spec"], plain["spec"]["template"]["spec"]
diffs = [k for k in ("initContainers", "securityContext", "automountServiceAccountToken",
                     "terminationGracePeriodSeconds", "enableServiceLinks", "volumes")
         if cs.get(k) != ps.get(k)]
for k in ("image", "ports", "lifecycle", "securityContext", "resources", "volumeMounts", "livenessProbe", "readinessProbe"):
    if cs["containers"][0].get(k) != ps["containers"][0].get(k):
        diffs.append("containers[0]." + k)
if chart["spec"]["template"]["metadata"].get("annotations") != plain["spec"]["template"]["metadata"].get("annotations"):
    diffs.append("pod annotations")
if diffs:
    sys.exit("differs in: " + ", ".join(diffs))
PY
say "deploy/kubernetes/deployment.yaml: sidecar, pod security and server container match the chart's default render"

# ---- 4. checkov ---------------------------------------------------------------------------------
SKIPS="$(grep -v '^#' deploy/checkov-skips.txt | awk 'NF {print $1}' | paste -sd, -)"
[[ -n "$SKIPS" ]] || fail "deploy/checkov-skips.txt lists no check"
for id in ${SKIPS//,/ }; do
  grep -q "^| \`$id\` |" docs/deploy.md || fail "docs/deploy.md's checkov table does not list $id (deploy/checkov-skips.txt does)"
done
readme_ids="$(grep -oE '^\| `CKV[A-Z0-9_]+` \|' docs/deploy.md | tr -d '|` ' | sort | paste -sd, -)"
[[ "$readme_ids" == "$(tr ',' '\n' <<<"$SKIPS" | sort | paste -sd, -)" ]] \
  || fail "docs/deploy.md's checkov table ($readme_ids) differs from deploy/checkov-skips.txt ($SKIPS)"
checkov_run() {
  local what="$1"; shift
  if ! "$CHECKOV" --quiet --compact --skip-download --skip-check "$SKIPS" "$@" >"$WORK/checkov.txt" 2>&1; then
    cat "$WORK/checkov.txt"; fail "checkov: $what"
  fi
  say "checkov $what: $(grep -E 'Passed checks' "$WORK/checkov.txt" | sed 's/^ *//' | paste -sd';' -)"
}
checkov_run "helm chart (default values)" -d "$CHART" --framework helm
checkov_run "renders (chart value sets, example parent chart, kustomize)" -d "$R" --framework kubernetes
checkov_run "deploy/kubernetes" -d deploy/kubernetes --framework kubernetes
checkov_run "docker/" -d docker --framework dockerfile

# ---- 5. compose.yaml, the systemd unit ----------------------------------------------------------
if docker compose version >/dev/null 2>&1; then
  COMPOSE=(docker compose)
else
  command -v docker-compose >/dev/null || apt_install docker-compose
  COMPOSE=(docker-compose)
fi
"${COMPOSE[@]}" -f compose.yaml config -q || fail "compose.yaml: ${COMPOSE[*]} config"
say "compose.yaml: valid for ${COMPOSE[*]} ($("${COMPOSE[@]}" version --short 2>/dev/null || true))"
grep -qE 'af_live_[0-9a-fA-F]{32}' compose.yaml deploy/systemd/* && fail "a product key is written in compose.yaml or deploy/systemd"
command -v systemd-analyze >/dev/null || apt_install systemd
# verify checks ExecStart= and the units the service depends on: give it a root holding them.
SD="$WORK/sdroot"
mkdir -p "$SD/usr/local/bin" "$SD/etc/systemd/system" "$SD/etc/epode-sidecar" "$SD/usr/lib/systemd"
cp -a /lib/systemd/system "$SD/usr/lib/systemd/"
printf '#!/bin/sh\n' >"$SD/usr/local/bin/epode-sidecar"; chmod 0755 "$SD/usr/local/bin/epode-sidecar"
cp deploy/systemd/epode-sidecar.service "$SD/etc/systemd/system/"
cp deploy/systemd/epode-sidecar.env "$SD/etc/epode-sidecar/"
if ! systemd-analyze verify --root="$SD" /etc/systemd/system/epode-sidecar.service >"$WORK/sd.txt" 2>&1 || [[ -s "$WORK/sd.txt" ]]; then
  cat "$WORK/sd.txt"; fail "systemd-analyze verify deploy/systemd/epode-sidecar.service"
fi
exposure="$(systemd-analyze security --offline=true --root="$SD" "$SD/etc/systemd/system/epode-sidecar.service" 2>/dev/null | sed -n 's/.*Overall exposure level for epode-sidecar.service: \([0-9.]*\).*/\1/p')"
[[ -n "$exposure" ]] || fail "systemd-analyze security gave no exposure level"
awk -v e="$exposure" 'BEGIN { exit !(e <= 2.0) }' || fail "systemd-analyze security: exposure $exposure > 2.0"
say "deploy/systemd/epode-sidecar.service: systemd-analyze verify clean; security exposure $exposure (of 10; lower is safer)"
# The drop-in for a stdio server run as a user of its own must load with the unit.
mkdir -p "$SD/etc/systemd/system/epode-sidecar.service.d"
cp deploy/systemd/stdio-separated.conf "$SD/etc/systemd/system/epode-sidecar.service.d/"
if ! systemd-analyze verify --root="$SD" /etc/systemd/system/epode-sidecar.service >"$WORK/sd.txt" 2>&1 || [[ -s "$WORK/sd.txt" ]]; then
  cat "$WORK/sd.txt"; fail "systemd-analyze verify with deploy/systemd/stdio-separated.conf"
fi
say "deploy/systemd/stdio-separated.conf: systemd-analyze verify clean with the unit"

# ---- 5b. the operations kit: alerting rules and dashboard -----------------------------------------
# promtool comes with Debian's prometheus package, whose postinst would start the server where
# services can start: a policy-rc.d that forbids it is put in place for the install when there is
# none (Docker images have one; nothing starts the service without systemd either). Only
# promtool is used.
if ! command -v promtool >/dev/null; then
  made_policy=
  if [[ $(id -u) == 0 && ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 0755 /usr/sbin/policy-rc.d && made_policy=1
  fi
  apt_install prometheus || true
  [[ -z "$made_policy" ]] || rm -f /usr/sbin/policy-rc.d
fi
command -v promtool >/dev/null || fail "promtool is missing: install Debian's prometheus package (apt-get install prometheus)"
RULES=deploy/prometheus/epode-sidecar-rules.yaml
RULES_TEST=deploy/prometheus/epode-sidecar-rules.test.yaml
DASHBOARD=deploy/grafana/epode-sidecar-dashboard.json
promtool check rules "$RULES" >"$WORK/promtool.txt" 2>&1 || { cat "$WORK/promtool.txt"; fail "promtool check rules $RULES"; }
(cd "$(dirname "$RULES_TEST")" && promtool test rules "$(basename "$RULES_TEST")") >"$WORK/promtool.txt" 2>&1 \
  || { cat "$WORK/promtool.txt"; fail "promtool test rules $RULES_TEST"; }
say "$RULES: promtool check rules and test rules pass ($(grep -c '^ *- alert:' "$RULES") alerts, $(grep -c '^- name:' "$RULES_TEST") test cases, $(promtool --version 2>&1 | head -1))"
# The dashboard: JSON, its uid and title, and every expression (Grafana's variables given values)
# valid PromQL, checked by promtool as recording rules.
"$PY" - "$DASHBOARD" "$WORK/dashboard-rules.yaml" <<'PY' || fail "$DASHBOARD: not the dashboard expected"
import json, sys
d = json.load(open(sys.argv[1]))
if (d.get("uid"), d.get("title")) != ("epode-sidecar", "epode-sidecar"):
    sys.exit(f"uid {d.get('uid')!r} and title {d.get('title')!r}, not epode-sidecar")
exprs = []
def walk(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("expr", "definition") and isinstance(v, str):
                exprs.append(v)
            else:
                walk(v)
    elif isinstance(node, list):
        for v in node:
            walk(v)
walk(d)
if len(exprs) < 10:
    sys.exit(f"only {len(exprs)} expressions")
def plain(e):
    for var, value in (("$__rate_interval", "5m"), ("$job", ".*"), ("$namespace", ".*"), ("$pod", ".*")):
        e = e.replace(var, value)
    if e.startswith("label_values("):  # Grafana's: label_values(<selector>, <label>)
        e = e[len("label_values("):].rsplit(",", 1)[0]
    return e
rules = [{"record": f"dashboard:expr:{i}", "expr": plain(e)} for i, e in enumerate(exprs)]
json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, open(sys.argv[2], "w"))
PY
promtool check rules "$WORK/dashboard-rules.yaml" >"$WORK/promtool.txt" 2>&1 \
  || { cat "$WORK/promtool.txt"; fail "$DASHBOARD: an expression is not valid PromQL"; }
say "$DASHBOARD: valid JSON, uid and title epode-sidecar, $(grep -o '"record"' "$WORK/dashboard-rules.yaml" | wc -l) expressions valid PromQL"
# The chart's copies (Helm reads no file outside the chart), and what it renders from them.
for f in "$RULES" "$DASHBOARD"; do
  cmp -s "$f" "$CHART/files/$(basename "$f")" || fail "$CHART/files/$(basename "$f") differs from $f: cp $f $CHART/files/"
done
! grep -qE '^kind: PrometheusRule|grafana_dashboard' "$R/chart-default.yaml" || fail "the default render has the PrometheusRule or the dashboard"
"$HELM" template demo "$CHART" -f "$CHART/ci/operations-kit-labels-values.yaml" --set grafana.dashboard.namespace=monitoring \
  >"$WORK/kit.yaml" || fail "helm template -f $CHART/ci/operations-kit-labels-values.yaml --set grafana.dashboard.namespace=monitoring"
"$PY" - "$R/chart-operations-kit-values.yaml" "$WORK/kit.yaml" "$RULES" "$DASHBOARD" "$WORK/rendered-rules.yaml" <<'PY' \
  || fail "the chart's PrometheusRule or dashboard ConfigMap is not the files'"
import json, sys, yaml
def objects(path):
    return {d["kind"]: d for d in yaml.safe_load_all(open(path)) if d}
plain, kit = objects(sys.argv[1]), objects(sys.argv[2])
groups = yaml.safe_load(open(sys.argv[3]))["groups"]
dashboard = json.load(open(sys.argv[4]))
for objs in (plain, kit):
    cm = objs["ConfigMap"]
    assert json.loads(cm["data"]["epode-sidecar-dashboard.json"]) == dashboard, "the ConfigMap's dashboard"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1", "the grafana_dashboard label"
assert "namespace" not in plain["ConfigMap"]["metadata"], "a namespace rendered by default"
assert kit["ConfigMap"]["metadata"]["namespace"] == "monitoring", "grafana.dashboard.namespace"
assert kit["ConfigMap"]["metadata"]["annotations"] == {"grafana_folder": "MCP"}, "grafana.dashboard.annotations"
assert plain["PrometheusRule"]["spec"]["groups"] == groups, "the PrometheusRule's groups are not the rules file's"
assert kit["PrometheusRule"]["metadata"]["labels"]["release"] == "kube-prometheus-stack", "metrics.prometheusRule.labels"
for g, want in zip(kit["PrometheusRule"]["spec"]["groups"], groups):
    for rule, own in zip(g["rules"], want["rules"]):
        assert rule["labels"] == dict(own["labels"], team="payments"), f"additionalLabels: {rule['labels']}"
yaml.safe_dump({"groups": kit["PrometheusRule"]["spec"]["groups"]}, open(sys.argv[5], "w"))
PY
promtool check rules "$WORK/rendered-rules.yaml" >"$WORK/promtool.txt" 2>&1 \
  || { cat "$WORK/promtool.txt"; fail "the chart's PrometheusRule: promtool check rules"; }
say "$CHART/files/: identical to deploy/; the PrometheusRule holds the rules file's groups (additionalLabels on every alert, promtool check rules passes), the ConfigMap the dashboard; neither in the default render"
fi

if want image; then
# ---- 6. the image -------------------------------------------------------------------------------
t0=$SECONDS
# EPODE_CHECK_IMAGE: an image docker/build.sh already built from this tree (CI builds it while
# the tests run); otherwise it is built here.
IMAGE="${EPODE_CHECK_IMAGE:-$(bash docker/build.sh | tail -1)}"
[[ -n "$IMAGE" ]] || fail "docker/build.sh printed no image reference"
docker image inspect "$IMAGE" >/dev/null 2>&1 || fail "no image $IMAGE (EPODE_CHECK_IMAGE names an image docker/build.sh built)"
size="$(docker image inspect -f '{{.Size}}' "$IMAGE")"
# A release image (the dist profile: fat LTO, 15.6 MB) must stay under 20 MB. CI's image holds
# the binary its tests ran (the ci profile: the test build's, unoptimised; about 42 MB
# stripped), so the tests and the image come from one compile: it is held to 64 MB, which
# still catches a dependency that grows the binary by half. Either way the image is the
# binary and nothing else (FROM scratch; its metadata aside).
profile="$(docker image inspect -f '{{index .Config.Labels "ai.epode.build-profile"}}' "$IMAGE")"
case "$profile" in dist) limit=20000000 ;; *) limit=64000000 ;; esac
(( size < limit )) || fail "$IMAGE ($profile profile) is $size bytes, not under $((limit / 1000000)) MB"
cid="$(docker create "$IMAGE")"
docker cp "$cid:/epode-sidecar" "$WORK/image-binary" >/dev/null
docker rm "$cid" >/dev/null
extra=$((size - $(stat -c %s "$WORK/image-binary")))
(( extra < 65536 )) || fail "$IMAGE holds $extra bytes besides its binary (FROM scratch should hold the binary alone)"
say "image $IMAGE ${EPODE_CHECK_IMAGE:+(built while the tests ran) }ready in $((SECONDS - t0)) s: $size bytes ($(awk -v s="$size" 'BEGIN { printf "%.1f MB", s / 1e6 }'), the $profile profile's binary and $extra bytes more; limit $((limit / 1000000)) MB)"
[[ "$(docker image inspect -f '{{.Config.User}}' "$IMAGE")" == "65532:65532" ]] || fail "$IMAGE does not run as 65532:65532"
[[ "$(docker image inspect -f '{{json .Config.Healthcheck.Test}}' "$IMAGE")" == '["CMD","/epode-sidecar","healthcheck"]' ]] \
  || fail "$IMAGE: unexpected HEALTHCHECK"
if docker run --rm --entrypoint /bin/sh "$IMAGE" -c true >/dev/null 2>&1; then fail "$IMAGE has a shell"; fi
say "image: user 65532:65532, HEALTHCHECK [/epode-sidecar healthcheck], no /bin/sh"

# ---- 7. starts here: the pods, as the kubelet runs them (40 s of probing), in the background
# while 6 checks the image. The tools above read the manifests; this runs them. The server's
# image is docker/example-server.Dockerfile with its FROM line swapped for a Python base made
# from this machine's Python with mcp installed (no registry to pull python:… from), built
# with no network.
t0=$SECONDS
PYBASE="$("$PY" scripts/pod-image-python.py --python "$PEERS/py/bin/python" --tag epode-check/python:local)" \
  || fail "scripts/pod-image-python.py: no Python base image"
EXAMPLE_IMAGE=epode-example-server:0.1.0
CTX="$WORK/example-server-context"
mkdir -p "$CTX/examples/python-server"
cp examples/python-server/server.py "$CTX/examples/python-server/"
grep -c '^FROM ' docker/example-server.Dockerfile | grep -qx 1 || fail "docker/example-server.Dockerfile: expected one FROM line"
sed "s|^FROM .*|FROM $PYBASE|" docker/example-server.Dockerfile >"$CTX/Dockerfile"
docker build --quiet --network none -t "$EXAMPLE_IMAGE" "$CTX" >"$WORK/example-build.txt" 2>&1 \
  || { cat "$WORK/example-build.txt"; fail "docker build docker/example-server.Dockerfile (on $PYBASE)"; }
say "example server image $EXAMPLE_IMAGE (docker/example-server.Dockerfile on $PYBASE) in $((SECONDS - t0)) s"
# The same server as a product team's unmodified image would hold it, python:3 style: root (no
# USER), bytecode written beside the code, nothing hardened; the chart's default values must
# run it as they are (upstream.hardened is off).
PY3_IMAGE=epode-check/python3-style-server:local
cat >"$CTX/Dockerfile.python3" <<DOCKERFILE
FROM $PYBASE
RUN python -m pip install "mcp==2.3.0"
WORKDIR /app
COPY examples/python-server/server.py /app/server.py
CMD ["python", "server.py", "--port", "8000"]
DOCKERFILE
docker build --quiet --network none -f "$CTX/Dockerfile.python3" -t "$PY3_IMAGE" "$CTX" >"$WORK/py3-build.txt" 2>&1 \
  || { cat "$WORK/py3-build.txt"; fail "docker build of the python:3-style server image"; }
[[ -z "$(docker image inspect -f '{{.Config.User}}' "$PY3_IMAGE")" ]] || fail "$PY3_IMAGE should run as its base's user (root)"
"$HELM" template demo "$CHART" --set upstream.image.repository=registry.example.com/acme/python3-server \
  --set-string upstream.image.tag=3 >"$R/chart-python3-image.yaml" || fail "helm template (default values, a python:3-style image)"
say "python:3-style server image $PY3_IMAGE (root, unhardened), for the chart's default values"
# A product key of the right shape, made here and never printed (no Epode is reachable from the
# pods' network anyway: it has no way out).
FAKE_KEY="$("$PY" -c 'import secrets; print("af_live_" + secrets.token_hex(16) + "_" + secrets.token_hex(16) + "_" + secrets.token_urlsafe(24))')"
t0=$SECONDS
"$PY" scripts/pod-check.py --seconds "${EPODE_POD_CHECK_SECONDS:-40}" \
  --ready-within "${EPODE_POD_CHECK_READY_WITHIN:-180}" \
  --pod chart="$R/chart-default.yaml" \
  --pod chart-python3-image="$R/chart-python3-image.yaml" \
  --pod chart-hardened="$R/chart-hardened-values.yaml" \
  --pod chart-server-exec-probes="$R/chart-server-exec-probes-values.yaml" \
  --pod chart-classic-sidecar="$R/chart-classic-sidecar-values.yaml" \
  --pod existing-app="$R/existing-app.yaml" \
  --pod deploy-kubernetes=deploy/kubernetes/deployment.yaml \
  --image "epode-sidecar=$IMAGE" --image "registry.example.com/acme/epode-sidecar=$IMAGE" \
  --image "epode-example-server=$EXAMPLE_IMAGE" --image "registry.example.com/acme/orders-mcp=$EXAMPLE_IMAGE" \
  --image "registry.example.com/acme/python3-server=$PY3_IMAGE" \
  --secret "epode-sidecar/api-key=$FAKE_KEY" --secret "orders-epode/api-key=$FAKE_KEY" \
  --secret "orders-epode/product-key=$FAKE_KEY" \
  --infra "$EXAMPLE_IMAGE python -c 'import signal; signal.pause()'" \
  --mcp-call "node $PEERS/ts/ts_call.mjs {url} pin call get_order '{\"order_id\":\"A-1001\"}'" \
  --mcp-expect '"structuredContent":{"order_id":"A-1001","status":"shipped"' \
  >"$WORK/pod-check.txt" 2>&1 &
PODS=$!
PIDS+=("$PODS")
t_pods=$t0


# ---- 6. the image (6a, 6b) ----------------------------------------------------------------------

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# wait_port PORT PID: until PORT accepts a connection, while PID runs (60 s at most: the
# example server imports mcp, which takes 10 s and more on a loaded 2-core machine).
wait_port() {
  local port="$1" pid="$2" deadline=$((SECONDS + 60))
  while (( SECONDS < deadline )); do
    "$PY" -c "import socket,sys; socket.create_connection(('127.0.0.1', $port), 0.2).close()" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
# The example server on the host's loopback; the containers share the host's network namespace,
# so the sidecar reaches it at 127.0.0.1 as it would inside a pod.
UP_PORT="$(free_port)"
"$PEERS/py/bin/python" examples/python-server/server.py --port "$UP_PORT" >"$WORK/server.log" 2>&1 &
PIDS+=($!)
wait_port "$UP_PORT" "${PIDS[-1]}" || { cat "$WORK/server.log"; fail "the example server did not listen on $UP_PORT"; }

# run_sidecar NAME LISTEN_PORT ADMIN_PORT [extra docker args...]
run_sidecar() {
  local name="$1" port="$2" admin="$3"; shift 3
  CONTAINERS+=("$name")
  docker run -d --name "$name" \
    --read-only --user 65532:65532 --cap-drop ALL --security-opt no-new-privileges --network host \
    --health-interval 1s --health-timeout 3s --health-retries 3 --health-start-period 10s \
    -e EPODE_SIDECAR_UPSTREAM="http://127.0.0.1:$UP_PORT/mcp" \
    -e EPODE_SIDECAR_LISTEN="127.0.0.1:$port" \
    -e EPODE_SIDECAR_ADMIN_LISTEN="127.0.0.1:$admin" \
    "$@" "$IMAGE" >/dev/null
}
wait_healthy() {
  local name="$1" i status=
  for i in $(seq 1 60); do
    status="$(docker inspect -f '{{.State.Health.Status}}' "$name")"
    [[ "$status" == healthy ]] && { say "$name: docker health status $status after ~$((i / 2)) s"; return 0; }
    [[ "$(docker inspect -f '{{.State.Running}}' "$name")" == true ]] || break
    sleep 0.5
  done
  docker logs "$name" 2>&1 | tail -20
  fail "$name: health status '$status', not healthy"
}
ts_call() { node "$PEERS/ts/ts_call.mjs" "$1" "$2" call get_order '{"order_id":"A-1001"}'; }
stop_clean() {
  local name="$1" code
  docker stop -t 30 "$name" >/dev/null
  code="$(docker inspect -f '{{.State.ExitCode}}' "$name")"
  [[ "$code" == 0 ]] || { docker logs "$name" 2>&1 | tail -20; fail "$name: exit status $code after SIGTERM (docker stop), not 0"; }
  say "$name: docker stop (SIGTERM) -> exit status 0"
}

# 6a. Production shape: feedback off (no key can reach a real Epode from here).
P1="$(free_port)"; A1="$(free_port)"
C1="epode-check-off-$$"
run_sidecar "$C1" "$P1" "$A1" -e AGENT_FEEDBACK_MODE=off
wait_healthy "$C1"
for mode in pin legacy; do
  out="$(ts_call "http://127.0.0.1:$P1/mcp" "$mode")" || { echo "$out"; fail "TS client ($mode) through $C1"; }
  echo "   ts_call $mode: $out"
  grep -q '"structuredContent":{"order_id":"A-1001","status":"shipped"' <<<"$out" || fail "TS client ($mode): no order in the result"
done
docker exec "$C1" /epode-sidecar healthcheck --ready || fail "$C1: healthcheck --ready (GET /readyz) failed"
metrics="$("$PY" -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$A1/metrics', timeout=5).read().decode())")"
grep -q '^epode_sidecar_requests_total{.*method="tools/call"' <<<"$metrics" || fail "$C1: no tools/call in /metrics"
say "$C1: healthcheck --ready exits 0; /metrics on the admin port counts the tools/call"
stop_clean "$C1"

# 6b. The same image with the feedback binding on: --dev (loopback listener, embedded Epode,
# its record on a tmpfs since the root filesystem is read-only).
P2="$(free_port)"; A2="$(free_port)"
C2="epode-check-dev-$$"
run_sidecar "$C2" "$P2" "$A2" --tmpfs /tmp:rw,size=16m,uid=65532,gid=65532,mode=0700 \
  -e EPODE_SIDECAR_DEV=1 -e EPODE_SIDECAR_DEV_LOG=/tmp/epode-dev.jsonl
wait_healthy "$C2"
out="$(ts_call "http://127.0.0.1:$P2/mcp" pin)" || { echo "$out"; fail "TS client (pin) through $C2"; }
echo "   ts_call pin (--dev): $(head -c 400 <<<"$out")…"
grep -q '\\"state\\":\\"feedback_ready\\"' <<<"$out" || fail "$C2: the result carries no _agentFeedback feedback_ready"
stop_clean "$C2"
docker logs "$C2" 2>&1 | grep -E '"message":"telemetry flushed"' | grep -qE '"delivered":1[,}]' \
  || { docker logs "$C2" 2>&1 | tail -5; fail "$C2: the telemetry event was not delivered to the embedded Epode on shutdown"; }
say "$C2: decorated result (feedback_ready), telemetry event delivered at shutdown"


# ---- 7 ends: the pods' verdict -------------------------------------------------------------------
wait "$PODS" || { cat "$WORK/pod-check.txt"; fail "the pods, run as the kubelet runs them (scripts/pod-check.py)"; }
sed -n '/^== /,$p' "$WORK/pod-check.txt"
say "pods run as the kubelet runs them in $((SECONDS - t_pods)) s"
fi

say "deploy checks ($PARTS) OK in $((SECONDS - started)) s"
