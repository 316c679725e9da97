"""The agent's decisions, pure: what to do about a port event, a plan, peer routes.

Consumes: the monitor's outputs (:class:`~linkguard.agent.monitor.MonitorOutput`), this
host's status messages (duplicate agents, :mod:`linkguard.presence`), decoded and verified
plan and peer routes messages (:mod:`linkguard.models`), the applied plan and the
ack of each apply it asked for, each with ``now`` (wall-clock s, Unix). Produces: lists of
typed effects (:mod:`linkguard.agent.effects`), executed in order by the wiring
(:mod:`linkguard.agent.daemon`); counters in :attr:`AgentCore.stats`; log lines.

The two rules that live here and nowhere else:

- **Fast path.** A port that goes DOWN from UP, UNKNOWN or DEGRADED (the service may not have
  drained a degraded one yet) gets its plan's precomputed backup overlaid at once
  (:class:`~linkguard.agent.effects.FastPath`; UP -> DEGRADED is no emergency: the service
  re-plans). A port that comes UP is only marked usable; its traffic returns with the next
  plan. The fast path (its ack and the rail change it makes for jobs) and the states'
  publishes come first in a batch; the neighbour flush, events, metrics, flap history, rail
  change, counter health and NCCL files follow.
- **Plan acceptance.** A plan (or an expansion of a compact plan with the peer routes) is
  applied only when it is of no lower leader term than the highest seen, newer than the plan
  in hand and the applied one, for this host and inside linkguard's scope
  (:func:`~linkguard.agent.plans.check_plan`); a refusal carries a
  :class:`~linkguard.agent.plans.Refusal`. Stale and deposed-leader ones are counted and
  logged, never acked; the others are acked ``refused`` with ``"<reason>: <detail>"``.

No bus, asyncio, clock or disk: everything comes in as an argument.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import structlog

from linkguard.agent.behind import BehindWatch
from linkguard.agent.effects import (
    ApplyPlan,
    CheckBehind,
    Effect,
    FastPath,
    FlushNeighbours,
    MarkPortUp,
    ObserveAck,
    ObserveEvents,
    PersistHealth,
    PersistHistory,
    PersistJournal,
    PersistPeerRoutes,
    PersistPlan,
    PersistTerm,
    PublishEvent,
    PublishState,
    RailChange,
    Reannounce,
    RenderNccl,
    RequestPlan,
    ResendAck,
    ScheduleTimer,
    SendAck,
    Yield,
)
from linkguard.agent.journal import EventJournal
from linkguard.agent.monitor import MonitorOutput
from linkguard.agent.plans import PlanRefused, Refusal, check_plan
from linkguard.models import (
    Ack,
    AckResult,
    EventsConfirmed,
    HostStatus,
    PeerRoutes,
    Plan,
    PortStatus,
    ServiceStatus,
    encode,
    expand_plan,
)
from linkguard.presence import Me, Verdict, judge

__all__ = ["FAST_PATH_FROM", "AgentCore", "AgentStats"]

log = structlog.get_logger(__name__)

#: the statuses a port may go DOWN from for the fast path to move its traffic
FAST_PATH_FROM = frozenset({PortStatus.UP, PortStatus.UNKNOWN, PortStatus.DEGRADED})


@dataclass
class AgentStats:
    """Counters an operator (and the tests) can read."""

    plans_applied: int = 0
    plans_refused: Counter[str] = field(default_factory=Counter)
    messages_dropped: Counter[str] = field(default_factory=Counter)
    fast_paths: int = 0
    states_published: int = 0
    #: port events held in the journal unconfirmed; dropped past its bound since the start
    journal_held: int = 0
    journal_dropped: int = 0
    #: port events sent again because they stayed unconfirmed (journal_resend_after_s)
    journal_resent: int = 0


class AgentCore:
    """The decisions of one host's agent (module docstring). Not thread-safe: one caller."""

    def __init__(
        self,
        *,
        host: str,
        netdevs: Collection[str],
        prefixes: Collection[ipaddress.IPv4Network],
        signed_deletions_only: bool = False,
        term_path: str = "term",
        journal_resend_s: tuple[float, float] = (5.0, 60.0),
    ) -> None:
        """``netdevs``: this host's rail netdevs; ``prefixes``: the configured endpoint
        prefixes (empty: any destination); ``signed_deletions_only``: the agent verifies
        signatures and requires them, so an (unsigned) deletion of peer routes is ignored;
        ``term_path``: the term file, named in the deposed-leader hint;
        ``journal_resend_s``: (first wait, longest wait) before an unconfirmed event goes
        again (s)."""
        self.host = host
        self.netdevs = set(netdevs)
        self.prefixes = list(prefixes)
        self.signed_deletions_only = signed_deletions_only
        self.term_path = term_path
        self.journal_resend_s = journal_resend_s
        self.stats = AgentStats()
        #: the highest leader term seen on a plan or peer routes message taken in hand
        self.term = 0
        #: the last plan off the bus (compact or full)
        self.plan_received: Plan | None = None
        #: retained peer routes, by peer
        self.peers: dict[str, PeerRoutes] = {}
        #: the port event journal (None: events are not numbered; the wiring sets it)
        self.journal: EventJournal | None = None
        #: (instance, started_at) of the last online service seen on ``service/status``
        self.service_seen: tuple[str | None, float | None] | None = None
        #: evidence that the plan in hand is old (linkguard.agent.behind)
        self.behind = BehindWatch()
        self._cleared_logged = False  # plan_cleared said since the last plan

    # -- start ---------------------------------------------------------------------------
    def restore(self, *, received: Plan | None, peers: Mapping[str, PeerRoutes]) -> None:
        """The compact (or full) plan and the peer routes a restart found in the state dir:
        retained copies of these change nothing, and older ones are stale against them."""
        self.plan_received = received
        self.peers = dict(peers)

    def restore_term(self, saved: int) -> None:
        """The term file's value (0: none); the restored messages' terms count too."""
        taken = [self.plan_received, *self.peers.values()]
        self.term = max([saved, *(m.term for m in taken if m is not None)])

    # -- port events ---------------------------------------------------------------------
    def observe(self, out: MonitorOutput) -> list[Effect]:
        """Effects of one monitor output. Order: the fast path of each port that went down
        (its ack and the local rail change follow it at once:
        :meth:`fast_path_applied`), the states, the fast paths' neighbour flush (in the
        background), the events, then what may wait: the flap metrics, the flap history and
        rail change (when any event), counter health, NCCL files (when any state or event),
        the next timer."""
        effects: list[Effect] = []
        fast_path = False
        for ev in out.events:
            key = f"{ev.hca}/{ev.port}"
            if ev.current == PortStatus.DOWN and ev.previous in FAST_PATH_FROM:
                fast_path = True
                effects.append(FastPath(key))
            elif ev.current == PortStatus.UP:
                effects.append(MarkPortUp(key))
        effects.extend(PublishState(st) for st in out.states)
        if fast_path:
            effects.append(FlushNeighbours(background=True))
        sent = list(out.events) if self.journal is None else self.journal.record(out.events)
        effects.extend(PublishEvent(ev) for ev in sent)
        if self.journal is not None and out.events:
            self._journal_stats()
            effects.append(PersistJournal())
        effects.append(ObserveEvents(tuple(out.events)))
        if out.events:
            effects += [PersistHistory(), RailChange("port_event")]
        effects.append(PersistHealth())  # written only when a verdict changed
        if out.events or out.states:
            effects.append(RenderNccl())
        effects.append(ScheduleTimer(out.next_deadline))
        return effects

    def named(self, ack: Ack) -> Ack:
        """``ack`` as it goes out: an applied one, with a compact plan in hand, names the
        epoch of each peer's routes the agent holds (``Ack.peers``): a solve publishes the
        plan and its peer routes with one epoch, so the epoch alone cannot tell the service
        that one of them was lost (:func:`~linkguard.models.ack_covers`)."""
        plan = self.plan_received
        if ack.result != AckResult.APPLIED or plan is None or plan.shared is None:
            return ack
        # only peers with routes: the service checks no other (ack_covers), and an ack is
        # retained per host: after a leaf failure many peers' emptied messages would ride
        # on every host's ack for nothing
        held = {h: p.epoch for h, p in self.peers.items() if p.classes}
        return ack.model_copy(update={"peers": held})

    def fast_path_applied(self, port: str, ack: Ack | None) -> list[Effect]:
        """The ack of a :class:`FastPath` (None: no plan, or no backup for ``port``)."""
        if ack is None:
            return []
        self.stats.fast_paths += 1
        log.info(
            "fast_path_applied", port=port, epoch=ack.epoch, apply_ms=round(ack.apply_ms or 0, 2)
        )
        return [SendAck(ack), RailChange("fast_path"), ObserveAck(ack)]

    # -- the event journal -------------------------------------------------------------
    def use_journal(self, journal: EventJournal) -> None:
        """Number and journal port events from now on (the wiring's, with the saved one)."""
        self.journal = journal
        self._journal_stats()

    def replay_events(self) -> list[Effect]:
        """Every journaled event the service has not confirmed, again (after a reconnect, a
        service restart, each refresh)."""
        if self.journal is None:
            return []
        return [PublishEvent(ev, replay=True) for ev in self.journal.pending()]

    def due(self, now: float) -> tuple[list[Effect], float | None]:
        """What is due at ``now`` (monotonic s): the journaled events unconfirmed past their
        wait, again (:meth:`~linkguard.agent.journal.EventJournal.resend_due`), and a plan
        request when the plan in hand is still older than a version seen elsewhere
        (:mod:`linkguard.agent.behind`); and when to call again (None: nothing pending)."""
        effects: list[Effect] = []
        due: float | None = None
        held = self.plan_received
        source, evidence = self.behind.source, self.behind.evidence
        epoch, behind_at, ask = self.behind.due(now, held=held)
        if ask:
            log.info("plan_behind", have=epoch, seen=evidence, source=source, action="asking")
            effects.append(RequestPlan(epoch, "behind"))
        if self.journal is not None:
            after, most = self.journal_resend_s
            events, due = self.journal.resend_due(now, after_s=after, max_s=most)
            if events:
                self.stats.journal_resent = self.journal.resent
                seqs = [e.seq for e in events][:20]
                log.info("port_events_resent", count=len(events), seqs=seqs)
            effects += [PublishEvent(ev, replay=True) for ev in events]
        if behind_at is not None:
            due = behind_at if due is None else min(due, behind_at)
        return effects, due

    def on_events_confirmed(self, msg: EventsConfirmed) -> list[Effect]:
        """``confirmed/<host>``: forget what the service recorded. Not saved at once (one
        disk write per event is enough): the file catches up with the next event, and what
        a restarted agent replays in between the service de-duplicates."""
        if self.journal is not None and self.journal.confirm(msg):
            self._journal_stats()
        return []

    def _journal_stats(self) -> None:
        if self.journal is not None:
            self.stats.journal_held = len(self.journal.held)
            self.stats.journal_dropped = self.journal.dropped

    def on_service_status(self, seen: ServiceStatus, *, retained: bool) -> list[Effect]:
        """``service/status``: the unconfirmed events go again to a service that announces
        itself live (it just connected: after a broker outage it may have come back after
        this agent's own replay) or, retained, with another ``instance`` / ``started_at``
        than the last one seen online (a restart, a failover). The first retained one seen
        only names the service: this agent's own announce replays."""
        if not seen.online:
            return []
        wake: list[Effect] = []
        if seen.role == "leader" and seen.term is not None:  # a new leader's plans are due
            held = self.plan_received
            if held is not None and self.behind.note(seen.term, 0, "service_status", held=held):
                wake.append(CheckBehind())
        ident, before = (seen.instance, seen.started_at), self.service_seen
        self.service_seen = ident
        if retained and before in (None, ident):
            return wake
        return wake + self.replay_events()

    # -- presence ------------------------------------------------------------------------
    def on_status(self, seen: HostStatus, *, me: Me, retained: bool) -> list[Effect]:
        """A status on this host's own topic (``seen``; :func:`~linkguard.presence.judge`
        against ``me``): another agent with this host name that started first makes this
        one yield; one that started later is told so by re-announcing this one."""
        verdict = judge(me, seen, retained=retained)
        if verdict == Verdict.IGNORE:
            return []
        if verdict in (Verdict.YIELD, Verdict.HOLD):
            log.error(
                "duplicate_host",
                host=self.host,
                other_instance=seen.instance,
                action="stopping: the other agent started first"
                if verdict == Verdict.YIELD
                else "keeping this host: started first; the other must stop",
            )
        if verdict == Verdict.YIELD:
            return [Yield(seen)]
        return [Reannounce()]

    # -- plans ---------------------------------------------------------------------------
    def drop(self, topic: str, reason: str, detail: str, size: int) -> None:
        """Count and log a message that is not taken (``message_dropped``)."""
        self.stats.messages_dropped[reason] += 1
        log.warning("message_dropped", topic=topic, reason=reason, detail=detail[:300], bytes=size)

    def plan_seen(self) -> None:
        """A payload on the plan topic (before it is decoded): ``plan_cleared`` may be said
        again."""
        self._cleared_logged = False

    def plan_cleared(self, *, applied_epoch: int | None) -> list[Effect]:
        """A zero-length payload on the plan topic: MQTT's deletion of the retained plan (the
        service clears plans of hosts its fabric does not list). No plan, not a bad message:
        the routes applied so far stay. Logged once until a plan arrives again."""
        if not self._cleared_logged:
            self._cleared_logged = True
            log.warning(
                "plan_cleared",
                host=self.host,
                applied_epoch=applied_epoch,
                action="keeping the current routes",
                hint="is this host name in the service's fabric?",
            )
        return []

    def on_plan(
        self, plan: Plan, *, raw: bytes, topic: str, applied: Plan | None, now: float
    ) -> list[Effect]:
        """A decoded (and verified) plan for this host, ``raw`` its payload as received."""
        self.plan_seen()
        effects: list[Effect] = []
        if self._deposed(topic, plan.term, plan.epoch, effects):
            return effects
        # older than the plan in hand (a replay, or a late retained copy): never taken in hand.
        # (term, epoch): a new leader's epochs count above any of a lower term
        got = self.plan_received
        if got is not None and (plan.term, plan.epoch) < (got.term, got.epoch):
            if plan.shared is not None:
                self._stale(topic, plan.epoch, got.epoch)
            else:  # refused as check_plan refuses it
                self.stats.plans_refused[Refusal.STALE_EPOCH.value] += 1
                log.warning(
                    "plan_refused",
                    epoch=plan.epoch,
                    reason=Refusal.STALE_EPOCH,
                    detail=f"epoch {plan.epoch} < received {got.epoch}",
                )
            return effects
        if plan.shared is not None:
            changed = plan != self.plan_received
            self.plan_received = plan
            # persisted (as received: what a restart expands) once it applies
            taken = self._apply_expanded(self.peers, applied, now, effects)
            if taken and changed:
                effects.append(PersistPlan(raw))
            if not any(isinstance(e, ApplyPlan) for e in effects) and applied is not None:
                effects.append(ResendAck(plan.epoch))  # in place already: the ack again
            return effects
        self.plan_received = plan
        if got is not None and got.shared is not None:
            # in place: an expansion of an older compact plan, whose epoch is its newest peer
            # routes' (expand_plan) and may be above this plan's (the solve that made this
            # host's plan full was missed, later peer routes were not): this plan replaces it
            self._apply(plan, applied, now, effects, raw=raw, floor=got)
            return effects
        if applied is not None and (plan.term, plan.epoch) == (applied.term, applied.epoch):
            if plan.same_assignments(applied):
                log.debug("plan_already_applied", epoch=plan.epoch)
                return [*effects, ResendAck(plan.epoch)]  # the service may miss the ack
            # the same epoch, other content: an expansion of the compact plan this one
            # replaces was applied with it (retained copies arrive in any order): apply
            self._apply(plan, applied, now, effects, same_epoch=True, raw=raw)
            return effects
        self._apply(plan, applied, now, effects, raw=raw)
        return effects

    def on_peer_routes(
        self,
        peer: str,
        pr: PeerRoutes | None,
        *,
        raw: bytes,
        topic: str,
        applied: Plan | None,
        now: float,
    ) -> list[Effect]:
        """``peers/<peer>``, decoded and verified (``pr``; None: a zero-length payload, the
        service deleted a stale one): keep the newest, re-apply a compact plan with it. A
        deletion empties the peer's routes (its epoch stays counted)."""
        effects: list[Effect] = []
        if pr is None:
            if self.signed_deletions_only:
                # a deletion cannot be signed: routes change only with a signed message (the
                # service publishes empty signed peer routes before it deletes them)
                log.info("peer_routes_deletion_ignored", topic=topic, reason="unsigned")
                return effects
            old = self.peers.get(peer)
            if old is not None and old.classes:  # keep its epoch: the acked one stays the same
                emptied = old.model_copy(update={"classes": [], "modulus": 1})
                self.peers[peer] = emptied
                effects.append(PersistPeerRoutes(peer, encode(emptied)))
                self._apply_expanded(self.peers, applied, now, effects)
            return effects
        if self._deposed(topic, pr.term, pr.epoch, effects):
            return effects
        old = self.peers.get(peer)
        if old is not None and (old.term, old.epoch) >= (pr.term, pr.epoch):
            self._stale(topic, pr.epoch, old.epoch)
            return effects
        outside = [e for e in pr.endpoints if not self._in_scope(e)]
        if outside:
            detail = f"endpoints {outside[:4]} outside the configured endpoint prefixes"
            self.drop(topic, Refusal.OUT_OF_SCOPE.value, detail, len(raw))
            return effects
        held = self.plan_received  # a newer version than the plan in hand's?
        if (
            held is None
            or held.shared is None
            or (pr.host == self.host and pr.classes)
            or pr.term > held.term
        ) and self.behind.note(pr.term, pr.epoch, "peer_routes", held=held):
            effects.append(CheckBehind())
        # kept (and persisted) only once it is known to apply: a refused one changes nothing,
        # and the ones that follow it are judged against what was kept
        candidate = {**self.peers, peer: pr}
        if self._apply_expanded(candidate, applied, now, effects):
            self.peers = candidate
            effects.append(PersistPeerRoutes(peer, raw))  # as received
        return effects

    def plan_applied(self, ack: Ack) -> list[Effect]:
        """The ack of an :class:`ApplyPlan` (applied, or failed in the kernel): tell the
        service first, then the NCCL files, what jobs see and the neighbour flush."""
        self.stats.plans_applied += 1
        return [SendAck(ack), ObserveAck(ack), RenderNccl(), RailChange("plan"), FlushNeighbours()]

    # -- acceptance ----------------------------------------------------------------------
    def _deposed(self, topic: str, term: int, epoch: int, effects: list[Effect]) -> bool:
        """True (counted in ``plans_refused["deposed_leader"]``, logged, never applied nor
        acked) when ``term`` is below the highest seen: a deposed leader's message. Else a
        higher ``term`` becomes the highest seen (:class:`PersistTerm` into ``effects``)."""
        if term < self.term:
            self.stats.plans_refused[Refusal.DEPOSED_LEADER.value] += 1
            log.warning(
                "plan_refused",
                topic=topic,
                epoch=epoch,
                reason=Refusal.DEPOSED_LEADER,
                detail=f"term {term} < {self.term} seen: a deposed topology service's (if this "
                "service is meant to lead, e.g. election switched off or etcd's data reset, "
                f"remove {self.term_path} on the hosts)",
            )
            return True
        if term > self.term:
            log.info("leader_term_seen", term=term, previous=self.term, topic=topic)
            self.term = term
            effects.append(PersistTerm(term))
        return False

    def _stale(self, topic: str, epoch: int, have: int) -> None:
        """A message no newer than the one in hand: a redelivery of the same epoch is normal
        (every reconnect); an older one is counted and logged."""
        if epoch == have:
            log.debug("message_redelivered", topic=topic, epoch=epoch)
            return
        self.stats.messages_dropped[Refusal.STALE_EPOCH.value] += 1
        log.info("message_dropped", topic=topic, reason=Refusal.STALE_EPOCH, epoch=epoch, have=have)

    def _in_scope(self, endpoint: str) -> bool:
        prefixes = self.prefixes
        return not prefixes or any(ipaddress.IPv4Address(endpoint) in p for p in prefixes)

    def _apply_expanded(
        self,
        peers: Mapping[str, PeerRoutes],
        applied: Plan | None,
        now: float,
        effects: list[Effect],
    ) -> bool:
        """Apply the compact plan in hand expanded with ``peers``, unless that is what is
        applied already. An older expansion than the applied plan is left alone (a restart:
        the retained plan arrives before the peer routes that the last applied plan had);
        one of the same epoch that differs is applied (retained peer routes arrive in any
        order). False when the expansion was refused."""
        plan = self.plan_received
        if plan is None or plan.shared is None:
            return True
        try:
            full = expand_plan(plan, dict(peers))
        except ValueError as exc:
            self._refuse(plan, PlanRefused(Refusal.INVALID, str(exc)), now, effects)
            return False
        if applied is not None:
            mine, theirs = (full.term, full.epoch), (applied.term, applied.epoch)
            if mine < theirs or (mine == theirs and full.same_assignments(applied)):
                return True
        return self._apply(full, applied, now, effects, same_epoch=True, persist=False)

    def _apply(
        self,
        plan: Plan,
        applied: Plan | None,
        now: float,
        effects: list[Effect],
        *,
        same_epoch: bool = False,
        persist: bool = True,
        raw: bytes | None = None,
        floor: Plan | None = None,
    ) -> bool:
        """:class:`ApplyPlan` into ``effects`` when ``plan`` passes
        :func:`~linkguard.agent.plans.check_plan` against ``applied`` (``same_epoch``: the
        applied epoch itself is not stale); False when refused. ``raw``: the payload
        ``plan`` came in, persisted as received (instead of the plan's own JSON, which could
        not carry the signature); ``persist`` False: neither (the caller keeps a compact plan
        and its peer routes). ``floor``: stale means not above this plan's (term, epoch)
        instead of the applied one's."""
        newest = floor if floor is not None else applied
        epoch = newest.epoch if newest is not None else None
        try:
            check_plan(
                plan,
                host=self.host,
                applied_epoch=epoch - 1 if same_epoch and epoch is not None else epoch,
                netdevs=self.netdevs,
                prefixes=self.prefixes,
                checked=applied,
                applied_term=newest.term if newest is not None else 0,
            )
        except PlanRefused as exc:
            self._refuse(plan, exc, now, effects)
            return False
        effects.append(
            ApplyPlan(
                plan,
                same_epoch=same_epoch,
                persist_json=persist and raw is None,
                raw=raw if persist else None,
            )
        )
        return True

    def _refuse(self, plan: Plan, exc: PlanRefused, now: float, effects: list[Effect]) -> None:
        """Count and log a refused plan; ack it ``refused`` unless the refusal is one the
        service is not told of (:attr:`Refusal.acked`)."""
        self.stats.plans_refused[exc.reason.value] += 1
        log.warning("plan_refused", epoch=plan.epoch, reason=exc.reason, detail=exc.detail)
        if exc.reason.acked:
            effects.append(
                SendAck(
                    Ack(
                        host=self.host,
                        epoch=plan.epoch,
                        result=AckResult.REFUSED,
                        error=str(exc)[:2000],
                        applied_at=now,
                    )
                )
            )
