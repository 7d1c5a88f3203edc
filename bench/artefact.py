#!/usr/bin/env python3
"""The benchmarks' artefact: every raw figure of one `bench/run`, with the build it measured.

    bench/artefact.py assemble OUT --binary PATH name=report.json ...
        One JSON file: the commit (and whether the tree had changes), the measured binary's
        SHA-256 and size, the machine, each benchmark's whole report (its raw per-slice
        figures included, unfavourable rows and failures kept), and a checksum over all of it.
    bench/artefact.py table FILE
        Checks the checksum, then prints the README's tables from the artefact (Markdown).
"""
import datetime
import hashlib
import json
import os
import platform
import subprocess
import sys


def canonical(doc):
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def checksum(doc):
    body = {k: v for k, v in doc.items() if k != "checksum"}
    return "sha256:" + hashlib.sha256(canonical(body)).hexdigest()


def git(*args):
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def assemble(argv):
    out, rest = argv[0], argv[1:]
    binary, reports = None, {}
    while rest:
        if rest[0] == "--binary":
            binary, rest = rest[1], rest[2:]
            continue
        name, path = rest[0].split("=", 1)
        rest = rest[1:]
        with open(path) as f:
            reports[name] = json.load(f)
    doc = {
        "artefact": "epode-sidecar benchmarks (bench/run)",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git("rev-parse", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "command": os.environ.get("EPODE_BENCH_COMMAND", "bench/run"),
        "machine": {"cores": os.cpu_count(), "cpu": cpu_model(), "kernel": platform.release()},
        "benches": reports,
    }
    if binary:
        with open(binary, "rb") as f:
            data = f.read()
        doc["binary"] = {"path": binary, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    doc["checksum"] = checksum(doc)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    failures = [f"{n}: {x}" for n, r in reports.items() for x in r.get("failures") or []]
    print(f"bench: artefact {out} ({doc['checksum']})", file=sys.stderr)
    for x in failures:
        print(f"bench: NOT A RESULT: {x}", file=sys.stderr)


def ratio(a, b):
    return f"{a / b:.2f}×" if a is not None and b else "n/a"


def num(v, fmt="{:.0f}"):
    return "n/a" if v is None else fmt.format(v)


def overhead_table(report):
    lines = [
        "| scenario | c | direct p50 µs | added p50 µs: nginx / sidecar | rps: nginx / sidecar (ratio) "
        "| CPU µs per request: nginx / sidecar (ratio) |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["scenarios"]:
        n, s = r.get("nginx") or {}, r["sidecar"]
        added = r["added_p50_us"]
        lines.append(
            f"| {r['name']} | {r['concurrency']} | {num(r['direct']['p50_us'])} "
            f"| {num(added.get('nginx'))} / {num(added['sidecar'])} "
            f"| {num(n.get('rps'))} / {num(s['rps'])} ({ratio(s['rps'], n.get('rps'))}) "
            f"| {num(n.get('cpu_us_per_request'), '{:.1f}')} / {num(s['cpu_us_per_request'], '{:.1f}')} "
            f"({ratio(s['cpu_us_per_request'], n.get('cpu_us_per_request'))}) |"
        )
    return lines


def stdio_table(report):
    lines = ["| stdio tools/call | c | p50 µs | added p50 µs | rps | ratio to the pipe |", "|---|---|---|---|---|---|"]
    direct = {r["concurrency"]: r for r in report["rows"] if r["name"].startswith("direct")}
    for r in report["rows"]:
        d = direct.get(r["concurrency"], {})
        lines.append(
            f"| {r['name']} | {r['concurrency']} | {num(r['p50_us'])} | {num(r['added_p50_us'])} "
            f"| {num(r['rps'])} | {ratio(r['rps'], d.get('rps'))} |"
        )
    return lines


def table(argv):
    with open(argv[0]) as f:
        doc = json.load(f)
    if doc.get("checksum") != checksum(doc):
        sys.exit(f"bench: {argv[0]}: the checksum does not match its figures (edited by hand?)")
    benches = doc["benches"]
    dirty = " (with uncommitted changes)" if doc.get("dirty") else ""
    print(f"From `{argv[0]}`: commit {str(doc.get('commit'))[:12]}{dirty}, "
          f"{doc['machine']['cores']} cores, {doc['created']}, {doc.get('command')}; "
          f"binary sha256 {doc.get('binary', {}).get('sha256', 'n/a')[:16]}…\n")
    if "overhead" in benches:
        print("\n".join(overhead_table(benches["overhead"])))
        print()
    if "stdio" in benches:
        print("\n".join(stdio_table(benches["stdio"])))
        print()
    failures = [f"{n}: {x}" for n, r in benches.items() for x in r.get("failures") or []]
    for x in failures:
        print(f"**Not a result**: {x}")


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("assemble", "table"):
        sys.exit(__doc__)
    {"assemble": assemble, "table": table}[sys.argv[1]](sys.argv[2:])
