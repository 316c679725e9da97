"""Check the import layering of the linkguard package with import-linter (CI: every contract
kept). The contracts are ``[tool.importlinter]`` in ``pyproject.toml``.

import-linter finds a package's modules under its directory; setuptools' ``package-dir`` puts
``linkguard.drivers``, ``linkguard.topology`` and ``linkguard.simulations`` elsewhere
(``drivers/``, ``topology/``, ``simulations/``). As :mod:`typecheck` does for mypy, this
builds the installed layout as a tree of symlinks in a temporary directory, runs
``lint-imports --config pyproject.toml`` with that tree first on the import path, removes the
tree and exits with lint-imports' exit code. Extra arguments go to lint-imports. Stdlib only
(lint-imports itself is in the ``test`` extra).

    python tools/layering.py [LINT_IMPORTS_ARGS...]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from typecheck import REPO, build_tree, package_dirs


def main(argv: list[str]) -> int:
    pyproject = REPO / "pyproject.toml"
    tmp = Path(tempfile.mkdtemp(prefix="linkguard-layering-"))
    try:
        build_tree(package_dirs(pyproject), tmp)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(tmp), os.environ.get("PYTHONPATH", "")]),
        }
        lint = Path(sys.executable).with_name("lint-imports")
        cmd = [str(lint), str(pyproject), "--no-cache", *argv]
        return subprocess.run(cmd, cwd=tmp, env=env, check=False).returncode
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
