#!/usr/bin/env python3
"""The crate's module graph: each top-level module of src/ and the modules it imports with
`use crate::` (or names as `crate::x` anywhere, tests included), then any cycle among them.
Exits 1 when there is a cycle: between top-level modules, or with `--files` between files (CI
runs both). docs/architecture.md's module map is generated from this.

    python3 scripts/module-graph.py [SRC]          # SRC: another tree's src/ (default: this one)
    python3 scripts/module-graph.py --files [SRC]  # the same between files (`use crate::`,
                                                   # `super::`, `self::`, and a declared child
                                                   # module's name resolved to the file that
                                                   # defines the module; tests left out)
"""
import pathlib
import re
import sys

ARGS = [a for a in sys.argv[1:] if a != "--files"]
BY_FILE = "--files" in sys.argv[1:]
SRC = pathlib.Path(ARGS[0]) if ARGS else pathlib.Path(__file__).resolve().parent.parent / "src"
NAME = re.compile(r"crate::([a-z_]+)")
GROUP = re.compile(r"crate::\{([^}]*)\}")


def imports(path):
    files = [path] if path.is_file() else sorted(path.rglob("*.rs"))
    text = "".join(f.read_text() for f in files)
    found = set(NAME.findall(text))
    for group in GROUP.findall(text):
        found |= {g.strip().split("::")[0] for g in group.split(",") if g.strip()}
    return found


PATH = re.compile(r"\b(?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+")
PATH_GROUP = re.compile(r"\b(crate|super|self)((?:::[a-z_][a-z0-9_]*)*)::\{([^}]*)\}")
CHILD = re.compile(r"^\s*(?:pub(?:\([a-z]+\))?\s+)?mod ([a-z_][a-z0-9_]*);", re.M)


def file_graph():
    """Each file's module path (`upstream/stdio` for upstream/stdio/mod.rs) and the files whose
    items it uses; a unit-test module at the end of a file is left out."""
    files = {}
    for f in SRC.rglob("*.rs"):
        parts = list(f.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "mod":
            parts.pop()
        if parts not in (["lib"], ["main"]):
            files[tuple(parts)] = f

    def resolve(at, segs):
        if segs[0] == "crate":
            base, rest = (), segs[1:]
        elif segs[0] == "self":
            base, rest = at, segs[1:]
        else:
            base, rest = at, segs
            while rest and rest[0] == "super":
                base, rest = base[:-1], rest[1:]
        found = base if base in files else None
        for seg in rest:
            base = base + (seg,)
            if base not in files:
                break
            found = base
        return found

    out = {}
    for at, f in files.items():
        text = f.read_text().split("#[cfg(test)]\nmod tests")[0]
        text = re.sub(r"//.*", "", text)  # doc links are no imports
        paths = [m.group(0).split("::") for m in PATH.finditer(text)]
        for head, middle, items in PATH_GROUP.findall(text):
            prefix = [head] + [s for s in middle.split("::") if s]
            paths += [prefix + i.split(" as ")[0].strip().split("::") for i in items.split(",") if i.strip()]
        # A path may also start with the name of a module the file declares (`mod child;`
        # then `child::spawn`, or `use child::{..}`): it is `self::child::spawn`.
        for kid in CHILD.findall(text):
            start = r"(?<![:\w])" + kid
            paths += [["self"] + m.group(0).split("::") for m in re.finditer(start + r"(?:::[A-Za-z_]\w*)+", text)]
            for middle, items in re.findall(start + r"((?:::[a-z_][a-z0-9_]*)*)::\{([^}]*)\}", text):
                prefix = ["self", kid] + [s for s in middle.split("::") if s]
                paths += [prefix + i.split(" as ")[0].strip().split("::") for i in items.split(",") if i.strip()]
        deps = {resolve(at, p) for p in paths} - {None, at, ()}
        out["/".join(at)] = sorted("/".join(d) for d in deps)
    return dict(sorted(out.items()))


if BY_FILE:
    graph = file_graph()
else:
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
