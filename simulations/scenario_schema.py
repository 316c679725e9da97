"""The scenario file's schema (``linkguard.scenario/v1``; the format is in
:mod:`linkguard.simulations.scenario`'s docstring): the fabric source, the fault kinds of the
timeline, the expectations, the :class:`Scenario` itself, and the :class:`Event` a timeline
expands to. Pydantic models; a file that does not fit raises :class:`ScenarioError` when loaded."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from linkguard.agent.monitor import DampingPolicy
from linkguard.models import (
    CableRef,
    CoreTier,
    HostName,
    ManagementHostsPerSU,
    PhysState,
    PortStateName,
    RailIndex,
    SpinesPerSU,
    SwitchName,
)
from linkguard.simulations.chaosspec import ChaosSpec
from linkguard.simulations.jobspec import JobSpec
from linkguard.topology.fabric import Fabric

#: The schema this module reads and writes (the ``schema:`` key of every scenario file).
SCHEMA = "linkguard.scenario/v1"

#: The golden scenarios shipped with the package (``simulations/scenarios/*.yaml``).
SCENARIOS_DIR = Path(__file__).resolve().parent / "scenarios"

#: Upper bound on the primitive events of one scenario (a link flapping every 20 ms for a day
#: would be 8.6 million); a longer timeline is refused at load time.
MAX_EVENTS = 1_000_000

#: Upper bound on ``duration_s``: one year.
MAX_DURATION_S = 366 * 86400.0

#: Upper bound on a generated fabric's host ports (hosts x rails).
MAX_HOST_PORTS = 16384 * 8

#: Slack for float sums (``at_s + duration_s`` compared with the scenario's ``duration_s``).
_EPS = 1e-9


class ScenarioError(ValueError):
    """A scenario file that cannot be used; the message names the file and the entry."""


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, str_strip_whitespace=True, allow_inf_nan=False
    )


Seconds = Annotated[float, Field(ge=0, le=MAX_DURATION_S)]


PositiveSeconds = Annotated[float, Field(gt=0, le=MAX_DURATION_S)]


class GenerateSpec(_Model):
    """Parameters of :func:`~linkguard.topology.generator.generate_rail_optimized` (same
    names and defaults; ``hosts`` and ``rails`` are required). At most 131,072 host ports
    (16,384 hosts x 8 rails)."""

    hosts: int = Field(ge=1, le=16384)
    rails: int = Field(ge=1, le=64)
    gpus_per_host: int | None = Field(None, ge=1, le=64, description="default: = rails")
    hosts_per_su: int = Field(32, ge=1, le=1024)
    management_hosts_per_su: ManagementHostsPerSU = 0
    spines_per_su: SpinesPerSU = 4
    core: CoreTier = None

    @model_validator(mode="after")
    def _size(self) -> GenerateSpec:
        if self.hosts * self.rails > MAX_HOST_PORTS:
            raise ValueError(
                f"{self.hosts} hosts x {self.rails} rails is above {MAX_HOST_PORTS:,} host ports"
            )
        return self


class FabricSource(_Model):
    """Exactly one of ``generate`` (generator parameters) or ``file`` (a fabric file, JSON or
    YAML, relative to the scenario file's directory)."""

    generate: GenerateSpec | None = None
    file: str | None = Field(None, min_length=1, max_length=4096)

    @model_validator(mode="after")
    def _one(self) -> FabricSource:
        if (self.generate is None) == (self.file is None):
            raise ValueError("give either generate: (generator parameters) or file: (a path)")
        return self


class Expect(_Model):
    """What the oracle checks after the run. A *settle* is the moment every agent acked the
    plans that follow a transition; an *event* for the bounds is one transition of one
    timeline entry (the primitive events one entry has at one instant, e.g. a leaf and all
    its host ports going down).

    - ``reachability``: after every settle, the GPU endpoint pairs observed reachable equal
      those the fabric model says are reachable with the faults in force (False: not checked);
    - ``max_reroute_ms``: every down transition's time to the last ack (ms) is at most this;
    - ``max_plans_per_host_per_event``: no host receives more plans (epochs) than this for one
      event (batching: a leaf reboot is one plan per host, not one per port);
    - ``fast_path`` (True: checked): every host port that goes down in use (UP, UNKNOWN or
      DEGRADED before) while its agent runs gets its agent's fast path at once (the backup of
      the plan in place), and at least one does (``sim run --bus``: every down transition of
      one host's ports got a fast-path ack; ``sim lab``, with linkguard: every host link fault
      got its host's fast-path ack on the bus before the next fault);
    - ``job_max_stall_ms`` (needs ``job:``; sim lab, with linkguard): every fault's job stall
      (the longest step beyond the median step, ms) is at most this;
    - ``job_rank_failures`` (needs ``job:``; sim lab, with linkguard): at most this many ranks
      fail; a job scenario checks 0 when it is not given.

    None: not checked.
    """

    reachability: bool = True
    max_reroute_ms: float | None = Field(None, gt=0, le=3_600_000)
    max_plans_per_host_per_event: int | None = Field(None, ge=1, le=1000)
    fast_path: bool = False
    job_max_stall_ms: float | None = Field(None, gt=0, le=3_600_000)
    job_rank_failures: int | None = Field(None, ge=0, le=1024)


class _Fault(_Model):
    at_s: Seconds = Field(description="seconds from the start of the run")

    def span_s(self) -> float | None:
        """How long the fault lasts after ``at_s`` (s); None = until the end of the run."""
        return 0.0


class _PortFault(_Fault):
    host: HostName
    rail: RailIndex


class LinkDown(_PortFault):
    """The host's rail port goes DOWN/Polling (cable pulled, peer gone) and stays down until
    a ``link_up`` of the same port. One ``port_down`` event."""

    kind: Literal["link_down"]

    def span_s(self) -> float | None:
        return None  # until its link_up: see _port_intervals


class LinkUp(_PortFault):
    """The port comes back ACTIVE/LinkUp; needs an earlier ``link_down`` of the same port.
    One ``port_up`` event."""

    kind: Literal["link_up"]


class Flap(_PortFault):
    """The port flaps: n = floor(duration_s / period_s) cycles, cycle k going down at
    ``at_s + k * period_s`` and up half a period later, each transition delayed by a random
    0..``jitter_s`` (drawn from the scenario's seed). The port is up at the end. 2n events."""

    kind: Literal["flap"]
    period_s: float = Field(
        gt=0.01, le=MAX_DURATION_S, description="one down/up cycle (s), > 10 ms"
    )
    duration_s: PositiveSeconds
    jitter_s: float = Field(0.0, ge=0, description="< period_s / 2, keeps the order")

    @model_validator(mode="after")
    def _check(self) -> Flap:
        if self.duration_s < self.period_s - _EPS:
            raise ValueError(
                f"duration_s {self.duration_s:g} is shorter than one period ({self.period_s:g} s)"
            )
        if self.jitter_s >= self.period_s / 2:
            raise ValueError(
                f"jitter_s {self.jitter_s:g} must be below half the period "
                f"({self.period_s / 2:g} s), or a flap's up could come before its down"
            )
        return self

    @property
    def cycles(self) -> int:
        return math.floor(self.duration_s / self.period_s + _EPS)

    def span_s(self) -> float:
        return self.cycles * self.period_s


class PortCycle(_PortFault):
    """The port retrains as IB ports do: DOWN/Polling at ``at_s``, DOWN/LinkUp ``polling_s``
    later (trained, waiting for the subnet manager), ACTIVE/LinkUp ``linkup_s`` after that.
    Three events: ``port_down``, ``port_down``, ``port_up``."""

    kind: Literal["port_cycle"]
    polling_s: PositiveSeconds
    linkup_s: PositiveSeconds

    def span_s(self) -> float:
        return self.polling_s + self.linkup_s


class LeafReboot(_Fault):
    """A leaf switch reboots: at ``at_s`` the switch and every host port cabled to it go down
    (DOWN/Polling), ``down_s`` later all come back. Events: ``switch_down`` then one
    ``port_down`` per host port (fabric link order), and the same with ``_up``."""

    kind: Literal["leaf_reboot"]
    leaf: SwitchName
    down_s: PositiveSeconds

    def span_s(self) -> float:
        return self.down_s


class SpineLoss(_Fault):
    """A spine (or core) switch goes down for ``duration_s``, or for good (None). Events:
    ``switch_down``, and ``switch_up`` when it comes back."""

    kind: Literal["spine_loss"]
    spine: SwitchName
    duration_s: PositiveSeconds | None = None

    def span_s(self) -> float | None:
        return self.duration_s


class UplinkLoss(_Fault):
    """``count`` of the cables between switches ``a`` and ``b`` (None: all) go down for
    ``duration_s`` (None: for good), as :class:`~linkguard.models.CableRef` says. Events:
    ``cables_down``, and ``cables_up`` when they come back."""

    kind: Literal["uplink_loss"]
    a: SwitchName
    b: SwitchName
    count: int | None = Field(None, ge=1, le=255)
    duration_s: PositiveSeconds | None = None

    @model_validator(mode="after")
    def _two_switches(self) -> UplinkLoss:
        if self.a == self.b:
            raise ValueError(f"a cable joins two switches, not {self.a!r} to itself")
        return self

    @property
    def cable(self) -> CableRef:
        return CableRef(a=self.a, b=self.b, count=self.count)

    def span_s(self) -> float | None:
        return self.duration_s


class BrokerOutage(_Fault):
    """The MQTT broker is down for ``duration_s``. Events: ``broker_down``, ``broker_up``."""

    kind: Literal["broker_outage"]
    duration_s: PositiveSeconds

    def span_s(self) -> float:
        return self.duration_s


class ServiceRestart(_Fault):
    """The topology service stops and starts again ``down_s`` later. Events:
    ``service_down``, ``service_up``."""

    kind: Literal["service_restart"]
    down_s: PositiveSeconds

    def span_s(self) -> float:
        return self.down_s


class AgentRestart(_Fault):
    """The agent of ``host`` stops and starts again ``down_s`` later (routes stay). Events:
    ``agent_down``, ``agent_up``."""

    kind: Literal["agent_restart"]
    host: HostName
    down_s: PositiveSeconds

    def span_s(self) -> float:
        return self.down_s


Fault = Annotated[
    LinkDown
    | LinkUp
    | Flap
    | PortCycle
    | LeafReboot
    | SpineLoss
    | UplinkLoss
    | BrokerOutage
    | ServiceRestart
    | AgentRestart,
    Field(discriminator="kind"),
]


#: Every fault ``kind`` of a timeline entry, from the union above.
FAULT_KINDS: tuple[str, ...] = tuple(
    get_args(m.model_fields["kind"].annotation)[0] for m in get_args(get_args(Fault)[0])
)


#: An agent setting's name in ``agent_settings``: a key, or dotted keys into sections.
_SETTING_KEY = r"^[a-z_][a-z0-9_]{0,63}(\.[a-z_][a-z0-9_]{0,63}){0,4}$"


class Scenario(_Model):
    """One scenario file (module docstring). ``schema`` is ``version`` in Python.
    ``damping`` None: the agents' default policy; ``debounce_ms`` None: the service's
    default. ``job``: a training job the lab runs (``sim lab`` only). ``chaos``: a lab chaos
    run (``sim lab`` only; :class:`~linkguard.simulations.chaosspec.ChaosSpec`), played
    instead of a timeline, so it has none and no job. ``agent_settings``:
    settings added to every lab agent's config (``sim lab`` only; a key may be dotted,
    ``routes.rto_min_ms: 20``; the agent validates them, and
    :func:`~linkguard.simulations.labprocs.agent_overrides` refuses the ones the lab sets
    itself). Checks against the fabric happen in :func:`load_scenario`."""

    model_config = ConfigDict(populate_by_name=True)

    version: Literal["linkguard.scenario/v1"] = Field(alias="schema")
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    description: str = Field(min_length=1, max_length=4000)
    fabric: FabricSource
    duration_s: PositiveSeconds
    seed: int = Field(0, ge=0, le=2**63 - 1)
    damping: DampingPolicy | None = None
    debounce_ms: float | None = Field(None, ge=0, le=10_000)
    timeline: list[Fault] = Field(default_factory=list, max_length=100_000)
    expect: Expect = Expect()
    job: JobSpec | None = None
    chaos: ChaosSpec | None = None
    agent_settings: dict[Annotated[str, Field(pattern=_SETTING_KEY)], object] = Field(
        default_factory=dict, max_length=64
    )

    @model_validator(mode="after")
    def _job_expectations(self) -> Scenario:
        for key in ("job_max_stall_ms", "job_rank_failures"):
            if getattr(self.expect, key) is not None and self.job is None:
                raise ValueError(f"expect.{key} needs a job: block (there is no job to measure)")
        if self.chaos is not None and (self.timeline or self.job is not None):
            raise ValueError(
                "a chaos: scenario plays its seeded storm instead of a timeline: give it no "
                "timeline and no job"
            )
        if self.chaos is not None and self.chaos.storm_s > self.duration_s:
            raise ValueError(
                f"chaos.storm_s {self.chaos.storm_s:g} is longer than duration_s "
                f"{self.duration_s:g}"
            )
        return self


@dataclass(frozen=True)
class LoadedScenario:
    """A validated scenario, its fabric and the file it came from."""

    path: Path
    scenario: Scenario
    fabric: Fabric


#: Primitive event kinds :func:`expand` produces.
EventKind = Literal[
    "port_down",
    "port_up",
    "switch_down",
    "switch_up",
    "cables_down",
    "cables_up",
    "broker_down",
    "broker_up",
    "service_down",
    "service_up",
    "agent_down",
    "agent_up",
]


EVENT_KINDS: tuple[EventKind, ...] = get_args(EventKind)


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One primitive event at ``at_s`` seconds from the start (rounded to the microsecond).

    ``entry`` is the index of the timeline entry it came from. Port events (``port_down``,
    ``port_up``) set ``host``, ``rail``, ``hca``, ``port`` and the readings to apply:
    ``state`` (logical, IBA PortState) and ``phys_state``; ``port_down`` is any reading that
    is not ACTIVE. Switch events set ``switch``; cable events ``cable`` (which cables, as in
    the bus's ``fabric/faults``; each event is a change, so a runner keeps the switches and
    cables down and publishes the whole set); agent events ``host``. Broker and service
    events set nothing else.
    """

    at_s: float
    kind: EventKind
    entry: int
    host: str | None = None
    rail: int | None = None
    hca: str | None = None
    port: int | None = None
    state: PortStateName | None = None
    phys_state: PhysState | None = None
    switch: str | None = None
    cable: CableRef | None = None

    # What each kind always sets (:func:`expand` makes every event), for the runners

    @property
    def port_key(self) -> tuple[str, int]:
        """``(host, rail)`` of a port event."""
        assert self.host is not None and self.rail is not None, f"{self.kind}: no port"
        return self.host, self.rail

    @property
    def switch_name(self) -> str:
        """The switch of a switch event."""
        assert self.switch is not None, f"{self.kind}: no switch"
        return self.switch

    @property
    def cable_ref(self) -> CableRef:
        """The cables of a cable event."""
        assert self.cable is not None, f"{self.kind}: no cable"
        return self.cable

    @property
    def host_name(self) -> str:
        """The host of a port or agent event."""
        assert self.host is not None, f"{self.kind}: no host"
        return self.host

    def __str__(self) -> str:
        what = [f"{self.at_s:9.3f} s  {self.kind}"]
        if self.kind.startswith("port_"):
            what.append(f"{self.host} rail {self.rail} ({self.hca}/{self.port})")
            what.append(f"{self.state}/{self.phys_state}")
        elif self.switch is not None:
            what.append(self.switch)
        elif self.cable is not None:
            n = "all" if self.cable.count is None else str(self.cable.count)
            what.append(f"{self.cable.a} - {self.cable.b} ({n})")
        elif self.host is not None:
            what.append(self.host)
        return " ".join(what) + f"  [timeline[{self.entry}]]"
