"""Settings for the agent and the topology service (pydantic-settings), by section.

Sources, highest first: explicit arguments, environment (``LINKGUARD_`` prefix, ``__`` for
nesting: ``LINKGUARD_BUS__PORT=1884``), a YAML file (``--config``), then the defaults.
A bad value raises :class:`ConfigError` naming the field and the source file; an old flat key
(``route_table``, now ``routes.table``) is read with a :class:`DeprecatedSetting` warning.

The models live in :mod:`linkguard.settings` (the sections, each role's settings, the loading
and the deprecated keys); this module is the name every importer uses for them.
"""

from __future__ import annotations

from linkguard.settings.agent import AgentSettings
from linkguard.settings.base import ConfigError, DeprecatedSetting, listen_address
from linkguard.settings.bus import BusSettings
from linkguard.settings.loading import _NOT_SETTINGS, S, load_settings
from linkguard.settings.sections import (
    PROBE_ROCE_PORT,
    PROBE_UDP_PORT,
    HookSettings,
    HookTrigger,
    PortConfig,
    ProbeRunSettings,
    RailsSocketSettings,
    RouteOptions,
    VerbsSettings,
    resolve_command,
)
from linkguard.settings.service import ServiceSettings
from linkguard.settings.servicesections import (
    ApiSettings,
    ConvergenceSettings,
    EtcdLeaderSettings,
    GeneratorSettings,
    HostBudgetSettings,
    KubernetesLeaderSettings,
    LeaderSettings,
    LedgerSettings,
    OfflineSettings,
    SolveSettings,
)

__all__ = [
    "PROBE_ROCE_PORT",
    "PROBE_UDP_PORT",
    "_NOT_SETTINGS",
    "AgentSettings",
    "ApiSettings",
    "BusSettings",
    "ConfigError",
    "ConvergenceSettings",
    "DeprecatedSetting",
    "EtcdLeaderSettings",
    "GeneratorSettings",
    "HookSettings",
    "HookTrigger",
    "HostBudgetSettings",
    "KubernetesLeaderSettings",
    "LeaderSettings",
    "LedgerSettings",
    "OfflineSettings",
    "PortConfig",
    "ProbeRunSettings",
    "RailsSocketSettings",
    "RouteOptions",
    "S",
    "ServiceSettings",
    "SolveSettings",
    "VerbsSettings",
    "listen_address",
    "load_settings",
    "resolve_command",
]
