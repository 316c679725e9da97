"""Agent and service settings from random YAML files and ``LINKGUARD_*`` environments:
``load_settings`` raises ConfigError, nothing else."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from fuzz.strategies import json_values, mutated, yaml_scalars
from fuzz.targets import config, linkguard_env, seeds
from linkguard.config import AgentSettings, ConfigError, ServiceSettings, load_settings
from tests.fuzz.profiles import FUZZ

CLASSES = [AgentSettings, ServiceSettings]


def _fields(cls: type) -> list[str]:
    """Top-level settings and ``section__field`` names one level down."""
    out = []
    for name, f in cls.model_fields.items():
        out.append(name)
        sub = getattr(f.annotation, "model_fields", None)
        out += [f"{name}__{s}" for s in sub or ()]
    return out


def _yaml_docs(cls: type) -> st.SearchStrategy[bytes]:
    names = [n for n in _fields(cls) if "__" not in n]
    sections = {n for n, f in cls.model_fields.items() if hasattr(f.annotation, "model_fields")}

    def value(name: str) -> st.SearchStrategy[object]:
        if name in sections:
            sub = list(cls.model_fields[name].annotation.model_fields)
            return st.dictionaries(st.sampled_from(sub), yaml_scalars, max_size=4)
        return yaml_scalars

    doc = st.sampled_from(names).flatmap(lambda n: st.tuples(st.just(n), value(n)))
    return st.one_of(
        st.lists(doc, max_size=5).map(lambda kv: yaml.safe_dump(dict(kv)).encode()),
        yaml_scalars.map(lambda v: yaml.safe_dump(v).encode()),
        st.binary(max_size=128),
    )


def _env(cls: type) -> st.SearchStrategy[dict[str, str]]:
    names = [f"LINKGUARD_{n.upper()}" for n in _fields(cls)] + ["LINKGUARD_NOPE"]
    values = st.one_of(
        st.text(max_size=20),
        json_values(max_leaves=4).map(json.dumps),
        st.sampled_from(["", "null", "[]", "{}", "1e999", "-1", "true", "127.0.0.1:99999"]),
    )
    return st.dictionaries(st.sampled_from(names), values, max_size=3)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_settings_from_random_yaml_and_env(cls: type, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"

    @FUZZ
    @given(_yaml_docs(cls), _env(cls), st.booleans())
    @example(b"bus: {port: 1e999}\n", {}, True)
    @example(b"- a\n- b\n", {}, True)
    @example(b"", {"LINKGUARD_BUS__PORT": "[1, 2]"}, False)
    @example(b"bus: {port: " + b"1" * 5000 + b"}\n", {}, True)  # was ValueError (int limit)
    @example(b"a: " + b"[" * 5000, {}, True)  # was RecursionError out of yaml.safe_load
    def check(text: bytes, env: dict[str, str], with_file: bool) -> None:
        path.write_bytes(text)
        with linkguard_env(env), contextlib.suppress(ConfigError):  # its one documented error
            load_settings(cls, path if with_file else None)

    check()


@FUZZ
@given(st.sampled_from(seeds("config")).flatmap(mutated))
def test_mutated_config_seeds(data: bytes) -> None:
    config(data)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b"bus: {port: " + b"1" * 5000 + b"}\n", "Exceeds the limit"),
        (b"ports: " + b"[" * 5000 + b"]" * 5000, "nested too deeply"),
    ],
    ids=["int-of-5000-digits", "deep-nesting"],
)
def test_regression_unreadable_yaml_is_a_config_error(
    text: bytes, message: str, tmp_path: Path
) -> None:
    """Were ValueError and RecursionError out of yaml.safe_load, not ConfigError."""
    path = tmp_path / "agent.yaml"
    path.write_bytes(text)
    with pytest.raises(ConfigError, match=f"cannot read config {path}: .*{message}"):
        load_settings(AgentSettings, path)
