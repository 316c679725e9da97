"""The service's ``fabric: {discover: ...}`` section: run on a fabric discovered from the
agents' discovery documents and a switch graph (:mod:`linkguard.topology.discover`) instead of
a fabric file."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from pydantic import Field, model_validator

from linkguard.settings.base import Section

__all__ = ["DiscoverSource", "FabricDiscovery"]


class DiscoverSource(Section):
    """Where the switch graph comes from and how addresses the hosts do not report are
    planned (the options of ``linkguard fabric discover``)."""

    ibnetdiscover: Path | None = Field(
        None, description="an ibnetdiscover dump: the switch graph of an InfiniBand fabric"
    )
    guid_map: Path | None = Field(
        None, description="with ibnetdiscover: a GUID -> host map (H-<guid> <host> lines)"
    )
    lldp: bool = Field(
        False, description="RoCE: the LLDP neighbours the agents report are the host cables"
    )
    switch_lldp: dict[str, Path] = Field(
        default_factory=dict,
        description="with lldp: each switch's `lldpctl -f json` file, by switch name (its "
        "switch-to-switch cables)",
    )
    rail_prefix: ipaddress.IPv4Network | None = Field(
        None, description="plan the rail addresses of ports without one here (None: left out)"
    )
    endpoint_prefix: ipaddress.IPv4Network | None = Field(
        None,
        description="plan GPU endpoints of hosts whose agent has none (None: such hosts are "
        "left out)",
    )
    gpus_per_host: int | None = Field(None, ge=1, le=64, description="GPUs per planned host")
    name: str = Field("discovered", min_length=1, max_length=128, description="fabric name")
    settle_s: float = Field(
        10.0,
        ge=0,
        le=3600,
        description="collect discovery documents this long before the first fabric, and after "
        "a new or changed one before the fabric is built again (s)",
    )

    @model_validator(mode="after")
    def _one_graph(self) -> DiscoverSource:
        if (self.ibnetdiscover is None) == (not self.lldp):
            raise ValueError("give one switch graph: ibnetdiscover: FILE or lldp: true")
        if self.guid_map is not None and self.ibnetdiscover is None:
            raise ValueError("guid_map goes with ibnetdiscover")
        if self.switch_lldp and not self.lldp:
            raise ValueError("switch_lldp goes with lldp: true")
        return self


class FabricDiscovery(Section):
    """``fabric: {discover: {...}, expected: FILE}``: the service plans on the discovered
    fabric; what contradicts ``expected`` (missing or unexpected hosts and cables, wrong leaf or
    rail, another rate) is in its fleet audit."""

    discover: DiscoverSource
    expected: Path | None = Field(
        None, description="the fabric that should be (a fabric file): compared in the audit"
    )
