"""Real-time replay of a scenario on an in-process fleet over a real bus.

Consumes: a :class:`~linkguard.simulations.scenario.LoadedScenario` and a bus kind
(``mosquitto``: a private Mosquitto, :class:`~linkguard.broker.MosquittoProcess`; ``memory``:
the in-memory broker of :mod:`linkguard.membus`). Produces: a :class:`LiveReport` (what the
engine's :class:`~linkguard.simulations.engine.RunReport` says, plus per down transition the
time to the agent's fast path and to the first and last ack of the plan epoch it caused,
measured over the bus).

What runs is the product: :class:`~linkguard.simulations.fleet.SimulatedFleet` (the real
:class:`~linkguard.topology.service.TopologyService` and one real
:class:`~linkguard.agent.daemon.Agent` per host, simulated port drivers, in-memory route
tables) on the chosen broker, in one process, on the wall clock. Time 0 is a fleet at rest:
every host acked its first plan, the service has every port's state, and its solve back-off
is quiet again (``solve_holddown_ms`` after those first states). The timeline then plays at
its own pace:

- ``port_down``/``port_up``: the host's simulated port source reads the event's state and
  phys_state (DOWN/Polling, DOWN/LinkUp, ACTIVE/LinkUp);
- switch and cable events: the whole :class:`~linkguard.models.FabricFaults` set in force is
  published retained on ``fabric/faults`` by an operator client, as ``linkguard fabric
  faults`` does (once; again on reconnect only if that publish failed);
- ``broker_down``/``broker_up``: the broker stops and starts on the same port (Mosquitto runs
  without persistence: retained messages are lost, agents and service put theirs back);
- ``service_down``: the service crashes (its connection is cut without an MQTT DISCONNECT, so
  the broker publishes its last will, and its task is cancelled); ``service_up``: a new
  service on the same fabric, which rebuilds its view from the retained messages;
- ``agent_down``/``agent_up``: the same for one host's agent; the new agent gets the same
  settings and state dir and the same route table (a restarted daemon finds the kernel table
  as it left it) and reads its ports afresh.

A *settle* is a moment when the broker, the service and every agent run, the service has no
solve due, it knows the truth (its unusable rails equal the scenario's: ports down, rails
lost to switch faults by :class:`~linkguard.topology.health.SwitchModel`, ports an agent's
monitor holds down or suppresses), its plans satisfy the oracle, and every host applied and
acked its current plan. At every settle with something new (epoch, truth or fast-path
overlays), the oracle checks what the agents *installed*: each host's route table, by longest
prefix, multipath next hops mapped to rails (:func:`check_installed`), and each table against
its agent's applied plan and fast-path overlays, so a route left behind counts
(:func:`table_drift`). A wait for a settle beyond ``settle_timeout_s`` (counted from the end of
any outage) is reported and the oracle runs on the tables as they are.

Per down transition (port, switch or cable faults; the ends of outages are listed as
recoveries): the fast path (the host's agent acked its backup: the ack's ``applied_at``), and,
when the transition changed the truth, the plan epoch it caused (the first epoch the service
committed after it): when the service received the first and the last ``applied`` ack of the
hosts given a plan of that epoch, over the bus. The run ends at ``duration_s``, or earlier once
the timeline is over, the fleet has settled and no port is held down (``stop_when_quiet``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from ipaddress import IPv4Address
from pathlib import Path
from typing import Literal, Protocol

from linkguard import topics
from linkguard.agent.applier import kernel_routes
from linkguard.agent.daemon import Agent
from linkguard.agent.plans import effective
from linkguard.bus import Bus, BusSession
from linkguard.config import BusSettings, ServiceSettings
from linkguard.drivers.routes import Destination, KernelRoute
from linkguard.drivers.simulated import SimulatedPortSource, active_port
from linkguard.models import (
    AckResult,
    CableRef,
    FabricFaults,
    PhysState,
    Plan,
    PortStateName,
    PortStatus,
    encode,
)
from linkguard.simulations.engine import (
    MAX_MISMATCHES,
    ExpectResult,
    PlanCounts,
    PortReturn,
    mismatch_lines,
    percentile,
)
from linkguard.simulations.fleet import SimulatedFleet, wait_until
from linkguard.simulations.oracle import Mismatch, check, pairs_to_check
from linkguard.simulations.scenario import Event, LoadedScenario, expand
from linkguard.topology.fabric import Fabric
from linkguard.topology.service import TopologyService
from linkguard.topology.state import FabricState

__all__ = [
    "BUSES",
    "LiveFault",
    "LiveReport",
    "Recovery",
    "check_installed",
    "percentile",
    "run",
    "table_drift",
    "table_egress",
]

BusKind = Literal["mosquitto", "memory"]
#: The buses :func:`run` can replay on.
BUSES: tuple[str, ...] = ("mosquitto", "memory")

_HELD = (PortStatus.HELD_DOWN, PortStatus.SUPPRESSED)
_TIMED = frozenset({"port_down", "switch_down", "cables_down"})
_RECOVERIES = frozenset({"broker_up", "service_up", "agent_up"})

#: How often the watcher looks for new plans, acks and fast paths (s), and for a settle.
POLL_S = 0.002
SETTLE_POLL_S = 0.01

#: A transition: (timeline entry, at_s), every primitive event of one entry at one instant.
Transition = tuple[int, float]


def _figures(values: list[float]) -> dict[str, float | int | None]:
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "max": max(values, default=None),
    }


# --------------------------------------------------------------------------------------------
# The oracle on installed routes


def table_egress(
    routes: Mapping[Destination, KernelRoute], rail_of: Mapping[str, int], dest: IPv4Address
) -> tuple[int, ...]:
    """Rails a route table sends ``dest`` out of, as the kernel looks it up: the longest
    prefix containing it; its netdev(s) (several: multipath) mapped to rails by ``rail_of``
    (a netdev the host does not have maps to -1, which no model counts as usable); () for an
    ``unreachable`` route or no route at all. Sorted."""
    best: KernelRoute | None = None
    for r in routes.values():
        net = r.network
        if dest in net and (best is None or net.prefixlen > best.network.prefixlen):
            best = r
    if best is None or best.kind != "unicast":
        return ()
    return tuple(sorted({rail_of.get(n, -1) for n in best.netdevs}))


def check_installed(
    fabric: Fabric,
    unusable: Mapping[str, Iterable[int]],
    tables: Mapping[str, Mapping[Destination, KernelRoute]],
    pairs: Iterable[tuple[str, str]],
) -> list[Mismatch]:
    """The oracle (:func:`linkguard.simulations.oracle.check`) on installed routes: for each
    (host, peer) of ``pairs`` and each of the peer's endpoints, the rails ``tables[host]``
    sends it out of (:func:`table_egress`) against the model. ``unrouted``: the model reaches
    it, the table does not; ``dead_rail``: the table may use a rail unusable at either end."""
    usable = {
        h.host: frozenset(c.rail for c in h.hcas) - frozenset(unusable.get(h.host, ()))
        for h in fabric.hosts
    }
    rails = {h.host: {c.netdev: c.rail for c in h.hcas if c.netdev} for h in fabric.hosts}
    out: list[Mismatch] = []
    for a, b in pairs:
        both = usable[a] & usable[b]
        table = tables.get(a, {})
        for ep in fabric.host(b).endpoints:
            got = table_egress(table, rails[a], ep)
            if both and not got:
                out.append(Mismatch("unrouted", a, b, ep, (), tuple(sorted(both))))
            elif got and not set(got) <= both:
                out.append(Mismatch("dead_rail", a, b, ep, got, tuple(sorted(both))))
    return out


def table_drift(
    plan: Plan, locally_down: Iterable[str], routes: Mapping[Destination, KernelRoute]
) -> str | None:
    """How a host's route table differs from what its applied ``plan`` with the backups of
    its ``locally_down`` ports asks for (:func:`~linkguard.agent.applier.kernel_routes`):
    routes left behind (leaked), missing or different, as one sentence; None when equal."""
    want = kernel_routes(effective(plan, locally_down))
    leaked = sorted(str(d) for d in routes.keys() - want.keys())
    missing = sorted(str(d) for d in want.keys() - routes.keys())
    wrong = sorted(str(d) for d in want.keys() & routes.keys() if want[d] != routes[d])
    parts = [
        f"{name} {len(ds)} ({', '.join(ds[:3])}{', ...' if len(ds) > 3 else ''})"
        for name, ds in (("leaked", leaked), ("missing", missing), ("different", wrong))
        if ds
    ]
    return (
        f"table differs from its plan (epoch {plan.epoch}): " + "; ".join(parts) if parts else None
    )


# --------------------------------------------------------------------------------------------
# Report


@dataclass(frozen=True)
class LiveFault:
    """One down transition (port, switch or cable) of one timeline entry. Times in ms from
    the transition. ``fast_path_ms``: the host's agent acked its backup (None: no port fault,
    no backup, or none seen). ``epoch``: the plan epoch it caused (None: the truth did not
    change, e.g. a port already held down or a spine whose leaves keep other uplinks, or no
    plan came); ``plans``: hosts given a new plan by that solve (hosts with compact plans
    through the peer routes of ``epoch``, the others a plan of ``epoch`` + 1, see
    :mod:`linkguard.topology.state`), ``acked``: how many of them acked it applied;
    ``first_ack_ms``/``last_ack_ms``: their first and last ack as the service received them
    over the bus (``last_ack_ms`` None unless all acked)."""

    entry: int
    kind: str
    at_s: float
    host: str | None
    rerouted: bool
    fast_path_ms: float | None
    epoch: int | None
    plans: int
    acked: int
    first_ack_ms: float | None
    last_ack_ms: float | None


@dataclass(frozen=True)
class Recovery:
    """The end of an outage (``broker_up``, ``service_up``, ``agent_up``): ms until the
    fleet settled again (None: not within the timeout)."""

    entry: int
    kind: str
    at_s: float
    host: str | None
    settled_ms: float | None


@dataclass
class LiveReport(PlanCounts):
    """What a live replay did and whether the scenario's expectations held; the fields of
    :class:`~linkguard.simulations.engine.RunReport` where they mean the same, plus the bus,
    the wall time, fault latencies and recoveries. Times: ``at_s`` from time 0 (first plans
    acked), ``*_ms`` from the transition. ``solves``/``plans_per_host`` leave out the first
    build; ``plans_per_host`` counts distinct epochs seen on the bus. ``unsettled``: settles
    that timed out (one sentence each). ``passed``: every settle came, no oracle mismatch,
    every expectation held. :meth:`to_dict` is JSON-able."""

    scenario: str
    path: str
    bus: str
    duration_s: float
    debounce_ms: float
    #: the service's RFC 8405 solve back-off: initial, short (``debounce_ms``), long delay (ms)
    solve_delays_ms: list[float] = field(default_factory=list)
    ended_s: float = 0.0
    startup_s: float = 0.0
    events: int = 0
    solves: int = 0
    plans_per_host: dict[str, int] = field(default_factory=dict)
    settles: int = 0
    unsettled: list[str] = field(default_factory=list)
    mismatch_count: int = 0
    mismatches: list[str] = field(default_factory=list)
    faults: list[LiveFault] = field(default_factory=list)
    recoveries: list[Recovery] = field(default_factory=list)
    readmissions: list[PortReturn] = field(default_factory=list)
    max_plans_per_host_per_event: int = 0
    expectations: list[ExpectResult] = field(default_factory=list)
    passed: bool = False

    def latency(self) -> dict[str, dict[str, float | int | None]]:
        """n, p50, p99 and max (ms) of the faults' fast path, first ack and last ack."""
        return {
            name: _figures([v for f in self.faults if (v := getattr(f, name)) is not None])
            for name in ("fast_path_ms", "first_ack_ms", "last_ack_ms")
        }

    @property
    def failures(self) -> list[str]:
        """Why the run did not pass, one sentence each (empty when it passed)."""
        out = [f"settle: {u}" for u in self.unsettled]
        if self.mismatch_count:
            out.append(f"oracle: {self.mismatch_count} mismatch(es), first: {self.mismatches[0]}")
        out += [f"{e.name}: {e.detail}" for e in self.expectations if not e.held]
        return out

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["plans_total"] = self.plans_total
        d["plans_max_per_host"] = self.plans_max_per_host
        d["latency"] = self.latency()
        d["failures"] = self.failures
        return d

    def text(self) -> str:
        """A short human-readable report (a few lines)."""

        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v:.1f}"

        rerouted = [f for f in self.faults if f.rerouted]
        lines = [
            f"{self.scenario} ({self.bus} bus): {'PASSED' if self.passed else 'FAILED'}",
            f"  {self.events} events, ran {self.ended_s:.1f} s of {self.duration_s:g} s (real "
            f"time, fleet at rest after {self.startup_s:.1f} s), solve back-off "
            f"{'/'.join(f'{d:g}' for d in self.solve_delays_ms) or self.debounce_ms} ms; "
            f"{self.solves} solves",
            f"  plans: {self.plans_total} new host plans, "
            f"at most {self.plans_max_per_host} per host, "
            f"{self.max_plans_per_host_per_event} per host per event",
            f"  down transitions: {len(self.faults)}, rerouted {len(rerouted)}",
        ]
        for f in self.faults:
            what = [
                f"    {f.at_s:7.3f} s timeline[{f.entry}] {f.kind}"
                + (f" {f.host}" if f.host else "")
            ]
            if f.fast_path_ms is not None:
                what.append(f"fast path {ms(f.fast_path_ms)} ms")
            if f.epoch is not None:
                what.append(
                    f"{f.plans} hosts re-planned (epoch {f.epoch}), "
                    f"acked first {ms(f.first_ack_ms)} / "
                    f"last {ms(f.last_ack_ms)} ms"
                    + ("" if f.acked == f.plans else f" ({f.acked} acked)")
                )
            else:
                what.append("no plan came" if f.rerouted else "no reroute needed")
            lines.append(", ".join(what))
        lat = self.latency()
        if lat["last_ack_ms"]["n"]:
            parts = [
                f"{name.removesuffix('_ms').replace('_', ' ')} p50 {ms(v['p50'])} p99 "
                f"{ms(v['p99'])} max {ms(v['max'])}"
                for name, v in lat.items()
                if v["n"]
            ]
            lines.append("  ms from the fault: " + "; ".join(parts))
        for r in self.recoveries:
            who = f" {r.host}" if r.host else ""
            lines.append(
                f"  {r.kind}{who} at {r.at_s:g} s: settled again after {ms(r.settled_ms)} ms"
            )
        lines += [
            f"  re-admitted {r['host']} rail {r['rail']} at {r['at_s']:.2f} s"
            for r in self.readmissions
        ]
        lines.append(
            f"  oracle (installed routes): {self.settles} settles, {self.mismatch_count} mismatches"
        )
        lines += mismatch_lines(self.mismatch_count, self.mismatches)
        lines += [f"  NOT SETTLED: {u}" for u in self.unsettled[:5]]
        for e in self.expectations:
            lines.append(f"  expect {e.name}: {'held' if e.held else 'FAILED'} ({e.detail})")
        return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Brokers


