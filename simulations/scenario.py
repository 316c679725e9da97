"""Scenario files: a fabric, a timeline of faults and the expected outcome, for ``linkguard sim``.

Consumes: a YAML scenario file (schema ``linkguard.scenario/v1``, below). Produces: a validated
:class:`Scenario` with its :class:`~linkguard.topology.fabric.Fabric` (:func:`load_scenario`)
and the timeline flattened into primitive, time-sorted :class:`Event` records
(:func:`expand`) that the fleet simulator and the namespace lab both replay.

A scenario file (times in seconds from the start of the run)::

    schema: linkguard.scenario/v1
    name: flapping-link
    description: What the scenario shows.
    fabric:
      generate: {hosts: 4, rails: 4, hosts_per_su: 4, spines_per_su: 2}
      # or: file: fabric.yaml        (relative to the scenario file)
    duration_s: 30
    seed: 7                          # drives flap jitter (and the runners' randomness)
    damping: {hold_down_initial_s: 1, hold_down_max_s: 8}   # optional: agent DampingPolicy
    debounce_ms: 50                  # optional: the service's batching window
    timeline:
      - {at_s: 2, kind: flap, host: gpu002, rail: 2, period_s: 2, duration_s: 10}
    expect:                          # optional: the oracle's options (:class:`Expect`)
      max_reroute_ms: 1000
    job: {kind: torch-gloo}          # optional, sim lab only: a training job across the hosts
                                     # (:class:`~linkguard.simulations.jobspec.JobSpec`)
    agent_settings: {}               # optional, sim lab only: more settings for every agent

Fault kinds (``kind``; every entry has ``at_s``): ``link_down``/``link_up`` {host, rail};
``flap`` {host, rail, period_s, duration_s, jitter_s}; ``port_cycle`` {host, rail, polling_s,
linkup_s}; ``leaf_reboot`` {leaf, down_s}; ``spine_loss`` {spine, duration_s}; ``uplink_loss``
{a, b, count, duration_s}; ``broker_outage`` {duration_s}; ``service_restart`` {down_s};
``agent_restart`` {host, down_s}. Each class below says what it expands to.

Every problem raises :class:`ScenarioError` naming the file and the entry:
``scenario.yaml: timeline[3] (flap): host 'gpu999' is not in the fabric``.
"""

from __future__ import annotations

import math
import random
import textwrap
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

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
from linkguard.simulations.jobspec import JobSpec, check_job, job_hosts
from linkguard.topology.fabric import Fabric, check_servable, load_fabric
from linkguard.topology.generator import generate_rail_optimized

__all__ = [
    "EVENT_KINDS",
    "FAULT_KINDS",
    "MAX_EVENTS",
    "SCENARIOS_DIR",
    "SCHEMA",
    "AgentRestart",
    "BrokerOutage",
    "Event",
    "Expect",
    "FabricSource",
    "Fault",
    "Flap",
    "GenerateSpec",
    "LeafReboot",
    "LinkDown",
    "LinkUp",
    "LoadedScenario",
    "PortCycle",
    "Scenario",
    "ScenarioError",
    "ServiceRestart",
    "SpineLoss",
    "UplinkLoss",
    "dump_scenario",
    "expand",
    "load_scenario",
    "shipped_scenarios",
    "summary_text",
]

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


