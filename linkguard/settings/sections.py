"""The agent's sections (and the probes', which both roles share).

Consumes: the agent's ``ports``, ``hooks``, ``routes``, ``rails_socket``, ``verbs`` and
``probes`` sections. Produces: :class:`PortConfig`, :class:`HookSettings`,
:class:`RouteOptions` (linkguard's routing table, rule priority, whether routes are applied,
and how they are written), :class:`RailsSocketSettings`, :class:`VerbsSettings`,
:class:`ProbeRunSettings`. Each raises ``pydantic.ValidationError`` naming the key for a bad
value.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
from pathlib import Path
from typing import Literal, TypeAlias

from pydantic import Field, field_validator, model_validator

from linkguard.models import LinkLayer, port_rate_problem
from linkguard.settings.base import Section

__all__ = [
    "PROBE_ROCE_PORT",
    "PROBE_UDP_PORT",
    "HookSettings",
    "HookTrigger",
    "PortConfig",
    "ProbeRunSettings",
    "RailsSocketSettings",
    "RouteOptions",
    "VerbsSettings",
    "resolve_command",
]


class PortConfig(Section):
    """One compute HCA port of this host and the rail it serves."""

    hca: str = Field(min_length=1, max_length=64, description="HCA name in sysfs, e.g. mlx5_0")
    port: int = Field(1, ge=1, le=255, description="HCA port number (sysfs ports/N)")
    rail: int | None = Field(
        None, ge=0, le=63, description="None: by PCI address order (else natural name order)"
    )
    netdev: str | None = Field(
        None, max_length=15, description="the port's netdev; None: from sysfs (device/net)"
    )
    address: ipaddress.IPv4Address | None = Field(
        None, description="the port's rail address, reported in the inventory"
    )
    link_layer: LinkLayer | None = Field(None, description="None: from sysfs link_layer")
    numa_node: int | None = Field(None, description="None: from sysfs device/numa_node")
    expected_rate_gbps: float | None = Field(
        None,
        gt=0,
        description="the rate (Gb/s) this port must run at to be used, while up and when it "
        "comes back from hold-down; below it the port is degraded (None: the highest rate "
        "read while up). One a port reports: a width (1, 2, 4, 8, 12 lanes) times a lane "
        "rate (SDR 2.5 ... XDR 200), e.g. 100, 200, 400, 800",
    )

    @field_validator("expected_rate_gbps")
    @classmethod
    def _a_port_rate(cls, v: float | None) -> float | None:
        """A port never reports a rate outside :data:`~linkguard.models.PORT_RATES_GBPS`: a bar
        above every reading (or between them) would keep the port degraded for good."""
        problem = None if v is None else port_rate_problem(v)
        if problem is not None:
            raise ValueError(problem)
        return v


def resolve_command(command: str) -> str:
    """The absolute path of a hook's ``argv[0]``: an absolute path to an executable regular
    file, or a bare name found on ``PATH`` (``shutil.which``). ValueError otherwise (a relative
    path such as ``./x`` depends on the working directory: refused)."""
    if not command or "\0" in command:
        raise ValueError("argv[0] is empty or has a NUL byte")
    if "/" in command:
        path = Path(command)
        if not path.is_absolute():
            raise ValueError(f"{command!r}: give an absolute path or a name on PATH")
        try:
            runnable = path.is_file() and os.access(path, os.X_OK)
        except (OSError, ValueError):  # a name too long, an unencodable one
            runnable = False
        if not runnable:
            raise ValueError(f"{command!r} is not an executable file")
        return command
    try:
        found = shutil.which(command)
    except (OSError, ValueError):
        found = None
    if found is None:
        raise ValueError(
            f"{command!r} not found on PATH ({os.environ.get('PATH', '')}); argv is a list "
            "(never a shell string): the command alone first, each argument its own item"
        )
    return found


#: When a hook runs (:class:`HookSettings`' ``when``).
HookTrigger: TypeAlias = Literal["change", "lost_above", "whole_again"]


def _on_every_change() -> list[HookTrigger]:
    return ["change"]


class HookSettings(Section):
    """One job-facing hook (:mod:`linkguard.agent.hooks`): a command the agent runs when this
    host's rail map changes, with the change (``linkguard.rail-change/v1``,
    :mod:`linkguard.agent.railmap`) as one JSON document on stdin.

    ``argv`` is a list, never a shell string; ``argv[0]`` is an absolute path to an executable
    or a name on the agent's PATH, checked when the settings load. ``when``: ``change`` (every
    change), ``lost_above`` (the number of lost rails rises above ``lost_above``),
    ``whole_again`` (no rail lost any more; also at the first change after the agent starts
    when none is). A failure (exit status not 0, ``timeout_s`` passed: the process group is
    killed, or it cannot start) is retried up to ``retries`` times, ``backoff_s`` after the
    first failure, doubling up to ``backoff_max_s``; a newer change replaces a pending retry.
    ``env``: added to the agent's environment for the command."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description="the hook's name in logs"
    )
    argv: list[str] = Field(
        min_length=1, max_length=256, description="the command, run without a shell"
    )
    when: list[HookTrigger] = Field(
        default_factory=_on_every_change, min_length=1, description="the changes that run it"
    )
    lost_above: int = Field(0, ge=0, le=63, description="N of when: lost_above (rails)")
    timeout_s: float = Field(10.0, gt=0, le=3600, description="then the process group is killed")
    retries: int = Field(3, ge=0, le=20, description="attempts after the first failed one")
    backoff_s: float = Field(1.0, gt=0, le=3600, description="wait before the first retry (s)")
    backoff_max_s: float = Field(60.0, gt=0, le=86_400, description="longest wait (s)")
    env: dict[str, str] = Field(
        default_factory=dict, max_length=64, description="added to its environment"
    )

    @field_validator("when", mode="before")
    @classmethod
    def _one_when(cls, v: object) -> object:
        return [v] if isinstance(v, str) else v

    @field_validator("argv", mode="before")
    @classmethod
    def _not_a_shell_string(cls, v: object) -> object:
        if isinstance(v, str):
            raise ValueError(
                "argv must be a list of arguments, e.g. [/usr/local/bin/drain, --host, x], "
                "not a shell string (hooks never run a shell)"
            )
        return v

    @field_validator("argv")
    @classmethod
    def _argv(cls, v: list[str]) -> list[str]:
        if any("\0" in a for a in v):
            raise ValueError("argv items must not contain NUL bytes")
        resolve_command(v[0])
        return v

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for k, val in v.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) or "\0" in val:
                raise ValueError(f"env {k!r}: not a valid variable name or value")
        return v


