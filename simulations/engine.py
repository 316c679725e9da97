"""Deterministic replay of a scenario through the real decision code, on a simulated clock.

Consumes: a :class:`~linkguard.simulations.scenario.LoadedScenario`. Produces: a
:class:`~linkguard.simulations.runreport.RunReport` (events, solves, plans per host, reroute
times, the agents' fast paths, oracle mismatches and which of the scenario's ``expect`` held).

What runs is the real code, without bus or threads, on the simulated clock: the topology
service's core (:class:`~linkguard.topology.core.ServiceCore`: its fabric state, its solve
schedule with the RFC 8405 back-off of :mod:`linkguard.topology.backoff`, the service's
defaults and ``debounce_ms`` from the scenario, and its switch fault desk,
:class:`~linkguard.topology.faultsdesk.FaultsDesk`) and, per host, the agent's port monitor and
core (:class:`~linkguard.simulations.simhost.SimHost`: the scenario's damping policy, the
monitor ticked at its own deadlines as the agent's ``timer`` task does). Their effects are
executed here: a port state an agent publishes goes to the service core, its acks too; the
plans and peer routes a solve publishes go to the agents (in the order the service publishes
them); a plan put in place, and a fast path (a port down in use gets the backup of the plan in
place at once, :class:`~linkguard.agent.core.AgentCore`), are recorded. Switch and cable
faults reach the service as the whole set ``fabric/faults`` carries. A change that alters
which rails are usable schedules a solve (the schedule's back-off), and that solve takes every
change that arrived until it runs. A solve takes no simulated time and its plans count as
applied at once, so a down transition's time to reroute is the back-off delay (10 ms after a
quiet period by default); the fast path takes none. Time 0: every port reads ACTIVE and the
service makes its full build.

After every solve (a *settle*) the oracle (:mod:`linkguard.simulations.oracle`) compares the
service's plans with the truth: ports the scenario has down, rails lost to switch faults
(:mod:`linkguard.topology.health`) and ports their agent still holds down or suppresses.

Outages. While the broker or the service is down no state reaches the service and no plan
reaches an agent: each port's latest state (and the fault set) is delivered when both are back
(agents re-publish their current state on reconnect; a new service instance reads the retained
ones for ``startup_settle_s``, and its solve back-off starts quiet), and a solve that came due
meanwhile runs then. The agents' fast path runs all the same. An agent that is down watches
nothing (its host keeps its routes); restarted, it finds its last plan and the retained
messages, and reads every port afresh, with no flap history. The oracle does not settle during
an outage (``settles_skipped``): nobody can know what nobody reports; it checks again once
everything is back.

Not modelled here: ack latency and solve time (``linkguard sim run --bus`` runs the real agents
and service over a real bus for those).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, MutableMapping
from typing import Any, NoReturn

import structlog
from structlog.testing import capture_logs

from linkguard import topics
from linkguard.agent.core import FAST_PATH_FROM
from linkguard.agent.monitor import DampingPolicy
from linkguard.config import ServiceSettings
from linkguard.costreport import percentile  # re-exported: the runners' reports use it
from linkguard.drivers.base import PortObservation
from linkguard.models import (
    Ack,
    FabricFaults,
    PhysState,
    PortState,
    PortStateName,
    PortStatus,
    encode,
)
from linkguard.presence import Me
from linkguard.simulations.faultset import FaultSet
from linkguard.simulations.oracle import check, pairs_to_check
from linkguard.simulations.runreport import (
    MAX_MISMATCHES,
    WALL0,
    ExpectResult,
    FaultTiming,
    PlanCounts,
    PortReturn,
    RunReport,
    mismatch_lines,
    return_rail,
)
from linkguard.simulations.scenario import EVENT_KINDS, Event, LoadedScenario, expand
from linkguard.simulations.simhost import PlanLog, Published, SimHost
from linkguard.topology.backoff import SolveBackoff
from linkguard.topology.core import ServiceCore
from linkguard.topology.effects import Effect, ScheduleSolve
from linkguard.topology.health import SwitchModel
from linkguard.topology.state import Solved

__all__ = [
    "MAX_MISMATCHES",
    "MODELLED",
    "WALL0",
    "ExpectResult",
    "FaultTiming",
    "PlanCounts",
    "PortReturn",
    "RunReport",
    "mismatch_lines",
    "percentile",
    "replay",
    "return_rail",
    "run",
]

#: Event kinds the engine replays (all of them today; others would be skipped with a note).
MODELLED = frozenset(EVENT_KINDS)

_HELD = (PortStatus.HELD_DOWN, PortStatus.SUPPRESSED)
_OUT = (PortStatus.DOWN, PortStatus.DEGRADED, *_HELD)  # after time 0: a port out of use
_ACTIVE_READING = (PortStateName.ACTIVE, PhysState.LINK_UP)
_FAULTS_TOPIC = topics.fabric_faults()

#: A transition: (timeline entry, at_s); every primitive event of one entry at one instant.
Transition = tuple[int, float]


class _Run:
    """The state of one replay; :func:`replay` drives it."""

    def __init__(self, loaded: LoadedScenario, *, keep_plans: bool = False) -> None:
        sc, fabric = loaded.scenario, loaded.fabric
        self.loaded = loaded
        self.fabric = fabric
        self.policy = sc.damping or DampingPolicy()
        svc = ServiceSettings()
        if sc.debounce_ms is not None:
            svc.solve = svc.solve.model_copy(update={"short_ms": sc.debounce_ms})
        self.debounce_s = svc.solve.short_ms / 1000
        #: the service (epochs from 1) and the agents, and what the service published
        self.core = ServiceCore(svc, fabric, verifier=None, me=Me(), elected=False, epoch_start=1)
        self.state = self.core.state
        self.log = PlanLog(history=keep_plans)
        #: hosts whose monitor has a deadline (kept by the SimHosts), and fabric order
        self.timed: set[str] = set()
        self.order = {inv.host: i for i, inv in enumerate(fabric.hosts)}
        self.hosts = {
            inv.host: SimHost(
                inv, self.policy, self.log, wall0=WALL0, keep_plans=keep_plans, timed=self.timed
            )
            for inv in fabric.hosts
        }
        self.switch_model = SwitchModel(fabric)
        self.hcas = {(h.host, c.rail): c for h in fabric.hosts for c in h.hcas}
        self.rail_of = {(h.host, c.key): c.rail for h in fabric.hosts for c in h.hcas}
        self.raw_down: set[tuple[str, int]] = set()  # (host, rail) the scenario has down
        self.touched: set[str] = set()  # hosts with a port event after time 0
        #: the switches down and cables cut, as the operator's `fabric/faults` carries them
        self.faultset = FaultSet()
        self.faults_now = FabricFaults(switches_down=[], cables_down=[], at=WALL0)
        self.fault_causes: set[Transition] = set()
        #: (host, rail) -> the port's current (state, phys_state); absent: ACTIVE/LinkUp
        self.readings: dict[tuple[str, int], tuple[PortStateName, PhysState]] = {}
        self.last_transition: dict[tuple[str, int], Transition] = {}
        self.pending_at: float | None = None  # when the scheduled solve runs
        self.settle_s = svc.startup_settle_s
        self.broker_up = True
        self.service_up = True
        self.agents_down: set[str] = set()
        #: states published while the broker or the service is away, latest per port: what
        #: the service finds (retained, or re-published on reconnect) when both are back; the
        #: same for each host's last ack
        self.undelivered: dict[tuple[str, str], PortState] = {}
        self.acks_undelivered: dict[str, Ack] = {}
        self.faults_undelivered = False
        self.blocked = False  # a solve came due while it could not run or publish
        self.causes: set[Transition] = set()  # transitions batched into the pending solve
        self.down: dict[Transition, str] = {}  # down transitions -> timeline kind
        self.timing: dict[Transition, float | None] = {}
        self.per_event: dict[Transition, Counter[str]] = defaultdict(Counter)
        #: how many ports went down in use, and those not moved at once (host, rail, time)
        self.fast_path_wanted = 0
        self.fast_path_missed: list[str] = []
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
        for host, sim in self.hosts.items():
            batch = [
                self._reading(host, c.rail, PortStateName.ACTIVE, PhysState.LINK_UP, 0.0)
                for c in sim.inv.hcas
            ]
            self._handle(host, sim.observe(batch, 0.0), 0.0)
        self._solve_and_publish(0.0)  # the full build: every host's first plan
        self.pending_at = None
        self._quiet_backoff()
        self.causes.clear()
        self._settle(0.0)

    def _quiet_backoff(self) -> None:
        """The service's solve back-off starts quiet (after the full build; a new instance)."""
        sched = self.core.schedule
        sched.backoff = SolveBackoff(sched.backoff.policy)

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

    def _handle(self, host: str, out: Published, t: float) -> None:
        """Deliver what an agent published to the service. A change is caused by its port's
        last transition (the event itself, or the return that started the hold-down now
        ending)."""
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
        for ack in out.acks:
            if self._reachable():
                self.core.on_ack(ack, t)
            else:
                self.acks_undelivered[host] = ack

    def _deliver(self, st: PortState, t: float) -> None:
        topic = topics.port_state(st.host, st.hca, st.port)
        effects = self.core.on_port_state(st, st.hca, st.port, topic, t)
        self._scheduled(effects, self.last_transition.get((st.host, self.rail_of[st.host, st.key])))

    def _reachable(self) -> bool:
        """Whether a state published now reaches the service (broker and service both up)."""
        return self.broker_up and self.service_up

    def _scheduled(self, effects: list[Effect], cause: Transition | None) -> None:
        """The service core's effects: a solve it scheduled is due at its time, and takes
        ``cause`` with it. The rest (logs, changes for the ledger) is not simulated."""
        for e in effects:
            if isinstance(e, ScheduleSolve):
                self.pending_at = e.at
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
            self._port(e, cause)
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
                self._quiet_backoff()
            self._recover(t, settle_s=self.settle_s if e.kind == "service_up" else 0.0)
            return
        if e.kind == "agent_down":
            assert e.host is not None
            self.agents_down.add(e.host)
            self.hosts[e.host].deadline = None  # its timers died with it
            return
        if e.kind == "agent_up":
            assert e.host is not None
            self.agents_down.discard(e.host)
            self._start_agent(e.host, t)
            return
        self.faultset.apply(e)
        faults = self.faultset.faults(at=WALL0 + t)
        self.faults_now = faults
        if not self._reachable():
            self.faults_undelivered = True  # retained: the service reads it when it is back
            self.fault_causes.add(cause)
            return
        self._deliver_faults(t, cause)

    def _port(self, e: Event, cause: Transition) -> None:
        """A port reads ``e``'s state: its agent (when running) observes it. A port that goes
        down in use (UP, UNKNOWN or DEGRADED before) is one the fast path should move."""
        assert e.host is not None and e.rail is not None and e.state and e.phys_state
        t, key = e.at_s, (e.host, e.rail)
        self.touched.add(e.host)
        (self.raw_down.add if e.kind == "port_down" else self.raw_down.discard)(key)
        self.last_transition[key] = cause
        self.readings[key] = (e.state, e.phys_state)
        if e.host in self.agents_down:
            return  # nobody watches the port: the restarted agent reads it
        sim = self.hosts[e.host]
        before = sim.monitor.state(self.hcas[key].key)
        in_use = e.kind == "port_down" and (before is None or before.status in FAST_PATH_FROM)
        taken = len(sim.fast_paths)
        obs = self._reading(e.host, e.rail, e.state, e.phys_state, t)
        self._handle(e.host, sim.observe([obs], t), t)
        if in_use:
            self.fast_path_wanted += 1
            if not any(f["rail"] == e.rail for f in sim.fast_paths[taken:]):
                self.fast_path_missed.append(f"{e.host} rail {e.rail} at {t:g} s")

    def _deliver_faults(self, t: float, cause: Transition | None) -> None:
        """The fault set in force, as ``fabric/faults`` carries it, to the service's fault
        desk; ``cause`` goes with the solve when the usable rails change."""
        desk = self.core.switch_faults
        faults = desk.read(_FAULTS_TOPIC, encode(self.faults_now))
        if not isinstance(faults, FabricFaults):
            return  # the set in effect already (a scenario's sets are valid)
        before = self.state.health.unusable if self.state.health else {}
        health = self.state.assess_faults(faults)
        effects = desk.accept(faults, health, t, WALL0 + t)
        self._scheduled(effects, cause if health.unusable != before else None)

    def _recover(self, t: float, *, settle_s: float) -> None:
        """Broker or service back: if both are, the service gets every port's latest state,
        the last acks and the fault set, then solves (after ``settle_s``, a new instance's
        startup settle); with nothing to change, the oracle settles at once."""
        if not self._reachable():
            return
        pending, self.undelivered = self.undelivered, {}
        for st in pending.values():
            self._deliver(st, t)
        acks, self.acks_undelivered = self.acks_undelivered, {}
        for ack in acks.values():
            self.core.on_ack(ack, t)
        if self.faults_undelivered:
            self.faults_undelivered = False
            causes, self.fault_causes = self.fault_causes, set()
            self._deliver_faults(t, None)
            self.causes |= causes
        if self.blocked or self.state.dirty:
            self.blocked = False
            self._scheduled(self.core.changed(t), None)
        if self.pending_at is not None:
            self.pending_at = max(self.pending_at, t + settle_s)
        elif not self.agents_down:
            self._settle(t)

    def _start_agent(self, host: str, t: float) -> None:
        """A restarted agent: a new monitor (no flap history) and core, with its last plan and
        the retained messages, reads every port as it is now."""
        sim = self.hosts[host] = self.hosts[host].restarted(self.policy)
        batch = [
            self._reading(host, c.rail, *self.readings.get((host, c.rail), _ACTIVE_READING), t)
            for c in sim.inv.hcas
        ]
        self._handle(host, sim.observe(batch, t), t)
        if self.pending_at is None and not self.agents_down and self._reachable():
            self._settle(t)  # nothing changed while it was away

    def tick(self, host: str, t: float) -> None:
        self._handle(host, self.hosts[host].tick(t), t)

    # -- service ---------------------------------------------------------------------------------
    def solve(self, t: float) -> None:
        self.pending_at = None
        if not (self.broker_up and self.service_up):
            self.blocked = True  # no service to solve, or no bus to carry its plans
            return
        causes, self.causes = self.causes, set()
        solved = self._solve_and_publish(t)
        if solved is not None:
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

    def _solve_and_publish(self, t: float) -> Solved | None:
        """The service's solver task woken at ``t`` (its schedule): solve when the state
        changed, publish the plans and peer routes in the schedule's order (None: nothing to
        solve)."""
        sched = self.core.schedule
        if not sched.solve_started(t):
            return None
        unusable = self.state.prepare()
        solved, publish = sched.commit(self.state.compute(unusable, now=WALL0 + t))
        self.log.publish(t, (m for _, m in publish.messages))
        n = len(publish.messages)
        sched.published(solved, unusable, now=t, messages=n, size=0, timings_ms=(0.0, 0.0, 0.0))
        return solved

    def truth(self) -> dict[str, set[int]]:
        """Rails unusable in fact: ports down, lost to switch faults, or held down/suppressed."""
        out: dict[str, set[int]] = defaultdict(set)
        for host, rail in self.raw_down:
            out[host].add(rail)
        links = self.state.cable_indices(self.faultset.cables)
        health = self.switch_model.assess(switches_down=self.faultset.switches, links_down=links)
        for host, rails in health.unusable.items():
            out[host] |= rails
        for host in sorted(self.touched):  # the others read ACTIVE since time 0: none is held
            for c in self.fabric.host(host).hcas:
                st = self.hosts[host].monitor.state(c.key)
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
        r.fast_paths = sorted(
            (f for sim in self.hosts.values() for f in sim.fast_paths),
            key=lambda f: (f["at_s"], f["host"], f["port"]),
        )
        r.expectations = self._expectations()
        r.passed = r.mismatch_count == 0 and all(e.held for e in r.expectations)
        if self.loaded.scenario.job is not None:  # said, not silently passed over
            r.skipped.append(
                "job: the training job and its expectations (job_max_stall_ms, "
                "job_rank_failures) run only in `linkguard sim lab`"
            )
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
        if ex.fast_path:
            covered = self.fast_path_wanted - len(self.fast_path_missed)
            first = self.fast_path_missed[0] if self.fast_path_missed else ""
            out.append(ExpectResult.fast_path(covered, self.fast_path_wanted, missed=first))
        return out