# --------------------------------------------------------------------------------------------
# Fabric, expectations


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
    - ``job_max_stall_ms`` (needs ``job:``; sim lab, with linkguard): every fault's job stall
      (the longest step beyond the median step, ms) is at most this;
    - ``job_rank_failures`` (needs ``job:``; sim lab, with linkguard): at most this many ranks
      fail; a job scenario checks 0 when it is not given.

    None: not checked.
    """

    reachability: bool = True
    max_reroute_ms: float | None = Field(None, gt=0, le=3_600_000)
    max_plans_per_host_per_event: int | None = Field(None, ge=1, le=1000)
    job_max_stall_ms: float | None = Field(None, gt=0, le=3_600_000)
    job_rank_failures: int | None = Field(None, ge=0, le=1024)


# --------------------------------------------------------------------------------------------
# Faults


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
    default. ``job``: a training job the lab runs (``sim lab`` only). ``agent_settings``:
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
    agent_settings: dict[Annotated[str, Field(pattern=_SETTING_KEY)], object] = Field(
        default_factory=dict, max_length=64
    )

    @model_validator(mode="after")
    def _job_expectations(self) -> Scenario:
        for key in ("job_max_stall_ms", "job_rank_failures"):
            if getattr(self.expect, key) is not None and self.job is None:
                raise ValueError(f"expect.{key} needs a job: block (there is no job to measure)")
        return self


@dataclass(frozen=True)
class LoadedScenario:
    """A validated scenario, its fabric and the file it came from."""

    path: Path
    scenario: Scenario
    fabric: Fabric


# --------------------------------------------------------------------------------------------
# Events

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


# --------------------------------------------------------------------------------------------
# Loading


def _where(loc: tuple[int | str, ...], data: object) -> tuple[str, tuple[int | str, ...]]:
    """``("timeline[3] (flap)", rest of loc)`` for a pydantic error location inside the
    timeline, else ``("", loc)``. The kind comes from the location or from the entry itself."""
    if len(loc) < 2 or loc[0] != "timeline" or not isinstance(loc[1], int):
        return "", loc
    i, rest = loc[1], loc[2:]
    kind = None
    if rest and rest[0] in FAULT_KINDS:
        kind, rest = rest[0], rest[1:]
    elif isinstance(data, dict):
        entries = data.get("timeline")
        if isinstance(entries, list) and i < len(entries) and isinstance(entries[i], dict):
            k = entries[i].get("kind")
            kind = k if isinstance(k, str) and k in FAULT_KINDS else None
    return (f"timeline[{i}] ({kind})" if kind else f"timeline[{i}]"), rest


def _summary(exc: ValidationError, data: object, limit: int = 5) -> str:
    parts = []
    for e in exc.errors()[:limit]:
        where, rest = _where(tuple(e["loc"]), data)
        field = ".".join(str(p) for p in rest)
        msg = e["msg"].removeprefix("Value error, ")
        text = f"{field}: {msg}" if field else msg
        parts.append(f"{where}: {text}" if where else text)
    more = exc.error_count() - limit
    if more > 0:
        parts.append(f"... and {more} more")
    return "; ".join(parts)


_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_scenario(path: str | Path) -> LoadedScenario:
    """Read, validate and check a scenario file against its fabric (generated, or loaded
    with :func:`~linkguard.topology.fabric.load_fabric` relative to the file's directory; it
    must be servable: :func:`~linkguard.topology.fabric.check_servable`).

    Checks beyond the schema: every host, rail (the host has an HCA on it), leaf (a switch
    with role leaf), spine (role spine: spine or core tier) and switch pair (at least
    ``count`` switch-to-switch cables) exists; every entry ends within ``duration_s``; a
    ``link_up`` follows a ``link_down`` of its port; no two entries hold the same port,
    switch, cable pair, agent, broker or service at once; at most :data:`MAX_EVENTS` events.

    Raises :class:`ScenarioError` (a ValueError) naming ``path`` and the entry on any problem:
    unreadable file, bad YAML, wrong ``schema``, a schema violation, a bad fabric or one of the
    checks above.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ScenarioError(f"{p}: cannot read scenario file: {exc}") from None
    try:
        data = yaml.load(text, Loader=_YAML_LOADER)
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        raise ScenarioError(f"{p}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ScenarioError(
            f"{p}: expected a mapping with schema/name/fabric/timeline, got {type(data).__name__}"
        )
    version = data.get("schema")
    if version != SCHEMA:
        got = "no schema: key" if version is None else f"schema {version!r}"
        raise ScenarioError(f"{p}: {got}; this linkguard reads `schema: {SCHEMA}`")
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(f"{p}: {_summary(exc, data)}") from None
    except RecursionError:
        raise ScenarioError(f"{p}: nested too deeply") from None
    fabric = _load_fabric(scenario.fabric, p)
    problems = _check(scenario, fabric)
    if problems:
        raise ScenarioError(f"{p}: {'; '.join(problems[:5])}")
    return LoadedScenario(path=p, scenario=scenario, fabric=fabric)


