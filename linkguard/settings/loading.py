"""Loading the settings: the YAML file, the environment's names, the errors.

Consumes: a settings class (:class:`~linkguard.settings.agent.AgentSettings` or
:class:`~linkguard.settings.service.ServiceSettings`), a YAML file, the ``LINKGUARD_*``
environment and options. Produces: the settings (:func:`load_settings`), after refusing a
variable that names no setting of either role and logging those of the other role. Raises
:class:`~linkguard.settings.base.ConfigError` naming the field and the source.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from linkguard.settings.agent import AgentSettings
from linkguard.settings.base import ConfigError
from linkguard.settings.deprecations import SectionEnvSource, stderr_logger
from linkguard.settings.role import SettingsBase
from linkguard.settings.service import ServiceSettings

__all__ = ["load_settings"]

S = TypeVar("S", bound=SettingsBase)


#: Environment variables with the LINKGUARD_ prefix that are not settings: the test and CI
#: switches (tests/support.py, tests/conftest.py, tests/e2e/conftest.py, tests/test_dashboard.py,
#: fuzz/run.py) and what the agent gives its hooks (linkguard.agent.hooks), so that a hook may
#: run ``linkguard nccl env`` or ``linkguard rails follow``.
_NOT_SETTINGS = frozenset(
    {
        "LINKGUARD_REQUIRE_REAL",
        "LINKGUARD_FIXTURES",
        "LINKGUARD_E2E_BROKER",
        "LINKGUARD_ARTIFACTS",
        "LINKGUARD_CHROMIUM",
        "LINKGUARD_HOOK",
        "LINKGUARD_HOOK_ATTEMPT",
    }
)


def _section_models(annotation: object) -> list[type[BaseModel]] | None:
    """The settings sections an annotation nests (``X``, ``X | None``, ``X | Y``), or None when
    it is anything else (a value, a list, a dict: any deeper name is left to pydantic)."""
    import types
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models: list[type[BaseModel]] = []
        for arg in typing.get_args(annotation):
            if arg is type(None):
                continue
            sub = _section_models(arg)
            if sub is None:
                return None
            models += sub
        return models or None
    return None


def _names_setting(model: type[BaseModel], path: list[str]) -> bool:
    """Whether ``path`` (an environment name split at ``__``, lower case) names a setting of
    ``model`` or a value inside one (a dict's key), or is one of its old flat names."""
    fields = model.model_fields
    renamed = getattr(model, "renamed_keys", {})
    if len(path) == 1 and path[0] in renamed:
        return True  # an old flat name, read with a DeprecatedSetting warning
    if not path or path[0] not in fields:
        return False
    sections = _section_models(fields[path[0]].annotation)
    if len(path) == 1 or sections is None:
        return True
    return any(_names_setting(m, path[1:]) for m in sections)


def _env_names(cls: type[BaseSettings]) -> tuple[list[str], list[str], list[str]]:
    """The ``LINKGUARD_*`` variables (outside ``_NOT_SETTINGS``) that ``cls`` (AgentSettings
    or ServiceSettings) does not read, sorted, as ``(typos, other_role, unknown_other)``:
    ``typos`` name no setting of either role and are not in the other role's sections either
    (at the top level, or inside a section of ``cls``); ``other_role`` name a setting of the
    other role only; ``unknown_other`` lie in a section only the other role has but name none
    of its settings (the other role refuses them)."""
    other = ServiceSettings if issubclass(cls, AgentSettings) else AgentSettings
    typos, other_role, unknown_other = [], [], []
    for name in os.environ:
        if not name.startswith("LINKGUARD_") or name in _NOT_SETTINGS:
            continue
        path = name.removeprefix("LINKGUARD_").lower().split("__")
        if _names_setting(cls, path):
            continue
        if _names_setting(other, path):
            other_role.append(name)
        elif path[0] in other.model_fields and path[0] not in cls.model_fields:
            unknown_other.append(name)
        else:
            typos.append(name)
    return sorted(typos), sorted(other_role), sorted(unknown_other)


def _log_env_names(settings: SettingsBase, other_role: list[str], unknown_other: list[str]) -> None:
    """Log, once per load, the ``LINKGUARD_*`` variables these settings ignore: warning
    ``unknown_env_setting`` for names no role has, info ``env_setting_of_other_role`` for the
    other role's. Before ``configure_logging`` (the CLI loads the settings first) the events
    go to stderr in the settings' own log format and level, never to stdout (which may carry
    a command's output)."""
    if not (other_role or unknown_other):
        return
    role, other = (
        ("agent", "service") if isinstance(settings, AgentSettings) else ("service", "agent")
    )
    log = stderr_logger(settings.log_format, settings.log_level)
    if unknown_other:
        log.warning(
            "unknown_env_setting",
            role=role,
            variables=unknown_other,
            note="named no setting of the agent or the service; ignored",
        )
    if other_role:
        log.info(
            "env_setting_of_other_role",
            role=role,
            variables=other_role,
            note=f"settings of the {other}; ignored by the {role}",
        )


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (YAML says keys are
    unique; PyYAML keeps the last one silently, so a second ``bus:`` would replace the
    first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[object] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str | int | float | bool | type(None)):
                # a complex key (`? rails: 2`): no setting is named by a mapping or a list
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    "a key must be a plain name, not a mapping or list",
                    key_node.start_mark,
                )
            if isinstance(key, str) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} given twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _load_yaml(path: Path) -> None:
    """Refuse what YamlConfigSettingsSource would misreport: not a file, not a mapping."""
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    if not path.is_file():
        raise ConfigError(f"config file {path} is not a file")
    try:
        doc = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except RecursionError:
        raise ConfigError(f"cannot read config {path}: nested too deeply") from None
    # ValueError: undecodable bytes, an integer of more than 4,300 digits
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from None
    if doc is not None and not isinstance(doc, dict):
        raise ConfigError(
            f"config {path}: the top level must be a mapping of settings, "
            f"not a {type(doc).__name__}"
        )


