"""One simulated host's agent on the simulated clock: the real port monitor and the real agent
core (:class:`~linkguard.agent.core.AgentCore`), with their effects executed in the simulation.

Consumes: port readings (:class:`~linkguard.drivers.base.PortObservation`) and timer ticks at a
simulated time ``t`` (s from time 0; the wall clock is ``wall0 + t``), and the plans and peer
routes the service published (:class:`PlanLog`, read up to date before the agent decides
anything). Produces: what the agent publishes (:class:`Published`: port states, events, acks),
the plan in place and the ports locally down (what its route table would hold), and each fast
path it took (:data:`~linkguard.simulations.runreport.FastPathTaken`).

The executors, in the simulation: :class:`~linkguard.agent.effects.FastPath` marks the port
locally down and, when the plan in place has a backup for it, acks with ``fast_path`` (as
:meth:`~linkguard.agent.applier.Applier.port_down` does, without a kernel); ``ApplyPlan`` puts
the plan in place and acks it applied (``apply_ms`` 0: applying takes no simulated time);
``MarkPortUp``, ``PublishState``, ``PublishEvent``, ``SendAck`` and ``ScheduleTimer`` are
recorded; files, metrics, NCCL files, hooks and neighbour flushes have nothing to simulate.

The plans and peer routes are read when a decision depends on them: before a fast path (the
backup of the plan in place) and, for a run that keeps plans, at its end. They are taken in
order, each at the time it was published, so the fast path finds the plan an agent that read
each at once would have in place; but a 2,048-host fleet does not expand every host's compact
plan on every peer routes message no decision looks at (:func:`~linkguard.models.expand_plan`,
about 0.5 ms each). Without ``keep_plans`` the log keeps only the last message of each topic,
as the broker retains them, and a read takes those: that leaves the agent with the same plan
in place.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from linkguard import topics
from linkguard.agent.core import AgentCore
from linkguard.agent.effects import (
    ApplyPlan,
    Effect,
    FastPath,
    MarkPortUp,
    PublishState,
    ScheduleTimer,
    SendAck,
)
from linkguard.agent.monitor import DampingPolicy, PortMonitor
from linkguard.drivers.base import PortObservation
from linkguard.models import Ack, AckResult, HostInventory, PeerRoutes, Plan, PortEvent, PortState
from linkguard.simulations.runreport import FastPathTaken

__all__ = ["PlanLog", "Published", "SimHost"]


class PlanLog:
    """What the service published: plans (each for its host) and peer routes (for every
    host), numbered in the order published, each with the time ``t`` (s) it was. Retained: an
    agent that was away reads what it missed when it is back. ``history``: keep every message
    (else the last of each topic, as the broker retains them)."""

    def __init__(self, *, history: bool = False) -> None:
        self.history = history
        self.count = 0  # messages published so far; a message's number is its place
        #: by topic: ``(True, host)`` for plans, ``(False, host)`` for peer routes
        self.topics: dict[tuple[bool, str], list[tuple[int, float, Plan | PeerRoutes]]] = {}
        self._peers: list[list[tuple[int, float, Plan | PeerRoutes]]] = []

    def publish(self, t: float, messages: Iterable[Plan | PeerRoutes]) -> None:
        for m in messages:
            kept = self.topics.get((isinstance(m, Plan), m.host))
            if kept is None:
                kept = self.topics[(isinstance(m, Plan), m.host)] = []
                if isinstance(m, PeerRoutes):
                    self._peers.append(kept)
            elif not self.history:
                kept.clear()
            kept.append((self.count, t, m))
            self.count += 1

    def since(self, host: str, after: int) -> list[tuple[float, Plan | PeerRoutes]]:
        """``host``'s plans and every host's peer routes numbered ``after`` or later, in the
        order they were published, with their times."""
        mine = [x for x in self.topics.get((True, host), ()) if x[0] >= after]
        mine += [x for kept in self._peers for x in kept if x[0] >= after]
        return [(t, m) for _, t, m in sorted(mine, key=lambda x: x[0])]


@dataclass
class Published:
    """What an agent published in one step: port states, events and acks, in order."""

    states: list[PortState] = field(default_factory=list)
    events: list[PortEvent] = field(default_factory=list)
    acks: list[Ack] = field(default_factory=list)


class SimHost:
    """The agent of ``inv`` (a fabric host): monitor (``policy``) and core. ``wall0``: the
    wall-clock time of simulated time 0 (Unix s); ``keep_plans``: remember every plan put in
    place (:attr:`plans`, for tests that compare runs)."""

    def __init__(
        self,
        inv: HostInventory,
        policy: DampingPolicy,
        log: PlanLog,
        *,
        wall0: float,
        keep_plans: bool = False,
        timed: set[str] | None = None,
    ) -> None:
        self.host = inv.host
        #: the hosts whose monitor has a deadline, shared by the engine's hosts (so its
        #: event loop looks at those, not at every host of the fleet)
        self._timed: set[str] = set() if timed is None else timed
        self.log = log
        self.inv = inv
        self.wall0 = wall0
        self.rails = {c.key: c.rail for c in inv.hcas}
        self.monitor = PortMonitor(host=inv.host, policy=policy, rails=self.rails)
        self.core = AgentCore(
            host=inv.host, netdevs={c.netdev for c in inv.hcas if c.netdev}, prefixes=[]
        )
        #: the plan in place (what the route table holds) and the ports locally down
        self.applied: Plan | None = None
        self.locally_down: set[str] = set()
        self._deadline: float | None = None
        self.deadline = None
        #: the fast paths taken, in order
        self.fast_paths: list[FastPathTaken] = []
        #: every plan put in place, in order (with ``keep_plans``)
        self.plans: list[Plan] | None = [] if keep_plans else None
        self._read = 0  # the number of the first message it has not read
        self._out = Published()

    @property
    def deadline(self) -> float | None:
        """When the monitor wants its next tick (s; None: nothing pending)."""
        return self._deadline

    @deadline.setter
    def deadline(self, value: float | None) -> None:
        self._deadline = value
        if value is None:
            self._timed.discard(self.host)
        else:
            self._timed.add(self.host)

    def restarted(self, policy: DampingPolicy) -> SimHost:
        """A new agent on this host: a new monitor (no flap history) and core, which finds
        the plan in place, the last plan and peer routes it received (the state dir) and has
        read the log as far as this one had; nothing is locally down."""
        new = SimHost(
            self.inv,
            policy,
            self.log,
            wall0=self.wall0,
            keep_plans=self.plans is not None,
            timed=self._timed,
        )
        new.core.restore(received=self.core.plan_received, peers=self.core.peers)
        new.core.restore_term(self.core.term)
        new.applied = self.applied
        new.plans = self.plans
        new.fast_paths = self.fast_paths
        new._read = self._read
        return new

    # -- inputs ----------------------------------------------------------------------------
    def observe(self, batch: list[PortObservation], t: float) -> Published:
        """Readings at ``t``."""
        out = self.monitor.observe(batch, now=t, wall=self.wall0 + t)
        self._out.events += out.events
        self._execute(self.core.observe(out), t)
        return self._take()

    def tick(self, t: float) -> Published:
        """The monitor's timers due at ``t``."""
        out = self.monitor.tick(now=t, wall=self.wall0 + t)
        self._out.events += out.events
        self._execute(self.core.observe(out), t)
        return self._take()

    def read(self) -> Published:
        """Take the plans and peer routes published since the last read (those the log
        keeps), in order, each at its time."""
        batch = self.log.since(self.host, self._read)
        self._read = self.log.count
        for t, m in batch:
            now = self.wall0 + t
            if isinstance(m, Plan):
                topic = topics.plan(m.host)
                effects = self.core.on_plan(m, raw=b"", topic=topic, applied=self.applied, now=now)
                self._execute(effects, t)
            else:
                topic = topics.peer_routes(m.host)
                effects = self.core.on_peer_routes(
                    m.host, m, raw=b"", topic=topic, applied=self.applied, now=now
                )
                self._execute(effects, t)
        return self._take()

    # -- the executors -----------------------------------------------------------------------
    def _execute(self, effects: list[Effect], t: float) -> None:
        for e in effects:
            if isinstance(e, FastPath):
                self._fast_path(e.port, t)
            elif isinstance(e, MarkPortUp):
                self.locally_down.discard(e.port)
            elif isinstance(e, ApplyPlan):
                self.applied = e.plan
                if self.plans is not None:
                    self.plans.append(e.plan)
                ack = self._ack(e.plan, t, fast_path=False)
                self._execute(self.core.plan_applied(ack), t)
            elif isinstance(e, SendAck):
                self._out.acks.append(e.ack)
            elif isinstance(e, PublishState):
                self._out.states.append(e.state)
            elif isinstance(e, ScheduleTimer):
                self.deadline = e.deadline
            # PublishEvent: in the events already (the monitor's); files, metrics, NCCL
            # files, hooks, neighbour flushes: nothing to simulate

    def _fast_path(self, port: str, t: float) -> None:
        """:class:`FastPath`: as the applier's ``port_down``, without a kernel, with the plans
        published so far in place (the one decision that reads them)."""
        self.read()
        self.locally_down.add(port)
        plan = self.applied
        ack = None
        if plan is not None and any(f"{b.hca}/{b.port}" == port for b in plan.backups):
            ack = self._ack(plan, t, fast_path=True)
            self.fast_paths.append(
                {"host": self.host, "port": port, "rail": self.rails.get(port), "at_s": t}
            )
        self._execute(self.core.fast_path_applied(port, ack), t)

    def _ack(self, plan: Plan, t: float, *, fast_path: bool) -> Ack:
        return Ack(
            host=self.host,
            epoch=plan.epoch,
            result=AckResult.APPLIED,
            applied_at=self.wall0 + t,
            apply_ms=0.0,
            fast_path=fast_path,
        )

    def _take(self) -> Published:
        out, self._out = self._out, Published()
        return out