class _Broker(Protocol):
    bus_factory: Callable[..., BusSession]
    settings: BusSettings

    def down(self) -> None: ...
    def up(self) -> None: ...
    def sever(self, bus: BusSession, client_id: str) -> None: ...
    def close(self) -> None: ...


def _bus_settings(**kw: object) -> BusSettings:
    # reconnect quickly after an outage (production's default backoff reaches 10 s)
    return BusSettings.model_validate({"reconnect_min_s": 0.05, "reconnect_max_s": 1.0, **kw})


class _Mosquitto:
    def __init__(self, workdir: Path) -> None:
        from linkguard.broker import MosquittoProcess  # lazy: amqtt/mosquitto per backend

        self.proc = MosquittoProcess(workdir).start()
        self.settings = _bus_settings(port=self.proc.port)
        self.bus_factory: Callable[..., BusSession] = Bus

    def down(self) -> None:
        self.proc.stop()

    def up(self) -> None:
        self.proc.start()

    def sever(self, bus: BusSession, client_id: str) -> None:
        """Cut ``bus``'s TCP connection without an MQTT DISCONNECT (a crashed process: the
        broker publishes its last will). Reaches into aiomqtt/paho for the socket; when there
        is none (not connected) nothing is needed."""
        sock = getattr(getattr(getattr(bus, "_client", None), "_client", None), "socket", None)
        s = sock() if callable(sock) else None
        if s is not None:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.proc.stop()


