"""When the topology service solves, and what a solve's publish owes: its solve scheduling.

Consumes: "a change that needs a solve arrived at ``now``", "the solver task woke at ``now``",
a solve's output (:class:`~linkguard.topology.state.Fresh`), "its plans went out at ``now``",
applied acks, and route-around ticks (monotonic s). Produces: the time the next solve is due
(:class:`~linkguard.topology.effects.ScheduleSolve`, the RFC 8405 back-off of
:class:`~linkguard.topology.backoff.SolveBackoff`), the plans and peer routes to publish in
order (:class:`~linkguard.topology.effects.PublishPlans`), the hosts routed around, and the
``plans``/``host`` changes and log lines. Pure: no bus, no clock. The service's solver and
route-around tasks drive it; a simulator can drive the same object with a simulated clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from linkguard import topics
from linkguard.config import ServiceSettings
from linkguard.models import Ack, AckResult, PeerRoutes, Plan
from linkguard.topology.backoff import SolveBackoff
from linkguard.topology.effects import Effect, Emit, Log, PublishPlans, ScheduleSolve
from linkguard.topology.fabric import Fabric
from linkguard.topology.state import FabricState, Fresh, Solved

__all__ = ["SolveSchedule", "head"]


class SolveSchedule:
    """The solve scheduling of one service over ``state`` (the core's)."""

    def __init__(self, settings: ServiceSettings, fabric: Fabric, state: FabricState) -> None:
        self.settings = settings
        self.fabric = fabric
        self.state = state
        #: when to solve after a change (RFC 8405 back-off, ``solve:``)
        self.backoff = SolveBackoff(settings.backoff_policy())
        self.solves = 0
        self.plans_published = 0
        self.plans_per_host: Counter[str] = Counter()
        #: hosts the last publish waits for an applied ack from; (epoch, hosts, publish time)
        self._awaiting: set[str] = set()
        self._awaited: tuple[int, int, float] = (0, 0, 0.0)
        self._route_around_held = False

    def changed(self, now: float, *, urgent: bool = True) -> list[Effect]:
        """A change that needs a solve: schedule it (RFC 8405 back-off). ``urgent``: something
        went out of use (see :meth:`SolveBackoff.on_change`)."""
        due = self.backoff.on_change(now, urgent=urgent)
        fields = {
            "state": self.backoff.state.value,
            "due_in_ms": round(max(0.0, due - now) * 1000, 1),
        }
        return [ScheduleSolve(due), Log("debug", "solve_scheduled", fields)]

    def solve_started(self, now: float) -> bool:
        """The solver task wakes at ``now`` (a solve due, or the first after the settle): the
        back-off takes every change so far. Returns whether a solve is needed (the state is
        dirty); then :meth:`FabricState.prepare`, :meth:`FabricState.compute` (pure, CPU-bound:
        the wiring runs it in a worker thread) and :meth:`commit`."""
        self.backoff.started(now)
        return self.state.dirty

    def commit(self, fresh: Fresh) -> tuple[Solved, PublishPlans]:
        """Take a solve's output: the plans and peer routes to publish, in order: full plans
        first (a host that just lost a rail applies its new plan once, and the peer routes that
        follow do not touch a full plan), then the peer routes, then compact plans (a host
        that is whole again expands its plan with the peer routes of the same solve)."""
        solved = self.state.commit(fresh)
        self.solves += 1
        full = [(topics.plan(p.host), p) for p in solved.publish if p.shared is None]
        compact = [(topics.plan(p.host), p) for p in solved.publish if p.shared is not None]
        peers = [(topics.peer_routes(p.host), p) for p in solved.peers]
        messages: list[tuple[str, Plan | PeerRoutes]] = [*full, *peers, *compact]
        return solved, PublishPlans(tuple(messages), why="solve")

    def published(
        self,
        solved: Solved,
        unusable: dict[str, frozenset[int]],
        *,
        now: float,
        messages: int,
        size: int,
        timings_ms: tuple[float, float, float],
    ) -> list[Effect]:
        """A solve's plans went out at ``now`` (``messages`` payloads of ``size`` bytes in
        all; ``timings_ms``: solve, encode, publish): counted, the hosts owing an ack noted,
        emitted as a ``plans`` change and logged as ``plans_published``."""
        solve_ms, encode_ms, publish_ms = timings_ms
        for h in solved.hosts:
            self.plans_published += 1
            self.plans_per_host[h] += 1
        out: list[Effect] = []
        if solved.hosts:
            self._awaiting = set(self.state.pending_acks(solved.hosts))
            self._awaited = (solved.epoch, len(self._awaiting), now)
            data = {
                "epoch": solved.epoch,
                "hosts": sorted(solved.hosts),
                "peer_routes": sorted(p.host for p in solved.peers),
                "messages": messages,
                "solve_ms": solve_ms,
            }
            out.append(Emit("plans", data))
        fields = {
            "epoch": solved.epoch,
            "changed": len(solved.hosts),
            "messages": messages,
            "peer_routes": len(solved.peers),
            "unchanged": solved.unchanged,
            "solve_ms": solve_ms,
            "encode_ms": encode_ms,
            "publish_ms": publish_ms,
            "bytes": size,
            "unusable": head(f"{h}:{sorted(r)}" for h, r in unusable.items()),
        }
        out.append(Log("info", "plans_published", fields))
        return out

    def route_around(self, now: float) -> tuple[list[Effect], float | None]:
        """Route around hosts whose agent's last will arrived and that are not back within
        ``offline.route_around_after_s`` (:meth:`FabricState.route_around`): each is logged
        (``host_routed_around``), emitted as a ``host`` change with ``routed_around`` and
        solved at once. More hosts lost at once than ``offline.max_fraction`` allows logs
        ``route_around_held`` once per episode and adds none. Returns the effects and when to
        check again (s; None: when a host status arrives)."""
        cfg = self.settings.offline
        limit = cfg.limit(len(self.fabric.hosts))
        r = self.state.route_around(now, after_s=cfg.route_around_after_s, limit=limit)
        out: list[Effect] = []
        for h in r.added:
            fields: dict[str, Any] = {
                "host": h,
                "after_s": cfg.route_around_after_s,
                "hint": "its agent's last will arrived and it is not back: peers get "
                "unreachable routes to its endpoints until it is online again",
            }
            out.append(Log("warning", "host_routed_around", fields))
            out.append(
                Emit("host", {"host": h, "online": False, "reason": "lost", "routed_around": True})
            )
        if r.added:
            out += self.changed(now, urgent=True)
        if r.held and not self._route_around_held:
            fields = {
                "lost": len(self.state.lost),
                "limit": limit,
                "hint": "more hosts lost at once than offline.max_fraction allows: more "
                "likely the broker or the management network than the hosts; none more "
                "is routed around",
            }
            out.append(Log("error", "route_around_held", fields))
        self._route_around_held = r.held
        return out, r.due_at

    def on_applied(self, ack: Ack, now: float) -> list[Effect]:
        """Count ``ack`` (taken at ``now``) against the hosts the last publish waits for; the
        last one logs ``plans_acked`` (epoch, hosts, ms from the publish to the last ack)."""
        waiting = self._awaiting
        if ack.host not in waiting or ack.result != AckResult.APPLIED:
            return []
        due = self.state.acked_epoch(ack.host)
        if due is not None and ack.epoch < due:
            return []
        waiting.discard(ack.host)
        if waiting:
            return []
        epoch, hosts, since = self._awaited
        ms = round((now - since) * 1000, 1)
        return [Log("info", "plans_acked", {"epoch": epoch, "hosts": hosts, "ms": ms})]


def head(items: Iterable[str], n: int = 50) -> list[str]:
    """The first ``n`` of ``items`` for a log line, then ``"... N more"``."""
    out = list(items)
    return out if len(out) <= n else [*out[:n], f"... {len(out) - n} more"]