#: UDP port of udp-mode probes (linkguard.agent.probe.DEFAULT_UDP_PORT)
PROBE_UDP_PORT = 47_910
#: UDP port of roce-mode probes: RoCEv2's (IANA "roce", 4791; linkguard.agent.probe)
PROBE_ROCE_PORT = 4791


class RouteOptions(Section):
    """How the agent writes its routes beyond what a plan names (``routes:`` of the agent;
    :mod:`linkguard.agent.applier`), so that TCP moves with a reroute, not only UDP.

    ``source``: ``endpoint`` gives every route towards a peer endpoint ``src`` = this host's
    GPU endpoint on the same home rail (a connection opened without a bind is then sourced
    from an address the peers' linkguard routes carry; with the rail's own address, the
    kernel's choice, replies keep coming over the lost rail). An endpoint that is not an
    address of the host is left out (``route_src_not_local``). ``kernel``: no ``src``.
    ``rto_min_ms``: a locked TCP minimum retransmission timeout on every route (ms, as
    ``ip route ... rto_min 20ms``); a segment lost in the switch-over is sent again after
    about this long instead of Linux's 200 ms TCP_RTO_MIN; it applies to every TCP connection
    towards the GPU endpoints, also when nothing failed (a lower bound, not a fixed timeout).
    None: the kernel's. ``neighbour_flush``: after every route change, delete the neighbour
    (ARP) entries the old routes used and the new ones do not (a segment parked on the lost
    rail's unresolved entry is otherwise never retransmitted: the connection stalls until
    that rail answers again).

    ``table``: linkguard's own routing table (1..2**31-1, not 0, 253, 254 or 255: unspec,
    default, main, local; iproute2's rt_tables), ``rule_priority``: the priority of its ip
    rules, ``apply``: false is a dry run (an in-memory table)."""

    table: int = Field(4242, ge=1, le=2**31 - 1, description="linkguard's own table")
    rule_priority: int = Field(
        1000, ge=1, le=32765, description="priority of the ip rules to routes.table"
    )
    apply: bool = Field(
        True,
        description="false: a dry run, plans applied to an in-memory table and the kernel's "
        "routes and rules left untouched (quickstart and simulations run so)",
    )
    source: Literal["endpoint", "kernel"] = Field(
        "endpoint", description="src of linkguard's routes: the local GPU endpoint, or none"
    )
    rto_min_ms: int | None = Field(
        None,
        ge=1,
        le=120_000,
        description="locked TCP rto_min on linkguard's routes (ms); None: the kernel's 200 ms",
    )
    neighbour_flush: bool = Field(
        True, description="delete the neighbour entries a route change leaves stale"
    )

    @field_validator("table")
    @classmethod
    def _not_reserved(cls, v: int) -> int:
        if v in (0, 253, 254, 255):
            raise ValueError(f"table {v} is reserved (unspec/default/main/local)")
        return v