class _Memory:
    def __init__(self) -> None:
        from linkguard.membus import MemoryBroker  # lazy: loaded only for this backend

        self.broker = MemoryBroker()
        self.settings = _bus_settings()
        self.bus_factory: Callable[..., BusSession] = self.broker.bus_factory

    def down(self) -> None:
        self.broker.stop()

    def up(self) -> None:
        self.broker.start()

    def sever(self, bus: BusSession, client_id: str) -> None:
        self.broker.kill_client(client_id)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.broker.stop()


def _broker(kind: BusKind, workdir: Path) -> _Broker:
    if kind == "mosquitto":
        return _Mosquitto(workdir / "broker")
    if kind == "memory":
        return _Memory()
    raise ValueError(f"unknown bus {kind!r}; one of {', '.join(BUSES)}")


# --------------------------------------------------------------------------------------------
# The operator: publishes the switch-level faults, as `linkguard fabric faults` does


class _Operator:
    def __init__(self, broker: _Broker, faults: Callable[[], FabricFaults | None]) -> None:
        self._faults = faults
        self.pending = False
        self.bus = broker.bus_factory(
            **broker.settings.connection(),
            client_id=f"linkguard-sim-operator-{time.monotonic_ns()}",
            on_connect=self._on_connect,
        )

    async def _on_connect(self) -> None:
        if self.pending:
            await self.publish()

    async def publish(self) -> None:
        """Publish the faults in force (retained); kept pending while disconnected (an
        operator would retry) and published on the next connection."""
        faults = self._faults()
        if faults is not None:
            self.pending = not await self.bus.publish(
                topics.fabric_faults(), encode(faults), retain=True
            )


