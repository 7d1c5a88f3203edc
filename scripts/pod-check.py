#!/usr/bin/env python3
"""Runs the pods of rendered Kubernetes manifests as the kubelet would, on the local Docker engine.

For each --pod LABEL=FILE (a render holding one Deployment, StatefulSet, DaemonSet, Job or Pod):

- an infra container (--infra: any local image and a command that waits) holds the pod's
  network namespace, on the run's Docker network (the "pod network": --internal, no way out);
  its address is the pod's address, and every other container joins it
  (--network container:<infra>);
- the init containers in order: a native sidecar (restartPolicy: Always) is started and the
  next one waits for its startupProbe to pass; a plain one must exit 0; then the app containers;
- each container as the pod spec says: image (--image maps a repository to a local image;
  nothing is pulled), command/args, env (secretKeyRef from --secret, fieldRef podIP/name/
  namespace), resources.limits, security context (user, groups, read-only root, capabilities,
  no-new-privileges), emptyDir volumes (tmpfs, shared by the pod's containers); the images'
  own HEALTHCHECKs are off (the kubelet does not run them);
- EVERY probe the spec declares (startup, liveness, readiness; httpGet, tcpSocket, exec) is
  executed from outside the pod's network namespace against the pod's address (exec through
  `docker exec`), at its declared initialDelay/period/timeout/thresholds: liveness and
  readiness wait for the startup probe; a startup or liveness probe that reaches its
  failureThreshold restarts the container, as the kubelet does, and so does a container that
  exits;
- once the pod is ready (else at the run's end), the --mcp-call command is run against
  http://<pod address>:<--mcp-port><--mcp-path> and its output must hold --mcp-expect;
- after --seconds of probing from the app containers' start, once the pod is ready and the MCP
  call done (waiting for that up to --ready-within seconds: a server that imports for long on a
  loaded machine is still starting, not failing), the pod is deleted as the kubelet deletes it: the app containers' preStop hooks then their stop signal, in parallel; when all
  have exited, the native sidecars', in reverse order; all within
  terminationGracePeriodSeconds (a container still running at its end is SIGKILLed).

The pods run at the same time. The check fails when a startup or liveness probe reaches its
failureThreshold (the kubelet restarts the container), a readiness probe reaches it once the
container was ready (the pod leaves its Service), a container exits on its own, the pod is not
ready within --ready-within seconds (readiness failures before a container's first success only mean it is
still starting), the MCP call fails, or a container is SIGKILLed, exits non-zero or out of order
at the pod's deletion.

    pod-check.py --pod chart=render.yaml --image epode-sidecar=epode-sidecar:0.1.0 \\
      --secret epode-sidecar/api-key=af_live_… --infra 'IMAGE python -c "import signal; signal.pause()"' \\
      --mcp-call 'node ts_call.mjs {url} pin call get_order {"order_id":"A-1001"}' --mcp-expect '"status":"shipped"'

Needs PyYAML and the docker CLI. Removes its containers, volumes and networks on exit.
"""
import argparse
import datetime
import http.client
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time

import yaml

PROBE_DEFAULTS = {"initialDelaySeconds": 0, "periodSeconds": 10, "timeoutSeconds": 1,
                  "successThreshold": 1, "failureThreshold": 3}
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "Pod")
DOCKER = shutil.which("docker") or "docker"
PRINT = threading.Lock()


class PodError(Exception):
    """A pod spec this check cannot run as written (or a local image is missing)."""


