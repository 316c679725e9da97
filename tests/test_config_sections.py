"""Settings in sections (routes, rails_socket, verbs, solve): every old flat key, in the YAML
file and in the environment, still gives its value to the new key, with a DeprecatedSetting
warning and a ``deprecated_setting`` log event naming both; giving the old and the new key is
an error naming both; the sections' own variables nest with ``__``."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from linkguard.config import (
    AgentSettings,
    ConfigError,
    DeprecatedSetting,
    ServiceSettings,
    load_settings,
)

#: (role, old flat key, a value, the new dotted key, the value the new key then holds)
RENAMES: list[tuple[type, str, str, str, object]] = [
    (AgentSettings, "route_table", "77", "routes.table", 77),
    (AgentSettings, "rule_priority", "1234", "routes.rule_priority", 1234),
    (AgentSettings, "apply_routes", "false", "routes.apply", False),
    (AgentSettings, "rails_socket", "/run/r.sock", "rails_socket.path", Path("/run/r.sock")),
    (AgentSettings, "rails_socket_group", "gpu-jobs", "rails_socket.group", "gpu-jobs"),
    (AgentSettings, "rails_socket_queue", "64", "rails_socket.queue", 64),
    (AgentSettings, "verbs_events", "off", "verbs.events", "off"),
    (AgentSettings, "verbs_python", "/opt/python3", "verbs.python", Path("/opt/python3")),
    (AgentSettings, "verbs_reader", "/opt/reader.py", "verbs.reader", Path("/opt/reader.py")),
    (ServiceSettings, "solve_initial_delay_ms", "5", "solve.initial_ms", 5.0),
    (ServiceSettings, "debounce_ms", "40", "solve.short_ms", 40.0),
    (ServiceSettings, "solve_long_delay_ms", "900", "solve.long_ms", 900.0),
    (ServiceSettings, "solve_time_to_learn_ms", "400", "solve.time_to_learn_ms", 400.0),
    (ServiceSettings, "solve_holddown_ms", "2000", "solve.holddown_ms", 2000.0),
]  # fmt: skip


def _get(settings: object, dotted: str) -> Any:
    for part in dotted.split("."):
        settings = getattr(settings, part)
    return settings


def _env(dotted: str) -> str:
    return "LINKGUARD_" + dotted.replace(".", "__").upper()


def _yaml(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "cfg.yaml"
    p.write_text(text)
    return p


def _load(cls: type, path: Path | None) -> tuple[Any, list[str], list[dict[str, Any]]]:
    """The settings, the DeprecatedSetting messages and the deprecated_setting events."""
    with warnings.catch_warnings(record=True) as caught, capture_logs() as logs:
        warnings.simplefilter("always")
        settings = load_settings(cls, path)
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecatedSetting)]
    return settings, messages, [e for e in logs if e["event"] == "deprecated_setting"]


@pytest.mark.parametrize(("cls", "old", "text", "new", "value"), RENAMES)
def test_an_old_key_in_the_file_sets_the_new_one_with_a_warning(
    cls: type, old: str, text: str, new: str, value: object, tmp_path: Path
) -> None:
    settings, messages, events = _load(cls, _yaml(tmp_path, f"{old}: {text}\n"))
    assert _get(settings, new) == value
    assert messages == [f"{old} is deprecated; use {new}"]
    assert [(e["old"], e["new"], e["log_level"]) for e in events] == [(old, new, "warning")]
    assert new in events[0]["hint"]


@pytest.mark.parametrize(("cls", "old", "text", "new", "value"), RENAMES)
def test_an_old_variable_sets_the_new_key_with_a_warning(
    cls: type, old: str, text: str, new: str, value: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(_env(old), text)
    settings, messages, events = _load(cls, None)
    assert _get(settings, new) == value
    assert messages == [f"{_env(old)} is deprecated; use {_env(new)}"]
    assert [(e["old"], e["new"]) for e in events] == [(_env(old), _env(new))]


@pytest.mark.parametrize(("cls", "old", "text", "new", "value"), RENAMES)
def test_the_new_key_and_its_variable_load_without_a_warning(
    cls: type,
    old: str,
    text: str,
    new: str,
    value: object,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    section, key = new.split(".")
    settings, messages, events = _load(cls, _yaml(tmp_path, f"{section}:\n  {key}: {text}\n"))
    assert (_get(settings, new), messages, events) == (value, [], [])
    monkeypatch.setenv(_env(new), text)
    settings, messages, events = _load(cls, None)
    assert (_get(settings, new), messages, events) == (value, [], [])


@pytest.mark.parametrize(("cls", "old", "text", "new", "value"), RENAMES)
def test_the_old_and_the_new_key_together_are_refused_naming_both(
    cls: type,
    old: str,
    text: str,
    new: str,
    value: object,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    section, key = new.split(".")
    both = f"{old}: {text}\n{section}:\n  {key}: {text}\n"
    if old == section:  # rails_socket: a value once, a section now: one key cannot be both
        both = f"{old}: {text}\n"
        monkeypatch.setenv(_env(new), text)
    message = rf"{re.escape(old)} and {re.escape(new)} are both given: give only {re.escape(new)}"
    with pytest.raises(ConfigError, match=message):
        load_settings(cls, _yaml(tmp_path, both))
    monkeypatch.delenv(_env(new), raising=False)
    monkeypatch.setenv(_env(old), text)  # the old variable with the new key in the file
    with pytest.raises(ConfigError, match=rf"{_env(old)} and {re.escape(new)} are both given"):
        load_settings(cls, _yaml(tmp_path, f"{section}:\n  {key}: {text}\n"))


def test_the_old_variable_wins_over_the_old_key_in_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As before the sections: the environment over the file, for the old names too."""
    monkeypatch.setenv("LINKGUARD_ROUTE_TABLE", "88")
    settings, messages, _ = _load(AgentSettings, _yaml(tmp_path, "route_table: 77\n"))
    assert settings.routes.table == 88
    assert messages == ["LINKGUARD_ROUTE_TABLE is deprecated; use LINKGUARD_ROUTES__TABLE"]