class ProbeRunSettings(Section):
    """Per-rail probes (``probes:`` of the agent and the service; issue 8). Off by default.
    The service plans who probes whom (:mod:`linkguard.topology.probeplan`) every ``epoch_s``
    and localises faults from the agents' reports (:mod:`linkguard.topology.localize`); the
    agent probes (:mod:`linkguard.agent.probe`) and reports every ``window_s``.

    ``port`` not given: :data:`PROBE_UDP_PORT` (47910) in ``udp`` mode, :data:`PROBE_ROCE_PORT`
    (4791, RoCEv2's) in ``roce`` mode. Raises ``pydantic.ValidationError`` (naming both
    settings and their values) for settings that would switch localisation off:
    ``min_samples > window_s * rate_pps`` (no pair ever gets enough probes in a window),
    ``min_probers > fan_out`` (never enough witnesses), ``timeout_s > window_s``,
    ``window_s > epoch_s``, ``clear_after_s < window_s``; and for ``fan_out * rate_pps > 16``
    or ``cross_su > fan_out``."""

    enabled: bool = Field(False, description="probe rails and act on localised faults")
    mode: Literal["udp", "roce"] = Field("udp", description="udp on RoCE NICs (see probe.py)")
    port: int = Field(
        PROBE_UDP_PORT,
        ge=1,
        le=65535,
        description="UDP port; not given: 47910 in udp mode, 4791 (RoCEv2) in roce mode",
    )
    fan_out: int = Field(4, ge=1, le=16, description="peers probed per (host, rail)")
    cross_su: int = Field(2, ge=0, le=16, description="of fan_out, on other SUs' leaves")
    rate_pps: float = Field(1.0, gt=0, le=16, description="probes/s to each peer")
    min_probers: int = Field(3, ge=1, le=16, description="witnesses a verdict needs")
    epoch_s: float = Field(300.0, gt=0, le=86_400, description="probe plan rotation (s)")
    window_s: float = Field(10.0, gt=0, le=3600, description="report window (s)")
    timeout_s: float = Field(1.0, gt=0, le=60, description="a probe unanswered this long is lost")
    min_samples: int = Field(5, ge=1, le=100_000, description="probes on a pair before it counts")
    clear_after_s: float = Field(60.0, ge=0, le=86_400, description="loss low this long clears")

    @model_validator(mode="after")
    def _bounded(self) -> ProbeRunSettings:
        if self.fan_out * self.rate_pps > 16:
            raise ValueError(
                f"fan_out {self.fan_out} x rate_pps {self.rate_pps:g} = "
                f"{self.fan_out * self.rate_pps:g} probes/s per port > 16 (the bound that keeps "
                "a 16,384-GPU fleet at or under 524,288 packets/s)"
            )
        if self.cross_su > self.fan_out:
            raise ValueError(f"cross_su {self.cross_su} > fan_out {self.fan_out}")
        return self

    @model_validator(mode="after")
    def _localisable(self) -> ProbeRunSettings:
        # settings that pass every bound of their own but leave the localiser nothing to use
        per_window = self.window_s * self.rate_pps
        if self.min_samples > per_window:
            raise ValueError(
                f"min_samples {self.min_samples} > window_s {self.window_s:g} x rate_pps "
                f"{self.rate_pps:g} = {per_window:g} probes a pair gets per report window: "
                "no pair would ever count and nothing would be localised; lower min_samples "
                "or raise window_s or rate_pps"
            )
        if self.min_probers > self.fan_out:
            raise ValueError(
                f"min_probers {self.min_probers} > fan_out {self.fan_out}: a port has about "
                "fan_out probers and targets, so no verdict could get min_probers witnesses"
            )
        if self.timeout_s > self.window_s:
            raise ValueError(
                f"timeout_s {self.timeout_s:g} > window_s {self.window_s:g}: a probe must be "
                "answered or counted lost within the report window it was sent in"
            )
        if self.window_s > self.epoch_s:
            raise ValueError(
                f"window_s {self.window_s:g} > epoch_s {self.epoch_s:g}: the probe plan would "
                "rotate before a report window ends"
            )
        if self.clear_after_s < self.window_s:
            raise ValueError(
                f"clear_after_s {self.clear_after_s:g} < window_s {self.window_s:g}: a verdict "
                "would clear before one whole window of answered probes, and a lossy port "
                "would flap between drained and used; give clear_after_s >= window_s"
            )
        return self

    @model_validator(mode="after")
    def _port_of_mode(self) -> ProbeRunSettings:
        if "port" not in self.model_fields_set and self.mode == "roce":
            self.port = PROBE_ROCE_PORT  # RoCEv2's port unless the user gave one
            self.model_fields_set.discard("port")  # filled in, not given
        return self


