"""What the agent's and the service's settings share: logging, the bus, and where the values
come from.

Consumes: explicit options, the ``LINKGUARD_*`` environment (``__`` enters a section; the old
flat names of :attr:`SettingsBase.renamed_keys` too) and a YAML file. Produces:
:class:`SettingsBase`, the base of :class:`~linkguard.settings.agent.AgentSettings` and
:class:`~linkguard.settings.service.ServiceSettings`; each moves its role's old flat keys into
their sections before validating (:func:`~linkguard.settings.deprecations.move_deprecated`).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from linkguard.models import SettingsModel
from linkguard.settings.bus import BusSettings
from linkguard.settings.deprecations import (
    DeprecatedEnvSource,
    Renames,
    SectionEnvSource,
    SectionYamlSource,
)

__all__ = ["SettingsBase"]


class SettingsBase(BaseSettings, SettingsModel):
    """Settings of one role. Sources, highest first: options, the environment (with the old
    flat names), the YAML file (``yaml_file`` in the model config), the defaults."""

    #: this role's old flat keys: old -> (section, key); see linkguard.settings.deprecations
    renamed_keys: ClassVar[Renames] = {}

    log_format: Literal["json", "console"] = Field(
        "json", description="structlog output: one JSON object per line, or for a terminal"
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="the least severe log event written"
    )
    bus: BusSettings = Field(BusSettings(), description="the MQTT bus (broker, TLS, QoS)")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        renames = cls.renamed_keys
        sources: list[PydanticBaseSettingsSource] = [
            init_settings,
            SectionEnvSource(settings_cls, renames),
            DeprecatedEnvSource(settings_cls, renames),
        ]
        yaml_file = settings_cls.model_config.get("yaml_file")
        if yaml_file:
            sources.append(SectionYamlSource(settings_cls, renames))
        return tuple(sources)