def test_old_keys_join_the_sections_given_in_the_new_form(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An old key and other keys of its section in the new form (file or environment) merge."""
    monkeypatch.setenv("LINKGUARD_RAILS_SOCKET__GROUP", "gpu-jobs")
    monkeypatch.setenv("LINKGUARD_APPLY_ROUTES", "false")
    text = "rails_socket: /run/lg/r.sock\nroute_table: 77\nroutes: {rto_min_ms: 20}\n"
    settings, messages, _ = _load(AgentSettings, _yaml(tmp_path, text))
    assert (settings.routes.table, settings.routes.apply, settings.routes.rto_min_ms) == (
        77,
        False,
        20,
    )
    assert (settings.rails_socket.path, settings.rails_socket.group) == (
        Path("/run/lg/r.sock"),
        "gpu-jobs",
    )
    assert sorted(messages) == [
        "LINKGUARD_APPLY_ROUTES is deprecated; use LINKGUARD_ROUTES__APPLY",
        "rails_socket is deprecated; use rails_socket.path",
        "route_table is deprecated; use routes.table",
    ]


def test_the_old_rails_socket_variable_with_the_sections_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LINKGUARD_RAILS_SOCKET", "/run/lg/r.sock")
    monkeypatch.setenv("LINKGUARD_RAILS_SOCKET__QUEUE", "5")
    settings, messages, _ = _load(AgentSettings, None)
    assert (settings.rails_socket.path, settings.rails_socket.queue) == (Path("/run/lg/r.sock"), 5)
    assert messages == ["LINKGUARD_RAILS_SOCKET is deprecated; use LINKGUARD_RAILS_SOCKET__PATH"]
    monkeypatch.setenv("LINKGUARD_RAILS_SOCKET", '{"path": "/run/lg/s.sock", "queue": 9}')
    settings, messages, _ = _load(AgentSettings, None)  # the section as JSON: the new form
    assert (settings.rails_socket.path, settings.rails_socket.queue, messages) == (
        Path("/run/lg/s.sock"),
        5,  # LINKGUARD_RAILS_SOCKET__QUEUE over the JSON's, as for every section
        [],
    )


def test_rails_socket_null_is_the_default_section(tmp_path: Path) -> None:
    settings, messages, _ = _load(AgentSettings, _yaml(tmp_path, "rails_socket: null\n"))
    assert (settings.rails_socket.path, messages) == (None, [])


def test_old_keys_as_options_warn_too() -> None:
    with pytest.warns(DeprecatedSetting, match=r"^route_table is deprecated; use routes\.table$"):
        settings = AgentSettings(host="h", route_table=99)  # type: ignore[call-arg]
    assert settings.routes.table == 99


def test_old_names_are_not_typos_and_belong_to_their_role(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An old variable is a setting of its role: no 'unknown setting' error, and the other
    role logs it as the other role's (as it did before the sections)."""
    monkeypatch.setenv("LINKGUARD_DEBOUNCE_MS", "50")
    with capture_logs() as logs:
        load_settings(AgentSettings)
    other = [e for e in logs if e["event"] == "env_setting_of_other_role"]
    assert "LINKGUARD_DEBOUNCE_MS" in other[0]["variables"]
    monkeypatch.setenv("LINKGUARD_ROUTE_TABEL", "5")
    with pytest.raises(ConfigError, match="LINKGUARD_ROUTE_TABEL"):
        load_settings(AgentSettings)


def test_a_bad_value_under_an_old_key_names_the_new_key(tmp_path: Path) -> None:
    reserved = r"routes\.table: table 254 is reserved"
    with pytest.warns(DeprecatedSetting), pytest.raises(ConfigError, match=reserved):
        load_settings(AgentSettings, _yaml(tmp_path, "route_table: 254\n"))
    rfc = r"holddown_ms \(100\) must be >= time_to_learn_ms"
    with pytest.warns(DeprecatedSetting), pytest.raises(ConfigError, match=rfc):
        load_settings(ServiceSettings, _yaml(tmp_path, "solve_holddown_ms: 100\n"))


def test_config_error_lists_every_bad_value(tmp_path: Path) -> None:
    text = "routes: {table: 254, rule_priority: 0}\nverbs: {events: maybe}\n"
    with pytest.raises(ConfigError) as info:
        load_settings(AgentSettings, _yaml(tmp_path, text))
    assert [e.split(":")[0] for e in info.value.errors] == [
        "routes.table",
        "routes.rule_priority",
        "verbs.events",
    ]