def _load_fabric(src: FabricSource, path: Path) -> Fabric:
    if src.generate is not None:
        try:
            return generate_rail_optimized(**src.generate.model_dump())
        except ValueError as exc:
            raise ScenarioError(f"{path}: fabric.generate: {exc}") from None
    assert src.file is not None
    file = path.parent / src.file
    try:
        return check_servable(load_fabric(file), file)
    except ValueError as exc:  # FabricError, and a NUL byte in the path
        raise ScenarioError(f"{path}: fabric.file: {exc}") from None


def _label(i: int, fault: Fault) -> str:
    return f"timeline[{i}] ({fault.kind})"


def _check(scenario: Scenario, fabric: Fabric) -> list[str]:
    """Every problem of ``scenario`` on ``fabric``, one sentence each (empty: none)."""
    problems: list[str] = []
    switches = {s.name: s for s in fabric.switches}
    cables = _cable_counts(fabric)
    leaf_ports = _leaf_ports(fabric)
    end = scenario.duration_s
    events = 0
    for i, f in enumerate(scenario.timeline):
        where = _label(i, f)
        problem = _check_names(f, fabric, switches, cables)
        if problem:
            problems.append(f"{where}: {problem}")
            continue
        span = f.span_s()
        last = f.at_s + (span or 0.0)
        if last > end + _EPS:
            what = "starts" if not span else "ends"
            problems.append(
                f"{where}: {what} at {last:g} s, after the scenario's duration_s {end:g}"
            )
        events += _event_count(f, leaf_ports)
    if events > MAX_EVENTS:
        problems.append(f"timeline: {events:,} events; at most {MAX_EVENTS:,} per scenario")
    if scenario.job is not None:
        problems += check_job(scenario.job, fabric)
    if not problems:
        problems += _overlaps(scenario, leaf_ports)
    return problems


def _check_names(
    f: _Fault, fabric: Fabric, switches: dict, cables: dict[tuple[str, str], int]
) -> str | None:
    """Why a name in ``f`` is not in ``fabric`` (None: all are)."""
    if isinstance(f, _PortFault | AgentRestart):
        try:
            inv = fabric.host(f.host)
        except KeyError:
            return f"host {f.host!r} is not in the fabric"
        if isinstance(f, _PortFault) and not any(c.rail == f.rail for c in inv.hcas):
            have = ", ".join(str(c.rail) for c in sorted(inv.hcas, key=lambda c: c.rail))
            return f"host {f.host!r} has no HCA on rail {f.rail} (its rails: {have})"
    for name, role in _switch_roles(f):
        s = switches.get(name)
        if s is None:
            return f"switch {name!r} is not in the fabric"
        if s.role != role:
            return f"switch {name!r} is a {s.role}, not a {role}"
    if isinstance(f, UplinkLoss):
        pair = f.cable.pair
        n = cables.get(pair, 0)
        if n == 0:
            return f"no switch-to-switch cable between {f.a!r} and {f.b!r} in the fabric"
        if f.count is not None and f.count > n:
            return f"count {f.count} but there are {n} cable(s) between {f.a!r} and {f.b!r}"
    return None


def _switch_roles(f: _Fault) -> list[tuple[str, str]]:
    if isinstance(f, LeafReboot):
        return [(f.leaf, "leaf")]
    if isinstance(f, SpineLoss):
        return [(f.spine, "spine")]
    return []


def _cable_counts(fabric: Fabric) -> dict[tuple[str, str], int]:
    """Switch-to-switch cables per switch pair (names in order)."""
    out: Counter[tuple[str, str]] = Counter()
    for link in fabric.links:
        if link.kind != "host-leaf":
            out[(link.a, link.b) if link.a <= link.b else (link.b, link.a)] += 1
    return dict(out)


