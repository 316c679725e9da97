"""The old flat keys that moved into sections (``route_table`` -> ``routes.table``): still read
for one release, each with a warning naming the new key.

Consumes: the values the settings sources gathered (YAML file, options, environment) and a
role's renames (``{old: (section, key)}``, ``AgentSettings.renamed_keys``). Produces: the same
values with every old key moved to its section (:func:`move_deprecated`), a
:class:`~linkguard.settings.base.DeprecatedSetting` warning ``"X is deprecated; use Y"`` and a
structlog warning ``deprecated_setting`` (``old``, ``new``, ``hint``) per old key. Raises
ValueError (a :class:`~linkguard.settings.base.ConfigError` once loaded) when an old key and its
new one are both given.

In the environment, ``LINKGUARD_ROUTE_TABLE`` is read by :class:`DeprecatedEnvSource` (the
environment source reads only the fields' own names) and kept apart under :data:`ENV_KEY`, so
that a value of the new name from another source is seen as a conflict, not merged away. A
section that was once a value (``rails_socket: /run/linkguard/rails.sock``, now
``rails_socket.path``) is left to the old-key move by :class:`SectionEnvSource` when its
variable holds no JSON object.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

import structlog
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    YamlConfigSettingsSource,
)

from linkguard.settings.base import DeprecatedSetting

__all__ = [
    "ENV_KEY",
    "FILE_KEY",
    "DeprecatedEnvSource",
    "Renames",
    "SectionEnvSource",
    "SectionYamlSource",
    "move_deprecated",
    "stderr_logger",
]

#: old flat key -> (section, key in it)
Renames = Mapping[str, tuple[str, str]]

#: where :class:`DeprecatedEnvSource` puts the old keys it read from the environment (popped by
#: :func:`move_deprecated` before the model sees the values)
ENV_KEY = "__deprecated_environment__"
#: where :class:`SectionYamlSource` puts a section's old value (``rails_socket: /run/x.sock``), so
#: that the environment's keys of that section (``LINKGUARD_RAILS_SOCKET__GROUP``) do not replace
#: it when the sources are merged
FILE_KEY = "__deprecated_file__"


def _env_name(dotted: str) -> str:
    """``routes.table`` -> ``LINKGUARD_ROUTES__TABLE``."""
    return "LINKGUARD_" + dotted.replace(".", "__").upper()


def _scalar_sections(renames: Renames) -> dict[str, str]:
    """Sections whose own name was once a value: ``{section: key}`` (``rails_socket: path``)."""
    return {old: key for old, (section, key) in renames.items() if old == section}


class DeprecatedEnvSource(PydanticBaseSettingsSource):
    """The old flat names in the environment (``LINKGUARD_ROUTE_TABLE``, any case), as
    ``{ENV_KEY: {old: text}}``; a section's old name holding a JSON object (the new form of
    ``LINKGUARD_RAILS_SOCKET``) is left to the environment source."""

    def __init__(self, settings_cls: type[BaseSettings], renames: Renames) -> None:
        super().__init__(settings_cls)
        self.renames = renames

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # every value is read in __call__

    def __call__(self) -> dict[str, Any]:
        upper = {name.upper(): value for name, value in os.environ.items()}
        scalar = _scalar_sections(self.renames)
        found: dict[str, str] = {}
        for old in self.renames:
            value = upper.get(_env_name(old))
            if value is None or (old in scalar and value.lstrip().startswith("{")):
                continue
            found[old] = value
        return {ENV_KEY: found} if found else {}


class SectionEnvSource(EnvSettingsSource):
    """The environment source, but a section's variable whose value is no JSON object and whose
    section was once a value (``LINKGUARD_RAILS_SOCKET=/run/linkguard/rails.sock``) is not
    decoded: :class:`DeprecatedEnvSource` reads it as the old key (the section's own variables,
    ``LINKGUARD_RAILS_SOCKET__GROUP``, are still read)."""

    def __init__(self, settings_cls: type[BaseSettings], renames: Renames) -> None:
        super().__init__(settings_cls)
        self.scalar = _scalar_sections(renames)

    def prepare_field_value(
        self, field_name: str, field: FieldInfo, value: Any, value_is_complex: bool
    ) -> Any:
        if (
            field_name in self.scalar
            and isinstance(value, str)
            and not value.lstrip().startswith("{")
        ):
            value = None
        return super().prepare_field_value(field_name, field, value, value_is_complex)


class SectionYamlSource(YamlConfigSettingsSource):
    """The YAML file, with the old value of a section that was once a value
    (``rails_socket: /run/x.sock``) kept apart under :data:`FILE_KEY`."""

    def __init__(self, settings_cls: type[BaseSettings], renames: Renames) -> None:
        super().__init__(settings_cls)
        self.scalar = _scalar_sections(renames)

    def __call__(self) -> dict[str, Any]:
        values = super().__call__()
        old = {
            section: values.pop(section)
            for section in self.scalar
            if isinstance(values.get(section), str)
        }
        return {**values, FILE_KEY: old} if old else values


def stderr_logger(log_format: object, log_level: object) -> Any:
    """The process's structlog logger once ``configure_logging`` ran; before it (the CLI loads
    the settings first) one writing to stderr in ``log_format`` (json, console; anything else:
    json) at ``log_level`` (debug ... error; anything else: info), never to stdout, which may
    carry a command's output."""
    if structlog.is_configured():
        return structlog.get_logger("linkguard.settings")
    renderer = (
        structlog.dev.ConsoleRenderer(colors=False)
        if log_format == "console"
        else structlog.processors.JSONRenderer()
    )
    level = log_level if log_level in ("debug", "info", "warning", "error") else "info"
    return structlog.wrap_logger(
        structlog.PrintLogger(sys.stderr),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(str(level).upper()),
    )


