"""When a namespace-lab replay has settled after a step (:mod:`linkguard.simulations.labrun`),
and what the plans the hosts acked say against the model.

Consumes: what the bus observer saw (:class:`~linkguard.simulations.labprocs.Observer`: port
states, plans and acks with the monotonic time they arrived), what the run took down
(:class:`~linkguard.simulations.labinject.FaultInjector`) and the step just applied.
Produces: None once settled, else why not (:meth:`Settler.settle`), and the plan oracle's
mismatches (:meth:`Settler.plan_mismatches`, :func:`~linkguard.simulations.oracle.check` with
the ports the agents hold down counted as unusable).
"""

from __future__ import annotations

import asyncio
import time

from linkguard.config import ServiceSettings
from linkguard.models import AckResult, PortStateName, PortStatus, ack_covers
from linkguard.simulations.labinject import FaultInjector
from linkguard.simulations.labprocs import Observer, Procs
from linkguard.simulations.labsteps import Step
from linkguard.simulations.oracle import Mismatch, check, pairs_to_check
from linkguard.topology.fabric import Fabric

__all__ = ["QUIET_S", "SETTLE_TIMEOUT_S", "Settler", "acked_as_service"]

#: A step has settled when no plan arrived for this long (and at least this long after it).
QUIET_S = 0.4
#: Give up waiting for a settle after this long (s).
SETTLE_TIMEOUT_S = 10.0


def _owed(obs: Observer, host: str) -> int | None:
    """The epoch the service owes ``host`` (topology.state's ``acked_epoch``, from the bus)."""
    plan = obs.received.get(host)
    if plan is None:
        return None
    peers = max((p.epoch for p in obs.peers.values()), default=0)
    return plan.epoch if plan.shared is None else max(plan.epoch, peers)


def acked_as_service(obs: Observer, host: str) -> bool:
    """Has ``host``'s last ack answered what it owes, as the service counts it
    (topology.state.pending_acks)? A fast-path ack of the epoch owed is an ack of it (the
    overlay comes off when the port is back: no new ack), and an ack naming the peer routes
    it holds must hold every one on the bus (:func:`~linkguard.models.ack_covers`): after a
    leaf failure a whole host acks the peer routes' epoch from the first of them it applies."""
    owed, acks = _owed(obs, host), obs.acks.get(host)
    if owed is None or not acks:
        return False
    ack = acks[-1][1]
    plan = obs.received[host]
    return ack.result == AckResult.APPLIED and ack_covers(ack, owed, plan, obs.peers)


class Settler:
    """Watches the bus for a settle (:meth:`settle`). ``linkguard``: False for the baseline
    without agents or service (then a settle is a short quiet wait); ``seed``: the scenario's,
    for the pairs the oracle checks; ``debounce_ms``: the scenario's (None: the service's
    default)."""

    def __init__(
        self,
        fabric: Fabric,
        obs: Observer,
        procs: Procs,
        inject: FaultInjector,
        *,
        linkguard: bool,
        seed: int,
        debounce_ms: float | None,
    ) -> None:
        self.fabric = fabric
        self.names = fabric.host_names
        self.obs = obs
        self.procs = procs
        self.inject = inject
        self.linkguard = linkguard
        self.seed = seed
        svc = ServiceSettings()
        #: the longest the service may batch changes before it solves, plus a margin (s)
        self.max_wait_s = max(svc.solve.long_ms, debounce_ms or 0.0) / 1000 + 0.5

    def _caught_up(self, t_step: float, step: Step | None) -> bool:
        """The bus shows what ``step`` changed: the new state of every port it moved (on a
        host whose agent runs), every state again after the broker or an agent came back,
        a plan for every host after the service came back."""
        if step is None:
            return True
        for e in step.events:
            if e.kind in ("port_down", "port_up"):
                if f"agent:{e.host}" in self.inject.control_down:
                    continue
                seen = self.obs.ports.get(e.port_key)
                if seen is None or seen[0] < t_step:
                    return False
                active = seen[1].state == PortStateName.ACTIVE
                if active != (e.kind == "port_up"):
                    return False
            elif e.kind in ("broker_up", "agent_up"):
                hosts = (
                    self.fabric.hosts if e.kind == "broker_up" else [self.fabric.host(e.host_name)]
                )
                for inv in hosts:
                    for c in inv.hcas:
                        seen = self.obs.ports.get((inv.host, c.rail))
                        if seen is None or seen[0] < t_step:
                            return False
            elif e.kind == "service_up":
                for h in self.names:
                    plans = self.obs.plans.get(h)
                    if not plans or plans[-1][0] < t_step:
                        return False
        return True

    def _all_acked(self) -> bool:
        for h in self.names:
            plan = self.obs.latest_plan(h)
            if plan is None or self.obs.acked(h, plan.epoch) is None:
                return False
            if not acked_as_service(self.obs, h):
                return False
        return True

    async def settle(self, t_step: float, step: Step | None, deadline: float) -> str | None:
        """Wait until the fabric settled after ``step``; None when it did, else why not.

        Settled: the control plane is up, the bus caught up (:meth:`_caught_up`), every host
        acked its latest plan, no plan came for :data:`QUIET_S`, and either the acked plans
        agree with the model or the service's longest batching delay has passed as well
        (then the check reports what still disagrees)."""
        if self.inject.control_down:
            return f"not checked: {', '.join(sorted(self.inject.control_down))} down"
        if not self.linkguard:
            await asyncio.sleep(max(0.0, min(QUIET_S, deadline - time.monotonic())))
            return None
        deadline = min(deadline, t_step + SETTLE_TIMEOUT_S)
        seen_at: float | None = None
        memo: tuple[object, bool] | None = None
        while True:
            now = time.monotonic()
            if seen_at is None and self._caught_up(t_step, step):
                seen_at = now
            if seen_at is not None:
                quiet = now - max(seen_at, self.obs.last_plan_at, t_step)
                if quiet >= QUIET_S and self._all_acked():
                    if quiet >= self.max_wait_s:
                        return None
                    key = (self.obs.last_plan_at, len(self.obs.states))
                    if memo is None or memo[0] != key:
                        truth = self.inject.truth()
                        pairs = pairs_to_check(self.fabric, truth, seed=self.seed)
                        memo = (key, not self.plan_mismatches(truth, pairs))
                    if memo[1]:
                        return None
            if now >= deadline:
                return "not checked: not settled before the next step"
            self.procs.check_alive()
            await asyncio.sleep(0.01)

    def plan_mismatches(
        self, truth: dict[str, set[int]], pairs: list[tuple[str, str]]
    ) -> list[Mismatch]:
        """The plan oracle on the plans the hosts acked last, for ``pairs``: ``truth`` (rails
        physically unusable) plus the ports the agents report held down, suppressed or not
        usable."""
        held = {k: set(v) for k, v in truth.items()}
        for (h, rail), (_, st) in self.obs.ports.items():
            if st.status in (PortStatus.HELD_DOWN, PortStatus.SUPPRESSED) or not st.usable:
                held.setdefault(h, set()).add(rail)
        plans = {h: self.obs.latest_plan(h) for h in self.names}
        return check(self.fabric, held, plans, pairs)