def _leaf_ports(fabric: Fabric) -> dict[str, list[tuple[str, int, str, int]]]:
    """Leaf name -> its host ports ``(host, rail, hca, port)`` in fabric link order."""
    ports = {
        f"{h.host}:{c.key}": (h.host, c.rail, c.hca, c.port) for h in fabric.hosts for c in h.hcas
    }
    out: dict[str, list[tuple[str, int, str, int]]] = {}
    for link in fabric.links:
        if link.kind != "host-leaf":
            continue
        port, leaf = (link.a, link.b) if link.a in ports else (link.b, link.a)
        if port in ports:
            out.setdefault(leaf, []).append(ports[port])
    return out


def _event_count(f: _Fault, leaf_ports: dict[str, list]) -> int:
    if isinstance(f, Flap):
        return 2 * f.cycles
    if isinstance(f, PortCycle):
        return 3
    if isinstance(f, LinkDown | LinkUp):
        return 1
    if isinstance(f, LeafReboot):
        return 2 * (1 + len(leaf_ports.get(f.leaf, [])))
    return 1 if f.span_s() is None else 2


def _overlaps(scenario: Scenario, leaf_ports: dict[str, list]) -> list[str]:
    """Entries that hold the same resource (a port, switch, cable pair, agent, the broker or
    the service) at overlapping times; a ``link_up`` without a ``link_down`` before it."""
    inf = math.inf
    held: dict[tuple, list[tuple[float, float, int]]] = {}  # resource -> (start, end, entry)
    problems: list[str] = []
    open_downs: dict[tuple, tuple[float, int]] = {}  # port -> (at_s, entry) of its link_down
    order = sorted(range(len(scenario.timeline)), key=lambda i: (scenario.timeline[i].at_s, i))
    for i in order:
        f = scenario.timeline[i]
        if isinstance(f, LinkDown):
            key = ("port", f.host, f.rail)
            if key in open_downs:
                _, j = open_downs[key]
                problems.append(
                    f"{_label(i, f)}: {f.host} rail {f.rail} is already down "
                    f"(timeline[{j}] (link_down)); bring it up with a link_up first"
                )
            open_downs[key] = (f.at_s, i)
            continue
        if isinstance(f, LinkUp):
            key = ("port", f.host, f.rail)
            if key not in open_downs:
                problems.append(
                    f"{_label(i, f)}: {f.host} rail {f.rail} is not down at {f.at_s:g} s (no "
                    "link_down before it)"
                )
                continue
            start, j = open_downs.pop(key)
            held.setdefault(key, []).append((start, f.at_s, j))
            continue
        span = f.span_s()
        stop = inf if span is None else f.at_s + span
        for key in _resources(f, leaf_ports):
            held.setdefault(key, []).append((f.at_s, stop, i))
    for key, (start, j) in open_downs.items():
        held.setdefault(key, []).append((start, inf, j))
    for key, spans in held.items():
        spans.sort()
        first = spans[0]  # of the spans so far, the one that ends last
        for later in spans[1:]:
            s0, e0, i0 = first
            if later[0] < e0 or later[0] == s0:
                i1 = later[2]
                until = "the end" if e0 == inf else f"{e0:g} s"
                problems.append(
                    f"{_label(i1, scenario.timeline[i1])}: overlaps "
                    f"{_label(i0, scenario.timeline[i0])} on {_resource_name(key)} (held from "
                    f"{s0:g} s until {until})"
                )
            if later[1] > e0:
                first = later
    return problems


def _resources(f: _Fault, leaf_ports: dict[str, list]) -> list[tuple]:
    if isinstance(f, _PortFault):
        return [("port", f.host, f.rail)]
    if isinstance(f, LeafReboot):
        return [("switch", f.leaf)] + [("port", h, r) for h, r, _, _ in leaf_ports.get(f.leaf, [])]
    if isinstance(f, SpineLoss):
        return [("switch", f.spine)]
    if isinstance(f, UplinkLoss):
        return [("cables", *f.cable.pair)]
    if isinstance(f, AgentRestart):
        return [("agent", f.host)]
    if isinstance(f, BrokerOutage):
        return [("broker",)]
    if isinstance(f, ServiceRestart):
        return [("service",)]
    return []