class RailsSocketSettings(Section):
    """The agent's Unix socket for local subscribers (``rails_socket:``;
    :mod:`linkguard.agent.localsub`, ``linkguard rails follow``): the rail map, one JSON line
    per change. ``path`` None (the default): no socket."""

    path: Path | None = Field(
        None,
        description="Unix socket (mode 0660) streaming the rail map, one JSON line per change "
        "(linkguard.agent.localsub; `linkguard rails follow`), e.g. /run/linkguard/rails.sock; "
        "None: no socket",
    )
    group: str | None = Field(
        None, min_length=1, description="group owning the socket (its members may connect)"
    )
    queue: int = Field(
        256, ge=1, le=100_000, description="changes a slow subscriber may lag before it is cut"
    )

    @field_validator("path")
    @classmethod
    def _socket_path(cls, v: Path | None) -> Path | None:
        if v is None:
            return None
        if not v.is_absolute():
            raise ValueError(f"{v}: give an absolute path")
        # sun_path holds 107 bytes; the socket is bound as .<name>.tmp first, then renamed
        if len(os.fsencode(v.parent / f".{v.name}.tmp")) > 107:
            raise ValueError(f"{v}: too long for a Unix socket path (about 100 bytes at most)")
        return v


#: verbs.events words, any case: YAML 1.1's booleans mean what the environment's words mean
_VERBS_EVENTS_WORDS = {
    **dict.fromkeys(("auto", "on", "true", "yes"), "auto"),
    **dict.fromkeys(("off", "false", "no"), "off"),
}


class VerbsSettings(Section):
    """RDMA async events for the sysfs driver (``verbs:``;
    :mod:`linkguard.drivers.verbs_events`): whether to read them, with which Python, which
    reader script."""

    events: Literal["auto", "off"] = Field(
        "auto",
        description="RDMA async events (PORT_ERR, PORT_ACTIVE, LID/GID/SM changes) make the "
        "sysfs driver re-read that HCA's ports at once (linkguard.drivers.verbs_events); auto: "
        "with the sysfs driver when sysfs_root has devices and pyverbs loads; off: polling only; "
        "on/true/yes mean auto, false/no mean off (YAML or LINKGUARD_VERBS__EVENTS alike)",
    )

    @field_validator("events", mode="before")
    @classmethod
    def _on_off(cls, v: object) -> object:
        # YAML 1.1 reads a bare on/off/yes/no as a bool, the environment gives the word: both
        # paths take the same words (any case) and give the same value
        if isinstance(v, bool):
            return "auto" if v else "off"
        if isinstance(v, str):
            word = v.strip().lower()
            if word in _VERBS_EVENTS_WORDS:
                return _VERBS_EVENTS_WORDS[word]
        raise ValueError(
            f"{v!r}: expected auto or off (on, true, yes mean auto; false, no mean off)"
        )

    python: Path = Field(
        Path("/usr/bin/python3"),
        description="the Python that runs the event reader: Debian's python3-pyverbs works "
        "only with the system python3",
    )
    reader: Path | None = Field(
        None, description="the event reader script; None: the one shipped in linkguard.drivers"
    )


class DiscoverySettings(Section):
    """What the agent reports for ``linkguard fabric discover`` (``discovery:``;
    :mod:`linkguard.agent.discoveryio`): every RDMA port with its GUIDs, the netdevs with
    bonds and addresses, and lldpd's neighbours, retained on ``hosts/<host>/discovery``."""

    enabled: bool = Field(True, description="publish the discovery document at all")
    lldp: Literal["auto", "on", "off"] = Field(
        "auto",
        description="LLDP neighbours from lldpd (RoCE fabrics): auto: run lldp_command when "
        "lldpctl is installed, quietly skip when it is not; on: a failure is logged; off: never",
    )
    lldp_command: list[str] = Field(
        default_factory=lambda: ["lldpctl", "-f", "json"],
        min_length=1,
        description="the command printing lldpctl JSON (e.g. with -u SOCKET for an lldpd of "
        "another network namespace)",
    )
    lldp_file: Path | None = Field(
        None, description="read the neighbours from this lldpctl JSON file instead of running it"
    )
    refresh_s: float = Field(
        300.0, ge=5, le=86_400, description="collect again this often (s); published on change"
    )
