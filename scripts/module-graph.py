#!/usr/bin/env python3
"""The crate's module graph: each top-level module of src/ and the modules it imports with
`use crate::` (or names as `crate::x` anywhere, tests included), then any cycle among them.
Exits 1 when there is a cycle. docs/architecture.md's module map is generated from this.

    python3 scripts/module-graph.py [SRC]     # SRC: another tree's src/ (default: this one)
"""
import pathlib
import re
import sys

SRC = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent / "src"
NAME = re.compile(r"crate::([a-z_]+)")
GROUP = re.compile(r"crate::\{([^}]*)\}")


def imports(path):
    files = [path] if path.is_file() else sorted(path.rglob("*.rs"))
    text = "".join(f.read_text() for f in files)
    found = set(NAME.findall(text))
    for group in GROUP.findall(text):
        found |= {g.strip().split("::")[0] for g in group.split(",") if g.strip()}
    return found


modules = {p.stem if p.is_file() else p.name: p for p in SRC.iterdir() if p.suffix == ".rs" or p.is_dir()}
graph = {m: sorted(imports(p) - {m}) for m, p in sorted(modules.items())}
for m, deps in graph.items():
    print(f"{m}: {' '.join(deps)}")

# Strongly connected components (Tarjan): any with more than one module is a cycle.
index, low, stack, on, cycles = {}, {}, [], set(), []


def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in graph.get(v, []):
        if w not in index:
            visit(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        scc = []
        while True:
            w = stack.pop()
            on.discard(w)
            scc.append(w)
            if w == v:
                break
        if len(scc) > 1:
            cycles.append(sorted(scc))


for v in graph:
    if v not in index:
        visit(v)
print("cycles:", "; ".join(" <-> ".join(c) for c in cycles) if cycles else "none")
sys.exit(1 if cycles else 0)
