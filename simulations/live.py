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
is quiet again (``solve.holddown_ms`` after those first states). The timeline then plays at
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
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from linkguard.agent.daemon import Agent
from linkguard.bus import BusSession
from linkguard.config import ServiceSettings
from linkguard.drivers.simulated import SimulatedPortSource, active_port
from linkguard.models import FabricFaults, PhysState, PortStateName
from linkguard.simulations.engine import percentile
from linkguard.simulations.faultset import SWITCH_KINDS, FaultSet
from linkguard.simulations.fleet import SimulatedFleet, wait_until
from linkguard.simulations.livebus import BUSES, BusKind, FaultsOperator, LiveBroker, open_broker
from linkguard.simulations.liveoracle import check_installed, table_drift, table_egress
from linkguard.simulations.livereport import LiveFault, LiveReport, Recovery, live_expectations
from linkguard.simulations.livewatch import LiveWatch, Pending, Transition
from linkguard.simulations.scenario import Event, LoadedScenario, expand
from linkguard.topology.service import TopologyService

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

_TIMED = frozenset({"port_down", "switch_down", "cables_down"})
_RECOVERIES = frozenset({"broker_up", "service_up", "agent_up"})


class _Live:
    """One replay: plays the timeline's transitions on the fleet (ports, switch faults,
    outages) and leaves the watching to its :class:`~linkguard.simulations.livewatch.LiveWatch`."""

    def __init__(
        self,
        loaded: LoadedScenario,
        *,
        broker: LiveBroker,
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
            sc.debounce_ms if sc.debounce_ms is not None else ServiceSettings().solve.short_ms
        )
        self.fleet = SimulatedFleet(
            self.fabric,
            bus=broker.settings,
            workdir=workdir / "fleet",
            damping=sc.damping,
            debounce_ms=debounce_ms,
            bus_factory=broker.bus_factory,
        )
        self.readings: dict[tuple[str, int], tuple[PortStateName, PhysState]] = {}
        self.faultset = FaultSet()
        self.faults: FabricFaults | None = None
        self.operator = FaultsOperator(broker, lambda: self.faults)
        self.tasks: dict[str, asyncio.Task[None]] = {}  # service / agent:<host> I started
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
                settings.solve.initial_ms,
                settings.solve.short_ms,
                settings.solve.long_ms,
            ],
        )
        self.watch = LiveWatch(
            loaded, fleet=self.fleet, report=self.report, settle_timeout_s=settle_timeout_s
        )

    # -- events ----------------------------------------------------------------------------------
    async def transition(self, events: list[Event]) -> None:
        """Apply the primitive events of one timeline entry at one instant."""
        first = events[0]
        key: Transition = (first.entry, first.at_s)
        w = self.watch
        before = w.truth()
        state = self.fleet.service.state
        epoch_before = max((state.acked_epoch(h) or 0 for h in state.published), default=0)
        t0, wall0 = time.monotonic(), time.time()
        faults_changed = False
        for e in events:
            self.report.events += 1
            if e.kind in ("port_down", "port_up"):
                self._port(e)
            elif e.kind in SWITCH_KINDS:
                self.faultset.apply(e)
                faults_changed = True
            else:
                await self._lifecycle(e)
        if faults_changed:
            self.faults = self.faultset.faults(at=time.time())
            w.model.on_fabric_faults(self.faults)
            await self.operator.publish()
        w.transitions.append((t0, key))
        if w.unsettled_since is None:
            w.unsettled_since = t0
        timed = [e for e in events if e.kind in _TIMED]
        if timed:
            hosts = {e.host for e in timed if e.kind == "port_down" and e.host}
            w.pending.append(
                Pending(
                    key=key,
                    kind=self.loaded.scenario.timeline[first.entry].kind,
                    host=next(iter(hosts)) if len(hosts) == 1 else None,
                    t0=t0,
                    wall0=wall0,
                    rerouted=w.truth() != before,
                    epoch_before=epoch_before,
                    fast_hosts=hosts,
                )
            )
        w.recovering += [(e, t0) for e in events if e.kind in _RECOVERIES]

    def _port(self, e: Event) -> None:
        assert e.host and e.rail is not None and e.state and e.phys_state and e.hca and e.port
        k = (e.host, e.rail)
        self.watch.touched.add(e.host)
        self.readings[k] = (e.state, e.phys_state)
        (self.watch.raw_down.add if e.kind == "port_down" else self.watch.raw_down.discard)(k)
        self.fleet.sources[e.host].set(e.hca, e.port, state=e.state, phys_state=e.phys_state)

    async def _lifecycle(self, e: Event) -> None:
        """Broker, service and agent outages (module docstring)."""
        w = self.watch
        if e.kind == "broker_down":
            w.broker_up = False
            await asyncio.to_thread(self.broker.down)
        elif e.kind == "broker_up":
            await asyncio.to_thread(self.broker.up)
            w.broker_up = True
        elif e.kind == "service_down":
            w.service_up = False
            svc = self.fleet.service
            self.solves_retired += svc.solves
            await self._crash(svc.bus, f"linkguard-topology-{svc.me.instance}", "service")
        elif e.kind == "service_up":
            new = TopologyService(
                self.fleet.service.settings, fabric=self.fabric, bus_factory=self.broker.bus_factory
            )
            self.fleet.service = new
            self.tasks["service"] = asyncio.create_task(new.run(), name="service")
            w.service_up = True
        elif e.kind == "agent_down":
            assert e.host is not None
            w.agents_down.add(e.host)
            w.touched.add(e.host)
            a = self.fleet.agents[e.host]
            await self._crash(a.bus, f"linkguard-agent-{a.host}-{a.me.instance}", f"agent:{a.host}")
        elif e.kind == "agent_up":
            assert e.host is not None
            self._restart_agent(e.host)
            w.agents_down.discard(e.host)

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
            async with asyncio.timeout(10):
                await asyncio.shield(task)

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
        again (``solve.holddown_ms`` after the last of those first states, each of which
        counts as a change): a scenario's first fault meets a fleet that has been running."""
        fleet = self.fleet
        ports = sum(len(h.hcas) for h in self.fabric.hosts)
        await fleet.wait_all_acked(timeout=timeout)
        await wait_until(lambda: len(fleet.service.state.ports) >= ports, timeout, "port states")
        await asyncio.sleep(fleet.service.settings.solve.holddown_ms / 1000)
        await fleet.wait_all_acked(timeout=timeout)

    async def run(
        self,
        events: list[Event],
        *,
        startup_timeout_s: float,
        inspect: Callable[[SimulatedFleet], object] | None,
    ) -> LiveReport:
        sc, w = self.loaded.scenario, self.watch
        t_begin = time.monotonic()
        op_task = asyncio.create_task(self.operator.bus.run(), name="sim-operator")
        try:
            async with self.fleet:
                watch: asyncio.Task[None] | None = None
                try:
                    await self._at_rest(startup_timeout_s)
                    w.t_start = time.monotonic()
                    self.report.startup_s = round(w.t_start - t_begin, 3)
                    self.solves0 = self.fleet.service.solves
                    w.track(w.t_start)
                    baseline = set(w.plan_seen)
                    watch = asyncio.create_task(w.run(), name="sim-watch")
                    for group in _groups(events):
                        await _sleep_until(w.t_start + group[0].at_s)
                        await self.transition(group)
                        if watch.done():
                            watch.result()  # the watcher failed: raise it
                    left = w.t_start + sc.duration_s - time.monotonic()
                    with contextlib.suppress(TimeoutError):
                        await wait_until(
                            lambda: self.stop_when_quiet and w.quiet(), max(left, 0), "quiet"
                        )
                    with contextlib.suppress(TimeoutError):  # the last ones may still settle
                        await wait_until(
                            lambda: not (w.pending or w.recovering),
                            self.settle_timeout_s + 1,
                            "the last transitions to settle",
                        )
                    if w.pending or w.recovering:
                        self.report.unsettled.append(
                            f"still settling at the end ({w.why_unsettled()})"
                        )
                        w.close(time.monotonic(), settled=False)
                    self.report.ended_s = round(time.monotonic() - w.t_start, 3)
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
        """The report, once the run is over: plan counts (leaving out ``baseline``, time 0's
        plans), fault timings, expectations, the verdict."""
        r, w = self.report, self.watch
        r.plans_per_host, r.max_plans_per_host_per_event = w.plan_counts(baseline)
        r.faults = sorted((w.timing(p) for p in w.closed), key=lambda f: (f.at_s, f.entry))
        r.expectations = live_expectations(self.loaded.scenario.expect, r)
        r.passed = not r.unsettled and r.mismatch_count == 0 and all(e.held for e in r.expectations)
        return r


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
        broker = open_broker(bus, workdir)
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