def _section_values(data: dict[str, Any], section: str, old: str) -> dict[str, Any]:
    """The values given for ``section`` as a dict to add a key to (a model given as an option:
    the fields it was given). ValueError when ``section`` holds something else."""
    value = data.get(section)
    if value is None:
        return {}
    if isinstance(value, BaseModel):
        return {k: getattr(value, k) for k in value.model_fields_set}
    if isinstance(value, dict):
        return dict(value)
    raise ValueError(
        f"{old} (deprecated) needs {section} to be a section (a mapping), not {value!r}"
    )


def _move_one(
    data: dict[str, Any], old: str, value: Any, section: str, key: str, env: bool
) -> tuple[str, str]:
    """Put ``value`` of ``old`` at ``section.key`` of ``data``: the (old, new) names to warn
    about. ValueError naming both when the new key is given too."""
    new = f"{section}.{key}"
    old_name, new_name = (_env_name(old), _env_name(new)) if env else (old, new)
    values = _section_values(data, section, old)
    if key in values:
        raise ValueError(
            f"{old_name} and {new} are both given: give only {new} ({old_name} is deprecated)"
        )
    values[key] = value
    data[section] = values
    return old_name, new_name


def move_deprecated(data: Any, renames: Renames) -> Any:
    """``data`` (the gathered values, a dict) with every old key of ``renames`` moved into its
    section, warning once per old key (:class:`DeprecatedSetting` and ``deprecated_setting``);
    anything but a dict is returned as it is (pydantic refuses it). ValueError naming both keys
    when an old key and its new one are both given."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    from_env: dict[str, Any] = data.pop(ENV_KEY, {})
    from_file: dict[str, Any] = data.pop(FILE_KEY, {})
    moved: list[tuple[str, str]] = []
    scalar = _scalar_sections(renames)
    for section, key in scalar.items():  # first: the section's other old keys go into it
        value = data.get(section)
        if section in data and (value is None or isinstance(value, str | PurePath)):
            del data[section]  # None: `rails_socket: null`, the old "no socket": the defaults
        else:
            value = from_file.get(section)
        if section in from_env:  # the environment's old name wins over the file's, as before
            moved.append(_move_one(data, section, from_env.pop(section), section, key, env=True))
        elif value is not None:
            moved.append(_move_one(data, section, value, section, key, env=False))
    for old, (section, key) in renames.items():
        if old in scalar:
            continue
        if old in from_env:  # the environment's old name wins over the file's, as before
            data.pop(old, None)
            moved.append(_move_one(data, old, from_env.pop(old), section, key, env=True))
        elif old in data:
            moved.append(_move_one(data, old, data.pop(old), section, key, env=False))
    if moved:
        log = stderr_logger(data.get("log_format"), data.get("log_level"))
        for old_name, new_name in moved:
            warnings.warn(
                DeprecatedSetting(f"{old_name} is deprecated; use {new_name}"), stacklevel=2
            )
            log.warning(
                "deprecated_setting",
                old=old_name,
                new=new_name,
                hint=f"rename {old_name} to {new_name}; the old name goes in the next release",
            )
    return data
