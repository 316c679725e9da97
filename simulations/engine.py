"""Deterministic replay of a scenario through the real decision code, on a simulated clock.

Consumes: a :class:`~linkguard.simulations.scenario.LoadedScenario`. Produces: a
:class:`RunReport` (events, solves, plans per host, reroute times, oracle mismatches and which
of the scenario's ``expect`` held).

What runs is the real code, without bus or threads: one
:class:`~linkguard.agent.monitor.PortMonitor` per host (the scenario's damping policy) takes
the port events as observations, and is ticked at its own ``next_deadline`` (hold-down ends,
reuse, history reset), as the agent's ``watch`` and ``timer`` tasks drive it; the states it
publishes go into a real :class:`~linkguard.topology.state.FabricState`, as do switch and cable
faults (the whole set, as ``fabric/faults`` carries it). Like the service's solver loop, a
state change that alters which rails are usable schedules a solve with the service's RFC 8405
back-off (:mod:`linkguard.topology.backoff`: the service's defaults, ``debounce_ms`` from the
scenario), and that solve takes every change that arrived until it runs. A solve takes no
simulated time and its plans count as applied at once, so a down transition's time to
reroute is the back-off delay (10 ms after a quiet period by default). Time 0: every port
reads ACTIVE and the service makes its full build.

After every solve (a *settle*) the oracle (:mod:`linkguard.simulations.oracle`) compares the
plans with the truth: ports the scenario has down, rails lost to switch faults
(:mod:`linkguard.topology.health`) and ports their agent still holds down or suppresses.

Outages. While the broker or the service is down no state reaches the service and no plan
reaches an agent: each port's latest state (and the fault set) is delivered when both are back
(agents re-publish their current state on reconnect; a new service instance reads the retained
ones for ``startup_settle_s``), and a solve that came due meanwhile runs then. An agent that is
down watches nothing (its host keeps its routes); restarted, it reads every port afresh, with
no flap history. The oracle does not settle during an outage (``settles_skipped``): nobody can
know what nobody reports; it checks again once everything is back.

Not modelled here: the agents' fast path, ack latency and solve time (``linkguard sim run
--bus`` runs the real agents and service over a real bus for those).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TypedDict

from linkguard.agent.monitor import DampingPolicy, MonitorOutput, PortMonitor
from linkguard.config import ServiceSettings
from linkguard.costreport import percentile  # re-exported: the runners' reports use it
from linkguard.drivers.base import PortObservation
from linkguard.models import (
    CableRef,
    FabricFaults,
    PhysState,
    PortState,
    PortStateName,
    PortStatus,
)
from linkguard.simulations.oracle import check, pairs_to_check
from linkguard.simulations.scenario import EVENT_KINDS, Event, LoadedScenario, expand
from linkguard.topology.backoff import SolveBackoff
from linkguard.topology.health import SwitchModel
from linkguard.topology.state import FabricState

__all__ = [
    "MAX_MISMATCHES",
    "MODELLED",
    "ExpectResult",
    "FaultTiming",
    "PlanCounts",
    "PortReturn",
    "RunReport",
    "mismatch_lines",
    "percentile",
    "return_rail",
    "run",
]

#: Event kinds the engine replays (all of them today; others would be skipped with a note).
MODELLED = frozenset(EVENT_KINDS)

#: Mismatches kept verbatim in a report (all are counted).
MAX_MISMATCHES = 20

#: Wall-clock time of simulated time 0 (Unix s), for ``observed_at`` and plans' ``issued_at``.
WALL0 = 1_700_000_000.0

_HELD = (PortStatus.HELD_DOWN, PortStatus.SUPPRESSED)
_OUT = (PortStatus.DOWN, PortStatus.DEGRADED, *_HELD)  # after time 0: a port out of use
_ACTIVE_READING = (PortStateName.ACTIVE, PhysState.LINK_UP)

#: A transition: (timeline entry, at_s); every primitive event of one entry at one instant.
Transition = tuple[int, float]


class PortReturn(TypedDict):
    """A port usable again (a report's ``returns`` and ``readmissions``): its host, its rail
    (None only for a port without one, which no simulated fabric has), when (s)."""

    host: str
    rail: int | None
    at_s: float


def return_rail(r: PortReturn) -> int:
    """``r``'s rail; TypeError for a return without one (as ``int(None)`` raised here)."""
    rail = r["rail"]
    if rail is None:
        raise TypeError(f"a return of {r['host']} at {r['at_s']} s without a rail")
    return rail


def mismatch_lines(count: int, kept: list[str], shown: int = 5) -> list[str]:
    """A report's oracle mismatches as text lines: the first ``shown`` of those ``kept``
    (reports keep :data:`MAX_MISMATCHES`), then how many more there were."""
    lines = [f"    {m}" for m in kept[:shown]]
    if count > shown:
        lines.append(f"    ... and {count - shown} more (--json lists the first {MAX_MISMATCHES})")
    return lines


class PlanCounts:
    """``plans_per_host`` (host -> plans it received) summed up, for the run reports."""

    plans_per_host: dict[str, int]

    @property
    def plans_total(self) -> int:
        return sum(self.plans_per_host.values())

    @property
    def plans_max_per_host(self) -> int:
        return max(self.plans_per_host.values(), default=0)


@dataclass(frozen=True)
class FaultTiming:
    """One down transition of one timeline entry. ``reroute_ms``: simulated ms from the
    transition to the solve that moved traffic off it; None when no reroute was needed (the
    plans already avoided it: a port still held down, a spine whose leaves keep other uplinks)."""

    entry: int
    kind: str
    at_s: float
    reroute_ms: float | None


@dataclass(frozen=True)
class ExpectResult:
    """One scenario expectation: its limit, what the run observed, whether it held and why."""

    name: str
    limit: object
    observed: object
    held: bool
    detail: str

    @classmethod
    def reachability(
        cls, mismatches: int, looked: int, what: str, *, unsettled: int = 0
    ) -> ExpectResult:
        """The oracle's verdict: held when it found no mismatch in ``looked`` ``what``
        (settles, checks) and nothing stayed unsettled."""
        return cls(
            "reachability",
            True,
            mismatches,
            mismatches == 0 and not unsettled,
            f"{mismatches} oracle mismatches in {looked} {what}"
            + (f", {unsettled} not settled" if unsettled else ""),
        )

    @classmethod
    def plans_per_event(
        cls, most: int, limit: int, *, per: str = "event", where: str = ""
    ) -> ExpectResult:
        """``max_plans_per_host_per_event``: held when no host got more than ``limit`` new
        plans for one event (``per``); ``where``: the host and event of the worst, if known."""
        return cls(
            "max_plans_per_host_per_event",
            limit,
            most,
            most <= limit,
            f"at most {most} plan(s) per host per {per}"
            + (f" ({where})" if where else "")
            + f", limit {limit}",
        )


@dataclass
class RunReport(PlanCounts):
    """What a replay did and whether the scenario's expectations held. Times in simulated s
    (``at_s``) or ms (``*_ms``). ``solves``, ``reroutes`` and ``plans_per_host`` leave out the
    full build at time 0. ``readmissions``: ports back in use after their hold-down or
    suppression, ``{host, rail, at_s}``; ``returns``: every port usable again after being down,
    held down, suppressed or degraded (readmissions included), same keys. ``skipped``: events
    not modelled, one note each. ``passed``: no oracle mismatch and every expectation held.
    :meth:`to_dict` is JSON-able."""

    scenario: str
    path: str
    duration_s: float
    debounce_ms: float
    #: the service's RFC 8405 solve back-off: initial, short (``debounce_ms``), long delay (ms)
    solve_delays_ms: list[float] = field(default_factory=list)
    events: int = 0
    skipped: list[str] = field(default_factory=list)
    solves: int = 0
    reroutes: int = 0
    plans_per_host: dict[str, int] = field(default_factory=dict)
    settles: int = 0
    settles_skipped: int = 0
    mismatch_count: int = 0
    mismatches: list[str] = field(default_factory=list)
    faults: list[FaultTiming] = field(default_factory=list)
    readmissions: list[PortReturn] = field(default_factory=list)
    returns: list[PortReturn] = field(default_factory=list)
    max_plans_per_host_per_event: int = 0
    expectations: list[ExpectResult] = field(default_factory=list)
    passed: bool = False

    @property
    def failures(self) -> list[str]:
        """Why the run did not pass, one sentence each (empty when it passed)."""
        out = [f"{e.name}: {e.detail}" for e in self.expectations if not e.held]
        if self.mismatch_count:
            out.insert(
                0, f"oracle: {self.mismatch_count} mismatch(es), first: {self.mismatches[0]}"
            )
        return out

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["plans_total"] = self.plans_total
        d["plans_max_per_host"] = self.plans_max_per_host
        d["failures"] = self.failures
        return d

    def text(self) -> str:
        """A short human-readable report (a few lines)."""
        timed = [f.reroute_ms for f in self.faults if f.reroute_ms is not None]
        lines = [
            f"{self.scenario}: {'PASSED' if self.passed else 'FAILED'}",
            f"  {self.events} events in {self.duration_s:g} s simulated, solve back-off "
            f"{'/'.join(f'{d:g}' for d in self.solve_delays_ms)} ms; {self.solves} solves, "
            f"{self.reroutes} reroutes",
            f"  plans: {self.plans_total} new host plans, "
            f"at most {self.plans_max_per_host} per host, "
            f"{self.max_plans_per_host_per_event} per host per event",
            f"  down transitions: {len(self.faults)}, rerouted {len(timed)}"
            + (f" (max {max(timed):g} ms)" if timed else ""),
        ]
        lines += [
            f"  re-admitted {r['host']} rail {r['rail']} at {r['at_s']:g} s"
            for r in self.readmissions
        ]
        skipped = (
            f" ({self.settles_skipped} skipped during outages)" if self.settles_skipped else ""
        )
        lines.append(f"  oracle: {self.settles} settles{skipped}, {self.mismatch_count} mismatches")
        lines += mismatch_lines(self.mismatch_count, self.mismatches)
        for e in self.expectations:
            lines.append(f"  expect {e.name}: {'held' if e.held else 'FAILED'} ({e.detail})")
        if self.skipped:
            lines.append(f"  not modelled, skipped: {len(self.skipped)} events")
            lines += [f"    {s}" for s in self.skipped[:5]]
        return "\n".join(lines) + "\n"


class _Run:
    """The state of one replay; :func:`run` drives it."""

    def __init__(self, loaded: LoadedScenario) -> None:
        sc, fabric = loaded.scenario, loaded.fabric
        self.loaded = loaded
        self.fabric = fabric
        self.policy = sc.damping or DampingPolicy()
        svc = ServiceSettings()
        if sc.debounce_ms is not None:
            svc.solve = svc.solve.model_copy(update={"short_ms": sc.debounce_ms})
        self.debounce_s = svc.solve.short_ms / 1000
        self.backoff = SolveBackoff(svc.backoff_policy())
        self.state = FabricState(fabric=fabric, epoch_start=1)
        self.switch_model = SwitchModel(fabric)
        self.monitors: dict[str, PortMonitor] = {}
        self.deadlines: dict[str, float | None] = {}
        self.hcas = {(h.host, c.rail): c for h in fabric.hosts for c in h.hcas}
        self.rail_of = {(h.host, c.key): c.rail for h in fabric.hosts for c in h.hcas}
        self.raw_down: set[tuple[str, int]] = set()  # (host, rail) the scenario has down
        self.touched: set[str] = set()  # hosts with a port event after time 0
        self.switches_down: set[str] = set()
        self.cables_down: dict[tuple[str, str], CableRef] = {}
        self.faults_now = FabricFaults(switches_down=[], cables_down=[], at=WALL0)
        self.fault_causes: set[Transition] = set()
        #: (host, rail) -> the port's current (state, phys_state); absent: ACTIVE/LinkUp
        self.readings: dict[tuple[str, int], tuple[PortStateName, PhysState]] = {}
        self.last_transition: dict[tuple[str, int], Transition] = {}
        self.pending_at: float | None = None  # when the debounced solve runs
        self.settle_s = svc.startup_settle_s
        self.broker_up = True
        self.service_up = True
        self.agents_down: set[str] = set()
        #: states published while the broker or the service is away, latest per port: what
        #: the service finds (retained, or re-published on reconnect) when both are back
        self.undelivered: dict[tuple[str, str], PortState] = {}
        self.faults_undelivered = False
        self.blocked = False  # a solve came due while it could not run or publish
        self.causes: set[Transition] = set()  # transitions batched into the pending solve
        self.down: dict[Transition, str] = {}  # down transitions -> timeline kind
        self.timing: dict[Transition, float | None] = {}
        self.per_event: dict[Transition, Counter[str]] = defaultdict(Counter)
        self.report = RunReport(
            scenario=sc.name,
            path=str(loaded.path),
            duration_s=sc.duration_s,
            debounce_ms=self.debounce_s * 1000,
            solve_delays_ms=[svc.solve.initial_ms, svc.solve.short_ms, svc.solve.long_ms],
        )

    # -- agents --------------------------------------------------------------------------------
    def start(self) -> None:
        """Time 0: every agent reads its ports ACTIVE; the service makes the full build."""
        for inv in self.fabric.hosts:
            mon = PortMonitor(
                host=inv.host, policy=self.policy, rails={c.key: c.rail for c in inv.hcas}
            )
            self.monitors[inv.host] = mon
            batch = [
                self._reading(inv.host, c.rail, PortStateName.ACTIVE, PhysState.LINK_UP, 0.0)
                for c in inv.hcas
            ]
            self._handle(inv.host, mon.observe(batch, now=0.0, wall=WALL0), 0.0)
        self.state.solve(WALL0)  # the full build: every host's first plan
        self.pending_at = None
        self.backoff = SolveBackoff(self.backoff.policy)
        self.causes.clear()
        self._settle(0.0)

    def _reading(
        self, host: str, rail: int, state: PortStateName, phys: PhysState, t: float
    ) -> PortObservation:
        c = self.hcas[(host, rail)]
        return PortObservation(
            hca=c.hca,
            port=c.port,
            monotonic=t,
            link_layer=c.link_layer,
            state=state,
            phys_state=phys,
            netdev=c.netdev,
        )

    def _handle(self, host: str, out: MonitorOutput, t: float) -> None:
        """Feed a monitor's effects to the service state, as the agent publishes them. A
        change is caused by its port's last transition (the event itself, or the return that
        started the hold-down now ending)."""
        self.deadlines[host] = out.next_deadline
        for ev in out.events:
            if ev.current == PortStatus.UP and ev.previous in _OUT:
                self.report.returns.append({"host": host, "rail": ev.rail, "at_s": t})
                if ev.previous in _HELD:
                    self.report.readmissions.append({"host": host, "rail": ev.rail, "at_s": t})
        for st in out.states:
            if not self._reachable():
                self.undelivered[(host, st.key)] = st
                continue
            self._deliver(st, t)

    def _deliver(self, st: PortState, t: float) -> None:
        if self.state.on_port_state(st):
            rail = self.rail_of[(st.host, st.key)]
            urgent = st.status != PortStatus.UP
            self._dirty(t, self.last_transition.get((st.host, rail)), urgent=urgent)

    def _reachable(self) -> bool:
        """Whether a state published now reaches the service (broker and service both up)."""
        return self.broker_up and self.service_up

    def _dirty(self, t: float, cause: Transition | None, *, urgent: bool = True) -> None:
        self.pending_at = self.backoff.on_change(t, urgent=urgent)
        if cause is not None:
            self.causes.add(cause)

    # -- events ----------------------------------------------------------------------------------
    def event(self, e: Event) -> None:
        t, cause = e.at_s, (e.entry, e.at_s)
        if e.kind not in MODELLED:
            who = f" {e.host}" if e.host else ""
            self.report.skipped.append(
                f"{e.kind}{who} at {t:g} s (timeline[{e.entry}]): not modelled yet"
            )
            return
        self.report.events += 1
        if e.kind in ("port_down", "switch_down", "cables_down"):
            self.down.setdefault(cause, self.loaded.scenario.timeline[e.entry].kind)
        if e.kind.startswith("port_"):
            assert e.host is not None and e.rail is not None and e.state and e.phys_state
            key = (e.host, e.rail)
            self.touched.add(e.host)
            (self.raw_down.add if e.kind == "port_down" else self.raw_down.discard)(key)
            self.last_transition[key] = cause
            self.readings[key] = (e.state, e.phys_state)
            if e.host in self.agents_down:
                return  # nobody watches the port: the restarted agent reads it
            obs = self._reading(e.host, e.rail, e.state, e.phys_state, t)
            out = self.monitors[e.host].observe([obs], now=t, wall=WALL0 + t)
            self._handle(e.host, out, t)
            return
        if e.kind in ("broker_down", "service_down"):
            if e.kind == "broker_down":
                self.broker_up = False
            else:
                self.service_up = False
            return
        if e.kind in ("broker_up", "service_up"):
            if e.kind == "broker_up":
                self.broker_up = True
            else:
                self.service_up = True
                # a new instance: it collects the retained states for startup_settle_s, then
                # solves; its back-off starts quiet
                self.backoff = SolveBackoff(self.backoff.policy)
            self._recover(t, settle_s=self.settle_s if e.kind == "service_up" else 0.0)
            return
        if e.kind == "agent_down":
            assert e.host is not None
            self.agents_down.add(e.host)
            self.deadlines[e.host] = None  # its timers died with it
            return
        if e.kind == "agent_up":
            assert e.host is not None
            self.agents_down.discard(e.host)
            self._start_agent(e.host, t)
            return
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
        faults = FabricFaults(
            switches_down=sorted(self.switches_down),
            cables_down=list(self.cables_down.values()),
            at=WALL0 + t,
        )
        self.faults_now = faults
        if not self._reachable():
            self.faults_undelivered = True  # retained: the service reads it when it is back
            self.fault_causes.add(cause)
            return
        self._deliver_faults(t, cause)

    def _deliver_faults(self, t: float, cause: Transition | None) -> None:
        before = self.state.health.unusable if self.state.health else {}
        health = self.state.on_fabric_faults(self.faults_now)
        if health.unusable != before:
            self._dirty(t, cause)

    def _recover(self, t: float, *, settle_s: float) -> None:
        """Broker or service back: if both are, the service gets every port's latest state
        and the fault set, then solves (after ``settle_s``, a new instance's startup
        settle); with nothing to change, the oracle settles at once."""
        if not self._reachable():
            return
        pending, self.undelivered = self.undelivered, {}
        for st in pending.values():
            self._deliver(st, t)
        if self.faults_undelivered:
            self.faults_undelivered = False
            causes, self.fault_causes = self.fault_causes, set()
            self._deliver_faults(t, None)
            self.causes |= causes
        if self.blocked or self.state.dirty:
            self.blocked = False
            self._dirty(t, None)
        if self.pending_at is not None:
            self.pending_at = max(self.pending_at, t + settle_s)
        elif not self.agents_down:
            self._settle(t)

    def _start_agent(self, host: str, t: float) -> None:
        """A restarted agent: a new monitor (no flap history) reads every port as it is now."""
        inv = self.fabric.host(host)
        mon = PortMonitor(host=host, policy=self.policy, rails={c.key: c.rail for c in inv.hcas})
        self.monitors[host] = mon
        batch = [
            self._reading(host, c.rail, *self.readings.get((host, c.rail), _ACTIVE_READING), t)
            for c in inv.hcas
        ]
        self._handle(host, mon.observe(batch, now=t, wall=WALL0 + t), t)
        if self.pending_at is None and not self.agents_down and self._reachable():
            self._settle(t)  # nothing changed while it was away

    def tick(self, host: str, t: float) -> None:
        self._handle(host, self.monitors[host].tick(now=t, wall=WALL0 + t), t)

    # -- service ---------------------------------------------------------------------------------
    def solve(self, t: float) -> None:
        self.pending_at = None
        if not (self.broker_up and self.service_up):
            self.blocked = True  # no service to solve, or no bus to carry its plans
            return
        self.backoff.started(t)
        causes, self.causes = self.causes, set()
        solved = self.state.solve(WALL0 + t)
        self.report.solves += 1
        if solved.hosts:
            self.report.reroutes += 1
        for h in solved.hosts:
            self.report.plans_per_host[h] = self.report.plans_per_host.get(h, 0) + 1
            for c in causes:
                self.per_event[c][h] += 1
        for c in causes:
            if c in self.down and c not in self.timing and solved.hosts:
                self.timing[c] = round((t - c[1]) * 1000, 6)
        self._settle(t)

    def truth(self) -> dict[str, set[int]]:
        """Rails unusable in fact: ports down, lost to switch faults, or held down/suppressed."""
        out: dict[str, set[int]] = defaultdict(set)
        for host, rail in self.raw_down:
            out[host].add(rail)
        links = self.state.cable_indices(self.cables_down.values())
        health = self.switch_model.assess(switches_down=self.switches_down, links_down=links)
        for host, rails in health.unusable.items():
            out[host] |= rails
        for host in sorted(self.touched):  # the others read ACTIVE since time 0: none is held
            for c in self.fabric.host(host).hcas:
                st = self.monitors[host].state(c.key)
                if st is not None and st.status in _HELD:
                    out[host].add(c.rail)
        return dict(out)

    def _settle(self, t: float) -> None:
        if not self.loaded.scenario.expect.reachability:
            return
        if self.agents_down or not self._reachable():
            self.report.settles_skipped += 1  # the model cannot know what nobody reports
            return
        self.report.settles += 1
        truth = self.truth()
        pairs = pairs_to_check(self.fabric, truth, seed=self.loaded.scenario.seed)
        found = check(self.fabric, truth, self.state.plans, pairs)
        self.report.mismatch_count += len(found)
        room = MAX_MISMATCHES - len(self.report.mismatches)
        self.report.mismatches += [f"{t:.3f} s: {m}" for m in found[:room]]

    # -- results ---------------------------------------------------------------------------------
    def finish(self) -> RunReport:
        r = self.report
        r.faults = [
            FaultTiming(entry=c[0], kind=kind, at_s=c[1], reroute_ms=self.timing.get(c))
            for c, kind in sorted(self.down.items(), key=lambda x: (x[0][1], x[0][0]))
        ]
        r.max_plans_per_host_per_event = max(
            (n for counts in self.per_event.values() for n in counts.values()), default=0
        )
        r.expectations = self._expectations()
        r.passed = r.mismatch_count == 0 and all(e.held for e in r.expectations)
        return r

    def _expectations(self) -> list[ExpectResult]:
        ex, r = self.loaded.scenario.expect, self.report
        out = []
        if ex.reachability:
            out.append(ExpectResult.reachability(r.mismatch_count, r.settles, "settles"))
        if ex.max_reroute_ms is not None:
            timed = [f for f in r.faults if f.reroute_ms is not None]
            worst = max(timed, key=lambda f: f.reroute_ms or 0.0, default=None)
            observed = (worst.reroute_ms or 0.0) if worst else 0.0  # timed: never None
            held = observed <= ex.max_reroute_ms
            detail = (
                f"slowest reroute {observed:g} ms (timeline[{worst.entry}] at {worst.at_s:g} s)"
                if worst
                else "no reroute"
            ) + f", limit {ex.max_reroute_ms:g} ms"
            out.append(ExpectResult("max_reroute_ms", ex.max_reroute_ms, observed, held, detail))
        if ex.max_plans_per_host_per_event is not None:
            n, limit = r.max_plans_per_host_per_event, ex.max_plans_per_host_per_event
            worst_at = [
                f"timeline[{c[0]}] at {c[1]:g} s, {h}"
                for c, counts in sorted(self.per_event.items())
                for h, k in sorted(counts.items())
                if k == n
            ]
            out.append(
                ExpectResult.plans_per_event(n, limit, where=worst_at[0] if worst_at else "")
            )
        return out


def run(
    loaded: LoadedScenario,
    *,
    progress: Callable[[float], None] | None = None,
    progress_steps: int = 10,
) -> RunReport:
    """Replay ``loaded`` (see the module docstring) and return its :class:`RunReport`.
    Deterministic: the same scenario gives the same report. Events, monitor deadlines and
    solves up to ``duration_s`` are processed in time order (at one instant: events, then due
    monitor timers, then a due solve); a solve still pending at the end is made.
    ``progress`` is called with the simulated time reached (s) each time another
    1/``progress_steps`` of ``duration_s`` is done, and at the end."""
    sim = _Run(loaded)
    sim.start()
    events = expand(loaded)
    end = loaded.scenario.duration_s
    steps = max(1, progress_steps)
    k = 1  # the next progress report is at k/steps of the run
    i = 0
    while True:
        times = [] if i >= len(events) else [events[i].at_s]
        times += [d for d in sim.deadlines.values() if d is not None and d <= end]
        if sim.pending_at is not None:
            times.append(sim.pending_at)
        if not times:
            break
        t = min(times)
        while progress is not None and k < steps and t >= end * k / steps:
            progress(end * k / steps)
            k += 1
        while i < len(events) and events[i].at_s <= t:
            sim.event(events[i])
            i += 1
        for host, d in list(sim.deadlines.items()):
            if d is not None and d <= t and host not in sim.agents_down:
                sim.tick(host, t)
        if sim.pending_at is not None and sim.pending_at <= t:
            sim.solve(t)
    while progress is not None and k < steps:
        progress(end * k / steps)  # nothing left to happen: the rest of the run is done
        k += 1
    if progress is not None:
        progress(end)
    return sim.finish()