def _resource_name(key: tuple) -> str:
    kind, *rest = key
    if kind == "port":
        return f"{rest[0]} rail {rest[1]}"
    if kind == "switch":
        return f"switch {rest[0]}"
    if kind == "cables":
        return f"the cables between {rest[0]} and {rest[1]}"
    if kind == "agent":
        return f"the agent of {rest[0]}"
    return f"the {kind}"


# --------------------------------------------------------------------------------------------
# Expansion

_DOWN = (PortStateName.DOWN, PhysState.POLLING)
_TRAINED = (PortStateName.DOWN, PhysState.LINK_UP)
_ACTIVE = (PortStateName.ACTIVE, PhysState.LINK_UP)


def expand(loaded: LoadedScenario) -> list[Event]:
    """The timeline as primitive events, sorted by time, then timeline entry, then their
    order inside the entry (a leaf before its ports). Deterministic: the same scenario and
    seed give the same list (flap jitter comes from a generator seeded with the scenario's
    seed and the entry index, so adding an entry does not move the others). Times are seconds
    from the start, rounded to the microsecond. See each fault class for its events."""
    sc, fabric = loaded.scenario, loaded.fabric
    leaf_ports = _leaf_ports(fabric)
    keyed: list[tuple[float, int, int, Event]] = []
    for i, f in enumerate(sc.timeline):
        events = _entry_events(i, f, sc.seed, fabric, leaf_ports)
        keyed += [(e.at_s, i, k, e) for k, e in enumerate(events)]
    keyed.sort(key=lambda x: x[:3])
    return [e for *_, e in keyed]


def _entry_events(
    i: int, f: _Fault, seed: int, fabric: Fabric, leaf_ports: dict[str, list]
) -> list[Event]:
    """The events of timeline entry ``i`` in the order they happen inside it."""
    out: list[Event] = []

    def add(
        t: float,
        kind: EventKind,
        *,
        host: str | None = None,
        rail: int | None = None,
        hca: str | None = None,
        port: int | None = None,
        state: PortStateName | None = None,
        phys_state: PhysState | None = None,
        switch: str | None = None,
        cable: CableRef | None = None,
    ) -> None:
        out.append(
            Event(
                at_s=round(t, 6),
                kind=kind,
                entry=i,
                host=host,
                rail=rail,
                hca=hca,
                port=port,
                state=state,
                phys_state=phys_state,
                switch=switch,
                cable=cable,
            )
        )

    def port(t: float, host: str, rail: int, reading: tuple[PortStateName, PhysState]) -> None:
        hca = next(c for c in fabric.host(host).hcas if c.rail == rail)
        state, phys = reading
        kind: EventKind = "port_up" if state == PortStateName.ACTIVE else "port_down"
        add(
            t,
            kind,
            state=state,
            phys_state=phys,
            host=host,
            rail=rail,
            hca=hca.hca,
            port=hca.port,
        )

    t0 = f.at_s
    if isinstance(f, LinkDown):
        port(t0, f.host, f.rail, _DOWN)
    elif isinstance(f, LinkUp):
        port(t0, f.host, f.rail, _ACTIVE)
    elif isinstance(f, Flap):
        rng = random.Random(f"{seed}/{i}")
        for k in range(f.cycles):
            start = t0 + k * f.period_s
            port(start + rng.uniform(0, f.jitter_s), f.host, f.rail, _DOWN)
            port(start + f.period_s / 2 + rng.uniform(0, f.jitter_s), f.host, f.rail, _ACTIVE)
    elif isinstance(f, PortCycle):
        port(t0, f.host, f.rail, _DOWN)
        port(t0 + f.polling_s, f.host, f.rail, _TRAINED)
        port(t0 + f.polling_s + f.linkup_s, f.host, f.rail, _ACTIVE)
    elif isinstance(f, LeafReboot):
        reboot: tuple[tuple[float, EventKind, tuple[PortStateName, PhysState]], ...] = (
            (t0, "switch_down", _DOWN),
            (t0 + f.down_s, "switch_up", _ACTIVE),
        )
        for t, kind, reading in reboot:
            add(t, kind, switch=f.leaf)
            for host, rail, _, _ in leaf_ports.get(f.leaf, []):
                port(t, host, rail, reading)
    elif isinstance(f, SpineLoss):
        add(t0, "switch_down", switch=f.spine)
        if f.duration_s is not None:
            add(t0 + f.duration_s, "switch_up", switch=f.spine)
    elif isinstance(f, UplinkLoss):
        add(t0, "cables_down", cable=f.cable)
        if f.duration_s is not None:
            add(t0 + f.duration_s, "cables_up", cable=f.cable)
    elif isinstance(f, BrokerOutage | ServiceRestart | AgentRestart):
        down, up = _RESTART_KINDS[type(f)]
        host = f.host if isinstance(f, AgentRestart) else None
        add(t0, down, host=host)
        add(t0 + f.span_s(), up, host=host)
    return out


