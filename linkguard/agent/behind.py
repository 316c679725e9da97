"""Whether this agent is behind the service, pure: when to ask for its plan again.

An agent whose plan was lost in transit (a QoS 0 hop, a dropped PUBLISH) learns it is behind
when another message references a newer version than the plan it holds:

- ``peers/<peer>`` (:class:`~linkguard.models.PeerRoutes`) of a newer ``(term, epoch)`` while
  the plan in hand is a full plan (no ``shared``): the solve that published it changed the
  routes a full plan carries towards that peer, so a newer plan for this host is due. (With a
  compact plan the agent takes the peer routes in itself.)
- its own ``peers/<host>`` with routes while the plan in hand is compact: the service counts
  this host impaired, and an impaired host gets a full plan (:mod:`linkguard.topology.solver`).
- a leader (``service/status``, ``role: leader``) of a higher term than the plan in hand's: a
  new leader publishes every plan at its own term.

The service publishes a solve's peer routes before its plans, so the evidence comes first and
the plan a moment later: the agent asks only when the plan in hand is still older
:data:`GRACE_S` after the evidence, and at most once per :data:`MIN_INTERVAL_S`. It asks
(``hosts/<host>/plan-request``, reason ``behind``) with the epoch of the plan in hand, which
is below the one the service owes it an ack for (the expansion of a compact plan with newer
peer routes carries the peer routes' epoch: that one would hide the lost plan). The service
re-sends when that epoch is below the one owed (:mod:`linkguard.topology.convergence`).

Consumes: versions seen (term, epoch) with ``now`` (monotonic s), the plan in hand. Produces:
the epoch to ask with, or nothing; when to look again. No clock, bus or asyncio.
"""

from __future__ import annotations

from linkguard.models import Plan

__all__ = ["GRACE_S", "MIN_INTERVAL_S", "BehindWatch"]

#: how long (s) evidence of a newer version must stand before the agent asks: a solve's plans
#: follow its peer routes within milliseconds (one publish batch); 1 s also covers a broker
#: delivering the two on different subscriptions a little apart
GRACE_S = 1.0
#: the agent asks at most once per this long (s); the service's own limit per host is
#: ``convergence.request_min_interval_s`` (default 2 s)
MIN_INTERVAL_S = 2.0


def _version(plan: Plan | None) -> tuple[int, int]:
    return (plan.term, plan.epoch) if plan is not None else (0, 0)


class BehindWatch:
    """Evidence that the plan in hand is old, and when to ask (module docstring)."""

    def __init__(self, *, grace_s: float = GRACE_S, min_interval_s: float = MIN_INTERVAL_S):
        self.grace_s = grace_s
        self.min_interval_s = min_interval_s
        #: the newest (term, epoch) seen above the plan in hand, and what showed it
        self.evidence: tuple[int, int] | None = None
        self.source: str | None = None
        self._check_at: float | None = None  # monotonic s
        self._asked_at: float | None = None  # monotonic s
        #: plan requests decided since the start
        self.asked = 0

    def note(self, term: int, epoch: int, source: str, *, held: Plan | None) -> bool:
        """A message (``source``: its kind) referencing ``(term, epoch)``; ``held``: the plan
        in hand. True when it is evidence (newer than ``held``): the caller looks again with
        :meth:`due` (a timer)."""
        if (term, epoch) <= _version(held):
            return False
        if self.evidence is None or (term, epoch) > self.evidence:
            self.evidence, self.source = (term, epoch), source
        return True

    def due(self, now: float, *, held: Plan | None) -> tuple[int | None, float | None, bool]:
        """At ``now`` (monotonic s): ``(epoch, next_at, ask)``; ``ask`` True: ask for the plan
        with ``epoch`` (the plan in hand's; None: none) now; ``next_at``: when to look again
        (None: no evidence pending)."""
        epoch = held.epoch if held is not None else None
        if self.evidence is None or self.evidence <= _version(held):
            self.evidence = self.source = None  # the plan came
            self._check_at = None
            return epoch, None, False
        if self._check_at is None:
            self._check_at = now + self.grace_s
        at = self._check_at
        if self._asked_at is not None:
            at = max(at, self._asked_at + self.min_interval_s)
        if now < at:
            return epoch, at, False
        self._asked_at = now
        self.asked += 1
        self.evidence = self.source = None  # one request per evidence: re-sends do the rest
        self._check_at = None
        return epoch, None, True
