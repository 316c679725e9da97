"""Convergence: which online hosts have not acked their current epoch in time, when to send
them their plan and peer routes again, and which agents' plan requests to answer.

Consumes: the fabric state (:class:`~linkguard.topology.state.FabricState`: online hosts, the
epoch each owes an ack for, its last ack, what is on the bus), when each agent came online,
what the wiring published and when (:meth:`Convergence.sent`), acks, agents' plan requests
(:class:`~linkguard.models.PlanRequest`), and ticks, each with ``now`` (monotonic s). Produces:
the plan and peer routes messages to publish again
(:class:`~linkguard.topology.effects.PublishPlans`, ``why="resend"``), ``host_not_acking`` and
``plan_request_answered`` log lines, the time of the next re-send, and the hosts not acking
now (API, metrics, dashboard). Pure: no bus, no clock.

A host *owes* an ack from the later of the publish of its current plan (or, for a compact plan,
of the peer routes that raised the epoch it owes) and its agent's coming online. Past
``convergence.resend_after_s`` without an ack of that epoch (applied, refused or failed: any
answer of that epoch stops the re-sends; a refusal is the ``ack`` warning's business) it is
*not acking*: logged (``host_not_acking``: host, epoch, age_s, resends), counted, and its plan
(and, for a compact plan, every peer routes message newer than its last ack) is published
again (retained, same epochs: an agent that has them already re-acks). The next re-send
follows after twice the wait, doubling up to ``convergence.resend_max_s``. A host that goes
offline or is routed around owes nothing until it is back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from linkguard import topics
from linkguard.config import ConvergenceSettings
from linkguard.models import Ack, AckResult, PeerRoutes, Plan, PlanRequest
from linkguard.topology.effects import Effect, Log, PublishPlans
from linkguard.topology.state import FabricState

__all__ = ["Convergence", "NotAcking"]


@dataclass
class _Owed:
    epoch: int
    since: float  # monotonic s: the publish (or the host coming online)
    next_at: float  # monotonic s: the next re-send
    resends: int = 0


@dataclass(frozen=True)
class NotAcking:
    """An online host past its ack deadline: the epoch it owes, for how long (s) and how
    often its plan was re-sent."""

    host: str
    epoch: int
    age_s: float
    resends: int


class Convergence:
    """See the module. ``online_since``: per host, since when (monotonic s) its agent has been
    online (the core's, kept current by it)."""

    def __init__(
        self,
        settings: ConvergenceSettings,
        state: FabricState,
        online_since: Mapping[str, float],
    ) -> None:
        self.settings = settings
        self.state = state
        self.online_since = online_since
        #: hosts re-sent their plan (on a deadline or a request) since the service started
        self.resends = 0
        #: plan requests answered, and refused by the rate limit
        self.requests_answered = 0
        self._owed: dict[str, _Owed] = {}
        self._plan_sent: dict[str, float] = {}  # host -> when its plan last went out
        self._peers_sent = 0.0  # when peer routes last went out
        self._answered: dict[str, float] = {}  # host -> when its last request was answered

    # -- inputs -------------------------------------------------------------------------------

    def sent(self, sent_topics: Iterable[str], now: float) -> None:
        """The wiring published these plan and peer routes topics at ``now``."""
        for topic in sent_topics:
            parsed = topics.parse(topic)
            if parsed is None:
                continue
            if parsed.kind == "plan":
                self._plan_sent[parsed.host] = now
            elif parsed.kind == "peers":
                self._peers_sent = now

    def forget(self, host: str) -> None:
        """``host`` acked, went offline or is routed around: it owes nothing now."""
        self._owed.pop(host, None)

    def on_ack(self, ack: Ack) -> None:
        """An ack (any result) of the epoch its host owes ends what it owes; an applied one
        only when it also names every peer routes message it needs, when it names them
        (:meth:`~linkguard.topology.state.FabricState.ack_covers`)."""
        owed = self._owed.get(ack.host)
        if (
            owed is not None
            and ack.epoch >= owed.epoch
            and (ack.result != AckResult.APPLIED or self.state.ack_covers(ack.host, ack))
        ):
            del self._owed[ack.host]

    # -- decisions ----------------------------------------------------------------------------

    def _owes(self, host: str) -> int | None:
        """The epoch ``host`` owes an ack for (None: nothing, or its agent is not online)."""
        state = self.state
        if not state.online.get(host) or host in state.away:
            return None
        epoch = state.acked_epoch(host)
        if epoch is None:
            return None
        if state.ack_covers(host, state.acks.get(host)):
            return None
        return epoch

    def _since(self, host: str, now: float) -> float:
        """When ``host`` started owing: the later of its plan's (or the peer routes') publish
        and its agent coming online; ``now`` when neither is known (a previous instance's)."""
        pub = self.state.published.get(host)
        sent = self._plan_sent.get(host)
        if pub is not None and pub.shared is not None and self._peers_sent:
            sent = max(sent or 0.0, self._peers_sent)
        if sent is None:
            sent = now
        return max(sent, self.online_since.get(host, sent))

    def tick(self, now: float) -> tuple[list[Effect], float | None]:
        """Re-send to every online host past its deadline, in one :class:`PublishPlans` (each
        peer routes message once, however many hosts need it). Returns the effects and when
        the next re-send is due (monotonic s; None: nobody owes an ack)."""
        after, cap = self.settings.resend_after_s, self.settings.resend_max_s
        out: list[Effect] = []
        due: float | None = None
        owing = set()
        resend: list[str] = []
        for host in sorted(self.state.host_names):
            epoch = self._owes(host)
            if epoch is None:
                continue
            owing.add(host)
            owed = self._owed.get(host)
            if owed is None or owed.epoch != epoch:
                since = self._since(host, now)
                owed = self._owed[host] = _Owed(epoch, since, since + after)
            if now >= owed.next_at:
                owed.resends += 1
                owed.next_at = now + min(cap, after * 2**owed.resends)
                fields = {
                    "host": host,
                    "epoch": epoch,
                    "age_s": round(now - owed.since, 3),
                    "resends": owed.resends,
                    "next_resend_in_s": round(owed.next_at - now, 3),
                    "hint": "its agent is online but has not acked the plan it owes: plan "
                    "or ack lost on the bus (QoS 0), or an agent stuck applying; re-sent",
                }
                out.append(Log("warning", "host_not_acking", fields))
                resend.append(host)
            due = owed.next_at if due is None else min(due, owed.next_at)
        for host in set(self._owed) - owing:
            del self._owed[host]
        # one publish of each peer routes message for all the hosts due: every host gets
        # each one (peers/+), so one per host due sent each to every host again (n^2)
        return out + self._resend(resend, "resend"), due

    def on_request(self, req: PlanRequest, now: float) -> tuple[list[Effect], str | None]:
        """An agent's plan request at ``now``: its plan and peer routes again when the epoch
        it applied is below the one it owes, at most once per ``request_min_interval_s``.
        Returns the effects and the reason it was refused (None: taken, answered or not)."""
        host = req.host
        last = self._answered.get(host)
        if last is not None and now - last < self.settings.request_min_interval_s:
            return [], "plan_request_limited"
        owed = self.state.acked_epoch(host)
        if owed is None or (req.epoch is not None and req.epoch >= owed):
            return [], None  # no plan yet, or it has the current one
        self._answered[host] = now
        self.requests_answered += 1
        fields = {"host": host, "have": req.epoch, "owed": owed, "reason": req.reason}
        out: list[Effect] = [Log("info", "plan_request_answered", fields)]
        return out + self._resend([host], "request"), None

    def _resend(self, hosts: list[str], why: str) -> list[Effect]:
        """The plans of ``hosts`` and, for a compact plan, the peer routes newer than the
        host's last ack (every one of them, when it never acked) or than the ack names them
        (:func:`~linkguard.models.ack_covers`)."""
        state = self.state
        messages: list[tuple[str, Plan | PeerRoutes]] = []
        peers: dict[str, PeerRoutes] = {}
        for host in hosts:
            plan = state.published.get(host)
            if plan is None:
                continue
            self.resends += 1
            messages.append((topics.plan(host), plan))
            if plan.shared is not None:
                ack = state.acks.get(host)
                floor = ack.epoch if ack is not None else 0
                held = ack.peers if ack is not None and ack.peers is not None else {}
                peers.update(
                    (p.host, p)
                    for p in state.peers.values()
                    if p.epoch > floor
                    or ((p.classes or p.host in held) and held.get(p.host, 0) < p.epoch)
                )
        # the peer routes first, as a solve publishes them before the compact plans
        messages = [(topics.peer_routes(h), p) for h, p in sorted(peers.items())] + messages
        if not messages:
            return []
        return [PublishPlans(tuple(messages), why=why)]

    # -- views ----------------------------------------------------------------------------------

    def not_acking(self, now: float) -> list[NotAcking]:
        """Online hosts past their ack deadline at ``now``, in host order (as of the last
        :meth:`tick`, less those that acked since)."""
        after = self.settings.resend_after_s
        out = []
        for host, owed in sorted(self._owed.items()):
            if now - owed.since >= after and self._owes(host) == owed.epoch:
                out.append(NotAcking(host, owed.epoch, round(now - owed.since, 3), owed.resends))
        return out
