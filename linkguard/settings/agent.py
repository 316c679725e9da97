"""The agent's settings (``linkguard agent``): :class:`AgentSettings`.

Consumes: the values the sources gathered (:class:`~linkguard.settings.role.SettingsBase`).
Produces: one host's settings: its name, driver, ports and endpoints, the ``routes``,
``rails_socket``, ``verbs``, ``hooks``, ``probes``, ``damping`` and ``counter_health``
sections, state files and the metrics listener. The old flat keys of
:attr:`AgentSettings.renamed_keys` are still read, with a warning
(:mod:`linkguard.settings.deprecations`). Raises ``pydantic.ValidationError`` naming the key.
"""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from linkguard.counterpolicy import CounterHealthPolicy
from linkguard.damping import DampingPolicy
from linkguard.settings.base import listen_address
from linkguard.settings.deprecations import Renames, move_deprecated
from linkguard.settings.role import SettingsBase
from linkguard.settings.sections import (
    DiscoverySettings,
    HookSettings,
    PortConfig,
    ProbeRunSettings,
    RailsSocketSettings,
    RouteOptions,
    VerbsSettings,
)
from linkguard.topics import valid_segment

__all__ = ["AgentSettings"]


class AgentSettings(SettingsBase):
    """``linkguard agent``: one per GPU host."""

    model_config = SettingsConfigDict(
        env_prefix="LINKGUARD_", env_nested_delimiter="__", extra="forbid", allow_inf_nan=False
    )

    #: the old flat keys, read for one release with a DeprecatedSetting warning
    renamed_keys: ClassVar[Renames] = {
        "route_table": ("routes", "table"),
        "rule_priority": ("routes", "rule_priority"),
        "apply_routes": ("routes", "apply"),
        "rails_socket": ("rails_socket", "path"),  # once the path itself
        "rails_socket_group": ("rails_socket", "group"),
        "rails_socket_queue": ("rails_socket", "queue"),
        "verbs_events": ("verbs", "events"),
        "verbs_python": ("verbs", "python"),
        "verbs_reader": ("verbs", "reader"),
    }

    @model_validator(mode="before")
    @classmethod
    def _old_keys(cls, data: Any) -> Any:
        return move_deprecated(data, cls.renamed_keys)

    host: str = Field(
        default_factory=socket.gethostname,
        min_length=1,
        max_length=253,
        description="this host's name on the bus and in the fabric file",
    )
    driver: Literal["sysfs", "netlink", "simulated"] = Field(
        "sysfs", description="sysfs: IB ports polled; netlink: netdev carrier; simulated: tests"
    )
    sysfs_root: Path = Field(Path("/sys/class/infiniband"), description="the IB class dir")
    poll_interval_ms: float = Field(
        100.0, ge=5, le=60_000, description="sysfs port state read this often (ms)"
    )
    netns: str | None = Field(
        None,
        description="network namespace of the netdevs and routes (labs); None = the agent's own",
    )
    ports: list[PortConfig] = Field(
        default_factory=list,
        description="empty: every HCA port found in sysfs, rails by PCI address order (natural "
        "name order when a port has no PCI address)",
    )
    endpoints: list[ipaddress.IPv4Address] = Field(
        default_factory=list, max_length=64, description="one /32 per GPU, index = GPU"
    )
    endpoint_prefixes: list[ipaddress.IPv4Network] = Field(
        default_factory=lambda: [ipaddress.IPv4Network("10.200.0.0/16")],
        description="plans may only route destinations inside these; one ip rule each",
    )

    @field_validator("endpoint_prefixes")
    @classmethod
    def _narrow_prefixes(cls, v: list[ipaddress.IPv4Network]) -> list[ipaddress.IPv4Network]:
        if not v:
            raise ValueError("give at least one endpoint prefix (the GPU endpoints' range)")
        for p in v:
            if p.prefixlen < 8:
                raise ValueError(
                    f"{p} is too wide: linkguard routes only the GPU endpoint "
                    "range, never a default or /0-/7 route"
                )
        return v

    @field_validator("host")
    @classmethod
    def _host_name(cls, v: str) -> str:
        if not valid_segment(v):
            raise ValueError(f"host {v!r}: use letters, digits, '.', '_' or '-'")
        return v

    routes: RouteOptions = Field(
        default_factory=RouteOptions,
        description="linkguard's routing table, its rule priority, whether routes are applied, "
        "and the route source address, TCP rto_min, neighbour flush (what TCP needs to follow "
        "a reroute)",
    )
    damping: DampingPolicy = Field(
        DampingPolicy(), description="flap damping: how long a flapping port is held down"
    )
    discovery: DiscoverySettings = Field(
        default_factory=DiscoverySettings,
        description="what the agent reports for `linkguard fabric discover` (RDMA ports, "
        "netdevs, LLDP neighbours)",
    )
    counter_health: CounterHealthPolicy = Field(
        default_factory=CounterHealthPolicy,
        description="error-counter rates that drain an up port (linkguard.agent.health)",
    )
    state_dir: Path = Field(
        Path("/var/lib/linkguard"),
        description="last plan, peer routes, flap history, counter verdicts (kept over restarts)",
    )
    rail_map_path: Path = Field(
        Path("/run/linkguard/rail-map.json"), description="the rail map local jobs read"
    )
    nccl_topo_file: Path | None = Field(
        None,
        description="this host's NCCL topology file (NCCL_TOPO_FILE XML): the agent writes a "
        "copy without the unusable NICs as nccl-topo.xml next to the rail map "
        "(linkguard.nccl); None: no topology file is rendered",
    )
    shutdown_policy: Literal["keep", "withdraw"] = Field(
        "keep", description="on SIGTERM: keep the routes in place, or withdraw table and rules"
    )
    refresh_interval_s: float = Field(
        30.0, ge=1, description="re-publish all port states this often (s, +-10 % jitter)"
    )
    journal_max_events: int = Field(
        1024,
        ge=1,
        le=1_000_000,
        description="port events held until the service confirms them (state_dir/events.json, "
        "replayed after a reconnect); past it the oldest are dropped and reported as a "
        "journal gap",
    )
    journal_resend_after_s: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="a port event the service has not confirmed this long (s) is sent again "
        "without waiting for a reconnect, then after twice the wait, doubling up to "
        "journal_resend_max_s (an event or its confirmation lost on a bus that stayed up)",
    )
    journal_resend_max_s: float = Field(
        60.0,
        gt=0,
        le=86_400,
        description="the longest wait (s) between two re-sends of an unconfirmed port event",
    )
    service_public_key: Path | None = Field(
        None,
        description="the topology service's Ed25519 public key (PEM or raw 32 bytes, "
        "`linkguard keys generate`): plans and peer routes must be signed with its private "
        "key; None: they are applied unverified (simulations, quickstart; logged at start)",
    )
    require_signed_plans: bool = Field(
        True,
        description="with service_public_key: refuse unsigned plans and peer routes (false "
        "only while rolling keys out: unsigned ones are then applied, signed ones verified)",
    )
    metrics_listen: str | None = Field(
        "127.0.0.1:9477",
        description="Prometheus exporter (GET /metrics): HOST:PORT or [IPV6]:PORT, port 0 = "
        "any free one; null or '' = no exporter (linkguard.metrics)",
    )

    @field_validator("metrics_listen")
    @classmethod
    def _metrics_listen(cls, v: str | None) -> str | None:
        if v is None or not v.strip():
            return None
        listen_address(v)
        return v.strip()

    hooks: list[HookSettings] = Field(
        default_factory=list,
        max_length=32,
        description="commands run when this host's rail map changes (linkguard.agent.hooks)",
    )
    probes: ProbeRunSettings = Field(
        default_factory=ProbeRunSettings,
        description="per-rail probes toward the service's targets (off by default)",
    )
    rails_socket: RailsSocketSettings = Field(
        default_factory=RailsSocketSettings,
        description="Unix socket streaming the rail map to local subscribers (path, group, "
        "queue); off until a path is set",
    )
    verbs: VerbsSettings = Field(
        default_factory=VerbsSettings,
        description="RDMA async events that make the sysfs driver re-read a port at once",
    )

    @field_validator("hooks")
    @classmethod
    def _hook_names(cls, v: list[HookSettings]) -> list[HookSettings]:
        names = [h.name for h in v]
        if len(set(names)) != len(names):
            raise ValueError(f"hook names must be unique: {names}")
        return v

    @model_validator(mode="after")
    def _journal_resend_max(self) -> AgentSettings:
        if self.journal_resend_max_s < self.journal_resend_after_s:
            raise ValueError(
                f"journal_resend_max_s ({self.journal_resend_max_s:g}) must be >= "
                f"journal_resend_after_s ({self.journal_resend_after_s:g})"
            )
        return self
