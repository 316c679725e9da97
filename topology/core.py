"""The topology service's pure core: what a bus message, a solve or a tick changes, and what the
service must do about it.

Consumes: decoded bus messages (``topic``, ``payload``, ``retain``: port states, port events
(through the journals' :class:`~linkguard.topology.journaldesk.JournalDesk`),
host statuses, acks, inventories, probe reports, retained plans and peer routes, service
status and the retained ``service/health``), timer ticks (a solve due, a route-around check,
a put-back due, a probe window) and solve results, each with ``now`` (monotonic s; the wall
clock, where a message carries Unix time, is passed in as ``wall``). Produces: typed effects
(:mod:`linkguard.topology.effects`): plans and peer routes to publish, retained messages to
delete, this service's own plan to put back, changes for the ledger and the API, the time a
solve is due, log lines. It keeps the fabric state (:class:`FabricState`), the RFC 8405 solve
back-off (:class:`SolveBackoff`), the retained-message integrity rules
(:class:`~linkguard.topology.integrity.Integrity`), the probe decisions
(:class:`~linkguard.topology.probedesk.ProbeDesk`) and whether each host's agent takes its
plans (:class:`~linkguard.topology.posture.PostureDesk`). No bus, no asyncio, no clock, no disk: the
wiring module (:mod:`linkguard.topology.service`) executes the effects, and a simulator can
drive the same object with a simulated clock.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

from linkguard import topics
from linkguard.config import ServiceSettings
from linkguard.models import (
    Ack,
    AckResult,
    BadMessage,
    FabricFaults,
    HostInventory,
    HostStatus,
    PeerRoutes,
    Plan,
    PlanRequest,
    PortEvent,
    PortState,
    PortStatus,
    ProbeReport,
    ServiceStatus,
    decode,
)
from linkguard.presence import Me, Verdict, judge
from linkguard.signing import Verifier
from linkguard.topology.audit import inventory_problems
from linkguard.topology.convergence import Convergence
from linkguard.topology.effects import (
    AnnounceOnline,
    ClearRetained,
    ClearStalePlans,
    Effect,
    Emit,
    KickAudit,
    KickRouteAround,
    Log,
    PublishPlans,
    Reissue,
    RetainedKind,
    StopDuplicate,
)
from linkguard.topology.fabric import Fabric
from linkguard.topology.faultsdesk import FaultsDesk
from linkguard.topology.hostbudget import HostBudget
from linkguard.topology.integrity import Integrity, Refused
from linkguard.topology.journaldesk import JournalDesk
from linkguard.topology.posture import PostureDesk
from linkguard.topology.probedesk import ProbeDesk
from linkguard.topology.schedule import SolveSchedule
from linkguard.topology.staleretained import STALE_HOST_TOPICS_MAX, StaleRetained
from linkguard.topology.state import FabricState

__all__ = ["DECODERS", "STALE_HOST_TOPICS_MAX", "ServiceCore"]

#: retained topics of hosts that left the fabric noted at once for deletion (more: at the next
#: connect, when the broker sends the rest again); a host has ~20 (status, inventory, ack, a
#: state per port), so this covers thousands of departed hosts

#: the model of every message kind the service reads, by topic kind (:func:`topics.parse`)
DECODERS: dict[str, type[BaseModel]] = {
    "port": PortState,
    "status": HostStatus,
    "ack": Ack,
    "plan": Plan,
    "peers": PeerRoutes,
    "inventory": HostInventory,
    "service_status": ServiceStatus,
    "fabric_faults": FabricFaults,
    "events": PortEvent,
    "probes": ProbeReport,
    "plan_request": PlanRequest,
}


class ServiceCore(StaleRetained):
    """See the module. ``verifier``: the service's own key's (None: plans go out unsigned);
    ``me``: this instance (for duplicate detection); ``elected``: a leader election is
    configured (the lease, not ``service/status``, decides who steers); ``epoch_start``: the
    first plan epoch (ms since the Unix epoch at start, so a restarted service issues above
    its predecessor)."""

    def __init__(
        self,
        settings: ServiceSettings,
        fabric: Fabric,
        *,
        verifier: Verifier | None,
        me: Me,
        elected: bool,
        epoch_start: int,
    ) -> None:
        self.settings = settings
        self.fabric = fabric
        self.me = me
        self.elected = elected
        self.state = FabricState(fabric=fabric, epoch_start=epoch_start)
        #: refused messages by reason
        self.dropped: Counter[str] = Counter()
        #: what each host may cost (messages, bytes, retained topics), checked before decoding
        self.budget = HostBudget(settings.host_budget)
        self.integrity = Integrity(verifier)
        #: whether each host's agent takes this service's plans (its signing posture)
        self.posture = PostureDesk(verifier.key_id if verifier is not None else None)
        #: when to solve, what a publish owes, whom to route around
        self.schedule = SolveSchedule(settings, fabric, self.state)
        #: the switch-level faults in effect (``fabric/faults``)
        self.switch_faults = FaultsDesk(
            self.state, max_bytes=settings.bus.max_message_bytes, changed=self.changed
        )
        #: per host, since when (s) its agent has been online: a probe target's responder
        #: runs in its agent (see :meth:`ProbeDesk.on_report`)
        self.online_since: dict[str, float] = {}
        self.probes = ProbeDesk(
            settings.probes,
            fabric,
            self.state,
            online_since=self.online_since,
            dropped=self.dropped,
            changed=lambda now, urgent: self.changed(now, urgent=urgent),
        )
        #: online hosts that do not ack their current epoch: when to re-send, plan requests
        self.convergence = Convergence(settings.convergence, self.state, self.online_since)
        self.inventories: dict[str, HostInventory] = {}
        #: hosts the fabric does not list whose agent says it is online (``unknown_host``)
        self.strangers: set[str] = set()
        #: retained topics (status, inventory, ports, ack, probes) of hosts the fabric does not
        #: list: deleted with the stale plans (:class:`ClearStalePlans`) unless the host's
        #: agent says it is online (a stranger); at most :data:`STALE_HOST_TOPICS_MAX`
        self.stale_host_topics: dict[str, set[str]] = {}
        self._stale_host_noted = 0
        #: retained plans of hosts the fabric does not list: host -> epoch (None: unreadable),
        #: until the wiring deletes them (:class:`ClearStalePlans`)
        self.stale_plans: dict[str, int | None] = {}
        #: the same for retained peer routes (``peers/<host>``)
        self.stale_peers: dict[str, int | None] = {}
        #: those of :attr:`stale_peers` signed by this service's key: emptied (signed) before
        #: they are deleted, since agents that verify cannot take an unsigned deletion
        self.stale_peer_routes: dict[str, PeerRoutes] = {}
        #: per port key, what the last ``port`` change showed (see :func:`_shown`)
        self._shown: dict[tuple[str, str, int], tuple[object, ...]] = {}
        #: the startup settle is over (this service leads and solved, or is about to)
        self.settled = False
        #: another instance that started first (this one stops)
        self.duplicate: ServiceStatus | None = None
        #: the faults of the retained ``service/health`` found on connecting (a previous
        #: instance's)
        self.inherited_faults: FabricFaults | None = None
        self._warned: set[tuple[str, ...]] = set()
        #: the agents' event journals: new events, duplicates, gaps, confirmations
        self.journal = JournalDesk()

    # -- helpers -------------------------------------------------------------------------

    def drop(self, topic: str, size: int, reason: str, detail: str) -> list[Effect]:
        """Count a refused message of ``size`` bytes on ``topic`` under ``reason`` and log it
        (``message_dropped``, with the first 300 characters of ``detail``)."""
        self.dropped[reason] += 1
        fields = {"topic": topic, "reason": reason, "detail": detail[:300], "bytes": size}
        return [Log("warning", "message_dropped", fields)]

    def _warn_once(self, event: str, *key: str, **kw: object) -> list[Effect]:
        if (event, *key) in self._warned:
            return []
        self._warned.add((event, *key))
        return [Log("warning", event, dict(kw))]

    def changed(self, now: float, *, urgent: bool = True) -> list[Effect]:
        """A change that needs a solve (:meth:`SolveSchedule.changed`)."""
        return self.schedule.changed(now, urgent=urgent)

    # -- bus messages --------------------------------------------------------------------

    def on_message(
        self, topic: str, payload: bytes, retain: bool, now: float, *, leading: bool
    ) -> list[Effect]:
        """One message from the bus at ``now``. ``leading``: this service holds the lease
        (always, without election); a standby takes the leader's live plans as what is on the
        bus. ``fabric/faults`` is the wiring's (its assessment runs off the event loop)."""
        parsed = topics.parse(topic)
        if parsed is not None and parsed.kind == "service_health":
            self.on_retained_health(payload, retain)
            return []
        if parsed is None or parsed.kind not in DECODERS or parsed.kind == "fabric_faults":
            return []
        if parsed.kind == "probes" and (
            not self.settings.probes.enabled or parsed.host not in self.state.host_names
        ):
            if retain and payload and parsed.host not in self.state.host_names:
                self._note_stale_host_topic(parsed.host, topic)
            return []
        if parsed.kind == "service_status":
            return self.on_service_status(topic, payload, retain)
        if parsed.kind == "plan_request" and not leading:
            return []  # the leader answers
        host, kind, size = parsed.host, parsed.kind, len(payload)
        unknown_host = host not in self.state.host_names
        if unknown_host and kind not in ("plan", "peers"):
            if not payload:
                return []  # a deleted retained message (this service's own clearing)
            if retain:
                self._note_stale_host_topic(host, topic)
        if not unknown_host and kind not in ("plan", "peers"):
            over = self.budget.check(host, topic, size, now=now)
            if over is not None:
                return over
        if kind in ("plan", "peers"):
            rk: RetainedKind = "plan" if kind == "plan" else "peers"
            if not retain and not leading:
                retain = True  # a standby: the leader's live plans are what is on the bus
            if not retain and self.integrity.verifier is not None:
                if unknown_host:
                    return []
                refused = self.integrity.check_live(topic, payload, now)
                return (
                    [] if refused is None else self.refuse(topic, payload, rk, host, refused, now)
                )
            if not payload:
                return []  # a deleted retained plan (this service's own clearing, coming back)
            if not retain:
                # live plans are this service's own, coming back: only retained ones
                # (published before this connection) tell it anything. Not decoding them
                # halves the service's CPU per event at 256 hosts (benchmarks/ack_bench.py).
                return []
            if unknown_host:
                return self.on_stale_plan(topic, payload, host, rk)
            opened = self.integrity.open_retained(payload)
            if isinstance(opened, Refused):
                return self.refuse(topic, payload, rk, host, opened, now)
            payload = opened
        elif unknown_host and kind != "status":
            # nothing to plan for a host the fabric does not list; its retained copy goes
            return [ClearStalePlans()] if retain and self.settled else []
        try:
            obj = decode(
                DECODERS[kind],
                payload,
                topic=topic,
                expect_host=host,
                max_bytes=self.settings.bus.max_message_bytes,
            )
        except BadMessage as exc:
            return self.drop(topic, size, exc.reason, exc.detail)
        if unknown_host:
            assert isinstance(obj, HostStatus)
            return self._on_stranger(obj)
        return self._on_decoded(obj, parsed.hca, parsed.port, topic, now)

    def _on_stranger(self, obj: HostStatus) -> list[Effect]:
        """A status of a host the fabric does not list: retained messages of hosts that left
        stay on the broker, so only an agent that says it is online now is worth a warning
        (and an ``unknown_host`` in the audit)."""
        out: list[Effect] = []
        if obj.online:
            out += self._warn_once(
                "host_not_in_fabric",
                obj.host,
                host=obj.host,
                fabric=self.fabric.name,
                hint="agent host name missing from the fabric file: no plans",
            )
            self.strangers.add(obj.host)
        else:
            self.strangers.discard(obj.host)
        return [*out, KickAudit()]

    def _on_decoded(
        self, obj: BaseModel, hca: str | None, port: int | None, topic: str, now: float
    ) -> list[Effect]:
        if isinstance(obj, HostInventory):
            return self.on_inventory(obj)
        if isinstance(obj, PortState):
            return self.on_port_state(obj, hca, port, topic, now)
        if isinstance(obj, PortEvent):
            return self.journal.on_event(obj)
        if isinstance(obj, ProbeReport):
            return self.probes.on_report(obj, now)
        if isinstance(obj, HostStatus):
            return self.on_host_status(obj, now)
        if isinstance(obj, Ack):
            return self.on_ack(obj, now)
        if isinstance(obj, PlanRequest):
            return self.on_plan_request(obj, topic, now)
        if isinstance(obj, Plan):
            self.state.on_retained_plan(obj)
        elif isinstance(obj, PeerRoutes):
            self.state.on_retained_peers(obj)
        if self.state.dirty and self.settled:  # it came after the first solve
            return self.changed(now, urgent=False)
        return []

    def on_port_state(
        self, obj: PortState, hca: str | None, port: int | None, topic: str, now: float
    ) -> list[Effect]:
        """A port state of a fabric host (its topic's ``hca`` and ``port``)."""
        if hca != obj.hca or port != obj.port:
            self.dropped["wrong_port"] += 1
            return [Log("warning", "message_dropped", {"topic": topic, "reason": "wrong_port"})]
        out: list[Effect] = []
        usability_changed = self.state.on_port_state(obj)
        key, shown = (obj.host, obj.hca, obj.port), _shown(obj)
        # only a state the fabric state kept (not a late older one, not an unknown port)
        if self.state.ports.get((obj.host, obj.key)) is obj and self._shown.get(key) != shown:
            self._shown[key] = shown
            out.append(Emit("port", obj.model_dump(mode="json")))
        if usability_changed:
            fields = {
                "host": obj.host,
                "port": obj.key,
                "rail": obj.rail,
                "status": obj.status.value,
                "reason": obj.reason,
            }
            out.append(Log("info", "port_usability_changed", fields))
            out += self.changed(now, urgent=obj.status != PortStatus.UP)
        return out

    def on_host_status(self, obj: HostStatus, now: float) -> list[Effect]:
        """A fabric host's agent went online or offline (its last will)."""
        was_away = obj.host in self.state.away
        was_failing = obj.host in self.state.state_write_failing
        had = self.state.device_problems.get(obj.host)
        if not obj.online:
            self.online_since.pop(obj.host, None)
            self.convergence.forget(obj.host)
        elif obj.host not in self.online_since:
            self.online_since[obj.host] = now
        self.state.on_host_status(obj, now=now)
        fields = {"host": obj.host, "online": obj.online, "reason": obj.reason}
        out: list[Effect] = [
            Emit("host", obj.model_dump(mode="json")),
            KickAudit(),
            Log("info", "host_status", fields),
        ]
        out += self.posture.on_status(obj)
        if obj.host in self.state.state_write_failing and not was_failing:
            out.append(
                Log(
                    "warning",
                    "host_state_write_failing",
                    {
                        "host": obj.host,
                        "hint": "its agent cannot write its state_dir (full or failing disk): "
                        "it routes from memory, but a restart would start from old files",
                    },
                )
            )
        problems = self.state.device_problems.get(obj.host)
        if problems and problems != had:
            hint = "see docs/operations.md, Device naming and link kinds"
            fields = {"host": obj.host, "problems": problems, "hint": hint}
            out.append(Log("warning", "host_device_problems", fields))
        if was_away and obj.host not in self.state.away:
            out.append(Log("info", "route_around_ended", {"host": obj.host, "online": obj.online}))
            out += self.changed(now, urgent=False)
        out.append(KickRouteAround())
        return out

    def on_ack(self, ack: Ack, now: float) -> list[Effect]:
        """An agent's ack: kept, emitted, counted against the hosts the last publish waits
        for (the last one logs ``plans_acked``: epoch, hosts, ms from the publish)."""
        self.state.on_ack(ack)
        self.convergence.on_ack(ack)
        out: list[Effect] = [Emit("ack", ack.model_dump(mode="json"))]
        out += self.schedule.on_applied(ack, now)
        # one line per host and event would be thousands a minute at fleet scale: the applied
        # ones are debug, ``plans_acked`` says when all hosts are through
        fields = {
            "host": ack.host,
            "epoch": ack.epoch,
            "result": ack.result.value,
            "fast_path": ack.fast_path,
            "apply_ms": ack.apply_ms,
            "error": ack.error,
        }
        out.append(Log("debug" if ack.result == AckResult.APPLIED else "warning", "ack", fields))
        return out

    def on_inventory(self, inv: HostInventory) -> list[Effect]:
        """Warn when what an agent has differs from what the fabric says it has (the fleet
        audit's comparison, :func:`~linkguard.topology.audit.inventory_problems`)."""
        self.inventories[inv.host] = inv
        problems = inventory_problems(self.fabric.host(inv.host), inv)
        out: list[Effect] = [KickAudit()]
        if problems:
            out += self._warn_once(
                "inventory_mismatch", inv.host, *problems, host=inv.host, problems=problems
            )
        return out

    def on_service_status(self, topic: str, payload: bytes, retain: bool) -> list[Effect]:
        """An announcement on ``service/status``: another instance on this broker is a
        duplicate (:func:`~linkguard.presence.judge`): the later one stops."""
        try:
            seen = decode(ServiceStatus, payload, topic=topic)
        except BadMessage as exc:
            self.dropped[exc.reason] += 1
            return [Log("warning", "message_dropped", {"topic": topic, "reason": exc.reason})]
        if self.elected:
            # the lease decides who steers: a standby and its leader both run on this broker
            # (only the leader announces itself), so another service's announcement is no
            # duplicate
            return []
        verdict = judge(self.me, seen, retained=retain)
        if verdict == Verdict.YIELD:
            self.duplicate = seen
            fields = {
                "other_instance": seen.instance,
                "action": "stopping: the other service started first",
            }
            return [Log("error", "duplicate_service", fields), StopDuplicate()]
        if verdict == Verdict.IGNORE:
            return []
        out: list[Effect] = []
        if verdict == Verdict.HOLD:
            fields = {
                "other_instance": seen.instance,
                "action": "keeping: started first; the other must stop",
            }
            out.append(Log("error", "duplicate_service", fields))
        return [*out, AnnounceOnline()]

    def on_retained_health(self, payload: bytes, retain: bool) -> None:
        """A ``service/health`` document retained before this connection (a previous
        instance's): keep the faults it had accepted. Live documents (this instance's own)
        and unreadable ones are ignored, and so is ``faults: null``."""
        if not retain:
            return
        with contextlib.suppress(ValueError, RecursionError):  # ValidationError included
            doc = json.loads(payload)
            faults = doc.get("faults") if isinstance(doc, dict) else None
            if faults is not None:
                self.inherited_faults = FabricFaults.model_validate(faults)

    # -- the retained-message integrity rules ------------------------------------------

    def refuse(
        self,
        topic: str,
        payload: bytes,
        kind: RetainedKind,
        host: str,
        refused: Refused,
        now: float,
    ) -> list[Effect]:
        """Drop a plan or peer routes message not taken (``message_dropped``, counted by its
        typed reason) and, when ``refused.reissue``, put this service's own back: at most once
        per :data:`~linkguard.topology.integrity.REISSUE_INTERVAL_S` per topic."""
        out = self.drop(topic, len(payload), refused.reason, refused.detail)
        if refused.reissue:
            own_topic = topics.plan(host) if kind == "plan" else topics.peer_routes(host)
            at = self.integrity.foreign(own_topic, now)
            if at is not None:
                out.append(Reissue(kind, host, own_topic, at))
        return out

    def reissue_due(self, kind: RetainedKind, host: str, now: float) -> list[Effect]:
        """A :class:`Reissue` came due at ``now``: this service's own ``kind`` message of
        ``host`` again, retained, in place of a foreign one. Without one: a plan is published
        by the first solve (every host's plan it has not seen on the bus); peer routes are
        deleted. Nothing while another service runs (never fight it over the topic). The
        wiring calls :meth:`Integrity.reissue_done` once it is published."""
        topic = topics.plan(host) if kind == "plan" else topics.peer_routes(host)
        self.integrity.reissue_due(topic, now)
        if self.duplicate is not None:
            return []
        own = (self.state.published if kind == "plan" else self.state.peers).get(host)
        if own is not None:
            action = "re-published this service's own"
        elif kind == "peers":
            action = "deleted"
        else:
            action = "the first solve publishes this service's own"
        fields = {
            "topic": topic,
            "epoch": own.epoch if own is not None else None,
            "action": action,
        }
        out: list[Effect] = [Log("warning", "foreign_retained_replaced", fields)]
        if own is not None:
            out.append(PublishPlans(((topic, own),), why="reissue"))
        elif kind == "peers":
            out.append(ClearRetained((topic,)))
        return out

    def sent(self, payloads: Iterable[tuple[str, bytes]], now: float) -> None:
        """What the wiring published on plan and peer routes topics at ``now`` (as sent:
        signed), to recognise it when it comes back, and to time the acks they are owed."""
        payloads = list(payloads)
        self.integrity.note_sent(payloads, now)
        self.convergence.sent((topic for topic, _ in payloads), now)

    def converge(self, now: float) -> tuple[list[Effect], float | None]:
        """The convergence tick at ``now`` (:meth:`Convergence.tick`): re-sends to online
        hosts past their ack deadline, and when the next is due. Nothing before the startup
        settle is over (the first solve has not published yet)."""
        if not self.settled:
            return [], None
        return self.convergence.tick(now)

    def on_plan_request(self, req: PlanRequest, topic: str, now: float) -> list[Effect]:
        """An agent asks for its plan (:meth:`Convergence.on_request`); one over the rate
        limit is dropped and counted (``plan_request_limited``)."""
        if not self.settled:
            return []  # the first solve publishes every plan
        out, refused = self.convergence.on_request(req, now)
        if refused is not None:
            self.dropped[refused] += 1
            return [Log("debug", "message_dropped", {"topic": topic, "reason": refused})]
        return out

    # -- solves --------------------------------------------------------------------------

    def settle(self) -> list[Effect]:
        """The startup settle is over and this service leads: from now on a retained plan or
        stale plan that arrives is acted on at once. Warns about agents online whose port
        states did not arrive."""
        self.settled = True
        return self.warn_unknown_ports()

    def warn_unknown_ports(self) -> list[Effect]:
        """After the startup settle: agents online whose port states did not arrive (a broker
        that dropped retained messages to this new subscriber: ``max_queued_messages``) are
        planned as if those ports were up until the agents' next refresh. Say so."""
        have = {host for host, _ in self.state.ports}
        missing = sorted(h for h, up in self.state.online.items() if up and h not in have)
        if not missing:
            return []
        fields: dict[str, Any] = {
            "hosts": len(missing),
            "first": missing[:10],
            "hint": "agents just started, or a broker that dropped retained messages to this "
            "subscriber (Mosquitto: raise max_queued_messages); these hosts count as whole "
            "until their agents publish",
        }
        return [Log("warning", "port_states_missing", fields)]


def _shown(st: PortState) -> tuple[object, ...]:
    """What the dashboard shows of a port: a ``port`` change is emitted when this changes."""
    d = st.damping
    return (st.status, st.usable, st.reason, st.rate_gbps, d.suppressed, d.flaps, d.hold_down_s)
