"""The extras of pyproject.toml and :mod:`linkguard.extras` agree (issue 23): the base install
is the agent's, every extra-only module is mapped to the extras that really install it, and a
missing one becomes a message naming the extra."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from linkguard.extras import EXTRAS, install_hint, missing_extra_message

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
OPTIONAL: dict[str, list[str]] = PROJECT["optional-dependencies"]
#: import name -> distribution, where they differ (starlette comes with fastapi)
DISTRIBUTION = {"fastapi_offline": "fastapi-offline", "starlette": "fastapi"}


def names(requirements: list[str]) -> set[str]:
    """Distribution names of requirement strings, lower case (``linkguard[...]`` kept whole)."""
    return {
        r if r.startswith("linkguard[") else re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower()
        for r in requirements
    }


def test_each_extra_only_module_is_in_exactly_the_extras_named() -> None:
    for module, extras in EXTRAS.items():
        dist = DISTRIBUTION.get(module, module)
        holding = {e for e, reqs in OPTIONAL.items() if dist in names(reqs)} - {"test"}
        assert holding == set(extras), module


def test_the_base_install_holds_no_extra_only_package() -> None:
    base = names(PROJECT["dependencies"])
    assert base == {
        "pydantic",
        "pydantic-settings",
        "structlog",
        "aiomqtt",
        "pyroute2",
        "pyyaml",
        "prometheus-client",
        "cryptography",
        "defusedxml",
    }
    assert not base & {DISTRIBUTION.get(m, m) for m in EXTRAS}


def test_all_is_every_extra_and_test_pulls_all() -> None:
    assert OPTIONAL["all"] == ["linkguard[service,broker,sim,probes]"]
    assert "linkguard[all]" in OPTIONAL["test"]
    assert {e for es in EXTRAS.values() for e in es} == {"service", "broker", "sim", "probes"}


@pytest.mark.parametrize(
    ("missing", "prefer", "hint"),
    [
        ("networkx", None, "pip install 'linkguard[service]'"),
        ("networkx", "sim", "pip install 'linkguard[sim]'"),
        ("networkx", "broker", "pip install 'linkguard[service]'"),  # broker does not bring it
        ("amqtt.broker", "all", "pip install 'linkguard[all]'"),
        ("scapy.contrib.roce", None, "pip install 'linkguard[probes]'"),
    ],
)
def test_a_missing_module_names_its_extra(missing: str, prefer: str | None, hint: str) -> None:
    assert install_hint(missing, prefer) == hint
    exc = ModuleNotFoundError(f"No module named {missing!r}", name=missing)
    top = missing.split(".")[0]
    expected = (
        f"linkguard x needs the Python package {top!r}, which the base install (the agent's) "
        f"leaves out: {hint}"
    )
    assert missing_extra_message(exc, "linkguard x", prefer) == expected
    # as a daemon's task group raises it
    group = BaseExceptionGroup("tasks", [BaseExceptionGroup("inner", [exc])])
    assert missing_extra_message(group, "linkguard x", prefer) == expected


def test_anything_else_is_not_turned_into_a_message() -> None:
    assert missing_extra_message(ModuleNotFoundError("x", name="pydantic"), "w") is None
    assert missing_extra_message(ModuleNotFoundError("x"), "w") is None
    assert missing_extra_message(ValueError("x"), "w") is None
    mixed = BaseExceptionGroup(
        "tasks", [ModuleNotFoundError("x", name="fastapi"), RuntimeError("boom")]
    )
    assert missing_extra_message(mixed, "w") is None
