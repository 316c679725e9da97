"""tools/sizes.py, the size limits of issue 20, on small trees with small limits: what is not
listed must meet the limits, a listed offender may shrink but not grow, and one that meets the
limit must leave the list."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SIZES = Path(__file__).resolve().parents[1] / "tools" / "sizes.py"

#: four statements as ruff counts them (the assignments; ruff 0.17 leaves the return out)
LONG_FUNCTION = "def long(a):\n    b = a\n    c = b\n    d = c\n    e = d\n    return e\n"
#: one statement
SHORT_FUNCTION = "def short(a):\n    b = a\n    return b\n"


def _tree(
    tmp_path: Path,
    files: dict[str, str],
    *,
    modules: str = "",
    functions: str = "",
    ignores: str = "",
) -> Path:
    """A project under ``tmp_path``: limits of 7 lines a module and 3 statements a function,
    source in ``pkg/`` (``tests/`` is not source)."""
    (tmp_path / "pyproject.toml").write_text(
        "[tool.ruff.lint]\n"
        'select = ["PLR0915"]\n'
        "[tool.ruff.lint.pylint]\n"
        "max-statements = 3\n"
        "[tool.ruff.lint.per-file-ignores]\n"
        f'"tests/**" = ["PLR0915"]\n{ignores}'
        "[tool.linkguard.sizes]\n"
        'source = ["pkg"]\n'
        "max-module-lines = 7\n"
        f"[tool.linkguard.sizes.modules]\n{modules}"
        f"[tool.linkguard.sizes.functions]\n{functions}"
    )
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path / "pyproject.toml"


def _run(pyproject: Path) -> tuple[int, list[str]]:
    out = subprocess.run(
        [sys.executable, str(SIZES), "--pyproject", str(pyproject)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert not out.stderr, out.stderr
    return out.returncode, out.stdout.splitlines()[:-1]  # the last line is the summary


def test_within_the_limits_passes_and_non_source_is_not_checked(tmp_path: Path) -> None:
    pyproject = _tree(
        tmp_path,
        {
            "pkg/a.py": SHORT_FUNCTION,
            "pkg/sub/b.py": "x = 1\n" * 7,  # exactly the limit
            "tests/test_x.py": LONG_FUNCTION + "x = 1\n" * 10,
        },
    )
    assert _run(pyproject) == (0, [])


def test_an_unlisted_long_module_or_function_fails(tmp_path: Path) -> None:
    pyproject = _tree(
        tmp_path,
        {
            "pkg/a.py": "x = 1\n" * 8,
            "pkg/b.py": "class K:\n"
            + "".join("    " + line + "\n" for line in LONG_FUNCTION.splitlines()),
        },
    )
    assert _run(pyproject) == (
        1,
        [
            "sizes: pkg/a.py: 8 lines > 7: split it",
            "sizes: pkg/b.py::K.long: 4 statements > 3: split it",
        ],
    )


def test_a_noqa_does_not_hide_a_long_function(tmp_path: Path) -> None:
    text = LONG_FUNCTION.replace("def long(a):", "def long(a):  # noqa: PLR0915")
    pyproject = _tree(tmp_path, {"pkg/a.py": text})
    assert _run(pyproject) == (1, ["sizes: pkg/a.py::long: 4 statements > 3: split it"])


def test_a_listed_offender_may_not_grow(tmp_path: Path) -> None:
    pyproject = _tree(
        tmp_path,
        {"pkg/a.py": LONG_FUNCTION + "x = 1\n" * 3},  # 9 lines
        modules='"pkg/a.py" = 8\n',
        functions='"pkg/a.py::long" = 3\n',
        ignores='"pkg/a.py" = ["PLR0915"]\n',
    )
    assert _run(pyproject) == (
        1,
        [
            "sizes: pkg/a.py: 9 lines > its ceiling 8 in [tool.linkguard.sizes.modules]: split it",
            "sizes: pkg/a.py::long: 4 statements > its ceiling 3 in "
            "[tool.linkguard.sizes.functions]: split it",
        ],
    )


def test_a_listed_offender_at_or_below_its_ceiling_passes(tmp_path: Path) -> None:
    pyproject = _tree(
        tmp_path,
        {"pkg/a.py": LONG_FUNCTION + "x = 1\n" * 3},
        modules='"pkg/a.py" = 10\n',
        functions='"pkg/a.py::long" = 4\n',
        ignores='"pkg/a.py" = ["PLR0915"]\n',
    )
    assert _run(pyproject) == (
        0,
        [
            "sizes: note: pkg/a.py: 9 lines, below its ceiling 10: lower it in "
            "[tool.linkguard.sizes.modules]"
        ],
    )


def test_a_listed_item_that_meets_the_limit_must_leave_the_list(tmp_path: Path) -> None:
    pyproject = _tree(
        tmp_path,
        {"pkg/a.py": SHORT_FUNCTION},
        modules='"pkg/a.py" = 9\n"pkg/gone.py" = 700\n',
        functions='"pkg/a.py::short" = 4\n',
        ignores='"pkg/a.py" = ["PLR0915"]\n',
    )
    code, lines = _run(pyproject)
    assert code == 1
    assert lines == [
        "sizes: pkg/a.py: meets the limit of 7 lines (or no longer exists): remove it from "
        "the list [tool.linkguard.sizes.modules]",
        "sizes: pkg/gone.py: meets the limit of 7 lines (or no longer exists): remove it from "
        "the list [tool.linkguard.sizes.modules]",
        "sizes: pkg/a.py::short: meets the limit of 3 statements (or no longer exists): "
        "remove it from the list [tool.linkguard.sizes.functions]",
    ]


def test_the_ruff_ignores_of_source_files_follow_the_function_list(tmp_path: Path) -> None:
    files = {"pkg/a.py": LONG_FUNCTION, "pkg/b.py": SHORT_FUNCTION}
    listed = '"pkg/a.py::long" = 4\n'
    # the listed function's file must be ignored by name, and only it
    pyproject = _tree(tmp_path, files, functions=listed, ignores='"pkg/b.py" = ["PLR0915"]\n')
    assert _run(pyproject) == (
        1,
        [
            "sizes: pkg/b.py: PLR0915 is ignored for it but it has no function in "
            "[tool.linkguard.sizes.functions]: remove it from [tool.ruff.lint.per-file-ignores]",
            "sizes: pkg/a.py: holds a function of [tool.linkguard.sizes.functions]: add "
            '"pkg/a.py" = ["PLR0915"] to [tool.ruff.lint.per-file-ignores]',
        ],
    )
    # an ignore of a source file that is gone must go too
    ignores = '"pkg/a.py" = ["PLR0915"]\n"pkg/gone.py" = ["PLR0915"]\n'
    pyproject = _tree(tmp_path, files, functions=listed, ignores=ignores)
    assert _run(pyproject) == (
        1,
        [
            "sizes: pkg/gone.py: PLR0915 is ignored for it but there is no such source file: "
            "remove it from [tool.ruff.lint.per-file-ignores]"
        ],
    )
    # a glob over source files (here through the PLR prefix) would hide new long functions
    pyproject = _tree(tmp_path, files, functions=listed, ignores='"pkg/*.py" = ["PLR"]\n')
    code, lines = _run(pyproject)
    assert code == 1
    assert lines[0] == (
        "sizes: [tool.ruff.lint.per-file-ignores] 'pkg/*.py' turns PLR0915 off for source "
        "files: name each file that holds a function of [tool.linkguard.sizes.functions]"
    )


def test_a_missing_setting_exits_2(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.ruff.lint]\n")
    out = subprocess.run(
        [sys.executable, str(SIZES), "--pyproject", str(tmp_path / "pyproject.toml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "KeyError" in out.stderr


def test_the_repository_meets_its_limits() -> None:
    code, lines = _run(SIZES.parents[1] / "pyproject.toml")
    assert code == 0, lines