# --------------------------------------------------------------------------------------------
# The run


@dataclass
class _Pending:
    """A down transition being timed."""

    key: Transition
    kind: str
    host: str | None
    t0: float  # monotonic
    wall0: float
    rerouted: bool
    epoch_before: int
    fast_hosts: set[str]
    fast_path_ms: float | None = None


class _Live:
    def __init__(
        self,
        loaded: LoadedScenario,
        *,
        broker: _Broker,
        workdir: Path,
        settle_timeout_s: float,
        stop_when_quiet: bool,
    ) -> None:
        sc = loaded.scenario
        self.loaded = loaded
        self.fabric = loaded.fabric
        self.broker = broker
        self.settle_timeout_s = settle_timeout_s
        self.stop_when_quiet = stop_when_quiet
        debounce_ms = (
            sc.debounce_ms
            if sc.debounce_ms is not None
            else ServiceSettings.model_fields["debounce_ms"].default
        )
        self.fleet = SimulatedFleet(
            self.fabric,
            bus=broker.settings,
            workdir=workdir / "fleet",
            damping=sc.damping,
            debounce_ms=debounce_ms,
            bus_factory=broker.bus_factory,
        )
        self.model = FabricState(fabric=self.fabric, epoch_start=1)  # switch faults -> rails
        self.readings: dict[tuple[str, int], tuple[PortStateName, PhysState]] = {}
        self.raw_down: set[tuple[str, int]] = set()
        self.switches_down: set[str] = set()
        self.cables_down: dict[tuple[str, str], CableRef] = {}
        self.faults: FabricFaults | None = None
        self.operator = _Operator(broker, lambda: self.faults)
        self.tasks: dict[str, asyncio.Task[None]] = {}  # service / agent:<host> I started
        self.broker_up = True
        self.service_up = True
        self.agents_down: set[str] = set()
        #: hosts whose monitors may hold a port (a port event or a restart since time 0)
        self.touched: set[str] = set()
        self.t_start = 0.0
        self.transitions: list[tuple[float, Transition]] = []  # (monotonic, transition)
        self.pending: list[_Pending] = []
        self.closed: list[_Pending] = []
        self.recovering: list[tuple[Event, float]] = []  # *_up of outages, monotonic
        self.unsettled_since: float | None = None
        self.checked: object = None
        self.plans_ok: tuple[object, bool] = (None, False)
        self.settled_at: float | None = None  # the last look that found the fleet settled
        #: (service, its solve count) when a solve was last seen due: settled only after it
        self.owed: tuple[int, int] | None = None
        self.next_settle_look = 0.0
        #: what the service committed and received: (host, epoch) -> monotonic, first seen
        self.plan_seen: dict[tuple[str, int], float] = {}
        self.ack_seen: dict[tuple[str, int], float] = {}
        self.status: dict[tuple[str, str], PortStatus] = {}  # touched hosts' monitor status
        self.solves0 = 0
        self.solves_retired = 0  # solves of service instances that crashed
        settings = self.fleet.service.settings
        self.report = LiveReport(
            scenario=sc.name,
            path=str(loaded.path),
            bus="",
            duration_s=sc.duration_s,
            debounce_ms=debounce_ms,
            solve_delays_ms=[
                getattr(settings, name)
                for name in ("solve_initial_delay_ms", "debounce_ms", "solve_long_delay_ms")
                if hasattr(settings, name)
            ],
        )

    # -- truth -----------------------------------------------------------------------------------
    def _held(self) -> dict[str, set[int]]:
        """Rails the running agents' monitors hold down or suppress (touched hosts only: the
        others read ACTIVE since time 0)."""
        out: dict[str, set[int]] = defaultdict(set)
        for host in self.touched - self.agents_down:
            mon = self.fleet.agents[host].monitor
            for c in self.fabric.host(host).hcas:
                st = mon.state(c.key)
                if st is not None and st.status in _HELD:
                    out[host].add(c.rail)
        return out

    def truth(self) -> dict[str, frozenset[int]]:
        """Rails unusable in fact: ports the scenario has down, rails lost to switch faults,
        ports the (running) agents' monitors hold down or suppress."""
        out = self._held()
        for host, rail in self.raw_down:
            out[host].add(rail)
        if self.model.health is not None:
            for host, rails in self.model.health.unusable.items():
                out[host] |= rails
        return {h: frozenset(r) for h, r in out.items() if r}

    # -- settling --------------------------------------------------------------------------------
    def _outage(self) -> bool:
        return not (self.broker_up and self.service_up) or bool(self.agents_down)

    def _settled(self) -> object | None:
        """A signature of the settled state, or None when not settled (module docstring)."""
        if self._outage():
            return None
        service = self.fleet.service
        state = service.state
        if state.dirty or state.solver is None or self.owed == (id(service), service.solves):
            return None
        if not self.fleet.all_acked():
            return None
        agents = self.fleet.agents
        if any(agents[h].applier.applied_epoch != state.acked_epoch(h) for h in state.published):
            return None
        truth = self.truth()
        if {h: r for h, r in state.unusable().items() if r} != truth:
            return None
        sig = (
            id(service),
            state.epoch,
            tuple(sorted(truth.items())),
            tuple((h, tuple(sorted(a.applier.locally_down))) for h, a in sorted(agents.items())),
        )
        if self.plans_ok[0] != sig:  # the service's plans must satisfy the model too
            ok = not self.loaded.scenario.expect.reachability or not check(
                self.fabric, truth, state.plans, self._pairs(truth)
            )
            self.plans_ok = (sig, ok)
        return sig if self.plans_ok[1] else None

    def _pairs(self, truth: Mapping[str, frozenset[int]]) -> list[tuple[str, str]]:
        return pairs_to_check(self.fabric, truth, seed=self.loaded.scenario.seed)

    def _check_installed(self, now: float, *, why: str) -> None:
        self.report.settles += 1
        if not self.loaded.scenario.expect.reachability:
            return
        truth = self.truth()
        tables = {h: t.routes for h, t in self.fleet.tables.items()}
        found: list[object] = list(check_installed(self.fabric, truth, tables, self._pairs(truth)))
        for host, agent in sorted(self.fleet.agents.items()):
            if host not in self.agents_down and agent.applier.plan is not None:
                drift = table_drift(
                    agent.applier.plan, agent.applier.locally_down, self.fleet.tables[host].routes
                )
                if drift:
                    found.append(f"table: {host} {drift}")
        self.report.mismatch_count += len(found)
        room = MAX_MISMATCHES - len(self.report.mismatches)
        at = now - self.t_start
        self.report.mismatches += [f"{at:.3f} s ({why}): {m}" for m in found[:room]]

    def _track(self, now: float) -> None:
        """Record what is new since the last look: plans the service committed, applied acks
        it received, fast-path acks of pending faults, re-admissions."""
        service = self.fleet.service
        state = service.state
        if state.dirty or getattr(getattr(service, "backoff", None), "due", None) is not None:
            self.owed = (id(service), service.solves)  # a solve is due: not settled before it
        # epochs only (the full plans are built for the oracle), and not while a restarted
        # service still reads the retained plans and peer routes: before its first solve its
        # view of them (and of the epochs hosts ack) is partial
        for h in state.published if state.solver is not None else ():
            epoch = state.acked_epoch(h)
            assert epoch is not None  # a published plan's host has one
            self.plan_seen.setdefault((h, epoch), now)
        for h, a in state.acks.items():
            if a.result == AckResult.APPLIED:
                self.ack_seen.setdefault((h, a.epoch), now)
        for p in self.pending:
            if p.fast_path_ms is None:
                for h in p.fast_hosts:
                    ack = self.fleet.agents[h].last_ack
                    if ack is not None and ack.fast_path and ack.applied_at >= p.wall0:
                        p.fast_path_ms = round((ack.applied_at - p.wall0) * 1000, 3)
        for host in self.touched - self.agents_down:
            mon = self.fleet.agents[host].monitor
            for c in self.fabric.host(host).hcas:
                st = mon.state(c.key)
                if st is None:
                    continue
                before = self.status.get((host, c.key))
                self.status[(host, c.key)] = st.status
                if before in _HELD and st.status == PortStatus.UP:
                    at = round(now - self.t_start, 3)
                    self.report.readmissions.append({"host": host, "rail": c.rail, "at_s": at})

    def _poll(self, *, force: bool = False) -> bool:
        """One look of the watcher: tracking every time, the settle every SETTLE_POLL_S (or
        now, ``force``): a new settled state gets the oracle, a settle closes the pending
        transitions, a wait beyond the timeout is reported. True when settled now."""
        now = time.monotonic()
        self._track(now)
        if now < self.next_settle_look and not force:
            return False
        self.next_settle_look = now + SETTLE_POLL_S
        sig = self._settled()
        if sig is not None:
            if sig != self.checked:
                self.checked = sig
                self._check_installed(now, why="settled")
            if self.unsettled_since is not None:
                self.unsettled_since = None
                self._close(now, settled=True)
            self.settled_at = now
            return True
        if self.unsettled_since is None or self._outage():
            self.unsettled_since = now  # the timeout counts from the end of an outage
        elif now - self.unsettled_since > self.settle_timeout_s:
            self.report.unsettled.append(
                f"not settled within {self.settle_timeout_s:g} s of "
                f"{self.unsettled_since - self.t_start:.3f} s ({self._why_unsettled()})"
            )
            self._check_installed(now, why="timeout")
            self.checked = None
            self.unsettled_since = None
            self._close(now, settled=False)
        return False

    def _why_unsettled(self) -> str:
        state = self.fleet.service.state
        if self._outage():
            return "an outage is in progress"
        if state.dirty or state.solver is None:
            return "the service has an unsolved change"
        pending = state.pending_acks()
        if pending:
            return f"hosts without an applied ack of their plan: {', '.join(pending[:6])}"
        behind = sorted(
            h
            for h in state.published
            if self.fleet.agents[h].applier.applied_epoch != state.acked_epoch(h)
        )
        if behind:
            return f"agents not at the service's epoch: {', '.join(behind[:6])}"
        truth = self.truth()
        unusable = {h: r for h, r in state.unusable().items() if r}
        if unusable != truth:
            diff = [
                f"{h} {sorted(truth.get(h, ()))} vs {sorted(unusable.get(h, ()))}"
                for h in sorted(truth.keys() | unusable.keys())
                if truth.get(h) != unusable.get(h)
            ]
            return "unusable rails, truth vs service: " + ", ".join(diff[:4])
        return "the service's plans do not satisfy the model"

    def _close(self, now: float, *, settled: bool) -> None:
        """The fleet settled (or the wait timed out): close the pending transitions and
        recoveries (fault timings are computed at the end, from what was tracked)."""
        self.closed += self.pending
        self.pending = []
        for e, t0 in self.recovering:
            self.report.recoveries.append(
                Recovery(
                    entry=e.entry,
                    kind=e.kind,
                    at_s=e.at_s,
                    host=e.host,
                    settled_ms=round((now - t0) * 1000, 3) if settled else None,
                )
            )
        self.recovering = []

    def _timing(self, p: _Pending) -> LiveFault:
        """``p``'s fast path, plan epoch and acks, from what the service committed and
        received (its first new epoch after the transition, when the truth changed)."""
        epoch = None
        if p.rerouted:
            later = [
                e for (_, e), at in self.plan_seen.items() if e > p.epoch_before and at >= p.t0
            ]
            epoch = min(later, default=None)
        # one solve's epochs: its peer routes' and, one above, its plans' (committed together)
        t_e = min((at for (_, e), at in self.plan_seen.items() if e == epoch), default=None)
        mine = {h: e for (h, e), at in self.plan_seen.items() if e >= (epoch or 0) and at == t_e}
        hosts = sorted(mine)
        acks = []
        for h in hosts:
            seen = [at for (host, e), at in self.ack_seen.items() if host == h and e >= mine[h]]
            if seen:
                acks.append(min(seen))
        return LiveFault(
            entry=p.key[0],
            kind=p.kind,
            at_s=p.key[1],
            host=p.host,
            rerouted=p.rerouted,
            fast_path_ms=p.fast_path_ms,
            epoch=epoch,
            plans=len(hosts),
            acked=len(acks),
            first_ack_ms=round((min(acks) - p.t0) * 1000, 3) if acks else None,
            last_ack_ms=(
                round((max(acks) - p.t0) * 1000, 3) if acks and len(acks) == len(hosts) else None
            ),
        )

    async def _watch(self) -> None:
        while True:
            self._poll()
            await asyncio.sleep(POLL_S)

    # -- events ----------------------------------------------------------------------------------
    async def transition(self, events: list[Event]) -> None:
        """Apply the primitive events of one timeline entry at one instant."""
        first = events[0]
        key: Transition = (first.entry, first.at_s)
        before = self.truth()
        state = self.fleet.service.state
        epoch_before = max((state.acked_epoch(h) or 0 for h in state.published), default=0)
        t0, wall0 = time.monotonic(), time.time()
        faults_changed = False
        for e in events:
            self.report.events += 1
            if e.kind in ("port_down", "port_up"):
                self._port(e)
            elif e.kind in ("switch_down", "switch_up", "cables_down", "cables_up"):
                self._switch(e)
                faults_changed = True
            else:
                await self._lifecycle(e)
        if faults_changed:
            self.faults = FabricFaults(
                switches_down=sorted(self.switches_down),
                cables_down=list(self.cables_down.values()),
                at=time.time(),
            )
            self.model.on_fabric_faults(self.faults)
            await self.operator.publish()
        self.transitions.append((t0, key))
        if self.unsettled_since is None:
            self.unsettled_since = t0
        timed = [e for e in events if e.kind in _TIMED]
        if timed:
            hosts = {e.host for e in timed if e.kind == "port_down" and e.host}
            self.pending.append(
                _Pending(
                    key=key,
                    kind=self.loaded.scenario.timeline[first.entry].kind,
                    host=next(iter(hosts)) if len(hosts) == 1 else None,
                    t0=t0,
                    wall0=wall0,
                    rerouted=self.truth() != before,
                    epoch_before=epoch_before,
                    fast_hosts=hosts,
                )
            )
        self.recovering += [(e, t0) for e in events if e.kind in _RECOVERIES]

    def _port(self, e: Event) -> None:
        assert e.host and e.rail is not None and e.state and e.phys_state and e.hca and e.port
        k = (e.host, e.rail)
        self.touched.add(e.host)
        self.readings[k] = (e.state, e.phys_state)
        (self.raw_down.add if e.kind == "port_down" else self.raw_down.discard)(k)
        self.fleet.sources[e.host].set(e.hca, e.port, state=e.state, phys_state=e.phys_state)

    def _switch(self, e: Event) -> None:
        if e.kind == "switch_down":
            self.switches_down.add(e.switch_name)
        elif e.kind == "switch_up":
            self.switches_down.discard(e.switch_name)
        elif e.kind == "cables_down":
            assert e.cable is not None
            self.cables_down[e.cable.pair] = e.cable
        else:
            assert e.cable is not None
            self.cables_down.pop(e.cable.pair, None)

    async def _lifecycle(self, e: Event) -> None:
        """Broker, service and agent outages (module docstring)."""
        if e.kind == "broker_down":
            self.broker_up = False
            await asyncio.to_thread(self.broker.down)
        elif e.kind == "broker_up":
            await asyncio.to_thread(self.broker.up)
            self.broker_up = True
        elif e.kind == "service_down":
            self.service_up = False
            svc = self.fleet.service
            self.solves_retired += svc.solves
            await self._crash(svc.bus, f"linkguard-topology-{svc.me.instance}", "service")
        elif e.kind == "service_up":
            new = TopologyService(
                self.fleet.service.settings, fabric=self.fabric, bus_factory=self.broker.bus_factory
            )
            self.fleet.service = new
            self.tasks["service"] = asyncio.create_task(new.run(), name="service")
            self.service_up = True
        elif e.kind == "agent_down":
            assert e.host is not None
            self.agents_down.add(e.host)
            self.touched.add(e.host)
            a = self.fleet.agents[e.host]
            await self._crash(a.bus, f"linkguard-agent-{a.host}-{a.me.instance}", f"agent:{a.host}")
        elif e.kind == "agent_up":
            assert e.host is not None
            self._restart_agent(e.host)
            self.agents_down.discard(e.host)

    async def _crash(self, bus: BusSession, client_id: str, name: str) -> None:
        """Kill a task of the fleet as a crash: sever its MQTT connection, cancel it."""
        task = self.tasks.get(name)
        if task is None or task.done():
            task = next(
                (t for t in asyncio.all_tasks() if t.get_name() == name and not t.done()), None
            )
        if task is None:
            raise RuntimeError(f"no running task {name!r} to crash")
        self.broker.sever(bus, client_id)
        with contextlib.suppress(TimeoutError):  # let its bus see the cut before it dies
            await wait_until(lambda: not bus.connected.is_set(), 1.0, "the connection cut")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(asyncio.shield(task), 10)

    def _restart_agent(self, host: str) -> None:
        """A new agent for ``host``: the old one's settings (state dir), the same route table,
        a fresh port source reading the ports as they are now."""
        old = self.fleet.agents[host]
        ports = []
        for c in self.fabric.host(host).hcas:
            obs = active_port(c.hca, c.port, link_layer=c.link_layer)
            state, phys = self.readings.get((host, c.rail), (obs.state, obs.phys_state))
            ports.append(replace(obs, state=state, phys_state=phys))
        source = SimulatedPortSource(ports)
        self.fleet.sources[host] = source
        agent = Agent(
            old.settings,
            source=source,
            table=self.fleet.tables[host],
            discovered=[],
            bus_factory=self.broker.bus_factory,
        )
        self.fleet.agents[host] = agent
        self.tasks[f"agent:{host}"] = asyncio.create_task(agent.run(), name=f"agent:{host}")

    # -- the run ---------------------------------------------------------------------------------
    async def _at_rest(self, timeout: float) -> None:
        """Wait for time 0: every host acked its first plan, the service knows every port
        (the agents announce theirs after the first build) and its solve back-off is quiet
        again (``solve_holddown_ms`` after the last of those first states, each of which
        counts as a change): a scenario's first fault meets a fleet that has been running."""
        fleet = self.fleet
        ports = sum(len(h.hcas) for h in self.fabric.hosts)
        await fleet.wait_all_acked(timeout=timeout)
        await wait_until(lambda: len(fleet.service.state.ports) >= ports, timeout, "port states")
        await asyncio.sleep(getattr(fleet.service.settings, "solve_holddown_ms", 0.0) / 1000)
        await fleet.wait_all_acked(timeout=timeout)

    def _quiet(self) -> bool:
        """The timeline's effects are over: settled since the last transition, nothing
        pending, no port held down."""
        return (
            self.settled_at is not None
            and (not self.transitions or self.settled_at > self.transitions[-1][0])
            and not self.pending
            and not self.recovering
            and not self._held()
            and self._poll(force=True)
        )

    async def run(
        self,
        events: list[Event],
        *,
        startup_timeout_s: float,
        inspect: Callable[[SimulatedFleet], object] | None,
    ) -> LiveReport:
        sc = self.loaded.scenario
        t_begin = time.monotonic()
        op_task = asyncio.create_task(self.operator.bus.run(), name="sim-operator")
        try:
            async with self.fleet:
                watch: asyncio.Task[None] | None = None
                try:
                    await self._at_rest(startup_timeout_s)
                    self.t_start = time.monotonic()
                    self.report.startup_s = round(self.t_start - t_begin, 3)
                    self.solves0 = self.fleet.service.solves
                    self._track(self.t_start)
                    baseline = set(self.plan_seen)
                    watch = asyncio.create_task(self._watch(), name="sim-watch")
                    for group in _groups(events):
                        await _sleep_until(self.t_start + group[0].at_s)
                        await self.transition(group)
                        if watch.done():
                            watch.result()  # the watcher failed: raise it
                    left = self.t_start + sc.duration_s - time.monotonic()
                    with contextlib.suppress(TimeoutError):
                        await wait_until(
                            lambda: self.stop_when_quiet and self._quiet(), max(left, 0), "quiet"
                        )
                    with contextlib.suppress(TimeoutError):  # the last ones may still settle
                        await wait_until(
                            lambda: not (self.pending or self.recovering),
                            self.settle_timeout_s + 1,
                            "the last transitions to settle",
                        )
                    if self.pending or self.recovering:
                        self.report.unsettled.append(
                            f"still settling at the end ({self._why_unsettled()})"
                        )
                        self._close(time.monotonic(), settled=False)
                    self.report.ended_s = round(time.monotonic() - self.t_start, 3)
                    if inspect is not None:
                        inspect(self.fleet)
                finally:
                    if watch is not None:
                        watch.cancel()
                    solves = self.solves_retired + self.fleet.service.solves
                    # the fleet stops the current service and agents (ours, when restarted)
            await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        finally:
            op_task.cancel()
            await asyncio.gather(op_task, return_exceptions=True)
        self.report.solves = solves - self.solves0
        return self.finish(baseline)

    def finish(self, baseline: set[tuple[str, int]]) -> LiveReport:
        r = self.report
        per_host: Counter[str] = Counter()
        per_event: dict[Transition, Counter[str]] = defaultdict(Counter)
        for (host, epoch), at in sorted(self.plan_seen.items(), key=lambda x: x[1]):
            if (host, epoch) in baseline:
                continue
            per_host[host] += 1
            cause = None
            for t, key in self.transitions:  # the latest transition before the plan
                if t <= at:
                    cause = key
            if cause is not None:
                per_event[cause][host] += 1
        r.plans_per_host = dict(sorted(per_host.items()))
        r.max_plans_per_host_per_event = max(
            (n for c in per_event.values() for n in c.values()), default=0
        )
        r.faults = sorted((self._timing(p) for p in self.closed), key=lambda f: (f.at_s, f.entry))
        r.expectations = self._expectations()
        r.passed = not r.unsettled and r.mismatch_count == 0 and all(e.held for e in r.expectations)
        return r

    def _expectations(self) -> list[ExpectResult]:
        ex, r = self.loaded.scenario.expect, self.report
        out = []
        if ex.reachability:
            out.append(
                ExpectResult.reachability(
                    r.mismatch_count, r.settles, "settles", unsettled=len(r.unsettled)
                )
            )
        if ex.max_reroute_ms is not None:
            timed = [f for f in r.faults if f.rerouted]
            missing = [f for f in timed if f.last_ack_ms is None]
            worst = max(timed, key=lambda f: f.last_ack_ms or 0.0, default=None)
            observed = None if missing else (worst.last_ack_ms if worst else 0.0)
            held = not missing and (observed or 0.0) <= ex.max_reroute_ms
            if missing:
                detail = f"{len(missing)} rerouting fault(s) without every ack"
            elif worst:
                detail = (
                    f"slowest down -> last ack {observed:g} ms (timeline[{worst.entry}] at "
                    f"{worst.at_s:g} s)"
                )
            else:
                detail = "no reroute"
            out.append(
                ExpectResult(
                    "max_reroute_ms",
                    ex.max_reroute_ms,
                    observed,
                    held,
                    detail + f", limit {ex.max_reroute_ms:g} ms",
                )
            )
        if (limit := ex.max_plans_per_host_per_event) is not None:
            out.append(ExpectResult.plans_per_event(r.max_plans_per_host_per_event, limit))
        if ex.fast_path:  # each down transition of one host's ports: a fast-path ack
            out.append(ExpectResult.fast_path_acked(r.faults))
        return out