def docker(*args, timeout=60, check=True, env=None):
    r = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout, env=env)
    if check and r.returncode != 0:
        raise PodError(f"docker {' '.join(args[:3])}…: {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout.strip()


# ---- quantities, images, env ---------------------------------------------------------------------

def quantity(q):
    """A Kubernetes quantity ("256Mi", "1", "100m", "1G") as a float."""
    m = re.fullmatch(r"([0-9.]+)(m|k|M|G|T|Ki|Mi|Gi|Ti)?", str(q))
    if not m:
        raise PodError(f"unsupported quantity {q!r}")
    scale = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
             "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}[m.group(2)]
    return float(m.group(1)) * scale


def repository(image):
    name = image.split("@")[0]
    head, _, tail = name.rpartition(":")
    return head if head and "/" not in tail else name


def local_image(image, mapping):
    local = mapping.get(image) or mapping.get(repository(image)) or image
    if docker("image", "inspect", "-f", "{{.Id}}", local, check=False) == "":
        raise PodError(f"image {image} (local {local}) is not on this Docker engine; nothing is pulled: "
                       f"build it, or map it with --image {repository(image)}=LOCAL")
    return local


def expand(s, env):
    """Kubernetes' $(VAR) expansion in command and args ($$ escapes)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), s)


# ---- probes -------------------------------------------------------------------------------------

class Probe:
    """One probe of one container, executed in its own thread, as the kubelet's prober does."""

    def __init__(self, container, kind, spec):
        self.c, self.kind = container, kind
        self.spec = {**PROBE_DEFAULTS, **{k: v for k, v in spec.items()}}
        self.handler = next((h for h in ("httpGet", "tcpSocket", "exec", "grpc") if h in spec), None)
        if self.handler in (None, "grpc"):
            raise PodError(f"{container.name}: {kind}Probe: unsupported handler ({sorted(spec)})")
        self.successes = self.failures = self.streak_fail = self.streak_ok = 0
        self.first_success = None
        self.last_error = ""

    @property
    def name(self):
        return f"{self.c.name} {self.kind}Probe"

    def port(self, port):
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        if port not in self.c.ports:
            raise PodError(f"{self.name}: no container port named {port!r}")
        return self.c.ports[port]

    def describe(self):
        s, ip = self.spec[self.handler], self.c.pod.ip
        if self.handler == "httpGet":
            host = s.get("host") or ip
            return f"GET {s.get('scheme', 'HTTP').lower()}://{host}:{self.port(s['port'])}{s.get('path', '/')}"
        if self.handler == "tcpSocket":
            return f"tcp {s.get('host') or ip}:{self.port(s['port'])}"
        return "exec " + json.dumps(s["command"])

    def execute(self):
        """(ok, detail) of one probe, bounded by timeoutSeconds."""
        timeout = max(1, int(self.spec["timeoutSeconds"]))
        s = self.spec[self.handler]
        try:
            if self.handler == "tcpSocket":
                socket.create_connection((s.get("host") or self.c.pod.ip, self.port(s["port"])), timeout).close()
                return True, ""
            if self.handler == "httpGet":
                return self.http(s, timeout)
            r = subprocess.run([DOCKER, "exec", self.c.docker_name, *s["command"]],
                               capture_output=True, text=True, timeout=timeout)
            tail = (r.stderr.strip() or r.stdout.strip()).splitlines()[-1:] or [""]
            return r.returncode == 0, f"exit status {r.returncode} {tail[0][:160]}".strip()
        except subprocess.TimeoutExpired:
            return False, f"timed out after {timeout} s"
        except OSError as e:
            return False, e.strerror or str(e)
        except http.client.HTTPException as e:
            return False, f"{type(e).__name__}: {e}"

    def http(self, s, timeout):
        host, port = s.get("host") or self.c.pod.ip, self.port(s["port"])
        if s.get("scheme", "HTTP").upper() == "HTTPS":
            conn = http.client.HTTPSConnection(host, port, timeout=timeout,
                                               context=ssl._create_unverified_context())  # noqa: S323 (the kubelet does not verify)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
        headers = {"User-Agent": "kube-probe/1.33", "Accept": "*/*"}
        headers.update({h["name"]: h["value"] for h in s.get("httpHeaders", [])})
        try:
            conn.request("GET", s.get("path", "/"), headers=headers)
            resp = conn.getresponse()
            body = resp.read(1024).decode(errors="replace").strip()
        finally:
            conn.close()
        return 200 <= resp.status < 400, f"HTTP {resp.status} {body[:160]}".strip()

    def active(self):
        if self.kind == "startup":
            return self.c.running and not self.c.started.is_set()
        return self.c.started.is_set()

    def loop(self):
        pod, next_t, gen = self.c.pod, None, None
        while not pod.stop_probing.is_set():
            if not self.active() or gen != self.c.generation:
                gen, next_t = self.c.generation, None
                self.streak_fail = self.streak_ok = 0
                pod.stop_probing.wait(0.05)
                continue
            if next_t is None:
                next_t = max(time.monotonic(), self.c.started_at + self.spec["initialDelaySeconds"])
            if pod.stop_probing.wait(max(0.0, next_t - time.monotonic())):
                return
            ok, detail = self.execute()
            if gen == self.c.generation and not pod.stop_probing.is_set():
                self.record(ok, detail)
            next_t = max(next_t + self.spec["periodSeconds"], time.monotonic())

    def record(self, ok, detail):
        pod, threshold = self.c.pod, self.spec["failureThreshold"]
        if ok:
            self.successes += 1
            self.streak_ok, self.streak_fail = self.streak_ok + 1, 0
            if self.first_success is None:
                self.first_success = pod.now()
            if self.kind == "startup":
                pod.log(f"{self.name} passed ({self.describe()}): {self.c.name} started")
                self.c.mark_started()
            elif self.kind == "readiness" and self.streak_ok >= self.spec["successThreshold"]:
                self.c.set_ready(True)
            return
        self.failures += 1
        self.streak_fail, self.streak_ok = self.streak_fail + 1, 0
        self.last_error = detail
        starting = " (not ready yet: starting)" if self.kind == "readiness" and self.c.ready_at is None else ""
        pod.log(f"{self.name} failed {self.streak_fail}/{threshold}{starting}: {self.describe()}: {detail}")
        if self.streak_fail < threshold:
            return
        if self.kind == "readiness":
            # Before its first success a container is simply not ready yet (it is starting):
            # the run's end tells whether it ever became ready. After it, this takes the pod
            # out of its Service's endpoints.
            if self.streak_fail == threshold and self.c.ready_at is not None:
                pod.violation(f"{self.name} reached its failureThreshold ({threshold}): {self.c.name} is no longer ready")
            self.c.set_ready(False)
        else:
            pod.violation(f"{self.name} reached its failureThreshold ({threshold}): the kubelet restarts {self.c.name}")
            self.c.restart()


# ---- containers ------------------------------------------------------------------------------------

class Container:
    def __init__(self, pod, spec, role):
        self.pod, self.spec, self.role = pod, spec, role  # role: sidecar (native), init, app
        self.name = spec["name"]
        self.docker_name = f"{pod.prefix}-{self.name}"
        self.ports = {p["name"]: int(p["containerPort"]) for p in spec.get("ports", []) if p.get("name")}
        self.probes = [Probe(self, k, spec[f"{k}Probe"]) for k in ("startup", "liveness", "readiness")
                       if spec.get(f"{k}Probe")]
        for p in self.probes:
            p.describe()  # a port name the container does not declare fails here, not in a thread
        self.started = threading.Event()
        self.lock = threading.Lock()
        self.generation = self.restarts = 0
        self.running = self.ready = self.terminating = False
        self.started_at = time.monotonic()
        self.ready_at = None
        self.stop = {}

    def has(self, kind):
        return any(p.kind == kind for p in self.probes)

    def run_args(self):
        p, s = self.pod, self.spec
        image = local_image(s["image"], p.args.image_map)
        args = ["run", "-d", "--name", self.docker_name, "--network", f"container:{p.infra}",
                "--no-healthcheck"]
        args += security_args(p.spec.get("securityContext") or {}, s.get("securityContext") or {}, image)
        limits = (s.get("resources") or {}).get("limits") or {}
        if "memory" in limits:
            args += ["--memory", str(int(quantity(limits["memory"])))]
        if "cpu" in limits:
            args += ["--cpus", f"{quantity(limits['cpu']):g}"]
        env_pairs, secret_env = p.env(self)
        for k, v in env_pairs:
            args += ["-e", f"{k}={v}"]
        for k in secret_env:
            args += ["-e", k]
        args += p.mounts(self)
        if s.get("workingDir"):
            args += ["-w", s["workingDir"]]
        values = dict(env_pairs)
        cmd = [expand(a, values) for a in s.get("command") or []]
        tail = [expand(a, values) for a in s.get("args") or []]
        if cmd:
            args += ["--entrypoint", cmd[0]]
            tail = cmd[1:] + tail
        return args + [image] + tail, secret_env

    def run(self):
        args, secret_env = self.run_args()
        docker(*args, env={**os.environ, **secret_env})
        probes = ", ".join(f"{p.kind} {p.describe()} every {p.spec['periodSeconds']} s" for p in self.probes)
        self.pod.log(f"{self.role} container {self.name} running ({probes or 'no probes'})")
        self.mark_running()

    def mark_running(self):
        self.running, self.started_at = True, time.monotonic()
        if not self.has("startup"):
            self.mark_started()

    def mark_started(self):
        """Started: liveness and readiness probing begins; without a readiness probe, ready."""
        self.started.set()
        if not self.has("readiness"):
            self.set_ready(True)

    def set_ready(self, ready):
        if ready and not self.ready:
            self.ready_at = self.ready_at or self.pod.now()
            self.pod.log(f"{self.name} ready")
        self.ready = ready

    def restart(self, reason="", exited=False):
        """What the kubelet does to a container whose liveness/startup probe gave up, or that exited."""
        with self.lock:
            if self.terminating:
                return
            self.generation += 1
            self.restarts += 1
            self.started.clear()
            self.running = self.ready = False
            grace = self.pod.grace
            self.pod.log(f"{self.name}: restart #{self.restarts}{' (' + reason + ')' if reason else ''}")
            if exited:
                docker("start", self.docker_name, check=False)
            else:
                docker("restart", "-t", str(grace), self.docker_name, timeout=grace + 30, check=False)
            self.mark_running()


def security_args(pod_sc, sc, image):
    """docker run flags for a pod's and a container's securityContext."""
    user = sc.get("runAsUser", pod_sc.get("runAsUser"))
    group = sc.get("runAsGroup", pod_sc.get("runAsGroup"))
    args = []
    if user is not None:
        args += ["--user", f"{user}:{group}" if group is not None else str(user)]
    elif group is not None:
        raise PodError("runAsGroup without runAsUser is not supported here")
    if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
        uid = str(user) if user is not None else docker("image", "inspect", "-f", "{{.Config.User}}", image).split(":")[0]
        if not uid.isdigit() or uid == "0":
            raise PodError(f"runAsNonRoot: the user of {image} is {uid or 'root'!r}; the kubelet refuses "
                           "to start it (it must be a non-zero numeric UID)")
    for g in [pod_sc.get("fsGroup")] + list(pod_sc.get("supplementalGroups") or []):
        if g is not None:
            args += ["--group-add", str(g)]
    if sc.get("readOnlyRootFilesystem"):
        args.append("--read-only")
    if sc.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    if sc.get("privileged"):
        args.append("--privileged")
    caps = sc.get("capabilities") or {}
    args += [f"--cap-drop={c}" for c in caps.get("drop") or []]
    args += [f"--cap-add={c}" for c in caps.get("add") or []]
    seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type", "RuntimeDefault")
    if seccomp == "Unconfined":
        args += ["--security-opt", "seccomp=unconfined"]
    elif seccomp != "RuntimeDefault":
        raise PodError(f"seccompProfile {seccomp} is not supported here")
    return args


# ---- the pod -------------------------------------------------------------------------------------

class Pod:
    def __init__(self, label, path, args):
        self.label, self.path, self.args = label, path, args
        self.name, self.spec = load_pod(path)
        self.prefix = f"epode-pod-{os.getpid()}-{re.sub(r'[^a-zA-Z0-9_.-]', '-', label)}"
        self.network, self.infra = args.network, f"{self.prefix}-infra"
        self.grace = int(self.spec.get("terminationGracePeriodSeconds", 30))
        self.ip = None
        self.t0 = time.monotonic()
        self.stop_probing = threading.Event()
        self.violations, self.events = [], []
        self.volumes = {}
        self.mcp = None
        init = self.spec.get("initContainers") or []
        self.containers = [Container(self, c, "sidecar" if c.get("restartPolicy") == "Always" else "init")
                           for c in init]
        self.containers += [Container(self, c, "app") for c in self.spec["containers"]]
        self.threads = []

    def now(self):
        return time.monotonic() - self.t0

    def log(self, msg):
        line = f"[{self.label} +{self.now():5.1f}s] {msg}"
        self.events.append(line)
        with PRINT:
            print(line, flush=True)

    def violation(self, msg):
        self.violations.append(f"+{self.now():.1f}s {msg}")
        self.log("FAIL: " + msg)

    def env(self, c):
        """([(name, value)], {name: secret value}) of a container's env; secrets reach docker by env."""
        pairs, secret = [], {}
        if c.spec.get("envFrom"):
            raise PodError(f"{c.name}: envFrom is not supported here")
        fields = {"status.podIP": self.ip, "metadata.name": self.name, "metadata.namespace": "default",
                  "spec.serviceAccountName": self.spec.get("serviceAccountName", "default")}
        for e in c.spec.get("env") or []:
            src = e.get("valueFrom")
            if src is None:
                pairs.append((e["name"], expand(str(e.get("value", "")), dict(pairs))))
            elif "secretKeyRef" in src:
                ref = src["secretKeyRef"]
                key = f"{ref['name']}/{ref['key']}"
                if key in self.args.secrets:
                    secret[e["name"]] = self.args.secrets[key]
                elif not ref.get("optional"):
                    raise PodError(f"{c.name}: env {e['name']} needs Secret {key}: give it with --secret {key}=VALUE")
            elif "fieldRef" in src and src["fieldRef"]["fieldPath"] in fields:
                pairs.append((e["name"], fields[src["fieldRef"]["fieldPath"]]))
            else:
                raise PodError(f"{c.name}: env {e['name']}: valueFrom {sorted(src)} is not supported here")
        return pairs, secret

    def mounts(self, c):
        vols = {v["name"]: v for v in self.spec.get("volumes") or []}
        args = []
        for m in c.spec.get("volumeMounts") or []:
            v = vols.get(m["name"])
            if v is None or "emptyDir" not in v:
                raise PodError(f"{c.name}: volume {m['name']}: only emptyDir volumes are supported here")
            if m["name"] not in self.volumes:
                size = (v["emptyDir"] or {}).get("sizeLimit")
                opts = "mode=1777" + (f",size={int(quantity(size))}" if size else "")
                name = f"{self.prefix}-{m['name']}"
                docker("volume", "create", "--driver", "local", "--opt", "type=tmpfs", "--opt", "device=tmpfs",
                       "--opt", f"o={opts}", name)
                self.volumes[m["name"]] = name
            ro = ",readonly" if m.get("readOnly") else ""
            args += ["--mount", f"type=volume,src={self.volumes[m['name']]},dst={m['mountPath']}{ro}"]
        return args

    # -- start --

    def start(self):
        image, *cmd = shlex.split(self.args.infra)
        docker("run", "-d", "--name", self.infra, "--network", self.network, "--hostname", self.name[:63],
               "--no-healthcheck", "--read-only", "--cap-drop=ALL", "--security-opt", "no-new-privileges",
               "--user", "65532:65532", *(["--entrypoint", cmd[0]] if cmd else []), image, *cmd[1:])
        self.ip = docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", self.infra)
        self.log(f"pod {self.name} from {self.path}: address {self.ip}")
        for c in self.containers:
            if c.role == "app":
                continue
            if c.role == "init":
                self.log(f"init container {c.name}: running to completion")
                args, secret_env = c.run_args()
                args.remove("-d")
                code = subprocess.run([DOCKER, *args], env={**os.environ, **secret_env}, capture_output=True).returncode
                if code != 0:
                    raise PodError(f"init container {c.name} exited {code}")
                continue
            self.start_container(c)
            if not c.started.wait(self.args.seconds):
                raise PodError(f"native sidecar {c.name} did not start (startupProbe) within {self.args.seconds} s")
        self.app_start = time.monotonic()
        for c in self.containers:
            if c.role == "app":
                self.start_container(c)

    def start_container(self, c):
        c.run()
        for p in c.probes:
            t = threading.Thread(target=p.loop, daemon=True)
            t.start()
            self.threads.append(t)

    def pod_ready(self):
        return all(c.ready or (not c.has("readiness") and c.running) for c in self.containers if c.role != "init")

    def watch(self):
        """Until the run's end: containers that exit on their own, the MCP call. The run ends
        --seconds after the app containers' start once the MCP call is done, else when the pod
        has had --ready-within seconds to get ready."""
        observed = self.app_start + self.args.seconds
        deadline = self.app_start + max(self.args.seconds, self.args.ready_within)
        while True:
            # As a Service sends traffic: once the pod is ready (else at the run's end).
            if self.mcp is None and self.pod_ready():
                self.mcp_call()
            self.check_exits()
            now = time.monotonic()
            if now >= deadline or (now >= observed and self.mcp is not None):
                break
            time.sleep(2)
        if self.mcp is None:
            self.mcp_call()
        self.log(f"the run ends at +{time.monotonic() - self.app_start:.1f}s of the app containers' start")
        if not self.pod_ready():
            why = []
            for c in self.containers:
                p = next((p for p in c.probes if p.kind == "readiness"), None)
                if c.role != "init" and not c.ready:
                    why.append(f"{c.name} ({p.failures} readiness failures, {p.successes} successes, last: "
                               f"{p.describe()}: {p.last_error})" if p else c.name)
            self.violation(f"the pod is not ready {time.monotonic() - self.app_start:.0f} s after its app "
                           "containers' start: " + "; ".join(why))
            self.sockets = self.namespaces()

    def namespaces(self):
        """Each running container's network namespace and the TCP ports listening in it, read on the
        host from /proc (the images may hold no tools): what a pod that never got ready shows."""
        lines = []
        for name in [self.infra] + [c.docker_name for c in self.containers if c.role != "init" and c.running]:
            pid = docker("inspect", "-f", "{{.State.Pid}}", name, check=False)
            try:
                ns = os.readlink(f"/proc/{pid}/ns/net")
                listening = sorted({a for t in ("tcp", "tcp6") for a in listeners(f"/proc/{pid}/net/{t}")})
                lines.append(f"{name.removeprefix(self.prefix + '-')}: pid {pid}, {ns}, listening: "
                             + (", ".join(listening) or "nothing"))
            except (OSError, ValueError) as e:
                lines.append(f"{name.removeprefix(self.prefix + '-')}: pid {pid!r}: {e}")
        return lines

    def check_exits(self):
        live = {c.docker_name: c for c in self.containers if c.role != "init" and c.running}
        if not live:
            return
        out = docker("inspect", "-f", "{{.Name}} {{.State.Running}} {{.State.ExitCode}}", *live, check=False)
        for line in out.splitlines():
            name, running, code = line.lstrip("/").split()
            c = live.get(name)
            if c and running == "false" and c.running and not c.terminating and not c.lock.locked():
                self.violation(f"{c.name} exited on its own (status {code}): the kubelet restarts it")
                c.restart("it exited", exited=True)

    def mcp_call(self):
        port = next((c.ports[self.args.mcp_port] for c in self.containers if self.args.mcp_port in c.ports), None)
        if port is None or not self.args.mcp_call:
            self.mcp = "skipped (no --mcp-call or no port named %s)" % self.args.mcp_port
            return
        url = f"http://{self.ip}:{port}{self.args.mcp_path}"
        cmd = [a.replace("{url}", url) for a in shlex.split(self.args.mcp_call)]
        state = "ready" if self.pod_ready() else "NOT ready"
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        out = (r.stdout + r.stderr).strip()
        if r.returncode == 0 and self.args.mcp_expect in out:
            self.mcp = f"ok at +{self.now():.1f}s (pod {state}): {url}"
            self.log(f"MCP call through the pod address {url}: ok: {out[:240]}")
        else:
            self.mcp = f"FAILED at +{self.now():.1f}s"
            self.violation(f"MCP call through {url} (pod {state}) failed (exit {r.returncode}): {out[-400:]}")

    # -- delete --

    def delete(self):
        """The pod's deletion: app containers first, then native sidecars in reverse order.

        Times are wall-clock seconds from the deletion's start; a container's exit is the
        engine's FinishedAt (the docker CLI may return late on a loaded machine)."""
        self.stop_probing.set()
        for c in self.containers:
            c.terminating = True
        t0 = time.time()
        self.log(f"deleting the pod (terminationGracePeriodSeconds {self.grace})")
        apps = [threading.Thread(target=self.stop_container, args=(c, t0)) for c in self.containers if c.role == "app"]
        for t in apps:
            t.start()
        for t in apps:
            t.join()
        last_app = max((c.stop.get("exited", 0) for c in self.containers if c.role == "app"), default=0)
        for c in reversed([c for c in self.containers if c.role == "sidecar"]):
            self.stop_container(c, t0)
            if c.stop.get("signal", 0) < last_app:
                self.violation(f"{c.name} was stopped before the app containers had exited")
        self.drain = max((c.stop.get("exited", 0) for c in self.containers), default=0)
        self.log(f"pod deleted in {self.drain:.1f} s (of {self.grace})")

    def stop_container(self, c, t0):
        deadline = t0 + self.grace
        if docker("inspect", "-f", "{{.State.Running}}", c.docker_name, check=False) != "true":
            self.violation(f"{c.name} was not running when its turn to stop came")
            return
        hook = (c.spec.get("lifecycle") or {}).get("preStop") or {}
        if "sleep" in hook:
            time.sleep(max(0.0, min(float(hook["sleep"]["seconds"]), deadline - time.time())))
        elif "exec" in hook:
            subprocess.run([DOCKER, "exec", c.docker_name, *hook["exec"]["command"]], capture_output=True,
                           timeout=max(1.0, deadline - time.time()))
        elif hook:
            raise PodError(f"{c.name}: preStop {sorted(hook)} is not supported here")
        c.stop["signal"] = time.time() - t0
        remaining = max(1, math.ceil(deadline - time.time()))
        docker("stop", "-t", str(remaining), c.docker_name, timeout=remaining + 60)
        code, finished = docker("inspect", "-f", "{{.State.ExitCode}} {{.State.FinishedAt}}", c.docker_name).split()
        c.stop["code"], c.stop["exited"] = int(code), wall(finished) - t0
        pre = f"preStop {next(iter(hook))} then " if hook else ""
        self.log(f"{c.name}: {pre}stop signal at +{c.stop['signal']:.1f}s, exited {code} "
                 f"at +{c.stop['exited']:.1f}s of the deletion")
        if c.stop["code"] == 137 or c.stop["exited"] > self.grace:
            self.violation(f"{c.name} was SIGKILLed at the end of terminationGracePeriodSeconds ({self.grace} s)")
        elif c.stop["code"] != 0:
            self.violation(f"{c.name} exited {code} on its stop signal, not 0")

    def cleanup(self):
        self.stop_probing.set()
        names = [c.docker_name for c in self.containers] + [self.infra]
        if self.violations or self.args.logs:
            for c in self.containers:
                r = subprocess.run([DOCKER, "logs", "--tail", "15", c.docker_name], capture_output=True, text=True)
                tail = (r.stdout + r.stderr).strip()
                if tail:
                    with PRINT:
                        print(f"[{self.label}] last lines of {c.name}'s log:\n  " + tail.replace("\n", "\n  "))
        docker("rm", "-f", *names, check=False, timeout=120)
        if self.volumes:
            docker("volume", "rm", "-f", *self.volumes.values(), check=False)


def listeners(path):
    """The listening sockets of a /proc/PID/net/tcp{,6} table, as address:port."""
    found = []
    with open(path) as f:
        next(f)
        for row in f:
            local, state = row.split()[1], row.split()[3]
            if state != "0A":  # TCP_LISTEN
                continue
            addr, port = local.split(":")
            raw = bytes.fromhex(addr)
            # Each 32-bit word is in host (little-endian) order.
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
            found.append(f"{socket.inet_ntop(family, raw)}:{int(port, 16)}")
    return found


def wall(stamp):
    """An engine timestamp (RFC 3339, nanoseconds, UTC) as seconds since the epoch."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?Z", stamp)
    if not m:
        raise PodError(f"unexpected engine timestamp {stamp!r}")
    whole = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc)
    return whole.timestamp() + float("0." + (m.group(2) or "0"))


def load_pod(path):
    found = []
    for doc in yaml.safe_load_all(open(path)):
        if doc and doc.get("kind") in WORKLOADS:
            spec = doc["spec"] if doc["kind"] == "Pod" else doc["spec"]["template"]["spec"]
            found.append((doc["metadata"]["name"], spec))
    if len(found) != 1:
        raise PodError(f"{path}: {len(found)} workloads (Deployment, Pod, …), expected exactly one")
    return found[0]


# ---- the run --------------------------------------------------------------------------------------

def run_pod(pod):
    try:
        pod.start()
        pod.watch()
        pod.delete()
    except (PodError, subprocess.SubprocessError, OSError) as e:
        pod.violation(f"{type(e).__name__}: {e}")


def summary(pod):
    lines = [f"== {pod.label}: {pod.name} ({pod.path}), address {pod.ip}"]
    for c in pod.containers:
        restarts = f", {c.restarts} restart(s)" if c.restarts else ", no restart"
        ready = f"ready at +{c.ready_at:.1f}s" if c.ready_at is not None else "never ready"
        lines.append(f"   {c.role:7} {c.name}: {ready}{restarts}; exit {c.stop.get('code', '-')} at "
                     f"+{c.stop.get('exited', 0):.1f}s of the deletion")
        for p in c.probes:
            first = f"first success +{p.first_success:.1f}s" if p.first_success is not None else "no success"
            last = f"; last failure: {p.last_error}" if p.failures else ""
            lines.append(f"     {p.kind:9} {p.describe()} (period {p.spec['periodSeconds']} s, failureThreshold "
                         f"{p.spec['failureThreshold']}): {p.successes} ok, {p.failures} failed, {first}{last}")
        if not c.probes:
            lines.append("     no probes")
    lines += [f"   netns  {line}" for line in getattr(pod, "sockets", [])]
    lines.append(f"   MCP call: {pod.mcp}")
    lines.append(f"   deletion: {getattr(pod, 'drain', 0):.1f} s of terminationGracePeriodSeconds {pod.grace}")
    lines += [f"   FAIL {v}" for v in pod.violations]
    return "\n".join(lines)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pod", action="append", required=True, metavar="LABEL=FILE")
    ap.add_argument("--image", action="append", default=[], metavar="REPOSITORY=LOCAL_IMAGE")
    ap.add_argument("--secret", action="append", default=[], metavar="NAME/KEY=VALUE")
    ap.add_argument("--infra", required=True, metavar="'IMAGE [COMMAND ARGS…]'",
                    help="the infra (pause) container: a local image and a command that waits")
    ap.add_argument("--seconds", type=float, default=60, help="probing time from the app containers' start")
    ap.add_argument("--ready-within", type=float, default=180,
                    help="how long the pod may take to get ready (and the MCP call to be made) from the app "
                         "containers' start; the run then ends at the later of this and --seconds")
    ap.add_argument("--mcp-call", default="", help="a command; {url} is replaced by the pod's MCP URL")
    ap.add_argument("--mcp-expect", default="", help="a string the command's output must hold")
    ap.add_argument("--mcp-port", default="mcp", help="the container port (name) of the MCP endpoint")
    ap.add_argument("--mcp-path", default="/mcp")
    ap.add_argument("--logs", action="store_true", help="print the containers' last log lines (always on a failure)")
    args = ap.parse_args()
    args.image_map = dict(i.split("=", 1) for i in args.image)
    args.secrets = dict(s.split("=", 1) for s in args.secret)
    return args


def main():
    args = parse_args()
    started = time.monotonic()
    args.network = f"epode-pods-{os.getpid()}"
    try:
        pods = [Pod(*p.split("=", 1), args) for p in args.pod]
    except (PodError, OSError, yaml.YAMLError) as e:
        print(f"pod-check: error: {e}", file=sys.stderr)
        return 2
    # Stopped from outside (SIGTERM, Ctrl-C): the finally below still removes what was made.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    threads = [threading.Thread(target=run_pod, args=(p,), daemon=True) for p in pods]
    docker("network", "create", "--internal", args.network)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for p in pods:
            p.cleanup()
        docker("network", "rm", args.network, check=False)
    print("\n".join(summary(p) for p in pods))
    failed = [p.label for p in pods if p.violations]
    print(f"pod-check: {len(pods) - len(failed)} of {len(pods)} pods held in {time.monotonic() - started:.0f} s"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