def _error_text(e: Any) -> str:
    """One pydantic error as ``loc: message`` (a model-level error without ``loc``; a
    validator's ValueError without pydantic's ``Value error, `` prefix)."""
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] == "finite_number":  # NaN or an infinity (YAML .nan/.inf, env nan/inf)
        msg = "must be a finite number"
    loc = ".".join(str(p) for p in e["loc"])
    return f"{loc}: {msg}" if loc else msg


def load_settings(cls: type[S], path: Path | None = None, **overrides: Any) -> S:
    """Build settings from ``path`` (YAML), the environment and ``overrides``.

    Raises :class:`ConfigError` for a missing/unreadable file, bad YAML, a bad value, or a
    ``LINKGUARD_*`` environment variable that names no setting of either role (a typo). The
    other role's variables (an environment shared by both) are logged at info and ignored; a
    variable inside a section only the other role has that names none of its settings is
    logged as a warning (``unknown_env_setting``) and ignored: the other role refuses it.
    """
    typos, other_role, unknown_other = _env_names(cls)
    if typos:
        raise ConfigError(
            f"unknown setting(s) in the environment: {', '.join(typos)} (no setting of the "
            "agent or the service has this name; `__` enters a section: LINKGUARD_BUS__PORT)"
        )
    target: type[S] = cls
    if path is not None:
        _load_yaml(path)

        # mypy cannot type a class statement whose base is a type variable
        class _FromFile(cls):  # type: ignore[valid-type,misc]
            model_config = SettingsConfigDict(**{**cls.model_config, "yaml_file": str(path)})

        _FromFile.__name__ = cls.__name__
        target = _FromFile
    try:
        settings = target(**overrides)
    except ValidationError as exc:
        where = (
            f" (from {path}, LINKGUARD_* variables or options)"
            if path
            else (" (from LINKGUARD_* variables or options)")
        )
        errors = [_error_text(e) for e in exc.errors()]
        details = "; ".join(errors[:5])
        raise ConfigError(f"bad {cls.__name__} value{where}: {details}", errors) from None
    except Exception as exc:  # YAML syntax errors surface from the source as plain errors
        if any(name in str(exc) for name in ("EnvSettingsSource", SectionEnvSource.__name__)):
            raise ConfigError(
                f"bad LINKGUARD_* environment value: {exc}; lists and sections are JSON, e.g. "
                """LINKGUARD_ENDPOINTS='["10.200.3.1","10.200.3.2"]'"""
            ) from None
        raise ConfigError(f"cannot read config {path}: {exc}") from None
    _log_env_names(settings, other_role, unknown_other)
    return settings
