"""The topology service's settings (``linkguard topology serve``): :class:`ServiceSettings`.

Consumes: the values the sources gathered (:class:`~linkguard.settings.role.SettingsBase`).
Produces: the service's settings: the fabric (a file or ``generate:``), the ``solve``
back-off, ``ledger``, ``api``, ``leader``, ``offline``, ``convergence`` and ``probes`` sections
and the signing key. The old flat keys of :attr:`ServiceSettings.renamed_keys` (``debounce_ms``,
``solve_*``) are still read, with a warning (:mod:`linkguard.settings.deprecations`). Raises
``pydantic.ValidationError`` naming the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import Discriminator, Field, Tag, model_validator
from pydantic_settings import SettingsConfigDict

from linkguard.backoffpolicy import BackoffPolicy
from linkguard.settings.deprecations import Renames, move_deprecated
from linkguard.settings.discoversection import FabricDiscovery
from linkguard.settings.role import SettingsBase
from linkguard.settings.sections import ProbeRunSettings
from linkguard.settings.servicesections import (
    ApiSettings,
    ConvergenceSettings,
    GeneratorSettings,
    HostBudgetSettings,
    LeaderSettings,
    LedgerSettings,
    OfflineSettings,
    SolveSettings,
)

__all__ = ["ServiceSettings"]


def _fabric_kind(value: Any) -> str:
    """A mapping (or the model) is ``fabric: {discover: ...}``; anything else a file path."""
    return "discovery" if isinstance(value, dict | FabricDiscovery) else "file"


#: ``fabric:`` is a file path or ``{discover: ...}``; told apart by the value's shape, so an
#: error names the one that was meant (``fabric.discovery.discover.settle_s``), not both
FabricSource = Annotated[
    Annotated[Path, Tag("file")] | Annotated[FabricDiscovery, Tag("discovery")],
    Discriminator(_fabric_kind),
]


class ServiceSettings(SettingsBase):
    """``linkguard topology serve``."""

    model_config = SettingsConfigDict(
        env_prefix="LINKGUARD_", env_nested_delimiter="__", extra="forbid", allow_inf_nan=False
    )

    #: the old flat keys, read for one release with a DeprecatedSetting warning
    renamed_keys: ClassVar[Renames] = {
        "solve_initial_delay_ms": ("solve", "initial_ms"),
        "debounce_ms": ("solve", "short_ms"),
        "solve_long_delay_ms": ("solve", "long_ms"),
        "solve_time_to_learn_ms": ("solve", "time_to_learn_ms"),
        "solve_holddown_ms": ("solve", "holddown_ms"),
    }

    @model_validator(mode="before")
    @classmethod
    def _old_keys(cls, data: Any) -> Any:
        return move_deprecated(data, cls.renamed_keys)

    fabric: FabricSource | None = Field(
        None,
        description="fabric file (JSON/YAML), or {discover: {...}} to run on a fabric "
        "discovered from the agents (docs/discovery.md); None = generate",
    )
    generate: GeneratorSettings | None = Field(
        None, description="generator parameters, when there is no fabric file"
    )
    solve: SolveSettings = Field(
        default_factory=SolveSettings,
        description="when to solve after a change: RFC 8405's SPF back-off "
        "(linkguard.topology.backoff), with its names",
    )

    def backoff_policy(self) -> BackoffPolicy:
        """The solve back-off of these settings (RFC 8405; ``solve:``)."""
        return self.solve.policy()

    @model_validator(mode="after")
    def _one_fabric_source(self) -> ServiceSettings:
        if self.fabric is not None and self.generate is not None:
            raise ValueError(
                f"fabric {str(self.fabric)!r} (the fabric: key, LINKGUARD_FABRIC or --fabric) "
                "and generate: (generator parameters) are both given: give either, not both"
            )
        return self

    startup_settle_s: float = Field(
        1.0,
        ge=0,
        le=600,
        description="collect retained states this long before the first plans, counted from "
        "the first connect to the broker",
    )
    signing_key: Path | None = Field(
        None,
        description="Ed25519 private key (PEM PKCS #8 or raw 32 bytes, mode 0600 or stricter; "
        "`linkguard keys generate`) that signs every plan and peer routes message; None: "
        "published unsigned",
    )
    ledger: LedgerSettings = Field(
        default_factory=LedgerSettings,
        description="interruption ledger (LINKGUARD_LEDGER__PATH=...); off until a path is set",
    )
    api: ApiSettings = Field(
        default_factory=ApiSettings,
        description="HTTP API and dashboard (LINKGUARD_API__PORT=...); on by default, bound "
        "to 127.0.0.1:8470",
    )
    leader: LeaderSettings = Field(
        default_factory=LeaderSettings,
        description="leader election among several services of one fabric "
        "(LINKGUARD_LEADER__ETCD__ENDPOINTS=...); none by default",
    )
    offline: OfflineSettings = Field(
        default_factory=OfflineSettings,
        description="routing around hosts whose agent's connection was lost (last will)",
    )
    convergence: ConvergenceSettings = Field(
        default_factory=ConvergenceSettings,
        description="re-sending plans to online hosts that do not ack their current epoch",
    )
    host_budget: HostBudgetSettings = Field(
        default_factory=HostBudgetSettings,
        description="what one host may cost the service (messages, bytes, retained topics); "
        "the excess is dropped before it is decoded",
    )
    probes: ProbeRunSettings = Field(
        default_factory=ProbeRunSettings,
        description="per-rail probes: plan, localise, route around (off by default)",
    )