def run(
    loaded: LoadedScenario,
    *,
    progress: Callable[[float], None] | None = None,
    progress_steps: int = 10,
) -> RunReport:
    """Replay ``loaded`` (see the module docstring) and return its :class:`RunReport`
    (:func:`replay`'s, without the agents)."""
    return replay(loaded, progress=progress, progress_steps=progress_steps)[0]


def replay(
    loaded: LoadedScenario,
    *,
    progress: Callable[[float], None] | None = None,
    progress_steps: int = 10,
    keep_plans: bool = False,
) -> tuple[RunReport, dict[str, SimHost]]:
    """Replay ``loaded`` (see the module docstring): its :class:`RunReport` and the simulated
    hosts at the end, by host (their plans in place, fast paths and, with ``keep_plans``, every
    plan each put in place: at the end every running agent has read every plan).
    Deterministic: the same scenario gives the same report. Events, monitor deadlines and
    solves up to ``duration_s`` are processed in time order (at one instant: events, then due
    monitor timers, then a due solve); a solve still pending at the end is made.
    ``progress`` is called with the simulated time reached (s) each time another
    1/``progress_steps`` of ``duration_s`` is done, and at the end. The simulated agents'
    log lines are dropped (what they decided is in the report)."""
    with capture_logs(processors=[_drop]):
        return _replay(loaded, progress=progress, progress_steps=progress_steps, keep=keep_plans)


