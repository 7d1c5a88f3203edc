#!/usr/bin/env python3
"""Where a run's allocations were made: the sites of a dhat heap file (tests/allocs.rs
--sites) by count, each as its first frames past the allocator's own.

    bench/allocs-sites.py target/allocs-decorated.json [how many, 25] [frames each, 6]
"""
import json
import re
import sys

SKIP = re.compile(
    r"dhat::|__rust_|alloc::alloc::|alloc::raw_vec|<alloc::|alloc::vec::|alloc::string::|"
    r"alloc::boxed::|core::ops::function|std::alloc|hashbrown::raw|<core::"
)


def name(frame):
    # "0x560a: path::to::fn (file:line:col)" -> "path::to::fn"
    text = frame.split(": ", 1)[-1]
    text = re.sub(r" \(\?\?\?:0:0\)$", "", text)
    return re.sub(r"::h[0-9a-f]{16}$", "", text)


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    depth = int(sys.argv[3]) if len(sys.argv) > 3 else 6
    data = json.load(open(path))
    frames = data["ftbl"]
    sites = {}
    for pp in data["pps"]:
        names = [name(frames[i]) for i in pp["fs"]]
        kept = [n for n in names if not SKIP.search(n) and n != "[root]"][:depth]
        key = " <- ".join(kept) or "(allocator only)"
        blocks, size = sites.get(key, (0, 0))
        sites[key] = (blocks + pp["tbk"], size + pp["tb"])
    total = sum(b for b, _ in sites.values())
    print(f"{path}: {total} allocations in all")
    for key, (blocks, size) in sorted(sites.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{blocks:>9} {size:>11} B  {key}")


main()
