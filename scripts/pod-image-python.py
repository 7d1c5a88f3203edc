#!/usr/bin/env python3
"""A Python base image made FROM scratch out of this machine's Python, for the pod check.

No registry can be pulled from here, so docker/example-server.Dockerfile's base
(python:3.12-slim-bookworm) is out of reach; scripts/check-deploy.sh builds that Dockerfile with
its FROM line swapped for this image. This builds a stand-in: the interpreter of a venv
(its base prefix: binary, libpython, standard library without tests and GUI modules), the venv's
site-packages (the peers' venv has mcp and pip, so the Dockerfile's `pip install "mcp==…"` finds
it satisfied and needs no network), every shared library they link (from ldd), and /bin/sh (the
Dockerfile's RUN). `docker import` turns the tree into an image; nothing is pulled.

    pod-image-python.py --python .peers/py/bin/python --tag epode-check/python:local

Prints the tag. An image of that tag built from the same files (a label holds their digest) is
kept as it is.
"""
import argparse
import hashlib
import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile

SKIP_STDLIB = {"site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3"}
LABEL = "ai.epode.check.python-files"


def venv_layout(python):
    """(base prefix, X.Y, the venv's site-packages) of the interpreter PYTHON."""
    code = (
        "import sys, sysconfig; print(sys.base_prefix); "
        "print('%d.%d' % sys.version_info[:2]); print(sysconfig.get_paths()['purelib'])"
    )
    out = subprocess.run([python, "-c", code], check=True, capture_output=True, text=True).stdout
    prefix, version, site = out.split("\n")[:3]
    return prefix, version, site


def tree(root, skip_top=()):
    """Every file under ROOT (relative paths), leaving out SKIP_TOP and config-* at the top."""
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel == ".":
            dirnames[:] = [d for d in dirnames if d not in skip_top and not d.startswith("config-")]
        for f in filenames:
            path = os.path.join(dirpath, f)
            if os.path.exists(path):
                yield os.path.normpath(os.path.join(rel, f))


def plan(python):
    """{path in the image: path on this machine} for the interpreter and its packages."""
    prefix, version, site = venv_layout(python)
    lib = f"{prefix}/lib/python{version}"
    files = {}
    real_bin = os.path.realpath(f"{prefix}/bin/python{version}")
    files[f"{prefix}/bin/python{version}"] = real_bin
    for rel in tree(lib, SKIP_STDLIB):
        files[f"{lib}/{rel}"] = f"{lib}/{rel}"
    for rel in tree(site):
        files[f"{lib}/site-packages/{rel}"] = f"{site}/{rel}"
    shell = os.path.realpath("/bin/sh")
    files["/bin/sh"] = shell
    return prefix, version, files


def elf_deps(paths):
    """The shared libraries (and the loader) that the ELF files among PATHS load, by ldd."""
    deps = set()
    pattern = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x")
    for p in paths:
        with open(p, "rb") as f:
            if f.read(4) != b"\x7fELF":
                continue
        out = subprocess.run(["ldd", p], capture_output=True, text=True).stdout
        for line in out.splitlines():
            m = pattern.search(line)
            if m:
                deps.add(m.group(1))
    return deps


def digest(files):
    h = hashlib.sha256()
    for dst in sorted(files):
        st = os.stat(files[dst])
        h.update(f"{dst}\0{st.st_size}\0{int(st.st_mtime)}\n".encode())
    return h.hexdigest()[:32]


def existing_label(tag):
    r = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{index .Config.Labels \"%s\"}}" % LABEL, tag],
        capture_output=True, text=True,
    )
    return r.stdout.strip() if r.returncode == 0 else ""


def add_dirs(tar, path, seen):
    parts = path.strip("/").split("/")[:-1]
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        if d not in seen:
            seen.add(d)
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)


def add_file(tar, dst, src, seen):
    add_dirs(tar, dst, seen)
    st = os.stat(src)
    info = tarfile.TarInfo(dst.lstrip("/"))
    info.size, info.mtime = st.st_size, int(st.st_mtime)
    # Readable by any user (the containers run as 65532); executables stay executable.
    info.mode = 0o755 if st.st_mode & 0o111 else 0o644
    with open(src, "rb") as f:
        tar.addfile(info, f)


def add_text(tar, dst, text, seen, mode=0o644):
    add_dirs(tar, dst, seen)
    data = text.encode()
    info = tarfile.TarInfo(dst.lstrip("/"))
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def write_tar(path, prefix, version, files):
    seen = set()
    with tarfile.open(path, "w") as tar:
        for dst in sorted(files):
            add_file(tar, dst, files[dst], seen)
        for name in ("python", "python3"):
            add_dirs(tar, f"/usr/local/bin/{name}", seen)
            link = tarfile.TarInfo(f"usr/local/bin/{name}")
            link.type, link.linkname = tarfile.SYMTYPE, f"{prefix}/bin/python{version}"
            tar.addfile(link)
        tmp = tarfile.TarInfo("tmp")
        tmp.type, tmp.mode = tarfile.DIRTYPE, 0o1777
        tar.addfile(tmp)
        add_text(tar, "/etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnonroot:x:65532:65532::/tmp:/bin/sh\n", seen)
        add_text(tar, "/etc/group", "root:x:0:\nnonroot:x:65532:\n", seen)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", required=True, help="a venv's python (its packages go in)")
    ap.add_argument("--tag", required=True)
    args = ap.parse_args()
    prefix, version, files = plan(args.python)
    for lib in elf_deps(list(files.values())):
        files.setdefault(lib, os.path.realpath(lib))
    key = digest(files)
    if existing_label(args.tag) == key:
        print(f"pod-image-python: {args.tag} is up to date ({len(files)} files)", file=sys.stderr)
        print(args.tag)
        return
    with tempfile.TemporaryDirectory() as d:
        tar_path = os.path.join(d, "rootfs.tar")
        write_tar(tar_path, prefix, version, files)
        size = os.path.getsize(tar_path)
        subprocess.run(
            ["docker", "import",
             "--change", "ENV PATH=/usr/local/bin:/usr/bin:/bin",
             "--change", "ENV LANG=C.UTF-8",
             "--change", f"LABEL {LABEL}={key}",
             tar_path, args.tag],
            check=True, stdout=subprocess.DEVNULL,
        )
    print(f"pod-image-python: {args.tag}: Python {version} from {prefix}, "
          f"{len(files)} files, {size / 1e6:.0f} MB", file=sys.stderr)
    print(args.tag)


if __name__ == "__main__":
    main()