def _drop(logger: Any, name: str, event: MutableMapping[str, Any]) -> NoReturn:
    raise structlog.DropEvent


def _replay(
    loaded: LoadedScenario,
    *,
    progress: Callable[[float], None] | None,
    progress_steps: int,
    keep: bool,
) -> tuple[RunReport, dict[str, SimHost]]:
    sim = _Run(loaded, keep_plans=keep)
    sim.start()
    events = expand(loaded)
    end = loaded.scenario.duration_s
    steps = max(1, progress_steps)
    k = 1  # the next progress report is at k/steps of the run
    i = 0
    while True:
        times = [] if i >= len(events) else [events[i].at_s]
        # the hosts with a deadline (sim.timed, kept by the SimHosts): not every host's
        times += [d for x in sim.timed if (d := sim.hosts[x].deadline) is not None and d <= end]
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
        # after the events at t (they set deadlines too); a tick changes only its own host's
        for host in sorted(sim.timed, key=sim.order.__getitem__):
            h = sim.hosts[host]
            if h.deadline is not None and h.deadline <= t and host not in sim.agents_down:
                sim.tick(host, t)
        if sim.pending_at is not None and sim.pending_at <= t:
            sim.solve(t)
    while progress is not None and k < steps:
        progress(end * k / steps)  # nothing left to happen: the rest of the run is done
        k += 1
    if progress is not None:
        progress(end)
    if keep:
        for host in sorted(sim.hosts.keys() - sim.agents_down):
            sim._handle(host, sim.hosts[host].read(), end)
    return sim.finish(), sim.hosts