#: The events of a broker outage, a service restart and an agent restart.
_RESTART_KINDS: dict[type[_Fault], tuple[EventKind, EventKind]] = {
    BrokerOutage: ("broker_down", "broker_up"),
    ServiceRestart: ("service_down", "service_up"),
    AgentRestart: ("agent_down", "agent_up"),
}


# --------------------------------------------------------------------------------------------
# Writing and summaries


def dump_scenario(scenario: Scenario) -> str:
    """``scenario`` as YAML (``schema`` first, unset optional keys left out) that
    :func:`load_scenario` reads back into an equal :class:`Scenario`."""
    data = scenario.model_dump(mode="json", by_alias=True, exclude_none=True)
    return yaml.safe_dump(data, sort_keys=False)


def shipped_scenarios() -> list[Path]:
    """The golden scenario files shipped with linkguard, sorted by name."""
    return sorted(SCENARIOS_DIR.glob("*.yaml"))


def summary_text(loaded: LoadedScenario, events: list[Event], *, first: int = 5) -> str:
    """A few lines about ``loaded`` for ``linkguard sim check``: name, fabric size, duration,
    events per kind and the ``first`` events."""
    sc, fabric = loaded.scenario, loaded.fabric
    roles = Counter(s.role for s in fabric.switches)
    host_links = sum(1 for link in fabric.links if link.kind == "host-leaf")
    src = "generated" if sc.fabric.generate is not None else f"file {sc.fabric.file}"
    kinds = Counter(e.kind for e in events)
    per_kind = ", ".join(f"{k} {kinds[k]}" for k in EVENT_KINDS if kinds[k]) or "none"
    entries = f"{len(sc.timeline)} timeline entr{'y' if len(sc.timeline) == 1 else 'ies'}"
    lines = [
        f"{loaded.path}: ok",
        f"  {sc.name}: {textwrap.shorten(sc.description.split('. ')[0], 96)}",
        f"  fabric: {src}, {len(fabric.hosts)} hosts x {len(fabric.rails)} rails, "
        f"{roles['leaf']} leaves, {roles['spine']} spines, {host_links} host cables, "
        f"{len(fabric.links) - host_links} switch cables",
        f"  duration {sc.duration_s:g} s, seed {sc.seed}, {entries}, "
        f"{len(events)} events: {per_kind}",
    ]
    if sc.job is not None:
        j = sc.job
        lines.append(
            f"  job: {j.kind}, {len(job_hosts(j, fabric))} ranks, {j.layers} x Linear({j.width}), "
            f"compute {j.compute_ms:g} ms per step, collective timeout {j.timeout_s:g} s "
            "(sim lab only)"
        )
    if events and first:
        lines.append(f"  first {min(first, len(events))}:")
        lines += [f"    {e}" for e in events[:first]]
    return "\n".join(lines) + "\n"