def _groups(events: list[Event]) -> list[list[Event]]:
    """Events grouped by (at_s, entry), in time order: one group per transition."""
    out: list[list[Event]] = []
    for e in events:
        if out and out[-1][0].at_s == e.at_s and out[-1][0].entry == e.entry:
            out[-1].append(e)
        else:
            out.append([e])
    return out


async def _sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


async def run(
    loaded: LoadedScenario,
    *,
    bus: BusKind = "mosquitto",
    workdir: Path | None = None,
    settle_timeout_s: float = 5.0,
    stop_when_quiet: bool = True,
    startup_timeout_s: float = 30.0,
    inspect: Callable[[SimulatedFleet], object] | None = None,
) -> LiveReport:
    """Replay ``loaded`` in real time on a simulated fleet over ``bus`` (module docstring)
    and return the :class:`LiveReport`. ``workdir``: agents' state dirs and the broker's
    files (default: a temporary directory, removed afterwards). Raises FileNotFoundError
    when ``bus="mosquitto"`` and no mosquitto binary exists, ImportError for ``memory``
    without :mod:`linkguard.membus`, TimeoutError when the fleet's first plans are not all
    acked within ``startup_timeout_s``. ``inspect``: called with the fleet at the end, before
    it stops (tests look at its tables and agents)."""
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lg-live-")))
        broker = _broker(bus, workdir)
        stack.callback(broker.close)
        live = _Live(
            loaded,
            broker=broker,
            workdir=workdir,
            settle_timeout_s=settle_timeout_s,
            stop_when_quiet=stop_when_quiet,
        )
        live.report.bus = bus
        return await live.run(expand(loaded), startup_timeout_s=startup_timeout_s, inspect=inspect)
