"""Type-check the whole linkguard package with mypy (CI: zero errors).

setuptools' ``package-dir`` puts ``linkguard.drivers``, ``linkguard.topology`` and
``linkguard.simulations`` in ``drivers/``, ``topology/`` and ``simulations/``; mypy cannot follow
that mapping. This script reads the mapping from ``pyproject.toml``, builds the installed package
layout as a tree of symlinks in a temporary directory, runs ``python -m mypy -p <package>`` there
with the repository's ``pyproject.toml`` as the config, prints mypy's output with the paths mapped
back to the repository's (``linkguard/topology/x.py`` -> ``topology/x.py``), removes the tree and
exits with mypy's exit code. Extra arguments go to mypy. Stdlib only.

    python tools/typecheck.py [MYPY_ARGS...]
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SUFFIXES = (".py", ".pyi")


def package_dirs(pyproject: Path) -> dict[str, Path]:
    """Each package of ``[tool.setuptools] packages`` -> its source directory (absolute)."""
    setup = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]
    mapping: dict[str, str] = setup.get("package-dir", {})
    out: dict[str, Path] = {}
    for pkg in setup["packages"]:
        # setuptools: the nearest mapped ancestor's directory plus the rest of the dotted name
        parts = pkg.split(".")
        for n in range(len(parts), -1, -1):
            head = ".".join(parts[:n])
            if n == 0 or head in mapping:
                base = mapping.get(head, "") if n else mapping.get("", "")
                out[pkg] = (REPO / base).joinpath(*parts[n:]).resolve()
                break
    return out


def build_tree(pkgs: dict[str, Path], root: Path) -> dict[str, str]:
    """Symlink each package's own modules into ``root`` as installed; the path map back."""
    back: dict[str, str] = {}
    for pkg, src in sorted(pkgs.items()):
        dest = root.joinpath(*pkg.split("."))
        dest.mkdir(parents=True, exist_ok=True)
        for f in sorted(src.iterdir()):
            if f.is_file() and (f.suffix in SUFFIXES or f.name == "py.typed"):
                os.symlink(f, dest / f.name)
        rel_dest = dest.relative_to(root).as_posix() + "/"
        back[rel_dest] = os.path.relpath(src, REPO).replace(os.sep, "/") + "/"
    return back


def map_line(line: str, back: dict[str, str]) -> str:
    """``linkguard/topology/x.py:3: error: ...`` -> ``topology/x.py:3: error: ...``."""
    m = re.match(r"([^:\s]+\.pyi?)(:.*)?$", line, re.DOTALL)
    if not m:
        return line
    path = m.group(1)
    # the longest package directory that holds the file directly (subpackages are entries too)
    head, _, name = path.rpartition("/")
    src = back.get(head + "/")
    if src is None:
        return line
    return (src if src != "./" else "") + name + line[m.end(1) :]


def main(argv: list[str]) -> int:
    pyproject = REPO / "pyproject.toml"
    pkgs = package_dirs(pyproject)
    top = sorted({p.split(".")[0] for p in pkgs})
    tmp = Path(tempfile.mkdtemp(prefix="linkguard-typecheck-"))
    try:
        back = build_tree(pkgs, tmp)
        cmd = [sys.executable, "-m", "mypy", "--config-file", str(pyproject)]
        for p in top:
            cmd += ["-p", p]
        proc = subprocess.Popen(
            [*cmd, *argv], cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert proc.stdout is not None  # stdout=PIPE
        for line in proc.stdout:
            sys.stdout.write(map_line(line, back))
        return proc.wait()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
