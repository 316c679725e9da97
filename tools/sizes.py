"""Check the size limits of the source (CI: no module over the line limit, no function over the
statement limit, except the listed offenders, none of which may grow).

The limits and the allow-lists are in ``pyproject.toml``:

- functions: ruff's ``too-many-statements`` (PLR0915) at ``[tool.ruff.lint.pylint]
  max-statements``. ``ruff check .`` enforces it everywhere except where
  ``[tool.ruff.lint.per-file-ignores]`` turns it off; this script runs PLR0915 again with no
  per-file ignore and no ``# noqa`` (``ruff check --isolated --ignore-noqa``), so ruff does the
  counting and the allow-list below decides what may exceed it;
- modules: ``[tool.linkguard.sizes] max-module-lines`` (ruff has no module-length rule: its
  pylint ``too-many-lines``, C0302, is not implemented); a module's lines are what
  ``str.splitlines`` counts (``wc -l`` for a file that ends with a newline);
- ``[tool.linkguard.sizes] source``: the directories checked (every ``*.py`` below them);
- ``[tool.linkguard.sizes.modules]`` (``"path" = lines``) and ``[tool.linkguard.sizes.functions]``
  (``"path::Qualified.name" = statements``): today's offenders, each with its size as a ceiling.

Fails (exit 1, one line per problem) when a module or function that is not listed exceeds its
limit; when a listed one exceeds its ceiling; when a listed one meets the limit now or no longer
exists ("remove it from the list", so the lists only shrink); and when the PLR0915 per-file
ignores of source files are not exactly the files of the listed functions (a per-file ignore
would otherwise let a new long function into a listed file pass ``ruff check``; the ceilings
here still hold it). A listed item that shrank but still exceeds the limit passes, with a note
naming its new size. Exit 2 for a configuration this script cannot read. Stdlib only; runs ruff
as ``python -m ruff`` (ruff is in the ``test`` extra).

    python tools/sizes.py [--pyproject PATH]
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import json
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RULE = "PLR0915"
_COUNT = re.compile(r"\((\d+) > \d+\)")


class ConfigError(Exception):
    """``pyproject.toml`` lacks a setting or has one of the wrong type."""


@dataclass(frozen=True)
class Limits:
    """What ``pyproject.toml`` sets: paths are relative to its directory, with ``/``."""

    source: tuple[str, ...]
    max_module_lines: int
    max_statements: int
    modules: dict[str, int]
    functions: dict[str, int]
    ignored: dict[str, list[str]]  # [tool.ruff.lint.per-file-ignores]


def _int_table(table: object, name: str) -> dict[str, int]:
    if not isinstance(table, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in table.values()
    ):
        raise ConfigError(f"{name}: a table of integer ceilings")
    return dict(table)


def load_limits(pyproject: Path) -> Limits:
    """The limits and allow-lists of ``pyproject``; ConfigError when one is missing."""
    try:
        tool = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]
        sizes = tool["linkguard"]["sizes"]
        lint = tool["ruff"]["lint"]
        max_statements = lint["pylint"]["max-statements"]
        max_lines = sizes["max-module-lines"]
        source = sizes["source"]
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError) as exc:
        raise ConfigError(f"{pyproject}: {type(exc).__name__}: {exc}") from None
    if not isinstance(max_statements, int) or not isinstance(max_lines, int):
        raise ConfigError("max-statements and max-module-lines: integers")
    if not isinstance(source, list) or not all(isinstance(s, str) for s in source):
        raise ConfigError("[tool.linkguard.sizes] source: a list of directories")
    return Limits(
        source=tuple(s.rstrip("/") for s in source),
        max_module_lines=max_lines,
        max_statements=max_statements,
        modules=_int_table(sizes.get("modules", {}), "[tool.linkguard.sizes.modules]"),
        functions=_int_table(sizes.get("functions", {}), "[tool.linkguard.sizes.functions]"),
        ignored=dict(lint.get("per-file-ignores", {})),
    )


def source_files(root: Path, source: tuple[str, ...]) -> list[str]:
    """Every ``*.py`` under the source directories, as ``dir/.../x.py`` relative to ``root``."""
    out: list[str] = []
    for d in source:
        out += [p.relative_to(root).as_posix() for p in (root / d).rglob("*.py")]
    return sorted(out)


def module_lines(root: Path, files: list[str]) -> dict[str, int]:
    return {f: len((root / f).read_text(encoding="utf-8").splitlines()) for f in files}


def _qualnames(tree: ast.AST) -> dict[int, str]:
    """Line of each ``def`` -> its dotted name (``Class.method``, ``outer.inner``)."""
    out: dict[int, str] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    out[child.lineno] = name
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def long_functions(root: Path, files: list[str], max_statements: int) -> dict[str, int]:
    """``path::name`` -> statements, for every function over ``max_statements`` in ``files``
    (ruff's PLR0915, without per-file ignores or ``# noqa``)."""
    if not files:
        return {}
    cmd = [
        sys.executable,
        "-m",
        "ruff",
        "check",
        "--isolated",
        "--ignore-noqa",
        "--no-cache",
        "--select",
        RULE,
        "--config",
        f"lint.pylint.max-statements={max_statements}",
        "--output-format",
        "json",
        "--exit-zero",
        *files,
    ]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ConfigError(f"ruff failed ({proc.returncode}): {proc.stderr.strip()}")
    out: dict[str, int] = {}
    names: dict[str, dict[int, str]] = {}
    for d in json.loads(proc.stdout):
        path = Path(d["filename"]).resolve().relative_to(root.resolve()).as_posix()
        m = _COUNT.search(d["message"])
        if d["code"] != RULE or m is None:
            raise ConfigError(f"unexpected ruff diagnostic: {d['code']} {d['message']}")
        if path not in names:
            names[path] = _qualnames(ast.parse((root / path).read_text(encoding="utf-8")))
        row = d["location"]["row"]
        key = f"{path}::{names[path].get(row, f'line {row}')}"
        out[key] = max(out.get(key, 0), int(m[1]))
    return out


def check_listed(
    kind: str, measured: dict[str, int], listed: dict[str, int], limit: int, unit: str
) -> tuple[list[str], list[str]]:
    """Problems and notes for one kind (modules or functions): ``measured`` holds every item
    over ``limit``; ``listed`` the allow-list with ceilings."""
    table = f"[tool.linkguard.sizes.{kind}]"
    problems: list[str] = []
    notes: list[str] = []
    for item, size in sorted(measured.items()):
        ceiling = listed.get(item)
        if ceiling is None:
            problems.append(f"{item}: {size} {unit} > {limit}: split it")
        elif size > ceiling:
            problems.append(f"{item}: {size} {unit} > its ceiling {ceiling} in {table}: split it")
        elif size < ceiling:
            notes.append(f"{item}: {size} {unit}, below its ceiling {ceiling}: lower it in {table}")
    for item in sorted(set(listed) - set(measured)):
        problems.append(
            f"{item}: meets the limit of {limit} {unit} (or no longer exists): "
            f"remove it from the list {table}"
        )
    return problems, notes


def check_ignores(limits: Limits, files: list[str]) -> list[str]:
    """The PLR0915 per-file ignores of source files must be exactly the listed functions'
    files, each named by its path (a glob over source files would hide new long functions)."""
    want = {key.split("::", 1)[0] for key in limits.functions}
    problems: list[str] = []
    exact: set[str] = set()
    for pattern, codes in limits.ignored.items():
        if not any(code == "ALL" or RULE.startswith(code) for code in codes):
            continue
        if pattern in files:
            exact.add(pattern)
        elif pattern.split("/", 1)[0] in limits.source and not any(c in pattern for c in "*?["):
            problems.append(
                f"{pattern}: {RULE} is ignored for it but there is no such source file: remove "
                "it from [tool.ruff.lint.per-file-ignores]"
            )
        elif any(fnmatch.fnmatch(f, pattern) for f in files):
            problems.append(
                f"[tool.ruff.lint.per-file-ignores] {pattern!r} turns {RULE} off for source "
                "files: name each file that holds a function of [tool.linkguard.sizes.functions]"
            )
    for f in sorted(exact - want):
        problems.append(
            f"{f}: {RULE} is ignored for it but it has no function in "
            "[tool.linkguard.sizes.functions]: remove it from [tool.ruff.lint.per-file-ignores]"
        )
    for f in sorted(want - exact):
        problems.append(
            f"{f}: holds a function of [tool.linkguard.sizes.functions]: add "
            f'"{f}" = ["{RULE}"] to [tool.ruff.lint.per-file-ignores]'
        )
    return problems


def check(root: Path, limits: Limits) -> tuple[list[str], list[str]]:
    """(problems, notes) of the source under ``root``."""
    files = source_files(root, limits.source)
    lines = module_lines(root, files)
    long_modules = {f: n for f, n in lines.items() if n > limits.max_module_lines}
    problems, notes = check_listed(
        "modules", long_modules, limits.modules, limits.max_module_lines, "lines"
    )
    p, n = check_listed(
        "functions",
        long_functions(root, files, limits.max_statements),
        limits.functions,
        limits.max_statements,
        "statements",
    )
    return problems + p + check_ignores(limits, files), notes + n


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pyproject", type=Path, default=REPO / "pyproject.toml")
    args = ap.parse_args(argv)
    root = args.pyproject.resolve().parent
    try:
        limits = load_limits(args.pyproject)
        problems, notes = check(root, limits)
    except ConfigError as exc:
        print(f"sizes: {exc}", file=sys.stderr)
        return 2
    for line in notes:
        print(f"sizes: note: {line}")
    for line in problems:
        print(f"sizes: {line}")
    listed = len(limits.modules) + len(limits.functions)
    print(
        f"sizes: {len(problems)} problem(s); limits {limits.max_module_lines} lines a module, "
        f"{limits.max_statements} statements a function; {listed} listed offender(s)"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
