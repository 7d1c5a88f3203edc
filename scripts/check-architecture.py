#!/usr/bin/env python3
"""Keeps docs/architecture.md true to the code (CI runs it):

1. its module map has one row per top-level module of src/, and each row's third column is
   the module's imports exactly as `scripts/module-graph.py` finds them (`--write` rewrites
   the column from the code);
2. every item the page names as `Type::item` or `module::item` (a function, a type, a
   variant, a constant) is defined somewhere in src/: a renamed or removed one fails here,
   naming the line.

    python3 scripts/check-architecture.py [--write]
Exits 1 on a difference, printing each one.
"""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs/architecture.md"
SRC = ROOT / "src"
# Names of other crates the page may mention.
EXTERNAL = {"tokio", "std", "http", "hyper", "serde", "serde_json", "opentelemetry", "rustls"}


def graph():
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts/module-graph.py")],
        capture_output=True, text=True, check=False,
    ).stdout
    g = {}
    for line in out.splitlines():
        if line.startswith("cycles"):
            continue
        m, _, deps = line.partition(": ")
        if m not in ("lib", "main"):
            g[m] = deps.strip() or "(none)"
    return g


ROW = re.compile(r"^\| `([a-z_]+)` \| (.*) \| ([a-z_ ()]*) \|$")


def check_map(text, g, write):
    problems, seen, lines = [], set(), []
    for line in text.split("\n"):
        m = ROW.match(line)
        if m and m.group(1) in g:
            mod = m.group(1)
            seen.add(mod)
            if m.group(3).strip() != g[mod]:
                problems.append(f"the module map's `{mod}` row says it imports `{m.group(3).strip()}`; the code: `{g[mod]}`")
                line = f"| `{mod}` | {m.group(2)} | {g[mod]} |"
        lines.append(line)
    for mod in sorted(set(g) - seen):
        problems.append(f"the module map has no row for `{mod}` (add one: | `{mod}` | what it owns | {g[mod]} |)")
    if write:
        DOC.write_text("\n".join(lines))
        problems = [p for p in problems if "has no row" in p]
    return problems


def defined_names():
    names = set()
    decl = re.compile(r"\b(?:fn|struct|enum|trait|mod|type|const|static)\s+([A-Za-z_][A-Za-z0-9_]*)")
    variant = re.compile(r"^\s*([A-Z][A-Za-z0-9_]*)\s*(?:[,({]|$)", re.M)
    for f in SRC.rglob("*.rs"):
        text = f.read_text()
        names |= set(decl.findall(text))
        names |= set(variant.findall(text))
        names.add(f.stem)
    return names


PATH = re.compile(r"`((?:[A-Za-z_][A-Za-z0-9_]*::)+[A-Za-z_][A-Za-z0-9_]*)(?:\([^`]*\))?`")


def check_names(text):
    names, problems = defined_names(), []
    for n, line in enumerate(text.split("\n"), 1):
        for m in PATH.finditer(line):
            segs = m.group(1).split("::")
            if segs[0] in EXTERNAL or segs[0] in ("crate", "self", "super"):
                continue
            for seg in segs:
                if seg not in names:
                    problems.append(f"docs/architecture.md:{n}: `{m.group(1)}` names `{seg}`, which nothing in src/ defines")
                    break
    return problems


def main():
    write = "--write" in sys.argv[1:]
    text = DOC.read_text()
    problems = check_map(text, graph(), write) + check_names(DOC.read_text())
    for p in problems:
        print(p)
    if problems:
        sys.exit(1)
    print("docs/architecture.md: the module map and the names it gives match the code")


main()
